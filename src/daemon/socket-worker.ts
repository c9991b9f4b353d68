/**
 * The plugin socket's thread (a `worker_threads` Worker started by src/daemon/plugin-server.ts;
 * docs/daemon.md "Threads"). It owns every connection of the socket, so the per-connection work
 * (accept, the socket and stream objects, reading, decoding, the acknowledgement, the request
 * deadline, writing the answer) is off the main thread, which serves complete requests only.
 * Measured: Node's per-connection code was a fifth of the main thread's time in a burst
 * (docs/benchmarks.md "The shim's C library, and the burst's ceiling").
 *
 * The rules it keeps (the plugin server's, unchanged):
 * - a version-2 header is acknowledged at once when it is read, provided the main thread's event
 *   loop runs ({@link HEARTBEAT_STALE_NS}); otherwise as soon as it runs again, so a shim facing a
 *   blocked daemon still gets no acknowledgement within its short deadline and falls back;
 * - a malformed request, another protocol version, or a request not complete within the deadline:
 *   closed without an answer, and reported;
 * - a client that leaves after its acknowledged header, before any of its body: abandoned,
 *   nothing is run;
 * - a client gone after its complete request: reported once, so the main thread drops the request
 *   (before the store, after the lock) or does not answer;
 * - the answer: written, then the connection closed (written to the kernel, it stays readable);
 *   whether it was written is reported, and only then does the main thread log it served: a
 *   daemon killed in between has not answered, and its shim runs the standalone plugin.
 * Messages: src/daemon/socket-messages.ts.
 */
import { createServer, type Socket } from 'node:net';
import { parentPort, workerData } from 'node:worker_threads';
import { encodeAck, HEADER_BYTES, RequestDecoder, SUPPORTED_PROTOCOL_VERSIONS } from './protocol.ts';
import {
  HEARTBEAT_STALE_NS,
  SHARED_BOUND,
  SHARED_HEARTBEAT,
  type FromSocketThread,
  type SocketThreadData,
  type ToSocketThread,
} from './socket-messages.ts';

/** At most this long (milliseconds) between an answer's write and its report to the main thread. */
const WRITTEN_BATCH_MS = 20;

/** One connection. */
interface Conn {
  readonly id: number;
  readonly sock: Socket;
  readonly decoder: RequestDecoder;
  /** The request is complete and was sent to the main thread. */
  started: boolean;
  /** The version-2 header was acknowledged (or its acknowledgement is held back). */
  acked: boolean;
  /** Its end was reported (malformed, timeout, abandoned). */
  settled: boolean;
  /** The client went away; `gone` was sent when started. */
  gone: boolean;
  /** The answer was handed to the socket. */
  answered: boolean;
  /** `written` was sent for its answer. */
  reported: boolean;
  readonly timer: NodeJS.Timeout;
}

/** Run the socket thread on `port` with `data`. Returns at once; the thread lives on its handles. */
function run(port: NonNullable<typeof parentPort>, data: SocketThreadData): void {
  const post = (m: FromSocketThread, transfer?: ArrayBuffer[]): void => {
    flushWritten();
    port.postMessage(m, transfer);
  };
  const beat = new BigInt64Array(data.shared, 0, 1);
  const bound = new Int32Array(data.shared);
  const mainAlive = (): boolean => process.hrtime.bigint() - Atomics.load(beat, SHARED_HEARTBEAT) < HEARTBEAT_STALE_NS;
  const conns = new Map<number, Conn>();
  /** Connections whose acknowledgement waits for the main thread's event loop to run. */
  const heldAcks = new Set<Conn>();
  let heldTimer: NodeJS.Timeout | null = null;
  let nextId = 1;
  let closing = false;
  let finishing = false;
  let serverClosed = false;

  const ack = (c: Conn): void => {
    if (!c.gone) c.sock.write(encodeAck());
  };
  const releaseHeldAcks = (): void => {
    if (!mainAlive()) return;
    for (const c of heldAcks) ack(c);
    heldAcks.clear();
    if (heldTimer !== null) clearInterval(heldTimer);
    heldTimer = null;
  };
  const goneStarted = (c: Conn, ended: boolean): void => {
    if (c.gone) return;
    c.gone = true;
    heldAcks.delete(c);
    if (c.started) post({ t: 'gone', id: c.id, ended });
  };
  const refuse = (c: Conn, kind: 'malformed' | 'unsupported-version' | 'timeout', reason: string): void => {
    c.settled = true;
    clearTimeout(c.timer);
    post({ t: 'malformed', kind, reason, id: c.started ? c.id : null });
    goneStarted(c, false);
    c.sock.destroy();
  };
  /** See the module comment: true (and reported) when `c` left after its acknowledged header only. */
  const abandoned = (c: Conn): boolean => {
    if (c.settled || c.started || !c.acked || c.decoder.received !== HEADER_BYTES) return false;
    c.settled = true;
    clearTimeout(c.timer);
    post({ t: 'abandoned', receivedBytes: c.decoder.received, own: c.decoder.headerPid === process.pid });
    c.sock.destroy();
    return true;
  };
  /**
   * Answers written (or not) and not yet reported: sent in one message within
   * {@link WRITTEN_BATCH_MS}, or before any other message (so the main thread is not woken once
   * more per request only to log it; nothing waits for these).
   */
  let unreported: Array<[number, boolean]> = [];
  let reportTimer: NodeJS.Timeout | null = null;
  const flushWritten = (): void => {
    if (reportTimer !== null) clearTimeout(reportTimer);
    reportTimer = null;
    if (unreported.length === 0) return;
    const items = unreported;
    unreported = [];
    port.postMessage({ t: 'written', items } satisfies FromSocketThread);
  };
  const report = (id: number, ok: boolean): void => {
    unreported.push([id, ok]);
    reportTimer ??= setTimeout(flushWritten, WRITTEN_BATCH_MS);
  };
  /** Report, once, whether `c`'s answer reached the kernel. */
  const written = (c: Conn, ok: boolean): void => {
    if (c.reported) return;
    c.reported = true;
    report(c.id, ok);
  };
  const maybeFinished = (): void => {
    if (finishing && serverClosed && conns.size === 0) {
      post({ t: 'finished' });
      port.close();
    }
  };

  const server = createServer((sock) => {
    if (closing) {
      sock.destroy();
      return;
    }
    const c: Conn = {
      id: nextId++,
      sock,
      decoder: new RequestDecoder(),
      started: false,
      acked: false,
      settled: false,
      gone: false,
      answered: false,
      reported: false,
      timer: setTimeout(() => {
        if (!c.started && !c.settled) refuse(c, 'timeout', `no complete request within ${data.timeoutMs / 1000}s (${c.decoder.received} bytes received)`);
      }, data.timeoutMs),
    };
    conns.set(c.id, c);
    sock.on('data', (chunk: Buffer) => {
      const st = c.decoder.push(chunk);
      if (!c.acked && c.decoder.version === 2 && st.kind !== 'malformed' && !c.gone) {
        c.acked = true;
        if (mainAlive()) ack(c);
        else {
          heldAcks.add(c);
          heldTimer ??= setInterval(releaseHeldAcks, 20);
        }
      }
      if (st.kind === 'complete' && !c.started) {
        const arrived = process.hrtime.bigint();
        c.started = true;
        clearTimeout(c.timer);
        heldAcks.delete(c);
        const r = st.value;
        // Buffers of their own: the decoder's may be a slice of Node's shared pool.
        const envBlock = new Uint8Array(r.envBlock);
        const stdin = new Uint8Array(r.stdin);
        post({ t: 'request', id: c.id, version: r.version, pid: r.pid, env: r.env, envBlock, ignored: r.ignored, stdin, arrived }, [envBlock.buffer, stdin.buffer]);
      } else if (st.kind === 'malformed') {
        if (!c.settled) refuse(c, 'malformed', st.reason);
      } else if (st.kind === 'unsupported-version') {
        if (!c.settled) refuse(c, 'unsupported-version', `protocol version ${st.version} (this daemon speaks ${SUPPORTED_PROTOCOL_VERSIONS.join(' and ')})`);
      }
    });
    sock.on('end', () => {
      if (c.gone) return;
      if (!c.started) {
        c.gone = true;
        heldAcks.delete(c);
        clearTimeout(c.timer);
        if (abandoned(c)) return;
        const st = c.decoder.end();
        if (st.kind === 'malformed' && !c.settled) refuse(c, 'malformed', st.reason);
      } else goneStarted(c, true);
    });
    sock.on('error', (e) => {
      goneStarted(c, false);
      c.gone = true;
      post({ t: 'conn-error', message: e.message });
    });
    sock.on('close', () => {
      // A client gone with a reset, or our acknowledgement met EPIPE: no 'end' came.
      goneStarted(c, false);
      c.gone = true;
      heldAcks.delete(c);
      clearTimeout(c.timer);
      abandoned(c);
      if (c.answered) written(c, false);
      conns.delete(c.id);
      maybeFinished();
    });
  });
  server.maxConnections = data.maxConnections;

  port.on('message', (m: ToSocketThread) => {
    switch (m.t) {
      case 'listen': {
        server.once('error', (e) => {
          Atomics.store(bound, SHARED_BOUND, 1);
          Atomics.notify(bound, SHARED_BOUND);
          post({ t: 'listen-error', message: e.message });
        });
        server.once('listening', () => {
          server.removeAllListeners('error');
          server.on('error', (e) => post({ t: 'server-error', message: e.message }));
          post({ t: 'listening' });
        });
        // bind(2) runs inside listen() for a path; the main thread holds the umask until told.
        try {
          server.listen(data.path);
        } finally {
          Atomics.store(bound, SHARED_BOUND, 1);
          Atomics.notify(bound, SHARED_BOUND);
        }
        return;
      }
      case 'answer': {
        const c = conns.get(m.id);
        if (c === undefined || c.gone) {
          // Its client went away while the main thread ran the request.
          if (c === undefined) report(m.id, false);
          else {
            c.answered = true;
            written(c, false);
            c.sock.destroy();
          }
          return;
        }
        c.answered = true;
        // Written to the kernel, the answer stays readable after our side is closed.
        c.sock.end(m.bytes, (err?: Error | null) => {
          written(c, err === undefined || err === null);
          c.sock.destroy();
        });
        return;
      }
      case 'sync':
        // Each turn polls the kernel for ready connections (all of them, or libuv's batch); what
        // they show (an end, a reset) is posted before the answer.
        setImmediate(() => setImmediate(() => post({ t: 'synced', n: m.n })));
        return;
      case 'destroy':
        conns.get(m.id)?.sock.destroy();
        return;
      case 'stop':
        closing = true;
        server.close(() => {
          serverClosed = true;
          maybeFinished();
        });
        // No answer for a request not yet complete: its shim falls back to the standalone plugin.
        for (const c of conns.values()) if (!c.started) c.sock.destroy();
        post({ t: 'stopped' });
        return;
      case 'finish':
        finishing = true;
        if (!closing) {
          closing = true;
          if (server.listening) {
            server.close(() => {
              serverClosed = true;
              maybeFinished();
            });
          } else serverClosed = true;
        }
        // Answered connections close themselves once the answer is written.
        for (const c of conns.values()) if (!c.answered) c.sock.destroy();
        maybeFinished();
        return;
    }
  });
  post({ t: 'ready' });
}

if (parentPort !== null) run(parentPort, workerData as SocketThreadData);
