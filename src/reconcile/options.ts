/**
 * The reconciler's options: defaults, the flag texts (`--grace 5m`, `--policy …`) turned into
 * values, and the injected I/O every phase takes. Shared by the CLI verbs (`leaks`, `gc`,
 * `status`, `doctor`) and the daemon, which may not import each other.
 *
 * Parsing errors are `UsageError`s naming the flag (`--grace: …`), exit status 2 in the CLI.
 */
import { AppError, UsageError } from '../common/errors.ts';
import { parseDuration } from '../common/duration.ts';
import { DEFAULT_CNI_CONF_DIR, DEFAULT_DATA_DIR } from '../common/names.ts';
import type { Store } from '../store/store.ts';
import type { EvidenceReader } from './evidence.ts';
import { POLICIES, type Policy } from './plan.ts';
import type { SandboxSourceFactory } from './sandboxes.ts';

export { DEFAULT_CNI_CONF_DIR, DEFAULT_DATA_DIR };
/** Default `--grace` (Go duration). */
export const DEFAULT_GRACE = '5m';
/** Default `--policy`. */
export const DEFAULT_POLICY: Policy = 'conservative';
/** PodSandboxStatus calls in flight at once (one per READY sandbox; 110 on a busy node). */
export const POD_IP_CONCURRENCY = 16;

/**
 * The I/O the phases use, injected (house style 13): the CLI passes its context, the daemon its
 * own, tests fakes. Only `env` and `now` are required; every other part has a real default.
 */
export interface ReconcileDeps {
  /** Environment variables (`CONTAINER_RUNTIME_ENDPOINT`). */
  readonly env: Readonly<Record<string, string | undefined>>;
  /** Current time, milliseconds since the Unix epoch (injected so tests control ages). */
  now(): number;
  /**
   * Builds the runtime's sandbox list source from the resolved endpoint URL (`unix:///path`).
   * Default: the CRI client (`cri-source.ts`, loaded only when used).
   */
  readonly sandboxSource?: SandboxSourceFactory;
  /**
   * Reads the kernel evidence (addresses configured in the node's network namespaces, CNI
   * operations in flight). Default `readKernelEvidence()` of `src/node/kernel-evidence.ts`; the
   * daemon passes `readKernelEvidenceAsync()` (its event loop keeps serving the plugin socket).
   */
  readonly evidence?: EvidenceReader;
  /** Socket probe for the other default runtime endpoints (default `existsSync`). */
  readonly socketExists?: (path: string) => boolean;
  /**
   * Opens the store of network `network` under `dataDir` (not created when missing). Default
   * the host-local compatible file store (`openFileStore`).
   */
  readonly openStore?: (dataDir: string, network: string) => Promise<Store>;
}

/**
 * `leaks`/`gc` options as flags give them (text; commander's shape). Every field may be absent;
 * {@link parseReconcileOptions} applies the defaults.
 */
export interface RawReconcileOptions {
  dataDir?: string;
  network?: string;
  runtimeEndpoint?: string;
  /** Go duration, e.g. `5m`. */
  grace?: string;
  /** `conservative` (default) or `reclaim-notready` (field report BR-22). */
  policy?: string;
  /** CNI configuration directory, read for the networks' ranges only when a live address is unreserved. */
  cniConfDir?: string;
  json?: boolean;
  /** gc only. */
  dryRun?: boolean;
  /** gc only: audit log path (default `<dataDir>/.ipwarden-audit.log`). */
  auditLog?: string;
}

/** Parsed options of a `leaks`/`gc` run ({@link parseReconcileOptions}). */
export interface ReconcileOptions {
  /**
   * `--data-dir` as given (non-empty), or absent. Given, it is the one data directory read (it
   * replaces the configurations' `dataDir`s, as for `status`); absent, the data directories are
   * those `status` reads (`reconcileScope` of `status.ts`).
   */
  readonly dataDir?: string;
  /** Only this network (a valid CNI name is checked when its directory is looked up). */
  readonly network?: string;
  /** As given; resolved by the snapshot (flag, then `CONTAINER_RUNTIME_ENDPOINT`, then defaults). */
  readonly runtimeEndpoint?: string;
  /** Grace period, seconds (≥ 0). */
  readonly graceSeconds: number;
  readonly policy: Policy;
  /** Non-empty. */
  readonly cniConfDir: string;
  /** gc only: release nothing. */
  readonly dryRun?: boolean;
  /** gc only: audit log path (default `<dataDir>/.ipwarden-audit.log` of each data directory). */
  readonly auditLog?: string;
}

/** `--grace` as seconds; UsageError for a malformed or negative Go duration. */
export function parseGrace(text: string): number {
  let s: number;
  try {
    s = parseDuration(text);
  } catch (e) {
    const why = e instanceof AppError && e.details !== undefined ? ` (${e.details})` : '';
    throw new UsageError(`--grace: invalid duration ${JSON.stringify(text)}${why}`);
  }
  if (s < 0) throw new UsageError(`--grace: must not be negative, got ${JSON.stringify(text)}`);
  return s;
}

/** `--policy`; UsageError for anything but `conservative` and `reclaim-notready`. */
export function parsePolicy(text: string): Policy {
  const p = POLICIES.find((x) => x === text);
  if (p === undefined) throw new UsageError(`--policy: must be ${POLICIES.join(' or ')}, got ${JSON.stringify(text)}`);
  return p;
}

/**
 * Flags → {@link ReconcileOptions}, defaults applied (`--data-dir` has none: see
 * {@link ReconcileOptions.dataDir}), checked in this order: `--data-dir` not empty, `--grace`, `--policy`, `--cni-conf-dir` not empty. Throws `UsageError`.
 * The result's `policy` is `conservative` when the raw one is absent or `conservative`.
 */
export function parseReconcileOptions(raw: RawReconcileOptions): ReconcileOptions {
  if (raw.dataDir === '') throw new UsageError('--data-dir must not be empty');
  const graceSeconds = parseGrace(raw.grace ?? DEFAULT_GRACE);
  const policy = parsePolicy(raw.policy ?? DEFAULT_POLICY);
  const cniConfDir = raw.cniConfDir ?? DEFAULT_CNI_CONF_DIR;
  if (cniConfDir === '') throw new UsageError('--cni-conf-dir must not be empty');
  return {
    ...(raw.dataDir === undefined ? {} : { dataDir: raw.dataDir }),
    graceSeconds,
    policy,
    cniConfDir,
    ...(raw.network === undefined ? {} : { network: raw.network }),
    ...(raw.runtimeEndpoint === undefined ? {} : { runtimeEndpoint: raw.runtimeEndpoint }),
    ...(raw.dryRun === undefined ? {} : { dryRun: raw.dryRun }),
    ...(raw.auditLog === undefined ? {} : { auditLog: raw.auditLog }),
  };
}

/** A message for diagnostics: an `AppError`'s message with its details in parentheses. */
export function describeError(e: unknown): string {
  if (e instanceof AppError) return e.details === undefined ? e.message : `${e.message} (${e.details})`;
  return e instanceof Error ? e.message : String(e);
}
