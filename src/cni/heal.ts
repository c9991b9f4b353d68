/**
 * The plugin's self-healing hooks over CRI (issue 4): reclaim on exhaustion and recovery of a
 * wiped data directory. Loaded lazily by `src/cni/plugin.ts` only when a hook fires, so ADD and
 * DEL on a healthy network never evaluate the gRPC client.
 *
 * Runtime endpoint: ipam `runtimeEndpoint`, else `CONTAINER_RUNTIME_ENDPOINT`, else the first
 * existing default socket (`/run/containerd/containerd.sock`, `/var/run/crio/crio.sock`). Each
 * CRI call gets a short deadline ({@link PLUGIN_CRI_TIMEOUT_SECONDS}) because the runtime is
 * waiting on this very ADD.
 */
import { formatDuration } from '../common/duration.ts';
import { openAuditLog, defaultAuditLogPath, type AuditSink } from '../reconcile/audit.ts';
import { criSandboxSource, type PodIPSource } from '../reconcile/cri-source.ts';
import { exhaustionDetails, reclaimLocked, recoverLocked } from '../reconcile/reclaim.ts';
import { resolveRuntimeEndpoint } from '../runtime/endpoint.ts';
import type { IPAMConfig } from '../ipam/types.ts';
import type { HealHooks } from './commands.ts';

/** Deadline of each CRI call made from inside ADD, seconds. */
export const PLUGIN_CRI_TIMEOUT_SECONDS = 5;

function source(conf: IPAMConfig, env: Readonly<Record<string, string | undefined>>): PodIPSource | string {
  try {
    const ep = resolveRuntimeEndpoint(conf.runtimeEndpoint ?? undefined, env as NodeJS.ProcessEnv);
    return criSandboxSource(ep.url, PLUGIN_CRI_TIMEOUT_SECONDS);
  } catch (e) {
    return e instanceof Error ? e.message : String(e);
  }
}

async function withRuntime<T>(conf: IPAMConfig, env: Readonly<Record<string, string | undefined>>, fn: (src: PodIPSource | string, audit: AuditSink) => Promise<T>): Promise<T> {
  const src = source(conf, env);
  let audit: AuditSink | null = null;
  const lazyAudit: AuditSink = {
    append: (rec) => (audit ??= openAuditLog(defaultAuditLogPath(conf.dataDir))).append(rec),
    close: () => audit?.close(),
  };
  try {
    return await fn(src, lazyAudit);
  } finally {
    lazyAudit.close();
    if (typeof src !== 'string') await src.close?.();
  }
}

/** Build the CRI-backed hooks. `env` supplies CONTAINER_RUNTIME_ENDPOINT; `now` is ms since the epoch. */
export function criHeal(env: Readonly<Record<string, string | undefined>>, now: () => number = Date.now): HealHooks {
  return {
    reclaim: (store, conf, release) =>
      withRuntime(conf, env, async (src, audit) => {
        const o = await reclaimLocked(store, conf, { source: src, audit, now }, release);
        return { released: o.released.length, details: exhaustionDetails(conf, o, formatDuration(conf.leakGracePeriodSeconds), release) };
      }),
    recover: (store, conf) =>
      withRuntime(conf, env, async (src, audit) => (await recoverLocked(store, conf, src, audit, now)).recreated.length),
  };
}
