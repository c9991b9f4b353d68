/**
 * Internal error layer (house style 6): one base `AppError` with a stable string code, like
 * undici's `UND_ERR_*`, plus an `isRetryable` marker like etcd3's `RecoverableError`.
 *
 * Internal code → CNI error code is decided here, once (`cniCodeFor`); the CNI edge
 * (`src/cni/skel.ts`) turns any thrown value into the spec's error object exactly once and maps
 * anything unknown to 999.
 *
 * CNI codes come from the CNI spec §Error (containernetworking/cni:SPEC.md, spec-v1.1.0):
 * 1 incompatible version, 2 unsupported field, 3 unknown container, 4 invalid env vars,
 * 5 I/O failure, 6 decode failure, 7 invalid network config, 11 try again later,
 * 50/51 STATUS not available, 999 internal (libcni `pkg/types/types.go`).
 */

/** Stable internal error codes. Each maps to exactly one CNI code in `CNI_CODE`. */
export type ErrorCode =
  | 'IPAM_INCOMPATIBLE_VERSION'
  | 'IPAM_UNSUPPORTED_FIELD'
  | 'IPAM_UNKNOWN_CONTAINER'
  | 'IPAM_INVALID_ENV'
  | 'IPAM_IO'
  | 'IPAM_DECODE'
  | 'IPAM_INVALID_CONFIG'
  | 'IPAM_INVALID_ARGS'
  | 'IPAM_RANGE_EXHAUSTED'
  | 'IPAM_DUPLICATE_ALLOCATION'
  | 'IPAM_REQUESTED_IP_UNAVAILABLE'
  | 'IPAM_NOT_FOUND'
  | 'IPAM_NOT_AVAILABLE'
  | 'STORE_LOCK_TIMEOUT'
  | 'STORE_CORRUPT'
  | 'STORE_IO'
  | 'STORE_UNAVAILABLE'
  | 'STORE_CONFLICT'
  | 'RUNTIME_UNAVAILABLE'
  | 'RUNTIME_PERMISSION_DENIED'
  | 'RUNTIME_NOT_CRI'
  | 'RUNTIME_UNSUPPORTED_API'
  | 'RUNTIME_CALL_FAILED'
  | 'CLOSED'
  | 'USAGE'
  | 'INTERNAL';

/** Internal code → CNI spec error code (SPEC.md §Error, well-known codes table). */
export const CNI_CODE: Readonly<Record<ErrorCode, number>> = {
  IPAM_INCOMPATIBLE_VERSION: 1,
  IPAM_UNSUPPORTED_FIELD: 2,
  IPAM_UNKNOWN_CONTAINER: 3,
  IPAM_INVALID_ENV: 4,
  IPAM_IO: 5,
  IPAM_DECODE: 6,
  IPAM_INVALID_CONFIG: 7,
  // CNI_ARGS problems are a bad invocation: the spec's code for invalid env vars.
  IPAM_INVALID_ARGS: 4,
  // host-local returns plain Go errors for these, which skel emits as 999 (anchors §1.7);
  // we keep 999 so runtimes and alerts see what they saw from host-local.
  IPAM_RANGE_EXHAUSTED: 999,
  IPAM_DUPLICATE_ALLOCATION: 999,
  IPAM_REQUESTED_IP_UNAVAILABLE: 999,
  IPAM_NOT_FOUND: 999,
  IPAM_NOT_AVAILABLE: 50,
  STORE_LOCK_TIMEOUT: 11,
  STORE_CORRUPT: 999,
  STORE_IO: 5,
  // etcd (cluster pools): the cluster cannot be reached or has no leader, or a compare-and-swap
  // kept losing to other writers; the same request may succeed later (SPEC.md: 11 try again later).
  STORE_UNAVAILABLE: 11,
  STORE_CONFLICT: 11,
  RUNTIME_UNAVAILABLE: 11,
  RUNTIME_PERMISSION_DENIED: 999,
  RUNTIME_NOT_CRI: 999,
  RUNTIME_UNSUPPORTED_API: 999,
  RUNTIME_CALL_FAILED: 999,
  CLOSED: 999,
  USAGE: 999,
  INTERNAL: 999,
};

/** Options accepted by {@link AppError}. */
export interface AppErrorOptions {
  /** Extra human-readable context; becomes the CNI error's `details`. */
  details?: string;
  /** True when the same call may succeed later without any change (lock busy, runtime down). */
  retryable?: boolean;
  /** The foreign error this one was converted from. */
  cause?: unknown;
}

/**
 * Brand of every {@link AppError}: a registered symbol, so it is the same in every bundle. The
 * plugin's cold part (CLI, CRI client, self-healing; `src/cold.ts`) is bundled on its own and
 * carries its own copy of this module, hence its own `AppError` class: an error it throws is not
 * `instanceof` the hot bundle's class. The brand is what identifies one (`isAppError`).
 */
const APP_ERROR_BRAND = Symbol.for('ipwarden.AppError');

/**
 * Base class of every error ipwarden throws on purpose.
 *
 * `code` is stable and documented in docs/errors.md; `message` is the exact text a user sees
 * (for host-local parity cases it is host-local's text, byte for byte).
 *
 * `e instanceof AppError` is true for an AppError of any bundle (the check is the brand, see
 * {@link isAppError}); for the subclasses `instanceof` keeps its ordinary meaning.
 */
export class AppError extends Error {
  static {
    Object.defineProperty(AppError.prototype, APP_ERROR_BRAND, { value: true });
  }

  /** Brand check for `AppError` itself; the prototype chain for subclasses. */
  static [Symbol.hasInstance](v: unknown): boolean {
    if (this !== AppError) return Function.prototype[Symbol.hasInstance].call(this, v);
    return typeof v === 'object' && v !== null && (v as { [APP_ERROR_BRAND]?: unknown })[APP_ERROR_BRAND] === true;
  }

  readonly code: ErrorCode;
  readonly details: string | undefined;
  readonly isRetryable: boolean;

  constructor(code: ErrorCode, message: string, opts: AppErrorOptions = {}) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.name = 'AppError';
    this.code = code;
    this.details = opts.details;
    this.isRetryable = opts.retryable ?? (code === 'STORE_LOCK_TIMEOUT' || code === 'STORE_UNAVAILABLE' || code === 'STORE_CONFLICT');
  }

  /** The CNI spec code this error is reported with. */
  get cniCode(): number {
    return CNI_CODE[this.code];
  }
}

/** A user mistake on the command line: printed without a stack, exit status 2. */
export class UsageError extends AppError {
  constructor(message: string) {
    super('USAGE', message);
    this.name = 'UsageError';
  }
}

/** Thrown when a long-lived object (store, CRI client, reconciler) is used after close(). */
export class ClosedError extends AppError {
  constructor(what: string) {
    super('CLOSED', `${what} is closed`);
    this.name = 'ClosedError';
  }
}

/**
 * True when `e` is an {@link AppError} (of this bundle or another one: the brand decides) with
 * the given code.
 */
export function isAppError(e: unknown, code?: ErrorCode): e is AppError {
  return e instanceof AppError && (code === undefined || e.code === code);
}

/** Node's `err.code` of a system error (`ENOENT`, `EEXIST`, ...), or undefined. */
export function errnoCode(e: unknown): string | undefined {
  if (typeof e === 'object' && e !== null && 'code' in e) {
    const c = (e as { code: unknown }).code;
    return typeof c === 'string' ? c : undefined;
  }
  return undefined;
}
