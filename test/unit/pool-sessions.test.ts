/**
 * The daemon's pool front (src/daemon/pool-sessions.ts `PoolSessions`) on a real etcd (test/helpers/etcd-cluster.ts):
 * concurrent ADDs of one node go out in few transactions (batched), every address once; the etcd
 * write count per allocation is what docs/cluster.md states; the first ADD is sent alone (no added
 * delay). Also `resolveNodeName`'s order and errors. With CI=true a missing /usr/bin/etcd fails.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { isAppError } from '../../src/common/errors.ts';
import { formatIP } from '../../src/common/ip.ts';
import { loadIPAMConfig, loadNetworkIdentity } from '../../src/ipam/config.ts';
import type { PoolConfig } from '../../src/ipam/pool-config.ts';
import { PoolAllocator, type PoolAllocation } from '../../src/pool/allocator.ts';
import { PoolRemoval } from '../../src/pool/removal.ts';
import { EtcdKV } from '../../src/store/etcd/etcd-kv.ts';
import { Heartbeat, HEARTBEAT_RETRY_MS, HEARTBEAT_TTL_SECONDS } from '../../src/daemon/heartbeat.ts';
import { PoolSessions } from '../../src/daemon/pool-sessions.ts';
import { backoffMs } from '../../src/pool/session.ts';
import { resolveNodeName } from '../../src/node/node-name.ts';
import { MemoryKV } from '../../src/store/memory/memory-kv.ts';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ETCDCTL_BIN, haveEtcd, startEtcdCluster, type EtcdCluster } from '../helpers/etcd-cluster.ts';
import { GatedKV, until } from '../helpers/gated-kv.ts';

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

describe('Heartbeat stopped during a beat in flight (a heartbeat moved to other settings)', () => {
  it('stop() waits for the beat; a lease granted after the stop is revoked and the key is not put again', async () => {
    const kv = new MemoryKV();
    let release: () => void = () => undefined;
    const gate = new Promise<void>((r) => (release = r));
    const revoked: string[] = [];
    const gated = {
      description: 'gated',
      stats: kv.stats,
      get: (k: string) => kv.get(k),
      list: (p: string, o?: Parameters<MemoryKV['list']>[1]) => kv.list(p, o),
      txn: (c: Parameters<MemoryKV['txn']>[0], o: Parameters<MemoryKV['txn']>[1]) => kv.txn(c, o),
      close: () => kv.close(),
      keepAlive: (id: string) => kv.keepAlive(id),
      grantLease: async (ttl: number) => {
        await gate;
        return kv.grantLease(ttl);
      },
      revokeLease: async (id: string) => {
        revoked.push(id);
        return kv.revokeLease(id);
      },
    };
    const hb = new Heartbeat(gated, '/p/alive/n1', 'n1', () => 7, () => () => undefined);
    const started = hb.start(); // its first beat waits in grantLease
    let stopped = false;
    const stopping = hb.stop().then(() => void (stopped = true));
    await new Promise((r) => setImmediate(r));
    assert.equal(stopped, false, 'stop waits for the beat in flight');
    release();
    await Promise.all([started, stopping]);
    assert.equal(kv.dump()['/p/alive/n1'], undefined, 'no key put after the stop');
    assert.deepEqual(revoked, ['4097'], 'the lease granted after the stop is revoked');
  });
  it('failingFor: the time since the beats began to fail, reset by a beat that works', async () => {
    const kv = new MemoryKV();
    let now = 1000;
    const hb = new Heartbeat(kv, '/p/alive/n1', 'n1', () => now, () => () => undefined);
    await hb.start();
    assert.deepEqual([hb.failingSince, hb.failingFor(0)], [null, false]);
    kv.expireLease('4097');
    kv.failNext = 1;
    await hb.beat();
    assert.equal(hb.failingSince, 1000);
    now = 10_999;
    assert.equal(hb.failingFor(10_000), false);
    kv.failNext = 1;
    await hb.beat();
    now = 11_000;
    assert.equal(hb.failingFor(10_000), true, 'a second failure keeps the first one\'s time');
    await hb.beat();
    assert.deepEqual([hb.failingSince, hb.failingFor(0)], [null, false], 'a beat that works resets it');
    await hb.stop();
  });
});

describe('Heartbeat while etcd is unreachable (review F2c)', () => {
  it('a failed beat adds a beat every HEARTBEAT_RETRY_MS until one works (key back, veto run), then only the period is left', async () => {
    const kv = new MemoryKV();
    const timers = new Map<number, { fn: () => void; ms: number }>();
    let id = 0;
    const every = (fn: () => void, ms: number) => {
      const k = ++id;
      timers.set(k, { fn, ms });
      return () => void timers.delete(k);
    };
    let vetoes = 0;
    const hb = new Heartbeat(kv, '/p/alive/n1', 'n1', () => 7, every, async () => void vetoes++);
    await hb.start();
    assert.deepEqual([...timers.values()].map((t) => t.ms), [(HEARTBEAT_TTL_SECONDS * 1000) / 3]);
    assert.equal(vetoes, 1, 'the first beat runs the veto');
    kv.expireLease('4097');
    kv.failNext = 1; // the partition: the renewal fails
    await hb.beat();
    assert.equal(hb.failures, 1);
    assert.deepEqual([...timers.values()].map((t) => t.ms).sort((a, b) => a - b), [HEARTBEAT_RETRY_MS, (HEARTBEAT_TTL_SECONDS * 1000) / 3]);
    assert.equal(kv.dump()['/p/alive/n1'], undefined);
    // The partition heals: the next fast beat puts the key back, runs the veto, and stops the fast beats.
    const fast = [...timers.values()].find((t) => t.ms === HEARTBEAT_RETRY_MS) as { fn: () => void };
    fast.fn();
    await until(() => kv.dump()['/p/alive/n1'] !== undefined && vetoes === 3, 'key back and veto run');
    await until(() => timers.size === 1, 'the fast beats stop');
    await hb.stop();
    assert.equal(timers.size, 0);
  });
});

describe('PoolSessions: a DEL is ordered after the same container\'s pending ADD (memory KV; review F4)', () => {
  const conf = loadIPAMConfig(JSON.stringify({ cniVersion: '1.0.0', name: 'net1', ipam: { ranges: [[{ subnet: '10.82.0.0/24' }]], pool: { name: 'p1', etcd: { endpoints: ['http://127.0.0.1:1'] } } } }), undefined);
  const handles = (kv: MemoryKV): string[] => Object.keys(kv.dump()).filter((k) => k.startsWith('/ipwarden/pools/p1/handles/')).sort();
  const held = (kv: MemoryKV): string[] =>
    Object.entries(kv.dump())
      .filter(([k]) => /\/pools\/p1\/blocks\/[^/]+$/.test(k))
      .flatMap(([, v]) => Object.values(JSON.parse(v).allocs as Record<string, { id: string }>).map((a) => a.id))
      .sort();

  it('a DEL of a queued ADD takes it out of the queue (rejected, code 11): nothing is left held', async () => {
    const kv = new GatedKV();
    const s = new PoolSessions({ NODE_NAME: 'node-a' }, () => kv, () => () => undefined);
    try {
      await s.add(conf, { containerId: 'warm', ifname: 'eth0' });
      kv.hold = true;
      const p1 = s.add(conf, { containerId: 'c1', ifname: 'eth0' }); // in flight
      await until(() => kv.waiting === 1, 'c1 is in flight');
      const p2 = s.add(conf, { containerId: 'c2', ifname: 'eth0' }); // queued behind it
      const p2r = p2.then(() => 'resolved', (e: unknown) => e);
      // The runtime gave up on c2 and tears its sandbox down: DEL c2.
      const d = s.del(conf, { containerId: 'c2', ifname: 'eth0' });
      const e2 = await p2r;
      assert.ok(isAppError(e2, 'STORE_CONFLICT') && e2.cniCode === 11 && e2.message === 'ADD of c2/eth0 cancelled: a DEL of the same container came first', String(e2));
      kv.release();
      await p1;
      assert.deepEqual(await d, []);
      assert.deepEqual(held(kv), ['c1', 'warm']);
      assert.ok(!handles(kv).some((k) => k.includes('/c2/') && !JSON.parse(kv.dump()[k] as string).deleted), 'no live handle of c2');
    } finally {
      await s.close();
    }
  });

  it('DELs go in the ADDs\' round; a round stops before a second request of one attachment (an ADD queued after its container\'s DEL waits for the next)', async () => {
    const kv = new GatedKV();
    const s = new PoolSessions({ NODE_NAME: 'node-a' }, () => kv, () => () => undefined);
    try {
      const old = formatIP(((await s.add(conf, { containerId: 'c1', ifname: 'eth0' }))[0] as PoolAllocation).ip);
      kv.hold = true;
      const px = s.add(conf, { containerId: 'x', ifname: 'eth0' }); // in flight
      await until(() => kv.waiting === 1, 'x is in flight');
      const t0 = kv.stats.txns;
      const d1 = s.del(conf, { containerId: 'c1', ifname: 'eth0' }); // queued: round 2
      const p2 = s.add(conf, { containerId: 'c2', ifname: 'eth0' }); // queued: round 2
      const p1 = s.add(conf, { containerId: 'c1', ifname: 'eth0' }); // c1 again (a new sandbox): round 3
      kv.release();
      const [rx, r2, r1] = await Promise.all([px, p2, p1]);
      assert.deepEqual(await d1, [old]);
      assert.deepEqual(s.batchSizes, [[1, 1, 2, 1]]);
      assert.equal(kv.stats.txns - t0, 3, 'x, the round of DEL c1 + ADD c2, the ADD of c1');
      const ips = [rx, r2, r1].map((r) => formatIP((r[0] as PoolAllocation).ip));
      assert.equal(new Set(ips).size, 3);
      assert.ok(!ips.includes(old), 'the ADDs of round 2 were decided before its DEL freed c1\'s old address; round 3 goes round robin');
      assert.deepEqual(held(kv), ['c1', 'c2', 'x']);
      assert.deepEqual(handles(kv), ['c1', 'c2', 'x'].map((c) => `/ipwarden/pools/p1/handles/${c}/eth0`));
    } finally {
      await s.close();
    }
  });

  it('a round that fails as a whole (an ADD\'s handle cannot be read) is retried one by one: only that ADD fails, the DEL and the other ADD of the round are answered', async () => {
    const kv = new GatedKV();
    const s = new PoolSessions({ NODE_NAME: 'node-a' }, () => kv, () => () => undefined);
    try {
      const old = formatIP(((await s.add(conf, { containerId: 'c1', ifname: 'eth0' }))[0] as PoolAllocation).ip);
      kv.plant('/ipwarden/pools/p1/handles/bad/eth0', '{"v":1}');
      kv.hold = true;
      const px = s.add(conf, { containerId: 'x', ifname: 'eth0' }); // in flight
      await until(() => kv.waiting === 1, 'x is in flight');
      const d1 = s.del(conf, { containerId: 'c1', ifname: 'eth0' });
      const pb = s.add(conf, { containerId: 'bad', ifname: 'eth0' }).then(() => 'resolved', (e: unknown) => e);
      const p2 = s.add(conf, { containerId: 'c2', ifname: 'eth0' });
      kv.release();
      const [rx, r2] = await Promise.all([px, p2]);
      assert.deepEqual(await d1, [old]);
      const eb = await pb;
      assert.ok(isAppError(eb, 'STORE_CORRUPT'), String(eb));
      assert.deepEqual(s.batchSizes, [[1, 1, 3]], 'the round of three failed, then each went alone');
      assert.notEqual(formatIP((rx[0] as PoolAllocation).ip), formatIP((r2[0] as PoolAllocation).ip));
      assert.deepEqual(held(kv), ['c2', 'x']);
      assert.deepEqual(handles(kv), ['bad', 'c2', 'x'].map((c) => `/ipwarden/pools/p1/handles/${c}/eth0`));
      assert.equal(kv.dump()['/ipwarden/pools/p1/handles/bad/eth0'], '{"v":1}', 'the corrupt handle is left as it is');
    } finally {
      await s.close();
    }
  });

  it('a DEL of an ADD in flight waits for it, then releases its address', async () => {
    const kv = new GatedKV();
    const s = new PoolSessions({ NODE_NAME: 'node-a' }, () => kv, () => () => undefined);
    try {
      await s.add(conf, { containerId: 'warm', ifname: 'eth0' });
      kv.hold = true;
      const p1 = s.add(conf, { containerId: 'c1', ifname: 'eth0' });
      await until(() => kv.waiting === 1, 'c1 is in flight');
      let delDone = false;
      const d = s.del(conf, { containerId: 'c1', ifname: 'eth0' }).then((r) => ((delDone = true), r));
      for (let i = 0; i < 50; i++) await new Promise((r) => setImmediate(r));
      assert.equal(delDone, false, 'the DEL waits while the ADD is in flight');
      kv.release();
      const ip = formatIP(((await p1)[0] as PoolAllocation).ip);
      assert.deepEqual(await d, [ip]);
      assert.deepEqual(held(kv), ['warm']);
    } finally {
      await s.close();
    }
  });

  it('an ADD whose client has gone (signal aborted) before its batch is taken is not sent', async () => {
    const kv = new GatedKV();
    const s = new PoolSessions({ NODE_NAME: 'node-a' }, () => kv, () => () => undefined);
    try {
      await s.add(conf, { containerId: 'warm', ifname: 'eth0' });
      kv.hold = true;
      const p1 = s.add(conf, { containerId: 'c1', ifname: 'eth0' });
      await until(() => kv.waiting === 1, 'c1 is in flight');
      const ac = new AbortController();
      const p2 = s.add(conf, { containerId: 'c2', ifname: 'eth0' }, ac.signal).then(() => 'resolved', (e: unknown) => e);
      ac.abort();
      kv.release();
      await p1;
      const e2 = await p2;
      assert.ok(isAppError(e2, 'STORE_CONFLICT') && e2.message === 'ADD of c2/eth0 not sent: its client has gone', String(e2));
      assert.deepEqual(held(kv), ['c1', 'warm']);
    } finally {
      await s.close();
    }
  });

  it('a round first waits for clientsCurrent: an ADD whose client is reported gone meanwhile (a daemon resuming after a stop) is not sent', async () => {
    const kv = new GatedKV();
    const ac = new AbortController();
    let asked = 0;
    // The socket thread's report of the client's end arrives while the round waits for it.
    const clientsCurrent = async (): Promise<void> => {
      asked++;
      ac.abort();
    };
    const s = new PoolSessions({ NODE_NAME: 'node-a' }, () => kv, () => () => undefined, {}, { clientsCurrent });
    try {
      // A round whose ADDs carry no client (no signal) has nothing to wait for.
      await s.add(conf, { containerId: 'warm', ifname: 'eth0' });
      assert.equal(asked, 0);
      const e = await s.add(conf, { containerId: 'c1', ifname: 'eth0' }, ac.signal).then(() => 'resolved', (x: unknown) => x);
      assert.ok(isAppError(e, 'STORE_CONFLICT') && e.message === 'ADD of c1/eth0 not sent: its client has gone', String(e));
      assert.equal(asked, 1);
      assert.deepEqual(held(kv), ['warm']);
    } finally {
      await s.close();
    }
  });

  it('the heartbeat vetoes a removal of the node on every beat; announce() starts it without an ADD (review F2b)', async () => {
    const kv = new MemoryKV();
    const ticks: Array<() => void> = [];
    const s = new PoolSessions({ NODE_NAME: 'node-a' }, () => kv, (fn) => (ticks.push(fn), () => undefined));
    try {
      await s.add(conf, { containerId: 'c1', ifname: 'eth0' });
      const op = new PoolRemoval({ kv, pool: 'p1', prefix: '/ipwarden' });
      const hb = [...s.heartbeats.values()][0] as Heartbeat;
      await until(() => kv.dump()['/ipwarden/pools/p1/alive/node-a'] !== undefined, 'the heartbeat key');
      await op.mark('node-a', { force: true }); // an operator overriding the heartbeat
      assert.ok(kv.dump()['/ipwarden/pools/p1/removing/node-a'] !== undefined);
      await hb.beat();
      assert.equal(kv.dump()['/ipwarden/pools/p1/removing/node-a'], undefined, 'the beat vetoed: marker gone');
      for (const [k, v] of Object.entries(kv.dump())) if (/\/blocks\/[^/]+$/.test(k) && !k.includes('/nodes/')) assert.equal(JSON.parse(v).state, 'owned');
    } finally {
      await s.close();
    }
    // A daemon that restarts idle: announce() alone starts the heartbeat, whose first beat vetoes.
    const kv2 = new MemoryKV();
    const a = new PoolAllocator({ kv: kv2, pool: 'p1', prefix: '/ipwarden', node: 'node-a', network: 'net1', rangeSets: conf.rangeSets, sizes: { blockSize4: 26, blockSize6: 122 } });
    await a.add([{ containerId: 'c1', ifname: 'eth0' }]);
    const op2 = new PoolRemoval({ kv: kv2, pool: 'p1', prefix: '/ipwarden' });
    await op2.mark('node-a');
    const s2 = new PoolSessions({ NODE_NAME: 'node-a' }, () => kv2, () => () => undefined);
    try {
      s2.announce(conf);
      await until(() => kv2.dump()['/ipwarden/pools/p1/removing/node-a'] === undefined, 'announce() vetoed');
      await assert.rejects(op2.finish('node-a'), (e: unknown) => e instanceof Error && e.message.startsWith('node node-a is not marked for removal'));
    } finally {
      await s2.close();
    }
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

  it('review F2a on etcd: a daemon whose cached block is full, marked for removal, vetoes with its next ADD; --finish then refuses', async () => {
    const c = cluster as EtcdCluster;
    const prefix = `/f2${process.pid}`;
    const sessions = new PoolSessions({ NODE_NAME: 'node-f' }, (p) => new EtcdKV({ endpoints: p.etcd.endpoints }), () => () => undefined);
    const direct = new EtcdKV({ endpoints: c.endpoints });
    try {
      const conf = loadIPAMConfig(
        JSON.stringify({ cniVersion: '1.0.0', name: 'net1', ipam: { ranges: [[{ subnet: '10.82.1.0/26' }]], pool: { name: 'fp', etcd: { endpoints: c.endpoints, prefix }, blockSize: 28 } } }),
        undefined,
      );
      for (let i = 0; i < 15; i++) await sessions.add(conf, { containerId: `c${i}`, ifname: 'eth0' }); // one /28 full, in the cache
      const op = new PoolRemoval({ kv: direct, pool: 'fp', prefix });
      // The daemon's heartbeat exists: an operator overriding it with --force.
      assert.equal((await op.mark('node-f', { force: true })).length, 1);
      const r = await sessions.add(conf, { containerId: 'c15', ifname: 'eth0' }); // claims a second block on cached data: the marker compare fails it, it vetoes
      assert.equal(r.length, 1);
      assert.equal(await direct.get(`${prefix}/pools/fp/removing/node-f`), null, 'vetoed: the marker is gone');
      for (const e of await direct.list(`${prefix}/pools/fp/blocks/`)) assert.equal(JSON.parse(e.value).state, 'owned', e.key);
      await assert.rejects(op.finish('node-f'), (e: unknown) => e instanceof Error && e.message.startsWith('node node-f is not marked for removal'));
      assert.equal((await direct.list(`${prefix}/pools/fp/handles/`, { keysOnly: true })).length, 16);
    } finally {
      await sessions.close();
      await direct.close();
    }
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
      // All 48 arrive in one tick: the first round is taken one event-loop turn later, so they go
      // in batches of at most 24 (the transaction op limit).
      assert.deepEqual(sizes, [24, 24]);
      // The daemon's heartbeat for node-d starts with the first ADD (in the background): wait for
      // its key (bounded), so its one transaction is in the counts below.
      const alive = `/s${process.pid}/pools/sp/alive/node-d`;
      for (let i = 0; i < 200 && (await (made as EtcdKV).get(alive)) === null; i++) await new Promise((r) => setTimeout(r, 25));
      assert.notEqual(await (made as EtcdKV).get(alive), null, 'the heartbeat key exists');
      // Its first beat also writes the node's last-seen record (not awaited by the beat): wait for it too.
      const seen = `/s${process.pid}/pools/sp/seen/node-d`;
      for (let i = 0; i < 200 && (await (made as EtcdKV).get(seen)) === null; i++) await new Promise((r) => setTimeout(r, 25));
      assert.notEqual(await (made as EtcdKV).get(seen), null, 'the last-seen key exists');
      const st = (made as EtcdKV).stats;
      // One writer, so every transaction succeeds at once: meta + 2 batches + the heartbeat's two
      // (its node's settings key, create-only, then its put; the settings before the heartbeat key,
      // so they are counted once the key exists) + the last-seen record. Keys put: meta, its
      // cluster pin and the prefix's pool index 3, settings 1, heartbeat 1, seen 1;
      // batch 1: 24 handles + block + affinity (the claim); batch 2: 24 handles + the block (48
      // addresses fit in the first /26's 62).
      assert.deepEqual({ txns: st.txns, txnsSucceeded: st.txnsSucceeded, puts: st.puts, deletes: st.deletes }, { txns: 6, txnsSucceeded: 6, puts: 3 + 1 + 1 + 1 + 26 + 25, deletes: 0 });
      assert.equal((await (made as EtcdKV).get(`/s${process.pid}/pools/sp/nodes/node-d/settings`))?.value, '{"v":1,"offlineSeconds":0}');
      const perAllocation = (st.puts - 5) / 48;
      process.stdout.write(`# 48 ADDs: ${sizes.length} batches (${sizes.join(',')}), ${st.txns} transactions, ${st.puts} keys put: ${perAllocation.toFixed(2)} per allocation\n`);
      const d = await sessions.del(conf, { containerId: 'c0', ifname: 'eth0' });
      assert.deepEqual(d, [ips[0]]);
      // The DEL kept the node's shared block cache current: the next ADD reads nothing (its
      // handle taken as absent, compared absent) and its one transaction succeeds.
      const before = { ...(made as EtcdKV).stats };
      await sessions.add(conf, { containerId: 'c99', ifname: 'eth0' });
      const after = (made as EtcdKV).stats;
      assert.deepEqual([after.reads - before.reads, after.txns - before.txns, after.txnsSucceeded - before.txnsSucceeded], [0, 1, 1]);
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

  it('concurrent ADDs and DELs of one node go out together: one transaction per round, its block written once, every answer right (issue 18 item 5)', async () => {
    const c = cluster as EtcdCluster;
    const prefix = `/r${process.pid}`;
    // The allocator's transactions wait at a gate while `gate.hold` is set (the test decides when etcd answers).
    const gate = { hold: false, waiting: 0, open: [] as Array<() => void> };
    let made: EtcdKV | undefined;
    const sessions = new PoolSessions(
      { NODE_NAME: 'node-r' },
      (p) => {
        const kv = new EtcdKV({ endpoints: p.etcd.endpoints });
        made = kv;
        return new Proxy(kv, {
          get(target, prop) {
            if (prop === 'txn') {
              return async (cmp: Parameters<EtcdKV['txn']>[0], ops: Parameters<EtcdKV['txn']>[1]) => {
                if (gate.hold) {
                  gate.waiting++;
                  await new Promise<void>((r) => gate.open.push(r));
                  gate.waiting--;
                }
                return target.txn(cmp, ops);
              };
            }
            const v = Reflect.get(target, prop, target) as unknown;
            return typeof v === 'function' ? (v as (...a: unknown[]) => unknown).bind(target) : v;
          },
        });
      },
      () => () => undefined, // no periodic beats: the heartbeat's first beat only
    );
    const req = (id: string) => ({ containerId: id, ifname: 'eth0' });
    try {
      const netconf = JSON.stringify({ cniVersion: '1.0.0', name: 'net1', ipam: { ranges: [[{ subnet: '10.236.91.0/24' }]], pool: { name: 'rp', etcd: { endpoints: c.endpoints, prefix }, blockSize: 27 } } });
      const conf = loadIPAMConfig(netconf, undefined);
      const id = loadNetworkIdentity(netconf);
      const first = await Promise.all(Array.from({ length: 20 }, (_, i) => sessions.add(conf, req(`c${i}`))));
      const held = new Map(first.map((r, i) => [`c${i}`, formatIP((r[0] as PoolAllocation).ip)]));
      assert.equal(new Set(held.values()).size, 20);
      assert.equal(new Set(first.map((r) => (r[0] as PoolAllocation).block)).size, 1, 'one /27 holds them');
      const kv = made as EtcdKV;
      // The heartbeat's first beat (its two transactions) before the counts below: wait for its key (bounded).
      const alive = `${prefix}/pools/rp/alive/node-r`;
      for (let i = 0; i < 400 && (await kv.get(alive)) === null; i++) await new Promise((r) => setTimeout(r, 25));
      assert.notEqual(await kv.get(alive), null, 'the heartbeat key exists');
      // x0 in flight at the gate; meanwhile 8 ADDs and 10 DELs (of c0–c9) queue behind it.
      gate.hold = true;
      const x0 = sessions.add(conf, req('x0'));
      await until(() => gate.waiting === 1, 'x0 in flight');
      const s0 = { ...kv.stats };
      const adds = Array.from({ length: 8 }, (_, i) => sessions.add(conf, req(`a${i}`)));
      const dels = Array.from({ length: 10 }, (_, i) => sessions.del(id, req(`c${i}`)));
      gate.hold = false;
      for (const r of gate.open.splice(0)) r();
      const [rx, ra, rd] = await Promise.all([x0, Promise.all(adds), Promise.all(dels)]);
      assert.deepEqual(sessions.batchSizes, [[20, 1, 18]], 'the 8 ADDs and 10 DELs went as one batch');
      // Every DEL released exactly its container's address.
      assert.deepEqual(rd, Array.from({ length: 10 }, (_, i) => [held.get(`c${i}`)]));
      // Every ADD got an address nobody else holds (the ADDs are decided before the round's DELs).
      const newIps = [rx, ...ra].map((r) => formatIP((r[0] as PoolAllocation).ip));
      const still = Array.from({ length: 10 }, (_, i) => held.get(`c${i + 10}`));
      assert.equal(new Set([...newIps, ...still, ...rd.flat()]).size, 9 + 10 + 10);
      // Two transactions since the gate closed, both committed: x0's (its handle + the block) and
      // the round's (8 handles put, 10 deleted, the block put once). No read: the ADDs' handles
      // are taken as absent, the DELs' as the daemon wrote them (each compared); the block comes
      // from the cache.
      const st = kv.stats;
      assert.deepEqual(
        { reads: st.reads - s0.reads, txns: st.txns - s0.txns, ok: st.txnsSucceeded - s0.txnsSucceeded, puts: st.puts - s0.puts, deletes: st.deletes - s0.deletes },
        { reads: 0, txns: 2, ok: 2, puts: 2 + 9, deletes: 10 },
      );
      // etcd holds exactly the survivors' handles, and the block exactly their allocations.
      const handles = (await kv.list(`${prefix}/pools/rp/handles/`)).map((e) => e.key.slice(`${prefix}/pools/rp/handles/`.length)).sort();
      const want = ['x0', ...Array.from({ length: 8 }, (_, i) => `a${i}`), ...Array.from({ length: 10 }, (_, i) => `c${i + 10}`)].map((k) => `${k}/eth0`).sort();
      assert.deepEqual(handles, want);
      const blocks = await kv.list(`${prefix}/pools/rp/blocks/`);
      assert.equal(blocks.length, 1);
      const allocs = Object.values(JSON.parse((blocks[0] as { value: string }).value).allocs as Record<string, { id: string }>).map((a) => `${a.id}/eth0`).sort();
      assert.deepEqual(allocs, want);
    } finally {
      gate.hold = false;
      for (const r of gate.open.splice(0)) r();
      await sessions.close();
    }
  });
});

describe('PoolSessions after etcd is restored from a snapshot (real etcd)', { skip }, () => {
  let cluster: EtcdCluster | undefined;
  let tmp = '';
  before(async () => {
    tmp = mkdtempSync(join(tmpdir(), 'ipwarden-pool-sessions-restore-'));
    cluster = await startEtcdCluster({ members: 1, prefix: 'ipwarden-pool-sessions-restore-etcd-' });
  });
  after(async () => {
    await cluster?.close();
    if (tmp !== '') rmSync(tmp, { recursive: true, force: true });
  });

  it("the daemon's first round after the restore sees the revision gone back: logs it once, drops its cached blocks, allocates on fresh reads", async () => {
    const c = cluster as EtcdCluster;
    const m0 = c.members[0] as EtcdCluster['members'][number];
    const lines: Array<[string, Record<string, unknown>, string]> = [];
    const sessions = new PoolSessions({ NODE_NAME: 'node-r' }, (p) => new EtcdKV({ endpoints: p.etcd.endpoints }), () => () => undefined, {}, { log: (level, fields, msg) => void lines.push([level, fields, msg]) });
    const direct = new EtcdKV({ endpoints: c.endpoints });
    const etcdctl = (...a: string[]): void => {
      const r = spawnSync(ETCDCTL_BIN, a, { encoding: 'utf8', env: { PATH: '/usr/bin:/bin', ETCDCTL_API: '3' } });
      assert.equal(r.status, 0, `etcdctl ${a.join(' ')}: ${r.stderr}`);
    };
    const ip = (r: PoolAllocation[]): string => formatIP((r[0] as PoolAllocation).ip);
    try {
      const prefix = `/rs${process.pid}`;
      const conf = loadIPAMConfig(JSON.stringify({ cniVersion: '1.0.0', name: 'net1', ipam: { ranges: [[{ subnet: '10.82.3.0/26' }]], pool: { name: 'rp', etcd: { endpoints: c.endpoints, prefix }, blockSize: 28 } } }), undefined);
      const a0 = ip(await sessions.add(conf, { containerId: 'c0', ifname: 'eth0' }));
      const snap = join(tmp, 'backup.db');
      etcdctl('--endpoints', c.endpoints.join(','), 'snapshot', 'save', snap);
      const a1 = ip(await sessions.add(conf, { containerId: 'c1', ifname: 'eth0' }));
      const a2 = ip(await sessions.add(conf, { containerId: 'c2', ifname: 'eth0' }));
      assert.deepEqual(lines.filter((l) => l[0] !== 'info'), []);
      await c.kill(0);
      rmSync(m0.dataDir, { recursive: true, force: true });
      etcdctl('snapshot', 'restore', snap, '--name', m0.name, '--data-dir', m0.dataDir, '--initial-cluster', `${m0.name}=${m0.peerUrl}`, '--initial-cluster-token', c.token, '--initial-advertise-peer-urls', m0.peerUrl);
      await c.restart(0);
      // The restored pool lost c1 and c2: the next ADD gets c1's address, decided on what etcd holds.
      assert.equal(ip(await sessions.add(conf, { containerId: 'c3', ifname: 'eth0' })), a1);
      assert.equal(ip(await sessions.add(conf, { containerId: 'c4', ifname: 'eth0' })), a2);
      const warned = lines.filter((l) => l[0] !== 'info');
      assert.deepEqual(warned.map(([level, f, msg]) => [level, f['pool'], f['endpoints'], msg]), [
        ['warn', 'rp', c.endpoints.join(','), "etcd's revision went backwards (restored from a snapshot?): cached blocks dropped; restart the daemons"],
      ]);
      // The revisions depend on the daemon's background heartbeat writes: the one seen before is higher.
      assert.ok(BigInt(warned[0]?.[1]['highestRevision'] as string) > BigInt(warned[0]?.[1]['revision'] as string), JSON.stringify(warned[0]?.[1]));
      const blk = JSON.parse((await direct.list(`${prefix}/pools/rp/blocks/`))[0]?.value ?? 'null') as { allocs: Record<string, { id: string }> };
      assert.deepEqual(Object.values(blk.allocs).map((x) => x.id), ['c0', 'c3', 'c4']);
      assert.deepEqual([a0, a1, a2], ['10.82.3.32', '10.82.3.33', '10.82.3.34'], 'node-r claims 10.82.3.32-28 (its name\'s hash)');
    } finally {
      await sessions.close();
      await direct.close();
    }
  });
});
