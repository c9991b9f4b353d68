/**
 * `EtcdKV`: the {@link KV} seam on a real etcd v3 through the `etcd3` npm client
 * (microsoft/etcd3 1.1.2; chosen in docs/dependencies.md). Only this file imports `etcd3`: it
 * wraps the raw `KV` gRPC service (`range`, `txn`) and converts every foreign error at this
 * boundary (house style 7, like etcd3's own `castGrpcError`):
 *
 * - unreachable, no leader, deadline exceeded, cancelled, a circuit broken by repeated failures
 *   (`GRPCUnavailableError`, `GRPCDeadlineExceededError`, `GRPCCancelledError`, cockatiel's
 *   `BrokenCircuitError`, etcd's `etcdserver: no leader` / `leader changed` / `request timed
 *   out`) → `AppError('STORE_UNAVAILABLE')` (CNI 11, retryable);
 * - the client closed → `ClosedError`;
 * - anything else (permission denied, bad auth, a refused request) → `AppError('STORE_IO')` (CNI 5).
 *
 * Every call carries a deadline (`callTimeoutMs`, default 5000 ms) so a partitioned node answers
 * within kubelet's 4-minute sandbox budget instead of hanging. The client's default fault policy
 * stays (3 attempts over the endpoints, a circuit breaker per host): a retried transaction whose
 * first attempt was applied fails its compares the second time, and the callers re-read.
 */
import { Etcd3, type IOptions } from 'etcd3';
import { AppError, ClosedError } from '../../common/errors.ts';
import { MAX_TXN_OPS, prefixEnd, zeroStats, type KV, type KVCompare, type KVEntry, type KVOp, type KVStats, type KVTxnResult } from '../kv.ts';

/** Options of {@link EtcdKV}. */
export interface EtcdKVOptions {
  /** `http://host:port` or `https://host:port` URLs (validated by the pool config). */
  readonly endpoints: readonly string[];
  /** TLS material, already read (PEM bytes): `ca` verifies the server; `cert` + `key` authenticate us. */
  readonly tls?: { readonly ca?: Buffer; readonly cert?: Buffer; readonly key?: Buffer } | undefined;
  /** Deadline of each call, milliseconds (default 5000). */
  readonly callTimeoutMs?: number;
  /** Time to wait for a connection, milliseconds (default 3000). */
  readonly dialTimeoutMs?: number;
}

/** Default deadline of one etcd call, milliseconds. */
export const DEFAULT_CALL_TIMEOUT_MS = 5000;

const UNAVAILABLE_NAMES = new Set(['GRPCUnavailableError', 'GRPCDeadlineExceededError', 'GRPCCancelledError', 'BrokenCircuitError', 'TaskCancelledError']);
const UNAVAILABLE_TEXT = /no leader|leader changed|request timed out|timed out|too many requests|ECONNREFUSED|UNAVAILABLE|DEADLINE_EXCEEDED|No connection established|Failed to connect/i;

/**
 * Convert an error thrown by the etcd3 client (or grpc-js under it) into ours. `what` names the
 * call (`range /ipwarden/pools/p1/blocks/`), `where` the endpoints.
 */
export function convertEtcdError(e: unknown, what: string, where: string): AppError {
  if (e instanceof AppError) return e;
  const name = e instanceof Error ? e.constructor.name : '';
  const text = e instanceof Error ? e.message : String(e);
  if (name === 'ClientClosedError') return new ClosedError(`etcd client (${where})`);
  if (UNAVAILABLE_NAMES.has(name) || UNAVAILABLE_TEXT.test(text)) {
    return new AppError('STORE_UNAVAILABLE', `etcd at ${where} is unavailable: ${what}: ${text}`, { cause: e, retryable: true });
  }
  return new AppError('STORE_IO', `etcd at ${where}: ${what} failed: ${text}`, { cause: e });
}

/** {@link KV} on etcd v3. See the module comment. */
export class EtcdKV implements KV {
  readonly description: string;
  readonly stats: KVStats = zeroStats();
  readonly #client: Etcd3;
  readonly #timeout: number;
  #closed = false;

  constructor(opts: EtcdKVOptions) {
    if (opts.endpoints.length === 0) throw new AppError('IPAM_INVALID_CONFIG', 'etcd: no endpoints');
    this.description = `etcd ${opts.endpoints.join(',')}`;
    this.#timeout = opts.callTimeoutMs ?? DEFAULT_CALL_TIMEOUT_MS;
    const o: IOptions = {
      hosts: [...opts.endpoints],
      dialTimeout: opts.dialTimeoutMs ?? 3000,
      defaultCallOptions: (ctx) => (ctx.isStream ? {} : { deadline: Date.now() + this.#timeout }),
    };
    const t = opts.tls;
    if (t !== undefined && t.ca !== undefined) {
      o.credentials = {
        rootCertificate: t.ca,
        ...(t.key === undefined ? {} : { privateKey: t.key }),
        ...(t.cert === undefined ? {} : { certChain: t.cert }),
      };
    }
    this.#client = new Etcd3(o);
  }

  #where(): string {
    return this.description.slice('etcd '.length);
  }

  #open(): void {
    if (this.#closed) throw new ClosedError(`etcd client (${this.#where()})`);
  }

  async #call<T>(what: string, f: () => Promise<T>): Promise<T> {
    this.#open();
    try {
      return await f();
    } catch (e) {
      throw convertEtcdError(e, what, this.#where());
    }
  }

  async get(key: string): Promise<KVEntry | null> {
    this.stats.reads++;
    const r = await this.#call(`get ${key}`, () => this.#client.kv.range({ key: Buffer.from(key) }));
    const kv = r.kvs[0];
    return kv === undefined ? null : entry(kv, false);
  }

  async list(prefix: string, opts: { readonly keysOnly?: boolean } = {}): Promise<KVEntry[]> {
    this.stats.reads++;
    const p = Buffer.from(prefix);
    const keysOnly = opts.keysOnly === true;
    const r = await this.#call(`range ${prefix}`, () => this.#client.kv.range({ key: p, range_end: prefixEnd(p), keys_only: keysOnly } as Parameters<Etcd3['kv']['range']>[0]));
    if (r.more) throw new AppError('STORE_IO', `etcd at ${this.#where()}: range ${prefix} returned a partial answer`);
    return r.kvs.map((kv) => entry(kv, keysOnly));
  }

  async txn(compare: readonly KVCompare[], ops: readonly KVOp[]): Promise<KVTxnResult> {
    if (compare.length + ops.length > MAX_TXN_OPS) {
      throw new AppError('INTERNAL', `transaction of ${compare.length + ops.length} compares and ops exceeds etcd's limit of ${MAX_TXN_OPS}`);
    }
    this.stats.txns++;
    const req = {
      compare: compare.map((c) =>
        'absent' in c
          ? { key: Buffer.from(c.key), target: 'Create' as const, result: 'Equal' as const, create_revision: 0 }
          : { key: Buffer.from(c.key), target: 'Mod' as const, result: 'Equal' as const, mod_revision: c.modRevision },
      ),
      success: ops.map((op) =>
        'put' in op
          ? { request_put: { key: Buffer.from(op.put), value: Buffer.from(op.value), ...(op.lease === undefined ? {} : { lease: op.lease }) } }
          : { request_delete_range: { key: Buffer.from(op.delete) } },
      ),
      failure: [],
    };
    const r = await this.#call(`txn (${compare.length} compares, ${ops.length} ops)`, () => this.#client.kv.txn(req));
    if (r.succeeded) {
      this.stats.txnsSucceeded++;
      for (const op of ops) {
        if ('put' in op) this.stats.puts++;
        else this.stats.deletes++;
      }
    }
    return { succeeded: r.succeeded, revision: String(r.header.revision) };
  }

  /** The underlying client, for the node heartbeat lease (src/store/etcd/heartbeat.ts) only. */
  get client(): Etcd3 {
    this.#open();
    return this.#client;
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    this.#client.close();
  }
}

function entry(kv: { key: Buffer; value: Buffer; mod_revision: string; create_revision: string }, keysOnly: boolean): KVEntry {
  return {
    key: kv.key.toString('utf8'),
    value: keysOnly ? '' : kv.value.toString('utf8'),
    modRevision: String(kv.mod_revision),
    createRevision: String(kv.create_revision),
  };
}
