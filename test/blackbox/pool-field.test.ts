/**
 * Three field failures of cluster pools (docs/cluster.md), each on a real etcd
 * (test/helpers/etcd-cluster.ts) with exact expected values:
 * - a dead node's block emptied by another node's DEL after `remove-node --finish` is given back
 *   by that DEL (calico#5218): the next ADD claims it, and `pool status` never counts a
 *   `pendingRelease` block's unheld addresses as free;
 * Needs `npm run build`. With CI=true a missing /usr/bin/etcd fails instead of skipping.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { EtcdKV } from '../../src/store/etcd/etcd-kv.ts';
import { ROOT, runCni, standalonePlugin, type Outcome } from '../helpers/cni.ts';
import { ETCDCTL_BIN, haveEtcd, startEtcdCluster, type EtcdCluster } from '../helpers/etcd-cluster.ts';

const CI = process.env['CI'] === 'true';
const skip = haveEtcd() || CI ? false : '/usr/bin/etcd not installed';

let cluster: EtcdCluster | undefined;
let kv: EtcdKV | undefined;
let n = 0;

/** A fresh key prefix per test. */
function prefix(): string {
  return `/fx${process.pid}-${++n}`;
}

/** 10.246.1.0/29 in /30 blocks: 10.246.1.0/30 (.2, .3: .1 is the gateway) and 10.246.1.4/30 (.4–.6; .7 broadcast). */
function conf(p: string) {
  return {
    cniVersion: '1.0.0',
    name: 'fxnet',
    ipam: { type: 'ipwarden', ranges: [[{ subnet: '10.246.1.0/29' }]], pool: { name: 'fxpool', etcd: { endpoints: (cluster as EtcdCluster).endpoints, prefix: p }, blockSize: 30 } },
  };
}
function add(p: string, id: string, node: string): Outcome {
  return runCni(standalonePlugin(), { command: 'ADD', containerId: id, ifname: 'eth0', stdin: conf(p), env: { NODE_NAME: node } });
}
function del(p: string, id: string, node: string): Outcome {
  return runCni(standalonePlugin(), { command: 'DEL', containerId: id, ifname: 'eth0', stdin: conf(p), env: { NODE_NAME: node } });
}
function address(r: Outcome): string {
  assert.equal(r.exitCode, 0, `${r.stdout}\n${r.stderr}`);
  return ((r.json?.['ips'] as Array<{ address: string }>)[0] as { address: string }).address;
}
function cli(p: string, ...args: string[]): { status: number | null; stdout: string; stderr: string } {
  const r = spawnSync(process.execPath, [join(ROOT, 'bin/ipwarden'), 'pool', ...args, '--pool', 'fxpool', '--etcd-endpoints', (cluster as EtcdCluster).endpoints.join(','), '--etcd-prefix', p], { encoding: 'utf8', timeout: 60_000 });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}
function ctl(...a: string[]) {
  return spawnSync(ETCDCTL_BIN, ['--endpoints', (cluster as EtcdCluster).endpoints.join(','), ...a], { encoding: 'utf8', env: { ...process.env, ETCDCTL_API: '3' } });
}
/** Block keys per node (the affinity index). */
async function claims(p: string): Promise<Record<string, string[]>> {
  const out: Record<string, string[]> = {};
  const base = `${p}/pools/fxpool/nodes/`;
  for (const e of await (kv as EtcdKV).list(base, { keysOnly: true })) {
    const [node, kind, block] = e.key.slice(base.length).split('/');
    if (kind === 'blocks') (out[node as string] ??= []).push(block as string);
  }
  return out;
}
function rangeSet0(p: string): unknown {
  const r = cli(p, 'status', '--json');
  assert.equal(r.status, 0, r.stderr);
  return (JSON.parse(r.stdout) as { rangeSets: unknown[] }).rangeSets[0];
}

describe('pool field failures, on a real etcd', { skip }, () => {
  before(async () => {
    cluster = await startEtcdCluster({ members: 1, prefix: 'ipwarden-pool-field-' });
    kv = new EtcdKV({ endpoints: cluster.endpoints });
  });
  after(async () => {
    await kv?.close();
    await cluster?.close();
  });

  it('a dead node\'s block emptied by another node\'s DEL after remove-node --finish is given back by that DEL: the next ADD gets it, and pool status agrees about what is free (calico#5218)', async () => {
    const p = prefix();
    assert.equal(address(add(p, 'd1', 'fx-dead')), '10.246.1.2/29', 'fx-dead claims 10.246.1.0/30');
    assert.equal(address(add(p, 'l1', 'fx-live')), '10.246.1.4/29', 'fx-live claims 10.246.1.4/30');
    assert.equal(address(add(p, 'l2', 'fx-live')), '10.246.1.5/29');
    assert.equal(address(add(p, 'l3', 'fx-live')), '10.246.1.6/29');
    assert.equal(address(add(p, 'l4', 'fx-live')), '10.246.1.3/29', 'no free block: fx-live borrows in fx-dead\'s');
    assert.deepEqual(await claims(p), { 'fx-dead': ['10.246.1.0-30'], 'fx-live': ['10.246.1.4-30'] });
    // fx-dead is gone: step 1 (--force: only the standalone served it), the window passed, --finish.
    assert.equal(cli(p, 'remove-node', 'fx-dead', '--force').status, 0);
    const wk = `${p}/pools/fxpool/removal-window/fx-dead`;
    const wlease = BigInt(/"lease":([0-9]+)/.exec(ctl('get', wk, '-w', 'json').stdout)?.[1] ?? '0');
    assert.equal(ctl('lease', 'revoke', wlease.toString(16)).status, 0);
    const fin = cli(p, 'remove-node', 'fx-dead', '--finish');
    assert.deepEqual([fin.status, fin.stdout, fin.stderr], [0, 'released 1 address of fx-dead; deleted 0 block(s)\nkept 1 block(s) (vetoed, not marked, or holding other nodes\' addresses): 10.246.1.0/30\n', '']);
    // The kept block holds 1 borrowed address; its other one is not free (no ADD can use it), and status says so.
    assert.deepEqual(rangeSet0(p), { index: 0, ranges: '10.246.1.1-10.246.1.6', size: '5', used: 4, reserved: 0, unreadable: 0, pendingRelease: 1, free: '0', blocksClaimed: 2 });
    const full = add(p, 'l5', 'fx-live');
    assert.deepEqual([full.exitCode, full.json?.['code'], full.json?.['msg']], [1, 999, 'failed to allocate for range 0: no IP addresses available in range set: 10.246.1.1-10.246.1.6']);
    // fx-live's DEL of the borrowed address empties the block: it gives it back in its own transaction.
    assert.equal(del(p, 'l4', 'fx-live').exitCode, 0);
    assert.equal(await (kv as EtcdKV).get(`${p}/pools/fxpool/blocks/10.246.1.0-30`), null, 'the emptied block is gone');
    assert.deepEqual(await claims(p), { 'fx-live': ['10.246.1.4-30'] }, 'and its affinity');
    assert.deepEqual(rangeSet0(p), { index: 0, ranges: '10.246.1.1-10.246.1.6', size: '5', used: 3, reserved: 0, unreadable: 0, pendingRelease: 0, free: '2', blocksClaimed: 1 });
    // No second --finish: the next ADD claims the block.
    assert.equal(address(add(p, 'l6', 'fx-live')), '10.246.1.2/29');
    assert.deepEqual(await claims(p), { 'fx-live': ['10.246.1.0-30', '10.246.1.4-30'] });
    assert.deepEqual(rangeSet0(p), { index: 0, ranges: '10.246.1.1-10.246.1.6', size: '5', used: 4, reserved: 0, unreadable: 0, pendingRelease: 0, free: '1', blocksClaimed: 2 });
    // The marker and settings are left for the next --finish, which has nothing to release.
    const again = cli(p, 'remove-node', 'fx-dead', '--finish');
    assert.deepEqual([again.status, again.stderr], [0, '']);
    assert.equal(await (kv as EtcdKV).get(`${p}/pools/fxpool/removing/fx-dead`), null);
  });
});
