/**
 * A node's heartbeat in a cluster pool (docs/cluster.md "Node removal"): the daemon's
 * {@link Heartbeat} keeps the node's `alive/<node>` key on a lease while it serves the pool
 * (src/daemon/pool-sessions.ts starts one per pool and node). Moved here from src/cni/pool.ts:
 * only the daemon heartbeats.
 */
import type { KV, Leases } from '../store/kv.ts';
import { heartbeatValue, type PoolSource } from '../pool/index.ts';

/** TTL of a node's heartbeat lease, seconds (renewed every third of it). */
export const HEARTBEAT_TTL_SECONDS = 30;
/** Period of the extra beats while beats fail, milliseconds. */
export const HEARTBEAT_RETRY_MS = 1000;

/** Schedules `fn` every `ms` milliseconds; returns the cancel function (injected in tests). */
export type Every = (fn: () => void, ms: number) => () => void;

/** The real schedule: `setInterval`, unref'd (a heartbeat never keeps the process up). */
export const realEvery: Every = (fn, ms) => {
  const t = setInterval(fn, ms);
  t.unref();
  return () => clearInterval(t);
};

/**
 * A node's heartbeat in a pool: the key `aliveKey(node)` put with a lease of
 * {@link HEARTBEAT_TTL_SECONDS}, renewed every third of it; when the lease is found expired (a
 * long pause, a partition) a new one is granted and the key put again. A heartbeat is only a hint
 * that the node may be alive (it is what `pool remove-node` refuses to override without
 * `--force`); no allocation ever reads it. Its failures never fail a request: they are counted.
 * While beats fail (etcd unreachable: a partition) it also beats every
 * {@link HEARTBEAT_RETRY_MS}, so a node whose partition heals puts its key back and vetoes a
 * removal begun meanwhile within about a second, not up to a full period later (review F2c).
 * Beats never overlap (a beat due while one runs is skipped).
 */
export class Heartbeat {
  readonly #kv: KV & Leases;
  readonly #key: string;
  readonly #value: string;
  readonly #every: Every;
  #lease: string | null = null;
  #cancel: (() => void) | null = null;
  #cancelRetry: (() => void) | null = null;
  #beating = false;
  #stopped = false;
  readonly #onBeat: (() => Promise<unknown>) | null;
  /** The node's settings key to create (create-only) before every put of the heartbeat key with a new lease. */
  readonly #settings: { readonly key: string; readonly value: string } | null;
  /** Renewals and grants that failed (etcd unreachable); the next beat tries again. */
  failures = 0;
  /** Beats whose `onBeat` (the node's veto) failed; the next beat tries again. */
  vetoFailures = 0;
  /** When the beats began to fail without a success since (ms, the `now` clock), or null while they work (or before the first). */
  failingSince: number | null = null;
  readonly #now: () => number;
  /** The beat in flight, if any ({@link stop} waits for it). */
  #inFlight: Promise<void> | null = null;

  /**
   * @param onBeat awaited after every beat, also a failed one (the daemon passes the node's
   *   {@link PoolAllocator.vetoIfMarked}, so a returning node vetoes a removal begun while it
   *   was away within one beat: review F2b). Its failures are counted in `vetoFailures`.
   * @param more `writer`: the daemon's host name and pid, put in the value
   *   (`{"v":1,"node","since","host","pid"}`) so `pool remove-node` can name the daemon that
   *   heartbeats for a node (trial finding 5); `settings`: a key and value created (create-only,
   *   never overwritten) before the heartbeat key is first put — the node's settings key, the
   *   durable record that a daemon has served the node (trial finding 1); `source`: where the
   *   daemon first knew the pool from ({@link PoolSource}), put in the value as `"source"`.
   */
  constructor(
    kv: KV & Leases,
    key: string,
    node: string,
    now: () => number = Date.now,
    every: Every = realEvery,
    onBeat: (() => Promise<unknown>) | null = null,
    more: { readonly writer?: { readonly host: string; readonly pid: number }; readonly settings?: { readonly key: string; readonly value: string }; readonly source?: PoolSource } = {},
  ) {
    this.#kv = kv;
    this.#now = now;
    this.#key = key;
    this.#value = heartbeatValue(node, now(), more.writer, more.source);
    this.#every = every;
    this.#onBeat = onBeat;
    this.#settings = more.settings ?? null;
  }

  /** Grant, put, and schedule the renewals. Never throws (a failure is retried by the next beat). */
  async start(): Promise<void> {
    if (this.#stopped || this.#cancel !== null) return;
    this.#cancel = this.#every(() => void this.beat(), (HEARTBEAT_TTL_SECONDS * 1000) / 3);
    await this.beat();
  }

  /** One beat: renew the lease, or (none yet, or expired) grant one and put the key with it. */
  async beat(): Promise<void> {
    if (this.#stopped || this.#beating) return;
    this.#beating = true;
    const run = (async (): Promise<void> => {
      const ok = await this.#beatOnce();
      if (ok) this.failingSince = null;
      else this.failingSince ??= this.#now();
      this.#retrying(!ok);
    })();
    this.#inFlight = run;
    try {
      await run;
    } finally {
      this.#beating = false;
      this.#inFlight = null;
    }
  }

  /** {@link stop} was called (the heartbeat may still be finishing its beat in flight). */
  get stopped(): boolean {
    return this.#stopped;
  }

  /** Beats have failed, with no success since, for at least `ms` milliseconds (the `now` clock). */
  failingFor(ms: number): boolean {
    return this.failingSince !== null && this.#now() - this.failingSince >= ms;
  }

  /** Start (`on`) or stop the fast retries while beats fail. */
  #retrying(on: boolean): void {
    if (on && this.#cancelRetry === null && !this.#stopped) this.#cancelRetry = this.#every(() => void this.beat(), HEARTBEAT_RETRY_MS);
    if (!on && this.#cancelRetry !== null) {
      this.#cancelRetry();
      this.#cancelRetry = null;
    }
  }

  /** Renew or grant, then `onBeat`; true when both worked. */
  async #beatOnce(): Promise<boolean> {
    let ok = true;
    try {
      if (this.#lease === null || (await this.#kv.keepAlive(this.#lease)) <= 0) {
        if (this.#settings !== null) {
          // Create-only: an existing value (a larger offlineSeconds) is never lowered. Again at
          // every new lease: a node removed while its lease had expired (a removal's --finish
          // deletes the settings key) is recorded as served again when it comes back.
          await this.#kv.txn([{ key: this.#settings.key, absent: true }], [{ put: this.#settings.key, value: this.#settings.value }]);
        }
        const id = await this.#kv.grantLease(HEARTBEAT_TTL_SECONDS);
        // Stopped meanwhile (a heartbeat moved to other settings): the key is not put again on a
        // lease nobody would renew, over the new heartbeat's (a hostile review).
        if (this.#stopped) {
          await this.#kv.revokeLease(id).catch(() => undefined);
          return false;
        }
        await this.#kv.txn([], [{ put: this.#key, value: this.#value, lease: id }]);
        this.#lease = id;
      }
    } catch {
      this.failures++;
      ok = false;
    }
    if (this.#onBeat === null || this.#stopped) return ok;
    try {
      await this.#onBeat();
    } catch {
      this.vetoFailures++;
      ok = false;
    }
    return ok;
  }

  /** Stop renewing, wait for a beat in flight, and revoke the lease (the key goes). Idempotent; best effort. */
  async stop(): Promise<void> {
    if (this.#stopped) return;
    this.#stopped = true;
    this.#cancel?.();
    this.#cancelRetry?.();
    this.#cancelRetry = null;
    await this.#inFlight?.catch(() => undefined);
    if (this.#lease !== null) await this.#kv.revokeLease(this.#lease).catch(() => undefined);
  }
}
