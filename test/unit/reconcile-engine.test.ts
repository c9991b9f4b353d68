/**
 * The reconcile engine's three phases called directly, as the daemon's loop will call them:
 * one `takeSnapshot` serving several data directories (`planNetworks`, `planNetwork`), then
 * `applyNetworkPlan`; and the status model asking the runtime once for a report spanning two
 * data directories (it used to ask once per data directory and fake a directory to get a snapshot).
 */
import { afterEach, beforeEach, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, utimesSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { AppError, UsageError } from '../../src/common/errors.ts';
import { memoryAuditSink } from '../../src/reconcile/audit.ts';
import { applyNetworkPlan, planNetwork, planNetworks, takeSnapshot } from '../../src/reconcile/engine.ts';
import { NOTHING_IN_USE } from '../../src/reconcile/evidence.ts';
import { discoverNetworks } from '../../src/reconcile/networks.ts';
import type { ReconcileDeps } from '../../src/reconcile/options.ts';
import type { SandboxInfo } from '../../src/reconcile/sandboxes.ts';
import { collectStatus } from '../../src/reconcile/status.ts';

const SNAP = Date.UTC(2025, 0, 1);
const ENDPOINT = 'unix:///run/h1-fake-cri.sock';
const A = 'a'.repeat(64);
const GONE = 'f'.repeat(64);

let root: string;
beforeEach(() => {
  root = mkdtempSync(join(tmpdir(), 'h1-engine-'));
});
afterEach(() => {
  rmSync(root, { recursive: true, force: true });
});

function write(dataDir: string, network: string, ip: string, content: string, ageSeconds: number): void {
  const dir = join(dataDir, network);
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, ip), content);
  const t = (SNAP - ageSeconds * 1000) / 1000;
  utimesSync(join(dir, ip), t, t);
}

/** Deps with a fake runtime listing `list`, counting the ListPodSandbox calls. */
function deps(list: SandboxInfo[] | (() => Promise<SandboxInfo[]>)): ReconcileDeps & { readonly lists: () => number } {
  let lists = 0;
  return {
    env: { CONTAINER_RUNTIME_ENDPOINT: ENDPOINT },
    now: () => SNAP,
    evidence: () => NOTHING_IN_USE,
    sandboxSource: (endpoint) => ({
      endpoint,
      list: async () => {
        lists++;
        return typeof list === 'function' ? list() : list;
      },
    }),
    lists: () => lists,
  };
}

describe('takeSnapshot', () => {
  it('asks the runtime once and reads the kernel evidence', async () => {
    const d = deps([{ id: A, state: 'ready' }]);
    const snap = await takeSnapshot({}, d);
    assert.equal(d.lists(), 1);
    assert.deepEqual(snap.runtime, { endpoint: ENDPOINT, sandboxes: 1 });
    assert.equal(snap.snapshotAtMs, SNAP);
    assert.equal(snap.evidence, NOTHING_IN_USE);
    assert.equal(snap.podIPs, null);
    assert.equal(snap.sandboxes?.has(A), true);
  });

  it('turns a runtime failure into runtime.error and no sandboxes', async () => {
    const d = deps(async () => {
      throw new AppError('RUNTIME_UNAVAILABLE', 'cannot connect', { retryable: true });
    });
    const snap = await takeSnapshot({}, d);
    assert.deepEqual(snap.runtime, { endpoint: ENDPOINT, sandboxes: null, error: 'cannot connect' });
    assert.equal(snap.sandboxes, null);
  });

  it('throws a UsageError naming the flag for a malformed endpoint', async () => {
    await assert.rejects(takeSnapshot({ runtimeEndpoint: 'tcp://x:1' }, deps([])), (e: unknown) => {
      assert.ok(e instanceof UsageError);
      assert.equal(e.message, '--runtime-endpoint: unsupported runtime endpoint "tcp://x:1": want unix:///path/to/socket or /path/to/socket');
      return true;
    });
  });
});

describe('planNetworks / planNetwork / applyNetworkPlan', () => {
  it('plans two data directories against one snapshot, then applies one of them', async () => {
    const one = join(root, 'one');
    const two = join(root, 'two');
    write(one, 'cbr0', '10.244.1.2', `${A}\r\neth0`, 3600);
    write(one, 'cbr0', '10.244.1.3', `${GONE}\r\neth0`, 3600);
    write(two, 'net2', '10.9.0.2', `${GONE}\r\neth1`, 10); // within the grace
    const d = deps([{ id: A, state: 'ready' }]);
    const snap = await takeSnapshot({}, d);
    const opts = { graceSeconds: 300, cniConfDir: join(root, 'no-confs') };
    const p1 = await planNetworks(one, discoverNetworks(one), snap, opts, d);
    const p2 = await planNetwork(two, 'net2', snap, opts, d);
    assert.equal(d.lists(), 1, 'one ListPodSandbox for both data directories');
    assert.deepEqual(p1.plan.entries.map((e) => [e.network, e.ip, e.verdict]), [
      ['cbr0', '10.244.1.2', 'live'],
      ['cbr0', '10.244.1.3', 'leaked'],
    ]);
    assert.deepEqual(p2.plan.entries.map((e) => [e.network, e.ip, e.verdict]), [['net2', '10.9.0.2', 'grace']]);
    assert.equal(p1.findings, null);
    assert.deepEqual(p1.withheld, []);

    const audit = memoryAuditSink();
    const a = await applyNetworkPlan(p1, { audit }, d);
    assert.deepEqual(a.applied.released.map((e) => e.ip), ['10.244.1.3']);
    assert.deepEqual(a.applied.errors, []);
    assert.equal(existsSync(join(one, 'cbr0', '10.244.1.3')), false);
    assert.equal(readFileSync(join(one, 'cbr0', '10.244.1.2'), 'utf8'), `${A}\r\neth0`);
    assert.deepEqual(audit.records.map((r) => [r.phase, r.ip]), [
      ['intent', '10.244.1.3'],
      ['released', '10.244.1.3'],
    ]);
    // Nothing to do in the other data directory: no audit log is opened there.
    const b = await applyNetworkPlan(p2, {}, d);
    assert.deepEqual(b.applied, { released: [], skipped: [], errors: [] });
    assert.equal(existsSync(join(two, '.ipwarden-audit.log')), false);
  });

  it('planNetwork refuses an invalid name and a missing directory', async () => {
    const snap = await takeSnapshot({}, deps([]));
    const opts = { graceSeconds: 300, cniConfDir: root };
    await assert.rejects(planNetwork(root, '../x', snap, opts), { name: 'UsageError', message: 'invalid network name "../x"' });
    await assert.rejects(planNetwork(root, 'nope', snap, opts), { code: 'IPAM_NOT_FOUND', message: `no network directory ${join(root, 'nope')}` });
  });
});

describe('collectStatus', () => {
  it('asks the runtime once for networks in two data directories', async () => {
    const confDir = join(root, 'net.d');
    const one = join(root, 'one');
    const two = join(root, 'two');
    mkdirSync(confDir);
    const conf = (file: string, name: string, dataDir: string, subnet: string): void =>
      writeFileSync(join(confDir, file), JSON.stringify({ cniVersion: '1.0.0', name, plugins: [{ type: 'bridge', ipam: { type: 'host-local', dataDir, subnet } }] }));
    conf('10-a.conflist', 'a', one, '10.1.0.0/24');
    conf('20-b.conflist', 'b', two, '10.2.0.0/24');
    write(one, 'a', '10.1.0.2', `${A}\r\neth0`, 3600);
    write(two, 'b', '10.2.0.2', `${GONE}\r\neth0`, 3600);
    const d = deps([{ id: A, state: 'ready' }]);
    const r = await collectStatus({ cniConfDir: confDir, graceSeconds: 300 }, d);
    assert.equal(d.lists(), 1);
    assert.deepEqual(r.layout.dataDirs, [one, two]);
    assert.deepEqual(r.networks.map((n) => [n.name, n.total.live, n.total.leaked]), [
      ['a', 1, 0],
      ['b', 0, 1],
    ]);
    assert.equal(r.verdicts, true);
  });
});
