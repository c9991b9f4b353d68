import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  loadIPAMConfig,
  loadNetworkIdentity,
  validateContainerId,
  validateIfname,
  validateNetworkName,
} from '../../src/ipam/config.ts';
import { formatIP } from '../../src/common/ip.ts';
import { rangeSetString } from '../../src/ipam/range.ts';
import { parseResolvConf } from '../../src/ipam/dns.ts';
import type { IPAMConfig } from '../../src/ipam/types.ts';

type Json = Record<string, unknown>;

/** A network config with `ipam` fields merged over `{type: "ipwarden"}`. */
function conf(ipam: Json | null | undefined, top: Json = {}): string {
  const doc: Json = { cniVersion: '1.0.0', name: 'net1', ...top };
  if (ipam !== undefined) doc.ipam = ipam === null ? null : { type: 'ipwarden', ...ipam };
  return JSON.stringify(doc);
}

const sets = (c: IPAMConfig): string[] => c.rangeSets.map(rangeSetString);
const load = (stdin: string, args?: string): IPAMConfig => loadIPAMConfig(stdin, args);

describe('loadIPAMConfig: range sets, order and defaults', () => {
  const cases: [string, string, string[]][] = [
    ['one range set', conf({ ranges: [[{ subnet: '10.1.0.0/24' }]] }), ['10.1.0.1-10.1.0.254']],
    ['/30', conf({ ranges: [[{ subnet: '10.1.0.0/30' }]] }), ['10.1.0.1-10.1.0.2']],
    ['IPv6 /64 default end is the last address', conf({ ranges: [[{ subnet: 'fd00:20::/64' }]] }), ['fd00:20::1-fd00:20::ffff:ffff:ffff:ffff']],
    ['IPv6 /120', conf({ ranges: [[{ subnet: 'fd00::/120' }]] }), ['fd00::1-fd00::ff']],
    [
      'dual stack: two range sets',
      conf({ ranges: [[{ subnet: '10.1.0.0/24' }], [{ subnet: 'fd00::/64' }]] }),
      ['10.1.0.1-10.1.0.254', 'fd00::1-fd00::ffff:ffff:ffff:ffff'],
    ],
    [
      'runtimeConfig.ipRanges, then legacy subnet, then ranges',
      conf(
        { subnet: '10.2.0.0/24', ranges: [[{ subnet: '10.3.0.0/24' }]] },
        { runtimeConfig: { ipRanges: [[{ subnet: '10.1.0.0/24' }]] } },
      ),
      ['10.1.0.1-10.1.0.254', '10.2.0.1-10.2.0.254', '10.3.0.1-10.3.0.254'],
    ],
    [
      'legacy top-level range with bounds',
      conf({ subnet: '10.2.0.0/24', rangeStart: '10.2.0.10', rangeEnd: '10.2.0.20', gateway: '10.2.0.254' }),
      ['10.2.0.10-10.2.0.20'],
    ],
    ['legacy rangeStart without subnet is ignored', conf({ rangeStart: '10.9.0.5', ranges: [[{ subnet: '10.1.0.0/24' }]] }), ['10.1.0.1-10.1.0.254']],
    ['empty string IP fields are absent', conf({ ranges: [[{ subnet: '10.8.0.0/24', rangeStart: '', gateway: null }]] }), ['10.8.0.1-10.8.0.254']],
    ['keys match case-insensitively (Go encoding/json)', conf({ ranges: [[{ Subnet: '10.7.0.0/24', RANGESTART: '10.7.0.50' }]] }), ['10.7.0.50-10.7.0.254']],
    ['empty runtimeConfig.ipRanges is not prepended', conf({ ranges: [[{ subnet: '10.1.0.0/24' }]] }, { runtimeConfig: { ipRanges: [] } }), ['10.1.0.1-10.1.0.254']],
    [
      'BR-16 B: two ranges in one set',
      conf({
        ranges: [
          [
            { subnet: '10.10.10.0/24', rangeStart: '10.10.10.20', rangeEnd: '10.10.10.22' },
            { subnet: '10.20.20.0/24', rangeStart: '10.20.20.20', rangeEnd: '10.20.20.21' },
          ],
        ],
      }),
      ['10.10.10.20-10.10.10.22,10.20.20.20-10.20.20.21'],
    ],
    ['cniVersion 0.2.0 with one v4 and one v6 set', conf({ ranges: [[{ subnet: '10.1.0.0/24' }], [{ subnet: 'fd00::/120' }]] }, { cniVersion: '0.2.0' }), ['10.1.0.1-10.1.0.254', 'fd00::1-fd00::ff']],
  ];
  for (const [name, stdin, want] of cases) {
    it(name, () => assert.deepEqual(sets(load(stdin)), want));
  }

  it('defaults of every other field', () => {
    const c = load(conf({ ranges: [[{ subnet: '10.1.0.0/24' }]] }));
    assert.deepEqual(
      { ...c, rangeSets: undefined },
      {
        cniVersion: '1.0.0',
        name: 'net1',
        type: 'ipwarden',
        dataDir: '/var/lib/cni/networks',
        rangeSets: undefined,
        routes: [],
        resolvConf: null,
        requestedIPs: [],
        reclaimOnExhaustion: true,
        failStatusOnExhaustion: false,
        leakGracePeriodSeconds: 300,
        runtimeEndpoint: null,
        lockTimeoutSeconds: 30,
      },
    );
    assert.equal(formatIP(c.rangeSets[0]?.[0]?.gateway ?? { family: 4, value: 0n }), '10.1.0.1');
  });

  // host-local prints routes through Go's net.IPNet / net.IP (issue 8.7; the real binary agrees:
  // test/interop/differential.test.ts).
  const routeCases: Array<[string, Record<string, unknown>, Record<string, unknown>]> = [
    ['upper case, uncompressed IPv6', { dst: 'FD00:0::/8' }, { dst: 'fd00::/8' }],
    ['gw compressed', { dst: 'fd00::1/64', gw: 'FD00:0:0::0001' }, { dst: 'fd00::1/64', gw: 'fd00::1' }],
    ['host bits kept, zero-padded prefix', { dst: '10.1.0.5/024' }, { dst: '10.1.0.5/24' }],
    ['IPv4-mapped under an IPv6 prefix: the last 32 bits of the mask', { dst: '::ffff:10.1.0.0/104', gw: '::ffff:10.1.0.1' }, { dst: '10.1.0.0/8', gw: '10.1.0.1' }],
    ['IPv4-mapped under a prefix shorter than /96', { dst: '::ffff:10.1.0.0/80' }, { dst: '10.1.0.0/0' }],
    ['IPv4-compatible gw is IPv6', { dst: '1.2.3.4/32', gw: '::1.2.3.4' }, { dst: '1.2.3.4/32', gw: '::102:304' }],
    ['an empty gw is absent; extra keys kept', { dst: '::/0', gw: '', mtu: 1400 }, { dst: '::/0', mtu: 1400 }],
  ];
  for (const [name, route, want] of routeCases) {
    it(`route ${name}: ${JSON.stringify(route)} → ${JSON.stringify(want)}`, () => {
      assert.deepEqual(load(conf({ ranges: [[{ subnet: '10.1.0.0/24' }]], routes: [route] })).routes, [want]);
    });
  }

  it('cniVersion absent answers 0.1.0 (as host-local does)', () => {
    const stdin = JSON.stringify({ name: 'n', ipam: { type: 'x', ranges: [[{ subnet: '10.1.0.0/24' }]] } });
    assert.equal(load(stdin).cniVersion, '0.1.0');
  });

  it('ipwarden keys, routes, dataDir, resolvConf', () => {
    const c = load(
      conf({
        ranges: [[{ subnet: '10.1.0.0/24' }]],
        dataDir: '/run/cni/networks',
        resolvConf: '/etc/resolv.conf',
        routes: [{ dst: '0.0.0.0/0' }, { dst: '10.9.0.0/16', gw: '10.1.0.254', mtu: 1400 }],
        reclaimOnExhaustion: false,
        failStatusOnExhaustion: true,
        leakGracePeriod: '90s',
        runtimeEndpoint: 'unix:///run/containerd/containerd.sock',
        lockTimeout: '1.5s',
      }),
    );
    assert.equal(c.dataDir, '/run/cni/networks');
    assert.equal(c.resolvConf, '/etc/resolv.conf');
    assert.deepEqual(c.routes, [{ dst: '0.0.0.0/0' }, { dst: '10.9.0.0/16', gw: '10.1.0.254', mtu: 1400 }]);
    assert.equal(c.reclaimOnExhaustion, false);
    assert.equal(c.failStatusOnExhaustion, true);
    assert.equal(c.leakGracePeriodSeconds, 90);
    assert.equal(c.runtimeEndpoint, 'unix:///run/containerd/containerd.sock');
    assert.equal(c.lockTimeoutSeconds, 1.5);
  });

  it('accepts bytes', () => {
    const c = loadIPAMConfig(new TextEncoder().encode(conf({ ranges: [[{ subnet: '10.1.0.0/24' }]] })), undefined);
    assert.equal(c.name, 'net1');
  });
});

describe('loadIPAMConfig: requested IPs', () => {
  const base = { ranges: [[{ subnet: '10.1.0.0/24' }], [{ subnet: 'fd00::/64' }]] };
  const cases: [string, string, string | undefined, string[]][] = [
    ['CNI_ARGS IP with prefix', conf(base), 'IP=10.1.0.7/24', ['10.1.0.7']],
    ['args.cni.ips', conf(base, { args: { cni: { ips: ['10.1.0.9/24', 'fd00::9'] } } }), undefined, ['10.1.0.9', 'fd00::9']],
    ['runtimeConfig.ips', conf(base, { runtimeConfig: { ips: ['fd00::5/64'] } }), undefined, ['fd00::5']],
    [
      'union in order CNI_ARGS, args, runtimeConfig, deduplicated',
      conf(base, { runtimeConfig: { ips: ['10.1.0.9', 'fd00::3'] }, args: { cni: { ips: ['fd00::2', '10.1.0.9/24'] } } }),
      'IgnoreUnknown=1;IP=10.1.0.9;K8S_POD_NAME=p',
      ['10.1.0.9', 'fd00::2', 'fd00::3'],
    ],
    ['CNI_ARGS IP= is no request', conf(base), 'IP=', []],
  ];
  for (const [name, stdin, args, want] of cases) {
    it(name, () => assert.deepEqual(load(stdin, args).requestedIPs.map(formatIP), want));
  }
});

describe('loadIPAMConfig: errors', () => {
  const r24 = [[{ subnet: '10.1.0.0/24' }]];
  // [name, stdin, CNI_ARGS, code, message, details?]
  const cases: [string, string, string | undefined, string, string, string?][] = [
    ['not JSON', '{"name":', undefined, 'IPAM_DECODE', 'error unmarshall network config: not valid JSON'],
    ['empty stdin', '', undefined, 'IPAM_DECODE', 'error unmarshall network config: not valid JSON'],
    ['JSON array', '[]', undefined, 'IPAM_DECODE', 'error unmarshall network config: the network config must be a JSON object, got array'],
    ['missing ipam', conf(undefined), undefined, 'IPAM_INVALID_CONFIG', "IPAM config missing 'ipam' key"],
    ['null ipam', conf(null), undefined, 'IPAM_INVALID_CONFIG', "IPAM config missing 'ipam' key"],
    ['ipam not an object', JSON.stringify({ name: 'n', ipam: 5 }), undefined, 'IPAM_INVALID_CONFIG', 'ipam must be an object, got number'],
    ['no ranges at all (BR-16 D)', conf({ ranges: [] }), undefined, 'IPAM_INVALID_CONFIG', 'no IP ranges specified'],
    ['no ranges key', conf({}), undefined, 'IPAM_INVALID_CONFIG', 'no IP ranges specified'],
    [
      'flat ranges list (BR-16 C)',
      conf({ ranges: [{ subnet: '10.1.0.0/24' }, { subnet: '10.2.0.0/24' }] }),
      undefined,
      'IPAM_INVALID_CONFIG',
      'invalid range set 0: ipam.ranges[0] must be an array of ranges (ranges is a list of range sets), got object',
    ],
    ['ranges not an array', conf({ ranges: 'x' }), undefined, 'IPAM_INVALID_CONFIG', 'ipam.ranges must be an array, got string'],
    ['empty range set', conf({ ranges: [[]] }), undefined, 'IPAM_INVALID_CONFIG', 'invalid range set 0: empty range set'],
    ['/31 (BR-24 B)', conf({ ranges: [[{ subnet: '10.1.0.0/31' }]] }), undefined, 'IPAM_INVALID_CONFIG', 'invalid range set 0: Network 10.1.0.0/31 too small to allocate from'],
    ['/32', conf({ ranges: [[{ subnet: '10.1.0.0/32' }]] }), undefined, 'IPAM_INVALID_CONFIG', 'invalid range set 0: Network 10.1.0.0/32 too small to allocate from'],
    [
      'host bits set',
      conf({ ranges: [[{ subnet: '10.1.0.5/24' }]] }),
      undefined,
      'IPAM_INVALID_CONFIG',
      'invalid range set 0: Network has host bits set. For a subnet mask of length 24 the network address is 10.1.0.0',
    ],
    ['mask mismatch', conf({ ranges: [[{ subnet: '::ffff:10.1.0.0/112' }]] }), undefined, 'IPAM_INVALID_CONFIG', 'invalid range set 0: IPNet IP and Mask version mismatch'],
    ['missing subnet', conf({ ranges: [[{}]] }), undefined, 'IPAM_INVALID_CONFIG', 'invalid range set 0: IP <nil> not v4 nor v6'],
    ['null subnet', conf({ ranges: [[{ subnet: null }]] }), undefined, 'IPAM_INVALID_CONFIG', 'invalid CIDR address: ', 'at ipam.ranges[0][0].subnet'],
    ['bad subnet text', conf({ ranges: [[{ subnet: '10.1.0.0/33' }]] }), undefined, 'IPAM_INVALID_CONFIG', 'invalid CIDR address: 10.1.0.0/33', 'at ipam.ranges[0][0].subnet'],
    ['bad IP text (leading zero)', conf({ ranges: [[{ subnet: '10.6.0.0/24', rangeStart: '10.6.0.010' }]] }), undefined, 'IPAM_INVALID_CONFIG', 'invalid IP address: 10.6.0.010', 'at ipam.ranges[0][0].rangeStart'],
    ['IP of wrong JSON type', conf({ ranges: [[{ subnet: '10.5.0.0/24', rangeStart: 5 }]] }), undefined, 'IPAM_INVALID_CONFIG', 'invalid range set 0: ipam.ranges[0][0].rangeStart must be a string, got number'],
    ['range not an object', conf({ ranges: [[{ subnet: '10.5.0.0/24' }], ['x']] }), undefined, 'IPAM_INVALID_CONFIG', 'invalid range set 1: ipam.ranges[1][0] must be an object, got string'],
    ['rangeStart outside subnet (BR-24 C)', conf({ ranges: [[{ subnet: '10.1.0.0/24', rangeStart: '10.1.1.5' }]] }), undefined, 'IPAM_INVALID_CONFIG', 'invalid range set 0: RangeStart 10.1.1.5 not in network 10.1.0.0/24'],
    ['rangeEnd outside subnet', conf({ ranges: [[{ subnet: '10.1.0.0/24', rangeEnd: '10.2.0.5' }]] }), undefined, 'IPAM_INVALID_CONFIG', 'invalid range set 0: RangeEnd 10.2.0.5 not in network 10.1.0.0/24'],
    [
      'start > end (BR-24 C, deliberate message)',
      conf({ ranges: [[{ subnet: '10.1.0.0/16', rangeStart: '10.1.3.0', rangeEnd: '10.1.2.0' }]] }),
      undefined,
      'IPAM_INVALID_CONFIG',
      'invalid range set 0: RangeStart 10.1.3.0 is after RangeEnd 10.1.2.0',
    ],
    ['mixed families in a set', conf({ ranges: [[{ subnet: '10.1.0.0/24' }, { subnet: 'fd00::/64' }]] }), undefined, 'IPAM_INVALID_CONFIG', 'invalid range set 0: mixed address families'],
    [
      'overlapping ranges in a set',
      conf({ ranges: [[{ subnet: '10.1.0.0/24' }, { subnet: '10.1.0.0/16' }]] }),
      undefined,
      'IPAM_INVALID_CONFIG',
      'invalid range set 0: subnets 10.1.0.1-10.1.0.254 and 10.1.0.1-10.1.255.254 overlap',
    ],
    ['overlapping range sets (BR-16 E)', conf({ ranges: [[{ subnet: '10.10.10.0/24' }], [{ subnet: '10.10.10.0/24' }]] }), undefined, 'IPAM_INVALID_CONFIG', 'range set 0 overlaps with 1'],
    ['overlap found against set 2', conf({ ranges: [[{ subnet: '10.1.0.0/24' }], [{ subnet: 'fd00::/64' }], [{ subnet: '10.1.0.0/16' }]] }), undefined, 'IPAM_INVALID_CONFIG', 'range set 0 overlaps with 2'],
    [
      'legacy range overlaps ranges: combined indexes',
      conf({ subnet: '10.2.0.0/24', ranges: [[{ subnet: '10.3.0.0/24' }], [{ subnet: '10.2.0.0/16' }]] }),
      undefined,
      'IPAM_INVALID_CONFIG',
      'range set 0 overlaps with 2',
    ],
    [
      'error index counts the prepended sets',
      conf({ subnet: '10.2.0.0/24', ranges: [[{ subnet: '10.3.0.0/31' }]] }, { runtimeConfig: { ipRanges: [[{ subnet: '10.1.0.0/24' }]] } }),
      undefined,
      'IPAM_INVALID_CONFIG',
      'invalid range set 2: Network 10.3.0.0/31 too small to allocate from',
    ],
    [
      'two v4 sets need cniVersion >= 0.3.0',
      conf({ ranges: [[{ subnet: '10.1.0.0/24' }], [{ subnet: '10.2.0.0/24' }]] }, { cniVersion: '0.2.0' }),
      undefined,
      'IPAM_INVALID_CONFIG',
      'CNI version 0.2.0 does not support more than 1 address per family',
    ],
    [
      'two v4 sets without cniVersion (host-local prints the empty version)',
      JSON.stringify({ name: 'n', ipam: { ranges: [[{ subnet: '10.1.0.0/24' }], [{ subnet: '10.2.0.0/24' }]] } }),
      undefined,
      'IPAM_INVALID_CONFIG',
      'CNI version  does not support more than 1 address per family',
    ],
    ['CNI_ARGS unknown key', conf({ ranges: r24 }), 'FOO=1', 'IPAM_INVALID_ARGS', 'ARGS: unknown args ["FOO=1"]'],
    ['CNI_ARGS bad IP', conf({ ranges: r24 }), 'IP=10.1.0.300', 'IPAM_INVALID_ARGS', 'ARGS: error parsing value of pair "IP=10.1.0.300": invalid IP address 10.1.0.300'],
    ['args.cni.ips bad text', conf({ ranges: r24 }, { args: { cni: { ips: ['10.1.0.5/40'] } } }), undefined, 'IPAM_INVALID_CONFIG', 'invalid IP address 10.1.0.5/40', 'at args.cni.ips[0]'],
    ['args.cni.ips empty string', conf({ ranges: r24 }, { args: { cni: { ips: [''] } } }), undefined, 'IPAM_INVALID_CONFIG', 'cannot understand ip: IP <nil> not v4 nor v6', 'at args.cni.ips[0]'],
    ['runtimeConfig.ips null entry (host-local panics)', conf({ ranges: r24 }, { runtimeConfig: { ips: [null] } }), undefined, 'IPAM_INVALID_CONFIG', 'cannot understand ip: IP <nil> not v4 nor v6', 'at runtimeConfig.ips[0]'],
    ['runtimeConfig.ips zone', conf({ ranges: r24 }, { runtimeConfig: { ips: ['fe80::1%eth0'] } }), undefined, 'IPAM_INVALID_CONFIG', 'invalid IP address fe80::1%eth0', 'at runtimeConfig.ips[0]'],
    ['name missing', JSON.stringify({ cniVersion: '1.0.0', ipam: { ranges: r24 } }), undefined, 'IPAM_INVALID_CONFIG', 'missing network name:'],
    ['name with a slash', conf({ ranges: r24 }, { name: '../etc' }), undefined, 'IPAM_INVALID_CONFIG', 'invalid characters found in network name', '../etc'],
    ['name not a string', conf({ ranges: r24 }, { name: 7 }), undefined, 'IPAM_INVALID_CONFIG', 'name must be a string, got number'],
    ['cniVersion not a string', conf({ ranges: r24 }, { cniVersion: 1 }), undefined, 'IPAM_INVALID_CONFIG', 'cniVersion must be a string, got number'],
    ['relative dataDir', conf({ ranges: r24, dataDir: 'var/lib' }), undefined, 'IPAM_INVALID_CONFIG', 'ipam.dataDir must be an absolute path without NUL bytes, got "var/lib"'],
    ['dataDir with NUL', conf({ ranges: r24, dataDir: '/var/\u0000x' }), undefined, 'IPAM_INVALID_CONFIG', 'ipam.dataDir must be an absolute path without NUL bytes, got "/var/\\u0000x"'],
    ['dataDir not a string', conf({ ranges: r24, dataDir: ['/x'] }), undefined, 'IPAM_INVALID_CONFIG', 'ipam.dataDir must be a string, got array'],
    ['routes not an array', conf({ ranges: r24, routes: {} }), undefined, 'IPAM_INVALID_CONFIG', 'ipam.routes must be an array, got object'],
    ['route without dst', conf({ ranges: r24, routes: [{ gw: '10.1.0.1' }] }), undefined, 'IPAM_INVALID_CONFIG', 'ipam.routes[0].dst must be a string, got null'],
    ['route with bad dst', conf({ ranges: r24, routes: [{ dst: '10.0.0.0' }] }), undefined, 'IPAM_INVALID_CONFIG', 'invalid CIDR address: 10.0.0.0', 'at ipam.routes[0].dst'],
    ['route with bad gw', conf({ ranges: r24, routes: [{ dst: '0.0.0.0/0', gw: 'x' }] }), undefined, 'IPAM_INVALID_CONFIG', 'invalid IP address: x', 'at ipam.routes[0].gw'],
    ['reclaimOnExhaustion not a boolean', conf({ ranges: r24, reclaimOnExhaustion: 'yes' }), undefined, 'IPAM_INVALID_CONFIG', 'ipam.reclaimOnExhaustion must be a boolean, got string'],
    ['failStatusOnExhaustion not a boolean', conf({ ranges: r24, failStatusOnExhaustion: 1 }), undefined, 'IPAM_INVALID_CONFIG', 'ipam.failStatusOnExhaustion must be a boolean, got number'],
    ['leakGracePeriod bad', conf({ ranges: r24, leakGracePeriod: '5' }), undefined, 'IPAM_INVALID_CONFIG', 'ipam.leakGracePeriod: invalid duration "5"', 'time: missing unit in duration "5"'],
    ['leakGracePeriod number', conf({ ranges: r24, leakGracePeriod: 300 }), undefined, 'IPAM_INVALID_CONFIG', 'ipam.leakGracePeriod must be a string, got number'],
    ['lockTimeout negative', conf({ ranges: r24, lockTimeout: '-1s' }), undefined, 'IPAM_INVALID_CONFIG', 'ipam.lockTimeout must not be negative, got "-1s"'],
    ['runtimeEndpoint not a string', conf({ ranges: r24, runtimeEndpoint: true }), undefined, 'IPAM_INVALID_CONFIG', 'ipam.runtimeEndpoint must be a string, got boolean'],
    ['runtimeConfig not an object', conf({ ranges: r24 }, { runtimeConfig: [] }), undefined, 'IPAM_INVALID_CONFIG', 'runtimeConfig must be an object, got array'],
  ];
  for (const [name, stdin, args, code, message, details] of cases) {
    it(`${name} → ${message}`, () => {
      assert.throws(
        () => load(stdin, args),
        (e: unknown) => {
          const err = e as { code: string; message: string; details?: string };
          assert.equal(err.code, code);
          assert.equal(err.message, message);
          if (details !== undefined) assert.equal(err.details, details);
          return true;
        },
      );
    });
  }
});

describe('loadNetworkIdentity (DEL/GC/STATUS)', () => {
  it('ignores ranges that no longer parse', () => {
    const id = loadNetworkIdentity(conf({ ranges: [{ subnet: '10.1.0.0/31' }], dataDir: '/run/x', lockTimeout: '2s' }));
    assert.deepEqual(id, { cniVersion: '1.0.0', name: 'net1', dataDir: '/run/x', lockTimeoutSeconds: 2 });
  });
  it('defaults', () => {
    const id = loadNetworkIdentity(JSON.stringify({ name: 'n', ipam: {} }));
    assert.deepEqual(id, { cniVersion: '0.1.0', name: 'n', dataDir: '/var/lib/cni/networks', lockTimeoutSeconds: 30 });
  });
  const bad: [string, string, string][] = [
    ['{', 'IPAM_DECODE', 'error unmarshall network config: not valid JSON'],
    [conf(undefined), 'IPAM_INVALID_CONFIG', "IPAM config missing 'ipam' key"],
    [conf({}, { name: 'a b' }), 'IPAM_INVALID_CONFIG', 'invalid characters found in network name'],
    [conf({ dataDir: 'rel' }), 'IPAM_INVALID_CONFIG', 'ipam.dataDir must be an absolute path without NUL bytes, got "rel"'],
    [conf({ lockTimeout: 'soon' }), 'IPAM_INVALID_CONFIG', 'ipam.lockTimeout: invalid duration "soon"'],
  ];
  for (const [stdin, code, message] of bad) {
    it(`→ ${message}`, () => assert.throws(() => loadNetworkIdentity(stdin), { code, message }));
  }
});

describe('libcni validators', () => {
  const okIds = ['c1', 'a', 'A-b_c.d', 'default-' + 'f'.repeat(64)];
  for (const id of okIds) it(`container ID ${id} ok`, () => validateContainerId(id));
  const badIds: [string, string, string][] = [
    ['', 'IPAM_UNKNOWN_CONTAINER', 'missing containerID'],
    ['-c1', 'IPAM_INVALID_ENV', 'invalid characters in containerID'],
    ['c/1', 'IPAM_INVALID_ENV', 'invalid characters in containerID'],
    ['c1\n', 'IPAM_INVALID_ENV', 'invalid characters in containerID'],
    ['c 1', 'IPAM_INVALID_ENV', 'invalid characters in containerID'],
  ];
  for (const [id, code, message] of badIds) {
    it(`container ID ${JSON.stringify(id)} → ${message}`, () => assert.throws(() => validateContainerId(id), { code, message }));
  }

  for (const name of ['eth0', 'net1', 'a', '123456789012345', 'veth.5@x']) it(`ifname ${name} ok`, () => validateIfname(name));
  const badIf: [string, string, string?][] = [
    ['', 'interface name is empty'],
    ['1234567890123456', 'interface name is too long', 'interface name should be less than 16 characters'],
    ['ééééééééé', 'interface name is too long', 'interface name should be less than 16 characters'], // 18 bytes
    ['.', 'interface name is . or ..'],
    ['..', 'interface name is . or ..'],
    ['eth/0', 'interface name contains / or : or whitespace characters'],
    ['eth:0', 'interface name contains / or : or whitespace characters'],
    ['eth 0', 'interface name contains / or : or whitespace characters'],
    ['eth\u00a00', 'interface name contains / or : or whitespace characters'],
  ];
  for (const [name, message, details] of badIf) {
    it(`ifname ${JSON.stringify(name)} → ${message}`, () =>
      assert.throws(() => validateIfname(name), (e: unknown) => {
        const err = e as { code: string; message: string; details?: string };
        assert.equal(err.code, 'IPAM_INVALID_ENV');
        assert.equal(err.message, message);
        if (details !== undefined) assert.equal(err.details, details);
        return true;
      }));
  }

  it('network name rules', () => {
    validateNetworkName('k8s-pod-network');
    validateNetworkName('cbr0');
    assert.throws(() => validateNetworkName(''), { code: 'IPAM_INVALID_CONFIG', message: 'missing network name:' });
    assert.throws(() => validateNetworkName('.hidden'), {
      code: 'IPAM_INVALID_CONFIG',
      message: 'invalid characters found in network name',
      details: '.hidden',
    });
  });
});

describe('parseResolvConf (host-local dns.go)', () => {
  const cases: [string, string, object][] = [
    ['empty', '', {}],
    [
      'all keys, comments, blanks, CRLF',
      '# comment\n; other comment\n\nnameserver 10.0.0.53\r\nnameserver fd00::53 extra\ndomain example.com\ndomain corp.example\nsearch a.example b.example\nsearch c.example\noptions ndots:5 timeout:1\n',
      {
        nameservers: ['10.0.0.53', 'fd00::53'],
        domain: 'corp.example',
        search: ['a.example', 'b.example', 'c.example'],
        options: ['ndots:5', 'timeout:1'],
      },
    ],
    ['indented lines and tabs', '   nameserver\t1.1.1.1  \n\tsearch  x\ty', { nameservers: ['1.1.1.1'], search: ['x', 'y'] }],
    ['single-field lines and unknown keys are skipped', 'nameserver\nsortlist 10.0.0.0\nlookup file bind', {}],
    ['a # after the first column is not a comment', 'nameserver 1.1.1.1 # primary', { nameservers: ['1.1.1.1'] }],
  ];
  for (const [name, text, want] of cases) it(name, () => assert.deepEqual(parseResolvConf(text), want));
});
