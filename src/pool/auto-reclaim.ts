/**
 * Dead nodes reclaimed without a person (docs/cluster.md "Reclaiming dead nodes automatically
 * (`reclaimAfter`)"). A daemon whose pool config has `ipam.pool.reclaimAfter` runs
 * {@link AutoReclaimer.scan} on each of its heartbeats (every 10 s): it lists the pool's heartbeat
 * keys, its node index (keys only: the settings keys) and its removal markers, and
 *
 * 1. **measures absence on its own monotonic clock**: a node with a settings key (a daemon served
 *    it) and no heartbeat key is *absent since* the first scan that saw it so; a scan that sees its
 *    heartbeat again forgets it. No wall clock of another node is compared, and a daemon that
 *    starts has seen nobody absent yet (a restart only delays). A node never served by a daemon
 *    (no settings key: only the standalone plugin, which writes no heartbeat) is never a candidate,
 *    nor any node this daemon heartbeats for;
 * 2. **begins the removal** of a node absent for `reclaimAfter` by step 1 of `pool remove-node`
 *    ({@link PoolRemoval.mark}: the create-only marker `removing/<node>` with the
 *    node's heartbeat compared absent and its settings unchanged, the veto window, its blocks
 *    `pendingRelease`), with `by` (this daemon's node) in the marker. **The create-only marker
 *    decides who runs it**: of two daemons that try at once, one transaction creates the marker;
 *    the other finds a marker it did not write and stops, writing nothing. No lock, no lease;
 * 3. **finishes only its own removals** ({@link PoolRemoval.finish}, revision-checked and
 *    idempotent) once the veto window key has expired, after writing the handles it is about to
 *    release to the audit sink (durably: the report's `intent` throws → nothing is released). A
 *    node that returns vetoes exactly as for an operator's removal (its heartbeat deletes the
 *    marker; every `--finish` transaction compares the marker's revision and the heartbeat key
 *    absent). Blocks other nodes still borrow in keep the marker: it is finished again each scan;
 * 4. **takes over** a removal begun by a daemon whose own heartbeat has been absent for
 *    `reclaimAfter` too (the remover died): a revision-checked put of the marker naming itself
 *    (compared at the revision read, and the target's heartbeat absent): again one winner.
 *
 * An operator's marker (no `by`: `ipwarden pool remove-node`) is never touched. Every decision
 * that writes is a transaction whose compares are revisions; the clock only delays.
 *
 * {@link SeenWriter}: every daemon records when it last saw itself alive in a pool,
 * `P/pools/<pool>/seen/<node>` → `{"v":1,"node","at"}` (`at`: the writer's wall clock, ms), on
 * its first heartbeat and then at most every {@link SEEN_EVERY_MS} — what `pool status` and
 * `pool remove-node` show as "last seen" once the heartbeat key is gone. Information only: no
 * decision reads it.
 */
import { validNodeName } from '../ipam/pool-config.ts';
import type { KV, KVEntry, Leases } from '../store/kv.ts';
import type { PoolAllocatorOptions } from './allocator.ts';
import { PoolRemoval, RemovalRefusedError } from './removal.ts';
import { blockKeyCidr, markerBy } from './model.ts';
import { nodeHandles, type PoolHandleEntry } from './reclaim.ts';

/** How often a daemon re-writes its `seen/<node>` key at most, milliseconds (5 min). */
export const SEEN_EVERY_MS = 300_000;

/** The key of `node`'s last-seen record: `<prefix>/pools/<pool>/seen/<node>`. */
export function seenKey(prefix: string, pool: string, node: string): string {
  return `${prefix}/pools/${pool}/seen/${node}`;
}

/**
 * The time in a `seen/<node>` value (`{"v":1,"node","at"}`), milliseconds since the epoch on the
 * writer's clock, or null when the value is not one (never an error: information only).
 */
export function seenAt(value: string | null | undefined): number | null {
  if (value === null || value === undefined) return null;
  try {
    const v = JSON.parse(value) as Record<string, unknown>;
    return v['v'] === 1 && typeof v['at'] === 'number' && Number.isFinite(v['at']) ? v['at'] : null;
  } catch {
    return null;
  }
}

/**
 * The last-seen times of a pool's nodes: one prefix read of `seen/`. Node → ms since the epoch (the
 * node's own clock). Keys that are not a node's or values that do not parse are left out.
 * @throws AppError STORE_UNAVAILABLE as {@link KV.list}
 */
export async function lastSeen(kv: KV, prefix: string, pool: string): Promise<Map<string, number>> {
  const base = `${prefix}/pools/${pool}/seen/`;
  const out = new Map<string, number>();
  for (const e of await kv.list(base)) {
    const n = e.key.slice(base.length);
    const at = seenAt(e.value);
    if (validNodeName(n) && at !== null) out.set(n, at);
  }
  return out;
}

/**
 * Writes a node's `seen/<node>` key on its daemon's heartbeat: the first call per node, then at
 * most once per {@link SEEN_EVERY_MS} on the monotonic `clock` (one put; about 12 writes an hour
 * per node and pool). Failures are swallowed and retried on the next call.
 */
export class SeenWriter {
  readonly #kv: KV;
  readonly #clock: () => number;
  readonly #now: () => number;
  readonly #last = new Map<string, number>();

  /**
   * @param clock monotonic milliseconds (decides when to write again)
   * @param now wall-clock milliseconds since the epoch (the value's `at`)
   */
  constructor(kv: KV, clock: () => number, now: () => number = Date.now) {
    this.#kv = kv;
    this.#clock = clock;
    this.#now = now;
  }

  /** Write `seen/<node>` of pool `pool` under `prefix` if due. Never throws. */
  async beat(prefix: string, pool: string, node: string): Promise<void> {
    const key = seenKey(prefix, pool, node);
    const t = this.#clock();
    const last = this.#last.get(key);
    if (last !== undefined && t - last < SEEN_EVERY_MS) return;
    try {
      await this.#kv.txn([], [{ put: key, value: JSON.stringify({ v: 1, node, at: this.#now() }) }]);
      this.#last.set(key, t);
    } catch {
      // Information only: the next beat tries again.
    }
  }
}

/** One attachment an automatic removal is about to release (or released). */
export interface ReclaimHandle {
  readonly containerId: string;
  readonly ifname: string;
  readonly network: string;
  /** Its addresses and the block (CIDR) each is in. */
  readonly ips: ReadonlyArray<{ readonly ip: string; readonly block: string }>;
  /** The handle's `mod_revision` when read (decimal text). */
  readonly modRevision: string;
}

/** The pool, the remover (`by`) and the removed node of an event. */
export interface ReclaimScope {
  readonly pool: string;
  /** This daemon's node: who removes. */
  readonly by: string;
  /** The node removed. */
  readonly node: string;
}

/**
 * Where an {@link AutoReclaimer} tells what it does (the daemon: log lines, the audit log, the
 * metric). `intent` must make its records durable before it returns: it throws when it cannot,
 * and then nothing is released. The others must not throw (what they throw is ignored).
 */
export interface AutoReclaimReport {
  /** Step 1 committed by this daemon: the marker is its own; `blocks` marked `pendingRelease` (keys). */
  begun(e: ReclaimScope & { readonly absentSeconds: number; readonly blocks: readonly string[]; readonly windowSeconds: number }): void;
  /** About to run `--finish` on these handles of the node (durably recorded before it returns). */
  intent(e: ReclaimScope & { readonly handles: readonly ReclaimHandle[] }): void;
  /**
   * `--finish` ran: `released` addresses, deleted and kept blocks (keys); `refused` set when it
   * stopped (the node vetoed, its heartbeat is back) — then `released` holds what was released
   * before it stopped (usually nothing). `first` is true for the first finish of this marker by
   * this daemon that did not stop: the node counts as reclaimed once.
   */
  finished(e: ReclaimScope & { readonly handles: readonly ReclaimHandle[]; readonly released: readonly string[]; readonly deletedBlocks: readonly string[]; readonly keptBlocks: readonly string[]; readonly refused: string | null; readonly first: boolean }): void;
  /** Anything else worth a line (a removal not begun, taken over, an etcd error). */
  log(level: 'info' | 'warn' | 'error', fields: Record<string, unknown>, msg: string): void;
}

/** What an {@link AutoReclaimer} works on. */
export interface AutoReclaimOptions {
  /** The pool's etcd client (leases for the veto window). */
  readonly kv: KV & Leases;
  /** `ipam.pool.name`. */
  readonly pool: string;
  /** `ipam.pool.etcd.prefix`. */
  readonly prefix: string;
  /** Block sizes of the pool. Not read since the removal needs no allocator (src/pool/removal.ts); kept so the daemon's callers are unchanged. */
  readonly sizes: PoolAllocatorOptions['sizes'];
  /** `ipam.pool.reclaimAfter`, milliseconds. */
  readonly reclaimAfterMs: number;
  /** Monotonic milliseconds (the daemon: `performance.now`; tests inject one). */
  readonly clock: () => number;
  readonly report: AutoReclaimReport;
  /** Told of every corrupt key a removal went on without. */
  readonly onCorrupt?: PoolAllocatorOptions['onCorrupt'];
}

/** See the module comment. One per pool (etcd, prefix, name) per daemon. */
export class AutoReclaimer {
  readonly #o: AutoReclaimOptions;
  readonly #base: string;
  /** The nodes this daemon heartbeats for in the pool: never candidates; the first is `by`. */
  readonly #own: string[] = [];
  /** Node → monotonic ms of the first scan that saw it served and without a heartbeat. */
  readonly #absentSince = new Map<string, number>();
  /** Removers whose heartbeat is absent, by marker key → monotonic ms first seen so. */
  readonly #removerAbsentSince = new Map<string, number>();
  /** Markers (key@create_revision) whose step 1 this process confirmed (its window re-leased after the marker). */
  readonly #confirmed = new Set<string>();
  /** Markers (key@create_revision) this process has finished once without a refusal (counted). */
  readonly #finished = new Set<string>();
  #running = false;

  constructor(o: AutoReclaimOptions) {
    this.#o = o;
    this.#base = `${o.prefix}/pools/${o.pool}`;
  }

  /** A node this daemon heartbeats for in the pool (never removed by it; the first names the remover). */
  addOwn(node: string): void {
    if (!this.#own.includes(node)) this.#own.push(node);
  }

  /** Who removes: this daemon's (first) node in the pool. */
  get by(): string | null {
    return this.#own[0] ?? null;
  }

  /** The removal operator: acts as no node, allocates nothing. */
  #operator(): PoolRemoval {
    return new PoolRemoval({ kv: this.#o.kv, pool: this.#o.pool, prefix: this.#o.prefix, ...(this.#o.onCorrupt === undefined ? {} : { onCorrupt: this.#o.onCorrupt }) });
  }

  /** Node names under `dir` (`alive/`, `removing/`): the part after it, valid names only. */
  #names(entries: readonly KVEntry[], dir: string): Map<string, KVEntry> {
    const p = `${this.#base}/${dir}/`;
    const out = new Map<string, KVEntry>();
    for (const e of entries) {
      const n = e.key.slice(p.length);
      if (validNodeName(n)) out.set(n, e);
    }
    return out;
  }

  /**
   * One round (see the module comment): three prefix reads (heartbeat keys and node index keys
   * only, the markers with values), then at most one step 1 or `--finish` per node due. Scans
   * never overlap (a call while one runs returns at once). Never throws: etcd errors are logged
   * and the next heartbeat tries again.
   */
  async scan(): Promise<void> {
    const by = this.by;
    if (this.#running || by === null) return;
    this.#running = true;
    try {
      await this.#scan(by);
    } catch (e) {
      this.#o.report.log('warn', { pool: this.#o.pool, by, error: e instanceof Error ? e.message : String(e) }, 'automatic node removal: scan failed (retried on the next heartbeat)');
    } finally {
      this.#running = false;
    }
  }

  async #scan(by: string): Promise<void> {
    const kv = this.#o.kv;
    const [aliveList, index, markerList] = await Promise.all([kv.list(`${this.#base}/alive/`, { keysOnly: true }), kv.list(`${this.#base}/nodes/`, { keysOnly: true }), kv.list(`${this.#base}/removing/`)]);
    const now = this.#o.clock();
    const alive = this.#names(aliveList, 'alive');
    const markers = this.#names(markerList, 'removing');
    const served = new Set<string>();
    const np = `${this.#base}/nodes/`;
    for (const e of index) {
      const rest = e.key.slice(np.length);
      if (!rest.endsWith('/settings')) continue;
      const n = rest.slice(0, -'/settings'.length);
      if (validNodeName(n)) served.add(n);
    }
    // Absence, on this daemon's monotonic clock only.
    for (const n of [...this.#absentSince.keys()]) if (!served.has(n) || alive.has(n) || this.#own.includes(n)) this.#absentSince.delete(n);
    for (const n of served) if (!alive.has(n) && !this.#own.includes(n) && !this.#absentSince.has(n)) this.#absentSince.set(n, now);
    for (const k of [...this.#removerAbsentSince.keys()]) if (![...markers.values()].some((m) => m.key === k)) this.#removerAbsentSince.delete(k);

    for (const [node, m] of markers) {
      if (this.#own.includes(node)) continue; // our own node's removal: our heartbeat vetoes it
      const mb = markerBy(m.value);
      if (mb === null) continue; // an operator's removal: theirs to finish
      if (this.#own.includes(mb)) {
        await this.#drive(by, node, m, alive.has(node));
        continue;
      }
      // Another daemon's removal: taken over only when that remover's heartbeat is gone for reclaimAfter too.
      if (alive.has(mb) || alive.has(node)) {
        this.#removerAbsentSince.delete(m.key);
        continue;
      }
      const since = this.#removerAbsentSince.get(m.key);
      if (since === undefined) {
        this.#removerAbsentSince.set(m.key, now);
        continue;
      }
      if (now - since < this.#o.reclaimAfterMs) continue;
      await this.#takeOver(by, node, m, mb);
    }

    for (const [node, since] of this.#absentSince) {
      if (markers.has(node) || now - since < this.#o.reclaimAfterMs) continue;
      await this.#begin(by, node, now - since);
    }
  }

  /** Step 1 with `by`: the create-only marker decides; a marker found that is not ours stops it, writing nothing. */
  async #begin(by: string, node: string, absentMs: number): Promise<void> {
    const scope = { pool: this.#o.pool, by, node };
    try {
      const op = this.#operator();
      const blocks = await op.mark(node, { checkNode: true, windowLease: (ttl) => this.#o.kv.grantLease(ttl), by });
      const m = await this.#o.kv.get(op.removingKey(node));
      if (m !== null) this.#confirmed.add(`${m.key}@${m.createRevision}`);
      this.#o.report.begun({ ...scope, absentSeconds: Math.round(absentMs / 100) / 10, blocks, windowSeconds: await op.windowSecondsOf(node) });
    } catch (e) {
      if (e instanceof RemovalRefusedError) this.#o.report.log('info', { ...scope, error: e.message }, 'automatic node removal not begun');
      else this.#o.report.log('warn', { ...scope, error: e instanceof Error ? e.message : String(e) }, 'automatic node removal: step 1 failed (retried on the next heartbeat)');
    }
  }

  /** A removal whose remover is gone: the marker re-written naming `by`, compared at its revision (one winner). */
  async #takeOver(by: string, node: string, m: KVEntry, from: string): Promise<void> {
    let value: Record<string, unknown>;
    try {
      value = JSON.parse(m.value) as Record<string, unknown>;
    } catch {
      return; // not ours to repair
    }
    const t = await this.#o.kv.txn(
      [
        { key: m.key, modRevision: m.modRevision },
        { key: `${this.#base}/alive/${node}`, absent: true },
      ],
      [{ put: m.key, value: JSON.stringify({ ...value, by }) }],
    );
    this.#removerAbsentSince.delete(m.key);
    if (t.succeeded) this.#o.report.log('info', { pool: this.#o.pool, by, node, from }, 'automatic node removal taken over (its remover has no heartbeat)');
  }

  /** Our own marker: confirm step 1 once per process, then `--finish` once the window has expired. */
  async #drive(by: string, node: string, m: KVEntry, nodeAlive: boolean): Promise<void> {
    const scope = { pool: this.#o.pool, by, node };
    if (nodeAlive) return; // it is back: its daemon's next beat vetoes (deletes the marker)
    const op = this.#operator();
    const id = `${m.key}@${m.createRevision}`;
    if (!this.#confirmed.has(id)) {
      // Begun by an earlier process of this daemon, or a step 1 whose answer was lost: run it
      // again (it re-leases the window after the marker is known, and marks the blocks).
      try {
        await op.mark(node, { windowLease: (ttl) => this.#o.kv.grantLease(ttl), by });
        this.#confirmed.add(id);
      } catch (e) {
        if (e instanceof RemovalRefusedError) this.#o.report.log('info', { ...scope, error: e.message }, 'automatic node removal not confirmed');
        else throw e;
      }
      return;
    }
    if ((await this.#o.kv.get(`${this.#base}/removal-window/${node}`)) !== null) return; // the veto window is open
    const hp = `${this.#base}/handles/`;
    const hs: PoolHandleEntry[] = nodeHandles(await this.#o.kv.list(hp), { prefix: this.#o.prefix, pool: this.#o.pool }, node).handles;
    const handles: ReclaimHandle[] = hs.map((h) => ({ containerId: h.containerId, ifname: h.ifname, network: h.value.network, ips: h.value.ips.map((x) => ({ ip: x.ip, block: blockKeyCidr(x.block) ?? x.block })), modRevision: h.modRevision }));
    if (handles.length > 0) {
      try {
        this.#o.report.intent({ ...scope, handles });
      } catch (e) {
        this.#o.report.log('error', { ...scope, error: e instanceof Error ? e.message : String(e) }, 'automatic node removal: the audit log cannot be written: nothing released');
        return;
      }
    }
    const first = !this.#finished.has(id);
    try {
      const r = await op.finish(node);
      this.#finished.add(id);
      this.#o.report.finished({ ...scope, handles, ...r, refused: null, first });
      if (r.keptBlocks.length === 0) {
        // Done (the marker and the settings key are gone): its last-seen record goes too, unless it is back.
        await this.#o.kv.txn([{ key: m.key, absent: true }], [{ delete: seenKey(this.#o.prefix, this.#o.pool, node) }]);
      }
    } catch (e) {
      if (!(e instanceof RemovalRefusedError)) throw e; // etcd trouble: the scan logs it, the next one goes on
      // Stopped (a veto, the heartbeat back): what it released before it stopped is what is gone now.
      const left = new Set(nodeHandles(await this.#o.kv.list(hp), { prefix: this.#o.prefix, pool: this.#o.pool }, node).handles.map((h) => `${h.containerId}/${h.ifname}@${h.modRevision}`));
      const released = handles.filter((h) => !left.has(`${h.containerId}/${h.ifname}@${h.modRevision}`)).flatMap((h) => h.ips.map((x) => x.ip));
      this.#o.report.finished({ ...scope, handles, released, deletedBlocks: [], keptBlocks: [], refused: e.message, first: false });
    }
  }
}

/** A log sink in the shape of the daemon's pool lines (`OfflineLog`). */
export type ReclaimLog = (level: 'info' | 'warn' | 'error', fields: Record<string, unknown>, msg: string) => void;

/**
 * The log lines of automatic removals, the report without audit or metric (the daemon adds those,
 * src/daemon/pool-reclaim.ts): `pool node removal begun automatically` (info: pool, by, node,
 * absentSeconds, blocks as CIDRs, windowSeconds), `pool node reclaimed automatically` (warn: pool,
 * by, node, released, deletedBlocks, keptBlocks — each finish that released or deleted
 * something), `automatic node removal stopped: the node vetoed` (warn: pool, by, node, why,
 * released). `intent` records nothing (no audit here).
 */
export function logReport(log: ReclaimLog): AutoReclaimReport {
  return {
    begun: (e) => log('info', { pool: e.pool, by: e.by, node: e.node, absentSeconds: e.absentSeconds, blocks: e.blocks.map(blockKeyCidr), windowSeconds: e.windowSeconds }, 'pool node removal begun automatically'),
    intent: () => undefined,
    finished: (e) => {
      if (e.refused !== null) log('warn', { pool: e.pool, by: e.by, node: e.node, why: e.refused, released: e.released }, 'automatic node removal stopped: the node vetoed');
      else if (e.first || e.released.length > 0 || e.deletedBlocks.length > 0) {
        log('warn', { pool: e.pool, by: e.by, node: e.node, released: e.released, deletedBlocks: e.deletedBlocks.map(blockKeyCidr), keptBlocks: e.keptBlocks.map(blockKeyCidr) }, 'pool node reclaimed automatically');
      }
    },
    log,
  };
}
