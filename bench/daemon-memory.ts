/**
 * Daemon memory benchmark (issue 9): the resident size of `ipwarden daemon` after its first
 * reconcile pass over a fully reserved /16 (65,534 reservation files), next to an idle daemon,
 * with the pass's own duration. Run as root after `npm run build`:
 *
 *     node --import tsx bench/daemon-memory.ts
 *
 * Scenarios, each a fresh daemon (`dist/ipwarden.cjs daemon`, clean env, via
 * test/helpers/daemon.ts) with `--data-dir` and `--cni-conf-dir` pointing at this bench's own
 * directories (one conflist naming 10.89.0.0/16 in that data dir) and a fake CRI runtime
 * (test/helpers/hostile-cri.ts, a real grpc-js server in this process) as `--runtime-endpoint`:
 *
 * 1. idle: the /16 configured, its directory empty; the runtime lists nothing;
 * 2. full /16, the runtime lists nothing, `--grace 100000h` (every reservation is younger than
 *    the grace period, so nothing is released);
 * 3. full /16, the runtime lists every owner as a READY sandbox (65,534 of them; the pass asks
 *    PodSandboxStatus of each for its pod IPs), default grace: nothing is a leak.
 *
 * For each: wait for the first `reconcile pass` log line (a condition, not a time), then read
 * VmRSS and VmHWM (peak) of the daemon's pid from /proc/<pid>/status (MB = 2^20 bytes) and the
 * pass's `durationSeconds`; check that nothing was released. The reservation files are written
 * once (host-local's format `<id>\r\neth0`, mode 0600). Prints numbers; asserts nothing beyond
 * "the pass released nothing" (a released reservation would make the scenario meaningless).
 */
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { cpus, release, totalmem } from 'node:os';
import { join } from 'node:path';
import { ROOT } from '../test/helpers/cni.ts';
import { startTestDaemon, type LogLine, type TestDaemon } from '../test/helpers/daemon.ts';
import { startHostileCri, type FakeSandbox, type HostileCri } from '../test/helpers/hostile-cri.ts';

const NET = 'membench';
const PREFIX = '10.89';
/** Every host address of the /16, .0.1 … .255.254, as bench/run.ts writes it (the gateway's file is inert). */
const FULL = 65_534;

/** A 64-hex container ID (the shape containerd uses) for reservation `n`. */
const idOf = (n: number): string => n.toString(16).padStart(8, '0').repeat(8);

/** VmRSS and VmHWM of `pid`, MB. */
function memory(pid: number): { rssMB: number; hwmMB: number } {
  const st = readFileSync(`/proc/${pid}/status`, 'utf8');
  const kb = (field: string): number => Number(new RegExp(`^${field}:\\s+(\\d+) kB$`, 'm').exec(st)?.[1] ?? NaN);
  return { rssMB: kb('VmRSS') / 1024, hwmMB: kb('VmHWM') / 1024 };
}

const root = mkdtempSync('/tmp/ipw-membench-');
const dataDir = join(root, 'data');
const confDir = join(root, 'net.d');
const netDir = join(dataDir, NET);
let daemon: TestDaemon | null = null;
let cri: HostileCri | null = null;
process.on('exit', () => rmSync(root, { recursive: true, force: true }));

/** One scenario: start a daemon on the prepared dirs, wait for its first pass, measure, stop. */
async function scenario(name: string, sandboxes: readonly FakeSandbox[], grace: string | null): Promise<string> {
  cri = await startHostileCri({ path: join(root, 'cri.sock'), sandboxes });
  const args = ['--runtime-endpoint', cri.endpoint, '--interval', '1h', '--metrics-address', '127.0.0.1:0', ...(grace === null ? [] : ['--grace', grace])];
  daemon = await startTestDaemon({ dataDir, cniConfDir: confDir, logLevel: 'info', args });
  const pass: LogLine = await daemon.waitForLog((l) => l.msg === 'reconcile pass' || l.msg === 'reconcile pass failed');
  const mem = memory(daemon.pid);
  const released = daemon.logs.filter((l) => l.msg === 'released').length;
  await daemon.stop();
  daemon = null;
  const statusCalls = cri.stats.status;
  await cri.close();
  cri = null;
  if (pass.msg !== 'reconcile pass') throw new Error(`${name}: the pass failed: ${JSON.stringify(pass)}`);
  if (released !== 0 || pass['released'] !== 0) throw new Error(`${name}: the pass released ${released} reservations`);
  const secs = Number(pass['durationSeconds']);
  return `${name.padEnd(62)} RSS ${mem.rssMB.toFixed(1).padStart(6)} MB  peak ${mem.hwmMB.toFixed(1).padStart(6)} MB  pass ${secs.toFixed(2).padStart(6)} s  (sandboxes ${String(pass['sandboxes'])}, PodSandboxStatus ${statusCalls}, candidates ${String(pass['candidates'])}, errors ${String(pass['errors'])})`;
}

try {
  if (process.getuid?.() !== 0) throw new Error('run as root (the daemon socket directory must be owned by root)');
  if (!existsSync(join(ROOT, 'dist/ipwarden.cjs'))) throw new Error('run "npm run build" first');
  mkdirSync(netDir, { recursive: true });
  mkdirSync(confDir);
  writeFileSync(
    join(confDir, '10-membench.conflist'),
    JSON.stringify({ cniVersion: '1.0.0', name: NET, plugins: [{ type: 'bridge', bridge: 'ipw-memb0', ipam: { type: 'ipwarden', dataDir, ranges: [[{ subnet: `${PREFIX}.0.0/16` }]] } }] }),
  );

  const out: string[] = [];
  out.push(await scenario('1. idle: /16 configured, empty, runtime lists none', [], null));

  const t0 = process.hrtime.bigint();
  let n = 0;
  for (let a = 0; a < 256; a++) {
    for (let b = 0; b < 256; b++) {
      if ((a === 0 && b === 0) || (a === 255 && b === 255)) continue; // network and broadcast addresses
      writeFileSync(join(netDir, `${PREFIX}.${a}.${b}`), `${idOf(n)}\r\neth0`, { mode: 0o600 });
      n++;
    }
  }
  writeFileSync(join(netDir, 'last_reserved_ip.0'), `${PREFIX}.255.254`);
  const made = Number(process.hrtime.bigint() - t0) / 1e9;
  if (n !== FULL || readdirSync(netDir).filter((f) => f.startsWith(`${PREFIX}.`)).length !== FULL) throw new Error(`wrote ${n} reservations, expected ${FULL}`);

  out.push(await scenario(`2. full /16 (${n} files), runtime lists none, grace 100000h`, [], '100000h'));
  const all: FakeSandbox[] = Array.from({ length: n }, (_, i) => ({ id: idOf(i), state: 'ready' }));
  out.push(await scenario(`3. full /16, runtime lists all ${n} owners (ready)`, all, null));

  console.log(`machine: ${cpus().length} × ${cpus()[0]?.model ?? '?'}, ${(totalmem() / 2 ** 30).toFixed(0)} GiB, kernel ${release()}, node ${process.version}; ${new Date().toISOString()}`);
  console.log(`reservation files written in ${made.toFixed(1)} s; RSS/peak = VmRSS/VmHWM of the daemon right after its first 'reconcile pass' line; pass = its durationSeconds`);
  for (const l of out) console.log(l);
} finally {
  if (daemon !== null) await daemon.stop();
  if (cri !== null) await cri.close();
  rmSync(root, { recursive: true, force: true });
}
