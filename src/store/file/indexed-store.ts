/**
 * The daemon's indexed file store (issue 9: "ADD on a fully reserved /16 ≤ 0.05× host-local; DEL
 * among 65,534 ≤ 0.05×"). A long-lived {@link NetworkIndexes} keeps one in-memory index per network
 * directory (`index-data.ts`); {@link NetworkIndexes.open} has the shape of `openFileStore` and
 * returns a {@link Store} whose every write is done by the real {@link FileStore} (same files,
 * same `DIR/lock`, byte-identical records), while reads and the allocator's fast path
 * ({@link Store.reservationIndex}) are answered from the index.
 *
 * ## Group commit (the fsyncs)
 *
 * A reservation's one fsync, of DIR, is not done under the lock: the request releases (or hands
 * on) the lock first, then waits in {@link NetworkIndexes.durable} for the flush round that covers
 * its write; the daemon answers the runtime only after that (`close()` resolves after it). Requests
 * of one network whose writes were done when a round began share its one fsync; the next queued
 * request works under the lock meanwhile. A DEL does no fsync (docs/on-disk-format.md "Crash
 * promises").
 *
 * ## Validation (under the lock)
 *
 * The first time a hold of `DIR/lock` needs the index, it `stat`s DIR (bigint: ino, mtime ns,
 * ctime ns) and compares with the stamp recorded right after our own last change:
 * - equal, and the stamp is not *suspect* (below) → the index is trusted (O(1));
 * - different, same ino → refresh by readdir diff: names that vanished are dropped, new names are
 *   read (one open/read/close each), unusable entries are re-read; leftover temporary files of
 *   killed writers are removed (FileStore's scan does the same under the lock). A directory with at
 *   most `fullRebuildBelow` IP-named entries (by default: every directory) is re-read completely
 *   instead (that also catches a name removed and re-created with another owner by another writer
 *   between two of our holds, which a names diff cannot see: Node's readdir gives no inode numbers);
 * - ino or birth time changed (DIR was removed and re-created; a re-used inode number on a file
 *   system without birth times, e.g. ext4 with 128-byte inodes, is caught only by the refresh),
 *   no index yet, or anything odd (DIR unreadable, not a directory) → full rebuild;
 *   if that fails too, the call is delegated to FileStore (its full scan, its errors) and the index
 *   is rebuilt on the next use.
 * A takeover of a held lock (below) needs no validation: nobody else could change DIR meanwhile.
 *
 * ## The linger rule (why an equal stamp proves "no change")
 *
 * Another writer's change is invisible to the stamp only if the file system gives it a time stamp
 * ≤ the stamp M we recorded (M = max(mtime, ctime) of DIR right after our own last change). The
 * kernel stamps from the coarse real-time clock (on 6.13+ kernels raised to the newest fine-grained
 * stamp handed out, "multigrain"), and a change to a queried directory gets a fine stamp, but tmpfs
 * stamps an unlink with the *removed inode's* time, which is coarse, and kernels before 6.13 stamp
 * everything coarsely (fast-path-measurements.md §3.2). Every other writer takes `DIR/lock` before
 * changing DIR (host-local does). So after a hold the store keeps holding the lock — `close()`
 * returns at once, so the daemon answers the runtime first — until the file system's clock has
 * passed M, **as the file system itself reports it**: the probe ({@link FsClock}, default
 * {@link realFsClock}) chmods `DIR/lock` to its own mode, which changes nothing but its ctime, and
 * reads that ctime back: V, the stamp a change made now gets on this file system (same clock, same
 * granularity as DIR). Stamps never decrease (bar a clock step), so once V > M, a later writer's
 * change gets a stamp ≥ V > M and an equal (ino, mtime, ctime) at our next acquisition proves that
 * nothing changed. A request for the same network arriving meanwhile takes the held lock over
 * without releasing it (no validation needed: the hold was continuous).
 *
 * Why not the wall clock (issue 17): the first version waited until `Date.now()` ≥ M + one tick +
 * 1 ms, assuming the coarse clock lags real time by less than one tick. It lags by up to two: the
 * timekeeper accumulates whole tick intervals, so the coarse value is the last accumulated boundary,
 * up to a tick before the interrupt that publishes it (measured here at HZ=250: lag up to 7.0 ms,
 * over 5 ms in 49% of samples), and more when a vCPU or the timekeeping CPU stalls (the kernel lets
 * another CPU take over only after 5 stalled ticks). A host-local DEL right after such a linger left
 * DIR's stamp unchanged on tmpfs 981 times in 2,000 (a C loop), and the index kept the removed
 * reservation (CI: "disk -, index 10.77.0.8"). On multigrain kernels the probe passes at the second
 * try (the first chmod marks the lock's ctime for a fine stamp), so lingering costs ≈ 10 µs instead
 * of a tick; on older kernels it passes at the next tick.
 *
 * Bound: a linger ends at the latest when the wall clock reaches M + 2 ticks + 1 ms (the tick is
 * 1000/CONFIG_HZ ms, read from the kernel config, else 10 ms); a linger ended there, with the probe
 * not passed (a stalled tick, a file system with whole-second stamps such as ext4 with 128-byte
 * inodes, a probe that fails), marks the stamp *suspect*, and the next acquisition refreshes even if
 * the stamp is equal. And the lock is never held continuously (our requests back to back plus
 * lingering) much longer than `maxHoldMs` (default 50 ms) when someone may be waiting: a hold that
 * reaches the bound is released at the end of its current request (and linger) even though requests
 * are queued (they then compete for the flock like host-local, after a short pause that lets a
 * blocked host-local win). Whenever the lock is released before the probe passed, the stamp is
 * marked suspect. So host-local waits at most two ticks more than without the daemon and is never
 * starved. Every error path (a failing request, a failing stat, a closed {@link NetworkIndexes})
 * releases the lock or leaves it to the bounded linger; nothing can keep it longer than the bound.
 *
 * Not covered by any stamp rule (as in the measurements): in-place rewrites of an existing file by
 * a writer that ignores the lock (host-local never does), and a backwards clock step after our
 * release that lands a foreign change exactly on M.
 * Belt and braces: a reservation that `link(2)` finds taken although the index said free, a DEL or
 * a release whose file does not hold what the index says, drop the index (rebuilt on next use); DEL
 * re-reads each file before unlinking it, and every other removal or rewrite goes through
 * FileStore, which re-reads the owner. A stale "free" entry can never give an address twice
 * (`link(2)` says EEXIST); a stale "taken" entry only skips an address.
 *
 * Source of the numbers and the rule: `../shared/reference/fast-path-measurements.md` §3 (measured
 * prototype `daemon-index.cjs`, `mtime.c`, `stress.py`), `bench/stamp-lag.c` (the coarse clock's lag,
 * the wall-clock rule's misses, the probe rule's); docs/daemon.md "The index".
 */
import { closeSync, constants as fsConstants, existsSync, fchmodSync, fstatSync, lstatSync, openSync, readdirSync, readFileSync, statSync, unlinkSync } from 'node:fs';
import { gunzipSync } from 'node:zlib';
import { release as osRelease } from 'node:os';
import { join } from 'node:path';
import { AppError, ClosedError, errnoCode } from '../../common/errors.ts';
import type { ListOptions, Owner, Reservation, ReservationIndex, Store } from '../store.ts';
import {
  DIR_MODE,
  FileStore,
  formatRecord,
  goTrimSpace,
  isCanonicalIPName,
  LOCK_FILE_NAME,
  decodeBuffer,
  parseTrimmedRecord,
  readLongRecord,
  readRecordHead,
  TEMP_PREFIX,
  TEMP_SUFFIX,
} from './file-store.ts';
import type { LockClock } from './flock.ts';
import { IndexData, type EntryState } from './index-data.ts';
import { makeDirs } from '../../common/make-dirs.ts';

/** Default bound on one continuous hold of `DIR/lock`, milliseconds (issue 9). */
export const DEFAULT_MAX_HOLD_MS = 50;
/** Tick assumed when the kernel's CONFIG_HZ cannot be read, milliseconds (HZ ≥ 100). */
export const DEFAULT_TICK_MS = 10;
/** Extra margin added to the linger's cap (two ticks), milliseconds. */
export const TICK_MARGIN_MS = 1;
/**
 * Directories with at most this many IP-named entries are re-read completely on a refresh. The
 * default is every directory: a names-only diff cannot see a name that another writer removed and
 * re-created with another owner between two of our holds (on a full range the freed address is
 * the next one taken), and then DEL would find nothing and a repeated ADD would miss its
 * address (found by review, reproduced on a range of 1,124 addresses). A complete re-read after a
 * foreign change costs one scan (≈ 1 s on a /16, still less than host-local's own per-ADD scan);
 * our own changes and an unchanged directory keep the O(1) path. `0` forces the diff (tests).
 */
export const DEFAULT_FULL_REBUILD_BELOW = Number.POSITIVE_INFINITY;
/** Pause before a queued request competes for a lock released at the bound, milliseconds. */
export const YIELD_MS = 2;

/** Time source of the linger rule (tests inject one). */
export interface IndexClock {
  /** Wall-clock time, milliseconds since the Unix epoch (CLOCK_REALTIME, as `Date.now`). */
  now(): number;
  /**
   * Call `fn` after about `ms` milliseconds; the returned function cancels it. With `keepAlive`
   * false the timer must not keep the process alive (a linger must not delay a shutdown); a
   * request waiting for the lock passes true.
   */
  setTimer(fn: () => void, ms: number, keepAlive: boolean): () => void;
}

/**
 * The file system's clock, as the linger rule reads it (tests inject one). `stampNow(lockPath)`
 * returns the time stamp, nanoseconds since the Unix epoch, that a change made now on the file
 * system holding `lockPath` (DIR/lock, held by the caller) gets, or null when it cannot tell.
 * Stamps returned must never exceed a stamp a later change gets (bar a clock step).
 */
export interface FsClock {
  stampNow(lockPath: string): bigint | null;
}

/**
 * The default {@link FsClock}: open DIR/lock (`O_NOFOLLOW`), `fstat` it, `fchmod` it to its own mode (this changes only its
 * ctime, to the stamp the kernel gives a change now: coarse or fine, truncated to the file system's
 * granularity, exactly as a change to DIR would be stamped), `fstat` again and return the new ctime.
 * Null when the lock is not a regular file (a symlink may lead to another file system) or a call
 * fails (EPERM, EROFS, ENOENT): the linger then runs to its cap and the stamp is marked suspect.
 * Five syscalls.
 */
export const realFsClock: FsClock = {
  stampNow(lockPath) {
    // By descriptor (O_NOFOLLOW): a symlink swapped in between a stat and a chmod by path would
    // make root chmod the link's target. Closing this descriptor leaves the flock(2) on DIR/lock
    // alone (a flock belongs to its own open file description).
    let fd: number;
    try {
      fd = openSync(lockPath, fsConstants.O_RDONLY | fsConstants.O_NOFOLLOW | fsConstants.O_NONBLOCK);
    } catch {
      return null;
    }
    try {
      const st = fstatSync(fd);
      if (!st.isFile()) return null;
      fchmodSync(fd, st.mode & 0o7777);
      return fstatSync(fd, { bigint: true }).ctimeNs;
    } catch {
      return null;
    } finally {
      closeSync(fd);
    }
  },
};

const realIndexClock: IndexClock = {
  now: () => Date.now(),
  setTimer: (fn, ms, keepAlive) => {
    const t = setTimeout(fn, ms);
    if (!keepAlive) t.unref();
    return () => clearTimeout(t);
  },
};

/** Options of {@link NetworkIndexes}. */
export interface NetworkIndexesOptions {
  /** Timestamp tick, milliseconds (default {@link detectTimestampTickMs}). */
  readonly tickMs?: number;
  /** Bound on one continuous hold of a network's lock, milliseconds (default {@link DEFAULT_MAX_HOLD_MS}). */
  readonly maxHoldMs?: number;
  /** See {@link DEFAULT_FULL_REBUILD_BELOW} (0 = always refresh by diff). */
  readonly fullRebuildBelow?: number;
  /**
   * VERIFY mode (tests, diagnosis): at every validation and at the end of every hold, compare the
   * index with a full FileStore scan under the lock and count differences in
   * {@link IndexStats.stale}. Costs a full scan per request.
   */
  readonly verify?: boolean;
  /** Wall clock and timers of the linger rule (its cap, its re-probes). */
  readonly clock?: IndexClock;
  /** The file system's clock, probed to end a linger (default {@link realFsClock}). */
  readonly fsClock?: FsClock;
  /** Clock for lock polling, passed to FileStore (tests). */
  readonly lockClock?: LockClock;
  /**
   * Called when a full read of a network directory finds IP-named files that are empty or
   * unparseable (corrupt: an empty one is what a power loss leaves of a reservation whose content
   * had not reached the disk, docs/on-disk-format.md "Crash promises"), with DIR and those names,
   * each name once per daemon. They count as taken; only the evidence rules release them. Must not
   * throw.
   */
  readonly onCorrupt?: (dir: string, names: string[]) => void;
}

/** Counters of a {@link NetworkIndexes} (all since construction). */
export interface IndexStats {
  /** Validations that trusted the index (stamp equal, not suspect). */
  trusted: number;
  /** Validations that refreshed it by readdir diff. */
  refreshed: number;
  /** Full rebuilds (first use, ino change, small directory, after a failure). */
  rebuilt: number;
  /** Holds continued by a request that took a lingering lock over. */
  takeovers: number;
  /** Holds handed directly from one request to the next queued one. */
  handoffs: number;
  /** Holds that kept the lock after their request, by the linger rule. */
  lingers: number;
  /** Releases before the file system's clock passed the stamp (the cap, the bound, a close): the stamp was marked suspect. */
  cut: number;
  /** Index entries found wrong by the store's own operations (EEXIST, owner changed); index dropped. */
  staleHits: number;
  /** VERIFY mode: validations or holds whose index differed from a full scan. */
  stale: number;
  /** VERIFY mode: of those, validations that had trusted the stamp. */
  staleTrusted: number;
  /** VERIFY mode: the first differences found (at most 20), for the test's message. */
  staleDetails: string[];
  /** fsyncs of a network directory made by the group commit (one per flush round). */
  flushes: number;
  /** Reservations made durable by those flushes (their sum over rounds: ≥ `flushes` when rounds were shared). */
  flushedWrites: number;
}

/** What `stat(DIR)` said (bigint nanoseconds). */
interface Stamp {
  readonly ino: bigint;
  /** Birth time, ns (0 where the file system keeps none): with `ino`, which directory this is. */
  readonly birthNs: bigint;
  readonly mtimeNs: bigint;
  readonly ctimeNs: bigint;
}

interface Waiter {
  readonly handle: IndexedStore;
  grant(kind: 'handoff' | 'acquire'): void;
  fail(e: unknown): void;
}

/** The daemon-wide state of one network directory. */
class NetState {
  readonly dir: string;
  readonly lockPath: string;
  /** Does every write and holds the flock (never closed while the NetworkIndexes lives). */
  readonly inner: FileStore;
  data: IndexData | null = null;
  stamp: Stamp | null = null;
  /** The stamp may hide a change (the lock was released before M + G): refresh at next validation. */
  suspect = false;
  /** The flock is held by `inner`. */
  lockHeld = false;
  /** A request is inside `inner.lock()`. */
  acquiring = false;
  /** The request holding the lock, or null (free or lingering). */
  holder: IndexedStore | null = null;
  /** Start of the current continuous hold, ms (clock). */
  heldSince = 0;
  /** The index was validated during the current continuous hold. */
  validated = false;
  /** DIR was (possibly) changed during the current hold: re-stat at its end. */
  dirty = false;
  /** The index was found wrong during this hold: keep it for the hold, rebuild on the next one. */
  mustRebuild = false;
  /** The last validation trusted the stamp (VERIFY counts stale trusted validations). */
  lastTrusted = false;
  /** Inodes of DIR and DIR/lock when the flock was taken (a takeover re-checks them). */
  lockDirIno = -1n;
  lockFileIno = -1n;
  cancelLinger: (() => void) | null = null;
  readonly waiters: Waiter[] = [];
  /** Group commit: reservations written in DIR so far (a counter; each write takes the next value). */
  writeGen = 0;
  /** Group commit: every write up to this value is durable (DIR fsynced after it). */
  syncedGen = 0;
  /** Group commit: the flush round in progress (one fsync of DIR), or null. */
  flushing: Promise<void> | null = null;
  /**
   * Group commit: every write up to this value was covered by a round whose fsync failed. Such a
   * write is never reported durable, whatever a later fsync says: on Linux a failed writeback is
   * reported once, and the next fsync of DIR may succeed without it (review).
   */
  failedGen = 0;
  /** Corrupt names already reported through `onCorrupt`. */
  readonly reportedCorrupt = new Set<string>();

  constructor(network: string, dir: string, lockClock: LockClock | undefined) {
    this.dir = dir;
    this.lockPath = join(dir, LOCK_FILE_NAME);
    // A write's fsyncs off the event loop: one network's disk wait must not stall the daemon's
    // other requests, nor the acknowledgements the shims wait for (3 s) — issue 19, bursts. A
    // reservation's DIR fsync is deferred to the group commit ({@link NetworkIndexes.durable}).
    this.inner = new FileStore(network, dir, lockClock, true, true);
  }
}

/**
 * The daemon's per-network indexes (one object per daemon). Long-lived: create once, `open()` a
 * {@link Store} per request, `close()` on shutdown (releases every lingering lock; idempotent;
 * `open()` afterwards throws `ClosedError`).
 */
export class NetworkIndexes {
  readonly #nets = new Map<string, NetState>();
  /** The linger's cap after the stamp: two ticks + {@link TICK_MARGIN_MS}, ns (see the module comment). */
  readonly #capNs: bigint;
  readonly #capMs: number;
  /** Interval between two probes of a linger, ms. */
  readonly #probeEveryMs: number;
  readonly #maxHoldMs: number;
  readonly #fullRebuildBelow: number;
  readonly #verify: boolean;
  readonly #clock: IndexClock;
  readonly #fsClock: FsClock;
  readonly #lockClock: LockClock | undefined;
  readonly #onCorrupt: ((dir: string, names: string[]) => void) | undefined;
  readonly #buf = Buffer.allocUnsafe(4096);
  #closed = false;
  /** Counters; see {@link IndexStats}. */
  readonly stats: IndexStats = {
    trusted: 0,
    refreshed: 0,
    rebuilt: 0,
    takeovers: 0,
    handoffs: 0,
    lingers: 0,
    cut: 0,
    staleHits: 0,
    stale: 0,
    staleTrusted: 0,
    staleDetails: [],
    flushes: 0,
    flushedWrites: 0,
  };

  constructor(opts: NetworkIndexesOptions = {}) {
    const tickMs = opts.tickMs ?? detectTimestampTickMs();
    if (!(tickMs >= 0) || !Number.isFinite(tickMs)) throw new AppError('INTERNAL', `invalid tick ${String(tickMs)} ms`);
    this.#capMs = 2 * tickMs + (tickMs > 0 ? TICK_MARGIN_MS : 0);
    this.#capNs = BigInt(Math.ceil(this.#capMs * 1e6));
    this.#probeEveryMs = Math.max(1, Math.ceil(tickMs / 4));
    this.#maxHoldMs = opts.maxHoldMs ?? DEFAULT_MAX_HOLD_MS;
    this.#fullRebuildBelow = opts.fullRebuildBelow ?? DEFAULT_FULL_REBUILD_BELOW;
    this.#verify = opts.verify ?? false;
    this.#clock = opts.clock ?? realIndexClock;
    this.#fsClock = opts.fsClock ?? realFsClock;
    this.#lockClock = opts.lockClock;
    this.#onCorrupt = opts.onCorrupt;
  }

  /**
   * Open the store of one network, like `openFileStore({dataDir, network})`: `mkdir -p DIR` (mode
   * 0755) on every call, no lock taken. The caller has validated both values. Throws
   * `AppError('STORE_IO', 'cannot create network directory …')` as openFileStore does, and
   * `ClosedError` after {@link close}.
   */
  async open(opts: { readonly dataDir: string; readonly network: string }): Promise<Store> {
    if (this.#closed) throw new ClosedError('network indexes');
    const dir = join(opts.dataDir, opts.network);
    try {
      makeDirs(dir, DIR_MODE);
    } catch (e) {
      throw new AppError('STORE_IO', `cannot create network directory ${dir}: ${describe(e)}`, { cause: e });
    }
    let st = this.#nets.get(dir);
    if (st === undefined) this.#nets.set(dir, (st = new NetState(opts.network, dir, this.#lockClock)));
    return new IndexedStore(this, st, opts.network);
  }

  /**
   * The opener of `PluginDeps.openStore` (src/cni/commands.ts) with the semantics of the plugin's
   * `fileDeps`: null when `create` is false and DIR does not exist (DEL/CHECK/GC create nothing),
   * else {@link open}.
   */
  async openStore(opts: { dataDir: string; network: string; create: boolean }): Promise<Store | null> {
    if (!opts.create && !existsSync(join(opts.dataDir, opts.network))) return null;
    return this.open(opts);
  }

  /**
   * The index's view of a network for tests and diagnosis: its reservations (sorted by IP text) and
   * unusable names, or null when the network has no valid index.
   */
  peek(dataDir: string, network: string): { reservations: Array<{ ip: string; owner: Owner | null }>; unusable: string[] } | null {
    const d = this.#nets.get(join(dataDir, network))?.data;
    if (d == null) return null;
    return {
      reservations: d
        .list()
        .map((r) => ({ ip: r.ip, owner: r.owner === null ? null : { containerId: r.owner.containerId, ifname: r.owner.ifname } }))
        .sort((a, b) => (a.ip < b.ip ? -1 : a.ip > b.ip ? 1 : 0)),
      unusable: d.unusableNames().sort(),
    };
  }

  /**
   * Drop the index of one network directory (the daemon's warm-up network, src/daemon/warm-up.ts,
   * before its directory is removed): a lingering lock is released first. Returns false, and
   * changes nothing, while a request holds, awaits or is acquiring its lock, or a flush round is
   * running; true once the network is gone from the index (also when it never was in it). Call it
   * only when no handle of the network is open (the warm-up calls it after every one of its
   * requests was answered): a handle opened but not yet locking is not seen here, and would go on
   * with the forgotten state (still excluded by the flock, as a foreign writer would be).
   */
  forget(dataDir: string, network: string): boolean {
    const dir = join(dataDir, network);
    const st = this.#nets.get(dir);
    if (st === undefined) return true;
    if (st.holder !== null || st.acquiring || st.waiters.length > 0 || st.flushing !== null) return false;
    if (st.lockHeld) this.#releaseLock(st, false);
    this.#nets.delete(dir);
    return true;
  }

  /** True while some network's lock is held (by a request or lingering). */
  get holdsAnyLock(): boolean {
    for (const st of this.#nets.values()) if (st.lockHeld) return true;
    return false;
  }

  /**
   * Release every lingering lock and refuse further `open()`. Requests still holding a lock release
   * it (without lingering) when they close; queued ones fail with `ClosedError`. Idempotent.
   */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    for (const st of this.#nets.values()) {
      for (const w of st.waiters.splice(0)) w.fail(new ClosedError('network indexes'));
      if (st.holder === null && st.lockHeld) this.#releaseLock(st, false);
    }
  }

  /** `close()`, for `using`-style callers (house style 10). */
  async destroy(): Promise<void> {
    await this.close();
  }

  get closed(): boolean {
    return this.#closed;
  }

  // Group commit ---------------------------------------------------------------------------------

  /**
   * @internal Resolve once every reservation written in DIR up to generation `gen` is durable:
   * one fsync of DIR per flush round, shared by every request whose writes were done when the
   * round's fsync began (in the check phase of the event-loop turn in which a request first
   * needed it, so every request served in that turn is covered); a request whose write came
   * after that waits for the round and then starts (or joins) the next. Called after the request has released (or handed on) the lock, so
   * the next request's work overlaps this one's disk wait, and several requests share one fsync.
   * Throws `AppError('STORE_IO')` when the round that covers `gen` failed (its requests then fail:
   * an address whose name may not be durable is never reported).
   */
  async durable(st: NetState, gen: number): Promise<void> {
    while (st.syncedGen < gen) {
      if (gen <= st.failedGen) {
        throw new AppError('STORE_IO', `cannot make the reservations in ${st.dir} durable: an fsync of the directory failed after they were written`);
      }
      if (st.flushing !== null) {
        // A round in progress began before our write or after it: wait for it, then look again.
        await st.flushing.catch(() => undefined);
        continue;
      }
      // The round's fsync starts in the check phase of this event-loop turn, not now: the
      // requests whose bodies were read in the same turn write first and share it. Started now,
      // it held DIR's inode lock (ext4 and the generic fsync hold it while the directory's blocks
      // are written) while the next request's create/link/unlink in DIR waited for it on the
      // event loop, so a burst made one round per ADD or two.
      const round = new Promise<void>((resolve) => setImmediate(resolve)).then(() => {
        const target = st.writeGen;
        const from = st.syncedGen;
        return st.inner.syncDir().then(() => {
          if (st.syncedGen < target) st.syncedGen = target;
          this.stats.flushes++;
          this.stats.flushedWrites += target - from;
        });
      });
      st.flushing = round;
      try {
        await round;
      } catch (e) {
        // Every write done by now may have been in the writeback that failed.
        if (st.failedGen < st.writeGen) st.failedGen = st.writeGen;
        throw e;
      } finally {
        if (st.flushing === round) st.flushing = null;
      }
    }
  }

  // Lock life cycle ------------------------------------------------------------------------------

  /** @internal Take the lock of `st` for `h` (takeover, queue, or flock). */
  async acquire(st: NetState, h: IndexedStore, timeoutSeconds: number): Promise<void> {
    if (!Number.isFinite(timeoutSeconds) || timeoutSeconds < 0) {
      throw new AppError('INTERNAL', `invalid lock timeout ${String(timeoutSeconds)}`);
    }
    if (this.#closed) throw new ClosedError('network indexes');
    const start = this.#clock.now();
    if (st.lockHeld && st.holder === null && !st.acquiring && st.waiters.length === 0 && start - st.heldSince < this.#maxHoldMs) {
      if (this.#lockStillOurs(st)) {
        st.cancelLinger?.();
        st.cancelLinger = null;
        st.holder = h;
        this.stats.takeovers++;
        return;
      }
      this.#releaseLock(st, true);
    }
    if (st.holder !== null || st.acquiring || st.lockHeld || st.waiters.length > 0) {
      const kind = await this.#enqueue(st, h, timeoutSeconds);
      if (kind === 'handoff') return;
    }
    const left = Math.max(0, timeoutSeconds - (this.#clock.now() - start) / 1000);
    st.acquiring = true;
    try {
      await st.inner.lock(timeoutSeconds === 0 ? 0 : left);
    } catch (e) {
      st.acquiring = false;
      this.#grantNext(st);
      throw rewordTimeout(e, timeoutSeconds, st.lockPath);
    }
    st.acquiring = false;
    st.lockHeld = true;
    st.holder = h;
    st.heldSince = this.#clock.now();
    st.validated = false;
    st.dirty = false;
    st.mustRebuild = false;
    try {
      st.lockDirIno = statSync(st.dir, { bigint: true }).ino;
      st.lockFileIno = statSync(st.lockPath, { bigint: true }).ino;
    } catch {
      st.lockDirIno = -1n;
      st.lockFileIno = -1n;
    }
    if (this.#closed) {
      st.holder = null;
      this.#releaseLock(st, false);
      throw new ClosedError('network indexes');
    }
  }

  #enqueue(st: NetState, h: IndexedStore, timeoutSeconds: number): Promise<'handoff' | 'acquire'> {
    return new Promise((resolve, reject) => {
      let cancelTimer: (() => void) | null = null;
      const w: Waiter = {
        handle: h,
        grant: (kind) => {
          cancelTimer?.();
          resolve(kind);
        },
        fail: (e) => {
          cancelTimer?.();
          reject(e);
        },
      };
      st.waiters.push(w);
      cancelTimer = this.#clock.setTimer(() => {
        const i = st.waiters.indexOf(w);
        if (i < 0) return;
        st.waiters.splice(i, 1);
        reject(lockTimeout(timeoutSeconds, st.lockPath));
      }, timeoutSeconds * 1000, true);
    });
  }

  /** The lock is free (nobody holds or acquires it): let the first queued request compete for it. */
  #grantNext(st: NetState, pause = false): void {
    if (st.lockHeld || st.acquiring || st.holder !== null) return;
    const w = st.waiters.shift();
    if (w === undefined) return;
    if (!pause) {
      w.grant('acquire');
      return;
    }
    // Released at the bound: give a host-local blocked in flock(2) the chance to run first.
    st.acquiring = true;
    this.#clock.setTimer(() => {
      st.acquiring = false;
      w.grant('acquire');
    }, YIELD_MS, true);
  }

  #lockStillOurs(st: NetState): boolean {
    try {
      return statSync(st.dir, { bigint: true }).ino === st.lockDirIno && statSync(st.lockPath, { bigint: true }).ino === st.lockFileIno;
    } catch {
      return false;
    }
  }

  /**
   * Drop the flock of `st` now. `early`: the linger rule was not known to be met; the file system's
   * clock is probed once more and, if it has not passed the stamp, the stamp is marked suspect.
   */
  #releaseLock(st: NetState, early: boolean, pauseNext = false): void {
    st.cancelLinger?.();
    st.cancelLinger = null;
    if (early && st.data !== null && st.stamp !== null && !this.#fsPassed(st, st.stamp)) {
      st.suspect = true;
      this.stats.cut++;
    }
    st.lockHeld = false;
    st.validated = false;
    // FileStore.unlock's body is synchronous (the flock is dropped before it returns); it only
    // rejects when closed, and ours never is.
    st.inner.unlock().catch(() => undefined);
    this.#grantNext(st, pauseNext);
  }

  /**
   * Has the file system's clock passed the stamp `s` (the linger rule, see the module comment)? One
   * probe, and a second when the first did not pass: on a multigrain kernel (6.13+) the first
   * chmod stamps the lock coarsely and our `lstat` marks that ctime as seen, so the second gets a
   * fine-grained stamp (and raises the kernel's floor for every later coarse stamp).
   */
  #fsPassed(st: NetState, s: Stamp): boolean {
    const m = s.mtimeNs > s.ctimeNs ? s.mtimeNs : s.ctimeNs;
    for (let i = 0; i < 2; i++) {
      const v = this.#fsClock.stampNow(st.lockPath);
      if (v === null) return false;
      if (v > m) return true;
    }
    return false;
  }

  /** Wall-clock ms at which a linger ends even though the probe has not passed: M + 2 ticks + 1 ms. */
  #lingerCap(s: Stamp): number {
    const m = s.mtimeNs > s.ctimeNs ? s.mtimeNs : s.ctimeNs;
    return Number((m + this.#capNs + 999_999n) / 1_000_000n);
  }

  /** @internal The request `h` is done with the lock: hand off, linger, or release. Never throws. */
  finish(st: NetState, h: IndexedStore): void {
    if (st.holder !== h) return;
    try {
      if (st.mustRebuild) {
        st.data = null;
        st.stamp = null;
      } else if (st.dirty && st.data !== null) {
        st.stamp = statStamp(st.dir);
        if (st.stamp === null) st.data = null;
      }
    } catch {
      st.data = null;
      st.stamp = null;
    }
    st.dirty = false;
    st.mustRebuild = false;
    st.holder = null;
    if (this.#closed) {
      this.#releaseLock(st, true);
      return;
    }
    const now = this.#clock.now();
    if (st.waiters.length > 0 && now - st.heldSince < this.#maxHoldMs) {
      const w = st.waiters.shift() as Waiter;
      st.holder = w.handle;
      this.stats.handoffs++;
      w.grant('handoff');
      return;
    }
    // Queued requests now compete for the flock (after a pause that lets host-local win).
    const pause = st.waiters.length > 0;
    if (st.data === null || st.stamp === null) {
      this.#releaseLock(st, false, pause);
      return;
    }
    if (this.#fsPassed(st, st.stamp)) {
      this.#releaseLock(st, false, pause);
      return;
    }
    const until = this.#lingerCap(st.stamp);
    if (now >= until || until - now > this.#capMs + this.#maxHoldMs) {
      // At the cap already, or a stamp in the future (the clock was stepped back): do not wait.
      this.#releaseLock(st, true, pause);
      return;
    }
    this.stats.lingers++;
    this.#armLinger(st, until, now);
  }

  /** Probe again in {@link #probeEveryMs} (or at the cap); release when passed, or early at the cap. */
  #armLinger(st: NetState, until: number, now: number): void {
    st.cancelLinger = this.#clock.setTimer(() => {
      st.cancelLinger = null;
      if (st.holder !== null || !st.lockHeld) return;
      if (st.data === null || st.stamp === null || this.#fsPassed(st, st.stamp)) {
        this.#releaseLock(st, false, st.waiters.length > 0);
        return;
      }
      const t = this.#clock.now();
      if (t >= until) this.#releaseLock(st, true, st.waiters.length > 0);
      else this.#armLinger(st, until, t);
    }, Math.max(1, Math.min(until - now, this.#probeEveryMs)), false);
  }

  /**
   * @internal STATUS's probe (`writable()`, a temporary file created and removed in DIR) without
   * the caller holding the lock. If the lock can be had at once (a lingering hold taken over, or
   * one non-blocking flock attempt) the probe runs under it, so the recorded stamp follows DIR and
   * the next ADD need not refresh; else (another request or host-local holds it) it runs as
   * FileStore runs it, and the next validation refreshes. Never waits.
   */
  async probeWritable(st: NetState, h: IndexedStore): Promise<boolean> {
    if (st.holder !== null) {
      // Another request of this daemon holds the lock: the probe's change happens in its hold.
      st.dirty = true;
      return st.inner.writable();
    }
    try {
      await this.acquire(st, h, 0);
    } catch {
      return st.inner.writable();
    }
    try {
      this.ensure(st);
      st.dirty = true;
      return await st.inner.writable();
    } finally {
      this.finish(st, h);
    }
  }

  // Validation ----------------------------------------------------------------------------------

  /**
   * @internal The validated index of `st` for the current hold, or null when it cannot be had (the
   * caller then delegates to FileStore). Never throws.
   */
  ensure(st: NetState): IndexData | null {
    if (st.validated || st.mustRebuild) return st.data;
    st.validated = true;
    try {
      const now = statStamp(st.dir);
      if (now === null) {
        st.data = null;
        return null;
      }
      const old = st.stamp;
      let trusted = false;
      if (st.data !== null && old !== null && !st.suspect && sameStamp(now, old)) {
        this.stats.trusted++;
        trusted = true;
      } else if (st.data !== null && old !== null && sameDir(now, old)) {
        if (this.#refresh(st, st.data)) this.stats.refreshed++;
        else this.stats.rebuilt++;
        this.#reportCorrupt(st, st.data);
      } else {
        st.data = this.#rebuild(st);
        this.stats.rebuilt++;
      }
      st.suspect = false;
      st.lastTrusted = trusted;
      // A refresh may have removed temporary leftovers: stat again unless nothing was done.
      st.stamp = trusted ? now : statStamp(st.dir);
      if (st.stamp === null) st.data = null;
    } catch {
      st.data = null;
      st.stamp = null;
    }
    return st.data;
  }

  /**
   * @internal The index of `st` was found wrong (or DIR changed behind it): during a hold it is
   * rebuilt from disk at once (a caller such as the allocator may keep the old object for the rest
   * of its call: it can only offer an address that `link(2)` then refuses, or skip one); without
   * the lock it is dropped and rebuilt on the next use.
   */
  dropIndex(st: NetState, counted = true): void {
    if (counted) this.stats.staleHits++;
    if (st.holder !== null && st.lockHeld) {
      st.dirty = true;
      try {
        st.data = this.#rebuild(st);
        this.stats.rebuilt++;
        return;
      } catch {
        // fall through: no index until the next hold
      }
    }
    st.data = null;
    st.stamp = null;
    st.mustRebuild = st.holder !== null;
  }

  /**
   * Forget what the index of a network knows: the next use rebuilds it from disk (at once when a
   * request holds its lock). For tools and tests that change DIR other than through a Store of
   * this object while holding the lock.
   */
  invalidate(dataDir: string, network: string): void {
    const st = this.#nets.get(join(dataDir, network));
    if (st !== undefined) this.dropIndex(st, false);
  }

  /** Name, through `onCorrupt`, the corrupt records of `d` not named before (after a read of DIR). */
  #reportCorrupt(st: NetState, d: IndexData): void {
    if (this.#onCorrupt === undefined) return;
    const fresh: string[] = [];
    for (const r of d.list()) {
      if (r.owner === null && !st.reportedCorrupt.has(r.ip)) {
        st.reportedCorrupt.add(r.ip);
        fresh.push(r.ip);
      }
    }
    if (fresh.length === 0) return;
    try {
      this.#onCorrupt(st.dir, fresh.sort());
    } catch {
      // a reporting hook must not break the index
    }
  }

  /** Full read of DIR into a new index. Throws on any error (caller delegates). */
  #rebuild(st: NetState): IndexData {
    const names = readdirSync(st.dir);
    const entries: Array<[string, EntryState]> = [];
    for (const name of names) {
      if (!isCanonicalIPName(name)) {
        this.#cleanTemp(st, name);
        continue;
      }
      const e = readEntry(join(st.dir, name), this.#buf);
      if (e !== null) entries.push([name, e]);
    }
    const d = new IndexData();
    d.reset(entries);
    this.#reportCorrupt(st, d);
    return d;
  }

  /** Readdir diff into `d`; returns false when it re-read everything instead (small DIR). */
  #refresh(st: NetState, d: IndexData): boolean {
    const names = readdirSync(st.dir);
    const present = new Set<string>();
    let indexedPresent = 0;
    for (const name of names) {
      // An indexed name was checked when it was added: skip the parse (65,534 names on a /16).
      if (d.hasName(name)) {
        present.add(name);
        indexedPresent++;
      } else if (isCanonicalIPName(name)) present.add(name);
      else this.#cleanTemp(st, name);
    }
    if (present.size <= this.#fullRebuildBelow) {
      const entries: Array<[string, EntryState]> = [];
      for (const name of present) {
        const e = readEntry(join(st.dir, name), this.#buf);
        if (e !== null) entries.push([name, e]);
      }
      d.reset(entries);
      return false;
    }
    // Every indexed name still present (readdir names are unique): nothing vanished.
    if (indexedPresent !== d.entryCount) {
      const gone: string[] = [];
      for (const name of d.names()) if (!present.has(name)) gone.push(name);
      for (const name of gone) d.delete(name);
    }
    const again = new Set(d.unusableNames());
    for (const name of present) {
      if (d.hasName(name) && !again.has(name)) continue;
      const e = readEntry(join(st.dir, name), this.#buf);
      if (e === null) d.delete(name);
      else d.set(name, e);
    }
    return true;
  }

  #cleanTemp(st: NetState, name: string): void {
    if (name.startsWith(TEMP_PREFIX) && name.endsWith(TEMP_SUFFIX)) {
      try {
        unlinkSync(join(st.dir, name));
      } catch {
        // already gone
      }
    }
  }

  /**
   * @internal VERIFY mode (else a no-op): validate now and compare the index with FileStore's own
   * full scan, under the lock held by `h`. A difference is counted in {@link IndexStats.stale} (and
   * `staleTrusted` when the validation had trusted the stamp) and the index is rebuilt from disk.
   */
  async verify(st: NetState, h: IndexedStore, when: 'validation' | 'request'): Promise<void> {
    if (!this.#verify || st.holder !== h) return;
    if (when === 'validation') this.ensure(st);
    const d = st.data;
    if (d === null || st.mustRebuild) return;
    const key = (r: Reservation): string => `${r.ip} ${JSON.stringify(r.owner === null ? null : [r.owner.containerId, r.owner.ifname])}`;
    // The reference: FileStore's scan. It may remove temporary leftovers: re-stat at the hold's end.
    st.dirty = true;
    const scanned = new Map<string, string>();
    for (const r of await st.inner.list({ mtime: false })) scanned.set(r.ip, key(r));
    const mine = new Map<string, string>();
    for (const r of d.list()) mine.set(r.ip, key(r));
    const diffs: string[] = [];
    for (const [ip, k] of scanned) if (mine.get(ip) !== k) diffs.push(`disk ${k}, index ${mine.get(ip) ?? '-'}`);
    for (const [ip, k] of mine) if (!scanned.has(ip)) diffs.push(`disk -, index ${k}`);
    const unusable = readdirSync(st.dir).filter((n) => isCanonicalIPName(n) && !scanned.has(n)).sort();
    const mineUnusable = d.unusableNames().sort();
    if (unusable.join(',') !== mineUnusable.join(',')) diffs.push(`unusable: disk [${unusable.join(',')}], index [${mineUnusable.join(',')}]`);
    if (diffs.length === 0) return;
    this.stats.stale++;
    const trusted = when === 'validation' && st.lastTrusted;
    if (trusted) this.stats.staleTrusted++;
    if (this.stats.staleDetails.length < 20) this.stats.staleDetails.push(`${st.dir} (${trusted ? 'trusted validation' : when}): ${diffs.slice(0, 5).join('; ')}`);
    st.data = this.#rebuild(st);
  }
}

/**
 * One request's handle on a network (what {@link NetworkIndexes.open} returns): the {@link Store}
 * contract, with writes done by the network's FileStore and reads and the allocator's fast path
 * answered from the index while this handle holds the lock. Without the lock every call is
 * FileStore's own (and a change made that way drops the index).
 */
export class IndexedStore implements Store {
  readonly network: string;
  readonly #ix: NetworkIndexes;
  readonly #st: NetState;
  #closed = false;
  #holding = false;
  /**
   * `last_reserved_ip.<N>` as read during this handle's current hold of the lock (range set index →
   * value). Every writer changes that file only with the lock held, so it cannot change under us
   * while we hold it; our own `reserve` forgets the entry it may rewrite; cleared when the hold
   * ends. (ADD reads each file twice: the "new data directory" check, then the allocator.)
   */
  readonly #lastReserved = new Map<number, string | null>();
  /**
   * Group commit: the write generation this handle must see durable before it returns from
   * `close()`/`unlock()` (its own reservations, and any another request made before this one's
   * hold ended: an idempotent re-ADD must not report an address whose name is not durable yet).
   */
  #durableGen = 0;

  /** Use {@link NetworkIndexes.open}. */
  constructor(ix: NetworkIndexes, st: NetState, network: string) {
    this.#ix = ix;
    this.#st = st;
    this.network = network;
  }

  /** The network directory. */
  get dir(): string {
    return this.#st.dir;
  }

  /** True while this handle holds the lock. */
  get locked(): boolean {
    return this.#holding;
  }

  /**
   * Take the network's lock: take over a lingering hold, wait behind another request of this
   * daemon, or flock `DIR/lock` (FileStore). Errors as FileStore's `lock` (STORE_LOCK_TIMEOUT with
   * the same text, STORE_IO), `AppError('INTERNAL')` when already held by this handle.
   */
  async lock(timeoutSeconds: number): Promise<void> {
    this.#assertOpen();
    if (this.#holding) throw new AppError('INTERNAL', `the lock on ${this.#st.lockPath} is already held by this store`);
    await this.#ix.acquire(this.#st, this, timeoutSeconds);
    this.#lastReserved.clear();
    this.#holding = true;
    if (this.#closed) {
      this.#holding = false;
      this.#ix.finish(this.#st, this);
      throw new ClosedError(`file store ${this.#st.dir}`);
    }
    await this.#ix.verify(this.#st, this, 'validation');
  }

  /**
   * Release the lock (or hand it on, or linger: see the module comment), then wait until every
   * reservation this handle wrote or saw written is durable ({@link NetworkIndexes.durable}).
   * Throws `AppError('STORE_IO')` when that flush failed.
   */
  async unlock(): Promise<void> {
    this.#assertOpen();
    await this.#done();
    await this.#ix.durable(this.#st, this.#durableGen);
  }

  /**
   * `mtime: false` with the lock: the index (a copy of its array, O(n) memory copy, no I/O).
   * Otherwise FileStore's full scan (the index keeps no file times).
   */
  async list(opts: ListOptions = {}): Promise<Reservation[]> {
    this.#assertOpen();
    if (this.#holding && opts.mtime === false) {
      const d = this.#ix.ensure(this.#st);
      if (d !== null) return d.list();
    }
    // FileStore's scan removes temporary leftovers when the lock is held (by any request here).
    if (this.#st.lockHeld) this.#st.dirty = true;
    return this.#st.inner.list(opts);
  }

  reservationIndex(): ReservationIndex | null {
    this.#assertOpen();
    return this.#holding ? this.#ix.ensure(this.#st) : null;
  }

  async reserve(ip: string, owner: { containerId: string; ifname: string }, rangeSetIndex: number): Promise<boolean> {
    this.#assertOpen();
    const d = this.#index();
    const had = d?.hasName(ip) ?? false;
    this.#touchDir();
    this.#lastReserved.delete(rangeSetIndex);
    const ok = await this.#guard(() => this.#st.inner.reserve(ip, owner, rangeSetIndex));
    if (ok) this.#durableGen = ++this.#st.writeGen;
    this.#afterReserve(d, had, ip, owner, ok);
    return ok;
  }

  async restore(ip: string, owner: { containerId: string; ifname: string }): Promise<boolean> {
    this.#assertOpen();
    const d = this.#index();
    const had = d?.hasName(ip) ?? false;
    this.#touchDir();
    const ok = await this.#guard(() => this.#st.inner.restore(ip, owner));
    if (ok) this.#durableGen = ++this.#st.writeGen;
    this.#afterReserve(d, had, ip, owner, ok);
    return ok;
  }

  async rewrite(ip: string, expected: Owner, owner: { containerId: string; ifname: string }): Promise<boolean> {
    this.#assertOpen();
    const d = this.#index();
    this.#touchDir();
    const ok = await this.#guard(() => this.#st.inner.rewrite(ip, expected, owner));
    if (d !== null) {
      if (ok) d.set(ip, recordOf(owner));
      else this.#recheck(d, ip);
    }
    return ok;
  }

  async lastReservedIP(rangeSetIndex: number): Promise<string | null> {
    this.#assertOpen();
    // Not cached across holds: host-local rewrites last_reserved_ip.<N> in place (no change to
    // DIR's stamp). Within one hold of the lock nobody else writes it.
    if (!this.#holding) return this.#st.inner.lastReservedIP(rangeSetIndex);
    const known = this.#lastReserved.get(rangeSetIndex);
    if (known !== undefined) return known;
    const v = await this.#st.inner.lastReservedIP(rangeSetIndex);
    if (this.#holding) this.#lastReserved.set(rangeSetIndex, v);
    return v;
  }

  async release(ip: string, expected: Owner | null): Promise<boolean> {
    this.#assertOpen();
    const d = this.#index();
    this.#touchDir();
    const ok = await this.#guard(() => this.#st.inner.release(ip, expected));
    if (d !== null) {
      if (ok) d.delete(ip);
      else this.#recheck(d, ip);
    }
    return ok;
  }

  async touch(ip: string, expected: Owner | null): Promise<boolean> {
    this.#assertOpen();
    // futimes(2) of one record: DIR and the index are unchanged.
    return this.#st.inner.touch(ip, expected);
  }

  async recoveryPending(): Promise<boolean> {
    this.#assertOpen();
    return this.#st.inner.recoveryPending();
  }

  async markRecovery(pending: boolean): Promise<void> {
    this.#assertOpen();
    this.#touchDir();
    await this.#guard(() => this.#st.inner.markRecovery(pending));
  }

  /**
   * host-local `ReleaseByID` from the index (FileStore's rules: exact `id\r\nifname` records, else
   * legacy `id` ones, plus LF-only `id\nifname`). Each file is re-read before anything is removed;
   * if one does not hold what the index says, the index is dropped and FileStore's full scan does
   * the release. Then unlink each, one fsync of DIR, errors collected as FileStore does. Returns the
   * released IPs in no particular order.
   */
  async releaseByOwner(containerId: string, ifname: string): Promise<string[]> {
    this.#assertOpen();
    const d = this.#holding ? this.#ix.ensure(this.#st) : null;
    if (d === null) {
      this.#touchDir();
      return this.#guard(() => this.#st.inner.releaseByOwner(containerId, ifname));
    }
    const id = goTrimSpace(containerId);
    const exact = d.namesWithContent(id + '\r\n' + ifname);
    const lf = d.namesWithContent(id + '\n' + ifname);
    const hits = [...(exact.length > 0 ? exact : d.namesWithContent(id)), ...lf];
    if (hits.length === 0) return [];
    const buf = Buffer.allocUnsafe(4096);
    for (const ip of hits) {
      const want = d.get(ip);
      let got: EntryState | null;
      try {
        got = readEntry(join(this.#st.dir, ip), buf);
      } catch {
        got = null;
      }
      if (got === null || !sameEntry(got, want)) {
        this.#touchDir();
        const out = await this.#guard(() => this.#st.inner.releaseByOwner(containerId, ifname));
        this.#ix.dropIndex(this.#st);
        return out;
      }
    }
    this.#touchDir();
    const released: string[] = [];
    const failures: string[] = [];
    for (const ip of hits) {
      try {
        unlinkSync(join(this.#st.dir, ip));
        released.push(ip);
        d.delete(ip);
      } catch (e) {
        if (errnoCode(e) === 'ENOENT') d.delete(ip);
        else failures.push(`${ip}: ${describe(e)}`);
      }
    }
    // No fsync of DIR (FileStore's DEL does one): a removal need not be durable (a reservation
    // back after a power loss is a leak the reconciler frees), and the next reservation's flush,
    // or the file system's own commit, makes it durable anyway. A DEL answers without a disk wait.
    if (failures.length > 0) {
      this.#ix.dropIndex(this.#st, false);
      throw new AppError('STORE_IO', `cannot release the reservations of ${id} ${ifname} in ${this.#st.dir}: ${failures.join('; ')}`);
    }
    return released;
  }

  /**
   * FileStore's probe (a temporary file created and removed in DIR: not an IP name, so the index is
   * unaffected). Without the lock it borrows the lock when that needs no waiting
   * ({@link NetworkIndexes.probeWritable}), so STATUS, which containerd sends every few seconds,
   * does not make the next ADD refresh the index.
   */
  async writable(): Promise<boolean> {
    this.#assertOpen();
    if (this.#holding) {
      this.#st.dirty = true;
      return this.#st.inner.writable();
    }
    return this.#ix.probeWritable(this.#st, this);
  }

  /**
   * Release (or linger with, see the module comment) the lock if held, then wait for the flush
   * round that makes this handle's reservations durable, as {@link unlock}. Idempotent. Throws
   * `AppError('STORE_IO')` when that flush failed (the request must then not report its address).
   */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    await this.#done();
    await this.#ix.durable(this.#st, this.#durableGen);
  }

  // -----------------------------------------------------------------------------------------------

  #assertOpen(): void {
    if (this.#closed) throw new ClosedError(`file store ${this.#st.dir}`);
  }

  async #done(): Promise<void> {
    this.#lastReserved.clear();
    if (!this.#holding) return;
    // What this hold read may include another request's reservation that is not durable yet.
    if (this.#st.writeGen > this.#durableGen) this.#durableGen = this.#st.writeGen;
    try {
      await this.#ix.verify(this.#st, this, 'request');
    } catch {
      this.#ix.dropIndex(this.#st, false);
    } finally {
      this.#holding = false;
      this.#ix.finish(this.#st, this);
    }
  }

  /** The index, when this handle holds the lock and one can be had. */
  #index(): IndexData | null {
    return this.#holding ? this.#ix.ensure(this.#st) : null;
  }

  /**
   * An IP-named entry may change: re-stat at the end of the hold. Without the lock (a caller
   * breaking the Store contract) the index cannot follow: it is dropped.
   */
  #touchDir(): void {
    if (this.#holding) this.#st.dirty = true;
    else this.#ix.dropIndex(this.#st, false);
  }

  /** Run a FileStore write; on failure the index may no longer match DIR: rebuild it next hold. */
  async #guard<T>(fn: () => Promise<T>): Promise<T> {
    try {
      return await fn();
    } catch (e) {
      this.#ix.dropIndex(this.#st, false);
      throw e;
    }
  }

  #afterReserve(d: IndexData | null, had: boolean, ip: string, owner: { containerId: string; ifname: string }, ok: boolean): void {
    if (d === null) return;
    if (ok) {
      d.set(ip, recordOf(owner));
      // link(2) succeeded on a name the index called taken: the index was stale.
      if (had) this.#ix.dropIndex(this.#st);
      return;
    }
    // EEXIST: fine if the index knew the name; else it was stale.
    if (!had) this.#recheck(d, ip);
  }

  /** Re-read `ip` after a refused write; if the index said otherwise, correct it and drop it. */
  #recheck(d: IndexData, ip: string): void {
    let got: EntryState | null;
    try {
      got = readEntry(join(this.#st.dir, ip), Buffer.allocUnsafe(4096));
    } catch {
      this.#ix.dropIndex(this.#st);
      return;
    }
    const want = d.get(ip);
    if (got === null ? want === null : want !== null && sameEntry(got, want)) return;
    this.#ix.dropIndex(this.#st);
  }
}

/** The index entry of a record ipwarden writes for `owner` (what a re-read gives back). */
function recordOf(owner: { containerId: string; ifname: string }): EntryState {
  const trimmed = goTrimSpace(formatRecord(owner.containerId, owner.ifname));
  return { kind: 'record', trimmed, owner: parseTrimmedRecord(trimmed) };
}

function sameEntry(a: EntryState, b: EntryState | null): boolean {
  if (b === null) return false;
  if (a.kind !== b.kind) return false;
  return a.kind === 'unusable' || (b.kind === 'record' && a.trimmed === b.trimmed);
}

function sameStamp(a: Stamp, b: Stamp): boolean {
  return sameDir(a, b) && a.mtimeNs === b.mtimeNs && a.ctimeNs === b.ctimeNs;
}

/** The same directory (not one removed and re-created, as far as ino and birth time can tell). */
function sameDir(a: Stamp, b: Stamp): boolean {
  return a.ino === b.ino && a.birthNs === b.birthNs;
}

/** `stat(DIR)` as a stamp; null when DIR is missing or not a directory. Throws other errors. */
function statStamp(dir: string): Stamp | null {
  try {
    const s = statSync(dir, { bigint: true });
    if (!s.isDirectory()) return null;
    return { ino: s.ino, birthNs: s.birthtimeNs, mtimeNs: s.mtimeNs, ctimeNs: s.ctimeNs };
  } catch (e) {
    if (errnoCode(e) === 'ENOENT' || errnoCode(e) === 'ENOTDIR') return null;
    throw e;
  }
}

/** open(2) errors of an entry that is no file to read (as FileStore's `UNOPENABLE`). */
const UNOPENABLE: ReadonlySet<string> = new Set(['ENXIO', 'ELOOP', 'ENOTDIR', 'ENODEV', 'EOPNOTSUPP']);

/**
 * Read one IP-named entry with FileStore's rules (`#readRecord` without mtime): one
 * open(O_RDONLY|O_NONBLOCK)/read/close into `buf`. Null when the name is gone; `unusable` when it
 * is there but no record (not a regular file, cannot be opened as one, or a dangling symlink);
 * else the record with its Go-trimmed content (null when not decodable) and owner. Throws
 * `AppError('STORE_IO', 'cannot read <path>: …')` on other errors.
 */
export function readEntry(path: string, buf: Buffer): EntryState | null {
  let fd: number;
  try {
    fd = openSync(path, fsConstants.O_RDONLY | fsConstants.O_NONBLOCK);
  } catch (e) {
    const code = errnoCode(e);
    if (code === 'ENOENT') {
      // A dangling symlink opens as ENOENT but its name is taken.
      try {
        lstatSync(path);
        return { kind: 'unusable' };
      } catch {
        return null;
      }
    }
    if (code !== undefined && UNOPENABLE.has(code)) return { kind: 'unusable' };
    throw new AppError('STORE_IO', `cannot read ${path}: ${describe(e)}`, { cause: e });
  }
  try {
    const n = readRecordHead(fd, buf);
    if ((n === 0 || n === buf.length) && !fstatSync(fd).isFile()) return { kind: 'unusable' };
    const text = n === buf.length ? readLongRecord(fd, buf) : decodeBuffer(buf, n);
    const trimmed = text === null ? null : goTrimSpace(text);
    return { kind: 'record', trimmed, owner: trimmed === null ? null : parseTrimmedRecord(trimmed) };
  } catch (e) {
    const code = errnoCode(e);
    if (code === 'EISDIR' || code === 'EAGAIN' || code === 'EINVAL') return { kind: 'unusable' };
    throw new AppError('STORE_IO', `cannot read ${path}: ${describe(e)}`, { cause: e });
  } finally {
    try {
      closeSync(fd);
    } catch {
      // read-only descriptor
    }
  }
}


function lockTimeout(timeoutSeconds: number, path: string): AppError {
  return new AppError('STORE_LOCK_TIMEOUT', `timed out after ${timeoutSeconds}s waiting for the lock on ${path}`, { retryable: true });
}

/** FileStore's timeout names the time left; say the caller's whole timeout, as FileStore alone would. */
function rewordTimeout(e: unknown, timeoutSeconds: number, path: string): unknown {
  return e instanceof AppError && e.code === 'STORE_LOCK_TIMEOUT' ? lockTimeout(timeoutSeconds, path) : e;
}

let detectedTick: number | null = null;

/**
 * The kernel's timestamp tick, milliseconds: 1000 / CONFIG_HZ from `/proc/config.gz` or
 * `/boot/config-<release>`, else {@link DEFAULT_TICK_MS}. Read once per process. Directory
 * timestamps come from the coarse real-time clock, which advances once per tick
 * (fast-path-measurements.md §3.2: CLOCK_REALTIME_COARSE resolution 4 ms at HZ=250).
 */
export function detectTimestampTickMs(): number {
  if (detectedTick !== null) return detectedTick;
  let text = '';
  try {
    text = gunzipSync(readFileSync('/proc/config.gz')).toString('latin1');
  } catch {
    try {
      text = readFileSync(`/boot/config-${osRelease()}`, 'latin1');
    } catch {
      text = '';
    }
  }
  const m = /^CONFIG_HZ=(\d+)$/m.exec(text);
  const hz = m === null ? 0 : Number(m[1]);
  detectedTick = hz >= 24 && hz <= 10000 ? 1000 / hz : DEFAULT_TICK_MS;
  return detectedTick;
}

function describe(e: unknown): string {
  return e instanceof Error ? e.message : String(e);
}
