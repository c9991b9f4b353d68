/**
 * The fallback's node name, black-box (issue 11, task POOLOBS): `ipwarden install-cni` run with
 * NODE_NAME (as the DaemonSet's init container is) writes `DIR/ipwarden.d/node-name`, and a pool
 * ADD through the installed shim with the daemon down — the standalone fallback, run with the
 * runtime's environment, which has no NODE_NAME — claims its block and records its handle under
 * that name, not the host name; NODE_NAME still wins when given; a file others can write fails the
 * ADD with code 7 naming it. Also `pool status --html --out` on the same etcd shows the node.
 * A real etcd (test/helpers/etcd-cluster.ts, one member on loopback). Needs `npm run build` and
 * root (the installed files must be root's). With CI=true a missing /usr/bin/etcd fails.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { chmodSync, mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs';
import { hostname, tmpdir } from 'node:os';
import { join } from 'node:path';
import { EtcdKV } from '../../src/store/etcd/etcd-kv.ts';
import { ROOT, runCni, type Outcome } from '../helpers/cni.ts';
import { haveEtcd, startEtcdCluster, type EtcdCluster } from '../helpers/etcd-cluster.ts';

const CI = process.env['CI'] === 'true';
const skip = haveEtcd() || CI ? false : '/usr/bin/etcd not installed';
const NODE = 'k8s-node-poolobs-7';

describe('the fallback names the node from the file install-cni wrote (real etcd)', { skip }, () => {
  let cluster: EtcdCluster | undefined;
  let kv: EtcdKV | undefined;
  let t = '';
  let bin = '';
  const P = `/poolobs${process.pid}`;
  const conf = () => ({
    cniVersion: '1.0.0',
    name: 'nnnet',
    ipam: { type: 'ipwarden', ranges: [[{ subnet: '10.85.0.0/27' }]], pool: { name: 'nnpool', etcd: { endpoints: (cluster as EtcdCluster).endpoints, prefix: P }, blockSize: 28 } },
  });
  const add = (id: string, env: Record<string, string> = {}): Outcome => runCni(join(bin, 'ipwarden'), { command: 'ADD', containerId: id, ifname: 'eth0', stdin: conf(), env });
  const handleNode = async (id: string): Promise<string> => JSON.parse((await (kv as EtcdKV).get(`${P}/pools/nnpool/handles/${id}/eth0`))?.value ?? '{}').node as string;

  before(async () => {
    assert.equal(process.geteuid?.(), 0, 'needs root: the installed files must be root-owned');
    assert.notEqual(hostname(), NODE);
    t = mkdtempSync(join(tmpdir(), 'ipwarden-poolobs-bb-'));
    bin = join(t, 'bin');
    // The daemon is down: nobody listens on this socket, so the shim falls back to the standalone.
    const r = spawnSync(process.execPath, [join(ROOT, 'dist/ipwarden.cjs'), 'install-cni', '--dest', bin, '--socket', join(t, 'nobody.sock')], {
      encoding: 'utf8',
      env: { PATH: '/usr/bin:/bin', NODE_NAME: NODE },
      timeout: 120_000,
    });
    assert.equal(r.status, 0, r.stdout + r.stderr);
    assert.equal(r.stdout.split('\n')[0], `installed ${join(bin, 'ipwarden.d', 'node-name')} (node name ${NODE})`);
    cluster = await startEtcdCluster({ members: 1, prefix: 'ipwarden-poolobs-etcd-' });
    kv = new EtcdKV({ endpoints: cluster.endpoints });
  });
  after(async () => {
    await kv?.close();
    await cluster?.close();
    if (t !== '') rmSync(t, { recursive: true, force: true });
  });

  it('install-cni wrote DIR/ipwarden.d/node-name: the name and a newline, 0644 in a 0755 directory', () => {
    assert.equal(readFileSync(join(bin, 'ipwarden.d', 'node-name'), 'utf8'), `${NODE}\nhost ${hostname()}\n`);
    assert.equal(statSync(join(bin, 'ipwarden.d', 'node-name')).mode & 0o7777, 0o644);
    assert.equal(statSync(join(bin, 'ipwarden.d')).mode & 0o7777, 0o755);
  });

  it('a pool ADD through the shim with the daemon down and no NODE_NAME claims and records under the file\'s name', async () => {
    const r = add('nn1');
    assert.equal(r.exitCode, 0, r.stdout + r.stderr);
    assert.equal(await handleNode('nn1'), NODE);
    const claims = (await (kv as EtcdKV).list(`${P}/pools/nnpool/nodes/`, { keysOnly: true })).map((e) => e.key.slice(`${P}/pools/nnpool/nodes/`.length).split('/')[0]);
    assert.deepEqual([...new Set(claims)], [NODE], 'no block under the host name');
    // The fallback was taken (its counting line; install-cni's own check counted a VERSION), so this was the standalone, not a daemon.
    assert.deepEqual(readFileSync(join(t, 'standalone-requests.log'), 'utf8').split('\n').filter((l) => / ADD /.test(l)).map((l) => l.replace(/^\d+ /, '')), ['ADD ok']);
    // The standalone exec'd directly (as the shim does) names the node the same way.
    const d = runCni(join(bin, 'ipwarden-standalone'), { command: 'ADD', containerId: 'nn2', ifname: 'eth0', stdin: conf() });
    assert.equal(d.exitCode, 0, d.stdout + d.stderr);
    assert.equal(await handleNode('nn2'), NODE);
  });

  it('NODE_NAME in the standalone\'s environment still comes first; the shim never passes one on (docs/daemon.md)', async () => {
    const r = runCni(join(bin, 'ipwarden-standalone'), { command: 'ADD', containerId: 'nn3', ifname: 'eth0', stdin: conf(), env: { NODE_NAME: 'other-node' } });
    assert.equal(r.exitCode, 0, r.stdout + r.stderr);
    assert.equal(await handleNode('nn3'), 'other-node');
    const s = add('nn5', { NODE_NAME: 'other-node' });
    assert.equal(s.exitCode, 0, s.stdout + s.stderr);
    assert.equal(await handleNode('nn5'), NODE, 'the shim keeps only CNI_*, CONTAINER_RUNTIME_ENDPOINT and PATH');
  });

  it('pool status --html --out writes the page with the node; stdout has the table', () => {
    const page = join(t, 'pool.html');
    const r = spawnSync(process.execPath, [join(ROOT, 'bin/ipwarden'), 'pool', 'status', '--pool', 'nnpool', '--etcd-endpoints', (cluster as EtcdCluster).endpoints.join(','), '--etcd-prefix', P, '--html', '--out', page], { encoding: 'utf8', timeout: 60_000 });
    assert.equal(r.status, 0, r.stdout + r.stderr);
    assert.match(r.stdout, /^pool nnpool: blocks \/28 \(IPv4\), \/122 \(IPv6\)\n/);
    const html = readFileSync(page, 'utf8');
    assert.ok(html.startsWith('<!DOCTYPE html>'));
    assert.match(html, new RegExp(`<tr data-node="${NODE}" data-alive="no" data-heartbeat="never"><td>${NODE}</td><td class="n">1</td><td class="n">(14|15)</td><td class="n">3</td><td class="n">0</td>`));
    assert.match(html, /<tr data-node="other-node" data-alive="no" data-heartbeat="never"><td>other-node<\/td><td class="n">1<\/td>/);
    assert.match(html, /<dd data-count="used">4<\/dd>/);
    // Without --out the page is the whole stdout.
    const s = spawnSync(process.execPath, [join(ROOT, 'bin/ipwarden'), 'pool', 'status', '--pool', 'nnpool', '--etcd-endpoints', (cluster as EtcdCluster).endpoints.join(','), '--etcd-prefix', P, '--html'], { encoding: 'utf8', timeout: 60_000 });
    assert.equal(s.status, 0, s.stderr);
    assert.ok(s.stdout.startsWith('<!DOCTYPE html>') && s.stdout.endsWith('</body></html>\n'));
  });

  it('a node-name file others can write fails the ADD with code 7 naming it (never the host name)', async () => {
    const f = join(bin, 'ipwarden.d', 'node-name');
    chmodSync(f, 0o666);
    try {
      const r = add('nn4');
      assert.equal(r.exitCode, 1, r.stdout);
      assert.deepEqual([r.json?.['code'], r.json?.['msg']], [7, `the node name file ${f}: ${f} is writable by group or others (mode 666)`]);
      assert.equal(await (kv as EtcdKV).get(`${P}/pools/nnpool/handles/nn4/eth0`), null);
      // A DEL never fails for a node name: it releases by owner.
      const d = runCni(join(bin, 'ipwarden'), { command: 'DEL', containerId: 'nn1', ifname: 'eth0', stdin: conf() });
      assert.equal(d.exitCode, 0, d.stdout + d.stderr);
      assert.equal(await (kv as EtcdKV).get(`${P}/pools/nnpool/handles/nn1/eth0`), null);
    } finally {
      chmodSync(f, 0o644);
    }
  });
});
