/**
 * libfaketime's leftovers. libfaketime 0.9.10 (Debian `faketime`) — the `faketime` wrapper, and the
 * library preloaded by itself — creates a POSIX semaphore and a shared memory object per process,
 * `/dev/shm/sem.faketime_sem_<pid>` and `/dev/shm/faketime_shm_<pid>`, and removes them only when
 * that process exits normally. A process killed by a signal leaves them behind; with `pid_max`
 * 32768 (this machine) pids come round again soon, and a later `faketime` whose pid meets a
 * leftover fails with `faketime: sem_open: File exists` (seen in CI after the Jepsen runs, which
 * kill -9 preloaded processes by the thousand).
 */
import { readdirSync, rmSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { alive } from './cni.ts';

const SHM = '/dev/shm';
const LEFTOVER = /^(?:sem\.faketime_sem|faketime_shm)_(\d+)$/;

/**
 * Remove libfaketime's objects of processes that no longer exist, modified at or after `sinceMs`
 * (ms since the epoch; 0: any age). A live process's objects are never touched. Returns how many
 * files were removed.
 */
export function sweepFaketimeLeftovers(sinceMs = 0): number {
  let names: string[];
  try {
    names = readdirSync(SHM);
  } catch {
    return 0;
  }
  let removed = 0;
  for (const n of names) {
    const m = LEFTOVER.exec(n);
    if (m === null || alive(Number(m[1]))) continue;
    const p = join(SHM, n);
    try {
      if (statSync(p).mtimeMs < sinceMs) continue;
      rmSync(p, { force: true });
      removed++;
    } catch {
      // gone meanwhile
    }
  }
  return removed;
}
