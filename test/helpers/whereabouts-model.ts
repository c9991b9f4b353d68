/**
 * The Whereabouts-model baseline allocator (issue 11's benchmark baseline and the harness's
 * stand-in allocator): the WHOLE pool in ONE key, every ADD and DEL a read-modify-write of that
 * key guarded by compare-and-swap on its revision, retried on conflict.
 *
 * What it models: Whereabouts keeps one `IPPool` object per range holding every allocation
 * (`spec.allocations`, keyed by offset) and updates it with the object's resourceVersion
 * (optimistic concurrency), retrying on conflict; it hands out the lowest free offset
 * (k8snetworkplumbingwg/whereabouts: pkg/storage/kubernetes/ipam.go `IPManagement`,
 * pkg/allocate/allocate.go `IterateForAssignment`). Simplifications, all in the baseline's
 * favour: no cluster-wide leader-election lease around the update, no per-IP
 * OverlappingRangeIPReservation write, no sleep between retries (a conflict re-reads at once).
 *
 * Allocation is keyed by container ID + ifname: a repeated ADD returns the held address; DEL of
 * an owner that holds nothing succeeds. Correctness rests on the CAS alone, so it is also a safe
 * allocator the history checker must pass under faults.
 *
 * Value layout (JSON): `{"allocations": {"<offset>": {"id": "<containerId>", "ifname": "<ifname>"}}}`.
 */
import { formatIP, ipAdd, parseCIDR, type IP } from '../../src/common/ip.ts';
import type { KV } from '../../src/store/kv.ts';

/** Options of {@link WhereaboutsModel}. */
export interface WhereaboutsModelOptions {
  /** The etcd key that holds the whole pool. */
  key: string;
  /** The IPv4 range, e.g. `10.85.0.0/16`: offsets 1 .. size−2 are handed out (network and broadcast skipped). */
  subnet: string;
  /** CAS attempts per operation before it fails (default 100, Whereabouts' `DatastoreRetries`). */
  maxAttempts?: number;
  /**
   * `lowest` (default): the lowest free offset, as Whereabouts. `roundRobin`: the first free
   * offset after the last one handed out (`next` in the value), as host-local — for fault runs
   * whose checker holds an address until its DEL's end, where lowest-free reuses a just-freed
   * address under a concurrent DEL (legitimate, but indistinguishable from a duplicate there).
   * The benchmark is indifferent: every operation rewrites the one key either way.
   */
  order?: 'lowest' | 'roundRobin';
}

interface PoolValue {
  allocations: Record<string, { id: string; ifname: string }>;
  /** roundRobin: the offset after the last one handed out. */
  next?: number;
}

/** What one ADD or DEL did. */
export interface ModelResult {
  /** The address (canonical text) allocated or released; null for a DEL that found nothing. */
  ip: string | null;
  /** CAS transactions sent (1 = no conflict). */
  attempts: number;
}

/** Thrown when the pool has no free address (`exhausted`) or the CAS kept failing (`conflict`). */
export class WhereaboutsModelError extends Error {
  readonly reason: 'exhausted' | 'conflict' | 'corrupt';
  constructor(reason: 'exhausted' | 'conflict' | 'corrupt', message: string) {
    super(message);
    this.name = 'WhereaboutsModelError';
    this.reason = reason;
  }
}

/** The baseline allocator over a {@link KV}. See the module comment. */
export class WhereaboutsModel {
  readonly #kv: KV;
  readonly #key: string;
  readonly #base: IP;
  readonly #size: number;
  readonly #maxAttempts: number;
  readonly #roundRobin: boolean;

  /** Throws TypeError on a subnet that is not an IPv4 CIDR with at least 4 addresses. */
  constructor(kv: KV, opts: WhereaboutsModelOptions) {
    const c = parseCIDR(opts.subnet);
    if (c === null || c.ip.family !== 4 || c.subnet.prefix > 30) throw new TypeError(`whereabouts model: not an IPv4 CIDR of ≥ 4 addresses: ${opts.subnet}`);
    this.#kv = kv;
    this.#key = opts.key;
    this.#base = c.subnet.ip;
    this.#size = 2 ** (32 - c.subnet.prefix);
    this.#maxAttempts = opts.maxAttempts ?? 100;
    this.#roundRobin = opts.order === 'roundRobin';
  }

  async #read(): Promise<{ value: PoolValue; rev: string | null }> {
    const e = await this.#kv.get(this.#key);
    if (e === null) return { value: { allocations: {} }, rev: null };
    let v: unknown;
    try {
      v = JSON.parse(e.value);
    } catch {
      throw new WhereaboutsModelError('corrupt', `whereabouts model: ${this.#key} is not JSON`);
    }
    const a = (v as { allocations?: unknown } | null)?.allocations;
    if (typeof a !== 'object' || a === null) throw new WhereaboutsModelError('corrupt', `whereabouts model: ${this.#key} has no allocations map`);
    return { value: v as PoolValue, rev: e.modRevision };
  }

  async #cas(rev: string | null, value: PoolValue): Promise<boolean> {
    const r = await this.#kv.txn([rev === null ? { key: this.#key, absent: true } : { key: this.#key, modRevision: rev }], [{ put: this.#key, value: JSON.stringify(value) }]);
    return r.succeeded;
  }

  #ip(offset: number): string {
    return formatIP(ipAdd(this.#base, BigInt(offset)));
  }

  /**
   * Allocate the lowest free address for `containerId`/`ifname` (or return the one it holds).
   * Throws WhereaboutsModelError (`exhausted`, `conflict` after maxAttempts, `corrupt`), or the
   * KV's errors (STORE_UNAVAILABLE …) unchanged.
   */
  async add(containerId: string, ifname: string): Promise<ModelResult> {
    for (let attempt = 1; attempt <= this.#maxAttempts; attempt++) {
      const { value, rev } = await this.#read();
      for (const [off, o] of Object.entries(value.allocations)) if (o.id === containerId && o.ifname === ifname) return { ip: this.#ip(Number(off)), attempts: attempt - 1 };
      let free = -1;
      const n = this.#size - 2; // offsets 1..n
      const from = this.#roundRobin && typeof value.next === 'number' && value.next >= 1 && value.next <= n ? value.next : 1;
      for (let k = 0; k < n; k++) {
        const off = ((from - 1 + k) % n) + 1;
        if (value.allocations[String(off)] === undefined) {
          free = off;
          break;
        }
      }
      if (free < 0) throw new WhereaboutsModelError('exhausted', `whereabouts model: no free address in ${formatIP(this.#base)}`);
      value.allocations[String(free)] = { id: containerId, ifname };
      if (this.#roundRobin) value.next = (free % n) + 1;
      if (await this.#cas(rev, value)) return { ip: this.#ip(free), attempts: attempt };
    }
    throw new WhereaboutsModelError('conflict', `whereabouts model: ${this.#maxAttempts} CAS attempts failed`);
  }

  /** Release what `containerId`/`ifname` holds. Errors as {@link add} (never `exhausted`). */
  async del(containerId: string, ifname: string): Promise<ModelResult> {
    for (let attempt = 1; attempt <= this.#maxAttempts; attempt++) {
      const { value, rev } = await this.#read();
      const hit = Object.entries(value.allocations).find(([, o]) => o.id === containerId && o.ifname === ifname);
      if (hit === undefined) return { ip: null, attempts: attempt - 1 };
      delete value.allocations[hit[0]];
      if (await this.#cas(rev, value)) return { ip: this.#ip(Number(hit[0])), attempts: attempt };
    }
    throw new WhereaboutsModelError('conflict', `whereabouts model: ${this.#maxAttempts} CAS attempts failed`);
  }

  /** Every allocation (one read), for the history checker's checkpoints. */
  async allocations(): Promise<{ ip: string; containerId: string; ifname: string }[]> {
    const { value } = await this.#read();
    return Object.entries(value.allocations).map(([off, o]) => ({ ip: this.#ip(Number(off)), containerId: o.id, ifname: o.ifname }));
  }
}

/**
 * One simulated node's allocator process: `node --import tsx test/helpers/whereabouts-model.ts`
 * with `WM_ENDPOINTS` (comma-separated etcd URLs: the node's proxies), `WM_KEY`, `WM_SUBNET`,
 * `NODE_NAME` and optionally `WM_ORDER` (`roundRobin`) and `WM_CALL_TIMEOUT_MS` (default 2000). Reads one JSON request per
 * stdin line, `{"id": N, "op": "ADD"|"DEL", "containerId": "...", "ifname": "..."}`, answers one
 * line per request, in completion order (first `{"id": -1, "ready": true}` once a first read of the
 * key answered): `{"id": N, "ok": true, "ip": "..."|null, "attempts": N}`
 * or `{"id": N, "ok": false, "code": 11|999, "msg": "..."}` (11: the store was unavailable or the
 * CAS kept conflicting, as the plugin's busy code). Requests run concurrently. Exits when stdin ends.
 */
async function serve(): Promise<void> {
  const { EtcdKV } = await import('../../src/store/etcd/etcd-kv.ts');
  const { AppError } = await import('../../src/common/errors.ts');
  const { createInterface } = await import('node:readline');
  const env = process.env;
  const endpoints = (env['WM_ENDPOINTS'] ?? '').split(',').filter((s) => s !== '');
  const kv = new EtcdKV({ endpoints, callTimeoutMs: Number(env['WM_CALL_TIMEOUT_MS'] ?? 2000) });
  const model = new WhereaboutsModel(kv, { key: env['WM_KEY'] ?? '/whereabouts-model/pool', subnet: env['WM_SUBNET'] ?? '', order: env['WM_ORDER'] === 'roundRobin' ? 'roundRobin' : 'lowest' });
  // Ready once a first read answered (bounded by the KV's call timeout, retried): the
  // connection is up and the modules are loaded before the run's clock starts.
  for (let i = 0; ; i++) {
    try {
      await kv.get(env['WM_KEY'] ?? '/whereabouts-model/pool');
      break;
    } catch (e) {
      if (i >= 30) throw e;
    }
  }
  process.stdout.write(`${JSON.stringify({ id: -1, ready: true })}\n`);
  const pending = new Set<Promise<void>>();
  const rl = createInterface({ input: process.stdin });
  for await (const line of rl) {
    if (line.trim() === '') continue;
    const req = JSON.parse(line) as { id: number; op: 'ADD' | 'DEL'; containerId: string; ifname: string };
    const p = (async () => {
      let reply: object;
      try {
        const r = req.op === 'ADD' ? await model.add(req.containerId, req.ifname) : await model.del(req.containerId, req.ifname);
        reply = { id: req.id, ok: true, ip: r.ip, attempts: r.attempts };
      } catch (e) {
        const busy = (e instanceof AppError && e.isRetryable) || (e instanceof WhereaboutsModelError && e.reason === 'conflict');
        reply = { id: req.id, ok: false, code: busy ? 11 : 999, msg: e instanceof Error ? e.message : String(e) };
      }
      process.stdout.write(`${JSON.stringify(reply)}\n`);
    })();
    pending.add(p);
    void p.finally(() => pending.delete(p));
  }
  await Promise.all(pending);
  await kv.close();
}

if (process.argv[1] !== undefined && import.meta.url === new URL(`file://${process.argv[1]}`).href) {
  serve().catch((e: unknown) => {
    process.stderr.write(`whereabouts model node: ${e instanceof Error ? e.stack : String(e)}\n`);
    process.exitCode = 1;
  });
}
