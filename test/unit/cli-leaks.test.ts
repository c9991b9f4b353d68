/**
 * `ipwarden leaks` and `ipwarden gc` run in-process through `runMain` on a real data dir, with a
 * fake runtime sandbox list injected through the CLI context; the BR-13/BR-22 cases call the
 * commands' `run()` actions directly with the options commander passes.
 */
import { afterEach, beforeEach, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { NOTHING_IN_USE, unreadableEvidence, type UseEvidence } from '../../src/reconcile/evidence.ts';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, utimesSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { AppError } from '../../src/common/errors.ts';
import type { CliContext } from '../../src/cli/context.ts';
import { runMain } from '../../src/cli/main.ts';
import { run as gcRun } from '../../src/cli/gc.ts';
import { run as leaksRun, type ReconcileCommandOptions } from '../../src/cli/leaks.ts';
import type { SandboxInfo } from '../../src/reconcile/sandboxes.ts';

const SNAP = Date.UTC(2025, 0, 1);
const ENDPOINT = 'unix:///run/fake-cri.sock';
const A = 'a'.repeat(64);
const B = 'b'.repeat(64);
const C = 'c'.repeat(64);
const D = 'd'.repeat(64);
const LEAKED_REASON = 'sandbox not listed by the runtime and the file is older than the grace period';
const GRACE_REASON = 'sandbox not listed by the runtime, but the file is within the grace period (ADD may be in flight)';
const CORRUPT_REASON = 'empty or unparseable reservation file';

let dataDir: string;
beforeEach(() => {
  dataDir = mkdtempSync(join(tmpdir(), 'ipwarden-cli-'));
});
afterEach(() => {
  rmSync(dataDir, { recursive: true, force: true });
});

function write(network: string, name: string, content: string, ageSeconds: number): void {
  const dir = join(dataDir, network);
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, name), content);
  const t = (SNAP - ageSeconds * 1000) / 1000;
  utimesSync(join(dir, name), t, t);
}

/**
 * The standard fixture: network cbr0 with one live (ready), one live legacy (not ready), one
 * leaked, one in grace, one corrupt; network other (sorted after cbr0) with one leaked IPv4
 * and a live one; and the audit log file in the data dir root.
 */
function fixture(): void {
  write('cbr0', '10.244.1.10', `${A}\r\neth0`, 7200);
  write('cbr0', '10.244.1.2', `${B}\r\neth0`, 3600);
  write('cbr0', '10.244.1.3', B.replace(/b/g, 'e'), 3600.5); // legacy, not listed: leaked
  write('cbr0', '10.244.1.4', '', 60); // corrupt
  write('cbr0', '10.244.1.5', `${D}\r\neth0`, 12.5); // grace
  write('cbr0', '10.244.1.6', C, 86400); // legacy, listed not ready: live
  write('cbr0', 'last_reserved_ip.0', '10.244.1.10', 7200);
  write('other', '10.9.0.2', `${A}\r\nnet1`, 100);
  write('other', '10.9.0.3', `gone\r\nnet1`, 400);
}

interface Run {
  code: number;
  stdout: string;
  stderr: string;
  endpoints: string[];
}

async function cli(argv: string[], list: () => Promise<SandboxInfo[]>, env: Record<string, string> = {}): Promise<Run> {
  let stdout = '';
  let stderr = '';
  const endpoints: string[] = [];
  let closed = 0;
  const ctx: CliContext = {
    stdout: (t) => void (stdout += t),
    stderr: (t) => void (stderr += t),
    env: { CONTAINER_RUNTIME_ENDPOINT: ENDPOINT, ...env },
    now: () => SNAP,
    evidence: () => NOTHING_IN_USE,
    sandboxSource: (endpoint) => {
      endpoints.push(endpoint);
      return { endpoint, list, close: () => void closed++ };
    },
  };
  // Hermetic: never the host's /etc/cni/net.d (its configurations would name other data dirs).
  const conf = argv.includes('--cni-conf-dir') ? [] : ['--cni-conf-dir', join(dataDir, '.no-conf')];
  const code = await runMain([...argv, ...conf], ctx);
  assert.equal(closed, endpoints.length, 'every sandbox source is closed');
  return { code, stdout, stderr, endpoints };
}

const sandboxes = async (): Promise<SandboxInfo[]> => [
  { id: A, state: 'ready' },
  { id: B, state: 'ready' },
  { id: C, state: 'notready' },
];
const unreachable = async (): Promise<SandboxInfo[]> => {
  throw new AppError('RUNTIME_UNAVAILABLE', 'cannot connect to the runtime at unix:///run/fake-cri.sock: ENOENT', {
    retryable: true,
  });
};

function filesOf(network: string): string[] {
  return readdirSync(join(dataDir, network)).sort();
}

const cbr0Reservations = [
  { ip: '10.244.1.2', containerId: B, ifname: 'eth0', ageSeconds: 3600, verdict: 'live', reason: 'sandbox is listed by the runtime (ready)' },
  { ip: '10.244.1.3', containerId: 'e'.repeat(64), ifname: null, ageSeconds: 3600.5, verdict: 'leaked', reason: `${LEAKED_REASON}; legacy ID-only record` },
  { ip: '10.244.1.4', containerId: null, ifname: null, ageSeconds: 60, verdict: 'corrupt', reason: CORRUPT_REASON },
  { ip: '10.244.1.5', containerId: D, ifname: 'eth0', ageSeconds: 12.5, verdict: 'grace', reason: GRACE_REASON },
  { ip: '10.244.1.6', containerId: C, ifname: null, ageSeconds: 86400, verdict: 'live', reason: 'sandbox is listed by the runtime (not ready); legacy ID-only record' },
  { ip: '10.244.1.10', containerId: A, ifname: 'eth0', ageSeconds: 7200, verdict: 'live', reason: 'sandbox is listed by the runtime (ready)' },
];
const otherReservations = [
  { ip: '10.9.0.2', containerId: A, ifname: 'net1', ageSeconds: 100, verdict: 'live', reason: 'sandbox is listed by the runtime (ready)' },
  { ip: '10.9.0.3', containerId: 'gone', ifname: 'net1', ageSeconds: 400, verdict: 'leaked', reason: LEAKED_REASON },
];

describe('ipwarden leaks', () => {
  it('--json prints the documented schema, sorted by network then IP numerically, and changes nothing', async () => {
    fixture();
    const r = await cli(['leaks', '--data-dir', dataDir, '--json'], sandboxes);
    assert.equal(r.stderr, '');
    assert.equal(r.code, 0);
    assert.deepEqual(r.endpoints, [ENDPOINT]);
    assert.ok(r.stdout.endsWith('}\n'));
    assert.deepEqual(JSON.parse(r.stdout), {
      runtime: { endpoint: ENDPOINT, sandboxes: 3 },
      kernel: { complete: true, incomplete: null, addresses: 0 },
      networks: [
        { name: 'cbr0', dir: join(dataDir, 'cbr0'), reservations: cbr0Reservations },
        { name: 'other', dir: join(dataDir, 'other'), reservations: otherReservations },
      ],
      released: [],
    });
    assert.deepEqual(filesOf('cbr0'), ['10.244.1.10', '10.244.1.2', '10.244.1.3', '10.244.1.4', '10.244.1.5', '10.244.1.6', 'last_reserved_ip.0', 'lock']);
    assert.equal(existsSync(join(dataDir, '.ipwarden-audit.log')), false);
  });

  it('prints a table with short container IDs and a summary line', async () => {
    fixture();
    const r = await cli(['leaks', '--data-dir', dataDir, '--network', 'cbr0'], sandboxes);
    assert.equal(r.code, 0);
    assert.equal(r.stderr, '');
    const a13 = 'a'.repeat(13);
    const b13 = 'b'.repeat(13);
    const c13 = 'c'.repeat(13);
    const d13 = 'd'.repeat(13);
    const e13 = 'e'.repeat(13);
    assert.equal(
      r.stdout,
      [
        `runtime ${ENDPOINT}: 3 sandboxes`,
        'NETWORK  IP           CONTAINER      IFNAME  AGE   VERDICT  REASON',
        `cbr0     10.244.1.2   ${b13}  eth0    1h0m  live     sandbox is listed by the runtime (ready)`,
        `cbr0     10.244.1.3   ${e13}  -       1h0m  leaked   ${LEAKED_REASON}; legacy ID-only record`,
        `cbr0     10.244.1.4   -              -       1m0s  corrupt  ${CORRUPT_REASON}`,
        `cbr0     10.244.1.5   ${d13}  eth0    12s   grace    ${GRACE_REASON}`,
        `cbr0     10.244.1.6   ${c13}  -       1d0h  live     sandbox is listed by the runtime (not ready); legacy ID-only record`,
        `cbr0     10.244.1.10  ${a13}  eth0    2h0m  live     sandbox is listed by the runtime (ready)`,
        '6 reservations: 3 live, 1 grace, 1 leaked, 1 corrupt',
        '',
      ].join('\n'),
    );
  });

  it('--grace moves the boundary (12.5 s old with --grace 10s is leaked)', async () => {
    write('n', '10.0.0.2', 'x\r\neth0', 12.5);
    const r = await cli(['leaks', '--data-dir', dataDir, '--grace', '10s', '--json'], sandboxes);
    assert.equal(JSON.parse(r.stdout).networks[0].reservations[0].verdict, 'leaked');
    const r2 = await cli(['leaks', '--data-dir', dataDir, '--grace', '12.5s', '--json'], sandboxes);
    assert.equal(JSON.parse(r2.stdout).networks[0].reservations[0].verdict, 'grace');
  });

  it('runtime unreachable: verdicts unknown, runtime.sandboxes null with error, exit 1', async () => {
    fixture();
    const r = await cli(['leaks', '--data-dir', dataDir, '--network', 'other', '--json'], unreachable);
    assert.equal(r.code, 1);
    assert.equal(
      r.stderr,
      'ipwarden: runtime not reachable: cannot connect to the runtime at unix:///run/fake-cri.sock: ENOENT; verdicts are unknown\n',
    );
    assert.deepEqual(JSON.parse(r.stdout), {
      runtime: { endpoint: ENDPOINT, sandboxes: null, error: 'cannot connect to the runtime at unix:///run/fake-cri.sock: ENOENT' },
      kernel: { complete: true, incomplete: null, addresses: 0 },
      networks: [
        {
          name: 'other',
          dir: join(dataDir, 'other'),
          reservations: otherReservations.map((x) => ({ ...x, verdict: 'unknown', reason: 'runtime not reachable; kept' })),
        },
      ],
      released: [],
    });
  });

  it('an empty data dir: no networks, exit 0; the table has only its header and a summary; stderr says the data dir holds none', async () => {
    const r = await cli(['leaks', '--data-dir', dataDir], sandboxes);
    assert.equal(r.code, 0);
    assert.equal(
      r.stdout,
      `runtime ${ENDPOINT}: 3 sandboxes\nNETWORK  IP  CONTAINER  IFNAME  AGE  VERDICT  REASON\n0 reservations: 0 live, 0 grace, 0 leaked, 0 corrupt\n`,
    );
    assert.equal(r.stderr, `ipwarden: data directory ${dataDir} holds no networks\n`);
  });

  const usage: Array<{ name: string; argv: string[]; stderr: string }> = [
    {
      name: 'bad --grace',
      argv: ['--grace', '5x'],
      stderr: 'ipwarden: --grace: invalid duration "5x" (time: unknown unit "x" in duration "5x")\n',
    },
    { name: 'negative --grace', argv: ['--grace', '-1s'], stderr: 'ipwarden: --grace: must not be negative, got "-1s"\n' },
    { name: 'invalid --network', argv: ['--network', '../x'], stderr: 'ipwarden: invalid network name "../x"\n' },
    {
      name: 'tcp runtime endpoint',
      argv: ['--runtime-endpoint', 'tcp://1.2.3.4:1'],
      stderr:
        'ipwarden: --runtime-endpoint: unsupported runtime endpoint "tcp://1.2.3.4:1": want unix:///path/to/socket or /path/to/socket\n',
    },
  ];
  usage.forEach((c) =>
    it(`usage error, exit 2: ${c.name}`, async () => {
      const r = await cli(['leaks', '--data-dir', dataDir, ...c.argv], sandboxes);
      assert.equal(r.code, 2);
      assert.equal(r.stderr, c.stderr);
      assert.equal(r.stdout, '');
    }),
  );

  it('a --network without a directory is an error, exit 1', async () => {
    const r = await cli(['leaks', '--data-dir', dataDir, '--network', 'nope'], sandboxes);
    assert.equal(r.code, 1);
    assert.equal(r.stderr, `ipwarden: no network directory ${join(dataDir, 'nope')}\n`);
  });

  it('--runtime-endpoint wins over CONTAINER_RUNTIME_ENDPOINT', async () => {
    const r = await cli(['leaks', '--data-dir', dataDir, '--runtime-endpoint', '/run/other.sock'], sandboxes);
    assert.deepEqual(r.endpoints, ['unix:///run/other.sock']);
  });
});

describe('ipwarden gc', () => {
  it('releases the leaked and corrupt reservations, records each in the audit log, prints the schema', async () => {
    fixture();
    const r = await cli(['gc', '--data-dir', dataDir, '--json'], sandboxes);
    assert.equal(r.stderr, '');
    assert.equal(r.code, 0);
    const doc = JSON.parse(r.stdout);
    assert.deepEqual(doc.networks[0].reservations, cbr0Reservations);
    assert.deepEqual(doc.released, [
      { network: 'cbr0', ip: '10.244.1.3', containerId: 'e'.repeat(64), ifname: null, verdict: 'leaked', reason: `${LEAKED_REASON}; legacy ID-only record` },
      { network: 'cbr0', ip: '10.244.1.4', containerId: null, ifname: null, verdict: 'corrupt', reason: CORRUPT_REASON },
      { network: 'other', ip: '10.9.0.3', containerId: 'gone', ifname: 'net1', verdict: 'leaked', reason: LEAKED_REASON },
    ]);
    assert.deepEqual(filesOf('cbr0'), ['10.244.1.10', '10.244.1.2', '10.244.1.5', '10.244.1.6', 'last_reserved_ip.0', 'lock']);
    assert.deepEqual(filesOf('other'), ['10.9.0.2', 'lock']);
    const lines = readFileSync(join(dataDir, '.ipwarden-audit.log'), 'utf8').split('\n');
    const e3 = (phase: string) =>
      `{"time":"2025-01-01T00:00:00.000Z","network":"cbr0","ip":"10.244.1.3","containerId":"${'e'.repeat(64)}","ifname":null,"ageSeconds":3600.5,"verdict":"leaked","reason":"${LEAKED_REASON}; legacy ID-only record","phase":"${phase}"}`;
    const c4 = (phase: string) =>
      `{"time":"2025-01-01T00:00:00.000Z","network":"cbr0","ip":"10.244.1.4","containerId":null,"ifname":null,"ageSeconds":60,"verdict":"corrupt","reason":"${CORRUPT_REASON}","phase":"${phase}"}`;
    const o3 = (phase: string) =>
      `{"time":"2025-01-01T00:00:00.000Z","network":"other","ip":"10.9.0.3","containerId":"gone","ifname":"net1","ageSeconds":400,"verdict":"leaked","reason":"${LEAKED_REASON}","phase":"${phase}"}`;
    // Per network: the intents (synced) before any removal, then each removal's outcome.
    assert.deepEqual(lines, [e3('intent'), c4('intent'), e3('released'), c4('released'), o3('intent'), o3('released'), '']);
  });

  it('human output ends with the released lines and "released N"; --audit-log picks the file', async () => {
    fixture();
    const log = join(dataDir, 'elsewhere.log');
    const r = await cli(['gc', '--data-dir', dataDir, '--audit-log', log], sandboxes);
    assert.equal(r.code, 0);
    const tail = r.stdout.split('\n').slice(-6);
    assert.deepEqual(tail, [
      '8 reservations: 4 live, 1 grace, 2 leaked, 1 corrupt',
      'released cbr0 10.244.1.3 (leaked)',
      'released cbr0 10.244.1.4 (corrupt)',
      'released other 10.9.0.3 (leaked)',
      'released 3',
      '',
    ]);
    assert.equal(readFileSync(log, 'utf8').split('\n').length, 7);
    assert.equal(existsSync(join(dataDir, '.ipwarden-audit.log')), false);
    // Nothing left to do: a second run releases nothing and writes no audit line.
    const again = await cli(['gc', '--data-dir', dataDir, '--audit-log', log], sandboxes);
    assert.ok(again.stdout.endsWith('5 reservations: 4 live, 1 grace, 0 leaked, 0 corrupt\nreleased 0\n'), again.stdout);
    assert.equal(readFileSync(log, 'utf8').split('\n').length, 7);
  });

  it('--dry-run releases nothing, writes no audit log, and says what it would release', async () => {
    fixture();
    const r = await cli(['gc', '--data-dir', dataDir, '--dry-run'], sandboxes);
    assert.equal(r.code, 0);
    assert.deepEqual(r.stdout.split('\n').slice(-6), [
      '8 reservations: 4 live, 1 grace, 2 leaked, 1 corrupt',
      'would release cbr0 10.244.1.3 (leaked)',
      'would release cbr0 10.244.1.4 (corrupt)',
      'would release other 10.9.0.3 (leaked)',
      'would release 3',
      '',
    ]);
    // Only DIR/lock was added (taking the lock creates it, as host-local does).
    assert.deepEqual(filesOf('cbr0'), ['10.244.1.10', '10.244.1.2', '10.244.1.3', '10.244.1.4', '10.244.1.5', '10.244.1.6', 'last_reserved_ip.0', 'lock']);
    assert.deepEqual(filesOf('other'), ['10.9.0.2', '10.9.0.3', 'lock']);
    assert.equal(existsSync(join(dataDir, '.ipwarden-audit.log')), false);
    const j = await cli(['gc', '--data-dir', dataDir, '--dry-run', '--json'], sandboxes);
    assert.deepEqual(JSON.parse(j.stdout).released, []);
  });

  it('runtime unreachable: releases only corrupt files, exits 1 with the reason on stderr', async () => {
    fixture();
    const r = await cli(['gc', '--data-dir', dataDir, '--json'], unreachable);
    assert.equal(r.code, 1);
    assert.equal(
      r.stderr,
      'ipwarden: runtime not reachable: cannot connect to the runtime at unix:///run/fake-cri.sock: ENOENT; only corrupt files are released\n',
    );
    const doc = JSON.parse(r.stdout);
    assert.deepEqual(doc.runtime, {
      endpoint: ENDPOINT,
      sandboxes: null,
      error: 'cannot connect to the runtime at unix:///run/fake-cri.sock: ENOENT',
    });
    assert.deepEqual(doc.released, [
      { network: 'cbr0', ip: '10.244.1.4', containerId: null, ifname: null, verdict: 'corrupt', reason: CORRUPT_REASON },
    ]);
    assert.deepEqual(filesOf('cbr0'), ['10.244.1.10', '10.244.1.2', '10.244.1.3', '10.244.1.5', '10.244.1.6', 'last_reserved_ip.0', 'lock']);
    assert.deepEqual(filesOf('other'), ['10.9.0.2', '10.9.0.3', 'lock']);
    const lines = readFileSync(join(dataDir, '.ipwarden-audit.log'), 'utf8').trimEnd().split('\n');
    assert.deepEqual(lines.map((l) => [JSON.parse(l).ip, JSON.parse(l).phase]), [['10.244.1.4', 'intent'], ['10.244.1.4', 'released']]);
  });

  it('an audit log that cannot be opened releases nothing, exit 1', async () => {
    fixture();
    const r = await cli(['gc', '--data-dir', dataDir, '--audit-log', join(dataDir, 'no', 'dir.log')], sandboxes);
    assert.equal(r.code, 1);
    assert.match(r.stderr, /^ipwarden: cannot open the audit log .*\/no\/dir\.log: ENOENT/);
    assert.deepEqual(filesOf('other'), ['10.9.0.2', '10.9.0.3', 'lock']);
  });
});

/**
 * BR-13 and BR-22 through the commands' actions (`run()` of leaks.ts and gc.ts, with the options
 * commander would pass), on the same fixture, with a fake runtime that also reports pod IPs.
 */
describe('leaks and gc: the data directories the CNI configurations name (as status reads them)', () => {
  // Two networks whose configurations name their own data directories (not --data-dir's default).
  let confDir: string;
  let dirA: string;
  let dirB: string;
  beforeEach(() => {
    confDir = join(dataDir, 'net.d');
    dirA = join(dataDir, 'data-a');
    dirB = join(dataDir, 'data-b');
    mkdirSync(confDir);
    const conf = (name: string, subnet: string, dir: string): void =>
      writeFileSync(join(confDir, `10-${name}.conf`), JSON.stringify({ cniVersion: '1.0.0', name, type: 'bridge', ipam: { type: 'host-local', subnet, dataDir: dir } }));
    conf('trial-leak', '10.237.41.0/24', dirA);
    conf('alpha', '10.237.42.0/24', dirB);
    for (const [dir, network, ip, owner] of [[dirA, 'trial-leak', '10.237.41.5', `gone1\r\neth0`], [dirB, 'alpha', '10.237.42.9', `${A}\r\neth0`], [dirB, 'alpha', '10.237.42.7', `gone2\r\neth0`]] as const) {
      mkdirSync(join(dir, network), { recursive: true });
      writeFileSync(join(dir, network, ip), owner);
      const t = (SNAP - 3600_000) / 1000;
      utimesSync(join(dir, network, ip), t, t);
    }
  });

  it('leaks --cni-conf-dir (no --data-dir) reads every data directory the configurations name', async () => {
    const r = await cli(['leaks', '--cni-conf-dir', confDir], sandboxes);
    assert.equal(r.code, 0);
    assert.equal(r.stderr, '');
    const a13 = 'a'.repeat(13);
    assert.equal(
      r.stdout,
      [
        `runtime ${ENDPOINT}: 3 sandboxes`,
        'NETWORK     IP           CONTAINER      IFNAME  AGE   VERDICT  REASON',
        `alpha       10.237.42.7  gone2          eth0    1h0m  leaked   ${LEAKED_REASON}`,
        `alpha       10.237.42.9  ${a13}  eth0    1h0m  live     sandbox is listed by the runtime (ready)`,
        `trial-leak  10.237.41.5  gone1          eth0    1h0m  leaked   ${LEAKED_REASON}`,
        '3 reservations: 1 live, 0 grace, 2 leaked, 0 corrupt',
        '',
      ].join('\n'),
    );
    const one = await cli(['leaks', '--cni-conf-dir', confDir, '--network', 'trial-leak', '--json'], sandboxes);
    assert.equal(one.code, 0);
    assert.deepEqual(JSON.parse(one.stdout).networks.map((n: { dir: string }) => n.dir), [join(dirA, 'trial-leak')]);
  });

  it('gc --cni-conf-dir releases the leaks of each data directory, each recorded in that directory\'s audit log', async () => {
    const r = await cli(['gc', '--cni-conf-dir', confDir], sandboxes);
    assert.equal(r.code, 0);
    assert.equal(r.stderr, '');
    // Released data directory by data directory (sorted), each network under its lock.
    assert.ok(r.stdout.endsWith('3 reservations: 1 live, 0 grace, 2 leaked, 0 corrupt\nreleased trial-leak 10.237.41.5 (leaked)\nreleased alpha 10.237.42.7 (leaked)\nreleased 2\n'), r.stdout);
    assert.deepEqual(readdirSync(join(dirA, 'trial-leak')).sort(), ['lock']);
    assert.deepEqual(readdirSync(join(dirB, 'alpha')).sort(), ['10.237.42.9', 'lock']);
    const phases = (dir: string): string[] => readFileSync(join(dir, '.ipwarden-audit.log'), 'utf8').trim().split('\n').map((l) => `${JSON.parse(l).ip} ${JSON.parse(l).phase}`);
    assert.deepEqual(phases(dirA), ['10.237.41.5 intent', '10.237.41.5 released']);
    assert.deepEqual(phases(dirB), ['10.237.42.7 intent', '10.237.42.7 released']);
  });

  it('a mistyped --data-dir is not an all-clear: stderr names it and the data directories the configurations name, exit 0 as documented', async () => {
    const typo = join(dataDir, 'data-x');
    for (const verb of ['leaks', 'gc']) {
      const r = await cli([verb, '--cni-conf-dir', confDir, '--data-dir', typo], sandboxes);
      assert.equal(r.code, 0);
      assert.equal(
        r.stderr,
        `ipwarden: --data-dir ${typo} replaces the data directories the configurations in ${confDir} name; not read: ${dirA} (trial-leak), ${dirB} (alpha)\n` +
          `ipwarden: data directory ${typo} does not exist: no reservations read there\n`,
      );
      assert.equal(r.stdout.split('\n').includes('0 reservations: 0 live, 0 grace, 0 leaked, 0 corrupt'), true);
    }
    assert.equal(existsSync(join(dirA, 'trial-leak', '10.237.41.5')), true);
  });

  it('no configuration and no --data-dir: the default data dir, named on stderr when it does not exist', async () => {
    if (existsSync('/var/lib/cni/networks')) return; // a real node's: not ours to read in a unit test
    const r = await cli(['leaks', '--cni-conf-dir', join(dataDir, 'empty-conf')], sandboxes);
    assert.equal(r.code, 0);
    assert.equal(r.stderr, 'ipwarden: data directory /var/lib/cni/networks does not exist: no reservations read there\n');
  });
});

describe('leaks and gc: pod IPs of live sandboxes (BR-13) and --policy (BR-22)', () => {
  interface Fake {
    ips: Record<string, string[]>;
    fail?: Record<string, string>;
    asked: string[];
    maxInFlight: number;
  }
  const fake = (ips: Record<string, string[]>, fail: Record<string, string> = {}): Fake => ({ ips, fail, asked: [], maxInFlight: 0 });

  async function direct(
    command: 'leaks' | 'gc',
    opts: ReconcileCommandOptions,
    list: () => Promise<SandboxInfo[]>,
    f: Fake | null,
    evidence: UseEvidence = NOTHING_IN_USE,
  ): Promise<Run> {
    let stdout = '';
    let stderr = '';
    let inFlight = 0;
    const endpoints: string[] = [];
    const ctx: CliContext = {
      stdout: (t) => void (stdout += t),
      stderr: (t) => void (stderr += t),
      env: { CONTAINER_RUNTIME_ENDPOINT: ENDPOINT },
      now: () => SNAP,
      evidence: () => evidence,
      sandboxSource: (endpoint) => {
        endpoints.push(endpoint);
        if (f === null) return { endpoint, list };
        return {
          endpoint,
          list,
          podIPs: async (id: string) => {
            f.asked.push(id);
            inFlight++;
            f.maxInFlight = Math.max(f.maxInFlight, inFlight);
            await new Promise<void>((resolve) => setImmediate(resolve));
            inFlight--;
            const why = f.fail?.[id];
            if (why !== undefined) throw new AppError('RUNTIME_CALL_FAILED', why);
            return f.ips[id] ?? [];
          },
        };
      },
    };
    const all = { dataDir, cniConfDir: join(dataDir, 'no-conf'), ...opts };
    const code = command === 'gc' ? await gcRun(all, ctx) : await leaksRun(all, ctx);
    return { code, stdout, stderr, endpoints };
  }

  it('a sandbox source without podIPs: the check is skipped and the JSON has no "unreserved"', async () => {
    fixture();
    const r = await direct('leaks', { json: true }, sandboxes, null);
    assert.equal(r.code, 0);
    assert.equal('unreserved' in JSON.parse(r.stdout), false);
  });

  it('asks PodSandboxStatus only for READY sandboxes; every address reserved: "unreserved": [] and a count line', async () => {
    fixture();
    const f = fake({ [A]: ['10.244.1.10', '10.9.0.2'], [B]: ['10.244.1.2'] });
    const r = await direct('leaks', { network: 'cbr0' }, sandboxes, f);
    assert.equal(r.code, 0);
    assert.equal(r.stderr, '');
    assert.deepEqual(f.asked.sort(), [A, B]); // C is NOT READY
    assert.ok(r.stdout.endsWith('6 reservations: 3 live, 1 grace, 1 leaked, 1 corrupt\npod IPs of 2 ready sandboxes: 0 unreserved, 0 conflicts\n'), r.stdout);
    const j = await direct('leaks', { json: true }, sandboxes, fake({ [A]: ['10.244.1.10', '10.9.0.2'], [B]: ['10.244.1.2'] }));
    assert.deepEqual(JSON.parse(j.stdout).unreserved, []);
  });

  it('at most 16 PodSandboxStatus calls in flight (110 READY sandboxes)', async () => {
    const ids = Array.from({ length: 110 }, (_, i) => `s${i}`);
    const f = fake({});
    const r = await direct('leaks', { json: true }, async () => ids.map((id) => ({ id, state: 'ready' as const })), f);
    assert.equal(r.code, 0);
    assert.equal(f.asked.length, 110);
    assert.equal(f.maxInFlight, 16);
  });

  it('a sandbox the runtime cannot answer for is skipped with a warning; the others are checked', async () => {
    fixture();
    const f = fake({ [B]: ['10.244.1.7'] }, { [A]: 'rpc error: NotFound' });
    const r = await direct('leaks', { json: true }, sandboxes, f);
    assert.equal(r.code, 0);
    assert.equal(r.stderr, `ipwarden: pod IPs of sandbox ${A} not checked: rpc error: NotFound\n`);
    // Two network directories and no CNI configuration: which network it belongs to is unknown.
    assert.deepEqual(JSON.parse(r.stdout).unreserved, [
      { sandbox: B, ip: '10.244.1.7', network: null, action: 'reported', reservedFor: null, message: `live sandbox ${B} has no reservation for its IP 10.244.1.7` },
    ]);
  });

  it('leaks: human section after the table, one row per finding', async () => {
    fixture();
    // B's second address .3 is held by a leaked legacy file of another container: a conflict.
    const f = fake({ [A]: ['10.244.1.10'], [B]: ['10.244.1.2', '10.244.1.3'] });
    const r = await direct('leaks', { network: 'cbr0' }, sandboxes, f);
    assert.equal(r.code, 0);
    const b13 = 'b'.repeat(13);
    const e13 = 'e'.repeat(13);
    assert.deepEqual(r.stdout.split('\n').slice(-5), [
      '6 reservations: 3 live, 1 grace, 1 leaked, 1 corrupt',
      'pod IPs of 2 ready sandboxes: 0 unreserved, 1 conflict',
      'SANDBOX        IP          NETWORK  ACTION    RESERVED-FOR   PROBLEM',
      `${b13}  10.244.1.3  cbr0     conflict  ${e13}  address 10.244.1.3 of live sandbox ${B} is reserved for ${'e'.repeat(64)}`,
      '',
    ]);
  });

  it('gc: a leaked file at a READY sandbox\'s address is withheld (never released), the conflict is reported, exit 1', async () => {
    fixture();
    const f = fake({ [A]: ['10.244.1.10'], [B]: ['10.244.1.2', '10.244.1.3'] });
    const dry = await direct('gc', { dryRun: true }, sandboxes, f);
    assert.deepEqual(dry.stdout.split('\n').filter((l) => l.startsWith('would release')), [
      'would release cbr0 10.244.1.4 (corrupt)',
      'would release other 10.9.0.3 (leaked)',
      'would release 2',
    ]);
    const r = await direct('gc', { json: true }, sandboxes, fake({ [A]: ['10.244.1.10'], [B]: ['10.244.1.2', '10.244.1.3'] }));
    assert.equal(r.code, 1);
    assert.equal(
      r.stderr,
      `ipwarden: kept cbr0 10.244.1.3: address in use by live sandbox ${B} (conflict)\n` +
        `ipwarden: conflict: address 10.244.1.3 of live sandbox ${B} is reserved for ${'e'.repeat(64)}\n`,
    );
    const doc = JSON.parse(r.stdout);
    assert.deepEqual(doc.released.map((x: { ip: string }) => x.ip), ['10.244.1.4', '10.9.0.3']);
    assert.deepEqual(doc.unreserved, [
      { sandbox: B, ip: '10.244.1.3', network: 'cbr0', action: 'conflict', reservedFor: 'e'.repeat(64), message: `address 10.244.1.3 of live sandbox ${B} is reserved for ${'e'.repeat(64)}` },
    ]);
    assert.ok(filesOf('cbr0').includes('10.244.1.3'));
  });

  it('gc: an unreserved address in no configured range is never placed by a guess, not even in the only network directory (issue 7)', async () => {
    write('solo', '10.5.0.3', `${B}\r\neth0`, 3600);
    const f = fake({ [A]: ['10.5.0.2'], [B]: ['10.5.0.3'] });
    const r = await direct('gc', {}, sandboxes, f);
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(r.stdout.split('\n').slice(-5), [
      'pod IPs of 2 ready sandboxes: 1 unreserved, 0 conflicts',
      'SANDBOX        IP        NETWORK  ACTION    RESERVED-FOR  PROBLEM',
      `${'a'.repeat(13)}  10.5.0.2  -        reported  -             live sandbox ${A} has no reservation for its IP 10.5.0.2`,
      'released 0',
      '',
    ]);
    assert.equal(existsSync(join(dataDir, 'solo', '10.5.0.2')), false);
    assert.equal(existsSync(join(dataDir, '.ipwarden-audit.log')), false);
  });

  it('gc: a PodSandboxStatus that fails (not NOT_FOUND) is not silent: exit 1, and without complete kernel evidence nothing is released (issue 7, case 5)', async () => {
    fixture();
    const f = fake({ [B]: ['10.244.1.2'] }, { [A]: 'rpc error: DeadlineExceeded' });
    const ok = await direct('gc', { dryRun: true }, sandboxes, f);
    assert.equal(ok.code, 1);
    assert.equal(ok.stderr.includes(`ipwarden: pod IPs of ready sandbox ${A} could not be read: rpc error: DeadlineExceeded\n`), true, ok.stderr);
    assert.equal(ok.stdout.split('\n').slice(-2)[0], 'would release 3', 'complete kernel evidence covers the unread sandbox');
    const blind = await direct('gc', { dryRun: true }, sandboxes, f, unreadableEvidence('not root'));
    assert.equal(blind.code, 1);
    assert.equal(blind.stdout.split('\n').slice(-2)[0], 'would release 0');
    assert.equal(blind.stderr.includes('ipwarden: kernel evidence incomplete (not root): nothing is released\n'), true, blind.stderr);
  });

  it('gc --policy reclaim-notready releases the NOT READY sandbox\'s old reservation; the summary counts notready', async () => {
    fixture();
    const r = await direct('gc', { policy: 'reclaim-notready' }, sandboxes, null);
    assert.equal(r.code, 0);
    assert.deepEqual(r.stdout.split('\n').slice(-7), [
      '8 reservations: 3 live, 1 grace, 2 leaked, 1 corrupt, 1 notready',
      'released cbr0 10.244.1.3 (leaked)',
      'released cbr0 10.244.1.4 (corrupt)',
      'released cbr0 10.244.1.6 (notready)',
      'released other 10.9.0.3 (leaked)',
      'released 4',
      '',
    ]);
    assert.deepEqual(filesOf('cbr0'), ['10.244.1.10', '10.244.1.2', '10.244.1.5', 'last_reserved_ip.0', 'lock']);
  });

  it('leaks --policy reclaim-notready --json: verdict notready with its reason; --policy conservative keeps the old output', async () => {
    fixture();
    const r = await direct('leaks', { policy: 'reclaim-notready', json: true, network: 'cbr0' }, sandboxes, null);
    const row = JSON.parse(r.stdout).networks[0].reservations.find((x: { ip: string }) => x.ip === '10.244.1.6');
    assert.deepEqual(row, {
      ip: '10.244.1.6',
      containerId: C,
      ifname: null,
      ageSeconds: 86400,
      verdict: 'notready',
      reason: 'sandbox is listed by the runtime but not ready, and the file is older than the grace period (policy reclaim-notready); legacy ID-only record',
    });
    const c = await direct('leaks', { policy: 'conservative', json: true }, sandboxes, null);
    assert.deepEqual(JSON.parse(c.stdout).networks[0].reservations, cbr0Reservations);
  });

  it('--policy other than conservative|reclaim-notready is a usage error', async () => {
    await assert.rejects(direct('leaks', { policy: 'aggressive' }, sandboxes, null), {
      name: 'UsageError',
      message: '--policy: must be conservative or reclaim-notready, got "aggressive"',
    });
  });

  it('the command line takes --policy and --cni-conf-dir (through runMain)', async () => {
    fixture();
    const bad = await cli(['leaks', '--data-dir', dataDir, '--policy', 'aggressive'], sandboxes);
    assert.deepEqual([bad.code, bad.stderr], [2, 'ipwarden: --policy: must be conservative or reclaim-notready, got "aggressive"\n']);
    const ok = await cli(['gc', '--dry-run', '--data-dir', dataDir, '--network', 'cbr0', '--policy', 'reclaim-notready', '--cni-conf-dir', dataDir, '--json'], sandboxes);
    assert.equal(ok.code, 0, ok.stderr);
    assert.ok((JSON.parse(ok.stdout) as { networks: Array<{ reservations: Array<{ verdict: string }> }> }).networks[0]?.reservations.some((r) => r.verdict === 'notready'));
  });
});
