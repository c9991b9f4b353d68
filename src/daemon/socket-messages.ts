/**
 * The messages between the plugin server (the daemon's main thread, src/daemon/plugin-server.ts)
 * and its socket thread (src/daemon/socket-worker.ts), and the layout of the memory they share.
 *
 * The socket thread owns every connection of the plugin socket: it accepts, reads and decodes
 * the request, acknowledges a version-2 header, keeps the request deadline, and writes the answer
 * the main thread sends back. The main thread serves complete requests only (docs/daemon.md
 * "Threads"). A connection is named by an id (a positive integer, never reused in a thread's life).
 */
import type { PluginRequest } from './protocol.ts';

/**
 * A complete request, decoded by the socket thread: `PluginRequest`'s fields (its `envBlock` and
 * `stdin` in buffers of their own, transferred), its connection's id, and when it was read.
 */
export interface RequestMessage extends PluginRequest {
  readonly t: 'request';
  readonly id: number;
  /** When the last byte of the request was read: `process.hrtime.bigint()` (one clock for every thread). */
  readonly arrived: bigint;
}

/** Socket thread → main thread. */
export type FromSocketThread =
  /** Waiting for `listen` (the thread has started). */
  | { readonly t: 'ready' }
  /** The socket listens. */
  | { readonly t: 'listening' }
  /** Binding or listening failed (the thread then waits for `finish`). */
  | { readonly t: 'listen-error'; readonly message: string }
  | RequestMessage
  /**
   * The client of request `id` went away (end of stream, error or close; sent once per request).
   * `ended`: by an end of stream (the client closed its side) rather than a reset.
   */
  | { readonly t: 'gone'; readonly id: number; readonly ended: boolean }
  /** A connection closed without an answer because of what its client sent (`id`: its request, when it was complete). */
  | { readonly t: 'malformed'; readonly kind: 'malformed' | 'unsupported-version' | 'timeout'; readonly reason: string; readonly id: number | null }
  /** A version-2 client left after its acknowledged header, before any of its body. `own`: its header named this process's pid. */
  | { readonly t: 'abandoned'; readonly receivedBytes: number; readonly own: boolean }
  /**
   * For each `[id, ok]`: request `id`'s answer was written to the kernel (`ok`), or could not be
   * (its client had gone). Batched: sent within 20 ms of the writes, or before any other message.
   */
  | { readonly t: 'written'; readonly items: ReadonlyArray<readonly [number, boolean]> }
  /** A connection failed (reset, EPIPE). */
  | { readonly t: 'conn-error'; readonly message: string }
  /** The listening socket reported an error. */
  | { readonly t: 'server-error'; readonly message: string }
  /** Answer to `sync` `n`: every connection end the thread could see when it got `sync` was reported before this. */
  | { readonly t: 'synced'; readonly n: number }
  /** Answer to `stop`: nothing is accepted any more; every request read before it was sent before this. */
  | { readonly t: 'stopped' }
  /** Answer to `finish`: the listening socket and every connection are closed. */
  | { readonly t: 'finished' };

/** Main thread → socket thread. */
export type ToSocketThread =
  /** Bind and listen on the path (the main thread holds the umask for the bind: see {@link SHARED_BOUND}). */
  | { readonly t: 'listen' }
  /** Write the answer of request `id` (a buffer of its own, transferred), then close. */
  | { readonly t: 'answer'; readonly id: number; readonly bytes: Uint8Array }
  /** Close request `id`'s connection without an answer (the shim then runs the standalone plugin). */
  | { readonly t: 'destroy'; readonly id: number }
  /**
   * Answer `synced` `n` after two turns of the thread's event loop: the ends of stream and resets
   * already waiting in the kernel when this came are read, and reported, first.
   */
  | { readonly t: 'sync'; readonly n: number }
  /** Stop accepting; close every connection whose request is not complete. */
  | { readonly t: 'stop' }
  /** Close every connection not answered, wait until all are closed, then say `finished`. */
  | { readonly t: 'finish' };

/** What the socket thread is started with (`workerData`). */
export interface SocketThreadData {
  /** The socket path (absolute, ≤ 107 bytes). */
  readonly path: string;
  /** Open connections at most (`net.Server.maxConnections`). */
  readonly maxConnections: number;
  /** Milliseconds a client has to send its whole request. */
  readonly timeoutMs: number;
  /** {@link SHARED_BYTES} bytes shared with the main thread. */
  readonly shared: SharedArrayBuffer;
}

/** Size of the shared memory, bytes. */
export const SHARED_BYTES = 16;
/**
 * BigInt64 index 0 of the shared memory: the main thread's heartbeat, `process.hrtime.bigint()`
 * written every {@link HEARTBEAT_MS} while its event loop runs.
 */
export const SHARED_HEARTBEAT = 0;
/** Int32 index 2 of the shared memory: set to 1 (and notified) by the socket thread once bind(2) returned. */
export const SHARED_BOUND = 2;
/** How often the main thread writes its heartbeat, milliseconds (also on every message it receives). */
export const HEARTBEAT_MS = 50;
/**
 * A heartbeat older than this (nanoseconds: 250 ms) means the main thread's event loop is not
 * running (blocked, or the process stopped): the socket thread then holds back acknowledgements
 * until it runs again, as the main thread itself did when it read the sockets (a shim not
 * acknowledged within its short deadline runs the standalone plugin; docs/daemon.md).
 */
export const HEARTBEAT_STALE_NS = 250_000_000n;
