/**
 * `ipwarden leaks` — list every reservation under the data dir with its verdict (live, grace,
 * leaked, corrupt, notready), and the engine `ipwarden gc` shares (`src/cli/gc.ts`).
 *
 * Usage:
 *   ipwarden leaks [--data-dir DIR] [--network NAME] [--runtime-endpoint URL] [--grace DUR]
 *                  [--policy conservative|reclaim-notready] [--cni-conf-dir DIR] [--json]
 * Examples:
 *   ipwarden leaks
 *   ipwarden leaks --network cbr0 --grace 2m --json
 *   ipwarden leaks --policy reclaim-notready
 *
 * Order of work (ARCHITECTURE.md "Reconciler safety rules"): resolve the endpoint, note the
 * snapshot time, ask the runtime for its sandboxes (any state) and the pod IPs of the READY ones
 * (field report BR-13), THEN read each network's reservations under its lock, plan (pure), check
 * the live sandboxes' addresses against the reservations (pure), and for `gc` apply under the
 * lock with re-checks, then re-reserve unreserved live addresses.
 * Exit status: 0; 1 when the runtime could not be asked, a release failed, or (gc) an address of
 * a live sandbox is reserved for another container; 2 for usage errors.
 * docs/cli.md documents the JSON schema.
 */
import { AppError, UsageError } from '../common/errors.ts';
import { mapLimit } from '../common/concurrency.ts';
import { parseDuration } from '../common/duration.ts';
import { existsSync } from 'node:fs';
import { DEFAULT_RUNTIME_ENDPOINTS, resolveRuntimeEndpoint } from '../runtime/endpoint.ts';
import type { UseEvidence } from '../reconcile/evidence.ts';
import { readKernelEvidence } from '../node/kernel-evidence.ts';
import { readCniConfigs } from '../node/cni-conf.ts';
import { openFileStore } from '../store/file/file-store.ts';
import { applyPlan, reReserve, restampFuture, type ApplyResult, type SkippedRelease } from '../reconcile/apply.ts';
import { defaultAuditLogPath, openAuditLog, type AuditSink } from '../reconcile/audit.ts';
import { discoverNetworks, namedNetwork, readReservations, type NetworkDir } from '../reconcile/networks.ts';
import {
  plan,
  POLICIES,
  VERDICTS,
  type AnyVerdict,
  type Plan,
  type PlanEntry,
  type Policy,
  type SandboxIndex,
  type Verdict,
} from '../reconcile/plan.ts';
import { indexSandboxes, isSandboxNotFound, type SandboxSource, type SandboxSourceFactory } from '../reconcile/sandboxes.ts';
import { checkPodIPs, withheldKey, type NetworkRanges, type PodIPAction, type PodIPFinding, type SandboxPodIPs } from '../reconcile/unreserved.ts';
import type { CliContext } from './context.ts';
import { cell, formatAge, renderTable, shortId } from './format.ts';

/** Default `--data-dir` (host-local's `dataDir` default). */
export const DEFAULT_DATA_DIR = '/var/lib/cni/networks';
/** Default `--grace` (Go duration). */
export const DEFAULT_GRACE = '5m';
/** Default `--policy`. */
export const DEFAULT_POLICY: Policy = 'conservative';
/** Default `--cni-conf-dir` (where the networks' ranges come from, for re-reserving). */
export const DEFAULT_CNI_CONF_DIR = '/etc/cni/net.d';
/** PodSandboxStatus calls in flight at once (one per READY sandbox; 110 on a busy node). */
export const POD_IP_CONCURRENCY = 16;

/** Options of `leaks` and `gc` as commander parses them. */
export interface ReconcileCommandOptions {
  dataDir?: string;
  network?: string;
  runtimeEndpoint?: string;
  grace?: string;
  /** `conservative` (default) or `reclaim-notready` (field report BR-22). */
  policy?: string;
  /** CNI configuration directory, read for the networks' ranges only when a live address is unreserved. */
  cniConfDir?: string;
  json?: boolean;
  /** gc only. */
  dryRun?: boolean;
  /** gc only: audit log path (default `<dataDir>/ipwarden-audit.log`). */
  auditLog?: string;
}

/**
 * `kernel` of the JSON report: whether the kernel evidence (addresses configured in the node's
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

/** `runtime` of the JSON report. `error` is present only when the runtime could not be asked. */
export interface RuntimeJson {
  /** The resolved endpoint URL, or the configured value / null when it could not be resolved. */
  endpoint: string | null;
  /** Number of sandboxes listed (any state), or null when the runtime could not be asked. */
  sandboxes: number | null;
  error?: string;
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
   * (BR-13; gc re-reserves). Default false: `status` and `doctor` use the engine without it; the
   * `leaks` and `gc` commands turn it on. Skipped when the sandbox source has no `podIPs`.
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

/** The CRI-backed sandbox source (the CRI client is loaded only when no fake is injected). */
const criSandboxSource: SandboxSourceFactory = (endpoint) => {
  let real: SandboxSource | null = null;
  const load = async (): Promise<SandboxSource> => (real ??= (await import('../reconcile/cri-source.ts')).criSandboxSource(endpoint));
  return {
    endpoint,
    list: async () => (await load()).list(),
    podIPs: async (id) => {
      const src = await load();
      if (src.podIPs === undefined) throw new AppError('INTERNAL', 'the CRI sandbox source cannot tell pod IPs');
      return src.podIPs(id);
    },
    close: async () => {
      await real?.close?.();
    },
  };
};

/** `--grace` as seconds; UsageError for a malformed or negative Go duration. */
export function parseGrace(text: string): number {
  let s: number;
  try {
    s = parseDuration(text);
  } catch (e) {
    const why = e instanceof AppError && e.details !== undefined ? ` (${e.details})` : '';
    throw new UsageError(`--grace: invalid duration ${JSON.stringify(text)}${why}`);
  }
  if (s < 0) throw new UsageError(`--grace: must not be negative, got ${JSON.stringify(text)}`);
  return s;
}

/** `--policy`; UsageError for anything but `conservative` and `reclaim-notready`. */
export function parsePolicy(text: string): Policy {
  const p = POLICIES.find((x) => x === text);
  if (p === undefined) throw new UsageError(`--policy: must be ${POLICIES.join(' or ')}, got ${JSON.stringify(text)}`);
  return p;
}

function describe(e: unknown): string {
  if (e instanceof AppError) return e.details === undefined ? e.message : `${e.message} (${e.details})`;
  return e instanceof Error ? e.message : String(e);
}

/** The runtime snapshot: sandbox index and, when asked and possible, the READY sandboxes' pod IPs. */
interface Snapshot {
  runtime: RuntimeJson;
  sandboxes: SandboxIndex | null;
  snapshotAtMs: number;
  /** null when not checked. */
  podIPs: SandboxPodIPs[] | null;
  /** READY sandboxes whose pod IPs could not be read (their addresses are not known). */
  podIPFailures: string[];
  warnings: string[];
}


/**
 * The pod IPs of the READY sandboxes, {@link POD_IP_CONCURRENCY} PodSandboxStatus calls at a
 * time. A sandbox the runtime says is gone (NOT_FOUND) is skipped with a warning; any other
 * failure is recorded in `failures` (issue 7: never silently; the run exits 1, and without
 * complete kernel evidence nothing is released).
 */
async function readyPodIPs(
  podIPs: (id: string) => Promise<string[]>,
  ids: readonly string[],
  failures: string[],
  warnings: string[],
): Promise<SandboxPodIPs[]> {
  const got = await mapLimit(ids, POD_IP_CONCURRENCY, async (id): Promise<SandboxPodIPs | null> => {
    try {
      return { sandbox: id, ips: await podIPs(id) };
    } catch (e) {
      // Removed since the list: it uses no address any more.
      if (isSandboxNotFound(e)) warnings.push(`pod IPs of sandbox ${id} not checked: ${describe(e)}`);
      else failures.push(`pod IPs of ready sandbox ${id} could not be read: ${describe(e)}`);
      return null;
    }
  });
  return got.filter((x): x is SandboxPodIPs => x !== null);
}

/**
 * Take the runtime snapshot. Never throws for runtime problems: they become `runtime.error` and
 * a null index. A malformed `--runtime-endpoint` is a usage error (thrown).
 */
async function snapshot(opts: ReconcileCommandOptions, ctx: CliContext, withPodIPs: boolean): Promise<Snapshot> {
  let endpoint: string;
  // Taken from the crictl defaults rather than a flag or CONTAINER_RUNTIME_ENDPOINT: say when another default answers too.
  const guessed = (opts.runtimeEndpoint ?? '') === '' && (ctx.env['CONTAINER_RUNTIME_ENDPOINT'] ?? '') === '';
  try {
    endpoint = resolveRuntimeEndpoint(opts.runtimeEndpoint, ctx.env).url;
  } catch (e) {
    if (e instanceof AppError && e.code === 'USAGE') throw new UsageError(`--runtime-endpoint: ${e.message}`);
    return {
      runtime: { endpoint: opts.runtimeEndpoint ?? null, sandboxes: null, error: describe(e) },
      sandboxes: null,
      snapshotAtMs: ctx.now(),
      podIPs: null,
      podIPFailures: [],
      warnings: [],
    };
  }
  // The snapshot time is taken BEFORE the runtime is asked: a file written before this instant
  // by an ADD still in flight is protected by the grace period, measured from here.
  const snapshotAtMs = ctx.now();
  let source: SandboxSource | undefined;
  try {
    source = (ctx.sandboxSource ?? criSandboxSource)(endpoint);
    const list = await source.list();
    const warnings: string[] = [];
    const podIPFailures: string[] = [];
    let podIPs: SandboxPodIPs[] | null = null;
    const src = source;
    if (withPodIPs && src.podIPs !== undefined) {
      const ready = list.filter((s) => s.state === 'ready').map((s) => s.id);
      podIPs = await readyPodIPs((id) => (src.podIPs as (id: string) => Promise<string[]>).call(src, id), ready, podIPFailures, warnings);
    }
    if (guessed) warnings.push(...(await otherRuntimes(endpoint, ctx)));
    return { runtime: { endpoint: source.endpoint, sandboxes: list.length }, sandboxes: indexSandboxes(list), snapshotAtMs, podIPs, podIPFailures, warnings };
  } catch (e) {
    return { runtime: { endpoint, sandboxes: null, error: describe(e) }, sandboxes: null, snapshotAtMs, podIPs: null, podIPFailures: [], warnings: [] };
  } finally {
    try {
      await source?.close?.();
    } catch {
      // the list is already in hand
    }
  }
}

/**
 * Warnings for the other default sockets (crictl's list) that also answer as a CRI runtime, when
 * the endpoint was taken from the defaults: the operator must choose (issue 7, case 1: an idle
 * containerd beside CRI-O lists none of the pods).
 */
async function otherRuntimes(chosen: string, ctx: CliContext): Promise<string[]> {
  const exists = ctx.socketExists ?? existsSync;
  const out: string[] = [];
  for (const path of DEFAULT_RUNTIME_ENDPOINTS) {
    const url = `unix://${path}`;
    if (url === chosen || !exists(path)) continue;
    const src = (ctx.sandboxSource ?? criSandboxSource)(url);
    try {
      const n = (await src.list()).length;
      out.push(`more than one CRI runtime answers: ${chosen} (asked) and ${url} (${n} sandbox${n === 1 ? '' : 'es'}); pass --runtime-endpoint to choose`);
    } catch {
      // not a runtime: nothing to say
    } finally {
      try {
        await src.close?.();
      } catch {
        // the answer is in hand
      }
    }
  }
  return out;
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
 * Run `leaks` (`mode: 'leaks'`) or `gc`: snapshot, read, plan, check live addresses (with
 * `features.podIPs`) and (gc without --dry-run) apply, then re-reserve.
 * Throws `UsageError` for bad flags, the store's `AppError`s when a network cannot be read, and
 * `AppError('STORE_IO')` when the audit log cannot be opened (then nothing is released or
 * re-reserved). Without a policy, or with `conservative`, the plan holds no `notready` entry.
 */
export async function reconcile(
  mode: 'leaks' | 'gc',
  opts: ReconcileCommandOptions & { readonly policy?: 'conservative' },
  ctx: CliContext,
  features?: ReconcileFeatures,
): Promise<ReconcileRun<Verdict>>;
export async function reconcile(
  mode: 'leaks' | 'gc',
  opts: ReconcileCommandOptions,
  ctx: CliContext,
  features?: ReconcileFeatures,
): Promise<ReconcileRun>;
export async function reconcile(
  mode: 'leaks' | 'gc',
  opts: ReconcileCommandOptions,
  ctx: CliContext,
  features: ReconcileFeatures = {},
): Promise<ReconcileRun> {
  const dataDir = opts.dataDir ?? DEFAULT_DATA_DIR;
  if (dataDir === '') throw new UsageError('--data-dir must not be empty');
  const graceSeconds = parseGrace(opts.grace ?? DEFAULT_GRACE);
  const policy = parsePolicy(opts.policy ?? DEFAULT_POLICY);
  const cniConfDir = opts.cniConfDir ?? DEFAULT_CNI_CONF_DIR;
  if (cniConfDir === '') throw new UsageError('--cni-conf-dir must not be empty');
  const networks = opts.network !== undefined ? [namedNetwork(dataDir, opts.network)] : discoverNetworks(dataDir);
  const openStore = (network: string) => openFileStore({ dataDir, network });

  const snap = await snapshot(opts, ctx, features.podIPs === true); // first the runtime...
  const readEvidence = ctx.evidence ?? (() => readKernelEvidence());
  const evidence = readEvidence(); // ...and the kernel...
  const reservations = await readReservations(networks, openStore); // ...then the locks
  const full = plan({ reservations, sandboxes: snap.sandboxes, snapshotAtMs: snap.snapshotAtMs, graceSeconds, policy, evidence });
  const warnings = [...snap.warnings];
  const failures = [...snap.podIPFailures];
  if (evidence.incomplete !== null) warnings.push(`kernel evidence incomplete (${evidence.incomplete}): nothing is released`);

  // BR-13: the addresses of live sandboxes against the reservations (pure, after the reads).
  let p: Plan<AnyVerdict> = full;
  let findings: PodIPFinding[] = [];
  const withheld: SkippedRelease[] = [];
  if (snap.podIPs !== null) {
    const check = checkPodIPs({
      podIPs: snap.podIPs,
      entries: full.entries,
      scanned: networks.map((n) => n.name),
      allNetworks: opts.network === undefined ? networks.map((n) => n.name) : discoverNetworks(dataDir).map((n) => n.name),
      configured: () => configuredRanges(cniConfDir, warnings),
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
        const user = findings.find((f) => f.action === 'conflict' && f.network === e.network && f.ip === e.ip);
        withheld.push({ entry: e, why: `address in use by live sandbox ${user?.sandbox ?? '?'} (conflict)` });
      }
      p = { ...full, release, keep };
    }
  }
  // A ready sandbox whose addresses are unknown: only complete kernel evidence covers them.
  if (snap.podIPFailures.length > 0 && evidence.incomplete !== null && p.release.length > 0) {
    for (const e of p.release) withheld.push({ entry: e, why: 'the pod IPs of a ready sandbox could not be read and the kernel evidence is incomplete' });
    p = { ...p, release: [], keep: [...p.keep, ...p.release] };
  }

  let applied: ApplyResult | null = null;
  if (mode === 'gc' && opts.dryRun !== true) {
    const toReserve = findings.some((f) => f.action === 'reported' && f.network !== null);
    // Time: files stamped in the future get their grace period from now (docs/reconciler.md "Time").
    const restampErrors = (await restampFuture(p, { openStore })).map((e) => ({ ...e }));
    if (p.release.length === 0 && !toReserve) applied = { released: [], skipped: [], errors: restampErrors };
    else {
      const audit: AuditSink = openAuditLog(opts.auditLog ?? defaultAuditLogPath(dataDir));
      const applyOpts = { openStore, audit, now: () => ctx.now(), evidence: readEvidence };
      try {
        const a0 = await applyPlan(p, applyOpts);
        const a = restampErrors.length === 0 ? a0 : { ...a0, errors: [...restampErrors, ...a0.errors] };
        // An audit log that broke while releasing stops everything (every change is recorded).
        if (toReserve && a.auditBroken !== true) {
          const r = await reReserve(findings, applyOpts);
          findings = r.findings;
          applied = { released: a.released, skipped: a.skipped, errors: [...a.errors, ...r.errors] };
        } else applied = a;
      } finally {
        audit.close();
      }
    }
  }
  const podIPs = snap.podIPs === null ? null : { readySandboxes: snap.podIPs.length, findings };
  return { runtime: snap.runtime, evidence, networks, plan: p, applied, podIPs, withheld, warnings, failures };
}

/** The `--json` document of a run. */
export function toJson(run: ReconcileRun): ReportJson {
  const byNetwork = new Map<string, ReservationJson[]>();
  for (const n of run.networks) byNetwork.set(n.name, []);
  for (const e of run.plan.entries) {
    byNetwork.get(e.network)?.push({
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
    kernel: { complete: run.evidence.incomplete === null, incomplete: run.evidence.incomplete, addresses: run.evidence.addresses.size },
    networks: run.networks.map((n) => ({ name: n.name, dir: n.dir, reservations: byNetwork.get(n.name) ?? [] })),
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

/**
 * The summary line: `3 reservations: 1 live, 0 grace, 2 leaked, 0 corrupt` (+ `, N notready`
 * under policy reclaim-notready, + `, N inuse` when the kernel kept some, + `, N unknown` when the
 * runtime could not be asked or the kernel evidence was incomplete).
 */
export function summaryLine(p: Plan<AnyVerdict>): string {
  const shown = (v: AnyVerdict): boolean =>
    v === 'unknown' || v === 'inuse' ? p.counts[v] > 0 : v === 'notready' ? p.policy === 'reclaim-notready' || p.counts.notready > 0 : true;
  const parts = VERDICTS.filter(shown).map((v) => `${p.counts[v]} ${v}`);
  const n = p.counts.allocated;
  return `${n} reservation${n === 1 ? '' : 's'}: ${parts.join(', ')}`;
}

/** The human report: runtime line, table, summary. */
export function toTable(run: ReconcileRun): string {
  const rt = run.runtime;
  const head =
    rt.sandboxes === null
      ? `runtime ${rt.endpoint ?? '-'}: not reachable\n`
      : `runtime ${rt.endpoint ?? '-'}: ${rt.sandboxes} sandbox${rt.sandboxes === 1 ? '' : 'es'}\n`;
  const rows = run.plan.entries.map((e) => [
    e.network,
    e.ip,
    shortId(e.containerId),
    cell(e.ifname),
    formatAge(e.ageSeconds),
    e.verdict,
    e.reason,
  ]);
  return head + renderTable(['NETWORK', 'IP', 'CONTAINER', 'IFNAME', 'AGE', 'VERDICT', 'REASON'], rows) + summaryLine(run.plan) + '\n' + podIPSection(run);
}

/**
 * The human section about live sandboxes' addresses (BR-13), after the table: a count line and,
 * when there are findings, one row each. Empty when the pod IPs were not checked.
 */
export function podIPSection(run: ReconcileRun): string {
  if (run.podIPs === null) return '';
  const f = run.podIPs.findings;
  const n = run.podIPs.readySandboxes;
  const conflicts = f.filter((x) => x.action === 'conflict').length;
  const reReserved = f.filter((x) => x.action === 're-reserved').length;
  const unreserved = f.length - conflicts;
  const head =
    `pod IPs of ${n} ready sandbox${n === 1 ? '' : 'es'}: ${unreserved} unreserved` +
    `${reReserved > 0 ? ` (${reReserved} re-reserved)` : ''}, ${conflicts} conflict${conflicts === 1 ? '' : 's'}\n`;
  if (f.length === 0) return head;
  const rows = f.map((x) => [shortId(x.sandbox), x.ip, cell(x.network), x.action, shortId(x.reservedFor), x.message]);
  return head + renderTable(['SANDBOX', 'IP', 'NETWORK', 'ACTION', 'RESERVED-FOR', 'PROBLEM'], rows);
}

/** Print a run (JSON or table) and diagnostics; returns the exit status. */
export function report(mode: 'leaks' | 'gc', opts: ReconcileCommandOptions, run: ReconcileRun, ctx: CliContext): number {
  let code = 0;
  if (opts.json === true) ctx.stdout(`${JSON.stringify(toJson(run))}\n`);
  else {
    ctx.stdout(toTable(run));
    if (mode === 'gc') {
      if (run.applied === null) {
        for (const e of run.plan.release) ctx.stdout(`would release ${e.network} ${e.ip} (${e.verdict})\n`);
        ctx.stdout(`would release ${run.plan.release.length}\n`);
      } else {
        for (const e of run.applied.released) ctx.stdout(`released ${e.network} ${e.ip} (${e.verdict})\n`);
        ctx.stdout(`released ${run.applied.released.length}\n`);
      }
    }
  }
  if (run.runtime.error !== undefined) {
    const what = mode === 'gc' ? 'only corrupt files are released' : 'verdicts are unknown';
    ctx.stderr(`ipwarden: runtime not reachable: ${run.runtime.error}; ${what}\n`);
    code = 1;
  }
  if (mode === 'gc') for (const s of run.withheld) ctx.stderr(`ipwarden: kept ${s.entry.network} ${s.entry.ip}: ${s.why}\n`);
  for (const s of run.applied?.skipped ?? []) ctx.stderr(`ipwarden: kept ${s.entry.network} ${s.entry.ip}: ${s.why}\n`);
  for (const w of run.warnings) ctx.stderr(`ipwarden: ${w}\n`);
  for (const f of run.failures) {
    ctx.stderr(`ipwarden: ${f}\n`);
    code = 1;
  }
  if (mode === 'gc') {
    for (const f of run.podIPs?.findings ?? []) {
      if (f.action !== 'conflict') continue;
      ctx.stderr(`ipwarden: conflict: ${f.message}\n`);
      code = 1;
    }
  }
  for (const e of run.applied?.errors ?? []) {
    ctx.stderr(`ipwarden: ${e.network}${e.ip === null ? '' : ` ${e.ip}`}: ${e.message}\n`);
    code = 1;
  }
  return code;
}

/** CLI action of `ipwarden leaks`; resolves to the exit status. */
export async function run(opts: ReconcileCommandOptions, ctx: CliContext): Promise<number> {
  return report('leaks', opts, await reconcile('leaks', opts, ctx, { podIPs: true }), ctx);
}
