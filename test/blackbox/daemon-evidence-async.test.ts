/**
 * The daemon keeps answering ADDs while a status report or a reconcile pass reads the kernel
 * evidence (docs/daemon.md "Status pages", "The reconcile loop"): those reads run with
 * `readKernelEvidenceAsync`, never the synchronous reader, whose pinned-namespace helper (up to
 * its 5 s timeout) would hold the daemon's event loop and every plugin request with it.
 *
 * Real parts: the built daemon (test/helpers/daemon.ts) run from a copy of dist/ whose
 * `ipwarden-netns` is a shell wrapper around the real helper: while the test's GATE file exists,
 * each run appends its pid to HELD, waits for the gate to open, then appends to ENDED and execs the
 * real helper (it ignores the SIGTERM of the reader's timeout: a held read is never cut short, so
 * no wall-clock limit decides the outcome; a valve ends the hold after ~60 s so that a daemon stuck
 * in a synchronous read fails the test instead of hanging it). One pinned namespace with no process
 * in it (`ip netns add`) makes every kernel read of the node run the helper. A fake CRI runtime on
 * a unix socket (test/helpers/hostile-cri.ts, no sandboxes).
 *
 * Why two held runs prove the report's (or the pass's) read is among them: the daemon's kernel
 * address index also reads every 3 s, but its reads never overlap, so it holds at most one run;
 * the loop's interval is 1 h (its first pass is over before the gate closes).
 *
 * Asserted, as an order of events and never a time:
 * - `/status.json` requested with the gate closed: once two helper runs are held, an ADD through
 *   the daemon's socket is answered (exactly 10.236.71.3) while no held run has ended and the
 *   report has not come; the gate opened, the report comes with the ADD's reservation and complete
 *   kernel evidence;
 * - a pass triggered by a full range set (5 reservation files written into a /29) with the gate
 *   closed: once two runs are held, an ADD is answered (exactly 10.236.71.4) while none has ended
 *   and the pass has not logged its end; the gate opened, the pass ends with no error.
 *
 * Addresses: 10.236.71.0/24 and 10.236.72.0/29 (configured nowhere). Needs root and `npm run build`.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { chmodSync, copyFileSync, existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { ROOT, requireOrSkip, tempDir } from '../helpers/cni.ts';
import { deleteNetnsAtExit } from '../helpers/exit-cleanup.ts';
import { startTestDaemon, type LogLine, type TestDaemon } from '../helpers/daemon.ts';
import { runViaDaemon } from '../helpers/daemon-client.ts';
import { startHostileCri, type HostileCri } from '../helpers/hostile-cri.ts';

const DIST = join(ROOT, 'dist');
const skip = requireOrSkip(process.getuid?.() === 0 && existsSync(join(DIST, 'ipwarden.cjs')) && existsSync(join(DIST, 'ipwarden-netns')), 'root and a build (npm run build)');

const NS = `ipwae-${process.pid}`;
const ADDNET = 'asyncadd';
const FULLNET = 'asyncfull';

describe('the daemon answers ADDs while a status report or a pass reads the kernel evidence', { skip, timeout: 300_000 }, () => {
  const t = tempDir('ipwarden-evidence-async-');
  const prog = join(t.dir, 'prog');
  const data = join(t.dir, 'data');
  const confDir = join(t.dir, 'net.d');
  const gate = join(t.dir, 'GATE');
  const heldFile = join(t.dir, 'HELD');
  const endedFile = join(t.dir, 'ENDED');
  let cri: HostileCri | null = null;
  let daemon: TestDaemon | null = null;
  let base = '';
  let nsMade = false;

  before(async () => {
    mkdirSync(prog, { mode: 0o755 });
    mkdirSync(confDir);
    for (const f of ['ipwarden.cjs', 'ipwarden-cold.cjs', 'ipwarden-flock.node']) copyFileSync(join(DIST, f), join(prog, f));
    // The wrapper: root-owned, 0755, in a root-owned 0755 directory (the helper's trust rules).
    writeFileSync(
      join(prog, 'ipwarden-netns'),
      [
        '#!/bin/sh',
        `if [ -e '${gate}' ]; then`,
        "  trap '' TERM",
        `  echo $$ >> '${heldFile}'`,
        '  i=0',
        `  while [ -e '${gate}' ] && [ $i -lt 3000 ]; do sleep 0.02; i=$((i+1)); done`,
        `  echo $$ >> '${endedFile}'`,
        'fi',
        `exec '${join(DIST, 'ipwarden-netns')}' "$@"`,
        '',
      ].join('\n'),
    );
    chmodSync(join(prog, 'ipwarden-netns'), 0o755);
    chmodSync(t.dir, 0o755);
    const r = spawnSync('ip', ['netns', 'add', NS], { encoding: 'utf8' });
    assert.equal(r.status, 0, r.stderr);
    nsMade = true;
    deleteNetnsAtExit(NS);
    writeFileSync(join(confDir, '10-asyncadd.conf'), JSON.stringify({ cniVersion: '1.0.0', name: ADDNET, type: 'bridge', ipam: { type: 'ipwarden', dataDir: data, ranges: [[{ subnet: '10.236.71.0/24' }]] } }));
    writeFileSync(join(confDir, '20-asyncfull.conf'), JSON.stringify({ cniVersion: '1.0.0', name: FULLNET, type: 'bridge', ipam: { type: 'ipwarden', dataDir: data, ranges: [[{ subnet: '10.236.72.0/29' }]] } }));
    mkdirSync(join(data, FULLNET), { recursive: true });
    cri = await startHostileCri({ path: join(t.dir, 'cri.sock') });
    daemon = await startTestDaemon({ bundle: join(prog, 'ipwarden.cjs'), dataDir: data, cniConfDir: confDir, logLevel: 'info', args: ['--runtime-endpoint', cri.endpoint, '--interval', '1h'] });
    const l = await daemon.waitForLog((x) => x.msg === 'metrics listening');
    base = `http://${String(l['metricsAddress'])}`;
    // One ADD before any gate: the first ADD into an empty directory asks the runtime and the
    // kernel whether the directory was wiped (docs/daemon.md), a kernel read of its own.
    const first = await add('a0'.repeat(32));
    assert.equal(first.exitCode, 0, first.stdout + first.stderr);
    // The first pass (at start) is over: no pass reads the kernel until one is triggered.
    await daemon.waitForLog((x) => x.msg === 'reconcile pass' && x['reason'] !== 'range set full');
  });

  after(async () => {
    rmSync(gate, { force: true });
    await daemon?.stop();
    await cri?.close();
    if (nsMade) spawnSync('ip', ['netns', 'del', NS]);
    t.cleanup();
  });

  const lines = (f: string): number => (existsSync(f) ? readFileSync(f, 'utf8').split('\n').filter((x) => x !== '').length : 0);

  /** Resolves once `pred()` holds (looked at every 10 ms; the test's timeout bounds the wait). */
  const until = async (pred: () => boolean): Promise<void> => {
    while (!pred()) await new Promise((r) => setTimeout(r, 10));
  };

  const add = (containerId: string) =>
    runViaDaemon((daemon as TestDaemon).socket, {
      command: 'ADD',
      containerId,
      ifname: 'eth0',
      netns: `/run/netns/${NS}`,
      stdin: { cniVersion: '1.0.0', name: ADDNET, type: 'bridge', ipam: { type: 'ipwarden', dataDir: data, ranges: [[{ subnet: '10.236.71.0/24' }]] } },
    });

  /** The ADD's address, with the helper's runs held and ended at the moment its answer came. */
  const addWhileHeld = async (containerId: string): Promise<{ ip: unknown; ended: number }> => {
    const r = await add(containerId);
    const ended = lines(endedFile);
    assert.equal(r.exitCode, 0, r.stdout + r.stderr);
    return { ip: (r.json?.['ips'] as Array<{ address: string }> | undefined)?.[0]?.address, ended };
  };

  it('/status.json: an ADD is answered while the report reads the kernel evidence', async () => {
    const held0 = lines(heldFile);
    const ended0 = lines(endedFile);
    writeFileSync(gate, '');
    let reportCame = false;
    const report = fetch(`${base}/status.json`).then(
      async (res) => {
        reportCame = true;
        return { status: res.status, body: (await res.json()) as { kernel: { complete: boolean }; networks: Array<{ name: string; total: { reserved: number } }> } };
      },
      (e: unknown) => {
        reportCame = true;
        return { status: 0, body: { error: String(e) } };
      },
    );
    await until(() => lines(heldFile) - held0 >= 2);
    const a = await addWhileHeld('a1'.repeat(32));
    assert.deepEqual(a, { ip: '10.236.71.3/24', ended: ended0 });
    assert.equal(reportCame, false, 'the report came before its kernel read ended');
    rmSync(gate);
    const r = await report;
    assert.equal(r.status, 200, JSON.stringify(r.body));
    assert.ok('kernel' in r.body);
    assert.equal(r.body.kernel.complete, true);
    assert.deepEqual(
      r.body.networks.map((n) => [n.name, n.total.reserved]),
      [
        [ADDNET, 2],
        [FULLNET, 0],
      ],
    );
    await until(() => lines(endedFile) === lines(heldFile));
  });

  it('a reconcile pass triggered by a full range set: an ADD is answered while the pass reads the kernel evidence', async () => {
    const d = daemon as TestDaemon;
    const passesBefore = d.logs.filter((x) => x.msg === 'reconcile pass').length;
    const held0 = lines(heldFile);
    const ended0 = lines(endedFile);
    writeFileSync(gate, '');
    // Fill the /29 (.2–.6; .1 is the gateway) as another writer would: the loop sees it and passes.
    for (let i = 2; i <= 6; i++) writeFileSync(join(data, FULLNET, `10.236.72.${i}`), `${'f'.repeat(63)}${i}\r\neth0`);
    await d.waitForLog((x) => x.msg === 'range set full: reconciling now');
    await until(() => lines(heldFile) - held0 >= 2);
    const a = await addWhileHeld('a2'.repeat(32));
    assert.deepEqual(a, { ip: '10.236.71.4/24', ended: ended0 });
    assert.equal(d.logs.filter((x) => x.msg === 'reconcile pass').length, passesBefore, 'the pass ended before its kernel read did');
    rmSync(gate);
    const pass: LogLine = await d.waitForLog((x) => x.msg === 'reconcile pass' && x['reason'] === 'range set full');
    assert.equal(pass['errors'], 0);
    await until(() => lines(endedFile) === lines(heldFile));
  });
});
