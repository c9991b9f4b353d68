/**
 * The real {@link SandboxSource}: CRI `ListPodSandbox` (and `PodSandboxStatus` for pod IPs) over
 * the runtime's unix socket, through {@link CriClient}. Connects on first use; `close()` is
 * idempotent. Errors arrive already converted to `AppError` (`RUNTIME_*`) by the client.
 */
import { CriClient } from '../runtime/cri-client.ts';
import type { SandboxInfo, SandboxSource } from './sandboxes.ts';

/** A sandbox source that can also tell a sandbox's pod IPs (for data-directory recovery). */
export interface PodIPSource extends SandboxSource {
  /** Pod IPs of sandbox `id` (PodSandboxStatus `network.ip` + `additional_ips`), possibly empty. */
  podIPs(id: string): Promise<string[]>;
}

/**
 * Build a CRI-backed source for `endpoint` (`unix:///path` or `/path`).
 * @param timeoutSeconds deadline of each call, seconds (default 10; the plugin uses less)
 */
export function criSandboxSource(endpoint: string, timeoutSeconds = 10): PodIPSource {
  let client: Promise<CriClient> | null = null;
  const get = (): Promise<CriClient> => (client ??= CriClient.connect(endpoint, { timeoutSeconds }));
  return {
    endpoint,
    async list(): Promise<SandboxInfo[]> {
      const items = await (await get()).listPodSandboxes();
      return items.map((s) => ({ id: s.id, state: s.state }));
    },
    async podIPs(id: string): Promise<string[]> {
      const st = await (await get()).podSandboxStatus(id);
      return [st.network.ip, ...st.network.additionalIps].filter((ip) => ip !== '');
    },
    async close(): Promise<void> {
      const c = client;
      client = null;
      if (c !== null) await (await c.catch(() => null))?.close();
    },
  };
}
