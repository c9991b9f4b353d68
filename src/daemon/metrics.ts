/**
 * The daemon's Prometheus metrics (`docs/metrics.md`), with `prom-client` on a registry of our
 * own (never the library's global one, so two daemons in one test process do not share series),
 * and the HTTP endpoint that serves them with `/healthz` and `/readyz`.
 *
 * Series (names and labels are a stable interface; docs/metrics.md explains each and gives alert
 * rules):
 * - `ipwarden_addresses{network,range_set,state}` gauge, state = live|grace|leaked|corrupt|unknown|free
 * - `ipwarden_range_set_capacity{network,range_set}` gauge
 * - `ipwarden_releases_total{network,reason}` counter
 * - `ipwarden_release_candidates{network}` gauge
 * - `ipwarden_reconcile_duration_seconds` histogram
 * - `ipwarden_reconcile_errors_total{kind}` counter
 * - `ipwarden_last_reconcile_success_timestamp_seconds` gauge
 * - `ipwarden_cni_requests_total{command,path,result}` counter, path = daemon|standalone
 * - `ipwarden_cni_request_duration_seconds{command}` histogram (daemon path only: the standalone
 *   plugin's own time is not visible to the daemon)
 * - cluster pools (docs/cluster.md "Metrics"; {@link PoolMetrics}), all labelled `pool` and `node`:
 *   `ipwarden_pool_requests_total{command,result}`, `ipwarden_pool_request_duration_seconds{command}`,
 *   `ipwarden_pool_etcd_transactions_total{outcome}`, `ipwarden_pool_batch_size`, the gauges
 *   `ipwarden_pool_node_blocks`, `ipwarden_pool_node_addresses`, `ipwarden_pool_claimed_blocks`,
 *   `ipwarden_pool_unclaimed_blocks`, `ipwarden_pool_node_alive` (the node's own blocks and the
 *   pool's block keys only: never every block value, review B5), and
 *   `ipwarden_pool_status_read_errors_total`; offline allocation (`ipam.pool.offline`):
 *   `ipwarden_pool_offline_operations_total{kind}`, `ipwarden_pool_reserve_addresses`,
 *   `ipwarden_pool_journal_entries{state}`, `ipwarden_pool_contact_age_seconds`
 *
 * The labels are the idiom of node agents (Calico's `ipam_allocations_in_use` per pool and node,
 * Cilium's `cilium_ipam_capacity`; ../shared/reference/daemons-and-pools.md §1).
 */
import { closeSync, constants, fstatSync, openSync, readSync } from 'node:fs';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { performance } from 'node:perf_hooks';
import { Counter, Gauge, Histogram, Registry } from 'prom-client';
import type { HostPort } from '../common/daemon-options.ts';
import type { PoolBatchEvent, PoolObserver, PoolOfflineEvent, PoolRequestEvent, PoolSample, PoolSampleError, PoolTxnEvent } from '../cni/pool.ts';
import type { OfflineStats } from '../cni/pool-offline.ts';

/** Address states of `ipwarden_addresses` (the verdicts of docs/reconciler.md, plus free). */
export const ADDRESS_STATES = ['live', 'grace', 'leaked', 'corrupt', 'unknown', 'free'] as const;

/** One of {@link ADDRESS_STATES}. */
export type AddressState = (typeof ADDRESS_STATES)[number];

/** The CNI commands counted (anything else read from the fallback log counts as `other`). */
const CNI_COMMANDS = new Set(['ADD', 'DEL', 'CHECK', 'GC', 'STATUS', 'VERSION']);

/** One range set as one reconcile pass saw it. Counts are addresses (numbers; a /64 is clamped). */
export interface RangeSetObservation {
  readonly network: string;
  /** The range set's index in the configuration (host-local's `range N`, `last_reserved_ip.N`). */
  readonly rangeSet: number;
  readonly capacity: number;
  readonly counts: Readonly<Record<AddressState, number>>;
}

/** What one reconcile pass reports to the metrics. */
export interface PassObservation {
  /** Every range set of every network of this pass (series of range sets not listed are removed). */
  readonly rangeSets: readonly RangeSetObservation[];
  /** Release candidates per network: leaked/corrupt reservations seen and not yet released. */
  readonly candidates: ReadonlyMap<string, number>;
  /** Releases done in this pass. `reason` is the verdict that allowed it (leaked, corrupt, notready). */
  readonly released: ReadonlyArray<{ readonly network: string; readonly reason: string }>;
  /** Errors of this pass by kind (runtime, kernel, lock, list, release, audit, config). */
  readonly errors: ReadonlyArray<{ readonly kind: string }>;
  /** Wall time of the pass, seconds. */
  readonly durationSeconds: number;
  /** Unix time (seconds) the pass ended. */
  readonly endedAtSeconds: number;
}

/** The daemon's metrics registry and the operations that feed it. */
export class DaemonMetrics {
  /** The registry `/metrics` serves. */
  readonly registry = new Registry();
  private readonly addresses: Gauge<'network' | 'range_set' | 'state'>;
  private readonly capacity: Gauge<'network' | 'range_set'>;
  private readonly releases: Counter<'network' | 'reason'>;
  private readonly candidates: Gauge<'network'>;
  private readonly reconcileDuration: Histogram;
  private readonly heal: Histogram;
  private readonly reconcileErrors: Counter<'kind'>;
  private readonly lastSuccess: Gauge;
  private readonly cniRequests: Counter<'command' | 'path' | 'result'>;
  private readonly cniDuration: Histogram<'command'>;
  private fallbackLog: FallbackLogReader | null = null;
  /** The cluster pools' series (docs/cluster.md "Metrics"). */
  readonly pools: PoolMetrics;

  /** @param opts.monotonicMs the clock of the pool gauges' cache, milliseconds (default `performance.now`; tests inject one). */
  constructor(opts: { readonly monotonicMs?: () => number } = {}) {
    const registers = [this.registry];
    this.pools = new PoolMetrics(this.registry, opts.monotonicMs ?? (() => performance.now()));
    this.addresses = new Gauge({
      name: 'ipwarden_addresses',
      help: 'Addresses per range set by state (live, grace, leaked, corrupt, unknown, free), as of the last reconcile pass.',
      labelNames: ['network', 'range_set', 'state'],
      registers,
    });
    this.capacity = new Gauge({
      name: 'ipwarden_range_set_capacity',
      help: 'Allocatable addresses of the range set (gateways excluded).',
      labelNames: ['network', 'range_set'],
      registers,
    });
    this.releases = new Counter({
      name: 'ipwarden_releases_total',
      help: 'Reservations released by the daemon, by the verdict that allowed it.',
      labelNames: ['network', 'reason'],
      registers,
    });
    this.candidates = new Gauge({
      name: 'ipwarden_release_candidates',
      help: 'Leaked or corrupt reservations seen and not (yet) released: awaiting a second observation, over the per-pass cap, or refused.',
      labelNames: ['network'],
      registers,
    });
    this.heal = new Histogram({
      name: 'ipwarden_heal_seconds',
      help: 'Seconds from a range set seen full (inotify or a pass) to the daemon releasing a leak in it (issue 19 heal on arrival; docs/reconciler.md).',
      buckets: [0.5, 1, 2, 5, 10, 20, 35, 60, 120, 300, 600],
      registers,
    });
    this.reconcileDuration = new Histogram({
      name: 'ipwarden_reconcile_duration_seconds',
      help: 'Wall time of one reconcile pass over every network of the node.',
      buckets: [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60],
      registers,
    });
    this.reconcileErrors = new Counter({
      name: 'ipwarden_reconcile_errors_total',
      help: 'Reconcile failures by kind (runtime, kernel, lock, list, release, audit, config).',
      labelNames: ['kind'],
      registers,
    });
    this.lastSuccess = new Gauge({
      name: 'ipwarden_last_reconcile_success_timestamp_seconds',
      help: 'Unix time of the end of the last reconcile pass that had no error (0 before the first).',
      registers,
    });
    this.cniRequests = new Counter({
      name: 'ipwarden_cni_requests_total',
      help: 'CNI requests answered, by command, path (daemon = through the socket; standalone = the shim fell back to the standalone plugin) and result.',
      labelNames: ['command', 'path', 'result'],
      registers,
    });
    this.cniDuration = new Histogram({
      name: 'ipwarden_cni_request_duration_seconds',
      help: 'Time the daemon took to answer a CNI request (from the complete request to the answer written).',
      labelNames: ['command'],
      buckets: [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5, 30],
      registers,
    });
    this.lastSuccess.set(0);
    this.poolReleases = new Counter({
      name: 'ipwarden_pool_releases_total',
      help: "Cluster-pool attachments released on this node, by pool and by who released them (daemon = the daemon's pool pass, gc = CNI GC through the daemon).",
      labelNames: ['pool', 'reason'],
      registers,
    });
  }

  // ---- Cluster-pool reconcile (docs/cluster.md "Reconcile per node"; branch poolgc) ----
  private readonly poolReleases: Counter<'pool' | 'reason'>;

  /** Feed one finished pool pass of the loop: its releases (reason `daemon`) and its errors (kinds prefixed `pool-`). */
  recordPoolPass(p: { readonly released: ReadonlyArray<{ readonly pool: string }>; readonly errors: ReadonlyArray<{ readonly kind: string }> }): void {
    for (const r of p.released) this.poolReleases.inc({ pool: r.pool, reason: 'daemon' });
    for (const e of p.errors) this.reconcileErrors.inc({ kind: `pool-${e.kind}` });
  }

  /** Count `n` attachments of `pool` released by CNI GC through the daemon. */
  recordPoolGc(pool: string, n: number): void {
    if (n > 0) this.poolReleases.inc({ pool, reason: 'gc' }, n);
  }
  // ---- end of the cluster-pool reconcile block ----

  /**
   * Count the standalone plugin's fallback requests from `path` (docs/daemon.md "Fallback
   * requests in the metrics"), read on each scrape. The whole file is counted at the first read
   * (a daemon that was down counts what ran meanwhile; Prometheus treats the restart as a counter
   * reset).
   */
  watchFallbackLog(path: string): void {
    this.fallbackLog = new FallbackLogReader(path);
  }

  // ---- The installed files (`--cni-bin-dir`, src/daemon/install-watch.ts) ----
  private reinstalls: Counter<'reason'> | null = null;
  private pluginInstalled: Gauge | null = null;

  /**
   * Export `ipwarden_plugin_reinstalls_total{reason}` (both reasons at 0) and
   * `ipwarden_plugin_installed` (1 until a check says otherwise): only a daemon that watches its
   * installed files has them. Idempotent.
   */
  watchInstalledFiles(): void {
    if (this.reinstalls !== null) return;
    this.reinstalls = new Counter({
      name: 'ipwarden_plugin_reinstalls_total',
      help: 'Reinstalls of the files install-cni put in the CNI bin dir (--cni-bin-dir) that put every file back, by reason: missing (a file was gone: a re-created /opt/cni/bin) or changed (a file was replaced or altered).',
      labelNames: ['reason'],
      registers: [this.registry],
    });
    for (const reason of ['missing', 'changed']) this.reinstalls.inc({ reason }, 0);
    this.pluginInstalled = new Gauge({
      name: 'ipwarden_plugin_installed',
      help: 'Whether every file install-cni put in the CNI bin dir is in place as installed (1), or one is missing or changed and not yet reinstalled (0).',
      registers: [this.registry],
    });
    this.pluginInstalled.set(1);
  }

  /** Count one reinstall that put every file back. */
  recordReinstall(reason: 'missing' | 'changed'): void {
    this.reinstalls?.inc({ reason });
  }

  /** Every installed file in place (true) or not (false). */
  setPluginInstalled(ok: boolean): void {
    this.pluginInstalled?.set(ok ? 1 : 0);
  }

  /** Count one request the daemon answered (or dropped: result `dropped`). */
  recordCniRequest(command: string, result: 'ok' | 'error' | 'dropped' | 'declined', durationSeconds: number): void {
    const c = CNI_COMMANDS.has(command) ? command : 'other';
    this.cniRequests.inc({ command: c, path: 'daemon', result });
    if (result !== 'dropped' && result !== 'declined') this.cniDuration.observe({ command: c }, durationSeconds);
  }

  /** Count a reconcile error outside a pass's report (e.g. a pass that threw). */
  recordReconcileError(kind: string): void {
    this.reconcileErrors.inc({ kind });
  }

  /** One heal: `seconds` from a range set seen full to the daemon's first release in it. */
  recordHeal(seconds: number): void {
    this.heal.observe(Math.max(0, seconds));
  }

  /** Feed one finished reconcile pass. */
  recordPass(p: PassObservation): void {
    this.addresses.reset();
    this.capacity.reset();
    for (const r of p.rangeSets) {
      const rs = String(r.rangeSet);
      this.capacity.set({ network: r.network, range_set: rs }, r.capacity);
      for (const state of ADDRESS_STATES) this.addresses.set({ network: r.network, range_set: rs, state }, r.counts[state]);
    }
    this.candidates.reset();
    for (const [network, n] of p.candidates) this.candidates.set({ network }, n);
    for (const r of p.released) this.releases.inc({ network: r.network, reason: r.reason });
    for (const e of p.errors) this.reconcileErrors.inc({ kind: e.kind });
    this.reconcileDuration.observe(p.durationSeconds);
    if (p.errors.length === 0) this.lastSuccess.set(p.endedAtSeconds);
  }

  /** The exposition text (what `/metrics` answers). */
  async text(): Promise<string> {
    this.readFallbackLog();
    await this.pools.refreshFor(POOL_SCRAPE_WAIT_MS);
    this.pools.refreshOffline();
    return this.registry.metrics();
  }

  private readFallbackLog(): void {
    if (this.fallbackLog === null) return;
    for (const l of this.fallbackLog.readNew()) {
      this.cniRequests.inc({ command: CNI_COMMANDS.has(l.command) ? l.command : 'other', path: 'standalone', result: l.result });
    }
  }
}

/** Where the pool gauges come from: {@link PoolSessions.sample} in the daemon. */
export type PoolSampler = () => Promise<ReadonlyArray<PoolSample | PoolSampleError>>;

/** Where the offline gauges come from: `PoolSessions.offlineStats` in the daemon (no I/O: read on every scrape). */
export type OfflineStatsSource = () => readonly OfflineStats[];

/** Least age of the pool gauges before a scrape reads etcd again, seconds (scrapes never load etcd more often). */
export const POOL_GAUGES_MIN_AGE_SECONDS = 10;
/**
 * Longest a scrape waits for a read of the pool gauges, milliseconds: an unreachable etcd (5 s per
 * call) must not hold the whole answer past Prometheus's scrape timeout (10 s by default), which
 * would lose the node's other series too. A read still running is used by a later scrape.
 */
export const POOL_SCRAPE_WAIT_MS = 2000;

/**
 * The cluster pools' series, on the daemon's registry. {@link observer} is the
 * {@link PoolObserver} the daemon gives its `PoolSessions` (counters and histograms, fed as the
 * pool works); the gauges are read through a {@link PoolSampler} on a scrape, but at most once per
 * `minAgeSeconds` (≥ {@link POOL_GAUGES_MIN_AGE_SECONDS}; the daemon passes max(10 s, its reconcile
 * interval)) and never twice at once: between reads a scrape gets the last values. A pool whose
 * read failed has no gauge series until a read succeeds (absent = unknown; the failure is counted
 * in `ipwarden_pool_status_read_errors_total`).
 */
export class PoolMetrics {
  private readonly requests: Counter<'pool' | 'node' | 'command' | 'result'>;
  private readonly duration: Histogram<'pool' | 'node' | 'command'>;
  private readonly txns: Counter<'pool' | 'node' | 'outcome'>;
  private readonly batches: Histogram<'pool' | 'node'>;
  private readonly gauges: Record<'blocks' | 'held' | 'claimedBlocks' | 'unclaimedBlocks' | 'alive', Gauge<'pool' | 'node'>>;
  private readonly readErrors: Counter<'pool' | 'node'>;
  private readonly offlineOps: Counter<'pool' | 'node' | 'kind'>;
  private readonly reserve: Gauge<'pool' | 'node'>;
  private readonly journal: Gauge<'pool' | 'node' | 'state'>;
  private readonly contactAge: Gauge<'pool' | 'node'>;
  private readonly monotonicMs: () => number;
  private sampler: PoolSampler | null = null;
  private offlineSource: OfflineStatsSource | null = null;
  private minAgeMs = POOL_GAUGES_MIN_AGE_SECONDS * 1000;
  private lastReadMs: number | null = null;
  private reading: Promise<void> | null = null;
  /** Reads done through the sampler so far (tests: scrapes do not read etcd each time). */
  reads = 0;

  /** The observer to pass to `PoolSessions` (its members never throw). */
  readonly observer: PoolObserver = {
    request: (e: PoolRequestEvent) => {
      this.requests.inc({ pool: e.pool, node: e.node, command: e.command, result: e.result });
      this.duration.observe({ pool: e.pool, node: e.node, command: e.command }, e.durationSeconds);
    },
    txn: (e: PoolTxnEvent) => this.txns.inc({ pool: e.pool, node: e.node, outcome: e.outcome }),
    batch: (e: PoolBatchEvent) => this.batches.observe({ pool: e.pool, node: e.node }, e.size),
    offline: (e: PoolOfflineEvent) => this.offlineOps.inc({ pool: e.pool, node: e.node, kind: e.kind }),
  };

  /** @param registry where the series go @param monotonicMs the cache's clock, milliseconds */
  constructor(registry: Registry, monotonicMs: () => number) {
    const registers = [registry];
    const labelNames = ['pool', 'node'] as const;
    this.monotonicMs = monotonicMs;
    this.requests = new Counter({
      name: 'ipwarden_pool_requests_total',
      help: 'Pool ADD, DEL and CHECK requests the daemon answered, by result (ok, or the CNI error code).',
      labelNames: [...labelNames, 'command', 'result'],
      registers,
    });
    this.duration = new Histogram({
      name: 'ipwarden_pool_request_duration_seconds',
      help: "Time of a pool request in the daemon's pool sessions (an ADD's wait for its batch included).",
      labelNames: [...labelNames, 'command'],
      buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10],
      registers,
    });
    this.txns = new Counter({
      name: 'ipwarden_pool_etcd_transactions_total',
      help: "The pool allocator's etcd transactions by outcome (committed, conflict: a compare failed, unavailable: etcd not reached in time, error).",
      labelNames: [...labelNames, 'outcome'],
      registers,
    });
    this.batches = new Histogram({
      name: 'ipwarden_pool_batch_size',
      help: 'ADD requests per batch sent as one transaction.',
      labelNames,
      buckets: [1, 2, 4, 8, 16, 24],
      registers,
    });
    const gauge = (name: string, help: string) => new Gauge({ name, help, labelNames, registers });
    this.gauges = {
      blocks: gauge('ipwarden_pool_node_blocks', 'Blocks the node owns in the pool (as of the last read of etcd).'),
      held: gauge('ipwarden_pool_node_addresses', "Addresses the node's containers hold in its own blocks (reserve entries and borrowers not counted)."),
      claimedBlocks: gauge('ipwarden_pool_claimed_blocks', 'Blocks claimed in the whole pool, by any node.'),
      unclaimedBlocks: gauge('ipwarden_pool_unclaimed_blocks', 'Blocks of the pool no node has claimed (0: a node whose blocks are full can only borrow).'),
      alive: gauge('ipwarden_pool_node_alive', "1 when the node's heartbeat key exists in the pool, else 0 (a hint, never a decision)."),
    };
    this.readErrors = new Counter({
      name: 'ipwarden_pool_status_read_errors_total',
      help: "Reads of a pool's status for the gauges that failed (etcd unreachable, a corrupt value): its gauges are absent until a read succeeds.",
      labelNames,
      registers,
    });
    this.offlineOps = new Counter({
      name: 'ipwarden_pool_offline_operations_total',
      help: 'Offline allocation (ipam.pool.offline): ADDs (add) and DELs (del) answered while etcd was unreachable, journal entries synced (synced), and entries whose sync failed for good, their reserve entry gone (syncFailure).',
      labelNames: [...labelNames, 'kind'],
      registers,
    });
    this.reserve = gauge('ipwarden_pool_reserve_addresses', "Reserve entries the node can still hand out offline, summed over the network's range sets (as last read from etcd, minus those journaled).");
    this.journal = new Gauge({
      name: 'ipwarden_pool_journal_entries',
      help: 'Offline journal entries not yet synced to etcd: pending (waiting for a sync) or stuck (their reserve entry is gone: an operator must act).',
      labelNames: [...labelNames, 'state'],
      registers,
    });
    this.contactAge = gauge('ipwarden_pool_contact_age_seconds', "Seconds since the node's last confirmed contact with etcd (monotonic clock); absent before the first one.");
  }

  /**
   * Read the offline gauges from `source` on every scrape (`PoolSessions.offlineStats`: no I/O, so
   * no etcd read is added); pools without `ipam.pool.offline` have none of these series.
   */
  watchOffline(source: OfflineStatsSource): void {
    this.offlineSource = source;
  }

  /** Replace the offline gauges by `stats`' ({@link watchOffline}; called on every scrape). */
  setOffline(stats: readonly OfflineStats[]): void {
    this.reserve.reset();
    this.journal.reset();
    this.contactAge.reset();
    for (const st of stats) {
      const l = { pool: st.pool, node: st.node };
      this.reserve.set(l, st.reserveLeft.reduce((a, b) => a + b, 0));
      this.journal.set({ ...l, state: 'pending' }, Math.max(0, st.journaled - st.stuck));
      this.journal.set({ ...l, state: 'stuck' }, st.stuck);
      if (st.contactAgeSeconds !== null) this.contactAge.set(l, st.contactAgeSeconds);
    }
  }

  /** {@link setOffline} from the watched source; never throws (a source that throws leaves the gauges as they were). */
  refreshOffline(): void {
    if (this.offlineSource === null) return;
    try {
      this.setOffline(this.offlineSource());
    } catch {
      // the sessions closed: keep the last values
    }
  }

  /**
   * Read the gauges through `sampler` on scrapes, at most once per `minAgeSeconds` (raised to
   * {@link POOL_GAUGES_MIN_AGE_SECONDS} when lower).
   */
  watch(sampler: PoolSampler, minAgeSeconds: number = POOL_GAUGES_MIN_AGE_SECONDS): void {
    this.sampler = sampler;
    this.minAgeMs = Math.max(POOL_GAUGES_MIN_AGE_SECONDS, minAgeSeconds) * 1000;
  }

  /**
   * Read the gauges again when the last read is at least `minAgeSeconds` old (or there was none);
   * a read in progress is joined, not repeated. Never throws: a sampler that throws (the sessions
   * closed) leaves the gauges as they were.
   */
  refresh(): Promise<void> {
    if (this.sampler === null) return Promise.resolve();
    if (this.reading !== null) return this.reading;
    if (this.lastReadMs !== null && this.monotonicMs() - this.lastReadMs < this.minAgeMs) return Promise.resolve();
    const sampler = this.sampler;
    this.lastReadMs = this.monotonicMs();
    this.reads++;
    this.reading = sampler()
      .then((samples) => this.set(samples))
      .catch(() => undefined)
      .finally(() => {
        this.reading = null;
      });
    return this.reading;
  }

  /**
   * {@link refresh}, waiting for it at most `ms` milliseconds (then the last values are served and
   * the read goes on; its values are the next scrape's). Never throws.
   */
  async refreshFor(ms: number): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    // Not unref'd: it is cleared as soon as the read ends, and the scrape waits for one or the other.
    const late = new Promise<void>((r) => {
      timer = setTimeout(r, ms);
    });
    try {
      await Promise.race([this.refresh(), late]);
    } finally {
      clearTimeout(timer);
    }
  }

  /** Replace every gauge series by `samples`' (a {@link PoolSampleError} counts a read error and sets none). */
  set(samples: ReadonlyArray<PoolSample | PoolSampleError>): void {
    for (const g of Object.values(this.gauges)) g.reset();
    for (const s of samples) {
      const l = { pool: s.pool, node: s.node };
      if ('error' in s) {
        this.readErrors.inc(l);
        continue;
      }
      this.gauges.blocks.set(l, s.blocks);
      this.gauges.held.set(l, s.held);
      this.gauges.claimedBlocks.set(l, s.claimedBlocks);
      this.gauges.unclaimedBlocks.set(l, s.unclaimedBlocks);
      this.gauges.alive.set(l, s.alive ? 1 : 0);
    }
  }
}

/** One parsed line of the fallback log. */
interface FallbackLine {
  readonly command: string;
  readonly result: 'ok' | 'error';
}

/** Most bytes read from the fallback log per scrape (a runaway file cannot stall a scrape). */
const FALLBACK_READ_MAX = 1 << 20;

/**
 * Reads the lines appended to the standalone plugin's fallback log since the last read. Opens
 * with O_NOFOLLOW (never through a symlink) and reads only a regular file; a file that shrank was
 * replaced or truncated, so it is read from its start. Malformed lines are skipped.
 */
export class FallbackLogReader {
  private offset = 0;
  private ino = -1;
  private partial = '';
  private readonly path: string;

  /** @param path the fallback log (docs/daemon.md), read with O_NOFOLLOW. */
  constructor(path: string) {
    this.path = path;
  }

  /** Lines appended since the last call ([] when the file is absent or unreadable). */
  readNew(): FallbackLine[] {
    let fd: number;
    try {
      fd = openSync(this.path, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
    } catch {
      return [];
    }
    try {
      const st = fstatSync(fd);
      if (!st.isFile()) return [];
      if (st.ino !== this.ino || st.size < this.offset) {
        this.ino = st.ino;
        this.offset = 0;
        this.partial = '';
      }
      const n = Math.min(st.size - this.offset, FALLBACK_READ_MAX);
      if (n <= 0) return [];
      const buf = Buffer.alloc(n);
      const got = readSync(fd, buf, 0, n, this.offset);
      this.offset += got;
      const text = this.partial + buf.subarray(0, got).toString('latin1');
      const lines = text.split('\n');
      this.partial = lines.pop() ?? '';
      const out: FallbackLine[] = [];
      for (const line of lines) {
        const m = /^\d+ ([A-Z]{1,16}) (ok|error)$/.exec(line);
        if (m !== null) out.push({ command: m[1] as string, result: m[2] as 'ok' | 'error' });
      }
      return out;
    } finally {
      closeSync(fd);
    }
  }
}

/** Most connections the metrics endpoint holds at once (more are refused by the kernel's accept). */
export const METRICS_MAX_CONNECTIONS = 32;
/** A metrics connection idle this long (no bytes either way) is closed, seconds. */
export const METRICS_IDLE_SECONDS = 15;

/** Most connections the probe listener (`--health-address`) holds at once. */
export const HEALTH_MAX_CONNECTIONS = 8;
/** A probe connection idle this long is closed, seconds (the kubelet opens one per probe). */
export const HEALTH_IDLE_SECONDS = 5;

/** The daemon's health, as `/healthz` and `/readyz` report it. */
export interface Health {
  /** `/healthz`: the process works (its event loop answers; the plugin server has not failed). */
  live(): { ok: boolean; why: string };
  /** `/readyz`: the plugin socket is listening and accepting requests. */
  ready(): { ok: boolean; why: string };
}

/** A running metrics endpoint. */
export interface MetricsServer {
  /** The bound address (the real port when 0 was asked). */
  readonly address: HostPort;
  /** Stop listening; idempotent. */
  close(): Promise<void>;
}

/**
 * Serve `GET /metrics` (Prometheus text format 0.0.4), `/healthz` and `/readyz` (200 `ok`, else
 * 503 with the reason) on `addr`. Any other path is 404, any other method 405.
 * @throws the `listen` error (EADDRINUSE, EACCES, EADDRNOTAVAIL) as a rejected promise.
 */
export async function startMetricsServer(addr: HostPort, metrics: DaemonMetrics, health: Health): Promise<MetricsServer> {
  return listen(addr, (req, res) => void answer(req, res, metrics, health), METRICS_MAX_CONNECTIONS, METRICS_IDLE_SECONDS);
}

/**
 * Serve only `/healthz` and `/readyz` on `addr` (`--health-address`, the kubelet's probes), with
 * connections of their own ({@link HEALTH_MAX_CONNECTIONS}, idle ones closed after
 * {@link HEALTH_IDLE_SECONDS}): connections held open on the metrics port — anyone who reaches the
 * node can hold its 32 — never starve the probes, so they cannot put the pod in a restart loop.
 * `/metrics` is 404 here. Bound to loopback in the DaemonSet (the pod is in the host network: the
 * kubelet probes the node's 127.0.0.1).
 * @throws the `listen` error (EADDRINUSE, EACCES, EADDRNOTAVAIL) as a rejected promise.
 */
export async function startHealthServer(addr: HostPort, health: Health): Promise<MetricsServer> {
  return listen(addr, (req, res) => void answerHealth(req, res, health), HEALTH_MAX_CONNECTIONS, HEALTH_IDLE_SECONDS);
}

async function listen(addr: HostPort, handler: (req: IncomingMessage, res: ServerResponse) => void, maxConnections: number, idleSeconds: number): Promise<MetricsServer> {
  const server: Server = createServer(handler);
  server.keepAliveTimeout = 5_000;
  server.headersTimeout = 10_000;
  server.requestTimeout = 10_000;
  // Any local user can connect: bound the connections and close the ones that send nothing, so
  // the endpoint cannot be used to exhaust the daemon's file descriptors (found by review: 20,000
  // idle connections did). Prometheus needs one connection per scraper.
  server.maxConnections = maxConnections;
  server.on('connection', (sock) => {
    sock.setTimeout(idleSeconds * 1000, () => sock.destroy());
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen({ host: addr.host, port: addr.port }, () => {
      server.off('error', reject);
      resolve();
    });
  });
  const bound = server.address() as AddressInfo;
  let closing: Promise<void> | null = null;
  return {
    address: { host: addr.host, port: bound.port },
    close: () => {
      closing ??= new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      });
      return closing;
    },
  };
}

function answerHealth(req: IncomingMessage, res: ServerResponse, health: Health): void {
  const path = (req.url ?? '/').split('?')[0];
  if (req.method !== 'GET' && req.method !== 'HEAD') {
    res.writeHead(405, { Allow: 'GET, HEAD', 'Content-Type': 'text/plain' }).end('method not allowed\n');
  } else if (path === '/healthz' || path === '/readyz') {
    const h = path === '/healthz' ? health.live() : health.ready();
    res.writeHead(h.ok ? 200 : 503, { 'Content-Type': 'text/plain' }).end(h.ok ? 'ok\n' : `${h.why}\n`);
  } else {
    res.writeHead(404, { 'Content-Type': 'text/plain' }).end('not found: this is the probe listener, try /healthz, /readyz\n');
  }
}

async function answer(req: IncomingMessage, res: ServerResponse, metrics: DaemonMetrics, health: Health): Promise<void> {
  const path = (req.url ?? '/').split('?')[0];
  if (req.method !== 'GET' && req.method !== 'HEAD') {
    res.writeHead(405, { Allow: 'GET, HEAD', 'Content-Type': 'text/plain' }).end('method not allowed\n');
    return;
  }
  try {
    if (path === '/metrics') {
      const body = await metrics.text();
      res.writeHead(200, { 'Content-Type': metrics.registry.contentType }).end(req.method === 'HEAD' ? undefined : body);
    } else if (path === '/healthz' || path === '/readyz') {
      const h = path === '/healthz' ? health.live() : health.ready();
      res.writeHead(h.ok ? 200 : 503, { 'Content-Type': 'text/plain' }).end(h.ok ? 'ok\n' : `${h.why}\n`);
    } else {
      res.writeHead(404, { 'Content-Type': 'text/plain' }).end('not found: try /metrics, /healthz, /readyz\n');
    }
  } catch (e) {
    res.writeHead(500, { 'Content-Type': 'text/plain' }).end(`${e instanceof Error ? e.message : String(e)}\n`);
  }
}
