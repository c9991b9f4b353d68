/**
 * The shim–daemon protocol (docs/daemon.md), versions 1 and 2: request and answer codecs, the
 * acknowledgement, the incremental decoder's outcomes and the version it reports once the header is
 * checked, and every malformed case with its exact reason.
 */
import { strict as assert } from 'node:assert';
import { describe, it } from 'node:test';
import { exactEnv } from '../../src/cni/plugin.ts';
import {
  ACK_BYTES,
  AnswerDecoder,
  decodeAnswer,
  encodeAck,
  decodeRequest,
  encodeAnswer,
  encodeEnvBlock,
  encodeRequest,
  HEADER_BYTES,
  MAX_ENV_BYTES,
  PROTOCOL_VERSION,
  SUPPORTED_PROTOCOL_VERSIONS,
  MAX_STDIN_BYTES,
  RequestDecoder,
  type DecodeState,
  type PluginRequest,
} from '../../src/daemon/protocol.ts';

/** A raw header: magic, then four u32 LE. */
function head(magic: string, a: number, b: number, c: number, d: number): Buffer {
  const h = Buffer.alloc(HEADER_BYTES);
  h.write(magic, 0, 'latin1');
  h.writeUInt32LE(a, 4);
  h.writeUInt32LE(b, 8);
  h.writeUInt32LE(c, 12);
  h.writeUInt32LE(d, 16);
  return h;
}

function complete(st: DecodeState<PluginRequest>): PluginRequest {
  assert.equal(st.kind, 'complete', JSON.stringify(st));
  return (st as { value: PluginRequest }).value;
}

const ENV = { CNI_COMMAND: 'ADD', CNI_CONTAINERID: 'c1', CNI_IFNAME: 'eth0', PATH: '/usr/bin:/bin' };

describe('request encode/decode', () => {
  it('round trip: pid, env (in order), raw block, stdin bytes; the header is exactly as documented', () => {
    const bytes = encodeRequest({ pid: 4242, env: ENV, stdin: '{"a":1}' });
    const block = 'CNI_COMMAND=ADD\0CNI_CONTAINERID=c1\0CNI_IFNAME=eth0\0PATH=/usr/bin:/bin\0';
    assert.deepEqual(bytes.subarray(0, HEADER_BYTES), head('IPWD', 1, 4242, block.length, 7));
    assert.equal(bytes.subarray(HEADER_BYTES, HEADER_BYTES + block.length).toString('latin1'), block);
    const r = complete(decodeRequest(bytes));
    assert.equal(r.version, 1);
    assert.equal(r.pid, 4242);
    assert.deepEqual({ ...r.env }, ENV);
    assert.deepEqual(Object.keys(r.env), Object.keys(ENV));
    assert.equal(Buffer.from(r.envBlock).toString('latin1'), block);
    assert.deepEqual(r.ignored, []);
    assert.equal(Buffer.from(r.stdin).toString('utf8'), '{"a":1}');
  });

  it('byte by byte: "more" until the last byte, then complete', () => {
    const bytes = encodeRequest({ pid: 7, env: ENV, stdin: 'xyz' });
    const d = new RequestDecoder();
    for (let i = 0; i < bytes.length - 1; i++) assert.deepEqual(d.push(bytes.subarray(i, i + 1)), { kind: 'more' }, `byte ${i}`);
    const r = complete(d.push(bytes.subarray(bytes.length - 1)));
    assert.equal(Buffer.from(r.stdin).toString(), 'xyz');
    assert.equal(d.received, bytes.length);
  });

  it('version 2: the same layout with 2 in the header; the decoder reports the version once the header is checked, not before', () => {
    const bytes = encodeRequest({ version: 2, pid: 4242, env: ENV, stdin: '{"a":1}' });
    assert.deepEqual(bytes.subarray(0, HEADER_BYTES), head('IPWD', 2, 4242, 70, 7));
    const d = new RequestDecoder();
    assert.deepEqual(d.push(bytes.subarray(0, HEADER_BYTES - 1)), { kind: 'more' });
    assert.equal(d.version, null);
    assert.deepEqual(d.push(bytes.subarray(HEADER_BYTES - 1, HEADER_BYTES)), { kind: 'more' });
    assert.equal(d.version, 2);
    const r = complete(d.push(bytes.subarray(HEADER_BYTES)));
    assert.deepEqual([r.version, r.pid, { ...r.env }], [2, 4242, ENV]);
    assert.deepEqual([PROTOCOL_VERSION, SUPPORTED_PROTOCOL_VERSIONS], [2, [1, 2]]);
    // A header that fails a check reports no version: the server does not acknowledge it.
    const bad = new RequestDecoder();
    assert.deepEqual(bad.push(head('IPWD', 2, 0, 0, 0)), { kind: 'malformed', reason: 'pid is 0' });
    assert.equal(bad.version, null);
  });

  it('the acknowledgement is exactly "IPWA" and 2 (u32 LE), 8 bytes', () => {
    assert.deepEqual(encodeAck(), Buffer.from([0x49, 0x50, 0x57, 0x41, 2, 0, 0, 0]));
    assert.equal(ACK_BYTES, 8);
  });

  it('empty env block and empty stdin', () => {
    const r = complete(decodeRequest(encodeRequest({ pid: 1, env: {}, stdin: '' })));
    assert.deepEqual({ ...r.env }, {});
    assert.equal(r.stdin.length, 0);
  });

  it('variables the shim does not forward are ignored and named', () => {
    const r = complete(decodeRequest(encodeRequest({ pid: 9, env: { CNI_COMMAND: 'DEL', NODE_OPTIONS: '--x', HOME: '/root', CONTAINER_RUNTIME_ENDPOINT: 'unix:///x' }, stdin: '' })));
    assert.deepEqual({ ...r.env }, { CNI_COMMAND: 'DEL', CONTAINER_RUNTIME_ENDPOINT: 'unix:///x' });
    assert.deepEqual(r.ignored, ['NODE_OPTIONS', 'HOME']);
  });

  it('a value may hold "=" and any byte but NUL; non-UTF-8 reads as U+FFFD, the block keeps the bytes, exactEnv recovers CNI_IFNAME', () => {
    const ifname = Buffer.from([0x65, 0xff, 0x30]);
    const r = complete(decodeRequest(encodeRequest({ pid: 3, env: { CNI_ARGS: 'IP=10.1.0.5;K=V', CNI_IFNAME: ifname }, stdin: '' })));
    assert.equal(r.env['CNI_ARGS'], 'IP=10.1.0.5;K=V');
    assert.equal(r.env['CNI_IFNAME'], 'e\ufffd0');
    assert.equal(exactEnv(r.env, () => r.envBlock)['CNI_IFNAME'], 'e\udcff0');
  });

  it('limits: exactly MAX_ENV_BYTES and MAX_STDIN_BYTES are accepted', () => {
    const value = 'x'.repeat(MAX_ENV_BYTES - 'CNI_ARGS='.length - 1);
    const stdin = Buffer.alloc(MAX_STDIN_BYTES, 0x20);
    const bytes = encodeRequest({ pid: 5, env: { CNI_ARGS: value }, stdin });
    const r = complete(decodeRequest(bytes));
    assert.equal(r.envBlock.length, MAX_ENV_BYTES);
    assert.equal(r.stdin.length, MAX_STDIN_BYTES);
  });
});

describe('malformed requests: the exact reason, decided as early as possible', () => {
  const block = Buffer.from('CNI_COMMAND=ADD\0', 'latin1');
  const good = (env: Buffer, stdin = Buffer.alloc(0), pid = 10): Buffer => Buffer.concat([head('IPWD', 1, pid, env.length, stdin.length), env, stdin]);
  const cases: Array<{ name: string; bytes: Buffer; want: DecodeState<PluginRequest> }> = [
    { name: 'bad magic', bytes: good(block).fill('X', 0, 1), want: { kind: 'malformed', reason: 'bad magic "XPWD" (want "IPWD")' } },
    { name: 'bad magic, seen on its first 2 bytes', bytes: Buffer.from('IX'), want: { kind: 'malformed', reason: 'bad magic "IX" (want "IPWD")' } },
    { name: 'an HTTP request', bytes: Buffer.from('GET / HTTP/1.1\r\n\r\n'), want: { kind: 'malformed', reason: 'bad magic "GET " (want "IPWD")' } },
    { name: 'version 3, told on the first 8 bytes', bytes: head('IPWD', 3, 0, 0, 0).subarray(0, 8), want: { kind: 'unsupported-version', version: 3 } },
    { name: 'version 0', bytes: head('IPWD', 0, 1, 0, 0), want: { kind: 'unsupported-version', version: 0 } },
    { name: 'pid 0', bytes: good(block, Buffer.alloc(0), 0), want: { kind: 'malformed', reason: 'pid is 0' } },
    { name: 'env too large, told on the header alone', bytes: head('IPWD', 1, 10, MAX_ENV_BYTES + 1, 0), want: { kind: 'malformed', reason: 'env block of 65537 bytes exceeds the limit of 65536' } },
    { name: 'stdin too large, told on the header alone', bytes: head('IPWD', 1, 10, 0, MAX_STDIN_BYTES + 1), want: { kind: 'malformed', reason: 'stdin of 16777217 bytes exceeds the limit of 16777216' } },
    { name: 'u32 max lengths', bytes: head('IPWD', 1, 10, 0xffffffff, 0xffffffff), want: { kind: 'malformed', reason: 'env block of 4294967295 bytes exceeds the limit of 65536' } },
    { name: 'env block not ended by NUL', bytes: good(Buffer.from('CNI_COMMAND=ADD', 'latin1')), want: { kind: 'malformed', reason: 'env block does not end with a NUL byte' } },
    { name: 'empty entry', bytes: good(Buffer.from('CNI_COMMAND=ADD\0\0', 'latin1')), want: { kind: 'malformed', reason: 'env entry 1 is empty' } },
    { name: 'entry without "="', bytes: good(Buffer.from('CNI_COMMAND=ADD\0CNI_PATH\0', 'latin1')), want: { kind: 'malformed', reason: 'env entry 1 has no "="' } },
    { name: 'empty name', bytes: good(Buffer.from('=x\0', 'latin1')), want: { kind: 'malformed', reason: 'env entry 0 has an empty name' } },
    { name: 'a name twice', bytes: good(Buffer.from('CNI_COMMAND=ADD\0CNI_COMMAND=DEL\0', 'latin1')), want: { kind: 'malformed', reason: 'env entry 1: variable "CNI_COMMAND" appears twice' } },
    { name: 'bytes after the request (same chunk)', bytes: Buffer.concat([good(block), Buffer.from('zz')]), want: { kind: 'malformed', reason: '2 bytes after the end of the request' } },
    { name: 'truncated header', bytes: Buffer.from('IPWD\x01\0'), want: { kind: 'malformed', reason: 'truncated request: 6 of at least 20 bytes' } },
    { name: 'truncated body', bytes: good(block).subarray(0, HEADER_BYTES + 3), want: { kind: 'malformed', reason: 'truncated request: 23 of 36 bytes' } },
    { name: 'nothing at all', bytes: Buffer.alloc(0), want: { kind: 'malformed', reason: 'truncated request: 0 of at least 20 bytes' } },
  ];
  cases.forEach((c) => it(c.name, () => assert.deepEqual(decodeRequest(c.bytes), c.want)));

  it('bytes after a complete request in a later chunk turn it malformed; the state then stays', () => {
    const d = new RequestDecoder();
    complete(d.push(good(block)));
    assert.deepEqual(d.push(Buffer.from('x')), { kind: 'malformed', reason: '1 bytes after the end of the request' });
    assert.deepEqual(d.push(Buffer.from('IPWD')), { kind: 'malformed', reason: '1 bytes after the end of the request' });
    assert.deepEqual(d.end(), { kind: 'malformed', reason: '1 bytes after the end of the request' });
  });

  it('a too-large header allocates nothing: the decoder rejects before the body arrives', () => {
    const d = new RequestDecoder();
    assert.deepEqual(d.push(head('IPWD', 1, 10, 0, MAX_STDIN_BYTES + 1)), { kind: 'malformed', reason: 'stdin of 16777217 bytes exceeds the limit of 16777216' });
    assert.equal(d.received, HEADER_BYTES);
  });
});

describe('env block encoding', () => {
  const bad: Array<[string, Record<string, string>]> = [
    ['empty name', { '': 'x' }],
    ['"=" in a name', { 'A=B': 'x' }],
    ['NUL in a value', { CNI_ARGS: 'a\0b' }],
  ];
  bad.forEach(([name, env]) => it(`refuses ${name}`, () => assert.throws(() => encodeEnvBlock(env), RangeError)));
  it('refuses an oversized request unless unchecked', () => {
    assert.throws(() => encodeRequest({ pid: 1, env: {}, stdin: Buffer.alloc(MAX_STDIN_BYTES + 1) }), /stdin of 16777217 bytes exceeds 16777216/);
    assert.equal(encodeRequest({ pid: 1, env: {}, stdin: Buffer.alloc(MAX_STDIN_BYTES + 1), unchecked: true }).length, HEADER_BYTES + MAX_STDIN_BYTES + 1);
  });
});

describe('answers', () => {
  it('round trip, exactly as documented: magic, 1, exitStatus, stdoutBytes, stderrBytes, stdout, stderr (UTF-8)', () => {
    const a = encodeAnswer({ exitStatus: 1, stdout: '{"code":7,"msg":"é"}', stderr: 'warn\n' });
    assert.deepEqual(a.subarray(0, HEADER_BYTES), head('IPWD', 1, 1, Buffer.byteLength('{"code":7,"msg":"é"}'), 5));
    const st = decodeAnswer(a);
    assert.equal(st.kind, 'complete');
    if (st.kind !== 'complete') return;
    assert.equal(st.value.exitStatus, 1);
    assert.equal(Buffer.from(st.value.stdout).toString('utf8'), '{"code":7,"msg":"é"}');
    assert.equal(Buffer.from(st.value.stderr).toString('utf8'), 'warn\n');
  });
  it('incremental, and malformed cases', () => {
    const a = encodeAnswer({ exitStatus: 0, stdout: 'x', stderr: '' });
    const d = new AnswerDecoder();
    assert.deepEqual(d.push(a.subarray(0, 10)), { kind: 'more' });
    assert.equal(d.push(a.subarray(10)).kind, 'complete');
    assert.deepEqual(decodeAnswer(a.subarray(0, 5)), { kind: 'malformed', reason: 'truncated answer: 5 of at least 20 bytes' });
    assert.deepEqual(decodeAnswer(Buffer.from('NOPE')), { kind: 'malformed', reason: 'bad magic "NOPE" (want "IPWD")' });
    assert.deepEqual(decodeAnswer(head('IPWD', 3, 0, 0, 0)), { kind: 'unsupported-version', version: 3 });
    assert.deepEqual(decodeAnswer(head('IPWD', 1, 0, 0xffffffff, 0)), { kind: 'malformed', reason: 'stdout of 4294967295 bytes exceeds the limit of 16777216' });
  });
  it('version 2: the header says 2; a decoder of version 2 refuses an answer of version 1 and the reverse', () => {
    const a = encodeAnswer({ exitStatus: 0, stdout: 'x', stderr: 'y', version: 2 });
    assert.deepEqual(a.subarray(0, HEADER_BYTES), head('IPWD', 2, 0, 1, 1));
    assert.equal(decodeAnswer(a, 2).kind, 'complete');
    assert.deepEqual(decodeAnswer(a), { kind: 'unsupported-version', version: 2 });
    assert.deepEqual(decodeAnswer(encodeAnswer({ exitStatus: 0, stdout: '', stderr: '' }), 2), { kind: 'unsupported-version', version: 1 });
  });
  it('refuses an exit status that is not a u32', () => {
    assert.throws(() => encodeAnswer({ exitStatus: -1, stdout: '', stderr: '' }), RangeError);
  });
});
