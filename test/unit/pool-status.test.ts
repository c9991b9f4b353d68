/**
 * The status model of a cluster pool (src/ipam/pool-status.ts `poolStatus`) on a memory KV with
 * the real allocator: exact blocks per node, usage, borrowed addresses and free counts, the
 * heartbeat flag; a heartbeat key that names no node is corrupt; a pool never used is not found.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { AppError, isAppError } from '../../src/common/errors.ts';
import { loadIPAMConfig } from '../../src/ipam/config.ts';
import { PoolAllocator, type PoolAllocation } from '../../src/ipam/pool-allocator.ts';
import { poolStatus } from '../../src/ipam/pool-status.ts';
import { MemoryKV } from '../../src/store/memory/memory-kv.ts';

const P = '/ipwarden/pools/p1';

function allocator(kv: MemoryKV, node: string): PoolAllocator {
  // A /27 as two /28 blocks: 10.84.0.0/28 (.2–.15: .1 is the gateway) and 10.84.0.16/28 (.16–.30).
  const c = loadIPAMConfig(JSON.stringify({ cniVersion: '1.0.0', name: 'net1', ipam: { ranges: [[{ subnet: '10.84.0.0/27' }]] } }), undefined);
  return new PoolAllocator({ kv, pool: 'p1', prefix: '/ipwarden', node, network: 'net1', rangeSets: c.rangeSets, sizes: { blockSize4: 28, blockSize6: 122 }, now: () => 1000 });
}

async function add(a: PoolAllocator, id: string): Promise<void> {
  const [r] = await a.add([{ containerId: id, ifname: 'eth0' }]);
  if (r instanceof AppError) throw r;
  assert.equal((r as PoolAllocation[]).length, 1);
}

describe('poolStatus (memory KV)', () => {
  it('blocks per node, used, borrowed, free and the heartbeat, exactly', async () => {
    const kv = new MemoryKV();
    const a = allocator(kv, 'node-a');
    const b = allocator(kv, 'node-b');
    await add(a, 'a1');
    await add(a, 'a2');
    await add(b, 'b1');
    // Both blocks are claimed: a third node borrows (in the block with the most free addresses).
    await add(allocator(kv, 'node-c'), 'c1');
    await kv.txn([], [{ put: `${P}/alive/node-a`, value: '{"v":1,"node":"node-a","since":1}' }]);
    // Which block a node claims is decided by a hash of its name (src/ipam/pool-allocator.ts): fixed.
    assert.deepEqual(await poolStatus(kv, '/ipwarden', 'p1'), {
      version: 1,
      pool: 'p1',
      blockSize: 28,
      blockSize6: 122,
      rangeSets: [{ index: 0, ranges: '10.84.0.1-10.84.0.30', size: '29', used: 4, free: '25', blocksClaimed: 2 }],
      nodes: [
        { node: 'node-a', blocks: 1, capacity: 15, used: 2, borrowed: 0, alive: true },
        { node: 'node-b', blocks: 1, capacity: 14, used: 1, borrowed: 0, alive: false },
        { node: 'node-c', blocks: 0, capacity: 0, used: 1, borrowed: 1, alive: false },
      ],
      blocks: [
        { cidr: '10.84.0.0/28', rangeSet: 0, node: 'node-b', state: 'owned', capacity: 14, used: 2, borrowed: 1 },
        { cidr: '10.84.0.16/28', rangeSet: 0, node: 'node-a', state: 'owned', capacity: 15, used: 2, borrowed: 0 },
      ],
    });
  });

  it('a heartbeat key whose node part is not a node name is corrupt, naming the key', async () => {
    const kv = new MemoryKV();
    await add(allocator(kv, 'node-a'), 'a1');
    await kv.txn([], [{ put: `${P}/alive/<script>x`, value: '{}' }]);
    await assert.rejects(poolStatus(kv, '/ipwarden', 'p1'), (e: unknown) => isAppError(e, 'STORE_CORRUPT') && e.message === `etcd key ${P}/alive/<script>x: not the heartbeat key of a node name`);
  });

  it('a pool never used is IPAM_NOT_FOUND', async () => {
    await assert.rejects(poolStatus(new MemoryKV(), '/ipwarden', 'nope'), (e: unknown) => isAppError(e, 'IPAM_NOT_FOUND') && e.message === 'pool nope has no data in memory under /ipwarden (no /ipwarden/pools/nope/meta key: never used)');
  });
});
