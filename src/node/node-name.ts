/**
 * The node-name file beside the installed plugin (docs/cluster.md "The node name"):
 * `<CNI bin dir>/ipwarden.d/node-name`, written by `ipwarden install-cni` from the DaemonSet's
 * `NODE_NAME` (the downward API's `spec.nodeName`, in the init container). When the daemon is down
 * the shim's fallback runs the standalone plugin with the runtime's environment, which has no
 * `NODE_NAME`; without this file it named the node by its host name, and a node whose host name
 * differs from its Kubernetes node name held blocks under two names (issue 11, task POOLOBS).
 *
 * The file is read only when it is to be trusted, by the rule for the files root runs from a CNI
 * bin dir (src/common/trust.ts): the directory is a real directory (a symlink is not followed) and
 * the file a regular file opened with O_NOFOLLOW, both owned by root (or the effective user) and
 * writable by neither group nor others. Anything else — and content that is not one node name
 * (`validNodeName`, one optional trailing newline) — is `IPAM_INVALID_CONFIG` (CNI 7) naming the
 * file: a name from a file anyone could have written would let them pick the node's blocks.
 *
 * The runtime endpoint record `<CNI bin dir>/ipwarden.d/runtime-endpoint` (issue 19 item 5,
 * Multus thick) is written by `install-cni` the same way (the endpoint, then `host <host name>`)
 * and read under the same rules ({@link readRuntimeEndpointFile}), except that one which cannot be
 * used is ignored, with the reason, instead of failing the request: without it the plugin does
 * what it did before the record existed.
 */
import { closeSync, constants, fstatSync, lstatSync, openSync, readSync } from 'node:fs';
import { hostname } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { AppError, errnoCode } from '../common/errors.ts';
import { untrustedReason } from '../common/trust.ts';
import { parseRuntimeEndpoint } from '../common/endpoint.ts';
import { badNodeNameMessage, validNodeName, type PoolConfig } from '../ipam/pool-config.ts';

/** The directory beside the installed plugin that holds ipwarden's own small files. */
export const NODE_NAME_DIR = 'ipwarden.d';
/** The node-name file's name in {@link NODE_NAME_DIR}. */
export const NODE_NAME_FILE = 'node-name';
/** The runtime endpoint record's name in {@link NODE_NAME_DIR} ({@link readRuntimeEndpointFile}). */
export const RUNTIME_ENDPOINT_FILE = 'runtime-endpoint';
/**
 * Largest record read (the node-name file, the runtime endpoint record), bytes (a node name is at
 * most 253, a socket path at most 107; more is not one).
 */
export const NODE_NAME_FILE_MAX_BYTES = 512;

/** Longest unix socket path, bytes: `sun_path` is 108 bytes including the NUL (unix(7)). */
const SUN_PATH_MAX_BYTES = 107;

/** The path of the node-name file in the CNI bin dir `binDir`. */
export function nodeNameFilePath(binDir: string): string {
  return join(binDir, NODE_NAME_DIR, NODE_NAME_FILE);
}

/** The path of the runtime endpoint record in the CNI bin dir `binDir`. */
export function runtimeEndpointFilePath(binDir: string): string {
  return join(binDir, NODE_NAME_DIR, RUNTIME_ENDPOINT_FILE);
}

/** One record read under the trust rules: its path, its first line, and the host of its `host` line (null: none). */
interface RawRecord {
  readonly file: string;
  readonly value: string;
  readonly host: string | null;
}

/**
 * Read the record `<dir>/ipwarden.d/<name>` under the trust rules of the module comment: null when
 * there is no such directory or file; else its first line and the host name of its optional second
 * line `host <host name>`. `label` names the record in errors (`the node name file`).
 * @throws AppError IPAM_INVALID_CONFIG naming the file or directory when it is not to be trusted,
 *   cannot be read, is larger than {@link NODE_NAME_FILE_MAX_BYTES}, has more than 2 lines or a
 *   second line that is not `host <host name>`.
 */
function readRecord(name: string, label: string, opts: { readonly dir?: string; readonly euid?: number }): RawRecord | null {
  const euid = opts.euid ?? process.geteuid?.() ?? 0;
  const bad = (what: string, why: string): AppError => new AppError('IPAM_INVALID_CONFIG', `${label} ${what}: ${why}`);
  let dir: string;
  try {
    dir = opts.dir ?? dirname(fileURLToPath(import.meta.url));
  } catch {
    return null; // the program has no file location: no file beside it
  }
  const d = join(dir, NODE_NAME_DIR);
  let dst;
  try {
    dst = lstatSync(d);
  } catch (e) {
    if (errnoCode(e) === 'ENOENT' || errnoCode(e) === 'ENOTDIR') return null;
    throw bad(d, `cannot stat it: ${errnoCode(e) ?? String(e)}`);
  }
  if (!dst.isDirectory()) throw bad(d, 'is not a directory (a symlink is not followed)');
  const dirBad = untrustedReason(d, dst, euid);
  if (dirBad !== null) throw bad(d, dirBad);
  const f = join(d, name);
  let fd: number;
  try {
    fd = openSync(f, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
  } catch (e) {
    const code = errnoCode(e);
    if (code === 'ENOENT') return null;
    throw bad(f, code === 'ELOOP' ? 'is a symlink (not followed)' : `cannot open it: ${code ?? String(e)}`);
  }
  try {
    const st = fstatSync(fd);
    if (!st.isFile()) throw bad(f, 'is not a regular file');
    const fileBad = untrustedReason(f, st, euid);
    if (fileBad !== null) throw bad(f, fileBad);
    if (st.size > NODE_NAME_FILE_MAX_BYTES) throw bad(f, `is ${st.size} bytes long, at most ${NODE_NAME_FILE_MAX_BYTES}`);
    const buf = Buffer.alloc(NODE_NAME_FILE_MAX_BYTES + 1);
    let n = 0;
    for (let got = -1; got !== 0 && n < buf.length; n += got) got = readSync(fd, buf, n, buf.length - n, n);
    if (n > NODE_NAME_FILE_MAX_BYTES) throw bad(f, `is longer than ${NODE_NAME_FILE_MAX_BYTES} bytes`);
    const text = buf.toString('utf8', 0, n);
    const lines = (text.endsWith('\n') ? text.slice(0, -1) : text).split('\n');
    const value = lines[0] as string;
    if (lines.length > 2) throw bad(f, `has ${lines.length} lines, at most 2 (${label === NODE_NAME_LABEL ? 'the node name' : 'the value'}, "host <host name>")`);
    if (lines.length < 2) return { file: f, value, host: null };
    // The rest of the line: a kernel host name may hold spaces (`hostname "my host"`), and
    // install-cni writes it as it is (a hostile review: such a node's records were refused).
    const m = /^host (.+)$/.exec(lines[1] as string);
    if (m === null) throw bad(f, `line 2 must be "host <host name>", got ${JSON.stringify(lines[1])}`);
    return { file: f, value, host: m[1] as string };
  } finally {
    closeSync(fd);
  }
}

const NODE_NAME_LABEL = 'the node name file';

/**
 * The node name in `<dir>/ipwarden.d/node-name`, or null when there is no such directory or file.
 * The file is the name and, on a second line, `host <host name>` of the host that wrote it
 * (install-cni writes both); a file whose host line names another host than `opts.host()`
 * (default: the kernel's host name — the DaemonSet's init container runs in the host's network
 * and UTS namespaces) was copied from another node and is ignored (null). A file without the host
 * line (one name) is used as it is.
 * `opts.dir` (default: the running program's directory — the CNI bin dir for the installed
 * standalone, `dist/` for the built bundle) and `opts.euid` (default `process.geteuid()`) are for
 * tests.
 * @throws AppError IPAM_INVALID_CONFIG (CNI 7) naming the file or directory when it is not to be
 *   trusted (see the module comment), cannot be read, is larger than
 *   {@link NODE_NAME_FILE_MAX_BYTES}, or does not hold one valid node name.
 */
/**
 * The node-name file as written, host line included, for the daemon's agreement check
 * (src/daemon/node-name-check.ts): null when there is none; else its path, the node name and the
 * host of its `host` line (null: none) — also when that host is not this one ({@link readNodeNameFile}
 * ignores such a file). Same options and errors as {@link readNodeNameFile}.
 */
export function nodeNameFileRecord(opts: { readonly dir?: string; readonly euid?: number } = {}): { readonly file: string; readonly name: string; readonly host: string | null } | null {
  const r = readRecord(NODE_NAME_FILE, NODE_NAME_LABEL, opts);
  if (r === null) return null;
  if (!validNodeName(r.value)) throw new AppError('IPAM_INVALID_CONFIG', badNodeNameMessage(`the node name file ${r.file}`, r.value));
  return { file: r.file, name: r.value, host: r.host };
}

export function readNodeNameFile(opts: { readonly dir?: string; readonly euid?: number; readonly host?: () => string } = {}): string | null {
  const r = readRecord(NODE_NAME_FILE, NODE_NAME_LABEL, opts);
  if (r === null) return null;
  if (!validNodeName(r.value)) throw new AppError('IPAM_INVALID_CONFIG', badNodeNameMessage(`the node name file ${r.file}`, r.value));
  // Written on another host (a cloned node image, a copied CNI bin dir): not this node's name.
  // Ignored, so the fallback names the node by its host name as without the file, until this
  // node's init container writes its own (review B2: a clone allocated as the source node).
  if (r.host !== null && r.host !== (opts.host ?? hostname)()) return null;
  return r.value;
}

/** What {@link readRuntimeEndpointFile} found. */
export type RecordedEndpoint =
  /** A usable record: the endpoint (`unix:///path`) and the record's path. */
  | { readonly url: string; readonly path: string; readonly file: string }
  /** A record that is not used, and why (one clause naming the record). */
  | { readonly ignored: string };

/**
 * The node's runtime endpoint recorded by `install-cni` in `<dir>/ipwarden.d/runtime-endpoint`
 * (`unix:///path` or `/path`, then `host <host name>` of the host that wrote it), for the plugin
 * whose ancestry finds no runtime (a Multus thick daemon runs it; src/cni/heal.ts). null when there
 * is no such directory or file. Read under the same trust rules as the node-name file, but a record
 * that cannot be used never fails a request: it is `{ignored: why}` and the plugin behaves as
 * without it. Ignored: a directory or file not to be trusted (module comment), unreadable, too
 * large, more than 2 lines, no `host` line (a record is used only on the host that wrote it), a
 * host line naming another host than `opts.host()` (default: the kernel's host name), a first line
 * that is not a unix endpoint. `opts` as for {@link readNodeNameFile}. Never throws.
 */
export function readRuntimeEndpointFile(opts: { readonly dir?: string; readonly euid?: number; readonly host?: () => string } = {}): RecordedEndpoint | null {
  let r: RawRecord | null;
  try {
    r = readRecord(RUNTIME_ENDPOINT_FILE, 'the runtime endpoint record', opts);
  } catch (e) {
    return { ignored: `${e instanceof Error ? e.message : String(e)}: not used` };
  }
  if (r === null) return null;
  const me = (opts.host ?? hostname)();
  if (r.host === null) return { ignored: `the runtime endpoint record ${r.file} has no "host <host name>" line: not used` };
  if (r.host !== me) return { ignored: `the runtime endpoint record ${r.file} was written on host ${r.host}, not on this host (${me}): not used` };
  try {
    const ep = parseRuntimeEndpoint(r.value);
    // What install-cni never writes (validateRecordedEndpoint): a socket address would be cut at
    // the NUL or hold other bytes than the file's, and a path longer than sun_path cannot connect.
    if (/[\0\r\uFFFD]/.test(ep.path)) return { ignored: `the runtime endpoint record ${r.file}: the socket path ${JSON.stringify(ep.path)} holds a NUL byte, a carriage return or bytes that are not UTF-8: not used` };
    const n = Buffer.byteLength(ep.path, 'utf8');
    if (n > SUN_PATH_MAX_BYTES) return { ignored: `the runtime endpoint record ${r.file}: the socket path is ${n} bytes long, at most ${SUN_PATH_MAX_BYTES} fit in a unix socket address: not used` };
    return { url: ep.url, path: ep.path, file: r.file };
  } catch (e) {
    return { ignored: `the runtime endpoint record ${r.file}: ${e instanceof Error ? e.message : String(e)}: not used` };
  }
}

/**
 * The node name for `pool`: `ipam.nodeName`, else `env.NODE_NAME`, else the node-name file
 * `install-cni` wrote beside the installed plugin (`file()`, default {@link readNodeNameFile}:
 * `<CNI bin dir>/ipwarden.d/node-name`, read only when trusted; what the shim's fallback finds,
 * since the runtime's environment has no `NODE_NAME`), else `host()`.
 * @throws AppError IPAM_INVALID_CONFIG (CNI 7) naming the source when the name is unusable (a
 *   bad node-name file is never skipped for the host name: the file names it).
 */
export function resolveNodeName(pool: PoolConfig, env: Readonly<Record<string, string | undefined>>, host: () => string = hostname, file: () => string | null = readNodeNameFile): string {
  if (pool.nodeName !== null) return pool.nodeName;
  const fromEnv = env['NODE_NAME'];
  if (fromEnv !== undefined && fromEnv !== '') {
    if (!validNodeName(fromEnv)) throw new AppError('IPAM_INVALID_CONFIG', badNodeNameMessage('NODE_NAME', fromEnv));
    return fromEnv;
  }
  const fromFile = file();
  if (fromFile !== null) return fromFile;
  const h = host();
  if (!validNodeName(h)) throw new AppError('IPAM_INVALID_CONFIG', badNodeNameMessage('the host name', h));
  return h;
}

/**
 * The node name for a DEL: as {@link resolveNodeName}, but an unusable name does not fail the
 * DEL (a runtime retries a failed DEL forever): the node name only decides whether an emptied
 * block is given back, so without one the addresses are still released and every block is kept.
 * `NO_NODE` matches no block's node (node names start with a letter or digit).
 */
export function delNodeName(pool: PoolConfig, env: Readonly<Record<string, string | undefined>>): string {
  try {
    return resolveNodeName(pool, env);
  } catch {
    return NO_NODE;
  }
}

/** A node name no block has (see {@link delNodeName}). */
export const NO_NODE = '-';
