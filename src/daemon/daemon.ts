/**
 * `ipwarden daemon`'s lifecycle (issue 9, docs/daemon.md): the plugin server on the unix socket
 * plus the parts composed around it (the reconcile loop and the metrics endpoint plug in as
 * {@link DaemonPart}s), structured JSON logs on stderr, and SIGTERM/SIGINT → a clean stop.
 *
 * Start order: the logger, the socket's lock (`<socket>.lock`, held until the daemon has stopped:
 * one daemon per socket) and the check of the socket path, then each part (so its hooks exist),
 * then the plugin server (with every part's hooks fanned in). Stop order: the plugin server first
 * (stop accepting, finish and answer what is in flight, remove the socket file), then the parts in
 * reverse order, then the lock is released and the log is flushed. {@link Daemon.close} is idempotent.
 */
import type { KernelAddressHooks } from '../cni/commands.ts';
import type { PoolHooks } from '../cni/pool.ts';
import type { DaemonOptions } from '../common/daemon-options.ts';
import type { Worker } from 'node:worker_threads';
import { randomBytes } from 'node:crypto';
import { basename, dirname } from 'node:path';
import { createLogger, flushLog, type Logger } from './log.ts';
import { removeStaleWarmUpDirs, warmUp, warmUpDirPrefix, WARM_UP_NETWORK, type WarmUpReport } from './warm-up.ts';
import {
  claimSocketPath,
  startPluginServer,
  type SocketLock,
  type HealFactory,
  type PluginServer,
  type PoolLearner,
  type PluginServerHooks,
  type StoreOpener,
} from './plugin-server.ts';

/**
 * A long-lived part of the daemon beside the plugin server (the reconcile loop, the metrics
 * server). `close()` must be idempotent and resolve once the part has stopped.
 */
export interface DaemonPart {
  /** For log lines (`loop`, `metrics`). */
  readonly name: string;
  /** Observers of the plugin server (metrics count requests, drops, malformed requests, reclaims; the loop's heal clock). */
  readonly hooks?: PluginServerHooks;
  close(): Promise<void>;
}

/** Builds one part; may reject (the daemon then does not start, and closes the parts already made). */
export type DaemonPartFactory = (ctx: { readonly options: DaemonOptions; readonly log: Logger }) => DaemonPart | Promise<DaemonPart>;

/** What {@link startDaemon} may be given instead of the production defaults. */
export interface DaemonDeps {
  /** The logger (default: pino at `options.logLevel` on stderr). */
  readonly log?: Logger;
  /** Store opener of the plugin server (default: the host-local compatible file store). */
  readonly openStore?: StoreOpener;
  /** Heal hooks per request (default: over CRI and the kernel, for the request's shim). */
  readonly heal?: HealFactory;
  /** Parts started before the plugin server, closed after it, in reverse order. */
  readonly parts?: readonly DaemonPartFactory[];
  /** Extra observers of the plugin server. */
  readonly hooks?: PluginServerHooks;
  /** Plugin server limits (defaults in plugin-server.ts). */
  readonly maxInFlight?: number;
  readonly maxConnections?: number;
  readonly requestTimeoutSeconds?: number;
  /**
   * Told when the socket listens (`started`), when the stop begins (`stopping`), and when the
   * socket's thread ended while serving (`failed`: a bug; nothing is served any more): readiness.
   */
  readonly onState?: (state: 'started' | 'stopping' | 'failed') => void;
  /** Cluster pool hooks of the plugin server (src/daemon/pool-sessions.ts `PoolSessions`, closed by a part). */
  readonly pool?: PoolHooks;
  /** Told of the network config of every pool ADD and CHECK served (see `PluginServerOptions.learnPool`). */
  readonly learnPool?: PoolLearner;
  /** The kernel address index's ADD hooks (src/daemon/kernel-addresses.ts; its reads are a part). */
  readonly kernel?: KernelAddressHooks;
  /**
   * Drops the index's state of a network directory (`NetworkIndexes.forget`), for the warm-up's
   * scratch network before its directory is removed. Absent: the store opener keeps no state.
   */
  readonly forgetNetwork?: (dataDir: string, network: string) => boolean;
  /** Given the plugin server once it listens (before `onState('started')`): parts that need it late. */
  readonly onServer?: (server: PluginServer) => void;
  /** Given the plugin socket thread's Worker (tests: `PluginServerOptions.onSocketThread`). */
  readonly onSocketThread?: (worker: Worker) => void;
}

/** A running daemon. */
export interface Daemon {
  readonly options: DaemonOptions;
  readonly log: Logger;
  readonly server: PluginServer;
  readonly parts: readonly DaemonPart[];
  /**
   * Resolves (with why) if the plugin socket's thread ended while the daemon served (a bug):
   * nothing is served any more, so {@link runDaemon} stops the daemon with exit status 1 (the
   * DaemonSet restarts it). Never resolves otherwise.
   */
  readonly failed: Promise<string>;
  /**
   * Stop: the plugin server (no new connection; requests in flight finish and are answered; the
   * socket file is removed), then the parts, then flush the log. Idempotent (same promise every
   * call); never rejects (a part failing to close is logged).
   */
  close(): Promise<void>;
}

/** Call every hook of `list` in turn; one that throws is logged and does not stop the others. */
function fanIn(list: readonly PluginServerHooks[], log: Logger): PluginServerHooks {
  const call = <K extends keyof PluginServerHooks>(k: K, e: Parameters<NonNullable<PluginServerHooks[K]>>[0]): void => {
    for (const h of list) {
      try {
        (h[k] as ((x: typeof e) => void) | undefined)?.(e);
      } catch (err) {
        log.error({ hook: k, error: err instanceof Error ? err.message : String(err) }, 'a plugin server hook threw');
      }
    }
  };
  return {
    onRequest: (e) => call('onRequest', e),
    onDropped: (e) => call('onDropped', e),
    onDeclined: (e) => call('onDeclined', e),
    onMalformed: (e) => call('onMalformed', e),
    onReclaim: (e) => call('onReclaim', e),
  };
}

async function closeParts(parts: readonly DaemonPart[], log: Logger): Promise<void> {
  for (const p of [...parts].reverse()) {
    try {
      await p.close();
    } catch (e) {
      log.error({ part: p.name, error: e instanceof Error ? e.message : String(e) }, 'a daemon part failed to close');
    }
  }
}

/**
 * Start the daemon with `options`. Resolves once the plugin socket listens (the log line
 * `daemon started` is written then).
 * @throws `SocketSetupError` (an `AppError`) when the socket cannot be served safely (unsafe
 *   directory, another daemon holding `<socket>.lock`, a non-socket or a live socket at the path);
 *   whatever a part factory throws. Parts already started are closed and the lock released first.
 */
export async function startDaemon(options: DaemonOptions, deps: DaemonDeps = {}): Promise<Daemon> {
  const log = deps.log ?? createLogger(options.logLevel);
  const parts: DaemonPart[] = [];
  // The container IDs of this start's warm-up requests: a random token no shim can know.
  const warmUpIdPrefix = `${WARM_UP_NETWORK}-${randomBytes(8).toString('hex')}-`;
  let server: PluginServer;
  let lock: SocketLock | null = null;
  let fail: (why: string) => void = () => undefined;
  const failed = new Promise<string>((resolve) => (fail = resolve));
  try {
    // The socket first: a daemon that cannot serve it refuses before any part starts (no metrics
    // port opened, no reconcile pass run). Its lock is ours from here until the daemon stopped.
    lock = await claimSocketPath(options.socket);
    for (const f of deps.parts ?? []) parts.push(await f({ options, log }));
    const hooks = [...parts.flatMap((p) => (p.hooks === undefined ? [] : [p.hooks])), ...(deps.hooks === undefined ? [] : [deps.hooks])];
    server = await startPluginServer({
      socketPath: options.socket,
      warmUpIdPrefix,
      log,
      hooks: fanIn(hooks, log),
      ...(deps.openStore === undefined ? {} : { openStore: deps.openStore }),
      ...(deps.heal === undefined ? {} : { heal: deps.heal }),
      ...(deps.pool === undefined ? {} : { pool: deps.pool }),
      ...(deps.learnPool === undefined ? {} : { learnPool: deps.learnPool }),
      ...(deps.kernel === undefined ? {} : { kernel: deps.kernel }),
      ...(deps.onSocketThread === undefined ? {} : { onSocketThread: deps.onSocketThread }),
      ...(deps.maxInFlight === undefined ? {} : { maxInFlight: deps.maxInFlight }),
      ...(deps.maxConnections === undefined ? {} : { maxConnections: deps.maxConnections }),
      ...(deps.requestTimeoutSeconds === undefined ? {} : { requestTimeoutSeconds: deps.requestTimeoutSeconds }),
      socketLock: lock,
      onFailed: (why) => {
        deps.onState?.('failed');
        fail(why);
      },
    });
  } catch (e) {
    await closeParts(parts, log);
    lock?.release();
    log.error({ error: e instanceof Error ? e.message : String(e) }, 'daemon did not start');
    await flushLog(log);
    throw e;
  }
  deps.onServer?.(server);
  const held: SocketLock = lock;
  log.info({ socket: options.socket, dataDir: options.dataDir, parts: parts.map((p) => p.name) }, 'daemon started');
  deps.onState?.('started');
  // The warm-up (src/daemon/warm-up.ts): in the background, giving way to every runtime request.
  const stopWarmUp = new AbortController();
  let warming: Promise<WarmUpReport> | null = null;
  const pairs = options.warmUpPairs ?? 0;
  const scratchParent = dirname(options.socket);
  const dirPrefix = warmUpDirPrefix(basename(options.socket));
  // What a killed daemon's warm-up left, at every start (also with --warm-up 0).
  const stale = removeStaleWarmUpDirs(scratchParent, dirPrefix);
  if (stale > 0) log.info({ dir: scratchParent, removed: stale }, 'removed the scratch directories a stopped daemon\'s warm-up left');
  if (pairs > 0) {
    const srv = server;
    // warmUp never rejects; the catch only keeps a bug in it from ending the process.
    warming = warmUp({ socketPath: options.socket, scratchParent, dirPrefix, idPrefix: warmUpIdPrefix, pairs, runtimeInFlight: () => srv.runtimeInFlight, forget: deps.forgetNetwork ?? (() => true), log, signal: stopWarmUp.signal }).catch((e: unknown) => {
      log.error({ error: e instanceof Error ? e.message : String(e) }, 'warm-up failed');
      return { pairs: 0, seconds: 0, cut: 'failed' };
    });
  }
  let closed: Promise<void> | null = null;
  return {
    options,
    log,
    server,
    parts,
    failed,
    close() {
      closed ??= (async () => {
        log.info({ inFlight: server.runtimeInFlight }, 'daemon stopping');
        deps.onState?.('stopping');
        // The warm-up sends nothing more; the server stops accepting and finishes what is in
        // flight (warm-up requests included), then the warm-up removes its scratch directory.
        stopWarmUp.abort();
        try {
          await server.close();
        } catch (e) {
          log.error({ error: e instanceof Error ? e.message : String(e) }, 'the plugin server failed to close');
        }
        await warming;
        await closeParts(parts, log);
        held.release();
        log.info('daemon stopped');
        await flushLog(log);
      })();
      return closed;
    },
  };
}

/** Where {@link runDaemon} listens for stop signals (the process; tests pass an emitter). */
export interface SignalSource {
  once(signal: 'SIGTERM' | 'SIGINT', listener: (signal: NodeJS.Signals) => void): unknown;
  off(signal: 'SIGTERM' | 'SIGINT', listener: (signal: NodeJS.Signals) => void): unknown;
}

/**
 * Run the daemon until SIGTERM or SIGINT: then close it (requests in flight finish) and resolve
 * to 0, the exit status; or until its plugin socket's thread ended ({@link Daemon.failed}): then
 * close it the same way and resolve to 1. A second signal during the stop is not caught (its default action ends
 * the process). Rejects like {@link startDaemon} when the daemon cannot start.
 */
export async function runDaemon(options: DaemonOptions, deps: DaemonDeps = {}, signals: SignalSource = process): Promise<number> {
  const d = await startDaemon(options, deps);
  return new Promise<number>((resolve) => {
    const stop = (status: number): void => {
      signals.off('SIGTERM', onSignal);
      signals.off('SIGINT', onSignal);
      void d.close().then(() => resolve(status));
    };
    const onSignal = (signal: NodeJS.Signals): void => {
      d.log.info({ signal }, 'signal received');
      stop(0);
    };
    signals.once('SIGTERM', onSignal);
    signals.once('SIGINT', onSignal);
    // The socket's thread ended (logged where it happened): stop, exit status 1.
    void d.failed.then(() => stop(1));
  });
}
