/**
 * The kernel address index (issue 19 item 2) in pieces, without root:
 * - `KernelIndex` (src/node/kernel-index.ts) with an injected reader, clock and scheduler: usable
 *   only after a complete read no older than its bound; a failing reader makes it incomplete;
 *   periodic reads; refreshes that start after the call and are shared;
 * - the allocator's `kernelHeld` predicate (src/ipam/allocator.ts) on both paths — the listing path
 *   (memory store) and the daemon's indexed file store — asked only about candidates it would
 *   reserve, in host-local's order, skipping them like reserved ones;
 * - an ADD's use of the hooks (src/cni/commands.ts): a view that cannot be used changes nothing; a
 *   stale view that leaves only skipped addresses is read again once; what is reported;
 * - the daemon's wiring (src/daemon/kernel-addresses.ts): with an injected failing reader, ADDs are
 *   told the index cannot be used, with the log lines and metrics; with a good one, what a skip logs;
 * - `readKernelEvidenceAsync` gives what `readKernelEvidence` gives over a fake procfs, and
 *   `inFlight: false` reads no environment.
 */
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { makeHandlers, type KernelAddressHooks, type KernelAddressView, type PluginDeps } from '../../src/cni/commands.ts';
import { pluginMain } from '../../src/cni/skel.ts';
import { formatIP, parseIP } from '../../src/common/ip.ts';
import { allocate } from '../../src/ipam/allocator.ts';
import { loadIPAMConfig } from '../../src/ipam/config.ts';
import type { IP, RangeSet } from '../../src/ipam/types.ts';
import { readKernelEvidence, readKernelEvidenceAsync, type AddressHolder, type KernelEvidence } from '../../src/node/kernel-evidence.ts';
import { KERNEL_INDEX_INTERVAL_MS, KernelIndex } from '../../src/node/kernel-index.ts';
import { kernelAddresses } from '../../src/daemon/kernel-addresses.ts';
import { createLogger } from '../../src/daemon/log.ts';
import { DaemonMetrics } from '../../src/daemon/metrics.ts';
import { NetworkIndexes } from '../../src/store/file/indexed-store.ts';
import { MemoryStore } from '../../src/store/memory/memory-store.ts';
import type { Store } from '../../src/store/store.ts';

const temps: string[] = [];
after(() => {
  for (const d of temps) rmSync(d, { recursive: true, force: true });
});
function temp(): string {
  const d = mkdtempSync(join(tmpdir(), 'ipw-kidx-unit-'));
  temps.push(d);
  return d;
}

const HOLDER: AddressHolder = { netns: 'net:[4026532455]', via: '/run/netns/cni-9f', pid: null, ifname: null };

function evidence(ips: readonly string[], incomplete: string | null = null): KernelEvidence {
  return { addresses: new Map(ips.map((ip) => [ip, [HOLDER]])), inFlight: new Map(), incomplete, unreadPinDirs: [], namespaces: 1, processes: 1 };
}

/** A manual scheduler: timers run only when the test fires them. */
class Timers {
  pending: Array<{ fn: () => void; ms: number; live: boolean }> = [];
  schedule = (fn: () => void, ms: number): (() => void) => {
    const t = { fn, ms, live: true };
    this.pending.push(t);
    return () => {
      t.live = false;
    };
  };
  live(): Array<{ fn: () => void; ms: number }> {
    return this.pending.filter((t) => t.live);
  }
  /** Run the one live timer. */
  fire(): void {
    const l = this.pending.filter((t) => t.live);
    assert.equal(l.length, 1, 'exactly one timer armed');
    const t = l[0] as { fn: () => void; live: boolean };
    t.live = false;
    t.fn();
  }
}

/** A reader whose reads the test answers one by one. */
class Reads {
  calls = 0;
  private waiting: Array<(e: KernelEvidence) => void> = [];
  read = (): Promise<KernelEvidence> => {
    this.calls++;
    return new Promise((resolve) => this.waiting.push(resolve));
  };
  /** Answer the oldest read in flight. */
  answer(e: KernelEvidence): void {
    const r = this.waiting.shift();
    assert.ok(r !== undefined, 'a read is in flight');
    r(e);
  }
  get inFlight(): number {
    return this.waiting.length;
  }
}

const tick = (): Promise<void> => new Promise((r) => setImmediate(r));

describe('KernelIndex', () => {
  it('usable only after a complete read no older than the bound; incomplete and stale say why', async () => {
    let now = 1000;
    const reads = new Reads();
    const timers = new Timers();
    const seen: Array<[number, number | null]> = [];
    const ix = new KernelIndex({ read: reads.read, now: () => now, schedule: timers.schedule, intervalMs: 2000, maxAgeMs: 5000, onRead: (r, prev) => seen.push([r.generation, prev?.generation ?? null]) });
    assert.deepEqual(ix.state(), { usable: false, read: null, reason: 'no-read', why: 'the kernel address index has no read yet' });
    assert.equal(ix.ageSeconds(), null);
    const started = ix.start();
    now = 1040;
    reads.answer(evidence(['10.1.0.5']));
    await started;
    const st = ix.state();
    assert.equal(st.usable, true);
    assert.deepEqual(st.usable && [st.ageMs, st.read.generation, st.read.startedAtMs, st.read.durationMs, [...st.read.addresses.keys()]], [40, 1, 1000, 40, ['10.1.0.5']]);
    assert.deepEqual(timers.live().map((t) => t.ms), [2000], 'the next read is armed an interval after the end of this one');

    // The next read (fired by the timer) is incomplete: not usable, whatever it holds.
    now = 3040;
    timers.fire();
    assert.equal(reads.calls, 2);
    reads.answer(evidence(['10.1.0.5', '10.1.0.6'], 'cannot read /run/netns: EACCES'));
    await tick();
    assert.deepEqual(ix.state(), { usable: false, read: ix.last, reason: 'incomplete', why: 'the kernel address index is incomplete: cannot read /run/netns: EACCES' });

    // A complete one again, then the clock passes the bound without a new read.
    timers.fire();
    reads.answer(evidence([]));
    await tick();
    assert.equal(ix.state().usable, true);
    now = 3040 + 5000;
    assert.equal(ix.state().usable, true, 'exactly at the bound: usable');
    now = 3040 + 5001;
    assert.deepEqual(ix.state(), { usable: false, read: ix.last, reason: 'stale', why: 'the kernel address index is stale: its last read started 5.0 s ago (bound 5 s)' });
    assert.equal(ix.ageSeconds(), 5.001);
    assert.deepEqual(seen, [[1, null], [2, 1], [3, 2]]);
    await ix.close();
    assert.deepEqual(timers.live(), [], 'closed: nothing armed');
  });

  it('a reader that rejects gives an incomplete read naming the failure', async () => {
    const ix = new KernelIndex({ read: () => Promise.reject(new Error('boom')), schedule: new Timers().schedule });
    await ix.start();
    const st = ix.state();
    assert.deepEqual(!st.usable && [st.reason, st.why, st.read?.generation, st.read?.addresses.size], ['incomplete', 'the kernel address index is incomplete: the read failed: boom', 1, 0]);
    await ix.close();
  });

  it('refresh() while a read runs: waits for it, then makes ONE more read that every caller shares; the timer is re-armed after it', async () => {
    let now = 0;
    const reads = new Reads();
    const timers = new Timers();
    const ix = new KernelIndex({ read: reads.read, now: () => now, schedule: timers.schedule });
    const started = ix.start();
    const a = ix.refresh();
    const b = ix.refresh();
    assert.equal(reads.calls, 1, 'nothing new while the first read runs');
    now = 10;
    reads.answer(evidence(['10.1.0.5']));
    await started;
    await tick();
    assert.equal(reads.calls, 2, 'one read for both refreshes, started after the first ended');
    assert.deepEqual(timers.live(), [], 'no timer while the queued read runs');
    now = 20;
    reads.answer(evidence(['10.1.0.7']));
    const [ra, rb] = await Promise.all([a, b]);
    assert.equal(ra, rb);
    assert.deepEqual([ra.generation, ra.startedAtMs, [...ra.addresses.keys()]], [2, 10, ['10.1.0.7']]);
    assert.deepEqual(timers.live().map((t) => t.ms), [KERNEL_INDEX_INTERVAL_MS]);
    // With no read running, refresh() starts one at once (and disarms the timer).
    const c = ix.refresh();
    assert.deepEqual([reads.calls, timers.live().length], [3, 0]);
    reads.answer(evidence([]));
    assert.equal((await c).generation, 3);
    await ix.close();
    assert.equal((await ix.refresh()).generation, 3, 'closed: the last read, no new one');
    assert.equal(reads.calls, 3);
    const never = new KernelIndex({ read: reads.read });
    await never.close();
    await assert.rejects(never.refresh(), /^Error: the kernel address index is closed$/);
  });
});

// ---------------------------------------------------------------------------------------------

function sets(ranges: unknown): readonly RangeSet[] {
  return loadIPAMConfig(JSON.stringify({ cniVersion: '1.0.0', name: 'n', ipam: { type: 'ipwarden', ranges } }), undefined).rangeSets;
}
const ipOf = (s: string): IP => parseIP(s) as IP;
const SLASH29 = sets([[{ subnet: '10.244.1.0/29' }]]);

interface PredCase {
  name: string;
  seed?: Record<string, string>;
  last?: string;
  held: string[];
  containerId: string;
  requested?: string;
  /** The addresses returned, or the error message. */
  want: string[] | string;
  /** What the predicate was asked, in order. */
  asked: string[];
}

const predCases: PredCase[] = [
  { name: 'from empty, .2 held: .3, asked .2 then .3 (never the gateway .1)', held: ['10.244.1.2'], containerId: 'c1', want: ['10.244.1.3'], asked: ['10.244.1.2', '10.244.1.3'] },
  {
    name: 'after last .3, .4 reserved, .5 held: .6; the reserved .4 is not asked',
    seed: { '10.244.1.4': 'x' },
    last: '10.244.1.3',
    held: ['10.244.1.5'],
    containerId: 'c1',
    want: ['10.244.1.6'],
    asked: ['10.244.1.5', '10.244.1.6'],
  },
  {
    name: 'every free address held: host-local\'s exhaustion message',
    seed: { '10.244.1.4': 'x' },
    held: ['10.244.1.2', '10.244.1.3', '10.244.1.5', '10.244.1.6'],
    containerId: 'c1',
    want: 'failed to allocate for range 0: no IP addresses available in range set: 10.244.1.1-10.244.1.6',
    asked: ['10.244.1.2', '10.244.1.3', '10.244.1.5', '10.244.1.6'],
  },
  {
    name: 'a static request for a held address fails as for a reserved one',
    held: ['10.244.1.5'],
    containerId: 'c1',
    requested: '10.244.1.5',
    want: 'failed to allocate for range 0: requested IP address 10.244.1.5 is not available in range set 10.244.1.1-10.244.1.6',
    asked: ['10.244.1.5'],
  },
  {
    name: 'the container\'s own reservation is returned without asking (its address is configured in its namespace)',
    seed: { '10.244.1.4': 'c1' },
    held: ['10.244.1.4'],
    containerId: 'c1',
    want: ['10.244.1.4'],
    asked: [],
  },
];

async function memoryStore(c: PredCase): Promise<Store> {
  const s = new MemoryStore('n');
  for (const [ip, owner] of Object.entries(c.seed ?? {})) s.seed(ip, { containerId: owner, ifname: 'eth0' });
  if (c.last !== undefined) s.setLastReserved(0, c.last);
  await s.lock(1);
  return s;
}

const indexes = new NetworkIndexes();
after(() => indexes.close());
async function indexedStore(c: PredCase): Promise<Store> {
  const dataDir = temp();
  mkdirSync(join(dataDir, 'n'));
  for (const [ip, owner] of Object.entries(c.seed ?? {})) writeFileSync(join(dataDir, 'n', ip), `${owner}\r\neth0`);
  if (c.last !== undefined) writeFileSync(join(dataDir, 'n', 'last_reserved_ip.0'), c.last);
  const s = (await indexes.openStore({ dataDir, network: 'n', create: true })) as Store;
  await s.lock(1);
  assert.notEqual(s.reservationIndex?.() ?? null, null, 'the indexed path');
  return s;
}

describe('the allocator\'s kernelHeld predicate', () => {
  for (const [path, open] of [['listing path (memory store)', memoryStore], ['indexed path (the daemon\'s file store)', indexedStore]] as const) {
    for (const c of predCases) {
      it(`${path}: ${c.name}`, async () => {
        const store = await open(c);
        const asked: string[] = [];
        const held = new Set(c.held);
        let got: string[] | string;
        try {
          const allocs = await allocate(store, { containerId: c.containerId, ifname: 'eth0', rangeSets: SLASH29, requestedIPs: c.requested === undefined ? [] : [ipOf(c.requested)] }, undefined, (ip) => {
            asked.push(formatIP(ip));
            return held.has(formatIP(ip));
          });
          got = allocs.map((a) => formatIP(a.ip));
        } catch (e) {
          got = (e as Error).message;
        } finally {
          await store.close();
        }
        assert.deepEqual([got, asked], [c.want, c.asked]);
      });
    }
  }
});

// ---------------------------------------------------------------------------------------------

/** Hooks over a sequence of views (the first for `view`, the next for `fresh`), recording what was reported. */
function hooksOver(views: Array<readonly string[] | null>) {
  const calls: string[] = [];
  const reports: unknown[] = [];
  const viewOf = (ips: readonly string[] | null): KernelAddressView | null =>
    ips === null ? null : { heldBy: (ip) => (ips.includes(formatIP(ip)) ? 'net:[4026532455] via /run/netns/cni-9f' : null) };
  let i = 0;
  const hooks: KernelAddressHooks = {
    view: (req) => (calls.push(`view ${req.network} ${req.containerId}`), viewOf(views[i++] ?? null)),
    fresh: async (req) => (calls.push(`fresh ${req.network} ${req.containerId}`), viewOf(views[i++] ?? null)),
    skipped: (e) => void reports.push(e),
  };
  return { hooks, calls, reports };
}

async function addThrough(store: MemoryStore, hooks: KernelAddressHooks): Promise<{ code: number; out: Record<string, unknown> }> {
  const deps: PluginDeps = { openStore: async () => store, readTextFile: () => '', kernel: hooks };
  let out = '';
  const code = await pluginMain(makeHandlers(deps), {
    env: { CNI_COMMAND: 'ADD', CNI_CONTAINERID: 'c9', CNI_IFNAME: 'eth0', CNI_NETNS: '/x', CNI_PATH: '/p' },
    readStdin: async () => Buffer.from(JSON.stringify({ cniVersion: '1.0.0', name: 'n', ipam: { type: 'ipwarden', ranges: [[{ subnet: '10.244.1.0/29' }]] } })),
    stdout: (t) => void (out += t),
    stderr: () => undefined,
  });
  return { code, out: JSON.parse(out) as Record<string, unknown> };
}

/** A store whose only free address is .6 (last .5, .2–.5 reserved). */
function nearlyFull(): MemoryStore {
  const s = new MemoryStore('n');
  for (const k of [2, 3, 4, 5]) s.seed(`10.244.1.${k}`, { containerId: `p${k}`, ifname: 'eth0' });
  return s.setLastReserved(0, '10.244.1.5');
}

describe('an ADD with the kernel address hooks', () => {
  it('a view that cannot be used (null): allocates as host-local, reports nothing', async () => {
    const h = hooksOver([null]);
    const r = await addThrough(nearlyFull(), h.hooks);
    assert.deepEqual([r.code, r.out['ips']], [0, [{ address: '10.244.1.6/29', gateway: '10.244.1.1' }]]);
    assert.deepEqual([h.calls, h.reports], [['view n c9'], []]);
  });

  it('the only free address held in the view, gone in a fresh read: read once more, the ADD gets it, no conflict reported', async () => {
    const h = hooksOver([['10.244.1.6'], []]);
    const r = await addThrough(nearlyFull(), h.hooks);
    assert.deepEqual([r.code, r.out['ips']], [0, [{ address: '10.244.1.6/29', gateway: '10.244.1.1' }]]);
    assert.deepEqual([h.calls, h.reports], [['view n c9', 'fresh n c9'], []]);
  });

  it('the only free address held in the view, and the fresh read unusable (incomplete): not handed out; the exhaustion stands, naming it', async () => {
    const h = hooksOver([['10.244.1.6'], null]);
    const store = nearlyFull();
    const r = await addThrough(store, h.hooks);
    assert.deepEqual([r.code, r.out['code'], r.out['msg']], [1, 999, 'failed to allocate for range 0: no IP addresses available in range set: 10.244.1.1-10.244.1.6']);
    assert.match(String(r.out['details']), /configured in a network namespace with no reservation file: 10\.244\.1\.6 \(net:\[4026532455\] via \/run\/netns\/cni-9f\)/);
    assert.deepEqual(h.calls, ['view n c9', 'fresh n c9']);
    assert.equal(store.snapshot().reservations['10.244.1.6'], undefined, 'nothing written for it');
  });

  it('still held after the fresh read: host-local\'s exhaustion message, the details name it, the conflict is reported once', async () => {
    const h = hooksOver([['10.244.1.6'], ['10.244.1.6']]);
    const store = nearlyFull();
    const r = await addThrough(store, h.hooks);
    assert.deepEqual(r, {
      code: 1,
      out: {
        cniVersion: '1.0.0',
        code: 999,
        msg: 'failed to allocate for range 0: no IP addresses available in range set: 10.244.1.1-10.244.1.6',
        details: 'range set 0 has 5 allocatable addresses and 4 reservations; not handed out, configured in a network namespace with no reservation file: 10.244.1.6 (net:[4026532455] via /run/netns/cni-9f)',
      },
    });
    assert.deepEqual(h.calls, ['view n c9', 'fresh n c9']);
    assert.deepEqual(h.reports, [{ network: 'n', containerId: 'c9', conflicts: [{ ip: '10.244.1.6', heldBy: 'net:[4026532455] via /run/netns/cni-9f' }], addresses: [] }]);
    assert.equal(store.snapshot().reservations['10.244.1.6'], undefined, 'nothing written for it');
  });

  it('a held address skipped on the way: the next one, reported with what the ADD returned', async () => {
    const h = hooksOver([['10.244.1.2']]);
    const r = await addThrough(new MemoryStore('n'), h.hooks);
    assert.deepEqual([r.code, r.out['ips']], [0, [{ address: '10.244.1.3/29', gateway: '10.244.1.1' }]]);
    assert.deepEqual(h.reports, [{ network: 'n', containerId: 'c9', conflicts: [{ ip: '10.244.1.2', heldBy: 'net:[4026532455] via /run/netns/cni-9f' }], addresses: ['10.244.1.3'] }]);
  });
});

// ---------------------------------------------------------------------------------------------

describe('readKernelEvidenceAsync', () => {
  const FIB = 'Main:\n  +-- 0.0.0.0/0 3 0 5\n     |-- 10.1.0.5\n        /32 host LOCAL\nLocal:\n';
  /** A fake procfs: pid 2 kthreadd and 200 processes in 3 namespaces, one of them a CNI ADD. */
  function proc(): string {
    const root = temp();
    const mk = (pid: number, netns: string, fib: string, environ: string, comm: string, stat?: string): void => {
      const d = join(root, String(pid));
      mkdirSync(join(d, 'ns'), { recursive: true });
      symlinkSync(netns, join(d, 'ns', 'net'));
      mkdirSync(join(d, 'net'));
      writeFileSync(join(d, 'net', 'fib_trie'), fib);
      writeFileSync(join(d, 'net', 'if_inet6'), '');
      writeFileSync(join(d, 'environ'), environ);
      writeFileSync(join(d, 'comm'), `${comm}\n`);
      if (stat !== undefined) writeFileSync(join(d, 'stat'), stat);
    };
    mk(2, 'net:[1]', FIB.replace('10.1.0.5', '10.1.0.1'), '', 'kthreadd', '2 (kthreadd) S 0 0 0 0 -1 0\n');
    for (let pid = 10; pid < 210; pid++) {
      const ns = pid % 3;
      mk(pid, `net:[${100 + ns}]`, FIB.replace('10.1.0.5', `10.1.0.${10 + ns}`), pid === 77 ? 'CNI_COMMAND=ADD\0CNI_CONTAINERID=abc\0CNI_IFNAME=eth0\0' : 'PATH=/bin\0', 'sh');
    }
    return root;
  }
  const plain = (e: KernelEvidence) => ({ ...e, addresses: [...e.addresses].map(([k, v]) => [k, [...v]]), inFlight: [...e.inFlight].map(([k, v]) => [k, [...v]]) });

  it('gives exactly what the synchronous read gives (200 processes: more than one pause)', async () => {
    const root = proc();
    const opts = { procDir: root, netnsDirs: [], euid: 0 };
    const sync = readKernelEvidence(opts);
    assert.deepEqual([sync.incomplete, sync.namespaces, sync.processes, [...sync.addresses.keys()].sort(), [...sync.inFlight.keys()]], [null, 4, 201, ['10.1.0.1', '10.1.0.10', '10.1.0.11', '10.1.0.12'], ['abc']]);
    assert.deepEqual(plain(await readKernelEvidenceAsync(opts)), plain(sync));
  });

  it('inFlight: false reads no environment: no operations, and an unreadable environ is no gap', async () => {
    const root = proc();
    rmSync(join(root, '50', 'environ'));
    mkdirSync(join(root, '50', 'environ'));
    const opts = { procDir: root, netnsDirs: [], euid: 0 };
    assert.equal(readKernelEvidence(opts).incomplete, `cannot read ${root}/50/environ: EISDIR`);
    const ev = await readKernelEvidenceAsync({ ...opts, inFlight: false });
    assert.deepEqual([ev.incomplete, ev.inFlight.size, ev.addresses.size, ev.processes], [null, 0, 4, 201]);
  });
});

// ---------------------------------------------------------------------------------------------

describe("the daemon's wiring of the index (log lines, metrics)", () => {
  async function wired(read: () => Promise<KernelEvidence>) {
    const lines: Array<Record<string, unknown>> = [];
    const log = createLogger('debug', { stream: { write: (t: string) => void lines.push(JSON.parse(t) as Record<string, unknown>) } });
    const metrics = new DaemonMetrics();
    const k = kernelAddresses(log, metrics.kernelIndex, { read, schedule: new Timers().schedule });
    const part = await k.part({ options: {} as never, log });
    const series = async (prefix: string): Promise<string[]> => (await metrics.registry.metrics()).split('\n').filter((l) => l.startsWith(prefix));
    const msgs = (): Array<[unknown, unknown]> => lines.filter((l) => l['msg'] !== 'kernel address index read').map((l) => [l['level'], l['msg']]);
    return { k, part, lines, series, msgs };
  }

  it('an injected reader that fails: the ADD gets no view, and the log and the metrics say why', async () => {
    const w = await wired(() => Promise.reject(new Error('boom')));
    assert.equal(w.k.hooks.view({ network: 'n', containerId: 'c1' }), null);
    assert.deepEqual(w.msgs(), [
      [40, 'kernel address index incomplete: ADDs do not use it'],
      [40, 'ADD did not use the kernel address index'],
    ]);
    const unused = w.lines.find((l) => l['msg'] === 'ADD did not use the kernel address index') as Record<string, unknown>;
    assert.deepEqual([unused['part'], unused['network'], unused['containerId'], unused['reason'], unused['generation']], ['kernel-index', 'n', 'c1', 'the kernel address index is incomplete: the read failed: boom', 1]);
    assert.deepEqual(await w.series('ipwarden_allocation_kernel_index_unused_total'), ['ipwarden_allocation_kernel_index_unused_total{network="n",reason="incomplete"} 1']);
    assert.deepEqual(await w.series('ipwarden_kernel_index_reads_total'), ['ipwarden_kernel_index_reads_total{result="incomplete"} 1']);
    await w.part.close();
  });

  it('a good reader: the view names the holders; a skip is logged and counted', async () => {
    const w = await wired(async () => evidence(['10.244.1.2']));
    const view = w.k.hooks.view({ network: 'n', containerId: 'c1' });
    assert.deepEqual([view?.heldBy(ipOf('10.244.1.2')), view?.heldBy(ipOf('10.244.1.3'))], ['net:[4026532455] via /run/netns/cni-9f', null]);
    w.k.hooks.skipped({ network: 'n', containerId: 'c1', conflicts: [{ ip: '10.244.1.2', heldBy: 'net:[4026532455] via /run/netns/cni-9f' }], addresses: ['10.244.1.3'] });
    assert.deepEqual(w.msgs(), [
      [30, 'kernel address index complete'],
      [40, 'ADD skipped addresses configured in a network namespace with no reservation file'],
    ]);
    assert.deepEqual(await w.series('ipwarden_allocation_kernel_conflicts_total'), ['ipwarden_allocation_kernel_conflicts_total{network="n"} 1']);
    assert.deepEqual(await w.series('ipwarden_kernel_index_addresses'), ['ipwarden_kernel_index_addresses 1']);
    assert.equal((await w.series('ipwarden_kernel_index_age_seconds')).length, 1);
    // fresh(): a read that starts now, judged as usual.
    assert.notEqual(await w.k.hooks.fresh({ network: 'n', containerId: 'c1' }), null);
    assert.deepEqual(await w.series('ipwarden_kernel_index_reads_total'), ['ipwarden_kernel_index_reads_total{result="complete"} 2']);
    await w.part.close();
  });
});
