/**
 * The pool node name's sources (src/node/node-name.ts `resolveNodeName`): `ipam.nodeName` → `NODE_NAME`
 * → the node-name file beside the installed plugin (src/node/node-name.ts) → the host name;
 * the file's trust rules and content checks, each refusal code 7 naming the file; and
 * `install-cni`'s writer of it (src/cli/install-cni.ts `writeNodeName`), and the DaemonSet giving
 * the init container (install-cni) NODE_NAME from the downward API. Needs root for the
 * ownership cases (fails loudly with CI=true, else skips them).
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { chmodSync, chownSync, lstatSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { hostname, tmpdir } from 'node:os';
import { join } from 'node:path';
import { isAppError, UsageError } from '../../src/common/errors.ts';
import type { PoolConfig } from '../../src/ipam/pool-config.ts';
import { NODE_NAME_FILE_MAX_BYTES, readNodeNameFile, resolveNodeName } from '../../src/node/node-name.ts';
import { writeNodeName } from '../../src/cli/install-cni.ts';
import { parseAllDocuments } from 'yaml';

const root = process.geteuid?.() === 0;
if (!root && process.env['CI'] === 'true') throw new Error('test/unit/pool-node-name.test.ts needs root in CI (file ownership cases)');

const pool = (nodeName: string | null): PoolConfig => ({ name: 'p', etcd: { endpoints: ['http://127.0.0.1:1'], tls: null, prefix: '/ipwarden' }, blockSize4: 26, blockSize6: 122, nodeName });
const RULE = "must be a node name of at most 253 letters, digits, '_', '.' or '-' starting with a letter or digit";

describe('resolveNodeName: ipam.nodeName → NODE_NAME → the node-name file → the host name', () => {
  it('takes the first source that has a name', () => {
    const file = () => 'from-file';
    assert.equal(resolveNodeName(pool('cfg'), { NODE_NAME: 'env' }, () => 'host', file), 'cfg');
    assert.equal(resolveNodeName(pool(null), { NODE_NAME: 'env' }, () => 'host', file), 'env');
    assert.equal(resolveNodeName(pool(null), { NODE_NAME: '' }, () => 'host', file), 'from-file');
    assert.equal(resolveNodeName(pool(null), {}, () => 'host', file), 'from-file');
    assert.equal(resolveNodeName(pool(null), {}, () => 'host', () => null), 'host');
  });
  it('a bad file fails (code 7 naming it), never falls through to the host name', () => {
    const t = mkdtempSync(join(tmpdir(), 'ipwarden-poolobs-nn-'));
    try {
      mkdirSync(join(t, 'ipwarden.d'), { mode: 0o755 });
      writeFileSync(join(t, 'ipwarden.d', 'node-name'), 'bad name\n', { mode: 0o644 });
      assert.throws(
        () => resolveNodeName(pool(null), {}, () => 'host', () => readNodeNameFile({ dir: t })),
        (e: unknown) => isAppError(e, 'IPAM_INVALID_CONFIG') && e.cniCode === 7 && e.message === `the node name file ${join(t, 'ipwarden.d', 'node-name')} ${RULE}, got "bad name"`,
      );
    } finally {
      rmSync(t, { recursive: true, force: true });
    }
  });
});

describe('readNodeNameFile', () => {
  let t = '';
  let n = 0;
  /** A fresh CNI bin dir with `ipwarden.d` (mode 0755) and, unless null, `node-name` holding `content` (mode 0644). */
  const bin = (content: string | null = 'worker-1\n'): { dir: string; d: string; f: string } => {
    const dir = join(t, `bin${++n}`);
    mkdirSync(join(dir, 'ipwarden.d'), { recursive: true, mode: 0o755 });
    chmodSync(join(dir, 'ipwarden.d'), 0o755);
    const f = join(dir, 'ipwarden.d', 'node-name');
    if (content !== null) {
      writeFileSync(f, content);
      chmodSync(f, 0o644);
    }
    return { dir, d: join(dir, 'ipwarden.d'), f };
  };
  const refused = (dir: string, message: string) =>
    assert.throws(() => readNodeNameFile({ dir }), (e: unknown) => isAppError(e, 'IPAM_INVALID_CONFIG') && e.cniCode === 7 && e.message === message);
  before(() => {
    t = mkdtempSync(join(tmpdir(), 'ipwarden-poolobs-nnf-'));
  });
  after(() => rmSync(t, { recursive: true, force: true }));

  it('reads one node name, with or without a trailing newline', () => {
    assert.equal(readNodeNameFile({ dir: bin('worker-1\n').dir }), 'worker-1');
    assert.equal(readNodeNameFile({ dir: bin('ip-10-0-0-7.ec2.internal').dir }), 'ip-10-0-0-7.ec2.internal');
  });
  it('a "host <name>" line: the file is used on that host only; a copy on another host (a cloned image) is ignored (review B2)', () => {
    const { dir, f } = bin('worker-1\nhost vm-a\n');
    assert.equal(readNodeNameFile({ dir, host: () => 'vm-a' }), 'worker-1');
    assert.equal(readNodeNameFile({ dir, host: () => 'vm-b' }), null, 'written on vm-a: not this node');
    const bad = bin('worker-1\nhost\n');
    refused(bad.dir, `the node name file ${bad.f}: line 2 must be "host <host name>", got "host"`);
    // A kernel host name may hold spaces: the rest of the line is the host name.
    const spaced = bin('worker-1\nhost my host\n');
    assert.equal(readNodeNameFile({ dir: spaced.dir, host: () => 'my host' }), 'worker-1');
    assert.equal(readNodeNameFile({ dir: spaced.dir, host: () => 'my' }), null);
    const three = bin('worker-1\nhost vm-a\nx\n');
    refused(three.dir, `the node name file ${three.f}: has 3 lines, at most 2 (the node name, "host <host name>")`);
    assert.ok(f.endsWith('node-name'));
  });
  it('no directory or no file: null (the host name follows)', () => {
    const empty = join(t, 'empty');
    mkdirSync(empty);
    assert.equal(readNodeNameFile({ dir: empty }), null);
    assert.equal(readNodeNameFile({ dir: bin(null).dir }), null);
    assert.equal(readNodeNameFile({ dir: join(t, 'no-such-dir') }), null);
  });
  it('content that is not one node name is refused', () => {
    for (const [content, shown] of [['', '""'], ['\n', '""'], ['a b', '"a b"'], ['-x', '"-x"'], ['a'.repeat(254), `"${'a'.repeat(254)}"`]] as const) {
      const b = bin(content);
      refused(b.dir, `the node name file ${b.f} ${RULE}, got ${shown}`);
    }
    const blank = bin('worker-1\n\n');
    refused(blank.dir, `the node name file ${blank.f}: line 2 must be "host <host name>", got ""`);
    const big = bin('a'.repeat(NODE_NAME_FILE_MAX_BYTES + 1));
    refused(big.dir, `the node name file ${big.f}: is ${NODE_NAME_FILE_MAX_BYTES + 1} bytes long, at most ${NODE_NAME_FILE_MAX_BYTES}`);
  });
  it('a symlink is never followed: neither for the directory nor for the file', () => {
    const real = bin();
    const viaDir = join(t, `bin${++n}`);
    mkdirSync(viaDir);
    symlinkSync(real.d, join(viaDir, 'ipwarden.d'));
    refused(viaDir, `the node name file ${join(viaDir, 'ipwarden.d')}: is not a directory (a symlink is not followed)`);
    const viaFile = bin(null);
    symlinkSync(real.f, viaFile.f);
    refused(viaFile.dir, `the node name file ${viaFile.f}: is a symlink (not followed)`);
  });
  it('a file or directory writable by group or others is refused', () => {
    const f = bin();
    chmodSync(f.f, 0o664);
    refused(f.dir, `the node name file ${f.f}: ${f.f} is writable by group or others (mode 664)`);
    const d = bin();
    chmodSync(d.d, 0o777);
    refused(d.dir, `the node name file ${d.d}: ${d.d} is writable by group or others (mode 777)`);
  });
  it('not a regular file (a FIFO) is refused without blocking', () => {
    const b = bin(null);
    assert.equal(spawnSync('mkfifo', ['-m', '0644', b.f]).status, 0);
    refused(b.dir, `the node name file ${b.f}: is not a regular file`);
  });
  it('a file or directory owned by another user is refused', { skip: root ? false : 'needs root' }, () => {
    const f = bin();
    chownSync(f.f, 65534, 65534);
    refused(f.dir, `the node name file ${f.f}: ${f.f} is owned by uid 65534`);
    const d = bin();
    chownSync(d.d, 65534, 65534);
    refused(d.dir, `the node name file ${d.d}: ${d.d} is owned by uid 65534`);
  });
});

describe("install-cni's writeNodeName", () => {
  let t = '';
  before(() => {
    t = mkdtempSync(join(tmpdir(), 'ipwarden-poolobs-nnw-'));
  });
  after(() => rmSync(t, { recursive: true, force: true }));

  it('writes DIR/ipwarden.d/node-name (0644, in a 0755 directory) atomically, and the reader reads it back', () => {
    const dir = join(t, 'a');
    mkdirSync(dir);
    const old = process.umask(0o077);
    try {
      assert.equal(writeNodeName(dir, 'worker-1'), join(dir, 'ipwarden.d', 'node-name'));
    } finally {
      process.umask(old);
    }
    assert.equal(lstatSync(join(dir, 'ipwarden.d')).mode & 0o7777, 0o755);
    assert.equal(lstatSync(join(dir, 'ipwarden.d', 'node-name')).mode & 0o7777, 0o644);
    assert.equal(readFileSync(join(dir, 'ipwarden.d', 'node-name'), 'utf8'), `worker-1\nhost ${hostname()}\n`);
    writeNodeName(dir, 'worker-2');
    assert.deepEqual(readdirSync(join(dir, 'ipwarden.d')), ['node-name'], 'no temporary file left');
    assert.equal(readNodeNameFile({ dir }), 'worker-2');
  });
  it('refuses an ipwarden.d that is a symlink or writable by others', () => {
    const dir = join(t, 'b');
    mkdirSync(join(t, 'elsewhere'), { mode: 0o755 });
    mkdirSync(dir);
    symlinkSync(join(t, 'elsewhere'), join(dir, 'ipwarden.d'));
    assert.throws(() => writeNodeName(dir, 'worker-1'), (e: unknown) => e instanceof UsageError && e.message === `install-cni: ${join(dir, 'ipwarden.d')} is not a directory (a symlink is not followed): refusing to write the node name there`);
    assert.deepEqual(readdirSync(join(t, 'elsewhere')), []);
    const open = join(t, 'c');
    mkdirSync(join(open, 'ipwarden.d'), { recursive: true });
    chmodSync(join(open, 'ipwarden.d'), 0o777);
    assert.throws(() => writeNodeName(open, 'worker-1'), (e: unknown) => e instanceof UsageError && e.message === `install-cni: ${join(open, 'ipwarden.d')} is writable by group or others (mode 777): refusing to write the node name there`);
  });
});

describe('deploy/kubernetes/daemonset.yaml', () => {
  it('passes NODE_NAME (spec.nodeName) to the install-cni init container, which writes the node-name file from it', () => {
    const docs = parseAllDocuments(readFileSync(join(import.meta.dirname, '../../deploy/kubernetes/daemonset.yaml'), 'utf8')).map((d) => d.toJS() as Record<string, unknown>);
    const ds = docs.find((d) => d['kind'] === 'DaemonSet') as { spec: { template: { spec: { initContainers: Array<{ name: string; args: string[]; env?: Array<{ name: string; valueFrom?: { fieldRef?: { fieldPath?: string } } }> }> } } } };
    const init = ds.spec.template.spec.initContainers.find((c) => c.name === 'install-cni');
    assert.ok(init !== undefined && init.args[0] === 'install-cni');
    assert.deepEqual(init.env?.find((e) => e.name === 'NODE_NAME'), { name: 'NODE_NAME', valueFrom: { fieldRef: { fieldPath: 'spec.nodeName' } } });
  });
});
