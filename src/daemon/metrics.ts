/**
 * The daemon's Prometheus metrics (`docs/metrics.md`), with `prom-client` on a registry of our
 * own (never the library's global one, so two daemons in one test process do not share series),
 * and the HTTP endpoint that serves them with `/healthz` and `/readyz`.
 *
 * Series (names and labels are a stable interface; docs/metrics.md explains each and gives alert
 * rules):
 * - `ipwarden_addresses{network,range_set,state}` gauge, state = live|grace|leaked|corrupt|unknown|free
 * - `ipwarden_range_set_capacity{network,range_set}` gauge
 * - `ipwarden_releases_total{network,reason}` counter
 * - `ipwarden_release_candidates{network}` gauge
 * - `ipwarden_reconcile_duration_seconds` histogram
 * - `ipwarden_reconcile_errors_total{kind}` counter
 * - `ipwarden_last_reconcile_success_timestamp_seconds` gauge
 * - `ipwarden_cni_requests_total{command,path,result}` counter, path = daemon|standalone
 * - `ipwarden_cni_request_duration_seconds{command}` histogram (daemon path only: the standalone
 *   plugin's own time is not visible to the daemon)
 *
 * The labels are the idiom of node agents (Calico's `ipam_allocations_in_use` per pool and node,
 * Cilium's `cilium_ipam_capacity`; ../shared/reference/daemons-and-pools.md §1).
 */
import { closeSync, constants, fstatSync, openSync, readSync } from 'node:fs';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Counter, Gauge, Histogram, Registry } from 'prom-client';
import type { HostPort } from '../common/daemon-options.ts';

/** Address states of `ipwarden_addresses` (the verdicts of docs/reconciler.md, plus free). */
export const ADDRESS_STATES = ['live', 'grace', 'leaked', 'corrupt', 'unknown', 'free'] as const;

/** One of {@link ADDRESS_STATES}. */
export type AddressState = (typeof ADDRESS_STATES)[number];

/** The CNI commands counted (anything else read from the fallback log counts as `other`). */
const CNI_COMMANDS = new Set(['ADD', 'DEL', 'CHECK', 'GC', 'STATUS', 'VERSION']);

/** One range set as one reconcile pass saw it. Counts are addresses (numbers; a /64 is clamped). */
export interface RangeSetObservation {
  readonly network: string;
  /** The range set's index in the configuration (host-local's `range N`, `last_reserved_ip.N`). */
  readonly rangeSet: number;
  readonly capacity: number;
  readonly counts: Readonly<Record<AddressState, number>>;
}

/** What one reconcile pass reports to the metrics. */
export interface PassObservation {
  /** Every range set of every network of this pass (series of range sets not listed are removed). */
  readonly rangeSets: readonly RangeSetObservation[];
  /** Release candidates per network: leaked/corrupt reservations seen and not yet released. */
  readonly candidates: ReadonlyMap<string, number>;
  /** Releases done in this pass. `reason` is the verdict that allowed it (leaked, corrupt, notready). */
  readonly released: ReadonlyArray<{ readonly network: string; readonly reason: string }>;
  /** Errors of this pass by kind (runtime, kernel, lock, list, release, audit, config). */
  readonly errors: ReadonlyArray<{ readonly kind: string }>;
  /** Wall time of the pass, seconds. */
  readonly durationSeconds: number;
  /** Unix time (seconds) the pass ended. */
  readonly endedAtSeconds: number;
}

/** The daemon's metrics registry and the operations that feed it. */
export class DaemonMetrics {
  /** The registry `/metrics` serves. */
  readonly registry = new Registry();
  private readonly addresses: Gauge<'network' | 'range_set' | 'state'>;
  private readonly capacity: Gauge<'network' | 'range_set'>;
  private readonly releases: Counter<'network' | 'reason'>;
  private readonly candidates: Gauge<'network'>;
  private readonly reconcileDuration: Histogram;
  private readonly reconcileErrors: Counter<'kind'>;
  private readonly lastSuccess: Gauge;
  private readonly cniRequests: Counter<'command' | 'path' | 'result'>;
  private readonly cniDuration: Histogram<'command'>;
  private fallbackLog: FallbackLogReader | null = null;

  constructor() {
    const registers = [this.registry];
    this.addresses = new Gauge({
      name: 'ipwarden_addresses',
      help: 'Addresses per range set by state (live, grace, leaked, corrupt, unknown, free), as of the last reconcile pass.',
      labelNames: ['network', 'range_set', 'state'],
      registers,
    });
    this.capacity = new Gauge({
      name: 'ipwarden_range_set_capacity',
      help: 'Allocatable addresses of the range set (gateways excluded).',
      labelNames: ['network', 'range_set'],
      registers,
    });
    this.releases = new Counter({
      name: 'ipwarden_releases_total',
      help: 'Reservations released by the daemon, by the verdict that allowed it.',
      labelNames: ['network', 'reason'],
      registers,
    });
    this.candidates = new Gauge({
      name: 'ipwarden_release_candidates',
      help: 'Leaked or corrupt reservations seen and not (yet) released: awaiting a second observation, over the per-pass cap, or refused.',
      labelNames: ['network'],
      registers,
    });
    this.reconcileDuration = new Histogram({
      name: 'ipwarden_reconcile_duration_seconds',
      help: 'Wall time of one reconcile pass over every network of the node.',
      buckets: [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60],
      registers,
    });
    this.reconcileErrors = new Counter({
      name: 'ipwarden_reconcile_errors_total',
      help: 'Reconcile failures by kind (runtime, kernel, lock, list, release, audit, config).',
      labelNames: ['kind'],
      registers,
    });
    this.lastSuccess = new Gauge({
      name: 'ipwarden_last_reconcile_success_timestamp_seconds',
      help: 'Unix time of the end of the last reconcile pass that had no error (0 before the first).',
      registers,
    });
    this.cniRequests = new Counter({
      name: 'ipwarden_cni_requests_total',
      help: 'CNI requests answered, by command, path (daemon = through the socket; standalone = the shim fell back to the standalone plugin) and result.',
      labelNames: ['command', 'path', 'result'],
      registers,
    });
    this.cniDuration = new Histogram({
      name: 'ipwarden_cni_request_duration_seconds',
      help: 'Time the daemon took to answer a CNI request (from the complete request to the answer written).',
      labelNames: ['command'],
      buckets: [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5, 30],
      registers,
    });
    this.lastSuccess.set(0);
    this.poolReleases = new Counter({
      name: 'ipwarden_pool_releases_total',
      help: "Cluster-pool attachments released on this node, by pool and by who released them (daemon = the daemon's pool pass, gc = CNI GC through the daemon).",
      labelNames: ['pool', 'reason'],
      registers,
    });
  }

  // ---- Cluster-pool reconcile (docs/cluster.md "Reconcile per node"; branch poolgc) ----
  private readonly poolReleases: Counter<'pool' | 'reason'>;

  /** Feed one finished pool pass of the loop: its releases (reason `daemon`) and its errors (kinds prefixed `pool-`). */
  recordPoolPass(p: { readonly released: ReadonlyArray<{ readonly pool: string }>; readonly errors: ReadonlyArray<{ readonly kind: string }> }): void {
    for (const r of p.released) this.poolReleases.inc({ pool: r.pool, reason: 'daemon' });
    for (const e of p.errors) this.reconcileErrors.inc({ kind: `pool-${e.kind}` });
  }

  /** Count `n` attachments of `pool` released by CNI GC through the daemon. */
  recordPoolGc(pool: string, n: number): void {
    if (n > 0) this.poolReleases.inc({ pool, reason: 'gc' }, n);
  }
  // ---- end of the cluster-pool reconcile block ----

  /**
   * Count the standalone plugin's fallback requests from `path` (docs/daemon.md "Fallback
   * requests in the metrics"), read on each scrape. The whole file is counted at the first read
   * (a daemon that was down counts what ran meanwhile; Prometheus treats the restart as a counter
   * reset).
   */
  watchFallbackLog(path: string): void {
    this.fallbackLog = new FallbackLogReader(path);
  }

  /** Count one request the daemon answered (or dropped: result `dropped`). */
  recordCniRequest(command: string, result: 'ok' | 'error' | 'dropped' | 'declined', durationSeconds: number): void {
    const c = CNI_COMMANDS.has(command) ? command : 'other';
    this.cniRequests.inc({ command: c, path: 'daemon', result });
    if (result !== 'dropped' && result !== 'declined') this.cniDuration.observe({ command: c }, durationSeconds);
  }

  /** Count a reconcile error outside a pass's report (e.g. a pass that threw). */
  recordReconcileError(kind: string): void {
    this.reconcileErrors.inc({ kind });
  }

  /** Feed one finished reconcile pass. */
  recordPass(p: PassObservation): void {
    this.addresses.reset();
    this.capacity.reset();
    for (const r of p.rangeSets) {
      const rs = String(r.rangeSet);
      this.capacity.set({ network: r.network, range_set: rs }, r.capacity);
      for (const state of ADDRESS_STATES) this.addresses.set({ network: r.network, range_set: rs, state }, r.counts[state]);
    }
    this.candidates.reset();
    for (const [network, n] of p.candidates) this.candidates.set({ network }, n);
    for (const r of p.released) this.releases.inc({ network: r.network, reason: r.reason });
    for (const e of p.errors) this.reconcileErrors.inc({ kind: e.kind });
    this.reconcileDuration.observe(p.durationSeconds);
    if (p.errors.length === 0) this.lastSuccess.set(p.endedAtSeconds);
  }

  /** The exposition text (what `/metrics` answers). */
  async text(): Promise<string> {
    this.readFallbackLog();
    return this.registry.metrics();
  }

  private readFallbackLog(): void {
    if (this.fallbackLog === null) return;
    for (const l of this.fallbackLog.readNew()) {
      this.cniRequests.inc({ command: CNI_COMMANDS.has(l.command) ? l.command : 'other', path: 'standalone', result: l.result });
    }
  }
}

/** One parsed line of the fallback log. */
interface FallbackLine {
  readonly command: string;
  readonly result: 'ok' | 'error';
}

/** Most bytes read from the fallback log per scrape (a runaway file cannot stall a scrape). */
const FALLBACK_READ_MAX = 1 << 20;

/**
 * Reads the lines appended to the standalone plugin's fallback log since the last read. Opens
 * with O_NOFOLLOW (never through a symlink) and reads only a regular file; a file that shrank was
 * replaced or truncated, so it is read from its start. Malformed lines are skipped.
 */
export class FallbackLogReader {
  private offset = 0;
  private ino = -1;
  private partial = '';
  private readonly path: string;

  /** @param path the fallback log (docs/daemon.md), read with O_NOFOLLOW. */
  constructor(path: string) {
    this.path = path;
  }

  /** Lines appended since the last call ([] when the file is absent or unreadable). */
  readNew(): FallbackLine[] {
    let fd: number;
    try {
      fd = openSync(this.path, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
    } catch {
      return [];
    }
    try {
      const st = fstatSync(fd);
      if (!st.isFile()) return [];
      if (st.ino !== this.ino || st.size < this.offset) {
        this.ino = st.ino;
        this.offset = 0;
        this.partial = '';
      }
      const n = Math.min(st.size - this.offset, FALLBACK_READ_MAX);
      if (n <= 0) return [];
      const buf = Buffer.alloc(n);
      const got = readSync(fd, buf, 0, n, this.offset);
      this.offset += got;
      const text = this.partial + buf.subarray(0, got).toString('latin1');
      const lines = text.split('\n');
      this.partial = lines.pop() ?? '';
      const out: FallbackLine[] = [];
      for (const line of lines) {
        const m = /^\d+ ([A-Z]{1,16}) (ok|error)$/.exec(line);
        if (m !== null) out.push({ command: m[1] as string, result: m[2] as 'ok' | 'error' });
      }
      return out;
    } finally {
      closeSync(fd);
    }
  }
}

/** Most connections the metrics endpoint holds at once (more are refused by the kernel's accept). */
export const METRICS_MAX_CONNECTIONS = 32;
/** A metrics connection idle this long (no bytes either way) is closed, seconds. */
export const METRICS_IDLE_SECONDS = 15;

/** The daemon's health, as `/healthz` and `/readyz` report it. */
export interface Health {
  /** `/healthz`: the process works (its event loop answers; the plugin server has not failed). */
  live(): { ok: boolean; why: string };
  /** `/readyz`: the plugin socket is listening and accepting requests. */
  ready(): { ok: boolean; why: string };
}

/** A running metrics endpoint. */
export interface MetricsServer {
  /** The bound address (the real port when 0 was asked). */
  readonly address: HostPort;
  /** Stop listening; idempotent. */
  close(): Promise<void>;
}

/**
 * Serve `GET /metrics` (Prometheus text format 0.0.4), `/healthz` and `/readyz` (200 `ok`, else
 * 503 with the reason) on `addr`. Any other path is 404, any other method 405.
 * @throws the `listen` error (EADDRINUSE, EACCES, EADDRNOTAVAIL) as a rejected promise.
 */
export async function startMetricsServer(addr: HostPort, metrics: DaemonMetrics, health: Health): Promise<MetricsServer> {
  const server: Server = createServer((req: IncomingMessage, res: ServerResponse) => {
    void answer(req, res, metrics, health);
  });
  server.keepAliveTimeout = 5_000;
  server.headersTimeout = 10_000;
  server.requestTimeout = 10_000;
  // Any local user can connect: bound the connections and close the ones that send nothing, so
  // the endpoint cannot be used to exhaust the daemon's file descriptors (found by review: 20,000
  // idle connections did). Prometheus needs one connection per scraper.
  server.maxConnections = METRICS_MAX_CONNECTIONS;
  server.on('connection', (sock) => {
    sock.setTimeout(METRICS_IDLE_SECONDS * 1000, () => sock.destroy());
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen({ host: addr.host, port: addr.port }, () => {
      server.off('error', reject);
      resolve();
    });
  });
  const bound = server.address() as AddressInfo;
  let closing: Promise<void> | null = null;
  return {
    address: { host: addr.host, port: bound.port },
    close: () => {
      closing ??= new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      });
      return closing;
    },
  };
}

async function answer(req: IncomingMessage, res: ServerResponse, metrics: DaemonMetrics, health: Health): Promise<void> {
  const path = (req.url ?? '/').split('?')[0];
  if (req.method !== 'GET' && req.method !== 'HEAD') {
    res.writeHead(405, { Allow: 'GET, HEAD', 'Content-Type': 'text/plain' }).end('method not allowed\n');
    return;
  }
  try {
    if (path === '/metrics') {
      const body = await metrics.text();
      res.writeHead(200, { 'Content-Type': metrics.registry.contentType }).end(req.method === 'HEAD' ? undefined : body);
    } else if (path === '/healthz' || path === '/readyz') {
      const h = path === '/healthz' ? health.live() : health.ready();
      res.writeHead(h.ok ? 200 : 503, { 'Content-Type': 'text/plain' }).end(h.ok ? 'ok\n' : `${h.why}\n`);
    } else {
      res.writeHead(404, { 'Content-Type': 'text/plain' }).end('not found: try /metrics, /healthz, /readyz\n');
    }
  } catch (e) {
    res.writeHead(500, { 'Content-Type': 'text/plain' }).end(`${e instanceof Error ? e.message : String(e)}\n`);
  }
}
