/**
 * The `ipwarden status --html` page in a real headless Chromium (Debian's `chromium`, driven with
 * playwright-core): load the file:// page, read the counts from the DOM and compare them with
 * `status --json` of the same directories, count the cells by state, check the hover text, that
 * nothing external is requested and that hostile names stay text, and take a screenshot.
 * Without /usr/bin/chromium: fails when CI=true, else skips with the reason.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, rmSync, statSync, utimesSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import type { BrowserContext, Page } from 'playwright-core';
import type { CliContext } from '../../src/cli/context.ts';
import { runMain } from '../../src/cli/main.ts';
import type { SandboxInfo } from '../../src/reconcile/sandboxes.ts';

const CHROMIUM = '/usr/bin/chromium';
const SNAP = Date.UTC(2025, 0, 1);
const ENDPOINT = 'unix:///run/fake-cri.sock';
const HOUR = 3600;

const missing = existsSync(CHROMIUM) ? null : `${CHROMIUM} not found (apt-get install -y chromium)`;
if (missing !== null && process.env['CI'] === 'true') {
  describe('status --html in headless Chromium', () => {
    it('needs chromium in CI', () => assert.fail(missing));
  });
} else {
  describe('status --html in headless Chromium', { skip: missing ?? false }, () => {
    let root: string;
    let browser: BrowserContext;
    let page: Page;
    let json: StatusJsonLite;
    let pageFile: string;
    const requests: string[] = [];
    const consoleErrors: string[] = [];

    before(async () => {
      root = mkdtempSync(join(tmpdir(), 'ipwarden-html-'));
      const confDir = join(root, 'net.d');
      const dataDir = join(root, 'networks');
      mkdirSync(confDir);
      const reserve = (net: string, ip: string, content: string, age: number): void => {
        mkdirSync(join(dataDir, net), { recursive: true });
        writeFileSync(join(dataDir, net, ip), content);
        const t = (SNAP - age * 1000) / 1000;
        utimesSync(join(dataDir, net, ip), t, t);
      };
      // BR-20: cbr0 10.42.1.0/28, 13 of 13, live l5 l9 l12.
      writeFileSync(
        join(confDir, '10-cbr0.conflist'),
        JSON.stringify({ cniVersion: '1.0.0', name: 'cbr0', plugins: [{ type: 'bridge', ipam: { type: 'host-local', ranges: [[{ subnet: '10.42.1.0/28' }]] } }] }),
      );
      for (let i = 2; i <= 14; i++) reserve('cbr0', `10.42.1.${i}`, `${i === 5 || i === 9 || i === 12 ? 'l' : 'd'}${i}\r\neth0`, 2 * HOUR);
      // big: a /20 (4094 addresses) drawn as blocks; one in grace, one corrupt, one live.
      writeFileSync(
        join(confDir, '20-big.conf'),
        JSON.stringify({ cniVersion: '1.0.0', name: 'big', type: 'bridge', ipam: { type: 'ipwarden', ranges: [[{ subnet: '10.64.0.0/20' }]] } }),
      );
      reserve('big', '10.64.0.2', 'l5\r\neth1', HOUR);
      reserve('big', '10.64.8.9', 'newpod\r\neth0', 30);
      reserve('big', '10.64.15.200', '', HOUR);
      // a directory without configuration, with a hostile-looking (but valid) network name
      reserve('x.-_y', '10.9.9.9', 'orphan\r\neth0', HOUR);

      const run = async (argv: string[]): Promise<string> => {
        let out = '';
        const ctx: CliContext = {
          stdout: (t) => void (out += t),
          stderr: () => {},
          env: { CONTAINER_RUNTIME_ENDPOINT: ENDPOINT },
          now: () => SNAP,
          sandboxSource: (endpoint) => ({ endpoint, list: async (): Promise<SandboxInfo[]> => ['l5', 'l9', 'l12'].map((id) => ({ id, state: 'ready' })) }),
        };
        assert.equal(await runMain(argv, ctx), 0);
        return out;
      };
      pageFile = join(root, 'status.html');
      json = JSON.parse(await run(['status', '--cni-conf-dir', confDir, '--data-dir', dataDir, '--json', '--html', pageFile])) as StatusJsonLite;

      const { chromium } = await import('playwright-core');
      // A fresh user-data dir per run (the persistent-context form is how playwright takes one).
      browser = await chromium.launchPersistentContext(join(root, 'profile'), {
        executablePath: CHROMIUM,
        args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
        viewport: { width: 1000, height: 900 },
      });
      page = browser.pages()[0] ?? (await browser.newPage());
      page.on('request', (r) => requests.push(r.url()));
      page.on('console', (m) => {
        if (m.type() === 'error') consoleErrors.push(m.text());
      });
      page.on('pageerror', (e) => consoleErrors.push(e.message));
      await page.goto(pathToFileURL(pageFile).href);
    });

    after(async () => {
      await browser?.close();
      rmSync(root, { recursive: true, force: true });
    });

    it('requests nothing but the page itself and runs its script without errors', () => {
      assert.deepEqual(requests, [pathToFileURL(pageFile).href]);
      assert.deepEqual(consoleErrors, []);
    });

    it('the counts in the DOM equal status --json, range set by range set', async () => {
      const keys = ['capacity', 'reserved', 'live', 'grace', 'leaked', 'corrupt', 'free'] as const;
      let checked = 0;
      for (const n of json.networks) {
        for (const s of n.rangeSets) {
          const dom = await page.$eval(
            `section.rangeset[data-network="${n.name}"][data-range-set="${s.index}"]`,
            (el, ks) => Object.fromEntries(ks.map((k) => [k, el.querySelector(`[data-count="${k}"]`)?.textContent ?? null])),
            [...keys],
          );
          assert.deepEqual(dom, Object.fromEntries(keys.map((k) => [k, String(s[k])])), `${n.name} set ${s.index}`);
          checked++;
        }
      }
      assert.equal(checked, 2);
      const totals = await page.$eval('#totals', (el) =>
        Object.fromEntries([...el.querySelectorAll('[data-count]')].map((d) => [d.getAttribute('data-count'), d.textContent])),
      );
      const sum = (k: 'reserved' | 'live' | 'grace' | 'leaked' | 'corrupt'): string => String(json.networks.reduce((a, n) => a + (n.total[k] ?? 0), 0));
      assert.deepEqual(totals, { reserved: sum('reserved'), live: sum('live'), grace: sum('grace'), leaked: sum('leaked'), corrupt: sum('corrupt') });
      assert.deepEqual(totals, { reserved: '17', live: '4', grace: '1', leaked: '11', corrupt: '1' });
    });

    it('BR-20 map: one cell per address, 1 gateway, 3 live, 10 leaked, 0 free; owners on hover', async () => {
      const states = await cellStates(page, 'cbr0', 0);
      assert.deepEqual(states, { gateway: 1, live: 3, leaked: 10 });
      assert.equal(await page.getAttribute('section.rangeset[data-network="cbr0"] .map', 'data-block-size'), '1');
      assert.equal(await page.getAttribute('.cell[data-ip="10.42.1.5"]', 'title'), '10.42.1.5 live: l5 eth0, age 2h0m');
      assert.equal(await page.getAttribute('.cell[data-ip="10.42.1.2"]', 'title'), '10.42.1.2 leaked: d2 eth0, age 2h0m');
      await page.hover('.cell[data-ip="10.42.1.9"]');
      assert.equal(await page.textContent('#hover'), '10.42.1.9 live: l9 eth0, age 2h0m');
    });

    it('a /20 is drawn as 1024 blocks of 4 addresses, each showing its worst state', async () => {
      assert.equal(await page.getAttribute('section.rangeset[data-network="big"] .map', 'data-block-size'), '4');
      // blocks: .1-.4 has the gateway and a live one (live is worse), .8.9 grace, .15.200 corrupt
      assert.deepEqual(await cellStates(page, 'big', 0), { live: 1, grace: 1, corrupt: 1, free: 1021 });
      const title = await page.getAttribute('section.rangeset[data-network="big"] .cell[data-state="corrupt"]', 'title');
      assert.equal(title, '10.64.15.197 - 10.64.15.200 (4 addresses): 1 corrupt\n10.64.15.200 corrupt: corrupt record');
    });

    it('a full range set shows a visible alarm (cbr0), a roomy one none (big); states read without colour: letters in cells and legend', async () => {
      assert.equal(await page.locator('section.rangeset[data-network="cbr0"] .alarm[data-alarm="full"]').count(), 1);
      assert.ok(await page.locator('section.rangeset[data-network="cbr0"] .alarm').isVisible());
      assert.equal(await page.locator('section.rangeset[data-network="big"] .alarm').count(), 0);
      assert.equal(await page.textContent('.cell[data-ip="10.42.1.5"]'), 'L');
      assert.equal(await page.textContent('.cell[data-ip="10.42.1.2"]'), 'X');
      assert.equal(await page.textContent('.legend button[data-state="corrupt"]'), '!corrupt');
      // The /20's 1024 cells in 64 rows of 16, each labelled with its first address.
      const labels = await page.locator('section.rangeset[data-network="big"] .map .addr').allTextContents();
      assert.equal(labels.length, 64);
      assert.deepEqual([labels[0], labels[1], labels[63]], ['10.64.0.1', '10.64.0.65', '10.64.15.193']);
    });

    it('the directory-only network is listed with its reservations, its name as text', async () => {
      assert.equal(await page.textContent('section.network[data-network="x.-_y"] h2'), 'x.-_y');
      assert.equal(await page.textContent('section.network[data-network="x.-_y"] table.entries tbody tr td.id'), 'orphan');
    });

    it('the legend focuses one state; a screenshot of the page is a real image', async () => {
      const png = join(root, 'status.png');
      await page.screenshot({ path: png, fullPage: true });
      const size = statSync(png).size;
      if (process.env['IPWARDEN_KEEP_SCREENSHOT'] !== undefined) copyFileSync(png, process.env['IPWARDEN_KEEP_SCREENSHOT']);
      assert.ok(size > 20_000, `screenshot is ${size} bytes`);
      await page.click('.legend button[data-state="leaked"]');
      assert.equal(await page.getAttribute('body', 'data-focus'), 'leaked');
      assert.equal(await page.evaluate(`getComputedStyle(document.querySelector('.cell[data-ip="10.42.1.5"]')).opacity`), '0.15');
      assert.equal(await page.evaluate(`getComputedStyle(document.querySelector('.cell[data-ip="10.42.1.2"]')).opacity`), '1');
    });
  });
}

interface StatusJsonLite {
  networks: Array<{
    name: string;
    rangeSets: Array<{ index: number; capacity: number; reserved: number; live: number; grace: number; leaked: number; corrupt: number; free: number }>;
    total: { reserved: number; live: number | null; grace: number | null; leaked: number | null; corrupt: number };
  }>;
}

async function cellStates(page: Page, network: string, set: number): Promise<Record<string, number>> {
  return page.$eval(`section.rangeset[data-network="${network}"][data-range-set="${set}"]`, (el) => {
    const out: Record<string, number> = {};
    for (const c of el.querySelectorAll('.cell')) {
      const s = c.getAttribute('data-state') ?? '?';
      out[s] = (out[s] ?? 0) + 1;
    }
    return out;
  });
}
