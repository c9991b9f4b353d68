/**
 * The node agent as `ipwarden daemon` runs it: the plugin server (src/daemon/daemon.ts) with the
 * metrics endpoint (with the status pages, src/daemon/status-pages.ts) and the reconcile loop as
 * its parts, every request counted, readiness from the socket's state.
 */
import type { DaemonOptions } from '../common/daemon-options.ts';
import { readKernelEvidenceAsync } from '../node/kernel-evidence.ts';
import type { ReconcileDeps } from '../reconcile/options.ts';
import { join, dirname } from 'node:path';
import { AppError } from '../common/errors.ts';
import { NetworkIndexes } from '../store/file/indexed-store.ts';
import type { PoolHooks } from '../cni/pool.ts';
import { PoolSessions } from './pool-sessions.ts';
import type { PoolConfig } from '../ipam/pool-config.ts';
import { readCniConfigs, type CniNetwork } from '../node/cni-conf.ts';
import { DaemonLearnedPools } from './learned-pools.ts';
import { runDaemon, type DaemonDeps, type DaemonPartFactory, type SignalSource } from './daemon.ts';
import { cniPoolTargets, reconcileLoopPart, type ReconcileLoop } from './loop.ts';
import { nodeNameMismatch } from './node-name-check.ts';
import { DaemonMetrics, startHealthServer, startMetricsServer } from './metrics.ts';
import { createLogger, type Logger } from './log.ts';
import { kernelAddresses } from './kernel-addresses.ts';
import type { KernelIndexOptions } from '../node/kernel-index.ts';
import { collectStatus, type StatusQuery } from '../reconcile/status.ts';
import { DaemonStatusPages, STATUS_LOCK_TIMEOUT_SECONDS, type StatusHtmlRenderer } from './status-pages.ts';
import { criHealFactoryFor, type PluginServer } from './plugin-server.ts';
import { InstallWatch, type InstalledFilesDeps } from './install-watch.ts';
import type { NodeEndpointSource } from '../cni/heal.ts';
import { parseRuntimeEndpoint } from '../common/endpoint.ts';
import { openAuditLog, openDefaultAuditLog } from '../reconcile/audit.ts';
import { poolReclaimReport } from './pool-reclaim.ts';
import { makeDirs } from '../common/make-dirs.ts';

/** File the standalone plugin counts its fallback requests in (docs/daemon.md). */
export const FALLBACK_LOG_NAME = 'standalone-requests.log';

/** What {@link agentDeps} may be given instead of production defaults (tests). */
export interface AgentOverrides {
  /** The engine's I/O for the loop (default: the real runtime, kernel and clock). */
  readonly reconcile?: ReconcileDeps;
  /** Receives the loop once it exists. */
  readonly onLoop?: (loop: ReconcileLoop) => void;
  /** Receives the metrics registry. */
  readonly onMetrics?: (m: DaemonMetrics) => void;
  readonly releaseCap?: number;
  /** The daemon's logger (default: pino at `--log-level` on stderr); the pool sessions' lines go to it too. */
  readonly log?: Logger;
  /** The kernel address index's reader, clock and bounds (default: the real kernel, docs/daemon.md). */
  readonly kernelIndex?: Omit<KernelIndexOptions, 'onRead'>;
  /**
   * The renderer of `/status` (src/cli/html.ts `renderStatusHtml`, handed in by src/cold.ts: the
   * CLI is a peer layer); without it `/status` answers 500 and `/status.json` still works.
   */
  readonly statusHtml?: StatusHtmlRenderer;
  /**
   * The files install-cni put in `--cni-bin-dir` and how to reinstall them (src/cold.ts builds it
   * from src/cli/install-cni.ts); absent: not watched.
   */
  readonly installed?: InstalledFilesDeps;
}

/**
 * The status query of the daemon's `/status` and `/status.json`: what `ipwarden status
 * --cni-conf-dir C --grace G [--runtime-endpoint R] [--network N]` asks with the daemon's values
 * (the data directories are the configurations', as for that command; not `--data-dir`).
 */
export function daemonStatusQuery(options: DaemonOptions): StatusQuery {
  return {
    cniConfDir: options.cniConfDir,
    graceSeconds: options.graceSeconds,
    ...(options.runtimeEndpoint === null ? {} : { runtimeEndpoint: options.runtimeEndpoint }),
    ...(options.network === null ? {} : { network: options.network }),
  };
}

/**
 * The daemon's parts and hooks: the pool sessions, the per-network index (closed last: it may still
 * hold a lock in its linger), the kernel address index (its first read before the socket serves;
 * its hooks make the ADDs skip addresses configured in a namespace: src/daemon/kernel-addresses.ts),
 * the metrics (with `/healthz`, `/readyz`), so the loop's first pass is already counted, then the
 * loop. The plugin server and the loop open every store through the one
 * index (docs/daemon.md "The index"), so the loop's changes are not seen as a foreign writer's.
 */
export function agentDeps(options: DaemonOptions, over: AgentOverrides = {}): DaemonDeps {
  const log = over.log ?? createLogger(options.logLevel);
  // Empty or unparseable reservation files (what a power loss leaves of a reservation whose content
  // had not reached the disk): named once per file; they stay taken until the evidence rules allow.
  const indexes = new NetworkIndexes({
    onCorrupt: (dir, names) =>
      log.warn(
        { dir, ips: names.slice(0, 20), count: names.length },
        'reservation files empty or unparseable (after a power loss: reservations whose content had not reached the disk): their addresses count as taken; only the evidence rules release them (verdict corrupt)',
      ),
  });
  const indexPart: DaemonPartFactory = () => ({ name: 'index', close: () => indexes.close() });
  // Cluster pools: one etcd client per pool for the daemon's life, the node's ADDs batched; the
  // node name is the daemon's own (NODE_NAME from the DaemonSet's downward API, else the host name).
  const metrics = new DaemonMetrics();
  // One logger for the daemon and its pool sessions: offline allocation's lines (offline ADD,
  // sync, sync failure, reserve short) are the daemon's own lines, with `part: "pools"`.
  const poolLog = log.child({ part: 'pools' });
  // The plugin server, once it listens: a pool round first learns which clients went away.
  let server: PluginServer | null = null;
  const pools = new PoolSessions(process.env, undefined, undefined, metrics.pools.observer, {
    log: (level, fields, msg) => poolLog[level](fields, msg),
    clientsCurrent: () => server?.clientsCurrent() ?? Promise.resolve(),
    // Automatic node removals (ipam.pool.reclaimAfter): logged, audited, counted.
    reclaimReport: poolReclaimReport({
      log: (level, fields, msg) => poolLog[level](fields, msg),
      audit: () => {
        if (options.auditLog !== null) return openAuditLog(options.auditLog);
        makeDirs(options.dataDir, 0o755);
        return openDefaultAuditLog(options.dataDir);
      },
      reclaimed: (pool) => metrics.pools.recordNodeReclaimed(pool),
    }),
    ...(options.poolJournalDir === undefined ? {} : { journalRoot: options.poolJournalDir }),
  });
  // Pool gauges on scrape, at most once per reconcile interval (and 10 s): scrapes never load etcd.
  metrics.pools.watch(() => pools.sample(), options.intervalSeconds);
  // Offline gauges (reserve left, journal entries, contact age) on every scrape: no I/O.
  metrics.pools.watchOffline(() => pools.offlineStats());
  // The pool networks learned from the requests served (their records under --data-dir).
  const learned = new DaemonLearnedPools(options.dataDir, log);
  // At start, announce the node in every pool its CNI configurations name, so a node that comes
  // back idle vetoes a removal begun while it was away (docs/cluster.md "remove-node", review F2b).
  const poolPart: DaemonPartFactory = ({ log }) => {
    // Offline pool allocations a crash or a restart left: read before the socket serves any
    // request (the parts start first), so a DEL or a repeated ADD is decided on its journal entry.
    pools.loadJournals();
    let networks: CniNetwork[] = [];
    try {
      networks = readCniConfigs(options.cniConfDir);
    } catch (e) {
      log.warn({ part: 'pools', error: e instanceof Error ? e.message : String(e) }, 'cannot read the CNI configurations: no pool announced at start');
    }
    for (const n of networks) {
      if (n.ipam?.pool === null || n.ipam?.pool === undefined) continue;
      try {
        pools.announce(n.ipam, 'cni-config');
        log.info({ part: 'pools', network: n.name, pool: n.ipam.pool.name, source: 'cni-config', file: n.file }, 'pool announced');
      } catch (e) {
        log.warn({ part: 'pools', network: n.name, error: e instanceof Error ? e.message : String(e) }, 'pool not announced');
      }
    }
    // Then the pool networks learned from requests (Multus: docs/cluster.md "Multus").
    learned.start(pools);
    return { name: 'pools', close: () => pools.close() };
  };
  metrics.watchFallbackLog(join(dirname(options.socket), FALLBACK_LOG_NAME));
  // The kernel's addresses for the ADDs the daemon serves (docs/daemon.md "The kernel address
  // index"): its first read lands before the socket serves.
  const kernel = kernelAddresses(log, metrics.kernelIndex, over.kernelIndex);
  over.onMetrics?.(metrics);
  let state: 'starting' | 'started' | 'stopping' | 'failed' = 'starting';
  // The node-name file must agree with NODE_NAME (src/daemon/node-name-check.ts): checked at start
  // and on every /readyz; a disagreement is logged (once per change), counted, and fails /readyz.
  let lastMismatch: string | null | undefined;
  const checkNodeName = (): string | null => {
    const m = nodeNameMismatch(process.env, over.installed?.dir);
    if (m !== lastMismatch) {
      if (m !== null) log.error({ error: m }, 'node name mismatch');
      else if (lastMismatch !== undefined) log.info('node name file agrees with NODE_NAME');
      lastMismatch = m;
    }
    metrics.setNodeNameMismatch(m !== null);
    return m;
  };
  checkNodeName();
  // The installed files: watched, reinstalled when they vanish or change; /readyz fails meanwhile.
  const installed = over.installed;
  let watch: InstallWatch | null = null;
  const installPart: DaemonPartFactory = async ({ log }) => {
    if (installed === undefined) return { name: 'installed-files', close: async () => undefined };
    metrics.watchInstalledFiles();
    const w = new InstallWatch(installed, {
      log: log.child({ part: 'installed-files' }),
      onReinstall: (reason) => metrics.recordReinstall(reason),
      onState: (ok) => metrics.setPluginInstalled(ok),
    });
    await w.start();
    watch = w;
    return { name: 'installed-files', close: () => w.close() };
  };
  const metricsPart: DaemonPartFactory = async ({ log }) => {
    const shown = `${options.metricsAddress.host.includes(':') ? `[${options.metricsAddress.host}]` : options.metricsAddress.host}:${options.metricsAddress.port}`;
    const health = {
      live: () => ({ ok: true, why: '' }),
      ready: () => {
        if (state !== 'started') {
          const why = state === 'starting' ? 'the plugin socket is not listening yet' : state === 'failed' ? "the plugin socket's thread ended (see the daemon's log); restart the daemon" : 'the daemon is stopping';
          return { ok: false, why };
        }
        // The plugin the runtime execs is gone (a re-created /opt/cni/bin) or not ours: not ready.
        const missing = watch?.problem() ?? null;
        if (missing !== null) return { ok: false, why: missing };
        const mismatch = checkNodeName();
        return mismatch === null ? { ok: true, why: '' } : { ok: false, why: mismatch };
      },
    };
    const listenError = (flag: string, at: string) => (e: unknown): never => {
      const code = (e as { code?: unknown }).code;
      const why = code === 'EADDRINUSE' ? 'the address is in use (another daemon?)' : code === 'EADDRNOTAVAIL' ? 'no interface has that address' : code === 'EACCES' ? 'permission denied' : e instanceof Error ? e.message : String(e);
      throw new AppError('USAGE', `cannot serve the ${flag === '--metrics-address' ? 'metrics' : 'probes'} on ${flag} ${at}: ${why}`, { cause: e });
    };
    const hostPort = (a: { host: string; port: number }): string => `${a.host.includes(':') ? `[${a.host}]` : a.host}:${a.port}`;
    const server = await startMetricsServer(options.metricsAddress, metrics, health, statusPages).catch(listenError('--metrics-address', shown));
    const probes = options.healthAddress === undefined ? null : await startHealthServer(options.healthAddress, health).catch(async (e: unknown) => {
      await server.close();
      return listenError('--health-address', hostPort(options.healthAddress as { host: string; port: number }))(e);
    });
    log.info({ metricsAddress: hostPort(server.address), ...(probes === null ? {} : { healthAddress: hostPort(probes.address) }) }, 'metrics listening');
    return {
      name: 'metrics',
      hooks: {
        onRequest: (e) => metrics.recordCniRequest(e.command, e.result, e.durationSeconds),
        onDropped: (e) => metrics.recordCniRequest(e.command, 'dropped', e.durationSeconds),
        onDeclined: (e) => metrics.recordCniRequest(e.command, 'declined', 0),
        onReclaim: (e) => metrics.recordReclaim(e.network, e.released),
      },
      close: async () => {
        await Promise.all([server.close(), probes?.close()]);
      },
    };
  };
  const reconcile: ReconcileDeps = over.reconcile ?? {
    env: process.env,
    now: () => Date.now(),
    // Asynchronous: a read of every namespace (up to the helper's 5 s) must not stall the socket.
    evidence: () => readKernelEvidenceAsync(),
    // Never create a directory the pass found gone (an operator may just have removed it).
    openStore: async (dataDir, network) => {
      const store = await indexes.openStore({ dataDir, network, create: false });
      if (store === null) throw new AppError('IPAM_NOT_FOUND', `the network directory ${dataDir}/${network} is gone`);
      return store;
    },
  };
  // /status and /status.json: a report made on request (the same reads as `ipwarden status`,
  // through the daemon's own stores), at most one per 5 s whatever the number of requests.
  const statusQuery = daemonStatusQuery(options);
  const statusPages = new DaemonStatusPages({
    collect: () => collectStatus(statusQuery, reconcile, { lockTimeoutSeconds: STATUS_LOCK_TIMEOUT_SECONDS }),
    renderHtml: over.statusHtml ?? null,
    registry: metrics.registry,
  });
  // The loop also releases the node's leaks in the pools of its CNI configurations and in the
  // learned ones (docs/cluster.md "Multus"), with etcd clients of its own (docs/cluster.md
  // "Reconcile per node"), closed with the loop.
  const loopPart = reconcileLoopPart(
    { reconcile, metrics, pools: cniPoolTargets(options.cniConfDir, process.env, undefined, () => learned.entries().map((p) => ({ file: p.file, ipam: p.conf, name: p.conf.name }))), ...(over.releaseCap === undefined ? {} : { releaseCap: over.releaseCap }) },
    over.onLoop,
  );
  // CNI GC through the daemon is counted per pool (ipwarden_pool_releases_total{reason="gc"}).
  const poolHooks: PoolHooks = {
    add: (conf, req, signal) => pools.add(conf, req, signal),
    del: (id, req) => pools.del(id, req),
    find: (conf, req) => pools.find(conf, req),
    gc: async (id, valid) => {
      const r = await pools.gc(id, valid);
      metrics.recordPoolGc((id.pool as PoolConfig).name, r.released.length);
      return r;
    },
  };
  return {
    log,
    parts: [poolPart, indexPart, kernel.part, metricsPart, installPart, loopPart],
    openStore: (o) => indexes.openStore(o),
    heal: criHealFactoryFor(daemonNodeEndpoint(options, process.env)),
    pool: poolHooks,
    learnPool: learned.learner(pools),
    kernel: kernel.hooks,
    forgetNetwork: (dataDir, network) => indexes.forget(dataDir, network),
    onServer: (s) => {
      server = s;
    },
    onState: (s) => {
      // A stop after a failure keeps saying why the daemon is not ready.
      if (!(state === 'failed' && s === 'stopping')) state = s;
    },
  };
}

/**
 * The daemon's {@link NodeEndpointSource}: the runtime endpoint the node was configured with —
 * `--runtime-endpoint`, else `CONTAINER_RUNTIME_ENDPOINT` of the daemon's environment (the
 * DaemonSet sets both) — for a request whose shim's ancestry finds no runtime (a Multus thick
 * daemon ran it). Never a guessed default socket: without either, none (`() => null`). The value
 * was validated by the flag parser; a malformed environment value is none too.
 */
export function daemonNodeEndpoint(options: Pick<DaemonOptions, 'runtimeEndpoint'>, env: Readonly<Record<string, string | undefined>>): NodeEndpointSource {
  const fromEnv = env['CONTAINER_RUNTIME_ENDPOINT'];
  const [value, source] =
    options.runtimeEndpoint !== null ? [options.runtimeEndpoint, "the daemon's --runtime-endpoint"] : fromEnv !== undefined && fromEnv !== '' ? [fromEnv, "the daemon's CONTAINER_RUNTIME_ENDPOINT"] : [null, ''];
  if (value === null) return () => null;
  let ep: { url: string; path: string };
  try {
    ep = parseRuntimeEndpoint(value);
  } catch {
    return () => null;
  }
  const node = { url: ep.url, path: ep.path, source };
  return () => node;
}

/**
 * `ipwarden daemon`: run the agent until SIGTERM/SIGINT; resolves to the exit status. `over`:
 * what the layers above hand in (src/cold.ts: the status page renderer, and with `--cni-bin-dir`
 * the installed files to watch).
 */
export function runAgent(options: DaemonOptions, signals: SignalSource = process, over: AgentOverrides = {}): Promise<number> {
  return runDaemon(options, agentDeps(options, over), signals);
}
