/**
 * The etcd client's TLS and authentication (docs/cluster.md "TLS", "Authentication"), on real
 * etcd: a CA and certificates made with openssl (test/helpers/tls-files.ts), an etcd with
 * `--client-cert-auth --trusted-ca-file …` (test/helpers/etcd-cluster.ts `tls`), a plain etcd
 * with user/password auth enabled (`etcdctl user add`, `auth enable`).
 *
 * - Permanent misconfigurations get code 7 with the cause and the key to check, exactly: a CA
 *   that did not sign etcd's certificate, no client certificate, a foreign one, `http://` to the
 *   TLS listener, `https://` to a plain one; a member that is down stays code 11 (also beside a
 *   misconfigured one, whose cause the message still names).
 * - Rotation: a daemon serving a pool ADDs; the CA, etcd's certificate and the client certificate
 *   are replaced on disk (same paths) and etcd restarted on them: the daemon's next ADD succeeds
 *   without a restart, and its heartbeat goes on (its lease revoked after the rotation, the
 *   heartbeat key comes back).
 * - Auth: an ADD with a credentials file; none → code 7; a wrong password → code 7; a file
 *   readable by others → code 7, exact texts; `pool status --etcd-credentials`; a token etcd forgot (`auth disable` + `enable`) is
 *   replaced by a new authentication, and the call succeeds.
 *
 * Needs `npm run build`. With CI=true a missing /usr/bin/etcd or openssl fails instead of skipping.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { chmodSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { isAppError } from '../../src/common/errors.ts';
import { credentialsFile } from '../../src/pool/credentials.ts';
import { EtcdKV } from '../../src/store/etcd/etcd-kv.ts';
import { startTestDaemon } from '../helpers/daemon.ts';
import { runViaDaemon } from '../helpers/daemon-client.ts';
import { ROOT, runCni, standalonePlugin, type Outcome } from '../helpers/cni.ts';
import { ETCDCTL_BIN, freePort, haveEtcd, startEtcdCluster, type EtcdCluster } from '../helpers/etcd-cluster.ts';
import { haveOpenssl, installTlsSet, makeTlsSet, type TlsSet } from '../helpers/tls-files.ts';

const CI = process.env['CI'] === 'true';
const skip = (haveEtcd() && haveOpenssl()) || CI ? false : '/usr/bin/etcd or /usr/bin/openssl not installed';

const SUBNET = '10.233.18.0/24';
let dir = '';
/** The files etcd and the configs use (rotated in place). */
let live: TlsSet;
/** A second CA and its certificates: "foreign". */
let other: TlsSet;
let tlsEtcd: EtcdCluster | undefined;
let plain: EtcdCluster | undefined;
let n = 0;

const ep = (c: EtcdCluster | undefined): string => (c as EtcdCluster).endpoints[0] as string;

function conf(etcd: Record<string, unknown>, prefix: string) {
  return { cniVersion: '1.0.0', name: 'tlsnet', ipam: { type: 'ipwarden', ranges: [[{ subnet: SUBNET }]], pool: { name: 'tlspool', etcd: { ...etcd, prefix } } } };
}
function add(stdin: object, id: string): Outcome {
  return runCni(standalonePlugin(), { command: 'ADD', containerId: id, ifname: 'eth0', stdin, env: { NODE_NAME: 'tls-node' } });
}
function cniError(r: Outcome): { code: number; msg: string } {
  assert.equal(r.exitCode, 1, `${r.stdout}\n${r.stderr}`);
  return { code: r.json?.['code'] as number, msg: r.json?.['msg'] as string };
}
/** etcdctl against the TLS etcd with the live files. */
function tlsctl(...args: string[]): string {
  const r = spawnSync(ETCDCTL_BIN, ['--endpoints', ep(tlsEtcd), '--cacert', live.ca, '--cert', live.clientCert, '--key', live.clientKey, ...args], { encoding: 'utf8', env: { ...process.env, ETCDCTL_API: '3' } });
  assert.equal(r.status, 0, `etcdctl ${args.join(' ')}: ${r.stdout}${r.stderr}`);
  return r.stdout;
}

/** A new `dir` (prefix `prefix`) with two CAs' files: `live` (installed at fixed paths, rotated in place) and `other`. */
function tlsFiles(prefix: string): void {
  dir = mkdtempSync(join(tmpdir(), prefix));
  const made = makeTlsSet(dir, 'a');
  other = makeTlsSet(dir, 'b');
  mkdirSync(join(dir, 'live'));
  live = { ca: join(dir, 'live/ca.pem'), serverCert: join(dir, 'live/server.pem'), serverKey: join(dir, 'live/server-key.pem'), clientCert: join(dir, 'live/client.pem'), clientKey: join(dir, 'live/client-key.pem') };
  installTlsSet(made, live);
}

describe('etcd over TLS: permanent misconfigurations and rotation', { skip }, () => {
  before(async () => {
    tlsFiles('ipwarden-etcd-tls-');
    [tlsEtcd, plain] = await Promise.all([
      startEtcdCluster({ members: 1, prefix: 'ipwarden-tls-', tls: { cert: live.serverCert, key: live.serverKey, ca: live.ca, clientCertAuth: true } }),
      startEtcdCluster({ members: 1, prefix: 'ipwarden-tls-plain-' }),
    ]);
  });
  after(async () => {
    await tlsEtcd?.close();
    await plain?.close();
    if (dir !== '') rmSync(dir, { recursive: true, force: true });
  });

  it('the right files: an ADD succeeds', () => {
    const r = add(conf({ endpoints: [ep(tlsEtcd)], tls: { ca: live.ca, cert: live.clientCert, key: live.clientKey } }, `/tls${process.pid}-${++n}`), 'ok1');
    assert.equal(r.exitCode, 0, r.stdout + r.stderr);
    assert.equal((r.json?.['ips'] as Array<{ address: string }>)[0]?.address.endsWith('/24'), true);
  });

  it('permanent misconfigurations are code 7 with the cause and the key to check (exact texts)', async () => {
    const p = `/tls${process.pid}-${++n}`;
    const e = ep(tlsEtcd);
    const cases: Array<[string, Record<string, unknown>, string]> = [
      ['a CA that did not sign etcd\'s certificate', { endpoints: [e], tls: { ca: other.ca, cert: live.clientCert, key: live.clientKey } },
        `TLS handshake with ${e} failed: certificate signed by unknown authority (unable to verify the first certificate) — check ipam.pool.etcd.tls.ca`],
      ['no client certificate (etcd has --client-cert-auth)', { endpoints: [e], tls: { ca: live.ca } },
        `TLS handshake with ${e} failed: etcd requires a client certificate (TLS alert 42: bad certificate) — set ipam.pool.etcd.tls.cert and ipam.pool.etcd.tls.key`],
      ['a client certificate of another CA', { endpoints: [e], tls: { ca: live.ca, cert: other.clientCert, key: other.clientKey } },
        `TLS handshake with ${e} failed: etcd refused the client certificate (TLS alert 42: bad certificate) — check ipam.pool.etcd.tls.cert and ipam.pool.etcd.tls.key: their CA must be in etcd's --trusted-ca-file`],
      ['http:// to the TLS listener', { endpoints: [e.replace('https://', 'http://')] },
        `etcd at ${e.replace('https://', 'http://')} speaks TLS — write https:// in ipam.pool.etcd.endpoints and set ipam.pool.etcd.tls`],
      ['https:// to a plain listener', { endpoints: [ep(plain).replace('http://', 'https://')], tls: { ca: live.ca } },
        `etcd at ${ep(plain).replace('http://', 'https://')} does not speak TLS (it answers plain HTTP/2) — write http:// in ipam.pool.etcd.endpoints`],
    ];
    for (const [what, etcd, msg] of cases) assert.deepEqual(cniError(add(conf(etcd, p), 'bad1')), { code: 7, msg }, what);
    const kv = new EtcdKV({ endpoints: [e], tls: { ca: readFileSync(live.ca), cert: readFileSync(live.clientCert), key: readFileSync(live.clientKey) } });
    try {
      assert.deepEqual(await kv.list(`${p}/`, { keysOnly: true }), [], 'nothing written');
    } finally {
      await kv.close();
    }
  });

  it('a member that is down stays code 11, also beside a misconfigured one (whose cause the message names)', async () => {
    const p = `/tls${process.pid}-${++n}`;
    const dead = `https://127.0.0.1:${await freePort()}`;
    const down = cniError(add(conf({ endpoints: [dead], tls: { ca: live.ca, cert: live.clientCert, key: live.clientKey } }, p), 'down1'));
    assert.equal(down.code, 11);
    assert.ok(down.msg.startsWith(`etcd at ${dead} is unavailable: range ${p}/pools/tlspool/meta: UNAVAILABLE: No connection established. Last error: Error: connect ECONNREFUSED `), down.msg);
    const mixed = cniError(add(conf({ endpoints: [dead, ep(tlsEtcd)], tls: { ca: other.ca } }, p), 'down2'));
    assert.equal(mixed.code, 11, mixed.msg);
    assert.ok(mixed.msg.includes(`TLS handshake with ${ep(tlsEtcd)} failed: certificate signed by unknown authority (unable to verify the first certificate) — check ipam.pool.etcd.tls.ca`), mixed.msg);
  });

  it('rotation: CA, etcd\'s certificate and the client certificate replaced on disk, etcd restarted: the daemon\'s next ADD succeeds without a restart, and its heartbeat goes on', async () => {
    const p = `/tls${process.pid}-${++n}`;
    const netd = join(dir, `net.d-${n}`);
    mkdirSync(netd);
    const c = conf({ endpoints: [ep(tlsEtcd)], tls: { ca: live.ca, cert: live.clientCert, key: live.clientKey } }, p);
    writeFileSync(join(netd, '10-tls.conflist'), JSON.stringify({ cniVersion: '1.0.0', name: 'tlsnet', plugins: [{ type: 'ipwarden', ipam: c.ipam }] }));
    const d = await startTestDaemon({ cniConfDir: netd, env: { NODE_NAME: 'tls-node' } });
    const alive = `${p}/pools/tlspool/alive/tls-node`;
    /** The heartbeat key (value, lease hex), read with etcdctl and the live files. */
    const heartbeat = (): { value: string; lease: string } | null => {
      const out = tlsctl('get', alive, '-w', 'json');
      const kv = /"kvs":\[\{[^]*?"value":"([^"]*)"[^]*?\}\]/.exec(out);
      if (kv === null) return null;
      const lease = /"lease":([0-9]+)/.exec(out);
      return { value: Buffer.from(kv[1] as string, 'base64').toString('utf8'), lease: BigInt(lease?.[1] ?? '0').toString(16) };
    };
    const waitHeartbeat = async (not: string | null): Promise<{ value: string; lease: string }> => {
      for (let i = 0; ; i++) {
        const h = heartbeat();
        if (h !== null && h.lease !== not) return h;
        assert.ok(i < 400, 'the heartbeat key within 40 s');
        await new Promise((r) => setTimeout(r, 100));
      }
    };
    try {
      const r1 = await runViaDaemon(d.socket, { command: 'ADD', containerId: 'rot1', ifname: 'eth0', stdin: c });
      assert.equal(r1.exitCode, 0, r1.stdout);
      const h1 = await waitHeartbeat(null);
      assert.deepEqual(JSON.parse(h1.value).pid, d.pid);
      // Rotate: a new CA; etcd's and the client's certificates signed by it, at the same paths.
      installTlsSet(makeTlsSet(dir, `rot${n}`), live);
      await (tlsEtcd as EtcdCluster).kill(0);
      await (tlsEtcd as EtcdCluster).restart(0);
      const r2 = await runViaDaemon(d.socket, { command: 'ADD', containerId: 'rot2', ifname: 'eth0', stdin: c });
      assert.equal(r2.exitCode, 0, `the first ADD after the rotation: ${r2.stdout}`);
      assert.notEqual((r2.json?.['ips'] as Array<{ address: string }>)[0]?.address, (r1.json?.['ips'] as Array<{ address: string }>)[0]?.address);
      // The heartbeat goes on: its lease revoked (the key goes), a later beat grants a new one and puts the key back.
      tlsctl('lease', 'revoke', h1.lease);
      const h2 = await waitHeartbeat(h1.lease);
      assert.deepEqual([JSON.parse(h2.value).node, JSON.parse(h2.value).pid], ['tls-node', d.pid]);
      const r3 = await runViaDaemon(d.socket, { command: 'ADD', containerId: 'rot3', ifname: 'eth0', stdin: c });
      assert.equal(r3.exitCode, 0, r3.stdout);
    } finally {
      await d.stop();
    }
  });
});

describe('etcd over TLS through the daemon: every request on its own settings', { skip }, () => {
  before(async () => {
    tlsFiles('ipwarden-etcd-tls-d-');
    tlsEtcd = await startEtcdCluster({ members: 1, prefix: 'ipwarden-tls-d-', tls: { cert: live.serverCert, key: live.serverKey, ca: live.ca, clientCertAuth: true } });
  });
  after(async () => {
    await tlsEtcd?.close();
    tlsEtcd = undefined;
    if (dir !== '') rmSync(dir, { recursive: true, force: true });
  });

  // A fresh-user trial: the daemon served an ADD whose config had a wrong CA (or no client
  // certificate) on the client of an earlier, good config of the same pool, recorded the wrong
  // config as the pool's, and after a restart its heartbeat failed for good while it served ADDs:
  // `pool remove-node` then released the live node's addresses.
  it('a config of the same pool with a wrong CA or no client certificate fails as through the standalone plugin (code 7, exact text), and the learned record keeps the working config', async () => {
    const p = `/tls${process.pid}-${++n}`;
    const e = ep(tlsEtcd);
    const good = conf({ endpoints: [e], tls: { ca: live.ca, cert: live.clientCert, key: live.clientKey } }, p);
    const d = await startTestDaemon({ env: { NODE_NAME: 'tls-node' } });
    try {
      const r1 = await runViaDaemon(d.socket, { command: 'ADD', containerId: 'okd1', ifname: 'eth0', stdin: good });
      assert.equal(r1.exitCode, 0, r1.stdout);
      const cases: Array<[string, Record<string, unknown>, string]> = [
        ['a CA that did not sign etcd\'s certificate', { endpoints: [e], tls: { ca: other.ca, cert: live.clientCert, key: live.clientKey } },
          `TLS handshake with ${e} failed: certificate signed by unknown authority (unable to verify the first certificate) — check ipam.pool.etcd.tls.ca`],
        ['no client certificate', { endpoints: [e], tls: { ca: live.ca } },
          `TLS handshake with ${e} failed: etcd requires a client certificate (TLS alert 42: bad certificate) — set ipam.pool.etcd.tls.cert and ipam.pool.etcd.tls.key`],
      ];
      for (const [what, etcd, msg] of cases) {
        const r = await runViaDaemon(d.socket, { command: 'ADD', containerId: 'badd1', ifname: 'eth0', stdin: conf(etcd, p) });
        assert.deepEqual({ exit: r.exitCode, code: r.json?.['code'], msg: r.json?.['msg'] }, { exit: 1, code: 7, msg }, what);
        assert.deepEqual(cniError(add(conf(etcd, p), 'badd1')), { code: 7, msg }, `${what}: the standalone plugin says the same`);
      }
      const records = join(d.dataDir, '.ipwarden-pool-networks');
      const texts = readdirSync(records).map((f) => readFileSync(join(records, f), 'utf8'));
      assert.equal(texts.length, 1, texts.join('\n'));
      assert.equal(texts[0]?.includes(JSON.stringify(live.ca)), true, texts[0]);
      assert.equal(texts[0]?.includes(JSON.stringify(other.ca)), false, texts[0]);
      assert.deepEqual(d.logs.filter((l) => l.msg === 'pool network config changed').length, 0);
    } finally {
      await d.stop();
    }
  });

  it('a heartbeat whose settings stopped working is moved to the settings of an ADD that succeeded; a working one is never moved', async () => {
    const p = `/tls${process.pid}-${++n}`;
    const e = ep(tlsEtcd);
    // Two paths to the same CA: the heartbeat starts on the first; then that file is replaced by a
    // foreign CA and etcd restarted (the client's connection must be made again, and fails).
    const caX = join(dir, `ca-x-${n}.pem`);
    writeFileSync(caX, readFileSync(live.ca));
    const onX = conf({ endpoints: [e], tls: { ca: caX, cert: live.clientCert, key: live.clientKey } }, p);
    const onLive = conf({ endpoints: [e], tls: { ca: live.ca, cert: live.clientCert, key: live.clientKey } }, p);
    const alive = `${p}/pools/tlspool/alive/tls-node`;
    const lease = (): string | null => {
      const out = tlsctl('get', alive, '-w', 'json');
      const m = /"lease":([0-9]+)/.exec(out);
      return m === null ? null : BigInt(m[1] as string).toString(16);
    };
    const d = await startTestDaemon({ env: { NODE_NAME: 'tls-node' } });
    let k = 0;
    try {
      const r1 = await runViaDaemon(d.socket, { command: 'ADD', containerId: `hb${++k}`, ifname: 'eth0', stdin: onX });
      assert.equal(r1.exitCode, 0, r1.stdout);
      // An ADD on other, working settings while the heartbeat works: nothing moves.
      const r2 = await runViaDaemon(d.socket, { command: 'ADD', containerId: `hb${++k}`, ifname: 'eth0', stdin: onLive });
      assert.equal(r2.exitCode, 0, r2.stdout);
      let first: string | null = null;
      for (let i = 0; (first = lease()) === null; i++) {
        assert.ok(i < 400, 'the heartbeat key within 40 s');
        await new Promise((r) => setTimeout(r, 100));
      }
      assert.equal(d.logs.some((l) => l.msg === 'pool heartbeat moved to the settings of a request that succeeded'), false);
      writeFileSync(caX, readFileSync(other.ca));
      await (tlsEtcd as EtcdCluster).kill(0);
      await (tlsEtcd as EtcdCluster).restart(0);
      tlsctl('lease', 'revoke', first);
      // ADDs on the working settings until the heartbeat, failing on its own, is moved: its next
      // beat is at most 10 s away, and it moves once its beats have failed for 10 s (each ADD
      // takes a new address of the /24).
      let moved = false;
      for (let i = 0; !moved; i++) {
        assert.ok(i < 240, `the heartbeat moved within 240 ADDs (it moves after 10 s of failed beats); logs: ${JSON.stringify(d.logs.slice(-5))}`);
        const r = await runViaDaemon(d.socket, { command: 'ADD', containerId: `hb${++k}`, ifname: 'eth0', stdin: onLive });
        assert.equal(r.exitCode, 0, r.stdout);
        moved = d.logs.some((l) => l.msg === 'pool heartbeat moved to the settings of a request that succeeded');
        if (!moved) await new Promise((r) => setTimeout(r, 250));
      }
      const line = d.logs.find((l) => l.msg === 'pool heartbeat moved to the settings of a request that succeeded');
      assert.deepEqual([line?.['pool'], line?.['node']], ['tlspool', 'tls-node']);
      assert.ok(Number(line?.['failures']) >= 1, JSON.stringify(line));
      let back: string | null = null;
      for (let i = 0; (back = lease()) === null || back === first; i++) {
        assert.ok(i < 400, 'the heartbeat key back within 40 s');
        await new Promise((r) => setTimeout(r, 100));
      }
      const value = JSON.parse(tlsctl('get', alive, '--print-value-only').trim());
      assert.deepEqual([value.node, value.pid], ['tls-node', d.pid]);
    } finally {
      await d.stop();
    }
  });
});

describe('etcd user/password authentication', { skip }, () => {
  let auth: EtcdCluster | undefined;
  let adir = '';
  const ctl = (...args: string[]): string => {
    const r = spawnSync(ETCDCTL_BIN, ['--endpoints', ep(auth), ...args], { encoding: 'utf8', env: { ...process.env, ETCDCTL_API: '3' } });
    assert.equal(r.status, 0, `etcdctl ${args.join(' ')}: ${r.stdout}${r.stderr}`);
    return r.stdout;
  };
  const creds = (name: string, body: object, mode = 0o600): string => {
    const f = join(adir, name);
    writeFileSync(f, JSON.stringify(body), { mode });
    chmodSync(f, mode);
    return f;
  };
  before(async () => {
    adir = mkdtempSync(join(tmpdir(), 'ipwarden-etcd-auth-'));
    auth = await startEtcdCluster({ members: 1, prefix: 'ipwarden-auth-' });
    ctl('user', 'add', 'root', '--new-user-password=rootpw', '--interactive=false');
    ctl('role', 'add', 'ipwarden');
    ctl('role', 'grant-permission', 'ipwarden', 'readwrite', '/', '--prefix=true');
    ctl('user', 'add', 'ipwarden', '--new-user-password=s3cret', '--interactive=false');
    ctl('user', 'grant-role', 'ipwarden', 'ipwarden');
    ctl('auth', 'enable');
  });
  after(async () => {
    await auth?.close();
    if (adir !== '') rmSync(adir, { recursive: true, force: true });
  });

  it('an ADD with a credentials file succeeds; without one, with a wrong password, or with a file others can read: code 7 (exact texts)', () => {
    const p = `/auth${process.pid}-${++n}`;
    const e = ep(auth);
    const good = creds('good.json', { user: 'ipwarden', password: 's3cret' });
    const r = add(conf({ endpoints: [e], credentials: good }, p), 'a1');
    assert.equal(r.exitCode, 0, r.stdout + r.stderr);
    assert.deepEqual(cniError(add(conf({ endpoints: [e] }, p), 'a2')), {
      code: 7,
      msg: `etcd at ${e} requires authentication (etcdserver: user name is empty) — set ipam.pool.etcd.credentials, or a client certificate etcd maps to a user`,
    });
    const wrong = creds('wrong.json', { user: 'ipwarden', password: 'nope' });
    assert.deepEqual(cniError(add(conf({ endpoints: [e], credentials: wrong }, p), 'a3')), {
      code: 7,
      msg: `etcd at ${e} refused the user and password of ipam.pool.etcd.credentials (${wrong}): etcdserver: authentication failed, invalid user ID or password`,
    });
    const open = creds('open.json', { user: 'ipwarden', password: 's3cret' }, 0o644);
    assert.deepEqual(cniError(add(conf({ endpoints: [e], credentials: open }, p), 'a4')), {
      code: 7,
      msg: `ipam.pool.etcd.credentials: ${open} is readable by others (mode 644): a password file must not be`,
    });
    assert.deepEqual(cniError(add(conf({ endpoints: [e], credentials: join(adir, 'missing.json') }, p), 'a5')), {
      code: 5,
      msg: `ipam.pool.etcd.credentials: open ${join(adir, 'missing.json')}: no such file or directory`,
    });
    // The CLI: --etcd-credentials.
    const cli = (...extra: string[]) => spawnSync(process.execPath, [join(ROOT, 'bin/ipwarden'), 'pool', 'status', '--pool', 'tlspool', '--etcd-endpoints', e, '--etcd-prefix', p, '--json', ...extra], { encoding: 'utf8', timeout: 60_000 });
    const st = cli('--etcd-credentials', good);
    assert.equal(st.status, 0, st.stderr);
    assert.equal(JSON.parse(st.stdout).pool, 'tlspool');
    const no = cli();
    assert.equal(no.status, 1);
    assert.deepEqual(JSON.parse(no.stdout), { version: 1, error: { code: 'IPAM_INVALID_CONFIG', msg: `etcd at ${e} requires authentication (etcdserver: user name is empty) — set ipam.pool.etcd.credentials, or a client certificate etcd maps to a user` } });
  });

  it('a token etcd no longer knows (auth disabled and enabled again) is replaced by a new authentication; the call succeeds', async () => {
    const p = `/auth${process.pid}-${++n}`;
    const kv = new EtcdKV({ endpoints: auth?.endpoints ?? [], credentials: credentialsFile(creds('kv.json', { user: 'ipwarden', password: 's3cret' })) });
    try {
      assert.equal((await kv.txn([], [{ put: `${p}/k`, value: '1' }])).succeeded, true);
      assert.equal(kv.authentications, 1);
      ctl('--user', 'root:rootpw', 'auth', 'disable');
      ctl('auth', 'enable');
      assert.equal((await kv.get(`${p}/k`))?.value, '1');
      assert.equal(kv.authentications, 2, 'authenticated again once');
      assert.equal((await kv.txn([], [{ put: `${p}/k`, value: '2' }])).succeeded, true);
      assert.equal(kv.authentications, 2);
    } finally {
      await kv.close();
    }
    const bad = new EtcdKV({ endpoints: auth?.endpoints ?? [], credentials: credentialsFile(creds('bad.json', { user: 'ipwarden', password: 'nope' })) });
    try {
      await assert.rejects(bad.get(`${p}/k`), (e: unknown) => isAppError(e, 'IPAM_INVALID_CONFIG') && e.cniCode === 7);
    } finally {
      await bad.close();
    }
  });
});
