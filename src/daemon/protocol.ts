/**
 * Wire protocol between the exec shim (`native/shim.c`) and the daemon's plugin server
 * (docs/daemon.md "Protocol"). Pure: values in, values out, no I/O. All integers u32 little-endian.
 *
 * Version 2 (what the shim sends since issue 17), one request per connection:
 *
 *     shim → daemon    "IPWD"  version=2  pid  envBytes  stdinBytes                 (header)
 *     daemon → shim    "IPWA"  version=2                                            (acknowledgement)
 *     shim → daemon    env block (envBytes) | stdin (stdinBytes)                    (body)
 *     daemon → shim    "IPWD"  version=2  exitStatus  stdoutBytes  stderrBytes | stdout | stderr
 *
 * The daemon writes the acknowledgement as soon as it has read and checked the header; the shim
 * sends the body only after it has read the acknowledgement, and falls back to the standalone
 * plugin when none comes within its short deadline (3 s). So a daemon that was stopped never holds
 * the body of a request whose shim gave up: it cannot run it after the standalone did.
 *
 * Version 1 (older shims; still served): the header and the body at once, no acknowledgement, and
 * the answer's header says version 1.
 *
 * The env block is `NAME=value` entries, each ended by one NUL byte. Only `CNI_*`,
 * `CONTAINER_RUNTIME_ENDPOINT` and `PATH` are meaningful; other names are ignored (and reported
 * in {@link PluginRequest.ignored} so the server can log them).
 *
 * {@link RequestDecoder} reads a request incrementally and checks each limit as soon as the
 * header field carrying it has arrived, before any buffer for the body is allocated.
 */

/** The 4 magic bytes that start every request and answer. */
export const MAGIC = Buffer.from('IPWD', 'latin1');
/** The newest protocol version: what the shim sends (the request header, acknowledged, then the body). */
export const PROTOCOL_VERSION = 2;
/** The versions the daemon serves, oldest first: 1 (no acknowledgement) and 2. */
export const SUPPORTED_PROTOCOL_VERSIONS: readonly number[] = [1, 2];
/** The 4 magic bytes of the acknowledgement (version 2). */
export const ACK_MAGIC = Buffer.from('IPWA', 'latin1');
/** Size of the acknowledgement, bytes: its magic and the version (u32). */
export const ACK_BYTES = 8;
/** Size of the request header and of the answer header, bytes (magic + 4 u32). */
export const HEADER_BYTES = 20;
/** Largest env block accepted, bytes (docs/daemon.md). */
export const MAX_ENV_BYTES = 65_536;
/** Largest stdin accepted, bytes: 16 MiB (docs/daemon.md). */
export const MAX_STDIN_BYTES = 16 * 1024 * 1024;
/**
 * Largest stdout or stderr an answer may carry, bytes: 16 MiB each. Not a limit of docs/daemon.md's
 * request side; it bounds what {@link AnswerDecoder} allocates (a real answer is a few KiB).
 */
export const MAX_ANSWER_STREAM_BYTES = 16 * 1024 * 1024;

/** True for the variable names a request may carry (docs/daemon.md "What the shim passes on"). */
export function isForwardedEnvName(name: string): boolean {
  return name.startsWith('CNI_') || name === 'CONTAINER_RUNTIME_ENDPOINT' || name === 'PATH';
}

/** One decoded request. */
export interface PluginRequest {
  /** The request's protocol version, one of {@link SUPPORTED_PROTOCOL_VERSIONS}; its answer carries the same. */
  readonly version: number;
  /** The shim's pid (> 0): whose ancestry names the runtime that ran the plugin. */
  readonly pid: number;
  /**
   * The forwarded variables, values decoded as UTF-8 the way Node decodes `process.env` (each
   * invalid byte becomes U+FFFD). Exact bytes are in {@link envBlock}.
   */
  readonly env: Readonly<Record<string, string>>;
  /** The raw env block as sent (same layout as `/proc/<pid>/environ`). */
  readonly envBlock: Uint8Array;
  /** Names present in the block but not forwarded (ignored), in order. */
  readonly ignored: readonly string[];
  /** The plugin's stdin bytes. */
  readonly stdin: Uint8Array;
}

/** What the decoder knows after the bytes pushed so far. */
export type DecodeState<T> =
  | { readonly kind: 'more' }
  | { readonly kind: 'complete'; readonly value: T }
  /** The peer speaks another version: close without an answer (docs/daemon.md). */
  | { readonly kind: 'unsupported-version'; readonly version: number }
  | { readonly kind: 'malformed'; readonly reason: string };

/** Parse an env block. Returns the env or a reason it is malformed. Pure. */
export function parseEnvBlock(block: Uint8Array): { env: Record<string, string>; ignored: string[] } | { malformed: string } {
  const env: Record<string, string> = Object.create(null) as Record<string, string>;
  const ignored: string[] = [];
  const seen = new Set<string>();
  if (block.length > 0 && block[block.length - 1] !== 0) return { malformed: 'env block does not end with a NUL byte' };
  const buf = Buffer.from(block.buffer, block.byteOffset, block.byteLength);
  let index = 0;
  for (let start = 0; start < buf.length; index++) {
    const end = buf.indexOf(0, start);
    // end >= 0: the block ends with NUL (checked above).
    if (end === start) return { malformed: `env entry ${index} is empty` };
    const eq = buf.indexOf(0x3d, start); // '='
    if (eq < 0 || eq >= end) return { malformed: `env entry ${index} has no "="` };
    if (eq === start) return { malformed: `env entry ${index} has an empty name` };
    const name = buf.toString('latin1', start, eq);
    if (seen.has(name)) return { malformed: `env entry ${index}: variable ${JSON.stringify(name)} appears twice` };
    seen.add(name);
    if (isForwardedEnvName(name)) env[name] = buf.toString('utf8', eq + 1, end);
    else ignored.push(name);
    start = end + 1;
  }
  return { env, ignored };
}

/**
 * Encode an env block from `env` (entries in insertion order). Throws `RangeError` when a name is
 * empty or holds `=` or NUL, or a value holds NUL (such a variable cannot exist in an environment).
 * Values are encoded as UTF-8, or taken as they are when given as bytes.
 */
export function encodeEnvBlock(env: Readonly<Record<string, string | Uint8Array>>): Buffer {
  const parts: Buffer[] = [];
  for (const [name, value] of Object.entries(env)) {
    if (name === '' || name.includes('=') || name.includes('\0')) throw new RangeError(`invalid env name ${JSON.stringify(name)}`);
    const v = typeof value === 'string' ? Buffer.from(value, 'utf8') : Buffer.from(value);
    if (v.includes(0)) throw new RangeError(`env value of ${name} holds a NUL byte`);
    parts.push(Buffer.from(`${name}=`, 'latin1'), v, Buffer.from([0]));
  }
  return Buffer.concat(parts);
}

/** Header of a request or an answer: four u32 after the magic. */
function header(a: number, b: number, c: number, d: number): Buffer {
  const h = Buffer.allocUnsafe(HEADER_BYTES);
  MAGIC.copy(h, 0);
  h.writeUInt32LE(a, 4);
  h.writeUInt32LE(b, 8);
  h.writeUInt32LE(c, 12);
  h.writeUInt32LE(d, 16);
  return h;
}

/**
 * Encode a request: header, env block, stdin, as one buffer (`version` default 1, the old shim's
 * request sent at once; a version-2 client sends the first {@link HEADER_BYTES}, waits for the
 * acknowledgement, then sends the rest). `env` is an object (see {@link encodeEnvBlock}) or a raw block sent as it is
 * (tests use that to send malformed blocks). Throws `RangeError` when `pid` is not a u32 or a
 * part exceeds its limit ({@link MAX_ENV_BYTES}, {@link MAX_STDIN_BYTES}) unless `unchecked`.
 */
export function encodeRequest(r: {
  pid: number;
  env: Readonly<Record<string, string | Uint8Array>> | Uint8Array;
  stdin: Uint8Array | string;
  version?: number;
  unchecked?: boolean;
}): Buffer {
  const envBlock = r.env instanceof Uint8Array ? Buffer.from(r.env) : encodeEnvBlock(r.env);
  const stdin = typeof r.stdin === 'string' ? Buffer.from(r.stdin, 'utf8') : Buffer.from(r.stdin);
  if (!Number.isInteger(r.pid) || r.pid < 0 || r.pid > 0xffffffff) throw new RangeError(`pid ${r.pid} is not a u32`);
  if (r.unchecked !== true) {
    if (envBlock.length > MAX_ENV_BYTES) throw new RangeError(`env block of ${envBlock.length} bytes exceeds ${MAX_ENV_BYTES}`);
    if (stdin.length > MAX_STDIN_BYTES) throw new RangeError(`stdin of ${stdin.length} bytes exceeds ${MAX_STDIN_BYTES}`);
  }
  return Buffer.concat([header(r.version ?? 1, r.pid, envBlock.length, stdin.length), envBlock, stdin]);
}

/** One answer: what the standalone plugin would have printed and its exit status. */
export interface PluginAnswer {
  /** Exit status (u32; the plugin uses 0 and 1). */
  readonly exitStatus: number;
  readonly stdout: Uint8Array;
  readonly stderr: Uint8Array;
}

/**
 * Encode an answer with `version` in its header (default 1; the request's version). Strings are
 * encoded as UTF-8 (what the standalone's `write(2)` of the same text puts out). Throws
 * `RangeError` when `exitStatus` is not a u32 or a stream exceeds {@link MAX_ANSWER_STREAM_BYTES}.
 */
export function encodeAnswer(a: { exitStatus: number; stdout: Uint8Array | string; stderr: Uint8Array | string; version?: number }): Buffer {
  const out = typeof a.stdout === 'string' ? Buffer.from(a.stdout, 'utf8') : Buffer.from(a.stdout);
  const err = typeof a.stderr === 'string' ? Buffer.from(a.stderr, 'utf8') : Buffer.from(a.stderr);
  if (!Number.isInteger(a.exitStatus) || a.exitStatus < 0 || a.exitStatus > 0xffffffff) throw new RangeError(`exit status ${a.exitStatus} is not a u32`);
  for (const [what, b] of [['stdout', out], ['stderr', err]] as const) {
    if (b.length > MAX_ANSWER_STREAM_BYTES) throw new RangeError(`${what} of ${b.length} bytes exceeds ${MAX_ANSWER_STREAM_BYTES}`);
  }
  return Buffer.concat([header(a.version ?? 1, a.exitStatus, out.length, err.length), out, err]);
}

/**
 * The acknowledgement of a version-2 request header: `"IPWA"` and the version 2 (u32 LE), 8
 * bytes. The daemon writes it once the header is read and checked; the shim sends the body only
 * after reading exactly these bytes (anything else: it runs the standalone plugin).
 */
export function encodeAck(): Buffer {
  const b = Buffer.allocUnsafe(ACK_BYTES);
  ACK_MAGIC.copy(b, 0);
  b.writeUInt32LE(2, 4);
  return b;
}

/**
 * Shared incremental reader of "magic, version, three u32, then two length-prefixed parts".
 * `limits` checks the two lengths (from the header) before the body buffer is allocated.
 */
abstract class FrameDecoder<T> {
  readonly #head = Buffer.alloc(HEADER_BYTES);
  #headLen = 0;
  #body: Buffer | null = null;
  #bodyLen = 0;
  #state: DecodeState<T> = { kind: 'more' };
  #version: number | null = null;

  /** The versions this decoder accepts. */
  protected abstract readonly versions: readonly number[];

  /**
   * The frame's version once its whole header has arrived and passed every check (the state is
   * then `more` or `complete`, or `malformed` by a later byte); null before.
   */
  get version(): number | null {
    return this.#version;
  }

  /** The state after the last push. */
  get state(): DecodeState<T> {
    return this.#state;
  }

  /**
   * Feed the next bytes. Once the state is `complete`, `malformed` or `unsupported-version` it no
   * longer changes, except that bytes pushed after a complete frame make it `malformed`
   * (`<n> bytes after the end of the ...`): one frame per connection.
   */
  push(chunk: Uint8Array): DecodeState<T> {
    if (chunk.length === 0) return this.#state;
    const s = this.#state;
    if (s.kind === 'complete') return (this.#state = { kind: 'malformed', reason: `${chunk.length} bytes after the end of the ${this.what}` });
    if (s.kind !== 'more') return s;
    let off = 0;
    if (this.#headLen < HEADER_BYTES) {
      const n = Math.min(HEADER_BYTES - this.#headLen, chunk.length);
      this.#head.set(chunk.subarray(0, n), this.#headLen);
      const before = this.#headLen;
      this.#headLen += n;
      off = n;
      // Magic, checked on what has arrived of it.
      const m = Math.min(this.#headLen, 4);
      if (before < 4 && !this.#head.subarray(0, m).equals(MAGIC.subarray(0, m))) {
        return (this.#state = { kind: 'malformed', reason: `bad magic ${JSON.stringify(this.#head.toString('latin1', 0, m))} (want "IPWD")` });
      }
      if (before < 8 && this.#headLen >= 8) {
        const version = this.#head.readUInt32LE(4);
        if (!this.versions.includes(version)) return (this.#state = { kind: 'unsupported-version', version });
      }
      if (this.#headLen < HEADER_BYTES) return this.#state;
      const bad = this.check(this.#head.readUInt32LE(8), this.#head.readUInt32LE(12), this.#head.readUInt32LE(16));
      if (bad !== null) return (this.#state = { kind: 'malformed', reason: bad });
      this.#version = this.#head.readUInt32LE(4);
      this.#body = Buffer.allocUnsafe(this.#head.readUInt32LE(12) + this.#head.readUInt32LE(16));
    }
    const body = this.#body as Buffer;
    const rest = chunk.length - off;
    const need = body.length - this.#bodyLen;
    if (rest > need) return (this.#state = { kind: 'malformed', reason: `${rest - need} bytes after the end of the ${this.what}` });
    body.set(chunk.subarray(off), this.#bodyLen);
    this.#bodyLen += rest;
    if (this.#bodyLen < body.length) return this.#state;
    return (this.#state = this.finish(this.#head.readUInt32LE(4), this.#head.readUInt32LE(8), body.subarray(0, this.#head.readUInt32LE(12)), body.subarray(this.#head.readUInt32LE(12))));
  }

  /**
   * The state at the end of the stream: `complete`/`malformed`/`unsupported-version` unchanged;
   * `more` becomes `malformed` (`truncated ...: <got> of <want> bytes`).
   */
  end(): DecodeState<T> {
    if (this.#state.kind !== 'more') return this.#state;
    const got = this.#headLen + this.#bodyLen;
    const want = this.#body === null ? `at least ${HEADER_BYTES}` : String(HEADER_BYTES + this.#body.length);
    return (this.#state = { kind: 'malformed', reason: `truncated ${this.what}: ${got} of ${want} bytes` });
  }

  /** Bytes received so far. */
  get received(): number {
    return this.#headLen + this.#bodyLen;
  }

  protected abstract readonly what: string;
  /** Reason the header's three fields are unacceptable, or null. */
  protected abstract check(field: number, len1: number, len2: number): string | null;
  protected abstract finish(version: number, field: number, part1: Buffer, part2: Buffer): DecodeState<T>;
}

/**
 * Incremental decoder of one request. Malformed (with the reason): bad magic; pid 0;
 * `envBytes` > {@link MAX_ENV_BYTES}; `stdinBytes` > {@link MAX_STDIN_BYTES}; an env block that
 * does not end with NUL, has an empty entry, an entry without `=`, an empty name or a name twice;
 * bytes after the request; (at {@link end}) a truncated request. A version other than 1 is
 * `unsupported-version` unless it is one of {@link SUPPORTED_PROTOCOL_VERSIONS}. Limits are checked
 * before the body buffer is allocated. Once {@link version} is 2 the server acknowledges.
 */
export class RequestDecoder extends FrameDecoder<PluginRequest> {
  protected readonly what = 'request';
  protected readonly versions = SUPPORTED_PROTOCOL_VERSIONS;
  /** The pid the header claims, once the header has been read (0 before). */
  headerPid = 0;

  protected check(pid: number, envBytes: number, stdinBytes: number): string | null {
    this.headerPid = pid;
    if (pid === 0) return 'pid is 0';
    if (envBytes > MAX_ENV_BYTES) return `env block of ${envBytes} bytes exceeds the limit of ${MAX_ENV_BYTES}`;
    if (stdinBytes > MAX_STDIN_BYTES) return `stdin of ${stdinBytes} bytes exceeds the limit of ${MAX_STDIN_BYTES}`;
    return null;
  }

  protected finish(version: number, pid: number, envBlock: Buffer, stdin: Buffer): DecodeState<PluginRequest> {
    const parsed = parseEnvBlock(envBlock);
    if ('malformed' in parsed) return { kind: 'malformed', reason: parsed.malformed };
    return { kind: 'complete', value: { version, pid, env: parsed.env, envBlock, ignored: parsed.ignored, stdin } };
  }
}

/**
 * Incremental decoder of one answer (the client's side; the test client and the daemon's unit
 * tests use it), of the request's `version` (default 1; another is `unsupported-version`).
 * Malformed: bad magic; a stream longer than {@link MAX_ANSWER_STREAM_BYTES}; bytes after the
 * answer; (at {@link end}) a truncated answer.
 */
export class AnswerDecoder extends FrameDecoder<PluginAnswer> {
  protected readonly what = 'answer';
  protected readonly versions: readonly number[];

  constructor(version = 1) {
    super();
    this.versions = [version];
  }

  protected check(_exitStatus: number, stdoutBytes: number, stderrBytes: number): string | null {
    if (stdoutBytes > MAX_ANSWER_STREAM_BYTES) return `stdout of ${stdoutBytes} bytes exceeds the limit of ${MAX_ANSWER_STREAM_BYTES}`;
    if (stderrBytes > MAX_ANSWER_STREAM_BYTES) return `stderr of ${stderrBytes} bytes exceeds the limit of ${MAX_ANSWER_STREAM_BYTES}`;
    return null;
  }

  protected finish(_version: number, exitStatus: number, stdout: Buffer, stderr: Buffer): DecodeState<PluginAnswer> {
    return { kind: 'complete', value: { exitStatus, stdout, stderr } };
  }
}

/** Decode one whole request from `bytes` (all of the connection's data). Pure. */
export function decodeRequest(bytes: Uint8Array): DecodeState<PluginRequest> {
  const d = new RequestDecoder();
  d.push(bytes);
  return d.end();
}

/** Decode one whole answer of `version` (default 1) from `bytes`. Pure. */
export function decodeAnswer(bytes: Uint8Array, version = 1): DecodeState<PluginAnswer> {
  const d = new AnswerDecoder(version);
  d.push(bytes);
  return d.end();
}
