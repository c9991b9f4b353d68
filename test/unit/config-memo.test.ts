/**
 * The daemon's memoised config decoders (src/daemon/config-memo.ts): the same value as the direct
 * decoders for the same bytes, one decode per distinct input, frozen values, errors never memoised,
 * distinct bytes (also bytes that decode to the same UTF-8 text) and distinct CNI_ARGS kept apart,
 * and the entry bound.
 */
import { strict as assert } from 'node:assert';
import { describe, it } from 'node:test';
import { DIRECT_DECODERS, type ConfigDecoders } from '../../src/cni/commands.ts';
import { MEMO_MAX_ENTRIES, MEMO_MAX_INPUT_BYTES, memoConfigDecoders } from '../../src/daemon/config-memo.ts';
import { AppError } from '../../src/common/errors.ts';

const conf = (name: string, extra: Record<string, unknown> = {}): Buffer =>
  Buffer.from(JSON.stringify({ cniVersion: '1.0.0', name, ipam: { type: 'ipwarden', dataDir: '/tmp/ipw-memo-test', ranges: [[{ subnet: '10.87.203.0/24' }]], ...extra } }));

/** Direct decoders that count their calls. */
function counting(): ConfigDecoders & { calls: { ipam: number; identity: number } } {
  const calls = { ipam: 0, identity: 0 };
  return {
    calls,
    ipam: (s, a) => {
      calls.ipam++;
      return DIRECT_DECODERS.ipam(s, a);
    },
    identity: (s) => {
      calls.identity++;
      return DIRECT_DECODERS.identity(s);
    },
  };
}

describe('memoConfigDecoders', () => {
  it('gives the direct decoders\' values, decoding each distinct input once', () => {
    const inner = counting();
    const m = memoConfigDecoders(inner);
    const a = conf('net-a');
    const first = m.ipam(a, '');
    assert.deepEqual(first, DIRECT_DECODERS.ipam(a, ''));
    // A copy of the same bytes (another request) hits the memo.
    assert.equal(m.ipam(Buffer.from(a), ''), first);
    assert.equal(inner.calls.ipam, 1);
    const id = m.identity(a);
    assert.deepEqual(id, DIRECT_DECODERS.identity(a));
    assert.equal(m.identity(Buffer.from(a)), id);
    assert.equal(inner.calls.identity, 1);
  });

  it('keeps different CNI_ARGS and different bytes apart', () => {
    const inner = counting();
    const m = memoConfigDecoders(inner);
    const a = conf('net-a');
    const plain = m.ipam(a, '');
    const withIP = m.ipam(a, 'IP=10.87.203.7');
    assert.equal(plain.requestedIPs.length, 0);
    assert.equal(withIP.requestedIPs.length, 1);
    assert.equal(m.ipam(conf('net-b'), '').name, 'net-b');
    assert.equal(inner.calls.ipam, 3);
    // Two invalid bytes decode to the same U+FFFD text but are different inputs.
    const x = Buffer.concat([Buffer.from('{"cniVersion":"1.0.0","name":"n","ipam":{"type":"ipwarden","x":"'), Buffer.from([0xff]), Buffer.from('"}}')]);
    const y = Buffer.concat([Buffer.from('{"cniVersion":"1.0.0","name":"n","ipam":{"type":"ipwarden","x":"'), Buffer.from([0xfe]), Buffer.from('"}}')]);
    m.identity(x);
    m.identity(y);
    assert.equal(inner.calls.identity, 2);
  });

  it('hands out deeply frozen values', () => {
    const m = memoConfigDecoders();
    const c = m.ipam(conf('net-a', { routes: [{ dst: '0.0.0.0/0' }] }), '');
    assert.ok(Object.isFrozen(c));
    assert.ok(Object.isFrozen(c.rangeSets));
    assert.ok(Object.isFrozen(c.rangeSets[0]));
    assert.ok(Object.isFrozen(c.rangeSets[0]?.[0]?.subnet.ip));
    assert.ok(Object.isFrozen(c.routes[0]));
    assert.throws(() => {
      (c as { name: string }).name = 'other';
    }, TypeError);
  });

  it('never memoises an error: a bad config fails the same way every time', () => {
    const inner = counting();
    const m = memoConfigDecoders(inner);
    const bad = Buffer.from('{"cniVersion":"1.0.0","name":"n"}');
    for (let i = 0; i < 2; i++) {
      assert.throws(() => m.ipam(bad, ''), (e: unknown) => e instanceof AppError && /missing 'ipam' key/.test(e.message));
      assert.throws(() => m.identity(bad), (e: unknown) => e instanceof AppError && /missing 'ipam' key/.test(e.message));
    }
    assert.deepEqual(inner.calls, { ipam: 2, identity: 2 });
  });

  it('bounds the memo: at most MEMO_MAX_ENTRIES per decoder, large inputs not kept', () => {
    const inner = counting();
    const m = memoConfigDecoders(inner);
    for (let i = 0; i < MEMO_MAX_ENTRIES + 10; i++) m.ipam(conf(`net-${i}`), '');
    assert.equal(m.entries(), MEMO_MAX_ENTRIES);
    // The oldest were dropped (decoded again), the newest are still there.
    const before = inner.calls.ipam;
    m.ipam(conf(`net-${MEMO_MAX_ENTRIES + 9}`), '');
    assert.equal(inner.calls.ipam, before);
    m.ipam(conf('net-0'), '');
    assert.equal(inner.calls.ipam, before + 1);
    const big = conf('net-big', { pad: 'x'.repeat(MEMO_MAX_INPUT_BYTES) });
    m.ipam(big, '');
    m.ipam(big, '');
    assert.equal(inner.calls.ipam, before + 3);
  });
});
