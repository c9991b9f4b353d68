/**
 * The reconciler's audit log (ARCHITECTURE.md "Reconciler safety rules": every release is
 * recorded). One JSON object per line, appended; default file `<dataDir>/ipwarden-audit.log`
 * (the data dir root, never inside a network directory, where host-local would read it as a
 * non-reservation entry).
 */
import { closeSync, fsyncSync, openSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { AppError, ClosedError } from '../common/errors.ts';
import type { AnyVerdict } from './plan.ts';

/** File name of the default audit log in the data dir root. */
export const AUDIT_LOG_NAME = 'ipwarden-audit.log';

/** Mode the audit log is created with (it names container IDs). */
export const AUDIT_LOG_MODE = 0o600;

/** Default audit log path for a data dir. */
export function defaultAuditLogPath(dataDir: string): string {
  return join(dataDir, AUDIT_LOG_NAME);
}

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
}

/** Where audit records go. `append` throws `AppError('STORE_IO')` when the record cannot be written. */
export interface AuditSink {
  append(rec: AuditRecord): void;
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
  };
  return `${JSON.stringify(o)}\n`;
}

/**
 * Open (creating with mode 0600) `path` for appending. Opening happens now, so a caller can
 * refuse to release anything when the log cannot be written. Each record is one `write(2)` on an
 * O_APPEND descriptor, so concurrent writers do not interleave within a line.
 * Throws `AppError('STORE_IO')` when the file cannot be opened; `append` after `close` throws
 * `ClosedError`.
 */
export function openAuditLog(path: string): AuditSink {
  let fd: number | null;
  try {
    fd = openSync(path, 'a', AUDIT_LOG_MODE);
  } catch (e) {
    throw new AppError('STORE_IO', `cannot open the audit log ${path}: ${e instanceof Error ? e.message : String(e)}`, { cause: e });
  }
  return {
    append(rec) {
      if (fd === null) throw new ClosedError(`audit log ${path}`);
      const data = Buffer.from(formatAuditLine(rec), 'utf8');
      try {
        const n = writeSync(fd, data, 0, data.length, null);
        if (n !== data.length) throw new Error(`short write (${n} of ${data.length} bytes)`);
      } catch (e) {
        throw new AppError('STORE_IO', `cannot write the audit log ${path}: ${e instanceof Error ? e.message : String(e)}`, { cause: e });
      }
    },
    close() {
      if (fd === null) return;
      const f = fd;
      fd = null;
      try {
        fsyncSync(f);
      } catch {
        // the lines were written; durability across a crash is best effort
      }
      closeSync(f);
    },
  };
}

/** An in-memory sink (tests, dry runs). */
export function memoryAuditSink(): AuditSink & { readonly records: AuditRecord[] } {
  const records: AuditRecord[] = [];
  return { records, append: (r) => void records.push(r), close: () => undefined };
}
