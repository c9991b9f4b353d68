/**
 * Wants on reserve entries (docs/cluster.md "Re-reserving live pods' addresses", "Offline
 * allocation"), on the memory KV, every value exact: a live pod of node n1 uses address X, which
 * the pool holds as a reserve entry of node n2. X must never be handed out by n2 offline: n2's
 * refill deletes the entry (and lists it in no slot), a journal entry that already took it syncs
 * as a conflict (never an allocation), and `remove-node --finish` of n2 strips n2's reserve
 * entries from the block the want keeps, so n1's next pass re-reserves X.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { loadIPAMConfig } from '../../src/ipam/config.ts';
import { PoolAllocator } from '../../src/pool/allocator.ts';
import type { JournalEntry } from '../../src/pool/offline.ts';
import { PoolRemoval } from '../../src/pool/removal.ts';
import { dropStaleWants, podAddress, reReserve, type PodAddress } from '../../src/pool/rereserve.ts';
import { MemoryKV } from '../../src/store/memory/memory-kv.ts';

// Two /28 blocks: 10.86.0.0-28 (gateway .1: .2–.15) and 10.86.0.16-28 (.16–.30); n2 claims 10.86.0.16-28.
const conf = loadIPAMConfig(JSON.stringify({ cniVersion: '1.0.0', name: 'net1', ipam: { ranges: [[{ subnet: '10.86.0.0/27' }]] } }), undefined);
const SIZES = { blockSize4: 28, blockSize6: 122 };
const KEYS = { prefix: '/ipwarden', pool: 'wp' };
const B = '/ipwarden/pools/wp';
const BK = `${B}/blocks/10.86.0.16-28`;

const alloc = (kv: MemoryKV, node: string): PoolAllocator => new PoolAllocator({ kv, ...KEYS, node, network: 'net1', rangeSets: conf.rangeSets, sizes: SIZES, now: () => 1_000, host: `h-${node}` });
const scope = (kv: MemoryKV, node = 'n1', now = 2_000) => ({ kv, ...KEYS, node, host: `h-${node}`, network: 'net1', now: () => now });
const X = (): PodAddress => podAddress('10.86.0.16', conf.rangeSets, SIZES) as PodAddress;
async function json(kv: MemoryKV, key: string): Promise<unknown> {
  const e = await kv.get(key);
  return e === null ? null : JSON.parse(e.value);
}

/** n2 keeps two reserve entries (.16 and .17); n1's sandbox sbS uses .16: the want is written. */
async function wantOnReserve(kv: MemoryKV): Promise<PoolAllocator> {
  const n2 = alloc(kv, 'n2');
  assert.deepEqual((await n2.refillReserve(2, 60)).slots.map((s) => s.ip), ['10.86.0.16', '10.86.0.17']);
  assert.deepEqual(await reReserve(scope(kv), 'sbS', X()), { state: 'conflict', holder: 'a reserve entry of node n2 (offline allocation)', wanted: 'written' });
  return n2;
}

describe('wants on reserve entries', () => {
  it("a refill deletes this node's reserve entry at a wanted ordinal and lists it in no slot", async () => {
    const kv = new MemoryKV();
    const n2 = await wantOnReserve(kv);
    const r = await n2.refillReserve(2, 60);
    assert.deepEqual(r.slots.map((s) => s.ip), ['10.86.0.17', '10.86.0.18']);
    assert.deepEqual(r.short, [0]);
    assert.deepEqual(await json(kv, BK), {
      v: 1,
      cidr: '10.86.0.16/28',
      rangeSet: 0,
      node: 'n2',
      state: 'owned',
      seq: 3,
      next: 3,
      allocs: {
        '1': { id: '', ifname: '', node: 'n2', seq: 2, at: 1_000, reserve: true },
        '2': { id: '', ifname: '', node: 'n2', seq: 3, at: 1_000, reserve: true },
      },
      wanted: { '0': { sandbox: 'sbS', node: 'n1', at: 2_000 } },
    });
    // n1's next pass re-reserves X for sbS (the address is free and wanted).
    const again = await reReserve(scope(kv, 'n1', 3_000), 'sbS', X());
    assert.deepEqual([again.state, 'wanted' in again ? again.wanted : null], ['re-reserved', true]);
  });

  it('a journal entry on a reserve entry wanted meanwhile syncs as a conflict, allocating nothing', async () => {
    const kv = new MemoryKV();
    const n2 = alloc(kv, 'n2');
    const slots = (await n2.refillReserve(2, 60)).slots;
    // n2, cut off, hands out .16 (its journal entry); then n1's pass writes the want of .16.
    const e = { v: 1, kind: 'add', network: 'net1', node: 'n2', containerId: 'off1', ifname: 'eth0', at: 1_500, ips: [slots[0]] } as unknown as JournalEntry;
    assert.deepEqual(await reReserve(scope(kv), 'sbS', X()), { state: 'conflict', holder: 'a reserve entry of node n2 (offline allocation)', wanted: 'written' });
    const before = await kv.get(BK);
    assert.deepEqual(await n2.syncJournalEntry(e), {
      gone: 'reserve entry 10.86.0.16 (block 10.86.0.16-28, sequence 1) is wanted by sandbox sbS of node n1 (a live pod uses the address): not allocated',
    });
    assert.deepEqual(await kv.get(BK), before, 'the block is not written');
    assert.equal(await kv.get(`${B}/handles/off1/eth0`), null, 'no handle');
  });

  it("remove-node --finish strips the removed node's reserve entries from a block kept for a want; the want is then fulfilled", async () => {
    const kv = new MemoryKV();
    await wantOnReserve(kv);
    const op = new PoolRemoval({ kv, ...KEYS });
    assert.deepEqual(await op.mark('n2'), ['10.86.0.16-28']);
    assert.deepEqual(await op.finish('n2'), { released: [], deletedBlocks: [], keptBlocks: ['10.86.0.16-28'] });
    const kept = (await json(kv, BK)) as { state: string; allocs: object; wanted: object };
    assert.deepEqual([kept.state, kept.allocs, kept.wanted], ['pendingRelease', {}, { '0': { sandbox: 'sbS', node: 'n1', at: 2_000 } }]);
    const r = await reReserve(scope(kv, 'n1', 3_000), 'sbS', X());
    assert.deepEqual([r.state, 'wanted' in r ? r.wanted : null], ['re-reserved', true]);
    assert.deepEqual(((await json(kv, BK)) as { allocs: object }).allocs, { '0': { id: 'sbS', ifname: 'eth0', node: 'n1', seq: 3, at: 3_000 } });
  });
});

describe('wants: the drop and the write', () => {
  /** n2 holds `gone` at .16; n1's sandbox sbS uses .16: the want is written. */
  async function wantOnAllocation(kv: MemoryKV): Promise<void> {
    const [r] = await alloc(kv, 'n2').add([{ containerId: 'gone', ifname: 'eth0' }]);
    assert.ok(Array.isArray(r));
    assert.deepEqual(await reReserve(scope(kv), 'sbS', X()), { state: 'conflict', holder: 'container gone/eth0 of node n2 (seq 1)', wanted: 'written' });
  }

  it("a drop that leaves a removed node's pendingRelease block holding nothing gives the block back", async () => {
    const kv = new MemoryKV();
    await wantOnAllocation(kv);
    const op = new PoolRemoval({ kv, ...KEYS });
    assert.deepEqual(await op.mark('n2'), ['10.86.0.16-28']);
    assert.deepEqual(await op.finish('n2'), { released: ['10.86.0.16'], deletedBlocks: [], keptBlocks: ['10.86.0.16-28'] });
    // The runtime lists nothing, but the kernel shows the address configured in a namespace: kept.
    assert.deepEqual(await dropStaleWants(kv, KEYS, 'n1', new Map(), (ip) => ip === '10.86.0.16'), [{ want: { block: '10.86.0.16-28', ordinal: 0, ip: '10.86.0.16', sandbox: 'sbS' }, outcome: 'kept' }]);
    // sbS is gone from n1: its pass drops the want, and the block (empty, its node removed) goes back.
    assert.deepEqual(await dropStaleWants(kv, KEYS, 'n1', new Map()), [{ want: { block: '10.86.0.16-28', ordinal: 0, ip: '10.86.0.16', sandbox: 'sbS' }, outcome: 'dropped' }]);
    assert.equal(await kv.get(BK), null);
    assert.equal(await kv.get(`${B}/nodes/n2/blocks/10.86.0.16-28`), null);
    assert.deepEqual(await kv.list(`${B}/wanted/`), []);
    // The next --finish completes the removal: marker gone.
    assert.deepEqual(await op.finish('n2'), { released: [], deletedBlocks: [], keptBlocks: [] });
    assert.equal(await kv.get(`${B}/removing/n2`), null);
  });

  it("the stale-want drop compares the runtime's addresses in canonical form", async () => {
    const conf6 = loadIPAMConfig(JSON.stringify({ cniVersion: '1.0.0', name: 'net1', ipam: { ranges: [[{ subnet: 'fd86::/120' }]] } }), undefined);
    const kv = new MemoryKV();
    const n2 = new PoolAllocator({ kv, ...KEYS, node: 'n2', network: 'net1', rangeSets: conf6.rangeSets, sizes: SIZES, now: () => 1_000, host: 'h-n2' });
    const [r] = await n2.add([{ containerId: 'gone', ifname: 'eth0' }]);
    assert.ok(Array.isArray(r));
    const ip = podAddress('fd86::40', conf6.rangeSets, SIZES) as PodAddress; // n2 claimed fd86::40-122 (its name's hash)
    assert.deepEqual(await reReserve(scope(kv), 'sbS', ip), { state: 'conflict', holder: 'container gone/eth0 of node n2 (seq 1)', wanted: 'written' });
    // The runtime reports the address in another spelling: the want is kept.
    assert.deepEqual(await dropStaleWants(kv, KEYS, 'n1', new Map([['sbS', [' FD86:0:0::40 ']]])), [{ want: { block: 'fd86::40-122', ordinal: 0, ip: 'fd86::40', sandbox: 'sbS' }, outcome: 'kept' }]);
  });

  it('the want write compares the sandbox handle absent: a handle written meanwhile makes it decide again, writing no want', async () => {
    const kv = new MemoryKV();
    const [r] = await alloc(kv, 'n2').add([{ containerId: 'gone', ifname: 'eth0' }]);
    assert.ok(Array.isArray(r));
    let planted = false;
    kv.beforeTxn = () => {
      if (planted) return;
      planted = true;
      kv.apply([], [{ put: `${B}/handles/sbS/eth0`, value: JSON.stringify({ v: 1, node: 'n1', network: 'net1', at: 1, ips: [], host: 'h-n1' }) }]);
    };
    assert.deepEqual(await reReserve(scope(kv), 'sbS', X()), { state: 'conflict', holder: 'container gone/eth0 of node n2 (seq 1)' });
    assert.equal(((await json(kv, BK)) as { wanted?: unknown }).wanted, undefined);
    assert.deepEqual(await kv.list(`${B}/wanted/`), []);
  });

  it('a sandbox ID that is not a CNI container ID is skipped, nothing written', async () => {
    const kv = new MemoryKV();
    const [r] = await alloc(kv, 'n2').add([{ containerId: 'gone', ifname: 'eth0' }]);
    assert.ok(Array.isArray(r));
    const before = await kv.list(`${B}/`);
    assert.deepEqual(await reReserve(scope(kv), 'sb S', X()), { state: 'skipped', why: 'sandbox ID "sb S" is not a valid CNI container ID: nothing written' });
    assert.deepEqual(await reReserve(scope(kv), '-x', podAddress('10.86.0.20', conf.rangeSets, SIZES) as PodAddress), { state: 'skipped', why: 'sandbox ID "-x" is not a valid CNI container ID: nothing written' });
    assert.deepEqual(await kv.list(`${B}/`), before);
  });
});
