/**
 * `/opt/cni/bin` re-created by a package upgrade (flannel#1721, issue 19 item 5): the plugin was
 * gone, every pod start failed, the daemon said nothing and `/readyz` stayed 200. Now the daemon
 * (`--cni-bin-dir`) watches the files install-cni wrote and reinstalls them — install-cni itself,
 * atomically — when they vanish or change, with a log line, `ipwarden_plugin_reinstalls_total` and
 * `ipwarden_plugin_installed`; `/readyz` fails while they are not in place.
 *
 * Real parts: `install-cni` into `<tmp>/opt/cni/bin` (with a node name and a runtime endpoint, so
 * the records are watched too), the built daemon on its own socket. Each change is made while the
 * daemon is SIGSTOPped when it takes more than one step (a package manager's `rm -rf` then
 * `mkdir`), so the daemon sees the result, not a half-done step; what is waited for is a log line.
 *
 * 1. `rm -rf` the bin dir and `mkdir` it again → one reinstall (`missing`): every file back with
 *    the bytes (SHA-256) and mode install-cni first wrote;
 * 2. the shim replaced by another file (written beside it, renamed over it, as dpkg does) → one
 *    reinstall (`changed`), identical again;
 * 3. the netns helper chmod 0700 → one reinstall (`changed`), identical again;
 * 4. the bin dir replaced by a regular file: the reinstall fails; `/readyz` answers 503 with the
 *    exact reason and `ipwarden_plugin_installed` is 0 (no transition is possible while the file
 *    is there); the file removed and the dir re-created → one reinstall (`missing`), `/readyz` 200.
 *
 * The counters equal exactly the reinstalls: missing 2, changed 2. Needs root and a build.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { chmodSync, existsSync, lstatSync, mkdirSync, mkdtempSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { hostname } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { requireOrSkip, ROOT } from '../helpers/cni.ts';
import { startTestDaemon, type LogLine, type TestDaemon } from '../helpers/daemon.ts';

const BUNDLE = join(ROOT, 'dist/ipwarden.cjs');
const skip = requireOrSkip(process.getuid?.() === 0 && existsSync(BUNDLE), 'root and a build (npm run build)');

const FILES = ['ipwarden.d/node-name', 'ipwarden.d/runtime-endpoint', 'ipwarden-flock.node', 'ipwarden-netns', 'ipwarden-standalone', 'ipwarden'] as const;

let T = '';
let bin = '';
let d: TestDaemon | null = null;
let metricsPort = 0;
/** SHA-256 and mode of each installed file, as install-cni first wrote them. */
let installed: Record<string, { sha: string; mode: string }> = {};

function snapshot(): Record<string, { sha: string; mode: string }> {
  return Object.fromEntries(
    FILES.map((f) => {
      const p = join(bin, f);
      if (!existsSync(p)) return [f, { sha: 'missing', mode: '' }];
      return [f, { sha: createHash('sha256').update(readFileSync(p)).digest('hex'), mode: (lstatSync(p).mode & 0o7777).toString(8) }];
    }),
  );
}

/** The process state letter of `pid` (/proc/PID/stat: `T` = stopped). */
function procState(pid: number): string {
  const st = readFileSync(`/proc/${pid}/stat`, 'utf8');
  return st.slice(st.lastIndexOf(')') + 2, st.lastIndexOf(')') + 3);
}

/** Run `change` while the daemon is stopped: it sees the end state only. */
async function whileStopped(change: () => void): Promise<void> {
  const daemon = d as TestDaemon;
  daemon.kill('SIGSTOP');
  while (procState(daemon.pid) !== 'T') await new Promise((r) => setTimeout(r, 5));
  try {
    change();
  } finally {
    daemon.kill('SIGCONT');
  }
}

const REINSTALLED = 'installed files reinstalled';
const FAILED = 'reinstall of the installed files failed';
/** The `n`-th line (1-based) with message `msg`. */
function nth(msg: string, n: number): Promise<LogLine> {
  let seen = 0;
  return (d as TestDaemon).waitForLog((l) => l.msg === msg && ++seen === n);
}

async function get(path: string): Promise<{ status: number; body: string }> {
  const r = await fetch(`http://127.0.0.1:${metricsPort}${path}`);
  return { status: r.status, body: await r.text() };
}
/** The install-watch series, as `/metrics` has them. */
async function series(): Promise<string[]> {
  return (await get('/metrics')).body.split('\n').filter((l) => l.startsWith('ipwarden_plugin_'));
}
const counts = (missing: number, changed: number, ok: 0 | 1): string[] => [
  `ipwarden_plugin_reinstalls_total{reason="missing"} ${missing}`,
  `ipwarden_plugin_reinstalls_total{reason="changed"} ${changed}`,
  `ipwarden_plugin_installed ${ok}`,
];

before(async () => {
  if (skip) return;
  T = mkdtempSync('/tmp/ipw-ri-');
  bin = join(T, 'opt', 'cni', 'bin');
  mkdirSync(join(T, 'opt', 'cni'), { recursive: true });
  mkdirSync(join(T, 'run'), { mode: 0o700 });
  const env = { PATH: '/usr/bin:/bin', NODE_NAME: 'ri-node', CONTAINER_RUNTIME_ENDPOINT: `unix://${T}/cri.sock` };
  const r = spawnSync(process.execPath, [BUNDLE, 'install-cni', '--dest', bin, '--socket', join(T, 'run', 'plugin.sock')], { env, encoding: 'utf8', timeout: 120_000 });
  assert.equal(r.status, 0, r.stdout + r.stderr);
  installed = snapshot();
  assert.equal(readFileSync(join(bin, 'ipwarden.d', 'node-name'), 'utf8'), `ri-node\nhost ${hostname()}\n`);
  d = await startTestDaemon({ socket: join(T, 'run', 'plugin.sock'), env: { NODE_NAME: 'ri-node', CONTAINER_RUNTIME_ENDPOINT: env.CONTAINER_RUNTIME_ENDPOINT }, args: ['--cni-bin-dir', bin] });
  const listening = await d.waitForLog((l) => l.msg === 'metrics listening');
  metricsPort = Number(String(listening['metricsAddress']).split(':').pop());
  await d.waitForLog((l) => l.msg === 'installed files in place');
});
after(async () => {
  if (d !== null) {
    d.kill('SIGCONT');
    await d.stop();
  }
  if (T !== '') rmSync(T, { recursive: true, force: true });
});

describe('the daemon reinstalls the files install-cni wrote when they vanish or change (flannel#1721)', { skip, timeout: 300_000 }, () => {
  it('at start: every file in place, nothing reinstalled, /readyz 200', async () => {
    assert.deepEqual(Object.values(installed).map((f) => f.mode), ['644', '644', '755', '755', '755', '755']);
    assert.deepEqual(await series(), counts(0, 0, 1));
    assert.deepEqual(await get('/readyz'), { status: 200, body: 'ok\n' });
    assert.deepEqual((d as TestDaemon).logs.filter((l) => l.msg === REINSTALLED), []);
  });

  it('the bin dir removed and re-created (a package upgrade): one reinstall, every file byte-identical with its mode', async () => {
    await whileStopped(() => {
      rmSync(bin, { recursive: true, force: true });
      mkdirSync(bin, { mode: 0o755 });
    });
    const line = await nth(REINSTALLED, 1);
    assert.equal(line['reason'], 'missing');
    assert.deepEqual(line['files'], [...FILES]);
    assert.deepEqual(snapshot(), installed);
    assert.deepEqual(await series(), counts(1, 0, 1));
    assert.deepEqual(await get('/readyz'), { status: 200, body: 'ok\n' });
  });

  it('the shim replaced by another file (renamed over it): one reinstall, identical again', async () => {
    writeFileSync(join(bin, 'ipwarden.dpkg-new'), '#!/bin/sh\nexit 0\n', { mode: 0o755 });
    renameSync(join(bin, 'ipwarden.dpkg-new'), join(bin, 'ipwarden'));
    const line = await nth(REINSTALLED, 2);
    assert.deepEqual([line['reason'], line['files']], ['changed', ['ipwarden']]);
    assert.deepEqual(snapshot(), installed);
    assert.deepEqual(await series(), counts(1, 1, 1));
  });

  it('a file whose mode changed: one reinstall, identical again', async () => {
    chmodSync(join(bin, 'ipwarden-netns'), 0o700);
    const line = await nth(REINSTALLED, 3);
    assert.deepEqual([line['reason'], line['files']], ['changed', ['ipwarden-netns']]);
    assert.deepEqual(snapshot(), installed);
    assert.deepEqual(await series(), counts(1, 2, 1));
  });

  it('the bin dir replaced by a file: the reinstall fails and /readyz answers 503 saying why; the dir back: reinstalled, 200', async () => {
    await whileStopped(() => {
      rmSync(bin, { recursive: true, force: true });
      writeFileSync(bin, 'not a directory\n');
    });
    const failed = await nth(FAILED, 1);
    assert.equal(failed['error'], `install-cni: ${bin} is not a directory (--dest)`);
    const list = FILES.map((f) => `${f} (missing)`).join(', ');
    assert.deepEqual(await get('/readyz'), { status: 503, body: `installed files not in place in ${bin}: ${list}; the reinstall failed: install-cni: ${bin} is not a directory (--dest)\n` });
    assert.deepEqual(await series(), counts(1, 2, 0));
    assert.equal((d as TestDaemon).logs.filter((l) => l.msg === REINSTALLED).length, 3);

    await whileStopped(() => {
      rmSync(bin, { force: true });
      mkdirSync(bin, { mode: 0o755 });
    });
    const line = await nth(REINSTALLED, 4);
    assert.equal(line['reason'], 'missing');
    assert.deepEqual(snapshot(), installed);
    assert.deepEqual(await get('/readyz'), { status: 200, body: 'ok\n' });
    assert.deepEqual(await series(), counts(2, 2, 1));
  });
});
