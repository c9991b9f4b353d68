/**
 * Phase 1 of a reconcile pass: the snapshot. Ask the runtime once — ListPodSandbox (any state)
 * and, when asked for, PodSandboxStatus of each READY sandbox for its pod IPs (field report
 * BR-13) — then read the kernel evidence. One snapshot serves every data directory and network
 * of the node: `planNetworks` (phase 2, `engine.ts`) takes it as a value.
 *
 * Order (ARCHITECTURE.md "Reconciler safety rules"): the snapshot time is taken BEFORE the runtime
 * is asked, and the snapshot before any network lock; the grace period is measured from
 * `snapshotAtMs`, so a file an in-flight ADD wrote before the list is protected.
 */
import { existsSync } from 'node:fs';
import { mapLimit } from '../common/concurrency.ts';
import { AppError, UsageError } from '../common/errors.ts';
import { readKernelEvidence } from '../node/kernel-evidence.ts';
import { DEFAULT_RUNTIME_ENDPOINTS, resolveRuntimeEndpoint } from '../runtime/endpoint.ts';
import type { UseEvidence } from './evidence.ts';
import { describeError as describe, POD_IP_CONCURRENCY, type ReconcileDeps } from './options.ts';
import type { SandboxIndex } from './plan.ts';
import { indexSandboxes, isSandboxNotFound, type SandboxSource, type SandboxSourceFactory } from './sandboxes.ts';
import type { SandboxPodIPs } from './unreserved.ts';

/** `runtime` of the JSON reports (docs/cli.md). `error` is present only when the runtime could not be asked. */
export interface RuntimeJson {
  /** The resolved endpoint URL, or the configured value / null when it could not be resolved. */
  endpoint: string | null;
  /** Number of sandboxes listed (any state), or null when the runtime could not be asked. */
  sandboxes: number | null;
  error?: string;
}

/** What {@link takeSnapshot} asks. */
export interface SnapshotOptions {
  /**
   * `--runtime-endpoint` as given (`unix:///path` or `/path`); absent or empty: the
   * `CONTAINER_RUNTIME_ENDPOINT` of `deps.env`, else the first default socket that exists.
   */
  readonly runtimeEndpoint?: string;
  /** Also ask the pod IPs of the READY sandboxes (BR-13; `leaks`, `gc`, the daemon). Default false. */
  readonly podIPs?: boolean;
  /**
   * When the endpoint came from the defaults, ask the other default sockets too and warn when
   * one answers (issue 7 case 1). Default true; `status`/`doctor` do not print the warnings.
   */
  readonly warnOtherRuntimes?: boolean;
}

/** The runtime's answer and the kernel evidence, at one instant. */
export interface Snapshot {
  readonly runtime: RuntimeJson;
  /** Listed sandboxes by ID with their state; null when the runtime could not be asked. */
  readonly sandboxes: SandboxIndex | null;
  /** Taken just before ListPodSandbox was sent, milliseconds since the Unix epoch. */
  readonly snapshotAtMs: number;
  /** Pod IPs of the READY sandboxes; null when not asked (option off, source without `podIPs`, runtime not reachable). */
  readonly podIPs: readonly SandboxPodIPs[] | null;
  /** READY sandboxes whose pod IPs could not be read (their addresses are unknown): one message each. */
  readonly podIPFailures: readonly string[];
  /** Diagnostics (one line each, without the `ipwarden: ` prefix). */
  readonly warnings: readonly string[];
  /** The kernel evidence, read after the runtime answered (before any lock). */
  readonly evidence: UseEvidence;
}

/** The CRI-backed sandbox source (the CRI client is loaded only when no fake is injected). */
export const criSandboxSource: SandboxSourceFactory = (endpoint) => {
  let real: SandboxSource | null = null;
  const load = async (): Promise<SandboxSource> => (real ??= (await import('./cri-source.ts')).criSandboxSource(endpoint));
  return {
    endpoint,
    list: async () => (await load()).list(),
    podIPs: async (id) => {
      const src = await load();
      if (src.podIPs === undefined) throw new AppError('INTERNAL', 'the CRI sandbox source cannot tell pod IPs');
      return src.podIPs(id);
    },
    close: async () => {
      await real?.close?.();
    },
  };
};

/**
 * The pod IPs of the READY sandboxes, {@link POD_IP_CONCURRENCY} PodSandboxStatus calls at a
 * time. A sandbox the runtime says is gone (NOT_FOUND) is skipped with a warning; any other
 * failure is recorded in `failures` (issue 7: never silently; the run exits 1, and without
 * complete kernel evidence nothing is released).
 */
async function readyPodIPs(
  podIPs: (id: string) => Promise<string[]>,
  ids: readonly string[],
  failures: string[],
  warnings: string[],
): Promise<SandboxPodIPs[]> {
  const got = await mapLimit(ids, POD_IP_CONCURRENCY, async (id): Promise<SandboxPodIPs | null> => {
    try {
      return { sandbox: id, ips: await podIPs(id) };
    } catch (e) {
      // Removed since the list: it uses no address any more.
      if (isSandboxNotFound(e)) warnings.push(`pod IPs of sandbox ${id} not checked: ${describe(e)}`);
      else failures.push(`pod IPs of ready sandbox ${id} could not be read: ${describe(e)}`);
      return null;
    }
  });
  return got.filter((x): x is SandboxPodIPs => x !== null);
}

/** The runtime part of the snapshot (no evidence yet). */
type RuntimeAnswer = Omit<Snapshot, 'evidence'>;

async function askRuntime(opts: SnapshotOptions, deps: ReconcileDeps): Promise<RuntimeAnswer> {
  let endpoint: string;
  // Taken from the crictl defaults rather than a flag or CONTAINER_RUNTIME_ENDPOINT: say when another default answers too.
  const guessed = (opts.runtimeEndpoint ?? '') === '' && (deps.env['CONTAINER_RUNTIME_ENDPOINT'] ?? '') === '';
  try {
    endpoint = resolveRuntimeEndpoint(opts.runtimeEndpoint, deps.env).url;
  } catch (e) {
    if (e instanceof AppError && e.code === 'USAGE') throw new UsageError(`--runtime-endpoint: ${e.message}`);
    return {
      runtime: { endpoint: opts.runtimeEndpoint ?? null, sandboxes: null, error: describe(e) },
      sandboxes: null,
      snapshotAtMs: deps.now(),
      podIPs: null,
      podIPFailures: [],
      warnings: [],
    };
  }
  // The snapshot time is taken BEFORE the runtime is asked: a file written before this instant
  // by an ADD still in flight is protected by the grace period, measured from here.
  const snapshotAtMs = deps.now();
  let source: SandboxSource | undefined;
  try {
    source = (deps.sandboxSource ?? criSandboxSource)(endpoint);
    const list = await source.list();
    const warnings: string[] = [];
    const podIPFailures: string[] = [];
    let podIPs: SandboxPodIPs[] | null = null;
    const src = source;
    if (opts.podIPs === true && src.podIPs !== undefined) {
      const ready = list.filter((s) => s.state === 'ready').map((s) => s.id);
      podIPs = await readyPodIPs((id) => (src.podIPs as (id: string) => Promise<string[]>).call(src, id), ready, podIPFailures, warnings);
    }
    if (guessed && opts.warnOtherRuntimes !== false) warnings.push(...(await otherRuntimes(endpoint, deps)));
    return { runtime: { endpoint: source.endpoint, sandboxes: list.length }, sandboxes: indexSandboxes(list), snapshotAtMs, podIPs, podIPFailures, warnings };
  } catch (e) {
    return { runtime: { endpoint, sandboxes: null, error: describe(e) }, sandboxes: null, snapshotAtMs, podIPs: null, podIPFailures: [], warnings: [] };
  } finally {
    try {
      await source?.close?.();
    } catch {
      // the list is already in hand
    }
  }
}

/**
 * Warnings for the other default sockets (crictl's list) that also answer as a CRI runtime, when
 * the endpoint was taken from the defaults: the operator must choose (issue 7, case 1: an idle
 * containerd beside CRI-O lists none of the pods).
 */
async function otherRuntimes(chosen: string, deps: ReconcileDeps): Promise<string[]> {
  const exists = deps.socketExists ?? existsSync;
  const out: string[] = [];
  for (const path of DEFAULT_RUNTIME_ENDPOINTS) {
    const url = `unix://${path}`;
    if (url === chosen || !exists(path)) continue;
    const src = (deps.sandboxSource ?? criSandboxSource)(url);
    try {
      const n = (await src.list()).length;
      out.push(`more than one CRI runtime answers: ${chosen} (asked) and ${url} (${n} sandbox${n === 1 ? '' : 'es'}); pass --runtime-endpoint to choose`);
    } catch {
      // not a runtime: nothing to say
    } finally {
      try {
        await src.close?.();
      } catch {
        // the answer is in hand
      }
    }
  }
  return out;
}

/**
 * Take the snapshot: resolve the endpoint, note the time, ask the runtime (list, then the READY
 * sandboxes' pod IPs when `opts.podIPs`), then read the kernel evidence (`deps.evidence`).
 * Never throws for runtime problems: they become `runtime.error` and a null `sandboxes`.
 * Throws `UsageError('--runtime-endpoint: …')` for a malformed endpoint, and whatever
 * `deps.evidence` throws (the real reader reports problems as `incomplete` instead).
 */
export async function takeSnapshot(opts: SnapshotOptions, deps: ReconcileDeps): Promise<Snapshot> {
  const answer = await askRuntime(opts, deps); // first the runtime...
  const evidence = await (deps.evidence ?? (() => readKernelEvidence()))(); // ...then the kernel
  return { ...answer, evidence };
}
