/**
 * host-local's round-robin candidate order (backend/allocator/allocator.go `GetIter` and
 * `RangeIter.Next`, containernetworking/plugins), reproduced step for step so that ipwarden and
 * host-local hand out the same address from the same state.
 *
 * Constant memory: the iterator holds a cursor, never a list of the range's addresses, so an IPv6
 * /64 costs nothing up front.
 */

import { ipAdd, ipEquals } from '../common/ip.ts';
import { rangeContains } from './range.ts';
import type { IP, Range, RangeSet } from './types.ts';

/** A candidate address and the range it belongs to. */
export interface Candidate {
  readonly ip: IP;
  /** Index of the range within the range set. */
  readonly rangeIndex: number;
  readonly range: Range;
}

/**
 * The round-robin iterator over one range set.
 *
 * Start: when `lastReserved` lies in the set (in the first range containing it), the first
 * candidate is the address after it (wrapping to the next range's start after a range end);
 * otherwise the first candidate is range 0's `rangeStart`. Ranges are walked in order, wrapping
 * from the last to the first; each range's gateway is skipped; iteration ends when the cursor
 * comes back to the first address it produced (or would have produced, when that was a gateway).
 * So every address of the set except the gateways is offered exactly once, the last reserved IP
 * itself last. This mirrors `GetIter`'s comment: "a crash-looping container will not see the same
 * IP until the entire range has been run through".
 *
 * Edge cases kept identical to upstream: a start on a gateway, a last reserved IP that is a range
 * end (next candidate is the following range's start: the historic infinite loop,
 * containernetworking/plugins#594, cannot occur because the stop check compares against the first
 * cursor position and every step moves the cursor), single-address ranges.
 */
export class RangeSetIterator {
  readonly #ranges: RangeSet;
  #rangeIdx: number;
  #cur: IP | null;
  #start: IP | null;
  #done = false;

  /**
   * @param rangeSet canonical, non-empty range set
   * @param lastReserved the set's `last_reserved_ip`, or null when unknown
   */
  constructor(rangeSet: RangeSet, lastReserved: IP | null) {
    if (rangeSet.length === 0) throw new RangeError('empty range set');
    this.#ranges = rangeSet;
    this.#rangeIdx = 0;
    this.#cur = null;
    this.#start = null;
    if (lastReserved !== null) {
      for (let i = 0; i < rangeSet.length; i++) {
        if (rangeContains(rangeSet[i] as Range, lastReserved)) {
          this.#rangeIdx = i;
          // Next() advances before returning, so the first candidate is lastReserved + 1.
          this.#cur = lastReserved;
          break;
        }
      }
    }
  }

  /** The next candidate, or null once the set has been walked round. */
  next(): Candidate | null {
    if (this.#done) return null;
    for (;;) {
      let r = this.#ranges[this.#rangeIdx] as Range;
      if (this.#cur === null) {
        // First call without a usable last reserved IP: start at range 0's rangeStart (inclusive).
        this.#cur = r.rangeStart;
        this.#start = this.#cur;
      } else {
        if (ipEquals(this.#cur, r.rangeEnd)) {
          // rangeEnd is inclusive: move on to the next range, wrapping.
          this.#rangeIdx = (this.#rangeIdx + 1) % this.#ranges.length;
          r = this.#ranges[this.#rangeIdx] as Range;
          this.#cur = r.rangeStart;
        } else {
          this.#cur = ipAdd(this.#cur, 1n);
        }
        if (this.#start === null) {
          this.#start = this.#cur;
        } else if (ipEquals(this.#cur, this.#start)) {
          // Back where we started: every address has been offered.
          this.#done = true;
          return null;
        }
      }
      if (ipEquals(this.#cur, r.gateway)) continue; // never hand out the gateway
      return { ip: this.#cur, rangeIndex: this.#rangeIdx, range: r };
    }
  }
}
