/**
 * The host-local compatible, on-disk reservation store (ARCHITECTURE.md "The on-disk contract";
 * anchors §2.5–2.6). Same directory, file names, contents and lock as upstream
 * plugins/ipam/host-local/backend/disk/backend.go, so ipwarden and the upstream binary can share
 * one `DIR = <dataDir>/<network>` on a node.
 *
 * Differences from upstream, all on the safe side:
 * - A reservation file is written to a temporary name in DIR, then `link(2)`ed to the IP's name,
 *   so a killed process never leaves it visible empty or half-written (upstream `O_EXCL`-creates
 *   the IP file and writes into it; a crash in between leaves an empty file no ID ever matches),
 *   and DIR is fsynced before the reservation is reported, so after a power loss its name is there
 *   (its content may come back empty: an empty record counts as taken).
 * - `last_reserved_ip.<N>` is never truncated to empty: a file this store left (regular, one link,
 *   ours, {@link LAST_RESERVED_IP_FILE_MODE}) is overwritten in place, anything else is replaced
 *   (temp + rename); so every write leaves it with that mode, also where an older writer had
 *   created it 0644 (upstream's `os.WriteFile` keeps an existing file's mode).
 * - A failed `last_reserved_ip` write removes the just-made reservation (upstream leaves it).
 * - Failures to remove a file in `releaseByOwner` are reported, not swallowed.
 *
 * All file-system calls are synchronous (the plugin is a short-lived process and the work happens
 * under an exclusive lock anyway), except, when the store is opened with `fsyncOffThread` (the
 * daemon's stores: src/store/file/indexed-store.ts), the fsyncs of a write (DIR after a
 * reservation, a rewrite's temporary file, the recovery mark): they then run in libuv's thread
 * pool, so the daemon's event loop is not stalled by one network's disk wait; and with
 * `deferDirSync` (the daemon too) a reservation's DIR fsync is left to the caller, who shares one
 * among the requests of a flush round and answers only after it.
 */
import {
  closeSync,
  constants as fsConstants,
  existsSync,
  fstatSync,
  fsync as fsyncCallback,
  fsyncSync,
  ftruncateSync,
  futimesSync,
  linkSync,
  openSync,
  readdirSync,
  readFileSync,
  readSync,
  renameSync,
  statSync,
  unlinkSync,
  writeSync,
} from 'node:fs';
import { isUtf8 } from 'node:buffer';
import { join } from 'node:path';
import { bytesToText, textByteLength, textToBytes } from '../../common/bytes.ts';
import { AppError, ClosedError, errnoCode } from '../../common/errors.ts';
import { canonicalIP, isCanonicalIPName } from '../../common/ip.ts';
import { CNI_NAME_RE, goTrimSpace } from '../../common/names.ts';
import { sameOwner, type ListOptions, type Owner, type Reservation, type Store } from '../store.ts';
import { closeQuietly, lockExclusive, type HeldLock, type LockClock } from './flock.ts';
import { makeDirs } from '../../common/make-dirs.ts';

/** Per-process counter making temporary file names unique. */
let tempCounter = 0;

/** Name of the lock file inside DIR (host-local backend/disk/lock.go: `path.Join(dir, "lock")`). */
export const LOCK_FILE_NAME = 'lock';
/** Prefix of the round-robin files (host-local backend.go `lastIPFilePrefix`). */
export const LAST_RESERVED_IP_PREFIX = 'last_reserved_ip.';
/** Line break between container ID and ifname (host-local backend.go `LineBreak`). */
export const LINE_BREAK = '\r\n';
/** Mode of a reservation file (host-local v1.4.0+, commit 33ccedc; anchors §2.5). */
export const RESERVATION_FILE_MODE = 0o600;
/**
 * Mode of `last_reserved_ip.<N>` (host-local v1.4.0+ backend.go `os.WriteFile(ipfile, …, 0o600)`,
 * the same commit as the reservation files; 0644 before, e.g. Debian's 1.1.1).
 */
export const LAST_RESERVED_IP_FILE_MODE = 0o600;
/** Mode DIR is created with (host-local backend.go `New`: `os.MkdirAll(dir, 0755)`). */
export const DIR_MODE = 0o755;
/**
 * Largest record accepted as a reservation, bytes; longer content is corrupt, and ipwarden refuses
 * to write one. No writer can produce a longer one: the container ID comes from the environment
 * variable CNI_CONTAINERID, at most 128 KiB on Linux (MAX_ARG_STRLEN), plus `\r\n` and an ifname
 * of at most 15 bytes. 1 MiB bounds what a stray file can make a reader load.
 */
export const MAX_RECORD_BYTES = 1 << 20;
/** Size of the reused read buffer: every record of a normal container ID fits in one read. */
const READ_BUFFER_BYTES = 4096;
/**
 * Temporary files are named `.ipwarden-<pid>-<random hex>.tmp`: never an IP, never a name
 * host-local uses. Any such file seen while holding the lock was left by a killed writer.
 */
export const TEMP_PREFIX = '.ipwarden-';
/** Name of the mark a wiped-directory recovery leaves until it is complete (not an IP: host-local ignores it). */
export const RECOVERY_MARK_NAME = 'ipwarden-recovery';
/** Suffix of temporary files; see {@link TEMP_PREFIX}. */
export const TEMP_SUFFIX = '.tmp';

/**
 * open(2) errors of an entry that is there but is no file to read: a unix socket (ENXIO), a symlink
 * loop (ELOOP), a symlink through a non-directory (ENOTDIR), a device without a driver (ENODEV,
 * ENXIO), a socket on a filesystem that says so (EOPNOTSUPP). Not a reservation; skipped.
 */
const UNOPENABLE: ReadonlySet<string> = new Set(['ENXIO', 'ELOOP', 'ENOTDIR', 'ENODEV', 'EOPNOTSUPP']);

/**
 * The name and text rules this store shares with the plugin and the reconciler live in the leaf
 * modules `src/common/ip.ts` (canonical IP text) and `src/common/names.ts` (CNI names, Go's
 * `strings.TrimSpace`); re-exported here for existing importers.
 */
export { canonicalIP, goTrimSpace, isCanonicalIPName };

/**
 * Parse a record's content (already trimmed with {@link goTrimSpace}) into its owner.
 * First line = container ID (a trailing `\r` of it dropped), the rest = ifname; no line break =
 * legacy ID-only record (`ifname: null`). Returns null (corrupt) when empty, when the container ID
 * does not match the CNI spec's pattern, or when the ifname contains a line break.
 */
export function parseTrimmedRecord(trimmed: string): Owner | null {
  if (trimmed.length === 0) return null;
  const nl = trimmed.indexOf('\n');
  if (nl < 0) return CNI_NAME_RE.test(trimmed) ? { containerId: trimmed, ifname: null } : null;
  const containerId = trimmed.charCodeAt(nl - 1) === 0x0d ? trimmed.slice(0, nl - 1) : trimmed.slice(0, nl);
  const ifname = trimmed.slice(nl + 1);
  if (!CNI_NAME_RE.test(containerId)) return null;
  if (ifname.length === 0 || ifname.includes('\n') || ifname.includes('\r')) return null;
  return { containerId, ifname };
}

/**
 * Parse raw record bytes: corrupt (null) when empty or longer than {@link MAX_RECORD_BYTES}; else
 * {@link parseTrimmedRecord} of the Go-trimmed text. Bytes that are not UTF-8 are kept exactly
 * (`bytesToText`): host-local writes the ifname bytes it was given and compares bytes.
 */
export function parseRecord(bytes: Uint8Array): Owner | null {
  const text = decodeRecord(bytes);
  return text === null ? null : parseTrimmedRecord(goTrimSpace(text));
}

function decodeRecord(bytes: Uint8Array): string | null {
  const b = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.length);
  return decodeBuffer(b, b.length);
}

/**
 * The text of the first `n` bytes of `buf` (lossless: see `src/common/bytes.ts`), or null when
 * empty or longer than {@link MAX_RECORD_BYTES}. Records are ASCII in practice (container IDs,
 * ifnames): that case is decoded without validation or an intermediate view (one string per
 * record, 65,534 of them on a full /16).
 */
export function decodeBuffer(buf: Buffer, n: number): string | null {
  if (n === 0 || n > MAX_RECORD_BYTES) return null;
  let ascii = true;
  for (let i = 0; i < n; i++) {
    if ((buf[i] as number) >= 0x80) {
      ascii = false;
      break;
    }
  }
  if (ascii) return buf.toString('latin1', 0, n);
  const view = buf.subarray(0, n);
  return isUtf8(view) ? view.toString('utf8') : bytesToText(view);
}

/**
 * Read the start of a record from `fd` into `buf`; returns the bytes read (`buf.length` when the
 * record may be longer: see {@link readLongRecord}). A short read of a regular file is its end:
 * that saves the second read(2) that would return 0 (one syscall per reservation, 65,534 of them
 * on a full /16). Shared with the daemon's index.
 */
export function readRecordHead(fd: number, buf: Buffer): number {
  let n = 0;
  for (;;) {
    const want = buf.length - n;
    const got = readSync(fd, buf, n, want, null);
    n += got;
    if (got === 0 || got < want || n === buf.length) return n;
  }
}

/**
 * The rest of a record longer than the read buffer `head` (a long container ID: ipwarden and
 * host-local write any length the environment allows), read from `fd` until its end or until it
 * is longer than {@link MAX_RECORD_BYTES} (then corrupt: null). Shared with the daemon's index.
 */
export function readLongRecord(fd: number, head: Buffer): string | null {
  const chunks: Buffer[] = [Buffer.from(head)];
  let total = head.length;
  for (;;) {
    const chunk = Buffer.allocUnsafe(65536);
    const got = readSync(fd, chunk, 0, chunk.length, null);
    if (got === 0) break;
    chunks.push(chunk.subarray(0, got));
    total += got;
    if (total > MAX_RECORD_BYTES) return null;
  }
  return decodeBuffer(Buffer.concat(chunks, total), total);
}

/**
 * The exact content host-local writes for (containerId, ifname): `TrimSpace(id) + "\r\n" + ifname`
 * (as text; its bytes are `textToBytes` of it, so an ifname read from non-UTF-8 bytes is written
 * back as those bytes).
 */
export function formatRecord(containerId: string, ifname: string): string {
  return goTrimSpace(containerId) + LINE_BREAK + ifname;
}

/** Options of {@link openFileStore}. The caller has validated both values. */
export interface FileStoreOptions {
  /** host-local `dataDir` (default `/var/lib/cni/networks` is the caller's business). */
  readonly dataDir: string;
  /** Network name (config top-level `name`): DIR = `<dataDir>/<network>`. */
  readonly network: string;
  /** Clock for lock polling (tests). */
  readonly lockClock?: LockClock;
  /**
   * Run the fsyncs of a write in libuv's thread pool instead of on the calling thread (default
   * false); the fsync of DIR after a removal stays synchronous.
   */
  readonly fsyncOffThread?: boolean;
}

/** One directory entry as read by `scan`. */
interface ScannedRecord {
  /** The file name: canonical IP text (the path is `DIR/<ip>`). */
  readonly ip: string;
  /** Go-trimmed content, or null when not decodable (empty, too long, not UTF-8). */
  readonly trimmed: string | null;
  readonly mtimeMs: number;
}

/**
 * Open (creating if needed) the store of one network: `mkdir -p <dataDir>/<network>` with mode
 * 0755, as host-local does on every ADD/DEL/CHECK (backend.go `New`). Does not lock.
 * Throws `AppError('STORE_IO')` when the directory cannot be created.
 */
export async function openFileStore(opts: FileStoreOptions): Promise<FileStore> {
  const dir = join(opts.dataDir, opts.network);
  try {
    makeDirs(dir, DIR_MODE);
  } catch (e) {
    throw new AppError('STORE_IO', `cannot create network directory ${dir}: ${describe(e)}`, { cause: e });
  }
  return new FileStore(opts.network, dir, opts.lockClock, opts.fsyncOffThread ?? false);
}

/**
 * host-local compatible store of one network in directory `dir`. Create with {@link openFileStore}.
 * See {@link Store} for the contract of each method; file-specific behaviour is noted per method.
 */
export class FileStore implements Store {
  readonly network: string;
  /** The network directory, `<dataDir>/<network>`. */
  readonly dir: string;
  /** `<dir>/lock`. */
  readonly lockPath: string;
  readonly #lockClock: LockClock | undefined;
  readonly #fsyncOffThread: boolean;
  /** `reserve`/`restore` leave DIR's fsync to the caller ({@link FileStore.syncDir}). */
  readonly #deferDirSync: boolean;
  #held: HeldLock | null = null;
  #closed = false;
  /** Reused read buffer; a record that fills it is read on in {@link FileStore.#readLong}. */
  readonly #buf = Buffer.allocUnsafe(READ_BUFFER_BYTES);

  /**
   * Prefer {@link openFileStore}, which also creates `dir`. `fsyncOffThread`: the fsyncs of a write
   * run in libuv's thread pool (the daemon, which serves other requests meanwhile); default false,
   * all calls synchronous (the standalone plugin, one request per process). `deferDirSync`:
   * `reserve` and `restore` do not fsync DIR; the caller awaits {@link FileStore.syncDir} before
   * it reports the reservation (default false: they fsync DIR before returning).
   */
  constructor(network: string, dir: string, lockClock?: LockClock, fsyncOffThread = false, deferDirSync = false) {
    this.network = network;
    this.dir = dir;
    this.lockPath = join(dir, LOCK_FILE_NAME);
    this.#lockClock = lockClock;
    this.#fsyncOffThread = fsyncOffThread;
    this.#deferDirSync = deferDirSync;
  }

  /**
   * fsync(2) of DIR (in the thread pool when opened with `fsyncOffThread`): makes every name
   * created or removed in DIR so far durable. With `deferDirSync` the caller must await it after
   * `reserve`/`restore` returned true and before it reports the reservation to anyone (the daemon
   * shares one call among the requests of a flush round: src/store/file/indexed-store.ts).
   * Throws `AppError('STORE_IO')` when DIR cannot be opened or the fsync fails.
   */
  async syncDir(): Promise<void> {
    try {
      await this.#fsyncDir();
    } catch (e) {
      throw ioError(`cannot make the reservations in ${this.dir} durable (fsync)`, e);
    }
  }

  /**
   * flock(LOCK_EX) on `<dir>/lock`, the file host-local locks. Throws `AppError('INTERNAL')` if
   * this store already holds it, plus the errors of {@link lockExclusive}.
   */
  async lock(timeoutSeconds: number): Promise<void> {
    this.#assertOpen();
    if (this.#held !== null) throw new AppError('INTERNAL', `the lock on ${this.lockPath} is already held by this store`);
    this.#held = await lockExclusive(this.lockPath, timeoutSeconds, this.#lockClock);
    if (this.#closed) {
      // close() ran while we were waiting: do not keep a lock nobody will release.
      this.#held.release();
      this.#held = null;
      throw new ClosedError(this.#what());
    }
  }

  async unlock(): Promise<void> {
    this.#assertOpen();
    this.#releaseLock();
  }

  /**
   * Reads every IP-named regular file in DIR once (one open/read/fstat/close each). Also removes
   * leftover temporary files of killed writers, but only while this store holds the lock (without
   * it they could belong to a live writer). A missing DIR gives [].
   */
  async list(opts: ListOptions = {}): Promise<Reservation[]> {
    this.#assertOpen();
    const out: Reservation[] = [];
    for (const r of this.#scan(opts.mtime ?? true)) {
      out.push({ ip: r.ip, owner: r.trimmed === null ? null : parseTrimmedRecord(r.trimmed), mtimeMs: r.mtimeMs });
    }
    return out;
  }

  /**
   * Temp file + link(2) to the IP's name (EEXIST → false); then `last_reserved_ip.<N>` via temp +
   * rename; then one fsync of DIR (none with `deferDirSync`: the caller's {@link FileStore.syncDir}).
   * The temporary files are not fsynced (docs/on-disk-format.md "Crash promises"). Throws `AppError('INTERNAL')` when `ip` is not
   * canonical IP text, `rangeSetIndex` not a non-negative integer, or the owner would not read back
   * as itself (invalid container ID, ifname with a line break); `AppError('STORE_IO')` on I/O
   * failure, after removing whatever it created.
   */
  async reserve(ip: string, owner: { containerId: string; ifname: string }, rangeSetIndex: number): Promise<boolean> {
    this.#assertOpen();
    assertIPName(ip);
    if (!Number.isSafeInteger(rangeSetIndex) || rangeSetIndex < 0) {
      throw new AppError('INTERNAL', `invalid range set index ${String(rangeSetIndex)}`);
    }
    return this.#reserveFile(ip, owner, rangeSetIndex);
  }

  /**
   * As {@link reserve} (temp file + link(2), EEXIST → false, fsync DIR) but leaves every
   * `last_reserved_ip.<N>` file untouched. Same errors as `reserve`.
   */
  async restore(ip: string, owner: { containerId: string; ifname: string }): Promise<boolean> {
    this.#assertOpen();
    assertIPName(ip);
    return this.#reserveFile(ip, owner, null);
  }

  /** The work of reserve/restore; `rangeSetIndex` null = do not write `last_reserved_ip`. */
  async #reserveFile(ip: string, owner: { containerId: string; ifname: string }, rangeSetIndex: number | null): Promise<boolean> {
    const content = formatRecord(owner.containerId, owner.ifname);
    const back = parseTrimmedRecord(goTrimSpace(content));
    if (back === null || back.containerId !== goTrimSpace(owner.containerId) || back.ifname !== owner.ifname || textByteLength(content) > MAX_RECORD_BYTES) {
      throw new AppError(
        'INTERNAL',
        `refusing to write a record that would not read back: container ID ${JSON.stringify(owner.containerId.length > 80 ? `${owner.containerId.slice(0, 80)}…` : owner.containerId)}, ifname ${JSON.stringify(owner.ifname)}`,
      );
    }
    const target = join(this.dir, ip);
    // No fsync of the content: a reservation whose name survives a power loss but whose content
    // does not comes back empty, and an empty record counts as taken (docs/on-disk-format.md
    // "Crash promises"). What must be durable before the answer is the name: DIR's fsync below
    // (or, in the daemon, the shared flush the caller awaits: {@link FileStore.syncDir}).
    const tmp = await this.#writeTemp(content, RESERVATION_FILE_MODE, false);
    let linked = false;
    // The temp name is removed right after the link; `finally` retries only if that failed (an
    // unlink that finds nothing costs a syscall and a thrown ENOENT error on every ADD).
    let tmpGone = false;
    try {
      try {
        linkSync(tmp, target);
        linked = true;
      } catch (e) {
        if (errnoCode(e) === 'EEXIST') return false;
        throw e;
      }
      tmpGone = unlinkQuietly(tmp);
      if (rangeSetIndex !== null) await this.#writeLastReservedIP(ip, rangeSetIndex);
      if (!this.#deferDirSync) await this.#fsyncDir();
      return true;
    } catch (e) {
      if (linked) unlinkQuietly(target);
      throw ioError(`cannot reserve ${ip} in ${this.dir}`, e);
    } finally {
      if (!tmpGone) unlinkQuietly(tmp);
    }
  }

  /**
   * Write `ip` to `last_reserved_ip.<rangeSetIndex>`. Only a hint for round robin: lost, empty or
   * garbled after a crash, the next ADD starts at the range's start (host-local does the same with
   * an unreadable file), so neither way is fsynced.
   *
   * In place when the file is already as this store leaves it (a regular file, one link, owned by
   * this process's uid, mode {@link LAST_RESERVED_IP_FILE_MODE}): one `pwrite(2)` at offset 0, and
   * an `ftruncate(2)` only when the old text was longer — as host-local's `os.WriteFile` rewrites
   * it, without its truncation to zero. Otherwise (missing, 0644 from an older writer, a symlink,
   * anything odd) it is replaced: a temporary file `rename(2)`d over it. Why in place: on ext4
   * (`auto_da_alloc`, the default) a rename over an existing file starts the writeback of the new
   * file's data and waits on the journal for it; measured on the project's VM, 0.26–0.53 ms median
   * and 1.7–3.0 ms mean per rename under other jobs' I/O, against 0.03–0.05 ms (mean 0.1–0.4 ms)
   * for the in-place write — and the daemon's event loop waits through it.
   * A process killed between the write and the truncation leaves the new text followed by the
   * old one's last characters: an invalid or another valid address, a hint either way.
   * @throws what `open`/`write`/`rename` throw on the replacement path (the in-place path falls
   *   back to it on any error).
   */
  async #writeLastReservedIP(ip: string, rangeSetIndex: number): Promise<void> {
    const path = join(this.dir, LAST_RESERVED_IP_PREFIX + String(rangeSetIndex));
    if (writeInPlace(path, ip)) return;
    const lastTmp = await this.#writeTemp(ip, LAST_RESERVED_IP_FILE_MODE, false);
    try {
      renameSync(lastTmp, path);
    } catch (e) {
      unlinkQuietly(lastTmp);
      throw e;
    }
  }

  /** Reads `last_reserved_ip.<N>`; any problem (missing, unreadable, not an IP) gives null. */
  async lastReservedIP(rangeSetIndex: number): Promise<string | null> {
    this.#assertOpen();
    try {
      const text = readFileSync(join(this.dir, LAST_RESERVED_IP_PREFIX + String(rangeSetIndex)), 'utf8');
      return canonicalIP(goTrimSpace(text));
    } catch {
      return null;
    }
  }

  /** Re-reads `<dir>/<ip>` and unlinks it only when its owner is still `expected`. */
  /**
   * Atomic replace of an existing record: re-read it, and if its owner is still `expected`, write
   * the new content to a temporary file, fsync, `rename(2)` it over the record, fsync DIR. The
   * record is never absent or partial at any instant.
   */
  async rewrite(ip: string, expected: Owner, owner: { containerId: string; ifname: string }): Promise<boolean> {
    this.#assertOpen();
    assertIPName(ip);
    const content = formatRecord(owner.containerId, owner.ifname);
    const back = parseTrimmedRecord(goTrimSpace(content));
    if (back === null || back.containerId !== goTrimSpace(owner.containerId) || back.ifname !== owner.ifname || textByteLength(content) > MAX_RECORD_BYTES) {
      throw new AppError('INTERNAL', `refusing to write a record that would not read back: ${JSON.stringify(content.length > 100 ? `${content.slice(0, 100)}…` : content)}`);
    }
    const path = join(this.dir, ip);
    const rec = this.#readRecord(path, false);
    if (rec === null) return false;
    if (!sameOwner(rec.trimmed === null ? null : parseTrimmedRecord(rec.trimmed), expected)) return false;
    const tmp = await this.#writeTemp(content, RESERVATION_FILE_MODE);
    try {
      renameSync(tmp, path);
    } catch (e) {
      unlinkQuietly(tmp);
      throw ioError(`cannot rewrite ${ip} in ${this.dir}`, e);
    }
    this.#fsyncDirQuietly();
    return true;
  }

  /**
   * `futimes(2)` to now on the record opened with O_NOFOLLOW|O_NONBLOCK, after re-reading its owner
   * under the caller's lock. False when absent, not a regular file, or owned by someone else.
   */
  async touch(ip: string, expected: Owner | null): Promise<boolean> {
    this.#assertOpen();
    assertIPName(ip);
    const path = join(this.dir, ip);
    const rec = this.#readRecord(path, true);
    if (rec === null) return false;
    if (!sameOwner(rec.trimmed === null ? null : parseTrimmedRecord(rec.trimmed), expected)) return false;
    let fd: number;
    try {
      fd = openSync(path, fsConstants.O_RDONLY | fsConstants.O_NOFOLLOW | fsConstants.O_NONBLOCK);
    } catch (e) {
      if (errnoCode(e) === 'ENOENT' || errnoCode(e) === 'ELOOP') return false;
      throw ioError(`cannot restamp ${ip} in ${this.dir}`, e);
    }
    try {
      if (!fstatSync(fd).isFile()) return false;
      const now = new Date();
      futimesSync(fd, now, now);
      return true;
    } catch (e) {
      throw ioError(`cannot restamp ${ip} in ${this.dir}`, e);
    } finally {
      closeQuietly(fd);
    }
  }

  /** `DIR/ipwarden-recovery` exists (one access(2)). */
  async recoveryPending(): Promise<boolean> {
    this.#assertOpen();
    return existsSync(join(this.dir, RECOVERY_MARK_NAME));
  }

  /**
   * Begin: temp file + fsync + rename to `DIR/ipwarden-recovery` + fsync DIR. End: unlink + fsync
   * DIR. host-local ignores the name (not an IP); its content matches no container ID.
   */
  async markRecovery(pending: boolean): Promise<void> {
    this.#assertOpen();
    const path = join(this.dir, RECOVERY_MARK_NAME);
    if (pending) {
      const tmp = await this.#writeTemp(`ipwarden recovery of ${this.network} in progress\n`, RESERVATION_FILE_MODE);
      try {
        renameSync(tmp, path);
      } catch (e) {
        unlinkQuietly(tmp);
        throw ioError(`cannot mark the recovery of ${this.dir}`, e);
      }
      await this.#fsyncDir();
      return;
    }
    try {
      unlinkSync(path);
    } catch (e) {
      if (errnoCode(e) !== 'ENOENT') throw ioError(`cannot finish the recovery of ${this.dir}`, e);
    }
    this.#fsyncDirQuietly();
  }

  async release(ip: string, expected: Owner | null): Promise<boolean> {
    this.#assertOpen();
    assertIPName(ip);
    const path = join(this.dir, ip);
    const rec = this.#readRecord(path, true);
    if (rec === null) return false;
    const owner = rec.trimmed === null ? null : parseTrimmedRecord(rec.trimmed);
    if (!sameOwner(owner, expected)) return false;
    try {
      unlinkSync(path);
    } catch (e) {
      if (errnoCode(e) === 'ENOENT') return false;
      throw ioError(`cannot release ${ip} in ${this.dir}`, e);
    }
    this.#fsyncDirQuietly();
    return true;
  }

  /**
   * host-local `ReleaseByID` over the IP-named files of DIR: the files whose Go-trimmed content is
   * exactly `TrimSpace(id) + "\r\n" + ifname`; if there are none, those whose content is exactly
   * `TrimSpace(id)` (legacy); plus, unlike upstream, LF-only records `id\nifname` of the same
   * owner (they count as owned everywhere else). Tries every matching file and then throws
   * `AppError('STORE_IO')` if any could not be removed.
   */
  async releaseByOwner(containerId: string, ifname: string): Promise<string[]> {
    this.#assertOpen();
    const id = goTrimSpace(containerId);
    const exact = id + LINE_BREAK + ifname;
    // Deliberate difference: a record written with a bare LF (`id\nifname`) is read as owned by
    // (id, ifname) everywhere else (ADD, CHECK, GC), so DEL releases it too; host-local skips it.
    // It does not change host-local's choice between exact and legacy records.
    const exactLF = id + '\n' + ifname;
    const exactHits: ScannedRecord[] = [];
    const legacyHits: ScannedRecord[] = [];
    const lfHits: ScannedRecord[] = [];
    for (const r of this.#scan(false)) {
      if (r.trimmed === exact) exactHits.push(r);
      else if (r.trimmed === exactLF) lfHits.push(r);
      else if (r.trimmed === id) legacyHits.push(r);
    }
    const hits = [...(exactHits.length > 0 ? exactHits : legacyHits), ...lfHits];
    const released: string[] = [];
    const failures: string[] = [];
    for (const r of hits) {
      try {
        unlinkSync(join(this.dir, r.ip));
        released.push(r.ip);
      } catch (e) {
        if (errnoCode(e) !== 'ENOENT') failures.push(`${r.ip}: ${describe(e)}`);
      }
    }
    if (released.length > 0) this.#fsyncDirQuietly();
    if (failures.length > 0) {
      throw new AppError('STORE_IO', `cannot release the reservations of ${id} ${ifname} in ${this.dir}: ${failures.join('; ')}`);
    }
    return released;
  }

  /** DIR exists and a file can be created in it now (probes with a temporary file). */
  async writable(): Promise<boolean> {
    this.#assertOpen();
    let tmp: string;
    try {
      if (!statSync(this.dir).isDirectory()) return false;
      tmp = this.#tempPath();
      closeSync(openSync(tmp, fsConstants.O_WRONLY | fsConstants.O_CREAT | fsConstants.O_EXCL, RESERVATION_FILE_MODE));
    } catch {
      return false;
    }
    unlinkQuietly(tmp);
    return true;
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    this.#releaseLock();
  }

  /** True while this store holds the lock. */
  get locked(): boolean {
    return this.#held !== null;
  }

  // ---------------------------------------------------------------------------------------------

  #what(): string {
    return `file store ${this.dir}`;
  }

  #assertOpen(): void {
    if (this.#closed) throw new ClosedError(this.#what());
  }

  #releaseLock(): void {
    const h = this.#held;
    this.#held = null;
    h?.release();
  }

  /**
   * Every IP-named regular file of DIR with its trimmed content. Skips other names and non-regular
   * files; removes temp leftovers when the lock is held. Files that vanish are skipped; other read
   * errors throw STORE_IO (an unreadable record must not be mistaken for garbage).
   */
  #scan(withMtime = true): ScannedRecord[] {
    let names: string[];
    try {
      names = readdirSync(this.dir);
    } catch (e) {
      if (errnoCode(e) === 'ENOENT') return [];
      throw ioError(`cannot list ${this.dir}`, e);
    }
    const out: ScannedRecord[] = [];
    const cleanTemps = this.#held !== null;
    const prefix = this.dir.endsWith('/') ? this.dir : `${this.dir}/`; // join() is measurably slower here
    for (const name of names) {
      if (!isCanonicalIPName(name)) {
        if (cleanTemps && name.startsWith(TEMP_PREFIX) && name.endsWith(TEMP_SUFFIX)) unlinkQuietly(prefix + name);
        continue;
      }
      const rec = this.#readRecord(prefix + name, withMtime);
      if (rec !== null) out.push({ ip: name, trimmed: rec.trimmed, mtimeMs: rec.mtimeMs });
    }
    return out;
  }

  /**
   * Read one record with one open/read(/fstat)/close into the reused buffer. Null when the file
   * is absent, not a regular file, or cannot be opened as one (a unix socket, a symlink loop or a
   * symlink through a non-directory: {@link UNOPENABLE}): host-local ignores such entries too,
   * their names stay taken (`link(2)` fails with EEXIST) and `doctor` reports them. `trimmed` is
   * null when the content is not decodable. `mtimeMs` is NaN unless `withMtime`.
   */
  #readRecord(path: string, withMtime: boolean): { trimmed: string | null; mtimeMs: number } | null {
    let fd: number;
    try {
      // O_NONBLOCK: a FIFO under an IP name must not hang the plugin.
      fd = openSync(path, fsConstants.O_RDONLY | fsConstants.O_NONBLOCK);
    } catch (e) {
      const code = errnoCode(e);
      if (code === 'ENOENT' || (code !== undefined && UNOPENABLE.has(code))) return null;
      throw ioError(`cannot read ${path}`, e);
    }
    try {
      let mtimeMs = Number.NaN;
      if (withMtime) {
        const st = fstatSync(fd);
        if (!st.isFile()) return null;
        mtimeMs = st.mtimeMs;
      }
      const buf = this.#buf;
      const n = readRecordHead(fd, buf);
      // Empty (a FIFO reads as empty) or longer than the buffer (a device reads on and on): only a
      // regular file is a record. Without `withMtime` this costs an fstat only in these rare cases.
      if ((n === 0 || n === buf.length) && !withMtime && !fstatSync(fd).isFile()) return null;
      const text = n === buf.length ? readLongRecord(fd, buf) : decodeBuffer(buf, n);
      return { trimmed: text === null ? null : goTrimSpace(text), mtimeMs };
    } catch (e) {
      const code = errnoCode(e);
      if (code === 'EISDIR' || code === 'EAGAIN' || code === 'EINVAL') return null;
      throw ioError(`cannot read ${path}`, e);
    } finally {
      try {
        closeSync(fd);
      } catch {
        // read-only descriptor: nothing is lost
      }
    }
  }


  #tempPath(): string {
    // Unique among live writers (pid) and within this process (counter); a leftover of a dead
    // process with a reused pid is caught by O_EXCL in #writeTemp, which then tries another name.
    tempCounter += 1;
    return join(this.dir, `${TEMP_PREFIX}${process.pid}-${Date.now().toString(36)}${tempCounter.toString(36)}${TEMP_SUFFIX}`);
  }

  /**
   * Write `content` to a new temp file in DIR with `mode`, fsync it unless `sync` is false, close
   * it; returns its path.
   */
  async #writeTemp(content: string, mode: number, sync = true): Promise<string> {
    let tmp = this.#tempPath();
    let fd: number;
    for (let attempt = 0; ; attempt++) {
      try {
        fd = openSync(tmp, fsConstants.O_WRONLY | fsConstants.O_CREAT | fsConstants.O_EXCL, mode);
        break;
      } catch (e) {
        if (errnoCode(e) === 'EEXIST' && attempt < 100) {
          tmp = this.#tempPath();
          continue;
        }
        throw ioError(`cannot create a temporary file in ${this.dir}`, e);
      }
    }
    try {
      const data = textToBytes(content);
      let off = 0;
      while (off < data.length) off += writeSync(fd, data, off, data.length - off);
      if (sync) await this.#fsync(fd);
    } catch (e) {
      closeQuietly(fd);
      unlinkQuietly(tmp);
      throw ioError(`cannot write ${tmp}`, e);
    }
    try {
      closeSync(fd);
    } catch (e) {
      unlinkQuietly(tmp);
      throw ioError(`cannot write ${tmp}`, e);
    }
    return tmp;
  }

  /** fsync(2) of `fd`: here, or in the thread pool when opened with `fsyncOffThread`. Rejects as fsyncSync throws. */
  #fsync(fd: number): Promise<void> | void {
    if (!this.#fsyncOffThread) return fsyncSync(fd);
    return new Promise((resolve, reject) => fsyncCallback(fd, (e) => (e === null ? resolve() : reject(e))));
  }

  async #fsyncDir(): Promise<void> {
    const fd = openSync(this.dir, fsConstants.O_RDONLY | fsConstants.O_DIRECTORY);
    try {
      await this.#fsync(fd);
    } finally {
      closeQuietly(fd);
    }
  }

  /**
   * After a removal: durability of an unlink is not required (a lost one is a leak the reconciler
   * frees). Always synchronous, also with `fsyncOffThread`: a DEL's critical path is this one
   * fsync, and a trip through the thread pool made a burst of DELs slower on a loaded node.
   */
  #fsyncDirQuietly(): void {
    try {
      const fd = openSync(this.dir, fsConstants.O_RDONLY | fsConstants.O_DIRECTORY);
      try {
        fsyncSync(fd);
      } finally {
        closeQuietly(fd);
      }
    } catch {
      // see above
    }
  }
}

function assertIPName(ip: string): void {
  if (!isCanonicalIPName(ip)) throw new AppError('INTERNAL', `not the canonical text of an IP address: ${JSON.stringify(ip)}`);
}

function ioError(what: string, e: unknown): AppError {
  if (e instanceof AppError) return e;
  return new AppError('STORE_IO', `${what}: ${describe(e)}`, { cause: e });
}

/** This process's uid (fixed for its life: nothing here calls setuid), undefined where there is none. */
const OWN_UID = process.getuid?.();

/**
 * Overwrite the regular file `path` with `text` in place (see `FileStore.#writeLastReservedIP`):
 * true when done; false, having changed nothing, when it is missing, not a regular file with one
 * link owned by this process's uid and mode {@link LAST_RESERVED_IP_FILE_MODE}, or cannot be
 * opened (`O_WRONLY|O_NOFOLLOW|O_NONBLOCK`: never through a symlink, never blocking on a FIFO);
 * false after a failed or short write too (the caller then replaces the file). Never throws.
 */
function writeInPlace(path: string, text: string): boolean {
  let fd: number;
  try {
    fd = openSync(path, fsConstants.O_WRONLY | fsConstants.O_NOFOLLOW | fsConstants.O_NONBLOCK);
  } catch {
    return false;
  }
  try {
    const st = fstatSync(fd);
    if (!st.isFile() || st.nlink !== 1 || (st.mode & 0o7777) !== LAST_RESERVED_IP_FILE_MODE || st.uid !== (OWN_UID ?? st.uid)) return false;
    const data = textToBytes(text);
    if (writeSync(fd, data, 0, data.length, 0) !== data.length) return false;
    if (st.size > data.length) ftruncateSync(fd, data.length);
    return true;
  } catch {
    return false;
  } finally {
    closeQuietly(fd);
  }
}

/** Unlink `path`, ignoring errors; true when the name is gone (removed now, or ENOENT). */
function unlinkQuietly(path: string): boolean {
  try {
    unlinkSync(path);
    return true;
  } catch (e) {
    // already gone, or will be cleaned up as a temp leftover
    return errnoCode(e) === 'ENOENT';
  }
}


function describe(e: unknown): string {
  return e instanceof Error ? e.message : String(e);
}
