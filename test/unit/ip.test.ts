import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import ipaddr from 'ipaddr.js';
import {
  compareIP,
  familyBits,
  formatIP,
  formatSubnet,
  ipAdd,
  ipEquals,
  lastAddress,
  maskIP,
  parseCIDR,
  parseIP,
  subnetContains,
} from '../../src/common/ip.ts';
import type { IP } from '../../src/ipam/types.ts';

const v4 = (s: string): IP => parseIP(s) as IP;

describe('parseIP / formatIP (Go net.ParseIP + String)', () => {
  // [input, canonical text or null, family]
  const cases: [string, string | null, 4 | 6 | null][] = [
    ['10.0.0.1', '10.0.0.1', 4],
    ['0.0.0.0', '0.0.0.0', 4],
    ['255.255.255.255', '255.255.255.255', 4],
    ['10.0.0.010', null, null], // leading zero (Go >= 1.17)
    ['10.0.0.256', null, null],
    ['10.0.0', null, null],
    ['10.0.0.1.', null, null],
    ['.10.0.0.1', null, null],
    ['10..0.1', null, null],
    ['0x0a.0.0.1', null, null],
    ['1', null, null],
    [' 10.0.0.1', null, null], // nothing trimmed
    ['10.0.0.1 ', null, null],
    ['', null, null],
    ['::', '::', 6],
    ['::1', '::1', 6],
    ['1::', '1::', 6],
    ['FD00::ABCD', 'fd00::abcd', 6],
    ['fd00:0020:0000:0000:0000:0000:0000:0001', 'fd00:20::1', 6],
    ['fd00:20::ffff:ffff:ffff:ffff', 'fd00:20::ffff:ffff:ffff:ffff', 6],
    ['1:0:0:1:0:0:0:1', '1:0:0:1::1', 6], // longest run wins
    ['2001:db8:0:0:1:0:0:1', '2001:db8::1:0:0:1', 6], // first of equal runs
    ['2001:db8:0:1:1:1:1:1', '2001:db8:0:1:1:1:1:1', 6], // a single zero group is not compressed
    ['1:2:3:4:5:6:7::', '1:2:3:4:5:6:7:0', 6],
    ['::ffff:1.2.3.4', '1.2.3.4', 4], // mapped → To4
    ['::ffff:102:304', '1.2.3.4', 4],
    ['::1.2.3.4', '::102:304', 6], // IPv4-compatible, stays IPv6 (ipaddr.js would map it)
    ['64:ff9b::192.0.2.33', '64:ff9b::c000:221', 6],
    ['1:2:3:4:5:6:1.2.3.4', '1:2:3:4:5:6:102:304', 6],
    ['1:2:3:4:5:6:7:1.2.3.4', null, null],
    ['::ffff:1.2.3.04', null, null],
    ['1::2::3', null, null],
    [':1', null, null],
    ['1:', null, null],
    ['1:::2', null, null],
    ['12345::', null, null],
    ['1:2:3:4:5:6:7:8:9', null, null],
    ['1:2:3:4:5:6:7:8::', null, null],
    ['::1:2:3:4:5:6:7:8', null, null],
    ['1:2:3:4:5:6:7', null, null],
    ['fe80::1%eth0', null, null],
    ['g::1', null, null],
    ['10.0.0.1/24', null, null],
  ];
  for (const [input, want, fam] of cases) {
    it(`${JSON.stringify(input)} → ${want ?? 'null'}`, () => {
      const ip = parseIP(input);
      if (want === null) {
        assert.equal(ip, null);
      } else {
        assert.ok(ip);
        assert.equal(ip.family, fam);
        assert.equal(formatIP(ip), want);
      }
    });
  }

  it('formats like ipaddr.js RFC 5952 on 2000 pseudo-random IPv6 addresses (oracle)', () => {
    let seed = 12345;
    const rnd = (): number => {
      seed = (seed * 1103515245 + 12345) % 2147483648;
      return seed;
    };
    for (let n = 0; n < 2000; n++) {
      let v = 0n;
      for (let g = 0; g < 8; g++) {
        const r = rnd() % 4;
        const group = r === 0 ? 0 : r === 1 ? rnd() % 16 : rnd() % 65536; // many zeros
        v = (v << 16n) | BigInt(group);
      }
      if (v >> 32n === 0xffffn) continue; // mapped: family 4 here
      const text = formatIP({ family: 6, value: v });
      const oracle = ipaddr.IPv6.parse(text);
      assert.equal(oracle.toRFC5952String(), text);
      assert.deepEqual(parseIP(text), { family: 6, value: v });
    }
  });
});

describe('parseCIDR (Go net.ParseCIDR)', () => {
  // [input, ip as written, network, prefix, maskBits] or null
  const cases: [string, [string, string, number, number] | null][] = [
    ['10.1.0.0/16', ['10.1.0.0', '10.1.0.0', 16, 32]],
    ['10.1.2.3/16', ['10.1.2.3', '10.1.0.0', 16, 32]],
    ['10.1.2.3/024', ['10.1.2.3', '10.1.2.0', 24, 32]], // leading zeros in the prefix are fine (dtoi)
    ['0.0.0.0/0', ['0.0.0.0', '0.0.0.0', 0, 32]],
    ['10.0.0.1/32', ['10.0.0.1', '10.0.0.1', 32, 32]],
    ['fd00:20::/64', ['fd00:20::', 'fd00:20::', 64, 128]],
    ['fd00::5/120', ['fd00::5', 'fd00::', 120, 128]],
    ['::ffff:10.1.0.0/112', ['10.1.0.0', '10.1.0.0', 112, 128]], // mask stays 128 bits: mismatch
    ['10.0.0.0/33', null],
    ['fd00::/129', null],
    ['10.0.0.0/', null],
    ['10.0.0.0/+8', null],
    ['10.0.0.0/8/8', null],
    ['10.0.0.0', null],
    ['/8', null],
    ['fe80::%eth0/64', null],
  ];
  for (const [input, want] of cases) {
    it(`${input} → ${want === null ? 'null' : want.join(' ')}`, () => {
      const c = parseCIDR(input);
      if (want === null) return assert.equal(c, null);
      assert.ok(c);
      assert.equal(formatIP(c.ip), want[0]);
      assert.equal(formatIP(c.subnet.ip), want[1]);
      assert.equal(c.subnet.prefix, want[2]);
      assert.equal(c.maskBits, want[3]);
    });
  }
});

describe('arithmetic and comparisons', () => {
  it('ipAdd steps and wraps like Go NextIP', () => {
    assert.equal(formatIP(ipAdd(v4('10.1.2.255'), 1n)), '10.1.3.0');
    assert.equal(formatIP(ipAdd(v4('10.1.3.0'), -1n)), '10.1.2.255');
    assert.equal(formatIP(ipAdd(v4('255.255.255.255'), 1n)), '0.0.0.0');
    assert.equal(formatIP(ipAdd(v4('0.0.0.0'), -1n)), '255.255.255.255');
    assert.equal(formatIP(ipAdd(v4('fd00::ffff'), 1n)), 'fd00::1:0');
    assert.equal(formatIP(ipAdd(v4('ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff'), 1n)), '::');
  });
  it('compareIP orders IPv4 before IPv6, then by value', () => {
    assert.equal(compareIP(v4('10.0.0.1'), v4('10.0.0.2')), -1);
    assert.equal(compareIP(v4('10.0.0.2'), v4('10.0.0.2')), 0);
    assert.equal(compareIP(v4('10.0.0.3'), v4('10.0.0.2')), 1);
    assert.equal(compareIP(v4('255.255.255.255'), v4('::')), -1);
    assert.equal(compareIP(v4('::1'), v4('0.0.0.0')), 1);
  });
  it('ipEquals compares family and value (mapped form equals dotted)', () => {
    assert.equal(ipEquals(v4('::ffff:10.0.0.1'), v4('10.0.0.1')), true);
    assert.equal(ipEquals(v4('::a00:1'), v4('10.0.0.1')), false);
  });
  it('subnetContains / lastAddress / maskIP / familyBits / formatSubnet', () => {
    const s = (parseCIDR('10.1.0.0/16') as NonNullable<ReturnType<typeof parseCIDR>>).subnet;
    assert.equal(subnetContains(s, v4('10.1.255.255')), true);
    assert.equal(subnetContains(s, v4('10.2.0.0')), false);
    assert.equal(subnetContains(s, v4('::a01:1')), false); // other family
    assert.equal(formatIP(lastAddress(s)), '10.1.255.255');
    const s6 = (parseCIDR('fd00:20::/64') as NonNullable<ReturnType<typeof parseCIDR>>).subnet;
    assert.equal(formatIP(lastAddress(s6)), 'fd00:20::ffff:ffff:ffff:ffff');
    assert.equal(formatIP(maskIP(v4('10.1.2.3'), 8)), '10.0.0.0');
    assert.equal(familyBits(4), 32);
    assert.equal(familyBits(6), 128);
    assert.equal(formatSubnet(s6), 'fd00:20::/64');
  });
});
