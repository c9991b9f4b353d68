/**
 * Offline allocation in a cluster pool (issue 11; docs/cluster.md "Offline allocation") on the
 * memory KV: the config rules; the reserve kept at K in the node's own blocks and never handed out
 * by claims, borrowers or other nodes; an offline ADD from the reserve with its journal entry; a
 * repeated offline ADD; an offline DEL; the budget measured on an injected monotonic clock (no
 * sleeps); the sync on reconnect with exact keys and values; a sync after a daemon "crash" (new
 * sessions reading the journal); a reserve gone (`--finish`) reported and the journal kept; the
 * veto window sized by the node's settings; the journal's file rules.
 */
import { after, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { chmodSync, existsSync, lstatSync, mkdirSync, renameSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { hostname, tmpdir } from 'node:os';
import { join } from 'node:path';
import { AppError, isAppError } from '../../src/common/errors.ts';
import { formatIP } from '../../src/common/ip.ts';
import { loadIPAMConfig } from '../../src/ipam/config.ts';
import { PoolAllocator, type PoolAllocation } from '../../src/pool/allocator.ts';
import { PoolRemoval } from '../../src/pool/removal.ts';
import { decodeBlock } from '../../src/pool/model.ts';
import { decodeJournalEntry, journalEntryMisfit, pickReserve, removalWindowSeconds, withinBudget } from '../../src/pool/offline.ts';
import type { PoolConfig } from '../../src/ipam/pool-config.ts';
import type { IPAMConfig } from '../../src/ipam/types.ts';
import { poolHooks } from '../../src/cni/pool.ts';
import { PoolSessions } from '../../src/daemon/pool-sessions.ts';
import { bootClock, coarseBootClock, ContactKV, type OfflineLog } from '../../src/pool/contact.ts';
import type { KV, KVCompare, KVEntry, KVOp, KVStats, KVTxnResult, Leases } from '../../src/store/kv.ts';
import { MemoryKV } from '../../src/store/memory/memory-kv.ts';
import { PoolJournal, poolJournalDir } from '../../src/pool/journal.ts';

const P = '/ipwarden/pools/p1';
/** A /27 cut into two /28 blocks: 10.80.0.0/28 (.2–.15: .1 is the gateway) and 10.80.0.16/28 (.16–.30); node-a's name hash picks .16/28. */
const SMALL = [[{ subnet: '10.80.0.0/27' }]];
const dirs: string[] = [];
after(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

function tempDir(): string {
  const d = mkdtempSync(join(tmpdir(), 'ipwarden-offline-unit-'));
  dirs.push(d);
  return d;
}

function config(offline: unknown = { reserve: 2, seconds: 30 }, ranges: unknown = SMALL): IPAMConfig {
  return loadIPAMConfig(JSON.stringify({ cniVersion: '1.0.0', name: 'net1', ipam: { type: 'ipwarden', ranges, pool: { name: 'p1', etcd: { endpoints: ['http://127.0.0.1:1'] }, blockSize: 28, ...(offline === ABSENT ? {} : { offline }) } } }), undefined);
}

/** `config(ABSENT)`: without `ipam.pool.offline`. */
const ABSENT = Symbol('absent');
/** A KV in front of a shared memory KV that can be cut off from it (a partition of one node). */
class PartitionKV implements KV, Leases {
  readonly description = 'partitionable memory';
  cut = false;
  /** The next transaction is applied, but its answer is lost (an unavailable error instead), and the link is cut from then on. */
  loseNextAnswer = false;
  readonly #m: MemoryKV;
  constructor(m: MemoryKV) {
    this.#m = m;
  }
  get stats(): KVStats {
    return this.#m.stats;
  }
  #check(): void {
    if (this.cut) throw new AppError('STORE_UNAVAILABLE', 'etcd unreachable (test partition)');
  }
  async get(key: string): Promise<KVEntry | null> {
    this.#check();
    return this.#m.get(key);
  }
  async list(prefix: string, opts?: { readonly keysOnly?: boolean }): Promise<KVEntry[]> {
    this.#check();
    return this.#m.list(prefix, opts);
  }
  async txn(c: readonly KVCompare[], o: readonly KVOp[]): Promise<KVTxnResult> {
    this.#check();
    const t = await this.#m.txn(c, o);
    if (this.loseNextAnswer) {
      this.loseNextAnswer = false;
      this.cut = true;
      throw new AppError('STORE_UNAVAILABLE', 'etcd unreachable (test partition)');
    }
    return t;
  }
  async grantLease(ttl: number): Promise<string> {
    this.#check();
    return this.#m.grantLease(ttl);
  }
  async keepAlive(id: string): Promise<number> {
    this.#check();
    return this.#m.keepAlive(id);
  }
  async revokeLease(id: string): Promise<void> {
    this.#check();
    return this.#m.revokeLease(id);
  }
  async close(): Promise<void> {}
}

interface Node {
  readonly sessions: PoolSessions;
  readonly link: PartitionKV;
  readonly logs: Array<{ level: string; msg: string; fields: Record<string, unknown> }>;
  /** The observer's offline events, `<node>:<kind>`. */
  readonly events: string[];
  /** The injected monotonic clock, milliseconds. */
  t: number;
}

/** The journal directory of pool p1 (prefix /ipwarden) under journal root `root`. */
const pdir = (root: string, node = 'node-a'): string => poolJournalDir(root, '/ipwarden', 'p1', node);

function node(kv: MemoryKV, journal: string, name = 'node-a'): Node {
  const link = new PartitionKV(kv);
  const logs: Node['logs'] = [];
  const log: OfflineLog = (level, fields, msg) => void logs.push({ level, msg, fields });
  const n: Node = {
    link,
    logs,
    t: 1_000,
    events: [],
    sessions: new PoolSessions({ NODE_NAME: name }, () => link, () => () => undefined, { offline: (e) => void n.events.push(`${e.node}:${e.kind}`) }, { clock: () => n.t, journalRoot: journal, log }),
  };
  return n;
}

function ips(r: readonly PoolAllocation[]): string[] {
  return r.map((a) => formatIP(a.ip));
}

function block(kv: MemoryKV, key: string): { seq: number; next: number; allocs: Record<string, Record<string, unknown>> } {
  return JSON.parse(kv.dump()[`${P}/blocks/${key}`] as string);
}

/** The block's allocations with `at` left out (the allocator's wall clock). */
function allocs(kv: MemoryKV, key: string): Record<string, Record<string, unknown>> {
  return Object.fromEntries(Object.entries(block(kv, key).allocs).map(([o, a]) => [o, { ...a, at: typeof a['at'] }]));
}

const operator = (kv: MemoryKV): PoolRemoval => new PoolRemoval({ kv, pool: 'p1', prefix: '/ipwarden' });
const req = (containerId: string) => ({ containerId, ifname: 'eth0' });

async function unavailable(p: Promise<unknown>): Promise<AppError> {
  try {
    await p;
  } catch (e) {
    assert.ok(isAppError(e, 'STORE_UNAVAILABLE'), String(e));
    return e;
  }
  assert.fail('expected STORE_UNAVAILABLE');
}

describe('ipam.pool.offline (config)', () => {
  it('decodes {reserve, seconds}; absent = no offline key at all', () => {
    assert.deepEqual(config().pool?.offline, { reserve: 2, seconds: 30 });
    assert.equal('offline' in (config(ABSENT).pool as object), false);
  });
  const bad: Array<[unknown, string]> = [
    [7, 'ipam.pool.offline must be an object, got number'],
    [[], 'ipam.pool.offline must be an object, got array'],
    [null, 'ipam.pool.offline must be an object, got null'],
    [{ reserve: 2, seconds: 30, Seconds: 9 }, 'ipam.pool.offline has an unknown key "Seconds" (known keys: reserve, seconds)'],
    [{ seconds: 30 }, 'ipam.pool.offline.reserve must be an integer from 1 to 64, got null'],
    [{ reserve: 0, seconds: 30 }, 'ipam.pool.offline.reserve must be an integer from 1 to 64, got 0'],
    [{ reserve: 65, seconds: 30 }, 'ipam.pool.offline.reserve must be an integer from 1 to 64, got 65'],
    [{ reserve: 1.5, seconds: 30 }, 'ipam.pool.offline.reserve must be an integer from 1 to 64, got 1.5'],
    [{ reserve: 2 }, 'ipam.pool.offline.seconds must be an integer from 1 to 3600, got null'],
    [{ reserve: 2, seconds: 3601 }, 'ipam.pool.offline.seconds must be an integer from 1 to 3600, got 3601'],
    [{ reserve: 2, seconds: '30' }, 'ipam.pool.offline.seconds must be an integer from 1 to 3600, got "30"'],
  ];
  bad.forEach(([v, msg]) =>
    it(`refuses ${JSON.stringify(v)} with code 7`, () => {
      assert.throws(() => config(v), (e: unknown) => isAppError(e, 'IPAM_INVALID_CONFIG') && e.message === msg);
    }),
  );
});

describe('pool-offline (pure rules)', () => {
  it('the veto window is max(60, 2·S + 10)', () => {
    assert.deepEqual([null, 1, 25, 30, 3600].map((s) => removalWindowSeconds(s, 60)), [60, 60, 60, 70, 7210]);
  });
  it('the budget: a confirmed contact less than S seconds ago on the same clock', () => {
    assert.equal(withinBudget(null, 5, 30), false);
    assert.equal(withinBudget(1000, 30_999, 30), true);
    assert.equal(withinBudget(1000, 31_000, 30), false);
    assert.equal(withinBudget(1000, 999, 30), false, 'a clock that went back is no contact');
  });
  it('pickReserve takes one per range set, lowest first, none used', () => {
    const v = [
      { block: 'b', ordinal: 3, seq: 1, rangeSet: 0, ip: 'x3' },
      { block: 'b', ordinal: 1, seq: 2, rangeSet: 0, ip: 'x1' },
      { block: 'c', ordinal: 0, seq: 1, rangeSet: 1, ip: 'y0' },
    ];
    assert.deepEqual(pickReserve(v, new Set(), 2)?.map((x) => x.ip), ['x1', 'y0']);
    assert.deepEqual(pickReserve(v, new Set(['b#1#2']), 2)?.map((x) => x.ip), ['x3', 'y0']);
    assert.equal(pickReserve(v, new Set(['c#0#1']), 2), null);
  });
  it('a journal entry that cannot be read is STORE_CORRUPT naming the file', () => {
    assert.throws(() => decodeJournalEntry('{"v":2}', '/j/x.json'), (e: unknown) => isAppError(e, 'STORE_CORRUPT') && e.message === 'pool journal /j/x.json: unknown version 2 (this ipwarden writes 1)');
    assert.throws(() => decodeJournalEntry('nope', '/j/x.json'), (e: unknown) => isAppError(e, 'STORE_CORRUPT') && e.message === 'pool journal /j/x.json: not valid JSON');
  });
});

describe('reserve entries in a block value (decodeBlock)', () => {
  const entry = (allocs: unknown) => ({ key: `${P}/blocks/10.80.0.16-28`, value: JSON.stringify({ v: 1, cidr: '10.80.0.16/28', rangeSet: 0, node: 'node-a', state: 'owned', seq: 3, next: 2, allocs }), modRevision: '5', createRevision: '2' });
  it('decodes a reserve entry exactly', () => {
    assert.deepEqual(decodeBlock(entry({ '1': { id: '', ifname: '', node: 'node-a', seq: 2, at: 7, reserve: true } }), '10.80.0.16/28').allocs, { '1': { id: '', ifname: '', node: 'node-a', seq: 2, at: 7, reserve: true } });
  });
  const bad: Array<[unknown, string]> = [
    [{ id: 'c1', ifname: '', node: 'node-a', seq: 2, at: 7, reserve: true }, 'allocation 1: a reserve entry must have "reserve":true and an empty "id" and "ifname"'],
    [{ id: '', ifname: '', node: 'node-a', seq: 2, at: 7, reserve: false }, 'allocation 1: a reserve entry must have "reserve":true and an empty "id" and "ifname"'],
    [{ id: '', ifname: '', node: 'node-b', seq: 2, at: 7, reserve: true }, 'allocation 1: a reserve entry\'s "node" must be the block\'s node'],
    [{ id: '', ifname: '', node: 'node-a', seq: 4, at: 7, reserve: true }, 'allocation 1: "seq" must be an integer from 1 to the block\'s seq 3'],
    [{ id: '', ifname: 'eth0', node: 'node-a', seq: 2, at: 7 }, 'allocation 1: "id" must be a container ID'],
  ];
  bad.forEach(([a, msg]) =>
    it(`refuses ${JSON.stringify(a)} as STORE_CORRUPT`, () => {
      assert.throws(() => decodeBlock(entry({ '1': a }), '10.80.0.16/28'), (e: unknown) => isAppError(e, 'STORE_CORRUPT') && e.message === `etcd key ${P}/blocks/10.80.0.16-28: ${msg}`);
    }),
  );
});

describe('ContactKV (the confirmed contact)', () => {
  it('records the send time of a request that read or compared removing/<me> absent, not its answer time', async () => {
    const m = new MemoryKV();
    let t = 5;
    let release: () => void = () => undefined;
    let gate = true;
    class Slow extends PartitionKV {
      override async get(k: string): Promise<KVEntry | null> {
        if (gate) await new Promise<void>((r) => (release = r));
        gate = false;
        return super.get(k);
      }
    }
    const c = new ContactKV(new Slow(m), () => t);
    c.watch(`${P}/removing/node-a`);
    const p = c.get(`${P}/removing/node-a`);
    t = 9;
    release();
    assert.equal(await p, null);
    assert.equal(c.lastContact(`${P}/removing/node-a`), 5);
    t = 12;
    await c.txn([{ key: `${P}/removing/node-a`, absent: true }], [{ put: '/x', value: '1' }]);
    assert.equal(c.lastContact(`${P}/removing/node-a`), 12);
    m.plant(`${P}/removing/node-a`, '{}');
    t = 20;
    await c.get(`${P}/removing/node-a`);
    await c.txn([{ key: `${P}/removing/node-a`, absent: true }], []);
    assert.equal(c.lastContact(`${P}/removing/node-a`), 12, 'a marker read or a failed compare is no contact');
  });

  it('with a send clock (the daemon\'s coarse one): contacts are stamped by it, the budget\'s "now" reads the clock', async () => {
    const m = new PartitionKV(new MemoryKV());
    let t = 10;
    let sent = 4;
    const c = new ContactKV(m, () => t, () => sent);
    c.watch(`${P}/removing/node-a`);
    await c.txn([{ key: `${P}/removing/node-a`, absent: true }], [{ put: '/x', value: '1' }]);
    assert.equal(c.lastContact(`${P}/removing/node-a`), 4, 'stamped with the send clock\'s (earlier) reading');
    sent = 10;
    t = 15;
    assert.equal(await c.get(`${P}/removing/node-a`), null);
    assert.equal(c.lastContact(`${P}/removing/node-a`), 10);
    t = 14;
    assert.equal(c.lastContact(`${P}/removing/node-a`), null, 'the clock went back: every contact dropped');
  });
});

describe('PoolSessions offline allocation (memory KV, injected clock)', () => {
  it('keeps K reserve entries per range set in its own block, and its settings key, after ADDs', async () => {
    const kv = new MemoryKV();
    const a = node(kv, tempDir());
    const conf = config();
    try {
      a.sessions.announce(conf);
      await a.sessions.maintainOffline();
      assert.deepEqual(allocs(kv, '10.80.0.16-28'), {
        '0': { id: '', ifname: '', node: 'node-a', seq: 1, at: 'number', reserve: true },
        '1': { id: '', ifname: '', node: 'node-a', seq: 2, at: 'number', reserve: true },
      });
      assert.equal(kv.dump()[`${P}/nodes/node-a/settings`], '{"v":1,"offlineSeconds":30}');
      assert.deepEqual(Object.keys(kv.dump()).filter((k) => k.includes('/nodes/')), [`${P}/nodes/node-a/blocks/10.80.0.16-28`, `${P}/nodes/node-a/settings`]);
      const got = await Promise.all(['c1', 'c2', 'c3'].map((c) => a.sessions.add(conf, req(c))));
      assert.deepEqual(got.map(ips), [['10.80.0.18'], ['10.80.0.19'], ['10.80.0.20']], 'ADDs never take a reserve entry');
      await a.sessions.maintainOffline();
      const reserves = Object.values(block(kv, '10.80.0.16-28').allocs).filter((x) => x['reserve'] === true);
      assert.equal(reserves.length, 2);
      assert.deepEqual(a.sessions.offlineStats(), [{ pool: 'p1', node: 'node-a', offlineAdds: 0, offlineDels: 0, synced: 0, syncFailures: 0, reserveTarget: 2, reserveLeft: [2], journaled: 0, stuck: 0, contactAgeSeconds: 0 }]);
      // All DELs: no handle left, only the reserve entries (the block is kept).
      for (const c of ['c1', 'c2', 'c3']) await a.sessions.del(conf, req(c));
      assert.deepEqual(Object.keys(kv.dump()).filter((k) => k.includes('/handles/')), []);
      assert.deepEqual(Object.keys(block(kv, '10.80.0.16-28').allocs), ['0', '1']);
    } finally {
      await a.sessions.close();
    }
  });

  it('the reserve is taken by nobody: another node claims the free block, then borrows, then the pool is full with the reserve untouched', async () => {
    const kv = new MemoryKV();
    const a = node(kv, tempDir());
    const conf = config();
    try {
      a.sessions.announce(conf);
      await a.sessions.maintainOffline();
      const b = new PoolAllocator({ kv, pool: 'p1', prefix: '/ipwarden', node: 'node-b', network: 'net1', rangeSets: conf.rangeSets, sizes: { blockSize4: 28, blockSize6: 122 }, now: () => 1 });
      const seen: string[] = [];
      for (let i = 0; ; i++) {
        const [r] = await b.add([req(`b${i}`)]);
        if (r instanceof AppError) {
          assert.equal(r.message, 'failed to allocate for range 0: no IP addresses available in range set: 10.80.0.1-10.80.0.30');
          break;
        }
        seen.push(...ips(r as PoolAllocation[]));
      }
      assert.equal(seen.length, 14 + 15 - 2, 'every address but the gateway and the two reserve entries');
      assert.ok(!seen.includes('10.80.0.16') && !seen.includes('10.80.0.17'), 'no reserve address handed out');
      assert.deepEqual(Object.values(block(kv, '10.80.0.16-28').allocs).filter((x) => x['reserve'] === true).length, 2);
    } finally {
      await a.sessions.close();
    }
  });

  it('cut off: an ADD takes a reserve address and writes its journal entry; a repeat gets the same answer; a DEL returns it; past S seconds: code 11', async () => {
    const kv = new MemoryKV();
    const root = tempDir();
    const dir = pdir(root);
    const a = node(kv, root);
    const conf = config();
    try {
      a.sessions.announce(conf);
      await a.sessions.maintainOffline(); // t = 1000: the refill's transaction is the confirmed contact
      a.link.cut = true;
      a.t += 29_000;
      const r1 = await a.sessions.add(conf, req('off1'));
      assert.deepEqual(ips(r1), ['10.80.0.16']);
      assert.equal(r1[0]?.existing, false);
      const files = readdirSync(dir);
      assert.equal(files.length, 1);
      assert.equal(lstatSync(join(dir, files[0] as string)).mode & 0o777, 0o600);
      assert.equal(lstatSync(dir).mode & 0o777, 0o700);
      const entry = JSON.parse(readFileSync(join(dir, files[0] as string), 'utf8'));
      assert.deepEqual({ ...entry, at: typeof entry.at }, {
        v: 1, kind: 'add', pool: { name: 'p1', etcd: { endpoints: ['http://127.0.0.1:1'], prefix: '/ipwarden' }, blockSize: 28, blockSize6: 122, offline: { reserve: 2, seconds: 30 } },
        network: 'net1', node: 'node-a', containerId: 'off1', ifname: 'eth0', at: 'number',
        ips: [{ ip: '10.80.0.16', block: '10.80.0.16-28', ordinal: 0, seq: 1, rangeSet: 0 }],
      });
      assert.deepEqual(ips((await a.sessions.find(conf, req('off1'))) ?? []), ['10.80.0.16'], 'CHECK is answered from the journal');
      const again = await a.sessions.add(conf, req('off1'));
      assert.deepEqual(ips(again), ['10.80.0.16']);
      assert.equal(again[0]?.existing, true);
      const r2 = await a.sessions.add(conf, req('off2'));
      assert.deepEqual(ips(r2), ['10.80.0.17']);
      const full = await unavailable(a.sessions.add(conf, req('off3')));
      assert.equal(full.message, 'etcd unreachable (test partition); the offline reserve of pool p1 (2 per range set) is used up');
      // A DEL of an offline attachment while cut off: the address returns to the local reserve.
      assert.deepEqual(await a.sessions.del(conf, req('off1')), ['10.80.0.16']);
      assert.equal(JSON.parse(readFileSync(join(dir, files[0] as string), 'utf8')).kind, 'del');
      assert.deepEqual(ips(await a.sessions.add(conf, req('off3'))), ['10.80.0.16']);
      // A DEL of anything else while cut off: code 11 as without offline allocation.
      await unavailable(a.sessions.del(conf, req('never')));
      // Past the budget: code 11, naming the budget and the contact's age.
      a.t = 1_000 + 30_000;
      const late = await unavailable(a.sessions.add(conf, req('off4')));
      assert.equal(late.message, 'etcd unreachable (test partition); offline allocation of pool p1 refused: the offline budget of 30 s is exhausted (last confirmed contact with etcd 30.0 s ago)');
      assert.equal(late.cniCode, 11);
      assert.equal(kv.dump()[`${P}/handles/off2/eth0`], undefined, 'nothing reached etcd');
      const st = a.sessions.offlineStats()[0];
      assert.deepEqual([st?.offlineAdds, st?.offlineDels, st?.journaled, st?.reserveLeft], [3, 1, 3, [0]]);
      assert.deepEqual(a.events, ['node-a:add', 'node-a:add', 'node-a:del', 'node-a:add'], 'the observer is told');
    } finally {
      await a.sessions.close();
    }
  });

  it('reconnect: each journal entry becomes the container\'s allocation and handle (exact values), a released one a DEL; the reserve is refilled; all DELs leave no handle', async () => {
    const kv = new MemoryKV();
    const root = tempDir();
    const dir = pdir(root);
    const a = node(kv, root);
    const conf = config();
    try {
      a.sessions.announce(conf);
      await a.sessions.maintainOffline();
      a.link.cut = true;
      await a.sessions.add(conf, req('off1'));
      await a.sessions.add(conf, req('off2'));
      await a.sessions.del(conf, req('off2'));
      a.link.cut = false;
      await a.sessions.maintainOffline();
      assert.deepEqual(readdirSync(dir), [], 'journal synced and removed');
      const h = JSON.parse(kv.dump()[`${P}/handles/off1/eth0`] as string);
      assert.deepEqual({ ...h, at: typeof h.at }, { v: 1, node: 'node-a', network: 'net1', at: 'number', ips: [{ ip: '10.80.0.16', block: '10.80.0.16-28', ordinal: 0, seq: 3, rangeSet: 0 }], host: hostname() });
      assert.deepEqual(JSON.parse(kv.dump()[`${P}/handles/off2/eth0`] as string).deleted, true, 'the offline DEL, synced: a tombstone');
      assert.deepEqual(allocs(kv, '10.80.0.16-28'), {
        '0': { id: 'off1', ifname: 'eth0', node: 'node-a', seq: 3, at: 'number' },
        '1': { id: '', ifname: '', node: 'node-a', seq: 2, at: 'number', reserve: true },
        '2': { id: '', ifname: '', node: 'node-a', seq: 4, at: 'number', reserve: true },
      });
      assert.deepEqual(ips((await a.sessions.find(conf, req('off1'))) ?? []), ['10.80.0.16']);
      assert.deepEqual(await a.sessions.del(conf, req('off1')), ['10.80.0.16']);
      assert.deepEqual(Object.entries(kv.dump()).filter(([k, v]) => k.includes('/handles/') && JSON.parse(v).deleted !== true), []);
      const st = a.sessions.offlineStats()[0];
      assert.deepEqual([st?.synced, st?.syncFailures, st?.journaled], [2, 0, 0]);
    } finally {
      await a.sessions.close();
    }
  });

  it('a DEL that arrives online before the sync is decided on the journal: a tombstone, the journal entry gone, nothing held', async () => {
    const kv = new MemoryKV();
    const root = tempDir();
    const dir = pdir(root);
    const a = node(kv, root);
    const conf = config();
    try {
      a.sessions.announce(conf);
      await a.sessions.maintainOffline();
      a.link.cut = true;
      await a.sessions.add(conf, req('off1'));
      a.link.cut = false;
      assert.deepEqual(await a.sessions.del(conf, req('off1')), ['10.80.0.16']);
      await a.sessions.maintainOffline();
      assert.deepEqual(readdirSync(dir), []);
      assert.equal(JSON.parse(kv.dump()[`${P}/handles/off1/eth0`] as string).deleted, true);
      assert.ok(Object.values(block(kv, '10.80.0.16-28').allocs).every((x) => x['reserve'] === true), 'only reserve entries left');
    } finally {
      await a.sessions.close();
    }
  });

  it('an ADD whose transaction etcd applied but whose answer was lost goes offline: the sync replaces its handle with the journal\'s answer and frees the other address', async () => {
    const kv = new MemoryKV();
    const root = tempDir();
    const dir = pdir(root);
    const a = node(kv, root);
    const conf = config();
    try {
      a.sessions.announce(conf);
      await a.sessions.maintainOffline();
      a.link.loseNextAnswer = true;
      const r = await a.sessions.add(conf, req('lost'));
      assert.deepEqual(ips(r), ['10.80.0.16'], 'answered from the reserve');
      assert.equal(JSON.parse(kv.dump()[`${P}/handles/lost/eth0`] as string).ips[0].ip, '10.80.0.18', 'etcd applied the ADD meanwhile');
      a.link.cut = false;
      assert.deepEqual(ips(await a.sessions.add(conf, req('lost'))), ['10.80.0.16'], 'a repeated ADD keeps the journal\'s answer');
      await a.sessions.maintainOffline();
      assert.deepEqual(readdirSync(dir), []);
      assert.deepEqual(JSON.parse(kv.dump()[`${P}/handles/lost/eth0`] as string).ips.map((x: { ip: string }) => x.ip), ['10.80.0.16']);
      const held = Object.entries(block(kv, '10.80.0.16-28').allocs).filter(([, x]) => x['reserve'] !== true);
      assert.deepEqual(held.map(([o, x]) => [o, x['id']]), [['0', 'lost']], 'the lost-answer address .18 is free again');
    } finally {
      await a.sessions.close();
    }
  });

  it('a sync whose answer was lost, then an offline DEL: the address is held back (it may be the container\'s in etcd now), not handed out again', async () => {
    const kv = new MemoryKV();
    const root = tempDir();
    const dir = pdir(root);
    const a = node(kv, root);
    const conf = config();
    try {
      a.sessions.announce(conf);
      await a.sessions.maintainOffline();
      a.link.cut = true;
      assert.deepEqual(ips(await a.sessions.add(conf, req('off1'))), ['10.80.0.16']);
      a.link.cut = false;
      a.link.loseNextAnswer = true; // the sync's transaction is applied, its answer lost, the link cut again
      await a.sessions.maintainOffline();
      assert.equal(JSON.parse(kv.dump()[`${P}/handles/off1/eth0`] as string).ips[0].ip, '10.80.0.16', 'etcd did convert it');
      assert.deepEqual(await a.sessions.del(conf, req('off1')), ['10.80.0.16']);
      const held = JSON.parse(readFileSync(join(dir, readdirSync(dir)[0] as string), 'utf8'));
      assert.deepEqual([held.kind, held.ips.map((x: { ip: string }) => x.ip)], ['del', ['10.80.0.16']], 'the del entry holds the address back');
      assert.deepEqual(ips(await a.sessions.add(conf, req('off2'))), ['10.80.0.17'], 'not .16');
      await unavailable(a.sessions.add(conf, req('off3')));
      a.link.cut = false;
      await a.sessions.maintainOffline();
      assert.deepEqual(readdirSync(dir), []);
      const live = Object.entries(kv.dump()).filter(([k, v]) => k.includes('/handles/') && JSON.parse(v).deleted !== true);
      assert.deepEqual(live.map(([k, v]) => [k.slice(`${P}/handles/`.length), JSON.parse(v).ips.map((x: { ip: string }) => x.ip)]), [['off2/eth0', ['10.80.0.17']]]);
      const b = block(kv, '10.80.0.16-28');
      assert.equal(b.allocs['0'], undefined, '.16 was freed by the DEL\'s sync');
      assert.equal(Object.values(b.allocs).filter((x) => x['reserve'] === true).length, 2, 'and the reserve refilled');
    } finally {
      await a.sessions.close();
    }
  });

  it('a daemon "crash": new sessions read the journal, answer a repeated ADD from it, and sync it at start', async () => {
    const kv = new MemoryKV();
    const root = tempDir();
    const dir = pdir(root);
    const conf = config();
    const a = node(kv, root);
    a.sessions.announce(conf);
    await a.sessions.maintainOffline();
    a.link.cut = true;
    await a.sessions.add(conf, req('off1'));
    // Crash: the sessions are dropped without close(); a new daemon starts, still cut off.
    const b = node(kv, root);
    b.link.cut = true;
    try {
      b.sessions.announce(conf);
      assert.deepEqual(ips(await b.sessions.add(conf, req('off1'))), ['10.80.0.16'], 'the journal answers');
      // No confirmed contact since its start: no offline ADD, and the error says so.
      await code11(b.sessions.add(conf, req('off2')), 'etcd unreachable (test partition); offline allocation of pool p1 refused: no confirmed contact with etcd to count the offline budget of 30 s from (none since the daemon started, or the clock went back)');
      b.link.cut = false;
      await b.sessions.maintainOffline();
      assert.deepEqual(readdirSync(dir), []);
      assert.equal(JSON.parse(kv.dump()[`${P}/handles/off1/eth0`] as string).ips[0].ip, '10.80.0.16');
    } finally {
      await b.sessions.close();
    }
  });

  it('the reserve entry is gone (remove-node --finish ran): the sync failure is logged and counted, the journal entry kept', async () => {
    const kv = new MemoryKV();
    const root = tempDir();
    const dir = pdir(root);
    const a = node(kv, root);
    const conf = config();
    try {
      a.sessions.announce(conf);
      await a.sessions.maintainOffline();
      a.link.cut = true;
      await a.sessions.add(conf, req('off1'));
      // The operator treats the node as gone: its heartbeat has lapsed, step 1, then --finish.
      kv.apply([], [{ delete: `${P}/alive/node-a` }]);
      const op = operator(kv);
      await op.mark('node-a');
      const fin = await op.finish('node-a');
      assert.deepEqual(fin, { released: [], deletedBlocks: ['10.80.0.16-28'], keptBlocks: [] }, '--finish frees the reserve with the block');
      a.link.cut = false;
      await a.sessions.maintainOffline();
      assert.equal(readdirSync(dir).length, 1, 'the journal entry is kept');
      const st = a.sessions.offlineStats()[0];
      assert.deepEqual([st?.syncFailures, st?.stuck, st?.synced], [1, 1, 0]);
      assert.deepEqual(a.events, ['node-a:add', 'node-a:syncFailure']);
      const err = a.logs.find((l) => l.level === 'error');
      assert.equal(err?.msg, 'offline allocation cannot be synced: its reserve entry is gone (remove-node --finish ran while the node was cut off?); the journal entry is kept until an operator acts');
      assert.equal(err?.fields['why'], 'reserve entry 10.80.0.16 (block 10.80.0.16-28, sequence 1) is no longer this node\'s: the block is gone');
      assert.equal(kv.dump()[`${P}/handles/off1/eth0`], undefined);
      await a.sessions.maintainOffline();
      assert.equal(a.sessions.offlineStats()[0]?.syncFailures, 1, 'counted once');
    } finally {
      await a.sessions.close();
    }
  });

  it('remove-node step 1 sizes its window from the node\'s settings: max(60, 2·30 + 10) = 70 s; --finish names it', async () => {
    const kv = new MemoryKV();
    const a = node(kv, tempDir());
    try {
      a.sessions.announce(config());
      await a.sessions.maintainOffline();
    } finally {
      await a.sessions.close();
    }
    const op = operator(kv);
    const ttls: number[] = [];
    const leases: string[] = [];
    const windowLease = async (ttl: number): Promise<string> => {
      ttls.push(ttl);
      const id = await kv.grantLease(ttl);
      leases.push(id);
      return id;
    };
    await op.mark('node-a', { windowLease });
    await op.mark('node-x', { windowLease });
    assert.deepEqual(ttls, [70, 70, 60, 60], 'one lease before the marker, one granted after it');
    // The window key holds the lease granted after the marker: the first one expiring leaves it.
    kv.expireLease(leases[0] as string);
    assert.notEqual(kv.dump()[`${P}/removal-window/node-a`], undefined);
    kv.expireLease(leases[1] as string);
    assert.equal(kv.dump()[`${P}/removal-window/node-a`], undefined);
    // F1: a re-run finds the marker and puts the window again with a fresh lease (of the real size).
    await op.mark('node-a', { windowLease });
    assert.deepEqual(ttls, [70, 70, 60, 60, 70]);
    assert.notEqual(kv.dump()[`${P}/removal-window/node-a`], undefined, 'the window is back');
    kv.expireLease(leases[4] as string);
    kv.plant(`${P}/removal-window/node-a`, '{"v":1,"node":"node-a","at":0}');
    await assert.rejects(op.finish('node-a'), (e: unknown) => e instanceof Error && e.message === `the veto window of node node-a's removal from pool p1 has not passed (${P}/removal-window/node-a exists until its 70 s lease expires): try --finish again later`);
  });

  it('step 1 that stalls past its first lease undoes its marker instead of leaving a removal without a window', async () => {
    const kv = new MemoryKV();
    const op = operator(kv);
    let n = 0;
    const windowLease = async (ttl: number): Promise<string> => {
      const id = await kv.grantLease(ttl);
      if (++n === 1) kv.beforeTxn = () => void ((kv.beforeTxn = null), queueMicrotask(() => kv.expireLease(id)));
      else await new Promise((r) => setImmediate(r)); // the first lease has expired by now
      return id;
    };
    await assert.rejects(op.mark('node-s', { windowLease }), (e: unknown) => e instanceof Error && e.message === `the veto window of node node-s's removal from pool p1 expired before step 1 could confirm it (it stalled for more than 60 s): the removal was undone; run remove-node again`);
    assert.equal(kv.dump()[`${P}/removing/node-s`], undefined);
  });

  it('without ipam.pool.offline a cut-off ADD fails with code 11 and nothing is journaled', async () => {
    const kv = new MemoryKV();
    const root = tempDir();
    const dir = pdir(root);
    const a = node(kv, root);
    const conf = config(ABSENT);
    try {
      await a.sessions.add(conf, req('c1'));
      // The heartbeat started with the first ADD (in the background): wait for its key (bounded).
      for (let i = 0; i < 1000 && kv.dump()[`${P}/alive/node-a`] === undefined; i++) await new Promise((r) => setImmediate(r));
      a.link.cut = true;
      await unavailable(a.sessions.add(conf, req('c2')));
      assert.equal(existsSync(dir), false, 'no journal directory made');
      assert.deepEqual(a.sessions.offlineStats(), []);
      // The daemon's heartbeat writes the settings key with 0 offline seconds (the record that a
      // daemon served the node; branch polish, trial finding 1), before its heartbeat key.
      assert.equal(kv.dump()[`${P}/nodes/node-a/settings`], '{"v":1,"offlineSeconds":0}');
    } finally {
      await a.sessions.close();
    }
  });
});

describe('PoolJournal (files)', () => {
  it('refuses a journal directory that is a symlink, and writes nothing through it', () => {
    const d = tempDir();
    mkdirSync(join(d, 'real'));
    symlinkSync(join(d, 'real'), join(d, 'link'));
    const j = new PoolJournal(join(d, 'link'));
    assert.throws(() => j.write('a'.repeat(64) + '.json', 'x'), (e: unknown) => isAppError(e, 'STORE_IO') && e.message === `pool journal: ${join(d, 'link')} is not a directory (a symlink or a file): ipwarden follows no symlink it did not make`);
    assert.deepEqual(readdirSync(join(d, 'real')), []);
  });
  it('an entry that is a symlink is refused on read; list names its error and still gives the others', () => {
    const d = tempDir();
    const j = new PoolJournal(join(d, 'j'));
    j.ensure();
    symlinkSync('/etc/hostname', join(d, 'j', 'b'.repeat(64) + '.json'));
    j.write('c'.repeat(64) + '.json', 'text');
    assert.throws(() => j.read('b'.repeat(64) + '.json'), (e: unknown) => isAppError(e, 'STORE_IO') && e.message.includes('ELOOP'));
    const l = j.list();
    assert.equal(l.length, 2);
    assert.ok('error' in (l[0] as object) && isAppError((l[0] as { error: unknown }).error, 'STORE_IO'));
    assert.deepEqual(l[1], { name: 'c'.repeat(64) + '.json', text: 'text' });
  });
  it('writes atomically (no temporary left) and removes', () => {
    const d = tempDir();
    const j = new PoolJournal(join(d, 'j'));
    j.write('c'.repeat(64) + '.json', '{"x":1}\n');
    assert.deepEqual(readdirSync(join(d, 'j')), ['c'.repeat(64) + '.json']);
    assert.deepEqual(j.list(), [{ name: 'c'.repeat(64) + '.json', text: '{"x":1}\n' }]);
    j.remove('c'.repeat(64) + '.json');
    j.remove('c'.repeat(64) + '.json');
    assert.deepEqual(j.list(), []);
  });
});

/** A config of pool p1 for network `name` with its own `ipam.dataDir` (review F2). */
function netConf(name: string, dataDir: string, offline: unknown = { reserve: 2, seconds: 300 }): IPAMConfig {
  return loadIPAMConfig(JSON.stringify({ cniVersion: '1.0.0', name, ipam: { type: 'ipwarden', ranges: SMALL, dataDir, pool: { name: 'p1', etcd: { endpoints: ['http://127.0.0.1:1'] }, blockSize: 28, offline } } }), undefined);
}

/** A DEL's network identity for `conf`. */
const ident = (conf: IPAMConfig) => ({ name: conf.name, pool: conf.pool }) as never;

async function code11(p: Promise<unknown>, message: string): Promise<void> {
  const e = await unavailable(p);
  assert.equal(e.message, message);
}

describe('offline allocation: review A fixes (memory KV, injected clock)', () => {
  it('F2: one journal directory per pool under the root, whatever the network\'s dataDir; a restart that announces the other network first loads it (no duplicate)', async () => {
    const kv = new MemoryKV();
    const root = tempDir();
    const base = tempDir();
    const netA = netConf('netA', join(base, 'a'));
    const netB = netConf('netB', join(base, 'b'));
    const a = node(kv, root);
    a.sessions.announce(netA);
    a.sessions.announce(netB);
    await a.sessions.maintainOffline();
    a.link.cut = true;
    a.t += 5_000;
    const first = ips(await a.sessions.add(netB, req('c1')));
    assert.deepEqual(first, ['10.80.0.16']);
    assert.equal(readdirSync(pdir(root)).length, 1, 'journaled in the pool\'s directory');
    assert.equal(existsSync(join(base, 'a')) || existsSync(join(base, 'b')), false, 'nothing under either dataDir');
    // kill -9: a new daemon announces netB first this time.
    const b = node(kv, root);
    try {
      assert.deepEqual(b.sessions.loadJournals().map((x) => [x.pool, x.node, x.entries]), [['p1', 'node-a', 1]]);
      b.sessions.announce(netB);
      b.sessions.announce(netA);
      await b.sessions.maintainOffline();
      assert.deepEqual(JSON.parse(kv.dump()[`${P}/handles/c1/eth0`] as string).ips.map((x: { ip: string }) => x.ip), first, 'c1 synced');
      b.link.cut = true;
      b.t += 5_000;
      const second = ips(await b.sessions.add(netB, req('c2')));
      assert.equal(second.some((x) => first.includes(x)), false, `no duplicate: c2 got ${second.join()}`);
    } finally {
      await a.sessions.close();
      await b.sessions.close();
    }
  });

  it('F6: the daemon loads every journal at start; a DEL before any ADD or announce is decided on its entry (no tombstone, no handle brought back)', async () => {
    const kv = new MemoryKV();
    const root = tempDir();
    const conf = config();
    const a = node(kv, root);
    a.sessions.announce(conf);
    await a.sessions.maintainOffline();
    a.link.cut = true;
    a.t += 1_000;
    assert.deepEqual(ips(await a.sessions.add(conf, req('c1'))), ['10.80.0.16']);
    const b = node(kv, root);
    try {
      b.sessions.loadJournals();
      assert.equal(b.sessions.offlineStats()[0]?.journaled, 1, 'loaded before any request');
      assert.deepEqual(await b.sessions.del(ident(conf), req('c1')), ['10.80.0.16']);
      assert.deepEqual(readdirSync(pdir(root)), []);
      b.sessions.announce(conf);
      await b.sessions.add(conf, req('c2'));
      await b.sessions.maintainOffline();
      const h = kv.dump()[`${P}/handles/c1/eth0`];
      assert.ok(h === undefined || JSON.parse(h).deleted === true, `no live handle of c1: ${h}`);
      assert.equal(Object.values(block(kv, '10.80.0.16-28').allocs).some((x) => x['id'] === 'c1'), false, 'no allocation of c1');
    } finally {
      await a.sessions.close();
      await b.sessions.close();
    }
  });

  it('F6: a DEL that comes first after a restart (no loadJournals) reads the pool\'s journal itself', async () => {
    const kv = new MemoryKV();
    const root = tempDir();
    const conf = config();
    const a = node(kv, root);
    a.sessions.announce(conf);
    await a.sessions.maintainOffline();
    a.link.cut = true;
    a.t += 1_000;
    await a.sessions.add(conf, req('c1'));
    const b = node(kv, root);
    try {
      assert.deepEqual(await b.sessions.del(ident(conf), req('c1')), ['10.80.0.16']);
      assert.deepEqual(readdirSync(pdir(root)), []);
    } finally {
      await a.sessions.close();
      await b.sessions.close();
    }
  });

  it('F6: the standalone DEL (daemon down) of a journaled attachment fails with code 11; others go to etcd', async () => {
    const kv = new MemoryKV();
    const root = tempDir();
    const conf = config();
    const a = node(kv, root);
    try {
      a.sessions.announce(conf);
      await a.sessions.maintainOffline();
      a.link.cut = true;
      a.t += 1_000;
      await a.sessions.add(conf, req('c1'));
      const hooks = poolHooks({ NODE_NAME: 'node-a' }, { acquire: async () => kv, release: async () => undefined }, root);
      await code11(hooks.del(ident(conf), req('c1')), 'an offline allocation of c1/eth0 in pool p1 awaits its sync by the daemon; retry');
      assert.deepEqual(await hooks.del(ident(conf), req('other')), []);
      // Set aside (corrupt) counts as held too; a journal root that is a symlink is refused.
      const name = readdirSync(pdir(root))[0] as string;
      renameSync(join(pdir(root), name), join(pdir(root), `${name}.corrupt`));
      await code11(hooks.del(ident(conf), req('c1')), 'an offline allocation of c1/eth0 in pool p1 awaits its sync by the daemon; retry');
      const link = join(tempDir(), 'link');
      symlinkSync(root, link);
      const viaLink = poolHooks({ NODE_NAME: 'node-a' }, { acquire: async () => kv, release: async () => undefined }, link);
      await assert.rejects(viaLink.del(ident(conf), req('c1')), (e: unknown) => isAppError(e, 'STORE_IO') && e.message.includes('follows no symlink'));
    } finally {
      await a.sessions.close();
    }
  });

  it('F8: an offline re-ADD of an attachment whose held-back DEL is not synced fails with code 11; its address is never handed out again', async () => {
    const kv = new MemoryKV();
    const a = node(kv, tempDir());
    const conf = config({ reserve: 3, seconds: 300 });
    try {
      a.sessions.announce(conf);
      await a.sessions.maintainOffline();
      a.link.cut = true;
      a.t += 1_000;
      const x = ips(await a.sessions.add(conf, req('c1')));
      a.link.cut = false;
      a.link.loseNextAnswer = true; // the sync is applied, its answer lost
      await a.sessions.maintainOffline();
      assert.deepEqual(JSON.parse(kv.dump()[`${P}/handles/c1/eth0`] as string).ips.map((i: { ip: string }) => i.ip), x);
      assert.deepEqual(await a.sessions.del(ident(conf), req('c1')), x, 'held back');
      a.t += 1_000;
      await code11(a.sessions.add(conf, req('c1')), 'an offline DEL of c1/eth0 in pool p1 awaits its sync to etcd; retry');
      const d = ips(await a.sessions.add(conf, req('d1')));
      assert.notDeepEqual(d, x, 'd1 does not get the held-back address');
      a.link.cut = false;
      await a.sessions.maintainOffline();
      assert.equal(a.sessions.offlineStats()[0]?.stuck, 0);
      assert.equal(a.sessions.offlineStats()[0]?.journaled, 0);
      assert.deepEqual(ips(await a.sessions.add(conf, req('c1'))).length, 1, 'after the sync the re-ADD is served');
    } finally {
      await a.sessions.close();
    }
  });

  it('F3: an offline repeated ADD of an attachment allocated online fails with code 11 (no second address, the first never freed)', async () => {
    const kv = new MemoryKV();
    const root = tempDir();
    const a = node(kv, root);
    const conf = config({ reserve: 2, seconds: 300 });
    try {
      a.sessions.announce(conf);
      await a.sessions.maintainOffline();
      const first = ips(await a.sessions.add(conf, req('c1')));
      assert.deepEqual(first, ['10.80.0.18']);
      a.link.cut = true;
      a.t += 1_000;
      await code11(a.sessions.add(conf, req('c1')), 'etcd unreachable (test partition); c1/eth0 may hold an online allocation in pool p1 that cannot be read while etcd is unreachable (no second one is given offline); retry');
      assert.equal(existsSync(pdir(root)) ? readdirSync(pdir(root)).length : 0, 0, 'nothing journaled');
      // A daemon that only knows it from its block cache (a restart that read its blocks) refuses too.
      const b = node(kv, root);
      b.sessions.announce(conf);
      await b.sessions.maintainOffline();
      await b.sessions.add(conf, req('warm')); // reads the node's blocks into the cache
      b.link.cut = true;
      b.t += 1_000;
      await code11(b.sessions.add(conf, req('c1')), 'etcd unreachable (test partition); c1/eth0 may hold an online allocation in pool p1 that cannot be read while etcd is unreachable (no second one is given offline); retry');
      b.link.cut = false;
      a.link.cut = false;
      await b.sessions.maintainOffline();
      assert.deepEqual(JSON.parse(kv.dump()[`${P}/handles/c1/eth0`] as string).ips.map((i: { ip: string }) => i.ip), first, 'c1 keeps its address');
      await b.sessions.close();
    } finally {
      await a.sessions.close();
    }
  });

  it('F4: an unreadable entry (a directory, a symlink) is set aside as <name>.corrupt; announce, the heartbeat and online ADDs go on; offline ADDs are refused with code 11', async () => {
    for (const kind of ['dir', 'symlink'] as const) {
      const kv = new MemoryKV();
      const root = tempDir();
      mkdirSync(pdir(root), { recursive: true, mode: 0o700 });
      const bad = join(pdir(root), `${'d'.repeat(64)}.json`);
      if (kind === 'dir') mkdirSync(bad);
      else symlinkSync('/etc/hostname', bad);
      const a = node(kv, root);
      const conf = config({ reserve: 2, seconds: 300 });
      try {
        a.sessions.loadJournals();
        a.sessions.announce(conf);
        assert.equal(a.sessions.heartbeats.size, 1, `${kind}: the heartbeat started`);
        await a.sessions.maintainOffline();
        assert.deepEqual(readdirSync(pdir(root)), [`${'d'.repeat(64)}.json.corrupt`], `${kind}: set aside`);
        assert.ok(a.logs.some((l) => l.level === 'error' && l.msg.startsWith('pool journal entry')), `${kind}: an error line`);
        assert.deepEqual(ips(await a.sessions.add(conf, req('c1'))), ['10.80.0.18'], `${kind}: online ADD served`);
        assert.equal(a.sessions.offlineStats()[0]?.stuck, 1);
        a.link.cut = true;
        a.t += 1_000;
        await code11(a.sessions.add(conf, req('c2')), `etcd unreachable (test partition); offline allocation of pool p1 is off: 1 journal entries in ${pdir(root)} are set aside (*.corrupt) and may hold reserve addresses; an operator must resolve them; retry`);
      } finally {
        await a.sessions.close();
      }
    }
  });

  it('F4: a journal directory writable by group (0770) never stops announce, the heartbeat or online ADDs; offline ADDs are refused with code 11', async () => {
    const kv = new MemoryKV();
    const root = tempDir();
    mkdirSync(pdir(root), { recursive: true, mode: 0o700 });
    chmodSync(pdir(root), 0o770);
    const a = node(kv, root);
    const conf = config({ reserve: 2, seconds: 300 });
    try {
      a.sessions.loadJournals();
      a.sessions.announce(conf);
      assert.equal(a.sessions.heartbeats.size, 1);
      await a.sessions.maintainOffline();
      assert.ok(kv.dump()[`${P}/alive/node-a`] !== undefined, 'alive key put');
      assert.deepEqual(ips(await a.sessions.add(conf, req('c1'))), ['10.80.0.18']);
      a.link.cut = true;
      a.t += 1_000;
      const e = await unavailable(a.sessions.add(conf, req('c2')));
      assert.match(e.message, /^etcd unreachable \(test partition\); offline allocation of pool p1 is off: its journal cannot be read \(pool journal: .* is writable by group or others \(mode 770\)\); retry$/);
    } finally {
      await a.sessions.close();
    }
  });

  it('F1: step 1 whose marker transaction lost its answer, re-run after the first lease ran out: the window is put again with a fresh lease and --finish waits for it', async () => {
    const kv = new MemoryKV();
    const link = new PartitionKV(kv);
    const op = operator(kv);
    const opLink = new PoolRemoval({ kv: link, pool: 'p1', prefix: '/ipwarden' });
    const leases: string[] = [];
    const ttls: number[] = [];
    const windowLease = async (ttl: number): Promise<string> => {
      ttls.push(ttl);
      const id = await kv.grantLease(ttl);
      leases.push(id);
      return id;
    };
    link.loseNextAnswer = true;
    await unavailable(opLink.mark('node-a', { windowLease }));
    assert.notEqual(kv.dump()[`${P}/removing/node-a`], undefined, 'the marker was applied');
    kv.expireLease(leases[0] as string); // the first lease, granted before the marker, runs out
    assert.equal(kv.dump()[`${P}/removal-window/node-a`], undefined);
    link.cut = false;
    await opLink.mark('node-a', { windowLease });
    assert.deepEqual(ttls, [60, 60], 'the re-run granted a lease of the real window');
    assert.notEqual(kv.dump()[`${P}/removal-window/node-a`], undefined);
    await assert.rejects(op.finish('node-a'), (e: unknown) => e instanceof Error && e.message.startsWith("the veto window of node node-a's removal from pool p1 has not passed"));
    kv.expireLease(leases[1] as string);
    await op.finish('node-a');
    assert.equal(kv.dump()[`${P}/removing/node-a`], undefined, 'finished after the fresh window');
  });

  it('F5: a clock seen going back drops the confirmed contact: once it has caught up, no offline ADD (the budget is never lengthened)', async () => {
    const kv = new MemoryKV();
    const a = node(kv, tempDir());
    const conf = config({ reserve: 2, seconds: 30 });
    try {
      a.sessions.announce(conf);
      await a.sessions.maintainOffline(); // contact at t = 1000
      a.link.cut = true;
      a.t = 500; // stepped back by 500 ms
      const noContact = 'etcd unreachable (test partition); offline allocation of pool p1 refused: no confirmed contact with etcd to count the offline budget of 30 s from (none since the daemon started, or the clock went back)';
      await code11(a.sessions.add(conf, req('c1')), noContact);
      a.t = 6_000; // caught up, 5 s after the contact (S = 30 s)
      await code11(a.sessions.add(conf, req('c2')), noContact);
      assert.equal(a.sessions.offlineStats()[0]?.contactAgeSeconds, null, 'no contact left');
      a.link.cut = false;
      await a.sessions.maintainOffline(); // a new contact on the (new) clock
      a.link.cut = true;
      a.t += 1_000;
      assert.deepEqual(ips(await a.sessions.add(conf, req('c3'))), ['10.80.0.16'], 'a contact after the step counts');
    } finally {
      await a.sessions.close();
    }
  });

  it('F5: the default clock is CLOCK_BOOTTIME as /proc/uptime gives it (it counts suspended time)', () => {
    const up = (): number => Number(readFileSync('/proc/uptime', 'latin1').split(' ')[0]) * 1000;
    const before = up();
    const t = bootClock();
    const after = up();
    assert.ok(before <= t && t <= after, `${before} <= ${t} <= ${after}`);
  });

  it('the coarse clock (send times) answers a reading of the boot clock: never above it now, never below its latest reading', () => {
    for (let i = 0; i < 50; i++) {
      const before = bootClock();
      const c = coarseBootClock();
      const after = bootClock();
      assert.ok(before <= c && c <= after, `${before} <= ${c} <= ${after}`);
    }
  });

  it('F7: journal entries are validated on read: ip = block address + ordinal, distinct slots, one per range set; an invalid one is set aside', async () => {
    const entry = (ips: unknown) => JSON.stringify({ v: 1, kind: 'add', pool: { name: 'p1', etcd: { endpoints: ['http://127.0.0.1:1'], prefix: '/ipwarden' }, blockSize: 28, blockSize6: 122, offline: { reserve: 2, seconds: 300 } }, network: 'net1', node: 'node-a', containerId: 'c1', ifname: 'eth0', at: 1, ips });
    const slot = (ip: string, ordinal: number, rangeSet = 0, block = '10.80.0.16-28') => ({ ip, block, ordinal, seq: 1, rangeSet });
    assert.equal(decodeJournalEntry(entry([slot('10.80.0.16', 0)]), '/j/x').ips.length, 1);
    const bad: Array<[unknown, string]> = [
      [[slot('10.80.0.29', 0)], 'ips[0].ip 10.80.0.29 is not ordinal 0 of block 10.80.0.16-28 (that is 10.80.0.16)'],
      [[slot('10.80.0.16', 0), slot('10.80.0.16', 0, 1)], '"ips" names one address twice'],
      [[slot('10.80.0.16', 0), slot('10.80.0.17', 1)], '"ips" names one range set twice (one address per range set)'],
      [[slot('10.80.0.32', 16)], 'ips[0].ordinal 16 is outside block 10.80.0.16-28'],
      [[slot('10.80.0.17', 0, 0, '10.80.0.17-28')], 'ips[0].block "10.80.0.17-28" is not a block\'s network address and prefix'],
    ];
    for (const [ips, why] of bad) assert.throws(() => decodeJournalEntry(entry(ips), '/j/x'), (e: unknown) => isAppError(e, 'STORE_CORRUPT') && e.message === `pool journal /j/x: ${why}`, why);
    // On disk: the edited entry is set aside, never synced; the pool refuses offline ADDs.
    const kv = new MemoryKV();
    const root = tempDir();
    const conf = config({ reserve: 2, seconds: 300 });
    const a = node(kv, root);
    a.sessions.announce(conf);
    await a.sessions.maintainOffline();
    a.link.cut = true;
    a.t += 1_000;
    await a.sessions.add(conf, req('c1'));
    const name = readdirSync(pdir(root))[0] as string;
    const e = JSON.parse(readFileSync(join(pdir(root), name), 'utf8'));
    e.ips[0].ip = '10.80.0.29';
    writeFileSync(join(pdir(root), name), JSON.stringify(e));
    const b = node(kv, root);
    try {
      b.sessions.loadJournals();
      b.sessions.announce(conf);
      await b.sessions.maintainOffline();
      assert.deepEqual(readdirSync(pdir(root)), [`${name}.corrupt`]);
      assert.equal(kv.dump()[`${P}/handles/c1/eth0`], undefined, 'never synced');
      assert.equal(b.sessions.offlineStats()[0]?.stuck, 1);
      // A pool layout that changed (another block size) sets an entry aside too (journalEntryMisfit).
      assert.equal(journalEntryMisfit(decodeJournalEntry(entry([slot('10.80.0.16', 0)]), '/j/x'), { ...(conf.pool as PoolConfig), blockSize4: 27 }, conf.rangeSets), 'its pool config differs from the current one');
      assert.equal(journalEntryMisfit(decodeJournalEntry(entry([slot('10.80.0.16', 0)]), '/j/x'), conf.pool as PoolConfig, [[...(conf.rangeSets[0] ?? [])], [...(conf.rangeSets[0] ?? [])]]), 'it names 1 addresses for 2 range sets');
    } finally {
      await a.sessions.close();
      await b.sessions.close();
    }
  });

  it('F4: one entry whose sync throws (a corrupt handle) never stops the other entries\' syncs nor the refill', async () => {
    const kv = new MemoryKV();
    const root = tempDir();
    const a = node(kv, root);
    const conf = config({ reserve: 3, seconds: 300 });
    try {
      a.sessions.announce(conf);
      await a.sessions.maintainOffline();
      a.link.cut = true;
      a.t += 1_000;
      await a.sessions.add(conf, req('c1'));
      await a.sessions.add(conf, req('c2'));
      await kv.txn([], [{ put: `${P}/handles/c1/eth0`, value: 'garbage' }]);
      a.link.cut = false;
      await a.sessions.maintainOffline();
      assert.deepEqual(JSON.parse(kv.dump()[`${P}/handles/c2/eth0`] as string).ips.map((i: { ip: string }) => i.ip), ['10.80.0.17'], 'c2 synced');
      assert.equal(a.sessions.offlineStats()[0]?.journaled, 1, 'c1 waits');
      assert.deepEqual(a.sessions.offlineStats()[0]?.reserveLeft, [2], 'refilled to 3, one of them held by c1\'s entry');
      assert.ok(a.logs.some((l) => l.msg === 'offline journal entry not synced this round (the others go on)' && l.fields['containerId'] === 'c1'));
    } finally {
      await a.sessions.close();
    }
  });
});
