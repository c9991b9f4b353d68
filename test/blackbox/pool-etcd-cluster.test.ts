/**
 * One etcd cluster per endpoint list (docs/cluster.md "One etcd cluster"): two real, separate
 * etcd clusters (test/helpers/etcd-cluster.ts, one member each, so two cluster IDs) and pool
 * configs naming an endpoint of each. Before the guard, each process picked a random first
 * endpoint, the pool was created in both clusters, and one address was handed out twice.
 *
 * - Every ADD — 12 plugin processes at once (each picks its own random first endpoint), both
 *   orders of the list, one through the installed shim (the daemon in the daemon pass) — and
 *   in-process clients with each `firstEndpoint` fail with code 7 and the exact message naming
 *   each endpoint's cluster ID (read independently with `etcdctl endpoint status`); nothing at
 *   all is written in either cluster.
 * - A client whose check could not reach one endpoint still compares every later answer: when
 *   it fails over to the other cluster, code 7, and it refuses from then on.
 * - A pool is created only when every endpoint answered the check (one down: code 11, nothing
 *   written); created through one cluster's list it is pinned (`meta-cluster`); a list with the
 *   other cluster's member down then allocates in the pool's cluster; once it is back: code 7;
 *   a copy of the pool's keys in the other cluster (a mirror) is refused with code 7.
 *
 * Needs `npm run build`. With CI=true a missing /usr/bin/etcd fails instead of skipping.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { isAppError } from '../../src/common/errors.ts';
import { loadIPAMConfig } from '../../src/ipam/config.ts';
import { PoolAllocator } from '../../src/pool/allocator.ts';
import { EtcdKV } from '../../src/store/etcd/etcd-kv.ts';
import { installedPlugin, runCni, runCniAsync, standalonePlugin, type Outcome } from '../helpers/cni.ts';
import { ETCDCTL_BIN, haveEtcd, startEtcdCluster, type EtcdCluster } from '../helpers/etcd-cluster.ts';

const CI = process.env['CI'] === 'true';
const skip = haveEtcd() || CI ? false : '/usr/bin/etcd not installed';

const SUBNET = '10.233.17.0/24';
let ca: EtcdCluster | undefined;
let cb: EtcdCluster | undefined;
let n = 0;

/** The one endpoint of cluster `c`. */
const ep = (c: EtcdCluster | undefined): string => (c as EtcdCluster).endpoints[0] as string;

/** Cluster `c`'s ID as etcd reports it (`etcdctl endpoint status`), in hex: an independent source. */
function clusterId(c: EtcdCluster): string {
  const r = spawnSync(ETCDCTL_BIN, ['--endpoints', ep(c), 'endpoint', 'status', '-w', 'json'], { encoding: 'utf8', env: { ...process.env, ETCDCTL_API: '3' } });
  const m = /"cluster_id":([0-9]+)/.exec(r.stdout);
  assert.ok(m !== null, `etcdctl endpoint status: ${r.stdout}${r.stderr}`);
  return BigInt(m[1] as string).toString(16);
}

function conf(endpoints: string[], prefix: string) {
  return { cniVersion: '1.0.0', name: 'cidnet', ipam: { type: 'ipwarden', ranges: [[{ subnet: SUBNET }]], pool: { name: 'cidpool', etcd: { endpoints, prefix } } } };
}

/** Every key under `prefix` (the test's) in cluster `c`, sorted. */
async function keys(c: EtcdCluster | undefined, prefix: string): Promise<string[]> {
  const kv = new EtcdKV({ endpoints: (c as EtcdCluster).endpoints });
  try {
    return (await kv.list(`${prefix}/`, { keysOnly: true })).map((e) => e.key);
  } finally {
    await kv.close();
  }
}

function cniError(r: Outcome): { code: number; msg: string } {
  assert.equal(r.exitCode, 1, `${r.stdout}\n${r.stderr}`);
  return { code: r.json?.['code'] as number, msg: r.json?.['msg'] as string };
}

/** The mismatch message for the list `eps` (each endpoint's cluster, in the list's order). */
function mixMessage(eps: Array<[string, string]>): string {
  return `ipam.pool.etcd.endpoints name members of 2 etcd clusters: ${eps.map(([e, id]) => `${e} is in cluster ${id}`).join('; ')} — list the members of one cluster only`;
}

describe('one etcd cluster per endpoint list (two real etcd clusters)', { skip }, () => {
  let idA = '';
  let idB = '';
  before(async () => {
    [ca, cb] = await Promise.all([startEtcdCluster({ members: 1, prefix: 'ipwarden-cid-a-' }), startEtcdCluster({ members: 1, prefix: 'ipwarden-cid-b-' })]);
    idA = clusterId(ca);
    idB = clusterId(cb);
    assert.notEqual(idA, idB, 'two clusters, two IDs');
  });
  after(async () => {
    await ca?.close();
    await cb?.close();
  });

  it('every ADD of a list naming both clusters fails with code 7 naming each endpoint\'s cluster, whichever endpoint a process tries first; nothing is written in either cluster', async () => {
    const p = `/cid${process.pid}-${++n}`;
    const ab = conf([ep(ca), ep(cb)], p);
    const ba = conf([ep(cb), ep(ca)], p);
    const runs = await Promise.all([
      ...Array.from({ length: 6 }, (_, i) => runCniAsync(standalonePlugin(), { command: 'ADD', containerId: `ab${i}`, ifname: 'eth0', stdin: ab, env: { NODE_NAME: `node-${i % 3}` } })),
      ...Array.from({ length: 6 }, (_, i) => runCniAsync(standalonePlugin(), { command: 'ADD', containerId: `ba${i}`, ifname: 'eth0', stdin: ba, env: { NODE_NAME: `node-${i % 3}` } })),
    ]);
    const msgAB = mixMessage([[ep(ca), idA], [ep(cb), idB]]);
    const msgBA = mixMessage([[ep(cb), idB], [ep(ca), idA]]);
    runs.forEach((r, i) => assert.deepEqual(cniError(r), { code: 7, msg: i < 6 ? msgAB : msgBA }, `ADD ${i}`));
    // Through the installed shim: the standalone fallback, or (daemon pass) the daemon's sessions.
    assert.deepEqual(cniError(runCni(installedPlugin(), { command: 'ADD', containerId: 'shim1', ifname: 'eth0', stdin: ab, env: { NODE_NAME: 'node-s' } })), { code: 7, msg: msgAB });
    // A DEL cannot write its tombstone in either cluster either.
    assert.deepEqual(cniError(runCni(standalonePlugin(), { command: 'DEL', containerId: 'ab0', ifname: 'eth0', stdin: ab, env: { NODE_NAME: 'node-0' } })), { code: 7, msg: msgAB });
    assert.deepEqual(await keys(ca, p), []);
    assert.deepEqual(await keys(cb, p), []);
  });

  it('in-process, with each first endpoint: the ADD fails with code 7 before any write, and so does every later call of that client', async () => {
    const p = `/cid${process.pid}-${++n}`;
    const c = loadIPAMConfig(JSON.stringify(conf([ep(ca), ep(cb)], p)), undefined);
    for (const first of [0, 1]) {
      const kv = new EtcdKV({ endpoints: [ep(ca), ep(cb)], firstEndpoint: first });
      try {
        const alloc = new PoolAllocator({ kv, pool: 'cidpool', prefix: p, node: 'node-a', network: 'cidnet', rangeSets: c.rangeSets, sizes: { blockSize4: 26, blockSize6: 122 } });
        const want = mixMessage([[ep(ca), idA], [ep(cb), idB]]);
        await assert.rejects(alloc.add([{ containerId: `ip${first}`, ifname: 'eth0' }]), (e: unknown) => isAppError(e, 'IPAM_INVALID_CONFIG') && e.cniCode === 7 && e.message === want);
        await assert.rejects(kv.get(`${p}/x`), (e: unknown) => isAppError(e, 'IPAM_INVALID_CONFIG') && e.message === want, 'a read too, from then on');
      } finally {
        await kv.close();
      }
    }
    assert.deepEqual(await keys(ca, p), []);
    assert.deepEqual(await keys(cb, p), []);
  });

  it('an endpoint that did not answer the check is still compared: the first answer from it (a failover) is refused with code 7', async () => {
    const p = `/cid${process.pid}-${++n}`;
    await (cb as EtcdCluster).kill(0);
    const kv = new EtcdKV({ endpoints: [ep(ca), ep(cb)], firstEndpoint: 0 });
    try {
      const check = await kv.clusterCheck();
      assert.equal(check.clusterId, idA);
      assert.equal(check.unanswered.length, 1);
      assert.ok((check.unanswered[0] as string).startsWith(`${ep(cb)} (etcd at ${ep(cb)} is unavailable: status: UNAVAILABLE: `), check.unanswered[0]);
      assert.equal((await kv.txn([], [{ put: `${p}/k`, value: 'a' }])).succeeded, true, 'a write goes to A');
      await (cb as EtcdCluster).restart(0);
      await (ca as EtcdCluster).kill(0);
      const want = mixMessage([[ep(ca), idA], [ep(cb), idB]]);
      // B's channel is in grpc-js's reconnect backoff from the check (B was down): until it
      // reconnects a call is unavailable (code 11). Wait for that condition to pass, bounded.
      let err: unknown;
      for (let i = 0; ; i++) {
        err = await kv.get(`${p}/k`).then(() => null, (e: unknown) => e);
        if (!isAppError(err, 'STORE_UNAVAILABLE')) break;
        assert.ok(i < 300, `B answered within 30 s: ${String(err)}`);
        await new Promise((r) => setTimeout(r, 100));
      }
      assert.ok(isAppError(err, 'IPAM_INVALID_CONFIG') && err.cniCode === 7 && err.message === want, String(err));
      await (ca as EtcdCluster).restart(0);
      await assert.rejects(kv.get(`${p}/k`), (e: unknown) => isAppError(e, 'IPAM_INVALID_CONFIG') && e.message === want, 'refused from then on, A back or not');
    } finally {
      await kv.close();
      if ((ca as EtcdCluster).members[0]?.pid === null) await (ca as EtcdCluster).restart(0);
      if ((cb as EtcdCluster).members[0]?.pid === null) await (cb as EtcdCluster).restart(0);
    }
    assert.deepEqual(await keys(cb, p), [], 'nothing reached B');
  });

  it('a pool is created only once every endpoint answered, and pinned to its cluster: then a list with the other cluster down allocates in it, code 7 once it is back, and a copy of the pool in the other cluster is refused', async () => {
    const p = `/cid${process.pid}-${++n}`;
    const base = `${p}/pools/cidpool`;
    const ab = conf([ep(ca), ep(cb)], p);
    const add = (stdin: object, id: string): Outcome => runCni(standalonePlugin(), { command: 'ADD', containerId: id, ifname: 'eth0', stdin, env: { NODE_NAME: 'node-a' } });
    await (cb as EtcdCluster).kill(0);
    try {
      // Not created while B cannot be compared: code 11, nothing written.
      const e1 = cniError(add(ab, 'c1'));
      assert.equal(e1.code, 11);
      const pre = `pool cidpool is not in etcd yet, and is created only once every endpoint in ipam.pool.etcd.endpoints has confirmed one etcd cluster; no answer from ${ep(cb)} (etcd at ${ep(cb)} is unavailable: status: UNAVAILABLE: `;
      assert.ok(e1.msg.startsWith(pre) && e1.msg.endsWith('); retry'), e1.msg);
      assert.deepEqual(await keys(ca, p), []);
      // Created through A alone: meta and its pin.
      const r2 = add(conf([ep(ca)], p), 'c2');
      assert.equal(r2.exitCode, 0, r2.stdout);
      const kva = new EtcdKV({ endpoints: (ca as EtcdCluster).endpoints });
      try {
        assert.equal((await kva.get(`${base}/meta-cluster`))?.value, JSON.stringify({ v: 1, clusterId: idA }));
        // The list of both, B still down: the pool exists in A and its pin names A — allocated there.
        const r3 = add(ab, 'c3');
        assert.equal(r3.exitCode, 0, r3.stdout);
        assert.deepEqual((await kva.list(`${base}/handles/`, { keysOnly: true })).map((e) => e.key), [`${base}/handles/c2/eth0`, `${base}/handles/c3/eth0`]);
        await (cb as EtcdCluster).restart(0);
        assert.deepEqual(cniError(add(ab, 'c4')), { code: 7, msg: mixMessage([[ep(ca), idA], [ep(cb), idB]]) });
        assert.deepEqual(await keys(cb, p), []);
        // A copy of the pool's keys in B (a mirror): refused through B's own list.
        const kvb = new EtcdKV({ endpoints: (cb as EtcdCluster).endpoints });
        try {
          const meta = (await kva.get(`${base}/meta`))?.value as string;
          await kvb.txn([], [{ put: `${base}/meta`, value: meta }, { put: `${base}/meta-cluster`, value: JSON.stringify({ v: 1, clusterId: idA }) }]);
          const e5 = cniError(add(conf([ep(cb)], p), 'c5'));
          assert.deepEqual(e5, {
            code: 7,
            msg: `pool cidpool was created in etcd cluster ${idA}, but its endpoints now answer as cluster ${idB} (a copy of its keys in another cluster: a mirror, or a restore into a new cluster) — point ipam.pool.etcd.endpoints at the pool's cluster, or see docs/cluster.md "One etcd cluster"`,
          });
          assert.deepEqual(await keys(cb, p), [`${base}/meta`, `${base}/meta-cluster`], 'nothing more written in B');
        } finally {
          await kvb.close();
        }
      } finally {
        await kva.close();
      }
    } finally {
      if ((cb as EtcdCluster).members[0]?.pid === null) await (cb as EtcdCluster).restart(0);
    }
  });
});
