/**
 * Ranges and range sets: canonicalisation with host-local's defaults and messages, membership,
 * overlap and size. Counterpart of host-local `backend/allocator/range.go` and `range_set.go`
 * (containernetworking/plugins; messages checked against the v1.1.1 binary).
 *
 * Pure: values in, values out. Errors are `AppError('IPAM_INVALID_CONFIG', <host-local text>)`
 * with the bare host-local message; the config loader prefixes `invalid range set <i>: `.
 */

import { AppError } from '../common/errors.ts';
import type { ParsedCIDR } from '../common/ip.ts';
import { familyBits, formatIP, ipAdd, lastAddress, maskIP, subnetContains } from '../common/ip.ts';
import type { IP, Range, RangeSet, Subnet } from './types.ts';

/**
 * One range as decoded from JSON, before canonicalisation. Text has already been parsed
 * (host-local parses addresses while decoding JSON, so bad text fails before any range check).
 * `null`/absent means "not given".
 */
export interface RawRange {
  /** `subnet`, or null when absent (host-local then fails with `IP <nil> not v4 nor v6`). */
  readonly subnet: ParsedCIDR | null;
  readonly rangeStart?: IP | null;
  readonly rangeEnd?: IP | null;
  readonly gateway?: IP | null;
}

function invalid(msg: string): AppError {
  return new AppError('IPAM_INVALID_CONFIG', msg);
}

/** Go `ip.Cmp`: compares the integer values, whatever the families. */
function goCmp(a: IP, b: IP): number {
  return a.value < b.value ? -1 : a.value > b.value ? 1 : 0;
}

/**
 * Canonicalise one range exactly like host-local `Range.Canonicalize`:
 * - `Network <cidr> too small to allocate from` when the prefix leaves fewer than 2 host bits
 *   (/31, /32, IPv6 /127, /128); `<cidr>` is the address as written;
 * - `IPNet IP and Mask version mismatch` for an IPv4-mapped address with an IPv6 prefix;
 * - `Network has host bits set. For a subnet mask of length <n> the network address is <ip>`;
 * - `gateway` defaults to subnet+1; a given gateway is taken as is (host-local 1.1.1 does not
 *   check that it lies in the subnet, and neither do we: configs that work there must work here);
 * - `rangeStart` defaults to subnet+1 (the iterator skips the gateway), must lie in the subnet:
 *   `RangeStart <ip> not in network <cidr>`;
 * - `rangeEnd` defaults to the last address, minus one for IPv4 (broadcast); must lie in the
 *   subnet: `RangeEnd <ip> not in network <cidr>`;
 * - then `RangeStart <ip> is after RangeEnd <ip>` when start > end.
 *
 * Deliberate difference with host-local 1.1.1 (the last rule): 1.1.1 compares an explicit start
 * with an explicit end inside its "not in network" check (so it reports `RangeStart 10.1.3.0 not
 * in network 10.1.0.0/16` for start 10.1.3.0, end 10.1.2.0) and never compares a start with the
 * *default* end, so `rangeStart` = the IPv4 broadcast address is accepted and its iterator then
 * walks out of the subnet. Newer upstream rejects start > end (containernetworking/plugins#1293);
 * we always do, with the message above.
 *
 * Addresses at the subnet's edges that host-local accepts stay accepted (e.g. `rangeStart` = the
 * network address), for compatibility.
 *
 * @throws AppError IPAM_INVALID_CONFIG with the bare message.
 */
export function canonicalizeRange(raw: RawRange): Range {
  const parsed = raw.subnet;
  if (parsed === null) throw invalid('IP <nil> not v4 nor v6');
  const { ip, maskBits } = parsed;
  const prefix = parsed.subnet.prefix;
  if (prefix > maskBits - 2) {
    throw invalid(`Network ${formatIP(ip)}/${prefix} too small to allocate from`);
  }
  if (maskBits !== familyBits(ip.family)) throw invalid('IPNet IP and Mask version mismatch');
  const network = maskIP(ip, prefix);
  if (network.value !== ip.value) {
    throw invalid(
      `Network has host bits set. For a subnet mask of length ${prefix} the network address is ${formatIP(network)}`,
    );
  }
  const subnet: Subnet = { ip: network, prefix };
  const subnetText = `${formatIP(network)}/${prefix}`;
  const first = ipAdd(network, 1n);

  const gateway = raw.gateway ?? first;

  let rangeStart: IP;
  if (raw.rangeStart != null) {
    rangeStart = raw.rangeStart;
    if (!subnetContains(subnet, rangeStart)) {
      throw invalid(`RangeStart ${formatIP(rangeStart)} not in network ${subnetText}`);
    }
  } else {
    rangeStart = first;
  }

  let rangeEnd: IP;
  if (raw.rangeEnd != null) {
    rangeEnd = raw.rangeEnd;
    if (!subnetContains(subnet, rangeEnd)) {
      throw invalid(`RangeEnd ${formatIP(rangeEnd)} not in network ${subnetText}`);
    }
  } else {
    const last = lastAddress(subnet);
    rangeEnd = network.family === 4 ? ipAdd(last, -1n) : last;
  }

  if (goCmp(rangeStart, rangeEnd) > 0) {
    throw invalid(`RangeStart ${formatIP(rangeStart)} is after RangeEnd ${formatIP(rangeEnd)}`);
  }

  return { subnet, rangeStart, rangeEnd, gateway };
}

/**
 * Does range `r` contain `ip`: same family, inside the subnet, and between `rangeStart` and
 * `rangeEnd` inclusive (host-local `Range.Contains`). The gateway is "contained" too.
 */
export function rangeContains(r: Range, ip: IP): boolean {
  return (
    ip.family === r.subnet.ip.family &&
    ip.value >= r.rangeStart.value &&
    ip.value <= r.rangeEnd.value &&
    subnetContains(r.subnet, ip)
  );
}

/** `start-end` (host-local `Range.String`). */
export function rangeString(r: Range): string {
  return `${formatIP(r.rangeStart)}-${formatIP(r.rangeEnd)}`;
}

/** Do two ranges overlap (host-local `Range.Overlaps`: same family and an endpoint of one in the other)? */
export function rangesOverlap(a: Range, b: Range): boolean {
  if (a.rangeStart.family !== b.rangeStart.family) return false;
  return (
    rangeContains(a, b.rangeStart) ||
    rangeContains(a, b.rangeEnd) ||
    rangeContains(b, a.rangeStart) ||
    rangeContains(b, a.rangeEnd)
  );
}

/**
 * Canonicalise a range set like host-local `RangeSet.Canonicalize`: `empty range set`; each range
 * per {@link canonicalizeRange} (its message, unprefixed); `mixed address families`; then
 * `subnets <a> and <b> overlap` where `<a>`/`<b>` are `start-end` (host-local prints the ranges,
 * not the subnets, despite the wording).
 *
 * @throws AppError IPAM_INVALID_CONFIG with the bare message.
 */
export function canonicalizeRangeSet(raws: readonly RawRange[]): RangeSet {
  if (raws.length === 0) throw invalid('empty range set');
  const out: Range[] = [];
  for (let i = 0; i < raws.length; i++) {
    const r = canonicalizeRange(raws[i] as RawRange);
    if (i > 0 && r.rangeStart.family !== (out[0] as Range).rangeStart.family) {
      throw invalid('mixed address families');
    }
    out.push(r);
  }
  for (let i = 0; i < out.length - 1; i++) {
    for (let j = i + 1; j < out.length; j++) {
      const a = out[i] as Range;
      const b = out[j] as Range;
      if (rangesOverlap(a, b)) throw invalid(`subnets ${rangeString(a)} and ${rangeString(b)} overlap`);
    }
  }
  return out;
}

/** Does any range of `a` overlap any range of `b` (host-local `RangeSet.Overlaps`)? */
export function rangeSetOverlaps(a: RangeSet, b: RangeSet): boolean {
  for (const r of a) for (const r1 of b) if (rangesOverlap(r, r1)) return true;
  return false;
}

/**
 * The range set as host-local prints it in errors (`RangeSet.String`): each range's
 * `rangeStart-rangeEnd`, joined by `,`. E.g. `10.10.10.20-10.10.10.22,10.20.20.20-10.20.20.21`.
 */
export function rangeSetString(rs: RangeSet): string {
  return rs.map(rangeString).join(',');
}

/** Index of the first range of `rs` that contains `ip` (see {@link rangeContains}), or -1. */
export function rangeFor(rs: RangeSet, ip: IP): number {
  for (let i = 0; i < rs.length; i++) if (rangeContains(rs[i] as Range, ip)) return i;
  return -1;
}

/** Does some range of `rs` contain `ip`? */
export function rangeSetContains(rs: RangeSet, ip: IP): boolean {
  return rangeFor(rs, ip) >= 0;
}

/**
 * Number of allocatable addresses of `rs`: for each range `end - start + 1`, minus one when its
 * gateway lies within `[start, end]` (the iterator skips it). A bigint: an IPv6 /64 has 2^64.
 */
export function rangeSetSize(rs: RangeSet): bigint {
  let n = 0n;
  for (const r of rs) {
    n += r.rangeEnd.value - r.rangeStart.value + 1n;
    if (
      r.gateway.family === r.rangeStart.family &&
      r.gateway.value >= r.rangeStart.value &&
      r.gateway.value <= r.rangeEnd.value
    ) {
      n -= 1n;
    }
  }
  return n;
}
