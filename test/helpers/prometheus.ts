/**
 * A real Prometheus (Debian's `prometheus` package) on loopback for tests: a scrape config with
 * one target, a temporary TSDB, a free port; `query()` goes through Prometheus's HTTP API.
 * Stopped (by pid) and its files removed by `stop()`, also when the test process exits.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

/** Debian's Prometheus server. */
export const PROMETHEUS = '/usr/bin/prometheus';
/** Debian's promtool. */
export const PROMTOOL = '/usr/bin/promtool';

/** A running Prometheus. */
export interface TestPrometheus {
  readonly url: string;
  /** Instant query; the `data.result` array of the API answer. */
  query(expr: string): Promise<Array<{ metric: Record<string, string>; value: [number, string] }>>;
  /** Wait until `expr` returns a result for which `ok` holds (polls; bounded by `timeoutMs`). */
  waitFor(expr: string, ok: (r: Array<{ metric: Record<string, string>; value: [number, string] }>) => boolean, timeoutMs?: number): Promise<Array<{ metric: Record<string, string>; value: [number, string] }>>;
  stop(): Promise<void>;
  /** Prometheus's own log (stderr), for failure messages. */
  log(): string;
}

/** A free TCP port on 127.0.0.1 (bind 0, read it, close). */
export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}

/** True when Prometheus is installed. */
export function havePrometheus(): boolean {
  return existsSync(PROMETHEUS) && existsSync(PROMTOOL);
}

/**
 * What the Prometheus Operator makes of a ServiceMonitor endpoint, for a static target: its
 * `honorLabels`, and its `replace` relabelings, whose source labels (`__meta_kubernetes_…`) the
 * target carries as static labels with the values given in `meta`.
 */
export interface ScrapeAsServiceMonitor {
  readonly honorLabels: boolean;
  readonly relabelings: ReadonlyArray<{ readonly sourceLabels: readonly string[]; readonly targetLabel: string }>;
  /** Source label → value, as Kubernetes service discovery would give it (`__meta_kubernetes_pod_node_name: worker-1`). */
  readonly meta: Readonly<Record<string, string>>;
}

/**
 * Start Prometheus scraping `target` (`host:port`) every second as job `ipwarden`; with `sm`, the
 * scrape config carries the ServiceMonitor's `honor_labels` and relabelings (the shipped
 * deploy/components/monitoring/servicemonitor.yaml, read by the test).
 */
export async function startPrometheus(target: string, sm?: ScrapeAsServiceMonitor): Promise<TestPrometheus> {
  const dir = mkdtempSync(join(tmpdir(), 'ipwarden-prom-'));
  const port = await freePort();
  const lines = ['global:', '  scrape_interval: 1s', '  evaluation_interval: 1s', 'scrape_configs:', '  - job_name: ipwarden'];
  if (sm !== undefined) lines.push(`    honor_labels: ${sm.honorLabels}`);
  lines.push('    static_configs:', `      - targets: ['${target}']`);
  if (sm !== undefined) {
    lines.push('        labels:', ...Object.entries(sm.meta).map(([k, v]) => `          ${k}: ${JSON.stringify(v)}`));
    lines.push('    relabel_configs:');
    for (const r of sm.relabelings) lines.push(`      - source_labels: [${r.sourceLabels.join(', ')}]`, `        target_label: ${r.targetLabel}`, '        action: replace');
  }
  writeFileSync(join(dir, 'prometheus.yml'), [...lines, ''].join('\n'));
  const p: ChildProcess = spawn(
    PROMETHEUS,
    [`--config.file=${join(dir, 'prometheus.yml')}`, `--storage.tsdb.path=${join(dir, 'data')}`, `--web.listen-address=127.0.0.1:${port}`, '--log.level=warn'],
    { stdio: ['ignore', 'ignore', 'pipe'], env: { PATH: '/usr/bin:/bin', HOME: dir } },
  );
  let log = '';
  p.stderr?.on('data', (c: Buffer) => (log = (log + c.toString('utf8')).slice(-20_000)));
  let exited = false;
  p.on('exit', () => (exited = true));
  const kill = (): void => {
    if (!exited && p.pid !== undefined) {
      try {
        process.kill(p.pid, 'SIGKILL');
      } catch {
        // already gone
      }
    }
  };
  process.on('exit', kill);
  const url = `http://127.0.0.1:${port}`;
  const query = async (expr: string): Promise<Array<{ metric: Record<string, string>; value: [number, string] }>> => {
    const r = await fetch(`${url}/api/v1/query?query=${encodeURIComponent(expr)}`);
    const j = (await r.json()) as { status: string; data?: { result: Array<{ metric: Record<string, string>; value: [number, string] }> }; error?: string };
    if (j.status !== 'success') throw new Error(`prometheus query ${expr}: ${j.error ?? r.status}`);
    return j.data?.result ?? [];
  };
  const waitFor: TestPrometheus['waitFor'] = async (expr, ok, timeoutMs = 60_000) => {
    const until = Date.now() + timeoutMs;
    let last: Array<{ metric: Record<string, string>; value: [number, string] }> = [];
    let lastErr = '';
    for (;;) {
      if (exited) throw new Error(`prometheus exited: ${log}`);
      try {
        last = await query(expr);
        if (ok(last)) return last;
      } catch (e) {
        lastErr = e instanceof Error ? e.message : String(e);
      }
      if (Date.now() > until) throw new Error(`prometheus: ${expr} did not come to the expected value in ${timeoutMs} ms; last ${JSON.stringify(last)} ${lastErr}\n${log}`);
      await new Promise((r) => setTimeout(r, 250));
    }
  };
  // Ready when its own API answers.
  await waitFor('vector(1)', (r) => r.length === 1);
  return {
    url,
    query,
    waitFor,
    log: () => log,
    stop: async () => {
      if (!exited && p.pid !== undefined) {
        const gone = new Promise<void>((r) => p.once('exit', () => r()));
        process.kill(p.pid, 'SIGTERM');
        await gone;
      }
      process.off('exit', kill);
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
