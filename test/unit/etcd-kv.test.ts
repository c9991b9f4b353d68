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
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ETCDCTL_BIN, haveEtcd, startEtcdCluster, type EtcdCluster } from '../helpers/etcd-cluster.ts';

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

describe('EtcdKV value compares and a revision gone backwards (real etcd restored from a snapshot)', { skip: etcdSkip }, () => {
  let cluster: EtcdCluster | undefined;
  let kv: EtcdKV | undefined;
  let tmp = '';
  const told: Array<[string, string]> = [];
  before(async () => {
    tmp = mkdtempSync(join(tmpdir(), 'ipwarden-etcdkv-restore-'));
    cluster = await startEtcdCluster({ members: 1, prefix: 'ipwarden-etcdkv-restore-etcd-' });
    kv = new EtcdKV({ endpoints: cluster.endpoints });
    kv.onRevisionBackwards = (highest, now) => void told.push([highest, now]);
  });
  after(async () => {
    await kv?.close();
    await cluster?.close();
    if (tmp !== '') rmSync(tmp, { recursive: true, force: true });
  });
  function etcdctl(...a: string[]): void {
    const r = spawnSync(ETCDCTL_BIN, a, { encoding: 'utf8', env: { PATH: '/usr/bin:/bin', ETCDCTL_API: '3' } });
    assert.equal(r.status, 0, `etcdctl ${a.join(' ')}: ${r.stderr}`);
  }

  it('a value compare holds on equal text only and fails on a missing key (etcd Compare VALUE EQUAL)', async () => {
    const k = kv as EtcdKV;
    assert.deepEqual(await k.txn([], [{ put: '/v/k', value: 'v1' }]), { succeeded: true, revision: '2' });
    assert.deepEqual(await k.txn([{ key: '/v/k', value: 'v2' }], [{ put: '/v/k', value: 'x' }]), { succeeded: false, revision: '2' });
    assert.deepEqual(await k.txn([{ key: '/v/absent', value: '' }], [{ put: '/v/k', value: 'x' }]), { succeeded: false, revision: '2' });
    assert.deepEqual(await k.txn([{ key: '/v/k', value: 'v1' }, { key: '/v/k', modRevision: '2' }], [{ put: '/v/k', value: 'v2' }]), { succeeded: true, revision: '3' });
    assert.equal((await k.get('/v/k'))?.value, 'v2');
  });

  it('an answer below the highest revision seen bumps the generation and tells the hook once', async () => {
    const c = cluster as EtcdCluster;
    const k = kv as EtcdKV;
    const m0 = c.members[0] as EtcdCluster['members'][number];
    assert.deepEqual(await k.txn([], [{ put: '/r/a', value: '1' }]), { succeeded: true, revision: '4' });
    const snap = join(tmp, 'backup.db');
    etcdctl('--endpoints', c.endpoints.join(','), 'snapshot', 'save', snap);
    for (const x of ['b', 'c', 'd']) await k.txn([], [{ put: `/r/${x}`, value: '1' }]);
    assert.equal((await k.get('/r/d'))?.modRevision, '7');
    assert.equal(k.generation, 0);
    // The runbook's restore: the member from the backup, with the cluster's token (same cluster ID).
    await c.kill(0);
    rmSync(m0.dataDir, { recursive: true, force: true });
    etcdctl('snapshot', 'restore', snap, '--name', m0.name, '--data-dir', m0.dataDir, '--initial-cluster', `${m0.name}=${m0.peerUrl}`, '--initial-cluster-token', c.token, '--initial-advertise-peer-urls', m0.peerUrl);
    await c.restart(0);
    assert.deepEqual((await k.list('/r/')).map((e) => [e.key, e.modRevision]), [['/r/a', '4']]);
    assert.equal(k.generation, 1);
    assert.deepEqual(told, [['7', '4']]);
    // New writes reuse the revisions (5, …): no further change, no second word.
    assert.deepEqual(await k.txn([], [{ put: '/r/e', value: '1' }]), { succeeded: true, revision: '5' });
    assert.equal(k.generation, 1);
    assert.deepEqual(told, [['7', '4']]);
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
  it("grpc-js's empty trailing 'Resolution note: ' is not repeated in the message; a note with text is kept", () => {
    const e = convertEtcdError(grpcErr(14, 'No connection established. Last error: Error: connect ECONNREFUSED 127.0.0.1:2. Resolution note: '), 'range /p/', 'http://127.0.0.1:2');
    assert.equal(e.message, 'etcd at http://127.0.0.1:2 is unavailable: range /p/: UNAVAILABLE: No connection established. Last error: Error: connect ECONNREFUSED 127.0.0.1:2');
    const n = convertEtcdError(grpcErr(14, 'No addresses resolved. Resolution note: DNS resolution failed'), 'range /p/', 'http://x:2');
    assert.equal(n.message, 'etcd at http://x:2 is unavailable: range /p/: UNAVAILABLE: No addresses resolved. Resolution note: DNS resolution failed');
  });
  it('any other UNKNOWN stays STORE_IO, code 5', () => {
    const e = convertEtcdError(grpcErr(2, 'mvcc: database space exceeded'), 'txn', 'http://h:1');
    assert.equal(e.code, 'STORE_IO');
    assert.equal(e.message, 'etcd at http://h:1: txn failed: UNKNOWN: mvcc: database space exceeded');
  });
});
