/**
 * Black-box tests of the installed plugin executable (`ipwarden install-cni`), one suite per CNI
 * spec version, asserting stdout, exit status and the raw files in the network directory.
 */
import assert from 'node:assert/strict';
import { chmodSync, chownSync, copyFileSync, existsSync, mkdirSync, readdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import { installedPlugin, ROOT, runCni, runCniAsync, snapshotDir, tempDir, type Invocation } from '../helpers/cni.ts';
import { readShimFields } from '../../src/cli/install-cni.ts';

const NET = 'bbnet';
let bin = '';
const cleanups: Array<() => void> = [];
before(() => {
  bin = installedPlugin();
});
after(() => cleanups.forEach((c) => c()));

function dataDir(): string {
  const t = tempDir('ipw-bb-');
  cleanups.push(t.cleanup);
  return t.dir;
}

function config(dd: string, ipam: Record<string, unknown>, cniVersion = '1.0.0', extra: Record<string, unknown> = {}) {
  return { cniVersion, name: NET, ...extra, ipam: { type: 'ipwarden', dataDir: dd, ...ipam } };
}

const run = (inv: Invocation) => runCni(bin, inv);
const v4 = (subnet: string, more: Record<string, unknown> = {}) => ({ ranges: [[{ subnet, ...more }]] });

const ALL = ['0.1.0', '0.2.0', '0.3.0', '0.3.1', '0.4.0', '1.0.0', '1.1.0'];

for (const v of ALL) {
  describe(`spec version ${v}`, () => {
    it('ADD returns the result in this version and writes the reservation', () => {
      const dd = dataDir();
      const r = run({ command: 'ADD', containerId: 'c1', ifname: 'eth0', stdin: config(dd, v4('10.1.0.0/24'), v) });
      assert.equal(r.exitCode, 0, r.stdout);
      assert.equal(r.stderr, '');
      const old = v === '0.1.0' || v === '0.2.0';
      const withVersion = ['0.3.0', '0.3.1', '0.4.0'].includes(v);
      // 0.x print an empty "dns": {} (libcni types020/040); 1.0.0 and 1.1.0 omit it, as current
      // upstream does (libcni types100 MarshalJSON, host-local v1.6.0+; docs/compatibility.md).
      const expected = old
        ? { cniVersion: v, ip4: { ip: '10.1.0.2/24', gateway: '10.1.0.1' }, dns: {} }
        : withVersion
          ? { cniVersion: v, ips: [{ version: '4', address: '10.1.0.2/24', gateway: '10.1.0.1' }], dns: {} }
          : { cniVersion: v, ips: [{ address: '10.1.0.2/24', gateway: '10.1.0.1' }] };
      assert.deepEqual(r.json, expected);
      // Byte for byte: upstream's key order and 4-space indentation.
      assert.equal(r.stdout, JSON.stringify(expected, null, 4));
      assert.equal(Object.hasOwn(r.json ?? {}, 'dns'), old || withVersion);
      const dir = join(dd, NET);
      assert.deepEqual(snapshotDir(dir), { '10.1.0.2': 'c1\r\neth0', 'last_reserved_ip.0': '10.1.0.2', lock: '' });
      assert.equal(statSync(join(dir, '10.1.0.2')).mode & 0o777, 0o600);
      // last_reserved_ip.<N> is 0600 too, as upstream writes it since v1.4.0.
      assert.equal(statSync(join(dir, 'last_reserved_ip.0')).mode & 0o777, 0o600);
      assert.equal(statSync(dir).mode & 0o777, 0o755);
    });

    it('DEL releases it and a repeated DEL succeeds', () => {
      const dd = dataDir();
      const conf = config(dd, v4('10.1.0.0/24'), v);
      assert.equal(run({ command: 'ADD', containerId: 'c1', ifname: 'eth0', stdin: conf }).exitCode, 0);
      for (let i = 0; i < 2; i++) {
        const r = run({ command: 'DEL', containerId: 'c1', ifname: 'eth0', stdin: conf });
        assert.deepEqual([r.exitCode, r.stdout], [0, '']);
      }
      assert.deepEqual(snapshotDir(join(dd, NET)), { 'last_reserved_ip.0': '10.1.0.2', lock: '' });
    });

    const checkOK = ['0.4.0', '1.0.0', '1.1.0'].includes(v);
    it(checkOK ? 'CHECK succeeds for the owner and fails for a stranger' : 'CHECK is refused below 0.4.0', () => {
      const dd = dataDir();
      const conf = config(dd, v4('10.1.0.0/24'), v);
      assert.equal(run({ command: 'ADD', containerId: 'c1', ifname: 'eth0', stdin: conf }).exitCode, 0);
      const own = run({ command: 'CHECK', containerId: 'c1', ifname: 'eth0', stdin: conf });
      const other = run({ command: 'CHECK', containerId: 'c2', ifname: 'eth0', stdin: conf });
      if (checkOK) {
        assert.deepEqual([own.exitCode, own.stdout], [0, '']);
        assert.deepEqual(other.json, { cniVersion: v, code: 999, msg: 'ipwarden: Failed to find address added by container c2' });
      } else {
        assert.deepEqual(own.json, { cniVersion: v, code: 1, msg: 'config version does not allow CHECK' });
      }
    });

    if (v !== '1.1.0') {
      for (const cmd of ['GC', 'STATUS']) {
        it(`${cmd} is refused with code 1`, () => {
          const r = run({ command: cmd, stdin: { ...config(dataDir(), v4('10.1.0.0/24'), v), 'cni.dev/valid-attachments': [] } });
          assert.deepEqual(r.json, { cniVersion: v, code: 1, msg: `config version does not allow ${cmd}` });
          assert.equal(r.exitCode, 1);
        });
      }
    }
  });
}

describe('CNI 1.1.0 GC', () => {
  // Container IDs of this process only: GC keeps the reservation of a container whose CNI
  // operation runs anywhere on the node (kernel evidence), so a common ID like "c1" in another
  // process on the machine would change the outcome.
  const G = `gc${process.pid}-c`;
  function prepared() {
    const dd = dataDir();
    const dir = join(dd, NET);
    mkdirSync(dir, { recursive: true });
    const files: Record<string, string> = {
      '10.1.0.2': `${G}1\r\neth0`,
      '10.1.0.3': `${G}2\r\neth0`,
      '10.1.0.4': `${G}3`,
      '10.1.0.5': '',
      '10.1.0.6': `${G}1\r\neth1`,
      'last_reserved_ip.0': '10.1.0.6',
      lock: '',
    };
    for (const [n, c] of Object.entries(files)) writeFileSync(join(dir, n), c);
    return { dd, dir };
  }
  const gc = (dd: string, valid: unknown, key = 'cni.dev/valid-attachments') =>
    run({ command: 'GC', stdin: { ...config(dd, v4('10.1.0.0/24'), '1.1.0'), [key]: valid } });

  it('releases every reservation not in cni.dev/valid-attachments, and corrupt records', () => {
    const { dd, dir } = prepared();
    const r = gc(dd, [{ containerID: `${G}1`, ifname: 'eth0' }, { containerID: `${G}3`, ifname: 'eth0' }]);
    assert.deepEqual([r.exitCode, r.stdout], [0, '']);
    assert.deepEqual(snapshotDir(dir), { '10.1.0.2': `${G}1\r\neth0`, '10.1.0.4': `${G}3`, 'last_reserved_ip.0': '10.1.0.6', lock: '' });
  });

  it('falls back to cni.dev/attachments', () => {
    const { dd, dir } = prepared();
    assert.equal(gc(dd, [{ containerID: `${G}2`, ifname: 'eth0' }], 'cni.dev/attachments').exitCode, 0);
    assert.deepEqual(snapshotDir(dir), { '10.1.0.3': `${G}2\r\neth0`, 'last_reserved_ip.0': '10.1.0.6', lock: '' });
  });

  it('an empty list means nothing is valid; lock and last_reserved_ip stay', () => {
    const { dd, dir } = prepared();
    assert.equal(gc(dd, []).exitCode, 0);
    assert.deepEqual(snapshotDir(dir), { 'last_reserved_ip.0': '10.1.0.6', lock: '' });
  });

  it('a request without any attachment list is refused and releases nothing', () => {
    const { dd, dir } = prepared();
    const before = snapshotDir(dir);
    const r = run({ command: 'GC', stdin: config(dd, v4('10.1.0.0/24'), '1.1.0') });
    assert.deepEqual(r.json, { cniVersion: '1.1.0', code: 7, msg: 'GC request carries no "cni.dev/valid-attachments" list' });
    assert.deepEqual(snapshotDir(dir), before);
  });
});

describe('CNI 1.1.0 STATUS', () => {
  it('succeeds while an address is free', () => {
    const r = run({ command: 'STATUS', stdin: config(dataDir(), v4('10.1.0.0/29'), '1.1.0') });
    assert.deepEqual([r.exitCode, r.stdout], [0, '']);
  });

  it('reports code 50 when a range set is full, with failStatusOnExhaustion', () => {
    const dd = dataDir();
    const conf = config(dd, { ...v4('10.1.0.0/29'), failStatusOnExhaustion: true }, '1.1.0');
    for (let i = 0; i < 5; i++) assert.equal(run({ command: 'ADD', containerId: `c${i}`, ifname: 'eth0', stdin: conf }).exitCode, 0);
    const r = run({ command: 'STATUS', stdin: conf, env: { CONTAINER_RUNTIME_ENDPOINT: '/nonexistent/cri.sock' } });
    assert.equal(r.exitCode, 1);
    assert.equal(r.json?.['code'], 50);
    assert.equal(
      r.json?.['msg'],
      `no IP addresses available in range set: 10.1.0.1-10.1.0.6; range set 0: 5 of 5 addresses reserved; the runtime could not be asked (no CRI runtime at unix:///nonexistent/cri.sock: socket does not exist), so leaked reservations cannot be told from live ones (set the ipam key "runtimeEndpoint"); run "ipwarden leaks --network bbnet --data-dir ${dd} --runtime-endpoint URL"`,
    );
  });

  it('reports code 50 when the data directory cannot be written', () => {
    const dd = dataDir();
    writeFileSync(join(dd, 'file'), '');
    const r = run({ command: 'STATUS', stdin: config(join(dd, 'file', 'sub'), v4('10.1.0.0/29'), '1.1.0') });
    assert.equal(r.exitCode, 1);
    assert.equal(r.json?.['code'], 50);
    assert.equal(r.json?.['msg'], `data directory ${join(dd, 'file', 'sub')} is not writable`);
  });
});

describe('field reports (plugin)', () => {
  it('BR-02 a: DEL with CNI_NETNS unset after a reboot releases; ADD continues round robin', () => {
    const dd = dataDir();
    const dir = join(dd, 'containerd-net');
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, '10.88.0.2'), 'c-old\r\neth0');
    writeFileSync(join(dir, 'last_reserved_ip.0'), '10.88.0.2');
    writeFileSync(join(dir, 'lock'), '');
    const conf = { cniVersion: '1.0.0', name: 'containerd-net', ipam: { type: 'ipwarden', dataDir: dd, ranges: [[{ subnet: '10.88.0.0/29' }]] } };
    const d = run({ command: 'DEL', containerId: 'c-old', ifname: 'eth0', stdin: conf, netns: '' });
    assert.deepEqual([d.exitCode, d.stdout], [0, '']);
    assert.deepEqual(snapshotDir(dir), { 'last_reserved_ip.0': '10.88.0.2', lock: '' });
    const a = run({ command: 'ADD', containerId: 'c-new', ifname: 'eth0', stdin: conf });
    assert.equal((a.json?.['ips'] as Array<{ address: string }>)[0]?.address, '10.88.0.3/29');
  });

  it('BR-08: re-ADD returns the existing address (a, c), a second ifname gets a new one (b), DEL+ADD moves on (d)', () => {
    const dd = dataDir();
    const dir = join(dd, 'bridge');
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, '10.4.0.2'), 'default-c1\r\neth0');
    writeFileSync(join(dir, '10.4.0.4'), 'default-c9');
    writeFileSync(join(dir, 'last_reserved_ip.0'), '10.4.0.2');
    writeFileSync(join(dir, 'lock'), '');
    const conf = { cniVersion: '1.0.0', name: 'bridge', ipam: { type: 'ipwarden', dataDir: dd, ranges: [[{ subnet: '10.4.0.0/24' }]] } };
    const addr = (id: string, ifname: string) => {
      const r = run({ command: 'ADD', containerId: id, ifname, stdin: conf });
      assert.equal(r.exitCode, 0, r.stdout);
      return (r.json?.['ips'] as Array<{ address: string }>)[0]?.address;
    };
    assert.equal(addr('default-c1', 'eth0'), '10.4.0.2/24');
    assert.deepEqual(snapshotDir(dir), { '10.4.0.2': 'default-c1\r\neth0', '10.4.0.4': 'default-c9', 'last_reserved_ip.0': '10.4.0.2', lock: '' });
    assert.equal(addr('default-c1', 'eth1'), '10.4.0.3/24');
    assert.equal(addr('default-c9', 'eth0'), '10.4.0.4/24');
    assert.equal(snapshotDir(dir)['10.4.0.4'], 'default-c9\r\neth0', 'the legacy record is claimed for eth0');
    assert.equal(run({ command: 'DEL', containerId: 'default-c1', ifname: 'eth0', stdin: conf }).exitCode, 0);
    assert.equal(existsSync(join(dir, '10.4.0.3')), true, 'DEL of eth0 keeps eth1');
    assert.equal(addr('default-c1', 'eth0'), '10.4.0.5/24');
    const owners = Object.entries(snapshotDir(dir)).filter(([, c]) => c === 'default-c1\r\neth0');
    assert.equal(owners.length, 1, 'never two files for one (id, ifname)');
  });

  it('BR-09: repeated and concurrent ADDs for one sandbox leave exactly one reservation', async () => {
    const dd = dataDir();
    const conf = config(dd, v4('10.22.0.0/29'));
    const first = run({ command: 'ADD', containerId: 'c1', ifname: 'eth0', stdin: conf });
    assert.equal((first.json?.['ips'] as Array<{ address: string }>)[0]?.address, '10.22.0.2/29');
    for (let i = 0; i < 3; i++) {
      const r = run({ command: 'ADD', containerId: 'c1', ifname: 'eth0', stdin: conf });
      assert.equal((r.json?.['ips'] as Array<{ address: string }>)[0]?.address, '10.22.0.2/29');
    }
    const both = await Promise.all([0, 1].map(() => runCniAsync(bin, { command: 'ADD', containerId: 'c1', ifname: 'eth0', stdin: conf })));
    for (const r of both) assert.equal((r.json?.['ips'] as Array<{ address: string }>)[0]?.address, '10.22.0.2/29');
    assert.deepEqual(snapshotDir(join(dd, NET)), { '10.22.0.2': 'c1\r\neth0', 'last_reserved_ip.0': '10.22.0.2', lock: '' });
  });

  it('BR-15: dataDir wiped by a reboot: DEL succeeds and creates nothing; ADD recreates DIR (0755) and lock from rangeStart', () => {
    const dd = join(dataDir(), 'tmpfs', 'cni');
    const conf = { cniVersion: '1.0.0', name: 'macvlan-a', ipam: { type: 'ipwarden', dataDir: dd, ranges: [[{ subnet: '10.30.0.0/29' }]] } };
    const d = run({ command: 'DEL', containerId: 'c1', ifname: 'eth0', stdin: conf, netns: '' });
    assert.deepEqual([d.exitCode, d.stdout], [0, '']);
    assert.equal(existsSync(join(dd, 'macvlan-a')), false);
    const a = run({ command: 'ADD', containerId: 'c2', ifname: 'eth0', stdin: conf });
    assert.equal((a.json?.['ips'] as Array<{ address: string }>)[0]?.address, '10.30.0.2/29');
    assert.equal(statSync(join(dd, 'macvlan-a')).mode & 0o777, 0o755);
    assert.deepEqual(snapshotDir(join(dd, 'macvlan-a')), { '10.30.0.2': 'c2\r\neth0', 'last_reserved_ip.0': '10.30.0.2', lock: '' });
  });

  const rs16 = {
    a: [[{ subnet: '10.10.10.0/24', rangeStart: '10.10.10.20', rangeEnd: '10.10.10.22' }], [{ subnet: '10.20.20.0/24', rangeStart: '10.20.20.20', rangeEnd: '10.20.20.21' }]],
    b: [[{ subnet: '10.10.10.0/24', rangeStart: '10.10.10.20', rangeEnd: '10.10.10.22' }, { subnet: '10.20.20.0/24', rangeStart: '10.20.20.20', rangeEnd: '10.20.20.21' }]],
  };
  it('BR-16 A: two range sets give one address each; the third ADD fails on range 1 and releases range 0', () => {
    const dd = dataDir();
    const conf = { cniVersion: '1.0.0', name: 'rs16', ipam: { type: 'ipwarden', dataDir: dd, ranges: rs16.a } };
    const ips = (id: string) => (run({ command: 'ADD', containerId: id, ifname: 'eth0', stdin: conf }).json?.['ips'] as Array<{ address: string }>).map((x) => x.address);
    assert.deepEqual(ips('c1'), ['10.10.10.20/24', '10.20.20.20/24']);
    assert.deepEqual(ips('c2'), ['10.10.10.21/24', '10.20.20.21/24']);
    const r = run({ command: 'ADD', containerId: 'c3', ifname: 'eth0', stdin: conf, env: { CONTAINER_RUNTIME_ENDPOINT: '/nonexistent/cri.sock' } });
    assert.deepEqual(r.json, {
      cniVersion: '1.0.0',
      code: 999,
      msg: 'failed to allocate for range 1: no IP addresses available in range set: 10.20.20.20-10.20.20.21',
      details:
        `range set 1 has 2 allocatable addresses and 2 reservations; the runtime could not be asked (no CRI runtime at unix:///nonexistent/cri.sock: socket does not exist), so leaked reservations cannot be told from live ones (set the ipam key "runtimeEndpoint"); run "ipwarden leaks --network rs16 --data-dir ${dd} --runtime-endpoint URL"`,
    });
    const files = snapshotDir(join(dd, 'rs16'));
    assert.equal(files['10.10.10.22'], undefined, 'c3 reservation in range set 0 was released');
    assert.deepEqual(Object.keys(files).filter((f) => f.startsWith('last_reserved_ip')), ['last_reserved_ip.0', 'last_reserved_ip.1']);
  });

  it('BR-16 B: one set of two ranges is one pool of five addresses', () => {
    const dd = dataDir();
    const conf = { cniVersion: '1.0.0', name: 'rs16', ipam: { type: 'ipwarden', dataDir: dd, ranges: rs16.b } };
    const got = [1, 2, 3, 4, 5].map((i) => (run({ command: 'ADD', containerId: `c${i}`, ifname: 'eth0', stdin: conf }).json?.['ips'] as Array<{ address: string }>)[0]?.address);
    assert.deepEqual(got, ['10.10.10.20/24', '10.10.10.21/24', '10.10.10.22/24', '10.20.20.20/24', '10.20.20.21/24']);
    const r = run({ command: 'ADD', containerId: 'c6', ifname: 'eth0', stdin: conf });
    assert.equal(r.json?.['msg'], 'failed to allocate for range 0: no IP addresses available in range set: 10.10.10.20-10.10.10.22,10.20.20.20-10.20.20.21');
  });

  const badRanges: Array<[string, unknown, string]> = [
    ['C flat list', [{ subnet: '10.10.10.0/24' }, { subnet: '10.20.20.0/24' }], ''],
    ['D empty', [], 'no IP ranges specified'],
    ['E overlap', [[{ subnet: '10.10.10.0/24' }], [{ subnet: '10.10.10.0/24' }]], 'range set 0 overlaps with 1'],
  ];
  for (const [name, ranges, msg] of badRanges) {
    it(`BR-16 ${name}: config error with code 7 and nothing written`, () => {
      const dd = dataDir();
      const r = run({ command: 'ADD', containerId: 'c1', ifname: 'eth0', stdin: { cniVersion: '1.0.0', name: 'rs16', ipam: { type: 'ipwarden', dataDir: dd, ranges } } });
      assert.equal(r.exitCode, 1);
      assert.equal(r.json?.['code'], 7);
      if (msg !== '') assert.equal(r.json?.['msg'], msg);
      else assert.equal(typeof r.json?.['msg'], 'string');
      assert.equal(existsSync(join(dd, 'rs16')), false);
    });
  }

  it('BR-24 A: a range across an octet boundary inside a /16', () => {
    const dd = dataDir();
    const conf = config(dd, v4('10.1.0.0/16', { rangeStart: '10.1.2.254', rangeEnd: '10.1.3.1' }));
    const got = [1, 2, 3, 4].map((i) => (run({ command: 'ADD', containerId: `c${i}`, ifname: 'eth0', stdin: conf }).json?.['ips'] as Array<{ address: string }>)[0]?.address);
    assert.deepEqual(got, ['10.1.2.254/16', '10.1.2.255/16', '10.1.3.0/16', '10.1.3.1/16']);
    assert.equal(run({ command: 'ADD', containerId: 'c5', ifname: 'eth0', stdin: conf }).json?.['msg'], 'failed to allocate for range 0: no IP addresses available in range set: 10.1.2.254-10.1.3.1');
  });

  it('BR-24 B: a /30 has one allocatable address; a /31 is refused', () => {
    const dd = dataDir();
    const c30 = config(dd, v4('10.1.0.0/30'));
    assert.equal((run({ command: 'ADD', containerId: 'c1', ifname: 'eth0', stdin: c30 }).json?.['ips'] as Array<{ address: string }>)[0]?.address, '10.1.0.2/30');
    assert.equal(run({ command: 'ADD', containerId: 'c2', ifname: 'eth0', stdin: c30 }).json?.['msg'], 'failed to allocate for range 0: no IP addresses available in range set: 10.1.0.1-10.1.0.2');
    const r = run({ command: 'ADD', containerId: 'c1', ifname: 'eth0', stdin: config(dataDir(), v4('10.1.0.0/31')) });
    assert.deepEqual([r.json?.['code'], r.json?.['msg']], [7, 'invalid range set 0: Network 10.1.0.0/31 too small to allocate from']);
  });

  it('BR-24 C: rangeStart after rangeEnd and rangeStart outside the subnet are refused before touching DIR', () => {
    for (const more of [{ rangeStart: '10.1.3.0', rangeEnd: '10.1.2.0' }, { rangeStart: '10.2.0.5' }]) {
      const dd = dataDir();
      const r = run({ command: 'ADD', containerId: 'c1', ifname: 'eth0', stdin: config(dd, v4('10.1.0.0/16', more)) });
      assert.equal(r.json?.['code'], 7, r.stdout);
      assert.equal(existsSync(join(dd, NET)), false);
    }
  });

  it('BR-24 D: IPv6 /64 defaults, and with 1,000 reservations ADD still takes the next address', () => {
    const dd = dataDir();
    const dir = join(dd, NET);
    mkdirSync(dir, { recursive: true });
    for (let i = 2; i < 1002; i++) writeFileSync(join(dir, `fd00:20::${i.toString(16)}`), `x${i}\r\neth0`);
    writeFileSync(join(dir, 'last_reserved_ip.0'), `fd00:20::${(1001).toString(16)}`);
    const conf = config(dd, v4('fd00:20::/64'));
    const r = run({ command: 'ADD', containerId: 'c1', ifname: 'eth0', stdin: conf });
    assert.deepEqual(r.json, { cniVersion: '1.0.0', ips: [{ address: 'fd00:20::3ea/64', gateway: 'fd00:20::1' }] });
    const s = run({ command: 'STATUS', stdin: { ...conf, cniVersion: '1.1.0' } });
    assert.equal(s.exitCode, 0, s.stdout);
  });
});

describe('resolvConf, routes and static requests', () => {
  it('fills dns from resolvConf and copies routes', () => {
    const dd = dataDir();
    const rc = join(dd, 'resolv.conf');
    writeFileSync(rc, '# comment\nnameserver 10.0.0.10\nsearch a.svc b.svc\ndomain cluster.local\noptions ndots:5\n');
    const r = run({ command: 'ADD', containerId: 'c1', ifname: 'eth0', stdin: config(dd, { ...v4('10.1.0.0/24'), resolvConf: rc, routes: [{ dst: '0.0.0.0/0', gw: '10.1.0.1' }] }) });
    assert.deepEqual(r.json, {
      cniVersion: '1.0.0',
      ips: [{ address: '10.1.0.2/24', gateway: '10.1.0.1' }],
      routes: [{ dst: '0.0.0.0/0', gw: '10.1.0.1' }],
      dns: { nameservers: ['10.0.0.10'], domain: 'cluster.local', search: ['a.svc', 'b.svc'], options: ['ndots:5'] },
    });
  });

  // Byte for byte as current upstream prints it: 0.4.0 in struct order with "dns" last; 1.0.0 and
  // 1.1.0 through libcni's types100 MarshalJSON, a Go map round trip, so every object's keys sorted.
  for (const [v, text] of [
    ['0.4.0', '{"cniVersion":"0.4.0","ips":[{"version":"4","address":"10.1.0.2/24","gateway":"10.1.0.1"}],"routes":[{"dst":"0.0.0.0/0","gw":"10.1.0.1"}],"dns":{"nameservers":["10.0.0.10"],"domain":"cluster.local","search":["a.svc","b.svc"],"options":["ndots:5"]}}'],
    ['1.0.0', '{"cniVersion":"1.0.0","dns":{"domain":"cluster.local","nameservers":["10.0.0.10"],"options":["ndots:5"],"search":["a.svc","b.svc"]},"ips":[{"address":"10.1.0.2/24","gateway":"10.1.0.1"}],"routes":[{"dst":"0.0.0.0/0","gw":"10.1.0.1"}]}'],
    ['1.1.0', '{"cniVersion":"1.1.0","dns":{"domain":"cluster.local","nameservers":["10.0.0.10"],"options":["ndots:5"],"search":["a.svc","b.svc"]},"ips":[{"address":"10.1.0.2/24","gateway":"10.1.0.1"}],"routes":[{"advmss":1400,"dst":"0.0.0.0/0","gw":"10.1.0.1","mtu":1450,"priority":5,"scope":0,"table":100}]}'],
  ] as const) {
    it(`cniVersion ${v}: the result's key order and indentation are upstream's`, () => {
      const dd = dataDir();
      const rc = join(dd, 'resolv.conf');
      writeFileSync(rc, 'nameserver 10.0.0.10\nsearch a.svc b.svc\ndomain cluster.local\noptions ndots:5\n');
      const route = { dst: '0.0.0.0/0', gw: '10.1.0.1', mtu: 1450, advmss: 1400, priority: 5, table: 100, scope: 0 };
      const r = run({ command: 'ADD', containerId: 'c1', ifname: 'eth0', stdin: config(dd, { ...v4('10.1.0.0/24'), resolvConf: rc, routes: [route] }, v) });
      assert.equal(r.exitCode, 0, r.stdout);
      assert.equal(r.stdout, JSON.stringify(JSON.parse(text), null, 4));
    });
  }

  it('a last_reserved_ip.0 left 0644 (older ipwarden, host-local before v1.4.0) is 0600 after the next ADD', () => {
    const dd = dataDir();
    const dir = join(dd, NET);
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, 'last_reserved_ip.0'), '10.1.0.7', { mode: 0o644 });
    chmodSync(join(dir, 'last_reserved_ip.0'), 0o644);
    const r = run({ command: 'ADD', containerId: 'c1', ifname: 'eth0', stdin: config(dd, v4('10.1.0.0/24')) });
    assert.equal(r.exitCode, 0, r.stdout);
    assert.equal((r.json?.['ips'] as Array<{ address: string }>)[0]?.address, '10.1.0.8/24');
    assert.deepEqual(snapshotDir(dir), { '10.1.0.8': 'c1\r\neth0', 'last_reserved_ip.0': '10.1.0.8', lock: '' });
    assert.equal(statSync(join(dir, 'last_reserved_ip.0')).mode & 0o777, 0o600);
  });

  it('a missing resolvConf fails before anything is reserved', () => {
    const dd = dataDir();
    const r = run({ command: 'ADD', containerId: 'c1', ifname: 'eth0', stdin: config(dd, { ...v4('10.1.0.0/24'), resolvConf: '/nonexistent/resolv.conf' }) });
    assert.deepEqual(r.json, { cniVersion: '1.0.0', code: 5, msg: 'open /nonexistent/resolv.conf: no such file or directory' });
    assert.deepEqual(snapshotDir(join(dd, NET)), {});
  });

  it('a static request that cannot be met releases what this ADD took', () => {
    const dd = dataDir();
    const r = run({ command: 'ADD', containerId: 'c1', ifname: 'eth0', args: 'IP=10.9.9.9', stdin: config(dd, v4('10.1.0.0/24')) });
    assert.deepEqual(r.json, { cniVersion: '1.0.0', code: 999, msg: 'failed to allocate all requested IPs: 10.9.9.9' });
    assert.deepEqual(Object.keys(snapshotDir(join(dd, NET))).filter((f) => /^\d/.test(f)), []);
  });
});

describe('install-cni', () => {
  it('writes the shim, the standalone single executable, the flock binding and the namespace helper, with versions, and no warning', () => {
    const dest = join(dataDir(), 'bin');
    const r = spawnSync(process.execPath, [join(ROOT, 'dist/ipwarden.cjs'), 'install-cni', '--dest', dest], { encoding: 'utf8' });
    assert.deepEqual([r.status, r.stderr], [0, '']);
    const size = statSync(join(ROOT, 'dist/ipwarden-standalone')).size;
    assert.equal(
      r.stdout,
      `installed ${join(dest, 'ipwarden-flock.node')} (flock binding)\n` +
        `installed ${join(dest, 'ipwarden-netns')} (namespace helper)\n` +
        `installed ${join(dest, 'ipwarden-standalone')} (ipwarden 0.1.0, Node.js ${process.version}, ${size} bytes)\n` +
        `installed ${join(dest, 'ipwarden')} (exec shim, protocol v2, socket /run/ipwarden/plugin.sock)\n`,
    );
    assert.deepEqual(readFileSync(join(dest, 'ipwarden')), readFileSync(join(ROOT, 'dist/ipwarden-shim')));
    for (const f of ['ipwarden-standalone', 'ipwarden-flock.node', 'ipwarden-netns']) assert.deepEqual(readFileSync(join(dest, f)), readFileSync(join(ROOT, 'dist', f)), f);
    // An ELF executable, not a script: no interpreter line names a Node.js on the host.
    assert.deepEqual([...readFileSync(join(dest, 'ipwarden-standalone')).subarray(0, 4)], [0x7f, 0x45, 0x4c, 0x46]);
    assert.deepEqual(readdirSync(dest).sort(), ['ipwarden', 'ipwarden-flock.node', 'ipwarden-netns', 'ipwarden-standalone']);
  });

  it('the installed standalone installs again by itself (as the image does), without Node.js on PATH', () => {
    const first = join(dataDir(), 'bin');
    assert.equal(spawnSync(process.execPath, [join(ROOT, 'dist/ipwarden.cjs'), 'install-cni', '--dest', first], { encoding: 'utf8' }).status, 0);
    const second = join(dataDir(), 'bin2');
    const r = spawnSync(join(first, 'ipwarden-standalone'), ['install-cni', '--dest', second, '--socket', '/run/ipw-test/p.sock'], { encoding: 'utf8', env: { PATH: '/nonexistent' } });
    assert.deepEqual([r.status, r.stderr], [0, '']);
    assert.match(r.stdout, new RegExp(`^installed ${second}/ipwarden \\(exec shim, protocol v2, socket /run/ipw-test/p\\.sock\\)$`, 'm'));
    for (const f of ['ipwarden-standalone', 'ipwarden-flock.node', 'ipwarden-netns']) assert.deepEqual(readFileSync(join(second, f)), readFileSync(join(first, f)), f);
    assert.equal(readShimFields(readFileSync(join(second, 'ipwarden'))).socket, '/run/ipw-test/p.sock');
  });

  /** A copy of dist/'s installable files in a new 0755 dir, to be altered by a test. */
  const distCopy = (): string => {
    const d = join(dataDir(), 'dist');
    mkdirSync(d, { mode: 0o755 });
    chmodSync(d, 0o755);
    for (const f of ['ipwarden.cjs', 'ipwarden-cold.cjs', 'ipwarden-flock.node', 'ipwarden-netns', 'ipwarden-shim', 'ipwarden-standalone']) copyFileSync(join(ROOT, 'dist', f), join(d, f));
    return d;
  };

  it('refuses to install a file that others could have written (group/other-writable file or directory, another owner); nothing is written', () => {
    const d = distCopy();
    const dest = join(dataDir(), 'bin');
    chmodSync(join(d, 'ipwarden-netns'), 0o777);
    let r = spawnSync(process.execPath, [join(d, 'ipwarden.cjs'), 'install-cni', '--dest', dest], { encoding: 'utf8' });
    assert.deepEqual([r.status, r.stdout, r.stderr], [2, '', `ipwarden: install-cni: ${d}/ipwarden-netns is writable by group or others (mode 777): refusing to install from there\n`]);
    chmodSync(join(d, 'ipwarden-netns'), 0o755);
    chownSync(join(d, 'ipwarden-shim'), 65534, 65534);
    r = spawnSync(process.execPath, [join(d, 'ipwarden.cjs'), 'install-cni', '--dest', dest], { encoding: 'utf8' });
    assert.deepEqual([r.status, r.stderr], [2, `ipwarden: install-cni: ${d}/ipwarden-shim is owned by uid 65534: refusing to install from there\n`]);
    chownSync(join(d, 'ipwarden-shim'), 0, 0);
    chmodSync(d, 0o1777);
    r = spawnSync(process.execPath, [join(d, 'ipwarden.cjs'), 'install-cni', '--dest', dest], { encoding: 'utf8' });
    assert.deepEqual([r.status, r.stderr], [2, `ipwarden: install-cni: ${d} is writable by group or others (mode 1777): refusing to install from there\n`]);
    assert.equal(existsSync(dest), false);
  });

  it('a flock binding the standalone cannot load (another Node ABI) fails the install before the standalone or the shim is replaced', () => {
    const d = distCopy();
    const bogus = join(dataDir(), 'bogus.c');
    writeFileSync(bogus, 'int ipwarden_bogus;\n');
    execFileSync('gcc', ['-shared', '-fPIC', '-o', join(d, 'ipwarden-flock.node'), bogus]);
    const dest = join(dataDir(), 'bin');
    const r = spawnSync(process.execPath, [join(d, 'ipwarden.cjs'), 'install-cni', '--dest', dest], { encoding: 'utf8' });
    assert.equal(r.status, 1);
    assert.match(r.stderr, new RegExp(`^ipwarden: ${dest}/ipwarden-standalone\\.tmp-\\d+-[0-9a-f]{16}: cannot load the flock binding \\(ipwarden-flock\\.node beside the plugin\\): `));
    // The binding went first (it is what failed to load); no standalone, no shim, no temporary file.
    assert.deepEqual(readdirSync(dest).sort(), ['ipwarden-flock.node', 'ipwarden-netns']);
  });

  it('refuses a --dest whose parent does not exist', () => {
    const dest = join(dataDir(), 'no', 'such', 'bin');
    const r = spawnSync(process.execPath, [join(ROOT, 'dist/ipwarden.cjs'), 'install-cni', '--dest', dest], { encoding: 'utf8' });
    assert.deepEqual([r.status, r.stderr], [2, `ipwarden: install-cni: ${dirname(dest)} does not exist (--dest ${dest})\n`]);
  });
});

describe('CHECK with prevResult', () => {
  const prepared = () => {
    const dd = dataDir();
    const conf = config(dd, v4('10.1.0.0/24'), '1.0.0');
    assert.equal(run({ command: 'ADD', containerId: 'c1', ifname: 'eth0', stdin: conf }).exitCode, 0);
    return conf;
  };
  const check = (conf: object, prevResult: unknown) => run({ command: 'CHECK', containerId: 'c1', ifname: 'eth0', stdin: { ...conf, prevResult } });

  it('passes when every address of ours in prevResult is reserved; ignores addresses outside our ranges', () => {
    const conf = prepared();
    const r = check(conf, { cniVersion: '1.0.0', ips: [{ address: '10.1.0.2/24' }, { address: '192.168.9.9/24' }] });
    assert.deepEqual([r.exitCode, r.stdout], [0, '']);
  });

  it('fails for an address of ours that is not reserved for the container', () => {
    const conf = prepared();
    const r = check(conf, { cniVersion: '1.0.0', ips: [{ address: '10.1.0.5/24' }] });
    assert.deepEqual(r.json, { cniVersion: '1.0.0', code: 999, msg: 'ipwarden: address 10.1.0.5 of container c1 is not reserved for it' });
  });

  it('reads the ip4/ip6 shape too, and refuses a malformed prevResult with code 6', () => {
    const conf = prepared();
    assert.equal(check(conf, { ip4: { ip: '10.1.0.5/24' } }).json?.['msg'], 'ipwarden: address 10.1.0.5 of container c1 is not reserved for it');
    assert.deepEqual(check(conf, [1]).json, { cniVersion: '1.0.0', code: 6, msg: 'prevResult must be a JSON object' });
    assert.deepEqual(check(conf, { ips: { address: '10.1.0.2/24' } }).json, { cniVersion: '1.0.0', code: 6, msg: 'prevResult: "ips" must be an array' });
  });
});

describe('lock held by another process', () => {
  it('ADD and DEL answer code 11 (try again later) after lockTimeout and write nothing', async () => {
    const dd = dataDir();
    const dir = join(dd, NET);
    mkdirSync(dir, { recursive: true });
    const holder = spawn(process.execPath, [join(ROOT, 'test/fixtures/hold-lock.cjs'), join(dir, 'lock')], { stdio: ['pipe', 'pipe', 'inherit'] });
    try {
      await new Promise<void>((res) => holder.stdout.once('data', () => res()));
      const conf = config(dd, { ...v4('10.1.0.0/24'), lockTimeout: '300ms' });
      for (const command of ['ADD', 'DEL']) {
        const r = run({ command, containerId: 'c1', ifname: 'eth0', stdin: conf });
        assert.deepEqual(r.json, { cniVersion: '1.0.0', code: 11, msg: `timed out after 0.3s waiting for the lock on ${join(dir, 'lock')}` });
        assert.equal(r.exitCode, 1);
      }
      assert.deepEqual(snapshotDir(dir), { lock: '' });
    } finally {
      holder.stdin.end();
      await new Promise((res) => holder.once('close', res));
    }
  });
});

describe('DEL with a config whose ranges no longer parse', () => {
  it('still releases the container', () => {
    const dd = dataDir();
    assert.equal(run({ command: 'ADD', containerId: 'c1', ifname: 'eth0', stdin: config(dd, v4('10.1.0.0/24')) }).exitCode, 0);
    const broken = config(dd, { ranges: [[{ subnet: 'garbage' }]] });
    const r = run({ command: 'DEL', containerId: 'c1', ifname: 'eth0', stdin: broken });
    assert.deepEqual([r.exitCode, r.stdout], [0, '']);
    assert.equal(existsSync(join(dd, NET, '10.1.0.2')), false);
    assert.equal(readFileSync(join(dd, NET, 'last_reserved_ip.0'), 'utf8'), '10.1.0.2');
  });
});
