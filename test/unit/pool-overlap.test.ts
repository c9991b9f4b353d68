/**
 * Overlapping pools refused (src/pool/overlap.ts, docs/cluster.md "Overlapping pools") on the
 * memory KV: a network whose layout is not the pool's record (ADD and CHECK code 7 with the exact
 * text, DEL still releases), a pool whose ranges overlap another pool's refused at creation with
 * nothing written, an overlapping pair left by an older version (the later pool's ADDs refused,
 * its CHECK and DEL still served), the pool index's codec and a corrupt index. The concurrent
 * creations run on a real etcd (test/blackbox/pool-overlap.test.ts).
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { AppError } from '../../src/common/errors.ts';
import { formatIP } from '../../src/common/ip.ts';
import { loadIPAMConfig } from '../../src/ipam/config.ts';
import type { IPAMConfig } from '../../src/ipam/types.ts';
import { PoolAllocator, type PoolAllocation } from '../../src/pool/allocator.ts';
import { metaOf } from '../../src/pool/model.ts';
import { decodeRegistry, encodeRegistry, prefixOverlaps, registryKey } from '../../src/pool/overlap.ts';
import { poolStatus } from '../../src/pool/status.ts';
import { poolStatusTable } from '../../src/cli/pool.ts';
import { renderPoolStatusHtml } from '../../src/cli/html.ts';
import { MemoryKV } from '../../src/store/memory/memory-kv.ts';
import type { KV, KVEntry } from '../../src/store/kv.ts';

const REG = '/ipwarden/pool-ranges';

function rangeSets(ranges: unknown): IPAMConfig['rangeSets'] {
  return loadIPAMConfig(JSON.stringify({ cniVersion: '1.0.0', name: 'x', ipam: { ranges } }), undefined).rangeSets;
}

function allocator(kv: KV, pool: string, subnet: string, o: { node?: string; network?: string; blockSize?: number } = {}): PoolAllocator {
  return new PoolAllocator({ kv, pool, prefix: '/ipwarden', node: o.node ?? 'node-a', network: o.network ?? `net-${pool}`, rangeSets: rangeSets([[{ subnet }]]), sizes: { blockSize4: o.blockSize ?? 28, blockSize6: 122 }, now: () => 1000 });
}

async function add(a: PoolAllocator, id: string): Promise<string> {
  const [r] = await a.add([{ containerId: id, ifname: 'eth0' }]);
  if (r instanceof AppError) throw r;
  return (r as PoolAllocation[]).map((x) => formatIP(x.ip)).join(',');
}

async function refusal(p: Promise<unknown>): Promise<{ code: number; msg: string }> {
  try {
    await p;
  } catch (e) {
    if (e instanceof AppError) return { code: e.cniCode, msg: e.message };
    throw e;
  }
  assert.fail('expected a refusal');
}

/** A view of `kv` that hides keys under `hidden` from reads (an older version's process, which never looks at them). */
function hiding(kv: KV, hidden: readonly string[]): KV {
  const shown = (k: string): boolean => !hidden.some((h) => k.startsWith(h));
  return {
    description: kv.description,
    stats: kv.stats,
    get: async (k) => (shown(k) ? kv.get(k) : null),
    list: async (p, o) => (await kv.list(p, o)).filter((e) => shown(e.key)),
    txn: (c, o) => kv.txn(c, o),
    close: () => kv.close(),
  };
}

const TABLE_TAIL = [
  'LATER POOL  EARLIER POOL  OVERLAPPING RANGES',
  'b           a             10.80.0.0/25 10.80.0.1-10.80.0.126 / 10.80.0.0/24 10.80.0.1-10.80.0.254',
  'pool b overlaps a pool created before it: its ADDs are refused until the overlap is gone (docs/cluster.md "Overlapping pools")',
  '',
].join('\n');

const R = (s: string, a: string, b: string) => `${s} ${a}-${b}`;

describe('overlapping pools', () => {
  it('a network whose ranges or block size differ from the record: ADD and CHECK code 7 naming both, DEL still releases', async () => {
    const kv = new MemoryKV();
    assert.equal(await add(allocator(kv, 'p1', '10.80.0.0/27'), 'c1'), '10.80.0.16');
    const before = JSON.stringify(kv.dump());
    const rec = `ranges [${R('10.80.0.0/27', '10.80.0.1', '10.80.0.30')} gateway 10.80.0.1] and block sizes /28 (IPv4) and /122 (IPv6)`;
    const tail = 'every network naming pool p1 must have the same ranges and block sizes (the first to use the pool recorded them in /ipwarden/pools/p1/meta)';
    const wider = allocator(kv, 'p1', '10.80.0.0/26', { node: 'node-b', network: 'wide' });
    const want = { code: 7, msg: `pool p1 is recorded in etcd with ${rec}, but network wide has ranges [${R('10.80.0.0/26', '10.80.0.1', '10.80.0.62')} gateway 10.80.0.1] and block sizes /28 (IPv4) and /122 (IPv6): ${tail}` };
    assert.deepEqual(await refusal(wider.add([{ containerId: 'c2', ifname: 'eth0' }])), want);
    assert.deepEqual(await refusal(allocator(kv, 'p1', '10.80.0.0/26', { node: 'node-b', network: 'wide' }).find({ containerId: 'c1', ifname: 'eth0' })), want, 'CHECK too');
    const cut = allocator(kv, 'p1', '10.80.0.0/27', { node: 'node-b', network: 'cut', blockSize: 29 });
    assert.deepEqual(await refusal(cut.add([{ containerId: 'c2', ifname: 'eth0' }])), {
      code: 7,
      msg: `pool p1 is recorded in etcd with ${rec}, but network cut has ranges [${R('10.80.0.0/27', '10.80.0.1', '10.80.0.30')} gateway 10.80.0.1] and block sizes /29 (IPv4) and /122 (IPv6): ${tail}`,
    });
    assert.equal(JSON.stringify(kv.dump()), before, 'nothing written by the refusals');
    // DEL never checks the layout: what the handle holds is released.
    assert.deepEqual(await allocator(kv, 'p1', '10.80.0.0/26', { node: 'node-a', network: 'wide' }).del({ containerId: 'c1', ifname: 'eth0' }), ['10.80.0.16']);
    assert.equal(kv.dump()['/ipwarden/pools/p1/handles/c1/eth0'], undefined);
    // CHECK of a pool never used creates nothing.
    const fresh = new MemoryKV();
    assert.equal(await allocator(fresh, 'p9', '10.80.0.0/27').find({ containerId: 'c1', ifname: 'eth0' }), null);
    assert.deepEqual(fresh.dump(), {});
  });

  it('a pool whose ranges overlap another pool of the prefix is not created (code 7 naming both, nothing written); a disjoint one is, and the index lists both', async () => {
    const kv = new MemoryKV();
    assert.equal(await add(allocator(kv, 'a', '10.80.0.0/24'), 'c1'), '10.80.0.48');
    assert.equal(kv.dump()[REG], '{"v":1,"pools":{"a":[{"subnet":"10.80.0.0/24","rangeStart":"10.80.0.1","rangeEnd":"10.80.0.254"}]}}');
    const before = JSON.stringify(kv.dump());
    assert.deepEqual(await refusal(add(allocator(kv, 'b', '10.80.0.128/25'), 'c2')), {
      code: 7,
      msg: `pool b is not created: its ranges overlap pool a in etcd prefix /ipwarden (${R('10.80.0.128/25', '10.80.0.129', '10.80.0.254')} of pool b overlaps ${R('10.80.0.0/24', '10.80.0.1', '10.80.0.254')} of pool a); two pools would hand out the same addresses — give pool b ranges of its own`,
    });
    assert.equal(JSON.stringify(kv.dump()), before, 'nothing written');
    assert.equal(await add(allocator(kv, 'c', '10.81.0.0/24'), 'c3'), '10.81.0.48');
    assert.deepEqual(decodeRegistry({ key: REG, value: kv.dump()[REG] as string, modRevision: '1', createRevision: '1' }).size, 2);
    assert.equal(kv.dump()[REG], '{"v":1,"pools":{"a":[{"subnet":"10.80.0.0/24","rangeStart":"10.80.0.1","rangeEnd":"10.80.0.254"}],"c":[{"subnet":"10.81.0.0/24","rangeStart":"10.81.0.1","rangeEnd":"10.81.0.254"}]}}');
    // Two pools over one subnet with disjoint rangeStart/rangeEnd do not overlap.
    const lo = new PoolAllocator({ kv, pool: 'lo', prefix: '/ipwarden', node: 'node-a', network: 'lo', rangeSets: rangeSets([[{ subnet: '10.82.0.0/24', rangeStart: '10.82.0.1', rangeEnd: '10.82.0.99' }]]), sizes: { blockSize4: 28, blockSize6: 122 }, now: () => 1000 });
    const hi = new PoolAllocator({ kv, pool: 'hi', prefix: '/ipwarden', node: 'node-a', network: 'hi', rangeSets: rangeSets([[{ subnet: '10.82.0.0/24', rangeStart: '10.82.0.100', rangeEnd: '10.82.0.200' }]]), sizes: { blockSize4: 28, blockSize6: 122 }, now: () => 1000 });
    assert.equal(await add(lo, 'l1'), '10.82.0.80');
    assert.equal(await add(hi, 'h1'), '10.82.0.176');
    assert.deepEqual(await prefixOverlaps(kv, '/ipwarden'), []);
  });

  it('a pool of the prefix whose meta cannot be read (a newer version\'s value, a damaged key): a new pool is not created (999, nothing written), since an overlap cannot be ruled out', async () => {
    const kv = new MemoryKV();
    kv.plant('/ipwarden/pools/a/meta', '{"v":1,"rangeSets":[],"blockSize":28,"blockSize6":122,"newField":true}');
    const r = await refusal(add(allocator(kv, 'b', '10.241.7.0/24'), 'c1'));
    assert.equal(r.code, 999);
    assert.match(r.msg, /^pool b is not created: the ranges of pool a in \/ipwarden cannot be read \(.+\), so an overlap with it cannot be ruled out — see docs\/cluster\.md "Corrupt keys"$/);
    assert.deepEqual(Object.keys(kv.dump()), ['/ipwarden/pools/a/meta'], 'nothing written');
  });

  it('two overlapping pools whose creations both read before either commits: the pool index\'s compare lets exactly one through, the other re-reads and is refused', async () => {
    for (const first of ['a', 'b'] as const) {
      const kv = new MemoryKV();
      // Hold every transaction until both creations have sent theirs (both read an absent index).
      const held: Array<() => void> = [];
      let open = false;
      const order: string[] = [];
      const view = (who: string): KV => ({
        description: kv.description,
        stats: kv.stats,
        get: (k) => kv.get(k),
        list: (p, o) => kv.list(p, o),
        txn: async (c, o) => {
          if (!open) {
            await new Promise<void>((r) => {
              held.push(r);
              if (held.length === 2) {
                open = true;
                // Let `first` commit first.
                const [x, y] = held;
                (first === 'a' ? (x as () => void) : (y as () => void))();
                setImmediate(first === 'a' ? (y as () => void) : (x as () => void));
              }
            });
          }
          const r = await kv.txn(c, o);
          order.push(`${who}:${r.succeeded}`);
          return r;
        },
        close: () => kv.close(),
      });
      const [ra, rb] = await Promise.allSettled([add(allocator(view('a'), 'a', '10.80.0.0/24'), 'c1'), add(allocator(view('b'), 'b', '10.80.0.64/26'), 'c2')]);
      const won = first;
      const lost = first === 'a' ? 'b' : 'a';
      assert.equal((won === 'a' ? ra : rb).status, 'fulfilled', `${won} created`);
      const rej = (lost === 'a' ? ra : rb) as PromiseRejectedResult;
      const rA = R('10.80.0.0/24', '10.80.0.1', '10.80.0.254');
      const rB = R('10.80.0.64/26', '10.80.0.65', '10.80.0.126');
      assert.equal(
        (rej.reason as AppError).message,
        lost === 'b'
          ? `pool b is not created: its ranges overlap pool a in etcd prefix /ipwarden (${rB} of pool b overlaps ${rA} of pool a); two pools would hand out the same addresses — give pool b ranges of its own`
          : `pool a is not created: its ranges overlap pool b in etcd prefix /ipwarden (${rA} of pool a overlaps ${rB} of pool b); two pools would hand out the same addresses — give pool a ranges of its own`,
      );
      assert.equal(order[0], `${first}:true`);
      assert.deepEqual(order.filter((x) => x.startsWith(lost)), [`${lost}:false`], 'the other creation was sent on the same (absent) index and failed its compare; re-read, it was refused without another transaction');
      assert.deepEqual(Object.keys(kv.dump()).filter((k) => k.endsWith('/meta')), [`/ipwarden/pools/${won}/meta`]);
    }
  });

  it('an overlapping pool created while a creation reads (before its index is read, or after its scan): the creation is refused', async () => {
    for (const when of ['index', 'scan'] as const) {
      const kv = new MemoryKV();
      let fired = false;
      const other = async (): Promise<void> => {
        if (fired) return;
        fired = true;
        assert.equal(await add(allocator(kv, 'x', '10.80.0.0/24', { node: 'node-x' }), 'cx'), '10.80.0.128');
      };
      const view: KV = {
        description: kv.description,
        stats: kv.stats,
        get: async (k) => {
          // The index is read only after x is created (its answer is the index listing x).
          if (when === 'index' && k === REG) await other();
          return kv.get(k);
        },
        list: async (p, o) => {
          const r = await kv.list(p, o);
          if (when === 'scan' && p === '/ipwarden/pools/') await other();
          return r;
        },
        txn: (c, o) => kv.txn(c, o),
        close: () => kv.close(),
      };
      assert.deepEqual(await refusal(add(allocator(view, 'y', '10.80.0.0/25'), 'cy')), {
        code: 7,
        msg: `pool y is not created: its ranges overlap pool x in etcd prefix /ipwarden (${R('10.80.0.0/25', '10.80.0.1', '10.80.0.126')} of pool y overlaps ${R('10.80.0.0/24', '10.80.0.1', '10.80.0.254')} of pool x); two pools would hand out the same addresses — give pool y ranges of its own`,
      }, when);
      assert.deepEqual(Object.keys(kv.dump()).filter((k) => k.endsWith('/meta')), ['/ipwarden/pools/x/meta'], when);
    }
  });

  it('a pair left by an older version: the later pool\'s ADDs are refused, its CHECK and DEL served; the earlier pool allocates; prefixOverlaps names the pair', async () => {
    const kv = new MemoryKV();
    // Pool a first (its meta only, as an older version wrote it), then pool b by a process that
    // saw neither a nor the index (an older version), then the index gone (never written by it).
    await kv.txn([], [{ put: '/ipwarden/pools/a/meta', value: metaOf(rangeSets([[{ subnet: '10.80.0.0/24' }]]), { blockSize4: 28, blockSize6: 122 }) }]);
    const old = allocator(hiding(kv, ['/ipwarden/pools/a/', REG]), 'b', '10.80.0.0/25');
    assert.equal(await add(old, 'c1'), '10.80.0.48');
    await kv.txn([], [{ delete: REG }]);
    const b = allocator(kv, 'b', '10.80.0.0/25');
    const msg = `pool b overlaps pool a, created before it, in etcd prefix /ipwarden (${R('10.80.0.0/25', '10.80.0.1', '10.80.0.126')} of pool b overlaps ${R('10.80.0.0/24', '10.80.0.1', '10.80.0.254')} of pool a); no address is handed out from pool b while they overlap — give pool b ranges of its own (its addresses in use are released by their DELs)`;
    assert.deepEqual(await refusal(add(b, 'c2')), { code: 7, msg });
    assert.deepEqual(await refusal(add(allocator(kv, 'b', '10.80.0.0/25'), 'c1')), { code: 7, msg }, 'a repeated ADD too');
    assert.equal(kv.dump()['/ipwarden/pools/b/handles/c2/eth0'], undefined, 'nothing allocated');
    // The index now lists both (written from a scan of every meta of the prefix).
    assert.deepEqual([...decodeRegistry({ key: REG, value: kv.dump()[REG] as string, modRevision: '1', createRevision: '1' }).keys()], ['a', 'b']);
    assert.equal(await add(allocator(kv, 'a', '10.80.0.0/24'), 'c3'), '10.80.0.48', 'the earlier pool allocates — here the address pool b holds for c1: the duplicate an overlap makes');
    assert.deepEqual(await prefixOverlaps(kv, '/ipwarden'), [{ later: 'b', earlier: 'a', ranges: [{ later: R('10.80.0.0/25', '10.80.0.1', '10.80.0.126'), earlier: R('10.80.0.0/24', '10.80.0.1', '10.80.0.254') }] }]);
    assert.deepEqual(await prefixOverlaps(kv, '/ipwarden', 'c'), []);
    const st = await poolStatus(kv, '/ipwarden', 'a');
    assert.deepEqual(st.overlaps, await prefixOverlaps(kv, '/ipwarden'));
    const table = poolStatusTable(st);
    assert.equal(table.slice(table.indexOf('LATER POOL')), TABLE_TAIL);
    const page = renderPoolStatusHtml(st, { generatedAtMs: 0 });
    assert.ok(page.includes(`<tr data-later="b" data-earlier="a"><td>b</td><td>a</td><td>${R('10.80.0.0/25', '10.80.0.1', '10.80.0.126')} / ${R('10.80.0.0/24', '10.80.0.1', '10.80.0.254')}</td></tr>`));
    const found = await allocator(kv, 'b', '10.80.0.0/25').find({ containerId: 'c1', ifname: 'eth0' });
    assert.deepEqual(found?.map((x) => formatIP(x.ip)), ['10.80.0.48'], 'CHECK of an existing attachment');
    assert.deepEqual(await allocator(kv, 'b', '10.80.0.0/25').del({ containerId: 'c1', ifname: 'eth0' }), ['10.80.0.48'], 'DEL releases');
  });

  it('the pool index: its codec is exact; a corrupt index refuses a creation (999, never rewritten) and an existing pool is checked from a scan instead', async () => {
    const e = (value: string): KVEntry => ({ key: REG, value, modRevision: '1', createRevision: '1' });
    const good = '{"v":1,"pools":{"a":[{"subnet":"10.80.0.0/24","rangeStart":"10.80.0.1","rangeEnd":"10.80.0.254"}]}}';
    assert.equal(encodeRegistry(decodeRegistry(e(good))), good);
    assert.equal(registryKey('/x/y'), '/x/y/pool-ranges');
    const bad: Array<[string, string]> = [
      ['{', 'not valid JSON'],
      ['{"v":2,"pools":{}}', 'unknown value version 2 (this ipwarden writes 1)'],
      ['{"v":1,"pools":{},"x":1}', 'unknown field "x" (known: v, pools)'],
      ['{"v":1,"pools":[]}', '"pools" must be an object'],
      ['{"v":1,"pools":{"-a":[]}}', 'pools: "-a" is not a pool name'],
      ['{"v":1,"pools":{"a":[]}}', 'pools.a must be a non-empty array'],
      ['{"v":1,"pools":{"a":[{"subnet":"10.80.0.0/24","rangeStart":"10.80.0.1","rangeEnd":"10.80.0.254","gateway":"10.80.0.1"}]}}', 'pools.a[0]: unknown field "gateway" (known: subnet, rangeStart, rangeEnd)'],
      ['{"v":1,"pools":{"a":[{"subnet":"10.80.0.1/24","rangeStart":"10.80.0.1","rangeEnd":"10.80.0.254"}]}}', 'pools.a[0]: "subnet", "rangeStart" and "rangeEnd" must be a canonical subnet and two of its addresses in order'],
      ['{"v":1,"pools":{"a":[{"subnet":"10.80.0.0/24","rangeStart":"10.80.0.9","rangeEnd":"10.80.0.2"}]}}', 'pools.a[0]: "subnet", "rangeStart" and "rangeEnd" must be a canonical subnet and two of its addresses in order'],
    ];
    for (const [v, why] of bad) {
      assert.throws(() => decodeRegistry(e(v)), (x: unknown) => x instanceof AppError && x.code === 'STORE_CORRUPT' && x.message === `etcd key ${REG}: ${why}`, v);
    }
    const kv = new MemoryKV();
    assert.equal(await add(allocator(kv, 'a', '10.80.0.0/24'), 'c1'), '10.80.0.48');
    await kv.txn([], [{ put: REG, value: '{' }]);
    assert.deepEqual(await refusal(add(allocator(kv, 'c', '10.81.0.0/24'), 'c2')), { code: 999, msg: `etcd key ${REG}: not valid JSON` });
    assert.equal(kv.dump()['/ipwarden/pools/c/meta'], undefined);
    assert.equal(await add(allocator(kv, 'a', '10.80.0.0/24'), 'c3'), '10.80.0.49', 'an existing pool still allocates');
    assert.equal(kv.dump()[REG], '{', 'never rewritten');
  });
});
