/**
 * The node's runtime endpoint record (issue 19 item 5, Multus thick): `install-cni` writes
 * `DIR/ipwarden.d/runtime-endpoint` (src/cli/install-cni.ts `writeRuntimeEndpoint`), the plugin reads
 * it under the node-name file's trust rules (src/node/node-name.ts `readRuntimeEndpointFile`),
 * and a record that cannot be used is ignored with its reason (never a failed request); the
 * daemon's own node endpoint (src/daemon/agent.ts `daemonNodeEndpoint`) is its `--runtime-endpoint`,
 * else its `CONTAINER_RUNTIME_ENDPOINT`, never a default socket. Needs root for the ownership cases
 * (fails loudly with CI=true, else skips them).
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { chmodSync, chownSync, lstatSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { hostname, tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { readRuntimeEndpointFile } from '../../src/node/node-name.ts';
import { validateRecordedEndpoint, writeRuntimeEndpoint } from '../../src/cli/install-cni.ts';
import { UsageError } from '../../src/common/errors.ts';
import { daemonNodeEndpoint } from '../../src/daemon/agent.ts';

const root = process.geteuid?.() === 0;
if (!root && process.env['CI'] === 'true') throw new Error('test/unit/runtime-record.test.ts needs root in CI (file ownership cases)');

let t = '';
before(() => {
  t = mkdtempSync(join(tmpdir(), 'ipwarden-rtrec-'));
});
after(() => rmSync(t, { recursive: true, force: true }));

let n = 0;
/** A fresh CNI bin dir with `ipwarden.d` (0755) and, unless null, `runtime-endpoint` holding `content` (0644). */
function bin(content: string | null): { dir: string; d: string; f: string } {
  const dir = join(t, `bin${++n}`);
  mkdirSync(join(dir, 'ipwarden.d'), { recursive: true });
  chmodSync(join(dir, 'ipwarden.d'), 0o755);
  const f = join(dir, 'ipwarden.d', 'runtime-endpoint');
  if (content !== null) {
    writeFileSync(f, content);
    chmodSync(f, 0o644);
  }
  return { dir, d: join(dir, 'ipwarden.d'), f };
}
const ME = (): string => 'node-a';

describe('readRuntimeEndpointFile', () => {
  it('a record written on this host: its endpoint, as unix:///path', () => {
    const b = bin('unix:///run/containerd/containerd.sock\nhost node-a\n');
    assert.deepEqual(readRuntimeEndpointFile({ dir: b.dir, host: ME }), { url: 'unix:///run/containerd/containerd.sock', path: '/run/containerd/containerd.sock', file: b.f });
    const bare = bin('/var/run/crio/crio.sock\nhost node-a');
    assert.deepEqual(readRuntimeEndpointFile({ dir: bare.dir, host: ME }), { url: 'unix:///var/run/crio/crio.sock', path: '/var/run/crio/crio.sock', file: bare.f });
  });
  it('no directory or no file: null', () => {
    assert.equal(readRuntimeEndpointFile({ dir: join(t, 'nowhere'), host: ME }), null);
    assert.equal(readRuntimeEndpointFile({ dir: bin(null).dir, host: ME }), null);
  });
  it('used only on the host that wrote it: another host, or no host line, is ignored with why', () => {
    const other = bin('unix:///run/containerd/containerd.sock\nhost node-b\n');
    assert.deepEqual(readRuntimeEndpointFile({ dir: other.dir, host: ME }), { ignored: `the runtime endpoint record ${other.f} was written on host node-b, not on this host (node-a): not used` });
    const none = bin('unix:///run/containerd/containerd.sock\n');
    assert.deepEqual(readRuntimeEndpointFile({ dir: none.dir, host: ME }), { ignored: `the runtime endpoint record ${none.f} has no "host <host name>" line: not used` });
  });
  it('content that is not one unix endpoint and a host line is ignored with why', () => {
    const tcp = bin('tcp://10.0.0.1:1234\nhost node-a\n');
    assert.deepEqual(readRuntimeEndpointFile({ dir: tcp.dir, host: ME }), {
      ignored: `the runtime endpoint record ${tcp.f}: unsupported runtime endpoint "tcp://10.0.0.1:1234": want unix:///path/to/socket or /path/to/socket: not used`,
    });
    const three = bin('unix:///a.sock\nhost node-a\nx\n');
    assert.deepEqual(readRuntimeEndpointFile({ dir: three.dir, host: ME }), { ignored: `the runtime endpoint record ${three.f}: has 3 lines, at most 2 (the value, "host <host name>"): not used` });
    const badHost = bin('unix:///a.sock\nhost\n');
    assert.deepEqual(readRuntimeEndpointFile({ dir: badHost.dir, host: ME }), { ignored: `the runtime endpoint record ${badHost.f}: line 2 must be "host <host name>", got "host": not used` });
    // What install-cni never writes: a NUL (the address would be cut there), bytes that are not
    // UTF-8, a path longer than sun_path.
    const nul = bin('unix:///run/x.sock\0/evil\nhost node-a\n');
    assert.deepEqual(readRuntimeEndpointFile({ dir: nul.dir, host: ME }), { ignored: `the runtime endpoint record ${nul.f}: the socket path "/run/x.sock\\u0000/evil" holds a NUL byte, a carriage return or bytes that are not UTF-8: not used` });
    const latin1 = bin('');
    writeFileSync(latin1.f, Buffer.concat([Buffer.from('unix:///run/'), Buffer.from([0xff]), Buffer.from('.sock\nhost node-a\n')]));
    assert.deepEqual(readRuntimeEndpointFile({ dir: latin1.dir, host: ME }), { ignored: `the runtime endpoint record ${latin1.f}: the socket path "/run/\uFFFD.sock" holds a NUL byte, a carriage return or bytes that are not UTF-8: not used` });
    const long = bin(`unix:///${'a'.repeat(107)}\nhost node-a\n`);
    assert.deepEqual(readRuntimeEndpointFile({ dir: long.dir, host: ME }), { ignored: `the runtime endpoint record ${long.f}: the socket path is 108 bytes long, at most 107 fit in a unix socket address: not used` });
    const big = bin(`unix:///${'a'.repeat(600)}\nhost node-a\n`);
    assert.deepEqual(readRuntimeEndpointFile({ dir: big.dir, host: ME }), { ignored: `the runtime endpoint record ${big.f}: is 621 bytes long, at most 512: not used` });
  });
  it('untrusted: a symlink, a group- or other-writable file or directory, a FIFO — ignored with why, never read', () => {
    const real = bin('unix:///run/containerd/containerd.sock\nhost node-a\n');
    const viaDir = join(t, `bin${++n}`);
    mkdirSync(viaDir);
    symlinkSync(real.d, join(viaDir, 'ipwarden.d'));
    assert.deepEqual(readRuntimeEndpointFile({ dir: viaDir, host: ME }), { ignored: `the runtime endpoint record ${join(viaDir, 'ipwarden.d')}: is not a directory (a symlink is not followed): not used` });
    const viaFile = bin(null);
    symlinkSync(real.f, viaFile.f);
    assert.deepEqual(readRuntimeEndpointFile({ dir: viaFile.dir, host: ME }), { ignored: `the runtime endpoint record ${viaFile.f}: is a symlink (not followed): not used` });
    const f = bin('unix:///run/containerd/containerd.sock\nhost node-a\n');
    chmodSync(f.f, 0o666);
    assert.deepEqual(readRuntimeEndpointFile({ dir: f.dir, host: ME }), { ignored: `the runtime endpoint record ${f.f}: ${f.f} is writable by group or others (mode 666): not used` });
    const d = bin('unix:///run/containerd/containerd.sock\nhost node-a\n');
    chmodSync(d.d, 0o777);
    assert.deepEqual(readRuntimeEndpointFile({ dir: d.dir, host: ME }), { ignored: `the runtime endpoint record ${d.d}: ${d.d} is writable by group or others (mode 777): not used` });
    const fifo = bin(null);
    assert.equal(spawnSync('mkfifo', ['-m', '0644', fifo.f]).status, 0);
    assert.deepEqual(readRuntimeEndpointFile({ dir: fifo.dir, host: ME }), { ignored: `the runtime endpoint record ${fifo.f}: is not a regular file: not used` });
  });
  it('owned by another user: ignored with why', { skip: root ? false : 'needs root' }, () => {
    const f = bin('unix:///run/containerd/containerd.sock\nhost node-a\n');
    chownSync(f.f, 65534, 65534);
    assert.deepEqual(readRuntimeEndpointFile({ dir: f.dir, host: ME }), { ignored: `the runtime endpoint record ${f.f}: ${f.f} is owned by uid 65534: not used` });
  });
});

describe("install-cni's writeRuntimeEndpoint", () => {
  it('writes DIR/ipwarden.d/runtime-endpoint (0644, in a 0755 directory) atomically with the host line; the reader reads it back', () => {
    const dir = join(t, 'w1');
    mkdirSync(dir);
    const old = process.umask(0o077);
    try {
      assert.equal(writeRuntimeEndpoint(dir, 'unix:///run/containerd/containerd.sock'), join(dir, 'ipwarden.d', 'runtime-endpoint'));
    } finally {
      process.umask(old);
    }
    assert.equal(lstatSync(join(dir, 'ipwarden.d')).mode & 0o7777, 0o755);
    assert.equal(lstatSync(join(dir, 'ipwarden.d', 'runtime-endpoint')).mode & 0o7777, 0o644);
    assert.equal(readFileSync(join(dir, 'ipwarden.d', 'runtime-endpoint'), 'utf8'), `unix:///run/containerd/containerd.sock\nhost ${hostname()}\n`);
    assert.deepEqual(readdirSync(join(dir, 'ipwarden.d')), ['runtime-endpoint'], 'no temporary file left');
    assert.deepEqual(readRuntimeEndpointFile({ dir }), { url: 'unix:///run/containerd/containerd.sock', path: '/run/containerd/containerd.sock', file: join(dir, 'ipwarden.d', 'runtime-endpoint') });
  });
  it('refuses an ipwarden.d that is a symlink', () => {
    const dir = join(t, 'w2');
    mkdirSync(join(t, 'w2-elsewhere'), { mode: 0o755 });
    mkdirSync(dir);
    symlinkSync(join(t, 'w2-elsewhere'), join(dir, 'ipwarden.d'));
    assert.throws(
      () => writeRuntimeEndpoint(dir, 'unix:///a.sock'),
      (e: unknown) => e instanceof UsageError && e.message === `install-cni: ${join(dir, 'ipwarden.d')} is not a directory (a symlink is not followed): refusing to write the runtime endpoint there`,
    );
    assert.deepEqual(readdirSync(join(t, 'w2-elsewhere')), []);
  });
  it('validates the endpoint: unix:///abs or /abs, at most 107 bytes, no line break', () => {
    assert.equal(validateRecordedEndpoint('/run/containerd/containerd.sock'), 'unix:///run/containerd/containerd.sock');
    assert.equal(validateRecordedEndpoint('unix:///var/run/crio/crio.sock'), 'unix:///var/run/crio/crio.sock');
    const refused = (v: string, message: string): void => assert.throws(() => validateRecordedEndpoint(v), (e: unknown) => e instanceof UsageError && e.message === message);
    refused('tcp://1.2.3.4:5', 'install-cni: the runtime endpoint (--runtime-endpoint or CONTAINER_RUNTIME_ENDPOINT): unsupported runtime endpoint "tcp://1.2.3.4:5": want unix:///path/to/socket or /path/to/socket');
    refused('unix://relative.sock', 'install-cni: the runtime endpoint (--runtime-endpoint or CONTAINER_RUNTIME_ENDPOINT): unsupported runtime endpoint "unix://relative.sock": the socket path must be absolute');
    refused('/a\nhost x', 'install-cni: the runtime endpoint (--runtime-endpoint or CONTAINER_RUNTIME_ENDPOINT) must not contain a NUL byte or a line break, got "/a\\nhost x"');
    refused(`/${'s'.repeat(107)}`, "install-cni: the runtime endpoint's socket path is 108 bytes long, at most 107 fit in a unix socket address");
  });
});

describe("the daemon's node endpoint: its --runtime-endpoint, else its CONTAINER_RUNTIME_ENDPOINT, never a default", () => {
  it('each source, named', () => {
    assert.deepEqual(daemonNodeEndpoint({ runtimeEndpoint: 'unix:///run/containerd/containerd.sock' }, { CONTAINER_RUNTIME_ENDPOINT: '/x.sock' })(), {
      url: 'unix:///run/containerd/containerd.sock',
      path: '/run/containerd/containerd.sock',
      source: "the daemon's --runtime-endpoint",
    });
    assert.deepEqual(daemonNodeEndpoint({ runtimeEndpoint: null }, { CONTAINER_RUNTIME_ENDPOINT: '/var/run/crio/crio.sock' })(), {
      url: 'unix:///var/run/crio/crio.sock',
      path: '/var/run/crio/crio.sock',
      source: "the daemon's CONTAINER_RUNTIME_ENDPOINT",
    });
    assert.equal(daemonNodeEndpoint({ runtimeEndpoint: null }, {})(), null);
    assert.equal(daemonNodeEndpoint({ runtimeEndpoint: null }, { CONTAINER_RUNTIME_ENDPOINT: '' })(), null);
    assert.equal(daemonNodeEndpoint({ runtimeEndpoint: null }, { CONTAINER_RUNTIME_ENDPOINT: 'tcp://x:1' })(), null);
  });
});
