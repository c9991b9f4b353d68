/**
 * The daemon's pass (src/reconcile/pass.ts) on real files with a fake runtime and fixed kernel
 * evidence: every network of every data directory, the two-observation rule, the cap, the counts
 * the metrics get, the audit log, and failures that release nothing.
 */
import { afterEach, beforeEach, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, utimesSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { AppError } from '../../src/common/errors.ts';
import { Confirmations } from '../../src/reconcile/confirm.ts';
import { NOTHING_IN_USE, unreadableEvidence, type UseEvidence } from '../../src/reconcile/evidence.ts';
import type { ReconcileDeps } from '../../src/reconcile/options.ts';
import { runPass, type PassOptions } from '../../src/reconcile/pass.ts';
import type { SandboxInfo } from '../../src/reconcile/sandboxes.ts';

const T0 = Date.UTC(2026, 0, 1);
const ENDPOINT = 'unix:///run/pass-test-fake-cri.sock';
const LIVE = 'a'.repeat(64);
const id = (n: number): string => n.toString(16).padStart(64, '0');

let root: string;
let now = T0;
/** The pass's monotonic clock: follows `now` unless a test steps the wall clock alone. */
let mono = (): number => now - T0;
beforeEach(() => {
  root = mkdtempSync(join(tmpdir(), 'ipwarden-pass-'));
  now = T0;
  mono = (): number => now - T0;
});
afterEach(() => rmSync(root, { recursive: true, force: true }));

function reserve(dataDir: string, network: string, ip: string, owner: string, ageSeconds: number): void {
  const dir = join(dataDir, network);
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, ip), `${owner}\r\neth0`);
  const t = (T0 - ageSeconds * 1000) / 1000;
  utimesSync(join(dir, ip), t, t);
}

function conf(confDir: string, name: string, subnet: string, dataDir: string): void {
  mkdirSync(confDir, { recursive: true });
  writeFileSync(join(confDir, `10-${name}.conf`), JSON.stringify({ cniVersion: '1.0.0', name, type: 'bridge', ipam: { type: 'host-local', dataDir, ranges: [[{ subnet }]] } }));
}

function deps(list: SandboxInfo[] | Error, evidence: UseEvidence = NOTHING_IN_USE): ReconcileDeps {
  return {
    env: { CONTAINER_RUNTIME_ENDPOINT: ENDPOINT },
    now: () => now,
    evidence: () => evidence,
    sandboxSource: (endpoint) => ({
      endpoint,
      list: async () => {
        if (list instanceof Error) throw list;
        return list;
      },
    }),
  };
}

function options(o: Partial<PassOptions> = {}): PassOptions {
  return {
    dataDir: join(root, 'data'),
    cniConfDir: join(root, 'net.d'),
    network: null,
    runtimeEndpoint: null,
    graceSeconds: 60,
    policy: 'conservative',
    auditLog: null,
    lockTimeoutSeconds: 5,
    ...o,
  };
}

describe('runPass', () => {
  it('releases a leak only at the second observation a grace period later, and audits it', async () => {
    const data = join(root, 'data');
    conf(join(root, 'net.d'), 'n1', '10.87.1.0/29', data);
    reserve(data, 'n1', '10.87.1.2', LIVE, 600);
    reserve(data, 'n1', '10.87.1.3', id(1), 600);
    const c = new Confirmations(60);
    const d = deps([{ id: LIVE, state: 'ready' }]);

    const first = await runPass(options(), c, d, mono);
    assert.deepEqual(first.released, []);
    assert.deepEqual([...first.candidates], [['n1', 1]]);
    assert.ok(existsSync(join(data, 'n1', '10.87.1.3')));
    assert.deepEqual(first.rangeSets.map((r) => [r.network, r.rangeSet, r.capacity, r.live, r.leaked, r.free]), [['n1', 0, 5, 1, 1, 3]]);

    now = T0 + 59_999;
    assert.deepEqual((await runPass(options(), c, d, mono)).released, []);
    now = T0 + 60_000;
    const third = await runPass(options(), c, d, mono);
    assert.deepEqual(third.released.map((r) => [r.network, r.ip, r.containerId, r.reason]), [['n1', '10.87.1.3', id(1), 'leaked']]);
    assert.equal(existsSync(join(data, 'n1', '10.87.1.3')), false);
    assert.ok(existsSync(join(data, 'n1', '10.87.1.2')));
    assert.deepEqual(third.rangeSets.map((r) => [r.live, r.leaked, r.free]), [[1, 0, 4]]);
    assert.deepEqual([...third.candidates], []);
    assert.deepEqual(third.errors, []);
    const audit = readFileSync(join(data, '.ipwarden-audit.log'), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as Record<string, unknown>);
    assert.deepEqual(audit.map((a) => [a['phase'], a['ip']]), [['intent', '10.87.1.3'], ['released', '10.87.1.3']]);
  });

  it('covers every data directory the configurations name, and --data-dir, in one runtime call', async () => {
    const other = join(root, 'other');
    conf(join(root, 'net.d'), 'n2', '10.87.2.0/29', other);
    reserve(other, 'n2', '10.87.2.2', id(2), 600);
    reserve(join(root, 'data'), 'plain', '10.87.3.2', id(3), 600);
    let lists = 0;
    const d: ReconcileDeps = { ...deps([]), sandboxSource: (endpoint) => ({ endpoint, list: async () => (lists++, []) }) };
    const c = new Confirmations(0);
    await runPass(options(), c, d, mono);
    const r = await runPass(options(), c, d, mono);
    assert.equal(lists, 2);
    assert.deepEqual(r.released.map((x) => [x.dataDir, x.network, x.ip]).sort(), [[join(root, 'data'), 'plain', '10.87.3.2'], [other, 'n2', '10.87.2.2']]);
    assert.equal(r.networks, 2);
  });

  it('caps releases per pass and rolls the rest over, oldest first', async () => {
    const data = join(root, 'data');
    for (let i = 0; i < 5; i++) reserve(data, 'n1', `10.87.1.${i + 2}`, id(10 + i), 1000 - i);
    const c = new Confirmations(0, 2);
    const d = deps([]);
    await runPass(options(), c, d, mono);
    const a = await runPass(options(), c, d, mono);
    assert.deepEqual(a.released.map((r) => r.ip), ['10.87.1.2', '10.87.1.3']);
    assert.deepEqual([...a.candidates], [['n1', 3]]);
    const b = await runPass(options(), c, d, mono);
    assert.deepEqual(b.released.map((r) => r.ip), ['10.87.1.4', '10.87.1.5']);
    const e = await runPass(options(), c, d, mono);
    assert.deepEqual(e.released.map((r) => r.ip), ['10.87.1.6']);
  });

  it('releases nothing when the runtime fails, or the kernel evidence is incomplete, or the kernel shows the address', async () => {
    const data = join(root, 'data');
    reserve(data, 'n1', '10.87.1.2', id(1), 600);
    for (const [d, kind] of [
      [deps(new AppError('RUNTIME_UNAVAILABLE', 'connection refused', { retryable: true })), 'runtime'],
      [deps([], unreadableEvidence('not root')), 'kernel'],
    ] as const) {
      const c = new Confirmations(0);
      await runPass(options(), c, d, mono);
      const r = await runPass(options(), c, d, mono);
      assert.deepEqual(r.released, []);
      assert.ok(r.errors.some((e) => e.kind === kind), JSON.stringify(r.errors));
      assert.ok(existsSync(join(data, 'n1', '10.87.1.2')));
    }
    const inUse: UseEvidence = { ...NOTHING_IN_USE, addresses: new Map([['10.87.1.2', [{ netns: 'net:[4026532999]', via: '/proc/1234/ns/net' }]]]) };
    const c = new Confirmations(0);
    await runPass(options(), c, deps([], inUse), mono);
    const r = await runPass(options(), c, deps([], inUse), mono);
    assert.deepEqual(r.released, []);
    assert.ok(existsSync(join(data, 'n1', '10.87.1.2')));
  });

  it('holds releases when the runtime lists sandboxes none of which owns a reservation, with many candidates', async () => {
    const data = join(root, 'data');
    for (let i = 0; i < 8; i++) reserve(data, 'n1', `10.87.1.${i + 2}`, id(20 + i), 600);
    const c = new Confirmations(0);
    const d = deps([{ id: LIVE, state: 'ready' }, { id: id(99), state: 'notready' }]);
    await runPass(options(), c, d, mono);
    const r = await runPass(options(), c, d, mono);
    assert.deepEqual(r.released, []);
    assert.equal(r.held, `the runtime's list owns no reservation of ${join(data, 'n1')}, where 8 would be released: not trusted alone`);
    assert.deepEqual([...r.candidates], [['n1', 8]]);
  });

  it('a runtime that lists nothing is not trusted alone either, for a network with many candidates', async () => {
    const data = join(root, 'data');
    for (let i = 0; i < 8; i++) reserve(data, 'n1', `10.87.1.${i + 2}`, id(40 + i), 600);
    const c = new Confirmations(0);
    await runPass(options(), c, deps([]), mono);
    const r = await runPass(options(), c, deps([]), mono);
    assert.deepEqual(r.released, []);
    assert.deepEqual([...r.candidates], [['n1', 8]]);
    assert.match(r.held ?? '', /owns no reservation of .*n1, where 8 would be released/);
  });

  it('a forward step of the wall clock does not make two passes a grace period apart (monotonic clock)', async () => {
    const data = join(root, 'data');
    reserve(data, 'n1', '10.87.1.2', id(50), 600);
    const c = new Confirmations(60);
    const d = deps([]);
    const steady = (): number => 0;
    await runPass(options(), c, d, steady);
    now = T0 + 3_600_000; // the wall clock jumps an hour; the monotonic clock did not move
    assert.deepEqual((await runPass(options(), c, d, steady)).released, []);
    assert.ok(existsSync(join(data, 'n1', '10.87.1.2')));
  });
});
