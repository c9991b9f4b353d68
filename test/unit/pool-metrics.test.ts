/**
 * The cluster pools' metrics (src/daemon/metrics.ts `PoolMetrics`) fed by the daemon's pool
 * sessions (src/daemon/pool-sessions.ts `PoolSessions` through its `PoolObserver`) on a memory KV: the exact
 * series after ADDs, a lost race, an unavailable etcd, a batch, DEL and CHECK; the gauges read on
 * a scrape at most once per cache age (an injected monotonic clock, no sleeps); a failed read
 * leaves no gauge and is counted; an observer that throws never fails a request. Offline
 * allocation's series (ipam.pool.offline): operations by kind, reserve left, journal entries,
 * contact age — exact, read from `offlineStats()` on each scrape without an etcd read.
 */
import { after, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { isAppError } from '../../src/common/errors.ts';
import { loadIPAMConfig } from '../../src/ipam/config.ts';
import { PoolSessions } from '../../src/daemon/pool-sessions.ts';
import { observeTxns, type PoolTxnEvent } from '../../src/daemon/pool-observer.ts';
import { DaemonMetrics, POOL_GAUGES_MIN_AGE_SECONDS } from '../../src/daemon/metrics.ts';
import type { PoolSample } from '../../src/daemon/pool-observer.ts';
import type { KVCompare, KVEntry, KVOp, KVTxnResult } from '../../src/store/kv.ts';
import { AppError } from '../../src/common/errors.ts';
import { MemoryKV } from '../../src/store/memory/memory-kv.ts';
import { poolNodeSample, poolStatus } from '../../src/pool/status.ts';
import { PoolAllocator } from '../../src/pool/allocator.ts';
import { PoolRemoval } from '../../src/pool/removal.ts';
import { GatedKV, until } from '../helpers/gated-kv.ts';

/** A memory KV whose next transactions can be made to lose a race, fail unavailable, or wait at a gate. */
class TestKV extends GatedKV {
  conflictNext = 0;
  unavailableNext = 0;
  override async txn(c: readonly KVCompare[], o: readonly KVOp[]): Promise<KVTxnResult> {
    await this.gate();
    if (this.unavailableNext > 0) {
      this.unavailableNext--;
      this.failNext = 1;
    } else if (this.conflictNext > 0) {
      this.conflictNext--;
      this.stats.txns++;
      return { succeeded: false, revision: String(this.revision) };
    }
    return this.plainTxn(c, o);
  }
}

/** The sample lines of the series `name` (and of its `_bucket`/`_sum`/`_count` when `histogram`). */
function series(text: string, name: string): string[] {
  return text.split('\n').filter((l) => !l.startsWith('#') && (l.startsWith(`${name}{`) || l.startsWith(`${name} `)));
}

/** Allocatable addresses of the /28 block `key` (`10.83.0.32-28`) of 10.83.0.0/24: .1 is the gateway, .0 and .255 are not in the range. */
function cap28(key: string): number {
  const base = Number((key.split('-')[0] as string).split('.')[3]);
  return base === 0 ? 14 : base === 240 ? 15 : 16;
}

const conf = loadIPAMConfig(
  JSON.stringify({ cniVersion: '1.0.0', name: 'net1', ipam: { ranges: [[{ subnet: '10.83.0.0/24' }]], pool: { name: 'p1', etcd: { endpoints: ['http://127.0.0.1:1'] }, blockSize: 28 } } }),
  undefined,
);
const L = 'pool="p1",node="node-a"';

describe('pool metrics from PoolSessions (memory KV)', () => {
  it('counts requests by command and result, transactions by outcome, and batch sizes, exactly', async () => {
    const kv = new TestKV();
    const m = new DaemonMetrics({ monotonicMs: () => 0 });
    const s = new PoolSessions({ NODE_NAME: 'node-a' }, () => kv, () => () => undefined, m.pools.observer);
    try {
      await s.add(conf, { containerId: 'c1', ifname: 'eth0' }); // claims a block and allocates: one transaction
      kv.conflictNext = 1; // the next transaction loses a race: re-read, sent again, committed
      await s.add(conf, { containerId: 'c2', ifname: 'eth0' });
      kv.unavailableNext = 1; // etcd unreachable: the ADD's transaction fails, and so does the ADD (code 11)
      const failed = await s.add(conf, { containerId: 'c3', ifname: 'eth0' }).then(() => null, (e: unknown) => e);
      assert.ok(isAppError(failed) && failed.cniCode === 11, String(failed));
      // A batch: c4 in flight at the gate, c5 and c6 queue behind it and go together.
      kv.hold = true;
      const p4 = s.add(conf, { containerId: 'c4', ifname: 'eth0' });
      await until(() => kv.waiting === 1, 'c4 in flight');
      const p56 = [s.add(conf, { containerId: 'c5', ifname: 'eth0' }), s.add(conf, { containerId: 'c6', ifname: 'eth0' })];
      kv.release();
      await Promise.all([p4, ...p56]);
      assert.deepEqual(await s.find(conf, { containerId: 'c2', ifname: 'eth0' }).then((r) => r?.length), 1);
      assert.equal((await s.del(conf, { containerId: 'c1', ifname: 'eth0' })).length, 1);
      const text = await m.text();
      assert.deepEqual(series(text, 'ipwarden_pool_requests_total'), [
        `ipwarden_pool_requests_total{${L},command="ADD",result="ok"} 5`,
        `ipwarden_pool_requests_total{${L},command="ADD",result="11"} 1`,
        `ipwarden_pool_requests_total{${L},command="CHECK",result="ok"} 1`,
        `ipwarden_pool_requests_total{${L},command="DEL",result="ok"} 1`,
      ]);
      // Committed: the pool's meta (created by its first ADD), c1, c2, the batch c4, the batch c5+c6, the DEL.
      const txns = series(text, 'ipwarden_pool_etcd_transactions_total');
      assert.deepEqual(txns, [
        `ipwarden_pool_etcd_transactions_total{${L},outcome="committed"} 6`,
        `ipwarden_pool_etcd_transactions_total{${L},outcome="conflict"} 1`,
        `ipwarden_pool_etcd_transactions_total{${L},outcome="unavailable"} 1`,
      ]);
      // The heartbeat's two (the node's settings key, then its put) and the node's last-seen record
      // (seen/<node>, on its first beat) are not the allocator's: every other committed
      // transaction is counted.
      assert.equal(kv.stats.txnsSucceeded, 6 + 3);
      // Batches: c1, c2, c3, c4, c5+c6, and the DEL of c1 (a DEL goes through the same batcher).
      assert.deepEqual(series(text, 'ipwarden_pool_batch_size_count'), [`ipwarden_pool_batch_size_count{${L}} 6`]);
      assert.deepEqual(series(text, 'ipwarden_pool_batch_size_sum'), [`ipwarden_pool_batch_size_sum{${L}} 7`]);
      assert.deepEqual(series(text, 'ipwarden_pool_batch_size_bucket').slice(0, 2), [`ipwarden_pool_batch_size_bucket{le="1",${L}} 5`, `ipwarden_pool_batch_size_bucket{le="2",${L}} 6`]);
      assert.deepEqual(series(text, 'ipwarden_pool_request_duration_seconds_count'), [
        `ipwarden_pool_request_duration_seconds_count{${L},command="ADD"} 6`,
        `ipwarden_pool_request_duration_seconds_count{${L},command="CHECK"} 1`,
        `ipwarden_pool_request_duration_seconds_count{${L},command="DEL"} 1`,
      ]);
    } finally {
      await s.close();
    }
  });

  it('the gauges are read on a scrape at most once per cache age; a failed read leaves none and is counted', async () => {
    const kv = new TestKV();
    let now = 1_000_000;
    const m = new DaemonMetrics({ monotonicMs: () => now });
    const s = new PoolSessions({ NODE_NAME: 'node-a' }, () => kv, () => () => undefined, m.pools.observer);
    const b = new PoolSessions({ NODE_NAME: 'node-b' }, () => kv, () => () => undefined);
    m.pools.watch(() => s.sample(), 1); // below the floor: 10 s
    try {
      for (const id of ['a1', 'a2']) await s.add(conf, { containerId: id, ifname: 'eth0' });
      await b.add(conf, { containerId: 'b1', ifname: 'eth0' });
      const gauges = (text: string) =>
        ['node_blocks', 'node_addresses', 'claimed_blocks', 'unclaimed_blocks', 'node_alive'].flatMap((g) => series(text, `ipwarden_pool_${g}`));
      // 10.83.0.0/24: 253 allocatable addresses (.2–.254: .1 is the gateway), 3 held.
      const expected = [
        `ipwarden_pool_node_blocks{${L}} 1`,
        `ipwarden_pool_node_addresses{${L}} 2`,
        `ipwarden_pool_claimed_blocks{${L}} 2`,
        `ipwarden_pool_unclaimed_blocks{${L}} 14`, // a /24 in /28 blocks: 16
        `ipwarden_pool_node_alive{${L}} 1`,
      ];
      assert.deepEqual(gauges(await m.text()), expected);
      assert.equal(m.pools.reads, 1);
      await s.add(conf, { containerId: 'a3', ifname: 'eth0' });
      now += (POOL_GAUGES_MIN_AGE_SECONDS - 1) * 1000;
      assert.deepEqual(gauges(await m.text()), expected, 'within the cache age a scrape reads nothing');
      assert.equal(m.pools.reads, 1);
      now += 1000;
      assert.deepEqual(gauges(await m.text()), expected.map((l) => l.replace('node_addresses{pool="p1",node="node-a"} 2', 'node_addresses{pool="p1",node="node-a"} 3').replace('} 250', '} 249')));
      assert.equal(m.pools.reads, 2);
      // Two scrapes at once share one read.
      now += POOL_GAUGES_MIN_AGE_SECONDS * 1000;
      await Promise.all([m.text(), m.text()]);
      assert.equal(m.pools.reads, 3);
      // etcd unreachable: no gauge (absent = unknown), one read error.
      now += POOL_GAUGES_MIN_AGE_SECONDS * 1000;
      kv.failNext = 1;
      const text = await m.text();
      assert.deepEqual(gauges(text), []);
      assert.deepEqual(series(text, 'ipwarden_pool_status_read_errors_total'), [`ipwarden_pool_status_read_errors_total{${L}} 1`]);
    } finally {
      await s.close();
      await b.close();
    }
  });

  it("a node's sample reads its own blocks' values and only the keys of the pool's other blocks (review B5: never every block value)", async () => {
    const kv = new MemoryKV();
    const a = new PoolSessions({ NODE_NAME: 'node-a' }, () => kv, () => () => undefined);
    const b = new PoolSessions({ NODE_NAME: 'node-b' }, () => kv, () => () => undefined);
    try {
      await a.add(conf, { containerId: 'a1', ifname: 'eth0' });
      // node-b fills 3 blocks of /28 (14–16 addresses each).
      for (let i = 0; i < 40; i++) await b.add(conf, { containerId: `b${i}`, ifname: 'eth0' });
      const valueReads: string[] = [];
      const spy = Object.create(kv) as MemoryKV;
      spy.get = async (k: string) => (valueReads.push(k), kv.get(k));
      spy.list = async (p: string, o?: { keysOnly?: boolean }) => (o?.keysOnly === true ? kv.list(p, o) : (valueReads.push(`${p}*`), kv.list(p, o)));
      const sample = await poolNodeSample(spy, '/ipwarden', 'p1', 'node-a');
      const aBlock = Object.keys(kv.dump()).find((k) => k.startsWith('/ipwarden/pools/p1/nodes/node-a/blocks/'))?.split('/').pop();
      // 253 addresses (.2–.254); node-b's three blocks are not node-a's to allocate from.
      const bCaps = Object.keys(kv.dump()).filter((k) => k.startsWith('/ipwarden/pools/p1/nodes/node-b/blocks/')).map((k) => cap28(k.split('/').pop() as string));
      assert.equal(bCaps.length, 3);
      assert.deepEqual(sample, { blocks: 1, held: 1, claimedBlocks: 4, unclaimedBlocks: 12, alive: true, corruptBlocks: 0, freeAddresses: [253 - bCaps.reduce((x, y) => x + y, 0) - 1], pendingReleaseBlocks: 0 });
      assert.deepEqual(valueReads, ['/ipwarden/pools/p1/meta', '/ipwarden/pools/p1/alive/node-a', `/ipwarden/pools/p1/blocks/${aBlock}`]);
    } finally {
      await a.close();
      await b.close();
    }
  });

  it("ipwarden_pool_free_addresses per range set (unclaimed blocks + the node's own free) and ipwarden_pool_pending_release_blocks, exact; with the unclaimed part counted once they add up to pool status's free", async () => {
    const kv = new MemoryKV();
    // Range set 0: 10.83.0.0/24 (253 addresses, 16 blocks of /28); range set 1: 10.84.0.0/27 (29 addresses: .2–.15, .16–.30).
    const two = loadIPAMConfig(JSON.stringify({ cniVersion: '1.0.0', name: 'net2', ipam: { ranges: [[{ subnet: '10.83.0.0/24' }], [{ subnet: '10.84.0.0/27' }]] } }), undefined);
    const allocator = (node: string) => new PoolAllocator({ kv, pool: 'p1', prefix: '/ipwarden', node, network: 'net2', rangeSets: two.rangeSets, sizes: { blockSize4: 28, blockSize6: 122 }, now: () => 1000 });
    const add = async (a: PoolAllocator, id: string) => {
      const [r] = await a.add([{ containerId: id, ifname: 'eth0' }]);
      assert.ok(Array.isArray(r), String(r));
    };
    await add(allocator('node-a'), 'a1');
    // node-b: 20 addresses in each range set; in range set 1 it fills the other block and borrows the rest in node-a's.
    for (let i = 0; i < 20; i++) await add(allocator('node-b'), `b${i}`);
    const dump = kv.dump();
    const blocksOf = (node: string, set: string) => Object.keys(dump).filter((k) => k.startsWith(`/ipwarden/pools/p1/nodes/${node}/blocks/${set}`)).map((k) => k.split('/').pop() as string);
    const a0 = blocksOf('node-a', '10.83.');
    const b0 = blocksOf('node-b', '10.83.');
    assert.equal(a0.length, 1);
    assert.equal(b0.length, 2);
    assert.equal(blocksOf('node-a', '10.84.').length + blocksOf('node-b', '10.84.').length, 2, 'range set 1: both blocks claimed');
    const sum = (l: string[]) => l.map(cap28).reduce((x, y) => x + y, 0);
    const u0 = 253 - sum(a0) - sum(b0);
    const a = await poolNodeSample(kv, '/ipwarden', 'p1', 'node-a');
    const b = await poolNodeSample(kv, '/ipwarden', 'p1', 'node-b');
    // Range set 1: nothing unclaimed; 29 − 21 entries = 8 free, all in node-a's block (the borrowers' entries count against it).
    assert.deepEqual(a.freeAddresses, [u0 + sum(a0) - 1, 8]);
    assert.deepEqual(b.freeAddresses, [u0 + sum(b0) - 20, 0]);
    assert.equal(a.pendingReleaseBlocks, 0);
    const st = await poolStatus(kv, '/ipwarden', 'p1');
    assert.deepEqual(st.rangeSets.map((r) => r.free), [String(253 - 21), '8']);
    assert.deepEqual([0, 1].map((i) => (a.freeAddresses[i] as number) + (b.freeAddresses[i] as number) - [u0, 0][i]!), [253 - 21, 8]);
    // Through the metrics: one series per range set.
    const m = new DaemonMetrics({ monotonicMs: () => 0 });
    m.pools.set([{ pool: 'p1', node: 'node-a', ...a }]);
    const text = await m.text();
    assert.deepEqual(series(text, 'ipwarden_pool_free_addresses'), [`ipwarden_pool_free_addresses{${L},range_set="0"} ${u0 + sum(a0) - 1}`, `ipwarden_pool_free_addresses{${L},range_set="1"} 8`]);
    assert.deepEqual(series(text, 'ipwarden_pool_pending_release_blocks'), [`ipwarden_pool_pending_release_blocks{${L}} 0`]);
    // remove-node step 1 for node-b: its three blocks go pendingRelease. node-a counts them (the
    // removal marker leads it to them), node-b counts its own, whose free addresses are no longer counted.
    assert.equal((await new PoolRemoval({ kv, pool: 'p1', prefix: '/ipwarden', now: () => 1000 }).mark('node-b', { force: true })).length, 3);
    const a2 = await poolNodeSample(kv, '/ipwarden', 'p1', 'node-a');
    const b2 = await poolNodeSample(kv, '/ipwarden', 'p1', 'node-b');
    assert.equal(a2.pendingReleaseBlocks, 3);
    assert.equal(b2.pendingReleaseBlocks, 3);
    assert.deepEqual(a2.freeAddresses, a.freeAddresses);
    assert.deepEqual(b2.freeAddresses, [u0, 0]);
    // A veto (node-b is back) writes them owned again: 0 everywhere.
    await allocator('node-b').vetoIfMarked();
    assert.equal((await poolNodeSample(kv, '/ipwarden', 'p1', 'node-a')).pendingReleaseBlocks, 0);
    assert.deepEqual(await poolNodeSample(kv, '/ipwarden', 'p1', 'node-b'), b);
  });

  it("a block of the node that cannot be read: the gauges stay (it is counted in ipwarden_pool_node_corrupt_blocks), the ADD claims another block, one log line", async () => {
    const kv = new TestKV();
    const m = new DaemonMetrics({ monotonicMs: () => 0 });
    const lines: Array<[string, Record<string, unknown>, string]> = [];
    const s = new PoolSessions({ NODE_NAME: 'node-a' }, () => kv, () => () => undefined, m.pools.observer, { log: (level, fields, msg) => void lines.push([level, fields, msg]) });
    m.pools.watch(() => s.sample());
    try {
      await s.add(conf, { containerId: 'a1', ifname: 'eth0' });
      const mine = Object.keys(kv.dump()).find((k) => k.startsWith('/ipwarden/pools/p1/nodes/node-a/blocks/')) as string;
      const bk = `/ipwarden/pools/p1/blocks/${mine.split('/').pop() as string}`;
      kv.plant(bk, '{"v":1}');
      await s.add(conf, { containerId: 'a2', ifname: 'eth0' });
      await s.add(conf, { containerId: 'a3', ifname: 'eth0' });
      const text = await m.text();
      const gauges = ['node_blocks', 'node_addresses', 'claimed_blocks', 'unclaimed_blocks', 'node_alive', 'node_corrupt_blocks'].flatMap((g) => series(text, `ipwarden_pool_${g}`));
      assert.deepEqual(gauges, [
        `ipwarden_pool_node_blocks{${L}} 1`,
        `ipwarden_pool_node_addresses{${L}} 2`,
        `ipwarden_pool_claimed_blocks{${L}} 2`,
        `ipwarden_pool_unclaimed_blocks{${L}} 14`,
        `ipwarden_pool_node_alive{${L}} 1`,
        `ipwarden_pool_node_corrupt_blocks{${L}} 1`,
      ]);
      assert.deepEqual(series(text, 'ipwarden_pool_status_read_errors_total'), []);
      // One warn line (a2 skipped it; a3 built on the cached blocks, which hold only readable ones; the same line is logged at most once per 10 minutes anyway).
      assert.deepEqual(lines.filter((l) => l[2] === 'pool key cannot be read: left for an operator'), [
        ['warn', { pool: 'p1', node: 'node-a', op: 'ADD', key: bk, error: '"cidr" must be "' + (mine.split('/').pop() as string).replace(/-(\d+)$/, '/$1') + '", got null', action: 'block skipped: never allocated from, left for an operator' }, 'pool key cannot be read: left for an operator'],
      ]);
    } finally {
      await s.close();
    }
  });

  it('a pool announced but never used has no gauges and no read error', async () => {
    const kv = new TestKV();
    const m = new DaemonMetrics({ monotonicMs: () => 0 });
    const s = new PoolSessions({ NODE_NAME: 'node-a' }, () => kv, () => () => undefined, m.pools.observer);
    m.pools.watch(() => s.sample());
    try {
      s.announce(conf);
      assert.deepEqual(await s.sample(), []);
      const text = await m.text();
      assert.deepEqual(series(text, 'ipwarden_pool_node_blocks'), []);
      assert.deepEqual(series(text, 'ipwarden_pool_status_read_errors_total'), []);
    } finally {
      await s.close();
    }
  });

  it('an observer that throws never fails a request; observeTxns reports each outcome', async () => {
    const kv = new TestKV();
    const s = new PoolSessions({ NODE_NAME: 'node-a' }, () => kv, () => () => undefined, {
      request: () => {
        throw new Error('observer bug');
      },
      txn: () => {
        throw new Error('observer bug');
      },
      batch: () => {
        throw new Error('observer bug');
      },
    });
    try {
      assert.equal((await s.add(conf, { containerId: 'c1', ifname: 'eth0' })).length, 1);
    } finally {
      await s.close();
    }
    const seen: PoolTxnEvent['outcome'][] = [];
    const inner = new TestKV();
    const o = observeTxns(inner, { pool: 'p', node: 'n' }, { txn: (e) => seen.push(e.outcome) });
    await o.txn([], [{ put: '/k', value: 'v' }]);
    await o.txn([{ key: '/k', absent: true }], [{ put: '/k', value: 'w' }]);
    inner.failNext = 1;
    await assert.rejects(o.txn([], []), (e: unknown) => isAppError(e, 'STORE_UNAVAILABLE'));
    await assert.rejects(o.txn([], Array.from({ length: 200 }, (_, i) => ({ put: `/k${i}`, value: '' }))), (e: unknown) => isAppError(e, 'INTERNAL'));
    assert.deepEqual(seen, ['committed', 'conflict', 'unavailable', 'error']);
    assert.equal(observeTxns(inner, { pool: 'p', node: 'n' }, {}), inner, 'no txn member: the KV itself');
  });

  it('a scrape does not wait for a read that hangs (etcd unreachable): it answers, and a later scrape gets the read\'s values', async () => {
    const m = new DaemonMetrics({ monotonicMs: () => 0 });
    let finish: (v: PoolSample[]) => void = () => undefined;
    let calls = 0;
    m.pools.watch(() => {
      calls++;
      return new Promise<PoolSample[]>((r) => (finish = r));
    });
    const text = await m.text(); // bounded by POOL_SCRAPE_WAIT_MS: the read is still running
    assert.deepEqual(series(text, 'ipwarden_pool_node_blocks'), []);
    assert.equal(calls, 1);
    await m.text();
    assert.equal(calls, 1, 'the running read is joined, not repeated');
    finish([{ pool: 'p1', node: 'node-a', blocks: 2, held: 3, claimedBlocks: 4, unclaimedBlocks: 7, alive: false, corruptBlocks: 0, freeAddresses: [40, 7], pendingReleaseBlocks: 1 }]);
    await until(() => m.pools.reads === 1, 'one read');
    const later = await m.text();
    assert.deepEqual(series(later, 'ipwarden_pool_node_blocks'), [`ipwarden_pool_node_blocks{${L}} 2`]);
    assert.deepEqual(series(later, 'ipwarden_pool_node_alive'), [`ipwarden_pool_node_alive{${L}} 0`]);
    assert.deepEqual(series(later, 'ipwarden_pool_free_addresses'), [`ipwarden_pool_free_addresses{${L},range_set="0"} 40`, `ipwarden_pool_free_addresses{${L},range_set="1"} 7`]);
    assert.deepEqual(series(later, 'ipwarden_pool_pending_release_blocks'), [`ipwarden_pool_pending_release_blocks{${L}} 1`]);
    assert.equal(calls, 1, 'within the cache age: no new read');
  });
});

/** A memory KV that can be cut off (every call fails as unavailable while `cut`). */
class CutKV extends MemoryKV {
  cut = false;
  #check(): void {
    if (this.cut) throw new AppError('STORE_UNAVAILABLE', 'etcd unreachable (test partition)');
  }
  override async get(key: string): Promise<KVEntry | null> {
    this.#check();
    return super.get(key);
  }
  override async list(prefix: string, opts?: { readonly keysOnly?: boolean }): Promise<KVEntry[]> {
    this.#check();
    return super.list(prefix, opts);
  }
  override async getMany(keys: readonly string[]): Promise<Array<KVEntry | null>> {
    this.#check();
    return super.getMany(keys);
  }
  override async txn(c: readonly KVCompare[], o: readonly KVOp[]): Promise<KVTxnResult> {
    this.#check();
    return super.txn(c, o);
  }
  override async grantLease(ttl: number): Promise<string> {
    this.#check();
    return super.grantLease(ttl);
  }
  override async keepAlive(id: string): Promise<number> {
    this.#check();
    return super.keepAlive(id);
  }
}

describe('pool metrics of offline allocation (memory KV, injected monotonic clock)', () => {
  const dirs: string[] = [];
  after(() => {
    for (const d of dirs) rmSync(d, { recursive: true, force: true });
  });
  const offConf = loadIPAMConfig(
    JSON.stringify({ cniVersion: '1.0.0', name: 'net1', ipam: { ranges: [[{ subnet: '10.83.0.0/24' }]], pool: { name: 'p1', etcd: { endpoints: ['http://127.0.0.1:1'] }, blockSize: 28, offline: { reserve: 2, seconds: 30 } } } }),
    undefined,
  );
  const offline = (text: string) =>
    ['ipwarden_pool_offline_operations_total', 'ipwarden_pool_reserve_addresses', 'ipwarden_pool_journal_entries', 'ipwarden_pool_contact_age_seconds'].flatMap((n) => series(text, n));

  it('operations by kind, the reserve left, journal entries pending and stuck, the contact age: exact, and no etcd read on a scrape', async () => {
    const kv = new CutKV();
    const journal = mkdtempSync(join(tmpdir(), 'ipwarden-polish-metrics-'));
    dirs.push(journal);
    let t = 1_000;
    const logs: string[] = [];
    const m = new DaemonMetrics({ monotonicMs: () => t });
    const s = new PoolSessions({ NODE_NAME: 'node-a' }, () => kv, () => () => undefined, m.pools.observer, { clock: () => t, journalRoot: journal, log: (_l, _f, msg) => void logs.push(msg) });
    m.pools.watchOffline(() => s.offlineStats());
    try {
      assert.deepEqual(offline(await m.text()), [], 'no pool with ipam.pool.offline yet: no series');
      s.announce(offConf);
      await s.maintainOffline();
      assert.deepEqual(offline(await m.text()), [
        `ipwarden_pool_reserve_addresses{${L}} 2`,
        `ipwarden_pool_journal_entries{${L},state="pending"} 0`,
        `ipwarden_pool_journal_entries{${L},state="stuck"} 0`,
        `ipwarden_pool_contact_age_seconds{${L}} 0`,
      ]);
      // Cut off, 5 s later: an ADD answered from the reserve.
      kv.cut = true;
      t += 5_000;
      const reads = kv.stats.reads;
      const r = await s.add(offConf, { containerId: 'off1', ifname: 'eth0' });
      assert.equal(r.length, 1);
      assert.deepEqual(offline(await m.text()), [
        `ipwarden_pool_offline_operations_total{${L},kind="add"} 1`,
        `ipwarden_pool_reserve_addresses{${L}} 1`,
        `ipwarden_pool_journal_entries{${L},state="pending"} 1`,
        `ipwarden_pool_journal_entries{${L},state="stuck"} 0`,
        `ipwarden_pool_contact_age_seconds{${L}} 5`,
      ]);
      assert.equal(kv.stats.reads, reads, 'a scrape of the offline series reads nothing from etcd');
      // Back: the journal entry is synced and the reserve refilled.
      kv.cut = false;
      t += 1_000;
      await s.maintainOffline();
      assert.deepEqual(offline(await m.text()), [
        `ipwarden_pool_offline_operations_total{${L},kind="add"} 1`,
        `ipwarden_pool_offline_operations_total{${L},kind="synced"} 1`,
        `ipwarden_pool_reserve_addresses{${L}} 2`,
        `ipwarden_pool_journal_entries{${L},state="pending"} 0`,
        `ipwarden_pool_journal_entries{${L},state="stuck"} 0`,
        `ipwarden_pool_contact_age_seconds{${L}} 0`,
      ]);
      assert.ok(logs.includes('offline ADD from the reserve (etcd unreachable)') && logs.includes('offline journal entry synced'), logs.join(' | '));
    } finally {
      await s.close();
    }
    // After close the source still answers (its last state); a source that throws keeps the gauges.
    m.pools.watchOffline(() => {
      throw new Error('closed');
    });
    assert.deepEqual(series(await m.text(), 'ipwarden_pool_reserve_addresses'), [`ipwarden_pool_reserve_addresses{${L}} 2`]);
  });
});
