/**
 * Black-box helpers: run a CNI plugin executable (the installed ipwarden or upstream host-local)
 * the way a runtime does — `CNI_*` env, config on stdin — and capture {exitCode, stdout, stderr}.
 */
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import { closeSync, existsSync, mkdtempSync, openSync, readdirSync, readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { makeNoNodeNamespace, type NoNodeNamespace } from './no-node.ts';
import { sigkillAndWaitSync } from './kill-sync.ts';
import { removeAtExit } from './exit-cleanup.ts';

/** Upstream host-local from Debian's containernetworking-plugins. */
export const HOST_LOCAL = '/usr/lib/cni/host-local';

/** Repository root. */
export const ROOT = resolve(import.meta.dirname, '../..');

/** One plugin invocation. */
export interface Invocation {
  command: string;
  containerId?: string;
  ifname?: string;
  netns?: string;
  args?: string;
  path?: string;
  /** The config (object is JSON-encoded). */
  stdin: string | object;
  /** Extra env (replaces the defaults above). */
  env?: Record<string, string>;
}

/** What came back. `json` is stdout parsed, or null when stdout was empty. */
export interface Outcome {
  exitCode: number;
  stdout: string;
  stderr: string;
  json: Record<string, unknown> | null;
}

/** The environment a runtime gives the plugin for `inv` (PATH, the CNI variables, then `inv.env`). */
export function envFor(inv: Invocation): Record<string, string> {
  const env: Record<string, string> = { PATH: '/usr/bin:/bin', CNI_COMMAND: inv.command };
  if (inv.containerId !== undefined) env['CNI_CONTAINERID'] = inv.containerId;
  if (inv.ifname !== undefined) env['CNI_IFNAME'] = inv.ifname;
  env['CNI_NETNS'] = inv.netns ?? (inv.command === 'ADD' || inv.command === 'CHECK' ? '/var/run/netns/ipwarden-test' : '');
  if (inv.args !== undefined) env['CNI_ARGS'] = inv.args;
  env['CNI_PATH'] = inv.path ?? '/usr/lib/cni';
  return { ...env, ...(inv.env ?? {}) };
}

function outcome(status: number | null, stdout: string, stderr: string): Outcome {
  let json: Record<string, unknown> | null = null;
  if (stdout.trim() !== '') {
    try {
      json = JSON.parse(stdout) as Record<string, unknown>;
    } catch {
      json = null;
    }
  }
  return { exitCode: status ?? -1, stdout, stderr, json };
}

/**
 * The argv that execs plugin `bin` as a runtime would: `[bin]`, or — in the no-Node pass
 * ({@link noNodeMode}) for an executable this process installed — `bin` run inside the mount
 * namespace that has no Node.js, perl or shell (test/helpers/no-node.ts).
 */
export function pluginArgv(bin: string): string[] {
  if (noNode !== null && installed !== null && bin.startsWith(`${dirname(installed.bin)}/`)) return noNode.argv(bin);
  return [bin];
}

/** Run `bin` synchronously. */
export function runCni(bin: string, inv: Invocation): Outcome {
  const input = typeof inv.stdin === 'string' ? inv.stdin : JSON.stringify(inv.stdin);
  const argv = pluginArgv(bin);
  const r = spawnSync(argv[0] as string, argv.slice(1), { input, env: envFor(inv), encoding: 'utf8', timeout: 60_000 });
  if (r.error) throw r.error;
  return outcome(r.status, r.stdout, r.stderr);
}

/** Run `bin` asynchronously (for concurrency tests). */
export function runCniAsync(bin: string, inv: Invocation): Promise<Outcome> {
  const input = typeof inv.stdin === 'string' ? inv.stdin : JSON.stringify(inv.stdin);
  return new Promise((res, rej) => {
    const argv = pluginArgv(bin);
    const p = spawn(argv[0] as string, argv.slice(1), { env: envFor(inv) });
    let out = '';
    let err = '';
    p.stdout.on('data', (c: Buffer) => (out += c.toString('utf8')));
    p.stderr.on('data', (c: Buffer) => (err += c.toString('utf8')));
    p.on('error', rej);
    p.on('close', (code) => res(outcome(code, out, err)));
    p.stdin.end(input);
  });
}

/**
 * A temp directory removed by the returned cleanup function — or, if that never runs (a run
 * interrupted before the test's `after`), at the exit of the process (test/helpers/exit-cleanup.ts).
 */
export function tempDir(prefix = 'ipwarden-test-'): { dir: string; cleanup: () => void } {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  removeAtExit(dir);
  return { dir, cleanup: () => rmSync(dir, { recursive: true, force: true }) };
}

let installed: { bin: string; standalone: string; socket: string } | null = null;
let noNode: NoNodeNamespace | null = null;

/**
 * Install the built plugin (dist/) with `ipwarden install-cni --socket <temp dir>/plugin.sock`
 * into a temp bin dir, once per process, and return the path of the installed shim
 * (`DIR/ipwarden`, what a runtime execs). The socket's directory is a per-process temp dir (mode
 * 0700) in which nobody listens unless a test starts a server on {@link pluginSocket}: so every
 * request goes through the shim's fallback to `DIR/ipwarden-standalone`, which writes its
 * counting line to `standalone-requests.log` in that directory. Both dirs are removed at exit.
 * Requires `npm run build` to have run.
 */
export function installedPlugin(): string {
  return install().bin;
}

/** The socket path the installed shim connects to (see {@link installedPlugin}). */
export function pluginSocket(): string {
  return install().socket;
}

/**
 * The installed standalone Node plugin (`DIR/ipwarden-standalone`), for tests that must pin it:
 * exec'd directly it never looks at the socket.
 */
export function standalonePlugin(): string {
  return install().standalone;
}

/**
 * True when the suites run with the daemon up (`IPWARDEN_TEST_DAEMON=1`, set by
 * scripts/run-tests.mjs for its second pass over the black-box and interop suites): then
 * {@link installedPlugin} also starts `ipwarden daemon` on {@link pluginSocket}, so every request
 * through the shim is answered by the daemon instead of the standalone fallback.
 */
export function daemonMode(): boolean {
  return process.env['IPWARDEN_TEST_DAEMON'] === '1';
}

/**
 * True in the no-Node pass (`IPWARDEN_TEST_NO_NODE=1`, scripts/run-tests.mjs, issue 10): then every
 * exec of the installed plugin through {@link runCni}/{@link runCniAsync}/{@link pluginArgv} happens
 * in a mount namespace whose /usr holds only the libraries the installed binaries link — no
 * Node.js, perl, sh or nsenter — as on a Kubernetes node without Node.js.
 */
export function noNodeMode(): boolean {
  return process.env['IPWARDEN_TEST_NO_NODE'] === '1';
}

/** Programs that must not exist inside the no-Node namespace (checked when it is made). */
export const ABSENT_IN_NO_NODE = ['/usr/bin/node', '/usr/local/bin/node', '/usr/bin/perl', '/bin/sh', '/usr/bin/nsenter', '/usr/sbin/ip'] as const;

/**
 * Make the no-Node namespace for the installed files in `dir` and prove what it lacks: each of
 * {@link ABSENT_IN_NO_NODE} fails to exec inside it with ENOENT (nsenter exits 127), while the
 * standalone answers CNI VERSION there. Throws otherwise.
 */
function startNoNode(dir: string): NoNodeNamespace {
  const files = ['ipwarden', 'ipwarden-standalone', 'ipwarden-flock.node', 'ipwarden-netns'].map((f) => join(dir, f));
  const ns = makeNoNodeNamespace(files);
  try {
    for (const prog of ABSENT_IN_NO_NODE) {
      const argv = ns.argv(prog);
      const r = spawnSync(argv[0] as string, argv.slice(1), { encoding: 'utf8', input: '' });
      if (r.status !== 127 || !/No such file or directory/.test(r.stderr)) {
        throw new Error(`the no-Node namespace still runs ${prog} (status ${r.status}: ${r.stderr.trim()})`);
      }
    }
    const argv = ns.argv(join(dir, 'ipwarden-standalone'));
    const v = spawnSync(argv[0] as string, argv.slice(1), { encoding: 'utf8', input: '{"cniVersion":"1.0.0"}', env: { CNI_COMMAND: 'VERSION' } });
    if (v.status !== 0 || !v.stdout.includes('supportedVersions')) throw new Error(`the standalone does not run in the no-Node namespace: ${v.stdout}${v.stderr}`);
    return ns;
  } catch (e) {
    ns.cleanup();
    throw e;
  }
}

function install(): { bin: string; standalone: string; socket: string } {
  if (installed !== null && existsSync(installed.bin)) return installed;
  const bundle = join(ROOT, 'dist/ipwarden.cjs');
  if (!existsSync(bundle)) throw new Error(`no ${bundle}: run "npm run build" first`);
  const { dir } = tempDir('ipwarden-bin-');
  const sockDir = tempDir('ipwarden-sock-'); // mkdtemp: mode 0700, owned by the user running the tests
  const socket = join(sockDir.dir, 'plugin.sock');
  execFileSync(process.execPath, [bundle, 'install-cni', '--dest', dir, '--socket', socket], { stdio: 'pipe' });
  installed = { bin: join(dir, 'ipwarden'), standalone: join(dir, 'ipwarden-standalone'), socket };
  const stopDaemon = daemonMode() ? startSuiteDaemon(bundle, socket, sockDir.dir) : () => undefined;
  if (noNodeMode()) noNode = startNoNode(dir);
  process.on('exit', () => {
    stopDaemon();
    noNode?.cleanup();
    rmSync(dir, { recursive: true, force: true });
    sockDir.cleanup();
  });
  return installed;
}

/**
 * Start `ipwarden daemon` on `socket` for the whole test process (daemon mode) — the built
 * single executable `dist/ipwarden-standalone daemon`, as the image runs it — with an empty
 * data dir and CNI config dir of its own (its loop touches nothing of the tests'), and wait —
 * synchronously, bounded — until it listens. Returns a function that SIGKILLs it by pid and waits
 * until it is dead.
 * Throws when it exits or does not listen within 60 s (its log is in the error).
 */
function startSuiteDaemon(bundle: string, socket: string, dir: string): () => void {
  const logPath = join(dir, 'daemon.log');
  const logFd = openSync(logPath, 'w', 0o600);
  // setpriv --pdeathsig: the daemon is killed when this test process dies, also by a signal
  // (a test runner's timeout), when no 'exit' handler runs.
  const child = spawn(
    '/usr/bin/setpriv',
    ['--pdeathsig', 'KILL', '--', join(dirname(bundle), 'ipwarden-standalone'), 'daemon', '--socket', socket, '--data-dir', join(dir, 'data'), '--cni-conf-dir', join(dir, 'net.d'), '--metrics-address', '127.0.0.1:0', '--log-level', 'warn'],
    { env: { PATH: '/usr/bin:/bin' }, stdio: ['ignore', 'ignore', logFd] },
  );
  closeSync(logFd);
  let exited: string | null = null;
  child.on('exit', (code, sig) => (exited = `code ${code} signal ${sig}`));
  const pid = child.pid;
  const sleeper = new Int32Array(new SharedArrayBuffer(4));
  // The socket file appears when the daemon's server is bound and listening (one listen() call).
  for (let i = 0; !existsSync(socket); i++) {
    if (i > 6000 || pid === undefined || !alive(pid)) {
      throw new Error(`the suite's daemon did not listen on ${socket}: ${readFileSync(logPath, 'utf8')}`);
    }
    Atomics.wait(sleeper, 0, 0, 10);
  }
  child.unref();
  // Dead (not just signalled) when this returns: the caller removes its directories next.
  return () => {
    if (exited === null && pid !== undefined) sigkillAndWaitSync(pid);
  };
}

/** True while process `pid` exists (signal 0). */
export function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/**
 * The raw state of a network directory: file name → content (utf8), plus modes for reservation
 * files. Sub-directories are listed as `name/` → '<dir>'.
 */
export function snapshotDir(dir: string): Record<string, string> {
  const out: Record<string, string> = {};
  if (!existsSync(dir)) return out;
  for (const name of readdirSync(dir).sort()) {
    const p = join(dir, name);
    const st = statSync(p);
    out[st.isDirectory() ? `${name}/` : name] = st.isDirectory() ? '<dir>' : readFileSync(p, 'utf8');
  }
  return out;
}

/** True when upstream host-local is installed. */
export function haveHostLocal(): boolean {
  return existsSync(HOST_LOCAL);
}

/**
 * Skip reason for suites that need `what`: in CI a missing prerequisite is a failure (the suite
 * throws), locally it is a skip with the reason.
 */
export function requireOrSkip(ok: boolean, what: string): string | false {
  if (ok) return false;
  if (process.env['CI'] === 'true') throw new Error(`CI is missing a test prerequisite: ${what}`);
  return `needs ${what}`;
}
