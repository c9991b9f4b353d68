/**
 * `EtcdKV`: the {@link KV} seam on a real etcd v3, over `@grpc/grpc-js` with ipwarden's own
 * minimal `.proto` of etcd's API (src/store/etcd/etcd-proto.ts; the choice against the `etcd3` npm
 * client is in docs/dependencies.md). Every foreign error is converted at this boundary (house
 * style 7, the way etcd3's `castGrpcError` does):
 *
 * - `UNAVAILABLE` (no connection, `etcdserver: no leader`, `etcdserver: request timed out`),
 *   `DEADLINE_EXCEEDED`, `CANCELLED`, `RESOURCE_EXHAUSTED` (`etcdserver: too many requests`),
 *   and `UNKNOWN` carrying Go's `context deadline exceeded` / `context canceled`
 *   → `AppError('STORE_UNAVAILABLE')` (CNI 11, retryable): a member that is down, hung or cut off;
 * - a **permanent misconfiguration** seen while connecting — a TLS handshake that fails (etcd's
 *   certificate not signed by `ipam.pool.etcd.tls.ca`, etcd refusing or requiring our client
 *   certificate, a certificate that does not name the endpoint's host), or an endpoint whose
 *   scheme is wrong (`http://` to a TLS listener, `https://` to a plain one; confirmed by a probe,
 *   never guessed from a closed connection alone) → `AppError('IPAM_INVALID_CONFIG')` (CNI 7) or,
 *   for an expired or not yet valid certificate, `AppError('STORE_IO')` (CNI 5), the cause and
 *   the key to check in the message ({@link tlsFailureOf});
 * - authentication: etcd with auth enabled and no `ipam.pool.etcd.credentials`, or credentials it
 *   refuses → `IPAM_INVALID_CONFIG` (CNI 7); a token it no longer knows (`etcdserver: invalid auth
 *   token`: a member restarted, the token's TTL passed) → authenticate again and retry once;
 * - endpoints of two different etcd clusters → `IPAM_INVALID_CONFIG` (CNI 7), see "Cluster ID";
 * - anything else (`PERMISSION_DENIED`, `INVALID_ARGUMENT`, …) → `AppError('STORE_IO')` (CNI 5),
 *   the gRPC status name and etcd's text in the message;
 * - use after `close()` → `ClosedError`.
 *
 * Endpoints: one channel per endpoint, made when first needed. A call goes to the endpoint that
 * last answered; on an "unavailable" error or a TLS/scheme failure it is tried once on each other
 * endpoint (in order). When every endpoint failed, the error is "unavailable" (11) if any of them
 * was merely unavailable (a member that is down may come back), else the permanent one; the
 * message names the last one tried and adds what each other one answered. The call's budget
 * (`callTimeoutMs`, default 5000 ms) is shared by the attempts: each gets
 * `max(1000, callTimeoutMs / endpoints)` ms, so a hung member (SIGSTOPped: its socket accepts and
 * never answers) costs a fraction of the budget before the next one is asked, and a partitioned
 * node answers well within kubelet's 4-minute sandbox budget. Reads are linearizable (etcd's
 * default; never `serializable`), so a member cut off from the quorum answers an error, not
 * stale data. A transaction retried after a lost answer may already have been applied: it then
 * fails its compares, and the callers re-read (every writer in ipwarden decides from what it
 * reads).
 *
 * **Cluster ID** (one etcd cluster per endpoint list): every etcd answer carries the cluster's ID
 * in its `ResponseHeader`. The client compares every answer's ID with the first one it saw (free:
 * no extra call), and before its first write (transaction or lease grant) it asks every other
 * endpoint at once for its ID (`Maintenance.Status`, one parallel round trip, started in the
 * background by the client's first answer, so an ADD rarely waits for it; with one endpoint no
 * call at all; {@link EtcdKV.clusterCheck}). Two IDs
 * → every later call fails with code 7 naming each endpoint's cluster. An endpoint that does not
 * answer the check in time cannot be compared: the check says which ones, and the pool allocator
 * then refuses to *create* a pool (its `meta`) until every endpoint has answered once, and pins
 * the cluster ID next to `meta` (docs/cluster.md "One etcd cluster").
 *
 * **TLS files** (a {@link EtcdTlsSource}): the files' identity (device, inode, size, mtime) is
 * checked before a call at most every `tlsRecheckMs` (default {@link TLS_RECHECK_MS}), and at
 * once after a call no endpoint answered (a TLS handshake failure, or a connection failure: a
 * channel grpc-js backs off repeats the failure it saw while etcd restarted); when it changed, the files are read again and new channels
 * are made (the old ones are closed once their calls are done), and a call that failed its
 * handshake is tried once more on them. A rotated CA or certificate is thus picked up by the
 * next call, without a restart. Files that cannot be read (a rotation half done) leave the
 * channels as they are until the next check.
 */
import * as grpc from '@grpc/grpc-js';
import { fromJSON, type MethodDefinition, type PackageDefinition, type ServiceDefinition } from '@grpc/proto-loader';
import { connect as http2Connect } from 'node:http2';
import { isIP } from 'node:net';
import { performance } from 'node:perf_hooks';
import { connect as tlsConnect } from 'node:tls';
import protobuf from 'protobufjs';
import { AppError, ClosedError, type ErrorCode } from '../../common/errors.ts';
import { MAX_TXN_OPS, prefixEnd, zeroStats, type ClusterCheck, type KV, type KVCompare, type KVEntry, type KVOp, type KVStats, type KVTxnResult, type Leases } from '../kv.ts';
import { ETCD_PROTO } from './etcd-proto.ts';

/** TLS material (PEM bytes): `ca` verifies the server; `cert` + `key` authenticate us. */
export interface EtcdTlsMaterial {
  readonly ca: Buffer;
  readonly cert?: Buffer | undefined;
  readonly key?: Buffer | undefined;
}

/**
 * TLS files that may change on disk (a CA or certificate rotation). `stamp()` is cheap (stat
 * calls) and changes whenever a file is replaced or rewritten; `read()` reads them. Both throw
 * an `AppError` naming the key and path when a file cannot be used.
 */
export interface EtcdTlsSource {
  stamp(): string;
  read(): EtcdTlsMaterial;
}

/** etcd user and password (etcd's `Auth.Authenticate`). */
export interface EtcdCredentials {
  readonly user: string;
  readonly password: string;
}

/**
 * Where the credentials come from: `read()` is called at each authentication (rare: once per
 * client, then when etcd forgets the token), so a changed file is picked up; `describe` names the
 * source in messages (`ipam.pool.etcd.credentials (/etc/ipwarden/etcd-credentials.json)`).
 */
export interface EtcdCredentialsSource {
  readonly describe: string;
  read(): EtcdCredentials;
}

/** Options of {@link EtcdKV}. */
export interface EtcdKVOptions {
  /** `http://host:port` or `https://host:port` URLs (validated by the pool config). */
  readonly endpoints: readonly string[];
  /** TLS material, already read, or a {@link EtcdTlsSource} (read now, and again when its stamp changes). */
  readonly tls?: EtcdTlsMaterial | EtcdTlsSource | undefined;
  /** etcd user/password authentication (none by default). */
  readonly credentials?: EtcdCredentialsSource | undefined;
  /** Budget of one call over all endpoints, milliseconds (default 5000; each attempt gets its share, at least 1000). */
  readonly callTimeoutMs?: number;
  /**
   * Index of the endpoint tried first (then the others in turn). Default: a random one, so the
   * plugin's processes (one client each) spread over the members instead of all asking the first
   * (review). Tests pass one to make the order known.
   */
  readonly firstEndpoint?: number;
  /** Least time between two checks of the TLS files' stamp before a call, milliseconds (default {@link TLS_RECHECK_MS}). */
  readonly tlsRecheckMs?: number;
  /** Monotonic milliseconds (default `performance.now`): the TLS re-check and cluster re-check periods. */
  readonly clock?: () => number;
}

/** Default deadline of one etcd call attempt, milliseconds. */
export const DEFAULT_CALL_TIMEOUT_MS = 5000;
/** Default least time between two checks of the TLS files before a call, milliseconds. */
export const TLS_RECHECK_MS = 10_000;
/**
 * After a cluster check that some endpoint did not answer, how long its answer is used before the
 * next write starts another one (in the background), milliseconds. A check every endpoint
 * answered is kept for the client's life.
 */
export const CLUSTER_RECHECK_MS = 30_000;

type MethodName = 'Range' | 'Txn' | 'LeaseGrant' | 'LeaseRevoke' | 'LeaseKeepAlive' | 'Status' | 'Authenticate';
const SERVICE_OF: Readonly<Record<MethodName, string>> = {
  Range: 'etcdserverpb.KV',
  Txn: 'etcdserverpb.KV',
  LeaseGrant: 'etcdserverpb.Lease',
  LeaseRevoke: 'etcdserverpb.Lease',
  LeaseKeepAlive: 'etcdserverpb.Lease',
  Status: 'etcdserverpb.Maintenance',
  Authenticate: 'etcdserverpb.Auth',
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
 * Convert an error of a gRPC call to etcd into ours, by its status alone (no TLS or auth
 * classification: {@link EtcdKV} adds those). `what` names the call (`range
 * /ipwarden/pools/p1/blocks/`), `where` the endpoint.
 */
export function convertEtcdError(e: unknown, what: string, where: string): AppError {
  if (e instanceof AppError) return e;
  const err = e as Partial<grpc.ServiceError>;
  // grpc-js ends a failed connection's details with "Resolution note: " and an often empty note.
  const text = detailsOf(e).replace(/\.? ?Resolution note: ?$/, '');
  if (typeof err.code === 'number') {
    const name = grpc.status[err.code] ?? `code ${err.code}`;
    if (UNAVAILABLE_CODES.has(err.code) || (err.code === grpc.status.UNKNOWN && UNKNOWN_BUT_UNAVAILABLE.test(text))) {
      return new AppError('STORE_UNAVAILABLE', `etcd at ${where} is unavailable: ${what}: ${name}: ${text}`, { cause: e, retryable: true });
    }
    return new AppError('STORE_IO', `etcd at ${where}: ${what} failed: ${name}: ${text}`, { cause: e });
  }
  return new AppError('STORE_IO', `etcd at ${where}: ${what} failed: ${text}`, { cause: e });
}

function detailsOf(e: unknown): string {
  const err = e as Partial<grpc.ServiceError>;
  return typeof err.details === 'string' && err.details !== '' ? err.details : e instanceof Error ? e.message : String(e);
}

/** A TLS handshake failure as {@link tlsFailureOf} reads it. */
export interface TlsFailure {
  /** `IPAM_INVALID_CONFIG` (CNI 7) for what the pool config must change, `STORE_IO` (CNI 5) for a certificate out of its validity. */
  readonly code: Extract<ErrorCode, 'IPAM_INVALID_CONFIG' | 'STORE_IO'>;
  /** The cause and what to check, e.g. `certificate signed by unknown authority (unable to verify the first certificate) — check ipam.pool.etcd.tls.ca`. */
  readonly why: string;
}

/**
 * Certificate verification errors of Node's TLS client (OpenSSL's X509 verify texts, both
 * spellings of "self signed"): etcd's certificate does not chain to our CA.
 */
const UNKNOWN_AUTHORITY = /(unable to verify the first certificate|self[- ]signed certificate in certificate chain|self[- ]signed certificate|unable to get local issuer certificate|unable to get issuer certificate|certificate signature failure|unable to decode issuer public key|invalid CA certificate)/;
/** A TLS alert the server sent (OpenSSL: `sslv3 alert bad certificate:…SSL alert number 42`). */
const TLS_ALERT = /(?:sslv3|tlsv1|tlsv13) alert ([a-z ]+?)(?::|\.\.|$)[^]*?SSL alert number ([0-9]+)/;
/** Alerts by which a server refuses (or asks for) the client's certificate (RFC 8446 §6.2, RFC 5246 §7.2.2). */
const CLIENT_CERT_ALERTS: ReadonlySet<string> = new Set(['bad certificate', 'unsupported certificate', 'certificate revoked', 'certificate expired', 'certificate unknown', 'unknown ca', 'access denied', 'certificate required']);

/**
 * Read a gRPC error's text for a failed TLS handshake: null when it is not one (a refused
 * connection, a timeout). `clientCert`: whether `ipam.pool.etcd.tls.cert` is set (a refusal then
 * names it; without one, etcd asks for one). Pure (unit-tested on the texts Node and OpenSSL
 * give).
 */
export function tlsFailureOf(details: string, clientCert: boolean): TlsFailure | null {
  const ua = UNKNOWN_AUTHORITY.exec(details);
  if (ua !== null) return { code: 'IPAM_INVALID_CONFIG', why: `certificate signed by unknown authority (${ua[1] as string}) — check ipam.pool.etcd.tls.ca` };
  if (/certificate has expired/.test(details)) return { code: 'STORE_IO', why: "etcd's certificate (or a CA of its chain) has expired — renew it" };
  if (/certificate is not yet valid/.test(details)) return { code: 'STORE_IO', why: "etcd's certificate is not yet valid — check this node's clock and etcd's certificate" };
  const host = /(Hostname\/IP does not match certificate's altnames: .*?)(?:\. Resolution note|\s+\(\d{4}-\d\d-\d\dT|$)/m.exec(details);
  if (host !== null) return { code: 'IPAM_INVALID_CONFIG', why: `etcd's certificate does not name the endpoint's host (${(host[1] as string).trim()}) — use a host name or address its certificate lists in ipam.pool.etcd.endpoints` };
  const alert = TLS_ALERT.exec(details);
  if (alert !== null) {
    const name = alert[1] as string;
    const n = alert[2] as string;
    if (CLIENT_CERT_ALERTS.has(name)) {
      return clientCert
        ? { code: 'IPAM_INVALID_CONFIG', why: `etcd refused the client certificate (TLS alert ${n}: ${name}) — check ipam.pool.etcd.tls.cert and ipam.pool.etcd.tls.key: their CA must be in etcd's --trusted-ca-file` }
        : { code: 'IPAM_INVALID_CONFIG', why: `etcd requires a client certificate (TLS alert ${n}: ${name}) — set ipam.pool.etcd.tls.cert and ipam.pool.etcd.tls.key` };
    }
    return { code: 'IPAM_INVALID_CONFIG', why: `etcd ended the handshake (TLS alert ${n}: ${name}) — check the TLS versions and ciphers etcd accepts` };
  }
  return null;
}

/** grpc-js's text for an `http://` channel whose peer closed before HTTP/2 was set up (a TLS listener does). */
const PLAIN_TO_TLS_HINT = /Failed to connect|Connection dropped|Protocol error/;
/** grpc-js's text for an `https://` channel whose peer closed during the handshake (a plain listener does). */
const TLS_TO_PLAIN_HINT = /socket disconnected before secure TLS connection was established|ECONNRESET|wrong version number|packet length too long/;

function hostPort(endpoint: string): { host: string; port: number } {
  const u = new URL(endpoint);
  return { host: u.hostname.replace(/^\[(.*)\]$/, '$1'), port: Number(u.port) };
}

/** A probe connection: a TLS socket or an HTTP/2 session, as {@link probe} watches it. */
interface ProbeConnection {
  once(event: string, listener: (e: Error) => void): unknown;
  destroy(): void;
}

/**
 * Watch probe connection `s` for at most `ms`: true when `yes` fires or an error `errorSaysYes`
 * accepts comes; false on any other error, on close, or when the time is up. `s` is destroyed
 * either way. Never throws.
 */
function probe(s: ProbeConnection, yes: string, errorSaysYes: (e: Error) => boolean, ms: number): Promise<boolean> {
  return new Promise((resolve) => {
    let done = false;
    const finish = (v: boolean): void => {
      if (done) return;
      done = true;
      clearTimeout(t);
      s.destroy();
      resolve(v);
    };
    const t = setTimeout(() => finish(false), ms);
    s.once(yes, () => finish(true));
    s.once('error', (e: Error) => finish(errorSaysYes(e)));
    s.once('close', () => finish(false));
  });
}

/**
 * Does `endpoint` (host:port) speak TLS? True when a handshake (any certificate accepted) completes
 * or the peer answers with a TLS alert; false on anything else within `ms`. Used only to explain a
 * failure of an `http://` endpoint, never to decide a write.
 */
function speaksTls(endpoint: string, ms: number): Promise<boolean> {
  const { host, port } = hostPort(endpoint);
  const s = tlsConnect({ host, port, rejectUnauthorized: false, ALPNProtocols: ['h2'], ...(isIP(host) === 0 ? { servername: host } : {}) });
  return probe(s, 'secureConnect', (e) => /alert/.test(e.message) && !/wrong version number/.test(e.message), ms);
}

/** Does `endpoint` answer plain (cleartext) HTTP/2: does it send its SETTINGS frame within `ms`? Explains a failure of an `https://` endpoint. */
function speaksPlainHttp2(endpoint: string, ms: number): Promise<boolean> {
  const { host, port } = hostPort(endpoint);
  return probe(http2Connect(`http://${isIP(host) === 6 ? `[${host}]` : host}:${port}`), 'remoteSettings', () => false, ms);
}

/** A uint64 cluster ID (decimal text, as the loader gives it) in etcd's own notation: lower-case hex. */
function clusterHex(id: string): string {
  if (id === lastClusterId) return lastClusterHex;
  let hex: string;
  try {
    hex = BigInt(id).toString(16);
  } catch {
    hex = id;
  }
  lastClusterId = id;
  lastClusterHex = hex;
  return hex;
}
/** {@link clusterHex}'s last argument and answer (every answer of a cluster carries the same ID). */
let lastClusterId = '';
let lastClusterHex = '';

/** `a`, `a and b`, `a, b and c`. */
function joinAnd(xs: readonly string[]): string {
  return xs.length <= 1 ? (xs[0] ?? '') : `${xs.slice(0, -1).join(', ')} and ${xs[xs.length - 1] as string}`;
}

interface RawKV {
  key: Buffer;
  value: Buffer;
  mod_revision: string;
  create_revision: string;
}

interface Header {
  cluster_id?: string;
  /** The store's revision when the request was served (int64 as decimal text). */
  revision?: string;
}

/** The outcome of one attempt on one endpoint, classified. */
interface Failure {
  /** `unavailable`: retryable; `connect`: a permanent TLS/scheme failure of this endpoint (try the others); `auth`: authenticate again and retry; `fatal`: stop. */
  readonly kind: 'unavailable' | 'connect' | 'auth' | 'fatal';
  readonly err: AppError;
}

/** One set of channels, made with one TLS material. */
class Channels {
  readonly creds: grpc.ChannelCredentials;
  readonly stamp: string | null;
  readonly #clients = new Map<number, grpc.Client>();
  inflight = 0;
  retired = false;

  constructor(creds: grpc.ChannelCredentials, stamp: string | null) {
    this.creds = creds;
    this.stamp = stamp;
  }

  client(i: number, endpoint: string): grpc.Client {
    let c = this.#clients.get(i);
    if (c === undefined) {
      c = new grpc.Client(endpoint.replace(/^https?:\/\//, ''), this.creds, { 'grpc.use_local_subchannel_pool': 1, 'grpc.max_receive_message_length': 64 * 1024 * 1024 });
      this.#clients.set(i, c);
    }
    return c;
  }

  close(): void {
    for (const c of this.#clients.values()) c.close();
    this.#clients.clear();
  }
}

function credsOf(t: EtcdTlsMaterial | undefined): grpc.ChannelCredentials {
  if (t === undefined) return grpc.credentials.createInsecure();
  try {
    return grpc.credentials.createSsl(t.ca, t.key ?? null, t.cert ?? null);
  } catch (e) {
    throw new AppError('IPAM_INVALID_CONFIG', `ipam.pool.etcd.tls: the files do not make a usable TLS configuration: ${e instanceof Error ? e.message : String(e)}`, { cause: e });
  }
}

/** {@link KV} on etcd v3. See the module comment. */
export class EtcdKV implements KV, Leases {
  readonly description: string;
  readonly stats: KVStats = zeroStats();
  readonly #endpoints: readonly string[];
  readonly #timeout: number;
  readonly #tlsSource: EtcdTlsSource | null;
  readonly #clientCert: boolean;
  readonly #secure: boolean;
  readonly #credentials: EtcdCredentialsSource | null;
  readonly #clock: () => number;
  readonly #tlsRecheckMs: number;
  #channels: Channels;
  #tlsCheckedAt: number;
  #current = 0;
  #closed = false;
  /** The auth token: null = none yet (authenticate before the next call when credentials are set); '' = etcd has auth off. */
  #token: string | null = null;
  #authing: Promise<void> | null = null;
  #authentications = 0;
  /** Cluster IDs (hex) seen per endpoint index, and the first one seen. */
  readonly #seen = new Map<number, string>();
  #firstCluster: string | null = null;
  /** Set once two cluster IDs were seen: every later call throws it. */
  #mismatch: AppError | null = null;
  #check: { readonly result: ClusterCheck; readonly at: number } | null = null;
  #checking: Promise<ClusterCheck> | null = null;
  /** The highest store revision a KV answer (Range, Txn) carried. */
  #highest = 0n;
  /** See {@link KV.generation}: bumped each time a KV answer's revision is below {@link #highest}. */
  #generation = 0;
  /**
   * Told once, the first time etcd's revision is seen going backwards (`highest` seen before,
   * `now` in this answer), for a log line (the daemon: `etcd's revision went backwards (restored
   * from a snapshot?)`); must not throw. Null: nobody.
   */
  onRevisionBackwards: ((highest: string, now: string) => void) | null = null;

  constructor(opts: EtcdKVOptions) {
    if (opts.endpoints.length === 0) throw new AppError('IPAM_INVALID_CONFIG', 'etcd: no endpoints');
    this.#endpoints = [...opts.endpoints];
    this.#current = (opts.firstEndpoint ?? Math.floor(Math.random() * opts.endpoints.length)) % opts.endpoints.length;
    this.description = `etcd ${opts.endpoints.join(',')}`;
    this.#timeout = Math.max(1000, Math.floor((opts.callTimeoutMs ?? DEFAULT_CALL_TIMEOUT_MS) / opts.endpoints.length));
    this.#secure = this.#endpoints.some((e) => e.startsWith('https://'));
    this.#credentials = opts.credentials ?? null;
    this.#clock = opts.clock ?? (() => performance.now());
    this.#tlsRecheckMs = opts.tlsRecheckMs ?? TLS_RECHECK_MS;
    const t = opts.tls;
    let material: EtcdTlsMaterial | undefined;
    let stamp: string | null = null;
    if (t !== undefined && 'read' in t) {
      this.#tlsSource = t;
      // The stamp first (a file replaced after it shows as a change); a file missing is reported
      // by read(), whose error names the key and says "open".
      try {
        stamp = t.stamp();
      } catch (e) {
        t.read();
        throw e;
      }
      material = t.read();
    } else {
      this.#tlsSource = null;
      material = t;
    }
    this.#clientCert = material?.cert !== undefined;
    this.#channels = new Channels(credsOf(material), stamp);
    this.#tlsCheckedAt = this.#clock();
  }

  #closedError(): ClosedError {
    return new ClosedError(`etcd client (${this.#endpoints.join(',')})`);
  }

  /**
   * Check the TLS files' stamp (when `force`, or `tlsRecheckMs` after the last check) and, when it
   * changed and the files read, switch to new channels. True when it switched.
   */
  #reloadTls(force: boolean): boolean {
    const src = this.#tlsSource;
    if (src === null || this.#closed) return false;
    const now = this.#clock();
    if (!force && now - this.#tlsCheckedAt < this.#tlsRecheckMs) return false;
    this.#tlsCheckedAt = now;
    let creds: grpc.ChannelCredentials;
    let stamp: string;
    try {
      stamp = src.stamp();
      if (stamp === this.#channels.stamp) return false;
      const m = src.read();
      creds = credsOf(m);
    } catch {
      return false; // a rotation half done, a file missing: keep what works, look again later
    }
    const old = this.#channels;
    this.#channels = new Channels(creds, stamp);
    old.retired = true;
    if (old.inflight === 0) old.close();
    return true;
  }

  #unary<T>(i: number, name: MethodName, req: object): Promise<T> {
    const def = method(name);
    const ch = this.#channels;
    const client = ch.client(i, this.#endpoints[i] as string);
    const md = new grpc.Metadata();
    if (this.#token !== null && this.#token !== '' && name !== 'Authenticate' && name !== 'Status') md.set('token', this.#token);
    ch.inflight++;
    const done = (): void => {
      ch.inflight--;
      if (ch.retired && ch.inflight === 0) ch.close();
    };
    const p =
      name === 'LeaseKeepAlive'
        ? // A bidirectional stream in etcd's API: one request, one answer, then the stream is closed.
          new Promise<T>((resolve, reject) => {
            const call = client.makeBidiStreamRequest(def.path, def.requestSerialize, def.responseDeserialize, md, { deadline: Date.now() + this.#timeout });
            let settled = false;
            call.on('data', (v: T) => {
              if (settled) return;
              settled = true;
              resolve(v);
              call.cancel();
            });
            call.on('error', (e: grpc.ServiceError) => {
              if (settled) return;
              settled = true;
              reject(e);
            });
            call.on('end', () => {
              if (settled) return;
              settled = true;
              reject(Object.assign(new Error('the keep-alive stream ended without an answer'), { code: grpc.status.UNAVAILABLE, details: 'the keep-alive stream ended without an answer' }));
            });
            call.write(req);
          })
        : new Promise<T>((resolve, reject) => {
            // grpc-js captures the caller's stack on every call (`new Error()` in
            // makeUnaryRequest), only to append it to a failed call's `stack`; our errors carry
            // what failed in their message (convertEtcdError). Not capturing it saves a few
            // percent of the daemon's CPU per call under load (docs/benchmarks.md).
            const limit = Error.stackTraceLimit;
            Error.stackTraceLimit = 0;
            try {
              client.makeUnaryRequest(def.path, def.requestSerialize, def.responseDeserialize, req, md, { deadline: Date.now() + this.#timeout }, (err, value) => {
                if (err) reject(err);
                else resolve(value as T);
              });
            } finally {
              Error.stackTraceLimit = limit;
            }
          });
    return p.finally(done);
  }

  /**
   * Record the cluster ID of an answer of endpoint `i`; throws (and keeps) the mismatch error when
   * it differs from the first one this client saw.
   */
  #noteCluster(i: number, header: Header | null | undefined): void {
    const raw = header?.cluster_id;
    if (raw === undefined || raw === '' || raw === '0') return;
    const id = clusterHex(raw);
    const before = this.#seen.get(i);
    this.#seen.set(i, id);
    this.#firstCluster ??= id;
    if (id !== this.#firstCluster || (before !== undefined && before !== id)) {
      this.#mismatch ??= this.#mismatchError(before !== undefined && before !== id ? { i, id: before } : null);
      throw this.#mismatch;
    }
  }

  #mismatchError(earlier: { i: number; id: string } | null): AppError {
    const groups = new Map<string, string[]>();
    const add = (i: number, id: string): void => {
      let g = groups.get(id);
      if (g === undefined) groups.set(id, (g = []));
      const ep = this.#endpoints[i] as string;
      if (!g.includes(ep)) g.push(ep);
    };
    for (let i = 0; i < this.#endpoints.length; i++) {
      const id = this.#seen.get(i);
      if (id !== undefined) add(i, id);
      if (earlier !== null && earlier.i === i) add(i, earlier.id);
    }
    const parts = [...groups].map(([id, eps]) => `${joinAnd(eps)} ${eps.length === 1 ? 'is' : 'are'} in cluster ${id}`);
    return new AppError('IPAM_INVALID_CONFIG', `ipam.pool.etcd.endpoints name members of ${groups.size} etcd clusters: ${parts.join('; ')} — list the members of one cluster only`);
  }

  /** See {@link KV.highestRevision}. */
  get highestRevision(): string | null {
    return this.#highest === 0n ? null : this.#highest.toString();
  }

  /** See {@link KV.generation}. */
  get generation(): number {
    return this.#generation;
  }

  /**
   * Record the revision of a KV answer (Range, Txn: linearizable, so in one history never below
   * `floor`, the highest one seen before the request was sent; answers of concurrent requests
   * may arrive in any order). A lower one means etcd was restored from a snapshot (its revision
   * wound back): {@link generation} is bumped, and {@link onRevisionBackwards} told the first time.
   */
  #noteRevision(header: Header | null | undefined, floor: bigint): void {
    const raw = header?.revision;
    if (raw === undefined || raw === '' || raw === '0') return;
    const rev = BigInt(raw);
    if (rev >= floor) {
      if (rev > this.#highest) this.#highest = rev;
      return;
    }
    if (this.#highest < floor) {
      // Another answer already showed this going back (#highest only falls on that): one event, one bump.
      if (rev > this.#highest) this.#highest = rev;
      return;
    }
    const before = floor;
    this.#highest = rev;
    this.#generation++;
    if (this.#generation === 1) {
      try {
        this.onRevisionBackwards?.(String(before), String(rev));
      } catch {
        // a sink that throws is ignored
      }
    }
  }

  /** Classify a failed attempt of `name` on endpoint `i` (probing the endpoint's scheme when the text suggests a mismatch). */
  async #classify(e: unknown, what: string, name: MethodName, i: number): Promise<Failure> {
    const where = this.#endpoints[i] as string;
    if (e instanceof AppError) return { kind: 'fatal', err: e };
    const code = (e as Partial<grpc.ServiceError>).code;
    const text = detailsOf(e);
    if (code === grpc.status.UNAVAILABLE) {
      if (this.#secure) {
        const t = tlsFailureOf(text, this.#clientCert);
        if (t !== null) return { kind: 'connect', err: new AppError(t.code, `TLS handshake with ${where} failed: ${t.why}`, { cause: e }) };
        if (TLS_TO_PLAIN_HINT.test(text) && (await speaksPlainHttp2(where, Math.min(this.#timeout, 1000)))) {
          return { kind: 'connect', err: new AppError('IPAM_INVALID_CONFIG', `etcd at ${where} does not speak TLS (it answers plain HTTP/2) — write http:// in ipam.pool.etcd.endpoints`, { cause: e }) };
        }
      } else if (PLAIN_TO_TLS_HINT.test(text) && (await speaksTls(where, Math.min(this.#timeout, 1000)))) {
        return { kind: 'connect', err: new AppError('IPAM_INVALID_CONFIG', `etcd at ${where} speaks TLS — write https:// in ipam.pool.etcd.endpoints and set ipam.pool.etcd.tls`, { cause: e }) };
      }
    }
    // Auth (etcd-io/etcd etcdserver/api/v3rpc/rpctypes: ErrGRPCUserEmpty, ErrGRPCInvalidAuthToken,
    // ErrGRPCAuthOldRevision, ErrGRPCAuthFailed).
    if (name === 'Authenticate' && /authentication failed, invalid user ID or password/.test(text)) {
      return { kind: 'fatal', err: new AppError('IPAM_INVALID_CONFIG', `etcd at ${where} refused the user and password of ${this.#credentials?.describe ?? 'the credentials'}: ${text}`, { cause: e }) };
    }
    if (/etcdserver: user name is empty/.test(text)) {
      if (this.#credentials !== null) return { kind: 'auth', err: convertEtcdError(e, what, where) };
      return { kind: 'fatal', err: new AppError('IPAM_INVALID_CONFIG', `etcd at ${where} requires authentication (${text}) — set ipam.pool.etcd.credentials, or a client certificate etcd maps to a user`, { cause: e }) };
    }
    if (/etcdserver: (invalid auth token|revision of auth store is old)/.test(text) && this.#credentials !== null) {
      return { kind: 'auth', err: convertEtcdError(e, what, where) };
    }
    const err = convertEtcdError(e, what, where);
    return { kind: err.code === 'STORE_UNAVAILABLE' ? 'unavailable' : 'fatal', err };
  }

  /**
   * One pass over the endpoints (from the current one). Throws the classified failure: `fatal`
   * and `auth` at once, else when every endpoint failed (see the module comment for which error).
   */
  async #failover<T>(what: string, name: MethodName, req: object): Promise<T> {
    const failures: Failure[] = [];
    /** The highest revision seen before this request was sent: its answer may not be lower (linearizable). */
    const floor = this.#highest;
    for (let k = 0; k < this.#endpoints.length; k++) {
      const i = (this.#current + k) % this.#endpoints.length;
      let r: T;
      try {
        r = await this.#unary<T>(i, name, req);
      } catch (e) {
        if (this.#closed) throw this.#closedError();
        const f = await this.#classify(e, what, name, i);
        if (f.kind === 'fatal' || f.kind === 'auth') throw new FailedAttempts(f, [f]);
        failures.push(f);
        continue;
      }
      this.#noteCluster(i, (r as { header?: Header | null }).header);
      if (name === 'Range' || name === 'Txn') this.#noteRevision((r as { header?: Header | null }).header, floor);
      this.#current = i;
      // The client's first answer starts the cluster check in the background: that endpoint's ID
      // is known now, so only the others are asked (none with one endpoint).
      if (this.#check === null && this.#checking === null) void this.clusterCheck().catch(() => undefined);
      return r;
    }
    const unavailable = failures.filter((f) => f.kind === 'unavailable');
    const main = (unavailable.length > 0 ? unavailable[unavailable.length - 1] : failures[0]) as Failure;
    throw new FailedAttempts(main, failures);
  }

  /** The error for a pass where every endpoint failed: the main one, plus what each other one answered. */
  static #combined(f: FailedAttempts): AppError {
    const others = f.all.filter((x) => x !== f.main).map((x) => (x.kind === 'unavailable' ? x.err.message.replace(/^etcd at (\S+) is unavailable: [^:]*: /, '$1: ').slice(0, 160) : x.err.message.slice(0, 400)));
    if (others.length === 0) return f.main.err;
    return new AppError(f.main.err.code, `${f.main.err.message} (also tried ${others.join('; ')})`, { cause: f.main.err, retryable: f.main.err.isRetryable });
  }

  /**
   * Call `name` on the current endpoint, failing over to each other one; then, once: after a TLS
   * handshake failure with changed TLS files, on new channels; after etcd rejected the token, with
   * a new one.
   */
  async #call<T>(what: string, name: MethodName, req: object): Promise<T> {
    if (this.#closed) throw this.#closedError();
    if (this.#mismatch !== null) throw this.#mismatch;
    this.#reloadTls(false);
    if (this.#credentials !== null && this.#token === null) await this.#authenticate();
    for (let round = 0; ; round++) {
      const token = this.#token;
      try {
        return await this.#failover<T>(what, name, req);
      } catch (e) {
        if (!(e instanceof FailedAttempts)) throw e;
        if (round === 0 && e.main.kind === 'auth') {
          // Only the token this call used is dropped: calls that failed with it together
          // authenticate once (a newer token, got meanwhile, is used as it is).
          if (this.#token === token) this.#token = null;
          if (this.#token === null) await this.#authenticate();
          continue;
        }
        // Any endpoint that could not be reached: look at the TLS files now (a few stat calls).
        // A rotation shows as a handshake failure, or — while grpc-js backs off a channel that
        // failed during etcd's restart — as that earlier failure repeated.
        if (round === 0 && e.all.some((f) => f.kind === 'unavailable' || f.kind === 'connect') && this.#reloadTls(true)) continue;
        throw EtcdKV.#combined(e);
      }
    }
  }

  /** Successful authentications so far (the first, then one per token etcd rejected). */
  get authentications(): number {
    return this.#authentications;
  }

  /** Get a token with the credentials (one at a time). etcd with auth off: no token (''). */
  #authenticate(): Promise<void> {
    const src = this.#credentials;
    if (src === null) return Promise.resolve();
    this.#authing ??= (async () => {
      const c = src.read();
      try {
        const r = await this.#failover<{ token: string; header?: Header }>(`authenticate as ${c.user}`, 'Authenticate', { name: c.user, password: c.password });
        this.#token = r.token;
        this.#authentications++;
      } catch (e) {
        if (!(e instanceof FailedAttempts)) throw e;
        // etcd-io/etcd rpctypes ErrGRPCAuthNotEnabled: no token needed (yet); asked again if etcd later wants one.
        if (/authentication is not enabled/.test(e.main.err.message)) {
          this.#token = '';
          return;
        }
        throw EtcdKV.#combined(e);
      }
    })().finally(() => {
      this.#authing = null;
    });
    return this.#authing;
  }

  /**
   * The cluster check (see the module comment): every endpoint that has not answered a call yet
   * asked at once for its cluster ID (`Maintenance.Status`, each within the attempt deadline). Resolves to the one cluster ID those
   * that answered gave (null when none answered) and the endpoints that did not answer, each
   * with why. A check every endpoint answered is kept for the client's life; one with an
   * unanswered endpoint is used for {@link CLUSTER_RECHECK_MS}, then the next call starts another
   * one in the background (the earlier answer is returned meanwhile). Started by the client's
   * first answer (in the background) and awaited before the first write; the pool allocator
   * awaits it before creating a pool.
   * @throws AppError IPAM_INVALID_CONFIG (CNI 7) `ipam.pool.etcd.endpoints name members of <n>
   *   etcd clusters: <endpoints> is in cluster <hex id>; … — list the members of one cluster only`
   *   when two IDs were seen (also by any earlier call); ClosedError after close().
   */
  clusterCheck(): Promise<ClusterCheck> {
    if (this.#closed) return Promise.reject(this.#closedError());
    if (this.#mismatch !== null) return Promise.reject(this.#mismatch);
    const c = this.#check;
    if (c !== null && (c.result.unanswered.length === 0 || this.#checking !== null || this.#clock() - c.at < CLUSTER_RECHECK_MS)) return Promise.resolve(c.result);
    if (this.#checking !== null) return this.#checking;
    const run = this.#runCheck().finally(() => {
      this.#checking = null;
    });
    this.#checking = run;
    if (c !== null) {
      run.catch(() => undefined); // a background re-check: its mismatch shows at the next call
      return Promise.resolve(c.result);
    }
    return run;
  }

  async #runCheck(): Promise<ClusterCheck> {
    const answers = await Promise.all(
      this.#endpoints.map(async (_, i) => {
        // An endpoint that has answered a call already: its ID is known (and compared).
        if (this.#seen.has(i)) return { i, header: null };
        try {
          const r = await this.#unary<{ header?: Header }>(i, 'Status', {});
          return { i, header: r.header ?? null };
        } catch (e) {
          if (this.#closed) throw this.#closedError();
          return { i, why: (await this.#classify(e, 'status', 'Status', i)).err.message };
        }
      }),
    );
    let id: string | null = null;
    const unanswered: string[] = [];
    for (const a of answers) {
      if ('why' in a) {
        unanswered.push(`${this.#endpoints[a.i] as string} (${a.why})`);
        continue;
      }
      if (a.header !== null) this.#noteCluster(a.i, a.header); // throws the mismatch
      id ??= this.#seen.get(a.i) ?? null;
    }
    const result: ClusterCheck = { clusterId: id, unanswered };
    this.#check = { result, at: this.#clock() };
    return result;
  }

  /** Before a write: the cluster check must hold (awaited the first time; see {@link clusterCheck}). */
  async #beforeWrite(): Promise<void> {
    await this.clusterCheck();
  }

  async get(key: string): Promise<KVEntry | null> {
    this.stats.reads++;
    const r = await this.#call<{ kvs: RawKV[] }>(`get ${key}`, 'Range', { key: Buffer.from(key) });
    const kv = r.kvs[0];
    return kv === undefined ? null : entry(kv, false);
  }

  async getMany(keys: readonly string[]): Promise<Array<KVEntry | null>> {
    if (keys.length > MAX_TXN_OPS) throw new AppError('INTERNAL', `a read of ${keys.length} keys exceeds etcd's limit of ${MAX_TXN_OPS} ops per transaction`);
    if (keys.length === 0) return [];
    this.stats.reads++;
    const req = { compare: [], success: keys.map((k) => ({ request_range: { key: Buffer.from(k) } })), failure: [] };
    const r = await this.#call<{ responses: Array<{ response_range?: { kvs: RawKV[] } | null }> }>(`get ${keys.length} keys (${keys[0] as string}, …)`, 'Txn', req);
    return keys.map((k, i) => {
      const rr = r.responses[i]?.response_range;
      if (rr === undefined || rr === null) throw new AppError('STORE_IO', `etcd: a read of ${k} got no range answer`);
      const kv = rr.kvs[0];
      return kv === undefined ? null : entry(kv, false);
    });
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
    if (this.#closed) throw this.#closedError();
    await this.#beforeWrite();
    this.stats.txns++;
    const req = {
      compare: compare.map((c) =>
        'absent' in c
          ? { key: Buffer.from(c.key), target: 'Create', result: 'Equal', create_revision: '0' }
          : 'value' in c
            ? { key: Buffer.from(c.key), target: 'Value', result: 'Equal', value: Buffer.from(c.value) }
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
    if (this.#closed) throw this.#closedError();
    await this.#beforeWrite();
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
    this.#channels.close();
  }
}

/** Thrown inside {@link EtcdKV} by a pass over the endpoints that failed; never leaves the class. */
class FailedAttempts extends Error {
  readonly main: Failure;
  readonly all: readonly Failure[];
  constructor(main: Failure, all: readonly Failure[]) {
    super(main.err.message);
    this.main = main;
    this.all = all;
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
