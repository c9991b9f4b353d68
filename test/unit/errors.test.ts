/**
 * The error layer (src/common/errors.ts): an AppError is recognised whichever copy of the module
 * made it (the plugin's hot and cold bundles each carry one), and the CNI edge keeps its code.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { AppError, ClosedError, isAppError, UsageError } from '../../src/common/errors.ts';
import { RangeExhaustedError } from '../../src/ipam/allocator.ts';
import { toCniError } from '../../src/cni/skel.ts';

/** A second instance of the module, as the separately bundled cold part has (issue 8.5). */
async function otherCopy(): Promise<typeof import('../../src/common/errors.ts')> {
  // A query string makes the loader evaluate the file again, as a separate module.
  const url = new URL('../../src/common/errors.ts?i8-other-bundle', import.meta.url).href;
  return (await import(url)) as typeof import('../../src/common/errors.ts');
}

describe('AppError identity across bundles', () => {
  it('an AppError of another copy of the module is an AppError, and the CNI edge keeps its code', async () => {
    const other = await otherCopy();
    assert.notEqual(other.AppError, AppError, 'really a second class');
    const lock = new other.AppError('STORE_LOCK_TIMEOUT', 'timed out after 1s waiting for the lock on /x/lock');
    const io = new other.AppError('STORE_IO', 'cannot open the audit log /x/ipwarden-audit.log: EISDIR', { details: 'd' });
    assert.equal(lock instanceof AppError, true);
    assert.equal(isAppError(io, 'STORE_IO'), true);
    assert.deepEqual(toCniError(lock, '1.1.0'), { cniVersion: '1.1.0', code: 11, msg: 'timed out after 1s waiting for the lock on /x/lock' });
    assert.deepEqual(toCniError(io, '1.0.0'), { cniVersion: '1.0.0', code: 5, msg: 'cannot open the audit log /x/ipwarden-audit.log: EISDIR', details: 'd' });
  });

  const cases: Array<{ name: string; value: unknown; appError: boolean; usage: boolean }> = [
    { name: 'an AppError', value: new AppError('INTERNAL', 'x'), appError: true, usage: false },
    { name: 'a UsageError', value: new UsageError('x'), appError: true, usage: true },
    { name: 'a ClosedError', value: new ClosedError('x'), appError: true, usage: false },
    { name: 'a plain Error', value: new Error('x'), appError: false, usage: false },
    { name: 'an object with a code', value: { code: 'STORE_IO', message: 'x' }, appError: false, usage: false },
    { name: 'null', value: null, appError: false, usage: false },
  ];
  for (const c of cases) {
    it(`${c.name}: instanceof AppError ${c.appError}, instanceof UsageError ${c.usage}`, () => {
      assert.equal(c.value instanceof AppError, c.appError);
      assert.equal(isAppError(c.value), c.appError);
      assert.equal(c.value instanceof UsageError, c.usage);
    });
  }

  it('subclasses keep their ordinary instanceof', () => {
    const e = new RangeExhaustedError({ rangeSetIndex: 0, rangeSet: '10.0.0.1-10.0.0.2', size: 2n, reserved: 2 });
    assert.equal(e instanceof RangeExhaustedError, true);
    assert.equal(e instanceof AppError, true);
    assert.equal(new AppError('IPAM_RANGE_EXHAUSTED', 'x') instanceof RangeExhaustedError, false);
  });
});
