// The real-etcd harness (test/helpers/etcd-cluster.ts) proves each of its functions against the
// installed etcd 3.4: members come up healthy, a put/get goes through the etcd3 client, kill -9 of
// the leader elects another and the killed member rejoins with its data, SIGSTOP of the leader
// lets writes resume through the others. Needs /usr/bin/etcd: with CI=true its absence fails
// the suite, otherwise the suite is skipped with the reason.
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { Etcd3 } from 'etcd3';
import { requireOrSkip } from '../helpers/cni.ts';
import { haveEtcd, startEtcdCluster, type EtcdCluster } from '../helpers/etcd-cluster.ts';
import { startNodeProxies } from '../helpers/tcp-proxy.ts';

const skip = requireOrSkip(haveEtcd(), '/usr/bin/etcd (Debian etcd-server)');

/** A client that gives up on a call after 2 s (so a hung member costs a retry, not the test). */
function client(endpoints: string[]): Etcd3 {
  return new Etcd3({ hosts: endpoints, dialTimeout: 2000, defaultCallOptions: (ctx) => (ctx.isStream ? {} : { deadline: Date.now() + 2000 }) });
}

/** Put `key` = `value` through `c`, retried until it succeeds (bounded: 150 tries ≈ 30 s). */
async function putEventually(c: Etcd3, key: string, value: string): Promise<number> {
  let last: unknown;
  for (let i = 0; i < 150; i++) {
    try {
      await c.put(key).value(value).exec();
      return i;
    } catch (e) {
      last = e;
      await sleep(200);
    }
  }
  throw new Error(`put ${key} never succeeded: ${String(last)}`);
}

describe('etcd harness: a 1-member cluster', { skip }, () => {
  let cluster: EtcdCluster | undefined;
  after(async () => {
    await cluster?.close();
  });

  it('starts healthy, is its own leader, survives kill -9 + restart with its data, and close() removes everything', async () => {
    cluster = await startEtcdCluster({ members: 1 });
    assert.equal(cluster.endpoints.length, 1);
    assert.match(cluster.endpoints[0] ?? '', /^http:\/\/127\.0\.0\.1:\d+$/);
    assert.equal(await cluster.leader(), 0);
    const c = client(cluster.endpoints);
    try {
      await c.put('ipwarden-etcdlab/one').value('1');
      const pid = cluster.members[0]?.pid;
      assert.ok(pid !== null && pid !== undefined);
      await cluster.kill(0);
      assert.equal(cluster.members[0]?.pid, null);
      assert.throws(() => process.kill(pid, 0));
      await cluster.restart(0);
      assert.notEqual(cluster.members[0]?.pid, null);
      await putEventually(c, 'ipwarden-etcdlab/two', '2');
      assert.equal(await c.get('ipwarden-etcdlab/one').string(), '1');
    } finally {
      c.close();
    }
    const dir = cluster.dir;
    const pid = cluster.members[0]?.pid;
    await cluster.close();
    await cluster.close(); // idempotent
    assert.equal(existsSync(dir), false);
    assert.ok(pid !== null && pid !== undefined);
    assert.throws(() => process.kill(pid, 0));
  });
});

describe('etcd harness: a 3-member cluster', { skip }, () => {
  let cluster: EtcdCluster;
  let c: Etcd3;
  before(async () => {
    cluster = await startEtcdCluster({ members: 3 });
    c = client(cluster.endpoints);
  });
  after(async () => {
    c?.close();
    await cluster?.close();
  });

  it('has 3 healthy members on distinct loopback ports and one agreed leader', async () => {
    assert.equal(cluster.endpoints.length, 3);
    assert.equal(new Set(cluster.endpoints).size, 3);
    const st = await Promise.all([0, 1, 2].map((i) => cluster.status(i)));
    assert.equal(new Set(st.map((s) => s.memberId)).size, 3);
    assert.equal(new Set(st.map((s) => s.leaderId)).size, 1);
    const l = await cluster.leader();
    assert.equal(st[l]?.memberId, st[0]?.leaderId);
  });

  it('a put through the etcd3 client is read back from every member', async () => {
    await c.put('ipwarden-etcdlab/k').value('v1');
    for (const ep of cluster.endpoints) {
      const one = client([ep]);
      try {
        assert.equal(await one.get('ipwarden-etcdlab/k').string(), 'v1');
      } finally {
        one.close();
      }
    }
  });

  it('kill -9 of the leader elects another; writes go on; the killed member rejoins and catches up', async () => {
    const old = await cluster.leader();
    await cluster.kill(old);
    const next = await cluster.leader({ notIndex: old });
    assert.notEqual(next, old);
    await putEventually(c, 'ipwarden-etcdlab/after-kill', 'x');
    await cluster.restart(old);
    const back = client([cluster.endpoints[old] ?? '']);
    try {
      // A linearizable read on the restarted member returns the write it missed.
      let v: string | null = null;
      for (let i = 0; i < 100 && v !== 'x'; i++) {
        v = await back.get('ipwarden-etcdlab/after-kill').string().catch(() => null);
        if (v !== 'x') await sleep(100);
      }
      assert.equal(v, 'x');
    } finally {
      back.close();
    }
    await cluster.waitHealthy();
  });

  it('SIGSTOP of the leader: the others elect a leader and writes resume; SIGCONT rejoins it', async () => {
    const old = await cluster.leader();
    cluster.pause(old);
    try {
      assert.equal(cluster.members[old]?.stopped, true);
      const next = await cluster.leader({ notIndex: old });
      assert.notEqual(next, old);
      const others = cluster.endpoints.filter((_, i) => i !== old);
      const c2 = client(others);
      try {
        await putEventually(c2, 'ipwarden-etcdlab/after-stop', 'y');
        assert.equal(await c2.get('ipwarden-etcdlab/after-stop').string(), 'y');
      } finally {
        c2.close();
      }
    } finally {
      cluster.resume(old);
    }
    assert.equal(cluster.members[old]?.stopped, false);
    await cluster.waitHealthy();
    const st = await cluster.status(old);
    const l = await cluster.leader();
    assert.equal(st.leaderId, (await cluster.status(l)).memberId);
  });

  it('through a node\'s proxies: drop makes calls time out, delay slows them, pass heals (after the reset of the cut connections)', async () => {
    const np = await startNodeProxies(cluster.endpoints);
    const pc = client(np.endpoints);
    try {
      await pc.put('ipwarden-etcdlab/proxied').value('1');
      np.setMode({ kind: 'drop' });
      await assert.rejects(pc.get('ipwarden-etcdlab/proxied').options({ deadline: Date.now() + 500 }).string());
      assert.ok(np.proxies.some((p) => p.stats().droppedBytes > 0));
      np.setMode({ kind: 'delay', ms: 100 });
      // A read through the delaying proxies: its bytes wait in a proxy's queue (decided by the
      // counters, not a clock), then it answers.
      let v: string | null = null;
      let sawQueued = false;
      for (let i = 0; i < 100 && v !== '1'; i++) {
        const pending = pc.get('ipwarden-etcdlab/proxied').string().catch(() => null);
        let settled = false;
        void pending.finally(() => (settled = true));
        while (!settled) {
          if (np.proxies.some((p) => p.stats().queuedBytes > 0)) sawQueued = true;
          await sleep(1);
        }
        v = await pending;
      }
      assert.equal(v, '1');
      assert.ok(sawQueued, 'no bytes were ever held by the delay');
      np.setMode({ kind: 'pass' });
      await putEventually(pc, 'ipwarden-etcdlab/proxied', '2');
      assert.equal(await pc.get('ipwarden-etcdlab/proxied').string(), '2');
    } finally {
      pc.close();
      await np.close();
    }
  });
});
