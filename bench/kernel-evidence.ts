/**
 * Cost of `readKernelEvidence()` on a busy node, side by side with what an operator's `ps` costs on
 * the same node in the same run. Not a test; run as root:
 *
 *     node --import tsx bench/kernel-evidence.ts
 *
 * Builds NS network namespaces (default 300; half held by a sleeping process inside, half pinned
 * only, each with a bridge holding one IPv4 and one IPv6 address) plus EXTRA sleeping processes
 * (default 2,000), then measures, interleaved, RUNS times (default 9): `readKernelEvidence()` (in
 * this process), `ps -e -o pid=,comm=` (spawned), and the two halves of the evidence apart
 * (processes only, `netnsDirs: []`; the pinned-namespace helper alone), and the daemon's kernel
 * address index read (src/node/kernel-index.ts: addresses only, `inFlight: false`), synchronous and
 * as the daemon runs it (`readKernelEvidenceAsync`: wall time, and the longest time the event loop
 * was held, measured by a `setImmediate` chain beside it, against the same chain idle for as long).
 * Prints medians (ms), the ratio to `ps`,
 * and the counts. Everything it made (processes by pid, namespaces by name) is
 * removed afterwards, also on an error or Ctrl-C. Env: BENCH_NS, BENCH_EXTRA, BENCH_RUNS.
 */
import { spawn, spawnSync } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { readlinkSync } from 'node:fs';
import { cpus } from 'node:os';
import { readKernelEvidence, readKernelEvidenceAsync, readPinnedNamespaces } from '../src/node/kernel-evidence.ts';

const NS = Number(process.env['BENCH_NS'] ?? 300);
const EXTRA = Number(process.env['BENCH_EXTRA'] ?? 2000);
const RUNS = Number(process.env['BENCH_RUNS'] ?? 9);
const PREFIX = `ke-bench-${process.pid}-`;

const children: ChildProcess[] = [];
const namespaces: string[] = [];

function say(s: string): void {
  process.stdout.write(`${s}\n`);
}

function ipBatch(args: string[], lines: string[]): void {
  const r = spawnSync('ip', [...args, '-b', '-'], { input: `${lines.join('\n')}\n`, encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`ip ${args.join(' ')} -b: ${r.stderr.trim()}`);
}

let cleaned = false;
function cleanup(): void {
  if (cleaned) return;
  cleaned = true;
  let killed = 0;
  for (const c of children) {
    if (c.pid !== undefined && c.exitCode === null && c.signalCode === null) {
      try {
        process.kill(c.pid, 'SIGKILL');
        killed++;
      } catch {
        // already gone
      }
    }
  }
  if (namespaces.length > 0) spawnSync('ip', ['-force', '-b', '-'], { input: `${namespaces.map((n) => `netns del ${n}`).join('\n')}\n` });
  say(`cleanup: killed ${killed} processes, deleted ${namespaces.length} namespaces`);
}

function onSignal(sig: NodeJS.Signals): void {
  cleanup();
  process.off('SIGINT', onSignal);
  process.off('SIGTERM', onSignal);
  process.kill(process.pid, sig);
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 === 1 ? (s[m] ?? 0) : ((s[m - 1] ?? 0) + (s[m] ?? 0)) / 2;
}

function ms(t0: bigint): number {
  return Number(process.hrtime.bigint() - t0) / 1e6;
}

/**
 * Let the event loop poll once, so a Ctrl-C is handled now: the setup and the measurements are
 * synchronous, and 'spawn' events arrive on nextTick, so without this the SIGINT listener would
 * only run after the whole bench.
 */
function tick(): Promise<void> {
  return new Promise((resolve) => setImmediate(resolve));
}

/**
 * The longest gap between `setImmediate` callbacks over `forMs` with nothing else to do, ms: what
 * the machine's own scheduling (other processes on the cores) costs, the baseline of a stall.
 */
async function idleStall(forMs: number): Promise<number> {
  let maxGap = 0;
  let lastT = process.hrtime.bigint();
  const end = lastT + BigInt(Math.round(forMs * 1e6));
  await new Promise<void>((resolve) => {
    const spin = (): void => {
      const t = process.hrtime.bigint();
      maxGap = Math.max(maxGap, Number(t - lastT) / 1e6);
      lastT = t;
      if (t < end) setImmediate(spin);
      else resolve();
    };
    setImmediate(spin);
  });
  return maxGap;
}

/** One `readKernelEvidenceAsync({ inFlight: false })`: its wall time and the longest event-loop stall during it, ms. */
async function indexRead(): Promise<{ wall: number; stall: number }> {
  let running = true;
  let maxGap = 0;
  let lastT = process.hrtime.bigint();
  const spin = (): void => {
    const t = process.hrtime.bigint();
    maxGap = Math.max(maxGap, Number(t - lastT) / 1e6);
    lastT = t;
    if (running) setImmediate(spin);
  };
  setImmediate(spin);
  const t0 = process.hrtime.bigint();
  await readKernelEvidenceAsync({ inFlight: false });
  const wall = ms(t0);
  running = false;
  return { wall, stall: maxGap };
}

function spawned(c: ChildProcess): Promise<void> {
  return new Promise((resolve, reject) => {
    c.once('spawn', () => resolve());
    c.once('error', reject);
  });
}

async function setup(): Promise<void> {
  const t0 = process.hrtime.bigint();
  const names = Array.from({ length: NS }, (_, i) => `${PREFIX}${i}`);
  namespaces.push(...names);
  ipBatch([], names.map((n) => `netns add ${n}`));
  for (const [i, n] of names.entries()) {
    ipBatch(['-n', n], ['link add kebr0 type bridge', 'link set kebr0 up', `addr add 10.252.${(i + 1) >> 8}.${(i + 1) & 255}/16 dev kebr0`, `addr add fd00:6b65:b::${(i + 1).toString(16)}/64 dev kebr0 nodad`]);
    await tick();
  }
  // Half the namespaces get a process inside; `ip netns exec` execs sleep in the same pid.
  // Listen for 'spawn' right away: it is emitted on nextTick, so during a tick() it would be missed.
  const ready: Promise<void>[] = [];
  const held: ChildProcess[] = [];
  for (let i = 0; i < NS; i += 2) {
    const c = spawn('ip', ['netns', 'exec', names[i] as string, 'sleep', '100000'], { stdio: 'ignore' });
    children.push(c);
    ready.push(spawned(c));
    held.push(c);
  }
  for (let i = 0; i < EXTRA; i++) {
    const c = spawn('sleep', ['100000'], { stdio: 'ignore' });
    children.push(c);
    ready.push(spawned(c));
    if (i % 100 === 99) await tick();
  }
  await Promise.all(ready);
  // Wait until every holder is inside its namespace.
  const own = readlinkSync('/proc/self/ns/net');
  for (const c of held) {
    for (let k = 0; k < 500 && readlinkSync(`/proc/${c.pid}/ns/net`) === own; k++) await new Promise((r) => setTimeout(r, 10));
  }
  say(`setup: ${NS} namespaces (${held.length} with a process, ${NS - held.length} pinned only), ${EXTRA} extra sleeping processes, in ${(ms(t0) / 1000).toFixed(1)} s`);
}

async function main(): Promise<void> {
  if (process.getuid?.() !== 0) {
    say('bench/kernel-evidence.ts needs root');
    process.exitCode = 1;
    return;
  }
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);
  say(`Node ${process.version}, ${cpus().length} CPUs, ${RUNS} interleaved runs`);
  await setup();

  const pinnedFiles = namespaces.filter((_, i) => i % 2 === 1).map((n) => `/run/netns/${n}`);
  const full: number[] = [];
  const ps: number[] = [];
  const procsOnly: number[] = [];
  const helper: number[] = [];
  const indexSync: number[] = [];
  const indexWall: number[] = [];
  const indexStall: number[] = [];
  const baseStall: number[] = [];
  let last = readKernelEvidence(); // warm-up (module code, page cache)
  let psLines = 0;
  for (let r = 0; r < RUNS; r++) {
    await tick();
    let t0 = process.hrtime.bigint();
    last = readKernelEvidence();
    full.push(ms(t0));
    t0 = process.hrtime.bigint();
    const p = spawnSync('ps', ['-e', '-o', 'pid=,comm='], { encoding: 'utf8', maxBuffer: 64 * 1024 * 1024 });
    ps.push(ms(t0));
    if (p.status !== 0) throw new Error(`ps: ${p.stderr}`);
    psLines = p.stdout.split('\n').filter((l) => l !== '').length;
    t0 = process.hrtime.bigint();
    readKernelEvidence({ netnsDirs: [] });
    procsOnly.push(ms(t0));
    t0 = process.hrtime.bigint();
    readPinnedNamespaces(pinnedFiles);
    helper.push(ms(t0));
    t0 = process.hrtime.bigint();
    readKernelEvidence({ inFlight: false });
    indexSync.push(ms(t0));
    const a = await indexRead();
    indexWall.push(a.wall);
    indexStall.push(a.stall);
    baseStall.push(await idleStall(a.wall));
  }
  const mine = last.addresses.size;
  const ours = [...last.addresses.keys()].filter((ip) => ip.startsWith('10.252.') || ip.startsWith('fd00:6b65:b::')).length;
  const mPs = median(ps);
  const row = (name: string, xs: number[]): string => `  ${name.padEnd(44)} ${median(xs).toFixed(1).padStart(8)} ms  ${(median(xs) / mPs).toFixed(2).padStart(6)} × ps   (min ${Math.min(...xs).toFixed(1)}, max ${Math.max(...xs).toFixed(1)})`;
  say(`\nmedian of ${RUNS}:`);
  say(row('readKernelEvidence()', full));
  say(row('ps -e -o pid=,comm= (spawned)', ps));
  say(row('  of which: processes only (netnsDirs: [])', procsOnly));
  say(row(`  of which: helper for ${pinnedFiles.length} pinned namespaces`, helper));
  say(row('kernel index read, sync ({ inFlight: false })', indexSync));
  say(row('kernel index read, async (the daemon), wall', indexWall));
  say(row('  longest event-loop stall during it', indexStall));
  say(row('  the same, idle for as long (baseline)', baseStall));
  say(`\ncounts: ${last.processes} processes (ps: ${psLines}), ${last.namespaces} namespaces, ${mine} addresses (${ours} of the bench's ${NS * 2}), in flight ${last.inFlight.size}, incomplete: ${last.incomplete ?? 'null'}`);
}

try {
  await main();
} catch (e) {
  process.exitCode = 1;
  say(`bench failed: ${e instanceof Error ? e.message : String(e)}`);
} finally {
  cleanup();
}
