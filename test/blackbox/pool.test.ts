/**
 * Cluster pools through the installed plugin (issue 11): a real etcd (test/helpers/etcd-cluster.ts,
 * one member on loopback) and two simulated nodes — the standalone plugin exec'd with different
 * NODE_NAMEs — sharing one pool: exact block claims, no address twice (also under concurrent
 * ADDs), repeated ADD, DEL releases and is idempotent, CHECK, and exact errors and codes for bad
 * configs, bad node names, an unreachable etcd and a missing TLS file (corrupt values: pool-corrupt.test.ts). One
 * test goes through the shim (`installedPlugin()`), so the daemon pass (IPWARDEN_TEST_DAEMON=1)
 * runs it through the daemon's pool sessions. Needs `npm run build`. With CI=true a missing
 * /usr/bin/etcd fails instead of skipping.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { hostname, tmpdir } from 'node:os';
import { join } from 'node:path';
import { startTestDaemon } from '../helpers/daemon.ts';
import { runViaDaemon } from '../helpers/daemon-client.ts';
import { startNodeProxies } from '../helpers/tcp-proxy.ts';
import { EtcdKV } from '../../src/store/etcd/etcd-kv.ts';
import { poolJournalDir } from '../../src/pool/journal.ts';
import { installedPlugin, ROOT, runCni, runCniAsync, standalonePlugin, type Outcome } from '../helpers/cni.ts';
import { haveEtcd, startEtcdCluster, type EtcdCluster } from '../helpers/etcd-cluster.ts';

const CI = process.env['CI'] === 'true';
const skip = haveEtcd() || CI ? false : '/usr/bin/etcd not installed';

let cluster: EtcdCluster | undefined;
let kv: EtcdKV | undefined;
let n = 0;

/** A fresh key prefix per test, so tests share the etcd but no keys. */
function prefix(): string {
  return `/bb${process.pid}-${++n}`;
}

function conf(p: string, extra: Record<string, unknown> = {}, pool: Record<string, unknown> = {}) {
  return {
    cniVersion: '1.0.0',
    name: 'poolnet',
    ipam: {
      type: 'ipwarden',
      // A /27 as two /28 blocks: 10.81.0.0/28 (.2–.15: .1 is the gateway) and 10.81.0.16/28 (.16–.30).
      ranges: [[{ subnet: '10.81.0.0/27' }]],
      pool: { name: 'bbpool', etcd: { endpoints: (cluster as EtcdCluster).endpoints, prefix: p }, blockSize: 28, ...pool },
      ...extra,
    },
  };
}

function add(stdin: object, id: string, node: string, bin = standalonePlugin()): Outcome {
  return runCni(bin, { command: 'ADD', containerId: id, ifname: 'eth0', stdin, env: { NODE_NAME: node } });
}
function del(stdin: object, id: string, node: string, bin = standalonePlugin()): Outcome {
  return runCni(bin, { command: 'DEL', containerId: id, ifname: 'eth0', stdin, env: { NODE_NAME: node } });
}
function address(r: Outcome): string {
  assert.equal(r.exitCode, 0, `${r.stdout}\n${r.stderr}`);
  return ((r.json?.['ips'] as Array<{ address: string }>)[0] as { address: string }).address;
}
function cniError(r: Outcome): { code: number; msg: string } {
  assert.equal(r.exitCode, 1, r.stdout);
  return { code: r.json?.['code'] as number, msg: r.json?.['msg'] as string };
}
/** Block keys per node from the affinity index. */
async function claims(p: string): Promise<Record<string, string[]>> {
  const out: Record<string, string[]> = {};
  const base = `${p}/pools/bbpool/nodes/`;
  for (const e of await (kv as EtcdKV).list(base, { keysOnly: true })) {
    const [node, , block] = e.key.slice(base.length).split('/');
    (out[node as string] ??= []).push(block as string);
  }
  return out;
}

describe('cluster pool through the plugin, on a real etcd', { skip }, () => {
  before(async () => {
    cluster = await startEtcdCluster({ members: 1, prefix: 'ipwarden-pool-bb-' });
    kv = new EtcdKV({ endpoints: cluster.endpoints });
  });
  after(async () => {
    await kv?.close();
    await cluster?.close();
  });

  it('two nodes share one pool: each claims its own block; a repeated ADD returns the same address', async () => {
    const p = prefix();
    assert.equal(address(add(conf(p), 'c1', 'node-a')), '10.81.0.16/27');
    assert.equal(address(add(conf(p), 'c2', 'node-b')), '10.81.0.2/27');
    assert.equal(address(add(conf(p), 'c1', 'node-a')), '10.81.0.16/27');
    assert.deepEqual(await claims(p), { 'node-a': ['10.81.0.16-28'], 'node-b': ['10.81.0.0-28'] });
    const r = add(conf(p), 'c3', 'node-a');
    assert.deepEqual(r.json, { cniVersion: '1.0.0', ips: [{ address: '10.81.0.17/27', gateway: '10.81.0.1' }] });
  });

  it('concurrent ADDs of both nodes never give one address twice; after all DELs no handle is left and each node that owns a block keeps exactly one', async () => {
    const p = prefix();
    const bin = standalonePlugin();
    const ids = Array.from({ length: 10 }, (_, i) => ({ id: `k${i}`, node: i % 2 === 0 ? 'node-a' : 'node-b' }));
    const rs = await Promise.all(ids.map((x) => runCniAsync(bin, { command: 'ADD', containerId: x.id, ifname: 'eth0', stdin: conf(p), env: { NODE_NAME: x.node } })));
    const got = rs.map(address);
    assert.equal(new Set(got).size, 10, got.join(' '));
    const dels = await Promise.all(ids.map((x) => runCniAsync(bin, { command: 'DEL', containerId: x.id, ifname: 'eth0', stdin: conf(p), env: { NODE_NAME: x.node } })));
    for (const d of dels) assert.equal(d.exitCode, 0, d.stdout);
    assert.deepEqual(await (kv as EtcdKV).list(`${p}/pools/bbpool/handles/`, { keysOnly: true }), []);
    // Emptied blocks are given back, never a node's last one. Which nodes end with a block depends on
    // the interleaving: two ADDs of one node may claim both blocks at once, and the other node then
    // borrows (no free block left) and owns none.
    const c = await claims(p);
    assert.ok(Object.keys(c).length >= 1, JSON.stringify(c));
    assert.deepEqual(Object.values(c).map((b) => b.length), Object.keys(c).map(() => 1), JSON.stringify(c));
  });

  it('DEL releases (round robin moves on), is idempotent, and CHECK sees what is held', async () => {
    const p = prefix();
    assert.equal(address(add(conf(p), 'c1', 'node-a')), '10.81.0.16/27');
    const d = del(conf(p), 'c1', 'node-a');
    assert.deepEqual([d.exitCode, d.stdout], [0, '']);
    const again = del(conf(p), 'c1', 'node-a');
    assert.deepEqual([again.exitCode, again.stdout], [0, '']);
    assert.equal(address(add(conf(p), 'c2', 'node-a')), '10.81.0.17/27');
    const bin = standalonePlugin();
    const ok = runCni(bin, { command: 'CHECK', containerId: 'c2', ifname: 'eth0', stdin: conf(p), env: { NODE_NAME: 'node-a' } });
    assert.equal(ok.exitCode, 0, ok.stdout);
    const missing = runCni(bin, { command: 'CHECK', containerId: 'c1', ifname: 'eth0', stdin: conf(p), env: { NODE_NAME: 'node-a' } });
    assert.deepEqual(cniError(missing), { code: 999, msg: 'ipwarden: Failed to find address added by container c1' });
  });

  it('a DEL that finds no handle leaves a leased tombstone: a late ADD transaction fails on it, a fresh ADD overwrites it (review F4)', async () => {
    const p = prefix();
    const hk = `${p}/pools/bbpool/handles/ghost/eth0`;
    const d = del(conf(p), 'ghost', 'node-a');
    assert.deepEqual([d.exitCode, d.stdout], [0, '']);
    const t = await (kv as EtcdKV).get(hk);
    assert.deepEqual(JSON.parse(t?.value ?? 'null'), { v: 1, node: 'node-a', network: 'poolnet', at: JSON.parse(t?.value ?? '{}').at, ips: [], deleted: true });
    // Put with a lease of 600 s (etcdctl shows the key's lease and its granted TTL).
    const ctl = (...a: string[]) => spawnSync('/usr/bin/etcdctl', ['--endpoints', (cluster as EtcdCluster).endpoints.join(','), ...a], { encoding: 'utf8', env: { ...process.env, ETCDCTL_API: '3' } });
    // (the lease ID is an int64: read it as text, JSON numbers lose its low bits)
    const lease = BigInt(/"lease":([0-9]+)/.exec(ctl('get', hk, '-w', 'json').stdout)?.[1] ?? '0');
    assert.ok(lease > 0n, 'the tombstone has a lease');
    assert.match(ctl('lease', 'timetolive', lease.toString(16)).stdout, /granted with TTL\(600s\)/);
    // What a late ADD transaction of ghost (sent before the DEL, applied by etcd after it) compares: the handle absent.
    assert.equal((await (kv as EtcdKV).txn([{ key: hk, absent: true }], [{ put: hk, value: '{"late":true}' }])).succeeded, false);
    assert.deepEqual(cniError(runCni(standalonePlugin(), { command: 'CHECK', containerId: 'ghost', ifname: 'eth0', stdin: conf(p), env: { NODE_NAME: 'node-a' } })), { code: 999, msg: 'ipwarden: Failed to find address added by container ghost' });
    assert.equal(address(add(conf(p), 'ghost', 'node-a')), '10.81.0.16/27', 'a fresh ADD overwrites the tombstone');
    assert.equal(del(conf(p), 'ghost', 'node-a').exitCode, 0);
    assert.equal(await (kv as EtcdKV).get(hk), null);
  });

  it('through the shim (the daemon in the daemon pass): ADD, repeated ADD, DEL', () => {
    const p = prefix();
    const bin = installedPlugin();
    const first = address(add(conf(p), 's1', 'node-s', bin));
    assert.match(first, /^10\.81\.0\.[0-9]+\/27$/);
    assert.equal(address(add(conf(p), 's1', 'node-s', bin)), first);
    assert.equal(del(conf(p), 's1', 'node-s', bin).exitCode, 0);
  });

  it('a full pool fails with host-local\'s text and writes nothing', async () => {
    const p = prefix();
    const tiny = conf(p, { ranges: [[{ subnet: '10.81.1.0/30' }]] }); // .2 only (.1 gateway)
    assert.equal(address(add(tiny, 't1', 'node-a')), '10.81.1.2/30');
    assert.deepEqual(cniError(add(tiny, 't2', 'node-b')), { code: 999, msg: 'failed to allocate for range 0: no IP addresses available in range set: 10.81.1.1-10.81.1.2' });
    assert.equal(await (kv as EtcdKV).get(`${p}/pools/bbpool/handles/t2/eth0`), null);
  });

  it('bad configs and node names: code 7, exact messages', () => {
    const p = prefix();
    assert.deepEqual(cniError(add(conf(p, {}, { blockSize: 19 }), 'c1', 'node-a')), { code: 7, msg: 'ipam.pool.blockSize must be an integer from 24 to 32, got 19' });
    assert.deepEqual(cniError(add(conf(p, {}, { etcd: { endpoints: ['127.0.0.1:2379'] } }), 'c1', 'node-a')), {
      code: 7,
      msg: 'ipam.pool.etcd.endpoints[0] must be http://HOST:PORT or https://HOST:PORT, got "127.0.0.1:2379"',
    });
    assert.deepEqual(cniError(add(conf(p), 'c1', 'bad name')), {
      code: 7,
      msg: `NODE_NAME must be a node name of at most 253 letters, digits, '_', '.' or '-' starting with a letter or digit, got "bad name"`,
    });
    // DEL does not fail on a bad node name (the runtime would retry it forever): it releases.
    assert.equal(address(add(conf(p), 'd1', 'node-a')), '10.81.0.16/27');
    const d = del(conf(p), 'd1', 'bad name');
    assert.deepEqual([d.exitCode, d.stdout], [0, '']);
    assert.equal(address(add(conf(p), 'd2', 'node-a')), '10.81.0.17/27');
    // Another layout of the same pool (its meta was written by the first ADD).
    address(add(conf(p), 'c1', 'node-a'));
    assert.deepEqual(cniError(add(conf(p, {}, { blockSize: 27 }), 'c2', 'node-b')), {
      code: 7,
      msg: `pool bbpool is recorded in etcd with ranges [10.81.0.0/27 10.81.0.1-10.81.0.30 gateway 10.81.0.1] and block sizes /28 (IPv4) and /122 (IPv6), but network poolnet has ranges [10.81.0.0/27 10.81.0.1-10.81.0.30 gateway 10.81.0.1] and block sizes /27 (IPv4) and /122 (IPv6): every network naming pool bbpool must have the same ranges and block sizes (the first to use the pool recorded them in ${p}/pools/bbpool/meta)`,
    });
  });

  it('a corrupt etcd value: nothing is allocated from it or released; the ADD uses another block, the DEL succeeds (test/blackbox/pool-corrupt.test.ts has the rest)', async () => {
    const p = prefix();
    assert.equal(address(add(conf(p), 'c1', 'node-a')), '10.81.0.16/27');
    const bk = `${p}/pools/bbpool/blocks/10.81.0.16-28`;
    const bad = '{"v":1,"cidr":"10.81.0.16/28","rangeSet":0,"node":"node-a","state":"owned","seq":"x"}';
    await (kv as EtcdKV).txn([], [{ put: bk, value: bad }]);
    assert.equal(address(add(conf(p), 'c2', 'node-a')), '10.81.0.2/27');
    assert.deepEqual([del(conf(p), 'c1', 'node-a').exitCode], [0]);
    assert.notEqual(await (kv as EtcdKV).get(`${p}/pools/bbpool/handles/c1/eth0`), null, 'the handle was not released');
    assert.equal((await (kv as EtcdKV).get(bk))?.value, bad, 'never rewritten');
  });

  it('an unreachable etcd is code 11 (try again later); a TLS file that cannot be read is code 5', () => {
    const p = prefix();
    const down = add(conf(p, {}, { etcd: { endpoints: ['http://127.0.0.1:1'], prefix: p } }), 'c1', 'node-a');
    const e = cniError(down);
    assert.equal(e.code, 11);
    assert.ok(e.msg.startsWith(`etcd at http://127.0.0.1:1 is unavailable: range ${p}/pools/bbpool/meta: UNAVAILABLE: `), e.msg);
    const tls = add(conf(p, {}, { etcd: { endpoints: ['https://127.0.0.1:1'], tls: { ca: '/nonexistent/ipwarden-pool-ca.pem' } } }), 'c1', 'node-a');
    assert.deepEqual(cniError(tls), { code: 5, msg: 'ipam.pool.etcd.tls.ca: open /nonexistent/ipwarden-pool-ca.pem: no such file or directory' });
    // DEL with etcd down is not lost silently: it fails (11) and the runtime retries it.
    assert.equal(cniError(del(conf(p, {}, { etcd: { endpoints: ['http://127.0.0.1:1'], prefix: p } }), 'c1', 'node-a')).code, 11);
  });

  /** `ipwarden pool …` of the built CLI. */
  function cli(p: string, ...args: string[]): { status: number | null; stdout: string; stderr: string } {
    const r = spawnSync(process.execPath, [join(ROOT, 'bin/ipwarden'), 'pool', ...args, '--pool', 'bbpool', '--etcd-endpoints', (cluster as EtcdCluster).endpoints.join(','), '--etcd-prefix', p], { encoding: 'utf8', timeout: 60_000 });
    return { status: r.status, stdout: r.stdout, stderr: r.stderr };
  }

  it('pool status --json: blocks per node, usage and free cluster-wide, exactly', () => {
    const p = prefix();
    add(conf(p), 'c1', 'node-a');
    add(conf(p), 'c2', 'node-b');
    add(conf(p), 'c3', 'node-a');
    const r = cli(p, 'status', '--json');
    assert.equal(r.status, 0, r.stderr);
    assert.deepEqual(JSON.parse(r.stdout), {
      version: 1,
      pool: 'bbpool',
      blockSize: 28,
      blockSize6: 122,
      rangeSets: [{ index: 0, ranges: '10.81.0.1-10.81.0.30', size: '29', used: 3, reserved: 0, unreadable: 0, pendingRelease: 0, free: '26', blocksClaimed: 2 }],
      nodes: [
        { node: 'node-a', blocks: 1, capacity: 15, used: 2, borrowed: 0, reserved: 0, alive: false, heartbeat: 'never', source: null },
        { node: 'node-b', blocks: 1, capacity: 14, used: 1, borrowed: 0, reserved: 0, alive: false, heartbeat: 'never', source: null },
      ],
      blocks: [
        { cidr: '10.81.0.0/28', rangeSet: 0, node: 'node-b', state: 'owned', capacity: 14, used: 1, borrowed: 0, reserved: 0 },
        { cidr: '10.81.0.16/28', rangeSet: 0, node: 'node-a', state: 'owned', capacity: 15, used: 2, borrowed: 0, reserved: 0 },
      ],
      corrupt: [],
      overlaps: [],
    });
    const unknown = spawnSync(process.execPath, [join(ROOT, 'bin/ipwarden'), 'pool', 'status', '--pool', 'nope', '--etcd-endpoints', (cluster as EtcdCluster).endpoints.join(','), '--etcd-prefix', p], { encoding: 'utf8' });
    assert.equal(unknown.status, 1);
    assert.equal(unknown.stderr, `ipwarden: pool nope has no data in etcd ${(cluster as EtcdCluster).endpoints.join(',')} under ${p} (no ${p}/pools/nope/meta key: never used)\n`);
  });

  it('pool remove-node on a node that is merely partitioned, then returns: its next ADD vetoes, --finish refuses (exit 1), no duplicate', () => {
    const p = prefix();
    assert.equal(address(add(conf(p), 'c1', 'node-a')), '10.81.0.16/27');
    // node-a is served by the standalone plugin only (no settings key): step 1 needs --force.
    const mark = cli(p, 'remove-node', 'node-a', '--json', '--force');
    assert.equal(mark.status, 0, mark.stderr);
    assert.deepEqual(JSON.parse(mark.stdout), { version: 1, node: 'node-a', pendingRelease: ['10.81.0.16/28'], heartbeat: 'never', windowSeconds: 60 });
    // node-b cannot borrow in the pending block; it claims the other one.
    assert.equal(address(add(conf(p), 'c2', 'node-b')), '10.81.0.2/27');
    // node-a returns: its ADD vetoes the removal.
    assert.equal(address(add(conf(p), 'c3', 'node-a')), '10.81.0.17/27');
    const fin = cli(p, 'remove-node', 'node-a', '--finish', '--json');
    // With --json the refusal is JSON on stdout (trial finding 11).
    assert.deepEqual([fin.status, fin.stderr], [1, '']);
    assert.deepEqual(JSON.parse(fin.stdout), { version: 1, error: { code: 'STORE_CONFLICT', msg: `node node-a is not marked for removal in pool bbpool (no ${p}/pools/bbpool/removing/node-a): run remove-node without --finish first, or it vetoed (it is back)` } });
    assert.equal(address(add(conf(p), 'c1', 'node-a')), '10.81.0.16/27', 'c1 still holds its address');
  });

  it('pool remove-node --finish without step 1 refuses (exit 1) and releases nothing, also a node holding only borrowed addresses (review F1b)', async () => {
    const p = prefix();
    assert.equal(address(add(conf(p), 'c1', 'node-a')), '10.81.0.16/27');
    assert.equal(address(add(conf(p), 'c2', 'node-b')), '10.81.0.2/27');
    assert.equal(address(add(conf(p), 'c3', 'node-c')), '10.81.0.3/27', 'node-c: no free block, it borrows (in node-b\'s block)');
    const before = (await (kv as EtcdKV).list(`${p}/`)).map((e) => `${e.key}@${e.modRevision}`);
    const fin = cli(p, 'remove-node', 'node-c', '--finish');
    assert.deepEqual([fin.status, fin.stdout, fin.stderr], [1, '', `ipwarden: node node-c is not marked for removal in pool bbpool (no ${p}/pools/bbpool/removing/node-c): run remove-node without --finish first, or it vetoed (it is back)\n`]);
    assert.deepEqual((await (kv as EtcdKV).list(`${p}/`)).map((e) => `${e.key}@${e.modRevision}`), before, 'nothing written');
  });

  it('the daemon announces its node in every pool its CNI configurations name at start: an idle node that comes back vetoes a removal begun while it was away', async () => {
    const p = prefix();
    const held = address(add(conf(p), 'c1', 'node-x'));
    // No daemon has served node-x yet (no settings key): step 1 needs --force.
    const mark = cli(p, 'remove-node', 'node-x', '--force');
    assert.equal(mark.status, 0, mark.stderr);
    const rk = `${p}/pools/bbpool/removing/node-x`;
    assert.notEqual(await (kv as EtcdKV).get(rk), null);
    const netd = mkdtempSync(join(tmpdir(), 'ipwarden-pool-bb-netd-'));
    try {
      const { name, cniVersion, ...plugin } = conf(p);
      writeFileSync(join(netd, '10-pool.conflist'), JSON.stringify({ cniVersion, name, plugins: [{ type: 'macvlan', ...plugin }] }));
      const d = await startTestDaemon({ cniConfDir: netd, env: { NODE_NAME: 'node-x' } });
      try {
        const line = await d.waitForLog((l) => l.msg === 'pool announced');
        assert.deepEqual([line['network'], line['pool']], ['poolnet', 'bbpool']);
        // No CNI request reached it: the heartbeat alone vetoes (the marker goes, the block is owned again).
        for (let i = 0; (await (kv as EtcdKV).get(rk)) !== null; i++) {
          assert.ok(i < 600, 'the daemon vetoed within 60 s');
          await new Promise((r) => setTimeout(r, 100));
        }
        assert.notEqual(await (kv as EtcdKV).get(`${p}/pools/bbpool/alive/node-x`), null, 'its heartbeat key');
        const fin = cli(p, 'remove-node', 'node-x', '--finish');
        assert.equal(fin.status, 1);
        assert.equal(address(add(conf(p), 'c1', 'node-x')), held, 'its pod keeps its address');
      } finally {
        await d.stop();
      }
    } finally {
      rmSync(netd, { recursive: true, force: true });
    }
  });

  it('pool remove-node of a node that is gone: refused while its heartbeat is live; --finish releases its addresses and frees its block', async () => {
    const p = prefix();
    add(conf(p), 'c1', 'node-a');
    add(conf(p), 'c2', 'node-b');
    // node-a's daemon heartbeat (a lease-backed key), as PoolSessions writes it.
    const lease = await (kv as EtcdKV).grantLease(30);
    const ak = `${p}/pools/bbpool/alive/node-a`;
    await (kv as EtcdKV).txn([], [{ put: ak, value: '{"v":1,"node":"node-a","since":1}', lease }]);
    const refused = cli(p, 'remove-node', 'node-a');
    assert.deepEqual([refused.status, refused.stdout, refused.stderr], [1, '', `ipwarden: node node-a has a live heartbeat in pool bbpool (${ak}): it is not gone; stop its daemon first, or pass --force if you are sure\n`]);
    assert.equal(JSON.parse(cli(p, 'status', '--json').stdout).nodes[0].alive, true);
    await (kv as EtcdKV).revokeLease(lease);
    assert.equal(await (kv as EtcdKV).get(ak), null, 'a revoked lease takes its key');
    // The settings key a daemon of node-a writes when it serves the node (it is not a standalone-only node).
    await (kv as EtcdKV).txn([], [{ put: `${p}/pools/bbpool/nodes/node-a/settings`, value: '{"v":1,"offlineSeconds":0}' }]);
    const mark = cli(p, 'remove-node', 'node-a');
    assert.deepEqual([mark.status, mark.stdout], [
      0,
      `removal of node-a begun (${p}/pools/bbpool/removing/node-a); 1 block marked pendingRelease: 10.81.0.16/28\n` +
        `warning: node-a's heartbeat has expired (no ${ak}; an ipwarden daemon served it before): if it does not come back within the veto window (60 s), it is treated as gone and --finish releases its addresses; check first (kubectl get node node-a; ipwarden pool leaks on node-a)\n` +
        'if node-a comes back it vetoes this; once it is surely gone (and at least 60 s from now), run again with --finish\n',
    ]);
    const forced = cli(p, 'remove-node', 'node-a', '--finish', '--force');
    assert.deepEqual([forced.status, forced.stderr], [2, 'ipwarden: --force applies to step 1 only: --finish never overrides a live heartbeat\n']);
    // The veto window: --finish refuses while step 1's leased window key exists.
    const wk = `${p}/pools/bbpool/removal-window/node-a`;
    const early = cli(p, 'remove-node', 'node-a', '--finish');
    assert.deepEqual([early.status, early.stdout, early.stderr], [1, '', `ipwarden: the veto window of node node-a's removal from pool bbpool has not passed (${wk} exists until its 60 s lease expires): try --finish again later\n`]);
    // Let the window pass: revoke its lease (etcdctl; the lease ID read as text, an int64).
    const ctl = (...a: string[]) => spawnSync('/usr/bin/etcdctl', ['--endpoints', (cluster as EtcdCluster).endpoints.join(','), ...a], { encoding: 'utf8', env: { ...process.env, ETCDCTL_API: '3' } });
    const wlease = BigInt(/"lease":([0-9]+)/.exec(ctl('get', wk, '-w', 'json').stdout)?.[1] ?? '0');
    assert.ok(wlease > 0n, 'the window key has a lease');
    assert.match(ctl('lease', 'timetolive', wlease.toString(16)).stdout, /granted with TTL\(60s\)/);
    assert.equal(ctl('lease', 'revoke', wlease.toString(16)).status, 0);
    assert.equal(await (kv as EtcdKV).get(wk), null);
    const fin = cli(p, 'remove-node', 'node-a', '--finish');
    assert.deepEqual([fin.status, fin.stdout], [0, 'released 1 address of node-a; deleted 1 block(s): 10.81.0.16/28\n']);
    assert.equal(await (kv as EtcdKV).get(`${p}/pools/bbpool/nodes/node-a/settings`), null, '--finish deleted its settings key');
    const st = JSON.parse(cli(p, 'status', '--json').stdout) as { nodes: Array<{ node: string }>; rangeSets: Array<{ free: string }> };
    assert.deepEqual(st.nodes.map((x) => x.node), ['node-b']);
    assert.equal(st.rangeSets[0]?.free, '28');
  });
});

describe('offline allocation: a daemon cut off from etcd keeps allocating from its reserve, never from others\' (real etcd, a TCP proxy)', { skip }, () => {
  let ocluster: EtcdCluster | undefined;
  let okv: EtcdKV | undefined;
  before(async () => {
    ocluster = await startEtcdCluster({ members: 1, prefix: 'ipwarden-pool-offline-bb-' });
    okv = new EtcdKV({ endpoints: ocluster.endpoints });
  });
  after(async () => {
    await okv?.close();
    await ocluster?.close();
  });

  /** Bounded poll of an async condition (100 ms apart, at most `ms`): no sleep decides an outcome. */
  async function until(cond: () => Promise<boolean>, what: string, ms = 60_000): Promise<void> {
    for (let i = 0; !(await cond()); i++) {
      assert.ok(i * 100 < ms, what);
      await new Promise((r) => setTimeout(r, 100));
    }
  }

  it('cut the proxy: ADDs succeed with distinct reserve addresses while another node allocates others; restore: the journal is synced, handles match; all DELs leave no handle; remove-node gives the node a window of 2·120 + 10 s', async (t) => {
    const c = ocluster as EtcdCluster;
    const ekv = okv as EtcdKV;
    const p = `/bboff${process.pid}`;
    const base = `${p}/pools/offpool`;
    const proxies = await startNodeProxies(c.endpoints);
    const work = mkdtempSync(join(tmpdir(), 'ipwarden-pool-offline-bb-'));
    const netd = join(work, 'net.d');
    const dataDir = join(work, 'data');
    mkdirSync(netd);
    /** A /27 as two /28 blocks; the daemon's node keeps 3 reserve entries and may allocate offline for 120 s. */
    const cfg = (endpoints: readonly string[]) => ({
      cniVersion: '1.0.0',
      name: 'offnet',
      ipam: { type: 'ipwarden', dataDir, ranges: [[{ subnet: '10.83.0.0/27' }]], pool: { name: 'offpool', etcd: { endpoints, prefix: p }, blockSize: 28, offline: { reserve: 3, seconds: 120 } } },
    });
    const viaProxy = cfg(proxies.endpoints);
    const direct = cfg(c.endpoints);
    const { name, cniVersion, ...plugin } = viaProxy;
    writeFileSync(join(netd, '10-off.conflist'), JSON.stringify({ cniVersion, name, plugins: [{ type: 'macvlan', ...plugin }] }));
    // The journal root: the test's own (the default is the host's /var/lib/cni/networks/.ipwarden-pool-offline).
    const journalRoot = join(work, 'journal');
    const start = () => startTestDaemon({ cniConfDir: netd, env: { NODE_NAME: 'node-off' }, args: ['--pool-journal-dir', journalRoot] });
    let d = await start();
    const dadd = (id: string) => runViaDaemon(d.socket, { command: 'ADD', containerId: id, ifname: 'eth0', stdin: viaProxy });
    const ddel = (id: string) => runViaDaemon(d.socket, { command: 'DEL', containerId: id, ifname: 'eth0', stdin: viaProxy });
    const ip = (r: Outcome): string => address(r).split('/')[0] as string;
    /** node-off's reserve entries in etcd (address text). */
    const reserves = async (): Promise<string[]> => {
      const out: string[] = [];
      for (const e of await ekv.list(`${base}/blocks/`)) {
        const v = JSON.parse(e.value) as { cidr: string; node: string; allocs: Record<string, { reserve?: boolean }> };
        const [net] = v.cidr.split('/');
        const last = Number((net as string).split('.')[3]);
        for (const [o, a] of Object.entries(v.allocs)) if (a.reserve === true && v.node === 'node-off') out.push(`10.83.0.${last + Number(o)}`);
      }
      return out.sort();
    };
    const liveHandles = async (): Promise<string[]> => (await ekv.list(`${base}/handles/`)).filter((e) => JSON.parse(e.value).deleted !== true).map((e) => e.key.slice(`${base}/handles/`.length));
    try {
      await d.waitForLog((l) => l.msg === 'pool announced');
      await until(async () => (await reserves()).length === 3 && (await ekv.get(`${base}/nodes/node-off/settings`)) !== null, 'the daemon set its reserve aside at start');
      assert.equal((await ekv.get(`${base}/nodes/node-off/settings`))?.value, '{"v":1,"offlineSeconds":120}');
      const reserve = await reserves();
      const on1 = ip(await dadd('on1'));
      assert.ok(!reserve.includes(on1), 'a connected ADD never takes a reserve entry');

      // The partition: the daemon's etcd traffic is black-holed.
      proxies.setMode({ kind: 'drop' });
      const t0 = performance.now();
      const offline = await Promise.all(['off1', 'off2', 'off3'].map((id) => dadd(id)));
      t.diagnostic(`3 concurrent offline ADDs answered in ${Math.round(performance.now() - t0)} ms (one etcd call deadline, then the reserve)`);
      const offIps = offline.map(ip);
      assert.equal(new Set(offIps).size, 3, 'distinct addresses');
      assert.deepEqual([...offIps].sort(), reserve, 'exactly the reserve');
      assert.deepEqual(ip(await dadd('off1')), offIps[0], 'a repeated offline ADD gets the journal\'s answer');
      // One directory per (etcd prefix, pool) under the root, not under the network's dataDir (review F2).
      const journal = poolJournalDir(journalRoot, p, 'offpool', 'node-off');
      assert.equal(existsSync(join(dataDir, '.ipwarden-pool-offline')), false);
      assert.equal(readdirSync(journal).length, 3);
      // Another node, connected, allocates meanwhile: nothing in common with the offline ones.
      const others = ['b1', 'b2', 'b3', 'b4', 'b5'].map((id) => address(add(direct, id, 'node-b')).split('/')[0] as string);
      assert.deepEqual(others.filter((x) => offIps.includes(x) || x === on1), []);
      assert.equal(await ekv.get(`${base}/handles/off1/eth0`), null, 'nothing of the offline ADDs reached etcd');

      // A restart while still cut off: the new daemon loads the journal before it serves (review
      // F2, F6) and answers a repeated ADD from it.
      await d.stop();
      d = await start();
      await d.waitForLog((l) => l.msg === 'pool journal loaded' && l['entries'] === 3);
      assert.deepEqual(ip(await dadd('off2')), offIps[1], 'the restarted daemon answers from the journal it loaded');

      // Restore: the first successful call syncs the journal.
      proxies.setMode({ kind: 'pass' });
      const t1 = performance.now();
      await until(async () => readdirSync(journal).length === 0, 'the journal is synced and emptied');
      t.diagnostic(`journal synced ${Math.round(performance.now() - t1)} ms after the proxy passed traffic again (100 ms polls)`);
      for (const [i, id] of ['off1', 'off2', 'off3'].entries()) {
        const h = JSON.parse((await ekv.get(`${base}/handles/${id}/eth0`))?.value ?? 'null') as { node: string; ips: Array<{ ip: string }> };
        assert.deepEqual([h.node, h.ips.map((x) => x.ip)], ['node-off', [offIps[i]]], `the handle of ${id} matches its offline answer`);
      }
      await until(async () => (await reserves()).length === 3, 'the reserve is refilled');
      assert.deepEqual((await reserves()).filter((x) => offIps.includes(x)), [], 'the synced addresses are no reserve entries any more');

      // All DELs: no handle left (only node-off's reserve entries stay, in its kept block).
      for (const id of ['on1', 'off1', 'off2', 'off3']) assert.equal((await ddel(id)).exitCode, 0);
      for (const id of ['b1', 'b2', 'b3', 'b4', 'b5']) assert.equal(del(direct, id, 'node-b').exitCode, 0);
      assert.deepEqual(await liveHandles(), []);
      assert.equal((await reserves()).length, 3);
      // The node is gone (its daemon stops: its heartbeat goes): step 1 sizes the window from its settings.
      await d.stop();
      const ctl = (...a: string[]) => spawnSync('/usr/bin/etcdctl', ['--endpoints', c.endpoints.join(','), ...a], { encoding: 'utf8', env: { ...process.env, ETCDCTL_API: '3' } });
      const mark = spawnSync(process.execPath, [join(ROOT, 'bin/ipwarden'), 'pool', 'remove-node', 'node-off', '--pool', 'offpool', '--etcd-endpoints', c.endpoints.join(','), '--etcd-prefix', p], { encoding: 'utf8', timeout: 60_000 });
      assert.equal(mark.status, 0, mark.stderr);
      assert.match(mark.stdout, /at least 250 s from now/);
      const wlease = BigInt(/"lease":([0-9]+)/.exec(ctl('get', `${base}/removal-window/node-off`, '-w', 'json').stdout)?.[1] ?? '0');
      assert.match(ctl('lease', 'timetolive', wlease.toString(16)).stdout, /granted with TTL\(250s\)/);
    } finally {
      await d.stop();
      await proxies.close();
      rmSync(work, { recursive: true, force: true });
    }
  });
});

describe('remove-node and pool status for a node only the standalone plugin serves (trial findings 1, 5, 11; real etcd, the built CLI and daemon)', { skip }, () => {
  let pc: EtcdCluster | undefined;
  let pkv: EtcdKV | undefined;
  let m = 0;
  before(async () => {
    pc = await startEtcdCluster({ members: 1, prefix: 'ipwarden-polish-bb-' });
    pkv = new EtcdKV({ endpoints: pc.endpoints });
  });
  after(async () => {
    await pkv?.close();
    await pc?.close();
  });
  const pfx = () => `/polish${process.pid}-${++m}`;
  const pconf = (p: string) => ({
    cniVersion: '1.0.0',
    name: 'polnet',
    ipam: { type: 'ipwarden', ranges: [[{ subnet: '10.85.0.0/27' }]], pool: { name: 'polpool', etcd: { endpoints: (pc as EtcdCluster).endpoints, prefix: p }, blockSize: 28 } },
  });
  const pcli = (p: string, ...args: string[]) => {
    const r = spawnSync(process.execPath, [join(ROOT, 'bin/ipwarden'), 'pool', ...args, '--pool', 'polpool', '--etcd-endpoints', (pc as EtcdCluster).endpoints.join(','), '--etcd-prefix', p], { encoding: 'utf8', timeout: 60_000 });
    return { status: r.status, stdout: r.stdout, stderr: r.stderr };
  };
  const keys = async (p: string) => (await (pkv as EtcdKV).list(`${p}/`)).map((e) => `${e.key}@${e.modRevision}`);

  it('a live standalone-only node: status says HEARTBEAT never; step 1 refuses (exit 1, nothing written; --json: the error as JSON on stdout); --force marks it', async () => {
    const p = pfx();
    assert.equal(address(add(pconf(p), 's1', 'node-sa')), '10.85.0.2/27');
    const table = pcli(p, 'status');
    assert.equal(table.status, 0, table.stderr);
    assert.match(table.stdout, /^node-sa +1 +14 +1 +0 +0 +never +- +-$/m);
    const before = await keys(p);
    const refused = pcli(p, 'remove-node', 'node-sa');
    const msg = `node node-sa has never been served by an ipwarden daemon in pool polpool (no ${p}/pools/polpool/nodes/node-sa/settings): it writes no heartbeat, so it cannot veto its removal while idle; if it is gone (kubectl get node node-sa), pass --force`;
    assert.deepEqual([refused.status, refused.stdout, refused.stderr], [1, '', `ipwarden: ${msg}\n`]);
    const json = pcli(p, 'remove-node', 'node-sa', '--json');
    assert.deepEqual([json.status, json.stderr], [1, '']);
    assert.deepEqual(JSON.parse(json.stdout), { version: 1, error: { code: 'STORE_CONFLICT', msg } });
    assert.deepEqual(await keys(p), before, 'nothing written');
    const forced = pcli(p, 'remove-node', 'node-sa', '--force');
    assert.deepEqual([forced.status, forced.stdout], [
      0,
      `removal of node-sa begun (${p}/pools/polpool/removing/node-sa); 1 block marked pendingRelease: 10.85.0.0/28\n` +
        'warning: node-sa has never been served by an ipwarden daemon: it cannot veto while idle, so --finish after the veto window (60 s) releases every address it holds, in use or not\n' +
        'if node-sa comes back it vetoes this; once it is surely gone (and at least 60 s from now), run again with --finish\n',
    ]);
  });

  it('a name with nothing in the pool (a typo) is refused, also with --force: exit 1, nothing written', async () => {
    const p = pfx();
    address(add(pconf(p), 's1', 'node-sa'));
    const before = await keys(p);
    for (const extra of [[], ['--force']]) {
      const r = pcli(p, 'remove-node', 'node-zzz', ...extra);
      assert.deepEqual([r.status, r.stdout, r.stderr], [1, '', 'ipwarden: node node-zzz has nothing in pool polpool: nothing to remove (a typo?)\n']);
    }
    const j = pcli(p, 'remove-node', 'node-zzz', '--json');
    assert.deepEqual([j.status, JSON.parse(j.stdout)], [1, { version: 1, error: { code: 'STORE_CONFLICT', msg: 'node node-zzz has nothing in pool polpool: nothing to remove (a typo?)' } }]);
    assert.deepEqual(await keys(p), before, 'nothing written');
    // Other --json errors too: the usage error of --finish --force (exit 2), a pool never used (exit 1).
    const u = pcli(p, 'remove-node', 'node-sa', '--finish', '--force', '--json');
    assert.deepEqual([u.status, u.stderr, JSON.parse(u.stdout)], [2, '', { version: 1, error: { code: 'USAGE', msg: '--force applies to step 1 only: --finish never overrides a live heartbeat' } }]);
    const nf = spawnSync(process.execPath, [join(ROOT, 'bin/ipwarden'), 'pool', 'status', '--json', '--pool', 'nope', '--etcd-endpoints', (pc as EtcdCluster).endpoints.join(','), '--etcd-prefix', p], { encoding: 'utf8' });
    assert.deepEqual([nf.status, nf.stderr, JSON.parse(nf.stdout)], [1, '', { version: 1, error: { code: 'IPAM_NOT_FOUND', msg: `pool nope has no data in etcd ${(pc as EtcdCluster).endpoints.join(',')} under ${p} (no ${p}/pools/nope/meta key: never used)` } }]);
  });

  it('a daemon-served node: its heartbeat names the daemon (host, pid) in the refusal; once the daemon stops, status says expired and step 1 warns with the window', async () => {
    const p = pfx();
    const netd = mkdtempSync(join(tmpdir(), 'ipwarden-polish-netd-'));
    try {
      const { name, cniVersion, ...plugin } = pconf(p);
      writeFileSync(join(netd, '10-pol.conflist'), JSON.stringify({ cniVersion, name, plugins: [{ type: 'macvlan', ...plugin }] }));
      assert.equal(address(add(pconf(p), 'y1', 'node-y')), '10.85.0.16/27', 'an address of node-y (through the standalone plugin)');
      const d = await startTestDaemon({ cniConfDir: netd, env: { NODE_NAME: 'node-y' } });
      const ak = `${p}/pools/polpool/alive/node-y`;
      try {
        await d.waitForLog((l) => l.msg === 'pool announced');
        for (let i = 0; (await (pkv as EtcdKV).get(ak)) === null; i++) {
          assert.ok(i < 300, 'the heartbeat key within 30 s');
          await new Promise((r) => setTimeout(r, 100));
        }
        assert.equal((await (pkv as EtcdKV).get(`${p}/pools/polpool/nodes/node-y/settings`))?.value, '{"v":1,"offlineSeconds":0}');
        const alive = JSON.parse((await (pkv as EtcdKV).get(ak))?.value as string);
        assert.deepEqual([alive.node, alive.host, alive.pid, alive.source], ['node-y', hostname(), d.pid, 'cni-config']);
        // Its first beat also records when it was last seen (seen/<node>): waited for, then shown after it stops.
        for (let i = 0; (await (pkv as EtcdKV).get(`${p}/pools/polpool/seen/node-y`)) === null; i++) {
          assert.ok(i < 300, 'the last-seen key within 30 s');
          await new Promise((r) => setTimeout(r, 100));
        }
        assert.match(pcli(p, 'status').stdout, /^node-y +1 +15 +1 +0 +0 +yes +now +cni-config$/m);
        const live = pcli(p, 'remove-node', 'node-y');
        assert.deepEqual([live.status, live.stdout, live.stderr], [1, '', `ipwarden: node node-y has a live heartbeat in pool polpool (${ak}, written by the ipwarden daemon on host ${hostname()} (pid ${d.pid})): it is not gone; stop the daemon on host ${hostname()} first, or pass --force if you are sure\n`]);
      } finally {
        await d.stop();
      }
      assert.equal(await (pkv as EtcdKV).get(ak), null, 'the stopped daemon revoked its heartbeat');
      const st = JSON.parse(pcli(p, 'status', '--json').stdout) as { nodes: Array<{ node: string; alive: boolean; heartbeat: string }> };
      assert.deepEqual(st.nodes.map((n) => [n.node, n.alive, n.heartbeat]), [['node-y', false, 'expired']]);
      const seenAt = (JSON.parse((await (pkv as EtcdKV).get(`${p}/pools/polpool/seen/node-y`))?.value as string) as { at: number }).at;
      const seenText = new Date(seenAt).toISOString().replace(/\.\d{3}Z$/, 'Z');
      assert.match(pcli(p, 'status').stdout, new RegExp(`^node-y +1 +15 +1 +0 +0 +expired +${seenText} +-$`, 'm'));
      const mark = pcli(p, 'remove-node', 'node-y');
      assert.deepEqual([mark.status, mark.stdout], [
        0,
        `removal of node-y begun (${p}/pools/polpool/removing/node-y); 1 block marked pendingRelease: 10.85.0.16/28\n` +
          `node-y was last seen at ${seenText} (its daemon's record, on its clock, written at most every 5 minutes)\n` +
          `warning: node-y's heartbeat has expired (no ${ak}; an ipwarden daemon served it before): if it does not come back within the veto window (60 s), it is treated as gone and --finish releases its addresses; check first (kubectl get node node-y; ipwarden pool leaks on node-y)\n` +
          'if node-y comes back it vetoes this; once it is surely gone (and at least 60 s from now), run again with --finish\n',
      ]);
    } finally {
      rmSync(netd, { recursive: true, force: true });
    }
  });

  it('--help marks --pool and --etcd-endpoints as required', () => {
    for (const verb of ['status', 'leaks', 'remove-node']) {
      const h = spawnSync(process.execPath, [join(ROOT, 'bin/ipwarden'), 'pool', verb, '--help'], { encoding: 'utf8' });
      assert.equal(h.status, 0);
      assert.match(h.stdout, /--pool <NAME> +required: the pool \(ipam\.pool\.name\)/);
      assert.match(h.stdout, /--etcd-endpoints <URLS> +required: etcd endpoints/);
    }
  });
});
