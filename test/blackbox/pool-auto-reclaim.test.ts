/**
 * Dead nodes reclaimed without a person (`ipam.pool.reclaimAfter`, docs/cluster.md "Reclaiming
 * dead nodes automatically"), on a real 3-member etcd with real daemons (the built
 * `ipwarden daemon`, one per simulated node, each with its own socket, data dir and NODE_NAME,
 * announcing the pool from its own CNI configuration directory):
 *
 * - nodes rc-b and rc-c run with `reclaimAfter: "2s"`, rc-d without (off, the default);
 * - rc-a (3 attachments through its daemon) is killed with SIGKILL and stays gone: exactly one of
 *   rc-b and rc-c begins its removal (its marker names it; one `begun` log line in all), finishes
 *   it after the 60 s veto window, audits it (intent then released, per address, naming who and
 *   whom), counts it (`ipwarden_pool_nodes_reclaimed_total` 1 on the remover, no series on the
 *   others); rc-a's handles and blocks are gone; its daemon started again claims a new block;
 * - rc-e (2 attachments) is killed too and its daemon started again as soon as its removal is
 *   begun: it vetoes — the marker goes, its blocks are `owned`, both handles are intact, nothing of
 *   it is audited — also after its window has expired;
 * - rc-d never begins or finishes anything.
 *
 * A killed daemon's heartbeat key lives until its 30 s lease expires; the test deletes the key
 * instead (what the expiry does), so the run does not wait those 30 s.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { EtcdKV } from '../../src/store/etcd/etcd-kv.ts';
import { runViaDaemon } from '../helpers/daemon-client.ts';
import { startTestDaemon, type TestDaemon } from '../helpers/daemon.ts';
import { haveEtcd, startEtcdCluster, type EtcdCluster } from '../helpers/etcd-cluster.ts';

const CI = process.env['CI'] === 'true';
const skip = CI ? false : !haveEtcd() ? '/usr/bin/etcd not installed' : false;
const POOL = 'rcpool';
const PREFIX = `/ipwrc${process.pid}`;
const BASE = `${PREFIX}/pools/${POOL}`;

let cluster: EtcdCluster | undefined;
let kv: EtcdKV | undefined;
let tmp = '';
const daemons: TestDaemon[] = [];

/** The network config of node `node`'s daemon: a /24 in /28 blocks, `reclaimAfter` when given. */
function conf(reclaimAfter?: string): Record<string, unknown> {
  return {
    cniVersion: '1.0.0',
    name: 'rcnet',
    type: 'ipwarden',
    ipam: {
      type: 'ipwarden',
      dataDir: join(tmp, 'cni-data'),
      ranges: [[{ subnet: '10.237.41.0/24' }]],
      pool: { name: POOL, etcd: { endpoints: (cluster as EtcdCluster).endpoints, prefix: PREFIX }, blockSize: 28, ...(reclaimAfter === undefined ? {} : { reclaimAfter }) },
    },
  };
}

/** Start the daemon of `node` (its CNI configuration directory and data dir are kept across restarts). */
async function daemon(node: string, reclaimAfter?: string): Promise<TestDaemon> {
  const netd = join(tmp, node, 'net.d');
  mkdirSync(netd, { recursive: true });
  writeFileSync(join(netd, '10-rc.conf'), JSON.stringify(conf(reclaimAfter)));
  const d = await startTestDaemon({ cniConfDir: netd, dataDir: join(tmp, node, 'data'), env: { NODE_NAME: node }, args: ['--interval', '1h', '--grace', '1h'] });
  daemons.push(d);
  await d.waitForLog((l) => l.msg === 'pool announced');
  return d;
}

async function add(d: TestDaemon, id: string): Promise<string> {
  const r = await runViaDaemon(d.socket, { command: 'ADD', containerId: id, ifname: 'eth0', stdin: conf() });
  assert.equal(r.exitCode, 0, `${r.stdout}\n${r.stderr}`);
  return ((r.json?.['ips'] as Array<{ address: string }>)[0] as { address: string }).address.split('/')[0] as string;
}

/** Poll `cond` every 100 ms, at most `max` times. */
async function until(what: string, cond: () => Promise<boolean> | boolean, max = 1800): Promise<void> {
  for (let i = 0; !(await cond()); i++) {
    assert.ok(i < max, `timed out waiting for: ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** Handles left, as `containerId@node`, sorted. */
async function handles(): Promise<string[]> {
  const p = `${BASE}/handles/`;
  return (await (kv as EtcdKV).list(p)).map((e) => `${e.key.slice(p.length).split('/')[0]}@${(JSON.parse(e.value) as { node: string }).node}`).sort();
}

/** The blocks of `node` (`cidr state`), from the block values. */
async function blocksOf(node: string): Promise<string[]> {
  return (await (kv as EtcdKV).list(`${BASE}/blocks/`))
    .map((e) => JSON.parse(e.value) as { cidr: string; node: string; state: string })
    .filter((b) => b.node === node)
    .map((b) => `${b.cidr} ${b.state}`)
    .sort();
}

function audit(node: string): Array<Record<string, unknown>> {
  const f = join(tmp, node, 'data', '.ipwarden-audit.log');
  if (!existsSync(f)) return [];
  return readFileSync(f, 'utf8').trim().split('\n').filter((l) => l !== '').map((l) => JSON.parse(l) as Record<string, unknown>);
}

async function metric(d: TestDaemon, name: string): Promise<string> {
  const line = await d.waitForLog((l) => l.msg === 'metrics listening');
  const text = await (await fetch(`http://${line['metricsAddress'] as string}/metrics`)).text();
  return text.split('\n').filter((l) => l.startsWith(name)).join('\n');
}

describe('dead nodes reclaimed automatically (reclaimAfter; real 3-member etcd, real daemons)', { skip }, () => {
  before(async () => {
    tmp = mkdtempSync(join(tmpdir(), 'ipwrc-'));
    cluster = await startEtcdCluster({ members: 3, prefix: 'ipwrc-etcd-' });
    kv = new EtcdKV({ endpoints: cluster.endpoints });
  });
  after(async () => {
    for (const d of daemons) await d.stop().catch(() => undefined);
    await kv?.close();
    await cluster?.close();
    if (tmp !== '') rmSync(tmp, { recursive: true, force: true });
  });

  it('exactly one live daemon removes a dead node, audited and counted; a node that returns within the window vetoes; reclaimAfter off never acts', async () => {
    const e = kv as EtcdKV;
    const a = await daemon('rc-a');
    const ev = await daemon('rc-e');
    const aIps = [await add(a, 'rca-1'), await add(a, 'rca-2'), await add(a, 'rca-3')];
    const eIps = [await add(ev, 'rce-1'), await add(ev, 'rce-2')];
    const aBlocks = await blocksOf('rc-a');
    const eBlocks = await blocksOf('rc-e');
    assert.equal(aBlocks.length, 1);
    assert.equal(eBlocks.length, 1);
    // Both have been seen (seen/<node>, written on the first beat).
    await until('seen keys of rc-a and rc-e', async () => (await e.get(`${BASE}/seen/rc-a`)) !== null && (await e.get(`${BASE}/seen/rc-e`)) !== null);

    const b = await daemon('rc-b', '2s');
    const c = await daemon('rc-c', '2s');
    const d = await daemon('rc-d');

    // rc-a and rc-e die; their heartbeat keys go (the lease's expiry, done at once).
    a.kill('SIGKILL');
    ev.kill('SIGKILL');
    await a.exited;
    await ev.exited;
    await e.txn([], [{ delete: `${BASE}/alive/rc-a` }, { delete: `${BASE}/alive/rc-e` }]);

    // rc-e's removal begun: its daemon comes back at once and vetoes.
    await until('the removal of rc-e begun', async () => (await e.get(`${BASE}/removing/rc-e`)) !== null);
    const eMarker = JSON.parse((await e.get(`${BASE}/removing/rc-e`))?.value ?? '{}') as { by?: string };
    assert.ok(eMarker.by === 'rc-b' || eMarker.by === 'rc-c', `marker by ${String(eMarker.by)}`);
    const pending = eBlocks.map((x) => x.replace(' owned', ' pendingRelease'));
    await until("rc-e's block marked pendingRelease", async () => JSON.stringify(await blocksOf('rc-e')) === JSON.stringify(pending));
    const ev2 = await daemon('rc-e');
    await until('rc-e vetoed (marker gone, blocks owned)', async () => (await e.get(`${BASE}/removing/rc-e`)) === null && (await blocksOf('rc-e')).every((x) => x.endsWith(' owned')));
    assert.deepEqual(await blocksOf('rc-e'), eBlocks);

    // rc-a's removal: begun by exactly one of rc-b, rc-c, finished after the window.
    await until('the removal of rc-a begun', async () => (await e.get(`${BASE}/removing/rc-a`)) !== null);
    const aMarker = JSON.parse((await e.get(`${BASE}/removing/rc-a`))?.value ?? '{}') as { by?: string };
    const by = aMarker.by as string;
    assert.ok(by === 'rc-b' || by === 'rc-c', `marker by ${String(by)}`);
    const remover = by === 'rc-b' ? b : c;
    const other = by === 'rc-b' ? c : b;
    await until("rc-a's handles released and its block given back", async () => (await handles()).every((h) => !h.endsWith('@rc-a')) && (await e.list(`${BASE}/nodes/rc-a/`, { keysOnly: true })).length === 0 && (await e.get(`${BASE}/removing/rc-a`)) === null, 1500);
    assert.deepEqual(await handles(), ['rce-1@rc-e', 'rce-2@rc-e']);
    assert.deepEqual(await blocksOf('rc-a'), []);
    assert.equal(await e.get(`${BASE}/blocks/${(aBlocks[0] as string).split(' ')[0]?.replace('/', '-')}`), null);
    assert.equal(await e.get(`${BASE}/seen/rc-a`), null, "rc-a's last-seen record goes with it");

    // Audit: the remover's log only, intent then released per address, naming who and whom.
    const rows = (node: string) => audit(node).map((r) => [r['phase'], r['containerId'], r['ip'], r['node'], r['by'], r['pool'], r['network']]);
    const ids = ['rca-1', 'rca-2', 'rca-3'];
    const expected = [...ids.map((id, i) => ['intent', id, aIps[i], 'rc-a', by, POOL, 'rcnet']), ...ids.map((id, i) => ['released', id, aIps[i], 'rc-a', by, POOL, 'rcnet'])];
    assert.deepEqual(rows(by).sort(), expected.sort());
    assert.deepEqual(rows(by === 'rc-b' ? 'rc-c' : 'rc-b'), []);
    assert.deepEqual(rows('rc-d'), []);
    // Log lines: one begun per removal across all daemons, one reclaimed for rc-a (the remover's).
    const all = [b, c, d];
    const begun = all.flatMap((x) => x.logs.filter((l) => l.msg === 'pool node removal begun automatically').map((l) => `${String(l['node'])} by ${String(l['by'])}`));
    assert.deepEqual(begun.sort(), [`rc-a by ${by}`, `rc-e by ${String(eMarker.by)}`].sort());
    const reclaimed = remover.logs.filter((l) => l.msg === 'pool node reclaimed automatically');
    assert.deepEqual(reclaimed.map((l) => [l['node'], l['by'], [...(l['released'] as string[])].sort(), l['deletedBlocks'], l['keptBlocks']]), [['rc-a', by, [...aIps].sort(), [(aBlocks[0] as string).split(' ')[0]], []]]);
    assert.deepEqual([...other.logs, ...d.logs].filter((l) => l.msg === 'pool node reclaimed automatically'), []);
    assert.equal(await metric(remover, 'ipwarden_pool_nodes_reclaimed_total{'), `ipwarden_pool_nodes_reclaimed_total{pool="${POOL}"} 1`);
    assert.equal(await metric(other, 'ipwarden_pool_nodes_reclaimed_total{'), '');
    assert.equal(await metric(d, 'ipwarden_pool_nodes_reclaimed_total{'), '');

    // Once rc-e's veto window has expired: still intact, nothing of it audited.
    await until("rc-e's window expired", async () => (await e.get(`${BASE}/removal-window/rc-e`)) === null, 900);
    assert.equal(await e.get(`${BASE}/removing/rc-e`), null);
    assert.deepEqual(await handles(), ['rce-1@rc-e', 'rce-2@rc-e']);
    assert.deepEqual(await blocksOf('rc-e'), eBlocks);
    assert.deepEqual([...audit('rc-b'), ...audit('rc-c')].filter((r) => r['node'] === 'rc-e'), []);
    assert.equal(new Set([...aIps, ...eIps]).size, 5);

    // rc-a comes back after its removal: it starts fresh (settings again, a new block claimed).
    const a2 = await daemon('rc-a');
    const again = await add(a2, 'rca-4');
    assert.ok(again.startsWith('10.237.41.'), again);
    assert.equal((await blocksOf('rc-a')).length, 1);
    await until('rc-a served again (settings key)', async () => (await e.get(`${BASE}/nodes/rc-a/settings`)) !== null);
    void ev2;
  });
});
