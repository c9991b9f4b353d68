/**
 * docs/benchmarks-pool.svg, generated from the numbers recorded in docs/benchmarks.md (never drawn
 * by hand, never from one run alone): the cluster pool benchmark's full sweep (every node count),
 * and every later re-measurement, each at one node count. Where a node count was measured more than
 * once, the figure draws the range of all its runs as a bar and the latest run as a diamond, and says
 * both in numbers; the lines join the sweep's points.
 *
 * Input: the tables right after the markers in docs/benchmarks.md —
 * - `<!-- figure: sweep -->`: the closed-loop table (`nodes`, `pool allocs/s`, `baseline allocs/s`,
 *   `pool ÷ baseline`), then one open-loop table per rate, each after its caption line
 *   `open loop (R new pod/s per node…` (`nodes`, `pool p50 / p99 ms`, `baseline p50 / p99 ms`);
 * - `<!-- figure: rerun -->` (any number, oldest first): one table with `nodes`, `pool allocs/s`,
 *   `baseline allocs/s`, `pool ÷ baseline`, and any `pool p99, N pods/s` / `baseline p99, N pods/s`
 *   columns (N pods/s offered cluster-wide; values in ms or s).
 * The date of each run is the parenthesised `… UTC` text of the `###` heading above its marker.
 *
 * Run: `node --import tsx scripts/bench-pool-figure.ts` (writes docs/benchmarks-pool.svg);
 * `--check` exits 1 when the file differs from what the document gives. bench/pool.ts draws a live
 * run's figure with the same renderer. Test: test/unit/bench-pool-figure.test.ts.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';

/** One subject's numbers at one node count in one run; a missing number is absent. */
export interface SubjectPoint {
  /** Allocations per second, closed loop (saturating). */
  readonly allocsPerSec?: number;
  /** p99 ADD latency in ms per open-loop rate (new pods per second per node). */
  readonly p99Ms: ReadonlyMap<number, number>;
}

/** One run at one node count. */
export interface RunPoint {
  readonly nodes: number;
  readonly pool: SubjectPoint;
  readonly base: SubjectPoint;
  /** pool ÷ baseline throughput as recorded. */
  readonly ratio?: number;
}

/** A run: the sweep (many node counts) or a re-measurement (usually one). */
export interface FigureRun {
  /** The heading's date text, e.g. `2026-12-01, 20:42 UTC`. */
  readonly when: string;
  readonly points: readonly RunPoint[];
}

/** What the figure is drawn from. */
export interface FigureData {
  readonly sweep: FigureRun;
  /** Open-loop rates of the sweep (pods per second per node), in its table order. */
  readonly rates: readonly number[];
  /** Later runs, oldest first. */
  readonly reruns: readonly FigureRun[];
}

/** Thrown when docs/benchmarks.md lacks a marker, a table or a column the figure needs. */
export class FigureInputError extends Error {}

interface Table {
  readonly caption: string;
  readonly header: string[];
  readonly rows: string[][];
}

const cells = (line: string): string[] => line.trim().replace(/^\|/, '').replace(/\|$/, '').split('|').map((c) => c.trim());

/** The tables from line `from` until the next marker, `###` heading or `<details>`, with the last text line before each. */
function tablesAfter(lines: readonly string[], from: number): Table[] {
  const out: Table[] = [];
  let caption = '';
  for (let i = from; i < lines.length; i++) {
    const l = lines[i] as string;
    if (l.startsWith('<!-- figure:') || l.startsWith('### ') || l.startsWith('## ') || l.startsWith('<details>')) break;
    if (l.startsWith('|')) {
      const header = cells(l);
      const rows: string[][] = [];
      i += 2; // the separator line
      while (i < lines.length && (lines[i] as string).startsWith('|')) rows.push(cells(lines[i++] as string));
      out.push({ caption, header, rows });
      continue;
    }
    if (l.trim() !== '') caption = l.trim();
  }
  return out;
}

function column(t: Table, name: string | RegExp): number {
  const i = t.header.findIndex((h) => (typeof name === 'string' ? h === name : name.test(h)));
  if (i < 0) throw new FigureInputError(`docs/benchmarks.md: a figure table has no column ${String(name)} (columns: ${t.header.join(', ')})`);
  return i;
}

/** A number as the tables write it: `19.9 ×`, `**9.9 ×**`, `1,000`, `30.2 ms`, `32.4 s (…)` (→ ms when `unit`). */
function num(text: string, unit = false): number {
  const m = /^\**\s*([\d,]+(?:\.\d+)?)\s*(ms|s|×)?/.exec(text);
  if (m === null) throw new FigureInputError(`docs/benchmarks.md: not a number: ${JSON.stringify(text)}`);
  const v = Number((m[1] as string).replace(/,/g, ''));
  return unit && m[2] === 's' ? v * 1000 : v;
}

function whenOf(lines: readonly string[], at: number): string {
  for (let i = at; i >= 0; i--) {
    const l = lines[i] as string;
    if (l.startsWith('### ')) {
      const all = [...l.matchAll(/\(([^()]*UTC)\)/g)];
      const last = all[all.length - 1];
      if (last === undefined) throw new FigureInputError(`docs/benchmarks.md: the heading ${JSON.stringify(l)} names no date (… UTC)`);
      return last[1] as string;
    }
  }
  throw new FigureInputError('docs/benchmarks.md: a figure marker has no ### heading above it');
}

/**
 * The figure's numbers from docs/benchmarks.md's text (module comment).
 * @throws FigureInputError when the sweep marker, a table or a column is missing.
 */
export function parseFigureData(markdown: string): FigureData {
  const lines = markdown.split('\n');
  const sweepAt = lines.findIndex((l) => l.trim() === '<!-- figure: sweep -->');
  if (sweepAt < 0) throw new FigureInputError('docs/benchmarks.md has no <!-- figure: sweep --> marker');
  const tables = tablesAfter(lines, sweepAt + 1);
  const closed = tables.find((t) => t.caption.startsWith('closed loop'));
  if (closed === undefined) throw new FigureInputError('docs/benchmarks.md: no closed-loop table after <!-- figure: sweep -->');
  const open = tables.flatMap((t) => {
    const m = /^open loop \(([\d.]+) new pod\/s per node/.exec(t.caption);
    return m === null ? [] : [{ rate: Number(m[1]), t }];
  });
  const rates = open.map((o) => o.rate);
  const [cn, cp, cb, cr] = [column(closed, 'nodes'), column(closed, 'pool allocs/s'), column(closed, 'baseline allocs/s'), column(closed, 'pool ÷ baseline')];
  const points: RunPoint[] = closed.rows.map((r) => {
    const nodes = num(r[cn] as string);
    const p99 = (subject: 'pool' | 'baseline'): Map<number, number> =>
      new Map(
        open.map(({ rate, t }) => {
          const row = t.rows.find((x) => num(x[column(t, 'nodes')] as string) === nodes);
          if (row === undefined) throw new FigureInputError(`docs/benchmarks.md: the open-loop table at ${rate} pod/s has no row for ${nodes} nodes`);
          const [, p99Text] = (row[column(t, `${subject} p50 / p99 ms`)] as string).split('/');
          return [rate, num((p99Text ?? '').trim())];
        }),
      );
    return { nodes, pool: { allocsPerSec: num(r[cp] as string), p99Ms: p99('pool') }, base: { allocsPerSec: num(r[cb] as string), p99Ms: p99('baseline') }, ratio: num(r[cr] as string) };
  });
  const reruns: FigureRun[] = [];
  lines.forEach((l, at) => {
    if (l.trim() !== '<!-- figure: rerun -->') return;
    const t = tablesAfter(lines, at + 1)[0];
    if (t === undefined) throw new FigureInputError('docs/benchmarks.md: no table after <!-- figure: rerun -->');
    const rn = column(t, 'nodes');
    const latency = (subject: 'pool' | 'baseline', nodes: number, row: string[]): Map<number, number> => {
      const m = new Map<number, number>();
      t.header.forEach((h, i) => {
        const x = new RegExp(`^${subject} p99, ([\\d.]+) pods/s$`).exec(h);
        if (x !== null) m.set(Number(x[1]) / nodes, num(row[i] as string, true));
      });
      return m;
    };
    reruns.push({
      when: whenOf(lines, at),
      points: t.rows.map((row) => {
        const nodes = num(row[rn] as string);
        return {
          nodes,
          pool: { allocsPerSec: num(row[column(t, 'pool allocs/s')] as string), p99Ms: latency('pool', nodes, row) },
          base: { allocsPerSec: num(row[column(t, 'baseline allocs/s')] as string), p99Ms: latency('baseline', nodes, row) },
          ratio: num(row[column(t, 'pool ÷ baseline')] as string),
        };
      }),
    });
  });
  return { sweep: { when: whenOf(lines, sweepAt), points }, rates, reruns };
}

const POOL = '#2471a3';
const BASE = '#c0392b';
const f1 = (x: number): string => x.toFixed(1);

/** Every run's value of `get` at `nodes` (sweep first, then the reruns in order), and the latest one's. */
function runsAt(d: FigureData, nodes: number, get: (p: RunPoint) => number | undefined): { all: number[]; latest: number | null } {
  const all: number[] = [];
  let latest: number | null = null;
  for (const run of [d.sweep, ...d.reruns]) {
    for (const p of run.points) {
      if (p.nodes !== nodes) continue;
      const v = get(p);
      if (v === undefined || !Number.isFinite(v)) continue;
      all.push(v);
      latest = v;
    }
  }
  return { all, latest };
}

/** The smallest `4 × step` ≥ `v` with `step` 1, 1.5, 2, 2.5, 3, 4, 5, 6 or 8 × a power of ten (round tick labels). */
function niceMax(v: number): number {
  const raw = v / 4;
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = ([1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10].find((m) => m * mag >= raw) ?? 10) * mag;
  return 4 * step;
}

interface Series {
  readonly get: (p: RunPoint) => number | undefined;
  readonly color: string;
  readonly dash?: string;
}

/**
 * The three-panel SVG (closed-loop allocations/s, open-loop p99 ADD, pool ÷ baseline, each against
 * the simulated node count). Pure; the same data gives the same bytes.
 */
export function renderPoolFigure(d: FigureData): string {
  const W = 380;
  const H = 250;
  const TOP = 34;
  const pad = 52;
  const xs = d.sweep.points.map((p) => p.nodes);
  const xMax = Math.max(...xs);
  const panel = (x0: number, title: string, series: readonly Series[], unit: string, opts: { target?: number; targetText?: string; yCap?: number; note?: (s: Series) => string | null } = {}): string => {
    const values = series.flatMap((s) => xs.flatMap((n) => runsAt(d, n, s.get).all));
    const yMax = Math.min(opts.yCap ?? Infinity, niceMax(Math.max(1, opts.target ?? 0, ...values) * 1.05));
    const px = (n: number): number => x0 + pad + ((W - 2 * pad) * n) / xMax;
    const py = (v: number): number => TOP + H - pad + 10 - ((H - 2 * pad) * Math.min(v, yMax)) / yMax;
    const ticks = [0, 0.25, 0.5, 0.75, 1]
      .map((f) => `<text x="${x0 + pad - 6}" y="${f1(py(f * yMax) + 4)}" font-size="10" text-anchor="end">${(f * yMax).toFixed(yMax < 10 ? 1 : 0)}</text><line x1="${x0 + pad}" x2="${x0 + W - pad}" y1="${f1(py(f * yMax))}" y2="${f1(py(f * yMax))}" stroke="#ddd"/>`)
      .join('');
    const xt = xs.map((n) => `<text x="${f1(px(n))}" y="${TOP + H - pad + 26}" font-size="10" text-anchor="middle">${n}</text>`).join('');
    const tl =
      opts.target === undefined
        ? ''
        : `<line x1="${x0 + pad}" x2="${x0 + W - pad}" y1="${f1(py(opts.target))}" y2="${f1(py(opts.target))}" stroke="#888" stroke-dasharray="4 3"/><text x="${x0 + pad + 4}" y="${f1(py(opts.target) - 4)}" font-size="10">${opts.targetText ?? ''}</text>`;
    const drawn = series
      .map((s) => {
        const sweep = d.sweep.points.filter((p) => s.get(p) !== undefined);
        const line = `<polyline fill="none" stroke="${s.color}" stroke-width="2"${s.dash === undefined ? '' : ` stroke-dasharray="${s.dash}"`} points="${sweep.map((p) => `${f1(px(p.nodes))},${f1(py(s.get(p) as number))}`).join(' ')}"/>`;
        const dots = sweep.map((p) => `<circle cx="${f1(px(p.nodes))}" cy="${f1(py(s.get(p) as number))}" r="3" fill="${s.color}"/>`).join('');
        const ranges = xs
          .map((n) => {
            const r = runsAt(d, n, s.get);
            if (r.all.length < 2 || r.latest === null) return '';
            const lo = Math.min(...r.all);
            const hi = Math.max(...r.all);
            const x = px(n);
            const y = py(r.latest);
            return (
              `<line x1="${f1(x)}" x2="${f1(x)}" y1="${f1(py(lo))}" y2="${f1(py(hi))}" stroke="${s.color}" stroke-width="6" stroke-opacity="0.3"/>` +
              `<path d="M${f1(x)} ${f1(y - 6)}L${f1(x + 6)} ${f1(y)}L${f1(x)} ${f1(y + 6)}L${f1(x - 6)} ${f1(y)}Z" fill="white" stroke="${s.color}" stroke-width="2"/>`
            );
          })
          .join('');
        const note = opts.note?.(s) ?? null;
        return line + dots + ranges + (note ?? '');
      })
      .join('');
    return `<g><text x="${x0 + W / 2}" y="${TOP + 18}" font-size="13" text-anchor="middle" font-weight="bold">${title}</text>${ticks}${xt}${tl}<text x="${x0 + W / 2}" y="${TOP + H - 4}" font-size="11" text-anchor="middle">simulated nodes</text><text x="${x0 + 12}" y="${TOP + H / 2}" font-size="11" transform="rotate(-90 ${x0 + 12} ${TOP + H / 2})" text-anchor="middle">${unit}</text>${drawn}</g>`;
  };
  const rate = (i: number): number => d.rates[i] as number;
  const latency: Series[] = d.rates.flatMap((r, i) => [
    { get: (p: RunPoint) => p.base.p99Ms.get(r), color: BASE, ...(i > 0 ? { dash: '5 3' } : {}) },
    { get: (p: RunPoint) => p.pool.p99Ms.get(r), color: POOL, ...(i > 0 ? { dash: '5 3' } : {}) },
  ]);
  const ratio = runsAt(d, xMax, (p) => p.ratio);
  const range = (xs2: number[]): string => (xs2.length < 2 ? '' : ` (runs: ${f1(Math.min(...xs2))}–${f1(Math.max(...xs2))})`);
  const poolTput = runsAt(d, xMax, (p) => p.pool.allocsPerSec);
  const ratioNote = (s: Series): string | null =>
    s.color !== POOL || ratio.latest === null ? null : `<text x="${2 * W + W - pad}" y="${TOP + 40}" font-size="11" text-anchor="end" fill="${POOL}">at ${xMax} nodes, latest: ${f1(ratio.latest)} ×${range(ratio.all)}</text>`;
  const tputNote = (s: Series): string | null =>
    s.color !== POOL || poolTput.latest === null ? null : `<text x="${W - pad}" y="${TOP + 40}" font-size="11" text-anchor="end" fill="${POOL}">at ${xMax} nodes, latest: ${f1(poolTput.latest)}/s${range(poolTput.all)}</text>`;
  const latest = d.reruns[d.reruns.length - 1];
  const caption = `lines: the full sweep (${d.sweep.when})${latest === undefined ? '' : `; ◆ the latest run (${latest.when}), bar: the range of all ${[d.sweep, ...d.reruns].length} runs at that node count`}`;
  return `<svg xmlns="http://www.w3.org/2000/svg" width="${3 * W}" height="${TOP + H + 44}" font-family="sans-serif">
<rect width="100%" height="100%" fill="white"/>
<text x="${(3 * W) / 2}" y="20" font-size="12" text-anchor="middle" fill="#333">${caption}</text>
${panel(0, 'allocations/s (closed loop, saturating)', [{ get: (p) => p.base.allocsPerSec, color: BASE }, { get: (p) => p.pool.allocsPerSec, color: POOL }], 'ADDs/s', { note: tputNote })}
${panel(W, `p99 ADD, open loop: ${d.rates.join(' / ')} pod/s per node`, latency, 'ms', { target: 100, targetText: 'target 100 ms', yCap: 1000 })}
${panel(2 * W, 'pool ÷ baseline throughput', [{ get: (p) => p.ratio, color: POOL }], '×', { target: 10, targetText: 'target ≥ 10 ×', note: ratioNote })}
<g font-size="11"><rect x="${W - 170}" y="${TOP + H + 10}" width="12" height="4" fill="${POOL}"/><text x="${W - 154}" y="${TOP + H + 16}">ipwarden pool</text><rect x="${W - 60}" y="${TOP + H + 10}" width="12" height="4" fill="${BASE}"/><text x="${W - 44}" y="${TOP + H + 16}">Whereabouts model (one key, CAS)</text><text x="${(3 * W) / 2}" y="${TOP + H + 34}" text-anchor="middle" fill="#555">middle panel: solid ${rate(0)}, dashed ${d.rates.slice(1).join(', ')} pod/s per node; clipped at 1 s. Numbers: docs/benchmarks.md; drawn by scripts/bench-pool-figure.ts</text></g>
</svg>
`;
}

/** docs/benchmarks.md → docs/benchmarks-pool.svg, or with `--check` compare only (exit status 1 when they differ). */
function main(): void {
  const root = resolve(import.meta.dirname, '..');
  const svg = renderPoolFigure(parseFigureData(readFileSync(join(root, 'docs/benchmarks.md'), 'utf8')));
  const out = join(root, 'docs/benchmarks-pool.svg');
  if (process.argv.includes('--check')) {
    if (readFileSync(out, 'utf8') !== svg) {
      process.stderr.write('docs/benchmarks-pool.svg is not what docs/benchmarks.md gives: run node --import tsx scripts/bench-pool-figure.ts\n');
      process.exitCode = 1;
    }
    return;
  }
  writeFileSync(out, svg);
}

if (process.argv[1] !== undefined && resolve(process.argv[1]) === resolve(import.meta.filename)) main();
