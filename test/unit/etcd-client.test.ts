/**
 * The etcd client's configuration rules, without a server (the real-etcd tests are
 * test/blackbox/pool-etcd-cluster.test.ts and pool-etcd-tls.test.ts):
 *
 * - `tlsFailureOf`: the TLS handshake texts of Node/OpenSSL (as grpc-js reports them) read as
 *   code 7 or 5 with the cause and the key to check, exactly; a refused connection or a timeout
 *   is not a TLS failure;
 * - the credentials file (`ipam.pool.etcd.credentials`) read under the trust rules, every refusal
 *   exact;
 * - the pool's cluster guard in `PoolAllocator.checkMeta` on the memory KV with an injected
 *   cluster check: a pool is created only when every endpoint answered (exact code-11 text,
 *   nothing written), its cluster pinned (exact value), a pin naming another cluster refused (exact
 *   code-7 text), an older pool pinned by a complete check only, a corrupt pin;
 * - the TLS files' re-check: at most every `tlsRecheckMs` before a call, at once after a failed
 *   call, read again only when the stamp changed;
 * - the offline budget's refusal texts (`outOfBudget`).
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { chmodSync, chownSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { AppError, isAppError } from '../../src/common/errors.ts';
import { readEtcdCredentials } from '../../src/pool/credentials.ts';
import { outOfBudget } from '../../src/pool/contact.ts';
import { loadIPAMConfig } from '../../src/ipam/config.ts';
import { PoolAllocator } from '../../src/pool/allocator.ts';
import { EtcdKV, tlsFailureOf, type EtcdTlsSource } from '../../src/store/etcd/etcd-kv.ts';
import type { ClusterCheck } from '../../src/store/kv.ts';
import { MemoryKV } from '../../src/store/memory/memory-kv.ts';

/** The prefix's pool index (src/pool/overlap.ts), written in meta's transaction. */
const REG = '/ipwarden/pool-ranges';
const REG_VALUE = '{"v":1,"pools":{"p1":[{"subnet":"10.80.0.0/27","rangeStart":"10.80.0.1","rangeEnd":"10.80.0.30"}]}}';

describe('tlsFailureOf (TLS handshake texts → code and cause)', () => {
  const ca = '— check ipam.pool.etcd.tls.ca';
  const cases: Array<[string, string, boolean, { code: string; why: string } | null]> = [
    ['our CA did not sign etcd\'s leaf', 'No connection established. Last error: Error: unable to verify the first certificate. Resolution note: ', true,
      { code: 'IPAM_INVALID_CONFIG', why: `certificate signed by unknown authority (unable to verify the first certificate) ${ca}` }],
    ['a chain ending in a CA we do not have (OpenSSL 3 spelling)', 'No connection established. Last error: Error: self-signed certificate in certificate chain. Resolution note: ', true,
      { code: 'IPAM_INVALID_CONFIG', why: `certificate signed by unknown authority (self-signed certificate in certificate chain) ${ca}` }],
    ['issuer not found', 'Last error: Error: unable to get local issuer certificate', false,
      { code: 'IPAM_INVALID_CONFIG', why: `certificate signed by unknown authority (unable to get local issuer certificate) ${ca}` }],
    ['etcd refuses our certificate', 'No connection established. Last error: 800CA222E57F0000:error:0A000412:SSL routines:ssl3_read_bytes:sslv3 alert bad certificate:../deps/openssl/openssl/ssl/record/rec_layer_s3.c:1601:SSL alert number 42\n (2026-12-05T23:50:53.899Z). Resolution note: ', true,
      { code: 'IPAM_INVALID_CONFIG', why: "etcd refused the client certificate (TLS alert 42: bad certificate) — check ipam.pool.etcd.tls.cert and ipam.pool.etcd.tls.key: their CA must be in etcd's --trusted-ca-file" }],
    ['etcd asks for a certificate we do not have (TLS 1.3 alert)', 'Last error: 80:error:0A00045C:SSL routines::tlsv13 alert certificate required:ssl/record/rec_layer_s3.c:1605:SSL alert number 116', false,
      { code: 'IPAM_INVALID_CONFIG', why: 'etcd requires a client certificate (TLS alert 116: certificate required) — set ipam.pool.etcd.tls.cert and ipam.pool.etcd.tls.key' }],
    ['unknown CA alert', 'error:0A000418:SSL routines::tlsv1 alert unknown ca:ssl/record/rec_layer_s3.c:1605:SSL alert number 48', true,
      { code: 'IPAM_INVALID_CONFIG', why: "etcd refused the client certificate (TLS alert 48: unknown ca) — check ipam.pool.etcd.tls.cert and ipam.pool.etcd.tls.key: their CA must be in etcd's --trusted-ca-file" }],
    ['no common version or cipher', 'error:0A000410:SSL routines::sslv3 alert handshake failure:ssl/record/rec_layer_s3.c:1605:SSL alert number 40', true,
      { code: 'IPAM_INVALID_CONFIG', why: 'etcd ended the handshake (TLS alert 40: handshake failure) — check the TLS versions and ciphers etcd accepts' }],
    ['an expired certificate', 'Last error: Error: certificate has expired', true, { code: 'STORE_IO', why: "etcd's certificate (or a CA of its chain) has expired — renew it" }],
    ['a certificate not yet valid', 'Last error: Error: certificate is not yet valid', true, { code: 'STORE_IO', why: "etcd's certificate is not yet valid — check this node's clock and etcd's certificate" }],
    ['a certificate for another host', "Last error: Error [ERR_TLS_CERT_ALTNAME_INVALID]: Hostname/IP does not match certificate's altnames: IP: 127.0.0.2 is not in the cert's list: 127.0.0.1. Resolution note: ", true,
      { code: 'IPAM_INVALID_CONFIG', why: "etcd's certificate does not name the endpoint's host (Hostname/IP does not match certificate's altnames: IP: 127.0.0.2 is not in the cert's list: 127.0.0.1) — use a host name or address its certificate lists in ipam.pool.etcd.endpoints" }],
    ['a refused connection (a member down)', 'No connection established. Last error: Error: connect ECONNREFUSED 127.0.0.1:2379. Resolution note: ', true, null],
    ['a timeout', 'Deadline exceeded after 1.667s', true, null],
    ['a peer that closed during the handshake (a proxy whose backend is down)', 'No connection established. Last error: Error: Client network socket disconnected before secure TLS connection was established. Resolution note: ', true, null],
  ];
  for (const [what, text, cert, want] of cases) {
    it(`${what}: ${want === null ? 'not a TLS failure' : `${want.code}`}`, () => {
      assert.deepEqual(tlsFailureOf(text, cert), want);
    });
  }
});

describe('the credentials file (ipam.pool.etcd.credentials) under the trust rules', () => {
  const withDir = (f: (dir: string) => void): void => {
    const dir = mkdtempSync(join(tmpdir(), 'ipwarden-creds-'));
    try {
      f(dir);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  };
  const write = (path: string, text: string, mode = 0o600): string => {
    writeFileSync(path, text, { mode });
    chmodSync(path, mode);
    return path;
  };
  const refused = (path: string, code: 'IPAM_INVALID_CONFIG' | 'IPAM_IO', msg: string): void => {
    assert.throws(() => readEtcdCredentials(path), (e: unknown) => isAppError(e, code) && e.message === msg, msg);
  };

  it('reads {"user","password"} from a root-owned 0600 file in a root-owned directory', () => {
    withDir((dir) => assert.deepEqual(readEtcdCredentials(write(join(dir, 'c.json'), '{"user":"ipwarden","password":"s3cret"}')), { user: 'ipwarden', password: 's3cret' }));
  });

  it('refuses, exactly: readable or writable by others, owned by another user, a symlink, not a regular file, a writable directory; missing is code 5', () => {
    withDir((dir) => {
      const body = '{"user":"u","password":"p"}';
      refused(write(join(dir, 'r.json'), body, 0o644), 'IPAM_INVALID_CONFIG', `ipam.pool.etcd.credentials: ${join(dir, 'r.json')} is readable by others (mode 644): a password file must not be`);
      const g = write(join(dir, 'g.json'), body, 0o640);
      chownSync(g, 0, 65534);
      refused(g, 'IPAM_INVALID_CONFIG', `ipam.pool.etcd.credentials: ${g} is readable by group 65534 (mode 640): a password file must not be`);
      const g0 = write(join(dir, 'g0.json'), '{"user":"u0","password":"p0"}', 0o640);
      chownSync(g0, 0, 0);
      assert.deepEqual(readEtcdCredentials(g0), { user: 'u0', password: 'p0' });
      refused(write(join(dir, 'w.json'), body, 0o620), 'IPAM_INVALID_CONFIG', `ipam.pool.etcd.credentials: ${join(dir, 'w.json')} is writable by group or others (mode 620)`);
      const o = write(join(dir, 'o.json'), body);
      chownSync(o, 65534, 65534);
      refused(o, 'IPAM_INVALID_CONFIG', `ipam.pool.etcd.credentials: ${o} is owned by uid 65534`);
      const real = write(join(dir, 'real.json'), body);
      symlinkSync(real, join(dir, 'link.json'));
      refused(join(dir, 'link.json'), 'IPAM_INVALID_CONFIG', `ipam.pool.etcd.credentials: ${join(dir, 'link.json')} is a symlink (not followed)`);
      mkdirSync(join(dir, 'd.json'), { mode: 0o700 });
      refused(join(dir, 'd.json'), 'IPAM_INVALID_CONFIG', `ipam.pool.etcd.credentials: ${join(dir, 'd.json')} is not a regular file`);
      refused(join(dir, 'none.json'), 'IPAM_IO', `ipam.pool.etcd.credentials: open ${join(dir, 'none.json')}: no such file or directory`);
      const open = join(dir, 'open');
      mkdirSync(open);
      chmodSync(open, 0o777);
      refused(write(join(open, 'c.json'), body), 'IPAM_INVALID_CONFIG', `ipam.pool.etcd.credentials: ${open} is writable by group or others (mode 777)`);
      symlinkSync(dir, join(dir, 'dirlink'));
      refused(join(dir, 'dirlink', 'real.json'), 'IPAM_INVALID_CONFIG', `ipam.pool.etcd.credentials: ${join(dir, 'dirlink')} is not a directory (a symlink is not followed)`);
    });
  });

  it('refuses anything but {"user": "<non-empty>", "password": "<non-empty>"}, exactly', () => {
    withDir((dir) => {
      const f = join(dir, 'c.json');
      const shape = `ipam.pool.etcd.credentials: ${f} must be a JSON object {"user": "…", "password": "…"}`;
      const cases: Array<[string, string]> = [
        ['user:pass', `${shape}: not valid JSON`],
        ['["u","p"]', `${shape}: not a JSON object`],
        ['{"user":"u","password":"p","role":"root"}', `${shape}: unknown key "role"`],
        ['{"user":"u"}', `${shape}: "password" must be a non-empty string`],
        ['{"user":"","password":"p"}', `${shape}: "user" must be a non-empty string`],
        [`{"user":"u","password":"${'x'.repeat(5000)}"}`, `ipam.pool.etcd.credentials: ${f} is longer than 4096 bytes`],
      ];
      for (const [text, msg] of cases) refused(write(f, text), 'IPAM_INVALID_CONFIG', msg);
    });
  });
});

describe('the pool\'s cluster guard (PoolAllocator.checkMeta, memory KV, injected cluster check)', () => {
  const P = '/ipwarden/pools/p1';
  const META = '{"v":1,"rangeSets":[[{"subnet":"10.80.0.0/27","rangeStart":"10.80.0.1","rangeEnd":"10.80.0.30","gateway":"10.80.0.1"}]],"blockSize":28,"blockSize6":122}';
  /** A memory KV whose cluster check answers `check` (or throws it). */
  function kvWith(check: ClusterCheck | AppError): MemoryKV & { clusterCheck(): Promise<ClusterCheck> } {
    const kv = new MemoryKV() as MemoryKV & { clusterCheck(): Promise<ClusterCheck> };
    kv.clusterCheck = () => (check instanceof AppError ? Promise.reject(check) : Promise.resolve(check));
    return kv;
  }
  function alloc(kv: MemoryKV): PoolAllocator {
    const c = loadIPAMConfig(JSON.stringify({ cniVersion: '1.0.0', name: 'net1', ipam: { ranges: [[{ subnet: '10.80.0.0/27' }]] } }), undefined);
    return new PoolAllocator({ kv, pool: 'p1', prefix: '/ipwarden', node: 'node-a', network: 'net1', rangeSets: c.rangeSets, sizes: { blockSize4: 28, blockSize6: 122 }, now: () => 1000 });
  }

  it('a pool is created only after a check every endpoint answered: with one unanswered, code 11 (exact) and nothing written', async () => {
    const kv = kvWith({ clusterId: 'a1', unanswered: ['http://10.0.0.6:2379 (etcd at http://10.0.0.6:2379 is unavailable: status: UNAVAILABLE: x)'] });
    await assert.rejects(alloc(kv).add([{ containerId: 'c1', ifname: 'eth0' }]), (e: unknown) => isAppError(e, 'STORE_UNAVAILABLE') && e.cniCode === 11
      && e.message === 'pool p1 is not in etcd yet, and is created only once every endpoint in ipam.pool.etcd.endpoints has confirmed one etcd cluster; no answer from http://10.0.0.6:2379 (etcd at http://10.0.0.6:2379 is unavailable: status: UNAVAILABLE: x); retry');
    assert.deepEqual(kv.dump(), {});
  });

  it('created with a complete check: meta and its pin in one transaction (exact values)', async () => {
    const kv = kvWith({ clusterId: 'a1', unanswered: [] });
    await alloc(kv).checkMeta();
    assert.deepEqual(kv.dump(), { [REG]: REG_VALUE, [`${P}/meta`]: META, [`${P}/meta-cluster`]: '{"v":1,"clusterId":"a1"}' });
    assert.equal(kv.stats.txns, 1);
  });

  it('a pin naming another cluster is code 7 (exact), also with endpoints unanswered; nothing written', async () => {
    for (const unanswered of [[], ['http://x:1 (down)']]) {
      const kv = kvWith({ clusterId: 'b2', unanswered });
      await kv.txn([], [{ put: `${P}/meta`, value: META }, { put: `${P}/meta-cluster`, value: '{"v":1,"clusterId":"a1"}' }]);
      const before = kv.dump();
      await assert.rejects(alloc(kv).add([{ containerId: 'c1', ifname: 'eth0' }]), (e: unknown) => isAppError(e, 'IPAM_INVALID_CONFIG') && e.cniCode === 7
        && e.message === 'pool p1 was created in etcd cluster a1, but its endpoints now answer as cluster b2 (a copy of its keys in another cluster: a mirror, or a restore into a new cluster) — point ipam.pool.etcd.endpoints at the pool\'s cluster, or see docs/cluster.md "One etcd cluster"');
      assert.deepEqual(kv.dump(), before);
    }
  });

  it('a pool from before the pin is pinned by a complete check (create-only), not by an incomplete one; the check passes either way', async () => {
    const inc = kvWith({ clusterId: 'a1', unanswered: ['http://x:1 (down)'] });
    await inc.txn([], [{ put: `${P}/meta`, value: META }]);
    await alloc(inc).checkMeta();
    assert.equal(inc.dump()[`${P}/meta-cluster`], undefined);
    const full = kvWith({ clusterId: 'a1', unanswered: [] });
    await full.txn([], [{ put: `${P}/meta`, value: META }]);
    await alloc(full).checkMeta();
    assert.equal(full.dump()[`${P}/meta-cluster`], '{"v":1,"clusterId":"a1"}');
  });

  it('two clusters (the check throws): its error, nothing written; a corrupt pin is STORE_CORRUPT naming the key', async () => {
    const mix = new AppError('IPAM_INVALID_CONFIG', 'ipam.pool.etcd.endpoints name members of 2 etcd clusters: …');
    const kv = kvWith(mix);
    await assert.rejects(alloc(kv).add([{ containerId: 'c1', ifname: 'eth0' }]), (e: unknown) => e === mix);
    assert.deepEqual(kv.dump(), {});
    const bad = kvWith({ clusterId: 'a1', unanswered: [] });
    await bad.txn([], [{ put: `${P}/meta`, value: META }, { put: `${P}/meta-cluster`, value: '{"v":1,"clusterId":"A1"}' }]);
    await assert.rejects(alloc(bad).checkMeta(), (e: unknown) => isAppError(e, 'STORE_CORRUPT') && e.message === `etcd key ${P}/meta-cluster: "clusterId" must be a cluster ID (1 to 16 lower-case hex digits)`);
  });

  it('without a cluster check (the memory KV): meta alone (with the prefix\'s pool index), as before', async () => {
    const kv = new MemoryKV();
    await alloc(kv).checkMeta();
    assert.deepEqual(kv.dump(), { [REG]: REG_VALUE, [`${P}/meta`]: META });
  });
});

describe('the TLS files\' re-check (EtcdKV with a TLS source, injected clock; no server)', () => {
  it('before a call at most every tlsRecheckMs, at once after a call no endpoint answered; read again only when the stamp changed', async () => {
    // A throwaway CA-less material is enough: nothing listens on port 1, no handshake happens.
    let stamp = 's1';
    let stamps = 0;
    let reads = 0;
    const src: EtcdTlsSource = {
      stamp: () => {
        stamps++;
        return stamp;
      },
      read: () => {
        reads++;
        return { ca: Buffer.from('') };
      },
    };
    let t = 0;
    const kv = new EtcdKV({ endpoints: ['https://127.0.0.1:1'], tls: src, tlsRecheckMs: 10_000, clock: () => t, callTimeoutMs: 1000 });
    try {
      assert.deepEqual([stamps, reads], [1, 1], 'read when made');
      await assert.rejects(kv.get('/x'), (e: unknown) => isAppError(e, 'STORE_UNAVAILABLE'));
      assert.deepEqual([stamps, reads], [2, 1], 'looked at once after the failed call (not before it: within 10 s); unchanged, not read');
      stamp = 's2';
      await assert.rejects(kv.get('/x'), (e: unknown) => isAppError(e, 'STORE_UNAVAILABLE'));
      assert.deepEqual([stamps, reads], [3, 2], 'changed: read, and the call tried once more on new channels (no second look)');
      t = 10_000;
      await assert.rejects(kv.get('/x'), (e: unknown) => isAppError(e, 'STORE_UNAVAILABLE'));
      assert.deepEqual([stamps, reads], [5, 2], '10 s on: looked at before the call, and after its failure');
    } finally {
      await kv.close();
    }
  });
});

describe('an offline ADD refused for its budget names why (outOfBudget)', () => {
  const cause = new AppError('STORE_UNAVAILABLE', 'etcd at http://h:1 is unavailable: x');
  const cases: Array<[string, number, number | null, number, string]> = [
    ['no contact yet', 30, null, 5_000, 'no confirmed contact with etcd to count the offline budget of 30 s from (none since the daemon started, or the clock went back)'],
    ['a clock that went back', 30, 9_000, 5_000, 'no confirmed contact with etcd to count the offline budget of 30 s from (none since the daemon started, or the clock went back)'],
    ['settings not confirmed at S', 0, 1_000, 5_000, "the node's settings in etcd do not hold an offline budget of 30 s yet (0 s confirmed; a reserve refill sets it)"],
    ['the budget exhausted', 30, 1_000, 42_500, 'the offline budget of 30 s is exhausted (last confirmed contact with etcd 41.5 s ago)'],
  ];
  for (const [what, settings, last, now, why] of cases) {
    it(`${what}: code 11, "${why}"`, () => {
      const e = outOfBudget(cause, 'p1', 30, settings, last, now);
      assert.equal(e.code, 'STORE_UNAVAILABLE');
      assert.equal(e.cniCode, 11);
      assert.equal(e.message, `etcd at http://h:1 is unavailable: x; offline allocation of pool p1 refused: ${why}`);
    });
  }
});
