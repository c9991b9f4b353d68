/**
 * Black-box tests of the exec shim (native/shim.c, docs/daemon.md) as `install-cni` installs it,
 * against a hostile fake daemon (test/helpers/fake-daemon.ts) and the real standalone plugin:
 *
 * - a valid v1 answer is relayed exactly (stdout and stderr bytes, exit status 0, 1 or other) and
 *   the daemon receives exactly the filtered env, the exact stdin bytes and the shim's pid;
 * - every way the daemon can fail — no socket, a stale socket file, no acknowledgement of the
 *   header within the (patched) short deadline, a wrong acknowledgement, closing on the header (a
 *   daemon that speaks only v1), closing without an answer, a bad magic or version, an impossible
 *   header, half an answer, no answer within the (patched) timeout, a stdin over 16 MiB — ends in
 *   the standalone plugin doing the real ADD (exact result,
 *   exact reservation file), with `IPWARDEN_PATH=standalone-fallback` (its counting line) and
 *   without the dropped variables (NODE_EXTRA_CA_CERTS would print a warning on stderr; the exact
 *   environment is read from /proc while the standalone waits for a held lock);
 * - the replayed stdin is byte for byte the original (a recording standalone in a scratch bin dir);
 * - an acknowledged request is not abandoned at the short deadline: a late answer is relayed;
 * - the real daemon SIGSTOPped (connections wait in the kernel's backlog): ADD and DEL fall back
 *   after the short deadline, and the daemon, woken, gets headers only and runs nothing (exact
 *   files, also for ADD/DEL/DEL/ADD of one owner while stopped);
 * - the shim is statically linked (no PT_INTERP / PT_DYNAMIC program header);
 * - install-cni's atomic write and --socket validation, and the counting line's own checks.
 *
 * Every server, process and temp dir is removed in `after`, also on failure.
 */
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { chmodSync, chownSync, existsSync, lstatSync, mkdirSync, readdirSync, readFileSync, readlinkSync, realpathSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { atomicWrite, patchShim, readShimFields, validateSocketPath, SOCKET_FIELD } from '../../src/cli/install-cni.ts';
import { UsageError } from '../../src/common/errors.ts';
import { countFallbackRequest, fallbackLine } from '../../src/cni/plugin.ts';
import { ACK, encodeAnswer, HEADER_BYTES, MAGIC, startFakeDaemon, type Behaviour, type FakeDaemon } from '../helpers/fake-daemon.ts';
import { installedPlugin, pluginSocket, ROOT, standalonePlugin, tempDir } from '../helpers/cni.ts';
import { startTestDaemon, type TestDaemon } from '../helpers/daemon.ts';

const NET = 'shimnet';
const CA = '/nonexistent/ipw-shim-ca.pem';
const CRI = 'unix:///nonexistent/ipw-shim-cri.sock';
const cleanups: Array<() => void | Promise<void>> = [];
after(async () => {
  for (const c of cleanups.reverse()) await c();
});

let bin = '';
let binDir = '';
before(() => {
  bin = installedPlugin();
  binDir = dirname(bin);
});

function temp(prefix: string): string {
  const t = tempDir(prefix);
  cleanups.push(t.cleanup);
  return t.dir;
}

let copies = 0;
/**
 * A patched copy of the installed shim in `dir` (default: beside the installed standalone) that
 * connects to `<new 0700 temp dir>/plugin.sock`, with the given timeouts (else the compiled 150 s
 * and 3 s); returns the copy and that socket's directory.
 */
function shim(opts: { timeoutSeconds?: number; ackTimeoutSeconds?: number; dir?: string } = {}): { shim: string; socket: string; sockDir: string } {
  const sockDir = temp('ipw-shim-sock-');
  const socket = join(sockDir, 'plugin.sock');
  const path = join(opts.dir ?? binDir, `ipwarden-shim-test-${copies++}`);
  const { dir: _dir, ...timeouts } = opts;
  atomicWrite(path, patchShim(readFileSync(bin), { socket, ...timeouts }), 0o755);
  return { shim: path, socket, sockDir };
}

async function daemon(socket: string, b: Behaviour): Promise<FakeDaemon> {
  const d = await startFakeDaemon(socket, b);
  cleanups.push(() => d.close());
  return d;
}

/** The runtime's environment for one CNI call, with variables the shim must drop. */
function runtimeEnv(command: string, containerId = 'c1'): Record<string, string> {
  return {
    PATH: '/usr/bin:/bin',
    CNI_COMMAND: command,
    CNI_CONTAINERID: containerId,
    CNI_IFNAME: 'eth0',
    CNI_NETNS: '/var/run/netns/ipw-shim',
    CNI_PATH: '/usr/lib/cni',
    CONTAINER_RUNTIME_ENDPOINT: CRI,
    NODE_EXTRA_CA_CERTS: CA,
    HOME: '/root',
    FOO: 'bar',
    IPWARDEN_PATH: 'from-the-runtime',
    IPWARDEN_SOCKET: '/tmp/elsewhere.sock',
  };
}
/** What of {@link runtimeEnv} the shim forwards, sorted. */
function forwarded(command: string, containerId = 'c1'): string[] {
  const e = runtimeEnv(command, containerId);
  return Object.entries(e)
    .filter(([k]) => k.startsWith('CNI_') || k === 'PATH' || k === 'CONTAINER_RUNTIME_ENDPOINT')
    .map(([k, v]) => `${k}=${v}`)
    .sort();
}

interface Ran {
  pid: number;
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: Buffer;
  stderr: Buffer;
}
/** Run `path` with env and stdin bytes; `onSpawn` sees the pid first. */
function run(path: string, env: Record<string, string>, stdin: Uint8Array, onSpawn: (pid: number) => void = () => undefined): Promise<Ran> {
  return new Promise((res, rej) => {
    const p = spawn(path, [], { env });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    p.stdout.on('data', (c: Buffer) => out.push(c));
    p.stderr.on('data', (c: Buffer) => err.push(c));
    p.on('error', rej);
    p.on('spawn', () => onSpawn(p.pid as number));
    p.on('close', (code, signal) => res({ pid: p.pid as number, code, signal, stdout: Buffer.concat(out), stderr: Buffer.concat(err) }));
    p.stdin.on('error', () => undefined);
    p.stdin.end(stdin);
  });
}

function config(dataDir: string, extra: Record<string, unknown> = {}): Buffer {
  return Buffer.from(JSON.stringify({ cniVersion: '1.0.0', name: NET, ...extra, ipam: { type: 'ipwarden', dataDir, ranges: [[{ subnet: '10.77.0.0/24' }]] } }));
}

const RESULT = { cniVersion: '1.0.0', ips: [{ address: '10.77.0.2/24', gateway: '10.77.0.1' }] };

/** An ADD through `shimPath` that must end in the standalone plugin: its real effect, exactly. */
async function assertFallbackAdd(shimPath: string, sockDir: string, extra: Record<string, unknown> = {}): Promise<Ran> {
  const dd = temp('ipw-shim-data-');
  const r = await run(shimPath, runtimeEnv('ADD'), config(dd, extra));
  // stderr empty: no "Warning: Ignoring extra certs" — NODE_EXTRA_CA_CERTS did not reach Node.
  assert.deepEqual([r.code, r.stderr.toString('utf8')], [0, '']);
  assert.deepEqual(JSON.parse(r.stdout.toString('utf8')), RESULT);
  assert.deepEqual(
    readdirSync(join(dd, NET)).sort().map((n) => [n, readFileSync(join(dd, NET, n), 'utf8')]),
    [['10.77.0.2', 'c1\r\neth0'], ['last_reserved_ip.0', '10.77.0.2'], ['lock', '']],
  );
  // The counting line proves IPWARDEN_PATH=standalone-fallback and the shim's own IPWARDEN_SOCKET.
  assert.match(readFileSync(join(sockDir, 'standalone-requests.log'), 'utf8'), /^\d+ ADD ok\n$/);
  return r;
}

/** Poll `cond` (a condition, not a clock) until true; fail after `tries` looks. */
async function waitFor(what: string, cond: () => boolean, tries = 3000): Promise<void> {
  for (let i = 0; i < tries; i++) {
    if (cond()) return;
    await new Promise((r) => setTimeout(r, 5));
  }
  assert.fail(`gave up waiting for ${what}`);
}

describe('shim: a valid answer is relayed exactly', () => {
  for (const exitStatus of [0, 1, 42]) {
    it(`exit status ${exitStatus}, stdout and stderr bytes, filtered env, exact stdin and pid reach the daemon`, async () => {
      const { shim: s, socket, sockDir } = shim();
      const stdout = Buffer.concat([Buffer.from('{"cniVersion":"1.0.0","ips":[]}\n'), Buffer.from([0xff, 0x00, 0xc3, 0x28])]);
      const stderr = Buffer.from([0x6e, 0x6f, 0x74, 0x65, 0xfe, 0x0a]);
      const d = await daemon(socket, { kind: 'answer', exitStatus, stdout, stderr });
      const stdin = Buffer.concat([Buffer.from('{"cniVersion":"1.0.0","name":"x"}'), Buffer.from([0x80, 0xff, 0x00, 0xfe, 0x0a])]);
      const r = await run(s, runtimeEnv('ADD'), stdin);
      assert.deepEqual([r.code, r.signal], [exitStatus, null]);
      assert.deepEqual(r.stdout, stdout);
      assert.deepEqual(r.stderr, stderr);
      const c = await d.connection(0);
      assert.ok(c.request !== null);
      assert.deepEqual({ ...c.request, env: [...c.request.env].sort() }, { magic: 'IPWD', version: 2, pid: r.pid, env: forwarded('ADD'), stdin });
      assert.equal(d.connections.length, 1);
      assert.equal(existsSync(join(sockDir, 'standalone-requests.log')), false, 'the standalone did not run');
    });
  }

  it('a large answer (3 MiB of stdout) is written out completely', async () => {
    const { shim: s, socket } = shim();
    const stdout = Buffer.alloc(3 << 20);
    for (let i = 0; i < stdout.length; i++) stdout[i] = (i * 7919) & 0xff;
    await daemon(socket, { kind: 'answer', exitStatus: 0, stdout, stderr: Buffer.from('e') });
    const r = await run(s, runtimeEnv('DEL'), Buffer.from('{}'));
    assert.equal(r.code, 0);
    assert.equal(r.stdout.length, stdout.length);
    assert.ok(r.stdout.equals(stdout));
    assert.equal(r.stderr.toString(), 'e');
  });
});

describe('shim: every daemon failure falls back to the standalone plugin', () => {
  it('without /proc (no /proc/self/exe) the fallback finds the standalone from the absolute argv[0]', { skip: process.getuid?.() !== 0 ? 'needs root' : false }, () => {
    const r = spawnSync('unshare', ['-m', 'sh', '-c', 'umount -l /proc && exec "$0"', bin], {
      input: '{"cniVersion":"1.0.0"}',
      env: { PATH: '/usr/bin:/bin', CNI_COMMAND: 'VERSION' },
      encoding: 'utf8',
    });
    assert.equal(r.status, 0, r.stdout + r.stderr);
    assert.deepEqual(JSON.parse(r.stdout), { cniVersion: '1.0.0', supportedVersions: ['0.1.0', '0.2.0', '0.3.0', '0.3.1', '0.4.0', '1.0.0', '1.1.0'] });
  });

  it('a listener of another user on the socket path is never trusted: the standalone answers (SO_PEERCRED)', { skip: process.getuid?.() !== 0 ? 'needs root' : false }, async () => {
    const s = shim();
    // The socket's directory handed to nobody, who then listens there and answers every request
    // with an address of its choosing (a bogus but well-formed v1 answer).
    chownSync(s.sockDir, 65534, 65534);
    const evilAnswer = JSON.stringify({ cniVersion: '1.0.0', ips: [{ address: '10.77.0.99/24' }] });
    const py = [
      'import socket, struct, sys, os',
      `p = ${JSON.stringify(s.socket)}`,
      'l = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); l.bind(p); l.listen(8)',
      `out = ${JSON.stringify(evilAnswer)}.encode()`,
      'while True:',
      '    c, _ = l.accept()',
      "    c.sendall(b'IPWD' + struct.pack('<IIII', 1, 0, len(out), 0) + out)",
    ].join('\n');
    const evil = spawn('/usr/bin/setpriv', ['--reuid', '65534', '--regid', '65534', '--clear-groups', '--', '/usr/bin/python3', '-c', py], { stdio: 'ignore' });
    cleanups.push(() => void evil.kill('SIGKILL'));
    await waitFor('the other user\'s listener', () => existsSync(s.socket));
    assert.equal(lstatSync(s.socket).uid, 65534);
    const dd = temp('ipw-shim-data-');
    const r = await run(s.shim, runtimeEnv('ADD'), config(dd));
    assert.deepEqual([r.code, r.stderr.toString('utf8')], [0, '']);
    assert.deepEqual(JSON.parse(r.stdout.toString('utf8')), RESULT);
    assert.deepEqual(
      readdirSync(join(dd, NET)).sort().map((n) => [n, readFileSync(join(dd, NET, n), 'utf8')]),
      [['10.77.0.2', 'c1\r\neth0'], ['last_reserved_ip.0', '10.77.0.2'], ['lock', '']],
    );
    // The directory is not root's: the standalone does not count the request there either.
    assert.equal(existsSync(join(s.sockDir, 'standalone-requests.log')), false);
  });

  it('the installed plugin run alone (no CNI_COMMAND, no argument) prints skel\'s "about" text on stderr, exit 0, without asking the daemon; with an argument it is the CLI', async () => {
    const { shim: s, socket } = shim();
    const d = await daemon(socket, { kind: 'close' });
    const about = 'CNI ipwarden plugin version 0.1.0\nCNI protocol versions supported: 0.1.0, 0.2.0, 0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0\n';
    for (const exe of [bin, s]) {
      const r = spawnSync(exe, [], { input: '', env: { PATH: '/usr/bin:/bin' }, encoding: 'utf8' });
      assert.deepEqual([r.status, r.stdout, r.stderr], [0, '', about], exe);
    }
    assert.equal(d.connections.length, 0);
    // The standalone run directly, and the CLI bundle, are the CLI: usage, not the about text.
    for (const argv of [[standalonePlugin()], [process.execPath, join(ROOT, 'dist/ipwarden.cjs')]]) {
      const r = spawnSync(argv[0] as string, argv.slice(1), { input: '', env: { PATH: '/usr/bin:/bin' }, encoding: 'utf8' });
      assert.match(r.stdout + r.stderr, /^Usage: ipwarden \[options\] \[command\]\n/, argv.join(' '));
    }
    // With an argument the installed plugin is the CLI too.
    const v = spawnSync(bin, ['--version'], { input: '', env: { PATH: '/usr/bin:/bin' }, encoding: 'utf8' });
    assert.deepEqual([v.status, v.stdout, v.stderr], [0, 'ipwarden 0.1.0\n', '']);
  });

  it('VERSION through the fallback ends with a newline, as libcni writes it (host-local\'s bytes plus 1.1.0)', async () => {
    const { shim: s } = shim();
    const r = await run(s, { PATH: '/usr/bin:/bin', CNI_COMMAND: 'VERSION' }, Buffer.from('{"cniVersion":"1.0.0"}'));
    assert.deepEqual([r.code, r.stdout.toString(), r.stderr.toString()], [0, '{"cniVersion":"1.0.0","supportedVersions":["0.1.0","0.2.0","0.3.0","0.3.1","0.4.0","1.0.0","1.1.0"]}\n', '']);
  });

  it('control: NODE_EXTRA_CA_CERTS given to Node prints a warning (what the fallback checks rely on)', () => {
    const r = spawnSync(standalonePlugin(), [], { input: '{"cniVersion":"1.0.0"}', env: { PATH: '/usr/bin:/bin', CNI_COMMAND: 'VERSION', NODE_EXTRA_CA_CERTS: CA }, encoding: 'utf8' });
    assert.equal(r.status, 0);
    assert.match(r.stderr, /Ignoring extra certs/);
  });

  it('no socket file', async () => {
    const { shim: s, socket, sockDir } = shim();
    assert.equal(existsSync(socket), false);
    await assertFallbackAdd(s, sockDir);
  });

  it('a stale socket file nobody listens on', async () => {
    const { shim: s, socket, sockDir } = shim();
    // A listener killed with SIGKILL leaves its socket file behind (a clean close removes it).
    const k = spawnSync(process.execPath, ['-e', `require('node:net').createServer().listen(${JSON.stringify(socket)}, () => process.kill(process.pid, 'SIGKILL'))`]);
    assert.equal(k.signal, 'SIGKILL');
    assert.ok(lstatSync(socket).isSocket());
    await assertFallbackAdd(s, sockDir);
  });

  const malformed: Array<[string, Behaviour]> = [
    ['the daemon closes after the request without answering', { kind: 'close' }],
    ['a bad magic', { kind: 'raw', bytes: encodeAnswer(0, Buffer.from('{"fake":true}'), Buffer.alloc(0), Buffer.from('IPWX')) }],
    ['an answer of version 1 to a version-2 request', { kind: 'raw', bytes: encodeAnswer(0, Buffer.from('{"fake":true}'), Buffer.alloc(0), MAGIC, 1) }],
    ['an answer of version 3', { kind: 'raw', bytes: encodeAnswer(0, Buffer.from('{"fake":true}'), Buffer.alloc(0), MAGIC, 3) }],
    ['an exit status above 255', { kind: 'raw', bytes: encodeAnswer(256, Buffer.from('{"fake":true}'), Buffer.alloc(0)) }],
    ['a header declaring more than 16 MiB of stdout', { kind: 'raw', bytes: encodeAnswer(0, Buffer.alloc(0), Buffer.alloc(0)).fill(0x01, 12, 16) }],
    ['half an answer, then close', { kind: 'raw', bytes: encodeAnswer(0, Buffer.from('{"fake":true,"padding":"................"}'), Buffer.from('x')).subarray(0, 30) }],
    ['half a header, then close', { kind: 'raw', bytes: MAGIC }],
  ];
  for (const [what, behaviour] of malformed) {
    it(what, async () => {
      const { shim: s, socket, sockDir } = shim();
      const d = await daemon(socket, behaviour);
      await assertFallbackAdd(s, sockDir);
      const c = await d.connection(0);
      assert.ok(c.request !== null, 'the daemon got the whole request before the fallback');
      assert.deepEqual([...c.request.env].sort(), forwarded('ADD'));
    });
  }

  // The header only: the body is sent after the acknowledgement, so a daemon that never gives one
  // never holds a request it could run after the standalone did.
  const unacknowledged: Array<[string, Behaviour, { timeoutSeconds?: number; ackTimeoutSeconds?: number }]> = [
    ['no acknowledgement within the (patched, 0.2 s) short deadline: a stopped or hung daemon', { kind: 'no-ack' }, { ackTimeoutSeconds: 0.2 }],
    ['no acknowledgement, and an answer timeout (0.5 s) shorter than the default 3 s deadline: the shorter one', { kind: 'no-ack' }, { timeoutSeconds: 0.5 }],
    ['a daemon that closes on the header without an acknowledgement (one that speaks only v1)', { kind: 'close-on-header' }, {}],
    ['an acknowledgement of version 1', { kind: 'bad-ack', bytes: Buffer.from([0x49, 0x50, 0x57, 0x41, 1, 0, 0, 0]) }, {}],
    ['an answer header instead of the acknowledgement', { kind: 'bad-ack', bytes: encodeAnswer(0, Buffer.from('{"fake":true}'), Buffer.alloc(0)) }, {}],
    ['half an acknowledgement, then nothing (within the 0.2 s deadline)', { kind: 'bad-ack', bytes: ACK.subarray(0, 5) }, { ackTimeoutSeconds: 0.2 }],
  ];
  for (const [what, behaviour, timeouts] of unacknowledged) {
    it(what, async () => {
      const { shim: s, socket, sockDir } = shim(timeouts);
      const d = await daemon(socket, behaviour);
      await assertFallbackAdd(s, sockDir);
      const c = await d.connection(0);
      await c.clientGone; // the shim closed before it ran the standalone
      assert.deepEqual([c.received, c.request], [HEADER_BYTES, null], 'the header only: the body was never sent');
    });
  }

  it('an acknowledged request is not abandoned at the short deadline: an answer that comes after it is relayed', async () => {
    const { shim: s, socket, sockDir } = shim({ ackTimeoutSeconds: 0.1 });
    assert.deepEqual(readShimFields(readFileSync(s)), { socket, timeout: '150', ackTimeout: '0.1' });
    let release: () => void = () => undefined;
    const hold = new Promise<void>((r) => (release = r));
    const d = await daemon(socket, { kind: 'answer', exitStatus: 0, stdout: Buffer.from('{"late":true}'), stderr: Buffer.alloc(0), hold });
    const done = run(s, runtimeEnv('ADD'), config(temp('ipw-shim-data-')));
    const c = await d.connection(0);
    await c.header; // acknowledged now: the shim's short deadline began before this
    // Hold the answer well past that deadline (ten times it): a shim that still counted it would
    // have closed and run the standalone by then.
    await new Promise((r) => setTimeout(r, 1000));
    release();
    const r = await done;
    assert.deepEqual([r.code, r.stdout.toString(), r.stderr.toString()], [0, '{"late":true}', '']);
    assert.ok(c.request !== null);
    assert.equal(existsSync(join(sockDir, 'standalone-requests.log')), false, 'the standalone did not run');
  });

  it('a daemon that never answers: the shim gives up after its (patched, 1 s) timeout and closes', async () => {
    const { shim: s, socket, sockDir } = shim({ timeoutSeconds: 1 });
    assert.equal(readShimFields(readFileSync(s)).timeout, '1');
    const d = await daemon(socket, { kind: 'silent' });
    await assertFallbackAdd(s, sockDir);
    const c = await d.connection(0);
    assert.ok(c.request !== null);
    await c.clientGone; // the shim closed its side before running the standalone
  });

  it('a stdin over 16 MiB is not sent; the standalone gets all of it', async () => {
    const { shim: s, socket, sockDir } = shim();
    const d = await daemon(socket, { kind: 'answer', exitStatus: 0, stdout: Buffer.from('{"fake":true}'), stderr: Buffer.alloc(0) });
    await assertFallbackAdd(s, sockDir, { pad: 'p'.repeat((16 << 20) + 100) });
    const c = await d.connection(0);
    await c.clientGone;
    assert.deepEqual([c.received, c.request], [0, null]);
  });

  it('the standalone runs in the same process with exactly the filtered env plus IPWARDEN_PATH and IPWARDEN_SOCKET (/proc)', async () => {
    const { shim: s, socket, sockDir } = shim();
    const dd = temp('ipw-shim-data-');
    mkdirSync(join(dd, NET));
    const holder = spawn(process.execPath, [join(ROOT, 'test/fixtures/hold-lock.cjs'), join(dd, NET, 'lock')], { stdio: ['pipe', 'pipe', 'inherit'] });
    cleanups.push(() => {
      if (holder.exitCode === null) holder.kill('SIGKILL');
    });
    await new Promise<void>((res) => holder.stdout.once('data', () => res()));
    let pid = 0;
    const done = run(s, runtimeEnv('ADD'), config(dd), (p) => (pid = p));
    const standalone = realpathSync(join(binDir, 'ipwarden-standalone'));
    // Wait until the pid the shim started as runs the standalone (a single executable: its own
    // /proc/PID/exe, no interpreter), blocked on the held lock.
    await waitFor('the shim to exec the standalone', () => {
      try {
        return pid !== 0 && readlinkSync(`/proc/${pid}/exe`) === standalone;
      } catch {
        return false;
      }
    });
    const environ = readFileSync(`/proc/${pid}/environ`, 'utf8').split('\0').filter((e) => e !== '').sort();
    assert.deepEqual(environ, [...forwarded('ADD'), 'IPWARDEN_PATH=standalone-fallback', `IPWARDEN_SOCKET=${socket}`].sort());
    assert.match(readFileSync(`/proc/${pid}/cmdline`, 'utf8'), new RegExp(`${join(binDir, 'ipwarden-standalone')}\0$`));
    holder.stdin.end();
    const r = await done;
    assert.deepEqual([r.pid, r.code, JSON.parse(r.stdout.toString())], [pid, 0, RESULT]);
    assert.match(readFileSync(join(sockDir, 'standalone-requests.log'), 'utf8'), /^\d+ ADD ok\n$/);
  });
});

describe('shim: the real daemon SIGSTOPped (issue 17): the standalone answers after the short deadline, and the woken daemon runs nothing', { skip: process.getuid?.() !== 0 ? 'needs root' : false }, () => {
  const ABANDONED = 'request abandoned: the client went away before sending its body (nothing was run)';
  /** A real daemon on a fresh shim copy's socket (the compiled 3 s acknowledgement deadline), continued and stopped in `after`. */
  async function realDaemon(): Promise<{ d: TestDaemon; shim: string; sockDir: string }> {
    const s = shim();
    const d = await startTestDaemon({ socket: s.socket });
    cleanups.push(async () => {
      d.kill('SIGCONT'); // a stopped process would never handle the SIGTERM of stop()
      await d.stop();
    });
    return { d, shim: s.shim, sockDir: s.sockDir };
  }
  /** The process state letter of `pid` (/proc/PID/stat: `T` = stopped). */
  const state = (pid: number): string => {
    const st = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return st.slice(st.lastIndexOf(')') + 2, st.lastIndexOf(')') + 3);
  };
  async function sigstop(d: TestDaemon): Promise<void> {
    d.kill('SIGSTOP');
    await waitFor('the daemon to be stopped', () => state(d.pid) === 'T', 12_000);
  }
  async function sigcont(d: TestDaemon, shimPath: string, abandonedBefore: number, fallbacks: number): Promise<void> {
    d.kill('SIGCONT');
    // Each fallback's connection waited in the backlog with its header and an end of stream.
    await waitFor(`${fallbacks} abandoned requests in the daemon's log`, () => d.logs.filter((l) => l.msg === ABANDONED).length >= abandonedBefore + fallbacks, 12_000);
    // One more request through the daemon, answered and logged (the log is written asynchronously,
    // in order): every line about the connections accepted before it is in by then.
    const versions = d.logs.filter((l) => l.msg === 'request served' && l['command'] === 'VERSION').length;
    const v = await run(shimPath, { PATH: '/usr/bin:/bin', CNI_COMMAND: 'VERSION' }, Buffer.from('{"cniVersion":"1.0.0"}'));
    assert.equal(v.code, 0);
    await waitFor('the VERSION request in the log', () => d.logs.filter((l) => l.msg === 'request served' && l['command'] === 'VERSION').length > versions, 12_000);
    const abandoned = d.logs.filter((l) => l.msg === ABANDONED);
    assert.equal(abandoned.length, abandonedBefore + fallbacks, 'one abandoned connection per fallback, no more');
    for (const l of abandoned) assert.equal(l['receivedBytes'], HEADER_BYTES);
  }
  const files = (dd: string): string[][] => readdirSync(join(dd, NET)).sort().map((n) => [n, readFileSync(join(dd, NET, n), 'utf8')]);
  const served = (d: TestDaemon, containerId: string): number => d.logs.filter((l) => l.msg === 'request served' && l['containerId'] === containerId).length;
  const counted = (sockDir: string): string[] => {
    const p = join(sockDir, 'standalone-requests.log');
    return existsSync(p) ? readFileSync(p, 'utf8').split('\n').filter((l) => l !== '').map((l) => l.replace(/^\d+ /, '')) : [];
  };
  const RESULT3 = { cniVersion: '1.0.0', ips: [{ address: '10.77.0.3/24', gateway: '10.77.0.1' }] };
  const measured: number[] = [];
  after(() => {
    if (measured.length > 0) process.stdout.write(`# shim fallback with a SIGSTOPped daemon: ${measured.map((m) => `${m.toFixed(0)} ms`).join(', ')}\n`);
  });
  /** Run through the shim, timing it (reported, never asserted). */
  async function timed(path: string, env: Record<string, string>, stdin: Uint8Array): Promise<Ran> {
    const t0 = performance.now();
    const r = await run(path, env, stdin);
    measured.push(performance.now() - t0);
    return r;
  }

  it('ADD, then DEL, each while the daemon is stopped: both answered by the standalone; woken, the daemon leaves exactly the standalone\'s files', async () => {
    const { d, shim: s, sockDir } = await realDaemon();
    const dd = temp('ipw-shim-data-');
    await sigstop(d);
    const add = await timed(s, runtimeEnv('ADD', 'c-stop'), config(dd));
    assert.deepEqual([add.code, add.stderr.toString(), JSON.parse(add.stdout.toString())], [0, '', RESULT]);
    assert.deepEqual(counted(sockDir), ['ADD ok']);
    assert.deepEqual(files(dd), [['10.77.0.2', 'c-stop\r\neth0'], ['last_reserved_ip.0', '10.77.0.2'], ['lock', '']]);
    await sigcont(d, s, 0, 1);
    assert.deepEqual(files(dd), [['10.77.0.2', 'c-stop\r\neth0'], ['last_reserved_ip.0', '10.77.0.2'], ['lock', '']], 'exactly one reservation, the right owner');
    assert.equal(served(d, 'c-stop'), 0, 'the woken daemon ran nothing for c-stop');
    // Awake, the daemon answers a repeated ADD itself: the same address (ADD is idempotent per owner).
    const again = await run(s, runtimeEnv('ADD', 'c-stop'), config(dd));
    assert.deepEqual([again.code, JSON.parse(again.stdout.toString())], [0, RESULT]);
    await d.waitForLog((l) => l.msg === 'request served' && l['containerId'] === 'c-stop');
    assert.deepEqual([served(d, 'c-stop'), counted(sockDir)], [1, ['ADD ok']]);

    await sigstop(d);
    const del = await timed(s, runtimeEnv('DEL', 'c-stop'), config(dd));
    assert.deepEqual([del.code, del.stdout.toString(), del.stderr.toString()], [0, '', '']);
    assert.deepEqual(counted(sockDir), ['ADD ok', 'DEL ok']);
    assert.deepEqual(files(dd), [['last_reserved_ip.0', '10.77.0.2'], ['lock', '']]);
    await sigcont(d, s, 1, 1);
    assert.deepEqual(files(dd), [['last_reserved_ip.0', '10.77.0.2'], ['lock', '']], 'no reservation after DEL');
    assert.equal(served(d, 'c-stop'), 1, 'the woken daemon ran nothing more for c-stop');
  });

  it('ADD a, DEL a, DEL b, ADD b of one node while the daemon is stopped: woken, it re-adds nothing and releases nothing', async () => {
    const { d, shim: s, sockDir } = await realDaemon();
    const dd = temp('ipw-shim-data-');
    await sigstop(d);
    const steps: Array<[string, string]> = [['ADD', 'a'], ['DEL', 'a'], ['DEL', 'b'], ['ADD', 'b']];
    const outs: Array<[number | null, string]> = [];
    for (const [command, id] of steps) {
      const r = await timed(s, runtimeEnv(command, id), config(dd));
      outs.push([r.code, r.stdout.toString() === '' ? '' : JSON.stringify(JSON.parse(r.stdout.toString()))]);
    }
    assert.deepEqual(outs, [[0, JSON.stringify(RESULT)], [0, ''], [0, ''], [0, JSON.stringify(RESULT3)]]);
    assert.deepEqual(counted(sockDir), ['ADD ok', 'DEL ok', 'DEL ok', 'ADD ok']);
    const standalone = [['10.77.0.3', 'b\r\neth0'], ['last_reserved_ip.0', '10.77.0.3'], ['lock', '']];
    assert.deepEqual(files(dd), standalone);
    // A daemon that ran the stale requests in order on waking would re-reserve an address for a
    // (deleted: a leak) and release b's (in use: the next pod would get it).
    await sigcont(d, s, 0, 4);
    assert.deepEqual(files(dd), standalone);
    assert.deepEqual([served(d, 'a'), served(d, 'b')], [0, 0]);
  });
});

describe('shim: the replayed stdin is the original, byte for byte', () => {
  // A recording stand-in for the standalone plugin, in a scratch bin dir with its own shim copy.
  const RECORDER = `#!/bin/sh
cat /proc/$$/environ > "$0.env"
readlink /proc/$$/fd/0 > "$0.fd0"
cat > "$0.stdin"
printf '{"recorded":true}'
`;
  let dir = '';
  before(() => {
    dir = temp('ipw-shim-rec-');
    writeFileSync(join(dir, 'ipwarden-standalone'), RECORDER, { mode: 0o755 });
  });
  const recorded = (): { env: string[]; fd0: string; stdin: Buffer } => ({
    env: readFileSync(join(dir, 'ipwarden-standalone.env'), 'utf8').split('\0').filter((e) => e !== '').sort(),
    fd0: readFileSync(join(dir, 'ipwarden-standalone.fd0'), 'utf8').trim(),
    stdin: readFileSync(join(dir, 'ipwarden-standalone.stdin')),
  });

  it('after the daemon closed: non-UTF-8 bytes through a memfd', async () => {
    const { shim: s, socket } = shim({ dir });
    await daemon(socket, { kind: 'close' });
    const stdin = Buffer.from([0x7b, 0x80, 0xff, 0x00, 0xfe, 0x0a, 0x7d]);
    const r = await run(s, runtimeEnv('DEL'), stdin);
    assert.deepEqual([r.code, r.stdout.toString()], [0, '{"recorded":true}']);
    const got = recorded();
    assert.deepEqual(got.stdin, stdin);
    assert.match(got.fd0, /^\/memfd:ipwarden-stdin/);
    assert.deepEqual(got.env, [...forwarded('DEL'), 'IPWARDEN_PATH=standalone-fallback', `IPWARDEN_SOCKET=${socket}`].sort());
  });

  it('over 16 MiB: what the shim read plus the unread rest', async () => {
    const { shim: s, socket } = shim({ dir });
    const d = await daemon(socket, { kind: 'silent' });
    const stdin = Buffer.alloc((16 << 20) + 12345);
    for (let i = 0; i < stdin.length; i++) stdin[i] = (i * 31 + (i >> 9)) & 0xff;
    const r = await run(s, runtimeEnv('ADD'), stdin);
    assert.equal(r.code, 0);
    const got = recorded();
    assert.equal(got.stdin.length, stdin.length);
    assert.ok(got.stdin.equals(stdin), 'same bytes');
    assert.equal((await d.connection(0)).received, 0);
  });

  it('no daemon: the untouched stdin (no replay needed)', async () => {
    const { shim: s } = shim({ dir });
    const stdin = Buffer.from([0x00, 0x01, 0xff]);
    const r = await run(s, runtimeEnv('CHECK'), stdin);
    assert.equal(r.code, 0);
    const got = recorded();
    assert.deepEqual(got.stdin, stdin);
    assert.match(got.fd0, /^(pipe|socket):\[/); // the spawner's own stdin (Node uses a socketpair), not a replay
  });

  it('without CNI_COMMAND (operator CLI use) the standalone gets argv, the whole env and stdin, and the daemon is not asked', async () => {
    const { shim: s, socket } = shim({ dir });
    const d = await daemon(socket, { kind: 'close' });
    const r = spawnSync(s, ['gc', '--dry-run'], { input: 'in', env: { PATH: '/usr/bin:/bin', FOO: 'bar' } });
    assert.equal(r.status, 0);
    assert.deepEqual(recorded().env, ['FOO=bar', 'PATH=/usr/bin:/bin']);
    assert.equal(recorded().stdin.toString(), 'in');
    assert.equal(d.connections.length, 0);
  });

  it('without CNI_COMMAND and without arguments (the plugin typed alone) the standalone gets IPWARDEN_PATH=plugin-about in place of the caller\'s, and the daemon is not asked', async () => {
    const { shim: s, socket } = shim({ dir });
    const d = await daemon(socket, { kind: 'close' });
    const r = spawnSync(s, [], { input: 'in', env: { PATH: '/usr/bin:/bin', FOO: 'bar', IPWARDEN_PATH: 'standalone-fallback' } });
    assert.equal(r.status, 0);
    assert.deepEqual(recorded().env, ['FOO=bar', 'IPWARDEN_PATH=plugin-about', 'PATH=/usr/bin:/bin']);
    assert.equal(d.connections.length, 0);
  });

  it('no standalone beside the shim: a CNI error document as skel prints one (indented, no trailing newline), exit status 1', async () => {
    const lone = temp('ipw-shim-lone-');
    const { shim: s } = shim({ dir: lone });
    const r = await run(s, runtimeEnv('ADD'), Buffer.from('{}'));
    assert.equal(r.code, 1);
    assert.equal(r.stdout.toString(), '{\n    "cniVersion": "1.0.0",\n    "code": 999,\n    "msg": "ipwarden: cannot run the standalone plugin: No such file or directory"\n}');
  });
});

describe('shim binary', () => {
  /** The program header types of an ELF64 little-endian file. */
  function programHeaderTypes(path: string): number[] {
    const b = readFileSync(path);
    assert.deepEqual([b.subarray(0, 4).toString('latin1'), b[4], b[5]], ['\x7fELF', 2, 1], 'ELF64 little-endian');
    const phoff = Number(b.readBigUInt64LE(0x20));
    const phentsize = b.readUInt16LE(0x36);
    const phnum = b.readUInt16LE(0x38);
    return Array.from({ length: phnum }, (_, i) => b.readUInt32LE(phoff + i * phentsize));
  }

  it('is statically linked: no PT_INTERP, no PT_DYNAMIC', () => {
    for (const path of [join(ROOT, 'dist/ipwarden-shim'), bin]) {
      const types = programHeaderTypes(path);
      assert.ok(types.includes(1), 'has PT_LOAD');
      assert.equal(types.includes(3), false, `${path} has PT_INTERP`);
      assert.equal(types.includes(2), false, `${path} has PT_DYNAMIC`);
    }
    const f = spawnSync('file', ['-b', bin], { encoding: 'utf8' });
    if (f.status === 0) assert.match(f.stdout, /statically linked/);
  });

  it('the installed shim differs from the built one only in the socket field, which holds the test socket', () => {
    const built = readFileSync(join(ROOT, 'dist/ipwarden-shim'));
    const inst = readFileSync(bin);
    assert.equal(inst.length, built.length);
    const at = built.indexOf(SOCKET_FIELD.marker, 0, 'latin1');
    const diff = [...inst.keys()].filter((i) => inst[i] !== built[i]);
    assert.ok(diff.length > 0 && diff.every((i) => i >= at + SOCKET_FIELD.marker.length && i < at + SOCKET_FIELD.bytes));
    assert.deepEqual(readShimFields(inst), { socket: pluginSocket(), timeout: '150', ackTimeout: '3' });
    assert.deepEqual(readShimFields(built), { socket: '/run/ipwarden/plugin.sock', timeout: '150', ackTimeout: '3' });
  });
});

describe('install-cni', () => {
  const cli = (args: string[]) => spawnSync(process.execPath, [join(ROOT, 'dist/ipwarden.cjs'), 'install-cni', ...args], { encoding: 'utf8' });

  it('--socket must be absolute and at most 107 bytes; nothing is written otherwise', () => {
    const base = temp('ipw-shim-inst-');
    const dest = join(base, 'bin');
    let r = cli(['--dest', dest, '--socket', 'run/x.sock']);
    assert.deepEqual([r.status, r.stdout, r.stderr], [2, '', 'ipwarden: install-cni: --socket must be an absolute path (got "run/x.sock")\n']);
    const long = `/${'s'.repeat(107)}`;
    r = cli(['--dest', dest, '--socket', long]);
    assert.deepEqual([r.status, r.stdout, r.stderr], [2, '', 'ipwarden: install-cni: --socket is 108 bytes long, at most 107 fit in a unix socket address\n']);
    assert.equal(existsSync(dest), false);
    assert.throws(() => validateSocketPath('/run/a\0b'), (e: unknown) => e instanceof UsageError && e.message === 'install-cni: --socket must not contain a NUL byte');
  });

  it('a 107-byte --socket is patched in, and the layout is shim + standalone + binding + namespace helper, each 0755', () => {
    const base = temp('ipw-shim-inst-');
    const dest = join(base, 'bin');
    const socket = `${base}/${'s'.repeat(107 - base.length - 1)}`;
    assert.equal(Buffer.byteLength(socket), 107);
    const r = cli(['--dest', dest, '--socket', socket]);
    assert.deepEqual([r.status, r.stderr], [0, '']);
    assert.equal(
      r.stdout,
      `installed ${join(dest, 'ipwarden-flock.node')} (flock binding)\n` +
        `installed ${join(dest, 'ipwarden-netns')} (namespace helper)\n` +
        `installed ${join(dest, 'ipwarden-standalone')} (ipwarden 0.1.0, Node.js ${process.version}, ${statSync(join(dest, 'ipwarden-standalone')).size} bytes)\n` +
        `installed ${join(dest, 'ipwarden')} (exec shim, protocol v2, socket ${socket})\n`,
    );
    assert.deepEqual(readdirSync(dest).sort(), ['ipwarden', 'ipwarden-flock.node', 'ipwarden-netns', 'ipwarden-standalone']);
    for (const n of readdirSync(dest)) assert.equal(statSync(join(dest, n)).mode & 0o777, 0o755, n);
    assert.equal(readShimFields(readFileSync(join(dest, 'ipwarden'))).socket, socket);
  });

  it('a killed install\'s temporaries are removed by the next install (exact pattern, regular files only); a symlink, a foreign name and the node name are left alone', () => {
    const base = temp('ipw-shim-stale-');
    const dest = join(base, 'bin');
    mkdirSync(join(dest, 'ipwarden.d'), { recursive: true });
    const stale = ['ipwarden-standalone.tmp-4242-0123456789abcdef', 'ipwarden.tmp-1-fedcba9876543210', 'ipwarden-netns.tmp-77-00000000000000aa'];
    for (const n of stale) writeFileSync(join(dest, n), Buffer.alloc(4096));
    writeFileSync(join(dest, 'ipwarden.d', 'node-name.tmp-9-0123456789abcdef'), 'half');
    const victim = join(base, 'victim');
    writeFileSync(victim, 'precious');
    symlinkSync(victim, join(dest, 'ipwarden-flock.node.tmp-5-0123456789abcdef'));
    const keep = ['ipwarden-standalone.tmp-notours', 'bridge.tmp-1-0123456789abcdef', 'ipwarden-standalone.tmp-1-0123456789ABCDEF'];
    for (const n of keep) writeFileSync(join(dest, n), 'x');
    const r = cli(['--dest', dest]);
    assert.equal(r.status, 0, r.stderr);
    const removed = r.stdout.split('\n').filter((l) => l.startsWith('removed '));
    assert.deepEqual(removed, [
      `removed ${join(dest, 'ipwarden-netns.tmp-77-00000000000000aa')} (a temporary a killed install left, 4096 bytes)`,
      `removed ${join(dest, 'ipwarden-standalone.tmp-4242-0123456789abcdef')} (a temporary a killed install left, 4096 bytes)`,
      `removed ${join(dest, 'ipwarden.tmp-1-fedcba9876543210')} (a temporary a killed install left, 4096 bytes)`,
      `removed ${join(dest, 'ipwarden.d', 'node-name.tmp-9-0123456789abcdef')} (a temporary a killed install left, 4 bytes)`,
    ]);
    assert.deepEqual(readdirSync(dest).sort(), ['.ipwarden-install.lock', 'ipwarden', 'ipwarden-flock.node', 'ipwarden-flock.node.tmp-5-0123456789abcdef', 'ipwarden-netns', 'ipwarden-standalone', ...keep, 'ipwarden.d'].sort());
    assert.deepEqual(readdirSync(join(dest, 'ipwarden.d')), []);
    assert.equal(readFileSync(victim, 'utf8'), 'precious');
    assert.ok(lstatSync(join(dest, 'ipwarden-flock.node.tmp-5-0123456789abcdef')).isSymbolicLink());
  });

  it('only into a destination nobody but root could change: else refused with the name that breaks the rule, nothing written, no symlink of another user followed', { skip: process.getuid?.() !== 0 ? 'needs root (chown)' : false }, () => {
    const base = temp('ipw-shim-trust-');
    const refused = (dest: string, why: string): void => {
      const r = cli(['--dest', dest, '--node-name', 'worker-1']);
      assert.deepEqual([r.status, r.stdout, r.stderr], [2, '', `ipwarden: install-cni: ${why}: refusing to install there (--dest ${dest})\n`]);
    };
    // World-writable (a tmpfs root, 1777 too), and owned by another user.
    const ww = join(base, 'ww');
    mkdirSync(ww);
    chmodSync(ww, 0o1777);
    refused(ww, `${ww} is writable by group or others (mode 1777)`);
    const theirs = join(base, 'theirs');
    mkdirSync(theirs);
    chownSync(theirs, 65534, 65534);
    refused(theirs, `${theirs} is owned by uid 65534`);
    // A missing DIR under their directory: not made.
    refused(join(theirs, 'bin'), `${theirs} is owned by uid 65534`);
    // Their symlink in a trusted directory, to a trusted directory: not followed.
    const real = join(base, 'real');
    mkdirSync(real);
    const link = join(base, 'link');
    symlinkSync(real, link);
    const theirLink = join(base, 'their-link');
    symlinkSync(real, theirLink);
    spawnSync('chown', ['-h', '65534:65534', theirLink]);
    refused(theirLink, `${theirLink} is a symlink owned by uid 65534 (not followed)`);
    // Root's symlink to their directory: followed, then refused there.
    const toTheirs = join(base, 'to-theirs');
    symlinkSync(theirs, toTheirs);
    refused(toTheirs, `${theirs} is owned by uid 65534`);
    // A dangling one: says which name is missing.
    const dangling = join(base, 'dangling');
    symlinkSync(join(base, 'nowhere', 'bin'), dangling);
    refused(dangling, `${join(base, 'nowhere')} does not exist`);
    assert.deepEqual([readdirSync(ww), readdirSync(theirs), readdirSync(real)], [[], [], []]);
    // Root's symlink to a trusted directory: followed; the lines name the real path.
    const r = cli(['--dest', link]);
    assert.deepEqual([r.status, r.stderr], [0, '']);
    assert.equal(r.stdout.split('\n')[0], `installed ${join(real, 'ipwarden-flock.node')} (flock binding)`);
    assert.deepEqual(readdirSync(real).sort(), ['.ipwarden-install.lock', 'ipwarden', 'ipwarden-flock.node', 'ipwarden-netns', 'ipwarden-standalone']);
    // A symlink at the lock file's name is not opened (it was, with O_CREAT: a file made where it pointed).
    const lockDir = join(base, 'lockdir');
    mkdirSync(lockDir);
    symlinkSync(join(base, 'made-by-lock'), join(lockDir, '.ipwarden-install.lock'));
    const l = cli(['--dest', lockDir]);
    assert.deepEqual([l.status, l.stdout, l.stderr], [2, '', `ipwarden: install-cni: ${join(lockDir, '.ipwarden-install.lock')} is not a regular file (a symlink is not followed): refusing to lock it\n`]);
    assert.equal(existsSync(join(base, 'made-by-lock')), false);
  });

  it('a SIGKILLed install leaves a temporary; the next install removes it', async () => {
    const base = temp('ipw-shim-kill-');
    const dest = join(base, 'bin');
    mkdirSync(dest);
    const child = spawn(process.execPath, [join(ROOT, 'dist/ipwarden.cjs'), 'install-cni', '--dest', dest], { stdio: 'ignore' });
    // Kill it once its standalone temporary exists (the ~99 MB copy), whatever the machine's speed.
    const tmpOf = (): string[] => readdirSync(dest).filter((n) => /^ipwarden-standalone\.tmp-\d+-[0-9a-f]{16}$/.test(n));
    const exited = new Promise<void>((res) => child.once('exit', () => res()));
    let ended = false;
    void exited.then(() => (ended = true));
    while (tmpOf().length === 0 && !ended) await new Promise((res) => setTimeout(res, 2));
    child.kill('SIGKILL');
    await exited;
    const left = tmpOf();
    if (left.length === 0) {
      // The install finished before it could be killed: nothing to clean, nothing to check here.
      assert.ok(existsSync(join(dest, 'ipwarden')), 'an install that ended wrote the shim');
      return;
    }
    const r = cli(['--dest', dest]);
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stdout, new RegExp(`^removed ${join(dest, left[0] as string).replace(/[.]/g, '\\.')} \\(a temporary a killed install left, \\d+ bytes\\)$`, 'm'));
    assert.deepEqual(tmpOf(), []);
  });

  it('atomic write: a temporary name is never a guessable one, a planted file or link is neither followed nor removed, and the file is replaced by rename', () => {
    const dir = temp('ipw-shim-atomic-');
    const victim = join(dir, 'victim');
    writeFileSync(victim, 'precious');
    const target = join(dir, 'ipwarden');
    writeFileSync(target, 'old');
    const oldIno = statSync(target).ino;
    // The former temporary name (<path>.tmp-<pid>), as a link another user or installer planted.
    symlinkSync(victim, `${target}.tmp-${process.pid}`);
    const seen: string[] = [];
    atomicWrite(target, Buffer.from('new'), 0o755, (tmp) => {
      seen.push(tmp);
      assert.equal(readFileSync(tmp, 'utf8'), 'new', 'verify sees the complete file before the rename');
      assert.equal(readFileSync(target, 'utf8'), 'old');
    });
    assert.equal(seen.length, 1);
    assert.match(seen[0] as string, new RegExp(`^${target}\\.tmp-${process.pid}-[0-9a-f]{16}$`));
    assert.equal(readFileSync(victim, 'utf8'), 'precious');
    assert.equal(readFileSync(target, 'utf8'), 'new');
    assert.notEqual(statSync(target).ino, oldIno, 'a new inode: renamed into place, not rewritten');
    assert.equal(statSync(target).mode & 0o777, 0o755);
    assert.deepEqual(readdirSync(dir).sort(), ['ipwarden', `ipwarden.tmp-${process.pid}`, 'victim']);
  });

  it('atomic write: a verify that throws keeps the old file and removes the temporary one', () => {
    const dir = temp('ipw-shim-atomic-');
    const target = join(dir, 'ipwarden');
    writeFileSync(target, 'old');
    assert.throws(() => atomicWrite(target, Buffer.from('bad'), 0o755, () => { throw new Error('refused'); }), /refused/);
    assert.equal(readFileSync(target, 'utf8'), 'old');
    assert.deepEqual(readdirSync(dir), ['ipwarden']);
  });

  it('patchShim refuses a bad timeout and a binary without the marker', () => {
    assert.throws(() => patchShim(readFileSync(bin), { timeoutSeconds: 0 }), UsageError);
    assert.throws(() => patchShim(readFileSync(bin), { ackTimeoutSeconds: 0.0001 }), (e: unknown) => e instanceof UsageError && e.message === 'shim acknowledgement timeout must be 0.001..86400 seconds with at most 3 decimals (got 0.0001)');
    assert.throws(() => patchShim(Buffer.from('no marker here'), { socket: '/x.sock' }), /exactly once/);
  });
});

describe('the fallback counting line (standalone-requests.log beside the socket)', () => {
  const env = (sock: string, command = 'ADD') => ({ IPWARDEN_PATH: 'standalone-fallback', IPWARDEN_SOCKET: sock, CNI_COMMAND: command });
  const T = 1_700_000_000_123;

  it('appends `<unix seconds> <COMMAND> <ok|error>` in a root-owned 0700 directory, file mode 0600', () => {
    const dir = temp('ipw-shim-count-');
    assert.equal(countFallbackRequest(env(join(dir, 'plugin.sock')), 0, T), true);
    assert.equal(countFallbackRequest(env(join(dir, 'plugin.sock'), 'DEL'), 1, T + 1000), true);
    assert.equal(countFallbackRequest(env(join(dir, 'plugin.sock'), 'BOGUS\nX'), 1, T), true);
    assert.equal(readFileSync(join(dir, 'standalone-requests.log'), 'utf8'), '1700000000 ADD ok\n1700000001 DEL error\n1700000000 OTHER error\n');
    assert.equal(statSync(join(dir, 'standalone-requests.log')).mode & 0o777, 0o600);
    assert.equal(fallbackLine(undefined, 0, T), '1700000000 OTHER ok\n');
  });

  it('writes nothing (and does not throw) for an unsafe or odd place', () => {
    const base = temp('ipw-shim-count-');
    const groupWritable = join(base, 'gw');
    mkdirSync(groupWritable);
    chmodSync(groupWritable, 0o770);
    const notRoot = join(base, 'nobody');
    mkdirSync(notRoot, { mode: 0o700 });
    chownSync(notRoot, 65534, 65534);
    const good = join(base, 'good');
    mkdirSync(good, { mode: 0o700 });
    const linkedDir = join(base, 'linked');
    symlinkSync(good, linkedDir);
    const withLinkedLog = join(base, 'loglink');
    mkdirSync(withLinkedLog, { mode: 0o700 });
    const victim = join(base, 'victim');
    writeFileSync(victim, 'precious');
    symlinkSync(victim, join(withLinkedLog, 'standalone-requests.log'));
    const withFifo = join(base, 'fifo');
    mkdirSync(withFifo, { mode: 0o700 });
    assert.equal(spawnSync('mkfifo', [join(withFifo, 'standalone-requests.log')]).status, 0);
    for (const sock of [
      join(groupWritable, 'plugin.sock'),
      join(notRoot, 'plugin.sock'),
      join(linkedDir, 'plugin.sock'),
      join(withLinkedLog, 'plugin.sock'),
      join(withFifo, 'plugin.sock'),
      `${good}/../good/plugin.sock`,
      'relative/plugin.sock',
      join(base, 'missing', 'plugin.sock'),
    ]) {
      assert.equal(countFallbackRequest(env(sock), 0, T), false, sock);
    }
    assert.equal(countFallbackRequest({ IPWARDEN_PATH: 'standalone-fallback' }, 0, T), false);
    assert.deepEqual(readdirSync(good), []);
    assert.deepEqual(readdirSync(groupWritable), []);
    assert.deepEqual(readdirSync(notRoot), []);
    assert.equal(readFileSync(victim, 'utf8'), 'precious');
  });
});
