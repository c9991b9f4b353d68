/**
 * A scrape flood against the real daemon (issue 17 item 3: "the request path must not slow under a
 * scrape flood"): 24 keep-alive clients scrape `/metrics` again as soon as they are answered while
 * pods are added and deleted through the installed shim. The mechanism, asserted exactly (no
 * wall-clock thresholds): every scrape gets a full exposition; each client's answers come from
 * strictly newer renders (a scrape never gets a render begun before it asked); the registry is
 * rendered at most ceil(W / 1 s) + 1 times in the W measured around the flood, however many
 * scrapes; every ADD and DEL is served by the daemon (not the shim's fallback) with the exact
 * addresses and files; a scrape right after them counts them. The latency itself is measured by
 * bench/metrics-flood.ts (docs/benchmarks.md), not asserted here.
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { Agent, get } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { requireOrSkip, ROOT, runCniAsync } from '../helpers/cni.ts';
import { startTestDaemon, type TestDaemon } from '../helpers/daemon.ts';
import { METRICS_RENDER_INTERVAL_MS } from '../../src/daemon/metrics.ts';

const BUNDLE = join(ROOT, 'dist', 'ipwarden.cjs');
const skip = requireOrSkip(process.getuid?.() === 0 && existsSync(BUNDLE), 'root and a build (npm run build)');
const SUBNET = '10.231.77';
const NET = 'scrapeflood';
const SCRAPERS = 24;
const PODS = 6;

/** One answer of `/metrics` (or a failure to get one). */
interface Scrape {
  readonly status: number;
  readonly body: string;
}

/** GET `path` on `port` through `agent`; resolves with the status and the whole body. */
function fetchText(port: number, path: string, agent: Agent): Promise<Scrape> {
  return new Promise((resolve, reject) => {
    const req = get({ host: '127.0.0.1', port, path, agent }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => (body += c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
      res.on('error', reject);
    });
    req.on('error', reject);
  });
}

/** The value of the series `line` (name plus labels, exactly) in an exposition; null when absent. */
function value(text: string, line: string): number | null {
  const esc = line.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
  const m = new RegExp(`^${esc} (\\S+)$`, 'm').exec(text);
  return m === null ? null : Number(m[1]);
}

/** The metric families of an exposition, in order (its `# TYPE` lines). */
function families(text: string): string[] {
  return [...text.matchAll(/^# TYPE (\S+) (counter|gauge|histogram)$/gm)].map((m) => m[1] as string);
}

/** Lines that are neither `# HELP`/`# TYPE` nor a sample `name{labels} value`. */
function badLines(text: string): string[] {
  return text
    .slice(0, -1)
    .split('\n')
    .filter((l) => !/^# (HELP|TYPE) [a-z_:][a-z0-9_:]* .+$/.test(l) && !/^[a-z_:][a-z0-9_:]*(\{[a-z_]+="[^"]*"(,[a-z_]+="[^"]*")*\})? -?[0-9.e+-]+$/.test(l) && l !== '');
}

describe('a /metrics flood against the real daemon', { skip }, () => {
  const dirs: string[] = [];
  let d: TestDaemon | undefined;
  const agents: Agent[] = [];
  after(async () => {
    for (const a of agents) a.destroy();
    await d?.stop();
    for (const x of dirs) rmSync(x, { recursive: true, force: true });
  });

  it('renders are shared and spaced, every scrape is a full and fresh exposition, and shim ADD/DEL during the flood are all served by the daemon with the exact files', { timeout: 120_000 }, async () => {
    const t = mkdtempSync(join(tmpdir(), 'ipw-scrapeflood-'));
    dirs.push(t);
    const binDir = join(t, 'bin');
    const runDir = join(t, 'run');
    mkdirSync(binDir);
    mkdirSync(runDir, { mode: 0o700 });
    chmodSync(runDir, 0o700);
    const socket = join(runDir, 'plugin.sock');
    execFileSync(process.execPath, [BUNDLE, 'install-cni', '--dest', binDir, '--socket', socket], { env: { PATH: '/usr/bin:/bin' }, stdio: 'pipe' });
    const shim = join(binDir, 'ipwarden');
    const dataDir = join(t, 'data');
    const conf = JSON.stringify({ cniVersion: '1.0.0', name: NET, ipam: { type: 'ipwarden', dataDir, ranges: [[{ subnet: `${SUBNET}.0/24` }]] } });

    d = await startTestDaemon({ socket, dataDir, cniConfDir: join(t, 'net.d'), logLevel: 'info', args: ['--metrics-address', '127.0.0.1:0', '--health-address', '127.0.0.1:0', '--interval', '1h', '--runtime-endpoint', 'unix:///nonexistent/cri.sock'] });
    const line = await d.waitForLog((l) => l.msg === 'metrics listening');
    const port = (a: unknown): number => Number(String(a).split(':').pop());
    const metricsPort = port(line['metricsAddress']);
    const healthPort = port(line['healthAddress']);
    await d.waitForLog((l) => l.msg === 'reconcile pass');

    const quiet = new Agent({ keepAlive: false });
    agents.push(quiet);
    const t0 = performance.now();
    const before = await fetchText(metricsPort, '/metrics', quiet);
    assert.equal(before.status, 200);
    const expected = families(before.body);
    assert.ok(expected.includes('ipwarden_metrics_renders_total') && expected.includes('ipwarden_cni_requests_total'), expected.join(' '));
    const r0 = value(before.body, 'ipwarden_metrics_renders_total') as number;

    // The flood: each client scrapes again as soon as its answer is complete, until told to stop
    // (once the pods are done and every client has had 3 answers: a condition, not a duration).
    let stop = false;
    const scrapes: Scrape[][] = Array.from({ length: SCRAPERS }, () => []);
    let enough!: () => void;
    const allHadThree = new Promise<void>((r) => (enough = r));
    const flood = scrapes.map(async (mine) => {
      const agent = new Agent({ keepAlive: true, maxSockets: 1 });
      agents.push(agent);
      while (!stop) {
        mine.push(await fetchText(metricsPort, '/metrics', agent));
        if (scrapes.every((s) => s.length >= 3)) enough();
      }
    });

    // Pods through the shim while the flood runs: ADD 6, then DEL the even ones.
    const results: string[] = [];
    for (let i = 0; i < PODS; i++) {
      const r = await runCniAsync(shim, { command: 'ADD', containerId: `flood-${i}`, ifname: 'eth0', stdin: conf });
      results.push(`ADD flood-${i} ${r.exitCode} ${JSON.stringify((r.json as { ips?: Array<{ address: string }> } | null)?.ips?.map((x) => x.address))}`);
    }
    for (let i = 0; i < PODS; i += 2) {
      const r = await runCniAsync(shim, { command: 'DEL', containerId: `flood-${i}`, ifname: 'eth0', stdin: conf });
      results.push(`DEL flood-${i} ${r.exitCode} ${r.stdout}`);
    }
    const probe = await fetchText(healthPort, '/healthz', quiet);
    // A scraper that fails ends the wait at once (its error fails the test) instead of hanging it.
    await Promise.race([allHadThree, Promise.all(flood).then(() => assert.fail('the flood ended before every client had 3 answers'))]);
    stop = true;
    await Promise.all(flood);
    const last = await fetchText(metricsPort, '/metrics', quiet);
    const w = performance.now() - t0;

    assert.deepEqual(results, [
      ...Array.from({ length: PODS }, (_, i) => `ADD flood-${i} 0 ["${SUBNET}.${i + 2}/24"]`),
      ...[0, 2, 4].map((i) => `DEL flood-${i} 0 `),
    ]);
    const dir = join(dataDir, NET);
    assert.deepEqual(
      readdirSync(dir).sort().map((f) => `${f}=${JSON.stringify(readFileSync(join(dir, f), 'utf8'))}`),
      [`${SUBNET}.3="flood-1\\r\\neth0"`, `${SUBNET}.5="flood-3\\r\\neth0"`, `${SUBNET}.7="flood-5\\r\\neth0"`, `last_reserved_ip.0="${SUBNET}.7"`, 'lock=""'],
    );
    assert.deepEqual([probe.status, probe.body], [200, 'ok\n']);

    // Served by the daemon, not by the shim's fallback, and counted in the scrape after them.
    // (Each line is written once the answer was: the last one may follow its answer by a moment.)
    await d.waitForLog((l) => l.msg === 'request served' && l['command'] === 'DEL' && l['containerId'] === 'flood-4');
    const served = d.logs.filter((l) => l.msg === 'request served' && String(l['containerId']).startsWith('flood-')).map((l) => `${String(l['command'])} ${String(l['containerId'])} ${String(l['result'])}`);
    assert.deepEqual(served, [...Array.from({ length: PODS }, (_, i) => `ADD flood-${i} ok`), ...[0, 2, 4].map((i) => `DEL flood-${i} ok`)]);
    assert.equal(last.status, 200);
    assert.equal(value(last.body, 'ipwarden_cni_requests_total{command="ADD",path="daemon",result="ok"}'), PODS);
    assert.equal(value(last.body, 'ipwarden_cni_requests_total{command="DEL",path="daemon",result="ok"}'), 3);
    assert.equal(value(last.body, 'ipwarden_cni_requests_total{command="ADD",path="standalone",result="ok"}'), null);

    // Every scrape: 200 and a full, well-formed exposition with the same families.
    const all = scrapes.flat();
    assert.ok(all.length >= 3 * SCRAPERS);
    assert.deepEqual(all.filter((s) => s.status !== 200).map((s) => `${s.status} ${s.body}`), []);
    assert.deepEqual(all.filter((s) => !s.body.endsWith('\n') || families(s.body).join(' ') !== expected.join(' ')).map((s) => families(s.body).join(' ')), []);
    assert.deepEqual(all.flatMap((s) => badLines(s.body)), []);

    // Fresh: each client's answers come from strictly newer renders.
    const seen = scrapes.map((mine) => mine.map((s) => value(s.body, 'ipwarden_metrics_renders_total') as number));
    assert.deepEqual(seen.filter((v) => v.some((x, i) => i > 0 && x <= (v[i - 1] as number))), []);

    // Shared and spaced: the renders r0 … r1 all began inside the W ms measured around them.
    const r1 = value(last.body, 'ipwarden_metrics_renders_total') as number;
    const renders = r1 - r0 + 1;
    assert.ok(renders <= Math.ceil(w / METRICS_RENDER_INTERVAL_MS) + 1, `${renders} renders in ${w.toFixed(0)} ms for ${all.length + 2} scrapes`);
    assert.ok(all.length + 2 > renders, `${all.length + 2} scrapes shared ${renders} renders`);
  });
});
