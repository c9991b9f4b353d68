/**
 * A thin, typed client for the CRI `runtime.v1.RuntimeService` over a local unix socket.
 *
 * Only the calls ipwarden uses are exposed (house style 12): the sandbox calls the reconciler and
 * heal make, plus the sandbox and container calls the tests and the lab make to run pods the way a
 * kubelet does (src/lab/pod-cri.ts, src/lab/daemonset.ts). The schema is our own subset
 * (`src/runtime/cri.proto`), embedded as a string (`generated/cri-proto.ts`) and loaded with
 * protobufjs `parse()` + proto-loader `fromJSON()`, so a single-file esbuild bundle works with no
 * `.proto` beside it.
 *
 * Every gRPC failure is converted here, once, into an {@link AppError} with a one-line message
 * and a retryable flag ({@link castGrpcError}, like etcd3's `castGrpcError`). Every call has a
 * deadline. Lifecycle (house style 10): {@link CriClient.close} is idempotent; any call after it
 * throws {@link ClosedError}.
 *
 * Facts about the API (field meanings, containerd 1.6 behaviour) come from
 * shared/reference/containerd-lab.md; those of the container calls from the public CRI API
 * (kubernetes/cri-api `pkg/apis/runtime/v1/api.proto`) and, for containerd 1.6.20's answers
 * (exit codes and reasons, `image_ref`, NOT_FOUND), from test/e2e/cri-client.test.ts on the lab.
 */
import { lstatSync } from 'node:fs';
import * as grpc from '@grpc/grpc-js';
import * as http2 from 'node:http2';
import * as net from 'node:net';
import { fromJSON, type MethodDefinition, type PackageDefinition, type ServiceDefinition } from '@grpc/proto-loader';
import protobuf from 'protobufjs';
import { AppError, ClosedError } from '../common/errors.ts';
import { parseRuntimeEndpoint, type RuntimeEndpoint } from './endpoint.ts';
import { CRI_PROTO } from './generated/cri-proto.ts';

/** Default per-call deadline, in seconds. */
export const DEFAULT_TIMEOUT_SECONDS = 10;

/** Options of {@link CriClient.connect}. */
export interface CriClientOptions {
  /** Deadline of every call, in seconds, connection time included. Default 10. */
  timeoutSeconds?: number;
}

/** CRI `PodSandboxState`: `SANDBOX_READY` → `'ready'`, `SANDBOX_NOTREADY` → `'notready'`. */
export type SandboxState = 'ready' | 'notready';

/** One pod sandbox as listed by `ListPodSandbox` (CRI `PodSandbox`). */
export interface Sandbox {
  /** Full sandbox id (64 hex for containerd); equals the CNI `CNI_CONTAINERID` of its network. */
  id: string;
  /** Pod name (`metadata.name`). */
  name: string;
  /** Pod namespace (`metadata.namespace`). */
  namespace: string;
  /** Pod UID (`metadata.uid`). */
  uid: string;
  /** Sandbox attempt number (`metadata.attempt`). */
  attempt: number;
  state: SandboxState;
  /** Creation time, nanoseconds since the Unix epoch (`created_at`, int64). */
  createdAtNs: bigint;
  labels: Record<string, string>;
  annotations: Record<string, string>;
  /** Runtime handler ('' = the runtime's default). */
  runtimeHandler: string;
}

/** `PodSandboxStatus` result: the sandbox plus its network status. */
export interface SandboxStatus extends Sandbox {
  network: {
    /** Primary pod IP; '' when the sandbox has no network (e.g. NOTREADY after CNI DEL). */
    ip: string;
    /** Further pod IPs (dual stack). */
    additionalIps: string[];
  };
  /**
   * Runtime-specific extra information, only with `verbose`. containerd puts a JSON string under
   * `info` (keys include `pid`, `netNamespaceClosed`, `cniResult`, `runtimeSpec`).
   */
  info: Record<string, string>;
}

/** Answer of `Version`. */
export interface RuntimeVersion {
  /** Version of the kubelet runtime API the runtime implements ("0.1.0"). */
  version: string;
  /** e.g. `containerd`. */
  runtimeName: string;
  /** e.g. `1.6.20~ds1`. */
  runtimeVersion: string;
  /** CRI API version, e.g. `v1`. */
  runtimeApiVersion: string;
}

/** CRI `NamespaceMode` of a pod or container namespace (`TARGET` is not used). */
export type NamespaceMode = 'POD' | 'CONTAINER' | 'NODE';

/**
 * CRI `NamespaceOption`: which network, PID and IPC namespaces a sandbox or container gets. The
 * kubelet's translation: `hostNetwork` → network NODE (else POD), `hostPID` → pid NODE (else
 * CONTAINER), `hostIPC` → ipc NODE (else POD).
 */
export interface NamespaceOptions {
  network: NamespaceMode;
  pid: NamespaceMode;
  ipc: NamespaceMode;
}

/** One CRI `PortMapping` of a sandbox (ports 0–65535; `hostPort` 0 = none). */
export interface PortMapping {
  containerPort: number;
  hostPort: number;
  /** Default TCP. */
  protocol?: 'TCP' | 'UDP' | 'SCTP';
}

/** What {@link CriClient.runPodSandbox} creates (a subset of CRI `PodSandboxConfig`). */
export interface SandboxConfig {
  name: string;
  uid: string;
  namespace: string;
  /** Default 0. */
  attempt?: number;
  /** Default `name`; '' only with network namespace NODE (CRI: the node's hostname then applies). */
  hostname?: string;
  /** Absolute directory of the containers' logs (kubelet: `/var/log/pods/<ns>_<name>_<uid>`); default ''. */
  logDirectory?: string;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
  /** `linux.cgroup_parent`, e.g. `/ipwarden-lab-1234` (cgroupfs driver). */
  cgroupParent?: string;
  /** `linux.security_context.namespace_options`; absent = the runtime's default (all POD). */
  namespaces?: NamespaceOptions;
  /** `port_mappings`; default none. */
  portMappings?: PortMapping[];
  /** Runtime handler; default '' (the runtime's default). */
  runtimeHandler?: string;
}

/** CRI `MountPropagation`. */
export type MountPropagation = 'PROPAGATION_PRIVATE' | 'PROPAGATION_HOST_TO_CONTAINER' | 'PROPAGATION_BIDIRECTIONAL';

/** One bind mount of a container (CRI `Mount`; `selinux_relabel` false). */
export interface ContainerMount {
  /** Absolute path in the container. */
  containerPath: string;
  /** Absolute path on the host. */
  hostPath: string;
  readonly: boolean;
  propagation: MountPropagation;
}

/**
 * What {@link CriClient.createContainer} creates (CRI `ContainerConfig`, the subset a kubelet fills
 * from a pod spec; `privileged` false, no working dir, no annotations).
 */
export interface ContainerConfig {
  name: string;
  /** Restart count (`metadata.attempt`); default 0. */
  attempt?: number;
  /** Image reference as the runtime knows it (`localhost/ipwarden:0.1.0`). */
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
  /**
   * `securityContext` as CRI: capabilities (names without `CAP_`, containerd adds it), uid/gid,
   * read-only root, no_new_privs (= !allowPrivilegeEscalation), SELinux type, namespaces.
   */
  security: {
    addCapabilities: string[];
    dropCapabilities: string[];
    runAsUser?: number;
    runAsGroup?: number;
    readonlyRootfs: boolean;
    noNewPrivs: boolean;
    /** Deprecated string form (`unconfined`, `runtime/default`), the one containerd 1.6 reads; default ''. */
    apparmorProfile?: string;
    seLinuxType?: string;
    namespaces: NamespaceOptions;
  };
  /** Limits as cgroup values: CFS quota and period (µs), shares, memory limit (bytes); 0 = unset. */
  resources: { cpuPeriod: number; cpuQuota: number; cpuShares: number; memoryLimitBytes: number };
}

/** CRI `ContainerState`: `CONTAINER_CREATED` → `'created'`, and so on. */
export type ContainerState = 'created' | 'running' | 'exited' | 'unknown';

/** One container as listed by `ListContainers` (CRI `Container`). */
export interface Container {
  /** Full container id (64 hex for containerd). */
  id: string;
  /** Id of the sandbox it belongs to. */
  sandboxId: string;
  /** `metadata.name`. */
  name: string;
  /** `metadata.attempt` (the restart count). */
  attempt: number;
  /** Image as asked for (`image.image`). */
  image: string;
  /** Reference of the image it runs (CRI `image_ref`; containerd 1.6: its image id, `sha256:<config digest>`). */
  imageRef: string;
  state: ContainerState;
  /** Creation time, nanoseconds since the Unix epoch. */
  createdAtNs: bigint;
  labels: Record<string, string>;
  annotations: Record<string, string>;
}

/**
 * `ContainerStatus` result (CRI `ContainerStatus`, the fields declared in cri.proto): a listed
 * container's fields but the sandbox id (`ContainerStatus` has none), plus how it ran.
 */
export interface ContainerStatus extends Omit<Container, 'sandboxId'> {
  /** Exit code once `exited` (CRI `exit_code`; 0 before). */
  exitCode: number;
  /** The runtime's reason (containerd: `Completed`, `Error`, `OOMKilled`); '' while running. */
  reason: string;
  message: string;
  /** Absolute log path. */
  logPath: string;
  /** Start and finish time, nanoseconds since the Unix epoch; 0 = not yet. */
  startedAtNs: bigint;
  finishedAtNs: bigint;
}

/** Filter of {@link CriClient.listContainers} (CRI `ContainerFilter`; the fields are ANDed). */
export interface ContainerFilter {
  id?: string;
  state?: ContainerState;
  sandboxId?: string;
  labelSelector?: Record<string, string>;
}

/** Filter of {@link CriClient.listPodSandboxes} (CRI `PodSandboxFilter`). */
export interface SandboxFilter {
  id?: string;
  state?: SandboxState;
  labelSelector?: Record<string, string>;
}

const SERVICE = 'runtime.v1.RuntimeService';

type Method =
  | 'Version'
  | 'RunPodSandbox'
  | 'StopPodSandbox'
  | 'RemovePodSandbox'
  | 'PodSandboxStatus'
  | 'ListPodSandbox'
  | 'CreateContainer'
  | 'StartContainer'
  | 'StopContainer'
  | 'RemoveContainer'
  | 'ListContainers'
  | 'ContainerStatus';

// proto-loader options: snake_case field names as in the .proto, int64 as decimal strings,
// enums as their names, absent fields filled with defaults.
const LOADER_OPTIONS = { keepCase: true, longs: String, enums: String, defaults: true } as const;

let packageDefinition: PackageDefinition | undefined;

/** The parsed CRI package definition, built once per process from the embedded .proto text. */
function criPackage(): PackageDefinition {
  if (packageDefinition === undefined) {
    const root = protobuf.parse(CRI_PROTO, { keepCase: true }).root;
    packageDefinition = fromJSON(root.toJSON(), LOADER_OPTIONS);
  }
  return packageDefinition;
}

function methodDef(method: Method): MethodDefinition<object, object> {
  const service = criPackage()[SERVICE] as ServiceDefinition;
  const m = service[method];
  if (m === undefined) throw new AppError('INTERNAL', `CRI method ${method} missing from cri.proto`);
  return m as MethodDefinition<object, object>;
}

/** Minimal shape of a grpc-js `ServiceError` this module reads. */
interface GrpcErrorLike {
  code: number;
  details?: string;
  message?: string;
}

function isGrpcError(e: unknown): e is GrpcErrorLike {
  return typeof e === 'object' && e !== null && typeof (e as { code?: unknown }).code === 'number';
}

/** What the socket path is, for a better message when connecting is refused. */
export type SocketPathKind = 'socket' | 'missing' | 'other';

function socketPathKind(path: string): SocketPathKind {
  try {
    return lstatSync(path).isSocket() ? 'socket' : 'other';
  } catch {
    return 'missing';
  }
}

/** Context of one call, for {@link castGrpcError} messages. */
export interface CallContext {
  /** `unix:///path` of the runtime. */
  endpoint: string;
  /** CRI method name, e.g. `ListPodSandbox`. */
  method: string;
  /** The call's deadline, in seconds. */
  timeoutSeconds: number;
  /** Kind of the socket path, checked by the caller when the connection was refused. */
  pathKind?: SocketPathKind;
}

function oneLine(s: string): string {
  return s.replace(/\s+/g, ' ').replace(/\.? ?Resolution note: ?$/, '').trim();
}

/**
 * Converts a gRPC error (grpc-js `ServiceError`) from a CRI call into an {@link AppError}.
 * Pure; the original error is kept as `cause`. Anything that is not a gRPC error is wrapped as
 * `RUNTIME_CALL_FAILED`.
 *
 * | gRPC status / socket error            | code                        | retryable |
 * |---------------------------------------|-----------------------------|-----------|
 * | UNAVAILABLE, connect ENOENT           | RUNTIME_UNAVAILABLE         | yes       |
 * | UNAVAILABLE, connect EACCES/EPERM     | RUNTIME_PERMISSION_DENIED   | no        |
 * | UNAVAILABLE, connect ECONNREFUSED     | RUNTIME_UNAVAILABLE         | yes       |
 * | UNAVAILABLE, "Protocol error" (no HTTP/2) | RUNTIME_UNAVAILABLE      | yes       |
 * | UNAVAILABLE, other                    | RUNTIME_UNAVAILABLE         | yes       |
 * | DEADLINE_EXCEEDED                     | RUNTIME_UNAVAILABLE         | yes       |
 * | PERMISSION_DENIED / UNAUTHENTICATED   | RUNTIME_PERMISSION_DENIED   | no        |
 * | UNIMPLEMENTED                         | RUNTIME_NOT_CRI             | no        |
 * | anything else (NOT_FOUND, UNKNOWN, …) | RUNTIME_CALL_FAILED         | no        |
 *
 * (`RUNTIME_UNSUPPORTED_API` needs a second probe, done by {@link CriClient.connect}.)
 */
export function castGrpcError(e: unknown, ctx: CallContext): AppError {
  const at = ctx.endpoint;
  const rpc = `RuntimeService/${ctx.method}`;
  if (e instanceof AppError) return e;
  if (!isGrpcError(e)) {
    const text = e instanceof Error ? e.message : String(e);
    return new AppError('RUNTIME_CALL_FAILED', `CRI ${rpc} at ${at} failed: ${oneLine(text)}`, { cause: e });
  }
  const details = oneLine(e.details ?? e.message ?? '');
  const opts = { cause: e, details };
  switch (e.code) {
    case grpc.status.UNAVAILABLE: {
      const errno = /\bconnect (E[A-Z]+)\b/.exec(details)?.[1];
      if (errno === 'ENOENT' || ctx.pathKind === 'missing') {
        return new AppError('RUNTIME_UNAVAILABLE', `no CRI runtime at ${at}: socket does not exist`, { ...opts, retryable: true });
      }
      if (errno === 'EACCES' || errno === 'EPERM') {
        return new AppError(
          'RUNTIME_PERMISSION_DENIED',
          `permission denied connecting to CRI runtime at ${at}: run as root or as a member of the socket's group`,
          opts,
        );
      }
      if (errno === 'ECONNREFUSED') {
        const why = ctx.pathKind === 'other' ? 'not a unix socket' : 'connection refused (is the runtime running?)';
        return new AppError('RUNTIME_UNAVAILABLE', `no CRI runtime at ${at}: ${why}`, { ...opts, retryable: true });
      }
      if (/\bProtocol error\b/.test(details)) {
        // Something listens there but does not speak HTTP/2 (gRPC): most likely another kind of
        // server (docker.sock, a ttrpc socket). Still UNAVAILABLE, not RUNTIME_NOT_CRI: the
        // recovery of a wiped directory takes "not a CRI runtime" for "no runtime here" and lets
        // the kernel alone decide, while an endpoint that answers nothing must stop it (code 11).
        return new AppError('RUNTIME_UNAVAILABLE', `CRI runtime at ${at} is unavailable: it answers, but not as a gRPC server (is it the runtime's CRI socket?): ${details}`, { cause: e, retryable: true });
      }
      // The message carries the details: no `details` field to print them twice.
      return new AppError('RUNTIME_UNAVAILABLE', `CRI runtime at ${at} is unavailable: ${details}`, { cause: e, retryable: true });
    }
    case grpc.status.DEADLINE_EXCEEDED:
      return new AppError(
        'RUNTIME_UNAVAILABLE',
        `CRI runtime at ${at} did not answer ${rpc} within ${ctx.timeoutSeconds}s`,
        { ...opts, retryable: true },
      );
    case grpc.status.PERMISSION_DENIED:
    case grpc.status.UNAUTHENTICATED:
      return new AppError('RUNTIME_PERMISSION_DENIED', `CRI runtime at ${at} refused ${rpc}: ${details}`, { cause: e });
    case grpc.status.UNIMPLEMENTED:
      return new AppError(
        'RUNTIME_NOT_CRI',
        `${at} is not a CRI runtime.v1 server: it does not implement /${SERVICE}/${ctx.method}`,
        opts,
      );
    default: {
      const name = grpc.status[e.code] ?? `code ${e.code}`;
      return new AppError('RUNTIME_CALL_FAILED', `CRI ${rpc} at ${at} failed: ${name}: ${details}`, { cause: e });
    }
  }
}

/** The gRPC status code behind a converted error (e.g. `grpc.status.NOT_FOUND`), or undefined. */
export function grpcStatusOf(e: unknown): number | undefined {
  const cause = e instanceof Error ? e.cause : undefined;
  return isGrpcError(cause) ? cause.code : undefined;
}

interface RawMetadata {
  name: string;
  uid: string;
  namespace: string;
  attempt: number;
}

interface RawSandbox {
  id: string;
  metadata: RawMetadata | null;
  state: string;
  created_at: string;
  labels: Record<string, string>;
  annotations: Record<string, string>;
  runtime_handler: string;
}

interface RawStatus extends RawSandbox {
  network: { ip: string; additional_ips: { ip: string }[] } | null;
}

interface RawContainerMetadata {
  name: string;
  attempt: number;
}

interface RawContainer {
  id: string;
  pod_sandbox_id: string;
  metadata: RawContainerMetadata | null;
  image: { image: string } | null;
  image_ref: string;
  state: string;
  created_at: string;
  labels: Record<string, string>;
  annotations: Record<string, string>;
}

interface RawContainerStatus {
  id: string;
  metadata: RawContainerMetadata | null;
  state: string;
  created_at: string;
  started_at: string;
  finished_at: string;
  exit_code: number;
  image: { image: string } | null;
  image_ref: string;
  reason: string;
  message: string;
  labels: Record<string, string>;
  annotations: Record<string, string>;
  log_path: string;
}

const CONTAINER_STATES: Record<string, ContainerState> = {
  CONTAINER_CREATED: 'created',
  CONTAINER_RUNNING: 'running',
  CONTAINER_EXITED: 'exited',
  CONTAINER_UNKNOWN: 'unknown',
};

function toContainerState(s: string): ContainerState {
  return CONTAINER_STATES[s] ?? 'unknown';
}

function toContainer(r: RawContainer): Container {
  return {
    id: r.id,
    sandboxId: r.pod_sandbox_id,
    name: r.metadata?.name ?? '',
    attempt: r.metadata?.attempt ?? 0,
    image: r.image?.image ?? '',
    imageRef: r.image_ref,
    state: toContainerState(r.state),
    createdAtNs: BigInt(r.created_at || '0'),
    labels: { ...r.labels },
    annotations: { ...r.annotations },
  };
}

function rawNamespaces(n: NamespaceOptions): object {
  return { network: n.network, pid: n.pid, ipc: n.ipc, target_id: '' };
}

/** CRI `PodSandboxConfig` of `c`, as RunPodSandbox and CreateContainer send it. */
function rawSandboxConfig(c: SandboxConfig): object {
  return {
    metadata: { name: c.name, uid: c.uid, namespace: c.namespace, attempt: c.attempt ?? 0 },
    hostname: c.hostname ?? c.name,
    log_directory: c.logDirectory ?? '',
    port_mappings: (c.portMappings ?? []).map((p) => ({ protocol: p.protocol ?? 'TCP', container_port: p.containerPort, host_port: p.hostPort, host_ip: '' })),
    labels: c.labels ?? {},
    annotations: c.annotations ?? {},
    linux: {
      cgroup_parent: c.cgroupParent ?? '',
      ...(c.namespaces === undefined ? {} : { security_context: { namespace_options: rawNamespaces(c.namespaces) } }),
    },
  };
}

/** CRI `ContainerConfig` of `c`; int64 fields as decimal strings (proto-loader `longs: String`). */
function rawContainerConfig(c: ContainerConfig): object {
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
        namespace_options: rawNamespaces(sec.namespaces),
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

function toState(s: string): SandboxState {
  return s === 'SANDBOX_READY' ? 'ready' : 'notready';
}

function toSandbox(r: RawSandbox): Sandbox {
  return {
    id: r.id,
    name: r.metadata?.name ?? '',
    namespace: r.metadata?.namespace ?? '',
    uid: r.metadata?.uid ?? '',
    attempt: r.metadata?.attempt ?? 0,
    state: toState(r.state),
    createdAtNs: BigInt(r.created_at || '0'),
    labels: { ...r.labels },
    annotations: { ...r.annotations },
    runtimeHandler: r.runtime_handler,
  };
}

/**
 * CRI runtime client. Create with {@link CriClient.connect}; release with {@link CriClient.close}.
 */
export class CriClient {
  /** Where this client talks to. */
  readonly endpoint: RuntimeEndpoint;
  /** Per-call deadline, in seconds. */
  readonly timeoutSeconds: number;
  /** What the runtime answered to the `Version` handshake in {@link CriClient.connect}. */
  readonly runtimeVersion: RuntimeVersion;
  readonly #client: grpc.Client;
  #closed = false;

  private constructor(endpoint: RuntimeEndpoint, timeoutSeconds: number, client: grpc.Client, version: RuntimeVersion) {
    this.endpoint = endpoint;
    this.timeoutSeconds = timeoutSeconds;
    this.#client = client;
    this.runtimeVersion = version;
  }

  /**
   * Opens a channel to `endpoint` (`unix:///path`, `/path` or a resolved
   * {@link RuntimeEndpoint}) and checks it with a `Version` call.
   *
   * @throws AppError `RUNTIME_UNAVAILABLE` (socket missing, refused, deadline; retryable),
   *   `RUNTIME_PERMISSION_DENIED`, `RUNTIME_NOT_CRI` (a gRPC server without
   *   `runtime.v1.RuntimeService`), `RUNTIME_UNSUPPORTED_API` (the runtime answers only
   *   `runtime.v1alpha2`), `USAGE` (malformed endpoint).
   */
  static async connect(endpoint: string | RuntimeEndpoint, opts: CriClientOptions = {}): Promise<CriClient> {
    const ep = typeof endpoint === 'string' ? parseRuntimeEndpoint(endpoint) : endpoint;
    const timeoutSeconds = opts.timeoutSeconds ?? DEFAULT_TIMEOUT_SECONDS;
    await http2Preflight(ep, timeoutSeconds);
    const client = new grpc.Client(ep.url, grpc.credentials.createInsecure(), {
      // The kubelet's limit for CRI messages (16 MiB); ListPodSandbox on a big node stays far below.
      'grpc.max_receive_message_length': 16 * 1024 * 1024,
      // This channel's connection is its own and ends with close(): a long-lived process (the
      // daemon, which asks a runtime per heal) must not keep one connection per runtime it ever
      // asked in grpc-js's global subchannel pool.
      'grpc.use_local_subchannel_pool': 1,
    });
    try {
      const raw = await unary<{ runtime_api_version: string; version: string; runtime_name: string; runtime_version: string }>(
        client, ep, timeoutSeconds, 'Version', { version: '0.1.0' },
      ).catch(async (e: unknown) => {
        if (e instanceof AppError && e.code === 'RUNTIME_NOT_CRI') await probeOlderApi(client, ep, timeoutSeconds, e);
        throw e;
      });
      const version: RuntimeVersion = {
        version: raw.version,
        runtimeName: raw.runtime_name,
        runtimeVersion: raw.runtime_version,
        runtimeApiVersion: raw.runtime_api_version,
      };
      return new CriClient(ep, timeoutSeconds, client, version);
    } catch (e) {
      client.close();
      throw e;
    }
  }

  /** True after {@link CriClient.close}. */
  get closed(): boolean {
    return this.#closed;
  }

  /** Calls `Version` again (the handshake result is also in {@link CriClient.runtimeVersion}). */
  async version(): Promise<RuntimeVersion> {
    const r = await this.#call<{ version: string; runtime_name: string; runtime_version: string; runtime_api_version: string }>(
      'Version', { version: '0.1.0' },
    );
    return { version: r.version, runtimeName: r.runtime_name, runtimeVersion: r.runtime_version, runtimeApiVersion: r.runtime_api_version };
  }

  /**
   * Lists pod sandboxes in every state (CRI `ListPodSandbox`), optionally filtered.
   * NOTREADY sandboxes are included: they still own their IPs (ARCHITECTURE, reconciler rules).
   */
  async listPodSandboxes(filter?: SandboxFilter): Promise<Sandbox[]> {
    const req =
      filter === undefined
        ? {}
        : {
            filter: {
              id: filter.id ?? '',
              ...(filter.state === undefined
                ? {}
                : { state: { state: filter.state === 'ready' ? 'SANDBOX_READY' : 'SANDBOX_NOTREADY' } }),
              label_selector: filter.labelSelector ?? {},
            },
          };
    const r = await this.#call<{ items: RawSandbox[] }>('ListPodSandbox', req);
    return r.items.map(toSandbox);
  }

  /**
   * Status of one sandbox, including its pod IPs (CRI `PodSandboxStatus`).
   * @param verbose ask for runtime-specific `info` (containerd: a JSON string under `info`).
   * @throws AppError `RUNTIME_CALL_FAILED` with gRPC NOT_FOUND ({@link grpcStatusOf}) for an unknown id.
   */
  async podSandboxStatus(id: string, verbose = false): Promise<SandboxStatus> {
    const r = await this.#call<{ status: RawStatus | null; info: Record<string, string> }>('PodSandboxStatus', {
      pod_sandbox_id: id,
      verbose,
    });
    if (r.status === null) {
      throw new AppError('RUNTIME_CALL_FAILED', `CRI RuntimeService/PodSandboxStatus at ${this.endpoint.url} returned no status for ${id}`);
    }
    return {
      ...toSandbox(r.status),
      network: {
        ip: r.status.network?.ip ?? '',
        additionalIps: (r.status.network?.additional_ips ?? []).map((p) => p.ip),
      },
      info: { ...r.info },
    };
  }

  /**
   * Creates and starts a pod sandbox (CRI `RunPodSandbox`); the runtime runs CNI ADD.
   * For tests and the lab. Returns the sandbox id.
   */
  async runPodSandbox(config: SandboxConfig): Promise<string> {
    const r = await this.#call<{ pod_sandbox_id: string }>('RunPodSandbox', {
      config: rawSandboxConfig(config),
      runtime_handler: config.runtimeHandler ?? '',
    });
    return r.pod_sandbox_id;
  }

  /** Stops a sandbox (CRI `StopPodSandbox`); the runtime runs CNI DEL. Idempotent in the runtime. */
  async stopPodSandbox(id: string): Promise<void> {
    await this.#call('StopPodSandbox', { pod_sandbox_id: id });
  }

  /** Removes a sandbox (CRI `RemovePodSandbox`); stops it first if needed. For tests and the lab. */
  async removePodSandbox(id: string): Promise<void> {
    await this.#call('RemovePodSandbox', { pod_sandbox_id: id });
  }

  /**
   * Creates a container in sandbox `sandboxId` (CRI `CreateContainer`), state `created`. For tests
   * and the lab. `sandbox` is the sandbox's own config, sent again as a kubelet does (CRI: "the
   * same config that was passed to RunPodSandboxRequest"). Returns the container id.
   * @throws AppError `RUNTIME_CALL_FAILED` (e.g. gRPC NOT_FOUND for an unknown sandbox or image,
   *   see {@link grpcStatusOf}), or any code of {@link castGrpcError}.
   */
  async createContainer(sandboxId: string, config: ContainerConfig, sandbox: SandboxConfig): Promise<string> {
    const r = await this.#call<{ container_id: string }>('CreateContainer', {
      pod_sandbox_id: sandboxId,
      config: rawContainerConfig(config),
      sandbox_config: rawSandboxConfig(sandbox),
    });
    return r.container_id;
  }

  /** Starts a created container (CRI `StartContainer`). For tests and the lab. */
  async startContainer(id: string): Promise<void> {
    await this.#call('StartContainer', { container_id: id });
  }

  /**
   * Stops a container (CRI `StopContainer`): the image's stop signal (SIGTERM by default), SIGKILL
   * after `graceSeconds` (whole seconds; 0 = at once). Idempotent in the runtime. The call's
   * deadline is the client's plus `graceSeconds`, as the kubelet's (`remote_runtime.go`
   * StopContainer: "timeout + default timeout … to leave extra time for SIGKILL"). For tests and the lab.
   */
  async stopContainer(id: string, graceSeconds: number): Promise<void> {
    await this.#call('StopContainer', { container_id: id, timeout: String(graceSeconds) }, this.timeoutSeconds + graceSeconds);
  }

  /** Removes a container (CRI `RemoveContainer`), killing it first if it runs. Idempotent in the runtime. For tests and the lab. */
  async removeContainer(id: string): Promise<void> {
    await this.#call('RemoveContainer', { container_id: id });
  }

  /** Lists containers in every state (CRI `ListContainers`), optionally filtered (fields ANDed). */
  async listContainers(filter?: ContainerFilter): Promise<Container[]> {
    const req =
      filter === undefined
        ? {}
        : {
            filter: {
              id: filter.id ?? '',
              ...(filter.state === undefined ? {} : { state: { state: `CONTAINER_${filter.state.toUpperCase()}` } }),
              pod_sandbox_id: filter.sandboxId ?? '',
              label_selector: filter.labelSelector ?? {},
            },
          };
    const r = await this.#call<{ containers: RawContainer[] }>('ListContainers', req);
    return r.containers.map(toContainer);
  }

  /**
   * Status of one container (CRI `ContainerStatus`, not verbose).
   * @throws AppError `RUNTIME_CALL_FAILED` with gRPC NOT_FOUND ({@link grpcStatusOf}) for an unknown
   *   id, or without a gRPC status when the answer holds no status.
   */
  async containerStatus(id: string): Promise<ContainerStatus> {
    const r = await this.#call<{ status: RawContainerStatus | null }>('ContainerStatus', { container_id: id, verbose: false });
    if (r.status === null) {
      throw new AppError('RUNTIME_CALL_FAILED', `CRI RuntimeService/ContainerStatus at ${this.endpoint.url} returned no status for ${id}`);
    }
    const s = r.status;
    return {
      id: s.id,
      name: s.metadata?.name ?? '',
      attempt: s.metadata?.attempt ?? 0,
      state: toContainerState(s.state),
      exitCode: s.exit_code,
      reason: s.reason,
      message: s.message,
      image: s.image?.image ?? '',
      imageRef: s.image_ref,
      logPath: s.log_path,
      createdAtNs: BigInt(s.created_at || '0'),
      startedAtNs: BigInt(s.started_at || '0'),
      finishedAtNs: BigInt(s.finished_at || '0'),
      labels: { ...s.labels },
      annotations: { ...s.annotations },
    };
  }

  /** Closes the channel. Idempotent; later calls throw {@link ClosedError}. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#client.close();
  }

  /** One call with the client's deadline, or `timeoutSeconds` when given. */
  #call<T>(method: Method, req: object, timeoutSeconds = this.timeoutSeconds): Promise<T> {
    if (this.#closed) return Promise.reject(new ClosedError('CRI client'));
    return unary<T>(this.#client, this.endpoint, timeoutSeconds, method, req);
  }
}

/**
 * Does the socket at `ep` speak HTTP/2 (send its SETTINGS) within `timeoutSeconds`? A listener
 * that accepts and never answers (a socket of some other program found in a process's ancestry)
 * makes grpc-js keep its connection open after `close()` (measured: still open 25 s later), which
 * a long-lived daemon asking per heal would pile up. So a connection of our own is tried first and
 * always destroyed. Silent → `RUNTIME_UNAVAILABLE` with the text of a deadline on Version; any
 * other failure (missing, refused, permission) is left to the gRPC call, whose messages say it.
 */
function http2Preflight(ep: RuntimeEndpoint, timeoutSeconds: number): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    let done = false;
    const session = http2.connect('http://localhost', { createConnection: () => net.createConnection(ep.path) });
    const finish = (err: AppError | null): void => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      session.destroy();
      if (err === null) resolve();
      else reject(err);
    };
    const timer = setTimeout(
      () => finish(new AppError('RUNTIME_UNAVAILABLE', `CRI runtime at ${ep.url} did not answer RuntimeService/Version within ${timeoutSeconds}s`, { retryable: true })),
      timeoutSeconds * 1000,
    );
    session.once('remoteSettings', () => finish(null));
    session.once('error', () => finish(null));
    session.once('close', () => finish(null));
  });
}

/** One unary call with a deadline of `timeoutSeconds`; every failure leaves as an AppError ({@link castGrpcError}). */
function unary<T>(client: grpc.Client, ep: RuntimeEndpoint, timeoutSeconds: number, method: Method, req: object): Promise<T> {
  const def = methodDef(method);
  return new Promise<T>((resolve, reject) => {
    client.makeUnaryRequest(
      def.path,
      def.requestSerialize,
      def.responseDeserialize,
      req,
      new grpc.Metadata(),
      { deadline: Date.now() + timeoutSeconds * 1000 },
      (err, value) => {
        if (err) {
          const refused = err.code === grpc.status.UNAVAILABLE && /\bconnect ECONNREFUSED\b/.test(err.details);
          reject(castGrpcError(err, { endpoint: ep.url, method, timeoutSeconds, ...(refused ? { pathKind: socketPathKind(ep.path) } : {}) }));
        } else {
          resolve(value as T);
        }
      },
    );
  });
}

/**
 * After `runtime.v1` turned out unimplemented: if the server answers `runtime.v1alpha2` Version
 * (same message layout), it is a CRI runtime too old for us → throw `RUNTIME_UNSUPPORTED_API`;
 * otherwise return and let the caller throw `notCri`.
 */
async function probeOlderApi(client: grpc.Client, ep: RuntimeEndpoint, timeoutSeconds: number, notCri: AppError): Promise<void> {
  const def = methodDef('Version');
  const path = '/runtime.v1alpha2.RuntimeService/Version';
  const r = await new Promise<{ runtime_name: string; runtime_version: string; runtime_api_version: string } | undefined>((resolve) => {
    client.makeUnaryRequest(
      path,
      def.requestSerialize,
      def.responseDeserialize,
      { version: '0.1.0' },
      new grpc.Metadata(),
      { deadline: Date.now() + timeoutSeconds * 1000 },
      (err, value) => resolve(err ? undefined : (value as { runtime_name: string; runtime_version: string; runtime_api_version: string })),
    );
  });
  if (r === undefined) return;
  const who = [r.runtime_name, r.runtime_version].filter((s) => s !== '').join(' ');
  throw new AppError(
    'RUNTIME_UNSUPPORTED_API',
    `CRI runtime at ${ep.url}${who === '' ? '' : ` (${who})`} speaks only CRI ${r.runtime_api_version || 'v1alpha2'}; ipwarden needs runtime.v1`,
    { cause: notCri },
  );
}
