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
 *      second holder's allocation. Without store events for both holds it stands.
 * 9. `bad-op`: an operation whose own record is malformed (end before start, a successful ADD
 *    without IPs, an IP that is not an address) — a broken recorder must not pass silently;
 *    `bad-state`: likewise a state entry whose IP or block CIDR does not parse.
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
}

/** A recorded run. */
export interface History {
  ops: Op[];
  checkpoints: Checkpoint[];
  /** The store's committed allocation history, if the store can give it (rule 8). */
  storeEvents?: StoreEvent[];
}

/** A hold in the store's history: `holder` held `ip` from revision `from` until `to` (Infinity: still held). */
export interface StoreHold {
  ip: string;
  holder: string;
  from: number;
  to: number;
}

/**
 * The holds of `events` (sorted here by revision; events of one revision keep their order, a
 * release before an allocation). Also returns the revisions where an address changed holder
 * without a release in between (`overlaps`: the store itself had two holders).
 */
export function storeHoldsOf(events: readonly StoreEvent[]): { holds: StoreHold[]; overlaps: { ip: string; first: StoreHold; second: StoreHold }[] } {
  const sorted = events.map((e, i) => ({ e, i })).sort((a, b) => a.e.rev - b.e.rev || (a.e.holder === null ? 0 : 1) - (b.e.holder === null ? 0 : 1) || a.i - b.i);
  const open = new Map<string, StoreHold>();
  const holds: StoreHold[] = [];
  const overlaps: { ip: string; first: StoreHold; second: StoreHold }[] = [];
  for (const { e } of sorted) {
    const ip = canonicalIP(e.ip) ?? e.ip;
    const cur = open.get(ip);
    if (e.holder === null) {
      if (cur !== undefined) {
        cur.to = e.rev;
        open.delete(ip);
      }
      continue;
    }
    const holder = holderOf(e.holder.containerId, e.holder.ifname);
    if (cur !== undefined && cur.holder === holder) continue; // rewritten, same holder
    const h: StoreHold = { ip, holder, from: e.rev, to: Infinity };
    if (cur !== undefined) overlaps.push({ ip, first: cur, second: h });
    holds.push(h);
    open.set(ip, h);
  }
  return { holds, overlaps };
}

/** The kinds of violation; see the module comment. */
export type ViolationKind = 'duplicate' | 'lost' | 'state-duplicate' | 'block-owners' | 'not-empty' | 'readd-changed' | 'zombie' | 'store-duplicate' | 'unconfirmed' | 'bad-op' | 'bad-state';

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
 * Check `h` against the rules in the module comment.
 *
 * @returns every violation found (empty when none), in rule order. Never throws on a malformed
 *   history: a malformed op or state entry is itself a violation.
 */
export function checkHistory(h: History): Violation[] {
  const out: Violation[] = [];
  for (const op of h.ops) {
    const why = badOp(op);
    if (why !== null) out.push({ kind: 'bad-op', message: `${fmtOp(op)}: ${why}`, ops: [op.id] });
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
  /** True when the store's history puts every hold of `a` on `ip` before every hold of `b` (or after). */
  const storeOrders = (ip: string, a: string, b: string): boolean => {
    const ha = storeByKey.get(`${ip} ${a}`) ?? [];
    const hb = storeByKey.get(`${ip} ${b}`) ?? [];
    if (ha.length === 0 || hb.length === 0) return false;
    return ha.every((x) => hb.every((y) => x.to <= y.from || y.to <= x.from));
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
        const certain = b.add.end <= (a.del?.start ?? Infinity) && a.add.end <= b.firstDelStart;
        if (!certain && storeOrders(ip, a.holder, b.holder)) continue; // rule 8: the commits order them
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
        out.push({ kind: 'unconfirmed', message: `${fmtOp(x.add)}: the store never committed ${x.ip} for ${x.holder}`, ops: [x.add.id] });
      }
    }
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
      const who = holderOf(a.containerId, a.ifname);
      const prev = owner.get(ip);
      if (prev !== undefined) out.push({ kind: 'state-duplicate', message: `${where}: ${ip} listed twice (${prev}, ${who})`, ops: [] });
      else owner.set(ip, who);
    }
    // 2. lost
    for (const x of holds) {
      if (!(x.add.end <= cp.start && x.firstDelStart >= cp.end)) continue;
      const got = owner.get(x.ip);
      if (got !== x.holder) {
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
      const holder = holderOf(a.containerId, a.ifname);
      const mine = (opsByHolder.get(holder) ?? []);
      const may = mine.some(
        (add) => add.kind === 'ADD' && add.start < cp.end && !mine.some((d) => d.kind === 'DEL' && d.outcome === 'ok' && d.start > add.start && d.end <= cp.start),
      );
      if (!may) out.push({ kind: 'zombie', message: `${where}: ${a.ip} is listed for ${holder}, which cannot hold anything then`, ops: mine.map((o) => o.id) });
    }
    // 5. not-empty
    if (cp.final === true && cp.allocations.length > 0) {
      const list = cp.allocations.slice(0, 10).map((a) => `${a.ip} ${holderOf(a.containerId, a.ifname)}`);
      out.push({ kind: 'not-empty', message: `${where} (final): ${cp.allocations.length} allocation(s) left: ${list.join('; ')}${cp.allocations.length > 10 ? ' …' : ''}`, ops: [] });
    }
  }
  return out;
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

  /** Read the pool's state with `read` and record it as a checkpoint spanning the read. */
  async checkpoint(read: () => Promise<{ blocks: StateBlock[]; allocations: StateAllocation[] }>, final = false): Promise<Checkpoint> {
    const start = this.now();
    const s = await read();
    const cp: Checkpoint = { start, end: this.now(), blocks: s.blocks, allocations: s.allocations, ...(final ? { final } : {}) };
    this.checkpoints.push(cp);
    return cp;
  }

  /** The recorded history. An op never finished counts as unknown and never ended. */
  history(): History {
    return { ops: this.ops.map((o) => (Number.isNaN(o.end) ? { ...o, end: Infinity, outcome: 'unknown' as const } : o)), checkpoints: this.checkpoints };
  }
}
