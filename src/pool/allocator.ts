/**
 * The cluster pool allocator (issue 11; docs/cluster.md): logic that takes a {@link KV} (house
 * style 2: no I/O of its own), like the node allocator takes a Store. Calico's design (blocks with
 * a node affinity, per-address sequence numbers; anchors.md §5.1, daemons-and-pools.md §2.1) with
 * the batching Calico proposed and never built (projectcalico/cni-plugin#985): many ADDs of one
 * node in one transaction, and in the daemon its DELs with them ({@link PoolAllocator.batch}).
 *
 * The keys and values (`meta`, `blocks/<block>`, `nodes/<node>/blocks/<block>`, `handles/…`,
 * `removing/<node>`, `removal-window/<node>`, …) are laid out and encoded in src/pool/model.ts.
 * Node removal (an operator's two steps) is src/pool/removal.ts; the node's own veto is here.
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
 * keys"; {@link CorruptValueError}, {@link PoolAllocatorOptions.onCorrupt}).
 */
import { giveBackEmptied } from './stuck-block.ts';
import { holdsNothing, isWanted } from './wanted.ts';
import { AppError } from '../common/errors.ts';
import { formatIP, parseCIDR, type IP, type Subnet } from '../common/ip.ts';
import { MAX_TXN_OPS, type KV, type KVCompare, type KVEntry, type KVOp } from '../store/kv.ts';
import { RangeExhaustedError } from '../ipam/allocator.ts';
import { blockAddresses, blockCidrText, blocksOf, isAllocatable, nodeHash, ordinalIP, type BlockSizes } from './blocks.ts';
import { removalWindowSeconds, type JournalEntry, type ReserveSlot } from './offline.ts';
import { Retry, runTxn, type Txn } from './txn.ts';
import {
  affinityValue,
  blockKeyCidr,
  blockKeyText,
  clusterPinValue,
  copyBlock,
  corrupt,
  CorruptValueError,
  decodeAffinity,
  decodeBlock,
  decodeClusterPin,
  decodeHandle,
  decodeSettings,
  encodeBlock,
  encodeHandle,
  keysOf,
  metaOf,
  parseJson,
  settingsValue,
  tombstoneValue,
  type AllocValue,
  type BlockValue,
  type HandleIP,
  type HandleValue,
  type PoolKeyLayout,
} from './model.ts';
import { createGuard, existingGuard, layoutMismatch, type PoolLayout } from './overlap.ts';
import { rangeFor, rangeSetSize, rangeSetString } from '../ipam/range.ts';
import type { Range, RangeSet } from '../ipam/types.ts';

/** Attempts of one operation before `STORE_CONFLICT`. */
export const MAX_ATTEMPTS = 16;
/** How many free blocks a node chooses among (by its name's hash) when it claims one. */
export const CLAIM_SPREAD = 16;
/**
 * Lifetime of a DEL's tombstone handle, seconds (its lease; a leader change on etcd 3.4 only
 * makes it longer). A late transaction lands within seconds of its sender giving up (etcd
 * applies or drops a proposal within its request timeout, 5 s per call here): 10 minutes is
 * a wide margin.
 */
export const TOMBSTONE_TTL_SECONDS = 600;
/** Most requests batched into one transaction (each costs 2 ops; etcd allows 128 per txn). */
export const MAX_BATCH = 24;

/** One address handed to a container. */
export interface PoolAllocation {
  readonly rangeSetIndex: number;
  readonly ip: IP;
  /** The range of the config holding `ip` (prefix and gateway of the result). */
  readonly range: Range;
  /** The block's key text. */
  readonly block: string;
  /** The allocation's sequence number in its block. */
  readonly seq: number;
  /** True when the handle existed before this call (a repeated ADD). */
  readonly existing: boolean;
  /** True when the block belongs to another node (borrowed). */
  readonly borrowed: boolean;
}

/** Who asks. */
export interface PoolRequest {
  readonly containerId: string;
  readonly ifname: string;
  /**
   * An ADD's fence (the daemon's requests): the highest etcd revision its client had seen when the
   * request began (decimal text). A tombstone at the request's handle created above it is a DEL
   * that may have begun after this ADD — the runtime gave the ADD up and deleted the container —
   * so the ADD is refused instead of writing over it ({@link staleAddError}); a tombstone created at
   * or below it is a DEL that came before this ADD, which may write over it as any ADD may. Absent
   * (the standalone plugin, whose process ends with its caller): no fence.
   */
  readonly since?: string;
}

/**
 * The refusal of an ADD whose attachment got a DEL's tombstone after the ADD began
 * ({@link PoolRequest.since}): an ADD the daemon still held when its caller had given it up (a
 * daemon stalled, then resumed: the runtime's DEL went through the standalone fallback meanwhile)
 * must not allocate after that DEL, or the address stays allocated to a container that is gone.
 * STORE_CONFLICT (retryable: a runtime that really wants the ADD asks again, and that request's
 * fence is above the tombstone).
 */
export function staleAddError(pool: string, r: PoolRequest, tombRevision: string): AppError {
  return new AppError(
    'STORE_CONFLICT',
    `pool ${pool}: a DEL of ${r.containerId.trim()}/${r.ifname} was committed (its tombstone, revision ${tombRevision}) after this ADD began (revision ${r.since ?? '?'}): not allocated — its caller had given it up; try again`,
  );
}

/** Options of {@link PoolAllocator}. */
export interface PoolAllocatorOptions {
  readonly kv: KV;
  /** Pool name (`ipam.pool.name`). */
  readonly pool: string;
  /** Key prefix (`ipam.pool.etcd.prefix`). */
  readonly prefix: string;
  /** This node's name (validated by the caller). */
  readonly node: string;
  /** The network config's name (recorded in handles). */
  readonly network: string;
  /** The config's range sets; `[]` for DEL (which needs none). */
  readonly rangeSets: readonly RangeSet[];
  readonly sizes: BlockSizes;
  /** The host name written into every handle this allocator puts ({@link HandleValue.host}); none when absent. */
  readonly host?: string;
  /** Clock, milliseconds since the epoch (default `Date.now`). */
  readonly now?: () => number;
  /**
   * Awaited before attempt `attempt` (≥ 1) of an operation whose transaction lost a race (the
   * retry policy, house style 7; default none). The plugin passes a jittered exponential delay so
   * the processes of one node racing for one block spread out.
   */
  readonly backoff?: (attempt: number) => Promise<void>;
  /**
   * The node's cached blocks, shared by the allocators of one pool and node (the daemon passes
   * one per pool and node, so its DELs keep its ADDs' cache current). Default: this allocator's own.
   */
  readonly cache?: BlockCache;
  /**
   * Grants the lease a DEL's tombstone handle is put with ({@link HandleValue.deleted}); default
   * none (the tombstone stays until an ADD of that container overwrites it). The plugin passes
   * `grantLease(TOMBSTONE_TTL_SECONDS)` of its etcd client.
   */
  readonly tombstoneLease?: () => Promise<string>;
  /**
   * Told of every corrupt key an operation went on without ({@link CorruptSkip}): a block an ADD
   * or a reserve refill skipped, an address a DEL could not release, a handle a DEL could not
   * read. Called synchronously, after the operation's outcome is known; must not throw (what it
   * throws is ignored). Default: nobody. The plugin writes a line on stderr, the daemon a log line.
   */
  readonly onCorrupt?: (s: CorruptSkip) => void;
}

/** A corrupt key an operation went on without (see {@link PoolAllocatorOptions.onCorrupt}). */
export interface CorruptSkip {
  /** The operation: `ADD`, `DEL`, `refill` (offline reserve), `veto`, `remove-node`. */
  readonly op: 'ADD' | 'DEL' | 'refill' | 'veto' | 'remove-node';
  /** The full etcd key. */
  readonly key: string;
  /** Why its value (or name) cannot be read: the {@link CorruptValueError}'s `why`. */
  readonly why: string;
  /**
   * What was done instead, one sentence: `block skipped: never allocated from, left for an
   * operator`, `10.81.0.16 of c1/eth0 not released (its block cannot be read): the handle keeps
   * it for an operator`, …
   */
  readonly action: string;
}

/** One cached block: its CIDR, its value, the revision it has in etcd and its stored text. */
export interface CachedBlock {
  readonly cidr: Subnet;
  readonly value: BlockValue;
  readonly rev: string;
  /**
   * The block's value exactly as stored (the etcd value's text). A write built on this cached
   * block compares the stored value equals it as well as the revision: after an etcd restored
   * from a snapshot, new writes reuse revisions, so the revision alone may match other content.
   */
  readonly encoded: string;
}

/**
 * A node's blocks as last read or written (see `PoolAllocator`'s fast path); `blocks` null =
 * unknown. `handles`: the handles this process's ADD rounds committed, as written (value and
 * revision), by key, until a DEL of them commits — at most {@link HANDLE_CACHE_MAX} (the oldest
 * dropped first). A round's first attempt takes a DEL's handle from it instead of reading it
 * (its commit compares the handle at that revision: a stale entry is a lost compare, decided
 * again on fresh reads).
 */
export class BlockCache {
  blocks: Map<string, CachedBlock> | null = null;
  /** The KV's {@link KV.generation} the blocks and handles were cached under: another one drops them (etcd's revision went backwards). */
  generation = 0;
  readonly handles = new Map<string, KVEntry>();

  /** Remember the handle `entry` as committed (the oldest entry dropped beyond {@link HANDLE_CACHE_MAX}). */
  rememberHandle(entry: KVEntry): void {
    this.handles.delete(entry.key);
    this.handles.set(entry.key, entry);
    if (this.handles.size > HANDLE_CACHE_MAX) this.handles.delete(this.handles.keys().next().value as string);
  }
}

/** Most handles a {@link BlockCache} keeps (a node runs a few hundred pods at most). */
export const HANDLE_CACHE_MAX = 4096;

/** A read that raced with a writer (not corruption): the caller re-reads and decides again ({@link Retry}). */
class LostRace extends Retry {}

/** A batched DEL whose handle cannot be read: done alone after its round ({@link PoolAllocator.batch}). */
const ALONE = Symbol('alone');

/** A round's answers ({@link PoolAllocator.batch}): per ADD, per DEL ({@link ALONE}: its handle cannot be read). */
interface Round {
  adds: Array<PoolAllocation[] | AppError>;
  dels: Array<string[] | typeof ALONE>;
}

interface Working {
  key: string;
  cidr: Subnet;
  value: BlockValue;
  /** Revision read, or null for a block this attempt claims. */
  rev: string | null;
  /** The stored text `value` was read (or cached) as; null for a block this attempt claims. */
  text: string | null;
  /** Built on the cache, not read in this attempt: its writes compare the stored text too (`#expectBlock`). */
  fromCache: boolean;
  dirty: boolean;
}

/** A working copy of cached block `key` (not read in this attempt: its writes compare its text too). */
function fromCache(key: string, c: CachedBlock): Working {
  return { key, cidr: c.cidr, value: copyBlock(c.value), rev: c.rev, text: c.encoded, fromCache: true, dirty: false };
}

/** The cluster pool allocator. See the module comment. */
export class PoolAllocator {
  readonly #o: PoolAllocatorOptions;
  readonly #keys: PoolKeyLayout;
  readonly #now: () => number;
  #metaChecked = false;
  /**
   * This node's blocks as this allocator last read or wrote them (values and revisions), or null.
   * An ADD first tries a transaction built on it, reading only the handles it cannot do without
   * (with the cached handles, {@link BlockCache}: none in the common case); any compare that
   * fails — a stale block, a handle created or changed meanwhile, a removal begun — drops it and
   * the attempt is redone from fresh reads, and so is a full range set seen in it. Correctness is
   * the compares'; the cache only saves round trips (the daemon's long-lived allocators: one
   * transaction and no read per batch in the common case).
   */
  readonly #shared: BlockCache;
  get #cache(): Map<string, CachedBlock> | null {
    // etcd's revision went backwards (restored from a snapshot): what is cached may be of another history.
    const g = this.#o.kv.generation ?? 0;
    if (this.#shared.generation !== g) {
      this.#shared.generation = g;
      this.#shared.blocks = null;
      this.#shared.handles.clear();
    }
    return this.#shared.blocks;
  }
  set #cache(v: Map<string, CachedBlock> | null) {
    this.#shared.blocks = v;
  }

  constructor(o: PoolAllocatorOptions) {
    this.#o = o;
    this.#keys = keysOf(o);
    this.#now = o.now ?? Date.now;
    this.#shared = o.cache ?? new BlockCache();
  }

  /** Key of the pool's `meta`. */
  get metaKey(): string {
    return this.#keys.meta;
  }
  /** Key of block `b` (key text). */
  blockKey(b: string): string {
    return this.#keys.block(b);
  }
  /** Key of the affinity of block `b` to `node`. */
  affinityKey(node: string, b: string): string {
    return this.#keys.affinity(node, b);
  }
  /**
   * Key of `node`'s heartbeat (`P/pools/<pool>/alive/<node>` → `{"v":1,"node","since"}`, put with
   * a lease by the node's daemon): present = the node may be alive. Never read to decide an
   * allocation; `pool remove-node` step 1 compares it absent (unless `--force`) and every
   * `--finish` transaction compares it absent.
   */
  aliveKey(node: string): string {
    return this.#keys.alive(node);
  }
  /**
   * Key of the removal marker of `node` (`P/pools/<pool>/removing/<node>` → `{"v":1,"node","at"}`):
   * created (create-only) by step 1 of `pool remove-node`, deleted by the node's veto. While it
   * exists no ADD of `node` commits (each compares it absent); every transaction of
   * `--finish` compares its revision, so a veto (its deletion) stops the reclaim (review F1/F2).
   */
  removingKey(node: string): string {
    return this.#keys.removing(node);
  }
  /**
   * Key of the veto window of `node`'s removal (`P/pools/<pool>/removal-window/<node>` →
   * `{"v":1,"node","at"}`), put by step 1 (src/pool/removal.ts) with a lease of at least REMOVAL_WINDOW_SECONDS:
   * `--finish` refuses while it exists (compared absent in every one of its transactions). A
   * lease can only outlive its TTL (a leader change on etcd 3.4 restarts it), never expire early,
   * so its absence proves the window has passed.
   */
  windowKey(node: string): string {
    return this.#keys.window(node);
  }
  /**
   * Key of `node`'s settings (`P/pools/<pool>/nodes/<node>/settings` → `{"v":1,"offlineSeconds":S}`,
   * no lease): written by the node's daemon with `ipam.pool.offline` (never lowered by it), read
   * by `pool remove-node` step 1 to size the veto window ({@link removalWindowSeconds}). Not
   * under `nodes/<node>/blocks/`, so the affinity index is unchanged.
   */
  settingsKey(node: string): string {
    return this.#keys.settings(node);
  }
  /** Key of the handle of (containerId, ifname). */
  handleKey(containerId: string, ifname: string): string {
    return this.#keys.handle(containerId, ifname);
  }

  /**
   * Key of the pool's cluster pin (`P/pools/<pool>/meta-cluster` → `{"v":1,"clusterId":"<hex>"}`):
   * the etcd cluster the pool was created in, written with `meta` (or, for a pool created before
   * the pin existed, by the first process whose cluster check every endpoint answered). Named so
   * that one prefix read of `…/meta` returns both keys.
   */
  get clusterPinKey(): string {
    return this.#keys.clusterPin;
  }

  /**
   * Write `meta` if absent, else check it equals this config's layout; and hold the pool to one
   * etcd cluster (docs/cluster.md "One etcd cluster"), when the KV has a cluster check (etcd): the
   * check (every endpoint's cluster ID; EtcdKV starts it with the answer to the read of `meta` and
   * its pin) must find one cluster; a pool is created only when every endpoint answered it, with its
   * cluster ID pinned beside `meta`; an existing pool's pin must name the cluster that answers.
   * Why both: the check alone cannot compare an endpoint that is down, so a process that reached
   * only the second cluster's members would create a second pool there; creating needs every
   * endpoint's answer, and the pin refuses a copy of the pool's keys in another cluster (a mirror,
   * a restore into a new cluster). Once per allocator.
   * @throws AppError STORE_CONFLICT (CNI 11) when every attempt to create `meta` lost its compare; IPAM_INVALID_CONFIG on a layout mismatch (the message shows both), on two
   *   clusters (the KV's message), or on a pin naming another cluster:
   *   `pool <p> was created in etcd cluster <a>, but its endpoints now answer as cluster <b> (a copy of its keys in another cluster: a mirror, or a restore into a new cluster) — point ipam.pool.etcd.endpoints at the pool's cluster, or see docs/cluster.md "One etcd cluster"`;
   *   STORE_UNAVAILABLE (CNI 11) for a pool not yet created while an endpoint did not answer:
   *   `pool <p> is not in etcd yet, and is created only once every endpoint in ipam.pool.etcd.endpoints has confirmed one etcd cluster; no answer from <endpoint (why)>; retry`;
   *   STORE_CORRUPT for a bad value.
   */
  async checkMeta(): Promise<void> {
    if (this.#metaChecked) return;
    const want = metaOf(this.#o.rangeSets, this.#o.sizes);
    const layout = this.#layout;
    const kv = this.#o.kv;
    const pinKey = this.clusterPinKey;
    // Exhausted (every create lost): STORE_CONFLICT (code 11, the runtime retries).
    await runTxn(
      kv,
      async (tx) => {
      const keys = await kv.list(this.metaKey);
      const e = keys.find((k) => k.key === this.metaKey) ?? null;
      const pinEntry = keys.find((k) => k.key === pinKey) ?? null;
      // After the read: EtcdKV started the check with that read's answer (asking only the other
      // endpoints); awaiting it here costs little or nothing.
      const check = kv.clusterCheck === undefined ? null : await kv.clusterCheck();
      if (e === null) {
        if (check !== null && (check.clusterId === null || check.unanswered.length > 0)) {
          throw new AppError('STORE_UNAVAILABLE', `pool ${this.#o.pool} is not in etcd yet, and is created only once every endpoint in ipam.pool.etcd.endpoints has confirmed one etcd cluster; no answer from ${check.unanswered.join(', ')}; retry`, { retryable: true });
        }
        tx.expect(this.metaKey, null);
        tx.put(this.metaKey, want);
        // Overlapping pools refused (src/pool/overlap.ts): the prefix's pool index compared and
        // rewritten in the same transaction.
        const guard = await createGuard(kv, this.#o.prefix, this.#o.pool, layout);
        for (const c of guard.compares) tx.expectCompare(c);
        for (const o of guard.ops) if ('put' in o) tx.put(o.put, o.value, o.lease);
        if (check?.clusterId != null) {
          // A pin left without its meta (an operator deleted meta): replaced by this cluster's.
          tx.expect(pinKey, pinEntry === null ? null : pinEntry.modRevision);
          tx.put(pinKey, clusterPinValue(check.clusterId));
        }
        return;
      }
      parseJson(e);
      if (e.value !== want) throw layoutMismatch(this.#o.pool, this.#o.network, e, layout, want);
      if (check?.clusterId != null) {
        if (pinEntry !== null) {
          const pinned = decodeClusterPin(pinEntry);
          if (pinned !== check.clusterId) {
            throw new AppError(
              'IPAM_INVALID_CONFIG',
              `pool ${this.#o.pool} was created in etcd cluster ${pinned}, but its endpoints now answer as cluster ${check.clusterId} (a copy of its keys in another cluster: a mirror, or a restore into a new cluster) — point ipam.pool.etcd.endpoints at the pool's cluster, or see docs/cluster.md "One etcd cluster"`,
            );
          }
        } else if (check.unanswered.length === 0) {
          // A pool from before the pin: pinned now, by a process every endpoint answered (create-only).
          await kv.txn([{ key: pinKey, absent: true }, { key: this.metaKey, modRevision: e.modRevision }], [{ put: pinKey, value: clusterPinValue(check.clusterId) }]);
        }
      }
      await existingGuard(kv, this.#o.prefix, this.#o.pool, e, layout);
      return;
      },
      {
        attempts: MAX_ATTEMPTS,
        // Never marked checked without a `meta` that passed the guards: a pool used with neither
        // would skip the overlap check for the allocator's life (review).
        exhausted: () => {
          throw new AppError('STORE_CONFLICT', `pool ${this.#o.pool}: ${MAX_ATTEMPTS} attempts to create ${this.metaKey} lost to concurrent writers; try again`);
        },
      },
    );
    this.#metaChecked = true;
  }

  /** This config's layout (what `meta` records). */
  get #layout(): PoolLayout {
    return { rangeSets: this.#o.rangeSets, blockSize: this.#o.sizes.blockSize4, blockSize6: this.#o.sizes.blockSize6 };
  }

  /**
   * CHECK's read-only check of this config against the pool's `meta` (nothing is created).
   * @throws AppError IPAM_INVALID_CONFIG on a layout mismatch (see {@link layoutMismatch}); STORE_CORRUPT for a `meta` that cannot be read
   */
  async #checkLayout(): Promise<void> {
    const e = await this.#o.kv.get(this.metaKey);
    const want = metaOf(this.#o.rangeSets, this.#o.sizes);
    if (e !== null && e.value !== want) throw layoutMismatch(this.#o.pool, this.#o.network, e, this.#layout, want);
  }

  /** The handle of (containerId, ifname) with its revision, or null. */
  async #handle(req: PoolRequest): Promise<{ entry: KVEntry; value: HandleValue } | null> {
    const e = await this.#o.kv.get(this.handleKey(req.containerId.trim(), req.ifname));
    return e === null ? null : { entry: e, value: decodeHandle(e) };
  }

  async #block(key: string, cache: Map<string, Working | null>): Promise<Working | null> {
    if (cache.has(key)) return cache.get(key) as Working | null;
    const cidrText = blockKeyCidr(key);
    if (cidrText === null) throw corrupt(this.blockKey(key), 'not a block key');
    const e = await this.#o.kv.get(this.blockKey(key));
    // A block whose stored text is cached is not decoded again (one text, one value; the revision
    // alone is not enough: an etcd restored from a snapshot reuses revisions).
    const c = e === null ? undefined : this.#cache?.get(key);
    const w: Working | null =
      e === null
        ? null
        : c !== undefined && c.rev === e.modRevision && c.encoded === e.value
          ? { key, cidr: c.cidr, value: copyBlock(c.value), rev: e.modRevision, text: e.value, fromCache: false, dirty: false }
          : { key, cidr: (parseCIDR(cidrText) as NonNullable<ReturnType<typeof parseCIDR>>).subnet, value: decodeBlock(e, cidrText), rev: e.modRevision, text: e.value, fromCache: false, dirty: false };
    cache.set(key, w);
    return w;
  }

  /** {@link #block}, but a block that cannot be read is returned as its {@link CorruptValueError} (the KV's errors are thrown). */
  async #tryBlock(key: string, cache: Map<string, Working | null>): Promise<Working | null | CorruptValueError> {
    try {
      return await this.#block(key, cache);
    } catch (e) {
      if (e instanceof CorruptValueError) return e;
      throw e;
    }
  }

  /** Tell `onCorrupt` (never throws). */
  #report(op: CorruptSkip['op'], e: CorruptValueError, action: string): void {
    try {
      this.#o.onCorrupt?.({ op, key: e.key, why: e.why, action });
    } catch {
      // reporting never fails an operation
    }
  }

  /**
   * The allocations a handle names, checked against their blocks (repeated ADD, CHECK). Throws
   * {@link LostRace} when a block lacks the allocation but the handle changed since it was read
   * (a release between the two reads: `--finish`, a DEL), STORE_CORRUPT when the handle is
   * unchanged across a re-read (handle and allocations are written in one transaction, so they
   * never disagree at one revision).
   */
  #existing(h: { entry: KVEntry; value: HandleValue }, blocks: Map<string, Working | null>, req: PoolRequest): Promise<PoolAllocation[]> {
    return Promise.all(
      h.value.ips.map(async (x) => {
        const b = await this.#block(x.block, blocks);
        const a = b?.value.allocs[String(x.ordinal)];
        if (b === null || a === undefined || a.seq !== x.seq || a.id !== req.containerId.trim() || a.ifname !== req.ifname) {
          const again = await this.#o.kv.get(h.entry.key);
          if (again === null || again.modRevision !== h.entry.modRevision) throw new LostRace();
          throw corrupt(h.entry.key, `names ${x.ip} (block ${x.block}, sequence ${x.seq}) but the block holds no such allocation`);
        }
        return this.#allocation(x.rangeSet, b, x.ordinal, a.seq, true);
      }),
    );
  }

  #allocation(rangeSetIndex: number, b: Working, ordinal: number, seq: number, existing: boolean): PoolAllocation {
    const ip = ordinalIP(b.cidr, ordinal);
    const rs = this.#o.rangeSets[rangeSetIndex];
    const k = rs === undefined ? -1 : rangeFor(rs, ip);
    if (rs === undefined || k < 0) throw corrupt(this.blockKey(b.key), `holds ${formatIP(ip)}, outside range set ${rangeSetIndex} of this network's config`);
    return { rangeSetIndex, ip, range: rs[k] as Range, block: b.key, seq, existing, borrowed: b.value.node !== this.#o.node };
  }

  /**
   * A free allocatable ordinal of `b` from its `next` (round robin), or -1. Every path that hands
   * out a new address (ADD, the rounds, the offline reserve refill) picks it here: a wanted
   * ordinal (a live pod's address, src/pool/wanted.ts) is never free.
   */
  #freeOrdinal(b: Working): number {
    const rs = this.#o.rangeSets[b.value.rangeSet];
    if (rs === undefined || b.value.state !== 'owned') return -1;
    const n = Number(blockAddresses(b.cidr.ip.family, b.cidr.prefix));
    for (let k = 0; k < n; k++) {
      const o = (b.value.next + k) % n;
      if (b.value.allocs[String(o)] === undefined && isAllocatable(rs, b.cidr, o) && !isWanted(b.value, o)) return o;
    }
    return -1;
  }

  /**
   * ADD for a batch of requests of this node, in one transaction per attempt. Returns, per
   * request in order, its allocations (one per range set) or the AppError it failed with (a full
   * range set: host-local's `failed to allocate for range <i>: no IP addresses available in range
   * set: <set>`, its details naming any block skipped as unreadable). A block that cannot be read
   * (the node's own, or another's when borrowing, or a key under `blocks/` that names no block) is
   * skipped — never allocated from, never written — and told to `onCorrupt` once the batch is
   * decided; a corrupt block's key exists, so it is never claimed either. Whole-batch failures
   * (etcd unavailable, `STORE_CONFLICT`, `STORE_CORRUPT` — a `meta`, or a handle or block a
   * repeated ADD must verify, that cannot be read —, a `meta` mismatch) are thrown. At most
   * {@link MAX_BATCH} requests.
   */
  async add(reqs: readonly PoolRequest[]): Promise<Array<PoolAllocation[] | AppError>> {
    if (reqs.length > MAX_BATCH) throw new AppError('INTERNAL', `a pool batch holds at most ${MAX_BATCH} requests, got ${reqs.length}`);
    await this.checkMeta();
    /** Blocks that cannot be read, skipped (never allocated from, never written), by key: told to `onCorrupt` once at the end. */
    const skipped = new Map<string, CorruptValueError>();
    const r = await this.#add(reqs, [], skipped, new Map());
    for (const e of skipped.values()) this.#report('ADD', e, 'block skipped: never allocated from, left for an operator');
    return r.adds;
  }

  /**
   * ADDs and DELs of this node together, in one transaction per attempt (the daemon's batcher,
   * docs/cluster.md "The daemon"): every block the round changes is written once, with the
   * allocations of `adds` made and those of `dels` released, each handle put or deleted, under the
   * compares of {@link add} and {@link del} together; the handles of the round are read in one
   * round trip (`getMany`) — on the first attempt with the cache only those it cannot do without:
   * an ADD's handle this process has not written is taken as absent, a DEL's handle this process
   * wrote is taken from {@link BlockCache.handles}, each compared at the commit. The ADDs are decided first, then the DELs, so an ADD never gets an
   * address a DEL of the same round frees. Each DEL has {@link del}'s meaning: idempotent (no
   * handle: a tombstone is put, in the same transaction; all tombstones of one attempt share one
   * lease), the handle's sequence numbers and owner checked, an emptied own block given back unless
   * it is the node's last of its range set (the kept block's affinity compared), a removed node's
   * emptied `pendingRelease` block given back (src/pool/stuck-block.ts), a block that cannot be
   * read never written (the handle keeps its addresses), no commit while a removal of the node is
   * begun (a lost compare vetoes it and decides again). A DEL whose handle cannot be read is done
   * alone after the round ({@link del}: it reads every block). An attachment may appear in `adds`
   * or `dels`, not both (`INTERNAL`); a repeated DEL gets the first one's answer.
   *
   * Returns per ADD its allocations or AppError (as {@link add}), per DEL its released addresses
   * (sorted) or the AppError its own {@link del} threw. When a round's ADD fails (a full range
   * set), or the round would exceed etcd's op limit ({@link MAX_TXN_OPS}), the ADDs and the DELs
   * go in separate transactions (an ADD that failed writes nothing), then halves. Whole-round
   * failures are thrown as by {@link add} (etcd unavailable, `STORE_CONFLICT` after
   * {@link MAX_ATTEMPTS} lost races, `STORE_CORRUPT` for an ADD's handle or a block a repeated ADD
   * must verify); `meta` is checked only when `adds` is not empty (a DEL needs no layout). At most
   * {@link MAX_BATCH} requests in all (more: `INTERNAL`).
   */
  async batch(adds: readonly PoolRequest[], dels: readonly PoolRequest[]): Promise<{ adds: Array<PoolAllocation[] | AppError>; dels: Array<string[] | AppError> }> {
    if (adds.length + dels.length > MAX_BATCH) throw new AppError('INTERNAL', `a pool batch holds at most ${MAX_BATCH} requests, got ${adds.length + dels.length}`);
    const addKeys = new Set(adds.map((r) => JSON.stringify([r.containerId.trim(), r.ifname])));
    for (const r of dels) if (addKeys.has(JSON.stringify([r.containerId.trim(), r.ifname]))) throw new AppError('INTERNAL', `a pool batch holds both an ADD and a DEL of ${r.containerId.trim()}/${r.ifname}`);
    if (adds.length > 0) await this.checkMeta();
    const skipped = new Map<string, CorruptValueError>();
    /** What the round's DELs went on without, by key and action (told once the round is decided). */
    const reports = new Map<string, [CorruptValueError, string]>();
    const r = await this.#add(adds, dels, skipped, reports);
    for (const e of skipped.values()) this.#report('ADD', e, 'block skipped: never allocated from, left for an operator');
    for (const [e, action] of reports.values()) this.#report('DEL', e, action);
    const out: Array<string[] | AppError> = [];
    for (let j = 0; j < dels.length; j++) {
      const d = r.dels[j];
      if (d !== ALONE) {
        out.push(d as string[]);
        continue;
      }
      // A handle that cannot be read: the DEL alone, after the round (#delByOwner reads every block).
      try {
        out.push(await this.del(dels[j] as PoolRequest));
      } catch (e) {
        if (!(e instanceof AppError)) throw e;
        out.push(e);
      }
    }
    return { adds: r.adds, dels: out };
  }

  /** DELs of this node in one transaction per attempt: {@link batch} without ADDs. */
  async release(dels: readonly PoolRequest[]): Promise<Array<string[] | AppError>> {
    return (await this.batch([], dels)).dels;
  }

  /**
   * One round ({@link batch}; {@link add} with no DELs): one {@link runTxn} body that decides the
   * ADDs, then the DELs on the blocks the ADDs left, and buffers one write per block. Splits
   * itself (ADDs and DELs apart, then halves) when an ADD failed beside DELs or the transaction
   * would exceed {@link MAX_TXN_OPS}. A DEL's result is {@link ALONE} when its handle cannot be
   * read. What the committed attempt's DELs went on without is added to `reports`.
   */
  async #add(reqs: readonly PoolRequest[], dels: readonly PoolRequest[], skipped: Map<string, CorruptValueError>, reports: Map<string, [CorruptValueError, string]>): Promise<Round> {
    const kv = this.#o.kv;
    /** What the deciding attempt's DELs went on without (each attempt starts it anew). */
    let told = new Map<string, [CorruptValueError, string]>();
    const { value } = await runTxn(
      kv,
      async (tx): Promise<Round> => {
      told = new Map();
      const tell = (e: CorruptValueError, action: string): void => void told.set(`${e.key}\u0000${action}`, [e, action]);
      const attempt = tx.attempt;
      const blocks = new Map<string, Working | null>();
      const results: Array<PoolAllocation[] | AppError | null> = reqs.map(() => null);
      // Fast path: the first attempt builds on the cached blocks, and reads no handle it can do
      // without: an ADD's handle this process has not written is taken as absent (its put
      // compares it absent; an ADD that fails is decided again on fresh reads), a DEL's handle
      // this process wrote is taken as written (its commit compares it at that revision). A
      // stale guess is a lost compare, decided again on fresh reads.
      const cached = attempt === 0 ? this.#cache : null;
      const known = cached === null ? null : this.#shared.handles;
      const keys = [...reqs, ...dels].map((r) => this.handleKey(r.containerId.trim(), r.ifname));
      /** Handles taken from `known` (never decoded badly: this process encoded them). */
      const guessed = new Set<string>();
      const toRead = keys.filter((k, i) => {
        if (known === null) return true;
        if (i < reqs.length) {
          if (known.has(k)) return true;
          guessed.add(k);
          return false;
        }
        if (!known.has(k)) return true;
        guessed.add(k);
        return false;
      });
      // Every handle still to read in one read (one round trip, one revision) where the KV can.
      const got = toRead.length === 0 ? [] : await tx.readMany(toRead);
      const readBy = new Map(toRead.map((k, i) => [k, got[i] ?? null]));
      const read = keys.map((k, i) => (readBy.has(k) ? (readBy.get(k) as KVEntry | null) : i < reqs.length ? null : ((known as Map<string, KVEntry>).get(k) as KVEntry)));
      const handles = read.slice(0, reqs.length).map((e) => (e === null ? null : { entry: e, value: decodeHandle(e) }));
      const delEntries = read.slice(reqs.length);
      /** Handle key → the handle value this round's ADD puts (cached at the commit). */
      const written = new Map<string, string>();
      /** True once some request's handle is buffered: only then is anything written. */
      let anyHandle = false;
      const firstOf = new Map<string, number>();
      const pending: number[] = [];
      let lostRace = false;
      /** Handle key → revision of the DEL's tombstone there (a fresh ADD overwrites it by that revision). */
      const tombstones = new Map<string, string>();
      for (let i = 0; i < reqs.length; i++) {
        const r = reqs[i] as PoolRequest;
        const h = handles[i];
        const hk = this.handleKey(r.containerId.trim(), r.ifname);
        if (h !== null && h !== undefined && h.value.deleted !== true) {
          try {
            results[i] = await this.#existing(h, blocks, r);
          } catch (e) {
            if (!(e instanceof LostRace)) throw e;
            lostRace = true;
            break;
          }
        } else if (!firstOf.has(hk)) {
          firstOf.set(hk, i);
          if (h !== null && h !== undefined && r.since !== undefined && BigInt(h.entry.createRevision) > BigInt(r.since)) {
            // A DEL of the attachment after this ADD began: refused, never written over.
            results[i] = staleAddError(this.#o.pool, r, h.entry.createRevision);
            continue;
          }
          pending.push(i);
          if (h !== null && h !== undefined) tombstones.set(hk, h.entry.modRevision);
        }
      }
      let mineComplete = false;
      /** A claim (or a borrow) decided on cached blocks: first re-read the node's blocks. */
      let needFresh = false;
      if (lostRace) {
        this.#cache = null;
        throw new Retry();
      }
      if (pending.length > 0) {
        mineComplete = true;
        // This node's blocks (affinity index), read once per attempt.
        const prefix = this.#keys.affinityPrefix(this.#o.node);
        const mine: Working[] = [];
        const listed =
          cached !== null
            ? [...cached.keys()].map((k) => ({ key: `${prefix}${k}` }))
            : await kv.list(prefix, { keysOnly: true });
        for (const a of listed) {
          const key = a.key.slice(prefix.length);
          const c = cached?.get(key);
          if (c !== undefined) blocks.set(key, fromCache(key, c));
          const b = await this.#tryBlock(key, blocks);
          if (b instanceof CorruptValueError) {
            // One of the node's blocks cannot be read: skip it (nothing in it is handed out, it is
            // never rewritten); the node uses its other blocks, claims one or borrows.
            skipped.set(b.key, b);
            continue;
          }
          if (b === null || b.value.node !== this.#o.node) {
            // Another process of this node may have given the block back (a DEL that emptied
            // it), and another node claimed it since, between our affinity list and this read: a
            // lost race (review F3). Corrupt only when the affinity is still the one we listed
            // (same mod_revision, so it existed all along): a claim and a give-back write the
            // block and its affinity in one transaction, so they cannot disagree at one revision.
            const again = 'modRevision' in a ? await kv.get(a.key) : null;
            if (again !== null && again.modRevision === (a as KVEntry).modRevision) {
              throw corrupt(a.key, `names block ${key}, which ${b === null ? 'does not exist' : `belongs to node ${b.value.node}`}`);
            }
            lostRace = true;
            break;
          }
          // The node is back: it vetoes a removal begun while it was away (docs/cluster.md
          // "Reclaiming a dead node's blocks"); the write goes in this ADD's transaction.
          if (b.value.state === 'pendingRelease') {
            b.value.state = 'owned';
            b.dirty = true;
          }
          mine.push(b);
        }
        if (lostRace) {
          this.#cache = null;
          throw new Retry();
        }
        let claimed: Set<string> | null = null;
        let others: Working[] | null = null;
        for (const i of pending) {
          const r = reqs[i] as PoolRequest;
          const got: Array<{ b: Working; o: number; rs: number }> = [];
          let failed: AppError | null = null;
          for (let s = 0; s < this.#o.rangeSets.length && failed === null; s++) {
            let pick: { b: Working; o: number } | null = null;
            for (const b of mine) {
              if (b.value.rangeSet !== s) continue;
              const o = this.#freeOrdinal(b);
              if (o >= 0) {
                pick = { b, o };
                break;
              }
            }
            if (pick === null && cached !== null) {
              // The cache lists only the blocks this process knows: another process of the node
              // (the standalone fallback) may have claimed one with free addresses since. Claim
              // only on fresh reads, or the node holds more blocks than it needs (trial finding 10).
              needFresh = true;
              break;
            }
            if (pick === null) {
              claimed ??= new Set((await kv.list(this.#keys.blocksPrefix, { keysOnly: true })).map((e) => e.key.slice(this.#keys.blocksPrefix.length)));
              const nb = this.#claimable(s, claimed);
              if (nb !== null) {
                claimed.add(nb.key);
                blocks.set(nb.key, nb);
                mine.push(nb);
                pick = { b: nb, o: this.#freeOrdinal(nb) };
              }
            }
            if (pick === null) {
              // No free block anywhere in the pool: borrow from another node's block.
              others ??= await this.#othersBlocks(blocks, skipped);
              for (const b of others) {
                if (b.value.rangeSet !== s) continue;
                const o = this.#freeOrdinal(b);
                if (o >= 0) {
                  pick = { b, o };
                  break;
                }
              }
            }
            if (pick === null || pick.o < 0) {
              const rs = this.#o.rangeSets[s] as RangeSet;
              const bad = [...skipped.values()].map((e) => e.message).join('; ');
              failed = new RangeExhaustedError({ rangeSetIndex: s, rangeSet: rangeSetString(rs), size: rangeSetSize(rs), reserved: Number(rangeSetSize(rs)) }, {
                details: `pool ${this.#o.pool}: every block of range set ${s} is claimed and none has a free address${bad === '' ? '' : `; blocks that cannot be read were skipped (never allocated from, left for an operator): ${bad}`}`,
              });
              break;
            }
            const b = pick.b;
            b.value.seq += 1;
            b.value.allocs[String(pick.o)] = { id: r.containerId.trim(), ifname: r.ifname, node: this.#o.node, seq: b.value.seq, at: this.#now() };
            b.value.next = (pick.o + 1) % Number(blockAddresses(b.cidr.ip.family, b.cidr.prefix));
            b.dirty = true;
            got.push({ b, o: pick.o, rs: s });
          }
          if (needFresh) break;
          if (failed !== null) {
            for (const g of got) delete g.b.value.allocs[String(g.o)];
            results[i] = failed;
            continue;
          }
          const allocs = got.map((g) => this.#allocation(g.rs, g.b, g.o, (g.b.value.allocs[String(g.o)] as AllocValue).seq, false));
          results[i] = allocs;
          const hk = this.handleKey(r.containerId.trim(), r.ifname);
          const hv: HandleValue = {
            v: 1,
            node: this.#o.node,
            network: this.#o.network,
            at: this.#now(),
            ips: got.map((g, k) => ({ ip: formatIP((allocs[k] as PoolAllocation).ip), block: g.b.key, ordinal: g.o, seq: (allocs[k] as PoolAllocation).seq, rangeSet: g.rs })),
            ...(this.#o.host === undefined ? {} : { host: this.#o.host }),
          };
          const tomb = tombstones.get(hk);
          tx.expect(hk, tomb ?? null);
          const hvText = encodeHandle(hv);
          tx.put(hk, hvText);
          // Cached as created by this commit (over a tombstone: not cached, its DEL reads it).
          if (tomb === undefined) written.set(hk, hvText);
          anyHandle = true;
        }
      }
      if (needFresh) {
        this.#cache = null;
        throw new Retry();
      }
      // Nothing to write unless some request got its addresses (anyHandle): an ADD that failed (a
      // full range set) leaves etcd as it was — no half-used block claim, no moved round-robin cursor.
      // A failure decided on cached blocks (a full range set) may be stale: decide it on fresh reads.
      if (cached !== null && results.some((r) => r instanceof AppError)) {
        this.#cache = null;
        throw new Retry();
      }
      if (dels.length > 0 && reqs.length > 0 && results.some((r) => r instanceof AppError)) {
        // A failed ADD must write nothing (its claim, its cursor): the ADDs and the DELs go apart.
        tx.discard();
        told = new Map();
        return this.#apart(reqs, dels, skipped, reports);
      }
      // The round's DELs, on the blocks the ADDs left (one write per block; the rules of #del).
      const delResults: Array<string[] | typeof ALONE | null> = dels.map(() => null);
      const delFirst = new Map<string, number>();
      /** True once some DEL's write is buffered (a handle deleted or rewritten, a tombstone). */
      let delWrites = false;
      let tombLease: string | undefined | null = null;
      /** Blocks a DEL of this round released from (the candidates to give back). */
      const emptied = new Set<string>();
      for (let j = 0; j < dels.length; j++) {
        const r = dels[j] as PoolRequest;
        const id = r.containerId.trim();
        const hk = this.handleKey(id, r.ifname);
        if (delFirst.has(hk)) continue;
        delFirst.set(hk, j);
        const he = delEntries[j] ?? null;
        if (he === null) {
          // Nothing held: a tombstone (see #del: a late ADD transaction of this container then
          // fails its create-only compare), created only while the handle is still absent.
          if (tombLease === null) tombLease = this.#o.tombstoneLease === undefined ? undefined : await this.#o.tombstoneLease();
          tx.expect(hk, null);
          tx.put(hk, tombstoneValue(this.#o.node, this.#o.network, this.#now()), tombLease);
          delWrites = true;
          delResults[j] = [];
          continue;
        }
        let hv: HandleValue;
        try {
          hv = decodeHandle(he);
        } catch (e) {
          if (!(e instanceof CorruptValueError)) throw e;
          delResults[j] = ALONE; // #del (#delByOwner), after this round
          continue;
        }
        if (hv.deleted === true) {
          delResults[j] = [];
          continue;
        }
        const released: string[] = [];
        /** The handle's addresses whose block cannot be read: never released; the handle keeps naming them. */
        const left: HandleIP[] = [];
        for (const x of hv.ips) {
          const c = cached?.get(x.block);
          if (c !== undefined && !blocks.has(x.block)) blocks.set(x.block, fromCache(x.block, c));
          const b = await this.#tryBlock(x.block, blocks);
          if (b instanceof CorruptValueError) {
            left.push(x);
            tell(b, `${x.ip} of ${id}/${r.ifname} not released (its block cannot be read): the handle ${he.key} keeps it for an operator`);
            continue;
          }
          const a = b?.value.allocs[String(x.ordinal)];
          if (b === null || a === undefined || a.seq !== x.seq || a.id !== id || a.ifname !== r.ifname) {
            // Nothing of this container's to release here: a decision on what was read of the
            // block, compared (a cached block may be an older revision without the allocation: a
            // refill that wrote nothing caches the blocks as it read them, and an ADD may have
            // committed since — the commit then fails and the round is decided on fresh reads).
            if (b === null) tx.expect(this.blockKey(x.block), null);
            else this.#expectBlock(tx, b);
            continue;
          }
          delete b.value.allocs[String(x.ordinal)];
          b.dirty = true;
          emptied.add(b.key);
          released.push(x.ip);
        }
        delResults[j] = released.sort();
        // Every address is in a block that cannot be read: nothing can be released, nothing is written.
        if (left.length > 0 && left.length === hv.ips.length) {
          // An answer on a handle taken from the cache would not be compared: read it.
          if (guessed.has(he.key)) throw new Retry('a cached handle names only unreadable blocks: decide on fresh reads');
          continue;
        }
        tx.expect(he.key, he.modRevision);
        // A handle taken from the cache: its value compared too (revisions repeat after an etcd restore).
        if (guessed.has(he.key)) tx.expectValue(he.key, he.value);
        if (left.length === 0) tx.del(he.key);
        else tx.put(he.key, encodeHandle({ ...hv, ips: left }));
        delWrites = true;
      }
      /** Blocks this round gives back (deleted with their affinity), by key text. */
      const gone: string[] = [];
      let mineByRs: Map<number, KVEntry[]> | null = null;
      for (const b of blocks.values()) {
        if (b === null || !b.dirty) continue;
        const bk = this.blockKey(b.key);
        if (b.rev === null) {
          // A claim: the block and its affinity both absent.
          const ak = this.affinityKey(this.#o.node, b.key);
          tx.expect(bk, null);
          tx.expect(ak, null);
          tx.put(ak, affinityValue(b.value.rangeSet));
          tx.put(bk, encodeBlock(b.value));
          continue;
        }
        this.#expectBlock(tx, b);
        const empty = emptied.has(b.key) && holdsNothing(b.value); // a want keeps the block (src/pool/wanted.ts)
        // The node's cached blocks hold no other of this range set: it is the node's last as far
        // as this process knows — kept without listing the affinities (keeping is always safe; a
        // block another process of the node claimed meanwhile is given back by that one's DELs).
        const lastCached = cached !== null && ![...cached].some(([k, c]) => k !== b.key && c.value.rangeSet === b.value.rangeSet);
        if (empty && b.value.node === this.#o.node && b.value.state === 'owned' && !lastCached) {
          if (mineByRs === null) {
            mineByRs = new Map();
            for (const e of await kv.list(this.#keys.affinityPrefix(this.#o.node))) {
              let rs: number;
              try {
                rs = decodeAffinity(e);
              } catch (err) {
                if (!(err instanceof CorruptValueError)) throw err;
                // Left out: an emptied block is then kept rather than given back (keeping is always safe).
                tell(err, 'affinity not read: no block is given back on it, left for an operator');
                continue;
              }
              mineByRs.set(rs, [...(mineByRs.get(rs) ?? []), e]);
            }
          }
          const same = mineByRs.get(b.value.rangeSet) ?? [];
          const ak = this.affinityKey(this.#o.node, b.key);
          const aff = same.find((e) => e.key === ak);
          const kept = same.find((e) => e !== aff);
          if (kept !== undefined && aff !== undefined) {
            // Emptied by a DEL and not the node's last block of this range set: given back —
            // provided the block we keep is still there (compared), so two DELs of the node that
            // each empty one of its last two blocks cannot give back both (review).
            mineByRs.set(b.value.rangeSet, same.filter((e) => e !== aff));
            tx.expect(ak, aff.modRevision);
            tx.expect(kept.key, kept.modRevision);
            tx.del(bk);
            tx.del(ak);
            gone.push(b.key);
            continue;
          }
        }
        // A removed node's block emptied by this round's DEL goes back to the pool (src/pool/stuck-block.ts).
        if (empty && b.value.state === 'pendingRelease' && b.value.node !== this.#o.node && (await giveBackEmptied(kv, this.#keys, tx, b.key, b.value.node))) {
          gone.push(b.key);
          continue;
        }
        tx.put(bk, encodeBlock(b.value));
      }
      // etcd refuses a transaction of more than 128 compares + ops (`--max-txn-ops`): with small
      // blocks (/31, /32) a batch claims a block per request. Split the round (the parts re-read;
      // nothing was written) instead of failing it as a whole (review): ADDs and DELs apart, then
      // halves.
      if ((anyHandle || delWrites) && reqs.length + dels.length > 1 && tx.size + 1 > MAX_TXN_OPS) {
        tx.discard();
        told = new Map();
        if (reqs.length > 0 && dels.length > 0) return this.#apart(reqs, dels, skipped, reports);
        const half = (n: number): number => Math.ceil(n / 2);
        if (reqs.length > 1) {
          const a = await this.#add(reqs.slice(0, half(reqs.length)), [], skipped, reports);
          const b = await this.#add(reqs.slice(half(reqs.length)), [], skipped, reports);
          return { adds: [...a.adds, ...b.adds], dels: [] };
        }
        const a = await this.#add([], dels.slice(0, half(dels.length)), skipped, reports);
        const b = await this.#add([], dels.slice(half(dels.length)), skipped, reports);
        return { adds: [], dels: [...a.dels, ...b.dels] };
      }
      if (anyHandle || delWrites) {
        // No ADD or DEL of this node commits while a removal of it is begun (review F2): the
        // marker's absence is compared inside the transaction, so a stale cache cannot skip the veto.
        tx.expect(this.removingKey(this.#o.node), null);
        tx.onCommit((revision) => {
          for (const k of delFirst.keys()) this.#shared.handles.delete(k);
          for (const [k, v] of written) this.#shared.rememberHandle({ key: k, value: v, modRevision: revision, createRevision: revision });
          if (mineComplete) this.#remember(blocks, revision);
          else if (this.#cache !== null) {
            // DELs only: the node's blocks they wrote get the new revision.
            for (const b of blocks.values()) {
              if (b !== null && b.dirty && b.value.node === this.#o.node && this.#cache.has(b.key)) this.#cache.set(b.key, { cidr: b.cidr, value: copyBlock(b.value), rev: revision, encoded: encodeBlock(b.value) });
            }
          }
          // Blocks given back leave the cache.
          for (const k of gone) this.#cache?.delete(k);
        });
      } else {
        // Nothing is sent (a block written back to owned is written with the next ADD that commits).
        tx.discard();
      }
      if (!anyHandle && !delWrites && cached === null && mineComplete) {
        this.#remember(blocks, null);
        // An ADD that sent nothing (every request failed: a full pool) is still a sign of life:
        // veto a removal begun (one read, on this failure path only).
        if (pending.length > 0) await this.vetoIfMarked();
      }
      // Duplicates inside the round get the first one's answer.
      return {
        adds: reqs.map((r, i) => {
          const first = firstOf.get(this.handleKey(r.containerId.trim(), r.ifname));
          return (results[i] ?? results[first as number]) as PoolAllocation[] | AppError;
        }),
        dels: dels.map((r, j) => (delResults[j] ?? delResults[delFirst.get(this.handleKey(r.containerId.trim(), r.ifname)) as number]) as string[] | typeof ALONE),
      };
      },
      {
        attempts: MAX_ATTEMPTS,
        ...(this.#o.backoff === undefined ? {} : { backoff: this.#o.backoff }),
        lost: async () => {
          this.#cache = null;
          // The node is back: it vetoes a removal begun while it was away, then decides again.
          if ((await kv.get(this.removingKey(this.#o.node))) !== null) await this.veto();
        },
        exhausted: () => {
          throw new AppError('STORE_CONFLICT', `pool ${this.#o.pool}: ${MAX_ATTEMPTS} transactions lost to concurrent writers; try again`);
        },
      },
    );
    for (const [k, v] of told) reports.set(k, v);
    return value;
  }

  /** A round's ADDs, then its DELs, in separate transactions (see {@link batch}). */
  async #apart(reqs: readonly PoolRequest[], dels: readonly PoolRequest[], skipped: Map<string, CorruptValueError>, reports: Map<string, [CorruptValueError, string]>): Promise<Round> {
    const a = await this.#add(reqs, [], skipped, reports);
    const d = await this.#add([], dels, skipped, reports);
    return { adds: a.adds, dels: d.dels };
  }

  /**
   * After a successful ADD (or a read-only one): cache this node's blocks as now stored — the
   * written ones at `revision` (every key a transaction writes gets its revision), the others at
   * the revision read. `revision` null: nothing was written.
   */
  #remember(blocks: ReadonlyMap<string, Working | null>, revision: string | null): void {
    const next = new Map<string, CachedBlock>();
    for (const b of blocks.values()) {
      if (b === null || b.value.node !== this.#o.node) continue;
      if (b.dirty && revision !== null) {
        next.set(b.key, { cidr: b.cidr, value: copyBlock(b.value), rev: revision, encoded: encodeBlock(b.value) });
        continue;
      }
      if (b.rev === null || b.text === null) continue; // a claim that was not written
      // Cached as stored: a working copy modified and not written (a veto's pendingRelease → owned,
      // a failed ADD's bumped cursor) is cached as it was read, never as modified.
      const value = b.dirty ? decodeBlock({ key: this.blockKey(b.key), value: b.text, modRevision: b.rev, createRevision: '0' }, blockCidrText(b.cidr)) : copyBlock(b.value);
      next.set(b.key, { cidr: b.cidr, value, rev: b.rev, encoded: b.text });
    }
    this.#cache = next;
  }

  /**
   * Compare block `b` in `tx` as it was read: its mod revision, and — when it was built on the
   * cache rather than read in this attempt — its stored text (etcd Compare VALUE EQUAL). An etcd
   * restored from a snapshot reuses revisions, so a cached block's revision may match a block of
   * other content; equal text is equal content, whatever the revision.
   */
  #expectBlock(tx: Txn, b: Working): void {
    const bk = this.blockKey(b.key);
    tx.expect(bk, b.rev);
    if (b.fromCache && b.text !== null) tx.expectValue(bk, b.text);
  }

  /** A free (unclaimed) block of range set `s` for this node, as a new working block, or null. */
  #claimable(s: number, claimed: ReadonlySet<string>): Working | null {
    const rs = this.#o.rangeSets[s] as RangeSet;
    const free: Subnet[] = [];
    for (const b of blocksOf(rs, s, this.#o.sizes)) {
      if (!claimed.has(blockKeyText(b.cidr))) free.push(b.cidr);
      if (free.length >= CLAIM_SPREAD) break;
    }
    if (free.length === 0) return null;
    const cidr = free[nodeHash(this.#o.node) % free.length] as Subnet;
    const key = blockKeyText(cidr);
    return {
      key,
      cidr,
      value: { v: 1, cidr: blockCidrText(cidr), rangeSet: s, node: this.#o.node, state: 'owned', seq: 0, next: 0, allocs: {} },
      rev: null,
      text: null,
      fromCache: false,
      dirty: true,
    };
  }

  /**
   * Every block of the pool owned by other nodes (one prefix read), cached in `blocks`. A key that
   * is not a block's, or whose value cannot be read, is put in `skipped` (never borrowed from).
   */
  async #othersBlocks(blocks: Map<string, Working | null>, skipped: Map<string, CorruptValueError>): Promise<Working[]> {
    const prefix = this.#keys.blocksPrefix;
    const out: Working[] = [];
    for (const e of await this.#o.kv.list(prefix)) {
      const key = e.key.slice(prefix.length);
      if (blocks.has(key)) {
        const w = blocks.get(key);
        if (w !== null && w !== undefined && w.value.node !== this.#o.node) out.push(w);
        continue;
      }
      const cidrText = blockKeyCidr(key);
      let w: Working;
      try {
        if (cidrText === null) throw corrupt(e.key, 'not a block key');
        w = { key, cidr: (parseCIDR(cidrText) as NonNullable<ReturnType<typeof parseCIDR>>).subnet, value: decodeBlock(e, cidrText), rev: e.modRevision, text: e.value, fromCache: false, dirty: false };
      } catch (err) {
        if (!(err instanceof CorruptValueError)) throw err;
        skipped.set(err.key, err);
        continue;
      }
      blocks.set(key, w);
      if (w.value.node !== this.#o.node) out.push(w);
    }
    return out;
  }

  /**
   * The allocations of (containerId, ifname), checked against their blocks, or null when it has
   * no handle (CHECK). Throws STORE_CORRUPT when the handle names an allocation its block lacks.
   */
  async find(req: PoolRequest): Promise<PoolAllocation[] | null> {
    await this.#checkLayout();
    // Reads only: a read that raced with a release (LostRace) is read again.
    const { value } = await runTxn(
      this.#o.kv,
      async () => {
        const h = await this.#handle(req);
        if (h === null || h.value.deleted === true) return null;
        return await this.#existing(h, new Map(), req);
      },
      {
        attempts: MAX_ATTEMPTS,
        exhausted: () => {
          throw new AppError('STORE_CONFLICT', `pool ${this.#o.pool}: ${MAX_ATTEMPTS} reads of ${req.containerId.trim()}/${req.ifname} raced with releases; try again`);
        },
      },
    );
    return value;
  }

  /**
   * DEL: release the addresses of (containerId, ifname) and delete its handle, in one
   * transaction. Idempotent: no handle → `[]`. An address whose allocation no longer carries the
   * handle's sequence number and owner (re-allocated since) is not touched. An owned block left
   * empty is deleted with its affinity unless it is the node's last block of its range set.
   * Returns the released addresses (canonical text, sorted).
   *
   * A DEL always finishes when etcd answers (docs/cluster.md "Corrupt keys": a runtime retries a
   * failed DEL forever, and the pod is never torn down). Corrupt keys are left exactly as they are
   * and told to `onCorrupt` (after the DEL's transaction):
   * - an address whose block cannot be read is not released, and the handle is rewritten to name
   *   only such addresses, in the transaction that releases the others (nothing is written when
   *   no address could be released): no address is freed that the corrupt block may still give to
   *   this container, and the record of what it holds there stays for an operator — and for the
   *   node's reconcile, which releases it once the block is repaired;
   * - a handle that cannot be read is left as it is (a late ADD transaction of the container
   *   still fails its create-only compare on it), and the container's allocations (its ID and
   *   ifname) found in the pool's readable blocks are released ({@link #delByOwner}: one read of
   *   every block value, on this path only);
   * - an affinity that cannot be read only keeps an emptied block (no block is given back on it).
   * @throws STORE_UNAVAILABLE (CNI 11) when etcd cannot be asked; STORE_CONFLICT (CNI 11) after
   *   {@link MAX_ATTEMPTS} lost races.
   */
  async del(req: PoolRequest): Promise<string[]> {
    this.#shared.handles.delete(this.handleKey(req.containerId.trim(), req.ifname));
    /** What the last attempt went on without, by key and action (told once it succeeded). */
    const reports = new Map<string, [CorruptValueError, string]>();
    const r = await this.#del(req, reports);
    for (const [e, action] of reports.values()) this.#report('DEL', e, action);
    return r;
  }

  async #del(req: PoolRequest, reports: Map<string, [CorruptValueError, string]>): Promise<string[]> {
    const kv = this.#o.kv;
    const id = req.containerId.trim();
    const tell = (e: CorruptValueError, action: string): void => void reports.set(`${e.key}\u0000${action}`, [e, action]);
    const { value } = await runTxn(
      kv,
      async (tx) => {
        reports.clear();
        const he = await kv.get(this.handleKey(id, req.ifname));
        if (he === null) {
          // Nothing held: leave a tombstone, so an ADD of this container whose transaction etcd
          // applies only now (its sender gave up: the runtime's DEL came after an error) fails its
          // create-only compare instead of holding an address nobody will release (review F4).
          if (await this.#tombstone(req)) return [];
          throw new Retry('a handle appeared meanwhile: release it');
        }
        let hv: HandleValue;
        try {
          hv = decodeHandle(he);
        } catch (e) {
          if (!(e instanceof CorruptValueError)) throw e;
          const r = await this.#delByOwner(req, he, e, tell);
          if (r !== null) return r;
          throw new Retry('the handle or a block changed meanwhile: decide again');
        }
        if (hv.deleted === true) return [];
        const blocks = new Map<string, Working | null>();
        const released: string[] = [];
        /** The handle's addresses whose block cannot be read: never released; the handle keeps naming them. */
        const left: HandleIP[] = [];
        for (const x of hv.ips) {
          const b = await this.#tryBlock(x.block, blocks);
          if (b instanceof CorruptValueError) {
            left.push(x);
            tell(b, `${x.ip} of ${id}/${req.ifname} not released (its block cannot be read): the handle ${he.key} keeps it for an operator`);
            continue;
          }
          const a = b?.value.allocs[String(x.ordinal)];
          if (b === null || a === undefined || a.seq !== x.seq || a.id !== id || a.ifname !== req.ifname) continue;
          delete b.value.allocs[String(x.ordinal)];
          b.dirty = true;
          released.push(x.ip);
        }
        // Every address is in a block that cannot be read: nothing can be released, nothing is written.
        if (left.length > 0 && left.length === hv.ips.length) return [];
        tx.expect(he.key, he.modRevision);
        if (left.length === 0) tx.del(he.key);
        else tx.put(he.key, encodeHandle({ ...hv, ips: left }));
        /** Blocks this DEL gives back (deleted), by key text. */
        const gone: string[] = [];
        let mineByRs: Map<number, KVEntry[]> | null = null;
        for (const b of blocks.values()) {
          if (b === null || !b.dirty) continue;
          const bk = this.blockKey(b.key);
          tx.expect(bk, b.rev);
          if (holdsNothing(b.value) && b.value.node === this.#o.node && b.value.state === 'owned') {
            if (mineByRs === null) {
              mineByRs = new Map();
              for (const e of await kv.list(this.#keys.affinityPrefix(this.#o.node))) {
                let rs: number;
                try {
                  rs = decodeAffinity(e);
                } catch (err) {
                  if (!(err instanceof CorruptValueError)) throw err;
                  // Left out: an emptied block is then kept rather than given back (keeping is always safe).
                  tell(err, 'affinity not read: no block is given back on it, left for an operator');
                  continue;
                }
                mineByRs.set(rs, [...(mineByRs.get(rs) ?? []), e]);
              }
            }
            const same = mineByRs.get(b.value.rangeSet) ?? [];
            const ak = this.affinityKey(this.#o.node, b.key);
            const aff = same.find((e) => e.key === ak);
            const kept = same.find((e) => e !== aff);
            if (kept !== undefined && aff !== undefined) {
              // Empty and not the node's last block of this range set: give it back to the pool —
              // provided the block we keep is still there (compared), so two DELs of the node that
              // each empty one of its last two blocks cannot give back both (review).
              mineByRs.set(b.value.rangeSet, same.filter((e) => e !== aff));
              tx.expect(ak, aff.modRevision);
              tx.expect(kept.key, kept.modRevision);
              tx.del(bk);
              tx.del(ak);
              gone.push(b.key);
              continue;
            }
          }
          // A removed node's block emptied by this DEL goes back to the pool (src/pool/stuck-block.ts).
          if (holdsNothing(b.value) && b.value.state === 'pendingRelease' && b.value.node !== this.#o.node && (await giveBackEmptied(kv, this.#keys, tx, b.key, b.value.node))) {
            gone.push(b.key);
            continue;
          }
          tx.put(bk, encodeBlock(b.value));
        }
        // A DEL of this node is a sign of life too: it commits only while no removal of the node
        // is begun, else it vetoes and decides again (the same one compare as an ADD's).
        tx.expect(this.removingKey(this.#o.node), null);
        tx.onCommit((revision) => {
          // Blocks this DEL deleted leave the cache; those it wrote get the new revision.
          if (this.#cache === null) return;
          for (const k of gone) this.#cache.delete(k);
          for (const b of blocks.values()) {
            if (b !== null && b.dirty && b.value.node === this.#o.node && this.#cache.has(b.key)) this.#cache.set(b.key, { cidr: b.cidr, value: copyBlock(b.value), rev: revision, encoded: encodeBlock(b.value) });
          }
        });
        return released.sort();
      },
      {
        attempts: MAX_ATTEMPTS,
        ...(this.#o.backoff === undefined ? {} : { backoff: this.#o.backoff }),
        lost: async () => {
          if ((await kv.get(this.removingKey(this.#o.node))) !== null) await this.veto();
        },
        exhausted: () => {
          throw new AppError('STORE_CONFLICT', `pool ${this.#o.pool}: ${MAX_ATTEMPTS} releases of ${id}/${req.ifname} lost to concurrent writers; try again`);
        },
      },
    );
    return value;
  }

  /**
   * The DEL of an attachment whose handle `he` cannot be read (`err`): release the allocations of
   * (containerId, ifname) — reserve entries never — found in the pool's readable blocks (one prefix
   * read of every block value), in one transaction that compares the handle's `mod_revision`
   * (still the unreadable value: a handle rewritten meanwhile is decided again), each block written
   * and `removing/<me>` absent. The handle is left as it is for an operator; emptied blocks are
   * kept. Returns the released addresses (sorted; `[]` when there are none: nothing written), or
   * null when the transaction failed (the caller decides again).
   */
  async #delByOwner(req: PoolRequest, he: KVEntry, err: CorruptValueError, tell: (e: CorruptValueError, action: string) => void): Promise<string[] | null> {
    const kv = this.#o.kv;
    const id = req.containerId.trim();
    const prefix = this.#keys.blocksPrefix;
    const compares: KVCompare[] = [{ key: he.key, modRevision: he.modRevision }];
    const ops: KVOp[] = [];
    const released: string[] = [];
    for (const e of await kv.list(prefix)) {
      const cidrText = blockKeyCidr(e.key.slice(prefix.length));
      let v: BlockValue;
      try {
        if (cidrText === null) throw corrupt(e.key, 'not a block key');
        v = decodeBlock(e, cidrText);
      } catch (x) {
        if (!(x instanceof CorruptValueError)) throw x;
        tell(x, `not searched for allocations of ${id}/${req.ifname} (it cannot be read): left for an operator`);
        continue;
      }
      const cidr = (parseCIDR(cidrText) as NonNullable<ReturnType<typeof parseCIDR>>).subnet;
      let dirty = false;
      for (const [o, a] of Object.entries(v.allocs)) {
        if (a.reserve === true || a.id !== id || a.ifname !== req.ifname) continue;
        delete v.allocs[o];
        dirty = true;
        released.push(formatIP(ordinalIP(cidr, Number(o))));
      }
      if (!dirty) continue;
      compares.push({ key: e.key, modRevision: e.modRevision });
      ops.push({ put: e.key, value: encodeBlock(v) });
    }
    released.sort();
    tell(err, `handle left as it is for an operator (the addresses it names cannot be read from it); allocations of ${id}/${req.ifname} in the pool's readable blocks: ${released.length === 0 ? 'none' : `${released.join(', ')}, released`}`);
    if (ops.length === 0) return [];
    compares.push({ key: this.removingKey(this.#o.node), absent: true });
    const t = await kv.txn(compares, ops);
    this.#cache = null;
    if (t.succeeded) return released;
    if ((await kv.get(this.removingKey(this.#o.node))) !== null) await this.veto();
    return null;
  }

  /** Put a tombstone at (containerId, ifname)'s handle key if it is absent; false when a handle exists. */
  async #tombstone(req: PoolRequest): Promise<boolean> {
    const hk = this.handleKey(req.containerId.trim(), req.ifname);
    const lease = this.#o.tombstoneLease === undefined ? undefined : await this.#o.tombstoneLease();
    const value = tombstoneValue(this.#o.node, this.#o.network, this.#now());
    return (await this.#o.kv.txn([{ key: hk, absent: true }], [{ put: hk, value, ...(lease === undefined ? {} : { lease }) }])).succeeded;
  }

  /**
   * Release one address only if its allocation still has sequence number `seq` and owner
   * (containerId, ifname) — the reconciler's guard against a stale view (Calico's per-ordinal
   * sequence numbers). Returns false when the address is not held by that owner with that `seq`
   * (free, re-allocated since, or released by an earlier attempt of the caller whose answer was
   * lost: false means "not held", not "not released by this call"). Does not touch the handle's other addresses; deletes the handle when it held only
   * this one.
   */
  async releaseIfSeq(ip: string, seq: number, owner: PoolRequest): Promise<boolean> {
    const { value } = await runTxn(
      this.#o.kv,
      async (tx) => {
        const h = await this.#handle(owner);
        const x = h?.value.ips.find((i) => i.ip === ip);
        if (h === null || x === undefined || x.seq !== seq) return false;
        const blocks = new Map<string, Working | null>();
        const b = await this.#block(x.block, blocks);
        const a = b?.value.allocs[String(x.ordinal)];
        if (b === null || a === undefined || a.seq !== seq || a.id !== owner.containerId.trim() || a.ifname !== owner.ifname) return false;
        delete b.value.allocs[String(x.ordinal)];
        const rest = h.value.ips.filter((i) => i !== x);
        tx.expect(h.entry.key, h.entry.modRevision);
        tx.expect(this.blockKey(b.key), b.rev);
        if (rest.length === 0) tx.del(h.entry.key);
        else tx.put(h.entry.key, encodeHandle({ ...h.value, ips: rest }));
        tx.put(this.blockKey(b.key), encodeBlock(b.value));
        return true;
      },
      {
        attempts: MAX_ATTEMPTS,
        exhausted: () => {
          throw new AppError('STORE_CONFLICT', `pool ${this.#o.pool}: ${MAX_ATTEMPTS} releases of ${ip} lost to concurrent writers; try again`);
        },
      },
    );
    return value;
  }

  /**
   * Veto a removal of this node (docs/cluster.md "Reclaiming a dead node's blocks"): delete its
   * marker `removing/<node>` first — from then on every `--finish` transaction, which compares
   * the marker's revision, fails — then write each of its blocks in `pendingRelease` back to
   * `owned` (one revision-checked write each; a block it cannot read is left as it is and told to
   * `onCorrupt`). Returns the blocks written back. Called by an ADD
   * that finds the marker (its transaction compares it absent), by the daemon at the start of a
   * pool and on every heartbeat ({@link vetoIfMarked}), and by tools and tests.
   */
  async veto(): Promise<string[]> {
    const kv = this.#o.kv;
    await kv.txn([], [{ delete: this.removingKey(this.#o.node) }]);
    const prefix = this.#keys.affinityPrefix(this.#o.node);
    const out: string[] = [];
    for (const a of await kv.list(prefix, { keysOnly: true })) {
      const key = a.key.slice(prefix.length);
      // One revision-checked write per block; after MAX_ATTEMPTS lost races the block is left.
      await runTxn(
        kv,
        async (tx) => {
          const b = await this.#tryBlock(key, new Map());
          if (b instanceof CorruptValueError) {
            // Never rewritten: the other blocks are still written back.
            this.#report('veto', b, 'block not written back to owned (it cannot be read): left for an operator');
            return;
          }
          if (b === null || b.value.state !== 'pendingRelease' || b.value.node !== this.#o.node) return;
          b.value.state = 'owned';
          tx.expect(this.blockKey(key), b.rev);
          tx.put(this.blockKey(key), encodeBlock(b.value));
          tx.onCommit(() => out.push(key));
        },
        { attempts: MAX_ATTEMPTS, exhausted: () => undefined },
      );
    }
    this.#cache = null;
    return out.sort();
  }

  /**
   * {@link veto} only when this node's removal marker exists (one read otherwise): what the
   * daemon runs at the start of a pool and on every heartbeat, so an idle node that returns from
   * a partition vetoes within one heartbeat period (review F2b). Returns the blocks written back,
   * or null when no removal was begun.
   */
  async vetoIfMarked(): Promise<string[] | null> {
    if ((await this.#o.kv.get(this.removingKey(this.#o.node))) === null) return null;
    return this.veto();
  }

  /**
   * Keep `k` reserve entries per range set in this node's own blocks (docs/cluster.md "Offline
   * allocation"), and its settings key at `offlineSeconds` or more (never lowered), in one
   * transaction per attempt that compares every block written and `removing/<me>` absent (like
   * every ADD; a removal begun makes it veto and decide again). New entries go into the node's
   * owned blocks (round robin from `next`), then into a free block it claims; never into another
   * node's block. Entries beyond `k` are kept (they are released with the node's blocks); an entry
   * at a wanted ordinal (a live pod of another node uses the address, src/pool/wanted.ts) is
   * deleted in the same transaction and never counted or returned as a slot. When
   * nothing needs writing it reads `removing/<me>` instead (so a call is always a confirmed
   * contact when it returns). A block of the node that cannot be read is skipped (no entry in it,
   * never rewritten; told to `onCorrupt`). Returns every reserve entry of the node (in owned blocks), the
   * shortfall per range set (a full pool), and the offline seconds its settings now hold.
   * @throws like {@link add} (STORE_UNAVAILABLE, STORE_CONFLICT after {@link MAX_ATTEMPTS}, STORE_CORRUPT).
   */
  async refillReserve(k: number, offlineSeconds: number): Promise<{ slots: ReserveSlot[]; short: number[]; settingsSeconds: number }> {
    await this.checkMeta();
    const kv = this.#o.kv;
    const me = this.#o.node;
    const prefix = this.#keys.affinityPrefix(me);
    const sk = this.settingsKey(me);
    const { value } = await runTxn(
      kv,
      async (tx) => {
      const blocks = new Map<string, Working | null>();
      const [listed, se] = await Promise.all([kv.list(prefix, { keysOnly: true }), kv.get(sk)]);
      const announced = se === null ? null : decodeSettings(se);
      const mine: Working[] = [];
      let lostRace = false;
      const skipped: CorruptValueError[] = [];
      for (const a of listed) {
        const b = await this.#tryBlock(a.key.slice(prefix.length), blocks);
        if (b instanceof CorruptValueError) {
          skipped.push(b); // as an ADD does: no reserve entry in it, never rewritten
          continue;
        }
        if (b === null || b.value.node !== me) {
          lostRace = true; // given back and claimed by another meanwhile (see add): read again
          break;
        }
        if (b.value.state === 'pendingRelease') {
          b.value.state = 'owned'; // the node is back: veto in this transaction (as an ADD does)
          b.dirty = true;
        }
        mine.push(b);
      }
      if (lostRace) {
        this.#cache = null;
        throw new Retry();
      }
      // A reserve entry at a wanted ordinal (a live pod of another node uses the address,
      // src/pool/wanted.ts) is never handed out offline: deleted here, in this transaction.
      for (const b of mine) {
        for (const [o, a] of Object.entries(b.value.allocs)) {
          if (a.reserve !== true || a.node !== me || !isWanted(b.value, Number(o))) continue;
          delete b.value.allocs[o];
          b.dirty = true;
        }
      }
      let claimed: Set<string> | null = null;
      const short: number[] = [];
      for (let s = 0; s < this.#o.rangeSets.length; s++) {
        let need = k - mine.filter((b) => b.value.rangeSet === s).reduce((n, b) => n + Object.values(b.value.allocs).filter((a) => a.reserve === true).length, 0);
        while (need > 0) {
          let pick: { b: Working; o: number } | null = null;
          for (const b of mine) {
            if (b.value.rangeSet !== s) continue;
            const o = this.#freeOrdinal(b);
            if (o >= 0) {
              pick = { b, o };
              break;
            }
          }
          if (pick === null) {
            claimed ??= new Set((await kv.list(this.#keys.blocksPrefix, { keysOnly: true })).map((e) => e.key.slice(this.#keys.blocksPrefix.length)));
            const nb = this.#claimable(s, claimed);
            if (nb === null || this.#freeOrdinal(nb) < 0) break;
            claimed.add(nb.key);
            blocks.set(nb.key, nb);
            mine.push(nb);
            continue;
          }
          const b = pick.b;
          b.value.seq += 1;
          b.value.allocs[String(pick.o)] = { id: '', ifname: '', node: me, seq: b.value.seq, at: this.#now(), reserve: true };
          b.value.next = (pick.o + 1) % Number(blockAddresses(b.cidr.ip.family, b.cidr.prefix));
          b.dirty = true;
          need--;
        }
        short.push(Math.max(0, need));
      }
      for (const b of blocks.values()) {
        if (b === null || !b.dirty) continue;
        const bk = this.blockKey(b.key);
        if (b.rev === null) {
          const ak = this.affinityKey(me, b.key);
          tx.expect(bk, null);
          tx.expect(ak, null);
          tx.put(ak, affinityValue(b.value.rangeSet));
        } else tx.expect(bk, b.rev);
        tx.put(bk, encodeBlock(b.value));
      }
      const settingsSeconds = Math.max(announced ?? 0, offlineSeconds);
      if (announced === null || announced < offlineSeconds) {
        tx.expect(sk, se === null ? null : se.modRevision);
        tx.put(sk, settingsValue(settingsSeconds));
      }
      const slots = (): ReserveSlot[] =>
        mine
          .filter((b) => b.value.state === 'owned')
          .flatMap((b) =>
            Object.entries(b.value.allocs)
              .filter(([o, a]) => a.reserve === true && a.node === me && !isWanted(b.value, Number(o)))
              .map(([o, a]) => ({ block: b.key, ordinal: Number(o), seq: a.seq, rangeSet: b.value.rangeSet, ip: formatIP(ordinalIP(b.cidr, Number(o))) })),
          );
      if (tx.ops.length === 0) {
        // Nothing to write: read the marker, so that a return is a confirmed contact all the same.
        if ((await kv.get(this.removingKey(me))) !== null) {
          await this.veto();
          throw new Retry('a removal of this node was begun: vetoed, decide again');
        }
        this.#remember(blocks, null);
        for (const e of skipped) this.#report('refill', e, 'block skipped: no reserve entry set aside in it, left for an operator');
        return { slots: slots(), short, settingsSeconds };
      }
      if (tx.size + 1 > MAX_TXN_OPS) throw new AppError('INTERNAL', `pool ${this.#o.pool}: a reserve refill of ${k} per range set needs more than ${MAX_TXN_OPS} transaction ops (blocks too small)`);
      tx.expect(this.removingKey(me), null);
      tx.onCommit((revision) => {
        this.#remember(blocks, revision);
        for (const e of skipped) this.#report('refill', e, 'block skipped: no reserve entry set aside in it, left for an operator');
      });
      return { slots: slots(), short, settingsSeconds };
      },
      {
        attempts: MAX_ATTEMPTS,
        ...(this.#o.backoff === undefined ? {} : { backoff: this.#o.backoff }),
        lost: async () => {
          this.#cache = null;
          if ((await kv.get(this.removingKey(me))) !== null) await this.veto();
        },
        exhausted: () => {
          throw new AppError('STORE_CONFLICT', `pool ${this.#o.pool}: ${MAX_ATTEMPTS} reserve refills lost to concurrent writers; try again`);
        },
      },
    );
    return value;
  }

  /**
   * Sync one journal entry of this node (`kind` `add`) to etcd: one transaction per attempt that
   * compares each reserve entry's block at the revision read (the entry still this node's
   * reserve with the journal's sequence number), the handle absent (or its tombstone's
   * revision), and `removing/<me>` absent, and turns each reserve entry into the container's
   * allocation (a new sequence number) and puts the handle. A handle of this node that already
   * names other addresses (an ADD whose answer was lost before it went offline) is replaced in
   * the same transaction, its addresses released (the runtime knows only the journal's answer).
   * Returns `synced` (also when an earlier sync did it: the handle names these addresses with
   * allocations of the container), or `{gone}` with the reason when a reserve entry is no longer
   * there (only `--finish` removes one: the partition outlived the veto window) or the handle
   * belongs to another node, or `{gone}` naming the want when an entry's ordinal is wanted (a
   * live pod of another node uses the address: a conflict, never allocated). Never releases
   * anything else.
   * @throws like {@link add}.
   */
  async syncJournalEntry(e: JournalEntry): Promise<'synced' | { gone: string }> {
    const kv = this.#o.kv;
    const me = this.#o.node;
    const req: PoolRequest = { containerId: e.containerId, ifname: e.ifname };
    const { value } = await runTxn<'synced' | { gone: string }>(
      kv,
      async (tx) => {
      const h = await this.#handle(req);
      const blocks = new Map<string, Working | null>();
      const live = h !== null && h.value.deleted !== true ? h : null;
      if (live !== null && live.value.ips.length === e.ips.length && e.ips.every((x) => live.value.ips.some((y) => y.block === x.block && y.ordinal === x.ordinal))) {
        let ours = true;
        for (const y of live.value.ips) {
          const a = (await this.#block(y.block, blocks))?.value.allocs[String(y.ordinal)];
          if (a === undefined || a.reserve === true || a.id !== e.containerId || a.ifname !== e.ifname || a.seq !== y.seq) ours = false;
        }
        if (ours) return 'synced';
      }
      if (live !== null && live.value.node !== me) return { gone: `handle ${live.entry.key} belongs to node ${live.value.node}` };
      if (live !== null) {
        for (const x of live.value.ips) {
          const b = await this.#block(x.block, blocks);
          const a = b?.value.allocs[String(x.ordinal)];
          if (b === null || a === undefined || a.reserve === true || a.seq !== x.seq || a.id !== e.containerId || a.ifname !== e.ifname) continue;
          delete b.value.allocs[String(x.ordinal)];
          b.dirty = true;
        }
      }
      if (h === null) tx.expect(this.handleKey(e.containerId, e.ifname), null);
      else tx.expect(h.entry.key, h.entry.modRevision);
      const hips: HandleIP[] = [];
      let gone: string | null = null;
      for (const x of e.ips) {
        const b = await this.#block(x.block, blocks);
        const a = b?.value.allocs[String(x.ordinal)];
        if (b === null || a === undefined || a.reserve !== true || a.seq !== x.seq || b.value.node !== me) {
          gone = `reserve entry ${x.ip} (block ${x.block}, sequence ${x.seq}) is no longer this node's: ${b === null ? 'the block is gone' : a === undefined ? 'the address is free' : a.reserve === true ? `a reserve entry of sequence ${a.seq}` : `held by ${a.id}/${a.ifname}`}`;
          break;
        }
        const w = b.value.wanted?.[String(x.ordinal)];
        if (w !== undefined) {
          // A conflict, never an allocation: a live pod of node w.node uses the address (src/pool/wanted.ts).
          gone = `reserve entry ${x.ip} (block ${x.block}, sequence ${x.seq}) is wanted by sandbox ${w.sandbox} of node ${w.node} (a live pod uses the address): not allocated`;
          break;
        }
        b.value.seq += 1;
        b.value.allocs[String(x.ordinal)] = { id: e.containerId, ifname: e.ifname, node: me, seq: b.value.seq, at: this.#now() };
        b.dirty = true;
        hips.push({ ip: x.ip, block: x.block, ordinal: x.ordinal, seq: b.value.seq, rangeSet: x.rangeSet });
      }
      if (gone !== null) return { gone };
      for (const b of blocks.values()) {
        if (b === null || !b.dirty) continue;
        tx.expect(this.blockKey(b.key), b.rev);
        tx.put(this.blockKey(b.key), encodeBlock(b.value));
      }
      const hv: HandleValue = { v: 1, node: me, network: e.network, at: this.#now(), ips: hips, ...(this.#o.host === undefined ? {} : { host: this.#o.host }) };
      tx.put(this.handleKey(e.containerId, e.ifname), encodeHandle(hv));
      tx.expect(this.removingKey(me), null);
      tx.onCommit(() => (this.#cache = null));
      return 'synced';
      },
      {
        attempts: MAX_ATTEMPTS,
        ...(this.#o.backoff === undefined ? {} : { backoff: this.#o.backoff }),
        lost: async () => {
          this.#cache = null;
          if ((await kv.get(this.removingKey(me))) !== null) await this.veto();
        },
        exhausted: () => {
          throw new AppError('STORE_CONFLICT', `pool ${this.#o.pool}: ${MAX_ATTEMPTS} syncs of ${e.containerId}/${e.ifname} lost to concurrent writers; try again`);
        },
      },
    );
    return value;
  }

  /** Every handle `node` made, sorted by key (one prefix read of the pool's handles); a handle that cannot be read is left out (whose it is cannot be told). */
  async handlesOf(node: string): Promise<Array<{ containerId: string; ifname: string; value: HandleValue }>> {
    const prefix = this.#keys.handlesPrefix;
    const out: Array<{ containerId: string; ifname: string; value: HandleValue }> = [];
    for (const e of await this.#o.kv.list(prefix)) {
      let value: HandleValue;
      try {
        value = decodeHandle(e);
      } catch (err) {
        if (err instanceof CorruptValueError) continue; // whose it is cannot be told
        throw err;
      }
      if (value.node !== node || value.deleted === true) continue;
      const [containerId, ifname] = e.key.slice(prefix.length).split('/') as [string, string];
      out.push({ containerId, ifname, value });
    }
    return out;
  }
}
