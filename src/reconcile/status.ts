/**
 * The status model below `ipwarden status`, `ipwarden doctor` and the daemon's `/status` and
 * `/status.json` (src/daemon/status-pages.ts): a node's addresses per network and range set — capacity, reserved, the
 * reconciler's verdicts (live, in grace, leaked, corrupt), free — as values and as the documented
 * JSON document (docs/cli.md). Rendering (table, HTML) is the CLI's (`src/cli/status.ts`,
 * `src/cli/html.ts`), which imports the types from here.
 *
 * Networks come from two places: the CNI configuration directory (every network whose IPAM is
 * `host-local` or `ipwarden`, see `src/node/cni-conf.ts`, with its range sets and `dataDir`) and
 * the data directories (every network directory, also those no configuration names any more,
 * shown without range information). `dataDir` replaces every configuration's `dataDir`.
 *
 * The verdicts come from the reconcile engine (`src/reconcile/engine.ts`): ONE runtime snapshot
 * (`takeSnapshot`) for the whole report, then each data directory's networks read under their
 * locks and planned (`planNetworks`). When the runtime cannot be asked, live/grace/leaked are
 * unknown; corrupt needs no runtime and is always counted.
 *
 * free = capacity − reserved, where reserved counts every reservation file inside the range set,
 * corrupt ones included (they hold the address until `gc` removes them).
 */
import { statSync } from 'node:fs';
import { join } from 'node:path';
import { AppError, UsageError } from '../common/errors.ts';
import { formatIP, formatSubnet, parseIP } from '../common/ip.ts';
import { DEFAULT_CNI_CONF_DIR, DEFAULT_DATA_DIR } from '../common/names.ts';
import { rangeFor, rangeSetSize, rangeSetString } from '../ipam/range.ts';
import type { RangeSet } from '../ipam/types.ts';
import { readCniConfigs, type CniNetwork } from '../node/cni-conf.ts';
import { kernelJson, planNetworks, type KernelJson } from './engine.ts';
import type { UseEvidence } from './evidence.ts';
import { discoverNetworks, namedNetwork, NETWORK_NAME_RE, type NetworkDir } from './networks.ts';
import { describeError, type ReconcileDeps } from './options.ts';
import type { PlanEntry } from './plan.ts';
import { takeSnapshot, type RuntimeJson, type Snapshot } from './snapshot.ts';

export { DEFAULT_CNI_CONF_DIR };

/** What a status report covers (parsed options of `status` and `doctor`). */
export interface StatusQuery {
  /** CNI configuration directory (default `/etc/cni/net.d`; empty is a `UsageError`). */
  readonly cniConfDir?: string;
  /** Data directory for every network (default: each configuration's `ipam.dataDir`). */
  readonly dataDir?: string;
  /** Only this network. */
  readonly network?: string;
  /** As in `SnapshotOptions.runtimeEndpoint`. */
  readonly runtimeEndpoint?: string;
  /** Grace period, seconds (≥ 0). */
  readonly graceSeconds: number;
}

/** One network to report: where its reservations live and the configuration naming it, if any. */
export interface NetworkLayout {
  readonly name: string;
  /** The data directory (`--data-dir`, else the configuration's `ipam.dataDir`). */
  readonly dataDir: string;
  /** `<dataDir>/<name>`. */
  readonly dir: string;
  /** The configuration (host-local compatible IPAM) naming this network; null for a directory only. */
  readonly config: CniNetwork | null;
}

/** Where `status` and `doctor` look, before any reservation is read. */
export interface Layout {
  readonly cniConfDir: string;
  /** Every file of the configuration directory, parsed (also non host-local ones and broken ones). */
  readonly configs: readonly CniNetwork[];
  /** Data directories searched, sorted. */
  readonly dataDirs: readonly string[];
  /** Networks sorted by name, then data directory. */
  readonly networks: readonly NetworkLayout[];
  /** Problems with configuration files: unreadable, invalid IPAM section, duplicate network name. */
  readonly configErrors: ReadonlyArray<{ file: string; error: string }>;
  /**
   * Networks whose `ipam` has a `pool` (docs/cluster.md): their addresses are in etcd, not in the
   * data directory, so they are not in `networks` — counting their empty node-local directory
   * would show the whole range free (trial finding 9). `ipwarden pool status` shows them.
   */
  readonly poolNetworks: ReadonlyArray<{ file: string; name: string; pool: string }>;
}

/** Counts of reservations by verdict (`unknown` only when the runtime could not be asked). */
export interface VerdictCounts {
  reserved: number;
  live: number;
  grace: number;
  leaked: number;
  corrupt: number;
  unknown: number;
}

/** One range set of a configured network. */
export interface RangeSetStatus {
  /** Index in the configuration (host-local order; `last_reserved_ip.<index>`). */
  readonly index: number;
  readonly rangeSet: RangeSet;
  /** `rangeSetString` (host-local's error text form: `start-end[,start-end…]`). */
  readonly range: string;
  /** Allocatable addresses (`rangeSetSize`: gateways inside a range excluded). */
  readonly capacity: bigint;
  readonly counts: VerdictCounts;
  /** capacity − reserved, never below 0. */
  readonly free: bigint;
  /** The reservations inside this range set, sorted by IP. */
  readonly entries: readonly PlanEntry[];
}

/** One network of the report. */
export interface NetworkStatus extends NetworkLayout {
  /** Does `<dataDir>/<name>` exist? */
  readonly dirExists: boolean;
  /** Range sets of the configuration ([] without one). */
  readonly rangeSets: readonly RangeSetStatus[];
  /**
   * Reservations in no range set (all of them without a configuration; after a range change, or
   * a file on a gateway address).
   */
  readonly outside: { readonly counts: VerdictCounts; readonly entries: readonly PlanEntry[] };
  /** Every reservation of the network. */
  readonly total: VerdictCounts;
  /** Why the reservations were not read (doctor skips a network whose lock is held); else null. */
  readonly skipped: string | null;
}

/** What `status` found. */
export interface StatusReport {
  readonly runtime: RuntimeJson;
  /** True when the runtime was asked successfully (live/grace/leaked are known). */
  readonly verdicts: boolean;
  readonly graceSeconds: number;
  readonly snapshotAtMs: number;
  readonly layout: Layout;
  readonly networks: readonly NetworkStatus[];
  /** The kernel evidence of the first run (addresses configured in the node's network namespaces). */
  readonly evidence: UseEvidence;
}


/**
 * Find the networks: read the configuration directory, decide the data directories
 * (`opts.dataDir` (`--data-dir`), else the `dataDir` of every host-local compatible configuration, else — no such
 * configuration — host-local's default `/var/lib/cni/networks`) and list their network
 * directories. Reads no reservation and takes no lock.
 * A network name defined by two files: the first file (by name) wins, the other gets a
 * `configErrors` entry. With `network`, only that network (throws `UsageError` for an invalid
 * name, `AppError('IPAM_NOT_FOUND')` when neither a configuration nor a directory has it).
 * Throws `UsageError` for an empty `--cni-conf-dir`/`--data-dir`, and the `fs` error when the
 * configuration directory exists but cannot be listed.
 */
export function layoutNetworks(opts: Pick<StatusQuery, 'cniConfDir' | 'dataDir' | 'network'>): Layout {
  const cniConfDir = opts.cniConfDir ?? DEFAULT_CNI_CONF_DIR;
  if (cniConfDir === '') throw new UsageError('--cni-conf-dir must not be empty');
  if (opts.dataDir === '') throw new UsageError('--data-dir must not be empty');
  if (opts.network !== undefined && !NETWORK_NAME_RE.test(opts.network)) {
    throw new UsageError(`invalid network name ${JSON.stringify(opts.network)}`);
  }
  const configs = readCniConfigs(cniConfDir);
  const configErrors: Array<{ file: string; error: string }> = [];
  const poolNetworks: Array<{ file: string; name: string; pool: string }> = [];
  const byKey = new Map<string, NetworkLayout>();
  const key = (dataDir: string, name: string): string => `${dataDir}\0${name}`;
  const dataDirs = new Set<string>(opts.dataDir !== undefined ? [opts.dataDir] : []);

  for (const c of configs) {
    if (c.error !== null) configErrors.push({ file: c.file, error: c.error });
    if (c.ipam === null || c.name === null) continue;
    if (c.ipam.pool !== undefined && c.ipam.pool !== null) {
      if (opts.network === undefined || opts.network === c.name) poolNetworks.push({ file: c.file, name: c.name, pool: c.ipam.pool.name });
      continue;
    }
    const dataDir = opts.dataDir ?? c.ipam.dataDir;
    const k = key(dataDir, c.name);
    const first = byKey.get(k);
    if (first !== undefined) {
      configErrors.push({ file: c.file, error: `network ${JSON.stringify(c.name)} is already defined in ${first.config?.file ?? '?'}; ignored` });
      continue;
    }
    dataDirs.add(dataDir);
    byKey.set(k, { name: c.name, dataDir, dir: join(dataDir, c.name), config: c });
  }
  // No --data-dir and no configuration naming one: host-local's default.
  if (dataDirs.size === 0) dataDirs.add(DEFAULT_DATA_DIR);
  for (const dataDir of dataDirs) {
    for (const n of discoverNetworks(dataDir)) {
      const k = key(dataDir, n.name);
      if (!byKey.has(k)) byKey.set(k, { name: n.name, dataDir, dir: n.dir, config: null });
    }
  }
  let networks = [...byKey.values()].sort((a, b) =>
    a.name !== b.name ? (a.name < b.name ? -1 : 1) : a.dataDir < b.dataDir ? -1 : a.dataDir > b.dataDir ? 1 : 0,
  );
  if (opts.network !== undefined) {
    networks = networks.filter((n) => n.name === opts.network);
    if (networks.length === 0 && poolNetworks.length === 0) {
      throw new AppError(
        'IPAM_NOT_FOUND',
        `no network ${opts.network}: no configuration in ${cniConfDir} and no directory in ${[...dataDirs].sort().join(', ')}`,
      );
    }
  }
  return { cniConfDir, configs, dataDirs: [...dataDirs].sort(), networks, configErrors, poolNetworks };
}

/** Where `leaks` and `gc` look ({@link reconcileScope}). */
export interface ReconcileScope {
  /** Data directories to read, sorted; never empty. */
  readonly dataDirs: readonly string[];
  /** Diagnostics for stderr, one line each without the `ipwarden: ` prefix. */
  readonly warnings: readonly string[];
}

/**
 * The data directories `leaks` and `gc` read: the ones `status` reads ({@link layoutNetworks}):
 * `dataDir` (`--data-dir`) when given, else the `dataDir` of every host-local/ipwarden
 * configuration of `cniConfDir`, else `/var/lib/cni/networks`. Warnings: each configuration that
 * cannot be used (`config FILE: why`); with `dataDir`, the data directories the configurations
 * name that it replaces (not read), with their networks; a configuration directory that cannot be
 * listed (then `dataDir`, or the default, alone). Throws `UsageError` for an empty `dataDir` or
 * `cniConfDir`.
 */
export function reconcileScope(opts: { readonly dataDir?: string; readonly cniConfDir: string }): ReconcileScope {
  let layout: Layout;
  try {
    layout = layoutNetworks({ cniConfDir: opts.cniConfDir, ...(opts.dataDir === undefined ? {} : { dataDir: opts.dataDir }) });
  } catch (e) {
    if (e instanceof UsageError) throw e;
    const only = opts.dataDir ?? DEFAULT_DATA_DIR;
    return { dataDirs: [only], warnings: [`cannot read the CNI configuration directory ${opts.cniConfDir}: ${describeError(e)}; only the data directory ${only} is read`] };
  }
  const warnings = layout.configErrors.map((e) => `config ${e.file}: ${e.error}`);
  if (opts.dataDir !== undefined) {
    const replaced = new Map<string, Set<string>>();
    for (const c of layout.configs) {
      if (c.ipam === null || c.name === null || (c.ipam.pool !== undefined && c.ipam.pool !== null) || c.ipam.dataDir === opts.dataDir) continue;
      const names = replaced.get(c.ipam.dataDir) ?? new Set<string>();
      replaced.set(c.ipam.dataDir, names.add(c.name));
    }
    if (replaced.size > 0) {
      const list = [...replaced].sort((a, b) => (a[0] < b[0] ? -1 : 1)).map(([d, names]) => `${d} (${[...names].sort().join(', ')})`);
      warnings.push(`--data-dir ${opts.dataDir} replaces the data directories the configurations in ${opts.cniConfDir} name; not read: ${list.join(', ')}`);
    }
  }
  return { dataDirs: layout.dataDirs, warnings };
}

function emptyCounts(): VerdictCounts {
  return { reserved: 0, live: 0, grace: 0, leaked: 0, corrupt: 0, unknown: 0 };
}

function count(entries: readonly PlanEntry[]): VerdictCounts {
  const c = emptyCounts();
  for (const e of entries) {
    c.reserved++;
    // A reservation the kernel says is in use counts as live (docs/cli.md "status").
    c[e.verdict === 'inuse' ? 'live' : e.verdict]++;
  }
  return c;
}

/**
 * Split a network's reservations over its range sets (pure). An entry belongs to the first range
 * set with a range containing its IP, unless the IP is that range's gateway (never allocated:
 * it then counts as outside, like an IP in no range set or a name that is not an IP).
 */
export function splitByRangeSet(
  rangeSets: readonly RangeSet[],
  entries: readonly PlanEntry[],
): { sets: RangeSetStatus[]; outside: PlanEntry[] } {
  const buckets = rangeSets.map(() => [] as PlanEntry[]);
  const outside: PlanEntry[] = [];
  for (const e of entries) {
    const ip = parseIP(e.ip);
    let placed = false;
    if (ip !== null) {
      for (let i = 0; i < rangeSets.length && !placed; i++) {
        const rs = rangeSets[i] as RangeSet;
        const r = rangeFor(rs, ip);
        if (r < 0) continue;
        const gw = (rs[r] as RangeSet[number]).gateway;
        if (gw.family === ip.family && gw.value === ip.value) break;
        (buckets[i] as PlanEntry[]).push(e);
        placed = true;
      }
    }
    if (!placed) outside.push(e);
  }
  const sets = rangeSets.map((rs, index) => {
    const inSet = buckets[index] as PlanEntry[];
    const counts = count(inSet);
    const capacity = rangeSetSize(rs);
    const free = capacity - BigInt(counts.reserved);
    return { index, rangeSet: rs, range: rangeSetString(rs), capacity, counts, free: free < 0n ? 0n : free, entries: inSet };
  });
  return { sets, outside };
}

/** Optional inputs of {@link collectStatus}. */
export interface StatusExtra {
  /** The layout, when the caller already has it (doctor); else {@link layoutNetworks}. */
  readonly layout?: Layout;
  /** Networks not to read: network dir → reason (doctor skips a network whose lock is held). */
  readonly skip?: ReadonlyMap<string, string>;
  /**
   * A snapshot to use instead of asking the runtime (the daemon's, taken for its own pass);
   * else {@link takeSnapshot} once for the whole report, without pod IPs.
   */
  readonly snapshot?: Snapshot;
  /** Seconds to wait for each network's lock (default `planNetworks`'s, 30; the daemon's status pages pass 5). */
  readonly lockTimeoutSeconds?: number;
}

/**
 * Collect the report: layout (unless given), ONE runtime snapshot (asked once, whatever the
 * number of data directories; unless given), then per data directory its networks read under
 * their locks and planned against that snapshot (`planNetworks`). A data directory is read whole
 * (every network directory in it) unless `q.network` is set or one of its networks is in
 * `extra.skip`; then only its existing, not skipped networks of the layout are read.
 * Throws what `layoutNetworks`, `takeSnapshot` and `planNetworks` throw (usage errors, a network
 * that cannot be read).
 */
export async function collectStatus(q: StatusQuery, deps: ReconcileDeps, extra: StatusExtra = {}): Promise<StatusReport> {
  const graceSeconds = q.graceSeconds;
  const layout = extra.layout ?? layoutNetworks(q);
  const skip = extra.skip ?? new Map<string, string>();
  const snap = extra.snapshot ?? (await takeSnapshot({ runtimeEndpoint: q.runtimeEndpoint, warnOtherRuntimes: false }, deps));
  const entriesByDir = new Map<string, PlanEntry[]>();
  const read = async (dataDir: string, networks: readonly NetworkDir[]): Promise<void> => {
    // Conservative policy: status shows no `notready` verdict.
    const np = await planNetworks(dataDir, networks, snap, { graceSeconds, cniConfDir: layout.cniConfDir, ...(extra.lockTimeoutSeconds === undefined ? {} : { lockTimeoutSeconds: extra.lockTimeoutSeconds }) }, deps);
    for (const n of np.networks) entriesByDir.set(join(dataDir, n.name), np.plan.entries.filter((e) => e.network === n.name));
  };

  // Data directories holding the networks to report.
  const dirs = q.network === undefined ? layout.dataDirs : [...new Set(layout.networks.map((n) => n.dataDir))].sort();
  for (const dataDir of dirs) {
    const existing = layout.networks.filter((n) => n.dataDir === dataDir && dirExists(n.dir));
    if (q.network === undefined && !existing.some((n) => skip.has(n.dir))) {
      await read(dataDir, discoverNetworks(dataDir));
      continue;
    }
    const toRead = existing.filter((n) => !skip.has(n.dir));
    if (toRead.length > 0) await read(dataDir, toRead.map((n) => namedNetwork(dataDir, n.name)));
  }

  const networks: NetworkStatus[] = layout.networks.map((n) => {
    const entries = entriesByDir.get(n.dir) ?? [];
    const { sets, outside } = splitByRangeSet(n.config?.ipam?.rangeSets ?? [], entries);
    return {
      ...n,
      dirExists: dirExists(n.dir),
      rangeSets: sets,
      outside: { counts: count(outside), entries: outside },
      total: count(entries),
      skipped: skip.get(n.dir) ?? null,
    };
  });
  return {
    runtime: snap.runtime,
    // Incomplete kernel evidence turns would-be leaks into `unknown`: the counts cannot be told.
    verdicts: snap.runtime.sandboxes !== null && snap.evidence.incomplete === null,
    graceSeconds,
    snapshotAtMs: snap.snapshotAtMs,
    layout,
    networks,
    evidence: snap.evidence,
  };
}

function dirExists(dir: string): boolean {
  try {
    return statSync(dir).isDirectory();
  } catch {
    return false;
  }
}

// ------------------------------------------------------------------------------------------
// JSON
// ------------------------------------------------------------------------------------------

/** A count JSON: a number, or a decimal string when above 2^53 − 1 (IPv6 ranges). */
export type BigCountJson = number | string;

/** Counts of the JSON: live/grace/leaked are null when the runtime could not be asked. */
export interface CountsJson {
  reserved: number;
  live: number | null;
  grace: number | null;
  leaked: number | null;
  corrupt: number;
}

/** One range set in the JSON. */
export interface RangeSetJson extends CountsJson {
  index: number;
  range: string;
  ranges: Array<{ subnet: string; rangeStart: string; rangeEnd: string; gateway: string }>;
  capacity: BigCountJson;
  free: BigCountJson;
}

/** One network in the JSON. */
export interface NetworkJson {
  name: string;
  config: { file: string; ipamType: string } | null;
  dataDir: string;
  dir: string;
  dirExists: boolean;
  skipped: string | null;
  rangeSets: RangeSetJson[];
  outside: CountsJson;
  total: CountsJson;
}

/** The `--json` document of `status` (docs/cli.md). */
export interface StatusJson {
  runtime: RuntimeJson;
  /** As in `leaks --json` (docs/cli.md). */
  kernel: KernelJson;
  verdicts: boolean;
  graceSeconds: number;
  cniConfDir: string;
  dataDirs: string[];
  networks: NetworkJson[];
  configErrors: Array<{ file: string; error: string }>;
  /** Networks of cluster pools (not counted here: `ipwarden pool status`). */
  poolNetworks: Array<{ file: string; name: string; pool: string }>;
}

function bigJson(n: bigint): BigCountJson {
  return n <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(n) : n.toString();
}

function countsJson(c: VerdictCounts, verdicts: boolean): CountsJson {
  return {
    reserved: c.reserved,
    live: verdicts ? c.live : null,
    grace: verdicts ? c.grace : null,
    leaked: verdicts ? c.leaked : null,
    corrupt: c.corrupt,
  };
}

/** The `--json` document of a report. */
export function statusToJson(r: StatusReport): StatusJson {
  return {
    runtime: r.runtime,
    kernel: kernelJson(r.evidence),
    verdicts: r.verdicts,
    graceSeconds: r.graceSeconds,
    cniConfDir: r.layout.cniConfDir,
    dataDirs: [...r.layout.dataDirs],
    networks: r.networks.map((n) => ({
      name: n.name,
      config: n.config === null ? null : { file: n.config.file, ipamType: n.config.ipamType ?? '' },
      dataDir: n.dataDir,
      dir: n.dir,
      dirExists: n.dirExists,
      skipped: n.skipped,
      rangeSets: n.rangeSets.map((s) => ({
        index: s.index,
        range: s.range,
        ranges: s.rangeSet.map((x) => ({
          subnet: formatSubnet(x.subnet),
          rangeStart: formatIP(x.rangeStart),
          rangeEnd: formatIP(x.rangeEnd),
          gateway: formatIP(x.gateway),
        })),
        capacity: bigJson(s.capacity),
        ...countsJson(s.counts, r.verdicts),
        free: bigJson(s.free),
      })),
      outside: countsJson(n.outside.counts, r.verdicts),
      total: countsJson(n.total, r.verdicts),
    })),
    configErrors: r.layout.configErrors.map((e) => ({ ...e })),
    poolNetworks: r.layout.poolNetworks.map((e) => ({ ...e })),
  };
}
