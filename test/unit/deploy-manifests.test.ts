/**
 * The Kubernetes manifests of deploy/kubernetes/ (issue 10, docs/deploy.md):
 *
 * - every YAML document parses and validates against the Kubernetes API's OpenAPI schemas
 *   (`kubernetes-models`, `@kubernetes-models/prometheus-operator` for the CRDs), and carries no
 *   field the schema does not know: those schemas do not forbid extra properties, but an API server
 *   with strict field validation (kubectl's default since 1.27) rejects them, so {@link validateStrict}
 *   records which properties the validator read and fails on any it never looked at;
 * - both checks are shown to fail (a wrong type, an unknown field at several depths);
 * - the DaemonSet has what the issue asks for (host network and PID namespace, the host mounts at
 *   the paths the daemon's flags name, the init step running `install-cni`, priority, tolerations,
 *   resources within the measured memory, read-only root, capabilities, probes, the metrics port);
 * - the daemon's and install-cni's arguments are flags those verbs accept (through `runMain` with
 *   an injected starter, and their `--help`);
 * - the DaemonSet runs the image `npm run image` builds (name, version, its entrypoint), and its pod
 *   template turns into the CRI requests the lab's kubelet makes (src/lab/daemonset.ts: the paths,
 *   port, namespaces, mounts, capabilities and resources the e2e run uses);
 * - the PrometheusRule holds exactly the alert rules of docs/metrics.md, the ServiceMonitor and
 *   Service select the DaemonSet's pods with the job label the rules expect, and
 *   kustomization.yaml lists every manifest.
 */
import { spawnSync } from 'node:child_process';
import { strict as assert } from 'node:assert';
import { describe, it } from 'node:test';
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join, posix, resolve } from 'node:path';
import { parseAllDocuments, parse as parseYaml } from 'yaml';
import type { DaemonOptions } from '../../src/common/daemon-options.ts';
import type { CliContext } from '../../src/cli/context.ts';
import { runMain } from '../../src/cli/main.ts';
import { validateSocketPath } from '../../src/cli/install-cni.ts';
import { DEFAULT_NETNS_DIRS } from '../../src/node/kernel-evidence.ts';
import { at, isObj, MODELS, validateStrict, type Obj } from '../helpers/k8s-validate.ts';
import { k8sTools } from '../helpers/k8s-tools.ts';
import { mapPath, mapValue, memoryBytes, milliCpu, planPod, type LabNode } from '../../src/lab/daemonset.ts';

const ROOT = resolve(import.meta.dirname, '../..');
const DIR = join(ROOT, 'deploy/kubernetes');

/** The Prometheus Operator objects: a kustomize Component beside the core. */
const MONITORING = join(ROOT, 'deploy/components/monitoring');
/** The overlay of the core plus the monitoring component. */
const OVERLAY = join(ROOT, 'deploy/overlays/monitoring');

/** Every manifest of `dirs` (default: the core and the monitoring component): file name → its parsed documents. */
function loadManifests(dirs: readonly string[] = [DIR, MONITORING]): Map<string, unknown[]> {
  const out = new Map<string, unknown[]>();
  for (const [dir, name] of dirs.flatMap((d) => readdirSync(d).sort().map((n) => [d, n] as const))) {
    if (!name.endsWith('.yaml') || name === 'kustomization.yaml') continue;
    const docs = parseAllDocuments(readFileSync(join(dir, name), 'utf8'));
    const values = docs.map((d, i) => {
      assert.deepEqual(d.errors, [], `${name} document ${i}`);
      return d.toJS({ maxAliasCount: 0 }) as unknown;
    });
    out.set(name, values);
  }
  return out;
}

const manifests = loadManifests();
const allDocs = [...manifests.values()].flat();

function only(kind: string): Obj {
  const found = allDocs.filter((d) => isObj(d) && d.kind === kind);
  assert.equal(found.length, 1, `exactly one ${kind}`);
  return found[0] as Obj;
}


function clone<T>(v: T): T {
  return structuredClone(v);
}

interface Container {
  name: string;
  args?: string[];
  command?: string[];
  env?: Obj[];
  ports?: Obj[];
  volumeMounts?: { name: string; mountPath: string; readOnly?: boolean; mountPropagation?: string }[];
  securityContext?: Obj;
  resources?: { requests?: Record<string, string>; limits?: Record<string, string> };
  livenessProbe?: Obj;
  readinessProbe?: Obj;
}
interface Volume {
  name: string;
  hostPath?: { path: string; type?: string };
  emptyDir?: Obj;
}

const ds = only('DaemonSet');
const podSpec = at(ds, 'spec', 'template', 'spec') as Obj;
const containers = podSpec.containers as Container[];
const initContainers = (podSpec.initContainers ?? []) as Container[];
const volumes = podSpec.volumes as Volume[];
const daemonC = containers.find((c) => c.name === 'ipwarden') as Container;
const initC = initContainers.find((c) => c.name === 'install-cni') as Container;

/** The value after `--flag` in args (the manifest passes each flag and its value as two items). */
function flag(args: readonly string[], name: string): string | undefined {
  const i = args.indexOf(name);
  return i < 0 ? undefined : args[i + 1];
}

function hostPathVolume(path: string): Volume {
  const v = volumes.find((x) => x.hostPath?.path === path);
  assert.ok(v !== undefined, `a hostPath volume of ${path}`);
  return v;
}

/** The mount of `c` whose mountPath is `path` or an ancestor of it, and the volume behind it. */
function mountCovering(c: Container, path: string): { mountPath: string; volume: Volume; readOnly: boolean; propagation: string | undefined } | null {
  let best: { mountPath: string; volume: Volume; readOnly: boolean; propagation: string | undefined } | null = null;
  for (const m of c.volumeMounts ?? []) {
    const mp = m.mountPath.replace(/\/$/, '');
    if (path !== mp && !path.startsWith(`${mp}/`)) continue;
    if (best !== null && best.mountPath.length >= mp.length) continue;
    const volume = volumes.find((v) => v.name === m.name);
    assert.ok(volume !== undefined, `volume ${m.name} of mount ${m.mountPath}`);
    best = { mountPath: mp, volume, readOnly: m.readOnly === true, propagation: m.mountPropagation };
  }
  return best;
}

/** The host path the container sees at `path` (null when it is not a hostPath mount). */
function hostPathAt(c: Container, path: string): string | null {
  const m = mountCovering(c, path);
  if (m === null || m.volume.hostPath === undefined) return null;
  return posix.join(m.volume.hostPath.path, path.slice(m.mountPath.length));
}

/** A Kubernetes memory quantity in bytes (the suffixes used here). */
function bytes(q: string): number {
  const m = /^(\d+(?:\.\d+)?)(Ki|Mi|Gi|k|M|G)?$/.exec(q);
  assert.ok(m !== null, `memory quantity ${q}`);
  const mult: Record<string, number> = { Ki: 2 ** 10, Mi: 2 ** 20, Gi: 2 ** 30, k: 1e3, M: 1e6, G: 1e9 };
  return Number(m[1]) * (m[2] === undefined ? 1 : (mult[m[2]] as number));
}

/** The long flags a verb's `--help` lists. */
async function helpFlags(verb: string): Promise<Set<string>> {
  let out = '';
  const ctx: CliContext = { stdout: (t) => void (out += t), stderr: (t) => void (out += t), env: {}, now: () => 0 };
  const code = await runMain([verb, '--help'], ctx);
  assert.equal(code, 0, out);
  return new Set([...out.matchAll(/(?:^|\s)(--[a-z][a-z-]*)/g)].map((m) => m[1] as string));
}

describe('deploy/kubernetes: schema validation', () => {
  it('every manifest parses into API objects of a known kind', () => {
    assert.ok(manifests.size >= 5, [...manifests.keys()].join(', '));
    for (const [name, docs] of manifests) {
      assert.ok(docs.length > 0, `${name} has a document`);
      for (const d of docs) assert.ok(isObj(d) && `${String(d.apiVersion)}/${String(d.kind)}` in MODELS, `${name}: ${JSON.stringify(d).slice(0, 80)}`);
    }
  });

  for (const [name, docs] of manifests) {
    it(`${name} validates against the API schema with no unknown field`, () => {
      for (const d of docs) validateStrict(d);
    });
  }

  it('a wrong field type fails the schema check', () => {
    const bad = clone(ds);
    (at(bad, 'spec', 'template', 'spec') as Obj).hostPID = 'yes';
    assert.throws(() => validateStrict(bad), /hostPID must be boolean/);
    const badPort = clone(ds);
    ((at(badPort, 'spec', 'template', 'spec', 'containers', 0, 'ports', 0) as Obj).containerPort) = '9617';
    assert.throws(() => validateStrict(badPort), /containerPort must be integer/);
    const badRule = clone(only('PrometheusRule'));
    (at(badRule, 'spec', 'groups', 0, 'rules', 0) as Obj).for = 300;
    assert.throws(() => validateStrict(badRule), /for must be string/);
    const badSm = clone(only('ServiceMonitor'));
    (at(badSm, 'spec', 'endpoints', 0) as Obj).port = 9617;
    assert.throws(() => validateStrict(badSm), /port must be string/);
  });

  it('a missing required field fails the schema check', () => {
    const bad = clone(ds);
    delete (at(bad, 'spec', 'template', 'spec', 'containers', 0) as Obj).name;
    assert.throws(() => validateStrict(bad), /must have required property 'name'|required property name/);
  });

  it('an unknown field fails, at any depth', () => {
    const typo = clone(ds);
    (at(typo, 'spec', 'template', 'spec') as Obj).hostPid = true;
    assert.throws(() => validateStrict(typo), /unknown field \/spec\/template\/spec\/hostPid$/);
    const deep = clone(ds);
    (at(deep, 'spec', 'template', 'spec', 'containers', 0, 'securityContext', 'capabilities') as Obj).addd = ['NET_ADMIN'];
    assert.throws(() => validateStrict(deep), /\/spec\/template\/spec\/containers\/0\/securityContext\/capabilities\/addd/);
    const top = clone(only('Service'));
    (top as Obj).specs = {};
    assert.throws(() => validateStrict(top), /unknown field \/specs/);
    const rule = clone(only('PrometheusRule'));
    (at(rule, 'spec', 'groups', 0, 'rules', 0) as Obj).severity = 'warning';
    assert.throws(() => validateStrict(rule), /rules\/0\/severity/);
    // Map keys (labels, resources) are read by the validator: an extra label is not "unknown".
    const label = clone(ds);
    (at(label, 'metadata', 'labels') as Obj).extra = 'x';
    validateStrict(label);
  });

  it('an object of an unknown kind fails', () => {
    assert.throws(() => validateStrict({ apiVersion: 'apps/v1', kind: 'Deployment', metadata: { name: 'x' } }), /no schema/);
  });
});

describe('deploy/kubernetes: the DaemonSet', () => {
  it('runs in the host network and PID namespace, on every node, as node-critical', () => {
    assert.equal(podSpec.hostNetwork, true);
    assert.equal(podSpec.hostPID, true);
    assert.equal(podSpec.priorityClassName, 'system-node-critical');
    const tolerations = podSpec.tolerations as Obj[];
    assert.ok(tolerations.some((t) => t.operator === 'Exists' && t.key === undefined && t.effect === undefined), 'a toleration of every taint');
    assert.equal(podSpec.automountServiceAccountToken, false);
  });

  it('rolls one node at a time without surge', () => {
    assert.equal(at(ds, 'spec', 'updateStrategy', 'type'), 'RollingUpdate');
    assert.ok(at(ds, 'spec', 'updateStrategy', 'rollingUpdate', 'maxUnavailable') !== undefined);
    assert.equal(at(ds, 'spec', 'updateStrategy', 'rollingUpdate', 'maxSurge'), 0);
  });

  it('selects its own pods', () => {
    const sel = at(ds, 'spec', 'selector', 'matchLabels') as Record<string, string>;
    const labels = at(ds, 'spec', 'template', 'metadata', 'labels') as Record<string, string>;
    for (const [k, v] of Object.entries(sel)) assert.equal(labels[k], v, k);
  });

  it('mounts the host paths the issue lists', () => {
    const types: Record<string, string> = {
      '/opt/cni/bin': 'DirectoryOrCreate',
      '/opt/cni': 'DirectoryOrCreate',
      '/etc/cni/net.d': 'DirectoryOrCreate',
      '/var/lib/cni/networks': 'DirectoryOrCreate',
      '/run/netns': 'DirectoryOrCreate',
      '/var/run/netns': 'DirectoryOrCreate',
      '/run/containerd': 'Directory',
      '/run/ipwarden': 'DirectoryOrCreate',
    };
    for (const [path, type] of Object.entries(types)) assert.equal(hostPathVolume(path).hostPath?.type, type, path);
    // Nothing else of the host, and every volume is used.
    const hostPaths = volumes.filter((v) => v.hostPath !== undefined).map((v) => v.hostPath?.path);
    assert.deepEqual(hostPaths.sort(), Object.keys(types).sort());
    const used = new Set([...containers, ...initContainers].flatMap((c) => (c.volumeMounts ?? []).map((m) => m.name)));
    for (const v of volumes) assert.ok(used.has(v.name), `volume ${v.name} is mounted`);
  });

  it('the init step installs the plugin into the host CNI bin dir, then the daemon starts', () => {
    assert.equal(initContainers.length, 1);
    assert.ok(initC !== undefined, 'an init container named install-cni');
    assert.equal(initC.command, undefined, 'the image entrypoint (ipwarden) runs');
    const args = initC.args ?? [];
    assert.equal(args[0], 'install-cni');
    const dest = flag(args, '--dest');
    assert.ok(dest !== undefined);
    assert.equal(hostPathAt(initC, dest), '/opt/cni/bin', '--dest is the host /opt/cni/bin');
    assert.equal(mountCovering(initC, dest)?.readOnly, false);
    const socket = flag(args, '--socket');
    assert.ok(socket !== undefined);
    validateSocketPath(socket);
    assert.equal(socket, flag(daemonC.args ?? [], '--socket'), 'the shim connects where the daemon listens');
    assert.equal(containers.length, 1);
    assert.equal(daemonC.command, undefined);
    assert.equal((daemonC.args ?? [])[0], 'daemon');
  });

  it('runs the image npm run image builds: localhost/ipwarden:<package.json version> in every container, its entrypoint (no command)', () => {
    const version = (JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { version: string }).version;
    for (const c of [...initContainers, ...containers]) {
      const raw = (at(podSpec, c === daemonC ? 'containers' : 'initContainers', 0) as Obj);
      assert.equal(raw.image, `localhost/ipwarden:${version}`, `${c.name}: the name ctr images import gives the archive (a localhost/ name never pulls from the internet)`);
      assert.equal(raw.imagePullPolicy, 'IfNotPresent', c.name);
      assert.equal(c.command, undefined, `${c.name}: the image's entrypoint /usr/bin/ipwarden runs`);
    }
    assert.equal(at(ds, 'metadata', 'labels', 'app.kubernetes.io/version'), version);
  });

  it("install-cni's arguments are flags install-cni accepts", async () => {
    const known = await helpFlags('install-cni');
    const args = (initC.args ?? []).slice(1);
    for (let i = 0; i < args.length; i += 2) assert.ok(known.has(args[i] as string), `${args[i]} is an install-cni flag (${[...known].join(' ')})`);
    assert.equal(args.length % 2, 0, 'every flag has its value');
  });

  it("the daemon's arguments are flags `ipwarden daemon` accepts, with valid values", async () => {
    // As the kubelet expands them: $(HOST_IP) from the downward API's status.hostIP (a node IP here).
    const hostIpEnv = (daemonC.env ?? []).find((e) => e.name === 'HOST_IP');
    assert.equal(at(hostIpEnv, 'valueFrom', 'fieldRef', 'fieldPath'), 'status.hostIP');
    const args = (daemonC.args ?? []).slice(1).map((a) => a.replace('$(HOST_IP)', '10.20.30.40'));
    const known = await helpFlags('daemon');
    for (const a of args.filter((x) => x.startsWith('--'))) assert.ok(known.has(a), `${a} is a daemon flag`);
    let stderr = '';
    let got: DaemonOptions | null = null;
    const ctx: CliContext = { stdout: () => {}, stderr: (t) => void (stderr += t), env: {}, now: () => 0 };
    const code = await runMain(['daemon', ...args], ctx, { daemon: async (o) => ((got = o), 0) });
    assert.equal(code, 0, stderr);
    const o = got as DaemonOptions | null;
    assert.ok(o !== null);
    // The paths the daemon uses are the host's, mounted at the same place.
    assert.equal(hostPathAt(daemonC, o.dataDir), o.dataDir);
    assert.equal(mountCovering(daemonC, o.dataDir)?.readOnly, false, 'the data dir is written');
    assert.equal(hostPathAt(daemonC, o.cniConfDir), o.cniConfDir);
    assert.equal(hostPathAt(daemonC, dirname(o.socket)), dirname(o.socket), 'the socket directory is the host one (the shim runs on the host)');
    assert.equal(mountCovering(daemonC, dirname(o.socket))?.readOnly, false);
    assert.equal(hostPathVolume(dirname(o.socket)).hostPath?.path, '/run/ipwarden');
    assert.ok(o.runtimeEndpoint !== null);
    const sock = o.runtimeEndpoint.replace(/^unix:\/\//, '');
    assert.equal(hostPathAt(daemonC, sock), sock, 'the runtime socket is reachable at its host path');
    // The CLI run through `kubectl exec` asks the same runtime.
    const env = daemonC.env ?? [];
    assert.ok(env.some((e) => e.name === 'CONTAINER_RUNTIME_ENDPOINT' && e.value === o.runtimeEndpoint));
    // The installed files are watched where install-cni wrote them, through the host's /opt/cni: a
    // re-created /opt/cni/bin shows (a mount of the old directory itself would not), and is written.
    assert.ok(o.cniBinDir !== undefined);
    assert.equal(hostPathAt(daemonC, o.cniBinDir), hostPathAt(initC, flag(initC.args ?? [], '--dest') as string));
    assert.equal(mountCovering(daemonC, o.cniBinDir)?.volume.hostPath?.path, '/opt/cni', 'the parent of the bin dir is mounted');
    assert.equal(mountCovering(daemonC, o.cniBinDir)?.readOnly, false);
    // install-cni records the same endpoint beside the plugin (a Multus thick daemon's plugin asks it).
    assert.deepEqual((initC.env ?? []).filter((e) => e.name === 'CONTAINER_RUNTIME_ENDPOINT'), [{ name: 'CONTAINER_RUNTIME_ENDPOINT', value: o.runtimeEndpoint }]);
    // Metrics: on the node's IP only (never 0.0.0.0: not on every interface of the node), where
    // Prometheus scrapes the pod (= the node's) IP; the probes on a loopback listener of their own.
    assert.equal(o.metricsAddress.host, '10.20.30.40');
    assert.deepEqual(o.healthAddress, { host: '127.0.0.1', port: 9618 });
    const port = (daemonC.ports ?? []).find((p) => p.name === 'metrics');
    assert.ok(port !== undefined, 'a port named metrics');
    assert.equal(port.containerPort, o.metricsAddress.port);
    assert.equal(port.hostPort, o.metricsAddress.port, 'host network: hostPort = containerPort');
  });

  it('sees every netns directory the kernel evidence reads (but Docker\'s), with host-to-container propagation', () => {
    for (const d of DEFAULT_NETNS_DIRS) {
      if (d.startsWith('/var/run/docker/')) continue; // no dockershim since Kubernetes 1.24
      assert.equal(hostPathAt(daemonC, d), d, d);
      const m = mountCovering(daemonC, d);
      assert.equal(m?.propagation, 'HostToContainer', `${d}: namespaces pinned after the pod started must appear in it`);
    }
  });

  it('NODE_NAME comes from the downward API', () => {
    const env = (daemonC.env ?? []).find((e) => e.name === 'NODE_NAME');
    assert.equal(at(env, 'valueFrom', 'fieldRef', 'fieldPath'), 'spec.nodeName');
  });

  it("probes /healthz and /readyz on the daemon's own probe listener (127.0.0.1:9618, the node's loopback: host network), not the metrics port", () => {
    assert.deepEqual(at(daemonC.livenessProbe, 'httpGet'), { host: '127.0.0.1', path: '/healthz', port: 9618 });
    assert.deepEqual(at(daemonC.readinessProbe, 'httpGet'), { host: '127.0.0.1', path: '/readyz', port: 9618 });
  });

  it('every container: root, read-only root filesystem, all capabilities dropped, only the needed ones added', () => {
    const added: Record<string, string[]> = { 'install-cni': [], ipwarden: ['DAC_READ_SEARCH', 'SYS_ADMIN', 'SYS_PTRACE'] };
    for (const c of [...initContainers, ...containers]) {
      const sc = c.securityContext ?? {};
      assert.equal(sc.runAsUser, 0, c.name);
      assert.equal(sc.readOnlyRootFilesystem, true, c.name);
      assert.notEqual(sc.privileged, true, c.name);
      assert.deepEqual(at(sc, 'capabilities', 'drop'), ['ALL'], c.name);
      const add = ((at(sc, 'capabilities', 'add') ?? []) as string[]).slice().sort();
      assert.deepEqual(add, added[c.name], c.name);
      // API server validation: allowPrivilegeEscalation=false is rejected together with CAP_SYS_ADMIN.
      if (add.includes('SYS_ADMIN')) assert.notEqual(sc.allowPrivilegeEscalation, false, c.name);
      else assert.equal(sc.allowPrivilegeEscalation, false, c.name);
      // A read-only root: install-cni's scratch dir (os.tmpdir()) must be writable.
      assert.equal(mountCovering(c, '/tmp')?.volume.emptyDir !== undefined, true, `${c.name}: /tmp is an emptyDir`);
    }
    assert.equal(at(daemonC.securityContext, 'appArmorProfile', 'type'), 'Unconfined');
  });

  it('requests and limits cover the measured daemon memory (docs/benchmarks.md "Daemon memory")', () => {
    for (const c of [...initContainers, ...containers]) {
      for (const r of ['cpu', 'memory']) {
        assert.ok(c.resources?.requests?.[r] !== undefined, `${c.name} requests ${r}`);
        assert.ok(c.resources?.limits?.[r] !== undefined, `${c.name} limits ${r}`);
      }
    }
    const MB = 2 ** 20;
    const req = bytes(daemonC.resources?.requests?.memory as string);
    const lim = bytes(daemonC.resources?.limits?.memory as string);
    assert.ok(req >= 65 * MB, 'the request covers the idle daemon (64.7 MB)');
    assert.ok(lim >= 150 * MB, 'the limit covers a pass over a fully reserved /16 (peak 149.0 MB)');
    assert.ok(req <= lim);
  });
});

describe('deploy/kubernetes: monitoring and kustomization', () => {
  it('the PrometheusRule carries exactly the alert rules of docs/metrics.md', () => {
    const doc = readFileSync(join(ROOT, 'docs/metrics.md'), 'utf8');
    const section = doc.slice(doc.indexOf('## Example alert rules'));
    const m = /```yaml\n([\s\S]*?)```/.exec(section);
    assert.ok(m !== null, 'the yaml block of "Example alert rules"');
    const fromDocs = parseYaml(m[1] as string) as Obj;
    const rule = only('PrometheusRule');
    assert.deepEqual(at(rule, 'spec'), fromDocs);
    const alerts = (at(fromDocs, 'groups', 0, 'rules') as Obj[]).map((r) => r.alert);
    assert.ok(alerts.length >= 5 && alerts.includes('IpwardenDown'), alerts.join(', '));
  });

  it('the Service selects the DaemonSet pods, the ServiceMonitor the Service, with job="ipwarden"', () => {
    const svc = only('Service');
    const sm = only('ServiceMonitor');
    const podLabels = at(ds, 'spec', 'template', 'metadata', 'labels') as Record<string, string>;
    for (const [k, v] of Object.entries(at(svc, 'spec', 'selector') as Record<string, string>)) assert.equal(podLabels[k], v, k);
    assert.equal(at(svc, 'spec', 'clusterIP'), 'None');
    const svcPort = (at(svc, 'spec', 'ports') as Obj[]).find((p) => p.name === 'metrics');
    assert.equal(svcPort?.targetPort, 'metrics');
    const svcLabels = at(svc, 'metadata', 'labels') as Record<string, string>;
    for (const [k, v] of Object.entries(at(sm, 'spec', 'selector', 'matchLabels') as Record<string, string>)) assert.equal(svcLabels[k], v, k);
    assert.deepEqual(at(sm, 'spec', 'namespaceSelector', 'matchNames'), [at(svc, 'metadata', 'namespace')]);
    assert.equal(at(sm, 'spec', 'endpoints', 0, 'port'), 'metrics');
    // The Prometheus Operator's job label: the Service's label named by jobLabel, else its name.
    const jobLabel = at(sm, 'spec', 'jobLabel') as string | undefined;
    const job = jobLabel === undefined ? at(svc, 'metadata', 'name') : svcLabels[jobLabel];
    assert.equal(job, 'ipwarden', 'IpwardenDown matches up{job="ipwarden"}');
  });

  it('every namespaced object is in the namespace of namespace.yaml', () => {
    const ns = at(only('Namespace'), 'metadata', 'name');
    assert.equal(at(only('Namespace'), 'metadata', 'labels', 'pod-security.kubernetes.io/enforce'), 'privileged');
    for (const d of allDocs) {
      if (isObj(d) && d.kind !== 'Namespace') assert.equal(at(d, 'metadata', 'namespace'), ns, String(d.kind));
    }
  });

  it('the core kustomization lists every core manifest and needs no CRD; the monitoring component lists the Prometheus Operator objects; the overlay joins them', () => {
    const core = parseYaml(readFileSync(join(DIR, 'kustomization.yaml'), 'utf8')) as Obj;
    assert.equal(core.apiVersion, 'kustomize.config.k8s.io/v1beta1');
    assert.equal(core.kind, 'Kustomization');
    assert.deepEqual(Object.keys(core).sort(), ['apiVersion', 'kind', 'resources']);
    const coreFiles = [...loadManifests([DIR]).keys()].sort();
    assert.deepEqual((core.resources as string[]).slice().sort(), coreFiles);
    assert.deepEqual(coreFiles, ['daemonset.yaml', 'namespace.yaml', 'service.yaml']);
    for (const d of [...loadManifests([DIR]).values()].flat()) assert.ok(isObj(d) && !String(d.apiVersion).startsWith('monitoring.coreos.com/'), `${String(isObj(d) ? d.kind : d)} in the core`);
    const comp = parseYaml(readFileSync(join(MONITORING, 'kustomization.yaml'), 'utf8')) as Obj;
    assert.deepEqual([comp.apiVersion, comp.kind], ['kustomize.config.k8s.io/v1alpha1', 'Component']);
    assert.deepEqual(Object.keys(comp).sort(), ['apiVersion', 'kind', 'resources']);
    assert.deepEqual((comp.resources as string[]).slice().sort(), [...loadManifests([MONITORING]).keys()].sort());
    assert.deepEqual((comp.resources as string[]).slice().sort(), ['grafana-dashboard.yaml', 'prometheusrule.yaml', 'servicemonitor.yaml']);
    const overlay = parseYaml(readFileSync(join(OVERLAY, 'kustomization.yaml'), 'utf8')) as Obj;
    assert.deepEqual(overlay, { apiVersion: 'kustomize.config.k8s.io/v1beta1', kind: 'Kustomization', resources: ['../../kubernetes'], components: ['../../components/monitoring'] });
  });

  it('kubectl kustomize renders the core as Namespace, Service, DaemonSet and the overlay with the ServiceMonitor, PrometheusRule and the dashboard\'s ConfigMap added', (t) => {
    // The kubectl of the dev dependency's Lambda layer (test/helpers/k8s-tools.ts); required in CI.
    const tools = k8sTools();
    if ('missing' in tools) {
      if (process.env['CI'] === 'true') assert.fail(`CI is missing a test prerequisite: ${tools.missing}`);
      t.skip(`no kubectl: ${tools.missing}`);
      return;
    }
    const kinds = (dir: string): string[] => {
      const r = spawnSync(tools.kubectl, ['kustomize', dir], { encoding: 'utf8' });
      assert.equal(r.status, 0, r.stderr);
      return parseAllDocuments(r.stdout).map((d) => String((d.toJS() as Obj).kind)).sort();
    };
    assert.deepEqual(kinds(DIR), ['DaemonSet', 'Namespace', 'Service']);
    assert.deepEqual(kinds(OVERLAY), ['ConfigMap', 'DaemonSet', 'Namespace', 'PrometheusRule', 'Service', 'ServiceMonitor']);
  });

  it('the Grafana dashboard\'s ConfigMap holds exactly deploy/grafana/ipwarden-dashboard.json, labelled for Grafana\'s dashboard sidecar', () => {
    const cm = only('ConfigMap');
    assert.equal(at(cm, 'metadata', 'labels', 'grafana_dashboard'), '1');
    assert.deepEqual(Object.keys(at(cm, 'data') as Obj), ['ipwarden-dashboard.json']);
    const file = readFileSync(join(ROOT, 'deploy/grafana/ipwarden-dashboard.json'), 'utf8');
    assert.equal(at(cm, 'data', 'ipwarden-dashboard.json'), file);
    assert.equal((JSON.parse(file) as Obj).uid, 'ipwarden');
  });

  it('the ServiceMonitor honours the daemon\'s labels, so the pool series keep their own `node` (never `exported_node`)', () => {
    assert.equal(at(only('ServiceMonitor'), 'spec', 'endpoints', 0, 'honorLabels'), true);
    assert.equal(at(only('ServiceMonitor'), 'spec', 'endpoints', 0, 'relabelings', 0, 'targetLabel'), 'node');
  });
});

describe('deploy/kubernetes: the DaemonSet as the lab\'s kubelet runs it (src/lab/daemonset.ts, test/e2e/daemonset-lab.test.ts)', () => {
  const node: LabNode = {
    paths: [
      ['/opt/cni/bin', '/lab/cni/bin'],
      ['/opt/cni', '/lab/cni'],
      ['/etc/cni/net.d', '/lab/cni/net.d'],
      ['/var/lib/cni/networks', '/lab/cni/networks'],
      ['/run/ipwarden', '/lab/run/ipwarden'],
      ['/run/containerd', '/lab/run'],
      ['/run/netns', '/lab/node/run/netns'],
      ['/var/run/netns', '/lab/node/run/netns'],
    ],
    ports: new Map([[9617, 40123], [9618, 40124]]),
    nodeName: 'lab-node',
    cgroupParent: '/ipwarden-lab-abcdef',
    podsDir: '/lab/node/pods',
  };
  const plan = planPod(ds, node, { name: 'ipwarden-x', uid: 'uid-1' });
  const init = plan.initContainers[0]!;
  const daemon = plan.containers[0]!;

  it('moves a host path by its longest mapped prefix, whole components only; values: unix:// endpoints, paths, HOST:PORT', () => {
    assert.equal(mapPath(node, '/run/ipwarden/plugin.sock'), '/lab/run/ipwarden/plugin.sock');
    assert.equal(mapPath(node, '/run/containerd/containerd.sock'), '/lab/run/containerd.sock');
    assert.equal(mapPath(node, '/run/ipwardenx'), '/run/ipwardenx');
    assert.equal(mapPath(node, '/host/opt/cni/bin'), '/host/opt/cni/bin');
    assert.equal(mapValue(node, 'unix:///run/containerd/containerd.sock'), 'unix:///lab/run/containerd.sock');
    assert.equal(mapValue(node, '0.0.0.0:9617'), '0.0.0.0:40123');
    assert.equal(mapValue(node, '0.0.0.0:9619'), '0.0.0.0:9619');
    assert.equal(mapValue(node, 'daemon'), 'daemon');
    assert.equal(memoryBytes('256Mi'), 268435456);
    assert.equal(milliCpu('50m'), 50);
    assert.equal(milliCpu('1'), 1000);
  });

  it('one sandbox in the host network and PID namespace, its logs and cgroup on the lab; the pod\'s labels', () => {
    assert.deepEqual(plan.sandbox.namespaces, { network: 'NODE', pid: 'NODE', ipc: 'POD' });
    assert.equal(plan.sandbox.hostname, '');
    assert.equal(plan.sandbox.namespace, 'ipwarden-system');
    assert.equal(plan.sandbox.cgroupParent, '/ipwarden-lab-abcdef');
    assert.equal(plan.sandbox.logDirectory, '/lab/node/pods/ipwarden-system_ipwarden-x_uid-1/logs');
    assert.equal(plan.sandbox.labels?.['app.kubernetes.io/name'], 'ipwarden');
    assert.deepEqual(plan.sandbox.portMappings, [{ containerPort: 40123, hostPort: 40123, protocol: 'TCP' }]);
    assert.equal(plan.graceSeconds, 60);
  });

  it('the init container: install-cni into the mounted bin dir with the node\'s socket path; no capability, no_new_privs', () => {
    assert.equal(init.name, 'install-cni');
    assert.deepEqual(init.command, []);
    assert.deepEqual(init.args, ['install-cni', '--dest', '/host/opt/cni/bin', '--socket', '/lab/run/ipwarden/plugin.sock']);
    assert.deepEqual(init.mounts.find((m) => m.containerPath === '/host/opt/cni/bin'), { containerPath: '/host/opt/cni/bin', hostPath: '/lab/cni/bin', readonly: false, propagation: 'PROPAGATION_PRIVATE' });
    assert.deepEqual(init.security.addCapabilities, []);
    assert.deepEqual(init.security.dropCapabilities, ['ALL']);
    assert.equal(init.security.noNewPrivs, true);
    assert.equal(init.security.readonlyRootfs, true);
    assert.equal(init.security.runAsUser, 0);
  });

  it('the daemon: its flags with the node\'s paths and port, the mounts at the node\'s paths (propagation, read-only), three capabilities, the resources as cgroup values', () => {
    assert.deepEqual(daemon.args, [
      'daemon', '--socket', '/lab/run/ipwarden/plugin.sock', '--metrics-address', '127.0.0.1:40123', '--health-address', '127.0.0.1:40124', '--data-dir', '/lab/cni/networks',
      '--cni-conf-dir', '/lab/cni/net.d', '--runtime-endpoint', 'unix:///lab/run/containerd.sock', '--cni-bin-dir', '/host/opt/cni/bin', '--interval', '1m', '--log-level', 'info',
    ]);
    // status.hostIP is the lab node's loopback; $(HOST_IP) in the args is expanded from it.
    assert.deepEqual(daemon.env, [{ key: 'NODE_NAME', value: 'lab-node' }, { key: 'HOST_IP', value: '127.0.0.1' }, { key: 'CONTAINER_RUNTIME_ENDPOINT', value: 'unix:///lab/run/containerd.sock' }]);
    const byPath = new Map(daemon.mounts.map((m) => [m.containerPath, m]));
    assert.deepEqual(byPath.get('/lab/run'), { containerPath: '/lab/run', hostPath: '/lab/run', readonly: true, propagation: 'PROPAGATION_HOST_TO_CONTAINER' });
    assert.deepEqual(byPath.get('/lab/run/ipwarden'), { containerPath: '/lab/run/ipwarden', hostPath: '/lab/run/ipwarden', readonly: false, propagation: 'PROPAGATION_PRIVATE' });
    assert.deepEqual(byPath.get('/lab/cni/networks')?.readonly, false);
    assert.equal(byPath.get('/tmp')?.hostPath, '/lab/node/pods/ipwarden-system_ipwarden-x_uid-1/volumes/kubernetes.io~empty-dir/tmp');
    // The bin dir install-cni wrote, through its parent (a re-created bin dir shows), read-write.
    assert.deepEqual(byPath.get('/host/opt/cni'), { containerPath: '/host/opt/cni', hostPath: '/lab/cni', readonly: false, propagation: 'PROPAGATION_PRIVATE' });
    assert.deepEqual(daemon.security.addCapabilities.slice().sort(), ['DAC_READ_SEARCH', 'SYS_ADMIN', 'SYS_PTRACE']);
    assert.equal(daemon.security.noNewPrivs, false);
    assert.equal(daemon.security.apparmorProfile, 'unconfined');
    assert.equal(daemon.security.seLinuxType, 'spc_t');
    assert.deepEqual(daemon.resources, { cpuPeriod: 100_000, cpuQuota: 100_000, cpuShares: 51, memoryLimitBytes: 256 * 2 ** 20 });
    assert.deepEqual(plan.readiness.get('ipwarden'), { path: '/readyz', port: 40124 });
  });

  it('creates the DirectoryOrCreate host paths (0755) and the emptyDirs (0777); requires the Directory ones', () => {
    assert.deepEqual(plan.mustExist, ['/lab/run']);
    const dirs = new Map(plan.createDirs.map((d) => [d.path, d.mode]));
    for (const p of ['/lab/cni/bin', '/lab/cni', '/lab/cni/net.d', '/lab/cni/networks', '/lab/node/run/netns', '/lab/run/ipwarden']) assert.equal(dirs.get(p), 0o755, p);
    assert.equal(dirs.get('/lab/node/pods/ipwarden-system_ipwarden-x_uid-1/volumes/kubernetes.io~empty-dir/tmp'), 0o777);
  });

  it('refuses what it cannot run instead of running something else', () => {
    const other = clone(ds);
    ((at(other, 'spec', 'template', 'spec', 'volumes') as Obj[])[0] as Obj).hostPath = { path: '/x', type: 'Socket' };
    assert.throws(() => planPod(other, node, { name: 'p', uid: 'u' }), /does not run hostPath type "Socket"/);
    const env = clone(ds);
    ((at(env, 'spec', 'template', 'spec', 'containers', 0, 'env') as Obj[])[0] as Obj).valueFrom = { fieldRef: { fieldPath: 'status.podIP' } };
    assert.throws(() => planPod(env, node, { name: 'p', uid: 'u' }), /does not run env NODE_NAME/);
    const cfg = clone(ds);
    ((at(cfg, 'spec', 'template', 'spec', 'volumes') as Obj[])[0] as Obj) = { name: 'cni-bin', configMap: { name: 'x' } };
    assert.throws(() => planPod(cfg, node, { name: 'p', uid: 'u' }), /only hostPath and emptyDir/);
    // A host path the lab node does not map would be this machine's own: refused.
    const unmapped = clone(ds);
    ((at(unmapped, 'spec', 'template', 'spec', 'volumes') as Obj[])[0] as Obj).hostPath = { path: '/opt', type: 'DirectoryOrCreate' };
    assert.throws(() => planPod(unmapped, node, { name: 'p', uid: 'u' }), /hostPath "\/opt" \(volume cni-bin\): the lab node maps no prefix of it/);
  });
});
