import assert from 'node:assert/strict';
import { beforeEach, describe, it } from 'node:test';
import { AppError } from '../../src/common/errors.ts';
import type { Allocation } from '../../src/ipam/allocator.ts';
import { allocate, RangeExhaustedError } from '../../src/ipam/allocator.ts';
import { loadIPAMConfig } from '../../src/ipam/config.ts';
import { formatIP, parseIP } from '../../src/common/ip.ts';
import type { IP, RangeSet } from '../../src/ipam/types.ts';
import type { MemoryStoreOptions } from '../../src/store/memory/memory-store.ts';
import { MemoryStore } from '../../src/store/memory/memory-store.ts';

/** Range sets from an `ipam.ranges` value, through the real config loader. */
function sets(ranges: unknown): readonly RangeSet[] {
  return loadIPAMConfig(JSON.stringify({ cniVersion: '1.0.0', name: 'n', ipam: { type: 'ipwarden', ranges } }), undefined)
    .rangeSets;
}

const ip = (s: string): IP => parseIP(s) as IP;
const texts = (a: Allocation[]): string[] => a.map((x) => formatIP(x.ip));

async function lockedStore(opts: MemoryStoreOptions = {}): Promise<MemoryStore> {
  const s = new MemoryStore('n', opts);
  await s.lock(1);
  return s;
}

/** ADD (containerId, ifname): the IPs, or the error message. */
async function add(
  store: MemoryStore,
  rangeSets: readonly RangeSet[],
  containerId: string,
  ifname = 'eth0',
  requested: string[] = [],
): Promise<string[] | string> {
  try {
    return texts(await allocate(store, { containerId, ifname, rangeSets, requestedIPs: requested.map(ip) }));
  } catch (e) {
    return (e as Error).message;
  }
}

const SLASH29 = [[{ subnet: '10.244.1.0/29' }]];
const BR16_A = [
  [{ subnet: '10.10.10.0/24', rangeStart: '10.10.10.20', rangeEnd: '10.10.10.22' }],
  [{ subnet: '10.20.20.0/24', rangeStart: '10.20.20.20', rangeEnd: '10.20.20.21' }],
];
const BR16_B = [
  [
    { subnet: '10.10.10.0/24', rangeStart: '10.10.10.20', rangeEnd: '10.10.10.22' },
    { subnet: '10.20.20.0/24', rangeStart: '10.20.20.20', rangeEnd: '10.20.20.21' },
  ],
];

/** A sequence of ADDs from a seeded state and what each returns. */
interface SeqCase {
  name: string;
  ranges: unknown;
  seed?: Record<string, string | null>;
  last?: Record<number, string>;
  adds: [string, string[] | string][]; // [containerId, result]
}

const sequences: SeqCase[] = [
  {
    name: '/29 from empty: .2-.6 then exhaustion',
    ranges: SLASH29,
    adds: [
      ['c1', ['10.244.1.2']],
      ['c2', ['10.244.1.3']],
      ['c3', ['10.244.1.4']],
      ['c4', ['10.244.1.5']],
      ['c5', ['10.244.1.6']],
      ['c6', 'failed to allocate for range 0: no IP addresses available in range set: 10.244.1.1-10.244.1.6'],
    ],
  },
  {
    name: '/30: only .2',
    ranges: [[{ subnet: '10.1.0.0/30' }]],
    adds: [
      ['c1', ['10.1.0.2']],
      ['c2', 'failed to allocate for range 0: no IP addresses available in range set: 10.1.0.1-10.1.0.2'],
    ],
  },
  {
    name: 'round robin continues after last_reserved_ip, wraps and skips the gateway (BR-03 boot 2 after reclaim)',
    ranges: SLASH29,
    seed: { '10.244.1.5': 'c4|eth0', '10.244.1.6': 'c5|eth0' },
    last: { 0: '10.244.1.6' },
    adds: [
      ['c6', ['10.244.1.2']],
      ['c7', ['10.244.1.3']],
    ],
  },
  {
    name: 'BR-13: .3 after .2 even though .2 is free',
    ranges: SLASH29,
    last: { 0: '10.244.1.2' },
    adds: [
      ['c2', ['10.244.1.3']],
      ['c3', ['10.244.1.4']],
      ['c4', ['10.244.1.5']],
      ['c5', ['10.244.1.6']],
      ['c6', ['10.244.1.2']],
    ],
  },
  {
    name: 'BR-02: after 10.88.0.2 was released, ADD continues at .3',
    ranges: [[{ subnet: '10.88.0.0/29' }]],
    last: { 0: '10.88.0.2' },
    adds: [['c-new', ['10.88.0.3']]],
  },
  {
    name: 'taken addresses are skipped without a store call each',
    ranges: SLASH29,
    seed: { '10.244.1.3': 'x|eth0', '10.244.1.4': 'y', '10.244.1.6': 'z|eth0' },
    last: { 0: '10.244.1.2' },
    adds: [
      ['c1', ['10.244.1.5']],
      ['c2', ['10.244.1.2']],
      ['c3', 'failed to allocate for range 0: no IP addresses available in range set: 10.244.1.1-10.244.1.6'],
    ],
  },
  {
    name: 'BR-16 A: two range sets, c3 fails in set 1',
    ranges: BR16_A,
    adds: [
      ['c1', ['10.10.10.20', '10.20.20.20']],
      ['c2', ['10.10.10.21', '10.20.20.21']],
      ['c3', 'failed to allocate for range 1: no IP addresses available in range set: 10.20.20.20-10.20.20.21'],
    ],
  },
  {
    name: 'BR-16 B: one range set of two ranges is one pool',
    ranges: BR16_B,
    adds: [
      ['c1', ['10.10.10.20']],
      ['c2', ['10.10.10.21']],
      ['c3', ['10.10.10.22']],
      ['c4', ['10.20.20.20']],
      ['c5', ['10.20.20.21']],
      [
        'c6',
        'failed to allocate for range 0: no IP addresses available in range set: 10.10.10.20-10.10.10.22,10.20.20.20-10.20.20.21',
      ],
    ],
  },
  {
    name: 'multi-range: last = end of range 0 continues in range 1 and wraps',
    ranges: BR16_B,
    last: { 0: '10.10.10.22' },
    adds: [
      ['c1', ['10.20.20.20']],
      ['c2', ['10.20.20.21']],
      ['c3', ['10.10.10.20']],
    ],
  },
  {
    name: 'BR-24 A: /16 range across an octet boundary',
    ranges: [[{ subnet: '10.1.0.0/16', rangeStart: '10.1.2.254', rangeEnd: '10.1.3.1' }]],
    adds: [
      ['c1', ['10.1.2.254']],
      ['c2', ['10.1.2.255']],
      ['c3', ['10.1.3.0']],
      ['c4', ['10.1.3.1']],
      ['c5', 'failed to allocate for range 0: no IP addresses available in range set: 10.1.2.254-10.1.3.1'],
    ],
  },
  {
    name: 'dual stack: one address per family, round robin per set',
    ranges: [[{ subnet: '10.1.0.0/24' }], [{ subnet: 'fd00::/120' }]],
    last: { 1: 'fd00::ff' },
    adds: [
      ['c1', ['10.1.0.2', 'fd00::2']],
      ['c2', ['10.1.0.3', 'fd00::3']],
    ],
  },
  {
    name: 'IPv6 /120 edges: last address is allocatable',
    ranges: [[{ subnet: 'fd00::/120', rangeStart: 'fd00::fe' }]],
    adds: [
      ['c1', ['fd00::fe']],
      ['c2', ['fd00::ff']],
      ['c3', 'failed to allocate for range 0: no IP addresses available in range set: fd00::fe-fd00::ff'],
    ],
  },
  {
    name: 'gateway at the range end is skipped',
    ranges: [[{ subnet: '10.9.0.0/29', gateway: '10.9.0.6' }]],
    last: { 0: '10.9.0.5' },
    adds: [
      ['c1', ['10.9.0.1']],
      ['c2', ['10.9.0.2']],
    ],
  },
];

describe('allocate: round robin sequences', () => {
  for (const c of sequences) {
    it(c.name, async () => {
      const store = await lockedStore();
      for (const [k, v] of Object.entries(c.seed ?? {})) store.seed(k, v);
      for (const [k, v] of Object.entries(c.last ?? {})) store.setLastReserved(Number(k), v);
      const rs = sets(c.ranges);
      const got: [string, string[] | string][] = [];
      for (const [id] of c.adds) got.push([id, await add(store, rs, id)]);
      assert.deepEqual(got, c.adds);
    });
  }
});

describe('allocate: exhaustion and rollback', () => {
  it('exhaustion is a RangeExhaustedError with machine-readable fields', async () => {
    const store = await lockedStore();
    const rs = sets(SLASH29);
    for (let i = 1; i <= 5; i++) await add(store, rs, `c${i}`);
    await assert.rejects(allocate(store, { containerId: 'c6', ifname: 'eth0', rangeSets: rs, requestedIPs: [] }), (e) => {
      assert.ok(e instanceof RangeExhaustedError);
      assert.equal(e.code, 'IPAM_RANGE_EXHAUSTED');
      assert.equal(e.cniCode, 999);
      assert.equal(e.rangeSetIndex, 0);
      assert.equal(e.rangeSet, '10.244.1.1-10.244.1.6');
      assert.equal(e.size, 5n);
      assert.equal(e.reserved, 5);
      assert.equal(e.details, 'range set 0 has 5 allocatable addresses and 5 reservations');
      return true;
    });
  });

  it('BR-16 A: the failed ADD leaves nothing (10.10.10.22 released again), last_reserved kept', async () => {
    const store = await lockedStore();
    const rs = sets(BR16_A);
    await add(store, rs, 'c1');
    await add(store, rs, 'c2');
    await assert.rejects(allocate(store, { containerId: 'c3', ifname: 'eth0', rangeSets: rs, requestedIPs: [] }), (e) => {
      assert.ok(e instanceof RangeExhaustedError);
      assert.equal(e.rangeSetIndex, 1);
      return true;
    });
    assert.deepEqual(store.snapshot(), {
      reservations: {
        '10.10.10.20': 'c1|eth0',
        '10.10.10.21': 'c2|eth0',
        '10.20.20.20': 'c1|eth0',
        '10.20.20.21': 'c2|eth0',
      },
      lastReserved: { 0: '10.10.10.22', 1: '10.20.20.21' },
    });
  });

  it('rollback keeps a pre-existing reservation of the same container', async () => {
    const store = await lockedStore();
    store.seed('10.10.10.20', 'c1|eth0').seed('10.20.20.20', 'x|eth0').seed('10.20.20.21', 'y|eth0');
    assert.equal(
      await add(store, sets(BR16_A), 'c1'),
      'failed to allocate for range 1: no IP addresses available in range set: 10.20.20.20-10.20.20.21',
    );
    assert.equal(store.snapshot().reservations['10.10.10.20'], 'c1|eth0');
  });

  it('an I/O error in a later set rolls back and keeps the store code', async () => {
    const store = await lockedStore({ onReserve: (a) => (a.startsWith('fd00') ? 'io' : undefined) });
    const rs = sets([[{ subnet: '10.1.0.0/24' }], [{ subnet: 'fd00::/120' }]]);
    await assert.rejects(allocate(store, { containerId: 'c1', ifname: 'eth0', rangeSets: rs, requestedIPs: [] }), {
      code: 'STORE_IO',
      message: 'failed to allocate for range 1: failed to reserve fd00::2: injected I/O error',
    });
    assert.deepEqual(store.snapshot().reservations, {});
  });

  it('leftover requested IPs fail the ADD and roll back every set', async () => {
    const store = await lockedStore();
    const rs = sets([[{ subnet: '10.1.0.0/24' }], [{ subnet: 'fd00::/120' }]]);
    assert.equal(
      await add(store, rs, 'c1', 'eth0', ['10.1.0.20', '10.3.0.1', '10.1.0.21']),
      'failed to allocate all requested IPs: 10.3.0.1 10.1.0.21',
    );
    assert.deepEqual(store.snapshot().reservations, {});
  });

  it('a reservation that fails to roll back is reported in details', async () => {
    const store = await lockedStore();
    const rs = sets(BR16_A);
    store.seed('10.20.20.20', 'x|eth0').seed('10.20.20.21', 'y|eth0');
    const release = store.release.bind(store);
    store.release = async () => {
      throw new AppError('STORE_IO', 'disk gone');
    };
    await assert.rejects(allocate(store, { containerId: 'c1', ifname: 'eth0', rangeSets: rs, requestedIPs: [] }), (e) => {
      assert.ok(e instanceof RangeExhaustedError);
      assert.equal(
        e.details,
        'range set 1 has 2 allocatable addresses and 2 reservations; rollback could not release 10.10.10.20: disk gone',
      );
      return true;
    });
    store.release = release;
  });
});

describe('allocate: static requests', () => {
  const R24 = [[{ subnet: '10.1.0.0/24' }]];
  const cases: [string, unknown, Record<string, string>, string[], string[] | string][] = [
    ['requested IP is used and recorded as last reserved', R24, {}, ['10.1.0.7'], ['10.1.0.7']],
    ['requested gateway', R24, {}, ['10.1.0.1'], "failed to allocate for range 0: requested ip 10.1.0.1 is subnet's gateway"],
    [
      'requested IP taken by another container',
      R24,
      { '10.1.0.2': 'other|eth0' },
      ['10.1.0.2'],
      'failed to allocate for range 0: requested IP address 10.1.0.2 is not available in range set 10.1.0.1-10.1.0.254',
    ],
    ['requested IP in no range set', R24, {}, ['10.3.0.1'], 'failed to allocate all requested IPs: 10.3.0.1'],
    [
      'requested IP in the subnet but outside rangeStart..rangeEnd',
      [[{ subnet: '10.1.0.0/24', rangeStart: '10.1.0.5' }]],
      {},
      ['10.1.0.3'],
      'failed to allocate all requested IPs: 10.1.0.3',
    ],
    ['two requests for one set: the second is left over', R24, {}, ['10.1.0.20', '10.1.0.21'], 'failed to allocate all requested IPs: 10.1.0.21'],
    [
      'one request per family in dual stack',
      [[{ subnet: '10.1.0.0/24' }], [{ subnet: 'fd00::/64' }]],
      {},
      ['fd00::9', '10.1.0.9'],
      ['10.1.0.9', 'fd00::9'],
    ],
    [
      'request for one set, round robin for the other',
      [[{ subnet: '10.1.0.0/24' }], [{ subnet: 'fd00::/64' }]],
      {},
      ['fd00::9'],
      ['10.1.0.2', 'fd00::9'],
    ],
    ['requested IP already held by this container: returned (idempotent)', R24, { '10.1.0.7': 'c1|eth0' }, ['10.1.0.7'], ['10.1.0.7']],
    [
      'requested IP differs from the one this container holds in the set',
      R24,
      { '10.1.0.2': 'c1|eth0' },
      ['10.1.0.7'],
      'failed to allocate for range 0: 10.1.0.2 has been allocated to c1, duplicate allocation is not allowed',
    ],
    [
      'requested IP on a corrupt record: not available, as in host-local (issue 7)',
      R24,
      {},
      ['10.1.0.5'],
      'failed to allocate for range 0: requested IP address 10.1.0.5 is not available in range set 10.1.0.1-10.1.0.254',
    ],
  ];
  for (const [name, ranges, seed, requested, want] of cases) {
    it(name, async () => {
      const store = await lockedStore();
      for (const [k, v] of Object.entries(seed)) store.seed(k, v);
      if (name.includes('corrupt')) store.seed('10.1.0.5', null);
      assert.deepEqual(await add(store, sets(ranges), 'c1', 'eth0', requested), want);
      if (Array.isArray(want) && name.startsWith('requested IP is used')) {
        assert.deepEqual(store.snapshot().lastReserved, { 0: '10.1.0.7' });
      }
    });
  }
  it('error codes', async () => {
    const store = await lockedStore();
    store.seed('10.1.0.2', 'c1|eth0');
    const rs = sets(R24);
    const req = (a: string) => allocate(store, { containerId: 'c1', ifname: 'eth0', rangeSets: rs, requestedIPs: [ip(a)] });
    await assert.rejects(req('10.1.0.1'), { code: 'IPAM_REQUESTED_IP_UNAVAILABLE' });
    await assert.rejects(req('10.1.0.9'), { code: 'IPAM_DUPLICATE_ALLOCATION' });
    await assert.rejects(req('10.9.0.9'), { code: 'IPAM_REQUESTED_IP_UNAVAILABLE' });
  });
});

describe('allocate: idempotent re-ADD (deliberate difference from host-local)', () => {
  it('BR-08 a-d on a /24 with a legacy record', async () => {
    const store = await lockedStore();
    store.seed('10.4.0.2', 'default-c1|eth0').seed('10.4.0.4', 'default-c9').setLastReserved(0, '10.4.0.2');
    const rs = sets([[{ subnet: '10.4.0.0/24' }]]);
    const a = await allocate(store, { containerId: 'default-c1', ifname: 'eth0', rangeSets: rs, requestedIPs: [] });
    assert.deepEqual(
      a.map((x) => [formatIP(x.ip), x.existing]),
      [['10.4.0.2', true]],
    );
    assert.deepEqual(await add(store, rs, 'default-c1', 'eth1'), ['10.4.0.3']); // b
    const c = await allocate(store, { containerId: 'default-c9', ifname: 'eth0', rangeSets: rs, requestedIPs: [] });
    assert.deepEqual(
      c.map((x) => [formatIP(x.ip), x.existing]),
      [['10.4.0.4', true]],
    ); // legacy record matches by ID alone
    assert.deepEqual(await store.releaseByOwner('default-c1', 'eth0'), ['10.4.0.2']); // d: DEL
    assert.deepEqual(await add(store, rs, 'default-c1', 'eth0'), ['10.4.0.5']);
    assert.deepEqual(store.snapshot().reservations, {
      '10.4.0.3': 'default-c1|eth1',
      '10.4.0.4': 'default-c9|eth0', // the legacy record was claimed for eth0 by the re-ADD (c)
      '10.4.0.5': 'default-c1|eth0',
    });
  });

  it('a legacy ID-only record is claimed by one interface only: the second gets its own address', async () => {
    const store = await lockedStore();
    store.seed('10.4.0.4', 'c9').setLastReserved(0, '10.4.0.3');
    const rs = sets([[{ subnet: '10.4.0.0/24' }]]);
    assert.deepEqual(await add(store, rs, 'c9', 'eth0'), ['10.4.0.4']);
    assert.deepEqual(await add(store, rs, 'c9', 'eth1'), ['10.4.0.5']);
    assert.deepEqual(await store.releaseByOwner('c9', 'eth1'), ['10.4.0.5']);
    assert.deepEqual(store.snapshot().reservations, { '10.4.0.4': 'c9|eth0' }, 'DEL of eth1 leaves eth0 its address');
  });

  it('BR-09: repeated ADDs never create a second reservation', async () => {
    const store = await lockedStore();
    const rs = sets([[{ subnet: '10.22.0.0/29' }]]);
    for (let i = 0; i < 4; i++) assert.deepEqual(await add(store, rs, 'c1'), ['10.22.0.2']);
    assert.equal(store.calls.reserve, 1);
    assert.deepEqual(store.snapshot().reservations, { '10.22.0.2': 'c1|eth0' });
  });

  it('an exact (id, ifname) record is preferred over a legacy one; per set', async () => {
    const store = await lockedStore();
    store.seed('10.1.0.5', 'c1').seed('10.1.0.7', 'c1|eth0');
    const rs = sets([[{ subnet: '10.1.0.0/24' }], [{ subnet: 'fd00::/64' }]]);
    const got = await allocate(store, { containerId: 'c1', ifname: 'eth0', rangeSets: rs, requestedIPs: [] });
    assert.deepEqual(
      got.map((x) => [x.rangeSetIndex, formatIP(x.ip), x.existing, formatIP(x.range.gateway)]),
      [
        [0, '10.1.0.7', true, '10.1.0.1'],
        [1, 'fd00::2', false, 'fd00::1'],
      ],
    );
  });

  it('another interface or another container does not match', async () => {
    const store = await lockedStore();
    store.seed('10.1.0.2', 'c1|eth1').seed('10.1.0.3', 'c10|eth0');
    assert.deepEqual(await add(store, sets([[{ subnet: '10.1.0.0/24' }]]), 'c1', 'eth0'), ['10.1.0.4']);
  });
});

describe('allocate: store interaction', () => {
  let store: MemoryStore;
  beforeEach(async () => {
    store = await lockedStore();
  });

  it('one list() per ADD, one lastReservedIP() per set, no lock taken by the allocator', async () => {
    store.resetCalls();
    await add(store, sets([[{ subnet: '10.1.0.0/24' }], [{ subnet: 'fd00::/64' }]]), 'c1');
    assert.deepEqual(
      { list: store.calls.list, last: store.calls.lastReservedIP, reserve: store.calls.reserve, lock: store.calls.lock },
      { list: 1, last: 2, reserve: 2, lock: 0 },
    );
  });

  it('reserve() returning false (a writer we did not see) moves on to the next address', async () => {
    const racing = await lockedStore({ onReserve: (a) => (a === '10.1.0.2' ? 'taken' : undefined) });
    assert.deepEqual(await add(racing, sets([[{ subnet: '10.1.0.0/24' }]]), 'c1'), ['10.1.0.3']);
    assert.equal(racing.snapshot().reservations['10.1.0.2'], 'racer|eth0');
  });

  it('a corrupt record blocks its address as in host-local (only the evidence rules may free it: issue 7)', async () => {
    store.seed('10.1.0.2', null).setLastReserved(0, '10.1.0.1');
    assert.deepEqual(await add(store, sets([[{ subnet: '10.1.0.0/24' }]]), 'c1'), ['10.1.0.3']);
    assert.equal(store.calls.release, 0);
    assert.deepEqual(store.snapshot().reservations, { '10.1.0.2': null, '10.1.0.3': 'c1|eth0' });
  });

  it('a corrupt record never counts as the container own reservation', async () => {
    store.seed('10.1.0.9', null);
    assert.deepEqual(await add(store, sets([[{ subnet: '10.1.0.0/24' }]]), 'c1'), ['10.1.0.2']);
  });

  it('BR-24 D: IPv6 /64 with 1,000 reservations: work bounded by reservations, not by the /64', async () => {
    const rs = sets([[{ subnet: 'fd00:20::/64' }]]);
    for (let i = 2; i < 1002; i++) store.seed(formatIP({ family: 6, value: ip('fd00:20::').value + BigInt(i) }), `p${i}|eth0`);
    // No last_reserved_ip: the walk starts at ::1 (gateway) and passes the 1,000 taken addresses in memory.
    store.resetCalls();
    assert.deepEqual(await add(store, rs, 'new1'), ['fd00:20::3ea']);
    assert.deepEqual(
      { list: store.calls.list, last: store.calls.lastReservedIP, reserve: store.calls.reserve },
      { list: 1, last: 1, reserve: 1 },
    );
    // With last_reserved_ip at the top of the /64: wraps to the start and passes them again.
    store.setLastReserved(0, 'fd00:20::ffff:ffff:ffff:fffe');
    store.resetCalls();
    assert.deepEqual(await add(store, rs, 'new2'), ['fd00:20::ffff:ffff:ffff:ffff']);
    assert.deepEqual(await add(store, rs, 'new3'), ['fd00:20::3eb']);
    assert.equal(store.calls.reserve, 2);
  });

  it('requires the caller to hold the lock (MemoryStore enforces the Store contract)', async () => {
    const unlocked = new MemoryStore('n');
    await assert.rejects(
      allocate(unlocked, { containerId: 'c1', ifname: 'eth0', rangeSets: sets(SLASH29), requestedIPs: [] }),
      { code: 'INTERNAL', message: 'store method called without holding the lock' },
    );
  });

  it('a closed store fails with CLOSED', async () => {
    await store.close();
    await store.close(); // idempotent
    await assert.rejects(
      allocate(store, { containerId: 'c1', ifname: 'eth0', rangeSets: sets(SLASH29), requestedIPs: [] }),
      { code: 'CLOSED', message: 'memory store "n" is closed' },
    );
  });
});

describe('MemoryStore semantics', () => {
  it('reserve / release / releaseByOwner with legacy fallback', async () => {
    const s = await lockedStore({ now: () => 42 });
    assert.equal(await s.reserve('10.0.0.2', { containerId: ' c1 ', ifname: 'eth0' }, 3), true);
    assert.equal(await s.reserve('10.0.0.2', { containerId: 'c2', ifname: 'eth0' }, 3), false);
    assert.equal(await s.lastReservedIP(3), '10.0.0.2');
    assert.equal(await s.lastReservedIP(0), null);
    assert.deepEqual(await s.list(), [{ ip: '10.0.0.2', owner: { containerId: 'c1', ifname: 'eth0' }, mtimeMs: 42 }]);
    assert.equal(await s.release('10.0.0.2', { containerId: 'c1', ifname: 'eth1' }), false);
    assert.equal(await s.release('10.0.0.2', { containerId: 'c1', ifname: 'eth0' }), true);
    assert.equal(await s.release('10.0.0.2', { containerId: 'c1', ifname: 'eth0' }), false);
    s.seed('10.0.0.3', 'c3').seed('10.0.0.4', 'c3|eth0').seed('10.0.0.5', 'c3').seed('10.0.0.6', null);
    assert.deepEqual(await s.releaseByOwner('c3', 'eth0'), ['10.0.0.4']); // exact first
    assert.deepEqual(await s.releaseByOwner('c3', 'eth0'), ['10.0.0.3', '10.0.0.5']); // then legacy
    assert.deepEqual(await s.releaseByOwner('c3', 'eth0'), []);
    assert.equal(await s.release('10.0.0.6', { containerId: 'c3', ifname: null }), false);
    assert.equal(await s.release('10.0.0.6', null), true);
    await assert.rejects(s.reserve('10.0.0.010', { containerId: 'c', ifname: 'e' }, 0), { code: 'INTERNAL' });
    await assert.rejects(s.reserve('FD00::1', { containerId: 'c', ifname: 'e' }, 0), { code: 'INTERNAL' });
    assert.equal(await s.writable(), true);
    await s.unlock();
    assert.equal(s.locked, false);
    await s.close();
    await assert.rejects(s.lock(1), { code: 'CLOSED' });
  });
});
