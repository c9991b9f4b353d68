/**
 * `ipwarden gc` — release the leaked and corrupt reservations under the data dir, each under its
 * network's lock after re-checking it, and record every release in the audit log. Same engine as
 * `leaks` (`src/cli/leaks.ts`).
 *
 * Usage:
 *   ipwarden gc [--data-dir DIR] [--network NAME] [--runtime-endpoint URL] [--grace DUR] [--json]
 *               [--dry-run] [--audit-log FILE]
 * Examples:
 *   ipwarden gc --dry-run
 *   ipwarden gc --network cbr0 --grace 10m --audit-log /var/log/ipwarden-audit.log
 *
 * When the runtime cannot be asked, only corrupt files are released and the exit status is 1.
 * `--dry-run` releases nothing (and writes no audit record) and lists what it would release.
 */
import type { CliContext } from './context.ts';
import { reconcile, report, type ReconcileCommandOptions } from './leaks.ts';

/** CLI action of `ipwarden gc`; resolves to the exit status (0, 1 runtime unreachable or a release failed). */
export async function run(opts: ReconcileCommandOptions, ctx: CliContext): Promise<number> {
  return report('gc', opts, await reconcile('gc', opts, ctx), ctx);
}
