import { test } from 'node:test';
import assert from 'node:assert/strict';
import { appendFileSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { DaemonMetrics, FallbackLogReader, startMetricsServer } from '../../src/daemon/metrics.ts';

const counts = (o: Partial<Record<'live' | 'grace' | 'leaked' | 'corrupt' | 'unknown' | 'free', number>>) => ({
  live: 0, grace: 0, leaked: 0, corrupt: 0, unknown: 0, free: 0, ...o,
});

test('a pass sets the gauges, removes series of range sets that went away, and counts releases and errors', async () => {
  const m = new DaemonMetrics();
  m.recordPass({
    rangeSets: [
      { network: 'a', rangeSet: 0, capacity: 253, counts: counts({ live: 3, leaked: 2, free: 248 }) },
      { network: 'b', rangeSet: 1, capacity: 10, counts: counts({ unknown: 10 }) },
    ],
    candidates: new Map([['a', 2]]),
    released: [{ network: 'a', reason: 'leaked' }, { network: 'a', reason: 'leaked' }, { network: 'a', reason: 'corrupt' }],
    errors: [],
    durationSeconds: 0.2,
    endedAtSeconds: 1_700_000_000,
  });
  let t = await m.text();
  assert.match(t, /^ipwarden_addresses\{network="a",range_set="0",state="live"\} 3$/m);
  assert.match(t, /^ipwarden_addresses\{network="a",range_set="0",state="free"\} 248$/m);
  assert.match(t, /^ipwarden_addresses\{network="b",range_set="1",state="unknown"\} 10$/m);
  assert.match(t, /^ipwarden_range_set_capacity\{network="a",range_set="0"\} 253$/m);
  assert.match(t, /^ipwarden_releases_total\{network="a",reason="leaked"\} 2$/m);
  assert.match(t, /^ipwarden_releases_total\{network="a",reason="corrupt"\} 1$/m);
  assert.match(t, /^ipwarden_release_candidates\{network="a"\} 2$/m);
  assert.match(t, /^ipwarden_last_reconcile_success_timestamp_seconds 1700000000$/m);
  assert.match(t, /^ipwarden_reconcile_duration_seconds_count 1$/m);
  m.recordPass({
    rangeSets: [{ network: 'a', rangeSet: 0, capacity: 253, counts: counts({ live: 3, free: 250 }) }],
    candidates: new Map(),
    released: [],
    errors: [{ kind: 'runtime' }],
    durationSeconds: 0.1,
    endedAtSeconds: 1_700_000_060,
  });
  t = await m.text();
  assert.doesNotMatch(t, /network="b"/);
  assert.doesNotMatch(t, /^ipwarden_release_candidates\{/m);
  assert.match(t, /^ipwarden_reconcile_errors_total\{kind="runtime"\} 1$/m);
  assert.match(t, /^ipwarden_last_reconcile_success_timestamp_seconds 1700000000$/m, 'a pass with errors is not a success');
  assert.match(t, /^ipwarden_releases_total\{network="a",reason="leaked"\} 2$/m, 'counters keep their value');
});

test('CNI requests are counted per command, path and result; unknown commands as other', async () => {
  const m = new DaemonMetrics();
  m.recordCniRequest('ADD', 'ok', 0.002);
  m.recordCniRequest('ADD', 'ok', 0.003);
  m.recordCniRequest('DEL', 'dropped', 0);
  m.recordCniRequest('BOGUS', 'error', 0.001);
  const t = await m.text();
  assert.match(t, /^ipwarden_cni_requests_total\{command="ADD",path="daemon",result="ok"\} 2$/m);
  assert.match(t, /^ipwarden_cni_requests_total\{command="DEL",path="daemon",result="dropped"\} 1$/m);
  assert.match(t, /^ipwarden_cni_requests_total\{command="other",path="daemon",result="error"\} 1$/m);
  assert.match(t, /^ipwarden_cni_request_duration_seconds_count\{command="ADD"\} 2$/m);
  assert.doesNotMatch(t, /ipwarden_cni_request_duration_seconds_count\{command="DEL"\}/);
});

test('the fallback log is read incrementally, partial lines wait, malformed lines are skipped, a replaced file starts over', () => {
  const dir = mkdtempSync(join(tmpdir(), 'ipwarden-metrics-'));
  try {
    const p = join(dir, 'standalone-requests.log');
    const r = new FallbackLogReader(p);
    assert.deepEqual(r.readNew(), []);
    writeFileSync(p, '1700000000 ADD ok\n1700000001 DEL error\ngarbage line\n1700000002 CHE');
    assert.deepEqual(r.readNew(), [{ command: 'ADD', result: 'ok' }, { command: 'DEL', result: 'error' }]);
    appendFileSync(p, 'CK ok\n');
    assert.deepEqual(r.readNew(), [{ command: 'CHECK', result: 'ok' }]);
    assert.deepEqual(r.readNew(), []);
    rmSync(p);
    writeFileSync(p, '1700000003 ADD error\n');
    assert.deepEqual(r.readNew(), [{ command: 'ADD', result: 'error' }]);
    // Never through a symlink.
    rmSync(p);
    const other = join(dir, 'other');
    writeFileSync(other, '1 ADD ok\n2 ADD ok\n');
    symlinkSync(other, p);
    assert.deepEqual(new FallbackLogReader(p).readNew(), []);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('the endpoint serves /metrics, /healthz, /readyz with the health answers, 404 and 405 otherwise, and closes idempotently', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'ipwarden-metrics-'));
  const m = new DaemonMetrics();
  const log = join(dir, 'standalone-requests.log');
  writeFileSync(log, '1700000000 ADD ok\n1700000001 ADD ok\n');
  m.watchFallbackLog(log);
  let ready = false;
  const s = await startMetricsServer({ host: '127.0.0.1', port: 0 }, m, {
    live: () => ({ ok: true, why: '' }),
    ready: () => (ready ? { ok: true, why: '' } : { ok: false, why: 'plugin socket not listening yet' }),
  });
  try {
    const base = `http://127.0.0.1:${s.address.port}`;
    const metrics = await fetch(`${base}/metrics`);
    assert.equal(metrics.status, 200);
    assert.match(metrics.headers.get('content-type') ?? '', /^text\/plain; version=0\.0\.4/);
    assert.match(await metrics.text(), /^ipwarden_cni_requests_total\{command="ADD",path="standalone",result="ok"\} 2$/m);
    assert.equal((await fetch(`${base}/healthz`)).status, 200);
    const nr = await fetch(`${base}/readyz`);
    assert.equal(nr.status, 503);
    assert.equal(await nr.text(), 'plugin socket not listening yet\n');
    ready = true;
    assert.equal((await fetch(`${base}/readyz`)).status, 200);
    assert.equal((await fetch(`${base}/nope`)).status, 404);
    assert.equal((await fetch(`${base}/metrics`, { method: 'POST' })).status, 405);
  } finally {
    await s.close();
    await s.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

test('a port in use is a rejected start, not a crash', async () => {
  const m = new DaemonMetrics();
  const health = { live: () => ({ ok: true, why: '' }), ready: () => ({ ok: true, why: '' }) };
  const a = await startMetricsServer({ host: '127.0.0.1', port: 0 }, m, health);
  try {
    await assert.rejects(startMetricsServer({ host: '127.0.0.1', port: a.address.port }, m, health), /EADDRINUSE/);
  } finally {
    await a.close();
  }
});

test('the endpoint holds at most METRICS_MAX_CONNECTIONS connections: more are closed at once', { timeout: 30_000 }, async () => {
  const { createConnection } = await import('node:net');
  const { METRICS_MAX_CONNECTIONS } = await import('../../src/daemon/metrics.ts');
  const m = new DaemonMetrics();
  const s = await startMetricsServer({ host: '127.0.0.1', port: 0 }, m, { live: () => ({ ok: true, why: '' }), ready: () => ({ ok: true, why: '' }) });
  const socks: Array<import('node:net').Socket> = [];
  try {
    const extra = 8;
    let closed = 0;
    const allClosed = new Promise<void>((resolve) => {
      for (let i = 0; i < METRICS_MAX_CONNECTIONS + extra; i++) {
        const c = createConnection({ host: '127.0.0.1', port: s.address.port });
        c.on('error', () => undefined);
        c.on('close', () => {
          if (++closed === extra) resolve();
        });
        socks.push(c);
      }
    });
    await allClosed;
    assert.equal(closed, extra);
  } finally {
    for (const c of socks) c.destroy();
    await s.close();
  }
});
