/**
 * Doctor's view of the cluster pools this node serves (docs/cli.md "ipwarden doctor";
 * docs/cluster.md "Multus"): each pool network and where the node knows it from — a file of the
 * CNI configuration directory, the daemon's record of the requests it served
 * (`<data dir>/.ipwarden-pool-networks/`, src/pool/learned.ts), or both — and each record that
 * cannot be used. Reads files only; never etcd.
 */
import type { CniNetwork } from '../node/cni-conf.ts';
import { readLearnedPools } from '../pool/index.ts';

/** A finding of this module (the shape of src/reconcile/doctor.ts `Finding`, ids of its own). */
export interface PoolFinding {
  readonly id: 'pool-network-record-unreadable' | 'pool-networks';
  readonly severity: 'warning' | 'info';
  readonly title: string;
  readonly evidence: string;
  readonly fix: string;
}

/**
 * The findings about pool networks: one warning `pool-network-record-unreadable` per record of
 * `learnedDir` that cannot be used (the daemon ignores it), then one info `pool-networks` per pool
 * network (pool, etcd endpoints and prefix, network name), sorted by pool then network, naming
 * its sources: the CNI configuration files of `configs` that define it and the record. A pool
 * network known only from requests says so in its title.
 */
export function poolNetworkFindings(configs: readonly CniNetwork[], learnedDir: string): PoolFinding[] {
  const out: PoolFinding[] = [];
  const learned = readLearnedPools(learnedDir);
  for (const u of learned.unreadable) {
    out.push({
      id: 'pool-network-record-unreadable',
      severity: 'warning',
      title: `the pool network record ${u.file} cannot be used`,
      evidence: `${u.file}: ${u.why}; the daemon ignores it (it logs "pool network record cannot be used: ignored" at start)`,
      fix: `remove ${u.file}: the daemon records the network again at its next ADD or CHECK served through it`,
    });
  }
  type Entry = { pool: string; network: string; etcd: string; files: string[]; record: { file: string; at: number } | null };
  const byKey = new Map<string, Entry>();
  const entry = (pool: string, endpoints: readonly string[], prefix: string, network: string): Entry => {
    const k = JSON.stringify([pool, network, endpoints, prefix]);
    let e = byKey.get(k);
    if (e === undefined) byKey.set(k, (e = { pool, network, etcd: `${endpoints.join(',')} prefix ${prefix}`, files: [], record: null }));
    return e;
  };
  for (const c of configs) {
    const p = c.ipam?.pool;
    if (p === null || p === undefined || c.ipam === null) continue;
    entry(p.name, p.etcd.endpoints, p.etcd.prefix, c.ipam.name).files.push(c.file);
  }
  for (const l of learned.pools) entry(l.conf.pool.name, l.conf.pool.etcd.endpoints, l.conf.pool.etcd.prefix, l.conf.name).record = { file: l.file, at: l.learnedAt };
  const sorted = [...byKey.values()].sort((a, b) => (a.pool !== b.pool ? (a.pool < b.pool ? -1 : 1) : a.network < b.network ? -1 : a.network > b.network ? 1 : 0));
  for (const e of sorted) {
    const from = [...e.files.map((f) => `the CNI configuration ${f}`), ...(e.record === null ? [] : [`the requests the daemon served (recorded in ${e.record.file} at ${new Date(e.record.at).toISOString()})`])];
    const only = e.files.length === 0;
    out.push({
      id: 'pool-networks',
      severity: 'info',
      title: `this node serves pool ${e.pool} (network ${e.network})${only ? ', known only from requests' : ''}`,
      evidence: `etcd ${e.etcd}; known from ${from.join(' and ')}; the daemon heartbeats in the pool and releases this node's leaked addresses of it`,
      fix: only
        ? `nothing to do while the node uses the network; once no pod of the node uses it (ipwarden pool leaks --pool ${e.pool} …), remove ${e.record?.file ?? '?'} and restart the daemon to stop caring for it`
        : 'nothing to do',
    });
  }
  return out;
}
