/**
 * The daemon's records of pool networks learned from requests (src/pool/learned.ts;
 * docs/cluster.md "Multus"): what a record holds, when it is (re)written, and every way a record
 * is refused under the trust rules and the strict codec — each reported with why, the others kept.
 * Real files in a temp dir (the trust rules are about real owners, modes and symlinks).
 */
import { describe, it, after } from 'node:test';
import assert from 'node:assert/strict';
import { chmodSync, chownSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { decodeLearned, keptConfig, learnedName, LearnedPools, MAX_LEARNED, readLearnedPools } from '../../src/pool/learned.ts';
import { loadIPAMConfig } from '../../src/ipam/config.ts';
import type { IPAMConfig } from '../../src/ipam/types.ts';
import type { PoolConfig } from '../../src/ipam/pool-config.ts';

const root = mkdtempSync(join(tmpdir(), 'ipw-learned-'));
after(() => rmSync(root, { recursive: true, force: true }));
let n = 0;
const fresh = (): string => join(root, `d${++n}`);

function request(network: string, pool: string, subnet = '10.249.19.0/26', extra: Record<string, unknown> = {}): string {
  return JSON.stringify({
    cniVersion: '1.0.0',
    name: network,
    type: 'macvlan',
    master: 'eth0',
    runtimeConfig: { mac: '02:00:00:00:00:01' },
    ipam: { type: 'ipwarden', ranges: [[{ subnet }]], pool: { name: pool, etcd: { endpoints: ['http://127.0.0.1:2379'], prefix: '/t' } }, ...extra },
  });
}

function decoded(stdin: string): IPAMConfig & { pool: PoolConfig } {
  return loadIPAMConfig(stdin, undefined) as IPAMConfig & { pool: PoolConfig };
}

describe('learned pool networks: records', () => {
  it('learn writes one record per (etcd, prefix, pool, network), 0600 in a 0700 dir, keeping only cniVersion, name and ipam; the same config again writes nothing; a changed one replaces it', () => {
    const dir = fresh();
    let clock = 1000;
    const l = new LearnedPools(dir, () => clock);
    const a = request('net-a', 'p1');
    assert.equal(l.learn(decoded(a), Buffer.from(a)), 'new');
    const name = learnedName(decoded(a).pool, 'net-a');
    assert.match(name, /^[0-9a-f]{64}\.json$/);
    assert.deepEqual(readdirSync(dir), [name]);
    assert.deepEqual([statSync(dir).mode & 0o777, statSync(join(dir, name)).mode & 0o777], [0o700, 0o600]);
    assert.equal(readFileSync(join(dir, name), 'utf8'), `{"v":1,"learnedAt":1000,"config":{"cniVersion":"1.0.0","name":"net-a","ipam":{"type":"ipwarden","ranges":[[{"subnet":"10.249.19.0/26"}]],"pool":{"name":"p1","etcd":{"endpoints":["http://127.0.0.1:2379"],"prefix":"/t"}}}}}\n`);
    clock = 2000;
    assert.equal(l.learn(decoded(a), a), 'same');
    assert.equal(JSON.parse(readFileSync(join(dir, name), 'utf8')).learnedAt, 1000, 'not rewritten');
    const a2 = request('net-a', 'p1', '10.249.19.0/25');
    assert.equal(l.learn(decoded(a2), a2), 'changed');
    assert.deepEqual(readdirSync(dir), [name], 'the same key: replaced, not added');
    assert.deepEqual(JSON.parse(readFileSync(join(dir, name), 'utf8')).learnedAt, 2000);
    const b = request('net-b', 'p1');
    assert.equal(l.learn(decoded(b), b), 'new');
    assert.equal(readdirSync(dir).length, 2);
    // A new reader (a restart) sees both, decoded by the plugin's own parser.
    const r = readLearnedPools(dir);
    assert.deepEqual(r.unreadable, []);
    assert.deepEqual(r.pools.map((p) => [p.conf.name, p.conf.pool.name, (JSON.parse(p.kept) as { ipam: { ranges: Array<Array<{ subnet: string }>> } }).ipam.ranges[0]?.[0]?.subnet ?? null, p.conf.rangeSets.length, p.learnedAt]).sort(), [
      ['net-a', 'p1', '10.249.19.0/25', 1, 2000],
      ['net-b', 'p1', '10.249.19.0/26', 1, 2000],
    ]);
    // After load, the loaded config compares equal: nothing written.
    const l2 = new LearnedPools(dir, () => 3000);
    assert.equal(l2.load().pools.length, 2);
    assert.equal(l2.learn(decoded(b), b), 'same');
    assert.deepEqual(l2.entries().map((e) => e.conf.name).sort(), ['net-a', 'net-b']);
  });

  it('a config that fixes ipam.nodeName is never recorded, and at most MAX_LEARNED networks are: refused with why, nothing written', () => {
    const dir = fresh();
    const l = new LearnedPools(dir, () => 1000);
    const fixed = request('net-x', 'p1', '10.249.19.0/26', { nodeName: 'victim-node' });
    assert.deepEqual(l.learn(decoded(fixed), fixed), { refused: 'its ipam.nodeName (victim-node) fixes the node name: only the node\'s own name is recorded' });
    assert.equal(existsSync(dir), false, 'nothing written');
    for (let i = 0; i < MAX_LEARNED; i++) {
      const r = request(`net-${i}`, 'p1');
      assert.equal(l.learn(decoded(r), r), 'new');
    }
    const over = request('net-over', 'p1');
    assert.deepEqual(l.learn(decoded(over), over), { refused: `${MAX_LEARNED} pool networks are recorded already` });
    assert.equal(readdirSync(dir).length, MAX_LEARNED);
    // A recorded network whose config changes is still rewritten at the cap.
    const changed = request('net-0', 'p1', '10.249.19.0/25');
    assert.equal(l.learn(decoded(changed), changed), 'changed');
    assert.equal(readdirSync(dir).length, MAX_LEARNED);
  });

  it('keptConfig keeps cniVersion, name, ipam only; not a JSON object is null', () => {
    assert.deepEqual(keptConfig('{"cniVersion":"1.0.0","name":"n","type":"x","args":{"cni":{}},"prevResult":{},"ipam":{"a":1}}'), { cniVersion: '1.0.0', name: 'n', ipam: { a: 1 } });
    assert.equal(keptConfig('[1]'), null);
    assert.equal(keptConfig('{'), null);
  });

  it('an absent directory is no record and creates nothing', () => {
    const dir = fresh();
    assert.deepEqual(readLearnedPools(dir), { pools: [], unreadable: [] });
    assert.throws(() => readdirSync(dir), /ENOENT/);
  });

  it('every record that cannot be used is reported with why, and the good one is still read', () => {
    const dir = fresh();
    const l = new LearnedPools(dir, () => 5);
    const good = request('net-g', 'p1');
    l.learn(decoded(good), good);
    const goodName = learnedName(decoded(good).pool, 'net-g');
    const x = (c: string): string => join(dir, `${c.repeat(64)}.json`);
    const rec = (config: unknown, more: Record<string, unknown> = {}): string => JSON.stringify({ v: 1, learnedAt: 5, config, ...more });
    const cfg = JSON.parse(readFileSync(join(dir, goodName), 'utf8')).config as Record<string, unknown>;
    writeFileSync(x('1'), '{"v":1,', { mode: 0o600 });
    writeFileSync(x('2'), '[]', { mode: 0o600 });
    writeFileSync(x('3'), rec(cfg, { extra: true }), { mode: 0o600 });
    writeFileSync(x('4'), JSON.stringify({ v: 2, learnedAt: 5, config: cfg }), { mode: 0o600 });
    writeFileSync(x('5'), JSON.stringify({ v: 1, learnedAt: -1, config: cfg }), { mode: 0o600 });
    writeFileSync(x('6'), rec({ ...cfg, type: 'macvlan' }), { mode: 0o600 });
    writeFileSync(x('7'), rec({ ...cfg, ipam: { type: 'ipwarden', ranges: [[{ subnet: '10.249.19.0/26' }]] } }), { mode: 0o600 });
    writeFileSync(x('8'), rec({ ...cfg, ipam: { type: 'ipwarden', ranges: [[{ subnet: '10.249.19.0/26' }]], pool: { name: 'p1', etcd: { endpoints: ['ftp://x'] } } } }), { mode: 0o600 });
    writeFileSync(x('9'), rec(cfg), { mode: 0o600 }); // a good record under another name
    writeFileSync(x('b'), rec(cfg), { mode: 0o644 });
    chmodSync(x('b'), 0o666);
    symlinkSync(join(dir, goodName), x('c'));
    mkdirSync(x('d'));
    writeFileSync(x('e'), rec(cfg), { mode: 0o600 });
    chownSync(x('e'), 65534, 65534);
    writeFileSync(x('f'), ' '.repeat(65_537), { mode: 0o600 });
    writeFileSync(join(dir, 'README'), 'not a record name: skipped');
    const r = readLearnedPools(dir);
    assert.deepEqual(r.pools.map((p) => p.file), [join(dir, goodName)]);
    assert.deepEqual(r.unreadable, [
      { file: x('1'), why: 'not valid JSON' },
      { file: x('2'), why: 'not a JSON object' },
      { file: x('3'), why: 'unknown field "extra" (known: v, learnedAt, config)' },
      { file: x('4'), why: '"v" must be 1, got 2' },
      { file: x('5'), why: '"learnedAt" must be a non-negative integer, got -1' },
      { file: x('6'), why: 'unknown field "config.type" (known: cniVersion, name, ipam)' },
      { file: x('7'), why: '"config" has no ipam.pool' },
      { file: x('8'), why: '"config" is not a usable network config: ipam.pool.etcd.endpoints[0] must be http://HOST:PORT or https://HOST:PORT, got "ftp://x"' },
      { file: x('9'), why: "the file name is not the hash of the entry's pool and network (renamed or copied by hand?)" },
      { file: x('b'), why: `${x('b')} is writable by group or others (mode 666)` },
      { file: x('c'), why: 'is a symlink (not followed)' },
      { file: x('d'), why: 'is not a regular file' },
      { file: x('e'), why: `${x('e')} is owned by uid 65534` },
      { file: x('f'), why: 'is 65537 bytes long, at most 65536' },
    ]);
  });

  it('a directory that is a symlink, or writable by others, is one unreadable item and no record', () => {
    const real = fresh();
    const l = new LearnedPools(real, () => 5);
    const good = request('net-s', 'p1');
    l.learn(decoded(good), good);
    const link = fresh();
    symlinkSync(real, link);
    assert.deepEqual(readLearnedPools(link), { pools: [], unreadable: [{ file: link, why: 'is not a directory (a symlink is not followed)' }] });
    chmodSync(real, 0o777);
    assert.deepEqual(readLearnedPools(real), { pools: [], unreadable: [{ file: real, why: `${real} is writable by group or others (mode 777)` }] });
  });

  it('decodeLearned is pure: the same text gives the same entry', () => {
    const good = request('net-p', 'p9');
    const name = learnedName(decoded(good).pool, 'net-p');
    const text = JSON.stringify({ v: 1, learnedAt: 7, config: keptConfig(good) });
    const e = decodeLearned(name, '/x', text);
    assert.ok(!('why' in e));
    assert.deepEqual([e.file, e.learnedAt, e.conf.name, e.conf.pool.name, e.kept], ['/x', 7, 'net-p', 'p9', JSON.stringify(keptConfig(good))]);
  });
});
