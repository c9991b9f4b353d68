/**
 * The error layer (src/common/errors.ts): an AppError is recognised whichever copy of the module
 * made it (the plugin's hot and cold bundles each carry one), and the CNI edge keeps its code.
 */
import assert from 'node:assert/strict';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { AppError, ClosedError, CNI_CODE, isAppError, UsageError, type ErrorCode } from '../../src/common/errors.ts';
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

describe('docs/errors.md documents every error code (issue 8.9)', () => {
  const root = join(import.meta.dirname, '../..');
  const doc = readFileSync(join(root, 'docs/errors.md'), 'utf8');
  /** The code table's rows: internal code → the CNI code column as written. */
  const rows = new Map<string, string>();
  for (const m of doc.matchAll(/^\| `([A-Z_]+)` \| ([^|]+) \|/gm)) rows.set(m[1] as string, (m[2] as string).trim());

  const walk = (dir: string): string[] =>
    readdirSync(dir).flatMap((n) => {
      const p = join(dir, n);
      return statSync(p).isDirectory() ? walk(p) : p.endsWith('.ts') ? [p] : [];
    });
  /** Codes named where errors are made or checked: `new AppError('X'`, `isAppError(e, 'X')`. */
  const used = new Set<string>();
  for (const f of walk(join(root, 'src'))) {
    for (const m of readFileSync(f, 'utf8').matchAll(/(?:AppError\(\s*|isAppError\([^,()]+,\s*)'([A-Z][A-Z_]+)'/g)) used.add(m[1] as string);
  }

  it('the source names only declared codes, and the declaration is non-trivial', () => {
    assert.ok(used.size >= 15, `${used.size} codes found in src/`);
    assert.deepEqual([...used].filter((c) => !(c in CNI_CODE)), []);
  });

  for (const code of Object.keys(CNI_CODE) as ErrorCode[]) {
    it(`${code} has a row with CNI code ${code === 'USAGE' ? '— (CLI only)' : CNI_CODE[code]}`, () => {
      assert.equal(rows.get(code), code === 'USAGE' ? '—' : String(CNI_CODE[code]), `docs/errors.md row for ${code}`);
    });
  }

  it('documents no code that does not exist', () => {
    assert.deepEqual([...rows.keys()].filter((c) => !(c in CNI_CODE)), []);
  });
});
