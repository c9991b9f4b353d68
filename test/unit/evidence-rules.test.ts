/**
 * The evidence rules of issue 7 as pure logic and over the memory store: kernel evidence in the
 * plan (`inuse`, `unknown` when incomplete), files stamped in the future, reclaim's cap, the pod-IP
 * check and fail-closed status failures, recovery from the kernel with its crash mark and
 * deadline, and which runtime the plugin asks. The real kernel, real host-local and a hostile CRI
 * server are in test/blackbox/evidence.test.ts.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { criSandboxSource } from '../../src/reconcile/cri-source.ts';
import { choosePluginEndpoint, type RuntimeChoiceDeps } from '../../src/cni/heal.ts';
import { AppError } from '../../src/common/errors.ts';
import { loadIPAMConfig } from '../../src/ipam/config.ts';
import type { IPAMConfig } from '../../src/ipam/types.ts';
import { memoryAuditSink } from '../../src/reconcile/audit.ts';
import type { PodIPSource } from '../../src/reconcile/cri-source.ts';
import { NOTHING_IN_USE, unreadableEvidence, type UseEvidence } from '../../src/reconcile/evidence.ts';
import { classify, FUTURE_TOLERANCE_MS, plan, REASONS, type ReservationInput, type SandboxState } from '../../src/reconcile/plan.ts';
import { gcLocked, RECLAIM_CAP, reclaimLocked, recoverLocked, recoveredOwnerId } from '../../src/reconcile/reclaim.ts';
import { MemoryStore } from '../../src/store/memory/memory-store.ts';

const SNAP = Date.UTC(2026, 10, 29, 12);
const OLD = SNAP - 3600_000;

function ev(addresses: Record<string, string[]> = {}, inFlight: Record<string, number> = {}): UseEvidence {
  return {
    addresses: new Map(Object.entries(addresses).map(([ip, ns]) => [ip, ns.map((n) => ({ netns: n, via: `/proc/9/ns/net` }))])),
    inFlight: new Map(Object.entries(inFlight).map(([id, pid]) => [id, [{ pid, command: 'ADD' }]])),
    incomplete: null,
  };
}

const r = (ip: string, containerId: string | null, mtimeMs = OLD): ReservationInput => ({
  network: 'net',
  dir: '/d/net',
  ip,
  owner: containerId === null ? null : { containerId, ifname: 'eth0' },
  mtimeMs,
});

describe('plan with kernel evidence', () => {
  const base = { sandboxes: new Map<string, SandboxState>([['live1', 'ready'], ['nr1', 'notready']]), snapshotAtMs: SNAP, graceSeconds: 300 };
  const cases: Array<{ name: string; rec: ReservationInput; evidence: UseEvidence; policy?: 'conservative' | 'reclaim-notready'; verdict: string; reason: string }> = [
    { name: 'leaked, configured nowhere: leaked', rec: r('10.0.0.2', 'gone'), evidence: ev(), verdict: 'leaked', reason: REASONS.leaked },
    {
      name: 'leaked by the runtime, but configured in a namespace: inuse',
      rec: r('10.0.0.2', 'gone'),
      evidence: ev({ '10.0.0.2': ['net:[4026532301]'] }),
      verdict: 'inuse',
      reason: `${REASONS.inuse}the address is configured in network namespace net:[4026532301] via /proc/9/ns/net`,
    },
    {
      name: 'configured in two namespaces: both named',
      rec: r('10.0.0.2', 'gone'),
      evidence: ev({ '10.0.0.2': ['net:[1]', 'net:[2]'] }),
      verdict: 'inuse',
      reason: `${REASONS.inuse}the address is configured in 2 network namespaces: net:[1] via /proc/9/ns/net, net:[2] via /proc/9/ns/net`,
    },
    {
      name: 'a CNI ADD of its container is running (forward clock step, in-flight ADD): inuse',
      rec: r('10.0.0.2', 'inflight'),
      evidence: ev({}, { inflight: 4242 }),
      verdict: 'inuse',
      reason: `${REASONS.inuse}a CNI ADD for its container is running (pid 4242)`,
    },
    {
      name: 'corrupt but configured: inuse (never released while in use)',
      rec: r('10.0.0.2', null),
      evidence: ev({ '10.0.0.2': ['net:[7]'] }),
      verdict: 'inuse',
      reason: `${REASONS.inuse}the address is configured in network namespace net:[7] via /proc/9/ns/net`,
    },
    {
      name: 'notready by policy, but configured: inuse',
      rec: r('10.0.0.2', 'nr1'),
      evidence: ev({ '10.0.0.2': ['net:[7]'] }),
      policy: 'reclaim-notready',
      verdict: 'inuse',
      reason: `${REASONS.inuse}the address is configured in network namespace net:[7] via /proc/9/ns/net`,
    },
    { name: 'live stays live whatever the kernel says', rec: r('10.0.0.2', 'live1'), evidence: ev({ '10.0.0.2': ['net:[7]'] }), verdict: 'live', reason: REASONS.liveReady },
    {
      name: 'incomplete evidence: a would-be release is unknown',
      rec: r('10.0.0.2', 'gone'),
      evidence: unreadableEvidence('not running as root'),
      verdict: 'unknown',
      reason: `${REASONS.evidenceIncomplete}not running as root`,
    },
    {
      name: 'incomplete evidence: a corrupt file is kept too',
      rec: r('10.0.0.2', null),
      evidence: unreadableEvidence('no host PID namespace'),
      verdict: 'unknown',
      reason: `${REASONS.evidenceIncomplete}no host PID namespace`,
    },
    {
      name: 'stamped 1 h in the future (clock stepped back): grace with its own reason',
      rec: r('10.0.0.2', 'gone', SNAP + 3600_000),
      evidence: ev(),
      verdict: 'grace',
      reason: `${REASONS.future}1h0m0s ahead`,
    },
    {
      name: 'within the tolerance after the snapshot: the ordinary grace',
      rec: r('10.0.0.2', 'gone', SNAP + FUTURE_TOLERANCE_MS),
      evidence: ev(),
      verdict: 'grace',
      reason: REASONS.grace,
    },
  ];
  cases.forEach((c) =>
    it(c.name, () => {
      const e = classify(c.rec, { ...base, policy: c.policy ?? 'conservative', evidence: c.evidence });
      assert.deepEqual([e.verdict, e.reason], [c.verdict, c.reason]);
    }),
  );

  it('counts inuse; release holds only what both witnesses allow', () => {
    const p = plan({ ...base, reservations: [r('10.0.0.2', 'gone'), r('10.0.0.3', 'gone'), r('10.0.0.4', 'live1')], evidence: ev({ '10.0.0.3': ['net:[7]'] }) });
    assert.deepEqual(p.release.map((e) => e.ip), ['10.0.0.2']);
    assert.equal(p.counts.inuse, 1);
    assert.equal(p.counts.leaked, 1);
  });
});

function conf(extra: Record<string, unknown> = {}, subnet = '10.244.0.0/24'): IPAMConfig {
  return loadIPAMConfig(JSON.stringify({ cniVersion: '1.0.0', name: 'net', ipam: { type: 'ipwarden', dataDir: '/nonexistent', ranges: [[{ subnet }]], ...extra } }), undefined);
}

interface Fake {
  list: Array<{ id: string; state: SandboxState; ips?: string[]; status?: 'fails' | 'hangs' | 'notfound' }>;
  listFails?: AppError;
}

function source(f: Fake): PodIPSource {
  return {
    endpoint: 'unix:///fake.sock',
    list: async () => {
      if (f.listFails !== undefined) throw f.listFails;
      return f.list.map((s) => ({ id: s.id, state: s.state }));
    },
    podIPs: (id) => {
      const s = f.list.find((x) => x.id === id);
      if (s?.status === 'hangs') return new Promise<string[]>(() => undefined);
      if (s?.status === 'fails') return Promise.reject(new AppError('RUNTIME_CALL_FAILED', `CRI PodSandboxStatus at unix:///fake.sock failed: UNAVAILABLE: ${id}`));
      if (s?.status === 'notfound') return Promise.reject(new AppError('RUNTIME_CALL_FAILED', `CRI PodSandboxStatus failed: NOT_FOUND: ${id}`));
      return Promise.resolve(s?.ips ?? []);
    },
  };
}

async function locked(store: MemoryStore): Promise<MemoryStore> {
  await store.lock(1);
  return store;
}

describe('reclaim on exhaustion', () => {
  it(`releases at most ${RECLAIM_CAP} per ADD, oldest first, each audited before its file goes`, async () => {
    const store = await locked(new MemoryStore('net', { now: () => SNAP }));
    for (let i = 2; i <= 30; i++) store.seed(`10.244.0.${i}`, `gone${i}|eth0`, OLD - (40 - i) * 1000);
    const audit = memoryAuditSink();
    const o = await reclaimLocked(store, conf(), { source: source({ list: [] }), audit, now: () => SNAP, evidence: () => NOTHING_IN_USE });
    assert.deepEqual(o.released, Array.from({ length: RECLAIM_CAP }, (_, i) => `10.244.0.${i + 2}`));
    assert.equal(o.capped, 29 - RECLAIM_CAP);
    assert.deepEqual(audit.records.filter((x) => x.phase === 'intent').map((x) => x.ip), o.released);
    assert.deepEqual(audit.records.filter((x) => x.phase === 'released').map((x) => x.ip), o.released);
    assert.equal(audit.records.findIndex((x) => x.phase === 'released'), RECLAIM_CAP, 'every intent before the first removal');
  });

  it('an address a READY sandbox reports (BR-13) is not released, whoever owns its file', async () => {
    const store = await locked(new MemoryStore('net', { now: () => SNAP }));
    store.seed('10.244.0.2', 'dead|eth0', OLD).seed('10.244.0.3', 'dead2|eth0', OLD);
    const o = await reclaimLocked(store, conf(), {
      source: source({ list: [{ id: 'pod', state: 'ready', ips: ['10.244.0.2'] }] }),
      audit: memoryAuditSink(),
      now: () => SNAP,
      evidence: () => NOTHING_IN_USE,
    });
    assert.deepEqual(o.released, ['10.244.0.3']);
  });

  it('a failing PodSandboxStatus withholds every release unless the kernel evidence is complete', async () => {
    const fake: Fake = { list: [{ id: 'pod', state: 'ready', status: 'fails' }] };
    const mk = async () => (await locked(new MemoryStore('net', { now: () => SNAP }))).seed('10.244.0.2', 'dead|eth0', OLD);
    const blind = await reclaimLocked(await mk(), conf(), { source: source(fake), audit: memoryAuditSink(), now: () => SNAP, evidence: () => unreadableEvidence('not root') });
    assert.deepEqual(blind.released, []);
    assert.equal(
      blind.withheld,
      'the pod IPs of 1 ready sandbox could not be read (pod: CRI PodSandboxStatus at unix:///fake.sock failed: UNAVAILABLE: pod) and the kernel evidence is incomplete',
    );
    const seen = await reclaimLocked(await mk(), conf(), { source: source(fake), audit: memoryAuditSink(), now: () => SNAP, evidence: () => NOTHING_IN_USE });
    assert.deepEqual(seen.released, ['10.244.0.2']);
  });

  it('a socket that is not CRI is no runtime: nothing released, said so', async () => {
    const store = await locked(new MemoryStore('net', { now: () => SNAP }));
    store.seed('10.244.0.2', 'dead|eth0', OLD);
    const o = await reclaimLocked(store, conf(), {
      source: source({ list: [], listFails: new AppError('RUNTIME_NOT_CRI', 'unix:///fake.sock is not a CRI runtime (runtime.v1 RuntimeService is not implemented)') }),
      audit: memoryAuditSink(),
      now: () => SNAP,
      evidence: () => NOTHING_IN_USE,
    });
    assert.deepEqual(o.released, []);
    assert.equal(o.runtimeError, 'not a CRI runtime: unix:///fake.sock is not a CRI runtime (runtime.v1 RuntimeService is not implemented)');
  });

  it('a file stamped in the future is restamped (its grace period starts now) and not released', async () => {
    let now = SNAP;
    const store = await locked(new MemoryStore('net', { now: () => now }));
    store.seed('10.244.0.2', 'dead|eth0', SNAP + 3600_000);
    const o = await reclaimLocked(store, conf(), { source: source({ list: [] }), audit: memoryAuditSink(), now: () => now, evidence: () => NOTHING_IN_USE });
    assert.deepEqual(o.released, []);
    assert.equal((await store.list())[0]?.mtimeMs, SNAP);
    now = SNAP + 301_000; // one grace period (5m) later
    const later = await reclaimLocked(store, conf(), { source: source({ list: [] }), audit: memoryAuditSink(), now: () => now, evidence: () => NOTHING_IN_USE });
    assert.deepEqual(later.released, ['10.244.0.2']);
  });

  it('`only` limits the release to a static request\'s addresses', async () => {
    const store = await locked(new MemoryStore('net', { now: () => SNAP }));
    store.seed('10.244.0.2', 'dead|eth0', OLD).seed('10.244.0.9', 'dead2|eth0', OLD);
    const o = await reclaimLocked(store, conf(), { source: source({ list: [] }), audit: memoryAuditSink(), now: () => SNAP, evidence: () => NOTHING_IN_USE }, true, ['10.244.0.9']);
    assert.deepEqual(o.released, ['10.244.0.9']);
  });
});

describe('recovery of a wiped directory', () => {
  it('recreates kernel-configured addresses (owner recovered-net-<inode>) and the runtime\'s, marks and clears the recovery', async () => {
    const store = await locked(new MemoryStore('net', { now: () => SNAP }));
    const marks: boolean[] = [];
    const orig = store.markRecovery.bind(store);
    store.markRecovery = async (p) => {
      marks.push(p);
      await orig(p);
    };
    const o = await recoverLocked(store, conf(), {
      source: source({ list: [{ id: 'pod1', state: 'ready', ips: ['10.244.0.7'] }, { id: 'pod2', state: 'ready', status: 'fails' }] }),
      audit: memoryAuditSink(),
      now: () => SNAP,
      // pod2's address is only known to the kernel; 10.244.0.1 is the gateway (host bridge): never recreated.
      evidence: () => ev({ '10.244.0.7': ['net:[11]'], '10.244.0.8': ['net:[4026532301]'], '10.244.0.1': ['net:[4026531992]'], '10.9.9.9': ['net:[3]'] }),
    });
    assert.deepEqual(o.recreated, [
      { ip: '10.244.0.7', containerId: 'pod1' },
      { ip: '10.244.0.8', containerId: recoveredOwnerId('net:[4026532301]') },
    ]);
    assert.equal(recoveredOwnerId('net:[4026532301]'), 'recovered-net-4026532301');
    assert.deepEqual(marks, [true, false]);
    assert.equal(store.recovering, false);
    assert.equal(await store.lastReservedIP(0), null, 'round robin unchanged');
  });

  it('fails closed (code 11) when a status call fails and the kernel evidence is incomplete; the mark is not cleared', async () => {
    const store = await locked(new MemoryStore('net', { now: () => SNAP }));
    store.recovering = true; // a killed recovery
    await assert.rejects(
      recoverLocked(store, conf(), { source: source({ list: [{ id: 'pod2', state: 'ready', status: 'fails' }] }), audit: memoryAuditSink(), now: () => SNAP, evidence: () => unreadableEvidence('not root') }),
      (e: unknown) => e instanceof AppError && e.code === 'RUNTIME_UNAVAILABLE' && e.isRetryable,
    );
    assert.equal(store.recovering, true);
  });

  it('an endpoint that answers but not as gRPC (docker.sock, a ttrpc socket) is a runtime that cannot answer, not "no runtime": code 11', async () => {
    // A real unix socket speaking HTTP/1: grpc-js reports "Protocol error". Taken for "not a CRI
    // runtime", the recovery would let the incomplete kernel evidence decide and hand out addresses.
    const dir = mkdtempSync(join(tmpdir(), 'ipw-http1-'));
    const server = createServer((c) => {
      c.on('error', () => undefined);
      c.once('data', () => c.end('HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n'));
    });
    await new Promise<void>((r) => server.listen(join(dir, 'docker.sock'), r));
    const src = criSandboxSource(`unix://${join(dir, 'docker.sock')}`, 10);
    try {
      const store = await locked(new MemoryStore('net', { now: () => SNAP }));
      await assert.rejects(
        recoverLocked(store, conf(), { source: src, audit: memoryAuditSink(), now: () => SNAP, evidence: () => unreadableEvidence('not root') }),
        (e: unknown) => e instanceof AppError && e.code === 'RUNTIME_UNAVAILABLE' && e.cniCode === 11 && e.isRetryable && /answers, but not as a gRPC server/.test(e.message),
      );
      assert.deepEqual(await store.list(), []);
    } finally {
      await src.close?.();
      await new Promise<void>((r) => server.close(() => r()));
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('a pending mark is never finished on incomplete evidence without a runtime: code 11, the mark stays (review finding)', async () => {
    const store = await locked(new MemoryStore('net', { now: () => SNAP }));
    store.recovering = true;
    await assert.rejects(
      recoverLocked(store, conf(), { source: 'no runtime identified', audit: memoryAuditSink(), now: () => SNAP, evidence: () => unreadableEvidence('cannot enter /run/netns/x') }),
      (e: unknown) =>
        e instanceof AppError &&
        e.isRetryable &&
        e.message === 'a recovery of /nonexistent/net was begun and not finished, and neither the runtime (no runtime identified) nor the kernel (cannot enter /run/netns/x) can say which addresses running pods use',
    );
    assert.equal(store.recovering, true);
  });

  it('an audit log that cannot be written does not stop a recovery (recreating only protects)', async () => {
    const store = await locked(new MemoryStore('net', { now: () => SNAP }));
    const broken = { append: () => { throw new AppError('STORE_IO', 'audit log is a directory'); }, open: () => { throw new AppError('STORE_IO', 'audit log is a directory'); }, sync: () => undefined, close: () => undefined };
    const o = await recoverLocked(store, conf(), { source: 'no runtime', audit: broken, now: () => SNAP, evidence: () => ev({ '10.244.0.9': ['net:[9]'] }) });
    assert.deepEqual(o.recreated, [{ ip: '10.244.0.9', containerId: 'recovered-net-9' }]);
    assert.equal(store.recovering, false);
  });

  it('a sandbox removed since the list (NOT_FOUND) is no gap', async () => {
    const store = await locked(new MemoryStore('net', { now: () => SNAP }));
    const o = await recoverLocked(store, conf(), { source: source({ list: [{ id: 'gone', state: 'notready', status: 'notfound' }] }), audit: memoryAuditSink(), now: () => SNAP, evidence: () => unreadableEvidence('not root') });
    assert.deepEqual(o.recreated, []);
  });

  it('status calls that hang end at the deadline (half of lockTimeout here): then only the kernel decides', async () => {
    const store = await locked(new MemoryStore('net', { now: () => SNAP }));
    const list = Array.from({ length: 40 }, (_, i) => ({ id: `h${i}`, state: 'ready' as const, status: 'hangs' as const }));
    const o = await recoverLocked(store, conf({ lockTimeout: '200ms' }), { source: source({ list }), audit: memoryAuditSink(), now: () => SNAP, evidence: () => ev({ '10.244.0.5': ['net:[5]'] }) });
    assert.deepEqual(o.recreated, [{ ip: '10.244.0.5', containerId: 'recovered-net-5' }]);
    await assert.rejects(
      recoverLocked(await locked(new MemoryStore('net')), conf({ lockTimeout: '200ms' }), { source: source({ list }), audit: memoryAuditSink(), now: () => SNAP, evidence: () => unreadableEvidence('not root') }),
      (e: unknown) => e instanceof AppError && e.code === 'RUNTIME_UNAVAILABLE' && /could not tell the pod IPs of 40 sandboxes \(h0: PodSandboxStatus h0: no answer within the deadline of this ADD\)/.test(e.message),
    );
  });
});

describe('CNI GC under the evidence rules', () => {
  const cands = [
    { ip: '10.244.0.2', owner: { containerId: 'gone', ifname: 'eth0' }, mtimeMs: OLD },
    { ip: '10.244.0.3', owner: { containerId: 'gone2', ifname: 'eth0' }, mtimeMs: OLD },
    { ip: '10.244.0.4', owner: null, mtimeMs: OLD },
  ];
  const seeded = async () => (await locked(new MemoryStore('net', { now: () => SNAP }))).seed('10.244.0.2', 'gone|eth0', OLD).seed('10.244.0.3', 'gone2|eth0', OLD).seed('10.244.0.4', null, OLD);

  it('releases only what the kernel shows in use nowhere, each with an intent line first', async () => {
    const store = await seeded();
    const audit = memoryAuditSink();
    const o = await gcLocked(store, 'net', cands, { audit, now: () => SNAP, evidence: () => ev({ '10.244.0.3': ['net:[7]'] }) });
    assert.deepEqual(o.released, ['10.244.0.2', '10.244.0.4']);
    assert.deepEqual(o.kept, [{ ip: '10.244.0.3', why: 'the address is configured in network namespace net:[7] via /proc/9/ns/net' }]);
    assert.deepEqual(audit.records.map((r) => [r.phase, r.ip]), [['intent', '10.244.0.2'], ['intent', '10.244.0.4'], ['released', '10.244.0.2'], ['released', '10.244.0.4']]);
    assert.deepEqual((await store.list()).map((r) => r.ip), ['10.244.0.3']);
  });

  it('incomplete kernel evidence: the runtime\'s list alone releases nothing', async () => {
    const store = await seeded();
    const o = await gcLocked(store, 'net', cands, { audit: memoryAuditSink(), now: () => SNAP, evidence: () => unreadableEvidence('not root') });
    assert.deepEqual(o.released, []);
    assert.equal(o.kept.length, 3);
    assert.equal((await store.list()).length, 3);
  });
});

const NODE = { url: 'unix:///run/containerd/containerd.sock', path: '/run/containerd/containerd.sock', source: 'the runtime endpoint record /opt/cni/bin/ipwarden.d/runtime-endpoint' };

describe('which runtime the plugin asks', () => {
  const deps = (o: Partial<RuntimeChoiceDeps> & { candidates?: string[]; answering?: string[]; above?: string[] }): RuntimeChoiceDeps => ({
    env: o.env ?? {},
    // The parent (pid 77) listens on `candidates`; its parent (pid 5) on `above`; nothing further up.
    identify: (pid) =>
      pid === undefined
        ? { candidates: o.candidates ?? [], ancestor: { pid: 77, comm: 'containerd' }, reason: 'no ancestor below pid 1 listens on a unix socket' }
        : pid === 77 && (o.above ?? []).length > 0
          ? { candidates: o.above ?? [], ancestor: { pid: 5, comm: 'crio' }, reason: 'ancestor 5 (crio) listens' }
          : { candidates: [], ancestor: null, reason: 'no ancestor below pid 1 listens on a unix socket (walked: none)' },
    probe: async (url) => (o.answering ?? []).includes(url),
    exists: o.exists ?? (() => true),
  });
  const cases: Array<{ name: string; conf: IPAMConfig; deps: RuntimeChoiceDeps; want: { url: string } | { none: string } }> = [
    { name: 'ipam runtimeEndpoint first', conf: conf({ runtimeEndpoint: 'unix:///run/k3s/containerd/containerd.sock' }), deps: deps({ env: { CONTAINER_RUNTIME_ENDPOINT: '/x.sock' } }), want: { url: 'unix:///run/k3s/containerd/containerd.sock' } },
    { name: 'then CONTAINER_RUNTIME_ENDPOINT', conf: conf(), deps: deps({ env: { CONTAINER_RUNTIME_ENDPOINT: '/var/run/crio/crio.sock' } }), want: { url: 'unix:///var/run/crio/crio.sock' } },
    { name: 'a configured socket that does not exist is no runtime', conf: conf({ runtimeEndpoint: '/nope.sock' }), deps: deps({ exists: () => false }), want: { none: 'no CRI runtime at unix:///nope.sock: socket does not exist' } },
    { name: 'the one socket of the runtime that ran us, when it answers as CRI', conf: conf(), deps: deps({ candidates: ['/run/crio/crio.sock'], answering: ['unix:///run/crio/crio.sock'] }), want: { url: 'unix:///run/crio/crio.sock' } },
    {
      name: 'a parent whose one socket is not CRI (a Multus daemon) is passed over for the runtime above it',
      conf: conf(),
      deps: deps({ candidates: ['/run/multus/multus.sock'], above: ['/var/run/crio/crio.sock'], answering: ['unix:///var/run/crio/crio.sock'] }),
      want: { url: 'unix:///var/run/crio/crio.sock' },
    },
    {
      name: 'no ancestor answers as CRI: none, each passed over named',
      conf: conf(),
      deps: deps({ candidates: ['/run/multus/multus.sock'] }),
      want: {
        none: 'no runtimeEndpoint is configured and the runtime that ran this plugin could not be identified: containerd (pid 77) listens on /run/multus/multus.sock, none answers as CRI; above: no ancestor below pid 1 listens on a unix socket (walked: none); nothing is reclaimed, as with host-local',
      },
    },
    {
      name: 'several sockets: the one that answers as CRI',
      conf: conf(),
      deps: deps({ candidates: ['/run/containerd/containerd.sock', '/run/containerd/debug.sock'], answering: ['unix:///run/containerd/containerd.sock'] }),
      want: { url: 'unix:///run/containerd/containerd.sock' },
    },
    {
      name: 'several answer: ambiguous, no reclaim',
      conf: conf(),
      deps: deps({ candidates: ['/a.sock', '/b.sock'], answering: ['unix:///a.sock', 'unix:///b.sock'] }),
      want: { none: 'no runtimeEndpoint is configured and the runtime that ran this plugin (containerd, pid 77) answers as CRI on several sockets (/a.sock, /b.sock): set the ipam key "runtimeEndpoint"; nothing is reclaimed, as with host-local' },
    },
    {
      name: 'not identifiable: no guess among default sockets',
      conf: conf(),
      deps: deps({}),
      want: { none: 'no runtimeEndpoint is configured and the runtime that ran this plugin could not be identified: no ancestor below pid 1 listens on a unix socket; nothing is reclaimed, as with host-local' },
    },
    // The node's runtime endpoint (issue 19 item 5, Multus thick): asked only when the ancestry finds none.
    {
      name: 'no runtime in the ancestry, the node endpoint recorded: that endpoint',
      conf: conf(),
      deps: { ...deps({}), nodeEndpoint: () => NODE },
      want: { url: 'unix:///run/containerd/containerd.sock' },
    },
    {
      name: 'the ancestry passed over a Multus daemon, the node endpoint recorded: that endpoint',
      conf: conf(),
      deps: { ...deps({ candidates: ['/run/multus/multus.sock'] }), nodeEndpoint: () => NODE },
      want: { url: 'unix:///run/containerd/containerd.sock' },
    },
    {
      name: 'the runtime that ran us answers: the node endpoint is not asked',
      conf: conf(),
      deps: { ...deps({ candidates: ['/run/crio/crio.sock'], answering: ['unix:///run/crio/crio.sock'] }), nodeEndpoint: () => assert.fail('asked') },
      want: { url: 'unix:///run/crio/crio.sock' },
    },
    {
      name: 'CONTAINER_RUNTIME_ENDPOINT wins over the node endpoint',
      conf: conf(),
      deps: { ...deps({ env: { CONTAINER_RUNTIME_ENDPOINT: '/var/run/crio/crio.sock' } }), nodeEndpoint: () => assert.fail('asked') },
      want: { url: 'unix:///var/run/crio/crio.sock' },
    },
    {
      name: 'ambiguous ancestry: still none, the node endpoint is not asked',
      conf: conf(),
      deps: { ...deps({ candidates: ['/a.sock', '/b.sock'], answering: ['unix:///a.sock', 'unix:///b.sock'] }), nodeEndpoint: () => assert.fail('asked') },
      want: { none: 'no runtimeEndpoint is configured and the runtime that ran this plugin (containerd, pid 77) answers as CRI on several sockets (/a.sock, /b.sock): set the ipam key "runtimeEndpoint"; nothing is reclaimed, as with host-local' },
    },
    {
      name: 'the node endpoint\'s socket does not exist: none, saying so',
      conf: conf(),
      deps: { ...deps({ exists: () => false }), nodeEndpoint: () => NODE },
      want: {
        none: "no runtimeEndpoint is configured and the runtime that ran this plugin could not be identified: no ancestor below pid 1 listens on a unix socket; the node's runtime endpoint unix:///run/containerd/containerd.sock (the runtime endpoint record /opt/cni/bin/ipwarden.d/runtime-endpoint) does not exist; nothing is reclaimed, as with host-local",
      },
    },
    {
      name: 'a record that is not used: none, with why',
      conf: conf(),
      deps: { ...deps({}), nodeEndpoint: () => ({ ignored: 'the runtime endpoint record /x/ipwarden.d/runtime-endpoint was written on host a, not on this host (b): not used' }) },
      want: {
        none: 'no runtimeEndpoint is configured and the runtime that ran this plugin could not be identified: no ancestor below pid 1 listens on a unix socket; the runtime endpoint record /x/ipwarden.d/runtime-endpoint was written on host a, not on this host (b): not used; nothing is reclaimed, as with host-local',
      },
    },
    {
      name: 'no record: exactly as without the rule',
      conf: conf(),
      deps: { ...deps({}), nodeEndpoint: () => null },
      want: { none: 'no runtimeEndpoint is configured and the runtime that ran this plugin could not be identified: no ancestor below pid 1 listens on a unix socket; nothing is reclaimed, as with host-local' },
    },
  ];
  cases.forEach((c) => it(c.name, async () => assert.deepEqual(await choosePluginEndpoint(c.conf, c.deps), c.want)));
});
