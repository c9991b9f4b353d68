/**
 * What the daemon's pool sessions (src/daemon/pool-sessions.ts) tell its metrics
 * (src/daemon/metrics.ts): the event types of a {@link PoolObserver}, {@link observeTxns} (a KV
 * whose transactions are counted) and the gauges' samples. Moved here from src/cni/pool.ts.
 */
import { AppError } from '../common/errors.ts';
import type { ClusterCheck, KV, KVCompare, KVEntry, KVOp, KVStats, KVTxnResult, Leases } from '../store/kv.ts';
import type { PoolNodeSample } from '../pool/index.ts';

/** The pool and node an observed event belongs to (the metrics' `pool` and `node` labels). */
export interface PoolEventScope {
  /** `ipam.pool.name`. */
  readonly pool: string;
  /** The node name the request was served as ({@link NO_NODE} when it could not be resolved). */
  readonly node: string;
}

/** One pool request the daemon answered ({@link PoolObserver.request}). */
export interface PoolRequestEvent extends PoolEventScope {
  readonly command: 'ADD' | 'DEL' | 'CHECK';
  /** `ok`, or the CNI error code it failed with as decimal text (`"11"`, `"7"`; `"999"` for a non-AppError). */
  readonly result: string;
  /** From the call into the sessions to its answer (an ADD's wait for its batch included), seconds. */
  readonly durationSeconds: number;
}

/**
 * How one etcd transaction of the pool allocator ended: `committed` (every compare held),
 * `conflict` (a compare failed: nothing written; the allocator re-reads and retries),
 * `unavailable` (STORE_UNAVAILABLE, CNI 11: etcd not reached in time — the outcome is unknown and
 * the allocator decides from fresh reads), `error` (any other failure).
 */
export type PoolTxnOutcome = 'committed' | 'conflict' | 'unavailable' | 'error';

/** One transaction of the pool allocator ({@link PoolObserver.txn}). */
export interface PoolTxnEvent extends PoolEventScope {
  readonly outcome: PoolTxnOutcome;
}

/** One ADD batch sent ({@link PoolObserver.batch}). */
export interface PoolBatchEvent extends PoolEventScope {
  /** Requests in the batch (1 to `MAX_BATCH`). */
  readonly size: number;
}

/**
 * What {@link PoolSessions} reports as it works: a plain object of callbacks, so the daemon's
 * metrics (src/daemon/metrics.ts, prom-client) observe the pool without the sessions importing
 * them. Every member is optional: a new kind of event (branch `offline`'s
 * offline ADDs, DELs and syncs, say) is a new optional member, and observers written before it
 * still type-check. Calls are synchronous, made after the fact, and must not block; an observer
 * that throws is ignored (counting never fails a pod).
 */
export interface PoolObserver {
  /** A pool ADD, DEL or CHECK answered (or failed). */
  request?(e: PoolRequestEvent): void;
  /** An etcd transaction of the pool allocator ended (heartbeats are not counted). */
  txn?(e: PoolTxnEvent): void;
  /** A batch of ADDs and DELs taken from a queue, about to be sent as one transaction. */
  batch?(e: PoolBatchEvent): void;
  /**
   * Offline allocation (`ipam.pool.offline`, docs/cluster.md "Offline allocation"): an ADD or DEL
   * answered offline, a journal entry synced, or one whose sync failed for good (its reserve
   * entry gone; told once per entry). Gauges (reserve left, entries waiting, contact age) are
   * {@link PoolSessions.offlineStats}.
   */
  offline?(e: PoolOfflineEvent): void;
}

/** One offline-allocation event ({@link PoolObserver.offline}). */
export interface PoolOfflineEvent extends PoolEventScope {
  readonly kind: 'add' | 'del' | 'synced' | 'syncFailure';
}

/** Call `f` and ignore what it throws (an observer never fails a request). */
export function tell(f: () => void): void {
  try {
    f();
  } catch {
    // counting never fails a pod
  }
}

/** The {@link PoolRequestEvent} result of a failure: its CNI code, decimal. */
export function resultOf(e: unknown): string {
  return e instanceof AppError ? String(e.cniCode) : '999';
}

/**
 * `kv` with every transaction's outcome told to `observer.txn` (labelled `scope`); `kv` itself
 * when the observer does not count transactions. Reads, leases and `close` pass through.
 */
export function observeTxns(kv: KV & Leases, scope: PoolEventScope, observer: PoolObserver): KV & Leases {
  if (observer.txn === undefined) return kv;
  const report = (outcome: PoolTxnOutcome) => tell(() => observer.txn?.({ ...scope, outcome }));
  return {
    get description(): string {
      return kv.description;
    },
    get stats(): KVStats {
      return kv.stats;
    },
    get generation(): number | undefined {
      return kv.generation;
    },
    get highestRevision(): string | null | undefined {
      return kv.highestRevision;
    },
    get: (key: string): Promise<KVEntry | null> => kv.get(key),
    list: (prefix: string, opts?: { readonly keysOnly?: boolean }): Promise<KVEntry[]> => kv.list(prefix, opts),
    ...(kv.getMany === undefined ? {} : { getMany: (keys: readonly string[]) => (kv.getMany as (k: readonly string[]) => Promise<Array<KVEntry | null>>).call(kv, keys) }),
    txn: async (compare: readonly KVCompare[], ops: readonly KVOp[]): Promise<KVTxnResult> => {
      let r: KVTxnResult;
      try {
        r = await kv.txn(compare, ops);
      } catch (e) {
        report(e instanceof AppError && e.code === 'STORE_UNAVAILABLE' ? 'unavailable' : 'error');
        throw e;
      }
      report(r.succeeded ? 'committed' : 'conflict');
      return r;
    },
    close: () => kv.close(),
    ...(kv.clusterCheck === undefined ? {} : { clusterCheck: () => (kv.clusterCheck as () => Promise<ClusterCheck>).call(kv) }),
    grantLease: (ttl: number) => kv.grantLease(ttl),
    keepAlive: (id: string) => kv.keepAlive(id),
    revokeLease: (id: string) => kv.revokeLease(id),
  };
}

/**
 * The gauges of one pool as one node sees it ({@link PoolSessions.sample}): the fields of one
 * `pool status` read ({@link PoolNodeSample}, src/pool/status.ts: counts are addresses or blocks)
 * with the pool and node they are about.
 */
export interface PoolSample extends PoolEventScope, PoolNodeSample {}

/** A pool whose status could not be read ({@link PoolSessions.sample}). */
export interface PoolSampleError extends PoolEventScope {
  /** The error's message (etcd unreachable, a corrupt value). */
  readonly error: string;
}
