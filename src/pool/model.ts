/**
 * The cluster pool's data model (docs/cluster.md "Key layout"): where every key of a pool is
 * ({@link PoolKeyLayout}) and how every value is written and read (the codecs). Pure: no I/O.
 * Changing a key or a value's shape touches this file (and the config, src/ipam/pool-config.ts,
 * for the block sizes) only. The bytes are those ipwarden has always written: values are JSON
 * with a version field `v` ({@link POOL_VALUE_VERSION}), decoded exactly (an unknown field is
 * corrupt: a field this version does not know may be one it would drop when it rewrites the
 * value; {@link CorruptValueError}).
 *
 * Keys under `P/pools/<pool>/` (`P` = `ipam.pool.etcd.prefix`, default `/ipwarden`):
 *
 * - `meta` → `{"v":1,"rangeSets":[[{"subnet","rangeStart","rangeEnd","gateway"}]],"blockSize","blockSize6"}`
 *   ({@link metaOf}) — written once by the first node; every node checks its config against it
 *   (two nodes cutting one range into different blocks would hand out one address twice);
 * - `meta-cluster` → `{"v":1,"clusterId":"<hex>"}` ({@link clusterPinValue}) — the etcd cluster
 *   the pool was created in;
 * - `blocks/<block>` (`10.80.0.64-26`, {@link blockKeyText}) → `{"v":1,"cidr","rangeSet","node",
 *   "state":"owned","seq","next","allocs":{"<ordinal>":{"id","ifname","node","seq","at"}}}`
 *   ({@link encodeBlock}, {@link decodeBlock}); optional `"wanted":{"<ordinal>":{"sandbox","node","at"}}`
 *   after `allocs`: an ordinal a live pod of another node uses while the pool says another holder
 *   has it (after an etcd restore; src/pool/wanted.ts) — never allocatable but to that pod;
 * - `wanted/<node>/<block>/<ordinal>` → `{"v":1,"sandbox","ip","at"}` — the index of `node`'s
 *   wants (written and deleted in the transaction of the block's want; only its key decides);
 * - `nodes/<node>/blocks/<block>` → `{"v":1,"rangeSet"}` — the affinity index (a node finds its
 *   blocks with one prefix read; {@link affinityValue}, {@link decodeAffinity});
 * - `nodes/<node>/settings` → `{"v":1,"offlineSeconds":S}` ({@link settingsValue},
 *   {@link decodeSettings});
 * - `handles/<containerID>/<ifname>` → `{"v":1,"node","network","at","ips":[{"ip","block","ordinal","seq","rangeSet"}],"host"?}`,
 *   or a DEL's tombstone `{…,"ips":[],"deleted":true}` ({@link encodeHandle}, {@link tombstoneValue},
 *   {@link decodeHandle});
 * - `alive/<node>` → `{"v":1,"node","since","host"?,"pid"?}` — the node's heartbeat, leased
 *   ({@link heartbeatValue}, {@link heartbeatWriter});
 * - `removing/<node>` → `{"v":1,"node","at","by"?}` — `pool remove-node` step 1's marker (`by`: the daemon of an automatic removal, {@link markerBy});
 *   `removal-window/<node>` (same value, leased) — the veto window ({@link removalMarkerValue}).
 */
import { AppError } from '../common/errors.ts';
import { formatIP, parseCIDR, parseIP, type Subnet } from '../common/ip.ts';
import { CNI_NAME_RE } from '../common/names.ts';
import { canonicalizeRangeSet } from '../ipam/range.ts';
import type { RangeSet } from '../ipam/types.ts';
import type { KVEntry } from '../store/kv.ts';
import { blockAddresses, type BlockSizes } from './blocks.ts';

/** Where a pool's keys are: `P/pools/<pool>/…` (see the module comment). */
export interface PoolKeys {
  /** `ipam.pool.etcd.prefix`. */
  readonly prefix: string;
  /** `ipam.pool.name`. */
  readonly pool: string;
}

/**
 * Every key of one pool (see the module comment): `…Prefix` members end in `/` and are read with
 * a prefix list; the methods build one key. Node names, block key texts, container IDs and
 * interface names are put in as they are (the callers validate them).
 */
export class PoolKeyLayout {
  /** `P/pools/<pool>`. */
  readonly base: string;
  constructor(k: PoolKeys) {
    this.base = `${k.prefix}/pools/${k.pool}`;
  }
  /** `…/meta`: the pool's layout. A prefix read of it also returns {@link clusterPin}. */
  get meta(): string {
    return `${this.base}/meta`;
  }
  /** `…/meta-cluster`: the pool's cluster pin (named so one prefix read of `…/meta` returns both). */
  get clusterPin(): string {
    return `${this.base}/meta-cluster`;
  }
  /** `…/blocks/`: every block. */
  get blocksPrefix(): string {
    return `${this.base}/blocks/`;
  }
  /** `…/blocks/<b>` (`b`: {@link blockKeyText}). */
  block(b: string): string {
    return `${this.blocksPrefix}${b}`;
  }
  /** `…/nodes/`: every node's affinities and settings. */
  get nodesPrefix(): string {
    return `${this.base}/nodes/`;
  }
  /** `…/nodes/<node>/blocks/`: the affinity index of `node`. */
  affinityPrefix(node: string): string {
    return `${this.nodesPrefix}${node}/blocks/`;
  }
  /** `…/nodes/<node>/blocks/<b>`: the affinity of block `b` to `node`. */
  affinity(node: string, b: string): string {
    return `${this.affinityPrefix(node)}${b}`;
  }
  /** `…/nodes/<node>/settings`: `node`'s settings (offline seconds). */
  settings(node: string): string {
    return `${this.nodesPrefix}${node}/settings`;
  }
  /** The node part of a settings key (`…/nodes/<node>/settings` → `<node>`, unvalidated), or null for any other key. */
  settingsNode(key: string): string | null {
    if (!key.startsWith(this.nodesPrefix)) return null;
    const m = /^([^/]+)\/settings$/.exec(key.slice(this.nodesPrefix.length));
    return m === null ? null : (m[1] as string);
  }
  /** `…/alive/`: every heartbeat. */
  get alivePrefix(): string {
    return `${this.base}/alive/`;
  }
  /** `…/alive/<node>`: `node`'s heartbeat. */
  alive(node: string): string {
    return `${this.alivePrefix}${node}`;
  }
  /** `…/removing/`: every removal marker. */
  get removingPrefix(): string {
    return `${this.base}/removing/`;
  }
  /** `…/removing/<node>`: the marker of `node`'s removal. */
  removing(node: string): string {
    return `${this.removingPrefix}${node}`;
  }
  /** `…/removal-window/<node>`: the veto window of `node`'s removal. */
  window(node: string): string {
    return `${this.base}/removal-window/${node}`;
  }
  /** `…/wanted/<node>/`: the index of `node`'s wants (src/pool/wanted.ts). */
  wantedPrefix(node: string): string {
    return `${this.base}/wanted/${node}/`;
  }
  /** `…/wanted/<node>/<b>/<ordinal>`: the index key of `node`'s want of `ordinal` in block `b`. */
  want(node: string, b: string, ordinal: number): string {
    return `${this.wantedPrefix(node)}${b}/${ordinal}`;
  }
  /** `…/handles/`: every handle. */
  get handlesPrefix(): string {
    return `${this.base}/handles/`;
  }
  /** `…/handles/<containerId>/<ifname>`: the handle of one attachment. */
  handle(containerId: string, ifname: string): string {
    return `${this.handlesPrefix}${containerId}/${ifname}`;
  }
}

/** The key layout of pool `k` ({@link PoolKeyLayout}). */
export function keysOf(k: PoolKeys): PoolKeyLayout {
  return new PoolKeyLayout(k);
}

/** The text of a block in etcd keys: `<network address>-<prefix>` (`10.80.0.64-26`, `fd80::40-122`). */
export function blockKeyText(cidr: Subnet): string {
  return `${formatIP(cidr.ip)}-${cidr.prefix}`;
}

/** Value version written and accepted. */
export const POOL_VALUE_VERSION = 1;

/**
 * One allocation, stored in its block. A **reserve entry** (`ipam.pool.offline`, docs/cluster.md
 * "Offline allocation") has `reserve: true`, `id` and `ifname` empty (no container's: a CNI
 * container ID is never empty) and `node` = the block's owner: taken by nobody, released only by
 * the owner's sync (which turns it into a container's allocation) and `pool remove-node --finish`.
 */
export interface AllocValue {
  readonly id: string;
  readonly ifname: string;
  readonly node: string;
  readonly seq: number;
  readonly at: number;
  readonly reserve?: true;
}

/** A block as stored. */
export interface BlockValue {
  v: 1;
  cidr: string;
  rangeSet: number;
  node: string;
  state: 'owned' | 'pendingRelease';
  /** Last sequence number handed out in this block (only grows). */
  seq: number;
  /** Ordinal where the next search starts (round robin inside the block). */
  next: number;
  allocs: Record<string, AllocValue>;
  /**
   * Ordinals wanted by a live pod of a node whose address the pool gave to another holder (after
   * an etcd restore: docs/cluster.md "Re-reserving live pods' addresses"; src/pool/wanted.ts). At
   * most one want per ordinal; absent when there is none (never written empty). A wanted ordinal
   * is never handed out (but to its sandbox, by its node's re-reservation), and a block with a
   * want is never given back or deleted as empty. Each want is replaced or deleted as a whole
   * (the map may be shared between copies: {@link copyBlock}).
   */
  wanted?: Record<string, WantValue>;
}

/** A want of one ordinal ({@link BlockValue.wanted}): READY sandbox `sandbox` of node `node` uses it. */
export interface WantValue {
  readonly sandbox: string;
  readonly node: string;
  /** Milliseconds since the epoch (the writer's clock; informational). */
  readonly at: number;
}

/** One address of a handle. */
export interface HandleIP {
  ip: string;
  block: string;
  ordinal: number;
  seq: number;
  rangeSet: number;
}

/** A handle (container ID + ifname → its addresses) as stored. */
export interface HandleValue {
  v: 1;
  node: string;
  network: string;
  at: number;
  ips: HandleIP[];
  /**
   * The host name of the machine whose process wrote the handle (absent in handles written before
   * it was recorded, and by allocators given no `host`). The node's reconcile releases only
   * handles its own host wrote: two hosts under one node name (a fixed `ipam.nodeName`, a copied
   * node-name file) must not judge each other's pods by their own runtime and kernel (review B1).
   */
  host?: string;
  /**
   * True for a tombstone (`"deleted":true`, `ips` empty): written by a DEL that found no handle,
   * so a late ADD transaction (sent by a process that gave up, applied by etcd after the DEL)
   * fails its create-only compare instead of leaking (review F4). A fresh ADD overwrites it by
   * comparing its revision; it is put with a lease of {@link TOMBSTONE_TTL_SECONDS} when the KV
   * has leases. Never an allocation: find, handlesOf and `--finish` skip it.
   */
  deleted?: true;
}

/**
 * A pool key whose value (or name) this version cannot read: code `STORE_CORRUPT` (CNI 999),
 * message `etcd key <key>: <why>`. Its `key` and `why` let a caller that can go on without the key
 * (a DEL, an ADD choosing among blocks, `pool status`) name it and skip it: a corrupt key is never
 * read as free, never rewritten and never released; it is left for an operator (docs/cluster.md
 * "Corrupt keys").
 */
export class CorruptValueError extends AppError {
  /** The full etcd key. */
  readonly key: string;
  /** Why it cannot be read (the message without the `etcd key <key>: ` part). */
  readonly why: string;
  constructor(key: string, why: string) {
    super('STORE_CORRUPT', `etcd key ${key}: ${why}`);
    this.key = key;
    this.why = why;
  }
}

export function corrupt(key: string, why: string): CorruptValueError {
  return new CorruptValueError(key, why);
}

/**
 * Refuse a field outside `known` (docs/cluster.md "Key layout": a value that does not decode
 * exactly is corrupt — a field this version does not know may be one it would drop when it
 * rewrites the value). `where`: `""` for the value itself, else e.g. `allocation 3: `.
 */
export function onlyKnown(key: string, o: Record<string, unknown>, known: readonly string[], where = ''): void {
  for (const f of Object.keys(o)) if (!known.includes(f)) throw corrupt(key, `${where}unknown field ${JSON.stringify(f)} (known: ${known.join(', ')})`);
}

const BLOCK_FIELDS = ['v', 'cidr', 'rangeSet', 'node', 'state', 'seq', 'next', 'allocs', 'wanted'] as const;
const WANT_FIELDS = ['sandbox', 'node', 'at'] as const;
const ALLOC_FIELDS = ['id', 'ifname', 'node', 'seq', 'at'] as const;
const RESERVE_FIELDS = ['id', 'ifname', 'node', 'seq', 'at', 'reserve'] as const;
const HANDLE_FIELDS = ['v', 'node', 'network', 'at', 'ips', 'host', 'deleted'] as const;
const HANDLE_IP_FIELDS = ['ip', 'block', 'ordinal', 'seq', 'rangeSet'] as const;
const AFFINITY_FIELDS = ['v', 'rangeSet'] as const;

/**
 * Who wrote a heartbeat value (`{"v":1,"node","since","host"?,"pid"?}`): `host` and `pid` of the
 * daemon when the value names them (values written before they existed do not), else null. Never
 * throws: a heartbeat is a hint, and the refusal stands whatever its value says.
 */
export function heartbeatWriter(value: string | null | undefined): { host: string; pid: number | null } | null {
  if (value === null || value === undefined) return null;
  try {
    const o = JSON.parse(value) as { host?: unknown; pid?: unknown } | null;
    if (typeof o !== 'object' || o === null || typeof o.host !== 'string' || o.host === '' || o.host.length > 253 || !/^[A-Za-z0-9_.-]+$/.test(o.host)) return null;
    return { host: o.host, pid: typeof o.pid === 'number' && Number.isSafeInteger(o.pid) && o.pid > 0 ? o.pid : null };
  } catch {
    return null;
  }
}

export function parseJson(e: KVEntry): Record<string, unknown> {
  let o: unknown;
  try {
    o = JSON.parse(e.value);
  } catch {
    throw corrupt(e.key, 'not valid JSON');
  }
  if (typeof o !== 'object' || o === null || Array.isArray(o)) throw corrupt(e.key, 'not a JSON object');
  const r = o as Record<string, unknown>;
  if (r['v'] !== POOL_VALUE_VERSION) throw corrupt(e.key, `unknown value version ${JSON.stringify(r['v'] ?? null)} (this ipwarden writes ${POOL_VALUE_VERSION})`);
  return r;
}

export const isNat = (v: unknown): v is number => typeof v === 'number' && Number.isSafeInteger(v) && v >= 0;

/**
 * Decode a block value exactly: every field of {@link BlockValue} with its type and range, no
 * other field (in the value or in an allocation). Throws {@link CorruptValueError}
 * (STORE_CORRUPT) naming the key and the field.
 */
export function decodeBlock(e: KVEntry, expectCidr: string): BlockValue {
  const r = parseJson(e);
  onlyKnown(e.key, r, BLOCK_FIELDS);
  if (r['cidr'] !== expectCidr) throw corrupt(e.key, `"cidr" must be ${JSON.stringify(expectCidr)}, got ${JSON.stringify(r['cidr'] ?? null)}`);
  const cidr = parseCIDR(expectCidr);
  if (cidr === null) throw corrupt(e.key, '"cidr" is not a CIDR');
  const size = Number(blockAddresses(cidr.ip.family, cidr.subnet.prefix));
  if (!isNat(r['rangeSet'])) throw corrupt(e.key, '"rangeSet" must be a non-negative integer');
  if (typeof r['node'] !== 'string' || !CNI_NAME_RE.test(r['node'])) throw corrupt(e.key, '"node" must be a node name');
  if (r['state'] !== 'owned' && r['state'] !== 'pendingRelease') throw corrupt(e.key, '"state" must be "owned" or "pendingRelease"');
  if (!isNat(r['seq'])) throw corrupt(e.key, '"seq" must be a non-negative integer');
  if (!isNat(r['next']) || r['next'] > size) throw corrupt(e.key, `"next" must be an integer from 0 to ${size}`);
  const allocs = r['allocs'];
  if (typeof allocs !== 'object' || allocs === null || Array.isArray(allocs)) throw corrupt(e.key, '"allocs" must be an object');
  const out: Record<string, AllocValue> = {};
  for (const [k, a] of Object.entries(allocs as Record<string, unknown>)) {
    if (!/^(0|[1-9][0-9]*)$/.test(k) || Number(k) >= size) throw corrupt(e.key, `allocation ordinal ${JSON.stringify(k)} is not an ordinal of a block of ${size} addresses`);
    const x = a as Record<string, unknown> | null;
    if (typeof x !== 'object' || x === null || Array.isArray(x)) throw corrupt(e.key, `allocation ${k} must be an object`);
    onlyKnown(e.key, x, x['reserve'] !== undefined ? RESERVE_FIELDS : ALLOC_FIELDS, `allocation ${k}: `);
    if (x['reserve'] !== undefined) {
      // A reserve entry of the block's owner (ipam.pool.offline): no container, exactly this shape.
      if (x['reserve'] !== true || x['id'] !== '' || x['ifname'] !== '') throw corrupt(e.key, `allocation ${k}: a reserve entry must have "reserve":true and an empty "id" and "ifname"`);
      if (x['node'] !== r['node']) throw corrupt(e.key, `allocation ${k}: a reserve entry's "node" must be the block's node`);
      if (!isNat(x['seq']) || x['seq'] < 1 || x['seq'] > (r['seq'] as number)) throw corrupt(e.key, `allocation ${k}: "seq" must be an integer from 1 to the block's seq ${r['seq'] as number}`);
      if (typeof x['at'] !== 'number' || !Number.isFinite(x['at'])) throw corrupt(e.key, `allocation ${k}: "at" must be a number`);
      out[k] = { id: '', ifname: '', node: r['node'], seq: x['seq'], at: x['at'], reserve: true };
      continue;
    }
    if (typeof x['id'] !== 'string' || !CNI_NAME_RE.test(x['id'])) throw corrupt(e.key, `allocation ${k}: "id" must be a container ID`);
    if (typeof x['ifname'] !== 'string' || x['ifname'] === '') throw corrupt(e.key, `allocation ${k}: "ifname" must be a non-empty string`);
    if (typeof x['node'] !== 'string' || !CNI_NAME_RE.test(x['node'])) throw corrupt(e.key, `allocation ${k}: "node" must be a node name`);
    if (!isNat(x['seq']) || x['seq'] < 1 || x['seq'] > (r['seq'] as number)) throw corrupt(e.key, `allocation ${k}: "seq" must be an integer from 1 to the block's seq ${r['seq'] as number}`);
    if (typeof x['at'] !== 'number' || !Number.isFinite(x['at'])) throw corrupt(e.key, `allocation ${k}: "at" must be a number`);
    out[k] = { id: x['id'], ifname: x['ifname'], node: x['node'], seq: x['seq'], at: x['at'] };
  }
  const wanted = r['wanted'] === undefined ? undefined : decodeWanted(e.key, r['wanted'], size);
  return { v: 1, cidr: expectCidr, rangeSet: r['rangeSet'], node: r['node'], state: r['state'], seq: r['seq'], next: r['next'], allocs: out, ...(wanted === undefined ? {} : { wanted }) };
}

/** A block's `"wanted"` decoded exactly: a non-empty object of ordinal → `{"sandbox","node","at"}`. */
function decodeWanted(key: string, w: unknown, size: number): Record<string, WantValue> {
  if (typeof w !== 'object' || w === null || Array.isArray(w) || Object.keys(w).length === 0) throw corrupt(key, '"wanted" must be a non-empty object');
  const out: Record<string, WantValue> = {};
  for (const [k, v] of Object.entries(w as Record<string, unknown>)) {
    if (!/^(0|[1-9][0-9]*)$/.test(k) || Number(k) >= size) throw corrupt(key, `want ordinal ${JSON.stringify(k)} is not an ordinal of a block of ${size} addresses`);
    const x = v as Record<string, unknown> | null;
    if (typeof x !== 'object' || x === null || Array.isArray(x)) throw corrupt(key, `want ${k} must be an object`);
    onlyKnown(key, x, WANT_FIELDS, `want ${k}: `);
    if (typeof x['sandbox'] !== 'string' || !CNI_NAME_RE.test(x['sandbox'])) throw corrupt(key, `want ${k}: "sandbox" must be a container ID`);
    if (typeof x['node'] !== 'string' || !CNI_NAME_RE.test(x['node'])) throw corrupt(key, `want ${k}: "node" must be a node name`);
    if (typeof x['at'] !== 'number' || !Number.isFinite(x['at'])) throw corrupt(key, `want ${k}: "at" must be a number`);
    out[k] = { sandbox: x['sandbox'], node: x['node'], at: x['at'] };
  }
  return out;
}

/**
 * Decode a handle value exactly (the fields of {@link HandleValue} and of its `ips`, no other).
 * Throws {@link CorruptValueError} (STORE_CORRUPT) naming the key and the field.
 */
export function decodeHandle(e: KVEntry): HandleValue {
  const r = parseJson(e);
  onlyKnown(e.key, r, HANDLE_FIELDS);
  if (typeof r['node'] !== 'string') throw corrupt(e.key, '"node" must be a string');
  if (typeof r['network'] !== 'string') throw corrupt(e.key, '"network" must be a string');
  if (typeof r['at'] !== 'number') throw corrupt(e.key, '"at" must be a number');
  if (!Array.isArray(r['ips'])) throw corrupt(e.key, '"ips" must be an array');
  if (r['deleted'] !== undefined && (r['deleted'] !== true || r['ips'].length !== 0)) throw corrupt(e.key, '"deleted" must be true, with "ips" empty');
  const ips: HandleIP[] = r['ips'].map((x: unknown, i: number) => {
    const o = x as Record<string, unknown> | null;
    if (typeof o !== 'object' || o === null || Array.isArray(o)) throw corrupt(e.key, `ips[${i}] must be an object`);
    onlyKnown(e.key, o, HANDLE_IP_FIELDS, `ips[${i}]: `);
    const ip = typeof o['ip'] === 'string' ? parseIP(o['ip']) : null;
    if (ip === null || formatIP(ip) !== o['ip']) throw corrupt(e.key, `ips[${i}].ip must be a canonical IP`);
    if (typeof o['block'] !== 'string' || !/^[0-9a-f.:]+-[0-9]{1,3}$/.test(o['block'])) throw corrupt(e.key, `ips[${i}].block must be a block key`);
    if (!isNat(o['ordinal']) || !isNat(o['seq']) || !isNat(o['rangeSet'])) throw corrupt(e.key, `ips[${i}]: "ordinal", "seq" and "rangeSet" must be non-negative integers`);
    return { ip: o['ip'] as string, block: o['block'], ordinal: o['ordinal'], seq: o['seq'], rangeSet: o['rangeSet'] };
  });
  if (r['host'] !== undefined && (typeof r['host'] !== 'string' || r['host'] === '' || r['host'].length > 253)) throw corrupt(e.key, '"host" must be a host name');
  return { v: 1, node: r['node'], network: r['network'], at: r['at'], ips, ...(typeof r['host'] === 'string' ? { host: r['host'] } : {}), ...(r['deleted'] === true ? { deleted: true as const } : {}) };
}

/**
 * Decode an affinity value (`nodes/<node>/blocks/<block>` → `{"v":1,"rangeSet":N}`) exactly; returns
 * the range set index. Throws {@link CorruptValueError} (STORE_CORRUPT) naming the key.
 */
export function decodeAffinity(e: KVEntry): number {
  const r = parseJson(e);
  onlyKnown(e.key, r, AFFINITY_FIELDS);
  if (!isNat(r['rangeSet'])) throw corrupt(e.key, '"rangeSet" must be a non-negative integer');
  return r['rangeSet'];
}

/** The CIDR text of a block key (`10.80.0.64-26` → `10.80.0.64/26`), or null. */
export function blockKeyCidr(key: string): string | null {
  const m = /^(.+)-([0-9]{1,3})$/.exec(key);
  if (m === null) return null;
  const c = parseCIDR(`${m[1] as string}/${m[2] as string}`);
  return c === null || formatIP(c.ip) !== m[1] || c.ip.value !== c.subnet.ip.value ? null : `${m[1] as string}/${m[2] as string}`;
}

/** The value of a pool's cluster pin (`meta-cluster`): `{"v":1,"clusterId":"<hex>"}`. */
export function clusterPinValue(clusterId: string): string {
  return JSON.stringify({ v: POOL_VALUE_VERSION, clusterId });
}

/** The cluster ID of a pin value; STORE_CORRUPT naming the key when it is not one. */
export function decodeClusterPin(e: KVEntry): string {
  const r = parseJson(e);
  const id = r['clusterId'];
  if (typeof id !== 'string' || !/^[0-9a-f]{1,16}$/.test(id)) throw corrupt(e.key, '"clusterId" must be a cluster ID (1 to 16 lower-case hex digits)');
  for (const k of Object.keys(r)) if (k !== 'v' && k !== 'clusterId') throw corrupt(e.key, `unknown field ${JSON.stringify(k)}`);
  return id;
}

/** The canonical description of a pool's layout, stored in `meta`. */
export function metaOf(rangeSets: readonly RangeSet[], sizes: BlockSizes): string {
  return JSON.stringify({
    v: POOL_VALUE_VERSION,
    rangeSets: rangeSets.map((rs) =>
      rs.map((r) => ({
        subnet: `${formatIP(r.subnet.ip)}/${r.subnet.prefix}`,
        rangeStart: formatIP(r.rangeStart),
        rangeEnd: formatIP(r.rangeEnd),
        gateway: formatIP(r.gateway),
      })),
    ),
    blockSize: sizes.blockSize4,
    blockSize6: sizes.blockSize6,
  });
}

/**
 * A copy of a block value that can be changed without touching `b`: its fields and its `allocs`
 * map are copied, the allocations themselves shared — they are never changed in place (an
 * {@link AllocValue} is readonly: an allocation is added, replaced or deleted as a whole). What
 * the allocator's block cache hands out and keeps (issue 18 item 5): for a full /26 block (≈ 9 KB
 * of JSON, 62 allocations) ≈ 1 µs against 250–560 µs for `structuredClone` (and 240–420 µs for
 * {@link decodeBlock}) on the project's VM.
 */
export function copyBlock(b: BlockValue): BlockValue {
  return { ...b, allocs: { ...b.allocs } };
}

/**
 * A block's value as written (`JSON.stringify` of {@link BlockValue}, fields in its order;
 * `wanted` only when it holds a want).
 */
export function encodeBlock(b: BlockValue): string {
  if (b.wanted !== undefined && Object.keys(b.wanted).length === 0) {
    const { wanted: _, ...rest } = b;
    void _;
    return JSON.stringify(rest);
  }
  return JSON.stringify(b);
}

/** A handle's value as written (`JSON.stringify` of {@link HandleValue}, fields in its order). */
export function encodeHandle(h: HandleValue): string {
  return JSON.stringify(h);
}

/** A DEL's tombstone handle: `{"v":1,"node","network","at","ips":[],"deleted":true}` (at: ms since the epoch). */
export function tombstoneValue(node: string, network: string, at: number): string {
  return JSON.stringify({ v: 1, node, network, at, ips: [], deleted: true });
}

/** An affinity's value: `{"v":1,"rangeSet":N}`. */
export function affinityValue(rangeSet: number): string {
  return JSON.stringify({ v: 1, rangeSet });
}

/** The value of a removal marker and of its veto window: `{"v":1,"node","at"}` (at: ms since the epoch). */
export function removalMarkerValue(node: string, at: number, by?: string): string {
  return JSON.stringify({ v: 1, node, at, ...(by === undefined ? {} : { by }) });
}

/**
 * The node whose daemon began a removal automatically: the marker value's `by`
 * (`{"v":1,"node","at","by"}`, src/pool/auto-reclaim.ts), or null — an operator's marker (no
 * `by`) or a value that does not parse (a marker is never decoded strictly: only its existence
 * and revision decide anything).
 */
export function markerBy(value: string): string | null {
  try {
    const v = JSON.parse(value) as unknown;
    const by = typeof v === 'object' && v !== null ? (v as Record<string, unknown>)['by'] : undefined;
    return typeof by === 'string' ? by : null;
  } catch {
    return null;
  }
}

/**
 * A heartbeat's value: `{"v":1,"node","since"}` and, when the writer is known, `"host","pid"`
 * (read back by {@link heartbeatWriter}); `"source"` where the daemon knows the pool from (src/pool/status.ts `heartbeatSource`). `since`: ms since the epoch.
 */
export function heartbeatValue(node: string, since: number, writer?: { readonly host: string; readonly pid: number }, source?: 'cni-config' | 'requests'): string {
  return JSON.stringify({ v: 1, node, since, ...(writer === undefined ? {} : { host: writer.host, pid: writer.pid }), ...(source === undefined ? {} : { source }) });
}

/** The settings value a node's daemon writes: `{"v":1,"offlineSeconds":S}`. */
export function settingsValue(offlineSeconds: number): string {
  return JSON.stringify({ v: 1, offlineSeconds });
}

/**
 * Decode a node's settings key. Throws `STORE_CORRUPT` naming the key and the field (an
 * unreadable value is never read as "no offline": that would shorten the veto window).
 */
export function decodeSettings(e: KVEntry): number {
  let o: unknown;
  try {
    o = JSON.parse(e.value);
  } catch {
    throw new AppError('STORE_CORRUPT', `etcd key ${e.key}: not valid JSON`);
  }
  const r = o as Record<string, unknown> | null;
  if (typeof r !== 'object' || r === null || Array.isArray(r)) throw new AppError('STORE_CORRUPT', `etcd key ${e.key}: not a JSON object`);
  if (r['v'] !== 1) throw new AppError('STORE_CORRUPT', `etcd key ${e.key}: unknown value version ${JSON.stringify(r['v'] ?? null)} (this ipwarden writes 1)`);
  const s = r['offlineSeconds'];
  if (typeof s !== 'number' || !Number.isSafeInteger(s) || s < 0) throw new AppError('STORE_CORRUPT', `etcd key ${e.key}: "offlineSeconds" must be a non-negative integer`);
  return s;
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
