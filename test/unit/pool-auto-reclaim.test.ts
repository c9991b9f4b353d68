/**
 * The automatic removal of dead nodes (src/pool/auto-reclaim.ts) on the memory KV with an injected
 * monotonic clock and leases the test expires: who is a candidate, when absence counts, the
 * create-only marker deciding between two reclaimers scanning at once (the loser writes nothing),
 * the finish after the window with its audit intent first (an intent that cannot be recorded
 * releases nothing), a veto, a takeover, and the last-seen record. The real-etcd, real-daemon run
 * is test/blackbox/pool-auto-reclaim.test.ts.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { formatIP } from '../../src/common/ip.ts';
import { loadIPAMConfig } from '../../src/ipam/config.ts';
import { PoolAllocator, type PoolAllocation } from '../../src/pool/allocator.ts';
import { AutoReclaimer, lastSeen, SeenWriter, SEEN_EVERY_MS, type AutoReclaimReport } from '../../src/pool/auto-reclaim.ts';
import { settingsValue } from '../../src/pool/model.ts';
import { MemoryKV } from '../../src/store/memory/memory-kv.ts';
import type { KV, Leases } from '../../src/store/kv.ts';

const P = '/ipwarden/pools/p1';
const SIZES = { blockSize4: 28, blockSize6: 122 };

function allocator(kv: MemoryKV, node: string): PoolAllocator {
  const c = loadIPAMConfig(JSON.stringify({ cniVersion: '1.0.0', name: 'net1', ipam: { ranges: [[{ subnet: '10.80.0.0/27' }]] } }), undefined);
  return new PoolAllocator({ kv, pool: 'p1', prefix: '/ipwarden', node, network: 'net1', rangeSets: c.rangeSets, sizes: SIZES, now: () => 1000 });
}

/** The memory KV with the leases granted through it recorded (to expire the veto window's). */
function tracked(kv: MemoryKV, leases: string[]): KV & Leases {
  return {
    get description() {
      return kv.description;
    },
    get stats() {
      return kv.stats;
    },
    get: (k) => kv.get(k),
    list: (p, o) => kv.list(p, o),
    txn: (c, o) => kv.txn(c, o),
    close: () => kv.close(),
    grantLease: async (t) => {
      const id = await kv.grantLease(t);
      leases.push(id);
      return id;
    },
    keepAlive: (id) => kv.keepAlive(id),
    revokeLease: (id) => kv.revokeLease(id),
  };
}

/** A report that records every event as one line. */
function recorder(failIntent = false): AutoReclaimReport & { lines: string[] } {
  const lines: string[] = [];
  return {
    lines,
    begun: (e) => lines.push(`begun ${e.node} by ${e.by} blocks=${e.blocks.join(',')} window=${e.windowSeconds}`),
    intent: (e) => {
      if (failIntent) throw new Error('audit log not writable');
      lines.push(`intent ${e.node} by ${e.by} ${e.handles.map((h) => `${h.containerId}:${h.ips.map((x) => `${x.ip}@${x.block}`).join('+')}`).join(' ')}`);
    },
    finished: (e) => lines.push(`finished ${e.node} by ${e.by} released=${e.released.join(',')} deleted=${e.deletedBlocks.join(',')} kept=${e.keptBlocks.join(',')} refused=${e.refused ?? '-'} first=${e.first}`),
    log: (level, f, msg) => lines.push(`${level} ${msg}${f['error'] === undefined ? '' : `: ${String(f['error'])}`}`),
  };
}

/** Node `n-a` served by a daemon (settings key) holding two attachments; heartbeats of `alive`. */
async function world(alive: string[] = []): Promise<{ kv: MemoryKV; ips: string[] }> {
  const kv = new MemoryKV();
  const a = allocator(kv, 'n-a');
  const r = await a.add([{ containerId: 'c1', ifname: 'eth0' }, { containerId: 'c2', ifname: 'eth0' }]);
  const ips = r.map((x) => formatIP(((x as PoolAllocation[])[0] as PoolAllocation).ip));
  for (const n of ['n-a', 'n-b', 'n-c', ...alive]) kv.plant(`${P}/nodes/${n}/settings`, settingsValue(0));
  for (const n of alive) kv.plant(`${P}/alive/${n}`, JSON.stringify({ v: 1, node: n, since: 1 }));
  return { kv, ips };
}

function reclaimer(kv: KV & Leases, own: string, clock: { t: number }, report: AutoReclaimReport, reclaimAfterMs = 5000): AutoReclaimer {
  const r = new AutoReclaimer({ kv, pool: 'p1', prefix: '/ipwarden', sizes: SIZES, reclaimAfterMs, clock: () => clock.t, report });
  r.addOwn(own);
  return r;
}

describe('automatic removal of dead nodes (memory KV, injected clock)', () => {
  it('absence counts from the first scan that saw it on the own clock; two reclaimers at once: one marker, the loser writes nothing; finish after the window, intent first', async () => {
    const { kv, ips } = await world(['n-b', 'n-c']);
    const leases: string[] = [];
    const tkv = tracked(kv, leases);
    const clock = { t: 0 };
    const rb = recorder();
    const rc = recorder();
    const b = reclaimer(tkv, 'n-b', clock, rb);
    const c = reclaimer(tkv, 'n-c', clock, rc);
    await Promise.all([b.scan(), c.scan()]);
    clock.t = 4999;
    await Promise.all([b.scan(), c.scan()]);
    assert.equal(await kv.get(`${P}/removing/n-a`), null, 'not yet: 4.999 s < reclaimAfter');
    clock.t = 5000;
    const before = kv.stats.txnsSucceeded;
    await Promise.all([b.scan(), c.scan()]);
    const marker = JSON.parse((await kv.get(`${P}/removing/n-a`))?.value ?? '{}') as { by: string };
    const [win, lose] = marker.by === 'n-b' ? [rb, rc] : [rc, rb];
    assert.deepEqual(win.lines, [`begun n-a by ${marker.by} blocks=10.80.0.16-28 window=60`]);
    assert.deepEqual(lose.lines, [`info automatic node removal not begun: the removal of node n-a from pool p1 was begun by ${marker.by} (${P}/removing/n-a)`]);
    // Committed: the winner's marker with the window, the window again (leased after the marker),
    // its block marked pendingRelease — 3; the loser's none (its create-only compare failed, or it
    // found the marker first).
    assert.equal(kv.stats.txnsSucceeded - before, 3);
    // The window is open: scans finish nothing.
    await Promise.all([b.scan(), c.scan()]);
    assert.deepEqual((await kv.list(`${P}/handles/`)).length, 2);
    for (const id of leases) kv.expireLease(id);
    await Promise.all([b.scan(), c.scan()]);
    assert.deepEqual(win.lines.slice(1), [`intent n-a by ${marker.by} c1:${ips[0]}@10.80.0.16/28 c2:${ips[1]}@10.80.0.16/28`, `finished n-a by ${marker.by} released=${[...ips].sort().join(',')} deleted=10.80.0.16-28 kept= refused=- first=true`]);
    assert.equal(lose.lines.length, 1, 'the loser never finishes');
    assert.deepEqual(await kv.list(`${P}/handles/`), []);
    assert.deepEqual((await kv.list(`${P}/nodes/n-a/`)).map((e) => e.key), []);
    assert.equal(await kv.get(`${P}/removing/n-a`), null);
    // Done: later scans do nothing.
    clock.t = 100_000;
    await Promise.all([b.scan(), c.scan()]);
    assert.equal(win.lines.length, 3);
  });

  it('candidates: never a node with a heartbeat, never one no daemon served (no settings key), never its own node; an operator marker is left alone', async () => {
    const { kv } = await world(['n-b']);
    kv.plant(`${P}/nodes/n-x/blocks/10.80.0.16-28`, '{"v":1,"rangeSet":0}'); // an affinity, no settings: standalone-only node
    const clock = { t: 0 };
    const rep = recorder();
    // n-b's own daemon; n-c (served, absent) is also its own node here: never a candidate.
    const b = reclaimer(tracked(kv, []), 'n-b', clock, rep);
    b.addOwn('n-c');
    kv.plant(`${P}/removing/n-a`, JSON.stringify({ v: 1, node: 'n-a', at: 1 })); // an operator's step 1
    await b.scan();
    clock.t = 1_000_000;
    await b.scan();
    assert.deepEqual(rep.lines, []);
    assert.deepEqual(JSON.parse((await kv.get(`${P}/removing/n-a`))?.value ?? ''), { v: 1, node: 'n-a', at: 1 });
    assert.equal(await kv.get(`${P}/removing/n-x`), null);
    assert.equal(await kv.get(`${P}/removing/n-c`), null);
  });

  it('a heartbeat seen again resets the absence; a node that returns within the window vetoes and nothing is released', async () => {
    const { kv } = await world(['n-b']);
    const leases: string[] = [];
    const clock = { t: 0 };
    const rep = recorder();
    const b = reclaimer(tracked(kv, leases), 'n-b', clock, rep);
    await b.scan(); // n-a, n-c absent from t=0
    clock.t = 3000;
    kv.plant(`${P}/alive/n-a`, JSON.stringify({ v: 1, node: 'n-a', since: 2 }));
    await b.scan();
    await kv.txn([], [{ delete: `${P}/alive/n-a` }]);
    clock.t = 4000;
    await b.scan(); // absent again from 4000
    clock.t = 8999;
    await b.scan();
    assert.equal(await kv.get(`${P}/removing/n-a`), null, 'absence restarted at 4 s');
    clock.t = 9000;
    await b.scan();
    assert.deepEqual(rep.lines.filter((l) => l.startsWith('begun')).sort(), ['begun n-a by n-b blocks=10.80.0.16-28 window=60', 'begun n-c by n-b blocks= window=60']);
    // n-a returns: its daemon's beat puts its heartbeat key and vetoes.
    kv.plant(`${P}/alive/n-a`, JSON.stringify({ v: 1, node: 'n-a', since: 5 }));
    await allocator(kv, 'n-a').vetoIfMarked();
    for (const id of leases) kv.expireLease(id);
    clock.t = 100_000;
    await b.scan();
    assert.deepEqual((await kv.list(`${P}/handles/`)).length, 2);
    assert.equal(JSON.parse((await kv.get(`${P}/blocks/10.80.0.16-28`))?.value ?? '{}').state, 'owned');
    assert.deepEqual(rep.lines.filter((l) => l.includes(' n-a ') && !l.startsWith('begun')), []);
  });

  it('an intent that cannot be audited releases nothing; a remover gone for reclaimAfter is taken over (one winner)', async () => {
    const { kv } = await world(['n-b']);
    const leases: string[] = [];
    const clock = { t: 0 };
    const failing = recorder(true);
    const b = reclaimer(tracked(kv, leases), 'n-b', clock, failing);
    await b.scan();
    clock.t = 5000;
    await b.scan();
    for (const id of leases) kv.expireLease(id);
    await b.scan();
    assert.deepEqual((await kv.list(`${P}/handles/`)).length, 2);
    assert.ok(failing.lines.includes('error automatic node removal: the audit log cannot be written: nothing released: audit log not writable'), failing.lines.join('\n'));
    // n-b dies (its heartbeat goes); n-c comes up with reclaimAfter and takes over after it.
    await kv.txn([], [{ delete: `${P}/alive/n-b` }]);
    kv.plant(`${P}/alive/n-c`, JSON.stringify({ v: 1, node: 'n-c', since: 3 }));
    const rc = recorder();
    const c = reclaimer(tracked(kv, leases), 'n-c', clock, rc);
    await c.scan();
    clock.t = 9999;
    await c.scan();
    assert.equal(JSON.parse((await kv.get(`${P}/removing/n-a`))?.value ?? '{}').by, 'n-b');
    clock.t = 10_000;
    await c.scan();
    assert.equal(JSON.parse((await kv.get(`${P}/removing/n-a`))?.value ?? '{}').by, 'n-c');
    assert.ok(rc.lines.includes('info automatic node removal taken over (its remover has no heartbeat)'), rc.lines.join('\n'));
    await c.scan(); // confirms step 1 (the window re-leased after the marker)
    for (const id of leases) kv.expireLease(id);
    await c.scan();
    assert.deepEqual(await kv.list(`${P}/handles/`), []);
    assert.equal(rc.lines.filter((l) => l.startsWith('finished n-a by n-c') && l.endsWith('first=true')).length, 1);
  });

  it('the last-seen record: written on the first beat, then at most every 5 minutes on the monotonic clock', async () => {
    const kv = new MemoryKV();
    const clock = { t: 0 };
    let wall = 1_700_000_000_000;
    const w = new SeenWriter(kv, () => clock.t, () => wall);
    await w.beat('/ipwarden', 'p1', 'n-a');
    wall += 10_000;
    clock.t = SEEN_EVERY_MS - 1;
    await w.beat('/ipwarden', 'p1', 'n-a');
    assert.deepEqual([...(await lastSeen(kv, '/ipwarden', 'p1'))], [['n-a', 1_700_000_000_000]]);
    clock.t = SEEN_EVERY_MS;
    await w.beat('/ipwarden', 'p1', 'n-a');
    assert.deepEqual([...(await lastSeen(kv, '/ipwarden', 'p1'))], [['n-a', 1_700_000_010_000]]);
    assert.equal(kv.stats.txns, 2);
    kv.plant(`${P}/seen/bad name`, '{"v":1,"at":1}');
    kv.plant(`${P}/seen/n-b`, 'not json');
    assert.deepEqual([...(await lastSeen(kv, '/ipwarden', 'p1'))], [['n-a', 1_700_000_010_000]]);
  });
});
