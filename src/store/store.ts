/**
 * The reservation store interface (house style 1), the TypeScript counterpart of host-local's
 * `backend/store.go`. Implementations: `store/file` (host-local compatible, on disk),
 * `store/memory` (the fake for unit tests of pure logic). Each implementation is checked with
 * `satisfies Store` / `implements Store` and by the one contract suite in `test/unit/store-contract.ts`.
 *
 * A Store holds the reservations of **one network** (host-local: `DIR = <dataDir>/<name>`).
 * IPs cross this interface as canonical text (`10.0.0.2`, `fd00::2`): exactly the reservation's
 * file name on disk.
 *
 * Locking: every method except `lock`, `unlock` and `close` must be called while the caller holds
 * the lock (`lock()` resolved, `unlock()` not yet called). Implementations do not lock implicitly;
 * the command handlers own the lock for the whole of ADD, DEL, CHECK, GC and reclaim
 * (ARCHITECTURE.md "The on-disk contract").
 */

/**
 * Who holds a reservation. host-local writes `<containerID>\r\n<ifname>`; files from host-local
 * before v0.8.0 hold only `<containerID>`, read here as `ifname: null` (owned by that container on
 * any interface) (anchors §2.2).
 */
export interface Owner {
  readonly containerId: string;
  /** The interface name, or null for a legacy ID-only record. */
  readonly ifname: string | null;
  /**
   * The node that made the reservation, when the backend is shared by many nodes (etcd: the
   * writer's node name, `docs/cluster.md`). Absent for node-local stores (the file store: the
   * node is the host itself; host-local's format has no room for it). Not compared by
   * {@link sameOwner} or {@link ownerMatches}: a container ID is unique cluster-wide.
   */
  readonly node?: string;
}

/** One reservation as found in the store. */
export interface Reservation {
  /** Canonical text of the reserved IP (the file name). */
  readonly ip: string;
  /**
   * The owner, or null when the record is corrupt (empty, or content that is not
   * `<id>[\r\n<ifname>]` with a valid container ID). Corrupt records are garbage once seen under
   * the lock: nobody is writing them (every writer holds the same lock while writing).
   */
  readonly owner: Owner | null;
  /**
   * When the reservation was made or last refreshed (`rewrite`, `touch`), milliseconds since the
   * Unix epoch: the reservation time the reconciler's grace period runs from. The file store
   * reads it from the file's mtime (host-local has no other record of it); the etcd store from
   * the `at` field of the key's JSON value (written by the writer's clock); the memory store
   * from its injected clock. NaN when the caller asked for no times (`list({mtime: false})`).
   */
  readonly mtimeMs: number;
  /**
   * An opaque revision of this record for compare-and-swap: it changes on every write of the
   * record, and a write that names it succeeds only if the record is unchanged since
   * (etcd: the key's `mod_revision` in decimal; memory: a counter). Absent when the backend
   * serialises every writer under its lock and re-reads under it instead (the file store:
   * host-local's `flock` is the only guard the upstream binary honours).
   */
  readonly revision?: string;
}

/**
 * Does `owner` match a request for (containerId, ifname) by host-local's rules?
 * Exact match on both, or a legacy record (`ifname === null`) with the same container ID.
 * Container IDs compare after trimming surrounding whitespace, as host-local does.
 */
export function ownerMatches(owner: Owner | null, containerId: string, ifname: string): boolean {
  if (owner === null) return false;
  if (owner.containerId !== containerId.trim()) return false;
  return owner.ifname === null || owner.ifname === ifname;
}

/** Same owner, field by field (used to re-check an entry under the lock before releasing it). */
export function sameOwner(a: Owner | null, b: Owner | null): boolean {
  if (a === null || b === null) return a === b;
  return a.containerId === b.containerId && a.ifname === b.ifname;
}

/** Options of {@link Store.list}. */
export interface ListOptions {
  /**
   * Fill `mtimeMs` (default true). ADD and DEL pass false: they never look at ages, and skipping
   * the fstat(2) per record matters on a /16 (65,534 records). Without it `mtimeMs` is NaN.
   */
  readonly mtime?: boolean;
}

/**
 * Optional capability of a {@link Store} (see {@link Store.reservationIndex}): an exact in-memory
 * view of the network's IP-named entries, so the allocator finds the next free address, a full
 * range set and a container's reservations without listing every reservation (issue 9; the
 * daemon's indexed file store, `src/store/file/indexed-store.ts`). Valid only while the caller
 * holds the store's lock, and it reflects every change made through the store during that hold.
 * Addresses are (family, integer value) pairs as in `src/ipam/types.ts` `IP`.
 *
 * "Taken" = any IP-named entry: a reservation (corrupt ones included) or an entry that is no
 * readable record (a directory, socket, FIFO, dangling symlink: its name is taken, `link(2)`
 * fails). "Reserved" = the entries `list()` returns.
 */
export interface ReservationIndex {
  /**
   * The reservations whose owner matches (containerId, ifname) by {@link ownerMatches} (exact, or
   * a legacy ID-only record of containerId), in no particular order; `mtimeMs` is NaN.
   */
  ownedBy(containerId: string, ifname: string): Reservation[];
  /** True when the address `value` of `family` is taken. */
  isTaken(family: 4 | 6, value: bigint): boolean;
  /** Number of taken addresses of `family` in `[lo, hi]` (inclusive). */
  countTaken(family: 4 | 6, lo: bigint, hi: bigint): number;
  /** Number of reservations (entries `list()` returns) of `family` in `[lo, hi]` (inclusive). */
  countReserved(family: 4 | 6, lo: bigint, hi: bigint): number;
  /**
   * The smallest value ≥ `from` that is not taken (may lie beyond the family's last address or the
   * caller's range: the caller bounds it). O(log n) in the number of entries.
   */
  nextFree(family: 4 | 6, from: bigint): bigint;
}

/** The per-network reservation store. See the module comment for the locking rule. */
export interface Store {
  /** Network name (host-local: the config's top-level `name`). */
  readonly network: string;

  /**
   * Take the network's exclusive lock, waiting at most `timeoutSeconds` (seconds, may be
   * fractional). Throws `AppError('STORE_LOCK_TIMEOUT')` (CNI code 11) when it cannot be had in
   * time and `AppError('STORE_IO')` when the lock file cannot be opened. Never ignores a failure.
   */
  lock(timeoutSeconds: number): Promise<void>;

  /** Release the lock taken by `lock()`. Safe to call when not locked. */
  unlock(): Promise<void>;

  /**
   * Every reservation of the network, in no particular order, including corrupt ones
   * (`owner: null`). Entries whose name is not an IP (`lock`, `last_reserved_ip.N`, temporary
   * files, sub-directories) are not reservations and are not returned.
   */
  list(opts?: ListOptions): Promise<Reservation[]>;

  /**
   * Reserve `ip` for `owner` atomically and record it as the last reserved IP of range set
   * `rangeSetIndex` (host-local `last_reserved_ip.<N>`, rewritten on every successful reserve).
   * A record is never visible half-written. Returns false when `ip` is already reserved (by
   * anyone); throws `AppError('STORE_IO')` on I/O failure, leaving no record behind.
   */
  reserve(ip: string, owner: { containerId: string; ifname: string }, rangeSetIndex: number): Promise<boolean>;

  /**
   * Reserve `ip` for `owner` exactly like {@link reserve} (atomic; false when `ip` is already
   * reserved by anyone; `AppError('STORE_IO')` on I/O failure, leaving no record behind) but
   * without recording it as the last reserved IP of any range set: round robin is unchanged.
   * For re-creating the reservation of an address a running sandbox already uses (the
   * reconciler, field report BR-13), where moving `last_reserved_ip` would change which address
   * the next ADD gets.
   */
  restore(ip: string, owner: { containerId: string; ifname: string }): Promise<boolean>;

  /**
   * Replace the record of `ip` atomically with one for `owner` (and a fresh modification time)
   * only if its current owner is `expected` (compared with `sameOwner`). Returns false when the
   * record is absent or owned by someone else. Used by a repeated ADD: a legacy ID-only record is
   * claimed for this ifname (so a second interface of the container gets its own address and DEL
   * of one interface cannot free the other's), and the refreshed mtime restarts the grace period
   * of a container whose set-up is in flight again. Throws `AppError('STORE_IO')` on I/O failure,
   * leaving the old record in place.
   */
  rewrite(ip: string, expected: Owner, owner: { containerId: string; ifname: string }): Promise<boolean>;

  /**
   * The last IP reserved in range set `rangeSetIndex`, or null when unknown (no record, or an
   * unreadable one: that only loses round robin once, as in host-local).
   */
  lastReservedIP(rangeSetIndex: number): Promise<string | null>;

  /**
   * Remove the reservation of `ip` only if its current owner is `expected` (compared with
   * `sameOwner`; `expected === null` removes it only if it is corrupt). Returns true if removed,
   * false if it was absent or owned by someone else. Throws `AppError('STORE_IO')` on I/O failure.
   */
  release(ip: string, expected: Owner | null): Promise<boolean>;

  /**
   * Set the modification time of `ip`'s record to now, only if its current owner is `expected`
   * (`sameOwner`; null = only if corrupt). Returns false when absent or owned by someone else.
   * Used by the reconciler for a record stamped in the future after the clock was stepped back
   * (docs/reconciler.md "Time"): its grace period then runs from when it was first seen. Throws
   * `AppError('STORE_IO')` on I/O failure.
   */
  touch(ip: string, expected: Owner | null): Promise<boolean>;

  /**
   * True when a recovery of the network's reservations was begun and not finished (a killed
   * recovery is resumed by the next ADD, never mistaken for done: issue 7). Cheap: the plugin
   * asks on every ADD.
   */
  recoveryPending(): Promise<boolean>;

  /**
   * Mark a recovery begun (`true`: durable before it resolves, so a crash after it leaves the mark)
   * or finished (`false`: removes the mark). Throws `AppError('STORE_IO')` on I/O failure.
   */
  markRecovery(pending: boolean): Promise<void>;

  /**
   * Release by owner, never by IP (host-local `ReleaseByID`): remove every reservation owned by
   * exactly (containerId, ifname); when there is none, remove those of legacy records holding
   * only `containerId`. Returns the released IPs (possibly empty: DEL is idempotent).
   */
  releaseByOwner(containerId: string, ifname: string): Promise<string[]>;

  /**
   * True when a reservation could be written now (the network directory exists and is
   * writable). Used by STATUS, which calls it without holding the lock (the one exception to the
   * locking rule: it changes no reservation).
   */
  writable(): Promise<boolean>;

  /** Release the lock if held and free resources. Idempotent. Further use throws `ClosedError`. */
  close(): Promise<void>;

  /**
   * Optional fast path ({@link ReservationIndex}): the validated in-memory index of the network,
   * or null when this store has none usable now (the caller then lists, as without the method).
   * Called with the lock held; throws what `list()` would throw (`AppError('STORE_IO')` when DIR
   * cannot be read). Backends without an index leave it undefined: the allocator's default path is
   * then unchanged.
   */
  reservationIndex?(): ReservationIndex | null;
}
