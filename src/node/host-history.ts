/**
 * The host names this machine has had (docs/cluster.md "A renamed host", microk8s#4283): a node's
 * identity in a cluster pool is its node name, but each handle records the host name of the
 * process that wrote it, and the daemon judges only handles its own host wrote (two hosts under one
 * node name must not judge each other's pods). After `hostnamectl set-hostname` the node's own
 * handles, written under the old name, were "foreign" forever. The daemon therefore keeps, in its
 * data dir, the host names it has run under on this machine, each with the machine's ID
 * (`/etc/machine-id`, which a rename keeps): the evidence that an earlier host name was this
 * machine's, and not another machine's that happens to serve the same node name.
 *
 * The file `<data dir>/.ipwarden-host-history` holds one JSON line per host name,
 * `{"v":1,"machineId","host","since"}` (`since`: ms since the epoch when first seen; information
 * only). It is appended to (`O_APPEND`, mode 0644) and read only when owned by root (or the
 * daemon's user) and writable by nobody else (src/common/trust.ts): whoever could write it could
 * make the daemon judge another machine's pods. Lines of another machine ID (a copied data dir, a
 * cloned image) and lines that do not parse are ignored.
 */
import { appendFileSync, closeSync, constants, fstatSync, openSync, readFileSync, readSync } from 'node:fs';
import { hostname } from 'node:os';
import { join } from 'node:path';
import { untrustedReason } from '../common/trust.ts';

/** The file's name in the daemon's data dir. */
export const HOST_HISTORY_FILE = '.ipwarden-host-history';

/** At most this many bytes are read (a few hundred renames). */
const MAX_BYTES = 64 * 1024;

/** `/etc/machine-id` (trimmed), or null when it cannot be read or is empty. */
export function readMachineId(path = '/etc/machine-id'): string | null {
  try {
    const id = readFileSync(path, 'utf8').trim();
    return /^[0-9a-f]{32}$/.test(id) ? id : null;
  } catch {
    return null;
  }
}

/** What {@link recordHost} found. */
export interface HostHistory {
  /** The host names this machine had before its current one (oldest first). */
  readonly earlier: readonly string[];
  /** Why the history could not be used (then `earlier` is empty), else null. */
  readonly problem: string | null;
}

/**
 * Record `host` (default: the kernel's host name) for machine `machineId` in `<dataDir>/.ipwarden-host-history`
 * when it is not there yet, and return the machine's earlier host names. Never throws: a machine
 * without an ID, a file not to be trusted or that cannot be read or written gives `earlier: []`
 * and the `problem` (the daemon then judges only its current host's handles, as before).
 */
export function recordHost(dataDir: string, host: string = hostname(), machineId: string | null = readMachineId(), nowMs: number = Date.now(), euid: number = process.geteuid?.() ?? 0): HostHistory {
  if (machineId === null) return { earlier: [], problem: 'no /etc/machine-id: earlier host names of this machine cannot be told' };
  const path = join(dataDir, HOST_HISTORY_FILE);
  let text = '';
  try {
    const fd = openSync(path, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_CREAT, 0o644);
    try {
      const st = fstatSync(fd);
      if (!st.isFile()) return { earlier: [], problem: `${path} is not a regular file` };
      const why = untrustedReason(path, st, euid);
      if (why !== null) return { earlier: [], problem: `${why}: not used` };
      const buf = Buffer.alloc(Math.min(st.size, MAX_BYTES));
      let off = 0;
      while (off < buf.length) {
        const n = readSync(fd, buf, off, buf.length - off, off);
        if (n === 0) break;
        off += n;
      }
      text = buf.subarray(0, off).toString('utf8');
    } finally {
      closeSync(fd);
    }
  } catch (e) {
    return { earlier: [], problem: `${path}: ${e instanceof Error ? e.message : String(e)}` };
  }
  const mine: string[] = [];
  for (const line of text.split('\n')) {
    if (line.trim() === '') continue;
    try {
      const o = JSON.parse(line) as { v?: unknown; machineId?: unknown; host?: unknown };
      if (o.v === 1 && o.machineId === machineId && typeof o.host === 'string' && o.host !== '' && !mine.includes(o.host)) mine.push(o.host);
    } catch {
      // a torn or foreign line: ignored
    }
  }
  if (!mine.includes(host)) {
    try {
      appendFileSync(path, `${JSON.stringify({ v: 1, machineId, host, since: nowMs })}\n`, { mode: 0o644 });
    } catch (e) {
      return { earlier: mine, problem: `${path}: ${e instanceof Error ? e.message : String(e)}` };
    }
  }
  return { earlier: mine.filter((h) => h !== host), problem: null };
}
