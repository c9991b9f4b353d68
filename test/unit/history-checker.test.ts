// The history checker (test/helpers/history.ts) on crafted histories: a clean concurrent history
// with unknown outcomes, repeats and address reuse passes; each violation kind is found in a
// history built to have exactly it, and the conservative edges go the safe way.
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { checkHistory, HistoryRecorder, holdsOf, resultIps, storeHoldsOf, type Checkpoint, type History, type Op, type ViolationKind } from '../helpers/history.ts';

let nextId = 0;
function op(kind: 'ADD' | 'DEL', cid: string, start: number, end: number, outcome: Op['outcome'] = 'ok', ips?: string[], node = 'n1', ifname = 'eth0'): Op {
  return { id: nextId++, kind, node, containerId: cid, ifname, start, end, outcome, ...(ips ? { ips } : {}) };
}
function cp(start: number, end: number, allocations: [string, string][], blocks: [string, string][] = [['10.81.0.0/26', 'n1']], final = false): Checkpoint {
  return { start, end, allocations: allocations.map(([ip, cid]) => ({ ip, containerId: cid, ifname: 'eth0' })), blocks: blocks.map(([cidr, owner]) => ({ cidr, owner })), ...(final ? { final } : {}) };
}
function kinds(h: History): ViolationKind[] {
  return checkHistory(h).map((v) => v.kind);
}

describe('history checker', () => {
  it('passes a clean history: concurrency, reuse after release, a repeated ADD, unknown outcomes, an empty final state', () => {
    const h: History = {
      ops: [
        op('ADD', 'a', 0, 10, 'ok', ['10.81.0.1']),
        op('ADD', 'b', 1, 12, 'ok', ['10.81.0.2']),
        op('ADD', 'a', 20, 25, 'ok', ['10.81.0.1']), // repeated ADD: same address
        op('DEL', 'a', 30, 40, 'unknown'), // may not have released: a keeps holding
        op('DEL', 'a', 41, 45),
        op('ADD', 'c', 46, 50, 'ok', ['10.81.0.1']), // reuse after a's DEL ended
        op('ADD', 'd', 51, 60, 'unknown'), // timed out: holds something we never learn
        op('ADD', 'e', 52, 53, 'error'),
        op('DEL', 'b', 61, 62),
        op('DEL', 'c', 63, 64),
        op('DEL', 'd', 65, 66),
        op('DEL', 'e', 67, 68),
      ],
      checkpoints: [
        cp(13, 14, [['10.81.0.1', 'a'], ['10.81.0.2', 'b']]),
        cp(55, 56, [['10.81.0.1', 'c'], ['10.81.0.2', 'b'], ['10.81.0.3', 'd']]),
        cp(70, 71, [], [['10.81.0.0/26', 'n1'], ['10.81.0.64/26', 'n2']], true),
      ],
    };
    assert.deepEqual(checkHistory(h), []);
  });

  it('duplicate: a second holder while the first has not been released', () => {
    const h: History = { ops: [op('ADD', 'a', 0, 10, 'ok', ['10.81.0.1']), op('ADD', 'b', 20, 30, 'ok', ['10.81.0.1'], 'n2')], checkpoints: [] };
    const v = checkHistory(h);
    assert.deepEqual(v.map((x) => x.kind), ['duplicate']);
    assert.match(v[0]?.message ?? '', /^\(certain[^)]*\) 10\.81\.0\.1 held by a\/eth0.*b\/eth0/);
    assert.equal(v[0]?.ops.length, 2);
  });

  it('duplicate: an ADD that starts before the other holder\'s DEL has ended (the hold lasts to the DEL\'s end)', () => {
    const h: History = { ops: [op('ADD', 'a', 0, 10, 'ok', ['10.81.0.1']), op('DEL', 'a', 20, 30), op('ADD', 'b', 29, 35, 'ok', ['10.81.0.1'])], checkpoints: [] };
    assert.deepEqual(kinds(h), ['duplicate']);
    assert.doesNotMatch(checkHistory(h)[0]?.message ?? '', /certain/); // a linearizable order exists; flagged all the same
    // …and not when it starts at the DEL's end.
    const ok: History = { ops: [op('ADD', 'a', 0, 10, 'ok', ['10.81.0.1']), op('DEL', 'a', 20, 30), op('ADD', 'b', 30, 35, 'ok', ['10.81.0.1'])], checkpoints: [] };
    assert.deepEqual(kinds(ok), []);
  });

  it('duplicate: a failed or unknown DEL releases nothing', () => {
    for (const outcome of ['error', 'unknown'] as const) {
      const h: History = { ops: [op('ADD', 'a', 0, 10, 'ok', ['10.81.0.1']), op('DEL', 'a', 20, 30, outcome), op('ADD', 'b', 40, 45, 'ok', ['10.81.0.1'])], checkpoints: [] };
      assert.deepEqual(kinds(h), ['duplicate'], outcome);
    }
  });

  it('duplicate: the hold starts at the ADD\'s start, and dual-stack IPs are checked one by one, in canonical form', () => {
    const h: History = {
      ops: [op('ADD', 'a', 0, 100, 'ok', ['10.81.0.1', 'fd81::0001']), op('ADD', 'b', 5, 50, 'ok', ['10.81.0.2']), op('DEL', 'b', 51, 60), op('ADD', 'c', 61, 70, 'ok', ['10.81.0.9', 'fd81::1'])],
      checkpoints: [],
    };
    const v = checkHistory(h);
    assert.deepEqual(v.map((x) => x.kind), ['duplicate']);
    assert.match(v[0]?.message ?? '', /^\(certain[^)]*\) fd81::1 held by a\/eth0/);
  });

  it('the same container on two ifnames is two holders', () => {
    const h: History = { ops: [op('ADD', 'a', 0, 10, 'ok', ['10.81.0.1'], 'n1', 'eth0'), op('ADD', 'a', 11, 20, 'ok', ['10.81.0.1'], 'n1', 'net1')], checkpoints: [] };
    assert.deepEqual(kinds(h), ['duplicate']);
  });

  it('lost: a successful allocation missing from, or owned by another in, a checkpoint inside its hold', () => {
    const ops = [op('ADD', 'a', 0, 10, 'ok', ['10.81.0.1'])];
    assert.deepEqual(kinds({ ops, checkpoints: [cp(20, 21, [])] }), ['lost']);
    assert.deepEqual(kinds({ ops: [...ops, op('ADD', 'x', 11, 12, 'unknown')], checkpoints: [cp(20, 21, [['10.81.0.1', 'x']])] }), ['lost']);
  });

  it('lost is not claimed while the ADD may still be running or once a DEL of any outcome has started', () => {
    const base = [op('ADD', 'a', 0, 10, 'ok', ['10.81.0.1'])];
    assert.deepEqual(kinds({ ops: base, checkpoints: [cp(5, 6, [])] }), []); // read during the ADD
    assert.deepEqual(kinds({ ops: [...base, op('DEL', 'a', 15, 30, 'error')], checkpoints: [cp(20, 21, [])] }), []);
    assert.deepEqual(kinds({ ops: [...base, op('DEL', 'a', 20.5, 30, 'unknown')], checkpoints: [cp(20, 21, [])] }), []); // DEL began during the read
  });

  it('state-duplicate: one IP listed twice in a state', () => {
    const ops = [op('ADD', 'a', 0, 1, 'unknown'), op('ADD', 'b', 0, 1, 'unknown')];
    assert.deepEqual(kinds({ ops, checkpoints: [cp(5, 6, [['10.81.0.1', 'a'], ['10.81.0.001', 'b']])] }), ['bad-state']); // 10.81.0.001 is not an address
    assert.deepEqual(kinds({ ops, checkpoints: [cp(5, 6, [['10.81.0.1', 'a'], ['10.81.0.1', 'b']])] }), ['state-duplicate']);
  });

  it('block-owners: the same block or overlapping blocks with two owners; a bad CIDR', () => {
    const c = (blocks: [string, string][]) => kinds({ ops: [], checkpoints: [cp(0, 1, [], blocks)] });
    assert.deepEqual(c([['10.81.0.0/26', 'n1'], ['10.81.0.64/26', 'n2']]), []);
    assert.deepEqual(c([['10.81.0.0/26', 'n1'], ['10.81.0.0/26', 'n2']]), ['block-owners']);
    assert.deepEqual(c([['10.81.0.0/25', 'n1'], ['10.81.0.64/26', 'n2']]), ['block-owners']);
    assert.deepEqual(c([['10.81.0.0/26', 'n1'], ['10.81.0.0/26', 'n1']]), ['block-owners']);
    assert.deepEqual(c([['10.81.0.0', 'n1']]), ['bad-state']);
    assert.deepEqual(c([['fd81::/122', 'n1'], ['fd81::40/122', 'n2'], ['fd81::/120', 'n3']]), ['block-owners', 'block-owners']);
  });

  it('not-empty: the final state still lists an allocation', () => {
    const h: History = { ops: [op('ADD', 'a', 0, 10, 'ok', ['10.81.0.1']), op('DEL', 'a', 20, 30)], checkpoints: [cp(40, 41, [['10.81.0.1', 'a']], undefined, true)] };
    // a's DEL succeeded before the read: the entry is also a zombie.
    assert.deepEqual(kinds(h), ['zombie', 'not-empty']);
    const leak: History = { ops: [op('ADD', 'a', 0, 10, 'error'), op('DEL', 'a', 20, 30, 'error')], checkpoints: [cp(40, 41, [['10.81.0.1', 'a']], undefined, true)] };
    assert.deepEqual(kinds(leak), ['not-empty']);
  });

  it('readd-changed: a repeated ADD of a holder that still holds returns another address', () => {
    const h: History = { ops: [op('ADD', 'a', 0, 10, 'ok', ['10.81.0.1']), op('ADD', 'a', 20, 30, 'ok', ['10.81.0.2'])], checkpoints: [] };
    assert.deepEqual(kinds(h), ['readd-changed']);
    const afterDel: History = { ops: [op('ADD', 'a', 0, 10, 'ok', ['10.81.0.1']), op('DEL', 'a', 12, 14), op('ADD', 'a', 20, 30, 'ok', ['10.81.0.2'])], checkpoints: [] };
    assert.deepEqual(kinds(afterDel), []);
  });

  it('zombie: an allocation of a holder that was released, or has not started an ADD yet', () => {
    const released: History = { ops: [op('ADD', 'a', 0, 10, 'ok', ['10.81.0.1']), op('DEL', 'a', 20, 30)], checkpoints: [cp(40, 41, [['10.81.0.1', 'a']])] };
    assert.deepEqual(kinds(released), ['zombie']);
    const early: History = { ops: [op('ADD', 'a', 50, 60, 'ok', ['10.81.0.1'])], checkpoints: [cp(40, 41, [['10.81.0.1', 'a']])] };
    assert.deepEqual(kinds(early), ['zombie']);
    const stranger: History = { ops: [], checkpoints: [cp(40, 41, [['10.81.0.1', 'nobody']])] };
    assert.deepEqual(kinds(stranger), ['zombie']);
    const readdAfterDel: History = { ops: [op('ADD', 'a', 0, 10, 'ok', ['10.81.0.1']), op('DEL', 'a', 20, 30), op('ADD', 'a', 35, 45, 'unknown')], checkpoints: [cp(40, 41, [['10.81.0.1', 'a']])] };
    assert.deepEqual(kinds(readdAfterDel), []);
  });

  it('bad-op: a malformed record is a violation, not a silent pass', () => {
    assert.deepEqual(kinds({ ops: [op('ADD', 'a', 10, 5, 'ok', ['10.81.0.1'])], checkpoints: [] }), ['bad-op']);
    assert.deepEqual(kinds({ ops: [op('ADD', 'a', 0, 5, 'ok', [])], checkpoints: [] }), ['bad-op']);
    assert.deepEqual(kinds({ ops: [op('ADD', 'a', 0, 5, 'ok', ['10.81.0.256'])], checkpoints: [] }), ['bad-op']);
    assert.deepEqual(kinds({ ops: [op('ADD', '', 0, 5, 'error')], checkpoints: [] }), ['bad-op']);
    assert.deepEqual(kinds({ ops: [op('ADD', 'a', 0, Number.NaN, 'ok', ['10.81.0.1'])], checkpoints: [] }), ['bad-op']);
  });

  it('holdsOf: from the ADD start to the end of the first successful DEL after it', () => {
    const ops = [op('ADD', 'a', 0, 10, 'ok', ['10.81.0.1']), op('DEL', 'a', 20, 30, 'error'), op('DEL', 'a', 31, 40), op('ADD', 'a', 50, 55, 'ok', ['10.81.0.5'])];
    const hs = holdsOf(ops).map((x) => [x.ip, x.from, x.to, x.firstDelStart]);
    assert.deepEqual(hs, [
      ['10.81.0.1', 0, 40, 20],
      ['10.81.0.5', 50, Infinity, Infinity],
    ]);
  });

  it('resultIps reads a CNI result; the recorder times ops on its clock and marks unfinished ops unknown', async () => {
    assert.deepEqual(resultIps({ cniVersion: '1.0.0', ips: [{ address: '10.81.0.7/26' }, { address: 'fd81::0007/122' }] }), ['10.81.0.7', 'fd81::7']);
    assert.deepEqual(resultIps({ code: 11 }), []);
    assert.deepEqual(resultIps(null), []);
    let t = 0;
    const r = new HistoryRecorder(() => t++);
    const done = r.begin('ADD', 'n1', 'a', 'eth0');
    r.begin('ADD', 'n1', 'b', 'eth0'); // never finished
    done('ok', { ips: ['10.81.0.1'] });
    await r.checkpoint(async () => ({ blocks: [], allocations: [{ ip: '10.81.0.1', containerId: 'a', ifname: 'eth0' }] }));
    const h = r.history();
    assert.deepEqual(
      h.ops.map((o) => [o.id, o.containerId, o.start, o.end, o.outcome]),
      [
        [0, 'a', 0, 2, 'ok'],
        [1, 'b', 1, Infinity, 'unknown'],
      ],
    );
    assert.deepEqual([h.checkpoints[0]?.start, h.checkpoints[0]?.end], [3, 4]);
    assert.deepEqual(checkHistory(h), []);
  });
});

describe('history checker with the store\'s own history', () => {
  const ev = (rev: number, ip: string, cid: string | null) => ({ rev, ip, holder: cid === null ? null : { containerId: cid, ifname: 'eth0' } });

  it('an ambiguous duplicate (ADD overlapping the other\'s DEL) is dropped when the commits order the holds', () => {
    const ops = [op('ADD', 'a', 0, 10, 'ok', ['10.81.0.1']), op('DEL', 'a', 20, 30), op('ADD', 'b', 25, 35, 'ok', ['10.81.0.1'])];
    assert.deepEqual(kinds({ ops, checkpoints: [] }), ['duplicate']);
    assert.deepEqual(kinds({ ops, checkpoints: [], storeEvents: [ev(5, '10.81.0.1', 'a'), ev(12, '10.81.0.1', null), ev(13, '10.81.0.1', 'b')] }), []);
  });

  it('…but stands when the commits overlap, when a hold has no store event, and always when it is certain', () => {
    const ops = [op('ADD', 'a', 0, 10, 'ok', ['10.81.0.1']), op('DEL', 'a', 20, 30), op('ADD', 'b', 25, 35, 'ok', ['10.81.0.1'])];
    // b committed before a's release: the store had two holders.
    assert.deepEqual(kinds({ ops, checkpoints: [], storeEvents: [ev(5, '10.81.0.1', 'a'), ev(12, '10.81.0.1', 'b'), ev(13, '10.81.0.1', null)] }), ['duplicate', 'store-duplicate']);
    // no event for b: its success is also unconfirmed.
    assert.deepEqual(kinds({ ops, checkpoints: [], storeEvents: [ev(5, '10.81.0.1', 'a'), ev(12, '10.81.0.1', null)] }), ['duplicate', 'unconfirmed']);
    const certain = [op('ADD', 'a', 0, 10, 'ok', ['10.81.0.1']), op('ADD', 'b', 11, 12, 'ok', ['10.81.0.1']), op('DEL', 'a', 20, 30)];
    assert.deepEqual(kinds({ ops: certain, checkpoints: [], storeEvents: [ev(5, '10.81.0.1', 'a'), ev(12, '10.81.0.1', null), ev(13, '10.81.0.1', 'b')] }), ['duplicate']);
  });

  it('store-duplicate: two holders without a release, across blocks; same-holder rewrites are not one', () => {
    const events = [ev(1, '10.81.0.1', 'a'), ev(2, '10.81.0.1', 'a'), ev(3, '10.81.0.1', 'b'), ev(4, '10.81.0.001', 'c')];
    const v = checkHistory({ ops: [], checkpoints: [], storeEvents: events });
    assert.deepEqual(v.map((x) => x.kind), ['store-duplicate']);
    assert.match(v[0]?.message ?? '', /10\.81\.0\.1 held in the store by a\/eth0 from revision 1 and by b\/eth0 from revision 3/);
  });

  it('unconfirmed: a successful ADD the store never committed for its holder', () => {
    const ops = [op('ADD', 'a', 0, 10, 'ok', ['10.81.0.1'])];
    assert.deepEqual(kinds({ ops, checkpoints: [], storeEvents: [ev(5, '10.81.0.1', 'x')] }), ['unconfirmed']);
    assert.deepEqual(kinds({ ops, checkpoints: [], storeEvents: [ev(5, '10.81.0.1', 'a')] }), []);
    assert.deepEqual(kinds({ ops, checkpoints: [] }), [], 'without store events, nothing to confirm against');
  });

  it('storeHoldsOf: release before allocation within one revision; sorted by revision', () => {
    const { holds, overlaps } = storeHoldsOf([ev(7, '10.81.0.1', 'b'), ev(7, '10.81.0.1', null), ev(3, '10.81.0.1', 'a')]);
    assert.deepEqual(holds.map((x) => [x.holder, x.from, x.to]), [
      ['a/eth0', 3, 7],
      ['b/eth0', 7, Infinity],
    ]);
    assert.deepEqual(overlaps, []);
  });
});
