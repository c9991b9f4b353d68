/**
 * The options of `ipwarden daemon`, as a plain value. Declared here, below both layers that use
 * it, because the CLI verb (`src/cli/daemon.ts`, which parses the flags into this shape) and the
 * daemon (`src/daemon/daemon.ts`, which runs with it) are peers and must not import each other;
 * `src/cold.ts` joins the two. Types and constants only: no I/O.
 */

/** Default `--socket` (docs/daemon.md: the path compiled into the shim). */
export const DEFAULT_DAEMON_SOCKET = '/run/ipwarden/plugin.sock';
/** Default `--metrics-address`. */
export const DEFAULT_METRICS_ADDRESS = '127.0.0.1:9617';
/** Default `--interval` (Go duration). */
export const DEFAULT_DAEMON_INTERVAL = '1m';
/**
 * Default `--warm-up`: ADD+DEL pairs the daemon sends itself at start on a scratch network
 * (src/daemon/warm-up.ts; docs/benchmarks.md "Warm-up" for the number).
 */
export const DEFAULT_WARM_UP_PAIRS = 2000;
/** Largest `--warm-up`. */
export const MAX_WARM_UP_PAIRS = 100_000;
/** Default `--log-level`. */
export const DEFAULT_LOG_LEVEL = 'info';
/** The `--log-level` values (pino's levels, plus `silent`). */
export const LOG_LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] as const;
/** One of {@link LOG_LEVELS}. */
export type LogLevel = (typeof LOG_LEVELS)[number];
/**
 * Longest socket path, bytes: `sun_path` holds 108 bytes including the terminating NUL
 * (unix(7)); the shim's compiled-in field has the same limit (docs/daemon.md).
 */
export const MAX_SOCKET_PATH_BYTES = 107;

/** A listening address for the metrics endpoint. */
export interface HostPort {
  /** Host name or IP address (an IPv6 address without its brackets). */
  readonly host: string;
  /** TCP port, 0–65535 (0: any free port). */
  readonly port: number;
}

/** Everything `ipwarden daemon` runs with, flags parsed and validated. */
export interface DaemonOptions {
  /** Absolute path of the plugin socket (at most {@link MAX_SOCKET_PATH_BYTES} bytes). */
  readonly socket: string;
  /** Where the Prometheus metrics are served (the metrics come with issue 9's metrics part). */
  readonly metricsAddress: HostPort;
  /**
   * `--health-address`: a listener of its own for `/healthz` and `/readyz` (the kubelet's probes),
   * which connections held on the metrics port cannot starve; absent: the probes are served on
   * the metrics listener only.
   */
  readonly healthAddress?: HostPort;
  /** Reconcile interval, seconds (> 0). */
  readonly intervalSeconds: number;
  /** Log level of the JSON log lines on stderr. */
  readonly logLevel: LogLevel;
  /** host-local data dir holding one directory per network (the leaks flags follow). */
  readonly dataDir: string;
  /** Only this network, or null for every network directory. */
  readonly network: string | null;
  /** `--runtime-endpoint` as given (validated: `unix:///path` or `/path`), or null. */
  readonly runtimeEndpoint: string | null;
  /** Grace period, seconds (≥ 0). */
  readonly graceSeconds: number;
  /** Reconcile policy. */
  readonly policy: 'conservative' | 'reclaim-notready';
  /** CNI configuration directory. */
  readonly cniConfDir: string;
  /** Audit log path, or null for `<dataDir>/.ipwarden-audit.log`. */
  readonly auditLog: string | null;
  /**
   * `--pool-journal-dir`: root of the offline pool allocations' journal (docs/cluster.md
   * "Offline allocation"), absolute; absent: `/var/lib/cni/networks/.ipwarden-pool-offline`.
   */
  readonly poolJournalDir?: string;
  /**
   * `--cni-bin-dir`: the CNI bin directory `install-cni --dest` wrote (the DaemonSet:
   * `/host/opt/cni/bin`, its parent mounted from the host), absolute. The daemon watches the files
   * it installs there and reinstalls them when they vanish or change (docs/daemon.md "Installed
   * files"); absent: not watched.
   */
  readonly cniBinDir?: string;
  /**
   * `--warm-up`: ADD+DEL pairs the daemon sends itself through its socket right after it starts, on
   * a scratch network beside the socket (src/daemon/warm-up.ts), 0–{@link MAX_WARM_UP_PAIRS};
   * 0 turns it off. Absent: {@link DEFAULT_WARM_UP_PAIRS}.
   */
  readonly warmUpPairs?: number;
}
