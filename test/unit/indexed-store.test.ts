/**
 * The daemon's per-network index (src/store/file/index-data.ts, indexed-store.ts) and the
 * allocator's fast path (src/ipam/allocator.ts): the sorted-key arithmetic, the fast round robin
 * against the listing path on random states, the Store contract, validation (trust / refresh /
 * rebuild), the linger rule and its bound with an injected clock, takeover and hand-off, the
 * STATUS probe, unusable entries, and the error paths.
 *
 * No wall-clock thresholds: the linger clock is injected and advanced by the test; lock
 * exclusion is checked with a single non-blocking flock attempt from another descriptor.
 */
import assert from 'node:assert/strict';
import { closeSync, lstatSync, mkdirSync, mkdtempSync, openSync, readdirSync, readFileSync, renameSync, rmSync, statSync, symlinkSync, unlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { AppError, isAppError } from '../../src/common/errors.ts';
import { allocate, iteratorSegments } from '../../src/ipam/allocator.ts';
import { loadIPAMConfig } from '../../src/ipam/config.ts';
import { formatIP, parseIP } from '../../src/common/ip.ts';
import { RangeSetIterator } from '../../src/ipam/iterator.ts';
import type { IP, RangeSet } from '../../src/ipam/types.ts';
import { lockExclusive } from '../../src/store/file/flock.ts';
import { IndexData, SortedKeys } from '../../src/store/file/index-data.ts';
import { NetworkIndexes, readEntry, realFsClock, type FsClock, type IndexClock, type IndexedStore } from '../../src/store/file/indexed-store.ts';
import { MemoryStore } from '../../src/store/memory/memory-store.ts';
import type { Owner, ReservationIndex, Store } from '../../src/store/store.ts';
import { rng } from '../helpers/rng.ts';
import { runStoreContract } from './store-contract.ts';

const tempRoots: string[] = [];
after(() => {
  for (const d of tempRoots) rmSync(d, { recursive: true, force: true });
});
function tempDataDir(): string {
  const d = mkdtempSync(join(tmpdir(), 'ipwarden-index-unit-'));
  tempRoots.push(d);
  return d;
}

/** Range sets from an `ipam.ranges` value, through the real config loader. */
function sets(ranges: unknown): readonly RangeSet[] {
  return loadIPAMConfig(JSON.stringify({ cniVersion: '1.0.0', name: 'n', ipam: { type: 'ipwarden', ranges } }), undefined).rangeSets;
}

/**
 * The linger clock of the tests: real time plus an offset that only the test moves, and timers
 * that fire only when the test advances. Directory stamps are real, so "now" must follow real time;
 * the tests use a 10 s tick, so real time alone never reaches the end of a linger.
 */
class ManualClock implements IndexClock {
  offset = 0;
  #timers: Array<{ at: number; fn: () => void; live: boolean }> = [];
  now(): number {
    return Date.now() + this.offset;
  }
  setTimer(fn: () => void, ms: number): () => void {
    const rec = { at: this.now() + ms, fn, live: true };
    this.#timers.push(rec);
    return () => {
      rec.live = false;
    };
  }
  /** Move the clock by `ms` without running timers (a timer that is late). */
  jump(ms: number): void {
    this.offset += ms;
  }
  /** Move the clock by `ms`, stepping to each timer due on the way and running it (in order, including ones they arm). */
  advance(ms: number): void {
    const target = this.now() + ms;
    for (;;) {
      const due = this.#timers.filter((r) => r.live && r.at <= target).sort((a, b) => a.at - b.at)[0];
      if (due === undefined) break;
      this.offset += Math.max(0, due.at - this.now());
      due.live = false;
      due.fn();
    }
    this.offset += Math.max(0, target - this.now());
    this.#timers = this.#timers.filter((r) => r.live);
  }
}

/** Test tick and bound: far above any real delay between two steps of a test. */
const TICK = 10_000;
const BOUND = 30_000;

/**
 * The file system's clock of the tests: the manual clock one TICK behind, as a coarse clock that
 * lags (so a linger ends when the test has advanced the clock about one TICK past the stamp).
 */
function laggingFsClock(clock: ManualClock): FsClock {
  return { stampNow: () => BigInt(Math.floor(clock.now() - TICK)) * 1_000_000n };
}

/** A file system clock the test sets: `v` ns, or null (a probe that fails). */
class SetFsClock implements FsClock {
  v: bigint | null = 0n;
  probes = 0;
  stampNow(): bigint | null {
    this.probes++;
    return this.v;
  }
}

/** DIR's stamp as the index records it: max(mtime, ctime), ns. */
function dirStampNs(dir: string): bigint {
  const s = statSync(dir, { bigint: true });
  return s.mtimeNs > s.ctimeNs ? s.mtimeNs : s.ctimeNs;
}

/** True when another descriptor can take DIR/lock right now (one non-blocking attempt). */
async function lockIsFree(dir: string): Promise<boolean> {
  try {
    const h = await lockExclusive(join(dir, 'lock'), 0);
    h.release();
    return true;
  } catch (e) {
    if (isAppError(e, 'STORE_LOCK_TIMEOUT')) return false;
    throw e;
  }
}

const C1 = { containerId: 'c1', ifname: 'eth0' };
const C2 = { containerId: 'c2', ifname: 'eth0' };

describe('SortedKeys', () => {
  it('countIn and nextAbsent agree with a plain set on random contents', () => {
    const r = rng(7);
    for (let round = 0; round < 200; round++) {
      const k = new SortedKeys();
      const plain = new Set<bigint>();
      const span = 1 + Math.floor(r() * 64);
      for (let i = 0; i < span; i++) {
        const v = BigInt(Math.floor(r() * span));
        if (r() < 0.7) {
          assert.equal(k.add(v), !plain.has(v));
          plain.add(v);
        } else {
          assert.equal(k.delete(v), plain.has(v));
          plain.delete(v);
        }
      }
      assert.equal(k.size, plain.size);
      for (let q = 0n; q <= BigInt(span) + 1n; q++) {
        let want = q;
        while (plain.has(want)) want++;
        assert.equal(k.nextAbsent(q), want, `nextAbsent(${q}) of ${[...plain].sort()}`);
        const hi = q + BigInt(Math.floor(r() * 8));
        let n = 0;
        for (const v of plain) if (v >= q && v <= hi) n++;
        assert.equal(k.countIn(q, hi), n);
        assert.equal(k.has(q), plain.has(q));
      }
      assert.equal(k.countIn(5n, 4n), 0);
    }
  });

  it('reset sorts and drops duplicates', () => {
    const k = new SortedKeys();
    k.reset([5n, 1n, 3n, 1n, 4n]);
    assert.deepEqual(k.values(), [1n, 3n, 4n, 5n]);
    assert.equal(k.nextAbsent(3n), 6n);
    assert.equal(k.nextAbsent(2n), 2n);
  });
});

describe('IndexData', () => {
  it('keeps list, content map and counts in step through set/delete', () => {
    const d = new IndexData();
    d.reset([
      ['10.0.0.2', { kind: 'record', trimmed: 'a\r\neth0', owner: { containerId: 'a', ifname: 'eth0' } }],
      ['10.0.0.3', { kind: 'record', trimmed: 'a', owner: { containerId: 'a', ifname: null } }],
      ['10.0.0.4', { kind: 'unusable' }],
      ['10.0.0.5', { kind: 'record', trimmed: null, owner: null }],
      ['not-an-ip', { kind: 'unusable' }],
    ]);
    assert.equal(d.recordCount, 3);
    assert.equal(d.entryCount, 4);
    assert.deepEqual(d.ownedBy('a', 'eth0').map((r) => r.ip).sort(), ['10.0.0.2', '10.0.0.3']);
    assert.deepEqual(d.ownedBy('a', 'eth1').map((r) => r.ip), ['10.0.0.3']);
    const lo = (parseIP('10.0.0.0') as IP).value;
    assert.equal(d.countTaken(4, lo, lo + 255n), 4);
    assert.equal(d.countReserved(4, lo, lo + 255n), 3);
    assert.equal(d.nextFree(4, lo + 2n), lo + 6n);
    d.delete('10.0.0.2');
    d.set('10.0.0.4', { kind: 'record', trimmed: 'b\r\neth0', owner: { containerId: 'b', ifname: 'eth0' } });
    assert.deepEqual(d.ownedBy('a', 'eth0').map((r) => r.ip), ['10.0.0.3']);
    assert.deepEqual(d.unusableNames(), []);
    assert.equal(d.countReserved(4, lo, lo + 255n), 3);
    assert.equal(d.nextFree(4, lo + 2n), lo + 2n);
    assert.deepEqual(d.list().map((r) => r.ip).sort(), ['10.0.0.3', '10.0.0.4', '10.0.0.5']);
  });
});

describe('iteratorSegments', () => {
  it('yields exactly the RangeSetIterator order (gateways removed) on random range sets', () => {
    const r = rng(11);
    for (let round = 0; round < 300; round++) {
      const n = 1 + Math.floor(r() * 3);
      const raw = [];
      for (let k = 0; k < n; k++) {
        const base = 10 + k * 2;
        const start = 1 + Math.floor(r() * 5);
        const end = start + Math.floor(r() * 6);
        const gw = r() < 0.3 ? start + Math.floor(r() * (end - start + 1)) : r() < 0.5 ? 1 : 0;
        raw.push({ subnet: `10.${base}.0.0/24`, rangeStart: `10.${base}.0.${start}`, rangeEnd: `10.${base}.0.${end}`, ...(gw > 0 ? { gateway: `10.${base}.0.${gw}` } : {}) });
      }
      const set = sets([raw])[0] as RangeSet;
      const candidates: Array<IP | null> = [null, parseIP('10.99.0.1') as IP];
      for (const x of set) {
        candidates.push(x.rangeStart, x.rangeEnd, x.gateway, { family: 4, value: x.rangeStart.value + 1n });
      }
      for (const last of candidates) {
        const want: string[] = [];
        const it = new RangeSetIterator(set, last);
        for (let c = it.next(); c !== null; c = it.next()) want.push(formatIP(c.ip));
        const got: string[] = [];
        for (const seg of iteratorSegments(set, last)) {
          const rr = set[seg.rangeIndex]!;
          for (let v = seg.lo; v <= seg.hi; v++) if (!(rr.gateway.family === 4 && v === rr.gateway.value)) got.push(formatIP({ family: 4, value: v }));
        }
        assert.deepEqual(got, want, `set ${JSON.stringify(raw)} last ${last === null ? 'null' : formatIP(last)}`);
      }
    }
  });
});

/**
 * A MemoryStore with the index capability: an IndexData kept in step with every change, so the
 * allocator takes its fast path over exactly the state the listing path sees.
 */
class IndexedMemory extends MemoryStore {
  readonly data = new IndexData();
  constructor() {
    super('n');
  }
  sync(): void {
    const snap = this.snapshot().reservations;
    this.data.reset(
      Object.entries(snap).map(([ip, text]) => {
        if (text === null) return [ip, { kind: 'record', trimmed: null, owner: null }] as const;
        // snapshot() writes `id|ifname` or `id`; the index keys records by file content `id\r\nifname`.
        const bar = text.indexOf('|');
        const owner: Owner = bar < 0 ? { containerId: text, ifname: null } : { containerId: text.slice(0, bar), ifname: text.slice(bar + 1) };
        const trimmed = owner.ifname === null ? owner.containerId : `${owner.containerId}\r\n${owner.ifname}`;
        return [ip, { kind: 'record', trimmed, owner }] as const;
      }),
    );
  }
  reservationIndex(): ReservationIndex {
    return this.data;
  }
  override async reserve(ip: string, owner: { containerId: string; ifname: string }, i: number): Promise<boolean> {
    const ok = await super.reserve(ip, owner, i);
    this.sync();
    return ok;
  }
  override async rewrite(ip: string, expected: Owner, owner: { containerId: string; ifname: string }): Promise<boolean> {
    const ok = await super.rewrite(ip, expected, owner);
    this.sync();
    return ok;
  }
  override async release(ip: string, expected: Owner | null): Promise<boolean> {
    const ok = await super.release(ip, expected);
    this.sync();
    return ok;
  }
}

describe('allocator fast path', () => {
  /** The outcome of one ADD: IPs, or code + message + details; plus the store's state afterwards. */
  async function outcome(store: MemoryStore, rangeSets: readonly RangeSet[], id: string, ifname: string, requested: IP[]): Promise<unknown> {
    let res: unknown;
    try {
      res = (await allocate(store, { containerId: id, ifname, rangeSets, requestedIPs: requested })).map((a) => [formatIP(a.ip), a.rangeSetIndex, a.existing]);
    } catch (e) {
      res = e instanceof AppError ? [e.code, e.message, e.details] : String(e);
    }
    return { res, snap: store.snapshot() };
  }

  it('gives the same address, state and errors as the listing path on random states', async () => {
    const r = rng(2024);
    let fast = 0;
    for (let round = 0; round < 400; round++) {
      const twoSets = r() < 0.3;
      const size = 2 + Math.floor(r() * 10);
      const ranges: unknown[] = [[{ subnet: '10.1.0.0/24', rangeStart: '10.1.0.1', rangeEnd: `10.1.0.${size}`, ...(r() < 0.5 ? { gateway: `10.1.0.${1 + Math.floor(r() * size)}` } : {}) }, ...(r() < 0.4 ? [{ subnet: '10.2.0.0/24', rangeStart: '10.2.0.5', rangeEnd: '10.2.0.8' }] : [])]];
      if (twoSets) ranges.push([{ subnet: 'fd01::/120', rangeStart: 'fd01::1', rangeEnd: `fd01::${(1 + Math.floor(r() * 6)).toString(16)}` }]);
      const rangeSets = sets(ranges);
      const slow = new MemoryStore('n');
      const quick = new IndexedMemory();
      await slow.lock(1);
      await quick.lock(1);
      const owners = ['a', 'b', 'c', 'd'];
      for (const set of rangeSets) {
        for (const x of set) {
          for (let v = x.rangeStart.value; v <= x.rangeEnd.value; v++) {
            const roll = r();
            if (roll > 0.55) continue;
            const ip = formatIP({ family: x.rangeStart.family, value: v });
            const who = owners[Math.floor(r() * owners.length)]!;
            const owner: Owner | null = roll < 0.05 ? null : roll < 0.1 ? { containerId: who, ifname: null } : { containerId: who, ifname: r() < 0.5 ? 'eth0' : 'eth1' };
            slow.seed(ip, owner);
            quick.seed(ip, owner);
          }
        }
      }
      for (let i = 0; i < rangeSets.length; i++) {
        if (r() < 0.7) {
          const x = rangeSets[i]![Math.floor(r() * rangeSets[i]!.length)]!;
          const v = x.rangeStart.value + BigInt(Math.floor(r() * Number(x.rangeEnd.value - x.rangeStart.value + 2n)));
          const last = formatIP({ family: x.rangeStart.family, value: v });
          slow.setLastReserved(i, last);
          quick.setLastReserved(i, last);
        }
      }
      quick.sync();
      const id = owners[Math.floor(r() * owners.length)]!;
      const ifname = r() < 0.5 ? 'eth0' : 'eth1';
      const requested: IP[] = [];
      if (r() < 0.2) requested.push({ family: 4, value: (parseIP('10.1.0.1') as IP).value + BigInt(Math.floor(r() * (size + 1))) });
      const a = await outcome(slow, rangeSets, id, ifname, requested);
      const b = await outcome(quick, rangeSets, id, ifname, requested);
      assert.deepEqual(b, a, `round ${round}`);
      if (quick.calls.list === 0) fast++;
    }
    // The fast path really ran (no listing at all).
    assert.equal(fast, 400);
  });

  it('recognises a full range set without reading last_reserved_ip or reserving', async () => {
    const rangeSets = sets([[{ subnet: '10.3.0.0/24', rangeStart: '10.3.0.2', rangeEnd: '10.3.0.9' }]]);
    const s = new IndexedMemory();
    await s.lock(1);
    for (let v = 2; v <= 9; v++) s.seed(`10.3.0.${v}`, { containerId: `x${v}`, ifname: 'eth0' });
    s.sync();
    s.resetCalls();
    await assert.rejects(allocate(s, { containerId: 'new', ifname: 'eth0', rangeSets, requestedIPs: [] }), (e: unknown) => {
      assert.ok(e instanceof AppError);
      assert.equal(e.message, 'failed to allocate for range 0: no IP addresses available in range set: 10.3.0.2-10.3.0.9');
      assert.equal(e.details, 'range set 0 has 8 allocatable addresses and 8 reservations');
      return true;
    });
    assert.equal(s.calls.lastReservedIP, 0);
    assert.equal(s.calls.reserve, 0);
    assert.equal(s.calls.list, 0);
  });
});

/** A fresh indexes object with a manual clock, the test tick and bound, plus one network. */
function fixture(opts: { maxHoldMs?: number; fullRebuildBelow?: number; verify?: boolean; fsClock?: FsClock; onCorrupt?: (dir: string, names: string[]) => void } = {}) {
  const clock = new ManualClock();
  const ix = new NetworkIndexes({ tickMs: TICK, maxHoldMs: BOUND, clock, fsClock: laggingFsClock(clock), ...opts });
  const dataDir = tempDataDir();
  const dir = join(dataDir, 'net1');
  after(() => ix.close());
  return { clock, ix, dataDir, dir, open: () => ix.open({ dataDir, network: 'net1' }) };
}

async function withLocked<T>(open: () => Promise<Store>, fn: (s: Store) => Promise<T>): Promise<T> {
  const s = await open();
  try {
    await s.lock(1);
    return await fn(s);
  } finally {
    await s.close();
  }
}

runStoreContract('IndexedStore', async () => {
  const { open, dir, ix, dataDir } = fixture({ verify: true });
  const store = await open();
  return {
    store,
    // Planted while the store holds the lock, behind its back: tell the index.
    plant: async (ip, owner) => {
      writeFileSync(join(dir, ip), owner === null ? '' : owner.ifname === null ? owner.containerId : `${owner.containerId}\r\n${owner.ifname}`, { mode: 0o600 });
      ix.invalidate(dataDir, 'net1');
    },
  };
});

describe('IndexedStore: validation', () => {
  it('trusts an unchanged directory, refreshes after a foreign change, rebuilds after an ino change', async () => {
    const { ix, open, dir, clock, dataDir } = fixture({ fullRebuildBelow: 0 });
    await withLocked(open, (s) => s.reserve('10.0.0.2', C1, 0));
    assert.equal(ix.stats.rebuilt, 1);
    clock.advance(2 * TICK);
    assert.equal(await lockIsFree(dir), true);
    await withLocked(open, async (s) => assert.deepEqual((await s.list({ mtime: false })).map((r) => r.ip), ['10.0.0.2']));
    assert.equal(ix.stats.trusted, 1);
    clock.advance(2 * TICK);
    // Another writer (host-local's way: under the lock, O_EXCL file) adds one and removes ours.
    const h = await lockExclusive(join(dir, 'lock'), 1);
    writeFileSync(join(dir, '10.0.0.3'), 'c2\r\neth0', { mode: 0o600 });
    unlinkSync(join(dir, '10.0.0.2'));
    h.release();
    await withLocked(open, async (s) => {
      assert.deepEqual((await s.list({ mtime: false })).map((r) => r.ip), ['10.0.0.3']);
      assert.deepEqual(s.reservationIndex?.()?.ownedBy('c2', 'eth0').map((r) => r.ip), ['10.0.0.3']);
    });
    assert.equal(ix.stats.refreshed, 1);
    clock.advance(2 * TICK);
    rmSync(dir, { recursive: true });
    mkdirSync(dir);
    writeFileSync(join(dir, '10.0.0.9'), 'c9\r\neth0');
    await withLocked(open, async (s) => assert.deepEqual((await s.list({ mtime: false })).map((r) => r.ip), ['10.0.0.9']));
    // A new directory: rebuilt (or, where the file system re-used the inode number and keeps no
    // birth time, refreshed: the names differ).
    assert.equal(ix.stats.rebuilt + ix.stats.refreshed, 3);
    assert.deepEqual(ix.peek(dataDir, 'net1')?.reservations, [{ ip: '10.0.0.9', owner: { containerId: 'c9', ifname: 'eth0' } }]);
  });

  it('treats unusable IP-named entries as FileStore does: not listed, but taken', async () => {
    const { open, dir } = fixture();
    mkdirSync(dir, { recursive: true });
    mkdirSync(join(dir, '10.0.0.2'));
    symlinkSync('/nonexistent-ipwarden-target', join(dir, '10.0.0.3'));
    writeFileSync(join(dir, '10.0.0.4'), '');
    writeFileSync(join(dir, '.ipwarden-1-x.tmp'), 'leftover');
    await withLocked(open, async (s) => {
      const listed = await s.list({ mtime: false });
      assert.deepEqual(listed.map((r) => [r.ip, r.owner]), [['10.0.0.4', null]]);
      const idx = s.reservationIndex?.();
      assert.ok(idx);
      const v = (t: string) => (parseIP(t) as IP).value;
      assert.equal(idx.isTaken(4, v('10.0.0.2')), true);
      assert.equal(idx.isTaken(4, v('10.0.0.3')), true);
      assert.equal(idx.countReserved(4, v('10.0.0.0'), v('10.0.0.255')), 1);
      const got = await allocate(s, { containerId: 'c1', ifname: 'eth0', rangeSets: sets([[{ subnet: '10.0.0.0/24' }]]), requestedIPs: [] });
      assert.equal(formatIP(got[0]!.ip), '10.0.0.5');
    });
    assert.equal(readdirSync(dir).includes('.ipwarden-1-x.tmp'), false, 'temp leftover removed under the lock');
    assert.deepEqual(readEntry(join(dir, '10.0.0.3'), Buffer.alloc(64)), { kind: 'unusable' });
    assert.equal(readEntry(join(dir, '10.0.0.77'), Buffer.alloc(64)), null);
  });

  it('last_reserved_ip is read once per hold, follows our own reserve, and is re-read by the next hold', async () => {
    const { open, dir, clock } = fixture();
    const last = join(dir, 'last_reserved_ip.0');
    await withLocked(open, async (s) => {
      assert.equal(await s.lastReservedIP(0), null);
      assert.equal(await s.reserve('10.0.0.2', C1, 0), true);
      // Our own write is seen at once (the remembered value was dropped by reserve).
      assert.equal(await s.lastReservedIP(0), '10.0.0.2');
      // A refused reserve (EEXIST) writes nothing: the file's value is still read back.
      assert.equal(await s.reserve('10.0.0.2', C2, 0), false);
      assert.equal(await s.lastReservedIP(0), '10.0.0.2');
    });
    clock.advance(2 * TICK);
    // host-local rewrites the file in place under the lock (DIR's stamp unchanged): the next hold reads it.
    const h = await lockExclusive(join(dir, 'lock'), 1);
    writeFileSync(last, '10.0.0.7');
    h.release();
    await withLocked(open, async (s) => {
      assert.equal(await s.lastReservedIP(0), '10.0.0.7');
      assert.equal(await s.lastReservedIP(0), '10.0.0.7');
    });
    clock.advance(2 * TICK);
    // Without the lock, every call reads the file.
    const s = await open();
    try {
      writeFileSync(last, '10.0.0.8');
      assert.equal(await s.lastReservedIP(0), '10.0.0.8');
      writeFileSync(last, '10.0.0.9');
      assert.equal(await s.lastReservedIP(0), '10.0.0.9');
    } finally {
      await s.close();
    }
  });

  it('DEL re-reads before unlinking and falls back to a full scan when the index is wrong', async () => {
    const { ix, open, dir, clock } = fixture({ fullRebuildBelow: 0 });
    await withLocked(open, (s) => s.reserve('10.0.0.2', C1, 0));
    clock.advance(2 * TICK);
    // A writer ignoring the lock rewrites the file in place (no change of DIR's stamp is guaranteed).
    writeFileSync(join(dir, '10.0.0.2'), 'c2\r\neth0');
    await withLocked(open, async (s) => {
      assert.deepEqual(await s.releaseByOwner('c1', 'eth0'), []);
      assert.deepEqual(await s.releaseByOwner('c2', 'eth0'), ['10.0.0.2']);
    });
    assert.ok(ix.stats.staleHits >= 1);
    assert.deepEqual(readdirSync(dir).filter((n) => n.startsWith('10.')), []);
  });
});

describe('IndexedStore: group commit (one DIR fsync per flush round, after the lock)', () => {
  it("a reservation's close() resolves after the flush round that covers it; a DEL flushes nothing", async () => {
    const { ix, open, clock } = fixture();
    await withLocked(open, (s) => s.reserve('10.0.0.2', C1, 0));
    assert.deepEqual([ix.stats.flushes, ix.stats.flushedWrites], [1, 1]);
    clock.advance(2 * TICK);
    // An idempotent re-ADD writes nothing and has nothing to wait for.
    await withLocked(open, async (s) => assert.deepEqual((await s.list({ mtime: false })).map((r) => r.ip), ['10.0.0.2']));
    assert.deepEqual([ix.stats.flushes, ix.stats.flushedWrites], [1, 1]);
    clock.advance(2 * TICK);
    await withLocked(open, async (s) => assert.deepEqual(await s.releaseByOwner('c1', 'eth0'), ['10.0.0.2']));
    assert.deepEqual([ix.stats.flushes, ix.stats.flushedWrites], [1, 1]);
  });

  it('8 concurrent ADDs on one network share one flush round: 8 writes made durable by 1 fsync', async () => {
    const { ix, open } = fixture();
    // Request 1 takes the lock; 2–8 queue and get it by hand-off. None of their writes waits on a
    // disk (the fsync is not under the lock), and the round's fsync starts only in the check
    // phase of the turn (setImmediate), so all eight are written before it begins: one round.
    const ips = await Promise.all(
      Array.from({ length: 8 }, (_, i) => withLocked(open, async (s) => {
        const ip = `10.0.0.${i + 2}`;
        assert.equal(await s.reserve(ip, { containerId: `c${i}`, ifname: 'eth0' }, 0), true);
        return ip;
      })),
    );
    assert.equal(ips.length, 8);
    assert.deepEqual([ix.stats.flushes, ix.stats.flushedWrites], [1, 8]);
    assert.equal(ix.stats.handoffs, 7);
  });

  it('a request that only read a reservation another request made waits for that reservation\'s flush', async () => {
    const { ix, open } = fixture();
    const a = await open();
    await a.lock(1);
    assert.equal(await a.reserve('10.0.0.2', C1, 0), true);
    // The re-ADD queues behind the lock, then sees C1's reservation before its flush completed.
    const reAdd = withLocked(open, async (s) => (await s.list({ mtime: false })).map((r) => r.ip));
    await a.close();
    assert.deepEqual(await reAdd, ['10.0.0.2']);
    assert.equal(ix.stats.flushedWrites, 1);
  });

  it('a failed flush fails the request that waited for it', async () => {
    const { open, dir } = fixture();
    const s = await open();
    await s.lock(1);
    assert.equal(await s.reserve('10.0.0.2', C1, 0), true);
    // DIR gone before the flush: its fsync cannot open it.
    rmSync(dir, { recursive: true });
    await assert.rejects(s.close(), (e: unknown) => isAppError(e) && e.code === 'STORE_IO' && /cannot make the reservations in .* durable/.test(e.message));
  });

  it('names empty or unparseable reservation files once per file (onCorrupt)', async () => {
    const seen: Array<[string, string[]]> = [];
    const { open, dir, clock } = fixture({ onCorrupt: (d, names) => void seen.push([d, names]) });
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, '10.0.0.7'), '');
    writeFileSync(join(dir, '10.0.0.8'), '\0\0\0');
    writeFileSync(join(dir, '10.0.0.9'), 'c9\r\neth0');
    await withLocked(open, async (s) => {
      // Taken: the allocator's index skips them, and they are listed with no owner.
      assert.deepEqual((await s.list({ mtime: false })).map((r) => [r.ip, r.owner]).sort(), [['10.0.0.7', null], ['10.0.0.8', null], ['10.0.0.9', { containerId: 'c9', ifname: 'eth0' }]]);
    });
    assert.deepEqual(seen, [[dir, ['10.0.0.7', '10.0.0.8']]]);
    clock.advance(2 * TICK);
    // A foreign change: the next hold reads DIR again; the two are not named again.
    writeFileSync(join(dir, '10.0.0.10'), '');
    await withLocked(open, async (s) => assert.equal((await s.list({ mtime: false })).length, 4));
    assert.deepEqual(seen, [[dir, ['10.0.0.7', '10.0.0.8']], [dir, ['10.0.0.10']]]);
  });
});

describe('IndexedStore: the linger rule', () => {
  it("close() returns at once but the lock is held until the file system's clock passes the stamp", async () => {
    const { ix, open, dir, clock } = fixture();
    await withLocked(open, (s) => s.reserve('10.0.0.2', C1, 0));
    // The stamp is "now" in real time and the manual clock has not moved: still held.
    assert.equal(ix.holdsAnyLock, true);
    assert.equal(await lockIsFree(dir), false);
    assert.equal(ix.stats.lingers, 1);
    clock.advance(2 * TICK);
    assert.equal(ix.holdsAnyLock, false);
    assert.equal(await lockIsFree(dir), true);
    assert.equal(ix.stats.cut, 0);
  });

  it('a request arriving during the linger takes the lock over without releasing it', async () => {
    const { ix, open, dir, clock } = fixture();
    await withLocked(open, (s) => s.reserve('10.0.0.2', C1, 0));
    const validations = ix.stats.trusted + ix.stats.refreshed + ix.stats.rebuilt;
    await withLocked(open, (s) => s.reserve('10.0.0.3', C2, 0));
    assert.equal(ix.stats.takeovers, 1);
    assert.equal(ix.stats.trusted + ix.stats.refreshed + ix.stats.rebuilt, validations, 'no validation on a takeover');
    assert.equal(await lockIsFree(dir), false);
    clock.advance(2 * TICK);
    assert.equal(await lockIsFree(dir), true);
  });

  it('hands the lock from one request to a queued one, and releases at the bound', async () => {
    const { ix, open, dir, clock } = fixture();
    const a = await open();
    await a.lock(1);
    const b = await open();
    const bLocked = b.lock(5);
    await a.reserve('10.0.0.2', C1, 0);
    await a.close();
    await bLocked;
    assert.equal(ix.stats.handoffs, 1);
    await b.reserve('10.0.0.3', C2, 0);
    clock.jump(BOUND + 1); // past the bound, while b still holds the lock
    const c = await open();
    const cLocked = c.lock(60);
    await b.close(); // heldFor ≥ bound: no hand-off; c must compete for the flock
    assert.equal(ix.stats.handoffs, 1);
    assert.equal((c as IndexedStore).locked, false);
    // The linger ends (clock past the stamp), the lock is released, and c (after the pause) takes it.
    clock.advance(2 * TICK);
    await cLocked;
    assert.equal((c as IndexedStore).locked, true);
    assert.equal(ix.stats.takeovers, 0);
    await c.close();
    clock.advance(2 * TICK);
    assert.equal(await lockIsFree(dir), true);
  });

  it('does not take a lingering lock over once the hold reached the bound', async () => {
    const { ix, open, clock } = fixture({ maxHoldMs: TICK / 2 });
    await withLocked(open, (s) => s.reserve('10.0.0.2', C1, 0));
    clock.jump(TICK / 2 + 1); // the bound passed, the linger not yet over
    const s = await open();
    const locked = s.lock(60);
    assert.equal((s as IndexedStore).locked, false);
    clock.advance(2 * TICK); // the linger ends, the lock is released, s competes after the pause
    await locked;
    assert.equal(ix.stats.takeovers, 0);
    await s.close();
  });

  it('a request queued behind a linger is served with the real clock (its wait keeps the process alive)', async () => {
    // maxHoldMs 0: no takeover, the second request must wait for the linger to end and flock.
    const ix2 = new NetworkIndexes({ maxHoldMs: 0 });
    const dataDir = tempDataDir();
    const open = () => ix2.open({ dataDir, network: 'net1' });
    try {
      await withLocked(open, (s) => s.reserve('10.0.0.2', C1, 0));
      await withLocked(open, (s) => s.reserve('10.0.0.3', C2, 0));
      assert.equal(ix2.stats.takeovers, 0);
      assert.deepEqual(readdirSync(join(dataDir, 'net1')).filter((n) => n.startsWith('10.')).sort(), ['10.0.0.2', '10.0.0.3']);
    } finally {
      await ix2.close();
    }
  });

  it('an early release (shutdown, a stamp in the future) marks the stamp suspect: the next hold refreshes', async () => {
    const clock = new ManualClock();
    const dataDir = tempDataDir();
    const ix1 = new NetworkIndexes({ tickMs: TICK, maxHoldMs: BOUND, clock, fsClock: laggingFsClock(clock), fullRebuildBelow: 0 });
    const open = () => ix1.open({ dataDir, network: 'net1' });
    await withLocked(open, (s) => s.reserve('10.0.0.2', C1, 0));
    // Clock stepped back by a minute: the stamp lies in the future; no waiting for it.
    clock.jump(-10 * BOUND);
    await withLocked(open, (s) => s.reserve('10.0.0.3', C1, 1));
    assert.equal(ix1.holdsAnyLock, false);
    assert.equal(ix1.stats.cut, 1);
    await withLocked(open, async (s) => assert.equal((await s.list({ mtime: false })).length, 2));
    assert.equal(ix1.stats.refreshed, 1, 'suspect stamp → refresh, though the stamp is equal');
    assert.equal(ix1.stats.trusted, 0);
    await ix1.close();
    assert.equal(ix1.holdsAnyLock, false);
    await assert.rejects(open(), (e: unknown) => isAppError(e, 'CLOSED'));
  });

  it('releases the lock on error paths', async () => {
    const { ix, open, dir, clock } = fixture();
    const s = await open();
    await s.lock(1);
    await assert.rejects(s.reserve('not-an-ip', C1, 0), (e: unknown) => isAppError(e, 'INTERNAL'));
    await s.close();
    clock.advance(2 * TICK);
    assert.equal(ix.holdsAnyLock, false);
    assert.equal(await lockIsFree(dir), true);
    // A lock held by someone else: the timeout error is FileStore's, word for word.
    const h = await lockExclusive(join(dir, 'lock'), 1);
    try {
      const t = await open();
      await assert.rejects(t.lock(0), (e: unknown) => {
        assert.ok(isAppError(e, 'STORE_LOCK_TIMEOUT'));
        assert.equal(e.message, `timed out after 0s waiting for the lock on ${join(dir, 'lock')}`);
        return true;
      });
      await t.close();
    } finally {
      h.release();
    }
    assert.equal(ix.holdsAnyLock, false);
  });

  it('a queued request times out with the same error while another request holds the lock', async () => {
    const { open, dir, clock } = fixture();
    const a = await open();
    await a.lock(1);
    const b = await open();
    const p = b.lock(2);
    clock.advance(2500);
    await assert.rejects(p, (e: unknown) => {
      assert.ok(isAppError(e, 'STORE_LOCK_TIMEOUT'));
      assert.equal(e.message, `timed out after 2s waiting for the lock on ${join(dir, 'lock')}`);
      return true;
    });
    await a.close();
    await b.close();
  });

  it("STATUS's probe borrows a free lock and keeps the stamp, so the next ADD trusts the index", async () => {
    const { ix, open, clock } = fixture();
    await withLocked(open, (s) => s.reserve('10.0.0.2', C1, 0));
    clock.advance(2 * TICK);
    const st = await open();
    assert.equal(await st.writable(), true);
    await st.close();
    clock.advance(2 * TICK);
    const before = ix.stats.trusted;
    await withLocked(open, async (s) => assert.equal((await s.list({ mtime: false })).length, 1));
    assert.equal(ix.stats.trusted, before + 1);
    assert.equal(ix.stats.refreshed, 0);
  });
});

describe("IndexedStore: the linger ends on the file system's clock, not the wall clock (issue 17)", () => {
  it('a wall clock far past the stamp does not end the linger while the file system has not passed it', async () => {
    const fs = new SetFsClock();
    const { ix, open, dir, clock } = fixture({ fsClock: fs });
    await withLocked(open, (s) => s.reserve('10.0.0.2', C1, 0));
    const m = dirStampNs(dir);
    assert.equal(ix.stats.lingers, 1);
    // The first rule ended here (wall clock ≥ M + one tick + 1 ms); the coarse clock can lag more.
    clock.advance(TICK + 2);
    assert.equal(ix.holdsAnyLock, true);
    assert.equal(await lockIsFree(dir), false);
    fs.v = m; // equal is not past: a change now could still get the stamp M
    clock.advance(TICK / 4);
    assert.equal(ix.holdsAnyLock, true);
    fs.v = m + 1n;
    clock.advance(TICK / 4);
    assert.equal(ix.holdsAnyLock, false);
    assert.equal(await lockIsFree(dir), true);
    assert.equal(ix.stats.cut, 0);
    const trusted = ix.stats.trusted;
    await withLocked(open, async (s) => assert.deepEqual((await s.list({ mtime: false })).map((r) => r.ip), ['10.0.0.2']));
    assert.equal(ix.stats.trusted, trusted + 1, 'a linger that ended on the probe leaves a trusted stamp');
  });

  it('a file system clock already past the stamp ends the hold at once, without a linger', async () => {
    const fs = new SetFsClock();
    fs.v = 1n << 62n;
    const { ix, open, dir } = fixture({ fsClock: fs });
    await withLocked(open, (s) => s.reserve('10.0.0.2', C1, 0));
    assert.equal(ix.stats.lingers, 0);
    assert.equal(ix.holdsAnyLock, false);
    assert.equal(await lockIsFree(dir), true);
    assert.equal(ix.stats.cut, 0);
    assert.equal(fs.probes, 1);
  });

  for (const [name, v] of [
    ['a probe that never passes (a stalled tick, whole-second stamps)', 0n],
    ['a probe that fails', null],
  ] as const) {
    it(`${name}: the linger ends at M + 2 ticks + 1 ms, the stamp suspect, and the next hold refreshes`, async () => {
      const fs = new SetFsClock();
      fs.v = v;
      const { ix, open, dir, clock } = fixture({ fsClock: fs, fullRebuildBelow: 0 });
      await withLocked(open, (s) => s.reserve('10.0.0.2', C1, 0));
      const capMs = Number(dirStampNs(dir) / 1_000_000n) + 2 * TICK + 1;
      clock.advance(capMs - clock.now() - 2);
      assert.equal(ix.holdsAnyLock, true, 'held until the cap');
      clock.advance(3);
      assert.equal(ix.holdsAnyLock, false, 'released at the cap');
      assert.equal(ix.stats.cut, 1);
      // Another writer's change in the same coarse tick would be invisible: the stamp is not trusted.
      const [trusted, refreshed] = [ix.stats.trusted, ix.stats.refreshed];
      await withLocked(open, async (s) => assert.deepEqual((await s.list({ mtime: false })).map((r) => r.ip), ['10.0.0.2']));
      assert.equal(ix.stats.trusted, trusted);
      assert.equal(ix.stats.refreshed, refreshed + 1);
    });
  }

  /** The file systems of the interop suite: ext4 under /var/tmp, tmpfs at /dev/shm (where present). */
  const realFileSystems = ['/var/tmp', '/dev/shm'].filter((b) => {
    try {
      return statSync(b).isDirectory();
    } catch {
      return false;
    }
  });

  for (const base of realFileSystems) {
    it(`realFsClock on ${base}: once it passed DIR's stamp, another writer's unlink always changes the stamp (500 rounds)`, () => {
      const root = mkdtempSync(join(base, 'ipwarden-fsclock-'));
      tempRoots.push(root);
      const lock = join(root, 'lock');
      closeSync(openSync(lock, 'wx', 0o750));
      const before = lstatSync(lock, { bigint: true });
      // Victims: files nobody stats (their coarse ctime is what tmpfs gives DIR on unlink).
      for (let i = 0; i < 500; i++) writeFileSync(join(root, `v${i}`), 'x');
      let probes = 0;
      const missed: number[] = [];
      for (let i = 0; i < 500; i++) {
        // "Our" last change, as an ADD ends: last_reserved_ip's temporary renamed into place.
        writeFileSync(join(root, 't'), String(i));
        renameSync(join(root, 't'), join(root, 'last'));
        const m = dirStampNs(root);
        // A condition, not a time: probe until the file system's clock has passed M.
        for (;;) {
          probes++;
          const v = realFsClock.stampNow(lock);
          assert.notEqual(v, null);
          if ((v as bigint) > m) break;
        }
        unlinkSync(join(root, `v${i}`));
        if (dirStampNs(root) === m) missed.push(i);
      }
      assert.deepEqual(missed, []);
      assert.ok(probes >= 500);
      // The probe changes nothing but the lock's ctime: same inode, mode, size, mtime, content.
      const now = lstatSync(lock, { bigint: true });
      assert.deepEqual([now.ino, now.mode & 0o7777n, now.size, now.mtimeNs], [before.ino, 0o750n, 0n, before.mtimeNs]);
      assert.ok(now.ctimeNs > before.ctimeNs);
      assert.equal(readFileSync(lock, 'latin1'), '');
    });
  }

  it('realFsClock says null for a missing lock and a lock that is a symlink, and changes neither', () => {
    const root = tempDataDir();
    assert.equal(realFsClock.stampNow(join(root, 'lock')), null);
    const target = join(root, 'elsewhere');
    writeFileSync(target, '', { mode: 0o640 });
    symlinkSync(target, join(root, 'lock'));
    const before = lstatSync(target, { bigint: true }).ctimeNs;
    assert.equal(realFsClock.stampNow(join(root, 'lock')), null);
    assert.equal(lstatSync(target, { bigint: true }).ctimeNs, before);
    assert.equal(lstatSync(target).mode & 0o7777, 0o640);
  });
});

describe('NetworkIndexes.forget (the warm-up network, src/daemon/warm-up.ts)', () => {
  it('refuses while a request holds the lock, releases a lingering lock, drops the index, and a later open rebuilds from the directory', async () => {
    const { ix, open, dir, dataDir } = fixture();
    assert.equal(ix.forget(dataDir, 'net1'), true, 'a network never opened: nothing to forget');
    const s = await open();
    await s.lock(1);
    await s.reserve('10.0.0.2', C1, 0);
    assert.equal(ix.forget(dataDir, 'net1'), false, 'held by a request');
    assert.notEqual(ix.peek(dataDir, 'net1'), null);
    await s.close();
    // Closed, the store lingers on the lock (the linger rule): forget releases it.
    assert.equal(await lockIsFree(dir), false, 'lingering');
    assert.equal(ix.forget(dataDir, 'net1'), true);
    assert.equal(await lockIsFree(dir), true);
    assert.equal(ix.peek(dataDir, 'net1'), null);
    // A foreign change meanwhile is seen: the next open starts from the directory.
    unlinkSync(join(dir, '10.0.0.2'));
    writeFileSync(join(dir, '10.0.0.7'), 'c7\r\neth0', { mode: 0o600 });
    await withLocked(open, async (x) => assert.deepEqual((await x.list({ mtime: false })).map((r) => r.ip), ['10.0.0.7']));
  });
});
