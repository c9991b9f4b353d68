/**
 * The containerd lab: a private, real containerd 1.6 with the CRI plugin and real CNI plugins
 * (bridge + host-local or ipwarden + portmap, optionally a chained test plugin), started from a
 * scratch directory and torn down without touching anything that is not ours.
 *
 * Used by the e2e tests and by `npm run lab`. Needs root, Linux, `containerd`, `ctr`, `runc`,
 * `/usr/lib/cni/{bridge,host-local,loopback,portmap}`, `gcc`, `tar` and `ip`. Every choice below
 * (config keys, sharp edges, leak scenarios, cleanup rules) comes from
 * shared/reference/containerd-lab.md.
 *
 * What is "ours": the containerd process we spawned (by pid); shims whose argv holds exactly
 * `-address <our socket>`; processes in our cgroup parent; processes running a program from our
 * CNI bin dir; mounts under the scratch dir; our bridge and the veths enslaved to it; result
 * cache files of our network name and of our sandbox ids; shim sockets of our sandbox ids; cgroup
 * dirs under our cgroup parent. Nothing is found by a name pattern.
 */
import { spawn } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import {
  chmodSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  closeSync,
  readdirSync,
  readFileSync,
  rmSync,
  rmdirSync,
  statSync,
  symlinkSync,
  unlinkSync,
  writeFileSync,
  lstatSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { ClosedError } from '../common/errors.ts';
import { CriClient, type Sandbox } from '../runtime/cri-client.ts';
import { withRetry } from '../runtime/retry.ts';
import { CHAIN_PLUGIN_TYPE, chainModeText, writeChainPlugin, type ChainedMode } from './chain-plugin.ts';
import { installDebianPackages } from '../../scripts/debian-packages.mjs';
import { buildPauseImage, PAUSE_IMAGE } from './image.ts';
import { allPids, argvOf, cgroupsOf, isAlive, killAndWait, run, signal, waitGone } from './proc.ts';

export type { ChainedMode } from './chain-plugin.ts';

/** IPAM plugin the lab network uses. */
export type LabIpam = 'host-local' | 'ipwarden';

/** Options of {@link startLab}. */
export interface LabOptions {
  /** IPAM `type` of the network. Default `host-local`. */
  ipam?: LabIpam;
  /**
   * Executable used as the `ipwarden` IPAM plugin (symlinked into the bin dir). Default for
   * `ipam: 'ipwarden'`: the built bundle (`dist/ipwarden.cjs`) installed into the bin dir with
   * `ipwarden install-cni --dest <binDir> --socket <Lab.pluginSocket>`, exactly as an operator
   * installs it (the shim, the standalone plugin and the flock binding).
   */
  ipwardenPath?: string;
  /**
   * Extra keys merged into the conflist's `ipam` object (e.g. `{ reclaimOnExhaustion: false,
   * leakGracePeriod: '2s' }`). With `ipam: 'ipwarden'` the lab sets `runtimeEndpoint` to its own
   * containerd unless given here, so the plugin never asks the host's runtime.
   */
  ipamExtra?: Record<string, unknown>;
  /**
   * With `ipam: 'ipwarden'` and no `ipwardenPath`: install the plugin into the bin dir at start
   * (`install-cni`, as above). Default true. False leaves the bin dir without ipwarden, for a run
   * in which something else installs it (the DaemonSet pod's init container, src/lab/daemonset.ts).
   */
  installPlugin?: boolean;
  /**
   * Make the scratch dir a shared mount of its own (`mount --bind`, `--make-rshared`) before
   * containerd starts, as `/` is on a systemd node: containerd's CRI refuses a `HostToContainer`
   * (rslave) mount whose source is on a private mount (`… is not a shared or slave mount`), and
   * `/` of this machine is private. Undone by {@link Lab.stop}. Default false.
   */
  sharedMounts?: boolean;
  /** Pod subnet. Default `10.244.9.0/28` (13 usable addresses, .2–.14). */
  subnet?: string;
  /** Add the chained test plugin after `bridge`, starting in this mode. Default: no chained plugin. */
  chained?: ChainedMode;
  /** ADD stall of the chained plugin in `stall` mode, in seconds. Default 5. */
  stallSeconds?: number;
  /** `cniVersion` of the conflist. Default `1.0.0`. */
  cniVersion?: string;
  /** Run `apt-get install -y` of the lab's Debian packages (containerd, runc, CNI plugins, gcc, libc6-dev, iproute2) when something is missing. Default false. */
  installPackages?: boolean;
  /** Where the scratch dir is created. Default `os.tmpdir()` (must not be overlayfs: the overlayfs snapshotter needs a real fs). */
  scratchParent?: string;
  /** Deadline of the lab's CRI calls, in seconds. Default 30. */
  timeoutSeconds?: number;
  /** Progress lines (default: none). */
  log?: (line: string) => void;
}

/** A host-local format reservation file read from the network dir. */
export interface Reservation {
  ip: string;
  /** Container (sandbox) id, first line of the file. */
  id: string;
  /** Interface name, second line ('' for the old id-only format). */
  ifname: string;
}

/** A running lab. */
export interface Lab {
  /** `unix://<scratch>/run/containerd.sock`. */
  readonly endpoint: string;
  /** Path of containerd's CRI socket. */
  readonly socketPath: string;
  /** IPAM `dataDir`; reservations are in `<dataDir>/<networkName>/`. */
  readonly dataDir: string;
  /** `<dataDir>/<networkName>`. */
  readonly networkDir: string;
  /** Unique CNI network name (`ipwlab-<tag>`). */
  readonly networkName: string;
  /** Unique bridge name (`ipwl<tag>`, ≤ 15 chars). */
  readonly bridge: string;
  /** The conflist path (only file in the CNI conf dir). */
  readonly confPath: string;
  /** containerd's CNI `conf_dir` (`<scratch>/cni/net.d`), the daemon's `--cni-conf-dir`. */
  readonly confDir: string;
  /**
   * The ipwarden daemon socket of this lab, `<scratch>/run/ipwarden/plugin.sock` (its directory is
   * created 0700 at start). With `ipam: 'ipwarden'` the shim is installed with `install-cni
   * --socket <this>`, so the lab's pods talk to a daemon started on this path (`ipwarden daemon
   * --socket <this>`) and never to the host's `/run/ipwarden/plugin.sock`; with no daemon there the
   * shim falls back to the standalone plugin, which counts the request in
   * `<scratch>/run/ipwarden/standalone-requests.log` (docs/daemon.md).
   */
  readonly pluginSocket: string;
  /** CNI bin dir (symlinks to /usr/lib/cni plugins, the chained plugin, ipwarden). */
  readonly binDir: string;
  /** The scratch dir holding everything of this lab. */
  readonly scratch: string;
  /** `linux.cgroup_parent` of every sandbox the lab creates (`/ipwarden-lab-<tag>`). */
  readonly cgroupParent: string;
  readonly subnet: string;
  /** containerd's pid (changes after {@link Lab.wipeRuntimeState}). */
  readonly containerdPid: number;
  /** The lab's own CRI client (reconnected after a wipe). */
  readonly cri: CriClient;
  /** Milliseconds spent in each start/stop step. */
  readonly timings: Record<string, number>;
  /** The unique tag of this lab (6 hex digits), part of every name it creates. */
  readonly tag: string;
  /** Creates a READY sandbox (unique uid, our cgroup parent) and returns its 64-hex id. */
  runSandbox(name?: string): Promise<string>;
  /** StopPodSandbox then RemovePodSandbox. */
  stopAndRemove(id: string): Promise<void>;
  /** ListPodSandbox, all states. */
  listSandboxes(): Promise<Sandbox[]>;
  /** Reservation files in the network dir (IP-named files only), sorted by IP text. */
  reservations(): Reservation[];
  /** Switches the chained plugin (takes effect on its next invocation). */
  setChainedMode(mode: ChainedMode, stallSeconds?: number): void;
  /** Lines of the chained plugin's invocation log: `<ms> <pid> <CMD> <id>`. */
  chainLog(): string[];
  /**
   * Leak scenario "b2": SIGKILL containerd, its shims and our pause processes, unmount under
   * scratch, wipe containerd root + state + runc root, KEEP the CNI dataDir, restart containerd,
   * re-import the image. Afterwards ListPodSandbox is empty and every reservation is orphaned.
   */
  wipeRuntimeState(): Promise<void>;
  /**
   * Removes everything the lab created (see the module comment). Safe to call any number of
   * times and after a failed start; never throws for a missing piece. Rejects only when
   * something of ours could not be removed, listing what.
   */
  stop(): Promise<void>;
}

const CNI_SYSTEM_DIR = '/usr/lib/cni';
/** The built CLI/plugin bundle of this checkout (`npm run build`). */
export const IPWARDEN_BUNDLE = join(fileURLToPath(new URL('.', import.meta.url)), '..', '..', 'dist', 'ipwarden.cjs');
const CNI_RESULTS_DIR = '/var/lib/cni/results';
const SHIM_SOCKET_DIR = '/run/containerd/s';
const CGROUP_ROOT = '/sys/fs/cgroup';
const K8S_NAMESPACE = 'k8s.io';
const REQUIRED_BINARIES = ['containerd', 'ctr', 'runc'];
/** Tools the lab runs besides the runtime (gcc with static libc for the pause image). */
const TOOLS = ['gcc', 'tar', 'ip', 'umount'];
/** Debian packages `installPackages` installs when a binary or tool is missing. */
const LAB_PACKAGES = ['containerd', 'runc', 'containernetworking-plugins', 'gcc', 'libc6-dev', 'iproute2', 'tar', 'mount'];

/** Why the lab cannot run here, or undefined when it can (root, Linux, binaries present). */
export function labUnavailableReason(): string | undefined {
  if (process.platform !== 'linux') return 'the containerd lab needs Linux';
  if (process.getuid?.() !== 0) return 'the containerd lab needs root';
  const missing = [...missingPrerequisites(), ...TOOLS.filter((t) => !onPath(t))];
  if (missing.length > 0) return `the containerd lab needs ${missing.join(', ')} (Debian: apt-get install -y containerd runc containernetworking-plugins)`;
  return undefined;
}

function onPath(bin: string): boolean {
  return (process.env['PATH'] ?? '/usr/sbin:/usr/bin:/sbin:/bin')
    .split(':')
    .some((d) => d !== '' && existsSync(join(d, bin)));
}

function missingPrerequisites(): string[] {
  const missing = REQUIRED_BINARIES.filter((b) => !onPath(b));
  for (const p of ['bridge', 'host-local', 'loopback', 'portmap']) {
    if (!existsSync(join(CNI_SYSTEM_DIR, p))) missing.push(join(CNI_SYSTEM_DIR, p));
  }
  return missing;
}

function containerdToml(x: string, socket: string, bin: string, conf: string): string {
  return `version = 2
root = "${x}/root"
state = "${x}/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = "${socket}"

[ttrpc]
  address = "${socket}.ttrpc"

[debug]
  address = ""

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "${x}/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "${PAUSE_IMAGE}"
  netns_mounts_under_state_dir = true
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = "${x}/runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "${bin}"
    conf_dir = "${conf}"
    max_conf_num = 1
`;
}

function since(t0: number): number {
  return Math.round(performance.now() - t0);
}

/** Mount points under `dir` (from /proc/self/mountinfo), deepest first. */
function mountsUnder(dir: string): string[] {
  const prefix = dir.endsWith('/') ? dir : `${dir}/`;
  const unescape = (s: string): string => s.replace(/\\([0-7]{3})/g, (_, o: string) => String.fromCharCode(parseInt(o, 8)));
  return readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .map((l) => l.split(' ')[4])
    .filter((m): m is string => m !== undefined)
    .map(unescape)
    .filter((m) => m.startsWith(prefix))
    .sort((a, b) => b.length - a.length);
}

/** True when `dir` itself is a mount point (from /proc/self/mountinfo). */
function isMountPoint(dir: string): boolean {
  const unescape = (s: string): string => s.replace(/\\([0-7]{3})/g, (_, o: string) => String.fromCharCode(parseInt(o, 8)));
  return readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .some((l) => l.split(' ')[4] !== undefined && unescape(l.split(' ')[4] as string) === dir);
}

/** Hierarchy roots under /sys/fs/cgroup (v1 controllers, named, unified; or the v2 root itself). */
function cgroupHierarchies(): string[] {
  if (existsSync(join(CGROUP_ROOT, 'cgroup.controllers'))) return [CGROUP_ROOT];
  try {
    return readdirSync(CGROUP_ROOT)
      .map((n) => join(CGROUP_ROOT, n))
      .filter((p) => {
        try {
          return lstatSync(p).isDirectory(); // skips cpu,cpuacct style symlinks
        } catch {
          return false;
        }
      });
  } catch {
    return [];
  }
}

/** rmdir `dir` and its sub-directories bottom-up; returns the dirs that could not be removed. */
function rmdirTree(dir: string): string[] {
  let entries: string[];
  try {
    entries = readdirSync(dir, { withFileTypes: true })
      .filter((e) => e.isDirectory())
      .map((e) => join(dir, e.name));
  } catch {
    return [];
  }
  const left = entries.flatMap(rmdirTree);
  try {
    rmdirSync(dir);
  } catch (e) {
    if ((e as { code?: string }).code !== 'ENOENT') left.push(dir);
  }
  return left;
}

/**
 * Starts a lab. On any failure the partial lab is stopped before the error is rethrown.
 * @throws Error when a prerequisite is missing (see {@link labUnavailableReason}), containerd
 *   exits or its CRI does not answer within 20 s (message includes the log tail).
 */
export async function startLab(opts: LabOptions = {}): Promise<Lab> {
  const t0 = performance.now();
  const log = opts.log ?? ((): void => {});
  const timings: Record<string, number> = {};
  if (opts.installPackages === true && (missingPrerequisites().length > 0 || TOOLS.some((t) => !onPath(t)))) {
    const t = performance.now();
    await installDebianPackages(LAB_PACKAGES, { log });
    timings['apt'] = since(t);
  }
  const unavailable = labUnavailableReason();
  if (unavailable !== undefined) throw new Error(unavailable);
  if (opts.ipam === 'ipwarden' && opts.ipwardenPath === undefined && opts.installPlugin !== false && !existsSync(IPWARDEN_BUNDLE)) {
    throw new Error(`startLab: ipam 'ipwarden' needs a built bundle at ${IPWARDEN_BUNDLE} (run "npm run build") or ipwardenPath`);
  }

  const tag = randomBytes(3).toString('hex');
  const scratch = mkdtempSync(join(opts.scratchParent ?? tmpdir(), `ipwarden-lab-${tag}-`));
  const lab = new LabImpl(scratch, tag, opts, timings, log);
  try {
    await lab.start();
  } catch (e) {
    await lab.stop().catch(() => {});
    throw e;
  }
  timings['start'] = since(t0);
  return lab;
}

/** Scratch dirs of labs (`ipwarden-lab-<tag>-*`) directly under `parent` (default `os.tmpdir()`). */
export function findLabScratchDirs(parent: string = tmpdir()): string[] {
  try {
    return readdirSync(parent)
      .filter((n) => /^ipwarden-lab-[0-9a-f]{6}-[A-Za-z0-9]{6}$/.test(n))
      .map((n) => join(parent, n));
  } catch {
    return [];
  }
}

/**
 * Tears down a lab left behind by a process that died before calling `stop()`: derives the
 * names from the scratch dir's tag, adopts its containerd by pid file and argv, then runs the
 * same cleanup as {@link Lab.stop}.
 * @throws Error when `scratch` is not a lab scratch dir, or (like stop) when something is left.
 */
export async function reapStaleLab(scratch: string): Promise<void> {
  const tag = /ipwarden-lab-([0-9a-f]{6})-[A-Za-z0-9]{6}$/.exec(scratch)?.[1];
  if (tag === undefined) throw new Error(`reapStaleLab: ${scratch} is not a lab scratch dir`);
  const lab = new LabImpl(scratch, tag, {}, {}, () => {});
  lab.adoptContainerd();
  await lab.stop();
}

class LabImpl implements Lab {
  readonly scratch: string;
  readonly endpoint: string;
  readonly socketPath: string;
  readonly dataDir: string;
  readonly networkDir: string;
  readonly networkName: string;
  readonly bridge: string;
  readonly confPath: string;
  readonly confDir: string;
  readonly pluginSocket: string;
  readonly binDir: string;
  readonly cgroupParent: string;
  readonly subnet: string;
  readonly timings: Record<string, number>;
  readonly tag: string;
  readonly #opts: LabOptions;
  readonly #log: (line: string) => void;
  readonly #tag: string;
  readonly #modeFile: string;
  readonly #chainLogFile: string;
  readonly #knownIds = new Set<string>();
  #imageArchive = '';
  #containerdPid = -1;
  #cri: CriClient | undefined;
  #counter = 0;
  #stopping: Promise<void> | undefined;

  constructor(scratch: string, tag: string, opts: LabOptions, timings: Record<string, number>, log: (line: string) => void) {
    this.scratch = scratch;
    this.#tag = tag;
    this.tag = tag;
    this.#opts = opts;
    this.#log = log;
    this.timings = timings;
    this.socketPath = join(scratch, 'run', 'containerd.sock');
    this.endpoint = `unix://${this.socketPath}`;
    this.dataDir = join(scratch, 'cni', 'networks');
    this.networkName = `ipwlab-${tag}`;
    this.networkDir = join(this.dataDir, this.networkName);
    this.bridge = `ipwl${tag}`;
    this.binDir = join(scratch, 'cni', 'bin');
    this.confDir = join(scratch, 'cni', 'net.d');
    this.confPath = join(this.confDir, `10-${this.networkName}.conflist`);
    this.pluginSocket = join(scratch, 'run', 'ipwarden', 'plugin.sock');
    this.cgroupParent = `/ipwarden-lab-${tag}`;
    this.subnet = opts.subnet ?? '10.244.9.0/28';
    this.#modeFile = join(scratch, 'chained-mode');
    this.#chainLogFile = join(scratch, 'logs', 'chained.log');
  }

  get cri(): CriClient {
    if (this.#cri === undefined) throw new ClosedError('lab CRI client');
    return this.#cri;
  }

  get containerdPid(): number {
    return this.#containerdPid;
  }

  /** Adopts the containerd of a lab left behind by a crashed process (pid file + exact argv check). */
  adoptContainerd(): void {
    try {
      const pid = Number(readFileSync(join(this.scratch, 'run', 'containerd.pid'), 'utf8').trim());
      const argv = argvOf(pid);
      if (argv?.[0] === 'containerd' && argv[1] === '--config' && argv[2] === join(this.scratch, 'containerd.toml')) {
        this.#containerdPid = pid;
      }
    } catch {
      // no pid file: containerd never started
    }
  }

  /** Starts a fresh lab in the (empty) scratch dir. */
  async start(): Promise<void> {
    const x = this.scratch;
    let t = performance.now();
    for (const d of ['run', 'root', 'state', 'runc', 'opt', 'cni/bin', 'cni/net.d', 'cni/networks', 'logs', 'image']) {
      mkdirSync(join(x, d), { recursive: true });
    }
    // The daemon's socket dir: root-owned, 0700 (the daemon and the fallback counting require it).
    mkdirSync(dirname(this.pluginSocket), { mode: 0o700 });
    chmodSync(dirname(this.pluginSocket), 0o700);
    if (this.#opts.sharedMounts === true) {
      await run('mount', ['--bind', x, x]);
      await run('mount', ['--make-rshared', x]);
    }
    const image = await buildPauseImage(join(x, 'image'));
    this.#imageArchive = image.archive;
    this.timings['image'] = since(t);

    t = performance.now();
    for (const p of ['bridge', 'host-local', 'loopback', 'portmap']) symlinkSync(join(CNI_SYSTEM_DIR, p), join(this.binDir, p));
    if (this.#opts.ipwardenPath !== undefined) symlinkSync(this.#opts.ipwardenPath, join(this.binDir, 'ipwarden'));
    else if (this.#opts.ipam === 'ipwarden' && this.#opts.installPlugin !== false) {
      await run(process.execPath, [IPWARDEN_BUNDLE, 'install-cni', '--dest', this.binDir, '--socket', this.pluginSocket]);
    }
    writeChainPlugin(join(this.binDir, CHAIN_PLUGIN_TYPE), this.#modeFile, this.#chainLogFile);
    this.setChainedMode(this.#opts.chained ?? 'pass', this.#opts.stallSeconds);
    writeFileSync(join(x, 'containerd.toml'), containerdToml(x, this.socketPath, this.binDir, this.confDir));
    writeFileSync(this.confPath, `${JSON.stringify(this.#conflist(), null, 2)}\n`);
    this.timings['config'] = since(t);

    await this.#startContainerd();
  }

  #conflist(): object {
    const plugins: object[] = [
      {
        type: 'bridge',
        bridge: this.bridge,
        isGateway: false,
        ipMasq: false,
        ipam: {
          type: this.#opts.ipam ?? 'host-local',
          ranges: [[{ subnet: this.subnet }]],
          dataDir: this.dataDir,
          ...(this.#opts.ipam === 'ipwarden' ? { runtimeEndpoint: this.endpoint } : {}),
          ...this.#opts.ipamExtra,
        },
      },
    ];
    if (this.#opts.chained !== undefined) plugins.push({ type: CHAIN_PLUGIN_TYPE });
    plugins.push({ type: 'portmap', capabilities: { portMappings: true } });
    return { cniVersion: this.#opts.cniVersion ?? '1.0.0', name: this.networkName, plugins };
  }

  async #startContainerd(): Promise<void> {
    let t = performance.now();
    const logPath = join(this.scratch, 'logs', 'containerd.log');
    const fd = openSync(logPath, 'a');
    // detached: the child calls setsid(), so containerd is its own session leader (no terminal
    // signals from ours) and its pid is the one we track.
    const child = spawn('containerd', ['--config', join(this.scratch, 'containerd.toml')], {
      detached: true,
      stdio: ['ignore', fd, fd],
    });
    closeSync(fd);
    child.unref();
    this.#containerdPid = child.pid ?? -1;
    writeFileSync(join(this.scratch, 'run', 'containerd.pid'), `${this.#containerdPid}\n`);
    const exited = new AbortController();
    child.once('exit', () => exited.abort());
    child.once('error', () => exited.abort());
    try {
      this.#cri = await withRetry({ attempts: 400, initialDelaySeconds: 0.05, signal: exited.signal }, () =>
        CriClient.connect(this.endpoint, { timeoutSeconds: this.#opts.timeoutSeconds ?? 30 }),
      );
    } catch (e) {
      const tail = readFileSync(logPath, 'utf8').split('\n').slice(-15).join('\n');
      throw new Error(`containerd did not become ready (${e instanceof Error ? e.message : String(e)}); log tail:\n${tail}`, { cause: e });
    }
    this.timings['containerd-ready'] = since(t);
    t = performance.now();
    await run('ctr', ['--address', this.socketPath, '-n', K8S_NAMESPACE, 'images', 'import', this.#imageArchive]);
    this.timings['image-import'] = since(t);
    this.#log(`containerd ${this.#cri.runtimeVersion.runtimeVersion} ready at ${this.endpoint} (pid ${String(child.pid)})`);
  }

  async runSandbox(name?: string): Promise<string> {
    const n = ++this.#counter;
    const id = await this.cri.runPodSandbox({
      name: name ?? `pod${n}`,
      uid: `${this.#tag}-${n}`,
      namespace: 'ipwarden-lab',
      labels: { 'ipwarden-lab': this.#tag },
      cgroupParent: this.cgroupParent,
    });
    this.#knownIds.add(id);
    return id;
  }

  async stopAndRemove(id: string): Promise<void> {
    await this.cri.stopPodSandbox(id);
    await this.cri.removePodSandbox(id);
  }

  async listSandboxes(): Promise<Sandbox[]> {
    const list = await this.cri.listPodSandboxes();
    for (const s of list) this.#knownIds.add(s.id);
    return list;
  }

  reservations(): Reservation[] {
    let names: string[];
    try {
      names = readdirSync(this.networkDir);
    } catch {
      return [];
    }
    return names
      .filter((n) => n !== 'lock' && !n.startsWith('last_reserved_ip') && (/^[0-9.]+$/.test(n) || n.includes(':')))
      .sort()
      .map((ip) => {
        const [id = '', ifname = ''] = readFileSync(join(this.networkDir, ip), 'utf8').split('\r\n');
        return { ip, id, ifname };
      });
  }

  setChainedMode(mode: ChainedMode, stallSeconds?: number): void {
    writeFileSync(this.#modeFile, chainModeText(mode, stallSeconds ?? this.#opts.stallSeconds));
  }

  chainLog(): string[] {
    try {
      return readFileSync(this.#chainLogFile, 'utf8').split('\n').filter((l) => l !== '');
    } catch {
      return [];
    }
  }

  /** Our shim processes: containerd-shim* with exactly `-address <our socket>` in argv. */
  #shimPids(): number[] {
    return allPids().filter((pid) => {
      const argv = argvOf(pid);
      if (argv === undefined || argv.length === 0) return false;
      const i = argv.indexOf('-address');
      return (argv[0] ?? '').includes('containerd-shim') && i >= 0 && argv[i + 1] === this.socketPath;
    });
  }

  /** Processes in our cgroup parent (pause and anything else our sandboxes run). */
  #cgroupPids(): number[] {
    const p = this.cgroupParent;
    return allPids().filter((pid) => cgroupsOf(pid).some((c) => c === p || c.startsWith(`${p}/`)));
  }

  /** Processes running a program from our CNI bin dir (plugins, including the Node chained plugin). */
  #pluginPids(): number[] {
    const prefix = `${this.binDir}/`;
    return allPids().filter((pid) => {
      const argv = argvOf(pid);
      return argv !== undefined && ((argv[0] ?? '').startsWith(prefix) || (argv[1] ?? '').startsWith(prefix));
    });
  }

  /** Ids we know of: created, listed, or named in our network's result cache entries. */
  #allKnownIds(): Set<string> {
    const ids = new Set(this.#knownIds);
    const re = new RegExp(`^${this.networkName}-([0-9a-f]{64})-`);
    try {
      for (const n of readdirSync(CNI_RESULTS_DIR)) {
        const m = re.exec(n);
        if (m?.[1] !== undefined) ids.add(m[1]);
      }
    } catch {
      // no results dir
    }
    for (const r of this.reservations()) if (/^[0-9a-f]{64}$/.test(r.id)) ids.add(r.id);
    return ids;
  }

  async #killRuntime(): Promise<void> {
    const pids = [this.containerdPid, ...this.#shimPids(), ...this.#cgroupPids()].filter((p) => p > 0);
    await killAndWait(pids);
  }

  async #unmountAll(): Promise<string[]> {
    for (let pass = 0; pass < 3; pass++) {
      const mounts = mountsUnder(this.scratch);
      if (mounts.length === 0) return [];
      for (const m of mounts) await run('umount', ['-l', m]).catch(() => {});
    }
    return mountsUnder(this.scratch);
  }

  #removeShimSockets(ids: Iterable<string>): void {
    // containerd 1.6 names a shim socket sha256(<grpc address>/<namespace>/<id>) under /run/containerd/s.
    for (const id of ids) {
      const hash = createHash('sha256').update(join(this.socketPath, K8S_NAMESPACE, id)).digest('hex');
      rmSync(join(SHIM_SOCKET_DIR, hash), { force: true });
    }
  }

  #removeCgroups(): string[] {
    return cgroupHierarchies().flatMap((h) => rmdirTree(join(h, this.cgroupParent)));
  }

  async wipeRuntimeState(): Promise<void> {
    const t = performance.now();
    const ids = this.#allKnownIds();
    this.#cri?.close();
    this.#cri = undefined;
    await this.#killRuntime();
    const left = await this.#unmountAll();
    if (left.length > 0) throw new Error(`wipeRuntimeState: still mounted: ${left.join(', ')}`);
    for (const d of ['root', 'state', 'runc']) {
      rmSync(join(this.scratch, d), { recursive: true, force: true });
      mkdirSync(join(this.scratch, d));
    }
    this.#removeShimSockets(ids);
    this.#removeCgroups();
    await this.#startContainerd();
    this.timings['wipe'] = since(t);
  }

  stop(): Promise<void> {
    this.#stopping ??= this.#doStop();
    return this.#stopping;
  }

  async #doStop(): Promise<void> {
    const t0 = performance.now();
    const problems: string[] = [];
    const step = async (what: string, fn: () => unknown): Promise<void> => {
      try {
        await fn();
      } catch (e) {
        problems.push(`${what}: ${e instanceof Error ? e.message : String(e)}`);
      }
    };

    // 1. Let containerd tear our sandboxes down normally (runs CNI DEL, unmounts, removes cgroups).
    await step('remove sandboxes', async () => {
      if (existsSync(this.#modeFile)) this.setChainedMode('pass');
      if (this.#cri === undefined || !isAlive(this.containerdPid)) return;
      const list = await this.#cri.listPodSandboxes().catch(() => [] as Sandbox[]);
      for (const s of list) this.#knownIds.add(s.id);
      await Promise.all(list.map((s) => this.stopAndRemove(s.id).catch(() => {})));
    });
    this.#cri?.close();
    this.#cri = undefined;
    const ids = this.#allKnownIds();

    // 2. containerd: SIGTERM, SIGKILL after 5 s.
    const t = performance.now();
    const pid = this.containerdPid;
    if (pid > 0 && isAlive(pid)) {
      signal(pid, 'SIGTERM');
      const left = await waitGone([pid], 5);
      if (left.length > 0) await killAndWait(left);
    }
    this.timings['containerd-stop'] = since(t);

    // 3. Whatever of ours still runs.
    await step('kill leftovers', async () => {
      const pids = [...this.#shimPids(), ...this.#cgroupPids(), ...this.#pluginPids()];
      if (pids.length > 0) await killAndWait(pids);
      const still = pids.filter(isAlive);
      if (still.length > 0) throw new Error(`still running: ${still.join(', ')}`);
    });

    // 4. Mounts under scratch (netns, rootfs, shm).
    await step('unmount', async () => {
      const left = await this.#unmountAll();
      if (left.length > 0) throw new Error(`still mounted: ${left.join(', ')}`);
    });

    // 5. Veths on our bridge, then the bridge.
    await step('network links', async () => {
      const exists = await run('ip', ['link', 'show', 'dev', this.bridge]).then(() => true, () => false);
      if (!exists) return;
      const { stdout } = await run('ip', ['-j', 'link', 'show', 'master', this.bridge]);
      const veths = (JSON.parse(stdout || '[]') as { ifname: string }[]).map((l) => l.ifname);
      for (const v of veths) await run('ip', ['link', 'del', 'dev', v]).catch(() => {});
      await run('ip', ['link', 'del', 'dev', this.bridge]);
    });

    // 6. libcni result cache entries of our network and our sandbox ids; our shim sockets.
    await step('result cache', () => {
      let names: string[] = [];
      try {
        names = readdirSync(CNI_RESULTS_DIR);
      } catch {
        return;
      }
      for (const n of names) {
        const ours =
          n.startsWith(`${this.networkName}-`) || [...ids].some((id) => n.startsWith(`cni-loopback-${id}-`));
        if (ours) unlinkSync(join(CNI_RESULTS_DIR, n));
      }
    });
    await step('shim sockets', () => this.#removeShimSockets(ids));

    // 7. cgroup dirs under our parent, every hierarchy.
    await step('cgroups', () => {
      const left = this.#removeCgroups();
      if (left.length > 0) throw new Error(`could not rmdir ${left.join(', ')}`);
    });

    // 8. The scratch dir (only when nothing is mounted under it any more), and its own mount
    //    (sharedMounts; also one a crashed run left).
    await step('scratch', async () => {
      if (mountsUnder(this.scratch).length > 0) throw new Error(`not removing ${this.scratch}: mounts left`);
      for (let i = 0; i < 3 && isMountPoint(this.scratch); i++) await run('umount', ['-l', this.scratch]).catch(() => {});
      if (isMountPoint(this.scratch)) throw new Error(`not removing ${this.scratch}: still a mount point`);
      rmSync(this.scratch, { recursive: true, force: true });
      if (existsSync(this.scratch) && statSync(this.scratch).isDirectory()) throw new Error(`${this.scratch} still exists`);
    });
    this.timings['stop'] = since(t0);
    if (problems.length > 0) throw new Error(`lab stop left things behind: ${problems.join('; ')}`);
  }
}

/**
 * What of `lab` is still on the host — meant to be called after {@link Lab.stop} and to return
 * `[]`: its containerd; any process whose argv names its socket or CNI bin dir, or that runs in
 * its cgroup parent (shims, pause, plugins); mounts under its scratch dir; its bridge; cgroup dirs
 * named after its cgroup parent in any hierarchy; libcni result cache entries of its network; the
 * scratch dir. Each entry is one human-readable line.
 */
export function labLeftovers(lab: Lab): string[] {
  const left: string[] = [];
  if (lab.containerdPid > 0 && isAlive(lab.containerdPid)) left.push(`containerd pid ${lab.containerdPid}`);
  for (const pid of allPids()) {
    if (!isAlive(pid)) continue;
    const argv = argvOf(pid) ?? [];
    const ours =
      argv.some((a) => a === lab.socketPath || a.startsWith(`${lab.binDir}/`)) ||
      cgroupsOf(pid).some((c) => c === lab.cgroupParent || c.startsWith(`${lab.cgroupParent}/`));
    if (ours) left.push(`process ${pid}: ${argv.join(' ')}`);
  }
  for (const m of mountsUnder(lab.scratch)) left.push(`mount ${m}`);
  if (isMountPoint(lab.scratch)) left.push(`mount ${lab.scratch}`);
  if (existsSync(`/sys/class/net/${lab.bridge}`)) left.push(`bridge ${lab.bridge}`);
  for (const h of cgroupHierarchies()) {
    if (existsSync(join(h, lab.cgroupParent))) left.push(`cgroup ${join(h, lab.cgroupParent)}`);
  }
  try {
    for (const n of readdirSync(CNI_RESULTS_DIR)) if (n.startsWith(`${lab.networkName}-`)) left.push(`result cache ${n}`);
  } catch {
    // no results dir
  }
  if (existsSync(lab.scratch)) left.push(`scratch dir ${lab.scratch}`);
  return left;
}
