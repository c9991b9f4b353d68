/**
 * The part of the cluster pool allocator (src/pool/allocator.ts) that its jobs share: the options,
 * key layout and clock of one node's allocator, the node's block cache ({@link BlockCache}) and
 * the reads and decisions every job builds on (a block read at a revision, a handle, a free
 * ordinal, a block to claim, the pool's `meta` check). The types and limits of the allocator are
 * declared here and re-exported by src/pool/allocator.ts. Internal to src/pool/.
 */
import { isWanted } from './wanted.ts';
import { AppError } from '../common/errors.ts';
import { formatIP, parseCIDR, type IP, type Subnet } from '../common/ip.ts';
import type { KV, KVEntry } from '../store/kv.ts';
import { blockAddresses, blockCidrText, blocksOf, isAllocatable, nodeHash, ordinalIP, type BlockSizes } from './blocks.ts';
import { removalWindowSeconds } from './offline.ts';
import { Retry, runTxn, type Txn } from './txn.ts';
import {
  blockKeyCidr,
  blockKeyText,
  clusterPinValue,
  copyBlock,
  corrupt,
  CorruptValueError,
  decodeBlock,
  decodeClusterPin,
  decodeHandle,
  encodeBlock,
  keysOf,
  metaOf,
  parseJson,
  type BlockValue,
  type HandleValue,
  type PoolKeyLayout,
} from './model.ts';
import { createGuard, existingGuard, layoutMismatch, type PoolLayout } from './overlap.ts';
import { rangeFor } from '../ipam/range.ts';
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
  /**
   * The daemon's requests: true once the request's caller is known gone (the shim's connection
   * closed: the runtime gave the ADD up, and may have DELeted the container through the
   * standalone fallback meanwhile). Asked in every attempt of a round, also the first of a round
   * a split or a round of ADDs apart from DELs begins, after {@link refresh} for every attempt
   * but the first of a call: a round that resumes after a stall (a daemon stopped and continued)
   * never allocates for a caller that is gone — a Jepsen run under load found such a round
   * allocating after the DEL had released the container's handle, which no tombstone fences.
   * Absent (the standalone plugin): never gone.
   */
  readonly gone?: () => boolean;
  /** The daemon's requests: brings {@link gone} up to date (the socket thread's news); awaited once per later attempt. */
  readonly refresh?: () => Promise<void>;
}

/**
 * The refusal of an ADD whose caller has gone ({@link PoolRequest.gone}) before an attempt of its
 * round: STORE_CONFLICT (retryable; nobody reads it — its caller is gone). It writes nothing.
 */
export function goneAddError(r: PoolRequest): AppError {
  return new AppError('STORE_CONFLICT', `ADD of ${r.containerId.trim()}/${r.ifname} not sent: its client has gone`);
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

/** Options of `PoolAllocator` (src/pool/allocator.ts). */
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
export class LostRace extends Retry {}


/** A block as one attempt reads and changes it. */
export interface Working {
  key: string;
  cidr: Subnet;
  value: BlockValue;
  /** Revision read, or null for a block this attempt claims. */
  rev: string | null;
  /** The stored text `value` was read (or cached) as; null for a block this attempt claims. */
  text: string | null;
  /** Built on the cache, not read in this attempt: its writes compare the stored text too (`expectBlock`). */
  fromCache: boolean;
  dirty: boolean;
}

/** A working copy of cached block `key` (not read in this attempt: its writes compare its text too). */
export function fromCache(key: string, c: CachedBlock): Working {
  return { key, cidr: c.cidr, value: copyBlock(c.value), rev: c.rev, text: c.encoded, fromCache: true, dirty: false };
}

/**
 * What every job of one node's allocator shares: its options, its key layout, its clock, the
 * node's block cache and the reads and decisions built on them. Internal to src/pool/ (the
 * `PoolAllocator` of src/pool/allocator.ts composes it; nothing outside the pool sees it).
 */
export class AllocatorCore {
  /** The allocator's options. */
  readonly o: PoolAllocatorOptions;
  /** The pool's key layout. */
  readonly keys: PoolKeyLayout;
  /** Clock, milliseconds since the epoch. */
  readonly now: () => number;
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
  readonly shared: BlockCache;
  /** The node's cached blocks by key text ({@link BlockCache}; see `shared`), or null: unknown. */
  get cache(): Map<string, CachedBlock> | null {
    // etcd's revision went backwards (restored from a snapshot): what is cached may be of another history.
    const g = this.o.kv.generation ?? 0;
    if (this.shared.generation !== g) {
      this.shared.generation = g;
      this.shared.blocks = null;
      this.shared.handles.clear();
    }
    return this.shared.blocks;
  }
  set cache(v: Map<string, CachedBlock> | null) {
    this.shared.blocks = v;
  }

  constructor(o: PoolAllocatorOptions) {
    this.o = o;
    this.keys = keysOf(o);
    this.now = o.now ?? Date.now;
    this.shared = o.cache ?? new BlockCache();
  }

  /** Key of the pool's `meta`. */
  get metaKey(): string {
    return this.keys.meta;
  }
  /** Key of block `b` (key text). */
  blockKey(b: string): string {
    return this.keys.block(b);
  }
  /** Key of the affinity of block `b` to `node`. */
  affinityKey(node: string, b: string): string {
    return this.keys.affinity(node, b);
  }
  /**
   * Key of `node`'s heartbeat (`P/pools/<pool>/alive/<node>` → `{"v":1,"node","since"}`, put with
   * a lease by the node's daemon): present = the node may be alive. Never read to decide an
   * allocation; `pool remove-node` step 1 compares it absent (unless `--force`) and every
   * `--finish` transaction compares it absent.
   */
  aliveKey(node: string): string {
    return this.keys.alive(node);
  }
  /**
   * Key of the removal marker of `node` (`P/pools/<pool>/removing/<node>` → `{"v":1,"node","at"}`):
   * created (create-only) by step 1 of `pool remove-node`, deleted by the node's veto. While it
   * exists no ADD of `node` commits (each compares it absent); every transaction of
   * `--finish` compares its revision, so a veto (its deletion) stops the reclaim (review F1/F2).
   */
  removingKey(node: string): string {
    return this.keys.removing(node);
  }
  /**
   * Key of the veto window of `node`'s removal (`P/pools/<pool>/removal-window/<node>` →
   * `{"v":1,"node","at"}`), put by step 1 (src/pool/removal.ts) with a lease of at least REMOVAL_WINDOW_SECONDS:
   * `--finish` refuses while it exists (compared absent in every one of its transactions). A
   * lease can only outlive its TTL (a leader change on etcd 3.4 restarts it), never expire early,
   * so its absence proves the window has passed.
   */
  windowKey(node: string): string {
    return this.keys.window(node);
  }
  /**
   * Key of `node`'s settings (`P/pools/<pool>/nodes/<node>/settings` → `{"v":1,"offlineSeconds":S}`,
   * no lease): written by the node's daemon with `ipam.pool.offline` (never lowered by it), read
   * by `pool remove-node` step 1 to size the veto window ({@link removalWindowSeconds}). Not
   * under `nodes/<node>/blocks/`, so the affinity index is unchanged.
   */
  settingsKey(node: string): string {
    return this.keys.settings(node);
  }
  /** Key of the handle of (containerId, ifname). */
  handleKey(containerId: string, ifname: string): string {
    return this.keys.handle(containerId, ifname);
  }

  /**
   * Key of the pool's cluster pin (`P/pools/<pool>/meta-cluster` → `{"v":1,"clusterId":"<hex>"}`):
   * the etcd cluster the pool was created in, written with `meta` (or, for a pool created before
   * the pin existed, by the first process whose cluster check every endpoint answered). Named so
   * that one prefix read of `…/meta` returns both keys.
   */
  get clusterPinKey(): string {
    return this.keys.clusterPin;
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
    const want = metaOf(this.o.rangeSets, this.o.sizes);
    const layout = this.#layout;
    const kv = this.o.kv;
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
          throw new AppError('STORE_UNAVAILABLE', `pool ${this.o.pool} is not in etcd yet, and is created only once every endpoint in ipam.pool.etcd.endpoints has confirmed one etcd cluster; no answer from ${check.unanswered.join(', ')}; retry`, { retryable: true });
        }
        tx.expect(this.metaKey, null);
        tx.put(this.metaKey, want);
        // Overlapping pools refused (src/pool/overlap.ts): the prefix's pool index compared and
        // rewritten in the same transaction.
        const guard = await createGuard(kv, this.o.prefix, this.o.pool, layout);
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
      if (e.value !== want) throw layoutMismatch(this.o.pool, this.o.network, e, layout, want);
      if (check?.clusterId != null) {
        if (pinEntry !== null) {
          const pinned = decodeClusterPin(pinEntry);
          if (pinned !== check.clusterId) {
            throw new AppError(
              'IPAM_INVALID_CONFIG',
              `pool ${this.o.pool} was created in etcd cluster ${pinned}, but its endpoints now answer as cluster ${check.clusterId} (a copy of its keys in another cluster: a mirror, or a restore into a new cluster) — point ipam.pool.etcd.endpoints at the pool's cluster, or see docs/cluster.md "One etcd cluster"`,
            );
          }
        } else if (check.unanswered.length === 0) {
          // A pool from before the pin: pinned now, by a process every endpoint answered (create-only).
          await kv.txn([{ key: pinKey, absent: true }, { key: this.metaKey, modRevision: e.modRevision }], [{ put: pinKey, value: clusterPinValue(check.clusterId) }]);
        }
      }
      await existingGuard(kv, this.o.prefix, this.o.pool, e, layout);
      return;
      },
      {
        attempts: MAX_ATTEMPTS,
        // Never marked checked without a `meta` that passed the guards: a pool used with neither
        // would skip the overlap check for the allocator's life (review).
        exhausted: () => {
          throw new AppError('STORE_CONFLICT', `pool ${this.o.pool}: ${MAX_ATTEMPTS} attempts to create ${this.metaKey} lost to concurrent writers; try again`);
        },
      },
    );
    this.#metaChecked = true;
  }

  /** This config's layout (what `meta` records). */
  get #layout(): PoolLayout {
    return { rangeSets: this.o.rangeSets, blockSize: this.o.sizes.blockSize4, blockSize6: this.o.sizes.blockSize6 };
  }

  /**
   * CHECK's read-only check of this config against the pool's `meta` (nothing is created).
   * @throws AppError IPAM_INVALID_CONFIG on a layout mismatch (see {@link layoutMismatch}); STORE_CORRUPT for a `meta` that cannot be read
   */
  async checkLayout(): Promise<void> {
    const e = await this.o.kv.get(this.metaKey);
    const want = metaOf(this.o.rangeSets, this.o.sizes);
    if (e !== null && e.value !== want) throw layoutMismatch(this.o.pool, this.o.network, e, this.#layout, want);
  }

  /** The handle of (containerId, ifname) with its revision, or null. */
  async handle(req: PoolRequest): Promise<{ entry: KVEntry; value: HandleValue } | null> {
    const e = await this.o.kv.get(this.handleKey(req.containerId.trim(), req.ifname));
    return e === null ? null : { entry: e, value: decodeHandle(e) };
  }

  /**
   * Block `key` (key text) as a working copy, read once per attempt (`cache`: the attempt's reads;
   * a block whose revision is cached is not decoded again), or null when it does not exist.
   * Throws {@link CorruptValueError} for a key or value that cannot be read.
   */
  async block(key: string, cache: Map<string, Working | null>): Promise<Working | null> {
    if (cache.has(key)) return cache.get(key) as Working | null;
    const cidrText = blockKeyCidr(key);
    if (cidrText === null) throw corrupt(this.blockKey(key), 'not a block key');
    const e = await this.o.kv.get(this.blockKey(key));
    // A block whose stored text is cached is not decoded again (one text, one value; the revision
    // alone is not enough: an etcd restored from a snapshot reuses revisions).
    const c = e === null ? undefined : this.cache?.get(key);
    const w: Working | null =
      e === null
        ? null
        : c !== undefined && c.rev === e.modRevision && c.encoded === e.value
          ? { key, cidr: c.cidr, value: copyBlock(c.value), rev: e.modRevision, text: e.value, fromCache: false, dirty: false }
          : { key, cidr: (parseCIDR(cidrText) as NonNullable<ReturnType<typeof parseCIDR>>).subnet, value: decodeBlock(e, cidrText), rev: e.modRevision, text: e.value, fromCache: false, dirty: false };
    cache.set(key, w);
    return w;
  }

  /** {@link block}, but a block that cannot be read is returned as its {@link CorruptValueError} (the KV's errors are thrown). */
  async tryBlock(key: string, cache: Map<string, Working | null>): Promise<Working | null | CorruptValueError> {
    try {
      return await this.block(key, cache);
    } catch (e) {
      if (e instanceof CorruptValueError) return e;
      throw e;
    }
  }

  /** Tell `onCorrupt` (never throws). */
  report(op: CorruptSkip['op'], e: CorruptValueError, action: string): void {
    try {
      this.o.onCorrupt?.({ op, key: e.key, why: e.why, action });
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
  existing(h: { entry: KVEntry; value: HandleValue }, blocks: Map<string, Working | null>, req: PoolRequest): Promise<PoolAllocation[]> {
    return Promise.all(
      h.value.ips.map(async (x) => {
        const b = await this.block(x.block, blocks);
        const a = b?.value.allocs[String(x.ordinal)];
        if (b === null || a === undefined || a.seq !== x.seq || a.id !== req.containerId.trim() || a.ifname !== req.ifname) {
          const again = await this.o.kv.get(h.entry.key);
          if (again === null || again.modRevision !== h.entry.modRevision) throw new LostRace();
          throw corrupt(h.entry.key, `names ${x.ip} (block ${x.block}, sequence ${x.seq}) but the block holds no such allocation`);
        }
        return this.allocation(x.rangeSet, b, x.ordinal, a.seq, true);
      }),
    );
  }

  /** The {@link PoolAllocation} of ordinal `ordinal` of `b` in range set `rangeSetIndex`; STORE_CORRUPT when the address is outside that range set of this config. */
  allocation(rangeSetIndex: number, b: Working, ordinal: number, seq: number, existing: boolean): PoolAllocation {
    const ip = ordinalIP(b.cidr, ordinal);
    const rs = this.o.rangeSets[rangeSetIndex];
    const k = rs === undefined ? -1 : rangeFor(rs, ip);
    if (rs === undefined || k < 0) throw corrupt(this.blockKey(b.key), `holds ${formatIP(ip)}, outside range set ${rangeSetIndex} of this network's config`);
    return { rangeSetIndex, ip, range: rs[k] as Range, block: b.key, seq, existing, borrowed: b.value.node !== this.o.node };
  }

  /** The first of `blocks` in range set `s` with a {@link freeOrdinal}, and that ordinal; null when none has one. */
  firstFree(blocks: Iterable<Working>, s: number): { b: Working; o: number } | null {
    for (const b of blocks) {
      if (b.value.rangeSet !== s) continue;
      const o = this.freeOrdinal(b);
      if (o >= 0) return { b, o };
    }
    return null;
  }

  /**
   * A free allocatable ordinal of `b` from its `next` (round robin), or -1. Every path that hands
   * out a new address (ADD, the rounds, the offline reserve refill) picks it here: a wanted
   * ordinal (a live pod's address, src/pool/wanted.ts) is never free.
   */
  freeOrdinal(b: Working): number {
    const rs = this.o.rangeSets[b.value.rangeSet];
    if (rs === undefined || b.value.state !== 'owned') return -1;
    const n = Number(blockAddresses(b.cidr.ip.family, b.cidr.prefix));
    for (let k = 0; k < n; k++) {
      const o = (b.value.next + k) % n;
      if (b.value.allocs[String(o)] === undefined && isAllocatable(rs, b.cidr, o) && !isWanted(b.value, o)) return o;
    }
    return -1;
  }

  /**
   * After a successful ADD (or a read-only one): cache this node's blocks as now stored — the
   * written ones at `revision` (every key a transaction writes gets its revision), the others at
   * the revision read. `revision` null: nothing was written.
   */
  remember(blocks: ReadonlyMap<string, Working | null>, revision: string | null): void {
    const next = new Map<string, CachedBlock>();
    for (const b of blocks.values()) {
      if (b === null || b.value.node !== this.o.node) continue;
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
    this.cache = next;
  }

  /**
   * Compare block `b` in `tx` as it was read: its mod revision, and — when it was built on the
   * cache rather than read in this attempt — its stored text (etcd Compare VALUE EQUAL). An etcd
   * restored from a snapshot reuses revisions, so a cached block's revision may match a block of
   * other content; equal text is equal content, whatever the revision.
   */
  expectBlock(tx: Txn, b: Working): void {
    const bk = this.blockKey(b.key);
    tx.expect(bk, b.rev);
    if (b.fromCache && b.text !== null) tx.expectValue(bk, b.text);
  }

  /** A free (unclaimed) block of range set `s` for this node, as a new working block, or null. */
  claimable(s: number, claimed: ReadonlySet<string>): Working | null {
    const rs = this.o.rangeSets[s] as RangeSet;
    const free: Subnet[] = [];
    for (const b of blocksOf(rs, s, this.o.sizes)) {
      if (!claimed.has(blockKeyText(b.cidr))) free.push(b.cidr);
      if (free.length >= CLAIM_SPREAD) break;
    }
    if (free.length === 0) return null;
    const cidr = free[nodeHash(this.o.node) % free.length] as Subnet;
    const key = blockKeyText(cidr);
    return {
      key,
      cidr,
      value: { v: 1, cidr: blockCidrText(cidr), rangeSet: s, node: this.o.node, state: 'owned', seq: 0, next: 0, allocs: {} },
      rev: null,
      text: null,
      fromCache: false,
      dirty: true,
    };
  }

}
