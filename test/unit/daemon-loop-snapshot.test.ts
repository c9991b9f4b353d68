/**
 * One runtime snapshot per daemon pass (src/daemon/loop.ts): the node-local pass and the pool
 * pass share it, so a pass makes one ListPodSandbox call (and one PodSandboxStatus per READY
 * sandbox), not one per plan. The loop runs in-process on the memory KV with an injected runtime
 * (a counting sandbox source) and kernel evidence; no sleeps — each pass is awaited.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { hostname, tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { loopOptions } from '../helpers/loop-options.ts';
import { createLogger } from '../../src/daemon/log.ts';
import { reconcileLoopPart, type ReconcileLoop } from '../../src/daemon/loop.ts';
import { DaemonMetrics } from '../../src/daemon/metrics.ts';
import { loadIPAMConfig } from '../../src/ipam/config.ts';
import { PoolAllocator } from '../../src/pool/allocator.ts';
import { NOTHING_IN_USE } from '../../src/reconcile/evidence.ts';
import type { PoolTarget } from '../../src/reconcile/pool-pass.ts';
import type { SandboxInfo } from '../../src/reconcile/sandboxes.ts';
import { MemoryKV } from '../../src/store/memory/memory-kv.ts';

describe('the daemon loop: one runtime snapshot per pass', () => {
  it('two passes with a pool make two ListPodSandbox calls and one PodSandboxStatus each of the READY sandbox; both plans judged on it', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'ipwarden-loop-snap-'));
    let loop: ReconcileLoop | undefined;
    try {
      const kv = new MemoryKV();
      const conf = loadIPAMConfig(JSON.stringify({ cniVersion: '1.0.0', name: 'net1', ipam: { ranges: [[{ subnet: '10.239.57.0/24' }]] } }), undefined);
      const alloc = new PoolAllocator({ kv, pool: 'sp', prefix: '/ipwarden', node: 'n1', network: 'net1', rangeSets: conf.rangeSets, sizes: { blockSize4: 26, blockSize6: 122 }, now: () => 1_000, host: hostname() });
      for (const id of ['gone1', 'live1']) {
        const [r] = await alloc.add([{ containerId: id, ifname: 'eth0' }]);
        assert.ok(Array.isArray(r), String(r));
      }
      let lists = 0;
      const status: string[] = [];
      const sandboxes: SandboxInfo[] = [{ id: 'live1', state: 'ready' }];
      const target: PoolTarget = { kv, prefix: '/ipwarden', pool: 'sp', node: 'n1', id: 'sp@n1' };
      const options = loopOptions(dir, 'error');
      const factory = reconcileLoopPart(
        {
          reconcile: {
            env: { CONTAINER_RUNTIME_ENDPOINT: 'unix:///run/ipwarden-loop-snap-unit.sock' },
            now: () => 1_700_000_000_000,
            evidence: () => NOTHING_IN_USE,
            sandboxSource: (endpoint) => ({
              endpoint,
              list: async () => (lists++, sandboxes),
              podIPs: async (id: string) => (status.push(id), id === 'live1' ? ['10.239.57.1'] : []),
              close: () => undefined,
            }),
          },
          metrics: new DaemonMetrics(),
          random: () => 0.5,
          monotonic: () => 0,
          pools: { targets: () => ({ targets: [target], errors: [] }), close: async () => undefined },
        },
        (l) => (loop = l),
      );
      await factory({ options, log: createLogger('error', { stream: { write: () => undefined } }) });
      const l = loop as ReconcileLoop;
      // The start pass is running: this asks for one more right after it and resolves with that one.
      await l.passNow('test');
      assert.equal(lists, 2, 'one ListPodSandbox per pass (node-local and pool plans share it)');
      assert.deepEqual(status, ['live1', 'live1'], 'one PodSandboxStatus of the READY sandbox per pass');
      assert.equal(l.last?.runtime.sandboxes, 1);
      assert.deepEqual(l.lastPool?.pools, [{ pool: 'sp', node: 'n1', live: 1, inUse: 0, grace: 0, leaked: 1, unknown: 0 }]);
      assert.deepEqual(l.lastPool?.errors, []);
    } finally {
      await loop?.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
