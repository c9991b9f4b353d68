/**
 * The daemon's Prometheus metrics (`docs/metrics.md`), with `prom-client` on a registry of our
 * own (never the library's global one, so two daemons in one test process do not share series),
 * and the HTTP endpoint that serves them with `/healthz` and `/readyz`.
 *
 * Series (names and labels are a stable interface; docs/metrics.md explains each and gives alert
 * rules):
 * - `ipwarden_addresses{network,range_set,state}` gauge, state = live|grace|leaked|corrupt|unknown|free
 * - `ipwarden_range_set_capacity{network,range_set}` gauge
 * - `ipwarden_releases_total{network,reason}` counter (the loop's releases and those of the ADDs' reclaims)
 * - `ipwarden_release_candidates{network}` gauge
 * - `ipwarden_reconcile_duration_seconds` histogram
 * - `ipwarden_reconcile_errors_total{kind}` counter
 * - `ipwarden_last_reconcile_success_timestamp_seconds` gauge
 * - `ipwarden_cni_requests_total{command,path,result}` counter, path = daemon|standalone
 * - `ipwarden_cni_request_duration_seconds{command}` histogram (daemon path only: the standalone
 *   plugin's own time is not visible to the daemon)
 * - `ipwarden_metrics_renders_total` counter (renders of the exposition; {@link RenderGate})
 * - the kernel address index ({@link KernelIndexMetrics}): `ipwarden_allocation_kernel_conflicts_total{network}`,
 *   `ipwarden_allocation_kernel_index_unused_total{network,reason}`, `ipwarden_kernel_index_reads_total{result}`,
 *   `ipwarden_kernel_index_read_seconds`, `ipwarden_kernel_index_addresses`, `ipwarden_kernel_index_age_seconds`
 * - `ipwarden_status_renders_total` counter (reports of `/status`, `/status.json`; registered by
 *   src/daemon/status-pages.ts)
 * - cluster pools (docs/cluster.md "Metrics"; {@link PoolMetrics}), all labelled `pool` and `node`:
 *   `ipwarden_pool_requests_total{command,result}`, `ipwarden_pool_request_duration_seconds{command}`,
 *   `ipwarden_pool_etcd_transactions_total{outcome}`, `ipwarden_pool_batch_size`, the gauges
 *   `ipwarden_pool_node_blocks`, `ipwarden_pool_node_addresses`, `ipwarden_pool_claimed_blocks`,
 *   `ipwarden_pool_unclaimed_blocks`, `ipwarden_pool_node_alive`, `ipwarden_pool_node_corrupt_blocks`,
 *   `ipwarden_pool_pending_release_blocks`, `ipwarden_pool_free_addresses{range_set}` (the node's own blocks and the
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
import type { AddressInfo, Socket } from 'node:net';
import { performance } from 'node:perf_hooks';
import { Counter, Gauge, Histogram, Registry } from 'prom-client';
import type { HostPort } from '../common/daemon-options.ts';
import type { PoolBatchEvent, PoolObserver, PoolOfflineEvent, PoolRequestEvent, PoolSample, PoolSampleError, PoolTxnEvent } from './pool-observer.ts';
import type { OfflineStats } from '../pool/index.ts';

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
  private readonly renders: Counter;
  private readonly gate: RenderGate<Buffer>;
  /** The cluster pools' series (docs/cluster.md "Metrics"). */
  readonly pools: PoolMetrics;
  /** The kernel address index's series (docs/daemon.md "The kernel address index"). */
  readonly kernelIndex: KernelIndexMetrics;

  /**
   * @param opts.monotonicMs the clock of the pool gauges' cache, milliseconds (default `performance.now`; tests inject one).
   * @param opts.renderIntervalMs least time between two renders for `/metrics` (default {@link METRICS_RENDER_INTERVAL_MS}).
   * @param opts.gateClock the clock of that spacing (default {@link REAL_GATE_CLOCK}).
   */
  constructor(opts: { readonly monotonicMs?: () => number; readonly renderIntervalMs?: number; readonly gateClock?: GateClock } = {}) {
    const registers = [this.registry];
    this.gate = new RenderGate(async () => Buffer.from(await this.text(), 'utf8'), opts.renderIntervalMs ?? METRICS_RENDER_INTERVAL_MS, opts.gateClock);
    this.renders = new Counter({
      name: 'ipwarden_metrics_renders_total',
      help: 'Renders of this exposition (scrapes that arrive while one is due share it; at most one per second).',
      registers,
    });
    this.pools = new PoolMetrics(this.registry, opts.monotonicMs ?? (() => performance.now()));
    this.kernelIndex = new KernelIndexMetrics(this.registry);
    this.#nodeNameMismatch();
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
      help: 'Reservations released by the daemon (its reconcile passes, and the reclaims of the ADDs it served), by the verdict that allowed it.',
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
      help: 'Seconds from a range set seen full (inotify, a pass, or an ADD finding no address) to the daemon releasing a leak in it (a pass, or the reclaim of an ADD it served; docs/reconciler.md).',
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
    this.poolReReserved = new Counter({
      name: 'ipwarden_pool_rereserved_total',
      help: "Addresses of this node's READY pods that the cluster pool had lost (an etcd restored from an older snapshot), written back by the daemon's pool pass, by pool.",
      labelNames: ['pool'],
      registers,
    });
    this.poolWants = new Counter({
      name: 'ipwarden_pool_wants_total',
      help: "Wants of this node's READY pods' addresses that another holder had in the cluster pool (after an etcd restore), by pool and event: written (the address is kept from every other pod), fulfilled (re-reserved once its holder released it), dropped (the pod is no longer READY).",
      labelNames: ['pool', 'event'],
      registers,
    });
  }

  // ---- Cluster-pool reconcile (docs/cluster.md "Reconcile per node"; branch poolgc) ----
  private readonly poolReleases: Counter<'pool' | 'reason'>;
  /** docs/cluster.md "Re-reserving live pods' addresses". */
  private readonly poolReReserved: Counter<'pool'>;
  /** docs/cluster.md "Re-reserving live pods' addresses" (wants). */
  private readonly poolWants: Counter<'pool' | 'event'>;

  /** Feed one finished pool pass of the loop: its releases (reason `daemon`), its re-reservations, its wants (written, fulfilled, dropped) and its errors (kinds prefixed `pool-`: a duplicate address is `pool-conflict`). */
  recordPoolPass(p: {
    readonly released: ReadonlyArray<{ readonly pool: string }>;
    readonly errors: ReadonlyArray<{ readonly kind: string }>;
    readonly reReserved?: ReadonlyArray<{ readonly pool: string }>;
    readonly wants?: ReadonlyArray<{ readonly pool: string; readonly event: 'written' | 'fulfilled' | 'dropped' }>;
  }): void {
    for (const r of p.released) this.poolReleases.inc({ pool: r.pool, reason: 'daemon' });
    for (const r of p.reReserved ?? []) this.poolReReserved.inc({ pool: r.pool });
    for (const w of p.wants ?? []) this.poolWants.inc({ pool: w.pool, event: w.event });
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

  private nodeNameMismatchGauge: Gauge | null = null;

  /**
   * The node-name file disagrees with the daemon's NODE_NAME (1) or not (0): src/daemon/node-name-check.ts.
   * Registered with the other series (0 until the daemon's first check says otherwise).
   */
  setNodeNameMismatch(mismatch: boolean): void {
    this.#nodeNameMismatch().set(mismatch ? 1 : 0);
  }

  #nodeNameMismatch(): Gauge {
    this.nodeNameMismatchGauge ??= new Gauge({
      name: 'ipwarden_node_name_mismatch',
      help: "Whether the node-name file beside the installed plugin names another node than the daemon's NODE_NAME, or was written on another host name (1: the standalone fallback would act as another node; /readyz fails), or agrees (0).",
      registers: [this.registry],
    });
    return this.nodeNameMismatchGauge;
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

  /**
   * Count the reservations a reclaim inside an ADD the daemon served released in `network`, each
   * under `ipwarden_releases_total{network,reason}` with its verdict as `reason` (as a pass's).
   */
  recordReclaim(network: string, released: ReadonlyArray<{ readonly verdict: string }>): void {
    for (const r of released) this.releases.inc({ network, reason: r.verdict });
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

  /**
   * Render the exposition text now (counted in `ipwarden_metrics_renders_total`). `/metrics`
   * answers through {@link exposition} instead, which bounds how often this runs.
   */
  async text(): Promise<string> {
    this.renders.inc();
    this.readFallbackLog();
    await this.pools.refreshFor(POOL_SCRAPE_WAIT_MS);
    this.pools.refreshOffline();
    return this.registry.metrics();
  }

  /**
   * What `/metrics` answers: the exposition as bytes, through a {@link RenderGate} (a render that
   * began at or after the call; renders at least {@link METRICS_RENDER_INTERVAL_MS} apart and
   * shared by every scrape that arrives meanwhile). Rejects when that render failed.
   */
  exposition(): Promise<Buffer> {
    return this.gate.get();
  }

  private readFallbackLog(): void {
    if (this.fallbackLog === null) return;
    for (const l of this.fallbackLog.readNew()) {
      this.cniRequests.inc({ command: CNI_COMMANDS.has(l.command) ? l.command : 'other', path: 'standalone', result: l.result });
    }
  }
}

/** Results of one read of the kernel address index (`ipwarden_kernel_index_reads_total{result}`). */
export type KernelIndexReadResult = 'complete' | 'incomplete';

/**
 * The kernel address index's series (docs/metrics.md): what ADDs skipped because the index showed
 * the address configured in a network namespace, ADDs that could not use it and why, and the
 * index's own reads (their count is its generation), duration, size and age.
 */
export class KernelIndexMetrics {
  private readonly conflicts: Counter<'network'>;
  private readonly unused: Counter<'network' | 'reason'>;
  private readonly reads: Counter<'result'>;
  private readonly readSeconds: Histogram;
  private readonly addresses: Gauge;
  private ageSource: (() => number | null) | null = null;

  /** @param registry where the series go */
  constructor(registry: Registry) {
    const registers = [registry];
    this.conflicts = new Counter({
      name: 'ipwarden_allocation_kernel_conflicts_total',
      help: 'Addresses an ADD served by the daemon skipped because the kernel address index showed them configured in a network namespace while no reservation file held them.',
      labelNames: ['network'],
      registers,
    });
    this.unused = new Counter({
      name: 'ipwarden_allocation_kernel_index_unused_total',
      help: 'ADDs served by the daemon that could not use the kernel address index (reason: no-read, incomplete, stale) and allocated as host-local does.',
      labelNames: ['network', 'reason'],
      registers,
    });
    this.reads = new Counter({
      name: 'ipwarden_kernel_index_reads_total',
      help: "Full reads of every network namespace's addresses by the kernel address index, by result (complete, incomplete); their sum is the index's generation.",
      labelNames: ['result'],
      registers,
    });
    this.readSeconds = new Histogram({
      name: 'ipwarden_kernel_index_read_seconds',
      help: 'Wall time of one read of the kernel address index.',
      buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5],
      registers,
    });
    this.addresses = new Gauge({
      name: 'ipwarden_kernel_index_addresses',
      help: 'Distinct addresses configured in the network namespaces of the node, as of the last read of the kernel address index.',
      registers,
    });
    const self = this;
    new Gauge({
      name: 'ipwarden_kernel_index_age_seconds',
      help: 'Seconds since the last read of the kernel address index started (monotonic clock); absent before the first read.',
      registers,
      collect() {
        const age = self.ageSource?.() ?? null;
        if (age === null) this.reset();
        else this.set(age);
      },
    });
  }

  /** Read the age gauge from `source` on every scrape (seconds, or null before the first read). */
  watchAge(source: () => number | null): void {
    this.ageSource = source;
  }

  /** Count one read of the index. */
  recordRead(r: { readonly result: KernelIndexReadResult; readonly durationSeconds: number; readonly addresses: number }): void {
    this.reads.inc({ result: r.result });
    this.readSeconds.observe(r.durationSeconds);
    this.addresses.set(r.addresses);
  }

  /** Count `n` addresses an ADD of `network` skipped. */
  recordConflicts(network: string, n: number): void {
    if (n > 0) this.conflicts.inc({ network }, n);
  }

  /** Count one ADD of `network` that could not use the index. */
  recordUnused(network: string, reason: string): void {
    this.unused.inc({ network, reason });
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
  private readonly gauges: Record<'blocks' | 'held' | 'claimedBlocks' | 'unclaimedBlocks' | 'alive' | 'corruptBlocks' | 'pendingReleaseBlocks', Gauge<'pool' | 'node'>>;
  private readonly free: Gauge<'pool' | 'node' | 'range_set'>;
  private readonly readErrors: Counter<'pool' | 'node'>;
  private readonly offlineOps: Counter<'pool' | 'node' | 'kind'>;
  private readonly nodesReclaimed: Counter<'pool'>;
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

  /** Count one node removed from `pool` automatically (src/daemon/pool-reclaim.ts). */
  recordNodeReclaimed(pool: string): void {
    this.nodesReclaimed.inc({ pool });
  }

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
      help: 'ADD and DEL requests per batch sent as one transaction.',
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
      corruptBlocks: gauge('ipwarden_pool_node_corrupt_blocks', "The node's blocks whose value cannot be read (corrupt): no ADD allocates from them; an operator must repair them (ipwarden pool status lists the keys)."),
      pendingReleaseBlocks: gauge('ipwarden_pool_pending_release_blocks', 'Blocks marked pendingRelease by ipwarden pool remove-node, among the blocks of nodes with a removal marker and this node\'s own (0: no removal under way).'),
    };
    this.free = new Gauge({
      name: 'ipwarden_pool_free_addresses',
      help: "Addresses of the range set this node can get without borrowing: those of the blocks no node has claimed plus the free ones of the node's own blocks (other nodes' free addresses not counted).",
      labelNames: [...labelNames, 'range_set'],
      registers,
    });
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
    this.nodesReclaimed = new Counter({
      name: 'ipwarden_pool_nodes_reclaimed_total',
      help: 'Nodes this daemon removed from a pool automatically (ipam.pool.reclaimAfter): counted once per removal, at its first --finish that the node did not veto.',
      labelNames: ['pool'],
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
    this.free.reset();
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
      this.gauges.corruptBlocks.set(l, s.corruptBlocks);
      this.gauges.pendingReleaseBlocks.set(l, s.pendingReleaseBlocks);
      s.freeAddresses.forEach((n, i) => this.free.set({ ...l, range_set: String(i) }, n));
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

/**
 * Least time between the starts of two renders of the exposition, milliseconds: under a scrape
 * flood the registry is rendered at most once per second, whatever the number of scrapers.
 */
export const METRICS_RENDER_INTERVAL_MS = 1000;

/** The clock of a {@link RenderGate}: monotonic milliseconds and a timer (tests inject a fake one). */
export interface GateClock {
  /** Monotonic time, milliseconds. */
  now(): number;
  /** Resolves after `ms` milliseconds (the real clock's timer is unref'd: a waiting scrape keeps no process alive). */
  sleep(ms: number): Promise<void>;
}

/** `performance.now` and an unref'd `setTimeout`. */
export const REAL_GATE_CLOCK: GateClock = {
  now: () => performance.now(),
  sleep: (ms) => new Promise((resolve) => setTimeout(resolve, ms).unref()),
};

/**
 * Single-flight, rate-bounded renders shared by every caller (the scrapes of `/metrics`; issue 17
 * item 3: a scrape flood slowed the shim's requests, whose work shares the daemon's event loop).
 *
 * - Fresh: {@link get} resolves with a render that began at or after the call, so a scrape sees
 *   everything counted before it was asked (a request answered, then a scrape: it is counted).
 * - Bounded: renders never overlap, and each begins at least `intervalMs` after the previous one
 *   began; every caller that arrives before a render begins shares it. A scrape may thus wait up
 *   to `intervalMs` (plus a render in progress). In any window of W ms at most
 *   `floor(W / intervalMs) + 1` renders begin, however many callers there are; and a client that
 *   scrapes again as soon as it is answered gets at most one answer per interval (a flood on N
 *   connections is paced to about N answers per interval).
 * - A render that rejects rejects every caller that shared it; the next caller starts another one
 *   (still spaced).
 */
export class RenderGate<T> {
  private readonly render: () => Promise<T>;
  private readonly intervalMs: number;
  private readonly clock: GateClock;
  private lastStartMs: number | null = null;
  private running: Promise<unknown> | null = null;
  /** The render the next callers share, until it begins. */
  private pending: Promise<T> | null = null;
  /** Renders begun so far. */
  renders = 0;

  /**
   * @param render makes one value (called by the gate only, never twice at once)
   * @param intervalMs least time between two renders' starts, milliseconds
   * @param clock default {@link REAL_GATE_CLOCK}
   */
  constructor(render: () => Promise<T>, intervalMs: number, clock: GateClock = REAL_GATE_CLOCK) {
    this.render = render;
    this.intervalMs = intervalMs;
    this.clock = clock;
  }

  /** A value rendered at or after this call (see the class comment); rejects when that render failed. */
  get(): Promise<T> {
    if (this.pending === null) {
      const p = this.next();
      this.pending = p;
      // The caller's handlers see a rejection; this copy only stops an unhandled one being reported.
      p.catch(() => undefined);
    }
    return this.pending;
  }

  private async next(): Promise<T> {
    // Always yields first, so `pending` is set before anything below runs.
    await this.running?.catch(() => undefined);
    for (;;) {
      const wait = this.lastStartMs === null ? 0 : this.lastStartMs + this.intervalMs - this.clock.now();
      if (wait <= 0) break;
      await this.clock.sleep(wait);
    }
    // From here a new caller waits for the render after this one: this one may miss its writes.
    this.pending = null;
    this.lastStartMs = this.clock.now();
    this.renders++;
    const r = this.render();
    this.running = r;
    try {
      return await r;
    } finally {
      if (this.running === r) this.running = null;
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

/**
 * Least time between two batches of the answers other than `/metrics` (health, 404, 405) on the
 * daemon's HTTP listeners, milliseconds: each request waits for the next batch (at most this
 * long), so a client gets at most one such answer per interval per connection, whatever it sends.
 */
export const ANSWER_INTERVAL_MS = 100;

/** The daemon's health, as `/healthz` and `/readyz` report it. */
export interface Health {
  /** `/healthz`: the process works (its event loop answers; the plugin server has not failed). */
  live(): { ok: boolean; why: string };
  /** `/readyz`: the plugin socket is listening and accepting requests. */
  ready(): { ok: boolean; why: string };
}

/** One answer of {@link StatusPages}: the bytes, their type and the headers that go with them. */
export interface StatusPage {
  readonly body: Buffer;
  readonly contentType: string;
  /** More response headers (the page's Content-Security-Policy, …). */
  readonly headers: Readonly<Record<string, string>>;
}

/**
 * The node's status pages the metrics listener serves read-only (src/daemon/status-pages.ts):
 * `/status` the page of `ipwarden status --html`, `/status.json` the document of
 * `ipwarden status --json`. Each call is bounded like `/metrics` (a shared, spaced render).
 */
export interface StatusPages {
  /** The page (`html`) or the JSON document (`json`); rejects when the report could not be made (answered 500 with the reason). */
  get(kind: 'html' | 'json'): Promise<StatusPage>;
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
 * 503 with the reason) on `addr`, and with `status` its `/status` and `/status.json`
 * ({@link StatusPages}; docs/daemon.md "Status pages"). Any other path is 404, any other method
 * 405 (every path is read-only). `/metrics` answers {@link DaemonMetrics.exposition} (a render
 * begun after the request arrived, at most one render per {@link METRICS_RENDER_INTERVAL_MS}),
 * the status pages answer through their own gate; every other answer waits for the next
 * {@link ANSWER_INTERVAL_MS} batch (docs/metrics.md "Scrape floods").
 * @throws the `listen` error (EADDRINUSE, EACCES, EADDRNOTAVAIL) as a rejected promise.
 */
export async function startMetricsServer(addr: HostPort, metrics: DaemonMetrics, health: Health, status: StatusPages | null = null): Promise<MetricsServer> {
  return listen(addr, (req, res, pace) => answer(req, res, metrics, health, pace, status), METRICS_MAX_CONNECTIONS, METRICS_IDLE_SECONDS);
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
  return listen(addr, (req, res, pace) => answerHealth(req, res, health, pace), HEALTH_MAX_CONNECTIONS, HEALTH_IDLE_SECONDS);
}

/** Answers one request; `pace` releases the answers that are not `/metrics` ({@link ANSWER_INTERVAL_MS}). */
type Answer = (req: IncomingMessage, res: ServerResponse, pace: RenderGate<void>) => Promise<void>;

/**
 * The HTTP server of both listeners. Bounded work per client (issue 17 item 3: the daemon's CNI
 * requests share this event loop): at most `maxConnections`, idle ones closed, every answer paced
 * (`/metrics` by the render gate, the rest by {@link ANSWER_INTERVAL_MS}), and one request at a time
 * per connection — a client that pipelines a second request before its answer is disconnected
 * (Prometheus and the kubelet never pipeline; Node parses pipelined requests at once, so paced
 * answers would let a queue of them grow).
 */
async function listen(addr: HostPort, answer: Answer, maxConnections: number, idleSeconds: number): Promise<MetricsServer> {
  const pace = new RenderGate<void>(() => Promise.resolve(), ANSWER_INTERVAL_MS);
  const busy = new WeakSet<Socket>();
  const server: Server = createServer((req, res) => {
    const sock = req.socket;
    if (busy.has(sock)) {
      sock.destroy();
      return;
    }
    busy.add(sock);
    res.once('close', () => busy.delete(sock));
    void answer(req, res, pace);
  });
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

/** A plain-text answer with its length (no chunked encoding: one write). */
function reply(res: ServerResponse, status: number, text: string, headers: Record<string, string> = {}): void {
  const body = Buffer.from(text, 'utf8');
  res.writeHead(status, { ...headers, 'Content-Type': 'text/plain', 'Content-Length': body.length }).end(body);
}

async function answerHealth(req: IncomingMessage, res: ServerResponse, health: Health, pace: RenderGate<void>): Promise<void> {
  await pace.get();
  if (res.destroyed) return;
  const path = (req.url ?? '/').split('?')[0];
  if (req.method !== 'GET' && req.method !== 'HEAD') {
    reply(res, 405, 'method not allowed\n', { Allow: 'GET, HEAD' });
  } else if (path === '/healthz' || path === '/readyz') {
    const h = path === '/healthz' ? health.live() : health.ready();
    reply(res, h.ok ? 200 : 503, h.ok ? 'ok\n' : `${h.why}\n`);
  } else {
    reply(res, 404, 'not found: this is the probe listener, try /healthz, /readyz\n');
  }
}

/** The status pages' paths and what each answers. */
const STATUS_PATHS: Readonly<Record<string, 'html' | 'json'>> = { '/status': 'html', '/status.json': 'json' };

async function answer(req: IncomingMessage, res: ServerResponse, metrics: DaemonMetrics, health: Health, pace: RenderGate<void>, status: StatusPages | null): Promise<void> {
  const path = (req.url ?? '/').split('?')[0] ?? '/';
  const page = status === null ? undefined : STATUS_PATHS[path];
  // /metrics and the status pages wait for their renders (each gate spaces its own), the rest for the pace.
  if ((path !== '/metrics' && page === undefined) || (req.method !== 'GET' && req.method !== 'HEAD')) await pace.get();
  if (res.destroyed) return;
  if (req.method !== 'GET' && req.method !== 'HEAD') {
    reply(res, 405, 'method not allowed\n', { Allow: 'GET, HEAD' });
    return;
  }
  try {
    if (path === '/metrics') {
      const body = await metrics.exposition();
      if (res.destroyed) return; // the client left while its render was due
      res.writeHead(200, { 'Content-Type': metrics.registry.contentType, 'Content-Length': body.length }).end(req.method === 'HEAD' ? undefined : body);
    } else if (page !== undefined && status !== null) {
      const p = await status.get(page);
      if (res.destroyed) return;
      res.writeHead(200, { ...p.headers, 'Content-Type': p.contentType, 'Content-Length': p.body.length }).end(req.method === 'HEAD' ? undefined : p.body);
    } else if (path === '/healthz' || path === '/readyz') {
      const h = path === '/healthz' ? health.live() : health.ready();
      reply(res, h.ok ? 200 : 503, h.ok ? 'ok\n' : `${h.why}\n`);
    } else {
      reply(res, 404, `not found: try /metrics, /healthz, /readyz${status === null ? '' : ', /status, /status.json'}\n`);
    }
  } catch (e) {
    reply(res, 500, `${e instanceof Error ? e.message : String(e)}\n`);
  }
}
