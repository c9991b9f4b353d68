/**
 * Self-healing ADD and STATUS (issue 4) through the real handlers and the real file store, with
 * the runtime's sandbox list faked (pure input): reclaim on exhaustion, the breakdown when it
 * cannot, recovery of a wiped directory, and STATUS's verdict. The same `makeHeal` runs in
 * production over CRI (src/cni/heal.ts); the real-containerd version is test/e2e/heal.test.ts.
 */
import assert from 'node:assert/strict';
import { mkdirSync, readFileSync, utimesSync, writeFileSync, existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { spawnSync } from 'node:child_process';
import { after, describe, it } from 'node:test';
import { makeHandlers } from '../../src/cni/commands.ts';
import { AppError } from '../../src/common/errors.ts';
import { fileDepsWith } from '../../src/cni/plugin.ts';

const fileDeps = fileDepsWith(async () => (await import('../../src/cni/heal.ts')).criHeal);
import { pluginMain } from '../../src/cni/skel.ts';
import { defaultAuditLogPath, openAuditLog, type AuditSink } from '../../src/reconcile/audit.ts';
import type { PodIPSource } from '../../src/reconcile/cri-source.ts';
import { makeHeal } from '../../src/reconcile/reclaim.ts';
import { NOTHING_IN_USE, unreadableEvidence, type UseEvidence } from '../../src/reconcile/evidence.ts';

/** Complete kernel evidence with these addresses configured (IP → namespace identity). */
function evidenceOf(addresses: Record<string, string>, inFlight: Record<string, number> = {}): UseEvidence {
  return {
    addresses: new Map(Object.entries(addresses).map(([ip, netns]) => [ip, [{ netns, via: '/run/netns/test' }]])),
    inFlight: new Map(Object.entries(inFlight).map(([id, pid]) => [id, [{ pid, command: 'ADD' }]])),
    incomplete: null,
  };
}
import type { SandboxState } from '../../src/reconcile/plan.ts';
import { snapshotDir as rawSnapshot, tempDir } from '../helpers/cni.ts';

/** The network directory's files, without the lock file (created by the first locked command). */
function snapshotDir(dir: string): Record<string, string> {
  const s = rawSnapshot(dir);
  delete s['lock'];
  return s;
}

const NOW = Date.parse('2026-11-29T12:00:00Z');
const OLD = (NOW - 3600_000) / 1000; // an hour ago, seconds (utimes)
const cleanups: Array<() => void> = [];
after(() => cleanups.forEach((c) => c()));

interface FakeRuntime {
  sandboxes: Map<string, { state: SandboxState; ips: string[]; statusFails?: boolean }>;
  calls: number;
  /** When set, ListPodSandbox fails with this message. */
  listFails?: string;
}

function fakeSource(rt: FakeRuntime | string): () => PodIPSource | string {
  return () =>
    typeof rt === 'string'
      ? rt
      : {
          endpoint: 'unix:///fake/cri.sock',
          list: async () => {
            rt.calls++;
            if (rt.listFails !== undefined) throw new Error(rt.listFails);
            return [...rt.sandboxes].map(([id, s]) => ({ id, state: s.state }));
          },
          podIPs: async (id) => {
            const sb = rt.sandboxes.get(id);
            if (sb?.statusFails === true) throw new Error(`NotFound: sandbox ${id}`);
            return sb?.ips ?? [];
          },
        };
}

function setup(files: Record<string, string>, ipam: Record<string, unknown> = {}, subnet = '10.244.1.0/29', sub = '') {
  const t = tempDir('ipw-heal-');
  cleanups.push(t.cleanup);
  const dataDir = join(t.dir, sub);
  const dir = join(dataDir, 'kubenet');
  mkdirSync(dir, { recursive: true });
  for (const [name, content] of Object.entries(files)) {
    writeFileSync(join(dir, name), content.replace('|', '\r\n'));
    utimesSync(join(dir, name), OLD, OLD);
  }
  const conf = { cniVersion: '1.1.0', name: 'kubenet', ipam: { type: 'ipwarden', dataDir, ranges: [[{ subnet }]], ...ipam } };
  return { dataDir, dir, conf };
}

async function invoke(
  rt: FakeRuntime | string,
  command: string,
  stdin: object,
  containerId = 'c6',
  audit?: (c: { dataDir: string }) => AuditSink,
  evidence: UseEvidence = NOTHING_IN_USE,
) {
  const deps = {
    ...fileDeps,
    heal: makeHeal({
      source: fakeSource(rt),
      audit: audit ?? ((c) => openAuditLog(defaultAuditLogPath(c.dataDir))),
      now: () => NOW,
      evidence: () => evidence,
    }),
  };
  let out = '';
  const code = await pluginMain(makeHandlers(deps), {
    env: { CNI_COMMAND: command, CNI_CONTAINERID: containerId, CNI_IFNAME: 'eth0', CNI_NETNS: '/x', CNI_PATH: '/p' },
    readStdin: async () => Buffer.from(JSON.stringify(stdin)),
    stdout: (t) => (out += t),
    stderr: () => undefined,
  });
  return { code, json: out === '' ? null : (JSON.parse(out) as Record<string, unknown>) };
}

const full = { '10.244.1.2': 'c1|eth0', '10.244.1.3': 'c2|eth0', '10.244.1.4': 'c3|eth0', '10.244.1.5': 'c4|eth0', '10.244.1.6': 'c5|eth0', 'last_reserved_ip.0': '10.244.1.6' };
const runtime = (ids: string[], state: SandboxState = 'ready'): FakeRuntime => ({ sandboxes: new Map(ids.map((id) => [id, { state, ips: [] }])), calls: 0 });
const EXHAUSTED = 'failed to allocate for range 0: no IP addresses available in range set: 10.244.1.1-10.244.1.6';

describe('reclaim on exhaustion (BR-23 second half, BR-20)', () => {
  it('releases the leaked reservations under the lock, records them, and the ADD succeeds', async () => {
    const { dataDir, dir, conf } = setup(full);
    const r = await invoke(runtime(['c3', 'c4', 'c5']), 'ADD', conf);
    assert.equal(r.code, 0, JSON.stringify(r.json));
    assert.deepEqual(r.json?.['ips'], [{ address: '10.244.1.2/29', gateway: '10.244.1.1' }]);
    const files = snapshotDir(dir);
    assert.equal(files['10.244.1.2'], 'c6\r\neth0');
    assert.equal(files['10.244.1.3'], undefined, 'c2 leaked: released');
    assert.deepEqual([files['10.244.1.4'], files['10.244.1.5'], files['10.244.1.6']], ['c3\r\neth0', 'c4\r\neth0', 'c5\r\neth0']);
    const audit = readFileSync(defaultAuditLogPath(dataDir), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as Record<string, unknown>);
    assert.deepEqual(
      audit.map((a) => [a['network'], a['ip'], a['containerId'], a['ifname'], a['verdict'], a['ageSeconds'], a['phase']]),
      [
        ['kubenet', '10.244.1.2', 'c1', 'eth0', 'leaked', 3600, 'intent'],
        ['kubenet', '10.244.1.3', 'c2', 'eth0', 'leaked', 3600, 'intent'],
        ['kubenet', '10.244.1.2', 'c1', 'eth0', 'leaked', 3600, 'released'],
        ['kubenet', '10.244.1.3', 'c2', 'eth0', 'leaked', 3600, 'released'],
      ],
    );
    for (const a of audit) assert.match(String(a['reason']), /^reclaimed on exhaustion: sandbox not listed by the runtime/);
  });

  it('with reclaimOnExhaustion false: host-local exact message, breakdown in details, nothing released', async () => {
    const { dataDir, dir, conf } = setup(full, { reclaimOnExhaustion: false });
    const before = snapshotDir(dir);
    const r = await invoke(runtime(['c3', 'c4', 'c5']), 'ADD', conf);
    assert.deepEqual(r.json, {
      cniVersion: '1.1.0',
      code: 999,
      msg: EXHAUSTED,
      details: `range set 0 has 5 allocatable addresses and 5 reservations; 5 reservations: 3 live, 0 in grace (younger than 5m0s), 2 leaked, 0 corrupt; automatic reclaim is off (reclaimOnExhaustion: false): run "ipwarden gc --network kubenet --data-dir ${dataDir}"`,
    });
    assert.deepEqual(snapshotDir(dir), before);
  });

  it('the suggested command is shell-quoted: a data dir with a space and a quote pastes as one word', async () => {
    const { dataDir, conf } = setup(full, { reclaimOnExhaustion: false }, '10.244.1.0/29', "my cni's data");
    const r = await invoke(runtime(['c3', 'c4', 'c5']), 'ADD', conf);
    const quoted = `'${dataDir.replace("'", "'\\''")}'`;
    assert.equal(quoted, `'${dirname(dataDir)}/my cni'\\''s data'`);
    assert.equal(
      r.json?.['details'],
      `range set 0 has 5 allocatable addresses and 5 reservations; 5 reservations: 3 live, 0 in grace (younger than 5m0s), 2 leaked, 0 corrupt; automatic reclaim is off (reclaimOnExhaustion: false): run "ipwarden gc --network kubenet --data-dir ${quoted}"`,
    );
    // What a shell makes of the printed command: the data dir as one argument, unchanged.
    const cmd = /run "(ipwarden gc [^"]+)"$/.exec(String(r.json?.['details']))?.[1] ?? '';
    const sh = spawnSync('sh', ['-c', `set -- ${cmd}; printf '%s\\n' "$#" "$6"`], { encoding: 'utf8' });
    assert.equal(sh.stdout, `6\n${dataDir}\n`);
  });

  it('a genuinely full range (every owner live) fails with the exact text and says so', async () => {
    const { dir, conf } = setup(full);
    const before = snapshotDir(dir);
    const r = await invoke(runtime(['c1', 'c2', 'c3', 'c4', 'c5'], 'notready'), 'ADD', conf);
    assert.equal(r.json?.['msg'], EXHAUSTED);
    assert.equal(
      r.json?.['details'],
      'range set 0 has 5 allocatable addresses and 5 reservations; 5 reservations: 5 live, 0 in grace (younger than 5m0s), 0 leaked, 0 corrupt; every reservation belongs to a sandbox the runtime lists: the range is genuinely full — widen it or run fewer pods on this node',
    );
    assert.deepEqual(snapshotDir(dir), before);
  });

  it('reservations younger than leakGracePeriod are not reclaimed (an ADD may be in flight)', async () => {
    const { dir, conf } = setup(full, { leakGracePeriod: '2h' });
    const r = await invoke(runtime(['c3', 'c4', 'c5']), 'ADD', conf);
    assert.equal(r.json?.['msg'], EXHAUSTED);
    assert.match(String(r.json?.['details']), /0 leaked, 0 corrupt; the range is full of recent reservations: run "ipwarden gc --network kubenet --data-dir \/[^"]+" after 2h0m0s/);
    assert.equal(Object.keys(snapshotDir(dir)).length, 6);
  });

  it('an audit log that cannot be written stops the reclaim before anything is released', async () => {
    const { dir, conf } = setup(full);
    const before = snapshotDir(dir);
    const broken = (): AuditSink => ({
      append: () => assert.fail('nothing may be released, so nothing is appended'),
      sync: () => assert.fail('nothing may be released, so nothing is synced'),
      open: () => {
        throw new AppError('STORE_IO', 'cannot open the audit log /x/ipwarden-audit.log: EROFS');
      },
      close: () => undefined,
    });
    const r = await invoke(runtime(['c3', 'c4', 'c5']), 'ADD', conf, 'c6', broken);
    assert.deepEqual([r.code, r.json?.['code'], r.json?.['msg']], [1, 5, 'cannot open the audit log /x/ipwarden-audit.log: EROFS']);
    assert.deepEqual(snapshotDir(dir), before);
  });

  it('when the runtime cannot be asked nothing is released and details say why', async () => {
    const { dir, conf } = setup(full);
    const before = snapshotDir(dir);
    const r = await invoke('no CRI runtime at unix:///x: socket does not exist', 'ADD', conf);
    assert.equal(r.json?.['msg'], EXHAUSTED);
    assert.match(String(r.json?.['details']), /the runtime could not be asked \(no CRI runtime at unix:\/\/\/x: socket does not exist\), so leaked reservations cannot be told from live ones/);
    assert.deepEqual(snapshotDir(dir), before);
  });
});

describe('recovery of a wiped data directory', () => {
  it('recreates the reservations of running sandboxes before handing out an address', async () => {
    const { dir, conf } = setup({});
    const rt: FakeRuntime = {
      sandboxes: new Map([
        ['s-a', { state: 'ready', ips: ['10.244.1.2'] }],
        ['s-b', { state: 'ready', ips: ['10.244.1.3', 'fd00::3'] }],
        ['s-c', { state: 'notready', ips: [] }],
        ['s-other', { state: 'ready', ips: ['192.168.7.7'] }],
      ]),
      calls: 0,
    };
    const r = await invoke(rt, 'ADD', conf, 'new1');
    assert.equal(r.code, 0, JSON.stringify(r.json));
    assert.deepEqual(r.json?.['ips'], [{ address: '10.244.1.4/29', gateway: '10.244.1.1' }]);
    const files = snapshotDir(dir);
    assert.equal(files['10.244.1.2'], 's-a\r\neth0');
    assert.equal(files['10.244.1.3'], 's-b\r\neth0');
    assert.equal(files['10.244.1.4'], 'new1\r\neth0');
  });

  it('a sandbox that cannot be looked up is skipped; a NOT READY sandbox that still has its IP is protected', async () => {
    const { dir, conf } = setup({});
    const rt: FakeRuntime = {
      sandboxes: new Map([
        ['s-a', { state: 'ready', ips: ['10.244.1.2'] }],
        ['gone', { state: 'ready', ips: [], statusFails: true }],
        ['s-nr', { state: 'notready', ips: ['10.244.1.3'] }],
      ]),
      calls: 0,
    };
    const r = await invoke(rt, 'ADD', conf, 'new1');
    assert.deepEqual(r.json?.['ips'], [{ address: '10.244.1.4/29', gateway: '10.244.1.1' }]);
    const files = snapshotDir(dir);
    assert.deepEqual([files['10.244.1.2'], files['10.244.1.3']], ['s-a\r\neth0', 's-nr\r\neth0']);
  });

  it('a runtime that exists but cannot list its sandboxes, and incomplete kernel evidence: try again later (code 11), nothing handed out', async () => {
    const { dir, conf } = setup({});
    const r = await invoke({ sandboxes: new Map(), calls: 0, listFails: 'DEADLINE_EXCEEDED' }, 'ADD', conf, 'new1', undefined, unreadableEvidence('not root'));
    assert.equal(r.code, 1);
    assert.equal(r.json?.['code'], 11);
    assert.equal(
      r.json?.['msg'],
      `the network directory ${conf.ipam.dataDir}/kubenet has no reservations, the runtime at unix:///fake/cri.sock cannot list its sandboxes: DEADLINE_EXCEEDED, and the kernel evidence is incomplete (not root): handing out an address now could give away a running pod's`,
    );
    assert.deepEqual(Object.keys(snapshotDir(dir)), []);
  });

  it('a runtime that cannot list, with complete kernel evidence: the addresses configured in namespaces are recreated first (issue 7)', async () => {
    const { dir, conf } = setup({});
    const ev = evidenceOf({ '10.244.1.2': 'net:[4026532301]' });
    const r = await invoke({ sandboxes: new Map(), calls: 0, listFails: 'DEADLINE_EXCEEDED' }, 'ADD', conf, 'new1', undefined, ev);
    assert.equal(r.code, 0, JSON.stringify(r.json));
    assert.deepEqual(r.json?.['ips'], [{ address: '10.244.1.3/29', gateway: '10.244.1.1' }]);
    assert.deepEqual(snapshotDir(dir), { '10.244.1.2': 'recovered-net-4026532301\r\neth0', '10.244.1.3': 'new1\r\neth0', 'last_reserved_ip.0': '10.244.1.3' });
  });

  it('a directory emptied by DELs (last_reserved_ip kept) is trusted: the runtime is not asked', async () => {
    const { conf } = setup({ 'last_reserved_ip.0': '10.244.1.3' });
    const rt = runtime(['s-a']);
    const r = await invoke(rt, 'ADD', conf, 'new1');
    assert.deepEqual(r.json?.['ips'], [{ address: '10.244.1.4/29', gateway: '10.244.1.1' }]);
    assert.equal(rt.calls, 0);
  });

  it('without a reachable runtime ADD proceeds as host-local would', async () => {
    const { dir, conf } = setup({});
    const r = await invoke('no CRI runtime found', 'ADD', conf, 'new1');
    assert.deepEqual(r.json?.['ips'], [{ address: '10.244.1.2/29', gateway: '10.244.1.1' }]);
    assert.equal(existsSync(join(dir, '10.244.1.2')), true);
  });
});

describe('STATUS', () => {
  it('by default is ready on a full range, even when every owner is live, and asks no runtime', async () => {
    const { dir, conf } = setup(full);
    const before = snapshotDir(dir);
    const rt = runtime(['c1', 'c2', 'c3', 'c4', 'c5']);
    const r = await invoke(rt, 'STATUS', conf);
    assert.deepEqual([r.code, r.json, rt.calls], [0, null, 0]);
    assert.deepEqual(snapshotDir(dir), before, 'STATUS changes nothing');
  });

  it('with failStatusOnExhaustion: ready when the full range holds leaked reservations (the next ADD reclaims them)', async () => {
    const { dir, conf } = setup(full, { failStatusOnExhaustion: true });
    const before = snapshotDir(dir);
    const r = await invoke(runtime(['c3']), 'STATUS', conf);
    assert.deepEqual([r.code, r.json], [0, null]);
    assert.deepEqual(snapshotDir(dir), before, 'STATUS releases nothing');
  });

  it('with failStatusOnExhaustion: code 50 with the breakdown when nothing is reclaimable', async () => {
    const { conf } = setup(full, { failStatusOnExhaustion: true });
    const r = await invoke(runtime(['c1', 'c2', 'c3', 'c4', 'c5']), 'STATUS', conf);
    assert.deepEqual(r.json, {
      cniVersion: '1.1.0',
      code: 50,
      msg: `no IP addresses available in range set: 10.244.1.1-10.244.1.6; range set 0: 5 of 5 addresses reserved; 5 reservations: 5 live, 0 in grace (younger than 5m0s), 0 leaked, 0 corrupt; every reservation belongs to a sandbox the runtime lists: the range is genuinely full — widen it or run fewer pods on this node`,
    });
  });
});
