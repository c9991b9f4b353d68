/**
 * `ipwarden status` in-process through `runMain`, on prepared CNI configuration and data
 * directories (raw reservation files, mtimes set with utimesSync) and a fake runtime sandbox list.
 * Field reports BR-20 (a full range of leaks) and BR-23 (a genuinely full range) with exact numbers.
 */
import { afterEach, beforeEach, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { NOTHING_IN_USE, unreadableEvidence, type UseEvidence } from '../../src/reconcile/evidence.ts';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, utimesSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { AppError } from '../../src/common/errors.ts';
import type { CliContext } from '../../src/cli/context.ts';
import { runMain } from '../../src/cli/main.ts';
import { runtimeLine } from '../../src/cli/status.ts';
import type { RuntimeJson } from '../../src/reconcile/snapshot.ts';
import { DEFAULT_RUNTIME_ENDPOINTS } from '../../src/runtime/endpoint.ts';
import type { SandboxInfo } from '../../src/reconcile/sandboxes.ts';

const SNAP = Date.UTC(2025, 0, 1);
const ENDPOINT = 'unix:///run/fake-cri.sock';
const HOUR = 3600;

let root: string;
let confDir: string;
let dataDir: string;
beforeEach(() => {
  root = mkdtempSync(join(tmpdir(), 'ipwarden-status-'));
  confDir = join(root, 'net.d');
  dataDir = join(root, 'networks');
  mkdirSync(confDir);
  mkdirSync(dataDir);
});
afterEach(() => {
  rmSync(root, { recursive: true, force: true });
});

function conf(file: string, doc: unknown): void {
  writeFileSync(join(confDir, file), typeof doc === 'string' ? doc : JSON.stringify(doc));
}

function reserve(network: string, ip: string, content: string, ageSeconds: number, dir: string = dataDir): void {
  const d = join(dir, network);
  mkdirSync(d, { recursive: true });
  writeFileSync(join(d, ip), content);
  const t = (SNAP - ageSeconds * 1000) / 1000;
  utimesSync(join(d, ip), t, t);
}

interface Run {
  code: number;
  stdout: string;
  stderr: string;
  asks: number;
}

async function cli(argv: string[], live: readonly string[] | 'unreachable', evidence: UseEvidence = NOTHING_IN_USE): Promise<Run> {
  let stdout = '';
  let stderr = '';
  let asks = 0;
  const ctx: CliContext = {
    stdout: (t) => void (stdout += t),
    stderr: (t) => void (stderr += t),
    env: { CONTAINER_RUNTIME_ENDPOINT: ENDPOINT },
    now: () => SNAP,
    evidence: () => evidence,
    sandboxSource: (endpoint) => ({
      endpoint,
      list: async (): Promise<SandboxInfo[]> => {
        asks++;
        if (live === 'unreachable') {
          throw new AppError('RUNTIME_UNAVAILABLE', 'cannot connect to the runtime at unix:///run/fake-cri.sock: ENOENT');
        }
        return live.map((id) => ({ id, state: 'ready' as const }));
      },
    }),
  };
  const code = await runMain(argv, ctx);
  return { code, stdout, stderr, asks };
}

/** `status` with no runtime configured at all (no flag, no CONTAINER_RUNTIME_ENDPOINT): the default sockets decide. */
async function cliNoRuntime(argv: string[]): Promise<Omit<Run, 'asks'>> {
  let stdout = '';
  let stderr = '';
  const ctx: CliContext = { stdout: (t) => void (stdout += t), stderr: (t) => void (stderr += t), env: {}, now: () => SNAP, evidence: () => NOTHING_IN_USE };
  const code = await runMain(argv, ctx);
  return { code, stdout, stderr };
}

/** BR-20: cbr0 10.42.1.0/28, 13 of 13 reserved, owners d2..d14 except .5 l5, .9 l9, .12 l12. */
function br20(): void {
  conf('10-cbr0.conflist', {
    cniVersion: '1.0.0',
    name: 'cbr0',
    plugins: [
      { type: 'bridge', bridge: 'cni0', ipam: { type: 'host-local', ranges: [[{ subnet: '10.42.1.0/28' }]] } },
      { type: 'portmap', capabilities: { portMappings: true } },
    ],
  });
  for (let i = 2; i <= 14; i++) {
    const owner = i === 5 || i === 9 || i === 12 ? `l${i}` : `d${i}`;
    reserve('cbr0', `10.42.1.${i}`, `${owner}\r\neth0`, 2 * HOUR);
  }
  writeFileSync(join(dataDir, 'cbr0', 'last_reserved_ip.0'), '10.42.1.14');
}
const BR20_LIVE = ['l5', 'l9', 'l12'];

/** BR-23: kubenet 10.244.1.0/29, .2-.6 reserved by c1..c5. */
function br23(): void {
  conf('kubenet.conf', { cniVersion: '1.0.0', name: 'kubenet', type: 'bridge', ipam: { type: 'host-local', ranges: [[{ subnet: '10.244.1.0/29' }]] } });
  for (let i = 1; i <= 5; i++) reserve('kubenet', `10.244.1.${i + 1}`, `c${i}\r\neth0`, HOUR);
}
const BR23_LIVE = ['c1', 'c2', 'c3', 'c4', 'c5'];

const counts = (reserved: number, live: number | null, grace: number | null, leaked: number | null, corrupt: number) => ({
  reserved,
  live,
  grace,
  leaked,
  corrupt,
});

const NONE_FOUND = 'no CRI runtime found: none of /run/containerd/containerd.sock, /var/run/crio/crio.sock exists; set --runtime-endpoint or CONTAINER_RUNTIME_ENDPOINT';

describe('the runtime line of status', () => {
  const cases: Array<[string, RuntimeJson, string]> = [
    ['none found: what to set, not "-"', { endpoint: null, sandboxes: null, error: NONE_FOUND }, 'runtime: none found (none of /run/containerd/containerd.sock, /var/run/crio/crio.sock exists; set --runtime-endpoint or CONTAINER_RUNTIME_ENDPOINT)\n'],
    ['none found, another error text: kept whole', { endpoint: null, sandboxes: null, error: 'something else' }, 'runtime: none found (something else)\n'],
    ['none found, no error text', { endpoint: null, sandboxes: null }, 'runtime: none found\n'],
    ['not reachable', { endpoint: ENDPOINT, sandboxes: null, error: 'ENOENT' }, `runtime ${ENDPOINT}: not reachable: ENOENT\n`],
    ['one sandbox', { endpoint: ENDPOINT, sandboxes: 1 }, `runtime ${ENDPOINT}: 1 sandbox\n`],
    ['three sandboxes', { endpoint: ENDPOINT, sandboxes: 3 }, `runtime ${ENDPOINT}: 3 sandboxes\n`],
  ];
  for (const [name, rt, want] of cases) it(name, () => assert.equal(runtimeLine(rt), want));
});

describe('ipwarden status', () => {
  const defaultSocket = DEFAULT_RUNTIME_ENDPOINTS.find((p) => existsSync(p));
  it('no runtime found: "runtime: none found (…)" in the table and the page, the JSON unchanged (endpoint null), exit 1', { skip: defaultSocket === undefined ? false : `a default runtime socket exists here (${defaultSocket})` }, async () => {
    br20();
    const t = await cliNoRuntime(['status', '--cni-conf-dir', confDir, '--data-dir', dataDir]);
    assert.equal(t.code, 1);
    assert.equal(t.stdout.split('\n')[0], 'runtime: none found (none of /run/containerd/containerd.sock, /var/run/crio/crio.sock exists; set --runtime-endpoint or CONTAINER_RUNTIME_ENDPOINT)');
    assert.equal(t.stderr, `ipwarden: runtime not reachable: ${NONE_FOUND}; live, grace and leaked are unknown\n`);
    const j = await cliNoRuntime(['status', '--cni-conf-dir', confDir, '--data-dir', dataDir, '--json']);
    assert.deepEqual(JSON.parse(j.stdout).runtime, { endpoint: null, sandboxes: null, error: NONE_FOUND });
    const h = await cliNoRuntime(['status', '--cni-conf-dir', confDir, '--data-dir', dataDir, '--html', '-']);
    assert.ok(
      h.stdout.includes('<p class="meta" id="runtime" data-verdicts="false">runtime: none found (none of /run/containerd/containerd.sock, /var/run/crio/crio.sock exists; set --runtime-endpoint or CONTAINER_RUNTIME_ENDPOINT): live, grace and leaked are unknown</p>'),
      h.stdout.slice(0, 2000),
    );
  });

  it('BR-20: 13 of 13 reserved in 10.42.1.1-10.42.1.14, 3 live, 10 leaked, 0 free (exact JSON)', async () => {
    br20();
    const r = await cli(['status', '--cni-conf-dir', confDir, '--data-dir', dataDir, '--json'], BR20_LIVE);
    assert.equal(r.stderr, '');
    assert.equal(r.code, 0);
    assert.equal(r.asks, 1);
    assert.deepEqual(JSON.parse(r.stdout), {
      runtime: { endpoint: ENDPOINT, sandboxes: 3 },
      kernel: { complete: true, incomplete: null, addresses: 0 },
      verdicts: true,
      graceSeconds: 300,
      cniConfDir: confDir,
      dataDirs: [dataDir],
      networks: [
        {
          name: 'cbr0',
          config: { file: join(confDir, '10-cbr0.conflist'), ipamType: 'host-local' },
          dataDir,
          dir: join(dataDir, 'cbr0'),
          dirExists: true,
          skipped: null,
          rangeSets: [
            {
              index: 0,
              range: '10.42.1.1-10.42.1.14',
              ranges: [{ subnet: '10.42.1.0/28', rangeStart: '10.42.1.1', rangeEnd: '10.42.1.14', gateway: '10.42.1.1' }],
              capacity: 13,
              ...counts(13, 3, 0, 10, 0),
              free: 0,
            },
          ],
          outside: counts(0, 0, 0, 0, 0),
          total: counts(13, 3, 0, 10, 0),
        },
      ],
      configErrors: [],
      poolNetworks: [],
    });
  });

  it('incomplete kernel evidence (not root): live/grace/leaked unknown, said on stderr, exit 1 — never a silent undercount (issue 7)', async () => {
    br20();
    const r = await cli(['status', '--cni-conf-dir', confDir, '--data-dir', dataDir], BR20_LIVE, unreadableEvidence('not running as root (euid 65534)'));
    assert.equal(r.code, 1);
    assert.equal(r.stdout.split('\n')[2], 'cbr0     0    10.42.1.1-10.42.1.14  13        13        ?     ?      ?       0        0');
    assert.equal(r.stderr, 'ipwarden: kernel evidence incomplete (not running as root (euid 65534)); live, grace and leaked are unknown\n');
  });

  it('BR-20 table', async () => {
    br20();
    const r = await cli(['status', '--cni-conf-dir', confDir, '--data-dir', dataDir], BR20_LIVE);
    assert.equal(r.code, 0);
    assert.equal(
      r.stdout,
      [
        `runtime ${ENDPOINT}: 3 sandboxes`,
        'NETWORK  SET  RANGE                 CAPACITY  RESERVED  LIVE  GRACE  LEAKED  CORRUPT  FREE',
        'cbr0     0    10.42.1.1-10.42.1.14  13        13        3     0      10      0        0',
        '',
      ].join('\n'),
    );
  });

  it('BR-23: 5 of 5 reserved in 10.244.1.1-10.244.1.6, all live, nothing leaked, 0 free', async () => {
    br23();
    const r = await cli(['status', '--cni-conf-dir', confDir, '--data-dir', dataDir, '--json'], BR23_LIVE);
    assert.equal(r.code, 0);
    const doc = JSON.parse(r.stdout);
    assert.deepEqual(doc.networks[0].rangeSets[0], {
      index: 0,
      range: '10.244.1.1-10.244.1.6',
      ranges: [{ subnet: '10.244.1.0/29', rangeStart: '10.244.1.1', rangeEnd: '10.244.1.6', gateway: '10.244.1.1' }],
      capacity: 5,
      ...counts(5, 5, 0, 0, 0),
      free: 0,
    });
    // BR-23 second step: only c3..c5 live -> .2 and .3 leaked.
    const r2 = await cli(['status', '--cni-conf-dir', confDir, '--data-dir', dataDir, '--json'], ['c3', 'c4', 'c5']);
    assert.deepEqual(JSON.parse(r2.stdout).networks[0].total, counts(5, 3, 0, 2, 0));
  });

  it('mixed node: grace, corrupt, outside ranges, a directory without config, a config without directory, config errors, data dirs from configs', async () => {
    const other = join(root, 'other-data');
    // a: ipwarden IPAM, two range sets, its own dataDir (no --data-dir on the command line)
    conf('20-a.conflist', {
      cniVersion: '1.0.0',
      name: 'a',
      plugins: [{ type: 'ptp', ipam: { type: 'ipwarden', dataDir: other, ranges: [[{ subnet: '10.1.0.0/29' }], [{ subnet: 'fd00:1::/120', rangeStart: 'fd00:1::10', rangeEnd: 'fd00:1::1f' }]] } }],
    });
    // b: configured, no directory yet
    conf('30-b.conf', { cniVersion: '0.4.0', name: 'b', type: 'bridge', ipam: { type: 'host-local', subnet: '10.2.0.0/30', dataDir: other } });
    // dhcp: not a host-local format network, not shown
    conf('40-dhcp.json', { cniVersion: '1.0.0', name: 'dhcp', type: 'macvlan', ipam: { type: 'dhcp' } });
    // broken files
    conf('50-broken.conflist', '{"name": ');
    conf('60-badrange.conf', { cniVersion: '1.0.0', name: 'bad', type: 'bridge', ipam: { type: 'host-local', ranges: [[{ subnet: '10.9.0.0/31' }]] } });
    conf('70-dup.conflist', { cniVersion: '1.0.0', name: 'a', plugins: [{ type: 'bridge', ipam: { type: 'host-local', dataDir: other, subnet: '10.3.0.0/24' } }] });
    conf('README.md', 'not a config');
    // p: a cluster pool network: its addresses are in etcd, never counted as a free node-local range (trial finding 9)
    conf('80-pool.conf', { cniVersion: '1.0.0', name: 'p', type: 'macvlan', ipam: { type: 'ipwarden', ranges: [[{ subnet: '10.88.0.0/24' }]], dataDir: other, pool: { name: 'pp', etcd: { endpoints: ['http://127.0.0.1:1'] } } } });

    reserve('a', '10.1.0.2', 'live1\r\neth0', HOUR, other); // live
    reserve('a', '10.1.0.3', 'gone\r\neth0', 60, other); // grace (60 s < 5m)
    reserve('a', '10.1.0.4', '', HOUR, other); // corrupt
    reserve('a', '10.1.0.1', 'odd\r\neth0', HOUR, other); // the gateway: outside
    reserve('a', '10.7.7.7', 'old\r\neth0', HOUR, other); // outside every range set, leaked
    reserve('a', 'fd00:1::10', 'live1\r\neth1', HOUR, other); // live, v6 set
    reserve('orphan', '10.5.0.9', 'gone\r\neth0', 10 * HOUR, other); // directory only, leaked
    reserve('elsewhere', '10.6.0.2', 'live1', HOUR); // in a data dir no config names: not searched

    const r = await cli(['status', '--cni-conf-dir', confDir, '--json'], ['live1']);
    assert.equal(r.code, 0);
    const doc = JSON.parse(r.stdout);
    assert.deepEqual(doc.dataDirs, [other]);
    const mine = doc.networks;
    assert.deepEqual(
      mine.map((n: { name: string }) => n.name),
      ['a', 'b', 'orphan'],
    );
    const [a, b, orphan] = mine;
    assert.deepEqual(a.config, { file: join(confDir, '20-a.conflist'), ipamType: 'ipwarden' });
    assert.deepEqual(
      a.rangeSets.map((s: Record<string, unknown>) => [s['range'], s['capacity'], s['reserved'], s['live'], s['grace'], s['leaked'], s['corrupt'], s['free']]),
      [
        ['10.1.0.1-10.1.0.6', 5, 3, 1, 1, 0, 1, 2],
        ['fd00:1::10-fd00:1::1f', 16, 1, 1, 0, 0, 0, 15],
      ],
    );
    assert.deepEqual(a.outside, counts(2, 0, 0, 2, 0));
    assert.deepEqual(a.total, counts(6, 2, 1, 2, 1));
    assert.deepEqual(b, {
      name: 'b',
      config: { file: join(confDir, '30-b.conf'), ipamType: 'host-local' },
      dataDir: other,
      dir: join(other, 'b'),
      dirExists: false,
      skipped: null,
      rangeSets: [
        {
          index: 0,
          range: '10.2.0.1-10.2.0.2',
          ranges: [{ subnet: '10.2.0.0/30', rangeStart: '10.2.0.1', rangeEnd: '10.2.0.2', gateway: '10.2.0.1' }],
          capacity: 1,
          ...counts(0, 0, 0, 0, 0),
          free: 1,
        },
      ],
      outside: counts(0, 0, 0, 0, 0),
      total: counts(0, 0, 0, 0, 0),
    });
    assert.equal(orphan.config, null);
    assert.deepEqual(orphan.rangeSets, []);
    assert.deepEqual(orphan.outside, counts(1, 0, 0, 1, 0));
    assert.deepEqual(doc.configErrors, [
      { file: join(confDir, '50-broken.conflist'), error: `not valid JSON: ${jsonError('{"name": ')}` },
      { file: join(confDir, '60-badrange.conf'), error: 'invalid host-local IPAM configuration: invalid range set 0: Network 10.9.0.0/31 too small to allocate from' },
      { file: join(confDir, '70-dup.conflist'), error: `network "a" is already defined in ${join(confDir, '20-a.conflist')}; ignored` },
    ]);
    assert.deepEqual(doc.poolNetworks, [{ file: join(confDir, '80-pool.conf'), name: 'p', pool: 'pp' }]);

    const t = await cli(['status', '--cni-conf-dir', confDir, '--data-dir', other], ['live1']);
    assert.equal(
      t.stdout,
      [
        `runtime ${ENDPOINT}: 1 sandbox`,
        'NETWORK  SET  RANGE                  CAPACITY  RESERVED  LIVE  GRACE  LEAKED  CORRUPT  FREE',
        'a        0    10.1.0.1-10.1.0.6      5         3         1     1      0       1        2',
        'a        1    fd00:1::10-fd00:1::1f  16        1         1     0      0       0        15',
        'a        -    (outside ranges)       -         2         0     0      2       0        -',
        'b        0    10.2.0.1-10.2.0.2      1         0         0     0      0       0        1',
        'orphan   -    (no config)            -         1         0     0      1       0        -',
        `network p (${join(confDir, '80-pool.conf')}) allocates from cluster pool pp: see ipwarden pool status --pool pp`,
        `config ${join(confDir, '50-broken.conflist')}: not valid JSON: ${jsonError('{"name": ')}`,
        `config ${join(confDir, '60-badrange.conf')}: invalid host-local IPAM configuration: invalid range set 0: Network 10.9.0.0/31 too small to allocate from`,
        `config ${join(confDir, '70-dup.conflist')}: network "a" is already defined in ${join(confDir, '20-a.conflist')}; ignored`,
        '',
      ].join('\n'),
    );
  });

  it('runtime unreachable: live/grace/leaked null in JSON and ? in the table, corrupt still counted, exit 1', async () => {
    br20();
    reserve('cbr0', '10.42.1.14', '', HOUR); // overwrite .14 with a corrupt record
    const j = await cli(['status', '--cni-conf-dir', confDir, '--data-dir', dataDir, '--json'], 'unreachable');
    assert.equal(j.code, 1);
    assert.equal(
      j.stderr,
      'ipwarden: runtime not reachable: cannot connect to the runtime at unix:///run/fake-cri.sock: ENOENT; live, grace and leaked are unknown\n',
    );
    const doc = JSON.parse(j.stdout);
    assert.deepEqual(doc.runtime, { endpoint: ENDPOINT, sandboxes: null, error: 'cannot connect to the runtime at unix:///run/fake-cri.sock: ENOENT' });
    assert.equal(doc.verdicts, false);
    const s = doc.networks[0].rangeSets[0];
    assert.deepEqual([s.capacity, s.reserved, s.live, s.grace, s.leaked, s.corrupt, s.free], [13, 13, null, null, null, 1, 0]);
    const t = await cli(['status', '--cni-conf-dir', confDir, '--data-dir', dataDir], 'unreachable');
    assert.equal(
      t.stdout,
      [
        `runtime ${ENDPOINT}: not reachable: cannot connect to the runtime at unix:///run/fake-cri.sock: ENOENT`,
        'NETWORK  SET  RANGE                 CAPACITY  RESERVED  LIVE  GRACE  LEAKED  CORRUPT  FREE',
        'cbr0     0    10.42.1.1-10.42.1.14  13        13        ?     ?      ?       1        0',
        '',
      ].join('\n'),
    );
  });

  it('IPv6 /64: capacity and free above 2^53 are decimal strings', async () => {
    conf('v6.conf', { cniVersion: '1.0.0', name: 'v6', type: 'bridge', ipam: { type: 'host-local', ranges: [[{ subnet: 'fd00:20::/64' }]] } });
    reserve('v6', 'fd00:20::2', 'x\r\neth0', HOUR);
    const r = await cli(['status', '--cni-conf-dir', confDir, '--data-dir', dataDir, '--json'], ['x']);
    const s = JSON.parse(r.stdout).networks[0].rangeSets[0];
    assert.equal(s.range, 'fd00:20::1-fd00:20::ffff:ffff:ffff:ffff');
    assert.equal(s.capacity, '18446744073709551614');
    assert.equal(s.free, '18446744073709551613');
  });

  it('--network: only that network; one that neither a config nor a directory has is exit 1', async () => {
    br20();
    br23();
    const r = await cli(['status', '--cni-conf-dir', confDir, '--data-dir', dataDir, '--network', 'kubenet', '--json'], BR23_LIVE);
    assert.equal(r.code, 0);
    assert.deepEqual(
      JSON.parse(r.stdout).networks.map((n: { name: string }) => n.name),
      ['kubenet'],
    );
    const missing = await cli(['status', '--cni-conf-dir', confDir, '--data-dir', dataDir, '--network', 'nope'], BR23_LIVE);
    assert.equal(missing.code, 1);
    assert.equal(missing.stderr, `ipwarden: no network nope: no configuration in ${confDir} and no directory in ${dataDir}\n`);
  });

  const usage: Array<{ name: string; argv: string[]; stderr: string }> = [
    { name: 'invalid network name', argv: ['--network', '../x'], stderr: 'ipwarden: invalid network name "../x"\n' },
    { name: 'bad grace', argv: ['--grace', '5 minutes'], stderr: 'ipwarden: --grace: invalid duration "5 minutes" (time: unknown unit " minutes" in duration "5 minutes")\n' },
    { name: 'bad endpoint', argv: ['--runtime-endpoint', 'tcp://x:1'], stderr: 'ipwarden: --runtime-endpoint: unsupported runtime endpoint "tcp://x:1": want unix:///path/to/socket or /path/to/socket\n' },
  ];
  usage.forEach((c) =>
    it(`usage error: ${c.name} (exit 2)`, async () => {
      const r = await cli(['status', '--cni-conf-dir', confDir, '--data-dir', dataDir, ...c.argv], []);
      assert.equal(r.code, 2);
      assert.equal(r.stderr, c.stderr);
    }),
  );

  it('--html writes a self-contained page with escaped text (checked in a browser by test/browser)', async () => {
    br20();
    reserve('cbr0', '10.42.1.14', '<script>x\r\neth0', HOUR); // not a valid ID: corrupt, but the page must never echo raw markup
    const file = join(root, 'page.html');
    const r = await cli(['status', '--cni-conf-dir', confDir, '--data-dir', dataDir, '--html', file], BR20_LIVE);
    assert.equal(r.code, 0);
    const html = readFileSync(file, 'utf8');
    assert.ok(html.startsWith('<!DOCTYPE html>'));
    assert.doesNotMatch(html, /https?:\/\//);
    assert.doesNotMatch(html, /<script>x/);
    assert.doesNotMatch(html, /\s(src|href)=/);
    assert.equal((html.match(/class="cell"/g) ?? []).length, 14);
    assert.match(html, /<dd data-count="leaked">9<\/dd>/);
    assert.match(html, /title="10\.42\.1\.5 live: l5 eth0, age 2h0m"/);
    // Not colour alone: each cell carries its state's letter; the legend shows it too.
    assert.match(html, /data-ip="10\.42\.1\.5" title="[^"]*">L<\/i>/);
    assert.match(html, /data-ip="10\.42\.1\.2" title="[^"]*">X<\/i>/);
    assert.match(html, /<button type="button" data-state="leaked"><i class="s-leaked">X<\/i>leaked<\/button>/);
    // Rows are labelled with their first address (14 cells: one row).
    assert.deepEqual([...html.matchAll(/<span class="addr">([^<]*)<\/span>/g)].map((m) => m[1]), ['10.42.1.1']);
    // BR-20 has no free address: the range set shows the alarm.
    assert.equal((html.match(/data-alarm="full"/g) ?? []).length, 1);
    assert.match(html, /<p class="alarm" role="alert" data-alarm="full">FULL: no free address in range set 0 of cbr0 — new pods on this network fail with "no IP addresses available in range set" until leaks are released \(ipwarden gc\) or pods are removed<\/p>/);
  });

  it('--html - prints only the page on stdout (no table); with --json it is a usage error', async () => {
    br20();
    const file = join(root, 'page.html');
    const toFile = await cli(['status', '--cni-conf-dir', confDir, '--data-dir', dataDir, '--html', file], BR20_LIVE);
    const r = await cli(['status', '--cni-conf-dir', confDir, '--data-dir', dataDir, '--html', '-'], BR20_LIVE);
    assert.equal(r.code, 0, r.stderr);
    assert.ok(r.stdout.startsWith('<!DOCTYPE html>'), r.stdout.slice(0, 80));
    assert.ok(r.stdout.trimEnd().endsWith('</html>'));
    assert.doesNotMatch(r.stdout, /NETWORK\s+SET\s+RANGE/);
    assert.match(toFile.stdout, /NETWORK\s+SET\s+RANGE/);
    assert.equal(r.stdout, readFileSync(file, 'utf8'), 'the same page as --html FILE at the same clock');
    const j = await cli(['status', '--cni-conf-dir', confDir, '--data-dir', dataDir, '--html', '-', '--json'], BR20_LIVE);
    assert.equal(j.code, 2);
    assert.equal(j.stderr, 'ipwarden: --html - prints the page on stdout: it cannot be combined with --json\n');
  });
});

function jsonError(text: string): string {
  try {
    JSON.parse(text);
  } catch (e) {
    return (e as Error).message;
  }
  return '';
}
