/**
 * Wanted ordinals (docs/cluster.md "Re-reserving live pods' addresses", "Restoring etcd from a
 * backup"): after a restore, node A's READY sandbox S may use address X while the restored pool
 * says X is allocated to another holder C (a pod since deleted, whose handle another node's daemon
 * will release as a leak). A's re-reservation never takes X from C (a `conflict`); it records in
 * X's block that S of node A **wants** X (`"wanted":{"<ordinal>":{"sandbox","node","at"}}`), so
 * that when C's allocation is released X does not become free: no allocation path hands a wanted
 * ordinal out ({@link isWanted}), no release path drops the want, and a block with a want is never
 * given back or deleted as empty ({@link holdsNothing}). A's next pass then re-reserves X for S and
 * drops the want in the same transaction (src/pool/rereserve.ts).
 *
 * A want is dropped only by its own node: when that pass finds S no longer READY with X
 * (src/pool/rereserve.ts `dropStaleWants`), or by `pool remove-node --finish` of the node
 * (src/pool/removal.ts, through `dropWants`).
 * Each want has an index key `wanted/<node>/<block>/<ordinal>` (value `{"v":1,"sandbox","ip","at"}`,
 * informational: only the key and the block decide), written and deleted in the transaction of the
 * block's want, so the node finds its wants with one small prefix read instead of reading every
 * block. This file is pure (the block rules); the writes are src/pool/rereserve.ts's. Every write compares the block's `mod_revision` as read, and the caller's guard
 * (`removing/<node>` absent for the node's pass; the removal's marker, heartbeat and window for
 * `--finish`).
 */
import type { BlockValue, WantValue } from './model.ts';

/** Is ordinal `o` of block `b` wanted (by anyone)? An allocation path never hands it out. */
export function isWanted(b: BlockValue, o: number): boolean {
  return b.wanted !== undefined && b.wanted[String(o)] !== undefined;
}

/** The want of ordinal `o` of `b`, or null. */
export function wantOf(b: BlockValue, o: number): WantValue | null {
  return b.wanted?.[String(o)] ?? null;
}

/**
 * Does block `b` hold nothing — no allocation and no want? Only such a block may be given back
 * or deleted as empty (a wanted ordinal is a live pod's address).
 */
export function holdsNothing(b: BlockValue): boolean {
  return Object.keys(b.allocs).length === 0 && (b.wanted === undefined || Object.keys(b.wanted).length === 0);
}

/** How many ordinals of `b` are wanted and not allocated: not free (`pool status`, the free gauge). */
export function wantedUnallocated(b: BlockValue): number {
  if (b.wanted === undefined) return 0;
  return Object.keys(b.wanted).filter((o) => b.allocs[o] === undefined).length;
}

/** A copy of `b` with `want` at ordinal `o` (the `wanted` map replaced, never changed in place). */
export function withWant(b: BlockValue, o: number, want: WantValue): BlockValue {
  return { ...b, allocs: { ...b.allocs }, wanted: { ...(b.wanted ?? {}), [String(o)]: want } };
}

/** A copy of `b` without the want at ordinal `o` (`wanted` left out when it empties). */
export function withoutWant(b: BlockValue, o: number): BlockValue {
  const { wanted, ...rest } = b;
  const left = { ...(wanted ?? {}) };
  delete left[String(o)];
  return Object.keys(left).length === 0 ? { ...rest, allocs: { ...b.allocs } } : { ...rest, allocs: { ...b.allocs }, wanted: left };
}

/** The index value of a want: `{"v":1,"sandbox","ip","at"}` (informational; `at`: ms since the epoch). */
export function wantIndexValue(sandbox: string, ip: string, at: number): string {
  return JSON.stringify({ v: 1, sandbox, ip, at });
}
