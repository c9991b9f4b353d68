/**
 * A fake ipwarden daemon for black-box tests of the exec shim: a Node unix-socket server that
 * speaks protocol v2 (docs/daemon.md: it acknowledges a version-2 header at once, then reads the
 * body) — or deliberately does not. It is the hostile side: it can answer exactly, close without
 * answering, send any raw bytes (bad magic, bad version, half an answer), never answer, never
 * acknowledge (a stopped daemon), close on the header (a daemon that speaks only v1) or send a
 * wrong acknowledgement. Every connection is recorded with the request bytes it carried, so a
 * test can assert what the shim sent (magic, version, pid, env block, stdin) and whether the shim
 * went away.
 */
import { createServer, type Server, type Socket } from 'node:net';

/** The magic of requests and answers, both directions. */
export const MAGIC = Buffer.from('IPWD', 'latin1');
/** The acknowledgement of a version-2 header: "IPWA", then 2 (u32 LE). */
export const ACK = Buffer.from([0x49, 0x50, 0x57, 0x41, 2, 0, 0, 0]);
/** Fixed header size of a request and of an answer: 5 × u32, bytes. */
export const HEADER_BYTES = 20;

/**
 * How the fake daemon treats a connection once it has read a full request (or the client's end).
 * Except for `no-ack`, `close-on-header` and `bad-ack` it first acknowledges a version-2 header.
 */
export type Behaviour =
  /**
   * Answer with this exit status and these stdout/stderr bytes (a valid answer of the request's
   * version), once `hold` (if given) has resolved.
   */
  | { readonly kind: 'answer'; readonly exitStatus: number; readonly stdout: Uint8Array; readonly stderr: Uint8Array; readonly hold?: Promise<void> }
  /** Close the connection without answering. */
  | { readonly kind: 'close' }
  /** Write exactly these bytes, then close (a malformed or short answer). */
  | { readonly kind: 'raw'; readonly bytes: Uint8Array }
  /** Never answer; keep the connection open until the client closes it or the daemon stops. */
  | { readonly kind: 'silent' }
  /** Never acknowledge the header (nor answer): a daemon that is stopped or hung. */
  | { readonly kind: 'no-ack' }
  /** Close once the header has come, without an acknowledgement: a daemon that speaks only v1. */
  | { readonly kind: 'close-on-header' }
  /** Write these bytes instead of the acknowledgement, then stay silent. */
  | { readonly kind: 'bad-ack'; readonly bytes: Uint8Array };

/** One request as the fake daemon decoded it. */
export interface ReceivedRequest {
  readonly magic: string;
  readonly version: number;
  readonly pid: number;
  /** The env block's entries (`NAME=value`), in order, decoded as UTF-8. */
  readonly env: readonly string[];
  /** The stdin bytes, exactly. */
  readonly stdin: Buffer;
}

/** One connection: its request once complete, and whether the client closed its side. */
export interface Connection {
  /** Bytes received so far. */
  readonly received: number;
  /** The decoded request, once all of it has arrived; null before (or if it never does). */
  readonly request: ReceivedRequest | null;
  /** Resolves when the client has ended or closed the connection. */
  readonly clientGone: Promise<void>;
  /** Resolves once the header has come (and, unless the behaviour says otherwise, was acknowledged). */
  readonly header: Promise<void>;
}

/** A running fake daemon. */
export interface FakeDaemon {
  readonly path: string;
  /** Every connection accepted, in order. */
  readonly connections: readonly Connection[];
  /** Resolves with the n-th connection (0-based) once it has been accepted. */
  connection(n: number): Promise<Connection>;
  /** Stop listening (removes the socket file), destroy every open connection. Idempotent. */
  close(): Promise<void>;
}

/** An answer (default version 2, what the shim expects): header, stdout, stderr. */
export function encodeAnswer(exitStatus: number, stdout: Uint8Array, stderr: Uint8Array, magic: Uint8Array = MAGIC, version = 2): Buffer {
  const h = Buffer.alloc(HEADER_BYTES);
  Buffer.from(magic).copy(h, 0, 0, 4);
  h.writeUInt32LE(version, 4);
  h.writeUInt32LE(exitStatus, 8);
  h.writeUInt32LE(stdout.length, 12);
  h.writeUInt32LE(stderr.length, 16);
  return Buffer.concat([h, stdout, stderr]);
}

/** Decode a full request from `buf`, or null when it is not complete yet (or is not v1-shaped). */
export function decodeRequest(buf: Buffer): ReceivedRequest | null {
  if (buf.length < HEADER_BYTES) return null;
  const envBytes = buf.readUInt32LE(12);
  const stdinBytes = buf.readUInt32LE(16);
  if (buf.length < HEADER_BYTES + envBytes + stdinBytes) return null;
  const block = buf.subarray(HEADER_BYTES, HEADER_BYTES + envBytes);
  const env: string[] = [];
  for (let start = 0; start < block.length; ) {
    let end = block.indexOf(0, start);
    if (end < 0) end = block.length;
    env.push(block.toString('utf8', start, end));
    start = end + 1;
  }
  return {
    magic: buf.toString('latin1', 0, 4),
    version: buf.readUInt32LE(4),
    pid: buf.readUInt32LE(8),
    env,
    stdin: Buffer.from(buf.subarray(HEADER_BYTES + envBytes, HEADER_BYTES + envBytes + stdinBytes)),
  };
}

/** Start a fake daemon listening on `path` (which must not exist), treating every connection per `behaviour`. */
export async function startFakeDaemon(path: string, behaviour: Behaviour): Promise<FakeDaemon> {
  const connections: Connection[] = [];
  const sockets = new Set<Socket>();
  const waiters: Array<() => void> = [];
  const server: Server = createServer((sock) => {
    sockets.add(sock);
    const chunks: Buffer[] = [];
    let goneResolve: () => void = () => undefined;
    let headerResolve: () => void = () => undefined;
    const conn = {
      received: 0,
      request: null as ReceivedRequest | null,
      clientGone: new Promise<void>((res) => (goneResolve = res)),
      header: new Promise<void>((res) => (headerResolve = res)),
    };
    let headed = false;
    connections.push(conn);
    waiters.splice(0).forEach((w) => w());
    let acted = false;
    const act = (): void => {
      if (acted) return;
      acted = true;
      const version = conn.request?.version ?? 2;
      switch (behaviour.kind) {
        case 'answer': {
          const answer = encodeAnswer(behaviour.exitStatus, behaviour.stdout, behaviour.stderr, MAGIC, version);
          if (behaviour.hold === undefined) sock.end(answer);
          else void behaviour.hold.then(() => sock.end(answer));
          break;
        }
        case 'close':
          sock.destroy();
          break;
        case 'raw':
          sock.end(behaviour.bytes);
          break;
        case 'silent':
        case 'no-ack':
        case 'bad-ack':
        case 'close-on-header':
          break;
      }
    };
    sock.on('data', (c: Buffer) => {
      chunks.push(c);
      conn.received += c.length;
      if (!headed && conn.received >= HEADER_BYTES) {
        headed = true;
        const version = Buffer.concat(chunks).readUInt32LE(4);
        if (behaviour.kind === 'close-on-header') sock.destroy();
        else if (behaviour.kind === 'bad-ack') sock.write(behaviour.bytes);
        else if (behaviour.kind !== 'no-ack' && version === 2) sock.write(ACK);
        headerResolve();
      }
      if (conn.request === null) {
        conn.request = decodeRequest(Buffer.concat(chunks));
        if (conn.request !== null) act();
      }
    });
    sock.on('end', () => goneResolve());
    sock.on('close', () => {
      sockets.delete(sock);
      goneResolve();
    });
    sock.on('error', () => undefined);
  });
  await new Promise<void>((res, rej) => {
    server.once('error', rej);
    server.listen(path, () => res());
  });
  let closed: Promise<void> | null = null;
  return {
    path,
    connections,
    connection: (n) =>
      new Promise<Connection>((res) => {
        const check = (): void => {
          const c = connections[n];
          if (c !== undefined) res(c);
          else waiters.push(check);
        };
        check();
      }),
    close: () => {
      closed ??= new Promise<void>((res) => {
        for (const s of sockets) s.destroy();
        server.close(() => res());
      });
      return closed;
    },
  };
}
