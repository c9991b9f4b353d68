/**
 * `MemoryStore`: the in-memory fake of {@link Store} for unit tests of pure logic (allocator,
 * reconcile plan/apply), like host-local's `backend/testing/fake_store.go`. Same semantics as the
 * file store: reservations keyed by canonical IP text with an owner (legacy ID-only owners and
 * corrupt `null` owners included), `last_reserved_ip` per range set index, release by IP with an
 * owner check, release by owner with the legacy fallback, idempotent `close`.
 *
 * Test aids: `seed`/`setLastReserved` to build a state, `snapshot()` to assert it, `calls` to
 * count method calls (e.g. to prove an allocation did not scan a /64), and an `onReserve` hook to
 * simulate a racing writer or an I/O failure.
 */

import { AppError, ClosedError } from '../../common/errors.ts';
import { formatIP, parseIP } from '../../common/ip.ts';
import type { Owner, Reservation, Store } from '../store.ts';
import { sameOwner } from '../store.ts';

/** Options of {@link MemoryStore}. */
export interface MemoryStoreOptions {
  /**
   * Throw `AppError('INTERNAL')` when a method that needs the lock is called without it
   * (the Store contract's locking rule). Default true.
   */
  enforceLock?: boolean;
  /** Clock for `mtimeMs` of new reservations, milliseconds since the epoch. Default `Date.now`. */
  now?: () => number;
  /**
   * Called before each `reserve` of a free IP. Return `'taken'` to make it behave as if another
   * writer had just created the file (reserve returns false and the IP becomes reserved by
   * `{containerId: 'racer', ifname: 'eth0'}`), `'io'` to throw `AppError('STORE_IO')`, anything
   * else to proceed.
   */
  onReserve?: (ip: string, owner: Owner, rangeSetIndex: number) => 'taken' | 'io' | void;
  /** Value returned by `writable()`. Default true. */
  writable?: boolean;
}

interface Entry {
  owner: Owner | null;
  mtimeMs: number;
}

/** Number of calls per Store method (test aid). */
export type CallCounts = Record<
  'lock' | 'unlock' | 'list' | 'reserve' | 'restore' | 'rewrite' | 'lastReservedIP' | 'release' | 'releaseByOwner' | 'writable' | 'close' | 'touch' | 'recoveryPending' | 'markRecovery',
  number
>;

/** In-memory {@link Store}. See the module comment. */
export class MemoryStore implements Store {
  readonly network: string;
  /** Calls per method since construction (or the last `resetCalls()`). */
  readonly calls: CallCounts = {
    lock: 0,
    unlock: 0,
    list: 0,
    reserve: 0,
    restore: 0,
    rewrite: 0,
    lastReservedIP: 0,
    release: 0,
    releaseByOwner: 0,
    touch: 0,
    recoveryPending: 0,
    markRecovery: 0,
    writable: 0,
    close: 0,
  };
  /** Writable flag returned by `writable()`; tests may flip it. */
  isWritable: boolean;
  /** The recovery mark (`markRecovery`); tests may set it to simulate a killed recovery. */
  recovering = false;

  readonly #entries = new Map<string, Entry>();
  readonly #lastReserved = new Map<number, string>();
  readonly #enforceLock: boolean;
  readonly #now: () => number;
  readonly #onReserve: MemoryStoreOptions['onReserve'];
  #locked = false;
  #closed = false;

  constructor(network: string, opts: MemoryStoreOptions = {}) {
    this.network = network;
    this.#enforceLock = opts.enforceLock ?? true;
    this.#now = opts.now ?? Date.now;
    this.#onReserve = opts.onReserve;
    this.isWritable = opts.writable ?? true;
  }

  /** True between `lock()` and `unlock()`. */
  get locked(): boolean {
    return this.#locked;
  }

  /** True after `close()`. */
  get closed(): boolean {
    return this.#closed;
  }

  #open(): void {
    if (this.#closed) throw new ClosedError(`memory store ${JSON.stringify(this.network)}`);
  }

  #guard(): void {
    this.#open();
    if (this.#enforceLock && !this.#locked) {
      throw new AppError('INTERNAL', 'store method called without holding the lock');
    }
  }

  /** Throws unless `ip` is canonical IP text (what crosses the Store interface). */
  #canonical(ip: string): void {
    const p = parseIP(ip);
    if (p === null || formatIP(p) !== ip) throw new AppError('INTERNAL', `not a canonical IP: ${JSON.stringify(ip)}`);
  }

  /** No-op flag: the fake has one user at a time. */
  async lock(timeoutSeconds: number): Promise<void> {
    void timeoutSeconds;
    this.calls.lock++;
    this.#open();
    this.#locked = true;
  }

  async unlock(): Promise<void> {
    this.calls.unlock++;
    this.#open();
    this.#locked = false;
  }

  async list(): Promise<Reservation[]> {
    this.calls.list++;
    this.#guard();
    return [...this.#entries].map(([ip, e]) => ({ ip, owner: e.owner, mtimeMs: e.mtimeMs }));
  }

  async reserve(ip: string, owner: { containerId: string; ifname: string }, rangeSetIndex: number): Promise<boolean> {
    this.calls.reserve++;
    return this.#reserve(ip, owner, rangeSetIndex, true);
  }

  /**
   * As `reserve` without touching `last_reserved_ip`. The `onReserve` hook is called with range
   * set index -1.
   */
  async restore(ip: string, owner: { containerId: string; ifname: string }): Promise<boolean> {
    this.calls.restore++;
    return this.#reserve(ip, owner, -1, false);
  }

  #reserve(ip: string, owner: { containerId: string; ifname: string }, rangeSetIndex: number, recordLast: boolean): boolean {
    this.#guard();
    this.#canonical(ip);
    if (this.#entries.has(ip)) return false;
    const stored: Owner = { containerId: owner.containerId.trim(), ifname: owner.ifname };
    const hook = this.#onReserve?.(ip, stored, rangeSetIndex);
    if (hook === 'io') throw new AppError('STORE_IO', `failed to reserve ${ip}: injected I/O error`);
    if (hook === 'taken') {
      this.#entries.set(ip, { owner: { containerId: 'racer', ifname: 'eth0' }, mtimeMs: this.#now() });
      return false;
    }
    this.#entries.set(ip, { owner: stored, mtimeMs: this.#now() });
    if (recordLast) this.#lastReserved.set(rangeSetIndex, ip);
    return true;
  }

  async lastReservedIP(rangeSetIndex: number): Promise<string | null> {
    this.calls.lastReservedIP++;
    this.#guard();
    return this.#lastReserved.get(rangeSetIndex) ?? null;
  }

  async rewrite(ip: string, expected: Owner, owner: { containerId: string; ifname: string }): Promise<boolean> {
    this.calls.rewrite++;
    this.#guard();
    const e = this.#entries.get(ip);
    if (e === undefined || !sameOwner(e.owner, expected)) return false;
    this.#entries.set(ip, { owner: { containerId: owner.containerId.trim(), ifname: owner.ifname }, mtimeMs: this.#now() });
    return true;
  }

  async release(ip: string, expected: Owner | null): Promise<boolean> {
    this.calls.release++;
    this.#guard();
    const e = this.#entries.get(ip);
    if (e === undefined || !sameOwner(e.owner, expected)) return false;
    this.#entries.delete(ip);
    return true;
  }

  async touch(ip: string, expected: Owner | null): Promise<boolean> {
    this.calls.touch++;
    this.#guard();
    const e = this.#entries.get(ip);
    if (e === undefined || !sameOwner(e.owner, expected)) return false;
    this.#entries.set(ip, { owner: e.owner, mtimeMs: this.#now() });
    return true;
  }

  async recoveryPending(): Promise<boolean> {
    this.calls.recoveryPending++;
    this.#open();
    return this.recovering;
  }

  async markRecovery(pending: boolean): Promise<void> {
    this.calls.markRecovery++;
    this.#guard();
    this.recovering = pending;
  }

  async releaseByOwner(containerId: string, ifname: string): Promise<string[]> {
    this.calls.releaseByOwner++;
    this.#guard();
    const id = containerId.trim();
    const pick = (legacy: boolean): string[] =>
      [...this.#entries]
        .filter(([, e]) => e.owner !== null && e.owner.containerId === id && e.owner.ifname === (legacy ? null : ifname))
        .map(([ip]) => ip);
    let ips = pick(false);
    if (ips.length === 0) ips = pick(true);
    for (const ip of ips) this.#entries.delete(ip);
    return ips.sort();
  }

  async writable(): Promise<boolean> {
    this.calls.writable++;
    this.#open();
    return this.isWritable;
  }

  async close(): Promise<void> {
    this.calls.close++;
    this.#locked = false;
    this.#closed = true;
  }

  // --- test aids (not part of Store) ---

  /**
   * Put a reservation in place without any check: `owner` as an {@link Owner}, a string
   * (`"c1|eth0"` = c1 on eth0, `"c3"` = legacy ID-only record), or null (corrupt record).
   */
  seed(ip: string, owner: Owner | string | null, mtimeMs = 0): this {
    this.#canonical(ip);
    let o: Owner | null;
    if (typeof owner === 'string') {
      const bar = owner.indexOf('|');
      o = bar < 0 ? { containerId: owner, ifname: null } : { containerId: owner.slice(0, bar), ifname: owner.slice(bar + 1) };
    } else {
      o = owner;
    }
    this.#entries.set(ip, { owner: o, mtimeMs });
    return this;
  }

  /** Set (or with null, clear) `last_reserved_ip.<rangeSetIndex>`. */
  setLastReserved(rangeSetIndex: number, ip: string | null): this {
    if (ip === null) this.#lastReserved.delete(rangeSetIndex);
    else this.#lastReserved.set(rangeSetIndex, ip);
    return this;
  }

  /** The state as plain data: reservations (`ip → "id|ifname"`, `"id"`, or null) and last reserved IPs. */
  snapshot(): { reservations: Record<string, string | null>; lastReserved: Record<number, string> } {
    const reservations: Record<string, string | null> = {};
    for (const ip of [...this.#entries.keys()].sort()) {
      const o = (this.#entries.get(ip) as Entry).owner;
      reservations[ip] = o === null ? null : o.ifname === null ? o.containerId : `${o.containerId}|${o.ifname}`;
    }
    const lastReserved: Record<number, string> = {};
    for (const [k, v] of [...this.#lastReserved].sort((a, b) => a[0] - b[0])) lastReserved[k] = v;
    return { reservations, lastReserved };
  }

  /** Reset `calls` to zero. */
  resetCalls(): void {
    for (const k of Object.keys(this.calls) as (keyof CallCounts)[]) this.calls[k] = 0;
  }
}
