/**
 * Pure block math of a cluster pool (issue 11; Calico's blocks, anchors.md §5.1): the ranges of a
 * range set cut into aligned blocks of `blockSize` bits (default /26 IPv4, /122 IPv6), the
 * allocatable ordinals of a block, a node's preferred first block, and the key text of a block.
 *
 * A block is the aligned CIDR of prefix `max(blockSize, subnet prefix)` (a subnet smaller than a
 * block is one block) that holds at least one allocatable address of the range set. Allocatable
 * = inside some range of the set (`rangeStart`–`rangeEnd`, which already exclude the network and
 * IPv4 broadcast addresses) and not that range's gateway — the same addresses host-local's
 * iterator would hand out. Ordinal = address − block base (0 … 2^(bits−prefix) − 1).
 */
import { familyBits, formatIP, type IP, type Subnet } from '../common/ip.ts';
import { rangeFor } from '../ipam/range.ts';
import type { Range, RangeSet } from '../ipam/types.ts';

/** One block: its CIDR and its range set's index. */
export interface Block {
  readonly cidr: Subnet;
  /** Index of the range set of the network config it belongs to. */
  readonly rangeSetIndex: number;
}

/** Block prefix lengths per family. */
export interface BlockSizes {
  readonly blockSize4: number;
  readonly blockSize6: number;
}

/** The block prefix length for `range`: the family's block size, or the subnet's prefix when that is longer. */
export function blockPrefix(range: Range, sizes: BlockSizes): number {
  const b = range.subnet.ip.family === 4 ? sizes.blockSize4 : sizes.blockSize6;
  return Math.max(b, range.subnet.prefix);
}

/** Number of addresses of a block of prefix `prefix` in `family` (bigint). */
export function blockAddresses(family: 4 | 6, prefix: number): bigint {
  return 1n << BigInt(familyBits(family) - prefix);
}

/** The CIDR text of a block (`10.80.0.64/26`). */
export function blockCidrText(cidr: Subnet): string {
  return `${formatIP(cidr.ip)}/${cidr.prefix}`;
}

/** Is `ordinal` of block `cidr` an allocatable address of `rs`? */
export function isAllocatable(rs: RangeSet, cidr: Subnet, ordinal: number): boolean {
  const ip: IP = { family: cidr.ip.family, value: cidr.ip.value + BigInt(ordinal) };
  const k = rangeFor(rs, ip);
  return k >= 0 && (rs[k] as Range).gateway.value !== ip.value;
}

/** The allocatable ordinals of block `cidr` in `rs`, ascending. */
export function allocatableOrdinals(rs: RangeSet, cidr: Subnet): number[] {
  const n = Number(blockAddresses(cidr.ip.family, cidr.prefix));
  const out: number[] = [];
  for (let o = 0; o < n; o++) if (isAllocatable(rs, cidr, o)) out.push(o);
  return out;
}

/**
 * How many ordinals of block `cidr` are allocatable addresses of `rs`: the same number as
 * `allocatableOrdinals(rs, cidr).length`, without visiting each address — per range, the overlap
 * of `[rangeStart, rangeEnd]` with the block, less one when that range's own gateway lies in the
 * overlap ({@link isAllocatable}'s rule). O(ranges); exact for a canonical range set (its ranges
 * do not overlap: `canonicalizeRangeSet`). The pool gauges count every claimed block with it.
 */
export function allocatableCount(rs: RangeSet, cidr: Subnet): number {
  const first = cidr.ip.value;
  const last = first + blockAddresses(cidr.ip.family, cidr.prefix) - 1n;
  let n = 0n;
  for (const r of rs) {
    if (r.rangeStart.family !== cidr.ip.family) continue;
    const lo = r.rangeStart.value > first ? r.rangeStart.value : first;
    const hi = r.rangeEnd.value < last ? r.rangeEnd.value : last;
    if (lo > hi) continue;
    n += hi - lo + 1n;
    if (r.gateway.family === cidr.ip.family && r.gateway.value >= lo && r.gateway.value <= hi) n -= 1n;
  }
  return Number(n);
}

/** The address of `ordinal` in block `cidr`. */
export function ordinalIP(cidr: Subnet, ordinal: number): IP {
  return { family: cidr.ip.family, value: cidr.ip.value + BigInt(ordinal) };
}

/**
 * Every block of range set `rs` (index `rangeSetIndex`), in address order, without duplicates
 * (two ranges of one set may share a subnet), lazily (an IPv6 /64 has 2^58 blocks of /122).
 */
export function* blocksOf(rs: RangeSet, rangeSetIndex: number, sizes: BlockSizes): Generator<Block> {
  const spans = rs
    .map((r) => {
      const prefix = blockPrefix(r, sizes);
      const size = blockAddresses(r.subnet.ip.family, prefix);
      return { prefix, size, first: (r.rangeStart.value / size) * size, last: (r.rangeEnd.value / size) * size, family: r.subnet.ip.family };
    })
    .sort((a, b) => (a.first < b.first ? -1 : a.first > b.first ? 1 : 0));
  let lastYielded = -1n;
  for (const s of spans) {
    for (let base = s.first; base <= s.last; base += s.size) {
      if (base <= lastYielded) continue;
      const cidr: Subnet = { ip: { family: s.family, value: base }, prefix: s.prefix };
      // A block whose only addresses are a gateway (or lie outside the ranges) holds nothing.
      if (!anyAllocatable(rs, cidr)) continue;
      lastYielded = base;
      yield { cidr, rangeSetIndex };
    }
  }
}

function anyAllocatable(rs: RangeSet, cidr: Subnet): boolean {
  const n = blockAddresses(cidr.ip.family, cidr.prefix);
  // Blocks are small (≤ 256 addresses: blockSize ≥ /24, ≥ /120): a scan is cheap; stop at the first hit.
  for (let o = 0n; o < n; o++) if (isAllocatable(rs, cidr, Number(o))) return true;
  return false;
}

/** Number of blocks of `rs` (bigint; counts lazily only up to `cap`, then returns `cap`). */
export function countBlocks(rs: RangeSet, sizes: BlockSizes, cap = 1n << 20n): bigint {
  let n = 0n;
  for (const _ of blocksOf(rs, 0, sizes)) {
    void _;
    if (++n >= cap) return cap;
  }
  return n;
}

/**
 * FNV-1a (32 bit) of `text`: a node's start position among the free blocks, so nodes claiming at
 * once try different blocks first (Calico seeds its random block choice with the host name:
 * ipam-core-library.md). Deterministic, so tests know which block a node claims.
 */
export function nodeHash(text: string): number {
  let h = 0x811c9dc5;
  for (const b of Buffer.from(text, 'utf8')) {
    h ^= b;
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h >>> 0;
}
