/**
 * The daemon's status pages (src/daemon/status-pages.ts) and their routes on the metrics listener
 * (src/daemon/metrics.ts): reports shared and spaced by their gate on a fake clock (a flood costs
 * one report per interval), the JSON exactly `statusToJson` of the report, the page exactly the
 * renderer's, each rendered once per report; over HTTP (real listener on loopback): types and
 * headers, HEAD, 405 for every other method, 500 with the reason when a report fails, 404 without
 * status pages. The real daemon is tested in test/blackbox/daemon-status.test.ts.
 */
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync, utimesSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { renderStatusHtml } from '../../src/cli/html.ts';
import { DaemonMetrics, startMetricsServer } from '../../src/daemon/metrics.ts';
import { FakeGateClock as FakeClock, settle } from '../helpers/fake-gate-clock.ts';
import { DaemonStatusPages, STATUS_PAGE_CSP, STATUS_RENDER_INTERVAL_MS } from '../../src/daemon/status-pages.ts';
import { NOTHING_IN_USE } from '../../src/reconcile/evidence.ts';
import type { ReconcileDeps } from '../../src/reconcile/options.ts';
import type { SandboxInfo } from '../../src/reconcile/sandboxes.ts';
import { collectStatus, statusToJson, type StatusReport } from '../../src/reconcile/status.ts';

const SNAP = Date.UTC(2025, 0, 1);


let root: string;
let report: StatusReport;

before(async () => {
  root = mkdtempSync(join(tmpdir(), 'ipwarden-status-pages-'));
  const confDir = join(root, 'net.d');
  const dataDir = join(root, 'data');
  mkdirSync(confDir);
  mkdirSync(join(dataDir, 'pagenet'), { recursive: true });
  writeFileSync(join(confDir, '10-pagenet.conf'), JSON.stringify({ cniVersion: '1.0.0', name: 'pagenet', type: 'bridge', ipam: { type: 'ipwarden', dataDir, ranges: [[{ subnet: '10.226.44.0/30' }]] } }));
  // The one allocatable address (.2; .1 is the gateway) held by a live sandbox: full.
  writeFileSync(join(dataDir, 'pagenet', '10.226.44.2'), 'live1\r\neth0');
  const t = (SNAP - 3_600_000) / 1000;
  utimesSync(join(dataDir, 'pagenet', '10.226.44.2'), t, t);
  const deps: ReconcileDeps = {
    env: { CONTAINER_RUNTIME_ENDPOINT: 'unix:///run/fake-cri.sock' },
    now: () => SNAP,
    evidence: () => NOTHING_IN_USE,
    sandboxSource: (endpoint) => ({ endpoint, list: async (): Promise<SandboxInfo[]> => [{ id: 'live1', state: 'ready' }] }),
  };
  report = await collectStatus({ cniConfDir: confDir, graceSeconds: 300 }, deps);
});

after(() => rmSync(root, { recursive: true, force: true }));

describe('DaemonStatusPages', () => {
  it('every request before a report begins shares it; a request during a report gets the next, one interval later; JSON and page rendered once per report', async () => {
    const clock = new FakeClock();
    const m = new DaemonMetrics();
    let collects = 0;
    let htmlRenders = 0;
    const finish: Array<() => void> = [];
    const pages = new DaemonStatusPages({
      collect: () =>
        new Promise<StatusReport>((resolve) => {
          collects++;
          finish.push(() => resolve(report));
        }),
      renderHtml: (r, o) => {
        htmlRenders++;
        return renderStatusHtml(r, o);
      },
      registry: m.registry,
      now: () => SNAP + 5_000,
      gateClock: clock,
    });
    // A flood: 40 requests (20 pages, 20 documents) before the first report begins.
    const first = Array.from({ length: 40 }, (_, i) => pages.get(i % 2 === 0 ? 'html' : 'json'));
    await settle();
    assert.equal(collects, 1);
    // Requests during that report wait for the next one.
    const second = Array.from({ length: 10 }, () => pages.get('json'));
    (finish.shift() as () => void)();
    const got = await Promise.all(first);
    const json = `${JSON.stringify(statusToJson(report))}\n`;
    const html = renderStatusHtml(report, { generatedAtMs: SNAP + 5_000 });
    for (let i = 0; i < got.length; i++) {
      const p = got[i] as (typeof got)[number];
      assert.equal(p.body.toString('utf8'), i % 2 === 0 ? html : json);
      assert.equal(p, got[i % 2] as (typeof got)[number], 'the same answer object: rendered once');
    }
    assert.equal(htmlRenders, 1);
    assert.deepEqual(got[0]?.headers, { 'Cache-Control': 'no-store', 'X-Content-Type-Options': 'nosniff', 'Content-Security-Policy': STATUS_PAGE_CSP });
    assert.equal(got[0]?.contentType, 'text/html; charset=utf-8');
    assert.deepEqual(got[1]?.headers, { 'Cache-Control': 'no-store', 'X-Content-Type-Options': 'nosniff' });
    assert.equal(got[1]?.contentType, 'application/json; charset=utf-8');
    // The next report begins only one interval after the first began.
    await clock.advanceTo(STATUS_RENDER_INTERVAL_MS - 1);
    assert.equal(collects, 1);
    await clock.advanceTo(STATUS_RENDER_INTERVAL_MS);
    assert.equal(collects, 2);
    (finish.shift() as () => void)();
    for (const p of await Promise.all(second)) assert.equal(p.body.toString('utf8'), json);
    assert.equal(pages.reports, 2);
    assert.match(await m.text(), /^ipwarden_status_renders_total 2$/m);
    assert.equal(STATUS_RENDER_INTERVAL_MS, 5000);
  });

  it('a report that fails rejects every request that shared it; the next request makes a new one; without a renderer the page fails and the JSON works', async () => {
    const clock = new FakeClock();
    let fail = true;
    const pages = new DaemonStatusPages({
      collect: async () => {
        if (fail) throw new Error('network pagenet: lock held for 5 s');
        return report;
      },
      renderHtml: null,
      registry: new DaemonMetrics().registry,
      gateClock: clock,
    });
    const a = assert.rejects(pages.get('json'), /^Error: network pagenet: lock held for 5 s$/);
    const b = assert.rejects(pages.get('html'), /^Error: network pagenet: lock held for 5 s$/);
    await Promise.all([a, b]);
    assert.equal(pages.reports, 1);
    fail = false;
    const c = pages.get('json');
    const d = assert.rejects(pages.get('html'), /^Error: this daemon was started without the status page renderer$/);
    await clock.advanceTo(STATUS_RENDER_INTERVAL_MS);
    assert.equal((await c).body.toString('utf8'), `${JSON.stringify(statusToJson(report))}\n`);
    await d;
    assert.equal(pages.reports, 2);
  });
});

describe('the status routes of the metrics listener', () => {
  const health = { live: () => ({ ok: true, why: '' }), ready: () => ({ ok: true, why: '' }) };

  it('GET and HEAD answer the page and the document with their types and headers; POST, PUT, DELETE, PATCH are 405; a failed report is 500 with its reason', async () => {
    const m = new DaemonMetrics();
    let fail = false;
    const pages = new DaemonStatusPages({
      collect: async () => {
        if (fail) throw new Error('cannot read the CNI configurations in /etc/cni/net.d: EACCES');
        return report;
      },
      renderHtml: renderStatusHtml,
      registry: m.registry,
      now: () => SNAP,
      intervalMs: 0,
    });
    const s = await startMetricsServer({ host: '127.0.0.1', port: 0 }, m, health, pages);
    try {
      const base = `http://127.0.0.1:${s.address.port}`;
      const page = await fetch(`${base}/status`);
      assert.equal(page.status, 200);
      assert.equal(page.headers.get('content-type'), 'text/html; charset=utf-8');
      assert.equal(page.headers.get('content-security-policy'), STATUS_PAGE_CSP);
      assert.equal(page.headers.get('cache-control'), 'no-store');
      assert.equal(page.headers.get('x-content-type-options'), 'nosniff');
      const html = await page.text();
      assert.equal(html, renderStatusHtml(report, { generatedAtMs: SNAP }));
      assert.match(html, /<p class="alarm" role="alert" data-alarm="full">FULL: no free address in range set 0 of pagenet/);
      const doc = await fetch(`${base}/status.json?pretty=no`);
      assert.equal(doc.status, 200);
      assert.equal(doc.headers.get('content-type'), 'application/json; charset=utf-8');
      assert.equal(await doc.text(), `${JSON.stringify(statusToJson(report))}\n`);
      const head = await fetch(`${base}/status.json`, { method: 'HEAD' });
      assert.equal(head.status, 200);
      assert.equal(head.headers.get('content-length'), String(Buffer.byteLength(`${JSON.stringify(statusToJson(report))}\n`)));
      assert.equal(await head.text(), '');
      for (const path of ['/status', '/status.json']) {
        for (const method of ['POST', 'PUT', 'DELETE', 'PATCH']) {
          const r = await fetch(`${base}${path}`, { method, body: method === 'DELETE' ? null : 'x' });
          assert.deepEqual([r.status, r.headers.get('allow'), await r.text()], [405, 'GET, HEAD', 'method not allowed\n'], `${method} ${path}`);
        }
      }
      const nope = await fetch(`${base}/status.html`);
      assert.deepEqual([nope.status, await nope.text()], [404, 'not found: try /metrics, /healthz, /readyz, /status, /status.json\n']);
      fail = true;
      const bad = await fetch(`${base}/status.json`);
      assert.deepEqual([bad.status, await bad.text()], [500, 'cannot read the CNI configurations in /etc/cni/net.d: EACCES\n']);
    } finally {
      await s.close();
    }
  });

  it('a listener without status pages answers 404 for them, as for any unknown path', async () => {
    const s = await startMetricsServer({ host: '127.0.0.1', port: 0 }, new DaemonMetrics(), health);
    try {
      for (const path of ['/status', '/status.json']) {
        const r = await fetch(`http://127.0.0.1:${s.address.port}${path}`);
        assert.deepEqual([r.status, await r.text()], [404, 'not found: try /metrics, /healthz, /readyz\n']);
      }
    } finally {
      await s.close();
    }
  });
});
