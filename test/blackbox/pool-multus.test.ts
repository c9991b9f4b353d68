/**
 * A pool network known only from the requests the daemon serves (Multus: the config is in a
 * NetworkAttachmentDefinition, never in the node's CNI configuration directory; docs/cluster.md
 * "Multus"), with real parts: a real etcd (test/helpers/etcd-cluster.ts, one member on loopback),
 * the built daemon (`ipwarden daemon`, an EMPTY `--cni-conf-dir`) on the installed shim's socket,
 * the installed shim (what the runtime, or Multus, execs) with the network config on stdin, the
 * hostile fake CRI runtime (a real gRPC server) listing no sandbox, the real kernel evidence (a
 * network namespace `ipwmul-<pid>` with a veth holding one pool address), the built CLI:
 *
 * - an ADD through the shim → the daemon announces the node (heartbeat key, `"source":"requests"`),
 *   writes the record `<data dir>/.ipwarden-pool-networks/<sha256>.json` (mode 0600; the network
 *   config cut to cniVersion, name, ipam);
 * - the daemon restarted with no request: it heartbeats the pool again, ignores (and reports) a
 *   corrupt record beside it, and its pool pass releases the leaked handle (sandbox gone) after
 *   two passes a grace period apart, keeping the one whose address is configured in a namespace;
 * - `pool status` says SOURCE requests; `doctor` lists the pool "known only from requests" and
 *   the corrupt record;
 * - `pool remove-node` refuses without `--force` while the daemon runs; forced, the daemon vetoes
 *   it; once the daemon is stopped, step 1 works without `--force` (the settings key exists).
 *
 * Needs root, iproute2, /usr/bin/etcd and `npm run build`. With CI=true a missing part fails.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { hostname, tmpdir } from 'node:os';
import { join } from 'node:path';
import { EtcdKV } from '../../src/store/etcd/etcd-kv.ts';
import { installedPlugin, pluginSocket, ROOT, runCni } from '../helpers/cni.ts';
import { deleteNetnsAtExit, removeAtExit } from '../helpers/exit-cleanup.ts';
import { startTestDaemon, type TestDaemon } from '../helpers/daemon.ts';
import { haveEtcd, startEtcdCluster, type EtcdCluster } from '../helpers/etcd-cluster.ts';
import { startHostileCri, type HostileCri } from '../helpers/hostile-cri.ts';

const CI = process.env['CI'] === 'true';
const isRoot = process.getuid?.() === 0;
const haveIp = existsSync('/usr/sbin/ip') || existsSync('/usr/bin/ip') || existsSync('/sbin/ip');
const skip = CI ? false : !haveEtcd() ? '/usr/bin/etcd not installed' : !isRoot || !haveIp ? 'root and iproute2 (ip)' : false;
const NS = `ipwmul-${process.pid}`;
const NODE = 'mul-node';
const POOL = 'mulpool';
const NET = 'mulnet';

let cluster: EtcdCluster | undefined;
let kv: EtcdKV | undefined;
let cri: HostileCri | undefined;
let tmp = '';

function ip(...args: string[]): void {
  const r = spawnSync('ip', args, { encoding: 'utf8' });
  assert.equal(r.status, 0, `ip ${args.join(' ')}: ${r.stderr}`);
}

/** The pool part of the network config (what a NetworkAttachmentDefinition's spec.config holds under ipam). */
function ipam(p: string): Record<string, unknown> {
  // A /26 in /28 blocks: 10.249.18.0/28 … 10.249.18.48/28.
  return { type: 'ipwarden', ranges: [[{ subnet: '10.249.18.0/26' }]], pool: { name: POOL, etcd: { endpoints: (cluster as EtcdCluster).endpoints, prefix: p }, blockSize: 28 } };
}

/** The config Multus hands the main plugin (macvlan), which hands it whole to its IPAM plugin. */
function stdin(p: string): Record<string, unknown> {
  return { cniVersion: '1.0.0', name: NET, type: 'macvlan', master: 'eth0', mode: 'bridge', ipam: ipam(p) };
}

/** ADD through the installed shim (daemon up: the daemon answers). Returns the address. */
function add(p: string, id: string): string {
  const r = runCni(installedPlugin(), { command: 'ADD', containerId: id, ifname: 'net1', stdin: stdin(p) });
  assert.equal(r.exitCode, 0, `${r.stdout}\n${r.stderr}`);
  return ((r.json?.['ips'] as Array<{ address: string }>)[0] as { address: string }).address.split('/')[0] as string;
}

/** The handles under prefix `p`, as `containerId@node`, sorted. */
async function handles(p: string): Promise<string[]> {
  const base = `${p}/pools/${POOL}/handles/`;
  return (await (kv as EtcdKV).list(base)).map((e) => `${e.key.slice(base.length).split('/')[0]}@${(JSON.parse(e.value) as { node: string }).node}`).sort();
}

async function value(key: string): Promise<string | null> {
  return (await (kv as EtcdKV).get(key))?.value ?? null;
}

/** Poll `cond` every 100 ms, at most `max` times. */
async function until(what: string, cond: () => Promise<boolean> | boolean, max = 600): Promise<void> {
  for (let i = 0; !(await cond()); i++) {
    assert.ok(i < max, `timed out waiting for: ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** The built CLI, asynchronously (the fake CRI answers from this process). */
function cli(...args: string[]): Promise<{ status: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const c = spawn(process.execPath, [join(ROOT, 'bin/ipwarden'), ...args], { env: { PATH: '/usr/bin:/bin', NODE_NAME: NODE } });
    let stdout = '';
    let stderr = '';
    c.stdout.on('data', (b: Buffer) => (stdout += b.toString('utf8')));
    c.stderr.on('data', (b: Buffer) => (stderr += b.toString('utf8')));
    c.on('error', reject);
    c.on('close', (status) => resolve({ status, stdout, stderr }));
  });
}

function poolFlags(p: string): string[] {
  return ['--pool', POOL, '--etcd-endpoints', (cluster as EtcdCluster).endpoints.join(','), '--etcd-prefix', p];
}

describe('a pool network known only from requests (Multus): learned, kept across a restart, reconciled, vetoing (real etcd, daemon + shim, fake CRI, real netns)', { skip }, () => {
  before(async () => {
    tmp = mkdtempSync(join(tmpdir(), 'ipwmul-'));
    removeAtExit(tmp);
    cluster = await startEtcdCluster({ members: 1, prefix: 'ipwmul-etcd-' });
    kv = new EtcdKV({ endpoints: cluster.endpoints });
    cri = await startHostileCri({ path: join(tmp, 'cri.sock'), sandboxes: [] });
    ip('netns', 'add', NS);
    deleteNetnsAtExit(NS);
    ip('-n', NS, 'link', 'add', 'mul0', 'type', 'veth', 'peer', 'name', 'mul1');
    ip('-n', NS, 'link', 'set', 'mul0', 'up');
    ip('-n', NS, 'link', 'set', 'mul1', 'up');
  });
  after(async () => {
    if (existsSync(`/run/netns/${NS}`)) spawnSync('ip', ['netns', 'del', NS]);
    await cri?.close();
    await kv?.close();
    await cluster?.close();
    if (tmp !== '') rmSync(tmp, { recursive: true, force: true });
  });

  it('an ADD through the shim teaches the daemon the pool; after a restart with no request it heartbeats it, releases its leak, reports a corrupt record, and remove-node needs no --force once it is stopped', async () => {
    const p = `/mul${process.pid}`;
    const dataDir = join(tmp, 'data');
    const netd = join(tmp, 'net.d'); // empty: the pool is in no CNI configuration file
    mkdirSync(netd);
    const recDir = join(dataDir, '.ipwarden-pool-networks');
    const recName = `${createHash('sha256').update(JSON.stringify([(cluster as EtcdCluster).endpoints, p, POOL, NET])).digest('hex')}.json`;
    const alive = `${p}/pools/${POOL}/alive/${NODE}`;
    const settings = `${p}/pools/${POOL}/nodes/${NODE}/settings`;
    const daemonArgs = (grace: string): string[] => ['--interval', '1s', '--grace', grace, '--runtime-endpoint', (cri as HostileCri).endpoint];
    let d: TestDaemon | null = null;
    try {
      // 1. A daemon that knows no pool: no heartbeat, no record, until a request teaches it.
      d = await startTestDaemon({ socket: pluginSocket(), dataDir, cniConfDir: netd, env: { NODE_NAME: NODE }, args: daemonArgs('1h') });
      await d.waitForLog((l) => l.msg === 'reconcile pass');
      assert.deepEqual([await value(alive), existsSync(recDir)], [null, false]);
      const t0 = Date.now();
      add(p, 'leak1');
      const t1 = Date.now();
      const used = add(p, 'used1');
      // The record: only the daemon writes it, so the ADD went through the daemon.
      assert.deepEqual(readdirSync(recDir), [recName]);
      const st = statSync(join(recDir, recName));
      assert.deepEqual([st.mode & 0o777, st.uid, statSync(recDir).mode & 0o777], [0o600, 0, 0o700]);
      const rec = JSON.parse(readFileSync(join(recDir, recName), 'utf8')) as { v: number; learnedAt: number; config: unknown };
      assert.deepEqual(Object.keys(rec), ['v', 'learnedAt', 'config']);
      assert.equal(rec.v, 1);
      assert.ok(rec.learnedAt >= t0 && rec.learnedAt <= t1, `learnedAt ${rec.learnedAt} is the first ADD's time (${t0}..${t1})`);
      assert.deepEqual(rec.config, { cniVersion: '1.0.0', name: NET, ipam: ipam(p) }, 'the main plugin keys (type, master, mode) are not kept');
      const learned = await d.waitForLog((l) => l.msg === 'pool network learned');
      assert.deepEqual([learned['network'], learned['pool'], learned['source'], learned['file']], [NET, POOL, 'requests', join(recDir, recName)]);
      await until('the heartbeat key', async () => (await value(alive)) !== null);
      const hb1 = JSON.parse((await value(alive)) as string) as Record<string, unknown>;
      assert.deepEqual([hb1['node'], hb1['host'], hb1['pid'], hb1['source']], [NODE, hostname(), d.pid, 'requests']);
      assert.equal(await value(settings), '{"v":1,"offlineSeconds":0}');
      assert.deepEqual(await handles(p), [`leak1@${NODE}`, `used1@${NODE}`], 'nothing released within the 1 h grace');
      await d.stop();
      assert.equal(d.logs.filter((l) => l.msg === 'pool network learned').length, 1, 'learned once: the second ADD of the same config writes nothing');
      d = null;
      await until('the heartbeat key gone with the daemon (its lease revoked)', async () => (await value(alive)) === null);

      // 2. A corrupt record beside the good one, then a restart with no request at all.
      const bad = join(recDir, `${'a'.repeat(64)}.json`);
      writeFileSync(bad, '{"v":1,', { mode: 0o600 });
      ip('-n', NS, 'addr', 'add', `${used}/26`, 'dev', 'mul0'); // used1's address is in use in a namespace
      d = await startTestDaemon({ socket: pluginSocket(), dataDir, cniConfDir: netd, env: { NODE_NAME: NODE }, args: daemonArgs('2s') });
      const ignored = await d.waitForLog((l) => l.msg === 'pool network record cannot be used: ignored');
      assert.deepEqual([ignored['file'], ignored['error']], [bad, 'not valid JSON']);
      const announced = await d.waitForLog((l) => l.msg === 'pool announced');
      assert.deepEqual([announced['network'], announced['pool'], announced['source'], announced['file']], [NET, POOL, 'requests', join(recDir, recName)]);
      await until('the heartbeat key again, without any request', async () => (await value(alive)) !== null);
      const hb2 = JSON.parse((await value(alive)) as string) as Record<string, unknown>;
      assert.deepEqual([hb2['node'], hb2['pid'], hb2['source']], [NODE, d.pid, 'requests']);
      await until('leak1 released by the pool pass', async () => !(await handles(p)).includes(`leak1@${NODE}`));
      assert.deepEqual(await handles(p), [`used1@${NODE}`], "used1 kept: its address is configured in a namespace");
      const rel = await d.waitForLog((l) => l.msg === 'pool released');
      assert.deepEqual([rel['pool'], rel['node'], rel['network'], rel['containerId'], rel['ifname']], [POOL, NODE, NET, 'leak1', 'net1']);
      assert.equal(d.logs.filter((l) => l.msg === 'pool released').length, 1);

      // 3. pool status: the node's daemon knows the pool from requests.
      const s = await cli('pool', 'status', ...poolFlags(p), '--json');
      assert.equal(s.status, 0, s.stderr);
      const sj = JSON.parse(s.stdout) as { nodes: Array<{ node: string; used: number; heartbeat: string; source: string | null }> };
      assert.deepEqual(sj.nodes.map((n) => [n.node, n.used, n.heartbeat, n.source]), [[NODE, 1, 'yes', 'requests']]);

      // 4. doctor: the pool known only from requests, and the record it cannot use.
      const doc = await cli('doctor', '--data-dir', dataDir, '--cni-conf-dir', netd, '--runtime-endpoint', (cri as HostileCri).endpoint, '--json');
      const findings = (JSON.parse(doc.stdout) as { findings: Array<{ id: string; severity: string; title: string; evidence: string; fix: string }> }).findings.filter((f) => f.id.startsWith('pool-'));
      const at = new Date(rec.learnedAt).toISOString();
      const rf = join(recDir, recName);
      assert.deepEqual(findings, [
        {
          id: 'pool-network-record-unreadable',
          severity: 'warning',
          title: `the pool network record ${bad} cannot be used`,
          evidence: `${bad}: not valid JSON; the daemon ignores it (it logs "pool network record cannot be used: ignored" at start)`,
          fix: `remove ${bad}: the daemon records the network again at its next ADD or CHECK served through it`,
        },
        {
          id: 'pool-networks',
          severity: 'info',
          title: `this node serves pool ${POOL} (network ${NET}), known only from requests`,
          evidence: `etcd ${(cluster as EtcdCluster).endpoints.join(',')} prefix ${p}; known from the requests the daemon served (recorded in ${rf} at ${at}); the daemon heartbeats in the pool and releases this node's leaked addresses of it`,
          fix: `nothing to do while the node uses the network; once no pod of the node uses it (ipwarden pool leaks --pool ${POOL} …), remove ${rf} and restart the daemon to stop caring for it`,
        },
      ]);

      // 5. remove-node: refused while the daemon heartbeats; forced, vetoed by the daemon.
      const r1 = await cli('pool', 'remove-node', NODE, ...poolFlags(p));
      assert.deepEqual(
        [r1.status, r1.stdout, r1.stderr],
        [1, '', `ipwarden: node ${NODE} has a live heartbeat in pool ${POOL} (${alive}, written by the ipwarden daemon on host ${hostname()} (pid ${d.pid})): it is not gone; stop the daemon on host ${hostname()} first, or pass --force if you are sure\n`],
      );
      assert.equal(await value(`${p}/pools/${POOL}/removing/${NODE}`), null, 'a refusal writes nothing');
      const r2 = await cli('pool', 'remove-node', NODE, ...poolFlags(p), '--force', '--json');
      assert.equal(r2.status, 0, r2.stderr);
      assert.deepEqual((JSON.parse(r2.stdout) as { heartbeat: string }).heartbeat, 'yes');
      await until('the daemon vetoed the forced removal (marker deleted)', async () => (await value(`${p}/pools/${POOL}/removing/${NODE}`)) === null, 300);
      assert.deepEqual(await handles(p), [`used1@${NODE}`]);
      await d.stop();
      d = null;

      // 6. Daemon stopped: the settings key says a daemon served the node, so step 1 needs no --force.
      await until('the heartbeat key gone', async () => (await value(alive)) === null);
      const r3 = await cli('pool', 'remove-node', NODE, ...poolFlags(p), '--json');
      assert.equal(r3.status, 0, r3.stderr);
      assert.deepEqual((JSON.parse(r3.stdout) as { node: string; heartbeat: string }).heartbeat, 'expired');
    } finally {
      await d?.stop();
      spawnSync('ip', ['-n', NS, 'addr', 'flush', 'dev', 'mul0']);
    }
  });
});
