/**
 * The plugin's self-healing hooks over CRI (issue 4): reclaim on exhaustion and recovery of a
 * wiped data directory ({@link makeHeal} in src/reconcile/reclaim.ts does the work). Loaded
 * lazily, in the cold part of the bundle, only when a hook fires and a runtime endpoint exists,
 * so ADD and DEL on a healthy network never evaluate the gRPC client.
 *
 * Runtime endpoint: ipam `runtimeEndpoint`, else `CONTAINER_RUNTIME_ENDPOINT`, else the first
 * existing default socket (`/run/containerd/containerd.sock`, `/var/run/crio/crio.sock`). Each
 * CRI call gets a short deadline ({@link PLUGIN_CRI_TIMEOUT_SECONDS}) because the runtime is
 * waiting on this very ADD. The audit log is `<dataDir>/ipwarden-audit.log`, opened on first use.
 */
import { defaultAuditLogPath, openAuditLog, type AuditSink } from '../reconcile/audit.ts';
import { criSandboxSource } from '../reconcile/cri-source.ts';
import { makeHeal } from '../reconcile/reclaim.ts';
import { resolveRuntimeEndpoint } from '../runtime/endpoint.ts';
import type { HealHooks } from './commands.ts';

/** Deadline of each CRI call made from inside ADD, seconds. */
export const PLUGIN_CRI_TIMEOUT_SECONDS = 5;

/** Build the CRI-backed hooks. `env` supplies CONTAINER_RUNTIME_ENDPOINT; `now` is ms since the epoch. */
export function criHeal(env: Readonly<Record<string, string | undefined>>, now: () => number = Date.now): HealHooks {
  return makeHeal({
    source: (conf) => {
      try {
        return criSandboxSource(resolveRuntimeEndpoint(conf.runtimeEndpoint ?? undefined, env as NodeJS.ProcessEnv).url, PLUGIN_CRI_TIMEOUT_SECONDS);
      } catch (e) {
        return e instanceof Error ? e.message : String(e);
      }
    },
    audit: (conf): AuditSink => {
      let sink: AuditSink | null = null;
      const get = (): AuditSink => (sink ??= openAuditLog(defaultAuditLogPath(conf.dataDir)));
      return {
        append: (rec) => get().append(rec),
        sync: () => get().sync(),
        open: () => void get(),
        close: () => sink?.close(),
      };
    },
    now,
  });
}
