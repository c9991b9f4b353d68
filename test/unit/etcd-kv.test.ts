/**
 * EtcdStore (src/store/etcd/etcd-store.ts): the one Store contract suite on the memory KV and on a
 * real etcd (test/helpers/etcd-cluster.ts, one member on loopback), plus its own rules: malformed
 * values are STORE_CORRUPT naming the key (never listed as free, never released), the backend lists
 * and opens networks, every write is revision-checked (a racing writer makes a release re-decide).
 * With CI=true a missing /usr/bin/etcd fails the real-etcd part instead of skipping it.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { isAppError } from '../../src/common/errors.ts';
import type { KV } from '../../src/store/kv.ts';
import { convertEtcdError, EtcdKV } from '../../src/store/etcd/etcd-kv.ts';
import { EtcdBackend, EtcdStore } from '../../src/store/etcd/etcd-store.ts';
import { MemoryKV } from '../../src/store/memory/memory-kv.ts';
import { haveEtcd, startEtcdCluster, type EtcdCluster } from '../helpers/etcd-cluster.ts';
import { runStoreContract } from './store-contract.ts';

const CI = process.env['CI'] === 'true';
const etcdSkip = haveEtcd() || CI ? false : '/usr/bin/etcd not installed';

let n = 0;
/** A fixture on `kv` in a fresh key prefix. */
function fixtureOn(kv: () => KV) {
  return async () => {
    const prefix = `/t${process.pid}-${++n}`;
    const store = new EtcdStore({ kv: kv(), network: 'net1', prefix, node: 'node-a', now: () => 1_700_000_000_000 });
    await store.ensureMarker();
    return {
      store,
      plant: async (ip: string, owner: { containerId: string; ifname: string | null } | null) => {
        const value = owner === null ? '' : JSON.stringify({ v: 1, id: owner.containerId, ifname: owner.ifname, at: 1 });
        await kv().txn([], [{ put: store.ipKey(ip), value }]);
      },
    };
  };
}

const memKV = new MemoryKV();
runStoreContract('EtcdStore on MemoryKV', fixtureOn(() => memKV));

describe('EtcdStore on a real etcd', { skip: etcdSkip }, () => {
  let cluster: EtcdCluster | undefined;
  let kv: EtcdKV | undefined;
  before(async () => {
    cluster = await startEtcdCluster({ members: 1, prefix: 'ipwarden-pool-etcdstore-' });
    kv = new EtcdKV({ endpoints: cluster.endpoints });
  });
  after(async () => {
    await kv?.close();
    await cluster?.close();
  });
  runStoreContract('EtcdStore on etcd', fixtureOn(() => kv as EtcdKV));

  it('lists a reservation with the node that wrote it, its time and its revision', async () => {
    const f = await fixtureOn(() => kv as EtcdKV)();
    await f.store.lock(1);
    assert.equal(await f.store.reserve('10.80.0.2', { containerId: 'c1', ifname: 'eth0' }, 0), true);
    const [r] = await f.store.list();
    assert.deepEqual(r?.owner, { containerId: 'c1', ifname: 'eth0', node: 'node-a' });
    assert.equal(r?.mtimeMs, 1_700_000_000_000);
    assert.match(r?.revision ?? '', /^[1-9][0-9]*$/);
    await f.store.close();
  });

  it('leases: a key put with one lives while it is renewed and goes when it is revoked', async () => {
    const k = kv as EtcdKV;
    const id = await k.grantLease(5);
    assert.match(id, /^[1-9][0-9]*$/);
    await k.txn([], [{ put: '/lease/x', value: 'y', lease: id }]);
    assert.equal(await k.keepAlive(id), 5);
    await k.revokeLease(id);
    assert.equal(await k.get('/lease/x'), null);
    assert.equal(await k.keepAlive(id), 0, 'a revoked lease renews to TTL 0');
    await k.revokeLease(id); // already gone: fine
  });

  it('fails over: a dead first endpoint, then the live one answers', async () => {
    const two = new EtcdKV({ endpoints: ['http://127.0.0.1:1', ...(cluster as EtcdCluster).endpoints], firstEndpoint: 0 });
    try {
      assert.deepEqual(await two.txn([], [{ put: '/failover/x', value: 'y' }]).then((r) => r.succeeded), true);
      assert.equal((await two.get('/failover/x'))?.value, 'y');
    } finally {
      await two.close();
    }
  });

  it('starts at a random endpoint by default (processes spread over the members), at firstEndpoint when given', async () => {
    const eps = ['http://127.0.0.1:1', 'http://127.0.0.1:2', 'http://127.0.0.1:3'];
    const starts = new Set<string>();
    // Which endpoint a call tries first shows in the error of an all-dead set: the last one tried is named.
    for (let i = 0; i < 3; i++) {
      const k = new EtcdKV({ endpoints: eps, callTimeoutMs: 3000, firstEndpoint: i });
      try {
        await assert.rejects(k.get('/x'), (e: unknown) => isAppError(e, 'STORE_UNAVAILABLE') && e.message.startsWith(`etcd at ${eps[(i + 2) % 3] as string} is unavailable`));
      } finally {
        await k.close();
      }
    }
    const orig = Math.random;
    try {
      for (const r of [0, 0.4, 0.9]) {
        Math.random = () => r;
        const k = new EtcdKV({ endpoints: eps, callTimeoutMs: 3000 });
        try {
          await k.get('/x').catch((e: unknown) => starts.add((e as Error).message.slice(0, 'etcd at http://127.0.0.1:1'.length)));
        } finally {
          await k.close();
        }
      }
    } finally {
      Math.random = orig;
    }
    assert.deepEqual([...starts].sort(), ['etcd at http://127.0.0.1:1', 'etcd at http://127.0.0.1:2', 'etcd at http://127.0.0.1:3']);
  });

  it('an all-dead endpoint set names the last member tried and what each other one answered', async () => {
    const k = new EtcdKV({ endpoints: ['http://127.0.0.1:1', 'http://127.0.0.1:2'], callTimeoutMs: 2000, firstEndpoint: 0 });
    try {
      await assert.rejects(k.get('/x'), (e: unknown) => isAppError(e, 'STORE_UNAVAILABLE') && e.isRetryable
        && /^etcd at http:\/\/127\.0\.0\.1:2 is unavailable: get \/x: UNAVAILABLE: .* \(also tried http:\/\/127\.0\.0\.1:1: UNAVAILABLE: .*\)$/.test(e.message));
    } finally {
      await k.close();
    }
  });

  it('an unreachable etcd is STORE_UNAVAILABLE (CNI 11, retryable), within the call deadline', async () => {
    const dead = new EtcdKV({ endpoints: ['http://127.0.0.1:1'], callTimeoutMs: 500 });
    try {
      await assert.rejects(dead.get('/x'), (e: unknown) => isAppError(e, 'STORE_UNAVAILABLE') && e.cniCode === 11 && e.isRetryable && e.message.startsWith('etcd at http://127.0.0.1:1 is unavailable: get /x: '));
    } finally {
      await dead.close();
    }
    await assert.rejects(dead.get('/x'), (e: unknown) => isAppError(e, 'CLOSED'));
  });
});

describe('etcd error conversion (convertEtcdError)', () => {
  const grpcErr = (code: number, details: string) => Object.assign(new Error(details), { code, details });
  it("etcd 3.4's UNKNOWN 'context deadline exceeded' (quorum lost, trial finding 6) is STORE_UNAVAILABLE, code 11", () => {
    const e = convertEtcdError(grpcErr(2, 'context deadline exceeded'), 'get /k', 'http://h:1');
    assert.equal(e.code, 'STORE_UNAVAILABLE');
    assert.equal(e.cniCode, 11);
    assert.equal(e.message, 'etcd at http://h:1 is unavailable: get /k: UNKNOWN: context deadline exceeded');
  });
  it('any other UNKNOWN stays STORE_IO, code 5', () => {
    const e = convertEtcdError(grpcErr(2, 'mvcc: database space exceeded'), 'txn', 'http://h:1');
    assert.equal(e.code, 'STORE_IO');
    assert.equal(e.message, 'etcd at http://h:1: txn failed: UNKNOWN: mvcc: database space exceeded');
  });
});

describe('EtcdStore rules (memory KV)', () => {
  const bad: Array<[string, string, string]> = [
    ['not JSON', '{', 'not valid JSON'],
    ['an array', '[]', 'not a JSON object'],
    ['another version', '{"v":2,"id":"c1","ifname":"eth0","at":1}', 'unknown value version 2 (this ipwarden writes 1)'],
    ['a bad container ID', '{"v":1,"id":"../x","ifname":"eth0","at":1}', '"id" must be a valid container ID'],
    ['an empty ifname', '{"v":1,"id":"c1","ifname":"","at":1}', '"ifname" must be a non-empty string or null'],
    ['no time', '{"v":1,"id":"c1","ifname":"eth0"}', '"at" must be a number (milliseconds since the epoch)'],
  ];
  for (const [name, value, why] of bad) {
    it(`a value that is ${name} is STORE_CORRUPT naming the key, and is not released`, async () => {
      const kv = new MemoryKV();
      const store = new EtcdStore({ kv, network: 'net1' });
      await store.lock(1);
      kv.plant('/ipwarden/networks/net1/ips/10.80.0.9', value);
      await assert.rejects(store.list(), (e: unknown) => isAppError(e, 'STORE_CORRUPT') && e.message === `etcd key /ipwarden/networks/net1/ips/10.80.0.9: ${why}`);
      await assert.rejects(store.releaseByOwner('c1', 'eth0'), (e: unknown) => isAppError(e, 'STORE_CORRUPT'));
      await assert.rejects(store.release('10.80.0.9', null), (e: unknown) => isAppError(e, 'STORE_CORRUPT'));
      assert.equal(kv.dump()['/ipwarden/networks/net1/ips/10.80.0.9'], value);
    });
  }

  it('a key that does not end in a canonical IP is STORE_CORRUPT', async () => {
    const kv = new MemoryKV();
    const store = new EtcdStore({ kv, network: 'net1' });
    await store.lock(1);
    kv.plant('/ipwarden/networks/net1/ips/10.80.0.09', '');
    await assert.rejects(store.list(), (e: unknown) => isAppError(e, 'STORE_CORRUPT') && e.message === 'etcd key /ipwarden/networks/net1/ips/10.80.0.09: the key does not end in a canonical IP');
  });

  it('a release re-decides when another writer changed the key in between (revision check)', async () => {
    const kv = new MemoryKV();
    const store = new EtcdStore({ kv, network: 'net1' });
    await store.lock(1);
    await store.reserve('10.80.0.2', { containerId: 'c1', ifname: 'eth0' }, 0);
    // Just before the release's transaction, another node re-allocates the address to c2.
    kv.beforeTxn = () => {
      kv.beforeTxn = null;
      kv.apply([], [{ put: store.ipKey('10.80.0.2'), value: JSON.stringify({ v: 1, id: 'c2', ifname: 'eth0', at: 2 }) }]);
    };
    assert.equal(await store.release('10.80.0.2', { containerId: 'c1', ifname: 'eth0' }), false);
    assert.deepEqual((await store.list()).map((r) => r.owner?.containerId), ['c2']);
  });

  it('the backend lists the networks it has and opens only those without create', async () => {
    const kv = new MemoryKV();
    const b = new EtcdBackend({ kv });
    assert.deepEqual(await b.listNetworks(), []);
    assert.equal(await b.open('net2', { create: false }), null);
    const s = await b.open('net2', { create: true });
    await s?.lock(1);
    await s?.reserve('10.80.0.2', { containerId: 'c1', ifname: 'eth0' }, 0);
    await (await b.open('net1', { create: true }))?.close();
    assert.deepEqual(await b.listNetworks(), ['net1', 'net2']);
    assert.notEqual(await b.open('net2', { create: false }), null);
    await b.close();
    await b.close();
    await assert.rejects(b.listNetworks(), (e: unknown) => isAppError(e, 'CLOSED'));
  });
});
