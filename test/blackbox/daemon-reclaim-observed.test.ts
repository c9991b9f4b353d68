/**
 * A reclaim on exhaustion inside an ADD the daemon serves is visible in the daemon's log and
 * metrics (docs/daemon.md "Logs", docs/metrics.md), not only in the audit log: the founding case
 * as a fresh user met it — a node's range filled by upstream host-local's leaks, an ADD through the
 * installed shim with `ipwarden daemon` up, the plugin's reclaim releasing the leaks inside that
 * one ADD — used to log only `request served`, leave `ipwarden_releases_total` absent and
 * `ipwarden_heal_seconds_count` at 0.
 *
 * Real parts: the upstream host-local binary fills a /28 (13 allocatable addresses) with the
 * reservations of 13 containers; the built daemon (test/helpers/daemon.ts) on the installed shim's
 * socket (test/helpers/cni.ts `pluginSocket`), its CNI configuration naming the network; a fake
 * CRI runtime (bench/fake-cri.ts) listing one sandbox that owns none of them. The files are 10
 * minutes old: past the network's `leakGracePeriod` (1m), so the plugin's reclaim may release them
 * (docs/reconciler.md "Plugin-side rules"), but inside the daemon's `--grace 1h`, so the daemon's
 * own pass does not (its start pass sees the range set full, 13 in grace): the ADD's reclaim is
 * what heals the network, as in the founding case, where the ADD came before the pass's second
 * observation. `--interval 1h`: no other pass runs.
 *
 * Expected, exactly: the ADD exits 0 with 10.219.83.2/28; one info line `reclaimed on exhaustion`
 * naming the network, its data directory, the ADD's container, 13 released and their IPs; one
 * `range set healed` line whose `healSeconds` is the histogram's sum; on /metrics
 * `ipwarden_releases_total{network,reason="leaked"}` 13 and `ipwarden_heal_seconds_count` 1.
 *
 * Addresses: 10.219.83.0/28 (configured nowhere). Needs root (kernel evidence), host-local and
 * `npm run build`; without them: fails when CI=true, else skips.
 */
import assert from 'node:assert/strict';
import { mkdirSync, utimesSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { startFakeCri, type FakeCri } from '../../bench/fake-cri.ts';
import { haveHostLocal, HOST_LOCAL, installedPlugin, pluginSocket, requireOrSkip, runCni, runCniAsync, snapshotDir, tempDir } from '../helpers/cni.ts';
import { startTestDaemon, type LogLine, type TestDaemon } from '../helpers/daemon.ts';

const isRoot = process.getuid?.() === 0;
const skip = requireOrSkip(isRoot && haveHostLocal(), `root and ${HOST_LOCAL}`);

const NET = 'healobs';
const ip = (n: number): string => `10.219.83.${n}`;
const LEAKS = Array.from({ length: 13 }, (_, i) => ip(i + 2));
const TEN_MINUTES_AGO = Date.now() / 1000 - 600;

/** The /metrics samples, `name{labels}` → value, parsed from the text format. */
async function scrape(d: TestDaemon): Promise<Map<string, number>> {
  const line = await d.waitForLog((l) => l.msg === 'metrics listening');
  const res = await fetch(`http://${String(line['metricsAddress'])}/metrics`);
  assert.equal(res.status, 200);
  const out = new Map<string, number>();
  for (const l of (await res.text()).split('\n')) {
    const m = /^([a-z_:][a-z0-9_:]*(?:\{.*\})?) (\S+)$/i.exec(l);
    if (m !== null) out.set(m[1] as string, Number(m[2]));
  }
  return out;
}

/** A log line without the fields that vary from run to run (time, pid). */
function stable(l: LogLine): Record<string, unknown> {
  const { time: _time, pid: _pid, ...rest } = l;
  return rest;
}

describe('a reclaim on exhaustion inside an ADD the daemon serves is logged and counted', { skip, timeout: 120_000 }, () => {
  const t = tempDir('ipwd-heal-observe-');
  const dd = join(t.dir, 'data');
  const netd = join(t.dir, 'net.d');
  let cri: FakeCri | null = null;
  let d: TestDaemon | null = null;
  let bin = '';

  const conf = (type: 'host-local' | 'ipwarden', more: Record<string, unknown> = {}) => ({
    cniVersion: '1.0.0',
    name: NET,
    ipam: { type, dataDir: dd, ranges: [[{ subnet: '10.219.83.0/28' }]], ...more },
  });

  before(async () => {
    bin = installedPlugin();
    mkdirSync(netd);
    cri = await startFakeCri(join(t.dir, 'cri.sock'), ['a-sandbox-owning-nothing-here']);
    const ipwardenConf = conf('ipwarden', { runtimeEndpoint: cri.endpoint, leakGracePeriod: '1m' });
    writeFileSync(join(netd, '10-healobs.conf'), JSON.stringify({ ...ipwardenConf, type: 'bridge' }));
    // Upstream host-local fills the range: 13 containers whose DEL never came.
    for (const [i, addr] of LEAKS.entries()) {
      const r = runCni(HOST_LOCAL, { command: 'ADD', containerId: `leak-${i + 1}`, ifname: 'eth0', stdin: conf('host-local') });
      assert.equal(r.exitCode, 0, r.stdout + r.stderr);
      utimesSync(join(dd, NET, addr), TEN_MINUTES_AGO, TEN_MINUTES_AGO);
    }
    d = await startTestDaemon({ socket: pluginSocket(), dataDir: dd, cniConfDir: netd, logLevel: 'info', args: ['--interval', '1h', '--grace', '1h', '--runtime-endpoint', cri.endpoint] });
    // The start pass is over: it saw the range set full (the heal clock starts), nothing to release yet.
    const pass = await d.waitForLog((l) => l.msg === 'reconcile pass' && l['reason'] === 'start');
    assert.deepEqual([pass['networks'], pass['released'], pass['candidates'], pass['errors']], [1, 0, 0, 0]);
  });

  after(async () => {
    await d?.stop();
    await cri?.close();
    t.cleanup();
  });

  it('the ADD through the shim reclaims the 13 leaks: one info line names the network, the container and the 13; ipwarden_releases_total and ipwarden_heal_seconds count them', async () => {
    const daemon = d as TestDaemon;
    const labels = `network="${NET}",range_set="0"`;
    const before = await scrape(daemon);
    assert.deepEqual(
      [before.get(`ipwarden_range_set_capacity{${labels}}`), before.get(`ipwarden_addresses{${labels},state="free"}`), before.get(`ipwarden_addresses{${labels},state="grace"}`), before.get('ipwarden_heal_seconds_count')],
      [13, 0, 13, 0],
    );

    const r = await runCniAsync(bin, { command: 'ADD', containerId: 'heal-new', ifname: 'eth0', stdin: conf('ipwarden', { runtimeEndpoint: (cri as FakeCri).endpoint, leakGracePeriod: '1m' }) });
    assert.deepEqual([r.exitCode, r.json, r.stderr], [0, { cniVersion: '1.0.0', ips: [{ address: `${ip(2)}/28`, gateway: ip(1) }] }, ''], r.stdout);
    assert.deepEqual(snapshotDir(join(dd, NET)), { [ip(2)]: 'heal-new\r\neth0', 'last_reserved_ip.0': ip(2), lock: '' });

    // The daemon served it (not the standalone fallback) and said what its reclaim did.
    const served = await daemon.waitForLog((l) => l.msg === 'request served' && l['containerId'] === 'heal-new');
    assert.deepEqual([served['command'], served['network'], served['result']], ['ADD', NET, 'ok']);
    const reclaimed = daemon.logs.filter((l) => l.msg === 'reclaimed on exhaustion');
    assert.deepEqual(reclaimed.map(stable), [{ level: 30, msg: 'reclaimed on exhaustion', network: NET, dataDir: dd, containerId: 'heal-new', released: 13, ips: LEAKS }]);
    const healed = daemon.logs.filter((l) => l.msg === 'range set healed');
    assert.equal(healed.length, 1);
    const healSeconds = healed[0]?.['healSeconds'];
    assert.equal(typeof healSeconds, 'number');
    assert.deepEqual(stable(healed[0] as LogLine), { level: 30, msg: 'range set healed', part: 'loop', network: join(dd, NET), healSeconds, containerId: 'heal-new' });
    // The heal clock started at the start pass (the range set seen full), not at the ADD.
    const passAt = Number(daemon.logs.find((l) => l.msg === 'reconcile pass')?.['time']);
    assert.ok((healSeconds as number) * 1000 >= Number(reclaimed[0]?.['time']) - passAt - 1, `healSeconds ${String(healSeconds)}`);

    const after = await scrape(daemon);
    assert.deepEqual(
      [
        after.get(`ipwarden_releases_total{network="${NET}",reason="leaked"}`),
        after.get(`ipwarden_releases_total{network="${NET}",reason="corrupt"}`),
        after.get('ipwarden_heal_seconds_count'),
        after.get('ipwarden_heal_seconds_sum'),
        after.get('ipwarden_cni_requests_total{command="ADD",path="daemon",result="ok"}'),
      ],
      [13, undefined, 1, healSeconds, 1],
    );
  });
});
