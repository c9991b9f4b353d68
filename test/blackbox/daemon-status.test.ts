/**
 * The daemon's status pages on a real daemon (the built bundle, `ipwarden daemon`) and a fake CRI
 * runtime on a unix socket: `/status.json` is exactly `ipwarden status --json` of the same node
 * (and the expected document, value by value), `/status` has the expected range sets, map rows
 * and cells, the FULL alarm on a full range set and none on a roomy /16; hostile text (a container
 * interface name, a CNI configuration's file name and network name) stays text — string checks, and in
 * headless Chromium no script of theirs runs; every method but GET and HEAD is 405 and changes
 * nothing; a flood of concurrent requests is answered from at most one report per 5 s.
 * Needs root (complete kernel evidence).
 */
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { copyFileSync, existsSync, mkdirSync, readdirSync, readFileSync, statSync, utimesSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { ROOT, tempDir } from '../helpers/cni.ts';
import { startTestDaemon, type TestDaemon } from '../helpers/daemon.ts';
import { startHostileCri, type HostileCri } from '../helpers/hostile-cri.ts';

const LIVE1 = 'a7'.repeat(32);
const LIVE2 = 'b8'.repeat(32);
const NR = 'c9'.repeat(32);
const NEWPOD = 'd0'.repeat(32);
const GONE = 'e1'.repeat(32);
/**
 * An interface name as a hostile writer of the data directory could leave it (a record's ifname
 * is any text without a line break; its container ID must match the CNI name pattern, else the
 * record is corrupt).
 */
const HOSTILE = `</title><script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">'&`;
/** A CNI configuration file name and network name (invalid: a config error naming both). */
const HOSTILE_FILE = `30-"><img src=x onerror="window.__pwned=3">.conf`;
const HOSTILE_NAME = '<script>window.__pwned=4</script>';
const CHROMIUM = '/usr/bin/chromium';

/** The HTML escaping of the page (src/cli/html.ts `escapeHtml`). */
const esc = (s: string): string => s.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);

const skip = process.getuid?.() !== 0 ? 'needs root (complete kernel evidence)' : false;

describe('the daemon serves /status and /status.json', { skip, timeout: 300_000 }, () => {
  const t = tempDir('ipwarden-daemon-status-');
  const data = join(t.dir, 'data');
  const confDir = join(t.dir, 'net.d');
  let cri: HostileCri;
  let daemon: TestDaemon | null = null;
  let base = '';

  before(async () => {
    mkdirSync(confDir);
    const old = (Date.now() - 2 * 3600_000) / 1000;
    const reserve = (net: string, ip: string, content: string, young = false): void => {
      mkdirSync(join(data, net), { recursive: true });
      writeFileSync(join(data, net, ip), content);
      if (!young) utimesSync(join(data, net, ip), old, old);
    };
    // statnet: 10.226.41.0/29, 5 allocatable addresses (.2–.6; .1 the gateway), all reserved: FULL.
    writeFileSync(join(confDir, '10-statnet.conf'), JSON.stringify({ cniVersion: '1.0.0', name: 'statnet', type: 'bridge', ipam: { type: 'ipwarden', dataDir: data, ranges: [[{ subnet: '10.226.41.0/29' }]] } }));
    reserve('statnet', '10.226.41.2', `${LIVE1}\r\neth0`);
    reserve('statnet', '10.226.41.3', `${LIVE2}\r\neth0`);
    reserve('statnet', '10.226.41.4', `${NR}\r\neth0`);
    reserve('statnet', '10.226.41.5', `${LIVE1}\r\neth1`);
    reserve('statnet', '10.226.41.6', `${NEWPOD}\r\neth0`, true);
    // bignet: a /16 (65533 allocatable), one live, one leaked (the hostile ifname), one corrupt,
    // and one reservation outside its ranges (the hostile ifname again).
    writeFileSync(join(confDir, '20-bignet.conf'), JSON.stringify({ cniVersion: '1.0.0', name: 'bignet', type: 'bridge', ipam: { type: 'host-local', dataDir: data, ranges: [[{ subnet: '10.227.0.0/16' }]] } }));
    reserve('bignet', '10.227.0.2', `${LIVE2}\r\neth1`);
    reserve('bignet', '10.227.3.7', `${GONE}\r\n${HOSTILE}`);
    reserve('bignet', '10.227.200.9', '');
    reserve('bignet', '10.228.0.5', `${GONE}\r\n${HOSTILE}`);
    writeFileSync(join(confDir, HOSTILE_FILE), JSON.stringify({ cniVersion: '1.0.0', name: HOSTILE_NAME, type: 'bridge', ipam: { type: 'ipwarden', dataDir: data, ranges: [[{ subnet: '10.226.42.0/29' }]] } }));

    cri = await startHostileCri({ path: join(t.dir, 'cri.sock'), sandboxes: [{ id: LIVE1 }, { id: LIVE2 }, { id: NR, state: 'notready' }] });
    // Default grace (5 m) and a long interval: no reservation here is released while the test runs
    // (the leak is in a roomy range set, confirmed only a grace period after it was first seen).
    daemon = await startTestDaemon({ dataDir: data, cniConfDir: confDir, logLevel: 'info', args: ['--runtime-endpoint', cri.endpoint, '--interval', '1h'] });
    const l = await daemon.waitForLog((x) => x.msg === 'metrics listening');
    base = `http://${String(l['metricsAddress'])}`;
  });

  after(async () => {
    await daemon?.stop();
    await cri?.close();
    t.cleanup();
  });

  /** A status document with the one value that depends on the whole host (other tests' namespaces) set to 0. */
  const normal = (text: string): Record<string, unknown> => {
    const j = JSON.parse(text) as { kernel: { addresses: unknown } };
    assert.equal(typeof j.kernel.addresses, 'number');
    j.kernel.addresses = 0;
    return j;
  };

  const expected = () => ({
    runtime: { endpoint: cri.endpoint, sandboxes: 3 },
    kernel: { complete: true, incomplete: null, addresses: 0 },
    verdicts: true,
    graceSeconds: 300,
    cniConfDir: confDir,
    dataDirs: [data],
    networks: [
      {
        name: 'bignet',
        config: { file: join(confDir, '20-bignet.conf'), ipamType: 'host-local' },
        dataDir: data,
        dir: join(data, 'bignet'),
        dirExists: true,
        skipped: null,
        rangeSets: [
          {
            index: 0,
            range: '10.227.0.1-10.227.255.254',
            ranges: [{ subnet: '10.227.0.0/16', rangeStart: '10.227.0.1', rangeEnd: '10.227.255.254', gateway: '10.227.0.1' }],
            capacity: 65533,
            reserved: 3,
            live: 1,
            grace: 0,
            leaked: 1,
            corrupt: 1,
            free: 65530,
          },
        ],
        outside: { reserved: 1, live: 0, grace: 0, leaked: 1, corrupt: 0 },
        total: { reserved: 4, live: 1, grace: 0, leaked: 2, corrupt: 1 },
      },
      {
        name: 'statnet',
        config: { file: join(confDir, '10-statnet.conf'), ipamType: 'ipwarden' },
        dataDir: data,
        dir: join(data, 'statnet'),
        dirExists: true,
        skipped: null,
        rangeSets: [
          {
            index: 0,
            range: '10.226.41.1-10.226.41.6',
            ranges: [{ subnet: '10.226.41.0/29', rangeStart: '10.226.41.1', rangeEnd: '10.226.41.6', gateway: '10.226.41.1' }],
            capacity: 5,
            reserved: 5,
            live: 4,
            grace: 1,
            leaked: 0,
            corrupt: 0,
            free: 0,
          },
        ],
        outside: { reserved: 0, live: 0, grace: 0, leaked: 0, corrupt: 0 },
        total: { reserved: 5, live: 4, grace: 1, leaked: 0, corrupt: 0 },
      },
    ],
    configErrors: [{ file: join(confDir, HOSTILE_FILE), error: `invalid ipwarden IPAM configuration: invalid characters found in network name (${HOSTILE_NAME})` }],
    poolNetworks: [],
  });

  let json = '';
  let html = '';

  it('/status.json is the expected document, and exactly what `ipwarden status --json` prints for the same node; /status is the page of the same report', async () => {
    // Asked together: both are answered from one report.
    const [j, h] = await Promise.all([fetch(`${base}/status.json`), fetch(`${base}/status`)]);
    assert.equal(j.status, 200);
    assert.equal(j.headers.get('content-type'), 'application/json; charset=utf-8');
    assert.equal(h.status, 200);
    assert.equal(h.headers.get('content-type'), 'text/html; charset=utf-8');
    assert.equal(h.headers.get('content-security-policy'), "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'");
    json = await j.text();
    html = await h.text();
    assert.deepEqual(normal(json), expected());
    // Not spawnSync: the fake runtime answers from this process's event loop.
    const cli = await promisify(execFile)(process.execPath, [join(ROOT, 'dist/ipwarden.cjs'), 'status', '--cni-conf-dir', confDir, '--runtime-endpoint', cri.endpoint, '--json'], { encoding: 'utf8', env: { PATH: '/usr/bin:/bin' } });
    assert.equal(cli.stderr, '');
    assert.deepEqual(normal(cli.stdout), normal(json));
    assert.equal(cli.stdout.endsWith('\n') && json.endsWith('\n'), true);
  });

  it('the page has each range set with its counts, the FULL alarm on statnet only, labelled map rows and one cell per address of the /29; the /16 in 1024 cells of 64', () => {
    const section = (net: string): string => {
      const m = new RegExp(`<section class="rangeset" id="rs-${net}-0"[\\s\\S]*?</section>`).exec(html);
      assert.ok(m !== null, `section rs-${net}-0`);
      return m[0];
    };
    const counts = (s: string): Record<string, string> => Object.fromEntries([...s.matchAll(/<dd data-count="(\w+)">([^<]*)<\/dd>/g)].map((m) => [m[1] as string, m[2] as string]));
    const stat = section('statnet');
    const big = section('bignet');
    assert.deepEqual(counts(stat), { capacity: '5', reserved: '5', live: '4', grace: '1', leaked: '0', corrupt: '0', free: '0' });
    assert.deepEqual(counts(big), { capacity: '65533', reserved: '3', live: '1', grace: '0', leaked: '1', corrupt: '1', free: '65530' });
    assert.match(stat, /<h3>range set 0: <code>10\.226\.41\.1-10\.226\.41\.6<\/code> <span class="badge">FULL<\/span><\/h3><p class="alarm" role="alert" data-alarm="full">FULL: no free address in range set 0 of statnet — /);
    assert.equal((html.match(/data-alarm="full"/g) ?? []).length, 1, 'one alarm: statnet');
    assert.doesNotMatch(big, /alarm|badge/);
    // statnet: one row labelled with its first address, one cell per address, a letter in each.
    const rows = [...stat.matchAll(/<div class="row"><span class="addr">([^<]*)<\/span>(.*?)<\/div>/g)];
    assert.deepEqual(rows.map((r) => r[1]), ['10.226.41.1']);
    const cells = [...(rows[0]?.[2] ?? '').matchAll(/<i class="cell" data-state="(\w+)" data-ip="([\d.]+)" title="([^"]*)">([^<]*)<\/i>/g)].map((c) => [c[2], c[1], c[4]]);
    assert.deepEqual(cells, [
      ['10.226.41.1', 'gateway', 'G'],
      ['10.226.41.2', 'live', 'L'],
      ['10.226.41.3', 'live', 'L'],
      ['10.226.41.4', 'live', 'L'],
      ['10.226.41.5', 'live', 'L'],
      ['10.226.41.6', 'grace', 'T'],
    ]);
    assert.match(stat, new RegExp(`data-ip="10\\.226\\.41\\.4" title="10\\.226\\.41\\.4 live: ${NR} eth0, age 2h0m"`));
    // bignet: 65534 addresses (the gateway included) in cells of 64, 64 labelled rows of 16.
    assert.match(big, /<div class="map" data-block-size="64" data-cells="1024">/);
    const bigRows = [...big.matchAll(/<div class="row"><span class="addr">([^<]*)<\/span>/g)].map((r) => r[1]);
    assert.equal(bigRows.length, 64);
    assert.deepEqual([bigRows[0], bigRows[1], bigRows[63]], ['10.227.0.1', '10.227.4.1', '10.227.252.1']);
    assert.deepEqual(
      Object.entries([...big.matchAll(/<i class="cell" data-state="(\w+)"/g)].reduce<Record<string, number>>((a, m) => ((a[m[1] as string] = (a[m[1] as string] ?? 0) + 1), a), {})).sort(),
      [['corrupt', 1], ['free', 1021], ['leaked', 1], ['live', 1]],
    );
  });

  it('hostile text from disk and from a configuration stays text: escaped in the page, exact in the JSON', () => {
    // The page's own script is its only one; no element of theirs.
    assert.equal((html.match(/<script>/g) ?? []).length, 1);
    assert.equal((html.match(/<img/g) ?? []).length, 0);
    for (const raw of [HOSTILE, HOSTILE_FILE, HOSTILE_NAME]) assert.equal(html.includes(raw), false, raw);
    // The reservation outside the ranges: its row in the table; the leak in range: its cell's title.
    assert.ok(html.includes(`<tr data-state="leaked"><td>10.228.0.5</td><td class="id">${GONE}</td><td>${esc(HOSTILE)}</td>`));
    assert.ok(html.includes(`10.227.3.7 leaked: ${GONE} ${esc(HOSTILE)}`), 'the leak in its cell title');
    assert.ok(html.includes(`<ul class="warn" id="config-errors"><li>${esc(join(confDir, HOSTILE_FILE))}: ${esc(`invalid ipwarden IPAM configuration: invalid characters found in network name (${HOSTILE_NAME})`)}</li></ul>`));
    const doc = JSON.parse(json) as { configErrors: Array<{ file: string }> };
    assert.equal(doc.configErrors[0]?.file, join(confDir, HOSTILE_FILE));
  });

  it('read-only: POST, PUT, DELETE, PATCH on /status and /status.json are 405 and change no file', async () => {
    const files = (): Record<string, string> => {
      const out: Record<string, string> = {};
      for (const net of readdirSync(data).sort()) {
        const d = join(data, net);
        if (!existsSync(d) || net.startsWith('.')) continue;
        for (const f of readdirSync(d).sort()) out[`${net}/${f}`] = readFileSync(join(d, f), 'latin1');
      }
      return out;
    };
    const beforeFiles = files();
    for (const path of ['/status', '/status.json']) {
      for (const method of ['POST', 'PUT', 'DELETE', 'PATCH']) {
        const r = await fetch(`${base}${path}`, { method, body: method === 'DELETE' ? null : '{"gc":true}' });
        assert.deepEqual([r.status, r.headers.get('allow'), await r.text()], [405, 'GET, HEAD', 'method not allowed\n'], `${method} ${path}`);
      }
    }
    assert.deepEqual(files(), beforeFiles);
    assert.equal(beforeFiles['statnet/10.226.41.6'], `${NEWPOD}\r\neth0`);
  });

  it('a flood of 24 concurrent requests is answered from at most one report per 5 s (ipwarden_status_renders_total), each the expected document', async () => {
    const renders = async (): Promise<number> => Number(/^ipwarden_status_renders_total (\d+)$/m.exec(await (await fetch(`${base}/metrics`)).text())?.[1]);
    const r0 = await renders();
    const t0 = performance.now();
    const bodies = await Promise.all(Array.from({ length: 24 }, async (_, i) => {
      const r = await fetch(`${base}${i % 3 === 0 ? '/status' : '/status.json'}`);
      assert.equal(r.status, 200);
      return [i % 3 === 0, await r.text()] as const;
    }));
    const elapsed = performance.now() - t0;
    const r1 = await renders();
    for (const [isPage, body] of bodies) {
      if (isPage) assert.match(body, /data-alarm="full"/);
      else assert.deepEqual(normal(body), expected());
    }
    assert.ok(r1 - r0 >= 1 && r1 - r0 <= Math.floor(elapsed / 5000) + 1, `${r1 - r0} reports in ${elapsed.toFixed(0)} ms`);
  });

  it('in headless Chromium the served page runs none of the hostile text, loads nothing else, and shows the alarm', { skip: existsSync(CHROMIUM) ? false : process.env['CI'] === 'true' ? false : `${CHROMIUM} not found` }, async () => {
    const { chromium } = await import('playwright-core');
    const browser = await chromium.launchPersistentContext(join(t.dir, 'profile'), {
      executablePath: CHROMIUM,
      args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
      viewport: { width: 1000, height: 900 },
    });
    try {
      const page = browser.pages()[0] ?? (await browser.newPage());
      const requests: string[] = [];
      const errors: string[] = [];
      page.on('request', (r) => requests.push(r.url()));
      page.on('pageerror', (e) => errors.push(e.message));
      await page.goto(`${base}/status`);
      assert.equal(await page.evaluate('typeof window.__pwned'), 'undefined');
      assert.equal(await page.locator('script').count(), 1);
      assert.equal(await page.locator('img').count(), 0);
      assert.deepEqual(requests, [`${base}/status`]);
      assert.deepEqual(errors, []);
      assert.ok(await page.locator('section.rangeset[data-network="statnet"] .alarm[data-alarm="full"]').isVisible());
      assert.equal(await page.textContent('section.network[data-network="bignet"] table.entries tbody tr td:nth-child(3)'), HOSTILE);
      const png = join(t.dir, 'status.png');
      await page.screenshot({ path: png, fullPage: true });
      if (process.env['IPWARDEN_KEEP_SCREENSHOT'] !== undefined) copyFileSync(png, process.env['IPWARDEN_KEEP_SCREENSHOT']);
      assert.ok(statSync(png).size > 20_000, `a real image: ${statSync(png).size} bytes`);
      assert.equal(await page.textContent('#config-errors li'), `${join(confDir, HOSTILE_FILE)}: invalid ipwarden IPAM configuration: invalid characters found in network name (${HOSTILE_NAME})`);
    } finally {
      await browser.close();
    }
  });
});
