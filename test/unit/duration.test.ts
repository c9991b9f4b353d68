import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { formatDuration, parseDuration, parseDurationNs } from '../../src/common/duration.ts';

describe('parseDuration (Go time.ParseDuration), seconds', () => {
  const cases: [string, number][] = [
    ['0', 0],
    ['+0', 0],
    ['-0', 0],
    ['90s', 90],
    ['5m', 300],
    ['1h30m', 5400],
    ['1h30m15s', 5415],
    ['1.5s', 1.5],
    ['.5s', 0.5],
    ['1.s', 1],
    ['300ms', 0.3],
    ['1500us', 0.0015],
    ['1500µs', 0.0015],
    ['1500μs', 0.0015],
    ['100ns', 1e-7],
    ['2h', 7200],
    ['1m0.5s', 60.5],
    ['-5m', -300],
    ['+5m', 300],
    ['0s', 0],
    ['0.000000001s', 1e-9],
  ];
  for (const [input, want] of cases) {
    it(`${input} → ${want}`, () => assert.equal(parseDuration(input), want));
  }
  it('keeps nanosecond precision in parseDurationNs', () => {
    assert.equal(parseDurationNs('1h2m3.456789012s'), 3723456789012n);
    assert.equal(parseDurationNs('2562047h47m16.854775807s'), (1n << 63n) - 1n);
  });

  const bad: [string, string][] = [
    ['', 'time: invalid duration ""'],
    ['1', 'time: missing unit in duration "1"'],
    ['5 m', 'time: unknown unit " m" in duration "5 m"'],
    ['1x', 'time: unknown unit "x" in duration "1x"'],
    ['5M', 'time: unknown unit "M" in duration "5M"'],
    ['.s', 'time: invalid duration ".s"'],
    ['s', 'time: invalid duration "s"'],
    ['-', 'time: invalid duration "-"'],
    ['1h-5m', 'time: unknown unit "h-" in duration "1h-5m"'],
    ['2562048h', 'time: invalid duration "2562048h"'],
    ['9223372036854775808ns', 'time: invalid duration "9223372036854775808ns"'],
  ];
  for (const [input, reason] of bad) {
    it(`${JSON.stringify(input)} → invalid duration (${reason})`, () => {
      assert.throws(() => parseDuration(input), {
        code: 'USAGE',
        message: `invalid duration ${JSON.stringify(input)}`,
        details: reason,
      });
    });
  }
});

describe('formatDuration (Go Duration.String)', () => {
  const cases: [number, string][] = [
    [0, '0s'],
    [5400, '1h30m0s'],
    [300, '5m0s'],
    [30, '30s'],
    [1.5, '1.5s'],
    [0.3, '300ms'],
    [0.0015, '1.5ms'],
    [0.000002, '2µs'],
    [1e-9, '1ns'],
    [90061.25, '25h1m1.25s'],
    [-300, '-5m0s'],
  ];
  for (const [input, want] of cases) {
    it(`${input} → ${want}`, () => assert.equal(formatDuration(input), want));
  }
  it('round-trips through parseDuration', () => {
    for (const s of ['1h30m0s', '5m0s', '1.5s', '300ms', '2µs', '0s']) assert.equal(formatDuration(parseDuration(s)), s);
  });
});
