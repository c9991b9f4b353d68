/**
 * The daemon's structured log: one JSON line per decision (request served, request dropped,
 * malformed request, start, stop) on stderr, through `pino` (docs/dependencies.md). Lines are
 * written asynchronously (`sync: false`), so a served request does not wait for its log line;
 * {@link flushLog} writes out what is buffered before the process ends.
 *
 * Line shape (pino's): `{"level":30,"time":<ms since the epoch>,"pid":N,"msg":"…", …fields}`;
 * levels 10 trace, 20 debug, 30 info, 40 warn, 50 error, 60 fatal.
 */
import pino from 'pino';
import type { LogLevel } from '../common/daemon-options.ts';

/** The logger every part of the daemon writes to. */
export type Logger = pino.Logger;

/**
 * A logger at `level` writing to file descriptor `fd` (default 2, stderr) or to `stream` (tests).
 * Never throws for a valid level.
 */
export function createLogger(level: LogLevel, to: { fd?: number; stream?: pino.DestinationStream } = {}): Logger {
  const dest = to.stream ?? pino.destination({ dest: to.fd ?? 2, sync: false });
  return pino({ level, base: { pid: process.pid }, messageKey: 'msg' }, dest);
}

/** Write out buffered lines; resolves when done (never rejects: a lost log line is not fatal). */
export function flushLog(log: Logger): Promise<void> {
  return new Promise((resolve) => {
    try {
      log.flush(() => resolve());
    } catch {
      resolve();
    }
  });
}
