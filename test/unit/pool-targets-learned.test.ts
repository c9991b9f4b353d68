/**
 * The pools the daemon's loop reconciles (src/daemon/loop.ts `cniPoolTargets`): the pool networks
 * of the CNI configuration directory, then those learned from requests (docs/cluster.md "Multus").
 * Networks naming the same pool and node are one target, whichever source names them; one etcd
 * client per (endpoints, prefix, TLS, credentials); a directory that cannot be read still leaves
 * the learned pools reconciled. Real files, a memory KV per client (counted).
 */
import { after, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { cniPoolTargets } from '../../src/daemon/loop.ts';
import { loadIPAMConfig } from '../../src/ipam/config.ts';
import type { PoolConfig } from '../../src/ipam/pool-config.ts';
import { MemoryKV } from '../../src/store/memory/memory-kv.ts';

const root = mkdtempSync(join(tmpdir(), 'ipw-targets-'));
after(() => rmSync(root, { recursive: true, force: true }));

const ETCD = { endpoints: ['http://127.0.0.1:2379'], prefix: '/t' };
function net(name: string, pool: string, extra: Record<string, unknown> = {}): Record<string, unknown> {
  return { cniVersion: '1.0.0', name, ipam: { type: 'ipwarden', ranges: [[{ subnet: '10.249.20.0/26' }]], pool: { name: pool, etcd: ETCD }, ...extra } };
}

describe('cniPoolTargets with learned pool networks', () => {
  it('a learned network of a pool the directory names joins its target; a learned pool of its own is a second target; one etcd client for both', async () => {
    const dir = mkdtempSync(join(root, 'netd-'));
    const { name, cniVersion, ...plugin } = net('conf-net', 'p1');
    writeFileSync(join(dir, '10-a.conflist'), JSON.stringify({ cniVersion, name, plugins: [{ type: 'macvlan', ...plugin }] }));
    const learned = [
      { file: '/rec/1.json', ipam: loadIPAMConfig(JSON.stringify(net('nad-net', 'p1', { runtimeEndpoint: '/run/crio/crio.sock' })), undefined) },
      { file: '/rec/2.json', ipam: loadIPAMConfig(JSON.stringify(net('nad-only', 'p2')), undefined) },
    ];
    const made: PoolConfig[] = [];
    const src = cniPoolTargets(dir, { NODE_NAME: 'node-t' }, (p) => (made.push(p), new MemoryKV()), () => learned);
    const { targets, errors } = src.targets();
    assert.deepEqual(errors, []);
    assert.deepEqual(
      targets.map((t) => [t.prefix, t.pool, t.node, t.runtimeEndpoints]),
      [
        ['/t', 'p1', 'node-t', ['unix:///run/crio/crio.sock']],
        ['/t', 'p2', 'node-t', []],
      ],
    );
    assert.equal(made.length, 1, 'one client per etcd (endpoints, prefix, TLS, credentials)');
    assert.equal(targets[0]?.kv, targets[1]?.kv);
    await src.close();
    assert.deepEqual(src.targets(), { targets: [], errors: [] }, 'closed: no target');
  });

  it('a configuration directory that cannot be read is an error, and the learned pools are still targets', async () => {
    const notDir = join(root, 'a-file');
    writeFileSync(notDir, 'x');
    const learned = [{ file: '/rec/2.json', ipam: loadIPAMConfig(JSON.stringify(net('nad-only', 'p2')), undefined) }];
    const src = cniPoolTargets(notDir, { NODE_NAME: 'node-t' }, () => new MemoryKV(), () => learned);
    const { targets, errors } = src.targets();
    assert.deepEqual(errors, [`cannot read the CNI configurations in ${notDir}: ENOTDIR: not a directory, scandir '${notDir}'`]);
    assert.deepEqual(targets.map((t) => [t.pool, t.node]), [['p2', 'node-t']]);
    await src.close();
  });
});
