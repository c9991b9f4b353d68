/**
 * The daemon's probe listener (`--health-address`, issue 17 item 3): 40 connections held open on
 * the metrics port — its 32-connection cap full, what any pod reaching the node could do — never
 * starve `/healthz` and `/readyz` on the probe listener, while the metrics port itself refuses the
 * next connection (the control: without the listener the probes would fail). The probe listener
 * serves no `/metrics`. Real daemon (the built bundle), real TCP on loopback.
 */
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { createConnection, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { requireOrSkip, ROOT } from '../helpers/cni.ts';
import { startTestDaemon, type TestDaemon } from '../helpers/daemon.ts';
import { METRICS_MAX_CONNECTIONS } from '../../src/daemon/metrics.ts';

const BUNDLE = join(ROOT, 'dist', 'ipwarden.cjs');
const skip = requireOrSkip(process.getuid?.() === 0 && existsSync(BUNDLE), 'root and a build (npm run build)');

/** Open a TCP connection to `port` on loopback and keep it idle; resolves once connected. */
function hold(port: number): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const s = createConnection({ host: '127.0.0.1', port }, () => resolve(s));
    s.once('error', reject);
  });
}

describe('probe listener: connections held on the metrics port never starve the probes', { skip }, () => {
  const dirs: string[] = [];
  const held: Socket[] = [];
  let d: TestDaemon | undefined;
  after(async () => {
    for (const s of held) s.destroy();
    await d?.stop();
    for (const x of dirs) rmSync(x, { recursive: true, force: true });
  });

  it('with 40 idle connections on the metrics port, /healthz and /readyz answer 200 on --health-address every time; the metrics port refuses more; the probe port has no /metrics', async () => {
    const t = mkdtempSync(join(tmpdir(), 'ipw-probes-'));
    dirs.push(t);
    d = await startTestDaemon({ socket: join(t, 'run', 'plugin.sock'), dataDir: join(t, 'data'), cniConfDir: join(t, 'net.d'), args: ['--metrics-address', '127.0.0.1:0', '--health-address', '127.0.0.1:0', '--runtime-endpoint', 'unix:///nonexistent/cri.sock'] });
    const line = await d.waitForLog((l) => l.msg === 'metrics listening');
    const port = (a: unknown): number => Number(String(a).split(':').pop());
    const metricsPort = port(line['metricsAddress']);
    const healthPort = port(line['healthAddress']);
    assert.ok(metricsPort > 0 && healthPort > 0 && metricsPort !== healthPort, JSON.stringify(line));
    await d.waitForLog((l) => l.msg === 'daemon started');

    for (let i = 0; i < 40; i++) held.push(await hold(metricsPort).catch(() => createConnection({ host: '127.0.0.1', port: metricsPort })));
    // The server holds METRICS_MAX_CONNECTIONS of them; a request on the metrics port now fails
    // (Node destroys connections over maxConnections): what the kubelet's probes met before.
    const viaMetrics = await fetch(`http://127.0.0.1:${metricsPort}/healthz`, { signal: AbortSignal.timeout(5_000) }).then(
      (r) => `status ${r.status}`,
      (e: unknown) => `failed: ${e instanceof Error ? e.name : String(e)}`,
    );
    assert.match(viaMetrics, /^failed: /, `the metrics port is full (${METRICS_MAX_CONNECTIONS} connections), so the control fails`);

    const answers: string[] = [];
    for (let i = 0; i < 10; i++) {
      for (const path of ['/healthz', '/readyz']) {
        const r = await fetch(`http://127.0.0.1:${healthPort}${path}`, { signal: AbortSignal.timeout(30_000) });
        answers.push(`${path} ${r.status} ${await r.text()}`);
      }
    }
    assert.deepEqual(answers, Array.from({ length: 10 }, () => ['/healthz 200 ok\n', '/readyz 200 ok\n']).flat());
    const m = await fetch(`http://127.0.0.1:${healthPort}/metrics`);
    assert.deepEqual([m.status, await m.text()], [404, 'not found: this is the probe listener, try /healthz, /readyz\n']);
  });
});
