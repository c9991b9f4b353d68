/**
 * The page of `ipwarden pool status --html` (src/cli/html.ts `renderPoolStatusHtml`) in a real
 * headless Chromium (Debian's `chromium`, driven with playwright-core), as the node page is in
 * status-html.test.ts: it requests nothing but itself and logs no error; its bar legend is shown
 * and each swatch is drawn exactly as the bar segments of its kind (the same computed background),
 * and the kinds differ without colour (solid, diagonal stripes, vertical stripes, none); a block's
 * bar has one segment of each kind, with its numbers in the hover text; a full-page screenshot is
 * a PNG of the page's size. Without /usr/bin/chromium: fails when CI=true, else skips with the reason.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { copyFileSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import type { BrowserContext, Page } from 'playwright-core';
import { renderPoolStatusHtml } from '../../src/cli/html.ts';
import type { PoolStatus } from '../../src/pool/status.ts';

const CHROMIUM = '/usr/bin/chromium';

/** A pool with two IPv4 blocks (one pending release, one owned, with borrowed and reserved addresses) and a /112 range set. */
const STATUS: PoolStatus = {
  version: 1,
  pool: 'browser-pool',
  blockSize: 28,
  blockSize6: 122,
  rangeSets: [
    { index: 0, ranges: '10.237.3.1-10.237.3.30', size: '29', used: 9, reserved: 3, unreadable: 0, pendingRelease: 0, free: '17', blocksClaimed: 2 },
    { index: 1, ranges: 'fd37::1-fd37::ffff', size: '65534', used: 0, reserved: 0, unreadable: 0, pendingRelease: 0, free: '65534', blocksClaimed: 0 },
  ],
  nodes: [
    { node: 'node-a', blocks: 1, capacity: 15, used: 6, borrowed: 0, reserved: 3, alive: true, heartbeat: 'yes', source: null },
    { node: 'node-b', blocks: 1, capacity: 14, used: 2, borrowed: 0, reserved: 0, alive: false, heartbeat: 'expired', source: null },
    { node: 'node-c', blocks: 0, capacity: 0, used: 1, borrowed: 1, reserved: 0, alive: true, heartbeat: 'yes', source: null },
  ],
  blocks: [
    { cidr: '10.237.3.0/28', rangeSet: 0, node: 'node-b', state: 'pendingRelease', capacity: 14, used: 3, borrowed: 1, reserved: 0 },
    { cidr: '10.237.3.16/28', rangeSet: 0, node: 'node-a', state: 'owned', capacity: 15, used: 6, borrowed: 0, reserved: 3 },
  ],
  corrupt: [],
  overlaps: [],
};

const missing = existsSync(CHROMIUM) ? null : `${CHROMIUM} not found (apt-get install -y chromium)`;
if (missing !== null && process.env['CI'] === 'true') {
  describe('pool status --html in headless Chromium', () => {
    it('needs chromium in CI', () => assert.fail(missing));
  });
} else {
  describe('pool status --html in headless Chromium', { skip: missing ?? false }, () => {
    let root = '';
    let browser: BrowserContext | null = null;
    let page: Page;
    let pageFile = '';
    const requests: string[] = [];
    const errors: string[] = [];

    before(async () => {
      root = mkdtempSync(join(tmpdir(), 'ipwarden-pool-html-'));
      pageFile = join(root, 'pool.html');
      writeFileSync(pageFile, renderPoolStatusHtml(STATUS, { generatedAtMs: Date.UTC(2026, 11, 6, 3, 0, 0), source: 'etcd http://127.0.0.1:2379 /ipwarden' }));
      const { chromium } = await import('playwright-core');
      browser = await chromium.launchPersistentContext(join(root, 'profile'), {
        executablePath: CHROMIUM,
        args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
        viewport: { width: 1000, height: 700 },
      });
      page = browser.pages()[0] ?? (await browser.newPage());
      page.on('request', (r) => requests.push(r.url()));
      page.on('console', (m) => {
        if (m.type() === 'error') errors.push(m.text());
      });
      page.on('pageerror', (e) => errors.push(e.message));
      await page.goto(pathToFileURL(pageFile).href);
    });

    after(async () => {
      await browser?.close();
      if (root !== '') rmSync(root, { recursive: true, force: true });
    });

    it('requests nothing but the page itself and logs no error', () => {
      assert.deepEqual(requests, [pathToFileURL(pageFile).href]);
      assert.deepEqual(errors, []);
    });

    it('the bar legend is shown, its swatches drawn exactly as the bar segments of their kind, the kinds told apart without colour', async () => {
      assert.equal(await page.isVisible('#bar-legend'), true);
      assert.deepEqual(await page.$$eval('#bar-legend span', (xs) => xs.map((x) => x.textContent)), [
        "used by the block's node (solid)",
        'borrowed by another node (diagonal stripes)',
        'reserve for offline allocation (vertical stripes)',
        'free',
      ]);
      const look = async (sel: string): Promise<{ color: string; image: string }> =>
        (await page.evaluate(`(() => { const s = getComputedStyle(document.querySelector(${JSON.stringify(sel)})); return { color: s.backgroundColor, image: s.backgroundImage }; })()`)) as { color: string; image: string };
      const block = 'tr[data-block="10.237.3.16/28"] .bar';
      for (const kind of ['own', 'borrowed', 'reserved']) assert.deepEqual(await look(`#bar-legend i.${kind}`), await look(`${block} i.${kind}`), kind);
      const own = await look('#bar-legend i.own');
      const borrowed = await look('#bar-legend i.borrowed');
      const reserved = await look('#bar-legend i.reserved');
      assert.equal(own.image, 'none');
      assert.match(borrowed.image, /^repeating-linear-gradient\(45deg, /);
      assert.match(reserved.image, /^repeating-linear-gradient\(90deg, /);
    });

    it('a block\'s bar: one segment per kind, widths in proportion, its numbers in the hover text', async () => {
      assert.equal(await page.getAttribute('tr[data-block="10.237.3.0/28"] .bar', 'title'), '10.237.3.0/28: 3 of 14 used (1 borrowed), 0 reserved, 11 free');
      const widths = await page.$eval('tr[data-block="10.237.3.16/28"] .bar', (bar) => {
        const total = bar.getBoundingClientRect().width;
        return [...bar.querySelectorAll('i')].map((i) => [i.className, Math.round((1000 * i.getBoundingClientRect().width) / total) / 1000]);
      });
      // 6 of 15 used (none borrowed), 3 reserved: 40 %, 0 %, 20 % (to a pixel of the bar's width).
      assert.deepEqual(
        widths.map(([k]) => k),
        ['own', 'borrowed', 'reserved'],
      );
      const [ownW, borrowedW, reservedW] = widths.map(([, w]) => w as number);
      assert.ok(Math.abs((ownW as number) - 0.4) < 0.02 && borrowedW === 0 && Math.abs((reservedW as number) - 0.2) < 0.02, JSON.stringify(widths));
    });

    it('a full-page screenshot is a PNG of the page\'s size', async () => {
      const png = join(root, 'pool.png');
      await page.screenshot({ path: png, fullPage: true });
      if (process.env['IPWARDEN_KEEP_SCREENSHOT'] !== undefined) copyFileSync(png, process.env['IPWARDEN_KEEP_SCREENSHOT']);
      const b = readFileSync(png);
      assert.deepEqual([...b.subarray(0, 8)], [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);
      const height = (await page.evaluate('document.documentElement.scrollHeight')) as number;
      assert.deepEqual([b.readUInt32BE(16), b.readUInt32BE(20)], [1000, height]);
    });
  });
}
