/**
 * `ipwarden doctor` — inspect the node and print findings, each with a severity, the evidence and
 * the command or configuration change that fixes it.
 *
 * Usage:
 *   ipwarden doctor [--cni-conf-dir DIR] [--data-dir DIR] [--cni-bin-dir DIRS]
 *                   [--runtime-endpoint URL] [--grace DUR] [--json]
 * Examples:
 *   ipwarden doctor
 *   ipwarden doctor --cni-bin-dir /opt/cni/bin --json
 *
 * A thin verb: flags → {@link DoctorQuery} → `diagnose()` (the doctor model,
 * `src/reconcile/doctor.ts`) → text or JSON. Exit status: 0 when no finding is an error, 1
 * otherwise, 2 usage error. docs/cli.md lists the findings and the JSON schema.
 */
import { diagnose, plural, summary, type DoctorDeps, type DoctorQuery, type Finding, type Severity } from '../reconcile/doctor.ts';
import type { CliContext } from './context.ts';
import { statusQuery } from './status.ts';

export type { Finding, FindingId, Severity } from '../reconcile/doctor.ts';

/** Options of `doctor` as commander parses them. */
export interface DoctorOptions {
  cniConfDir?: string;
  dataDir?: string;
  /** Plugin directories (already split at `:`); default `/opt/cni/bin`, `/usr/lib/cni`. */
  cniBinDir?: string[];
  runtimeEndpoint?: string;
  /** Go duration (default `5m`). */
  grace?: string;
  json?: boolean;
}

/** A CLI context that may carry a `DoctorProbe` (tests); the real one has none. */
export interface DoctorContext extends CliContext, DoctorDeps {}

/** Human output: one block per finding, then a summary line. */
export function findingsText(findings: readonly Finding[]): string {
  if (findings.length === 0) return 'doctor: no problems found\n';
  const blocks = findings.map(
    (f) => `${f.severity.toUpperCase()}  ${f.id}: ${f.title}\n  evidence: ${f.evidence}\n  fix:      ${f.fix}\n`,
  );
  const s = summary(findings);
  return `${blocks.join('\n')}\ndoctor: ${plural(s.error, 'error')}, ${plural(s.warning, 'warning')}, ${s.info} info\n`;
}

/** The `--json` document of `doctor` (docs/cli.md). */
export interface DoctorJson {
  findings: Finding[];
  summary: Record<Severity, number>;
}

/**
 * CLI action of `ipwarden doctor`; resolves to the exit status (1 when any finding is an error).
 * Throws `UsageError` for a bad `--grace` (checked before anything is read) and what
 * `diagnose()` throws.
 */
export async function run(opts: DoctorOptions, ctx: DoctorContext): Promise<number> {
  const q: DoctorQuery = { ...statusQuery(opts), ...(opts.cniBinDir === undefined ? {} : { cniBinDir: opts.cniBinDir }) };
  const { findings } = await diagnose(q, ctx);
  if (opts.json === true) {
    const doc: DoctorJson = { findings: [...findings], summary: summary(findings) };
    ctx.stdout(`${JSON.stringify(doc)}\n`);
  } else ctx.stdout(findingsText(findings));
  return findings.some((f) => f.severity === 'error') ? 1 : 0;
}
