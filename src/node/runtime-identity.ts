/**
 * Which container runtime exec'd this plugin, found from the process ancestry instead of guessed
 * from a default socket path.
 *
 * A runtime execs the main CNI plugin (containerd through go-cni, CRI-O through ocicni), which
 * execs the IPAM plugin; so the first ancestor that listens on a unix socket is the runtime, and
 * its listening sockets are the candidates for its CRI endpoint. The walk follows `/proc/<pid>/stat`
 * field 4 (ppid) and stops before pid 1 and at pid 2 (kthreadd): systemd holds many sockets and is
 * never the runtime. Listening sockets are `/proc/<anc>/fd/*` links `socket:[INODE]` joined with the
 * rows of `/proc/<anc>/net/unix` (the ancestor's network namespace) whose Flags has `__SO_ACCEPTCON`
 * (`00010000`, listening) and that have a filesystem path (abstract `@…` names are skipped).
 *
 * Measured on containerd 1.6 (Debian 12): it listens on `<address>`, `<address>.ttrpc` and, when
 * configured, its `[debug]` socket; only the first serves CRI.
 */
import { readdirSync, readFileSync, readlinkSync } from 'node:fs';
import { basename, join } from 'node:path';
import { errnoCode } from '../common/errors.ts';

/** The runtime found (or not) in this process's ancestry. */
export interface RuntimeIdentity {
  /**
   * Absolute paths of the stream unix sockets the ancestor listens on, best first: known CRI socket
   * names (`containerd.sock`, `crio.sock`, `cri-dockerd.sock`, `dockershim.sock`) first, then the
   * rest in the order of `/proc/<anc>/net/unix`. Excluded: `*.ttrpc` (containerd's ttrpc API for
   * shims, not gRPC) and `debug.sock` (containerd's pprof/expvar HTTP socket). [] when none.
   */
  readonly candidates: readonly string[];
  /**
   * The first ancestor (below pid 1) with a listening unix socket; null when none. `comm` is its
   * name as {@link processName} gives it (never a `memfd:` name).
   */
  readonly ancestor: { readonly pid: number; readonly comm: string } | null;
  /** One line: how it was found, or why nothing was found. */
  readonly reason: string;
}

/** Options of {@link identifyRuntime}. */
export interface IdentifyRuntimeOptions {
  /** procfs root; default `/proc`. */
  procDir?: string;
  /** Whose ancestry to walk; default `process.pid` (the walk starts at its parent). */
  pid?: number;
}

/** Fields of one `/proc/<pid>/stat` line (proc(5)). */
export interface ProcStat {
  /** Field 1. */
  readonly pid: number;
  /** Field 2 without the parentheses; may itself contain spaces and `)`. */
  readonly comm: string;
  /** Field 3, one letter (`S`, `R`, `Z`, …). */
  readonly state: string;
  /** Field 4. */
  readonly ppid: number;
}

/**
 * Parse a `/proc/<pid>/stat` line: `pid (comm) state ppid …`. comm is what lies between the first
 * `(` and the LAST `)`, since comm may contain spaces and parentheses (`1234 (a) b) S 1 …`).
 * @returns null when the text is not such a line.
 */
export function parseProcStat(text: string): ProcStat | null {
  const open = text.indexOf(' (');
  const close = text.lastIndexOf(')');
  if (open <= 0 || close < open) return null;
  const pid = Number(text.slice(0, open));
  const rest = text.slice(close + 1).trim().split(/\s+/);
  const state = rest[0];
  const ppid = Number(rest[1]);
  if (!Number.isSafeInteger(pid) || state === undefined || !/^[A-Za-z]$/.test(state) || !Number.isSafeInteger(ppid)) return null;
  return { pid, comm: text.slice(open + 2, close), state, ppid };
}

/** One row of `/proc/<pid>/net/unix`. */
export interface UnixSocketRow {
  /** Socket inode (the `N` of `socket:[N]`). */
  readonly inode: number;
  /** The Flags column (hex) as a number; `0x10000` is `__SO_ACCEPTCON` (listening). */
  readonly flags: number;
  /** The Type column: 1 `SOCK_STREAM`, 2 `SOCK_DGRAM`, 5 `SOCK_SEQPACKET`. */
  readonly type: number;
  /** The St column: 1 unconnected, 3 connected… */
  readonly state: number;
  /** Path; `@name` for an abstract socket; null for an unnamed one. */
  readonly path: string | null;
}

/** `__SO_ACCEPTCON` in the Flags column (include/linux/net.h): the socket is listening. */
export const SO_ACCEPTCON = 0x10000;

const UNIX_ROW = /^[0-9a-fA-F]+:\s+([0-9a-fA-F]+)\s+([0-9a-fA-F]+)\s+([0-9a-fA-F]+)\s+([0-9a-fA-F]+)\s+([0-9a-fA-F]+)\s+(\d+)(?: (.*))?$/;

/**
 * Parse the text of `/proc/<pid>/net/unix` (header `Num RefCount Protocol Flags Type St Inode
 * Path`; kernel `unix_seq_show`). The path is the rest of the line after the inode and one space
 * (it may contain spaces). The header and malformed lines are skipped.
 */
export function parseProcNetUnix(text: string): UnixSocketRow[] {
  const out: UnixSocketRow[] = [];
  for (const line of text.split('\n')) {
    const m = UNIX_ROW.exec(line);
    if (m === null) continue;
    const path = m[7];
    out.push({
      inode: Number(m[6]),
      flags: Number.parseInt(m[3] as string, 16),
      type: Number.parseInt(m[4] as string, 16),
      state: Number.parseInt(m[5] as string, 16),
      path: path === undefined || path === '' ? null : path,
    });
  }
  return out;
}

/** Socket base names of CRI endpoints (containerd, CRI-O, cri-dockerd, the old dockershim). */
const KNOWN_CRI_NAMES: readonly string[] = ['containerd.sock', 'crio.sock', 'cri-dockerd.sock', 'dockershim.sock'];

/** True for listening sockets that are certainly not a CRI endpoint (see {@link RuntimeIdentity.candidates}). */
function excluded(path: string): boolean {
  return path.endsWith('.ttrpc') || basename(path) === 'debug.sock';
}

/**
 * Order candidate socket paths best first: known CRI names, then the rest, each group in input
 * order; excluded paths removed. Pure.
 */
export function rankCandidates(paths: readonly string[]): string[] {
  const kept = paths.filter((p) => !excluded(p));
  return [...kept.filter((p) => KNOWN_CRI_NAMES.includes(basename(p))), ...kept.filter((p) => !KNOWN_CRI_NAMES.includes(basename(p)))];
}

/**
 * The name of process `pid` for messages, from its `/proc/<pid>/stat` comm: the comm itself, except
 * for a program run from a memfd (`execveat` of an anonymous file, as runc's and some supervisors'
 * self-copies are), whose comm is the memfd's internal name (`memfd:…`, since Linux 6.11 the
 * dentry's name): then the base name of its argv[0] (`/proc/<pid>/cmdline` up to the first NUL)
 * when that is readable, not empty and not itself a memfd name, else `?`. Never throws.
 */
export function processName(procDir: string, pid: number, comm: string): string {
  if (!comm.startsWith('memfd:')) return comm;
  try {
    const raw = readFileSync(join(procDir, String(pid), 'cmdline'), 'utf8');
    const nul = raw.indexOf('\0');
    const argv0 = basename(nul < 0 ? raw : raw.slice(0, nul));
    return argv0 === '' || argv0.startsWith('memfd:') ? '?' : argv0;
  } catch {
    return '?';
  }
}

function code(e: unknown): string {
  return errnoCode(e) ?? (e instanceof Error ? e.message : String(e));
}

/**
 * Find the runtime that (indirectly) exec'd process `pid`: walk its ancestors from the parent up,
 * stopping before pid 1 and at pid 2; the first one with a listening, path-named stream unix
 * socket that is not excluded gives `candidates`. Synchronous; never throws.
 *
 * Reasons (exact texts):
 * - found: `ancestor <pid> (<comm>) listens on <first candidate>` plus ` and N more` when more;
 * - `cannot read <procDir>/<pid>/stat: <CODE>` when the walk cannot start or continue;
 * - `cannot read <procDir>/<anc>/fd of ancestor <anc> (<comm>): <CODE>` (stop: a runtime we
 *   cannot look into must not be skipped in favour of one further up);
 * - `no ancestor below pid 1 listens on a unix socket (walked: 123 sh, 120 node)`; `(walked:
 *   none)` when the parent is pid 1 or 0.
 * Each `<comm>` is the ancestor's {@link processName}: an internal `memfd:…` name never appears.
 */
export function identifyRuntime(opts: IdentifyRuntimeOptions = {}): RuntimeIdentity {
  const procDir = opts.procDir ?? '/proc';
  const start = opts.pid ?? process.pid;
  const walked: string[] = [];
  const readStat = (pid: number): ProcStat | string => {
    const file = join(procDir, String(pid), 'stat');
    try {
      return parseProcStat(readFileSync(file, 'utf8')) ?? `cannot parse ${file}`;
    } catch (e) {
      return `cannot read ${file}: ${code(e)}`;
    }
  };
  const self = readStat(start);
  if (typeof self === 'string') return { candidates: [], ancestor: null, reason: self };
  let pid = self.ppid;
  const seen = new Set<number>([start]);
  while (pid > 2 && !seen.has(pid)) {
    seen.add(pid);
    const stat = readStat(pid);
    if (typeof stat === 'string') return { candidates: [], ancestor: null, reason: stat };
    const st = { ...stat, comm: processName(procDir, pid, stat.comm) };
    const fdDir = join(procDir, String(pid), 'fd');
    let fds: string[];
    try {
      fds = readdirSync(fdDir);
    } catch (e) {
      return { candidates: [], ancestor: null, reason: `cannot read ${fdDir} of ancestor ${pid} (${st.comm}): ${code(e)}` };
    }
    const inodes = new Set<number>();
    for (const fd of fds) {
      try {
        const m = /^socket:\[(\d+)\]$/.exec(readlinkSync(join(fdDir, fd)));
        if (m !== null) inodes.add(Number(m[1]));
      } catch {
        // fd closed meanwhile
      }
    }
    if (inodes.size > 0) {
      let rows: UnixSocketRow[] = [];
      try {
        rows = parseProcNetUnix(readFileSync(join(procDir, String(pid), 'net', 'unix'), 'utf8'));
      } catch (e) {
        return { candidates: [], ancestor: null, reason: `cannot read ${join(procDir, String(pid), 'net', 'unix')} of ancestor ${pid} (${st.comm}): ${code(e)}` };
      }
      const paths = rows
        .filter((r) => inodes.has(r.inode) && (r.flags & SO_ACCEPTCON) !== 0 && r.type === 1 && r.path !== null && r.path.startsWith('/'))
        .map((r) => r.path as string);
      const candidates = rankCandidates([...new Set(paths)]);
      if (candidates.length > 0) {
        const more = candidates.length > 1 ? ` and ${candidates.length - 1} more` : '';
        return { candidates, ancestor: { pid, comm: st.comm }, reason: `ancestor ${pid} (${st.comm}) listens on ${candidates[0] as string}${more}` };
      }
    }
    walked.push(`${pid} ${st.comm}`);
    pid = st.ppid;
  }
  return {
    candidates: [],
    ancestor: null,
    reason: `no ancestor below pid 1 listens on a unix socket (walked: ${walked.length === 0 ? 'none' : walked.join(', ')})`,
  };
}
