/**
 * `ipwarden leaks` and `ipwarden gc` run in-process through `runMain` on a real data dir, with a
 * fake runtime sandbox list injected through the CLI context.
 */
import { afterEach, beforeEach, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, utimesSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { AppError } from '../../src/common/errors.ts';
import type { CliContext } from '../../src/cli/context.ts';
import { runMain } from '../../src/cli/main.ts';
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
    sandboxSource: (endpoint) => {
      endpoints.push(endpoint);
      return { endpoint, list, close: () => void closed++ };
    },
  };
  const code = await runMain(argv, ctx);
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
      networks: [
        { name: 'cbr0', dir: join(dataDir, 'cbr0'), reservations: cbr0Reservations },
        { name: 'other', dir: join(dataDir, 'other'), reservations: otherReservations },
      ],
      released: [],
    });
    assert.deepEqual(filesOf('cbr0'), ['10.244.1.10', '10.244.1.2', '10.244.1.3', '10.244.1.4', '10.244.1.5', '10.244.1.6', 'last_reserved_ip.0', 'lock']);
    assert.equal(existsSync(join(dataDir, 'ipwarden-audit.log')), false);
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

  it('an empty data dir: no networks, exit 0; the table has only its header and a summary', async () => {
    const r = await cli(['leaks', '--data-dir', dataDir], sandboxes);
    assert.equal(r.code, 0);
    assert.equal(
      r.stdout,
      `runtime ${ENDPOINT}: 3 sandboxes\nNETWORK  IP  CONTAINER  IFNAME  AGE  VERDICT  REASON\n0 reservations: 0 live, 0 grace, 0 leaked, 0 corrupt\n`,
    );
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
    const lines = readFileSync(join(dataDir, 'ipwarden-audit.log'), 'utf8').split('\n');
    assert.deepEqual(lines, [
      `{"time":"2025-01-01T00:00:00.000Z","network":"cbr0","ip":"10.244.1.3","containerId":"${'e'.repeat(64)}","ifname":null,"ageSeconds":3600.5,"verdict":"leaked","reason":"${LEAKED_REASON}; legacy ID-only record"}`,
      `{"time":"2025-01-01T00:00:00.000Z","network":"cbr0","ip":"10.244.1.4","containerId":null,"ifname":null,"ageSeconds":60,"verdict":"corrupt","reason":"${CORRUPT_REASON}"}`,
      `{"time":"2025-01-01T00:00:00.000Z","network":"other","ip":"10.9.0.3","containerId":"gone","ifname":"net1","ageSeconds":400,"verdict":"leaked","reason":"${LEAKED_REASON}"}`,
      '',
    ]);
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
    assert.equal(readFileSync(log, 'utf8').split('\n').length, 4);
    assert.equal(existsSync(join(dataDir, 'ipwarden-audit.log')), false);
    // Nothing left to do: a second run releases nothing and writes no audit line.
    const again = await cli(['gc', '--data-dir', dataDir, '--audit-log', log], sandboxes);
    assert.ok(again.stdout.endsWith('5 reservations: 4 live, 1 grace, 0 leaked, 0 corrupt\nreleased 0\n'), again.stdout);
    assert.equal(readFileSync(log, 'utf8').split('\n').length, 4);
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
    assert.equal(existsSync(join(dataDir, 'ipwarden-audit.log')), false);
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
    const lines = readFileSync(join(dataDir, 'ipwarden-audit.log'), 'utf8').trimEnd().split('\n');
    assert.equal(lines.length, 1);
    assert.equal(JSON.parse(lines[0] ?? '').ip, '10.244.1.4');
  });

  it('an audit log that cannot be opened releases nothing, exit 1', async () => {
    fixture();
    const r = await cli(['gc', '--data-dir', dataDir, '--audit-log', join(dataDir, 'no', 'dir.log')], sandboxes);
    assert.equal(r.code, 1);
    assert.match(r.stderr, /^ipwarden: cannot open the audit log .*\/no\/dir\.log: ENOENT/);
    assert.deepEqual(filesOf('other'), ['10.9.0.2', '10.9.0.3', 'lock']);
  });
});
