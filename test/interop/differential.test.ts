/**
 * Differential tests against the real upstream host-local (Debian containernetworking-plugins,
 * /usr/lib/cni/host-local). Each case starts two copies of one directory state, runs the same
 * invocations through host-local on one copy and through the installed ipwarden executable on the
 * other, and compares exit status, stdout JSON and the resulting files byte for byte.
 *
 * Only the deliberate differences documented in docs/compatibility.md are allowed, each named
 * per case (`allow`):
 *  - `errorCode`: ipwarden reports config/CNI_ARGS errors with the spec's code (7/4) where
 *    host-local reports 999; messages stay identical.
 *  - `reAdd`: a repeated ADD for a container ID + ifname that already holds a reservation returns
 *    it instead of failing with "duplicate allocation is not allowed" (a legacy ID-only record is
 *    claimed for that ifname: rewritten as `id\r\nifname`).
 *  - `checkMsg`: CHECK's not-found message names ipwarden instead of host-local.
 *  - `noDir`: DEL and CHECK on a network without a directory create nothing (host-local
 *    creates DIR and its lock file).
 *  - `decodeMsg`: the JSON parser's own words after `error unmarshall network config: ` differ
 *    (Go's encoding/json vs JavaScript's JSON.parse); the code (6) and the prefix are the same.
 * Always tolerated: the error object's extra `cniVersion` key (SPEC.md §Error; libcni prints none) and the
 * VERSION list's extra 1.1.0.
 *
 * Where Debian's 1.1.1 is older than current upstream, the test asserts current upstream's
 * behaviour on ipwarden's side instead of parity (docs/compatibility.md):
 *  - file modes: every reservation and `last_reserved_ip.<N>` file ipwarden wrote is exactly 0600
 *    (upstream since v1.4.0; 1.1.1 writes 0644);
 *  - with cniVersion 1.0.0/1.1.0, an ADD result whose DNS is empty has no `dns` key (upstream
 *    since v1.6.0, libcni's types100 MarshalJSON; 1.1.1 prints `"dns": {}`); 0.x results keep
 *    `"dns": {}` on both sides.
 */
import assert from 'node:assert/strict';
import { existsSync, lstatSync, mkdirSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import {
  haveHostLocal,
  HOST_LOCAL,
  installedPlugin,
  requireOrSkip,
  runCni,
  snapshotDir,
  tempDir,
  type Invocation,
  type Outcome,
} from '../helpers/cni.ts';

type Allow = 'errorCode' | 'reAdd' | 'checkMsg' | 'noDir' | 'decodeMsg';

interface Case {
  name: string;
  /** The ipam section (type and dataDir are filled in). */
  ipam: Record<string, unknown>;
  cniVersion?: string;
  /** Extra top-level config keys (args, runtimeConfig). */
  extra?: Record<string, unknown>;
  /** Files in DIR before the run; `c1|eth0` means `c1\r\neth0`. */
  disk?: Record<string, string>;
  /** Invocations; `stdin` defaults to the case's config. */
  steps: Array<Omit<Invocation, 'stdin'> & { stdin?: string | object }>;
  allow?: Allow[];
  /** Expected values asserted on ipwarden's side in addition to parity (optional). */
  expectIPs?: string[];
}

const NET = 'difftest';
const v4 = (subnet: string, more: Record<string, unknown> = {}) => ({ ranges: [[{ subnet, ...more }]] });
const add = (containerId: string, ifname = 'eth0', more: Partial<Invocation> = {}) => ({ command: 'ADD', containerId, ifname, ...more });
const del = (containerId: string, ifname = 'eth0', more: Partial<Invocation> = {}) => ({ command: 'DEL', containerId, ifname, ...more });

const VERSIONS = ['0.1.0', '0.2.0', '0.3.0', '0.3.1', '0.4.0', '1.0.0'];

const cases: Case[] = [
  ...VERSIONS.map((v): Case => ({ name: `fresh ADD, cniVersion ${v}`, cniVersion: v, ipam: v4('10.1.0.0/24'), steps: [add('c1')], expectIPs: ['10.1.0.2'] })),
  { name: 'dual stack 1.0.0', ipam: { ranges: [[{ subnet: '10.1.0.0/24' }], [{ subnet: 'fd00:1::/64' }]] }, steps: [add('c1'), add('c2')] },
  { name: 'dual stack 0.2.0 (ip4/ip6 form)', cniVersion: '0.2.0', ipam: { ranges: [[{ subnet: '10.1.0.0/24' }], [{ subnet: 'fd00:1::/120' }]] }, steps: [add('c1')] },
  {
    name: 'routes copied, split by family in 0.2.0',
    cniVersion: '0.2.0',
    ipam: { ...v4('10.1.0.0/24'), routes: [{ dst: '0.0.0.0/0' }, { dst: '192.168.0.0/16', gw: '10.1.0.254' }] },
    steps: [add('c1')],
  },
  { name: 'routes 1.0.0', ipam: { ...v4('10.1.0.0/24'), routes: [{ dst: '0.0.0.0/0', gw: '10.1.0.1' }] }, steps: [add('c1')] },
  // host-local re-renders every route through Go's IP types (issue 8.7).
  {
    name: 'routes re-rendered: upper case, uncompressed IPv6, a GW key in capitals',
    ipam: { ...v4('10.1.0.0/24'), routes: [{ dst: 'FD00:0::/8' }, { dst: 'fd00::1/64', gw: 'FD00:0:0::0001' }, { dst: '2001:DB8::/32', GW: '2001:db8::1' }] },
    steps: [add('c1')],
  },
  { name: 'routes keep host bits; a zero-padded prefix; an empty gw', ipam: { ...v4('10.1.0.0/24'), routes: [{ dst: '10.1.0.5/24', gw: '10.1.0.1' }, { dst: '0.0.0.0/00' }, { dst: '::/0', gw: '' }] }, steps: [add('c1')] },
  {
    name: 'routes with IPv4-mapped and IPv4-compatible addresses',
    ipam: { ...v4('10.1.0.0/24'), routes: [{ dst: '::ffff:10.1.0.0/104', gw: '::ffff:10.1.0.1' }, { dst: '::ffff:10.1.0.0/80' }, { dst: '1.2.3.4/32', gw: '::1.2.3.4' }] },
    steps: [add('c1')],
  },
  {
    name: 'routes split by family in 0.2.0 after re-rendering (a mapped dst is IPv4)',
    cniVersion: '0.2.0',
    ipam: { ranges: [[{ subnet: '10.1.0.0/24' }], [{ subnet: 'fd00:1::/120' }]], routes: [{ dst: '::FFFF:10.9.0.0/112' }, { dst: 'FD00:0::/8', gw: 'FD00:1::1' }] },
    steps: [add('c1')],
  },
  { name: 'round robin continues after last_reserved_ip.0', ipam: v4('10.1.0.0/24'), disk: { 'last_reserved_ip.0': '10.1.0.5' }, steps: [add('c1'), add('c2')], expectIPs: ['10.1.0.6', '10.1.0.7'] },
  { name: 'round robin wraps at rangeEnd, skipping the gateway', ipam: v4('10.1.0.0/29'), disk: { 'last_reserved_ip.0': '10.1.0.6' }, steps: [add('c1')], expectIPs: ['10.1.0.2'] },
  { name: 'last_reserved_ip outside the set restarts at rangeStart', ipam: v4('10.1.0.0/24'), disk: { 'last_reserved_ip.0': '192.168.1.1' }, steps: [add('c1')], expectIPs: ['10.1.0.2'] },
  { name: 'garbage last_reserved_ip is ignored', ipam: v4('10.1.0.0/24'), disk: { 'last_reserved_ip.0': 'not-an-ip' }, steps: [add('c1')] },
  { name: 'gateway in the middle is skipped', ipam: v4('10.1.0.0/24', { gateway: '10.1.0.10' }), disk: { 'last_reserved_ip.0': '10.1.0.9' }, steps: [add('c1')], expectIPs: ['10.1.0.11'] },
  { name: 'rangeStart/rangeEnd bounds', ipam: v4('10.1.0.0/24', { rangeStart: '10.1.0.100', rangeEnd: '10.1.0.102' }), steps: [add('c1'), add('c2'), add('c3'), add('c4')] },
  {
    name: 'one set of two ranges: moves to the next range',
    ipam: { ranges: [[{ subnet: '10.10.10.0/24', rangeStart: '10.10.10.20', rangeEnd: '10.10.10.22' }, { subnet: '10.20.20.0/24', rangeStart: '10.20.20.20', rangeEnd: '10.20.20.21' }]] },
    steps: [add('c1'), add('c2'), add('c3'), add('c4'), add('c5'), add('c6')],
  },
  {
    name: 'BR-16 A: two range sets, the second exhausts and the first is rolled back',
    ipam: { ranges: [[{ subnet: '10.10.10.0/24', rangeStart: '10.10.10.20', rangeEnd: '10.10.10.22' }], [{ subnet: '10.20.20.0/24', rangeStart: '10.20.20.20', rangeEnd: '10.20.20.21' }]] },
    steps: [add('c1'), add('c2'), add('c3')],
  },
  { name: 'exhausted /29', ipam: v4('10.22.0.0/29'), disk: { '10.22.0.2': 'a|eth0', '10.22.0.3': 'b|eth0', '10.22.0.4': 'c|eth0', '10.22.0.5': 'd|eth0', '10.22.0.6': 'e|eth0' }, steps: [add('c6')] },
  { name: 'exhausted /30 (only .2 allocatable)', ipam: v4('10.1.0.0/30'), steps: [add('c1'), add('c2')] },
  { name: 'BR-24 A: /16 range across an octet boundary', ipam: v4('10.1.0.0/16', { rangeStart: '10.1.2.254', rangeEnd: '10.1.3.1' }), steps: [add('c1'), add('c2'), add('c3'), add('c4'), add('c5')] },
  { name: 'static IP via CNI_ARGS', ipam: v4('10.1.0.0/24'), steps: [add('c1', 'eth0', { args: 'IP=10.1.0.77' })], expectIPs: ['10.1.0.77'] },
  { name: 'static IP with prefix via CNI_ARGS', ipam: v4('10.1.0.0/24'), steps: [add('c1', 'eth0', { args: 'IgnoreUnknown=1;K8S_POD_NAME=p;IP=10.1.0.78/24' })] },
  { name: 'static IP via args.cni.ips', ipam: v4('10.1.0.0/24'), extra: { args: { cni: { ips: ['10.1.0.79'] } } }, steps: [add('c1')] },
  { name: 'static IP via runtimeConfig.ips', ipam: v4('10.1.0.0/24'), extra: { runtimeConfig: { ips: ['10.1.0.80/24'] } }, steps: [add('c1')] },
  { name: 'static IP already taken', ipam: v4('10.1.0.0/24'), disk: { '10.1.0.77': 'other|eth0' }, steps: [add('c1', 'eth0', { args: 'IP=10.1.0.77' })] },
  { name: 'static IP is the gateway', ipam: v4('10.1.0.0/24'), steps: [add('c1', 'eth0', { args: 'IP=10.1.0.1' })] },
  { name: 'static IP outside every range set', ipam: v4('10.1.0.0/24'), steps: [add('c1', 'eth0', { args: 'IP=10.9.0.5' })] },
  { name: 'CNI_ARGS unknown key without IgnoreUnknown', ipam: v4('10.1.0.0/24'), steps: [add('c1', 'eth0', { args: 'K8S_POD_NAME=x' })], allow: ['errorCode'] },
  { name: 'Kubernetes CNI_ARGS with IgnoreUnknown', ipam: v4('10.1.0.0/24'), steps: [add('c1', 'eth0', { args: 'IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;K8S_POD_INFRA_CONTAINER_ID=c1;K8S_POD_UID=u' })] },
  { name: 'legacy top-level subnet form', ipam: { subnet: '10.3.0.0/24', rangeStart: '10.3.0.50' }, steps: [add('c1')] },
  { name: 'legacy top-level range is prepended to ranges', ipam: { subnet: '10.3.0.0/24', ranges: [[{ subnet: '10.4.0.0/24' }]] }, steps: [add('c1')] },
  { name: 'runtimeConfig.ipRanges is prepended', ipam: v4('10.1.0.0/24'), extra: { runtimeConfig: { ipRanges: [[{ subnet: '10.5.0.0/24' }]] } }, steps: [add('c1')] },
  { name: '/31 refused', ipam: v4('10.1.0.0/31'), steps: [add('c1')], allow: ['errorCode'] },
  { name: '/32 refused', ipam: v4('10.1.0.1/32'), steps: [add('c1')], allow: ['errorCode'] },
  { name: 'host bits set', ipam: v4('10.1.0.5/24'), steps: [add('c1')], allow: ['errorCode'] },
  { name: 'rangeStart outside the subnet', ipam: v4('10.1.0.0/24', { rangeStart: '10.2.0.5' }), steps: [add('c1')], allow: ['errorCode'] },
  { name: 'overlapping range sets', ipam: { ranges: [[{ subnet: '10.10.10.0/24' }], [{ subnet: '10.10.10.0/24' }]] }, steps: [add('c1')], allow: ['errorCode'] },
  { name: 'mixed families in one set', ipam: { ranges: [[{ subnet: '10.10.10.0/24' }, { subnet: 'fd00::/64' }]] }, steps: [add('c1')], allow: ['errorCode'] },
  { name: 'no ranges', ipam: { ranges: [] }, steps: [add('c1')], allow: ['errorCode'] },
  { name: '0.2.0 refuses two IPv4 range sets', cniVersion: '0.2.0', ipam: { ranges: [[{ subnet: '10.1.0.0/24' }], [{ subnet: '10.2.0.0/24' }]] }, steps: [add('c1')], allow: ['errorCode'] },
  { name: 'DEL releases the owner (id + ifname)', ipam: v4('10.1.0.0/24'), disk: { '10.1.0.2': 'c1|eth0', '10.1.0.3': 'c2|eth0', 'last_reserved_ip.0': '10.1.0.3' }, steps: [del('c1')] },
  { name: 'DEL of a legacy ID-only record', ipam: v4('10.1.0.0/24'), disk: { '10.1.0.4': 'c9' }, steps: [del('c9')] },
  { name: 'DEL keeps the other interface of the same container', ipam: v4('10.1.0.0/24'), disk: { '10.1.0.2': 'c1|eth0', '10.1.0.3': 'c1|eth1' }, steps: [del('c1', 'eth1')] },
  { name: 'DEL of an unknown container is a no-op', ipam: v4('10.1.0.0/24'), disk: { '10.1.0.2': 'c1|eth0' }, steps: [del('nobody'), del('nobody')] },
  { name: 'DEL on a network without a directory succeeds', ipam: v4('10.1.0.0/24'), steps: [del('c1')], allow: ['noDir'] },
  { name: 'DEL then ADD continues round robin (BR-08 d)', ipam: v4('10.4.0.0/24'), disk: { '10.4.0.2': 'default-c1|eth0', '10.4.0.4': 'default-c9', 'last_reserved_ip.0': '10.4.0.2' }, steps: [del('default-c1'), add('default-c1')] },
  { name: 'BR-08 b: a second ifname of the same container gets a new address', ipam: v4('10.4.0.0/24'), disk: { '10.4.0.2': 'default-c1|eth0', 'last_reserved_ip.0': '10.4.0.2' }, steps: [add('default-c1', 'eth1')] },
  { name: 'CHECK finds the reservation (0.4.0)', cniVersion: '0.4.0', ipam: v4('10.1.0.0/24'), disk: { '10.1.0.2': 'c1|eth0' }, steps: [{ command: 'CHECK', containerId: 'c1', ifname: 'eth0' }] },
  { name: 'CHECK of a container without reservation', cniVersion: '0.4.0', ipam: v4('10.1.0.0/24'), steps: [{ command: 'CHECK', containerId: 'c1', ifname: 'eth0' }], allow: ['checkMsg', 'noDir'] },
  { name: 'CHECK refused below 0.4.0', cniVersion: '0.3.1', ipam: v4('10.1.0.0/24'), steps: [{ command: 'CHECK', containerId: 'c1', ifname: 'eth0' }] },
  { name: 'IPv6 /64 defaults', ipam: v4('fd00:20::/64'), steps: [add('c1')], expectIPs: ['fd00:20::2'] },
  { name: 'IPv6 wraps at the last address of a /120', ipam: v4('fd00:20::/120'), disk: { 'last_reserved_ip.0': 'fd00:20::ff' }, steps: [add('c1')], expectIPs: ['fd00:20::2'] },
  { name: 'BR-08 a: repeated ADD for the same ID and ifname', ipam: v4('10.4.0.0/24'), disk: { '10.4.0.2': 'default-c1|eth0', 'last_reserved_ip.0': '10.4.0.2' }, steps: [add('default-c1')], allow: ['reAdd'] },
  { name: 'BR-08 c: legacy record matches by ID alone on re-ADD', ipam: v4('10.4.0.0/24'), disk: { '10.4.0.4': 'default-c9', 'last_reserved_ip.0': '10.4.0.4' }, steps: [add('default-c9')], allow: ['reAdd'] },
  { name: 'invalid JSON on stdin', ipam: v4('10.1.0.0/24'), steps: [{ ...add('c1'), stdin: '{bad' }], allow: ['decodeMsg'] },
  { name: 'missing CNI_NETNS and CNI_PATH', ipam: v4('10.1.0.0/24'), steps: [add('c1', 'eth0', { netns: '', path: '' })] },
  { name: 'invalid container ID', ipam: v4('10.1.0.0/24'), steps: [add('-bad')] },
  { name: 'ifname with a slash', ipam: v4('10.1.0.0/24'), steps: [add('c1', 'eth0/x')] },
  { name: 'ifname too long', ipam: v4('10.1.0.0/24'), steps: [add('c1', 'abcdefghijklmnop')] },
  { name: 'unknown CNI_COMMAND', ipam: v4('10.1.0.0/24'), steps: [{ command: 'FOO', containerId: 'c1', ifname: 'eth0' }] },
  { name: 'unsupported cniVersion', cniVersion: '9.9.9', ipam: v4('10.1.0.0/24'), steps: [add('c1')] },
  { name: 'network name with a slash', ipam: v4('10.1.0.0/24'), extra: { name: 'bad/name' }, steps: [add('c1')] },
];

function writeDisk(dir: string, disk: Record<string, string> | undefined): void {
  if (disk === undefined) return;
  mkdirSync(dir, { recursive: true });
  for (const [name, v] of Object.entries(disk)) {
    const content = name.startsWith('last_reserved_ip') ? v : v.replace('|', '\r\n');
    writeFileSync(join(dir, name), content);
  }
}

/** Inode numbers of DIR's entries (to tell the files a run wrote from the planted ones). */
function inodes(dir: string): Map<string, number> {
  const out = new Map<string, number>();
  if (!existsSync(dir)) return out;
  for (const n of readdirSync(dir)) out.set(n, lstatSync(join(dir, n)).ino);
  return out;
}

/**
 * Modes of the reservation and `last_reserved_ip.<N>` files ipwarden wrote in DIR during the case
 * (a new name or a new inode: it always writes a temporary file and links or renames it).
 */
function writtenModes(dir: string, before: Map<string, number>): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [n, ino] of inodes(dir)) {
    if (n === 'lock' || n.endsWith('/') || before.get(n) === ino) continue;
    if (!/^[0-9a-f.:]+$/.test(n) && !n.startsWith('last_reserved_ip.')) continue;
    out[n] = (lstatSync(join(dir, n)).mode & 0o7777).toString(8);
  }
  return out;
}

const isEmptyDNS = (d: unknown): boolean => d !== null && typeof d === 'object' && !Array.isArray(d) && Object.keys(d).length === 0;

/**
 * Current upstream omits an empty `dns` from 1.0.0/1.1.0 results; Debian's 1.1.1 prints `{}`.
 * Asserts ipwarden's side has no `dns` key exactly when upstream's is empty, then drops
 * upstream's for the parity comparison. Other versions and error objects: unchanged.
 */
function checkDNS(mine: Outcome, up: Outcome, cniVersion: string, what: string): Outcome {
  if (up.json === null || mine.json === null || 'code' in up.json || !['1.0.0', '1.1.0'].includes(cniVersion)) return up;
  if (!isEmptyDNS(up.json['dns'])) return up;
  assert.equal(Object.hasOwn(mine.json, 'dns'), false, `${what}: a 1.x result with empty DNS has no "dns" key: ${mine.stdout}`);
  const j = { ...up.json };
  delete j['dns'];
  return { ...up, json: j };
}

/** Normalise one outcome for comparison under the case's allowances. */
function normalise(o: Outcome, allow: readonly Allow[], who: 'up' | 'ours', command: string): unknown {
  const j = o.json === null ? null : { ...o.json };
  if (j !== null && 'code' in j) {
    delete j['cniVersion'];
    // ipwarden adds a breakdown in `details` where host-local has none (docs/compatibility.md).
    if (who === 'ours' && typeof j['details'] === 'string' && String(j['msg']).includes('no IP addresses available')) delete j['details'];
    if (allow.includes('errorCode')) delete j['code'];
    if (allow.includes('decodeMsg')) j['msg'] = String(j['msg']).replace(/^(error unmarshall network config: ).*$/, '$1…');
    if (typeof j['details'] === 'string') j['details'] = String(j['details']).replace(' "1.1.0"]', ']');
    if (allow.includes('checkMsg') && command === 'CHECK') j['msg'] = String(j['msg']).replace(/^(host-local|ipwarden): /, '');
  }
  if (j !== null && Array.isArray(j['supportedVersions'])) {
    j['supportedVersions'] = (j['supportedVersions'] as string[]).filter((v) => v !== '1.1.0');
    delete j['cniVersion'];
  }
  return { exitCode: o.exitCode, json: j };
}

describe('differential: ipwarden vs upstream host-local', () => {
  const skip = requireOrSkip(haveHostLocal(), `upstream host-local at ${HOST_LOCAL}`);
  let ours = '';
  const temps: Array<() => void> = [];
  before(() => {
    if (!skip) ours = installedPlugin();
  });
  after(() => temps.forEach((c) => c()));

  it(`has at least 40 cases (${cases.length})`, () => assert.ok(cases.length >= 40));

  /** What the cases checked of the two newer-upstream rules (so they cannot pass vacuously). */
  const writes = { files: 0, lastReserved: 0, emptyDNS: 0 };

  for (const c of cases) {
    it(c.name, { skip }, () => {
      const allow = c.allow ?? [];
      const tUp = tempDir('ipw-diff-up-');
      const tOurs = tempDir('ipw-diff-ours-');
      temps.push(tUp.cleanup, tOurs.cleanup);
      const name = typeof c.extra?.['name'] === 'string' ? (c.extra['name'] as string) : NET;
      const config = (dataDir: string, type: string) => ({
        cniVersion: c.cniVersion ?? '1.0.0',
        name,
        ...(c.extra ?? {}),
        ipam: { type, dataDir, ...c.ipam },
      });
      writeDisk(join(tUp.dir, NET), c.disk);
      writeDisk(join(tOurs.dir, NET), c.disk);
      const planted = inodes(join(tOurs.dir, NET));
      const gotIPs: string[] = [];
      let sawEmptyDNS = false;
      for (const step of c.steps) {
        const up = runCni(HOST_LOCAL, { ...step, stdin: step.stdin ?? config(tUp.dir, 'host-local') });
        const mine = runCni(ours, { ...step, stdin: step.stdin ?? config(tOurs.dir, 'ipwarden') });
        assert.equal(mine.stderr.includes('internal error'), false, mine.stderr);
        if (allow.includes('reAdd') && step.command === 'ADD') {
          // Documented difference: host-local refuses, ipwarden returns the existing reservation.
          assert.equal(up.exitCode, 1);
          assert.match(String(up.json?.['msg']), /duplicate allocation is not allowed$/);
          assert.equal(mine.exitCode, 0, mine.stdout);
          continue;
        }
        const what = `step ${step.command} ${step.containerId ?? ''}`;
        const upNow = checkDNS(mine, up, c.cniVersion ?? '1.0.0', what);
        if (upNow !== up) sawEmptyDNS = true;
        assert.deepEqual(normalise(mine, allow, 'ours', step.command), normalise(upNow, allow, 'up', step.command), what);
        // The document's framing is skel's: indented by 4 spaces, no trailing newline (results and errors).
        if (up.stdout !== '') assert.deepEqual([mine.stdout.startsWith('{\n    "'), mine.stdout.endsWith('\n}')], [up.stdout.startsWith('{\n    "'), up.stdout.endsWith('\n}')], `${what}: framing`);
        const ips = (mine.json?.['ips'] as Array<{ address: string }> | undefined) ?? [];
        for (const ip of ips) gotIPs.push(ip.address.split('/')[0] ?? '');
        const ip4 = mine.json?.['ip4'] as { ip: string } | undefined;
        if (ip4 !== undefined) gotIPs.push(ip4.ip.split('/')[0] ?? '');
      }
      const upFiles = snapshotDir(join(tUp.dir, NET));
      const ourFiles = snapshotDir(join(tOurs.dir, NET));
      // Current upstream's modes, whatever Debian's 1.1.1 wrote: 0600 for every file ipwarden wrote.
      const modes = writtenModes(join(tOurs.dir, NET), planted);
      assert.deepEqual(modes, Object.fromEntries(Object.keys(modes).map((n) => [n, '600'])));
      writes.files += Object.keys(modes).length;
      writes.lastReserved += Object.keys(modes).filter((n) => n.startsWith('last_reserved_ip.')).length;
      if (sawEmptyDNS) writes.emptyDNS++;
      if (allow.includes('reAdd')) {
        // Documented difference: the re-ADD claims a legacy ID-only record for its ifname.
        for (const [name, content] of Object.entries(ourFiles)) {
          const step = c.steps.find((st) => st.command === 'ADD' && upFiles[name] === st.containerId && content === `${st.containerId}\r\n${st.ifname}`);
          if (step !== undefined) ourFiles[name] = upFiles[name] as string;
        }
      }
      if (allow.includes('noDir') && Object.keys(ourFiles).length === 0 && JSON.stringify(upFiles) === '{"lock":""}') return;
      assert.deepEqual(ourFiles, upFiles);
      if (c.expectIPs !== undefined) assert.deepEqual(gotIPs.slice(0, c.expectIPs.length), c.expectIPs);
    });
  }

  it('VERSION: host-local\'s exact bytes (compact JSON and a newline, Go\'s json.Encoder), with 1.1.0 added to the list', { skip }, () => {
    // host-local always answers its own 1.0.0; ipwarden the asked version when it speaks it, else
    // its newest (SPEC.md §VERSION; docs/compatibility.md).
    for (const [stdin, answered] of [['{"cniVersion":"1.0.0"}', '1.0.0'], ['{"cniVersion":"0.3.1"}', '0.3.1'], ['', '1.1.0']] as const) {
      const up = runCni(HOST_LOCAL, { command: 'VERSION', stdin });
      const mine = runCni(ours, { command: 'VERSION', stdin });
      assert.equal(up.stdout, '{"cniVersion":"1.0.0","supportedVersions":["0.1.0","0.2.0","0.3.0","0.3.1","0.4.0","1.0.0"]}\n');
      const want = up.stdout.replace('"cniVersion":"1.0.0"', `"cniVersion":"${answered}"`).replace(/\]\}\n$/, ',"1.1.0"]}\n');
      assert.deepEqual([mine.exitCode, mine.stdout, mine.stderr], [up.exitCode, want, ''], stdin);
    }
  });

  it('the cases checked the 0600 mode of written files and the absent "dns" of 1.x results', { skip }, (t) => {
    t.diagnostic(`files written ${writes.files} (last_reserved_ip ${writes.lastReserved}); cases with a 1.x empty-DNS result ${writes.emptyDNS}`);
    assert.ok(writes.files >= 40, `files ${writes.files}`);
    assert.ok(writes.lastReserved >= 20, `last_reserved_ip files ${writes.lastReserved}`);
    assert.ok(writes.emptyDNS >= 20, `1.x results with empty DNS ${writes.emptyDNS}`);
  });
});
