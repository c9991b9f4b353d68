/**
 * The DaemonSet of deploy/kubernetes/daemonset.yaml, run on the lab's containerd the way a
 * kubelet runs it (issue 10): the pod template is read from the manifest and turned into CRI calls
 * — RunPodSandbox (host network and PID namespace from `hostNetwork`/`hostPID`), then each init
 * container to completion, then the containers — with the manifest's volumes, mounts, arguments,
 * environment, security context and resources.
 *
 * The lab is a node whose host paths live in its scratch dir, so one mapping ({@link LabNode})
 * moves a host path of the manifest to the lab's directory, and it is applied everywhere a path of
 * the node appears: the `hostPath` of each volume, each `mountPath` that names a host path (the
 * manifest mounts every host path at the same path in the container, and the lab keeps that
 * rule), and each argument or environment value naming one (`--socket /run/ipwarden/plugin.sock`,
 * `unix:///run/containerd/containerd.sock`). The metrics port is moved to a free one of this
 * machine (host network: the manifest's 9617 may be taken by another test). What the kubelet would
 * add that ipwarden never reads (service-link variables, /etc/hosts management, the API token:
 * `automountServiceAccountToken: false`) is left out. Everything else comes from the manifest; a
 * field this module does not know how to run makes it throw rather than run something else.
 *
 * Facts about the kubelet's translation: the pod's `securityContext.capabilities` are passed as
 * names without `CAP_` (containerd adds it); `allowPrivilegeEscalation: false` is CRI
 * `no_new_privs`; `hostPID: true` is pid namespace NODE, otherwise CONTAINER; CPU requests become
 * `cpu_shares` = milli × 1024 / 1000 (minimum 2) and limits a CFS quota over a 100 ms period;
 * container logs go to `<log_directory>/<name>/<restart count>.log` in the CRI log format
 * (`<RFC 3339 time> <stream> <F|P> <text>`); `emptyDir` is a directory of the pod (mode 0777).
 */
import { spawn } from 'node:child_process';
import { createServer } from 'node:net';
import { chmodSync, existsSync, mkdirSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parse as parseYaml } from 'yaml';
import type { Lab } from './lab.ts';
import type { ContainerConfig as ContainerSpec, ContainerMount, ContainerStatus as ContainerStatusInfo, MountPropagation, NamespaceMode } from '../runtime/cri-client.ts';
import { PodCri, type PodSandboxSpec } from './pod-cri.ts';
import { run } from './proc.ts';

/** The repository's DaemonSet manifest. */
export const DAEMONSET_MANIFEST = fileURLToPath(new URL('../../deploy/kubernetes/daemonset.yaml', import.meta.url));

type Obj = Record<string, unknown>;

/** The lab as the node a DaemonSet pod runs on. */
export interface LabNode {
  /** Host path of the manifest → the lab's directory for it (longest prefix wins, by path component). */
  readonly paths: ReadonlyArray<readonly [string, string]>;
  /** Container/host port of the manifest → the port used on this machine. */
  readonly ports: ReadonlyMap<number, number>;
  /** `spec.nodeName` (the downward API's value). */
  readonly nodeName: string;
  /** `linux.cgroup_parent` of the pod. */
  readonly cgroupParent: string;
  /** Where the pod's own files go (logs, emptyDir volumes). */
  readonly podsDir: string;
}

/** What a pod spec turns into: the sandbox, the init containers and the containers, plus the directories to create first. */
export interface PodPlan {
  readonly sandbox: PodSandboxSpec;
  readonly initContainers: readonly ContainerSpec[];
  readonly containers: readonly ContainerSpec[];
  /** Directories a kubelet creates before the sandbox: `DirectoryOrCreate` host paths (0755) and emptyDirs (0777). */
  readonly createDirs: ReadonlyArray<{ readonly path: string; readonly mode: number }>;
  /** Host paths of `type: Directory` volumes: must exist. */
  readonly mustExist: readonly string[];
  /** `terminationGracePeriodSeconds`. */
  readonly graceSeconds: number;
  /** The readiness probe of each container: its HTTP path and (mapped) port. */
  readonly readiness: ReadonlyMap<string, { readonly path: string; readonly port: number }>;
}

function isObj(v: unknown): v is Obj {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function unsupported(what: string): never {
  throw new Error(`the lab's kubelet does not run ${what} (src/lab/daemonset.ts)`);
}

/** `p` with the node's path mapping applied (unchanged when no mapped prefix covers it). */
export function mapPath(node: LabNode, p: string): string {
  let best: readonly [string, string] | undefined;
  for (const entry of node.paths) {
    const [from] = entry;
    if ((p === from || p.startsWith(`${from}/`)) && (best === undefined || from.length > best[0].length)) best = entry;
  }
  return best === undefined ? p : best[1] + p.slice(best[0].length);
}

/** An argument or environment value with the node's paths and ports applied: `/path…`, `unix:///path…`, `HOST:PORT`. */
export function mapValue(node: LabNode, v: string): string {
  if (v.startsWith('unix://')) return `unix://${mapPath(node, v.slice('unix://'.length))}`;
  if (v.startsWith('/')) return mapPath(node, v);
  const m = /^(.*):(\d{1,5})$/.exec(v);
  if (m !== null) {
    const to = node.ports.get(Number(m[2]));
    if (to !== undefined) return `${m[1] as string}:${to}`;
  }
  return v;
}

/** Kubernetes quantity → bytes (`256Mi`, `1Gi`, `64M`, plain number). */
export function memoryBytes(q: string): number {
  const m = /^(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?$/.exec(q);
  if (m === null) throw new Error(`not a memory quantity: ${q}`);
  const mult: Record<string, number> = { Ki: 2 ** 10, Mi: 2 ** 20, Gi: 2 ** 30, Ti: 2 ** 40, k: 1e3, M: 1e6, G: 1e9, T: 1e12 };
  return Math.round(Number(m[1]) * (m[2] === undefined ? 1 : (mult[m[2]] as number)));
}

/** Kubernetes CPU quantity → millicores (`50m`, `1`, `0.5`). */
export function milliCpu(q: string | number): number {
  const s = String(q);
  const m = /^(\d+(?:\.\d+)?)(m)?$/.exec(s);
  if (m === null) throw new Error(`not a CPU quantity: ${s}`);
  return m[2] === 'm' ? Number(m[1]) : Math.round(Number(m[1]) * 1000);
}

const PROPAGATION: Record<string, MountPropagation> = {
  None: 'PROPAGATION_PRIVATE',
  HostToContainer: 'PROPAGATION_HOST_TO_CONTAINER',
  Bidirectional: 'PROPAGATION_BIDIRECTIONAL',
};

/**
 * Turns a DaemonSet object into the CRI requests a kubelet makes for one of its pods on `node`.
 * Pure. `pod` names the pod (`name`, `uid`).
 * @throws Error for a field the lab's kubelet cannot run (another volume type, a probe that is not
 *   HTTP on a named or numbered port, a `valueFrom` other than `spec.nodeName`).
 */
export function planPod(ds: unknown, node: LabNode, pod: { name: string; uid: string }): PodPlan {
  const template = isObj(ds) && isObj(ds['spec']) ? (ds['spec'] as Obj)['template'] : undefined;
  if (!isObj(template) || !isObj(template['spec'])) throw new Error('not a DaemonSet with spec.template.spec');
  const spec = template['spec'] as Obj;
  const meta = isObj(template['metadata']) ? (template['metadata'] as Obj) : {};
  const namespace = isObj(ds) && isObj(ds['metadata']) ? String((ds['metadata'] as Obj)['namespace'] ?? 'default') : 'default';
  const hostNetwork = spec['hostNetwork'] === true;
  const hostPID = spec['hostPID'] === true;
  const hostIPC = spec['hostIPC'] === true;
  const podNs = { network: (hostNetwork ? 'NODE' : 'POD') as NamespaceMode, pid: (hostPID ? 'NODE' : 'CONTAINER') as NamespaceMode, ipc: (hostIPC ? 'NODE' : 'POD') as NamespaceMode };
  const podDir = join(node.podsDir, `${namespace}_${pod.name}_${pod.uid}`);

  const createDirs: { path: string; mode: number }[] = [];
  const mustExist: string[] = [];
  const volumes = new Map<string, string>();
  for (const v of (spec['volumes'] ?? []) as Obj[]) {
    const name = String(v['name']);
    if (isObj(v['hostPath'])) {
      const hp = v['hostPath'] as Obj;
      const path = mapPath(node, String(hp['path']));
      const type = String(hp['type'] ?? '');
      if (type !== 'DirectoryOrCreate' && type !== 'Directory') unsupported(`hostPath type ${JSON.stringify(type)} (volume ${name})`);
      // Every host path must move to the lab's: an unmapped one would be this machine's own (a
      // daemon watching /opt/cni would reinstall into the machine's /opt/cni/bin).
      if (path === String(hp['path'])) unsupported(`hostPath ${JSON.stringify(hp['path'])} (volume ${name}): the lab node maps no prefix of it`);
      if (type === 'DirectoryOrCreate') createDirs.push({ path, mode: 0o755 });
      else mustExist.push(path);
      volumes.set(name, path);
    } else if (isObj(v['emptyDir'])) {
      const path = join(podDir, 'volumes', 'kubernetes.io~empty-dir', name);
      createDirs.push({ path, mode: 0o777 });
      volumes.set(name, path);
    } else unsupported(`volume ${name}: only hostPath and emptyDir`);
  }

  const readiness = new Map<string, { path: string; port: number }>();
  const containerSpec = (c: Obj): ContainerSpec => {
    const name = String(c['name']);
    const ports = new Map<string, number>();
    for (const p of (c['ports'] ?? []) as Obj[]) {
      const n = Number(p['containerPort']);
      ports.set(String(p['name'] ?? n), node.ports.get(n) ?? n);
    }
    const probe = c['readinessProbe'];
    if (isObj(probe)) {
      const http = probe['httpGet'];
      if (!isObj(http)) unsupported(`a readiness probe of ${name} that is not httpGet`);
      const port = typeof http['port'] === 'number' ? (node.ports.get(http['port']) ?? http['port']) : ports.get(String(http['port']));
      if (port === undefined) unsupported(`a readiness probe port ${String(http['port'])} of ${name}`);
      readiness.set(name, { path: String(http['path'] ?? '/'), port });
    }
    const mounts: ContainerMount[] = ((c['volumeMounts'] ?? []) as Obj[]).map((m) => {
      const vol = volumes.get(String(m['name']));
      if (vol === undefined) throw new Error(`container ${name} mounts the unknown volume ${String(m['name'])}`);
      const prop = PROPAGATION[String(m['mountPropagation'] ?? 'None')];
      if (prop === undefined) unsupported(`mountPropagation ${String(m['mountPropagation'])}`);
      return { containerPath: mapPath(node, String(m['mountPath'])), hostPath: vol, readonly: m['readOnly'] === true, propagation: prop };
    });
    const env = ((c['env'] ?? []) as Obj[]).map((e) => {
      const key = String(e['name']);
      if (typeof e['value'] === 'string') return { key, value: mapValue(node, e['value']) };
      const ref = isObj(e['valueFrom']) && isObj((e['valueFrom'] as Obj)['fieldRef']) ? ((e['valueFrom'] as Obj)['fieldRef'] as Obj)['fieldPath'] : undefined;
      if (ref === 'spec.nodeName') return { key, value: node.nodeName };
      // The lab's node listens on loopback: its "node IP" is 127.0.0.1.
      if (ref === 'status.hostIP') return { key, value: '127.0.0.1' };
      return unsupported(`env ${key}: only a value or fieldRef spec.nodeName or status.hostIP`);
    });
    // The kubelet expands $(NAME) in command and args from the container's env (an undefined
    // name stays as written; $$ is a literal $).
    const envOf = new Map(env.map((e) => [e.key, e.value]));
    const expand = (a: string): string => a.replace(/\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g, (m, n: string | undefined) => (n === undefined ? '$' : (envOf.get(n) ?? m)));
    const sc = isObj(c['securityContext']) ? (c['securityContext'] as Obj) : {};
    const caps = isObj(sc['capabilities']) ? (sc['capabilities'] as Obj) : {};
    const res = isObj(c['resources']) ? (c['resources'] as Obj) : {};
    const limits = isObj(res['limits']) ? (res['limits'] as Obj) : {};
    const requests = isObj(res['requests']) ? (res['requests'] as Obj) : {};
    const cpuLimit = limits['cpu'] === undefined ? 0 : milliCpu(limits['cpu'] as string);
    const cpuRequest = requests['cpu'] === undefined ? cpuLimit : milliCpu(requests['cpu'] as string);
    const apparmor = isObj(sc['appArmorProfile']) ? String((sc['appArmorProfile'] as Obj)['type']) : undefined;
    return {
      name,
      image: String(c['image']),
      command: ((c['command'] ?? []) as unknown[]).map((a) => mapValue(node, expand(String(a)))),
      args: ((c['args'] ?? []) as unknown[]).map((a) => mapValue(node, expand(String(a)))),
      env,
      mounts,
      logPath: `${name}/0.log`,
      labels: { 'io.kubernetes.container.name': name },
      security: {
        addCapabilities: ((caps['add'] ?? []) as string[]).slice(),
        dropCapabilities: ((caps['drop'] ?? []) as string[]).slice(),
        ...(typeof sc['runAsUser'] === 'number' ? { runAsUser: sc['runAsUser'] } : {}),
        ...(typeof sc['runAsGroup'] === 'number' ? { runAsGroup: sc['runAsGroup'] } : {}),
        readonlyRootfs: sc['readOnlyRootFilesystem'] === true,
        noNewPrivs: sc['allowPrivilegeEscalation'] === false,
        ...(apparmor === 'Unconfined' ? { apparmorProfile: 'unconfined' } : apparmor === 'RuntimeDefault' ? { apparmorProfile: 'runtime/default' } : {}),
        ...(isObj(sc['seLinuxOptions']) && typeof (sc['seLinuxOptions'] as Obj)['type'] === 'string' ? { seLinuxType: (sc['seLinuxOptions'] as Obj)['type'] as string } : {}),
        namespaces: podNs,
      },
      resources: {
        cpuPeriod: cpuLimit > 0 ? 100_000 : 0,
        cpuQuota: cpuLimit > 0 ? cpuLimit * 100 : 0,
        cpuShares: cpuRequest > 0 ? Math.max(2, Math.floor((cpuRequest * 1024) / 1000)) : 2,
        memoryLimitBytes: limits['memory'] === undefined ? 0 : memoryBytes(String(limits['memory'])),
      },
    };
  };
  const initContainers = ((spec['initContainers'] ?? []) as Obj[]).map(containerSpec);
  const containers = ((spec['containers'] ?? []) as Obj[]).map(containerSpec);
  const portMappings = containers.flatMap((c) => {
    const src = ((spec['containers'] as Obj[]).find((x) => x['name'] === c.name)?.['ports'] ?? []) as Obj[];
    return src.map((p) => ({ containerPort: node.ports.get(Number(p['containerPort'])) ?? Number(p['containerPort']), hostPort: node.ports.get(Number(p['hostPort'])) ?? Number(p['hostPort'] ?? 0), protocol: (String(p['protocol'] ?? 'TCP') as 'TCP' | 'UDP' | 'SCTP') }));
  });
  const labels: Record<string, string> = {};
  for (const [k, v] of Object.entries(isObj(meta['labels']) ? (meta['labels'] as Obj) : {})) labels[k] = String(v);
  return {
    sandbox: {
      name: pod.name,
      uid: pod.uid,
      namespace,
      hostname: hostNetwork ? '' : pod.name,
      logDirectory: join(podDir, 'logs'),
      labels: { ...labels, 'io.kubernetes.pod.name': pod.name, 'io.kubernetes.pod.namespace': namespace, 'io.kubernetes.pod.uid': pod.uid },
      cgroupParent: node.cgroupParent,
      namespaces: podNs,
      portMappings,
    },
    initContainers,
    containers,
    createDirs,
    mustExist,
    graceSeconds: Number(spec['terminationGracePeriodSeconds'] ?? 30),
    readiness,
  };
}

/** The DaemonSet object of `path` (default the repository's manifest). @throws Error when the file holds no DaemonSet. */
export function loadDaemonSet(path: string = DAEMONSET_MANIFEST): Obj {
  const ds = parseYaml(readFileSync(path, 'utf8')) as unknown;
  if (!isObj(ds) || ds['kind'] !== 'DaemonSet') throw new Error(`${path} holds no DaemonSet`);
  return ds;
}

/** A free TCP port of this machine on 0.0.0.0 (bound and released; the caller binds it next). */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.once('error', reject);
    srv.listen(0, '0.0.0.0', () => {
      const a = srv.address();
      srv.close(() => (typeof a === 'object' && a !== null ? resolve(a.port) : reject(new Error('no port'))));
    });
  });
}

/**
 * The lab as a node for the manifest: `/opt/cni/bin` → its CNI bin dir (and `/opt/cni` → its
 * parent, which the daemon watches the bin dir through), `/etc/cni/net.d` → its
 * conf dir, `/var/lib/cni/networks` → its data dir, `/run/ipwarden` → its daemon socket dir,
 * `/run/containerd` → its containerd run dir (the CRI socket `containerd.sock`), `/run/netns` and
 * `/var/run/netns` (one directory: `/var/run` is `/run`) → `<scratch>/node/run/netns`; the
 * manifest's metrics and probe ports (9617, 9618) → free ports.
 */
export async function labNode(lab: Lab, manifestPorts: readonly number[] = [9617, 9618]): Promise<LabNode> {
  const ports = new Map<number, number>();
  for (const p of manifestPorts) ports.set(p, await freePort());
  const netns = join(lab.scratch, 'node', 'run', 'netns');
  return {
    paths: [
      ['/opt/cni/bin', lab.binDir],
      ['/opt/cni', join(lab.binDir, '..')],
      ['/etc/cni/net.d', lab.confDir],
      ['/var/lib/cni/networks', lab.dataDir],
      ['/run/ipwarden', join(lab.pluginSocket, '..')],
      ['/run/containerd', join(lab.socketPath, '..')],
      ['/run/netns', netns],
      ['/var/run/netns', netns],
    ],
    ports,
    nodeName: `ipwarden-lab-${lab.tag}`,
    cgroupParent: lab.cgroupParent,
    podsDir: join(lab.scratch, 'node', 'pods'),
  };
}

/** One line of a CRI container log: time, stream, text (partial lines joined). */
export interface LogEntry {
  readonly time: string;
  readonly stream: 'stdout' | 'stderr';
  readonly text: string;
}

/** Parses a CRI log file (`<time> <stream> <F|P> <text>` lines; `P` = partial, continued by the next). */
export function readCriLog(path: string): LogEntry[] {
  let raw: string;
  try {
    raw = readFileSync(path, 'utf8');
  } catch {
    return [];
  }
  const out: LogEntry[] = [];
  let pending = '';
  for (const line of raw.split('\n')) {
    const m = /^(\S+) (stdout|stderr) ([FP]) ?(.*)$/.exec(line);
    if (m === null) continue;
    pending += m[4] as string;
    if (m[3] === 'F') {
      out.push({ time: m[1] as string, stream: m[2] as 'stdout' | 'stderr', text: pending });
      pending = '';
    }
  }
  return out;
}

/** Resolves once `cond()` returns a value other than undefined; polls every `everyMs`; rejects with `what` after `timeoutSeconds`. */
export async function pollUntil<T>(what: string, timeoutSeconds: number, cond: () => Promise<T | undefined> | T | undefined, everyMs = 100): Promise<T> {
  const until = Date.now() + timeoutSeconds * 1000;
  for (;;) {
    const v = await cond();
    if (v !== undefined) return v;
    if (Date.now() >= until) throw new Error(`timed out after ${timeoutSeconds} s waiting for ${what}`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}

/** A running DaemonSet pod on the lab. */
export interface DaemonSetPod {
  readonly plan: PodPlan;
  readonly sandboxId: string;
  /** Init containers: name → final status (exited). */
  readonly initStatus: ReadonlyMap<string, ContainerStatusInfo>;
  /** Containers: name → id. */
  readonly containerIds: ReadonlyMap<string, string>;
  /** Milliseconds: sandbox, each init container, each container until ready. */
  readonly timings: Readonly<Record<string, number>>;
  /** The log of container `name` (init or not). */
  log(name: string): LogEntry[];
  /** The JSON lines (pino) of container `name`'s log. */
  jsonLog(name: string): Array<Record<string, unknown> & { msg?: string }>;
  status(name: string): Promise<ContainerStatusInfo>;
  /**
   * What the kubelet does when the pod is deleted: StopContainer of each container with the
   * pod's grace period, then StopPodSandbox. Resolves with the containers' final statuses.
   */
  stop(): Promise<Map<string, ContainerStatusInfo>>;
  /** RemovePodSandbox (after {@link DaemonSetPod.stop}). */
  remove(): Promise<void>;
  /** Closes the pod's CRI client (idempotent). */
  close(): void;
}

/** Options of {@link runDaemonSetPod}. */
export interface RunPodOptions {
  /** The DaemonSet object (default: {@link loadDaemonSet}()). */
  daemonSet?: Obj;
  /** Pod name (default `ipwarden-<tag>`) and uid (default `<tag>-ds-<n>`). */
  name?: string;
  uid?: string;
  /** Deadline of each wait (an init container's exit, a container's readiness), seconds. Default 120. */
  timeoutSeconds?: number;
}

/**
 * Runs one pod of the DaemonSet on the lab, the way a kubelet does: creates the directories,
 * RunPodSandbox, each init container in order to completion (exit status 0 required), then each
 * container, and waits until every container with a readiness probe answers it with 200.
 * @throws Error when an init container exits non-zero (with its log), a container exits, or a
 *   wait times out; what was created is left for {@link Lab.stop} (it removes every sandbox).
 */
export async function runDaemonSetPod(lab: Lab, node: LabNode, opts: RunPodOptions = {}): Promise<DaemonSetPod> {
  const ds = opts.daemonSet ?? loadDaemonSet();
  const name = opts.name ?? `ipwarden-${lab.tag}`;
  const uid = opts.uid ?? `${lab.tag}-ds-${Date.now().toString(36)}`;
  const plan = planPod(ds, node, { name, uid });
  const timeout = opts.timeoutSeconds ?? 120;
  const timings: Record<string, number> = {};
  for (const p of plan.mustExist) if (!existsSync(p) || !statSync(p).isDirectory()) throw new Error(`hostPath ${p} (type Directory) does not exist`);
  for (const d of plan.createDirs) {
    if (!existsSync(d.path)) {
      mkdirSync(d.path, { recursive: true, mode: d.mode });
      chmodSync(d.path, d.mode);
    }
  }
  mkdirSync(plan.sandbox.logDirectory, { recursive: true });
  const cri = PodCri.open(lab.endpoint);
  let t = performance.now();
  const sandboxId = await cri.runPodSandbox(plan.sandbox);
  timings['sandbox'] = Math.round(performance.now() - t);
  const logOf = (c: string): string => join(plan.sandbox.logDirectory, `${c}/0.log`);
  const tail = (c: string): string => readCriLog(logOf(c)).slice(-20).map((e) => e.text).join('\n');
  const initStatus = new Map<string, ContainerStatusInfo>();
  for (const c of plan.initContainers) {
    t = performance.now();
    const id = await cri.createContainer(sandboxId, plan.sandbox, c);
    await cri.startContainer(id);
    const st = await pollUntil(`init container ${c.name} to exit`, timeout, async () => {
      const s = await cri.containerStatus(id);
      return s.state === 'exited' ? s : undefined;
    });
    timings[c.name] = Math.round(performance.now() - t);
    initStatus.set(c.name, st);
    if (st.exitCode !== 0) throw new Error(`init container ${c.name} exited ${st.exitCode} (${st.reason} ${st.message}); log:\n${tail(c.name)}`);
  }
  const containerIds = new Map<string, string>();
  for (const c of plan.containers) {
    t = performance.now();
    const id = await cri.createContainer(sandboxId, plan.sandbox, c);
    await cri.startContainer(id);
    containerIds.set(c.name, id);
    const probe = plan.readiness.get(c.name);
    await pollUntil(`container ${c.name} to be ready${probe === undefined ? '' : ` (GET ${probe.path} on port ${probe.port})`}`, timeout, async () => {
      const s = await cri.containerStatus(id);
      if (s.state === 'exited') throw new Error(`container ${c.name} exited ${s.exitCode} (${s.reason}); log:\n${tail(c.name)}`);
      if (s.state !== 'running') return undefined;
      if (probe === undefined) return true;
      const ok = await fetch(`http://127.0.0.1:${probe.port}${probe.path}`).then((r) => r.status === 200, () => false);
      return ok ? true : undefined;
    });
    timings[c.name] = Math.round(performance.now() - t);
  }
  const statusOf = (n: string): Promise<ContainerStatusInfo> => {
    const id = containerIds.get(n);
    if (id === undefined) throw new Error(`no container ${n}`);
    return cri.containerStatus(id);
  };
  return {
    plan,
    sandboxId,
    initStatus,
    containerIds,
    timings,
    log: (c) => readCriLog(logOf(c)),
    jsonLog: (c) =>
      readCriLog(logOf(c)).flatMap((e) => {
        try {
          const v = JSON.parse(e.text) as unknown;
          return isObj(v) ? [v as Record<string, unknown> & { msg?: string }] : [];
        } catch {
          return [];
        }
      }),
    status: statusOf,
    stop: async () => {
      const out = new Map<string, ContainerStatusInfo>();
      for (const [n, id] of containerIds) {
        await cri.stopContainer(id, plan.graceSeconds);
        out.set(n, await cri.containerStatus(id));
      }
      await cri.stopPodSandbox(sandboxId);
      return out;
    },
    remove: () => cri.removePodSandbox(sandboxId),
    close: () => cri.close(),
  };
}

/** An image as containerd lists it after `ctr images import`. */
export interface ImportedImage {
  readonly ref: string;
  /** The digest `ctr images ls` shows: the target's (the image index's for ours). */
  readonly digest: string;
}

/**
 * `ctr -n k8s.io images pull --plain-http <ref>` into the lab's containerd (the node's platform
 * unpacked for its snapshotter, so the CRI can create containers of it), then `ctr images ls` for
 * `ref`: what a node does with an image in a registry (plain HTTP: a loopback registry).
 * @throws Error when the pull fails or `ref` is not listed afterwards.
 */
export async function pullImage(lab: Lab, ref: string): Promise<ImportedImage> {
  await run('ctr', ['--address', lab.socketPath, '-n', 'k8s.io', 'images', 'pull', '--plain-http', ref], { timeoutSeconds: 300 });
  const { stdout } = await run('ctr', ['--address', lab.socketPath, '-n', 'k8s.io', 'images', 'ls']);
  const line = stdout.split('\n').map((l) => l.trim().split(/\s+/)).find((cols) => cols[0] === ref);
  if (line === undefined || line[2] === undefined) throw new Error(`ctr images ls does not list ${ref} after the pull:\n${stdout}`);
  return { ref, digest: line[2] };
}

/**
 * `ctr -n k8s.io images import <archive>` into the lab's containerd (unpacked for its snapshotter,
 * so the CRI can create containers of it), then `ctr images ls` for the ref `name`.
 * @throws Error when the import fails or `name` is not listed afterwards.
 */
export async function importImage(lab: Lab, archive: string, name: string): Promise<ImportedImage> {
  await run('ctr', ['--address', lab.socketPath, '-n', 'k8s.io', 'images', 'import', archive], { timeoutSeconds: 300 });
  const { stdout } = await run('ctr', ['--address', lab.socketPath, '-n', 'k8s.io', 'images', 'ls']);
  const line = stdout.split('\n').map((l) => l.trim().split(/\s+/)).find((cols) => cols[0] === name);
  if (line === undefined || line[2] === undefined) throw new Error(`ctr images ls does not list ${name} after the import:\n${stdout}`);
  return { ref: name, digest: line[2] };
}

/** What a process run in a container printed, and how it ended. */
export interface ExecResult {
  readonly exitCode: number | null;
  readonly stdout: Buffer;
  readonly stderr: string;
}

let execCounter = 0;

/**
 * Runs `args` in the running container `containerId` of the lab, as `kubectl exec` does through
 * the kubelet (a process in the container's namespaces, cgroup and security context):
 * `ctr -n k8s.io tasks exec --exec-id <unique> <containerId> …`, `input` on its stdin (closed
 * after). Resolves with its exit status, stdout (bytes) and stderr; rejects only when ctr cannot
 * start or does not finish within `timeoutSeconds` (default 60; then it is killed).
 */
export function execInContainer(lab: Lab, containerId: string, args: readonly string[], input: Buffer | string = '', timeoutSeconds = 60): Promise<ExecResult> {
  return new Promise((resolve, reject) => {
    const execId = `ipwarden-lab-exec-${process.pid}-${++execCounter}`;
    const child = spawn('ctr', ['--address', lab.socketPath, '-n', 'k8s.io', 'tasks', 'exec', '--exec-id', execId, containerId, ...args], { stdio: ['pipe', 'pipe', 'pipe'] });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    child.stdout.on('data', (c: Buffer) => out.push(c));
    child.stderr.on('data', (c: Buffer) => err.push(c));
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutSeconds * 1000);
    child.once('error', (e) => {
      clearTimeout(timer);
      reject(new Error(`ctr tasks exec: ${e.message}`));
    });
    child.once('close', (code, sig) => {
      clearTimeout(timer);
      if (sig === 'SIGKILL') reject(new Error(`ctr tasks exec ${args.join(' ')}: no answer within ${timeoutSeconds} s`));
      else resolve({ exitCode: code, stdout: Buffer.concat(out), stderr: Buffer.concat(err).toString('utf8') });
    });
    child.stdin.on('error', () => {}); // a command that does not read its stdin
    child.stdin.end(input);
  });
}
