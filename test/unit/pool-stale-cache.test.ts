/**
 * The block cache of a long-lived allocator (the daemon's) must never be written back over other
 * content (docs/cluster.md "Transactions", "Backup and restore"), on the memory KV, every value
 * exact:
 * - after an etcd restored from a snapshot, new writes reuse revisions: a cached block whose
 *   revision matches a block of other content is not built on (the write compares the stored
 *   value too) and not reused by a read (the shortcut needs equal text);
 * - a round that writes nothing caches the blocks as read, never its modified working copies
 *   (a veto's pendingRelease → owned), so a later veto still writes them;
 * - the value compare itself: memory KV and the Txn driver.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { loadIPAMConfig } from '../../src/ipam/config.ts';
import { BlockCache, PoolAllocator } from '../../src/pool/allocator.ts';
import { podAddress, reReserve, type PodAddress } from '../../src/pool/rereserve.ts';
import { runTxn } from '../../src/pool/txn.ts';
import { MemoryKV } from '../../src/store/memory/memory-kv.ts';
import type { KV, KVCompare, KVOp } from '../../src/store/kv.ts';

// Two /28 blocks: 10.86.0.0-28 (gateway .1: .2–.15) and 10.86.0.16-28 (.16–.30).
const conf = loadIPAMConfig(JSON.stringify({ cniVersion: '1.0.0', name: 'net1', ipam: { ranges: [[{ subnet: '10.86.0.0/27' }]] } }), undefined);
const SIZES = { blockSize4: 28, blockSize6: 122 };
const KEYS = { prefix: '/ipwarden', pool: 'wp' };
const B = '/ipwarden/pools/wp';
const BK = `${B}/blocks/10.86.0.16-28`;

/** A KV over a MemoryKV that can be swapped (an etcd restored under a running client), with a generation. */
class RestorableKV {
  cur = new MemoryKV();
  generation = 0;
  /** Successful transactions so far, in order (what a snapshot holds is a prefix of them). */
  readonly log: Array<[readonly KVCompare[], readonly KVOp[]]> = [];
  readonly kv: KV = {
    description: 'restorable',
    stats: this.cur.stats,
    get: (k) => this.cur.get(k),
    getMany: (ks) => this.cur.getMany(ks),
    list: (p, o) => this.cur.list(p, o),
    txn: async (c, o) => {
      const r = await this.cur.txn(c, o);
      if (r.succeeded) this.log.push([c, o]);
      return r;
    },
    close: () => this.cur.close(),
  };
  /** `etcdctl snapshot restore` of the snapshot taken after `n` transactions: same keys, same revisions. */
  restore(n: number): void {
    const m = new MemoryKV();
    for (const [c, o] of this.log.slice(0, n)) m.apply(c, o);
    this.cur = m;
  }
}

const ipOf = (r: unknown): string => {
  if (!Array.isArray(r)) throw r;
  return `10.86.0.${Number((r[0] as { ip: { value: bigint } }).ip.value & 255n)}`;
};

describe('pool block cache against other content', () => {
  it('after a restore reusing revisions, an ADD on the cached block fails its value compare and keeps the restored allocation and the want', async () => {
    const r = new RestorableKV();
    const n2 = new PoolAllocator({ kv: r.kv, ...KEYS, node: 'n2', network: 'net1', rangeSets: conf.rangeSets, sizes: SIZES, now: () => 1000, host: 'h-n2' });
    const add = async (id: string): Promise<string> => ipOf((await n2.add([{ containerId: id, ifname: 'eth0' }]))[0]);
    assert.equal(await add('gone'), '10.86.0.16');
    const snap = r.log.length; // the backup
    assert.equal(r.cur.revision, 3);
    assert.equal(await add('c2'), '10.86.0.17');
    assert.deepEqual(await n2.del({ containerId: 'gone', ifname: 'eth0' }), ['10.86.0.16']);
    assert.equal((await r.cur.get(BK))?.modRevision, '5', 'n2 caches the block at revision 5');
    // Restored (n2 not restarted); another writer's key brings the revision to 4.
    r.restore(snap);
    assert.equal(r.cur.revision, 3);
    await r.cur.txn([], [{ put: '/other/filler', value: '3' }]);
    // n1's pass: its READY sandbox sbS uses 10.86.0.16, which the restored pool gives to `gone`.
    const x = podAddress('10.86.0.16', conf.rangeSets, SIZES) as PodAddress;
    assert.deepEqual(await reReserve({ kv: r.kv, ...KEYS, node: 'n1', host: 'h-n1', network: 'net1', now: () => 2000 }, 'sbS', x), {
      state: 'conflict',
      holder: 'container gone/eth0 of node n2 (seq 1)',
      wanted: 'written',
    });
    const wanted = await r.cur.get(BK);
    assert.equal(wanted?.modRevision, '5', 'the same revision n2 cached, other content');
    // n2's ADD: the cached block's revision matches; its value does not — decided again on fresh reads.
    assert.equal(await add('c3'), '10.86.0.17');
    assert.deepEqual(JSON.parse((await r.cur.get(BK))?.value ?? 'null'), {
      v: 1,
      cidr: '10.86.0.16/28',
      rangeSet: 0,
      node: 'n2',
      state: 'owned',
      seq: 2,
      next: 2,
      allocs: { '0': { id: 'gone', ifname: 'eth0', node: 'n2', seq: 1, at: 1000 }, '1': { id: 'c3', ifname: 'eth0', node: 'n2', seq: 2, at: 1000 } },
      wanted: { '0': { sandbox: 'sbS', node: 'n1', at: 2000 } },
    });
    // The wanted address is never handed out: the block's 13 other addresses, then the other block.
    const got: string[] = [];
    for (let i = 4; i < 19; i++) got.push(await add(`c${i}`));
    assert.deepEqual(got, [...Array.from({ length: 13 }, (_, k) => `10.86.0.${18 + k}`), '10.86.0.2', '10.86.0.3']);
  });

  it('a DEL on the cached block after a restore releases by the stored content, not the cached one', async () => {
    const r = new RestorableKV();
    const n2 = new PoolAllocator({ kv: r.kv, ...KEYS, node: 'n2', network: 'net1', rangeSets: conf.rangeSets, sizes: SIZES, now: () => 1000, host: 'h-n2' });
    assert.equal(ipOf((await n2.add([{ containerId: 'a', ifname: 'eth0' }]))[0]), '10.86.0.16');
    const snap = r.log.length;
    assert.equal(ipOf((await n2.add([{ containerId: 'b', ifname: 'eth0' }]))[0]), '10.86.0.17');
    r.restore(snap);
    // Another writer brings the block to revision 3 with other content than n2's cache (a at .16, b at .17).
    const e = await r.cur.get(BK);
    const v = JSON.parse(e?.value ?? 'null') as { allocs: Record<string, unknown>; seq: number };
    v.allocs['5'] = { id: 'z', ifname: 'eth0', node: 'n2', seq: 2, at: 1000 };
    v.seq = 2;
    assert.equal((await r.cur.txn([{ key: BK, modRevision: e?.modRevision ?? '' }], [{ put: BK, value: JSON.stringify(v) }])).revision, '4');
    await r.cur.txn([], [{ put: '/other/filler', value: '4' }]);
    // n2's cache holds the block at revision 4 too (its 'b' write); the stored one holds 'a' and 'z'.
    assert.deepEqual(await n2.del({ containerId: 'a', ifname: 'eth0' }), ['10.86.0.16']);
    assert.deepEqual(Object.keys((JSON.parse((await r.cur.get(BK))?.value ?? 'null') as { allocs: object }).allocs), ['5'], "z's allocation kept");
  });

  it('a DEL built on a cached handle compares its value: other text at the cached revision fails the first attempt', async () => {
    const r = new RestorableKV();
    const n2 = new PoolAllocator({ kv: r.kv, ...KEYS, node: 'n2', network: 'net1', rangeSets: conf.rangeSets, sizes: SIZES, now: () => 1000, host: 'h-n2' });
    const snap0 = r.log.length;
    assert.equal(ipOf((await n2.add([{ containerId: 'a', ifname: 'eth0' }]))[0]), '10.86.0.16');
    const hk = `${B}/handles/a/eth0`;
    const cachedRev = (await r.cur.get(hk))?.modRevision;
    // Restored to before a's ADD; another process of n2 (host h-other, no shared cache) makes the
    // same ADD: the same block text, the handle at the same revision with other text.
    r.restore(snap0);
    const other = new PoolAllocator({ kv: r.kv, ...KEYS, node: 'n2', network: 'net1', rangeSets: conf.rangeSets, sizes: SIZES, now: () => 1000, host: 'h-other' });
    assert.equal(ipOf((await other.add([{ containerId: 'a', ifname: 'eth0' }]))[0]), '10.86.0.16');
    assert.equal((await r.cur.get(hk))?.modRevision, cachedRev);
    const sent: KVCompare[][] = [];
    r.cur.beforeTxn = (c) => void sent.push([...c]);
    // A daemon's round of one DEL (the batcher's path: the handle taken from the cache).
    assert.deepEqual((await n2.batch([], [{ containerId: 'a', ifname: 'eth0' }])).dels, [['10.86.0.16']]);
    assert.equal(sent.length, 2, 'the first attempt (cached handle) lost its value compare, the second committed');
    assert.deepEqual(sent[0]?.filter((c) => c.key === hk && 'value' in c).length, 1);
    assert.equal(await r.cur.get(hk), null);
  });

  it('drops the cache when the KV generation changes (etcd revision went backwards)', async () => {
    const r = new RestorableKV();
    const cache = new BlockCache();
    const n2 = new PoolAllocator({ kv: r.kv as KV, ...KEYS, node: 'n2', network: 'net1', rangeSets: conf.rangeSets, sizes: SIZES, now: () => 1000, host: 'h-n2', cache });
    (r.kv as { generation?: number }).generation = 0;
    assert.equal(ipOf((await n2.add([{ containerId: 'a', ifname: 'eth0' }]))[0]), '10.86.0.16');
    assert.deepEqual([...(cache.blocks?.keys() ?? [])], ['10.86.0.16-28']);
    (r.kv as { generation?: number }).generation = 1;
    const reads = r.cur.stats.reads;
    assert.equal(ipOf((await n2.add([{ containerId: 'b', ifname: 'eth0' }]))[0]), '10.86.0.17');
    // Fresh reads: the handle, the affinity list, the block (no cached fast path).
    assert.equal(r.cur.stats.reads - reads, 3);
    assert.equal(cache.generation, 1);
    assert.deepEqual([...(cache.blocks?.keys() ?? [])], ['10.86.0.16-28']);
  });

  it('a full pool: the failed ADD caches its blocks as read (pendingRelease), so the veto writes them owned', async () => {
    const kv = new MemoryKV();
    const b = new PoolAllocator({ kv, ...KEYS, node: 'n2', network: 'net1', rangeSets: conf.rangeSets, sizes: SIZES, now: () => 1000, host: 'h-n2' });
    let n = 0;
    for (;;) {
      const [r] = await b.add([{ containerId: `c${n++}`, ifname: 'eth0' }]);
      if (!Array.isArray(r)) break;
    }
    assert.equal(n - 1, 29, 'addresses allocated: the pool is full');
    // remove-node n2 step 1 (as PoolRemoval.mark writes it): marker, then every block pendingRelease at its revision.
    await kv.txn([], [{ put: `${B}/removing/n2`, value: JSON.stringify({ v: 1, node: 'n2', at: 1 }) }]);
    for (const e of await kv.list(`${B}/blocks/`)) {
      const v = JSON.parse(e.value) as { state: string };
      v.state = 'pendingRelease';
      await kv.txn([{ key: e.key, modRevision: e.modRevision }], [{ put: e.key, value: JSON.stringify(v) }]);
    }
    const [r] = await b.add([{ containerId: 'late', ifname: 'eth0' }]);
    assert.ok(r instanceof Error);
    assert.equal((r as Error & { code?: string }).code, 'IPAM_RANGE_EXHAUSTED');
    assert.equal(await kv.get(`${B}/removing/n2`), null, 'the veto deleted the marker');
    const states = (await kv.list(`${B}/blocks/`)).map((e) => [e.key, (JSON.parse(e.value) as { state: string }).state]);
    assert.deepEqual(states, [
      [`${B}/blocks/10.86.0.0-28`, 'owned'],
      [`${B}/blocks/10.86.0.16-28`, 'owned'],
    ]);
  });

  it('memory KV and Txn: a value compare holds on equal text only, fails on a missing key, and joins the revision compare', async () => {
    const kv = new MemoryKV();
    await kv.txn([], [{ put: 'k', value: 'v1' }]);
    assert.deepEqual(await kv.txn([{ key: 'k', value: 'v2' }], [{ put: 'k', value: 'x' }]), { succeeded: false, revision: '2' });
    assert.deepEqual(await kv.txn([{ key: 'nope', value: '' }], [{ put: 'k', value: 'x' }]), { succeeded: false, revision: '2' });
    assert.deepEqual(await kv.txn([{ key: 'k', value: 'v1' }, { key: 'k', modRevision: '2' }], [{ put: 'k', value: 'v2' }]), { succeeded: true, revision: '3' });
    const sent: KVCompare[][] = [];
    kv.beforeTxn = (c) => void sent.push([...c]);
    await runTxn(
      kv,
      async (tx) => {
        tx.expect('k', '3');
        tx.expectValue('k', 'v2');
        tx.expectValue('k', 'ignored: the first text is kept');
        tx.expectCompare({ key: 'j', absent: true });
        assert.equal(tx.size, 3);
        tx.put('k', 'v3');
      },
      { attempts: 1, exhausted: () => assert.fail('lost') },
    );
    assert.deepEqual(sent, [[{ key: 'k', modRevision: '3' }, { key: 'j', absent: true }, { key: 'k', value: 'v2' }]]);
    assert.equal((await kv.get('k'))?.value, 'v3');
  });
});
