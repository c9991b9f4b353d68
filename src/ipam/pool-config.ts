/**
 * The `ipam.pool` key (issue 11, docs/cluster.md "Configuration"): a network whose `ranges` are
 * shared by every node through etcd, handed out in blocks. Pure: decodes and validates JSON
 * values; the TLS files are read and the node name resolved by the pool engine and the node (`src/pool/session.ts`, `src/node/node-name.ts`).
 *
 * ```json
 * "ipam": {
 *   "type": "ipwarden",
 *   "ranges": [[{"subnet": "10.80.0.0/16"}]],
 *   "nodeName": "worker-1",
 *   "pool": {
 *     "name": "net1-pool",
 *     "etcd": {"endpoints": ["https://10.0.0.5:2379"], "tls": {"ca": "/etc/ipwarden/etcd-ca.pem",
 *              "cert": "/etc/ipwarden/etcd.pem", "key": "/etc/ipwarden/etcd-key.pem"},
 *              "prefix": "/ipwarden", "credentials": "/etc/ipwarden/etcd-credentials.json"},
 *     "blockSize": 26,
 *     "blockSize6": 122
 *   }
 * }
 * ```
 *
 * Every error is `AppError('IPAM_INVALID_CONFIG')` (CNI 7) with the exact texts listed in
 * docs/cluster.md; each names the key.
 */
import { AppError } from '../common/errors.ts';
import { parseDurationNs } from '../common/duration.ts';
import { CNI_NAME_RE } from '../common/names.ts';

/** Default IPv4 block prefix length (Calico's IPPool default /26; anchors.md §5.1). */
export const DEFAULT_BLOCK_SIZE4 = 26;
/** Default IPv6 block prefix length (Calico's default /122). */
export const DEFAULT_BLOCK_SIZE6 = 122;
/**
 * Allowed IPv4 block prefix lengths, 24–32: Calico allows 20–32, but a block is one etcd value
 * rewritten by every allocation in it (≈ 150 bytes per allocation): a full /20 is ≈ 0.6 MB per
 * write, and a batch touching three of them exceeds etcd's 1.5 MiB request limit (review); a
 * full /24 is ≈ 38 KB.
 */
export const BLOCK_SIZE4_RANGE = [24, 32] as const;
/** Allowed IPv6 block prefix lengths, 120–128 (at most 256 addresses per block, as for IPv4). */
export const BLOCK_SIZE6_RANGE = [120, 128] as const;
/** Default etcd key prefix. */
export const DEFAULT_POOL_PREFIX = '/ipwarden';
/** Allowed `ipam.pool.offline.reserve` (addresses per range set set aside for offline ADDs). */
export const OFFLINE_RESERVE_RANGE = [1, 64] as const;
/** Allowed `ipam.pool.offline.seconds` (how long after the last confirmed contact a node may allocate offline). */
export const OFFLINE_SECONDS_RANGE = [1, 3600] as const;
/**
 * Allowed `ipam.pool.reclaimAfter`, milliseconds: 1 s to 720 h. Small values are allowed (tests
 * use seconds): the safety of an automatic removal rests on the heartbeat's 30 s lease, the veto
 * window (at least 60 s) and the revision-checked `--finish`, not on this delay; docs/cluster.md
 * recommends at least 90 s (three heartbeat leases) so a short partition does not begin a removal.
 */
export const RECLAIM_AFTER_MS_RANGE = [1_000, 720 * 3_600_000] as const;
/** Longest node name accepted (a Kubernetes node name is a DNS subdomain: at most 253 characters). */
export const MAX_NODE_NAME = 253;

/** The decoded `ipam.pool`. */
export interface PoolConfig {
  /** Pool name (`CNI_NAME_RE`): every network naming it shares its blocks. */
  readonly name: string;
  readonly etcd: {
    /** `http://host:port` / `https://host:port`, as given (all of one scheme). */
    readonly endpoints: readonly string[];
    /** Absolute paths of PEM files, or null when the endpoints are `http://`. */
    readonly tls: { readonly ca: string; readonly cert: string | null; readonly key: string | null } | null;
    /** Key prefix, `/`-led without a trailing `/` (default `/ipwarden`). */
    readonly prefix: string;
    /**
     * `ipam.pool.etcd.credentials`: absolute path of a JSON file `{"user","password"}` for etcd's
     * user/password authentication (read at the edge under the trust rules,
     * src/pool/credentials.ts), or absent/null: none. Present in the decoded value only when
     * given, so configs without it decode exactly as before.
     */
    readonly credentials?: string | null;
  };
  /** IPv4 block prefix length (default 26). */
  readonly blockSize4: number;
  /** IPv6 block prefix length (default 122). */
  readonly blockSize6: number;
  /** `ipam.nodeName`, or null: then `NODE_NAME`, else the host name (resolved at the edge). */
  readonly nodeName: string | null;
  /**
   * `ipam.pool.offline` (docs/cluster.md "Offline allocation"), or null/absent: a node cut off from
   * etcd fails its ADDs with code 11 (the behaviour without the key, exactly). Optional in the type
   * so configs built in code without it keep meaning "off".
   */
  readonly offline?: OfflineConfig | null;
  /**
   * `ipam.pool.reclaimAfter` in milliseconds (docs/cluster.md "Reclaiming dead nodes
   * automatically"): this node's daemon removes another node of the pool whose heartbeat it has
   * seen absent that long (on its own monotonic clock), by the two-step removal with its veto
   * window. Absent (or `"0"`): off. Present in the decoded value only when given and not zero.
   */
  readonly reclaimAfterMs?: number;
}

/** The decoded `ipam.pool.offline`. */
export interface OfflineConfig {
  /** Reserve entries the daemon keeps per range set in the node's own blocks, 1–64. */
  readonly reserve: number;
  /** Seconds after the last confirmed contact with etcd during which an offline ADD may use them, 1–3600. */
  readonly seconds: number;
}

type Obj = Record<string, unknown>;

function bad(msg: string): AppError {
  return new AppError('IPAM_INVALID_CONFIG', msg);
}

function jsonType(v: unknown): string {
  return v === null ? 'null' : Array.isArray(v) ? 'array' : typeof v;
}

function isObj(v: unknown): v is Obj {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** Is `name` usable as a node name (in etcd keys): `CNI_NAME_RE`, at most 253 characters. */
export function validNodeName(name: string): boolean {
  return name.length <= MAX_NODE_NAME && CNI_NAME_RE.test(name);
}

/** The message for an unusable node name from `source` (`ipam.nodeName`, `NODE_NAME`, `the host name`). */
export function badNodeNameMessage(source: string, name: string): string {
  return `${source} must be a node name of at most ${MAX_NODE_NAME} letters, digits, '_', '.' or '-' starting with a letter or digit, got ${JSON.stringify(name)}`;
}

function decodeEndpoint(v: unknown, path: string): { url: string; tls: boolean } {
  if (typeof v !== 'string') throw bad(`${path} must be a string, got ${jsonType(v)}`);
  const m = /^(https?):\/\/(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+):([0-9]{1,5})$/.exec(v);
  const port = m === null ? 0 : Number(m[3]);
  if (m === null || port < 1 || port > 65535) throw bad(`${path} must be http://HOST:PORT or https://HOST:PORT, got ${JSON.stringify(v)}`);
  return { url: v, tls: m[1] === 'https' };
}

function decodePath(tls: Obj, name: string): string | null {
  const v = tls[name];
  if (v === undefined || v === null) return null;
  const path = `ipam.pool.etcd.tls.${name}`;
  if (typeof v !== 'string' || !v.startsWith('/') || v.includes('\0')) throw bad(`${path} must be an absolute path, got ${JSON.stringify(v)}`);
  return v;
}

function decodeBlockSize(pool: Obj, name: string, range: readonly [number, number], dflt: number): number {
  const v = pool[name];
  // null is refused like `"pool": null`: a template's missing value read as the default would
  // cut the range into other blocks than the pool's other nodes (review B3).
  if (v === undefined) return dflt;
  if (typeof v !== 'number' || !Number.isInteger(v) || v < range[0] || v > range[1]) {
    throw bad(`ipam.pool.${name} must be an integer from ${range[0]} to ${range[1]}, got ${JSON.stringify(v)}`);
  }
  return v;
}

/** The keys of `ipam.pool`, `ipam.pool.etcd` and `ipam.pool.etcd.tls`; any other key is refused. */
export const POOL_KEYS: readonly string[] = ['name', 'etcd', 'blockSize', 'blockSize6', 'offline', 'reclaimAfter'];
const ETCD_KEYS: readonly string[] = ['endpoints', 'tls', 'prefix', 'credentials'];
const TLS_KEYS: readonly string[] = ['ca', 'cert', 'key'];
/** The pool's keys directly in `ipam`, matched exactly (host-local's own keys are not). */
const IPAM_POOL_KEYS: readonly string[] = ['pool', 'nodeName'];

function decodeInt(o: Obj, path: string, name: string, range: readonly [number, number]): number {
  const v = o[name];
  if (typeof v !== 'number' || !Number.isInteger(v) || v < range[0] || v > range[1]) {
    throw bad(`${path}.${name} must be an integer from ${range[0]} to ${range[1]}, got ${JSON.stringify(v ?? null)}`);
  }
  return v;
}

/** The keys of `ipam.pool.offline`. */
const OFFLINE_KEYS: readonly string[] = ['reserve', 'seconds'];

/**
 * Decode `ipam.pool.offline` (`{"reserve": K, "seconds": S}`, both required); null when absent
 * (`null` is refused, like `"pool": null`: a template's missing value is not "off").
 * @throws AppError IPAM_INVALID_CONFIG: `ipam.pool.offline must be an object, got <type>`,
 *   `ipam.pool.offline has an unknown key <json> (known keys: reserve, seconds)`,
 *   `ipam.pool.offline.reserve must be an integer from 1 to 64, got <json>`,
 *   `ipam.pool.offline.seconds must be an integer from 1 to 3600, got <json>`
 */
export function decodeOfflineConfig(pool: Obj): OfflineConfig | null {
  const raw = pool['offline'];
  if (raw === undefined) return null;
  if (!isObj(raw)) throw bad(`ipam.pool.offline must be an object, got ${jsonType(raw)}`);
  refuseUnknownKeys(raw, 'ipam.pool.offline', OFFLINE_KEYS);
  return {
    reserve: decodeInt(raw, 'ipam.pool.offline', 'reserve', OFFLINE_RESERVE_RANGE),
    seconds: decodeInt(raw, 'ipam.pool.offline', 'seconds', OFFLINE_SECONDS_RANGE),
  };
}

/**
 * Decode `ipam.pool.reclaimAfter`: a Go duration string (`"10m"`, `"90s"`, `"1h30m"`) from 1 s to
 * 720 h, or `"0"` (any zero duration) for off. Returns milliseconds, or null when absent or zero.
 * @throws AppError IPAM_INVALID_CONFIG
 *   `ipam.pool.reclaimAfter must be a duration such as "10m" (Go syntax: 90s, 1h30m), got <json>`
 *   (also for `null` and non-strings: a template's missing value is not "off"),
 *   `ipam.pool.reclaimAfter must be from 1s to 720h (or "0" for off), got <json>`
 */
export function decodeReclaimAfter(pool: Obj): number | null {
  const raw = pool['reclaimAfter'];
  if (raw === undefined) return null;
  const syntax = (): AppError => bad(`ipam.pool.reclaimAfter must be a duration such as "10m" (Go syntax: 90s, 1h30m), got ${JSON.stringify(raw)}`);
  if (typeof raw !== 'string') throw syntax();
  let ns: bigint;
  try {
    ns = parseDurationNs(raw);
  } catch {
    throw syntax();
  }
  if (ns === 0n) return null;
  const ms = Number(ns / 1_000_000n);
  if (ns < 0n || ms < RECLAIM_AFTER_MS_RANGE[0] || ms > RECLAIM_AFTER_MS_RANGE[1]) throw bad(`ipam.pool.reclaimAfter must be from 1s to 720h (or "0" for off), got ${JSON.stringify(raw)}`);
  return ms;
}

/**
 * Refuse a key of `obj` that is not in `known`. A misspelled pool key (`blocksize`) would
 * otherwise be ignored and the default written into the pool's create-only `meta` for good
 * (trial finding 3).
 * @throws AppError IPAM_INVALID_CONFIG `<path> has an unknown key <json> (known keys: a, b)`
 */
function refuseUnknownKeys(obj: Obj, path: string, known: readonly string[]): void {
  for (const k of Object.keys(obj)) {
    if (!known.includes(k)) throw bad(`${path} has an unknown key ${JSON.stringify(k)} (known keys: ${known.join(', ')})`);
  }
}

/**
 * Refuse a key of `ipam` that equals a pool key ignoring case but not exactly (`"Pool"`): Go's
 * decoder, and ipwarden's host-local keys, would match it, so the writer meant a pool; ignoring it
 * would allocate the pool's range from node-local files (trial finding 2).
 * @throws AppError IPAM_INVALID_CONFIG `ipam has the key <json>: pool keys are matched exactly; write "<key>"`
 */
function refuseCaseVariants(obj: Obj, path: string, keys: readonly string[]): void {
  for (const k of Object.keys(obj)) {
    const want = keys.find((w) => w.toLowerCase() === k.toLowerCase());
    if (want !== undefined && want !== k) throw bad(`${path} has the key ${JSON.stringify(k)}: pool keys are matched exactly; write ${JSON.stringify(want)}`);
  }
}

/** The IPAM `type` whose config {@link misplacedPoolKey} judges (the plugin's own name). */
export const IPWARDEN_IPAM_TYPE = 'ipwarden';

/**
 * Optimal string alignment distance of `a` and `b` capped at 2 (0, 1, or 2 meaning "2 or more"):
 * the fewest characters inserted, deleted, replaced, or adjacent pairs swapped. Pure.
 */
function editDistanceUpTo2(a: string, b: string): number {
  if (Math.abs(a.length - b.length) > 1) return 2;
  const prev2: number[] = [];
  let prev: number[] = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const cur: number[] = [i];
    for (let j = 1; j <= b.length; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      let d = Math.min((prev[j] as number) + 1, (cur[j - 1] as number) + 1, (prev[j - 1] as number) + cost);
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1]) d = Math.min(d, (prev2[j - 2] as number) + 1);
      cur.push(d);
    }
    prev2.splice(0, prev2.length, ...prev);
    prev = cur;
  }
  return Math.min(prev[b.length] as number, 2);
}

/**
 * Is `key` (a key of an `ipam` section) a near miss of `pool`: its ASCII lower case is one edit
 * from `pool` — one character inserted, deleted or replaced, or two adjacent ones swapped
 * (`pools`, `Pools`, `pool_`, `pool-`, `poool`, `pol`, `ppol`, `opol`, `poll`, `spool`). A case
 * variant of `pool` itself (`Pool`) is not one (it is refused by its own rule). No key of
 * host-local (`type ranges routes dataDir resolvConf subnet rangeStart rangeEnd gateway`), of
 * ipwarden, of whereabouts (`range`, `range_start`, `exclude`, `etcd_host`, `ipRanges`, …) or of
 * calico-ipam (`ipv4_pools`, `assign_ipv4`, …) is one. Pure.
 */
export function isPoolKeyNearMiss(key: string): boolean {
  return editDistanceUpTo2(key.toLowerCase(), 'pool') === 1;
}

/** The message refusing an `ipam` key that {@link isPoolKeyNearMiss} matches. */
export function poolKeyNearMissMessage(key: string): string {
  return `ipam key ${JSON.stringify(key)} looks like a misspelt "pool": a cluster pool's key is "pool" (inside "ipam"); refused so that the pool's addresses are not handed out from node-local files`;
}

/** The message refusing a network config key `pool` (any case) outside `ipam`. */
export function poolKeyOutsideIpamMessage(key: string): string {
  return `network config key ${JSON.stringify(key)} is outside "ipam": a cluster pool's key is "pool" inside "ipam"; refused so that the pool's addresses are not handed out from node-local files`;
}

/**
 * Why a network config that asks for IPAM type `ipwarden` but has no `ipam.pool` looks like it
 * meant a cluster pool: the message of the first such mistake, or null when there is none.
 * Judged only when `ipam.type` is exactly `ipwarden` and `ipam` has no key `pool` (exactly; a
 * case variant is refused by {@link decodePoolConfig}); then, in this order:
 * - a key of `ipam` that {@link isPoolKeyNearMiss} matches → {@link poolKeyNearMissMessage};
 * - a top-level key of the config (the one plugin's config the runtime hands the plugin) equal
 *   to `pool` ignoring ASCII case → {@link poolKeyOutsideIpamMessage}.
 * Another IPAM type (`host-local`, when ipwarden is installed under that name) is a config
 * written for host-local, which has no pools and ignores unknown keys: not judged. Pure.
 * @param doc the network config (a JSON object); `ipam` its `ipam` object
 */
export function misplacedPoolKey(doc: Obj, ipam: Obj): string | null {
  // `type` found as Go's decoder (and loadIPAMConfig) finds it: the exact key, else the last case variant.
  let type: unknown = ipam['type'];
  if (!Object.prototype.hasOwnProperty.call(ipam, 'type')) for (const k of Object.keys(ipam)) if (k.toLowerCase() === 'type') type = ipam[k];
  if (type !== IPWARDEN_IPAM_TYPE || Object.prototype.hasOwnProperty.call(ipam, 'pool')) return null;
  const nearMiss = Object.keys(ipam).find(isPoolKeyNearMiss);
  if (nearMiss !== undefined) return poolKeyNearMissMessage(nearMiss);
  const outside = Object.keys(doc).find((k) => k.toLowerCase() === 'pool');
  if (outside !== undefined) return poolKeyOutsideIpamMessage(outside);
  return null;
}

/**
 * Decode `ipam.pool` (and `ipam.nodeName`). Returns null when `ipam.pool` is absent (`null` is refused).
 * @param ipam the `ipam` object of the network config
 * @throws AppError IPAM_INVALID_CONFIG with the texts of docs/cluster.md "Configuration errors"
 */
export function decodePoolConfig(ipam: Obj): PoolConfig | null {
  refuseCaseVariants(ipam, 'ipam', IPAM_POOL_KEYS);
  const raw = ipam['pool'];
  if (raw === undefined) return null;
  // `"pool": null` is what a template renders for a missing value: refused, never read as "no
  // pool" — the node would then hand out the pool's addresses from node-local files (trial).
  if (!isObj(raw)) throw bad(`ipam.pool must be an object, got ${jsonType(raw)}`);
  refuseUnknownKeys(raw, 'ipam.pool', POOL_KEYS);
  const name = raw['name'];
  if (typeof name !== 'string' || !CNI_NAME_RE.test(name)) {
    throw bad(`ipam.pool.name must be a name of letters, digits, '_', '.' or '-' starting with a letter or digit, got ${JSON.stringify(name ?? null)}`);
  }
  const etcd = raw['etcd'];
  if (etcd === undefined || etcd === null) throw bad('ipam.pool.etcd is required');
  if (!isObj(etcd)) throw bad(`ipam.pool.etcd must be an object, got ${jsonType(etcd)}`);
  refuseUnknownKeys(etcd, 'ipam.pool.etcd', ETCD_KEYS);
  const eps = etcd['endpoints'];
  if (!Array.isArray(eps) || eps.length === 0) throw bad(`ipam.pool.etcd.endpoints must be a non-empty array of URLs, got ${Array.isArray(eps) ? '[]' : jsonType(eps ?? null)}`);
  const endpoints = eps.map((e, i) => decodeEndpoint(e, `ipam.pool.etcd.endpoints[${i}]`));
  const secure = endpoints.some((e) => e.tls);
  if (secure && endpoints.some((e) => !e.tls)) throw bad('ipam.pool.etcd.endpoints mix http:// and https://');
  const rawTls = etcd['tls'];
  let tls: PoolConfig['etcd']['tls'] = null;
  if (rawTls !== undefined && rawTls !== null) {
    if (!isObj(rawTls)) throw bad(`ipam.pool.etcd.tls must be an object, got ${jsonType(rawTls)}`);
    refuseUnknownKeys(rawTls, 'ipam.pool.etcd.tls', TLS_KEYS);
    if (!secure) throw bad('ipam.pool.etcd.tls is given but the endpoints are http://');
    const ca = decodePath(rawTls, 'ca');
    const cert = decodePath(rawTls, 'cert');
    const key = decodePath(rawTls, 'key');
    if (ca === null) throw bad('ipam.pool.etcd.tls.ca is required with https:// endpoints');
    if ((cert === null) !== (key === null)) throw bad('ipam.pool.etcd.tls.cert and ipam.pool.etcd.tls.key must be given together');
    tls = { ca, cert, key };
  } else if (secure) {
    throw bad('ipam.pool.etcd.tls.ca is required with https:// endpoints');
  }
  const rawPrefix = etcd['prefix'];
  let prefix = DEFAULT_POOL_PREFIX;
  // null is refused: read as the default prefix it would make a second pool of the same name
  // over the same ranges in the same etcd — one address handed out twice (review B3).
  if (rawPrefix !== undefined) {
    if (typeof rawPrefix !== 'string' || !/^(\/[A-Za-z0-9_.-]+)+$/.test(rawPrefix)) {
      throw bad(`ipam.pool.etcd.prefix must be /-separated names of letters, digits, '_', '.' or '-' without a trailing /, got ${JSON.stringify(rawPrefix)}`);
    }
    prefix = rawPrefix;
  }
  const rawCreds = etcd['credentials'];
  let credentials: string | null = null;
  // null is refused like the other keys: a template's missing value is not "no authentication".
  if (rawCreds !== undefined) {
    if (typeof rawCreds !== 'string' || !rawCreds.startsWith('/') || rawCreds.includes('\0')) throw bad(`ipam.pool.etcd.credentials must be an absolute path, got ${JSON.stringify(rawCreds)}`);
    credentials = rawCreds;
  }
  const rawNode = ipam['nodeName'];
  let nodeName: string | null = null;
  if (rawNode !== undefined && rawNode !== null && rawNode !== '') {
    if (typeof rawNode !== 'string' || !validNodeName(rawNode)) throw bad(badNodeNameMessage('ipam.nodeName', String(rawNode)));
    nodeName = rawNode;
  }
  const offline = decodeOfflineConfig(raw);
  const reclaimAfterMs = decodeReclaimAfter(raw);
  return {
    name,
    etcd: { endpoints: endpoints.map((e) => e.url), tls, prefix, ...(credentials === null ? {} : { credentials }) },
    blockSize4: decodeBlockSize(raw, 'blockSize', BLOCK_SIZE4_RANGE, DEFAULT_BLOCK_SIZE4),
    blockSize6: decodeBlockSize(raw, 'blockSize6', BLOCK_SIZE6_RANGE, DEFAULT_BLOCK_SIZE6),
    nodeName,
    // Only when given: a config without it decodes exactly as before (no `offline` key).
    ...(offline === null ? {} : { offline }),
    ...(reclaimAfterMs === null ? {} : { reclaimAfterMs }),
  };
}
