/**
 * The daemon's plugin server (docs/daemon.md): a unix socket the exec shim connects to, one
 * request per connection (`RequestDecoder`; protocol version 2, whose header is
 * acknowledged before the shim sends the body, or version 1 of older shims), answered with exactly
 * what the standalone plugin would have printed and its exit status. Each request runs the project's own
 * handlers, `pluginMain(makeHandlers(deps), io)`, with an in-memory {@link PluginIO} whose
 * environment comes only from the request's env block and whose stdin is the request's bytes.
 *
 * Safety rules:
 * - The socket's directory must be a real directory (lstat: a symlink is refused, never
 *   followed) owned by root and not writable by group or others; it is created 0700 when missing.
 *   Before the socket path is looked at, an exclusive flock(2) on `<socket>.lock` is taken and
 *   held for the server's (the daemon's) life: of two daemons started together one serves, the
 *   other refuses ({@link lockSocketPath}).
 *   A file already at the socket path is removed only when it is a socket nobody answers on.
 *   The socket is bound under umask 0177 (held by this thread while the socket thread binds),
 *   so it is 0600 from its first instant.
 * - A request whose client went away (end of stream, reset) is dropped: checked before the
 *   network's store is opened and again right after `DIR/lock` is taken (the lock is then
 *   released and nothing is changed). A late ADD must not land after the runtime's DEL
 *   (fast-path-measurements.md, "Failure behaviour").
 * - The connections live on a thread of their own (src/daemon/socket-thread.ts, socket-worker.ts):
 *   it reads, decodes, acknowledges and answers; this (the main) thread runs complete requests.
 * - A version-2 request header is acknowledged at once, in the callback that read it, provided
 *   the main thread's event loop runs (a heartbeat under 250 ms old), else as soon as it runs again;
 *   a client that goes away before sending the body has nothing run.
 * - A request is logged served once its answer was written to the kernel.
 * - Malformed requests and other protocol versions get no answer (the shim then runs the
 *   standalone plugin); a request not complete within {@link PluginServerOptions.requestTimeoutSeconds}
 *   is closed the same way.
 * - At most {@link PluginServerOptions.maxInFlight} requests run at once (the file lock
 *   serialises per network anyway); further complete requests wait in arrival order, and at most
 *   {@link PluginServerOptions.maxConnections} connections are open (more are refused by the
 *   kernel backlog / closed at once: the shim falls back).
 * - STATUS and VERSION ({@link UNQUEUED_COMMANDS}) take no request slot: they are answered at once,
 *   never queued behind ADDs and DELs waiting for a network's lock. containerd 2.x asks STATUS
 *   periodically and reads a slow answer as "the network is not ready" (the node goes NotReady);
 *   with one network's lock stuck and 70 ADDs queued, a STATUS waited about 25 s behind the 64
 *   slots (containerd#11186, issue 19 item 5). A request's logged duration counts from its
 *   arrival (the complete request), its wait for a slot included (`queuedSeconds` says how much).
 */
import type { PoolHooks } from '../cni/pool.ts';
import type { IPAMConfig } from '../ipam/types.ts';
import type { Worker } from 'node:worker_threads';
import { closeSync, constants as fsConstants, existsSync, fstatSync, lstatSync, mkdirSync, openSync, readFileSync, unlinkSync, type Stats } from 'node:fs';
import { createConnection } from 'node:net';
import { dirname, join } from 'node:path';
import { AppError, errnoCode } from '../common/errors.ts';
import { makeHandlers, type HealHooks, type KernelAddressHooks, type PluginDeps, type ReclaimSummary } from '../cni/commands.ts';
import { criHeal, type NodeEndpointSource } from '../cni/heal.ts';
import { exactEnv } from '../cni/plugin.ts';
import { pluginMain, type PluginIO } from '../cni/skel.ts';
import { readKernelEvidenceAsync } from '../node/kernel-evidence.ts';
import { hostView, type HostView } from '../node/host-view.ts';
import { openFileStore } from '../store/file/file-store.ts';
import type { ListOptions, Owner, Reservation, Store } from '../store/store.ts';
import { memoConfigDecoders } from './config-memo.ts';
import type { Logger } from './log.ts';
import { encodeAnswer, type PluginRequest } from './protocol.ts';
import type { RequestMessage } from './socket-messages.ts';
import { startSocketThread } from './socket-thread.ts';

/** Opens the store of one network (the shape of `PluginDeps.openStore`). */
export type StoreOpener = PluginDeps['openStore'];

/** Builds the heal hooks of one request from its environment and the shim's pid; undefined = no self-healing. */
export type HealFactory = (request: { readonly env: Readonly<Record<string, string>>; readonly pid: number }) => HealHooks | undefined;

/**
 * The file store, as the standalone plugin opens it (`fileDeps.openStore`, src/cni/plugin.ts):
 * DEL/GC/CHECK on a network without a directory create nothing (null).
 */
export const fileStoreOpener: StoreOpener = async ({ dataDir, network, create }) =>
  !create && !existsSync(join(dataDir, network)) ? null : openFileStore({ dataDir, network });

/**
 * The standalone plugin's self-healing hooks, for the request's process instead of this one: the
 * request's `CONTAINER_RUNTIME_ENDPOINT`, the runtime identified from the shim's ancestry, and
 * the shim's own environment left out of the kernel's "CNI operations in flight" (as the
 * standalone leaves out its own). When the shim's ancestry finds no runtime (a Multus thick
 * daemon exec'd it), `nodeEndpoint` is asked: the agent passes the daemon's own
 * `--runtime-endpoint` (src/daemon/agent.ts), where the standalone reads the record install-cni
 * wrote beside it (src/cni/heal.ts).
 */
export function criHealFactoryFor(nodeEndpoint: NodeEndpointSource): HealFactory {
  return ({ env, pid }) => criHeal(env, Date.now, () => readKernelEvidenceAsync({ selfPid: pid }), pid, nodeEndpoint);
}

/** {@link criHealFactoryFor} without a node endpoint: a request whose ancestry finds no runtime reclaims nothing. */
export const criHealFactory: HealFactory = criHealFactoryFor(() => null);

/** Where in its life a request was dropped because its client went away. */
export type DropStage = 'queued' | 'before-store' | 'after-lock';

/** One answered request (for metrics: `onRequest`). */
export interface RequestEvent {
  /** `CNI_COMMAND` as sent (may be empty or unknown: the plugin's own error answered it). */
  readonly command: string;
  readonly containerId: string;
  /** The network whose store was opened, or null when none was (VERSION, an early error). */
  readonly network: string | null;
  readonly result: 'ok' | 'error';
  readonly exitStatus: number;
  /**
   * Time from the request's arrival (the complete request read) to the answer, seconds: the wait
   * for a request slot included.
   */
  readonly durationSeconds: number;
  /**
   * False when the client was known gone when the answer was ready (the changes were made, no
   * answer sent). True when the answer was handed to the socket thread; its log line
   * (`request served`, or `answer not delivered` when the write failed) follows the write.
   */
  readonly delivered: boolean;
}

/** One request dropped because its client went away (`onDropped`). */
export interface DroppedEvent {
  readonly command: string;
  readonly containerId: string;
  readonly network: string | null;
  readonly stage: DropStage;
  /** Seconds from the request's arrival (the complete request read) to the drop, the wait for a slot included. */
  readonly durationSeconds: number;
}

/**
 * One request declined before anything was read or written because it names a path that is not
 * the host's in the daemon's view (`onDeclined`; src/node/host-view.ts): closed without an answer,
 * so the shim runs the standalone plugin on the host.
 */
export interface DeclinedEvent {
  readonly command: string;
  readonly containerId: string;
  /** Why, one clause naming the path (HostView.notHostPath). */
  readonly reason: string;
}

/** A connection closed without an answer because of what the client sent (`onMalformed`). */
export interface MalformedEvent {
  /** `malformed`, `unsupported-version` or `timeout`. */
  readonly kind: 'malformed' | 'unsupported-version' | 'timeout';
  readonly reason: string;
}

/**
 * A reclaim inside a request the daemon served released reservations (`onReclaim`; the plugin's
 * own reclaim of src/reconcile/reclaim.ts, under the network's lock, each release audited).
 */
export interface ReclaimEvent {
  /** The network's name (as the `network` of the loop's releases). */
  readonly network: string;
  /** Its data directory (the network's directory is `<dataDir>/<network>`). */
  readonly dataDir: string;
  /** `CNI_CONTAINERID` of the ADD that triggered it. */
  readonly containerId: string;
  /**
   * `exhaustion`: a range set had no free address; `requested-address`: the address a static
   * request names (`IP=`, `ips`) was held by a leak.
   */
  readonly trigger: 'exhaustion' | 'requested-address';
  /** Each reservation released and the verdict that allowed it (`leaked`, `corrupt`); never empty. */
  readonly released: ReclaimSummary['releases'];
  /** Seconds the reclaim took: from the ADD finding no address (the range set full) to its last release. */
  readonly durationSeconds: number;
}

/** Observers of the server (metrics, the loop's heal clock); each is called synchronously and must not throw. */
export interface PluginServerHooks {
  onRequest?(e: RequestEvent): void;
  onDropped?(e: DroppedEvent): void;
  onDeclined?(e: DeclinedEvent): void;
  onMalformed?(e: MalformedEvent): void;
  onReclaim?(e: ReclaimEvent): void;
}

/** Options of {@link startPluginServer}. */
export interface PluginServerOptions {
  /** Absolute socket path (≤ 107 bytes). */
  readonly socketPath: string;
  readonly log: Logger;
  /** Store opener (default {@link fileStoreOpener}; the in-memory index store replaces it later). */
  readonly openStore?: StoreOpener;
  /** Heal hooks per request (default {@link criHealFactory}). */
  readonly heal?: HealFactory;
  /** Requests running at once (default 64). */
  readonly maxInFlight?: number;
  /** Open connections (default 1024). */
  readonly maxConnections?: number;
  /** Seconds a client has to send its whole request (default 10; the shim sends it at once). */
  readonly requestTimeoutSeconds?: number;
  readonly hooks?: PluginServerHooks;
  /**
   * Which paths the requester (the shim's pid) sees as the daemon does (default {@link hostView}():
   * in the requester's mount namespace, all). A request whose data directory or `resolvConf` is
   * not the same file for both is declined (see {@link DeclinedEvent}).
   */
  readonly hostView?: HostView;
  /**
   * The lock on `<socketPath>.lock` ({@link lockSocketPath}), taken by the caller, who keeps it
   * and releases it (the daemon: after its last part closed). Without it the server takes its
   * own before it touches the socket path and releases it when closed or when it fails to start.
   */
  readonly socketLock?: SocketLock;
  /**
   * Cluster pools (issue 11): ADD/DEL/CHECK of networks with `ipam.pool` (src/daemon/pool-sessions.ts
   * `PoolSessions`: one etcd client per pool, the node's concurrent ADDs batched). Without it such
   * a request fails with `INTERNAL`.
   */
  readonly pool?: PoolHooks;
  /**
   * Told of the network config (the request's stdin) of every pool ADD and CHECK that succeeded,
   * after its answer was decided (the daemon learns the pool networks it serves from it:
   * src/daemon/learned-pools.ts). Must not throw.
   */
  readonly learnPool?: PoolLearner;
  /**
   * The kernel address index (src/daemon/kernel-addresses.ts): ADDs skip the addresses it shows
   * configured in a network namespace. Without it ADDs allocate as the standalone plugin does.
   */
  readonly kernel?: KernelAddressHooks;
  /**
   * The container ID prefix of the daemon's own warm-up requests (src/daemon/warm-up.ts: a random
   * token per start). A request is the warm-up's only when its header carries this process's pid
   * AND its container ID starts with this prefix: it is then served without heal hooks (no
   * runtime call, no kernel evidence) and without kernel hooks, counted nowhere, logged at debug.
   * Absent: no request is.
   */
  readonly warmUpIdPrefix?: string;
  /**
   * Told (once) when the socket's thread ended while the server was running (a bug): the socket
   * is then closed and every shim runs the standalone plugin; every request not yet run is
   * dropped. The daemon then stops (exit status 1). Must not throw.
   */
  readonly onFailed?: (why: string) => void;
  /** Given the socket thread's Worker once started: for tests, which end it to check {@link onFailed}'s path. */
  readonly onSocketThread?: (worker: Worker) => void;
}

/** A running plugin server. */
export interface PluginServer {
  readonly socketPath: string;
  /** Requests being served or queued now. */
  readonly inFlight: number;
  /** Of {@link inFlight}, those that are not the daemon's own warm-up requests. */
  readonly runtimeInFlight: number;
  /**
   * Resolves once every client that went away before the call is known gone (the socket thread
   * reports ends by message; this waits for the ones already in the kernel). Never rejects.
   */
  clientsCurrent(): Promise<void>;
  /**
   * Remove the socket file (at once: a shim then runs the standalone plugin), stop accepting,
   * close connections that have not sent a complete request, let the requests in flight finish
   * and answer, end the socket's thread. Idempotent: every call returns the same promise.
   */
  close(): Promise<void>;
}

/** The socket cannot be served safely or at all; the daemon refuses to start. */
export class SocketSetupError extends AppError {
  constructor(message: string, cause?: unknown) {
    super('USAGE', message, cause === undefined ? {} : { cause });
    this.name = 'SocketSetupError';
  }
}

/** Thrown inside the handlers to stop a request that names a path not the requester's; never answered. */
class DeclinedError extends AppError {
  constructor(reason: string) {
    super('INTERNAL', `request declined: ${reason}`);
    this.name = 'DeclinedError';
  }
}

/** Thrown inside the handlers to stop a request whose client went away; never answered. */
class DroppedError extends AppError {
  constructor(stage: DropStage) {
    super('INTERNAL', `request dropped (${stage}): the client went away`);
    this.name = 'DroppedError';
  }
}

function modeText(st: Stats): string {
  return `0${(st.mode & 0o7777).toString(8)}`;
}

function lstatOrNull(path: string): Stats | null {
  try {
    return lstatSync(path);
  } catch (e) {
    if (errnoCode(e) === 'ENOENT') return null;
    throw new SocketSetupError(`cannot stat ${path}: ${e instanceof Error ? e.message : String(e)}`, e);
  }
}

/**
 * Check (creating it 0700 when missing) the socket's directory: a real directory (not a
 * symlink), owned by uid 0, not writable by group or others. Its parent must exist.
 * @throws SocketSetupError naming the directory and what is wrong.
 */
export function prepareSocketDir(dir: string): void {
  let st = lstatOrNull(dir);
  if (st === null) {
    const old = process.umask(0o077);
    try {
      mkdirSync(dir, { mode: 0o700 });
    } catch (e) {
      if (errnoCode(e) !== 'EEXIST') {
        throw new SocketSetupError(`cannot create the socket directory ${dir}: ${e instanceof Error ? e.message : String(e)}`, e);
      }
    } finally {
      process.umask(old);
    }
    st = lstatOrNull(dir);
    if (st === null) throw new SocketSetupError(`the socket directory ${dir} vanished after it was created`);
  }
  if (st.isSymbolicLink()) throw new SocketSetupError(`the socket directory ${dir} is a symbolic link; refusing to follow it`);
  if (!st.isDirectory()) throw new SocketSetupError(`the socket directory ${dir} is not a directory`);
  if (st.uid !== 0) throw new SocketSetupError(`the socket directory ${dir} is owned by uid ${st.uid}, not root`);
  if ((st.mode & 0o022) !== 0) throw new SocketSetupError(`the socket directory ${dir} is writable by group or others (mode ${modeText(st)})`);
}

/** True when something accepts connections on the unix socket at `path`. */
function answers(path: string): Promise<boolean> {
  return new Promise((resolve) => {
    const c = createConnection(path);
    const done = (v: boolean): void => {
      c.destroy();
      resolve(v);
    };
    c.once('connect', () => done(true));
    c.once('error', () => done(false));
  });
}

/**
 * Remove what is at `path` if it is a stale socket (a socket nobody accepts on). Nothing there:
 * nothing to do.
 * @throws SocketSetupError when it is not a socket, or a live one (another daemon).
 */
async function clearStaleSocket(path: string, log: Logger): Promise<void> {
  const st = lstatOrNull(path);
  if (st === null) return;
  if (!st.isSocket()) throw new SocketSetupError(`${path} exists and is not a socket; remove it or choose another --socket`);
  if (await answers(path)) throw new SocketSetupError(`another process is serving ${path} (a daemon already running?)`);
  log.info({ socket: path }, 'removing a stale socket (nobody accepts on it)');
  try {
    unlinkSync(path);
  } catch (e) {
    if (errnoCode(e) !== 'ENOENT') throw new SocketSetupError(`cannot remove the stale socket ${path}: ${e instanceof Error ? e.message : String(e)}`, e);
  }
}

/** An exclusive flock(2) on the socket's lock file, held while the daemon lives. */
export interface SocketLock {
  /** The lock file, `<socket>.lock`. */
  readonly path: string;
  /** Drop the lock (close its file descriptor). Idempotent; never throws. The file stays. */
  release(): void;
}

/** The lock file of the socket `socketPath`: `<socketPath>.lock`, beside it. */
export function socketLockPath(socketPath: string): string {
  return `${socketPath}.lock`;
}

/**
 * Take an exclusive flock(2) on `<socketPath>.lock` without waiting (fs-ext `flockSync`, the
 * binding the file store uses). The file is opened `O_RDWR|O_CREAT|O_NOFOLLOW|O_NONBLOCK` (and
 * close-on-exec, as libuv opens every file), mode 0600 when created, and must be a regular file;
 * it is never written, and never removed (a removed lock file would let a second daemon lock a new
 * inode while the first holds the old one). The socket's directory must have been checked
 * ({@link prepareSocketDir}): only root can create files there. Lock before anything looks at,
 * removes or binds the socket path: two daemons started together, after a crash left a stale
 * socket, otherwise both saw it stale, both removed it and both bound (issue 17).
 * @throws SocketSetupError `another daemon holds <lock> (it serves <socket> or is starting to)`
 *   when the lock is taken; naming the file when it cannot be opened, is a symlink or not a regular
 *   file, or flock fails otherwise.
 */
export async function lockSocketPath(socketPath: string): Promise<SocketLock> {
  const path = socketLockPath(socketPath);
  let flockSync: (fd: number, flags: 'exnb' | 'un') => void;
  try {
    flockSync = (await import('../store/file/fs-ext.ts')).flockSync;
  } catch (e) {
    throw new SocketSetupError(`cannot load the flock binding to lock ${path}: ${(e instanceof Error ? e.message : String(e)).split('\n')[0] as string}`, e);
  }
  let fd: number;
  try {
    fd = openSync(path, fsConstants.O_RDWR | fsConstants.O_CREAT | fsConstants.O_NOFOLLOW | fsConstants.O_NONBLOCK, 0o600);
  } catch (e) {
    if (errnoCode(e) === 'ELOOP') throw new SocketSetupError(`the lock file ${path} is a symbolic link; refusing to follow it`, e);
    throw new SocketSetupError(`cannot open the lock file ${path}: ${e instanceof Error ? e.message : String(e)}`, e);
  }
  try {
    if (!fstatSync(fd).isFile()) throw new SocketSetupError(`the lock file ${path} is not a regular file`);
    try {
      flockSync(fd, 'exnb');
    } catch (e) {
      const code = errnoCode(e);
      if (code === 'EAGAIN' || code === 'EWOULDBLOCK') throw new SocketSetupError(`another daemon holds ${path} (it serves ${socketPath} or is starting to)`, e);
      throw new SocketSetupError(`cannot lock ${path}: ${e instanceof Error ? e.message : String(e)}`, e);
    }
  } catch (e) {
    closeSync(fd);
    throw e;
  }
  let held = true;
  return {
    path,
    release() {
      if (!held) return;
      held = false;
      try {
        closeSync(fd); // closing the only descriptor of the open file description drops the flock
      } catch {
        // already closed: nothing is held
      }
    },
  };
}

/**
 * Claim `path` before anything else of the daemon starts: check its directory as
 * {@link prepareSocketDir} demands (created 0700 when missing), take the socket's lock
 * ({@link lockSocketPath}), then check that nothing is at `path` but nothing or a stale socket.
 * So a second daemon, or one given an unsafe path, refuses at once — before it opens its metrics
 * port or runs a reconcile pass. Resolves to the held lock, which the caller releases (after the
 * server it hands it to has closed).
 * @throws SocketSetupError as `prepareSocketDir`, {@link lockSocketPath} and
 *   {@link startPluginServer} do (the lock is released first).
 */
export async function claimSocketPath(path: string): Promise<SocketLock> {
  prepareSocketDir(dirname(path));
  const lock = await lockSocketPath(path);
  try {
    const st = lstatOrNull(path);
    if (st === null) return lock;
    if (!st.isSocket()) throw new SocketSetupError(`${path} exists and is not a socket; remove it or choose another --socket`);
    if (await answers(path)) throw new SocketSetupError(`another process is serving ${path} (a daemon already running?)`);
    return lock;
  } catch (e) {
    lock.release();
    throw e;
  }
}

/**
 * Commands answered without a request slot: they do not wait for a network's lock (STATUS's
 * writability probe borrows the lock only when that needs no waiting; VERSION touches no store),
 * so they must not wait behind requests that do (see the module comment). The one exception, a
 * network with the opt-in ipam `failStatusOnExhaustion`, whose STATUS takes the lock, waits for
 * that lock only, still beside the slots.
 */
export const UNQUEUED_COMMANDS: ReadonlySet<string> = new Set(['STATUS', 'VERSION']);

/** FIFO counting semaphore. */
class Slots {
  #free: number;
  readonly #waiting: Array<() => void> = [];
  constructor(n: number) {
    this.#free = n;
  }
  /** Requests waiting for a slot now. */
  get waiting(): number {
    return this.#waiting.length;
  }
  /** Take a slot when one is free at once; false (nothing taken) otherwise. */
  tryAcquire(): boolean {
    if (this.#free === 0) return false;
    this.#free--;
    return true;
  }
  async acquire(): Promise<void> {
    if (this.#free > 0) {
      this.#free--;
      return;
    }
    await new Promise<void>((resolve) => this.#waiting.push(resolve));
  }
  release(): void {
    const next = this.#waiting.shift();
    if (next !== undefined) next();
    else this.#free++;
  }
}

/** No observers: the daemon's own warm-up requests are not counted. */
const NO_HOOKS: PluginServerHooks = {};

/** Per-connection state shared with the guarded store. */
interface Conn {
  /** The connection's id in the socket thread. */
  readonly id: number;
  /** The client's side ended or failed: nothing can be answered any more. */
  gone: boolean;
  /** Set when the request was dropped. */
  dropped: DropStage | null;
  network: string | null;
  /** `CNI_COMMAND` and `CNI_CONTAINERID` of the complete request (for log lines). */
  command: string;
  containerId: string;
  /** Set when the request names a path that is not the host's: no answer, the shim falls back. */
  declined: string | null;
  /**
   * Aborted when the client goes away: a cluster pool ADD still queued is then not sent (review F4).
   * Made only when a pool ADD asks for its signal ({@link clientSignal}): aborting a controller
   * builds a DOMException with a stack trace, measurable on every connection's close otherwise.
   */
  abort: AbortController | null;
  /** The daemon's own warm-up request ({@link PluginServerOptions.warmUpIdPrefix}); set when complete. */
  quiet: boolean;
  /** When the request was read whole (`process.hrtime.bigint()`). */
  readonly arrived: bigint;
}

/**
 * How long a request may have waited (seconds) before a drop check first makes sure that its
 * client's end, if it already happened, is known: a request that old may have sat through a stop
 * of the daemon (SIGSTOP, a starved process), during which its shim can have given up, and the
 * socket thread reports that by message. A fresher one is checked as it stands (no cost).
 */
const STALE_REQUEST_SECONDS = 1;

/** `hooks` with every ADD given `signal`. */
/** See {@link PluginServerOptions.learnPool}: `conf` the request's decoded config, `stdin` its bytes. */
export type PoolLearner = (conf: IPAMConfig, stdin: Uint8Array) => void;

function withSignal(hooks: PoolHooks, conn: Conn, stdin: Uint8Array, learn: PoolLearner | undefined): PoolHooks {
  // The request's network, for its log line (a pool network opens no store that would name it).
  const named = (name: string): void => {
    conn.network = name;
  };
  const gc = hooks.gc;
  return {
    add: (conf, req) => (named(conf.name), learnt(hooks.add(conf, req, clientSignal(conn)), () => learn?.(conf, stdin))),
    del: (id, req) => (named(id.name), hooks.del(id, req)),
    find: (conf, req) => (named(conf.name), learnt(hooks.find(conf, req), () => learn?.(conf, stdin))),
    ...(gc === undefined ? {} : { gc: (id: Parameters<typeof gc>[0], valid: Parameters<typeof gc>[1]) => (named(id.name), gc.call(hooks, id, valid)) }),
  };
}

/** `p`, with `learn` run once it fulfilled (a pool ADD or CHECK that succeeded: the pool is real). */
function learnt<T>(p: Promise<T>, learn: () => void): Promise<T> {
  return p.then((r) => {
    learn();
    return r;
  });
}

/** The signal aborted when `conn`'s client goes away (already aborted when it has gone). */
function clientSignal(conn: Conn): AbortSignal {
  if (conn.abort === null) {
    conn.abort = new AbortController();
    if (conn.gone) conn.abort.abort();
  }
  return conn.abort.signal;
}

/** The client went away: nothing can be answered any more; a queued pool ADD is not sent. */
function markGone(conn: Conn): void {
  conn.gone = true;
  conn.abort?.abort();
}

/**
 * A store that drops the request when the client went away while the lock was being taken:
 * `lock()` then releases the lock and throws. Every other method is the inner store's.
 */
class GuardedStore implements Store {
  readonly #inner: Store;
  readonly #conn: Conn;
  readonly #current: () => Promise<void>;
  /** `current`: resolves once the client's end, if it already happened, is known ({@link currentFor}). */
  constructor(inner: Store, conn: Conn, current: () => Promise<void>) {
    this.#inner = inner;
    this.#conn = conn;
    this.#current = current;
  }
  get network(): string {
    return this.#inner.network;
  }
  async lock(timeoutSeconds: number): Promise<void> {
    await this.#inner.lock(timeoutSeconds);
    await this.#current();
    if (this.#conn.gone) {
      await this.#inner.unlock();
      this.#conn.dropped = 'after-lock';
      throw new DroppedError('after-lock');
    }
  }
  unlock(): Promise<void> {
    return this.#inner.unlock();
  }
  list(opts?: ListOptions): Promise<Reservation[]> {
    return this.#inner.list(opts);
  }
  reserve(ip: string, owner: { containerId: string; ifname: string }, rangeSetIndex: number): Promise<boolean> {
    return this.#inner.reserve(ip, owner, rangeSetIndex);
  }
  restore(ip: string, owner: { containerId: string; ifname: string }): Promise<boolean> {
    return this.#inner.restore(ip, owner);
  }
  rewrite(ip: string, expected: Owner, owner: { containerId: string; ifname: string }): Promise<boolean> {
    return this.#inner.rewrite(ip, expected, owner);
  }
  lastReservedIP(rangeSetIndex: number): Promise<string | null> {
    return this.#inner.lastReservedIP(rangeSetIndex);
  }
  release(ip: string, expected: Owner | null): Promise<boolean> {
    return this.#inner.release(ip, expected);
  }
  touch(ip: string, expected: Owner | null): Promise<boolean> {
    return this.#inner.touch(ip, expected);
  }
  recoveryPending(): Promise<boolean> {
    return this.#inner.recoveryPending();
  }
  markRecovery(pending: boolean): Promise<void> {
    return this.#inner.markRecovery(pending);
  }
  releaseByOwner(containerId: string, ifname: string): Promise<string[]> {
    return this.#inner.releaseByOwner(containerId, ifname);
  }
  writable(): Promise<boolean> {
    return this.#inner.writable();
  }
  close(): Promise<void> {
    return this.#inner.close();
  }
}

function seconds(t0: bigint): number {
  return Number(process.hrtime.bigint() - t0) / 1e9;
}

/**
 * `h` with its reclaims made visible: one that released reservations is logged at info (`reclaimed
 * on exhaustion`, or `reclaimed for a requested address`, naming the network, its data directory,
 * the ADD's container, the number released and their IPs) and told to `hooks.onReclaim` (metrics,
 * the loop's heal clock). A reclaim that only counts (`release` false: STATUS) or released nothing
 * is neither.
 */
function observedHeal(h: HealHooks, containerId: string, log: Logger, hooks: PluginServerHooks): HealHooks {
  return {
    ...h,
    reclaim: async (store, conf, release, only) => {
      const t0 = process.hrtime.bigint();
      const r = await h.reclaim(store, conf, release, only);
      if (r.releases.length > 0) {
        // An observer never fails the ADD whose reclaim it is told of (the releases are done).
        try {
          const trigger = only === undefined ? 'exhaustion' : 'requested-address';
          const ips = r.releases.map((x) => x.ip);
          log.info(
            { network: conf.name, dataDir: conf.dataDir, containerId, released: ips.length, ips },
            trigger === 'exhaustion' ? 'reclaimed on exhaustion' : 'reclaimed for a requested address',
          );
          hooks.onReclaim?.({ network: conf.name, dataDir: conf.dataDir, containerId, trigger, released: r.releases, durationSeconds: seconds(t0) });
        } catch (e) {
          log.error({ error: e instanceof Error ? e.message : String(e) }, 'a reclaim observer failed');
        }
      }
      return r;
    },
  };
}

/**
 * Start serving `opts.socketPath`. Resolves once the socket listens (0600, in a checked
 * directory). Rejects with {@link SocketSetupError} when the directory is unsafe, a non-socket
 * or a live socket is at the path, or binding fails.
 */
export async function startPluginServer(opts: PluginServerOptions): Promise<PluginServer> {
  const path = opts.socketPath;
  const log = opts.log;
  const openStore = opts.openStore ?? fileStoreOpener;
  const heal = opts.heal ?? criHealFactory;
  const hooks = opts.hooks ?? {};
  const warmUpIdPrefix = opts.warmUpIdPrefix;
  const slots = new Slots(opts.maxInFlight ?? 64);
  const timeoutMs = (opts.requestTimeoutSeconds ?? 10) * 1000;
  /** Connections whose request is complete (being served or queued). */
  const serving = new Set<Conn>();
  const pending = new Set<Promise<void>>();
  /** One network config decoded once for all its requests (src/daemon/config-memo.ts). */
  const decoders = memoConfigDecoders();
  const view = opts.hostView ?? hostView();

  prepareSocketDir(dirname(path));
  // The lock before the path is looked at: a second daemon must not see our socket as stale.
  const ownLock = opts.socketLock === undefined ? await lockSocketPath(path) : null;
  try {
    await clearStaleSocket(path, log);
  } catch (e) {
    ownLock?.release();
    throw e;
  }

  const reject = (e: MalformedEvent): void => {
    log.warn({ kind: e.kind, reason: e.reason }, 'malformed request: closed without an answer');
    hooks.onMalformed?.(e);
  };

  const depsFor = (conn: Conn, req: PluginRequest): PluginDeps => {
    /** See {@link STALE_REQUEST_SECONDS}. */
    const current = (): Promise<void> => (seconds(conn.arrived) > STALE_REQUEST_SECONDS ? sockets.sync() : Promise.resolve());
    const made = conn.quiet ? undefined : heal({ env: req.env, pid: req.pid });
    const h = made === undefined ? undefined : observedHeal(made, req.env['CNI_CONTAINERID'] ?? '', log, hooks);
    /** Throw (and mark the request declined) unless `path` is the host's file in our view. */
    const hostOnly = (path: string): void => {
      const why = conn.declined ?? view.notHostPath(path, req.pid);
      if (why === null) return;
      conn.declined = why;
      throw new DeclinedError(why);
    };
    return {
      openStore: async (o) => {
        conn.network = o.network;
        // Before anything is opened or created: nothing of the request has touched a store yet.
        hostOnly(o.dataDir);
        await current();
        if (conn.gone) {
          conn.dropped = 'before-store';
          throw new DroppedError('before-store');
        }
        const s = await openStore(o);
        return s === null ? null : new GuardedStore(s, conn, current);
      },
      readTextFile: (p) => {
        hostOnly(p);
        return readFileSync(p, 'utf8');
      },
      decoders,
      ...(h === undefined ? {} : { heal: h }),
      // The request's pool ADD carries its client's signal: queued, it is not sent once the shim is gone.
      ...(opts.pool === undefined ? {} : { pool: withSignal(opts.pool, conn, req.stdin, opts.learnPool) }),
      ...(opts.kernel === undefined || conn.quiet ? {} : { kernel: opts.kernel }),
    };
  };

  /** Serve one complete request that arrived (was read whole) at `arrived` (process.hrtime.bigint()). */
  const serve = async (conn: Conn, req: PluginRequest, arrived: bigint): Promise<void> => {
    const command = req.env['CNI_COMMAND'] ?? '';
    const containerId = req.env['CNI_CONTAINERID'] ?? '';
    if (req.ignored.length > 0) log.debug({ ignored: req.ignored }, 'request env: variables not forwarded were ignored');
    // STATUS and VERSION: at once, never behind the ADDs and DELs holding or awaiting the slots.
    const slotted = !UNQUEUED_COMMANDS.has(command);
    if (slotted && !slots.tryAcquire()) {
      log.debug({ command, containerId, queued: slots.waiting + 1 }, 'request queued: every request slot is busy');
      await slots.acquire();
    }
    const queuedSeconds = seconds(arrived);
    // The daemon's own warm-up (src/daemon/warm-up.ts): served alike, neither counted nor logged above debug.
    const quiet = conn.quiet;
    const served = quiet ? NO_HOOKS : hooks;
    try {
      if (conn.gone) {
        log[quiet ? 'debug' : 'info']({ command, containerId, stage: 'queued', durationSeconds: queuedSeconds }, 'request dropped: the client went away');
        served.onDropped?.({ command, containerId, network: null, stage: 'queued', durationSeconds: queuedSeconds });
        return;
      }
      const out: string[] = [];
      const err: string[] = [];
      const io: PluginIO = {
        env: exactEnv(req.env, () => req.envBlock),
        readStdin: async () => req.stdin,
        stdout: (t) => void out.push(t),
        stderr: (t) => void err.push(t),
      };
      const status = await pluginMain(makeHandlers(depsFor(conn, req)), io);
      // From the arrival: what the runtime waited for, a wait for a slot included.
      const durationSeconds = seconds(arrived);
      const network = conn.network;
      if (conn.declined !== null) {
        // Whatever the handlers made of the DeclinedError (STATUS wraps store errors), no answer:
        // the shim runs the standalone plugin, which sees the host's files.
        log[quiet ? 'debug' : 'warn']({ command, containerId, network, reason: conn.declined }, 'request declined (not a host path here): closed without an answer, the shim runs the standalone plugin');
        served.onDeclined?.({ command, containerId, reason: conn.declined });
        sockets.destroy(conn.id);
        return;
      }
      if (conn.dropped !== null) {
        log[quiet ? 'debug' : 'info']({ command, containerId, network, stage: conn.dropped, durationSeconds }, 'request dropped: the client went away');
        served.onDropped?.({ command, containerId, network, stage: conn.dropped, durationSeconds });
        sockets.destroy(conn.id);
        return;
      }
      const result = status === 0 ? 'ok' : 'error';
      const fields = { command, containerId, network, result, exitStatus: status, durationSeconds } as const;
      if (conn.gone) {
        log[quiet ? 'debug' : 'warn']({ ...fields, queuedSeconds }, 'request served, answer not delivered: the client went away');
        served.onRequest?.({ ...fields, delivered: false });
        return;
      }
      let answer: Buffer;
      try {
        answer = encodeAnswer({ exitStatus: status, stdout: out.join(''), stderr: err.join(''), version: req.version });
      } catch (e) {
        log.error({ ...fields, error: e instanceof Error ? e.message : String(e) }, 'answer cannot be encoded: closed without an answer');
        sockets.destroy(conn.id);
        return;
      }
      // Logged once the socket thread wrote it to the kernel (it then stays readable after our
      // side is closed): a daemon killed before that has not answered, and its shim falls back.
      // (The observers are told at once: their counts die with the process anyway.)
      answering.set(conn.id, (ok) => {
        if (ok) log[quiet ? 'debug' : 'info']({ ...fields, queuedSeconds }, 'request served');
        else log[quiet ? 'debug' : 'warn']({ ...fields, queuedSeconds }, 'request served, answer not delivered: the client went away');
      });
      sockets.answer(conn.id, answer);
      served.onRequest?.({ ...fields, delivered: true });
    } catch (e) {
      // pluginMain never throws; this is a bug in the server itself.
      log.error({ command, containerId, error: e instanceof Error ? (e.stack ?? e.message) : String(e) }, 'internal error serving a request');
      sockets.destroy(conn.id);
    } finally {
      if (slotted) slots.release();
    }
  };

  /** Requests the socket thread sent, by connection id, until served. */
  const byId = new Map<number, Conn>();
  /** Answers handed to the socket thread, by connection id: what to log once it says whether each was written. */
  const answering = new Map<number, (written: boolean) => void>();
  /** False until the socket passed its check: a request before that is closed unanswered. */
  let accepting = false;
  const onRequest = (m: RequestMessage): void => {
    const conn: Conn = { id: m.id, arrived: m.arrived, gone: false, dropped: null, network: null, command: m.env['CNI_COMMAND'] ?? '', containerId: m.env['CNI_CONTAINERID'] ?? '', declined: null, abort: null, quiet: false };
    conn.quiet = warmUpIdPrefix !== undefined && m.pid === process.pid && conn.containerId.startsWith(warmUpIdPrefix);
    const req: PluginRequest = {
      version: m.version,
      pid: m.pid,
      env: m.env,
      envBlock: Buffer.from(m.envBlock.buffer, m.envBlock.byteOffset, m.envBlock.byteLength),
      ignored: m.ignored,
      stdin: Buffer.from(m.stdin.buffer, m.stdin.byteOffset, m.stdin.byteLength),
    };
    byId.set(conn.id, conn);
    serving.add(conn);
    if (!accepting) {
      // The start is being aborted (the socket failed its check): no answer, the shim falls back.
      markGone(conn);
      sockets.destroy(conn.id);
    }
    // Started after every message already queued was read (setImmediate runs after the whole
    // batch the port delivers): a `gone` of this request that waits behind it in the queue — a
    // main thread that was blocked while its shim gave up — is seen before the request runs.
    const p = new Promise<void>((resolve) => setImmediate(resolve)).then(() => serve(conn, req, m.arrived)).finally(() => {
      serving.delete(conn);
      byId.delete(conn.id);
      pending.delete(p);
    });
    pending.add(p);
  };
  const sockets = await startSocketThread({
    path,
    ...(opts.onSocketThread === undefined ? {} : { onWorker: opts.onSocketThread }),
    maxConnections: opts.maxConnections ?? 1024,
    timeoutMs,
    onRequest,
    onGone: (id, ended) => {
      const conn = byId.get(id);
      if (conn === undefined) return;
      markGone(conn);
      if (ended) log.debug({ command: conn.command, containerId: conn.containerId }, 'client closed its connection while its request was in flight');
    },
    onMalformed: (kind, reason, id) => {
      const conn = id === null ? undefined : byId.get(id);
      if (conn !== undefined) markGone(conn);
      reject({ kind, reason });
    },
    onWritten: (id, ok) => {
      const done = answering.get(id);
      answering.delete(id);
      done?.(ok);
    },
    // The daemon's own warm-up connections cut by its stop: debug (only the header's pid is known here).
    onAbandoned: (receivedBytes, own) => log[own ? 'debug' : 'info']({ receivedBytes }, 'request abandoned: the client went away before sending its body (nothing was run)'),
    onConnError: (message) => log.debug({ error: message }, 'connection error'),
    onExit: (why) => {
      log.error({ error: why }, "the plugin socket's thread ended: every request goes to the standalone plugin; the daemon stops");
      // Its connections are closed: every shim waiting on one runs the standalone plugin now, so
      // nothing queued or waiting here may run any more (the drop rules, as for a client gone).
      for (const c of byId.values()) markGone(c);
      for (const done of answering.values()) done(false);
      answering.clear();
      opts.onFailed?.(why);
    },
    onServerError: (message) => log.error({ error: message }, 'plugin socket error'),
  }).catch((e: unknown) => {
    ownLock?.release();
    throw new SocketSetupError(e instanceof Error ? e.message : String(e), e);
  });
  let made: Stats | null = null;
  let bad: SocketSetupError | null = null;
  try {
    made = lstatSync(path);
    if (!made.isSocket() || (made.mode & 0o777) !== 0o600) bad = new SocketSetupError(`${path} was not created as a 0600 socket (mode ${modeText(made)})`);
  } catch (e) {
    bad = new SocketSetupError(`cannot stat ${path} after binding it: ${e instanceof Error ? e.message : String(e)}`, e);
  }
  if (bad !== null || made === null) {
    await sockets.finish();
    ownLock?.release();
    throw bad ?? new SocketSetupError(`cannot stat ${path} after binding it`);
  }
  const bound: Stats = made;
  accepting = true;

  let closed: Promise<void> | null = null;
  return {
    socketPath: path,
    get inFlight() {
      return serving.size;
    },
    get runtimeInFlight() {
      let n = 0;
      for (const c of serving) if (!c.quiet) n++;
      return n;
    },
    clientsCurrent: () => sockets.sync(),
    close() {
      closed ??= (async () => {
        // From this instant a shim finds no socket and runs the standalone plugin (the socket
        // thread stops accepting a moment later). Removed only if it is still ours.
        const now = lstatOrNullQuiet(path);
        if (now !== null && now.isSocket() && now.ino === bound.ino && now.dev === bound.dev) {
          try {
            unlinkSync(path);
          } catch {
            // gone meanwhile
          }
        }
        // No new connection; no answer for a request not yet complete (its shim falls back to
        // the standalone plugin). Every request read before that is in `pending` once it resolves.
        await sockets.stop();
        while (pending.size > 0) await Promise.allSettled([...pending]);
        // Answered connections close themselves once the answer is written.
        await sockets.finish();
        ownLock?.release();
      })();
      return closed;
    },
  };
}

function lstatOrNullQuiet(path: string): Stats | null {
  try {
    return lstatSync(path);
  } catch {
    return null;
  }
}
