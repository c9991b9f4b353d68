/**
 * `ipwarden status` — a node's addresses per network and range set: capacity, reserved, and the
 * reconciler's verdicts (live, in grace, leaked, corrupt), free.
 *
 * Usage:
 *   ipwarden status [--cni-conf-dir DIR] [--data-dir DIR] [--network NAME]
 *                   [--runtime-endpoint URL] [--grace DUR] [--json] [--html FILE]
 * Examples:
 *   ipwarden status
 *   ipwarden status --network cbr0 --json
 *   ipwarden status --html /tmp/node-addresses.html
 *
 * A thin verb: flags → {@link StatusQuery} → `collectStatus()` (the status model,
 * `src/reconcile/status.ts`: one runtime snapshot, each network read under its lock, verdicts
 * from the reconcile engine) → table, JSON, and with `--html` the page of `./html.ts`.
 * When the runtime cannot be asked, live/grace/leaked are unknown (`?` in the table, null in
 * JSON). Exit status: 0; 1 when the runtime could not be asked (the report is still printed),
 * the kernel evidence is incomplete, or a network could not be read; 2 usage error.
 * docs/cli.md documents the JSON schema.
 */
import { writeFileSync } from 'node:fs';
import { AppError, UsageError } from '../common/errors.ts';
import { DEFAULT_GRACE, parseGrace } from '../reconcile/options.ts';
import type { RuntimeJson } from '../reconcile/snapshot.ts';
import { collectStatus, statusToJson, type StatusQuery, type StatusReport, type VerdictCounts } from '../reconcile/status.ts';
import type { CliContext } from './context.ts';
import { renderTable, runtimeHead } from './format.ts';

/** Options of `status` as commander parses them. */
export interface StatusOptions {
  cniConfDir?: string;
  dataDir?: string;
  network?: string;
  runtimeEndpoint?: string;
  /** Go duration (default `5m`). */
  grace?: string;
  json?: boolean;
  /** Write the HTML page to this file. */
  html?: string;
}

/**
 * Flags → the status model's query (`--grace` parsed to seconds). Throws `UsageError` for a bad
 * `--grace`; the other checks are `layoutNetworks`'s.
 */
export function statusQuery(opts: Pick<StatusOptions, 'cniConfDir' | 'dataDir' | 'network' | 'runtimeEndpoint' | 'grace'>): StatusQuery {
  const graceSeconds = parseGrace(opts.grace ?? DEFAULT_GRACE);
  return {
    graceSeconds,
    ...(opts.cniConfDir === undefined ? {} : { cniConfDir: opts.cniConfDir }),
    ...(opts.dataDir === undefined ? {} : { dataDir: opts.dataDir }),
    ...(opts.network === undefined ? {} : { network: opts.network }),
    ...(opts.runtimeEndpoint === undefined ? {} : { runtimeEndpoint: opts.runtimeEndpoint }),
  };
}


/**
 * The runtime line of the human output: `runtime <endpoint>: <n> sandboxes`, `runtime <endpoint>:
 * not reachable: <error>`, or when no runtime was found `runtime: none found (none of <default
 * sockets> exists; set --runtime-endpoint or CONTAINER_RUNTIME_ENDPOINT)` ({@link runtimeHead}).
 */
export function runtimeLine(rt: RuntimeJson): string {
  if (rt.endpoint === null) return `${runtimeHead(null, rt.error)}\n`;
  if (rt.sandboxes === null) return `runtime ${rt.endpoint}: not reachable: ${rt.error ?? 'unknown error'}\n`;
  return `runtime ${rt.endpoint}: ${rt.sandboxes} sandbox${rt.sandboxes === 1 ? '' : 'es'}\n`;
}

/** The human report: runtime line, one row per network and range set, notes. */
export function statusTable(r: StatusReport): string {
  const v = (n: number): string => (r.verdicts ? String(n) : '?');
  const rows: string[][] = [];
  const countCells = (c: VerdictCounts): string[] => [String(c.reserved), v(c.live), v(c.grace), v(c.leaked), String(c.corrupt)];
  for (const n of r.networks) {
    if (n.skipped !== null) {
      rows.push([n.name, '-', `(not read: ${n.skipped})`, '-', '-', '-', '-', '-', '-', '-']);
      continue;
    }
    for (const s of n.rangeSets) {
      rows.push([n.name, String(s.index), s.range, s.capacity.toString(), ...countCells(s.counts), s.free.toString()]);
    }
    if (n.config === null) rows.push([n.name, '-', '(no config)', '-', ...countCells(n.outside.counts), '-']);
    else if (n.outside.counts.reserved > 0) rows.push([n.name, '-', '(outside ranges)', '-', ...countCells(n.outside.counts), '-']);
  }
  let out = runtimeLine(r.runtime);
  out += renderTable(['NETWORK', 'SET', 'RANGE', 'CAPACITY', 'RESERVED', 'LIVE', 'GRACE', 'LEAKED', 'CORRUPT', 'FREE'], rows);
  if (r.networks.length === 0) out += `no networks (${r.layout.cniConfDir}; ${r.layout.dataDirs.join(', ')})\n`;
  for (const p of r.layout.poolNetworks) out += `network ${p.name} (${p.file}) allocates from cluster pool ${p.pool}: see ipwarden pool status --pool ${p.pool}\n`;
  for (const e of r.layout.configErrors) out += `config ${e.file}: ${e.error}\n`;
  return out;
}

/** CLI action of `ipwarden status`; resolves to the exit status. */
export async function run(opts: StatusOptions, ctx: CliContext): Promise<number> {
  const report = await collectStatus(statusQuery(opts), ctx);
  if (opts.html !== undefined) {
    if (opts.html === '') throw new UsageError('--html must not be empty');
    if (opts.html === '-' && opts.json === true) throw new UsageError('--html - prints the page on stdout: it cannot be combined with --json');
    const { renderStatusHtml } = await import('./html.ts');
    const page = renderStatusHtml(report, { generatedAtMs: ctx.now() });
    if (opts.html === '-') {
      // The page alone on stdout (`kubectl exec … ipwarden status --html - > node.html`).
      ctx.stdout(page);
    } else {
      try {
        writeFileSync(opts.html, page);
      } catch (e) {
        throw new AppError('STORE_IO', `cannot write ${opts.html}: ${e instanceof Error ? e.message : String(e)}`, { cause: e });
      }
    }
  }
  if (opts.html !== '-') ctx.stdout(opts.json === true ? `${JSON.stringify(statusToJson(report))}\n` : statusTable(report));
  if (report.runtime.error !== undefined) {
    ctx.stderr(`ipwarden: runtime not reachable: ${report.runtime.error}; live, grace and leaked are unknown\n`);
    return 1;
  }
  if (report.evidence.incomplete !== null) {
    ctx.stderr(`ipwarden: kernel evidence incomplete (${report.evidence.incomplete}); live, grace and leaked are unknown\n`);
    return 1;
  }
  return 0;
}
