/**
 * The part of CRI `runtime.v1.RuntimeService` a kubelet uses to run a pod with containers, for
 * the lab's DaemonSet run (src/lab/daemonset.ts): RunPodSandbox with namespace options and a log
 * directory, CreateContainer / StartContainer / ContainerStatus / StopContainer / RemoveContainer,
 * StopPodSandbox / RemovePodSandbox.
 *
 * The project's client (src/runtime/cri-client.ts) exposes only what ipwarden itself calls (house
 * style 12), so the lab carries this second, test-tooling subset. Like that one, the schema is our
 * own text, loaded with protobufjs `parse()` + proto-loader `fromJSON()`; message names, field
 * numbers and enum values are facts of the public CRI API (kubernetes/cri-api
 * `pkg/apis/runtime/v1/api.proto`). Fields not declared are skipped on decode, so leaving them out
 * is safe; every field the lab sets is declared. Every gRPC failure is converted once, by the
 * project's {@link castGrpcError}. Every call has a deadline.
 */
import * as grpc from '@grpc/grpc-js';
import { fromJSON, type MethodDefinition, type PackageDefinition, type ServiceDefinition } from '@grpc/proto-loader';
import protobuf from 'protobufjs';
import { AppError, ClosedError } from '../common/errors.ts';
import { castGrpcError } from '../runtime/cri-client.ts';
import { parseRuntimeEndpoint, type RuntimeEndpoint } from '../runtime/endpoint.ts';

const POD_CRI_PROTO = `
syntax = "proto3";
package runtime.v1;

service RuntimeService {
  rpc RunPodSandbox(RunPodSandboxRequest) returns (RunPodSandboxResponse) {}
  rpc StopPodSandbox(PodSandboxIdRequest) returns (Empty) {}
  rpc RemovePodSandbox(PodSandboxIdRequest) returns (Empty) {}
  rpc CreateContainer(CreateContainerRequest) returns (CreateContainerResponse) {}
  rpc StartContainer(ContainerIdRequest) returns (Empty) {}
  rpc StopContainer(StopContainerRequest) returns (Empty) {}
  rpc RemoveContainer(ContainerIdRequest) returns (Empty) {}
  rpc ContainerStatus(ContainerStatusRequest) returns (ContainerStatusResponse) {}
}

message Empty {}
message PodSandboxIdRequest { string pod_sandbox_id = 1; }
message ContainerIdRequest { string container_id = 1; }
message StopContainerRequest { string container_id = 1; int64 timeout = 2; }

enum Protocol { TCP = 0; UDP = 1; SCTP = 2; }
message PortMapping { Protocol protocol = 1; int32 container_port = 2; int32 host_port = 3; string host_ip = 4; }

enum NamespaceMode { POD = 0; CONTAINER = 1; NODE = 2; TARGET = 3; }
message NamespaceOption { NamespaceMode network = 1; NamespaceMode pid = 2; NamespaceMode ipc = 3; string target_id = 4; }
message Int64Value { int64 value = 1; }
message SELinuxOption { string user = 1; string role = 2; string type = 3; string level = 4; }
message LinuxSandboxSecurityContext {
  NamespaceOption namespace_options = 1;
  SELinuxOption selinux_options = 2;
  Int64Value run_as_user = 3;
  bool readonly_rootfs = 4;
  bool privileged = 6;
  Int64Value run_as_group = 8;
}
message LinuxPodSandboxConfig { string cgroup_parent = 1; LinuxSandboxSecurityContext security_context = 2; }
message PodSandboxMetadata { string name = 1; string uid = 2; string namespace = 3; uint32 attempt = 4; }
message PodSandboxConfig {
  PodSandboxMetadata metadata = 1;
  string hostname = 2;
  string log_directory = 3;
  repeated PortMapping port_mappings = 5;
  map<string, string> labels = 6;
  map<string, string> annotations = 7;
  LinuxPodSandboxConfig linux = 8;
}
message RunPodSandboxRequest { PodSandboxConfig config = 1; string runtime_handler = 2; }
message RunPodSandboxResponse { string pod_sandbox_id = 1; }

message ContainerMetadata { string name = 1; uint32 attempt = 2; }
message ImageSpec { string image = 1; }
message KeyValue { string key = 1; string value = 2; }
enum MountPropagation { PROPAGATION_PRIVATE = 0; PROPAGATION_HOST_TO_CONTAINER = 1; PROPAGATION_BIDIRECTIONAL = 2; }
message Mount { string container_path = 1; string host_path = 2; bool readonly = 3; bool selinux_relabel = 4; MountPropagation propagation = 5; }
message LinuxContainerResources { int64 cpu_period = 1; int64 cpu_quota = 2; int64 cpu_shares = 3; int64 memory_limit_in_bytes = 4; }
message Capability { repeated string add_capabilities = 1; repeated string drop_capabilities = 2; }
message LinuxContainerSecurityContext {
  Capability capabilities = 1;
  bool privileged = 2;
  NamespaceOption namespace_options = 3;
  SELinuxOption selinux_options = 4;
  Int64Value run_as_user = 5;
  bool readonly_rootfs = 7;
  string apparmor_profile = 9;
  bool no_new_privs = 11;
  Int64Value run_as_group = 12;
}
message LinuxContainerConfig { LinuxContainerResources resources = 1; LinuxContainerSecurityContext security_context = 2; }
message ContainerConfig {
  ContainerMetadata metadata = 1;
  ImageSpec image = 2;
  repeated string command = 3;
  repeated string args = 4;
  string working_dir = 5;
  repeated KeyValue envs = 6;
  repeated Mount mounts = 7;
  map<string, string> labels = 9;
  map<string, string> annotations = 10;
  string log_path = 11;
  LinuxContainerConfig linux = 15;
}
message CreateContainerRequest { string pod_sandbox_id = 1; ContainerConfig config = 2; PodSandboxConfig sandbox_config = 3; }
message CreateContainerResponse { string container_id = 1; }

enum ContainerState { CONTAINER_CREATED = 0; CONTAINER_RUNNING = 1; CONTAINER_EXITED = 2; CONTAINER_UNKNOWN = 3; }
message ContainerStatusRequest { string container_id = 1; bool verbose = 2; }
message ContainerStatus {
  string id = 1;
  ContainerMetadata metadata = 2;
  ContainerState state = 3;
  int64 created_at = 4;
  int64 started_at = 5;
  int64 finished_at = 6;
  int32 exit_code = 7;
  ImageSpec image = 8;
  string image_ref = 9;
  string reason = 10;
  string message = 11;
  string log_path = 15;
}
message ContainerStatusResponse { ContainerStatus status = 1; map<string, string> info = 2; }
`;

/** CRI `NamespaceMode`. */
export type NamespaceMode = 'POD' | 'CONTAINER' | 'NODE';

/** CRI `MountPropagation`. */
export type MountPropagation = 'PROPAGATION_PRIVATE' | 'PROPAGATION_HOST_TO_CONTAINER' | 'PROPAGATION_BIDIRECTIONAL';

/** What RunPodSandbox is asked for (CRI `PodSandboxConfig`, the subset a kubelet fills for a host-network pod). */
export interface PodSandboxSpec {
  name: string;
  uid: string;
  namespace: string;
  attempt?: number;
  /** '' for a host-network pod (the node's hostname then applies). */
  hostname?: string;
  /** Absolute directory where the containers' logs go (kubelet: `/var/log/pods/<ns>_<name>_<uid>`). */
  logDirectory: string;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
  cgroupParent: string;
  /** `hostNetwork` → network NODE, `hostPID` → pid NODE; ipc POD unless `hostIPC`. */
  namespaces: { network: NamespaceMode; pid: NamespaceMode; ipc: NamespaceMode };
  portMappings?: { containerPort: number; hostPort: number; protocol?: 'TCP' | 'UDP' | 'SCTP' }[];
}

/** One bind mount of a container (CRI `Mount`). */
export interface ContainerMount {
  containerPath: string;
  hostPath: string;
  readonly: boolean;
  propagation: MountPropagation;
}

/** What CreateContainer is asked for (CRI `ContainerConfig`, the subset a kubelet fills from a pod spec). */
export interface ContainerSpec {
  name: string;
  attempt?: number;
  /** Image reference as imported (`localhost/ipwarden:0.1.0`). */
  image: string;
  /** The pod spec's `command` (replaces the image entrypoint); [] keeps it. */
  command: string[];
  /** The pod spec's `args` (replace the image cmd). */
  args: string[];
  env: { key: string; value: string }[];
  mounts: ContainerMount[];
  /** Relative to the sandbox's log directory (kubelet: `<container name>/<restart count>.log`). */
  logPath: string;
  labels?: Record<string, string>;
  /** `securityContext` as CRI: capabilities (names without `CAP_`), uid/gid, read-only root, no_new_privs (= !allowPrivilegeEscalation). */
  security: {
    addCapabilities: string[];
    dropCapabilities: string[];
    runAsUser?: number;
    runAsGroup?: number;
    readonlyRootfs: boolean;
    noNewPrivs: boolean;
    /** Deprecated string form (`unconfined`, `runtime/default`), the one containerd 1.6 reads. */
    apparmorProfile?: string;
    seLinuxType?: string;
    namespaces: { network: NamespaceMode; pid: NamespaceMode; ipc: NamespaceMode };
  };
  /** Limits as cgroup values: CFS quota/period (µs), shares, memory limit (bytes); 0 = unset. */
  resources: { cpuPeriod: number; cpuQuota: number; cpuShares: number; memoryLimitBytes: number };
}

/** CRI `ContainerState`. */
export type ContainerState = 'created' | 'running' | 'exited' | 'unknown';

/** `ContainerStatus` as the lab reads it. */
export interface ContainerStatusInfo {
  id: string;
  name: string;
  state: ContainerState;
  /** Exit code once `exited` (CRI `exit_code`). */
  exitCode: number;
  /** containerd's reason (`Completed`, `Error`, `OOMKilled`), '' while running. */
  reason: string;
  message: string;
  /** Digested image reference the container runs (`localhost/ipwarden@sha256:…`), for the digest check. */
  imageRef: string;
  /** Absolute log path. */
  logPath: string;
}

type Method = 'RunPodSandbox' | 'StopPodSandbox' | 'RemovePodSandbox' | 'CreateContainer' | 'StartContainer' | 'StopContainer' | 'RemoveContainer' | 'ContainerStatus';

const LOADER_OPTIONS = { keepCase: true, longs: String, enums: String, defaults: true } as const;
let pkgDef: PackageDefinition | undefined;

function methodDef(method: Method): MethodDefinition<object, object> {
  pkgDef ??= fromJSON(protobuf.parse(POD_CRI_PROTO, { keepCase: true }).root.toJSON(), LOADER_OPTIONS);
  const m = (pkgDef['runtime.v1.RuntimeService'] as ServiceDefinition)[method];
  if (m === undefined) throw new AppError('INTERNAL', `CRI method ${method} missing from the lab's pod proto`);
  return m as MethodDefinition<object, object>;
}

function sandboxConfig(s: PodSandboxSpec): object {
  return {
    metadata: { name: s.name, uid: s.uid, namespace: s.namespace, attempt: s.attempt ?? 0 },
    hostname: s.hostname ?? '',
    log_directory: s.logDirectory,
    port_mappings: (s.portMappings ?? []).map((p) => ({ protocol: p.protocol ?? 'TCP', container_port: p.containerPort, host_port: p.hostPort, host_ip: '' })),
    labels: s.labels ?? {},
    annotations: s.annotations ?? {},
    linux: {
      cgroup_parent: s.cgroupParent,
      security_context: { namespace_options: { network: s.namespaces.network, pid: s.namespaces.pid, ipc: s.namespaces.ipc, target_id: '' } },
    },
  };
}

function containerConfig(c: ContainerSpec): object {
  const sec = c.security;
  return {
    metadata: { name: c.name, attempt: c.attempt ?? 0 },
    image: { image: c.image },
    command: c.command,
    args: c.args,
    working_dir: '',
    envs: c.env.map((e) => ({ key: e.key, value: e.value })),
    mounts: c.mounts.map((m) => ({ container_path: m.containerPath, host_path: m.hostPath, readonly: m.readonly, selinux_relabel: false, propagation: m.propagation })),
    labels: c.labels ?? {},
    annotations: {},
    log_path: c.logPath,
    linux: {
      resources: {
        cpu_period: String(c.resources.cpuPeriod),
        cpu_quota: String(c.resources.cpuQuota),
        cpu_shares: String(c.resources.cpuShares),
        memory_limit_in_bytes: String(c.resources.memoryLimitBytes),
      },
      security_context: {
        capabilities: { add_capabilities: sec.addCapabilities, drop_capabilities: sec.dropCapabilities },
        privileged: false,
        namespace_options: { network: sec.namespaces.network, pid: sec.namespaces.pid, ipc: sec.namespaces.ipc, target_id: '' },
        ...(sec.seLinuxType === undefined ? {} : { selinux_options: { user: '', role: '', type: sec.seLinuxType, level: '' } }),
        ...(sec.runAsUser === undefined ? {} : { run_as_user: { value: String(sec.runAsUser) } }),
        ...(sec.runAsGroup === undefined ? {} : { run_as_group: { value: String(sec.runAsGroup) } }),
        readonly_rootfs: sec.readonlyRootfs,
        apparmor_profile: sec.apparmorProfile ?? '',
        no_new_privs: sec.noNewPrivs,
      },
    },
  };
}

const STATES: Record<string, ContainerState> = {
  CONTAINER_CREATED: 'created',
  CONTAINER_RUNNING: 'running',
  CONTAINER_EXITED: 'exited',
  CONTAINER_UNKNOWN: 'unknown',
};

/**
 * A kubelet's view of one CRI runtime: pods with containers. Create with {@link PodCri.open};
 * {@link PodCri.close} is idempotent, later calls throw {@link ClosedError}.
 */
export class PodCri {
  readonly endpoint: RuntimeEndpoint;
  readonly timeoutSeconds: number;
  readonly #client: grpc.Client;
  #closed = false;

  private constructor(endpoint: RuntimeEndpoint, timeoutSeconds: number) {
    this.endpoint = endpoint;
    this.timeoutSeconds = timeoutSeconds;
    this.#client = new grpc.Client(endpoint.url, grpc.credentials.createInsecure(), { 'grpc.use_local_subchannel_pool': 1 });
  }

  /** A client for `endpoint` (`unix:///path`); calls have a deadline of `timeoutSeconds` (default 60: a container stop waits its grace period). @throws AppError USAGE for a malformed endpoint. */
  static open(endpoint: string, timeoutSeconds = 60): PodCri {
    return new PodCri(parseRuntimeEndpoint(endpoint), timeoutSeconds);
  }

  /** RunPodSandbox; returns the sandbox id. */
  async runPodSandbox(spec: PodSandboxSpec): Promise<string> {
    const r = await this.#call<{ pod_sandbox_id: string }>('RunPodSandbox', { config: sandboxConfig(spec), runtime_handler: '' });
    return r.pod_sandbox_id;
  }

  /** CreateContainer in `sandboxId` (`spec` is the sandbox's own spec, passed again as a kubelet does); returns the container id. */
  async createContainer(sandboxId: string, sandbox: PodSandboxSpec, spec: ContainerSpec): Promise<string> {
    const r = await this.#call<{ container_id: string }>('CreateContainer', { pod_sandbox_id: sandboxId, config: containerConfig(spec), sandbox_config: sandboxConfig(sandbox) });
    return r.container_id;
  }

  /** StartContainer. */
  async startContainer(id: string): Promise<void> {
    await this.#call('StartContainer', { container_id: id });
  }

  /** StopContainer: SIGTERM (the image's stop signal), SIGKILL after `graceSeconds`. */
  async stopContainer(id: string, graceSeconds: number): Promise<void> {
    await this.#call('StopContainer', { container_id: id, timeout: String(graceSeconds) });
  }

  /** RemoveContainer. */
  async removeContainer(id: string): Promise<void> {
    await this.#call('RemoveContainer', { container_id: id });
  }

  /** ContainerStatus. */
  async containerStatus(id: string): Promise<ContainerStatusInfo> {
    const r = await this.#call<{ status: { id: string; metadata: { name: string } | null; state: string; exit_code: number; reason: string; message: string; image_ref: string; log_path: string } | null }>('ContainerStatus', { container_id: id, verbose: false });
    if (r.status === null) throw new AppError('RUNTIME_CALL_FAILED', `CRI RuntimeService/ContainerStatus at ${this.endpoint.url} returned no status for ${id}`);
    const s = r.status;
    return { id: s.id, name: s.metadata?.name ?? '', state: STATES[s.state] ?? 'unknown', exitCode: s.exit_code, reason: s.reason, message: s.message, imageRef: s.image_ref, logPath: s.log_path };
  }

  /** StopPodSandbox (stops every container of the sandbox; with a pod network, CNI DEL). */
  async stopPodSandbox(id: string): Promise<void> {
    await this.#call('StopPodSandbox', { pod_sandbox_id: id });
  }

  /** RemovePodSandbox (removes its containers). */
  async removePodSandbox(id: string): Promise<void> {
    await this.#call('RemovePodSandbox', { pod_sandbox_id: id });
  }

  /** Closes the channel; idempotent. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#client.close();
  }

  #call<T>(method: Method, req: object): Promise<T> {
    if (this.#closed) return Promise.reject(new ClosedError('lab pod CRI client'));
    const def = methodDef(method);
    const ep = this.endpoint;
    const timeoutSeconds = this.timeoutSeconds;
    return new Promise<T>((resolve, reject) => {
      this.#client.makeUnaryRequest(def.path, def.requestSerialize, def.responseDeserialize, req, new grpc.Metadata(), { deadline: Date.now() + timeoutSeconds * 1000 }, (err, value) => {
        if (err) reject(castGrpcError(err, { endpoint: ep.url, method, timeoutSeconds }));
        else resolve(value as T);
      });
    });
  }
}
