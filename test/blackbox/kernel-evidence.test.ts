/**
 * readKernelEvidence against the real kernel. Needs root and iproute2 (`ip`); without them: fails
 * when CI=true, else skips with the reason.
 *
 * Builds, with names prefixed `ke` (unique per test process):
 * - `ke-<pid>-a`, a namespace with a process inside (`ip netns exec … sleep`): bridge kebr0 up with
 *   10.250.0.10/24 and fd00:6b65::10/64 (nodad); bridge kebr1 with 10.250.1.10/24 and
 *   fd00:6b65:1::10/64, then set down (the kernel keeps the IPv4 address, deletes the IPv6 one);
 * - `ke-<pid>-b`, pinned only (no process): veth kev0/kev1 with 10.250.2.20/24 and
 *   fd00:6b65:2::20/64 on kev0, plus 10.250.0.10/24 on kev1 (the same address as in -a);
 * - a `sleep` with `CNI_COMMAND=ADD CNI_CONTAINERID=… CNI_IFNAME=eth0` in its environment;
 * - a private netns directory holding a bind mount of -b's file and a plain file.
 * Everything is removed in `after` (processes killed by pid, mounts unmounted, namespaces deleted).
 */
import assert from 'node:assert/strict';
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readlinkSync, rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { buildSync } from 'esbuild';
import { requireOrSkip, ROOT } from '../helpers/cni.ts';
import { atExit } from '../helpers/exit-cleanup.ts';
import { sigkillAndWaitSync } from '../helpers/kill-sync.ts';
import { holdersOf, inFlightFor, isInUse, readKernelEvidence } from '../../src/node/kernel-evidence.ts';
import type { KernelEvidence } from '../../src/node/kernel-evidence.ts';

const isRoot = process.getuid?.() === 0;
const haveIp = spawnSync('ip', ['-V'], { stdio: 'ignore' }).status === 0;
const haveSetpriv = spawnSync('setpriv', ['--version'], { stdio: 'ignore' }).status === 0;

const NS_A = `ke-${process.pid}-a`;
const NS_B = `ke-${process.pid}-b`;
const CONTAINER_ID = `ke-abc-${process.pid}`;

function ip(...args: string[]): void {
  execFileSync('ip', args, { stdio: ['ignore', 'ignore', 'pipe'] });
}

/** `code` bundled (esbuild) into a new world-readable temp dir; returns the file. Removed at exit. */
function bundleForNobody(code: string): string {
  const dir = mkdtempSync(join(tmpdir(), 'ke-nobody-'));
  process.on('exit', () => rmSync(dir, { recursive: true, force: true }));
  chmodSync(dir, 0o755);
  const out = join(dir, 'read.mjs');
  buildSync({ stdin: { contents: code, resolveDir: ROOT, loader: 'ts' }, bundle: true, platform: 'node', format: 'esm', outfile: out, logLevel: 'silent' });
  chmodSync(out, 0o644);
  return out;
}

/** Run the reader in a child (optionally as nobody, or with another PATH) and return its evidence as JSON data. */
function readInChild(opts: { asNobody?: boolean; env?: NodeJS.ProcessEnv; netnsDirs?: string[] }): { incomplete: string | null; addresses: Record<string, unknown[]> } {
  const code = `
    import { readKernelEvidence } from ${JSON.stringify(join(ROOT, 'src/node/kernel-evidence.ts'))};
    const ev = readKernelEvidence(${opts.netnsDirs === undefined ? '' : JSON.stringify({ netnsDirs: opts.netnsDirs })});
    process.stdout.write(JSON.stringify({ incomplete: ev.incomplete, addresses: Object.fromEntries(ev.addresses) }));`;
  // As nobody the checkout may not be readable (a clone in a 0700 directory): run a bundle of the
  // reader from a world-readable directory instead of the sources through tsx.
  const node = opts.asNobody === true ? [process.execPath, bundleForNobody(code)] : [process.execPath, '--import', 'tsx', '--input-type=module', '-e', code];
  const argv = opts.asNobody === true ? ['setpriv', '--reuid', '65534', '--regid', '65534', '--clear-groups', ...node] : node;
  const r = spawnSync(argv[0] as string, argv.slice(1), { cwd: opts.asNobody === true ? '/' : ROOT, env: opts.env ?? process.env, encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  return JSON.parse(r.stdout) as { incomplete: string | null; addresses: Record<string, unknown[]> };
}

describe('readKernelEvidence on the real kernel', () => {
  const skip = requireOrSkip(isRoot && haveIp, 'root and iproute2 (ip)');
  const children: ChildProcess[] = [];
  const tmp = mkdtempSync(join(tmpdir(), 'ke-bb-'));
  const pinDir = join(tmp, 'netns');
  const pinFile = join(pinDir, 'ke-b');
  let mounted = false;
  let holder: ChildProcess | null = null;
  let cni: ChildProcess | null = null;
  let ev: KernelEvidence | null = null;
  let nsA = '';
  let nsB = '';

  const started = (c: ChildProcess): Promise<void> =>
    new Promise((resolve, reject) => {
      c.once('spawn', () => resolve());
      c.once('error', reject);
    });

  before(async () => {
    if (skip) return;
    ip('netns', 'add', NS_A);
    ip('netns', 'add', NS_B);
    ip('-n', NS_A, 'link', 'add', 'kebr0', 'type', 'bridge');
    ip('-n', NS_A, 'link', 'set', 'kebr0', 'up');
    ip('-n', NS_A, 'addr', 'add', '10.250.0.10/24', 'dev', 'kebr0');
    ip('-n', NS_A, 'addr', 'add', 'fd00:6b65::10/64', 'dev', 'kebr0', 'nodad');
    ip('-n', NS_A, 'link', 'add', 'kebr1', 'type', 'bridge');
    ip('-n', NS_A, 'link', 'set', 'kebr1', 'up');
    ip('-n', NS_A, 'addr', 'add', '10.250.1.10/24', 'dev', 'kebr1');
    ip('-n', NS_A, 'addr', 'add', 'fd00:6b65:1::10/64', 'dev', 'kebr1', 'nodad');
    ip('-n', NS_A, 'link', 'set', 'kebr1', 'down');
    ip('-n', NS_B, 'link', 'add', 'kev0', 'type', 'veth', 'peer', 'name', 'kev1');
    ip('-n', NS_B, 'link', 'set', 'kev0', 'up');
    ip('-n', NS_B, 'link', 'set', 'kev1', 'up');
    ip('-n', NS_B, 'addr', 'add', '10.250.2.20/24', 'dev', 'kev0');
    ip('-n', NS_B, 'addr', 'add', 'fd00:6b65:2::20/64', 'dev', 'kev0', 'nodad');
    ip('-n', NS_B, 'addr', 'add', '10.250.0.10/24', 'dev', 'kev1');
    // `ip netns exec` execs sleep in the same process: the child's pid is the sleep inside -a.
    holder = spawn('ip', ['netns', 'exec', NS_A, 'sleep', '1000'], { stdio: 'ignore' });
    children.push(holder);
    cni = spawn('sleep', ['1000'], { stdio: 'ignore', env: { PATH: process.env['PATH'] ?? '/usr/bin:/bin', CNI_COMMAND: 'ADD', CNI_CONTAINERID: CONTAINER_ID, CNI_IFNAME: 'eth0' } });
    children.push(cni);
    await Promise.all([started(holder), started(cni)]);
    // Wait until the exec into the namespace happened (the ns link changes from ours).
    const own = readlinkSync('/proc/self/ns/net');
    for (let i = 0; i < 200 && readlinkSync(`/proc/${holder.pid}/ns/net`) === own; i++) await new Promise((r) => setTimeout(r, 10));
    nsA = readlinkSync(`/proc/${holder.pid}/ns/net`);
    nsB = `net:[${statSync(`/run/netns/${NS_B}`).ino}]`;
    mkdirSync(pinDir);
    writeFileSync(pinFile, '');
    execFileSync('mount', ['--bind', `/run/netns/${NS_B}`, pinFile]);
    mounted = true;
    writeFileSync(join(pinDir, 'ke-plain'), '');
    ev = readKernelEvidence();
  });

  // Synchronous and idempotent: also the exit fallback (a run interrupted before `after`).
  const cleanup = (): void => {
    for (const c of children) if (c.pid !== undefined && c.exitCode === null && c.signalCode === null) sigkillAndWaitSync(c.pid);
    if (mounted) spawnSync('umount', [pinFile]);
    mounted = false;
    for (const ns of [NS_A, NS_B]) if (existsSync(`/run/netns/${ns}`)) spawnSync('ip', ['netns', 'del', ns]);
    rmSync(tmp, { recursive: true, force: true });
  };
  atExit(cleanup);
  after(cleanup);

  const got = (): KernelEvidence => ev as KernelEvidence;

  it('finds the addresses of a namespace with a process inside, holder = that process', { skip }, () => {
    const a = { netns: nsA, via: `/proc/${holder?.pid}/ns/net`, pid: holder?.pid };
    assert.deepEqual(holdersOf(got(), 'fd00:6b65::10'), [{ ...a, ifname: 'kebr0' }]);
    assert.deepEqual(holdersOf(got(), '10.250.1.10'), [{ ...a, ifname: null }]);
  });

  it('finds the addresses of a pinned namespace with no process (through the helper)', { skip }, () => {
    const b = { netns: nsB, via: `/run/netns/${NS_B}`, pid: null };
    assert.deepEqual(holdersOf(got(), '10.250.2.20'), [{ ...b, ifname: null }]);
    assert.deepEqual(holdersOf(got(), 'fd00:6b65:2::20'), [{ ...b, ifname: 'kev0' }]);
  });

  it('an address configured in two namespaces has two holders', { skip }, () => {
    assert.deepEqual(holdersOf(got(), '10.250.0.10'), [
      { netns: nsA, via: `/proc/${holder?.pid}/ns/net`, pid: holder?.pid, ifname: null },
      { netns: nsB, via: `/run/netns/${NS_B}`, pid: null, ifname: null },
    ]);
  });

  it('a down link keeps its IPv4 address; its IPv6 address was deleted by the kernel', { skip }, () => {
    assert.deepEqual([isInUse(got(), '10.250.1.10'), isInUse(got(), 'fd00:6b65:1::10')], [true, false]);
  });

  it('a process with CNI_COMMAND and CNI_CONTAINERID in its environment is in flight', { skip }, () => {
    assert.deepEqual(inFlightFor(got(), CONTAINER_ID), [{ pid: cni?.pid, command: 'ADD', comm: 'sleep', containerId: CONTAINER_ID, ifname: 'eth0' }]);
  });

  it('root on the host PID namespace reads everything', { skip }, () => {
    assert.equal(got().incomplete, null);
    assert.ok(got().namespaces >= 3, `namespaces ${got().namespaces}`);
    assert.ok(got().processes >= 3, `processes ${got().processes}`);
  });

  it('a private netns directory: the bind mount is read, the plain file is not a namespace', { skip }, () => {
    const r = readInChild({ netnsDirs: [pinDir] });
    assert.equal(r.incomplete, null);
    assert.deepEqual(r.addresses['10.250.2.20'], [{ netns: nsB, via: pinFile, pid: null, ifname: null }]);
  });

  it('without perl the sh/nsenter helper gives the same answer', { skip }, () => {
    const bin = join(tmp, 'bin-no-perl');
    mkdirSync(bin);
    for (const tool of ['sh', 'nsenter', 'cat']) symlinkSync(execFileSync('sh', ['-c', `command -v ${tool}`], { encoding: 'utf8' }).trim(), join(bin, tool));
    const r = readInChild({ netnsDirs: [pinDir], env: { ...process.env, PATH: bin } });
    assert.equal(r.incomplete, null);
    assert.deepEqual(r.addresses['fd00:6b65:2::20'], [{ netns: nsB, via: pinFile, pid: null, ifname: 'kev0' }]);
  });

  it('with no ipwarden-netns beside the program (from source), neither perl nor nsenter: the pinned namespace is named as unread, and why', { skip }, () => {
    const empty = join(tmp, 'bin-empty');
    mkdirSync(empty);
    const r = readInChild({ netnsDirs: [pinDir], env: { ...process.env, PATH: empty } });
    assert.equal(r.incomplete, `cannot read ${pinFile}: no ipwarden-netns beside the program in ${join(ROOT, 'src/node')} (ENOENT); perl: ENOENT; sh/nsenter: ENOENT`);
    assert.equal(r.addresses['10.250.2.20'], undefined);
  });

  it('not root (setpriv to nobody): incomplete, with the exact reason', { skip: skip || (haveSetpriv ? false : 'needs setpriv') }, () => {
    const r = readInChild({ asNobody: true });
    assert.equal(r.incomplete, "not running as root (euid 65534): other users' namespaces and environments cannot be read");
  });
});
