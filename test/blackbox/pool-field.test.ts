/**
 * Three field failures of cluster pools (docs/cluster.md), each on a real etcd
 * (test/helpers/etcd-cluster.ts) with exact expected values:
 * - a dead node's block emptied by another node's DEL after `remove-node --finish` is given back
 *   by that DEL (calico#5218): the next ADD claims it, and `pool status` never counts a
 *   `pendingRelease` block's unheld addresses as free;
 * - etcd restored from an older snapshot (calico#4374): the runbook of docs/cluster.md run as
 *   written (etcdctl snapshot save, snapshot restore with the cluster's token, the member
 *   restarted); `pool leaks` reports the live pods' addresses the pool lost, the node's daemon
 *   (the built daemon, the fake CRI runtime test/helpers/hostile-cri.ts) re-reserves exactly those
 *   on its first pass, reports a conflict without taking anything (recording the live pod's want
 *   of the address), and another node's ADDs never get them — not even after the holder's DEL
 *   released the wanted address; the next pass re-reserves it and drops the want;
 * - a renamed host (microk8s#4283): handles the node wrote under an earlier host name of this
 *   machine (the daemon's host history) are judged as its own by the daemon's pass — a leak among
 *   them released, a live one kept — while a handle of another host name stays foreign;
 * Needs `npm run build`. With CI=true a missing /usr/bin/etcd fails instead of skipping.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { hostname, tmpdir } from 'node:os';
import { join } from 'node:path';
import { startTestDaemon } from '../helpers/daemon.ts';
import { startHostileCri, type HostileCri } from '../helpers/hostile-cri.ts';
import { EtcdKV } from '../../src/store/etcd/etcd-kv.ts';
import { PoolAllocator } from '../../src/pool/allocator.ts';
import { loadIPAMConfig } from '../../src/ipam/config.ts';
import { HOST_HISTORY_FILE, readMachineId } from '../../src/node/host-history.ts';
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

describe('etcd restored from an older snapshot: the runbook, and the daemon re-reserves its live pods\' addresses (real etcd, daemon, fake CRI)', { skip }, () => {
  let rc: EtcdCluster | undefined;
  let rkv: EtcdKV | undefined;
  let cri: HostileCri | undefined;
  let tmp = '';
  const P = `/rs${process.pid}`;
  const POOL = 'rspool';
  const NODE = 'rs-node';
  before(async () => {
    tmp = mkdtempSync(join(tmpdir(), 'ipwarden-pool-restore-'));
    rc = await startEtcdCluster({ members: 1, prefix: 'ipwarden-pool-restore-etcd-' });
    rkv = new EtcdKV({ endpoints: rc.endpoints });
    cri = await startHostileCri({ path: join(tmp, 'cri.sock'), sandboxes: [] });
  });
  after(async () => {
    await cri?.close();
    await rkv?.close();
    await rc?.close();
    if (tmp !== '') rmSync(tmp, { recursive: true, force: true });
  });

  /** One block: 10.246.2.0/29 in a /29 block (.2–.6: .1 is the gateway, .7 the broadcast). */
  function rconf() {
    return { cniVersion: '1.0.0', name: 'rsnet', ipam: { type: 'ipwarden', ranges: [[{ subnet: '10.246.2.0/29' }]], pool: { name: POOL, etcd: { endpoints: (rc as EtcdCluster).endpoints, prefix: P }, blockSize: 29 } } };
  }
  function radd(id: string, node: string): Outcome {
    return runCni(standalonePlugin(), { command: 'ADD', containerId: id, ifname: 'eth0', stdin: rconf(), env: { NODE_NAME: node } });
  }
  function rdel(id: string, node: string): Outcome {
    return runCni(standalonePlugin(), { command: 'DEL', containerId: id, ifname: 'eth0', stdin: rconf(), env: { NODE_NAME: node } });
  }
  function etcdctl(...a: string[]) {
    const r = spawnSync(ETCDCTL_BIN, a, { encoding: 'utf8', env: { PATH: '/usr/bin:/bin', ETCDCTL_API: '3' } });
    assert.equal(r.status, 0, `etcdctl ${a.join(' ')}: ${r.stderr}`);
    return r.stdout;
  }
  /** The handles of the pool: containerId → [node, ips]. */
  async function handles(): Promise<Record<string, [string, string[]]>> {
    const base = `${P}/pools/${POOL}/handles/`;
    const out: Record<string, [string, string[]]> = {};
    for (const e of await (rkv as EtcdKV).list(base)) {
      const v = JSON.parse(e.value) as { node: string; ips: Array<{ ip: string }> };
      out[e.key.slice(base.length).split('/')[0] as string] = [v.node, v.ips.map((x) => x.ip)];
    }
    return out;
  }
  /** `ipwarden pool leaks --json` of the built CLI, asynchronously (the fake CRI answers from this process). */
  function leaks(): Promise<{ status: number | null; stdout: string; stderr: string }> {
    return new Promise((resolve, reject) => {
      const c = spawn(process.execPath, [join(ROOT, 'bin/ipwarden'), 'pool', 'leaks', '--pool', POOL, '--etcd-endpoints', (rc as EtcdCluster).endpoints.join(','), '--etcd-prefix', P, '--runtime-endpoint', (cri as HostileCri).endpoint, '--json'], { env: { PATH: '/usr/bin:/bin', NODE_NAME: NODE } });
      let stdout = '';
      let stderr = '';
      c.stdout.on('data', (b: Buffer) => (stdout += b.toString('utf8')));
      c.stderr.on('data', (b: Buffer) => (stderr += b.toString('utf8')));
      c.on('error', reject);
      c.on('close', (status) => resolve({ status, stdout, stderr }));
    });
  }

  it('snapshot, two more pods, restore: pool leaks lists exactly the lost addresses, the daemon\'s first pass re-reserves them, another node never gets them', async () => {
    const c = rc as EtcdCluster;
    const m0 = c.members[0] as EtcdCluster['members'][number];
    assert.equal(address(radd('p1', NODE)), '10.246.2.2/29');
    // The runbook, step 0: the backup.
    const snap = join(tmp, 'backup.db');
    etcdctl('--endpoints', c.endpoints.join(','), 'snapshot', 'save', snap);
    assert.equal(address(radd('p2', NODE)), '10.246.2.3/29');
    assert.equal(address(radd('p3', NODE)), '10.246.2.4/29');
    // The runbook, step 1: restore every member from the backup with the cluster's token and
    // member list (the cluster keeps its ID, so the pool's meta-cluster pin still matches).
    await c.kill(0);
    rmSync(m0.dataDir, { recursive: true, force: true });
    etcdctl('snapshot', 'restore', snap, '--name', m0.name, '--data-dir', m0.dataDir, '--initial-cluster', `${m0.name}=${m0.peerUrl}`, '--initial-cluster-token', c.token, '--initial-advertise-peer-urls', m0.peerUrl);
    await c.restart(0);
    assert.deepEqual(await handles(), { p1: [NODE, ['10.246.2.2']] }, 'the restore lost p2 and p3');
    // The pods still run: the runtime reports them READY with their addresses; and one pod whose
    // address p1 holds (a duplicate no re-reservation may resolve by taking it).
    (cri as HostileCri).setSandboxes([
      { id: 'p1', ips: ['10.246.2.2'] },
      { id: 'p2', ips: ['10.246.2.3'] },
      { id: 'p3', ips: ['10.246.2.4', 'fd00::3'] },
      { id: 'px', ips: ['10.246.2.2'] },
      { id: 'gone', state: 'notready' },
    ]);
    // The runbook, step 2: pool leaks on the node lists what the pool lost (exit 1: a conflict).
    const lk = await leaks();
    assert.equal(lk.status, 1, lk.stderr);
    assert.deepEqual((JSON.parse(lk.stdout) as { podAddresses: unknown }).podAddresses, [
      { sandbox: 'p2', ip: '10.246.2.3', state: 'missing', reason: 'no allocation or handle in the pool (free in block 10.246.2.0-29): the node\'s daemon re-reserves it on its next pass' },
      { sandbox: 'p3', ip: '10.246.2.4', state: 'missing', reason: 'no allocation or handle in the pool (free in block 10.246.2.0-29): the node\'s daemon re-reserves it on its next pass' },
      { sandbox: 'px', ip: '10.246.2.2', state: 'conflict', reason: `held by container p1/eth0 of node ${NODE} (seq 1): a duplicate address` },
    ]);
    assert.equal(lk.stderr, `ipwarden: a live pod's address is held by another holder in pool ${POOL} (a duplicate address): see above\n`);
    // The runbook, step 3: the node's daemon (restarted, or at its next pass) re-reserves them.
    const netd = join(tmp, 'net.d');
    mkdirSync(netd, { recursive: true });
    const { name, cniVersion, ...plugin } = rconf();
    writeFileSync(join(netd, '10-rs.conflist'), JSON.stringify({ cniVersion, name, plugins: [{ type: 'macvlan', ...plugin }] }));
    const d = await startTestDaemon({ cniConfDir: netd, env: { NODE_NAME: NODE }, args: ['--interval', '1h', '--runtime-endpoint', (cri as HostileCri).endpoint] });
    try {
      const first = await d.waitForLog((l) => l.msg === 'pool reconcile pass');
      assert.equal(first['reason'], 'start', 'the first pass, at the daemon\'s start');
      const rr = d.logs.filter((l) => l.msg === 'pool re-reserved').map((l) => [l['pool'], l['node'], l['network'], l['sandbox'], l['ip'], l['block'], l['claimed']]);
      assert.deepEqual(rr, [
        [POOL, NODE, 'rsnet', 'p2', '10.246.2.3', '10.246.2.0-29', false],
        [POOL, NODE, 'rsnet', 'p3', '10.246.2.4', '10.246.2.0-29', false],
      ]);
      const conflicts = d.logs.filter((l) => l.msg === 'pool reconcile error' && l['kind'] === 'conflict').map((l) => l['error']);
      assert.deepEqual(conflicts, [`pool ${POOL}: address 10.246.2.2 of ready sandbox px is held by container p1/eth0 of node ${NODE} (seq 1): a duplicate address — not re-reserved, nothing taken from the holder; the address is wanted by this sandbox: no other pod gets it, and it is re-reserved when its holder releases it`]);
      // The want of px is recorded in the block (and its index key), the holder untouched.
      assert.deepEqual(d.logs.filter((l) => l.msg === 'pool wanted').map((l) => [l['pool'], l['node'], l['sandbox'], l['ip'], l['block']]), [[POOL, NODE, 'px', '10.246.2.2', '10.246.2.0-29']]);
      const blk = JSON.parse((await (rkv as EtcdKV).get(`${P}/pools/${POOL}/blocks/10.246.2.0-29`))?.value ?? 'null') as { allocs: Record<string, { id: string }>; wanted: Record<string, { sandbox: string; node: string }> };
      assert.deepEqual([blk.allocs['2']?.id, Object.keys(blk.wanted), blk.wanted['2']?.sandbox, blk.wanted['2']?.node], ['p1', ['2'], 'px', NODE]);
      assert.deepEqual(await handles(), { p1: [NODE, ['10.246.2.2']], p2: [NODE, ['10.246.2.3']], p3: [NODE, ['10.246.2.4']] });
      const h2 = JSON.parse((await (rkv as EtcdKV).get(`${P}/pools/${POOL}/handles/p2/eth0`))?.value ?? 'null') as Record<string, unknown>;
      assert.deepEqual([h2['node'], h2['network'], h2['host'], h2['ips']], [NODE, 'rsnet', hostname(), [{ ip: '10.246.2.3', block: '10.246.2.0-29', ordinal: 3, seq: 2, rangeSet: 0 }]]);
      const metrics = await (await fetch(`http://${(await d.waitForLog((l) => l.msg === 'metrics listening'))['metricsAddress'] as string}/metrics`)).text();
      assert.deepEqual(metrics.split('\n').filter((l) => l.startsWith('ipwarden_pool_rereserved_total{') || l.startsWith('ipwarden_pool_wants_total{') || l.startsWith('ipwarden_reconcile_errors_total{kind="pool-conflict"}')), [
        'ipwarden_reconcile_errors_total{kind="pool-conflict"} 1',
        `ipwarden_pool_rereserved_total{pool="${POOL}"} 2`,
        `ipwarden_pool_wants_total{pool="${POOL}",event="written"} 1`,
      ]);
      // Another node's ADDs: the block has no free block beside it, so it borrows — never p2's or p3's address.
      assert.equal(address(radd('o1', 'rs-other')), '10.246.2.5/29');
      assert.equal(address(radd('o2', 'rs-other')), '10.246.2.6/29');
      const full = radd('o3', 'rs-other');
      assert.deepEqual([full.exitCode, full.json?.['msg']], [1, 'failed to allocate for range 0: no IP addresses available in range set: 10.246.2.1-10.246.2.6']);
      // pool leaks now: only the conflict is left.
      const after = await leaks();
      assert.deepEqual([after.status, (JSON.parse(after.stdout) as { podAddresses: Array<{ sandbox: string; state: string }> }).podAddresses.map((x) => [x.sandbox, x.state])], [1, [['px', 'conflict']]]);
      // The restore-then-release interleaving: the holder's pod is deleted (its DEL releases
      // 10.246.2.2) while px still uses the address and before the node's next pass. The address
      // stays wanted: another node's ADD still finds no address — never px's.
      assert.deepEqual([rdel('p1', NODE).exitCode], [0]);
      (cri as HostileCri).setSandboxes([
        { id: 'p2', ips: ['10.246.2.3'] },
        { id: 'p3', ips: ['10.246.2.4', 'fd00::3'] },
        { id: 'px', ips: ['10.246.2.2'] },
      ]);
      const still = radd('o4', 'rs-other');
      assert.deepEqual([still.exitCode, still.json?.['msg']], [1, 'failed to allocate for range 0: no IP addresses available in range set: 10.246.2.1-10.246.2.6']);
      const mid = await leaks();
      assert.deepEqual([mid.status, (JSON.parse(mid.stdout) as { podAddresses: unknown }).podAddresses], [
        0,
        [{ sandbox: 'px', ip: '10.246.2.2', state: 'missing', reason: 'no allocation or handle in the pool (free in block 10.246.2.0-29): the node\'s daemon re-reserves it on its next pass' }],
      ]);
    } finally {
      await d.stop();
    }
    // The node's next pass (here: the daemon restarted) re-reserves it for px and drops the want.
    const d2 = await startTestDaemon({ cniConfDir: join(tmp, 'net.d'), env: { NODE_NAME: NODE }, args: ['--interval', '1h', '--runtime-endpoint', (cri as HostileCri).endpoint] });
    try {
      await d2.waitForLog((l) => l.msg === 'pool reconcile pass');
      assert.deepEqual(d2.logs.filter((l) => l.msg === 'pool re-reserved').map((l) => [l['sandbox'], l['ip'], l['block'], l['claimed'], l['wanted']]), [['px', '10.246.2.2', '10.246.2.0-29', false, true]]);
      assert.deepEqual(d2.logs.filter((l) => l.msg === 'pool reconcile error').map((l) => l['kind']), []);
      assert.deepEqual(await handles(), { o1: ['rs-other', ['10.246.2.5']], o2: ['rs-other', ['10.246.2.6']], p2: [NODE, ['10.246.2.3']], p3: [NODE, ['10.246.2.4']], px: [NODE, ['10.246.2.2']] });
      const blk = JSON.parse((await (rkv as EtcdKV).get(`${P}/pools/${POOL}/blocks/10.246.2.0-29`))?.value ?? 'null') as { allocs: Record<string, { id: string }>; wanted?: unknown };
      assert.deepEqual([blk.allocs['2']?.id, blk.wanted], ['px', undefined]);
      assert.deepEqual(await (rkv as EtcdKV).list(`${P}/pools/${POOL}/wanted/`), []);
      const metrics = await (await fetch(`http://${(await d2.waitForLog((l) => l.msg === 'metrics listening'))['metricsAddress'] as string}/metrics`)).text();
      assert.deepEqual(metrics.split('\n').filter((l) => l.startsWith('ipwarden_pool_wants_total{')), [`ipwarden_pool_wants_total{pool="${POOL}",event="fulfilled"} 1`]);
      const done = await leaks();
      assert.deepEqual([done.status, (JSON.parse(done.stdout) as { podAddresses: unknown }).podAddresses], [0, []]);
    } finally {
      await d2.stop();
    }
  });
});

describe('a renamed host: handles written under an earlier host name of this machine are the node\'s own (real etcd, daemon, fake CRI)', { skip }, () => {
  let hc: EtcdCluster | undefined;
  let hkv: EtcdKV | undefined;
  let cri: HostileCri | undefined;
  let tmp = '';
  const P = `/rn${process.pid}`;
  const POOL = 'rnpool';
  const NODE = 'rn-node';
  before(async () => {
    tmp = mkdtempSync(join(tmpdir(), 'ipwarden-pool-rename-'));
    hc = await startEtcdCluster({ members: 1, prefix: 'ipwarden-pool-rename-etcd-' });
    hkv = new EtcdKV({ endpoints: hc.endpoints });
    cri = await startHostileCri({ path: join(tmp, 'cri.sock'), sandboxes: [] });
  });
  after(async () => {
    await cri?.close();
    await hkv?.close();
    await hc?.close();
    if (tmp !== '') rmSync(tmp, { recursive: true, force: true });
  });

  it('the pass releases a leak written under the old host name, keeps a live one, and never judges another host\'s', async () => {
    const { rangeSets } = loadIPAMConfig(JSON.stringify({ cniVersion: '1.0.0', name: 'rnnet', ipam: { ranges: [[{ subnet: '10.246.3.0/28' }]] } }), undefined);
    // What the node's processes wrote before the rename (old-host) and what another machine wrote under the same node name (stranger).
    const writer = (host: string) => new PoolAllocator({ kv: hkv as EtcdKV, pool: POOL, prefix: P, node: NODE, network: 'rnnet', rangeSets, sizes: { blockSize4: 28, blockSize6: 122 }, host });
    for (const [id, host] of [['old1', 'old-host'], ['old2', 'old-host'], ['str1', 'stranger']] as const) {
      const r = await writer(host).add([{ containerId: id, ifname: 'eth0' }]);
      assert.ok(Array.isArray(r[0]), String(r[0]));
    }
    const hostsOf = async () => {
      const base = `${P}/pools/${POOL}/handles/`;
      return Object.fromEntries((await (hkv as EtcdKV).list(base)).map((e) => [e.key.slice(base.length).split('/')[0], (JSON.parse(e.value) as { host: string }).host]));
    };
    assert.deepEqual(await hostsOf(), { old1: 'old-host', old2: 'old-host', str1: 'stranger' });
    // The daemon ran on this machine as old-host before (its host history, kept in its data dir).
    const machineId = readMachineId();
    assert.notEqual(machineId, null, 'this machine has an /etc/machine-id');
    const dataDir = join(tmp, 'data');
    mkdirSync(dataDir, { recursive: true });
    writeFileSync(join(dataDir, HOST_HISTORY_FILE), `${JSON.stringify({ v: 1, machineId, host: 'old-host', since: 1 })}\n`, { mode: 0o644 });
    (cri as HostileCri).setSandboxes([{ id: 'old2', ips: [] }]);
    const netd = join(tmp, 'net.d');
    mkdirSync(netd, { recursive: true });
    const plugin = { type: 'macvlan', ipam: { type: 'ipwarden', ranges: [[{ subnet: '10.246.3.0/28' }]], pool: { name: POOL, etcd: { endpoints: (hc as EtcdCluster).endpoints, prefix: P }, blockSize: 28 } } };
    writeFileSync(join(netd, '10-rn.conflist'), JSON.stringify({ cniVersion: '1.0.0', name: 'rnnet', plugins: [plugin] }));
    const d = await startTestDaemon({ cniConfDir: netd, dataDir, env: { NODE_NAME: NODE }, args: ['--interval', '1s', '--grace', '2s', '--runtime-endpoint', (cri as HostileCri).endpoint] });
    try {
      for (let i = 0; 'old1' in (await hostsOf()); i++) {
        assert.ok(i < 600, `old1 released within 60 s; pool lines: ${JSON.stringify(d.logs.filter((l) => /pool/.test(l.msg)).slice(-6))}`);
        await new Promise((r) => setTimeout(r, 100));
      }
      assert.deepEqual(await hostsOf(), { old2: 'old-host', str1: 'stranger' }, 'the live one kept, the other host\'s never judged');
      // (the log lines of the pass that released it come after the transaction)
      const pass = await d.waitForLog((l) => l.msg === 'pool reconcile pass' && l['released'] === 1);
      const rel = d.logs.filter((l) => l.msg === 'pool released').map((l) => l['containerId']);
      assert.deepEqual(rel, ['old1']);
      assert.deepEqual(pass['pools'], [{ pool: POOL, node: NODE, live: 1, inUse: 0, grace: 0, leaked: 1, unknown: 0 }], 'old1 judged (leaked), old2 judged (live); str1 not judged');
      // (a pass before the daemon's first heartbeat says the old host's handles wait for it: not asserted)
      const foreign = [...new Set(d.logs.filter((l) => l.msg === 'pool reconcile error' && l['kind'] === 'foreign' && / were written on other hosts /.test(String(l['error']))).map((l) => l['error']))];
      assert.deepEqual(foreign, [`pool ${POOL}: 1 handle(s) of node ${NODE} were written on other hosts than ${hostname()} (stranger): never judged or released here — two hosts under one node name? (a fixed ipam.nodeName, equal host names)`]);
      // The history now holds this host name too.
      const lines = (await import('node:fs')).readFileSync(join(dataDir, HOST_HISTORY_FILE), 'utf8').trim().split('\n').map((l) => (JSON.parse(l) as { host: string }).host);
      assert.deepEqual(lines, ['old-host', hostname()]);
    } finally {
      await d.stop();
    }
  });
});
