/**
 * A Jepsen-style history checker for cluster pools (issue 11). {@link checkHistory} is pure: it takes the history a fault
 * run recorded — every plugin invocation as the test saw it (start and end time, node, container
 * ID, ifname, outcome, the IPs an ADD returned) plus the pool's state read at checkpoints — and
 * returns the violations it finds (an empty list = nothing found). No I/O.
 *
 * Times are milliseconds on ONE monotonic clock of the recording process (`performance.now()`
 * of the test), never a simulated node's clock: a node whose clock is stepped (faketime) cannot
 * move its own invocations in the history.
 *
 * The rules, each conservative in the direction that can only add violations, never hide one:
 *
 * 1. `duplicate`: no address held by two holders (containerId + ifname) at overlapping times.
 *    A successful ADD holds each IP it returned from the ADD's START (the allocation may have
 *    been committed at any moment of the call) until the END of the holder's next successful DEL
 *    that started after the ADD started. A failed or unknown-outcome DEL releases nothing (it may
 *    not have run), so the hold goes on. An ADD whose outcome is unknown (timed out, killed) may
 *    hold an address we never learn: it is covered by the state rules below.
 * 2. `lost`: no successful ADD's allocation lost. At every checkpoint whose read happened
 *    entirely inside a hold that was certainly in force — the ADD had returned before the read
 *    started and no DEL of that holder (any outcome: a failed DEL may have released) had started
 *    before the read ended — the state must list that IP owned by that holder. Owned by another
 *    holder, or absent, is a violation.
 * 3. `state-duplicate`: the state lists no IP twice.
 * 4. `block-owners`: no block has two owners in one state (the same CIDR listed twice with
 *    different owners, or two overlapping CIDRs with different owners).
 * 5. `not-empty`: a checkpoint marked `final` (after every DEL succeeded) lists no allocation.
 * 6. `readd-changed`: a repeated successful ADD of a holder that still holds an address returns
 *    the same address (the issue's idempotence rule: ADD is keyed by container ID + ifname).
 * 7. `zombie`: the state lists no allocation of a holder that cannot hold anything then: every
 *    ADD of it (of any outcome — a failed ADD may have committed) started after the read ended,
 *    or was followed by a successful DEL that ended before the read started.
 * 8. With the store's own history (`storeEvents`: every allocation and release as committed, in
 *    revision order — for etcd, read back from its MVCC history with a watch from revision 1):
 *    - `store-duplicate`: no address held by two holders at any revision (exact: revisions are
 *      a total order of commits);
 *    - `unconfirmed`: every successful ADD's address was committed for its holder (a success the
 *      store never had is a lost allocation);
 *    - a `duplicate` of rule 1 that is not certain (the ADD and the other holder's DEL ran at
 *      overlapping times, so real time cannot order them) is dropped when the store's history
 *      orders the two holds: the first holder's release committed at a revision before the
 *      second holder's allocation, AND that release is explained (rule 10). Without store events
 *      for both holds it stands.
 * 9. `bad-op`: an operation whose own record is malformed (end before start, a successful ADD
 *    without IPs, an IP that is not an address) — a broken recorder must not pass silently;
 *    `bad-state`: likewise a state entry whose IP or block CIDR does not parse, or a revision
 *    clock that contradicts real time (a tick with a higher revision acknowledged before a tick
 *    with a lower one was sent: the store would not be linearizable).
 * 10. `unexplained-release` (review finding C1): every release in the store's history is
 *    explained by an operation in the history that could have committed it: a DEL of the same
 *    holder (an ok DEL committed inside its own [start, end]; a failed or unknown-outcome DEL
 *    may have committed at any moment after its start — etcd can apply a request after its
 *    client gave up — but before the end of the holder's next ok DEL that started after it
 *    ended: that DEL does the release itself or makes the late transaction's compares fail), or
 *    an {@link AdminOp}: `remove-node-finish` of a node the holder's ADDs ran
 *    on, or `reconcile-release` of that node naming the holder. A release that another holder's
 *    operation, a stale writer or a bug committed is a violation even when no duplicate follows
 *    (it is a lost allocation).
 * 11. `unexplained-allocation`: likewise every allocation in the store's history is explained by
 *    an ADD of the same holder (an ok ADD inside its [start, end]; a failed or unknown ADD after
 *    its start and before the end of the holder's next ok DEL that started after it ended: that
 *    DEL's handle or tombstone fences a late ADD — docs/cluster.md "Guarantees").
 *
 *
 * Offline allocation (`ipam.pool.offline`, docs/cluster.md "Offline allocation"): a node's
 * daemon keeps reserve entries — addresses set aside in its own blocks, held by no container
 * (`StoreEvent.reserveOf`, `StateAllocation.reserveOf`) — and answers an ADD from one while cut
 * off from etcd, committing it later (the journal's sync). So: a reserve entry is a hold of the
 * pseudo-holder `reserve@NODE`, exempt from rules 10 and 11 (the daemon's own writes), and any
 * other holder taking it without a release is still a `store-duplicate` — except a hand-over
 * between a reserve entry and a container, which rules 10 and 11 require to be of the same node:
 * an allocation taking over NODE's reserve entry is explained by an ADD of the holder on NODE
 * that started before the commit (any outcome, any end), and a release of such a hold (or one
 * back into NODE's reserve) by a DEL of the holder on NODE that started before it. A successful
 * ADD whose address the store only ever shows as a reserve entry of the ADD's own node is not
 * `unconfirmed` (an offline ADD and DEL cancelled before a sync); a checkpoint listing a hold's
 * address as a reserve entry of the ADD's node is not `lost` (not synced yet); reserve entries
 * are never zombies and may be left in the final state.
 *
 *    When a commit happened is known from the revision clock (`revisionClock`: writes the
 *    recorder made to the same store, each with its revision and the real-time span of its
 *    call): a commit at revision r happened after the start of every tick with a lower revision
 *    and before the end of every tick with a higher one. Without ticks its window is unbounded and
 *    rules 10 and 11 only ask that such an operation exists at all.
 */
import { canonicalIP, parseCIDR, parseIP, subnetContains } from '../../src/common/ip.ts';

/** The outcome of one invocation as the caller saw it. `unknown`: timed out, killed, no answer. */
export type OpOutcome = 'ok' | 'error' | 'unknown';

/** One plugin invocation. */
export interface Op {
  /** Index in the history (for messages); set by the recorder, unique. */
  id: number;
  kind: 'ADD' | 'DEL';
  /** The simulated node (its NODE_NAME). */
  node: string;
  containerId: string;
  ifname: string;
  /** Invocation start and end, ms on the recorder's monotonic clock. */
  start: number;
  end: number;
  outcome: OpOutcome;
  /** ADD ok: the addresses in the result (canonical text, no prefix), one per range set. */
  ips?: string[];
  /** error: the CNI error code and message; unknown: what happened (e.g. "timeout 20 s"). */
  error?: { code?: number; msg: string };
}

/** One allocation as the pool's state lists it. */
export interface StateAllocation {
  ip: string;
  containerId: string;
  ifname: string;
  /**
   * Set for a reserve entry of the offline allocation (`ipam.pool.offline`: an address the node
   * `reserveOf` set aside in its own block, held by no container yet; docs/cluster.md "Offline
   * allocation"); containerId and ifname are then empty.
   */
  reserveOf?: string;
}

/** One block as the pool's state lists it. `owner`: the node that holds the block's affinity. */
export interface StateBlock {
  cidr: string;
  owner: string;
}

/** The pool's state, read (one consistent read, e.g. one etcd revision) during [start, end]. */
export interface Checkpoint {
  start: number;
  end: number;
  blocks: StateBlock[];
  allocations: StateAllocation[];
  /** True for the read after every container's DEL succeeded: the pool must be empty. */
  final?: boolean;
}

/**
 * One committed change of one address in the store: at revision `rev` the address became held by
 * `holder` (containerId/ifname), or free (`holder` null).
 */
export interface StoreEvent {
  rev: number;
  ip: string;
  holder: { containerId: string; ifname: string } | null;
  /** With `holder` null: the address became a reserve entry of this node (offline allocation), not free. */
  reserveOf?: string;
}

/**
 * One tick of the revision clock (rules 10, 11): a write the recorder made to the store, sent at
 * `start` and acknowledged at `end` (ms, the recorder's clock), that committed at revision `rev`.
 */
export interface RevisionTick {
  rev: number;
  start: number;
  end: number;
}

/**
 * An action other than a plugin invocation that may release addresses (rule 10), as the
 * recorder saw it: `remove-node-finish` (`ipwarden pool remove-node NODE --finish`: may release
 * any holder whose ADDs ran on `node`) or `reconcile-release` (a node's daemon releasing leaks it
 * found: may release the `holders` listed, on `node`). Times and outcome as for {@link Op}.
 */
export interface AdminOp {
  /** Unique among the admin ops (for messages). */
  id: number;
  kind: 'remove-node-finish' | 'reconcile-release';
  node: string;
  /** `reconcile-release`: the holders it released (required there; ignored for remove-node). */
  holders?: { containerId: string; ifname: string }[];
  start: number;
  end: number;
  outcome: OpOutcome;
  /** What it answered (for messages). */
  detail?: string;
}

/** A recorded run. */
export interface History {
  ops: Op[];
  checkpoints: Checkpoint[];
  /** The store's committed allocation history, if the store can give it (rules 8, 10, 11). */
  storeEvents?: StoreEvent[];
  /** The revision clock (rules 10, 11), any order. */
  revisionClock?: RevisionTick[];
  /** Actions other than plugin invocations that may release addresses (rule 10). */
  admin?: AdminOp[];
}

/** A hold in the store's history: `holder` held `ip` from revision `from` until `to` (Infinity: still held). */
export interface StoreHold {
  ip: string;
  holder: string;
  from: number;
  to: number;
  /** True when `to` is a release event (false: still held, or ended by another holder's allocation). */
  released: boolean;
  /** A reserve entry of this node (holder `reserve@NODE`), not a container's hold. */
  reserve?: string;
  /** A container's hold that took over a reserve entry of this node (an offline ADD's sync). */
  fromReserve?: string;
  /** A container's hold released back into a reserve entry of this node. */
  toReserve?: string;
}

/**
 * The holds of `events` (sorted here by revision; events of one revision keep their order, a
 * release before an allocation). Also returns the revisions where an address changed holder
 * without a release in between (`overlaps`: the store itself had two holders).
 */
export function storeHoldsOf(events: readonly StoreEvent[]): { holds: StoreHold[]; overlaps: { ip: string; first: StoreHold; second: StoreHold }[] } {
  const isRelease = (e: StoreEvent): boolean => e.holder === null && e.reserveOf === undefined;
  const sorted = events.map((e, i) => ({ e, i })).sort((a, b) => a.e.rev - b.e.rev || (isRelease(a.e) ? 0 : 1) - (isRelease(b.e) ? 0 : 1) || a.i - b.i);
  const open = new Map<string, StoreHold>();
  const holds: StoreHold[] = [];
  const overlaps: { ip: string; first: StoreHold; second: StoreHold }[] = [];
  for (const { e } of sorted) {
    const ip = canonicalIP(e.ip) ?? e.ip;
    const cur = open.get(ip);
    if (e.holder === null && e.reserveOf === undefined) {
      if (cur !== undefined) {
        cur.to = e.rev;
        cur.released = true;
        open.delete(ip);
      }
      continue;
    }
    const holder = e.holder === null ? `reserve@${e.reserveOf}` : holderOf(e.holder.containerId, e.holder.ifname);
    if (cur !== undefined && cur.holder === holder) continue; // rewritten, same holder
    const h: StoreHold = { ip, holder, from: e.rev, to: Infinity, released: false, ...(e.holder === null ? { reserve: e.reserveOf as string } : {}) };
    if (cur !== undefined && (cur.reserve !== undefined) !== (h.reserve !== undefined)) {
      // A reserve entry handed to a container (an offline ADD's sync), or a container's address
      // put back into the reserve: a hand-over, not two holders. Whose reserve it was is checked
      // by rules 10 and 11 against the ops' nodes.
      cur.to = e.rev;
      cur.released = true;
      if (h.reserve !== undefined) cur.toReserve = h.reserve;
      else if (cur.reserve !== undefined) h.fromReserve = cur.reserve;
    } else if (cur !== undefined) overlaps.push({ ip, first: cur, second: h }); // `cur` stays open (to = Infinity)
    holds.push(h);
    open.set(ip, h);
  }
  return { holds, overlaps };
}

/** The kinds of violation; see the module comment. */
export type ViolationKind =
  | 'duplicate'
  | 'lost'
  | 'state-duplicate'
  | 'block-owners'
  | 'not-empty'
  | 'readd-changed'
  | 'zombie'
  | 'store-duplicate'
  | 'unconfirmed'
  | 'unexplained-release'
  | 'unexplained-allocation'
  | 'bad-op'
  | 'bad-state';

/** One violation, with the ops (by id) and a readable message. */
export interface Violation {
  kind: ViolationKind;
  message: string;
  ops: number[];
}

/** A hold of one IP by one holder: [from, to), `to` = Infinity when never released. */
export interface Hold {
  ip: string;
  holder: string;
  /** The ADD that created it. */
  add: Op;
  from: number;
  to: number;
  /** The successful DEL that ended it, if any. */
  del?: Op;
  /** The first DEL of this holder (any outcome) that started after the ADD started. */
  firstDelStart: number;
}

const holderOf = (containerId: string, ifname: string): string => `${containerId}/${ifname}`;

/**
 * The holds the history's successful ADDs create (rule 1), each ended by the holder's first
 * successful DEL that started after the ADD. Ops with malformed records are skipped (they are
 * reported by {@link checkHistory} as `bad-op`).
 */
export function holdsOf(ops: readonly Op[]): Hold[] {
  const byHolder = new Map<string, Op[]>();
  for (const op of ops) {
    if (badOp(op) !== null) continue;
    const h = holderOf(op.containerId, op.ifname);
    const list = byHolder.get(h) ?? [];
    list.push(op);
    byHolder.set(h, list);
  }
  const holds: Hold[] = [];
  for (const [holder, list] of byHolder) {
    const dels = list.filter((o) => o.kind === 'DEL').sort((a, b) => a.start - b.start);
    for (const add of list) {
      if (add.kind !== 'ADD' || add.outcome !== 'ok') continue;
      const after = dels.filter((d) => d.start > add.start);
      const del = after.find((d) => d.outcome === 'ok');
      const firstDelStart = after[0]?.start ?? Infinity;
      for (const raw of add.ips ?? []) {
        const ip = canonicalIP(raw) ?? raw;
        holds.push({ ip, holder, add, from: add.start, to: del?.end ?? Infinity, ...(del ? { del } : {}), firstDelStart });
      }
    }
  }
  return holds;
}

function badOp(op: Op): string | null {
  if (!(Number.isFinite(op.start) && (Number.isFinite(op.end) || op.outcome === 'unknown'))) return 'non-finite time';
  if (op.end < op.start) return `ends (${op.end}) before it starts (${op.start})`;
  if (op.containerId === '' || op.ifname === '') return 'empty container ID or ifname';
  if (op.kind === 'ADD' && op.outcome === 'ok') {
    if (!op.ips || op.ips.length === 0) return 'a successful ADD without IPs';
    for (const ip of op.ips) if (canonicalIP(ip) === null) return `result IP ${JSON.stringify(ip)} is not an address`;
  }
  return null;
}

const fmtOp = (o: Op): string => `#${o.id} ${o.kind} ${o.containerId}/${o.ifname} on ${o.node} [${o.start.toFixed(1)}, ${o.end.toFixed(1)}] ${o.outcome}${o.ips ? ` ${o.ips.join(',')}` : ''}`;

/**
 * What the checker went through (for a run's report and for tests that must show the hard paths
 * were exercised). Counts; `*ByFailed*` are commits of operations that did not answer ok.
 */
export interface CheckStats {
  ops: number;
  ok: number;
  /** Ops that answered an error. */
  failed: number;
  /** Ops without an answer (timed out, killed, never finished). */
  unknown: number;
  unknownAdds: number;
  unknownDels: number;
  /** Allocations in the store's history, and what explained them (rule 11). */
  storeAllocations: number;
  allocationsByOkAdd: number;
  /** Committed although the ADD failed or had no answer (an answer lost after the commit, a late commit). */
  allocationsByFailedAdd: number;
  /** Releases in the store's history, and what explained them (rule 10). */
  storeReleases: number;
  releasesByOkDel: number;
  /** Committed by a DEL that failed or had no answer. */
  releasesByFailedDel: number;
  releasesByAdmin: number;
  /** Reserve entries of offline allocation in the store's history (exempt from rules 10, 11). */
  reserveEntries: number;
  /** Allocations that took over a reserve entry: an offline ADD's sync. */
  allocationsBySync: number;
  /** Successful ADDs whose address never left the node's reserve in the store (an offline ADD + DEL cancelled before a sync). */
  offlineUnsynced: number;
  /** Rule 1 duplicates that were not certain and that the store's order (rule 8) resolved. */
  resolvedByStore: number;
  revisionTicks: number;
  adminOps: number;
}

/** {@link checkHistoryDetailed}'s answer. */
export interface CheckResult {
  violations: Violation[];
  stats: CheckStats;
}

/**
 * Check `h` against the rules in the module comment.
 *
 * @returns every violation found (empty when none), in rule order. Never throws on a malformed
 *   history: a malformed op or state entry is itself a violation.
 */
export function checkHistory(h: History): Violation[] {
  return checkHistoryDetailed(h).violations;
}

/** The commit window (lo, hi) of revision `rev`, ms, from a revision clock sorted by revision. */
type WindowOf = (rev: number) => { lo: number; hi: number };

/**
 * The revision clock as a function from a revision to the open interval of real time in which
 * its commit happened; reports ticks that are malformed or contradict real time into `out`.
 */
function revisionWindows(ticks: readonly RevisionTick[], out: Violation[]): WindowOf {
  const good: RevisionTick[] = [];
  for (const t of ticks) {
    if (!(Number.isFinite(t.rev) && Number.isFinite(t.start) && Number.isFinite(t.end) && t.end >= t.start)) {
      out.push({ kind: 'bad-state', message: `revision clock: malformed tick ${JSON.stringify(t)}`, ops: [] });
    } else good.push(t);
  }
  good.sort((a, b) => a.rev - b.rev);
  const maxStart: number[] = []; // max start of ticks [0..i]
  const minEnd: number[] = new Array<number>(good.length); // min end of ticks [i..]
  for (let i = 0; i < good.length; i++) maxStart.push(Math.max(good[i]?.start ?? -Infinity, i > 0 ? (maxStart[i - 1] ?? -Infinity) : -Infinity));
  for (let i = good.length - 1; i >= 0; i--) minEnd[i] = Math.min(good[i]?.end ?? Infinity, i + 1 < good.length ? (minEnd[i + 1] ?? Infinity) : Infinity);
  for (let i = 1; i < good.length; i++) {
    const t = good[i] as RevisionTick;
    const before = maxStart[i - 1] ?? -Infinity;
    if (before > t.end) {
      out.push({ kind: 'bad-state', message: `revision clock out of real-time order: revision ${t.rev} was acknowledged at ${t.end.toFixed(1)}, before a lower revision's write was sent (${before.toFixed(1)})`, ops: [] });
    }
  }
  return (rev) => {
    // the last tick with a lower revision, the first with a higher one (binary search)
    let lo = 0;
    let hi = good.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if ((good[mid] as RevisionTick).rev < rev) lo = mid + 1;
      else hi = mid;
    }
    let above = lo;
    while (above < good.length && (good[above] as RevisionTick).rev === rev) above++;
    return { lo: lo > 0 ? (maxStart[lo - 1] ?? -Infinity) : -Infinity, hi: above < good.length ? (minEnd[above] ?? Infinity) : Infinity };
  };
}

/**
 * True when an operation of [start, end] with `outcome` may have committed inside (lo, hi): ok
 * inside its span, otherwise after its start and before `fence` (default: any time after).
 */
const mayCommitIn = (o: { start: number; end: number; outcome: OpOutcome }, w: { lo: number; hi: number }, fence = Infinity): boolean =>
  o.start < w.hi && (o.outcome === 'ok' ? o.end > w.lo : fence > w.lo);

const fmtWindow = (w: { lo: number; hi: number }): string => `(${w.lo.toFixed(1)}, ${w.hi.toFixed(1)})`;

/** {@link checkHistory} plus what the checker went through ({@link CheckStats}). Pure. */
export function checkHistoryDetailed(h: History): CheckResult {
  const out: Violation[] = [];
  const stats: CheckStats = {
    ops: h.ops.length,
    ok: h.ops.filter((o) => o.outcome === 'ok').length,
    failed: h.ops.filter((o) => o.outcome === 'error').length,
    unknown: h.ops.filter((o) => o.outcome === 'unknown').length,
    unknownAdds: h.ops.filter((o) => o.outcome === 'unknown' && o.kind === 'ADD').length,
    unknownDels: h.ops.filter((o) => o.outcome === 'unknown' && o.kind === 'DEL').length,
    storeAllocations: 0,
    allocationsByOkAdd: 0,
    allocationsByFailedAdd: 0,
    storeReleases: 0,
    releasesByOkDel: 0,
    releasesByFailedDel: 0,
    releasesByAdmin: 0,
    reserveEntries: 0,
    allocationsBySync: 0,
    offlineUnsynced: 0,
    resolvedByStore: 0,
    revisionTicks: h.revisionClock?.length ?? 0,
    adminOps: h.admin?.length ?? 0,
  };
  for (const op of h.ops) {
    const why = badOp(op);
    if (why !== null) out.push({ kind: 'bad-op', message: `${fmtOp(op)}: ${why}`, ops: [op.id] });
  }
  for (const a of h.admin ?? []) {
    const bad =
      !(Number.isFinite(a.start) && (Number.isFinite(a.end) || a.outcome === 'unknown')) || a.end < a.start
        ? 'bad times'
        : a.kind === 'reconcile-release' && !(a.holders && a.holders.length > 0)
          ? 'a reconcile release without holders'
          : null;
    if (bad !== null) out.push({ kind: 'bad-op', message: `admin #${a.id} ${a.kind} ${a.node}: ${bad}`, ops: [] });
  }
  const holds = holdsOf(h.ops);
  const opsByHolder = new Map<string, Op[]>();
  for (const op of h.ops) {
    const k = holderOf(op.containerId, op.ifname);
    const l = opsByHolder.get(k) ?? [];
    l.push(op);
    opsByHolder.set(k, l);
  }

  const store = h.storeEvents === undefined ? null : storeHoldsOf(h.storeEvents);
  const storeByKey = new Map<string, StoreHold[]>();
  for (const x of store?.holds ?? []) {
    const k = `${x.ip} ${x.holder}`;
    const l = storeByKey.get(k) ?? [];
    l.push(x);
    storeByKey.set(k, l);
  }

  // 10 and 11: explain every allocation and release in the store's history.
  const unexplainedRelease = new Set<StoreHold>();
  const storeViolations: Violation[] = [];
  if (store !== null) {
    const windowOf = revisionWindows(h.revisionClock ?? [], out);
    for (const x of store.holds) {
      if (x.reserve !== undefined) {
        stats.reserveEntries++; // the node's own daemon sets them aside and frees them (remove-node: its blocks); no op explains them
        continue;
      }
      const mine = opsByHolder.get(x.holder) ?? [];
      /**
       * A failed or unknown op of the holder commits, if ever, before the end of the holder's
       * next ok DEL that started after it ended: that DEL either commits the op's effect itself
       * (it read the state after) or changes the keys the late op compared (a late ADD meets the
       * DEL's handle or tombstone, a late DEL the DEL's release), so the late op's transaction
       * fails. Rule 10/11's bound for late commits.
       */
      const fenceOf = (o: Op): number => {
        let f = Infinity;
        for (const d of mine) if (d.kind === 'DEL' && d.outcome === 'ok' && d.start >= o.end && d.end < f) f = d.end;
        return f;
      };
      stats.storeAllocations++;
      const wa = windowOf(x.from);
      // An offline ADD's sync commits after the ADD answered: any ADD of the holder on the
      // reserve's node that started before the commit explains it.
      const fromReserve = x.fromReserve;
      const adds = mine.filter((o) => o.kind === 'ADD' && badOp(o) === null && (fromReserve !== undefined ? o.node === fromReserve && o.start < wa.hi : mayCommitIn(o, wa, fenceOf(o))));
      if (fromReserve !== undefined && adds.length > 0) stats.allocationsBySync++;
      else if (adds.some((o) => o.outcome === 'ok')) stats.allocationsByOkAdd++;
      else if (adds.length > 0) stats.allocationsByFailedAdd++;
      else {
        storeViolations.push({
          kind: 'unexplained-allocation',
          message: `${x.ip} allocated to ${x.holder} in the store at revision ${x.from}${fromReserve !== undefined ? ` from the reserve of ${fromReserve}` : ''} (committed in ${fmtWindow(wa)}), and no ADD of ${x.holder}${fromReserve !== undefined ? ` on ${fromReserve}` : ''} can have committed it${mine.length > 0 ? `: ${mine.map(fmtOp).join('; ')}` : ' (it has no operation at all)'}`,
          ops: mine.map((o) => o.id),
        });
      }
      if (!x.released) continue;
      stats.storeReleases++;
      const wr = windowOf(x.to);
      // A hold an offline ADD made may be released by the sync of an offline DEL, after that DEL
      // answered; so may one put back into the reserve: any DEL of the holder on that node that
      // started before the commit explains those.
      const lateNode = x.toReserve ?? x.fromReserve;
      const dels = mine.filter((o) => o.kind === 'DEL' && badOp(o) === null && (mayCommitIn(o, wr, fenceOf(o)) || (lateNode !== undefined && o.node === lateNode && o.start < wr.hi)));
      const nodes = new Set(mine.filter((o) => o.kind === 'ADD').map((o) => o.node));
      const admin = (h.admin ?? []).filter(
        (a) =>
          nodes.has(a.node) &&
          mayCommitIn(a, wr) &&
          (a.kind === 'remove-node-finish' || (a.holders ?? []).some((y) => holderOf(y.containerId, y.ifname) === x.holder)),
      );
      if (dels.some((o) => o.outcome === 'ok')) stats.releasesByOkDel++;
      else if (dels.length > 0) stats.releasesByFailedDel++;
      else if (admin.length > 0) stats.releasesByAdmin++;
      else {
        unexplainedRelease.add(x);
        storeViolations.push({
          kind: 'unexplained-release',
          message: `${x.ip} of ${x.holder} released in the store at revision ${x.to} (committed in ${fmtWindow(wr)}), and no DEL of ${x.holder} nor an admin action on its node can have committed it${mine.length > 0 ? `: ${mine.map(fmtOp).join('; ')}` : ''}`,
          ops: mine.map((o) => o.id),
        });
      }
    }
  }
  /**
   * True when the store's history puts every hold of `a` on `ip` before every hold of `b` (or
   * after), each time through an explained release of the earlier one.
   */
  const storeOrders = (ip: string, a: string, b: string): boolean => {
    const ha = storeByKey.get(`${ip} ${a}`) ?? [];
    const hb = storeByKey.get(`${ip} ${b}`) ?? [];
    if (ha.length === 0 || hb.length === 0) return false;
    const before = (x: StoreHold, y: StoreHold): boolean => x.released && !unexplainedRelease.has(x) && x.to <= y.from;
    return ha.every((x) => hb.every((y) => before(x, y) || before(y, x)));
  };

  // 1. duplicate: per IP, any two holds of different holders that overlap.
  const byIp = new Map<string, Hold[]>();
  for (const x of holds) {
    const l = byIp.get(x.ip) ?? [];
    l.push(x);
    byIp.set(x.ip, l);
  }
  for (const [ip, list] of byIp) {
    list.sort((a, b) => a.from - b.from);
    for (let i = 0; i < list.length; i++) {
      const a = list[i];
      if (a === undefined) continue;
      for (let j = i + 1; j < list.length; j++) {
        const b = list[j];
        if (b === undefined || b.from >= a.to) continue;
        if (b.holder === a.holder) continue;
        // Certain only when neither holder had begun ANY DEL (a failed or unanswered DEL may have
        // committed its release: etcd applies a request whose answer is lost) — then the store's
        // order decides (rule 8), and rule 10 checks that release against that DEL.
        const certain = b.add.end <= a.firstDelStart && a.add.end <= b.firstDelStart;
        if (!certain && storeOrders(ip, a.holder, b.holder)) {
          stats.resolvedByStore++; // rule 8: the commits order them
          continue;
        }
        out.push({
          kind: 'duplicate',
          message: `${certain ? '(certain: both ADDs had returned before either DEL started) ' : ''}${ip} held by ${a.holder} [${a.from.toFixed(1)}, ${a.to.toFixed(1)}) and ${b.holder} from ${b.from.toFixed(1)}: ${fmtOp(a.add)}${a.del ? ` released by ${fmtOp(a.del)}` : ' (never released)'}; ${fmtOp(b.add)}`,
          ops: [a.add.id, ...(a.del ? [a.del.id] : []), b.add.id],
        });
      }
    }
  }

  // 6. readd-changed: a holder's successful ADD while it already holds, with other IPs.
  const byHolder = new Map<string, Hold[]>();
  for (const x of holds) {
    const l = byHolder.get(x.holder) ?? [];
    l.push(x);
    byHolder.set(x.holder, l);
  }
  for (const [holder, list] of byHolder) {
    for (const a of list) {
      for (const b of list) {
        if (b.add === a.add || b.add.start <= a.add.start || b.add.start >= a.firstDelStart) continue;
        if (a.add.end > b.add.start) continue; // overlapping ADDs of one holder: a runtime never does that
        const bIps = new Set((b.add.ips ?? []).map((s) => canonicalIP(s) ?? s));
        if (!bIps.has(a.ip)) {
          out.push({ kind: 'readd-changed', message: `${holder} held ${a.ip} (${fmtOp(a.add)}) and a repeated ADD returned ${[...bIps].join(',')} (${fmtOp(b.add)})`, ops: [a.add.id, b.add.id] });
        }
      }
    }
  }

  // 8. store-duplicate and unconfirmed
  if (store !== null) {
    for (const o of store.overlaps) {
      out.push({
        kind: 'store-duplicate',
        message: `${o.ip} held in the store by ${o.first.holder} from revision ${o.first.from} and by ${o.second.holder} from revision ${o.second.from} without a release in between`,
        ops: [],
      });
    }
    for (const x of holds) {
      if ((storeByKey.get(`${x.ip} ${x.holder}`) ?? []).length === 0) {
        if ((storeByKey.get(`${x.ip} reserve@${x.add.node}`) ?? []).length > 0) {
          // An offline ADD whose journal entry was cancelled by an offline DEL before any sync: the
          // address stayed a reserve entry of the ADD's own node, which nobody else can take.
          stats.offlineUnsynced++;
          continue;
        }
        out.push({ kind: 'unconfirmed', message: `${fmtOp(x.add)}: the store never committed ${x.ip} for ${x.holder}`, ops: [x.add.id] });
      }
    }
    out.push(...storeViolations);
  }

  for (const [ci, cp] of h.checkpoints.entries()) {
    const where = `checkpoint ${ci} [${cp.start.toFixed(1)}, ${cp.end.toFixed(1)}]`;
    // 3. state-duplicate
    const owner = new Map<string, string>();
    for (const a of cp.allocations) {
      const ip = canonicalIP(a.ip);
      if (ip === null) {
        out.push({ kind: 'bad-state', message: `${where}: allocation ${JSON.stringify(a.ip)} is not an address`, ops: [] });
        continue;
      }
      const who = a.reserveOf !== undefined ? `reserve@${a.reserveOf}` : holderOf(a.containerId, a.ifname);
      const prev = owner.get(ip);
      if (prev !== undefined) out.push({ kind: 'state-duplicate', message: `${where}: ${ip} listed twice (${prev}, ${who})`, ops: [] });
      else owner.set(ip, who);
    }
    // 2. lost
    for (const x of holds) {
      if (!(x.add.end <= cp.start && x.firstDelStart >= cp.end)) continue;
      const got = owner.get(x.ip);
      if (got !== x.holder && got !== `reserve@${x.add.node}`) {
        // (still a reserve entry of the ADD's node: an offline ADD not synced yet)
        out.push({
          kind: 'lost',
          message: `${where}: ${x.ip} of ${x.holder} (${fmtOp(x.add)}) is ${got === undefined ? 'missing from the pool' : `owned by ${got} in the pool`}`,
          ops: [x.add.id],
        });
      }
    }
    // 4. block-owners
    const parsed: { cidr: string; owner: string; net: NonNullable<ReturnType<typeof parseCIDR>>['subnet'] }[] = [];
    for (const b of cp.blocks) {
      const p = parseCIDR(b.cidr);
      if (p === null) {
        out.push({ kind: 'bad-state', message: `${where}: block ${JSON.stringify(b.cidr)} is not a CIDR`, ops: [] });
        continue;
      }
      parsed.push({ cidr: b.cidr, owner: b.owner, net: p.subnet });
    }
    for (let i = 0; i < parsed.length; i++) {
      for (let j = i + 1; j < parsed.length; j++) {
        const a = parsed[i];
        const b = parsed[j];
        if (a === undefined || b === undefined) continue;
        const overlap = subnetContains(a.net, b.net.ip) || subnetContains(b.net, a.net.ip);
        if (!overlap) continue;
        if (a.owner !== b.owner) out.push({ kind: 'block-owners', message: `${where}: block ${a.cidr} owned by ${a.owner} overlaps ${b.cidr} owned by ${b.owner}`, ops: [] });
        else if (a.cidr === b.cidr) out.push({ kind: 'block-owners', message: `${where}: block ${a.cidr} listed twice (owner ${a.owner})`, ops: [] });
      }
    }
    // 7. zombie
    for (const a of cp.allocations) {
      if (a.reserveOf !== undefined) continue;
      const holder = holderOf(a.containerId, a.ifname);
      const mine = (opsByHolder.get(holder) ?? []);
      const may = mine.some(
        (add) => add.kind === 'ADD' && add.start < cp.end && !mine.some((d) => d.kind === 'DEL' && d.outcome === 'ok' && d.start > add.start && d.end <= cp.start),
      );
      if (!may) out.push({ kind: 'zombie', message: `${where}: ${a.ip} is listed for ${holder}, which cannot hold anything then`, ops: mine.map((o) => o.id) });
    }
    // 5. not-empty
    // (reserve entries stay: each node with offline allocation keeps its reserve)
    const left = cp.allocations.filter((a) => a.reserveOf === undefined);
    if (cp.final === true && left.length > 0) {
      const list = left.slice(0, 10).map((a) => `${a.ip} ${holderOf(a.containerId, a.ifname)}`);
      out.push({ kind: 'not-empty', message: `${where} (final): ${left.length} allocation(s) left: ${list.join('; ')}${left.length > 10 ? ' …' : ''}`, ops: [] });
    }
  }
  return { violations: out, stats };
}

/** The first IP of a CNI 1.x / 0.4 ADD result JSON (`ips[].address` without the prefix), all of them. */
export function resultIps(result: unknown): string[] {
  const ips = (result as { ips?: { address?: unknown }[] } | null)?.ips;
  if (!Array.isArray(ips)) return [];
  const out: string[] = [];
  for (const e of ips) {
    if (typeof e?.address !== 'string') continue;
    const addr = e.address.split('/')[0] ?? '';
    if (parseIP(addr) !== null) out.push(canonicalIP(addr) ?? addr);
  }
  return out;
}

/**
 * A recorder for a run: `begin` returns a finish function; ids are assigned in begin order.
 * `now` is the run's monotonic clock in ms (default `performance.now`). Not pure: it only keeps
 * values in memory (the checker stays pure).
 */
export class HistoryRecorder {
  readonly ops: Op[] = [];
  readonly checkpoints: Checkpoint[] = [];
  readonly admin: AdminOp[] = [];
  readonly revisionClock: RevisionTick[] = [];
  private readonly now: () => number;
  constructor(now: () => number = () => performance.now()) {
    this.now = now;
  }

  /** Record the start of an invocation; call the returned function with its outcome at its end. */
  begin(kind: 'ADD' | 'DEL', node: string, containerId: string, ifname: string): (outcome: OpOutcome, detail?: { ips?: string[]; error?: { code?: number; msg: string } }) => Op {
    const op: Op = { id: this.ops.length, kind, node, containerId, ifname, start: this.now(), end: Number.NaN, outcome: 'unknown' };
    this.ops.push(op);
    return (outcome, detail) => {
      op.end = this.now();
      op.outcome = outcome;
      if (detail?.ips) op.ips = detail.ips;
      if (detail?.error) op.error = detail.error;
      return op;
    };
  }

  /**
   * Record the start of an admin action (see {@link AdminOp}); call the returned function with its
   * outcome at its end. Never finished: unknown.
   */
  beginAdmin(kind: AdminOp['kind'], node: string, holders?: { containerId: string; ifname: string }[]): (outcome: OpOutcome, detail?: string) => AdminOp {
    const a: AdminOp = { id: this.admin.length, kind, node, ...(holders ? { holders } : {}), start: this.now(), end: Number.NaN, outcome: 'unknown' };
    this.admin.push(a);
    return (outcome, detail) => {
      a.end = this.now();
      a.outcome = outcome;
      if (detail !== undefined) a.detail = detail;
      return a;
    };
  }

  /**
   * One tick of the revision clock: `write` makes one write to the store and resolves with the
   * revision it committed at; the tick spans the call. A write that throws records nothing (its
   * revision is unknown) and the error is thrown.
   */
  async tick(write: () => Promise<number>): Promise<RevisionTick> {
    const start = this.now();
    const rev = await write();
    const t: RevisionTick = { rev, start, end: this.now() };
    this.revisionClock.push(t);
    return t;
  }

  /** Read the pool's state with `read` and record it as a checkpoint spanning the read. */
  async checkpoint(read: () => Promise<{ blocks: StateBlock[]; allocations: StateAllocation[] }>, final = false): Promise<Checkpoint> {
    const start = this.now();
    const s = await read();
    const cp: Checkpoint = { start, end: this.now(), blocks: s.blocks, allocations: s.allocations, ...(final ? { final } : {}) };
    this.checkpoints.push(cp);
    return cp;
  }

  /** The recorded history. An op (or admin action) never finished counts as unknown and never ended. */
  history(): History {
    return {
      ops: this.ops.map((o) => (Number.isNaN(o.end) ? { ...o, end: Infinity, outcome: 'unknown' as const } : o)),
      checkpoints: this.checkpoints,
      ...(this.admin.length > 0 ? { admin: this.admin.map((a) => (Number.isNaN(a.end) ? { ...a, end: Infinity, outcome: 'unknown' as const } : a)) } : {}),
      ...(this.revisionClock.length > 0 ? { revisionClock: [...this.revisionClock] } : {}),
    };
  }
}
