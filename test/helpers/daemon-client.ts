/**
 * Node clients of the daemon's protocol (docs/daemon.md): {@link sendRaw}/{@link runViaDaemon}
 * speak version 1 (the whole request at once, as shims before issue 17 do: the daemon still serves
 * them), {@link exchangeV2} version 2 step by step (header, acknowledgement, body, answer), as the
 * C shim does. One request per connection; an answer, or a report that the daemon closed without
 * one (what makes the shim fall back).
 */
import { createConnection, type Socket } from 'node:net';
import { ACK_BYTES, AnswerDecoder, encodeRequest, HEADER_BYTES, type PluginAnswer } from '../../src/daemon/protocol.ts';
import { envFor, type Invocation, type Outcome } from './cni.ts';

/** What came back for one request. */
export type ClientResult =
  | { readonly kind: 'answer'; readonly answer: PluginAnswer }
  /** The daemon closed the connection without a (complete) answer; `received` bytes came. */
  | { readonly kind: 'closed'; readonly received: number; readonly reason: string };

/** Options of {@link sendRaw}. */
export interface SendOptions {
  /** Called once the bytes were handed to the socket (the request is on its way). */
  onSent?(sock: Socket): void;
}

/**
 * Connect to `socketPath`, write `bytes`, and wait until the daemon answers or closes. The client
 * never half-closes (as the shim). Rejects when the connection cannot be made.
 */
export function sendRaw(socketPath: string, bytes: Uint8Array, opts: SendOptions = {}): Promise<ClientResult> {
  return new Promise((resolve, reject) => {
    const sock = createConnection(socketPath);
    const dec = new AnswerDecoder();
    let connected = false;
    let settled = false;
    const finish = (r: ClientResult): void => {
      if (settled) return;
      settled = true;
      sock.destroy();
      resolve(r);
    };
    sock.on('connect', () => {
      connected = true;
      sock.write(bytes, () => opts.onSent?.(sock));
    });
    sock.on('data', (c: Buffer) => {
      const st = dec.push(c);
      if (st.kind === 'complete') finish({ kind: 'answer', answer: st.value });
      else if (st.kind !== 'more') finish({ kind: 'closed', received: dec.received, reason: st.kind === 'malformed' ? st.reason : `answer version ${st.version}` });
    });
    const closed = (why: string): void => {
      const st = dec.end();
      if (st.kind === 'complete') finish({ kind: 'answer', answer: st.value });
      else finish({ kind: 'closed', received: dec.received, reason: why });
    };
    sock.on('end', () => closed('end of stream'));
    sock.on('error', (e) => {
      if (!connected && !settled) {
        settled = true;
        reject(e);
        return;
      }
      closed(`error: ${e.message}`);
    });
    sock.on('close', () => closed('closed'));
  });
}

/** The CNI environment of `inv`, the way test/helpers/cni.ts builds it for an exec. */
export function cniEnv(inv: Invocation): Record<string, string> {
  // Only what the shim forwards (docs/daemon.md "What the shim passes on").
  return Object.fromEntries(Object.entries(envFor(inv)).filter(([k]) => k.startsWith('CNI_') || k === 'CONTAINER_RUNTIME_ENDPOINT' || k === 'PATH'));
}

/**
 * Run one plugin invocation through the daemon, like runCni in test/helpers/cni.ts. `pid` is the
 * pid the request claims as the shim's (default: this process). Rejects when there is no answer.
 */
export async function runViaDaemon(socketPath: string, inv: Invocation, pid: number = process.pid, opts: SendOptions = {}): Promise<Outcome> {
  const stdin = typeof inv.stdin === 'string' ? inv.stdin : JSON.stringify(inv.stdin);
  const r = await sendRaw(socketPath, encodeRequest({ pid, env: cniEnv(inv), stdin }), opts);
  if (r.kind !== 'answer') throw new Error(`the daemon closed without an answer (${r.reason}, ${r.received} bytes)`);
  const stdout = Buffer.from(r.answer.stdout).toString('utf8');
  let json: Record<string, unknown> | null = null;
  if (stdout.trim() !== '') {
    try {
      json = JSON.parse(stdout) as Record<string, unknown>;
    } catch {
      json = null;
    }
  }
  return { exitCode: r.answer.exitStatus, stdout, stderr: Buffer.from(r.answer.stderr).toString('utf8'), json };
}

/** What a version-2 exchange gave. */
export interface V2Exchange {
  /** The bytes that came in answer to the header, up to {@link ACK_BYTES} (fewer: the daemon closed first). */
  readonly ack: Buffer;
  /** After the body: the answer or the close; null when the client closed after the acknowledgement. */
  readonly result: ClientResult | null;
}

/**
 * Version 2, as the shim speaks it: connect, send the first {@link HEADER_BYTES} of `request` (an
 * encodeRequest of version 2), wait for {@link ACK_BYTES} bytes (or the daemon's close); then
 * either close (`abandon`: the shim that gave up) or send the rest and read a version-2 answer.
 * Rejects when the connection cannot be made.
 */
export function exchangeV2(socketPath: string, request: Uint8Array, opts: { abandon?: boolean } = {}): Promise<V2Exchange> {
  return new Promise((resolve, reject) => {
    const sock = createConnection(socketPath);
    const dec = new AnswerDecoder(2);
    let ack = Buffer.alloc(0);
    let connected = false;
    let settled = false;
    const finish = (r: V2Exchange): void => {
      if (settled) return;
      settled = true;
      sock.destroy();
      resolve(r);
    };
    sock.on('connect', () => {
      connected = true;
      sock.write(request.subarray(0, HEADER_BYTES));
    });
    sock.on('data', (c: Buffer) => {
      let rest = c;
      if (ack.length < ACK_BYTES) {
        const take = Math.min(ACK_BYTES - ack.length, rest.length);
        ack = Buffer.concat([ack, rest.subarray(0, take)]);
        rest = rest.subarray(take);
        if (ack.length < ACK_BYTES) return;
        if (opts.abandon === true) return finish({ ack, result: null });
        sock.write(request.subarray(HEADER_BYTES));
      }
      const st = dec.push(rest);
      if (st.kind === 'complete') finish({ ack, result: { kind: 'answer', answer: st.value } });
      else if (st.kind !== 'more') finish({ ack, result: { kind: 'closed', received: dec.received, reason: st.kind === 'malformed' ? st.reason : `answer version ${st.version}` } });
    });
    const closed = (why: string): void => {
      const st = dec.end();
      if (st.kind === 'complete') finish({ ack, result: { kind: 'answer', answer: st.value } });
      else finish({ ack, result: { kind: 'closed', received: dec.received, reason: why } });
    };
    sock.on('end', () => closed('end of stream'));
    sock.on('error', (e) => {
      if (!connected && !settled) {
        settled = true;
        reject(e);
        return;
      }
      closed(`error: ${e.message}`);
    });
    sock.on('close', () => closed('closed'));
  });
}
