/**
 * The status model of a cluster pool (`ipwarden pool status`, docs/cluster.md "pool status"):
 * from one read of the pool's `meta` and one of its blocks (both at current revisions), the
 * blocks per node, usage and free addresses cluster-wide. Logic over a {@link KV}, no I/O of its
 * own; malformed values throw `STORE_CORRUPT` as the allocator's reads do.
 */
import { AppError } from '../common/errors.ts';
import { parseCIDR, parseIP } from '../common/ip.ts';
import type { KV, KVEntry } from '../store/kv.ts';
import { blockKeyCidr, decodeBlock, POOL_VALUE_VERSION } from './pool-allocator.ts';
import { allocatableOrdinals, blockAddresses } from './pool-blocks.ts';
import { validNodeName } from './pool-config.ts';
import { canonicalizeRangeSet, rangeSetSize, rangeSetString } from './range.ts';
import type { RangeSet } from './types.ts';

/** One block in the report. */
export interface PoolBlockStatus {
  readonly cidr: string;
  readonly rangeSet: number;
  readonly node: string;
  readonly state: 'owned' | 'pendingRelease';
  /** Allocatable addresses of the block. */
  readonly capacity: number;
  /** Allocations in it (its own node's and borrowers'). */
  readonly used: number;
  /** Of `used`, allocations made by other nodes (borrowed). */
  readonly borrowed: number;
}

/** One node in the report. */
export interface PoolNodeStatus {
  readonly node: string;
  /** Blocks it owns. */
  readonly blocks: number;
  /** Allocatable addresses of its blocks. */
  readonly capacity: number;
  /** Allocations it made (in its blocks and borrowed in others'). */
  readonly used: number;
  /** Of `used`, those in other nodes' blocks. */
  readonly borrowed: number;
  /** Its heartbeat key exists (its daemon renews a lease): it may be alive. A hint, never a decision. */
  readonly alive: boolean;
}

/** One range set in the report. */
export interface PoolRangeSetStatus {
  readonly index: number;
  /** `start-end[,…]` as host-local prints it. */
  readonly ranges: string;
  /** Allocatable addresses (gateways excluded), decimal text (IPv6 sizes exceed 2^53). */
  readonly size: string;
  readonly used: number;
  /** `size − used`, decimal text. */
  readonly free: string;
  readonly blocksClaimed: number;
}

/** The report (`--json` prints exactly this; `version` = 1). */
export interface PoolStatus {
  readonly version: 1;
  readonly pool: string;
  readonly blockSize: number;
  readonly blockSize6: number;
  readonly rangeSets: readonly PoolRangeSetStatus[];
  readonly nodes: readonly PoolNodeStatus[];
  readonly blocks: readonly PoolBlockStatus[];
}

function corrupt(key: string, why: string): AppError {
  return new AppError('STORE_CORRUPT', `etcd key ${key}: ${why}`);
}

/** The range sets and block sizes stored in `meta`. Throws STORE_CORRUPT naming the key. */
export function decodeMeta(e: KVEntry): { rangeSets: RangeSet[]; blockSize: number; blockSize6: number } {
  let o: unknown;
  try {
    o = JSON.parse(e.value);
  } catch {
    throw corrupt(e.key, 'not valid JSON');
  }
  const m = o as { v?: unknown; rangeSets?: unknown; blockSize?: unknown; blockSize6?: unknown } | null;
  if (typeof m !== 'object' || m === null || m.v !== POOL_VALUE_VERSION) throw corrupt(e.key, `not a version ${POOL_VALUE_VERSION} pool meta`);
  if (!Array.isArray(m.rangeSets) || typeof m.blockSize !== 'number' || typeof m.blockSize6 !== 'number') throw corrupt(e.key, '"rangeSets", "blockSize" and "blockSize6" are required');
  const rangeSets = m.rangeSets.map((rs: unknown, i: number) => {
    if (!Array.isArray(rs)) throw corrupt(e.key, `rangeSets[${i}] must be an array`);
    try {
      return canonicalizeRangeSet(
        rs.map((r: { subnet?: unknown; rangeStart?: unknown; rangeEnd?: unknown; gateway?: unknown }) => ({
          subnet: typeof r.subnet === 'string' ? parseCIDR(r.subnet) : null,
          rangeStart: typeof r.rangeStart === 'string' ? parseIP(r.rangeStart) : null,
          rangeEnd: typeof r.rangeEnd === 'string' ? parseIP(r.rangeEnd) : null,
          gateway: typeof r.gateway === 'string' ? parseIP(r.gateway) : null,
        })),
      );
    } catch (err) {
      throw corrupt(e.key, `rangeSets[${i}]: ${err instanceof Error ? err.message : String(err)}`);
    }
  });
  return { rangeSets, blockSize: m.blockSize, blockSize6: m.blockSize6 };
}

/**
 * The status of pool `pool` under key prefix `prefix`. Throws `IPAM_NOT_FOUND` when the pool has
 * no `meta` (never used), `STORE_CORRUPT` for a bad value (a block, `meta`, or a heartbeat key
 * whose node part is not a node name), the KV's errors otherwise. Three reads: `meta`, the
 * heartbeat keys (keys only), the blocks.
 */
export async function poolStatus(kv: KV, prefix: string, pool: string): Promise<PoolStatus> {
  const base = `${prefix}/pools/${pool}`;
  const metaEntry = await kv.get(`${base}/meta`);
  if (metaEntry === null) throw new AppError('IPAM_NOT_FOUND', `pool ${pool} has no data in ${kv.description} under ${prefix} (no ${base}/meta key: never used)`);
  const meta = decodeMeta(metaEntry);
  const blocks: PoolBlockStatus[] = [];
  const nodes = new Map<string, { blocks: number; capacity: number; used: number; borrowed: number }>();
  const node = (n: string) => {
    let x = nodes.get(n);
    if (x === undefined) nodes.set(n, (x = { blocks: 0, capacity: 0, used: 0, borrowed: 0 }));
    return x;
  };
  const alive = new Set<string>();
  for (const e of await kv.list(`${base}/alive/`, { keysOnly: true })) {
    const n = e.key.slice(`${base}/alive/`.length);
    // A heartbeat key names a node (the daemon writes only valid names): anything else is corrupt.
    if (!validNodeName(n)) throw corrupt(e.key, 'not the heartbeat key of a node name');
    alive.add(n);
    node(n);
  }
  const usedPerSet = meta.rangeSets.map(() => 0);
  const claimedPerSet = meta.rangeSets.map(() => 0);
  for (const e of await kv.list(`${base}/blocks/`)) {
    const key = e.key.slice(`${base}/blocks/`.length);
    const cidrText = blockKeyCidr(key);
    if (cidrText === null) throw corrupt(e.key, 'not a block key');
    const b = decodeBlock(e, cidrText);
    const rs = meta.rangeSets[b.rangeSet];
    if (rs === undefined) throw corrupt(e.key, `"rangeSet" ${b.rangeSet} is not a range set of the pool`);
    const cidr = (parseCIDR(cidrText) as NonNullable<ReturnType<typeof parseCIDR>>).subnet;
    const capacity = Math.min(allocatableOrdinals(rs, cidr).length, Number(blockAddresses(cidr.ip.family, cidr.prefix)));
    const allocs = Object.values(b.allocs);
    const borrowed = allocs.filter((a) => a.node !== b.node).length;
    blocks.push({ cidr: cidrText, rangeSet: b.rangeSet, node: b.node, state: b.state, capacity, used: allocs.length, borrowed });
    const owner = node(b.node);
    owner.blocks++;
    owner.capacity += capacity;
    for (const a of allocs) {
      const who = node(a.node);
      who.used++;
      if (a.node !== b.node) who.borrowed++;
    }
    usedPerSet[b.rangeSet] = (usedPerSet[b.rangeSet] as number) + allocs.length;
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
      return { index: i, ranges: rangeSetString(rs), size: String(size), used, free: String(size - BigInt(used)), blocksClaimed: claimedPerSet[i] as number };
    }),
    nodes: [...nodes].sort((a, b) => (a[0] < b[0] ? -1 : 1)).map(([n, x]) => ({ node: n, ...x, alive: alive.has(n) })),
    blocks,
  };
}
