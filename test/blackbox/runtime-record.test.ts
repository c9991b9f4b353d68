/**
 * Multus thick (multus-cni#1071, #1165; issue 19 item 5): the Multus daemon runs the IPAM plugin,
 * whose parent is the Multus shim reparented to pid 1, so the plugin's ancestry never reaches the
 * runtime and self-healing never worked unless every NetworkAttachmentDefinition set
 * `runtimeEndpoint`. Now `install-cni` records the node's runtime endpoint beside the plugin
 * (`ipwarden.d/runtime-endpoint`, the node-name file's trust rules), and the plugin asks it when
 * its ancestry finds no runtime; the daemon asks its own `--runtime-endpoint`.
 *
 * Real parts: `install-cni` into a temp CNI bin dir (`--runtime-endpoint`); the installed static
 * shim exec'd as Multus thick's daemon execs the plugin — by a process (`sh`) whose parent has
 * exited, so it was reparented to pid 1 and the ancestry meets no runtime — with no daemon on its
 * socket, so the installed standalone answers; a fake CRI runtime (test/helpers/hostile-cri.ts,
 * counting its calls) on a unix socket that lists no sandbox; the built daemon for the daemon's
 * path. (A fresh PID namespace would cut the ancestry too, but there the kernel evidence rightly
 * says other containers' processes are not visible, and nothing is released.) Each case starts
 * from a /30 whose one address holds an hour-old reservation of a gone pod ("rr-old"), as
 * host-local writes it.
 *
 * - a record, ancestry finds none → the recorded runtime is asked, the leak is reclaimed, the new
 *   pod gets the address (exact result, files, audit lines);
 * - no record, an untrusted record (group/other-writable `ipwarden.d`), a record written on another
 *   host → as before the record existed: no runtime asked, nothing released, host-local's
 *   exhaustion error with the exact details (the reason the record was not used added);
 * - the daemon with `--runtime-endpoint`: a shim whose ancestry finds none is healed by it.
 *
 * Addresses: 10.219.52.0/30 (configured nowhere). Needs root and a build.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, utimesSync, writeFileSync } from 'node:fs';
import { hostname } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { requireOrSkip, ROOT, snapshotDir } from '../helpers/cni.ts';
import { startTestDaemon, type TestDaemon } from '../helpers/daemon.ts';
import { startHostileCri, type HostileCri } from '../helpers/hostile-cri.ts';

const BUNDLE = join(ROOT, 'dist/ipwarden.cjs');
const skip = requireOrSkip(process.getuid?.() === 0 && existsSync(BUNDLE), 'root and a build (npm run build)');

const NET = 'rrnet';
const SUBNET = '10.219.52.0/30';
const IP = '10.219.52.2';
const RECLAIMED = 'reclaimed on exhaustion: sandbox not listed by the runtime and the file is older than the grace period';
const EXHAUSTED = 'failed to allocate for range 0: no IP addresses available in range set: 10.219.52.1-10.219.52.2';

let T = '';
let bin = '';
let cri: HostileCri | null = null;
const orphans: number[] = [];
const daemons: TestDaemon[] = [];

before(async () => {
  if (skip) return;
  T = mkdtempSync('/tmp/ipw-rr-');
  bin = join(T, 'bin');
  mkdirSync(join(T, 'run'), { mode: 0o700 });
  cri = await startHostileCri({ path: join(T, 'cri.sock') });
  const r = spawnSync(process.execPath, [BUNDLE, 'install-cni', '--dest', bin, '--socket', join(T, 'run', 'plugin.sock'), '--runtime-endpoint', cri.endpoint], {
    env: { PATH: '/usr/bin:/bin' },
    encoding: 'utf8',
    timeout: 120_000,
  });
  assert.equal(r.status, 0, r.stdout + r.stderr);
  // The record's line comes first (written before the binaries), exactly.
  assert.equal(r.stdout.split('\n')[0], `installed ${join(bin, 'ipwarden.d', 'runtime-endpoint')} (runtime endpoint ${cri.endpoint})`);
});
after(async () => {
  for (const d of daemons) await d.stop();
  for (const pid of orphans) {
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      // gone
    }
  }
  await cri?.close();
  if (T !== '') rmSync(T, { recursive: true, force: true });
});

const RECORD = (): string => join(bin, 'ipwarden.d', 'runtime-endpoint');
const conf = (dd: string): string => JSON.stringify({ cniVersion: '1.0.0', name: NET, ipam: { type: 'ipwarden', dataDir: dd, ranges: [[{ subnet: SUBNET }]] } });
const cniEnv = (command: string, containerId: string): Record<string, string> => ({
  PATH: '/usr/bin:/bin',
  CNI_COMMAND: command,
  CNI_CONTAINERID: containerId,
  CNI_IFNAME: 'eth0',
  CNI_NETNS: '/var/run/netns/ipw-rr',
  CNI_PATH: '/usr/lib/cni',
});

let dirs = 0;
/**
 * A data dir whose /30 holds one reservation, of the gone pod rr-old, an hour old — the files
 * host-local (and ipwarden) write: `<ip>` holding `rr-old\r\neth0` (0600), `last_reserved_ip.0`, `lock`.
 * Written here rather than by an ADD: a first ADD in an empty directory checks for a wiped one,
 * asking the runtime — this process, which a synchronous spawn would keep from answering.
 */
function leaked(): string {
  const dd = join(T, `data${++dirs}`);
  mkdirSync(join(dd, NET), { recursive: true });
  writeFileSync(join(dd, NET, IP), 'rr-old\r\neth0', { mode: 0o600 });
  writeFileSync(join(dd, NET, 'last_reserved_ip.0'), IP, { mode: 0o600 });
  writeFileSync(join(dd, NET, 'lock'), '', { mode: 0o750 });
  const hourAgo = Date.now() / 1000 - 3600;
  utimesSync(join(dd, NET, IP), hourAgo, hourAgo);
  return dd;
}

interface Ran {
  code: number | null;
  stdout: string;
  stderr: string;
}
/**
 * Exec the installed shim as a Multus thick daemon's plugin is exec'd: by a process (a `sh`
 * subshell) whose own parent has exited, so it was reparented to pid 1 and the walk up the
 * ancestry meets no runtime (nor this process, which serves the fake CRI). The subshell waits on a
 * FIFO until the test has seen its parent gone (spawnSync returned), so the walk never sees it.
 * Resolves with the shim's exit status, output, and the subshell's pid (the one ancestor walked).
 */
async function asMultusThick(stdin: string, env: Record<string, string>): Promise<Ran & { readonly parent: number }> {
  const io = mkdtempSync(join(T, 'io-'));
  writeFileSync(join(io, 'in'), stdin);
  assert.equal(spawnSync('mkfifo', ['-m', '0600', join(io, 'go')]).status, 0);
  const sh = spawnSync(
    'sh',
    ['-c', '(read go <"$5"; "$0" <"$1" >"$2" 2>"$3"; echo $? >"$4.tmp"; mv "$4.tmp" "$4") </dev/null >/dev/null 2>&1 & echo $!', join(bin, 'ipwarden'), join(io, 'in'), join(io, 'out'), join(io, 'err'), join(io, 'rc'), join(io, 'go')],
    { env, encoding: 'utf8' },
  );
  const parent = Number(sh.stdout.trim());
  orphans.push(parent);
  const st = readFileSync(`/proc/${parent}/stat`, 'utf8');
  assert.equal(st.slice(st.lastIndexOf(')') + 2).split(' ')[1], '1', 'the subshell was reparented to pid 1');
  writeFileSync(join(io, 'go'), 'go\n');
  while (!existsSync(join(io, 'rc'))) await new Promise((res) => setTimeout(res, 5));
  return { code: Number(readFileSync(join(io, 'rc'), 'utf8').trim()), stdout: readFileSync(join(io, 'out'), 'utf8'), stderr: readFileSync(join(io, 'err'), 'utf8'), parent };
}

/** The audit log's lines without `time` and `ageSeconds`. */
function audit(dd: string): Array<Record<string, unknown>> {
  const p = join(dd, '.ipwarden-audit.log');
  if (!existsSync(p)) return [];
  return readFileSync(p, 'utf8')
    .trimEnd()
    .split('\n')
    .map((l) => {
      const o = JSON.parse(l) as Record<string, unknown>;
      delete o['time'];
      delete o['ageSeconds'];
      return o;
    });
}
const record = (phase: string) => ({ network: NET, ip: IP, containerId: 'rr-old', ifname: 'eth0', verdict: 'leaked', reason: RECLAIMED, phase });

/** Why no runtime: the walk met only the reparented subshell `parent`. */
const noRuntime = (parent: number): string => `no runtimeEndpoint is configured and the runtime that ran this plugin could not be identified: no ancestor below pid 1 listens on a unix socket (walked: ${parent} sh)`;

/** As before the record existed: no runtime asked, nothing released, host-local's exhaustion error with `why(parent)` in its details. */
async function assertNotHealed(why: (parent: number) => string): Promise<void> {
  const dd = leaked();
  const before = snapshotDir(join(dd, NET));
  const stats = { ...(cri as HostileCri).stats };
  const r = await asMultusThick(conf(dd), cniEnv('ADD', 'rr-new'));
  assert.deepEqual(
    { code: r.code, stdout: JSON.parse(r.stdout) as unknown, stderr: r.stderr },
    {
      code: 1,
      stdout: {
        cniVersion: '1.0.0',
        code: 999,
        msg: EXHAUSTED,
        details: `range set 0 has 1 allocatable addresses and 1 reservations; the runtime could not be asked (${why(r.parent)}; nothing is reclaimed, as with host-local), so leaked reservations cannot be told from live ones (set the ipam key "runtimeEndpoint"); run "ipwarden leaks --network ${NET} --data-dir ${dd} --runtime-endpoint URL"`,
      },
      stderr: '',
    },
  );
  assert.deepEqual(snapshotDir(join(dd, NET)), before, 'nothing released, nothing reserved');
  assert.deepEqual(audit(dd), []);
  assert.deepEqual([(cri as HostileCri).stats.version, (cri as HostileCri).stats.list], [stats.version, stats.list], 'the runtime was not asked');
}

describe('the node\'s runtime endpoint record: a plugin whose ancestry finds no runtime (Multus thick)', { skip }, () => {
  it('with the record install-cni wrote: the recorded runtime is asked, the leak is reclaimed, the new pod gets its address', async () => {
    assert.equal(readFileSync(RECORD(), 'utf8'), `${(cri as HostileCri).endpoint}\nhost ${hostname()}\n`);
    const dd = leaked();
    const lists = (cri as HostileCri).stats.list;
    const r = await asMultusThick(conf(dd), cniEnv('ADD', 'rr-new'));
    assert.deepEqual({ code: r.code, stdout: JSON.parse(r.stdout) as unknown, stderr: r.stderr }, { code: 0, stdout: { cniVersion: '1.0.0', ips: [{ address: `${IP}/30`, gateway: '10.219.52.1' }] }, stderr: '' });
    assert.deepEqual(snapshotDir(join(dd, NET)), { [IP]: 'rr-new\r\neth0', 'last_reserved_ip.0': IP, lock: '' });
    assert.deepEqual(audit(dd), [record('intent'), record('released')]);
    assert.equal((cri as HostileCri).stats.list - lists, 1, 'the recorded runtime listed its sandboxes once');
  });

  it('no record: as before — no runtime asked, nothing released, the exact error', async () => {
    const saved = readFileSync(RECORD());
    rmSync(RECORD());
    try {
      await assertNotHealed(noRuntime);
    } finally {
      writeFileSync(RECORD(), saved, { mode: 0o644 });
    }
  });

  it('an untrusted record (ipwarden.d writable by others): not used, the error says why', async () => {
    const d = join(bin, 'ipwarden.d');
    chmodSync(d, 0o777);
    try {
      await assertNotHealed((p) => `${noRuntime(p)}; the runtime endpoint record ${d}: ${d} is writable by group or others (mode 777): not used`);
    } finally {
      chmodSync(d, 0o755);
    }
  });

  it('a record written on another host (a copied bin dir): not used, the error says why', async () => {
    const saved = readFileSync(RECORD());
    writeFileSync(RECORD(), `${(cri as HostileCri).endpoint}\nhost not-${hostname()}\n`);
    try {
      await assertNotHealed((p) => `${noRuntime(p)}; the runtime endpoint record ${RECORD()} was written on host not-${hostname()}, not on this host (${hostname()}): not used`);
    } finally {
      writeFileSync(RECORD(), saved);
    }
  });

  it("through the daemon: a shim whose ancestry finds no runtime is healed against the daemon's --runtime-endpoint", async () => {
    const fallbacks = (): string => (existsSync(join(T, 'run', 'standalone-requests.log')) ? readFileSync(join(T, 'run', 'standalone-requests.log'), 'utf8') : '');
    const counted = fallbacks();
    const d = await startTestDaemon({ socket: join(T, 'run', 'plugin.sock'), args: ['--runtime-endpoint', (cri as HostileCri).endpoint] });
    daemons.push(d);
    // The daemon's first reconcile pass asks the same runtime: counted before the request.
    await d.waitForLog((l) => l.msg === 'reconcile pass');
    const dd = leaked();
    const lists = (cri as HostileCri).stats.list;
    const r = await asMultusThick(conf(dd), cniEnv('ADD', 'rr-new'));
    const out = { code: r.code, stdout: JSON.parse(r.stdout) as unknown, stderr: r.stderr };
    assert.deepEqual(out, { code: 0, stdout: { cniVersion: '1.0.0', ips: [{ address: `${IP}/30`, gateway: '10.219.52.1' }] }, stderr: '' });
    assert.deepEqual(snapshotDir(join(dd, NET)), { [IP]: 'rr-new\r\neth0', 'last_reserved_ip.0': IP, lock: '' });
    assert.deepEqual(audit(dd), [record('intent'), record('released')]);
    assert.equal((cri as HostileCri).stats.list - lists, 1, 'the request listed the sandboxes once');
    assert.equal(d.logs.filter((l) => l.msg === 'reconcile pass').length, 1, 'no other pass asked meanwhile');
    // Served by the daemon, not by the fallback.
    const served = await d.waitForLog((l) => l.msg === 'request served' && l['containerId'] === 'rr-new');
    assert.deepEqual([served['command'], served['result']], ['ADD', 'ok']);
    assert.equal(fallbacks(), counted, 'no request fell back to the standalone');
  });
});
