/**
 * The node's reconcile of its cluster-pool attachments (issue 11, docs/cluster.md "Reconcile per
 * node") with real parts: a real etcd (test/helpers/etcd-cluster.ts, one member on loopback), the
 * built daemon (`ipwarden daemon`) with a pool network in its CNI configuration, the hostile fake
 * CRI runtime (test/helpers/hostile-cri.ts, a real gRPC server) as its runtime, the real kernel
 * evidence (a network namespace `ipwpgc-<pid>` with a veth pair holding a pool address), and the
 * installed plugin:
 *
 * - the daemon releases a leaked handle (an ADD whose sandbox the runtime never lists) after two
 *   passes a grace period apart, audits it with pool and revision and counts it; it keeps a live
 *   sandbox's handle, a handle whose address is configured in a namespace, and another node's;
 * - CNI GC (1.1.0) through the installed plugin and through the daemon's socket releases exactly
 *   the handles of this node and network that are not valid attachments and not in use;
 * - GC with an unreachable etcd: code 11, nothing written.
 *
 * Needs root, iproute2 and `npm run build`. With CI=true a missing /usr/bin/etcd or `ip` fails
 * instead of skipping.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { EtcdKV } from '../../src/store/etcd/etcd-kv.ts';
import { installedPlugin, ROOT, runCni, standalonePlugin, type Outcome } from '../helpers/cni.ts';
import { deleteNetnsAtExit, removeAtExit } from '../helpers/exit-cleanup.ts';
import { runViaDaemon } from '../helpers/daemon-client.ts';
import { startTestDaemon, type LogLine, type TestDaemon } from '../helpers/daemon.ts';
import { haveEtcd, startEtcdCluster, type EtcdCluster } from '../helpers/etcd-cluster.ts';
import { startHostileCri, type HostileCri } from '../helpers/hostile-cri.ts';

const CI = process.env['CI'] === 'true';
const isRoot = process.getuid?.() === 0;
const haveIp = existsSync('/usr/sbin/ip') || existsSync('/usr/bin/ip') || existsSync('/sbin/ip');
const skip = CI ? false : !haveEtcd() ? '/usr/bin/etcd not installed' : !isRoot || !haveIp ? 'root and iproute2 (ip)' : false;
const NS = `ipwpgc-${process.pid}`;
const NODE = 'pgc-node';
const POOL = 'pgcpool';

let cluster: EtcdCluster | undefined;
let kv: EtcdKV | undefined;
let cri: HostileCri | undefined;
let tmp = '';
let n = 0;

function ip(...args: string[]): void {
  const r = spawnSync('ip', args, { encoding: 'utf8' });
  assert.equal(r.status, 0, `ip ${args.join(' ')}: ${r.stderr}`);
}

/** A pool network config under a fresh prefix; `dataDir` in our temp dir (GC's audit log goes there). */
function conf(p: string, cniVersion = '1.1.0', ipam: Record<string, unknown> = {}) {
  return {
    cniVersion,
    name: 'pgcnet',
    ipam: {
      type: 'ipwarden',
      dataDir: join(tmp, 'data'),
      // A /26 in /28 blocks: 10.86.0.0/28 … 10.86.0.48/28.
      ranges: [[{ subnet: '10.86.0.0/26' }]],
      pool: { name: POOL, etcd: { endpoints: (cluster as EtcdCluster).endpoints, prefix: p }, blockSize: 28 },
      ...ipam,
    },
  };
}

function add(stdin: object, id: string, node: string): string {
  const r = runCni(standalonePlugin(), { command: 'ADD', containerId: id, ifname: 'eth0', stdin, env: { NODE_NAME: node } });
  assert.equal(r.exitCode, 0, `${r.stdout}\n${r.stderr}`);
  return ((r.json?.['ips'] as Array<{ address: string }>)[0] as { address: string }).address.split('/')[0] as string;
}

/** The handles left under prefix `p`, as `containerId@node`, sorted. */
async function handles(p: string): Promise<string[]> {
  const base = `${p}/pools/${POOL}/handles/`;
  return (await (kv as EtcdKV).list(base)).map((e) => `${e.key.slice(base.length).split('/')[0]}@${(JSON.parse(e.value) as { node: string }).node}`).sort();
}

/** Poll `cond` every 100 ms, at most `max` times. */
async function until(what: string, cond: () => Promise<boolean> | boolean, max = 600): Promise<void> {
  for (let i = 0; !(await cond()); i++) {
    assert.ok(i < max, `timed out waiting for: ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** Configure `addr` on a veth inside the test's namespace (the kernel then shows it in use). */
function configure(addr: string): void {
  ip('-n', NS, 'addr', 'flush', 'dev', 'pgc0'); // what an earlier test left (it flushes too, unless it failed early)
  ip('-n', NS, 'addr', 'add', `${addr}/26`, 'dev', 'pgc0');
}

function cniError(r: Outcome): { code: number; msg: string } {
  assert.equal(r.exitCode, 1, r.stdout);
  return { code: r.json?.['code'] as number, msg: r.json?.['msg'] as string };
}

function gcStdin(p: string, valid: string[], ipam: Record<string, unknown> = {}) {
  return { ...conf(p, '1.1.0', ipam), 'cni.dev/valid-attachments': valid.map((id) => ({ containerID: id, ifname: 'eth0' })) };
}

/** `ipwarden pool leaks` of the built CLI, asynchronously (the fake CRI answers from this process). */
function poolLeaks(p: string, ...args: string[]): Promise<{ status: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const c = spawn(process.execPath, [join(ROOT, 'bin/ipwarden'), 'pool', 'leaks', '--pool', POOL, '--etcd-endpoints', (cluster as EtcdCluster).endpoints.join(','), '--etcd-prefix', p, ...args], { env: { PATH: '/usr/bin:/bin', NODE_NAME: NODE } });
    let stdout = '';
    let stderr = '';
    c.stdout.on('data', (b: Buffer) => (stdout += b.toString('utf8')));
    c.stderr.on('data', (b: Buffer) => (stderr += b.toString('utf8')));
    c.on('error', reject);
    c.on('close', (status) => resolve({ status, stdout, stderr }));
  });
}

async function metric(d: TestDaemon, name: string): Promise<string> {
  const line = await d.waitForLog((l) => l.msg === 'metrics listening');
  const text = await (await fetch(`http://${line['metricsAddress'] as string}/metrics`)).text();
  return text.split('\n').filter((l) => l.startsWith(name)).join('\n');
}

describe('the node reconciles its pool attachments (real etcd, daemon, fake CRI, real netns)', { skip }, () => {
  before(async () => {
    tmp = mkdtempSync(join(tmpdir(), 'ipwpgc-'));
    removeAtExit(tmp);
    cluster = await startEtcdCluster({ members: 1, prefix: 'ipwpgc-etcd-' });
    kv = new EtcdKV({ endpoints: cluster.endpoints });
    cri = await startHostileCri({ path: join(tmp, 'cri.sock'), sandboxes: [] });
    ip('netns', 'add', NS);
    deleteNetnsAtExit(NS);
    ip('-n', NS, 'link', 'add', 'pgc0', 'type', 'veth', 'peer', 'name', 'pgc1');
    ip('-n', NS, 'link', 'set', 'pgc0', 'up');
    ip('-n', NS, 'link', 'set', 'pgc1', 'up');
  });
  after(async () => {
    if (existsSync(`/run/netns/${NS}`)) spawnSync('ip', ['netns', 'del', NS]);
    await cri?.close();
    await kv?.close();
    await cluster?.close();
    if (tmp !== '') rmSync(tmp, { recursive: true, force: true });
  });

  it("the daemon releases its node's leak after two passes a grace period apart, and keeps a live sandbox's, a configured address's and another node's", async () => {
    const p = `/pgc${process.pid}-${++n}`;
    add(conf(p), 'leak1', NODE);
    add(conf(p), 'live1', NODE);
    const held = add(conf(p), 'used1', NODE);
    add(conf(p), 'other1', 'pgc-other');
    configure(held);
    (cri as HostileCri).setSandboxes([{ id: 'live1', state: 'notready' }]);
    // `pool leaks` lists (and releases nothing): verdicts by the evidence rules, ages by revision.
    const lk = await poolLeaks(p, '--runtime-endpoint', (cri as HostileCri).endpoint, '--grace', '0s', '--json');
    assert.equal(lk.status, 0, lk.stderr);
    const lj = JSON.parse(lk.stdout) as { node: string; revision: string; handles: Array<{ containerId: string; verdict: string }> };
    assert.deepEqual([lj.node, /^[0-9]+$/.test(lj.revision)], [NODE, true]);
    assert.deepEqual(lj.handles.map((h) => [h.containerId, h.verdict]), [['leak1', 'leaked'], ['live1', 'live'], ['used1', 'in use']]);
    const netd = join(tmp, `net.d-${n}`);
    spawnSync('mkdir', ['-p', netd]);
    const { name, cniVersion, ...plugin } = conf(p, '1.0.0');
    writeFileSync(join(netd, '10-pgc.conflist'), JSON.stringify({ cniVersion, name, plugins: [{ type: 'macvlan', ...plugin }] }));
    const d = await startTestDaemon({ cniConfDir: netd, env: { NODE_NAME: NODE }, args: ['--interval', '1s', '--grace', '2s', '--runtime-endpoint', (cri as HostileCri).endpoint] });
    try {
      await until('leak1 released', async () => !(await handles(p)).includes(`leak1@${NODE}`)).catch((e: Error) => {
        throw new Error(`${e.message}; the daemon's pool lines: ${JSON.stringify(d.logs.filter((l) => /pool/.test(l.msg)).slice(0, 6))}`);
      });
      assert.deepEqual(await handles(p), ['live1@pgc-node', 'other1@pgc-other', 'used1@pgc-node']);
      // (the log line of the pass that released it comes after the transaction)
      await d.waitForLog((l) => l.msg === 'pool reconcile pass' && l['released'] === 1);
      const passes = d.logs.filter((l) => l.msg === 'pool reconcile pass');
      const rel = d.logs.filter((l) => l.msg === 'pool released');
      assert.equal(rel.length, 1, JSON.stringify(rel));
      assert.deepEqual([rel[0]?.['pool'], rel[0]?.['node'], rel[0]?.['network'], rel[0]?.['containerId'], rel[0]?.['ifname']], [POOL, NODE, 'pgcnet', 'leak1', 'eth0']);
      // Two observations: the first pass that judged it leaked only noted it (waiting), a later one released it.
      const firstSeen = passes.findIndex((l) => (l['pools'] as Array<{ leaked: number }>)[0]?.leaked === 1);
      const first = passes[firstSeen] as LogLine;
      assert.deepEqual([first['released'], first['waiting']], [0, 1]);
      assert.deepEqual(first['pools'], [{ pool: POOL, node: NODE, live: 1, inUse: 1, grace: 0, leaked: 1, unknown: 0 }]);
      assert.ok(passes.findIndex((l) => l['released'] === 1) > firstSeen, 'released in a later pass than the first observation');
      // Audited like the node-local reconciler, with pool and revision, intent first.
      const audit = readFileSync(join(d.dataDir, '.ipwarden-audit.log'), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as Record<string, unknown>);
      assert.deepEqual(audit.map((a) => [a['phase'], a['network'], a['containerId'], a['ifname'], a['verdict'], a['pool'], a['revision']]), [
        ['intent', 'pgcnet', 'leak1', 'eth0', 'leaked', POOL, rel[0]?.['modRevision']],
        ['released', 'pgcnet', 'leak1', 'eth0', 'leaked', POOL, rel[0]?.['modRevision']],
      ]);
      assert.deepEqual(audit[0]?.['ip'], (rel[0]?.['ips'] as string[])[0]);
      assert.equal(await metric(d, 'ipwarden_pool_releases_total{'), `ipwarden_pool_releases_total{pool="${POOL}",reason="daemon"} 1`);
      // A few more passes change nothing.
      const seen = passes.length;
      await until('two more pool passes', () => d.logs.filter((l) => l.msg === 'pool reconcile pass').length >= seen + 2);
      assert.deepEqual(await handles(p), ['live1@pgc-node', 'other1@pgc-other', 'used1@pgc-node']);

      // CNI GC through the daemon's socket: only the valid list's attachments and those in use stay.
      const gc = await runViaDaemon(d.socket, { command: 'GC', stdin: gcStdin(p, ['other1']) });
      assert.deepEqual([gc.exitCode, gc.stdout], [0, '']);
      assert.deepEqual(await handles(p), ['other1@pgc-other', 'used1@pgc-node'], 'live1 (not in the valid list, its address configured nowhere) released; used1 kept; another node untouched');
      assert.equal(await metric(d, 'ipwarden_pool_releases_total{'), `ipwarden_pool_releases_total{pool="${POOL}",reason="daemon"} 1\nipwarden_pool_releases_total{pool="${POOL}",reason="gc"} 1`);
    } finally {
      await d.stop();
      spawnSync('ip', ['-n', NS, 'addr', 'flush', 'dev', 'pgc0']);
    }
  });

  it('CNI GC through the installed plugin: exactly the stale handles of this node and network go; an unreachable etcd is code 11 with nothing written', async () => {
    const p = `/pgc${process.pid}-${++n}`;
    // nodeName in the config: the same node whether the shim falls back to the standalone or a daemon answers.
    const mine = { nodeName: NODE };
    add(conf(p, '1.1.0', mine), 'gA', NODE);
    add(conf(p, '1.1.0', mine), 'gB', NODE);
    const used = add(conf(p, '1.1.0', mine), 'gC', NODE);
    add(conf(p, '1.1.0'), 'gD', 'pgc-other');
    add({ ...conf(p, '1.1.0', mine), name: 'pgcnet2' }, 'gE', NODE);
    configure(used);
    try {
      const r = runCni(installedPlugin(), { command: 'GC', stdin: gcStdin(p, ['gA'], mine) });
      assert.deepEqual([r.exitCode, r.stdout], [0, ''], r.stderr);
      assert.deepEqual(await handles(p), ['gA@pgc-node', 'gC@pgc-node', 'gD@pgc-other', 'gE@pgc-node']);
      const audit = readFileSync(join(tmp, 'data', '.ipwarden-audit.log'), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as Record<string, unknown>);
      assert.deepEqual(audit.filter((a) => a['containerId'] === 'gB').map((a) => [a['phase'], a['pool'], a['verdict']]), [
        ['intent', POOL, 'leaked'],
        ['released', POOL, 'leaked'],
      ]);
      assert.deepEqual(audit.filter((a) => ['gA', 'gC', 'gD', 'gE'].includes(String(a['containerId']))), [], 'nothing else was about to be released');
    } finally {
      spawnSync('ip', ['-n', NS, 'addr', 'flush', 'dev', 'pgc0']);
    }
    // etcd unreachable (a port nobody listens on): code 11, nothing released.
    const dead = gcStdin(p, [], mine);
    dead.ipam.pool.etcd = { endpoints: ['http://127.0.0.1:9'], prefix: p };
    const before = await handles(p);
    const r2 = runCni(installedPlugin(), { command: 'GC', stdin: dead });
    const e = cniError(r2);
    assert.equal(e.code, 11);
    assert.match(e.msg, /^etcd at http:\/\/127\.0\.0\.1:9 is unavailable: /);
    assert.deepEqual(await handles(p), before);
  });
});
