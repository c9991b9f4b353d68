/**
 * A kubelet's view of one CRI runtime, for the lab's DaemonSet run (src/lab/daemonset.ts): pods
 * with containers. A thin user of the project's {@link CriClient} (src/runtime/cri-client.ts),
 * which holds the schema, the calls, the error conversion and the deadlines; this module only
 * keeps the kubelet's habits the lab relies on:
 *
 * - {@link PodCri.open} is synchronous; the client connects (with its `Version` handshake) on the
 *   first call, and again on the next call after a failed connect;
 * - a deadline of 60 s per call by default (a container stop waits its grace period, and
 *   {@link CriClient.stopContainer} adds the grace period to it);
 * - a sandbox's hostname defaults to '' (the node's, for a host-network pod), and its config is
 *   sent again with each CreateContainer (CRI `sandbox_config`), argument order as the lab calls it.
 */
import { ClosedError } from '../common/errors.ts';
import { CriClient, type ContainerConfig, type ContainerStatus, type NamespaceOptions, type SandboxConfig } from '../runtime/cri-client.ts';
import { parseRuntimeEndpoint, type RuntimeEndpoint } from '../runtime/endpoint.ts';

/**
 * What RunPodSandbox is asked for: CRI `PodSandboxConfig`, the subset a kubelet fills for a
 * host-network pod. As {@link SandboxConfig}, with the log directory (absolute; kubelet:
 * `/var/log/pods/<ns>_<name>_<uid>`), the cgroup parent and the namespaces required; `hostname`
 * '' (the default here) for a host-network pod.
 */
export type PodSandboxSpec = SandboxConfig & { logDirectory: string; cgroupParent: string; namespaces: NamespaceOptions };

/** The sandbox config sent for `spec`: the lab's hostname default ''. */
function sandboxConfig(spec: PodSandboxSpec): SandboxConfig {
  return { ...spec, hostname: spec.hostname ?? '' };
}

/**
 * Pods with containers on one CRI runtime. Create with {@link PodCri.open}; {@link PodCri.close}
 * is idempotent, later calls throw {@link ClosedError} (`lab pod CRI client is closed`). Every
 * failure of a call is an AppError of {@link CriClient} (its connect's codes on the first call).
 */
export class PodCri {
  readonly endpoint: RuntimeEndpoint;
  /** Deadline of each call (StopContainer: plus its grace period), seconds. */
  readonly timeoutSeconds: number;
  #client: Promise<CriClient> | undefined;
  #closed = false;

  private constructor(endpoint: RuntimeEndpoint, timeoutSeconds: number) {
    this.endpoint = endpoint;
    this.timeoutSeconds = timeoutSeconds;
  }

  /**
   * A client for `endpoint` (`unix:///path` or `/path`); calls have a deadline of `timeoutSeconds`
   * (default 60). Connects on the first call.
   * @throws AppError USAGE for a malformed endpoint.
   */
  static open(endpoint: string, timeoutSeconds = 60): PodCri {
    return new PodCri(parseRuntimeEndpoint(endpoint), timeoutSeconds);
  }

  /** RunPodSandbox; returns the sandbox id. */
  async runPodSandbox(spec: PodSandboxSpec): Promise<string> {
    return (await this.#cri()).runPodSandbox(sandboxConfig(spec));
  }

  /** CreateContainer in `sandboxId` (`sandbox` is the sandbox's own spec, passed again as a kubelet does); returns the container id. */
  async createContainer(sandboxId: string, sandbox: PodSandboxSpec, spec: ContainerConfig): Promise<string> {
    return (await this.#cri()).createContainer(sandboxId, spec, sandboxConfig(sandbox));
  }

  /** StartContainer. */
  async startContainer(id: string): Promise<void> {
    await (await this.#cri()).startContainer(id);
  }

  /** StopContainer: SIGTERM (the image's stop signal), SIGKILL after `graceSeconds`. */
  async stopContainer(id: string, graceSeconds: number): Promise<void> {
    await (await this.#cri()).stopContainer(id, graceSeconds);
  }

  /** RemoveContainer. */
  async removeContainer(id: string): Promise<void> {
    await (await this.#cri()).removeContainer(id);
  }

  /** ContainerStatus. */
  async containerStatus(id: string): Promise<ContainerStatus> {
    return (await this.#cri()).containerStatus(id);
  }

  /** StopPodSandbox (stops every container of the sandbox; with a pod network, CNI DEL). */
  async stopPodSandbox(id: string): Promise<void> {
    await (await this.#cri()).stopPodSandbox(id);
  }

  /** RemovePodSandbox (removes its containers). */
  async removePodSandbox(id: string): Promise<void> {
    await (await this.#cri()).removePodSandbox(id);
  }

  /** Closes the channel (also one still connecting); idempotent. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    void this.#client?.then(
      (c) => c.close(),
      () => {},
    );
  }

  /** The connected client: connects on first use, again after a failed connect. */
  async #cri(): Promise<CriClient> {
    if (this.#closed) throw new ClosedError('lab pod CRI client');
    const pending = (this.#client ??= CriClient.connect(this.endpoint, { timeoutSeconds: this.timeoutSeconds }));
    let client: CriClient;
    try {
      client = await pending;
    } catch (e) {
      if (this.#client === pending) this.#client = undefined;
      throw e;
    }
    // close() while connecting: close() closes the client once connected; this call fails.
    if (this.#closed) throw new ClosedError('lab pod CRI client');
    return client;
  }
}
