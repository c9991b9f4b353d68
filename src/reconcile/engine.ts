/**
 * The reconcile engine behind `leaks`, `gc`, `status`, `doctor` and the daemon's loop, in three
 * phases that take parsed options and injected I/O ({@link ReconcileDeps}):
 *
 * 1. {@link takeSnapshot} (`snapshot.ts`): the runtime asked once (sandboxes in any state, the
 *    READY ones' pod IPs), then the kernel evidence; one snapshot serves every data directory;
 * 2. {@link planNetworks} / {@link planNetwork}: read one data directory's networks, each under
 *    its lock, plan (pure, `plan.ts`) and check the live sandboxes' addresses against the
 *    reservations (pure, `unreserved.ts`, BR-13), withholding releases a live sandbox needs;
 * 3. {@link applyNetworkPlan}: restamp files stamped in the future, release under each lock with
 *    re-checks and an audit record written first (`apply.ts`), then re-reserve unreserved live
 *    addresses.
 *
 * {@link reconcile} composes them for one `leaks`/`gc` run; {@link toJson} is its documented
 * JSON document (docs/cli.md). Order of work (ARCHITECTURE.md "Reconciler safety rules"): the
 * snapshot first, THEN the locks.
 */
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { AppError } from '../common/errors.ts';
import { openFileStore } from '../store/file/file-store.ts';
import { readCniConfigs } from '../node/cni-conf.ts';
import { readKernelEvidence } from '../node/kernel-evidence.ts';
import { applyPlan, reReserve, restampFuture, type ApplyResult, type SkippedRelease } from './apply.ts';
import { openAuditLog, openDefaultAuditLog, type AuditSink } from './audit.ts';
import type { UseEvidence } from './evidence.ts';
import { discoverNetworks, namedNetwork, readReservations, type NetworkDir, type StoreOpener } from './networks.ts';
import { describeError as describe, type ReconcileDeps, type ReconcileOptions } from './options.ts';
import { compareIPText, plan, type AnyVerdict, type Plan, type PlanEntry, type Policy, type Verdict } from './plan.ts';
import { takeSnapshot, type RuntimeJson, type Snapshot } from './snapshot.ts';
import { checkPodIPs, withheldKey, type NetworkRanges, type PodIPAction, type PodIPFinding } from './unreserved.ts';

export { takeSnapshot, type RuntimeJson, type Snapshot, type SnapshotOptions } from './snapshot.ts';

/**
 * `kernel` of the JSON reports: whether the kernel evidence (addresses configured in the node's
 * network namespaces, CNI operations in flight) was read completely. When it was not, nothing is
 * released (verdict `unknown`) and `incomplete` says why.
 */
export interface KernelJson {
  complete: boolean;
  /** Why not complete (not root, no host PID namespace, …), or null. */
  incomplete: string | null;
  /** Distinct addresses seen configured. */
  addresses: number;
}

/** The `kernel` JSON of some evidence. */
export function kernelJson(evidence: UseEvidence): KernelJson {
  return { complete: evidence.incomplete === null, incomplete: evidence.incomplete, addresses: evidence.addresses.size };
}

/** One reservation of the JSON report. */
export interface ReservationJson {
  ip: string;
  containerId: string | null;
  ifname: string | null;
  ageSeconds: number;
  verdict: AnyVerdict;
  reason: string;
}

/** One released reservation of the JSON report. */
export interface ReleasedJson {
  network: string;
  ip: string;
  containerId: string | null;
  ifname: string | null;
  verdict: AnyVerdict;
  reason: string;
}

/** One address of a live sandbox not reserved for it (BR-13), in the JSON report. */
export interface UnreservedJson {
  sandbox: string;
  ip: string;
  network: string | null;
  action: PodIPAction;
  reservedFor: string | null;
  message: string;
}

/** The `--json` document of `leaks` and `gc` (docs/cli.md). */
export interface ReportJson {
  runtime: RuntimeJson;
  kernel: KernelJson;
  networks: Array<{ name: string; dir: string; reservations: ReservationJson[] }>;
  released: ReleasedJson[];
  /** Present only when the pod IPs of the live sandboxes were checked (see {@link PodIPRun}). */
  unreserved?: UnreservedJson[];
}

/** The check of live sandboxes' addresses (BR-13) in a run. */
export interface PodIPRun {
  /** READY sandboxes whose pod IPs were asked. */
  readonly readySandboxes: number;
  /** After gc's re-reservations (their `action` updated); sorted by IP, then sandbox. */
  readonly findings: readonly PodIPFinding[];
}

/** Optional parts of a run, chosen by the caller rather than by flags. */
export interface ReconcileFeatures {
  /**
   * Ask the runtime for the pod IPs of READY sandboxes and check them against the reservations
   * (BR-13; gc re-reserves). Default false. The `leaks` and `gc` commands turn it on. Skipped
   * when the sandbox source has no `podIPs`.
   */
  readonly podIPs?: boolean;
}

/** What a run found and did, before formatting. `V` as in {@link Plan}. */
export interface ReconcileRun<V extends AnyVerdict = AnyVerdict> {
  readonly runtime: RuntimeJson;
  /** The kernel evidence the plan was made with. */
  readonly evidence: UseEvidence;
  readonly networks: readonly NetworkDir[];
  /**
   * The plan; `release` excludes the reservations withheld because a live sandbox uses their
   * address (those are in `withheld`, and in `keep`).
   */
  readonly plan: Plan<V>;
  /** null for `leaks` and `gc --dry-run`. */
  readonly applied: ApplyResult | null;
  /** null when the pod IPs were not checked (feature off, source without `podIPs`, runtime not reachable). */
  readonly podIPs: PodIPRun | null;
  /** Planned releases not done because the address is a live sandbox's (a conflict). */
  readonly withheld: readonly SkippedRelease[];
  /** Diagnostics for stderr (one line each, without the `ipwarden: ` prefix). */
  readonly warnings: readonly string[];
  /**
   * Problems that make the exit status 1 although the run completed (a failed PodSandboxStatus,
   * releases withheld for lack of evidence); also printed on stderr.
   */
  readonly failures: readonly string[];
}

/** Options of phase 2 ({@link planNetworks}). */
export interface PlanOptions {
  /** Grace period, seconds (≥ 0). */
  readonly graceSeconds: number;
  /** Default `conservative`. */
  readonly policy?: Policy;
  /**
   * CNI configuration directory, read (only when a live sandbox's address has no reservation)
   * for the networks' ranges, to tell which network the address belongs to.
   */
  readonly cniConfDir: string;
  /**
   * Every network name of the data directory, for placing a live sandbox's address (BR-13).
   * Default: `networks` when they are all of them, else {@link discoverNetworks}, read when needed.
   */
  readonly allNetworks?: () => readonly string[];
  /** Seconds to wait for each network's lock (default `DEFAULT_LOCK_TIMEOUT_SECONDS`, 30). */
  readonly lockTimeoutSeconds?: number;
}

/**
 * Phase 2's result for one data directory: the plan (releases a live sandbox needs withheld) and
 * what apply needs. `V` as in {@link Plan}.
 */
export interface NetworkPlan<V extends AnyVerdict = AnyVerdict> {
  readonly dataDir: string;
  /** The networks read, in the order given. */
  readonly networks: readonly NetworkDir[];
  /** The snapshot the plan was made with. */
  readonly snapshot: Snapshot;
  /** `release` excludes the {@link withheld} entries (they are in `keep`). */
  readonly plan: Plan<V>;
  /** Live sandboxes' addresses not reserved for them; null when the snapshot has no pod IPs. */
  readonly findings: readonly PodIPFinding[] | null;
  readonly withheld: readonly SkippedRelease[];
  /** The snapshot's warnings plus this phase's (one line each). */
  readonly warnings: readonly string[];
  /** The snapshot's pod IP failures (exit status 1 in the CLI). */
  readonly failures: readonly string[];
}

/** The store opener of one data directory, from `deps.openStore` or the file store. */
export function storeOpener(dataDir: string, deps: Pick<ReconcileDeps, 'openStore'>): StoreOpener {
  const open = deps.openStore;
  return open === undefined ? (network) => openFileStore({ dataDir, network }) : (network) => open(dataDir, network);
}

/**
 * The configured range sets per network name from the CNI configuration directory (host-local
 * compatible IPAM sections that parse; the first file naming a network wins, as in `status`).
 * A directory that cannot be listed gives none and a warning.
 */
function configuredRanges(dir: string, warnings: string[]): NetworkRanges[] {
  let configs;
  try {
    configs = readCniConfigs(dir);
  } catch (e) {
    warnings.push(`cannot read the CNI configuration directory ${dir}: ${describe(e)}; addresses are placed by network directory only`);
    return [];
  }
  const out: NetworkRanges[] = [];
  const seen = new Set<string>();
  for (const c of configs) {
    if (c.name === null || c.ipam === null || seen.has(c.name)) continue;
    seen.add(c.name);
    out.push({ network: c.name, rangeSets: c.ipam.rangeSets });
  }
  return out;
}

/**
 * Phase 2 for networks of one data directory: read each network's reservations under its lock
 * (one after the other), classify them all against `snapshot` ({@link plan}), and — when the
 * snapshot has pod IPs — check the live sandboxes' addresses (BR-13): a planned release at an
 * address a live sandbox uses is withheld (a conflict); with a READY sandbox's pod IPs unknown
 * and the kernel evidence incomplete, every release is withheld.
 * Throws the store's `AppError`s when a network cannot be read (`STORE_LOCK_TIMEOUT`,
 * `STORE_IO`), and `RangeError` for a negative grace (programming error: parse it first).
 */
export async function planNetworks(
  dataDir: string,
  networks: readonly NetworkDir[],
  snapshot: Snapshot,
  opts: PlanOptions & { readonly policy?: 'conservative' },
  deps?: Pick<ReconcileDeps, 'openStore'>,
): Promise<NetworkPlan<Verdict>>;
export async function planNetworks(
  dataDir: string,
  networks: readonly NetworkDir[],
  snapshot: Snapshot,
  opts: PlanOptions,
  deps?: Pick<ReconcileDeps, 'openStore'>,
): Promise<NetworkPlan>;
export async function planNetworks(
  dataDir: string,
  networks: readonly NetworkDir[],
  snapshot: Snapshot,
  opts: PlanOptions,
  deps: Pick<ReconcileDeps, 'openStore'> = {},
): Promise<NetworkPlan> {
  const reservations = await readReservations(networks, storeOpener(dataDir, deps), opts.lockTimeoutSeconds);
  const { sandboxes, snapshotAtMs, evidence } = snapshot;
  const full = plan({ reservations, sandboxes, snapshotAtMs, graceSeconds: opts.graceSeconds, policy: opts.policy ?? 'conservative', evidence });
  const warnings = [...snapshot.warnings];
  const failures = [...snapshot.podIPFailures];
  if (evidence.incomplete !== null) warnings.push(`kernel evidence incomplete (${evidence.incomplete}): nothing is released`);

  // BR-13: the addresses of live sandboxes against the reservations (pure, after the reads).
  let p: Plan<AnyVerdict> = full;
  let findings: PodIPFinding[] | null = null;
  const withheld: SkippedRelease[] = [];
  if (snapshot.podIPs !== null) {
    const check = checkPodIPs({
      podIPs: snapshot.podIPs,
      entries: full.entries,
      scanned: networks.map((n) => n.name),
      allNetworks: (opts.allNetworks ?? (() => discoverNetworks(dataDir).map((n) => n.name)))(),
      configured: () => configuredRanges(opts.cniConfDir, warnings),
    });
    findings = check.findings;
    if (check.withheld.size > 0) {
      const release: PlanEntry<AnyVerdict>[] = [];
      const keep = [...full.keep];
      for (const e of full.release) {
        if (!check.withheld.has(withheldKey(e.network, e.ip))) {
          release.push(e);
          continue;
        }
        keep.push(e);
        const user = check.findings.find((f) => f.action === 'conflict' && f.network === e.network && f.ip === e.ip);
        withheld.push({ entry: e, why: `address in use by live sandbox ${user?.sandbox ?? '?'} (conflict)` });
      }
      p = { ...full, release, keep };
    }
  }
  // A ready sandbox whose addresses are unknown: only complete kernel evidence covers them.
  if (snapshot.podIPFailures.length > 0 && evidence.incomplete !== null && p.release.length > 0) {
    for (const e of p.release) withheld.push({ entry: e, why: 'the pod IPs of a ready sandbox could not be read and the kernel evidence is incomplete' });
    p = { ...p, release: [], keep: [...p.keep, ...p.release] };
  }
  return { dataDir, networks, snapshot, plan: p, findings, withheld, warnings, failures };
}

/**
 * Phase 2 for one network: {@link planNetworks} over `<dataDir>/<network>`. Throws `UsageError`
 * for an invalid network name, `AppError('IPAM_NOT_FOUND')` when its directory does not exist,
 * and what {@link planNetworks} throws.
 */
export async function planNetwork(
  dataDir: string,
  network: string,
  snapshot: Snapshot,
  opts: PlanOptions & { readonly policy?: 'conservative' },
  deps?: Pick<ReconcileDeps, 'openStore'>,
): Promise<NetworkPlan<Verdict>>;
export async function planNetwork(
  dataDir: string,
  network: string,
  snapshot: Snapshot,
  opts: PlanOptions,
  deps?: Pick<ReconcileDeps, 'openStore'>,
): Promise<NetworkPlan>;
export async function planNetwork(
  dataDir: string,
  network: string,
  snapshot: Snapshot,
  opts: PlanOptions,
  deps: Pick<ReconcileDeps, 'openStore'> = {},
): Promise<NetworkPlan> {
  return planNetworks(dataDir, [namedNetwork(dataDir, network)], snapshot, opts, deps);
}

/** Options of phase 3 ({@link applyNetworkPlan}). */
export interface ApplyPhaseOptions {
  /** Audit log path (default `<dataDir>/.ipwarden-audit.log`), opened only when something is to change. */
  readonly auditLog?: string;
  /** Seconds to wait for each network's lock (default 30). */
  readonly lockTimeoutSeconds?: number;
  /** An audit sink to use instead of opening `auditLog` (the daemon's, tests'); not closed here. */
  readonly audit?: AuditSink;
}

/** What phase 3 did. */
export interface AppliedNetworkPlan {
  readonly applied: ApplyResult;
  /** The plan's findings with the re-reserved ones' `action` updated; null as in {@link NetworkPlan}. */
  readonly findings: readonly PodIPFinding[] | null;
}

/**
 * Phase 3: restamp the files stamped in the future (their grace period runs from now, docs/
 * reconciler.md "Time"); when something is to release or re-reserve, open the audit log and
 * release `np.plan.release` under each network's lock with re-checks (re-reading the kernel
 * evidence with `deps.evidence`), then re-reserve the live addresses found unreserved in a known
 * network (stopped when the audit log broke). Failures per network or IP are in
 * `applied.errors`, never thrown; throws `AppError('STORE_IO')` when the audit log cannot be
 * opened (then nothing is released or re-reserved).
 */
export async function applyNetworkPlan(np: NetworkPlan, opts: ApplyPhaseOptions, deps: ReconcileDeps): Promise<AppliedNetworkPlan> {
  const openStore = storeOpener(np.dataDir, deps);
  // Read again under each lock, with the reader the snapshot used.
  const readEvidence = deps.evidence ?? (() => readKernelEvidence());
  const p = np.plan;
  let findings = np.findings;
  const lockTimeout = opts.lockTimeoutSeconds === undefined ? {} : { lockTimeoutSeconds: opts.lockTimeoutSeconds };
  const toReserve = (findings ?? []).some((f) => f.action === 'reported' && f.network !== null);
  const restampErrors = (await restampFuture(p, { openStore, ...lockTimeout })).map((e) => ({ ...e }));
  if (p.release.length === 0 && !toReserve) return { applied: { released: [], skipped: [], errors: restampErrors }, findings };
  const audit: AuditSink = opts.audit ?? (opts.auditLog === undefined ? openDefaultAuditLog(np.dataDir) : openAuditLog(opts.auditLog));
  const applyOpts = { openStore, audit, now: () => deps.now(), evidence: readEvidence, ...lockTimeout };
  try {
    const a0 = await applyPlan(p, applyOpts);
    const a = restampErrors.length === 0 ? a0 : { ...a0, errors: [...restampErrors, ...a0.errors] };
    // An audit log that broke while releasing stops everything (every change is recorded).
    if (toReserve && a.auditBroken !== true && findings !== null) {
      const r = await reReserve(findings, applyOpts);
      findings = r.findings;
      return { applied: { released: a.released, skipped: a.skipped, errors: [...a.errors, ...r.errors] }, findings };
    }
    return { applied: a, findings };
  } finally {
    if (opts.audit === undefined) audit.close();
  }
}

/** Options of {@link reconcile}: the parsed flags and the data directories to read. */
export interface ReconcileRunOptions extends ReconcileOptions {
  /**
   * The data directories, in order (`reconcileScope` of `status.ts`: `--data-dir`, else those the
   * CNI configurations name); at least one.
   */
  readonly dataDirs: readonly string[];
}

/**
 * The networks of each data directory: all of them, or only `network` where its directory
 * exists. Adds a warning for each data directory that does not exist or holds no network (a
 * mistyped `--data-dir` must not look like a clean node). Throws `UsageError` for an invalid
 * network name and `AppError('IPAM_NOT_FOUND')` when no data directory has `network`.
 */
function networksOf(dataDirs: readonly string[], network: string | undefined, warnings: string[]): Array<{ dataDir: string; networks: NetworkDir[] }> {
  if (network !== undefined) {
    const found: Array<{ dataDir: string; networks: NetworkDir[] }> = [];
    let missing: unknown = null;
    for (const dataDir of dataDirs) {
      try {
        found.push({ dataDir, networks: [namedNetwork(dataDir, network)] });
      } catch (e) {
        if (!(e instanceof AppError) || e.code !== 'IPAM_NOT_FOUND') throw e;
        missing ??= e;
      }
    }
    if (found.length > 0) return found;
    if (dataDirs.length === 1) throw missing;
    throw new AppError('IPAM_NOT_FOUND', `no network directory ${dataDirs.map((d) => join(d, network)).join(', ')}`);
  }
  return dataDirs.map((dataDir) => {
    const networks = discoverNetworks(dataDir);
    if (networks.length === 0) {
      warnings.push(existsSync(dataDir) ? `data directory ${dataDir} holds no networks` : `data directory ${dataDir} does not exist: no reservations read there`);
    }
    return { dataDir, networks };
  });
}

/** One plan of several data directories' plans (same snapshot): entries sorted by network name, counts summed. */
function mergePlans(plans: readonly Plan<AnyVerdict>[]): Plan<AnyVerdict> {
  const first = plans[0] as Plan<AnyVerdict>;
  if (plans.length === 1) return first;
  const byName = (a: PlanEntry<AnyVerdict>, b: PlanEntry<AnyVerdict>): number => (a.network < b.network ? -1 : a.network > b.network ? 1 : 0);
  const counts = { ...first.counts };
  for (const p of plans.slice(1)) for (const k of Object.keys(counts) as Array<keyof typeof counts>) counts[k] += p.counts[k];
  return {
    ...first,
    entries: plans.flatMap((p) => p.entries).sort(byName),
    release: plans.flatMap((p) => p.release).sort(byName),
    keep: plans.flatMap((p) => p.keep).sort(byName),
    // Owning nothing in any data directory.
    orphans: first.orphans.filter((id) => plans.every((p) => p.orphans.includes(id))),
    counts,
  };
}

/**
 * One `leaks` (`mode: 'leaks'`) or `gc` run over `opts.dataDirs`: find the networks (all of them,
 * or `opts.network`) of each, {@link takeSnapshot} once, {@link planNetworks} per data directory,
 * and for `gc` without `dryRun` {@link applyNetworkPlan} per data directory (each its own audit log
 * unless `opts.auditLog`). Throws `UsageError` (invalid network name, malformed runtime endpoint),
 * `AppError('IPAM_NOT_FOUND')` (no data directory has the network), the store's `AppError`s when a
 * network cannot be read, and `AppError('STORE_IO')` when an audit log cannot be opened.
 * With policy `conservative` the plan holds no `notready` entry.
 */
export async function reconcile(
  mode: 'leaks' | 'gc',
  opts: ReconcileRunOptions & { readonly policy: 'conservative' },
  deps: ReconcileDeps,
  features?: ReconcileFeatures,
): Promise<ReconcileRun<Verdict>>;
export async function reconcile(mode: 'leaks' | 'gc', opts: ReconcileRunOptions, deps: ReconcileDeps, features?: ReconcileFeatures): Promise<ReconcileRun>;
export async function reconcile(
  mode: 'leaks' | 'gc',
  opts: ReconcileRunOptions,
  deps: ReconcileDeps,
  features: ReconcileFeatures = {},
): Promise<ReconcileRun> {
  const scopeWarnings: string[] = [];
  const dirs = networksOf(opts.dataDirs, opts.network, scopeWarnings);
  const snap = await takeSnapshot({ runtimeEndpoint: opts.runtimeEndpoint, podIPs: features.podIPs === true }, deps);
  const plans: NetworkPlan[] = [];
  for (const { dataDir, networks } of dirs) {
    plans.push(
      await planNetworks(dataDir, networks, snap, {
        graceSeconds: opts.graceSeconds,
        policy: opts.policy,
        cniConfDir: opts.cniConfDir,
        ...(opts.network === undefined ? { allNetworks: () => networks.map((n) => n.name) } : {}),
      }, deps),
    );
  }
  let applied: ApplyResult | null = null;
  let findings: PodIPFinding[] | null = plans.some((np) => np.findings !== null) ? plans.flatMap((np) => np.findings ?? []) : null;
  if (mode === 'gc' && opts.dryRun !== true) {
    const released: PlanEntry<AnyVerdict>[] = [];
    const skipped: SkippedRelease[] = [];
    const errors: ApplyResult['errors'] = [];
    const after: PodIPFinding[] = [];
    let auditBroken = false;
    for (const np of plans) {
      // An audit log that broke stops everything (every change is recorded).
      if (auditBroken) {
        after.push(...(np.findings ?? []));
        continue;
      }
      const a = await applyNetworkPlan(np, { ...(opts.auditLog === undefined ? {} : { auditLog: opts.auditLog }) }, deps);
      released.push(...a.applied.released);
      skipped.push(...a.applied.skipped);
      errors.push(...a.applied.errors);
      after.push(...(a.findings ?? []));
      auditBroken = a.applied.auditBroken === true;
    }
    applied = { released, skipped, errors, ...(auditBroken ? { auditBroken } : {}) };
    if (findings !== null) findings = after;
  }
  findings?.sort((a, b) => compareIPText(a.ip, b.ip) || (a.sandbox < b.sandbox ? -1 : a.sandbox > b.sandbox ? 1 : 0));
  const podIPs = snap.podIPs === null ? null : { readySandboxes: snap.podIPs.length, findings: findings ?? [] };
  const unique = (xs: readonly string[]): string[] => [...new Set(xs)];
  return {
    runtime: snap.runtime,
    evidence: snap.evidence,
    networks: plans.flatMap((np) => np.networks).sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0)),
    plan: mergePlans(plans.map((np) => np.plan)),
    applied,
    podIPs,
    withheld: plans.flatMap((np) => np.withheld),
    warnings: unique([...scopeWarnings, ...plans.flatMap((np) => np.warnings)]),
    failures: unique(plans.flatMap((np) => np.failures)),
  };
}

/** The `--json` document of a run (docs/cli.md). */
export function toJson(run: ReconcileRun): ReportJson {
  const byNetwork = new Map<string, ReservationJson[]>();
  for (const n of run.networks) byNetwork.set(n.dir, []);
  for (const e of run.plan.entries) {
    byNetwork.get(e.dir)?.push({
      ip: e.ip,
      containerId: e.containerId,
      ifname: e.ifname,
      ageSeconds: e.ageSeconds,
      verdict: e.verdict,
      reason: e.reason,
    });
  }
  const doc: ReportJson = {
    runtime: run.runtime,
    kernel: kernelJson(run.evidence),
    networks: run.networks.map((n) => ({ name: n.name, dir: n.dir, reservations: byNetwork.get(n.dir) ?? [] })),
    released: (run.applied?.released ?? []).map((e) => ({
      network: e.network,
      ip: e.ip,
      containerId: e.containerId,
      ifname: e.ifname,
      verdict: e.verdict,
      reason: e.reason,
    })),
  };
  if (run.podIPs !== null) {
    doc.unreserved = run.podIPs.findings.map((f) => ({
      sandbox: f.sandbox,
      ip: f.ip,
      network: f.network,
      action: f.action,
      reservedFor: f.reservedFor,
      message: f.message,
    }));
  }
  return doc;
}
