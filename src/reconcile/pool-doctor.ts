/**
 * `doctor`'s checks of the cluster pools the node uses — those its CNI configuration names and
 * those its daemon learned from the requests it served (Multus NetworkAttachmentDefinitions:
 * the records of src/pool/learned.ts) — (docs/cluster.md "Overlapping pools"; the finding table
 * is in docs/cli.md):
 *
 * - `pool-overlaps-node-local` (warning): a range of a pool network overlaps a range of a
 *   node-local network (host-local style: no `ipam.pool`) of the same node — the two allocate on
 *   their own, so both can hand out one address; read from the configuration only.
 * - `pool-overlaps-other-prefix` (warning): ranges of two pool networks of the node overlap, and
 *   their pools are in different etcd prefixes — pools that are never compared with each other
 *   (the same pool name under another prefix is another pool: a fresh-user trial got one address
 *   twice that way); read from the configuration and the records only.
 * - `pool-overlap` (error): a pool the node uses overlaps another pool of its etcd prefix (one
 *   read of every pool's `meta` of the prefix): the pool created later has its ADDs refused.
 * - `pool-unreachable` (warning): the overlaps of a pool could not be checked (etcd did not
 *   answer, a value it cannot read).
 */
import { AppError } from '../common/errors.ts';
import type { PoolConfig } from '../ipam/pool-config.ts';
import { rangeSetString, rangesOverlap } from '../ipam/range.ts';
import type { RangeSet } from '../ipam/types.ts';
import { etcdFor, prefixOverlaps, rangeText, type LearnedPool, type PoolOverlap } from '../pool/index.ts';
import type { Layout, StatusReport } from './status.ts';

/** One finding of these checks (the shape of doctor's `Finding`). */
export interface PoolFinding {
  readonly id: 'pool-overlaps-node-local' | 'pool-overlaps-other-prefix' | 'pool-overlap' | 'pool-unreachable';
  readonly severity: 'error' | 'warning';
  readonly title: string;
  readonly evidence: string;
  readonly fix: string;
}

/**
 * Every overlapping pair of pools of `pool`'s etcd prefix that `pool` is in (see `prefixOverlaps`
 * of src/pool/overlap.ts). Injectable for tests; the default opens an etcd client for the pool's
 * configuration and closes it.
 */
export type PoolOverlapReader = (pool: PoolConfig) => Promise<PoolOverlap[]>;

/** The default {@link PoolOverlapReader}: the pool's own etcd client (endpoints, TLS, credentials). */
export const readPoolOverlaps: PoolOverlapReader = async (pool) => {
  const kv = etcdFor(pool);
  try {
    return await prefixOverlaps(kv, pool.etcd.prefix, pool.name);
  } finally {
    await kv.close();
  }
};

/** One pool network the checks look at: where it is configured (a CNI configuration file, or a learned record's file), its name, ranges and pool. */
interface PoolSource {
  readonly file: string;
  readonly name: string;
  readonly rangeSets: readonly RangeSet[];
  readonly pool: PoolConfig;
}

/**
 * The findings (see the module comment). Pool networks are those of `layout.poolNetworks` (the
 * configurations with `ipam.pool`, `--network` applied), then the `learned` records (`network`:
 * only that network's) of a pool no configuration of the same network names (a NetworkAttachmentDefinition's:
 * its record file is named as the source); node-local ones are `report.networks` with a configuration. One etcd read
 * per pool (pools named by several networks are asked once), in configuration order, then the records'.
 */
export async function poolFindings(layout: Layout, report: StatusReport, read: PoolOverlapReader = readPoolOverlaps, learned: readonly LearnedPool[] = [], network?: string): Promise<PoolFinding[]> {
  const out: PoolFinding[] = [];
  const named = new Set(layout.poolNetworks.map((p) => p.file));
  const key = (p: PoolConfig, net: string): string => JSON.stringify([p.etcd.endpoints, p.etcd.prefix, p.name, net]);
  const pools: PoolSource[] = [];
  for (const c of layout.configs) {
    if (!named.has(c.file) || c.name === null || c.ipam?.pool == null) continue;
    pools.push({ file: c.file, name: c.name, rangeSets: c.ipam.rangeSets, pool: c.ipam.pool });
  }
  const seen = new Set(pools.map((c) => key(c.pool, c.name)));
  for (const l of learned) {
    if ((network !== undefined && l.conf.name !== network) || seen.has(key(l.conf.pool, l.conf.name))) continue;
    seen.add(key(l.conf.pool, l.conf.name));
    pools.push({ file: l.file, name: l.conf.name, rangeSets: l.conf.rangeSets, pool: l.conf.pool });
  }
  for (const c of pools) {
    const pool = c.pool;
    for (const n of report.networks) {
      if (n.config === null) continue;
      const pairs: string[] = [];
      c.rangeSets.forEach((ps: RangeSet, i: number) => {
        for (const s of n.rangeSets) {
          for (const a of ps) for (const b of s.rangeSet) if (rangesOverlap(a, b)) pairs.push(`${c.name} range set ${i} (${rangeText(a)}) overlaps ${n.name} range set ${s.index} (${rangeText(b)})`);
        }
      });
      if (pairs.length === 0) continue;
      out.push({
        id: 'pool-overlaps-node-local',
        severity: 'warning',
        title: `node-local network ${n.name} overlaps pool ${pool.name} (network ${c.name})`,
        evidence: `${pairs.join('; ')} (${c.file}, ${n.config.file}); pool ${pool.name} hands its addresses out cluster-wide and ${n.name} hands out ${rangeSetString(n.rangeSets.map((s) => s.rangeSet).flat())} on this node on its own, so both can hand out the same address`,
        fix: `give ${n.name} a subnet outside pool ${pool.name}: change ipam.ranges in ${n.config.file}`,
      });
    }
  }
  for (let i = 0; i < pools.length; i++) {
    for (let j = i + 1; j < pools.length; j++) {
      const a = pools[i] as PoolSource;
      const b = pools[j] as PoolSource;
      if (a.pool.etcd.prefix === b.pool.etcd.prefix) continue;
      const pairs: string[] = [];
      a.rangeSets.forEach((as: RangeSet, x: number) => {
        b.rangeSets.forEach((bs: RangeSet, y: number) => {
          for (const ra of as) for (const rb of bs) if (rangesOverlap(ra, rb)) pairs.push(`${a.name} range set ${x} (${rangeText(ra)}) overlaps ${b.name} range set ${y} (${rangeText(rb)})`);
        });
      });
      if (pairs.length === 0) continue;
      const where = (c: PoolSource): string => `${c.file}: pool ${c.pool.name}, etcd ${c.pool.etcd.endpoints.join(',')} prefix ${c.pool.etcd.prefix}`;
      out.push({
        id: 'pool-overlaps-other-prefix',
        severity: 'warning',
        title: `pool ${a.pool.name} (network ${a.name}) and pool ${b.pool.name} (network ${b.name}) overlap, in different etcd prefixes`,
        evidence: `${pairs.join('; ')} (${where(a)}; ${where(b)}); pools of different prefixes are never compared, so both can hand out the same address — unless the two networks never meet (separate layer-2 segments)`,
        fix: `if the two networks share addresses, name one pool (the same ipam.pool name, etcd endpoints and prefix) in both configurations, or give one of them ranges of its own`,
      });
    }
  }
  const asked = new Set<string>();
  for (const c of pools) {
    const pool = c.pool;
    const key = JSON.stringify([pool.etcd.endpoints, pool.etcd.prefix, pool.name]);
    if (asked.has(key)) continue;
    asked.add(key);
    let overlaps: PoolOverlap[];
    try {
      overlaps = await read(pool);
    } catch (e) {
      if (!(e instanceof AppError)) throw e;
      out.push({
        id: 'pool-unreachable',
        severity: 'warning',
        title: `pool ${pool.name}: overlaps with other pools not checked`,
        evidence: `${c.file}: ${e.message}`,
        fix: `make etcd (${pool.etcd.endpoints.join(', ')}) reachable from this node, then run doctor again; ipwarden pool status --pool ${pool.name} shows the pool`,
      });
      continue;
    }
    for (const o of overlaps) {
      const ranges = o.ranges.map((r) => `${r.later} of pool ${o.later} overlaps ${r.earlier} of pool ${o.earlier}`).join('; ');
      out.push({
        id: 'pool-overlap',
        severity: 'error',
        title: `pool ${o.later} overlaps pool ${o.earlier}, created before it: its ADDs are refused`,
        evidence: `${ranges} (etcd prefix ${pool.etcd.prefix}; ${c.file} names pool ${pool.name}); two pools over one address can hand it out twice`,
        fix: `give pool ${o.later} ranges of its own (a new pool name with disjoint ranges in the networks that name it); its addresses in use are released by their pods' DELs — see docs/cluster.md "Overlapping pools"`,
      });
    }
  }
  return out;
}
