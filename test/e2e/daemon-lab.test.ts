// Issue 9 end to end on a real containerd (the lab) with `ipwarden daemon` running (the built
// bundle, started by test/helpers/daemon.ts with the lab's data dir, CNI conf dir and CRI endpoint):
//
// (a) a network on UPSTREAM host-local, filled with leaks (a chained plugin that fails ADD and DEL,
//     then the runtime losing its sandbox records), is healed by the daemon within seconds of its
//     range set filling up — the inotify trigger, not the 30 s interval — with no change to the
//     CNI configuration: the pod that would have failed starts (RunPodSandbox retried the way
//     kubelet does), exactly the leaked addresses are released (audit log, daemon log, metrics),
//     no running or NOTREADY sandbox loses its address, the conf files are byte-identical;
// (b) ipwarden as the IPAM through the installed shim: pods are served by the daemon
//     ('request served', ipwarden_cni_requests_total{path="daemon"}); with the daemon stopped
//     (SIGTERM) pods still start through the standalone fallback, which the restarted daemon
//     counts as path="standalone".
//
// Every wait is on a condition (a log line, a file, a clock time the daemon's rules name); the
// only pause is the short one between the kubelet-like RunPodSandbox retries, and it decides
// nothing: the assertions are on what the daemon did. The subnets are this file's own
// (10.247.61.0/28, 10.247.62.0/28), so pods of other lab tests running at the same time (the
// default 10.244.9.0/28) never look "in use" to this daemon's kernel evidence.
// Needs root, Debian's containerd, runc, containernetworking-plugins and the built bundle
// (CI=true: fail, else skip).
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { AppError } from '../../src/common/errors.ts';
import { IPWARDEN_BUNDLE, labLeftovers, labUnavailableReason, startLab, type Lab } from '../../src/lab/lab.ts';
import { auditLines, rangeSetText, runBrokenPod, tryRunPod, waitUntilOlder, type Pod } from '../../src/lab/scenario.ts';
import { startTestDaemon, type LogLine, type TestDaemon } from '../helpers/daemon.ts';

const unavailable = labUnavailableReason() ?? (existsSync(IPWARDEN_BUNDLE) ? undefined : `no built bundle at ${IPWARDEN_BUNDLE} (npm run build)`);
const ciMustRun = process.env['CI'] === 'true';
const skip = ciMustRun ? false : (unavailable ?? false);

/** Grace period of the daemon in (a), seconds (`--grace 2s`). */
const GRACE_SECONDS = 2;
/** How often a kubelet-like caller retries a failed RunPodSandbox, at most. */
const MAX_ATTEMPTS = 20;
/** Pause between two such attempts, ms (kubelet backs off between sandbox retries too). */
const RETRY_PAUSE_MS = 250;

/** The lab's daemon: the lab's socket, data dir, conf dir and CRI endpoint; metrics on a free loopback port. */
function startLabDaemon(lab: Lab, extra: string[] = []): Promise<TestDaemon> {
  return startTestDaemon({
    socket: lab.pluginSocket,
    dataDir: lab.dataDir,
    cniConfDir: lab.confDir,
    logLevel: 'debug',
    args: ['--runtime-endpoint', lab.endpoint, '--metrics-address', '127.0.0.1:0', ...extra],
  });
}

/** Every file of `dir` (the CNI conf dir): name → bytes. */
function filesOf(dir: string): Map<string, Buffer> {
  return new Map(readdirSync(dir).sort().map((n) => [n, readFileSync(join(dir, n))]));
}

/** One sample of the exposition text: `name{labels} value`. */
interface Sample {
  readonly name: string;
  readonly labels: Record<string, string>;
  readonly value: number;
}

/** The daemon's /metrics, parsed (the port from its 'metrics listening' line). */
async function scrape(d: TestDaemon): Promise<Sample[]> {
  const line = await d.waitForLog((l) => l.msg === 'metrics listening');
  const res = await fetch(`http://${String(line['metricsAddress'])}/metrics`);
  assert.equal(res.status, 200);
  const out: Sample[] = [];
  for (const l of (await res.text()).split('\n')) {
    const m = /^([a-z_:][a-z0-9_:]*)(?:\{(.*)\})? (\S+)$/i.exec(l);
    if (m === null) continue;
    const labels: Record<string, string> = {};
    for (const p of (m[2] ?? '').matchAll(/([a-z_][a-z0-9_]*)="((?:[^"\\]|\\.)*)"/gi)) labels[p[1] as string] = p[2] as string;
    out.push({ name: m[1] as string, labels, value: Number(m[3]) });
  }
  return out;
}

/** Value of the sample `name` whose labels include `labels`; 0 when there is none (a counter never incremented). */
function sample(samples: readonly Sample[], name: string, labels: Record<string, string>): number {
  const hit = samples.filter((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v));
  assert.ok(hit.length <= 1, `${name} ${JSON.stringify(labels)} matches ${hit.length} samples`);
  return hit[0]?.value ?? 0;
}

/** Resolves at wall-clock time `ms` (a condition on the clock the daemon's rules use). */
async function untilTime(ms: number): Promise<void> {
  while (Date.now() < ms) await new Promise((r) => setTimeout(r, Math.max(1, ms - Date.now())));
}

const passLines = (d: TestDaemon): LogLine[] => d.logs.filter((l) => l.msg === 'reconcile pass');

describe('the daemon heals an upstream host-local network filled with leaks within seconds of exhaustion, with no CNI config change', { skip, timeout: 300_000 }, () => {
  const SUBNET = '10.247.61.0/28';
  const ip = (n: number): string => `10.247.61.${n}`;
  const EXHAUSTED = `failed to allocate for range 0: no IP addresses available in range set: ${rangeSetText(SUBNET)}`;
  let lab: Lab | undefined;
  let daemon: TestDaemon | undefined;
  let confBefore = new Map<string, Buffer>();
  const leaked: Pod[] = []; // READY and NOTREADY before the runtime lost its records
  const live: Pod[] = []; // READY after the wipe
  let notReady: Pod | undefined; // NOTREADY after the wipe (listed: live)
  let startPass: LogLine | undefined;

  before(async () => {
    if (unavailable !== undefined) throw new Error(`CI=true but the e2e prerequisites are missing: ${unavailable}`);
    lab = await startLab({ ipam: 'host-local', subnet: SUBNET, chained: 'pass' });
    confBefore = filesOf(lab.confDir);
  });
  after(async () => {
    try {
      await daemon?.stop();
    } finally {
      await lab?.stop();
    }
  });

  it('leaks: 2 READY + 2 NOTREADY sandboxes (chained plugin fails ADD and DEL), then the runtime loses its records: .2–.5 owned by nobody; a NOTREADY (.6) and 3 READY pods (.7–.9) hold the rest', async () => {
    const l = lab!;
    for (const n of [1, 2]) {
      const r = await tryRunPod(l, `gone-${n}`);
      assert.ok(r.ok, r.ok ? '' : r.error);
      leaked.push(r.pod);
    }
    l.setChainedMode('fail');
    for (const n of [1, 2]) leaked.push(await runBrokenPod(l, `gone-broken-${n}`));
    await l.wipeRuntimeState();
    assert.deepEqual(await l.listSandboxes(), []);
    notReady = await runBrokenPod(l, 'broken-live');
    l.setChainedMode('pass');
    for (const n of [1, 2, 3]) {
      const r = await tryRunPod(l, `app-${n}`);
      assert.ok(r.ok, r.ok ? '' : r.error);
      live.push(r.pod);
    }
    assert.deepEqual(leaked.map((p) => p.ip), [2, 3, 4, 5].map(ip));
    assert.equal(notReady.ip, ip(6));
    assert.deepEqual(live.map((p) => p.ip), [7, 8, 9].map(ip));
    assert.deepEqual(
      l.reservations().map((r) => [r.ip, r.id, r.ifname]),
      [...leaked, notReady, ...live].map((p) => [p.ip, p.id, 'eth0']),
    );
  });

  it('the daemon (--grace 2s, --interval 30s) starts once the leaks are older than the grace period; its first pass sees exactly the 4 leaks as candidates and releases nothing', async () => {
    const l = lab!;
    await waitUntilOlder(l, leaked.map((p) => p.ip), GRACE_SECONDS);
    daemon = await startLabDaemon(l, ['--grace', `${GRACE_SECONDS}s`, '--interval', '30s']);
    startPass = await daemon.waitForLog((x) => x.msg === 'reconcile pass');
    assert.equal(startPass['reason'], 'start');
    assert.equal(startPass['candidates'], leaked.length);
    assert.equal(startPass['released'], 0);
    assert.equal(startPass['errors'], 0, daemon.stderr());
    assert.equal(startPass['sandboxes'], 1 + live.length);
    assert.equal(l.reservations().length, 4 + 1 + live.length);
    const m = await scrape(daemon);
    assert.equal(sample(m, 'ipwarden_release_candidates', { network: l.networkName }), leaked.length);
    assert.equal(sample(m, 'ipwarden_addresses', { network: l.networkName, range_set: '0', state: 'leaked' }), leaked.length);
    assert.equal(sample(m, 'ipwarden_addresses', { network: l.networkName, range_set: '0', state: 'free' }), 13 - 8);
  });

  it('filling the range set (.10–.14) triggers a pass that releases exactly .2–.5; the pod that would have failed starts on .2 (kubelet-like retries on the exact host-local error)', async (t) => {
    const l = lab!;
    const d = daemon!;
    // The second observation must come at least a grace period after the first (confirm.ts rule 1).
    await untilTime(startPass!.time as number + GRACE_SECONDS * 1000 + 1);
    // Exactly the 5 free addresses (not fillRange: it re-counts, and the daemon may already have
    // released by then).
    const filled: Pod[] = [];
    for (const n of [1, 2, 3, 4, 5]) {
      const r = await tryRunPod(l, `fill-${n}`);
      assert.ok(r.ok, r.ok ? '' : r.error);
      filled.push(r.pod);
    }
    assert.deepEqual(filled.map((p) => p.ip), [10, 11, 12, 13, 14].map(ip));
    const fullAtMs = statSync(join(l.networkDir, ip(14))).mtimeMs;

    let attempts = 0;
    let healed: Pod | undefined;
    const errors: string[] = [];
    while (healed === undefined) {
      attempts++;
      const r = await l.runSandbox('would-have-failed').then(
        (id) => ({ id }),
        (e: unknown) => ({ e }),
      );
      if ('id' in r) {
        healed = { name: 'would-have-failed', id: r.id, ip: l.reservations().find((x) => x.id === r.id)?.ip ?? '', state: 'ready' };
        break;
      }
      // Only host-local's exhaustion is an expected failure (the daemon has not released yet).
      assert.ok(r.e instanceof AppError, String(r.e));
      const id = /failed to setup network for sandbox "([0-9a-f]{64})"/.exec(r.e.message)?.[1] ?? '<no id>';
      assert.equal(r.e.message, `CRI RuntimeService/RunPodSandbox at ${l.endpoint} failed: UNKNOWN: failed to setup network for sandbox "${id}": plugin type="bridge" failed (add): ${EXHAUSTED}`);
      errors.push(r.e.message);
      assert.ok(attempts < MAX_ATTEMPTS, `RunPodSandbox still fails after ${attempts} attempts; daemon log:\n${d.stderr()}`);
      await new Promise((res) => setTimeout(res, RETRY_PAUSE_MS));
    }
    assert.equal(healed.ip, ip(2), 'round robin wraps after .14 to the first released address');
    assert.equal((await l.cri.podSandboxStatus(healed.id)).network.ip, ip(2));

    // The release came from the exhaustion trigger: one 'range set full' line naming the network
    // dir, and the pass that released is that triggered pass — no interval pass ever ran.
    const trigger = await d.waitForLog((x) => x.msg === 'range set full: reconciling now');
    assert.deepEqual(trigger['networks'], [l.networkDir]);
    const releasing = await d.waitForLog((x) => x.msg === 'reconcile pass' && x['released'] !== 0);
    assert.equal(releasing['reason'], 'range set full');
    assert.equal(releasing['released'], leaked.length);
    assert.equal(releasing['errors'], 0, d.stderr());
    assert.deepEqual(passLines(d).map((x) => x['reason']).filter((r) => r === 'interval'), []);
    const released = d.logs.filter((x) => x.msg === 'released');
    assert.deepEqual(
      released.map((x) => [x['network'], x['ip'], x['containerId'], x['ifname'], x['reason']]).sort(),
      leaked.map((p) => [l.networkName, p.ip, p.id, 'eth0', 'leaked']).sort(),
    );
    t.diagnostic(
      `range set full at +0 ms; trigger logged at +${Math.round((trigger.time as number) - fullAtMs)} ms; ` +
        `released by +${Math.round((releasing.time as number) - fullAtMs)} ms; the healed pod started after ${attempts} attempt(s) ` +
        `(${errors.length} exhausted), ${Math.round(Date.now() - fullAtMs)} ms after the range set filled up`,
    );

    // The audit log in the data dir: one release line per leaked reservation, nothing else.
    assert.deepEqual(
      auditLines(l).map((a) => [a.network, a.ip, a.containerId, a['ifname'], a['verdict'], a['phase']]).sort(),
      leaked.map((p) => [l.networkName, p.ip, p.id, 'eth0', 'leaked', 'released']).sort(),
    );
    const m = await scrape(d);
    assert.equal(sample(m, 'ipwarden_releases_total', { network: l.networkName, reason: 'leaked' }), leaked.length);
    assert.equal(sample(m, 'ipwarden_release_candidates', { network: l.networkName }), 0);
  });

  it('no sandbox the runtime lists lost its address: every READY pod\'s IP (PodSandboxStatus) and the NOTREADY pod\'s reservation are on disk with their owner', async () => {
    const l = lab!;
    const listed = await l.listSandboxes();
    const ready = listed.filter((s) => s.state === 'ready');
    assert.equal(ready.length, live.length + 5 + 1);
    assert.deepEqual(listed.filter((s) => s.state === 'notready').map((s) => s.id), [notReady!.id]);
    const onDisk = new Map(l.reservations().map((r) => [r.ip, `${r.id}\r\n${r.ifname}`]));
    for (const s of ready) {
      const podIp = (await l.cri.podSandboxStatus(s.id)).network.ip;
      assert.notEqual(podIp, '', `${s.name} has a pod IP`);
      assert.equal(onDisk.get(podIp), `${s.id}\r\neth0`, `${s.name} (${podIp}) still owns its reservation`);
    }
    assert.equal(readFileSync(join(l.networkDir, notReady!.ip), 'utf8'), `${notReady!.id}\r\neth0`);
    // .3–.5 are free (released, not reused yet); every other address is owned by a listed sandbox.
    assert.deepEqual([...onDisk.keys()].sort(), [2, 6, 7, 8, 9, 10, 11, 12, 13, 14].map(ip).sort());
    for (const p of leaked.slice(1)) assert.equal(existsSync(join(l.networkDir, p.ip)), false);
  });

  it('the CNI configuration files are byte-identical to what they were before the daemon ran', () => {
    const after = filesOf(lab!.confDir);
    assert.deepEqual([...after.keys()], [...confBefore.keys()]);
    for (const [name, bytes] of confBefore) assert.ok(bytes.equals(after.get(name) as Buffer), `${name} unchanged`);
    assert.match(confBefore.get(`10-${lab!.networkName}.conflist`)?.toString('utf8') ?? '', /"type": "host-local"/);
  });

  it('the daemon stops on SIGTERM (exit 0, socket removed); stop() leaves nothing behind', async () => {
    const l = lab!;
    const r = await daemon!.stop();
    assert.deepEqual(r, { code: 0, signal: null });
    assert.equal(existsSync(l.pluginSocket), false);
    await l.stop();
    assert.deepEqual(labLeftovers(l), []);
  });
});

describe('heal on arrival: a host-local node full of leaks before the daemon starts heals without waiting for an interval (defaults except --grace)', { skip, timeout: 300_000 }, () => {
  const SUBNET = '10.247.63.0/28';
  const ip = (n: number): string => `10.247.63.${n}`;
  const EXHAUSTED = `failed to allocate for range 0: no IP addresses available in range set: ${rangeSetText(SUBNET)}`;
  let lab: Lab | undefined;
  let daemon: TestDaemon | undefined;
  const leaked: Pod[] = [];
  const live: Pod[] = [];

  before(async () => {
    if (unavailable !== undefined) throw new Error(`CI=true but the e2e prerequisites are missing: ${unavailable}`);
    lab = await startLab({ ipam: 'host-local', subnet: SUBNET, chained: 'pass' });
  });
  after(async () => {
    try {
      await daemon?.stop();
    } finally {
      await lab?.stop();
    }
  });

  it('10 pods (.2–.11), then the runtime loses its records; 3 live pods take .12–.14: the range set is full and the next pod fails with host-local\'s exact error', async () => {
    const l = lab!;
    for (let n = 1; n <= 10; n++) {
      const r = await tryRunPod(l, `lost-${n}`);
      assert.ok(r.ok, r.ok ? '' : r.error);
      leaked.push(r.pod);
    }
    await l.wipeRuntimeState();
    for (const n of [1, 2, 3]) {
      const r = await tryRunPod(l, `app-${n}`);
      assert.ok(r.ok, r.ok ? '' : r.error);
      live.push(r.pod);
    }
    assert.deepEqual(leaked.map((p) => p.ip), [2, 3, 4, 5, 6, 7, 8, 9, 10, 11].map(ip));
    assert.deepEqual(live.map((p) => p.ip), [12, 13, 14].map(ip));
    const r = await tryRunPod(l, 'before-daemon');
    assert.equal(r.ok, false);
    assert.ok(!r.ok && r.error.endsWith(EXHAUSTED), r.ok ? '' : r.error);
  });

  it('the daemon (--grace 2s, default 1m interval) sees 10 candidates in a full range set at start and confirms them in a pass of its own a grace later: 10 released, the next pod starts on .2, no interval pass ran', async (t) => {
    const l = lab!;
    await waitUntilOlder(l, leaked.map((p) => p.ip), GRACE_SECONDS);
    daemon = await startLabDaemon(l, ['--grace', `${GRACE_SECONDS}s`]);
    const d = daemon;
    const start = await d.waitForLog((x) => x.msg === 'reconcile pass');
    assert.equal(start['reason'], 'start');
    assert.equal(start['candidates'], leaked.length);
    assert.equal(start['released'], 0);
    assert.equal(start['errors'], 0, d.stderr());
    // The confirming pass: scheduled by the start pass for min(grace, 30 s) after the first
    // observation (confirm.ts FULL_CONFIRM_MAX_SECONDS), not by an interval or an inotify event.
    const confirming = await d.waitForLog((x) => x.msg === 'reconcile pass' && x['released'] !== 0);
    assert.equal(confirming['reason'], 'confirm (range set full)');
    assert.equal(confirming['released'], leaked.length);
    assert.equal(confirming['errors'], 0, d.stderr());
    assert.deepEqual(passLines(d).map((x) => x['reason']).filter((r) => r === 'interval'), []);
    assert.deepEqual(
      d.logs.filter((x) => x.msg === 'released').map((x) => x['ip']).sort(ipCompareText),
      leaked.map((p) => p.ip),
    );
    const r = await tryRunPod(l, 'healed');
    assert.ok(r.ok, r.ok ? '' : r.error);
    assert.equal(r.pod.ip, ip(2));
    for (const p of live) assert.equal(readFileSync(join(l.networkDir, p.ip), 'utf8'), `${p.id}\r\neth0`);
    const healed = await d.waitForLog((x) => x.msg === 'range set healed');
    assert.equal(healed['network'], l.networkDir);
    const m = await scrape(d);
    assert.equal(sample(m, 'ipwarden_heal_seconds_count', {}), 1);
    t.diagnostic(`first pass → confirming pass: ${Math.round((confirming.time as number) - (start.time as number))} ms; heal ${String(healed['healSeconds'])} s`);
  });
});

/** Compare dotted IPv4 texts by value. */
function ipCompareText(a: unknown, b: unknown): number {
  const v = (x: unknown): number => String(x).split('.').reduce((n, o) => n * 256 + Number(o), 0);
  return v(a) - v(b);
}

describe('ipwarden through the shim and the daemon on the lab; with the daemon stopped, pods start through the standalone fallback', { skip, timeout: 300_000 }, () => {
  const SUBNET = '10.247.62.0/28';
  const ip = (n: number): string => `10.247.62.${n}`;
  let lab: Lab | undefined;
  let daemon: TestDaemon | undefined;
  const pods: Pod[] = [];

  before(async () => {
    if (unavailable !== undefined) throw new Error(`CI=true but the e2e prerequisites are missing: ${unavailable}`);
    lab = await startLab({ ipam: 'ipwarden', subnet: SUBNET });
  });
  after(async () => {
    try {
      await daemon?.stop();
    } finally {
      await lab?.stop();
    }
  });

  /** RunPodSandbox `name`, which must succeed; checks its pod IP against the reservation file. */
  async function runPod(name: string): Promise<Pod> {
    const l = lab!;
    const r = await tryRunPod(l, name);
    assert.ok(r.ok, r.ok ? '' : r.error);
    assert.equal((await l.cri.podSandboxStatus(r.pod.id)).network.ip, r.pod.ip);
    assert.equal(readFileSync(join(l.networkDir, r.pod.ip), 'utf8'), `${r.pod.id}\r\neth0`);
    pods.push(r.pod);
    return r.pod;
  }

  const served = (d: TestDaemon, command: string, id: string): Promise<LogLine> =>
    d.waitForLog((x) => x.msg === 'request served' && x['command'] === command && x['containerId'] === id);

  it('the lab installed the shim with its own socket path', () => {
    const l = lab!;
    const shim = readFileSync(join(l.binDir, 'ipwarden'));
    assert.ok(shim.includes(Buffer.from(`IPWARDEN-SOCKET-PATH=${l.pluginSocket}\0`)), 'the socket field holds the lab socket');
    assert.ok(existsSync(join(l.binDir, 'ipwarden-standalone')));
    assert.equal(statSync(join(l.pluginSocket, '..')).mode & 0o777, 0o700);
  });

  it('with the daemon up, pods get their addresses through the daemon (request served; ipwarden_cni_requests_total{path="daemon"})', async () => {
    const l = lab!;
    daemon = await startLabDaemon(l);
    const a = await runPod('via-daemon-1');
    const b = await runPod('via-daemon-2');
    assert.deepEqual([a.ip, b.ip], [ip(2), ip(3)]);
    for (const p of [a, b]) {
      const line = await served(daemon, 'ADD', p.id);
      assert.equal(line['result'], 'ok');
      assert.equal(line['network'], l.networkName);
    }
    await l.stopAndRemove(a.id);
    assert.equal(existsSync(join(l.networkDir, a.ip)), false);
    assert.equal((await served(daemon, 'DEL', a.id))['result'], 'ok');
    const m = await scrape(daemon);
    assert.equal(sample(m, 'ipwarden_cni_requests_total', { command: 'ADD', path: 'daemon', result: 'ok' }), 2);
    assert.ok(sample(m, 'ipwarden_cni_requests_total', { command: 'DEL', path: 'daemon', result: 'ok' }) >= 1);
    assert.equal(sample(m, 'ipwarden_cni_requests_total', { command: 'ADD', path: 'standalone', result: 'ok' }), 0);
  });

  it('SIGTERM stops the daemon (exit 0, socket removed); pods still start and stop, through the standalone fallback', async () => {
    const l = lab!;
    const r = await daemon!.stop();
    assert.deepEqual(r, { code: 0, signal: null });
    assert.equal(existsSync(l.pluginSocket), false);
    const c = await runPod('fallback-1');
    const d = await runPod('fallback-2');
    assert.deepEqual([c.ip, d.ip], [ip(4), ip(5)]);
    await l.stopAndRemove(d.id);
    assert.equal(existsSync(join(l.networkDir, d.ip)), false);
    const counted = readFileSync(join(l.pluginSocket, '..', 'standalone-requests.log'), 'utf8')
      .split('\n')
      .filter((x) => x !== '')
      .map((x) => x.split(' ').slice(1).join(' '));
    assert.equal(counted.filter((x) => x === 'ADD ok').length, 2);
    assert.ok(counted.filter((x) => x === 'DEL ok').length >= 1);
  });

  it('the restarted daemon counts the fallback requests as path="standalone" and serves the next pod itself', async () => {
    const l = lab!;
    daemon = await startLabDaemon(l);
    const m = await scrape(daemon);
    assert.equal(sample(m, 'ipwarden_cni_requests_total', { command: 'ADD', path: 'standalone', result: 'ok' }), 2);
    assert.ok(sample(m, 'ipwarden_cni_requests_total', { command: 'DEL', path: 'standalone', result: 'ok' }) >= 1);
    assert.equal(sample(m, 'ipwarden_cni_requests_total', { command: 'ADD', path: 'standalone', result: 'error' }), 0);
    assert.equal(sample(m, 'ipwarden_cni_requests_total', { command: 'ADD', path: 'daemon', result: 'ok' }), 0);
    const e = await runPod('via-daemon-3');
    assert.equal(e.ip, ip(6));
    assert.equal((await served(daemon, 'ADD', e.id))['result'], 'ok');
    const m2 = await scrape(daemon);
    assert.equal(sample(m2, 'ipwarden_cni_requests_total', { command: 'ADD', path: 'daemon', result: 'ok' }), 1);
    assert.deepEqual(
      l.reservations().map((x) => [x.ip, x.id]),
      [pods[1]!, pods[2]!, e].map((p) => [p.ip, p.id]),
    );
  });

  it('stop() leaves nothing behind', async () => {
    const l = lab!;
    assert.deepEqual(await daemon!.stop(), { code: 0, signal: null });
    await l.stop();
    assert.deepEqual(labLeftovers(l), []);
  });
});
