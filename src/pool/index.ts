/**
 * The cluster pool's facade (docs/cluster.md "Layout"): the one module of src/pool/ that the CNI
 * edge (src/cni/), the CLI (src/cli/), the daemon (src/daemon/) and the reconciler
 * (src/reconcile/) import (`npm run check-layers` refuses any other import of src/pool/ from
 * outside it; tests may import the internals). The pool is the engine of a cluster pool over a
 * {@link KV} (etcd): blocks of a range set claimed by nodes, one handle per attachment, every
 * write a revision-checked transaction, node removal in two steps with a veto, the offline
 * reserve.
 *
 * The verbs (one surface for the plugin, the daemon, the reconciler and the CLI, after Calico's
 * `libcalico-go/lib/ipam/interface.go`): {@link add}, {@link del}, {@link find} for one node's
 * attachments; {@link status} and {@link handles} to read a pool; {@link markRemoval} and
 * {@link finishRemoval} to remove a node. The types and helpers the callers need are re-exported
 * below, each documented where it is defined.
 */
import type { AppError } from '../common/errors.ts';
import type { KV, KVEntry } from '../store/kv.ts';
import { PoolAllocator, type PoolAllocation, type PoolAllocatorOptions, type PoolRequest } from './allocator.ts';
import type { PoolKeys } from './model.ts';
import { PoolRemoval, type PoolRemovalOptions } from './removal.ts';
import { nodeHandles, type CorruptHandle, type PoolHandleEntry } from './reclaim.ts';
import { poolStatus, type PoolStatus } from './status.ts';

/**
 * ADD for the node and network of `o`: each request's addresses, one per range set (the existing
 * ones on a repeated ADD), or its AppError, in request order. All requests go in one batched
 * round (one revision-checked transaction per block per round). See {@link PoolAllocator.add}.
 */
export function add(o: PoolAllocatorOptions, reqs: readonly PoolRequest[]): Promise<Array<PoolAllocation[] | AppError>> {
  return new PoolAllocator(o).add(reqs);
}

/** DEL by owner for the node of `o`; idempotent. Returns the released addresses. See {@link PoolAllocator.del}. */
export function del(o: PoolAllocatorOptions, req: PoolRequest): Promise<string[]> {
  return new PoolAllocator(o).del(req);
}

/** CHECK: the attachment's allocations, or null when it has none. See {@link PoolAllocator.find}. */
export function find(o: PoolAllocatorOptions, req: PoolRequest): Promise<PoolAllocation[] | null> {
  return new PoolAllocator(o).find(req);
}

/**
 * The pool's state as `ipwarden pool status` shows it: blocks, nodes and their heartbeats, free
 * and used addresses per range set, corrupt keys. Reads only. See {@link poolStatus}.
 * @throws AppError STORE_UNAVAILABLE when etcd cannot be read
 */
export function status(kv: KV, prefix: string, pool: string): Promise<PoolStatus> {
  return poolStatus(kv, prefix, pool);
}

/**
 * The handles of `node` among `entries` (a read of the pool's handles prefix): the node's own (of
 * `host` when given), the corrupt ones and those another host of the node wrote. Pure. See
 * {@link nodeHandles}.
 */
export function handles(entries: readonly KVEntry[], k: PoolKeys, node: string, host: string | null = null): { handles: PoolHandleEntry[]; corrupt: CorruptHandle[]; foreign: PoolHandleEntry[] } {
  return nodeHandles(entries, k, node, host);
}

/** What an operator's node removal needs: the pool, no node identity of its own. */
export type RemovalScope = PoolRemovalOptions;

/**
 * Step 1 of removing `target` from the pool: the removal marker, its blocks marked
 * `pendingRelease`, the veto window opened. Returns the marked blocks' keys. See
 * {@link PoolRemoval.mark}.
 * @throws RemovalRefusedError when the node has a live heartbeat (unless `force`) or is unknown
 */
export function markRemoval(s: RemovalScope, target: string, opts: Parameters<PoolRemoval['mark']>[1] = {}): Promise<string[]> {
  return new PoolRemoval(s).mark(target, opts);
}

/**
 * Step 2: after the veto window, release `target`'s addresses and delete its emptied blocks. See
 * {@link PoolRemoval.finish}.
 * @throws RemovalRefusedError when the node vetoed, the window is still open, or step 1 was not run
 */
export function finishRemoval(s: RemovalScope, target: string): Promise<{ released: string[]; deletedBlocks: string[]; keptBlocks: string[] }> {
  return new PoolRemoval(s).finish(target);
}

/** The marker key of `target`'s removal (`<prefix>/pools/<pool>/removing/<node>`), for messages. */
export function removingKey(s: RemovalScope, target: string): string {
  return new PoolRemoval(s).removingKey(target);
}

/** The heartbeat key of `node` (`<prefix>/pools/<pool>/alive/<node>`), for messages. */
export function aliveKey(s: RemovalScope, node: string): string {
  return new PoolRemoval(s).aliveKey(node);
}

export {
  BlockCache,
  MAX_BATCH,
  PoolAllocator,
  TOMBSTONE_TTL_SECONDS,
  type CorruptSkip,
  type PoolAllocation,
  type PoolAllocatorOptions,
  type PoolRequest,
} from './allocator.ts';
export { AutoReclaimer, lastSeen, logReport, type ReclaimLog, SeenWriter, seenAt, seenKey, SEEN_EVERY_MS, type AutoReclaimOptions, type AutoReclaimReport, type ReclaimHandle, type ReclaimScope } from './auto-reclaim.ts';
export { bootClock, coarseBootClock, ContactKV, OfflinePool, type OfflineLog, type OfflineStats } from './contact.ts';
export { DEFAULT_POOL_JOURNAL_ROOT, journalHolds, PoolJournal, poolJournalDir, POOL_DIR_RE } from './journal.ts';
export { PoolRemoval, REMOVAL_WINDOW_SECONDS, RemovalRefusedError, type PoolRemovalOptions } from './removal.ts';
export { classifyPoolHandles, type PoolLeakVerdict } from './leaks.ts';
export { prefixOverlaps, rangeText, type PoolOverlap } from './overlap.ts';
export { decodeJournalEntry, journalName } from './offline.ts';
export { blockKeyCidr, decodeMeta, heartbeatValue, heartbeatWriter, keysOf, markerBy, metaOf, settingsValue, type HandleValue, type PoolKeyLayout } from './model.ts';
export { currentRevision, gcDecision, handlesPrefix, nodeHandles, releaseObserved, type CorruptHandle, type PoolHandleEntry, type ValidAttachment } from './reclaim.ts';
export type { PoolKeys } from './model.ts';
export { allocatorFor, backoffMs, corruptLine, etcdFor, jitteredBackoff, PER_REQUEST, tlsFiles, type KVSource } from './session.ts';
export { heartbeatSource, nodeHeartbeat, poolNodeSample, poolStatus, type PoolBlockStatus, type PoolNodeSample, type PoolSource, type PoolStatus } from './status.ts';
export { decodeLearned, keptConfig, LEARNED_DIR_NAME, learnedName, LearnedPools, learnedPoolsDir, readLearnedPools, type LearnedPool, type LearnedRead, type LearnOutcome, type UnreadableLearned } from './learned.ts';
export { checkPodAddress, dropStaleWants, podAddress, POD_IFNAME, reReserve, type DropOutcome, type PodAddress, type PodAddressState, type ReReserveOutcome, type ReReserveScope } from './rereserve.ts';
