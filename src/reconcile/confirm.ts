/**
 * The daemon's extra release rules (ARCHITECTURE.md "Reconciler safety rules"; pure, no I/O):
 *
 * 1. **Two observations a grace period apart.** A reservation the plan would release is released
 *    by the daemon only when consecutive passes have judged it releasable, with the same owner and
 *    the same file time, for at least the grace period. One bad runtime answer (a restart that
 *    briefly lists nothing, a sandbox store being rebuilt) can therefore never release anything
 *    by itself; it must persist for a grace period. (Calico's GC releases a leak only after it has
 *    stayed a candidate for its grace period; ../shared/reference/anchors.md §5.2.)
 * 2. **A per-pass cap with roll-over.** At most `cap` releases per pass, oldest file first; the
 *    rest stay confirmed and go first in the next pass (Calico caps releases per sync too).
 * 3. **A list that shares no owner with many old reservations is not trusted alone.** When no
 *    sandbox the runtime lists (none at all included) owns a reservation of a network, while at
 *    least {@link DISTRUST_MIN} reservations of that network would be released, the daemon
 *    releases none of them: that is the shape of a runtime that lost its records or an endpoint
 *    that is another runtime's (field reports BR-3, BR-9). Judged per network (data directory +
 *    name), so one live pod in another network does not vouch for this one. The leaks stay candidates (metrics, logs); the plugin's own
 *    reclaim at exhaustion, which checks each address against the kernel, or an operator's `gc`
 *    handles them.
 */

/**
 * The longest gap between the two observations of a candidate in a **full** range set, seconds
 * (issue 19 "heal on arrival"): there the daemon confirms `min(grace, 30 s)` after the first
 * observation, not a whole grace period later, and schedules that confirming pass itself, so a
 * node installed to cure exhaustion heals within seconds. Both observations still need both
 * witnesses, the same owner and file time; the file itself must still be older than the grace.
 */
export const FULL_CONFIRM_MAX_SECONDS = 30;

/** Most releases per daemon pass (the rest roll over to the next pass). */
export const DEFAULT_RELEASE_CAP = 32;

/** Candidates at or above which a runtime list sharing no owner is not trusted alone. */
export const DISTRUST_MIN = 8;

/** A releasable reservation as one pass saw it. */
export interface Candidate {
  readonly network: string;
  readonly ip: string;
  /** Owner text as on disk (container ID and ifname) — a changed owner restarts the clock. */
  readonly owner: string;
  /** File modification time, ms since the epoch — a rewritten file restarts the clock. */
  readonly mtimeMs: number;
}

/** What {@link Confirmations.observe} decided for one pass. */
export interface ConfirmDecision<C extends Candidate> {
  /** Release now (confirmed, within the cap), oldest first. */
  readonly release: C[];
  /** Confirmed but over the cap: first in the next pass. */
  readonly deferred: C[];
  /** Seen for less than the grace period (first observation, or too recent). */
  readonly waiting: C[];
  /** Why nothing is released this pass (distrust), else null. */
  readonly held: string | null;
  /**
   * Milliseconds (on the `nowMs` clock) until the first waiting candidate of an `urgent` network
   * can be confirmed, or null when there is none: the daemon schedules its confirming pass then.
   */
  readonly urgentDueInMs: number | null;
}

const keyOf = (c: Candidate): string => `${c.network}\u0000${c.ip}`;

/**
 * Remembers, across passes, since when each releasable reservation has been seen. Feed it every
 * pass's candidates with {@link observe}; a reservation absent from a pass is forgotten (its
 * clock restarts when it comes back).
 */
export class Confirmations {
  private readonly firstSeen = new Map<string, { owner: string; mtimeMs: number; atMs: number }>();
  private readonly graceSeconds: number;
  private readonly cap: number;

  /**
   * @param graceSeconds the grace period between the two observations (seconds, ≥ 0).
   * @param cap most releases per pass (≥ 1).
   */
  constructor(graceSeconds: number, cap: number = DEFAULT_RELEASE_CAP) {
    this.graceSeconds = graceSeconds;
    this.cap = cap;
    if (!(graceSeconds >= 0) || !Number.isInteger(cap) || cap < 1) throw new RangeError(`bad confirmation settings: grace ${graceSeconds} s, cap ${cap}`);
  }

  /**
   * One pass: `candidates` are the reservations the plan (with every evidence rule) would release,
   * `nowMs` a MONOTONIC clock in ms (never the wall clock: a forward step must not make two passes
   * a grace period apart), `trusted(network)` whether any sandbox the runtime listed owns a
   * reservation of that network (rule 3; a runtime listing nothing owns none), `urgent(network)`
   * whether a range set of that network is full: its candidates confirm after
   * `min(grace, FULL_CONFIRM_MAX_SECONDS)` (default: no network is urgent).
   */
  observe<C extends Candidate>(candidates: readonly C[], nowMs: number, trusted: (network: string) => boolean, urgent: (network: string) => boolean = () => false): ConfirmDecision<C> {
    const seen = new Set<string>();
    const confirmed: Array<{ c: C; since: number }> = [];
    const waiting: C[] = [];
    const urgentGapMs = Math.min(this.graceSeconds, FULL_CONFIRM_MAX_SECONDS) * 1000;
    let urgentDueInMs: number | null = null;
    for (const c of candidates) {
      const k = keyOf(c);
      seen.add(k);
      const isUrgent = urgent(c.network);
      const gapMs = isUrgent ? urgentGapMs : this.graceSeconds * 1000;
      const prev = this.firstSeen.get(k);
      let since: number;
      // A clock that went back makes `nowMs - atMs` negative: the candidate waits (restarted).
      if (prev === undefined || prev.owner !== c.owner || prev.mtimeMs !== c.mtimeMs || prev.atMs > nowMs) {
        this.firstSeen.set(k, { owner: c.owner, mtimeMs: c.mtimeMs, atMs: nowMs });
        since = nowMs;
      } else if (nowMs - prev.atMs >= gapMs) {
        confirmed.push({ c, since: prev.atMs });
        continue;
      } else {
        since = prev.atMs;
      }
      waiting.push(c);
      if (isUrgent) urgentDueInMs = Math.min(urgentDueInMs ?? Infinity, since + gapMs - nowMs);
    }
    for (const k of [...this.firstSeen.keys()]) if (!seen.has(k)) this.firstSeen.delete(k);

    // Rule 3, per network: many candidates in a network where the runtime owns nothing.
    const perNetwork = new Map<string, number>();
    for (const c of candidates) perNetwork.set(c.network, (perNetwork.get(c.network) ?? 0) + 1);
    const distrusted = new Set([...perNetwork].filter(([n, count]) => count >= DISTRUST_MIN && !trusted(n)).map(([n]) => n));
    const held = distrusted.size === 0
      ? null
      : `the runtime's list owns no reservation of ${[...distrusted].sort().join(', ')}, where ${[...distrusted].map((n) => perNetwork.get(n)).join(', ')} would be released: not trusted alone`;
    const deferredByDistrust = confirmed.filter((x) => distrusted.has(x.c.network)).map((x) => x.c);
    const eligible = confirmed.filter((x) => !distrusted.has(x.c.network));
    // Oldest file first (then longest confirmed, then IP text) so roll-over is fair and stable.
    eligible.sort((a, b) => a.c.mtimeMs - b.c.mtimeMs || a.since - b.since || (keyOf(a.c) < keyOf(b.c) ? -1 : 1));
    return {
      release: eligible.slice(0, this.cap).map((x) => x.c),
      deferred: [...eligible.slice(this.cap).map((x) => x.c), ...deferredByDistrust],
      waiting,
      held,
      urgentDueInMs,
    };
  }

  /** Forget a candidate (after its release, or when its network is gone). */
  forget(network: string, ip: string): void {
    this.firstSeen.delete(`${network}\u0000${ip}`);
  }

  /** How many candidates are being tracked. */
  get size(): number {
    return this.firstSeen.size;
  }
}

/**
 * The next pass's delay, seconds: `intervalSeconds` ± `jitter` × interval, uniformly, so the
 * daemons of many nodes do not ask their runtimes and the API in step.
 * @param random a [0,1) source (Math.random in production).
 */
export function jitteredDelay(intervalSeconds: number, random: () => number, jitter = 0.1): number {
  const d = intervalSeconds * (1 + jitter * (2 * random() - 1));
  return Math.max(0.001, d);
}
