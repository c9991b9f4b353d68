/**
 * The daemon's pool sessions (docs/cluster.md "The daemon and pools"): {@link PoolSessions}, the
 * plugin server's {@link PoolHooks} — one etcd client per pool, the node's ADDs and DELs batched
 * per network ({@link Batcher}), the node's heartbeat (src/daemon/heartbeat.ts), offline
 * allocation and automatic node removal — told to the daemon's metrics through a
 * {@link PoolObserver} (src/daemon/pool-observer.ts). Moved here from src/cni/pool.ts (the
 * standalone plugin's hooks stay there).
 */
import { lstatSync, readdirSync } from 'node:fs';
import { performance } from 'node:perf_hooks';
import { hostname } from 'node:os';
import { join } from 'node:path';
import { AppError, ClosedError, errnoCode, isAppError } from '../common/errors.ts';
import type { PoolConfig } from '../ipam/pool-config.ts';
import { untrustedReason } from '../common/trust.ts';
import type { IPAMConfig, NetworkIdentity } from '../ipam/types.ts';
import type { KV, Leases } from '../store/kv.ts';
import { EtcdKV } from '../store/etcd/etcd-kv.ts';
import type { PoolGcOutcome } from '../reconcile/pool-pass.ts';
import { delNodeName, NO_NODE, resolveNodeName } from '../node/node-name.ts';
import {
  allocatorFor,
  AutoReclaimer,
  logReport,
  SeenWriter,
  type AutoReclaimReport,
  BlockCache,
  bootClock,
  coarseBootClock,
  ContactKV,
  decodeJournalEntry,
  DEFAULT_POOL_JOURNAL_ROOT,
  etcdFor,
  MAX_BATCH,
  metaOf,
  OfflinePool,
  PoolAllocator,
  PoolJournal,
  poolJournalDir,
  POOL_DIR_RE,
  poolNodeSample,
  settingsValue,
  type CorruptSkip,
  type OfflineLog,
  type OfflineStats,
  type PoolAllocation,
  type PoolRequest,
  type PoolSource,
} from '../pool/index.ts';
import { poolGcWith, type PoolHooks } from '../cni/pool.ts';
import { Heartbeat, HEARTBEAT_TTL_SECONDS, realEvery, type Every } from './heartbeat.ts';
import { observeTxns, resultOf, tell, type PoolObserver, type PoolRequestEvent, type PoolSample, type PoolSampleError } from './pool-observer.ts';

interface Waiter {
  readonly req: PoolRequest;
  readonly signal?: AbortSignal;
  readonly resolve: (r: PoolAllocation[]) => void;
  readonly reject: (e: unknown) => void;
}

/** A queued DEL (issue 18 item 5: DELs go in the same batch as the ADDs). */
interface DelWaiter {
  readonly del: true;
  readonly req: PoolRequest;
  readonly resolve: (r: string[]) => void;
  readonly reject: (e: unknown) => void;
}

type Queued = Waiter | DelWaiter;

function isDel(w: Queued): w is DelWaiter {
  return 'del' in w;
}

/**
 * The ADDs and DELs of one node for one network config, batched: a round is taken one turn of
 * the event loop (`setImmediate`) after the first request, so the requests set off by the same
 * I/O events or by the last round's answers go together; requests that arrive while a
 * transaction is in flight wait and go together in the next one (at most `MAX_BATCH`, ADDs and
 * DELs together: {@link PoolAllocator.batch}), so under load a node sends one transaction per
 * round for many pods — every block it changes written once — (the batching Calico proposed,
 * projectcalico/cni-plugin#985) and when idle it adds no timer, only that turn. A round
 * is taken from the queue in order and stops before a second request of one attachment (an ADD
 * queued after that container's DEL goes in the next round). A batch that fails as a whole (a
 * corrupt handle of one request, a conflict) is retried one request at a time, so one bad
 * request fails only itself.
 */
class Batcher {
  readonly #alloc: PoolAllocator;
  readonly #queue: Queued[] = [];
  readonly #onBatch: (size: number) => void;
  #running = false;
  /** Transactions' batch sizes so far (tests). */
  readonly sizes: number[] = [];

  /**
   * With offline allocation: a batch that fails as unavailable fails every request at once, and
   * the requests queued behind it too (no retry one by one, no second deadline: etcd is down for all).
   */
  readonly #failFastUnavailable: boolean;

  /** Awaited before a round (or a retry one by one) checks which clients have gone ({@link PoolSessionsOptions.clientsCurrent}). */
  readonly #clientsCurrent: () => Promise<void>;

  /**
   * @param onBatch told the size of every batch taken from the queue (the observer's `batch`).
   * @param failFastUnavailable see the field (the pool has `ipam.pool.offline`).
   * @param clientsCurrent see {@link PoolSessionsOptions.clientsCurrent} (default: nothing to wait for).
   */
  constructor(alloc: PoolAllocator, onBatch: (size: number) => void = () => undefined, failFastUnavailable = false, clientsCurrent: () => Promise<void> = async () => undefined) {
    this.#alloc = alloc;
    this.#onBatch = onBatch;
    this.#failFastUnavailable = failFastUnavailable;
    this.#clientsCurrent = () => clientsCurrent().catch(() => undefined);
  }

  /** The allocator this batcher's rounds run on (bound to one etcd client: its settings). */
  get allocator(): PoolAllocator {
    return this.#alloc;
  }

  /** {@link clientsCurrent}, when a queued ADD has a client to check (else nothing to wait for). */
  #current(): Promise<void> {
    return this.#queue.some((w) => !isDel(w) && w.signal !== undefined) ? this.#clientsCurrent() : Promise.resolve();
  }

  /** Drop (rejected: not sent) every queued ADD whose client has gone. */
  #dropGone(): void {
    for (let i = this.#queue.length - 1; i >= 0; i--) {
      const w = this.#queue[i] as Queued;
      if (!isDel(w) && w.signal?.aborted === true) {
        this.#queue.splice(i, 1);
        w.reject(goneError(w));
      }
    }
  }

  submit(req: PoolRequest, signal?: AbortSignal): Promise<PoolAllocation[]> {
    return new Promise((resolve, reject) => {
      this.#queue.push({ req, resolve, reject, ...(signal === undefined ? {} : { signal }) });
      if (!this.#running) void this.#drain();
    });
  }

  /** A DEL, released in the next round with the queued ADDs ({@link PoolAllocator.batch}). Resolves to the released addresses. */
  submitDel(req: PoolRequest): Promise<string[]> {
    return new Promise((resolve, reject) => {
      this.#queue.push({ del: true, req, resolve, reject });
      if (!this.#running) void this.#drain();
    });
  }

  /** The next round: queued requests in order, at most `MAX_BATCH`, stopping before a second request of one attachment. */
  #take(): Queued[] {
    const seen = new Set<string>();
    let n = 0;
    for (; n < this.#queue.length && n < MAX_BATCH_REQUESTS; n++) {
      const r = (this.#queue[n] as Queued).req;
      const k = JSON.stringify([r.containerId.trim(), r.ifname]);
      if (seen.has(k)) break;
      seen.add(k);
    }
    return this.#queue.splice(0, n);
  }

  /**
   * Take (containerId, ifname)'s ADDs out of the queue (not one in flight), rejected with
   * `STORE_CONFLICT` (CNI 11): a DEL of that container came, so whoever asked has given up.
   * Returns how many were taken.
   */
  cancel(req: PoolRequest, why: string): number {
    let n = 0;
    for (let i = this.#queue.length - 1; i >= 0; i--) {
      const w = this.#queue[i] as Queued;
      if (isDel(w) || w.req.containerId.trim() !== req.containerId.trim() || w.req.ifname !== req.ifname) continue;
      this.#queue.splice(i, 1);
      w.reject(new AppError('STORE_CONFLICT', why));
      n++;
    }
    return n;
  }

  async #drain(): Promise<void> {
    this.#running = true;
    try {
      while (this.#queue.length > 0) {
        // One turn of the event loop before a round is taken: the requests that the last round's
        // answers (or the same I/O events) set off join it instead of waiting a whole round
        // behind a round of one (under load the rounds otherwise alternated 1 and n-1 requests).
        await new Promise<void>((r) => setImmediate(r));
        // A waiter whose client has gone (its signal aborted) is not sent: nobody would get its
        // answer, and a runtime that gave it up may have DELeted it meanwhile. First every client
        // that went away before now is known gone (a daemon that was stopped learns of them as it
        // resumes, from its socket thread).
        await this.#current();
        this.#dropGone();
        if (this.#queue.length === 0) break;
        const batch = this.#take();
        const adds = batch.filter((w): w is Waiter => !isDel(w));
        const dels = batch.filter(isDel);
        this.sizes.push(batch.length);
        this.#onBatch(batch.length);
        try {
          const r = await this.#alloc.batch(
            adds.map((w) => w.req),
            dels.map((w) => w.req),
          );
          settle(adds, r.adds);
          settle(dels, r.dels);
        } catch (e) {
          if (this.#failFastUnavailable && isAppError(e, 'STORE_UNAVAILABLE')) {
            // etcd is unreachable for all: the requests that queued meanwhile fail with the same
            // answer now (each ADD then goes offline) instead of waiting for another call deadline
            // each batch — except an ADD whose client has gone, which goes nowhere.
            await this.#clientsCurrent();
            for (const w of [...batch, ...this.#queue.splice(0)]) w.reject(!isDel(w) && w.signal?.aborted === true ? goneError(w) : e);
            continue;
          }
          if (batch.length === 1) {
            (batch[0] as Queued).reject(e);
            continue;
          }
          for (const w of batch) {
            try {
              // Each retry is an etcd call (up to its deadline): check its client just before it.
              if (!isDel(w) && w.signal !== undefined) await this.#clientsCurrent();
              if (!isDel(w) && w.signal?.aborted === true) {
                w.reject(goneError(w));
                continue;
              }
              if (isDel(w)) w.resolve(await this.#alloc.del(w.req));
              else settle([w], await this.#alloc.add([w.req]));
            } catch (e1) {
              w.reject(e1);
            }
          }
        }
      }
    } finally {
      this.#running = false;
    }
  }
}

/** The answer of an ADD not sent because its client has gone. */
function goneError(w: Waiter): AppError {
  return new AppError('STORE_CONFLICT', `ADD of ${w.req.containerId.trim()}/${w.req.ifname} not sent: its client has gone`);
}

function settle<T>(batch: ReadonlyArray<{ readonly resolve: (r: T) => void; readonly reject: (e: unknown) => void }>, results: ReadonlyArray<T | AppError>): void {
  batch.forEach((w, i) => {
    const r = results[i];
    if (r instanceof AppError || r === undefined) w.reject(r ?? new AppError('INTERNAL', 'no answer for a batched request'));
    else w.resolve(r);
  });
}

/** A pool's identity in the daemon: its etcd (endpoints, prefix) and its name. */
function poolKey(pool: PoolConfig): string {
  return JSON.stringify([pool.etcd.endpoints, pool.etcd.prefix, pool.name]);
}

/**
 * The settings of a pool's etcd client: endpoints, prefix, TLS files and credentials file. Two
 * configs of one pool that differ in any of them get two clients (docs/cluster.md "one etcd client
 * per pool"), and so two batchers: a request is always sent with its own config's settings, so one
 * whose TLS or credentials do not work fails as it does through the standalone plugin, instead of
 * being served on another config's client — and then recorded as the pool's config for the
 * daemon's next start (a fresh-user trial: a wrong CA accepted, then the node's heartbeat lost).
 */
function clientKey(pool: PoolConfig): string {
  return JSON.stringify([pool.etcd.endpoints, pool.etcd.prefix, pool.etcd.tls, pool.etcd.credentials ?? null]);
}

/**
 * How long a node's heartbeat must have failed, with no success, before an ADD that succeeded on
 * other client settings moves it there (ms): one renewal period (a third of the lease's TTL), well
 * past a leader election's few seconds.
 */
const HEAL_AFTER_MS = (HEARTBEAT_TTL_SECONDS * 1000) / 3;

/** One attachment of one pool: (pool, containerId, ifname). */
function attachmentKey(pool: PoolConfig, req: PoolRequest): string {
  return JSON.stringify([pool.etcd.endpoints, pool.etcd.prefix, pool.name, req.containerId.trim(), req.ifname]);
}

/** Least time between two identical corrupt-key log lines of the daemon, milliseconds (10 minutes). */
export const CORRUPT_LOG_EVERY_MS = 600_000;

/** Requests per batch (the allocator's limit). */
const MAX_BATCH_REQUESTS = MAX_BATCH;

/** Does the node's block cache hold an allocation (not a reserve entry) of `req`'s attachment? */
function cacheHolds(cache: BlockCache, req: PoolRequest): boolean {
  const id = req.containerId.trim();
  for (const b of cache.blocks?.values() ?? []) for (const a of Object.values(b.value.allocs)) if (a.reserve !== true && a.id === id && a.ifname === req.ifname) return true;
  return false;
}

/** Options of {@link PoolSessions} (offline allocation, docs/cluster.md "Offline allocation"). */
export interface PoolSessionsOptions {
  /** Monotonic clock, milliseconds (default `performance.now`): the offline budget is measured on it. */
  readonly clock?: () => number;
  /**
   * The root of the pool journals (the daemon's `--pool-journal-dir`; default
   * {@link DEFAULT_POOL_JOURNAL_ROOT}): one directory per (etcd prefix, pool) under it, whatever
   * the networks' `ipam.dataDir` (review F2).
   */
  readonly journalRoot?: string;
  /** Log sink (default: one JSON line in pino's shape on stderr, the daemon's log). */
  readonly log?: OfflineLog;
  /**
   * Where automatic node removals (`ipam.pool.reclaimAfter`, src/pool/auto-reclaim.ts) are told:
   * the daemon's log, audit log and metric (src/daemon/pool-reclaim.ts). Default: log lines only
   * ({@link logReport} on `log`).
   */
  readonly reclaimReport?: AutoReclaimReport;
  /**
   * Resolves once every client that went away before the call is known gone (its request's
   * signal aborted): the plugin server's `clientsCurrent` (its socket thread reports a client's
   * end by message, so a daemon resuming after a stop could otherwise send an ADD whose shim gave
   * it up long before). Awaited before each round and before a failed round's one-by-one retries.
   * Default: nothing to wait for.
   */
  readonly clientsCurrent?: () => Promise<void>;
}

/** pino's numeric levels, so these lines read like the daemon's own log (src/daemon/log.ts) on the same stderr. */
const PINO_LEVEL = { info: 30, warn: 40, error: 50 } as const;
const stderrLog: OfflineLog = (level, fields, msg) => {
  process.stderr.write(`${JSON.stringify({ level: PINO_LEVEL[level], time: Date.now(), pid: process.pid, part: 'pools', ...fields, msg })}\n`);
};

/**
 * The daemon's pool hooks: one etcd client per pool (endpoints + prefix), kept until `close()`,
 * and the node's concurrent ADDs of one network batched into one transaction ({@link Batcher}).
 * The node name comes from the daemon's own environment (`NODE_NAME` of the DaemonSet), not the
 * request's: the daemon is the node. Every request, allocator transaction and batch is told to
 * the {@link PoolObserver} (the daemon's metrics), and {@link sample} reads the gauges of each
 * pool the sessions serve. Lifecycle: `close()` is idempotent; later calls throw `ClosedError`.
 *
 * With `ipam.pool.offline` (docs/cluster.md "Offline allocation") it also keeps the node's
 * reserve in etcd, answers ADDs from it while etcd is unreachable (within `seconds` of the last
 * confirmed contact, on the clock of `opts.clock`), journals them under
 * `opts.journalRoot` (default {@link DEFAULT_POOL_JOURNAL_ROOT}; {@link loadJournals} reads it at
 * daemon start, before any request) and syncs them on
 * reconnect; `offlineStats()` and `observer.offline` are the metrics' view. Every etcd client is
 * wrapped in a {@link ContactKV} (it forwards everything; it writes nothing of its own).
 */
export class PoolSessions implements PoolHooks {
  readonly #env: Readonly<Record<string, string | undefined>>;
  readonly #make: (pool: PoolConfig) => KV & Leases;
  readonly #every: Every;
  readonly #kvs = new Map<string, ContactKV>();
  readonly #batchers = new Map<string, Batcher>();
  readonly #heartbeats = new Map<string, Heartbeat>();
  /** Per heartbeat (same keys): the client settings it beats with ({@link clientKey}) and where the pool was known from. */
  readonly #heartbeatOf = new Map<string, { readonly client: string; readonly source: PoolSource }>();
  /** One block cache per etcd, pool and node, shared by its ADDs and DELs. */
  readonly #caches = new Map<string, BlockCache>();
  /**
   * The batcher a DEL of (etcd, pool, node, network name) joins: the latest ADD batcher of that
   * network, else one made for DELs (issue 18 item 5: a node's DELs in its ADDs' transactions).
   */
  readonly #delBatchers = new Map<string, Batcher>();
  /** Batchers by pool (endpoints, prefix, name): where a DEL looks for queued ADDs of its container. */
  readonly #batchersOfPool = new Map<string, Set<Batcher>>();
  /** (pool, containerId, ifname) → the ADDs of it not yet answered (queued or in flight). */
  readonly #pendingAdds = new Map<string, Set<Promise<unknown>>>();
  readonly #observer: PoolObserver;
  /** Every (pool, node) served or announced so far: what {@link sample} reads. */
  readonly #known = new Map<string, { readonly pool: PoolConfig; readonly node: string }>();
  /** Offline allocation per etcd, pool and node (pools with `ipam.pool.offline` only). */
  readonly #offline = new Map<string, OfflinePool>();
  readonly #opts: PoolSessionsOptions;
  /** Attachments this daemon answered an online ADD for and has not released since (review F3). */
  readonly #online = new Set<string>();
  /** The journal root could not be read at start: offline ADDs are refused (review F4). */
  #rootUnreadable = false;
  /** Corrupt-key log lines by content → when last logged (the sessions' clock, ms). */
  readonly #corruptLogged = new Map<string, number>();
  /** Automatic node removal per pool (etcd, prefix, name), for pools with `ipam.pool.reclaimAfter`. */
  readonly #reclaimers = new Map<string, AutoReclaimer>();
  #closed = false;

  /**
   * @param env the daemon's environment (`NODE_NAME`)
   * @param make a new KV for a pool (default: an etcd client, {@link etcdFor})
   * @param every the heartbeat's schedule (tests inject one)
   * @param observer told of every request, transaction and batch (default: nobody)
   * @param opts offline allocation's clock, journal directory and log ({@link PoolSessionsOptions})
   */
  constructor(env: Readonly<Record<string, string | undefined>>, make: (pool: PoolConfig) => KV & Leases = etcdFor, every: Every = realEvery, observer: PoolObserver = {}, opts: PoolSessionsOptions = {}) {
    this.#env = env;
    this.#make = make;
    this.#every = every;
    this.#observer = observer;
    this.#opts = opts;
  }

  #offlineKey(pool: PoolConfig, node: string): string {
    return JSON.stringify([pool.etcd.endpoints, pool.etcd.prefix, pool.name, node]);
  }

  /**
   * The offline state of `pool` and `node`, made on first use (its journal read: entries a crash
   * left are synced by the first `maintain`), or null without `ipam.pool.offline`. `conf` (an ADD
   * or announce): the network config it refills and answers with (the first one given is kept);
   * null (a DEL, a CHECK, the journal loaded at start): none yet. Never throws for journal
   * trouble (review F4: logged, offline ADDs refused).
   */
  #offlineOf(pool: PoolConfig, node: string, kv: ContactKV, conf: IPAMConfig | null): OfflinePool | null {
    const cfg = pool.offline;
    if (cfg === undefined || cfg === null) return null;
    const key = this.#offlineKey(pool, node);
    let off = this.#offline.get(key);
    let made = false;
    if (off === undefined) {
      made = true;
      const cache = this.#cacheFor(pool, node);
      const o = new OfflinePool({
        pool,
        cfg,
        node,
        kv,
        allocFor: (network) => this.#allocator(kv, pool, node, network, [], cache),
        journal: new PoolJournal(poolJournalDir(this.#journalRoot, pool.etcd.prefix, pool.name, node)),
        clock: this.#clock,
        now: Date.now,
        log: this.#log,
        event: (kind) => tell(() => this.#observer.offline?.({ pool: pool.name, node, kind })),
      });
      off = o;
      this.#offline.set(key, o);
      // The first success after etcd was unreachable syncs the journal (and refills) at once.
      const prev = kv.onSuccess;
      kv.onSuccess = (afterFailure) => {
        prev?.(afterFailure);
        if (afterFailure && !this.#closed) void o.maintain();
      };
    }
    if (conf !== null && !off.attached) {
      off.attach({ conf, alloc: this.#allocator(kv, pool, node, conf.name, conf.rangeSets, this.#cacheFor(pool, node)) });
      void off.maintain();
    } else if (made) void off.maintain();
    return off;
  }

  get #journalRoot(): string {
    return this.#opts.journalRoot ?? DEFAULT_POOL_JOURNAL_ROOT;
  }

  get #log(): OfflineLog {
    return this.#opts.log ?? stderrLog;
  }

  get #clock(): () => number {
    return this.#opts.clock ?? bootClock;
  }

  /**
   * Daemon start, before it serves any request (review F2, F6): read every pool journal under
   * the root (`opts.journalRoot`) and make the offline state of each pool found, so a DEL, a
   * CHECK or a repeated ADD of a journaled attachment is decided on its entry from the first
   * request on, whichever network of the pool it names. A pool directory whose entries cannot be
   * read has them set aside (`<name>.corrupt`, an error line); an unusable root is an error line.
   * Never throws for journal trouble; `ClosedError` after `close()`. Returns the pools loaded.
   */
  loadJournals(): Array<{ pool: string; node: string; dir: string; entries: number }> {
    if (this.#closed) throw new ClosedError('pool sessions');
    const root = this.#journalRoot;
    const log = this.#log;
    let dirs: string[];
    try {
      const st = lstatSync(root);
      if (!st.isDirectory()) throw new AppError('STORE_IO', `pool journal: ${root} is not a directory (a symlink or a file): ipwarden follows no symlink it did not make`);
      const why = untrustedReason(root, st, process.geteuid?.() ?? 0);
      if (why !== null) throw new AppError('STORE_IO', `pool journal: ${why}`);
      dirs = readdirSync(root).filter((n) => POOL_DIR_RE.test(n)).sort();
    } catch (e) {
      if (errnoCode(e) === 'ENOENT') return [];
      log('error', { dir: root, error: e instanceof Error ? e.message : String(e) }, 'pool journals cannot be read: offline allocation is off for every pool');
      this.#rootUnreadable = true;
      return [];
    }
    const out: Array<{ pool: string; node: string; dir: string; entries: number }> = [];
    for (const n of dirs) {
      const dir = join(root, n);
      const j = new PoolJournal(dir);
      let pool: PoolConfig | null = null;
      try {
        for (const f of j.list()) {
          if (!('text' in f)) continue;
          try {
            const e = decodeJournalEntry(f.text, `${dir}/${f.name}`);
            if (poolJournalDir(root, e.pool.etcd.prefix, e.pool.name, e.node) === dir) {
              pool = e.pool;
              break;
            }
          } catch {
            // set aside below (or by the pool's own load)
          }
        }
        if (pool === null) {
          // Whose it is cannot be told (another simulated node's on a shared root, say): left;
          // its pool's own load sets its entries aside.
          if (j.list().length > 0) log('error', { dir }, 'pool journal directory with no readable entry: left for its pool (its entries are set aside when the pool is used)');
          continue;
        }
      } catch (e) {
        log('error', { dir, error: e instanceof Error ? e.message : String(e) }, 'pool journal directory cannot be read (its pool refuses offline ADDs)');
        continue;
      }
      try {
        const node = resolveNodeName(pool, this.#env);
        if (poolJournalDir(root, pool.etcd.prefix, pool.name, node) !== dir) continue; // another node's (a shared root)
        const off = this.#offlineOf(pool, node, this.#kv(pool), null);
        this.#note(pool, node);
        const st = off?.stats();
        out.push({ pool: pool.name, node, dir, entries: st?.journaled ?? 0 });
        log('info', { pool: pool.name, node, dir, entries: st?.journaled ?? 0, stuck: st?.stuck ?? 0 }, 'pool journal loaded');
      } catch (e) {
        if (e instanceof ClosedError) throw e;
        log('error', { dir, pool: pool.name, error: e instanceof Error ? e.message : String(e) }, 'pool journal not loaded');
      }
    }
    return out;
  }

  /**
   * Counters and state of offline allocation, one entry per pool and node with
   * `ipam.pool.offline` (the metrics' gauges): offline ADDs and DELs, journal entries synced,
   * sync failures (reserve gone), the reserve left per range set and its target, entries waiting,
   * and the age of the last confirmed contact. Cheap; no I/O.
   */
  offlineStats(): OfflineStats[] {
    return [...this.#offline.values()].map((off) => off.stats());
  }

  /** Run one offline maintenance round (sync the journal, refill the reserve) of every pool now, and wait for it (tests; the daemon's beats run it on their own). */
  async maintainOffline(): Promise<void> {
    await Promise.all([...this.#offline.values()].map((off) => off.maintain()));
  }

  /** Remember (pool, node) for {@link sample}. */
  #note(pool: PoolConfig, node: string): void {
    const k = JSON.stringify([pool.etcd.endpoints, pool.etcd.prefix, pool.etcd.tls, pool.name, node]);
    if (!this.#known.has(k)) this.#known.set(k, { pool, node });
  }

  /** An allocator whose transactions are told to the observer. */
  #allocator(kv: KV & Leases, pool: PoolConfig, node: string, network: string, rangeSets: IPAMConfig['rangeSets'], cache?: BlockCache): PoolAllocator {
    return allocatorFor(observeTxns(kv, { pool: pool.name, node }, this.#observer), pool, node, network, rangeSets, cache, (c) => this.#corrupt(pool, node, c));
  }

  /**
   * Log a corrupt key a pool operation went on without (warn, `pool key cannot be read: left for
   * an operator`, with `op`, `key`, `error` and `action`), the same line at most once per
   * {@link CORRUPT_LOG_EVERY_MS} (an ADD that skips a block would log it on every request).
   */
  #corrupt(pool: PoolConfig, node: string, c: CorruptSkip): void {
    const k = JSON.stringify([pool.etcd.endpoints, pool.etcd.prefix, pool.name, node, c.op, c.key, c.why, c.action]);
    const now = this.#clock();
    const last = this.#corruptLogged.get(k);
    if (last !== undefined && now - last < CORRUPT_LOG_EVERY_MS) return;
    if (this.#corruptLogged.size >= 4096) this.#corruptLogged.clear();
    this.#corruptLogged.set(k, now);
    this.#log('warn', { pool: pool.name, node, op: c.op, key: c.key, error: c.why, action: c.action }, 'pool key cannot be read: left for an operator');
  }

  /** Run `f` (a request as `node` of `pool`), telling the observer its result and duration. */
  async #timed<T>(pool: PoolConfig, command: PoolRequestEvent['command'], node: () => string, f: (node: string) => Promise<T>): Promise<T> {
    const t0 = performance.now();
    let who = NO_NODE;
    let result = 'ok';
    try {
      who = node();
      return await f(who);
    } catch (e) {
      result = resultOf(e);
      throw e;
    } finally {
      const durationSeconds = (performance.now() - t0) / 1000;
      tell(() => this.#observer.request?.({ pool: pool.name, node: who, command, result, durationSeconds }));
    }
  }

  /**
   * The gauges of every (pool, node) served or announced so far ({@link PoolSample}), from one
   * `pool status` read per pool (its `meta`, blocks and heartbeat keys: three reads). A pool that
   * cannot be read is a {@link PoolSampleError}; one never used (no `meta` yet) is left out. The
   * caller decides how often (the daemon's metrics: at most once per 10 s and reconcile interval).
   * Never throws for etcd trouble; `ClosedError` after `close()`.
   */
  async sample(): Promise<Array<PoolSample | PoolSampleError>> {
    if (this.#closed) throw new ClosedError('pool sessions');
    const byPool = new Map<string, Array<{ pool: PoolConfig; node: string }>>();
    for (const x of this.#known.values()) {
      const k = JSON.stringify([x.pool.etcd.endpoints, x.pool.etcd.prefix, x.pool.etcd.tls, x.pool.name]);
      let l = byPool.get(k);
      if (l === undefined) byPool.set(k, (l = []));
      l.push(x);
    }
    const out: Array<PoolSample | PoolSampleError> = [];
    for (const group of byPool.values()) {
      const pool = (group[0] as { pool: PoolConfig }).pool;
      try {
        // The node's own blocks and the pool's block keys only, never every block value (review B5).
        for (const { node } of group) {
          const n = await poolNodeSample(this.#kv(pool), pool.etcd.prefix, pool.name, node);
          out.push({ pool: pool.name, node, ...n });
        }
      } catch (e) {
        if (e instanceof ClosedError) throw e;
        if (e instanceof AppError && e.code === 'IPAM_NOT_FOUND') continue;
        for (const { node } of group) out.push({ pool: pool.name, node, error: e instanceof Error ? e.message : String(e) });
      }
    }
    return out;
  }

  #cacheFor(pool: PoolConfig, node: string): BlockCache {
    const key = JSON.stringify([pool.etcd.endpoints, pool.etcd.prefix, pool.name, node]);
    let c = this.#caches.get(key);
    if (c === undefined) this.#caches.set(key, (c = new BlockCache()));
    return c;
  }

  /** The heartbeats started so far (one per pool and node), by key. */
  get heartbeats(): ReadonlyMap<string, Heartbeat> {
    return this.#heartbeats;
  }

  #kv(pool: PoolConfig): ContactKV {
    if (this.#closed) throw new ClosedError('pool sessions');
    const key = clientKey(pool);
    let kv = this.#kvs.get(key);
    if (kv === undefined) {
      // Wrapped so the node's confirmed contacts are known (offline allocation); it writes nothing more.
      const inner = this.#make(pool);
      if (inner instanceof EtcdKV) {
        // Its block caches are dropped by the generation; the operator is told once (docs/cluster.md "Restoring etcd from a backup").
        inner.onRevisionBackwards = (highest, now) =>
          this.#log('warn', { pool: pool.name, endpoints: pool.etcd.endpoints.join(','), highestRevision: highest, revision: now }, "etcd's revision went backwards (restored from a snapshot?): cached blocks dropped; restart the daemons");
      }
      kv = new ContactKV(inner, this.#clock, this.#opts.clock ?? coarseBootClock);
      this.#kvs.set(key, kv);
    }
    return kv;
  }

  /** Batch sizes of every transaction sent for ADDs so far, per network config (tests). */
  get batchSizes(): number[][] {
    return [...this.#batchers.values()].map((b) => [...b.sizes]);
  }

  /**
   * ADD, batched with the node's other ADDs of `conf`. `signal` (optional): when it has aborted
   * by the time the request's batch is taken (its client went away), the request is not sent
   * and fails `STORE_CONFLICT`. A DEL of the same (pool, containerId, ifname) that arrives while
   * this ADD is queued takes it out of the queue (rejected `STORE_CONFLICT`); one in flight is
   * waited for by the DEL ({@link del}).
   */
  add(conf: IPAMConfig, req: PoolRequest, signal?: AbortSignal): Promise<PoolAllocation[]> {
    const pool = conf.pool as PoolConfig;
    return this.#timed(pool, 'ADD', () => resolveNodeName(pool, this.#env), (node) => this.#add(conf, pool, node, req, signal));
  }

  #add(conf: IPAMConfig, pool: PoolConfig, node: string, request: PoolRequest, signal?: AbortSignal): Promise<PoolAllocation[]> {
    const kv = this.#kv(pool);
    // The fence (docs/cluster.md "No leak from a late commit"): the highest revision this client
    // has seen as the request begins; a DEL's tombstone created above it refuses the ADD.
    const seen = kv.highestRevision;
    const fenced: PoolRequest = seen === undefined || seen === null ? request : { ...request, since: seen };
    // Asked before each later attempt of the request's round: the socket thread's news first.
    const current = this.#opts.clientsCurrent;
    const req: PoolRequest =
      signal === undefined
        ? fenced
        : {
            ...fenced,
            gone: () => signal.aborted,
            ...(current === undefined ? {} : { refresh: () => current().catch(() => undefined) }),
          };
    this.#note(pool, node);
    const key = JSON.stringify([clientKey(pool), pool.name, pool.blockSize4, pool.blockSize6, node, conf.name, metaOf(conf.rangeSets, { blockSize4: pool.blockSize4, blockSize6: pool.blockSize6 })]);
    const off = this.#offlineOf(pool, node, kv, conf);
    let b = this.#batchers.get(key);
    if (b === undefined) {
      const alloc = this.#allocator(kv, pool, node, conf.name, conf.rangeSets, this.#cacheFor(pool, node));
      b = new Batcher(alloc, (size) => tell(() => this.#observer.batch?.({ pool: pool.name, node, size })), off !== null, this.#opts.clientsCurrent);
      this.#batchers.set(key, b);
      // The network's DELs go in this batcher's rounds from now on (a DEL-only one drains and is left).
      this.#delBatchers.set(this.#delBatcherKey(pool, node, conf.name), b);
      const pk = poolKey(pool);
      let set = this.#batchersOfPool.get(pk);
      if (set === undefined) this.#batchersOfPool.set(pk, (set = new Set()));
      set.add(b);
      this.#startHeartbeat(kv, pool, node, alloc, 'requests');
    }
    const batcher = b;
    const p =
      off === null
        ? b.submit(req, signal).then((r) => (this.#healHeartbeat(kv, pool, node, batcher.allocator), r))
        : (async (): Promise<PoolAllocation[]> => {
            // Offline allocation (docs/cluster.md "Offline allocation"): a repeated ADD of an
            // attachment allocated offline gets the journal's answer until it is synced; an
            // attachment released offline has that DEL synced first; an ADD that fails because
            // etcd is unreachable is served from the node's reserve while the budget lasts.
            const j = off.journaled(conf, req);
            if (j !== null) return j;
            if (off.hasDel(req)) {
              await off.settleDel(req);
              // Still held back (etcd unreachable): no ADD before that DEL is synced (review F8).
              if (off.hasDel(req)) throw new AppError('STORE_UNAVAILABLE', `an offline DEL of ${req.containerId.trim()}/${req.ifname} in pool ${pool.name} awaits its sync to etcd; retry`);
            }
            const ak = attachmentKey(pool, req);
            try {
              const r = await batcher.submit(req, signal);
              this.#healHeartbeat(kv, pool, node, batcher.allocator);
              this.#online.add(ak);
              if (off.wantsMaintain) void off.maintain();
              return r;
            } catch (e) {
              if (!isAppError(e, 'STORE_UNAVAILABLE')) throw e;
              const again = off.journaled(conf, req);
              if (again !== null) return again;
              if (this.#rootUnreadable) throw new AppError('STORE_UNAVAILABLE', `${e.message}; offline allocation is off: the pool journals under ${this.#journalRoot} could not be read at start; retry`, { cause: e });
              // Nothing journaled for a client that has gone (its batch knew it: see the Batcher).
              if (signal?.aborted === true) throw new AppError('STORE_CONFLICT', `ADD of ${req.containerId.trim()}/${req.ifname} not sent: its client has gone`);
              // Review F3: never a second set of addresses for an attachment that may hold one.
              return off.addOffline(conf, req, e, this.#online.has(ak) || cacheHolds(this.#cacheFor(pool, node), req));
            }
          })();
    // Remember it until answered, so a DEL of the same container is ordered after it (review F4).
    const ak = attachmentKey(pool, req);
    let pend = this.#pendingAdds.get(ak);
    if (pend === undefined) this.#pendingAdds.set(ak, (pend = new Set()));
    const settled = p.then(
      () => undefined,
      () => undefined,
    );
    pend.add(settled);
    void settled.then(() => {
      pend.delete(settled);
      if (pend.size === 0 && this.#pendingAdds.get(ak) === pend) this.#pendingAdds.delete(ak);
    });
    return p;
  }

  /**
   * The daemon is this node's agent: it announces the node in the pool (its heartbeat) from the
   * pool's first use on, and on every beat vetoes a removal of the node begun while it was away.
   */
  #startHeartbeat(kv: KV & Leases, pool: PoolConfig, node: string, alloc: PoolAllocator, source: PoolSource): void {
    // Automatic removal of dead nodes (ipam.pool.reclaimAfter): one per pool, run on the beats —
    // only as a file of the node's CNI configuration directory asks for it, never as a request's
    // config does (a NetworkAttachmentDefinition is written by whoever may create one in a
    // namespace: it must not switch on the release of other nodes' addresses; review).
    const rkey = JSON.stringify([pool.etcd.endpoints, pool.etcd.prefix, pool.name]);
    if (source === 'cni-config' && pool.reclaimAfterMs !== undefined && !this.#reclaimers.has(rkey)) {
      this.#reclaimers.set(rkey, new AutoReclaimer({ kv, pool: pool.name, prefix: pool.etcd.prefix, sizes: { blockSize4: pool.blockSize4, blockSize6: pool.blockSize6 }, reclaimAfterMs: pool.reclaimAfterMs, clock: this.#clock, report: this.#opts.reclaimReport ?? logReport(this.#log) }));
    }
    this.#reclaimers.get(rkey)?.addOwn(node);
    const hkey = JSON.stringify([pool.etcd.endpoints, alloc.aliveKey(node)]);
    if (this.#heartbeats.has(hkey)) return;
    this.#heartbeatOf.set(hkey, { client: clientKey(pool), source });
    // Every beat also syncs the offline journal and refills the reserve (with ipam.pool.offline).
    const okey = this.#offlineKey(pool, node);
    const seen = new SeenWriter(kv, this.#clock);
    const onBeat = async (): Promise<void> => {
      await alloc.vetoIfMarked();
      await this.#offline.get(okey)?.maintain();
      // Last seen (seen/<node>, at most every 5 min) and the reclaim scan: not awaited, so a long
      // removal never delays the node's own heartbeat. Neither throws.
      void seen.beat(pool.etcd.prefix, pool.name, node);
      if (!this.#closed) void this.#reclaimers.get(rkey)?.scan();
    };
    // The settings key records that a daemon serves the node (pool remove-node refuses a node
    // without one, unless --force); with ipam.pool.offline the reserve refill writes it (with S).
    const settings = pool.offline === undefined || pool.offline === null ? { key: alloc.settingsKey(node), value: settingsValue(0) } : undefined;
    const hb = new Heartbeat(kv, alloc.aliveKey(node), node, Date.now, this.#every, onBeat, { writer: { host: hostname(), pid: process.pid }, source, ...(settings === undefined ? {} : { settings }) });
    this.#heartbeats.set(hkey, hb);
    void hb.start();
  }

  /**
   * Start the node's heartbeat in `conf`'s pool now (and veto a removal of the node begun while
   * it was away), without waiting for the pool's first ADD: what the daemon calls at start for
   * every pool network of the node's CNI configuration, so an idle returning node vetoes too
   * (review F2b). Idempotent per pool and node. Never throws for etcd trouble (the heartbeat
   * retries on its next beat); throws `ClosedError` after `close()`, `IPAM_INVALID_CONFIG` for an
   * unusable node name. `source`: where the daemon knows the pool from (the heartbeat's value
   * says it, if this starts the heartbeat; default a CNI configuration file).
   */
  announce(conf: IPAMConfig, source: PoolSource = 'cni-config'): void {
    const pool = conf.pool as PoolConfig;
    const node = resolveNodeName(pool, this.#env);
    const kv = this.#kv(pool);
    this.#note(pool, node);
    // The heartbeat (and its veto) first: whatever the journal's state (review F4).
    this.#startHeartbeat(kv, pool, node, this.#allocator(kv, pool, node, conf.name, [], this.#cacheFor(pool, node)), source);
    // With ipam.pool.offline: the journal is read (entries a crash left get synced) and the reserve filled.
    this.#offlineOf(pool, node, kv, conf);
  }

  /**
   * DEL, ordered after every ADD of the same (pool, containerId, ifname) this daemon has not
   * answered yet (review F4: otherwise a DEL that overtakes a queued or in-flight ADD answers
   * "nothing held", then the ADD commits and its address leaks): a queued ADD is taken out of the
   * queue (the runtime gave up on it: it only sends a DEL after the ADD's answer or its
   * deadline), one in flight is waited for (whatever its outcome), then the release runs.
   */
  del(id: NetworkIdentity, req: PoolRequest): Promise<string[]> {
    const pool = id.pool as PoolConfig;
    return this.#timed(pool, 'DEL', () => delNodeName(pool, this.#env), (node) => this.#del(id, pool, node, req));
  }

  async #del(id: NetworkIdentity, pool: PoolConfig, node: string, req: PoolRequest): Promise<string[]> {
    const kv = this.#kv(pool);
    const why = `ADD of ${req.containerId.trim()}/${req.ifname} cancelled: a DEL of the same container came first`;
    for (const b of this.#batchersOfPool.get(poolKey(pool)) ?? []) b.cancel(req, why);
    const pend = this.#pendingAdds.get(attachmentKey(pool, req));
    if (pend !== undefined) await Promise.all([...pend]);
    const etcdDel = (): Promise<string[]> => this.#delBatcher(kv, pool, node, id.name).submitDel(req);
    // An attachment allocated offline is released on its journal entry (ordered after its sync);
    // the pool's journal is read first if no request read it yet (review F6).
    const off = this.#offlineOf(pool, node, kv, null);
    let r: string[] | null = null;
    if (off !== null) r = await off.del(req, etcdDel);
    r ??= await etcdDel();
    this.#online.delete(attachmentKey(pool, req));
    return r;
  }

  #delBatcherKey(pool: PoolConfig, node: string, network: string): string {
    return JSON.stringify([clientKey(pool), pool.name, node, network]);
  }

  /**
   * After an ADD of `pool` on `kv` succeeded: when the node's heartbeat in the pool beats with other
   * client settings and its beats have failed for {@link HEAL_AFTER_MS} with no success (those
   * settings no longer work: a CA or key file replaced, or a learned config that was wrong), it is
   * moved to `kv`'s settings, which just worked — else a node that serves ADDs would look gone to
   * `pool remove-node` and to other nodes' `reclaimAfter` (a fresh-user trial). A heartbeat that
   * works, or failed only briefly (a leader election), is not moved. The old one is stopped — its
   * beat in flight awaited, its lease revoked — before the new one starts, so no late put of the old
   * one lands over the new one's key. Logs `pool heartbeat moved to the settings of a request that
   * succeeded` (info), or `pool heartbeat not moved` (warn) if starting the new one threw. Never throws.
   */
  #healHeartbeat(kv: ContactKV, pool: PoolConfig, node: string, alloc: PoolAllocator): void {
    if (this.#closed) return;
    const hkey = JSON.stringify([pool.etcd.endpoints, alloc.aliveKey(node)]);
    const hb = this.#heartbeats.get(hkey);
    const of = this.#heartbeatOf.get(hkey);
    // A stopped one is being moved already (or the sessions are closing).
    if (hb === undefined || of === undefined || of.client === clientKey(pool) || hb.stopped || !hb.failingFor(HEAL_AFTER_MS)) return;
    void hb
      .stop()
      .then(() => {
        if (this.#closed || this.#heartbeats.get(hkey) !== hb) return;
        this.#heartbeats.delete(hkey);
        this.#heartbeatOf.delete(hkey);
        this.#startHeartbeat(kv, pool, node, alloc, of.source);
        this.#log('info', { pool: pool.name, node, failures: hb.failures }, 'pool heartbeat moved to the settings of a request that succeeded');
      })
      .catch((e: unknown) => this.#log('warn', { pool: pool.name, node, error: e instanceof Error ? e.message : String(e) }, 'pool heartbeat not moved'));
  }

  /** The batcher a DEL of `network` joins ({@link #delBatchers}), made for DELs when the network has no ADD batcher yet. */
  #delBatcher(kv: ContactKV, pool: PoolConfig, node: string, network: string): Batcher {
    const k = this.#delBatcherKey(pool, node, network);
    let b = this.#delBatchers.get(k);
    if (b === undefined) {
      const alloc = this.#allocator(kv, pool, node, network, [], this.#cacheFor(pool, node));
      b = new Batcher(alloc, (size) => tell(() => this.#observer.batch?.({ pool: pool.name, node, size })), pool.offline !== undefined && pool.offline !== null, this.#opts.clientsCurrent);
      this.#delBatchers.set(k, b);
      this.#batchers.set(JSON.stringify(['del', k]), b);
    }
    return b;
  }

  find(conf: IPAMConfig, req: PoolRequest): Promise<PoolAllocation[] | null> {
    const pool = conf.pool as PoolConfig;
    return this.#timed(pool, 'CHECK', () => resolveNodeName(pool, this.#env), async (node) => {
      const kv = this.#kv(pool);
      this.#note(pool, node);
      // An attachment allocated offline and not yet synced is answered from the journal.
      const j = this.#offlineOf(pool, node, kv, null)?.journaled(conf, req) ?? null;
      if (j !== null) return j;
      return this.#allocator(kv, pool, node, conf.name, conf.rangeSets).find(req);
    });
  }

  /** CNI GC of a pool network on the daemon's etcd client for the pool (see {@link PoolHooks.gc}). */
  async gc(id: NetworkIdentity, valid: readonly PoolRequest[]): Promise<PoolGcOutcome> {
    const pool = id.pool as PoolConfig;
    return poolGcWith(this.#kv(pool), pool, resolveNodeName(pool, this.#env), id, valid);
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    for (const off of this.#offline.values()) off.close();
    for (const hb of this.#heartbeats.values()) await hb.stop();
    for (const kv of this.#kvs.values()) await kv.close();
    this.#kvs.clear();
  }
}
