/**
 * Releasing a node's leaked attachments in a cluster pool (issue 11, docs/cluster.md "Reconcile
 * per node"): the decisions as pure values, and the one revision-guarded release transaction.
 * Used by the daemon's pool pass (src/reconcile/pool-pass.ts) and by CNI GC on a pool network.
 *
 * What decides, and what never does:
 * - **Age is etcd's, not a clock's.** A handle can be a candidate only if its `create_revision`
 *   is at most a revision `R` read before the runtime was asked (it existed when the runtime
 *   listed its sandboxes). `at` (the writer's wall clock) is shown, never used.
 * - **Only this node's handles**, never a tombstone (`"deleted":true`, a DEL's guard against a
 *   late ADD: it holds no address). Reserve entries of offline allocation live in blocks, not in
 *   handles, so they are never seen here.
 * - **The release** ({@link releaseObserved}) is one transaction per handle: the handle's
 *   `mod_revision` equals the one observed (so a handle rewritten since — a repeated ADD, a
 *   remove-node, a re-created attachment — is not released), each block written has the
 *   `mod_revision` read and its allocation still carries the handle's `seq` and owner (an
 *   address re-allocated since is never freed: Calico's per-allocation sequence numbers), and
 *   `removing/<node>` is absent (as every DEL of the node compares); a handle one of whose
 *   allocations moved on is not released at all. It deletes the handle and puts the blocks — the DEL's transaction shape (src/pool/allocator.ts `del`), except
 *   that an emptied block is kept (the node's next ADD uses it; a DEL gives it back later).
 */
import { AppError } from '../common/errors.ts';
import type { KV, KVEntry } from '../store/kv.ts';
import { MAX_ATTEMPTS, type PoolRequest } from './allocator.ts';
import { runTxn } from './txn.ts';
import { blockKeyCidr, CorruptValueError, decodeBlock, decodeHandle, encodeBlock, keysOf, type BlockValue, type HandleValue, type PoolKeys } from './model.ts';
import { revisionAfter } from './leaks.ts';
import { giveBackEmptied } from './stuck-block.ts';
import { holdsNothing } from './wanted.ts';

export type { PoolKeys } from './model.ts';

/** The prefix of every handle key of the pool (`P/pools/<pool>/handles/`). */
export function handlesPrefix(k: PoolKeys): string {
  return keysOf(k).handlesPrefix;
}

/** One handle as read from etcd, with its revisions. */
export interface PoolHandleEntry {
  /** The full etcd key. */
  readonly key: string;
  readonly containerId: string;
  readonly ifname: string;
  readonly value: HandleValue;
  /** etcd `mod_revision` when read (decimal text). */
  readonly modRevision: string;
  /** etcd `create_revision` (decimal text). */
  readonly createRevision: string;
}

/** A handle key whose value cannot be read (never released; reported). */
export interface CorruptHandle {
  readonly key: string;
  readonly message: string;
}

/**
 * The handles of `node` in a listing of the pool's handles (`entries` from
 * `kv.list(handlesPrefix(k))`), sorted as listed. Tombstones and other nodes' handles are
 * left out; a value that does not decode (STORE_CORRUPT) is in `corrupt` instead — its node is
 * unknown, so it is never released. With `host` (the reconciling machine's host name), a handle
 * of `node` that another host wrote, or that names no host, is in `foreign`, never in `handles`:
 * this host's runtime and kernel cannot judge it (two hosts under one node name, review B1).
 */
export function nodeHandles(entries: readonly KVEntry[], k: PoolKeys, node: string, host: string | null = null): { handles: PoolHandleEntry[]; corrupt: CorruptHandle[]; foreign: PoolHandleEntry[] } {
  const prefix = handlesPrefix(k);
  const handles: PoolHandleEntry[] = [];
  const corrupt: CorruptHandle[] = [];
  const foreign: PoolHandleEntry[] = [];
  for (const e of entries) {
    const rest = e.key.slice(prefix.length).split('/');
    if (!e.key.startsWith(prefix) || rest.length !== 2 || rest[0] === '' || rest[1] === '') {
      corrupt.push({ key: e.key, message: `etcd key ${e.key}: not a handle key (${prefix}<containerID>/<ifname>)` });
      continue;
    }
    let value: HandleValue;
    try {
      value = decodeHandle(e);
    } catch (err) {
      corrupt.push({ key: e.key, message: err instanceof Error ? err.message : String(err) });
      continue;
    }
    if (value.node !== node || value.deleted === true) continue;
    const h = { key: e.key, containerId: rest[0] as string, ifname: rest[1] as string, value, modRevision: e.modRevision, createRevision: e.createRevision };
    if (host !== null && value.host !== host) foreign.push(h);
    else handles.push(h);
  }
  return { handles, corrupt, foreign };
}

/**
 * The revision `R` for the revision rule: etcd's current revision, read with an empty
 * transaction (no compare, no op: nothing is written, the answer's header carries the
 * revision). Errors as `KV.txn` (STORE_UNAVAILABLE, CNI 11, when etcd cannot be asked).
 */
export async function currentRevision(kv: KV): Promise<string> {
  return (await kv.txn([], [])).revision;
}

/** True when the handle existed at revision `r` (its `create_revision` ≤ `r`). */
export function existedAt(h: Pick<PoolHandleEntry, 'createRevision'>, r: string): boolean {
  return !revisionAfter(h.createRevision, r);
}

/** One attachment the runtime says is valid (CNI GC's `cni.dev/valid-attachments`). */
export type ValidAttachment = PoolRequest;

/** What {@link gcDecision} decided for one handle. */
export type GcVerdict = { readonly handle: PoolHandleEntry; readonly release: true } | { readonly handle: PoolHandleEntry; readonly release: false; readonly why: string };

/**
 * CNI GC on a pool network (CNI 1.1.0 §GC), pure: of `handles` (this node's, of this network),
 * those whose (containerID, ifname) is not among `valid` are released only when the kernel shows
 * none of their addresses in use and no CNI operation of the container running (`inUse`), the
 * kernel evidence is complete, and the handle existed at `r`, a revision read before the GC began
 * (the runtime's list is a snapshot: an attachment made since is not in it). Valid attachments
 * are not returned; the others come back in order with their verdict.
 */
export function gcDecision(
  handles: readonly PoolHandleEntry[],
  valid: readonly ValidAttachment[],
  r: string,
  inUse: (ip: string, containerId: string) => string | null,
  evidenceIncomplete: string | null,
): GcVerdict[] {
  const ok = new Set(valid.map((v) => `${v.containerId.trim()}\u0000${v.ifname}`));
  const out: GcVerdict[] = [];
  for (const h of handles) {
    if (ok.has(`${h.containerId}\u0000${h.ifname}`)) continue;
    if (evidenceIncomplete !== null) {
      out.push({ handle: h, release: false, why: `kernel evidence incomplete: ${evidenceIncomplete}` });
      continue;
    }
    if (!existedAt(h, r)) {
      out.push({ handle: h, release: false, why: `created after the GC began (create_revision ${h.createRevision} > ${r}): not in the runtime's list yet` });
      continue;
    }
    let why: string | null = null;
    for (const ip of h.value.ips) {
      const u = inUse(ip.ip, h.containerId);
      if (u !== null) {
        why = `${ip.ip}: ${u}`;
        break;
      }
    }
    out.push(why === null ? { handle: h, release: true } : { handle: h, release: false, why });
  }
  return out;
}

/** The answer of {@link releaseObserved}. */
export type ReleaseOutcome =
  /** Released: the handle is deleted and `ips` (all of its addresses) freed. */
  | { readonly released: true; readonly ips: string[]; readonly revision: string }
  /**
   * Not released (nothing written): why. `corruptKey`: set when a block the handle names cannot be
   * read (the key; left for an operator, never rewritten).
   */
  | { readonly released: false; readonly why: string; readonly corruptKey?: string };

/**
 * Release `h` exactly as observed, in one transaction (see the module comment for its compares).
 * Retries when only a block changed meanwhile (another allocation in it): the blocks are read
 * again, the handle's compare stays the observed `mod_revision`. Answers `released: false`
 * (nothing written) when the handle is gone or was rewritten since it was observed, when an
 * allocation it names moved on (another `seq` or owner, or gone: the address is never freed, and
 * the handle stays for an operator or the container's DEL), or when a removal of `node` is begun
 * (the node's heartbeat vetoes it; the next pass decides again), or when a block it names cannot
 * be read (`corruptKey`: nothing of the handle is released, the block is never rewritten).
 * @throws AppError STORE_UNAVAILABLE (CNI 11) when etcd cannot be asked — a transaction whose
 *   answer was lost may have been applied (the next pass finds the handle gone); STORE_CONFLICT
 *   after {@link MAX_ATTEMPTS} lost races.
 */
export async function releaseObserved(kv: KV, k: PoolKeys, node: string, h: PoolHandleEntry): Promise<ReleaseOutcome> {
  const keys = keysOf(k);
  const removing = keys.removing(node);
  // The handle's compare stays the observed one: a handle rewritten since is never released here.
  const r = await runTxn<ReleaseOutcome>(
    kv,
    async (tx) => {
    const cur = await kv.get(h.key);
    if (cur === null) return { released: false, why: 'the handle is gone (released meanwhile)' };
    if (cur.modRevision !== h.modRevision) return { released: false, why: `the handle was rewritten since it was observed (mod_revision ${cur.modRevision}, observed ${h.modRevision})` };
    const blocks = new Map<string, { entry: KVEntry; value: BlockValue; dirty: boolean } | null>();
    const freed: string[] = [];
    for (const x of h.value.ips) {
      if (!blocks.has(x.block)) {
        const cidr = blockKeyCidr(x.block);
        const e = cidr === null ? null : await kv.get(keys.block(x.block));
        let value: BlockValue | null = null;
        if (e !== null && cidr !== null) {
          try {
            value = decodeBlock(e, cidr);
          } catch (err) {
            if (!(err instanceof CorruptValueError)) throw err;
            return { released: false, why: `${x.ip}: ${err.message}: nothing released (left for an operator)`, corruptKey: err.key };
          }
        }
        blocks.set(x.block, e === null || value === null ? null : { entry: e, value, dirty: false });
      }
      const b = blocks.get(x.block) ?? null;
      const a = b?.value.allocs[String(x.ordinal)];
      // The allocation must still be this handle's: same seq, same owner. Else the address moved on
      // (or the handle disagrees with its block): when in doubt, release nothing of it.
      if (b === null || a === undefined || a.seq !== x.seq || a.id !== h.containerId || a.ifname !== h.ifname || a.node !== h.value.node) {
        const now = a === undefined ? 'is not allocated' : `is held by ${a.id}/${a.ifname} with seq ${a.seq}`;
        return { released: false, why: `the allocation of ${x.ip} moved on (the handle names seq ${x.seq}; in block ${x.block} it ${b === null ? 'is gone' : now}): nothing released` };
      }
      delete b.value.allocs[String(x.ordinal)];
      b.dirty = true;
      freed.push(x.ip);
    }
    tx.expect(h.key, h.modRevision);
    tx.expect(removing, null);
    tx.del(h.key);
    for (const b of blocks.values()) {
      if (b === null || !b.dirty) continue;
      tx.expect(b.entry.key, b.entry.modRevision);
      // A removed node's block emptied by this release goes back to the pool (src/pool/stuck-block.ts).
      if (holdsNothing(b.value) && b.value.state === 'pendingRelease' && b.value.node !== node && (await giveBackEmptied(kv, keys, tx, b.entry.key.slice(keys.blocksPrefix.length), b.value.node))) continue;
      tx.put(b.entry.key, encodeBlock(b.value));
    }
    // The commit's revision is filled in below, once it is known.
    return { released: true, ips: freed.sort(), revision: '' };
    },
    {
      attempts: MAX_ATTEMPTS,
      // A removal begun stops the release; else a block (or the handle) changed meanwhile: read again.
      lost: async () => ((await kv.get(removing)) !== null ? { stop: { released: false, why: `a removal of node ${node} is begun (${removing}): nothing released` } } : undefined),
      exhausted: () => {
        throw new AppError('STORE_CONFLICT', `pool ${k.pool}: ${MAX_ATTEMPTS} releases of ${h.containerId}/${h.ifname} lost to concurrent writers; try again`);
      },
    },
  );
  return r.value.released && r.revision !== null ? { ...r.value, revision: r.revision } : r.value;
}
