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
 * loop) until SIGTERM/SIGINT, with the CLI's status page renderer for its `/status`. With
 * `--cni-bin-dir`, the agent also watches the files install-cni put there and reinstalls them with
 * install-cni (src/cli/install-cni.ts `installPlan`, `installArgv`) given the daemon's own values:
 * its socket, `NODE_NAME`, and its runtime endpoint (`--runtime-endpoint`, else
 * `CONTAINER_RUNTIME_ENDPOINT`) — what the DaemonSet gives install-cni.
 */
const startDaemon: DaemonStarter = async (options, ctx) => {
  const [agent, { renderStatusHtml }] = await Promise.all([import('./daemon/agent.ts'), import('./cli/html.ts')]);
  if (options.cniBinDir === undefined) return agent.runAgent(options, process, { statusHtml: renderStatusHtml });
  const install = await import('./cli/install-cni.ts');
  const nodeName = ctx.env['NODE_NAME'];
  const endpoint = options.runtimeEndpoint ?? ctx.env['CONTAINER_RUNTIME_ENDPOINT'];
  const opts = {
    socket: options.socket,
    ...(nodeName === undefined || nodeName === '' ? {} : { nodeName }),
    ...(endpoint === undefined || endpoint === '' ? {} : { runtimeEndpoint: endpoint }),
  };
  const dir = options.cniBinDir;
  // Checked before the daemon starts: a bad NODE_NAME or endpoint, an unbuilt program, refuse now.
  install.installPlan(dir, opts);
  return agent.runAgent(options, process, { statusHtml: renderStatusHtml, installed: { dir, plan: () => install.installPlan(dir, opts), argv: install.installArgv(dir, opts) } });
};

/** The CLI (src/cli/main.ts `runMain`) with the verbs of the layers above it wired in. */
export function runMain(argv: readonly string[], ctx?: CliContext): Promise<number> {
  return cliRunMain(argv, ctx, { daemon: startDaemon });
}
