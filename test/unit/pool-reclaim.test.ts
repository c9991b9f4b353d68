/**
 * Releasing a node's pool leaks (src/pool/reclaim.ts, src/reconcile/pool-pass.ts) on the
 * memory KV, with an injected runtime list, kernel evidence and monotonic clock (no sleeps):
 * the revision rule (a handle created after R is never a candidate), two observations with the
 * same mod_revision (one is not enough; a handle re-written in between restarts), D2's cap with
 * roll-over, D3, the release transaction's guards (handle rewritten, the allocation's seq moved
 * on, a removal begun), tombstones and other nodes' handles ignored, the audit lines, and CNI GC's
 * exact released set.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { formatIP, type IP } from '../../src/common/ip.ts';
import { loadIPAMConfig } from '../../src/ipam/config.ts';
import { PoolAllocator } from '../../src/pool/allocator.ts';
import { classifyPoolHandles } from '../../src/pool/leaks.ts';
import { currentRevision, gcDecision, handlesPrefix, nodeHandles, releaseObserved } from '../../src/pool/reclaim.ts';
import { memoryAuditSink } from '../../src/reconcile/audit.ts';
import { Confirmations } from '../../src/reconcile/confirm.ts';
import { NOTHING_IN_USE, unreadableEvidence, type UseEvidence } from '../../src/reconcile/evidence.ts';
import type { ReconcileDeps } from '../../src/reconcile/options.ts';
import { poolGC, runPoolPass, type PoolTarget } from '../../src/reconcile/pool-pass.ts';
import type { SandboxInfo } from '../../src/reconcile/sandboxes.ts';
import type { KV, KVEntry } from '../../src/store/kv.ts';
import { MemoryKV } from '../../src/store/memory/memory-kv.ts';

/** The reconciling machine's host name, written into every handle the tests' allocators put. */
const HOST = 'host-a';
const KEYS = { prefix: '/ipwarden', pool: 'gp' };
const GRACE = 60;
const conf = loadIPAMConfig(JSON.stringify({ cniVersion: '1.0.0', name: 'net1', ipam: { ranges: [[{ subnet: '10.85.0.0/24' }]] } }), undefined);

function alloc(kv: KV, node = 'n1', network = 'net1'): PoolAllocator {
  return new PoolAllocator({ kv, pool: KEYS.pool, prefix: KEYS.prefix, node, network, rangeSets: conf.rangeSets, sizes: { blockSize4: 26, blockSize6: 122 }, now: () => 1_000, host: HOST });
}

async function add(kv: KV, id: string, node = 'n1', network = 'net1'): Promise<string> {
  const [r] = await alloc(kv, node, network).add([{ containerId: id, ifname: 'eth0' }]);
  if (!Array.isArray(r)) throw r;
  return formatIP((r[0] as { ip: IP }).ip);
}

/** A test world: the memory KV, the runtime's list, the kernel evidence, the monotonic clock. */
function world(kv: MemoryKV = new MemoryKV()) {
  const w = {
    kv,
    sandboxes: [] as SandboxInfo[],
    evidence: NOTHING_IN_USE as UseEvidence,
    listFails: null as string | null,
    /** Pod IPs per READY sandbox (PodSandboxStatus); an Error value makes that call fail. */
    podIPs: new Map<string, string[] | Error>(),
    /** Runs while the runtime is being asked (after R was read). */
    duringList: null as (() => Promise<void>) | null,
    mono: 0,
    audit: memoryAuditSink(),
    confirmations: new Confirmations(GRACE, 32),
  };
  const deps: ReconcileDeps = {
    env: { CONTAINER_RUNTIME_ENDPOINT: 'unix:///run/ipwarden-poolgc-unit.sock' },
    now: () => 1_700_000_000_000,
    evidence: () => w.evidence,
    sandboxSource: (endpoint) => ({
      endpoint,
      list: async () => {
        if (w.duringList !== null) await w.duringList();
        if (w.listFails !== null) throw new Error(w.listFails);
        return w.sandboxes;
      },
      podIPs: async (id: string) => {
        const v = w.podIPs.get(id) ?? [];
        if (v instanceof Error) throw v;
        return v;
      },
      close: () => undefined,
    }),
  };
  const target: PoolTarget = { kv, ...KEYS, node: 'n1', id: 'gp@n1' };
  const pass = async (advance = GRACE * 1000) => {
    w.mono += advance;
    return runPoolPass([target], { runtimeEndpoint: null, audit: () => w.audit, host: HOST }, w.confirmations, deps, () => w.mono);
  };
  return { w, pass, target, deps };
}

const hkey = (id: string) => `/ipwarden/pools/gp/handles/${id}/eth0`;
const released = (r: { released: ReadonlyArray<{ containerId: string }> }) => r.released.map((x) => x.containerId).sort();

describe('classifyPoolHandles: the revision rule', () => {
  const h = (id: string, createRevision: string) => ({ containerId: id, ifname: 'eth0', createRevision, value: { v: 1 as const, node: 'n1', network: 'net1', at: 0, ips: [{ ip: '10.85.0.2', block: '10.85.0.0-26', ordinal: 2, seq: 1, rangeSet: 0 }] } });
  it('create_revision > R is grace whatever the clock says; ≤ R is a candidate; the wall clock is information only', () => {
    const v = classifyPoolHandles({ handles: [h('at-r', '10'), h('after', '11')], sandboxes: new Map(), runtimeError: null, inUse: () => null, evidenceIncomplete: null, snapshotAtMs: 3_600_000, graceSeconds: null, revision: '10' });
    assert.deepEqual(v.map((x) => [x.containerId, x.verdict, x.reason, x.ageSeconds]), [
      ['at-r', 'leaked', 'the runtime does not list its sandbox and the kernel shows its addresses nowhere', 3600],
      ['after', 'grace', 'created after the runtime was asked (create_revision 11 > 10): its ADD may be in flight', 3600],
    ]);
  });
});

describe('the daemon pool pass (memory KV)', () => {
  it('a pool whose config names another runtimeEndpoint than the daemon asks is not judged (review B4); the same socket in either form is', async () => {
    const { w, deps } = world();
    await add(w.kv, 'gone');
    const run = (eps: string[]) => runPoolPass([{ kv: w.kv, ...KEYS, node: 'n1', id: `gp@n1:${eps.join()}`, runtimeEndpoints: eps }], { runtimeEndpoint: null, audit: () => w.audit, host: HOST }, w.confirmations, deps, () => (w.mono += GRACE * 1000));
    await run(['unix:///run/crio/crio.sock']);
    const p = await run(['unix:///run/crio/crio.sock']);
    assert.deepEqual(released(p), []);
    assert.deepEqual(p.errors.filter((e) => e.kind === 'runtime').map((e) => e.message), [
      'pool gp: a network of it names runtimeEndpoint unix:///run/crio/crio.sock, but the daemon asks unix:///run/ipwarden-poolgc-unit.sock: not judged, nothing released (run the daemon with --runtime-endpoint unix:///run/crio/crio.sock)',
    ]);
    await run(['/run/ipwarden-poolgc-unit.sock']);
    assert.deepEqual(released(await run(['/run/ipwarden-poolgc-unit.sock'])), ['gone']);
  });
  it('two hosts under one node name: a handle of the node that another host wrote (or that names no host) is never judged or released here (review B1)', async () => {
    const { w, pass } = world();
    await add(w.kv, 'mine-gone');
    // host-b runs under the same node name n1 (a fixed ipam.nodeName): its live pod is not in host-a's runtime or kernel.
    const [r] = await new PoolAllocator({ kv: w.kv, pool: KEYS.pool, prefix: KEYS.prefix, node: 'n1', network: 'net1', rangeSets: conf.rangeSets, sizes: { blockSize4: 26, blockSize6: 122 }, now: () => 1_000, host: 'host-b' }).add([{ containerId: 'theirs-live', ifname: 'eth0' }]);
    assert.ok(Array.isArray(r));
    // An allocator given no host (a handle written before hosts were recorded).
    const [r2] = await new PoolAllocator({ kv: w.kv, pool: KEYS.pool, prefix: KEYS.prefix, node: 'n1', network: 'net1', rangeSets: conf.rangeSets, sizes: { blockSize4: 26, blockSize6: 122 }, now: () => 1_000 }).add([{ containerId: 'unknown-host', ifname: 'eth0' }]);
    assert.ok(Array.isArray(r2));
    await pass();
    const p2 = await pass();
    assert.deepEqual(released(p2), ['mine-gone']);
    assert.ok(w.kv.dump()[hkey('theirs-live')] !== undefined && w.kv.dump()[hkey('unknown-host')] !== undefined);
    assert.deepEqual(p2.errors.filter((e) => e.kind === 'foreign').map((e) => e.message), [
      'pool gp: 2 handle(s) of node n1 were written on other hosts than host-a ((none recorded), host-b): never judged or released here — two hosts under one node name? (a fixed ipam.nodeName, equal host names)',
    ]);
  });
  it('one observation is not enough; the second, a grace period later with the same mod_revision, releases exactly the leak', async () => {
    const { w, pass } = world();
    await add(w.kv, 'gone');
    await add(w.kv, 'live');
    w.sandboxes = [{ id: 'live', state: 'notready' }];
    const p1 = await pass();
    assert.deepEqual([p1.released, p1.waiting, p1.pools], [[], 1, [{ pool: 'gp', node: 'n1', live: 1, inUse: 0, grace: 0, leaked: 1, unknown: 0 }]]);
    assert.deepEqual([...p1.candidates], [['gp', 1]]);
    // Less than the grace period later: still waiting.
    const p2 = await pass(GRACE * 1000 - 1);
    assert.deepEqual([released(p2), p2.waiting], [[], 1]);
    const p3 = await pass(1);
    assert.deepEqual(released(p3), ['gone']);
    assert.deepEqual(p3.released[0]?.ips, ['10.85.0.2']);
    assert.equal(await w.kv.get(hkey('gone')), null);
    assert.notEqual(await w.kv.get(hkey('live')), null);
    // The block no longer holds the address; the live one's stays.
    const block = JSON.parse((await w.kv.get('/ipwarden/pools/gp/blocks/10.85.0.0-26'))?.value ?? '{}') as { allocs: Record<string, { id: string }> };
    assert.deepEqual(Object.entries(block.allocs).map(([o, a]) => [o, a.id]), [['3', 'live']]);
    // Audit: the intent (synced before the transaction), then the outcome, with pool and revision.
    assert.deepEqual(w.audit.records.map((r) => [r.phase, r.network, r.ip, r.containerId, r.ifname, r.verdict, r.pool, r.revision]), [
      ['intent', 'net1', '10.85.0.2', 'gone', 'eth0', 'leaked', 'gp', p3.released[0]?.modRevision],
      ['released', 'net1', '10.85.0.2', 'gone', 'eth0', 'leaked', 'gp', p3.released[0]?.modRevision],
    ]);
    assert.equal(w.audit.durable >= 1, true);
    assert.match(w.audit.records[0]?.reason ?? '', /^pool gp: the runtime does not list its sandbox and the kernel shows its addresses nowhere, in two observations at least the grace period apart with the same mod_revision [0-9]+$/);
  });

  it('a handle created after R (while the runtime is asked) is never a candidate in that pass: grace, then two more observations', async () => {
    const { w, pass } = world();
    await add(w.kv, 'old');
    w.duringList = async () => {
      w.duringList = null;
      await add(w.kv, 'young');
    };
    const p1 = await pass();
    assert.deepEqual(p1.pools[0], { pool: 'gp', node: 'n1', live: 0, inUse: 0, grace: 1, leaked: 1, unknown: 0 });
    const p2 = await pass();
    assert.deepEqual([released(p2), p2.waiting], [['old'], 1], 'young seen as a candidate for the first time');
    const p3 = await pass();
    assert.deepEqual(released(p3), ['young']);
  });

  it('a handle re-written between the observations is not released (its clock restarts)', async () => {
    const { w, pass } = world();
    await add(w.kv, 'c1');
    await pass();
    const e = (await w.kv.get(hkey('c1'))) as KVEntry;
    w.kv.plant(e.key, e.value); // same value, new mod_revision
    const p2 = await pass();
    assert.deepEqual([released(p2), p2.waiting], [[], 1]);
    const p3 = await pass();
    assert.deepEqual(released(p3), ['c1']);
  });

  it('re-validated just before the release: an address now configured in a namespace is kept', async () => {
    const { w, pass } = world();
    await add(w.kv, 'c1');
    await pass();
    let reads = 0;
    const used: UseEvidence = { addresses: new Map([['10.85.0.2', [{ netns: 'net:[4026532999]', via: '/run/netns/x' }]]]), inFlight: new Map(), incomplete: null };
    const { deps } = world(w.kv);
    const p2 = await runPoolPass([{ kv: w.kv, ...KEYS, node: 'n1', id: 'gp@n1' }], { runtimeEndpoint: null, audit: () => w.audit, host: HOST }, w.confirmations, { ...deps, evidence: () => (reads++ === 0 ? NOTHING_IN_USE : used) }, () => (w.mono += GRACE * 1000));
    assert.deepEqual([p2.released, reads], [[], 2]);
    assert.notEqual(await w.kv.get(hkey('c1')), null);
    assert.deepEqual(w.audit.records, [], 'nothing to record: nothing was about to be released');
  });

  it('D2: at most 32 per pass, oldest create_revision first; the rest next pass', async () => {
    const { w, pass } = world();
    await add(w.kv, 'live');
    w.sandboxes = [{ id: 'live', state: 'ready' }];
    for (let i = 0; i < 40; i++) await add(w.kv, `c${String(i).padStart(2, '0')}`);
    await pass();
    const p2 = await pass();
    assert.deepEqual(released(p2), Array.from({ length: 32 }, (_, i) => `c${String(i).padStart(2, '0')}`));
    assert.deepEqual([p2.deferred, [...p2.candidates]], [8, [['gp', 8]]]);
    const p3 = await pass();
    assert.deepEqual(released(p3), Array.from({ length: 8 }, (_, i) => `c${32 + i}`));
  });

  it('D3: a runtime list that owns none of the pool handles is not trusted alone when 8 or more would go', async () => {
    const { w, pass } = world();
    for (let i = 0; i < 8; i++) await add(w.kv, `c${i}`);
    w.sandboxes = [{ id: 'someone-else', state: 'ready' }];
    await pass();
    const p2 = await pass();
    assert.deepEqual(p2.released, []);
    assert.equal(p2.held, "the runtime's list owns no reservation of gp@n1, where 8 would be released: not trusted alone");
    assert.equal((await w.kv.list(handlesPrefix(KEYS))).length, 8);
    // Seven alone are released (below the threshold).
    await alloc(w.kv).del({ containerId: 'c7', ifname: 'eth0' });
    const p3 = await pass();
    assert.deepEqual(released(p3), ['c0', 'c1', 'c2', 'c3', 'c4', 'c5', 'c6']);
  });

  it('no runtime, incomplete kernel evidence: every verdict unknown, nothing released', async () => {
    const { w, pass } = world();
    await add(w.kv, 'c1');
    w.listFails = 'connection refused';
    await pass();
    const p2 = await pass();
    assert.deepEqual([p2.released, p2.pools[0]?.unknown, p2.errors.map((e) => e.kind)], [[], 1, ['runtime']]);
    w.listFails = null;
    w.evidence = unreadableEvidence('/proc/77/environ: EACCES');
    await pass();
    const p4 = await pass();
    assert.deepEqual([p4.released, p4.pools[0]?.unknown, p4.errors.map((e) => e.kind)], [[], 1, ['kernel']]);
  });

  it("tombstones, other nodes' handles and live or in-use handles are never candidates", async () => {
    const { w, pass } = world();
    await alloc(w.kv).del({ containerId: 'ghost', ifname: 'eth0' }); // a tombstone of n1
    await add(w.kv, 'other', 'n2');
    await add(w.kv, 'used');
    w.evidence = { addresses: new Map(), inFlight: new Map([['used', [{ pid: 77, command: 'ADD' }]]]), incomplete: null };
    await pass();
    const p2 = await pass();
    assert.deepEqual([p2.released, p2.pools[0]], [[], { pool: 'gp', node: 'n1', live: 0, inUse: 1, grace: 0, leaked: 0, unknown: 0 }]);
    assert.equal((await w.kv.list(handlesPrefix(KEYS))).length, 3);
  });

  it('BR-13: an address a READY sandbox reports is in use; a failed status call releases nothing that pass', async () => {
    const { w, pass } = world();
    await add(w.kv, 'stale'); // 10.85.0.2
    await add(w.kv, 'c2'); // 10.85.0.3
    await add(w.kv, 'live'); // 10.85.0.4
    w.sandboxes = [{ id: 'live', state: 'ready' }];
    w.podIPs.set('live', ['10.85.0.4', '10.85.0.2']);
    await pass();
    const p2 = await pass();
    assert.deepEqual([released(p2), p2.pools[0]?.inUse], [['c2'], 1]);
    w.podIPs.set('live', new Error('UNAVAILABLE: status timed out'));
    await alloc(w.kv).add([{ containerId: 'c3', ifname: 'eth0' }]);
    await pass();
    const p4 = await pass();
    assert.deepEqual(p4.released, []);
    assert.deepEqual(p4.errors.map((e) => e.kind), ['runtime']);
    assert.match(p4.errors[0]?.message ?? '', /^pod IPs of ready sandbox live could not be read: .*: nothing released this pass$/);
  });

  it('an unreachable etcd skips the pool for the pass (error kind etcd), nothing else happens', async () => {
    const { w, pass } = world();
    await add(w.kv, 'c1');
    w.kv.failNext = 1;
    const p = await pass();
    assert.deepEqual([p.pools, p.errors.map((e) => [e.kind, e.message])], [[], [['etcd', 'pool gp: memory KV is unavailable (injected)']]]);
  });
});

describe('releaseObserved: the release transaction', () => {
  async function observed(kv: MemoryKV, id: string) {
    const { handles } = nodeHandles(await kv.list(handlesPrefix(KEYS)), KEYS, 'n1');
    const h = handles.find((x) => x.containerId === id);
    assert.ok(h !== undefined);
    return h;
  }

  it('refused when the handle was re-written after the observation', async () => {
    const kv = new MemoryKV();
    await add(kv, 'c1');
    const h = await observed(kv, 'c1');
    kv.plant(h.key, JSON.stringify(h.value));
    const r = await releaseObserved(kv, KEYS, 'n1', h);
    assert.equal(r.released, false);
    assert.match((r as { why: string }).why, /^the handle was rewritten since it was observed \(mod_revision [0-9]+, observed [0-9]+\)$/);
    assert.notEqual(await kv.get(h.key), null);
  });

  it("refused when the allocation's seq changed: the address is never freed, nothing is written", async () => {
    const kv = new MemoryKV();
    await add(kv, 'c1');
    const h = await observed(kv, 'c1');
    const bk = '/ipwarden/pools/gp/blocks/10.85.0.0-26';
    const b = JSON.parse((await kv.get(bk))?.value ?? '{}') as { seq: number; allocs: Record<string, { seq: number; id: string }> };
    // Released and re-allocated to another container behind the handle's back.
    b.seq = 9;
    b.allocs['2'] = { ...(b.allocs['2'] as { seq: number; id: string }), seq: 9, id: 'newer' };
    kv.plant(bk, JSON.stringify(b));
    const before = kv.dump();
    const r = await releaseObserved(kv, KEYS, 'n1', h);
    assert.deepEqual(r, { released: false, why: 'the allocation of 10.85.0.2 moved on (the handle names seq 1; in block 10.85.0.0-26 it is held by newer/eth0 with seq 9): nothing released' });
    assert.deepEqual(kv.dump(), before);
  });

  it('a block written meanwhile (another ADD in it) is re-read: released, the other allocation kept', async () => {
    const kv = new MemoryKV();
    await add(kv, 'c1');
    const h = await observed(kv, 'c1');
    let raced = false;
    kv.beforeTxn = () => {
      if (raced) return;
      raced = true;
      kv.beforeTxn = null;
      void add(kv, 'c2'); // its first read happens at once; its transaction lands before ours is re-sent
    };
    const r = await releaseObserved(kv, KEYS, 'n1', h);
    assert.deepEqual(r.released, true);
    const b = JSON.parse((await kv.get('/ipwarden/pools/gp/blocks/10.85.0.0-26'))?.value ?? '{}') as { allocs: Record<string, { id: string }> };
    assert.deepEqual(Object.values(b.allocs).map((a) => a.id).filter((id) => id === 'c1'), []);
  });

  it('refused while a removal of the node is begun (removing/<me>): nothing written', async () => {
    const kv = new MemoryKV();
    await add(kv, 'c1');
    const h = await observed(kv, 'c1');
    kv.plant('/ipwarden/pools/gp/removing/n1', '{"v":1,"node":"n1","at":1}');
    const r = await releaseObserved(kv, KEYS, 'n1', h);
    assert.deepEqual(r, { released: false, why: 'a removal of node n1 is begun (/ipwarden/pools/gp/removing/n1): nothing released' });
    assert.notEqual(await kv.get(h.key), null);
  });

  it('the revision R is read without writing anything', async () => {
    const kv = new MemoryKV();
    await add(kv, 'c1');
    const before = kv.revision;
    assert.equal(await currentRevision(kv), String(before));
    assert.equal(kv.revision, before);
  });
});

/** A KV whose `list` first runs `hook` (a writer landing between the GC's revision read and its list). */
function hooked(inner: MemoryKV, hook: () => Promise<void>): KV {
  let once = false;
  return {
    description: inner.description,
    stats: inner.stats,
    get: (k) => inner.get(k),
    list: async (p, o) => {
      if (!once) {
        once = true;
        await hook();
      }
      return inner.list(p, o);
    },
    txn: (c, o) => inner.txn(c, o),
    close: () => inner.close(),
  };
}

describe('CNI GC on a pool network', () => {
  it("exactly this node's handles of this network that are not valid attachments, and only those the kernel shows unused and that existed before the GC began", async () => {
    const kv = new MemoryKV();
    for (const id of ['valid', 'stale', 'configured', 'inflight']) await add(kv, id);
    await add(kv, 'other-node', 'n2');
    await add(kv, 'other-net', 'n1', 'net2');
    const audit = memoryAuditSink();
    const ev: UseEvidence = {
      addresses: new Map([['10.85.0.4', [{ netns: 'net:[4026532001]', via: '/run/netns/a' }]]]),
      inFlight: new Map([['inflight', [{ pid: 90, command: 'DEL' }]]]),
      incomplete: null,
    };
    const k = hooked(kv, async () => void (await add(kv, 'late')));
    const out = await poolGC({ kv: k, ...KEYS, node: 'n1' }, 'net1', [{ containerId: 'valid', ifname: 'eth0' }], { evidence: () => ev, audit: () => audit, now: () => 5_000, host: HOST });
    assert.deepEqual(out.released, [{ containerId: 'stale', ifname: 'eth0', ips: ['10.85.0.3'] }]);
    assert.deepEqual(out.kept.map((x) => [x.containerId, x.why]), [
      ['configured', '10.85.0.4: the address is configured in network namespace net:[4026532001] via /run/netns/a'],
      ['inflight', '10.85.0.5: a CNI DEL for its container is running (pid 90)'],
      // The meta key and six ADDs wrote revisions 2–8; R = 8 was read, then "late" was made (9).
      ['late', "created after the GC began (create_revision 9 > 8): not in the runtime's list yet"],
    ]);
    assert.deepEqual(
      (await kv.list(handlesPrefix(KEYS), { keysOnly: true })).map((e) => e.key.slice(handlesPrefix(KEYS).length)),
      ['configured/eth0', 'inflight/eth0', 'late/eth0', 'other-net/eth0', 'other-node/eth0', 'valid/eth0'],
    );
    assert.deepEqual(audit.records.map((r) => [r.phase, r.ip, r.containerId, r.pool]), [
      ['intent', '10.85.0.3', 'stale', 'gp'],
      ['released', '10.85.0.3', 'stale', 'gp'],
    ]);
  });

  it('incomplete kernel evidence releases nothing; an unreachable etcd throws STORE_UNAVAILABLE before anything is written', async () => {
    const kv = new MemoryKV();
    await add(kv, 'stale');
    const audit = memoryAuditSink();
    const out = await poolGC({ kv, ...KEYS, node: 'n1' }, 'net1', [], { evidence: () => unreadableEvidence('no host PID namespace'), audit: () => audit, now: () => 0, host: HOST });
    assert.deepEqual([out.released, out.kept.map((x) => x.why)], [[], ['kernel evidence incomplete: no host PID namespace']]);
    kv.failNext = 1;
    const before = kv.dump();
    await assert.rejects(poolGC({ kv, ...KEYS, node: 'n1' }, 'net1', [], { evidence: () => NOTHING_IN_USE, audit: () => audit, now: () => 0, host: HOST }), (e: Error & { code?: string }) => e.code === 'STORE_UNAVAILABLE');
    assert.deepEqual(kv.dump(), before);
  });

  it('gcDecision is pure and keeps valid attachments out', () => {
    const h = (id: string, rev: string) => ({ key: hkey(id), containerId: id, ifname: 'eth0', modRevision: rev, createRevision: rev, value: { v: 1 as const, node: 'n1', network: 'net1', at: 0, ips: [] } });
    const v = gcDecision([h('a', '3'), h('b', '4'), h('c', '6')], [{ containerId: 'a', ifname: 'eth0' }], '5', () => null, null);
    assert.deepEqual(v.map((x) => [x.handle.containerId, x.release]), [['b', true], ['c', false]]);
  });
});

describe('a block that cannot be read, in the pass and in CNI GC: reported, never released, never rewritten', () => {
  const bk = '/ipwarden/pools/gp/blocks/10.85.0.0-26';
  const BAD = '{"v":1,"bad":true}';
  const WHY = 'unknown field "bad" (known: v, cidr, rangeSet, node, state, seq, next, allocs, wanted)';

  it('the pass keeps the leak (audited kept, error kind corrupt) and the pool goes on; after a repair two observations release it', async () => {
    const { w, pass } = world();
    assert.equal(await add(w.kv, 'gone'), '10.85.0.2');
    const good = w.kv.dump()[bk] as string;
    w.kv.plant(bk, BAD);
    await pass();
    const p2 = await pass();
    assert.deepEqual(released(p2), []);
    const why = `10.85.0.2: etcd key ${bk}: ${WHY}: nothing released (left for an operator)`;
    assert.deepEqual(p2.errors, [{ kind: 'corrupt', pool: 'gp', message: `gone/eth0: ${why}` }]);
    assert.deepEqual(w.audit.records.map((r) => [r.phase, r.ip, r.containerId, r.phase === 'kept' ? r.reason : '']), [
      ['intent', '10.85.0.2', 'gone', ''],
      ['kept', '10.85.0.2', 'gone', why],
    ]);
    assert.equal(w.kv.dump()[bk], BAD);
    assert.notEqual(w.kv.dump()[hkey('gone')], undefined);
    w.kv.plant(bk, good);
    assert.deepEqual(released(await pass()), []);
    assert.deepEqual(released(await pass()), ['gone']);
  });

  it('CNI GC keeps the stale attachment with why instead of failing', async () => {
    const kv = new MemoryKV();
    await add(kv, 'stale');
    kv.plant(bk, '{');
    const audit = memoryAuditSink();
    const out = await poolGC({ kv, ...KEYS, node: 'n1' }, 'net1', [], { evidence: () => NOTHING_IN_USE, audit: () => audit, now: () => 0, host: HOST });
    assert.deepEqual(out, { released: [], kept: [{ containerId: 'stale', ifname: 'eth0', why: `10.85.0.2: etcd key ${bk}: not valid JSON: nothing released (left for an operator)` }] });
    assert.equal(kv.dump()[bk], '{');
  });
});
