/**
 * The daemon's report of automatic node removals (`ipam.pool.reclaimAfter`, docs/cluster.md
 * "Reclaiming dead nodes automatically"): the log lines of {@link logReport}, the audit log and
 * the metric `ipwarden_pool_nodes_reclaimed_total{pool}`.
 *
 * Audit lines (the node-local format plus `pool`, `revision`, `node`, `by`, `block`): before a
 * `--finish` one `intent` line per address of each handle of the removed node it is about to
 * release, made durable (fsync) first — when that fails nothing is released; after it, per
 * address `released`, or `kept` with why (the node vetoed, or the handle changed meanwhile).
 * `verdict` is `unknown` (no runtime of that node was asked: it is gone by its absent heartbeat),
 * `ageSeconds` 0, `reason` names who removed whom.
 */
import type { AuditRecord, AuditSink } from '../reconcile/audit.ts';
import { logReport, type AutoReclaimReport, type ReclaimHandle, type ReclaimLog, type ReclaimScope } from '../pool/index.ts';

/** What the report writes to. */
export interface PoolReclaimSinks {
  /** The daemon's pool log (`part: "pools"`). */
  readonly log: ReclaimLog;
  /** Opens the daemon's audit log (`--audit-log`, else `<data dir>/.ipwarden-audit.log`); throws STORE_IO. */
  readonly audit: () => AuditSink;
  /** Counts one node reclaimed. */
  readonly reclaimed: (pool: string) => void;
  /** Wall clock, ms since the epoch (the audit lines' `time`). */
  readonly now?: () => number;
}

function records(e: ReclaimScope, handles: readonly ReclaimHandle[], phase: AuditRecord['phase'], reason: (h: ReclaimHandle, ip: string) => string, keep: (h: ReclaimHandle, ip: string) => boolean, time: string): AuditRecord[] {
  const out: AuditRecord[] = [];
  for (const h of handles) {
    for (const x of h.ips) {
      if (!keep(h, x.ip)) continue;
      out.push({ time, network: h.network, ip: x.ip, containerId: h.containerId, ifname: h.ifname, ageSeconds: 0, verdict: 'unknown', reason: reason(h, x.ip), phase, pool: e.pool, revision: h.modRevision, node: e.node, by: e.by, block: x.block });
    }
  }
  return out;
}

/** The report the daemon gives its pool sessions (see the module comment). */
export function poolReclaimReport(s: PoolReclaimSinks): AutoReclaimReport {
  const base = logReport(s.log);
  const now = s.now ?? Date.now;
  const why = (e: ReclaimScope): string => `node ${e.node} removed from pool ${e.pool} by node ${e.by}: its heartbeat was absent for reclaimAfter and it did not veto within the window`;
  const write = (recs: readonly AuditRecord[]): void => {
    const sink = s.audit();
    try {
      for (const r of recs) sink.append(r);
      sink.sync();
    } finally {
      sink.close();
    }
  };
  return {
    begun: base.begun,
    log: base.log,
    intent: (e) => {
      base.intent(e);
      write(records(e, e.handles, 'intent', () => why(e), () => true, new Date(now()).toISOString()));
    },
    finished: (e) => {
      base.finished(e);
      if (e.first && e.refused === null) s.reclaimed(e.pool);
      if (e.handles.length === 0) return;
      const released = new Set(e.released);
      const time = new Date(now()).toISOString();
      try {
        write([
          ...records(e, e.handles, 'released', () => why(e), (_h, ip) => released.has(ip), time),
          ...records(e, e.handles, 'kept', () => (e.refused !== null ? `not released: ${e.refused}` : 'not released: the handle or its block changed meanwhile (released by its own DEL, or held by another owner)'), (_h, ip) => !released.has(ip), time),
        ]);
      } catch (err) {
        s.log('error', { pool: e.pool, by: e.by, node: e.node, error: err instanceof Error ? err.message : String(err) }, 'automatic node removal: the outcome could not be audited');
      }
    },
  };
}
