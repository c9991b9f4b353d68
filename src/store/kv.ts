/**
 * `KV`: the transactional key-value seam under the cluster pool (src/pool/, through its
 * revision-checked transactions in src/pool/txn.ts), the few
 * etcd v3 calls they need and nothing more: read one key, read a prefix, and one transaction
 * whose compares are revision checks and whose success branch is puts and deletes
 * (etcd-io/etcd api/etcdserverpb/rpc.proto `TxnRequest`; etcd's "Transaction" guide:
 * "compares … all true → success ops, applied atomically").
 *
 * Implementations: `store/etcd/etcd-kv.ts` (a real etcd over grpc-js with our own etcd .proto; its errors
 * converted at that boundary) and `store/memory/memory-kv.ts` (the fake, same revision rules).
 *
 * Revisions are etcd's int64 counters as decimal strings (`"0"` = no such key). Values are UTF-8
 * text (the stores write JSON). No locks and no leases here: correctness rests on the compares
 * (Jepsen, etcd 3.4.3: etcd's locks are not safe for mutual exclusion; daemons-and-pools.md §3).
 */

/** One key as read. */
export interface KVEntry {
  readonly key: string;
  /** The value as UTF-8 text; `""` for a key read with `keysOnly`. */
  readonly value: string;
  /** Revision of the key's last write (etcd `mod_revision`). */
  readonly modRevision: string;
  /** Revision of the key's creation (etcd `create_revision`). */
  readonly createRevision: string;
}

/**
 * One compare of a transaction: `absent` holds when the key does not exist (etcd
 * `create_revision == 0`); `modRevision` holds when the key exists and was last written at
 * exactly that revision (etcd `mod_revision ==`); `value` holds when the key exists and its value
 * is exactly that text (etcd Compare target `VALUE`, result `EQUAL`; a missing key fails it:
 * etcd-io/etcd etcdserver/apply.go `applyCompare`: "Always fail if comparing a value on a key/keys
 * that doesn't exist"). A revision identifies a value only within one history:
 * an etcd restored from a snapshot (`etcdctl snapshot restore`) winds its revision back and new
 * writes reuse revisions; a value compare holds whatever the revision.
 */
export type KVCompare =
  | { readonly key: string; readonly absent: true }
  | { readonly key: string; readonly modRevision: string }
  | { readonly key: string; readonly value: string };

/** One write of a transaction's success branch. */
export type KVOp = { readonly put: string; readonly value: string; readonly lease?: string } | { readonly delete: string };

/** The answer of {@link KV.txn}. */
export interface KVTxnResult {
  /** True when every compare held and every op was applied (atomically); false: nothing was written. */
  readonly succeeded: boolean;
  /** The store's revision after the transaction (a successful write's keys now have this `modRevision`). */
  readonly revision: string;
}

/** Counts of round trips and writes since the KV was made (benchmarks: etcd writes per allocation). */
export interface KVStats {
  /** Read round trips (`get`, `list`). */
  reads: number;
  /** Transactions sent. */
  txns: number;
  /** Transactions that succeeded. */
  txnsSucceeded: number;
  /** Keys put by successful transactions. */
  puts: number;
  /** Keys deleted by successful transactions. */
  deletes: number;
}

/** A fresh zeroed {@link KVStats}. */
export function zeroStats(): KVStats {
  return { reads: 0, txns: 0, txnsSucceeded: 0, puts: 0, deletes: 0 };
}

/**
 * What {@link KV.clusterCheck} found: the etcd cluster the store's endpoints belong to, as far as
 * they answered.
 */
export interface ClusterCheck {
  /** The cluster ID (etcd's, lower-case hex) every endpoint that answered gave; null when none answered. */
  readonly clusterId: string | null;
  /** The endpoints that did not answer, each with why (`http://10.0.0.6:2379 (etcd at … is unavailable: …)`); empty when all did. */
  readonly unanswered: readonly string[];
}

/** The transactional key-value seam. See the module comment. */
export interface KV {
  /** What it is, for messages (`etcd http://127.0.0.1:2379`). */
  readonly description: string;
  /** Round trips and writes so far. */
  readonly stats: KVStats;
  /**
   * The key, or null when absent. Throws `AppError('STORE_UNAVAILABLE')` (CNI 11) when the store
   * cannot be reached in time, `AppError('STORE_IO')` for any other failure, `ClosedError` after
   * `close()`.
   */
  get(key: string): Promise<KVEntry | null>;
  /**
   * Every key starting with `prefix`, sorted by key (byte order), with values unless `keysOnly`.
   * All from one revision (one etcd range request). Errors as {@link get}.
   */
  list(prefix: string, opts?: { readonly keysOnly?: boolean }): Promise<KVEntry[]>;
  /**
   * The entries of `keys` in order (null for an absent key), all from one revision in one round
   * trip (etcd: one `Txn` of range requests and no compares — a read, linearizable like
   * {@link get}; counted as one read in {@link stats}). At most {@link MAX_TXN_OPS} keys (more
   * throws `AppError('INTERNAL')`). Optional: a caller without it gets each key. Errors as {@link get}.
   */
  getMany?(keys: readonly string[]): Promise<Array<KVEntry | null>>;
  /**
   * One transaction: if every compare holds, apply every op atomically. At most 128 compares plus
   * ops in total (etcd `--max-txn-ops` default 128; anchors.md §6): more throws
   * `AppError('INTERNAL')` before anything is sent. Errors as {@link get}. A transaction whose
   * answer was lost (a timeout) may or may not have been applied: callers re-read and decide by
   * the revisions they see (every writer in ipwarden is idempotent under that rule).
   */
  txn(compare: readonly KVCompare[], ops: readonly KVOp[]): Promise<KVTxnResult>;
  /** Close the connection. Idempotent; later calls throw `ClosedError`. */
  close(): Promise<void>;
  /**
   * Optional (etcd only; the memory KV has no cluster): ask every endpoint which cluster it
   * belongs to. Throws `AppError('IPAM_INVALID_CONFIG')` (CNI 7) when they name two clusters. The
   * pool allocator creates a pool only after a check every endpoint answered, and pins the
   * cluster ID (docs/cluster.md "One etcd cluster").
   */
  clusterCheck?(): Promise<ClusterCheck>;
  /**
   * Optional (etcd only): how many times an answer carried a lower store revision than one seen
   * before (etcd restored from a snapshot: its revision wound back). Starts at 0; a change tells
   * a cache of revisions (the pool allocator's {@link BlockCache}) to drop what it holds. Absent:
   * never.
   */
  readonly generation?: number;
  /**
   * Optional: the highest store revision an answer of this client has carried so far (decimal
   * text), or null before any. Every commit made after this moment lies above it (a key above it
   * may also be older, only not yet seen by this client): the daemon's ADD fence
   * (PoolRequest.since, docs/cluster.md "No leak from a late commit") treats a tombstone above it
   * as possibly later than the ADD — refusing once what a fresh request then allows. Absent: no fence.
   */
  readonly highestRevision?: string | null;
}

/**
 * Leases, for node heartbeats only (never for correctness: on etcd 3.4 a lease's TTL restarts on
 * every leader change, and a client may learn of an expiry late). A key put with a lease is
 * deleted by etcd when the lease expires or is revoked.
 */
export interface Leases {
  /** Grant a lease of `ttlSeconds` (≥ 1); resolves to its ID (decimal text). Errors as {@link KV.get}. */
  grantLease(ttlSeconds: number): Promise<string>;
  /** Renew lease `id`; resolves to its new TTL in seconds, 0 when it has expired (or never existed). */
  keepAlive(id: string): Promise<number>;
  /** Revoke lease `id` (its keys go at once). A lease already gone is fine. */
  revokeLease(id: string): Promise<void>;
}

/** etcd's default `--max-txn-ops` (etcd.io/docs/latest/op-guide/configuration). */
export const MAX_TXN_OPS = 128;

/** The smallest key greater than every key with prefix `p` (etcd's range_end for a prefix: last byte + 1). */
export function prefixEnd(p: Buffer): Buffer {
  const end = Buffer.from(p);
  for (let i = end.length - 1; i >= 0; i--) {
    if ((end[i] as number) < 0xff) {
      end[i] = (end[i] as number) + 1;
      return end.subarray(0, i + 1);
    }
  }
  return Buffer.from([0]); // all 0xff: etcd's "to the end of the keyspace"
}
