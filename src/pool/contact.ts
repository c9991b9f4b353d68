/**
 * Offline allocation in the daemon (issue 11 "A partitioned node keeps allocating from the blocks
 * it owns, and never from others'"; docs/cluster.md "Offline allocation"): the edge part of
 * `PoolSessions` (src/daemon/pool-sessions.ts) — the clock, the journal files and the etcd calls. The rules
 * are in src/pool/offline.ts (pure) and the transactions in src/pool/allocator.ts
 * (`refillReserve`, `syncJournalEntry`).
 *
 * - {@link ContactKV} wraps the daemon's etcd client of a pool and remembers, per watched
 *   `removing/<node>` key, the **send time** (monotonic) of the last request that succeeded and
 *   compared that key absent (a transaction) or read it absent: the node's last confirmed
 *   contact. A request's answer can only come after it was sent, so the marker, if created later,
 *   was created after that time.
 * - {@link OfflinePool} is one pool and node: its reserve as last read, its journal entries, the
 *   counters; `addOffline` (synchronous: take a reserve address, write the journal entry, answer),
 *   `del`, and `maintain` (sync the journal, then refill the reserve; one at a time).
 */
import { readFileSync } from 'node:fs';
import { performance } from 'node:perf_hooks';
import { AppError, isAppError } from '../common/errors.ts';
import { parseIP } from '../common/ip.ts';
import type { PoolAllocation, PoolAllocator, PoolRequest } from './allocator.ts';
import type { OfflineConfig, PoolConfig } from '../ipam/pool-config.ts';
import {
  decodeJournalEntry,
  encodeJournalEntry,
  journalEntryMisfit,
  journalName,
  pickReserve,
  reserveLeft,
  slotKey,
  withinBudget,
  type JournalEntry,
  type OfflineCounters,
  type ReserveSlot,
} from './offline.ts';
import { rangeFor } from '../ipam/range.ts';
import type { IPAMConfig, Range } from '../ipam/types.ts';
import type { ClusterCheck, KV, KVCompare, KVEntry, KVOp, KVStats, KVTxnResult, Leases } from '../store/kv.ts';
import type { PoolJournal } from './journal.ts';

let procUptime: boolean | null = null;

/**
 * The offline budget's clock, milliseconds (review F5 and the suspend note): CLOCK_BOOTTIME as
 * `/proc/uptime` gives it (10 ms resolution) — it counts time the system was suspended or the VM
 * paused (CLOCK_MONOTONIC, `performance.now()`, stands still then while etcd's leases run on),
 * never goes back, and libfaketime does not fake a file read. When `/proc/uptime` cannot be read
 * at the first call, `performance.now()` for the process's life (then a backward step is caught
 * by {@link ContactKV}: a reading below an earlier one drops every contact); when it becomes
 * unreadable later, NaN (no contact is recorded, no budget holds: fail closed).
 */
export function bootClock(): number {
  if (procUptime !== false) {
    try {
      const v = Number(readFileSync('/proc/uptime', 'latin1').split(' ')[0]);
      if (!Number.isFinite(v) || v < 0) throw new Error('unparsable /proc/uptime');
      procUptime = true;
      lastBoot = v * 1000;
      lastBootAt = performance.now();
      return lastBoot;
    } catch {
      if (procUptime === true) return NaN;
      procUptime = false;
    }
  }
  return performance.now();
}

/** The latest reading of {@link bootClock} (ms) and when it was taken (`performance.now()`, ms). */
let lastBoot = NaN;
let lastBootAt = -Infinity;

/** How long {@link coarseBootClock} answers with {@link bootClock}'s latest reading: `/proc/uptime`'s resolution, milliseconds. */
export const COARSE_BOOT_MS = 10;

/**
 * {@link bootClock}, read again only when its latest reading (by any caller) is
 * {@link COARSE_BOOT_MS} or more of `performance.now()` old; else that reading. So it never
 * answers more than the true clock now, and never less than an earlier answer of either function
 * (a reading lower than an earlier one is still a clock that went back). Good for a **send time**
 * (a contact recorded at or before the send only makes the budget shorter) and for watching for a
 * backward step; not for the budget's "now" (after a suspend `performance.now()` has stood still:
 * the latest reading may be far behind), which reads {@link bootClock}. Reading `/proc/uptime`
 * on every etcd call cost the daemon ≈ 10 % of its CPU per pod under load (docs/benchmarks.md).
 */
export function coarseBootClock(): number {
  if (procUptime === true && !Number.isNaN(lastBoot) && performance.now() - lastBootAt < COARSE_BOOT_MS) return lastBoot;
  return bootClock();
}

/** A log sink: level, fields, message (the daemon's log; tests collect). */
export type OfflineLog = (level: 'info' | 'warn' | 'error', fields: Record<string, unknown>, msg: string) => void;

/** See the module comment. Forwards everything to `inner`; records confirmed contacts of watched keys. */
export class ContactKV implements KV, Leases {
  readonly #inner: KV & Leases;
  readonly #clock: () => number;
  readonly #watched = new Set<string>();
  readonly #contact = new Map<string, number>();
  /** Called after every call that succeeded (`afterFailure`: the call before it failed as unavailable). */
  onSuccess: ((afterFailure: boolean) => void) | null = null;
  #failing = false;
  /** The highest clock reading seen so far (a lower one later: the clock went back). */
  #seen = -Infinity;

  /** The clock of send times and of the backward-step watch (see the constructor). */
  readonly #sendClock: () => number;

  /**
   * @param clock milliseconds that never go back (the daemon passes {@link bootClock}; default
   *   `performance.now`): read fresh for {@link lastContact}, the budget's "now"
   * @param sendClock the same clock, possibly a recent reading of it (never above `clock` now,
   *   never below its earlier readings: the daemon passes {@link coarseBootClock}; default
   *   `clock`): read for each call's send time and backward-step watch
   */
  constructor(inner: KV & Leases, clock: () => number = () => performance.now(), sendClock: () => number = clock) {
    this.#inner = inner;
    this.#clock = clock;
    this.#sendClock = sendClock;
  }

  get description(): string {
    return this.#inner.description;
  }
  get stats(): KVStats {
    return this.#inner.stats;
  }
  /** The wrapped client. */
  get inner(): KV & Leases {
    return this.#inner;
  }
  /** The inner client's {@link KV.highestRevision}. */
  get highestRevision(): string | null | undefined {
    return this.#inner.highestRevision;
  }

  /** The inner client's {@link KV.generation}. */
  get generation(): number | undefined {
    return this.#inner.generation;
  }

  /** Record contacts for `removingKey` from now on. */
  watch(removingKey: string): void {
    this.#watched.add(removingKey);
  }

  /**
   * Send time (ms, the clock) of the last request that confirmed `removingKey` absent, or null.
   * Samples the clock: a reading below an earlier one (a clock stepped back) or NaN drops every
   * contact, so a backward step never lengthens the budget (review F5).
   */
  lastContact(removingKey: string): number | null {
    this.#sample(this.#clock);
    return this.#contact.get(removingKey) ?? null;
  }

  /** Read `clock` (default the send clock); on a reading lower than one seen before (or NaN), forget every contact. */
  #sample(clock: () => number = this.#sendClock): number {
    const now = clock();
    if (!(now >= this.#seen)) this.#contact.clear();
    if (now > this.#seen || Number.isNaN(now)) this.#seen = Number.isNaN(now) ? this.#seen : now;
    return now;
  }

  #confirm(key: string, sent: number): void {
    if (!this.#watched.has(key)) return;
    if ((this.#contact.get(key) ?? -Infinity) < sent) this.#contact.set(key, sent);
  }

  async #call<T>(f: () => Promise<T>): Promise<T> {
    this.#sample(); // every call (the heartbeat's too) watches the clock for a backward step
    let r: T;
    try {
      r = await f();
    } catch (e) {
      if (isAppError(e, 'STORE_UNAVAILABLE')) this.#failing = true;
      throw e;
    }
    const after = this.#failing;
    this.#failing = false;
    this.onSuccess?.(after);
    return r;
  }

  get(key: string): Promise<KVEntry | null> {
    const sent = this.#sample();
    return this.#call(async () => {
      const e = await this.#inner.get(key);
      if (e === null) this.#confirm(key, sent);
      return e;
    });
  }
  list(prefix: string, opts?: { readonly keysOnly?: boolean }): Promise<KVEntry[]> {
    return this.#call(() => this.#inner.list(prefix, opts));
  }
  /** The inner client's `getMany` (an absent watched key confirmed, as {@link get}), or each key got. */
  getMany(keys: readonly string[]): Promise<Array<KVEntry | null>> {
    const inner = this.#inner;
    if (inner.getMany === undefined) return Promise.all(keys.map((k) => this.get(k)));
    const sent = this.#sample();
    return this.#call(async () => {
      const es = await (inner.getMany as (k: readonly string[]) => Promise<Array<KVEntry | null>>).call(inner, keys);
      keys.forEach((k, i) => {
        if (es[i] === null) this.#confirm(k, sent);
      });
      return es;
    });
  }
  txn(compare: readonly KVCompare[], ops: readonly KVOp[]): Promise<KVTxnResult> {
    const sent = this.#sample();
    return this.#call(async () => {
      const t = await this.#inner.txn(compare, ops);
      if (t.succeeded) for (const c of compare) if ('absent' in c) this.#confirm(c.key, sent);
      return t;
    });
  }
  grantLease(ttlSeconds: number): Promise<string> {
    return this.#call(() => this.#inner.grantLease(ttlSeconds));
  }
  keepAlive(id: string): Promise<number> {
    return this.#call(() => this.#inner.keepAlive(id));
  }
  revokeLease(id: string): Promise<void> {
    return this.#call(() => this.#inner.revokeLease(id));
  }
  close(): Promise<void> {
    return this.#inner.close();
  }
  /** The inner client's cluster check (etcd), when it has one; not a contact. */
  get clusterCheck(): (() => Promise<ClusterCheck>) | undefined {
    const inner = this.#inner;
    return inner.clusterCheck === undefined ? undefined : () => (inner.clusterCheck as () => Promise<ClusterCheck>).call(inner);
  }
}

/**
 * The error of an offline ADD refused for its budget: `cause` (the STORE_UNAVAILABLE the ADD
 * failed with, code 11) with the reason appended, naming the budget (`ipam.pool.offline.seconds`)
 * and the age of the last confirmed contact:
 * - `<cause>; offline allocation of pool <p> refused: no confirmed contact with etcd to count the offline budget of <S> s from (none since the daemon started, or the clock went back)`;
 * - `<cause>; offline allocation of pool <p> refused: the node's settings in etcd do not hold an offline budget of <S> s yet (<held> s confirmed; a reserve refill sets it)`
 *   (a contact, but no refill yet at S);
 * - `<cause>; offline allocation of pool <p> refused: the offline budget of <S> s is exhausted (last confirmed contact with etcd <age> s ago)`
 *   (age with one decimal).
 */
export function outOfBudget(cause: AppError, pool: string, seconds: number, settingsSeconds: number, last: number | null, now: number): AppError {
  const why =
    last === null || !(now >= last)
      ? `no confirmed contact with etcd to count the offline budget of ${seconds} s from (none since the daemon started, or the clock went back)`
      : settingsSeconds < seconds
        ? `the node's settings in etcd do not hold an offline budget of ${seconds} s yet (${settingsSeconds} s confirmed; a reserve refill sets it)`
        : `the offline budget of ${seconds} s is exhausted (last confirmed contact with etcd ${((now - last) / 1000).toFixed(1)} s ago)`;
  return new AppError('STORE_UNAVAILABLE', `${cause.message}; offline allocation of pool ${pool} refused: ${why}`, { cause, retryable: true });
}

/** What {@link OfflinePool} is made of. */
export interface OfflinePoolParts {
  readonly pool: PoolConfig;
  readonly cfg: OfflineConfig;
  readonly node: string;
  readonly kv: ContactKV;
  /** An allocator of the pool and node for a journal entry's network (sync, DEL). */
  readonly allocFor: (network: string) => PoolAllocator;
  readonly journal: PoolJournal;
  /** Monotonic milliseconds (the same clock as the ContactKV's). */
  readonly clock: () => number;
  /** Wall clock, ms since the epoch (the entries' informational `at`). */
  readonly now: () => number;
  readonly log: OfflineLog;
  /** Told of each counted event (the daemon's observer; default none). */
  readonly event?: (kind: 'add' | 'del' | 'synced' | 'syncFailure') => void;
}

/** The network config an {@link OfflinePool} refills and answers with ({@link OfflinePool.attach}). */
export interface OfflineAttachment {
  readonly conf: IPAMConfig;
  /** An allocator of the pool and node with the config's range sets (refill) — shared block cache. */
  readonly alloc: PoolAllocator;
}

/** A snapshot of one pool and node's offline state (metrics; see `PoolSessions.offlineStats`). */
export interface OfflineStats extends OfflineCounters {
  readonly pool: string;
  readonly node: string;
  /** `ipam.pool.offline.reserve`. */
  readonly reserveTarget: number;
  /** Reserve entries usable now per range set (as last read from etcd, minus the journaled). */
  readonly reserveLeft: number[];
  /** Journal entries not yet synced (also the stuck ones). */
  readonly journaled: number;
  /** Journal entries whose sync failed for good (reserve entry gone) or that were set aside (unreadable, invalid: `<name>.corrupt`): they wait for an operator. */
  readonly stuck: number;
  /** Seconds since the last confirmed contact (monotonic), or null when none yet. */
  readonly contactAgeSeconds: number | null;
}

/** One pool and node's offline allocation. See the module comment. */
export class OfflinePool {
  readonly #p: OfflinePoolParts;
  readonly #removingKey: string;
  readonly counters: OfflineCounters = { offlineAdds: 0, offlineDels: 0, synced: 0, syncFailures: 0 };
  /** Journal entries by file name (this pool and node only). */
  readonly #entries = new Map<string, JournalEntry>();
  /**
   * Entries this process wrote and never sent a sync of: their slots are surely still reserve
   * entries in etcd (an entry read from disk may have had a sync sent before a crash; one whose
   * sync failed may have been applied).
   */
  readonly #certain = new Set<string>();
  /** Entries whose sync found the reserve gone (counted once). */
  readonly #stuck = new Set<string>();
  /** The node's reserve entries as last read from etcd. */
  #view: ReserveSlot[] = [];
  /** Reserve entries turned into allocations since `#view` was read (never handed out again). */
  readonly #consumed = new Set<string>();
  /** Offline seconds the node's settings key held at the last refill (0: not confirmed yet). */
  #settingsSeconds = 0;
  #running: Promise<void> | null = null;
  #again = false;
  #closed = false;
  /** Per journal name: the tail of the operations on it (a DEL is ordered after a sync of the same entry). */
  readonly #locks = new Map<string, Promise<unknown>>();

  /** The network config refills and answers use (the first ADD or announce of the pool); null until then (sync only). */
  #att: OfflineAttachment | null = null;
  /** Entries set aside (`<name>.corrupt` files, also those of earlier runs): offline ADDs are refused while any exists. */
  #aside = 0;
  /** Why the journal directory cannot be read (offline ADDs refused; read again at each maintenance round), or null. */
  #unreadable: string | null = null;

  /**
   * Reads the journal at once (entries a crash left). Never throws: an unreadable directory is
   * logged and offline ADDs are refused until it reads (review F4: the heartbeat and the veto
   * must start all the same).
   */
  constructor(p: OfflinePoolParts) {
    this.#p = p;
    this.#removingKey = p.allocFor('').removingKey(p.node);
    p.kv.watch(this.#removingKey);
    this.#loadOrNote();
  }

  #loadOrNote(): void {
    try {
      this.#load();
      this.#unreadable = null;
    } catch (err) {
      const why = err instanceof Error ? err.message : String(err);
      if (this.#unreadable !== why) this.#p.log('error', { pool: this.#p.pool.name, node: this.#p.node, dir: this.#p.journal.dir, error: why }, 'pool journal cannot be read: offline allocation is off until it can');
      this.#unreadable = why;
    }
  }

  /** Set entry `name` aside (renamed `<name>.corrupt`), with an error line; never throws. */
  #setAside(name: string, why: string): void {
    const file = `${this.#p.journal.dir}/${name}`;
    try {
      this.#p.journal.setAside(name);
      this.#p.log('error', { pool: this.#p.pool.name, node: this.#p.node, file, setAsideAs: `${file}.corrupt`, error: why }, 'pool journal entry set aside for an operator (offline allocation of the pool is off until it is removed)');
    } catch (err) {
      this.#p.log('error', { pool: this.#p.pool.name, node: this.#p.node, file, error: why, renameError: err instanceof Error ? err.message : String(err) }, 'pool journal entry cannot be read nor set aside');
      this.#unreadable ??= `${file}: ${why}`;
    }
  }

  /**
   * Read this pool and node's journal entries (daemon start: entries a crash left). An entry
   * that cannot be read, does not decode, is another node's or pool's, or does not fit the
   * current config ({@link journalEntryMisfit}) is set aside, never dropped (review F4, F7).
   * @throws AppError STORE_IO when the directory itself cannot be used.
   */
  #load(): void {
    const j = this.#p.journal;
    for (const f of j.list()) {
      if (this.#entries.has(f.name)) continue;
      if ('error' in f) {
        this.#setAside(f.name, f.error.message);
        continue;
      }
      let e: JournalEntry;
      try {
        e = decodeJournalEntry(f.text, `${j.dir}/${f.name}`);
      } catch (err) {
        this.#setAside(f.name, (err as Error).message);
        continue;
      }
      const misfit =
        e.node !== this.#p.node
          ? `it is node ${e.node}'s, this node is ${this.#p.node}`
          : journalName(this.#p.pool, e.containerId, e.ifname) !== f.name
            ? `its name is not that of ${e.containerId}/${e.ifname} in pool ${this.#p.pool.name} under these etcd endpoints and prefix`
            : journalEntryMisfit(e, (this.#att?.conf.pool as PoolConfig | undefined) ?? this.#p.pool, this.#att?.conf.rangeSets ?? null);
      if (misfit !== null) {
        this.#setAside(f.name, `pool journal ${j.dir}/${f.name}: ${misfit}`);
        continue;
      }
      this.#entries.set(f.name, e);
    }
    this.#aside = j.asideCount();
  }

  /**
   * The network config to refill and answer with (the pool's first ADD or announce); later calls
   * keep the first. Entries already loaded that do not fit it are set aside (review F7).
   */
  attach(a: OfflineAttachment): void {
    if (this.#att !== null) return;
    this.#att = a;
    for (const [name, e] of [...this.#entries]) {
      const misfit = journalEntryMisfit(e, a.conf.pool as PoolConfig, a.conf.rangeSets);
      if (misfit === null) continue;
      this.#entries.delete(name);
      this.#certain.delete(name);
      this.#setAside(name, `pool journal ${this.#p.journal.dir}/${name}: ${misfit}`);
    }
    try {
      this.#aside = this.#p.journal.asideCount();
    } catch {
      // the next round reads it again
    }
  }

  /** Has {@link attach} been called? */
  get attached(): boolean {
    return this.#att !== null;
  }

  /** Slots journaled (held, or held back by a `del` entry) and converted or released since the view was read: never handed out. */
  #used(): Set<string> {
    const used = new Set(this.#consumed);
    for (const e of this.#entries.values()) for (const x of e.ips) used.add(slotKey(x));
    return used;
  }

  #answer(conf: IPAMConfig, e: JournalEntry, existing: boolean): PoolAllocation[] {
    return e.ips.map((x) => {
      const ip = parseIP(x.ip);
      const rs = conf.rangeSets[x.rangeSet];
      const k = ip === null || rs === undefined ? -1 : rangeFor(rs, ip);
      if (ip === null || rs === undefined || k < 0) throw new AppError('STORE_CORRUPT', `pool journal ${this.#p.journal.dir}: ${x.ip} of ${e.containerId}/${e.ifname} is outside range set ${x.rangeSet} of this network's config`);
      return { rangeSetIndex: x.rangeSet, ip, range: rs[k] as Range, block: x.block, seq: x.seq, existing, borrowed: false };
    });
  }

  /** The journal's answer for a repeated ADD of (containerId, ifname) allocated offline and not yet synced, or null. */
  journaled(conf: IPAMConfig, req: PoolRequest): PoolAllocation[] | null {
    const e = this.#entries.get(journalName(this.#p.pool, req.containerId.trim(), req.ifname));
    return e === undefined || e.kind !== 'add' ? null : this.#answer(conf, e, true);
  }

  /** Is an attachment's entry of kind `del` waiting (released offline)? Then {@link settleDel} first. */
  hasDel(req: PoolRequest): boolean {
    return this.#entries.get(journalName(this.#p.pool, req.containerId.trim(), req.ifname))?.kind === 'del';
  }

  /**
   * ADD while etcd is unreachable (`cause`: the STORE_UNAVAILABLE the ADD failed with). Synchronous:
   * checks the budget (a confirmed contact less than `seconds` ago, and the settings key confirmed
   * at `seconds` or more), takes one reserve entry per range set, writes the journal entry
   * durably, and answers with the result's shape. `mayHoldOnline`: the caller knows (or cannot
   * rule out) that the attachment holds an online allocation (review F3). Throws `cause` when out
   * of budget; a STORE_UNAVAILABLE (code 11, the runtime retries) naming the reason when the
   * reserve is used up, when the attachment may hold an online allocation, when its entry is a
   * held-back `del` not yet synced (review F8), or when journal entries are set aside or the
   * journal cannot be read (review F4: their reserve entries are unknown); STORE_IO when the
   * journal cannot be written (nothing handed out then). Out of budget: STORE_UNAVAILABLE (code
   * 11) with `cause`'s message and why no offline ADD ({@link outOfBudget}).
   */
  addOffline(conf: IPAMConfig, req: PoolRequest, cause: AppError, mayHoldOnline = false): PoolAllocation[] {
    const cfg = this.#cfg;
    const last = this.#p.kv.lastContact(this.#removingKey);
    const now = this.#p.clock();
    if (this.#settingsSeconds < cfg.seconds || !withinBudget(last, now, cfg.seconds)) throw outOfBudget(cause, this.#p.pool.name, cfg.seconds, this.#settingsSeconds, last, now);
    const id = req.containerId.trim();
    const name = journalName(this.#p.pool, id, req.ifname);
    const refuse = (why: string): AppError => new AppError('STORE_UNAVAILABLE', `${cause.message}; ${why}; retry`, { cause });
    if (this.#entries.get(name)?.kind === 'del') throw refuse(`an offline DEL of ${id}/${req.ifname} in pool ${this.#p.pool.name} awaits its sync to etcd (its addresses are held back until then)`);
    if (mayHoldOnline) throw refuse(`${id}/${req.ifname} may hold an online allocation in pool ${this.#p.pool.name} that cannot be read while etcd is unreachable (no second one is given offline)`);
    if (this.#unreadable !== null) throw refuse(`offline allocation of pool ${this.#p.pool.name} is off: its journal cannot be read (${this.#unreadable})`);
    if (this.#aside > 0) throw refuse(`offline allocation of pool ${this.#p.pool.name} is off: ${this.#aside} journal entries in ${this.#p.journal.dir} are set aside (*.corrupt) and may hold reserve addresses; an operator must resolve them`);
    const picks = pickReserve(this.#view, this.#used(), conf.rangeSets.length);
    if (picks === null) {
      throw new AppError('STORE_UNAVAILABLE', `${cause.message}; the offline reserve of pool ${this.#p.pool.name} (${cfg.reserve} per range set) is used up`, { cause });
    }
    const e: JournalEntry = { v: 1, kind: 'add', pool: this.#p.pool, network: conf.name, node: this.#p.node, containerId: id, ifname: req.ifname, at: this.#p.now(), ips: picks };
    this.#p.journal.write(name, encodeJournalEntry(e));
    this.#entries.set(name, e);
    this.#certain.add(name);
    this.#stuck.delete(name);
    this.counters.offlineAdds++;
    this.#p.event?.('add');
    this.#p.log('warn', { pool: this.#p.pool.name, node: this.#p.node, containerId: id, ifname: req.ifname, ips: picks.map((x) => x.ip) }, 'offline ADD from the reserve (etcd unreachable)');
    return this.#answer(conf, e, false);
  }

  #withLock<T>(name: string, f: () => Promise<T>): Promise<T> {
    const prev = this.#locks.get(name) ?? Promise.resolve();
    const run = prev.then(f, f);
    const tail = run.then(
      () => undefined,
      () => undefined,
    );
    this.#locks.set(name, tail);
    void tail.then(() => {
      if (this.#locks.get(name) === tail) this.#locks.delete(name);
    });
    return run;
  }

  /**
   * DEL of a journaled attachment, or null when the journal has none (the caller does the etcd DEL).
   * Ordered after a sync of the same entry. Tries `etcdDel` (it releases a handle an ADD whose
   * answer was lost may have left, and leaves the DEL's tombstone); then the entry goes and its
   * reserve addresses return to the local reserve (they are still reserve entries in etcd).
   * When etcd is unreachable the entry becomes a `del` entry (synced later as a DEL) and the
   * addresses return to the local reserve all the same. Returns the released addresses.
   */
  del(req: PoolRequest, etcdDel: () => Promise<string[]>): Promise<string[] | null> {
    const name = journalName(this.#p.pool, req.containerId.trim(), req.ifname);
    if (!this.#entries.has(name)) return Promise.resolve(null);
    return this.#withLock(name, async () => {
      const e = this.#entries.get(name);
      if (e === undefined) return null; // synced meanwhile: an etcd DEL releases it
      const ips = e.ips.map((x) => x.ip).sort();
      try {
        await etcdDel();
      } catch (err) {
        if (!isAppError(err, 'STORE_UNAVAILABLE')) throw err;
        if (e.kind === 'add') {
          // Back to the local reserve only when surely still reserve entries (see #certain).
          const d: JournalEntry = { ...e, kind: 'del', ips: this.#certain.has(name) ? [] : e.ips, at: this.#p.now() };
          this.#p.journal.write(name, encodeJournalEntry(d));
          this.#entries.set(name, d);
          this.#stuck.delete(name);
          this.counters.offlineDels++;
          this.#p.event?.('del');
          this.#p.log('warn', { pool: this.#p.pool.name, node: this.#p.node, containerId: e.containerId, ifname: e.ifname, ips }, 'offline DEL of an offline attachment (etcd unreachable)');
        }
        return e.kind === 'add' ? ips : [];
      }
      // Released in etcd: had a sync made them the container's, they are free now, not reserve
      // entries: none of them is handed out before a refill has re-read the reserve.
      for (const x of e.ips) this.#consumed.add(slotKey(x));
      this.#p.journal.remove(name);
      this.#entries.delete(name);
      this.#certain.delete(name);
      this.#stuck.delete(name);
      return e.kind === 'add' ? ips : [];
    });
  }

  /** Before an ADD of an attachment with a `del` entry: sync that DEL first (a later sync must not delete the new handle). Unreachable etcd: left (the ADD then fails with code 11 until it is synced: review F8). */
  async settleDel(req: PoolRequest): Promise<void> {
    const name = journalName(this.#p.pool, req.containerId.trim(), req.ifname);
    await this.#withLock(name, async () => {
      const e = this.#entries.get(name);
      if (e?.kind !== 'del') return;
      try {
        await this.#syncEntry(name, e);
      } catch (err) {
        if (!isAppError(err, 'STORE_UNAVAILABLE')) throw err;
      }
    });
  }

  async #syncEntry(name: string, e: JournalEntry): Promise<void> {
    const alloc = this.#p.allocFor(e.network);
    if (e.kind === 'del') {
      await alloc.del({ containerId: e.containerId, ifname: e.ifname });
      for (const x of e.ips) this.#consumed.add(slotKey(x));
    } else {
      this.#certain.delete(name); // from now on the outcome may be unknown
      const r = await alloc.syncJournalEntry(e);
      if (r !== 'synced') {
        if (!this.#stuck.has(name)) {
          this.#stuck.add(name);
          this.counters.syncFailures++;
          this.#p.event?.('syncFailure');
        }
        this.#p.log('error', { pool: this.#p.pool.name, node: this.#p.node, containerId: e.containerId, ifname: e.ifname, ips: e.ips.map((x) => x.ip), file: `${this.#p.journal.dir}/${name}`, why: r.gone },
          'offline allocation cannot be synced: its reserve entry is gone (remove-node --finish ran while the node was cut off?); the journal entry is kept until an operator acts');
        return;
      }
      for (const x of e.ips) this.#consumed.add(slotKey(x));
    }
    this.#p.journal.remove(name);
    this.#entries.delete(name);
    this.counters.synced++;
    this.#p.event?.('synced');
    this.#p.log('info', { pool: this.#p.pool.name, node: this.#p.node, containerId: e.containerId, ifname: e.ifname, kind: e.kind }, 'offline journal entry synced');
  }

  /**
   * Sync every journal entry (one transaction each), stopping at the first failure of etcd
   * (STORE_UNAVAILABLE, CLOSED: rethrown). Any other failure of one entry (a corrupt handle or
   * block, STORE_CONFLICT) is logged and the others go on (review F4: one entry never blocks the
   * rest, nor the refill); it is tried again next round.
   */
  async #sync(): Promise<void> {
    for (const name of [...this.#entries.keys()]) {
      if (this.#stuck.has(name)) continue; // waits for an operator (retried at the next daemon start)
      try {
        await this.#withLock(name, async () => {
          const e = this.#entries.get(name);
          if (e !== undefined) await this.#syncEntry(name, e);
        });
      } catch (err) {
        if (isAppError(err, 'STORE_UNAVAILABLE') || isAppError(err, 'CLOSED')) throw err;
        const e = this.#entries.get(name);
        this.#p.log('error', { pool: this.#p.pool.name, node: this.#p.node, file: `${this.#p.journal.dir}/${name}`, containerId: e?.containerId, ifname: e?.ifname, error: (err as Error).message }, 'offline journal entry not synced this round (the others go on)');
      }
    }
  }

  /**
   * Sync the journal, then refill the reserve (one round at a time; a call during a round runs
   * one more round after it, also after a round that failed). Never throws: a failure is logged and the next trigger (a batch, a
   * heartbeat, the first success after etcd was unreachable) tries again.
   */
  maintain(): Promise<void> {
    if (this.#closed) return Promise.resolve();
    if (this.#running !== null) {
      this.#again = true;
      return this.#running;
    }
    const rounds = async (): Promise<void> => {
      try {
        do {
          this.#again = false;
          try {
            if (this.#unreadable !== null) this.#loadOrNote();
            await this.#sync();
            if (this.#att === null) break; // no network config yet: nothing to refill with
            const r = await this.#att.alloc.refillReserve(this.#cfg.reserve, this.#cfg.seconds);
            this.#view = r.slots;
            this.#consumed.clear();
            this.#settingsSeconds = r.settingsSeconds;
            if (r.short.some((n) => n > 0)) this.#p.log('warn', { pool: this.#p.pool.name, node: this.#p.node, short: r.short }, 'offline reserve below its target: the pool has no free address for it');
          } catch (err) {
            if (!isAppError(err, 'STORE_UNAVAILABLE') && !isAppError(err, 'CLOSED')) this.#p.log('error', { pool: this.#p.pool.name, node: this.#p.node, error: (err as Error).message }, 'offline reserve maintenance failed');
            // Another round only when asked during this one (a first success after a failure, say):
            // a call that joined a failing round must not be left without its own.
            continue;
          }
        } while (this.#again && !this.#closed);
      } finally {
        // Here, right after the last check of #again (no await between): a call that comes later
        // finds #running cleared and starts its own round instead of joining a finished one.
        this.#running = null;
      }
    };
    this.#running = rounds();
    return this.#running;
  }

  /** Is a maintenance round due after a batch: entries to sync, the settings not confirmed, or the reserve below target? */
  get wantsMaintain(): boolean {
    if (this.pendingSync || this.#settingsSeconds < this.#cfg.seconds) return true;
    return reserveLeft(this.#view, this.#used(), this.#rangeSets).some((n) => n < this.#cfg.reserve);
  }

  /** The offline settings: the attached config's, else those the pool was made with. */
  get #cfg(): OfflineConfig {
    return (this.#att?.conf.pool as PoolConfig | undefined)?.offline ?? this.#p.cfg;
  }

  get #rangeSets(): number {
    return this.#att?.conf.rangeSets.length ?? 0;
  }

  /** Entries to sync (not stuck) exist. */
  get pendingSync(): boolean {
    return [...this.#entries.keys()].some((n) => !this.#stuck.has(n));
  }

  /** A snapshot for metrics. */
  stats(): OfflineStats {
    const rangeSets = this.#rangeSets;
    const last = this.#p.kv.lastContact(this.#removingKey);
    return {
      pool: this.#p.pool.name,
      node: this.#p.node,
      ...this.counters,
      reserveTarget: this.#cfg.reserve,
      reserveLeft: reserveLeft(this.#view, this.#used(), rangeSets),
      journaled: this.#entries.size,
      stuck: this.#stuck.size + this.#aside,
      contactAgeSeconds: last === null ? null : (this.#p.clock() - last) / 1000,
    };
  }

  /** Stop maintaining (the sessions close). */
  close(): void {
    this.#closed = true;
  }
}
