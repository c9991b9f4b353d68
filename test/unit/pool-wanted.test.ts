/**
 * Wanted ordinals (src/pool/wanted.ts, src/pool/rereserve.ts; docs/cluster.md "Re-reserving live
 * pods' addresses") on the memory KV, every value exact. The hole they close: after an etcd
 * restore, node n1's READY sandbox `sbS` uses address X while the restored pool says X is
 * container `gone`'s (a pod since deleted, its handle on node n2). n1's pass reports the conflict
 * and records sbS's want of X; n2's daemon then releases `gone` as a leak — and X must stay
 * unallocatable (no ADD, round, reserve refill hands it out; no give-back drops its block) until
 * n1's next pass re-reserves it for sbS and drops the want together.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { loadIPAMConfig } from '../../src/ipam/config.ts';
import { PoolAllocator } from '../../src/pool/allocator.ts';
import { decodeBlock, encodeBlock, type BlockValue } from '../../src/pool/model.ts';
import { dropStaleWants, podAddress, reReserve, type PodAddress } from '../../src/pool/rereserve.ts';
import { nodeHandles, handlesPrefix, releaseObserved } from '../../src/pool/reclaim.ts';
import { PoolRemoval } from '../../src/pool/removal.ts';
import { poolStatus } from '../../src/pool/status.ts';
import { isAppError } from '../../src/common/errors.ts';
import { MemoryKV } from '../../src/store/memory/memory-kv.ts';
import { checkLivePods, reReserveLivePods } from '../../src/reconcile/pool-rereserve.ts';

// Two /28 blocks: 10.86.0.0-28 (gateway .1: 14 addresses .2–.15) and 10.86.0.16-28 (15: .16–.30).
const conf = loadIPAMConfig(JSON.stringify({ cniVersion: '1.0.0', name: 'net1', ipam: { ranges: [[{ subnet: '10.86.0.0/27' }]] } }), undefined);
const SIZES = { blockSize4: 28, blockSize6: 122 };
const KEYS = { prefix: '/ipwarden', pool: 'wp' };
const B = '/ipwarden/pools/wp';

function alloc(kv: MemoryKV, node: string): PoolAllocator {
  return new PoolAllocator({ kv, ...KEYS, node, network: 'net1', rangeSets: conf.rangeSets, sizes: SIZES, now: () => 1_000, host: `h-${node}` });
}
const place = (ip: string): PodAddress => podAddress(ip, conf.rangeSets, SIZES) as PodAddress;
const scope = (kv: MemoryKV, node = 'n1', now = 2_000) => ({ kv, ...KEYS, node, host: `h-${node}`, network: 'net1', now: () => now });
async function json(kv: MemoryKV, key: string): Promise<unknown> {
  const e = await kv.get(key);
  return e === null ? null : JSON.parse(e.value);
}
async function one(a: PoolAllocator, id: string): Promise<string> {
  const [r] = await a.add([{ containerId: id, ifname: 'eth0' }]);
  if (!Array.isArray(r)) throw r;
  const x = r[0] as { ip: { value: bigint } };
  return `10.86.0.${Number(x.ip.value & 255n)}`;
}
/** Release `id`'s handle as n2's daemon does with a leak (src/pool/reclaim.ts releaseObserved). */
async function leakRelease(kv: MemoryKV, node: string, id: string): Promise<unknown> {
  const { handles } = nodeHandles(await kv.list(handlesPrefix(KEYS)), KEYS, node);
  const h = handles.find((x) => x.containerId === id);
  assert.ok(h !== undefined, `handle of ${id}`);
  return releaseObserved(kv, KEYS, node, h);
}

/**
 * The restore's state: n2 holds `gone` at X = 10.86.0.16 (the first address of its block
 * 10.86.0.16-28), n1's READY sandbox sbS uses X and n1's pass has recorded sbS's want.
 */
async function restored(kv: MemoryKV): Promise<PodAddress> {
  assert.equal(await one(alloc(kv, 'n2'), 'gone'), '10.86.0.16', 'n2 claims 10.86.0.16-28 (its name\'s hash)');
  const x = place('10.86.0.16');
  assert.deepEqual(await reReserve(scope(kv), 'sbS', x), { state: 'conflict', holder: 'container gone/eth0 of node n2 (seq 1)', wanted: 'written' });
  return x;
}

describe('wanted ordinals: the codec', () => {
  const key = `${B}/blocks/10.86.0.16-28`;
  const base = { v: 1, cidr: '10.86.0.16/28', rangeSet: 0, node: 'n2', state: 'owned', seq: 1, next: 1, allocs: { '0': { id: 'gone', ifname: 'eth0', node: 'n2', seq: 1, at: 1 } } };
  const entry = (o: unknown) => ({ key, value: JSON.stringify(o), modRevision: '1', createRevision: '1', version: '1' });
  it('decodes a want exactly and writes it back byte for byte; no "wanted" field when there is none', () => {
    const v = { ...base, wanted: { '0': { sandbox: 'sbS', node: 'n1', at: 2000 } } };
    const b = decodeBlock(entry(v), '10.86.0.16/28');
    assert.deepEqual(b.wanted, { '0': { sandbox: 'sbS', node: 'n1', at: 2000 } });
    assert.equal(encodeBlock(b), JSON.stringify(v));
    assert.equal(decodeBlock(entry(base), '10.86.0.16/28').wanted, undefined);
    assert.equal(encodeBlock({ ...(base as unknown as BlockValue), wanted: {} }), JSON.stringify(base), 'an empty map is never written');
  });
  it('refuses a want that does not decode exactly (STORE_CORRUPT naming the key and the field)', () => {
    const cases: Array<[unknown, string]> = [
      [{}, '"wanted" must be a non-empty object'],
      [[], '"wanted" must be a non-empty object'],
      [{ '16': { sandbox: 's', node: 'n1', at: 1 } }, 'want ordinal "16" is not an ordinal of a block of 16 addresses'],
      [{ '01': { sandbox: 's', node: 'n1', at: 1 } }, 'want ordinal "01" is not an ordinal of a block of 16 addresses'],
      [{ '3': { sandbox: 's', node: 'n1', at: 1, ip: 'x' } }, 'want 3: unknown field "ip" (known: sandbox, node, at)'],
      [{ '3': { sandbox: '', node: 'n1', at: 1 } }, 'want 3: "sandbox" must be a container ID'],
      [{ '3': { sandbox: 's', node: 'n 1', at: 1 } }, 'want 3: "node" must be a node name'],
      [{ '3': { sandbox: 's', node: 'n1', at: '1' } }, 'want 3: "at" must be a number'],
    ];
    for (const [w, why] of cases) assert.throws(() => decodeBlock(entry({ ...base, wanted: w }), '10.86.0.16/28'), (e: unknown) => isAppError(e, 'STORE_CORRUPT') && e.message === `etcd key ${key}: ${why}`, why);
  });
});

describe('wanted ordinals (memory KV)', () => {
  it('a conflict writes the want (block and index key, one transaction); a second pass writes nothing; the holder keeps the address', async () => {
    const kv = new MemoryKV();
    const x = await restored(kv);
    assert.deepEqual(await json(kv, `${B}/blocks/10.86.0.16-28`), {
      v: 1, cidr: '10.86.0.16/28', rangeSet: 0, node: 'n2', state: 'owned', seq: 1, next: 1,
      allocs: { '0': { id: 'gone', ifname: 'eth0', node: 'n2', seq: 1, at: 1_000 } },
      wanted: { '0': { sandbox: 'sbS', node: 'n1', at: 2_000 } },
    });
    assert.deepEqual(await json(kv, `${B}/wanted/n1/10.86.0.16-28/0`), { v: 1, sandbox: 'sbS', ip: '10.86.0.16', at: 2_000 });
    const rev = (await kv.get(`${B}/blocks/10.86.0.16-28`))?.modRevision;
    assert.deepEqual(await reReserve(scope(kv), 'sbS', x), { state: 'conflict', holder: 'container gone/eth0 of node n2 (seq 1)', wanted: 'mine' });
    assert.equal((await kv.get(`${B}/blocks/10.86.0.16-28`))?.modRevision, rev, 'nothing written');
    // At most one want per address: another sandbox's is a conflict, and writes nothing.
    assert.deepEqual(await reReserve(scope(kv, 'n3'), 'sbT', x), { state: 'conflict', holder: 'container gone/eth0 of node n2 (seq 1)', wanted: 'other' });
    assert.equal((await kv.get(`${B}/blocks/10.86.0.16-28`))?.modRevision, rev, 'nothing written');
    assert.equal(await kv.get(`${B}/wanted/n3/10.86.0.16-28/0`), null);
  });

  it('the holder released as a leak: X stays unallocatable — an ADD on another node, and the owner\'s own ADDs, get other addresses; pool status counts it as not free', async () => {
    const kv = new MemoryKV();
    await restored(kv);
    assert.deepEqual(await leakRelease(kv, 'n2', 'gone'), { released: true, ips: ['10.86.0.16'], revision: '5' });
    const blk = (await json(kv, `${B}/blocks/10.86.0.16-28`)) as { allocs: object; wanted: object };
    assert.deepEqual([blk.allocs, blk.wanted], [{}, { '0': { sandbox: 'sbS', node: 'n1', at: 2_000 } }], 'released, still wanted');
    // n2 fills its block: X is skipped, round robin wraps around past it (14 addresses .17–.30).
    const n2 = alloc(kv, 'n2');
    const got: string[] = [];
    for (let i = 0; i < 14; i++) got.push(await one(n2, `p${i}`));
    assert.deepEqual(got, Array.from({ length: 14 }, (_, i) => `10.86.0.${17 + i}`));
    // Its block has no free address now: the next ADD claims the other block, not X.
    assert.equal(await one(n2, 'p14'), '10.86.0.2');
    // n3 finds both blocks claimed and borrows: from n2's other block, never X.
    assert.equal(await one(alloc(kv, 'n3'), 'q0'), '10.86.0.3');
    const s = await poolStatus(kv, KEYS.prefix, KEYS.pool);
    assert.deepEqual(s.rangeSets, [{ index: 0, ranges: '10.86.0.1-10.86.0.30', size: '29', used: 16, reserved: 0, unreadable: 0, pendingRelease: 0, wanted: 1, free: '12', blocksClaimed: 2 }]);
    // The offline reserve refill (another path that picks free ordinals) skips it too.
    const { slots } = await n2.refillReserve(1, 30);
    assert.deepEqual(slots.map((y) => String(y.ip)), ['10.86.0.4']);
    // And pool leaks says so on n1.
    assert.deepEqual(await checkLivePods({ kv, ...KEYS, node: 'n1' }, [{ sandbox: 'sbS', ips: ['10.86.0.16'] }], []), [
      { sandbox: 'sbS', ip: '10.86.0.16', state: 'missing', reason: 'no allocation or handle in the pool (free in block 10.86.0.16-28): the node\'s daemon re-reserves it on its next pass' },
    ]);
  });

  it('n1\'s next pass re-reserves X for sbS and drops the want and its index key in the same transaction', async () => {
    const kv = new MemoryKV();
    await restored(kv);
    await leakRelease(kv, 'n2', 'gone');
    const t = { kv, ...KEYS, node: 'n1', networks: ['net1'] };
    const r = await reReserveLivePods(t, [{ sandbox: 'sbS', ips: ['10.86.0.16'] }], [], 'h-n1', () => 3_000, true);
    assert.deepEqual(r, { reReserved: [{ pool: 'wp', node: 'n1', network: 'net1', sandbox: 'sbS', ip: '10.86.0.16', block: '10.86.0.16-28', claimed: false, revision: '6', wanted: true }], errors: [], wants: [] });
    assert.deepEqual(await json(kv, `${B}/blocks/10.86.0.16-28`), { v: 1, cidr: '10.86.0.16/28', rangeSet: 0, node: 'n2', state: 'owned', seq: 2, next: 1, allocs: { '0': { id: 'sbS', ifname: 'eth0', node: 'n1', seq: 2, at: 3_000 } } });
    assert.equal(await kv.get(`${B}/wanted/n1/10.86.0.16-28/0`), null);
    assert.deepEqual(await json(kv, `${B}/handles/sbS/eth0`), { v: 1, node: 'n1', network: 'net1', at: 3_000, ips: [{ ip: '10.86.0.16', block: '10.86.0.16-28', ordinal: 0, seq: 2, rangeSet: 0 }], host: 'h-n1' });
  });

  it('the pass: a conflict reports the want written (log/metric event), and the conflict message says the address is wanted', async () => {
    const kv = new MemoryKV();
    await one(alloc(kv, 'n2'), 'gone');
    const t = { kv, ...KEYS, node: 'n1', networks: ['net1'] };
    const r = await reReserveLivePods(t, [{ sandbox: 'sbS', ips: ['10.86.0.16'] }], [], 'h-n1', () => 2_000, true);
    assert.deepEqual(r.wants, [{ event: 'written', pool: 'wp', node: 'n1', sandbox: 'sbS', ip: '10.86.0.16', block: '10.86.0.16-28' }]);
    assert.deepEqual(r.errors, [
      { kind: 'conflict', pool: 'wp', message: 'pool wp: address 10.86.0.16 of ready sandbox sbS is held by container gone/eth0 of node n2 (seq 1): a duplicate address — not re-reserved, nothing taken from the holder; the address is wanted by this sandbox: no other pod gets it, and it is re-reserved when its holder releases it' },
    ]);
    assert.deepEqual(await checkLivePods(t, [{ sandbox: 'sbS', ips: ['10.86.0.16'] }], []), [
      { sandbox: 'sbS', ip: '10.86.0.16', state: 'conflict', reason: 'held by container gone/eth0 of node n2 (seq 1): a duplicate address; the address is wanted by this sandbox: no other pod gets it, and it is re-reserved when its holder releases it' },
    ]);
  });

  it('sbS no longer READY: n1\'s pass drops its own want (only with a whole runtime answer); another node\'s want stays', async () => {
    const kv = new MemoryKV();
    await restored(kv);
    // n3's sandbox wants another address of n2's (a second holder, a second want).
    await one(alloc(kv, 'n2'), 'gone2');
    assert.deepEqual(await reReserve(scope(kv, 'n3'), 'sbU', place('10.86.0.17')), { state: 'conflict', holder: 'container gone2/eth0 of node n2 (seq 2)', wanted: 'written' });
    const t = { kv, ...KEYS, node: 'n1', networks: ['net1'] };
    assert.deepEqual(await reReserveLivePods(t, [], [], 'h-n1', () => 3_000, false), { reReserved: [], errors: [], wants: [] }, 'a READY sandbox\'s status unknown: nothing dropped');
    assert.deepEqual(await reReserveLivePods(t, [{ sandbox: 'sbS', ips: ['10.86.0.16'] }], [], 'h-n1', () => 3_000, true).then((r) => r.wants), [], 'still READY with X: kept');
    assert.deepEqual(await reReserveLivePods(t, [{ sandbox: 'other', ips: ['10.86.0.5'] }], [], 'h-n1', () => 3_000, true).then((r) => r.wants), [{ event: 'dropped', pool: 'wp', node: 'n1', sandbox: 'sbS', ip: '10.86.0.16', block: '10.86.0.16-28' }]);
    assert.deepEqual(((await json(kv, `${B}/blocks/10.86.0.16-28`)) as { wanted: unknown }).wanted, { '1': { sandbox: 'sbU', node: 'n3', at: 2_000 } }, 'n3\'s want stays');
    assert.equal(await kv.get(`${B}/wanted/n1/10.86.0.16-28/0`), null);
    // Once released, X is an ordinary free address again.
    await leakRelease(kv, 'n2', 'gone');
    assert.deepEqual(await dropStaleWants(kv, KEYS, 'n1', new Map()), []);
    const s = await poolStatus(kv, KEYS.prefix, KEYS.pool);
    // Used: gone2 (.17, wanted by n3: counted as used, not twice) and .5, re-reserved by that pass for `other`.
    assert.deepEqual([s.rangeSets[0]?.used, s.rangeSets[0]?.wanted, s.rangeSets[0]?.free], [2, undefined, '27'], 'X free again');
  });

  it('a block with a want is never given back: not by its owner\'s DEL emptying it, not by a DEL emptying a removed node\'s block, not by --finish', async () => {
    const kv = new MemoryKV();
    await restored(kv);
    const n2 = alloc(kv, 'n2');
    // n2 gets a second block, so its first one may be given back when emptied.
    for (let i = 0; i < 14; i++) await one(n2, `p${i}`);
    assert.equal(await one(n2, 'p14'), '10.86.0.2');
    for (let i = 0; i < 14; i++) await n2.del({ containerId: `p${i}`, ifname: 'eth0' });
    assert.deepEqual(await n2.del({ containerId: 'gone', ifname: 'eth0' }), ['10.86.0.16']);
    assert.deepEqual(await json(kv, `${B}/nodes/n2/blocks/10.86.0.16-28`), { v: 1, rangeSet: 0 }, 'emptied of allocations, wanted: kept');
    assert.deepEqual(((await json(kv, `${B}/blocks/10.86.0.16-28`)) as { allocs: object; wanted: object }).wanted, { '0': { sandbox: 'sbS', node: 'n1', at: 2_000 } });
    // n2 removed: --finish keeps the wanted block (pendingRelease), and the marker with it.
    const op = new PoolRemoval({ kv, ...KEYS });
    assert.deepEqual(await op.mark('n2'), ['10.86.0.0-28', '10.86.0.16-28']);
    assert.deepEqual(await op.finish('n2'), { released: ['10.86.0.2'], deletedBlocks: ['10.86.0.0-28'], keptBlocks: ['10.86.0.16-28'] });
    assert.notEqual(await kv.get(`${B}/removing/n2`), null);
    // A borrowed allocation in it (another node's pod, as a borrow before the removal leaves it),
    // released by its DEL: the block is emptied of allocations but wanted, so it is not given back.
    const bk = `${B}/blocks/10.86.0.16-28`;
    const bv = (await json(kv, bk)) as { seq: number; allocs: Record<string, unknown> };
    bv.seq += 1;
    bv.allocs['5'] = { id: 'b1', ifname: 'eth0', node: 'n3', seq: bv.seq, at: 1 };
    kv.apply([], [
      { put: bk, value: JSON.stringify(bv) },
      { put: `${B}/handles/b1/eth0`, value: JSON.stringify({ v: 1, node: 'n3', network: 'net1', at: 1, ips: [{ ip: '10.86.0.21', block: '10.86.0.16-28', ordinal: 5, seq: bv.seq, rangeSet: 0 }], host: 'h-n3' }) },
    ]);
    assert.deepEqual(await alloc(kv, 'n3').del({ containerId: 'b1', ifname: 'eth0' }), ['10.86.0.21']);
    const kept = (await json(kv, bk)) as { state: string; allocs: object; wanted: object };
    assert.deepEqual([kept.state, kept.allocs, kept.wanted], ['pendingRelease', {}, { '0': { sandbox: 'sbS', node: 'n1', at: 2_000 } }]);
    assert.deepEqual(await json(kv, `${B}/nodes/n2/blocks/10.86.0.16-28`), { v: 1, rangeSet: 0 });
    // n1's pass re-reserves X in the removed node's block; the block stays until sbS's DEL.
    const r = await reReserve(scope(kv, 'n1', 4_000), 'sbS', place('10.86.0.16'));
    assert.deepEqual([r.state, 'wanted' in r ? r.wanted : null], ['re-reserved', true]);
    assert.deepEqual(await alloc(kv, 'n1').del({ containerId: 'sbS', ifname: 'eth0' }), ['10.86.0.16']);
    assert.equal(await kv.get(`${B}/blocks/10.86.0.16-28`), null, 'emptied of its last holder: given back');
  });

  it('pool remove-node --finish of the wanting node drops its wants', async () => {
    const kv = new MemoryKV();
    await restored(kv);
    await one(alloc(kv, 'n1'), 'own'); // n1 holds something in the pool (else step 1 refuses)
    const op = new PoolRemoval({ kv, ...KEYS });
    await op.mark('n1');
    const f = await op.finish('n1');
    assert.deepEqual(f, { released: ['10.86.0.2'], deletedBlocks: ['10.86.0.0-28'], keptBlocks: [] });
    assert.equal(((await json(kv, `${B}/blocks/10.86.0.16-28`)) as { wanted?: unknown }).wanted, undefined);
    assert.deepEqual(await kv.list(`${B}/wanted/`), []);
    // The holder's release now frees X for anyone.
    await leakRelease(kv, 'n2', 'gone');
    assert.equal(await one(alloc(kv, 'n3'), 'q0'), '10.86.0.2');
  });
});
