/**
 * Facts about the running node read from procfs (proc(5)): who holds a file lock
 * (`/proc/locks`), process command lines (`/proc/<pid>/cmdline`, `/proc/<pid>/comm`), the boot
 * time (`/proc/stat` `btime`) and which filesystem a path is on (`/proc/mounts`). Every reader
 * takes the procfs root (`procDir`, default `/proc`) so tests can point it at a prepared tree;
 * the parsers are pure.
 */
import { readdirSync, readFileSync, realpathSync, statSync } from 'node:fs';
import { basename, join } from 'node:path';

/** Default procfs root. */
export const DEFAULT_PROC_DIR = '/proc';

/** Filesystem types whose contents are gone after a reboot. */
export const VOLATILE_FS_TYPES: readonly string[] = ['tmpfs', 'ramfs'];

/** One line of `/proc/locks` (proc(5) "/proc/locks"). */
export interface ProcLock {
  /** Ordinal of the lock in the table. */
  readonly id: number;
  /** True for a `->` line: a process waiting for the lock above it, not holding it. */
  readonly blocked: boolean;
  /** `FLOCK` (flock(2)), `POSIX` (fcntl), `OFDLCK`, `LEASE`, `DELEG`… */
  readonly kind: string;
  /** `ADVISORY` or `MANDATORY`. */
  readonly mode: string;
  /** `READ` or `WRITE` (or a lease state). */
  readonly access: string;
  /** Owner pid in the reader's pid namespace; -1 for OFD locks (no owning process). */
  readonly pid: number;
  /** Device major number of the locked file (hex in the file). */
  readonly major: number;
  /** Device minor number of the locked file (hex in the file). */
  readonly minor: number;
  /** Inode number of the locked file. */
  readonly inode: bigint;
}

/**
 * Parse the text of `/proc/locks`. Lines look like
 * `1: FLOCK  ADVISORY  WRITE 31371 fe:00:2146839 0 EOF` (a waiter: `1: -> FLOCK …`).
 * Lines that do not parse are skipped.
 */
export function parseProcLocks(text: string): ProcLock[] {
  const out: ProcLock[] = [];
  for (const line of text.split('\n')) {
    const f = line.trim().split(/\s+/);
    if (f.length < 6) continue;
    const id = Number.parseInt(f[0] ?? '', 10);
    let i = 1;
    const blocked = f[1] === '->';
    if (blocked) i++;
    const [kind, mode, access, pidText, devText] = f.slice(i, i + 5);
    if (kind === undefined || mode === undefined || access === undefined || pidText === undefined || devText === undefined) continue;
    const dev = /^([0-9a-f]+):([0-9a-f]+):(\d+)$/i.exec(devText);
    if (!Number.isFinite(id) || dev === null || !/^-?\d+$/.test(pidText)) continue;
    out.push({
      id,
      blocked,
      kind,
      mode,
      access,
      pid: Number(pidText),
      major: Number.parseInt(dev[1] as string, 16),
      minor: Number.parseInt(dev[2] as string, 16),
      inode: BigInt(dev[3] as string),
    });
  }
  return out;
}

/** Read and parse `<procDir>/locks`; [] when it cannot be read. */
export function readProcLocks(procDir: string = DEFAULT_PROC_DIR): ProcLock[] {
  try {
    return parseProcLocks(readFileSync(join(procDir, 'locks'), 'utf8'));
  } catch {
    return [];
  }
}

/** Major and minor numbers of a Linux `dev_t` as `stat(2)` reports it (glibc `gnu_dev_major/minor`). */
export function devMajorMinor(dev: bigint): { major: number; minor: number } {
  const major = ((dev >> 8n) & 0xfffn) | ((dev >> 32n) & 0xfffff000n);
  const minor = (dev & 0xffn) | ((dev >> 12n) & 0xffffff00n);
  return { major: Number(major), minor: Number(minor) };
}

/** A process as procfs shows it. */
export interface ProcessInfo {
  readonly pid: number;
  /** `/proc/<pid>/comm` (the executable's short name), or null when unreadable. */
  readonly comm: string | null;
  /** `/proc/<pid>/cmdline` split at NUL bytes; [] when unreadable (or a kernel thread). */
  readonly argv: readonly string[];
}

/** The process `pid` (comm and argv); fields are null/[] when the process is gone or hidden. */
export function readProcess(pid: number, procDir: string = DEFAULT_PROC_DIR): ProcessInfo {
  let comm: string | null = null;
  let argv: string[] = [];
  try {
    comm = readFileSync(join(procDir, String(pid), 'comm'), 'utf8').replace(/\n$/, '');
  } catch {
    comm = null;
  }
  try {
    const raw = readFileSync(join(procDir, String(pid), 'cmdline'), 'utf8');
    argv = raw.split('\0');
    if (argv[argv.length - 1] === '') argv.pop();
  } catch {
    argv = [];
  }
  return { pid, comm, argv };
}

/** `argv` joined with spaces, else `[comm]`, else `?` (for reports). */
export function commandText(p: ProcessInfo): string {
  if (p.argv.length > 0) return p.argv.join(' ');
  return p.comm !== null ? `[${p.comm}]` : '?';
}

/** A process holding a lock on a file. */
export interface LockHolder {
  readonly lock: ProcLock;
  /** The owning process; null for an OFD lock (pid -1). */
  readonly process: ProcessInfo | null;
}

/**
 * The processes holding a lock (not waiting for one) on the file `path`, matched in
 * `/proc/locks` by its device and inode. [] when the file does not exist or nobody holds it.
 */
export function lockHolders(path: string, procDir: string = DEFAULT_PROC_DIR): LockHolder[] {
  let ino: bigint;
  let dev: { major: number; minor: number };
  try {
    const st = statSync(path, { bigint: true });
    ino = st.ino;
    dev = devMajorMinor(st.dev);
  } catch {
    return [];
  }
  return readProcLocks(procDir)
    .filter((l) => !l.blocked && l.inode === ino && l.major === dev.major && l.minor === dev.minor)
    .map((lock) => ({ lock, process: lock.pid > 0 ? readProcess(lock.pid, procDir) : null }));
}

/** Pids of every process under `procDir` (numeric directory names), ascending. */
export function listPids(procDir: string = DEFAULT_PROC_DIR): number[] {
  let names: string[];
  try {
    names = readdirSync(procDir);
  } catch {
    return [];
  }
  return names
    .filter((n) => /^\d+$/.test(n))
    .map(Number)
    .sort((a, b) => a - b);
}

/**
 * Is `argv` an `ipwarden daemon`? True when one argument's base name contains `ipwarden`
 * (`/usr/bin/ipwarden`, `…/ipwarden.cjs`, `node …/bin/ipwarden`) and a later one is `daemon`.
 */
export function isIpwardenDaemon(argv: readonly string[]): boolean {
  const at = argv.findIndex((a) => basename(a).includes('ipwarden'));
  return at >= 0 && argv.slice(at + 1).includes('daemon');
}

/** The running `ipwarden daemon` processes (see {@link isIpwardenDaemon}). */
export function findIpwardenDaemons(procDir: string = DEFAULT_PROC_DIR): ProcessInfo[] {
  return listPids(procDir)
    .map((pid) => readProcess(pid, procDir))
    .filter((p) => isIpwardenDaemon(p.argv));
}

/** `btime` of the text of `/proc/stat`: boot time, seconds since the Unix epoch; null if absent. */
export function parseBootTime(statText: string): number | null {
  const m = /^btime\s+(\d+)\s*$/m.exec(statText);
  return m === null ? null : Number(m[1]);
}

/** Boot time from `<procDir>/stat`, seconds since the Unix epoch; null when unknown. */
export function readBootTime(procDir: string = DEFAULT_PROC_DIR): number | null {
  try {
    return parseBootTime(readFileSync(join(procDir, 'stat'), 'utf8'));
  } catch {
    return null;
  }
}

/** One mount of `/proc/mounts` (fstab(5) fields). */
export interface MountEntry {
  readonly source: string;
  readonly mountPoint: string;
  readonly fsType: string;
}

/** fstab's octal escapes (`\040` space, `\011` tab, `\012` newline, `\134` backslash). */
function unescapeMountField(s: string): string {
  return s.replace(/\\([0-7]{3})/g, (_, o: string) => String.fromCharCode(Number.parseInt(o, 8)));
}

/** Parse the text of `/proc/mounts`, in file order (later mounts stack over earlier ones). */
export function parseProcMounts(text: string): MountEntry[] {
  const out: MountEntry[] = [];
  for (const line of text.split('\n')) {
    const f = line.split(' ');
    if (f.length < 3 || f[0] === '') continue;
    out.push({ source: unescapeMountField(f[0] as string), mountPoint: unescapeMountField(f[1] as string), fsType: f[2] as string });
  }
  return out;
}

/**
 * The mount an absolute, symlink-free `path` lies on: the last mount (in mount order) whose
 * mount point is the longest prefix of `path` at a path-component boundary. Pure.
 */
export function mountOfPath(path: string, mounts: readonly MountEntry[]): MountEntry | null {
  let best: MountEntry | null = null;
  for (const m of mounts) {
    const mp = m.mountPoint;
    const inside = mp === '/' || path === mp || path.startsWith(mp.endsWith('/') ? mp : `${mp}/`);
    if (!inside) continue;
    if (best === null || mp.length >= best.mountPoint.length) best = m;
  }
  return best;
}

/**
 * The mount `path` lies on, after resolving symlinks, from `<procDir>/mounts`; null when `path`
 * does not exist or the mount table cannot be read.
 */
export function mountOf(path: string, procDir: string = DEFAULT_PROC_DIR): MountEntry | null {
  try {
    return mountOfPath(realpathSync(path), parseProcMounts(readFileSync(join(procDir, 'mounts'), 'utf8')));
  } catch {
    return null;
  }
}

/** True for filesystems whose contents do not survive a reboot ({@link VOLATILE_FS_TYPES}). */
export function isVolatileFs(fsType: string): boolean {
  return VOLATILE_FS_TYPES.includes(fsType);
}
