/**
 * `EtcdKV`: the {@link KV} seam on a real etcd v3, over `@grpc/grpc-js` with ipwarden's own
 * minimal `.proto` of etcd's `KV` service (src/store/etcd/etcd-proto.ts; the choice against the
 * `etcd3` npm client is in docs/dependencies.md). Only `Range` and `Txn` are called. Every foreign
 * error is converted at this boundary (house style 7, the way etcd3's `castGrpcError` does):
 *
 * - `UNAVAILABLE` (no connection, `etcdserver: no leader`, `etcdserver: request timed out`),
 *   `DEADLINE_EXCEEDED`, `CANCELLED`, `RESOURCE_EXHAUSTED` (`etcdserver: too many requests`),
 *   and `UNKNOWN` carrying Go's `context deadline exceeded` / `context canceled`
 *   → `AppError('STORE_UNAVAILABLE')` (CNI 11, retryable); when every endpoint failed so, the
 *   message names the last one tried and adds what each other one answered (the member that is
 *   merely down is then not taken for the cause);
 * - anything else (`PERMISSION_DENIED`, `UNAUTHENTICATED`, `INVALID_ARGUMENT`, …) →
 *   `AppError('STORE_IO')` (CNI 5), the gRPC status name and etcd's text in the message;
 * - use after `close()` → `ClosedError`.
 *
 * Endpoints: one channel per endpoint, made when first needed. A call goes to the endpoint that
 * last answered; on an "unavailable" error it is tried once on each other endpoint (in order).
 * The call's budget (`callTimeoutMs`, default 5000 ms) is shared by the attempts: each gets
 * `max(1000, callTimeoutMs / endpoints)` ms, so a hung member (SIGSTOPped: its socket accepts and
 * never answers) costs a fraction of the budget before the next one is asked, and a partitioned
 * node answers well within kubelet's 4-minute sandbox budget. Reads are linearizable (etcd's
 * default; never `serializable`), so a member cut off from the quorum answers an error, not
 * stale data. A transaction retried after a lost answer
 * may already have been applied: it then fails its compares, and the callers re-read (every
 * writer in ipwarden decides from what it reads).
 */
import * as grpc from '@grpc/grpc-js';
import { fromJSON, type MethodDefinition, type PackageDefinition, type ServiceDefinition } from '@grpc/proto-loader';
import protobuf from 'protobufjs';
import { AppError, ClosedError } from '../../common/errors.ts';
import { MAX_TXN_OPS, prefixEnd, zeroStats, type KV, type KVCompare, type KVEntry, type KVOp, type KVStats, type KVTxnResult, type Leases } from '../kv.ts';
import { ETCD_PROTO } from './etcd-proto.ts';

/** Options of {@link EtcdKV}. */
export interface EtcdKVOptions {
  /** `http://host:port` or `https://host:port` URLs (validated by the pool config). */
  readonly endpoints: readonly string[];
  /** TLS material, already read (PEM bytes): `ca` verifies the server; `cert` + `key` authenticate us. */
  readonly tls?: { readonly ca?: Buffer; readonly cert?: Buffer; readonly key?: Buffer } | undefined;
  /** Budget of one call over all endpoints, milliseconds (default 5000; each attempt gets its share, at least 1000). */
  readonly callTimeoutMs?: number;
  /**
   * Index of the endpoint tried first (then the others in turn). Default: a random one, so the
   * plugin's processes (one client each) spread over the members instead of all asking the first
   * (review). Tests pass one to make the order known.
   */
  readonly firstEndpoint?: number;
}

/** Default deadline of one etcd call attempt, milliseconds. */
export const DEFAULT_CALL_TIMEOUT_MS = 5000;

type MethodName = 'Range' | 'Txn' | 'LeaseGrant' | 'LeaseRevoke' | 'LeaseKeepAlive';
const SERVICE_OF: Readonly<Record<MethodName, string>> = {
  Range: 'etcdserverpb.KV',
  Txn: 'etcdserverpb.KV',
  LeaseGrant: 'etcdserverpb.Lease',
  LeaseRevoke: 'etcdserverpb.Lease',
  LeaseKeepAlive: 'etcdserverpb.Lease',
};
const LOADER_OPTIONS = { keepCase: true, longs: String, enums: String, defaults: true, oneofs: true } as const;
let packageDefinition: PackageDefinition | undefined;

function method(name: MethodName): MethodDefinition<object, object> {
  if (packageDefinition === undefined) {
    packageDefinition = fromJSON(protobuf.parse(ETCD_PROTO, { keepCase: true }).root.toJSON(), LOADER_OPTIONS);
  }
  const m = (packageDefinition[SERVICE_OF[name]] as ServiceDefinition)[name];
  if (m === undefined) throw new AppError('INTERNAL', `etcd method ${name} missing from etcd-proto.ts`);
  return m as MethodDefinition<object, object>;
}

const UNAVAILABLE_CODES: ReadonlySet<number> = new Set([grpc.status.UNAVAILABLE, grpc.status.DEADLINE_EXCEEDED, grpc.status.CANCELLED, grpc.status.RESOURCE_EXHAUSTED]);

/**
 * etcd 3.4 answers some timeouts as gRPC `UNKNOWN` with Go's context text (seen with the quorum
 * lost: `UNKNOWN: context deadline exceeded`, trial finding 6): a timeout, retryable like
 * `DEADLINE_EXCEEDED`, never an I/O error (code 5).
 */
const UNKNOWN_BUT_UNAVAILABLE = /^(context deadline exceeded|context canceled|etcdserver: (request timed out|leader changed|no leader))/;

/**
 * Convert an error of a gRPC call to etcd into ours. `what` names the call (`range
 * /ipwarden/pools/p1/blocks/`), `where` the endpoint.
 */
export function convertEtcdError(e: unknown, what: string, where: string): AppError {
  if (e instanceof AppError) return e;
  const err = e as Partial<grpc.ServiceError>;
  const text = typeof err.details === 'string' && err.details !== '' ? err.details : e instanceof Error ? e.message : String(e);
  if (typeof err.code === 'number') {
    const name = grpc.status[err.code] ?? `code ${err.code}`;
    if (UNAVAILABLE_CODES.has(err.code) || (err.code === grpc.status.UNKNOWN && UNKNOWN_BUT_UNAVAILABLE.test(text))) {
      return new AppError('STORE_UNAVAILABLE', `etcd at ${where} is unavailable: ${what}: ${name}: ${text}`, { cause: e, retryable: true });
    }
    return new AppError('STORE_IO', `etcd at ${where}: ${what} failed: ${name}: ${text}`, { cause: e });
  }
  return new AppError('STORE_IO', `etcd at ${where}: ${what} failed: ${text}`, { cause: e });
}

interface RawKV {
  key: Buffer;
  value: Buffer;
  mod_revision: string;
  create_revision: string;
}

/** {@link KV} on etcd v3. See the module comment. */
export class EtcdKV implements KV, Leases {
  readonly description: string;
  readonly stats: KVStats = zeroStats();
  readonly #endpoints: readonly string[];
  readonly #creds: grpc.ChannelCredentials;
  readonly #timeout: number;
  readonly #clients = new Map<number, grpc.Client>();
  #current = 0;
  #closed = false;

  constructor(opts: EtcdKVOptions) {
    if (opts.endpoints.length === 0) throw new AppError('IPAM_INVALID_CONFIG', 'etcd: no endpoints');
    this.#endpoints = [...opts.endpoints];
    this.#current = (opts.firstEndpoint ?? Math.floor(Math.random() * opts.endpoints.length)) % opts.endpoints.length;
    this.description = `etcd ${opts.endpoints.join(',')}`;
    this.#timeout = Math.max(1000, Math.floor((opts.callTimeoutMs ?? DEFAULT_CALL_TIMEOUT_MS) / opts.endpoints.length));
    const t = opts.tls;
    this.#creds = t?.ca === undefined ? grpc.credentials.createInsecure() : grpc.credentials.createSsl(t.ca, t.key ?? null, t.cert ?? null);
  }

  #client(i: number): grpc.Client {
    let c = this.#clients.get(i);
    if (c === undefined) {
      const target = (this.#endpoints[i] as string).replace(/^https?:\/\//, '');
      c = new grpc.Client(target, this.#creds, { 'grpc.use_local_subchannel_pool': 1, 'grpc.max_receive_message_length': 64 * 1024 * 1024 });
      this.#clients.set(i, c);
    }
    return c;
  }

  #unary<T>(i: number, name: MethodName, req: object): Promise<T> {
    const def = method(name);
    if (name === 'LeaseKeepAlive') {
      // A bidirectional stream in etcd's API: one request, one answer, then the stream is closed.
      return new Promise<T>((resolve, reject) => {
        const call = this.#client(i).makeBidiStreamRequest(def.path, def.requestSerialize, def.responseDeserialize, new grpc.Metadata(), { deadline: Date.now() + this.#timeout });
        let done = false;
        call.on('data', (v: T) => {
          if (done) return;
          done = true;
          resolve(v);
          call.cancel();
        });
        call.on('error', (e: grpc.ServiceError) => {
          if (done) return;
          done = true;
          reject(e);
        });
        call.on('end', () => {
          if (done) return;
          done = true;
          reject(Object.assign(new Error('the keep-alive stream ended without an answer'), { code: grpc.status.UNAVAILABLE, details: 'the keep-alive stream ended without an answer' }));
        });
        call.write(req);
      });
    }
    return new Promise<T>((resolve, reject) => {
      this.#client(i).makeUnaryRequest(def.path, def.requestSerialize, def.responseDeserialize, req, new grpc.Metadata(), { deadline: Date.now() + this.#timeout }, (err, value) => {
        if (err) reject(err);
        else resolve(value as T);
      });
    });
  }

  /** Call `name` on the current endpoint, failing over to each other one on an "unavailable" error. */
  async #call<T>(what: string, name: MethodName, req: object): Promise<T> {
    if (this.#closed) throw new ClosedError(`etcd client (${this.#endpoints.join(',')})`);
    let last: AppError | null = null;
    const others: string[] = [];
    for (let k = 0; k < this.#endpoints.length; k++) {
      const i = (this.#current + k) % this.#endpoints.length;
      try {
        const r = await this.#unary<T>(i, name, req);
        this.#current = i;
        return r;
      } catch (e) {
        if (this.#closed) throw new ClosedError(`etcd client (${this.#endpoints.join(',')})`);
        if (last !== null) others.push(last.message.replace(/^etcd at (\S+) is unavailable: [^:]*: /, '$1: ').slice(0, 160));
        last = convertEtcdError(e, what, this.#endpoints[i] as string);
        if (last.code !== 'STORE_UNAVAILABLE') throw last;
      }
    }
    const err = last as AppError;
    if (others.length === 0) throw err;
    throw new AppError('STORE_UNAVAILABLE', `${err.message} (also tried ${others.join('; ')})`, { cause: err, retryable: true });
  }

  async get(key: string): Promise<KVEntry | null> {
    this.stats.reads++;
    const r = await this.#call<{ kvs: RawKV[] }>(`get ${key}`, 'Range', { key: Buffer.from(key) });
    const kv = r.kvs[0];
    return kv === undefined ? null : entry(kv, false);
  }

  async list(prefix: string, opts: { readonly keysOnly?: boolean } = {}): Promise<KVEntry[]> {
    this.stats.reads++;
    const p = Buffer.from(prefix);
    const keysOnly = opts.keysOnly === true;
    const r = await this.#call<{ kvs: RawKV[]; more: boolean }>(`range ${prefix}`, 'Range', { key: p, range_end: prefixEnd(p), keys_only: keysOnly });
    if (r.more) throw new AppError('STORE_IO', `etcd: range ${prefix} returned a partial answer`);
    return r.kvs.map((kv) => entry(kv, keysOnly));
  }

  async txn(compare: readonly KVCompare[], ops: readonly KVOp[]): Promise<KVTxnResult> {
    if (compare.length + ops.length > MAX_TXN_OPS) {
      throw new AppError('INTERNAL', `transaction of ${compare.length + ops.length} compares and ops exceeds etcd's limit of ${MAX_TXN_OPS}`);
    }
    if (this.#closed) throw new ClosedError(`etcd client (${this.#endpoints.join(',')})`);
    this.stats.txns++;
    const req = {
      compare: compare.map((c) =>
        'absent' in c
          ? { key: Buffer.from(c.key), target: 'Create', result: 'Equal', create_revision: '0' }
          : { key: Buffer.from(c.key), target: 'Mod', result: 'Equal', mod_revision: c.modRevision },
      ),
      success: ops.map((op) =>
        'put' in op
          ? { request_put: { key: Buffer.from(op.put), value: Buffer.from(op.value), ...(op.lease === undefined ? {} : { lease: op.lease }) } }
          : { request_delete_range: { key: Buffer.from(op.delete) } },
      ),
      failure: [],
    };
    const r = await this.#call<{ succeeded: boolean; header: { revision: string } | null }>(`txn (${compare.length} compares, ${ops.length} ops)`, 'Txn', req);
    if (r.succeeded) {
      this.stats.txnsSucceeded++;
      for (const op of ops) {
        if ('put' in op) this.stats.puts++;
        else this.stats.deletes++;
      }
    }
    return { succeeded: r.succeeded, revision: String(r.header?.revision ?? '0') };
  }

  async grantLease(ttlSeconds: number): Promise<string> {
    if (!Number.isInteger(ttlSeconds) || ttlSeconds < 1) throw new AppError('INTERNAL', `a lease TTL must be a whole number of seconds ≥ 1, got ${ttlSeconds}`);
    const r = await this.#call<{ ID: string; error: string }>(`grant a lease of ${ttlSeconds}s`, 'LeaseGrant', { TTL: String(ttlSeconds) });
    if (r.error !== '') throw new AppError('STORE_IO', `etcd: grant a lease of ${ttlSeconds}s failed: ${r.error}`);
    return String(r.ID);
  }

  async keepAlive(id: string): Promise<number> {
    const r = await this.#call<{ TTL: string }>(`keep lease ${id} alive`, 'LeaseKeepAlive', { ID: id });
    return Math.max(0, Number(r.TTL));
  }

  async revokeLease(id: string): Promise<void> {
    try {
      await this.#call(`revoke lease ${id}`, 'LeaseRevoke', { ID: id });
    } catch (e) {
      // etcd: `etcdserver: requested lease not found` — already gone is what revoking wants.
      if (e instanceof AppError && /lease not found/.test(e.message)) return;
      throw e;
    }
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    for (const c of this.#clients.values()) c.close();
    this.#clients.clear();
  }
}

function entry(kv: RawKV, keysOnly: boolean): KVEntry {
  return {
    key: kv.key.toString('utf8'),
    value: keysOnly ? '' : kv.value.toString('utf8'),
    modRevision: String(kv.mod_revision),
    createRevision: String(kv.create_revision),
  };
}
