/**
 * The daemon's warm-up (`--warm-up PAIRS`, src/daemon/warm-up.ts, docs/daemon.md "Warm-up"): right
 * after it starts, the daemon sends itself ADD+DEL pairs on a scratch network in a directory beside
 * its socket. Checked on a real daemon (the built bundle) through its real socket:
 * - it completes (`warm-up done`, every pair), counts nothing in `ipwarden_cni_requests_total`,
 *   logs no `request served` line at info, and leaves no scratch directory;
 * - it does not use the kernel address index: with 198.18.0.2 (the scratch range's first address)
 *   configured in a network namespace before the daemon starts, no warm-up ADD skips it (no
 *   conflict line, no `ipwarden_allocation_kernel_*` sample for the scratch network), where a
 *   runtime's ADD would;
 * - a runtime's requests sent while it runs are served (ADD gets an address of its own network,
 *   DEL frees it) and are the only ones counted and logged;
 * - a scratch directory a killed daemon left (with a symlink to a file outside) is removed at the
 *   next start without following the symlink;
 * - a daemon stopped during its warm-up stops it (`warm-up stopped`), removes the scratch
 *   directory and exits 0;
 * - with `--warm-up 0` nothing is sent, and a scratch directory a killed daemon left is removed
 *   all the same (logged);
 * - `--warm-up` rejects what is not a whole number 0–100000 (exit status 2).
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { requireOrSkip, ROOT } from '../helpers/cni.ts';
import { deleteNetnsAtExit, removeAtExit } from '../helpers/exit-cleanup.ts';
import { startTestDaemon, type TestDaemon } from '../helpers/daemon.ts';
import { runViaDaemon } from '../helpers/daemon-client.ts';

const BUNDLE = join(ROOT, 'dist', 'ipwarden.cjs');
const NS = `ipwwu${process.pid}`;

/** `ip ARGS`; throws on failure. */
function ipCmd(args: string[]): void {
  const r = spawnSync('ip', args, { encoding: 'utf8' });
  assert.equal(r.status, 0, `ip ${args.join(' ')}: ${r.stderr}`);
}
const skip = requireOrSkip(process.getuid?.() === 0 && existsSync(BUNDLE), 'root and a build (npm run build)');

/** The metrics page's lines. */
async function metricLines(port: number): Promise<string[]> {
  return (await (await fetch(`http://127.0.0.1:${port}/metrics`, { signal: AbortSignal.timeout(10_000) })).text()).split('\n');
}

/** The value of `ipwarden_cni_requests_total` with `labels` (0 when absent). */
async function requests(port: number, labels: string): Promise<number> {
  let n = 0;
  for (const line of await metricLines(port)) if (line.startsWith('ipwarden_cni_requests_total{') && line.includes(labels)) n += Number(line.split(' ').pop());
  return n;
}

describe('daemon warm-up', { skip }, () => {
  const dirs: string[] = [];
  const daemons: TestDaemon[] = [];
  after(async () => {
    for (const d of daemons) await d.stop();
    for (let i = 0; existsSync(`/run/netns/${NS}`) && i < 200; i++) {
      spawnSync('ip', ['netns', 'del', NS], { stdio: 'ignore' });
      if (existsSync(`/run/netns/${NS}`)) await new Promise((r) => setTimeout(r, 50));
    }
    for (const x of dirs) rmSync(x, { recursive: true, force: true });
  });
  const setup = (): { t: string; run: string; conf: (name: string) => Record<string, unknown> } => {
    const t = mkdtempSync(join(tmpdir(), 'ipw-warm-'));
    dirs.push(t);
    removeAtExit(t);
    const run = join(t, 'run');
    return { t, run, conf: (name) => ({ cniVersion: '1.0.0', name, ipam: { type: 'ipwarden', dataDir: join(t, 'data'), ranges: [[{ subnet: '10.89.3.0/24' }]] } }) };
  };

  it('completes uncounted and unlogged, serves the runtime meanwhile, removes its directory and a stale one (not through its symlink)', async () => {
    const { t, run, conf } = setup();
    // What a killed daemon leaves: a scratch directory with a reservation and a symlink to a
    // directory outside, and a symlink named like a scratch directory (rm -r must not follow either).
    const outside = join(t, 'outside');
    mkdirSync(outside);
    writeFileSync(join(outside, 'keep'), 'keep me');
    const stale = join(run, '.ipwarden-warm-up-plugin.sock-AbC123');
    mkdirSync(run, { mode: 0o700 });
    symlinkSync(outside, join(run, '.ipwarden-warm-up-plugin.sock-LnK456'));
    // A neighbour's (socket `plugin.sock-2` in the same directory, whose name starts like ours): not ours to remove.
    const neighbour = join(run, '.ipwarden-warm-up-plugin.sock-2-XyZ789');
    mkdirSync(neighbour, { mode: 0o700 });
    // The scratch range's first address, configured in a namespace before the daemon starts.
    ipCmd(['netns', 'add', NS]);
    deleteNetnsAtExit(NS);
    for (const l of [['link', 'add', 'ipwwubr0', 'type', 'bridge'], ['link', 'set', 'ipwwubr0', 'up'], ['addr', 'add', '198.18.0.2/32', 'dev', 'ipwwubr0']]) ipCmd(['-n', NS, ...l]);
    mkdirSync(join(stale, 'ipwarden-warm-up'), { recursive: true, mode: 0o700 });
    writeFileSync(join(stale, 'ipwarden-warm-up', '198.18.0.2'), 'ipwarden-warm-up-1\r\neth0');
    symlinkSync(outside, join(stale, 'ipwarden-warm-up', 'outside'));
    const d = await startTestDaemon({ socket: join(run, 'plugin.sock'), dataDir: join(t, 'data'), cniConfDir: join(t, 'net.d'), logLevel: 'info', args: ['--warm-up', '1000', '--interval', '1h'] });
    daemons.push(d);
    const port = Number(String((await d.waitForLog((l) => l.msg === 'metrics listening'))['metricsAddress']).split(':').pop());

    // The runtime's pods while the warm-up runs (a pid other than the daemon's, as a shim's).
    const served: string[] = [];
    for (let i = 0; i < 5; i++) {
      const id = `pod-${i}`;
      const add = await runViaDaemon(d.socket, { command: 'ADD', containerId: id, ifname: 'eth0', netns: '/var/run/netns/x', stdin: conf('warm-net') }, process.pid);
      assert.equal(add.exitCode, 0, add.stderr);
      const ip = String((add.json?.['ips'] as Array<{ address: string }>)[0]?.address).split('/')[0] as string;
      assert.match(ip, /^10\.89\.3\./);
      assert.equal(readFileSync(join(t, 'data', 'warm-net', ip), 'utf8'), `${id}\r\neth0`);
      const del = await runViaDaemon(d.socket, { command: 'DEL', containerId: id, ifname: 'eth0', stdin: conf('warm-net') }, process.pid);
      assert.equal(del.exitCode, 0, del.stderr);
      assert.equal(existsSync(join(t, 'data', 'warm-net', ip)), false);
      served.push(id);
    }
    const done = await d.waitForLog((l) => /^warm-up (done|stopped|cut short)/.test(l.msg));
    assert.equal(done.msg, 'warm-up done', JSON.stringify(done));
    assert.equal(done['pairs'], 1000);
    assert.equal(done['cut'], null);

    assert.deepEqual(readdirSync(outside), ['keep'], 'the stale directory and the symlink were removed without following a symlink');
    assert.equal(readFileSync(join(outside, 'keep'), 'utf8'), 'keep me');
    assert.deepEqual(readdirSync(run).filter((n) => n.startsWith('.ipwarden-warm-up-')), ['.ipwarden-warm-up-plugin.sock-2-XyZ789'], 'no scratch directory of ours left, the neighbour\'s kept');
    // The kernel address index was not asked: 198.18.0.2 was never skipped as a conflict.
    assert.deepEqual(d.logs.filter((l) => l['network'] === 'ipwarden-warm-up'), []);
    assert.deepEqual((await metricLines(port)).filter((l) => l.startsWith('ipwarden_allocation_kernel_') && l.includes('ipwarden-warm-up')), []);
    assert.deepEqual(readdirSync(join(t, 'data')), ['warm-net'], 'nothing of the warm-up in the data directory');
    // Counted and logged: the runtime's 10 requests, none of the warm-up's 2,000.
    assert.equal(await requests(port, 'command="ADD",path="daemon",result="ok"'), 5);
    assert.equal(await requests(port, 'command="DEL",path="daemon",result="ok"'), 5);
    // (Each line is written once the answer was: the last ones may follow their answers by a moment.)
    for (const id of served) await d.waitForLog((l) => l.msg === 'request served' && l['command'] === 'DEL' && l['containerId'] === id);
    const lines = d.logs.filter((l) => l.msg === 'request served');
    assert.deepEqual(lines.filter((l) => String(l['containerId']).startsWith('pod-')).map((l) => l['containerId']).sort(), [...served, ...served].sort());
    assert.deepEqual(lines.filter((l) => String(l['containerId']).startsWith('ipwarden-warm-up')), [], 'no warm-up request logged at info');
  });

  it('stops with the daemon: warm-up stopped, its directory removed, exit status 0', async () => {
    const { t, run } = setup();
    const d = await startTestDaemon({ socket: join(run, 'plugin.sock'), dataDir: join(t, 'data'), cniConfDir: join(t, 'net.d'), logLevel: 'debug', args: ['--warm-up', '100000', '--interval', '1h'] });
    daemons.push(d);
    // Some warm-up requests served (debug lines), then the stop.
    await d.waitForLog((l) => l.msg === 'request served' && String(l['containerId']).startsWith('ipwarden-warm-up-') && l['command'] === 'DEL');
    const { code } = await d.stop();
    assert.equal(code, 0);
    const stopped = d.logs.find((l) => l.msg === 'warm-up stopped');
    assert.ok(stopped !== undefined, d.stderr().slice(-2000));
    assert.ok((stopped['pairs'] as number) >= 1 && (stopped['pairs'] as number) < 100000);
    assert.deepEqual(readdirSync(run).filter((n) => n.startsWith('.ipwarden-warm-up-')), []);
  });

  it('with --warm-up 0 it sends nothing, and still removes what a killed daemon\'s warm-up left', async () => {
    const { t, run } = setup();
    mkdirSync(join(run, '.ipwarden-warm-up-plugin.sock-Q1w2E3', 'ipwarden-warm-up'), { recursive: true, mode: 0o700 });
    writeFileSync(join(run, '.ipwarden-warm-up-plugin.sock-Q1w2E3', 'ipwarden-warm-up', '198.18.0.9'), 'x\r\neth0');
    const d = await startTestDaemon({ socket: join(run, 'plugin.sock'), dataDir: join(t, 'data'), cniConfDir: join(t, 'net.d'), logLevel: 'debug', args: ['--warm-up', '0', '--interval', '1h'] });
    daemons.push(d);
    const line = await d.waitForLog((l) => l.msg.startsWith('removed the scratch directories'));
    assert.equal(line['removed'], 1);
    assert.deepEqual(readdirSync(run).filter((n) => n.startsWith('.ipwarden-warm-up-')), []);
    await d.waitForLog((l) => l.msg === 'daemon started');
    const { code } = await d.stop();
    assert.equal(code, 0);
    assert.deepEqual(d.logs.filter((l) => l.msg.startsWith('warm-up') || String(l['containerId'] ?? '').startsWith('ipwarden-warm-up')), [], 'no warm-up at all');
  });

  it('--warm-up rejects a bad value with exit status 2', () => {
    for (const bad of ['-1', 'abc', '1.5', '100001', '']) {
      const r = spawnSync(process.execPath, [BUNDLE, 'daemon', '--warm-up', bad, '--socket', '/nonexistent-ipwarden/plugin.sock'], { encoding: 'utf8', env: { PATH: '/usr/bin:/bin' } });
      assert.equal(r.status, 2, `${bad}: ${r.stderr}`);
      assert.match(r.stderr, /--warm-up/);
    }
  });
});
