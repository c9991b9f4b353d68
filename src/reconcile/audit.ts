/**
 * The reconciler's audit log (ARCHITECTURE.md "Reconciler safety rules": every release is
 * recorded, before the release, never through a symlink). One JSON object per line, appended;
 * default file `<dataDir>/.ipwarden-audit.log` (the data dir root, never inside a network
 * directory, where host-local would read it as a non-reservation entry). Its name starts with a
 * `.`, which no network name can (libcni `cniValidNameChars`), so no network's directory can take
 * its place (issue 17: a network named `ipwarden-audit.log`, the name before, made the log a
 * directory and every reclaim in that data dir failed). A log at the old name is moved to the new
 * one when the default log is opened ({@link openDefaultAuditLog}).
 *
 * A release is two lines: `phase: "intent"` written and made durable (fsync) BEFORE the file is
 * removed, then `released` (removed) or `kept` (not removed after all: changed meanwhile, or the
 * removal failed). A process killed in between leaves an intent without an outcome: the file is
 * then either gone (released) or still there (not released); either way the decision is on
 * record. Re-reservations and recreated reservations are one `reserved` line each (docs/cli.md).
 *
 * The data dir root may be writable by others than root: the log is opened without following a
 * symlink (`O_NOFOLLOW`), without blocking on a FIFO (`O_NONBLOCK`), and only if it is a regular
 * file with one link; anything else is refused with `STORE_IO`, and then nothing is released.
 */
import { closeSync, constants as fsConstants, fstatSync, fsyncSync, lstatSync, openSync, readSync, renameSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { AppError, ClosedError, errnoCode } from '../common/errors.ts';
import type { AnyVerdict } from './plan.ts';

/**
 * File name of the default audit log in the data dir root. The leading `.` keeps it out of the
 * names a network can have (`CNI_NAME_RE` of src/common/names.ts starts with a letter or digit),
 * as the pool journals' `.ipwarden-pool-offline` beside it.
 */
export const AUDIT_LOG_NAME = '.ipwarden-audit.log';

/**
 * The default name up to issue 17, a valid network name as well. A regular file of that name is
 * moved to {@link AUDIT_LOG_NAME} by {@link openDefaultAuditLog}; a directory of that name is a
 * network's and is left alone.
 */
export const LEGACY_AUDIT_LOG_NAME = 'ipwarden-audit.log';

/** Mode the audit log is created with (it names container IDs). */
export const AUDIT_LOG_MODE = 0o600;

/** Default audit log path for a data dir: `<dataDir>/.ipwarden-audit.log`. */
export function defaultAuditLogPath(dataDir: string): string {
  return join(dataDir, AUDIT_LOG_NAME);
}

/**
 * Move the log at the old default name (`<dataDir>/ipwarden-audit.log`) to the new one, when it
 * is a regular file with one link (a symlink, a directory — a network named so — or anything
 * else stays where it is) and nothing is at the new name yet. `rename(2)` in one directory: a
 * writer that opened the old name keeps writing to the same file. Returns true when it moved the
 * file; false when there was nothing to move or the move failed (another process moved it first,
 * or a read-only data dir: opening the log reports that). Never throws.
 */
export function migrateLegacyAuditLog(dataDir: string): boolean {
  const legacy = join(dataDir, LEGACY_AUDIT_LOG_NAME);
  const target = defaultAuditLogPath(dataDir);
  try {
    const st = lstatSync(legacy);
    if (!st.isFile() || st.nlink !== 1) return false;
  } catch {
    return false;
  }
  try {
    lstatSync(target);
    return false; // both: an older ipwarden still writes the old name; never overwrite the new log
  } catch (e) {
    if (errnoCode(e) !== 'ENOENT') return false;
  }
  try {
    renameSync(legacy, target);
    return true;
  } catch {
    return false;
  }
}

/**
 * The default audit log of `dataDir`: {@link migrateLegacyAuditLog}, then
 * {@link openAuditLog}(`<dataDir>/.ipwarden-audit.log`). Throws what `openAuditLog` throws.
 */
export function openDefaultAuditLog(dataDir: string): AuditSink {
  migrateLegacyAuditLog(dataDir);
  return openAuditLog(defaultAuditLogPath(dataDir));
}

/**
 * What a line records: `intent` — about to remove the file (durable before the removal);
 * `released` — removed; `kept` — not removed after all (`reason` says why); `reserved` — a
 * reservation was (re-)created for a live sandbox.
 */
export type AuditPhase = 'intent' | 'released' | 'kept' | 'reserved';

/** One audit line. Field order is the order written. */
export interface AuditRecord {
  /** When the file was removed, ISO 8601 UTC with milliseconds. */
  readonly time: string;
  readonly network: string;
  readonly ip: string;
  /** Owner's container ID; null for a corrupt record. */
  readonly containerId: string | null;
  /** Owner's interface; null for a corrupt or legacy ID-only record. */
  readonly ifname: string | null;
  /** Age of the file at the runtime snapshot, seconds. */
  readonly ageSeconds: number;
  /** The verdict released (`live` for a re-reservation, whose reason starts with `re-reserved:`). */
  readonly verdict: AnyVerdict;
  readonly reason: string;
  readonly phase: AuditPhase;
  /** Cluster pools only (src/reconcile/pool-pass.ts): the pool's name. Absent for node-local records. */
  readonly pool?: string;
  /** Cluster pools only: the handle's etcd `mod_revision` the release compared (decimal text). */
  readonly revision?: string;
  /** Automatic node removal only (`ipam.pool.reclaimAfter`): the node removed, whose handle this was. */
  readonly node?: string;
  /** Automatic node removal only: the node whose daemon removed it (who). */
  readonly by?: string;
  /** Automatic node removal only: the block (CIDR) the address was in. */
  readonly block?: string;
}

/** Where audit records go. `append` throws `AppError('STORE_IO')` when the record cannot be written. */
export interface AuditSink {
  /** Write one line (not yet durable: see {@link sync}). */
  append(rec: AuditRecord): void;
  /**
   * Make every line appended so far durable (fsync). Called after the intent lines and before the
   * first removal. Throws `AppError('STORE_IO')` when it cannot.
   */
  sync(): void;
  /**
   * Make sure the log can be written before anything is released (a lazily opened sink opens it
   * now). Throws `AppError('STORE_IO')` when it cannot. Optional: an eagerly opened sink has
   * nothing to do.
   */
  open?(): void;
  /** Flush (fsync) and close. Idempotent. */
  close(): void;
}

/** The one-line JSON text of a record, with a trailing newline. */
export function formatAuditLine(rec: AuditRecord): string {
  const o: AuditRecord = {
    time: rec.time,
    network: rec.network,
    ip: rec.ip,
    containerId: rec.containerId,
    ifname: rec.ifname,
    ageSeconds: rec.ageSeconds,
    verdict: rec.verdict,
    reason: rec.reason,
    phase: rec.phase,
    // Cluster pools add where the record lives in etcd (after the node-local fields, so those lines are unchanged).
    ...(rec.pool === undefined ? {} : { pool: rec.pool }),
    ...(rec.revision === undefined ? {} : { revision: rec.revision }),
    ...(rec.node === undefined ? {} : { node: rec.node }),
    ...(rec.by === undefined ? {} : { by: rec.by }),
    ...(rec.block === undefined ? {} : { block: rec.block }),
  };
  return `${JSON.stringify(o)}\n`;
}

/**
 * Flags of the audit log's open(2): append, create, never follow a symlink, never block (read
 * access only to look at the last byte).
 */
const AUDIT_OPEN_FLAGS =
  fsConstants.O_RDWR | fsConstants.O_APPEND | fsConstants.O_CREAT | fsConstants.O_NOFOLLOW | fsConstants.O_NONBLOCK;

/** What is at `path` instead of a regular file, for the refusal message (lstat: links not followed). */
function whatIsThere(path: string): string | null {
  try {
    const st = lstatSync(path);
    if (st.isSymbolicLink()) return 'it is a symbolic link (not followed)';
    if (st.isFIFO()) return 'it is a FIFO, not a regular file';
    if (st.isSocket()) return 'it is a socket, not a regular file';
    if (st.isDirectory()) return 'it is a directory, not a regular file';
    if (st.isCharacterDevice() || st.isBlockDevice()) return 'it is a device, not a regular file';
    return null;
  } catch {
    return null;
  }
}

/**
 * Open (creating with mode 0600) `path` for appending. Opening happens now, so a caller can
 * refuse to release anything when the log cannot be written. The path must be a regular file
 * with a single link (or not exist): a symlink is not followed, a FIFO, socket, device or
 * directory is refused without blocking, and so is a file with other hard links. When the file
 * ends with a torn line (a writer killed mid-line), a newline is added first so the next record
 * starts on its own line. Each record is one `write(2)` on an O_APPEND descriptor, so concurrent
 * writers do not interleave within a line.
 * Throws `AppError('STORE_IO', 'cannot open the audit log <path>: <why>')`; `append` and `sync`
 * after `close` throw `ClosedError`.
 */
export function openAuditLog(path: string): AuditSink {
  const refuse = (why: string, cause?: unknown): AppError =>
    new AppError('STORE_IO', `cannot open the audit log ${path}: ${why}`, cause === undefined ? {} : { cause });
  let fd: number | null;
  try {
    fd = openSync(path, AUDIT_OPEN_FLAGS, AUDIT_LOG_MODE);
  } catch (e) {
    const code = errnoCode(e);
    const what = code === 'ELOOP' || code === 'ENXIO' || code === 'EISDIR' || code === 'EWOULDBLOCK' ? whatIsThere(path) : null;
    throw refuse(what ?? (e instanceof Error ? e.message : String(e)), e);
  }
  try {
    const st = fstatSync(fd);
    if (!st.isFile()) throw refuse(whatIsThere(path) ?? 'it is not a regular file');
    if (st.nlink !== 1) throw refuse(`it has ${st.nlink} hard links (refusing to write through one)`);
    if (st.size > 0) {
      const last = Buffer.alloc(1);
      readSync(fd, last, 0, 1, st.size - 1);
      if (last[0] !== 0x0a) writeSync(fd, '\n');
    }
  } catch (e) {
    closeSync(fd);
    throw e instanceof AppError ? e : refuse(e instanceof Error ? e.message : String(e), e);
  }
  const fail = (what: string, e: unknown): AppError =>
    new AppError('STORE_IO', `cannot ${what} the audit log ${path}: ${e instanceof Error ? e.message : String(e)}`, { cause: e });
  return {
    append(rec) {
      if (fd === null) throw new ClosedError(`audit log ${path}`);
      const data = Buffer.from(formatAuditLine(rec), 'utf8');
      try {
        const n = writeSync(fd, data, 0, data.length, null);
        if (n !== data.length) throw new Error(`short write (${n} of ${data.length} bytes)`);
      } catch (e) {
        throw fail('write', e);
      }
    },
    sync() {
      if (fd === null) throw new ClosedError(`audit log ${path}`);
      try {
        fsyncSync(fd);
      } catch (e) {
        throw fail('sync', e);
      }
    },
    close() {
      if (fd === null) return;
      const f = fd;
      fd = null;
      try {
        fsyncSync(f);
      } catch {
        // the intent lines were synced before any removal; the outcome lines are best effort
      }
      closeSync(f);
    },
  };
}

/**
 * An in-memory sink (tests, dry runs). `durable` is how many of `records` a `sync()` has covered:
 * what would survive a crash of the machine at this instant.
 */
export function memoryAuditSink(): AuditSink & { readonly records: AuditRecord[]; readonly durable: number } {
  const records: AuditRecord[] = [];
  let durable = 0;
  return {
    records,
    get durable() {
      return durable;
    },
    append: (r) => void records.push(r),
    sync: () => {
      durable = records.length;
    },
    close: () => {
      durable = records.length;
    },
  };
}
