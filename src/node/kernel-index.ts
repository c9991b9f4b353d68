/**
 * The daemon's index of the kernel's addresses (docs/daemon.md "The kernel address index"): every
 * address configured on an interface in every network namespace of the node, read again every
 * {@link KERNEL_INDEX_INTERVAL_MS}, so an ADD served by the daemon can skip an address some
 * namespace already uses without reading the kernel itself (a full read costs 3 ms on a quiet
 * node, 60–120 ms on one with 2,000 processes and 300 namespaces: docs/benchmarks.md).
 *
 * Each read is a full {@link readKernelEvidenceAsync} without the process environments (the
 * addresses only), run without holding the event loop for more than a slice of it. The index keeps
 * the last read whole — never a merge of two — with when it started (monotonic clock) and whether
 * it was complete (the same notion as {@link KernelEvidence.incomplete}). It is usable for an ADD
 * only when its last read was complete and started at most {@link KERNEL_INDEX_MAX_AGE_MS} ago:
 * then every address configured before that start and still configured at its read is in it.
 * Otherwise {@link KernelIndex.state} says why, and the ADD behaves as host-local would.
 *
 * Why a periodic full read and no event subscription: namespaces come and go without any event
 * this process could subscribe to from outside them (a process's `unshare(2)`), so a full read is
 * needed as the backstop anyway, and a netlink socket held open inside a pod's namespace would
 * keep that namespace (and its addresses) alive after the runtime removed it.
 */
import { performance } from 'node:perf_hooks';
import { readKernelEvidenceAsync, type AddressHolder, type KernelEvidence } from './kernel-evidence.ts';

/** Milliseconds from the end of one read to the start of the next (default of {@link KernelIndexOptions.intervalMs}). */
export const KERNEL_INDEX_INTERVAL_MS = 3000;

/**
 * Oldest a read may be, from its start, for the index to be used by an ADD, milliseconds (default
 * of {@link KernelIndexOptions.maxAgeMs}): the interval, plus the longest a read can take when a
 * pinned namespace hangs its helper (`PINNED_HELPER_TIMEOUT_MS`, 5 s: that read then lands
 * incomplete), plus 2 s for a loaded node. The bound of the index: an address configured at least
 * this long before an ADD starts, and still configured, is in the index the ADD uses — or the ADD
 * does not use the index and logs why. In steady state an index is at most one interval plus one
 * read old.
 */
export const KERNEL_INDEX_MAX_AGE_MS = 10_000;

/** One whole read of the kernel, as the index holds it. */
export interface KernelIndexRead {
  /** 1 for the first read, +1 for each read after it (complete or not). */
  readonly generation: number;
  /** When the read started, on the index's monotonic clock (milliseconds). */
  readonly startedAtMs: number;
  /** How long it took, milliseconds. */
  readonly durationMs: number;
  /** Canonical IP text → the namespaces where it is configured. */
  readonly addresses: ReadonlyMap<string, readonly AddressHolder[]>;
  /** null when every namespace was read; else what could not be ({@link KernelEvidence.incomplete}). */
  readonly incomplete: string | null;
  /** Distinct network namespaces read. */
  readonly namespaces: number;
}

/** Why the index cannot be used: no read landed yet, the last read was incomplete, or it is older than the bound. */
export type KernelIndexUnusable = 'no-read' | 'incomplete' | 'stale';

/** Whether an ADD may use the index now: `usable`, or why not (`reason`, and one clause `why`). */
export type KernelIndexState =
  | { readonly usable: true; readonly read: KernelIndexRead; readonly ageMs: number }
  | { readonly usable: false; readonly read: KernelIndexRead | null; readonly reason: KernelIndexUnusable; readonly why: string };

/** Options of {@link KernelIndex}; every one has a production default. */
export interface KernelIndexOptions {
  /** One full read (default: `readKernelEvidenceAsync({ inFlight: false })`). A rejection counts as an incomplete read. */
  readonly read?: () => Promise<KernelEvidence>;
  /** Default {@link KERNEL_INDEX_INTERVAL_MS}. */
  readonly intervalMs?: number;
  /** Default {@link KERNEL_INDEX_MAX_AGE_MS}. */
  readonly maxAgeMs?: number;
  /** Monotonic clock, milliseconds (default `performance.now`). */
  readonly now?: () => number;
  /** Run `fn` after `ms` milliseconds; returns a cancel function (default: an unref'd `setTimeout`). */
  readonly schedule?: (fn: () => void, ms: number) => () => void;
  /** Told of every read as it lands, with the one it replaced; must not throw (a throw is ignored). */
  readonly onRead?: (read: KernelIndexRead, previous: KernelIndexRead | null) => void;
}

function defaultSchedule(fn: () => void, ms: number): () => void {
  const t = setTimeout(fn, ms);
  t.unref();
  return () => clearTimeout(t);
}

/**
 * The index. Lifecycle: {@link start} (reads once, then again {@link KernelIndexOptions.intervalMs}
 * after the end of each read), {@link close} (idempotent). Reads never overlap.
 */
export class KernelIndex {
  readonly intervalMs: number;
  readonly maxAgeMs: number;
  private readonly readFn: () => Promise<KernelEvidence>;
  private readonly now: () => number;
  private readonly schedule: (fn: () => void, ms: number) => () => void;
  private readonly onRead: ((read: KernelIndexRead, previous: KernelIndexRead | null) => void) | undefined;
  private lastRead: KernelIndexRead | null = null;
  private generation = 0;
  /** The read running now, and when it started. */
  private running: { readonly promise: Promise<KernelIndexRead>; readonly startedAtMs: number } | null = null;
  /** A read asked for ({@link refresh}) while one was running: it starts when that one ends. */
  private queued: Promise<KernelIndexRead> | null = null;
  private cancelTimer: (() => void) | null = null;
  private started = false;
  private closed = false;

  constructor(opts: KernelIndexOptions = {}) {
    this.readFn = opts.read ?? (() => readKernelEvidenceAsync({ inFlight: false }));
    this.intervalMs = opts.intervalMs ?? KERNEL_INDEX_INTERVAL_MS;
    this.maxAgeMs = opts.maxAgeMs ?? KERNEL_INDEX_MAX_AGE_MS;
    this.now = opts.now ?? (() => performance.now());
    this.schedule = opts.schedule ?? defaultSchedule;
    this.onRead = opts.onRead;
  }

  /** The last read, or null before the first one landed. */
  get last(): KernelIndexRead | null {
    return this.lastRead;
  }

  /** Seconds since the last read started (monotonic), or null before the first one landed. */
  ageSeconds(): number | null {
    return this.lastRead === null ? null : (this.now() - this.lastRead.startedAtMs) / 1000;
  }

  /**
   * Start: read once now, then periodically. Resolves when the first read has landed (whatever
   * it found). Calling it again does nothing more (resolves at once).
   */
  async start(): Promise<void> {
    if (this.started || this.closed) return;
    this.started = true;
    await this.readNow();
  }

  /**
   * May an ADD use the index now? `usable` with the read and its age when the last read was
   * complete and started at most `maxAgeMs` ago; else why not: no read yet, the last read was
   * incomplete (its reason), or it is too old.
   */
  state(): KernelIndexState {
    const read = this.lastRead;
    if (read === null) return { usable: false, read, reason: 'no-read', why: 'the kernel address index has no read yet' };
    if (read.incomplete !== null) return { usable: false, read, reason: 'incomplete', why: `the kernel address index is incomplete: ${read.incomplete}` };
    const ageMs = this.now() - read.startedAtMs;
    if (ageMs > this.maxAgeMs) {
      return { usable: false, read, reason: 'stale', why: `the kernel address index is stale: its last read started ${(ageMs / 1000).toFixed(1)} s ago (bound ${this.maxAgeMs / 1000} s)` };
    }
    return { usable: true, read, ageMs };
  }

  /**
   * A read that starts after this call (the one running now, if any, started before it: it is
   * waited for, then one more is made; calls made meanwhile share that one). Resolves to it once it
   * landed; never rejects. After {@link close}, resolves to the last read made, or rejects when
   * there was none.
   */
  refresh(): Promise<KernelIndexRead> {
    if (this.closed) return this.lastRead === null ? Promise.reject(new Error('the kernel address index is closed')) : Promise.resolve(this.lastRead);
    if (this.running === null) return this.readNow();
    this.queued ??= this.running.promise.then((last) => {
      this.queued = null;
      return this.closed ? last : this.readNow();
    });
    return this.queued;
  }

  /** Stop reading; waits for a read in flight. Idempotent. */
  async close(): Promise<void> {
    this.closed = true;
    this.cancelTimer?.();
    this.cancelTimer = null;
    if (this.running !== null) await this.running.promise;
    if (this.queued !== null) await this.queued;
  }

  /** Run one read now (none may be running), keep it, schedule the next. */
  private readNow(): Promise<KernelIndexRead> {
    this.cancelTimer?.();
    this.cancelTimer = null;
    const startedAtMs = this.now();
    const promise = (async (): Promise<KernelIndexRead> => {
      let ev: Pick<KernelEvidence, 'addresses' | 'incomplete' | 'namespaces'>;
      try {
        ev = await this.readFn();
      } catch (e) {
        ev = { addresses: new Map(), incomplete: `the read failed: ${e instanceof Error ? e.message : String(e)}`, namespaces: 0 };
      }
      const read: KernelIndexRead = {
        generation: ++this.generation,
        startedAtMs,
        durationMs: this.now() - startedAtMs,
        addresses: ev.addresses,
        incomplete: ev.incomplete,
        namespaces: ev.namespaces,
      };
      const previous = this.lastRead;
      this.lastRead = read;
      this.running = null;
      try {
        this.onRead?.(read, previous);
      } catch {
        // an observer's failure is not the index's
      }
      if (!this.closed && this.queued === null) this.cancelTimer = this.schedule(() => void this.tick(), this.intervalMs);
      return read;
    })();
    this.running = { promise, startedAtMs };
    return promise;
  }

  private tick(): void {
    this.cancelTimer = null;
    if (this.closed || this.running !== null) return;
    void this.readNow();
  }
}

/** Namespaces as one clause: `net:[…] via /proc/…/ns/net` (plus ` (ifname)` for IPv6) for each, joined by `; `. */
export function describeHolders(holders: readonly AddressHolder[]): string {
  return holders.map((h) => `${h.netns} via ${h.via}${h.ifname === null ? '' : ` (${h.ifname})`}`).join('; ');
}
