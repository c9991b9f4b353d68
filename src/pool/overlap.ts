/**
 * Overlapping pools refused (docs/cluster.md "Overlapping pools"): the pools of one etcd prefix
 * must not share an address, and every network naming a pool must describe the layout recorded
 * in its `meta` (the same ranges and block sizes).
 *
 * Keys (`P` = `ipam.pool.etcd.prefix`):
 *
 * - `P/pools/<pool>/meta` (written by the allocator, create-only): the pool's layout,
 *   `{"v":1,"rangeSets":[[{"subnet","rangeStart","rangeEnd","gateway"}]],"blockSize","blockSize6"}`;
 * - `P/pool-ranges` (this module): the index of the prefix's pools and their ranges,
 *   `{"v":1,"pools":{"<pool>":[{"subnet","rangeStart","rangeEnd"}]}}` ({@link encodeRegistry},
 *   {@link decodeRegistry}). Every transaction that creates a pool's `meta` compares its revision
 *   (or its absence) and rewrites it, so two pools created at once are serialised by etcd: the
 *   second one's compare fails, it re-reads and sees the first (at most one of two overlapping
 *   pools is created; no lock, no lease). It is written from a scan of every `meta` key of the
 *   prefix (the truth), so it also lists pools created by a version that did not write it.
 *
 * Pure functions plus three over a {@link KV}: {@link createGuard} (the create transaction's
 * compares and writes), {@link existingGuard} (an existing pool: refused when an earlier-created
 * pool overlaps it) and {@link prefixOverlaps} (every overlapping pair, for `pool status` and
 * `doctor`).
 */
import { AppError } from '../common/errors.ts';
import { formatIP, formatSubnet, parseCIDR, parseIP } from '../common/ip.ts';
import { CNI_NAME_RE } from '../common/names.ts';
import { canonicalizeRangeSet, rangesOverlap } from '../ipam/range.ts';
import type { Range, RangeSet } from '../ipam/types.ts';
import type { KV, KVCompare, KVEntry, KVOp } from '../store/kv.ts';

/** Value version of `P/pool-ranges` (the same as every pool value). */
const VERSION = 1;

/** The key of the prefix's pool index: `<prefix>/pool-ranges`. */
export function registryKey(prefix: string): string {
  return `${prefix}/pool-ranges`;
}

/** The key of `pool`'s `meta`: `<prefix>/pools/<pool>/meta`. */
export function metaKeyOf(prefix: string, pool: string): string {
  return `${prefix}/pools/${pool}/meta`;
}

/** A pool's layout as recorded in its `meta`. */
export interface PoolLayout {
  readonly rangeSets: readonly RangeSet[];
  /** IPv4 block prefix length. */
  readonly blockSize: number;
  /** IPv6 block prefix length. */
  readonly blockSize6: number;
}

function corrupt(key: string, why: string): AppError {
  return new AppError('STORE_CORRUPT', `etcd key ${key}: ${why}`);
}

function object(e: KVEntry): Record<string, unknown> {
  let o: unknown;
  try {
    o = JSON.parse(e.value);
  } catch {
    throw corrupt(e.key, 'not valid JSON');
  }
  if (typeof o !== 'object' || o === null || Array.isArray(o)) throw corrupt(e.key, 'not a JSON object');
  const r = o as Record<string, unknown>;
  if (r['v'] !== VERSION) throw corrupt(e.key, `unknown value version ${JSON.stringify(r['v'] ?? null)} (this ipwarden writes ${VERSION})`);
  return r;
}

function onlyKnown(key: string, o: Record<string, unknown>, known: readonly string[], where = ''): void {
  for (const f of Object.keys(o)) if (!known.includes(f)) throw corrupt(key, `${where}unknown field ${JSON.stringify(f)} (known: ${known.join(', ')})`);
}

const META_FIELDS = ['v', 'rangeSets', 'blockSize', 'blockSize6'] as const;
const META_RANGE_FIELDS = ['subnet', 'rangeStart', 'rangeEnd', 'gateway'] as const;
const RANGE_FIELDS = ['subnet', 'rangeStart', 'rangeEnd'] as const;

/** Canonical text of a range's field, or null. */
function ipText(v: unknown): string | null {
  if (typeof v !== 'string') return null;
  const ip = parseIP(v);
  return ip !== null && formatIP(ip) === v ? v : null;
}

/**
 * Decode a `meta` value exactly (every value `metaOf` of src/pool/allocator.ts has written reads
 * back): the range sets canonicalised as host-local does, the block sizes.
 * @throws AppError STORE_CORRUPT `etcd key <key>: <why>` when it is not such a value
 */
export function decodeLayout(e: KVEntry): PoolLayout {
  const r = object(e);
  onlyKnown(e.key, r, META_FIELDS);
  const bs = r['blockSize'];
  const bs6 = r['blockSize6'];
  if (typeof bs !== 'number' || !Number.isInteger(bs) || bs < 0 || bs > 32) throw corrupt(e.key, '"blockSize" must be an integer from 0 to 32');
  if (typeof bs6 !== 'number' || !Number.isInteger(bs6) || bs6 < 0 || bs6 > 128) throw corrupt(e.key, '"blockSize6" must be an integer from 0 to 128');
  const sets = r['rangeSets'];
  if (!Array.isArray(sets) || sets.length === 0) throw corrupt(e.key, '"rangeSets" must be a non-empty array');
  const rangeSets = sets.map((rs: unknown, i: number) => {
    if (!Array.isArray(rs)) throw corrupt(e.key, `rangeSets[${i}] must be an array`);
    const raws = rs.map((x: unknown, j: number) => {
      if (typeof x !== 'object' || x === null || Array.isArray(x)) throw corrupt(e.key, `rangeSets[${i}][${j}] must be an object`);
      const o = x as Record<string, unknown>;
      onlyKnown(e.key, o, META_RANGE_FIELDS, `rangeSets[${i}][${j}]: `);
      const subnet = typeof o['subnet'] === 'string' ? parseCIDR(o['subnet']) : null;
      const [start, end, gw] = [ipText(o['rangeStart']), ipText(o['rangeEnd']), ipText(o['gateway'])];
      if (subnet === null || start === null || end === null || gw === null) throw corrupt(e.key, `rangeSets[${i}][${j}]: "subnet", "rangeStart", "rangeEnd" and "gateway" must be canonical addresses`);
      return { subnet, rangeStart: parseIP(start), rangeEnd: parseIP(end), gateway: parseIP(gw) };
    });
    try {
      return canonicalizeRangeSet(raws);
    } catch (err) {
      throw corrupt(e.key, `rangeSets[${i}]: ${err instanceof Error ? err.message : String(err)}`);
    }
  });
  return { rangeSets, blockSize: bs, blockSize6: bs6 };
}

/** `10.80.0.0/16 10.80.0.1-10.80.255.254` (subnet, then the addresses handed out). */
export function rangeText(r: Range): string {
  return `${formatSubnet(r.subnet)} ${formatIP(r.rangeStart)}-${formatIP(r.rangeEnd)}`;
}

/**
 * A layout as messages name it: `ranges [10.80.0.0/16 10.80.0.1-10.80.255.254 gateway 10.80.0.1]
 * and block sizes /26 (IPv4) and /122 (IPv6)`; one `[…]` per range set, its ranges joined by `, `.
 */
export function layoutText(l: PoolLayout): string {
  const sets = l.rangeSets.map((rs) => `[${rs.map((r) => `${rangeText(r)} gateway ${formatIP(r.gateway)}`).join(', ')}]`).join(' ');
  return `ranges ${sets} and block sizes /${l.blockSize} (IPv4) and /${l.blockSize6} (IPv6)`;
}

/**
 * The refusal of a network whose layout is not the one recorded in the pool's `meta` (CNI 7):
 * `pool <p> is recorded in etcd with <layout of meta>, but network <n> has <its layout>: every
 * network naming pool <p> must have the same ranges and block sizes (the first to use the pool
 * recorded them in <meta key>)` — both layouts by {@link layoutText}. Its details carry both
 * values as JSON. A `meta` that cannot be decoded is STORE_CORRUPT instead.
 */
export function layoutMismatch(pool: string, network: string, meta: KVEntry, want: PoolLayout, wantJson: string): AppError {
  const have = decodeLayout(meta);
  return new AppError(
    'IPAM_INVALID_CONFIG',
    `pool ${pool} is recorded in etcd with ${layoutText(have)}, but network ${network} has ${layoutText(want)}: every network naming pool ${pool} must have the same ranges and block sizes (the first to use the pool recorded them in ${meta.key})`,
    { details: `etcd ${meta.key}: ${meta.value}; this config: ${wantJson}` },
  );
}

/** The ranges of a layout, flattened (the registry's and the overlap check's view: which addresses a pool hands out). */
export function rangesOf(l: { readonly rangeSets: readonly RangeSet[] }): Range[] {
  return l.rangeSets.flatMap((rs) => [...rs]);
}

/** The value of `P/pool-ranges` for `pools` (name → ranges), names sorted. */
export function encodeRegistry(pools: ReadonlyMap<string, readonly Range[]>): string {
  const out: Record<string, unknown> = {};
  for (const name of [...pools.keys()].sort()) {
    out[name] = (pools.get(name) as readonly Range[]).map((r) => ({ subnet: formatSubnet(r.subnet), rangeStart: formatIP(r.rangeStart), rangeEnd: formatIP(r.rangeEnd) }));
  }
  return JSON.stringify({ v: VERSION, pools: out });
}

/**
 * Decode `P/pool-ranges` exactly: pool name → its ranges (gateway = the range's start: unused here).
 * @throws AppError STORE_CORRUPT `etcd key <key>: <why>`
 */
export function decodeRegistry(e: KVEntry): Map<string, Range[]> {
  const r = object(e);
  onlyKnown(e.key, r, ['v', 'pools']);
  const pools = r['pools'];
  if (typeof pools !== 'object' || pools === null || Array.isArray(pools)) throw corrupt(e.key, '"pools" must be an object');
  const out = new Map<string, Range[]>();
  for (const [name, v] of Object.entries(pools as Record<string, unknown>)) {
    if (!CNI_NAME_RE.test(name)) throw corrupt(e.key, `pools: ${JSON.stringify(name)} is not a pool name`);
    if (!Array.isArray(v) || v.length === 0) throw corrupt(e.key, `pools.${name} must be a non-empty array`);
    out.set(
      name,
      v.map((x: unknown, i: number) => {
        if (typeof x !== 'object' || x === null || Array.isArray(x)) throw corrupt(e.key, `pools.${name}[${i}] must be an object`);
        const o = x as Record<string, unknown>;
        onlyKnown(e.key, o, RANGE_FIELDS, `pools.${name}[${i}]: `);
        const c = typeof o['subnet'] === 'string' ? parseCIDR(o['subnet']) : null;
        const [s, t] = [ipText(o['rangeStart']), ipText(o['rangeEnd'])];
        const start = s === null ? null : parseIP(s);
        const end = t === null ? null : parseIP(t);
        if (c === null || formatSubnet(c.subnet) !== o['subnet'] || start === null || end === null || start.family !== c.subnet.ip.family || end.family !== start.family || start.value > end.value) {
          throw corrupt(e.key, `pools.${name}[${i}]: "subnet", "rangeStart" and "rangeEnd" must be a canonical subnet and two of its addresses in order`);
        }
        return { subnet: c.subnet, rangeStart: start, rangeEnd: end, gateway: start };
      }),
    );
  }
  return out;
}

/** Two ranges that overlap: `ours` of the pool asked about, `theirs` of the other pool. */
export interface RangePair {
  readonly ours: Range;
  readonly theirs: Range;
}

/** Every pair of overlapping ranges of `a` × `b` (host-local's `Range.Overlaps`), in order. */
export function overlappingRanges(a: readonly Range[], b: readonly Range[]): RangePair[] {
  const out: RangePair[] = [];
  for (const x of a) for (const y of b) if (rangesOverlap(x, y)) out.push({ ours: x, theirs: y });
  return out;
}

/** `10.80.0.0/24 10.80.0.1-10.80.0.254 of pool b overlaps 10.80.0.0/16 10.80.0.1-10.80.255.254 of pool a` per pair, joined by `; `. */
export function pairsText(ours: string, theirs: string, pairs: readonly RangePair[]): string {
  return pairs.map((p) => `${rangeText(p.ours)} of pool ${ours} overlaps ${rangeText(p.theirs)} of pool ${theirs}`).join('; ');
}

/**
 * Every `meta` of the prefix: one keys-only read of `P/pools/` (every key of every pool: done only
 * when a pool is created or first registered, and by `pool status`/`doctor`), then each `meta`.
 * A `meta` that cannot be decoded is returned as its error.
 */
export async function scanLayouts(kv: KV, prefix: string): Promise<Map<string, { entry: KVEntry; layout: PoolLayout | AppError }>> {
  const base = `${prefix}/pools/`;
  const names = (await kv.list(base, { keysOnly: true }))
    .map((e) => /^([^/]+)\/meta$/.exec(e.key.slice(base.length))?.[1])
    .filter((n): n is string => n !== undefined && CNI_NAME_RE.test(n));
  const out = new Map<string, { entry: KVEntry; layout: PoolLayout | AppError }>();
  await Promise.all(
    names.map(async (n) => {
      const e = await kv.get(metaKeyOf(prefix, n));
      if (e === null) return; // deleted since the listing
      let layout: PoolLayout | AppError;
      try {
        layout = decodeLayout(e);
      } catch (err) {
        if (!(err instanceof AppError)) throw err;
        layout = err;
      }
      out.set(n, { entry: e, layout });
    }),
  );
  return out;
}

/** The registry value for the scanned pools (those whose `meta` decodes) plus `extra`. */
function registryOf(scan: Awaited<ReturnType<typeof scanLayouts>>, extra?: { pool: string; ranges: readonly Range[] }): string {
  const m = new Map<string, readonly Range[]>();
  for (const [n, x] of scan) if (!(x.layout instanceof AppError)) m.set(n, rangesOf(x.layout));
  if (extra !== undefined) m.set(extra.pool, extra.ranges);
  return encodeRegistry(m);
}

/** The refusal of a pool whose creation would overlap `others` (CNI 7). */
function createRefusal(pool: string, prefix: string, others: ReadonlyArray<[string, RangePair[]]>): AppError {
  const names = others.map(([n]) => `pool ${n}`).join(' and ');
  return new AppError(
    'IPAM_INVALID_CONFIG',
    `pool ${pool} is not created: its ranges overlap ${names} in etcd prefix ${prefix} (${others.map(([n, p]) => pairsText(pool, n, p)).join('; ')}); two pools would hand out the same addresses — give pool ${pool} ranges of its own`,
  );
}

/**
 * The refusal of an ADD in a pool that an earlier-created pool overlaps (CNI 7): `pool <b> overlaps
 * pool <a>, created before it, in etcd prefix <P> (<pairs>); no address is handed out from pool <b>
 * while they overlap — give pool <b> ranges of its own (its addresses in use are released by their
 * DELs)`.
 */
export function laterRefusal(pool: string, prefix: string, earlier: ReadonlyArray<[string, RangePair[]]>): AppError {
  const names = earlier.map(([n]) => `pool ${n}`).join(' and ');
  return new AppError(
    'IPAM_INVALID_CONFIG',
    `pool ${pool} overlaps ${names}, created before it, in etcd prefix ${prefix} (${earlier.map(([n, p]) => pairsText(pool, n, p)).join('; ')}); no address is handed out from pool ${pool} while they overlap — give pool ${pool} ranges of its own (its addresses in use are released by their DELs)`,
  );
}

/**
 * For the transaction that creates `pool`'s `meta` with `layout`: scan the prefix's pools, refuse
 * an overlap, and return the compare and the write that make the creation race-free —
 * `P/pool-ranges` at the revision read (or absent) and its new value listing every pool with this
 * one. Two creations at once both compare it: one fails and re-reads, and then sees the other.
 * @throws AppError IPAM_INVALID_CONFIG when another pool's ranges overlap (nothing is written);
 *   STORE_CORRUPT when another pool's `meta` cannot be read (an overlap cannot be ruled out), or
 *   when `P/pool-ranges` cannot be read (never rewritten: an operator deletes it,
 *   and the next creation writes it again from the scan); the KV's errors
 */
export async function createGuard(kv: KV, prefix: string, pool: string, layout: PoolLayout): Promise<{ compares: KVCompare[]; ops: KVOp[] }> {
  const key = registryKey(prefix);
  // The index first, then the scan: a pool created after this read moves the index, so the
  // compare below fails; one created before it is in the scan. (In parallel, a pool created
  // between a scan and a later index read would be missed.)
  const reg = await kv.get(key);
  if (reg !== null) decodeRegistry(reg);
  const scan = await scanLayouts(kv, prefix);
  const mine = rangesOf(layout);
  const hits: Array<[string, RangePair[]]> = [];
  for (const [n, x] of [...scan].sort((a, b) => (a[0] < b[0] ? -1 : 1))) {
    if (n === pool) continue;
    // A pool whose `meta` cannot be read (a newer version's value, a damaged key) may overlap this
    // one: when in doubt, the new pool is not created (review).
    if (x.layout instanceof AppError) throw new AppError('STORE_CORRUPT', `pool ${pool} is not created: the ranges of pool ${n} in ${prefix} cannot be read (${x.layout.message}), so an overlap with it cannot be ruled out — see docs/cluster.md "Corrupt keys"`);
    const p = overlappingRanges(mine, rangesOf(x.layout));
    if (p.length > 0) hits.push([n, p]);
  }
  if (hits.length > 0) throw createRefusal(pool, prefix, hits);
  return {
    compares: [reg === null ? { key, absent: true } : { key, modRevision: reg.modRevision }],
    ops: [{ put: key, value: registryOf(scan, { pool, ranges: mine }) }],
  };
}

/**
 * For an ADD (or a reserve refill) in the existing `pool` whose `meta` is `meta` (its layout
 * `layout`): refused when a pool created before it (a lower `meta` create revision) overlaps it —
 * a pair left by a version that did not refuse overlaps. One read of `P/pool-ranges`; when it is
 * absent or does not list this pool as its `meta` says, it is written from a scan of the prefix
 * (once per pool: a transaction comparing its revision and `meta`'s; after 4 lost races the
 * last scan decides). A listed overlap is confirmed on the other pool's `meta` (it may have been
 * deleted).
 * @throws AppError IPAM_INVALID_CONFIG ({@link laterRefusal}); the KV's errors. A
 *   `P/pool-ranges` that cannot be read is not rewritten: the prefix is scanned instead.
 */
export async function existingGuard(kv: KV, prefix: string, pool: string, meta: KVEntry, layout: PoolLayout): Promise<void> {
  const key = registryKey(prefix);
  const mine = rangesOf(layout);
  const same = (a: readonly Range[] | undefined): boolean => a !== undefined && encodeRegistry(new Map([['x', a]])) === encodeRegistry(new Map([['x', mine]]));
  const fromScan = (scan: Awaited<ReturnType<typeof scanLayouts>>): Map<string, Range[]> =>
    new Map([...scan].filter(([, x]) => !(x.layout instanceof AppError)).map(([n, x]) => [n, rangesOf(x.layout as PoolLayout)]));
  let listed: Map<string, Range[]> | null = null;
  let lastScan: Map<string, Range[]> | null = null;
  for (let i = 0; i < 4 && listed === null; i++) {
    const reg = await kv.get(key);
    let m: Map<string, Range[]> | null = null;
    try {
      m = reg === null ? null : decodeRegistry(reg);
    } catch (err) {
      if (!(err instanceof AppError) || err.code !== 'STORE_CORRUPT') throw err;
      listed = fromScan(await scanLayouts(kv, prefix));
      break;
    }
    if (m !== null && same(m.get(pool))) {
      listed = m;
      break;
    }
    // Not listed (a pool from before the index, or one re-created): list every pool of the prefix.
    const scan = await scanLayouts(kv, prefix);
    lastScan = fromScan(scan);
    const value = registryOf(scan, { pool, ranges: mine });
    const r = await kv.txn([reg === null ? { key, absent: true } : { key, modRevision: reg.modRevision }, { key: meta.key, modRevision: meta.modRevision }], [{ put: key, value }]);
    if (r.succeeded) listed = decodeRegistry({ ...meta, key, value });
    // else: another writer moved the index (or this meta) meanwhile: read again.
  }
  // Four lost races on the index (other pools created meanwhile): decided on the last scan, which
  // lists every pool created before this one's meta was read.
  listed ??= lastScan ?? new Map();
  const suspects = [...listed]
    .filter(([n]) => n !== pool)
    .map(([n, r]) => [n, overlappingRanges(mine, r)] as [string, RangePair[]])
    .filter(([, p]) => p.length > 0);
  if (suspects.length === 0) return;
  const earlier: Array<[string, RangePair[]]> = [];
  for (const [n] of suspects.sort((a, b) => (a[0] < b[0] ? -1 : 1))) {
    const e = await kv.get(metaKeyOf(prefix, n));
    if (e === null || BigInt(e.createRevision) >= BigInt(meta.createRevision)) continue;
    let other: PoolLayout;
    try {
      other = decodeLayout(e);
    } catch {
      continue;
    }
    const p = overlappingRanges(mine, rangesOf(other));
    if (p.length > 0) earlier.push([n, p]);
  }
  if (earlier.length > 0) throw laterRefusal(pool, prefix, earlier);
}

/** One overlapping pair of pools of a prefix: `later` was created after `earlier` (its ADDs are refused). */
export interface PoolOverlap {
  readonly earlier: string;
  readonly later: string;
  /** The overlapping ranges, `ours` of `later`, `theirs` of `earlier`, as {@link rangeText}. */
  readonly ranges: ReadonlyArray<{ readonly later: string; readonly earlier: string }>;
}

/**
 * Every overlapping pair of pools in `prefix`, read from every `meta` (a scan: the truth, whatever
 * `P/pool-ranges` lists), ordered by the later pool's name then the earlier's. With `pool`, only
 * the pairs it is in. For `pool status` and `doctor`; reads only.
 */
export async function prefixOverlaps(kv: KV, prefix: string, pool?: string): Promise<PoolOverlap[]> {
  const scan = [...(await scanLayouts(kv, prefix))].filter((x): x is [string, { entry: KVEntry; layout: PoolLayout }] => !(x[1].layout instanceof AppError));
  const out: PoolOverlap[] = [];
  for (const [a, x] of scan) {
    for (const [b, y] of scan) {
      if (a === b || BigInt(x.entry.createRevision) <= BigInt(y.entry.createRevision)) continue; // a is the later one
      if (pool !== undefined && pool !== a && pool !== b) continue;
      const p = overlappingRanges(rangesOf(x.layout), rangesOf(y.layout));
      if (p.length > 0) out.push({ later: a, earlier: b, ranges: p.map((q) => ({ later: rangeText(q.ours), earlier: rangeText(q.theirs) })) });
    }
  }
  return out.sort((p, q) => (p.later !== q.later ? (p.later < q.later ? -1 : 1) : p.earlier < q.earlier ? -1 : p.earlier > q.earlier ? 1 : 0));
}
