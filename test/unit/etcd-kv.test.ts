/**
 * The etcd client (src/store/etcd/etcd-kv.ts) on a real etcd (test/helpers/etcd-cluster.ts, one
 * member on loopback): leases, failover across endpoints, the random first endpoint, the errors of
 * an all-dead or unreachable endpoint set; and the conversion of etcd's gRPC errors. With CI=true a
 * missing /usr/bin/etcd fails the real-etcd part instead of skipping it. (The pool's own suites
 * cover the client under the allocator.)
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { isAppError } from '../../src/common/errors.ts';
import { convertEtcdError, EtcdKV } from '../../src/store/etcd/etcd-kv.ts';
import { haveEtcd, startEtcdCluster, type EtcdCluster } from '../helpers/etcd-cluster.ts';

const CI = process.env['CI'] === 'true';
const etcdSkip = haveEtcd() || CI ? false : '/usr/bin/etcd not installed';

describe('EtcdKV on a real etcd', { skip: etcdSkip }, () => {
  let cluster: EtcdCluster | undefined;
  let kv: EtcdKV | undefined;
  before(async () => {
    cluster = await startEtcdCluster({ members: 1, prefix: 'ipwarden-pool-etcdkv-' });
    kv = new EtcdKV({ endpoints: cluster.endpoints });
  });
  after(async () => {
    await kv?.close();
    await cluster?.close();
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
