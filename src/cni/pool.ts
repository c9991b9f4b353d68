/**
 * The plugin's way into a cluster pool (issue 11; docs/cluster.md): for a network whose `ipam`
 * has `pool`, ADD/DEL/CHECK go to etcd through the cluster pool (its facade src/pool/index.ts)
 * instead of the node's files. The edge work happens here: the node name is resolved
 * (src/node/node-name.ts: `ipam.nodeName`, else `NODE_NAME` — a DaemonSet's downward API
 * `spec.nodeName` — else the node-name file `install-cni` wrote beside the plugin, else the host
 * name), and an etcd client is taken for the request (src/pool/session.ts) and given back.
 *
 * The standalone plugin makes one client per request (one process per request) and sends one
 * transaction per ADD. The daemon passes its `PoolSessions` (src/daemon/pool-sessions.ts), which
 * keeps one client per pool and batches the concurrent ADDs and DELs of the node into one
 * transaction; it implements the {@link PoolHooks} declared here.
 *
 * Loaded through the cold part (src/cold.ts) so a node-local network's exec never parses the etcd
 * client and its gRPC stack.
 */
import { writeSync } from 'node:fs';
import { AppError } from '../common/errors.ts';
import type { PoolConfig } from '../ipam/pool-config.ts';
import type { IPAMConfig, NetworkIdentity } from '../ipam/types.ts';
import type { KV } from '../store/kv.ts';
import { readKernelEvidenceAsync } from '../node/kernel-evidence.ts';
import { openDefaultAuditLog } from '../reconcile/audit.ts';
import { poolGC, type PoolGcOutcome } from '../reconcile/pool-pass.ts';
import { delNodeName, resolveNodeName } from '../node/node-name.ts';
import {
  allocatorFor,
  corruptLine,
  DEFAULT_POOL_JOURNAL_ROOT,
  journalHolds,
  journalName,
  PER_REQUEST,
  poolJournalDir,
  type CorruptSkip,
  type KVSource,
  type PoolAllocation,
  type PoolRequest,
} from '../pool/index.ts';
import { makeDirs } from '../common/make-dirs.ts';

/** The pool operations the command handlers call (src/cni/commands.ts). */
export interface PoolHooks {
  /**
   * ADD: the container's addresses, one per range set (existing ones on a repeated ADD). Throws
   * AppErrors. `signal` (optional): aborted when the client has gone; the daemon's sessions then
   * do not send a request still queued (the standalone plugin ignores it: its client is its
   * parent process).
   */
  add(conf: IPAMConfig, req: PoolRequest, signal?: AbortSignal): Promise<PoolAllocation[]>;
  /** DEL: release by owner; idempotent. Returns the released addresses. */
  del(id: NetworkIdentity, req: PoolRequest): Promise<string[]>;
  /** CHECK: the container's allocations, or null when it has none. */
  find(conf: IPAMConfig, req: PoolRequest): Promise<PoolAllocation[] | null>;
  /**
   * CNI GC (1.1.0) on a pool network: release this node's handles of the network that are not in
   * `valid`, under the evidence guards (src/reconcile/pool-pass.ts `poolGC`). Optional: without
   * it GC releases nothing on a pool network. Throws AppErrors (STORE_UNAVAILABLE, CNI 11, when
   * etcd cannot be asked).
   */
  gc?(id: NetworkIdentity, valid: readonly PoolRequest[]): Promise<PoolGcOutcome>;
}

/**
 * {@link PoolHooks.gc} over `kv` for `node`: the kernel evidence from /proc and the pinned
 * namespaces, the audit log `<dataDir>/.ipwarden-audit.log` of the network's data dir (opened only
 * when something is released).
 */
export function poolGcWith(kv: KV, pool: PoolConfig, node: string, id: NetworkIdentity, valid: readonly PoolRequest[]): Promise<PoolGcOutcome> {
  return poolGC({ kv, prefix: pool.etcd.prefix, pool: pool.name, node }, id.name, valid, {
    // Asynchronous (same reads): in the daemon a GC must not stall the plugin socket meanwhile.
    evidence: () => readKernelEvidenceAsync(),
    // A pool network writes nothing else under its data dir: make it for the log if it is missing.
    audit: () => {
      makeDirs(id.dataDir, 0o755);
      return openDefaultAuditLog(id.dataDir);
    },
    now: Date.now,
  });
}


/**
 * The standalone plugin's hooks over `source` (default: a client per request, one transaction per
 * ADD), resolving the node name from `env` (the request's environment). A corrupt key an ADD or
 * DEL went on without is one {@link corruptLine} on `stderr` (default: fd 2; stdout belongs to
 * the protocol).
 */
export function poolHooks(
  env: Readonly<Record<string, string | undefined>>,
  source: KVSource = PER_REQUEST,
  journalRoot: string = DEFAULT_POOL_JOURNAL_ROOT,
  stderr: (text: string) => void = (t) => void writeSync(2, t),
): PoolHooks {
  const tellCorrupt = (pool: PoolConfig) => (c: CorruptSkip) => stderr(corruptLine(pool.name, c));
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
        const [r] = await allocatorFor(kv, pool, node, conf.name, conf.rangeSets, undefined, tellCorrupt(pool)).add([req]);
        if (r instanceof AppError) throw r;
        return r as PoolAllocation[];
      });
    },
    del: async (id, req) => {
      const pool = id.pool as PoolConfig;
      const node = delNodeName(pool, env);
      // Review F6: an attachment the daemon allocated (or released) offline and has not synced is
      // the daemon's to release: answering "released" here would let its later sync bring the
      // handle back. Code 11: the runtime retries until the daemon is back.
      if (journalHolds(poolJournalDir(journalRoot, pool.etcd.prefix, pool.name, node), journalName(pool, req.containerId.trim(), req.ifname))) {
        throw new AppError('STORE_UNAVAILABLE', `an offline allocation of ${req.containerId.trim()}/${req.ifname} in pool ${pool.name} awaits its sync by the daemon; retry`);
      }
      return await withKV(pool, (kv) => allocatorFor(kv, pool, node, id.name, [], undefined, tellCorrupt(pool)).del(req));
    },
    find: (conf, req) => {
      const pool = conf.pool as PoolConfig;
      const node = resolveNodeName(pool, env);
      return withKV(pool, (kv) => allocatorFor(kv, pool, node, conf.name, conf.rangeSets).find(req));
    },
    gc: (id, valid) => {
      const pool = id.pool as PoolConfig;
      const node = resolveNodeName(pool, env);
      return withKV(pool, (kv) => poolGcWith(kv, pool, node, id, valid));
    },
  };
}
