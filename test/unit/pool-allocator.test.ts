/**
 * The cluster pool allocator (src/pool/allocator.ts) on the memory KV: exact block claims,
 * keys and values, repeated ADD, DEL, borrowing, exhaustion, batching (one transaction), lost
 * races re-decided, the sequence-number guard, empty blocks released except the node's last, the
 * meta check, and malformed values as exact STORE_CORRUPT errors.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { AppError, isAppError } from '../../src/common/errors.ts';
import { formatIP } from '../../src/common/ip.ts';
import { loadIPAMConfig } from '../../src/ipam/config.ts';
import { decodeBlock, decodeHandle } from '../../src/pool/model.ts';
import { PoolAllocator, TOMBSTONE_TTL_SECONDS, type CorruptSkip, type PoolAllocation } from '../../src/pool/allocator.ts';
import { PoolRemoval, REMOVAL_WINDOW_SECONDS, RemovalRefusedError } from '../../src/pool/removal.ts';
import { MemoryKV } from '../../src/store/memory/memory-kv.ts';
import type { KV, KVCompare, KVEntry, KVOp } from '../../src/store/kv.ts';

const P = '/ipwarden/pools/p1';
/** A /27 cut into two /28 blocks: 10.80.0.0/28 (ordinals 2–15 allocatable: .0 network, .1 gateway) and 10.80.0.16/28 (16–30). */
const SMALL = [[{ subnet: '10.80.0.0/27' }]];

function allocator(kv: MemoryKV, node: string, ranges: unknown = SMALL, blockSize = 28, backoff?: (attempt: number) => Promise<void>, onCorrupt?: (s: CorruptSkip) => void): PoolAllocator {
  const c = loadIPAMConfig(JSON.stringify({ cniVersion: '1.0.0', name: 'net1', ipam: { ranges } }), undefined);
  return new PoolAllocator({ kv, pool: 'p1', prefix: '/ipwarden', node, network: 'net1', rangeSets: c.rangeSets, sizes: { blockSize4: blockSize, blockSize6: 122 }, now: () => 1000, ...(backoff === undefined ? {} : { backoff }), ...(onCorrupt === undefined ? {} : { onCorrupt }) });
}

/** The removal operator of pool p1 (no node of its own). */
function remover(kv: MemoryKV): PoolRemoval {
  return new PoolRemoval({ kv, pool: 'p1', prefix: '/ipwarden', now: () => 1000 });
}

function ips(r: PoolAllocation[] | AppError): string[] {
  if (r instanceof AppError) throw r;
  return r.map((a) => formatIP(a.ip));
}

async function one(a: PoolAllocator, id: string, ifname = 'eth0'): Promise<string> {
  const [r] = await a.add([{ containerId: id, ifname }]);
  return (ips(r as PoolAllocation[]) as [string])[0];
}

describe('PoolAllocator', () => {
  it('the first ADD claims a block (node-a → 10.80.0.16/28 by its name hash) and writes exactly these keys in one transaction', async () => {
    const kv = new MemoryKV();
    const a = allocator(kv, 'node-a');
    assert.equal(await one(a, 'c1'), '10.80.0.16');
    const d = kv.dump();
    assert.deepEqual(Object.keys(d), ['/ipwarden/pool-ranges', `${P}/blocks/10.80.0.16-28`, `${P}/handles/c1/eth0`, `${P}/meta`, `${P}/nodes/node-a/blocks/10.80.0.16-28`]);
    assert.equal(d['/ipwarden/pool-ranges'], '{"v":1,"pools":{"p1":[{"subnet":"10.80.0.0/27","rangeStart":"10.80.0.1","rangeEnd":"10.80.0.30"}]}}');
    assert.deepEqual(JSON.parse(d[`${P}/blocks/10.80.0.16-28`] as string), {
      v: 1, cidr: '10.80.0.16/28', rangeSet: 0, node: 'node-a', state: 'owned', seq: 1, next: 1,
      allocs: { '0': { id: 'c1', ifname: 'eth0', node: 'node-a', seq: 1, at: 1000 } },
    });
    assert.deepEqual(JSON.parse(d[`${P}/handles/c1/eth0`] as string), {
      v: 1, node: 'node-a', network: 'net1', at: 1000, ips: [{ ip: '10.80.0.16', block: '10.80.0.16-28', ordinal: 0, seq: 1, rangeSet: 0 }],
    });
    assert.deepEqual(JSON.parse(d[`${P}/nodes/node-a/blocks/10.80.0.16-28`] as string), { v: 1, rangeSet: 0 });
    // Reads: meta, the prefix's pool index and its pools' keys (the overlap guard), the handle,
    // the node's affinities, the pool's block keys. Writes: meta (1 txn, 2 puts: meta and the
    // pool index) + the ADD (1 txn: block, affinity, handle).
    assert.deepEqual(kv.stats, { reads: 6, txns: 2, txnsSucceeded: 2, puts: 5, deletes: 0 });
  });

  it('a repeated ADD returns the same address and writes nothing', async () => {
    const kv = new MemoryKV();
    const a = allocator(kv, 'node-a');
    await one(a, 'c1');
    const before = kv.stats.txns;
    const [r] = await a.add([{ containerId: 'c1', ifname: 'eth0' }]);
    assert.deepEqual(ips(r as PoolAllocation[]), ['10.80.0.16']);
    assert.equal((r as PoolAllocation[])[0]?.existing, true);
    assert.equal(kv.stats.txns, before);
    assert.equal(await one(a, 'c1', 'net1'), '10.80.0.17', 'another ifname is another attachment');
  });

  it('a long-lived allocator (the daemon\'s) builds its next ADD on its cached blocks: no read (its handle taken as absent, compared absent), one transaction', async () => {
    const kv = new MemoryKV();
    const a = allocator(kv, 'node-a');
    await one(a, 'c1');
    const r0 = kv.stats.reads;
    const t0 = kv.stats.txns;
    assert.equal(await one(a, 'c2'), '10.80.0.17');
    assert.deepEqual([kv.stats.reads - r0, kv.stats.txns - t0], [0, 1]);
    await a.del({ containerId: 'c1', ifname: 'eth0' });
    const r1 = kv.stats.reads;
    const t1 = kv.stats.txnsSucceeded;
    assert.equal(await one(a, 'c3'), '10.80.0.18');
    assert.deepEqual([kv.stats.reads - r1, kv.stats.txnsSucceeded - t1], [0, 1], 'the DEL kept the cache current');
  });

  it('a cache that says "full" is not believed: another process of the node freed an address, the ADD gets it', async () => {
    const kv = new MemoryKV();
    const only = [[{ subnet: '10.80.0.16/28', rangeStart: '10.80.0.20', rangeEnd: '10.80.0.21' }]];
    const a = allocator(kv, 'node-a', only);
    assert.equal(await one(a, 'c1'), '10.80.0.20');
    assert.equal(await one(a, 'c2'), '10.80.0.21');
    // The standalone fallback on the same node (another allocator) releases c1.
    assert.deepEqual(await allocator(kv, 'node-a', only).del({ containerId: 'c1', ifname: 'eth0' }), ['10.80.0.20']);
    assert.equal(await one(a, 'c3'), '10.80.0.20');
  });

  it('a cached ADD that would claim re-reads first: a block another process of the node claimed is used, no extra block (trial finding 10)', async () => {
    const kv = new MemoryKV();
    const R = [[{ subnet: '10.80.0.0/26' }]];
    const a = allocator(kv, 'node-a', R); // the daemon's, with its block cache
    const blockOf = (ip: string): string => `10.80.0.${Math.floor(Number(ip.split('.')[3]) / 16) * 16}-28`;
    const affinities = (): string[] => Object.keys(kv.dump()).filter((k) => k.startsWith(`${P}/nodes/node-a/blocks/`)).map((k) => k.slice(k.lastIndexOf('/') + 1)).sort();
    const mine = blockOf(await one(a, 'c0'));
    // Fill the daemon's block: the ADD that lands elsewhere has claimed a second block.
    let k = 1;
    for (; ; k++) if (blockOf(await one(a, `f${k}`)) !== mine) break;
    assert.equal(affinities().length, 2);
    // Its DEL empties that second block, which is given back (not the node's last): the daemon's cache now holds one full block.
    await a.del({ containerId: `f${k}`, ifname: 'eth0' });
    assert.deepEqual(affinities(), [mine]);
    // The standalone fallback of the same node (another process: fresh reads) claims a block with free room.
    const fallbackBlock = blockOf(await one(allocator(kv, 'node-a', R), 'g1'));
    assert.deepEqual(affinities(), [mine, fallbackBlock].sort());
    // The daemon's next ADD must use that block, not claim a third one on its stale cache.
    assert.equal(blockOf(await one(a, 'c-next')), fallbackBlock);
    assert.deepEqual(affinities(), [mine, fallbackBlock].sort(), 'no block claimed on stale cached data');
  });

  it('a second node claims the other block; within a block addresses go round robin', async () => {
    const kv = new MemoryKV();
    const a = allocator(kv, 'node-a');
    const b = allocator(kv, 'node-b');
    assert.equal(await one(a, 'c1'), '10.80.0.16');
    assert.equal(await one(b, 'c2'), '10.80.0.2');
    assert.equal(await one(b, 'c3'), '10.80.0.3');
    await b.del({ containerId: 'c2', ifname: 'eth0' });
    assert.equal(await one(b, 'c4'), '10.80.0.4', 'the freed .2 is not reused at once');
  });

  it('borrows from another node only when the pool has no free block, then fails with host-local text', async () => {
    const kv = new MemoryKV();
    const a = allocator(kv, 'node-a');
    const b = allocator(kv, 'node-b');
    await one(b, 'b0'); // node-b owns 10.80.0.0/28
    const got: string[] = [];
    for (let i = 0; i < 15; i++) got.push(await one(a, `a${i}`)); // fills 10.80.0.16/28 (16..30)
    assert.equal(got.at(-1), '10.80.0.30');
    const [r] = await a.add([{ containerId: 'a15', ifname: 'eth0' }]);
    assert.deepEqual(ips(r as PoolAllocation[]), ['10.80.0.3']);
    assert.equal((r as PoolAllocation[])[0]?.borrowed, true);
    for (let i = 16; i < 28; i++) await one(a, `a${i}`); // the rest of node-b's block: .4 … .15
    const [full] = await a.add([{ containerId: 'last', ifname: 'eth0' }]);
    assert.ok(isAppError(full, 'IPAM_RANGE_EXHAUSTED'));
    assert.equal((full as AppError).message, 'failed to allocate for range 0: no IP addresses available in range set: 10.80.0.1-10.80.0.30');
    assert.equal(kv.dump()[`${P}/handles/last/eth0`], undefined, 'a failed ADD leaves nothing');
  });

  it('an ADD failing in its second range set writes nothing at all (no claim of the first set\'s block)', async () => {
    const kv = new MemoryKV();
    // Range set 1 is a /30 whose one address (.2) node-b takes first.
    const ranges = [[{ subnet: '10.80.0.0/27' }], [{ subnet: '10.80.1.0/30' }]];
    const b = allocator(kv, 'node-b', ranges);
    assert.deepEqual(ips((await b.add([{ containerId: 'b1', ifname: 'eth0' }]))[0] as PoolAllocation[]), ['10.80.0.2', '10.80.1.2']);
    const a = allocator(kv, 'node-a', ranges);
    const before = kv.dump();
    const [r] = await a.add([{ containerId: 'a1', ifname: 'eth0' }]);
    assert.equal((r as AppError).message, 'failed to allocate for range 1: no IP addresses available in range set: 10.80.1.1-10.80.1.2');
    assert.deepEqual(kv.dump(), before);
  });

  it('DEL releases, is idempotent, and a late release of a re-allocated address is refused (sequence number)', async () => {
    const kv = new MemoryKV();
    const a = allocator(kv, 'node-a', [[{ subnet: '10.80.0.16/28', rangeStart: '10.80.0.20', rangeEnd: '10.80.0.20' }]]);
    assert.equal(await one(a, 'old'), '10.80.0.20');
    const seqOld = 1;
    assert.deepEqual(await a.del({ containerId: 'old', ifname: 'eth0' }), ['10.80.0.20']);
    assert.deepEqual(await a.del({ containerId: 'old', ifname: 'eth0' }), []);
    assert.equal(await one(a, 'new'), '10.80.0.20');
    assert.equal(await a.releaseIfSeq('10.80.0.20', seqOld, { containerId: 'new', ifname: 'eth0' }), false, 'seq 1 was the old allocation');
    assert.equal(await a.releaseIfSeq('10.80.0.20', 2, { containerId: 'new', ifname: 'eth0' }), true);
    assert.deepEqual(await a.find({ containerId: 'new', ifname: 'eth0' }), null);
  });

  it('a batch of ADDs is one transaction with distinct addresses; duplicates in it get one answer', async () => {
    const kv = new MemoryKV();
    const a = allocator(kv, 'node-a');
    await a.checkMeta();
    const t0 = kv.stats.txns;
    const p0 = kv.stats.puts;
    const rs = await a.add(['c1', 'c2', 'c3', 'c4', 'c2'].map((id) => ({ containerId: id, ifname: 'eth0' })));
    assert.deepEqual(rs.map((r) => ips(r)[0]), ['10.80.0.16', '10.80.0.17', '10.80.0.18', '10.80.0.19', '10.80.0.17']);
    assert.equal(kv.stats.txns - t0, 1);
    assert.equal(kv.stats.puts - p0, 6, '4 handles + 1 block + 1 affinity');
  });

  it('a lost race is re-read and decided again (after the backoff): no address twice', async () => {
    const kv = new MemoryKV();
    const waited: number[] = [];
    const a = allocator(kv, 'node-a', SMALL, 28, async (n) => void waited.push(n));
    await one(a, 'c0');
    const bk = `${P}/blocks/10.80.0.16-28`;
    kv.beforeTxn = () => {
      kv.beforeTxn = null;
      // Another process of the node allocates .17 in the same block between our read and our transaction.
      const b = JSON.parse(kv.dump()[bk] as string);
      b.seq += 1;
      b.allocs['1'] = { id: 'racer', ifname: 'eth0', node: 'node-a', seq: b.seq, at: 5 };
      b.next = 2;
      kv.apply([], [{ put: bk, value: JSON.stringify(b) }]);
    };
    const t0 = kv.stats.txns;
    assert.equal(await one(a, 'c1'), '10.80.0.18');
    assert.equal(kv.stats.txns - t0, 2, 'the first transaction failed its compare, the second succeeded');
    assert.deepEqual(waited, [1], 'one backoff, before the second attempt');
    const b = JSON.parse(kv.dump()[bk] as string);
    assert.deepEqual(Object.fromEntries(Object.entries(b.allocs).map(([k, v]) => [k, (v as { id: string; seq: number }).id + '#' + (v as { seq: number }).seq])), { '0': 'c0#1', '1': 'racer#2', '2': 'c1#3' });
  });

  it('an owned block left empty goes back to the pool, except the node\'s last one', async () => {
    const kv = new MemoryKV();
    // A /26 of four /28 blocks.
    const a = allocator(kv, 'node-a', [[{ subnet: '10.80.0.0/26' }]]);
    for (let i = 0; i < 16; i++) await one(a, `c${i}`); // 15 fill the first claimed block, the 16th claims a second
    const mine = () => Object.keys(kv.dump()).filter((k) => k.startsWith(`${P}/nodes/node-a/blocks/`)).map((k) => k.slice(`${P}/nodes/node-a/blocks/`.length));
    assert.equal(mine().length, 2);
    await a.del({ containerId: 'c15', ifname: 'eth0' });
    assert.equal(mine().length, 1, 'the emptied second block was released');
    for (let i = 0; i < 15; i++) await a.del({ containerId: `c${i}`, ifname: 'eth0' });
    assert.equal(mine().length, 1, 'the last block is kept');
    assert.deepEqual(Object.keys(kv.dump()).filter((k) => k.includes('/handles/')), []);
  });

  it('a node whose config cuts the pool differently is refused (meta)', async () => {
    const kv = new MemoryKV();
    await one(allocator(kv, 'node-a'), 'c1');
    const other = allocator(kv, 'node-b', SMALL, 27);
    await assert.rejects(other.add([{ containerId: 'c2', ifname: 'eth0' }]), (e: unknown) => isAppError(e, 'IPAM_INVALID_CONFIG') && e.cniCode === 7 && e.message === 'pool p1 is recorded in etcd with ranges [10.80.0.0/27 10.80.0.1-10.80.0.30 gateway 10.80.0.1] and block sizes /28 (IPv4) and /122 (IPv6), but network net1 has ranges [10.80.0.0/27 10.80.0.1-10.80.0.30 gateway 10.80.0.1] and block sizes /27 (IPv4) and /122 (IPv6): every network naming pool p1 must have the same ranges and block sizes (the first to use the pool recorded them in /ipwarden/pools/p1/meta)');
  });

  const BK = `${P}/blocks/10.80.0.16-28`;
  const H1 = `${P}/handles/c1/eth0`;
  const OK_BLOCK = { v: 1, cidr: '10.80.0.16/28', rangeSet: 0, node: 'node-a', state: 'owned', seq: 1, next: 1, allocs: { '0': { id: 'c1', ifname: 'eth0', node: 'node-a', seq: 1, at: 1000 } } };
  const corrupt: Array<[string, string, string]> = [
    ['not JSON', '{', 'not valid JSON'],
    ['another version', '{"v":7}', 'unknown value version 7 (this ipwarden writes 1)'],
    ['a wrong cidr', '{"v":1,"cidr":"10.80.0.0/28"}', '"cidr" must be "10.80.0.16/28", got "10.80.0.0/28"'],
    ['a wrong type', '{"v":1,"cidr":"10.80.0.16/28","rangeSet":0,"node":"node-a","state":"owned","seq":"x"}', '"seq" must be a non-negative integer'],
    ['an ordinal outside the block', '{"v":1,"cidr":"10.80.0.16/28","rangeSet":0,"node":"node-a","state":"owned","seq":1,"next":0,"allocs":{"16":{"id":"c","ifname":"e","node":"node-a","seq":1,"at":1}}}', 'allocation ordinal "16" is not an ordinal of a block of 16 addresses'],
    ['a sequence above the block\'s', '{"v":1,"cidr":"10.80.0.16/28","rangeSet":0,"node":"node-a","state":"owned","seq":1,"next":0,"allocs":{"3":{"id":"c","ifname":"e","node":"node-a","seq":2,"at":1}}}', 'allocation 3: "seq" must be an integer from 1 to the block\'s seq 1'],
    ['an unknown field', JSON.stringify({ ...OK_BLOCK, owner: 'x' }), 'unknown field "owner" (known: v, cidr, rangeSet, node, state, seq, next, allocs, wanted)'],
    ['an unknown field in an allocation', JSON.stringify({ ...OK_BLOCK, allocs: { '0': { ...OK_BLOCK.allocs['0'], pod: 'x' } } }), 'allocation 0: unknown field "pod" (known: id, ifname, node, seq, at)'],
    ['an unknown field in a reserve entry', JSON.stringify({ ...OK_BLOCK, allocs: { '0': { id: '', ifname: '', node: 'node-a', seq: 1, at: 1, reserve: true, x: 1 } } }), 'allocation 0: unknown field "x" (known: id, ifname, node, seq, at, reserve)'],
  ];
  for (const [name, value, why] of corrupt) {
    it(`a block value with ${name} is STORE_CORRUPT: an ADD skips it (claims another block), a DEL of an address in it succeeds releasing nothing; the value is never rewritten`, async () => {
      assert.throws(() => decodeBlock({ key: BK, value, modRevision: '1', createRevision: '1' }, '10.80.0.16/28'), (e: unknown) => isAppError(e, 'STORE_CORRUPT') && e.cniCode === 999 && e.message === `etcd key ${BK}: ${why}`);
      const kv = new MemoryKV();
      const seen: CorruptSkip[] = [];
      const a = allocator(kv, 'node-a', SMALL, 28, undefined, (x) => seen.push(x));
      assert.equal(await one(a, 'c1'), '10.80.0.16');
      kv.plant(BK, value);
      const handle = kv.dump()[H1];
      // The node's only block cannot be read: the ADD claims the free one (10.80.0.0/28: .0 network, .1 gateway).
      assert.equal(await one(a, 'c2'), '10.80.0.2');
      assert.deepEqual(await a.del({ containerId: 'c1', ifname: 'eth0' }), []);
      assert.equal(kv.dump()[BK], value, 'never rewritten');
      assert.equal(kv.dump()[H1], handle, 'the handle still names 10.80.0.16: nothing released, nothing written');
      assert.deepEqual(seen, [
        { op: 'ADD', key: BK, why, action: 'block skipped: never allocated from, left for an operator' },
        { op: 'DEL', key: BK, why, action: `10.80.0.16 of c1/eth0 not released (its block cannot be read): the handle ${H1} keeps it for an operator` },
      ]);
    });
  }

  it('a handle value with an unknown field is STORE_CORRUPT (decoded exactly, as every value)', () => {
    const value = JSON.stringify({ v: 1, node: 'node-a', network: 'net1', at: 1, ips: [], extra: true });
    assert.throws(() => decodeHandle({ key: H1, value, modRevision: '1', createRevision: '1' }), (e: unknown) => isAppError(e, 'STORE_CORRUPT') && e.message === `etcd key ${H1}: unknown field "extra" (known: v, node, network, at, ips, host, deleted)`);
    const ip = JSON.stringify({ v: 1, node: 'node-a', network: 'net1', at: 1, ips: [{ ip: '10.80.0.16', block: '10.80.0.16-28', ordinal: 0, seq: 1, rangeSet: 0, x: 0 }] });
    assert.throws(() => decodeHandle({ key: H1, value: ip, modRevision: '1', createRevision: '1' }), (e: unknown) => isAppError(e, 'STORE_CORRUPT') && e.message === `etcd key ${H1}: ips[0]: unknown field "x" (known: ip, block, ordinal, seq, rangeSet)`);
  });

  it('an unavailable store is STORE_UNAVAILABLE (CNI 11)', async () => {
    const kv = new MemoryKV();
    const a = allocator(kv, 'node-a');
    kv.failNext = 1;
    await assert.rejects(a.add([{ containerId: 'c1', ifname: 'eth0' }]), (e: unknown) => isAppError(e, 'STORE_UNAVAILABLE') && e.cniCode === 11);
  });

  it('a batch that would exceed etcd\'s 128 txn ops (/32 blocks: a claim per request) is split, not failed with INTERNAL', async () => {
    const kv = new MemoryKV();
    const a = allocator(kv, 'node-a', [[{ subnet: '10.80.1.0/24' }]], 32);
    const rs = await a.add(Array.from({ length: 24 }, (_, i) => ({ containerId: `c${i}`, ifname: 'eth0' })));
    const got = rs.map((r) => ips(r as PoolAllocation[])[0]);
    assert.equal(new Set(got).size, 24);
    // 24 claims × 6 compares + ops + the marker compare = 145 > 128: halves of 12 (73 each), each one transaction (+ meta).
    assert.deepEqual({ txns: kv.stats.txns, ok: kv.stats.txnsSucceeded }, { txns: 3, ok: 3 });
  });

  it('two DELs of one node that each empty one of its last two blocks give back only one (the kept block is compared)', async () => {
    const kv = new MemoryKV();
    const a = allocator(kv, 'node-a');
    for (let i = 0; i < 15; i++) await one(a, `c${i}`); // 10.80.0.16/28 full
    assert.equal(await one(a, 'y'), '10.80.0.2'); // second block 10.80.0.0/28
    for (let i = 1; i < 15; i++) await a.del({ containerId: `c${i}`, ifname: 'eth0' }); // 10.80.0.16/28 holds only c0
    // Both DELs read everything before either transaction is evaluated (a barrier of two in txn).
    let arrived = 0;
    let open: () => void = () => undefined;
    const barrier = new Promise<void>((r) => (open = r));
    const racing: KV = {
      description: 'racing',
      stats: kv.stats,
      get: (k) => kv.get(k),
      list: (p, o) => kv.list(p, o),
      txn: async (c, o) => {
        if (++arrived === 2) open();
        if (arrived <= 2) await barrier;
        return kv.txn(c, o);
      },
      close: () => kv.close(),
    };
    const mk = () => new PoolAllocator({ kv: racing, pool: 'p1', prefix: '/ipwarden', node: 'node-a', network: 'net1', rangeSets: [], sizes: { blockSize4: 28, blockSize6: 122 } });
    const [r1, r2] = await Promise.all([mk().del({ containerId: 'c0', ifname: 'eth0' }), mk().del({ containerId: 'y', ifname: 'eth0' })]);
    assert.deepEqual([r1, r2], [['10.80.0.16'], ['10.80.0.2']]);
    const left = Object.keys(kv.dump()).filter((k) => k.startsWith(`${P}/nodes/node-a/blocks/`));
    assert.equal(left.length, 1, `node-a keeps one block, got ${JSON.stringify(left)}`);
    assert.ok(kv.dump()[`${P}/blocks/${(left[0] as string).split('/').pop() as string}`] !== undefined, 'and its block key');
  });

  describe('F4: a DEL that finds no handle leaves a tombstone', () => {
    it('a late ADD transaction (its sender gave up with code 11) fails against it; a fresh ADD overwrites it; a second DEL writes nothing', async () => {
      const kv = new MemoryKV();
      await one(allocator(kv, 'node-a'), 'warm');
      // The ADD's transaction reaches etcd, but its answer is lost and the process gives up (11);
      // etcd applies the transaction only later (captured here, applied below).
      let late: { c: readonly KVCompare[]; o: readonly KVOp[] } | null = null;
      const lossy: KV = {
        description: 'lossy',
        stats: kv.stats,
        get: (k) => kv.get(k),
        list: (p, o) => kv.list(p, o),
        txn: async (c, o) => {
          late = { c, o };
          throw new AppError('STORE_UNAVAILABLE', 'etcd: deadline exceeded');
        },
        close: () => kv.close(),
      };
      const c = loadIPAMConfig(JSON.stringify({ cniVersion: '1.0.0', name: 'net1', ipam: { ranges: SMALL } }), undefined);
      const gaveUp = new PoolAllocator({ kv: lossy, pool: 'p1', prefix: '/ipwarden', node: 'node-a', network: 'net1', rangeSets: c.rangeSets, sizes: { blockSize4: 28, blockSize6: 122 }, now: () => 1000 });
      await assert.rejects(gaveUp.add([{ containerId: 'c2', ifname: 'eth0' }]), (e: unknown) => isAppError(e, 'STORE_UNAVAILABLE'));
      // The runtime's DEL finds nothing: it answers [] and leaves a tombstone (with a lease when the KV has leases).
      const leases: string[] = [];
      const d = new PoolAllocator({ kv, pool: 'p1', prefix: '/ipwarden', node: 'node-a', network: 'net1', rangeSets: [], sizes: { blockSize4: 28, blockSize6: 122 }, now: () => 2000, tombstoneLease: async () => {
        const id = await kv.grantLease(TOMBSTONE_TTL_SECONDS);
        leases.push(id);
        return id;
      } });
      assert.deepEqual(await d.del({ containerId: 'c2', ifname: 'eth0' }), []);
      assert.equal(kv.dump()[`${P}/handles/c2/eth0`], '{"v":1,"node":"node-a","network":"net1","at":2000,"ips":[],"deleted":true}');
      assert.equal(leases.length, 1);
      // Now etcd applies the late transaction: its create-only compare on the handle fails.
      const l = late as unknown as { c: readonly KVCompare[]; o: readonly KVOp[] };
      assert.ok(l.c.some((x) => x.key === `${P}/handles/c2/eth0` && 'absent' in x));
      assert.equal(kv.apply(l.c, l.o).succeeded, false, 'the late commit does not land');
      assert.equal((await allocator(kv, 'node-a').find({ containerId: 'c2', ifname: 'eth0' })), null, 'CHECK: a tombstone holds nothing');
      const puts = kv.stats.puts;
      assert.deepEqual(await d.del({ containerId: 'c2', ifname: 'eth0' }), []);
      assert.equal(kv.stats.puts, puts, 'a DEL that finds a tombstone writes nothing');
      assert.deepEqual(await allocator(kv, 'node-a').handlesOf('node-a').then((h) => h.map((x) => x.containerId)), ['warm']);
      // A fresh ADD of that container (a runtime retrying with the same ID) overwrites the tombstone by its revision.
      assert.equal(await one(allocator(kv, 'node-a'), 'c2'), '10.80.0.17');
      assert.equal(JSON.parse(kv.dump()[`${P}/handles/c2/eth0`] as string).deleted, undefined);
    });
    it('an ADD fenced by `since` (the daemon\'s) is refused over a tombstone created after it began, and writes over one created before', async () => {
      const kv = new MemoryKV();
      await one(allocator(kv, 'node-a'), 'warm');
      // The daemon took an ADD of c3 when etcd's revision was `began`; then it stalled, its caller
      // gave the ADD up, and the runtime's DEL went elsewhere (the standalone fallback): a tombstone.
      const began = String(kv.revision);
      assert.deepEqual(await allocator(kv, 'node-a').del({ containerId: 'c3', ifname: 'eth0' }), []);
      const tomb = (await kv.get(`${P}/handles/c3/eth0`))?.createRevision as string;
      assert.equal(BigInt(tomb) > BigInt(began), true);
      const puts = kv.stats.puts;
      const [r] = await allocator(kv, 'node-a').add([{ containerId: 'c3', ifname: 'eth0', since: began }]);
      assert.ok(r instanceof AppError);
      assert.deepEqual([r.code, r.message], ['STORE_CONFLICT', `pool p1: a DEL of c3/eth0 was committed (its tombstone, revision ${tomb}) after this ADD began (revision ${began}): not allocated — its caller had given it up; try again`]);
      assert.equal(kv.stats.puts, puts, 'nothing written');
      assert.equal(JSON.parse(kv.dump()[`${P}/handles/c3/eth0`] as string).deleted, true, 'the tombstone stays');
      // A request that began after the DEL (the runtime asking again) writes over it, as any ADD.
      const [ok] = await allocator(kv, 'node-a').add([{ containerId: 'c3', ifname: 'eth0', since: String(kv.revision) }]);
      assert.ok(Array.isArray(ok));
      assert.deepEqual(ok.map((a) => formatIP(a.ip)), ['10.80.0.17']);
    });
    for (const withDel of [false, true]) {
      it(`an ADD whose caller has gone gets nothing allocated in a later attempt of its round${withDel ? ', also when the round has a DEL (its ADDs then go apart, in a new transaction)' : ''}; the others go on`, async () => {
        // A Jepsen run under load: a daemon stalled in the middle of a round; its shim gave the ADD
        // up, the runtime's DEL went through the standalone fallback and deleted the container's
        // handle (no tombstone: it held an address); the round resumed, lost its compare, and its
        // next attempt found no handle and allocated again — an address nobody would release.
        const kv = new MemoryKV();
        await one(allocator(kv, 'node-a'), 'warm');
        assert.equal(await one(allocator(kv, 'node-a'), 'c4'), '10.80.0.17');
        if (withDel) assert.equal(await one(allocator(kv, 'node-a'), 'd1'), '10.80.0.18');
        let gone = false;
        let refreshed = 0;
        let first = true;
        const stalled: KV = {
          description: 'stalled',
          stats: kv.stats,
          get: (k) => kv.get(k),
          list: (p, o) => kv.list(p, o),
          txn: async (c, o) => {
            if (!first) return kv.txn(c, o);
            first = false;
            // While the round stalled: the DEL elsewhere; the commit loses its compare. The caller's
            // going is learned only from the refresh, as the daemon learns it from its socket thread.
            assert.deepEqual(await allocator(kv, 'node-a').del({ containerId: 'c4', ifname: 'eth0' }), ['10.80.0.17']);
            return { succeeded: false, revision: String(kv.revision) };
          },
          close: () => kv.close(),
        };
        const c = loadIPAMConfig(JSON.stringify({ cniVersion: '1.0.0', name: 'net1', ipam: { ranges: SMALL } }), undefined);
        const a = new PoolAllocator({ kv: stalled, pool: 'p1', prefix: '/ipwarden', node: 'node-a', network: 'net1', rangeSets: c.rangeSets, sizes: { blockSize4: 28, blockSize6: 122 }, now: () => 1000 });
        const refresh = async (): Promise<void> => {
          refreshed++;
          gone = true;
        };
        const adds = [
          { containerId: 'c4', ifname: 'eth0', gone: () => gone, refresh },
          { containerId: 'c5', ifname: 'eth0', gone: () => false, refresh },
        ];
        // Attempt 0: c4's handle read (a repeated ADD: its address), c5 fresh; the commit loses.
        const r = await a.batch(adds, withDel ? [{ containerId: 'd1', ifname: 'eth0' }] : []);
        const [r4, r5] = r.adds;
        assert.ok(r4 instanceof AppError, JSON.stringify(r4));
        assert.deepEqual([r4.code, r4.message], ['STORE_CONFLICT', 'ADD of c4/eth0 not sent: its client has gone']);
        assert.deepEqual(ips(r5 as PoolAllocation[]), [withDel ? '10.80.0.19' : '10.80.0.18']);
        if (withDel) assert.deepEqual(r.dels, [['10.80.0.18']]);
        assert.equal(refreshed, 1, 'one refresh, for the attempt after the lost compare');
        assert.equal(kv.dump()[`${P}/handles/c4/eth0`], undefined, 'nothing allocated to c4 again');
        assert.deepEqual(await allocator(kv, 'node-a').handlesOf('node-a').then((h) => h.map((x) => x.containerId).sort()), ['c5', 'warm']);
      });
    }
    it('a tombstone value that is not exactly {"deleted":true,"ips":[]} is STORE_CORRUPT: a DEL leaves it as it is and succeeds', async () => {
      const kv = new MemoryKV();
      const bad = '{"v":1,"node":"node-a","network":"net1","at":1,"ips":[],"deleted":1}';
      kv.apply([], [{ put: `${P}/handles/c9/eth0`, value: bad }]);
      const seen: CorruptSkip[] = [];
      assert.deepEqual(await allocator(kv, 'node-a', SMALL, 28, undefined, (x) => seen.push(x)).del({ containerId: 'c9', ifname: 'eth0' }), []);
      assert.equal(kv.dump()[`${P}/handles/c9/eth0`], bad);
      assert.deepEqual(seen, [{ op: 'DEL', key: `${P}/handles/c9/eth0`, why: '"deleted" must be true, with "ips" empty', action: "handle left as it is for an operator (the addresses it names cannot be read from it); allocations of c9/eth0 in the pool's readable blocks: none" }]);
    });
  });

  describe('F3: an ADD racing a DEL of the same node that gives a block back', () => {
    /** node-a with two /28 blocks, the second holding only `victim`; returns the DEL's allocator. */
    async function twoBlocks(kv: MemoryKV): Promise<{ del: PoolAllocator; victim: string }> {
      const d = allocator(kv, 'node-a');
      for (let i = 0; i < 15; i++) await one(d, `c${i}`); // 10.80.0.16/28 full
      assert.equal(await one(d, 'victim'), '10.80.0.2'); // a second block: 10.80.0.0/28
      return { del: d, victim: 'victim' };
    }
    it('is a lost race, re-read: the ADD succeeds (not STORE_CORRUPT "names block …, which does not exist")', async () => {
      const kv = new MemoryKV();
      const { del, victim } = await twoBlocks(kv);
      // Between the ADD's affinity list and its block read, the DEL empties 10.80.0.0/28 and gives it back.
      let fired = false;
      const racing: KV = {
        description: 'racing',
        stats: kv.stats,
        get: async (key) => {
          if (!fired && key === `${P}/blocks/10.80.0.0-28`) {
            fired = true;
            assert.deepEqual(await del.del({ containerId: victim, ifname: 'eth0' }), ['10.80.0.2']);
            assert.equal(kv.dump()[`${P}/blocks/10.80.0.0-28`], undefined, 'the DEL gave the block back');
          }
          return kv.get(key);
        },
        list: (p, o) => kv.list(p, o),
        txn: (c, o) => kv.txn(c, o),
        close: () => kv.close(),
      };
      const c = loadIPAMConfig(JSON.stringify({ cniVersion: '1.0.0', name: 'net1', ipam: { ranges: SMALL } }), undefined);
      const add = new PoolAllocator({ kv: racing, pool: 'p1', prefix: '/ipwarden', node: 'node-a', network: 'net1', rangeSets: c.rangeSets, sizes: { blockSize4: 28, blockSize6: 122 }, now: () => 1000 });
      const [r] = await add.add([{ containerId: 'newpod', ifname: 'eth0' }]);
      assert.ok(fired);
      assert.deepEqual(ips(r as PoolAllocation[]), ['10.80.0.2'], 'the ADD claims the given-back block again');
    });
    it('a CHECK racing the release of its handle (between the handle read and the block read) re-reads: null, not 999', async () => {
      const kv = new MemoryKV();
      const d = allocator(kv, 'node-a');
      await one(d, 'c1');
      let fired = 0;
      const racing: KV = {
        description: 'racing',
        stats: kv.stats,
        get: async (key) => {
          if (fired === 0 && key === `${P}/blocks/10.80.0.16-28`) {
            fired++;
            await d.del({ containerId: 'c1', ifname: 'eth0' }); // a release between CHECK's handle read and its block read
          }
          return kv.get(key);
        },
        list: (p, o) => kv.list(p, o),
        txn: (c, o) => kv.txn(c, o),
        close: () => kv.close(),
      };
      const c = loadIPAMConfig(JSON.stringify({ cniVersion: '1.0.0', name: 'net1', ipam: { ranges: SMALL } }), undefined);
      const other = new PoolAllocator({ kv: racing, pool: 'p1', prefix: '/ipwarden', node: 'node-a', network: 'net1', rangeSets: c.rangeSets, sizes: { blockSize4: 28, blockSize6: 122 }, now: () => 1000 });
      assert.equal(await other.find({ containerId: 'c1', ifname: 'eth0' }), null, 'CHECK after the release: nothing held');
      assert.equal(fired, 1);
    });
    it('a handle naming an allocation its block lacks, unchanged across a re-read, is still STORE_CORRUPT', async () => {
      const kv = new MemoryKV();
      const a = allocator(kv, 'node-a');
      await one(a, 'c1');
      const bk = `${P}/blocks/10.80.0.16-28`;
      const b = JSON.parse(kv.dump()[bk] as string);
      b.allocs = {};
      kv.apply([], [{ put: bk, value: JSON.stringify(b) }]);
      await assert.rejects(a.find({ containerId: 'c1', ifname: 'eth0' }), (e: unknown) => isAppError(e, 'STORE_CORRUPT') && e.message === `etcd key ${P}/handles/c1/eth0: names 10.80.0.16 (block 10.80.0.16-28, sequence 1) but the block holds no such allocation`);
    });
    it('an affinity that names a missing block at one revision (unchanged across the re-read) is still STORE_CORRUPT', async () => {
      const kv = new MemoryKV();
      await twoBlocks(kv);
      kv.apply([], [{ delete: `${P}/blocks/10.80.0.0-28` }]); // the block key alone is gone: etcd data damaged
      const fresh = allocator(kv, 'node-a');
      await assert.rejects(fresh.add([{ containerId: 'newpod', ifname: 'eth0' }]), (e: unknown) => isAppError(e, 'STORE_CORRUPT') && e.message === `etcd key ${P}/nodes/node-a/blocks/10.80.0.0-28: names block 10.80.0.0-28, which does not exist`);
    });
  });

  describe('remove-node: pendingRelease, the node\'s veto, then the reclaim', () => {
    it('a marked block takes no new allocation; the reclaim frees the node\'s addresses and gives the block back', async () => {
      const kv = new MemoryKV();
      const a = allocator(kv, 'node-a');
      const b = allocator(kv, 'node-b');
      const op = remover(kv);
      assert.equal(await one(a, 'c1'), '10.80.0.16');
      assert.equal(await one(b, 'c2'), '10.80.0.2');
      assert.deepEqual(await op.mark('node-a'), ['10.80.0.16-28']);
      assert.equal(JSON.parse(kv.dump()[`${P}/blocks/10.80.0.16-28`] as string).state, 'pendingRelease');
      assert.deepEqual(await op.finish('node-a'), { released: ['10.80.0.16'], deletedBlocks: ['10.80.0.16-28'], keptBlocks: [] });
      assert.equal(kv.dump()[`${P}/handles/c1/eth0`], undefined);
      assert.equal(kv.dump()[`${P}/removing/node-a`], undefined, 'no block of node-a left: the marker goes too');
      for (let i = 3; i <= 15; i++) await one(b, `f${i}`); // node-b fills its own block
      assert.equal(await one(b, 'g1'), '10.80.0.16', 'the reclaimed block is free again: node-b claims it');
    });

    it('a node that returns before the reclaim vetoes it: its block and addresses stay, --finish refuses (no duplicate)', async () => {
      const kv = new MemoryKV();
      const a = allocator(kv, 'node-a');
      const op = remover(kv);
      assert.equal(await one(a, 'c1'), '10.80.0.16');
      await op.mark('node-a');
      assert.ok(kv.dump()[`${P}/removing/node-a`] !== undefined, 'step 1 writes the marker');
      // node-a was only partitioned: its next ADD finds the marker (its transaction compares it absent) and vetoes.
      assert.equal(await one(a, 'c2'), '10.80.0.17');
      assert.equal(JSON.parse(kv.dump()[`${P}/blocks/10.80.0.16-28`] as string).state, 'owned');
      assert.equal(kv.dump()[`${P}/removing/node-a`], undefined, 'the veto deletes the marker');
      await assert.rejects(op.finish('node-a'), (e: unknown) => e instanceof RemovalRefusedError && e.message === `node node-a is not marked for removal in pool p1 (no ${P}/removing/node-a): run remove-node without --finish first, or it vetoed (it is back)`);
      assert.deepEqual((await a.find({ containerId: 'c1', ifname: 'eth0' }))?.map((x) => formatIP(x.ip)), ['10.80.0.16']);
      await op.mark('node-a');
      assert.deepEqual(await a.veto(), ['10.80.0.16-28']);
      assert.deepEqual(await a.veto(), []);
      assert.equal(await a.vetoIfMarked(), null);
    });

    it('F1: --finish after the node returned does not free its borrowed addresses (all in other nodes\' blocks)', async () => {
      // /26 in /28 blocks = 4 blocks; three nodes claim one each, node-t fills the fourth, then borrows.
      const kv = new MemoryKV();
      const R = [[{ subnet: '10.80.0.0/26' }]];
      const [a, b, c, t] = ['node-a', 'node-b', 'node-c', 'node-t'].map((n) => allocator(kv, n, R));
      const op = remover(kv);
      for (const [x, n] of [[a, 'a'], [b, 'b'], [c, 'c']] as const) await one(x as PoolAllocator, `${n}0`);
      let n = 0;
      for (; n < 16; n++) await one(t as PoolAllocator, `t${n}`);
      const borrowed = await one(t as PoolAllocator, 'tBorrow');
      await op.mark('node-t');
      const again = await one(t as PoolAllocator, 'tAfterReturn'); // the return: this ADD vetoes
      await assert.rejects(op.finish('node-t'), RemovalRefusedError);
      assert.deepEqual((await (t as PoolAllocator).find({ containerId: 'tBorrow', ifname: 'eth0' }))?.map((x) => formatIP(x.ip)), [borrowed]);
      assert.deepEqual((await (t as PoolAllocator).find({ containerId: 'tAfterReturn', ifname: 'eth0' }))?.map((x) => formatIP(x.ip)), [again]);
    });

    it('a DEL of the node, or an ADD that fails on a full pool, vetoes too (signs of life)', async () => {
      const kv = new MemoryKV();
      const a = allocator(kv, 'node-a');
      const b = allocator(kv, 'node-b');
      const op = remover(kv);
      await one(a, 'c1');
      await one(a, 'c2');
      await op.mark('node-a');
      assert.deepEqual(await a.del({ containerId: 'c2', ifname: 'eth0' }), ['10.80.0.17']);
      assert.equal(kv.dump()[`${P}/removing/node-a`], undefined, 'the DEL vetoed');
      assert.equal(JSON.parse(kv.dump()[`${P}/blocks/10.80.0.16-28`] as string).state, 'owned');
      // A full pool: node-a's ADD sends no transaction, but still vetoes.
      for (let i = 0; i < 14; i++) await one(b, `b${i}`);
      for (let i = 3; i < 17; i++) await one(a, `a${i}`);
      const [full] = await a.add([{ containerId: 'late', ifname: 'eth0' }]);
      assert.ok(full instanceof AppError, 'the pool is full');
      await op.mark('node-a');
      const [again] = await allocator(kv, 'node-a').add([{ containerId: 'late', ifname: 'eth0' }]);
      assert.ok(again instanceof AppError);
      assert.equal(kv.dump()[`${P}/removing/node-a`], undefined, 'the failed ADD vetoed');
    });

    it('the veto window: --finish refuses until step 1\'s leased window key has expired', async () => {
      const kv = new MemoryKV();
      const a = allocator(kv, 'node-a');
      const op = remover(kv);
      await one(a, 'c1');
      const leases: string[] = [];
      await op.mark('node-a', { windowLease: async () => (leases.push(await kv.grantLease(REMOVAL_WINDOW_SECONDS)), leases[0] as string) });
      assert.equal(REMOVAL_WINDOW_SECONDS, 60);
      assert.ok(kv.dump()[`${P}/removal-window/node-a`] !== undefined);
      const before = kv.dump();
      await assert.rejects(op.finish('node-a'), (e: unknown) => e instanceof RemovalRefusedError && e.message === `the veto window of node node-a's removal from pool p1 has not passed (${P}/removal-window/node-a exists until its 60 s lease expires): try --finish again later`);
      assert.deepEqual(kv.dump(), before);
      kv.expireLease(leases[0] as string);
      assert.deepEqual(await op.finish('node-a'), { released: ['10.80.0.16'], deletedBlocks: ['10.80.0.16-28'], keptBlocks: [] });
    });

    it('F1b: --finish without step 1 refuses and releases nothing (a node with no block of its own)', async () => {
      const kv = new MemoryKV();
      const R = [[{ subnet: '10.80.0.0/26' }]];
      for (const n of ['node-a', 'node-b', 'node-c', 'node-d']) await one(allocator(kv, n, R), `${n}-0`);
      const t = allocator(kv, 'node-t', R);
      const ip = await one(t, 'tpod'); // borrowed: every block is claimed
      const before = kv.dump();
      await assert.rejects(remover(kv).finish('node-t'), RemovalRefusedError);
      assert.deepEqual(kv.dump(), before);
      assert.deepEqual((await t.find({ containerId: 'tpod', ifname: 'eth0' }))?.map((x) => formatIP(x.ip)), [ip]);
    });

    it('F2a: a returning node whose cached block is full (its ADD claims a new block) still vetoes, and --finish refuses', async () => {
      const kv = new MemoryKV();
      const R = [[{ subnet: '10.80.0.0/26' }]];
      const a = allocator(kv, 'node-a', R); // one long-lived allocator: the daemon's, with its block cache
      for (let i = 0; i < 15; i++) await one(a, `c${i}`); // fills its first /28
      const op = remover(kv);
      assert.equal((await op.mark('node-a')).length, 1);
      const ip = await one(a, 'c15'); // on cached data this claims a second block; the marker compare fails it
      assert.equal(kv.dump()[`${P}/removing/node-a`], undefined);
      for (const [k, v] of Object.entries(kv.dump())) if (/\/blocks\/[^/]+$/.test(k) && !k.includes('/nodes/')) assert.equal(JSON.parse(v).state, 'owned', k);
      await assert.rejects(op.finish('node-a'), RemovalRefusedError);
      assert.deepEqual((await a.find({ containerId: 'c15', ifname: 'eth0' }))?.map((x) => formatIP(x.ip)), [ip]);
      assert.equal(Object.keys(kv.dump()).filter((k) => k.startsWith(`${P}/handles/`)).length, 16);
    });

    it('F1/F2: a veto that lands while --finish runs stops it before the next release (every finish transaction compares the marker)', async () => {
      const kv = new MemoryKV();
      const a = allocator(kv, 'node-a');
      const op = remover(kv);
      await one(a, 'c1');
      await one(a, 'c2');
      await op.mark('node-a');
      let fired = false;
      kv.beforeTxn = () => {
        if (fired) return;
        fired = true;
        kv.apply([], [{ delete: `${P}/removing/node-a` }]); // node-a's veto, between finish's reads and its first transaction
      };
      await assert.rejects(op.finish('node-a'), (e: unknown) => e instanceof RemovalRefusedError && e.message === `node node-a vetoed its removal from pool p1 (${P}/removing/node-a was deleted or re-created): it is back; nothing more was released`);
      kv.beforeTxn = null;
      assert.ok(kv.dump()[`${P}/handles/c1/eth0`] !== undefined && kv.dump()[`${P}/handles/c2/eth0`] !== undefined);
    });

    it('a heartbeat refuses step 1 (unless force) and always --finish, also one that appears during --finish', async () => {
      const kv = new MemoryKV();
      const a = allocator(kv, 'node-a');
      const op = remover(kv);
      await one(a, 'c1');
      kv.apply([], [{ put: a.aliveKey('node-a'), value: '{"v":1,"node":"node-a","since":1}' }]);
      await assert.rejects(op.mark('node-a'), (e: unknown) => e instanceof RemovalRefusedError && e.message === `node node-a has a live heartbeat in pool p1 (${P}/alive/node-a): it is not gone; stop its daemon first, or pass --force if you are sure`);
      assert.equal(kv.dump()[`${P}/removing/node-a`], undefined);
      assert.deepEqual(await op.mark('node-a', { force: true }), ['10.80.0.16-28']);
      await assert.rejects(op.finish('node-a'), (e: unknown) => e instanceof RemovalRefusedError && e.message.endsWith('stop its daemon first (--finish never overrides a heartbeat)'));
      kv.apply([], [{ delete: a.aliveKey('node-a') }]);
      kv.beforeTxn = () => {
        kv.beforeTxn = null;
        kv.apply([], [{ put: a.aliveKey('node-a'), value: '{"v":1,"node":"node-a","since":2}' }]);
      };
      await assert.rejects(op.finish('node-a'), RemovalRefusedError);
      assert.ok(kv.dump()[`${P}/handles/c1/eth0`] !== undefined);
    });

    it('addresses other nodes borrowed in the removed node\'s block stay, and so does the block', async () => {
      const kv = new MemoryKV();
      const a = allocator(kv, 'node-a');
      const b = allocator(kv, 'node-b');
      const op = remover(kv);
      await one(b, 'b0');
      for (let i = 0; i < 15; i++) await one(a, `a${i}`); // node-a's block full
      assert.equal(await one(a, 'borrower'), '10.80.0.3'); // node-a borrows in node-b's block
      await op.mark('node-b');
      const r = await op.finish('node-b');
      assert.deepEqual(r, { released: ['10.80.0.2'], deletedBlocks: [], keptBlocks: ['10.80.0.0-28'] });
      assert.deepEqual((await a.find({ containerId: 'borrower', ifname: 'eth0' }))?.map((x) => formatIP(x.ip)), ['10.80.0.3']);
    });
  });
});

/**
 * Step 1's node checks (`PoolRemoval.mark(…, {checkNode: true})`, what `ipwarden pool remove-node`
 * runs; trial findings 1, 5, 11): exact messages, nothing written by a refusal.
 */
describe('PoolRemoval.mark with checkNode (trial findings 1, 5, 11)', () => {
  const settings = (kv: MemoryKV, node: string) => kv.apply([], [{ put: `${P}/nodes/${node}/settings`, value: '{"v":1,"offlineSeconds":0}' }]);
  const snapshot = (kv: MemoryKV) => JSON.stringify(kv.dump());

  it('a node no daemon has served (no settings key) is refused, nothing written; --force marks it', async () => {
    const kv = new MemoryKV();
    const a = allocator(kv, 'node-c');
    const op = remover(kv);
    await one(a, 'c1');
    const before = snapshot(kv);
    const txns = kv.stats.txns;
    await assert.rejects(
      op.mark('node-c', { checkNode: true }),
      (e: unknown) =>
        e instanceof RemovalRefusedError &&
        e.message === `node node-c has never been served by an ipwarden daemon in pool p1 (no ${P}/nodes/node-c/settings): it writes no heartbeat, so it cannot veto its removal while idle; if it is gone (kubectl get node node-c), pass --force`,
    );
    assert.equal(snapshot(kv), before, 'nothing written');
    assert.equal(kv.stats.txns, txns, 'no transaction sent');
    assert.deepEqual(await op.mark('node-c', { checkNode: true, force: true }), ['10.80.0.16-28']);
    assert.notEqual(kv.dump()[`${P}/removing/node-c`], undefined);
  });

  it('a node with a settings key (a daemon served it) and no heartbeat is marked', async () => {
    const kv = new MemoryKV();
    const a = allocator(kv, 'node-a');
    const op = remover(kv);
    await one(a, 'c1');
    settings(kv, 'node-a');
    assert.deepEqual(await op.mark('node-a', { checkNode: true }), ['10.80.0.16-28']);
  });

  for (const [what, setup] of [
    ['never used at all', async (_kv: MemoryKV) => undefined],
    ['a name of a pool that has other nodes', async (kv: MemoryKV) => void (await one(allocator(kv, 'node-a'), 'c1'))],
    ['a node whose only handle is a tombstone', async (kv: MemoryKV) => void (await allocator(kv, 'node-zzz').del({ containerId: 'gone', ifname: 'eth0' }))],
  ] as const) {
    it(`a node that has nothing in the pool is refused, also with --force (${what})`, async () => {
      const kv = new MemoryKV();
      await setup(kv);
      const op = remover(kv);
      const before = snapshot(kv);
      for (const force of [false, true]) {
        await assert.rejects(op.mark('node-zzz', { checkNode: true, force }), (e: unknown) => e instanceof RemovalRefusedError && e.message === 'node node-zzz has nothing in pool p1: nothing to remove (a typo?)');
      }
      assert.equal(snapshot(kv), before, 'nothing written');
    });
  }

  it('a node holding only borrowed addresses (no block, no settings) is not "nothing": it is refused as never served', async () => {
    const kv = new MemoryKV();
    const a = allocator(kv, 'node-a');
    const b = allocator(kv, 'node-b');
    await one(a, 'a1');
    await one(b, 'b1');
    assert.equal(await one(allocator(kv, 'node-c'), 'c1'), '10.80.0.3', 'node-c borrows');
    await assert.rejects(remover(kv).mark('node-c', { checkNode: true }), (e: unknown) => e instanceof RemovalRefusedError && e.message.startsWith('node node-c has never been served by an ipwarden daemon in pool p1'));
  });

  it('a heartbeat alone (no block, no handle) is something: refused as live; the refusal names the daemon that wrote it (host, pid), old values keep the old text', async () => {
    const kv = new MemoryKV();
    const op = remover(kv);
    await one(allocator(kv, 'node-a'), 'c1');
    kv.apply([], [{ put: `${P}/alive/node-b`, value: '{"v":1,"node":"node-b","since":1,"host":"node-da","pid":4242}' }]);
    await assert.rejects(
      op.mark('node-b', { checkNode: true }),
      (e: unknown) =>
        e instanceof RemovalRefusedError &&
        e.message === `node node-b has a live heartbeat in pool p1 (${P}/alive/node-b, written by the ipwarden daemon on host node-da (pid 4242)): it is not gone; stop the daemon on host node-da first, or pass --force if you are sure`,
    );
    // The same from the transaction's compare (no checkNode) and from --finish.
    await assert.rejects(op.mark('node-b'), (e: unknown) => e instanceof RemovalRefusedError && e.message.includes('written by the ipwarden daemon on host node-da (pid 4242)'));
    kv.apply([], [{ put: `${P}/alive/node-b`, value: '{"v":1,"node":"node-b","since":1}' }]);
    await assert.rejects(op.mark('node-b', { checkNode: true }), (e: unknown) => e instanceof RemovalRefusedError && e.message === `node node-b has a live heartbeat in pool p1 (${P}/alive/node-b): it is not gone; stop its daemon first, or pass --force if you are sure`);
    // A value that is not JSON, or a host that is no host name, names nobody (never an error: a hint).
    for (const [v, shown] of [
      ['not json', `(${P}/alive/node-b): it is not gone; stop its daemon first`],
      ['{"v":1,"node":"node-b","since":1,"host":"a b<script>"}', `(${P}/alive/node-b): it is not gone; stop its daemon first`],
      ['{"v":1,"host":"h1","pid":-3}', `(${P}/alive/node-b, written by the ipwarden daemon on host h1): it is not gone; stop the daemon on host h1 first`],
    ] as const) {
      kv.apply([], [{ put: `${P}/alive/node-b`, value: v }]);
      await assert.rejects(op.mark('node-b', { checkNode: true }), (e: unknown) => e instanceof RemovalRefusedError && e.message === `node node-b has a live heartbeat in pool p1 ${shown}, or pass --force if you are sure`);
    }
    assert.equal(kv.dump()[`${P}/removing/node-b`], undefined);
  });

  it('--finish names the heartbeat\'s writer too, and a finished removal deletes the node\'s settings key with the marker', async () => {
    const kv = new MemoryKV();
    const a = allocator(kv, 'node-a');
    const op = remover(kv);
    await one(a, 'c1');
    settings(kv, 'node-a');
    await op.mark('node-a', { checkNode: true });
    kv.apply([], [{ put: a.aliveKey('node-a'), value: '{"v":1,"node":"node-a","since":1,"host":"h7","pid":9}' }]);
    await assert.rejects(op.finish('node-a'), (e: unknown) => e instanceof RemovalRefusedError && e.message === `node node-a has a live heartbeat in pool p1 (${P}/alive/node-a, written by the ipwarden daemon on host h7 (pid 9)): it is not gone; stop the daemon on host h7 first (--finish never overrides a heartbeat)`);
    kv.apply([], [{ delete: a.aliveKey('node-a') }]);
    assert.deepEqual(await op.finish('node-a'), { released: ['10.80.0.16'], deletedBlocks: ['10.80.0.16-28'], keptBlocks: [] });
    assert.deepEqual(Object.keys(kv.dump()).filter((k) => k.includes('node-a')), [], 'no key of node-a is left (marker, settings)');
  });
});

describe('PoolAllocator and corrupt keys: a DEL always finishes, an ADD never allocates from a block it cannot read', () => {
  const TWO = [[{ subnet: '10.80.0.0/27' }], [{ subnet: '10.80.1.0/27' }]];

  it('a DEL releases the address in a readable block, keeps the one in a corrupt block in the handle; a retry writes nothing; after a repair a DEL releases it', async () => {
    const kv = new MemoryKV();
    const seen: CorruptSkip[] = [];
    const a = allocator(kv, 'node-a', TWO, 28, undefined, (x) => seen.push(x));
    const [r] = await a.add([{ containerId: 'c1', ifname: 'eth0' }]);
    assert.deepEqual(ips(r as PoolAllocation[]), ['10.80.0.16', '10.80.1.16']);
    const bad = `${P}/blocks/10.80.1.16-28`;
    const good = kv.dump()[bad] as string;
    kv.plant(bad, '{"v":1,"cidr":"10.80.1.16/28"');
    assert.deepEqual(await a.del({ containerId: 'c1', ifname: 'eth0' }), ['10.80.0.16']);
    // The handle now names only the address it could not release (same fields otherwise).
    assert.deepEqual(JSON.parse(kv.dump()[`${P}/handles/c1/eth0`] as string), { v: 1, node: 'node-a', network: 'net1', at: 1000, ips: [{ ip: '10.80.1.16', block: '10.80.1.16-28', ordinal: 0, seq: 1, rangeSet: 1 }] });
    assert.deepEqual(JSON.parse(kv.dump()[`${P}/blocks/10.80.0.16-28`] as string).allocs, {}, 'released (the node\'s last block of set 0 is kept)');
    assert.equal(kv.dump()[bad], '{"v":1,"cidr":"10.80.1.16/28"');
    const action = `10.80.1.16 of c1/eth0 not released (its block cannot be read): the handle ${P}/handles/c1/eth0 keeps it for an operator`;
    assert.deepEqual(seen, [{ op: 'DEL', key: bad, why: 'not valid JSON', action }]);
    // The runtime retries the DEL (or sends it again): nothing is written, it succeeds again.
    const txns = kv.stats.txns;
    assert.deepEqual(await a.del({ containerId: 'c1', ifname: 'eth0' }), []);
    assert.equal(kv.stats.txns, txns);
    assert.equal(seen.length, 2);
    // An operator repairs the block: the next DEL releases the address and the handle goes.
    kv.plant(bad, good);
    assert.deepEqual(await a.del({ containerId: 'c1', ifname: 'eth0' }), ['10.80.1.16']);
    assert.equal(kv.dump()[`${P}/handles/c1/eth0`], undefined);
    assert.deepEqual(JSON.parse(kv.dump()[bad] as string).allocs, {});
  });

  it('a DEL whose handle cannot be read releases the container\'s allocations found in readable blocks, and leaves the handle', async () => {
    const kv = new MemoryKV();
    const seen: CorruptSkip[] = [];
    const a = allocator(kv, 'node-a', TWO, 28, undefined, (x) => seen.push(x));
    await a.add([{ containerId: 'c1', ifname: 'eth0' }]);
    await a.add([{ containerId: 'c2', ifname: 'eth0' }]);
    const hk = `${P}/handles/c1/eth0`;
    kv.plant(hk, '{"v":1,"node":"node-a","network":"net1","at":1000,"ips":"x"}');
    kv.plant(`${P}/blocks/garbage`, 'x');
    assert.deepEqual(await a.del({ containerId: 'c1', ifname: 'eth0' }), ['10.80.0.16', '10.80.1.16']);
    assert.equal(kv.dump()[hk], '{"v":1,"node":"node-a","network":"net1","at":1000,"ips":"x"}', 'left as it is');
    for (const b of ['10.80.0.16-28', '10.80.1.16-28']) {
      assert.deepEqual(JSON.parse(kv.dump()[`${P}/blocks/${b}`] as string).allocs, { '1': { id: 'c2', ifname: 'eth0', node: 'node-a', seq: 2, at: 1000 } }, `${b}: c2's allocation stays`);
    }
    assert.deepEqual(seen, [
      { op: 'DEL', key: `${P}/blocks/garbage`, why: 'not a block key', action: 'not searched for allocations of c1/eth0 (it cannot be read): left for an operator' },
      { op: 'DEL', key: hk, why: '"ips" must be an array', action: "handle left as it is for an operator (the addresses it names cannot be read from it); allocations of c1/eth0 in the pool's readable blocks: 10.80.0.16, 10.80.1.16, released" },
    ]);
    // A late ADD transaction of c1 still fails on the handle (create-only); a second DEL finds nothing more.
    assert.deepEqual(await a.del({ containerId: 'c1', ifname: 'eth0' }), []);
  });

  it('borrowing skips a corrupt block and a stray key under blocks/; with no readable room the ADD fails with host-local\'s text and details naming them', async () => {
    const kv = new MemoryKV();
    const seen: CorruptSkip[] = [];
    assert.equal(await one(allocator(kv, 'node-a'), 'a1'), '10.80.0.16');
    assert.equal(await one(allocator(kv, 'node-b'), 'b1'), '10.80.0.2');
    kv.plant(`${P}/blocks/10.80.0.16-28`, '{"v":1}');
    kv.plant(`${P}/blocks/garbage`, 'x');
    const c = allocator(kv, 'node-c', SMALL, 28, undefined, (x) => seen.push(x));
    // No free block: node-c borrows in node-b's readable block only.
    assert.equal(await one(c, 'c1'), '10.80.0.3');
    const skip = (key: string, why: string): CorruptSkip => ({ op: 'ADD', key, why, action: 'block skipped: never allocated from, left for an operator' });
    assert.deepEqual(seen, [skip(`${P}/blocks/10.80.0.16-28`, '"cidr" must be "10.80.0.16/28", got null'), skip(`${P}/blocks/garbage`, 'not a block key')]);
    // Fill node-b's block (.4–.15): then nothing readable is free.
    for (let i = 0; i < 12; i++) await one(c, `f${i}`);
    const before = kv.dump();
    const [r] = await c.add([{ containerId: 'c2', ifname: 'eth0' }]);
    assert.ok(isAppError(r, 'IPAM_RANGE_EXHAUSTED'));
    assert.equal((r as AppError).message, 'failed to allocate for range 0: no IP addresses available in range set: 10.80.0.1-10.80.0.30');
    assert.equal((r as AppError).details, `pool p1: every block of range set 0 is claimed and none has a free address; blocks that cannot be read were skipped (never allocated from, left for an operator): etcd key ${P}/blocks/10.80.0.16-28: "cidr" must be "10.80.0.16/28", got null; etcd key ${P}/blocks/garbage: not a block key`);
    assert.deepEqual(kv.dump(), before, 'nothing written');
  });

  it('an affinity that cannot be read: a DEL that empties a block keeps it (never given back on it)', async () => {
    const kv = new MemoryKV();
    const seen: CorruptSkip[] = [];
    const a = allocator(kv, 'node-a', SMALL, 28, undefined, (x) => seen.push(x));
    for (let i = 0; i < 15; i++) await one(a, `x${i}`); // 10.80.0.16/28 full
    assert.equal(await one(a, 'last'), '10.80.0.2'); // a second block claimed
    const aff = `${P}/nodes/node-a/blocks/10.80.0.16-28`;
    kv.plant(aff, '{"v":1,"rangeSet":0,"x":1}');
    assert.deepEqual(await a.del({ containerId: 'last', ifname: 'eth0' }), ['10.80.0.2']);
    assert.deepEqual(JSON.parse(kv.dump()[`${P}/blocks/10.80.0.0-28`] as string).allocs, {}, 'kept, empty');
    assert.notEqual(kv.dump()[`${P}/nodes/node-a/blocks/10.80.0.0-28`], undefined);
    assert.deepEqual(seen, [{ op: 'DEL', key: aff, why: 'unknown field "x" (known: v, rangeSet)', action: 'affinity not read: no block is given back on it, left for an operator' }]);
  });
});

describe('PoolAllocator.batch: ADDs and DELs of a node in one transaction (the daemon\'s rounds)', () => {
  const req = (id: string) => ({ containerId: id, ifname: 'eth0' });

  it('two ADDs and two DELs on one block: one transaction, the block written once, exact answers and keys', async () => {
    const kv = new MemoryKV();
    const a = allocator(kv, 'node-a');
    assert.deepEqual((await a.add([req('c1'), req('c2')])).map((r) => ips(r)[0]), ['10.80.0.16', '10.80.0.17']);
    const s0 = { ...kv.stats };
    const r = await a.batch([req('c3'), req('c4')], [req('c1'), req('c2')]);
    assert.deepEqual(r.adds.map((x) => ips(x)), [['10.80.0.18'], ['10.80.0.19']], 'the ADDs are decided first: no address a DEL of the round frees');
    assert.deepEqual(r.dels, [['10.80.0.16'], ['10.80.0.17']]);
    // No read: the ADDs' handles are taken as absent (compared absent), the DELs' as this
    // allocator wrote them (compared at that revision), the block comes from the cache. One
    // transaction: 2 handles put, 2 deleted, the block put once.
    assert.deepEqual(
      { reads: kv.stats.reads - s0.reads, txns: kv.stats.txns - s0.txns, ok: kv.stats.txnsSucceeded - s0.txnsSucceeded, puts: kv.stats.puts - s0.puts, deletes: kv.stats.deletes - s0.deletes },
      { reads: 0, txns: 1, ok: 1, puts: 3, deletes: 2 },
    );
    const d = kv.dump();
    assert.deepEqual(Object.keys(d).filter((k) => k.includes('/handles/')), [`${P}/handles/c3/eth0`, `${P}/handles/c4/eth0`]);
    assert.deepEqual(JSON.parse(d[`${P}/blocks/10.80.0.16-28`] as string), {
      v: 1, cidr: '10.80.0.16/28', rangeSet: 0, node: 'node-a', state: 'owned', seq: 4, next: 4,
      allocs: { '2': { id: 'c3', ifname: 'eth0', node: 'node-a', seq: 3, at: 1000 }, '3': { id: 'c4', ifname: 'eth0', node: 'node-a', seq: 4, at: 1000 } },
    });
    // The caches were kept current (the block, c3's handle as the round wrote it): the next round
    // reads nothing and sends one transaction.
    const s1 = { ...kv.stats };
    const r2 = await a.batch([req('c5')], [req('c3')]);
    assert.deepEqual([r2.adds.map((x) => ips(x)), r2.dels], [[['10.80.0.20']], [['10.80.0.18']]]);
    assert.deepEqual([kv.stats.reads - s1.reads, kv.stats.txns - s1.txns, kv.stats.txnsSucceeded - s1.txnsSucceeded], [0, 1, 1]);
  });

  it('a round\'s guesses proved wrong by their compares are decided again on fresh reads: a handle another process wrote (a repeated ADD), a cached handle another process deleted (a DEL)', async () => {
    const kv = new MemoryKV();
    const a = allocator(kv, 'node-a');
    const fallback = allocator(kv, 'node-a'); // the standalone fallback of the same node: its own caches
    assert.deepEqual((await a.add([req('c1')])).map((x) => ips(x)), [['10.80.0.16']]);
    assert.deepEqual((await fallback.add([req('f1')])).map((x) => ips(x)), [['10.80.0.17']]);
    // A repeated ADD of f1 through the daemon: its first attempt takes f1's handle as absent (and
    // its cached block is stale); the transaction loses, the removal marker is read, then f1's
    // handle and its block: the existing allocation, nothing written.
    let s0 = { ...kv.stats };
    const r = await a.add([req('f1')]);
    assert.deepEqual(r.map((x) => ips(x)), [['10.80.0.17']]);
    assert.equal((r[0] as PoolAllocation[])[0]?.existing, true);
    assert.deepEqual([kv.stats.reads - s0.reads, kv.stats.txns - s0.txns, kv.stats.txnsSucceeded - s0.txnsSucceeded], [3, 1, 0]);
    // The lost race dropped the block cache; the next ADD reads fresh and caches again.
    assert.deepEqual((await a.add([req('c2')])).map((x) => ips(x)), [['10.80.0.18']]);
    // c1 released by the fallback: the daemon's cached handle of c1 is stale. Its DEL loses the
    // compare on it, then reads it absent: nothing held, a tombstone.
    assert.deepEqual(await fallback.del(req('c1')), ['10.80.0.16']);
    s0 = { ...kv.stats };
    assert.deepEqual(await a.release([req('c1')]), [[]]);
    assert.deepEqual([kv.stats.txns - s0.txns, kv.stats.txnsSucceeded - s0.txnsSucceeded], [2, 1]);
    assert.equal(JSON.parse(kv.dump()[`${P}/handles/c1/eth0`] as string).deleted, true);
    assert.deepEqual(Object.keys(JSON.parse(kv.dump()[`${P}/blocks/10.80.0.16-28`] as string).allocs), ['1', '2']);
  });

  it('a DEL of nothing held puts its tombstone in the round\'s transaction; a repeated DEL in the round gets the first one\'s answer', async () => {
    const kv = new MemoryKV();
    const a = allocator(kv, 'node-a');
    await one(a, 'c1');
    const t0 = kv.stats.txns;
    const r = await a.batch([req('c2')], [req('gone'), req('c1'), req('gone')]);
    assert.deepEqual([r.adds.map((x) => ips(x)), r.dels], [[['10.80.0.17']], [[], ['10.80.0.16'], []]]);
    assert.equal(kv.stats.txns - t0, 1);
    assert.deepEqual(JSON.parse(kv.dump()[`${P}/handles/gone/eth0`] as string), { v: 1, node: 'node-a', network: 'net1', at: 1000, ips: [], deleted: true });
    // A late ADD transaction of "gone" (create-only on its handle) would now fail; a DEL again writes nothing.
    const p0 = kv.stats.puts;
    assert.deepEqual(await a.release([req('gone')]), [[]]);
    assert.equal(kv.stats.puts, p0);
  });

  it('a round\'s DEL that empties a block that is not the node\'s last gives it back in the same transaction', async () => {
    const kv = new MemoryKV();
    const a = allocator(kv, 'node-a');
    // node-a fills 10.80.0.16/28 (15 addresses) and claims 10.80.0.0/28 for the 16th.
    const ids = Array.from({ length: 16 }, (_, i) => `c${i}`);
    const rs = await a.add(ids.map(req));
    assert.equal(ips(rs[15] as PoolAllocation[])[0], '10.80.0.2');
    const t0 = kv.stats.txns;
    const r = await a.batch([req('n1')], [req('c15')]);
    // The ADD is decided first: the /28 at .0 still has c15, so n1 gets .3 there; then c15 leaves and the block is not empty.
    assert.deepEqual([r.adds.map((x) => ips(x)), r.dels], [[['10.80.0.3']], [['10.80.0.2']]]);
    const r2 = await a.release([req('n1')]);
    assert.deepEqual(r2, [['10.80.0.3']]);
    assert.equal(kv.stats.txns - t0, 2);
    const d = kv.dump();
    assert.equal(d[`${P}/blocks/10.80.0.0-28`], undefined, 'emptied and not the last: given back');
    assert.equal(d[`${P}/nodes/node-a/blocks/10.80.0.0-28`], undefined);
    assert.notEqual(d[`${P}/blocks/10.80.0.16-28`], undefined);
  });

  it('a round whose ADD finds its range set full sends its DELs apart: the failed ADD writes nothing', async () => {
    const kv = new MemoryKV();
    const only = [[{ subnet: '10.80.0.16/28', rangeStart: '10.80.0.20', rangeEnd: '10.80.0.20' }]];
    const a = allocator(kv, 'node-a', only);
    assert.equal(await one(a, 'c1'), '10.80.0.20');
    const before = JSON.parse(kv.dump()[`${P}/blocks/10.80.0.16-28`] as string);
    const t0 = kv.stats.txns;
    const r = await a.batch([req('c2')], [req('c1')]);
    assert.ok(isAppError(r.adds[0], 'IPAM_RANGE_EXHAUSTED'), String(r.adds[0]));
    assert.deepEqual(r.dels, [['10.80.0.20']]);
    assert.equal(kv.stats.txns - t0, 1, 'only the DEL\'s transaction');
    const after = JSON.parse(kv.dump()[`${P}/blocks/10.80.0.16-28`] as string);
    assert.deepEqual({ seq: after.seq, next: after.next, allocs: after.allocs }, { seq: before.seq, next: before.next, allocs: {} });
  });

  it('an ADD and a DEL of one attachment in one round is refused (INTERNAL): the batcher never sends it', async () => {
    const kv = new MemoryKV();
    const a = allocator(kv, 'node-a');
    await one(a, 'c1');
    await assert.rejects(a.batch([req('c1')], [req('c1')]), (e: unknown) => isAppError(e, 'INTERNAL') && e.message === 'a pool batch holds both an ADD and a DEL of c1/eth0');
  });

  it('a round that lost its compare is re-read and decided again: every DEL and ADD answered once, no address twice', async () => {
    const kv = new MemoryKV();
    const a = allocator(kv, 'node-a');
    await a.add([req('c1'), req('c2')]);
    const bk = `${P}/blocks/10.80.0.16-28`;
    kv.beforeTxn = () => {
      kv.beforeTxn = null;
      // Another process of the node (the standalone fallback) allocates .18 meanwhile.
      const b = JSON.parse(kv.dump()[bk] as string);
      b.seq += 1;
      b.allocs['2'] = { id: 'racer', ifname: 'eth0', node: 'node-a', seq: b.seq, at: 5 };
      b.next = 3;
      kv.apply([], [{ put: bk, value: JSON.stringify(b) }]);
    };
    const t0 = kv.stats.txns;
    const r = await a.batch([req('c3')], [req('c1')]);
    assert.deepEqual([r.adds.map((x) => ips(x)), r.dels], [[['10.80.0.19']], [['10.80.0.16']]]);
    assert.deepEqual([kv.stats.txns - t0, kv.stats.txnsSucceeded], [2, 4], 'one lost compare, then one commit (meta, the first ADD, this one)');
    assert.deepEqual(Object.keys(JSON.parse(kv.dump()[bk] as string).allocs), ['1', '2', '3']);
  });

  it('a round\'s DEL that empties a removed node\'s pendingRelease block (its last borrower) gives the block back in the round\'s transaction', async () => {
    const kv = new MemoryKV();
    const a = allocator(kv, 'node-a');
    const b = allocator(kv, 'node-b');
    const op = remover(kv);
    assert.equal(await one(b, 'b0'), '10.80.0.2');
    for (let i = 0; i < 15; i++) await one(a, `a${i}`); // node-a's block 10.80.0.16/28 full
    assert.equal(await one(a, 'borrower'), '10.80.0.3'); // borrowed in node-b's block
    await op.mark('node-b');
    assert.deepEqual(await op.finish('node-b'), { released: ['10.80.0.2'], deletedBlocks: [], keptBlocks: ['10.80.0.0-28'] });
    assert.deepEqual(await a.release([req('a0')]), [['10.80.0.16']]);
    const t0 = kv.stats.txns;
    const r = await a.batch([req('n1')], [req('borrower')]);
    assert.deepEqual([r.adds.map((x) => ips(x)), r.dels], [[['10.80.0.16']], [['10.80.0.3']]]);
    assert.equal(kv.stats.txns - t0, 1, 'one transaction: n1\'s allocation, the borrower\'s release and the give-back');
    const d = kv.dump();
    assert.equal(d[`${P}/blocks/10.80.0.0-28`], undefined, 'the removed node\'s emptied block is given back');
    assert.equal(d[`${P}/nodes/node-b/blocks/10.80.0.0-28`], undefined, 'with its affinity');
    assert.equal(d[`${P}/handles/borrower/eth0`], undefined);
    assert.notEqual(d[`${P}/removing/node-b`], undefined, 'the marker stays for --finish');
  });

  it('a round\'s DEL whose handle cannot be read is done alone after the round: the round commits the others, the DEL releases what readable blocks hold for it', async () => {
    const kv = new MemoryKV();
    const seen: CorruptSkip[] = [];
    const a = allocator(kv, 'node-a', SMALL, 28, undefined, (x) => seen.push(x));
    await a.add([req('c1'), req('c2')]);
    const hk = `${P}/handles/c1/eth0`;
    const bad = '{"v":1,"node":"node-a","network":"net1","at":1000,"ips":"x"}';
    kv.plant(hk, bad);
    const t0 = kv.stats.txns;
    const r = await a.batch([req('n1')], [req('c1'), req('c2')]);
    assert.deepEqual([r.adds.map((x) => ips(x)), r.dels], [[['10.80.0.18']], [['10.80.0.16'], ['10.80.0.17']]]);
    assert.equal(kv.stats.txns - t0, 3, 'the round on c1\'s cached handle (lost: the handle changed), the round on fresh reads (n1, c2), then c1\'s DEL by owner');
    assert.equal(kv.dump()[hk], bad, 'left as it is');
    assert.deepEqual(Object.keys(JSON.parse(kv.dump()[`${P}/blocks/10.80.0.16-28`] as string).allocs), ['2']);
    assert.deepEqual(seen, [
      { op: 'DEL', key: hk, why: '"ips" must be an array', action: "handle left as it is for an operator (the addresses it names cannot be read from it); allocations of c1/eth0 in the pool's readable blocks: 10.80.0.16, released" },
    ]);
  });

  it('a round\'s DEL of an address in a block that cannot be read keeps it in the handle (a stale cache re-read first), told once', async () => {
    const kv = new MemoryKV();
    const seen: CorruptSkip[] = [];
    const TWO = [[{ subnet: '10.80.0.0/27' }], [{ subnet: '10.80.1.0/27' }]];
    const a = allocator(kv, 'node-a', TWO, 28, undefined, (x) => seen.push(x));
    const [c1] = await a.add([req('c1')]);
    assert.deepEqual(ips(c1 as PoolAllocation[]), ['10.80.0.16', '10.80.1.16']);
    const bad = `${P}/blocks/10.80.1.16-28`;
    kv.plant(bad, '{"v":1,"cidr":"10.80.1.16/28"');
    const t0 = kv.stats.txns;
    const ok0 = kv.stats.txnsSucceeded;
    // The cached copy of the block is stale (its revision moved): that commit loses, the round is decided on fresh reads.
    assert.deepEqual(await a.release([req('c1')]), [['10.80.0.16']]);
    assert.deepEqual([kv.stats.txns - t0, kv.stats.txnsSucceeded - ok0], [2, 1]);
    assert.deepEqual(JSON.parse(kv.dump()[`${P}/handles/c1/eth0`] as string), { v: 1, node: 'node-a', network: 'net1', at: 1000, ips: [{ ip: '10.80.1.16', block: '10.80.1.16-28', ordinal: 0, seq: 1, rangeSet: 1 }] });
    assert.equal(kv.dump()[bad], '{"v":1,"cidr":"10.80.1.16/28"');
    assert.deepEqual(seen, [{ op: 'DEL', key: bad, why: 'not valid JSON', action: `10.80.1.16 of c1/eth0 not released (its block cannot be read): the handle ${P}/handles/c1/eth0 keeps it for an operator` }]);
  });

  it('a round of a node marked for removal loses its compare, vetoes, and commits on fresh reads', async () => {
    const kv = new MemoryKV();
    const a = allocator(kv, 'node-a');
    const op = remover(kv);
    await a.add([req('c1'), req('c2')]);
    await op.mark('node-a');
    assert.equal(JSON.parse(kv.dump()[`${P}/blocks/10.80.0.16-28`] as string).state, 'pendingRelease');
    const t0 = kv.stats.txns;
    const ok0 = kv.stats.txnsSucceeded;
    const r = await a.batch([req('c3')], [req('c1')]);
    assert.deepEqual([r.adds.map((x) => ips(x)), r.dels], [[['10.80.0.18']], [['10.80.0.16']]]);
    // The round on the cache (lost: the block's revision moved), the veto (the marker's delete, the block back to owned), the round again.
    assert.deepEqual([kv.stats.txns - t0, kv.stats.txnsSucceeded - ok0], [4, 3]);
    assert.equal(kv.dump()[`${P}/removing/node-a`], undefined, 'vetoed');
    const blk = JSON.parse(kv.dump()[`${P}/blocks/10.80.0.16-28`] as string);
    assert.deepEqual([blk.state, Object.keys(blk.allocs)], ['owned', ['1', '2']]);
  });

  it('a round of 12 ADDs and 12 DELs that would exceed etcd\'s 128 txn ops (/32 blocks) goes apart: the ADDs\' transaction, then the DELs\'', async () => {
    const kv = new MemoryKV();
    const a = allocator(kv, 'node-a', [[{ subnet: '10.80.1.0/24' }]], 32);
    const old = Array.from({ length: 12 }, (_, i) => req(`o${i}`));
    const first = await a.add(old);
    const oldIps = first.map((x) => ips(x)[0] as string);
    const t0 = kv.stats.txns;
    const r = await a.batch(Array.from({ length: 12 }, (_, i) => req(`n${i}`)), old);
    assert.deepEqual(r.dels, oldIps.map((ip) => [ip]));
    const newIps = r.adds.map((x) => ips(x)[0] as string);
    assert.equal(new Set([...newIps, ...oldIps]).size, 24, 'the ADDs were decided before the DELs freed anything');
    assert.deepEqual([kv.stats.txns - t0, kv.stats.txnsSucceeded], [2, 4]);
    const d = kv.dump();
    // Each DEL emptied a /32 that is not the node's last: given back with its affinity.
    assert.deepEqual(Object.keys(d).filter((k) => k.startsWith(`${P}/blocks/`)).length, 12);
    assert.deepEqual(Object.keys(d).filter((k) => k.startsWith(`${P}/nodes/node-a/blocks/`)).length, 12);
    assert.deepEqual(Object.keys(d).filter((k) => k.startsWith(`${P}/handles/`)).sort(), Array.from({ length: 12 }, (_, i) => `${P}/handles/n${i}/eth0`).sort());
  });

  it('a round\'s DEL on a cached block that lacks its allocation (a refill that wrote nothing cached what it read before an ADD committed) compares the block: the round is re-read and releases it', async () => {
    /** The memory KV that runs `hook` once, before the read of `key` (here: between a refill\'s reads and its caching). */
    class HookKV extends MemoryKV {
      hook: { key: string; run: () => Promise<void> } | null = null;
      override async get(key: string): Promise<KVEntry | null> {
        const h = this.hook;
        if (h !== null && h.key === key) {
          this.hook = null;
          await h.run();
        }
        return super.get(key);
      }
    }
    const kv = new HookKV();
    const a = allocator(kv, 'node-a');
    assert.equal(await one(a, 'c0'), '10.80.0.16');
    await a.refillReserve(2, 30);
    // The reserve is full: the next refill writes nothing; while it reads the removal marker, c1's ADD commits.
    let c1 = '';
    kv.hook = { key: `${P}/removing/node-a`, run: async () => void (c1 = await one(a, 'c1')) };
    await a.refillReserve(2, 30);
    assert.equal(c1, '10.80.0.19');
    const t0 = kv.stats.txns;
    const ok0 = kv.stats.txnsSucceeded;
    assert.deepEqual(await a.release([req('c1')]), [['10.80.0.19']]);
    assert.deepEqual([kv.stats.txns - t0, kv.stats.txnsSucceeded - ok0], [2, 1], 'the round on the stale cache lost its compare, then committed on fresh reads');
    const blk = JSON.parse(kv.dump()[`${P}/blocks/10.80.0.16-28`] as string);
    assert.deepEqual(Object.entries(blk.allocs as Record<string, { id: string; reserve?: true }>).map(([o, x]) => `${o}:${x.reserve === true ? 'reserve' : x.id}`), ['0:c0', '1:reserve', '2:reserve']);
    assert.equal(kv.dump()[`${P}/handles/c1/eth0`], undefined);
  });
});
