/**
 * The reconciler's narrow view of the container runtime: who the sandboxes are. Kept separate
 * from the CRI client (`src/runtime/`) so the reconciler and its tests depend only on this shape;
 * the snapshot adapts the real client to it (`criSandboxSource` in `src/reconcile/snapshot.ts`).
 */
import type { SandboxIndex, SandboxState } from './plan.ts';

/** One pod sandbox as the runtime lists it. */
export interface SandboxInfo {
  /** Full sandbox ID (the CNI container ID of its network setup). */
  readonly id: string;
  readonly state: SandboxState;
}

/**
 * A source of the runtime's sandbox list (CRI `ListPodSandbox` with no filter).
 * `list()` throws an `AppError` (`RUNTIME_*`) when the runtime cannot be asked.
 */
export interface SandboxSource {
  /** Where the runtime is asked (`unix:///run/containerd/containerd.sock`), for reports. */
  readonly endpoint: string;
  /** Every sandbox the runtime knows, in any state. */
  list(): Promise<SandboxInfo[]>;
  /**
   * Pod IPs of sandbox `id` as the runtime reports them (CRI PodSandboxStatus `network.ip` plus
   * `network.additional_ips`, empty strings dropped), possibly empty. Optional: without it the
   * reconciler skips the check of live sandboxes' addresses (field report BR-13). Throws an
   * `AppError` (`RUNTIME_*`) when the runtime cannot answer for this sandbox.
   */
  podIPs?(id: string): Promise<string[]>;
  /** Free the connection. Idempotent. Optional for fakes. */
  close?(): Promise<void> | void;
}

/** Builds a {@link SandboxSource} for a resolved endpoint URL (`unix:///path`). */
export type SandboxSourceFactory = (endpoint: string) => SandboxSource;

/** The sandbox list as an index by full ID (with states, for reasons). */
export function indexSandboxes(list: readonly SandboxInfo[]): SandboxIndex {
  const m = new Map<string, SandboxState>();
  for (const s of list) m.set(s.id, s.state);
  return m;
}

/** gRPC status NOT_FOUND (the CRI client keeps the gRPC error as the `cause` of its AppError). */
const GRPC_NOT_FOUND = 5;

/**
 * True when a PodSandboxStatus failure says the sandbox does not exist (removed since the list):
 * it then uses no address, and its failure is no gap in the evidence. Checks the gRPC status of
 * the cause, else the text (`NotFound`, `NOT_FOUND`). Kept free of the gRPC client so the plugin's
 * bundle does not load it.
 */
export function isSandboxNotFound(e: unknown): boolean {
  const cause = e instanceof Error ? (e.cause as { code?: unknown } | null | undefined) : undefined;
  if (cause !== undefined && cause !== null && cause.code === GRPC_NOT_FOUND) return true;
  return e instanceof Error && /\bnot_?found\b/i.test(e.message);
}
