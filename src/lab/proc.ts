/**
 * Small process and /proc helpers for the lab (Linux only). Processes are always identified by
 * pid plus an exact check of their argv or cgroup — never by a name pattern.
 */
import { execFile } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';

/** Output of a finished command. */
export interface RunResult {
  stdout: string;
  stderr: string;
}

/**
 * Runs `cmd args` (no shell) and resolves with its output.
 * @throws Error `"<cmd> <args> failed (exit N): <stderr>"` when it exits non-zero or cannot start.
 */
export function run(cmd: string, args: string[], opts: { timeoutSeconds?: number; env?: NodeJS.ProcessEnv } = {}): Promise<RunResult> {
  return new Promise((resolve, reject) => {
    execFile(
      cmd,
      args,
      { timeout: (opts.timeoutSeconds ?? 60) * 1000, maxBuffer: 64 * 1024 * 1024, env: opts.env ?? process.env },
      (err, stdout, stderr) => {
        if (err) {
          const code = (err as { code?: unknown }).code;
          const why = String(stderr).trim() || err.message;
          reject(new Error(`${cmd} ${args.join(' ')} failed (exit ${String(code)}): ${why}`, { cause: err }));
        } else {
          resolve({ stdout: String(stdout), stderr: String(stderr) });
        }
      },
    );
  });
}

/** argv of process `pid` (from /proc/<pid>/cmdline), or undefined when it is gone. */
export function argvOf(pid: number): string[] | undefined {
  try {
    const raw = readFileSync(`/proc/${pid}/cmdline`, 'utf8');
    if (raw === '') return []; // kernel thread or zombie
    return raw.replace(/\0$/, '').split('\0');
  } catch {
    return undefined;
  }
}

/** Cgroup paths of process `pid` (one per hierarchy line of /proc/<pid>/cgroup). */
export function cgroupsOf(pid: number): string[] {
  try {
    return readFileSync(`/proc/${pid}/cgroup`, 'utf8')
      .split('\n')
      .filter((l) => l !== '')
      .map((l) => l.slice(l.indexOf(':', l.indexOf(':') + 1) + 1));
  } catch {
    return [];
  }
}

/** Every numeric pid in /proc, except our own. */
export function allPids(): number[] {
  return readdirSync('/proc')
    .filter((n) => /^\d+$/.test(n))
    .map(Number)
    .filter((p) => p !== process.pid);
}

/** True while `pid` exists and is not a zombie. */
export function isAlive(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // state is the field after the parenthesised comm (which may contain spaces)
    const state = stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3);
    return state !== 'Z' && state !== 'X';
  } catch {
    return false;
  }
}

/** Sends `signal` to `pid`, ignoring "no such process". */
export function signal(pid: number, sig: NodeJS.Signals): void {
  try {
    process.kill(pid, sig);
  } catch {
    // already gone
  }
}

/** Resolves once none of `pids` is alive, or after `timeoutSeconds`; returns those still alive. */
export async function waitGone(pids: number[], timeoutSeconds: number): Promise<number[]> {
  const until = Date.now() + timeoutSeconds * 1000;
  for (;;) {
    const alive = pids.filter(isAlive);
    if (alive.length === 0 || Date.now() >= until) return alive;
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** SIGKILLs `pids` and waits (up to 5 s) until they are gone. */
export async function killAndWait(pids: number[]): Promise<void> {
  for (const p of pids) signal(p, 'SIGKILL');
  await waitGone(pids, 5);
}
