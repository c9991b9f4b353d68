/**
 * The daemon's reconcile loop (issue 9): a pass (`src/reconcile/pass.ts`) every `--interval`
 * with ±10% jitter, and at once when a range set fills up.
 *
 * "Fills up" is seen with inotify (`fs.watch`) on every network directory the last pass read and
 * on each data directory (for new networks): after a change, the directory's IP-named files are
 * counted against each configured range set's capacity; a full range set triggers a pass. That
 * heals nodes that run **upstream host-local** with no change to their CNI configuration: its
 * ADD fails with "no IP addresses available in range set", the daemon releases the confirmed
 * leaks, kubelet's next retry succeeds. inotify is only a hint (events can be dropped, e.g. on
 * queue overflow, fast-path-measurements.md §3.2): the interval pass is the backstop.
 *
 * Passes never overlap: a trigger during a pass schedules one more right after it. Triggered
 * passes are at least {@link MIN_TRIGGER_GAP_MS} apart, so a flapping directory cannot spin.
 */
import { readdirSync, watch, type FSWatcher } from 'node:fs';
import { join } from 'node:path';
import type { DaemonOptions } from '../common/daemon-options.ts';
import { parseIP } from '../common/ip.ts';
import { rangeFor, rangeSetSize } from '../ipam/range.ts';
import type { RangeSet } from '../ipam/types.ts';
import { Confirmations, DEFAULT_RELEASE_CAP, jitteredDelay } from '../reconcile/confirm.ts';
import type { ReconcileDeps } from '../reconcile/options.ts';
import { runPass, type PassOptions, type PassReport } from '../reconcile/pass.ts';
import { layoutNetworks } from '../reconcile/status.ts';
import { poolRevisions, runPoolPass, type PoolPassError, type PoolPassReport, type PoolTarget } from '../reconcile/pool-pass.ts';
import { takeSnapshot, type Snapshot } from '../reconcile/snapshot.ts';
import { openAuditLog, openDefaultAuditLog, type AuditSink } from '../reconcile/audit.ts';
import { etcdFor } from '../pool/index.ts';
import { recordHost, type HostHistory } from '../node/host-history.ts';
import { resolveNodeName } from '../node/node-name.ts';
import type { PoolConfig } from '../ipam/pool-config.ts';
import { readCniConfigs, type CniNetwork } from '../node/cni-conf.ts';
import type { KV } from '../store/kv.ts';
import type { DaemonPart, DaemonPartFactory } from './daemon.ts';
import type { Logger } from './log.ts';
import type { DaemonMetrics } from './metrics.ts';
import type { PluginServerHooks, ReclaimEvent } from './plugin-server.ts';
import { makeDirs } from '../common/make-dirs.ts';
import { shellQuote } from '../common/shell.ts';

/**
 * What an operator does about `releases held` (rule D3, docs/reconciler.md), given the daemon's
 * runtime endpoint (null: none given, the default sockets): the daemon waits for a runtime list it
 * can trust; a person checks that list with the same endpoint, then, for a network, releases pods
 * known gone by hand (`gc` has no D3, but still asks the kernel for every address); a pool's
 * handles have no `gc`: the daemon releases them once the list can be trusted.
 */
function heldFix(endpoint: string | null, pool: boolean): string {
  const ep = endpoint === null ? '' : ` --runtime-endpoint ${shellQuote(endpoint)}`;
  const check = `check that the runtime endpoint is the node's runtime and that it lists its pods (crictl${ep} pods)`;
  return pool
    ? `${check}; ipwarden pool leaks lists the handles held; the daemon releases them once the runtime lists a pod that owns any of this node's handles in that pool`
    : `${check}; if those pods are really gone: ipwarden gc --network NAME${ep} --dry-run, then without --dry-run (it still checks the kernel for every address); or let the plugin reclaim them when the range set fills`;
}

/** Least time between two passes triggered by a full range set, ms. */
export const MIN_TRIGGER_GAP_MS = 1_000;

/** How far past a candidate's confirm time the confirming pass runs, ms. */
const CONFIRM_SLACK_MS = 50;

/** How long `close()` waits for a pass in progress, seconds. */
const CLOSE_WAIT_SECONDS = 10;

/** How long to wait after a directory event before counting (coalesces a burst), ms. */
const EVENT_SETTLE_MS = 50;

/** Lock wait of a pass, seconds: short, a pass must never hold up pods (it retries next pass). */
const PASS_LOCK_TIMEOUT_SECONDS = 5;

/** What {@link reconcileLoopPart} is given. */
export interface LoopDeps {
  /** The engine's I/O (runtime, kernel evidence, clock, stores). */
  readonly reconcile: ReconcileDeps;
  readonly metrics: DaemonMetrics;
  /** [0,1) source for the jitter (Math.random). */
  readonly random?: () => number;
  /** Per-pass release cap (default {@link DEFAULT_RELEASE_CAP}). */
  readonly releaseCap?: number;
  /**
   * The cluster pools the node's pass reconciles after its node-local networks (docs/cluster.md
   * "Reconcile per node"); default none. The agent passes {@link cniPoolTargets}.
   */
  readonly pools?: PoolTargetSource;
  /** Monotonic milliseconds for the two-observation rules (default `performance.now`; tests inject). */
  readonly monotonic?: () => number;
  /** Records and returns this machine's host names (default src/node/host-history.ts `recordHost`; tests inject). */
  readonly hostHistory?: (dataDir: string) => HostHistory;
}

/** The pools of one pass and etcd's revision `R` of each (null: unreadable; why in `errors`), read before the pass's runtime snapshot. */
interface PoolPrelude {
  readonly targets: PoolTarget[];
  readonly revisions: Array<string | null>;
  readonly errors: PoolPassError[];
}

/** Where the loop gets the pools to reconcile, each pass; `close()` when the loop stops. */
export interface PoolTargetSource {
  /** The pools and node names of this pass, with `errors` for the networks that could not be used. */
  targets(): { targets: PoolTarget[]; errors: string[] };
  /** Close the etcd clients (idempotent). */
  close(): Promise<void>;
}

/**
 * The pools of the pool networks in `cniConfDir` (read again each pass), each with the daemon's
 * node name for it (`ipam.nodeName`, else `env.NODE_NAME`, else the host name: the rule of the
 * pool's ADDs, src/node/node-name.ts `resolveNodeName`) and one etcd client per (endpoints, prefix,
 * TLS) kept for the loop's life (`make`, default `etcdFor`: the TLS files are read when the
 * client is made). Networks naming the same pool and node are one target. `more`: further pool
 * networks, asked each pass after the directory (the daemon's learned ones,
 * src/daemon/learned-pools.ts; `file` names the network's record in errors).
 */
export function cniPoolTargets(
  cniConfDir: string,
  env: Readonly<Record<string, string | undefined>>,
  make: (pool: PoolConfig) => KV = etcdFor,
  more: () => ReadonlyArray<Pick<CniNetwork, 'file' | 'ipam'> & Partial<Pick<CniNetwork, 'name'>>> = () => [],
): PoolTargetSource {
  const kvs = new Map<string, KV>();
  let closed = false;
  return {
    targets() {
      const errors: string[] = [];
      const out = new Map<string, PoolTarget>();
      if (closed) return { targets: [], errors };
      let networks: CniNetwork[] = [];
      try {
        networks = readCniConfigs(cniConfDir);
      } catch (e) {
        // The learned networks (`more`) are still reconciled.
        errors.push(`cannot read the CNI configurations in ${cniConfDir}: ${e instanceof Error ? e.message : String(e)}`);
      }
      for (const n of [...networks, ...more()]) {
        const pool = n.ipam?.pool;
        if (pool === null || pool === undefined) continue;
        try {
          const node = resolveNodeName(pool, env);
          const ck = JSON.stringify([pool.etcd.endpoints, pool.etcd.prefix, pool.etcd.tls, pool.etcd.credentials ?? null]);
          let kv = kvs.get(ck);
          if (kv === undefined) kvs.set(ck, (kv = make(pool)));
          const id = JSON.stringify([pool.etcd.endpoints, pool.etcd.prefix, pool.name, node]);
          const prev = out.get(id);
          const eps = [...(prev?.runtimeEndpoints ?? []), ...(n.ipam?.runtimeEndpoint != null ? [n.ipam.runtimeEndpoint] : [])];
          out.set(id, { ...(prev ?? { kv, prefix: pool.etcd.prefix, pool: pool.name, node, id }), runtimeEndpoints: eps, networks: [...(prev?.networks ?? []), ...(n.name == null ? [] : [n.name])], fixedNodeName: prev?.fixedNodeName === true || pool.nodeName !== null });
        } catch (e) {
          errors.push(`${n.file}: ${e instanceof Error ? e.message : String(e)}`);
        }
      }
      return { targets: [...out.values()], errors };
    },
    async close() {
      closed = true;
      for (const kv of kvs.values()) await kv.close().catch(() => undefined);
      kvs.clear();
    },
  };
}

/** The loop as a daemon part, with a way to ask for a pass (tests, `SIGHUP`-like triggers). */
export interface ReconcileLoop extends DaemonPart {
  /** Ask for a pass as soon as possible; resolves with its report. */
  passNow(reason: string): Promise<PassReport>;
  /** The last pass's report, or null before the first. */
  readonly last: PassReport | null;
  /** The last pass's pool report (cluster pools), or null before the first with a pool. */
  readonly lastPool: PoolPassReport | null;
}

/** The pass options from the daemon's flags. */
export function passOptions(o: DaemonOptions): PassOptions {
  return {
    dataDir: o.dataDir,
    cniConfDir: o.cniConfDir,
    network: o.network,
    runtimeEndpoint: o.runtimeEndpoint,
    graceSeconds: o.graceSeconds,
    policy: o.policy,
    auditLog: o.auditLog,
    lockTimeoutSeconds: PASS_LOCK_TIMEOUT_SECONDS,
  };
}

/** Is any range set of `rangeSets` fully reserved by the IP-named files of `dir`? (names only) */
export function anyRangeSetFull(dir: string, rangeSets: readonly RangeSet[]): boolean {
  if (rangeSets.length === 0) return false;
  let names: string[];
  try {
    names = readdirSync(dir);
  } catch {
    return false;
  }
  const used = rangeSets.map(() => 0n);
  for (const name of names) {
    const ip = parseIP(name);
    if (ip === null) continue;
    for (let i = 0; i < rangeSets.length; i++) {
      if (rangeFor(rangeSets[i] as RangeSet, ip) >= 0) {
        used[i] = (used[i] as bigint) + 1n;
        break;
      }
    }
  }
  return rangeSets.some((rs, i) => (used[i] as bigint) >= rangeSetSize(rs));
}

/**
 * The loop part: starts the first pass at once, then one per interval; watches the networks.
 * `close()` stops the timers and watchers and waits for a pass in progress to end.
 */
export function reconcileLoopPart(deps: LoopDeps, onStart?: (loop: ReconcileLoop) => void): DaemonPartFactory {
  return ({ options, log }) => {
    const loop = new Loop(options, deps, log);
    onStart?.(loop);
    loop.start();
    return loop;
  };
}

class Loop implements ReconcileLoop {
  readonly name = 'loop';
  /** A reclaim on exhaustion inside an ADD the daemon served heals too (ipwarden_heal_seconds). */
  readonly hooks: PluginServerHooks = { onReclaim: (e) => this.healedByAdd(e) };
  last: PassReport | null = null;
  lastPool: PoolPassReport | null = null;
  /** The host history's last problem (logged when it changes). */
  private hostHistoryProblem: string | null = null;
  private readonly opts: PassOptions;
  private readonly confirmations: Confirmations;
  /** The pool pass's own memory across passes (D1–D3 over handles; not the node-local one's). */
  private readonly poolConfirmations: Confirmations;
  private timer: NodeJS.Timeout | null = null;
  private settle: NodeJS.Timeout | null = null;
  private running: Promise<PassReport> | null = null;
  private again: { reason: string; waiters: Array<(r: PassReport) => void> } | null = null;
  private readonly watchers = new Map<string, FSWatcher>();
  private readonly dirty = new Map<string, readonly RangeSet[]>();
  private lastTriggerMs = -Infinity;
  /** Network dir → monotonic ms it was first seen with a full range set (ipwarden_heal_seconds). */
  private readonly fullSince = new Map<string, number>();
  /** Delay of the confirming pass the last pass asked for (a full range set's waiting leaks), ms. */
  private confirmDueInMs: number | null = null;
  private closed = false;
  private readonly daemonOptions: DaemonOptions;
  private readonly deps: LoopDeps;
  private readonly log: Logger;

  constructor(daemonOptions: DaemonOptions, deps: LoopDeps, log: Logger) {
    this.daemonOptions = daemonOptions;
    this.deps = deps;
    this.log = log.child({ part: 'loop' });
    this.opts = passOptions(daemonOptions);
    this.confirmations = new Confirmations(daemonOptions.graceSeconds, deps.releaseCap ?? DEFAULT_RELEASE_CAP);
    this.poolConfirmations = new Confirmations(daemonOptions.graceSeconds, deps.releaseCap ?? DEFAULT_RELEASE_CAP);
  }

  start(): void {
    void this.passNow('start');
  }

  passNow(reason: string): Promise<PassReport> {
    if (this.running !== null) {
      // One more pass right after the current one (coalesced).
      return new Promise((resolve) => {
        this.again ??= { reason, waiters: [] };
        this.again.waiters.push(resolve);
      });
    }
    if (this.timer !== null) clearTimeout(this.timer);
    this.timer = null;
    const p = this.pass(reason);
    this.running = p;
    void p.finally(() => {
      this.running = null;
      if (this.closed) return;
      const next = this.again;
      this.again = null;
      if (next !== null) {
        void this.passNow(next.reason).then((r) => next.waiters.forEach((w) => w(r)));
        return;
      }
      this.schedule();
    });
    return p;
  }

  private schedule(): void {
    if (this.closed) return;
    const delayMs = jitteredDelay(this.daemonOptions.intervalSeconds, this.deps.random ?? Math.random) * 1000;
    // Heal on arrival (issue 19): a full range set whose leaks wait for their second observation
    // gets that pass when they become confirmable, not an interval later. A few ms past the due
    // time, so the monotonic difference is surely reached.
    const due = this.confirmDueInMs;
    const confirming = due !== null && due + CONFIRM_SLACK_MS < delayMs;
    const ms = confirming ? Math.max(0, due) + CONFIRM_SLACK_MS : delayMs;
    this.timer = setTimeout(() => void this.passNow(confirming ? 'confirm (range set full)' : 'interval'), Math.min(ms, 2 ** 31 - 1));
    this.timer.unref();
  }

  private monotonicMs(): number {
    return (this.deps.monotonic ?? (() => performance.now()))();
  }

  /** Note a network dir seen with a full range set (the first time starts its heal clock). */
  private markFull(dir: string): void {
    if (!this.fullSince.has(dir)) this.fullSince.set(dir, this.monotonicMs());
  }

  /**
   * ipwarden_heal_seconds: a release in a network seen full ends its clock (observed); a network
   * no longer full without a release of ours (a pod's DEL) ends it unobserved.
   */
  private recordHeals(report: PassReport): void {
    const now = this.monotonicMs();
    const releasedIn = new Set(report.released.map((r) => join(r.dataDir, r.network)));
    for (const dir of report.fullNetworks) this.markFull(dir);
    for (const [dir, since] of [...this.fullSince]) {
      if (releasedIn.has(dir)) {
        this.deps.metrics.recordHeal((now - since) / 1000);
        this.log.info({ network: dir, healSeconds: (now - since) / 1000 }, 'range set healed');
        this.fullSince.delete(dir);
      } else if (!report.fullNetworks.includes(dir)) {
        this.fullSince.delete(dir);
      }
    }
  }

  /**
   * ipwarden_heal_seconds for a reclaim on exhaustion inside an ADD the daemon served (the
   * plugin's reclaim, src/reconcile/reclaim.ts): its releases end the network's clock like a
   * pass's. A network no pass or inotify count saw full was first seen full by that ADD: the heal
   * took the reclaim's own time. A reclaim for a requested address leaves the range set as full
   * as it was: not a heal.
   */
  private healedByAdd(e: ReclaimEvent): void {
    if (e.trigger !== 'exhaustion' || e.released.length === 0) return;
    const dir = join(e.dataDir, e.network);
    const since = this.fullSince.get(dir);
    const healSeconds = since === undefined ? e.durationSeconds : (this.monotonicMs() - since) / 1000;
    this.fullSince.delete(dir);
    this.deps.metrics.recordHeal(healSeconds);
    this.log.info({ network: dir, healSeconds, containerId: e.containerId }, 'range set healed');
  }

  private async pass(reason: string): Promise<PassReport> {
    let report: PassReport;
    let pools: PoolPrelude | null = null;
    let snap: Snapshot;
    try {
      // One runtime snapshot per pass, shared by the node-local and pool plans; the pools' R is
      // read before it (a handle created after R did not exist when the runtime was asked).
      pools = await this.poolPrelude(reason);
      snap = await takeSnapshot({ ...(this.opts.runtimeEndpoint === null ? {} : { runtimeEndpoint: this.opts.runtimeEndpoint }), podIPs: true, warnOtherRuntimes: false }, this.deps.reconcile);
      report = await runPass(this.opts, this.confirmations, this.deps.reconcile, this.deps.monotonic, snap);
    } catch (e) {
      // runPass reports failures in its result; a throw is a bug or a usage problem: count it,
      // log it, keep the loop alive.
      const message = e instanceof Error ? e.message : String(e);
      this.deps.metrics.recordReconcileError('pass');
      this.log.error({ reason, error: message }, 'reconcile pass failed');
      report = {
        startedAtMs: this.deps.reconcile.now(),
        durationSeconds: 0,
        runtime: { endpoint: null, sandboxes: null, error: message },
        evidenceIncomplete: null,
        rangeSets: [],
        candidates: new Map(),
        released: [],
        held: null,
        waiting: 0,
        deferred: 0,
        errors: [{ kind: 'pass', message }],
        networks: 0,
        fullNetworks: [],
        confirmDueInMs: null,
      };
      this.last = report;
      return report;
    }
    this.last = report;
    this.confirmDueInMs = report.confirmDueInMs;
    this.recordHeals(report);
    this.deps.metrics.recordPass({
      rangeSets: report.rangeSets.map((r) => ({
        network: r.network,
        rangeSet: r.rangeSet,
        capacity: r.capacity,
        counts: { live: r.live, grace: r.grace, leaked: r.leaked, corrupt: r.corrupt, unknown: r.unknown, free: r.free },
      })),
      candidates: report.candidates,
      released: report.released.map((r) => ({ network: r.network, reason: r.reason })),
      errors: report.errors,
      durationSeconds: report.durationSeconds,
      endedAtSeconds: Math.floor(this.deps.reconcile.now() / 1000),
    });
    for (const r of report.released) {
      this.log.info({ network: r.network, dataDir: r.dataDir, ip: r.ip, containerId: r.containerId, ifname: r.ifname, ageSeconds: r.ageSeconds, reason: r.reason }, 'released');
    }
    if (report.held !== null) this.log.warn({ held: report.held, fix: heldFix(this.opts.runtimeEndpoint ?? null, false) }, 'releases held');
    for (const e of report.errors) this.log.warn({ kind: e.kind, network: e.network, error: e.message }, 'reconcile error');
    const candidates = [...report.candidates.values()].reduce((a, b) => a + b, 0);
    this.log.info(
      { reason, networks: report.networks, released: report.released.length, candidates, waiting: report.waiting, deferred: report.deferred, errors: report.errors.length, durationSeconds: report.durationSeconds, sandboxes: report.runtime.sandboxes },
      'reconcile pass',
    );
    this.rewatch(report);
    if (pools !== null) await this.poolPass(reason, pools, snap);
    return report;
  }

  /**
   * The pools' part of a pass read before its one runtime snapshot: the targets and etcd's
   * revision `R` of each. Null when there is no pool to reconcile. Never throws: a failure is
   * logged and counted as the pool pass's.
   */
  private async poolPrelude(reason: string): Promise<PoolPrelude | null> {
    const src = this.deps.pools;
    if (src === undefined || this.closed) return null;
    try {
      const { targets, errors } = src.targets();
      for (const e of errors) this.log.warn({ kind: 'config', error: e }, 'pool reconcile: network not used');
      if (targets.length === 0) return null;
      const revisionErrors: PoolPassError[] = [];
      return { targets, revisions: await poolRevisions(targets, revisionErrors), errors: revisionErrors };
    } catch (e) {
      this.deps.metrics.recordReconcileError('pool');
      this.log.error({ reason, error: e instanceof Error ? e.message : String(e) }, 'pool reconcile pass failed');
      return null;
    }
  }

  /**
   * The cluster pools' step of the pass (docs/cluster.md "Reconcile per node"): after the
   * node-local networks, on the pass's runtime snapshot `snap` with the targets and revisions
   * read before it ({@link poolPrelude}). Never throws.
   */
  private async poolPass(reason: string, pools: PoolPrelude, snap: Snapshot): Promise<void> {
    if (this.closed) return;
    try {
      const { targets } = pools;
      const auditPath = this.opts.auditLog;
      const audit = (): AuditSink => {
        if (auditPath !== null) return openAuditLog(auditPath);
        // A node with only pool networks may have no data dir yet: make it for the default log.
        makeDirs(this.opts.dataDir, 0o755);
        return openDefaultAuditLog(this.opts.dataDir);
      };
      // This machine's earlier host names (a renamed host: its handles written under them stay its own).
      makeDirs(this.opts.dataDir, 0o755);
      const history = (this.deps.hostHistory ?? recordHost)(this.opts.dataDir);
      if (history.problem !== null && history.problem !== this.hostHistoryProblem) this.log.warn({ error: history.problem }, 'host history not used');
      this.hostHistoryProblem = history.problem;
      const r = await runPoolPass(targets, { runtimeEndpoint: this.opts.runtimeEndpoint, audit, earlierHosts: history.earlier }, this.poolConfirmations, this.deps.reconcile, this.deps.monotonic, { revisions: pools.revisions, errors: pools.errors, snap });
      this.lastPool = r;
      this.deps.metrics.recordPoolPass({ released: r.released.map((x) => ({ pool: x.pool })), errors: r.errors, reReserved: r.reReserved, wants: [...r.wants, ...r.reReserved.filter((x) => x.wanted).map((x) => ({ pool: x.pool, event: 'fulfilled' as const }))] });
      for (const x of r.reReserved) {
        this.log.warn({ pool: x.pool, node: x.node, network: x.network, sandbox: x.sandbox, ip: x.ip, block: x.block, claimed: x.claimed, wanted: x.wanted, revision: x.revision }, 'pool re-reserved');
      }
      for (const x of r.wants) {
        this.log.warn({ pool: x.pool, node: x.node, sandbox: x.sandbox, ip: x.ip, block: x.block }, x.event === 'written' ? 'pool wanted' : 'pool want dropped');
      }
      for (const x of r.released) {
        this.log.info({ pool: x.pool, node: x.node, network: x.network, containerId: x.containerId, ifname: x.ifname, ips: x.ips, modRevision: x.modRevision, createRevision: x.createRevision }, 'pool released');
      }
      if (r.held !== null) this.log.warn({ held: r.held, fix: heldFix(this.opts.runtimeEndpoint ?? null, true) }, 'pool releases held');
      for (const e of r.errors) this.log.warn({ kind: e.kind, pool: e.pool, error: e.message }, 'pool reconcile error');
      const candidates = [...r.candidates.values()].reduce((a, b) => a + b, 0);
      this.log.info({ reason, pools: r.pools, released: r.released.length, candidates, waiting: r.waiting, deferred: r.deferred, errors: r.errors.length }, 'pool reconcile pass');
    } catch (e) {
      this.deps.metrics.recordReconcileError('pool');
      this.log.error({ reason, error: e instanceof Error ? e.message : String(e) }, 'pool reconcile pass failed');
    }
  }

  /** Watch the data dirs and every network dir of the last pass; drop watchers of vanished ones. */
  private rewatch(report: PassReport): void {
    if (this.closed) return;
    const want = new Map<string, readonly RangeSet[]>();
    let configured: Map<string, readonly RangeSet[]> = new Map();
    try {
      const layout = layoutNetworks({ cniConfDir: this.opts.cniConfDir });
      configured = new Map(layout.networks.filter((n) => n.config?.ipam != null).map((n) => [n.dir, n.config?.ipam?.rangeSets ?? []]));
    } catch {
      // The pass already reported the configuration error.
    }
    for (const r of report.rangeSets) {
      const dir = join(r.dataDir, r.network);
      want.set(dir, configured.get(dir) ?? []);
    }
    const dataDirs = new Set([this.opts.dataDir, ...report.rangeSets.map((r) => r.dataDir)]);
    for (const d of dataDirs) want.set(d, []);
    for (const [dir, w] of this.watchers) {
      if (!want.has(dir)) {
        w.close();
        this.watchers.delete(dir);
      }
    }
    for (const [dir, rangeSets] of want) {
      if (this.watchers.has(dir)) continue;
      try {
        const w = watch(dir, { persistent: false }, () => this.onEvent(dir, rangeSets));
        w.on('error', () => {
          w.close();
          this.watchers.delete(dir);
        });
        this.watchers.set(dir, w);
      } catch {
        // Not there (yet): the next pass tries again.
      }
    }
  }

  private onEvent(dir: string, rangeSets: readonly RangeSet[]): void {
    // A data directory's event (no range sets): a new network is picked up by the next pass.
    if (this.closed || rangeSets.length === 0) return;
    this.dirty.set(dir, rangeSets);
    if (this.settle === null) this.armSettle(EVENT_SETTLE_MS);
  }

  /** Count the changed network directories after `ms`; trigger a pass when a range set is full. */
  private armSettle(ms: number): void {
    this.settle = setTimeout(() => {
      this.settle = null;
      if (this.closed) return;
      const now = Date.now();
      if (now - this.lastTriggerMs < MIN_TRIGGER_GAP_MS) {
        // Too soon after the last triggered pass: look again when the gap has passed.
        this.armSettle(MIN_TRIGGER_GAP_MS - (now - this.lastTriggerMs));
        return;
      }
      const full = [...this.dirty].filter(([d, rs]) => anyRangeSetFull(d, rs)).map(([d]) => d);
      this.dirty.clear();
      if (full.length === 0) return;
      for (const d of full) this.markFull(d);
      this.lastTriggerMs = now;
      this.log.info({ networks: full }, 'range set full: reconciling now');
      void this.passNow('range set full');
    }, ms);
    this.settle.unref();
  }

  async close(): Promise<void> {
    if (this.closed) {
      await this.running;
      return;
    }
    this.closed = true;
    if (this.timer !== null) clearTimeout(this.timer);
    if (this.settle !== null) clearTimeout(this.settle);
    for (const w of this.watchers.values()) w.close();
    this.watchers.clear();
    // Wait for a pass in progress, but not forever: a runtime that never answers must not keep a
    // stopping daemon alive. What it abandons is safe to abandon (each release's intent is audited
    // before its file is removed, under the network's lock).
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([
      this.running?.catch(() => undefined),
      new Promise<void>((resolve) => {
        timer = setTimeout(() => {
          this.log.warn({ waitedSeconds: CLOSE_WAIT_SECONDS }, 'stopping without waiting longer for the reconcile pass in progress');
          resolve();
        }, CLOSE_WAIT_SECONDS * 1000);
      }),
    ]);
    clearTimeout(timer);
    await this.deps.pools?.close();
  }
}
