/**
 * The local journal of offline pool allocations (issue 11; docs/cluster.md "Offline allocation"):
 * one file per attachment, named `<64 hex>.json` (a hash: no request text in a path), in a
 * directory ipwarden creates itself (default `<dataDir>/.ipwarden-pool-offline`: a name no CNI
 * network can have, so the node-local reconciler never takes it for a network directory).
 *
 * Durability: a file is written as a temporary file (O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600) in the
 * directory, fsynced, renamed over its name, and the directory fsynced — after `write` returns
 * the entry survives a crash or a power cut, and a reader never sees it half-written. A removal
 * fsyncs the directory too. Calls are synchronous on purpose: an offline ADD takes its reserve
 * address and writes its entry without yielding, so no other request interleaves.
 *
 * Symlinks: root follows none it did not make — the directory must be a real directory (lstat)
 * owned by root or us and writable by nobody else, and every file is opened with O_NOFOLLOW.
 * Text in, text out: the entries' format is the caller's (src/ipam/pool-offline.ts).
 */
import { closeSync, constants, fsyncSync, lstatSync, mkdirSync, openSync, readdirSync, readFileSync, renameSync, unlinkSync, writeSync, fstatSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { AppError, errnoCode } from '../common/errors.ts';
import { untrustedReason } from '../common/trust.ts';

/** Name of the journal directory under a data directory. */
export const JOURNAL_DIR_NAME = '.ipwarden-pool-offline';
/** A journal file name. */
export const JOURNAL_NAME_RE = /^[0-9a-f]{64}\.json$/;
const TMP_PREFIX = '.tmp-';

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
      mkdirSync(dirname(this.dir), { recursive: true, mode: 0o755 });
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

  /** Every entry (name and text), sorted by name; files of other names are ignored. */
  list(): Array<{ name: string; text: string }> {
    this.ensure();
    const out: Array<{ name: string; text: string }> = [];
    for (const n of readdirSync(this.dir).sort()) {
      if (!JOURNAL_NAME_RE.test(n)) continue;
      const text = this.read(n);
      if (text !== null) out.push({ name: n, text });
    }
    return out;
  }
}
