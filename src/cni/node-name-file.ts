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
 */
import { closeSync, constants, fstatSync, lstatSync, openSync, readSync } from 'node:fs';
import { hostname } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { AppError, errnoCode } from '../common/errors.ts';
import { untrustedReason } from '../common/trust.ts';
import { badNodeNameMessage, validNodeName } from '../ipam/pool-config.ts';

/** The directory beside the installed plugin that holds ipwarden's own small files. */
export const NODE_NAME_DIR = 'ipwarden.d';
/** The node-name file's name in {@link NODE_NAME_DIR}. */
export const NODE_NAME_FILE = 'node-name';
/** Largest node-name file read, bytes (a node name is at most 253; more is not a node name). */
export const NODE_NAME_FILE_MAX_BYTES = 512;

/** The path of the node-name file in the CNI bin dir `binDir`. */
export function nodeNameFilePath(binDir: string): string {
  return join(binDir, NODE_NAME_DIR, NODE_NAME_FILE);
}

function bad(what: string, why: string): AppError {
  return new AppError('IPAM_INVALID_CONFIG', `the node name file ${what}: ${why}`);
}

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
export function readNodeNameFile(opts: { readonly dir?: string; readonly euid?: number; readonly host?: () => string } = {}): string | null {
  const euid = opts.euid ?? process.geteuid?.() ?? 0;
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
  const f = join(d, NODE_NAME_FILE);
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
    const name = lines[0] as string;
    if (!validNodeName(name)) throw new AppError('IPAM_INVALID_CONFIG', badNodeNameMessage(`the node name file ${f}`, name));
    if (lines.length > 2) throw bad(f, `has ${lines.length} lines, at most 2 (the node name, "host <host name>")`);
    if (lines.length === 2) {
      const m = /^host (\S+)$/.exec(lines[1] as string);
      if (m === null) throw bad(f, `line 2 must be "host <host name>", got ${JSON.stringify(lines[1])}`);
      // Written on another host (a cloned node image, a copied CNI bin dir): not this node's name.
      // Ignored, so the fallback names the node by its host name as without the file, until this
      // node's init container writes its own (review B2: a clone allocated as the source node).
      if (m[1] !== (opts.host ?? hostname)()) return null;
    }
    return name;
  } finally {
    closeSync(fd);
  }
}
