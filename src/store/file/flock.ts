/**
 * Exclusive `flock(2)` on a lock file: the lock host-local takes on `DIR/lock`
 * (plugins/ipam/host-local/backend/disk/lock.go, through alexflint/go-filemutex
 * `filemutex_flock.go`). flock locks belong to the open file description, so the upstream Go binary
 * and ipwarden exclude each other as long as both flock the same file.
 */
import { closeSync, constants as fsConstants, openSync } from 'node:fs';
import { AppError, errnoCode } from '../../common/errors.ts';
/** Signature of fs-ext's `flockSync`. */
type FlockSync = (fd: number, flags: 'sh' | 'ex' | 'shnb' | 'exnb' | 'un') => void;

let loadedFlock: FlockSync | undefined;

/**
 * The native `flockSync`, loaded on the first lock: commands that take no lock (VERSION) work even
 * when the binding is missing, and a missing binding becomes a CNI error document instead of a
 * crash at start-up. Throws `AppError('STORE_IO')` naming the file when it cannot be loaded (e.g.
 * the executable was copied without `ipwarden-flock.node`).
 */
async function loadFlock(): Promise<FlockSync> {
  if (loadedFlock !== undefined) return loadedFlock;
  try {
    loadedFlock = (await import('./fs-ext.ts')).flockSync;
    return loadedFlock;
  } catch (e) {
    const why = (e instanceof Error ? e.message : String(e)).split('\n')[0];
    throw new AppError('STORE_IO', `cannot load the flock binding (ipwarden-flock.node beside the plugin): ${why}`, { cause: e });
  }
}

/**
 * Can the native flock binding be loaded (`ipwarden-flock.node` beside the program, built for this
 * Node's module ABI)? Resolves to null when it loads, else the STORE_IO message a lock would fail
 * with. `install-cni` checks it through `ipwarden-standalone version` before it installs the shim.
 */
export async function flockBindingProblem(): Promise<string | null> {
  try {
    await loadFlock();
    return null;
  } catch (e) {
    return e instanceof Error ? e.message : String(e);
  }
}

/**
 * Mode the lock file is created with when missing. go-filemutex `New` opens it with
 * `O_CREAT|O_RDONLY` and permission `mkdirPerm = 0750` (filemutex_flock.go); we use the same so
 * the file looks the same whoever created it first (the umask still applies).
 */
export const LOCK_FILE_MODE = 0o750;

/** First pause between two non-blocking attempts, milliseconds (doubles after each attempt). */
export const LOCK_POLL_START_MS = 1;
/** Largest pause between two non-blocking attempts, milliseconds. */
export const LOCK_POLL_MAX_MS = 20;

/** A held lock. `release()` is idempotent and never throws (closing the fd drops the lock anyway). */
export interface HeldLock {
  /** Path of the lock file. */
  readonly path: string;
  /** True until `release()` is called. */
  readonly held: boolean;
  /** Drop the lock (LOCK_UN) and close the file descriptor. */
  release(): void;
}

/** Injectable time source for {@link lockExclusive} (tests); defaults use the real clock. */
export interface LockClock {
  /** Current time, milliseconds (monotonic is enough). */
  now(): number;
  /** Resolve after `ms` milliseconds. */
  sleep(ms: number): Promise<void>;
}

const realClock: LockClock = {
  now: () => Date.now(),
  sleep: (ms) => new Promise((resolve) => setTimeout(resolve, ms)),
};

/**
 * Take an exclusive flock on `path` (created with {@link LOCK_FILE_MODE} if missing), waiting at
 * most `timeoutSeconds` (seconds, may be fractional; 0 = a single attempt). Polls with LOCK_NB and
 * a backoff from {@link LOCK_POLL_START_MS} doubling up to {@link LOCK_POLL_MAX_MS}, so the event
 * loop is never blocked.
 *
 * Throws `AppError('STORE_LOCK_TIMEOUT', 'timed out after <N>s waiting for the lock on <path>')`
 * (retryable, CNI 11) when the lock stays busy, and `AppError('STORE_IO')` when the file cannot be
 * opened or flock fails for any other reason (a lock failure is never ignored).
 */
export async function lockExclusive(
  path: string,
  timeoutSeconds: number,
  clock: LockClock = realClock,
): Promise<HeldLock> {
  if (!Number.isFinite(timeoutSeconds) || timeoutSeconds < 0) {
    throw new AppError('INTERNAL', `invalid lock timeout ${String(timeoutSeconds)}`);
  }
  const flockSync = await loadFlock();
  let fd: number;
  try {
    fd = openSync(path, fsConstants.O_CREAT | fsConstants.O_RDONLY, LOCK_FILE_MODE);
  } catch (e) {
    throw new AppError('STORE_IO', `cannot open lock file ${path}: ${describe(e)}`, { cause: e });
  }
  const deadline = clock.now() + timeoutSeconds * 1000;
  let pause = LOCK_POLL_START_MS;
  try {
    for (;;) {
      if (tryFlock(flockSync, fd, path)) return makeHeld(flockSync, path, fd);
      const left = deadline - clock.now();
      if (left <= 0) {
        throw new AppError('STORE_LOCK_TIMEOUT', `timed out after ${timeoutSeconds}s waiting for the lock on ${path}`, {
          retryable: true,
        });
      }
      await clock.sleep(Math.min(pause, left));
      pause = Math.min(pause * 2, LOCK_POLL_MAX_MS);
    }
  } catch (e) {
    closeQuietly(fd);
    throw e;
  }
}

/** One LOCK_EX|LOCK_NB attempt: true if taken, false if busy; throws STORE_IO on anything else. */
function tryFlock(flockSync: FlockSync, fd: number, path: string): boolean {
  try {
    flockSync(fd, 'exnb');
    return true;
  } catch (e) {
    const code = errnoCode(e);
    if (code === 'EAGAIN' || code === 'EWOULDBLOCK' || code === 'EINTR') return false;
    throw new AppError('STORE_IO', `cannot lock ${path}: ${describe(e)}`, { cause: e });
  }
}

function makeHeld(flockSync: FlockSync, path: string, fd: number): HeldLock {
  let open = true;
  return {
    path,
    get held() {
      return open;
    },
    release() {
      if (!open) return;
      open = false;
      try {
        flockSync(fd, 'un');
      } catch {
        // Closing the descriptor below releases the lock in any case.
      }
      closeQuietly(fd);
    },
  };
}

/** Close `fd`, ignoring errors (the descriptor is gone either way). */
export function closeQuietly(fd: number): void {
  try {
    closeSync(fd);
  } catch {
    // Nothing useful to do: the descriptor is gone either way.
  }
}

function describe(e: unknown): string {
  return e instanceof Error ? e.message : String(e);
}
