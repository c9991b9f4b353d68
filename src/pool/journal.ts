/**
 * The local journal of offline pool allocations (issue 11; docs/cluster.md "Offline allocation"):
 * one file per attachment, named `<64 hex>.json` (a hash: no request text in a path), in one
 * directory per pool and node (`<root>/<64 hex of [etcd prefix, pool name, node]>`, {@link poolJournalDir})
 * under one fixed per-node root that does not depend on any network's `ipam.dataDir` (review F2:
 * a journal whose place depended on which network of the pool came first was lost on a
 * restart). The root is the daemon's `--pool-journal-dir`, default
 * {@link DEFAULT_POOL_JOURNAL_ROOT} (`/var/lib/cni/networks/.ipwarden-pool-offline`: inside the
 * DaemonSet's `/var/lib/cni/networks` mount, and a name no CNI network can have, so the
 * node-local reconciler never takes it for a network directory).
 *
 * An entry that cannot be read (not a regular file, a symlink, undecodable) is set aside:
 * renamed to `<name>.corrupt` ({@link PoolJournal.setAside}), never deleted, and counted by
 * {@link PoolJournal.asideCount} until an operator removes it (review F4).
 *
 * Durability: a file is written as a temporary file (O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600) in the
 * directory, fsynced, renamed over its name, and the directory fsynced — after `write` returns
 * the entry survives a crash or a power cut, and a reader never sees it half-written. A removal
 * fsyncs the directory too. Calls are synchronous on purpose: an offline ADD takes its reserve
 * address and writes its entry without yielding, so no other request interleaves.
 *
 * Symlinks: root follows none it did not make — the directory must be a real directory (lstat)
 * owned by root or us and writable by nobody else, and every file is opened with O_NOFOLLOW.
 * Text in, text out: the entries' format is the caller's (src/pool/offline.ts).
 */
import { closeSync, constants, fsyncSync, lstatSync, mkdirSync, openSync, readdirSync, readFileSync, renameSync, unlinkSync, writeSync, fstatSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { createHash, randomBytes } from 'node:crypto';
import { AppError, errnoCode } from '../common/errors.ts';
import { untrustedReason } from '../common/trust.ts';
import { makeDirs } from '../common/make-dirs.ts';

/** Name of the journal directory under a data directory. */
export const JOURNAL_DIR_NAME = '.ipwarden-pool-offline';
/** The default root of the pool journals (the daemon's `--pool-journal-dir`): `/var/lib/cni/networks/.ipwarden-pool-offline`. */
export const DEFAULT_POOL_JOURNAL_ROOT = `/var/lib/cni/networks/${JOURNAL_DIR_NAME}`;
/** A journal file name. */
export const JOURNAL_NAME_RE = /^[0-9a-f]{64}\.json$/;
/** A pool directory's name under the root. */
export const POOL_DIR_RE = /^[0-9a-f]{64}$/;
/** Suffix of an entry set aside (unreadable or invalid). */
export const ASIDE_SUFFIX = '.corrupt';
const TMP_PREFIX = '.tmp-';

/**
 * The journal directory of pool `name` under etcd key prefix `prefix`, of node `node`:
 * `<root>/<sha256 hex of JSON [prefix, name, node]>`. The node is in the name so that daemons of
 * several simulated nodes on one host (tests) never share a directory. Pure.
 */
export function poolJournalDir(root: string, prefix: string, name: string, node: string): string {
  return join(root, createHash('sha256').update(JSON.stringify([prefix, name, node])).digest('hex'));
}

/** One file of {@link PoolJournal.list}: its text, or why it cannot be read (`STORE_IO`). */
export type JournalFile = { readonly name: string; readonly text: string } | { readonly name: string; readonly error: AppError };

/**
 * Read only (the standalone plugin, while the daemon is down): does pool directory `dir` hold an
 * entry named `name` (also one set aside as `<name>.corrupt`, or one that is not a regular
 * file)? Creates nothing, follows no symlink (lstat, O_NOFOLLOW). An absent directory: false.
 * @throws AppError STORE_IO when `dir` (or the root above it) is not a directory, is untrusted
 *   (owner, mode: src/common/trust.ts), or cannot be read.
 */
export function journalHolds(dir: string, name: string): boolean {
  if (!JOURNAL_NAME_RE.test(name)) throw new AppError('INTERNAL', `pool journal: bad file name ${JSON.stringify(name)}`);
  const euid = process.geteuid?.() ?? 0;
  for (const d of [dirname(dir), dir]) {
    let st;
    try {
      st = lstatSync(d);
    } catch (e) {
      if (errnoCode(e) === 'ENOENT') return false;
      throw io(`lstat ${d}`, e);
    }
    if (!st.isDirectory()) throw new AppError('STORE_IO', `pool journal: ${d} is not a directory (a symlink or a file): ipwarden follows no symlink it did not make`);
    const why = untrustedReason(d, st, euid);
    if (why !== null) throw new AppError('STORE_IO', `pool journal: ${why}`);
  }
  for (const n of [name, `${name}${ASIDE_SUFFIX}`]) {
    try {
      closeSync(openSync(join(dir, n), constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK));
      return true;
    } catch (e) {
      const c = errnoCode(e);
      if (c === 'ENOENT') continue;
      if (c === 'ELOOP' || c === 'ENXIO' || c === 'EISDIR') return true; // there, but not a regular file: held all the same
      throw io(`open ${join(dir, n)}`, e);
    }
  }
  return false;
}

function io(what: string, e: unknown): AppError {
  return new AppError('STORE_IO', `pool journal: ${what}: ${e instanceof Error ? e.message : String(e)}`, { cause: e });
}

/** The journal directory. See the module comment. Errors are `AppError('STORE_IO')` (CNI 5) naming the path. */
export class PoolJournal {
  /** Absolute path of the directory. */
  readonly dir: string;
  #ready = false;

  constructor(dir: string) {
    this.dir = dir;
  }

  /**
   * Create the directory if absent (its parent with `mkdir -p`, mode 0755, as host-local makes
   * its data directory; the directory itself 0700), check it (a real directory, trusted owner and
   * mode), and remove temporary files a crash left. Idempotent.
   */
  ensure(): void {
    if (this.#ready) return;
    try {
      makeDirs(dirname(this.dir), 0o755);
      try {
        mkdirSync(this.dir, { mode: 0o700 });
      } catch (e) {
        if (errnoCode(e) !== 'EEXIST') throw e;
      }
    } catch (e) {
      throw io(`mkdir ${this.dir}`, e);
    }
    const st = lstatSync(this.dir);
    if (!st.isDirectory()) throw new AppError('STORE_IO', `pool journal: ${this.dir} is not a directory (a symlink or a file): ipwarden follows no symlink it did not make`);
    const why = untrustedReason(this.dir, st, process.geteuid?.() ?? 0);
    if (why !== null) throw new AppError('STORE_IO', `pool journal: ${why}`);
    for (const n of readdirSync(this.dir)) if (n.startsWith(TMP_PREFIX)) this.#unlink(n);
    this.#ready = true;
  }

  #check(name: string): void {
    if (!JOURNAL_NAME_RE.test(name)) throw new AppError('INTERNAL', `pool journal: bad file name ${JSON.stringify(name)}`);
  }

  #syncDir(): void {
    const fd = openSync(this.dir, constants.O_RDONLY | constants.O_DIRECTORY | constants.O_NOFOLLOW);
    try {
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
  }

  #unlink(name: string): void {
    try {
      unlinkSync(join(this.dir, name));
    } catch (e) {
      if (errnoCode(e) !== 'ENOENT') throw io(`unlink ${join(this.dir, name)}`, e);
    }
  }

  /** Write `text` as entry `name`, durably and atomically (see the module comment). */
  write(name: string, text: string): void {
    this.#check(name);
    this.ensure();
    const tmp = `${TMP_PREFIX}${name}.${randomBytes(6).toString('hex')}`;
    const path = join(this.dir, tmp);
    try {
      const fd = openSync(path, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW, 0o600);
      try {
        const buf = Buffer.from(text, 'utf8');
        let off = 0;
        while (off < buf.length) off += writeSync(fd, buf, off, buf.length - off);
        fsyncSync(fd);
      } finally {
        closeSync(fd);
      }
      renameSync(path, join(this.dir, name));
      this.#syncDir();
    } catch (e) {
      try {
        unlinkSync(path);
      } catch {
        // already renamed, or never created
      }
      throw io(`write ${join(this.dir, name)}`, e);
    }
  }

  /** Remove entry `name` (absent is fine), then fsync the directory. */
  remove(name: string): void {
    this.#check(name);
    this.ensure();
    this.#unlink(name);
    try {
      this.#syncDir();
    } catch (e) {
      throw io(`fsync ${this.dir}`, e);
    }
  }

  /** Entry `name`'s text, or null when absent. A non-regular file is an error. */
  read(name: string): string | null {
    this.#check(name);
    this.ensure();
    const path = join(this.dir, name);
    let fd: number;
    try {
      fd = openSync(path, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
    } catch (e) {
      if (errnoCode(e) === 'ENOENT') return null;
      throw io(`open ${path}`, e);
    }
    try {
      if (!fstatSync(fd).isFile()) throw new AppError('STORE_IO', `pool journal: ${path} is not a regular file`);
      return readFileSync(fd, 'utf8');
    } finally {
      closeSync(fd);
    }
  }

  /**
   * Every entry, sorted by name: its text, or the `STORE_IO` error that one file gave (a
   * directory, a symlink, a FIFO: one bad file never hides the others); files of other names are
   * ignored. Throws (`STORE_IO`) only when the directory itself cannot be used.
   */
  list(): JournalFile[] {
    this.ensure();
    const out: JournalFile[] = [];
    for (const n of readdirSync(this.dir).sort()) {
      if (!JOURNAL_NAME_RE.test(n)) continue;
      try {
        const text = this.read(n);
        if (text !== null) out.push({ name: n, text });
      } catch (e) {
        out.push({ name: n, error: e instanceof AppError ? e : io(`read ${join(this.dir, n)}`, e) });
      }
    }
    return out;
  }

  /**
   * Set entry `name` aside: rename it to `<name>.corrupt` (whatever it is: the rename moves a
   * symlink itself, never its target), then fsync the directory. An existing `<name>.corrupt`
   * is replaced only by rename (one set-aside copy per name).
   * @throws AppError STORE_IO
   */
  setAside(name: string): void {
    this.#check(name);
    this.ensure();
    try {
      renameSync(join(this.dir, name), join(this.dir, `${name}${ASIDE_SUFFIX}`));
      this.#syncDir();
    } catch (e) {
      throw io(`rename ${join(this.dir, name)} to ${name}${ASIDE_SUFFIX}`, e);
    }
  }

  /** How many entries are set aside (`<64 hex>.json.corrupt` files): each waits for an operator. */
  asideCount(): number {
    this.ensure();
    return readdirSync(this.dir).filter((n) => n.endsWith(ASIDE_SUFFIX) && JOURNAL_NAME_RE.test(n.slice(0, -ASIDE_SUFFIX.length))).length;
  }
}
