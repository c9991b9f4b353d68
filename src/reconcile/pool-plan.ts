/**
 * The one planner of a node's pool handles, shared by `ipwarden pool leaks` (src/cli/pool.ts) and
 * the daemon's pool pass (src/reconcile/pool-pass.ts), so the two judge a handle the same way
 * from the same inputs (docs/cluster.md "`ipwarden pool leaks`", "Reconcile per node"). Pure over
 * one runtime snapshot: the verdicts are src/pool/leaks.ts's (`classifyPoolHandles`) with the
 * kernel evidence and the READY sandboxes' pod IPs (BR-13) as the in-use evidence.
 */
import { formatIP, parseIP } from '../common/ip.ts';
import { classifyPoolHandles, type PoolHandleEntry, type PoolLeakVerdict } from '../pool/index.ts';
import { inUseReason, type UseEvidence } from './evidence.ts';
import type { SandboxIndex } from './plan.ts';
import type { Snapshot } from './snapshot.ts';

/** The runtime's sandbox list as the verdicts name the states (`not ready`; `listed` for a source without states), or null when the runtime could not be asked. */
export function sandboxMap(sb: SandboxIndex | null): ReadonlyMap<string, string> | null {
  if (sb === null) return null;
  if (sb instanceof Map) return new Map([...sb].map(([id, st]) => [id, String(st).replace('notready', 'not ready')]));
  return new Map([...(sb as ReadonlySet<string>)].map((id) => [id, 'listed']));
}

/**
 * The in-use test of a snapshot: why `ip` of container `id` is in use by the kernel evidence `ev`
 * (src/reconcile/evidence.ts `inUseReason`), else when a READY sandbox other than `id` reports it
 * in PodSandboxStatus (BR-13: in use whoever's handle holds it — `the address is reported by ready
 * sandbox <id> (PodSandboxStatus)`), else null. `ev` is a parameter so that the daemon can apply
 * the same test to the kernel evidence it reads again just before a release.
 */
export function poolInUse(snap: Pick<Snapshot, 'podIPs'>): (ev: UseEvidence, ip: string, id: string) => string | null {
  const reported = new Map<string, string>();
  for (const x of snap.podIPs ?? []) {
    for (const t of x.ips) {
      const a = parseIP(t);
      if (a !== null) reported.set(formatIP(a), x.sandbox);
    }
  }
  return (ev, ip, id) => {
    const k = inUseReason(ev, ip, id);
    if (k !== null) return k;
    const by = reported.get(ip);
    return by === undefined || by === id ? null : `the address is reported by ready sandbox ${by} (PodSandboxStatus)`;
  };
}

/** The plan of one node's handles in one pool. */
export interface PoolPlan {
  /** One verdict per handle, in the order given. */
  readonly verdicts: PoolLeakVerdict[];
  /**
   * Whether a `leaked` verdict may be a release candidate: false when a READY sandbox's pod IPs
   * could not be read (`snap.podIPFailures`: its addresses are unknown), so nothing is a candidate.
   */
  readonly candidates: boolean;
}

/**
 * Judge `handles` (the node's, of one pool) against one snapshot. `revision` is etcd's revision
 * read before the runtime was asked (a handle created after it is `grace`); `graceSeconds` the
 * wall-clock listing aid of `pool leaks` (null for the daemon). Pure.
 */
export function planPoolHandles(snap: Snapshot, handles: readonly PoolHandleEntry[], revision: string | null, graceSeconds: number | null): PoolPlan {
  const inUse = poolInUse(snap);
  const verdicts = classifyPoolHandles({
    handles,
    sandboxes: sandboxMap(snap.sandboxes),
    runtimeError: snap.runtime.error ?? null,
    inUse: (ip, id) => inUse(snap.evidence, ip, id),
    evidenceIncomplete: snap.evidence.incomplete,
    snapshotAtMs: snap.snapshotAtMs,
    graceSeconds,
    revision,
  });
  return { verdicts, candidates: snap.podIPFailures.length === 0 };
}
