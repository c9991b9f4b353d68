/**
 * One reconcile pass of the daemon over every network of the node (issue 9), built from the
 * engine's phases (`takeSnapshot` → `planNetworks` → `applyNetworkPlan`) plus the daemon's own
 * release rules ({@link Confirmations}: two observations a grace period apart, a per-pass cap,
 * a runtime list sharing no owner not trusted alone).
 *
 * Which networks: every network directory of every data directory the CNI configurations name
 * (host-local compatible IPAM sections: `host-local` and `ipwarden`), of `--data-dir`, and of
 * host-local's default when neither names one — so a node still running upstream host-local is
 * healed with no change to its CNI configuration.
 *
 * Every release still goes through `applyNetworkPlan`: the kernel evidence read again under each
 * network's lock, the owner re-read, the intent audited before the file is removed.
 */
import { join } from 'node:path';
import { describeError, type ReconcileDeps } from './options.ts';
import { rangeSetSize } from '../ipam/range.ts';
import { applyNetworkPlan, planNetworks, type NetworkPlan } from './engine.ts';
import { discoverNetworks, namedNetwork, type NetworkDir } from './networks.ts';
import type { Policy } from './plan.ts';
import type { AnyVerdict, PlanEntry } from './plan.ts';
import { takeSnapshot, type Snapshot } from './snapshot.ts';
import { layoutNetworks, splitByRangeSet, type Layout, type NetworkLayout } from './status.ts';
import { Confirmations, type Candidate } from './confirm.ts';

/** Parsed options of a pass (the daemon's flags). */
export interface PassOptions {
  /** `--data-dir`: reconciled in addition to the data directories the configurations name. */
  readonly dataDir: string;
  readonly cniConfDir: string;
  /** Only this network, or null for all. */
  readonly network: string | null;
  /** `--runtime-endpoint`, or null for `CONTAINER_RUNTIME_ENDPOINT` / the defaults. */
  readonly runtimeEndpoint: string | null;
  /** Grace period, seconds. */
  readonly graceSeconds: number;
  readonly policy: Policy;
  /** Audit log, or null for `<dataDir>/.ipwarden-audit.log` of each data directory. */
  readonly auditLog: string | null;
  /** Seconds to wait for a network's lock (the pass must not hold up pods for long). */
  readonly lockTimeoutSeconds: number;
}

/** Address counts of one range set (the metrics' states). */
export interface RangeSetCounts {
  readonly network: string;
  readonly dataDir: string;
  readonly rangeSet: number;
  /** `start-end[,…]` (host-local's text). */
  readonly range: string;
  readonly capacity: number;
  readonly live: number;
  readonly grace: number;
  readonly leaked: number;
  readonly corrupt: number;
  readonly unknown: number;
  readonly free: number;
}

/** One release the pass did. */
export interface PassRelease {
  readonly network: string;
  readonly dataDir: string;
  readonly ip: string;
  readonly containerId: string | null;
  readonly ifname: string | null;
  readonly ageSeconds: number;
  /** The verdict that allowed it: `leaked`, `corrupt`, `notready`. */
  readonly reason: AnyVerdict;
}

/** A failure during the pass. `kind`: runtime, kernel, config, list, lock, release, audit. */
export interface PassError {
  readonly kind: string;
  readonly message: string;
  readonly network?: string;
}

/** What one pass found and did. */
export interface PassReport {
  readonly startedAtMs: number;
  readonly durationSeconds: number;
  readonly runtime: Snapshot['runtime'];
  /** Null when the kernel evidence was complete, else why not (then nothing is released). */
  readonly evidenceIncomplete: string | null;
  readonly rangeSets: readonly RangeSetCounts[];
  /** Releasable reservations not released this pass, per network name. */
  readonly candidates: ReadonlyMap<string, number>;
  readonly released: readonly PassRelease[];
  /** Why the daemon released nothing this pass although candidates were confirmed, else null. */
  readonly held: string | null;
  /**
   * Network directories (`<dataDir>/<name>`) with a range set that was full when the pass read
   * them (before its releases).
   */
  readonly fullNetworks: readonly string[];
  /**
   * Milliseconds until a waiting candidate of a full range set can be confirmed (its
   * `min(grace, 30 s)` since the first observation, confirm.ts), or null: when to run the
   * confirming pass (issue 19 "heal on arrival").
   */
  readonly confirmDueInMs: number | null;
  /** Candidates seen for less than the grace period (rule 1: first observation, or too recent). */
  readonly waiting: number;
  /** Confirmed candidates not released this pass (over the cap, or held by rule 3). */
  readonly deferred: number;
  readonly errors: readonly PassError[];
  /** Networks read (data dir + name). */
  readonly networks: number;
}

/** The data directories to reconcile and the configured networks (for range sets). */
function layoutFor(o: PassOptions, errors: PassError[]): { dataDirs: string[]; configured: NetworkLayout[] } {
  let layout: Layout | null = null;
  try {
    layout = layoutNetworks({ cniConfDir: o.cniConfDir });
    for (const e of layout.configErrors) errors.push({ kind: 'config', message: `${e.file}: ${e.error}` });
  } catch (e) {
    errors.push({ kind: 'config', message: `cannot read the CNI configurations in ${o.cniConfDir}: ${describeError(e)}` });
  }
  const dataDirs = new Set<string>(layout?.dataDirs ?? []);
  dataDirs.add(o.dataDir);
  const configured = (layout?.networks ?? []).filter((n) => n.config !== null && (o.network === null || n.name === o.network));
  return { dataDirs: [...dataDirs].sort(), configured };
}

/** The reservation text of an entry's owner, for the confirmation key. */
function ownerText(e: PlanEntry<AnyVerdict>): string {
  return e.owner === null ? '<corrupt>' : `${e.owner.containerId}\r\n${e.owner.ifname ?? ''}`;
}

type CandidateEntry = Candidate & { readonly entry: PlanEntry<AnyVerdict>; readonly dataDir: string };

/**
 * Run one pass. Never throws for the runtime, the kernel, a network or the audit log: each
 * failure is in `errors` and the pass goes on with what is safe (a failed runtime or incomplete
 * kernel evidence releases nothing — the plan's verdicts are then `unknown`).
 * @param confirmations the daemon's memory across passes (rule 1 and 2 of confirm.ts).
 * @param deps the engine's injected I/O (runtime source, kernel evidence reader, clock, stores).
 * @param monotonic milliseconds of a monotonic clock, for the two-observation rule (tests inject).
 * @param shared the daemon's one snapshot of the pass (shared with the pool pass), else one is taken here.
 */
export async function runPass(
  o: PassOptions,
  confirmations: Confirmations,
  deps: ReconcileDeps,
  monotonic: () => number = () => performance.now(),
  shared?: Snapshot,
): Promise<PassReport> {
  const startedAtMs = deps.now();
  const t0 = process.hrtime.bigint();
  const errors: PassError[] = [];
  const { dataDirs, configured } = layoutFor(o, errors);

  // 1. The runtime first, then the kernel (inside takeSnapshot), then the locks.
  const snap = shared ?? (await takeSnapshot({ ...(o.runtimeEndpoint === null ? {} : { runtimeEndpoint: o.runtimeEndpoint }), podIPs: true, warnOtherRuntimes: false }, deps));
  if (snap.runtime.error !== undefined) errors.push({ kind: 'runtime', message: snap.runtime.error });
  if (snap.evidence.incomplete !== null) errors.push({ kind: 'kernel', message: `kernel evidence incomplete: ${snap.evidence.incomplete}` });

  // 2. Plan every data directory against the one snapshot.
  const plans: NetworkPlan[] = [];
  let networksRead = 0;
  for (const dataDir of dataDirs) {
    let networks: NetworkDir[];
    try {
      networks = o.network === null ? discoverNetworks(dataDir) : [namedNetwork(dataDir, o.network)];
    } catch (e) {
      // namedNetwork throws when the directory does not exist here: nothing to do in this data dir.
      if (o.network === null) errors.push({ kind: 'list', message: describeError(e) });
      continue;
    }
    if (networks.length === 0) continue;
    try {
      const np = await planNetworks(dataDir, networks, snap, { graceSeconds: o.graceSeconds, policy: o.policy, cniConfDir: o.cniConfDir, lockTimeoutSeconds: o.lockTimeoutSeconds }, deps);
      plans.push(np);
      networksRead += networks.length;
    } catch (e) {
      errors.push({ kind: 'list', message: `${dataDir}: ${describeError(e)}` });
    }
  }

  // 3. The daemon's rules over every candidate of the node.
  const candidates: CandidateEntry[] = plans.flatMap((np) =>
    np.plan.release.map((entry) => ({ network: join(np.dataDir, entry.network), ip: entry.ip, owner: ownerText(entry), mtimeMs: entry.mtimeMs, entry, dataDir: np.dataDir })),
  );
  const owned = new Set<string>();
  for (const np of plans) for (const e of np.plan.entries) if (e.verdict === 'live' || e.verdict === 'notready') owned.add(join(np.dataDir, e.network));
  // A network with a full range set (counted before any release) confirms sooner (confirm.ts
  // FULL_CONFIRM_MAX_SECONDS), and the loop schedules that confirming pass.
  const fullNetworks = countRangeSets(plans, configured, new Set()).filter((r) => r.free === 0).map((r) => join(r.dataDir, r.network));
  const full = new Set(fullNetworks);
  const decision = confirmations.observe(candidates, monotonic(), (network) => owned.has(network), (network) => full.has(network));
  const toRelease = new Set(decision.release.map((c) => c.entry));

  // 4. Apply: releases (re-checked under the lock), restamps, re-reserves.
  const released: PassRelease[] = [];
  const releasedKeys = new Set<string>();
  for (const np of plans) {
    const release = np.plan.release.filter((e) => toRelease.has(e));
    const keep = [...np.plan.keep, ...np.plan.release.filter((e) => !toRelease.has(e))];
    try {
      const { applied } = await applyNetworkPlan(
        { ...np, plan: { ...np.plan, release, keep } },
        { ...(o.auditLog === null ? {} : { auditLog: o.auditLog }), lockTimeoutSeconds: o.lockTimeoutSeconds },
        deps,
      );
      for (const e of applied.released) {
        confirmations.forget(join(np.dataDir, e.network), e.ip);
        releasedKeys.add(`${np.dataDir}\0${e.network}\0${e.ip}`);
        released.push({ network: e.network, dataDir: np.dataDir, ip: e.ip, containerId: e.containerId, ifname: e.ifname, ageSeconds: e.ageSeconds, reason: e.verdict });
      }
      for (const err of applied.errors) errors.push({ kind: err.ip === null ? 'lock' : 'release', message: err.message, network: err.network });
      if (applied.auditBroken === true) errors.push({ kind: 'audit', message: 'the audit log cannot be written: nothing further released' });
    } catch (e) {
      errors.push({ kind: 'audit', message: `${np.dataDir}: ${describeError(e)}` });
    }
  }

  // 5. Counts per configured range set, after the releases.
  const rangeSets = countRangeSets(plans, configured, releasedKeys);

  const pending = new Map<string, number>();
  for (const c of [...decision.deferred, ...decision.waiting]) pending.set(c.entry.network, (pending.get(c.entry.network) ?? 0) + 1);
  for (const c of decision.release) {
    if (!releasedKeys.has(`${c.dataDir}\0${c.entry.network}\0${c.entry.ip}`)) pending.set(c.entry.network, (pending.get(c.entry.network) ?? 0) + 1);
  }
  return {
    startedAtMs,
    durationSeconds: Number(process.hrtime.bigint() - t0) / 1e9,
    runtime: snap.runtime,
    evidenceIncomplete: snap.evidence.incomplete,
    rangeSets,
    candidates: pending,
    released,
    held: decision.held,
    fullNetworks: [...full].sort(),
    confirmDueInMs: decision.urgentDueInMs,
    waiting: decision.waiting.length,
    deferred: decision.deferred.length,
    errors,
    networks: networksRead,
  };
}

/**
 * Counts per configured range set of `configured` from the plans' entries, leaving out the
 * entries in `excluded` (`<dataDir>\0<network>\0<ip>`, the ones the pass released). A NOT READY
 * entry counts like a leak (released by policy `reclaim-notready`).
 */
function countRangeSets(plans: readonly NetworkPlan[], configured: readonly NetworkLayout[], excluded: ReadonlySet<string>): RangeSetCounts[] {
  const entriesOf = new Map<string, PlanEntry<AnyVerdict>[]>();
  for (const np of plans) {
    for (const e of np.plan.entries) {
      if (excluded.has(`${np.dataDir}\0${e.network}\0${e.ip}`)) continue;
      const k = `${np.dataDir}\0${e.network}`;
      let list = entriesOf.get(k);
      if (list === undefined) entriesOf.set(k, (list = []));
      list.push(e.verdict === 'notready' ? { ...e, verdict: 'leaked' } : e);
    }
  }
  const out: RangeSetCounts[] = [];
  for (const n of configured) {
    const rs = n.config?.ipam?.rangeSets ?? [];
    const { sets } = splitByRangeSet(rs, (entriesOf.get(`${n.dataDir}\0${n.name}`) ?? []) as PlanEntry[]);
    for (const s of sets) {
      const c = s.counts;
      out.push({
        network: n.name,
        dataDir: n.dataDir,
        rangeSet: s.index,
        range: s.range,
        capacity: clamp(rangeSetSize(s.rangeSet)),
        live: c.live,
        grace: c.grace,
        leaked: c.leaked,
        corrupt: c.corrupt,
        unknown: c.unknown,
        free: clamp(s.free),
      });
    }
  }
  return out;
}

/** A bigint count as a number for the metrics (an IPv6 /64 exceeds 2^53: clamped). */
function clamp(n: bigint): number {
  return n > BigInt(Number.MAX_SAFE_INTEGER) ? Number.MAX_SAFE_INTEGER : Number(n);
}
