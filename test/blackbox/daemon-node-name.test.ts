/**
 * The daemon refuses a node-name file that disagrees with its NODE_NAME loudly, without stopping
 * service (docs/cluster.md "The node name"; src/daemon/node-name-check.ts): install-cni wrote the
 * file for another node name, the daemon (with `--cni-bin-dir`) logs `node name mismatch` with the
 * exact reason at start and sets `ipwarden_node_name_mismatch` to 1; its install watch rewrites the
 * file from NODE_NAME and this host's name, after which `/readyz` answers 200 and the gauge is 0.
 * Needs root and `npm run build`.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { hostname } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { requireOrSkip, ROOT } from '../helpers/cni.ts';
import { startTestDaemon, type TestDaemon } from '../helpers/daemon.ts';

const BUNDLE = join(ROOT, 'dist/ipwarden.cjs');
const skip = requireOrSkip(process.getuid?.() === 0 && existsSync(BUNDLE), 'root and a build (npm run build)');

let T = '';
let d: TestDaemon | null = null;
after(async () => {
  await d?.stop();
  if (T !== '') rmSync(T, { recursive: true, force: true });
});

describe('the node-name file and the daemon\'s NODE_NAME', { skip, timeout: 300_000 }, () => {
  it('a file naming another node: logged and counted at start, then rewritten by the install watch; /readyz 200 once it agrees', async () => {
    T = mkdtempSync('/tmp/ipw-nn-');
    const bin = join(T, 'opt', 'cni', 'bin');
    mkdirSync(join(T, 'opt', 'cni'), { recursive: true });
    mkdirSync(join(T, 'run'), { mode: 0o700 });
    const cri = `unix://${T}/cri.sock`;
    const r = spawnSync(process.execPath, [BUNDLE, 'install-cni', '--dest', bin, '--socket', join(T, 'run', 'plugin.sock')], { env: { PATH: '/usr/bin:/bin', NODE_NAME: 'nn-file', CONTAINER_RUNTIME_ENDPOINT: cri }, encoding: 'utf8', timeout: 120_000 });
    assert.equal(r.status, 0, r.stdout + r.stderr);
    const file = join(bin, 'ipwarden.d', 'node-name');
    assert.equal(readFileSync(file, 'utf8'), `nn-file\nhost ${hostname()}\n`);
    d = await startTestDaemon({ socket: join(T, 'run', 'plugin.sock'), env: { NODE_NAME: 'nn-daemon', CONTAINER_RUNTIME_ENDPOINT: cri }, args: ['--cni-bin-dir', bin] });
    const mismatch = await d.waitForLog((l) => l.msg === 'node name mismatch');
    assert.deepEqual([mismatch['level'], mismatch['error']], [50, `the node name file ${file} names node nn-file, but the daemon's NODE_NAME is nn-daemon: while the daemon is down, the standalone fallback would serve this node's pods as node nn-file`]);
    // The install watch's plan is install-cni's with the daemon's NODE_NAME: the file is "changed" and rewritten.
    const re = await d.waitForLog((l) => l.msg === 'installed files reinstalled');
    assert.deepEqual([re['reason'], re['files']], ['changed', ['ipwarden.d/node-name']]);
    assert.equal(readFileSync(file, 'utf8'), `nn-daemon\nhost ${hostname()}\n`);
    const port = Number(String((await d.waitForLog((l) => l.msg === 'metrics listening'))['metricsAddress']).split(':').pop());
    const ready = await fetch(`http://127.0.0.1:${port}/readyz`);
    assert.deepEqual([ready.status, await ready.text()], [200, 'ok\n']);
    await d.waitForLog((l) => l.msg === 'node name file agrees with NODE_NAME');
    const m = (await (await fetch(`http://127.0.0.1:${port}/metrics`)).text()).split('\n').filter((l) => l.startsWith('ipwarden_node_name_mismatch'));
    assert.deepEqual(m, ['ipwarden_node_name_mismatch 0']);
    assert.equal(d.logs.filter((l) => l.msg === 'node name mismatch').length, 1, 'logged once');
  });
});
