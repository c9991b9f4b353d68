/**
 * `MemoryKV`: the in-memory fake of {@link KV} with etcd's revision rules (one global revision,
 * incremented once per successful write transaction; every key written in it gets that
 * `modRevision`; a created key's `createRevision` is it too). For unit tests of the pool allocator
 * and the etcd store's logic without an etcd. Test aids: `beforeTxn` to run a racing writer just
 * before a transaction is evaluated, `failNext` to inject an unavailable store.
 */
import { AppError, ClosedError } from '../../common/errors.ts';
import { MAX_TXN_OPS, zeroStats, type KV, type KVCompare, type KVEntry, type KVOp, type KVStats, type KVTxnResult, type Leases } from '../kv.ts';

interface Stored {
  value: string;
  modRevision: number;
  createRevision: number;
  lease: string | null;
}

/** In-memory {@link KV}. See the module comment. */
export class MemoryKV implements KV, Leases {
  readonly description = 'memory';
  readonly stats: KVStats = zeroStats();
  /** Called once before each transaction is evaluated (a racing writer may write through `this`). */
  beforeTxn: ((compare: readonly KVCompare[], ops: readonly KVOp[]) => void) | null = null;
  /** Number of next calls (get, list, txn) that throw `AppError('STORE_UNAVAILABLE')`. */
  failNext = 0;

  readonly #data = new Map<string, Stored>();
  readonly #leases = new Map<string, number>();
  #nextLease = 0x1000;
  #revision = 1;
  #closed = false;

  /** The current revision (etcd's starts at 1 for an empty store). */
  get revision(): number {
    return this.#revision;
  }

  #check(): void {
    if (this.#closed) throw new ClosedError('memory KV');
    if (this.failNext > 0) {
      this.failNext--;
      throw new AppError('STORE_UNAVAILABLE', 'memory KV is unavailable (injected)');
    }
  }

  #entry(key: string, s: Stored): KVEntry {
    return { key, value: s.value, modRevision: String(s.modRevision), createRevision: String(s.createRevision) };
  }

  async get(key: string): Promise<KVEntry | null> {
    this.#check();
    this.stats.reads++;
    const s = this.#data.get(key);
    return s === undefined ? null : this.#entry(key, s);
  }

  async getMany(keys: readonly string[]): Promise<Array<KVEntry | null>> {
    this.#check();
    if (keys.length > MAX_TXN_OPS) throw new AppError('INTERNAL', `a read of ${keys.length} keys exceeds etcd's limit of ${MAX_TXN_OPS} ops per transaction`);
    if (keys.length === 0) return [];
    this.stats.reads++;
    return keys.map((k) => {
      const s = this.#data.get(k);
      return s === undefined ? null : this.#entry(k, s);
    });
  }

  async list(prefix: string, opts: { readonly keysOnly?: boolean } = {}): Promise<KVEntry[]> {
    this.#check();
    this.stats.reads++;
    const keys = [...this.#data.keys()].filter((k) => k.startsWith(prefix)).sort((a, b) => Buffer.compare(Buffer.from(a), Buffer.from(b)));
    return keys.map((k) => {
      const e = this.#entry(k, this.#data.get(k) as Stored);
      return opts.keysOnly === true ? { ...e, value: '' } : e;
    });
  }

  async txn(compare: readonly KVCompare[], ops: readonly KVOp[]): Promise<KVTxnResult> {
    this.#check();
    if (compare.length + ops.length > MAX_TXN_OPS) {
      throw new AppError('INTERNAL', `transaction of ${compare.length + ops.length} compares and ops exceeds etcd's limit of ${MAX_TXN_OPS}`);
    }
    this.stats.txns++;
    const hook = this.beforeTxn;
    if (hook !== null) hook(compare, ops);
    return this.apply(compare, ops);
  }

  /** Evaluate and apply a transaction without the hook or the counters' round trip (a racing writer uses it). */
  apply(compare: readonly KVCompare[], ops: readonly KVOp[]): KVTxnResult {
    const holds = compare.every((c) => {
      const s = this.#data.get(c.key);
      if ('absent' in c) return s === undefined;
      if ('value' in c) return s !== undefined && s.value === c.value;
      return s !== undefined && String(s.modRevision) === c.modRevision;
    });
    if (!holds) return { succeeded: false, revision: String(this.#revision) };
    if (ops.length === 0) return { succeeded: true, revision: String(this.#revision) };
    const rev = ++this.#revision;
    for (const op of ops) {
      if ('put' in op) {
        const old = this.#data.get(op.put);
        this.#data.set(op.put, { value: op.value, modRevision: rev, createRevision: old?.createRevision ?? rev, lease: op.lease ?? null });
        this.stats.puts++;
      } else if (this.#data.delete(op.delete)) {
        this.stats.deletes++;
      }
    }
    this.stats.txnsSucceeded++;
    return { succeeded: true, revision: String(rev) };
  }

  async grantLease(ttlSeconds: number): Promise<string> {
    this.#check();
    const id = String(++this.#nextLease);
    this.#leases.set(id, ttlSeconds);
    return id;
  }

  async keepAlive(id: string): Promise<number> {
    this.#check();
    return this.#leases.get(id) ?? 0;
  }

  async revokeLease(id: string): Promise<void> {
    this.#check();
    this.expireLease(id);
  }

  /** Let lease `id` expire now: its keys are deleted (test aid; a real etcd does it on its own). */
  expireLease(id: string): void {
    if (!this.#leases.delete(id)) return;
    const keys = [...this.#data].filter(([, s]) => s.lease === id).map(([k]) => k);
    if (keys.length > 0) this.apply([], keys.map((k) => ({ delete: k })));
  }

  /** Put `value` at `key` directly (test aid: a value another writer, or a corruption, left). */
  plant(key: string, value: string): void {
    this.apply([], [{ put: key, value }]);
  }

  /** Every key and value, sorted (test aid). */
  dump(): Record<string, string> {
    const out: Record<string, string> = {};
    for (const k of [...this.#data.keys()].sort()) out[k] = (this.#data.get(k) as Stored).value;
    return out;
  }

  async close(): Promise<void> {
    this.#closed = true;
  }
}
