/**
 * The cold part of the program: everything the plugin's hot path (ADD/DEL/CHECK/GC/STATUS on a
 * healthy network) never needs — the operator CLI, the daemon and the CRI-backed self-healing
 * hooks with the gRPC client. `scripts/build.mjs` bundles this module separately and embeds it in
 * the main bundle as a string that is compiled only when first imported, so exec'ing the plugin
 * does not pay for parsing gRPC (docs/benchmarks.md). Under tsx (tests) it is an ordinary module.
 *
 * This is the main layer: it joins the CLI and the daemon, which are peers and do not import each
 * other (the `daemon` verb parses its flags in src/cli/daemon.ts; the daemon is started here).
 */
import { runMain as cliRunMain } from './cli/main.ts';
import type { CliContext } from './cli/context.ts';
import type { DaemonStarter } from './cli/daemon.ts';

export { criHeal } from './cni/heal.ts';
export { poolHooks } from './cni/pool.ts';

/**
 * `ipwarden daemon`: run the node agent (src/daemon/agent.ts: plugin server, metrics, reconcile
 * loop) until SIGTERM/SIGINT, with the CLI's status page renderer for its `/status`.
 */
const startDaemon: DaemonStarter = async (options) => {
  const [{ runAgent }, { renderStatusHtml }] = await Promise.all([import('./daemon/agent.ts'), import('./cli/html.ts')]);
  return runAgent(options, process, { statusHtml: renderStatusHtml });
};

/** The CLI (src/cli/main.ts `runMain`) with the verbs of the layers above it wired in. */
export function runMain(argv: readonly string[], ctx?: CliContext): Promise<number> {
  return cliRunMain(argv, ctx, { daemon: startDaemon });
}
