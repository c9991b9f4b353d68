/**
 * The interop suites' check of the reservation files in a network directory, made where it is
 * meaningful: under the same flock(2) on `DIR/lock` every writer (ipwarden and upstream
 * host-local) holds while writing. Upstream host-local creates a reservation file and writes the
 * container ID into it in two steps, both under that lock; a reader without the lock can see the
 * file empty in between — host-local's known window, not a defect of either plugin — and would
 * report it (issue 8.8).
 */
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { lockExclusive } from '../../src/store/file/flock.ts';

/**
 * Take `<dir>/lock` (waiting up to `lockTimeoutSeconds`), read every IPv4-named file and return
 * one message per file whose content does not match `pattern` (`malformed file <ip>: "<content>"`);
 * release the lock. A missing directory has no files.
 */
export async function checkReservationFiles(dir: string, pattern: RegExp, lockTimeoutSeconds = 60): Promise<string[]> {
  if (!existsSync(dir)) return [];
  const held = await lockExclusive(join(dir, 'lock'), lockTimeoutSeconds);
  try {
    const out: string[] = [];
    for (const name of readdirSync(dir)) {
      if (!/^\d+\.\d+\.\d+\.\d+$/.test(name)) continue;
      let content: string;
      try {
        content = readFileSync(join(dir, name), 'utf8');
      } catch {
        continue; // released meanwhile (a writer that ignores the lock would be caught elsewhere)
      }
      if (!pattern.test(content)) out.push(`malformed file ${name}: ${JSON.stringify(content)}`);
    }
    return out;
  } finally {
    held.release();
  }
}
