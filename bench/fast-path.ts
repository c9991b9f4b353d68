/**
 * Fast-path benchmark (issue 9): the per-pod cost of ADD+DEL through the installed shim with the
 * daemon up, against upstream host-local (Go), and the fallback path (shim, daemon down) against
 * the Node floor and the standalone plugin alone. Run as root after `npm run build`:
 *
 *     node --import tsx bench/fast-path.ts        # BENCH_FAST_ROUNDS (default 40), BENCH_FAST_WARMUP (5)
 *
 * Method (as ../shared/reference/fast-path-measurements.md, "Method"): a tiny C harness
 * (bench/xbench.c, built here with gcc) times each exec from just before `posix_spawn` to just
 * after `waitpid`, so Node's own spawn machinery (≈ 1 ms, it would be added to every variant and
 * pull every ratio towards 1) is not in the numbers. Every exec gets a clean environment: only
 * PATH and the CNI_* variables (an inherited NODE_EXTRA_CA_CERTS alone makes Node start ≈ 2.9×
 * slower); stdin is the config file, stdout/stderr /dev/null; every exit status is checked.
 *
 * Groups (each its own data directory, so one group never sees another's files): an ADD then a
 * DEL of the same container (`c<round>`), so each directory returns to its start state; the Node
 * floor is one `node -e 0`. Every round runs every group once, rotating which group starts.
 * Warm-up rounds are not counted. A ratio is the median of the per-round ratios, with its IQR
 * (25th–75th percentile); medians in ms are printed so the ratios can be checked.
 *
 * Rows: shim + daemon vs host-local on an empty /24 and on a /24 with 110 live reservations
 * (target ≤ 0.7× per pod); fallback (shim, daemon down) vs `node -e 0` and vs the standalone.
 * Prints ratios only; asserts nothing (benchmarks are never part of `npm test`).
 */
import { execFileSync, spawn } from 'node:child_process';
import { chmodSync, existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { cpus, release } from 'node:os';
import { join } from 'node:path';
import { HOST_LOCAL, ROOT } from '../test/helpers/cni.ts';
import { startTestDaemon, type TestDaemon } from '../test/helpers/daemon.ts';
import { rng } from '../test/helpers/rng.ts';

const ROUNDS = Number(process.env['BENCH_FAST_ROUNDS'] ?? 40);
const WARMUP = Number(process.env['BENCH_FAST_WARMUP'] ?? 5);
const LIVE = 110;
const SUBNET = '10.87.201.0/24';
const NET = 'fastbench';
const NODE = '/usr/bin/node';
/**
 * Optional: another build's daemon bundle (e.g. a copy of main's `dist/ipwarden.cjs`, with its
 * `ipwarden-flock.node` beside it) served on a second socket, so a before/after comparison of the
 * daemon's per-pod path is taken in the same interleaved run (rows "shim+baseline daemon").
 */
const BASELINE = process.env['BENCH_FAST_BASELINE'] ?? '';
/** `--warm-up` of the daemon under test (`BENCH_WARM_UP`; default the daemon's own, 2,000 pairs; 0 measures a cold daemon). */
const WARM_UP = Number(process.env['BENCH_WARM_UP'] ?? 2000);

/** One exec of a group: argv, stdin file, environment (exactly). */
interface Step {
  bin: string;
  args: string[];
  stdin: string;
  env: Record<string, string>;
}
/** A group: its steps run in order each round; their times are reported per step and summed. */
interface Group {
  name: string;
  steps: (round: number) => Step[];
}

/** Median of `xs` (0 for none). */
function median(xs: readonly number[]): number {
  return quantile(xs, 0.5);
}
/** Linear-interpolated quantile `q` ∈ [0, 1] of `xs`. */
function quantile(xs: readonly number[], q: number): number {
  if (xs.length === 0) return 0;
  const s = [...xs].sort((a, b) => a - b);
  const pos = (s.length - 1) * q;
  const lo = Math.floor(pos);
  const hi = Math.ceil(pos);
  return (s[lo] as number) + ((s[hi] as number) - (s[lo] as number)) * (pos - lo);
}

/** Run the harness over `steps`; resolves with ms per step. Throws on a non-zero exit status. */
function xbench(harness: string, steps: Step[], what: string): Promise<number[]> {
  const argv: string[] = [];
  for (const s of steps) {
    const env = Object.entries(s.env).map(([k, v]) => `${k}=${v}`);
    argv.push(s.bin, s.stdin, String(s.args.length), ...s.args, String(env.length), ...env);
  }
  return new Promise((resolve, reject) => {
    const p = spawn(harness, argv, { env: { PATH: '/usr/bin:/bin' }, stdio: ['ignore', 'pipe', 'inherit'] });
    let out = '';
    p.stdout.on('data', (c: Buffer) => (out += c.toString('utf8')));
    p.on('error', reject);
    p.on('close', (code) => {
      if (code !== 0) return reject(new Error(`xbench exited ${code} for ${what}`));
      const rows = out.trim().split('\n').map((l) => l.split(' ').map(Number));
      const bad = rows.findIndex((r) => r[1] !== 0);
      if (rows.length !== steps.length || bad >= 0) return reject(new Error(`${what}: step ${bad} exited ${rows[bad]?.[1]} (${steps[bad]?.bin} ${steps[bad]?.env['CNI_COMMAND'] ?? ''})`));
      resolve(rows.map((r) => (r[0] as number) / 1e6));
    });
  });
}

const cniEnv = (command: string, id: string): Record<string, string> => ({
  PATH: '/usr/bin:/bin',
  CNI_COMMAND: command,
  CNI_CONTAINERID: id,
  CNI_IFNAME: 'eth0',
  CNI_NETNS: command === 'ADD' ? '/var/run/netns/ipw-fastbench' : '',
  CNI_PATH: '/usr/lib/cni',
});

const root = mkdtempSync('/tmp/ipw-fastbench-');
let daemon: TestDaemon | null = null;
let baseDaemon: TestDaemon | null = null;
const cleanup = (): void => {
  rmSync(root, { recursive: true, force: true });
};
process.on('exit', cleanup);

try {
  if (process.getuid?.() !== 0) throw new Error('run as root (the daemon socket directory must be owned by root)');
  if (!existsSync(HOST_LOCAL)) throw new Error(`needs upstream host-local at ${HOST_LOCAL}`);
  const bundle = join(ROOT, 'dist/ipwarden.cjs');
  if (!existsSync(bundle)) throw new Error('run "npm run build" first');

  const harness = join(root, 'xbench');
  execFileSync('gcc', ['-O2', '-Wall', '-Wextra', '-Werror', '-o', harness, join(ROOT, 'bench/xbench.c')], { stdio: 'inherit' });

  // Two installs (clean env): one whose shim talks to the daemon, one whose socket nobody serves.
  const install = (name: string): { bin: string; standalone: string; socket: string } => {
    const binDir = join(root, `bin-${name}`);
    const sockDir = join(root, `run-${name}`);
    mkdirSync(binDir);
    mkdirSync(sockDir, { mode: 0o700 });
    chmodSync(sockDir, 0o700);
    const socket = join(sockDir, 'plugin.sock');
    execFileSync(NODE, [bundle, 'install-cni', '--dest', binDir, '--socket', socket], { env: { PATH: '/usr/bin:/bin' }, stdio: 'pipe' });
    return { bin: join(binDir, 'ipwarden'), standalone: join(binDir, 'ipwarden-standalone'), socket };
  };
  const up = install('up');
  const down = install('down');
  // The daemon as deployed: its warm-up (--warm-up, default 2,000 pairs) done before the rounds.
  daemon = await startTestDaemon({ socket: up.socket, logLevel: 'info', args: ['--interval', '1h', '--metrics-address', '127.0.0.1:0', '--warm-up', String(WARM_UP)] });
  if (WARM_UP > 0) {
    const warmed = await daemon.waitForLog((l) => /^warm-up (done|stopped|cut short)/.test(l.msg));
    if (warmed.msg !== 'warm-up done') throw new Error(`the daemon's warm-up did not complete: ${JSON.stringify(warmed)}`);
  }
  const base = BASELINE === '' ? null : install('base');
  if (base !== null) baseDaemon = await startTestDaemon({ bundle: BASELINE, socket: base.socket, logLevel: 'info', args: ['--interval', '1h', '--metrics-address', '127.0.0.1:0'] });

  // Config files, one data directory per group; the "live" directories hold 110 reservations of
  // other containers at seeded random addresses (the same set in both), as host-local writes them.
  const conf = (group: string, type: string): string => {
    const dataDir = join(root, `data-${group}`);
    const file = join(root, `conf-${group}.json`);
    writeFileSync(file, JSON.stringify({ cniVersion: '1.0.0', name: NET, ipam: { type, dataDir, ranges: [[{ subnet: SUBNET }]] } }));
    return file;
  };
  const populate = (group: string): void => {
    const dir = join(root, `data-${group}`, NET);
    mkdirSync(dir, { recursive: true });
    const rand = rng(110);
    const free = Array.from({ length: 253 }, (_, i) => i + 2); // .1 is the gateway
    for (let n = 0; n < LIVE; n++) {
      const host = free.splice(Math.floor(rand() * free.length), 1)[0] as number;
      writeFileSync(join(dir, `10.87.201.${host}`), `live-${n}\r\neth0`, { mode: 0o600 });
    }
  };
  populate('hl-live');
  populate('ipw-live');

  /** ADD then DEL of container `<prefix><round>` (the prefix tells the daemon's log lines apart). */
  const pod = (bin: string, stdin: string, prefix: string) => (round: number): Step[] => [
    { bin, args: [], stdin, env: cniEnv('ADD', `${prefix}${round}`) },
    { bin, args: [], stdin, env: cniEnv('DEL', `${prefix}${round}`) },
  ];
  const groups: Group[] = [
    { name: 'host-local', steps: pod(HOST_LOCAL, conf('hl', 'host-local'), 'hl') },
    { name: 'shim+daemon', steps: pod(up.bin, conf('ipw', 'ipwarden'), 'ipw') },
    { name: 'host-local, 110 live', steps: pod(HOST_LOCAL, conf('hl-live', 'host-local'), 'hll') },
    { name: 'shim+daemon, 110 live', steps: pod(up.bin, conf('ipw-live', 'ipwarden'), 'ipwl') },
    { name: 'shim, daemon down', steps: pod(down.bin, conf('down', 'ipwarden'), 'down') },
    { name: 'standalone', steps: pod(up.standalone, conf('alone', 'ipwarden'), 'alone') },
    { name: 'node -e 0', steps: () => [{ bin: NODE, args: ['-e', '0'], stdin: '-', env: { PATH: '/usr/bin:/bin' } }] },
    ...(base === null ? [] : [{ name: 'shim+baseline daemon', steps: pod(base.bin, conf('base', 'ipwarden'), 'base') }]),
  ];

  /** times[group][step][round] in ms (counted rounds only). */
  const times = groups.map((g) => g.steps(0).map(() => [] as number[]));
  for (let round = 0; round < WARMUP + ROUNDS; round++) {
    for (let k = 0; k < groups.length; k++) {
      const gi = (round + k) % groups.length;
      const g = groups[gi] as Group;
      const ms = await xbench(harness, g.steps(round), `${g.name}, round ${round}`);
      if (round >= WARMUP) ms.forEach((v, s) => times[gi]?.[s]?.push(v));
    }
  }
  /** The daemon's own time per request (its 'request served' durationSeconds), counted rounds, ms. */
  const served = (prefix: string, command: string): number[] =>
    (daemon?.logs ?? [])
      .filter((l) => l.msg === 'request served' && l['command'] === command && new RegExp(`^${prefix}(\\d+)$`).test(String(l['containerId'])))
      .filter((l) => Number(/(\d+)$/.exec(String(l['containerId']))?.[1]) >= WARMUP)
      .map((l) => Number(l['durationSeconds']) * 1000);
  const inDaemon = {
    add: served('ipw', 'ADD'),
    del: served('ipw', 'DEL'),
    addLive: served('ipwl', 'ADD'),
    delLive: served('ipwl', 'DEL'),
  };
  await daemon.stop();
  daemon = null;
  if (baseDaemon !== null) await baseDaemon.stop();
  baseDaemon = null;

  const idx = (name: string): number => groups.findIndex((g) => g.name === name);
  const stepTimes = (name: string, step: number): number[] => times[idx(name)]?.[step] ?? [];
  const podTimes = (name: string): number[] => stepTimes(name, 0).map((v, r) => v + (stepTimes(name, 1)[r] ?? 0));
  const ratio = (a: number[], b: number[]): string => {
    const rs = a.map((v, r) => v / (b[r] as number));
    return `${median(rs).toFixed(3)} [${quantile(rs, 0.25).toFixed(3)}–${quantile(rs, 0.75).toFixed(3)}]`;
  };
  const ms = (xs: number[]): string => `${median(xs).toFixed(2)} ms`;
  const floor = stepTimes('node -e 0', 0);
  const twoFloors = floor.map((v) => 2 * v);

  console.log(`machine: ${cpus().length} × ${cpus()[0]?.model ?? '?'}, kernel ${release()}, node ${process.version}; ${new Date().toISOString()}`);
  console.log(`${ROUNDS} rounds (+${WARMUP} warm-up), ${groups.length} groups interleaved, start rotated; the daemon under test warmed itself up with ${WARM_UP} ADD+DEL pairs (--warm-up) before the rounds; ratio = median of per-round ratios [IQR]`);
  console.log('');
  console.log('1. per pod (ADD+DEL), shim with the daemon up vs upstream host-local (target ≤ 0.7)');
  for (const [ours, theirs] of [
    ['shim+daemon', 'host-local'],
    ['shim+daemon, 110 live', 'host-local, 110 live'],
    ...(base === null ? [] : ([['shim+baseline daemon', 'host-local']] as const)),
  ] as const) {
    console.log(`   ${ours.padEnd(24)} ADD ${ratio(stepTimes(ours, 0), stepTimes(theirs, 0))}  DEL ${ratio(stepTimes(ours, 1), stepTimes(theirs, 1))}  per pod ${ratio(podTimes(ours), podTimes(theirs))}`);
    console.log(`      medians: ours ADD ${ms(stepTimes(ours, 0))} DEL ${ms(stepTimes(ours, 1))}; ${theirs} ADD ${ms(stepTimes(theirs, 0))} DEL ${ms(stepTimes(theirs, 1))}`);
  }
  console.log(
    `   inside the daemon (its 'request served' durationSeconds, medians): ADD ${ms(inDaemon.add)} DEL ${ms(inDaemon.del)}; 110 live ADD ${ms(inDaemon.addLive)} DEL ${ms(inDaemon.delLive)} (${inDaemon.add.length + inDaemon.del.length + inDaemon.addLive.length + inDaemon.delLive.length} requests)`,
  );
  if (base !== null) {
    console.log(`   this build ÷ baseline daemon (${BASELINE}): ADD ${ratio(stepTimes('shim+daemon', 0), stepTimes('shim+baseline daemon', 0))}  DEL ${ratio(stepTimes('shim+daemon', 1), stepTimes('shim+baseline daemon', 1))}  per pod ${ratio(podTimes('shim+daemon'), podTimes('shim+baseline daemon'))}`);
  }
  console.log('');
  console.log('2. fallback path: shim, daemon down (→ standalone), vs the Node floor and vs the standalone alone');
  console.log(`   ADD vs node -e 0              ${ratio(stepTimes('shim, daemon down', 0), floor)}`);
  console.log(`   DEL vs node -e 0              ${ratio(stepTimes('shim, daemon down', 1), floor)}`);
  console.log(`   per pod vs 2 × node -e 0      ${ratio(podTimes('shim, daemon down'), twoFloors)}`);
  console.log(`   per pod vs standalone alone   ${ratio(podTimes('shim, daemon down'), podTimes('standalone'))}`);
  console.log(`   standalone per pod vs 2 × node -e 0  ${ratio(podTimes('standalone'), twoFloors)}`);
  console.log(`   per pod vs host-local (empty) ${ratio(podTimes('shim, daemon down'), podTimes('host-local'))}`);
  console.log(`      medians: fallback ADD ${ms(stepTimes('shim, daemon down', 0))} DEL ${ms(stepTimes('shim, daemon down', 1))}; standalone ADD ${ms(stepTimes('standalone', 0))} DEL ${ms(stepTimes('standalone', 1))}; node -e 0 ${ms(floor)}`);
} finally {
  if (daemon !== null) await daemon.stop();
  if (baseDaemon !== null) await baseDaemon.stop();
  cleanup();
}
