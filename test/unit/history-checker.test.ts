// The history checker (test/helpers/history.ts) on crafted histories: a clean concurrent history
// with unknown outcomes, repeats and address reuse passes; each violation kind is found in a
// history built to have exactly it, and the conservative edges go the safe way.
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { checkHistory, checkHistoryDetailed, HistoryRecorder, holdsOf, resultIps, storeHoldsOf, type AdminOp, type Checkpoint, type History, type Op, type ViolationKind } from '../helpers/history.ts';

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
    // b committed before a's release: the store had two holders (and the release at 13 is b's,
    // which never ran a DEL: rule 10).
    assert.deepEqual(kinds({ ops, checkpoints: [], storeEvents: [ev(5, '10.81.0.1', 'a'), ev(12, '10.81.0.1', 'b'), ev(13, '10.81.0.1', null)] }), ['duplicate', 'store-duplicate', 'unexplained-release']);
    // no event for b: its success is also unconfirmed.
    assert.deepEqual(kinds({ ops, checkpoints: [], storeEvents: [ev(5, '10.81.0.1', 'a'), ev(12, '10.81.0.1', null)] }), ['duplicate', 'unconfirmed']);
    const certain = [op('ADD', 'a', 0, 10, 'ok', ['10.81.0.1']), op('ADD', 'b', 11, 12, 'ok', ['10.81.0.1']), op('DEL', 'a', 20, 30)];
    assert.deepEqual(kinds({ ops: certain, checkpoints: [], storeEvents: [ev(5, '10.81.0.1', 'a'), ev(12, '10.81.0.1', null), ev(13, '10.81.0.1', 'b')] }), ['duplicate']);
  });

  it('a holder\'s failed DEL before the other ADD makes the duplicate uncertain: the store\'s order (its release committed) decides', () => {
    // a's DEL failed (its answer lost after etcd applied it: the pool-jepsen reset fault), then b
    // got the address, then a's DEL was repeated and answered ok.
    const ops = [op('ADD', 'a', 0, 10, 'ok', ['10.81.0.1']), op('DEL', 'a', 11, 12, 'error'), op('ADD', 'b', 20, 21, 'ok', ['10.81.0.1']), op('DEL', 'a', 40, 41), op('DEL', 'b', 50, 51)];
    const v = checkHistory({ ops, checkpoints: [] });
    assert.deepEqual(v.map((x) => x.kind), ['duplicate']);
    assert.doesNotMatch(v[0]?.message ?? '', /certain/);
    assert.deepEqual(kinds({ ops, checkpoints: [], storeEvents: [ev(5, '10.81.0.1', 'a'), ev(8, '10.81.0.1', null), ev(9, '10.81.0.1', 'b'), ev(12, '10.81.0.1', null)] }), []);
  });

  it('store-duplicate: two holders without a release, across blocks; same-holder rewrites are not one', () => {
    const events = [ev(1, '10.81.0.1', 'a'), ev(2, '10.81.0.1', 'a'), ev(3, '10.81.0.1', 'b'), ev(4, '10.81.0.001', 'c')];
    const ops = ['a', 'b', 'c'].map((cid) => op('ADD', cid, 0, 1, 'unknown'));
    const v = checkHistory({ ops, checkpoints: [], storeEvents: events });
    assert.deepEqual(v.map((x) => x.kind), ['store-duplicate']);
    assert.match(v[0]?.message ?? '', /10\.81\.0\.1 held in the store by a\/eth0 from revision 1 and by b\/eth0 from revision 3/);
  });

  it('unconfirmed: a successful ADD the store never committed for its holder', () => {
    const ops = [op('ADD', 'a', 0, 10, 'ok', ['10.81.0.1'])];
    // (x has no operation at all: its allocation is unexplained too, rule 11)
    assert.deepEqual(kinds({ ops, checkpoints: [], storeEvents: [ev(5, '10.81.0.1', 'x')] }), ['unconfirmed', 'unexplained-allocation']);
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

describe('history checker: every store release and allocation is explained (rules 10, 11; review C1)', () => {
  const ev = (rev: number, ip: string, cid: string | null) => ({ rev, ip, holder: cid === null ? null : { containerId: cid, ifname: 'eth0' } });
  const tick = (rev: number, start: number, end = start + 0.5) => ({ rev, start, end });
  const X = '10.81.0.5';
  // The reviewer's s7: x's allocation is erased at revision 20 by someone else while x still runs
  // (its DEL starts at t=35); y then gets the address during its ADD, which overlaps x's DEL, so
  // rule 1 calls the duplicate "not certain" and the store's order (x released before y) used to
  // drop it. The revision clock shows revision 20 committed before t=23.
  const s7ops = () => [
    op('ADD', 'x', 0, 10, 'ok', [X], 'n1'),
    op('ADD', 'y', 25, 40, 'ok', [X], 'n2'),
    op('DEL', 'x', 35, 50, 'ok', undefined, 'n1'),
    op('DEL', 'y', 60, 70, 'ok', undefined, 'n2'),
  ];
  const s7events = [ev(5, X, 'x'), ev(20, X, null), ev(30, X, 'y'), ev(60, X, null)];
  const s7clock = [tick(1, 0), tick(21, 22), tick(29, 24), tick(31, 41), tick(59, 55), tick(61, 71)];

  it('FAILS the reviewer\'s s7: a release committed before the holder\'s DEL started, and the duplicate it hid stands', () => {
    const h: History = { ops: s7ops(), checkpoints: [cp(80, 81, [], [], true)], storeEvents: s7events, revisionClock: s7clock };
    const v = checkHistory(h);
    assert.deepEqual(v.map((x) => x.kind), ['duplicate', 'unexplained-release']);
    assert.match(v[1]?.message ?? '', /^10\.81\.0\.5 of x\/eth0 released in the store at revision 20 \(committed in \(0\.0, 22\.5\)\), and no DEL of x\/eth0/);
  });

  it('FAILS a lost allocation that nobody re-gets: the release is unexplained although no duplicate follows', () => {
    const ops = s7ops();
    const h: History = { ops: [ops[0] as Op, ops[2] as Op], checkpoints: [], storeEvents: [ev(5, X, 'x'), ev(20, X, null)], revisionClock: s7clock };
    assert.deepEqual(kinds(h), ['unexplained-release']);
  });

  it('FAILS a release committed after the holder\'s ok DEL had answered', () => {
    const ops = [op('ADD', 'x', 0, 10, 'ok', [X]), op('DEL', 'x', 20, 30)];
    const h: History = { ops, checkpoints: [], storeEvents: [ev(5, X, 'x'), ev(40, X, null)], revisionClock: [tick(39, 31), tick(41, 33)] };
    assert.deepEqual(kinds(h), ['unexplained-release']);
    // …and passes when the commit can lie inside the DEL.
    assert.deepEqual(kinds({ ...h, revisionClock: [tick(39, 21), tick(41, 29)] }), []);
  });

  it('FAILS a release by another holder\'s DEL, or by remove-node --finish of another node', () => {
    const ops = [op('ADD', 'x', 0, 10, 'ok', [X], 'n1'), op('DEL', 'z', 20, 30, 'ok', undefined, 'n1'), op('DEL', 'x', 50, 60, 'ok', undefined, 'n1')];
    const base: History = { ops, checkpoints: [], storeEvents: [ev(5, X, 'x'), ev(20, X, null)], revisionClock: [tick(19, 19), tick(21, 31)] };
    assert.deepEqual(kinds(base), ['unexplained-release']);
    const otherNode: AdminOp = { id: 0, kind: 'remove-node-finish', node: 'n2', start: 18, end: 32, outcome: 'ok' };
    assert.deepEqual(kinds({ ...base, admin: [otherNode] }), ['unexplained-release']);
    const reconcileOther: AdminOp = { id: 1, kind: 'reconcile-release', node: 'n1', holders: [{ containerId: 'z', ifname: 'eth0' }], start: 18, end: 32, outcome: 'ok' };
    assert.deepEqual(kinds({ ...base, admin: [reconcileOther] }), ['unexplained-release']);
    // remove-node --finish of a node that ended before the commit window
    const early: AdminOp = { id: 2, kind: 'remove-node-finish', node: 'n1', start: 1, end: 2, outcome: 'ok' };
    assert.deepEqual(kinds({ ...base, admin: [early] }), ['unexplained-release']);
    const noHolders: AdminOp = { id: 3, kind: 'reconcile-release', node: 'n1', start: 18, end: 32, outcome: 'ok' };
    assert.deepEqual(kinds({ ...base, admin: [noHolders] }), ['bad-op', 'unexplained-release']);
  });

  it('FAILS a late commit of a failed DEL or an unknown ADD after the holder\'s next ok DEL had ended (that DEL fences it); passes one inside it', () => {
    const X2 = '10.81.0.6';
    const ops = [op('ADD', 'x', 0, 10, 'ok', [X]), op('DEL', 'x', 20, 25, 'error'), op('DEL', 'x', 30, 35), op('ADD', 'y', 0, 5, 'unknown'), op('DEL', 'y', 30, 35)];
    const clock = [tick(4, 1), tick(6, 2), tick(49, 40), tick(51, 41)];
    // x's release at rev 50 (t ∈ (40, 41.5)): after x's ok DEL ended at 35 — nothing explains it
    assert.deepEqual(kinds({ ops, checkpoints: [], storeEvents: [ev(5, X, 'x'), ev(50, X, null)], revisionClock: clock }), ['unexplained-release']);
    // …at rev 60 (t ∈ (33, 34.5)): inside the ok DEL
    assert.deepEqual(kinds({ ops, checkpoints: [], storeEvents: [ev(5, X, 'x'), ev(60, X, null)], revisionClock: [tick(4, 1), tick(6, 2), tick(59, 33), tick(61, 34)] }), []);
    // y's allocation at rev 50, after y's ok DEL ended; and its release then has no DEL either
    const yOps = ops.filter((o) => o.containerId === 'y');
    assert.deepEqual(kinds({ ops: yOps, checkpoints: [], storeEvents: [ev(50, X2, 'y'), ev(52, X2, null)], revisionClock: clock }), ['unexplained-allocation', 'unexplained-release']);
    // …committed before y's DEL ended: fine
    assert.deepEqual(kinds({ ops: yOps, checkpoints: [], storeEvents: [ev(60, X2, 'y'), ev(62, X2, null)], revisionClock: [tick(59, 31), tick(61, 32), tick(63, 34)] }), []);
  });

  it('FAILS an allocation committed before its holder\'s ADD started, or by a holder without any ADD', () => {
    const ops = [op('ADD', 'x', 30, 40, 'ok', [X]), op('DEL', 'x', 50, 60)];
    const clock = [tick(4, 1), tick(6, 2), tick(9, 51)];
    assert.deepEqual(kinds({ ops, checkpoints: [], storeEvents: [ev(5, X, 'x'), ev(8, X, null)], revisionClock: clock }), ['unexplained-allocation']);
    assert.deepEqual(kinds({ ops: [], checkpoints: [], storeEvents: [ev(5, X, 'ghost')] }), ['unexplained-allocation']);
  });

  it('FAILS a revision clock that contradicts real time', () => {
    assert.deepEqual(kinds({ ops: [], checkpoints: [], storeEvents: [], revisionClock: [tick(10, 50, 51), tick(11, 1, 2)] }), ['bad-state']);
    assert.deepEqual(kinds({ ops: [], checkpoints: [], storeEvents: [], revisionClock: [tick(10, 5, 1)] }), ['bad-state']);
  });

  it('passes what may legitimately release or allocate: an ok DEL inside its span, a failed or unknown DEL or ADD committing late, remove-node --finish and a reconcile release of the holder\'s node', () => {
    const ops = [
      op('ADD', 'a', 0, 10, 'ok', ['10.81.0.1'], 'n1'),
      op('DEL', 'a', 20, 30, 'ok', undefined, 'n1'), // releases at rev 25, inside (21, 29)
      op('ADD', 'b', 0, 10, 'ok', ['10.81.0.2'], 'n1'),
      op('DEL', 'b', 11, 12, 'error', undefined, 'n1'), // its release lands at rev 35, long after it answered
      op('DEL', 'b', 40, 45, 'ok', undefined, 'n1'), // finds nothing: ok
      op('ADD', 'c', 0, 2, 'unknown', undefined, 'n2'), // killed; its transaction commits at rev 25 anyway
      op('ADD', 'd', 0, 10, 'ok', ['10.81.0.4'], 'n3'), // n3 is removed: --finish releases it
      op('ADD', 'e', 0, 10, 'ok', ['10.81.0.5'], 'n4'), // n4's daemon releases it as a leak
      op('DEL', 'c', 46, 51, 'ok', undefined, 'n2'), // releases at rev 45, inside (47, 52)
      op('DEL', 'd', 52, 53, 'ok', undefined, 'n3'),
      op('DEL', 'e', 54, 55, 'ok', undefined, 'n4'),
    ];
    const admin: AdminOp[] = [
      { id: 0, kind: 'remove-node-finish', node: 'n3', start: 36, end: 38, outcome: 'error' },
      { id: 1, kind: 'reconcile-release', node: 'n4', holders: [{ containerId: 'e', ifname: 'eth0' }], start: 36, end: 38, outcome: 'ok' },
    ];
    const storeEvents = [
      ev(3, '10.81.0.1', 'a'),
      ev(4, '10.81.0.2', 'b'),
      ev(6, '10.81.0.4', 'd'),
      ev(7, '10.81.0.5', 'e'),
      ev(25, '10.81.0.1', null),
      ev(25, '10.81.0.3', 'c'),
      ev(35, '10.81.0.2', null),
      ev(37, '10.81.0.4', null),
      ev(37, '10.81.0.5', null),
      ev(45, '10.81.0.3', null),
    ];
    const clock = [tick(1, 0), tick(8, 9), tick(24, 21), tick(26, 28), tick(34, 33), tick(36, 36), tick(38, 37.5), tick(44, 47, 48), tick(46, 51, 52)];
    const r = checkHistoryDetailed({ ops, checkpoints: [cp(60, 61, [], [], true)], storeEvents, revisionClock: clock, admin });
    assert.deepEqual(r.violations, []);
    assert.deepEqual(
      [r.stats.storeAllocations, r.stats.allocationsByOkAdd, r.stats.allocationsByFailedAdd, r.stats.storeReleases, r.stats.releasesByOkDel, r.stats.releasesByFailedDel, r.stats.releasesByAdmin],
      [5, 4, 1, 5, 2, 1, 2],
    );
    assert.deepEqual([r.stats.ops, r.stats.ok, r.stats.failed, r.stats.unknown, r.stats.unknownAdds, r.stats.revisionTicks, r.stats.adminOps], [11, 9, 1, 1, 1, 9, 2]);
  });

  it('without a revision clock, any DEL of the holder explains a release (the old, weaker check); a holder without DEL still fails', () => {
    const h: History = { ops: s7ops(), checkpoints: [], storeEvents: s7events };
    const r = checkHistoryDetailed(h);
    assert.deepEqual(r.violations, []);
    assert.equal(r.stats.resolvedByStore, 1);
    const noDel: History = { ops: [op('ADD', 'x', 0, 10, 'ok', [X])], checkpoints: [], storeEvents: [ev(5, X, 'x'), ev(6, X, null)] };
    assert.deepEqual(kinds(noDel), ['unexplained-release']);
  });

  it('the recorder records admin actions and ticks; an unfinished admin action is unknown', async () => {
    let t = 0;
    const r = new HistoryRecorder(() => t++);
    const fin = r.beginAdmin('remove-node-finish', 'n1');
    r.beginAdmin('reconcile-release', 'n2', [{ containerId: 'a', ifname: 'eth0' }]);
    fin('error', 'exit 1');
    await r.tick(async () => 42);
    await assert.rejects(r.tick(async () => Promise.reject(new Error('etcd down'))), /etcd down/);
    const h = r.history();
    assert.deepEqual(h.admin?.map((a) => [a.kind, a.node, a.start, a.end, a.outcome, a.detail]), [
      ['remove-node-finish', 'n1', 0, 2, 'error', 'exit 1'],
      ['reconcile-release', 'n2', 1, Infinity, 'unknown', undefined],
    ]);
    assert.deepEqual(h.revisionClock, [{ rev: 42, start: 3, end: 4 }]);
  });
});

describe('history checker: offline allocation (reserve entries, an offline ADD synced later)', () => {
  const ev = (rev: number, ip: string, cid: string | null, reserveOf?: string) => ({ rev, ip, holder: cid === null ? null : { containerId: cid, ifname: 'eth0' }, ...(reserveOf ? { reserveOf } : {}) });
  const tick = (rev: number, start: number) => ({ rev, start, end: start + 0.5 });
  const R = '10.81.0.9';
  const reserveCp = (start: number, node: string, final = false): Checkpoint => ({
    start,
    end: start + 1,
    blocks: [{ cidr: '10.81.0.0/26', owner: node }],
    allocations: [{ ip: R, containerId: '', ifname: '', reserveOf: node }],
    ...(final ? { final } : {}),
  });

  it('passes an offline ADD answered from the reserve and synced after it answered, its DEL, a checkpoint showing the reserve entry, and a final state of reserve entries only', () => {
    const ops = [op('ADD', 'c', 10, 12, 'ok', [R], 'n1'), op('DEL', 'c', 30, 32, 'ok', undefined, 'n1')];
    const h: History = {
      ops,
      checkpoints: [reserveCp(14, 'n1'), reserveCp(40, 'n1', true)],
      // rev 3: refill; rev 20: the sync (t ≈ 21, after the ADD ended); rev 31: the DEL; rev 35: a refill re-reserves it
      storeEvents: [ev(3, R, null, 'n1'), ev(20, R, 'c'), ev(31, R, null), ev(35, R, null, 'n1')],
      revisionClock: [tick(2, 1), tick(4, 5), tick(19, 20.5), tick(21, 21.5), tick(30, 30.5), tick(32, 31.2)],
    };
    const r = checkHistoryDetailed(h);
    assert.deepEqual(r.violations, []);
    assert.deepEqual([r.stats.reserveEntries, r.stats.allocationsBySync, r.stats.releasesByOkDel], [2, 1, 1]);
  });

  it('passes an offline ADD and an offline DEL cancelled before any sync (the address never left the reserve), and a release synced after an offline DEL answered', () => {
    const cancelled: History = { ops: [op('ADD', 'c', 10, 12, 'ok', [R], 'n1'), op('DEL', 'c', 13, 14, 'ok', undefined, 'n1')], checkpoints: [], storeEvents: [ev(3, R, null, 'n1')] };
    const r = checkHistoryDetailed(cancelled);
    assert.deepEqual(r.violations, []);
    assert.equal(r.stats.offlineUnsynced, 1);
    // synced ADD at rev 20 (t≈21), then the DEL answered offline at [22, 23], its release synced at rev 40 (t≈50)
    const late: History = {
      ops: [op('ADD', 'c', 10, 12, 'ok', [R], 'n1'), op('DEL', 'c', 22, 23, 'ok', undefined, 'n1')],
      checkpoints: [],
      storeEvents: [ev(3, R, null, 'n1'), ev(20, R, 'c'), ev(40, R, null)],
      revisionClock: [tick(19, 20.5), tick(21, 21.5), tick(39, 49), tick(41, 50.5)],
    };
    assert.deepEqual(kinds(late), []);
  });

  it('FAILS a reserve entry handed to a container of another node, and an ok ADD of another node\'s reserved address that never committed', () => {
    const other: History = { ops: [op('ADD', 'd', 10, 12, 'ok', [R], 'n2'), op('DEL', 'd', 30, 32, 'ok', undefined, 'n2')], checkpoints: [], storeEvents: [ev(3, R, null, 'n1'), ev(11, R, 'd'), ev(31, R, null)] };
    assert.deepEqual(kinds(other), ['unexplained-allocation']);
    const never: History = { ops: [op('ADD', 'd', 10, 12, 'ok', [R], 'n2')], checkpoints: [], storeEvents: [ev(3, R, null, 'n1')] };
    assert.deepEqual(kinds(never), ['unconfirmed']);
  });

  it('FAILS a reserve entry over a container\'s allocation that no DEL released (the store had the container and the reserve at once is a hand-over only for the same node)', () => {
    // c (n1) holds R; n2's daemon puts R into its reserve: c's hold ends without an explanation
    const h: History = { ops: [op('ADD', 'c', 0, 2, 'ok', [R], 'n1')], checkpoints: [], storeEvents: [ev(1, R, 'c'), ev(5, R, null, 'n2')] };
    assert.deepEqual(kinds(h), ['unexplained-release']);
  });

  it('FAILS a checkpoint that shows a successful ADD\'s address as another node\'s reserve entry, and a final state with a container left beside the reserve', () => {
    const ops = [op('ADD', 'c', 0, 2, 'ok', [R], 'n1')];
    assert.deepEqual(kinds({ ops, checkpoints: [reserveCp(5, 'n2')] }), ['lost']);
    assert.deepEqual(kinds({ ops, checkpoints: [reserveCp(5, 'n1')] }), []);
    const leftover: Checkpoint = { ...reserveCp(10, 'n1', true), allocations: [{ ip: '10.81.0.10', containerId: '', ifname: '', reserveOf: 'n1' }, { ip: R, containerId: 'c', ifname: 'eth0' }] };
    assert.deepEqual(kinds({ ops, checkpoints: [leftover] }), ['not-empty']);
  });
});

