/**
 * Plugin mode entry: wires the command handlers to the host-local compatible file store and the
 * real process streams. Loaded only when `CNI_COMMAND` is set, and loads only what ADD/DEL need.
 */
import { closeSync, constants, existsSync, fstatSync, openSync, readFileSync, readSync, writeSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { bytesToText } from '../common/bytes.ts';
import { errnoCode } from '../common/errors.ts';
import { openFileStore } from '../store/file/file-store.ts';
import { makeHandlers, type PluginDeps } from './commands.ts';
import { pluginMain, type PluginIO } from './skel.ts';

/** Loads the CRI-backed heal (`criHeal` of src/cni/heal.ts), lazily: the entry passes the cold part's. */
export type CriHealLoader = () => Promise<typeof import('./heal.ts').criHeal>;

/** Loads the cluster pool hooks' factory (`poolHooks` of src/cni/pool.ts) lazily, like {@link CriHealLoader}. */
export type PoolHooksLoader = () => Promise<typeof import('./pool.ts').poolHooks>;

/**
 * Production dependencies: the file store under `dataDir`, real file reads, and self-healing over
 * CRI and the kernel through `loadHeal`. The entry (src/main.ts) passes a loader of the cold part
 * (the gRPC client and the /proc readers), so it is loaded only when a hook fires: a full range
 * set, a static request a leak holds, or a network with no reservation and no round-robin state.
 * (Taking it as a parameter keeps this module below the entry: no import runs up the layers.)
 * `loadPool` likewise loads the cluster pool hooks (src/cni/pool.ts) for a network with `ipam.pool`.
 */
export function fileDepsWith(loadHeal: CriHealLoader, loadPool?: PoolHooksLoader): PluginDeps {
  return {
    // Cluster pools (ipam.pool): the etcd client and its gRPC stack are loaded only for such a network.
    ...(loadPool === undefined
      ? {}
      : {
          pool: {
            add: async (conf, req) => (await loadPool())(process.env).add(conf, req),
            del: async (id, req) => (await loadPool())(process.env).del(id, req),
            find: async (conf, req) => (await loadPool())(process.env).find(conf, req),
            gc: async (id, valid) => {
              const hooks = (await loadPool())(process.env);
              return (hooks.gc as NonNullable<typeof hooks.gc>)(id, valid);
            },
          },
        }),
    openStore: async ({ dataDir, network, create }) =>
      // DEL/GC/CHECK on a network that has no directory have nothing to do: create nothing.
      !create && !existsSync(join(dataDir, network)) ? null : openFileStore({ dataDir, network }),
    readTextFile: (path) => readFileSync(path, 'utf8'),
    heal: {
      reclaim: async (store, conf, release, only) => (await loadHeal())(process.env).reclaim(store, conf, release, only),
      recover: async (store, conf) => (await loadHeal())(process.env).recover(store, conf),
      gc: async (store, id, candidates) => {
        const hooks = (await loadHeal())(process.env);
        return (hooks.gc as NonNullable<typeof hooks.gc>)(store, id, candidates);
      },
    },
  };
}

/** A shared word to sleep on (`Atomics.wait` with nothing to wake it: a plain sleep). */
const NAP = new Int32Array(new SharedArrayBuffer(4));

/**
 * Read fd 0 to its end with plain read(2) calls. Cheaper than `process.stdin`, whose stream set-up
 * costs several milliseconds on every exec of the plugin. EAGAIN (a non-blocking pipe with nothing
 * yet) is retried after a 1 ms sleep, so a writer that is slow to write or close costs no CPU.
 */
export function readFd(fd: number): Uint8Array {
  const chunks: Buffer[] = [];
  const buf = Buffer.allocUnsafe(65536);
  for (;;) {
    let n: number;
    try {
      n = readSync(fd, buf, 0, buf.length, null);
    } catch (e) {
      if (errnoCode(e) === 'EAGAIN') {
        Atomics.wait(NAP, 0, 0, 1);
        continue;
      }
      if (errnoCode(e) === 'EOF') break;
      throw e;
    }
    if (n === 0) break;
    chunks.push(Buffer.from(buf.subarray(0, n)));
  }
  return Buffer.concat(chunks);
}

/** Write all of `text` to `fd` synchronously (the plugin exits right after). */
function writeFd(fd: number, text: string): void {
  const b = Buffer.from(text, 'utf8');
  let off = 0;
  while (off < b.length) off += writeSync(fd, b, off);
}

/**
 * `env` with `CNI_IFNAME` exact when its bytes are not UTF-8. Node decodes the environment as
 * UTF-8 and replaces each invalid byte by U+FFFD, but a runtime may pass any bytes (libcni accepts
 * them) and host-local writes and compares those bytes; `/proc/self/environ` still has them. Only
 * read when the value holds a U+FFFD, so the usual ADD/DEL pays nothing.
 */
export function exactEnv(
  env: Readonly<Record<string, string | undefined>>,
  readEnviron: () => Uint8Array = () => readFileSync('/proc/self/environ'),
): Readonly<Record<string, string | undefined>> {
  const v = env['CNI_IFNAME'];
  if (v === undefined || !v.includes('\ufffd')) return env;
  let raw: Uint8Array;
  try {
    raw = readEnviron();
  } catch {
    return env;
  }
  const key = Buffer.from('CNI_IFNAME=', 'latin1');
  for (let start = 0; start < raw.length; ) {
    let end = raw.indexOf(0, start);
    if (end < 0) end = raw.length;
    if (end - start >= key.length && key.every((b, i) => raw[start + i] === b)) {
      return { ...env, CNI_IFNAME: bytesToText(raw, start + key.length, end) };
    }
    start = end + 1;
  }
  return env;
}

/** The real process I/O. stdout carries only the protocol document. */
export function processIO(): PluginIO {
  return {
    env: exactEnv(process.env),
    readStdin: async () => readFd(0),
    stdout: (t) => writeFd(1, t),
    stderr: (t) => writeFd(2, t),
  };
}

/** Value of `IPWARDEN_PATH` the shim sets when it runs this plugin as its fallback (docs/daemon.md). */
export const FALLBACK_PATH = 'standalone-fallback';
/** The counting file, in the directory of the daemon's socket (docs/daemon.md). */
export const FALLBACK_LOG_NAME = 'standalone-requests.log';
const KNOWN_COMMANDS: ReadonlySet<string> = new Set(['ADD', 'DEL', 'CHECK', 'GC', 'STATUS', 'VERSION']);

/**
 * The counting line of one fallback request: `<unix seconds> <COMMAND> <ok|error>\n`, COMMAND
 * being `CNI_COMMAND` when it is one of ADD, DEL, CHECK, GC, STATUS, VERSION and `OTHER` else (so
 * no variable's bytes reach the file). `nowMs`: milliseconds since the Unix epoch.
 */
export function fallbackLine(command: string | undefined, status: number, nowMs: number): string {
  const c = command !== undefined && KNOWN_COMMANDS.has(command) ? command : 'OTHER';
  return `${Math.floor(nowMs / 1000)} ${c} ${status === 0 ? 'ok' : 'error'}\n`;
}

/**
 * Append the counting line of a fallback request to `standalone-requests.log` in the directory
 * of `IPWARDEN_SOCKET` (the shim's socket path), only when that path is absolute without a `..`
 * segment and its directory (opened O_DIRECTORY|O_NOFOLLOW, checked on the opened fd) is a
 * directory owned by root and not writable by group or others. The file is opened through the
 * directory fd (`/proc/self/fd/N/…`) with O_WRONLY|O_APPEND|O_CREAT|O_NOFOLLOW|O_NONBLOCK, mode
 * 0600, and written only when it is a regular file, in one write(2). Returns whether the line was
 * written; never throws (counting must never fail a pod).
 */
export function countFallbackRequest(env: Readonly<Record<string, string | undefined>>, status: number, nowMs: number = Date.now()): boolean {
  const sock = env['IPWARDEN_SOCKET'];
  if (sock === undefined || !sock.startsWith('/') || sock.split('/').includes('..')) return false;
  let dfd = -1;
  let fd = -1;
  try {
    dfd = openSync(dirname(sock), constants.O_RDONLY | constants.O_DIRECTORY | constants.O_NOFOLLOW);
    const d = fstatSync(dfd);
    if (!d.isDirectory() || d.uid !== 0 || (d.mode & 0o022) !== 0) return false;
    const flags = constants.O_WRONLY | constants.O_APPEND | constants.O_CREAT | constants.O_NOFOLLOW | constants.O_NONBLOCK;
    fd = openSync(`/proc/self/fd/${dfd}/${FALLBACK_LOG_NAME}`, flags, 0o600);
    if (!fstatSync(fd).isFile()) return false;
    const line = Buffer.from(fallbackLine(env['CNI_COMMAND'], status, nowMs), 'latin1');
    return writeSync(fd, line) === line.length;
  } catch {
    return false;
  } finally {
    for (const f of [fd, dfd]) {
      try {
        if (f >= 0) closeSync(f);
      } catch {
        // nothing to do: the line is written or it is not
      }
    }
  }
}

/**
 * Run the plugin against the real process; resolves to the exit status. Run by the shim as its
 * fallback (`IPWARDEN_PATH=standalone-fallback`), it also counts the request
 * ({@link countFallbackRequest}); without that variable this costs one property read.
 */
export async function runPlugin(deps: PluginDeps, io: PluginIO = processIO()): Promise<number> {
  const status = await pluginMain(makeHandlers(deps), io);
  if (io.env['IPWARDEN_PATH'] === FALLBACK_PATH) countFallbackRequest(io.env, status);
  return status;
}
