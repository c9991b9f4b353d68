/**
 * Go-style durations (`90s`, `5m`, `1h30m`, `1.5s`, `300ms`), the form host-local's ecosystem and
 * ipwarden's config keys (`leakGracePeriod`, `lockTimeout`) and CLI flags (`--grace`, `--interval`)
 * use. Same grammar and rounding as Go's `time.ParseDuration` / `time.Duration.String`. Pure.
 */

import { AppError } from './errors.ts';
import { goQuote } from './goquote.ts';

const NS_PER_UNIT: ReadonlyMap<string, bigint> = new Map([
  ['ns', 1n],
  ['us', 1_000n],
  ['\u00b5s', 1_000n], // U+00B5 micro sign
  ['\u03bcs', 1_000n], // U+03BC Greek small letter mu
  ['ms', 1_000_000n],
  ['s', 1_000_000_000n],
  ['m', 60_000_000_000n],
  ['h', 3_600_000_000_000n],
]);

const MAX_NS = (1n << 63n) - 1n; // Go's Duration is an int64 of nanoseconds

function isDigit(c: string | undefined): boolean {
  return c !== undefined && c >= '0' && c <= '9';
}

/**
 * Parse a Go duration string into nanoseconds (Go `time.ParseDuration`): an optional sign, then
 * one or more `<number><unit>` with a decimal number (`1`, `1.5`, `.5`, `1.`) and a unit of
 * `ns`, `us`/`µs`/`μs`, `ms`, `s`, `m`, `h`; or the bare `0`. Values beyond int64 nanoseconds
 * (~292 years) are invalid.
 *
 * @returns nanoseconds (may be negative)
 * @throws AppError USAGE `invalid duration "<s>"`; `details` carries Go's specific reason
 *   (`time: missing unit in duration "1"`, `time: unknown unit "x" in duration "1x"`).
 */
export function parseDurationNs(s: string): bigint {
  const fail = (reason: string): AppError =>
    new AppError('USAGE', `invalid duration ${goQuote(s)}`, { details: reason });
  let rest = s;
  let neg = false;
  if (rest.startsWith('-') || rest.startsWith('+')) {
    neg = rest[0] === '-';
    rest = rest.slice(1);
  }
  if (rest === '0') return 0n;
  if (rest === '') throw fail(`time: invalid duration ${goQuote(s)}`);
  let total = 0n;
  while (rest !== '') {
    if (!(rest[0] === '.' || isDigit(rest[0]))) throw fail(`time: invalid duration ${goQuote(s)}`);
    // Integer part.
    let i = 0;
    let v = 0n;
    while (isDigit(rest[i])) {
      v = v * 10n + BigInt((rest.charCodeAt(i) - 48) as number);
      if (v > MAX_NS) throw fail(`time: invalid duration ${goQuote(s)}`);
      i++;
    }
    const pre = i > 0;
    rest = rest.slice(i);
    // Fraction: Go keeps digits while they fit and scales with float64, truncating.
    let post = false;
    let frac = 0;
    let scale = 1;
    if (rest[0] === '.') {
      rest = rest.slice(1);
      let j = 0;
      let overflow = false;
      while (isDigit(rest[j])) {
        if (!overflow) {
          const next = frac * 10 + (rest.charCodeAt(j) - 48);
          if (next > Number.MAX_SAFE_INTEGER) overflow = true;
          else {
            frac = next;
            scale *= 10;
          }
        }
        j++;
      }
      post = j > 0;
      rest = rest.slice(j);
    }
    if (!pre && !post) throw fail(`time: invalid duration ${goQuote(s)}`);
    // Unit: everything up to the next digit or '.'.
    let k = 0;
    while (k < rest.length && !(rest[k] === '.' || isDigit(rest[k]))) k++;
    if (k === 0) throw fail(`time: missing unit in duration ${goQuote(s)}`);
    const u = rest.slice(0, k);
    rest = rest.slice(k);
    const unit = NS_PER_UNIT.get(u);
    if (unit === undefined) throw fail(`time: unknown unit ${goQuote(u)} in duration ${goQuote(s)}`);
    if (v > MAX_NS / unit) throw fail(`time: invalid duration ${goQuote(s)}`);
    v *= unit;
    if (frac > 0) v += BigInt(Math.trunc(frac * (Number(unit) / scale)));
    total += v;
    if (total > MAX_NS + (neg ? 1n : 0n)) throw fail(`time: invalid duration ${goQuote(s)}`);
  }
  return neg ? -total : total;
}

/**
 * Parse a Go duration string into seconds (see {@link parseDurationNs} for the grammar).
 * `parseDuration('1h30m') === 5400`, `parseDuration('300ms') === 0.3`.
 *
 * @returns seconds, possibly fractional or negative
 * @throws AppError USAGE `invalid duration "<s>"`
 */
export function parseDuration(s: string): number {
  return Number(parseDurationNs(s)) / 1e9;
}

function fmtFrac(v: bigint, prec: number): { text: string; rest: bigint } {
  const p = 10n ** BigInt(prec);
  const digits = (v % p).toString().padStart(prec, '0').replace(/0+$/, '');
  return { text: digits === '' ? '' : '.' + digits, rest: v / p };
}

/**
 * Format seconds like Go's `time.Duration.String()` (after rounding to whole nanoseconds):
 * `5400` → `1h30m0s`, `300` → `5m0s`, `1.5` → `1.5s`, `0.3` → `300ms`, `0` → `0s`.
 */
export function formatDuration(seconds: number): string {
  let u = BigInt(Math.round(seconds * 1e9));
  const neg = u < 0n;
  if (neg) u = -u;
  let out: string;
  if (u < 1_000_000_000n) {
    if (u === 0n) return '0s';
    let unit: string;
    let prec: number;
    if (u < 1_000n) {
      unit = 'ns';
      prec = 0;
    } else if (u < 1_000_000n) {
      unit = '\u00b5s';
      prec = 3;
    } else {
      unit = 'ms';
      prec = 6;
    }
    const f = fmtFrac(u, prec);
    out = `${f.rest}${f.text}${unit}`;
  } else {
    const f = fmtFrac(u, 9);
    let secs = f.rest;
    out = `${secs % 60n}${f.text}s`;
    secs /= 60n;
    if (secs > 0n) {
      out = `${secs % 60n}m` + out;
      secs /= 60n;
      if (secs > 0n) out = `${secs}h` + out;
    }
  }
  return neg ? '-' + out : out;
}

/**
 * A compact age like kubectl's: `45s`, `5m3s`, `2h5m`, `3d4h` (whole units, truncated).
 * A negative age of a second or more (file mtime after the snapshot: the clock was stepped back)
 * shows with a minus sign (`-1h0m`), never as `0s` (issue 7); non-finite as `-`.
 */
export function formatAge(seconds: number): string {
  if (!Number.isFinite(seconds)) return '-';
  if (seconds <= -1) return `-${formatAge(-seconds)}`;
  const s = Math.max(0, Math.floor(seconds));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m${s % 60}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h${Math.floor((s % 3600) / 60)}m`;
  return `${Math.floor(s / 86400)}d${Math.floor((s % 86400) / 3600)}h`;
}
