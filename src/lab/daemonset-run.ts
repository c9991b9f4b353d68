/**
 * The lab's DaemonSet run (issue 10): the image index `npm run image` builds (linux/amd64 and
 * linux/arm64), pushed to a registry on loopback (src/lab/registry.ts) and pulled by digest into
 * the lab's containerd (or, with source `archive`, imported), and run as a pod the way a kubelet
 * runs deploy/kubernetes/daemonset.yaml (src/lab/daemonset.ts), then, step by step on a network
 * whose IPAM is ipwarden (the lab installs no plugin: the pod's init container does):
 *
 *   1. deploy:   the image pulled (ctr lists the index digest the build printed); the init container
 *                `install-cni` runs to completion and writes the shim, the standalone, the flock
 *                binding and the netns helper into the lab's CNI bin dir (the image's bytes, the shim
 *                patched with the lab's socket); the daemon container starts and answers /readyz;
 *   2. serve:    pods on the bridge network get their addresses through the shim and the daemon
 *                (the daemon logs `request served` for each ADD; nothing is counted as a fallback);
 *                then `kubectl exec` and `kubectl cp`'s own commands in the daemon container;
 *   3. heal:     leaks — 2 READY pods, 2 pods whose chained plugin fails ADD and DEL (NOTREADY),
 *                then a "reboot" that loses the runtime's records (and the DaemonSet pod with
 *                them); the kubelet re-creates the DaemonSet pod (init again, daemon again); one
 *                more NOTREADY pod (live); READY pods fill the range; the next pod's ADD, served by
 *                the daemon, meets the exhausted range, reclaims exactly the 4 leaked reservations
 *                and starts — no RunPodSandbox of this step fails;
 *   4. metrics:  scraped from the pod's port (host network): ADDs through the daemon counted
 *                exactly, none through the standalone;
 *   5. fallback: the pod is stopped like a deleted pod (StopContainer with the grace period, the
 *                daemon exits 0 and removes its socket, then StopPodSandbox); a new pod starts and
 *                stops through the standalone in the bin dir (counted in standalone-requests.log).
 *
 * Each phase only acts and reports: `say` prints the timeline, `check` records an expectation (the
 * e2e test makes it an assertion, `npm run lab` prints ✓/✗). The daemon's own reconcile passes
 * keep the manifest's default grace (5 min), so within the run they release nothing and the heal is
 * the daemon's request path (the plugin's reclaim on exhaustion, `leakGracePeriod: 2s` in the lab's
 * CNI configuration): one deterministic healer.
 */
import { hostname } from 'node:os';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { readShimFields } from '../cli/install-cni.ts';
import { CHAIN_PLUGIN_TYPE } from './chain-plugin.ts';
import { startLab, type Lab } from './lab.ts';
import { installDebianPackages } from '../../scripts/debian-packages.mjs';
import { execInContainer, importImage, labNode, loadDaemonSet, mapPath, pollUntil, pullImage, runDaemonSetPod, type DaemonSetPod, type ExecResult, type ImportedImage, type LabNode } from './daemonset.ts';
import { startRegistry, type LocalRegistry } from './registry.ts';
import { run } from './proc.ts';
import { auditLines, capacityOf, ipsOf, runBrokenPod, tryRunPod, waitUntilOlder, type Pod } from './scenario.ts';

const REPO = fileURLToPath(new URL('../..', import.meta.url));
/** `leakGracePeriod` of the lab network: the plugin (in the daemon) reclaims leaks older than this. */
export const DS_GRACE_SECONDS = 2;


/** One platform of the image index, as `scripts/image.mjs --json` prints it. */
export interface ImagePlatform {
  /** `linux/amd64` or `linux/arm64`. */
  readonly platform: string;
  /** The platform's manifest digest. */
  readonly digest: string;
  /** The image config's digest: containerd's image id (CRI `image_ref`) on a node of this platform. */
  readonly configDigest: string;
  readonly packages: ReadonlyArray<{ readonly name: string; readonly version: string }>;
}

/** What `node scripts/image.mjs --json` prints (the fields the run reads). */
export interface ImageBuild {
  readonly archive: string;
  /** The name `ctr images import` gives it (`localhost/ipwarden:<version>`). */
  readonly image: string;
  /** The image index's digest (what a node pulls by digest). */
  readonly digest: string;
  readonly platforms: readonly ImagePlatform[];
  readonly sizeBytes: number;
  readonly seconds: number;
  readonly revision: string;
  readonly version: string;
  /** With `--push`: the reference pushed to and the one to pull by digest. */
  readonly pushed?: { readonly ref: string; readonly digest: string; readonly byDigest: string };
}

/** OCI name of this machine's architecture. */
export const HOST_ARCH = process.arch === 'arm64' ? 'arm64' : 'amd64';

/** The platform of `image` this machine runs. @throws Error when the index lacks it. */
export function hostPlatform(image: ImageBuild): ImagePlatform {
  const p = image.platforms.find((x) => x.platform === `linux/${HOST_ARCH}`);
  if (p === undefined) throw new Error(`the image index has no linux/${HOST_ARCH} manifest`);
  return p;
}

/**
 * Builds the image: `node scripts/image.mjs --json --out OUT` (the dist/ of this checkout).
 * @throws Error with the script's stderr when it fails.
 */
export function buildImage(out: string, extraArgs: readonly string[] = []): ImageBuild {
  const r = spawnSync(process.execPath, [join(REPO, 'scripts/image.mjs'), '--json', '--out', out, ...extraArgs], { encoding: 'utf8', timeout: 900_000, maxBuffer: 64 * 1024 * 1024 });
  if (r.status !== 0) throw new Error(`scripts/image.mjs failed (exit ${String(r.status ?? r.signal)}): ${r.stderr}`);
  return JSON.parse(r.stdout) as ImageBuild;
}

/** Reports of a run. */
export interface Reporter {
  /** One timeline line. */
  say(line: string): void;
  /** An expectation: `ok` must be true. */
  check(ok: boolean, what: string): void;
}

const short = (id: string): string => id.slice(0, 12);
const lastOctets = (ips: readonly string[]): string => (ips.length === 0 ? '(none)' : ips.map((ip) => `.${ip.split('.').pop() ?? ''}`).join(' '));
const sameSet = (a: readonly string[], b: readonly string[]): boolean => a.length === b.length && [...a].sort().join() === [...b].sort().join();

/** One sample of the exposition text. */
interface Sample {
  readonly name: string;
  readonly labels: Record<string, string>;
  readonly value: number;
}

function parseMetrics(text: string): Sample[] {
  const out: Sample[] = [];
  for (const l of text.split('\n')) {
    const m = /^([a-z_:][a-z0-9_:]*)(?:\{(.*)\})? (\S+)$/i.exec(l);
    if (m === null) continue;
    const labels: Record<string, string> = {};
    for (const p of (m[2] ?? '').matchAll(/([a-z_][a-z0-9_]*)="((?:[^"\\]|\\.)*)"/gi)) labels[p[1] as string] = p[2] as string;
    out.push({ name: m[1] as string, labels, value: Number(m[3]) });
  }
  return out;
}

/** Sum of the samples `name` whose labels include `labels` (0 when none: a counter never incremented). */
export function sampleSum(samples: readonly Sample[], name: string, labels: Record<string, string>): number {
  return samples.filter((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v)).reduce((a, s) => a + s.value, 0);
}

/** The fallback counting file's lines as `COMMAND result` (`docs/daemon.md` "Fallback requests in the metrics"). */
export function fallbackLines(lab: Lab): string[] {
  try {
    return readFileSync(join(lab.pluginSocket, '..', 'standalone-requests.log'), 'utf8')
      .split('\n')
      .filter((x) => x !== '')
      .map((x) => x.split(' ').slice(1).join(' '));
  } catch {
    return [];
  }
}

/** Options of {@link DaemonSetRun.start}. */
export interface DaemonSetRunOptions {
  /** The lab network's subnet (a /28). */
  subnet: string;
  /**
   * Where the node gets the image: `registry` (default) — the index pushed by `image.mjs --push`
   * to a loopback docker-registry ({@link startRegistry}) and pulled by digest
   * (`ctr images pull --plain-http`), the pod spec naming `<registry>/ipwarden@<digest>`;
   * `archive` — `ctr images import` of the archive, the pod spec unchanged.
   */
  source?: 'registry' | 'archive';
  /** The directory whose binaries (this machine's platform) the image holds (default `<repo>/dist`), to compare what install-cni wrote; the other platform is cross-built into the lab's scratch dir. */
  dist?: string;
  /** Install the lab's Debian packages, and those the image build needs (`scripts/image.mjs --install`), with apt-get when missing. Default false. */
  installPackages?: boolean;
  log?: (line: string) => void;
}

/** The run's state, phase by phase (see the module comment). */
export class DaemonSetRun {
  readonly lab: Lab;
  readonly node: LabNode;
  readonly image: ImageBuild;
  readonly dist: string;
  /** The image reference the DaemonSet's containers run: `<registry>/ipwarden@<index digest>`, or the archive's name. */
  readonly imageRef: string;
  /** The loopback registry (source `registry`), stopped by {@link stop}. */
  readonly registry: LocalRegistry | undefined;
  imported: ImportedImage | undefined;
  pod: DaemonSetPod | undefined;
  /** Pods started in phase 2 (`served`), leaked in phase 3, live at the end of phase 3. */
  readonly served: Pod[] = [];
  readonly leaked: Pod[] = [];
  readonly live: Pod[] = [];
  healed: Pod | undefined;
  /** ADDs the second daemon served (phase 3), for the exact metric of phase 4. */
  addsServedBySecond = 0;
  readonly #r: Reporter;

  private constructor(lab: Lab, node: LabNode, image: ImageBuild, dist: string, registry: LocalRegistry | undefined, r: Reporter) {
    this.lab = lab;
    this.node = node;
    this.image = image;
    this.dist = dist;
    this.registry = registry;
    this.imageRef = registry === undefined ? image.image : (image.pushed?.byDigest ?? '');
    this.#r = r;
  }

  /**
   * Starts the lab (ipwarden IPAM, no plugin installed, shared scratch mount, chained test plugin
   * passing) and, for source `registry`, a loopback registry; builds the image index (this
   * machine's platform from `dist`, the other cross-built into the scratch dir) and pushes it
   * there. On failure the lab and the registry are stopped.
   */
  static async start(opts: DaemonSetRunOptions, r: Reporter): Promise<DaemonSetRun> {
    const source = opts.source ?? 'registry';
    if (source === 'registry' && opts.installPackages === true) await installDebianPackages(['docker-registry'], opts.log === undefined ? {} : { log: opts.log });
    const lab = await startLab({
      ipam: 'ipwarden',
      installPlugin: false,
      sharedMounts: true,
      subnet: opts.subnet,
      chained: 'pass',
      ipamExtra: { leakGracePeriod: `${DS_GRACE_SECONDS}s` },
      installPackages: opts.installPackages ?? false,
      ...(opts.log === undefined ? {} : { log: opts.log }),
    });
    let registry: LocalRegistry | undefined;
    try {
      r.say(`lab up in ${lab.timings['start']} ms: containerd ${lab.cri.runtimeVersion.runtimeVersion}, network ${lab.networkName} ${opts.subnet}, chain bridge → ipwarden | chained test plugin | portmap; CNI bin dir without ipwarden`);
      r.check(!existsSync(join(lab.binDir, 'ipwarden')) && !existsSync(join(lab.binDir, 'ipwarden-standalone')), 'before the DaemonSet runs, the CNI bin dir holds no ipwarden file');
      if (source === 'registry') {
        registry = await startRegistry();
        r.say(`docker-registry (distribution) on ${registry.address}, plain HTTP, storage in ${registry.dir}`);
      }
      const foreign = HOST_ARCH === 'amd64' ? 'arm64' : 'amd64';
      const args = [
        ...(opts.dist === undefined ? [] : ['--dist', opts.dist]),
        '--build-cross',
        `--dist-${foreign}`,
        join(lab.scratch, `linux-${foreign}`),
        ...(opts.installPackages === true ? ['--install'] : []),
        ...(registry === undefined ? [] : ['--push', `${registry.address}/ipwarden`, '--push-plain-http']),
      ];
      const image = buildImage(join(lab.scratch, 'image-build'), args);
      r.say(`npm run image: ${image.archive} (${(image.sizeBytes / 2 ** 20).toFixed(1)} MiB, ${image.seconds} s with the ${foreign} cross build), index ${image.digest}: ${image.platforms.map((p) => `${p.platform} ${short(p.digest.slice(7))}`).join(', ')}`);
      r.check(sameSet(image.platforms.map((p) => p.platform), ['linux/amd64', 'linux/arm64']), 'the image is an index of linux/amd64 and linux/arm64');
      if (registry !== undefined) {
        r.say(`skopeo copy --all --preserve-digests → ${image.pushed?.ref}; the registry serves ${image.pushed?.digest}`);
        r.check(image.pushed?.digest === image.digest && image.pushed.byDigest === `${registry.address}/ipwarden@${image.digest}`, 'the registry serves the index under the digest the build printed');
      }
      const node = await labNode(lab);
      return new DaemonSetRun(lab, node, image, opts.dist ?? join(REPO, 'dist'), registry, r);
    } catch (e) {
      await lab.stop().catch(() => {});
      await registry?.stop().catch(() => {});
      throw e;
    }
  }

  /** The metrics port of this machine the pod's daemon listens on. */
  get metricsPort(): number {
    return this.node.ports.get(9617) as number;
  }

  /**
   * GET /metrics from the pod's port (host network: the machine's loopback), parsed.
   * @throws Error when the endpoint answers other than 200.
   */
  async scrape(): Promise<Sample[]> {
    const res = await fetch(`http://127.0.0.1:${this.metricsPort}/metrics`);
    if (res.status !== 200) throw new Error(`GET /metrics: ${res.status}`);
    return parseMetrics(await res.text());
  }

  /** Phase 1 (and again after the reboot in phase 3): import the image, run the DaemonSet pod. */
  async deploy(attempt: number): Promise<void> {
    const r = this.#r;
    const lab = this.lab;
    const ds = loadDaemonSet();
    const podSpec = (ds['spec'] as { template: { spec: { initContainers?: { image: string }[]; containers: { image: string }[] } } }).template.spec;
    const images = new Set([...(podSpec.initContainers ?? []), ...podSpec.containers].map((c) => c.image));
    r.check(images.size === 1 && images.has(this.image.image), `every container of daemonset.yaml runs the image the archive names (${this.image.image})`);
    if (this.registry !== undefined) {
      // The operator's edit for a registry: every container's image → the pushed index, by digest.
      for (const c of [...(podSpec.initContainers ?? []), ...podSpec.containers]) c.image = this.imageRef;
      this.imported = await pullImage(lab, this.imageRef);
      r.say(`ctr -n k8s.io images pull --plain-http ${this.imageRef}: ${this.imported.digest}`);
      r.check(this.imported.digest === this.image.digest, 'containerd pulled the index digest npm run image printed (and unpacked this machine\'s platform)');
    } else {
      this.imported = await importImage(lab, this.image.archive, this.image.image);
      r.say(`ctr -n k8s.io images import: ${this.imported.ref} ${this.imported.digest}`);
      r.check(this.imported.digest === this.image.digest, 'containerd lists the index digest npm run image printed');
    }
    const pod = await runDaemonSetPod(lab, this.node, { daemonSet: ds, name: `ipwarden-${lab.tag}`, uid: `${lab.tag}-ds-${attempt}` });
    this.pod = pod;
    const init = pod.initStatus.get('install-cni');
    r.say(`RunPodSandbox ${short(pod.sandboxId)} (host network, host PID) in ${pod.timings['sandbox']} ms; init container install-cni exited ${init?.exitCode} (${init?.reason}) after ${pod.timings['install-cni']} ms`);
    for (const e of pod.log('install-cni')) r.say(`  install-cni ${e.stream}: ${e.text}`);
    r.check(init?.exitCode === 0 && init.reason === 'Completed', 'install-cni ran to completion (exit 0)');
    const dest = '/host/opt/cni/bin';
    const printed = pod.log('install-cni').filter((e) => e.stream === 'stdout').map((e) => e.text.split(' ')[1]);
    r.check(sameSet(printed.map(String), ['ipwarden.d/node-name', 'ipwarden.d/runtime-endpoint', 'ipwarden', 'ipwarden-standalone', 'ipwarden-flock.node', 'ipwarden-netns'].map((n) => `${dest}/${n}`)), 'install-cni printed one "installed" line for each of the 6 files (the node name from the downward API, the runtime endpoint from CONTAINER_RUNTIME_ENDPOINT)');
    // The runtime a plugin whose ancestry finds none asks (a Multus thick daemon): the node's containerd.
    const endpointFile = join(lab.binDir, 'ipwarden.d', 'runtime-endpoint');
    r.check(existsSync(endpointFile) && readFileSync(endpointFile, 'utf8') === `unix://${lab.socketPath}\nhost ${hostname()}\n` && (statSync(endpointFile).mode & 0o777) === 0o644, `ipwarden.d/runtime-endpoint holds the lab's containerd socket (unix://${lab.socketPath}), mode 0644`);
    // The node name the standalone fallback uses in cluster pools (docs/cluster.md "The node name").
    const nodeNameFile = join(lab.binDir, 'ipwarden.d', 'node-name');
    r.check(existsSync(nodeNameFile) && readFileSync(nodeNameFile, 'utf8') === `${this.node.nodeName}\nhost ${hostname()}\n` && (statSync(nodeNameFile).mode & 0o777) === 0o644, `ipwarden.d/node-name holds spec.nodeName (${this.node.nodeName}), mode 0644`);
    const files = readdirSync(lab.binDir).filter((n) => n.startsWith('ipwarden') && n !== CHAIN_PLUGIN_TYPE && n !== 'ipwarden.d').sort();
    r.say(`CNI bin dir now: ${files.join(' ')}`);
    r.check(sameSet(files, ['ipwarden', 'ipwarden-flock.node', 'ipwarden-netns', 'ipwarden-standalone']), 'the plugin appeared in the lab\'s CNI bin dir: shim, standalone, flock binding, netns helper (no temporary file left)');
    for (const [installed, built] of [['ipwarden-standalone', 'ipwarden-standalone'], ['ipwarden-flock.node', 'ipwarden-flock.node'], ['ipwarden-netns', 'ipwarden-netns']] as const) {
      r.check(readFileSync(join(lab.binDir, installed)).equals(readFileSync(join(this.dist, built))), `${installed} is the image's file, byte for byte`);
    }
    const shim = readFileSync(join(lab.binDir, 'ipwarden'));
    r.check(readShimFields(shim).socket === lab.pluginSocket && shim.length === statSync(join(this.dist, 'ipwarden-shim')).size, `ipwarden is the image's shim with the socket field ${lab.pluginSocket}`);
    r.check(files.every((n) => (statSync(join(lab.binDir, n)).mode & 0o777) === 0o755), 'every installed file is mode 0755');
    const daemon = await pod.status('ipwarden');
    r.say(`container ipwarden ${daemon.state} (image ${daemon.imageRef}), ready after ${pod.timings['ipwarden']} ms: GET /readyz on 127.0.0.1:${this.metricsPort} → 200`);
    if (this.registry === undefined) {
      const configDigest = hostPlatform(this.image).configDigest;
      r.check(daemon.state === 'running' && daemon.imageRef === configDigest, `the daemon container runs the imported image's linux/${HOST_ARCH} manifest (containerd's image id is its config digest ${short(configDigest.slice(7))})`);
    } else {
      // CRI's image_ref of a pulled image is its repository digest; that it is the linux/amd64
      // half shows in the bytes install-cni wrote (the image's standalone = this machine's build).
      r.check(daemon.state === 'running' && daemon.imageRef === this.imageRef, `the daemon container runs the image pulled by digest (CRI image_ref ${this.imageRef})`);
    }
    const started = pod.jsonLog('ipwarden').find((l) => l.msg === 'daemon started');
    r.check(started !== undefined, 'the daemon logged "daemon started" (container log)');
  }

  /** The JSON log lines of the current DaemonSet pod's daemon container ([] without a pod). */
  #daemonLog(): Array<Record<string, unknown> & { msg?: string }> {
    const pod: DaemonSetPod | undefined = this.pod;
    return pod === undefined ? [] : pod.jsonLog('ipwarden');
  }

  /** The current daemon's `request served` log lines for `command` (default ADD) of container `id`. */
  servedLines(id: string, command = 'ADD'): Array<Record<string, unknown>> {
    return this.#daemonLog().filter((l) => l.msg === 'request served' && l['command'] === command && l['containerId'] === id);
  }

  async #waitServed(id: string, command = 'ADD'): Promise<Record<string, unknown>> {
    return pollUntil(`the daemon's "request served" ${command} line for ${short(id)}`, 30, () => this.servedLines(id, command)[0]);
  }

  /** Phase 2: two pods through the shim and the daemon. */
  async serve(): Promise<void> {
    const r = this.#r;
    const lab = this.lab;
    for (const n of [1, 2]) {
      const p = await tryRunPod(lab, `web-${n}`);
      if (!p.ok) throw new Error(`RunPodSandbox web-${n} failed: ${p.error}`);
      this.served.push(p.pod);
      const line = await this.#waitServed(p.pod.id);
      const status = await lab.cri.podSandboxStatus(p.pod.id);
      r.say(`RunPodSandbox web-${n} ${short(p.pod.id)} READY ${status.network.ip}: daemon "request served" ADD ${String(line['result'])} in ${(Number(line['durationSeconds']) * 1000).toFixed(1)} ms`);
      r.check(status.network.ip === p.pod.ip && line['result'] === 'ok', `web-${n} got ${p.pod.ip} from the daemon (its pod IP is the reservation's)`);
    }
    r.check(fallbackLines(lab).filter((l) => l.startsWith('ADD')).length === 0, 'no ADD went through the standalone fallback');
    await this.#operatorTools();
  }

  /**
   * What an operator does with `kubectl exec` and `kubectl cp` in the running daemon container
   * (read-only root, /tmp an emptyDir, capabilities dropped): the exact commands kubectl runs
   * (its pkg/cmd/cp: `test -d`, `tar -xmf - -C DIR`, `tar cf - FILE`, `sh -c "tar cf - FILE |
   * tail -c+N"` for --retries), and a shell with the image's tools.
   */
  async #operatorTools(): Promise<void> {
    const r = this.#r;
    const lab = this.lab;
    const id = this.pod?.containerIds.get('ipwarden');
    if (id === undefined) throw new Error('no daemon container');
    const exec = (args: string[], input?: Buffer): Promise<ExecResult> => execInContainer(lab, id, args, input);
    // The lab node's host paths (the manifest's /etc/cni/net.d and /var/lib/cni/networks, mapped).
    const confDir = mapPath(this.node, '/etc/cni/net.d');
    const dataDir = mapPath(this.node, '/var/lib/cni/networks');
    const page = await exec(['ipwarden', 'status', '--cni-conf-dir', confDir, '--data-dir', dataDir, '--html', '/tmp/node.html']);
    r.check(page.exitCode === 0, `kubectl exec … -- ipwarden status --html /tmp/node.html: exit 0${page.exitCode === 0 ? '' : ` (${page.exitCode}: ${page.stderr})`}`);
    const isDir = await exec(['test', '-d', '/tmp']);
    const notDir = await exec(['test', '-d', '/tmp/node.html']);
    r.check(isDir.exitCode === 0 && notDir.exitCode === 1, 'kubectl cp\'s `test -d /tmp` answers 0 (and 1 for a file)');
    const down = await exec(['tar', 'cf', '-', '/tmp/node.html']);
    const html = spawnSync('tar', ['-xOf', '-'], { input: down.stdout }).stdout.toString('utf8');
    r.say(`kubectl cp POD:/tmp/node.html (tar cf - /tmp/node.html): exit ${down.exitCode}, a ${down.stdout.length}-byte tar holding ${html.length} bytes of HTML`);
    r.check(down.exitCode === 0 && /^<!doctype html>/i.test(html) && html.includes(lab.networkName), 'the status page comes out of the pod as a tar (kubectl cp from the pod), naming the lab network');
    const resumed = await exec(['sh', '-c', 'tar cf - /tmp/node.html | tail -c+513']);
    r.check(resumed.exitCode === 0 && resumed.stdout.equals(down.stdout.subarray(512)), 'kubectl cp --retries\' resume (sh -c "tar cf - FILE | tail -c+513") gives the same tar from byte 513 on');
    const note = `uploaded to ${lab.networkName}\n`;
    const local = join(lab.scratch, 'kubectl-cp');
    mkdirSync(local, { recursive: true });
    writeFileSync(join(local, 'note.txt'), note);
    const upload = spawnSync('tar', ['-C', local, '-cf', '-', 'note.txt']).stdout;
    const up = await exec(['tar', '-xmf', '-', '-C', '/tmp'], upload);
    const cat = await exec(['cat', '/tmp/note.txt']);
    r.check(up.exitCode === 0 && cat.stdout.toString('utf8') === note, 'kubectl cp LOCAL POD:/tmp/ (tar -xmf - -C /tmp) writes the file into the pod\'s /tmp');
    const ls = await exec(['sh', '-c', `ls ${join(dataDir, lab.networkName)} | grep -c '^10\\.'; ps -o args | grep -c '^/usr/bin/ipwarden daemon'; df -P /tmp | tail -n 1 | wc -l`]);
    r.say(`kubectl exec … -- sh -c 'ls <data dir>/NET | grep -c …; ps -o args | grep -c …; df -P /tmp …': ${JSON.stringify(ls.stdout.toString('utf8'))}`);
    r.check(ls.exitCode === 0 && ls.stdout.toString('utf8').split('\n')[0] === String(lab.reservations().length), `a shell in the pod lists the network's ${lab.reservations().length} reservation files (ls, grep), sees the daemon (ps, host PID namespace) and /tmp's disk (df)`);
  }

  /** Phase 3: leaks, the reboot, the re-created DaemonSet pod, the range filled, the heal. */
  async heal(): Promise<void> {
    const r = this.#r;
    const lab = this.lab;
    const cap = capacityOf(lab.subnet);
    lab.setChainedMode('fail');
    r.say('chained plugin → fail (its ADD and DEL fail: containerd cannot tear the sandbox down, DEL never reaches the IPAM)');
    const broken: Pod[] = [];
    for (const n of [1, 2]) {
      const b = await runBrokenPod(lab, `broken-${n}`);
      broken.push(b);
      r.say(`RunPodSandbox broken-${n} ${short(b.id)} NOTREADY, holds ${b.ip}`);
    }
    this.leaked.push(...this.served, ...broken);
    this.pod?.close();
    this.pod = undefined;
    await lab.wipeRuntimeState();
    const listed = await lab.listSandboxes();
    r.say(`node reboot that loses the runtime's records (containerd, shims, every pod of the node — the DaemonSet pod too — killed; containerd root and state wiped; CNI data kept): ListPodSandbox → ${listed.length}`);
    r.check(listed.length === 0 && sameSet(lab.reservations().map((x) => x.ip), ipsOf(this.leaked)), `4 reservations owned by nobody: ${lastOctets(ipsOf(this.leaked))}`);
    r.say('the kubelet re-creates the DaemonSet pod (the image is imported again: the runtime lost it too)');
    await this.deploy(2);
    const stale = this.#daemonLog().find((l) => typeof l.msg === 'string' && /stale|removed/i.test(l.msg));
    r.say(`second daemon: ${stale === undefined ? 'no stale socket line' : `"${String(stale.msg)}"`}`);
    const notReady = await runBrokenPod(lab, 'broken-live');
    this.live.push(notReady);
    r.say(`chained plugin still failing: RunPodSandbox broken-live ${short(notReady.id)} NOTREADY holds ${notReady.ip} (live: listed)`);
    lab.setChainedMode('pass');
    let failures = 0;
    while (lab.reservations().length < cap) {
      const p = await tryRunPod(lab, `app-${this.live.length}`);
      if (!p.ok) {
        failures++;
        r.say(`RunPodSandbox app-${this.live.length} FAILED: ${p.error}`);
        break;
      }
      this.live.push(p.pod);
    }
    r.say(`chained plugin → pass: ${this.live.length - 1} READY pods ${lastOctets(ipsOf(this.live.slice(1)))}; range full: ${lab.reservations().length}/${cap} reserved`);
    const before = new Map(lab.reservations().map((x) => [x.ip, readFileSync(join(lab.networkDir, x.ip), 'utf8')]));
    for (const p of this.leaked) before.delete(p.ip);
    await waitUntilOlder(lab, ipsOf(this.leaked), DS_GRACE_SECONDS);
    r.say(`waited until the leaked files are older than leakGracePeriod ${DS_GRACE_SECONDS}s`);
    const more = await tryRunPod(lab, 'one-more');
    if (more.ok) {
      this.healed = more.pod;
      r.say(`RunPodSandbox one-more ${short(more.pod.id)} READY ${more.pod.ip}: the daemon reclaimed the leaked reservations while serving its ADD`);
    } else {
      failures++;
      r.say(`RunPodSandbox one-more FAILED: ${more.error}`);
    }
    r.check(failures === 0, 'no RunPodSandbox failed (every pod started at its first attempt)');
    r.check(more.ok && more.pod.ip === ipsOf(this.leaked)[0], `the pod that met the exhausted range starts, on the first reclaimed address ${ipsOf(this.leaked)[0]}`);
    if (more.ok) {
      const line = await this.#waitServed(more.pod.id);
      r.check(line['result'] === 'ok', 'its ADD was served by the daemon ("request served", result ok)');
    }
    const audit = auditLines(lab);
    for (const a of audit) r.say(`audit: ${a.ip} ${short(a.containerId ?? '-')} ${a.reason}`);
    r.check(sameSet(audit.map((a) => a.ip), ipsOf(this.leaked)) && audit.every((a) => a.reason.startsWith('reclaimed on exhaustion')), `audit log: one "reclaimed on exhaustion" line per leaked reservation (${audit.length})`);
    const after = new Map(lab.reservations().map((x) => [x.ip, readFileSync(join(lab.networkDir, x.ip), 'utf8')]));
    r.check([...before].every(([ip, c]) => after.get(ip) === c), `the live reservations are untouched: NOTREADY ${notReady.ip} and ${this.live.length - 1} READY`);
    const passes = this.#daemonLog().filter((l) => l.msg === 'reconcile pass');
    r.check(passes.every((p) => p['released'] === 0), `the daemon's passes (${passes.length}, default grace 5m) released nothing: the heal was the request path's`);
    this.addsServedBySecond = this.#daemonLog().filter((l) => l.msg === 'request served' && l['command'] === 'ADD' && l['result'] === 'ok').length;
    r.check(this.addsServedBySecond === this.live.length + 1, `the second daemon served every ADD since it started (${this.addsServedBySecond} = 1 NOTREADY + ${this.live.length - 1} READY + one-more)`);
  }

  /** Phase 4: the metrics, scraped from the pod's port. */
  async metrics(): Promise<void> {
    const r = this.#r;
    const m = await this.scrape();
    const daemonAdds = sampleSum(m, 'ipwarden_cni_requests_total', { command: 'ADD', path: 'daemon', result: 'ok' });
    const fallbackAdds = sampleSum(m, 'ipwarden_cni_requests_total', { command: 'ADD', path: 'standalone' });
    r.say(`GET http://127.0.0.1:${this.metricsPort}/metrics: ipwarden_cni_requests_total{command="ADD",path="daemon",result="ok"} ${daemonAdds}, {path="standalone"} ${fallbackAdds}`);
    r.check(daemonAdds === this.addsServedBySecond, `the scraped ADD count through the daemon is ${this.addsServedBySecond}`);
    r.check(fallbackAdds === 0, 'the scraped ADD count through the standalone is 0');
    const healthz = await fetch(`http://127.0.0.1:${this.metricsPort}/healthz`);
    r.check(healthz.status === 200, 'the liveness probe (GET /healthz) answers 200');
  }

  /** Phase 5: the pod stopped like a deleted pod; pods start and stop through the standalone. */
  async fallback(): Promise<void> {
    const r = this.#r;
    const lab = this.lab;
    const pod = this.pod;
    if (pod === undefined) throw new Error('no DaemonSet pod');
    const stopped = await pod.stop();
    const st = stopped.get('ipwarden');
    r.say(`StopContainer ipwarden (grace ${pod.plan.graceSeconds} s) → exited ${st?.exitCode} (${st?.reason}); StopPodSandbox ${short(pod.sandboxId)}`);
    r.check(st?.state === 'exited' && st.exitCode === 0 && st.reason === 'Completed', 'the daemon stopped cleanly on SIGTERM (exit 0, Completed)');
    r.check(!existsSync(lab.pluginSocket), 'the daemon removed its socket');
    const before = fallbackLines(lab).length;
    const p = await tryRunPod(lab, 'after-daemonset');
    if (p.ok) r.say(`RunPodSandbox after-daemonset ${short(p.pod.id)} READY ${p.pod.ip} (shim → ipwarden-standalone in the bin dir)`);
    else r.say(`RunPodSandbox after-daemonset FAILED: ${p.error}`);
    r.check(p.ok && p.pod.ip !== '', 'with the DaemonSet pod stopped, a pod starts (the fallback path)');
    if (p.ok) {
      await lab.stopAndRemove(p.pod.id);
      r.check(!existsSync(join(lab.networkDir, p.pod.ip)), `and its stop releases ${p.pod.ip}`);
    }
    const counted = fallbackLines(lab).slice(before);
    r.say(`standalone-requests.log: ${counted.join(', ')}`);
    // StopPodSandbox runs DEL, RemovePodSandbox runs it again (containerd-lab.md §2): two DELs.
    r.check(counted.join(', ') === 'ADD ok, DEL ok, DEL ok', 'standalone-requests.log counts exactly that ADD and its two DELs (StopPodSandbox, RemovePodSandbox), all ok');
    await pod.remove();
    pod.close();
    await runCtr(lab, ['images', 'rm', this.imageRef]);
    r.say(`RemovePodSandbox ${short(pod.sandboxId)}; ctr images rm ${this.imageRef}`);
  }

  /** Stops the lab (every sandbox, containerd, mounts, the scratch dir with the image) and the registry (its process and storage). */
  async stop(): Promise<void> {
    this.pod?.close();
    try {
      await this.lab.stop();
    } finally {
      await this.registry?.stop();
    }
  }
}

async function runCtr(lab: Lab, args: string[]): Promise<void> {
  await run('ctr', ['--address', lab.socketPath, '-n', 'k8s.io', ...args]);
}

