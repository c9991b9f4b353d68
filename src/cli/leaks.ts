/**
 * `ipwarden leaks` — list every reservation under the data dir with its verdict (live, grace,
 * leaked, corrupt), and the engine `ipwarden gc` shares (`src/cli/gc.ts`).
 *
 * Usage:
 *   ipwarden leaks [--data-dir DIR] [--network NAME] [--runtime-endpoint URL] [--grace DUR] [--json]
 * Examples:
 *   ipwarden leaks
 *   ipwarden leaks --network cbr0 --grace 2m --json
 *
 * Order of work (ARCHITECTURE.md "Reconciler safety rules"): resolve the endpoint, note the
 * snapshot time, ask the runtime for its sandboxes (any state), THEN read each network's
 * reservations under its lock, plan (pure), and for `gc` apply under the lock with re-checks.
 * Exit status: 0; 1 when the runtime could not be asked or a release failed; 2 for usage errors.
 * docs/cli.md documents the JSON schema.
 */
import { AppError, UsageError } from '../common/errors.ts';
import { parseDuration } from '../common/duration.ts';
import { resolveRuntimeEndpoint } from '../runtime/endpoint.ts';
import { openFileStore } from '../store/file/file-store.ts';
import { applyPlan, type ApplyResult } from '../reconcile/apply.ts';
import { defaultAuditLogPath, openAuditLog } from '../reconcile/audit.ts';
import { discoverNetworks, namedNetwork, readReservations, type NetworkDir } from '../reconcile/networks.ts';
import { plan, VERDICTS, type Plan, type PlanEntry, type SandboxIndex } from '../reconcile/plan.ts';
import { indexSandboxes, type SandboxSource, type SandboxSourceFactory } from '../reconcile/sandboxes.ts';
import type { CliContext } from './context.ts';
import { cell, formatAge, renderTable, shortId } from './format.ts';

/** Default `--data-dir` (host-local's `dataDir` default). */
export const DEFAULT_DATA_DIR = '/var/lib/cni/networks';
/** Default `--grace` (Go duration). */
export const DEFAULT_GRACE = '5m';

/** Options of `leaks` and `gc` as commander parses them. */
export interface ReconcileCommandOptions {
  dataDir?: string;
  network?: string;
  runtimeEndpoint?: string;
  grace?: string;
  json?: boolean;
  /** gc only. */
  dryRun?: boolean;
  /** gc only: audit log path (default `<dataDir>/ipwarden-audit.log`). */
  auditLog?: string;
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
  verdict: PlanEntry['verdict'];
  reason: string;
}

/** One released reservation of the JSON report. */
export interface ReleasedJson {
  network: string;
  ip: string;
  containerId: string | null;
  ifname: string | null;
  verdict: PlanEntry['verdict'];
  reason: string;
}

/** The `--json` document of `leaks` and `gc` (docs/cli.md). */
export interface ReportJson {
  runtime: RuntimeJson;
  networks: Array<{ name: string; dir: string; reservations: ReservationJson[] }>;
  released: ReleasedJson[];
}

/** What a run found and did, before formatting. */
export interface ReconcileRun {
  readonly runtime: RuntimeJson;
  readonly networks: readonly NetworkDir[];
  readonly plan: Plan;
  /** null for `leaks` and `gc --dry-run`. */
  readonly applied: ApplyResult | null;
}

/** The CRI-backed sandbox source (the CRI client is loaded only when no fake is injected). */
const criSandboxSource: SandboxSourceFactory = (endpoint) => {
  let real: SandboxSource | null = null;
  const load = async (): Promise<SandboxSource> => (real ??= (await import('../reconcile/cri-source.ts')).criSandboxSource(endpoint));
  return {
    endpoint,
    list: async () => (await load()).list(),
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

function describe(e: unknown): string {
  if (e instanceof AppError) return e.details === undefined ? e.message : `${e.message} (${e.details})`;
  return e instanceof Error ? e.message : String(e);
}

/**
 * Take the runtime snapshot. Never throws for runtime problems: they become `runtime.error` and
 * a null index. A malformed `--runtime-endpoint` is a usage error (thrown).
 */
async function snapshot(
  opts: ReconcileCommandOptions,
  ctx: CliContext,
): Promise<{ runtime: RuntimeJson; sandboxes: SandboxIndex | null; snapshotAtMs: number }> {
  let endpoint: string;
  try {
    endpoint = resolveRuntimeEndpoint(opts.runtimeEndpoint, ctx.env).url;
  } catch (e) {
    if (e instanceof AppError && e.code === 'USAGE') throw new UsageError(`--runtime-endpoint: ${e.message}`);
    return {
      runtime: { endpoint: opts.runtimeEndpoint ?? null, sandboxes: null, error: describe(e) },
      sandboxes: null,
      snapshotAtMs: ctx.now(),
    };
  }
  // The snapshot time is taken BEFORE the runtime is asked: a file written before this instant
  // by an ADD still in flight is protected by the grace period, measured from here.
  const snapshotAtMs = ctx.now();
  let source: SandboxSource | undefined;
  try {
    source = (ctx.sandboxSource ?? criSandboxSource)(endpoint);
    const list = await source.list();
    return { runtime: { endpoint: source.endpoint, sandboxes: list.length }, sandboxes: indexSandboxes(list), snapshotAtMs };
  } catch (e) {
    return { runtime: { endpoint, sandboxes: null, error: describe(e) }, sandboxes: null, snapshotAtMs };
  } finally {
    try {
      await source?.close?.();
    } catch {
      // the list is already in hand
    }
  }
}

/**
 * Run `leaks` (`mode: 'leaks'`) or `gc`: snapshot, read, plan and (gc without --dry-run) apply.
 * Throws `UsageError` for bad flags, the store's `AppError`s when a network cannot be read, and
 * `AppError('STORE_IO')` when the audit log cannot be opened (then nothing is released).
 */
export async function reconcile(mode: 'leaks' | 'gc', opts: ReconcileCommandOptions, ctx: CliContext): Promise<ReconcileRun> {
  const dataDir = opts.dataDir ?? DEFAULT_DATA_DIR;
  if (dataDir === '') throw new UsageError('--data-dir must not be empty');
  const graceSeconds = parseGrace(opts.grace ?? DEFAULT_GRACE);
  const networks = opts.network !== undefined ? [namedNetwork(dataDir, opts.network)] : discoverNetworks(dataDir);
  const openStore = (network: string) => openFileStore({ dataDir, network });

  const snap = await snapshot(opts, ctx); // first the runtime...
  const reservations = await readReservations(networks, openStore); // ...then the locks
  const p = plan({ reservations, sandboxes: snap.sandboxes, snapshotAtMs: snap.snapshotAtMs, graceSeconds });

  let applied: ApplyResult | null = null;
  if (mode === 'gc' && opts.dryRun !== true) {
    if (p.release.length === 0) applied = { released: [], skipped: [], errors: [] };
    else {
      const audit = openAuditLog(opts.auditLog ?? defaultAuditLogPath(dataDir));
      try {
        applied = await applyPlan(p, { openStore, audit, now: () => ctx.now() });
      } finally {
        audit.close();
      }
    }
  }
  return { runtime: snap.runtime, networks, plan: p, applied };
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
  return {
    runtime: run.runtime,
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
}

/** The summary line: `3 reservations: 1 live, 0 grace, 2 leaked, 0 corrupt` (+ `, N unknown`). */
export function summaryLine(p: Plan): string {
  const parts = VERDICTS.filter((v) => v !== 'unknown' || p.counts.unknown > 0).map((v) => `${p.counts[v]} ${v}`);
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
  return head + renderTable(['NETWORK', 'IP', 'CONTAINER', 'IFNAME', 'AGE', 'VERDICT', 'REASON'], rows) + summaryLine(run.plan) + '\n';
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
  for (const s of run.applied?.skipped ?? []) ctx.stderr(`ipwarden: kept ${s.entry.network} ${s.entry.ip}: ${s.why}\n`);
  for (const e of run.applied?.errors ?? []) {
    ctx.stderr(`ipwarden: ${e.network}${e.ip === null ? '' : ` ${e.ip}`}: ${e.message}\n`);
    code = 1;
  }
  return code;
}

/** CLI action of `ipwarden leaks`; resolves to the exit status. */
export async function run(opts: ReconcileCommandOptions, ctx: CliContext): Promise<number> {
  return report('leaks', opts, await reconcile('leaks', opts, ctx), ctx);
}
