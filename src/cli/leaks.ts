/**
 * `ipwarden leaks` — list every reservation under the data directories with its verdict (live, grace,
 * leaked, corrupt, notready), and the output `ipwarden gc` shares (`src/cli/gc.ts`).
 *
 * Usage:
 *   ipwarden leaks [--data-dir DIR] [--network NAME] [--runtime-endpoint URL] [--grace DUR]
 *                  [--policy conservative|reclaim-notready] [--cni-conf-dir DIR] [--json]
 * Examples:
 *   ipwarden leaks
 *   ipwarden leaks --network cbr0 --grace 2m --json
 *   ipwarden leaks --policy reclaim-notready
 *
 * A thin verb: flags → `parseReconcileOptions` → `reconcileScope()` (the data directories
 * `status` reads: `--data-dir`, else those the CNI configurations name) → `reconcile()`
 * (`src/reconcile/engine.ts`: snapshot, read-and-plan, and for gc apply) → table or JSON.
 * Exit status: 0; 1 when the runtime could not be asked, a release failed, or (gc) an address of
 * a live sandbox is reserved for another container; 2 for usage errors.
 * docs/cli.md documents the JSON schema.
 */
import { reconcile, toJson, type ReconcileRun } from '../reconcile/engine.ts';
import { parseReconcileOptions, type RawReconcileOptions } from '../reconcile/options.ts';
import { VERDICTS, type AnyVerdict, type Plan } from '../reconcile/plan.ts';
import { reconcileScope } from '../reconcile/status.ts';
import type { CliContext } from './context.ts';
import { cell, formatAge, renderTable, shortId } from './format.ts';

export type { ReportJson } from '../reconcile/engine.ts';

/** Options of `leaks` and `gc` as commander parses them. */
export type ReconcileCommandOptions = RawReconcileOptions;

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
      ? rt.endpoint === null || rt.endpoint === undefined
        ? 'runtime: none found (see the error below)\n'
        : `runtime ${rt.endpoint}: not reachable\n`
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

/**
 * Run `leaks` or `gc` (the pod IPs of live sandboxes checked) and print it; resolves to the exit
 * status. Throws `UsageError` for bad flags and what `reconcile()` throws.
 */
export async function runReconcileCommand(mode: 'leaks' | 'gc', opts: ReconcileCommandOptions, ctx: CliContext): Promise<number> {
  const o = parseReconcileOptions(opts);
  const scope = reconcileScope(o);
  const run = await reconcile(mode, { ...o, dataDirs: scope.dataDirs }, ctx, { podIPs: true });
  return report(mode, opts, { ...run, warnings: [...scope.warnings, ...run.warnings] }, ctx);
}

/** CLI action of `ipwarden leaks`; resolves to the exit status. */
export async function run(opts: ReconcileCommandOptions, ctx: CliContext): Promise<number> {
  return runReconcileCommand('leaks', opts, ctx);
}
