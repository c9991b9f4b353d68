/**
 * The daemon's pool front (src/cni/pool.ts `PoolSessions`) on a real etcd (test/helpers/etcd-cluster.ts):
 * concurrent ADDs of one node go out in few transactions (batched), every address once; the etcd
 * write count per allocation is what docs/cluster.md states; the first ADD is sent alone (no added
 * delay). Also `resolveNodeName`'s order and errors. With CI=true a missing /usr/bin/etcd fails.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { isAppError } from '../../src/common/errors.ts';
import { formatIP } from '../../src/common/ip.ts';
import { loadIPAMConfig } from '../../src/ipam/config.ts';
import type { PoolConfig } from '../../src/ipam/pool-config.ts';
import type { PoolAllocation } from '../../src/ipam/pool-allocator.ts';
import { EtcdKV } from '../../src/store/etcd/etcd-kv.ts';
import { backoffMs, Heartbeat, HEARTBEAT_TTL_SECONDS, PoolSessions, resolveNodeName } from '../../src/cni/pool.ts';
import { MemoryKV } from '../../src/store/memory/memory-kv.ts';
import { haveEtcd, startEtcdCluster, type EtcdCluster } from '../helpers/etcd-cluster.ts';

const CI = process.env['CI'] === 'true';
const skip = haveEtcd() || CI ? false : '/usr/bin/etcd not installed';

describe('resolveNodeName', () => {
  const pool = (nodeName: string | null): PoolConfig => ({ name: 'p', etcd: { endpoints: ['http://127.0.0.1:1'], tls: null, prefix: '/ipwarden' }, blockSize4: 26, blockSize6: 122, nodeName });
  it('ipam.nodeName, else NODE_NAME, else the host name', () => {
    assert.equal(resolveNodeName(pool('cfg'), { NODE_NAME: 'env' }, () => 'host'), 'cfg');
    assert.equal(resolveNodeName(pool(null), { NODE_NAME: 'env' }, () => 'host'), 'env');
    assert.equal(resolveNodeName(pool(null), { NODE_NAME: '' }, () => 'host'), 'host');
    assert.equal(resolveNodeName(pool(null), {}, () => 'host'), 'host');
  });
  it('an unusable host name is code 7 naming its source', () => {
    assert.throws(() => resolveNodeName(pool(null), {}, () => 'bad host'), (e: unknown) => isAppError(e, 'IPAM_INVALID_CONFIG') && e.message === `the host name must be a node name of at most 253 letters, digits, '_', '.' or '-' starting with a letter or digit, got "bad host"`);
  });
});

describe('backoffMs (the retry policy of a lost race)', () => {
  it('is a random share of min(200, 5·2^attempt) ms', () => {
    assert.deepEqual([1, 2, 3, 5, 6, 30].map((a) => backoffMs(a, () => 0.999)), [9, 19, 39, 159, 199, 199]);
    assert.equal(backoffMs(4, () => 0), 0);
    assert.equal(backoffMs(4, () => 0.5), 40);
  });
});

describe('Heartbeat (memory KV, injected schedule)', () => {
  it('puts its key with a lease, renews it, puts it again after an expiry, and revokes it at stop', async () => {
    const kv = new MemoryKV();
    const ticks: Array<{ fn: () => void; ms: number }> = [];
    const hb = new Heartbeat(kv, '/p/alive/n1', 'n1', () => 7, (fn, ms) => {
      ticks.push({ fn, ms });
      return () => void ticks.splice(0);
    });
    await hb.start();
    assert.deepEqual(ticks.map((t) => t.ms), [(HEARTBEAT_TTL_SECONDS * 1000) / 3]);
    assert.equal(kv.dump()['/p/alive/n1'], '{"v":1,"node":"n1","since":7}');
    const puts = kv.stats.puts;
    await hb.beat();
    assert.equal(kv.stats.puts, puts, 'a renewal writes nothing');
    kv.expireLease('4097'); // the first lease MemoryKV grants
    assert.equal(kv.dump()['/p/alive/n1'], undefined);
    await hb.beat();
    assert.equal(kv.dump()['/p/alive/n1'], '{"v":1,"node":"n1","since":7}', 'a new lease, the key again');
    kv.failNext = 1;
    await hb.beat();
    assert.equal(hb.failures, 1, 'an unavailable etcd is counted, never thrown');
    await hb.stop();
    await hb.stop();
    assert.equal(kv.dump()['/p/alive/n1'], undefined);
    assert.deepEqual(ticks, [], 'the schedule is cancelled');
  });
});

describe('PoolSessions on a real etcd', { skip }, () => {
  let cluster: EtcdCluster | undefined;
  before(async () => {
    cluster = await startEtcdCluster({ members: 1, prefix: 'ipwarden-pool-sessions-' });
  });
  after(async () => {
    await cluster?.close();
  });

  it('48 concurrent ADDs of one node: batched into few transactions, every address once; writes per allocation as documented', async () => {
    const c = cluster as EtcdCluster;
    let made: EtcdKV | undefined;
    const sessions = new PoolSessions({ NODE_NAME: 'node-d' }, (p) => (made = new EtcdKV({ endpoints: p.etcd.endpoints })));
    try {
      const conf = loadIPAMConfig(
        JSON.stringify({ cniVersion: '1.0.0', name: 'net1', ipam: { ranges: [[{ subnet: '10.82.0.0/24' }]], pool: { name: 'sp', etcd: { endpoints: c.endpoints, prefix: `/s${process.pid}` } } } }),
        undefined,
      );
      const rs = await Promise.all(Array.from({ length: 48 }, (_, i) => sessions.add(conf, { containerId: `c${i}`, ifname: 'eth0' })));
      const ips = rs.map((r) => formatIP((r[0] as PoolAllocation).ip));
      assert.equal(new Set(ips).size, 48);
      const sizes = (sessions.batchSizes[0] as number[]);
      assert.equal(sizes.reduce((a, b) => a + b, 0), 48);
      // All 48 arrive in one tick: the first goes alone at once (no added delay), the others wait
      // for it and go in batches of at most 24 (the transaction op limit).
      assert.deepEqual(sizes, [1, 24, 23]);
      // The daemon's heartbeat for node-d starts with the first ADD (in the background): wait for
      // its key (bounded), so its one transaction is in the counts below.
      const alive = `/s${process.pid}/pools/sp/alive/node-d`;
      for (let i = 0; i < 200 && (await (made as EtcdKV).get(alive)) === null; i++) await new Promise((r) => setTimeout(r, 25));
      assert.notEqual(await (made as EtcdKV).get(alive), null, 'the heartbeat key exists');
      const st = (made as EtcdKV).stats;
      // One writer, so every transaction succeeds at once: meta + 3 batches + the heartbeat's put. Keys put: meta 1, heartbeat 1;
      // batch 1: handle + block + affinity (the claim); batch 2: 24 handles + the block; batch 3:
      // 23 handles + the block (48 addresses fit in the first /26's 62).
      assert.deepEqual({ txns: st.txns, txnsSucceeded: st.txnsSucceeded, puts: st.puts, deletes: st.deletes }, { txns: 5, txnsSucceeded: 5, puts: 1 + 1 + 3 + 25 + 24, deletes: 0 });
      const perAllocation = (st.puts - 2) / 48;
      process.stdout.write(`# 48 ADDs: ${sizes.length} batches (${sizes.join(',')}), ${st.txns} transactions, ${st.puts} keys put: ${perAllocation.toFixed(2)} per allocation\n`);
      const d = await sessions.del(conf, { containerId: 'c0', ifname: 'eth0' });
      assert.deepEqual(d, [ips[0]]);
      // The DEL kept the node's shared block cache current: the next ADD reads only its handle
      // and its one transaction succeeds.
      const before = { ...(made as EtcdKV).stats };
      await sessions.add(conf, { containerId: 'c99', ifname: 'eth0' });
      const after = (made as EtcdKV).stats;
      assert.deepEqual([after.reads - before.reads, after.txns - before.txns, after.txnsSucceeded - before.txnsSucceeded], [1, 1, 1]);
    } finally {
      await sessions.close();
      await sessions.close();
    }
    // close() revoked the heartbeat's lease: its key is gone.
    const check = new EtcdKV({ endpoints: c.endpoints });
    try {
      assert.equal(await check.get(`/s${process.pid}/pools/sp/alive/node-d`), null);
    } finally {
      await check.close();
    }
    await assert.rejects(sessions.del({ cniVersion: '1.0.0', name: 'net1', dataDir: '/x', lockTimeoutSeconds: 1, pool: { name: 'sp', etcd: { endpoints: c.endpoints, tls: null, prefix: '/x' }, blockSize4: 26, blockSize6: 122, nodeName: null } }, { containerId: 'c1', ifname: 'eth0' }), (e: unknown) => isAppError(e, 'CLOSED'));
  });
});
