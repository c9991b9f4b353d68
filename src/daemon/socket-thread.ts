/**
 * The main thread's side of the plugin socket's thread (src/daemon/socket-worker.ts;
 * docs/daemon.md "Threads"): starts the Worker, binds the socket through it under umask 0177,
 * keeps the heartbeat the thread reads before it acknowledges a header, and turns the thread's
 * messages (src/daemon/socket-messages.ts) into calls.
 */
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';
import { Worker } from 'node:worker_threads';
import { SOCKET_WORKER_CODE } from './socket-worker-code.ts';
import {
  HEARTBEAT_MS,
  SHARED_BOUND,
  SHARED_BYTES,
  SHARED_HEARTBEAT,
  type FromSocketThread,
  type RequestMessage,
  type SocketThreadData,
  type ToSocketThread,
} from './socket-messages.ts';

/**
 * The socket thread's program when run from the sources (tests through tsx; the build carries it
 * bundled): tsx's require hook, then the TypeScript file. A Worker does not inherit tsx's
 * `--import` hooks on Node 20.
 */
function fromSources(): string {
  const tsx = createRequire(import.meta.url).resolve('tsx/cjs');
  return `require(${JSON.stringify(tsx)}); require(${JSON.stringify(fileURLToPath(new URL('./socket-worker.ts', import.meta.url)))});`;
}

/** Milliseconds the main thread waits, holding umask 0177, for the socket thread's bind(2). */
const BIND_WAIT_MS = 10_000;

/** What {@link startSocketThread} is given. Every callback runs on the main thread and must not throw. */
export interface SocketThreadOptions {
  /** The socket path (absolute, ≤ 107 bytes); its directory checked and its lock held by the caller. */
  readonly path: string;
  /** Open connections at most. */
  readonly maxConnections: number;
  /** Milliseconds a client has to send its whole request. */
  readonly timeoutMs: number;
  /** A complete request (its connection `m.id` waits for {@link SocketThread.answer} or {@link SocketThread.destroy}). */
  onRequest(m: RequestMessage): void;
  /** The client of request `id` went away; `ended`: it closed its side (rather than a reset). */
  onGone(id: number, ended: boolean): void;
  /** A connection closed without an answer because of what its client sent; `id` its request when complete, else null. */
  onMalformed(kind: 'malformed' | 'unsupported-version' | 'timeout', reason: string, id: number | null): void;
  /** Request `id`'s answer was written to the kernel (`ok`), or could not be. */
  onWritten(id: number, ok: boolean): void;
  /** A version-2 client left after its acknowledged header (`own`: the header named this process). */
  onAbandoned(receivedBytes: number, own: boolean): void;
  /** A connection failed (reset, EPIPE). */
  onConnError(message: string): void;
  /** The listening socket reported an error. */
  onServerError(message: string): void;
  /** Given the thread's Worker once it started (tests end it to see what a thread that dies does). */
  onWorker?(worker: Worker): void;
  /**
   * The thread ended or failed after the socket listened (a bug): `why` says how. Not called
   * once {@link SocketThread.finish} began, nor when the start fails (that rejects instead).
   */
  onExit(why: string): void;
}

/** A running socket thread, listening. */
export interface SocketThread {
  /** Write `answer` to request `id`'s client, then close its connection. */
  answer(id: number, answer: Uint8Array): void;
  /** Close request `id`'s connection without an answer. */
  destroy(id: number): void;
  /**
   * Resolves once every client end (end of stream, reset) the thread could see when asked has
   * been reported (`onGone`, `onMalformed`, `onAbandoned` called); at once when the thread has ended.
   */
  sync(): Promise<void>;
  /**
   * Stop accepting and close every connection whose request is not complete. Resolves when the
   * thread has done so: every request it read before is then delivered (`onRequest`).
   * Idempotent.
   */
  stop(): Promise<void>;
  /**
   * Close every connection not answered, wait until all are closed (answers written) and the
   * listening socket is closed, then end the thread. Idempotent; never rejects.
   */
  finish(): Promise<void>;
}

/**
 * Start the socket thread and listen on `opts.path`, bound while this thread holds umask 0177
 * (so the socket file is 0600 from its first instant; a Worker cannot set the umask): the umask is
 * set, the thread binds, this thread waits for it (Atomics.wait, at most {@link BIND_WAIT_MS}), the
 * umask is restored. Resolves once the socket listens.
 * @throws Error `cannot listen on <path>: <reason>` when binding or listening fails, or the
 *   thread cannot start (the thread is ended first).
 */
export async function startSocketThread(opts: SocketThreadOptions): Promise<SocketThread> {
  const shared = new SharedArrayBuffer(SHARED_BYTES);
  const beat = new BigInt64Array(shared, 0, 1);
  const bound = new Int32Array(shared);
  const tick = (): void => void Atomics.store(beat, SHARED_HEARTBEAT, process.hrtime.bigint());
  tick();
  const heartbeat = setInterval(tick, HEARTBEAT_MS);
  heartbeat.unref();
  const data: SocketThreadData = { path: opts.path, maxConnections: opts.maxConnections, timeoutMs: opts.timeoutMs, shared };
  const worker = new Worker(SOCKET_WORKER_CODE ?? fromSources(), { eval: true, workerData: data });
  opts.onWorker?.(worker);
  const send = (m: ToSocketThread, transfer?: ArrayBuffer[]): void => worker.postMessage(m, transfer);

  /** Resolvers waiting for one kind of message. */
  const waiting = new Map<FromSocketThread['t'], Array<(m: FromSocketThread) => void>>();
  const next = <K extends FromSocketThread['t']>(t: K): Promise<Extract<FromSocketThread, { t: K }>> =>
    new Promise((resolve) => {
      const list = waiting.get(t) ?? [];
      list.push(resolve as (m: FromSocketThread) => void);
      waiting.set(t, list);
    });
  let ended: string | null = null;
  /** Pending {@link SocketThread.sync} calls, by number. */
  const syncing = new Map<number, () => void>();
  let syncs = 0;
  let finishing = false;
  /** The socket listened: from then on an end of the thread is reported (`onExit`). */
  let serving = false;
  /** Settled when the thread has exited. */
  const exited = new Promise<void>((resolve) => worker.once('exit', () => resolve()));
  const failure = new Promise<string>((resolve) => {
    worker.on('error', (e) => resolve(`the socket thread failed: ${e instanceof Error ? (e.stack ?? e.message) : String(e)}`));
    worker.once('exit', (code) => resolve(`the socket thread exited (code ${code})`));
  });
  void failure.then((why) => {
    ended = why;
    clearInterval(heartbeat);
    // Nothing more will be reported: whoever waits has every report there will be.
    for (const done of syncing.values()) done();
    syncing.clear();
    if (serving && !finishing) opts.onExit(why);
  });

  worker.on('message', (m: FromSocketThread) => {
    // This thread runs: the heartbeat, also between timers (a long run of messages).
    tick();
    switch (m.t) {
      case 'request':
        opts.onRequest(m);
        return;
      case 'gone':
        opts.onGone(m.id, m.ended);
        return;
      case 'malformed':
        opts.onMalformed(m.kind, m.reason, m.id);
        return;
      case 'written':
        for (const [id, ok] of m.items) opts.onWritten(id, ok);
        return;
      case 'abandoned':
        opts.onAbandoned(m.receivedBytes, m.own);
        return;
      case 'conn-error':
        opts.onConnError(m.message);
        return;
      case 'server-error':
        opts.onServerError(m.message);
        return;
      case 'synced': {
        const done = syncing.get(m.n);
        syncing.delete(m.n);
        done?.();
        return;
      }
      default: {
        const list = waiting.get(m.t);
        const resolve = list?.shift();
        resolve?.(m);
      }
    }
  });

  let finished: Promise<void> | null = null;
  const finish = (): Promise<void> => {
    finished ??= (async () => {
      finishing = true;
      if (ended === null) {
        send({ t: 'finish' });
        await Promise.race([next('finished'), exited]);
      }
      clearInterval(heartbeat);
      await worker.terminate();
    })();
    return finished;
  };
  const cannot = async (why: string): Promise<never> => {
    await finish();
    throw new Error(`cannot listen on ${opts.path}: ${why}`);
  };

  const first = await Promise.race([next('ready'), failure]);
  if (typeof first === 'string') return cannot(first);
  const listened = Promise.race([next('listening'), next('listen-error'), failure]);
  const old = process.umask(0o177);
  let waited: string;
  try {
    send({ t: 'listen' });
    waited = Atomics.wait(bound, SHARED_BOUND, 0, BIND_WAIT_MS);
  } finally {
    process.umask(old);
  }
  if (waited === 'timed-out') return cannot(`the socket thread did not bind within ${BIND_WAIT_MS / 1000}s`);
  const r = await listened;
  if (typeof r === 'string') return cannot(r);
  if (r.t === 'listen-error') return cannot(r.message);
  if (ended !== null) return cannot(ended);
  serving = true;

  let stopped: Promise<void> | null = null;
  return {
    answer(id, answer) {
      // A buffer of its own, transferred: `answer` may be a slice of Node's shared pool.
      const bytes = new Uint8Array(answer);
      send({ t: 'answer', id, bytes }, [bytes.buffer]);
    },
    destroy(id) {
      send({ t: 'destroy', id });
    },
    sync() {
      if (ended !== null || finishing) return Promise.resolve();
      const n = ++syncs;
      return new Promise<void>((resolve) => {
        syncing.set(n, resolve);
        send({ t: 'sync', n });
      });
    },
    stop() {
      if (stopped === null) {
        stopped = ended !== null ? Promise.resolve() : Promise.race([next('stopped'), exited]).then(() => undefined);
        if (ended === null) send({ t: 'stop' });
      }
      return stopped;
    },
    finish,
  };
}
