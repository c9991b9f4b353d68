/**
 * Killing a child process from a synchronous `process.on('exit')` cleanup, where no event loop
 * runs: SIGKILL it by pid, then wait — synchronously, bounded — until it is dead, so that what
 * the cleanup removes next (its directories) is not written to any more. A process killed while
 * in a system call may finish that call (one more file created); an `rm -r` racing it fails with
 * ENOTEMPTY.
 */
import { readFileSync } from 'node:fs';

/**
 * SIGKILL `pid` (nothing when it is gone already) and wait until it is dead: gone from /proc, or a
 * zombie (`Z`: dead, not yet reaped — a child of this process is not reaped while it exits, so its
 * pid cannot be reused meanwhile). Waits at most `maxMs` milliseconds (default 5000) in 10 ms
 * steps (Atomics.wait). Only for pids this process started. Never throws.
 */
export function sigkillAndWaitSync(pid: number, maxMs = 5000): void {
  try {
    process.kill(pid, 'SIGKILL');
  } catch {
    return; // already gone
  }
  const sleeper = new Int32Array(new SharedArrayBuffer(4));
  for (let waited = 0; waited < maxMs; waited += 10) {
    let stat: string;
    try {
      stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    } catch {
      return; // gone
    }
    // proc(5): "pid (comm) state ...": comm may hold spaces and parentheses; the state follows the last ")".
    const state = stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3);
    if (state === 'Z' || state === 'X') return;
    Atomics.wait(sleeper, 0, 0, 10);
  }
}
