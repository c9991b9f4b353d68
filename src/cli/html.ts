/**
 * The page `ipwarden status --html FILE` writes: one self-contained HTML document (inline CSS
 * and JS, no external URL; a Content-Security-Policy forbids loading anything) with, per
 * network and range set, the counts and an address map.
 *
 * Address map: one cell per address of the range set (every range, in order, from `rangeStart`
 * to `rangeEnd`, the gateway included and shown as `gateway`); when a range set has more than
 * {@link MAX_CELLS} addresses, one cell per block of N consecutive addresses (N = ⌈size / MAX_CELLS⌉),
 * coloured by the worst state in the block ({@link STATE_ORDER}). Work is proportional to the
 * number of cells plus reservations, never to the range size (an IPv6 /64 is fine).
 *
 * Stable hooks for scripts and tests:
 * - each range set: `<section class="rangeset" id="rs-<network>-<index>" data-network data-range-set>`
 *   with `<dd data-count="capacity|reserved|live|grace|leaked|corrupt|free">` (`?` when unknown)
 *   and its cells `.cell[data-state]`, plus `data-block-size` on the map;
 * - page totals: `#totals [data-count=…]` (reserved, live, grace, leaked, corrupt over every
 *   network, reservations outside any range set included);
 * - a cell's `title` is its address (or block), state, and owner container ID + ifname.
 * Every text from disk (network names, container IDs, interface names, paths) is escaped.
 *
 * The page of `ipwarden pool status --html` ({@link renderPoolStatusHtml}) is built from the same
 * helpers (CSS, {@link escapeHtml}, the counts' markup) over a cluster pool's status.
 */
import { formatIP, parseIP } from '../common/ip.ts';
import { rangeFor } from '../ipam/range.ts';
import type { IP, RangeSet } from '../ipam/types.ts';
import type { PlanEntry } from '../reconcile/plan.ts';
import { formatAge, runtimeHead } from './format.ts';
import type { NetworkStatus, RangeSetStatus, StatusReport, VerdictCounts } from '../reconcile/status.ts';
import type { PoolBlockStatus, PoolStatus } from '../pool/index.ts';

/** Most cells drawn for one range set; above, cells stand for blocks of addresses. */
export const MAX_CELLS = 1024;

/** State of one address (or block) in the map. `unknown` = reserved, runtime not asked. */
export type CellState = 'free' | 'gateway' | 'live' | 'grace' | 'unknown' | 'leaked' | 'corrupt';

/** States from best to worst: a block shows the worst state among its addresses. */
export const STATE_ORDER: readonly CellState[] = ['free', 'gateway', 'live', 'grace', 'unknown', 'leaked', 'corrupt'];

/** Cell colours (also the legend). */
const COLOURS: Readonly<Record<CellState, string>> = {
  free: '#e3e8ec',
  gateway: '#1565c0',
  live: '#2e7d32',
  grace: '#f9a825',
  unknown: '#8d8d8d',
  leaked: '#c62828',
  corrupt: '#6a1b9a',
};

/**
 * The letter each state shows inside its cell and in the legend, so states differ without
 * colour (WCAG 1.4.1 "Use of Color"): `·` free, `G` gateway, `L` live, `T` in grace (time),
 * `?` unknown, `X` leaked, `!` corrupt.
 */
export const STATE_LETTERS: Readonly<Record<CellState, string>> = {
  free: '·',
  gateway: 'G',
  live: 'L',
  grace: 'T',
  unknown: '?',
  leaked: 'X',
  corrupt: '!',
};

/** Cells per labelled row of an address map (each row starts with its first address). */
export const MAP_ROW_CELLS = 16;

/** One cell of an address map. */
export interface MapCell {
  /** First and last address covered (equal for a one-address cell). */
  readonly first: IP;
  readonly last: IP;
  /** Number of addresses covered. */
  readonly size: bigint;
  /** The worst state among them. */
  readonly state: CellState;
  /** The reservations inside, sorted by IP. */
  readonly entries: readonly PlanEntry[];
  /** Is the gateway of a range inside? */
  readonly gateway: boolean;
}

/** An address map of one range set. */
export interface AddressMap {
  /** Addresses per cell (1 up to {@link MAX_CELLS} addresses). */
  readonly blockSize: bigint;
  readonly cells: readonly MapCell[];
}

function rank(s: CellState): number {
  return STATE_ORDER.indexOf(s);
}

/**
 * Build the address map of a range set from its reservations (pure). Reservations whose IP is
 * in no range of `rangeSet` are ignored (the status report lists them as outside).
 */
export function addressMap(rangeSet: RangeSet, entries: readonly PlanEntry[], maxCells: number = MAX_CELLS): AddressMap {
  const lens = rangeSet.map((r) => r.rangeEnd.value - r.rangeStart.value + 1n);
  const bases: bigint[] = [];
  let total = 0n;
  for (const l of lens) {
    bases.push(total);
    total += l;
  }
  const max = BigInt(Math.max(1, Math.floor(maxCells)));
  const blockSize = total <= max ? 1n : (total + max - 1n) / max;
  const n = Number((total + blockSize - 1n) / blockSize);
  const states: CellState[] = new Array<CellState>(n).fill('free');
  const inCell: PlanEntry[][] = Array.from({ length: n }, () => []);
  const gw: boolean[] = new Array<boolean>(n).fill(false);
  const mark = (cell: number, s: CellState): void => {
    if (rank(s) > rank(states[cell] as CellState)) states[cell] = s;
  };
  rangeSet.forEach((r, k) => {
    if (r.gateway.family === r.rangeStart.family && r.gateway.value >= r.rangeStart.value && r.gateway.value <= r.rangeEnd.value) {
      const cell = Number(((bases[k] as bigint) + r.gateway.value - r.rangeStart.value) / blockSize);
      gw[cell] = true;
      mark(cell, 'gateway');
    }
  });
  for (const e of entries) {
    const ip = parseIP(e.ip);
    if (ip === null) continue;
    const k = rangeFor(rangeSet, ip);
    if (k < 0) continue;
    const r = rangeSet[k] as RangeSet[number];
    const cell = Number(((bases[k] as bigint) + ip.value - r.rangeStart.value) / blockSize);
    (inCell[cell] as PlanEntry[]).push(e);
    mark(cell, e.verdict === 'inuse' ? 'live' : e.verdict);
  }
  const at = (off: bigint): IP => {
    let k = lens.length - 1;
    while (k > 0 && (bases[k] as bigint) > off) k--;
    const r = rangeSet[k] as RangeSet[number];
    return { family: r.rangeStart.family, value: r.rangeStart.value + off - (bases[k] as bigint) };
  };
  const cells: MapCell[] = [];
  for (let c = 0; c < n; c++) {
    const from = BigInt(c) * blockSize;
    const to = from + blockSize > total ? total : from + blockSize;
    cells.push({
      first: at(from),
      last: at(to - 1n),
      size: to - from,
      state: states[c] as CellState,
      entries: inCell[c] as PlanEntry[],
      gateway: gw[c] as boolean,
    });
  }
  return { blockSize, cells };
}

/** Escape text for HTML content and double-quoted attribute values. */
export function escapeHtml(s: string): string {
  return s.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

function ownerText(e: PlanEntry): string {
  if (e.containerId === null) return 'corrupt record';
  return `${e.containerId} ${e.ifname ?? '(any interface: legacy record)'}`;
}

/** The `title` (hover text) of a cell. */
export function cellTitle(c: MapCell, snapshotAtMs: number): string {
  if (c.size === 1n) {
    const ip = formatIP(c.first);
    const e = c.entries[0];
    if (e === undefined) return `${ip} ${c.state}`;
    return `${ip} ${e.verdict}: ${ownerText(e)}, age ${formatAge((snapshotAtMs - e.mtimeMs) / 1000)}`;
  }
  const by = new Map<string, number>();
  for (const e of c.entries) by.set(e.verdict, (by.get(e.verdict) ?? 0) + 1);
  const parts = STATE_ORDER.filter((s) => by.has(s)).map((s) => `${by.get(s) ?? 0} ${s}`);
  if (c.gateway) parts.push('gateway');
  let t = `${formatIP(c.first)} - ${formatIP(c.last)} (${c.size} addresses): ${parts.length > 0 ? parts.join(', ') : 'free'}`;
  const shown = c.entries.slice(0, 16);
  for (const e of shown) t += `\n${e.ip} ${e.verdict}: ${ownerText(e)}`;
  if (c.entries.length > shown.length) t += `\n… ${c.entries.length - shown.length} more`;
  return t;
}

function countsHtml(c: VerdictCounts, verdicts: boolean, extra: { capacity?: bigint; free?: bigint } = {}): string {
  const v = (n: number): string => (verdicts ? String(n) : '?');
  const items: Array<[string, string]> = [];
  if (extra.capacity !== undefined) items.push(['capacity', extra.capacity.toString()]);
  items.push(['reserved', String(c.reserved)], ['live', v(c.live)], ['grace', v(c.grace)], ['leaked', v(c.leaked)], ['corrupt', String(c.corrupt)]);
  if (extra.free !== undefined) items.push(['free', extra.free.toString()]);
  return `<dl class="counts">${items
    .map(([k, val]) => `<div class="k-${k}"><dt>${k}</dt><dd data-count="${k}">${escapeHtml(val)}</dd></div>`)
    .join('')}</dl>`;
}

function entriesTable(entries: readonly PlanEntry[], snapshotAtMs: number): string {
  if (entries.length === 0) return '';
  const rows = entries
    .map(
      (e) =>
        `<tr data-state="${escapeHtml(e.verdict)}"><td>${escapeHtml(e.ip)}</td><td class="id">${escapeHtml(e.containerId ?? '-')}</td>` +
        `<td>${escapeHtml(e.ifname ?? '-')}</td><td>${escapeHtml(formatAge((snapshotAtMs - e.mtimeMs) / 1000))}</td><td>${escapeHtml(e.verdict)}</td></tr>`,
    )
    .join('');
  return `<table class="entries"><thead><tr><th>IP</th><th>container</th><th>ifname</th><th>age</th><th>verdict</th></tr></thead><tbody>${rows}</tbody></table>`;
}

function rangeSetHtml(n: NetworkStatus, s: RangeSetStatus, r: StatusReport): string {
  const map = addressMap(s.rangeSet, s.entries);
  const cellHtml = (c: MapCell): string => {
    const ipAttr = c.size === 1n ? ` data-ip="${escapeHtml(formatIP(c.first))}"` : '';
    return `<i class="cell" data-state="${c.state}"${ipAttr} title="${escapeHtml(cellTitle(c, r.snapshotAtMs))}">${STATE_LETTERS[c.state]}</i>`;
  };
  // Rows of MAP_ROW_CELLS cells, each labelled with its first address.
  let cells = '';
  for (let i = 0; i < map.cells.length; i += MAP_ROW_CELLS) {
    const row = map.cells.slice(i, i + MAP_ROW_CELLS);
    cells += `<div class="row"><span class="addr">${escapeHtml(formatIP((row[0] as MapCell).first))}</span>${row.map(cellHtml).join('')}</div>`;
  }
  const full = s.capacity > 0n && s.free === 0n;
  const alarm = full
    ? `<p class="alarm" role="alert" data-alarm="full">FULL: no free address in range set ${s.index} of ${escapeHtml(n.name)} — new pods on this network fail with "no IP addresses available in range set" until leaks are released (ipwarden gc) or pods are removed</p>`
    : '';
  const block = map.blockSize === 1n ? 'one cell per address' : `one cell per block of ${map.blockSize} addresses (worst state shown)`;
  return (
    `<section class="rangeset" id="rs-${escapeHtml(n.name)}-${s.index}" data-network="${escapeHtml(n.name)}" data-range-set="${s.index}">` +
    `<h3>range set ${s.index}: <code>${escapeHtml(s.range)}</code>${full ? ' <span class="badge">FULL</span>' : ''}</h3>` +
    alarm +
    countsHtml(s.counts, r.verdicts, { capacity: s.capacity, free: s.free }) +
    `<p class="note">${escapeHtml(block)}</p>` +
    `<div class="map" data-block-size="${map.blockSize}" data-cells="${map.cells.length}">${cells}</div>` +
    `</section>`
  );
}

function networkHtml(n: NetworkStatus, r: StatusReport): string {
  const source =
    n.config === null
      ? 'no CNI configuration names this network (directory only)'
      : `${n.config.file} (ipam type ${n.config.ipamType ?? '?'})`;
  let body = `<p class="meta">${escapeHtml(source)} · ${escapeHtml(n.dir)}${n.dirExists ? '' : ' (no directory yet)'}</p>`;
  if (n.skipped !== null) body += `<p class="warn">not read: ${escapeHtml(n.skipped)}</p>`;
  for (const s of n.rangeSets) body += rangeSetHtml(n, s, r);
  if (n.config === null || n.outside.counts.reserved > 0) {
    body +=
      `<section class="outside" data-network="${escapeHtml(n.name)}"><h3>${n.config === null ? 'reservations' : 'reservations outside every range set'}</h3>` +
      countsHtml(n.outside.counts, r.verdicts) +
      entriesTable(n.outside.entries, r.snapshotAtMs) +
      `</section>`;
  }
  return `<section class="network" id="net-${escapeHtml(n.name)}" data-network="${escapeHtml(n.name)}"><h2>${escapeHtml(n.name)}</h2>${body}</section>`;
}

const CSS = `
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#1d2327;background:#fff}
h1{font-size:20px;margin:0 0 4px}h2{font-size:17px;margin:24px 0 4px;border-bottom:1px solid #ccd}
h3{font-size:14px;margin:12px 0 4px}code,.id{font-family:ui-monospace,monospace}
.meta,.note{color:#555;margin:2px 0}.warn{color:#b71c1c;font-weight:600}
dl.counts{display:flex;flex-wrap:wrap;gap:6px;margin:6px 0}dl.counts div{border:1px solid #ccd;border-radius:4px;padding:2px 8px}
dt{font-size:11px;color:#555;text-transform:uppercase}dd{margin:0;font-weight:600;font-size:16px}
.k-leaked dd,.k-corrupt dd{color:#b71c1c}
.map{display:flex;flex-direction:column;gap:2px;margin:6px 0}
.map .row{display:flex;gap:2px;align-items:center}
.map .addr{font:11px ui-monospace,monospace;color:#555;width:128px;text-align:right;padding-right:6px}
.cell{display:block;width:14px;height:14px;border-radius:2px;cursor:default;font:bold 9px/14px ui-monospace,monospace;text-align:center;font-style:normal;color:#fff}
.cell[data-state="free"],.cell[data-state="grace"]{color:#333}
.alarm{background:#b71c1c;color:#fff;font-weight:600;padding:6px 10px;border-radius:4px;margin:6px 0}
.badge{background:#b71c1c;color:#fff;border-radius:3px;padding:0 6px;font-size:12px}
.legend{display:flex;gap:8px;flex-wrap:wrap;margin:8px 0}.legend button{border:1px solid #ccd;background:#fff;border-radius:4px;padding:2px 8px;cursor:pointer}
.legend i{display:inline-block;width:14px;height:14px;margin-right:4px;border-radius:2px;font:bold 9px/14px ui-monospace,monospace;text-align:center;font-style:normal;color:#fff}
.legend i.s-free,.legend i.s-grace{color:#333}
#hover{min-height:1.4em;font-family:ui-monospace,monospace;white-space:pre-wrap;color:#333}
table.entries{border-collapse:collapse;margin:6px 0}table.entries td,table.entries th{border:1px solid #dde;padding:2px 6px;text-align:left}
${STATE_ORDER.map((s) => `.cell[data-state="${s}"],.legend i.s-${s}{background:${COLOURS[s]}}`).join('\n')}
${STATE_ORDER.map((s) => `body[data-focus="${s}"] .cell:not([data-state="${s}"]){opacity:.15}`).join('\n')}
`;

const JS = `
(function(){
  var hover=document.getElementById('hover');
  document.addEventListener('mouseover',function(e){
    var t=e.target;
    if(t&&t.classList&&t.classList.contains('cell')){hover.textContent=t.getAttribute('title');}
  });
  var buttons=document.querySelectorAll('.legend button');
  for(var i=0;i<buttons.length;i++){
    buttons[i].addEventListener('click',function(ev){
      var s=ev.currentTarget.getAttribute('data-state');
      var cur=document.body.getAttribute('data-focus');
      document.body.setAttribute('data-focus',cur===s?'':s);
    });
  }
})();
`;

/** Options of {@link renderStatusHtml}. */
export interface HtmlOptions {
  /** When the page was made, milliseconds since the Unix epoch (shown in the header). */
  readonly generatedAtMs: number;
}

/** Render the whole page (pure). See the module comment for its structure and stable hooks. */
export function renderStatusHtml(r: StatusReport, opts: HtmlOptions): string {
  const totals: VerdictCounts = { reserved: 0, live: 0, grace: 0, leaked: 0, corrupt: 0, unknown: 0 };
  for (const n of r.networks) {
    for (const k of ['reserved', 'live', 'grace', 'leaked', 'corrupt', 'unknown'] as const) totals[k] += n.total[k];
  }
  const rt = r.runtime;
  const runtime =
    rt.endpoint === null
      ? `${runtimeHead(null, rt.error)}: live, grace and leaked are unknown`
      : rt.sandboxes === null
        ? `runtime ${rt.endpoint}: not reachable (${rt.error ?? 'unknown error'}): live, grace and leaked are unknown`
        : `runtime ${rt.endpoint}: ${rt.sandboxes} sandboxes · grace ${r.graceSeconds}s`;
  const legend = STATE_ORDER.map(
    (s) => `<button type="button" data-state="${s}"><i class="s-${s}">${STATE_LETTERS[s]}</i>${s}</button>`,
  ).join('');
  const errors = r.layout.configErrors
    .map((e) => `<li>${escapeHtml(e.file)}: ${escapeHtml(e.error)}</li>`)
    .join('');
  return (
    `<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">` +
    `<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'">` +
    `<meta name="viewport" content="width=device-width, initial-scale=1">` +
    `<title>ipwarden status</title><style>${CSS}</style></head><body data-focus="">` +
    `<h1>ipwarden status</h1>` +
    `<p class="meta" id="runtime" data-verdicts="${r.verdicts}">${escapeHtml(runtime)}</p>` +
    `<p class="meta">generated ${escapeHtml(new Date(opts.generatedAtMs).toISOString())} · CNI config ${escapeHtml(r.layout.cniConfDir)} · data ${escapeHtml(r.layout.dataDirs.join(', '))}</p>` +
    `<section id="totals"><h3>all networks</h3>${countsHtml(totals, r.verdicts)}</section>` +
    `<div class="legend">${legend}</div><div id="hover"></div>` +
    (errors === '' ? '' : `<ul class="warn" id="config-errors">${errors}</ul>`) +
    r.networks.map((n) => networkHtml(n, r)).join('') +
    (r.networks.length === 0 ? '<p>no networks</p>' : '') +
    `<script>${JS}</script></body></html>\n`
  );
}

// ---------------------------------------------------------------------------------------------
// The page `ipwarden pool status --html` writes (docs/cluster.md "pool status"): the same style
// helpers (CSS, escaping, counts) over a cluster pool's status model (src/pool/status.ts).

/** Extra rules of the pool page: tables, block bars (own use, borrowed, reserved, free), the heartbeat column. */
const POOL_CSS = `
table.nodes,table.blocks,table.corrupt{border-collapse:collapse;margin:6px 0}
table.nodes td,table.nodes th,table.blocks td,table.blocks th,table.corrupt td,table.corrupt th{border:1px solid #dde;padding:2px 6px;text-align:left}
table.corrupt td{color:#b71c1c}
table td.n{text-align:right;font-variant-numeric:tabular-nums}
.bar{display:flex;width:200px;height:12px;background:${COLOURS.free};border-radius:2px;overflow:hidden}
.bar i{display:block;height:12px}.bar i.own,.bar-legend i.own{background:${COLOURS.live}}
.bar i.borrowed,.bar-legend i.borrowed{background:repeating-linear-gradient(45deg,${COLOURS.grace} 0 3px,#fff3c4 3px 5px)}
.bar i.reserved,.bar-legend i.reserved{background:repeating-linear-gradient(90deg,#7986cb 0 2px,#dfe3f5 2px 4px)}
.bar-legend{display:flex;gap:12px;flex-wrap:wrap;margin:6px 0}.bar-legend i{display:inline-block;width:24px;height:12px;margin-right:4px;vertical-align:middle;border-radius:2px}.bar-legend i.free{background:${COLOURS.free}}
tr[data-heartbeat="expired"] td.alive{color:#b71c1c}tr[data-heartbeat="never"] td.alive{color:#b71c1c;font-weight:600}tr[data-state="pendingRelease"] td.state{color:#b71c1c;font-weight:600}
`;

/** Options of {@link renderPoolStatusHtml}. */
export interface PoolHtmlOptions {
  /** When the page was made, milliseconds since the Unix epoch (shown in the header). */
  readonly generatedAtMs: number;
  /** Where the status was read (`etcd http://10.0.0.5:2379 /ipwarden`), shown in the header; optional. */
  readonly source?: string;
}

/** A percentage of `n / d` as CSS text with two decimals (0 when `d` is 0). */
function percent(n: number, d: number): string {
  return `${d <= 0 ? '0.00' : ((100 * Math.min(Math.max(n, 0), d)) / d).toFixed(2)}%`;
}

/** `<dl class="counts">` of `items` (the node page's counts style). */
function poolCounts(items: ReadonlyArray<readonly [string, string]>): string {
  return `<dl class="counts">${items.map(([k, v]) => `<div class="k-${k}"><dt>${k}</dt><dd data-count="${k}">${escapeHtml(v)}</dd></div>`).join('')}</dl>`;
}

/** The bar of one block: its owner's allocations, borrowers', its reserve entries, free. */
function blockBar(b: PoolBlockStatus): string {
  const own = b.used - b.borrowed;
  const free = Math.max(0, b.capacity - b.used - b.reserved);
  const title = `${b.cidr}: ${b.used} of ${b.capacity} used (${b.borrowed} borrowed), ${b.reserved} reserved, ${free} free`;
  return (
    `<span class="bar" title="${escapeHtml(title)}">` +
    `<i class="own" style="width:${percent(own, b.capacity)}"></i>` +
    `<i class="borrowed" style="width:${percent(b.borrowed, b.capacity)}"></i>` +
    `<i class="reserved" style="width:${percent(b.reserved, b.capacity)}"></i></span>`
  );
}

/**
 * Render the page of `ipwarden pool status --html` (pure): header (pool, block sizes, where it was
 * read, when), then per range set its counts (`data-count="size|used|reserved|free|blocks"`) and
 * its blocks (`table.blocks`, one `tr[data-block][data-node][data-state]` each, with a bar of the
 * owner's use, borrowed, reserved and free), then the nodes (`table.nodes`, one
 * `tr[data-node][data-alive="yes|no"][data-heartbeat="yes|expired|never"]` each: blocks,
 * capacity, used, borrowed, reserved, heartbeat, source), then — only when there are any — the keys that
 * cannot be read (`section#corrupt`, `table.corrupt tr[data-key]`: key, why; a range set with
 * unreadable addresses also gets `dd[data-count="unreadable"]`, one with unheld addresses in
 * `pendingRelease` blocks `dd[data-count="pending"]`), and the pools of the prefix that
 * overlap it (`section#overlaps`, `tr[data-later][data-earlier]`: the later pool, whose ADDs are
 * refused, the earlier one, the overlapping ranges). Self-contained (inline CSS, no script; the
 * Content-Security-Policy loads nothing). Every string of the status — node names, CIDRs, ranges,
 * the pool name — is escaped ({@link escapeHtml}).
 */
export function renderPoolStatusHtml(s: PoolStatus, opts: PoolHtmlOptions): string {
  const sets = s.rangeSets
    .map((r) => {
      const blocks = s.blocks.filter((b) => b.rangeSet === r.index);
      const rows = blocks
        .map(
          (b) =>
            `<tr data-block="${escapeHtml(b.cidr)}" data-node="${escapeHtml(b.node)}" data-state="${escapeHtml(b.state)}">` +
            `<td><code>${escapeHtml(b.cidr)}</code></td><td>${escapeHtml(b.node)}</td><td class="state">${escapeHtml(b.state)}</td>` +
            `<td>${blockBar(b)}</td><td class="n">${b.used}/${b.capacity}</td><td class="n">${b.borrowed}</td><td class="n">${b.reserved}</td></tr>`,
        )
        .join('');
      const table =
        blocks.length === 0
          ? '<p class="note">no block claimed</p>'
          : `<table class="blocks"><thead><tr><th>block</th><th>node</th><th>state</th><th>use</th><th>used</th><th>borrowed</th><th>reserved</th></tr></thead><tbody>${rows}</tbody></table>`;
      return (
        `<section class="rangeset" id="set-${r.index}" data-range-set="${r.index}">` +
        `<h3>range set ${r.index}: <code>${escapeHtml(r.ranges)}</code></h3>` +
        poolCounts([['size', r.size], ['used', String(r.used)], ['reserved', String(r.reserved)], ...(r.unreadable > 0 ? [['unreadable', String(r.unreadable)] as const] : []), ...(r.pendingRelease > 0 ? [['pending', String(r.pendingRelease)] as const] : []), ['free', r.free], ['blocks', String(r.blocksClaimed)]]) +
        table +
        `</section>`
      );
    })
    .join('');
  const nodeRows = s.nodes
    .map(
      (n) =>
        `<tr data-node="${escapeHtml(n.node)}" data-alive="${n.alive ? 'yes' : 'no'}" data-heartbeat="${escapeHtml(n.heartbeat)}"><td>${escapeHtml(n.node)}</td>` +
        `<td class="n">${n.blocks}</td><td class="n">${n.capacity}</td><td class="n">${n.used}</td><td class="n">${n.borrowed}</td><td class="n">${n.reserved}</td><td class="alive">${escapeHtml(n.heartbeat)}</td><td class="source">${escapeHtml(n.source ?? '-')}</td></tr>`,
    )
    .join('');
  const nodes =
    s.nodes.length === 0
      ? '<p>no nodes</p>'
      : `<table class="nodes"><thead><tr><th>node</th><th>blocks</th><th>capacity</th><th>used</th><th>borrowed</th><th>reserved</th><th>heartbeat</th><th>source</th></tr></thead><tbody>${nodeRows}</tbody></table>`;
  const source = opts.source === undefined ? '' : ` · ${escapeHtml(opts.source)}`;
  // Keys that cannot be read: a section of their own, only when there are any.
  const corrupt =
    s.corrupt.length === 0
      ? ''
      : `<section id="corrupt"><h2>keys that cannot be read</h2><p class="note">not counted above; never allocated from or rewritten by ipwarden: left for an operator</p>` +
        `<table class="corrupt"><thead><tr><th>key</th><th>why</th></tr></thead><tbody>${s.corrupt.map((c) => `<tr data-key="${escapeHtml(c.key)}"><td><code>${escapeHtml(c.key)}</code></td><td>${escapeHtml(c.why)}</td></tr>`).join('')}</tbody></table></section>`;
  // Pools of the prefix that overlap this one: a section of its own, only when there are any.
  const overlaps =
    s.overlaps.length === 0
      ? ''
      : `<section id="overlaps"><h2>overlapping pools</h2><p class="note">the pool created later hands out no address while they overlap</p>` +
        `<table class="corrupt"><thead><tr><th>later pool (refused)</th><th>earlier pool</th><th>overlapping ranges</th></tr></thead><tbody>${s.overlaps.map((o) => `<tr data-later="${escapeHtml(o.later)}" data-earlier="${escapeHtml(o.earlier)}"><td>${escapeHtml(o.later)}</td><td>${escapeHtml(o.earlier)}</td><td>${escapeHtml(o.ranges.map((r) => `${r.later} / ${r.earlier}`).join('; '))}</td></tr>`).join('')}</tbody></table></section>`;
  return (
    `<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">` +
    `<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'">` +
    `<meta name="viewport" content="width=device-width, initial-scale=1">` +
    `<title>ipwarden pool ${escapeHtml(s.pool)}</title><style>${CSS}${POOL_CSS}</style></head><body>` +
    `<h1>ipwarden pool <code>${escapeHtml(s.pool)}</code></h1>` +
    `<p class="meta">generated ${escapeHtml(new Date(opts.generatedAtMs).toISOString())}${source} · blocks /${s.blockSize} (IPv4), /${s.blockSize6} (IPv6)</p>` +
    `<section id="rangesets"><h2>range sets</h2>` +
    // The bars' legend: each part has its own pattern as well as its colour (not colour alone).
    `<p class="bar-legend" id="bar-legend"><span><i class="own"></i>used by the block's node (solid)</span><span><i class="borrowed"></i>borrowed by another node (diagonal stripes)</span><span><i class="reserved"></i>reserve for offline allocation (vertical stripes)</span><span><i class="free"></i>free</span></p>` +
    `${sets}</section>` +
    `<section id="nodes"><h2>nodes</h2>${nodes}</section>` +
    corrupt +
    overlaps +
    `</body></html>\n`
  );
}
