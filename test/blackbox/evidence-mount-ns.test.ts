/**
 * Issue 17 item 1, black-box: the built CLI (`dist/ipwarden.cjs gc`) judging reservations whose
 * addresses are configured in a PINNED network namespace with no process inside, run
 * - on the host (this process's mount namespace);
 * - in a private mount namespace whose `/run/netns` (and so `/var/run/netns`, a symlink to `/run`
 *   here) is an empty tmpfs: what a DaemonSet pod without the `/run/netns` mount sees (`unshare
 *   -m` with private propagation: nothing done inside reaches the host). Before the fix it took the
 *   empty directory for "nothing pinned" and released the 5 configured addresses;
 * - in a private mount namespace whose `/run/netns` is a non-recursive bind of itself: the pin is a
 *   plain empty file there, as in a pod whose hostPath mount has no `mountPropagation` and the
 *   pin was made after the pod started (also released before the fix);
 * - in that namespace with `/proc/1/ns` and `/proc/2/ns` hidden too (empty tmpfs over each), so the
 *   host's mount namespace cannot be told: the evidence is incomplete and nothing is released.
 *
 * Real parts: `ip netns add` (a bridge with 5 addresses, no process inside), the reservations
 * written by the real upstream host-local, a fake CRI in this process that lists no sandbox (the
 * "runtime lost its records" case, so only the kernel protects the addresses).
 *
 * Needs root, iproute2, util-linux `unshare` and host-local; without them: fails when CI=true, else
 * skips. Names carry this process's pid; the namespace, the directories and the server are removed
 * in afterEach, also when a test fails.
 */
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, readlinkSync, rmSync, statSync, utimesSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, it } from 'node:test';
import { HOST_LOCAL, haveHostLocal, requireOrSkip, ROOT, runCni } from '../helpers/cni.ts';
import { deleteNetnsAtExit, removeAtExit } from '../helpers/exit-cleanup.ts';
import { startHostileCri, type HostileCri } from '../helpers/hostile-cri.ts';

const isRoot = process.getuid?.() === 0;
const haveIp = spawnSync('ip', ['-V'], { stdio: 'ignore' }).status === 0;
const haveUnshare = spawnSync('unshare', ['--version'], { stdio: 'ignore' }).status === 0;
const skip = requireOrSkip(isRoot && haveIp && haveUnshare && haveHostLocal(), `root, iproute2 (ip), unshare and ${HOST_LOCAL}`);

const BUNDLE = join(ROOT, 'dist/ipwarden.cjs');
const SUBNET = '10.217.17.0/28';
const ip = (k: number): string => `10.217.17.${k}`;
/** Reservations .2–.7, all an hour old; .3–.7 configured in the pinned namespace, .2 nowhere. */
const RESERVED = [2, 3, 4, 5, 6, 7];
const CONFIGURED = [3, 4, 5, 6, 7];
const LEAKED = 'sandbox not listed by the runtime and the file is older than the grace period';
const id = (k: number): string => `h17ev-${process.pid}-p${k}`;
/** Shell command: an empty tmpfs over `path` (in the private mount namespace). */
const hide = (path: string): string => `mount -t tmpfs -o size=64k,mode=0755 h17-hide ${path}`;

/** The process through whose root the host's view is read: pid 1 when its ns/mnt is readable, else kthreadd. */
function hostRef(): number {
  try {
    readlinkSync('/proc/1/ns/mnt');
    return 1;
  } catch {
    return 2;
  }
}

interface Ran {
  code: number | null;
  stdout: string;
  stderr: string;
}

function run(argv: readonly string[]): Promise<Ran> {
  const child = spawn(argv[0] as string, argv.slice(1), { env: { PATH: '/usr/sbin:/usr/bin:/sbin:/bin' }, stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (c: Buffer) => (stdout += c.toString('utf8')));
  child.stderr.on('data', (c: Buffer) => (stderr += c.toString('utf8')));
  return new Promise((resolve, reject) => {
    child.once('error', reject);
    child.once('close', (code) => resolve({ code, stdout, stderr }));
  });
}

interface Report {
  kernel: { complete: boolean; incomplete: string | null };
  networks: Array<{ reservations: Array<{ ip: string; containerId: string | null; verdict: string; reason: string }> }>;
  released: Array<{ ip: string; containerId: string | null; verdict: string }>;
}

class World {
  readonly net = `h17ev${process.pid}`;
  readonly dd = mkdtempSync('/tmp/h17-ev-');
  readonly sock = mkdtempSync('/tmp/h17-cri-');
  readonly confDir = mkdtempSync('/tmp/h17-conf-');
  readonly ns = `h17ev-${process.pid}`;
  nsId = '';
  cri: HostileCri | null = null;

  constructor() {
    for (const d of [this.dd, this.sock, this.confDir]) removeAtExit(d);
    deleteNetnsAtExit(this.ns);
  }

  async setup(): Promise<void> {
    this.cri = await startHostileCri({ path: join(this.sock, 'cri.sock') });
    const conf = { cniVersion: '1.0.0', name: this.net, ipam: { type: 'host-local', dataDir: this.dd, ranges: [[{ subnet: SUBNET }]] } };
    for (const k of RESERVED) {
      const r = runCni(HOST_LOCAL, { command: 'ADD', containerId: id(k), ifname: 'eth0', stdin: conf });
      assert.equal(r.exitCode, 0, `host-local ADD: ${r.stdout}${r.stderr}`);
      const t = Date.now() / 1000 - 3600;
      utimesSync(join(this.dd, this.net, ip(k)), t, t);
    }
    assert.deepEqual(Object.keys(this.files()), RESERVED.map(ip));
    const lines = [`netns add ${this.ns}`, ...[
      'link add h17br0 type bridge',
      'link set h17br0 up',
      ...CONFIGURED.map((k) => `addr add ${ip(k)}/32 dev h17br0`),
    ].map((l) => `-n ${this.ns} ${l}`)];
    for (const l of lines) {
      const r = spawnSync('ip', l.split(' '), { encoding: 'utf8' });
      assert.equal(r.status, 0, `ip ${l}: ${r.stderr}`);
    }
    this.nsId = `net:[${statSync(`/run/netns/${this.ns}`).ino}]`;
  }

  /** Reservation files: IP → content. */
  files(): Record<string, string> {
    const dir = join(this.dd, this.net);
    return Object.fromEntries(
      readdirSync(dir)
        .filter((n) => /^\d+\.\d+\.\d+\.\d+$/.test(n))
        .sort((a, b) => Number(a.split('.')[3]) - Number(b.split('.')[3]))
        .map((n) => [n, readFileSync(join(dir, n), 'utf8')]),
    );
  }

  /**
   * `ipwarden gc --json` for this network; when `prelude` is given, in a private mount namespace
   * after those shell commands (`hide(path)`: an empty tmpfs over path).
   */
  async gc(prelude: readonly string[] | null): Promise<Ran> {
    const gc = [process.execPath, BUNDLE, 'gc', '--data-dir', this.dd, '--network', this.net, '--runtime-endpoint', (this.cri as HostileCri).endpoint, '--grace', '1m', '--cni-conf-dir', this.confDir, '--json'];
    if (prelude === null) return run(gc);
    const script = `${prelude.join(' && ')} && exec "$@"`;
    return run(['unshare', '--mount', '--propagation', 'private', '--', 'sh', '-c', script, 'sh', ...gc]);
  }

  async cleanup(): Promise<void> {
    await this.cri?.close();
    // `ip netns del` fails (EBUSY) while a reader still holds the pin: retry on the condition.
    for (let i = 0; existsSync(`/run/netns/${this.ns}`); i++) {
      spawnSync('ip', ['netns', 'del', this.ns], { stdio: 'ignore' });
      if (!existsSync(`/run/netns/${this.ns}`)) break;
      if (i === 200) throw new Error(`cannot delete network namespace ${this.ns}`);
      await new Promise((r) => setTimeout(r, 50));
    }
    for (const d of [this.dd, this.sock, this.confDir]) rmSync(d, { recursive: true, force: true });
  }
}

describe('kernel evidence outside the host\'s mount namespace (issue 17 item 1): ipwarden gc, 6 old reservations, 5 configured in a pinned namespace with no process', { skip }, () => {
  let w: World;
  beforeEach(async () => {
    w = new World();
    await w.setup();
  });
  afterEach(async () => {
    await w.cleanup();
  });

  const rows = (doc: Report) => (doc.networks[0] as Report['networks'][number]).reservations.map((r) => [r.ip, r.containerId, r.verdict, r.reason]);
  const expectOnlyLeakReleased = (r: Ran, via: string): void => {
    assert.deepEqual([r.code, r.stderr], [0, ''], r.stdout);
    const doc = JSON.parse(r.stdout) as Report;
    assert.deepEqual([doc.kernel.complete, doc.kernel.incomplete], [true, null]);
    const inuse = `kept although the runtime does not own it: the address is configured in network namespace ${w.nsId} via ${via}`;
    assert.deepEqual(rows(doc), RESERVED.map((k) => (CONFIGURED.includes(k) ? [ip(k), id(k), 'inuse', inuse] : [ip(k), id(k), 'leaked', LEAKED])));
    assert.deepEqual(doc.released.map((x) => [x.ip, x.containerId, x.verdict]), [[ip(2), id(2), 'leaked']]);
    assert.deepEqual(w.files(), Object.fromEntries(CONFIGURED.map((k) => [ip(k), `${id(k)}\r\neth0`])));
  };

  it('on the host: releases exactly the unconfigured .2; the 5 configured are inuse via /run/netns/<name>', async () => {
    expectOnlyLeakReleased(await w.gc(null), `/run/netns/${w.ns}`);
  });

  it('in a mount namespace whose /run/netns is an empty tmpfs: the host\'s pins are read through /proc/<pid>/root; releases exactly .2 again', async () => {
    expectOnlyLeakReleased(await w.gc([hide('/run/netns')]), `/proc/${hostRef()}/root/run/netns/${w.ns}`);
  });

  it('in a mount namespace whose /run/netns is bound without its sub-mounts (a hostPath without mountPropagation: the pin is a plain empty file here): read through /proc/<pid>/root; releases exactly .2', async () => {
    // A non-recursive bind of the directory over itself: the pins' nsfs bind mounts are not copied.
    const r = await w.gc([`mount --bind /run/netns /run/netns`, `test ! -s /run/netns/${w.ns}`, `test "$(stat -c %i /run/netns/${w.ns})" != "${w.nsId.slice(5, -1)}"`]);
    expectOnlyLeakReleased(r, `/proc/${hostRef()}/root/run/netns/${w.ns}`);
  });

  it('there, with /proc/1/ns and /proc/2/ns hidden (the host\'s mount namespace cannot be told): incomplete, releases 0', async () => {
    const r = await w.gc([hide('/run/netns'), hide('/proc/1/ns'), hide('/proc/2/ns')]);
    const why = "cannot read the host's mount namespace (/proc/1/ns/mnt: ENOENT; /proc/2/ns/mnt: ENOENT): whether this process sees the host's pinned network namespaces cannot be told";
    assert.deepEqual([r.code, r.stderr], [0, `ipwarden: kernel evidence incomplete (${why}): nothing is released\n`], r.stdout);
    const doc = JSON.parse(r.stdout) as Report;
    assert.equal(doc.kernel.incomplete, why);
    assert.deepEqual(doc.released, []);
    assert.deepEqual(w.files(), Object.fromEntries(RESERVED.map((k) => [ip(k), `${id(k)}\r\neth0`])));
  });
});
