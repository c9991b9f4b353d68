/**
 * The daemon's view of a reclaim inside an ADD it served (src/daemon/loop.ts `onReclaim`,
 * src/daemon/metrics.ts `recordReclaim`): what the black-box test
 * (test/blackbox/daemon-reclaim-observed.test.ts) cannot reach cheaply — a range set no pass saw
 * full observes the reclaim's own time; a reclaim for a requested address is no heal; each
 * release counts under its verdict. The loop runs in-process with no network (an empty
 * configuration directory), its monotonic clock injected; nothing waits on time.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { loopOptions } from '../helpers/loop-options.ts';
import { createLogger } from '../../src/daemon/log.ts';
import { reconcileLoopPart, type ReconcileLoop } from '../../src/daemon/loop.ts';
import { DaemonMetrics } from '../../src/daemon/metrics.ts';
import type { ReclaimEvent } from '../../src/daemon/plugin-server.ts';
import { NOTHING_IN_USE } from '../../src/reconcile/evidence.ts';

/** `name` samples of the registry's text, `name{labels}` → value. */
async function samples(m: DaemonMetrics, name: string): Promise<Map<string, number>> {
  const out = new Map<string, number>();
  for (const l of (await m.registry.getSingleMetricAsString(name)).split('\n')) {
    const x = /^([a-z_:][a-z0-9_:]*(?:\{.*\})?) (\S+)$/i.exec(l);
    if (x !== null) out.set(x[1] as string, Number(x[2]));
  }
  return out;
}

describe('a reclaim inside an ADD the daemon served: heal clock and release counter', () => {
  it('exhaustion in a range set no pass saw full observes the reclaim time; a requested address is no heal; releases count per verdict', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'ipwarden-reclaim-heal-'));
    let loop: ReconcileLoop | undefined;
    try {
      const metrics = new DaemonMetrics();
      const lines: Array<Record<string, unknown>> = [];
      const log = createLogger('info', { stream: { write: (s: string) => void lines.push(JSON.parse(s) as Record<string, unknown>) } });
      const options = loopOptions(dir, 'info');
      const part = await reconcileLoopPart(
        {
          reconcile: {
            env: { CONTAINER_RUNTIME_ENDPOINT: 'unix:///run/ipwarden-reclaim-heal-unit.sock' },
            now: () => 1_700_000_000_000,
            evidence: () => NOTHING_IN_USE,
            sandboxSource: (endpoint) => ({ endpoint, list: async () => [], close: () => undefined }),
          },
          metrics,
          random: () => 0.5,
          monotonic: () => 5_000,
        },
        (l) => (loop = l),
      )({ options, log });
      await (loop as ReconcileLoop).passNow('test');
      const event = (trigger: ReclaimEvent['trigger'], released: ReclaimEvent['released']): ReclaimEvent => ({ network: 'n1', dataDir: '/var/lib/cni/networks', containerId: 'c-new', trigger, released, durationSeconds: 0.25 });

      const onReclaim = part.hooks?.onReclaim;
      assert.equal(typeof onReclaim, 'function');
      onReclaim?.(event('requested-address', [{ ip: '10.2.0.9', verdict: 'leaked' }]));
      assert.deepEqual(await samples(metrics, 'ipwarden_heal_seconds'), new Map([...[0.5, 1, 2, 5, 10, 20, 35, 60, 120, 300, 600].map((b) => [`ipwarden_heal_seconds_bucket{le="${b}"}`, 0] as const), ['ipwarden_heal_seconds_bucket{le="+Inf"}', 0], ['ipwarden_heal_seconds_sum', 0], ['ipwarden_heal_seconds_count', 0]]));

      onReclaim?.(event('exhaustion', [{ ip: '10.2.0.2', verdict: 'leaked' }, { ip: '10.2.0.3', verdict: 'corrupt' }]));
      const heal = await samples(metrics, 'ipwarden_heal_seconds');
      assert.deepEqual([heal.get('ipwarden_heal_seconds_count'), heal.get('ipwarden_heal_seconds_sum'), heal.get('ipwarden_heal_seconds_bucket{le="0.5"}')], [1, 0.25, 1]);
      assert.deepEqual(
        lines.filter((l) => l['msg'] === 'range set healed').map((l) => [l['part'], l['network'], l['healSeconds'], l['containerId']]),
        [['loop', '/var/lib/cni/networks/n1', 0.25, 'c-new']],
      );

      // The metrics part counts what the plugin server tells it (src/daemon/agent.ts wires it).
      metrics.recordReclaim('n1', [{ verdict: 'leaked' }, { verdict: 'corrupt' }, { verdict: 'leaked' }]);
      assert.deepEqual(
        await samples(metrics, 'ipwarden_releases_total'),
        new Map([
          ['ipwarden_releases_total{network="n1",reason="leaked"}', 2],
          ['ipwarden_releases_total{network="n1",reason="corrupt"}', 1],
        ]),
      );
    } finally {
      await loop?.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
