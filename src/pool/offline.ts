/**
 * Offline allocation in a cluster pool (issue 11 "A partitioned node keeps allocating from the
 * blocks it owns, and never from others'"; docs/cluster.md "Offline allocation"): the pure part.
 * Values in, values out; no I/O and no clock of its own (the caller passes monotonic times).
 *
 * - **Reserve entries**: allocations in the node's own blocks marked `"reserve":true`
 *   (`{"id":"","ifname":"","node":"<node>","seq":N,"at":ms,"reserve":true}`): taken by nobody
 *   (they are allocations), released by nobody but the node's own sync (which turns one into a
 *   container's allocation) and `pool remove-node --finish` (which deletes the node's blocks). The
 *   empty `id` and `ifname` match no container (a CNI container ID is `[A-Za-z0-9_.-]+`), and an
 *   older ipwarden reads them as `STORE_CORRUPT`: it fails closed, never hands them out.
 * - **Settings** `P/pools/<pool>/nodes/<node>/settings` → `{"v":1,"offlineSeconds":S}` (no lease):
 *   what `pool remove-node` step 1 reads to size its veto window ({@link removalWindowSeconds}).
 * - **Journal entries**: one file per attachment allocated (or released) offline, synced to etcd
 *   on reconnect ({@link encodeJournalEntry}, {@link decodeJournalEntry}).
 */
import { createHash } from 'node:crypto';
import { AppError } from '../common/errors.ts';
import { formatIP, parseCIDR, parseIP } from '../common/ip.ts';
import { CNI_NAME_RE } from '../common/names.ts';
import { blockAddresses, ordinalIP } from './blocks.ts';
import { decodePoolConfig, type PoolConfig } from '../ipam/pool-config.ts';
import { rangeFor } from '../ipam/range.ts';
import type { RangeSet } from '../ipam/types.ts';

/** One reserve entry of the node: where it is, its sequence number, its address (canonical text). */
export interface ReserveSlot {
  /** Block key text (`10.80.0.64-26`). */
  readonly block: string;
  /** Ordinal in the block. */
  readonly ordinal: number;
  /** The reserve entry's sequence number (a converted or re-made entry has another). */
  readonly seq: number;
  readonly rangeSet: number;
  /** Canonical IP text. */
  readonly ip: string;
}

/** Identity of a reserve entry (block, ordinal, sequence number) as one string. */
export function slotKey(s: Pick<ReserveSlot, 'block' | 'ordinal' | 'seq'>): string {
  return `${s.block}#${s.ordinal}#${s.seq}`;
}

/** Extra seconds of the veto window beyond twice the node's offline seconds (heartbeat and request slack). */
export const WINDOW_SLACK_SECONDS = 10;

/**
 * The veto window of `pool remove-node` step 1 for a node that announced `offlineSeconds` S
 * (null: none): `max(min, 2·S + 10)` seconds. Why it is enough (docs/cluster.md "Why offline
 * allocation is safe"): the node allocates offline only within S seconds (its monotonic clock) of
 * the send time of a request that read `removing/<node>` absent; the marker is created after that
 * read, so `--finish` (the window key's lease gone, which never happens early) comes ≥ 2·S + 10
 * seconds after it — twice S covers a monotonic clock running up to 2× slow against etcd's.
 */
export function removalWindowSeconds(offlineSeconds: number | null, min: number): number {
  return offlineSeconds === null ? min : Math.max(min, 2 * offlineSeconds + WINDOW_SLACK_SECONDS);
}

/**
 * May the node allocate offline now? True when a contact was confirmed (`lastContact`, the send
 * time of the last request that compared or read `removing/<node>` absent, monotonic
 * milliseconds) less than `seconds` ago at `now` (same clock). Null = never confirmed (a daemon
 * just started: the monotonic clock does not survive a restart, so a restarted node never
 * allocates offline before it reached etcd once).
 */
export function withinBudget(lastContact: number | null, now: number, seconds: number): boolean {
  return lastContact !== null && now - lastContact < seconds * 1000 && now >= lastContact;
}

/**
 * One reserve entry per range set `0 … rangeSets-1` from `view` (the node's reserve entries as
 * last read from etcd), skipping those in `used` ({@link slotKey}s of journaled attachments and
 * of entries converted since `view` was read); lowest address first. Null when some range set has
 * none left.
 */
export function pickReserve(view: readonly ReserveSlot[], used: ReadonlySet<string>, rangeSets: number): ReserveSlot[] | null {
  const out: ReserveSlot[] = [];
  for (let s = 0; s < rangeSets; s++) {
    const free = view.filter((x) => x.rangeSet === s && !used.has(slotKey(x))).sort((a, b) => (a.block === b.block ? a.ordinal - b.ordinal : a.block < b.block ? -1 : 1));
    const first = free[0];
    if (first === undefined) return null;
    out.push(first);
  }
  return out;
}

/** How many entries of `view` per range set are not in `used` (index = range set). */
export function reserveLeft(view: readonly ReserveSlot[], used: ReadonlySet<string>, rangeSets: number): number[] {
  const n = Array.from({ length: rangeSets }, () => 0);
  for (const x of view) if (!used.has(slotKey(x)) && x.rangeSet < rangeSets) n[x.rangeSet] = (n[x.rangeSet] as number) + 1;
  return n;
}

/** A journal entry: an attachment allocated offline (`add`) or released offline after that (`del`). */
export interface JournalEntry {
  readonly v: 1;
  /** `add`: the container holds `ips` (reserve entries, to be turned into its allocation); `del`: it was released offline (sync = a DEL in etcd). */
  readonly kind: 'add' | 'del';
  readonly pool: PoolConfig;
  /** The network config's name (recorded in the handle). */
  readonly network: string;
  /** The node that allocated it. */
  readonly node: string;
  readonly containerId: string;
  readonly ifname: string;
  /** Wall clock when written, ms since the epoch (informational). */
  readonly at: number;
  /**
   * `add`: one reserve slot per range set. `del`: the slots still held back — `[]` when they went
   * back to the local reserve at once (no sync of the entry had been sent: they are surely still
   * reserve entries), else the `add` entry's slots (a sync whose outcome is unknown may have made
   * them the container's allocations, which the DEL's sync then frees in etcd): never handed out
   * again before a refill has re-read them.
   */
  readonly ips: readonly ReserveSlot[];
}

/** The pool config as an `ipam.pool` object (what {@link decodePoolConfig} reads back). */
function poolObject(p: PoolConfig): Record<string, unknown> {
  return {
    name: p.name,
    etcd: {
      endpoints: p.etcd.endpoints,
      ...(p.etcd.tls === null ? {} : { tls: p.etcd.tls }),
      prefix: p.etcd.prefix,
      ...(p.etcd.credentials === undefined || p.etcd.credentials === null ? {} : { credentials: p.etcd.credentials }),
    },
    blockSize: p.blockSize4,
    blockSize6: p.blockSize6,
    ...(p.offline === undefined || p.offline === null ? {} : { offline: p.offline }),
  };
}

/** The journal file name of (pool, containerId, ifname): `<sha256 hex>.json` (no input text in a path). */
export function journalName(pool: PoolConfig, containerId: string, ifname: string): string {
  return createHash('sha256').update(JSON.stringify([pool.etcd.endpoints, pool.etcd.prefix, pool.name, containerId, ifname])).digest('hex') + '.json';
}

/** The file text of `e` (JSON, one line, newline-terminated). */
export function encodeJournalEntry(e: JournalEntry): string {
  return (
    JSON.stringify({
      v: 1,
      kind: e.kind,
      pool: { ...poolObject(e.pool), ...(e.pool.nodeName === null ? {} : { nodeName: e.pool.nodeName }) },
      network: e.network,
      node: e.node,
      containerId: e.containerId,
      ifname: e.ifname,
      at: e.at,
      ips: e.ips.map((x) => ({ ip: x.ip, block: x.block, ordinal: x.ordinal, seq: x.seq, rangeSet: x.rangeSet })),
    }) + '\n'
  );
}

const isNat = (v: unknown): v is number => typeof v === 'number' && Number.isSafeInteger(v) && v >= 0;

/**
 * Decode a journal file's text (`file` names it in errors). Throws `STORE_CORRUPT`
 * (`pool journal <file>: <why>`): a journal entry that cannot be read is kept for an operator,
 * never dropped (it may be an address a running pod holds).
 */
export function decodeJournalEntry(text: string, file: string): JournalEntry {
  const bad = (why: string): AppError => new AppError('STORE_CORRUPT', `pool journal ${file}: ${why}`);
  let o: unknown;
  try {
    o = JSON.parse(text);
  } catch {
    throw bad('not valid JSON');
  }
  const r = o as Record<string, unknown> | null;
  if (typeof r !== 'object' || r === null || Array.isArray(r)) throw bad('not a JSON object');
  if (r['v'] !== 1) throw bad(`unknown version ${JSON.stringify(r['v'] ?? null)} (this ipwarden writes 1)`);
  if (r['kind'] !== 'add' && r['kind'] !== 'del') throw bad('"kind" must be "add" or "del"');
  const po = r['pool'] as Record<string, unknown> | null;
  if (typeof po !== 'object' || po === null || Array.isArray(po)) throw bad('"pool" must be an object');
  let pool: PoolConfig | null;
  try {
    const { nodeName, ...rest } = po;
    pool = decodePoolConfig({ pool: rest, ...(nodeName === undefined ? {} : { nodeName }) });
  } catch (e) {
    throw bad(`"pool": ${e instanceof Error ? e.message : String(e)}`);
  }
  if (pool === null) throw bad('"pool" must be an object');
  for (const k of ['network', 'node', 'containerId'] as const) {
    if (typeof r[k] !== 'string' || !CNI_NAME_RE.test(r[k])) throw bad(`"${k}" must be a name of letters, digits, '_', '.' or '-'`);
  }
  if (typeof r['ifname'] !== 'string' || r['ifname'] === '' || r['ifname'].includes('/')) throw bad('"ifname" must be an interface name');
  if (typeof r['at'] !== 'number' || !Number.isFinite(r['at'])) throw bad('"at" must be a number');
  if (!Array.isArray(r['ips'])) throw bad('"ips" must be an array');
  const ips: ReserveSlot[] = r['ips'].map((x: unknown, i: number) => {
    const s = x as Record<string, unknown> | null;
    if (typeof s !== 'object' || s === null) throw bad(`ips[${i}] must be an object`);
    const ip = typeof s['ip'] === 'string' ? parseIP(s['ip']) : null;
    if (ip === null || formatIP(ip) !== s['ip']) throw bad(`ips[${i}].ip must be a canonical IP`);
    if (typeof s['block'] !== 'string' || !/^[0-9a-f.:]+-[0-9]{1,3}$/.test(s['block'])) throw bad(`ips[${i}].block must be a block key`);
    if (!isNat(s['ordinal']) || !isNat(s['seq']) || !isNat(s['rangeSet'])) throw bad(`ips[${i}]: "ordinal", "seq" and "rangeSet" must be non-negative integers`);
    // Review F7: the address must be the block's network address + the ordinal (the sync writes
    // the handle's text from `ip` and the block's allocation from `ordinal`: they must agree).
    const m = /^(.+)-([0-9]{1,3})$/.exec(s['block']) as RegExpExecArray;
    const cidr = parseCIDR(`${m[1] as string}/${m[2] as string}`);
    if (cidr === null || formatIP(cidr.ip) !== m[1] || cidr.ip.value !== cidr.subnet.ip.value) throw bad(`ips[${i}].block ${JSON.stringify(s['block'])} is not a block's network address and prefix`);
    if (BigInt(s['ordinal']) >= blockAddresses(cidr.subnet.ip.family, cidr.subnet.prefix)) throw bad(`ips[${i}].ordinal ${s['ordinal']} is outside block ${s['block']}`);
    const want = formatIP(ordinalIP(cidr.subnet, s['ordinal']));
    if (want !== s['ip']) throw bad(`ips[${i}].ip ${s['ip'] as string} is not ordinal ${s['ordinal']} of block ${s['block']} (that is ${want})`);
    return { ip: s['ip'] as string, block: s['block'], ordinal: s['ordinal'], seq: s['seq'], rangeSet: s['rangeSet'] };
  });
  if (r['kind'] === 'add' && ips.length === 0) throw bad('an "add" entry must name its addresses');
  const slots = new Set(ips.map((x) => `${x.block}#${x.ordinal}`));
  if (slots.size !== ips.length) throw bad('"ips" names one address twice');
  if (new Set(ips.map((x) => x.rangeSet)).size !== ips.length) throw bad('"ips" names one range set twice (one address per range set)');
  return { v: 1, kind: r['kind'], pool, network: r['network'] as string, node: r['node'] as string, containerId: r['containerId'] as string, ifname: r['ifname'], at: r['at'], ips };
}

/**
 * Are two pool configs the same pool with the same layout: name, etcd endpoints and prefix,
 * block sizes (what decides which keys and addresses a journal entry names)? TLS files and the
 * `offline` settings may differ (they change no address). Pure.
 */
export function samePoolConfig(a: PoolConfig, b: PoolConfig): boolean {
  const id = (p: PoolConfig): string => JSON.stringify([p.name, p.etcd.endpoints, p.etcd.prefix, p.blockSize4, p.blockSize6]);
  return id(a) === id(b);
}

/**
 * Does journal entry `e` fit the network config it is answered and synced with (review F7)?
 * null when it does, else why not: the pool config must equal `pool` (the current one), an
 * `add` entry must name exactly one address per range set of `rangeSets` (the config's), and
 * each address must lie in its range set. Pure.
 */
export function journalEntryMisfit(e: JournalEntry, pool: PoolConfig, rangeSets: readonly RangeSet[] | null): string | null {
  if (!samePoolConfig(e.pool, pool)) return 'its pool config differs from the current one';
  if (rangeSets === null) return null;
  if (e.kind === 'add' && e.ips.length !== rangeSets.length) return `it names ${e.ips.length} addresses for ${rangeSets.length} range sets`;
  for (const x of e.ips) {
    const rs = rangeSets[x.rangeSet];
    const ip = parseIP(x.ip);
    if (rs === undefined || ip === null || rangeFor(rs, ip) < 0) return `${x.ip} is not in range set ${x.rangeSet} of the config`;
  }
  return null;
}

/** Counters of one pool and node's offline allocation (the metrics engineer's interface; see `PoolSessions.offlineStats`). */
export interface OfflineCounters {
  /** ADDs answered from the reserve while etcd was unreachable (repeated ADDs answered from the journal not counted). */
  offlineAdds: number;
  /** DELs of journaled attachments answered while etcd was unreachable. */
  offlineDels: number;
  /** Journal entries synced to etcd (turned into handles, or released). */
  synced: number;
  /** Journal entries whose sync failed for good (their reserve entry is gone: `--finish` ran): counted once per entry. */
  syncFailures: number;
}
