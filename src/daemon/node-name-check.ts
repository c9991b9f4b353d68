/**
 * The daemon's check that the node-name file beside the installed plugin agrees with its own
 * `NODE_NAME` (docs/cluster.md "The node name"; the trap Whereabouts v0.9.4 closed). The daemon
 * serves the node's pool requests under `NODE_NAME` (the DaemonSet's downward API `spec.nodeName`);
 * while it is down, the shim's standalone fallback names the node from the file. A file naming
 * another node — or written on another host name, which the fallback ignores, naming the node by
 * the host name instead (a renamed host) — makes the fallback a second node of the pool: it claims
 * blocks under another name and its pods' handles are not the daemon's.
 *
 * Refused loudly, without stopping service: the daemon logs an error, sets
 * `ipwarden_node_name_mismatch` to 1 and fails `/readyz` with the reason until the file agrees.
 * It does not exit: an exiting daemon crash-loops, and then every request goes to the fallback,
 * which uses the wrong name — the very failure. Kept running, the daemon serves pods under the right
 * name; the failing readiness stops a rollout and alerts. With `--cni-bin-dir`, its install watch
 * rewrites the file from `NODE_NAME` and this host's name (src/daemon/install-watch.ts), so the
 * mismatch heals itself within seconds.
 */
import { hostname } from 'node:os';
import { nodeNameFileRecord } from '../node/node-name.ts';

/**
 * Why the node-name file in `dir` (default: beside the running program, as the fallback reads it)
 * disagrees with `env.NODE_NAME`, or null when it agrees, is absent, or the daemon has no
 * `NODE_NAME` (its name then comes from the file itself). A file that cannot be used (not to be
 * trusted, not a node name) is a disagreement too: the fallback fails every pool request on it.
 */
export function nodeNameMismatch(env: Readonly<Record<string, string | undefined>>, dir?: string, host: () => string = hostname): string | null {
  const want = env['NODE_NAME'];
  if (want === undefined || want === '') return null;
  let r;
  try {
    r = nodeNameFileRecord(dir === undefined ? {} : { dir });
  } catch (e) {
    return `${e instanceof Error ? e.message : String(e)}: the standalone fallback cannot name this node (the daemon's NODE_NAME is ${want})`;
  }
  if (r === null) return null;
  if (r.name !== want) return `the node name file ${r.file} names node ${r.name}, but the daemon's NODE_NAME is ${want}: while the daemon is down, the standalone fallback would serve this node's pods as node ${r.name}`;
  const me = host();
  if (r.host !== null && r.host !== me) return `the node name file ${r.file} was written on host ${r.host}, but this host is ${me} (renamed?): the standalone fallback ignores it and would serve this node's pods as node ${me}; run install-cni again (or give the daemon --cni-bin-dir)`;
  return null;
}
