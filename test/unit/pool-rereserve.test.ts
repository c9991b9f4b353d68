/**
 * Re-reserving live pods' addresses (src/pool/rereserve.ts) on the memory KV, every value exact:
 * placement in the pool, the write into an existing block and the claim of a block the snapshot
 * lacks, and every case where nothing may be written (another container's allocation, a reserve
 * entry, a handle at the sandbox's key, a tombstone, a removal of the node begun). And the pass's
 * rule for a renamed host (src/reconcile/pool-pass.ts): handles of an earlier host name of this
 * machine are judged only while the node's heartbeat names this host.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { loadIPAMConfig } from '../../src/ipam/config.ts';
import { PoolAllocator } from '../../src/pool/allocator.ts';
import { checkPodAddress, podAddress, reReserve, type PodAddress } from '../../src/pool/rereserve.ts';
import { MemoryKV } from '../../src/store/memory/memory-kv.ts';
import { Confirmations } from '../../src/reconcile/confirm.ts';
import { memoryAuditSink } from '../../src/reconcile/audit.ts';
import { runPoolPass } from '../../src/reconcile/pool-pass.ts';
import type { ReconcileDeps } from '../../src/reconcile/options.ts';

const conf = loadIPAMConfig(JSON.stringify({ cniVersion: '1.0.0', name: 'net1', ipam: { ranges: [[{ subnet: '10.87.0.0/27' }]] } }), undefined);
const SIZES = { blockSize4: 28, blockSize6: 122 };
const KEYS = { prefix: '/ipwarden', pool: 'rp' };
const B = '/ipwarden/pools/rp';

function alloc(kv: MemoryKV, node: string, host = 'h1'): PoolAllocator {
  return new PoolAllocator({ kv, ...KEYS, node, network: 'net1', rangeSets: conf.rangeSets, sizes: SIZES, now: () => 1_000, host });
}
function place(ip: string): PodAddress {
  return podAddress(ip, conf.rangeSets, SIZES) as PodAddress;
}
const scope = (kv: MemoryKV) => ({ kv, ...KEYS, node: 'n1', host: 'h1', network: 'net1', now: () => 2_000 });
async function json(kv: MemoryKV, key: string): Promise<unknown> {
  const e = await kv.get(key);
  return e === null ? null : JSON.parse(e.value);
}

describe('podAddress', () => {
  it('places an address in its range set, block and ordinal; a gateway or an address outside the ranges is not the pool\'s', () => {
    const a = place('10.87.0.19');
    assert.deepEqual([a.ip, a.rangeSet, a.block, a.ordinal], ['10.87.0.19', 0, '10.87.0.16-28', 3]);
    assert.equal(podAddress('10.87.0.1', conf.rangeSets, SIZES), null, 'the gateway');
    assert.equal(podAddress('10.88.0.5', conf.rangeSets, SIZES), null);
    assert.equal(podAddress('not an ip', conf.rangeSets, SIZES), null);
  });
});

describe('reReserve (memory KV)', () => {
  it('free in an existing block: the allocation (next seq) and the handle in one transaction', async () => {
    const kv = new MemoryKV();
    const [c0] = await alloc(kv, 'n1').add([{ containerId: 'c0', ifname: 'eth0' }]);
    const blockKey = (c0 as Array<{ block: string }>)[0]?.block as string;
    assert.equal(blockKey, '10.87.0.0-28', 'n1 claims the first block (its name\'s hash)');
    const cidr = 0;
    const ip = `10.87.0.${cidr + 5}`;
    assert.deepEqual(await checkPodAddress(kv, KEYS, 'sb1', place(ip)), { state: 'missing', claim: false });
    const r = await reReserve(scope(kv), 'sb1', place(ip));
    assert.deepEqual([r.state, 'block' in r ? r.block : null, 'claimed' in r ? r.claimed : null, 'seq' in r ? r.seq : null], ['re-reserved', blockKey, false, 2]);
    assert.deepEqual(await json(kv, `${B}/handles/sb1/eth0`), { v: 1, node: 'n1', network: 'net1', at: 2_000, ips: [{ ip, block: blockKey, ordinal: 5, seq: 2, rangeSet: 0 }], host: 'h1' });
    const b = (await json(kv, `${B}/blocks/${blockKey}`)) as { seq: number; next: number; allocs: Record<string, unknown> };
    assert.deepEqual([b.seq, b.next, b.allocs['5']], [2, 6, { id: 'sb1', ifname: 'eth0', node: 'n1', seq: 2, at: 2_000 }]);
    assert.deepEqual(await checkPodAddress(kv, KEYS, 'sb1', place(ip)), { state: 'held' });
    assert.deepEqual(await reReserve(scope(kv), 'sb1', place(ip)), { state: 'held' }, 'a second pass writes nothing');
  });

  it('a block the snapshot lacks: claimed for this node (block and affinity absent compared)', async () => {
    const kv = new MemoryKV();
    const r = await reReserve(scope(kv), 'sb1', place('10.87.0.20'));
    assert.deepEqual([r.state, 'claimed' in r ? r.claimed : null], ['re-reserved', true]);
    assert.deepEqual(await json(kv, `${B}/nodes/n1/blocks/10.87.0.16-28`), { v: 1, rangeSet: 0 });
    assert.deepEqual(await json(kv, `${B}/blocks/10.87.0.16-28`), { v: 1, cidr: '10.87.0.16/28', rangeSet: 0, node: 'n1', state: 'owned', seq: 1, next: 5, allocs: { '4': { id: 'sb1', ifname: 'eth0', node: 'n1', seq: 1, at: 2_000 } } });
  });

  it('never taken: another container\'s allocation, a handle at the sandbox\'s key, a tombstone, a removal begun', async () => {
    const kv = new MemoryKV();
    const [got] = await alloc(kv, 'n2').add([{ containerId: 'other', ifname: 'eth0' }]);
    const ip = (got as Array<{ ip: { value: bigint } }>)[0] as { ip: { value: bigint } };
    const text = `10.87.0.${Number(ip.ip.value & 255n)}`;
    const before = await kv.list(`${B}/`);
    const a = place(text);
    assert.deepEqual(await reReserve(scope(kv), 'sb1', a), { state: 'conflict', holder: `container other/eth0 of node n2 (seq 1)`, wanted: 'written' }, 'the holder keeps it; the want is recorded');
    assert.deepEqual(await reReserve(scope(kv), 'sb1', a), { state: 'conflict', holder: `container other/eth0 of node n2 (seq 1)`, wanted: 'mine' }, 'a second pass writes nothing more');
    assert.deepEqual(((await json(kv, `${B}/blocks/${a.block}`)) as { allocs: Record<string, unknown> }).allocs[String(a.ordinal)], { id: 'other', ifname: 'eth0', node: 'n2', seq: 1, at: 1_000 }, 'never taken from the holder');
    // A handle of the sandbox's key naming another address.
    await alloc(kv, 'n1').add([{ containerId: 'sb2', ifname: 'eth0' }]);
    const h2 = (await json(kv, `${B}/handles/sb2/eth0`)) as { ips: Array<{ ip: string }> };
    const free = ['10.87.0.25', '10.87.0.9'].find((x) => x !== h2.ips[0]?.ip && x !== text) as string;
    assert.deepEqual(await reReserve(scope(kv), 'sb2', place(free)), { state: 'conflict', holder: `the handle ${B}/handles/sb2/eth0 of node n1, which names ${h2.ips[0]?.ip}` });
    // A tombstone: a DEL of the sandbox found nothing (within 600 s).
    await alloc(kv, 'n1').del({ containerId: 'sb3', ifname: 'eth0' });
    assert.deepEqual(await reReserve(scope(kv), 'sb3', place(free)), { state: 'skipped', why: `a DEL of sb3/eth0 left a tombstone (${B}/handles/sb3/eth0): not re-reserved while it lives` });
    // A removal of the node begun: nothing written.
    await kv.txn([], [{ put: `${B}/removing/n1`, value: '{"v":1,"node":"n1","at":1}' }]);
    const mid = await kv.list(`${B}/`);
    assert.deepEqual(await reReserve(scope(kv), 'sb4', place(free)), { state: 'skipped', why: `a removal of node n1 is begun (${B}/removing/n1): nothing written (its heartbeat vetoes it; the next pass decides again)` });
    assert.deepEqual(await kv.list(`${B}/`), mid, 'nothing written');
    assert.ok(before.length > 0);
  });

  it('a reserve entry of offline allocation is a conflict too', async () => {
    const kv = new MemoryKV();
    const a = alloc(kv, 'n2');
    const { slots } = await a.refillReserve(1, 30);
    const slot = slots[0] as { ip: string } | undefined;
    assert.ok(slot !== undefined);
    const text = typeof slot.ip === 'string' ? slot.ip : String(slot.ip);
    assert.deepEqual(await reReserve(scope(kv), 'sb1', place(text)), { state: 'conflict', holder: 'a reserve entry of node n2 (offline allocation)', wanted: 'written' });
  });
});

describe('the pool pass: handles of an earlier host name of this machine', () => {
  function world(heartbeatHost: string | null, fixedNodeName = false) {
    const kv = new MemoryKV();
    const deps: ReconcileDeps = {
      env: { CONTAINER_RUNTIME_ENDPOINT: 'unix:///run/ipwarden-rereserve-unit.sock' },
      now: () => 1_700_000_000_000,
      evidence: () => ({ addresses: new Map(), inFlight: new Map(), incomplete: null }),
      sandboxSource: (endpoint) => ({ endpoint, list: async () => [], podIPs: async () => [], close: () => undefined }),
    };
    let mono = 0;
    const confirmations = new Confirmations(60, 32);
    const audit = memoryAuditSink();
    const pass = async () => {
      if (heartbeatHost !== null) await kv.txn([], [{ put: `${B}/alive/n1`, value: JSON.stringify({ v: 1, node: 'n1', since: 1, host: heartbeatHost, pid: 7 }) }]);
      mono += 60_000;
      return runPoolPass([{ kv, ...KEYS, node: 'n1', id: 'rp@n1', fixedNodeName }], { runtimeEndpoint: null, audit: () => audit, host: 'host-new', earlierHosts: ['host-old'] }, confirmations, deps, () => mono);
    };
    return { kv, pass };
  }
  it('judged and released while the heartbeat names this host; a stranger\'s never', async () => {
    const { kv, pass } = world('host-new');
    await alloc(kv, 'n1', 'host-old').add([{ containerId: 'old1', ifname: 'eth0' }]);
    await alloc(kv, 'n1', 'stranger').add([{ containerId: 'str1', ifname: 'eth0' }]);
    const p1 = await pass();
    assert.deepEqual([p1.pools[0]?.leaked, p1.released.length], [1, 0]);
    const p2 = await pass();
    assert.deepEqual(p2.released.map((x) => x.containerId), ['old1']);
    assert.deepEqual(p2.errors.map((e) => e.message), ['pool rp: 1 handle(s) of node n1 were written on other hosts than host-new (stranger): never judged or released here — two hosts under one node name? (a fixed ipam.nodeName, equal host names)']);
  });
  it('never judged when ipam.nodeName fixes the node name (two machines may share it), even with the heartbeat naming this host', async () => {
    const { kv, pass } = world('host-new', true);
    await alloc(kv, 'n1', 'host-old').add([{ containerId: 'old1', ifname: 'eth0' }]);
    await pass();
    const p2 = await pass();
    assert.deepEqual([p2.released.length, p2.pools[0]?.leaked], [0, 0]);
    assert.deepEqual(p2.errors.map((e) => [e.kind, e.message]), [
      ['foreign', 'pool rp: 1 handle(s) of node n1 were written under earlier host names of this machine (host-old), but the node name is fixed by ipam.nodeName (several machines may share it): never judged here'],
      ['foreign', 'pool rp: 1 handle(s) of node n1 were written on other hosts than host-new (host-old): never judged or released here — two hosts under one node name? (a fixed ipam.nodeName, equal host names)'],
    ]);
  });
  for (const [hb, said] of [['host-other', 'was written on host host-other'], [null, 'is absent']] as const) {
    it(`not judged while the heartbeat ${said}`, async () => {
      const { kv, pass } = world(hb);
      await alloc(kv, 'n1', 'host-old').add([{ containerId: 'old1', ifname: 'eth0' }]);
      await pass();
      const p2 = await pass();
      assert.deepEqual([p2.released.length, p2.pools[0]?.leaked], [0, 0]);
      assert.deepEqual(p2.errors.map((e) => [e.kind, e.message]), [
        ['foreign', `pool rp: 1 handle(s) of node n1 were written under earlier host names of this machine (host-old), but the node's heartbeat ${said}: not judged until it names host-new`],
        ['foreign', 'pool rp: 1 handle(s) of node n1 were written on other hosts than host-new (host-old): never judged or released here — two hosts under one node name? (a fixed ipam.nodeName, equal host names)'],
      ]);
    });
  }
});
