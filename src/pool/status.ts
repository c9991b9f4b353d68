/**
 * The status model of a cluster pool (`ipwarden pool status`, docs/cluster.md "pool status"):
 * from one read of the pool's `meta` and one of its blocks (both at current revisions), the
 * blocks per node, usage, reserve entries (`ipam.pool.offline`) and free addresses cluster-wide,
 * and each node's heartbeat state. Logic over a {@link KV}, no I/O of its own. A key that cannot be
 * read (a block value that does not decode, a key under `blocks/` that names no block, a heartbeat
 * or settings key that names no node) is listed in `corrupt` with why, and the rest is counted
 * (docs/cluster.md "Corrupt keys"); only a `meta` that cannot be read fails the report (without
 * the layout nothing can be counted).
 */
import { AppError } from '../common/errors.ts';
import { compareIP, parseCIDR, type Subnet } from '../common/ip.ts';
import type { KV } from '../store/kv.ts';
import { blockKeyCidr, corrupt, CorruptValueError, decodeBlock, decodeMeta, keysOf } from './model.ts';
import { lastSeen } from './auto-reclaim.ts';
import { allocatableCount, allocatableOrdinals, blockAddresses, blockPrefix, countBlocks, type BlockSizes } from './blocks.ts';
import { prefixOverlaps, type PoolOverlap } from './overlap.ts';
import { wantedUnallocated } from './wanted.ts';
import { validNodeName } from '../ipam/pool-config.ts';
import { rangeSetSize, rangeSetString } from '../ipam/range.ts';
import type { RangeSet } from '../ipam/types.ts';

/** One block in the report. */
export interface PoolBlockStatus {
  readonly cidr: string;
  readonly rangeSet: number;
  readonly node: string;
  readonly state: 'owned' | 'pendingRelease';
  /** Allocatable addresses of the block. */
  readonly capacity: number;
  /** Allocations of containers in it (its own node's and borrowers'); reserve entries are not counted. */
  readonly used: number;
  /** Of `used`, allocations made by other nodes (borrowed). */
  readonly borrowed: number;
  /** Reserve entries of its owner (`ipam.pool.offline`: set aside for offline ADDs; not in `used`, not free). */
  readonly reserved: number;
}

/**
 * A node's heartbeat in the report: `yes` — its heartbeat key `alive/<node>` exists (a daemon
 * renewed its lease within 30 s); `expired` — no heartbeat key, but its settings key
 * `nodes/<node>/settings` exists (an ipwarden daemon has served it: its daemon is down, or the
 * node is cut off or gone); `never` — neither: only the standalone plugin has served it, which
 * writes no heartbeat, so a live node and a dead one look the same (trial finding 1).
 */
export type PoolHeartbeat = 'yes' | 'expired' | 'never';

/** One node in the report. */
export interface PoolNodeStatus {
  readonly node: string;
  /** Blocks it owns. */
  readonly blocks: number;
  /** Allocatable addresses of its blocks. */
  readonly capacity: number;
  /** Allocations of containers it made (in its blocks and borrowed in others'); reserve entries are not counted. */
  readonly used: number;
  /** Of `used`, those in other nodes' blocks. */
  readonly borrowed: number;
  /** Its reserve entries (`ipam.pool.offline`), in its own blocks. */
  readonly reserved: number;
  /** Its heartbeat key exists (its daemon renews a lease): it may be alive. A hint, never a decision. */
  readonly alive: boolean;
  /** See {@link PoolHeartbeat} (`alive` is `heartbeat === 'yes'`). */
  readonly heartbeat: PoolHeartbeat;
  /**
   * When its daemon last recorded it alive (`seen/<node>`, written on the daemon's first beat and
   * then at most every 5 minutes: src/pool/auto-reclaim.ts), milliseconds since the epoch on the
   * node's own clock. Absent when there is no such record (only the standalone plugin served it,
   * or a daemon from before the record existed). Information only.
   */
  readonly lastSeen?: number;
  /**
   * Where the node's daemon knows the pool from, as its live heartbeat's value says (`"source"`):
   * `cni-config` (a file of its CNI configuration directory), `requests` (only the network configs
   * of requests it served: a Multus NetworkAttachmentDefinition; docs/cluster.md "Multus"), or
   * null — no live heartbeat, or one written before the field existed.
   */
  readonly source: PoolSource | null;
}

/** Where a node's daemon knows a pool from ({@link PoolNodeStatus.source}). */
export type PoolSource = 'cni-config' | 'requests';

/** The `"source"` of a heartbeat value, or null when it names none (or is not JSON): a hint, never an error. */
export function heartbeatSource(value: string): PoolSource | null {
  try {
    const o = JSON.parse(value) as { source?: unknown } | null;
    return typeof o === 'object' && o !== null && (o.source === 'cni-config' || o.source === 'requests') ? o.source : null;
  } catch {
    return null;
  }
}

/** One range set in the report. */
export interface PoolRangeSetStatus {
  readonly index: number;
  /** `start-end[,…]` as host-local prints it. */
  readonly ranges: string;
  /** Allocatable addresses (gateways excluded), decimal text (IPv6 sizes exceed 2^53). */
  readonly size: string;
  /** Allocations of containers (reserve entries not counted). */
  readonly used: number;
  /** Reserve entries (`ipam.pool.offline`). */
  readonly reserved: number;
  /**
   * Allocatable addresses of this range set's blocks whose value cannot be read (listed in
   * {@link PoolStatus.corrupt}): neither used nor free — no ADD allocates from such a block.
   */
  readonly unreadable: number;
  /**
   * Allocatable addresses of this range set's `pendingRelease` blocks that no allocation or reserve
   * entry holds: neither used nor free — no ADD allocates in such a block and no node can claim it
   * (a removal of its owner is begun; the block is given back once its last allocation goes).
   */
  readonly pendingRelease: number;
  /**
   * Addresses wanted by a live pod and held by no allocation (src/pool/wanted.ts: after an etcd
   * restore, a live pod's address the pool had given to another holder, since released): not
   * free — only that pod's node re-reserves it. Present only when > 0.
   */
  readonly wanted?: number;
  /** `size − used − reserved − unreadable − pendingRelease − wanted`, decimal text: what ADDs can still get. */
  readonly free: string;
  /** Blocks with a key (claimed by a node), those whose value cannot be read included. */
  readonly blocksClaimed: number;
}

/** A key of the pool that cannot be read (never counted, never rewritten by ipwarden: left for an operator). */
export interface PoolCorruptKey {
  /** The full etcd key. */
  readonly key: string;
  /** Why it cannot be read (`not valid JSON`, `not a block key`, `unknown field "x" (known: …)`, …). */
  readonly why: string;
}

/** The report (`--json` prints exactly this; `version` = 1). */
export interface PoolStatus {
  readonly version: 1;
  readonly pool: string;
  readonly blockSize: number;
  readonly blockSize6: number;
  readonly rangeSets: readonly PoolRangeSetStatus[];
  /** Sorted by name. */
  readonly nodes: readonly PoolNodeStatus[];
  /** Sorted by address (IPv4 before IPv6, numerically: `10.0.0.32/28` before `10.0.0.112/28`). */
  readonly blocks: readonly PoolBlockStatus[];
  /** Keys that cannot be read, sorted by key (empty when none). */
  readonly corrupt: readonly PoolCorruptKey[];
  /**
   * The pools of the same etcd prefix whose ranges overlap this one's, each pair with the one
   * created later (by its `meta`'s create revision: its ADDs are refused) and the overlapping
   * ranges (docs/cluster.md "Overlapping pools"); empty when none.
   */
  readonly overlaps: readonly PoolOverlap[];
}

/**
 * The index of the range set of `rangeSets` that block `cidr` belongs to — its prefix is the block
 * prefix of a range of that set and it holds an allocatable address of it — or -1 (a key that
 * names no block of the pool).
 */
function rangeSetOfBlock(rangeSets: readonly RangeSet[], sizes: BlockSizes, cidr: Subnet): number {
  return rangeSets.findIndex((rs) => rs.some((r) => r.subnet.ip.family === cidr.ip.family && blockPrefix(r, sizes) === cidr.prefix) && allocatableCount(rs, cidr) > 0);
}

/**
 * The heartbeat state of `node` in pool `pool` under `prefix` ({@link PoolHeartbeat}): two reads
 * (its heartbeat key, its settings key). What `pool remove-node` step 1 warns from.
 */
export async function nodeHeartbeat(kv: KV, prefix: string, pool: string, node: string): Promise<PoolHeartbeat> {
  const keys = keysOf({ prefix, pool });
  if ((await kv.get(keys.alive(node))) !== null) return 'yes';
  return (await kv.get(keys.settings(node))) !== null ? 'expired' : 'never';
}

/** Sort blocks by address: IPv4 before IPv6, then numerically (not as text). */
function byAddress(a: PoolBlockStatus, b: PoolBlockStatus): number {
  const x = parseCIDR(a.cidr);
  const y = parseCIDR(b.cidr);
  if (x === null || y === null) return a.cidr < b.cidr ? -1 : a.cidr > b.cidr ? 1 : 0;
  return compareIP(x.subnet.ip, y.subnet.ip) || x.subnet.prefix - y.subnet.prefix;
}

/**
 * The status of pool `pool` under key prefix `prefix`. Throws `IPAM_NOT_FOUND` when the pool has
 * no `meta` (never used), `STORE_CORRUPT` when `meta` cannot be read, the KV's errors otherwise.
 * Any other key that cannot be read — a block value that does not decode exactly or names a range
 * set the pool lacks, a key under `blocks/` that is not a block's, a heartbeat or settings key whose
 * node part is not a node name — is listed in `corrupt` and left out of the counts; a corrupt block
 * of a range set still counts as claimed, and its allocatable addresses as `unreadable` (not free).
 * Five reads: `meta`, the last-seen records (`seen/`), the heartbeat keys and the node index
 * (`nodes/`: affinities and settings; keys only), the blocks. Reserve entries (`"reserve": true`, docs/cluster.md "Offline allocation")
 * are counted as `reserved`, never as `used`; the unheld addresses of `pendingRelease` blocks as
 * `pendingRelease` (no ADD can use them); `free` is what is none of these.
 */
export async function poolStatus(kv: KV, prefix: string, pool: string): Promise<PoolStatus> {
  const keys = keysOf({ prefix, pool });
  const metaEntry = await kv.get(keys.meta);
  if (metaEntry === null) throw new AppError('IPAM_NOT_FOUND', `pool ${pool} has no data in ${kv.description} under ${prefix} (no ${keys.meta} key: never used)`);
  const meta = decodeMeta(metaEntry);
  const sizes: BlockSizes = { blockSize4: meta.blockSize, blockSize6: meta.blockSize6 };
  const blocks: PoolBlockStatus[] = [];
  const bad: PoolCorruptKey[] = [];
  const nodes = new Map<string, { blocks: number; capacity: number; used: number; borrowed: number; reserved: number }>();
  const node = (n: string) => {
    let x = nodes.get(n);
    if (x === undefined) nodes.set(n, (x = { blocks: 0, capacity: 0, used: 0, borrowed: 0, reserved: 0 }));
    return x;
  };
  const alive = new Set<string>();
  const seen = await lastSeen(kv, prefix, pool);
  const sources = new Map<string, PoolSource>();
  for (const e of await kv.list(keys.alivePrefix)) {
    const n = e.key.slice(keys.alivePrefix.length);
    // A heartbeat key names a node (the daemon writes only valid names): anything else is corrupt.
    if (!validNodeName(n)) {
      bad.push({ key: e.key, why: 'not the heartbeat key of a node name' });
      continue;
    }
    alive.add(n);
    const src = heartbeatSource(e.value);
    if (src !== null) sources.set(n, src);
    node(n);
  }
  // A settings key: an ipwarden daemon has served the node (its announce writes it).
  const served = new Set<string>();
  for (const e of await kv.list(keys.nodesPrefix, { keysOnly: true })) {
    const n = keys.settingsNode(e.key);
    if (n === null) continue;
    if (!validNodeName(n)) {
      bad.push({ key: e.key, why: 'not the settings key of a node name' });
      continue;
    }
    served.add(n);
    node(n);
  }
  const usedPerSet = meta.rangeSets.map(() => 0);
  const reservedPerSet = meta.rangeSets.map(() => 0);
  const unreadablePerSet = meta.rangeSets.map(() => 0);
  const claimedPerSet = meta.rangeSets.map(() => 0);
  const pendingPerSet = meta.rangeSets.map(() => 0);
  const wantedPerSet = meta.rangeSets.map(() => 0);
  for (const e of await kv.list(keys.blocksPrefix)) {
    const key = e.key.slice(keys.blocksPrefix.length);
    const cidrText = blockKeyCidr(key);
    const cidr = cidrText === null ? null : (parseCIDR(cidrText) as NonNullable<ReturnType<typeof parseCIDR>>).subnet;
    let b: ReturnType<typeof decodeBlock>;
    try {
      if (cidrText === null || cidr === null) throw corrupt(e.key, 'not a block key');
      b = decodeBlock(e, cidrText);
      if (meta.rangeSets[b.rangeSet] === undefined) throw corrupt(e.key, `"rangeSet" ${b.rangeSet} is not a range set of the pool`);
    } catch (err) {
      if (!(err instanceof CorruptValueError)) throw err;
      bad.push({ key: err.key, why: err.why });
      // A block of the pool whose value cannot be read: claimed (no ADD claims it), its addresses unreadable.
      const s = cidr === null ? -1 : rangeSetOfBlock(meta.rangeSets, sizes, cidr);
      if (s >= 0 && cidr !== null) {
        unreadablePerSet[s] = (unreadablePerSet[s] as number) + allocatableOrdinals(meta.rangeSets[s] as RangeSet, cidr).length;
        claimedPerSet[s] = (claimedPerSet[s] as number) + 1;
      }
      continue;
    }
    const rs = meta.rangeSets[b.rangeSet] as RangeSet;
    const subnet = cidr as Subnet;
    const capacity = Math.min(allocatableOrdinals(rs, subnet).length, Number(blockAddresses(subnet.ip.family, subnet.prefix)));
    const all = Object.values(b.allocs);
    const allocs = all.filter((a) => a.reserve !== true);
    const reserved = all.length - allocs.length;
    const borrowed = allocs.filter((a) => a.node !== b.node).length;
    blocks.push({ cidr: cidrText as string, rangeSet: b.rangeSet, node: b.node, state: b.state, capacity, used: allocs.length, borrowed, reserved });
    const owner = node(b.node);
    owner.blocks++;
    owner.capacity += capacity;
    // A reserve entry is always its block owner's (decodeBlock checks it).
    owner.reserved += reserved;
    for (const a of allocs) {
      const who = node(a.node);
      who.used++;
      if (a.node !== b.node) who.borrowed++;
    }
    usedPerSet[b.rangeSet] = (usedPerSet[b.rangeSet] as number) + allocs.length;
    reservedPerSet[b.rangeSet] = (reservedPerSet[b.rangeSet] as number) + reserved;
    const wanted = wantedUnallocated(b);
    wantedPerSet[b.rangeSet] = (wantedPerSet[b.rangeSet] as number) + wanted;
    if (b.state === 'pendingRelease') pendingPerSet[b.rangeSet] = (pendingPerSet[b.rangeSet] as number) + Math.max(0, capacity - all.length - wanted);
    claimedPerSet[b.rangeSet] = (claimedPerSet[b.rangeSet] as number) + 1;
  }
  return {
    version: 1,
    pool,
    blockSize: meta.blockSize,
    blockSize6: meta.blockSize6,
    rangeSets: meta.rangeSets.map((rs, i) => {
      const size = rangeSetSize(rs);
      const used = usedPerSet[i] as number;
      const reserved = reservedPerSet[i] as number;
      const unreadable = unreadablePerSet[i] as number;
      const pendingRelease = pendingPerSet[i] as number;
      const wanted = wantedPerSet[i] as number;
      return { index: i, ranges: rangeSetString(rs), size: String(size), used, reserved, unreadable, pendingRelease, ...(wanted > 0 ? { wanted } : {}), free: String(size - BigInt(used) - BigInt(reserved) - BigInt(unreadable) - BigInt(pendingRelease) - BigInt(wanted)), blocksClaimed: claimedPerSet[i] as number };
    }),
    nodes: [...nodes]
      .sort((a, b) => (a[0] < b[0] ? -1 : 1))
      .map(([n, x]) => ({ node: n, ...x, alive: alive.has(n), heartbeat: alive.has(n) ? ('yes' as const) : served.has(n) ? ('expired' as const) : ('never' as const), source: sources.get(n) ?? null, ...(seen.has(n) ? { lastSeen: seen.get(n) as number } : {}) })),
    blocks: blocks.sort(byAddress),
    corrupt: bad.sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0)),
    overlaps: await prefixOverlaps(kv, prefix, pool),
  };
}

/** What one node's daemon exports about a pool ({@link poolNodeSample}). */
export interface PoolNodeSample {
  /** Blocks the node owns. */
  readonly blocks: number;
  /** Addresses the node's containers hold in its own blocks (reserve entries and borrowers not counted). */
  readonly held: number;
  /** Blocks claimed in the whole pool, by any node. */
  readonly claimedBlocks: number;
  /** Blocks of the pool no node has claimed (0: a node whose blocks are full can only borrow). */
  readonly unclaimedBlocks: number;
  /** The node's heartbeat key exists. */
  readonly alive: boolean;
  /**
   * The node's blocks (its affinity keys) whose block value, or affinity key name, cannot be read:
   * not in `blocks` or `held`; no ADD allocates from them (left for an operator).
   */
  readonly corruptBlocks: number;
  /**
   * Per range set of the pool (index = the range set's index in `meta`): the addresses this node
   * can still get without borrowing — the allocatable addresses of the blocks no node has claimed
   * (range-set size less the allocatable addresses of every block key; the same on every node),
   * plus the free addresses of the node's own readable `owned` blocks (allocatable addresses less
   * every entry: its own allocations, borrowers', reserve entries). Not counted: free addresses in
   * other nodes' blocks (the node borrows those once no block is unclaimed; `poolStatus` counts
   * them), in its `pendingRelease` blocks and in blocks that cannot be read. A claim moves
   * addresses from the first part to the second and leaves the sum unchanged. A number (an IPv6
   * range set's size may exceed 2^53: then approximate).
   */
  readonly freeAddresses: readonly number[];
  /**
   * Blocks in state `pendingRelease` (`pool remove-node` step 1 marked them; docs/cluster.md)
   * among the blocks of the nodes that have a removal marker `removing/<node>` and this node's
   * own: 0 when no removal is under way. A removal that is never finished keeps it above 0.
   */
  readonly pendingReleaseBlocks: number;
}

/**
 * The gauges of one node for its daemon's metrics, read cheaply — not {@link poolStatus}, which
 * reads every block value of the pool (a full /16 in /26 blocks is ≈ 9 MB; on every node at every
 * scrape that loads etcd with the cluster's size squared: review B5). Reads: `meta`, the node's
 * heartbeat key, its affinity keys and its own blocks' values, and the pool's block keys
 * (keys only, ≈ 60 bytes each); for `pendingReleaseBlocks` also the removal markers (keys only)
 * and, only for nodes that have one, their affinity keys and blocks' values (a removal is rare and
 * touches one node). How many addresses the node borrows, and the pool's free addresses in other
 * nodes' blocks, need every block: `ipwarden pool status` shows them.
 * A block of the node (or an affinity key) that cannot be read is counted in `corruptBlocks`, not
 * thrown: one corrupt key must not take every gauge of the pool away.
 * @throws AppError IPAM_NOT_FOUND when the pool has no `meta`; STORE_CORRUPT when `meta` cannot be
 *   read; the KV's errors (STORE_UNAVAILABLE, CNI 11).
 */
export async function poolNodeSample(kv: KV, prefix: string, pool: string, node: string): Promise<PoolNodeSample> {
  const keys = keysOf({ prefix, pool });
  const metaEntry = await kv.get(keys.meta);
  if (metaEntry === null) throw new AppError('IPAM_NOT_FOUND', `pool ${pool} has no data in ${kv.description} under ${prefix} (no ${keys.meta} key: never used)`);
  const meta = decodeMeta(metaEntry);
  const sizes = { blockSize4: meta.blockSize, blockSize6: meta.blockSize6 };
  const total = meta.rangeSets.reduce((a, rs) => a + countBlocks(rs, sizes), 0n);
  const blockKeys = await kv.list(keys.blocksPrefix, { keysOnly: true });
  const claimedBlocks = blockKeys.length;
  // Allocatable addresses of the claimed blocks per range set, from the keys alone (a key that
  // names no block of the pool holds none).
  const claimedAddresses = meta.rangeSets.map(() => 0n);
  for (const e of blockKeys) {
    const cidrText = blockKeyCidr(e.key.slice(keys.blocksPrefix.length));
    const cidr = cidrText === null ? null : (parseCIDR(cidrText)?.subnet ?? null);
    if (cidr === null) continue;
    const s = rangeSetOfBlock(meta.rangeSets, sizes, cidr);
    if (s >= 0) claimedAddresses[s] = (claimedAddresses[s] as bigint) + BigInt(allocatableCount(meta.rangeSets[s] as RangeSet, cidr));
  }
  const ownFree = meta.rangeSets.map(() => 0);
  let pendingReleaseBlocks = 0;
  const alive = (await kv.get(keys.alive(node))) !== null;
  const affPrefix = keys.affinityPrefix(node);
  let blocks = 0;
  let held = 0;
  let corruptBlocks = 0;
  for (const a of await kv.list(affPrefix, { keysOnly: true })) {
    const key = a.key.slice(affPrefix.length);
    const cidrText = blockKeyCidr(key);
    if (cidrText === null) {
      corruptBlocks++; // not the affinity key of a block
      continue;
    }
    const e = await kv.get(keys.block(key));
    if (e === null) continue; // given back between the two reads
    let b: ReturnType<typeof decodeBlock>;
    try {
      b = decodeBlock(e, cidrText);
      if (meta.rangeSets[b.rangeSet] === undefined) throw corrupt(e.key, `"rangeSet" ${b.rangeSet} is not a range set of the pool`);
    } catch (err) {
      if (!(err instanceof CorruptValueError)) throw err;
      corruptBlocks++;
      continue;
    }
    if (b.node !== node) continue;
    blocks++;
    held += Object.values(b.allocs).filter((x) => x.reserve !== true && x.node === node).length;
    if (b.state === 'pendingRelease') {
      pendingReleaseBlocks++;
      continue; // no ADD allocates in it: nothing free
    }
    const subnet = (parseCIDR(cidrText) as NonNullable<ReturnType<typeof parseCIDR>>).subnet;
    const free = allocatableCount(meta.rangeSets[b.rangeSet] as RangeSet, subnet) - Object.keys(b.allocs).length - wantedUnallocated(b);
    ownFree[b.rangeSet] = (ownFree[b.rangeSet] as number) + Math.max(0, free);
  }
  // Blocks other nodes' removals marked pendingRelease: only nodes with a removal marker are read.
  for (const m of await kv.list(keys.removingPrefix, { keysOnly: true })) {
    const other = m.key.slice(keys.removingPrefix.length);
    if (other === node || !validNodeName(other)) continue;
    const otherAff = keys.affinityPrefix(other);
    for (const a of await kv.list(otherAff, { keysOnly: true })) {
      const key = a.key.slice(otherAff.length);
      const cidrText = blockKeyCidr(key);
      const e = cidrText === null ? null : await kv.get(keys.block(key));
      if (e === null) continue;
      try {
        const b = decodeBlock(e, cidrText as string);
        if (b.node === other && b.state === 'pendingRelease') pendingReleaseBlocks++;
      } catch (err) {
        if (!(err instanceof CorruptValueError)) throw err; // a block that cannot be read is not counted as marked
      }
    }
  }
  const unclaimed = total - BigInt(claimedBlocks);
  const freeAddresses = meta.rangeSets.map((rs, i) => {
    const left = rangeSetSize(rs) - (claimedAddresses[i] as bigint);
    return Number(left < 0n ? 0n : left) + (ownFree[i] as number);
  });
  return { blocks, held, claimedBlocks, unclaimedBlocks: Number(unclaimed < 0n ? 0n : unclaimed), alive, corruptBlocks, freeAddresses, pendingReleaseBlocks };
}
