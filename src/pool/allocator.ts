/**
 * The cluster pool allocator (issue 11; docs/cluster.md): logic that takes a {@link KV} (house
 * style 2: no I/O of its own), like the node allocator takes a Store. Calico's design (blocks with
 * a node affinity, per-address sequence numbers; anchors.md §5.1, daemons-and-pools.md §2.1) with
 * the batching Calico proposed and never built (projectcalico/cni-plugin#985): many ADDs of one
 * node in one transaction, and in the daemon its DELs with them ({@link PoolAllocator.batch}).
 *
 * The keys and values (`meta`, `blocks/<block>`, `nodes/<node>/blocks/<block>`, `handles/…`,
 * `removing/<node>`, `removal-window/<node>`, …) are laid out and encoded in src/pool/model.ts.
 * Node removal (an operator's two steps) is src/pool/removal.ts; the node's own veto is
 * src/pool/veto.ts.
 *
 * Rules, each enforced inside one etcd transaction by revision compares (never a lock or lease):
 * - claim a block: `blocks/<b>` and `nodes/<me>/blocks/<b>` both absent (`create_revision == 0`);
 * - allocate: every block written has the `mod_revision` it was read at, the handle is absent;
 * - release: the handle and every block written have the revisions read; an address is freed only
 *   when its allocation still has the handle's sequence number and owner (a late release of an
 *   address re-allocated since is refused); an owned block left empty is deleted with its affinity
 *   unless it is the node's last block of its range set;
 * - borrow from another node's block only when no block of the range set is free.
 * A lost race re-reads everything and decides again (at most {@link MAX_ATTEMPTS} times, then
 * `STORE_CONFLICT`, CNI 11). A transaction whose answer was lost is decided by the re-read: a
 * handle that now exists with our allocation is our own earlier success (the repeated-ADD rule).
 *
 * Values are decoded exactly (an unknown field is corrupt). A key that cannot be read is never
 * written: an ADD skips such a block, a DEL always finishes without it (docs/cluster.md "Corrupt
 * keys"; `CorruptValueError` in src/pool/model.ts, {@link PoolAllocatorOptions.onCorrupt}).
 */
import type { AppError } from '../common/errors.ts';
import type { HandleValue } from './model.ts';
import type { JournalEntry, ReserveSlot } from './offline.ts';
import { AllocatorCore, type PoolAllocation, type PoolAllocatorOptions, type PoolRequest } from './allocator-core.ts';
import * as allocation from './allocation.ts';
import { veto, vetoIfMarked } from './veto.ts';
import { refillReserve } from './reserve.ts';
import { syncJournalEntry } from './journal-sync.ts';

export {
  BlockCache,
  CLAIM_SPREAD,
  HANDLE_CACHE_MAX,
  MAX_ATTEMPTS,
  MAX_BATCH,
  staleAddError,
  TOMBSTONE_TTL_SECONDS,
  type CachedBlock,
  type CorruptSkip,
  type PoolAllocation,
  type PoolAllocatorOptions,
  type PoolRequest,
} from './allocator-core.ts';

/**
 * The cluster pool allocator of one node and network. See the module comment. Its jobs are
 * modules of their own, each given this allocator's {@link AllocatorCore} (options, keys, the
 * node's block cache): allocation (src/pool/allocation.ts), the node's veto of its removal
 * (src/pool/veto.ts), the offline reserve's refill (src/pool/reserve.ts) and the offline
 * journal's sync (src/pool/journal-sync.ts).
 */
export class PoolAllocator {
  readonly #c: AllocatorCore;

  constructor(o: PoolAllocatorOptions) {
    this.#c = new AllocatorCore(o);
  }

  /** Key of the pool's `meta`. */
  get metaKey(): string {
    return this.#c.metaKey;
  }
  /** Key of block `b` (key text). */
  blockKey(b: string): string {
    return this.#c.blockKey(b);
  }
  /** Key of the affinity of block `b` to `node`. */
  affinityKey(node: string, b: string): string {
    return this.#c.affinityKey(node, b);
  }
  /** Key of `node`'s heartbeat ({@link AllocatorCore.aliveKey}). */
  aliveKey(node: string): string {
    return this.#c.aliveKey(node);
  }
  /** Key of the removal marker of `node` ({@link AllocatorCore.removingKey}). */
  removingKey(node: string): string {
    return this.#c.removingKey(node);
  }
  /** Key of the veto window of `node`'s removal ({@link AllocatorCore.windowKey}). */
  windowKey(node: string): string {
    return this.#c.windowKey(node);
  }
  /** Key of `node`'s settings ({@link AllocatorCore.settingsKey}). */
  settingsKey(node: string): string {
    return this.#c.settingsKey(node);
  }
  /** Key of the handle of (containerId, ifname). */
  handleKey(containerId: string, ifname: string): string {
    return this.#c.handleKey(containerId, ifname);
  }
  /** Key of the pool's cluster pin ({@link AllocatorCore.clusterPinKey}). */
  get clusterPinKey(): string {
    return this.#c.clusterPinKey;
  }

  /** Write `meta` if absent, else check it; hold the pool to one etcd cluster ({@link AllocatorCore.checkMeta}: what it throws). Once per allocator. */
  checkMeta(): Promise<void> {
    return this.#c.checkMeta();
  }

  /** ADD for a batch of requests, one transaction per attempt (src/pool/allocation.ts `add`). */
  add(reqs: readonly PoolRequest[]): Promise<Array<PoolAllocation[] | AppError>> {
    return allocation.add(this.#c, reqs);
  }

  /** ADDs and DELs of this node together, one transaction per attempt (src/pool/allocation.ts `batch`). */
  batch(adds: readonly PoolRequest[], dels: readonly PoolRequest[]): Promise<{ adds: Array<PoolAllocation[] | AppError>; dels: Array<string[] | AppError> }> {
    return allocation.batch(this.#c, adds, dels);
  }

  /** DELs of this node in one transaction per attempt: {@link batch} without ADDs. */
  release(dels: readonly PoolRequest[]): Promise<Array<string[] | AppError>> {
    return allocation.release(this.#c, dels);
  }

  /** CHECK: the allocations of (containerId, ifname), or null (src/pool/allocation.ts `find`). */
  find(req: PoolRequest): Promise<PoolAllocation[] | null> {
    return allocation.find(this.#c, req);
  }

  /** DEL: release by owner, idempotent; the released addresses, sorted (src/pool/allocation.ts `del`). */
  del(req: PoolRequest): Promise<string[]> {
    return allocation.del(this.#c, req);
  }

  /** Release one address only if it still has sequence number `seq` and `owner` (src/pool/allocation.ts `releaseIfSeq`). */
  releaseIfSeq(ip: string, seq: number, owner: PoolRequest): Promise<boolean> {
    return allocation.releaseIfSeq(this.#c, ip, seq, owner);
  }

  /** Veto a removal of this node; the blocks written back (src/pool/veto.ts `veto`). */
  veto(): Promise<string[]> {
    return veto(this.#c);
  }

  /** {@link veto} only when this node's removal marker exists; null when none (src/pool/veto.ts `vetoIfMarked`). */
  vetoIfMarked(): Promise<string[] | null> {
    return vetoIfMarked(this.#c);
  }

  /** Keep `k` reserve entries per range set in this node's blocks (src/pool/reserve.ts `refillReserve`). */
  refillReserve(k: number, offlineSeconds: number): Promise<{ slots: ReserveSlot[]; short: number[]; settingsSeconds: number }> {
    return refillReserve(this.#c, k, offlineSeconds);
  }

  /** Sync one offline journal entry of this node to etcd (src/pool/journal-sync.ts `syncJournalEntry`). */
  syncJournalEntry(e: JournalEntry): Promise<'synced' | { gone: string }> {
    return syncJournalEntry(this.#c, e);
  }

  /** Every handle `node` made, sorted by key (src/pool/allocation.ts `handlesOf`). */
  handlesOf(node: string): Promise<Array<{ containerId: string; ifname: string; value: HandleValue }>> {
    return allocation.handlesOf(this.#c, node);
  }
}
