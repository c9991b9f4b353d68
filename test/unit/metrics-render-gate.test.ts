/**
 * The scrape pacing of the daemon's metrics endpoint (issue 17 item 3, "the request path must not
 * slow under a scrape flood"): {@link RenderGate} on a fake clock (renders shared, spaced, fresh),
 * {@link DaemonMetrics.exposition} through it, and the HTTP listener's pacing of every answer and
 * its refusal of pipelined requests (real server on loopback).
 */
import assert from 'node:assert/strict';
import { createConnection } from 'node:net';
import { describe, it } from 'node:test';
import { ANSWER_INTERVAL_MS, DaemonMetrics, METRICS_RENDER_INTERVAL_MS, RenderGate, startMetricsServer } from '../../src/daemon/metrics.ts';
import { FakeGateClock as FakeClock, settle } from '../helpers/fake-gate-clock.ts';


/** Tracks a promise's outcome for assertions without awaiting it. */
function watch<T>(p: Promise<T>): { readonly state: () => string } {
  let state = 'pending';
  p.then(
    (v) => (state = `value ${String(v)}`),
    (e: unknown) => (state = `error ${e instanceof Error ? e.message : String(e)}`),
  );
  return { state: () => state };
}

describe('RenderGate', () => {
  it('callers before a render begins share it; a caller during a render gets the next one, begun one interval after the previous began', async () => {
    const clock = new FakeClock();
    const finish: Array<(v: number) => void> = [];
    let renders = 0;
    const gate = new RenderGate(
      () =>
        new Promise<number>((resolve) => {
          renders++;
          finish.push(resolve);
        }),
      1000,
      clock,
    );
    const a = watch(gate.get());
    const b = watch(gate.get());
    await settle();
    assert.deepEqual([renders, gate.renders, a.state(), b.state()], [1, 1, 'pending', 'pending']);
    await clock.advanceTo(10);
    const c = watch(gate.get()); // the first render is running: c must not get it (it may miss c's writes)
    await settle();
    finish[0]?.(1);
    await settle();
    assert.deepEqual([renders, a.state(), b.state(), c.state()], [1, 'value 1', 'value 1', 'pending']);
    await clock.advanceTo(999);
    assert.equal(renders, 1, 'the next render waits for one interval after the first began');
    const d = watch(gate.get()); // before the second render began: shares it
    await clock.advanceTo(1000);
    assert.equal(renders, 2);
    const e = watch(gate.get()); // after it began: the third
    finish[1]?.(2);
    await settle();
    assert.deepEqual([c.state(), d.state(), e.state()], ['value 2', 'value 2', 'pending']);
    await clock.advanceTo(2000);
    finish[2]?.(3);
    await settle();
    assert.deepEqual([renders, e.state()], [3, 'value 3']);
    await clock.advanceTo(5000);
    const f = watch(gate.get()); // idle for longer than the interval: renders at once
    await settle();
    finish[3]?.(4);
    await settle();
    assert.deepEqual([renders, f.state()], [4, 'value 4']);
  });

  it('a render that waits for its predecessor still starts only one interval after the predecessor began, and never two at once', async () => {
    const clock = new FakeClock();
    const finish: Array<() => void> = [];
    let running = 0;
    let most = 0;
    const starts: number[] = [];
    const gate = new RenderGate(
      () =>
        new Promise<void>((resolve) => {
          running++;
          most = Math.max(most, running);
          starts.push(clock.now());
          finish.push(() => {
            running--;
            resolve();
          });
        }),
      1000,
      clock,
    );
    void gate.get();
    await settle();
    void gate.get();
    await clock.advanceTo(2500); // the first render runs 2.5 s (a slow etcd read of the pool gauges)
    assert.deepEqual(starts, [0]);
    finish[0]?.();
    await settle();
    assert.deepEqual(starts, [0, 2500], 'started as soon as the first ended (more than an interval after it began)');
    finish[1]?.();
    await settle();
    assert.equal(most, 1);
  });

  it('under a flood (a caller every 7 ms for 10 s) every caller gets a render begun at or after its call, and at most floor(10 s / interval) + 1 renders run', async () => {
    const clock = new FakeClock();
    const starts: number[] = [];
    const gate = new RenderGate(
      () => {
        starts.push(clock.now());
        return Promise.resolve(clock.now());
      },
      METRICS_RENDER_INTERVAL_MS,
      clock,
    );
    const calls: Array<{ at: number; got: number | null }> = [];
    for (let t = 0; t <= 10_000; t += 7) {
      await clock.advanceTo(t);
      const c: { at: number; got: number | null } = { at: t, got: null };
      calls.push(c);
      void gate.get().then((v) => (c.got = v));
    }
    await clock.advanceTo(20_000);
    await settle();
    assert.equal(calls.length, 1429);
    assert.deepEqual(calls.filter((c) => c.got === null || c.got < c.at), [], 'every caller answered by a render begun at or after its call');
    const within = starts.filter((t) => t <= 10_000);
    assert.ok(within.length <= Math.floor(10_000 / METRICS_RENDER_INTERVAL_MS) + 1, `renders during the flood: ${within.join(', ')}`);
    assert.equal(starts.length - within.length, 1, 'one more render, after the flood, for the callers of its last interval');
    assert.deepEqual(starts.slice(1).filter((t, i) => t - (starts[i] as number) < METRICS_RENDER_INTERVAL_MS), [], `spaced: ${starts.join(', ')}`);
    assert.equal(gate.renders, starts.length);
  });

  it('a failed render rejects every caller that shared it; the next caller gets a new render, still spaced', async () => {
    const clock = new FakeClock();
    let n = 0;
    const gate = new RenderGate(() => (++n === 1 ? Promise.reject(new Error('etcd gone')) : Promise.resolve(n)), 1000, clock);
    const a = watch(gate.get());
    const b = watch(gate.get());
    await settle();
    assert.deepEqual([a.state(), b.state()], ['error etcd gone', 'error etcd gone']);
    const c = watch(gate.get());
    await settle();
    assert.equal(c.state(), 'pending');
    await clock.advanceTo(1000);
    assert.deepEqual([c.state(), n], ['value 2', 2]);
  });
});

describe('DaemonMetrics.exposition', () => {
  it('counts its renders in ipwarden_metrics_renders_total and shows what was counted before the scrape was asked, even right after another scrape', async () => {
    const clock = new FakeClock();
    const m = new DaemonMetrics({ gateClock: clock });
    const first = (await m.exposition()).toString('utf8');
    assert.match(first, /^# TYPE ipwarden_metrics_renders_total counter$/m);
    assert.match(first, /^ipwarden_metrics_renders_total 1$/m);
    assert.doesNotMatch(first, /^ipwarden_cni_requests_total\{/m);
    m.recordCniRequest('ADD', 'ok', 0.004);
    const second = watch(m.exposition().then((b) => b.toString('utf8')));
    await settle();
    assert.equal(second.state(), 'pending', 'one interval after the first render');
    await clock.advanceTo(METRICS_RENDER_INTERVAL_MS);
    assert.match(second.state(), /^ipwarden_metrics_renders_total 2$/m);
    assert.match(second.state(), /^ipwarden_cni_requests_total\{command="ADD",path="daemon",result="ok"\} 1$/m);
  });
});

/** The HTTP/1.1 responses in `raw` (status codes, in order); bodies skipped by Content-Length. */
function statuses(raw: string): number[] {
  const out: number[] = [];
  let rest = raw;
  for (;;) {
    const m = /^HTTP\/1\.1 (\d{3}) [^\r]*\r\n((?:[^\r]+\r\n)*)\r\n/.exec(rest);
    if (m === null) return out;
    out.push(Number(m[1]));
    const len = Number(/^content-length: (\d+)\r$/im.exec(m[2] ?? '')?.[1] ?? 0);
    rest = rest.slice(m[0].length + len);
  }
}

/** Send each of `requests` on one connection once the previous answer is complete (or all at once with `pipelined`); resolves with what came back when the server closes or all are answered. */
function exchange(port: number, requests: string[], pipelined: boolean): Promise<{ raw: string; closedByServer: boolean }> {
  return new Promise((resolve, reject) => {
    const sock = createConnection({ host: '127.0.0.1', port });
    let raw = '';
    let sent = 0;
    const send = (): void => {
      if (pipelined) {
        sock.write(requests.join(''));
        sent = requests.length;
      } else sock.write(requests[sent++] as string);
    };
    sock.on('connect', send);
    sock.on('data', (c: Buffer) => {
      raw += c.toString('latin1');
      const n = statuses(raw).length;
      if (n === requests.length) {
        sock.destroy();
        resolve({ raw, closedByServer: false });
      } else if (!pipelined && n === sent) send();
    });
    sock.on('close', () => resolve({ raw, closedByServer: true }));
    sock.on('error', reject);
  });
}

describe('the metrics listener paces its answers', () => {
  const health = { live: () => ({ ok: true, why: '' }), ready: () => ({ ok: true, why: '' }) };

  it('16 clients scraping as fast as they are answered: every answer a full exposition, each client sees strictly newer renders, renders shared (at most one per interval)', { timeout: 60_000 }, async () => {
    const m = new DaemonMetrics();
    m.recordCniRequest('ADD', 'ok', 0.004);
    const s = await startMetricsServer({ host: '127.0.0.1', port: 0 }, m, health);
    try {
      const families = (text: string): string[] => [...text.matchAll(/^# TYPE (\S+) /gm)].map((x) => x[1] as string);
      const expected = families(await m.text());
      const t0 = performance.now();
      const seen = await Promise.all(
        Array.from({ length: 16 }, async () => {
          const values: number[] = [];
          for (let i = 0; i < 3; i++) {
            const r = await fetch(`http://127.0.0.1:${s.address.port}/metrics`);
            const text = await r.text();
            assert.equal(r.status, 200);
            assert.equal(r.headers.get('content-length'), String(Buffer.byteLength(text)));
            assert.deepEqual(families(text), expected);
            assert.ok(text.endsWith('\n'));
            assert.match(text, /^ipwarden_cni_requests_total\{command="ADD",path="daemon",result="ok"\} 1$/m);
            values.push(Number(/^ipwarden_metrics_renders_total (\d+)$/m.exec(text)?.[1]));
          }
          return values;
        }),
      );
      const elapsed = performance.now() - t0;
      for (const v of seen) assert.ok(v[0] as number < (v[1] as number) && (v[1] as number) < (v[2] as number), `a client's renders strictly increase: ${v.join(', ')}`);
      const renders = new Set(seen.flat());
      // Renders began in the window [t0, t0 + elapsed]; the first one (m.text() above) was before it.
      assert.ok(renders.size <= Math.floor(elapsed / METRICS_RENDER_INTERVAL_MS) + 1, `${renders.size} renders in ${elapsed.toFixed(0)} ms`);
      assert.ok(renders.size >= 3, 'three rounds need three renders at least');
    } finally {
      await s.close();
    }
  });

  it('sequential requests on one keep-alive connection are all answered; a pipelined second request closes the connection unanswered', { timeout: 30_000 }, async () => {
    const m = new DaemonMetrics();
    const s = await startMetricsServer({ host: '127.0.0.1', port: 0 }, m, health);
    try {
      const get = (path: string): string => `GET ${path} HTTP/1.1\r\nHost: x\r\n\r\n`;
      const seq = await exchange(s.address.port, [get('/healthz'), get('/readyz'), get('/metrics'), get('/nope'), get('/healthz')], false);
      assert.deepEqual([statuses(seq.raw), seq.closedByServer], [[200, 200, 200, 404, 200], false]);
      const piped = await exchange(s.address.port, [get('/healthz'), get('/healthz')], true);
      assert.deepEqual([piped.raw, piped.closedByServer], ['', true]);
      assert.ok(ANSWER_INTERVAL_MS <= 100, 'a probe on this listener waits at most 100 ms for its batch');
    } finally {
      await s.close();
    }
  });
});
