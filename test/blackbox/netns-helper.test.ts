/**
 * The static pinned-namespace helper `dist/ipwarden-netns` (native/netns.c) against the real kernel,
 * differentially against the perl helper that `readPinnedNamespaces` uses when running from source
 * (no `ipwarden-netns` beside src/node/): for the same files both must report the same entries —
 * text, fib_trie inode, errno and message. Needs root, iproute2 and a built dist/; without them:
 * fails when CI=true, else skips with the reason.
 *
 * Builds, named `nh-<pid>-…`: a pinned namespace (no process inside) with a bridge holding
 * 10.87.42.5/24 and fd00:6e68::5/64 (nodad, never up: the kernel keeps the IPv6 address), a
 * symlink to its pin, a regular file, a FIFO and a missing name. Removed in `after`.
 */
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { chmodSync, chownSync, copyFileSync, existsSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { requireOrSkip, ROOT } from '../helpers/cni.ts';
import { deleteNetnsAtExit, removeAtExit } from '../helpers/exit-cleanup.ts';
import { locateNetnsHelper, netnsHelperPath, parseNetnsDump, readPinnedNamespaces } from '../../src/node/kernel-evidence.ts';

const HELPER = join(ROOT, 'dist/ipwarden-netns');
const isRoot = process.getuid?.() === 0;
const haveIp = spawnSync('ip', ['-V'], { stdio: 'ignore' }).status === 0;
const skip = requireOrSkip(isRoot && haveIp && existsSync(HELPER), `root (setns into a network namespace), iproute2 (ip) and ${HELPER} (npm run build)`);

const NS = `nh-${process.pid}`;
const PIN = `/run/netns/${NS}`;
let dir = '';

function ip(...args: string[]): void {
  execFileSync('ip', args, { stdio: ['ignore', 'ignore', 'pipe'] });
}

before(() => {
  if (skip) return;
  ip('netns', 'add', NS);
  deleteNetnsAtExit(NS);
  ip('-n', NS, 'link', 'add', 'nhbr0', 'type', 'bridge');
  ip('-n', NS, 'addr', 'add', '10.87.42.5/24', 'dev', 'nhbr0');
  ip('-n', NS, 'addr', 'add', 'fd00:6e68::5/64', 'dev', 'nhbr0', 'nodad');
  dir = mkdtempSync(join(tmpdir(), 'nh-'));
  removeAtExit(dir);
  symlinkSync(PIN, join(dir, 'link'));
  writeFileSync(join(dir, 'plain'), 'not a namespace\n');
  execFileSync('mkfifo', [join(dir, 'fifo')]);
});

after(() => {
  if (skip) return;
  if (dir !== '') rmSync(dir, { recursive: true, force: true });
  for (let i = 0; i < 50 && existsSync(PIN); i++) {
    if (spawnSync('ip', ['netns', 'del', NS], { stdio: 'ignore' }).status === 0) break;
    Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 100);
  }
});

describe('ipwarden-netns (static helper) vs the perl helper', { skip }, () => {
  it('reports exactly what the perl helper reports, file by file', () => {
    const files = [PIN, join(dir, 'missing'), join(dir, 'link'), join(dir, 'plain'), join(dir, 'fifo'), PIN];
    assert.equal(netnsHelperPath(), null, 'from source there is no helper beside src/node: readPinnedNamespaces runs perl');
    const perl = readPinnedNamespaces(files);
    assert.equal(perl.failure, null);
    const own = parseNetnsDump(execFileSync(HELPER, files, { encoding: 'utf8' }), files);
    assert.deepEqual(own, perl.entries);
    // And the entries are what the kernel holds, not merely equal.
    const [ns, missing, link, plain, fifo] = own;
    assert.match(ns?.text ?? '', /\|-- 10\.87\.42\.5\n\s+\/32 host LOCAL/);
    assert.match(ns?.text ?? '', /^fd006e68000000000000000000000005 [0-9a-f]+ 40 00 [0-9a-f]+ +nhbr0$/m);
    assert.ok((ns?.fibIno ?? 0) > 0);
    assert.deepEqual([missing?.errno, missing?.error], [2, `open ${join(dir, 'missing')}: No such file or directory`]);
    assert.deepEqual([link?.errno, link?.error], [40, `open ${join(dir, 'link')}: Too many levels of symbolic links`]);
    assert.deepEqual([plain?.errno, plain?.error], [22, `setns ${join(dir, 'plain')}: Invalid argument`]);
    assert.deepEqual([fifo?.errno, fifo?.error], [22, `setns ${join(dir, 'fifo')}: Invalid argument`]);
  });

  it('bad usage: no file is exit status 2 with a usage line', () => {
    const r = spawnSync(HELPER, [], { encoding: 'utf8' });
    assert.deepEqual([r.status, r.stdout, r.stderr], [2, '', 'usage: ipwarden-netns FILE...\n']);
  });
});

describe('which helper beside the program root trusts', { skip }, () => {
  it('only a regular file owned by root (or the euid), in a directory of the same owners, neither writable by group or others', () => {
    const d = join(dir, 'prog');
    mkdirSync(d, { mode: 0o755 });
    chmodSync(d, 0o755);
    const h = join(d, 'ipwarden-netns');
    copyFileSync(HELPER, h);
    chmodSync(h, 0o755);
    assert.deepEqual(locateNetnsHelper({ dir: d }), { path: h, why: null });
    chmodSync(h, 0o775);
    assert.deepEqual(locateNetnsHelper({ dir: d }), { path: null, why: `${h} is writable by group or others (mode 775): not run` });
    chmodSync(h, 0o755);
    chownSync(h, 65534, 65534);
    assert.deepEqual(locateNetnsHelper({ dir: d }), { path: null, why: `${h} is owned by uid 65534: not run` });
    chownSync(h, 0, 0);
    chmodSync(d, 0o1777);
    assert.deepEqual(locateNetnsHelper({ dir: d }), { path: null, why: `${d} is writable by group or others (mode 1777): not run` });
    chmodSync(d, 0o755);
    rmSync(h);
    symlinkSync(HELPER, h);
    assert.deepEqual(locateNetnsHelper({ dir: d }), { path: null, why: `${h} is not a regular file` });
    rmSync(h);
    assert.deepEqual(locateNetnsHelper({ dir: d }), { path: null, why: `no ipwarden-netns beside the program in ${d} (ENOENT)` });
  });
});
