/**
 * The node readers behind `status` and `doctor` (src/node: CNI configuration files, /proc
 * parsers, plugin lookup) and the page's pure parts (address map, escaping).
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { chmodSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { addressMap, cellTitle, escapeHtml } from '../../src/cli/html.ts';
import { loadIPAMConfig } from '../../src/ipam/config.ts';
import { formatIP } from '../../src/common/ip.ts';
import { parseCniConfig, readCniConfigs } from '../../src/node/cni-conf.ts';
import { findPluginBinary } from '../../src/node/plugins.ts';
import {
  devMajorMinor,
  isIpwardenDaemon,
  mountOfPath,
  parseBootTime,
  parseProcLocks,
  parseProcMounts,
} from '../../src/node/proc.ts';
import type { PlanEntry, Verdict } from '../../src/reconcile/plan.ts';

describe('parseCniConfig', () => {
  const cases: Array<{ name: string; text: string; want: { name: string | null; plugins: string[]; ipamType: string | null; ipam: boolean; error: string | null } }> = [
    {
      name: 'conflist: the plugin with host-local IPAM is found after others',
      text: JSON.stringify({ cniVersion: '1.0.0', name: 'n', plugins: [{ type: 'bridge' }, { type: 'ptp', ipam: { type: 'host-local', subnet: '10.0.0.0/24' } }] }),
      want: { name: 'n', plugins: ['bridge', 'ptp'], ipamType: 'host-local', ipam: true, error: null },
    },
    {
      name: 'single .conf with ipwarden IPAM',
      text: JSON.stringify({ cniVersion: '0.4.0', name: 'n', type: 'bridge', ipam: { type: 'ipwarden', ranges: [[{ subnet: '10.0.0.0/24' }]] } }),
      want: { name: 'n', plugins: ['bridge'], ipamType: 'ipwarden', ipam: true, error: null },
    },
    {
      name: 'other IPAM: type reported, not parsed',
      text: JSON.stringify({ name: 'n', type: 'macvlan', ipam: { type: 'dhcp' } }),
      want: { name: 'n', plugins: ['macvlan'], ipamType: 'dhcp', ipam: false, error: null },
    },
    {
      name: 'no IPAM at all',
      text: JSON.stringify({ name: 'n', plugins: [{ type: 'cilium-cni' }] }),
      want: { name: 'n', plugins: ['cilium-cni'], ipamType: null, ipam: false, error: null },
    },
    {
      name: 'invalid host-local section: the loader message',
      text: JSON.stringify({ name: 'n', type: 'bridge', ipam: { type: 'host-local' } }),
      want: { name: 'n', plugins: ['bridge'], ipamType: 'host-local', ipam: false, error: 'invalid host-local IPAM configuration: no IP ranges specified' },
    },
    { name: 'not an object', text: '[1]', want: { name: null, plugins: [], ipamType: null, ipam: false, error: 'not a JSON object' } },
    { name: 'no name', text: '{"type":"bridge"}', want: { name: null, plugins: ['bridge'], ipamType: null, ipam: false, error: 'no network "name"' } },
  ];
  cases.forEach((c) =>
    it(c.name, () => {
      const got = parseCniConfig('/x', c.text);
      assert.deepEqual({ name: got.name, plugins: got.plugins, ipamType: got.ipamType, ipam: got.ipam !== null, error: got.error }, c.want);
    }),
  );

  it('a conflist plugin gets the list name and cniVersion, like libcni hands it over', () => {
    const got = parseCniConfig('/x', JSON.stringify({ cniVersion: '1.0.0', name: 'k', plugins: [{ type: 'bridge', ipam: { type: 'host-local', dataDir: '/d', ranges: [[{ subnet: '10.0.0.0/24' }]] } }] }));
    const want = loadIPAMConfig(JSON.stringify({ cniVersion: '1.0.0', name: 'k', type: 'bridge', ipam: { type: 'host-local', dataDir: '/d', ranges: [[{ subnet: '10.0.0.0/24' }]] } }), undefined);
    assert.deepEqual(got.ipam, want);
  });

  it('readCniConfigs: .conf/.conflist/.json only, sorted; a missing directory has none', () => {
    const dir = mkdtempSync(join(tmpdir(), 'ipwarden-conf-'));
    try {
      for (const f of ['b.conflist', 'a.conf', 'c.json', 'd.txt', 'e.conf.bak']) writeFileSync(join(dir, f), JSON.stringify({ name: f.replace(/\W/g, '') , type: 'x' }));
      mkdirSync(join(dir, 'sub.conf'));
      assert.deepEqual(
        readCniConfigs(dir).map((c) => c.file),
        ['a.conf', 'b.conflist', 'c.json'].map((f) => join(dir, f)),
      );
      assert.deepEqual(readCniConfigs(join(dir, 'missing')), []);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('/proc parsers', () => {
  it('parseProcLocks: holders and waiters, hex device, decimal inode', () => {
    const text = [
      '1: FLOCK  ADVISORY  WRITE 31371 fe:00:2146839 0 EOF',
      '1: -> FLOCK  ADVISORY  WRITE 31400 fe:00:2146839 0 EOF',
      '2: POSIX  ADVISORY  READ 812 103:0a:18446744073709551615 0 EOF',
      '3: OFDLCK ADVISORY  WRITE -1 00:2f:12 0 EOF',
      'garbage',
    ].join('\n');
    assert.deepEqual(parseProcLocks(text), [
      { id: 1, blocked: false, kind: 'FLOCK', mode: 'ADVISORY', access: 'WRITE', pid: 31371, major: 254, minor: 0, inode: 2146839n },
      { id: 1, blocked: true, kind: 'FLOCK', mode: 'ADVISORY', access: 'WRITE', pid: 31400, major: 254, minor: 0, inode: 2146839n },
      { id: 2, blocked: false, kind: 'POSIX', mode: 'ADVISORY', access: 'READ', pid: 812, major: 259, minor: 10, inode: 18446744073709551615n },
      { id: 3, blocked: false, kind: 'OFDLCK', mode: 'ADVISORY', access: 'WRITE', pid: -1, major: 0, minor: 47, inode: 12n },
    ]);
  });

  const devs: Array<[bigint, number, number]> = [
    [0xfe00n, 254, 0],
    [0x1030an, 259, 10], // glibc makedev(259, 10)
    [0x1200000134502n, 0x12345, 0x102], // major above 0xfff, minor above 0xff: high bits elsewhere
    [2049n, 8, 1],
  ];
  devs.forEach(([dev, major, minor]) =>
    it(`devMajorMinor(${dev}) = ${major}:${minor}`, () => assert.deepEqual(devMajorMinor(dev), { major, minor })),
  );

  it('parseProcMounts unescapes octal; mountOfPath picks the longest component prefix, later mounts over earlier', () => {
    const mounts = parseProcMounts(
      ['/dev/vda / ext4 rw 0 0', 'tmpfs /run tmpfs rw 0 0', 'tmpfs /var/lib/cni tmpfs rw 0 0', '/dev/vdb /var/lib/cni ext4 rw 0 0', 'x /srv/my\\040dir xfs rw 0 0', ''].join('\n'),
    );
    assert.equal(mounts.length, 5);
    assert.equal(mounts[4]?.mountPoint, '/srv/my dir');
    assert.equal(mountOfPath('/var/lib/cni/networks', mounts)?.fsType, 'ext4');
    assert.equal(mountOfPath('/var/lib/cni/networks', mounts)?.source, '/dev/vdb');
    assert.equal(mountOfPath('/run/x', mounts)?.fsType, 'tmpfs');
    assert.equal(mountOfPath('/running', mounts)?.mountPoint, '/');
    assert.equal(mountOfPath('/srv/my dir/a', mounts)?.fsType, 'xfs');
  });

  it('parseBootTime', () => {
    assert.equal(parseBootTime('cpu  1 2 3\nintr 5\nbtime 1735689600\nprocesses 9\n'), 1735689600);
    assert.equal(parseBootTime('cpu 1\n'), null);
  });

  const daemons: Array<[string[], boolean]> = [
    [['/usr/bin/ipwarden', 'daemon', '--interval', '1m'], true],
    [['node', '/usr/lib/node_modules/ipwarden/dist/ipwarden.cjs', 'daemon'], true],
    [['node', '/opt/ipwarden/bin/ipwarden', 'doctor'], false],
    [['daemon', 'ipwarden'], false],
    [['/usr/sbin/containerd'], false],
  ];
  daemons.forEach(([argv, want]) => it(`isIpwardenDaemon(${argv.join(' ')}) = ${want}`, () => assert.equal(isIpwardenDaemon(argv), want)));
});

describe('findPluginBinary', () => {
  it('first executable regular file in the directories, in order', () => {
    const root = mkdtempSync(join(tmpdir(), 'ipwarden-bin-'));
    try {
      const [a, b] = [join(root, 'a'), join(root, 'b')];
      mkdirSync(a);
      mkdirSync(b);
      writeFileSync(join(a, 'host-local'), '');
      chmodSync(join(a, 'host-local'), 0o644); // not executable
      writeFileSync(join(b, 'host-local'), '#!/bin/sh\n');
      chmodSync(join(b, 'host-local'), 0o755);
      mkdirSync(join(a, 'ipwarden')); // a directory
      assert.equal(findPluginBinary('host-local', [a, b]), join(b, 'host-local')); // no x bit: not even root may run it
      assert.equal(findPluginBinary('ipwarden', [a, b]), null);
      assert.equal(findPluginBinary('../a/host-local', [a, b]), null);
    } finally {
      rmSync(root, { recursive: true, force: true });
    }
  });
});

function entry(ip: string, verdict: Verdict, containerId: string | null = 'c', ifname: string | null = 'eth0'): PlanEntry {
  return { network: 'n', dir: '/d/n', ip, owner: containerId === null ? null : { containerId, ifname }, containerId, ifname, mtimeMs: 0, ageSeconds: 60, verdict, reason: '' };
}

describe('address map', () => {
  const rs = (subnet: string) => loadIPAMConfig(JSON.stringify({ name: 'n', ipam: { ranges: [[{ subnet }]] } }), undefined).rangeSets[0]!;

  it('one cell per address up to 1024: the gateway, reservations by verdict, free', () => {
    const m = addressMap(rs('10.42.1.0/28'), [entry('10.42.1.5', 'live'), entry('10.42.1.6', 'leaked'), entry('10.42.1.7', 'corrupt', null, null)]);
    assert.equal(m.blockSize, 1n);
    assert.deepEqual(
      m.cells.map((c) => `${formatIP(c.first)}:${c.state}`),
      ['10.42.1.1:gateway', '10.42.1.2:free', '10.42.1.3:free', '10.42.1.4:free', '10.42.1.5:live', '10.42.1.6:leaked', '10.42.1.7:corrupt', ...[8, 9, 10, 11, 12, 13, 14].map((i) => `10.42.1.${i}:free`)],
    );
    assert.equal(cellTitle(m.cells[4]!, 3_600_000), '10.42.1.5 live: c eth0, age 1h0m');
    assert.equal(cellTitle(m.cells[6]!, 0), '10.42.1.7 corrupt: corrupt record, age 0s');
    assert.equal(cellTitle(m.cells[1]!, 0), '10.42.1.2 free');
  });

  it('a /16 becomes 1024 blocks of 64 addresses, each showing its worst state', () => {
    const m = addressMap(rs('10.1.0.0/16'), [entry('10.1.0.70', 'live'), entry('10.1.0.71', 'leaked'), entry('10.1.0.72', 'grace'), entry('10.1.255.254', 'unknown')]);
    assert.equal(m.blockSize, 64n);
    assert.equal(m.cells.length, 1024);
    assert.deepEqual([m.cells[0]!.state, m.cells[1]!.state, m.cells[2]!.state, m.cells[1023]!.state], ['gateway', 'leaked', 'free', 'unknown']);
    assert.equal(m.cells[1023]!.size, 62n); // 65534 addresses = 1023 × 64 + 62
    assert.equal(
      cellTitle(m.cells[1]!, 0),
      '10.1.0.65 - 10.1.0.128 (64 addresses): 1 live, 1 grace, 1 leaked\n10.1.0.70 live: c eth0\n10.1.0.71 leaked: c eth0\n10.1.0.72 grace: c eth0',
    );
  });

  it('an IPv6 /64 is 1024 cells, built without walking the range', () => {
    const m = addressMap(rs('fd00:20::/64'), [entry('fd00:20::2', 'live')]);
    assert.equal(m.cells.length, 1024);
    assert.equal(m.cells[0]!.state, 'live');
  });

  it('escapeHtml escapes markup and both quotes', () => {
    assert.equal(escapeHtml(`<a href="x">'&'</a>`), '&#60;a href=&#34;x&#34;&#62;&#39;&#38;&#39;&#60;/a&#62;');
  });
});
