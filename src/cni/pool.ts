/**
 * The plugin's way into a cluster pool (issue 11; docs/cluster.md): for a network whose `ipam`
 * has `pool`, ADD/DEL/CHECK go to etcd through the pool allocator (src/ipam/pool-allocator.ts)
 * instead of the node's files. The edge work happens here: the node name is resolved
 * (`ipam.nodeName`, else `NODE_NAME` — a DaemonSet's downward API `spec.nodeName` — else the host
 * name), the TLS files are read, and the etcd client is made and closed.
 *
 * The standalone plugin makes one client per request (one process per request) and sends one
 * transaction per ADD. The daemon passes a {@link PoolSessions} that keeps one client per pool and
 * batches the concurrent ADDs of the node into one transaction (`src/daemon/`).
 *
 * Loaded through the cold part (src/cold.ts) so a node-local network's exec never parses etcd3.
 */
import { readFileSync } from 'node:fs';
import { hostname } from 'node:os';
import { AppError, ClosedError, errnoCode } from '../common/errors.ts';
import { MAX_BATCH, metaOf, PoolAllocator, type PoolAllocation, type PoolRequest } from '../ipam/pool-allocator.ts';
import { badNodeNameMessage, validNodeName, type PoolConfig } from '../ipam/pool-config.ts';
import type { IPAMConfig, NetworkIdentity } from '../ipam/types.ts';
import type { KV } from '../store/kv.ts';
import { EtcdKV } from '../store/etcd/etcd-kv.ts';

/** The pool operations the command handlers call (src/cni/commands.ts). */
export interface PoolHooks {
  /** ADD: the container's addresses, one per range set (existing ones on a repeated ADD). Throws AppErrors. */
  add(conf: IPAMConfig, req: PoolRequest): Promise<PoolAllocation[]>;
  /** DEL: release by owner; idempotent. Returns the released addresses. */
  del(id: NetworkIdentity, req: PoolRequest): Promise<string[]>;
  /** CHECK: the container's allocations, or null when it has none. */
  find(conf: IPAMConfig, req: PoolRequest): Promise<PoolAllocation[] | null>;
}

/**
 * The node name for `pool`: `ipam.nodeName`, else `env.NODE_NAME`, else `host()`.
 * @throws AppError IPAM_INVALID_CONFIG (CNI 7) naming the source when the name is unusable.
 */
export function resolveNodeName(pool: PoolConfig, env: Readonly<Record<string, string | undefined>>, host: () => string = hostname): string {
  if (pool.nodeName !== null) return pool.nodeName;
  const fromEnv = env['NODE_NAME'];
  if (fromEnv !== undefined && fromEnv !== '') {
    if (!validNodeName(fromEnv)) throw new AppError('IPAM_INVALID_CONFIG', badNodeNameMessage('NODE_NAME', fromEnv));
    return fromEnv;
  }
  const h = host();
  if (!validNodeName(h)) throw new AppError('IPAM_INVALID_CONFIG', badNodeNameMessage('the host name', h));
  return h;
}

/** Read one TLS file; `IPAM_IO` (CNI 5) naming the key and the path when it cannot be read. */
function readPem(key: string, path: string): Buffer {
  try {
    return readFileSync(path);
  } catch (e) {
    const why = errnoCode(e) === 'ENOENT' ? 'no such file or directory' : e instanceof Error ? e.message : String(e);
    throw new AppError('IPAM_IO', `ipam.pool.etcd.tls.${key}: open ${path}: ${why}`);
  }
}

/** A new etcd client for `pool` (TLS files read now). The caller closes it. */
export function etcdFor(pool: PoolConfig): EtcdKV {
  const t = pool.etcd.tls;
  return new EtcdKV({
    endpoints: pool.etcd.endpoints,
    tls:
      t === null
        ? undefined
        : {
            ca: readPem('ca', t.ca),
            ...(t.cert === null ? {} : { cert: readPem('cert', t.cert) }),
            ...(t.key === null ? {} : { key: readPem('key', t.key) }),
          },
  });
}

/** Where the hooks get a KV for a pool and give it back. */
export interface KVSource {
  acquire(pool: PoolConfig): Promise<KV>;
  release(pool: PoolConfig, kv: KV): Promise<void>;
}

/** One client per request, closed after it (the standalone plugin). */
export const PER_REQUEST: KVSource = {
  acquire: async (pool) => etcdFor(pool),
  release: async (_pool, kv) => kv.close(),
};

function allocatorFor(kv: KV, pool: PoolConfig, node: string, network: string, rangeSets: IPAMConfig['rangeSets']): PoolAllocator {
  return new PoolAllocator({ kv, pool: pool.name, prefix: pool.etcd.prefix, node, network, rangeSets, sizes: { blockSize4: pool.blockSize4, blockSize6: pool.blockSize6 } });
}

/**
 * The standalone plugin's hooks over `source` (default: a client per request, one transaction per
 * ADD), resolving the node name from `env` (the request's environment).
 */
export function poolHooks(env: Readonly<Record<string, string | undefined>>, source: KVSource = PER_REQUEST): PoolHooks {
  async function withKV<T>(pool: PoolConfig, f: (kv: KV) => Promise<T>): Promise<T> {
    const kv = await source.acquire(pool);
    try {
      return await f(kv);
    } finally {
      await source.release(pool, kv);
    }
  }
  return {
    add: (conf, req) => {
      const pool = conf.pool as PoolConfig;
      const node = resolveNodeName(pool, env);
      return withKV(pool, async (kv) => {
        const [r] = await allocatorFor(kv, pool, node, conf.name, conf.rangeSets).add([req]);
        if (r instanceof AppError) throw r;
        return r as PoolAllocation[];
      });
    },
    del: (id, req) => {
      const pool = id.pool as PoolConfig;
      const node = resolveNodeName(pool, env);
      return withKV(pool, (kv) => allocatorFor(kv, pool, node, id.name, []).del(req));
    },
    find: (conf, req) => {
      const pool = conf.pool as PoolConfig;
      const node = resolveNodeName(pool, env);
      return withKV(pool, (kv) => allocatorFor(kv, pool, node, conf.name, conf.rangeSets).find(req));
    },
  };
}

interface Waiter {
  readonly req: PoolRequest;
  readonly resolve: (r: PoolAllocation[]) => void;
  readonly reject: (e: unknown) => void;
}

/**
 * The ADDs of one node for one network config, batched: the first ADD is sent at once; ADDs that
 * arrive while a transaction is in flight wait and go together in the next one (at most
 * `MAX_BATCH`), so under load a node sends one transaction for many pods (the batching Calico
 * proposed, projectcalico/cni-plugin#985) and when idle it adds no delay. A batch that fails as a
 * whole (a corrupt handle of one request, a conflict) is retried one request at a time, so one bad
 * request fails only itself.
 */
class Batcher {
  readonly #alloc: PoolAllocator;
  readonly #queue: Waiter[] = [];
  #running = false;
  /** Transactions' batch sizes so far (tests and metrics). */
  readonly sizes: number[] = [];

  constructor(alloc: PoolAllocator) {
    this.#alloc = alloc;
  }

  submit(req: PoolRequest): Promise<PoolAllocation[]> {
    return new Promise((resolve, reject) => {
      this.#queue.push({ req, resolve, reject });
      if (!this.#running) void this.#drain();
    });
  }

  async #drain(): Promise<void> {
    this.#running = true;
    try {
      while (this.#queue.length > 0) {
        const batch = this.#queue.splice(0, MAX_BATCH_REQUESTS);
        this.sizes.push(batch.length);
        try {
          settle(batch, await this.#alloc.add(batch.map((w) => w.req)));
        } catch (e) {
          if (batch.length === 1) {
            (batch[0] as Waiter).reject(e);
            continue;
          }
          for (const w of batch) {
            try {
              settle([w], await this.#alloc.add([w.req]));
            } catch (e1) {
              w.reject(e1);
            }
          }
        }
      }
    } finally {
      this.#running = false;
    }
  }
}

function settle(batch: readonly Waiter[], results: ReadonlyArray<PoolAllocation[] | AppError>): void {
  batch.forEach((w, i) => {
    const r = results[i];
    if (r instanceof AppError || r === undefined) w.reject(r ?? new AppError('INTERNAL', 'no answer for a batched request'));
    else w.resolve(r);
  });
}

/** Requests per batch (the allocator's limit). */
const MAX_BATCH_REQUESTS = MAX_BATCH;

/**
 * The daemon's pool hooks: one etcd client per pool (endpoints + prefix), kept until `close()`,
 * and the node's concurrent ADDs of one network batched into one transaction ({@link Batcher}).
 * The node name comes from the daemon's own environment (`NODE_NAME` of the DaemonSet), not the
 * request's: the daemon is the node. Lifecycle: `close()` is idempotent; later calls throw
 * `ClosedError`.
 */
export class PoolSessions implements PoolHooks {
  readonly #env: Readonly<Record<string, string | undefined>>;
  readonly #make: (pool: PoolConfig) => KV;
  readonly #kvs = new Map<string, KV>();
  readonly #batchers = new Map<string, Batcher>();
  #closed = false;

  constructor(env: Readonly<Record<string, string | undefined>>, make: (pool: PoolConfig) => KV = etcdFor) {
    this.#env = env;
    this.#make = make;
  }

  #kv(pool: PoolConfig): KV {
    if (this.#closed) throw new ClosedError('pool sessions');
    const key = JSON.stringify([pool.etcd.endpoints, pool.etcd.prefix, pool.etcd.tls]);
    let kv = this.#kvs.get(key);
    if (kv === undefined) {
      kv = this.#make(pool);
      this.#kvs.set(key, kv);
    }
    return kv;
  }

  /** Batch sizes of every transaction sent for ADDs so far, per network config (tests). */
  get batchSizes(): number[][] {
    return [...this.#batchers.values()].map((b) => [...b.sizes]);
  }

  async add(conf: IPAMConfig, req: PoolRequest): Promise<PoolAllocation[]> {
    const pool = conf.pool as PoolConfig;
    const node = resolveNodeName(pool, this.#env);
    const kv = this.#kv(pool);
    const key = JSON.stringify([pool.etcd.endpoints, pool.etcd.prefix, pool.name, pool.blockSize4, pool.blockSize6, node, conf.name, metaOf(conf.rangeSets, { blockSize4: pool.blockSize4, blockSize6: pool.blockSize6 })]);
    let b = this.#batchers.get(key);
    if (b === undefined) {
      b = new Batcher(allocatorFor(kv, pool, node, conf.name, conf.rangeSets));
      this.#batchers.set(key, b);
    }
    return b.submit(req);
  }

  async del(id: NetworkIdentity, req: PoolRequest): Promise<string[]> {
    const pool = id.pool as PoolConfig;
    return allocatorFor(this.#kv(pool), pool, resolveNodeName(pool, this.#env), id.name, []).del(req);
  }

  async find(conf: IPAMConfig, req: PoolRequest): Promise<PoolAllocation[] | null> {
    const pool = conf.pool as PoolConfig;
    return allocatorFor(this.#kv(pool), pool, resolveNodeName(pool, this.#env), conf.name, conf.rangeSets).find(req);
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    for (const kv of this.#kvs.values()) await kv.close();
    this.#kvs.clear();
  }
}
