/**
 * Corrupt keys in a cluster pool, on a real etcd (test/helpers/etcd-cluster.ts, one member), through
 * the built plugin and the built CLI (docs/cluster.md "Corrupt keys"):
 * - a DEL of a container whose address sits in a block that cannot be read (an unknown field)
 *   succeeds, releases nothing of that block, names the key on stderr, writes nothing, and does so
 *   again when retried; an ADD of the node then skips the block and claims another;
 * - with two range sets it releases the readable block's address and the handle keeps only the
 *   other one (exact value);
 * - a DEL whose handle cannot be read releases the container's allocations found in readable
 *   blocks and leaves the handle;
 * - through the shim (the daemon in the daemon pass), such a DEL succeeds too;
 * - `pool status` with a stray key under `blocks/` and a corrupt block: exit 0, the keys listed
 *   (key, why) in `--json`, the table and `--html --out`, the rest counted exactly.
 * Needs `npm run build`. With CI=true a missing /usr/bin/etcd fails instead of skipping.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { EtcdKV } from '../../src/store/etcd/etcd-kv.ts';
import { installedPlugin, ROOT, runCni, standalonePlugin, type Outcome } from '../helpers/cni.ts';
import { haveEtcd, startEtcdCluster, type EtcdCluster } from '../helpers/etcd-cluster.ts';

const CI = process.env['CI'] === 'true';
const skip = haveEtcd() || CI ? false : '/usr/bin/etcd not installed';

let cluster: EtcdCluster | undefined;
let kv: EtcdKV | undefined;
let n = 0;

/** A fresh key prefix per test, so tests share the etcd but no keys. */
function prefix(): string {
  return `/bbc${process.pid}-${++n}`;
}

/** A /27 as two /28 blocks: 10.234.9.0/28 (.2–.15: .1 is the gateway) and 10.234.9.16/28 (.16–.30); `two`: a second range set 10.234.10.0/27. */
function conf(p: string, o: { two?: boolean; nodeName?: string } = {}) {
  return {
    cniVersion: '1.0.0',
    name: 'corruptnet',
    ipam: {
      type: 'ipwarden',
      ranges: o.two === true ? [[{ subnet: '10.234.9.0/27' }], [{ subnet: '10.234.10.0/27' }]] : [[{ subnet: '10.234.9.0/27' }]],
      pool: { name: 'cpool', etcd: { endpoints: (cluster as EtcdCluster).endpoints, prefix: p }, blockSize: 28 },
      ...(o.nodeName === undefined ? {} : { nodeName: o.nodeName }),
    },
  };
}

function run(command: 'ADD' | 'DEL', stdin: object, id: string, bin = standalonePlugin()): Outcome {
  return runCni(bin, { command, containerId: id, ifname: 'eth0', stdin, env: { NODE_NAME: 'node-a' } });
}
function addresses(r: Outcome): string[] {
  assert.equal(r.exitCode, 0, `${r.stdout}\n${r.stderr}`);
  return (r.json?.['ips'] as Array<{ address: string }>).map((x) => x.address);
}
async function value(key: string): Promise<string | null> {
  return (await (kv as EtcdKV).get(key))?.value ?? null;
}
async function put(key: string, v: string): Promise<void> {
  await (kv as EtcdKV).txn([], [{ put: key, value: v }]);
}

describe('corrupt pool keys on a real etcd: a DEL always finishes, status reports them', { skip }, () => {
  before(async () => {
    cluster = await startEtcdCluster({ members: 1, prefix: 'ipwarden-pool-corrupt-' });
    kv = new EtcdKV({ endpoints: cluster.endpoints });
  });
  after(async () => {
    await kv?.close();
    await cluster?.close();
  });

  it('DEL of a container in a block with an unknown field: exit 0, nothing written, the key on stderr, also when retried; the next ADD claims another block', async () => {
    const p = prefix();
    const base = `${p}/pools/cpool`;
    assert.deepEqual(addresses(run('ADD', conf(p), 'c1')), ['10.234.9.16/27']);
    const bk = `${base}/blocks/10.234.9.16-28`;
    const bad = JSON.stringify({ ...JSON.parse((await value(bk)) as string), owner: 'someone' });
    await put(bk, bad);
    const handle = await value(`${base}/handles/c1/eth0`);
    const why = 'unknown field "owner" (known: v, cidr, rangeSet, node, state, seq, next, allocs, wanted)';
    const line = `ipwarden: pool cpool: DEL: 10.234.9.16 of c1/eth0 not released (its block cannot be read): the handle ${base}/handles/c1/eth0 keeps it for an operator (etcd key ${bk}: ${why})\n`;
    for (let i = 0; i < 2; i++) {
      const d = run('DEL', conf(p), 'c1');
      assert.deepEqual([d.exitCode, d.stdout, d.stderr], [0, '', line], `DEL #${i + 1}`);
      assert.equal(await value(bk), bad, 'the block is never rewritten');
      assert.equal(await value(`${base}/handles/c1/eth0`), handle, 'the handle still names 10.234.9.16');
    }
    // The node's only block cannot be read: the ADD skips it and claims the free one.
    const a = run('ADD', conf(p), 'c2');
    assert.deepEqual(addresses(a), ['10.234.9.2/27']);
    assert.equal(a.stderr, `ipwarden: pool cpool: ADD: block skipped: never allocated from, left for an operator (etcd key ${bk}: ${why})\n`);
    assert.equal(await value(bk), bad);
  });

  it('two range sets, one block corrupt: the DEL releases the other address and the handle keeps exactly the one it could not release', async () => {
    const p = prefix();
    const base = `${p}/pools/cpool`;
    assert.deepEqual(addresses(run('ADD', conf(p, { two: true }), 'c1')), ['10.234.9.16/27', '10.234.10.16/27']);
    const bad = `${base}/blocks/10.234.10.16-28`;
    await put(bad, '{"v":1,"cidr":"10.234.10.16/28","rangeSet":1,"node":"node-a","state":"owned","seq":"1"}');
    const d = run('DEL', conf(p, { two: true }), 'c1');
    assert.deepEqual([d.exitCode, d.stdout], [0, '']);
    assert.equal(d.stderr, `ipwarden: pool cpool: DEL: 10.234.10.16 of c1/eth0 not released (its block cannot be read): the handle ${base}/handles/c1/eth0 keeps it for an operator (etcd key ${bad}: "seq" must be a non-negative integer)\n`);
    const h = JSON.parse((await value(`${base}/handles/c1/eth0`)) as string) as Record<string, unknown>;
    assert.deepEqual({ ...h, at: 0, host: '' }, { v: 1, node: 'node-a', network: 'corruptnet', at: 0, ips: [{ ip: '10.234.10.16', block: '10.234.10.16-28', ordinal: 0, seq: 1, rangeSet: 1 }], host: '' });
    assert.deepEqual(JSON.parse((await value(`${base}/blocks/10.234.9.16-28`)) as string).allocs, {}, '10.234.9.16 released');
    assert.equal(await value(bad), '{"v":1,"cidr":"10.234.10.16/28","rangeSet":1,"node":"node-a","state":"owned","seq":"1"}');
  });

  it('a DEL whose handle cannot be read releases the container\'s allocations in readable blocks and leaves the handle', async () => {
    const p = prefix();
    const base = `${p}/pools/cpool`;
    assert.deepEqual(addresses(run('ADD', conf(p), 'c1')), ['10.234.9.16/27']);
    assert.deepEqual(addresses(run('ADD', conf(p), 'c2')), ['10.234.9.17/27']);
    const hk = `${base}/handles/c1/eth0`;
    await put(hk, '{"v":1,"node":"node-a","network":"corruptnet","at":1,"ips":[{"ip":"10.234.9.16"}]}');
    const d = run('DEL', conf(p), 'c1');
    assert.deepEqual([d.exitCode, d.stdout], [0, '']);
    assert.equal(d.stderr, `ipwarden: pool cpool: DEL: handle left as it is for an operator (the addresses it names cannot be read from it); allocations of c1/eth0 in the pool's readable blocks: 10.234.9.16, released (etcd key ${hk}: ips[0].block must be a block key)\n`);
    assert.equal(await value(hk), '{"v":1,"node":"node-a","network":"corruptnet","at":1,"ips":[{"ip":"10.234.9.16"}]}');
    const allocs = JSON.parse((await value(`${base}/blocks/10.234.9.16-28`)) as string).allocs as Record<string, { id: string }>;
    assert.deepEqual(Object.entries(allocs).map(([o, x]) => [o, x.id]), [['1', 'c2']]);
  });

  it('through the shim (the daemon in the daemon pass): a DEL of a container in a corrupt block succeeds and writes nothing', async () => {
    const p = prefix();
    const base = `${p}/pools/cpool`;
    const c = conf(p, { nodeName: 'node-s' });
    const bin = installedPlugin();
    const [first] = addresses(run('ADD', c, 's1', bin));
    assert.match(first as string, /^10\.234\.9\.[0-9]+\/27$/);
    const block = (await (kv as EtcdKV).list(`${base}/blocks/`, { keysOnly: true }))[0]?.key as string;
    await put(block, '{');
    const handle = await value(`${base}/handles/s1/eth0`);
    const d = run('DEL', c, 's1', bin);
    assert.deepEqual([d.exitCode, d.stdout], [0, ''], d.stderr);
    assert.equal(await value(block), '{');
    assert.equal(await value(`${base}/handles/s1/eth0`), handle);
  });

  /** `ipwarden pool status …` of the built CLI. */
  function status(p: string, ...args: string[]): { status: number | null; stdout: string; stderr: string } {
    const r = spawnSync(process.execPath, [join(ROOT, 'bin/ipwarden'), 'pool', 'status', ...args, '--pool', 'cpool', '--etcd-endpoints', (cluster as EtcdCluster).endpoints.join(','), '--etcd-prefix', p], { encoding: 'utf8', timeout: 60_000 });
    return { status: r.status, stdout: r.stdout, stderr: r.stderr };
  }

  it('pool status with a stray key under blocks/ and a corrupt block: exit 0, the keys listed with why in --json, the table and --html, the rest counted', async () => {
    const p = prefix();
    const base = `${p}/pools/cpool`;
    assert.deepEqual(addresses(run('ADD', conf(p), 'c1')), ['10.234.9.16/27']);
    assert.deepEqual(addresses(runCni(standalonePlugin(), { command: 'ADD', containerId: 'c2', ifname: 'eth0', stdin: conf(p), env: { NODE_NAME: 'node-b' } })), ['10.234.9.2/27']);
    const bk = `${base}/blocks/10.234.9.16-28`;
    await put(bk, 'not json');
    await put(`${base}/blocks/stray`, '{"v":1}');
    const j = status(p, '--json');
    assert.deepEqual([j.status, j.stderr], [0, '']);
    assert.deepEqual(JSON.parse(j.stdout), {
      version: 1,
      pool: 'cpool',
      blockSize: 28,
      blockSize6: 122,
      rangeSets: [{ index: 0, ranges: '10.234.9.1-10.234.9.30', size: '29', used: 1, reserved: 0, unreadable: 15, pendingRelease: 0, free: '13', blocksClaimed: 2 }],
      nodes: [{ node: 'node-b', blocks: 1, capacity: 14, used: 1, borrowed: 0, reserved: 0, alive: false, heartbeat: 'never', source: null }],
      blocks: [{ cidr: '10.234.9.0/28', rangeSet: 0, node: 'node-b', state: 'owned', capacity: 14, used: 1, borrowed: 0, reserved: 0 }],
      corrupt: [
        { key: bk, why: 'not valid JSON' },
        { key: `${base}/blocks/stray`, why: 'not a block key' },
      ],
      overlaps: [],
    });
    const t = status(p);
    assert.deepEqual([t.status, t.stderr], [0, '']);
    const w = bk.length + 2;
    assert.equal(
      t.stdout,
      [
        'pool cpool: blocks /28 (IPv4), /122 (IPv6)',
        'SET  RANGES                  SIZE  USED  RESERVED  UNREADABLE  PENDING  FREE  BLOCKS',
        '0    10.234.9.1-10.234.9.30  29    1     0         15          0        13    2',
        'NODE    BLOCKS  CAPACITY  USED  BORROWED  RESERVED  HEARTBEAT  LAST SEEN  SOURCE',
        'node-b  1       14        1     0         0         never      -          -',
        'BLOCK          SET  NODE    STATE  CAPACITY  USED  BORROWED  RESERVED',
        '10.234.9.0/28  0    node-b  owned  14        1     0         0',
        `${'CORRUPT KEY'.padEnd(w)}WHY`,
        `${bk.padEnd(w)}not valid JSON`,
        `${`${base}/blocks/stray`.padEnd(w)}not a block key`,
        '2 keys cannot be read: not counted above, never allocated from or rewritten by ipwarden; left for an operator (docs/cluster.md "Corrupt keys")',
        '',
      ].join('\n'),
    );
    const dir = mkdtempSync(join(tmpdir(), 'ipwarden-poolcorrupt-'));
    try {
      const h = status(p, '--html', '--out', join(dir, 'pool.html'));
      assert.deepEqual([h.status, h.stdout, h.stderr], [0, t.stdout, '']);
      const page = readFileSync(join(dir, 'pool.html'), 'utf8');
      assert.ok(page.includes('<dd data-count="unreadable">15</dd>'));
      assert.ok(
        page.endsWith(
          '<table class="corrupt"><thead><tr><th>key</th><th>why</th></tr></thead><tbody>' +
            `<tr data-key="${bk}"><td><code>${bk}</code></td><td>not valid JSON</td></tr>` +
            `<tr data-key="${base}/blocks/stray"><td><code>${base}/blocks/stray</code></td><td>not a block key</td></tr>` +
            '</tbody></table></section></body></html>\n',
        ),
        page.slice(-600),
      );
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
