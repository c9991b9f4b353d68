/**
 * Start many plugin executables at once and time each (test/helpers/xburst.c, compiled with gcc
 * into a temp dir once per process): the harness posix_spawns every exec back to back and reaps
 * them all, so the burst is as simultaneous as a runtime starting many pods, and Node's own spawn
 * machinery and event loop are in no exec's time. Used by test/interop/burst.test.ts and
 * bench/burst.ts.
 */
import { execFileSync, spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ROOT } from './cni.ts';

/** One exec of a burst: the executable, its stdin file, its whole environment. */
export interface BurstStep {
  bin: string;
  /** Path of the file given as fd 0. */
  stdin: string;
  env: Record<string, string>;
}

/** What one exec did. Times are ms from the burst's first spawn. */
export interface BurstExec {
  exitCode: number;
  /** Its stdout (empty when the burst was run without capturing). */
  stdout: string;
  stderr: string;
  /** Just before its posix_spawn. */
  startMs: number;
  /** Just after its waitpid. */
  endMs: number;
  /** endMs − startMs: the exec's whole time as a runtime would see it. */
  ms: number;
}

/** A whole burst: each exec in step order, and the time from the first spawn to the last exit. */
export interface Burst {
  execs: BurstExec[];
  wallMs: number;
  /** CPU time (user + system) of all the execs together and whatever they ran, ms (getrusage). */
  cpuMs: number;
}

let harness: string | null = null;

/** The compiled harness (gcc, once per process; its directory is removed at exit). */
function xburst(): string {
  if (harness !== null) return harness;
  const dir = mkdtempSync(join(tmpdir(), 'ipw-xburst-'));
  process.on('exit', () => rmSync(dir, { recursive: true, force: true }));
  const out = join(dir, 'xburst');
  execFileSync('gcc', ['-O2', '-Wall', '-Wextra', '-Werror', '-o', out, join(ROOT, 'test/helpers/xburst.c')], { stdio: 'pipe' });
  harness = out;
  return out;
}

/**
 * Run `steps` all at once and resolve when every exec has exited. With `capture` (default true)
 * each exec's stdout and stderr are kept (through files in a temp dir, removed before resolving);
 * without, they go to /dev/null. Rejects when the harness fails (a spawn error), never because of
 * an exec's exit status.
 */
export function runBurst(steps: readonly BurstStep[], capture = true): Promise<Burst> {
  const bin = xburst();
  const outDir = capture ? mkdtempSync(join(tmpdir(), 'ipw-burst-out-')) : '-';
  const argv: string[] = [outDir];
  for (const s of steps) {
    const env = Object.entries(s.env).map(([k, v]) => `${k}=${v}`);
    argv.push(s.bin, s.stdin, String(env.length), ...env);
  }
  return new Promise<Burst>((resolve, reject) => {
    const p = spawn(bin, argv, { env: { PATH: '/usr/bin:/bin' }, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    p.stdout.on('data', (c: Buffer) => (out += c.toString('utf8')));
    p.stderr.on('data', (c: Buffer) => (err += c.toString('utf8')));
    p.on('error', reject);
    p.on('close', (code) => {
      try {
        if (code !== 0) throw new Error(`xburst exited ${code}: ${err}`);
        const lines = out.trim().split('\n');
        const cpu = (lines.pop() ?? '').split(' ');
        if (cpu[0] !== 'cpu') throw new Error(`xburst printed no cpu line: ${out.slice(-200)}`);
        const rows = lines.map((l) => l.split(' ').map(Number));
        if (rows.length !== steps.length) throw new Error(`xburst reported ${rows.length} of ${steps.length} execs`);
        const execs = rows.map((r, i): BurstExec => {
          const startMs = (r[1] as number) / 1e6;
          const endMs = (r[2] as number) / 1e6;
          return {
            exitCode: r[3] as number,
            stdout: capture ? readFileSync(join(outDir, `${i}.out`), 'utf8') : '',
            stderr: capture ? readFileSync(join(outDir, `${i}.err`), 'utf8') : '',
            startMs,
            endMs,
            ms: endMs - startMs,
          };
        });
        resolve({ execs, wallMs: Math.max(0, ...execs.map((e) => e.endMs)), cpuMs: (Number(cpu[1]) + Number(cpu[2])) / 1e6 });
      } catch (e) {
        reject(e instanceof Error ? e : new Error(String(e)));
      } finally {
        if (capture) rmSync(outDir, { recursive: true, force: true });
      }
    });
  });
}

/** The q-quantile of `xs` by nearest rank (q = 0.99: the value 99 % of the samples do not exceed); 0 for none. */
export function nearestRank(xs: readonly number[], q: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil(q * s.length) - 1))] ?? 0;
}
