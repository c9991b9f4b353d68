/**
 * `ipwarden daemon` black-box (issue 9, docs/daemon.md): the built daemon as a child process
 * (test/helpers/daemon.ts), spoken to over protocol v1 — what older shims send, still served — and
 * v2 step by step (test/helpers/daemon-client.ts), on real
 * files, against the standalone plugin (`node dist/ipwarden.cjs` with the CNI env) and upstream
 * host-local. Needs root (the socket directory must be owned by root) and `npm run build`.
 *
 * What is waited for is always a condition (a log line, an fd of the daemon on `DIR/lock`, a
 * process exit), never a time.
 */
import assert from 'node:assert/strict';
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { chmodSync, existsSync, lstatSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync, utimesSync, writeFileSync } from 'node:fs';
import { createConnection, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { HOST_LOCAL, haveHostLocal, requireOrSkip, ROOT, runCni, snapshotDir, type Invocation, type Outcome } from '../helpers/cni.ts';
import { startTestDaemon, type TestDaemon, hasOpen } from '../helpers/daemon.ts';
import { cniEnv, exchangeV2, runViaDaemon, sendRaw } from '../helpers/daemon-client.ts';
import { startHostileCri, type HostileCri } from '../helpers/hostile-cri.ts';
import { encodeRequest, HEADER_BYTES, MAX_STDIN_BYTES } from '../../src/daemon/protocol.ts';
import { socketLockPath } from '../../src/daemon/plugin-server.ts';
import { runDaemon, startDaemon } from '../../src/daemon/daemon.ts';
import { createLogger } from '../../src/daemon/log.ts';
import type { RequestEvent } from '../../src/daemon/plugin-server.ts';
import type { DaemonOptions } from '../../src/common/daemon-options.ts';

const BUNDLE = join(ROOT, 'dist/ipwarden.cjs');
const isRoot = process.getuid?.() === 0;
const skip = requireOrSkip(isRoot && haveHostLocal() && existsSync(BUNDLE), `root, ${HOST_LOCAL} and a build (npm run build)`);

/** Every temp dir and child of this file, removed/killed at the end (also on failure). */
const temps: string[] = [];
const children: ChildProcess[] = [];
/** Pids of re-parented processes this file started (not our children any more). */
const orphans: number[] = [];
function temp(prefix = 'ipwd-daemon-t-'): string {
  const d = mkdtempSync(join(tmpdir(), prefix));
  temps.push(d);
  return d;
}
function cleanupAll(): void {
  for (const c of children) {
    if (c.exitCode !== null || c.signalCode !== null || c.pid === undefined) continue;
    try {
      process.kill(c.pid, 'SIGKILL');
    } catch {
      // gone (reaped, its 'exit' not yet seen)
    }
  }
  for (const pid of orphans.splice(0)) {
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      // gone
    }
  }
  for (const d of temps) {
    try {
      rmSync(d, { recursive: true, force: true, maxRetries: 3 });
    } catch {
      // keep going: the other directories
    }
  }
}
process.on('exit', cleanupAll);

/** A long-lived `sleep` child of this process: a stand-in for the shim (its parent is us, as the standalone's is). */
async function fakeShim(): Promise<number> {
  const c = spawn('sleep', ['100000'], { stdio: 'ignore' });
  children.push(c);
  await new Promise<void>((resolve, reject) => {
    c.once('spawn', () => resolve());
    c.once('error', reject);
  });
  return c.pid as number;
}

/** The standalone plugin, run the way a runtime runs it (clean CNI env, config on stdin). */
function standalone(inv: Invocation): Outcome {
  const input = typeof inv.stdin === 'string' ? inv.stdin : JSON.stringify(inv.stdin);
  const r = spawnSync(process.execPath, [BUNDLE], { input, env: cniEnv(inv), encoding: 'utf8', timeout: 60_000 });
  if (r.error) throw r.error;
  return { exitCode: r.status ?? -1, stdout: r.stdout, stderr: r.stderr, json: null };
}

const NET = 'dnet';
const conf = (dd: string, v = '1.1.0', ipam: Record<string, unknown> = {}, extra: Record<string, unknown> = {}) => ({
  cniVersion: v,
  name: NET,
  ...extra,
  ipam: { type: 'ipwarden', dataDir: dd, ranges: [[{ subnet: '10.93.0.0/28' }]], ...ipam },
});

/** Poll (yielding to the event loop) until `cond()` holds; the test's own timeout bounds it. */
async function until(cond: () => boolean): Promise<void> {
  while (!cond()) await new Promise((r) => setImmediate(r));
}


/** Hold `DIR/lock` from another process (test/fixtures/hold-lock.cjs) until `release()`. */
async function holdLock(lockPath: string): Promise<{ release(): Promise<void> }> {
  const c = spawn(process.execPath, [join(ROOT, 'test/fixtures/hold-lock.cjs'), lockPath], { cwd: ROOT, stdio: ['pipe', 'pipe', 'inherit'] });
  children.push(c);
  await new Promise<void>((resolve, reject) => {
    let out = '';
    c.stdout?.on('data', (d: Buffer) => {
      out += d.toString();
      if (out.includes('locked\n')) resolve();
    });
    c.once('error', reject);
    c.once('exit', (code) => reject(new Error(`hold-lock exited ${code}`)));
  });
  return {
    release: async () => {
      c.removeAllListeners('exit');
      const gone = new Promise<void>((r) => c.once('close', () => r()));
      c.stdin?.end();
      await gone;
    },
  };
}

describe('ipwarden daemon', { skip }, () => {
  let d: TestDaemon;
  let shimPid: number;
  before(async () => {
    d = await startTestDaemon();
    shimPid = await fakeShim();
  });
  after(async () => {
    await d?.stop();
    cleanupAll();
  });

  describe('answers exactly as the standalone plugin, and leaves the same files', () => {
    /** Run `steps` on two fresh data dirs, one per path; compare every answer and the final directory. */
    async function parity(steps: Array<(dd: string) => Invocation>): Promise<Array<{ daemon: Outcome; standalone: Outcome }>> {
      const a = temp();
      const b = temp();
      const out: Array<{ daemon: Outcome; standalone: Outcome }> = [];
      for (const [i, step] of steps.entries()) {
        const viaDaemon = await runViaDaemon(d.socket, step(a), shimPid);
        const alone = standalone(step(b));
        const norm = (o: Outcome, dd: string) => ({ exitCode: o.exitCode, stdout: o.stdout.split(dd).join('<DD>'), stderr: o.stderr.split(dd).join('<DD>') });
        assert.deepEqual(norm(viaDaemon, a), norm(alone, b), `step ${i} (${step(a).command})`);
        out.push({ daemon: viaDaemon, standalone: alone });
      }
      assert.deepEqual(snapshotDir(join(a, NET)), snapshotDir(join(b, NET)));
      return out;
    }
    const ADD = (id: string) => (dd: string): Invocation => ({ command: 'ADD', containerId: id, ifname: 'eth0', stdin: conf(dd) });
    const DEL = (id: string) => (dd: string): Invocation => ({ command: 'DEL', containerId: id, ifname: 'eth0', stdin: conf(dd) });

    it('ADD, repeated ADD, second container, CHECK, DEL, repeated DEL, GC, STATUS, VERSION', async () => {
      const r = await parity([
        ADD('c1'),
        ADD('c1'),
        ADD('c2'),
        (dd) => ({ command: 'CHECK', containerId: 'c1', ifname: 'eth0', stdin: conf(dd, '1.1.0', {}, { prevResult: { cniVersion: '1.1.0', ips: [{ address: '10.93.0.2/28' }] } }) }),
        DEL('c1'),
        DEL('c1'),
        (dd) => ({ command: 'CHECK', containerId: 'c1', ifname: 'eth0', stdin: conf(dd) }),
        (dd) => ({ command: 'GC', stdin: conf(dd, '1.1.0', {}, { 'cni.dev/valid-attachments': [{ containerID: 'c2', ifname: 'eth0' }] }) }),
        (dd) => ({ command: 'STATUS', stdin: conf(dd) }),
        () => ({ command: 'VERSION', stdin: '{"cniVersion":"0.4.0"}' }),
      ]);
      // Not vacuous: the answers are the ones the plugin gives.
      assert.equal(JSON.parse(r[0]?.daemon.stdout ?? '').ips[0].address, '10.93.0.2/28');
      assert.equal(JSON.parse(r[1]?.daemon.stdout ?? '').ips[0].address, '10.93.0.2/28');
      assert.equal(JSON.parse(r[2]?.daemon.stdout ?? '').ips[0].address, '10.93.0.3/28');
      assert.deepEqual(r.map((x) => x.daemon.exitCode), [0, 0, 0, 0, 0, 0, 1, 0, 0, 0]);
      assert.equal(JSON.parse(r[6]?.daemon.stdout ?? '').code, 999);
      assert.equal(JSON.parse(r[9]?.daemon.stdout ?? '').cniVersion, '0.4.0');
      // Exact bytes, as libcni's skel writes them: VERSION compact with a trailing newline (Go's
      // json.Encoder); results and errors indented by 4 spaces without one (json.MarshalIndent).
      assert.equal(r[9]?.daemon.stdout, '{"cniVersion":"0.4.0","supportedVersions":["0.1.0","0.2.0","0.3.0","0.3.1","0.4.0","1.0.0","1.1.0"]}\n');
      for (const i of [0, 6]) assert.equal(r[i]?.daemon.stdout, JSON.stringify(JSON.parse(r[i]?.daemon.stdout ?? ''), null, 4), `answer ${i}`);
    });

    it('errors: missing env, undecodable config, invalid config, unknown command, GC under 1.1.0', async () => {
      const r = await parity([
        (dd) => ({ command: 'ADD', ifname: 'eth0', stdin: conf(dd) }),
        () => ({ command: 'ADD', containerId: 'c1', ifname: 'eth0', stdin: '{not json' }),
        (dd) => ({ command: 'ADD', containerId: 'c1', ifname: 'eth0', stdin: conf(dd, '1.0.0', { ranges: [[{ subnet: '10.93.0.0/33' }]] }) }),
        (dd) => ({ command: 'FROB', containerId: 'c1', ifname: 'eth0', stdin: conf(dd) }),
        (dd) => ({ command: 'GC', stdin: conf(dd, '1.0.0', {}, { 'cni.dev/valid-attachments': [] }) }),
        (dd) => ({ command: 'ADD', containerId: 'bad/id', ifname: 'eth0', stdin: conf(dd) }),
      ]);
      assert.deepEqual(r.map((x) => [x.daemon.exitCode, JSON.parse(x.daemon.stdout).code]), [[1, 4], [1, 6], [1, 7], [1, 4], [1, 1], [1, 4]]);
      assert.equal(JSON.parse(r[0]?.daemon.stdout ?? '').msg, 'required env variables [CNI_CONTAINERID] missing');
    });

    it('the same files and address as upstream host-local for ADD, ADD, DEL', async () => {
      const a = temp();
      const h = temp();
      const hl = (dd: string) => ({ ...conf(dd, '1.0.0'), ipam: { ...conf(dd, '1.0.0').ipam, type: 'host-local' } });
      for (const [cmd, id] of [['ADD', 'c1'], ['ADD', 'c2'], ['DEL', 'c1']] as const) {
        const viaDaemon = await runViaDaemon(d.socket, { command: cmd, containerId: id, ifname: 'eth0', stdin: conf(a, '1.0.0') }, shimPid);
        const up = runCni(HOST_LOCAL, { command: cmd, containerId: id, ifname: 'eth0', stdin: hl(h) });
        assert.equal(viaDaemon.exitCode, 0, viaDaemon.stdout);
        assert.equal(up.exitCode, 0, up.stdout);
        if (cmd === 'ADD') assert.deepEqual((viaDaemon.json?.['ips'] as unknown[])[0], (up.json?.['ips'] as unknown[])[0]);
      }
      assert.deepEqual(snapshotDir(join(a, NET)), snapshotDir(join(h, NET)));
      assert.deepEqual(snapshotDir(join(a, NET)), { '10.93.0.3': 'c2\r\neth0', 'last_reserved_ip.0': '10.93.0.3', lock: '' });
    });
  });

  it('a request whose client went away while another process held DIR/lock is dropped: no reservation, lock released, no answer', async () => {
    const dd = temp();
    const dir = join(dd, NET);
    mkdirSync(dir, { recursive: true });
    const lock = await holdLock(join(dir, 'lock'));
    let sock: Socket | null = null;
    const sent = sendRaw(d.socket, encodeRequest({ pid: shimPid, env: cniEnv({ command: 'ADD', containerId: 'gone1', ifname: 'eth0', stdin: '' }), stdin: JSON.stringify(conf(dd)) }), {
      onSent: (s) => (sock = s),
    });
    await until(() => hasOpen(d.pid, join(dir, 'lock')) && sock !== null);
    const before = d.logs.length;
    (sock as unknown as Socket).destroy();
    await d.waitForLog((l) => l.msg === 'client closed its connection while its request was in flight' && l['containerId'] === 'gone1');
    await lock.release();
    const dropped = await d.waitForLog((l) => l.msg === 'request dropped: the client went away' && l['containerId'] === 'gone1');
    assert.equal(dropped['stage'], 'after-lock');
    assert.equal(dropped['network'], NET);
    assert.equal((await sent).kind, 'closed');
    assert.deepEqual(snapshotDir(dir), { lock: '' });
    assert.equal(d.logs.slice(before).some((l) => l.msg === 'request served' && l['containerId'] === 'gone1'), false);
    // The daemon released the lock: the next ADD gets it at once and the first address.
    const r = await runViaDaemon(d.socket, { command: 'ADD', containerId: 'next', ifname: 'eth0', stdin: conf(dd) }, shimPid);
    assert.equal(r.exitCode, 0, r.stdout);
    assert.deepEqual(snapshotDir(dir), { '10.93.0.2': 'next\r\neth0', 'last_reserved_ip.0': '10.93.0.2', lock: '' });
  });

  describe('malformed requests get no answer, and the daemon keeps serving', () => {
    const good = () => encodeRequest({ pid: 1, env: { CNI_COMMAND: 'VERSION' }, stdin: '{}' });
    const cases: Array<{ name: string; bytes: Buffer; reason: string | RegExp; kind?: string }> = [
      { name: 'an HTTP request', bytes: Buffer.from('GET / HTTP/1.1\r\nHost: x\r\n\r\n'), reason: 'bad magic "GET " (want "IPWD")' },
      { name: 'protocol version 3', bytes: Buffer.concat([Buffer.from('IPWD'), Buffer.from([3, 0, 0, 0]), good().subarray(8)]), reason: 'protocol version 3 (this daemon speaks 1 and 2)', kind: 'unsupported-version' },
      { name: 'stdin above the limit (header only)', bytes: (() => { const h = good().subarray(0, HEADER_BYTES); h.writeUInt32LE(MAX_STDIN_BYTES + 1, 16); h.writeUInt32LE(0, 12); return h; })(), reason: 'stdin of 16777217 bytes exceeds the limit of 16777216' },
      // A v2 header the daemon refuses is not acknowledged (0 bytes came back): the shim falls back at once.
      { name: 'version 2: stdin above the limit (header only, no acknowledgement)', bytes: (() => { const h = encodeRequest({ version: 2, pid: 1, env: {}, stdin: '' }); h.writeUInt32LE(MAX_STDIN_BYTES + 2, 16); return h; })(), reason: 'stdin of 16777218 bytes exceeds the limit of 16777216' },
      { name: 'pid 0', bytes: encodeRequest({ pid: 0, env: { CNI_COMMAND: 'VERSION' }, stdin: '{}' }), reason: 'pid is 0' },
      { name: 'version 2: pid 0 (no acknowledgement)', bytes: encodeRequest({ version: 2, pid: 0, env: {}, stdin: '' }).subarray(0, HEADER_BYTES), reason: 'pid is 0' },
      { name: 'an env entry without "="', bytes: encodeRequest({ pid: 1, env: Buffer.from('CNI_COMMAND\0'), stdin: '{}' }), reason: 'env entry 0 has no "="' },
      { name: 'bytes after the request', bytes: Buffer.concat([good(), Buffer.from('x')]), reason: '1 bytes after the end of the request' },
    ];
    cases.forEach((c) =>
      it(c.name, async () => {
        const r = await sendRaw(d.socket, c.bytes);
        assert.deepEqual([r.kind, r.kind === 'closed' ? r.received : -1], ['closed', 0]);
        const l = await d.waitForLog((x) => x.msg === 'malformed request: closed without an answer' && x['reason'] === c.reason);
        assert.equal(l['kind'], c.kind ?? 'malformed');
        const v = await runViaDaemon(d.socket, { command: 'VERSION', stdin: '{}' }, shimPid);
        assert.equal(v.exitCode, 0);
      }),
    );
    it('a truncated request (the client ends its side early)', async () => {
      const bytes = good().subarray(0, HEADER_BYTES + 2);
      await new Promise<void>((resolve, reject) => {
        const s = createConnection(d.socket, () => s.end(bytes));
        s.on('error', reject);
        s.on('close', () => resolve());
        s.resume();
      });
      await d.waitForLog((x) => x.msg === 'malformed request: closed without an answer' && x['reason'] === `truncated request: ${HEADER_BYTES + 2} of ${good().length} bytes`);
    });
  });

  describe('protocol version 2: the header acknowledged at once, the body after it', () => {
    const ACK = Buffer.from([0x49, 0x50, 0x57, 0x41, 2, 0, 0, 0]); // "IPWA" 2
    const ABANDONED = 'request abandoned: the client went away before sending its body (nothing was run)';

    it('"IPWA" 2 answers the header; the answer is of version 2 and the same as version 1 gives; ADD writes the same files', async () => {
      const v2 = await exchangeV2(d.socket, encodeRequest({ version: 2, pid: shimPid, env: cniEnv({ command: 'VERSION', stdin: '' }), stdin: '{"cniVersion":"1.0.0"}' }));
      const v1 = await runViaDaemon(d.socket, { command: 'VERSION', stdin: '{"cniVersion":"1.0.0"}' }, shimPid);
      assert.deepEqual(v2.ack, ACK);
      assert.ok(v2.result?.kind === 'answer', JSON.stringify(v2.result));
      assert.deepEqual([v2.result.answer.exitStatus, Buffer.from(v2.result.answer.stdout).toString(), Buffer.from(v2.result.answer.stderr).toString()], [v1.exitCode, v1.stdout, v1.stderr]);
      const dd = temp();
      const add = await exchangeV2(d.socket, encodeRequest({ version: 2, pid: shimPid, env: cniEnv({ command: 'ADD', containerId: 'v2c', ifname: 'eth0', stdin: '' }), stdin: JSON.stringify(conf(dd)) }));
      assert.ok(add.result?.kind === 'answer', JSON.stringify(add.result));
      assert.equal(add.result.answer.exitStatus, 0, Buffer.from(add.result.answer.stdout).toString());
      assert.deepEqual(JSON.parse(Buffer.from(add.result.answer.stdout).toString()), { cniVersion: '1.1.0', ips: [{ address: '10.93.0.2/28', gateway: '10.93.0.1' }] });
      assert.deepEqual(snapshotDir(join(dd, NET)), { '10.93.0.2': 'v2c\r\neth0', 'last_reserved_ip.0': '10.93.0.2', lock: '' });
    });

    it('a client that closes after the acknowledged header (a shim whose short deadline passed): nothing is run, the connection is logged abandoned', async () => {
      const dd = temp();
      const before = d.logs.filter((l) => l.msg === ABANDONED).length;
      const x = await exchangeV2(d.socket, encodeRequest({ version: 2, pid: shimPid, env: cniEnv({ command: 'ADD', containerId: 'gave-up', ifname: 'eth0', stdin: '' }), stdin: JSON.stringify(conf(dd)) }), { abandon: true });
      assert.deepEqual([x.ack, x.result], [ACK, null]);
      await until(() => d.logs.filter((l) => l.msg === ABANDONED).length > before);
      const l = d.logs.filter((y) => y.msg === ABANDONED)[before] as Record<string, unknown>;
      assert.deepEqual([l['level'], l['receivedBytes']], [30, HEADER_BYTES]);
      // The daemon keeps serving; it never saw the body, so it created nothing for it.
      assert.equal((await runViaDaemon(d.socket, { command: 'VERSION', stdin: '{}' }, shimPid)).exitCode, 0);
      assert.equal(existsSync(join(dd, NET)), false);
      assert.equal(d.logs.some((y) => y['containerId'] === 'gave-up'), false);
    });
  });

  it('the socket is 0600 in a 0700 directory the daemon created, owned by root', () => {
    const s = lstatSync(d.socket);
    assert.ok(s.isSocket());
    assert.equal(s.mode & 0o7777, 0o600);
    const dirSt = lstatSync(join(d.socket, '..'));
    assert.equal(dirSt.mode & 0o7777, 0o700);
    assert.deepEqual([s.uid, dirSt.uid], [0, 0]);
  });

  describe('runtime identification uses the request, not the daemon', () => {
    const S = '10.93.1.0/29'; // gateway .1, .2–.6 allocatable
    const n = (k: number) => `10.93.1.${k}`;
    const ks = [2, 3, 4, 5, 6];
    /** Fill the range with host-local (the "dead pods'" reservations), aged an hour. */
    function leakyNetwork(): string {
      const dd = temp();
      for (const k of ks) {
        const r = runCni(HOST_LOCAL, { command: 'ADD', containerId: `dead${k}`, ifname: 'eth0', stdin: { ...conf(dd, '1.0.0', { ranges: [[{ subnet: S }]] }), ipam: { type: 'host-local', dataDir: dd, ranges: [[{ subnet: S }]] } } });
        assert.equal(r.exitCode, 0, r.stdout);
        const t = Date.now() / 1000 - 3600;
        utimesSync(join(dd, NET, n(k)), t, t);
      }
      return dd;
    }
    const addConf = (dd: string) => conf(dd, '1.0.0', { ranges: [[{ subnet: S }]], leakGracePeriod: '1m' });
    /** A process whose parent is gone (re-parented away from this process): no CRI in its ancestry. */
    async function orphanPid(): Promise<number> {
      const r = spawnSync('sh', ['-c', 'sleep 100000 >/dev/null 2>&1 & echo $!'], { encoding: 'utf8' });
      const pid = Number(r.stdout.trim());
      orphans.push(pid);
      await until(() => {
        try {
          const st = readFileSync(`/proc/${pid}/stat`, 'utf8');
          return Number(st.slice(st.lastIndexOf(')') + 2).split(' ')[1]) !== process.pid;
        } catch {
          return false;
        }
      });
      return pid;
    }
    let cri: HostileCri | null = null;
    after(async () => {
      await cri?.close();
    });

    it("CONTAINER_RUNTIME_ENDPOINT in the request's env is the runtime asked (reclaim on exhaustion)", async () => {
      const sockDir = temp('ipwd-daemon-cri-');
      cri = await startHostileCri({ path: join(sockDir, 'fake.sock') });
      const dd = leakyNetwork();
      const pid = await orphanPid();
      const r = await runViaDaemon(d.socket, { command: 'ADD', containerId: 'newpod', ifname: 'eth0', stdin: addConf(dd), env: { CONTAINER_RUNTIME_ENDPOINT: cri.endpoint } }, pid);
      assert.equal(r.exitCode, 0, r.stdout);
      assert.equal((r.json?.['ips'] as Array<{ address: string }>)[0]?.address, '10.93.1.2/29');
      assert.ok(cri.stats.list >= 1, 'the fake CRI was asked');
      assert.equal(readFileSync(join(dd, NET, n(2)), 'utf8'), 'newpod\r\neth0');
      await cri.close();
      cri = null;
    });

    it("without an endpoint, the shim's ancestry names the runtime: a CRI serving this process (the daemon's parent) is not asked for an orphan shim", async () => {
      const sockDir = temp('ipwd-daemon-cri-');
      cri = await startHostileCri({ path: join(sockDir, 'containerd.sock') });
      const dd = leakyNetwork();
      const before = snapshotDir(join(dd, NET));
      const pid = await orphanPid();
      const r = await runViaDaemon(d.socket, { command: 'ADD', containerId: 'newpod', ifname: 'eth0', stdin: addConf(dd) }, pid);
      assert.equal(r.exitCode, 1, r.stdout);
      assert.match(String(r.json?.['details']), /the runtime that ran this plugin could not be identified/);
      assert.deepEqual([cri.stats.version, cri.stats.list], [0, 0]);
      assert.deepEqual(snapshotDir(join(dd, NET)), before);
      // The same request from a shim whose parent is this process: this process's CRI is found and asked.
      const r2 = await runViaDaemon(d.socket, { command: 'ADD', containerId: 'newpod', ifname: 'eth0', stdin: addConf(dd) }, shimPid);
      assert.equal(r2.exitCode, 0, r2.stdout);
      assert.ok(cri.stats.list >= 1);
      assert.equal(readFileSync(join(dd, NET, n(2)), 'utf8'), 'newpod\r\neth0');
      await cri.close();
      cri = null;
    });
  });
});

describe('ipwarden daemon start-up refusals and stale sockets', { skip }, () => {
  after(cleanupAll);

  async function refused(socket: string, why: string | RegExp): Promise<void> {
    const d = await startTestDaemon({ socket, noWait: true });
    const r = await d.exited;
    assert.equal(r.code, 1, d.stderr());
    const line = d.logs.find((l) => l.msg === 'daemon did not start');
    assert.ok(line !== undefined, d.stderr());
    if (typeof why === 'string') assert.equal(line['error'], why);
    else assert.match(String(line['error']), why);
    assert.equal(d.stderr().split('\n').filter((l) => !l.startsWith('{')).join('\n'), `ipwarden: ${line['error'] as string}\n`);
    await d.stop();
  }

  it('a symlinked socket directory is refused (never followed)', async () => {
    const t = temp();
    mkdirSync(join(t, 'real'), { mode: 0o700 });
    symlinkSync(join(t, 'real'), join(t, 'link'));
    await refused(join(t, 'link', 'plugin.sock'), `the socket directory ${join(t, 'link')} is a symbolic link; refusing to follow it`);
    assert.deepEqual(readdirSync(join(t, 'real')), []);
  });

  it('a group-writable socket directory is refused', async () => {
    const t = temp();
    mkdirSync(join(t, 'run'));
    chmodSync(join(t, 'run'), 0o770);
    await refused(join(t, 'run', 'plugin.sock'), `the socket directory ${join(t, 'run')} is writable by group or others (mode 0770)`);
  });

  it('a regular file at the socket path is refused and left alone', async () => {
    const t = temp();
    mkdirSync(join(t, 'run'), { mode: 0o700 });
    writeFileSync(join(t, 'run', 'plugin.sock'), 'keep');
    await refused(join(t, 'run', 'plugin.sock'), `${join(t, 'run', 'plugin.sock')} exists and is not a socket; remove it or choose another --socket`);
    assert.equal(readFileSync(join(t, 'run', 'plugin.sock'), 'utf8'), 'keep');
  });

  it('a live socket (another daemon, holding <socket>.lock) is refused; a stale one is replaced', async () => {
    const t = temp();
    const first = await startTestDaemon({ socket: join(t, 'run', 'plugin.sock') });
    await refused(first.socket, `another daemon holds ${first.socket}.lock (it serves ${first.socket} or is starting to)`);
    assert.equal((await runViaDaemon(first.socket, { command: 'VERSION', stdin: '{}' })).exitCode, 0);
    await first.stop();
    // A socket file whose server died without removing it (a SIGKILLed daemon).
    const r = spawnSync(process.execPath, ['-e', `require('node:net').createServer().listen(${JSON.stringify(first.socket)}, () => process.kill(process.pid, 'SIGKILL'))`]);
    assert.equal(r.signal, 'SIGKILL');
    assert.ok(lstatSync(first.socket).isSocket());
    const second = await startTestDaemon({ socket: first.socket });
    assert.equal((await runViaDaemon(second.socket, { command: 'VERSION', stdin: '{}' })).exitCode, 0);
    assert.equal((await second.stop()).code, 0);
    // The lock file stays (a removed one would let a later daemon lock a new inode while an old one holds the first).
    const lk = lstatSync(socketLockPath(first.socket));
    assert.deepEqual([lk.isFile(), lk.mode & 0o7777, lk.uid, lk.size], [true, 0o600, 0, 0]);
  });

  it('a live socket of a process that holds no lock (an older daemon) is refused, and left alone', async () => {
    const t = temp();
    mkdirSync(join(t, 'run'), { mode: 0o700 });
    const socket = join(t, 'run', 'plugin.sock');
    const other = spawn(process.execPath, ['-e', `require('node:net').createServer().listen(${JSON.stringify(socket)}, () => console.log('listening'))`], { stdio: ['ignore', 'pipe', 'inherit'] });
    children.push(other);
    await new Promise<void>((resolve) => other.stdout?.once('data', () => resolve()));
    await refused(socket, `another process is serving ${socket} (a daemon already running?)`);
    assert.ok(lstatSync(socket).isSocket());
    assert.equal(await new Promise<boolean>((resolve) => {
      const c = createConnection(socket);
      c.once('connect', () => (c.destroy(), resolve(true)));
      c.once('error', () => resolve(false));
    }), true, 'the other process still serves its socket');
    other.kill('SIGKILL');
  });

  it('a symlink at <socket>.lock is refused, never followed', async () => {
    const t = temp();
    mkdirSync(join(t, 'run'), { mode: 0o700 });
    const socket = join(t, 'run', 'plugin.sock');
    writeFileSync(join(t, 'victim'), 'keep');
    symlinkSync(join(t, 'victim'), socketLockPath(socket));
    await refused(socket, `the lock file ${socket}.lock is a symbolic link; refusing to follow it`);
    assert.equal(readFileSync(join(t, 'victim'), 'utf8'), 'keep');
    assert.equal(existsSync(socket), false);
  });

  it('after a crash left a stale socket, of two daemons started together exactly one serves and the other refuses (8 of 8 tries)', async () => {
    const outcomes: string[] = [];
    for (let i = 0; i < 8; i++) {
      const t = temp();
      mkdirSync(join(t, 'run'), { mode: 0o700 });
      const socket = join(t, 'run', 'plugin.sock');
      const k = spawnSync(process.execPath, ['-e', `require('node:net').createServer().listen(${JSON.stringify(socket)}, () => process.kill(process.pid, 'SIGKILL'))`]);
      assert.equal(k.signal, 'SIGKILL');
      assert.ok(lstatSync(socket).isSocket(), 'a stale socket file');
      const pair = [await startTestDaemon({ socket, noWait: true }), await startTestDaemon({ socket, noWait: true })];
      try {
        const fates = await Promise.all(pair.map((x) => x.waitForLog((l) => l.msg === 'daemon started').then(() => 'serves', () => 'exited')));
        outcomes.push(fates.join('+'));
        assert.deepEqual([...fates].sort(), ['exited', 'serves'], `try ${i}: ${fates.join(', ')}`);
        const loser = pair[fates.indexOf('exited')] as TestDaemon;
        const winner = pair[fates.indexOf('serves')] as TestDaemon;
        assert.equal((await loser.exited).code, 1, loser.stderr());
        const why = `another daemon holds ${socket}.lock (it serves ${socket} or is starting to)`;
        assert.equal(loser.logs.find((l) => l.msg === 'daemon did not start')?.['error'], why);
        assert.equal(loser.stderr().split('\n').filter((l) => !l.startsWith('{')).join('\n'), `ipwarden: ${why}\n`);
        // The winner serves the path (the loser touched nothing of it), also after the loser is gone.
        assert.equal((await runViaDaemon(socket, { command: 'VERSION', stdin: '{}' })).exitCode, 0);
        assert.ok(winner.logs.some((l) => l.msg === 'removing a stale socket (nobody accepts on it)'));
        assert.equal((await winner.stop()).code, 0);
        assert.equal(existsSync(socket), false);
      } finally {
        for (const x of pair) await x.stop();
      }
    }
    assert.equal(outcomes.length, 8);
  });
});

describe('ipwarden daemon stop', { skip }, () => {
  after(cleanupAll);

  it('SIGTERM during a request: that request finishes and is answered, the process exits 0, the socket file is gone', async () => {
    const d = await startTestDaemon();
    const shim = await fakeShim();
    const dd = temp();
    const dir = join(dd, NET);
    mkdirSync(dir, { recursive: true });
    const lock = await holdLock(join(dir, 'lock'));
    const answer = runViaDaemon(d.socket, { command: 'ADD', containerId: 'term1', ifname: 'eth0', stdin: conf(dd) }, shim);
    await until(() => hasOpen(d.pid, join(dir, 'lock')));
    d.kill('SIGTERM');
    await d.waitForLog((l) => l.msg === 'daemon stopping');
    // No new connection is accepted while stopping.
    await assert.rejects(sendRaw(d.socket, Buffer.from('IPWD')), (e: NodeJS.ErrnoException) => e.code === 'ENOENT' || e.code === 'ECONNREFUSED');
    await lock.release();
    const r = await answer;
    assert.equal(r.exitCode, 0, r.stdout);
    assert.equal((r.json?.['ips'] as Array<{ address: string }>)[0]?.address, '10.93.0.2/28');
    assert.deepEqual(await d.exited, { code: 0, signal: null });
    assert.equal(existsSync(d.socket), false);
    assert.ok(d.logs.some((l) => l.msg === 'request served' && l['containerId'] === 'term1' && l['result'] === 'ok'));
    assert.ok(d.logs.some((l) => l.msg === 'daemon stopped'));
    await d.stop();
  });

  it('in-process: close() twice (and concurrently) is fine; the request hook sees each answered request', async () => {
    const t = temp();
    const events: RequestEvent[] = [];
    const options: DaemonOptions = {
      socket: join(t, 'run', 'plugin.sock'),
      metricsAddress: { host: '127.0.0.1', port: 0 },
      intervalSeconds: 60,
      logLevel: 'silent',
      dataDir: join(t, 'data'),
      network: null,
      runtimeEndpoint: null,
      graceSeconds: 300,
      policy: 'conservative',
      cniConfDir: join(t, 'net.d'),
      auditLog: null,
    };
    const closedParts: string[] = [];
    const daemon = await startDaemon(options, {
      log: createLogger('silent'),
      hooks: { onRequest: (e) => void events.push(e) },
      parts: [() => ({ name: 'p1', close: async () => void closedParts.push('p1') }), () => ({ name: 'p2', close: async () => void closedParts.push('p2') })],
    });
    const dd = temp();
    const r = await runViaDaemon(options.socket, { command: 'ADD', containerId: 'hook1', ifname: 'eth0', stdin: conf(dd) }, await fakeShim());
    assert.equal(r.exitCode, 0, r.stdout);
    await until(() => events.length === 1);
    const e = events[0] as RequestEvent;
    assert.deepEqual({ ...e, durationSeconds: 0 }, { command: 'ADD', containerId: 'hook1', network: NET, result: 'ok', exitStatus: 0, durationSeconds: 0, delivered: true });
    assert.ok(e.durationSeconds > 0 && Number.isFinite(e.durationSeconds));
    const [a, b] = [daemon.close(), daemon.close()];
    assert.equal(a, b);
    await Promise.all([a, b]);
    await daemon.close();
    assert.equal(existsSync(options.socket), false);
    assert.deepEqual(closedParts, ['p2', 'p1']);
  });

  it('in-process: a client that never completes its request is closed without an answer (request timeout), the daemon keeps serving', async () => {
    const t = temp();
    const malformed: string[] = [];
    const socket = join(t, 'run', 'plugin.sock');
    const daemon = await startDaemon(
      { socket, metricsAddress: { host: '127.0.0.1', port: 0 }, intervalSeconds: 60, logLevel: 'silent', dataDir: join(t, 'data'), network: null, runtimeEndpoint: null, graceSeconds: 300, policy: 'conservative', cniConfDir: join(t, 'net.d'), auditLog: null },
      { log: createLogger('silent'), requestTimeoutSeconds: 0.05, hooks: { onMalformed: (e) => void malformed.push(`${e.kind}: ${e.reason}`) } },
    );
    try {
      // Half a header, then silence (the client keeps its side open).
      const r = await sendRaw(socket, Buffer.from('IPWD\x01\0'));
      assert.deepEqual([r.kind, r.kind === 'closed' ? r.received : -1], ['closed', 0]);
      assert.deepEqual(malformed, ['timeout: no complete request within 0.05s (6 bytes received)']);
      assert.equal((await runViaDaemon(socket, { command: 'VERSION', stdin: '{}' })).exitCode, 0);
    } finally {
      await daemon.close();
    }
  });

  it('in-process, maxInFlight 1: a request waits for the one in flight, a VERSION does not; a queued request whose client went away is dropped unrun', async () => {
    const t = temp();
    const lines: Array<Record<string, unknown>> = [];
    const log = createLogger('debug', { stream: { write: (s: string) => void lines.push(JSON.parse(s) as Record<string, unknown>) } });
    const order: string[] = [];
    const dropped: string[] = [];
    const socket = join(t, 'run', 'plugin.sock');
    const daemon = await startDaemon(
      { socket, metricsAddress: { host: '127.0.0.1', port: 0 }, intervalSeconds: 60, logLevel: 'debug', dataDir: join(t, 'data'), network: null, runtimeEndpoint: null, graceSeconds: 300, policy: 'conservative', cniConfDir: join(t, 'net.d'), auditLog: null },
      { log, maxInFlight: 1, hooks: { onRequest: (e) => void order.push(`${e.command} ${e.containerId}`), onDropped: (e) => void dropped.push(`${e.command} ${e.containerId} ${e.stage}`) } },
    );
    try {
      const dd = temp();
      const dir = join(dd, NET);
      mkdirSync(dir, { recursive: true });
      const lock = await holdLock(join(dir, 'lock'));
      const shim = await fakeShim();
      const first = runViaDaemon(socket, { command: 'ADD', containerId: 'q1', ifname: 'eth0', stdin: conf(dd) }, shim);
      await until(() => hasOpen(process.pid, join(dir, 'lock')));
      // A DEL of a network without a directory: it needs no lock, only the slot q1 holds.
      const second = runViaDaemon(socket, { command: 'DEL', containerId: 'q2', ifname: 'eth0', stdin: conf(temp()) }, shim);
      let third: Socket | null = null;
      const thirdDone = sendRaw(socket, encodeRequest({ pid: shim, env: cniEnv({ command: 'ADD', containerId: 'q3', ifname: 'eth0', stdin: '' }), stdin: JSON.stringify(conf(dd)) }), { onSent: (s) => (third = s) });
      await until(() => daemon.server.inFlight === 3 && third !== null);
      // VERSION takes no slot (STATUS neither): answered while q1 holds the only one and q2, q3 wait.
      const version = await runViaDaemon(socket, { command: 'VERSION', containerId: 'q4', stdin: '{}' }, shim);
      assert.equal(version.exitCode, 0);
      assert.deepEqual(order, ['VERSION q4']);
      (third as unknown as Socket).destroy();
      await until(() => lines.some((l) => l['msg'] === 'client closed its connection while its request was in flight' && l['containerId'] === 'q3'));
      await lock.release();
      assert.equal((await first).exitCode, 0);
      assert.equal((await second).exitCode, 0);
      assert.equal((await thirdDone).kind, 'closed');
      await until(() => dropped.length === 1);
      assert.deepEqual(order, ['VERSION q4', 'ADD q1', 'DEL q2']);
      assert.deepEqual(dropped, ['ADD q3 queued']);
      assert.deepEqual(snapshotDir(dir), { '10.93.0.2': 'q1\r\neth0', 'last_reserved_ip.0': '10.93.0.2', lock: '' });
    } finally {
      await daemon.close();
    }
  });
});

describe("the plugin socket's thread", { skip }, () => {
  after(cleanupAll);

  it('in-process: while the main thread is blocked no header is acknowledged; once it runs, the held acknowledgement goes out, and a client that then leaves is logged abandoned with nothing run', async () => {
    const t = temp();
    const lines: Array<Record<string, unknown>> = [];
    const log = createLogger('debug', { stream: { write: (s: string) => void lines.push(JSON.parse(s) as Record<string, unknown>) } });
    const served: string[] = [];
    const socket = join(t, 'run', 'plugin.sock');
    const daemon = await startDaemon(
      { socket, metricsAddress: { host: '127.0.0.1', port: 0 }, intervalSeconds: 60, logLevel: 'debug', dataDir: join(t, 'data'), network: null, runtimeEndpoint: null, graceSeconds: 300, policy: 'conservative', cniConfDir: join(t, 'net.d'), auditLog: null },
      { log, hooks: { onRequest: (e) => void served.push(e.command) } },
    );
    try {
      const go = join(t, 'go');
      const out = join(t, 'out');
      // A client in another process: on `go` it connects and sends a version-2 header only; on
      // the acknowledgement it writes `acked IPWA` and leaves without sending the body.
      const client = `
        const net = require('node:net'), fs = require('node:fs');
        const [sock, go, out] = process.argv.slice(1);
        const head = Buffer.alloc(20);
        head.write('IPWD', 0, 'latin1'); head.writeUInt32LE(2, 4); head.writeUInt32LE(process.pid, 8); head.writeUInt32LE(16, 12); head.writeUInt32LE(2, 16);
        fs.writeFileSync(out, 'ready\\n');
        const start = () => {
          const c = net.createConnection(sock, () => { c.write(head); fs.appendFileSync(out, 'sent\\n'); });
          c.on('data', (d) => { fs.appendFileSync(out, 'acked ' + d.toString('latin1', 0, 4) + '\\n'); c.end(); });
          c.on('close', () => process.exit(0));
        };
        const wait = () => (fs.existsSync(go) ? start() : setTimeout(wait, 5));
        wait();`;
      const c = spawn(process.execPath, ['-e', client, socket, go, out], { stdio: 'ignore' });
      children.push(c);
      const exited = new Promise<number | null>((resolve) => c.once('exit', (code) => resolve(code)));
      await until(() => existsSync(out) && readFileSync(out, 'utf8') === 'ready\n');
      const text = (): string => readFileSync(out, 'utf8');
      // Block this (the daemon's main) thread: its heartbeat goes stale after 250 ms.
      const spin = (ms: number, stop: () => boolean = () => false): void => {
        const end = Date.now() + ms;
        while (Date.now() < end && !stop()) {
          // busy: no timer, no message, no I/O callback of this thread runs
        }
      };
      spin(1500);
      writeFileSync(go, '');
      spin(60_000, () => text().includes('sent\n'));
      // The header is on its way (or read): 1 s more with the main thread still blocked.
      spin(1000, () => text().includes('acked'));
      assert.equal(text(), 'ready\nsent\n', 'no acknowledgement while the main thread is blocked');
      // The main thread runs again: the held acknowledgement goes out.
      await until(() => text().includes('acked'));
      assert.equal(text(), 'ready\nsent\nacked IPWA\n');
      assert.equal(await exited, 0);
      await until(() => lines.some((l) => l['msg'] === 'request abandoned: the client went away before sending its body (nothing was run)'));
      const abandoned = lines.filter((l) => l['msg'] === 'request abandoned: the client went away before sending its body (nothing was run)');
      assert.deepEqual(abandoned.map((l) => [l['level'], l['receivedBytes']]), [[30, HEADER_BYTES]]);
      assert.deepEqual(served, []);
      // Serving goes on.
      assert.equal((await runViaDaemon(socket, { command: 'VERSION', stdin: '{}' })).exitCode, 0);
      assert.deepEqual(served, ['VERSION']);
    } finally {
      await daemon.close();
    }
  });

  it('in-process: an ADD waiting for DIR/lock while the main thread is blocked, whose client leaves meanwhile, is dropped once it gets the lock (nothing written)', async () => {
    const t = temp();
    const lines: Array<Record<string, unknown>> = [];
    const log = createLogger('debug', { stream: { write: (s: string) => void lines.push(JSON.parse(s) as Record<string, unknown>) } });
    const socket = join(t, 'run', 'plugin.sock');
    const daemon = await startDaemon(
      { socket, metricsAddress: { host: '127.0.0.1', port: 0 }, intervalSeconds: 60, logLevel: 'debug', dataDir: join(t, 'data'), network: null, runtimeEndpoint: null, graceSeconds: 300, policy: 'conservative', cniConfDir: join(t, 'net.d'), auditLog: null },
      { log },
    );
    try {
      const dd = temp();
      const dir = join(dd, NET);
      mkdirSync(dir, { recursive: true });
      await holdLock(join(dir, 'lock'));
      const holder = children[children.length - 1] as ChildProcess;
      const shim = await fakeShim();
      // A version-2 client in another process: header, the acknowledgement, the body, then it waits.
      const request = encodeRequest({ version: 2, pid: shim, env: cniEnv({ command: 'ADD', containerId: 'late1', ifname: 'eth0', stdin: '' }), stdin: JSON.stringify(conf(dd)) });
      const out = join(t, 'client-out');
      const client = spawn(
        process.execPath,
        [
          '-e',
          `const net = require('node:net'), fs = require('node:fs');
           const [sock, hex, out] = process.argv.slice(1); const req = Buffer.from(hex, 'hex');
           const c = net.createConnection(sock, () => c.write(req.subarray(0, ${HEADER_BYTES})));
           let acked = false;
           c.on('data', () => { if (!acked) { acked = true; c.write(req.subarray(${HEADER_BYTES})); fs.writeFileSync(out, 'sent'); } });`,
          socket,
          request.toString('hex'),
          out,
        ],
        { stdio: 'ignore' },
      );
      children.push(client);
      await until(() => existsSync(out) && hasOpen(process.pid, join(dir, 'lock')));
      // Block the main thread; meanwhile the client leaves (its shim gave up) and the lock is freed.
      const spinUntil = (end: number): void => {
        while (Date.now() < end) {
          // busy: no timer, no message, no I/O callback of this thread runs
        }
      };
      const t0 = Date.now();
      process.kill(client.pid as number, 'SIGKILL');
      process.kill(holder.pid as number, 'SIGKILL');
      spinUntil(t0 + 1500);
      // Resumed: the lock's poll timer runs before the socket thread's report is read.
      const dropped = await new Promise<Record<string, unknown>>((resolve) => {
        const tick = (): void => {
          const l = lines.find((x) => x['containerId'] === 'late1' && (x['msg'] === 'request dropped: the client went away' || String(x['msg']).startsWith('request served')));
          if (l === undefined) setTimeout(tick, 10);
          else resolve(l);
        };
        tick();
      });
      assert.deepEqual([dropped['msg'], dropped['stage']], ['request dropped: the client went away', 'after-lock']);
      assert.deepEqual(snapshotDir(dir), { lock: '' });
    } finally {
      await daemon.close();
    }
  });

  it('in-process: the thread ends while an ADD waits for DIR/lock: its connection closes unanswered, the ADD is dropped after the lock (nothing written), its state turns "failed" (its /readyz fails) and it stops with exit status 1', async () => {
    const t = temp();
    const lines: Array<Record<string, unknown>> = [];
    const log = createLogger('debug', { stream: { write: (s: string) => void lines.push(JSON.parse(s) as Record<string, unknown>) } });
    const states: string[] = [];
    let worker: { terminate(): Promise<number> } | null = null;
    const socket = join(t, 'run', 'plugin.sock');
    const signals = { once: () => signals, off: () => signals } as unknown as Parameters<typeof runDaemon>[2];
    const status = runDaemon(
      { socket, metricsAddress: { host: '127.0.0.1', port: 0 }, intervalSeconds: 60, logLevel: 'debug', dataDir: join(t, 'data'), network: null, runtimeEndpoint: null, graceSeconds: 300, policy: 'conservative', cniConfDir: join(t, 'net.d'), auditLog: null },
      { log, onSocketThread: (w) => (worker = w), onState: (s) => void states.push(s) },
      signals,
    );
    const dd = temp();
    const dir = join(dd, NET);
    mkdirSync(dir, { recursive: true });
    const lock = await holdLock(join(dir, 'lock'));
    try {
      await until(() => states.includes('started'));
      const shim = await fakeShim();
      let sock: Socket | null = null;
      const sent = sendRaw(socket, encodeRequest({ pid: shim, env: cniEnv({ command: 'ADD', containerId: 'dies1', ifname: 'eth0', stdin: '' }), stdin: JSON.stringify(conf(dd)) }), { onSent: (s) => (sock = s) });
      await until(() => hasOpen(process.pid, join(dir, 'lock')) && sock !== null);
      assert.notEqual(worker, null);
      await (worker as unknown as { terminate(): Promise<number> }).terminate();
      // The thread's connections are gone with it: the client sees a close, no answer (its shim falls back).
      const r = await sent;
      assert.equal(r.kind, 'closed');
      await until(() => states.length === 3);
      assert.deepEqual(states, ['started', 'failed', 'stopping']);
      assert.ok(lines.some((l) => l['level'] === 50 && String(l['msg']).startsWith("the plugin socket's thread ended")));
    } finally {
      // The ADD still waits for the lock (the stop waits for it); once it has the lock it must drop.
      await lock.release();
    }
    assert.equal(await status, 1);
    const dropped = lines.filter((l) => l['msg'] === 'request dropped: the client went away' && l['containerId'] === 'dies1');
    assert.deepEqual(dropped.map((l) => l['stage']), ['after-lock']);
    assert.deepEqual(snapshotDir(dir), { lock: '' });
    assert.equal(lines.some((l) => l['msg'] === 'request served' && l['containerId'] === 'dies1'), false);
    assert.equal(existsSync(socket), false);
  });
});

describe('a daemon in a mount namespace of its own (as in its container) serves only host paths', { skip, timeout: 120_000 }, () => {
  // The DaemonSet's container sees only its hostPath mounts at the host's paths. Here: the daemon
  // runs in a new mount namespace where PRIV is a tmpfs of its own (a path of the container, not
  // the host: like its /tmp emptyDir) while HOST is the host's directory, as mounted.
  let d: TestDaemon;
  let shimPid: number;
  let host = '';
  let priv = '';
  before(async () => {
    host = temp('ipwd-hostview-h-');
    priv = temp('ipwd-hostview-p-');
    d = await startTestDaemon({
      wrap: ['unshare', '--mount', '--propagation', 'private', '--', 'sh', '-c', 'mount -t tmpfs ipwd-hostview "$0" && exec "$@"', priv],
    });
    shimPid = await fakeShim();
  });
  after(async () => {
    await d?.stop();
    cleanupAll();
  });

  it('a data directory that is the host\'s is served; one that is only the daemon\'s own is declined with no answer, and nothing is written anywhere', async () => {
    const served = await runViaDaemon(d.socket, { command: 'ADD', containerId: 'hv-1', ifname: 'eth0', stdin: conf(host) }, shimPid);
    assert.deepEqual([served.exitCode, (JSON.parse(served.stdout) as { ips: Array<{ address: string }> }).ips[0]?.address], [0, '10.93.0.2/28']);
    assert.equal(readFileSync(join(host, NET, '10.93.0.2'), 'utf8'), 'hv-1\r\neth0');

    await assert.rejects(runViaDaemon(d.socket, { command: 'ADD', containerId: 'hv-2', ifname: 'eth0', stdin: conf(priv) }, shimPid), /the daemon closed without an answer/);
    const line = await d.waitForLog((l) => l.msg.startsWith('request declined'));
    assert.deepEqual([line['command'], line['containerId'], line['reason']], ['ADD', 'hv-2', `${priv}: ${priv} here is not the requester's ${priv}: not a host path mounted at the same path`]);
    // The host's PRIV is untouched (the standalone, which the shim now runs, will write there).
    assert.deepEqual(readdirSync(priv), []);
    // A resolvConf that is not the host's file is declined the same way, before anything is reserved.
    await assert.rejects(runViaDaemon(d.socket, { command: 'ADD', containerId: 'hv-3', ifname: 'eth0', stdin: conf(host, '1.0.0', { resolvConf: join(priv, 'resolv.conf') }) }, shimPid), /closed without an answer/);
    assert.deepEqual(Object.keys(snapshotDir(join(host, NET))).filter((f) => /^\d/.test(f)), ['10.93.0.2']);
    // STATUS, which turns a store error into its own answer, is declined too.
    await assert.rejects(runViaDaemon(d.socket, { command: 'STATUS', containerId: '', ifname: '', stdin: conf(priv) }, shimPid), /closed without an answer/);
    // The daemon logs each decline before it closes; the line may reach us after the close.
    await until(() => d.logs.filter((l) => l.msg.startsWith('request declined')).length >= 3);
    assert.deepEqual(d.logs.filter((l) => l.msg.startsWith('request declined')).map((l) => [l['command'], l['containerId']]), [['ADD', 'hv-2'], ['ADD', 'hv-3'], ['STATUS', '']]);
  });
});

describe('outside the host PID namespace the daemon cannot tell host paths and serves none', { skip }, () => {
  it('hostView() in a new PID namespace refuses every path, naming why', () => {
    const code = `import { hostView } from ${JSON.stringify(join(ROOT, 'src/node/host-view.ts'))}; process.stdout.write(JSON.stringify(hostView().notHostPath('/tmp', 1)));`;
    const r = spawnSync('unshare', ['--pid', '--fork', '--mount-proc', process.execPath, '--import', 'tsx', '--input-type=module', '-e', code], { cwd: ROOT, encoding: 'utf8' });
    assert.equal(r.status, 0, r.stderr);
    assert.equal(JSON.parse(r.stdout), "/proc is not of the host PID namespace (pid 2 is not kthreadd): the requester's files cannot be told from this container's");
  });
});
