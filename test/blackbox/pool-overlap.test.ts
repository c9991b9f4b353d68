/**
 * Overlapping pools refused (docs/cluster.md "Overlapping pools") on a real etcd
 * (test/helpers/etcd-cluster.ts, one member on loopback), through the standalone plugin, the
 * pool facade and the built CLI: a network whose ranges or block size differ from the pool's
 * record (ADD and CHECK code 7 with the exact text; its DEL still releases), a pool overlapping
 * another one not created (exact text, nothing written), 20 pairs of overlapping pools created at
 * once through the facade and 5 through plugin processes (exactly one of each pair created, every
 * time), an overlapping pair written straight into etcd as an older version left it (the later
 * pool's ADDs refused, `pool status` and `doctor` name the pair, its DEL releases), and `doctor`
 * naming a node-local range inside a pool's. One ADD goes through the shim, so the daemon pass
 * (IPWARDEN_TEST_DAEMON=1) runs it through the daemon's pool sessions. Needs `npm run build`. With CI=true a missing
 * /usr/bin/etcd fails instead of skipping.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { AppError } from '../../src/common/errors.ts';
import { loadIPAMConfig } from '../../src/ipam/config.ts';
import { add as poolAdd, LearnedPools, learnedName, learnedPoolsDir } from '../../src/pool/index.ts';
import { EtcdKV } from '../../src/store/etcd/etcd-kv.ts';
import { installedPlugin, ROOT, runCni, runCniAsync, standalonePlugin, tempDir, type Outcome } from '../helpers/cni.ts';
import { haveEtcd, startEtcdCluster, type EtcdCluster } from '../helpers/etcd-cluster.ts';

const CI = process.env['CI'] === 'true';
const skip = haveEtcd() || CI ? false : '/usr/bin/etcd not installed';

let cluster: EtcdCluster | undefined;
let kv: EtcdKV | undefined;
let n = 0;

/** A fresh key prefix per use, so the tests share the etcd but no keys. */
function prefix(): string {
  return `/ov${process.pid}-${++n}`;
}

function conf(p: string, pool: string, subnet: string, o: { network?: string; blockSize?: number } = {}) {
  return {
    cniVersion: '1.0.0',
    name: o.network ?? `net-${pool}`,
    ipam: { type: 'ipwarden', ranges: [[{ subnet }]], pool: { name: pool, etcd: { endpoints: (cluster as EtcdCluster).endpoints, prefix: p }, blockSize: o.blockSize ?? 28 } },
  };
}

function cni(command: string, stdin: object, id: string, node = 'node-a'): Outcome {
  return runCni(standalonePlugin(), { command, containerId: id, ifname: 'eth0', stdin, env: { NODE_NAME: node } });
}
function address(r: Outcome): string {
  assert.equal(r.exitCode, 0, `${r.stdout}\n${r.stderr}`);
  return ((r.json?.['ips'] as Array<{ address: string }>)[0] as { address: string }).address;
}
function cniError(r: Outcome): { code: number; msg: string } {
  assert.equal(r.exitCode, 1, r.stdout);
  return { code: r.json?.['code'] as number, msg: r.json?.['msg'] as string };
}
/** Every key under `p` (the pools and the pool index). */
async function keys(p: string): Promise<string[]> {
  return (await (kv as EtcdKV).list(`${p}/`, { keysOnly: true })).map((e) => e.key);
}
/** The built CLI. */
function cli(...args: string[]): { status: number | null; stdout: string; stderr: string } {
  const r = spawnSync(process.execPath, [join(ROOT, 'bin/ipwarden'), ...args], { encoding: 'utf8', timeout: 60_000 });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}
function poolStatus(p: string, pool: string): Record<string, unknown> {
  const r = cli('pool', 'status', '--json', '--pool', pool, '--etcd-endpoints', (cluster as EtcdCluster).endpoints.join(','), '--etcd-prefix', p);
  assert.equal(r.status, 0, r.stderr);
  return JSON.parse(r.stdout) as Record<string, unknown>;
}
/**
 * `doctor --json` over a configuration directory of `configs` (file name → JSON) and a data
 * directory where the daemon recorded the pool networks of `learned` (request configs, written by
 * the daemon's own writer: a Multus pool known only from requests); the findings with the given
 * ids, the configuration directory written `DIR` and the data directory `DATA`.
 */
function doctor(configs: Record<string, object>, ids: readonly string[], learned: readonly object[] = []): { status: number | null; findings: Array<Record<string, string>> } {
  const t = tempDir('ipwarden-ov-doctor-');
  try {
    const confDir = join(t.dir, 'net.d');
    const dataDir = join(t.dir, 'data');
    mkdirSync(confDir);
    for (const [f, c] of Object.entries(configs)) writeFileSync(join(confDir, f), JSON.stringify(c));
    const records = new LearnedPools(learnedPoolsDir(dataDir));
    for (const c of learned) assert.equal(records.learn(loadIPAMConfig(JSON.stringify(c), undefined) as Parameters<LearnedPools['learn']>[0], JSON.stringify(c)), 'new');
    const r = cli('doctor', '--json', '--cni-conf-dir', confDir, '--data-dir', dataDir, '--runtime-endpoint', '/nonexistent/ov-cri.sock');
    const doc = JSON.parse(r.stdout) as { findings: Array<Record<string, string>> };
    const dir = (x: Record<string, string>) => Object.fromEntries(Object.entries(x).map(([k, v]) => [k, v.replaceAll(confDir, 'DIR').replaceAll(dataDir, 'DATA')]));
    return { status: r.status, findings: doc.findings.filter((f) => ids.includes(f['id'] as string)).map(dir) };
  } finally {
    t.cleanup();
  }
}

const R = (s: string, a: string, b: string): string => `${s} ${a}-${b}`;

describe('overlapping pools on a real etcd', { skip }, () => {
  before(async () => {
    cluster = await startEtcdCluster({ members: 1, prefix: 'ipwarden-pool-ov-' });
    kv = new EtcdKV({ endpoints: cluster.endpoints });
  });
  after(async () => {
    await kv?.close();
    await cluster?.close();
  });

  it('a network whose ranges or block size differ from the pool\'s record: ADD and CHECK code 7 naming both; its DEL releases the handle', async () => {
    const p = prefix();
    const ip = address(cni('ADD', conf(p, 'ov1', '10.237.0.0/27'), 'c1'));
    const before = await keys(p);
    const rec = `ranges [${R('10.237.0.0/27', '10.237.0.1', '10.237.0.30')} gateway 10.237.0.1] and block sizes /28 (IPv4) and /122 (IPv6)`;
    const tail = `every network naming pool ov1 must have the same ranges and block sizes (the first to use the pool recorded them in ${p}/pools/ov1/meta)`;
    const wide = conf(p, 'ov1', '10.237.0.0/26', { network: 'wide' });
    const wideMsg = `pool ov1 is recorded in etcd with ${rec}, but network wide has ranges [${R('10.237.0.0/26', '10.237.0.1', '10.237.0.62')} gateway 10.237.0.1] and block sizes /28 (IPv4) and /122 (IPv6): ${tail}`;
    assert.deepEqual(cniError(cni('ADD', wide, 'c2', 'node-b')), { code: 7, msg: wideMsg });
    assert.deepEqual(cniError(cni('ADD', conf(p, 'ov1', '10.237.0.0/27', { network: 'cut', blockSize: 27 }), 'c2', 'node-b')), {
      code: 7,
      msg: `pool ov1 is recorded in etcd with ${rec}, but network cut has ranges [${R('10.237.0.0/27', '10.237.0.1', '10.237.0.30')} gateway 10.237.0.1] and block sizes /27 (IPv4) and /122 (IPv6): ${tail}`,
    });
    assert.deepEqual(cniError(cni('CHECK', { ...wide, prevResult: { cniVersion: '1.0.0', ips: [{ address: ip }] } }, 'c1')), { code: 7, msg: wideMsg });
    assert.deepEqual(await keys(p), before, 'nothing written by the refusals');
    const d = cni('DEL', wide, 'c1');
    assert.deepEqual([d.exitCode, d.stdout], [0, '']);
    assert.equal(await (kv as EtcdKV).get(`${p}/pools/ov1/handles/c1/eth0`), null, 'released');
  });

  it('a pool whose ranges overlap another pool of the prefix is not created: code 7 naming both pools and ranges, nothing written', async () => {
    const p = prefix();
    address(cni('ADD', conf(p, 'a', '10.237.1.0/24'), 'c1'));
    const before = await keys(p);
    assert.deepEqual(cniError(cni('ADD', conf(p, 'b', '10.237.1.128/25'), 'c2', 'node-b')), {
      code: 7,
      msg: `pool b is not created: its ranges overlap pool a in etcd prefix ${p} (${R('10.237.1.128/25', '10.237.1.129', '10.237.1.254')} of pool b overlaps ${R('10.237.1.0/24', '10.237.1.1', '10.237.1.254')} of pool a); two pools would hand out the same addresses — give pool b ranges of its own`,
    });
    assert.deepEqual(await keys(p), before);
    assert.equal((await (kv as EtcdKV).get(`${p}/pool-ranges`))?.value, '{"v":1,"pools":{"a":[{"subnet":"10.237.1.0/24","rangeStart":"10.237.1.1","rangeEnd":"10.237.1.254"}]}}');
  });

  it('20 pairs of overlapping pools created at once through the facade, 5 through plugin processes: exactly one of each pair is created, every time', { timeout: 300_000 }, async () => {
    const A = '10.237.2.0/24';
    const B = '10.237.2.64/26';
    const rA = R(A, '10.237.2.1', '10.237.2.254');
    const rB = R(B, '10.237.2.65', '10.237.2.126');
    const loser = (p: string, lost: 'a' | 'b'): string =>
      lost === 'b'
        ? `pool b is not created: its ranges overlap pool a in etcd prefix ${p} (${rB} of pool b overlaps ${rA} of pool a); two pools would hand out the same addresses — give pool b ranges of its own`
        : `pool a is not created: its ranges overlap pool b in etcd prefix ${p} (${rA} of pool a overlaps ${rB} of pool b); two pools would hand out the same addresses — give pool a ranges of its own`;
    // Two clients, as two nodes have.
    const k1 = new EtcdKV({ endpoints: (cluster as EtcdCluster).endpoints });
    const k2 = new EtcdKV({ endpoints: (cluster as EtcdCluster).endpoints });
    const wins = { a: 0, b: 0 };
    try {
      for (let i = 0; i < 20; i++) {
        const p = prefix();
        const one = (k: EtcdKV, pool: 'a' | 'b', subnet: string, node: string) =>
          poolAdd({ kv: k, pool, prefix: p, node, network: `net-${pool}`, rangeSets: loadIPAMConfig(JSON.stringify(conf(p, pool, subnet)), undefined).rangeSets, sizes: { blockSize4: 28, blockSize6: 122 } }, [{ containerId: `c-${pool}`, ifname: 'eth0' }]);
        const [ra, rb] = await Promise.allSettled([one(k1, 'a', A, 'node-a'), one(k2, 'b', B, 'node-b')]);
        const ok = [ra.status === 'fulfilled' && !(ra.value[0] instanceof AppError), rb.status === 'fulfilled' && !(rb.value[0] instanceof AppError)];
        assert.equal(ok.filter(Boolean).length, 1, `pair ${i}: exactly one created (${JSON.stringify([ra, rb].map((r) => (r.status === 'rejected' ? String(r.reason) : 'ok')))})`);
        const lost = ok[0] ? 'b' : 'a';
        wins[ok[0] ? 'a' : 'b']++;
        const rej = (lost === 'a' ? ra : rb) as PromiseRejectedResult;
        assert.ok(rej.reason instanceof AppError && rej.reason.cniCode === 7, String(rej.reason));
        assert.equal((rej.reason as AppError).message, loser(p, lost));
        assert.deepEqual((await keys(p)).filter((k) => k.endsWith('/meta')), [`${p}/pools/${ok[0] ? 'a' : 'b'}/meta`]);
      }
      for (let i = 0; i < 5; i++) {
        const p = prefix();
        const [oa, ob] = await Promise.all([
          runCniAsync(standalonePlugin(), { command: 'ADD', containerId: 'c-a', ifname: 'eth0', stdin: conf(p, 'a', A), env: { NODE_NAME: 'node-a' } }),
          runCniAsync(standalonePlugin(), { command: 'ADD', containerId: 'c-b', ifname: 'eth0', stdin: conf(p, 'b', B), env: { NODE_NAME: 'node-b' } }),
        ]);
        assert.deepEqual([oa.exitCode, ob.exitCode].sort(), [0, 1], `plugin pair ${i}: ${oa.stdout} ${ob.stdout}`);
        const lost = oa.exitCode === 1 ? 'a' : 'b';
        assert.deepEqual(cniError(lost === 'a' ? oa : ob), { code: 7, msg: loser(p, lost) });
        assert.deepEqual((await keys(p)).filter((k) => k.endsWith('/meta')), [`${p}/pools/${lost === 'a' ? 'b' : 'a'}/meta`]);
      }
    } finally {
      await k1.close();
      await k2.close();
    }
    process.stdout.write(`# 20 facade pairs: pool a created ${wins.a} times, pool b ${wins.b} times\n`);
  });

  it('an overlapping pair written straight into etcd (an older version): the later pool\'s ADDs refused, pool status and doctor name the pair, its DEL releases', async () => {
    const p = prefix();
    const meta = (subnet: string, start: string, end: string, gw: string) => JSON.stringify({ v: 1, rangeSets: [[{ subnet, rangeStart: start, rangeEnd: end, gateway: gw }]], blockSize: 28, blockSize6: 122 });
    const put = (key: string, value: string) => (kv as EtcdKV).txn([], [{ put: `${p}/pools/${key}`, value }]);
    await put('a/meta', meta('10.237.3.0/24', '10.237.3.1', '10.237.3.254', '10.237.3.1'));
    await put('b/meta', meta('10.237.3.0/25', '10.237.3.1', '10.237.3.126', '10.237.3.1'));
    await put('b/blocks/10.237.3.0-28', '{"v":1,"cidr":"10.237.3.0/28","rangeSet":0,"node":"node-a","state":"owned","seq":1,"next":3,"allocs":{"2":{"id":"old1","ifname":"eth0","node":"node-a","seq":1,"at":1000}}}');
    await put('b/nodes/node-a/blocks/10.237.3.0-28', '{"v":1,"rangeSet":0}');
    await put('b/handles/old1/eth0', '{"v":1,"node":"node-a","network":"net-b","at":1000,"ips":[{"ip":"10.237.3.2","block":"10.237.3.0-28","ordinal":2,"seq":1,"rangeSet":0}]}');
    const ra = R('10.237.3.0/24', '10.237.3.1', '10.237.3.254');
    const rb = R('10.237.3.0/25', '10.237.3.1', '10.237.3.126');
    const refused = {
      code: 7,
      msg: `pool b overlaps pool a, created before it, in etcd prefix ${p} (${rb} of pool b overlaps ${ra} of pool a); no address is handed out from pool b while they overlap — give pool b ranges of its own (its addresses in use are released by their DELs)`,
    };
    assert.deepEqual(cniError(cni('ADD', conf(p, 'b', '10.237.3.0/25'), 'c1')), refused);
    assert.deepEqual(cniError(cni('ADD', conf(p, 'b', '10.237.3.0/25'), 'old1')), refused, 'a repeated ADD too');
    // Through the shim: in the daemon pass (IPWARDEN_TEST_DAEMON=1) the daemon's pool sessions answer.
    assert.deepEqual(cniError(runCni(installedPlugin(), { command: 'ADD', containerId: 'c3', ifname: 'eth0', stdin: conf(p, 'b', '10.237.3.0/25'), env: { NODE_NAME: 'node-a' } })), refused, 'through the shim');
    assert.equal(await (kv as EtcdKV).get(`${p}/pools/b/handles/c1/eth0`), null);
    address(cni('ADD', conf(p, 'a', '10.237.3.0/24'), 'c2'));
    const pair = [{ later: 'b', earlier: 'a', ranges: [{ later: rb, earlier: ra }] }];
    assert.deepEqual(poolStatus(p, 'b')['overlaps'], pair);
    assert.deepEqual(poolStatus(p, 'a')['overlaps'], pair);
    const d = doctor({ '10-b.conf': { ...conf(p, 'b', '10.237.3.0/25'), type: 'bridge' } }, ['pool-overlap', 'pool-unreachable']);
    assert.equal(d.status, 1);
    assert.deepEqual(d.findings, [
      {
        id: 'pool-overlap',
        severity: 'error',
        title: 'pool b overlaps pool a, created before it: its ADDs are refused',
        evidence: `${rb} of pool b overlaps ${ra} of pool a (etcd prefix ${p}; DIR/10-b.conf names pool b); two pools over one address can hand it out twice`,
        fix: 'give pool b ranges of its own (a new pool name with disjoint ranges in the networks that name it); its addresses in use are released by their pods\' DELs — see docs/cluster.md "Overlapping pools"',
      },
    ]);
    const del = cni('DEL', conf(p, 'b', '10.237.3.0/25'), 'old1');
    assert.deepEqual([del.exitCode, del.stdout], [0, '']);
    assert.equal(await (kv as EtcdKV).get(`${p}/pools/b/handles/old1/eth0`), null, 'the DEL released it');
  });

  it('doctor: a node-local range inside a pool range of the node', async () => {
    const p = prefix();
    const d = doctor(
      {
        '10-pool.conf': { ...conf(p, 'np', '10.237.4.0/24', { network: 'pooled' }), type: 'bridge' },
        '20-local.conf': { cniVersion: '1.0.0', name: 'local', type: 'bridge', ipam: { type: 'host-local', ranges: [[{ subnet: '10.237.4.128/25' }]] } },
      },
      ['pool-overlaps-node-local', 'pool-overlap', 'pool-unreachable'],
    );
    assert.deepEqual(d.findings, [
      {
        id: 'pool-overlaps-node-local',
        severity: 'warning',
        title: 'node-local network local overlaps pool np (network pooled)',
        evidence: `pooled range set 0 (${R('10.237.4.0/24', '10.237.4.1', '10.237.4.254')}) overlaps local range set 0 (${R('10.237.4.128/25', '10.237.4.129', '10.237.4.254')}) (DIR/10-pool.conf, DIR/20-local.conf); pool np hands its addresses out cluster-wide and local hands out 10.237.4.129-10.237.4.254 on this node on its own, so both can hand out the same address`,
        fix: 'give local a subnet outside pool np: change ipam.ranges in DIR/20-local.conf',
      },
    ]);
  });

  it('doctor: the same pool name and range under two etcd prefixes (two pools that never compare) is a warning; one prefix is not', async () => {
    const p = prefix();
    const q = `${p}-other`;
    const d = doctor(
      {
        '10-a.conf': { ...conf(p, 'np7', '10.237.7.0/24', { network: 'net7a' }), type: 'bridge' },
        '20-b.conf': { ...conf(q, 'np7', '10.237.7.0/24', { network: 'net7b' }), type: 'bridge' },
        '30-c.conf': { ...conf(p, 'np7', '10.237.7.0/24', { network: 'net7c' }), type: 'bridge' },
      },
      ['pool-overlaps-other-prefix'],
    );
    const r = R('10.237.7.0/24', '10.237.7.1', '10.237.7.254');
    const ep = (cluster as EtcdCluster).endpoints.join(',');
    const finding = (x: string, xf: string, xp: string, y: string, yf: string, yp: string) => ({
      id: 'pool-overlaps-other-prefix',
      severity: 'warning',
      title: `pool np7 (network ${x}) and pool np7 (network ${y}) overlap, in different etcd prefixes`,
      evidence: `${x} range set 0 (${r}) overlaps ${y} range set 0 (${r}) (DIR/${xf}: pool np7, etcd ${ep} prefix ${xp}; DIR/${yf}: pool np7, etcd ${ep} prefix ${yp}); pools of different prefixes are never compared, so both can hand out the same address — unless the two networks never meet (separate layer-2 segments)`,
      fix: 'if the two networks share addresses, name one pool (the same ipam.pool name, etcd endpoints and prefix) in both configurations, or give one of them ranges of its own',
    });
    assert.deepEqual(d.findings, [finding('net7a', '10-a.conf', p, 'net7b', '20-b.conf', q), finding('net7b', '20-b.conf', q, 'net7c', '30-c.conf', p)]);
  });

  it('doctor: a pool known only from requests (the daemon\'s record of a NetworkAttachmentDefinition) that overlaps another pool and a node-local range', async () => {
    const p = prefix();
    const meta = (subnet: string, start: string, end: string, gw: string) => JSON.stringify({ v: 1, rangeSets: [[{ subnet, rangeStart: start, rangeEnd: end, gateway: gw }]], blockSize: 28, blockSize6: 122 });
    const put = (key: string, value: string) => (kv as EtcdKV).txn([], [{ put: `${p}/pools/${key}`, value }]);
    await put('a/meta', meta('10.237.6.0/24', '10.237.6.1', '10.237.6.254', '10.237.6.1'));
    await put('m/meta', meta('10.237.6.0/25', '10.237.6.1', '10.237.6.126', '10.237.6.1'));
    const nad = { ...conf(p, 'm', '10.237.6.0/25', { network: 'multus-m' }), type: 'macvlan', master: 'eth0' };
    const record = `DATA/.ipwarden-pool-networks/${learnedName((loadIPAMConfig(JSON.stringify(nad), undefined) as { pool: Parameters<typeof learnedName>[0] }).pool, 'multus-m')}`;
    const d = doctor({ '20-local.conf': { cniVersion: '1.0.0', name: 'local', type: 'bridge', ipam: { type: 'host-local', ranges: [[{ subnet: '10.237.6.64/26' }]] } } }, ['pool-overlaps-node-local', 'pool-overlap', 'pool-unreachable'], [nad]);
    const rm = R('10.237.6.0/25', '10.237.6.1', '10.237.6.126');
    assert.equal(d.status, 1);
    assert.deepEqual(d.findings, [
      {
        id: 'pool-overlap',
        severity: 'error',
        title: 'pool m overlaps pool a, created before it: its ADDs are refused',
        evidence: `${rm} of pool m overlaps ${R('10.237.6.0/24', '10.237.6.1', '10.237.6.254')} of pool a (etcd prefix ${p}; ${record} names pool m); two pools over one address can hand it out twice`,
        fix: 'give pool m ranges of its own (a new pool name with disjoint ranges in the networks that name it); its addresses in use are released by their pods\' DELs — see docs/cluster.md "Overlapping pools"',
      },
      {
        id: 'pool-overlaps-node-local',
        severity: 'warning',
        title: 'node-local network local overlaps pool m (network multus-m)',
        evidence: `multus-m range set 0 (${rm}) overlaps local range set 0 (${R('10.237.6.64/26', '10.237.6.65', '10.237.6.126')}) (${record}, DIR/20-local.conf); pool m hands its addresses out cluster-wide and local hands out 10.237.6.65-10.237.6.126 on this node on its own, so both can hand out the same address`,
        fix: 'give local a subnet outside pool m: change ipam.ranges in DIR/20-local.conf',
      },
    ]);
  });
});
