/**
 * Leak candidates of one node in a cluster pool (`ipwarden pool leaks`, docs/cluster.md): the
 * node's handles classified by the evidence rules of the node-local reconciler
 * (docs/reconciler.md "Evidence rules"), as values. Pure: the runtime's sandbox list, the kernel
 * evidence and the clock are passed in.
 *
 * Verdicts, first match wins:
 * - `unknown` — the runtime could not be asked, or the kernel evidence is incomplete: nothing can
 *   be judged a leak;
 * - `live` — the runtime lists the container's sandbox in any state;
 * - `in use` — the kernel shows one of its addresses configured, or a CNI operation of the
 *   container is running;
 * - `grace` — younger than the grace period at the snapshot (its ADD may still be in flight);
 * - `leaked` — none of the above: a candidate. Listing never releases anything.
 */
import type { HandleValue } from './pool-allocator.ts';

/** One handle of the node, as read. */
export interface PoolHandleInput {
  readonly containerId: string;
  readonly ifname: string;
  readonly value: HandleValue;
}

/** The verdict on one handle. */
export interface PoolLeakVerdict {
  readonly containerId: string;
  readonly ifname: string;
  readonly ips: readonly string[];
  /** Seconds between the handle's `at` and the snapshot (negative when stamped in the future). */
  readonly ageSeconds: number;
  readonly verdict: 'live' | 'in use' | 'grace' | 'leaked' | 'unknown';
  readonly reason: string;
}

/** Inputs of {@link classifyPoolHandles}. */
export interface PoolLeakInputs {
  readonly handles: readonly PoolHandleInput[];
  /** Sandbox ID → state as the runtime lists them; null when it could not be asked (`runtimeError` says why). */
  readonly sandboxes: ReadonlyMap<string, string> | null;
  readonly runtimeError: string | null;
  /** Why the kernel says `ip` of `containerId` is in use, or null (src/reconcile/evidence.ts `inUseReason`). */
  readonly inUse: (ip: string, containerId: string) => string | null;
  /** null when the kernel evidence is complete, else why not. */
  readonly evidenceIncomplete: string | null;
  /** When the runtime was asked, milliseconds since the epoch. */
  readonly snapshotAtMs: number;
  /** Grace period, seconds. */
  readonly graceSeconds: number;
}

/** Classify every handle (in the order given). */
export function classifyPoolHandles(x: PoolLeakInputs): PoolLeakVerdict[] {
  return x.handles.map((h) => {
    const ips = h.value.ips.map((i) => i.ip);
    const ageSeconds = (x.snapshotAtMs - h.value.at) / 1000;
    const base = { containerId: h.containerId, ifname: h.ifname, ips, ageSeconds };
    if (x.sandboxes === null) return { ...base, verdict: 'unknown', reason: `the runtime could not be asked: ${x.runtimeError ?? 'unknown error'}` };
    if (x.evidenceIncomplete !== null) return { ...base, verdict: 'unknown', reason: `kernel evidence incomplete: ${x.evidenceIncomplete}` };
    const state = x.sandboxes.get(h.containerId);
    if (state !== undefined) return { ...base, verdict: 'live', reason: `sandbox is listed by the runtime (${state})` };
    for (const ip of ips) {
      const why = x.inUse(ip, h.containerId);
      if (why !== null) return { ...base, verdict: 'in use', reason: `${ip}: ${why}` };
    }
    if (ageSeconds < x.graceSeconds) return { ...base, verdict: 'grace', reason: `younger than the grace period (${x.graceSeconds}s)` };
    return { ...base, verdict: 'leaked', reason: 'the runtime does not list its sandbox and the kernel shows its addresses nowhere' };
  });
}
