/**
 * The status model of a cluster pool (src/pool/status.ts `poolStatus`) on a memory KV with
 * the real allocator: exact blocks per node, usage, borrowed addresses and free counts, the
 * heartbeat flag; a heartbeat key that names no node is corrupt; a pool never used is not found.
 * Reserve entries (ipam.pool.offline) counted as reserved, never used; the heartbeat state
 * yes / expired / never; blocks sorted by address, not as text.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { AppError, isAppError } from '../../src/common/errors.ts';
import { loadIPAMConfig } from '../../src/ipam/config.ts';
import { PoolAllocator, type PoolAllocation } from '../../src/pool/allocator.ts';
import { nodeHeartbeat, poolStatus } from '../../src/pool/status.ts';
import { poolStatusTable } from '../../src/cli/pool.ts';
import { MemoryKV } from '../../src/store/memory/memory-kv.ts';
import { hostname } from 'node:os';
import { PoolSessions } from '../../src/daemon/pool-sessions.ts';

const P = '/ipwarden/pools/p1';

/** A memory KV that the sessions' close() leaves open (the test reads it afterwards). */
class SharedKV extends MemoryKV {
  override async close(): Promise<void> {}
}

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
  it('last seen: the node\'s seen/<node> record in --json (absent without one) and the table (now with a live heartbeat, UTC time, or -)', async () => {
    const kv = new MemoryKV();
    await add(allocator(kv, 'node-a'), 'a1');
    await add(allocator(kv, 'node-b'), 'b1');
    await add(allocator(kv, 'node-c'), 'c1');
    await kv.txn([], [
      { put: `${P}/alive/node-a`, value: '{"v":1,"node":"node-a","since":1}' },
      { put: `${P}/seen/node-a`, value: '{"v":1,"node":"node-a","at":1764990000000}' },
      { put: `${P}/nodes/node-b/settings`, value: '{"v":1,"offlineSeconds":0}' },
      { put: `${P}/seen/node-b`, value: '{"v":1,"node":"node-b","at":1764990123456}' },
    ]);
    const s = await poolStatus(kv, '/ipwarden', 'p1');
    assert.deepEqual(s.nodes.map((n) => [n.node, n.heartbeat, n.lastSeen]), [['node-a', 'yes', 1764990000000], ['node-b', 'expired', 1764990123456], ['node-c', 'never', undefined]]);
    assert.equal('lastSeen' in (s.nodes[2] ?? {}), false);
    const rows = poolStatusTable(s).split('\n').filter((l) => l.startsWith('NODE') || /^node-/.test(l));
    assert.deepEqual(rows, [
      'NODE    BLOCKS  CAPACITY  USED  BORROWED  RESERVED  HEARTBEAT  LAST SEEN             SOURCE',
      'node-a  1       15        1     0         0         yes        now                   -',
      'node-b  1       14        1     0         0         expired    2025-12-06T03:02:03Z  -',
      'node-c  0       0         1     1         0         never      -                     -',
    ]);
  });

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
    // Which block a node claims is decided by a hash of its name (src/pool/allocator.ts): fixed.
    assert.deepEqual(await poolStatus(kv, '/ipwarden', 'p1'), {
      version: 1,
      pool: 'p1',
      blockSize: 28,
      blockSize6: 122,
      rangeSets: [{ index: 0, ranges: '10.84.0.1-10.84.0.30', size: '29', used: 4, reserved: 0, unreadable: 0, pendingRelease: 0, free: '25', blocksClaimed: 2 }],
      nodes: [
        { node: 'node-a', blocks: 1, capacity: 15, used: 2, borrowed: 0, reserved: 0, alive: true, heartbeat: 'yes', source: null },
        { node: 'node-b', blocks: 1, capacity: 14, used: 1, borrowed: 0, reserved: 0, alive: false, heartbeat: 'never', source: null },
        { node: 'node-c', blocks: 0, capacity: 0, used: 1, borrowed: 1, reserved: 0, alive: false, heartbeat: 'never', source: null },
      ],
      blocks: [
        { cidr: '10.84.0.0/28', rangeSet: 0, node: 'node-b', state: 'owned', capacity: 14, used: 2, borrowed: 1, reserved: 0 },
        { cidr: '10.84.0.16/28', rangeSet: 0, node: 'node-a', state: 'owned', capacity: 15, used: 2, borrowed: 0, reserved: 0 },
      ],
      corrupt: [],
      overlaps: [],
    });
  });

  it('a heartbeat key whose node part is not a node name is listed as corrupt, naming the key; the rest is counted', async () => {
    const kv = new MemoryKV();
    await add(allocator(kv, 'node-a'), 'a1');
    await kv.txn([], [{ put: `${P}/alive/<script>x`, value: '{}' }]);
    const s = await poolStatus(kv, '/ipwarden', 'p1');
    assert.deepEqual(s.corrupt, [{ key: `${P}/alive/<script>x`, why: 'not the heartbeat key of a node name' }]);
    assert.deepEqual(s.nodes.map((n) => n.node), ['node-a']);
    assert.equal(s.rangeSets[0]?.used, 1);
  });

  it('reserve entries are counted as reserved per range set, node and block, never as used; free is what is neither', async () => {
    const kv = new MemoryKV();
    const a = allocator(kv, 'node-a');
    await add(a, 'a1');
    await add(allocator(kv, 'node-b'), 'b1');
    // Two reserve entries of node-a in its block (as the daemon's refill writes them), beside a1.
    const key = `${P}/blocks/10.84.0.16-28`;
    const e = await kv.get(key);
    const v = JSON.parse((e as { value: string }).value);
    v.seq = 3;
    v.allocs['5'] = { id: '', ifname: '', node: 'node-a', seq: 2, at: 1, reserve: true };
    v.allocs['6'] = { id: '', ifname: '', node: 'node-a', seq: 3, at: 1, reserve: true };
    await kv.txn([], [{ put: key, value: JSON.stringify(v) }, { put: `${P}/nodes/node-a/settings`, value: '{"v":1,"offlineSeconds":30}' }]);
    const s = await poolStatus(kv, '/ipwarden', 'p1');
    assert.deepEqual(s.rangeSets, [{ index: 0, ranges: '10.84.0.1-10.84.0.30', size: '29', used: 2, reserved: 2, unreadable: 0, pendingRelease: 0, free: '25', blocksClaimed: 2 }]);
    assert.deepEqual(s.nodes, [
      { node: 'node-a', blocks: 1, capacity: 15, used: 1, borrowed: 0, reserved: 2, alive: false, heartbeat: 'expired', source: null },
      { node: 'node-b', blocks: 1, capacity: 14, used: 1, borrowed: 0, reserved: 0, alive: false, heartbeat: 'never', source: null },
    ]);
    assert.deepEqual(s.blocks, [
      { cidr: '10.84.0.0/28', rangeSet: 0, node: 'node-b', state: 'owned', capacity: 14, used: 1, borrowed: 0, reserved: 0 },
      { cidr: '10.84.0.16/28', rangeSet: 0, node: 'node-a', state: 'owned', capacity: 15, used: 1, borrowed: 0, reserved: 2 },
    ]);
  });

  it('heartbeat: yes with the alive key, expired with only the settings key, never with neither; a settings-only node is listed', async () => {
    const kv = new MemoryKV();
    await add(allocator(kv, 'node-a'), 'a1');
    await kv.txn([], [
      { put: `${P}/alive/node-a`, value: '{"v":1,"node":"node-a","since":1}' },
      { put: `${P}/nodes/node-a/settings`, value: '{"v":1,"offlineSeconds":0}' },
      { put: `${P}/nodes/node-z/settings`, value: '{"v":1,"offlineSeconds":0}' },
    ]);
    const s = await poolStatus(kv, '/ipwarden', 'p1');
    assert.deepEqual(s.nodes.map((n) => [n.node, n.alive, n.heartbeat]), [['node-a', true, 'yes'], ['node-z', false, 'expired']]);
    assert.deepEqual(await Promise.all(['node-a', 'node-z', 'node-q'].map((n) => nodeHeartbeat(kv, '/ipwarden', 'p1', n))), ['yes', 'expired', 'never']);
    await kv.txn([], [{ put: `${P}/nodes/bad name/settings`, value: '{}' }]);
    const t = await poolStatus(kv, '/ipwarden', 'p1');
    assert.deepEqual(t.corrupt, [{ key: `${P}/nodes/bad name/settings`, why: 'not the settings key of a node name' }]);
    assert.deepEqual(t.nodes.map((n) => [n.node, n.heartbeat]), [['node-a', 'yes'], ['node-z', 'expired']]);
  });

  it('blocks are sorted by address (numerically, IPv4 before IPv6), not as text', async () => {
    const kv = new MemoryKV();
    // A /24 in /28 blocks, dual stack: claims spread by the node names' hashes.
    const c = loadIPAMConfig(JSON.stringify({ cniVersion: '1.0.0', name: 'net1', ipam: { ranges: [[{ subnet: '10.84.1.0/24' }], [{ subnet: 'fd84::/120' }]] } }), undefined);
    const names = Array.from({ length: 12 }, (_, i) => `n${i}`);
    for (const n of names) {
      const al = new PoolAllocator({ kv, pool: 'p2', prefix: '/ipwarden', node: n, network: 'net1', rangeSets: c.rangeSets, sizes: { blockSize4: 28, blockSize6: 124 }, now: () => 1000 });
      const [r] = await al.add([{ containerId: `c-${n}`, ifname: 'eth0' }]);
      if (r instanceof AppError) throw r;
    }
    const s = await poolStatus(kv, '/ipwarden', 'p2');
    const cidrs = s.blocks.map((b) => b.cidr);
    assert.equal(cidrs.length, 24);
    const v4 = cidrs.filter((x) => !x.includes(':'));
    assert.deepEqual(v4, [...v4].sort((x, y) => Number((x.split('.')[3] as string).split('/')[0]) - Number((y.split('.')[3] as string).split('/')[0])));
    assert.deepEqual(cidrs.slice(0, 12), v4, 'IPv4 first');
    const v6 = cidrs.slice(12);
    assert.deepEqual(v6, [...v6].sort((x, y) => parseInt((x.split('::')[1] as string).split('/')[0] || '0', 16) - parseInt((y.split('::')[1] as string).split('/')[0] || '0', 16)));
    assert.notDeepEqual(v4, [...v4].sort(), 'the text order would differ (the test means something)');
  });

  it("a daemon's announce writes the node's settings key (offlineSeconds 0) before its heartbeat key, whose value names the daemon's host and pid: yes while it runs, expired after it stops", async () => {
    const kv = new SharedKV();
    await add(allocator(kv, 'node-a'), 'a1');
    const conf = loadIPAMConfig(JSON.stringify({ cniVersion: '1.0.0', name: 'net1', ipam: { ranges: [[{ subnet: '10.84.0.0/27' }]], pool: { name: 'p1', etcd: { endpoints: ['http://127.0.0.1:1'] }, blockSize: 28 } } }), undefined);
    const s = new PoolSessions({ NODE_NAME: 'node-d' }, () => kv, () => () => undefined);
    try {
      s.announce(conf);
      for (let i = 0; i < 1000 && kv.dump()[`${P}/alive/node-d`] === undefined; i++) await new Promise((r) => setImmediate(r));
      assert.equal(kv.dump()[`${P}/nodes/node-d/settings`], '{"v":1,"offlineSeconds":0}');
      const alive = JSON.parse(kv.dump()[`${P}/alive/node-d`] as string);
      assert.deepEqual([alive.v, alive.node, alive.host, alive.pid, typeof alive.since], [1, 'node-d', hostname(), process.pid, 'number']);
      assert.deepEqual((await poolStatus(kv, '/ipwarden', 'p1')).nodes.map((n) => [n.node, n.heartbeat]), [['node-a', 'never'], ['node-d', 'yes']]);
    } finally {
      await s.close();
    }
    assert.equal(kv.dump()[`${P}/alive/node-d`], undefined, 'close() revoked the heartbeat');
    assert.deepEqual((await poolStatus(kv, '/ipwarden', 'p1')).nodes.map((n) => [n.node, n.heartbeat]), [['node-a', 'never'], ['node-d', 'expired']]);
    // A second daemon of the node never overwrites the key (create-only: a larger offlineSeconds stays).
    kv.apply([], [{ put: `${P}/nodes/node-d/settings`, value: '{"v":1,"offlineSeconds":99}' }]);
    const s2 = new PoolSessions({ NODE_NAME: 'node-d' }, () => kv, () => () => undefined);
    try {
      s2.announce(conf);
      for (let i = 0; i < 1000 && kv.dump()[`${P}/alive/node-d`] === undefined; i++) await new Promise((r) => setImmediate(r));
      assert.equal(kv.dump()[`${P}/nodes/node-d/settings`], '{"v":1,"offlineSeconds":99}');
    } finally {
      await s2.close();
    }
  });

  it('a pool never used is IPAM_NOT_FOUND', async () => {
    await assert.rejects(poolStatus(new MemoryKV(), '/ipwarden', 'nope'), (e: unknown) => isAppError(e, 'IPAM_NOT_FOUND') && e.message === 'pool nope has no data in memory under /ipwarden (no /ipwarden/pools/nope/meta key: never used)');
  });

  it('keys that cannot be read are listed (key, why) and not counted; a corrupt block of the pool stays claimed and its addresses are unreadable, not free', async () => {
    const kv = new MemoryKV();
    await add(allocator(kv, 'node-a'), 'a1');
    await add(allocator(kv, 'node-b'), 'b1');
    const a16 = `${P}/blocks/10.84.0.16-28`;
    kv.plant(a16, JSON.stringify({ ...JSON.parse(kv.dump()[a16] as string), owner: 'x' }));
    kv.plant(`${P}/blocks/garbage`, 'x');
    // A block key outside the pool's ranges, with a range set the pool lacks.
    kv.plant(`${P}/blocks/10.84.0.64-28`, '{"v":1,"cidr":"10.84.0.64/28","rangeSet":3,"node":"node-c","state":"owned","seq":0,"next":0,"allocs":{}}');
    const s = await poolStatus(kv, '/ipwarden', 'p1');
    assert.deepEqual(s, {
      version: 1,
      pool: 'p1',
      blockSize: 28,
      blockSize6: 122,
      rangeSets: [{ index: 0, ranges: '10.84.0.1-10.84.0.30', size: '29', used: 1, reserved: 0, unreadable: 15, pendingRelease: 0, free: '13', blocksClaimed: 2 }],
      nodes: [{ node: 'node-b', blocks: 1, capacity: 14, used: 1, borrowed: 0, reserved: 0, alive: false, heartbeat: 'never', source: null }],
      blocks: [{ cidr: '10.84.0.0/28', rangeSet: 0, node: 'node-b', state: 'owned', capacity: 14, used: 1, borrowed: 0, reserved: 0 }],
      corrupt: [
        { key: a16, why: 'unknown field "owner" (known: v, cidr, rangeSet, node, state, seq, next, allocs, wanted)' },
        { key: `${P}/blocks/10.84.0.64-28`, why: '"rangeSet" 3 is not a range set of the pool' },
        { key: `${P}/blocks/garbage`, why: 'not a block key' },
      ],
      overlaps: [],
    });
    assert.equal(
      poolStatusTable(s),
      [
        'pool p1: blocks /28 (IPv4), /122 (IPv6)',
        'SET  RANGES                SIZE  USED  RESERVED  UNREADABLE  PENDING  FREE  BLOCKS',
        '0    10.84.0.1-10.84.0.30  29    1     0         15          0        13    2',
        'NODE    BLOCKS  CAPACITY  USED  BORROWED  RESERVED  HEARTBEAT  LAST SEEN  SOURCE',
        'node-b  1       14        1     0         0         never      -          -',
        'BLOCK         SET  NODE    STATE  CAPACITY  USED  BORROWED  RESERVED',
        '10.84.0.0/28  0    node-b  owned  14        1     0         0',
        `${'CORRUPT KEY'.padEnd(a16.length + 2)}WHY`,
        `${a16}  unknown field "owner" (known: v, cidr, rangeSet, node, state, seq, next, allocs, wanted)`,
        `${P}/blocks/10.84.0.64-28  "rangeSet" 3 is not a range set of the pool`,
        `${P}/blocks/garbage        not a block key`,
        '3 keys cannot be read: not counted above, never allocated from or rewritten by ipwarden; left for an operator (docs/cluster.md "Corrupt keys")',
        '',
      ].join('\n'),
    );
  });

  it('a meta that cannot be read still fails the report (without the layout nothing can be counted)', async () => {
    const kv = new MemoryKV();
    await add(allocator(kv, 'node-a'), 'a1');
    kv.plant(`${P}/meta`, '{');
    await assert.rejects(poolStatus(kv, '/ipwarden', 'p1'), (e: unknown) => isAppError(e, 'STORE_CORRUPT') && e.message === `etcd key ${P}/meta: not valid JSON`);
  });
});
