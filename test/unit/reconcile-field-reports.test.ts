/**
 * The reconcile parts of field reports BR-02 (variant b), BR-03, BR-04, BR-05, BR-06, BR-10,
 * BR-13, BR-19, BR-20, BR-22, BR-23 (../shared/reference/field-reports.md), each on a real
 * FileStore in a temporary data dir: the raw files are written exactly as the fixture's `disk:`
 * says, their mtimes set older than the grace period, and the runtime's sandbox list is the
 * fixture's `live:`. The plugin steps around a reconcile (ADD after it, late DELs) drive the real
 * plugin handlers in-process (`makeHandlers(fileDeps)` + `pluginMain`) on the same data dir.
 * BR-13 runs `ipwarden gc`/`leaks` (their `run()`) with a fake runtime that also reports pod IPs.
 */
import { afterEach, beforeEach, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { NOTHING_IN_USE } from '../../src/reconcile/evidence.ts';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, utimesSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { isAppError } from '../../src/common/errors.ts';
import { applyPlan, type ApplyResult } from '../../src/reconcile/apply.ts';
import { memoryAuditSink, type AuditRecord } from '../../src/reconcile/audit.ts';
import { discoverNetworks, readReservations } from '../../src/reconcile/networks.ts';
import { plan, type AnyVerdict, type Plan, type Policy, type SandboxState } from '../../src/reconcile/plan.ts';
import type { SandboxInfo } from '../../src/reconcile/sandboxes.ts';
import type { CliContext } from '../../src/cli/context.ts';
import { run as gcRun } from '../../src/cli/gc.ts';
import { run as leaksRun } from '../../src/cli/leaks.ts';
import { openFileStore } from '../../src/store/file/file-store.ts';
import { makeHandlers } from '../../src/cni/commands.ts';
import { fileDepsWith } from '../../src/cni/plugin.ts';

const fileDeps = fileDepsWith(async () => (await import('../../src/cni/heal.ts')).criHeal);
import { pluginMain } from '../../src/cni/skel.ts';

/** The runtime snapshot time of every test: 2025-01-01T00:00:00Z. */
const SNAP = Date.UTC(2025, 0, 1);
const GRACE = 300; // 5m, the CLI default
/** Files written before the reboot / failure: one hour before the snapshot. */
const OLD_MS = SNAP - 3600_000;

let dataDir: string;
beforeEach(() => {
  dataDir = mkdtempSync(join(tmpdir(), 'ipwarden-br-'));
});
afterEach(() => {
  rmSync(dataDir, { recursive: true, force: true });
});

/** Write DIR exactly as a fixture's `disk:`; every file gets mtime `mtimeMs`. */
function disk(network: string, files: Record<string, string>, mtimeMs = OLD_MS): string {
  const dir = join(dataDir, network);
  mkdirSync(dir, { recursive: true });
  for (const [name, content] of Object.entries(files)) {
    const p = join(dir, name);
    writeFileSync(p, content, { mode: name === 'lock' || name.startsWith('last_') ? 0o644 : 0o600 });
    utimesSync(p, mtimeMs / 1000, mtimeMs / 1000);
  }
  return dir;
}

/** Every file of DIR with its exact content. */
function filesOf(network: string): Record<string, string> {
  const dir = join(dataDir, network);
  const out: Record<string, string> = {};
  for (const name of readdirSync(dir).sort()) out[name] = readFileSync(join(dir, name), 'latin1');
  return out;
}

/** `live:` as the runtime's list; every sandbox ready unless stated. */
function live(...ids: Array<string | [string, SandboxState]>): Map<string, SandboxState> {
  return new Map(ids.map((x) => (typeof x === 'string' ? [x, 'ready'] : x)));
}

/** One reconcile pass over the whole data dir (snapshot given, then locks), as `ipwarden gc` does. */
async function reconcile(
  sandboxes: Map<string, SandboxState> | null,
  opts: { lockTimeoutSeconds?: number; policy?: Policy } = {},
): Promise<{ plan: Plan<AnyVerdict>; applied: ApplyResult; audit: AuditRecord[] }> {
  const openStore = (network: string) => openFileStore({ dataDir, network });
  const networks = discoverNetworks(dataDir);
  const reservations = await readReservations(networks, openStore, opts.lockTimeoutSeconds);
  const p = plan({ evidence: NOTHING_IN_USE, reservations, sandboxes, snapshotAtMs: SNAP, graceSeconds: GRACE, policy: opts.policy ?? 'conservative' });
  const audit = memoryAuditSink();
  const applied = await applyPlan(p, { openStore, audit, now: () => SNAP + 1000, evidence: () => NOTHING_IN_USE, lockTimeoutSeconds: opts.lockTimeoutSeconds });
  return { plan: p, applied, audit: audit.records };
}

const releasedIPs = (a: ApplyResult): string[] => a.released.map((e) => e.ip);

/** The fixture's `config:` with `ipam.dataDir` pointed at the test's data dir. */
function config(name: string, subnet: string, cniVersion = '1.0.0'): object {
  return { cniVersion, name, ipam: { type: 'host-local', dataDir, ranges: [[{ subnet }]] } };
}

/** One plugin invocation in-process; `json` is stdout parsed. */
async function cni(
  command: 'ADD' | 'DEL',
  containerId: string,
  ifname: string,
  conf: object,
): Promise<{ code: number; json: Record<string, unknown> | null }> {
  let out = '';
  const code = await pluginMain(makeHandlers(fileDeps), {
    env: { CNI_COMMAND: command, CNI_CONTAINERID: containerId, CNI_IFNAME: ifname, CNI_NETNS: command === 'ADD' ? '/var/run/netns/test' : '', CNI_PATH: '/opt/cni/bin' },
    readStdin: async () => Buffer.from(JSON.stringify(conf)),
    stdout: (t: string) => {
      out += t;
      return true;
    },
    stderr: () => true,
  });
  return { code, json: out === '' ? null : (JSON.parse(out) as Record<string, unknown>) };
}

/** The address of a successful ADD result (`ips[0].address`). */
function addedAddress(r: { code: number; json: Record<string, unknown> | null }): string {
  assert.equal(r.code, 0, JSON.stringify(r.json));
  const ips = r.json?.['ips'] as Array<{ address: string }> | undefined;
  return ips?.[0]?.address ?? '';
}

describe('field reports: reconcile on a real FileStore', () => {
  it('BR-02 variant b: no DEL ever; reconcile removes 10.88.0.2, keeps lock and last_reserved_ip.0', async () => {
    disk('containerd-net', { '10.88.0.2': 'c-old\r\neth0', 'last_reserved_ip.0': '10.88.0.2', lock: '' });
    const { applied, audit } = await reconcile(live());
    assert.deepEqual(releasedIPs(applied), ['10.88.0.2']);
    assert.deepEqual(filesOf('containerd-net'), { 'last_reserved_ip.0': '10.88.0.2', lock: '' });
    const rec = {
      time: '2025-01-01T00:00:01.000Z',
      network: 'containerd-net',
      ip: '10.88.0.2',
      containerId: 'c-old',
      ifname: 'eth0',
      ageSeconds: 3600,
      verdict: 'leaked',
      reason: 'sandbox not listed by the runtime and the file is older than the grace period',
    };
    assert.deepEqual(audit, [
      { ...rec, phase: 'intent' },
      { ...rec, phase: 'released' },
    ]);
    assert.deepEqual(applied.errors, []);
    // ADD c-new -> 10.88.0.3 (round robin continues after last_reserved_ip.0).
    assert.equal(addedAddress(await cni('ADD', 'c-new', 'eth0', config('containerd-net', '10.88.0.0/29'))), '10.88.0.3/29');
  });

  it('BR-03: after reboot, live = [c4, c5] (+ c6 in flight) frees .2 .3 .4 by runtime truth, not by age', async () => {
    // All five files are equally old: age alone cannot tell the boots apart, the runtime can.
    disk('cbr0', {
      '10.244.1.2': 'c1\r\neth0',
      '10.244.1.3': 'c2\r\neth0',
      '10.244.1.4': 'c3\r\neth0',
      '10.244.1.5': 'c4\r\neth0',
      '10.244.1.6': 'c5\r\neth0',
      'last_reserved_ip.0': '10.244.1.6',
      lock: '',
    });
    const { applied, plan: p } = await reconcile(live('c4', 'c5', ['c6', 'notready']));
    assert.deepEqual(releasedIPs(applied), ['10.244.1.2', '10.244.1.3', '10.244.1.4']);
    assert.deepEqual(filesOf('cbr0'), {
      '10.244.1.5': 'c4\r\neth0',
      '10.244.1.6': 'c5\r\neth0',
      'last_reserved_ip.0': '10.244.1.6',
      lock: '',
    });
    assert.deepEqual(p.orphans, ['c6']);
    // ADD c6 -> 10.244.1.2 (wraps after .6, skips gateway .1).
    assert.equal(addedAddress(await cni('ADD', 'c6', 'eth0', config('cbr0', '10.244.1.0/29'))), '10.244.1.2/29');
  });

  // BR-04: owner parsing is the first line (CRLF), also LF-only and legacy single-line content;
  // a whole-content comparison against "c3" would wrongly free the live .4.
  const br04: Array<{ name: string; content: string }> = [
    { name: 'CRLF record', content: 'c3\r\neth0' },
    { name: 'LF-only record', content: 'c3\neth0' },
    { name: 'legacy ID-only record', content: 'c3' },
    { name: 'CRLF record with trailing whitespace', content: 'c3\r\neth0\r\n' },
  ];
  br04.forEach((c) =>
    it(`BR-04: live = [c3] frees .2 and .3, keeps .4 (${c.name}), lock, last_reserved_ip.0`, async () => {
      disk('kubenet', {
        '10.244.1.2': 'c1\r\neth0',
        '10.244.1.3': 'c2\r\neth0',
        '10.244.1.4': c.content,
        'last_reserved_ip.0': '10.244.1.4',
        lock: '',
      });
      const { applied } = await reconcile(live('c3'));
      assert.deepEqual(releasedIPs(applied), ['10.244.1.2', '10.244.1.3']);
      assert.deepEqual(filesOf('kubenet'), { '10.244.1.4': c.content, 'last_reserved_ip.0': '10.244.1.4', lock: '' });
    }),
  );

  it('BR-05: five sandboxes removed without DEL; reconcile frees c1..c5 (c6 in flight)', async () => {
    disk('cbr0', {
      '10.244.1.2': 'c1\r\neth0',
      '10.244.1.3': 'c2\r\neth0',
      '10.244.1.4': 'c3\r\neth0',
      '10.244.1.5': 'c4\r\neth0',
      '10.244.1.6': 'c5\r\neth0',
      'last_reserved_ip.0': '10.244.1.6',
      lock: '',
    });
    const { applied } = await reconcile(live(['c6', 'notready']));
    assert.deepEqual(releasedIPs(applied), ['10.244.1.2', '10.244.1.3', '10.244.1.4', '10.244.1.5', '10.244.1.6']);
    assert.deepEqual(filesOf('cbr0'), { 'last_reserved_ip.0': '10.244.1.6', lock: '' });
    // ADD c6 succeeds.
    assert.equal(addedAddress(await cni('ADD', 'c6', 'eth0', config('cbr0', '10.244.1.0/29'))), '10.244.1.2/29');
  });

  it('BR-05: an ADD in flight (file younger than the grace, sandbox not listed yet) keeps its reservation', async () => {
    disk('cbr0', { '10.244.1.2': 'c1\r\neth0', lock: '' });
    disk('cbr0', { '10.244.1.3': 'c6\r\neth0' }, SNAP - 10_000); // written 10 s before the snapshot
    const { applied, plan: p } = await reconcile(live());
    assert.deepEqual(releasedIPs(applied), ['10.244.1.2']);
    assert.deepEqual(
      p.entries.map((e) => [e.ip, e.verdict, e.ageSeconds]),
      [
        ['10.244.1.2', 'leaked', 3600],
        ['10.244.1.3', 'grace', 10],
      ],
    );
    assert.deepEqual(filesOf('cbr0'), { '10.244.1.3': 'c6\r\neth0', lock: '' });
  });

  it('BR-06: ADD completed on disk, runtime forgot c1: reconcile frees 10.22.0.2', async () => {
    disk('k8s-pod-network', { '10.22.0.2': 'c1\r\neth0', 'last_reserved_ip.0': '10.22.0.2', lock: '' });
    const { applied } = await reconcile(live());
    assert.deepEqual(releasedIPs(applied), ['10.22.0.2']);
    assert.deepEqual(filesOf('k8s-pod-network'), { 'last_reserved_ip.0': '10.22.0.2', lock: '' });
  });

  it('BR-06: an upstream ADD killed between create and write leaves an empty file: freed as corrupt', async () => {
    disk('k8s-pod-network', { '10.22.0.2': '', 'last_reserved_ip.0': '10.22.0.2', lock: '' }, SNAP - 1000);
    const { applied } = await reconcile(live());
    assert.deepEqual(
      applied.released.map((e) => [e.ip, e.verdict, e.containerId]),
      [['10.22.0.2', 'corrupt', null]],
    );
    assert.deepEqual(filesOf('k8s-pod-network'), { 'last_reserved_ip.0': '10.22.0.2', lock: '' });
  });

  it('BR-10: live = [cB]: reconcile frees .2 only, under DIR/lock; late DEL cA is a no-op; DEL cB frees .3', async () => {
    disk('antrea', { '10.22.0.2': 'cA\r\neth0', '10.22.0.3': 'cB\r\neth0', lock: '' });

    // It holds DIR/lock: while another holder has the lock, nothing is released.
    const holder = await openFileStore({ dataDir, network: 'antrea' });
    await holder.lock(1);
    try {
      const blocked = await reconcile(live('cB'), { lockTimeoutSeconds: 0 }).catch((e: unknown) => e);
      // readReservations itself waits for the lock first.
      assert.ok(isAppError(blocked, 'STORE_LOCK_TIMEOUT'), String(blocked));
      assert.ok(existsSync(join(dataDir, 'antrea', '10.22.0.2')));
    } finally {
      await holder.close();
    }

    const { applied } = await reconcile(live('cB'));
    assert.deepEqual(releasedIPs(applied), ['10.22.0.2']);
    assert.deepEqual(filesOf('antrea'), { '10.22.0.3': 'cB\r\neth0', lock: '' });

    // Late DEL cA is a successful no-op; DEL cB (agent cache empty) frees .3.
    const conf = config('antrea', '10.22.0.0/29');
    assert.deepEqual(await cni('DEL', 'cA', 'eth0', conf), { code: 0, json: null });
    assert.deepEqual(filesOf('antrea'), { '10.22.0.3': 'cB\r\neth0', lock: '' });
    assert.deepEqual(await cni('DEL', 'cB', 'eth0', conf), { code: 0, json: null });
    assert.deepEqual(filesOf('antrea'), { lock: '' });
  });

  it('BR-19: DEL never reached the IPAM; reconcile frees 10.1.0.2; last_reserved_ip.0 kept', async () => {
    disk('net-hd', { '10.1.0.2': 'c1\r\nnet1', 'last_reserved_ip.0': '10.1.0.2', lock: '' });
    const { applied } = await reconcile(live());
    assert.deepEqual(
      applied.released.map((e) => [e.ip, e.containerId, e.ifname]),
      [['10.1.0.2', 'c1', 'net1']],
    );
    assert.deepEqual(filesOf('net-hd'), { 'last_reserved_ip.0': '10.1.0.2', lock: '' });
  });

  it('BR-20: whole /28 allocated, live = [l5, l9, l12]: frees 10 files, .5 .9 .12 untouched', async () => {
    const files: Record<string, string> = { 'last_reserved_ip.0': '10.42.1.14', lock: '' };
    for (let i = 2; i <= 14; i++) files[`10.42.1.${i}`] = [5, 9, 12].includes(i) ? `l${i}\r\neth0` : `d${i}\r\neth0`;
    disk('cbr0', files);
    const conf = config('cbr0', '10.42.1.0/28');
    const full = await cni('ADD', 'n1', 'eth0', conf);
    assert.equal(full.code, 1);
    assert.equal(full.json?.['msg'], 'failed to allocate for range 0: no IP addresses available in range set: 10.42.1.1-10.42.1.14');
    const before = ['5', '9', '12'].map((i) => statSync(join(dataDir, 'cbr0', `10.42.1.${i}`)));
    const { applied } = await reconcile(live('l5', 'l9', 'l12'));
    assert.deepEqual(releasedIPs(applied), [2, 3, 4, 6, 7, 8, 10, 11, 13, 14].map((i) => `10.42.1.${i}`));
    assert.deepEqual(filesOf('cbr0'), {
      '10.42.1.12': 'l12\r\neth0',
      '10.42.1.5': 'l5\r\neth0',
      '10.42.1.9': 'l9\r\neth0',
      'last_reserved_ip.0': '10.42.1.14',
      lock: '',
    });
    const after = ['5', '9', '12'].map((i) => statSync(join(dataDir, 'cbr0', `10.42.1.${i}`)));
    assert.deepEqual(
      after.map((s) => [s.ino, s.mtimeMs]),
      before.map((s) => [s.ino, s.mtimeMs]),
    );
    assert.equal(addedAddress(await cni('ADD', 'n1', 'eth0', conf)), '10.42.1.2/28');
  });

  it('BR-22: conservative policy keeps both: c1 NOT READY (netns removed) and c2 READY', async () => {
    disk('gs22', { '10.22.0.2': 'c1\r\neth0', '10.22.0.3': 'c2\r\neth0', lock: '' });
    const { applied, plan: p } = await reconcile(live(['c1', 'notready'], ['c2', 'ready']));
    assert.deepEqual(releasedIPs(applied), []);
    assert.deepEqual(
      p.entries.map((e) => [e.ip, e.verdict, e.reason]),
      [
        ['10.22.0.2', 'live', 'sandbox is listed by the runtime (not ready)'],
        ['10.22.0.3', 'live', 'sandbox is listed by the runtime (ready)'],
      ],
    );
    assert.deepEqual(filesOf('gs22'), { '10.22.0.2': 'c1\r\neth0', '10.22.0.3': 'c2\r\neth0', lock: '' });
  });

  describe('BR-22: policy reclaim-notready after grace T', () => {
    const T = GRACE * 1000;
    const gs22 = { '10.22.0.2': 'c1\r\neth0', '10.22.0.3': 'c2\r\neth0', lock: '' };
    const sandboxes = () => live(['c1', 'notready'], ['c2', 'ready']);

    it('files exactly T old: frees nothing (c1 NOT READY is still live)', async () => {
      disk('gs22', gs22, SNAP - T);
      const { applied, plan: p } = await reconcile(sandboxes(), { policy: 'reclaim-notready' });
      assert.deepEqual(releasedIPs(applied), []);
      assert.deepEqual(
        p.entries.map((e) => [e.ip, e.verdict]),
        [
          ['10.22.0.2', 'live'],
          ['10.22.0.3', 'live'],
        ],
      );
      assert.deepEqual(filesOf('gs22'), gs22);
    });

    it('files 1 ms older than T: frees .2 (NOT READY) only; READY c2 keeps .3, just as old', async () => {
      disk('gs22', gs22, SNAP - T - 1);
      const { applied, audit } = await reconcile(sandboxes(), { policy: 'reclaim-notready' });
      assert.deepEqual(releasedIPs(applied), ['10.22.0.2']);
      assert.deepEqual(filesOf('gs22'), { '10.22.0.3': 'c2\r\neth0', lock: '' });
      const rec = {
        time: '2025-01-01T00:00:01.000Z',
        network: 'gs22',
        ip: '10.22.0.2',
        containerId: 'c1',
        ifname: 'eth0',
        ageSeconds: 300.001,
        verdict: 'notready',
        reason: 'sandbox is listed by the runtime but not ready, and the file is older than the grace period (policy reclaim-notready)',
      };
      assert.deepEqual(audit, [
        { ...rec, phase: 'intent' },
        { ...rec, phase: 'released' },
      ]);
    });

    it('conservative with the same old files keeps both', async () => {
      disk('gs22', gs22, SNAP - T - 1);
      const { applied } = await reconcile(sandboxes(), { policy: 'conservative' });
      assert.deepEqual(releasedIPs(applied), []);
      assert.deepEqual(filesOf('gs22'), gs22);
    });

    const policies: Policy[] = ['conservative', 'reclaim-notready'];
    policies.forEach((policy) =>
      it(`${policy}: a READY sandbox's IP is never freed, however old (a year)`, async () => {
        disk('gs22', gs22, SNAP - 365 * 86400_000);
        const { applied } = await reconcile(live(['c2', 'ready']), { policy });
        // c1 is not listed at all here: leaked under both policies; c2 READY: kept.
        assert.deepEqual(releasedIPs(applied), ['10.22.0.2']);
        assert.deepEqual(filesOf('gs22'), { '10.22.0.3': 'c2\r\neth0', lock: '' });
      }),
    );
  });

  describe('BR-23: genuine exhaustion versus leak', () => {
    const full = {
      '10.244.1.2': 'c1\r\neth0',
      '10.244.1.3': 'c2\r\neth0',
      '10.244.1.4': 'c3\r\neth0',
      '10.244.1.5': 'c4\r\neth0',
      '10.244.1.6': 'c5\r\neth0',
    };
    it('first: live [c1..c5]: ADD c6 fails with the exact upstream error; reconcile frees nothing; allocated=5, owned-by-live=5, orphaned=0', async () => {
      disk('kubenet', full);
      const add = await cni('ADD', 'c6', 'eth0', config('kubenet', '10.244.1.0/29'));
      assert.equal(add.code, 1);
      assert.equal(add.json?.['msg'], 'failed to allocate for range 0: no IP addresses available in range set: 10.244.1.1-10.244.1.6');
      const { applied, plan: p } = await reconcile(live('c1', 'c2', 'c3', 'c4', 'c5'));
      assert.deepEqual(releasedIPs(applied), []);
      assert.equal(p.counts.allocated, 5);
      assert.equal(p.counts.live, 5);
      assert.equal(p.counts.orphaned, 0);
      // Taking the lock creates DIR/lock, as host-local does.
      assert.deepEqual(filesOf('kubenet'), { ...full, lock: '' });
    });
    it('second: live [c3..c5]: frees exactly .2 .3; ADD c6 gets one of them', async () => {
      disk('kubenet', full);
      const { applied, plan: p } = await reconcile(live('c3', 'c4', 'c5'));
      assert.deepEqual(releasedIPs(applied), ['10.244.1.2', '10.244.1.3']);
      assert.deepEqual(
        { allocated: p.counts.allocated, live: p.counts.live, orphaned: p.counts.orphaned },
        { allocated: 5, live: 3, orphaned: 2 },
      );
      assert.deepEqual(filesOf('kubenet'), {
        '10.244.1.4': 'c3\r\neth0',
        '10.244.1.5': 'c4\r\neth0',
        '10.244.1.6': 'c5\r\neth0',
        lock: '',
      });
      const got = addedAddress(await cni('ADD', 'c6', 'eth0', config('kubenet', '10.244.1.0/29')));
      assert.ok(['10.244.1.2/29', '10.244.1.3/29'].includes(got), got);
    });
  });

  describe('BR-13: IP released while the sandbox keeps running, then handed out again', () => {
    let confDir: string;
    beforeEach(() => {
      confDir = mkdtempSync(join(tmpdir(), 'ipwarden-br13-conf-'));
    });
    afterEach(() => {
      rmSync(confDir, { recursive: true, force: true });
    });
    const conf = () => config('dup13', '10.22.0.0/29');

    /** The runtime of the fixture: sandboxes READY with their pod IPs (`live:`). */
    function runtime(podIPs: Record<string, string>): CliContext['sandboxSource'] {
      return (endpoint) => ({
        endpoint,
        list: async (): Promise<SandboxInfo[]> => Object.keys(podIPs).map((id) => ({ id, state: 'ready' })),
        podIPs: async (id: string) => [podIPs[id] ?? ''],
      });
    }

    async function cli(
      command: 'leaks' | 'gc',
      podIPs: Record<string, string>,
      extra: { dryRun?: boolean } = {},
    ): Promise<{ code: number; doc: Record<string, unknown>; stderr: string }> {
      let stdout = '';
      let stderr = '';
      const ctx: CliContext = {
        stdout: (t) => void (stdout += t),
        stderr: (t) => void (stderr += t),
        env: { CONTAINER_RUNTIME_ENDPOINT: 'unix:///run/fake-cri.sock' },
        now: () => SNAP,
        evidence: () => NOTHING_IN_USE,
        sandboxSource: runtime(podIPs),
      };
      const opts = { dataDir, cniConfDir: confDir, json: true, ...extra };
      const code = command === 'gc' ? await gcRun(opts, ctx) : await leaksRun(opts, ctx);
      return { code, doc: JSON.parse(stdout) as Record<string, unknown>, stderr };
    }

    /** Steps 1 and 2 up to c5: ADD c1 -> .2, DEL c1, ADD c2..c5 -> .3 .4 .5 .6 (round robin as upstream). */
    async function upToC5(): Promise<void> {
      writeFileSync(join(confDir, '10-dup13.conf'), JSON.stringify(conf()));
      assert.equal(addedAddress(await cni('ADD', 'c1', 'eth0', conf())), '10.22.0.2/29');
      assert.deepEqual(await cni('DEL', 'c1', 'eth0', conf()), { code: 0, json: null });
      // .3 after .2 even though .2 is free: round robin continues after last_reserved_ip.0.
      const got: string[] = [];
      for (const c of ['c2', 'c3', 'c4', 'c5']) got.push(addedAddress(await cni('ADD', c, 'eth0', conf())));
      assert.deepEqual(got, ['10.22.0.3/29', '10.22.0.4/29', '10.22.0.5/29', '10.22.0.6/29']);
    }
    const c1to5 = { c1: '10.22.0.2', c2: '10.22.0.3', c3: '10.22.0.4', c4: '10.22.0.5', c5: '10.22.0.6' };
    const afterC5 = {
      '10.22.0.3': 'c2\r\neth0',
      '10.22.0.4': 'c3\r\neth0',
      '10.22.0.5': 'c4\r\neth0',
      '10.22.0.6': 'c5\r\neth0',
      'last_reserved_ip.0': '10.22.0.6',
      lock: '',
    };

    it('leaks reports "live sandbox c1 has no reservation for its IP 10.22.0.2" and changes nothing', async () => {
      await upToC5();
      const r = await cli('leaks', c1to5);
      assert.equal(r.code, 0);
      assert.equal(r.stderr, '');
      assert.deepEqual(r.doc['unreserved'], [
        { sandbox: 'c1', ip: '10.22.0.2', network: 'dup13', action: 'reported', reservedFor: null, message: 'live sandbox c1 has no reservation for its IP 10.22.0.2' },
      ]);
      assert.deepEqual(r.doc['released'], []);
      assert.deepEqual(filesOf('dup13'), afterC5);
    });

    it('gc re-reserves .2 for c1 while still free (last_reserved_ip.0 untouched, audited), frees nothing; ADD c6 then cannot take it', async () => {
      await upToC5();
      const dry = await cli('gc', c1to5, { dryRun: true });
      assert.equal((dry.doc['unreserved'] as Array<{ action: string }>)[0]?.action, 'reported');
      assert.deepEqual(filesOf('dup13'), afterC5);

      const r = await cli('gc', c1to5);
      assert.equal(r.code, 0);
      assert.equal(r.stderr, '');
      assert.deepEqual(r.doc['unreserved'], [
        { sandbox: 'c1', ip: '10.22.0.2', network: 'dup13', action: 're-reserved', reservedFor: null, message: 'live sandbox c1 has no reservation for its IP 10.22.0.2' },
      ]);
      assert.deepEqual(r.doc['released'], []);
      assert.deepEqual(filesOf('dup13'), { '10.22.0.2': 'c1\r\neth0', ...afterC5 });
      const audit = readFileSync(join(dataDir, '.ipwarden-audit.log'), 'utf8');
      assert.equal(
        audit,
        '{"time":"2025-01-01T00:00:00.000Z","network":"dup13","ip":"10.22.0.2","containerId":"c1","ifname":"eth0","ageSeconds":0,"verdict":"live","reason":"re-reserved: live sandbox c1 has no reservation for its IP 10.22.0.2","phase":"reserved"}\n',
      );
      // A second gc finds nothing to do.
      const again = await cli('gc', c1to5);
      assert.deepEqual(again.doc['unreserved'], []);
      // ADD c6 no longer wraps onto c1's address: the /29 is genuinely full now.
      const add = await cni('ADD', 'c6', 'eth0', conf());
      assert.equal(add.code, 1);
      assert.equal(add.json?.['msg'], 'failed to allocate for range 0: no IP addresses available in range set: 10.22.0.1-10.22.0.6');
    });

    it('once ADD c6 wrapped to .2 (upstream behaviour): gc raises the conflict, exits 1, frees nothing', async () => {
      await upToC5();
      assert.equal(addedAddress(await cni('ADD', 'c6', 'eth0', conf())), '10.22.0.2/29');
      const before = filesOf('dup13');
      const r = await cli('gc', { ...c1to5, c6: '10.22.0.2' });
      assert.equal(r.code, 1);
      assert.equal(r.stderr, 'ipwarden: conflict: address 10.22.0.2 of live sandbox c1 is reserved for c6\n');
      assert.deepEqual(r.doc['unreserved'], [
        { sandbox: 'c1', ip: '10.22.0.2', network: 'dup13', action: 'conflict', reservedFor: 'c6', message: 'address 10.22.0.2 of live sandbox c1 is reserved for c6' },
      ]);
      assert.deepEqual(r.doc['released'], []);
      assert.deepEqual(filesOf('dup13'), before);
      assert.equal(existsSync(join(dataDir, '.ipwarden-audit.log')), false);
    });
  });

  it('runtime not reachable: only corrupt files go, whatever their age', async () => {
    disk('cbr0', { '10.244.1.2': 'c1\r\neth0', '10.244.1.3': '', lock: '' });
    const { applied } = await reconcile(null);
    assert.deepEqual(releasedIPs(applied), ['10.244.1.3']);
    assert.deepEqual(filesOf('cbr0'), { '10.244.1.2': 'c1\r\neth0', lock: '' });
  });
});
