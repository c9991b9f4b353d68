/**
 * The page of `ipwarden pool status --html` (src/cli/html.ts `renderPoolStatusHtml`) for a fixed
 * status value, exactly; hostile strings (as a corrupt or malicious etcd could hold them) stay
 * text; the verb's flag rules; and the page file is written atomically, never through a symlink.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { lstatSync, mkdtempSync, readFileSync, readdirSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { isAppError } from '../../src/common/errors.ts';
import { renderPoolStatusHtml } from '../../src/cli/html.ts';
import { runStatus, writePage } from '../../src/cli/pool.ts';
import type { CliContext } from '../../src/cli/context.ts';
import type { PoolStatus } from '../../src/pool/status.ts';

const STATUS: PoolStatus = {
  version: 1,
  pool: 'net1-pool',
  blockSize: 28,
  blockSize6: 122,
  rangeSets: [
    { index: 0, ranges: '10.84.0.1-10.84.0.30', size: '29', used: 4, reserved: 2, unreadable: 0, pendingRelease: 0, free: '23', blocksClaimed: 2 },
    { index: 1, ranges: 'fd84::1-fd84::ffff', size: '65534', used: 0, reserved: 0, unreadable: 0, pendingRelease: 0, free: '65534', blocksClaimed: 0 },
  ],
  nodes: [
    { node: 'node-a', blocks: 1, capacity: 15, used: 2, borrowed: 0, reserved: 2, alive: true, heartbeat: 'yes', source: 'requests' },
    { node: 'node-b', blocks: 1, capacity: 14, used: 1, borrowed: 0, reserved: 0, alive: false, heartbeat: 'expired', source: null },
    { node: 'node-c', blocks: 0, capacity: 0, used: 1, borrowed: 1, reserved: 0, alive: false, heartbeat: 'never', source: null },
  ],
  blocks: [
    { cidr: '10.84.0.0/28', rangeSet: 0, node: 'node-b', state: 'pendingRelease', capacity: 14, used: 2, borrowed: 1, reserved: 0 },
    { cidr: '10.84.0.16/28', rangeSet: 0, node: 'node-a', state: 'owned', capacity: 15, used: 2, borrowed: 0, reserved: 2 },
  ],
  corrupt: [],
  overlaps: [],
};
const AT = Date.UTC(2026, 0, 2, 3, 4, 5);

const BODY =
  '<body><h1>ipwarden pool <code>net1-pool</code></h1>' +
  '<p class="meta">generated 2026-01-02T03:04:05.000Z · etcd http://127.0.0.1:2379 /ipwarden · blocks /28 (IPv4), /122 (IPv6)</p>' +
  '<section id="rangesets"><h2>range sets</h2>' +
  '<p class="bar-legend" id="bar-legend"><span><i class="own"></i>used by the block\'s node (solid)</span><span><i class="borrowed"></i>borrowed by another node (diagonal stripes)</span><span><i class="reserved"></i>reserve for offline allocation (vertical stripes)</span><span><i class="free"></i>free</span></p>' +
  '<section class="rangeset" id="set-0" data-range-set="0"><h3>range set 0: <code>10.84.0.1-10.84.0.30</code></h3>' +
  '<dl class="counts"><div class="k-size"><dt>size</dt><dd data-count="size">29</dd></div><div class="k-used"><dt>used</dt><dd data-count="used">4</dd></div>' +
  '<div class="k-reserved"><dt>reserved</dt><dd data-count="reserved">2</dd></div><div class="k-free"><dt>free</dt><dd data-count="free">23</dd></div><div class="k-blocks"><dt>blocks</dt><dd data-count="blocks">2</dd></div></dl>' +
  '<table class="blocks"><thead><tr><th>block</th><th>node</th><th>state</th><th>use</th><th>used</th><th>borrowed</th><th>reserved</th></tr></thead><tbody>' +
  '<tr data-block="10.84.0.0/28" data-node="node-b" data-state="pendingRelease"><td><code>10.84.0.0/28</code></td><td>node-b</td><td class="state">pendingRelease</td>' +
  '<td><span class="bar" title="10.84.0.0/28: 2 of 14 used (1 borrowed), 0 reserved, 12 free"><i class="own" style="width:7.14%"></i><i class="borrowed" style="width:7.14%"></i><i class="reserved" style="width:0.00%"></i></span></td>' +
  '<td class="n">2/14</td><td class="n">1</td><td class="n">0</td></tr>' +
  '<tr data-block="10.84.0.16/28" data-node="node-a" data-state="owned"><td><code>10.84.0.16/28</code></td><td>node-a</td><td class="state">owned</td>' +
  '<td><span class="bar" title="10.84.0.16/28: 2 of 15 used (0 borrowed), 2 reserved, 11 free"><i class="own" style="width:13.33%"></i><i class="borrowed" style="width:0.00%"></i><i class="reserved" style="width:13.33%"></i></span></td>' +
  '<td class="n">2/15</td><td class="n">0</td><td class="n">2</td></tr></tbody></table></section>' +
  '<section class="rangeset" id="set-1" data-range-set="1"><h3>range set 1: <code>fd84::1-fd84::ffff</code></h3>' +
  '<dl class="counts"><div class="k-size"><dt>size</dt><dd data-count="size">65534</dd></div><div class="k-used"><dt>used</dt><dd data-count="used">0</dd></div>' +
  '<div class="k-reserved"><dt>reserved</dt><dd data-count="reserved">0</dd></div><div class="k-free"><dt>free</dt><dd data-count="free">65534</dd></div><div class="k-blocks"><dt>blocks</dt><dd data-count="blocks">0</dd></div></dl>' +
  '<p class="note">no block claimed</p></section></section>' +
  '<section id="nodes"><h2>nodes</h2><table class="nodes"><thead><tr><th>node</th><th>blocks</th><th>capacity</th><th>used</th><th>borrowed</th><th>reserved</th><th>heartbeat</th><th>source</th></tr></thead><tbody>' +
  '<tr data-node="node-a" data-alive="yes" data-heartbeat="yes"><td>node-a</td><td class="n">1</td><td class="n">15</td><td class="n">2</td><td class="n">0</td><td class="n">2</td><td class="alive">yes</td><td class="source">requests</td></tr>' +
  '<tr data-node="node-b" data-alive="no" data-heartbeat="expired"><td>node-b</td><td class="n">1</td><td class="n">14</td><td class="n">1</td><td class="n">0</td><td class="n">0</td><td class="alive">expired</td><td class="source">-</td></tr>' +
  '<tr data-node="node-c" data-alive="no" data-heartbeat="never"><td>node-c</td><td class="n">0</td><td class="n">0</td><td class="n">1</td><td class="n">1</td><td class="n">0</td><td class="alive">never</td><td class="source">-</td></tr>' +
  '</tbody></table></section></body></html>\n';

describe('pool status --html: the page', () => {
  it('is exactly this for a fixed status value', () => {
    const html = renderPoolStatusHtml(STATUS, { generatedAtMs: AT, source: 'etcd http://127.0.0.1:2379 /ipwarden' });
    const head =
      '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">' +
      `<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'">` +
      '<meta name="viewport" content="width=device-width, initial-scale=1"><title>ipwarden pool net1-pool</title><style>';
    assert.ok(html.startsWith(head), html.slice(0, 400));
    assert.equal(html.slice(html.indexOf('</style></head>') + '</style></head>'.length), BODY);
    // Self-contained: nothing to load, no script.
    assert.doesNotMatch(html, /\s(src|href)=/);
    assert.doesNotMatch(html, /<script/);
    assert.doesNotMatch(html, /url\(/);
  });

  it('no node and no block: says so', () => {
    const html = renderPoolStatusHtml({ ...STATUS, rangeSets: [{ index: 0, ranges: '10.84.0.1-10.84.0.30', size: '29', used: 0, reserved: 0, unreadable: 0, pendingRelease: 0, free: '29', blocksClaimed: 0 }], nodes: [], blocks: [] }, { generatedAtMs: AT });
    assert.match(html, /<p class="note">no block claimed<\/p><\/section><\/section><section id="nodes"><h2>nodes<\/h2><p>no nodes<\/p><\/section>/);
    assert.match(html, /<p class="meta">generated 2026-01-02T03:04:05.000Z · blocks \/28 \(IPv4\), \/122 \(IPv6\)<\/p>/);
  });

  it('keys that cannot be read: a section of their own (escaped), and the unreadable count of their range set', () => {
    const html = renderPoolStatusHtml(
      {
        ...STATUS,
        rangeSets: [{ index: 0, ranges: '10.84.0.1-10.84.0.30', size: '29', used: 1, reserved: 0, unreadable: 15, pendingRelease: 0, free: '13', blocksClaimed: 2 }],
        corrupt: [
          { key: '/ipwarden/pools/p1/blocks/10.84.0.16-28', why: 'unknown field "owner" (known: v, cidr, rangeSet, node, state, seq, next, allocs, wanted)' },
          { key: '/ipwarden/pools/p1/blocks/<b>', why: 'not a block key' },
        ],
      },
      { generatedAtMs: AT },
    );
    assert.ok(html.includes('<div class="k-reserved"><dt>reserved</dt><dd data-count="reserved">0</dd></div><div class="k-unreadable"><dt>unreadable</dt><dd data-count="unreadable">15</dd></div><div class="k-free"><dt>free</dt><dd data-count="free">13</dd></div>'));
    assert.ok(
      html.endsWith(
        '</tbody></table></section>' +
          '<section id="corrupt"><h2>keys that cannot be read</h2><p class="note">not counted above; never allocated from or rewritten by ipwarden: left for an operator</p>' +
          '<table class="corrupt"><thead><tr><th>key</th><th>why</th></tr></thead><tbody>' +
          '<tr data-key="/ipwarden/pools/p1/blocks/10.84.0.16-28"><td><code>/ipwarden/pools/p1/blocks/10.84.0.16-28</code></td><td>unknown field &#34;owner&#34; (known: v, cidr, rangeSet, node, state, seq, next, allocs, wanted)</td></tr>' +
          '<tr data-key="/ipwarden/pools/p1/blocks/&#60;b&#62;"><td><code>/ipwarden/pools/p1/blocks/&#60;b&#62;</code></td><td>not a block key</td></tr>' +
          '</tbody></table></section></body></html>\n',
      ),
      html.slice(-900),
    );
  });

  it('escapes every string of the status: an injection attempt stays text', () => {
    const evil = `"><script>alert(1)</script><img src=x onerror='alert(2)'>&`;
    const esc = '&#34;&#62;&#60;script&#62;alert(1)&#60;/script&#62;&#60;img src=x onerror=&#39;alert(2)&#39;&#62;&#38;';
    const html = renderPoolStatusHtml(
      {
        ...STATUS,
        pool: evil,
        rangeSets: [{ ...(STATUS.rangeSets[0] as PoolStatus['rangeSets'][number]), ranges: evil, size: evil, free: evil }],
        nodes: [{ node: evil, blocks: 1, capacity: 15, used: 1, borrowed: 0, reserved: 0, alive: false, heartbeat: 'never', source: null }],
        blocks: [{ cidr: evil, rangeSet: 0, node: evil, state: evil as 'owned', capacity: 15, used: 1, borrowed: 0, reserved: 0 }],
      },
      { generatedAtMs: AT, source: evil },
    );
    assert.doesNotMatch(html, /<script|<img|onerror='/);
    // title, h1, source; ranges, size, free; the block's CIDR (data-block, code, bar title), state (2), node (2); the node row (2).
    assert.equal(html.split(esc).length - 1, 15, 'every occurrence escaped');
    assert.ok(html.includes(`<tr data-node="${esc}" data-alive="no" data-heartbeat="never"><td>${esc}</td>`));
  });
});

describe('pool status --html: the verb', () => {
  const ctx = (): CliContext & { out: string[] } => {
    const out: string[] = [];
    return { out, stdout: (t) => void out.push(t), stderr: (t) => void out.push(t), env: {}, now: () => AT };
  };
  const base = { pool: 'p', etcdEndpoints: 'http://127.0.0.1:1' };
  for (const [opts, msg] of [
    [{ ...base, out: '/tmp/x.html' }, '--out FILE goes with --html'],
    [{ ...base, html: true, out: '' }, '--out must not be empty'],
  ] as const) {
    it(`refuses ${JSON.stringify(opts)} before any etcd call: ${msg}`, async () => {
      await assert.rejects(runStatus(opts, ctx()), (e: unknown) => isAppError(e, 'USAGE') && e.message === msg);
    });
  }
  it('refuses --html --json without --out before any etcd call; with --json the error is JSON on stdout, exit 2', async () => {
    const c = ctx();
    assert.equal(await runStatus({ ...base, html: true, json: true }, c), 2);
    assert.deepEqual(c.out, ['{"version":1,"error":{"code":"USAGE","msg":"--html and --json both print to stdout: give --out FILE for the page"}}\n']);
  });

  it('writePage replaces a symlink at the target instead of following it, and leaves no temporary file', () => {
    const dir = mkdtempSync(join(tmpdir(), 'ipwarden-poolobs-page-'));
    try {
      writeFileSync(join(dir, 'victim'), 'keep');
      symlinkSync(join(dir, 'victim'), join(dir, 'page.html'));
      writePage(join(dir, 'page.html'), '<p>x</p>');
      assert.equal(readFileSync(join(dir, 'victim'), 'utf8'), 'keep');
      assert.ok(lstatSync(join(dir, 'page.html')).isFile());
      assert.equal(readFileSync(join(dir, 'page.html'), 'utf8'), '<p>x</p>');
      assert.equal(lstatSync(join(dir, 'page.html')).mode & 0o777, 0o644);
      assert.deepEqual(readdirSync(dir).sort(), ['page.html', 'victim']);
      assert.throws(() => writePage(join(dir, 'no-such-dir', 'p.html'), 'x'), (e: unknown) => isAppError(e, 'STORE_IO') && e.message.startsWith(`cannot write ${join(dir, 'no-such-dir', 'p.html')}: ENOENT`));
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
