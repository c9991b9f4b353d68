/**
 * The plugin's self-healing hooks over CRI and the kernel (issues 4 and 7): reclaim on
 * exhaustion, reclaim of a statically requested address a leak holds, and recovery of a wiped
 * data directory ({@link makeHeal} in src/reconcile/reclaim.ts does the work). Loaded lazily, in
 * the cold part of the bundle, only when a hook fires, so ADD and DEL on a healthy network never
 * evaluate the gRPC client or read `/proc`.
 *
 * Which runtime is asked ({@link pluginRuntimeSource}): the ipam key `runtimeEndpoint`, else
 * `CONTAINER_RUNTIME_ENDPOINT`, else **the runtime that ran this plugin**, identified from the
 * process ancestry (the first ancestor below pid 1 with a listening unix socket that answers as a
 * CRI runtime: containerd, CRI-O, k3s's containerd…; ancestors whose sockets do not answer as CRI,
 * such as a Multus daemon, are passed over).
 * When the ancestry finds no runtime — a Multus thick daemon runs the IPAM plugin, and the Multus
 * shim that asked it was reparented to pid 1 (multus-cni#1071, #1165) — **the node's runtime
 * endpoint** is asked: the record `install-cni` wrote beside the plugin
 * (`ipwarden.d/runtime-endpoint`, src/node/node-name.ts; read only when trusted and only on
 * the host that wrote it), or, for a request the daemon serves, the daemon's own `--runtime-endpoint`
 * (`CONTAINER_RUNTIME_ENDPOINT`). It is what the operator configured for the node, not a guess.
 * No default socket is guessed: on a node whose pods run under CRI-O or k3s, a stock idle
 * containerd at `/run/containerd/containerd.sock` lists none of them (issue 7, case 1). When the
 * runtime cannot be identified the plugin does what host-local does (no reclaim) and says why.
 * The kernel evidence is read from `/proc` and the pinned namespaces
 * (`src/node/kernel-evidence.ts`). Each CRI call gets a short deadline
 * ({@link PLUGIN_CRI_TIMEOUT_SECONDS}) and all of them one overall deadline (reclaim.ts). The
 * audit log is `<dataDir>/.ipwarden-audit.log`, opened on first use.
 */
import { existsSync } from 'node:fs';
import { identifyRuntime, type RuntimeIdentity } from '../node/runtime-identity.ts';
import { readRuntimeEndpointFile } from '../node/node-name.ts';
import { readKernelEvidence } from '../node/kernel-evidence.ts';
import { openDefaultAuditLog, type AuditSink } from '../reconcile/audit.ts';
import { criSandboxSource, type PodIPSource } from '../reconcile/cri-source.ts';
import { makeHeal } from '../reconcile/reclaim.ts';
import type { EvidenceReader } from '../reconcile/evidence.ts';
import { CriClient } from '../runtime/cri-client.ts';
import { parseRuntimeEndpoint } from '../runtime/endpoint.ts';
import type { IPAMConfig } from '../ipam/types.ts';
import type { HealHooks } from './commands.ts';

/** Deadline of each CRI call made from inside ADD, seconds. */
export const PLUGIN_CRI_TIMEOUT_SECONDS = 5;

/** Deadline of the probe of each candidate socket (CRI Version), seconds. */
export const PROBE_TIMEOUT_SECONDS = 2;

/** Ancestors with listening sockets passed over (none answering as CRI) before giving up. */
export const MAX_RUNTIME_HOPS = 4;

/**
 * The node's runtime endpoint, asked when the plugin's ancestry finds no runtime: `{url, path,
 * source}` (`source` names where it comes from, for error details: `the runtime endpoint record
 * <file>`, `the daemon's --runtime-endpoint`), or `{ignored}` — a record that exists but cannot be
 * used, and why (one clause). null: none.
 */
export type NodeEndpoint = { readonly url: string; readonly path: string; readonly source: string } | { readonly ignored: string };

/** Produces the {@link NodeEndpoint} (called only when the ancestry finds no runtime); must not throw. */
export type NodeEndpointSource = () => NodeEndpoint | null;

/**
 * The standalone plugin's {@link NodeEndpointSource}: the record `install-cni` wrote beside the
 * running program (`<its dir>/ipwarden.d/runtime-endpoint`, {@link readRuntimeEndpointFile}).
 */
export const recordedNodeEndpoint: NodeEndpointSource = () => {
  const r = readRuntimeEndpointFile();
  if (r === null || 'ignored' in r) return r;
  return { url: r.url, path: r.path, source: `the runtime endpoint record ${r.file}` };
};

/** Injected parts of {@link pluginRuntimeSource} (tests replace the ancestry and the probe). */
export interface RuntimeChoiceDeps {
  readonly env: Readonly<Record<string, string | undefined>>;
  /** The first ancestor of `pid` (default: this process) with listening unix sockets. */
  identify(pid?: number): RuntimeIdentity;
  /** True when `url` answers as a CRI runtime. */
  probe(url: string): Promise<boolean>;
  exists(path: string): boolean;
  /** The node's runtime endpoint when the ancestry finds no runtime (absent: none). */
  nodeEndpoint?: NodeEndpointSource;
}

/**
 * The real runtime choice. `runtimePid` is the process whose ancestry names the runtime: absent
 * (the standalone plugin) = this process; the daemon passes the shim's pid from the request.
 */
const realChoice = (env: Readonly<Record<string, string | undefined>>, runtimePid: number | undefined, nodeEndpoint: NodeEndpointSource): RuntimeChoiceDeps => ({
  env,
  nodeEndpoint,
  identify: (pid) => {
    const start = pid ?? runtimePid;
    return identifyRuntime(start === undefined ? {} : { pid: start });
  },
  probe: async (url) => {
    try {
      await (await CriClient.connect(url, { timeoutSeconds: PROBE_TIMEOUT_SECONDS })).close();
      return true;
    } catch {
      return false;
    }
  },
  exists: existsSync,
});

/**
 * The runtime to ask for `conf` as an endpoint URL, or why there is none (a sentence for the
 * error's details). See the module comment for the order: `ipam.runtimeEndpoint`,
 * `CONTAINER_RUNTIME_ENDPOINT`, the ancestry, then — only when the ancestry finds none (several
 * answering sockets are ambiguity, not "none") — `deps.nodeEndpoint()`. A configured or recorded
 * socket that does not exist is no runtime (doctor reports it). Never throws.
 *
 * Details when there is none (exact texts): `no runtimeEndpoint is configured and the runtime that
 * ran this plugin could not be identified: <why>; nothing is reclaimed, as with host-local`, where
 * a record that is not used adds `; <why not>` after `<why>`, and a node endpoint whose socket is
 * missing adds `; the node's runtime endpoint <url> (<source>) does not exist`.
 */
export async function choosePluginEndpoint(conf: IPAMConfig, deps: RuntimeChoiceDeps): Promise<{ url: string } | { none: string }> {
  const configured = conf.runtimeEndpoint ?? (deps.env['CONTAINER_RUNTIME_ENDPOINT'] || null);
  if (configured !== null) {
    let ep;
    try {
      ep = parseRuntimeEndpoint(configured);
    } catch (e) {
      return { none: e instanceof Error ? e.message : String(e) };
    }
    return deps.exists(ep.path) ? { url: ep.url } : { none: `no CRI runtime at ${ep.url}: socket does not exist` };
  }
  // Walk up the ancestry: the first ancestor with a listening socket that answers as CRI. One
  // that listens but is not a runtime (a Multus daemon, kubelet, an ssh-agent) is passed over.
  let id = deps.identify();
  const passed: string[] = [];
  for (let hops = 0; id.candidates.length > 0 && id.ancestor !== null && hops < MAX_RUNTIME_HOPS; hops++) {
    const answering: string[] = [];
    for (const path of id.candidates) if (await deps.probe(`unix://${path}`)) answering.push(path);
    if (answering.length === 1) return { url: `unix://${answering[0] as string}` };
    const who = ` (${id.ancestor.comm}, pid ${id.ancestor.pid})`;
    if (answering.length > 1) {
      return {
        none: `no runtimeEndpoint is configured and the runtime that ran this plugin${who} answers as CRI on several sockets (${answering.join(', ')}): set the ipam key "runtimeEndpoint"; nothing is reclaimed, as with host-local`,
      };
    }
    passed.push(`${id.ancestor.comm} (pid ${id.ancestor.pid}) listens on ${id.candidates.join(', ')}, none answers as CRI`);
    id = deps.identify(id.ancestor.pid);
  }
  let why = passed.length === 0 ? id.reason : `${passed.join('; ')}; above: ${id.reason}`;
  // No runtime in the ancestry (a Multus thick daemon ran us): the node's configured runtime.
  const node = deps.nodeEndpoint?.() ?? null;
  if (node !== null && 'url' in node) {
    if (deps.exists(node.path)) return { url: node.url };
    why = `${why}; the node's runtime endpoint ${node.url} (${node.source}) does not exist`;
  } else if (node !== null) {
    why = `${why}; ${node.ignored}`;
  }
  return { none: `no runtimeEndpoint is configured and the runtime that ran this plugin could not be identified: ${why}; nothing is reclaimed, as with host-local` };
}

/** The CRI source for `conf` (see {@link choosePluginEndpoint}), or why there is none. */
export async function pluginRuntimeSource(conf: IPAMConfig, deps: RuntimeChoiceDeps): Promise<PodIPSource | string> {
  const c = await choosePluginEndpoint(conf, deps);
  return 'none' in c ? c.none : criSandboxSource(c.url, PLUGIN_CRI_TIMEOUT_SECONDS);
}

/**
 * Build the CRI- and kernel-backed hooks. `env` supplies CONTAINER_RUNTIME_ENDPOINT; `now` is ms
 * since the epoch; `evidence` reads the kernel (injected by tests); `runtimePid` is the process
 * whose ancestry identifies the runtime that ran the plugin (default: this process, as the
 * standalone plugin is that process; the daemon passes the pid of the shim that sent the request,
 * docs/daemon.md); `nodeEndpoint` is asked when that ancestry finds no runtime (default
 * {@link recordedNodeEndpoint}, the record beside the program; the daemon passes its own
 * `--runtime-endpoint`).
 */
export function criHeal(
  env: Readonly<Record<string, string | undefined>>,
  now: () => number = Date.now,
  evidence: EvidenceReader = () => readKernelEvidence(),
  runtimePid?: number,
  nodeEndpoint: NodeEndpointSource = recordedNodeEndpoint,
): HealHooks {
  return makeHeal({
    source: (conf) => pluginRuntimeSource(conf, realChoice(env, runtimePid, nodeEndpoint)),
    audit: (conf): AuditSink => {
      let sink: AuditSink | null = null;
      const get = (): AuditSink => (sink ??= openDefaultAuditLog(conf.dataDir));
      return {
        append: (rec) => get().append(rec),
        sync: () => get().sync(),
        open: () => void get(),
        close: () => sink?.close(),
      };
    },
    now,
    evidence,
  });
}
