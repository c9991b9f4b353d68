/**
 * `EtcdStore`: the {@link Store} contract on a {@link KV} (etcd v3 in production, `MemoryKV` in
 * unit tests), for a network whose reservations live in etcd rather than in a node's data dir.
 * Keys (docs/cluster.md "Network stores"), under the backend's prefix `P` (default `/ipwarden`):
 *
 * - `P/networks/<network>` → `{"v":1,"created":<ms>}` — the network exists (listed by the backend);
 * - `P/networks/<network>/ips/<ip>` → `{"v":1,"id":"<containerID>","ifname":"<ifname>"|null,
 *   "node":"<node>"?,"at":<ms>}`, `<ip>` canonical text; an empty value is a corrupt record (the
 *   contract's `owner: null`; etcd puts are atomic, so it is no write in flight) — any other value
 *   that is not this JSON makes `list` throw `AppError('STORE_CORRUPT')` naming the key: never read
 *   as free, never released by a guess;
 * - `P/networks/<network>/last/<rangeSetIndex>` → `{"v":1,"ip":"<ip>"}` (host-local's
 *   `last_reserved_ip.<N>`);
 * - `P/networks/<network>/recovery` → `{"v":1}` while a recovery is pending.
 *
 * Concurrency: `lock()` is only this object's own flag (the contract's call order); it excludes
 * nobody else. What makes concurrent writers on many nodes safe is that every write is one
 * transaction guarded by the revisions it was decided on: a reserve succeeds only if the address
 * key is absent (`create_revision == 0`), a release/rewrite/touch only if the key's `mod_revision`
 * is the one read (a changed key is re-read and re-decided, at most {@link MAX_CAS_ATTEMPTS}
 * times, then `AppError('STORE_CONFLICT')`, CNI 11). No etcd lock and no lease is involved.
 */
import { AppError, ClosedError } from '../../common/errors.ts';
import { formatIP, parseIP } from '../../common/ip.ts';
import { CNI_NAME_RE } from '../../common/names.ts';
import type { KV, KVEntry } from '../kv.ts';
import { sameOwner, type Owner, type Reservation, type Store, type StoreBackend } from '../store.ts';

/** Default key prefix of ipwarden's data in etcd. */
export const DEFAULT_ETCD_PREFIX = '/ipwarden';
/** Version of the JSON values written (the `v` field). */
export const VALUE_VERSION = 1;
/** Attempts of one compare-and-swap write before `STORE_CONFLICT`. */
export const MAX_CAS_ATTEMPTS = 16;

/** Options of {@link EtcdStore}. */
export interface EtcdStoreOptions {
  readonly kv: KV;
  readonly network: string;
  /** Key prefix (default {@link DEFAULT_ETCD_PREFIX}); no trailing `/`. */
  readonly prefix?: string;
  /** This node's name, recorded as the owner's `node` of every reservation written. */
  readonly node?: string;
  /** Clock, milliseconds since the epoch (default `Date.now`). */
  readonly now?: () => number;
  /** Close `kv` when the store is closed (default false: the backend owns it). */
  readonly ownsKV?: boolean;
}

/** A reservation value's owner fields, decoded; throws STORE_CORRUPT for anything unexpected. */
function decodeRecord(e: KVEntry): { owner: Owner | null; at: number } {
  if (e.value === '') return { owner: null, at: NaN };
  let o: unknown;
  try {
    o = JSON.parse(e.value);
  } catch {
    throw corrupt(e.key, 'not valid JSON');
  }
  if (typeof o !== 'object' || o === null || Array.isArray(o)) throw corrupt(e.key, 'not a JSON object');
  const r = o as Record<string, unknown>;
  if (r['v'] !== VALUE_VERSION) throw corrupt(e.key, `unknown value version ${JSON.stringify(r['v'])} (this ipwarden writes ${VALUE_VERSION})`);
  const id = r['id'];
  const ifname = r['ifname'];
  const node = r['node'];
  const at = r['at'];
  if (typeof id !== 'string' || !CNI_NAME_RE.test(id)) throw corrupt(e.key, '"id" must be a valid container ID');
  if (ifname !== null && (typeof ifname !== 'string' || ifname === '')) throw corrupt(e.key, '"ifname" must be a non-empty string or null');
  if (node !== undefined && typeof node !== 'string') throw corrupt(e.key, '"node" must be a string');
  if (typeof at !== 'number' || !Number.isFinite(at)) throw corrupt(e.key, '"at" must be a number (milliseconds since the epoch)');
  const owner: Owner = node === undefined ? { containerId: id, ifname } : { containerId: id, ifname, node };
  return { owner, at };
}

function corrupt(key: string, why: string): AppError {
  return new AppError('STORE_CORRUPT', `etcd key ${key}: ${why}`);
}

function canonical(ip: string): string {
  const p = parseIP(ip);
  if (p === null || formatIP(p) !== ip) throw new AppError('INTERNAL', `not a canonical IP: ${JSON.stringify(ip)}`);
  return ip;
}

/** {@link Store} on a {@link KV}. See the module comment. */
export class EtcdStore implements Store {
  readonly network: string;
  readonly #kv: KV;
  readonly #base: string;
  readonly #node: string | undefined;
  readonly #now: () => number;
  readonly #ownsKV: boolean;
  #locked = false;
  #closed = false;

  constructor(opts: EtcdStoreOptions) {
    if (!CNI_NAME_RE.test(opts.network)) throw new AppError('IPAM_INVALID_CONFIG', `invalid network name ${JSON.stringify(opts.network)}`);
    this.network = opts.network;
    this.#kv = opts.kv;
    this.#base = `${opts.prefix ?? DEFAULT_ETCD_PREFIX}/networks/${opts.network}`;
    this.#node = opts.node;
    this.#now = opts.now ?? Date.now;
    this.#ownsKV = opts.ownsKV ?? false;
  }

  /** The key of the network's marker (`P/networks/<network>`). */
  get markerKey(): string {
    return this.#base;
  }

  /** The key of `ip`'s reservation. */
  ipKey(ip: string): string {
    return `${this.#base}/ips/${ip}`;
  }

  #open(): void {
    if (this.#closed) throw new ClosedError(`etcd store ${JSON.stringify(this.network)}`);
  }

  #guard(): void {
    this.#open();
    if (!this.#locked) throw new AppError('INTERNAL', 'store method called without holding the lock');
  }

  #value(owner: { containerId: string; ifname: string | null }): string {
    const v: Record<string, unknown> = { v: VALUE_VERSION, id: owner.containerId.trim(), ifname: owner.ifname };
    if (this.#node !== undefined) v['node'] = this.#node;
    v['at'] = this.#now();
    return JSON.stringify(v);
  }

  /** Create the network's marker if absent (the backend's `open({create: true})`). */
  async ensureMarker(): Promise<void> {
    this.#open();
    await this.#kv.txn([{ key: this.#base, absent: true }], [{ put: this.#base, value: JSON.stringify({ v: VALUE_VERSION, created: this.#now() }) }]);
  }

  async lock(timeoutSeconds: number): Promise<void> {
    void timeoutSeconds;
    this.#open();
    this.#locked = true;
  }

  async unlock(): Promise<void> {
    this.#open();
    this.#locked = false;
  }

  async list(opts: { mtime?: boolean } = {}): Promise<Reservation[]> {
    this.#guard();
    const prefix = `${this.#base}/ips/`;
    const out: Reservation[] = [];
    for (const e of await this.#kv.list(prefix)) {
      const ip = e.key.slice(prefix.length);
      const p = parseIP(ip);
      if (p === null || formatIP(p) !== ip) throw corrupt(e.key, 'the key does not end in a canonical IP');
      const r = decodeRecord(e);
      out.push({ ip, owner: r.owner, mtimeMs: opts.mtime === false ? NaN : r.at, revision: e.modRevision });
    }
    return out;
  }

  async reserve(ip: string, owner: { containerId: string; ifname: string }, rangeSetIndex: number): Promise<boolean> {
    this.#guard();
    const key = this.ipKey(canonical(ip));
    const r = await this.#kv.txn(
      [{ key, absent: true }],
      [
        { put: key, value: this.#value(owner) },
        { put: `${this.#base}/last/${rangeSetIndex}`, value: JSON.stringify({ v: VALUE_VERSION, ip }) },
      ],
    );
    return r.succeeded;
  }

  async restore(ip: string, owner: { containerId: string; ifname: string }): Promise<boolean> {
    this.#guard();
    const key = this.ipKey(canonical(ip));
    return (await this.#kv.txn([{ key, absent: true }], [{ put: key, value: this.#value(owner) }])).succeeded;
  }

  /**
   * Compare-and-swap on `ip`'s key: read it, let `decide` choose (null = refuse), write the choice
   * guarded by the revision read; re-read on a lost race. Returns whether a write happened.
   */
  async #cas(ip: string, decide: (owner: Owner | null) => 'delete' | { containerId: string; ifname: string | null } | null): Promise<boolean> {
    this.#guard();
    const key = this.ipKey(canonical(ip));
    for (let i = 0; i < MAX_CAS_ATTEMPTS; i++) {
      const e = await this.#kv.get(key);
      if (e === null) return false;
      const choice = decide(decodeRecord(e).owner);
      if (choice === null) return false;
      const op = choice === 'delete' ? { delete: key } : { put: key, value: this.#value(choice) };
      if ((await this.#kv.txn([{ key, modRevision: e.modRevision }], [op])).succeeded) return true;
    }
    throw new AppError('STORE_CONFLICT', `etcd store ${this.network}: ${MAX_CAS_ATTEMPTS} writes of ${ip} lost to concurrent writers; try again`);
  }

  async rewrite(ip: string, expected: Owner, owner: { containerId: string; ifname: string }): Promise<boolean> {
    return this.#cas(ip, (cur) => (sameOwner(strip(cur), strip(expected)) ? owner : null));
  }

  async lastReservedIP(rangeSetIndex: number): Promise<string | null> {
    this.#guard();
    const e = await this.#kv.get(`${this.#base}/last/${rangeSetIndex}`);
    if (e === null) return null;
    // An unreadable value only loses round robin once, as in host-local (Store contract).
    try {
      const o = JSON.parse(e.value) as { ip?: unknown };
      const p = typeof o.ip === 'string' ? parseIP(o.ip) : null;
      return p === null ? null : formatIP(p);
    } catch {
      return null;
    }
  }

  async release(ip: string, expected: Owner | null): Promise<boolean> {
    return this.#cas(ip, (cur) => (sameOwner(strip(cur), strip(expected)) ? 'delete' : null));
  }

  async touch(ip: string, expected: Owner | null): Promise<boolean> {
    return this.#cas(ip, (cur) => (sameOwner(strip(cur), strip(expected)) ? (cur === null ? null : { containerId: cur.containerId, ifname: cur.ifname }) : null));
  }

  async recoveryPending(): Promise<boolean> {
    this.#open();
    return (await this.#kv.get(`${this.#base}/recovery`)) !== null;
  }

  async markRecovery(pending: boolean): Promise<void> {
    this.#guard();
    const key = `${this.#base}/recovery`;
    await this.#kv.txn([], [pending ? { put: key, value: JSON.stringify({ v: VALUE_VERSION }) } : { delete: key }]);
  }

  async releaseByOwner(containerId: string, ifname: string): Promise<string[]> {
    this.#guard();
    const id = containerId.trim();
    for (let i = 0; i < MAX_CAS_ATTEMPTS; i++) {
      const all = await this.list({ mtime: false });
      const pick = (legacy: boolean): Reservation[] =>
        all.filter((r) => r.owner !== null && r.owner.containerId === id && r.owner.ifname === (legacy ? null : ifname));
      let mine = pick(false);
      if (mine.length === 0) mine = pick(true);
      if (mine.length === 0) return [];
      // All of them or none, each guarded by the revision it was picked at.
      const r = await this.#kv.txn(
        mine.map((m) => ({ key: this.ipKey(m.ip), modRevision: m.revision as string })),
        mine.map((m) => ({ delete: this.ipKey(m.ip) })),
      );
      if (r.succeeded) return mine.map((m) => m.ip).sort();
    }
    throw new AppError('STORE_CONFLICT', `etcd store ${this.network}: ${MAX_CAS_ATTEMPTS} releases of ${id}/${ifname} lost to concurrent writers; try again`);
  }

  async writable(): Promise<boolean> {
    this.#open();
    try {
      await this.#kv.get(this.#base);
      return true;
    } catch (e) {
      if (e instanceof ClosedError) throw e;
      return false;
    }
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#locked = false;
    this.#closed = true;
    if (this.#ownsKV) await this.#kv.close();
  }
}

/** The owner without `node` (owners compare by container ID and ifname only). */
function strip(o: Owner | null): Owner | null {
  return o === null ? null : { containerId: o.containerId, ifname: o.ifname };
}

/** Options of {@link EtcdBackend}. */
export interface EtcdBackendOptions {
  readonly kv: KV;
  readonly prefix?: string;
  readonly node?: string;
  readonly now?: () => number;
}

/** {@link StoreBackend} on a {@link KV}: the networks are the markers `P/networks/<name>`. Owns `kv`. */
export class EtcdBackend implements StoreBackend {
  readonly description: string;
  readonly #opts: EtcdBackendOptions;
  #closed = false;

  constructor(opts: EtcdBackendOptions) {
    this.#opts = opts;
    this.description = `${opts.kv.description} prefix ${opts.prefix ?? DEFAULT_ETCD_PREFIX}`;
  }

  #open(): void {
    if (this.#closed) throw new ClosedError(`etcd backend (${this.description})`);
  }

  async listNetworks(): Promise<string[]> {
    this.#open();
    const prefix = `${this.#opts.prefix ?? DEFAULT_ETCD_PREFIX}/networks/`;
    const names = new Set<string>();
    for (const e of await this.#opts.kv.list(prefix, { keysOnly: true })) {
      const rest = e.key.slice(prefix.length);
      if (!rest.includes('/') && CNI_NAME_RE.test(rest)) names.add(rest);
    }
    return [...names].sort();
  }

  async open(network: string, opts: { create: boolean }): Promise<Store | null> {
    this.#open();
    const store = new EtcdStore({ network, kv: this.#opts.kv, ...pick(this.#opts) });
    if (opts.create) await store.ensureMarker();
    else if ((await this.#opts.kv.get(store.markerKey)) === null) return null;
    return store;
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    await this.#opts.kv.close();
  }
}

function pick(o: EtcdBackendOptions): { prefix?: string; node?: string; now?: () => number } {
  return {
    ...(o.prefix === undefined ? {} : { prefix: o.prefix }),
    ...(o.node === undefined ? {} : { node: o.node }),
    ...(o.now === undefined ? {} : { now: o.now }),
  };
}
