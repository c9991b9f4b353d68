/**
 * `ipwarden daemon` — the resident node agent (issue 9, docs/daemon.md): serves the CNI plugin
 * over a unix socket for the exec shim, and (later parts of issue 9) reconciles every network on
 * an interval and exports Prometheus metrics.
 *
 * Usage:
 *   ipwarden daemon [--interval DUR] [--metrics-address HOST:PORT] [--socket PATH]
 *                   [--log-level LEVEL] [--data-dir DIR] [--network NAME]
 *                   [--runtime-endpoint URL] [--grace DUR] [--policy P] [--cni-conf-dir DIR]
 *                   [--audit-log FILE] [--pool-journal-dir DIR] [--cni-bin-dir DIR]
 *                   [--warm-up PAIRS]
 * Examples:
 *   ipwarden daemon
 *   ipwarden daemon --socket /run/ipwarden/plugin.sock --log-level debug
 *
 * This file only turns flags into a {@link DaemonOptions} value and calls the injected
 * {@link DaemonStarter}: the daemon itself lives in `src/daemon/` (a peer layer, not imported
 * here); `src/cold.ts` supplies the starter. Every flag is validated here, bad values are a
 * {@link UsageError} (exit status 2).
 */
import { AppError, UsageError } from '../common/errors.ts';
import { parseDuration } from '../common/duration.ts';
import {
  DEFAULT_DAEMON_INTERVAL,
  DEFAULT_DAEMON_SOCKET,
  DEFAULT_LOG_LEVEL,
  DEFAULT_METRICS_ADDRESS,
  DEFAULT_WARM_UP_PAIRS,
  MAX_WARM_UP_PAIRS,
  LOG_LEVELS,
  MAX_SOCKET_PATH_BYTES,
  type DaemonOptions,
  type HostPort,
  type LogLevel,
} from '../common/daemon-options.ts';
import { validateNetworkName } from '../ipam/config.ts';
import { DEFAULT_CNI_CONF_DIR, DEFAULT_DATA_DIR, DEFAULT_GRACE, type RawReconcileOptions } from '../reconcile/options.ts';
import { POLICIES } from '../reconcile/plan.ts';
import { parseRuntimeEndpoint } from '../runtime/endpoint.ts';
import type { CliContext } from './context.ts';


/** The flags as commander hands them over (all strings, absent when not given). */
export interface DaemonCommandOptions extends Pick<RawReconcileOptions, 'dataDir' | 'network' | 'runtimeEndpoint' | 'grace' | 'policy' | 'cniConfDir' | 'auditLog'> {
  interval?: string;
  metricsAddress?: string;
  healthAddress?: string;
  socket?: string;
  logLevel?: string;
  poolJournalDir?: string;
  cniBinDir?: string;
  warmUp?: string;
}

/**
 * Runs the daemon with `options` until it is told to stop (SIGTERM, SIGINT); resolves to the exit
 * status (0 after a clean stop). Rejects with an `AppError` when the daemon cannot start (e.g. the
 * socket directory is unsafe); the CLI prints it and exits 1.
 */
export type DaemonStarter = (options: DaemonOptions, ctx: CliContext) => Promise<number>;

/** A Go duration flag as seconds; UsageError when malformed or out of range. */
function durationFlag(flag: string, text: string, positive: boolean): number {
  let s: number;
  try {
    s = parseDuration(text);
  } catch (e) {
    const why = e instanceof AppError && e.details !== undefined ? ` (${e.details})` : '';
    throw new UsageError(`${flag}: invalid duration ${JSON.stringify(text)}${why}`);
  }
  if (positive && !(s > 0)) throw new UsageError(`${flag}: must be positive, got ${JSON.stringify(text)}`);
  if (s < 0) throw new UsageError(`${flag}: must not be negative, got ${JSON.stringify(text)}`);
  return s;
}

/**
 * `HOST:PORT` (`127.0.0.1:9617`, `localhost:9617`, `[::1]:9617`, `0.0.0.0:9617`); port 0–65535.
 * @throws UsageError naming `flag` (default `--metrics-address`) and what is wrong.
 */
export function parseHostPort(text: string, flag = '--metrics-address'): HostPort {
  const bad = (why: string): UsageError => new UsageError(`${flag}: ${why}, got ${JSON.stringify(text)}`);
  let host: string;
  let port: string;
  if (text.startsWith('[')) {
    const close = text.indexOf(']');
    if (close < 0 || text[close + 1] !== ':') throw bad('want HOST:PORT or [IPV6]:PORT');
    host = text.slice(1, close);
    port = text.slice(close + 2);
    if (!/^[0-9a-fA-F:.]+$/.test(host) || !host.includes(':')) throw bad('the bracketed host must be an IPv6 address');
  } else {
    const colon = text.lastIndexOf(':');
    if (colon < 0) throw bad('want HOST:PORT');
    host = text.slice(0, colon);
    port = text.slice(colon + 1);
    if (host.includes(':')) throw bad('an IPv6 host must be in brackets ([::1]:9617)');
    // A host name (RFC 1123 labels) or an IPv4 address.
    if (!/^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$/.test(host)) throw bad('invalid host');
  }
  if (!/^[0-9]{1,5}$/.test(port) || Number(port) > 65535) throw bad('the port must be a number from 0 to 65535');
  return { host, port: Number(port) };
}

/**
 * `--socket`: an absolute path of at most {@link MAX_SOCKET_PATH_BYTES} bytes, without NUL, not
 * ending in `/`, with no `.` or `..` component (the daemon checks the directory it names, so the
 * name must be the path it binds).
 * @throws UsageError
 */
export function parseSocketPath(text: string): string {
  const bad = (why: string): UsageError => new UsageError(`--socket: ${why}, got ${JSON.stringify(text)}`);
  if (!text.startsWith('/')) throw bad('must be an absolute path');
  if (text.includes('\0')) throw bad('must not contain a NUL byte');
  if (text.endsWith('/')) throw bad('must name a file, not a directory');
  if (text.split('/').some((c) => c === '.' || c === '..')) throw bad('must not contain "." or ".." components');
  const n = Buffer.byteLength(text, 'utf8');
  if (n > MAX_SOCKET_PATH_BYTES) throw bad(`is ${n} bytes, the limit is ${MAX_SOCKET_PATH_BYTES} (sun_path)`);
  return text;
}

/** An absolute path flag without "." or ".." components. */
function absoluteFlag(flag: string, text: string): string {
  pathFlag(flag, text);
  if (!text.startsWith('/') || text.split('/').some((c) => c === '.' || c === '..')) throw new UsageError(`${flag} must be an absolute path without "." or ".." components, got ${JSON.stringify(text)}`);
  return text;
}

/** A non-empty path flag. */
function pathFlag(flag: string, text: string): string {
  if (text === '') throw new UsageError(`${flag} must not be empty`);
  if (text.includes('\0')) throw new UsageError(`${flag} must not contain a NUL byte`);
  return text;
}

/**
 * Turn the flags into {@link DaemonOptions}, applying the defaults (ARCHITECTURE.md CLI contract):
 * `--socket /run/ipwarden/plugin.sock`, `--metrics-address 127.0.0.1:9617`, `--interval 1m`,
 * `--log-level info`, `--data-dir /var/lib/cni/networks`, `--grace 5m`, `--policy conservative`,
 * `--cni-conf-dir /etc/cni/net.d`, `--warm-up 2000`. Pure.
 * @throws UsageError for any malformed value (the message names the flag).
 */
export function parseDaemonFlags(opts: DaemonCommandOptions): DaemonOptions {
  const level = opts.logLevel ?? DEFAULT_LOG_LEVEL;
  if (!(LOG_LEVELS as readonly string[]).includes(level)) {
    throw new UsageError(`--log-level: must be one of ${LOG_LEVELS.join(', ')}, got ${JSON.stringify(level)}`);
  }
  const policy = opts.policy ?? 'conservative';
  const p = POLICIES.find((x) => x === policy);
  if (p === undefined) throw new UsageError(`--policy: must be ${POLICIES.join(' or ')}, got ${JSON.stringify(policy)}`);
  let network: string | null = null;
  if (opts.network !== undefined) {
    try {
      validateNetworkName(opts.network);
    } catch {
      throw new UsageError(`--network: invalid network name ${JSON.stringify(opts.network)} (letters, digits, "_", ".", "-"; starting with a letter or digit)`);
    }
    network = opts.network;
  }
  let runtimeEndpoint: string | null = null;
  if (opts.runtimeEndpoint !== undefined) {
    try {
      parseRuntimeEndpoint(opts.runtimeEndpoint);
    } catch (e) {
      throw new UsageError(`--runtime-endpoint: ${e instanceof Error ? e.message : String(e)}`);
    }
    runtimeEndpoint = opts.runtimeEndpoint;
  }
  return {
    socket: parseSocketPath(opts.socket ?? DEFAULT_DAEMON_SOCKET),
    metricsAddress: parseHostPort(opts.metricsAddress ?? DEFAULT_METRICS_ADDRESS),
    ...(opts.healthAddress === undefined ? {} : { healthAddress: parseHostPort(opts.healthAddress, '--health-address') }),
    intervalSeconds: durationFlag('--interval', opts.interval ?? DEFAULT_DAEMON_INTERVAL, true),
    logLevel: level as LogLevel,
    dataDir: pathFlag('--data-dir', opts.dataDir ?? DEFAULT_DATA_DIR),
    network,
    runtimeEndpoint,
    graceSeconds: durationFlag('--grace', opts.grace ?? DEFAULT_GRACE, false),
    policy: p,
    cniConfDir: pathFlag('--cni-conf-dir', opts.cniConfDir ?? DEFAULT_CNI_CONF_DIR),
    auditLog: opts.auditLog === undefined ? null : pathFlag('--audit-log', opts.auditLog),
    ...(opts.poolJournalDir === undefined ? {} : { poolJournalDir: absoluteFlag('--pool-journal-dir', opts.poolJournalDir) }),
    ...(opts.cniBinDir === undefined ? {} : { cniBinDir: absoluteFlag('--cni-bin-dir', opts.cniBinDir).replace(/\/+$/, '') || '/' }),
    warmUpPairs: opts.warmUp === undefined ? DEFAULT_WARM_UP_PAIRS : warmUpFlag(opts.warmUp),
  };
}

/** `--warm-up PAIRS`: a whole number 0–{@link MAX_WARM_UP_PAIRS} (0: no warm-up). @throws UsageError */
export function warmUpFlag(text: string): number {
  if (!/^[0-9]{1,6}$/.test(text) || Number(text) > MAX_WARM_UP_PAIRS) {
    throw new UsageError(`--warm-up: must be a whole number of ADD+DEL pairs from 0 (off) to ${MAX_WARM_UP_PAIRS}, got ${JSON.stringify(text)}`);
  }
  return Number(text);
}

/**
 * Run the verb: parse the flags, then hand over to `start`. Resolves to the exit status.
 * @throws UsageError for bad flags; `AppError` when no starter is wired (a build without the
 *   daemon) or the daemon cannot start.
 */
export async function run(opts: DaemonCommandOptions, ctx: CliContext, start: DaemonStarter | undefined): Promise<number> {
  const options = parseDaemonFlags(opts);
  if (start === undefined) throw new AppError('INTERNAL', 'this build of ipwarden has no daemon');
  return start(options, ctx);
}
