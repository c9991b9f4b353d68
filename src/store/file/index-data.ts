/**
 * The in-memory index of one network directory (pure data, no I/O): what the daemon's indexed file
 * store (`indexed-store.ts`) knows about the IP-named entries of `DIR = <dataDir>/<network>`.
 *
 * It holds, for every IP-named entry of DIR, either
 * - a **record**: a regular file as `FileStore` reads it (`trimmed` = its Go-trimmed content, or
 *   null when not decodable; `owner` = `parseTrimmedRecord(trimmed)`, null = corrupt), exactly the
 *   entries `FileStore.list()` returns; or
 * - an **unusable** entry: an IP-named entry `FileStore` skips (a directory, FIFO, socket, device,
 *   dangling symlink or symlink loop). Its name is still taken (`link(2)` fails with EEXIST), so
 *   the allocator's fast path skips it; `list()` does not return it (as `FileStore.list()` does not).
 *
 * Lookups are O(1) or O(log n): by IP text, by exact trimmed content (DEL: host-local
 * `ReleaseByID` compares contents), and per address family a sorted array of the taken addresses
 * (records and unusable entries) plus one of the unusable ones, for counting the taken addresses of
 * a range and finding the next free address after a run of taken ones by binary search
 * ({@link IndexData.nextFree}), so round robin on a /16 never walks 65,534 entries.
 *
 * Memory: about 250–300 bytes per record (measured ≈ 20 MB for a /16 in the prototype of
 * `../shared/reference/fast-path-measurements.md` §3 with a similar layout).
 */
import { parseIP } from '../../common/ip.ts';
import { ownerMatches, type Owner, type Reservation, type ReservationIndex } from '../store.ts';

/** A sorted set of bigint keys in a plain array (binary search; O(n) memmove per insert/delete). */
export class SortedKeys {
  readonly #a: bigint[] = [];

  /** Number of keys. */
  get size(): number {
    return this.#a.length;
  }

  /** Index of the first key ≥ `v` (= size when none). */
  lowerBound(v: bigint): number {
    const a = this.#a;
    let lo = 0;
    let hi = a.length;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if ((a[mid] as bigint) < v) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  }

  /** True when `v` is in the set. */
  has(v: bigint): boolean {
    const i = this.lowerBound(v);
    return i < this.#a.length && this.#a[i] === v;
  }

  /** Add `v`; false when it was already there. */
  add(v: bigint): boolean {
    const i = this.lowerBound(v);
    if (i < this.#a.length && this.#a[i] === v) return false;
    if (i === this.#a.length) this.#a.push(v);
    else this.#a.splice(i, 0, v);
    return true;
  }

  /** Remove `v`; false when it was not there. */
  delete(v: bigint): boolean {
    const i = this.lowerBound(v);
    if (i >= this.#a.length || this.#a[i] !== v) return false;
    if (i === this.#a.length - 1) this.#a.pop();
    else this.#a.splice(i, 1);
    return true;
  }

  /** Replace the content with `values` (any order, duplicates dropped): one sort instead of n inserts. */
  reset(values: readonly bigint[]): void {
    const sorted = [...values].sort((x, y) => (x < y ? -1 : x > y ? 1 : 0));
    this.#a.length = 0;
    for (const v of sorted) if (this.#a.length === 0 || this.#a[this.#a.length - 1] !== v) this.#a.push(v);
  }

  /** Number of keys in `[lo, hi]` (inclusive; 0 when lo > hi). */
  countIn(lo: bigint, hi: bigint): number {
    if (lo > hi) return 0;
    return this.lowerBound(hi + 1n) - this.lowerBound(lo);
  }

  /**
   * The smallest value ≥ `from` that is not a key. O(log n): keys are distinct integers, so the
   * keys `a[j..j+m]` are consecutive exactly when `a[j+m] - a[j] === m`, a predicate that holds for
   * a prefix of m; the end of the run of taken values starting at `from` is found by binary search.
   */
  nextAbsent(from: bigint): bigint {
    const a = this.#a;
    const j = this.lowerBound(from);
    if (j >= a.length || a[j] !== from) return from;
    let lo = j; // a[lo] - from === lo - j holds
    let hi = a.length - 1;
    while (lo < hi) {
      const mid = (lo + hi + 1) >>> 1;
      if ((a[mid] as bigint) - from === BigInt(mid - j)) lo = mid;
      else hi = mid - 1;
    }
    return (a[lo] as bigint) + 1n;
  }

  /** The keys in ascending order (a copy; tests). */
  values(): bigint[] {
    return [...this.#a];
  }
}

/** What one IP-named entry of DIR is, as read under the lock. */
export type EntryState =
  /** A regular file: its Go-trimmed content, or null when not decodable (corrupt). */
  | { readonly kind: 'record'; readonly trimmed: string | null; readonly owner: Owner | null }
  /** Present but not a record (see the module comment). */
  | { readonly kind: 'unusable' };

interface RecordEntry {
  readonly res: Reservation;
  readonly trimmed: string | null;
  /** Position of `res` in the list array (swap-remove). */
  pos: number;
}

const families = [4, 6] as const;

/**
 * The index of one network directory. Implements the allocator's {@link ReservationIndex}
 * capability; everything else is for the indexed store (insert/remove as it changes DIR).
 * Keys are canonical IP text (the file names); a name that is not canonical IP text is ignored.
 */
export class IndexData implements ReservationIndex {
  readonly #records = new Map<string, RecordEntry>();
  readonly #unusable = new Set<string>();
  /**
   * Trimmed content → the IP name holding it, or the names when several do (records whose content
   * is decodable). Usually one name per content: no per-record collection is allocated.
   */
  readonly #byContent = new Map<string, string | string[]>();
  /** The reservations, in no particular order: what `list()` copies. */
  readonly #list: Reservation[] = [];
  readonly #taken = { 4: new SortedKeys(), 6: new SortedKeys() };
  readonly #unusableKeys = { 4: new SortedKeys(), 6: new SortedKeys() };

  /** Number of records (what `list()` returns). */
  get recordCount(): number {
    return this.#list.length;
  }

  /** Number of IP-named entries (records and unusable ones). */
  get entryCount(): number {
    return this.#list.length + this.#unusable.size;
  }

  /** Every indexed IP name (records and unusable entries). */
  names(): IterableIterator<string> {
    const recs = this.#records.keys();
    const unusable = this.#unusable.values();
    return (function* () {
      yield* recs;
      yield* unusable;
    })();
  }

  /** The names of the unusable entries (re-checked on every refresh). */
  unusableNames(): string[] {
    return [...this.#unusable];
  }

  /** True when `name` is indexed (as a record or unusable). */
  hasName(name: string): boolean {
    return this.#records.has(name) || this.#unusable.has(name);
  }

  /** The indexed state of `name`, or null when the index has no entry of that name. */
  get(name: string): EntryState | null {
    const r = this.#records.get(name);
    if (r !== undefined) return { kind: 'record', trimmed: r.trimmed, owner: r.res.owner };
    return this.#unusable.has(name) ? { kind: 'unusable' } : null;
  }

  /** A copy of the reservations (mtimeMs NaN), in no particular order. */
  list(): Reservation[] {
    return this.#list.slice();
  }

  /**
   * Replace everything with `entries` (a full rebuild). Sorting once is much cheaper than 65,534
   * binary inserts.
   */
  reset(entries: ReadonlyArray<readonly [string, EntryState]>): void {
    this.#records.clear();
    this.#unusable.clear();
    this.#byContent.clear();
    this.#list.length = 0;
    const taken: Record<4 | 6, bigint[]> = { 4: [], 6: [] };
    const unusable: Record<4 | 6, bigint[]> = { 4: [], 6: [] };
    for (const [name, st] of entries) {
      const ip = parseIP(name);
      if (ip === null || this.hasName(name)) continue;
      taken[ip.family].push(ip.value);
      if (st.kind === 'unusable') {
        this.#unusable.add(name);
        unusable[ip.family].push(ip.value);
      } else {
        this.#addRecord(name, st.trimmed, st.owner);
      }
    }
    for (const f of families) {
      this.#taken[f].reset(taken[f]);
      this.#unusableKeys[f].reset(unusable[f]);
    }
  }

  /** Set the state of `name` (insert or replace). Ignored when `name` is not IP text. */
  set(name: string, st: EntryState): void {
    const ip = parseIP(name);
    if (ip === null) return;
    this.#removeName(name, ip.family, ip.value, false);
    this.#taken[ip.family].add(ip.value);
    if (st.kind === 'unusable') {
      this.#unusable.add(name);
      this.#unusableKeys[ip.family].add(ip.value);
    } else {
      this.#addRecord(name, st.trimmed, st.owner);
    }
  }

  /** Forget `name` (it is gone from DIR). No-op when absent. */
  delete(name: string): void {
    const ip = parseIP(name);
    if (ip === null) return;
    this.#removeName(name, ip.family, ip.value, true);
  }

  /** The IP names whose record content is exactly `trimmed` (a copy). */
  namesWithContent(trimmed: string): string[] {
    const s = this.#byContent.get(trimmed);
    return s === undefined ? [] : typeof s === 'string' ? [s] : [...s];
  }

  // ReservationIndex ------------------------------------------------------------------------------

  ownedBy(containerId: string, ifname: string): Reservation[] {
    // ownerMatches(owner, C, I) holds exactly for records whose trimmed content is `C\r\nI`,
    // `C\nI` (parseTrimmedRecord drops the `\r` before the first `\n`) or the legacy `C`.
    const id = containerId.trim();
    const out: Reservation[] = [];
    for (const key of [`${id}\r\n${ifname}`, `${id}\n${ifname}`, id]) {
      for (const n of this.namesWithContent(key)) {
        const r = this.#records.get(n);
        if (r !== undefined && ownerMatches(r.res.owner, containerId, ifname)) out.push(r.res);
      }
    }
    return out;
  }

  isTaken(family: 4 | 6, value: bigint): boolean {
    return this.#taken[family].has(value);
  }

  countTaken(family: 4 | 6, lo: bigint, hi: bigint): number {
    return this.#taken[family].countIn(lo, hi);
  }

  countReserved(family: 4 | 6, lo: bigint, hi: bigint): number {
    return this.#taken[family].countIn(lo, hi) - this.#unusableKeys[family].countIn(lo, hi);
  }

  nextFree(family: 4 | 6, from: bigint): bigint {
    return this.#taken[family].nextAbsent(from);
  }

  // -----------------------------------------------------------------------------------------------

  #addRecord(name: string, trimmed: string | null, owner: Owner | null): void {
    const res: Reservation = Object.freeze({ ip: name, owner: owner === null ? null : Object.freeze({ containerId: owner.containerId, ifname: owner.ifname }), mtimeMs: Number.NaN });
    this.#records.set(name, { res, trimmed, pos: this.#list.length });
    this.#list.push(res);
    if (trimmed !== null) {
      const s = this.#byContent.get(trimmed);
      if (s === undefined) this.#byContent.set(trimmed, name);
      else if (typeof s === 'string') this.#byContent.set(trimmed, [s, name]);
      else s.push(name);
    }
  }

  #removeName(name: string, family: 4 | 6, value: bigint, dropKey: boolean): void {
    const r = this.#records.get(name);
    if (r !== undefined) {
      this.#records.delete(name);
      const last = this.#list.pop() as Reservation;
      if (r.pos < this.#list.length) {
        this.#list[r.pos] = last;
        (this.#records.get(last.ip) as RecordEntry).pos = r.pos;
      }
      if (r.trimmed !== null) {
        const s = this.#byContent.get(r.trimmed);
        if (s === name) this.#byContent.delete(r.trimmed);
        else if (Array.isArray(s)) {
          const rest = s.filter((n) => n !== name);
          this.#byContent.set(r.trimmed, rest.length === 1 ? (rest[0] as string) : rest);
        }
      }
    } else if (this.#unusable.delete(name)) {
      this.#unusableKeys[family].delete(value);
    } else {
      return;
    }
    if (dropKey) this.#taken[family].delete(value);
  }
}
