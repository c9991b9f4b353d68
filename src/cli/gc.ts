/**
 * `ipwarden gc` — release the leaked and corrupt reservations under the data dir, each under its
 * network's lock after re-checking it, and record every release in the audit log. Same engine as
 * `leaks` (`reconcile()` of `src/reconcile/engine.ts`) and the same output (`src/cli/leaks.ts`).
 *
 * Usage:
 *   ipwarden gc [--data-dir DIR] [--network NAME] [--runtime-endpoint URL] [--grace DUR] [--json]
 *               [--policy conservative|reclaim-notready] [--cni-conf-dir DIR]
 *               [--dry-run] [--audit-log FILE]
 * Examples:
 *   ipwarden gc --dry-run
 *   ipwarden gc --network cbr0 --grace 10m --audit-log /var/log/ipwarden-audit.log
 *
 * With `--policy reclaim-notready` it also releases the reservations of NOT READY sandboxes older
 * than the grace period (BR-22). It re-reserves the address of a READY sandbox that has no
 * reservation (BR-13), and exits 1 when such an address is reserved for another container.
 * When the runtime cannot be asked, only corrupt files are released and the exit status is 1.
 * `--dry-run` releases nothing (and writes no audit record) and lists what it would release.
 */
import type { CliContext } from './context.ts';
import { runReconcileCommand, type ReconcileCommandOptions } from './leaks.ts';

/**
 * CLI action of `ipwarden gc`; resolves to the exit status (0; 1 runtime unreachable, a release or
 * re-reservation failed, or a live sandbox's address is reserved for another container).
 */
export async function run(opts: ReconcileCommandOptions, ctx: CliContext): Promise<number> {
  return runReconcileCommand('gc', opts, ctx);
}
