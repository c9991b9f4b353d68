/**
 * Node removal from a cluster pool (docs/cluster.md "Reclaiming a dead node's blocks"): the two
 * steps of `ipwarden pool remove-node` and of a daemon's automatic reclaim (src/pool/auto-reclaim.ts)
 * — {@link PoolRemoval.mark} (the create-only marker `removing/<node>`, the veto window
 * `removal-window/<node>`, the node's blocks `owned → pendingRelease`) and {@link PoolRemoval.finish}
 * (after the window: release the node's allocations, delete its emptied blocks). An operator
 * object over a {@link KV}: it acts as no node and allocates nothing. The node's own veto (its
 * marker deleted, its blocks written back to `owned`) stays with the node's allocator
 * ({@link PoolAllocator.veto}), where its ADDs and its heartbeat call it.
 *
 * Rules, each enforced inside one etcd transaction by revision compares: the marker is created
 * only while the node's heartbeat key is absent (unless `force`); every write of both steps
 * compares the marker's revision, so a veto (its deletion) stops the removal; every `finish`
 * transaction also compares the heartbeat and the window keys absent.
 */
import { AppError } from '../common/errors.ts';
import { parseCIDR, type Subnet } from '../common/ip.ts';
import type { KV, KVCompare, KVEntry } from '../store/kv.ts';
import { MAX_ATTEMPTS, type CorruptSkip, type PoolAllocator } from './allocator.ts';
import { removalWindowSeconds } from './offline.ts';
import { runTxn } from './txn.ts';
import { dropWants } from './rereserve.ts';
import {
  blockKeyCidr,
  corrupt,
  CorruptValueError,
  decodeBlock,
  decodeHandle,
  decodeSettings,
  encodeBlock,
  heartbeatWriter,
  keysOf,
  markerBy,
  removalMarkerValue,
  type BlockValue,
  type HandleValue,
  type PoolKeyLayout,
} from './model.ts';

/**
 * The least veto window of `pool remove-node`, seconds: `--finish` refuses until this long after
 * step 1 (2 heartbeat TTLs: a node's daemon reachable in that time has beaten, and vetoed, at
 * least five times).
 */
export const REMOVAL_WINDOW_SECONDS = 60;

/**
 * `pool remove-node` refused to go on (the node may be alive): no heartbeat override, no veto
 * ignored. Code `STORE_CONFLICT`; the CLI prints the message and exits 1.
 */
export class RemovalRefusedError extends AppError {
  constructor(message: string) {
    super('STORE_CONFLICT', message);
  }
}

/**
 * The refusal for a live heartbeat. With the writer known (trial finding 5: a daemon heartbeats for
 * every node name it serves, so the key may come from another host's daemon), it names that daemon.
 */
function heartbeatRefusal(pool: string, node: string, key: string, finish = false, value: string | null = null): RemovalRefusedError {
  const w = heartbeatWriter(value);
  const by = w === null ? '' : `, written by the ipwarden daemon on host ${w.host}${w.pid === null ? '' : ` (pid ${w.pid})`}`;
  const stop = w === null ? 'stop its daemon first' : `stop the daemon on host ${w.host} first`;
  return new RemovalRefusedError(`node ${node} has a live heartbeat in pool ${pool} (${key}${by}): it is not gone; ${stop}${finish ? ' (--finish never overrides a heartbeat)' : ', or pass --force if you are sure'}`);
}

/** Step 1's refusal for a node no ipwarden daemon has served (no settings key; trial finding 1). */
function neverServedRefusal(pool: string, node: string, key: string): RemovalRefusedError {
  return new RemovalRefusedError(
    `node ${node} has never been served by an ipwarden daemon in pool ${pool} (no ${key}): it writes no heartbeat, so it cannot veto its removal while idle; if it is gone (kubectl get node ${node}), pass --force`,
  );
}

/** Step 1's refusal for a name that holds nothing in the pool (trial finding 11: a typo). */
function nothingRefusal(pool: string, node: string): RemovalRefusedError {
  return new RemovalRefusedError(`node ${node} has nothing in pool ${pool}: nothing to remove (a typo?)`);
}

function windowRefusal(pool: string, node: string, key: string, seconds: number = REMOVAL_WINDOW_SECONDS): RemovalRefusedError {
  return new RemovalRefusedError(`the veto window of node ${node}'s removal from pool ${pool} has not passed (${key} exists until its ${seconds} s lease expires): try --finish again later`);
}

function vetoRefusal(pool: string, node: string, key: string): RemovalRefusedError {
  return new RemovalRefusedError(`node ${node} vetoed its removal from pool ${pool} (${key} was deleted or re-created): it is back; nothing more was released`);
}

/** What a {@link PoolRemoval} works on: the pool, no node identity of its own. */
export interface PoolRemovalOptions {
  readonly kv: KV;
  /** Key prefix (`ipam.pool.etcd.prefix`). */
  readonly prefix: string;
  /** Pool name (`ipam.pool.name`). */
  readonly pool: string;
  /** Wall-clock milliseconds since the epoch (the marker's `at`); default `Date.now`. */
  readonly now?: () => number;
  /** Told of every corrupt key a removal goes on without (never marked, released or deleted); must not throw. */
  readonly onCorrupt?: (s: CorruptSkip) => void;
}

/** A block as read by a removal: its key text, CIDR, value and revision. */
interface RemovalBlock {
  key: string;
  cidr: Subnet;
  value: BlockValue;
  rev: string;
  dirty: boolean;
}

/** The two steps of removing a node from a pool. See the module comment. */
export class PoolRemoval {
  readonly #o: PoolRemovalOptions;
  readonly #keys: PoolKeyLayout;
  readonly #now: () => number;

  constructor(o: PoolRemovalOptions) {
    this.#o = o;
    this.#keys = keysOf(o);
    this.#now = o.now ?? Date.now;
  }

  /** The marker key of `node`'s removal (`<prefix>/pools/<pool>/removing/<node>`), for messages. */
  removingKey(node: string): string {
    return this.#keys.removing(node);
  }

  /** The heartbeat key of `node` (`<prefix>/pools/<pool>/alive/<node>`), for messages. */
  aliveKey(node: string): string {
    return this.#keys.alive(node);
  }

  /** Block `key` (key text) read, null when absent, or its {@link CorruptValueError} when it cannot be read (the KV's errors are thrown). */
  async #tryBlock(key: string, cache: Map<string, RemovalBlock | null>): Promise<RemovalBlock | null | CorruptValueError> {
    if (cache.has(key)) return cache.get(key) as RemovalBlock | null;
    try {
      const cidrText = blockKeyCidr(key);
      if (cidrText === null) throw corrupt(this.#keys.block(key), 'not a block key');
      const e = await this.#o.kv.get(this.#keys.block(key));
      const w: RemovalBlock | null =
        e === null ? null : { key, cidr: (parseCIDR(cidrText) as NonNullable<ReturnType<typeof parseCIDR>>).subnet, value: decodeBlock(e, cidrText), rev: e.modRevision, dirty: false };
      cache.set(key, w);
      return w;
    } catch (e) {
      if (e instanceof CorruptValueError) return e;
      throw e;
    }
  }

  /** Tell `onCorrupt` (never throws). */
  #report(op: CorruptSkip['op'], e: CorruptValueError, action: string): void {
    try {
      this.#o.onCorrupt?.({ op, key: e.key, why: e.why, action });
    } catch {
      // reporting never fails an operation
    }
  }

  /**
   * The checks of step 1 with `checkNode` ({@link mark}), in this order: nothing in the
   * pool (refused even with `force`), a live heartbeat (unless `force`), no settings key (unless
   * `force`). Reads: the heartbeat key, the node's index prefix (keys only), and — only when both
   * are empty — the pool's handles. Writes nothing.
   */
  async #checkRemovable(target: string, force: boolean): Promise<void> {
    const kv = this.#o.kv;
    const ae = await kv.get(this.#keys.alive(target));
    const indexed = await kv.list(`${this.#keys.nodesPrefix}${target}/`, { keysOnly: true });
    if (ae === null && indexed.length === 0) {
      const hprefix = this.#keys.handlesPrefix;
      const held = (await kv.list(hprefix)).some((e) => {
        let h: HandleValue;
        try {
          h = decodeHandle(e);
        } catch (err) {
          if (err instanceof CorruptValueError) return false; // whose it is cannot be told
          throw err;
        }
        return h.node === target && h.deleted !== true;
      });
      if (!held) throw nothingRefusal(this.#o.pool, target);
    }
    if (force) return;
    if (ae !== null) throw heartbeatRefusal(this.#o.pool, target, this.#keys.alive(target), false, ae.value);
    const sk = this.#keys.settings(target);
    if (!indexed.some((e) => e.key === sk)) throw neverServedRefusal(this.#o.pool, target, sk);
  }

  /**
   * Step 1 of `pool remove-node target`: create the marker `removing/<target>` (create-only; an
   * existing marker is kept, so running step 1 again is harmless), then every block of `target`
   * goes `owned → pendingRelease` (a CAS each, also comparing the marker's revision: a veto meanwhile
   * stops the marking). With `windowLease` (the CLI: `grantLease(ttlSeconds)`) the window key is
   * put with the marker, its lease's TTL `max(60, 2·S + 10)` seconds where S is the target's
   * announced offline seconds (`nodes/<target>/settings`; none: {@link REMOVAL_WINDOW_SECONDS}), and `--finish` refuses until it has expired;
   * a call that finds the marker existing puts the window again with a lease granted after it
   * read the marker (review F1: the window always runs its TTL after the marker is known). No new allocation in a marked block, and no ADD of `target` commits
   * while the marker exists. Unless `force`, the marker is created only if `target`'s heartbeat
   * key is absent (compared in the same transaction).
   * With `checkNode` (the CLI's step 1; trial findings 1 and 11), before any write and only when
   * no marker exists yet: a `target` that has nothing in the pool — no affinity, no settings key,
   * no heartbeat, no handle — is refused (also with `force`: nothing to remove, likely a typo);
   * and, unless `force`, one without a settings key (`nodes/<target>/settings`, written by every
   * daemon that serves the node) is refused: only the standalone plugin has served it, which
   * writes no heartbeat, so a live idle node could not veto. The settings key's absence is also
   * compared in the marker's transaction.
   * With `by` (a daemon's automatic removal, src/pool/auto-reclaim.ts): the marker's value carries
   * `by`, and a marker found that this `by` did not write (another daemon's, an operator's) stops
   * the call before any write — the create-only marker decides who runs step 1.
   * Returns the blocks now pending (also those that already were), as keys. A block that cannot be
   * read is not marked (told to `onCorrupt`; `--finish` keeps it).
   * @throws RemovalRefusedError when `target` has a heartbeat (without `force`; the message names
   *   the daemon that wrote it when its value says), it vetoed during the marking, a marker not
   *   written by `by` exists (with `by`), or (with
   *   `checkNode`) it has nothing in the pool or was never served by a daemon (without `force`).
   */
  async mark(target: string, opts: { readonly force?: boolean; readonly windowLease?: (ttlSeconds: number) => Promise<string>; readonly checkNode?: boolean; readonly by?: string } = {}): Promise<string[]> {
    const kv = this.#o.kv;
    const mk = this.#keys.removing(target);
    let marker: KVEntry | null = null;
    /** The window this call created with the marker: its TTL, value and the transaction's revision. */
    let created = null as { ttl: number; value: string; rev: string } | null;
    const made = await runTxn<KVEntry | null>(
      kv,
      async (tx) => {
        const m = await kv.get(mk);
        // An automatic removal (`by`: the reclaiming node, src/pool/auto-reclaim.ts) goes on only
        // with its own marker: the create-only marker decides who runs step 1; nothing is written.
        if (m !== null && opts.by !== undefined && markerBy(m.value) !== opts.by) throw new RemovalRefusedError(`the removal of node ${target} from pool ${this.#o.pool} was begun by ${markerBy(m.value) ?? 'an operator'} (${mk})`);
        if (m !== null) return m;
        if (opts.checkNode === true) await this.#checkRemovable(target, opts.force === true);
        tx.expect(mk, null);
        if (opts.force !== true) tx.expect(this.#keys.alive(target), null);
        const value = removalMarkerValue(target, this.#now(), opts.by);
        tx.put(mk, value);
        if (opts.windowLease !== undefined) {
          // The window outlasts the node's offline allocation (ipam.pool.offline): its settings,
          // read now and compared unchanged in the marker's transaction, size it.
          const se = await tx.get(this.#keys.settings(target));
          const ttl = removalWindowSeconds(se === null ? null : decodeSettings(se), REMOVAL_WINDOW_SECONDS);
          tx.put(this.#keys.window(target), value, await opts.windowLease(ttl));
          tx.onCommit((rev) => (created = { ttl, value, rev }));
        }
        return null;
      },
      {
        attempts: MAX_ATTEMPTS,
        exhausted: () => null,
        lost: async () => {
          if (opts.force === true) return;
          const ae = await kv.get(this.#keys.alive(target));
          if (ae !== null) throw heartbeatRefusal(this.#o.pool, target, this.#keys.alive(target), false, ae.value);
        },
      },
    );
    // Created now: read back (the marker as stored, with its revision).
    marker = made.value ?? (made.revision === null ? null : await kv.get(mk));
    if (marker === null) throw new AppError('STORE_CONFLICT', `pool ${this.#o.pool}: ${MAX_ATTEMPTS} attempts to create ${mk} lost to concurrent writers; try again`);
    if (created !== null && marker.modRevision === created.rev && opts.windowLease !== undefined) {
      // The window's lease was granted before the marker existed, so its TTL ran from before the
      // marker: put the window again with a lease granted now, after the marker (compared
      // unchanged), so `--finish` comes at least the TTL after the marker was created — what the
      // offline argument needs (docs/cluster.md "Why it is safe").
      const wk = this.#keys.window(target);
      const lease = await opts.windowLease(created.ttl);
      const again = await kv.txn([{ key: mk, modRevision: created.rev }, { key: wk, modRevision: created.rev }], [{ put: wk, value: created.value, lease }]);
      if (!again.succeeded && (await kv.get(mk))?.modRevision === created.rev) {
        // The first lease expired already (this call stalled for the whole window): undo the marker.
        await kv.txn([{ key: mk, modRevision: created.rev }], [{ delete: mk }]);
        throw new RemovalRefusedError(`the veto window of node ${target}'s removal from pool ${this.#o.pool} expired before step 1 could confirm it (it stalled for more than ${created.ttl} s): the removal was undone; run remove-node again`);
      }
    } else if (opts.windowLease !== undefined) {
      // The marker existed already (a re-run of step 1, or one whose answer was lost or whose CLI
      // died before the re-lease: review F1): put the window again with a lease granted now,
      // after the marker was read (compared unchanged), so the window runs at least its TTL after
      // the marker is known to exist. A fresh lease of the full TTL only lengthens a window.
      const wk = this.#keys.window(target);
      const ttl = await this.windowSecondsOf(target);
      const lease = await opts.windowLease(ttl);
      const again = await kv.txn([{ key: mk, modRevision: marker.modRevision }], [{ put: wk, value: marker.value, lease }]);
      if (!again.succeeded) throw vetoRefusal(this.#o.pool, target, mk);
    }
    const prefix = this.#keys.affinityPrefix(target);
    const out: string[] = [];
    for (const a of await kv.list(prefix, { keysOnly: true })) {
      const key = a.key.slice(prefix.length);
      const m = marker;
      await runTxn(
        kv,
        async (tx) => {
          const b = await this.#tryBlock(key, new Map());
          if (b instanceof CorruptValueError) {
            this.#report('remove-node', b, `block not marked pendingRelease (it cannot be read): left for an operator; --finish keeps it`);
            return;
          }
          if (b === null || b.value.node !== target) return;
          if (b.value.state === 'pendingRelease') {
            out.push(key);
            return;
          }
          b.value.state = 'pendingRelease';
          tx.expect(this.#keys.block(key), b.rev);
          tx.expect(mk, m.modRevision);
          tx.put(this.#keys.block(key), encodeBlock(b.value));
          tx.onCommit(() => out.push(key));
        },
        {
          attempts: MAX_ATTEMPTS,
          exhausted: () => undefined,
          lost: async () => {
            if ((await kv.get(mk))?.modRevision !== m.modRevision) throw vetoRefusal(this.#o.pool, target, mk);
          },
        },
      );
    }
    return out.sort();
  }

  /**
   * Step 2 of `pool remove-node target`, after the veto window: release every allocation
   * `target` made (its handles, also those whose addresses are borrowed in other nodes' blocks),
   * then delete each of `target`'s blocks left `pendingRelease` and empty (or holding only
   * `target`'s reserve entries, `ipam.pool.offline`: the node is gone), with its affinity,
   * and finally the marker when no block of `target` is left. Every transaction compares the
   * marker's revision as read at the start and that `target`'s heartbeat key is absent, and a
   * handle is released only if each of `target`'s blocks it touches is still `pendingRelease`
   * at the revision read. A veto deletes the marker, so nothing is released after it (review F1).
   * Allocations other nodes borrowed in `target`'s blocks stay (the block stays `pendingRelease`
   * until their DELs). First, `target`'s wants (src/pool/wanted.ts) are dropped — one prefix read
   * of `wanted/<target>/`, then per want its block, compared, with the guard — and a block of
   * `target` wanted by another node's pod is kept. Returns what was released and what was kept. Keys that cannot be read are
   * never released or deleted, and are told to `onCorrupt`: a handle (whose node is unknown), a
   * handle naming a block that cannot be read (its address would stay held with no handle), and
   * such a block (in `keptBlocks`).
   * @throws RemovalRefusedError when step 1 was not run (no marker), the node vetoed (the marker
   *   is gone or was re-created), or its heartbeat key exists.
   */
  async finish(target: string): Promise<{ released: string[]; deletedBlocks: string[]; keptBlocks: string[] }> {
    const kv = this.#o.kv;
    const mk = this.#keys.removing(target);
    const ak = this.#keys.alive(target);
    const marker = await kv.get(mk);
    if (marker === null) {
      throw new RemovalRefusedError(`node ${target} is not marked for removal in pool ${this.#o.pool} (no ${mk}): run remove-node without --finish first, or it vetoed (it is back)`);
    }
    const ae = await kv.get(ak);
    if (ae !== null) throw heartbeatRefusal(this.#o.pool, target, ak, true, ae.value);
    const wk = this.#keys.window(target);
    if ((await kv.get(wk)) !== null) throw windowRefusal(this.#o.pool, target, wk, await this.windowSecondsOf(target));
    const guard: KVCompare[] = [
      { key: mk, modRevision: marker.modRevision },
      { key: ak, absent: true },
      { key: wk, absent: true },
    ];
    /** After a failed transaction: a veto or a heartbeat stops everything; else it was another writer. */
    const recheck = async (): Promise<void> => {
      if ((await kv.get(mk))?.modRevision !== marker.modRevision) throw vetoRefusal(this.#o.pool, target, mk);
      const a2 = await kv.get(ak);
      if (a2 !== null) throw heartbeatRefusal(this.#o.pool, target, ak, true, a2.value);
      if ((await kv.get(wk)) !== null) throw windowRefusal(this.#o.pool, target, wk, await this.windowSecondsOf(target));
    };
    // The node's wants go first (src/pool/wanted.ts): its pods are gone, so are the addresses they wanted.
    for (const d of await dropWants(kv, this.#o, target, () => false, guard, async () => {
      await recheck();
      return undefined;
    })) {
      if (d.corrupt !== undefined) this.#report('remove-node', d.corrupt, `a want of node ${target} (${d.want.ip}) in it cannot be read, so it is not dropped: left for an operator`);
    }
    const released: string[] = [];
    const hprefix = this.#keys.handlesPrefix;
    for (const e of await kv.list(hprefix)) {
      let h: HandleValue;
      try {
        h = decodeHandle(e);
      } catch (err) {
        if (!(err instanceof CorruptValueError)) throw err;
        // Whose it is cannot be told: never released here.
        this.#report('remove-node', err, 'handle not released (it cannot be read): left for an operator');
        continue;
      }
      if (h.node !== target || h.deleted === true) continue;
      const [containerId, ifname] = e.key.slice(hprefix.length).split('/') as [string, string];
      await runTxn(
        kv,
        async (tx) => {
          const cur = await kv.get(e.key);
          if (cur === null) return;
          let hv: HandleValue;
          try {
            hv = decodeHandle(cur);
          } catch (err) {
            if (!(err instanceof CorruptValueError)) throw err;
            this.#report('remove-node', err, 'handle not released (it cannot be read): left for an operator');
            return;
          }
          if (hv.node !== target || hv.deleted === true) return;
          const blocks = new Map<string, RemovalBlock | null>();
          let vetoed = false;
          let unreadable: CorruptValueError | null = null;
          const freed: string[] = [];
          for (const x of hv.ips) {
            const b0 = await this.#tryBlock(x.block, blocks);
            if (b0 instanceof CorruptValueError) {
              unreadable = b0;
              break;
            }
            const b = b0;
            if (b !== null && b.value.node === target && b.value.state !== 'pendingRelease') vetoed = true;
            const a = b?.value.allocs[String(x.ordinal)];
            if (b === null || a === undefined || a.seq !== x.seq || a.id !== containerId || a.ifname !== ifname) continue;
            delete b.value.allocs[String(x.ordinal)];
            b.dirty = true;
            freed.push(x.ip);
          }
          if (unreadable !== null) {
            // Not released at all: the address in the unreadable block would stay held with no handle naming it.
            this.#report('remove-node', unreadable, `handle ${cur.key} not released (a block it names cannot be read): left for an operator`);
            return;
          }
          if (vetoed) return;
          for (const g of guard) tx.expectCompare(g);
          tx.expect(cur.key, cur.modRevision);
          tx.del(cur.key);
          for (const b of blocks.values()) {
            if (b === null || !b.dirty) continue;
            tx.expect(this.#keys.block(b.key), b.rev);
            tx.put(this.#keys.block(b.key), encodeBlock(b.value));
          }
          tx.onCommit(() => released.push(...freed));
        },
        { attempts: MAX_ATTEMPTS, exhausted: () => undefined, lost: recheck },
      );
    }
    const deletedBlocks: string[] = [];
    const keptBlocks: string[] = [];
    const aprefix = this.#keys.affinityPrefix(target);
    for (const a of await kv.list(aprefix)) {
      const key = a.key.slice(aprefix.length);
      const b = await this.#tryBlock(key, new Map());
      if (b instanceof CorruptValueError) {
        this.#report('remove-node', b, 'block kept (it cannot be read): left for an operator');
        keptBlocks.push(key);
        continue;
      }
      // The node's reserve entries (ipam.pool.offline) go with its block: the node is gone.
      // A want (a live pod's address, src/pool/wanted.ts; the node's own were dropped above) keeps it too.
      if (b === null || b.value.state !== 'pendingRelease' || Object.values(b.value.allocs).some((x) => x.reserve !== true || x.node !== target) || b.value.wanted !== undefined) {
        // Kept for a want: the node's reserve entries go all the same (the node is gone; one at a
        // wanted ordinal would keep the live pod's address from being re-reserved), in one
        // transaction under the guard.
        const stale = b === null || b.value.state !== 'pendingRelease' || b.value.wanted === undefined ? [] : Object.keys(b.value.allocs).filter((o) => b.value.allocs[o]?.reserve === true && b.value.allocs[o]?.node === target);
        if (b !== null && stale.length > 0) {
          const v = { ...b.value, allocs: { ...b.value.allocs } };
          for (const o of stale) delete v.allocs[o];
          const ok = await kv.txn([...guard, { key: this.#keys.block(key), modRevision: b.rev }], [{ put: this.#keys.block(key), value: encodeBlock(v) }]);
          if (!ok.succeeded) await recheck();
        }
        keptBlocks.push(key);
        continue;
      }
      const ok = await kv.txn(
        [...guard, { key: this.#keys.block(key), modRevision: b.rev }, { key: a.key, modRevision: a.modRevision }],
        [{ delete: this.#keys.block(key) }, { delete: a.key }],
      );
      if (ok.succeeded) deletedBlocks.push(key);
      else {
        await recheck();
        keptBlocks.push(key);
      }
    }
    // Done with the node: the marker goes too, and its settings key (a node of that name that
    // joins later starts clean: `pool status` no longer lists it, and its daemon writes it again).
    if (keptBlocks.length === 0) {
      const se = await kv.get(this.#keys.settings(target));
      await kv.txn(se === null ? guard : [...guard, { key: se.key, modRevision: se.modRevision }], se === null ? [{ delete: mk }] : [{ delete: mk }, { delete: se.key }]);
    }
    return { released: released.sort(), deletedBlocks: deletedBlocks.sort(), keptBlocks: keptBlocks.sort() };
  }

  /**
   * The veto window `pool remove-node` step 1 gives `node` now, seconds: `max(60, 2·S + 10)` with
   * S from its settings key ({@link removalWindowSeconds}), 60 without one. One read.
   * @throws STORE_CORRUPT for an unreadable settings value.
   */
  async windowSecondsOf(node: string): Promise<number> {
    const se = await this.#o.kv.get(this.#keys.settings(node));
    return removalWindowSeconds(se === null ? null : decodeSettings(se), REMOVAL_WINDOW_SECONDS);
  }
}
