/**
 * The reconciler's pure diff (house style 11; ARCHITECTURE.md "Reconciler safety rules"): from
 * the reservations found on disk, the pod sandboxes the container runtime lists, the time the
 * runtime was asked and a grace period, decide for every reservation whether it is `live`,
 * `grace`, `leaked`, `corrupt` or `unknown`, and which ones may be released.
 *
 * No I/O here: the caller takes the runtime snapshot, reads the stores and applies the plan
 * (`apply.ts`), which re-classifies every entry under the store lock with {@link classify}.
 *
 * Rules, each from a real duplicate-IP incident (field reports BR-13, BR-22):
 * - live: the owner's container ID is a sandbox ID the runtime lists, in ANY state (ready or not
 *   ready). Matching is on the full ID only, never by pod name or IP. Legacy ID-only records
 *   (`ifname: null`) match by ID too.
 * - notready (only with policy `reclaim-notready`, BR-22): the owner is a sandbox the runtime
 *   lists as NOT READY and the file's mtime is strictly before `snapshotAt − grace`. Released.
 *   A READY sandbox's reservation is live under every policy; so is one whose state is not known
 *   (a `Set` index).
 * - grace: not listed, but the file is not older than `snapshotAt − grace` (an ADD in flight is
 *   not listed by the runtime until RunPodSandbox returns).
 * - leaked: not listed, and the file's mtime is strictly before `snapshotAt − grace`.
 * - corrupt: the record is empty or unparseable (`owner === null`). Released whatever its age:
 *   every writer holds the network lock while writing, and apply re-reads under that lock.
 * - unknown: the runtime could not be asked (`sandboxes === null`); kept. Only corrupt records
 *   are released then. Also the verdict of every would-be release when the kernel evidence is
 *   incomplete (issue 7: an address in a namespace we could not see may be in use).
 * - inuse: a would-be release (leaked, corrupt, notready) whose address is configured on an
 *   interface in some network namespace of the node, or whose container has a CNI operation
 *   running right now (kernel evidence, `evidence.ts`). Kept, whatever the runtime and the clocks
 *   say: this is what makes a forward clock step, a runtime that lists nothing, short IDs or a
 *   neighbour's containers harmless.
 *
 * Time (docs/reconciler.md "Time"): ages are wall clock (`snapshotAt − mtime`). A file stamped
 * more than {@link FUTURE_TOLERANCE_MS} after the snapshot (the clock was stepped back since it
 * was written) is `grace` with its own reason; the reconciler restamps it under the lock
 * (`Store.touch`), so its grace period runs from when it was first seen, not for hours.
 */
import type { Owner } from '../store/store.ts';
import { inUseReason, type UseEvidence } from './evidence.ts';
import { parseIP } from '../common/ip.ts';
import type { IP } from '../common/ip.ts';

/**
 * Verdict of one reservation under the default `conservative` policy. `unknown` only occurs when
 * the runtime could not be asked. It is the default type parameter of {@link PlanEntry} and
 * {@link Plan}, so code that only ever sees conservative plans (status, doctor, the HTML page)
 * stays exhaustive over its verdicts.
 */
export type Verdict = 'live' | 'inuse' | 'grace' | 'leaked' | 'corrupt' | 'unknown';

/** Every verdict: {@link Verdict} plus `notready`, which only the `reclaim-notready` policy gives. */
export type AnyVerdict = Verdict | 'notready';

/** The verdicts in report order (summary lines, counts). */
export const VERDICTS: readonly AnyVerdict[] = ['live', 'inuse', 'grace', 'leaked', 'corrupt', 'notready', 'unknown'];

/**
 * How far after the snapshot a file's mtime may lie before it counts as stamped in the future,
 * milliseconds: a file rewritten while a long `gc` runs, the writer's coarse clock and a clock
 * slewed by NTP stay within it; a step back of more does not (one of less only delays a release
 * by that much).
 */
export const FUTURE_TOLERANCE_MS = 60_000;

/**
 * What the reconciler may release besides unowned reservations (field report BR-22):
 * - `conservative` (default): a reservation of any listed sandbox is live, ready or not;
 * - `reclaim-notready`: a reservation of a sandbox listed as NOT READY whose file is older than
 *   the grace period is `notready` and released (its DEL failed; the sandbox holds no working
 *   network). A READY sandbox's reservation is never released under any policy.
 */
export type Policy = 'conservative' | 'reclaim-notready';

/** The policies, default first. */
export const POLICIES: readonly Policy[] = ['conservative', 'reclaim-notready'];

/** State of a pod sandbox as the runtime reports it (CRI `PodSandboxState`). */
export type SandboxState = 'ready' | 'notready';

/**
 * The sandboxes the runtime lists, by full sandbox ID. A Map also gives each one's state, used
 * only in the reason text; a Set is enough for the verdicts. null = the runtime could not be
 * asked.
 */
export type SandboxIndex = ReadonlySet<string> | ReadonlyMap<string, SandboxState>;

/** One reservation as read from a store, tagged with its network. */
export interface ReservationInput {
  /** Network name (`<dataDir>/<network>`). */
  readonly network: string;
  /** The network directory, for reports. */
  readonly dir: string;
  /** Canonical IP text (the file name). */
  readonly ip: string;
  /** The owner, or null for a corrupt record. */
  readonly owner: Owner | null;
  /** File mtime, milliseconds since the Unix epoch. */
  readonly mtimeMs: number;
}

/** Input of {@link plan}. */
export interface PlanInput {
  readonly reservations: readonly ReservationInput[];
  /** Sandbox IDs the runtime lists (any state), or null when it could not be asked. */
  readonly sandboxes: SandboxIndex | null;
  /**
   * When the runtime snapshot was taken (just BEFORE ListPodSandbox was sent), milliseconds since
   * the Unix epoch. Ages are measured from it.
   */
  readonly snapshotAtMs: number;
  /** Grace period, seconds (≥ 0, may be fractional). */
  readonly graceSeconds: number;
  /** Release policy (default `conservative`). */
  readonly policy?: Policy;
  /**
   * What the kernel says is in use (required: every plan that may release must have consulted
   * it; tests pass `NOTHING_IN_USE`). Incomplete evidence releases nothing.
   */
  readonly evidence: UseEvidence;
}

/** What {@link classify} needs besides the record: a {@link Plan} is one. */
export interface ClassifyContext {
  readonly sandboxes: SandboxIndex | null;
  readonly snapshotAtMs: number;
  readonly graceSeconds: number;
  readonly policy: Policy;
  readonly evidence: UseEvidence;
}

/**
 * One classified reservation. `V` is the set of verdicts it may hold: {@link Verdict} by
 * default, {@link AnyVerdict} for plans made with any policy.
 */
export interface PlanEntry<V extends AnyVerdict = Verdict> {
  readonly network: string;
  readonly dir: string;
  readonly ip: string;
  /** The owner as read (null when corrupt); apply releases only if it is unchanged. */
  readonly owner: Owner | null;
  /** Owner's container ID, or null for a corrupt record. */
  readonly containerId: string | null;
  /** Owner's interface, or null for a corrupt or legacy ID-only record. */
  readonly ifname: string | null;
  readonly mtimeMs: number;
  /** (snapshotAt − mtime) in seconds, rounded to the millisecond; negative when mtime is later. */
  readonly ageSeconds: number;
  readonly verdict: V;
  /** A short human sentence explaining the verdict. */
  readonly reason: string;
}

/** Counts of a plan, for summaries and metrics. */
export interface PlanCounts {
  /** Number of reservations considered. */
  readonly allocated: number;
  readonly live: number;
  /** Would-be releases kept because the kernel says the address (or its container) is in use. */
  readonly inuse: number;
  readonly grace: number;
  readonly leaked: number;
  readonly corrupt: number;
  /** Reservations of NOT READY sandboxes released by policy `reclaim-notready` (0 otherwise). */
  readonly notready: number;
  readonly unknown: number;
  /** Reservations that nobody owns and are released: leaked + corrupt (not `notready`: owned). */
  readonly orphaned: number;
}

/**
 * Result of {@link plan}. Every array is sorted by network, then IP numerically. `V` as in
 * {@link PlanEntry}.
 */
export interface Plan<V extends AnyVerdict = Verdict> {
  /** Every reservation with its verdict. */
  readonly entries: readonly PlanEntry<V>[];
  /** Entries to release: verdict `leaked`, `corrupt` or `notready`. */
  readonly release: readonly PlanEntry<V>[];
  /** Entries to keep: `live`, `inuse`, `grace`, `unknown`. */
  readonly keep: readonly PlanEntry<V>[];
  /**
   * Listed sandbox IDs that own none of the given reservations, sorted. Informational only: a
   * host-network pod or a pod on another network has none (BR-13 reports this case; the plan
   * never acts on it). Empty when the runtime could not be asked.
   */
  readonly orphans: readonly string[];
  readonly counts: PlanCounts;
  /** The inputs apply needs to re-classify under the lock. */
  readonly sandboxes: SandboxIndex | null;
  readonly snapshotAtMs: number;
  readonly graceSeconds: number;
  /** The policy the entries were classified with (apply re-classifies with the same one). */
  readonly policy: Policy;
  /** The kernel evidence the entries were classified with (apply re-reads it under the lock). */
  readonly evidence: UseEvidence;
}

/** Reason texts (stable: tests and docs quote them). */
export const REASONS = {
  live: 'sandbox is listed by the runtime',
  liveReady: 'sandbox is listed by the runtime (ready)',
  liveNotReady: 'sandbox is listed by the runtime (not ready)',
  legacySuffix: '; legacy ID-only record',
  grace: 'sandbox not listed by the runtime, but the file is within the grace period (ADD may be in flight)',
  leaked: 'sandbox not listed by the runtime and the file is older than the grace period',
  corrupt: 'empty or unparseable reservation file',
  unknown: 'runtime not reachable; kept',
  notready: 'sandbox is listed by the runtime but not ready, and the file is older than the grace period (policy reclaim-notready)',
  /** Prefix of `inuse` reasons; the kernel's own words follow (`evidence.ts` `inUseReason`). */
  inuse: 'kept although the runtime does not own it: ',
  /** Prefix of `unknown` reasons when the kernel evidence is incomplete; the cause follows. */
  evidenceIncomplete: 'kernel evidence incomplete; kept: ',
  /** Reason of a file stamped in the future; the offset follows. */
  future: 'the file is stamped in the future (the clock was stepped back since it was written); its grace period restarts when ipwarden next holds the lock: ',
} as const;

/**
 * Classify one reservation against a snapshot and the kernel evidence. Pure; used by {@link plan}
 * and again by apply under the lock (with the same snapshot and freshly read evidence).
 *
 * Grace boundary: with `boundary = snapshotAtMs − graceSeconds·1000`, the record is `leaked` only
 * when `mtimeMs < boundary` (strictly older); `mtimeMs === boundary` (age exactly equal to the
 * grace) is still `grace`. A non-finite mtime is never leaked. A would-be release (`leaked`,
 * `corrupt`, `notready`) becomes `unknown` when `ctx.evidence` is incomplete and `inuse` when the
 * kernel says the address or its container is in use.
 */
export function classify(r: ReservationInput, ctx: ClassifyContext): PlanEntry<AnyVerdict> {
  const { sandboxes, snapshotAtMs, graceSeconds, policy, evidence } = ctx;
  // One object per entry (no spreads): plan() classifies every reservation of a /16.
  const mk = (verdict: AnyVerdict, reason: string): PlanEntry<AnyVerdict> => ({
    network: r.network,
    dir: r.dir,
    ip: r.ip,
    owner: r.owner,
    containerId: r.owner?.containerId ?? null,
    ifname: r.owner?.ifname ?? null,
    mtimeMs: r.mtimeMs,
    ageSeconds: Math.round(snapshotAtMs - r.mtimeMs) / 1000,
    verdict,
    reason,
  });
  // A would-be release: only when the kernel agrees nobody uses it.
  const release = (verdict: AnyVerdict, reason: string): PlanEntry<AnyVerdict> => {
    if (evidence.incomplete !== null) return mk('unknown', REASONS.evidenceIncomplete + evidence.incomplete);
    const used = inUseReason(evidence, r.ip, r.owner?.containerId ?? null);
    return used === null ? mk(verdict, reason) : mk('inuse', REASONS.inuse + used);
  };
  if (r.owner === null) return release('corrupt', REASONS.corrupt);
  if (sandboxes === null) return mk('unknown', REASONS.unknown);
  const legacy = r.owner.ifname === null ? REASONS.legacySuffix : '';
  const boundary = snapshotAtMs - graceSeconds * 1000;
  if (sandboxes.has(r.owner.containerId)) {
    const state = sandboxes instanceof Map ? (sandboxes.get(r.owner.containerId) as SandboxState | undefined) : undefined;
    // BR-22: only a sandbox KNOWN to be not ready, and only after the grace period.
    if (state === 'notready' && policy === 'reclaim-notready' && r.mtimeMs < boundary) return release('notready', REASONS.notready + legacy);
    const text = state === 'ready' ? REASONS.liveReady : state === 'notready' ? REASONS.liveNotReady : REASONS.live;
    return mk('live', text + legacy);
  }
  if (r.mtimeMs > snapshotAtMs + FUTURE_TOLERANCE_MS) return mk('grace', REASONS.future + futureText(r.mtimeMs - snapshotAtMs) + legacy);
  if (r.mtimeMs < boundary) return release('leaked', REASONS.leaked + legacy);
  return mk('grace', REASONS.grace + legacy);
}

/** True when a record is stamped more than {@link FUTURE_TOLERANCE_MS} after `snapshotAtMs`. */
export function isStampedInFuture(mtimeMs: number, snapshotAtMs: number): boolean {
  return mtimeMs > snapshotAtMs + FUTURE_TOLERANCE_MS;
}

/** `1h2m3s ahead` for a positive offset in milliseconds (whole seconds). */
function futureText(ms: number): string {
  let s = Math.floor(ms / 1000);
  const h = Math.floor(s / 3600);
  s -= h * 3600;
  const m = Math.floor(s / 60);
  s -= m * 60;
  return `${h > 0 ? `${h}h` : ''}${h > 0 || m > 0 ? `${m}m` : ''}${s}s ahead`;
}

/** True for verdicts the reconciler releases (`leaked`, `corrupt`, `notready`). */
export function isReleasable(v: AnyVerdict): boolean {
  return v === 'leaked' || v === 'corrupt' || v === 'notready';
}

/**
 * Classify every reservation (see the module comment for the rules) and split them into
 * `release` and `keep`. Throws `RangeError` when `graceSeconds` is negative or not finite,
 * `snapshotAtMs` is not finite, or `policy` is not one of {@link POLICIES} (programming errors:
 * the CLI validates `--grace` and `--policy`). Without a policy, or with `conservative`, the plan
 * holds no `notready` entry (hence the narrower return type).
 */
export function plan(input: PlanInput & { readonly policy?: 'conservative' }): Plan<Verdict>;
export function plan(input: PlanInput): Plan<AnyVerdict>;
export function plan(input: PlanInput): Plan<AnyVerdict> {
  const policy = input.policy ?? 'conservative';
  if (!POLICIES.includes(policy)) throw new RangeError(`unknown policy ${JSON.stringify(policy)}`);
  if (!Number.isFinite(input.graceSeconds) || input.graceSeconds < 0) {
    throw new RangeError(`grace must be a finite number of seconds >= 0, got ${String(input.graceSeconds)}`);
  }
  if (!Number.isFinite(input.snapshotAtMs)) throw new RangeError(`snapshotAtMs must be finite, got ${String(input.snapshotAtMs)}`);
  const ctx: ClassifyContext = { sandboxes: input.sandboxes, snapshotAtMs: input.snapshotAtMs, graceSeconds: input.graceSeconds, policy, evidence: input.evidence };
  // Decorate-sort-undecorate: parse each IP once, not in every comparison (65,534 entries on a /16).
  const entries = input.reservations
    .map((r) => {
      const e = classify(r, ctx);
      return { e, k: ipKey(e.ip) };
    })
    .sort((x, y) => {
      if (x.e.network !== y.e.network) return x.e.network < y.e.network ? -1 : 1;
      return compareKeys(x.k, y.k, x.e.ip, y.e.ip);
    })
    .map((x) => x.e);
  const release: PlanEntry<AnyVerdict>[] = [];
  const keep: PlanEntry<AnyVerdict>[] = [];
  const counts = { allocated: entries.length, live: 0, inuse: 0, grace: 0, leaked: 0, corrupt: 0, notready: 0, unknown: 0, orphaned: 0 };
  const owners = new Set<string>();
  for (const e of entries) {
    counts[e.verdict]++;
    if (e.containerId !== null) owners.add(e.containerId);
    if (isReleasable(e.verdict)) release.push(e);
    else keep.push(e);
  }
  counts.orphaned = counts.leaked + counts.corrupt;
  const orphans = input.sandboxes === null ? [] : [...input.sandboxes.keys()].filter((id) => !owners.has(id)).sort();
  return {
    entries,
    release,
    keep,
    orphans,
    counts,
    sandboxes: input.sandboxes,
    snapshotAtMs: input.snapshotAtMs,
    graceSeconds: input.graceSeconds,
    policy,
    evidence: input.evidence,
  };
}

/** Order by network name (code unit order), then IP numerically (IPv4 before IPv6). */
export function compareEntries(a: { network: string; ip: string }, b: { network: string; ip: string }): number {
  if (a.network !== b.network) return a.network < b.network ? -1 : 1;
  return compareIPText(a.ip, b.ip);
}

/** Numeric order of two IP texts: IPv4 before IPv6; unparseable text last, by code units. */
export function compareIPText(a: string, b: string): number {
  return compareKeys(ipKey(a), ipKey(b), a, b);
}

function compareKeys(ka: IPKey | null, kb: IPKey | null, a: string, b: string): number {
  if (ka === null || kb === null) {
    if (ka !== kb) return ka === null ? 1 : -1;
    return a < b ? -1 : a > b ? 1 : 0;
  }
  if (ka.family !== kb.family) return ka.family - kb.family;
  return ka.value < kb.value ? -1 : ka.value > kb.value ? 1 : 0;
}

type IPKey = IP;

/** Numeric key of an IP text (common/ip.ts, Go-compatible parsing); null when not an IP. */
function ipKey(s: string): IPKey | null {
  return parseIP(s);
}
