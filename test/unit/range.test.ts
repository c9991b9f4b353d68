import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { formatIP, parseCIDR, parseIP } from '../../src/common/ip.ts';
import { RangeSetIterator } from '../../src/ipam/iterator.ts';
import type { RawRange } from '../../src/ipam/range.ts';
import {
  canonicalizeRange,
  canonicalizeRangeSet,
  rangeContains,
  rangeFor,
  rangeSetContains,
  rangeSetOverlaps,
  rangeSetSize,
  rangeSetString,
  rangeString,
} from '../../src/ipam/range.ts';
import type { IP, RangeSet } from '../../src/ipam/types.ts';

interface Spec {
  subnet?: string;
  rangeStart?: string;
  rangeEnd?: string;
  gateway?: string;
}

function raw(s: Spec): RawRange {
  const ip = (t: string | undefined): IP | null => (t === undefined ? null : (parseIP(t) as IP));
  return {
    subnet: s.subnet === undefined ? null : parseCIDR(s.subnet),
    rangeStart: ip(s.rangeStart),
    rangeEnd: ip(s.rangeEnd),
    gateway: ip(s.gateway),
  };
}

const set = (...specs: Spec[]): RangeSet => canonicalizeRangeSet(specs.map(raw));
const ip = (s: string): IP => parseIP(s) as IP;

function errorOf(fn: () => unknown): string {
  try {
    fn();
  } catch (e) {
    assert.equal((e as { code?: string }).code, 'IPAM_INVALID_CONFIG');
    return (e as Error).message;
  }
  throw new Error('expected an error');
}

describe('canonicalizeRange: defaults (host-local Range.Canonicalize)', () => {
  // [spec, rangeStart-rangeEnd, gateway]
  const cases: [Spec, string, string][] = [
    [{ subnet: '10.1.0.0/24' }, '10.1.0.1-10.1.0.254', '10.1.0.1'],
    [{ subnet: '10.1.0.0/30' }, '10.1.0.1-10.1.0.2', '10.1.0.1'], // /30: only .2 allocatable
    [{ subnet: '10.244.1.0/29' }, '10.244.1.1-10.244.1.6', '10.244.1.1'],
    [{ subnet: 'fd00:20::/64' }, 'fd00:20::1-fd00:20::ffff:ffff:ffff:ffff', 'fd00:20::1'],
    [{ subnet: 'fd00::/120' }, 'fd00::1-fd00::ff', 'fd00::1'],
    [{ subnet: 'fd00::/126' }, 'fd00::1-fd00::3', 'fd00::1'],
    [{ subnet: '10.1.0.0/16', rangeStart: '10.1.2.254', rangeEnd: '10.1.3.1' }, '10.1.2.254-10.1.3.1', '10.1.0.1'],
    [{ subnet: '10.1.0.0/24', gateway: '10.1.0.254' }, '10.1.0.1-10.1.0.254', '10.1.0.254'],
    // edges host-local 1.1.1 accepts: network address as start, broadcast as end
    [{ subnet: '10.8.0.0/30', rangeStart: '10.8.0.0', rangeEnd: '10.8.0.3' }, '10.8.0.0-10.8.0.3', '10.8.0.1'],
    [{ subnet: '10.1.0.0/24', rangeStart: '10.1.0.5', rangeEnd: '10.1.0.5' }, '10.1.0.5-10.1.0.5', '10.1.0.1'],
    // gateway outside the subnet (even another family) is accepted, as by host-local 1.1.1
    [{ subnet: '10.5.0.0/24', gateway: '10.9.0.1' }, '10.5.0.1-10.5.0.254', '10.9.0.1'],
    [{ subnet: '10.5.0.0/24', gateway: 'fd00::1' }, '10.5.0.1-10.5.0.254', 'fd00::1'],
    // mapped IPv4 written in IPv6 form for start: canonicalised to IPv4
    [{ subnet: '10.6.0.0/24', rangeStart: '::ffff:10.6.0.10' }, '10.6.0.10-10.6.0.254', '10.6.0.1'],
  ];
  for (const [spec, want, gw] of cases) {
    it(`${JSON.stringify(spec)} → ${want} gw ${gw}`, () => {
      const r = canonicalizeRange(raw(spec));
      assert.equal(rangeString(r), want);
      assert.equal(formatIP(r.gateway), gw);
    });
  }
});

describe('canonicalizeRange: errors (exact host-local text)', () => {
  const cases: [Spec, string][] = [
    [{}, 'IP <nil> not v4 nor v6'],
    [{ subnet: '10.1.0.0/31' }, 'Network 10.1.0.0/31 too small to allocate from'],
    [{ subnet: '10.1.0.0/32' }, 'Network 10.1.0.0/32 too small to allocate from'],
    [{ subnet: '10.1.0.5/31' }, 'Network 10.1.0.5/31 too small to allocate from'], // as written
    [{ subnet: 'fd00::/127' }, 'Network fd00::/127 too small to allocate from'],
    [{ subnet: 'fd00::/128' }, 'Network fd00::/128 too small to allocate from'],
    [{ subnet: '::ffff:10.1.0.0/112' }, 'IPNet IP and Mask version mismatch'],
    [{ subnet: '::ffff:10.1.0.0/127' }, 'Network 10.1.0.0/127 too small to allocate from'],
    [
      { subnet: '10.1.0.5/24' },
      'Network has host bits set. For a subnet mask of length 24 the network address is 10.1.0.0',
    ],
    [
      { subnet: 'fd00::5/64' },
      'Network has host bits set. For a subnet mask of length 64 the network address is fd00::',
    ],
    [{ subnet: '10.1.0.0/24', rangeStart: '10.1.1.5' }, 'RangeStart 10.1.1.5 not in network 10.1.0.0/24'],
    [{ subnet: '10.5.0.0/24', rangeStart: 'fd00::1' }, 'RangeStart fd00::1 not in network 10.5.0.0/24'],
    [{ subnet: '10.1.0.0/24', rangeEnd: '10.1.1.5' }, 'RangeEnd 10.1.1.5 not in network 10.1.0.0/24'],
    [{ subnet: 'fd00::/120', rangeEnd: 'fd00::1:0' }, 'RangeEnd fd00::1:0 not in network fd00::/120'],
    // start > end: deliberate difference with 1.1.1 (see range.ts)
    [
      { subnet: '10.1.0.0/16', rangeStart: '10.1.3.0', rangeEnd: '10.1.2.0' },
      'RangeStart 10.1.3.0 is after RangeEnd 10.1.2.0',
    ],
    [{ subnet: '10.1.0.0/24', rangeStart: '10.1.0.255' }, 'RangeStart 10.1.0.255 is after RangeEnd 10.1.0.254'],
    [{ subnet: '10.1.0.0/24', rangeEnd: '10.1.0.0' }, 'RangeStart 10.1.0.1 is after RangeEnd 10.1.0.0'],
  ];
  for (const [spec, msg] of cases) {
    it(`${JSON.stringify(spec)} → ${msg}`, () => {
      assert.equal(
        errorOf(() => canonicalizeRange(raw(spec))),
        msg,
      );
    });
  }
});

describe('canonicalizeRangeSet', () => {
  const cases: [Spec[], string][] = [
    [[], 'empty range set'],
    [[{ subnet: '10.1.0.0/24' }, { subnet: 'fd00::/64' }], 'mixed address families'],
    [
      [{ subnet: '10.1.0.0/24' }, { subnet: '10.1.0.0/16' }],
      'subnets 10.1.0.1-10.1.0.254 and 10.1.0.1-10.1.255.254 overlap',
    ],
    [[{ subnet: '10.1.0.0/24' }, { subnet: '10.1.0.0/31' }], 'Network 10.1.0.0/31 too small to allocate from'],
  ];
  for (const [specs, msg] of cases) {
    it(`${JSON.stringify(specs)} → ${msg}`, () => {
      assert.equal(
        errorOf(() => set(...specs)),
        msg,
      );
    });
  }
  it('ranges of one subnet that do not overlap are fine', () => {
    const rs = set(
      { subnet: '10.1.0.0/24', rangeStart: '10.1.0.10', rangeEnd: '10.1.0.19' },
      { subnet: '10.1.0.0/24', rangeStart: '10.1.0.20', rangeEnd: '10.1.0.29' },
    );
    assert.equal(rangeSetString(rs), '10.1.0.10-10.1.0.19,10.1.0.20-10.1.0.29');
  });
});

describe('range set queries', () => {
  const brB = set(
    { subnet: '10.10.10.0/24', rangeStart: '10.10.10.20', rangeEnd: '10.10.10.22' },
    { subnet: '10.20.20.0/24', rangeStart: '10.20.20.20', rangeEnd: '10.20.20.21' },
  );
  it('rangeSetString is start-end joined by ","', () => {
    assert.equal(rangeSetString(brB), '10.10.10.20-10.10.10.22,10.20.20.20-10.20.20.21');
    assert.equal(rangeSetString(set({ subnet: '100.96.9.0/24' })), '100.96.9.1-100.96.9.254');
  });
  const forCases: [string, number][] = [
    ['10.10.10.19', -1],
    ['10.10.10.20', 0],
    ['10.10.10.22', 0],
    ['10.10.10.23', -1],
    ['10.20.20.21', 1],
    ['fd00::1', -1],
  ];
  for (const [a, want] of forCases) {
    it(`rangeFor(${a}) = ${want}`, () => {
      assert.equal(rangeFor(brB, ip(a)), want);
      assert.equal(rangeSetContains(brB, ip(a)), want >= 0);
    });
  }
  it('the gateway is contained (host-local Range.Contains)', () => {
    const r = canonicalizeRange(raw({ subnet: '10.1.0.0/24' }));
    assert.equal(rangeContains(r, ip('10.1.0.1')), true);
    assert.equal(rangeContains(r, ip('10.1.0.255')), false);
    assert.equal(rangeContains(r, ip('10.1.0.0')), false);
  });
  const sizeCases: [Spec[], bigint][] = [
    [[{ subnet: '10.1.0.0/30' }], 1n],
    [[{ subnet: '10.244.1.0/29' }], 5n],
    [[{ subnet: '10.1.0.0/24' }], 253n],
    [[{ subnet: '10.1.0.0/16', rangeStart: '10.1.2.254', rangeEnd: '10.1.3.1' }], 4n], // gateway .0.1 outside
    [[{ subnet: 'fd00:20::/64' }], (1n << 64n) - 2n], // ::0 excluded, gateway ::1 skipped
    [
      [
        { subnet: '10.10.10.0/24', rangeStart: '10.10.10.20', rangeEnd: '10.10.10.22' },
        { subnet: '10.20.20.0/24', rangeStart: '10.20.20.20', rangeEnd: '10.20.20.21' },
      ],
      5n,
    ],
    [[{ subnet: '10.9.0.0/29', gateway: '10.9.0.3', rangeStart: '10.9.0.3' }], 3n],
  ];
  for (const [specs, want] of sizeCases) {
    it(`rangeSetSize(${JSON.stringify(specs)}) = ${want}`, () => {
      assert.equal(rangeSetSize(set(...specs)), want);
    });
  }
  it('rangeSetOverlaps', () => {
    assert.equal(rangeSetOverlaps(set({ subnet: '10.10.10.0/24' }), set({ subnet: '10.10.10.0/24' })), true);
    assert.equal(rangeSetOverlaps(set({ subnet: '10.10.10.0/24' }), set({ subnet: '10.10.11.0/24' })), false);
    assert.equal(rangeSetOverlaps(set({ subnet: '10.10.10.0/24' }), set({ subnet: 'fd00::/64' })), false);
    assert.equal(
      rangeSetOverlaps(
        set({ subnet: '10.1.0.0/24', rangeStart: '10.1.0.10', rangeEnd: '10.1.0.19' }),
        set({ subnet: '10.1.0.0/24', rangeStart: '10.1.0.20' }),
      ),
      false,
    );
  });
});

/** Up to `max` candidates of the iterator, as text. */
function walk(rs: RangeSet, last: string | null, max = 100): string[] {
  const it = new RangeSetIterator(rs, last === null ? null : ip(last));
  const out: string[] = [];
  for (let c = it.next(); c !== null && out.length < max; c = it.next()) out.push(formatIP(c.ip));
  return out;
}

describe('RangeSetIterator (host-local GetIter/Next)', () => {
  const slash29 = set({ subnet: '10.244.1.0/29' });
  const two = set(
    { subnet: '10.10.10.0/24', rangeStart: '10.10.10.20', rangeEnd: '10.10.10.22' },
    { subnet: '10.20.20.0/24', rangeStart: '10.20.20.20', rangeEnd: '10.20.20.21' },
  );
  const cases: [string, RangeSet, string | null, string[]][] = [
    ['fresh /29 starts at rangeStart and skips the gateway', slash29, null, ['.2', '.3', '.4', '.5', '.6']],
    ['after .4 continues at .5 and wraps (skipping .1), last reserved last', slash29, '10.244.1.4', ['.5', '.6', '.2', '.3', '.4']],
    ['last = range end wraps to the start', slash29, '10.244.1.6', ['.2', '.3', '.4', '.5', '.6']],
    ['last = the gateway (in the range)', slash29, '10.244.1.1', ['.2', '.3', '.4', '.5', '.6']],
    ['last outside the set: start at rangeStart', slash29, '10.9.9.9', ['.2', '.3', '.4', '.5', '.6']],
    ['last of another family: start at rangeStart', slash29, 'fd00::1', ['.2', '.3', '.4', '.5', '.6']],
    ['/30 yields only .2', set({ subnet: '10.1.0.0/30' }), null, ['10.1.0.2']],
    ['/30 after .2 yields .2 again (last)', set({ subnet: '10.1.0.0/30' }), '10.1.0.2', ['10.1.0.2']],
  ];
  for (const [name, rs, last, want] of cases) {
    it(name, () => {
      const got = walk(rs, last).map((s) => (want[0]?.startsWith('.') ? s.slice(s.lastIndexOf('.')) : s));
      assert.deepEqual(got, want);
    });
  }
  it('multi-range: walks range 0 then range 1', () => {
    assert.deepEqual(walk(two, null), ['10.10.10.20', '10.10.10.21', '10.10.10.22', '10.20.20.20', '10.20.20.21']);
  });
  it('multi-range: last = end of range 0 continues in range 1 (no #594 loop)', () => {
    assert.deepEqual(walk(two, '10.10.10.22'), ['10.20.20.20', '10.20.20.21', '10.10.10.20', '10.10.10.21', '10.10.10.22']);
  });
  it('multi-range: last = end of the last range wraps to range 0', () => {
    assert.deepEqual(walk(two, '10.20.20.21'), ['10.10.10.20', '10.10.10.21', '10.10.10.22', '10.20.20.20', '10.20.20.21']);
  });
  it('multi-range: last in the middle of range 1', () => {
    assert.deepEqual(walk(two, '10.20.20.20'), ['10.20.20.21', '10.10.10.20', '10.10.10.21', '10.10.10.22', '10.20.20.20']);
  });
  it('start on a gateway: skipped at the start and the walk still ends', () => {
    const rs = set({ subnet: '10.9.0.0/29', gateway: '10.9.0.3', rangeStart: '10.9.0.3' });
    assert.deepEqual(walk(rs, null), ['10.9.0.4', '10.9.0.5', '10.9.0.6']);
    assert.deepEqual(walk(rs, '10.9.0.6'), ['10.9.0.4', '10.9.0.5', '10.9.0.6']);
    assert.deepEqual(walk(rs, '10.9.0.5'), ['10.9.0.6', '10.9.0.4', '10.9.0.5']);
  });
  it('first candidate after last is the gateway: skipped, walk ends after a full round', () => {
    const rs = set({ subnet: '10.9.0.0/29', gateway: '10.9.0.4' });
    assert.deepEqual(walk(rs, '10.9.0.3'), ['10.9.0.5', '10.9.0.6', '10.9.0.1', '10.9.0.2', '10.9.0.3']);
  });
  it('a range that is only its gateway yields nothing (single and multi-range)', () => {
    const only = set({ subnet: '10.9.0.0/29', rangeStart: '10.9.0.1', rangeEnd: '10.9.0.1' });
    assert.deepEqual(walk(only, null), []);
    assert.deepEqual(walk(only, '10.9.0.1'), []);
    const multi = set(
      { subnet: '10.9.0.0/29', rangeStart: '10.9.0.1', rangeEnd: '10.9.0.1' },
      { subnet: '10.9.1.0/29', rangeStart: '10.9.1.1', rangeEnd: '10.9.1.2' },
    );
    assert.deepEqual(walk(multi, null), ['10.9.1.2']);
    assert.deepEqual(walk(multi, '10.9.1.2'), ['10.9.1.2']);
  });
  it('BR-24 A: /16 range across an octet boundary', () => {
    const rs = set({ subnet: '10.1.0.0/16', rangeStart: '10.1.2.254', rangeEnd: '10.1.3.1' });
    assert.deepEqual(walk(rs, null), ['10.1.2.254', '10.1.2.255', '10.1.3.0', '10.1.3.1']);
  });
  it('IPv6 /64: the first candidates after the last reserved, no up-front cost', () => {
    const rs = set({ subnet: 'fd00:20::/64' });
    assert.deepEqual(walk(rs, null, 3), ['fd00:20::2', 'fd00:20::3', 'fd00:20::4']);
    assert.deepEqual(walk(rs, 'fd00:20::ffff:ffff:ffff:ffff', 2), ['fd00:20::2', 'fd00:20::3']);
    assert.deepEqual(walk(rs, 'fd00:20::ffff:ffff:ffff:fffe', 2), ['fd00:20::ffff:ffff:ffff:ffff', 'fd00:20::2']);
  });
  it('each address is offered exactly once in a full walk (/24, from 40 starting points)', () => {
    const rs = set({ subnet: '10.1.0.0/24', gateway: '10.1.0.100' });
    for (let k = 0; k < 256; k += 7) {
      const got = walk(rs, `10.1.0.${k}`, 1000);
      assert.equal(got.length, 253);
      assert.equal(new Set(got).size, 253);
      assert.ok(!got.includes('10.1.0.100'));
    }
  });
});
