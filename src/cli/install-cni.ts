/**
 * `ipwarden install-cni --dest DIR [--socket PATH]` (docs/daemon.md "Installed files",
 * docs/cli.md): writes into the CNI bin directory DIR
 *
 * - `DIR/ipwarden-flock.node`: the native flock binding the standalone plugin loads from beside itself;
 * - `DIR/ipwarden-netns`: the static pinned-namespace reader of the kernel evidence (native/netns.c);
 * - `DIR/ipwarden-standalone`: the standalone plugin — one executable carrying its own Node (a Node
 *   single executable application made by `npm run build`, scripts/build.mjs), so the node needs no
 *   Node.js (issue 10); the whole program: the plugin when `CNI_COMMAND` is set, the CLI otherwise;
 * - `DIR/ipwarden`: the static C exec shim (`ipwarden-shim`, native/shim.c), which forwards each
 *   request to the daemon's socket and falls back to `DIR/ipwarden-standalone`; with
 *   `--socket PATH` the copy written has PATH in its patchable socket field.
 *
 * - `DIR/ipwarden.d/node-name` (mode 0644, in a directory 0755 made when missing), first, when a
 *   node name is given (`--node-name`, else `NODE_NAME`: the DaemonSet passes the downward API's
 *   `spec.nodeName` to the init container): the name the shim's fallback uses for cluster pools
 *   when the daemon is down (src/node/node-name.ts); without one the file is left as it is;
 * - `DIR/ipwarden.d/runtime-endpoint` (the same way, after it), when a runtime endpoint is given
 *   (`--runtime-endpoint`, else `CONTAINER_RUNTIME_ENDPOINT`): the node's CRI endpoint, which the
 *   plugin asks when its process ancestry finds no runtime (a Multus thick daemon runs it;
 *   src/cni/heal.ts); without one the file is left as it is;
 *
 * in that order (the shim last, so a runtime exec'ing `DIR/ipwarden` during an upgrade always finds
 * what it runs), each atomically: a temporary file in DIR created with O_EXCL|O_NOFOLLOW (never
 * through a symlink planted at its name), fsync, rename(2), fsync of DIR. A runtime sees the old or
 * the new file, never a partial one.
 *
 * One install at a time per DIR: {@link run} holds an exclusive flock on `DIR/.ipwarden-install.lock`
 * for the whole install, and first removes the temporaries an earlier, killed install left
 * ({@link removeStaleTemporaries}: a killed standalone copy is ~99 MB each time).
 *
 * The files come from the directory of the program running the install ({@link sourceDir}): `dist/`
 * of a built checkout, the image's `/usr/lib/ipwarden` when the single executable runs it, or an
 * installed CNI bin dir (where the shim is named `ipwarden`).
 */
import { hostname } from 'node:os';
import { spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { chmodSync, closeSync, constants, existsSync, fchmodSync, fsyncSync, lstatSync, mkdirSync, openSync, readdirSync, readFileSync, readlinkSync, readSync, renameSync, rmSync, statSync, unlinkSync, writeSync, type Stats } from 'node:fs';
import { lockExclusive, type HeldLock } from '../store/file/flock.ts';
import { createRequire } from 'node:module';
import { basename, dirname, isAbsolute, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { AppError, UsageError, errnoCode } from '../common/errors.ts';
import { untrustedReason } from '../common/trust.ts';
import { badNodeNameMessage, validNodeName } from '../ipam/pool-config.ts';
import { NODE_NAME_DIR, NODE_NAME_FILE, RUNTIME_ENDPOINT_FILE, nodeNameFilePath } from '../node/node-name.ts';
import { parseRuntimeEndpoint } from '../common/endpoint.ts';
import type { CliContext } from './context.ts';

const require = createRequire(import.meta.url);

/** File name of the native flock binding installed beside the plugin. */
export const FLOCK_BINDING_NAME = 'ipwarden-flock.node';
/** File name of the installed standalone Node plugin (the shim's fallback). */
export const STANDALONE_NAME = 'ipwarden-standalone';
/** File name of the installed shim: the name CNI configurations use (`"type": "ipwarden"`). */
export const PLUGIN_NAME = 'ipwarden';
/** File name of the built shim in dist/ (scripts/build.mjs). */
export const BUILT_SHIM_NAME = 'ipwarden-shim';

/** The shim's patchable socket-path field (native/shim.c): marker, path, NUL padding; 256 bytes. */
export const SOCKET_FIELD = { marker: 'IPWARDEN-SOCKET-PATH=', bytes: 256 } as const;
/** The shim's patchable timeout field: marker, decimal seconds (e.g. `150`, `0.5`), NUL padding; 32 bytes. */
export const TIMEOUT_FIELD = { marker: 'IPWARDEN-SHIM-TIMEOUT=', bytes: 32 } as const;
/**
 * The shim's patchable acknowledgement deadline (docs/daemon.md, protocol v2): how long it waits
 * for the daemon to acknowledge the request header before it runs the standalone plugin; decimal
 * seconds, NUL padding; 32 bytes. Default 3.
 */
export const ACK_TIMEOUT_FIELD = { marker: 'IPWARDEN-SHIM-ACK-TIMEOUT=', bytes: 32 } as const;
/** The socket path compiled into the shim (docs/daemon.md). */
export const DEFAULT_SOCKET = '/run/ipwarden/plugin.sock';
/** Longest socket path: `sun_path` is 108 bytes including the NUL (unix(7)). */
export const MAX_SOCKET_PATH_BYTES = 107;

/** File name of the pinned-namespace helper (native/netns.c), in dist/ and installed alike. */
export const NETNS_HELPER_NAME = 'ipwarden-netns';

/** True when this process is the single executable (a Node SEA), false under plain Node. */
export function runningAsSea(): boolean {
  try {
    return (require('node:sea') as { isSea(): boolean }).isSea();
  } catch {
    return false; // Node before 20.12 has no node:sea: never a SEA
  }
}

/**
 * The directory the files to install come from: the single executable's own directory when this
 * process is it (`process.execPath` is its real path), else the built `dist/` — beside this bundle,
 * or `<repo>/dist` when running from source. Throws UsageError when it holds no standalone
 * executable (the project was not built: `npm run build`).
 */
export function sourceDir(): string {
  let dir: string;
  if (runningAsSea()) dir = dirname(process.execPath);
  else {
    const here = fileURLToPath(import.meta.url);
    dir = here.endsWith('.ts') ? resolve(dirname(here), '../../dist') : dirname(here);
  }
  if (!existsSync(join(dir, STANDALONE_NAME))) throw new UsageError(`no ${STANDALONE_NAME} in ${dir}: run "npm run build" first (or copy the whole directory, not one file)`);
  return dir;
}

/**
 * Throw UsageError unless `file` — a file about to be copied into a CNI bin dir, where root execs
 * it — is a regular file (not a symlink) owned by root or the effective user in a directory of the
 * same owners, neither writable by group or others (src/common/trust.ts).
 */
export function checkTrusted(file: string, euid: number = process.geteuid?.() ?? 0): void {
  let st;
  try {
    st = lstatSync(file);
  } catch (e) {
    throw new UsageError(`install-cni: no ${basename(file)} in ${dirname(file)} (${errnoCode(e) ?? 'error'}): run "npm run build" first (or copy the whole directory, not one file)`);
  }
  if (!st.isFile()) throw new UsageError(`install-cni: ${file} is not a regular file: refusing to install it`);
  const bad = untrustedReason(file, st, euid) ?? untrustedReason(dirname(file), statSync(dirname(file)), euid);
  if (bad !== null) throw new UsageError(`install-cni: ${bad}: refusing to install from there`);
}

/**
 * The shim binary to install from `dir`: `ipwarden-shim` (dist/, the image), or an installed
 * `ipwarden` that is a shim (it holds the socket field's marker). Throws UsageError when there is
 * none (the project was not built: it needs gcc).
 */
export function locateShim(dir: string): string {
  const built = join(dir, BUILT_SHIM_NAME);
  if (existsSync(built)) return built;
  const installed = join(dir, PLUGIN_NAME);
  if (existsSync(installed) && readFileSync(installed).includes(SOCKET_FIELD.marker, 0, 'latin1')) return installed;
  throw new UsageError(`no exec shim ${built}: run "npm run build" first (it needs gcc)`);
}

/**
 * Check a `--socket` value: absolute, at most 107 bytes (UTF-8), no NUL. Returns it unchanged;
 * throws UsageError naming the rule it breaks.
 */
export function validateSocketPath(path: string): string {
  if (path.includes('\0')) throw new UsageError('install-cni: --socket must not contain a NUL byte');
  if (!path.startsWith('/')) throw new UsageError(`install-cni: --socket must be an absolute path (got ${JSON.stringify(path)})`);
  const n = Buffer.byteLength(path, 'utf8');
  if (n > MAX_SOCKET_PATH_BYTES) throw new UsageError(`install-cni: --socket is ${n} bytes long, at most ${MAX_SOCKET_PATH_BYTES} fit in a unix socket address`);
  return path;
}

/**
 * A copy of `binary` with the field that starts with `field.marker` holding `value` (UTF-8),
 * NUL-padded to `field.bytes`. Throws AppError('INTERNAL') unless the marker occurs exactly once
 * and the value leaves room for its NUL.
 */
export function patchField(binary: Uint8Array, field: { readonly marker: string; readonly bytes: number }, value: string): Buffer {
  const out: Buffer = Buffer.from(binary);
  const at = out.indexOf(field.marker, 0, 'latin1');
  if (at < 0 || out.indexOf(field.marker, at + 1, 'latin1') >= 0) {
    throw new AppError('INTERNAL', `the shim binary must hold the marker ${field.marker} exactly once (found ${at < 0 ? 'none' : 'several'})`);
  }
  const v = Buffer.from(value, 'utf8');
  const room = field.bytes - field.marker.length - 1;
  if (v.length === 0 || v.length > room || v.includes(0)) throw new AppError('INTERNAL', `a ${field.marker} value must be 1..${room} bytes without NUL`);
  if (at + field.bytes > out.length) throw new AppError('INTERNAL', `the ${field.marker} field runs past the end of the shim binary`);
  out.fill(0, at + field.marker.length, at + field.bytes);
  v.copy(out, at + field.marker.length);
  return out;
}

/** What a shim's patchable fields hold: `{ socket, timeout, ackTimeout }` (timeouts as their decimal text). */
export function readShimFields(binary: Uint8Array): { socket: string; timeout: string; ackTimeout: string } {
  const b = Buffer.from(binary.buffer, binary.byteOffset, binary.byteLength);
  const read = (field: { readonly marker: string; readonly bytes: number }): string => {
    const at = b.indexOf(field.marker, 0, 'latin1');
    if (at < 0) throw new AppError('INTERNAL', `no ${field.marker} field in the shim binary`);
    const start = at + field.marker.length;
    const end = b.indexOf(0, start);
    return b.toString('utf8', start, end < 0 || end > at + field.bytes ? at + field.bytes : end);
  };
  return { socket: read(SOCKET_FIELD), timeout: read(TIMEOUT_FIELD), ackTimeout: read(ACK_TIMEOUT_FIELD) };
}

/**
 * The shim with its fields patched: `socket` (validated as for `--socket`), `timeoutSeconds` (the
 * answer timeout) and `ackTimeoutSeconds` (the acknowledgement deadline; the shim uses the smaller
 * of the two for it), seconds, > 0, at most 3 decimals; tests use short ones. Absent ones keep the
 * compiled defaults (`/run/ipwarden/plugin.sock`, 150 s, 3 s). Throws UsageError or AppError('INTERNAL').
 */
export function patchShim(binary: Uint8Array, opts: { socket?: string; timeoutSeconds?: number; ackTimeoutSeconds?: number } = {}): Buffer {
  let out: Buffer = Buffer.from(binary);
  if (opts.socket !== undefined) out = patchField(out, SOCKET_FIELD, validateSocketPath(opts.socket));
  for (const [t, field, what] of [[opts.timeoutSeconds, TIMEOUT_FIELD, 'shim timeout'], [opts.ackTimeoutSeconds, ACK_TIMEOUT_FIELD, 'shim acknowledgement timeout']] as const) {
    if (t === undefined) continue;
    if (!Number.isFinite(t) || t <= 0 || t > 86_400 || Math.round(t * 1000) !== t * 1000) throw new UsageError(`${what} must be 0.001..86400 seconds with at most 3 decimals (got ${t})`);
    out = patchField(out, field, String(t));
  }
  return out;
}

/**
 * Run the installed executable once the way a runtime would (CNI VERSION) and throw
 * `AppError('INTERNAL')` with what it printed unless it answers with its supported versions.
 */
function selfCheck(target: string): void {
  const r = spawnSync(target, [], { input: '{"cniVersion":"1.0.0"}', env: { PATH: '/usr/bin:/bin', CNI_COMMAND: 'VERSION' }, encoding: 'utf8', timeout: 60_000 });
  const said = `${r.stdout ?? ''}${r.stderr ?? ''}`.trim().split('\n').slice(0, 3).join(' | ');
  let ok = false;
  try {
    ok = r.status === 0 && Array.isArray((JSON.parse(r.stdout) as { supportedVersions?: unknown }).supportedVersions);
  } catch {
    ok = false;
  }
  if (!ok) {
    throw new AppError('INTERNAL', `${target} does not run as a CNI plugin: ${said || String(r.error ?? r.status)}`);
  }
}

/**
 * What a standalone says it is (`ipwarden-standalone version`): `ipwarden 0.1.0, Node.js
 * v20.20.2`. Throws AppError('INTERNAL') when it does not answer, or cannot load the flock binding
 * beside it (a binding built for another Node ABI would fail every ADD with code 5).
 */
function standaloneVersion(target: string): string {
  const r = spawnSync(target, ['version'], { env: { PATH: '/usr/bin:/bin' }, encoding: 'utf8', timeout: 60_000 });
  const out = r.stdout ?? '';
  const ipw = /^ipwarden (\S+)$/m.exec(out);
  const node = /^Node\.js (\S+)$/m.exec(out);
  const flock = /^flock binding: (.*)$/m.exec(out);
  if (r.status !== 0 || ipw === null || node === null || flock === null) {
    throw new AppError('INTERNAL', `${target} does not answer "version": ${`${out}${r.stderr ?? ''}`.trim().split('\n').slice(0, 3).join(' | ') || String(r.error ?? r.status)}`);
  }
  if (flock[1] !== 'ok') throw new AppError('INTERNAL', `${target}: ${flock[1] as string}`);
  return `ipwarden ${ipw[1] as string}, Node.js ${node[1] as string}`;
}

/**
 * Write `data` — bytes, a string, or `{ copyOf: FILE }` (copied in 1 MiB chunks, never held whole
 * in memory: the standalone is ~100 MB) — to `path` atomically: a temporary file
 * `<path>.tmp-<pid>-<16 random hex digits>` in the same directory, created with
 * O_CREAT|O_EXCL|O_NOFOLLOW (a name already taken — another installer's file, a planted link —
 * is never followed nor removed: another random name is tried, 3 times), written, given `mode`
 * (fchmod: no umask), fsynced; then `verify(tmp)` (throws to refuse: the old file stays), rename
 * over `path`, fsync of the directory. Two installers at once (init containers are pid 1 each)
 * never share a temporary file. On failure the temporary file is removed and the error rethrown
 * (Node's errno errors; AppError('INTERNAL') when no name could be created).
 */
export function atomicWrite(path: string, data: Uint8Array | string | { readonly copyOf: string }, mode: number, verify?: (tmp: string) => void): void {
  const flags = constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW;
  let fd = -1;
  let tmp = '';
  for (let attempt = 0; fd < 0; attempt++) {
    tmp = `${path}.tmp-${process.pid}-${randomBytes(8).toString('hex')}`;
    try {
      fd = openSync(tmp, flags, 0o600);
    } catch (e) {
      if (errnoCode(e) !== 'EEXIST' || attempt >= 2) throw new AppError('INTERNAL', `install-cni: cannot create ${tmp}: ${e instanceof Error ? e.message : String(e)}`);
    }
  }
  try {
    if (typeof data === 'object' && 'copyOf' in data) copyInto(fd, data.copyOf);
    else {
      const b = typeof data === 'string' ? Buffer.from(data, 'utf8') : data;
      for (let off = 0; off < b.length; ) off += writeSync(fd, b, off, b.length - off);
    }
    fchmodSync(fd, mode);
    fsyncSync(fd);
    closeSync(fd);
    fd = -1;
    verify?.(tmp);
    renameSync(tmp, path);
  } catch (e) {
    if (fd >= 0) closeSync(fd);
    rmSync(tmp, { force: true });
    // An errno error of the writes (ENOSPC: a full disk) names the file, not only the call.
    if (e instanceof AppError || errnoCode(e) === undefined) throw e;
    throw new AppError('STORE_IO', `install-cni: cannot write ${path} (the old file, if any, is left as it was): ${errnoCode(e) as string}: ${e instanceof Error ? e.message.replace(/^[A-Z]+: /, '') : String(e)}`, { cause: e });
  }
  const dfd = openSync(dirname(path), constants.O_RDONLY | constants.O_DIRECTORY);
  try {
    fsyncSync(dfd);
  } finally {
    closeSync(dfd);
  }
}

/** Append the whole of regular file `src` to `fd` in 1 MiB chunks. */
function copyInto(fd: number, src: string): void {
  const inFd = openSync(src, constants.O_RDONLY);
  try {
    const buf = Buffer.allocUnsafe(1 << 20);
    for (;;) {
      const n = readSync(inFd, buf, 0, buf.length, null);
      if (n === 0) break;
      for (let off = 0; off < n; ) off += writeSync(fd, buf, off, n - off);
    }
  } finally {
    closeSync(inFd);
  }
}

/** What {@link installCni} wrote. */
export interface Installed {
  /** Path of the shim, `DIR/ipwarden` (what CNI configurations name). */
  readonly target: string;
  /** Path of the standalone plugin, `DIR/ipwarden-standalone`. */
  readonly standalone: string;
  /** What the standalone says it is: `ipwarden 0.1.0, Node.js v20.20.2`. */
  readonly standaloneVersion: string;
  /** Size of the standalone, bytes. */
  readonly standaloneBytes: number;
  /** Path of the flock binding, `DIR/ipwarden-flock.node`. */
  readonly binding: string;
  /** Path of the namespace helper, `DIR/ipwarden-netns`. */
  readonly netnsHelper: string;
  /** The socket path in the installed shim's field. */
  readonly socket: string;
  /** The node-name file written (`DIR/ipwarden.d/node-name`) and the name in it, or null when no name was given. */
  readonly nodeName: { readonly file: string; readonly name: string } | null;
  /** The runtime endpoint record written (`DIR/ipwarden.d/runtime-endpoint`) and the endpoint (`unix:///…`), or null when none was given. */
  readonly runtimeEndpoint: { readonly file: string; readonly url: string } | null;
}

/** Options of {@link installCni}. */
export interface InstallOptions {
  /** Socket path patched into the shim (validated: absolute, ≤ 107 bytes, no NUL); default the compiled one. */
  readonly socket?: string;
  /**
   * The node name written to `DIR/ipwarden.d/node-name` (validated: the node-name rule of
   * `ipam.nodeName`); absent: the file is not written (nor removed).
   */
  readonly nodeName?: string;
  /**
   * The node's CRI endpoint (`unix:///path` or `/path`; recorded as `unix:///path`) written to
   * `DIR/ipwarden.d/runtime-endpoint`; absent: the file is not written (nor removed).
   */
  readonly runtimeEndpoint?: string;
}

/**
 * Write `name` to `<dir>/ipwarden.d/node-name` atomically (mode 0644, `name` + newline +
 * `host <host name>` + newline: a copy of the file on another host is then ignored), making
 * `<dir>/ipwarden.d` (0755) when missing. Throws UsageError when `ipwarden.d` is not a real
 * directory (a symlink is refused, never followed) or is not to be trusted (src/common/trust.ts),
 * errno errors of the writes. Returns the file's path.
 */
export function writeNodeName(dir: string, name: string, euid: number = process.geteuid?.() ?? 0, host: () => string = hostname): string {
  return writeRecord(dir, NODE_NAME_FILE, name, 'the node name', euid, host);
}

/**
 * Write the runtime endpoint record `<dir>/ipwarden.d/runtime-endpoint` as {@link writeNodeName}
 * writes the node-name file: `url` (`unix:///path`) + newline + `host <host name>` + newline, mode
 * 0644, atomically. Same errors. Returns the file's path.
 */
export function writeRuntimeEndpoint(dir: string, url: string, euid: number = process.geteuid?.() ?? 0, host: () => string = hostname): string {
  return writeRecord(dir, RUNTIME_ENDPOINT_FILE, url, 'the runtime endpoint', euid, host);
}

/** The content install-cni gives a record (`ipwarden.d/<name>`): the value, then the writing host's name. */
export function recordContent(value: string, host: () => string = hostname): string {
  return `${value}\nhost ${host()}\n`;
}

/** Write `<dir>/ipwarden.d/<name>` (see {@link writeNodeName}); `what` names the value in errors. */
function writeRecord(dir: string, name: string, value: string, what: string, euid: number, host: () => string): string {
  const d = join(dir, NODE_NAME_DIR);
  try {
    mkdirSync(d, { mode: 0o755 });
    chmodSync(d, 0o755); // no umask
  } catch (e) {
    if (errnoCode(e) !== 'EEXIST') throw e;
  }
  const st = lstatSync(d);
  if (!st.isDirectory()) throw new UsageError(`install-cni: ${d} is not a directory (a symlink is not followed): refusing to write ${what} there`);
  const bad = untrustedReason(d, st, euid);
  if (bad !== null) throw new UsageError(`install-cni: ${bad}: refusing to write ${what} there`);
  const file = join(d, name);
  atomicWrite(file, recordContent(value, host), 0o644);
  return file;
}

/**
 * Check a runtime endpoint for the record: `unix:///path` or `/path` with an absolute path of at
 * most 107 bytes (`sun_path`), no NUL or newline. Returns it as `unix:///path`; throws UsageError.
 */
export function validateRecordedEndpoint(value: string): string {
  let url: string;
  let path: string;
  try {
    ({ url, path } = parseRuntimeEndpoint(value));
  } catch (e) {
    throw new UsageError(`install-cni: the runtime endpoint (--runtime-endpoint or CONTAINER_RUNTIME_ENDPOINT): ${e instanceof Error ? e.message : String(e)}`);
  }
  if (/[\0\n\r]/.test(url)) throw new UsageError(`install-cni: the runtime endpoint (--runtime-endpoint or CONTAINER_RUNTIME_ENDPOINT) must not contain a NUL byte or a line break, got ${JSON.stringify(value)}`);
  const n = Buffer.byteLength(path, 'utf8');
  if (n > MAX_SOCKET_PATH_BYTES) throw new UsageError(`install-cni: the runtime endpoint's socket path is ${n} bytes long, at most ${MAX_SOCKET_PATH_BYTES} fit in a unix socket address`);
  return url;
}

/**
 * The real path of the install destination `dest`, walked from `/` one name at a time with
 * `lstat` so that root writes only where nobody but root (or the effective user) could have put
 * or moved anything: every directory on the way must be owned by root or `euid` and writable by
 * neither others nor a group other than root's (gid 0) — except a root-owned sticky one (`/tmp`) above the last, where others
 * cannot rename what is not theirs — and `dest` itself such a directory (not sticky-writable: a
 * user could plant the lock file or `ipwarden.d` there as a symlink). A symlink on the way is
 * followed only when root or `euid` owns it (then only they made it: its directory is trusted);
 * at most 40. `dest` need not exist when `allowMissing` (its parent must): the result is then the
 * path it will have. Throws UsageError naming the first name that breaks the rule.
 */
export function trustedDestination(dest: string, euid: number = process.geteuid?.() ?? 0, allowMissing = false): string {
  const refuse = (why: string): never => {
    throw new UsageError(`install-cni: ${why}: refusing to install there (--dest ${dest})`);
  };
  let todo = resolve(dest).split('/').filter((x) => x !== '');
  let at = '/';
  let hops = 0;
  const checkDir = (p: string, st: { uid: number; gid: number; mode: number }, last: boolean): void => {
    if (st.uid !== 0 && st.uid !== euid) refuse(`${p} is owned by uid ${st.uid}`);
    const sticky = (st.mode & 0o1000) !== 0 && st.uid === 0;
    // Writable by its group only when that group is root's (gid 0): some hosts ship /opt/cni/bin 0775 root:root.
    const open = (st.mode & 0o002) !== 0 || ((st.mode & 0o020) !== 0 && st.gid !== 0);
    if (open && (last || !sticky)) refuse(`${p} is writable by group or others (mode ${(st.mode & 0o7777).toString(8)})`);
  };
  checkDir('/', lstatSync('/'), todo.length === 0);
  while (todo.length > 0) {
    const name = todo.shift() as string;
    if (name === '.') continue;
    if (name === '..') {
      at = dirname(at);
      continue;
    }
    const p = join(at, name);
    let st;
    try {
      st = lstatSync(p);
    } catch (e) {
      if (errnoCode(e) === 'ENOENT' && allowMissing && todo.length === 0) return p;
      if (errnoCode(e) === 'ENOENT') refuse(`${p} does not exist`);
      throw e;
    }
    if (st.isSymbolicLink()) {
      if (st.uid !== 0 && st.uid !== euid) refuse(`${p} is a symlink owned by uid ${st.uid} (not followed)`);
      if (++hops > 40) refuse(`${p}: too many symlinks`);
      const target = readlinkSync(p);
      todo = [...target.split('/').filter((x) => x !== ''), ...todo];
      if (isAbsolute(target)) {
        at = '/';
      }
      continue;
    }
    if (!st.isDirectory()) refuse(`${p} is not a directory`);
    checkDir(p, st, todo.length === 0);
    at = p;
  }
  return at;
}

/**
 * Install into `dest` (see the module comment). Throws UsageError for a bad `dest` or `socket`,
 * or when the project has not been built; AppError('INTERNAL') when an installed program does not
 * answer CNI VERSION; errno errors of the writes.
 */
export function installCni(dest: string, opts: InstallOptions = {}): Installed {
  if (dest === '') throw new UsageError('install-cni: --dest DIR is required');
  if (opts.socket !== undefined) validateSocketPath(opts.socket);
  if (opts.nodeName !== undefined && !validNodeName(opts.nodeName)) throw new UsageError(`install-cni: ${badNodeNameMessage('the node name (--node-name or NODE_NAME)', opts.nodeName)}`);
  const endpointUrl = opts.runtimeEndpoint === undefined ? undefined : validateRecordedEndpoint(opts.runtimeEndpoint);
  const from = sourceDir();
  const files = { binding: join(from, FLOCK_BINDING_NAME), netns: join(from, NETNS_HELPER_NAME), standalone: join(from, STANDALONE_NAME) };
  const shimSource = locateShim(from);
  for (const f of [...Object.values(files), shimSource]) checkTrusted(f);
  const shim = patchShim(readFileSync(shimSource), opts.socket === undefined ? {} : { socket: opts.socket });
  // DIR itself is created when missing, but not its parents: a typo in --dest must not go unnoticed.
  const parent = dirname(resolve(dest));
  if (!existsSync(parent)) throw new UsageError(`install-cni: ${parent} does not exist (--dest ${dest})`);
  // A file in its place (a package that put one there): say so, not ENOTDIR from a deeper write.
  if (existsSync(dest) && !statSync(dest).isDirectory()) throw new UsageError(`install-cni: ${dest} is not a directory (--dest)`);
  // Only where nobody but root could plant a symlink or swap a directory on the way: then no
  // write below follows one root did not make, nor lands outside DIR (trustedDestination).
  const real = trustedDestination(dest, process.geteuid?.() ?? 0, true);
  try {
    mkdirSync(real, { mode: 0o755 });
  } catch (e) {
    if (errnoCode(e) !== 'EEXIST') throw e;
  }
  const dir = trustedDestination(real);
  const bindingOut = join(dir, FLOCK_BINDING_NAME);
  const netnsOut = join(dir, NETNS_HELPER_NAME);
  const standalone = join(dir, STANDALONE_NAME);
  // The node name first: a fallback run after this install names the node as the daemon does.
  const nodeName = opts.nodeName === undefined ? null : { file: writeNodeName(dir, opts.nodeName), name: opts.nodeName };
  // Then the node's runtime endpoint: a fallback run exec'd by a Multus thick daemon asks it.
  const runtimeEndpoint = endpointUrl === undefined ? null : { file: writeRuntimeEndpoint(dir, endpointUrl), url: endpointUrl };
  // The same file (a directory installed onto itself): a regular file at the destination with the
  // source's device and inode. Anything else — a symlink to the source included — is rewritten.
  const same = (src: string, out: string): boolean => {
    try {
      const a = lstatSync(src);
      const b = lstatSync(out);
      return b.isFile() && a.dev === b.dev && a.ino === b.ino;
    } catch {
      return false;
    }
  };
  if (!same(files.binding, bindingOut)) atomicWrite(bindingOut, { copyOf: files.binding }, 0o755);
  if (!same(files.netns, netnsOut)) atomicWrite(netnsOut, { copyOf: files.netns }, 0o755);
  // The standalone is checked before it replaces the old one: it answers CNI VERSION and "version",
  // and loads the flock binding beside it (the binding is in place already).
  let version = '';
  const checkStandalone = (f: string): void => {
    selfCheck(f);
    version = standaloneVersion(f);
  };
  if (!same(files.standalone, standalone)) atomicWrite(standalone, { copyOf: files.standalone }, 0o755, checkStandalone);
  else checkStandalone(standalone);
  const target = join(dir, PLUGIN_NAME);
  atomicWrite(target, shim, 0o755, selfCheck);
  return {
    target,
    standalone,
    standaloneVersion: version,
    standaloneBytes: statSync(standalone).size,
    binding: bindingOut,
    netnsHelper: netnsOut,
    socket: readShimFields(shim).socket,
    nodeName,
    runtimeEndpoint,
  };
}

/** One file {@link installCni} writes: its path in DIR, its permission bits and its exact content. */
export interface PlannedFile {
  /** Path relative to DIR: `ipwarden`, `ipwarden-standalone`, `ipwarden.d/node-name`, … */
  readonly name: string;
  /** Permission bits it is given (0755 for programs, 0644 for the records). */
  readonly mode: number;
  /** Its bytes, or the source file it is a copy of (the standalone: ~100 MB, never held in memory). */
  readonly content: Buffer | { readonly copyOf: string };
}

/**
 * What {@link installCni}`(dest, opts)` writes, file by file, without writing anything: the
 * records (node name, runtime endpoint) when given, the flock binding, the namespace helper and
 * the standalone as copies of the files in {@link sourceDir}, and the shim with its socket field
 * patched. The daemon's watch (`--cni-bin-dir`, src/daemon/install-watch.ts) compares the
 * installed files with it. Throws as {@link installCni} does for bad options or an unbuilt project,
 * and UsageError when the source directory is `dest` itself (a file replaced there would be its
 * own source).
 */
export function installPlan(dest: string, opts: InstallOptions = {}): PlannedFile[] {
  if (opts.socket !== undefined) validateSocketPath(opts.socket);
  if (opts.nodeName !== undefined && !validNodeName(opts.nodeName)) throw new UsageError(`install-cni: ${badNodeNameMessage('the node name (--node-name or NODE_NAME)', opts.nodeName)}`);
  const from = sourceDir();
  if (resolve(from) === resolve(dest)) throw new UsageError(`install-cni: ${dest} is the directory this program runs from: its installed files cannot be checked against themselves`);
  const out: PlannedFile[] = [];
  if (opts.nodeName !== undefined) out.push({ name: `${NODE_NAME_DIR}/${NODE_NAME_FILE}`, mode: 0o644, content: Buffer.from(recordContent(opts.nodeName)) });
  if (opts.runtimeEndpoint !== undefined) out.push({ name: `${NODE_NAME_DIR}/${RUNTIME_ENDPOINT_FILE}`, mode: 0o644, content: Buffer.from(recordContent(validateRecordedEndpoint(opts.runtimeEndpoint))) });
  for (const name of [FLOCK_BINDING_NAME, NETNS_HELPER_NAME, STANDALONE_NAME]) out.push({ name, mode: 0o755, content: { copyOf: join(from, name) } });
  out.push({ name: PLUGIN_NAME, mode: 0o755, content: patchShim(readFileSync(locateShim(from)), opts.socket === undefined ? {} : { socket: opts.socket }) });
  return out;
}

/**
 * The command that runs `ipwarden install-cni --dest <dest>` with `opts` as flags, with this very
 * program: the single executable itself, or Node with this bundle (or source entry) — the same
 * code, the same source files as {@link installPlan}. The daemon's watch runs it to reinstall.
 */
export function installArgv(dest: string, opts: InstallOptions = {}): string[] {
  const self = runningAsSea() ? [process.execPath] : [process.execPath, ...process.execArgv, process.argv[1] as string];
  return [
    ...self,
    'install-cni',
    '--dest',
    dest,
    ...(opts.socket === undefined ? [] : ['--socket', opts.socket]),
    ...(opts.nodeName === undefined ? [] : ['--node-name', opts.nodeName]),
    ...(opts.runtimeEndpoint === undefined ? [] : ['--runtime-endpoint', opts.runtimeEndpoint]),
  ];
}

/** `lstat` of `p`, or null when there is nothing there. */
function lstatSafe(p: string): Stats | null {
  try {
    return lstatSync(p);
  } catch (e) {
    if (errnoCode(e) === 'ENOENT') return null;
    throw e;
  }
}

/** The lock file `run` holds in DIR for the whole install (one install-cni at a time per DIR). */
export const INSTALL_LOCK_NAME = '.ipwarden-install.lock';

/** How long an install waits for another one in the same DIR, seconds. */
const INSTALL_LOCK_TIMEOUT_SECONDS = 300;

/**
 * The names {@link atomicWrite} gives its temporaries for the files install-cni writes:
 * `<name>.tmp-<pid>-<16 hex digits>`.
 */
const STALE_TEMP = /^(ipwarden|ipwarden-flock\.node|ipwarden-netns|ipwarden-standalone)\.tmp-\d+-[0-9a-f]{16}$/;
const STALE_NODE_NAME_TEMP = /^(node-name|runtime-endpoint)\.tmp-\d+-[0-9a-f]{16}$/;

/**
 * Remove the temporaries an install killed mid-write left in `dir` (and `dir/ipwarden.d`): only
 * names of exactly {@link atomicWrite}'s pattern for the files install-cni writes, only regular
 * files (lstat: a symlink or anything else is left alone, never followed) owned by `euid`. Call
 * it only while holding `dir`'s {@link INSTALL_LOCK_NAME}: then no install is writing one.
 * Returns what was removed, with sizes in bytes. Errors of a single removal are skipped (the next
 * install tries again).
 */
export function removeStaleTemporaries(dir: string, euid: number = process.geteuid?.() ?? 0): Array<{ path: string; bytes: number }> {
  const out: Array<{ path: string; bytes: number }> = [];
  const sweep = (d: string, pattern: RegExp): void => {
    let names: string[];
    try {
      names = readdirSync(d);
    } catch {
      return;
    }
    for (const name of names.filter((n) => pattern.test(n)).sort()) {
      const p = join(d, name);
      try {
        const st = lstatSync(p);
        if (!st.isFile() || st.uid !== euid) continue;
        unlinkSync(p);
        out.push({ path: p, bytes: st.size });
      } catch {
        // Gone already, or not removable: left for the next install.
      }
    }
  };
  sweep(dir, STALE_TEMP);
  sweep(dirname(nodeNameFilePath(dir)), STALE_NODE_NAME_TEMP);
  return out;
}

/**
 * CLI action: install, then print one line per file written. The node name is `--node-name`,
 * else `NODE_NAME` of the environment; the runtime endpoint `--runtime-endpoint`, else
 * `CONTAINER_RUNTIME_ENDPOINT` (empty = unset).
 */
export async function run(opts: { dest?: string; socket?: string; nodeName?: string; runtimeEndpoint?: string }, ctx: CliContext): Promise<number> {
  const fromEnv = ctx.env['NODE_NAME'];
  const nodeName = opts.nodeName ?? (fromEnv === undefined || fromEnv === '' ? undefined : fromEnv);
  const endpointEnv = ctx.env['CONTAINER_RUNTIME_ENDPOINT'];
  const runtimeEndpoint = opts.runtimeEndpoint ?? (endpointEnv === undefined || endpointEnv === '' ? undefined : endpointEnv);
  const dest = opts.dest ?? '';
  let lock: HeldLock | null = null;
  let real = '';
  if (dest !== '' && existsSync(dest) && statSync(dest).isDirectory()) {
    // Only in a trusted directory (the lock file is opened following symlinks: only root could
    // have put one there). One install at a time in DIR; then every temporary of ours in it is an
    // earlier install's.
    real = trustedDestination(dest);
    const lockPath = join(real, INSTALL_LOCK_NAME);
    const had = lstatSafe(lockPath);
    if (had !== null && !had.isFile()) throw new UsageError(`install-cni: ${lockPath} is not a regular file (a symlink is not followed): refusing to lock it`);
    lock = await lockExclusive(lockPath, INSTALL_LOCK_TIMEOUT_SECONDS);
  }
  let r: Installed;
  try {
    if (lock !== null) for (const x of removeStaleTemporaries(real)) ctx.stdout(`removed ${x.path} (a temporary a killed install left, ${x.bytes} bytes)\n`);
    r = installCni(dest, { ...(opts.socket === undefined ? {} : { socket: opts.socket }), ...(nodeName === undefined ? {} : { nodeName }), ...(runtimeEndpoint === undefined ? {} : { runtimeEndpoint }) });
  } finally {
    lock?.release();
  }
  // In the order written.
  if (r.nodeName !== null) ctx.stdout(`installed ${r.nodeName.file} (node name ${r.nodeName.name})\n`);
  if (r.runtimeEndpoint !== null) ctx.stdout(`installed ${r.runtimeEndpoint.file} (runtime endpoint ${r.runtimeEndpoint.url})\n`);
  ctx.stdout(`installed ${r.binding} (flock binding)\n`);
  ctx.stdout(`installed ${r.netnsHelper} (namespace helper)\n`);
  ctx.stdout(`installed ${r.standalone} (${r.standaloneVersion}, ${r.standaloneBytes} bytes)\n`);
  ctx.stdout(`installed ${r.target} (exec shim, protocol v2, socket ${r.socket})\n`);
  return 0;
}
