/**
 * Burst benchmark (issue 19 item 4): 100 ADDs started at once on one node, then 100 DELs at once,
 * through the installed shim with the daemon up, against 100 concurrent execs of upstream
 * host-local, on one network and on eight; plus the same burst with the daemon SIGKILLed after it
 * has logged its 25th ADD served (the shim's fallback serves the rest). Run as root after
 * `npm run build`:
 *
 *     node --import tsx bench/burst.ts        # BENCH_BURST_ROUNDS (default 10), BENCH_BURST_WARMUP (1), BENCH_WARM_UP (2000: the daemon's --warm-up),
 *                                              # BENCH_BURST_DIR (/tmp: where the run's directory, its data directories and sockets, is made)
 *
 * `BENCH_BURST_BASE=<another checkout, built>` adds that build's shim + daemon as two more groups
 * (×1 and ×8, its own install and daemon) to the same interleaved rounds: an A/B of two builds
 * under the same load, which on a shared machine is the only comparison that means anything.
 *
 * Method: test/helpers/xburst.c (built with gcc at run time) posix_spawns all 100 execs back to
 * back and reaps them; each exec's time is from just before its spawn to just after its waitpid,
 * the burst's wall time from the first spawn to the last exit. Every exec gets exactly PATH and
 * the CNI_* variables (no NODE_EXTRA_CA_CERTS or anything else of this shell's), stdin the
 * config file, stdout/stderr /dev/null; every exit status is checked and every network directory
 * must be back to `lock` + `last_reserved_ip.0` after each DEL burst (else the run aborts).
 *
 * Groups, each with its own data directory (10.235.0.0/24 for one network, 10.235.1–8.0/24 for
 * eight; ADD i on network i mod 8): host-local ×1, shim+daemon ×1, host-local ×8, shim+daemon ×8,
 * and "killed" (one network, its own install and daemon, restarted for the DELs). Each round
 * runs every group once, the starting group rotated; warm-up rounds are not counted.
 *
 * Figures: throughput = 100 ÷ burst wall time (ADD, DEL, and a pod = ADD+DEL: 100 ÷ (ADD wall +
 * DEL wall)); ratio = ours ÷ host-local within the round, median of the per-round ratios [IQR];
 * p99 = nearest-rank 99th percentile of the exec times, pooled over the counted rounds (p50 too).
 * Prints; asserts nothing (benchmarks are never part of `npm test`).
 */
import { execFileSync } from 'node:child_process';
import { closeSync, existsSync, fsyncSync, mkdirSync, mkdtempSync, openSync, readdirSync, readFileSync, rmSync, writeFileSync, writeSync } from 'node:fs';
import { cpus, loadavg, release } from 'node:os';
import { join } from 'node:path';
import { HOST_LOCAL, ROOT } from '../test/helpers/cni.ts';
import { nearestRank, runBurst, type BurstStep } from '../test/helpers/burst.ts';
import { startTestDaemon, type TestDaemon } from '../test/helpers/daemon.ts';

const ROUNDS = Number(process.env['BENCH_BURST_ROUNDS'] ?? 10);
const BASE = process.env['BENCH_BURST_BASE'];
const WARMUP = Number(process.env['BENCH_BURST_WARMUP'] ?? 1);
/** `--warm-up` of the daemon under test (`BENCH_WARM_UP`; default the daemon's own, 2,000 pairs; 0 measures a cold daemon). */
const WARM_UP = Number(process.env['BENCH_WARM_UP'] ?? 2000);
const N = 100;
const KILL_AFTER = 25;

/** Median of `xs` with its interquartile range, as text. */
function medIqr(xs: readonly number[], digits = 2): string {
  const q = (p: number): number => {
    const s = [...xs].sort((a, b) => a - b);
    if (s.length === 0) return 0;
    const pos = (s.length - 1) * p;
    const lo = Math.floor(pos);
    const hi = Math.ceil(pos);
    return (s[lo] as number) + ((s[hi] as number) - (s[lo] as number)) * (pos - lo);
  };
  return `${q(0.5).toFixed(digits)} [${q(0.25).toFixed(digits)}–${q(0.75).toFixed(digits)}]`;
}

const cniEnv = (command: string, id: string): Record<string, string> => ({
  PATH: '/usr/bin:/bin',
  CNI_COMMAND: command,
  CNI_CONTAINERID: id,
  CNI_IFNAME: 'eth0',
  CNI_NETNS: command === 'ADD' ? '/var/run/netns/ipw-burstbench' : '',
  CNI_PATH: '/usr/lib/cni',
});

/**
 * CPU time (user + system) process `pid` has used so far, ms (/proc/PID/stat; 0 when unreadable);
 * with `mainThread`, only its main thread's (/proc/PID/task/PID/stat: the thread that serves
 * requests, beside the plugin socket's thread, libuv's pool and V8's).
 */
function cpuMs(pid: number, mainThread = false): number {
  try {
    const stat = readFileSync(mainThread ? `/proc/${pid}/task/${pid}/stat` : `/proc/${pid}/stat`, 'utf8');
    const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    // Fields 14 and 15 (utime, stime) in clock ticks; after the ")" field 3 is index 0.
    return ((Number(f[11]) + Number(f[12])) * 1000) / 100;
  } catch {
    return 0;
  }
}

/** One round's measurements of a group. */
interface Sample {
  addWall: number;
  delWall: number;
  addMs: number[];
  delMs: number[];
  /** CPU ms the daemon used over the group's two bursts (daemon groups). */
  daemonCpuMs?: number;
  /** Of {@link daemonCpuMs}, its main thread's. */
  mainCpuMs?: number;
  /** CPU ms of the execs themselves (both bursts; getrusage of the harness's children). */
  execCpuMs: number;
  /** Killed group: ADDs the daemon logged served before its death, and fallback lines. */
  served?: number;
  fallbacks?: number;
}

/**
 * The disk's fsync latency now, ms (median of 20 × write 1 byte + fsync of a file in `dir`): the
 * context of each round, since the daemon's ADD waits for three of them and host-local for none.
 */
function fsyncProbe(dir: string): number {
  const file = join(dir, 'fsync-probe');
  const fd = openSync(file, 'w');
  const ms: number[] = [];
  try {
    for (let i = 0; i < 20; i++) {
      const t0 = process.hrtime.bigint();
      writeSync(fd, 'x');
      fsyncSync(fd);
      ms.push(Number(process.hrtime.bigint() - t0) / 1e6);
    }
  } finally {
    closeSync(fd);
    rmSync(file, { force: true });
  }
  return nearestRank(ms, 0.5);
}

const root = mkdtempSync(join(process.env['BENCH_BURST_DIR'] ?? '/tmp', 'ipw-burstbench-'));
const daemons: TestDaemon[] = [];
process.on('exit', () => rmSync(root, { recursive: true, force: true }));

try {
  if (process.getuid?.() !== 0) throw new Error('run as root (the daemon socket directory must be owned by root)');
  if (!existsSync(HOST_LOCAL)) throw new Error(`needs upstream host-local at ${HOST_LOCAL}`);
  const bundle = join(ROOT, 'dist/ipwarden.cjs');
  if (!existsSync(bundle)) throw new Error('run "npm run build" first');

  const baseBundle = BASE === undefined ? null : join(BASE, 'dist/ipwarden.cjs');
  if (baseBundle !== null && !existsSync(baseBundle)) throw new Error(`BENCH_BURST_BASE: no ${baseBundle} (build it first)`);
  const install = (name: string, from = bundle): { bin: string; socket: string; countLog: string } => {
    const binDir = join(root, `bin-${name}`);
    const sockDir = join(root, `run-${name}`);
    mkdirSync(binDir);
    mkdirSync(sockDir, { mode: 0o700 });
    const socket = join(sockDir, 'plugin.sock');
    execFileSync(process.execPath, [from, 'install-cni', '--dest', binDir, '--socket', socket], { env: { PATH: '/usr/bin:/bin' }, stdio: 'pipe' });
    return { bin: join(binDir, 'ipwarden'), socket, countLog: join(sockDir, 'standalone-requests.log') };
  };
  const up = install('up');
  const kill = install('kill');
  const startDaemon = async (socket: string, from = bundle, args: string[] = []): Promise<TestDaemon> => {
    const d = await startTestDaemon({ socket, logLevel: 'info', args: ['--interval', '1h', ...args], bundle: from });
    daemons.push(d);
    return d;
  };
  // The daemon under test as deployed: its warm-up (default 2,000 pairs) done before the rounds.
  const daemon = await startDaemon(up.socket, bundle, ['--warm-up', String(WARM_UP)]);
  const warmed = WARM_UP === 0 ? null : await daemon.waitForLog((l) => /^warm-up (done|stopped|cut short)/.test(l.msg));
  if (warmed !== null && warmed.msg !== 'warm-up done') throw new Error(`the daemon's warm-up did not complete: ${JSON.stringify(warmed)}`);
  const base = baseBundle === null ? null : install('base', baseBundle);
  const baseDaemon = base === null || baseBundle === null ? null : await startDaemon(base.socket, baseBundle);
  // The killed group measures the fallback: its daemon (restarted every round) does not warm up.
  let killable = await startDaemon(kill.socket, bundle, ['--warm-up', '0']);

  /** Config files of `group`'s networks (one or eight), `type` host-local or ipwarden. */
  const confs = (group: string, type: string, nets: number): string[] =>
    Array.from({ length: nets }, (_, k) => {
      const file = join(root, `conf-${group}-${k}.json`);
      const subnet = nets === 1 ? '10.235.0.0/24' : `10.235.${k + 1}.0/24`;
      writeFileSync(file, JSON.stringify({ cniVersion: '1.0.0', name: `burst${nets}-${k}`, ipam: { type, dataDir: join(root, `data-${group}`), ranges: [[{ subnet }]] } }));
      return file;
    });
  const steps = (bin: string, files: string[], command: string, prefix: string): BurstStep[] =>
    Array.from({ length: N }, (_, i) => ({ bin, stdin: files[i % files.length] as string, env: cniEnv(command, `${prefix}-${i}`) }));
  const checkBurst = (what: string, execs: Array<{ exitCode: number }>): void => {
    const bad = execs.filter((e) => e.exitCode !== 0).length;
    if (bad > 0) throw new Error(`${what}: ${bad} of ${execs.length} execs failed`);
  };
  const checkEmpty = (group: string): void => {
    const data = join(root, `data-${group}`);
    for (const net of readdirSync(data)) {
      const left = readdirSync(join(data, net)).filter((n) => n !== 'lock' && !/^last_reserved_ip\.\d+$/.test(n));
      if (left.length > 0) throw new Error(`${group}/${net}: left after the DELs: ${left.slice(0, 5).join(', ')}`);
    }
  };
  const countLines = (file: string): number => (existsSync(file) ? readFileSync(file, 'utf8').split('\n').filter((l) => l !== '').length : 0);

  interface Group {
    name: string;
    run(round: number): Promise<Sample>;
  }
  const plain = (name: string, group: string, bin: string, type: string, nets: number, cpuOf?: TestDaemon): Group => {
    const files = confs(group, type, nets);
    return {
      name,
      async run(round) {
        const cpu0 = cpuOf === undefined ? 0 : cpuMs(cpuOf.pid);
        const main0 = cpuOf === undefined ? 0 : cpuMs(cpuOf.pid, true);
        const add = await runBurst(steps(bin, files, 'ADD', `${group}${round}`), false);
        checkBurst(`${name} ADD, round ${round}`, add.execs);
        const del = await runBurst(steps(bin, files, 'DEL', `${group}${round}`), false);
        checkBurst(`${name} DEL, round ${round}`, del.execs);
        checkEmpty(group);
        const cpu = cpuOf === undefined ? {} : { daemonCpuMs: cpuMs(cpuOf.pid) - cpu0, mainCpuMs: cpuMs(cpuOf.pid, true) - main0 };
        return { addWall: add.wallMs, delWall: del.wallMs, addMs: add.execs.map((e) => e.ms), delMs: del.execs.map((e) => e.ms), execCpuMs: add.cpuMs + del.cpuMs, ...cpu };
      },
    };
  };
  const killedFiles = confs('kill', 'ipwarden', 1);
  const killed: Group = {
    name: 'shim, daemon killed',
    async run(round) {
      const d = killable;
      const prefix = `kill${round}`;
      const before = countLines(kill.countLog);
      let n = 0;
      const dead = d
        .waitForLog((l) => l.msg === 'request served' && l['command'] === 'ADD' && String(l['containerId']).startsWith(`${prefix}-`) && ++n === KILL_AFTER)
        .then(() => {
          d.kill('SIGKILL');
          return d.exited;
        });
      dead.catch(() => undefined);
      const add = await runBurst(steps(kill.bin, killedFiles, 'ADD', prefix), false);
      if (n < KILL_AFTER) throw new Error(`killed, round ${round}: the burst ended before the kill (${n} served)`);
      await dead;
      checkBurst(`killed ADD, round ${round}`, add.execs);
      const served = d.logs.filter((l) => l.msg === 'request served' && l['command'] === 'ADD' && String(l['containerId']).startsWith(`${prefix}-`)).length;
      const fallbacks = countLines(kill.countLog) - before;
      await d.stop(); // already dead: removes its temp dir
      killable = await startDaemon(kill.socket, bundle, ['--warm-up', '0']);
      const del = await runBurst(steps(kill.bin, killedFiles, 'DEL', prefix), false);
      checkBurst(`killed DEL, round ${round}`, del.execs);
      checkEmpty('kill');
      return { addWall: add.wallMs, delWall: del.wallMs, addMs: add.execs.map((e) => e.ms), delMs: del.execs.map((e) => e.ms), execCpuMs: add.cpuMs + del.cpuMs, served, fallbacks };
    },
  };
  const groups: Group[] = [
    plain('host-local ×1', 'hl1', HOST_LOCAL, 'host-local', 1),
    plain('shim+daemon ×1', 'ipw1', up.bin, 'ipwarden', 1, daemon),
    plain('host-local ×8', 'hl8', HOST_LOCAL, 'host-local', 8),
    plain('shim+daemon ×8', 'ipw8', up.bin, 'ipwarden', 8, daemon),
    killed,
    ...(base === null || baseDaemon === null
      ? []
      : [plain('base shim+daemon ×1', 'base1', base.bin, 'ipwarden', 1, baseDaemon), plain('base shim+daemon ×8', 'base8', base.bin, 'ipwarden', 8, baseDaemon)]),
  ];

  const fallbacksBefore = countLines(up.countLog);
  const baseFallbacksBefore = base === null ? 0 : countLines(base.countLog);
  const samples = new Map<string, Sample[]>(groups.map((g) => [g.name, []]));
  const loads: number[] = [];
  const fsyncs: number[] = [];
  for (let round = 0; round < WARMUP + ROUNDS; round++) {
    if (round >= WARMUP) fsyncs.push(fsyncProbe(root));
    for (let k = 0; k < groups.length; k++) {
      const g = groups[(round + k) % groups.length] as Group;
      const s = await g.run(round);
      if (round >= WARMUP) samples.get(g.name)?.push(s);
    }
    loads.push(loadavg()[0] as number);
  }
  const upFallbacks = countLines(up.countLog) - fallbacksBefore;
  const inDaemon = (command: string, prefix: string): number[] =>
    daemon.logs
      .filter((l) => l.msg === 'request served' && l['command'] === command && new RegExp(`^${prefix}(\\d+)-`).test(String(l['containerId'])))
      .filter((l) => Number(/^\D+(\d+)-/.exec(String(l['containerId']))?.[1]) >= WARMUP)
      .map((l) => Number(l['durationSeconds']) * 1000);

  const of = (name: string): Sample[] => samples.get(name) ?? [];
  const tput = (s: Sample, what: 'add' | 'del' | 'pod'): number => (what === 'add' ? N / s.addWall : what === 'del' ? N / s.delWall : N / (s.addWall + s.delWall)) * 1000;
  const ratio = (ours: string, theirs: string, what: 'add' | 'del' | 'pod'): string =>
    medIqr(of(ours).map((s, r) => tput(s, what) / tput(of(theirs)[r] as Sample, what)));
  const rate = (name: string, what: 'add' | 'del' | 'pod'): string => medIqr(of(name).map((s) => tput(s, what)), 0);
  const lat = (name: string, what: 'addMs' | 'delMs'): string => {
    const all = of(name).flatMap((s) => s[what]);
    return `p50 ${nearestRank(all, 0.5).toFixed(1)} p99 ${nearestRank(all, 0.99).toFixed(1)} ms`;
  };

  console.log(`machine: ${cpus().length} × ${cpus()[0]?.model ?? '?'}, kernel ${release()}, node ${process.version}; ${new Date().toISOString()}`);
  console.log(`${ROUNDS} rounds (+${WARMUP} warm-up), ${groups.length} groups interleaved, start rotated; ${N} execs per burst; the daemon under test warmed itself up with ${WARM_UP} ADD+DEL pairs (--warm-up) before the rounds; load average (1 min) over the rounds ${medIqr(loads)}; fsync of a 1-byte write in the data directory's file system, ms, before each round: ${medIqr(fsyncs)}`);
  console.log('throughput = 100 ÷ burst wall time, per second, median [IQR] over rounds; ratio = ours ÷ host-local within a round, median [IQR]; p50/p99 pooled over rounds');
  console.log('');
  console.log('1. shim + daemon vs upstream host-local, 100 at once (target ≥ 3× host-local\'s throughput)');
  for (const [nets, ours, theirs] of [
    ['one network', 'shim+daemon ×1', 'host-local ×1'],
    ['eight networks', 'shim+daemon ×8', 'host-local ×8'],
  ] as const) {
    console.log(`   ${nets}: pods (ADD+DEL) ratio ${ratio(ours, theirs, 'pod')}; ADD ${ratio(ours, theirs, 'add')}; DEL ${ratio(ours, theirs, 'del')}`);
    console.log(`      ${ours.padEnd(16)} pods/s ${rate(ours, 'pod')}, ADD/s ${rate(ours, 'add')}, DEL/s ${rate(ours, 'del')}; ADD ${lat(ours, 'addMs')}; DEL ${lat(ours, 'delMs')}`);
    console.log(`      ${theirs.padEnd(16)} pods/s ${rate(theirs, 'pod')}, ADD/s ${rate(theirs, 'add')}, DEL/s ${rate(theirs, 'del')}; ADD ${lat(theirs, 'addMs')}; DEL ${lat(theirs, 'delMs')}`);
  }
  const med = (xs: number[]): string => `${nearestRank(xs, 0.5).toFixed(2)} / ${nearestRank(xs, 0.99).toFixed(2)}`;
  console.log(
    `   inside the daemon (its 'request served' durationSeconds incl. the wait for the network's lock, p50 / p99 ms): ×1 ADD ${med(inDaemon('ADD', 'ipw1'))} DEL ${med(inDaemon('DEL', 'ipw1'))}; ×8 ADD ${med(inDaemon('ADD', 'ipw8'))} DEL ${med(inDaemon('DEL', 'ipw8'))}; fallbacks with the daemon up: ${upFallbacks}`,
  );
  const cpuPerPod = (name: string): string => medIqr(of(name).map((s) => (s.daemonCpuMs ?? 0) / N));
  const mainPerPod = (name: string): string => medIqr(of(name).map((s) => (s.mainCpuMs ?? 0) / N));
  const mainBusy = (name: string): string => medIqr(of(name).map((s) => (100 * (s.mainCpuMs ?? 0)) / (s.addWall + s.delWall)), 0);
  const busy = (name: string): string => medIqr(of(name).map((s) => (100 * (s.daemonCpuMs ?? 0)) / (s.addWall + s.delWall)), 0);
  const execCpu = (name: string): string => medIqr(of(name).map((s) => s.execCpuMs / N));
  console.log(`   daemon CPU (user + system, /proc) per pod (ADD+DEL), ms: ×1 ${cpuPerPod('shim+daemon ×1')}, ×8 ${cpuPerPod('shim+daemon ×8')}; % of one core during the bursts: ×1 ${busy('shim+daemon ×1')}, ×8 ${busy('shim+daemon ×8')}`);
  console.log(`   … of which its main thread (serving the requests), ms per pod: ×1 ${mainPerPod('shim+daemon ×1')}, ×8 ${mainPerPod('shim+daemon ×8')}; busy % of the bursts: ×1 ${mainBusy('shim+daemon ×1')}, ×8 ${mainBusy('shim+daemon ×8')}`);
  console.log(`   CPU of the execs per pod (ADD+DEL; getrusage of the harness's children), ms: shims ×1 ${execCpu('shim+daemon ×1')}, ×8 ${execCpu('shim+daemon ×8')}; host-local ×1 ${execCpu('host-local ×1')}, ×8 ${execCpu('host-local ×8')}`);
  if (BASE !== undefined) {
    console.log(`   base build (${BASE}), same rounds:`);
    for (const [nets, b, theirs] of [
      ['one network', 'base shim+daemon ×1', 'host-local ×1'],
      ['eight networks', 'base shim+daemon ×8', 'host-local ×8'],
    ] as const) {
      console.log(`   ${nets}: pods (ADD+DEL) ratio ${ratio(b, theirs, 'pod')}; ADD ${ratio(b, theirs, 'add')}; DEL ${ratio(b, theirs, 'del')}`);
      console.log(`      ${b.padEnd(16)} pods/s ${rate(b, 'pod')}, ADD/s ${rate(b, 'add')}, DEL/s ${rate(b, 'del')}; ADD ${lat(b, 'addMs')}; DEL ${lat(b, 'delMs')}; daemon CPU/pod ${cpuPerPod(b)} ms (main thread ${mainPerPod(b)})`);
    }
    console.log(`   this build ÷ base, pods/s within a round: ×1 ${ratio('shim+daemon ×1', 'base shim+daemon ×1', 'pod')}, ×8 ${ratio('shim+daemon ×8', 'base shim+daemon ×8', 'pod')}; ADD/s ×1 ${ratio('shim+daemon ×1', 'base shim+daemon ×1', 'add')}, ×8 ${ratio('shim+daemon ×8', 'base shim+daemon ×8', 'add')}; DEL/s ×1 ${ratio('shim+daemon ×1', 'base shim+daemon ×1', 'del')}, ×8 ${ratio('shim+daemon ×8', 'base shim+daemon ×8', 'del')}`);
    console.log(`   fallbacks with the base daemon up: ${countLines(base?.countLog ?? '') - baseFallbacksBefore}`);
  }
  console.log('');
  const k = of('shim, daemon killed');
  console.log(`2. daemon SIGKILLed after its ${KILL_AFTER}th ADD served (one network; DELs through a restarted daemon)`);
  console.log(`   ADD/s ${rate('shim, daemon killed', 'add')} (vs host-local ×1: ${ratio('shim, daemon killed', 'host-local ×1', 'add')}); ADD ${lat('shim, daemon killed', 'addMs')}`);
  console.log(`   per round: daemon-served ADDs logged ${k.map((s) => s.served).join(' ')}; fallbacks ${k.map((s) => s.fallbacks).join(' ')}`);
} finally {
  for (const d of daemons) await d.stop();
}
