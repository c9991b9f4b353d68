/**
 * Leak candidates of one node in a cluster pool (`ipwarden pool leaks`, the daemon's pool pass
 * and CNI GC on a pool network; docs/cluster.md): the node's handles classified by the evidence
 * rules of the node-local reconciler (docs/reconciler.md "Evidence rules"), as values. Pure: the
 * runtime's sandbox list, the kernel evidence, the etcd revision read before the runtime was
 * asked and the clock are passed in.
 *
 * Verdicts, first match wins:
 * - `unknown` — the runtime could not be asked, or the kernel evidence is incomplete: nothing can
 *   be judged a leak;
 * - `live` — the runtime lists the container's sandbox in any state;
 * - `in use` — the kernel shows one of its addresses configured, or a CNI operation of the
 *   container is running;
 * - `grace` — younger than the snapshot: its `create_revision` is above the revision `R` read
 *   before the runtime was asked (it did not exist when the runtime listed its sandboxes, so its
 *   ADD may be in flight). This is decided by etcd's revisions, never by a clock. With a
 *   wall-clock `graceSeconds` (only `pool leaks`, which has a single snapshot), also a handle
 *   whose `at` (the writer's clock) is younger than it — a listing aid, never a release rule;
 * - `leaked` — none of the above: a candidate. Classifying never releases anything; the daemon
 *   releases a candidate only after two observations a grace period apart on its monotonic clock
 *   with the same `mod_revision` (src/reconcile/pool-pass.ts).
 */
import type { HandleValue } from './model.ts';

/** One handle of the node, as read. */
export interface PoolHandleInput {
  readonly containerId: string;
  readonly ifname: string;
  readonly value: HandleValue;
  /** etcd `create_revision` of the handle key (decimal text); absent: the revision rule is not applied. */
  readonly createRevision?: string;
}

/** The verdict on one handle. */
export interface PoolLeakVerdict {
  readonly containerId: string;
  readonly ifname: string;
  readonly ips: readonly string[];
  /**
   * Seconds between the handle's `at` and the snapshot (negative when stamped in the future).
   * Information only: `at` is the writing process's clock, which steps.
   */
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
  /** When the runtime was asked, milliseconds since the epoch (for `ageSeconds` only, and the wall-clock grace). */
  readonly snapshotAtMs: number;
  /**
   * Wall-clock grace period on the handle's `at`, seconds; null: none (the daemon and GC decide
   * by revisions and the monotonic clock only).
   */
  readonly graceSeconds: number | null;
  /**
   * The etcd revision `R` read just before the runtime was asked (decimal text), or null when not
   * read. A handle whose `createRevision` is above it is `grace` (younger than the snapshot).
   */
  readonly revision?: string | null;
}

/** True when etcd revision `a` is greater than `b` (decimal texts of int64 counters). */
export function revisionAfter(a: string, b: string): boolean {
  return BigInt(a) > BigInt(b);
}

/** Classify every handle (in the order given). */
export function classifyPoolHandles(x: PoolLeakInputs): PoolLeakVerdict[] {
  const r = x.revision ?? null;
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
    if (r !== null && h.createRevision !== undefined && revisionAfter(h.createRevision, r)) {
      return { ...base, verdict: 'grace', reason: `created after the runtime was asked (create_revision ${h.createRevision} > ${r}): its ADD may be in flight` };
    }
    if (x.graceSeconds !== null && ageSeconds < x.graceSeconds) return { ...base, verdict: 'grace', reason: `younger than the grace period (${x.graceSeconds}s)` };
    return { ...base, verdict: 'leaked', reason: 'the runtime does not list its sandbox and the kernel shows its addresses nowhere' };
  });
}
