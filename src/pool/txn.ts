/**
 * One revision-checked read-modify-write retry for the pool, shaped like etcd's software
 * transactional memory (`client/v3/concurrency/stm.go`, `NewSTM`, the serializable flavour):
 * within one attempt the reads are recorded with the revisions they were made at, the writes are
 * buffered, and the commit is one etcd Txn whose compares hold every recorded key at its recorded
 * revision (`mod_revision == r`, or `create_revision == 0` for a key read absent). A commit that
 * loses its compare is a lost race: the attempt's reads are thrown away and the body runs again
 * on fresh reads, after the caller's backoff (jittered), up to a bound; then the caller's
 * "exhausted" answer (STORE_CONFLICT, CNI 11, for the pool's operations). Correctness rests on
 * the compares only — never a lock or a lease (docs/cluster.md "Guarantees").
 *
 * Unlike etcd's STM, which compares every key it read, a body chooses what to record: the pool
 * reads keys only as hints too (the keys of a prefix listing, other nodes' blocks it does not
 * write), and comparing those would turn unrelated writes into lost races. {@link Txn.get} reads
 * and records; {@link Txn.read} reads without recording; {@link Txn.expect} records a revision
 * learnt elsewhere (a cached block, a key that must still be absent). The body is plain logic: it
 * may run several times, so it must not act outside the Txn before the commit (use
 * {@link Txn.onCommit}).
 */
import { MAX_TXN_OPS, type KV, type KVCompare, type KVEntry, type KVOp } from '../store/kv.ts';

/** Thrown by a body (or by what it calls) when a read raced with a writer: the attempt is retried. */
export class Retry extends Error {
  constructor(why = 'a read raced with a writer') {
    super(why);
  }
}

/** One attempt's recorded reads and buffered writes (see the module comment). */
export class Txn {
  readonly #kv: KV;
  /** Recorded key → revision (null: absent), in record order. */
  readonly #reads = new Map<string, string | null>();
  /** Key → the exact text it must still hold at the commit ({@link expectValue}). */
  readonly #values = new Map<string, string>();
  /** Entries read in this attempt, by key (a second read of a key answers from here: one snapshot per attempt). */
  readonly #seen = new Map<string, KVEntry | null>();
  readonly #ops: KVOp[] = [];
  readonly #commit: Array<(revision: string) => void> = [];
  /** The attempt number, 0 for the first. */
  readonly attempt: number;

  constructor(kv: KV, attempt: number) {
    this.#kv = kv;
    this.attempt = attempt;
  }

  /** Read `key` and record its revision (or its absence): the commit compares it. */
  async get(key: string): Promise<KVEntry | null> {
    const e = await this.read(key);
    if (!this.#reads.has(key)) this.#reads.set(key, e === null ? null : e.modRevision);
    return e;
  }

  /** Read `key` without recording it (a hint: the commit does not compare it). */
  async read(key: string): Promise<KVEntry | null> {
    if (this.#seen.has(key)) return this.#seen.get(key) as KVEntry | null;
    const e = await this.#kv.get(key);
    this.#seen.set(key, e);
    return e;
  }

  /**
   * Read `keys` without recording them ({@link read} for several keys): the ones not yet read in
   * this attempt in one round trip when the KV has `getMany` (etcd: one Txn of range requests, one
   * revision) and there are several, at most {@link MAX_TXN_OPS}; else each read in parallel.
   * Returns the entries in the order of `keys` (null: absent). Errors as the KV's.
   */
  async readMany(keys: readonly string[]): Promise<Array<KVEntry | null>> {
    const todo = [...new Set(keys.filter((k) => !this.#seen.has(k)))];
    const kv = this.#kv;
    const got = todo.length > 1 && todo.length <= MAX_TXN_OPS && kv.getMany !== undefined ? await kv.getMany(todo) : await Promise.all(todo.map((k) => kv.get(k)));
    todo.forEach((k, i) => this.#seen.set(k, got[i] ?? null));
    return keys.map((k) => this.#seen.get(k) as KVEntry | null);
  }

  /**
   * Record that `key` must still have mod revision `revision` at the commit (null: must still be
   * absent), as if read now; a key already recorded keeps its first revision.
   */
  expect(key: string, revision: string | null): void {
    if (!this.#reads.has(key)) this.#reads.set(key, revision);
  }

  /**
   * Record that `key` must still hold exactly the text `value` at the commit (etcd Compare VALUE
   * EQUAL), besides any revision recorded by {@link expect}; a key already so recorded keeps its
   * first text. For a write built on a cached value: a revision alone can name other content
   * after an etcd restored from a snapshot.
   */
  expectValue(key: string, value: string): void {
    if (!this.#values.has(key)) this.#values.set(key, value);
  }

  /** Record compare `c` ({@link expect} for a revision or an absence, {@link expectValue} for a value). */
  expectCompare(c: KVCompare): void {
    if ('absent' in c) this.expect(c.key, null);
    else if ('value' in c) this.expectValue(c.key, c.value);
    else this.expect(c.key, c.modRevision);
  }

  /** Buffer a put (with `lease`, an etcd lease ID, when given). */
  put(key: string, value: string, lease?: string): void {
    this.#ops.push(lease === undefined ? { put: key, value } : { put: key, value, lease });
  }

  /** Buffer a delete of `key`. */
  del(key: string): void {
    this.#ops.push({ delete: key });
  }

  /** Drop the buffered writes and recorded reads (the body decided to send nothing). */
  discard(): void {
    this.#ops.length = 0;
    this.#reads.clear();
    this.#values.clear();
    this.#commit.length = 0;
  }

  /** Run `f` with the commit's revision once this attempt has committed (not on a lost race). */
  onCommit(f: (revision: string) => void): void {
    this.#commit.push(f);
  }

  /** The compares of the commit: every recorded key at its recorded revision, in record order. */
  get compares(): KVCompare[] {
    const byRev: KVCompare[] = [...this.#reads].map(([key, rev]) => (rev === null ? { key, absent: true } : { key, modRevision: rev }));
    return [...byRev, ...[...this.#values].map(([key, value]) => ({ key, value }))];
  }

  /** The buffered writes, in order. */
  get ops(): readonly KVOp[] {
    return this.#ops;
  }

  /** Count of compares plus writes (etcd bounds a transaction's total: `--max-txn-ops`). */
  get size(): number {
    return this.#reads.size + this.#values.size + this.#ops.length;
  }

  /** @internal the driver's after-commit step. */
  committed(revision: string): void {
    for (const f of this.#commit) f(revision);
  }
}

/** How {@link runTxn} retries. */
export interface TxnPolicy<T> {
  /** Attempts before {@link TxnPolicy.exhausted} (≥ 1). */
  readonly attempts: number;
  /** Awaited before attempt `attempt` ≥ 1 (the jittered backoff); default none. */
  readonly backoff?: (attempt: number) => Promise<void>;
  /** The answer when every attempt lost (return a value, or throw: STORE_CONFLICT). */
  readonly exhausted: () => T;
  /**
   * Run after a commit lost its compare, before the next attempt (e.g. drop a cache, veto a
   * removal). Returning `{ stop: v }` ends the retry with the answer `v` (the loss was decisive:
   * a removal was begun), nothing written.
   */
  readonly lost?: () => Promise<{ readonly stop: T } | void> | { readonly stop: T } | void;
}

/**
 * Run `body` in a revision-checked transaction, retried (see the module comment): each attempt
 * gets a fresh {@link Txn}; when the body returns, its buffered writes are committed in one etcd
 * Txn comparing every recorded key, and the body's value is returned once it committed. A body
 * that buffers no write commits nothing (its reads decided: the value is returned as it is). A
 * body that throws {@link Retry} (or a commit that loses) starts the next attempt; any other
 * error is thrown as it is. Never a lock or a lease.
 * @returns the body's value and the commit's revision (null when nothing was written)
 */
export async function runTxn<T>(kv: KV, body: (tx: Txn) => Promise<T>, policy: TxnPolicy<T>): Promise<{ value: T; revision: string | null }> {
  for (let attempt = 0; attempt < policy.attempts; attempt++) {
    if (attempt > 0) await policy.backoff?.(attempt);
    const tx = new Txn(kv, attempt);
    let value: T;
    try {
      value = await body(tx);
    } catch (e) {
      if (e instanceof Retry) continue;
      throw e;
    }
    if (tx.ops.length === 0) return { value, revision: null };
    const r = await kv.txn(tx.compares, tx.ops);
    if (r.succeeded) {
      tx.committed(r.revision);
      return { value, revision: r.revision };
    }
    const s = await policy.lost?.();
    if (s !== undefined) return { value: s.stop, revision: null };
  }
  return { value: policy.exhausted(), revision: null };
}
