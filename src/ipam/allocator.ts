/**
 * The allocator: logic that takes a store (house style 2), the counterpart of host-local
 * `backend/allocator/allocator.go` `IPAllocator.Get` plus the per-range-set loop and rollback of
 * `main.go` `cmdAdd` (containernetworking/plugins). No I/O of its own: everything goes through the
 * injected {@link Store}, which the caller must have locked for the whole call.
 *
 * Deliberate differences from host-local (documented in docs and guarded by tests):
 * 1. Idempotent re-ADD: when (containerId, ifname) — or a legacy ID-only record of containerId —
 *    already holds an address in a range set, that address is returned (`existing: true`) instead
 *    of host-local's `<ip> has been allocated to <id>, duplicate allocation is not allowed`; the
 *    record is rewritten as `id\r\nifname` with a fresh mtime (`Store.rewrite`). A
 *    static request for a *different* address in that set still fails with host-local's text, so
 *    one (id, ifname) never gets two reservations in one range set.
 * 2. Rollback releases exactly the reservations this call created, re-checking the owner;
 *    host-local releases by ID, which also drops that container's pre-existing reservations.
 * 3. Requested IPs are matched to range sets in request order (host-local iterates a Go map).
 * 4. Only when the caller passes `kernelHeld` (the daemon's kernel address index, issue 19): an
 *    address configured in some network namespace is skipped like a reserved one.
 * (A corrupt record — owner null: empty or unparseable file — blocks its address here as in
 * host-local: an ordinary ADD does not ask the kernel whether a pod still uses that address. Only
 * the reconciler and the reclaim on exhaustion release it, under the evidence rules; issue 7.)
 */

import { AppError, isAppError } from '../common/errors.ts';
import type { Owner, Reservation, ReservationIndex, Store } from '../store/store.ts';
import { ownerMatches } from '../store/store.ts';
import { compareIP, formatIP, ipEquals, parseIP } from '../common/ip.ts';
import { RangeSetIterator } from './iterator.ts';
import { rangeContains, rangeFor, rangeSetContains, rangeSetSize, rangeSetString } from './range.ts';
import type { IP, Range, RangeSet } from './types.ts';

/** One ADD's allocation request. */
export interface AllocateRequest {
  /** `CNI_CONTAINERID` (validated by the caller). */
  readonly containerId: string;
  /** `CNI_IFNAME` (validated by the caller). */
  readonly ifname: string;
  /** The config's range sets; one address is allocated per set, in order. */
  readonly rangeSets: readonly RangeSet[];
  /** Static requests (config `requestedIPs`), in request order. */
  readonly requestedIPs: readonly IP[];
}

/** The address allocated in one range set. */
export interface Allocation {
  /** Index of the range set (also the `last_reserved_ip.<N>` suffix). */
  readonly rangeSetIndex: number;
  readonly ip: IP;
  /** The range of the set that contains `ip` (its subnet gives the prefix, its gateway the result's gateway). */
  readonly range: Range;
  /** True when the reservation existed before this call (idempotent re-ADD). */
  readonly existing: boolean;
}

/** Fields of a {@link RangeExhaustedError}. */
export interface RangeExhaustion {
  /** Index of the exhausted range set. */
  readonly rangeSetIndex: number;
  /** The set as host-local prints it (`start-end[,start-end...]`). */
  readonly rangeSet: string;
  /** Allocatable addresses in the set (gateways excluded). */
  readonly size: bigint;
  /** Reservations found inside the set when allocation failed. */
  readonly reserved: number;
}

/**
 * A range set has no free address. The message is host-local's, byte for byte:
 * `failed to allocate for range <i>: no IP addresses available in range set: <set>`; the fields
 * let the caller reclaim leaked reservations of that set and retry.
 */
export class RangeExhaustedError extends AppError implements RangeExhaustion {
  readonly rangeSetIndex: number;
  readonly rangeSet: string;
  readonly size: bigint;
  readonly reserved: number;

  constructor(x: RangeExhaustion, opts: { details?: string } = {}) {
    super(
      'IPAM_RANGE_EXHAUSTED',
      `failed to allocate for range ${x.rangeSetIndex}: no IP addresses available in range set: ${x.rangeSet}`,
      {
        details:
          opts.details ??
          `range set ${x.rangeSetIndex} has ${x.size} allocatable addresses and ${x.reserved} reservations`,
      },
    );
    this.name = 'RangeExhaustedError';
    this.rangeSetIndex = x.rangeSetIndex;
    this.rangeSet = x.rangeSet;
    this.size = x.size;
    this.reserved = x.reserved;
  }
}

/** Map key of an address: its value, tagged above bit 128 for IPv4 so families never collide. */
const V4_TAG = 1n << 128n;
function keyOf(ip: IP): bigint {
  return ip.family === 4 ? ip.value | V4_TAG : ip.value;
}

interface Known {
  readonly ip: IP;
  /** The store's name for it (what release() needs). */
  readonly name: string;
  owner: Owner | null;
}

/**
 * Allocate one address per range set for (containerId, ifname). The caller holds the store lock.
 *
 * Per range set `i`, in order (host-local `cmdAdd` + `IPAllocator.Get`):
 * - the first pending requested IP inside the set is taken off the pending list; if there is one:
 *   it must not be its range's gateway (`requested ip <ip> is subnet's gateway`); if the
 *   container already holds exactly that address it is returned as existing; if it holds another
 *   address of the set: `<ip> has been allocated to <id>, duplicate allocation is not allowed`;
 *   otherwise it is reserved or the call fails with
 *   `requested IP address <ip> is not available in range set <set>`;
 * - without a request: an address the container already holds in the set is returned
 *   (`existing: true`, deliberate difference 1); otherwise candidates come from host-local's
 *   round-robin ({@link RangeSetIterator}, starting after `store.lastReservedIP(i)`), and the
 *   first one not reserved (per one `store.list()` taken at the start) for which `store.reserve`
 *   succeeds is used — `reserve` returning false (a writer we did not see) just moves on;
 * - no candidate left: {@link RangeExhaustedError}.
 * Errors of a set are prefixed `failed to allocate for range <i>: ` (codes kept). After the last
 * set, requested IPs that fit no set fail the call:
 * `failed to allocate all requested IPs: <ip> <ip>...`.
 *
 * On any failure every reservation created by this call is released again (owner re-checked)
 * before the error is thrown; pre-existing ones are untouched.
 *
 * Store traffic: one `list()`, one `lastReservedIP()` per set that needs a new address, one
 * `reserve()` per attempted address, so the work is
 * bounded by the number of reservations, not by the size of the range (an IPv6 /64 is fine).
 *
 * Fast path (issue 9): when the store offers a {@link ReservationIndex}
 * (`store.reservationIndex()` returns one), `listed` is not used and nothing is listed: the
 * container's reservations come from `ownedBy`, a full range set is recognised by counting
 * (`countTaken`, then `lastReservedIP` is not even read), and round robin walks the same candidate
 * order as {@link RangeSetIterator} but jumps over runs of taken addresses (`nextFree`, O(log n)).
 * The result — address chosen, store calls that change anything, errors and their texts — is the
 * same as the listing path's (tested by test/interop/indexed-store.test.ts against FileStore and by
 * test/unit/indexed-store.test.ts against the iterator). Only `reserve()` calls that would fail
 * (an unusable IP-named entry) are skipped.
 *
 * Kernel-held addresses (the daemon only, docs/daemon.md "The kernel address index"): when
 * `kernelHeld` is given, a candidate it returns true for is skipped exactly like a reserved one —
 * round robin moves on to the next address in host-local's order, a static request for it fails
 * with `requested IP address <ip> is not available in range set <set>` — and nothing is written for
 * it. It is asked only about addresses this call would otherwise try to reserve (not reserved,
 * not a gateway), in candidate order; addresses the container already
 * holds are returned without asking. Without it (the standalone plugin) nothing changes.
 *
 * @param listed optional result of `store.list()` taken by the caller under the same lock; when
 *   absent the allocator lists the store itself
 * @param kernelHeld optional predicate: true when the address is configured on an interface in
 *   some network namespace of the node (the caller records what it was asked)
 * @returns one allocation per range set, in range set order
 * @throws RangeExhaustedError; AppError IPAM_REQUESTED_IP_UNAVAILABLE, IPAM_DUPLICATE_ALLOCATION;
 *   store errors (STORE_IO, CLOSED, ...) prefixed as above
 */
export async function allocate(
  store: Store,
  req: AllocateRequest,
  listed?: readonly Reservation[],
  kernelHeld?: (ip: IP) => boolean,
): Promise<Allocation[]> {
  const containerId = req.containerId.trim();
  const owner = { containerId, ifname: req.ifname };

  // One listing per ADD: the taken addresses, keyed by value (no text work per candidate).
  // `listed`, when given, is a `store.list()` the caller took under the same lock (saves a
  // second read of every file).
  const known = new Map<bigint, Known>();
  const index = store.reservationIndex?.() ?? null;
  if (index === null) {
    for (const r of listed ?? (await store.list())) {
      const ip = parseIP(r.ip);
      if (ip === null) continue;
      known.set(keyOf(ip), { ip, name: r.ip, owner: r.owner });
    }
  }

  const pending: IP[] = [...req.requestedIPs];
  const created: string[] = [];
  const results: Allocation[] = [];

  try {
    for (let i = 0; i < req.rangeSets.length; i++) {
      const set = req.rangeSets[i] as RangeSet;
      try {
        results.push(await allocateInSet(store, set, i, owner, known, index, pending, created, kernelHeld));
      } catch (e) {
        if (e instanceof RangeExhaustedError || !isAppError(e)) throw e;
        throw new AppError(e.code, `failed to allocate for range ${i}: ${e.message}`, {
          details: e.details,
          retryable: e.isRetryable,
          cause: e,
        });
      }
    }
    if (pending.length > 0) {
      throw new AppError(
        'IPAM_REQUESTED_IP_UNAVAILABLE',
        `failed to allocate all requested IPs: ${pending.map(formatIP).join(' ')}`,
      );
    }
    return results;
  } catch (e) {
    throw await rollback(store, owner, created, e);
  }
}

async function allocateInSet(
  store: Store,
  set: RangeSet,
  i: number,
  owner: { containerId: string; ifname: string },
  known: Map<bigint, Known>,
  index: ReservationIndex | null,
  pending: IP[],
  created: string[],
  kernelHeld: ((ip: IP) => boolean) | undefined,
): Promise<Allocation> {
  const setText = (): string => rangeSetString(set);

  // What this container already holds in the set: exact (id, ifname) first, then legacy ID-only.
  const mine: Known[] = [];
  if (index === null) {
    for (const k of known.values()) {
      if (ownerMatches(k.owner, owner.containerId, owner.ifname) && rangeSetContains(set, k.ip)) mine.push(k);
    }
  } else {
    for (const r of index.ownedBy(owner.containerId, owner.ifname)) {
      const ip = parseIP(r.ip);
      if (ip !== null && rangeSetContains(set, ip)) mine.push({ ip, name: r.ip, owner: r.owner });
    }
  }
  mine.sort((a, b) => {
    const la = a.owner?.ifname === null ? 1 : 0;
    const lb = b.owner?.ifname === null ? 1 : 0;
    return la - lb || compareIP(a.ip, b.ip);
  });

  /**
   * The container's existing reservation, claimed for this ifname: a legacy ID-only record becomes
   * `id\r\nifname` (so another interface of the container gets its own address, and DEL of one
   * interface cannot free the other's), and the record's mtime is refreshed (the set-up is in
   * flight again: the reconciler's grace period starts over).
   */
  const existing = async (k: Known): Promise<Allocation> => {
    if (k.owner !== null && !(await store.rewrite(k.name, k.owner, owner))) {
      // Only a writer ignoring the lock could change it under us: do not hand it out.
      throw new AppError('STORE_IO', `reservation ${k.name} changed while it was being claimed`);
    }
    known.set(keyOf(k.ip), { ...k, owner: { containerId: owner.containerId, ifname: owner.ifname } });
    return { rangeSetIndex: i, ip: k.ip, range: set[rangeFor(set, k.ip)] as Range, existing: true };
  };

  /**
   * Reserve `ip` for the owner. Any record in the way, a corrupt one included, means taken: whether
   * a pod still uses a corrupt record's address is for the evidence rules to say (reclaim), not
   * for an ordinary ADD. So does an address the kernel shows configured (`kernelHeld`).
   */
  const tryReserve = async (ip: IP): Promise<boolean> => {
    const key = keyOf(ip);
    if (index === null ? known.has(key) : index.isTaken(ip.family, ip.value)) return false;
    if (kernelHeld !== undefined && kernelHeld(ip)) return false;
    const text = formatIP(ip);
    const ok = await store.reserve(text, owner, i);
    if (ok) {
      created.push(text);
      known.set(key, { ip, name: text, owner: { containerId: owner.containerId, ifname: owner.ifname } });
    }
    return ok;
  };

  // Static request: the first pending IP that lies in this set.
  const reqIdx = pending.findIndex((ip) => rangeSetContains(set, ip));
  if (reqIdx >= 0) {
    const requested = pending.splice(reqIdx, 1)[0] as IP;
    const ri = rangeFor(set, requested);
    if (ri < 0) throw new AppError('IPAM_REQUESTED_IP_UNAVAILABLE', `${formatIP(requested)} not in range set ${setText()}`);
    const range = set[ri] as Range;
    if (ipEquals(requested, range.gateway)) {
      throw new AppError('IPAM_REQUESTED_IP_UNAVAILABLE', `requested ip ${formatIP(requested)} is subnet's gateway`);
    }
    const same = mine.find((k) => ipEquals(k.ip, requested));
    if (same !== undefined) return await existing(same);
    if (mine.length > 0) throw duplicate(mine[0] as Known, owner.containerId);
    if (!(await tryReserve(requested))) {
      throw new AppError(
        'IPAM_REQUESTED_IP_UNAVAILABLE',
        `requested IP address ${formatIP(requested)} is not available in range set ${setText()}`,
      );
    }
    return { rangeSetIndex: i, ip: requested, range, existing: false };
  }

  // Idempotent re-ADD (difference 1).
  if (mine.length > 0) return await existing(mine[0] as Known);

  if (index !== null) {
    const got = await roundRobinIndexed(store, index, set, i, tryReserve);
    if (got !== null) return got;
    let reserved = 0;
    for (const r of set) reserved += index.countReserved(r.rangeStart.family, r.rangeStart.value, r.rangeEnd.value);
    throw new RangeExhaustedError({ rangeSetIndex: i, rangeSet: setText(), size: rangeSetSize(set), reserved });
  }

  // Round robin after last_reserved_ip.<i>.
  const lastText = await store.lastReservedIP(i);
  const last = lastText === null ? null : parseIP(lastText);
  const iter = new RangeSetIterator(set, last);
  for (let c = iter.next(); c !== null; c = iter.next()) {
    // Skip addresses known to be reserved (corrupt records included) without a round trip
    // through the store (hot on full ranges).
    if (known.has(keyOf(c.ip))) continue;
    if (await tryReserve(c.ip)) return { rangeSetIndex: i, ip: c.ip, range: c.range, existing: false };
  }

  let reserved = 0;
  for (const k of known.values()) if (rangeSetContains(set, k.ip)) reserved++;
  throw new RangeExhaustedError({ rangeSetIndex: i, rangeSet: setText(), size: rangeSetSize(set), reserved });
}

/**
 * Round robin through a {@link ReservationIndex}: the candidates of {@link RangeSetIterator} in the
 * same order (after `last_reserved_ip.<i>`, wrapping, each range's gateway skipped), without
 * offering taken addresses one by one. Resolves to the allocation, or null when no candidate could
 * be reserved (the caller throws the exhaustion error). A set with no untaken address is known
 * from counts alone (O(ranges · log n)), before `lastReservedIP` is read.
 */
async function roundRobinIndexed(
  store: Store,
  index: ReservationIndex,
  set: RangeSet,
  i: number,
  tryReserve: (ip: IP) => Promise<boolean>,
): Promise<Allocation | null> {
  let free = 0n;
  for (const r of set) {
    const f = r.rangeStart.family;
    const gwIn = r.gateway.family === f && r.gateway.value >= r.rangeStart.value && r.gateway.value <= r.rangeEnd.value;
    let taken = BigInt(index.countTaken(f, r.rangeStart.value, r.rangeEnd.value));
    if (gwIn && index.isTaken(f, r.gateway.value)) taken -= 1n;
    free += r.rangeEnd.value - r.rangeStart.value + 1n - (gwIn ? 1n : 0n) - taken;
  }
  if (free <= 0n) return null;

  const lastText = await store.lastReservedIP(i);
  const last = lastText === null ? null : parseIP(lastText);
  for (const seg of iteratorSegments(set, last)) {
    const r = set[seg.rangeIndex] as Range;
    const f = r.rangeStart.family;
    const gw = r.gateway.family === f ? r.gateway.value : -1n;
    for (let v = seg.lo; v <= seg.hi; v++) {
      v = index.nextFree(f, v);
      if (v > seg.hi) break;
      if (v === gw) continue; // never hand out the gateway
      const ip: IP = { family: f, value: v };
      if (await tryReserve(ip)) return { rangeSetIndex: i, ip, range: r, existing: false };
    }
  }
  return null;
}

/** An inclusive interval of one range of a set: `[lo, hi]` of `set[rangeIndex]`. */
interface Segment {
  readonly rangeIndex: number;
  readonly lo: bigint;
  readonly hi: bigint;
}

/**
 * The addresses {@link RangeSetIterator} offers for (`set`, `last`), in its order, as intervals
 * (gateways not yet removed). Start: the address after `last` when a range contains it (the next
 * range's start when `last` is its range's end), else range 0's start; then round the ranges,
 * wrapping, each address once, ending with `last` itself.
 */
export function iteratorSegments(set: RangeSet, last: IP | null): Segment[] {
  const n = set.length;
  const whole = (k: number): Segment => {
    const r = set[k % n] as Range;
    return { rangeIndex: k % n, lo: r.rangeStart.value, hi: r.rangeEnd.value };
  };
  const ri = last === null ? -1 : set.findIndex((r) => rangeContains(r, last));
  const out: Segment[] = [];
  if (ri < 0 || last === null) {
    for (let k = 0; k < n; k++) out.push(whole(k));
  } else if (ipEquals(last, (set[ri] as Range).rangeEnd)) {
    for (let k = 1; k <= n; k++) out.push(whole(ri + k));
  } else {
    const r = set[ri] as Range;
    out.push({ rangeIndex: ri, lo: last.value + 1n, hi: r.rangeEnd.value });
    for (let k = 1; k < n; k++) out.push(whole(ri + k));
    out.push({ rangeIndex: ri, lo: r.rangeStart.value, hi: last.value });
  }
  return out;
}

function duplicate(k: Known, containerId: string): AppError {
  return new AppError(
    'IPAM_DUPLICATE_ALLOCATION',
    `${formatIP(k.ip)} has been allocated to ${containerId}, duplicate allocation is not allowed`,
  );
}

/** Release what this call created; return the error to throw (original, noting rollback failures). */
async function rollback(
  store: Store,
  owner: { containerId: string; ifname: string },
  created: readonly string[],
  err: unknown,
): Promise<unknown> {
  const failures: string[] = [];
  for (const ip of [...created].reverse()) {
    try {
      await store.release(ip, owner);
    } catch (e) {
      failures.push(`${ip}: ${(e as Error).message}`);
    }
  }
  if (failures.length === 0 || !isAppError(err)) return err;
  const note = `rollback could not release ${failures.join('; ')}`;
  const details = err.details ? `${err.details}; ${note}` : note;
  if (err instanceof RangeExhaustedError) return new RangeExhaustedError(err, { details });
  return new AppError(err.code, err.message, { details, retryable: err.isRetryable, cause: err });
}
