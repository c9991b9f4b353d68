import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Confirmations, DISTRUST_MIN, jitteredDelay, type Candidate } from '../../src/reconcile/confirm.ts';

const yes = (): boolean => true;
const cand = (ip: string, mtimeMs = 1_000, owner = `c-${ip}\r\neth0`, network = 'n1'): Candidate => ({ network, ip, owner, mtimeMs });

test('a candidate is released only after two observations at least the grace period apart', () => {
  const c = new Confirmations(60);
  const a = cand('10.87.0.2');
  assert.deepEqual(c.observe([a], 0, yes).release, []);
  assert.deepEqual(c.observe([a], 59_999, yes).release, []);
  assert.deepEqual(c.observe([a], 60_000, yes).release, [a]);
});

test('a candidate missing from one pass starts over', () => {
  const c = new Confirmations(10);
  const a = cand('10.87.0.2');
  c.observe([a], 0, yes);
  c.observe([], 5_000, yes);
  assert.equal(c.size, 0);
  assert.deepEqual(c.observe([a], 11_000, yes).waiting, [a]);
  assert.deepEqual(c.observe([a], 20_999, yes).release, []);
  assert.deepEqual(c.observe([a], 21_000, yes).release, [a]);
});

test('a changed owner or file time restarts the clock', () => {
  const c = new Confirmations(10);
  c.observe([cand('10.87.0.2', 1_000, 'a\r\neth0')], 0, yes);
  assert.deepEqual(c.observe([cand('10.87.0.2', 1_000, 'b\r\neth0')], 10_000, yes).release, []);
  assert.deepEqual(c.observe([cand('10.87.0.2', 2_000, 'b\r\neth0')], 20_000, yes).release, []);
  assert.equal(c.observe([cand('10.87.0.2', 2_000, 'b\r\neth0')], 30_000, yes).release.length, 1);
});

test('a clock that goes back does not confirm anything', () => {
  const c = new Confirmations(10);
  const a = cand('10.87.0.2');
  c.observe([a], 100_000, yes);
  const d = c.observe([a], 50_000, yes);
  assert.deepEqual(d.release, []);
  assert.deepEqual(d.waiting, [a]);
  assert.deepEqual(c.observe([a], 59_999, yes).release, []);
  assert.deepEqual(c.observe([a], 60_000, yes).release, [a]);
});

test('the cap releases the oldest files first and rolls the rest over', () => {
  const c = new Confirmations(0, 3);
  const all = [5, 1, 4, 2, 3].map((m) => cand(`10.87.0.${m + 1}`, m * 1000));
  c.observe(all, 0, yes);
  const d1 = c.observe(all, 1, yes);
  assert.deepEqual(d1.release.map((x) => x.mtimeMs), [1000, 2000, 3000]);
  assert.deepEqual(d1.deferred.map((x) => x.mtimeMs), [4000, 5000]);
  for (const r of d1.release) c.forget(r.network, r.ip);
  const rest = all.filter((x) => !d1.release.includes(x));
  const d2 = c.observe(rest, 2, yes);
  assert.deepEqual(d2.release.map((x) => x.mtimeMs), [4000, 5000]);
});

test('a network whose reservations the runtime owns none of, with many candidates, is not trusted alone', () => {
  const c = new Confirmations(0);
  const many = Array.from({ length: DISTRUST_MIN }, (_, i) => cand(`10.87.0.${i + 2}`));
  const other = cand('10.87.9.2', 1_000, 'x\r\neth0', 'n2');
  const trusted = (n: string): boolean => n === 'n2';
  c.observe([...many, other], 0, trusted);
  const d = c.observe([...many, other], 1, trusted);
  // n1 is held whole; n2 (trusted, and below the minimum anyway) goes on.
  assert.deepEqual(d.release, [other]);
  assert.equal(d.deferred.length, DISTRUST_MIN);
  assert.equal(d.held, "the runtime's list owns no reservation of n1, where 8 would be released: not trusted alone");
  // One fewer candidate in n1: below the minimum, released.
  assert.equal(c.observe(many.slice(1), 2, () => false).release.length, DISTRUST_MIN - 1);
  // The runtime owns something in n1: trusted.
  const e = new Confirmations(0);
  e.observe(many, 0, yes);
  assert.equal(e.observe(many, 1, yes).release.length, DISTRUST_MIN);
});

test('bad settings are refused', () => {
  assert.throws(() => new Confirmations(-1), RangeError);
  assert.throws(() => new Confirmations(1, 0), RangeError);
  assert.throws(() => new Confirmations(Number.NaN), RangeError);
});

test('jitteredDelay stays within ±10% of the interval', () => {
  assert.equal(jitteredDelay(60, () => 0), 54);
  assert.equal(jitteredDelay(60, () => 0.5), 60);
  assert.ok(Math.abs(jitteredDelay(60, () => 0.999999) - 66) < 1e-3);
});

test('heal on arrival: in a full range set (urgent) the second observation may come min(grace, 30 s) after the first; urgentDueInMs says when', () => {
  const c = new Confirmations(300);
  const a = cand('10.87.0.2');
  const b = cand('10.87.0.3', 1_000, 'c-b\r\neth0', 'n2');
  const full = (n: string): boolean => n === 'n1';
  const first = c.observe([a, b], 0, yes, full);
  assert.deepEqual(first.waiting, [a, b]);
  assert.equal(first.urgentDueInMs, 30_000);
  const mid = c.observe([a, b], 12_000, yes, full);
  assert.deepEqual(mid.release, []);
  assert.equal(mid.urgentDueInMs, 18_000);
  const due = c.observe([a, b], 30_000, yes, full);
  assert.deepEqual(due.release, [a]);
  assert.deepEqual(due.waiting, [b], 'a network that is not full still waits its whole grace period');
  assert.equal(due.urgentDueInMs, null);
  assert.deepEqual(c.observe([b], 299_999, yes, full).release, []);
  assert.deepEqual(c.observe([b], 300_000, yes, full).release, [b]);
});

test('heal on arrival: a grace shorter than 30 s is the gap; a changed owner restarts the clock; distrust (rule 3) still holds', () => {
  const c = new Confirmations(2);
  const urgent = (): boolean => true;
  assert.equal(c.observe([cand('10.87.0.2')], 0, yes, urgent).urgentDueInMs, 2_000);
  assert.deepEqual(c.observe([cand('10.87.0.2', 1_000, 'other\r\neth0')], 2_000, yes, urgent).release, []);
  assert.deepEqual(c.observe([cand('10.87.0.2', 1_000, 'other\r\neth0')], 4_000, yes, urgent).release, [cand('10.87.0.2', 1_000, 'other\r\neth0')]);
  const many = Array.from({ length: DISTRUST_MIN }, (_, i) => cand(`10.87.1.${i + 2}`));
  const d = new Confirmations(2);
  d.observe(many, 0, () => false, urgent);
  const held = d.observe(many, 2_000, () => false, urgent);
  assert.deepEqual(held.release, []);
  assert.equal(held.deferred.length, DISTRUST_MIN);
});
