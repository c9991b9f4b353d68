/**
 * The daemon's kernel address index (issue 19 item 2, docs/daemon.md "The kernel address index"),
 * black-box on real network namespaces: the built daemon (test/helpers/daemon.ts) behind a copy of
 * the installed static shim patched to its socket, the way a runtime execs the plugin.
 *
 * - (a) An address configured in a namespace with no reservation file: the ADD through the shim
 *   skips it and gets the next one in round-robin order; the daemon's log line, the metric
 *   `ipwarden_allocation_kernel_conflicts_total` and `ipwarden doctor` name it (exact values). The
 *   standalone plugin on a fresh directory still hands it out (unchanged: no per-pod kernel read).
 * - (c) An address configured after the daemon started: once the index's generation
 *   (`ipwarden_kernel_index_reads_total`) has grown by two — a read that started after the address
 *   was added has landed — the next ADD skips it too.
 * - (b) The index incomplete (the daemon in a private mount namespace with `/proc/1/ns` and
 *   `/proc/2/ns` hidden: the host's pinned namespaces cannot be told): the ADD behaves as today,
 *   gets the configured address, and logs why; the metric counts it.
 *
 * One namespace `ipwk<pid>` with a bridge holding the addresses (this kernel has no dummy link);
 * subnet 10.219.19.0/28 (used nowhere else). Everything it made (daemons by pid, the namespace, the
 * shim copies, temp dirs) is removed in `after`, also on failure. Needs root, iproute2, unshare and
 * `npm run build`.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { atomicWrite, patchShim } from '../../src/cli/install-cni.ts';
import { installedPlugin, requireOrSkip, ROOT, runCniAsync, standalonePlugin, type Outcome } from '../helpers/cni.ts';
import { startTestDaemon, type LogLine, type TestDaemon } from '../helpers/daemon.ts';
import { deleteNetnsAtExit, removeAtExit } from '../helpers/exit-cleanup.ts';

const BUNDLE = join(ROOT, 'dist/ipwarden.cjs');
const isRoot = process.getuid?.() === 0;
const haveIp = spawnSync('ip', ['-V'], { stdio: 'ignore' }).status === 0;
const haveUnshare = spawnSync('unshare', ['--version'], { stdio: 'ignore' }).status === 0;
const skip = requireOrSkip(isRoot && haveIp && haveUnshare && existsSync(BUNDLE), 'root, iproute2 (ip), unshare and a build (npm run build)');

const NET = 'kidx';
const SUBNET = '10.219.19.0/28';
const ip = (k: number): string => `10.219.19.${k}`;
const NS = `ipwk${process.pid}`;
const BR = 'ipwkbr0';
const NO_CRI = 'unix:///nonexistent/ipwk-cri.sock';
const INCOMPLETE =
  "the kernel address index is incomplete: cannot read the host's mount namespace (/proc/1/ns/mnt: ENOENT; /proc/2/ns/mnt: ENOENT): whether this process sees the host's pinned network namespaces cannot be told";

const temps: string[] = [];
const files: string[] = [];
const daemons: TestDaemon[] = [];
function temp(prefix: string): string {
  const d = mkdtempSync(join(tmpdir(), prefix));
  temps.push(d);
  removeAtExit(d);
  return d;
}

function ipCmd(args: string): void {
  const r = spawnSync('ip', args.split(' '), { encoding: 'utf8' });
  assert.equal(r.status, 0, `ip ${args}: ${r.stderr}`);
}

/** `ip netns del`, retried while a reader still holds the pin (EBUSY): on the condition, at most 200 times. */
async function deleteNamespace(): Promise<void> {
  for (let i = 0; existsSync(`/run/netns/${NS}`); i++) {
    spawnSync('ip', ['netns', 'del', NS], { stdio: 'ignore' });
    if (!existsSync(`/run/netns/${NS}`)) break;
    if (i === 200) throw new Error(`cannot delete network namespace ${NS}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** A copy of the installed shim, beside the installed standalone (its fallback), that connects to `socket`. */
function shimFor(socket: string): string {
  const bin = installedPlugin();
  const path = join(dirname(bin), `ipwarden-kidx-${process.pid}-${files.length}`);
  atomicWrite(path, patchShim(readFileSync(bin), { socket }), 0o755);
  files.push(path);
  return path;
}

const conf = (dataDir: string) => ({ cniVersion: '1.0.0', name: NET, type: 'bridge', ipam: { type: 'ipwarden', dataDir, ranges: [[{ subnet: SUBNET }]] } });

function add(bin: string, dataDir: string, containerId: string): Promise<Outcome> {
  return runCniAsync(bin, { command: 'ADD', containerId, ifname: 'eth0', stdin: conf(dataDir) });
}

/**
 * A data directory whose network was used before (`last_reserved_ip.0` = .14, the range's end, as
 * host-local writes it: no newline), emptied by DELs: the next ADD's round robin starts at .2. Not
 * an empty one: on a new or wiped directory the first ADD recovers the node's addresses from the
 * kernel instead (docs/reconciler.md), which would reserve .2 for its namespace.
 */
function usedDataDir(prefix: string): string {
  const dd = temp(prefix);
  mkdirSync(join(dd, NET));
  writeFileSync(join(dd, NET, 'last_reserved_ip.0'), ip(14));
  return dd;
}

/** The address (without prefix) of a 1.0.0 ADD result. */
function addressOf(o: Outcome): string {
  assert.equal(o.exitCode, 0, `${o.stdout}${o.stderr}`);
  const ips = (o.json as { ips: Array<{ address: string }> }).ips;
  assert.equal(ips.length, 1, o.stdout);
  return (ips[0] as { address: string }).address;
}

/** Reservation files of the network: name → content (last_reserved_ip.0 included, lock left out). */
function reservations(dataDir: string): Record<string, string> {
  const dir = join(dataDir, NET);
  return Object.fromEntries(readdirSync(dir).filter((n) => n !== 'lock').sort().map((n) => [n, readFileSync(join(dir, n), 'utf8')]));
}

/** The metrics port the daemon logged. */
async function metricsPort(d: TestDaemon): Promise<number> {
  const l = await d.waitForLog((x) => x.msg === 'metrics listening');
  return Number(String(l['metricsAddress']).split(':').pop());
}

/** The samples of `/metrics` whose name starts with `prefix`, as `name{labels} value` lines. */
async function samples(port: number, prefix: string): Promise<string[]> {
  const r = await fetch(`http://127.0.0.1:${port}/metrics`);
  assert.equal(r.status, 200);
  return (await r.text()).split('\n').filter((l) => l.startsWith(prefix));
}

/** Sum of `ipwarden_kernel_index_reads_total` over its results: the index's generation. */
async function generation(port: number): Promise<number> {
  return (await samples(port, 'ipwarden_kernel_index_reads_total')).reduce((n, l) => n + Number(l.split(' ').pop()), 0);
}

const skippedLines = (d: TestDaemon): LogLine[] => d.logs.filter((l) => l.msg === 'ADD skipped addresses configured in a network namespace with no reservation file');
const served = (d: TestDaemon, containerId: string): Promise<LogLine> => d.waitForLog((l) => l.msg === 'request served' && l['containerId'] === containerId);

describe('the kernel address index: ADDs through the daemon skip addresses configured in a network namespace', { skip }, () => {
  let nsId = '';
  before(() => {
    // The namespace first, so the daemons' first reads already see .2.
    ipCmd(`netns add ${NS}`);
    deleteNetnsAtExit(NS);
    for (const l of [`link add ${BR} type bridge`, `link set ${BR} up`, `addr add ${ip(2)}/32 dev ${BR}`]) ipCmd(`-n ${NS} ${l}`);
    nsId = `net:[${statSync(`/run/netns/${NS}`).ino}]`;
  });
  after(async () => {
    // The daemons first: one runs in a mount namespace copied while the pin existed (the pin
    // cannot be removed while it lives).
    for (const d of daemons) await d.stop();
    await deleteNamespace();
    for (const f of files) rmSync(f, { force: true });
    for (const d of temps) rmSync(d, { recursive: true, force: true });
  });

  describe('a daemon whose index is complete', () => {
    let d: TestDaemon;
    let shim = '';
    let port = 0;
    let dd = '';
    let confDir = '';
    before(async () => {
      dd = usedDataDir('ipwk-data-');
      confDir = temp('ipwk-conf-');
      d = await startTestDaemon({ args: ['--runtime-endpoint', NO_CRI] });
      daemons.push(d);
      shim = shimFor(d.socket);
      port = await metricsPort(d);
      writeFileSync(join(confDir, '10-kidx.conf'), JSON.stringify(conf(dd)));
    });

    it('(a) .2 is configured in the namespace with no file: the ADD gets .3; the log, the metric and doctor name .2 and its namespace', async () => {
      const holders = `${nsId} via /run/netns/${NS}`;
      const r = await add(shim, dd, 'kidx-a');
      assert.equal(addressOf(r), `${ip(3)}/28`);
      await served(d, 'kidx-a');
      assert.deepEqual(reservations(dd), { [ip(3)]: 'kidx-a\r\neth0', 'last_reserved_ip.0': ip(3) });

      const line = await d.waitForLog((l) => l.msg === 'ADD skipped addresses configured in a network namespace with no reservation file');
      assert.deepEqual(
        [line.level, line['part'], line['network'], line['containerId'], line['conflicts'], line['addresses']],
        [40, 'kernel-index', NET, 'kidx-a', [{ ip: ip(2), heldBy: holders }], [ip(3)]],
      );
      assert.deepEqual(await samples(port, 'ipwarden_allocation_kernel_conflicts_total'), [`ipwarden_allocation_kernel_conflicts_total{network="${NET}"} 1`]);
      assert.deepEqual(await samples(port, 'ipwarden_allocation_kernel_index_unused_total'), []);

      const doc = spawnSync(process.execPath, [BUNDLE, 'doctor', '--cni-conf-dir', confDir, '--runtime-endpoint', NO_CRI, '--json'], { encoding: 'utf8', timeout: 60_000 });
      const findings = (JSON.parse(doc.stdout) as { findings: Array<Record<string, string>> }).findings.filter((f) => f['id'] === 'unreserved-configured-address');
      assert.deepEqual(findings, [
        {
          id: 'unreserved-configured-address',
          severity: 'warning',
          title: `${ip(2)} (${NET}) is configured in a network namespace and has no reservation file`,
          evidence:
            `${ip(2)} in ${nsId} via /run/netns/${NS}; ${join(dd, NET)} has no file for it: the standalone plugin and host-local can hand it out to a new pod ` +
            '(ADDs served by ipwarden daemon skip it)',
          fix:
            `find what uses it (nsenter --net=PATH ip -o addr for each path above, or crictl inspectp): a pod of ${NET} whose file was deleted — ` +
            `ipwarden gc --network ${NET} --data-dir ${dd} --cni-conf-dir ${confDir} --runtime-endpoint ${NO_CRI} re-reserves the addresses of ready sandboxes the runtime reports; another network or IPAM using this range — give them disjoint ranges`,
        },
      ]);

      // The standalone plugin (no daemon) is unchanged: from the same state it hands .2 out.
      const fresh = usedDataDir('ipwk-standalone-');
      assert.equal(addressOf(await runCniAsync(standalonePlugin(), { command: 'ADD', containerId: 'kidx-s', ifname: 'eth0', stdin: conf(fresh) })), `${ip(2)}/28`);
    });

    it('(c) .4 configured after the daemon started: once a read started after it has landed (generation +2), the ADD gets .5', async () => {
      ipCmd(`-n ${NS} addr add ${ip(4)}/32 dev ${BR}`);
      // A read running now may have started before the address was added; the one after it cannot.
      const g0 = await generation(port);
      await d.waitForLog((l) => l.msg === 'kernel address index read' && Number(l['generation']) >= g0 + 2);
      const r = await add(shim, dd, 'kidx-c');
      assert.equal(addressOf(r), `${ip(5)}/28`);
      await served(d, 'kidx-c');
      assert.deepEqual(reservations(dd), { [ip(3)]: 'kidx-a\r\neth0', [ip(5)]: 'kidx-c\r\neth0', 'last_reserved_ip.0': ip(5) });
      const lines = skippedLines(d);
      assert.deepEqual(
        lines.map((l) => [l['containerId'], l['conflicts'], l['addresses']]),
        [
          ['kidx-a', [{ ip: ip(2), heldBy: `${nsId} via /run/netns/${NS}` }], [ip(3)]],
          ['kidx-c', [{ ip: ip(4), heldBy: `${nsId} via /run/netns/${NS}` }], [ip(5)]],
        ],
      );
      assert.deepEqual(await samples(port, 'ipwarden_allocation_kernel_conflicts_total'), [`ipwarden_allocation_kernel_conflicts_total{network="${NET}"} 2`]);
    });
  });

  describe('a daemon whose index is incomplete', () => {
    it('(b) the ADD behaves as today: it gets the configured .2, and the log and the metric say the index was not used and why', async () => {
      // An empty tmpfs over /proc/1/ns and /proc/2/ns in a mount namespace of its own: the daemon
      // cannot tell whether it sees the host's pinned namespaces, so every read is incomplete.
      const hide = (p: string): string => `mount -t tmpfs -o size=64k,mode=0755 ipwk-hide ${p}`;
      const d = await startTestDaemon({
        args: ['--runtime-endpoint', NO_CRI],
        wrap: ['unshare', '--mount', '--propagation', 'private', '--', 'sh', '-c', `${hide('/proc/1/ns')} && ${hide('/proc/2/ns')} && exec "$@"`, 'sh'],
      });
      daemons.push(d);
      const shim = shimFor(d.socket);
      const port = await metricsPort(d);
      const dd = usedDataDir('ipwk-incomplete-');
      const start = await d.waitForLog((l) => l.msg === 'kernel address index incomplete: ADDs do not use it');
      assert.deepEqual([start.level, start['generation'], start['reason']], [40, 1, INCOMPLETE.replace('the kernel address index is incomplete: ', '')]);

      const r = await add(shim, dd, 'kidx-b');
      assert.equal(addressOf(r), `${ip(2)}/28`);
      await served(d, 'kidx-b');
      assert.deepEqual(reservations(dd), { [ip(2)]: 'kidx-b\r\neth0', 'last_reserved_ip.0': ip(2) });
      const line = await d.waitForLog((l) => l.msg === 'ADD did not use the kernel address index');
      assert.deepEqual([line.level, line['network'], line['containerId'], line['reason']], [40, NET, 'kidx-b', INCOMPLETE]);
      assert.deepEqual(skippedLines(d), []);
      assert.deepEqual(await samples(port, 'ipwarden_allocation_kernel_index_unused_total'), [`ipwarden_allocation_kernel_index_unused_total{network="${NET}",reason="incomplete"} 1`]);
      assert.deepEqual(await samples(port, 'ipwarden_allocation_kernel_conflicts_total'), []);
      await d.stop();
    });
  });
});
