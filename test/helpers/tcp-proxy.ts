/**
 * A loopback TCP proxy for fault injection (issue 11): one listener in front of one target
 * (`host:port`), and {@link startNodeProxies}, one proxy per etcd member endpoint for one
 * simulated node, switched together. The mode applies from the moment it is set, to new and to
 * open connections:
 *
 * - `pass`: bytes are forwarded both ways (after any bytes still queued by an earlier delay,
 *   so the order of a connection's bytes is kept);
 * - `drop` (black hole): connections are accepted and read, nothing is forwarded in either
 *   direction and nothing is answered, like a partition that eats packets. A connection that lost
 *   bytes this way can never carry a valid stream again, so when the mode leaves `drop` it is
 *   reset (what a peer sees when TCP finally gives up on a long partition); a connection accepted
 *   during `drop` has no upstream at all and is reset too;
 * - `delay`: every chunk is forwarded `ms` milliseconds after it was read, both ways;
 * - `reset`: open connections are reset (RST) and new ones are reset on accept.
 *
 * The counters make tests deterministic: a test waits until `stats().droppedBytes` reaches what
 * it sent instead of sleeping. Every socket and the listener are closed by `close()` (idempotent).
 */
import { createServer, connect, type Server, type Socket } from 'node:net';

/** A proxy mode; see the module comment. `delay.ms` is in milliseconds (≥ 0). */
export type ProxyMode = { kind: 'pass' } | { kind: 'drop' } | { kind: 'delay'; ms: number } | { kind: 'reset' };

/** Counters since the proxy started. Bytes are payload bytes, both directions summed. */
export interface ProxyStats {
  /** Connections accepted. */
  accepted: number;
  /** Connections reset by the proxy (mode `reset`, or leaving `drop`, or the target refusing). */
  resets: number;
  /** Bytes written to the other side. */
  forwardedBytes: number;
  /** Bytes read and discarded in mode `drop`. */
  droppedBytes: number;
  /** Connections open now. */
  open: number;
  /** Bytes read and waiting for their delay now. */
  queuedBytes: number;
}

/** One running proxy. */
export interface TcpProxy {
  /** The loopback port it listens on. */
  readonly port: number;
  /** `http://127.0.0.1:PORT` (the proxied endpoint to give a client). */
  readonly url: string;
  /** The target it forwards to. */
  readonly target: { host: string; port: number };
  /** The current mode. */
  mode(): ProxyMode;
  /** Switch the mode (see the module comment). Throws RangeError on a negative or non-finite delay. */
  setMode(mode: ProxyMode): void;
  stats(): ProxyStats;
  /** Stop listening and destroy every connection. Idempotent. */
  close(): Promise<void>;
}

interface Pipe {
  client: Socket;
  upstream: Socket | null;
  /** Lost bytes in `drop`: reset when the mode leaves `drop`. */
  tainted: boolean;
  /** Chunks waiting for their time, per direction, in order. */
  queue: { due: number; toUpstream: boolean; chunk: Buffer }[];
  timer: NodeJS.Timeout | null;
  dead: boolean;
}

function checkMode(m: ProxyMode): void {
  if (m.kind === 'delay' && (!Number.isFinite(m.ms) || m.ms < 0)) throw new RangeError(`proxy delay must be a finite number of ms ≥ 0, got ${m.ms}`);
}

/**
 * Parse `http://host:port` (or `host:port`) into a target. Throws TypeError on anything else.
 */
export function parseTarget(endpoint: string): { host: string; port: number } {
  const m = /^(?:[a-z]+:\/\/)?([^:/]+):(\d+)\/?$/.exec(endpoint);
  const port = m ? Number(m[2]) : NaN;
  if (!m || m[1] === undefined || !(port > 0 && port < 65536)) throw new TypeError(`not a host:port endpoint: ${JSON.stringify(endpoint)}`);
  return { host: m[1], port };
}

/**
 * Start a proxy on 127.0.0.1 (a free port chosen by the kernel) in front of `target`
 * (`http://host:port`, `host:port` or an object), in `initial` mode (default pass).
 * Resolves once it listens.
 */
export async function startTcpProxy(target: string | { host: string; port: number }, initial: ProxyMode = { kind: 'pass' }): Promise<TcpProxy> {
  const to = typeof target === 'string' ? parseTarget(target) : target;
  checkMode(initial);
  let mode: ProxyMode = initial;
  const pipes = new Set<Pipe>();
  const st = { accepted: 0, resets: 0, forwardedBytes: 0, droppedBytes: 0 };
  let closed = false;

  const kill = (p: Pipe, reset: boolean): void => {
    if (p.dead) return;
    p.dead = true;
    pipes.delete(p);
    if (p.timer !== null) clearTimeout(p.timer);
    p.queue.length = 0;
    if (reset) {
      st.resets++;
      p.client.resetAndDestroy();
      p.upstream?.resetAndDestroy();
    } else {
      p.client.destroy();
      p.upstream?.destroy();
    }
  };

  const flush = (p: Pipe): void => {
    p.timer = null;
    const now = Date.now();
    while (p.queue.length > 0 && !p.dead) {
      const head = p.queue[0];
      if (head === undefined || head.due > now) break;
      p.queue.shift();
      const dst = head.toUpstream ? p.upstream : p.client;
      if (dst === null) continue;
      dst.write(head.chunk);
      st.forwardedBytes += head.chunk.length;
    }
    const next = p.queue[0];
    if (next !== undefined && !p.dead) p.timer = setTimeout(() => flush(p), Math.max(0, next.due - Date.now()));
  };

  const onData = (p: Pipe, toUpstream: boolean, chunk: Buffer): void => {
    if (p.dead) return;
    const m = mode;
    if (m.kind === 'drop' || (toUpstream && p.upstream === null)) {
      st.droppedBytes += chunk.length;
      p.tainted = true;
      return;
    }
    if (m.kind === 'reset') {
      kill(p, true);
      return;
    }
    const due = Date.now() + (m.kind === 'delay' ? m.ms : 0);
    if (m.kind === 'pass' && p.queue.length === 0) {
      const dst = toUpstream ? p.upstream : p.client;
      dst?.write(chunk);
      st.forwardedBytes += chunk.length;
      return;
    }
    p.queue.push({ due: Math.max(due, p.queue[p.queue.length - 1]?.due ?? 0), toUpstream, chunk });
    if (p.timer === null) p.timer = setTimeout(() => flush(p), Math.max(0, due - Date.now()));
  };

  const server: Server = createServer({ pauseOnConnect: false }, (client) => {
    st.accepted++;
    const p: Pipe = { client, upstream: null, tainted: false, queue: [], timer: null, dead: false };
    client.on('error', () => kill(p, false));
    client.on('close', () => kill(p, false));
    if (closed || mode.kind === 'reset') {
      st.resets++;
      p.dead = true;
      client.resetAndDestroy();
      return;
    }
    pipes.add(p);
    client.on('data', (c: Buffer) => onData(p, true, c));
    if (mode.kind === 'drop') {
      p.tainted = true; // no upstream: it can only be reset later
      return;
    }
    const up = connect({ host: to.host, port: to.port });
    p.upstream = up;
    up.on('data', (c: Buffer) => onData(p, false, c));
    up.on('error', () => kill(p, true)); // target down: the client sees a reset, as without a proxy
    up.on('close', () => kill(p, false));
  });

  await new Promise<void>((res, rej) => {
    server.once('error', rej);
    server.listen(0, '127.0.0.1', () => res());
  });
  const a = server.address();
  const port = typeof a === 'object' && a !== null ? a.port : 0;

  return {
    port,
    url: `http://127.0.0.1:${port}`,
    target: to,
    mode: () => mode,
    setMode(m) {
      checkMode(m);
      const was = mode;
      mode = m;
      if (m.kind === 'reset') {
        for (const p of [...pipes]) kill(p, true);
      } else if (was.kind === 'drop' && m.kind !== 'drop') {
        for (const p of [...pipes]) if (p.tainted) kill(p, true);
      }
    },
    stats: () => {
      let queuedBytes = 0;
      for (const p of pipes) for (const q of p.queue) queuedBytes += q.chunk.length;
      return { ...st, open: pipes.size, queuedBytes };
    },
    async close() {
      if (closed) return;
      closed = true;
      for (const p of [...pipes]) kill(p, false);
      await new Promise<void>((res) => server.close(() => res()));
    },
  };
}

/** The proxies of one simulated node: one per etcd member, switched together. */
export interface NodeProxies {
  /** Proxied client URLs, in the order of the targets (give these to the node's etcd client). */
  readonly endpoints: string[];
  readonly proxies: readonly TcpProxy[];
  /** Set `mode` on every proxy of the node. */
  setMode(mode: ProxyMode): void;
  /** Close every proxy. Idempotent. */
  close(): Promise<void>;
}

/**
 * One proxy per endpoint of `endpoints` (etcd client URLs, `http://127.0.0.1:PORT`), in `initial`
 * mode. If one fails to start, the ones started are closed and the error is thrown.
 */
export async function startNodeProxies(endpoints: readonly string[], initial: ProxyMode = { kind: 'pass' }): Promise<NodeProxies> {
  const proxies: TcpProxy[] = [];
  try {
    for (const e of endpoints) proxies.push(await startTcpProxy(e, initial));
  } catch (e) {
    await Promise.all(proxies.map((p) => p.close()));
    throw e;
  }
  return {
    endpoints: proxies.map((p) => p.url),
    proxies,
    setMode: (m) => {
      checkMode(m);
      for (const p of proxies) p.setMode(m);
    },
    close: async () => {
      await Promise.all(proxies.map((p) => p.close()));
    },
  };
}
