/**
 * docs/benchmarks-pool.svg is what scripts/bench-pool-figure.ts draws from the tables recorded in
 * docs/benchmarks.md — the full sweep and every later re-measurement — so the figure cannot show
 * one run while the page reports another. Asserted: the numbers read from the page, exactly; the
 * committed file equals the rendering of them (byte for byte); the figure names the latest run's
 * 9.9 × and the range 9.9–19.9 at 50 nodes; a page without the markers or a column is refused.
 */
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { FigureInputError, parseFigureData, renderPoolFigure } from '../../scripts/bench-pool-figure.ts';
import { ROOT } from '../helpers/cni.ts';

const DOC = readFileSync(join(ROOT, 'docs/benchmarks.md'), 'utf8');

describe('docs/benchmarks-pool.svg is drawn from docs/benchmarks.md', () => {
  it('the numbers read from the page: the sweep at 5, 10, 20, 50 nodes and the re-measurement at 50', () => {
    const d = parseFigureData(DOC);
    assert.equal(d.sweep.when, '2026-12-01, 16:21–16:32 UTC');
    assert.deepEqual(d.rates, [0.5, 1]);
    assert.deepEqual(
      d.sweep.points.map((p) => [p.nodes, p.pool.allocsPerSec, p.base.allocsPerSec, p.ratio, [...p.pool.p99Ms], [...p.base.p99Ms]]),
      [
        [5, 55.4, 15.3, 3.6, [[0.5, 29.8], [1, 23.7]], [[0.5, 24.0], [1, 21.3]]],
        [10, 64.0, 10.5, 6.1, [[0.5, 66.6], [1, 32.0]], [[0.5, 39.2], [1, 17.8]]],
        [20, 87.9, 9.6, 9.1, [[0.5, 21.4], [1, 37.9]], [[0.5, 38.8], [1, 19.0]]],
        [50, 109.4, 5.5, 19.9, [[0.5, 42.6], [1, 118.3]], [[0.5, 19.9], [1, 34537.5]]],
      ],
    );
    assert.deepEqual(
      d.reruns.map((r) => [r.when, r.points.map((p) => [p.nodes, p.pool.allocsPerSec, p.base.allocsPerSec, p.ratio, [...p.pool.p99Ms], [...p.base.p99Ms]])]),
      [['2026-12-01, 20:42 UTC', [[50, 78.4, 7.9, 9.9, [[0.5, 30.2], [1, 125.0]], [[1, 32400]]]]]],
    );
  });

  it('the committed figure is the rendering of those numbers, byte for byte (regenerate: node --import tsx scripts/bench-pool-figure.ts)', () => {
    const svg = renderPoolFigure(parseFigureData(DOC));
    assert.equal(readFileSync(join(ROOT, 'docs/benchmarks-pool.svg'), 'utf8'), svg);
  });

  it('the figure states the latest run and the range at 50 nodes, and marks the latest run', () => {
    const svg = readFileSync(join(ROOT, 'docs/benchmarks-pool.svg'), 'utf8');
    assert.ok(svg.includes('>at 50 nodes, latest: 9.9 × (runs: 9.9–19.9)</text>'));
    assert.ok(svg.includes('>at 50 nodes, latest: 78.4/s (runs: 78.4–109.4)</text>'));
    assert.ok(svg.includes('lines: the full sweep (2026-12-01, 16:21–16:32 UTC); ◆ the latest run (2026-12-01, 20:42 UTC), bar: the range of all 2 runs at that node count'));
    // Diamonds: the latest run's pool and baseline throughput, pool and baseline p99 (pool at two
    // rates, baseline at one: the re-measurement has no baseline p99 at 25 pods/s), the ratio.
    assert.equal(svg.match(/<path d="M/g)?.length, 6);
  });

  it('a page without the sweep marker, or with a column renamed, is refused', () => {
    assert.throws(() => parseFigureData(DOC.replace('<!-- figure: sweep -->', '')), new FigureInputError('docs/benchmarks.md has no <!-- figure: sweep --> marker'));
    assert.throws(() => parseFigureData(DOC.replace('<!-- figure: rerun -->\n| nodes | pool allocs/s', '<!-- figure: rerun -->\n| nodes | pool ADDs/s')), FigureInputError);
  });
});
