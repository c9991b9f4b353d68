/**
 * The etcd credentials file (`ipam.pool.etcd.credentials`, docs/cluster.md "Authentication"): a
 * JSON object `{"user": "…", "password": "…"}` for etcd's user/password authentication
 * (`Auth.Authenticate`; the token it answers is sent with every later call, src/store/etcd/etcd-kv.ts).
 *
 * Read only when it is to be trusted, by the rule for files root trusts (src/common/trust.ts, as
 * the node-name file, src/node/node-name.ts): its directory is a real directory (a symlink is
 * not followed), the file a regular file opened with O_NOFOLLOW, both owned by root (or the
 * effective user) and writable by neither group nor others — and, since it holds a password,
 * the file is not readable by others (nor by a group other than root's). Whoever could write it would choose which etcd user the
 * node acts as; whoever could read it could release any address of the pool.
 */
import { closeSync, constants, fstatSync, lstatSync, openSync, readSync } from 'node:fs';
import { dirname } from 'node:path';
import { AppError, errnoCode } from '../common/errors.ts';
import { untrustedReason } from '../common/trust.ts';
import type { EtcdCredentials, EtcdCredentialsSource } from '../store/etcd/etcd-kv.ts';

/** Largest credentials file read, bytes. */
export const CREDENTIALS_MAX_BYTES = 4096;

const KEY = 'ipam.pool.etcd.credentials';

function bad(why: string): AppError {
  return new AppError('IPAM_INVALID_CONFIG', `${KEY}: ${why}`);
}

/**
 * Read the credentials file at `path` (absolute). `euid` (default `process.geteuid()`) is for tests.
 * @throws AppError IPAM_IO (CNI 5) `ipam.pool.etcd.credentials: open <path>: <why>` when it cannot
 *   be opened (missing, unreadable); IPAM_INVALID_CONFIG (CNI 7) `ipam.pool.etcd.credentials: <why>`
 *   when it or its directory is not to be trusted (`<path> is a symlink (not followed)`, `<path>
 *   is not a regular file`, `<path> is owned by uid N`, `<path> is writable by group or others
 *   (mode 666)`, `<path> is readable by others (mode 644): a password file must not be`), is
 *   larger than {@link CREDENTIALS_MAX_BYTES}, or is not `{"user": "<non-empty>", "password":
 *   "<non-empty>"}` exactly.
 */
export function readEtcdCredentials(path: string, euid: number = process.geteuid?.() ?? 0): EtcdCredentials {
  const dir = dirname(path);
  let dst;
  try {
    dst = lstatSync(dir);
  } catch (e) {
    throw new AppError('IPAM_IO', `${KEY}: open ${path}: ${errnoCode(e) === 'ENOENT' ? 'no such file or directory' : (errnoCode(e) ?? String(e))}`);
  }
  if (!dst.isDirectory()) throw bad(`${dir} is not a directory (a symlink is not followed)`);
  const dirBad = untrustedReason(dir, dst, euid);
  if (dirBad !== null) throw bad(dirBad);
  let fd: number;
  try {
    fd = openSync(path, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
  } catch (e) {
    const code = errnoCode(e);
    if (code === 'ELOOP') throw bad(`${path} is a symlink (not followed)`);
    throw new AppError('IPAM_IO', `${KEY}: open ${path}: ${code === 'ENOENT' ? 'no such file or directory' : code === 'EACCES' ? 'permission denied' : (code ?? String(e))}`);
  }
  let text: string;
  try {
    const st = fstatSync(fd);
    if (!st.isFile()) throw bad(`${path} is not a regular file`);
    const fileBad = untrustedReason(path, st, euid);
    if (fileBad !== null) throw bad(fileBad);
    if ((st.mode & 0o004) !== 0) throw bad(`${path} is readable by others (mode ${(st.mode & 0o7777).toString(8)}): a password file must not be`);
    // Group-readable only when the group is root's: any other group's members could read it.
    if ((st.mode & 0o040) !== 0 && st.gid !== 0) throw bad(`${path} is readable by group ${st.gid} (mode ${(st.mode & 0o7777).toString(8)}): a password file must not be`);
    const buf = Buffer.alloc(CREDENTIALS_MAX_BYTES + 1);
    let n = 0;
    for (let got = -1; got !== 0 && n < buf.length; n += got) got = readSync(fd, buf, n, buf.length - n, n);
    if (n > CREDENTIALS_MAX_BYTES) throw bad(`${path} is longer than ${CREDENTIALS_MAX_BYTES} bytes`);
    text = buf.toString('utf8', 0, n);
  } finally {
    closeSync(fd);
  }
  const shape = `${path} must be a JSON object {"user": "…", "password": "…"}`;
  let o: unknown;
  try {
    o = JSON.parse(text);
  } catch {
    throw bad(`${shape}: not valid JSON`);
  }
  if (typeof o !== 'object' || o === null || Array.isArray(o)) throw bad(`${shape}: not a JSON object`);
  const r = o as Record<string, unknown>;
  for (const k of Object.keys(r)) if (k !== 'user' && k !== 'password') throw bad(`${shape}: unknown key ${JSON.stringify(k)}`);
  for (const k of ['user', 'password']) {
    if (typeof r[k] !== 'string' || r[k] === '') throw bad(`${shape}: "${k}" must be a non-empty string`);
  }
  return { user: r['user'] as string, password: r['password'] as string };
}

/** The credentials file at `path` as an {@link EtcdCredentialsSource} (read at each authentication). */
export function credentialsFile(path: string): EtcdCredentialsSource {
  return { describe: `${KEY} (${path})`, read: () => readEtcdCredentials(path) };
}
