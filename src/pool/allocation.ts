/**
 * Allocation for one node (the allocator's first job; src/pool/allocator.ts composes it): ADD and
 * DEL, the daemon's rounds of ADDs and DELs (`batch`, `release`: one transaction per attempt), CHECK
 * (`find`), the reconciler's guarded release (`releaseIfSeq`) and the node's handles
 * (`handlesOf`). Each function takes the node's {@link AllocatorCore}. The rules are the module
 * comment of src/pool/allocator.ts.
 */
import { giveBackEmptied } from './stuck-block.ts';
import { holdsNothing } from './wanted.ts';
import { AppError } from '../common/errors.ts';
import { formatIP, parseCIDR } from '../common/ip.ts';
import { MAX_TXN_OPS, type KVCompare, type KVEntry, type KVOp } from '../store/kv.ts';
import { RangeExhaustedError } from '../ipam/allocator.ts';
import { blockAddresses, ordinalIP } from './blocks.ts';
import { Retry, runTxn, type Txn } from './txn.ts';
import {
  affinityValue,
  blockKeyCidr,
  copyBlock,
  corrupt,
  CorruptValueError,
  decodeAffinity,
  decodeBlock,
  decodeHandle,
  encodeBlock,
  encodeHandle,
  tombstoneValue,
  type AllocValue,
  type BlockValue,
  type HandleIP,
  type HandleValue,
} from './model.ts';
import { rangeSetSize, rangeSetString } from '../ipam/range.ts';
import type { RangeSet } from '../ipam/types.ts';
import { type AllocatorCore, type CachedBlock, fromCache, LostRace, MAX_ATTEMPTS, MAX_BATCH, type PoolAllocation, type PoolRequest, goneAddError, staleAddError, type Working } from './allocator-core.ts';
import { vetoIfMarked } from './veto.ts';

/** A batched DEL whose handle cannot be read: done alone after its round ({@link batch}). */
const ALONE = Symbol('alone');

/** A round's answers ({@link batch}): per ADD, per DEL ({@link ALONE}: its handle cannot be read). */
interface Round {
  adds: Array<PoolAllocation[] | AppError>;
  dels: Array<string[] | typeof ALONE>;
}

/**
 * ADD for a batch of requests of this node, in one transaction per attempt. Returns, per
 * request in order, its allocations (one per range set) or the AppError it failed with (a full
 * range set: host-local's `failed to allocate for range <i>: no IP addresses available in range
 * set: <set>`, its details naming any block skipped as unreadable). A block that cannot be read
 * (the node's own, or another's when borrowing, or a key under `blocks/` that names no block) is
 * skipped — never allocated from, never written — and told to `onCorrupt` once the batch is
 * decided; a corrupt block's key exists, so it is never claimed either. Whole-batch failures
 * (etcd unavailable, `STORE_CONFLICT`, `STORE_CORRUPT` — a `meta`, or a handle or block a
 * repeated ADD must verify, that cannot be read —, a `meta` mismatch) are thrown. At most
 * {@link MAX_BATCH} requests.
 */
export async function add(core: AllocatorCore, reqs: readonly PoolRequest[]): Promise<Array<PoolAllocation[] | AppError>> {
  if (reqs.length > MAX_BATCH) throw new AppError('INTERNAL', `a pool batch holds at most ${MAX_BATCH} requests, got ${reqs.length}`);
  await core.checkMeta();
  /** Blocks that cannot be read, skipped (never allocated from, never written), by key: told to `onCorrupt` once at the end. */
  const skipped = new Map<string, CorruptValueError>();
  const r = await round(core, reqs, [], skipped, new Map());
  for (const e of skipped.values()) core.report('ADD', e, 'block skipped: never allocated from, left for an operator');
  return r.adds;
}

/**
 * ADDs and DELs of this node together, in one transaction per attempt (the daemon's batcher,
 * docs/cluster.md "The daemon"): every block the round changes is written once, with the
 * allocations of `adds` made and those of `dels` released, each handle put or deleted, under the
 * compares of {@link add} and {@link del} together; the handles of the round are read in one
 * round trip (`getMany`) — on the first attempt with the cache only those it cannot do without:
 * an ADD's handle this process has not written is taken as absent, a DEL's handle this process
 * wrote is taken from {@link BlockCache.handles}, each compared at the commit. The ADDs are decided first, then the DELs, so an ADD never gets an
 * address a DEL of the same round frees. Each DEL has {@link del}'s meaning: idempotent (no
 * handle: a tombstone is put, in the same transaction; all tombstones of one attempt share one
 * lease), the handle's sequence numbers and owner checked, an emptied own block given back unless
 * it is the node's last of its range set (the kept block's affinity compared), a removed node's
 * emptied `pendingRelease` block given back (src/pool/stuck-block.ts), a block that cannot be
 * read never written (the handle keeps its addresses), no commit while a removal of the node is
 * begun (a lost compare vetoes it and decides again). A DEL whose handle cannot be read is done
 * alone after the round ({@link del}: it reads every block). An attachment may appear in `adds`
 * or `dels`, not both (`INTERNAL`); a repeated DEL gets the first one's answer.
 *
 * Returns per ADD its allocations or AppError (as {@link add}), per DEL its released addresses
 * (sorted) or the AppError its own {@link del} threw. When a round's ADD fails (a full range
 * set), or the round would exceed etcd's op limit ({@link MAX_TXN_OPS}), the ADDs and the DELs
 * go in separate transactions (an ADD that failed writes nothing), then halves. Whole-round
 * failures are thrown as by {@link add} (etcd unavailable, `STORE_CONFLICT` after
 * {@link MAX_ATTEMPTS} lost races, `STORE_CORRUPT` for an ADD's handle or a block a repeated ADD
 * must verify); `meta` is checked only when `adds` is not empty (a DEL needs no layout). At most
 * {@link MAX_BATCH} requests in all (more: `INTERNAL`).
 */
export async function batch(core: AllocatorCore, adds: readonly PoolRequest[], dels: readonly PoolRequest[]): Promise<{ adds: Array<PoolAllocation[] | AppError>; dels: Array<string[] | AppError> }> {
  if (adds.length + dels.length > MAX_BATCH) throw new AppError('INTERNAL', `a pool batch holds at most ${MAX_BATCH} requests, got ${adds.length + dels.length}`);
  const addKeys = new Set(adds.map((r) => JSON.stringify([r.containerId.trim(), r.ifname])));
  for (const r of dels) if (addKeys.has(JSON.stringify([r.containerId.trim(), r.ifname]))) throw new AppError('INTERNAL', `a pool batch holds both an ADD and a DEL of ${r.containerId.trim()}/${r.ifname}`);
  if (adds.length > 0) await core.checkMeta();
  const skipped = new Map<string, CorruptValueError>();
  /** What the round's DELs went on without, by key and action (told once the round is decided). */
  const reports = new Map<string, [CorruptValueError, string]>();
  const r = await round(core, adds, dels, skipped, reports);
  for (const e of skipped.values()) core.report('ADD', e, 'block skipped: never allocated from, left for an operator');
  for (const [e, action] of reports.values()) core.report('DEL', e, action);
  const out: Array<string[] | AppError> = [];
  for (let j = 0; j < dels.length; j++) {
    const d = r.dels[j];
    if (d !== ALONE) {
      out.push(d as string[]);
      continue;
    }
    // A handle that cannot be read: the DEL alone, after the round (delByOwner reads every block).
    try {
      out.push(await del(core, dels[j] as PoolRequest));
    } catch (e) {
      if (!(e instanceof AppError)) throw e;
      out.push(e);
    }
  }
  return { adds: r.adds, dels: out };
}

/** DELs of this node in one transaction per attempt: {@link batch} without ADDs. */
export async function release(core: AllocatorCore, dels: readonly PoolRequest[]): Promise<Array<string[] | AppError>> {
  return (await batch(core, [], dels)).dels;
}

/**
 * One round ({@link batch}; {@link add} with no DELs): one {@link runTxn} body that decides the
 * ADDs, then the DELs on the blocks the ADDs left, and buffers one write per block. Splits
 * itself (ADDs and DELs apart, then halves) when an ADD failed beside DELs or the transaction
 * would exceed {@link MAX_TXN_OPS}. A DEL's result is {@link ALONE} when its handle cannot be
 * read. What the committed attempt's DELs went on without is added to `reports`.
 */
async function round(core: AllocatorCore, reqs: readonly PoolRequest[], dels: readonly PoolRequest[], skipped: Map<string, CorruptValueError>, reports: Map<string, [CorruptValueError, string]>): Promise<Round> {
  const kv = core.o.kv;
  /** What the deciding attempt's DELs went on without (each attempt starts it anew). */
  let told = new Map<string, [CorruptValueError, string]>();
  const { value } = await runTxn(
    kv,
    async (tx): Promise<Round> => {
    told = new Map();
    const tell = (e: CorruptValueError, action: string): void => void told.set(`${e.key}\u0000${action}`, [e, action]);
    const attempt = tx.attempt;
    // A later attempt: first what the daemon has learned of gone callers meanwhile (once per attempt).
    if (attempt > 0) await reqs.find((r) => r.refresh !== undefined)?.refresh?.();
    const blocks = new Map<string, Working | null>();
    const results: Array<PoolAllocation[] | AppError | null> = reqs.map(() => null);
    // Fast path: the first attempt builds on the cached blocks, and reads no handle it can do
    // without: an ADD's handle this process has not written is taken as absent (its put
    // compares it absent; an ADD that fails is decided again on fresh reads), a DEL's handle
    // this process wrote is taken as written (its commit compares it at that revision). A
    // stale guess is a lost compare, decided again on fresh reads.
    const cached = attempt === 0 ? core.cache : null;
    const known = cached === null ? null : core.shared.handles;
    const keys = [...reqs, ...dels].map((r) => core.handleKey(r.containerId.trim(), r.ifname));
    /** Handles taken from `known` (never decoded badly: this process encoded them). */
    const guessed = new Set<string>();
    const toRead = keys.filter((k, i) => {
      if (known === null) return true;
      if (i < reqs.length) {
        if (known.has(k)) return true;
        guessed.add(k);
        return false;
      }
      if (!known.has(k)) return true;
      guessed.add(k);
      return false;
    });
    // Every handle still to read in one read (one round trip, one revision) where the KV can.
    const got = toRead.length === 0 ? [] : await tx.readMany(toRead);
    const readBy = new Map(toRead.map((k, i) => [k, got[i] ?? null]));
    const read = keys.map((k, i) => (readBy.has(k) ? (readBy.get(k) as KVEntry | null) : i < reqs.length ? null : ((known as Map<string, KVEntry>).get(k) as KVEntry)));
    const handles = read.slice(0, reqs.length).map((e) => (e === null ? null : { entry: e, value: decodeHandle(e) }));
    const delEntries = read.slice(reqs.length);
    /** Handle key → the handle value this round's ADD puts (cached at the commit). */
    const written = new Map<string, string>();
    /** True once some request's handle is buffered: only then is anything written. */
    let anyHandle = false;
    const firstOf = new Map<string, number>();
    const pending: number[] = [];
    let lostRace = false;
    /** Handle key → revision of the DEL's tombstone there (a fresh ADD overwrites it by that revision). */
    const tombstones = new Map<string, string>();
    for (let i = 0; i < reqs.length; i++) {
      const r = reqs[i] as PoolRequest;
      const h = handles[i];
      const hk = core.handleKey(r.containerId.trim(), r.ifname);
      if (h !== null && h !== undefined && h.value.deleted !== true) {
        try {
          results[i] = await core.existing(h, blocks, r);
        } catch (e) {
          if (!(e instanceof LostRace)) throw e;
          lostRace = true;
          break;
        }
      } else if (!firstOf.has(hk)) {
        firstOf.set(hk, i);
        // A caller that has gone gets nothing allocated (PoolRequest.gone).
        if (r.gone?.() === true) {
          results[i] = goneAddError(r);
          continue;
        }
        if (h !== null && h !== undefined && r.since !== undefined && BigInt(h.entry.createRevision) > BigInt(r.since)) {
          // A DEL of the attachment after this ADD began: refused, never written over.
          results[i] = staleAddError(core.o.pool, r, h.entry.createRevision);
          continue;
        }
        pending.push(i);
        if (h !== null && h !== undefined) tombstones.set(hk, h.entry.modRevision);
      }
    }
    let mineComplete = false;
    /** A claim (or a borrow) decided on cached blocks: first re-read the node's blocks. */
    let needFresh = false;
    if (lostRace) {
      core.cache = null;
      throw new Retry();
    }
    if (pending.length > 0) {
      mineComplete = true;
      // This node's blocks (affinity index), read once per attempt.
      const prefix = core.keys.affinityPrefix(core.o.node);
      const mine: Working[] = [];
      const listed =
        cached !== null
          ? [...cached.keys()].map((k) => ({ key: `${prefix}${k}` }))
          : await kv.list(prefix, { keysOnly: true });
      for (const a of listed) {
        const key = a.key.slice(prefix.length);
        const c = cached?.get(key);
        if (c !== undefined) blocks.set(key, fromCache(key, c));
        const b = await core.tryBlock(key, blocks);
        if (b instanceof CorruptValueError) {
          // One of the node's blocks cannot be read: skip it (nothing in it is handed out, it is
          // never rewritten); the node uses its other blocks, claims one or borrows.
          skipped.set(b.key, b);
          continue;
        }
        if (b === null || b.value.node !== core.o.node) {
          // Another process of this node may have given the block back (a DEL that emptied
          // it), and another node claimed it since, between our affinity list and this read: a
          // lost race (review F3). Corrupt only when the affinity is still the one we listed
          // (same mod_revision, so it existed all along): a claim and a give-back write the
          // block and its affinity in one transaction, so they cannot disagree at one revision.
          const again = 'modRevision' in a ? await kv.get(a.key) : null;
          if (again !== null && again.modRevision === (a as KVEntry).modRevision) {
            throw corrupt(a.key, `names block ${key}, which ${b === null ? 'does not exist' : `belongs to node ${b.value.node}`}`);
          }
          lostRace = true;
          break;
        }
        // The node is back: it vetoes a removal begun while it was away (docs/cluster.md
        // "Reclaiming a dead node's blocks"); the write goes in this ADD's transaction.
        if (b.value.state === 'pendingRelease') {
          b.value.state = 'owned';
          b.dirty = true;
        }
        mine.push(b);
      }
      if (lostRace) {
        core.cache = null;
        throw new Retry();
      }
      let claimed: Set<string> | null = null;
      let others: Working[] | null = null;
      for (const i of pending) {
        const r = reqs[i] as PoolRequest;
        const got: Array<{ b: Working; o: number; rs: number }> = [];
        let failed: AppError | null = null;
        for (let s = 0; s < core.o.rangeSets.length && failed === null; s++) {
          let pick = core.firstFree(mine, s);
          if (pick === null && cached !== null) {
            // The cache lists only the blocks this process knows: another process of the node
            // (the standalone fallback) may have claimed one with free addresses since. Claim
            // only on fresh reads, or the node holds more blocks than it needs (trial finding 10).
            needFresh = true;
            break;
          }
          if (pick === null) {
            claimed ??= new Set((await kv.list(core.keys.blocksPrefix, { keysOnly: true })).map((e) => e.key.slice(core.keys.blocksPrefix.length)));
            const nb = core.claimable(s, claimed);
            if (nb !== null) {
              claimed.add(nb.key);
              blocks.set(nb.key, nb);
              mine.push(nb);
              pick = { b: nb, o: core.freeOrdinal(nb) };
            }
          }
          if (pick === null) {
            // No free block anywhere in the pool: borrow from another node's block.
            others ??= await othersBlocks(core, blocks, skipped);
            pick = core.firstFree(others, s);
          }
          if (pick === null || pick.o < 0) {
            const rs = core.o.rangeSets[s] as RangeSet;
            const bad = [...skipped.values()].map((e) => e.message).join('; ');
            failed = new RangeExhaustedError({ rangeSetIndex: s, rangeSet: rangeSetString(rs), size: rangeSetSize(rs), reserved: Number(rangeSetSize(rs)) }, {
              details: `pool ${core.o.pool}: every block of range set ${s} is claimed and none has a free address${bad === '' ? '' : `; blocks that cannot be read were skipped (never allocated from, left for an operator): ${bad}`}`,
            });
            break;
          }
          const b = pick.b;
          b.value.seq += 1;
          b.value.allocs[String(pick.o)] = { id: r.containerId.trim(), ifname: r.ifname, node: core.o.node, seq: b.value.seq, at: core.now() };
          b.value.next = (pick.o + 1) % Number(blockAddresses(b.cidr.ip.family, b.cidr.prefix));
          b.dirty = true;
          got.push({ b, o: pick.o, rs: s });
        }
        if (needFresh) break;
        if (failed !== null) {
          for (const g of got) delete g.b.value.allocs[String(g.o)];
          results[i] = failed;
          continue;
        }
        const allocs = got.map((g) => core.allocation(g.rs, g.b, g.o, (g.b.value.allocs[String(g.o)] as AllocValue).seq, false));
        results[i] = allocs;
        const hk = core.handleKey(r.containerId.trim(), r.ifname);
        const hv: HandleValue = {
          v: 1,
          node: core.o.node,
          network: core.o.network,
          at: core.now(),
          ips: got.map((g, k) => ({ ip: formatIP((allocs[k] as PoolAllocation).ip), block: g.b.key, ordinal: g.o, seq: (allocs[k] as PoolAllocation).seq, rangeSet: g.rs })),
          ...(core.o.host === undefined ? {} : { host: core.o.host }),
        };
        const tomb = tombstones.get(hk);
        tx.expect(hk, tomb ?? null);
        const hvText = encodeHandle(hv);
        tx.put(hk, hvText);
        // Cached as created by this commit (over a tombstone: not cached, its DEL reads it).
        if (tomb === undefined) written.set(hk, hvText);
        anyHandle = true;
      }
    }
    if (needFresh) {
      core.cache = null;
      throw new Retry();
    }
    // Nothing to write unless some request got its addresses (anyHandle): an ADD that failed (a
    // full range set) leaves etcd as it was — no half-used block claim, no moved round-robin cursor.
    // A failure decided on cached blocks (a full range set) may be stale: decide it on fresh reads.
    if (cached !== null && results.some((r) => r instanceof AppError)) {
      core.cache = null;
      throw new Retry();
    }
    if (dels.length > 0 && reqs.length > 0 && results.some((r) => r instanceof AppError)) {
      // A failed ADD must write nothing (its claim, its cursor): the ADDs and the DELs go apart.
      tx.discard();
      told = new Map();
      return apart(core, reqs, dels, skipped, reports);
    }
    // The round's DELs, on the blocks the ADDs left (one write per block; the rules of delOne).
    const delResults: Array<string[] | typeof ALONE | null> = dels.map(() => null);
    const delFirst = new Map<string, number>();
    /** True once some DEL's write is buffered (a handle deleted or rewritten, a tombstone). */
    let delWrites = false;
    let tombLease: string | undefined | null = null;
    /** Blocks a DEL of this round released from (the candidates to give back). */
    const emptied = new Set<string>();
    for (let j = 0; j < dels.length; j++) {
      const r = dels[j] as PoolRequest;
      const id = r.containerId.trim();
      const hk = core.handleKey(id, r.ifname);
      if (delFirst.has(hk)) continue;
      delFirst.set(hk, j);
      const he = delEntries[j] ?? null;
      if (he === null) {
        // Nothing held: a tombstone (see delOne: a late ADD transaction of this container then
        // fails its create-only compare), created only while the handle is still absent.
        if (tombLease === null) tombLease = core.o.tombstoneLease === undefined ? undefined : await core.o.tombstoneLease();
        tx.expect(hk, null);
        tx.put(hk, tombstoneValue(core.o.node, core.o.network, core.now()), tombLease);
        delWrites = true;
        delResults[j] = [];
        continue;
      }
      let hv: HandleValue;
      try {
        hv = decodeHandle(he);
      } catch (e) {
        if (!(e instanceof CorruptValueError)) throw e;
        delResults[j] = ALONE; // del (delByOwner), after this round
        continue;
      }
      if (hv.deleted === true) {
        delResults[j] = [];
        continue;
      }
      const released: string[] = [];
      /** The handle's addresses whose block cannot be read: never released; the handle keeps naming them. */
      const left: HandleIP[] = [];
      for (const x of hv.ips) {
        const c = cached?.get(x.block);
        if (c !== undefined && !blocks.has(x.block)) blocks.set(x.block, fromCache(x.block, c));
        const b = await core.tryBlock(x.block, blocks);
        if (b instanceof CorruptValueError) {
          left.push(x);
          tell(b, `${x.ip} of ${id}/${r.ifname} not released (its block cannot be read): the handle ${he.key} keeps it for an operator`);
          continue;
        }
        const a = b?.value.allocs[String(x.ordinal)];
        if (b === null || a === undefined || a.seq !== x.seq || a.id !== id || a.ifname !== r.ifname) {
          // Nothing of this container's to release here: a decision on what was read of the
          // block, compared (a cached block may be an older revision without the allocation: a
          // refill that wrote nothing caches the blocks as it read them, and an ADD may have
          // committed since — the commit then fails and the round is decided on fresh reads).
          if (b === null) tx.expect(core.blockKey(x.block), null);
          else core.expectBlock(tx, b);
          continue;
        }
        delete b.value.allocs[String(x.ordinal)];
        b.dirty = true;
        emptied.add(b.key);
        released.push(x.ip);
      }
      delResults[j] = released.sort();
      // Every address is in a block that cannot be read: nothing can be released, nothing is written.
      if (left.length > 0 && left.length === hv.ips.length) {
        // An answer on a handle taken from the cache would not be compared: read it.
        if (guessed.has(he.key)) throw new Retry('a cached handle names only unreadable blocks: decide on fresh reads');
        continue;
      }
      tx.expect(he.key, he.modRevision);
      // A handle taken from the cache: its value compared too (revisions repeat after an etcd restore).
      if (guessed.has(he.key)) tx.expectValue(he.key, he.value);
      if (left.length === 0) tx.del(he.key);
      else tx.put(he.key, encodeHandle({ ...hv, ips: left }));
      delWrites = true;
    }
    /** Blocks this round gives back (deleted with their affinity), by key text. */
    const gone = await writeBlocks(core, tx, blocks, (key) => emptied.has(key), cached, tell);
    // etcd refuses a transaction of more than 128 compares + ops (`--max-txn-ops`): with small
    // blocks (/31, /32) a batch claims a block per request. Split the round (the parts re-read;
    // nothing was written) instead of failing it as a whole (review): ADDs and DELs apart, then
    // halves.
    if ((anyHandle || delWrites) && reqs.length + dels.length > 1 && tx.size + 1 > MAX_TXN_OPS) {
      tx.discard();
      told = new Map();
      if (reqs.length > 0 && dels.length > 0) return apart(core, reqs, dels, skipped, reports);
      const half = (n: number): number => Math.ceil(n / 2);
      if (reqs.length > 1) {
        const a = await round(core, reqs.slice(0, half(reqs.length)), [], skipped, reports);
        const b = await round(core, reqs.slice(half(reqs.length)), [], skipped, reports);
        return { adds: [...a.adds, ...b.adds], dels: [] };
      }
      const a = await round(core, [], dels.slice(0, half(dels.length)), skipped, reports);
      const b = await round(core, [], dels.slice(half(dels.length)), skipped, reports);
      return { adds: [], dels: [...a.dels, ...b.dels] };
    }
    if (anyHandle || delWrites) {
      // No ADD or DEL of this node commits while a removal of it is begun (review F2): the
      // marker's absence is compared inside the transaction, so a stale cache cannot skip the veto.
      tx.expect(core.removingKey(core.o.node), null);
      tx.onCommit((revision) => {
        for (const k of delFirst.keys()) core.shared.handles.delete(k);
        for (const [k, v] of written) core.shared.rememberHandle({ key: k, value: v, modRevision: revision, createRevision: revision });
        if (mineComplete) core.remember(blocks, revision);
        else if (core.cache !== null) {
          // DELs only: the node's blocks they wrote get the new revision.
          for (const b of blocks.values()) {
            if (b !== null && b.dirty && b.value.node === core.o.node && core.cache.has(b.key)) core.cache.set(b.key, { cidr: b.cidr, value: copyBlock(b.value), rev: revision, encoded: encodeBlock(b.value) });
          }
        }
        // Blocks given back leave the cache.
        for (const k of gone) core.cache?.delete(k);
      });
    } else {
      // Nothing is sent (a block written back to owned is written with the next ADD that commits).
      tx.discard();
    }
    if (!anyHandle && !delWrites && cached === null && mineComplete) {
      core.remember(blocks, null);
      // An ADD that sent nothing (every request failed: a full pool) is still a sign of life:
      // veto a removal begun (one read, on this failure path only).
      if (pending.length > 0) await vetoIfMarked(core);
    }
    // Duplicates inside the round get the first one's answer.
    return {
      adds: reqs.map((r, i) => {
        const first = firstOf.get(core.handleKey(r.containerId.trim(), r.ifname));
        return (results[i] ?? results[first as number]) as PoolAllocation[] | AppError;
      }),
      dels: dels.map((r, j) => (delResults[j] ?? delResults[delFirst.get(core.handleKey(r.containerId.trim(), r.ifname)) as number]) as string[] | typeof ALONE),
    };
    },
    {
      attempts: MAX_ATTEMPTS,
      ...(core.o.backoff === undefined ? {} : { backoff: core.o.backoff }),
      lost: async () => {
        core.cache = null;
        // The node is back: it vetoes a removal begun while it was away, then decides again.
        await vetoIfMarked(core);
      },
      exhausted: () => {
        throw new AppError('STORE_CONFLICT', `pool ${core.o.pool}: ${MAX_ATTEMPTS} transactions lost to concurrent writers; try again`);
      },
    },
  );
  for (const [k, v] of told) reports.set(k, v);
  return value;
}

/** A round's ADDs, then its DELs, in separate transactions (see {@link batch}). */
async function apart(core: AllocatorCore, reqs: readonly PoolRequest[], dels: readonly PoolRequest[], skipped: Map<string, CorruptValueError>, reports: Map<string, [CorruptValueError, string]>): Promise<Round> {
  const a = await round(core, reqs, [], skipped, reports);
  const d = await round(core, [], dels, skipped, reports);
  return { adds: a.adds, dels: d.dels };
}

/**
 * Every block of the pool owned by other nodes (one prefix read), cached in `blocks`. A key that
 * is not a block's, or whose value cannot be read, is put in `skipped` (never borrowed from).
 */
async function othersBlocks(core: AllocatorCore, blocks: Map<string, Working | null>, skipped: Map<string, CorruptValueError>): Promise<Working[]> {
  const prefix = core.keys.blocksPrefix;
  const out: Working[] = [];
  for (const e of await core.o.kv.list(prefix)) {
    const key = e.key.slice(prefix.length);
    if (blocks.has(key)) {
      const w = blocks.get(key);
      if (w !== null && w !== undefined && w.value.node !== core.o.node) out.push(w);
      continue;
    }
    const cidrText = blockKeyCidr(key);
    let w: Working;
    try {
      if (cidrText === null) throw corrupt(e.key, 'not a block key');
      w = { key, cidr: (parseCIDR(cidrText) as NonNullable<ReturnType<typeof parseCIDR>>).subnet, value: decodeBlock(e, cidrText), rev: e.modRevision, text: e.value, fromCache: false, dirty: false };
    } catch (err) {
      if (!(err instanceof CorruptValueError)) throw err;
      skipped.set(err.key, err);
      continue;
    }
    blocks.set(key, w);
    if (w.value.node !== core.o.node) out.push(w);
  }
  return out;
}

/**
 * The allocations of (containerId, ifname), checked against their blocks, or null when it has
 * no handle (CHECK). Throws STORE_CORRUPT when the handle names an allocation its block lacks.
 */
export async function find(core: AllocatorCore, req: PoolRequest): Promise<PoolAllocation[] | null> {
  await core.checkLayout();
  // Reads only: a read that raced with a release (LostRace) is read again.
  const { value } = await runTxn(
    core.o.kv,
    async () => {
      const h = await core.handle(req);
      if (h === null || h.value.deleted === true) return null;
      return await core.existing(h, new Map(), req);
    },
    {
      attempts: MAX_ATTEMPTS,
      exhausted: () => {
        throw new AppError('STORE_CONFLICT', `pool ${core.o.pool}: ${MAX_ATTEMPTS} reads of ${req.containerId.trim()}/${req.ifname} raced with releases; try again`);
      },
    },
  );
  return value;
}

/**
 * DEL: release the addresses of (containerId, ifname) and delete its handle, in one
 * transaction. Idempotent: no handle → `[]`. An address whose allocation no longer carries the
 * handle's sequence number and owner (re-allocated since) is not touched. An owned block left
 * empty is deleted with its affinity unless it is the node's last block of its range set.
 * Returns the released addresses (canonical text, sorted).
 *
 * A DEL always finishes when etcd answers (docs/cluster.md "Corrupt keys": a runtime retries a
 * failed DEL forever, and the pod is never torn down). Corrupt keys are left exactly as they are
 * and told to `onCorrupt` (after the DEL's transaction):
 * - an address whose block cannot be read is not released, and the handle is rewritten to name
 *   only such addresses, in the transaction that releases the others (nothing is written when
 *   no address could be released): no address is freed that the corrupt block may still give to
 *   this container, and the record of what it holds there stays for an operator — and for the
 *   node's reconcile, which releases it once the block is repaired;
 * - a handle that cannot be read is left as it is (a late ADD transaction of the container
 *   still fails its create-only compare on it), and the container's allocations (its ID and
 *   ifname) found in the pool's readable blocks are released ({@link delByOwner}: one read of
 *   every block value, on this path only);
 * - an affinity that cannot be read only keeps an emptied block (no block is given back on it).
 * @throws STORE_UNAVAILABLE (CNI 11) when etcd cannot be asked; STORE_CONFLICT (CNI 11) after
 *   {@link MAX_ATTEMPTS} lost races.
 */
export async function del(core: AllocatorCore, req: PoolRequest): Promise<string[]> {
  core.shared.handles.delete(core.handleKey(req.containerId.trim(), req.ifname));
  /** What the last attempt went on without, by key and action (told once it succeeded). */
  const reports = new Map<string, [CorruptValueError, string]>();
  const r = await delOne(core, req, reports);
  for (const [e, action] of reports.values()) core.report('DEL', e, action);
  return r;
}

async function delOne(core: AllocatorCore, req: PoolRequest, reports: Map<string, [CorruptValueError, string]>): Promise<string[]> {
  const kv = core.o.kv;
  const id = req.containerId.trim();
  const tell = (e: CorruptValueError, action: string): void => void reports.set(`${e.key}\u0000${action}`, [e, action]);
  const { value } = await runTxn(
    kv,
    async (tx) => {
      reports.clear();
      const he = await kv.get(core.handleKey(id, req.ifname));
      if (he === null) {
        // Nothing held: leave a tombstone, so an ADD of this container whose transaction etcd
        // applies only now (its sender gave up: the runtime's DEL came after an error) fails its
        // create-only compare instead of holding an address nobody will release (review F4).
        if (await tombstone(core, req)) return [];
        throw new Retry('a handle appeared meanwhile: release it');
      }
      let hv: HandleValue;
      try {
        hv = decodeHandle(he);
      } catch (e) {
        if (!(e instanceof CorruptValueError)) throw e;
        const r = await delByOwner(core, req, he, e, tell);
        if (r !== null) return r;
        throw new Retry('the handle or a block changed meanwhile: decide again');
      }
      if (hv.deleted === true) return [];
      const blocks = new Map<string, Working | null>();
      const released: string[] = [];
      /** The handle's addresses whose block cannot be read: never released; the handle keeps naming them. */
      const left: HandleIP[] = [];
      for (const x of hv.ips) {
        const b = await core.tryBlock(x.block, blocks);
        if (b instanceof CorruptValueError) {
          left.push(x);
          tell(b, `${x.ip} of ${id}/${req.ifname} not released (its block cannot be read): the handle ${he.key} keeps it for an operator`);
          continue;
        }
        const a = b?.value.allocs[String(x.ordinal)];
        if (b === null || a === undefined || a.seq !== x.seq || a.id !== id || a.ifname !== req.ifname) continue;
        delete b.value.allocs[String(x.ordinal)];
        b.dirty = true;
        released.push(x.ip);
      }
      // Every address is in a block that cannot be read: nothing can be released, nothing is written.
      if (left.length > 0 && left.length === hv.ips.length) return [];
      tx.expect(he.key, he.modRevision);
      if (left.length === 0) tx.del(he.key);
      else tx.put(he.key, encodeHandle({ ...hv, ips: left }));
      /** Blocks this DEL gives back (deleted), by key text: every block it writes had an address released. */
      const gone = await writeBlocks(core, tx, blocks, () => true, null, tell);
      // A DEL of this node is a sign of life too: it commits only while no removal of the node
      // is begun, else it vetoes and decides again (the same one compare as an ADD's).
      tx.expect(core.removingKey(core.o.node), null);
      tx.onCommit((revision) => {
        // Blocks this DEL deleted leave the cache; those it wrote get the new revision.
        if (core.cache === null) return;
        for (const k of gone) core.cache.delete(k);
        for (const b of blocks.values()) {
          if (b !== null && b.dirty && b.value.node === core.o.node && core.cache.has(b.key)) core.cache.set(b.key, { cidr: b.cidr, value: copyBlock(b.value), rev: revision, encoded: encodeBlock(b.value) });
        }
      });
      return released.sort();
    },
    {
      attempts: MAX_ATTEMPTS,
      ...(core.o.backoff === undefined ? {} : { backoff: core.o.backoff }),
      lost: async () => {
        await vetoIfMarked(core);
      },
      exhausted: () => {
        throw new AppError('STORE_CONFLICT', `pool ${core.o.pool}: ${MAX_ATTEMPTS} releases of ${id}/${req.ifname} lost to concurrent writers; try again`);
      },
    },
  );
  return value;
}

/**
 * The DEL of an attachment whose handle `he` cannot be read (`err`): release the allocations of
 * (containerId, ifname) — reserve entries never — found in the pool's readable blocks (one prefix
 * read of every block value), in one transaction that compares the handle's `mod_revision`
 * (still the unreadable value: a handle rewritten meanwhile is decided again), each block written
 * and `removing/<me>` absent. The handle is left as it is for an operator; emptied blocks are
 * kept. Returns the released addresses (sorted; `[]` when there are none: nothing written), or
 * null when the transaction failed (the caller decides again).
 */
async function delByOwner(core: AllocatorCore, req: PoolRequest, he: KVEntry, err: CorruptValueError, tell: (e: CorruptValueError, action: string) => void): Promise<string[] | null> {
  const kv = core.o.kv;
  const id = req.containerId.trim();
  const prefix = core.keys.blocksPrefix;
  const compares: KVCompare[] = [{ key: he.key, modRevision: he.modRevision }];
  const ops: KVOp[] = [];
  const released: string[] = [];
  for (const e of await kv.list(prefix)) {
    const cidrText = blockKeyCidr(e.key.slice(prefix.length));
    let v: BlockValue;
    try {
      if (cidrText === null) throw corrupt(e.key, 'not a block key');
      v = decodeBlock(e, cidrText);
    } catch (x) {
      if (!(x instanceof CorruptValueError)) throw x;
      tell(x, `not searched for allocations of ${id}/${req.ifname} (it cannot be read): left for an operator`);
      continue;
    }
    const cidr = (parseCIDR(cidrText) as NonNullable<ReturnType<typeof parseCIDR>>).subnet;
    let dirty = false;
    for (const [o, a] of Object.entries(v.allocs)) {
      if (a.reserve === true || a.id !== id || a.ifname !== req.ifname) continue;
      delete v.allocs[o];
      dirty = true;
      released.push(formatIP(ordinalIP(cidr, Number(o))));
    }
    if (!dirty) continue;
    compares.push({ key: e.key, modRevision: e.modRevision });
    ops.push({ put: e.key, value: encodeBlock(v) });
  }
  released.sort();
  tell(err, `handle left as it is for an operator (the addresses it names cannot be read from it); allocations of ${id}/${req.ifname} in the pool's readable blocks: ${released.length === 0 ? 'none' : `${released.join(', ')}, released`}`);
  if (ops.length === 0) return [];
  compares.push({ key: core.removingKey(core.o.node), absent: true });
  const t = await kv.txn(compares, ops);
  core.cache = null;
  if (t.succeeded) return released;
  await vetoIfMarked(core);
  return null;
}

/** Put a tombstone at (containerId, ifname)'s handle key if it is absent; false when a handle exists. */
async function tombstone(core: AllocatorCore, req: PoolRequest): Promise<boolean> {
  const hk = core.handleKey(req.containerId.trim(), req.ifname);
  const lease = core.o.tombstoneLease === undefined ? undefined : await core.o.tombstoneLease();
  const value = tombstoneValue(core.o.node, core.o.network, core.now());
  return (await core.o.kv.txn([{ key: hk, absent: true }], [{ put: hk, value, ...(lease === undefined ? {} : { lease }) }])).succeeded;
}

/**
 * Release one address only if its allocation still has sequence number `seq` and owner
 * (containerId, ifname) — the reconciler's guard against a stale view (Calico's per-ordinal
 * sequence numbers). Returns false when the address is not held by that owner with that `seq`
 * (free, re-allocated since, or released by an earlier attempt of the caller whose answer was
 * lost: false means "not held", not "not released by this call"). Does not touch the handle's other addresses; deletes the handle when it held only
 * this one.
 */
export async function releaseIfSeq(core: AllocatorCore, ip: string, seq: number, owner: PoolRequest): Promise<boolean> {
  const { value } = await runTxn(
    core.o.kv,
    async (tx) => {
      const h = await core.handle(owner);
      const x = h?.value.ips.find((i) => i.ip === ip);
      if (h === null || x === undefined || x.seq !== seq) return false;
      const blocks = new Map<string, Working | null>();
      const b = await core.block(x.block, blocks);
      const a = b?.value.allocs[String(x.ordinal)];
      if (b === null || a === undefined || a.seq !== seq || a.id !== owner.containerId.trim() || a.ifname !== owner.ifname) return false;
      delete b.value.allocs[String(x.ordinal)];
      const rest = h.value.ips.filter((i) => i !== x);
      tx.expect(h.entry.key, h.entry.modRevision);
      tx.expect(core.blockKey(b.key), b.rev);
      if (rest.length === 0) tx.del(h.entry.key);
      else tx.put(h.entry.key, encodeHandle({ ...h.value, ips: rest }));
      tx.put(core.blockKey(b.key), encodeBlock(b.value));
      return true;
    },
    {
      attempts: MAX_ATTEMPTS,
      exhausted: () => {
        throw new AppError('STORE_CONFLICT', `pool ${core.o.pool}: ${MAX_ATTEMPTS} releases of ${ip} lost to concurrent writers; try again`);
      },
    },
  );
  return value;
}

/** Every handle `node` made, sorted by key (one prefix read of the pool's handles); a handle that cannot be read is left out (whose it is cannot be told). */
export async function handlesOf(core: AllocatorCore, node: string): Promise<Array<{ containerId: string; ifname: string; value: HandleValue }>> {
  const prefix = core.keys.handlesPrefix;
  const out: Array<{ containerId: string; ifname: string; value: HandleValue }> = [];
  for (const e of await core.o.kv.list(prefix)) {
    let value: HandleValue;
    try {
      value = decodeHandle(e);
    } catch (err) {
      if (err instanceof CorruptValueError) continue; // whose it is cannot be told
      throw err;
    }
    if (value.node !== node || value.deleted === true) continue;
    const [containerId, ifname] = e.key.slice(prefix.length).split('/') as [string, string];
    out.push({ containerId, ifname, value });
  }
  return out;
}

/**
 * Buffer in `tx` the write of every block of `blocks` that an attempt changed (`dirty`), by the
 * same rules for a DEL and for a round: a block the attempt claims (`rev` null) is created with its
 * affinity, both compared absent; any other is compared as read ({@link AllocatorCore.expectBlock}:
 * its revision, and its stored text when built on the cache), then
 * - given back (the block and its affinity deleted) when `emptied(key)`, it holds nothing (no
 *   allocation, no want: src/pool/wanted.ts), it is the node's own and `owned`, and it is not the
 *   node's last block of its range set: not when `cached` (the node's cached blocks the attempt
 *   built on, or null) holds no other block of that range set; else the node's affinities are
 *   read once (an affinity that cannot be read is told to `tell` and keeps its block), and the
 *   kept block's affinity is compared, so two DELs of the node that each empty one of its last two
 *   blocks cannot give back both;
 * - given back when `emptied(key)`, it holds nothing, and it is another (removed) node's
 *   `pendingRelease` block (src/pool/stuck-block.ts `giveBackEmptied`);
 * - otherwise written with its new value.
 * Returns the key texts of the blocks given back. Throws what the KV throws.
 */
async function writeBlocks(core: AllocatorCore, tx: Txn, blocks: ReadonlyMap<string, Working | null>, emptied: (key: string) => boolean, cached: ReadonlyMap<string, CachedBlock> | null, tell: (e: CorruptValueError, action: string) => void): Promise<string[]> {
  const kv = core.o.kv;
  const gone: string[] = [];
  let mineByRs: Map<number, KVEntry[]> | null = null;
  for (const b of blocks.values()) {
    if (b === null || !b.dirty) continue;
    const bk = core.blockKey(b.key);
    if (b.rev === null) {
      // A claim: the block and its affinity both absent.
      const ak = core.affinityKey(core.o.node, b.key);
      tx.expect(bk, null);
      tx.expect(ak, null);
      tx.put(ak, affinityValue(b.value.rangeSet));
      tx.put(bk, encodeBlock(b.value));
      continue;
    }
    core.expectBlock(tx, b);
    const empty = emptied(b.key) && holdsNothing(b.value); // a want keeps the block (src/pool/wanted.ts)
    // The node's cached blocks hold no other of this range set: it is the node's last as far
    // as this process knows — kept without listing the affinities (keeping is always safe; a
    // block another process of the node claimed meanwhile is given back by that one's DELs).
    const lastCached = cached !== null && ![...cached].some(([k, c]) => k !== b.key && c.value.rangeSet === b.value.rangeSet);
    if (empty && b.value.node === core.o.node && b.value.state === 'owned' && !lastCached) {
      if (mineByRs === null) {
        mineByRs = new Map();
        for (const e of await kv.list(core.keys.affinityPrefix(core.o.node))) {
          let rs: number;
          try {
            rs = decodeAffinity(e);
          } catch (err) {
            if (!(err instanceof CorruptValueError)) throw err;
            // Left out: an emptied block is then kept rather than given back (keeping is always safe).
            tell(err, 'affinity not read: no block is given back on it, left for an operator');
            continue;
          }
          mineByRs.set(rs, [...(mineByRs.get(rs) ?? []), e]);
        }
      }
      const same = mineByRs.get(b.value.rangeSet) ?? [];
      const ak = core.affinityKey(core.o.node, b.key);
      const aff = same.find((e) => e.key === ak);
      const kept = same.find((e) => e !== aff);
      if (kept !== undefined && aff !== undefined) {
        // Emptied by a DEL and not the node's last block of this range set: given back —
        // provided the block we keep is still there (compared), so two DELs of the node that
        // each empty one of its last two blocks cannot give back both (review).
        mineByRs.set(b.value.rangeSet, same.filter((e) => e !== aff));
        tx.expect(ak, aff.modRevision);
        tx.expect(kept.key, kept.modRevision);
        tx.del(bk);
        tx.del(ak);
        gone.push(b.key);
        continue;
      }
    }
    // A removed node's block emptied by a DEL goes back to the pool (src/pool/stuck-block.ts).
    if (empty && b.value.state === 'pendingRelease' && b.value.node !== core.o.node && (await giveBackEmptied(kv, core.keys, tx, b.key, b.value.node))) {
      gone.push(b.key);
      continue;
    }
    tx.put(bk, encodeBlock(b.value));
  }
  return gone;
}
