/**
 * The doctor model below `ipwarden doctor` (and, later, the daemon): inspect the node and return
 * findings, each with a severity, the evidence and the command or configuration change that
 * fixes it. Text and JSON output are the CLI's (`src/cli/doctor.ts`).
 *
 * Order of work: find the networks (`layoutNetworks`), look for locks held for long (so a stuck
 * holder cannot make doctor wait: those networks are not read), then collect the same report as
 * `status` (`collectStatus`: one runtime snapshot, reservations, verdicts from the reconcile
 * engine), then run the checks of {@link FINDING_IDS} in that order. Findings are sorted by
 * severity (error, warning, info), keeping that order within a severity. docs/cli.md lists the
 * findings.
 */
import { join } from 'node:path';
import { formatAge } from '../common/duration.ts';
import { parseIP } from '../common/ip.ts';
import { DEFAULT_CNI_CONF_DIR, DEFAULT_DATA_DIR } from '../common/names.ts';
import { shellQuote } from '../common/shell.ts';
import { rangeContains, rangeSetContains, rangeSetOverlaps, rangeSetString } from '../ipam/range.ts';
import { unusableEntries } from '../node/entries.ts';
import { DEFAULT_CNI_BIN_DIRS, findPluginBinary, isPluginName } from '../node/plugins.ts';
import {
  commandText,
  DEFAULT_PROC_DIR,
  findIpwardenDaemons,
  isVolatileFs,
  lockHolders,
  mountOf,
  readBootTime,
  type LockHolder,
} from '../node/proc.ts';
import { LOCK_FILE_NAME } from '../store/file/file-store.ts';
import { DEFAULT_GRACE, parseGrace, type ReconcileDeps } from './options.ts';
import { learnedPoolsDir, readLearnedPools } from '../pool/index.ts';
import { poolNetworkFindings } from './doctor-pools.ts';
import { isStampedInFuture, type PlanEntry } from './plan.ts';
import type { PoolOverlapReader } from './pool-doctor.ts';
import { collectStatus, layoutNetworks, type NetworkStatus, type StatusQuery, type StatusReport } from './status.ts';
import { IPAM_KEYS } from '../ipam/config.ts';

/** Severity of a finding. Any `error` makes doctor exit 1. */
export type Severity = 'error' | 'warning' | 'info';

/** One finding. `fix` is the command to run or the configuration change to make. */
export interface Finding {
  readonly id: FindingId;
  readonly severity: Severity;
  readonly title: string;
  readonly evidence: string;
  readonly fix: string;
}

/** Every finding id, in the order the checks run (docs/cli.md has the table). */
export const FINDING_IDS = [
  'runtime-unreachable',
  'no-cni-config',
  'cni-config-invalid',
  'ipam-pool-key-misplaced',
  'ipam-key-unknown',
  'ipam-plugin-missing',
  'lock-held',
  'leaked-reservations',
  'corrupt-reservations',
  'unusable-entries',
  'range-set-full-of-leaks',
  'range-set-full',
  'range-set-nearly-full',
  'data-dir-survives-reboot',
  'overlapping-ranges',
  'pool-overlaps-node-local',
  'pool-overlaps-other-prefix',
  'pool-overlap',
  'pool-unreachable',
  'duplicate-address',
  'unreserved-configured-address',
  'kernel-evidence-incomplete',
  'clock-skew',
  'pool-network-record-unreadable',
  'pool-networks',
] as const;

/** A finding id. */
export type FindingId = (typeof FINDING_IDS)[number];

/** What doctor inspects (parsed options of `doctor`): the status query plus the plugin directories. */
export interface DoctorQuery extends StatusQuery {
  /** Plugin directories; default {@link DEFAULT_CNI_BIN_DIRS} (also when empty). */
  readonly cniBinDir?: readonly string[];
}

/** The node facts doctor reads, injectable for tests. */
export interface DoctorProbe {
  /** procfs root for `/proc/locks`, `/proc/mounts`, `/proc/stat` and processes (default `/proc`). */
  readonly procDir: string;
  /** How long a lock must stay held to count as "held for long", milliseconds (default 200). */
  readonly lockRecheckMs: number;
  /** Wait `ms` milliseconds (default: a timer). Tests pass one that resolves at once. */
  delay(ms: number): Promise<void>;
}

/** The reconciler's injected I/O plus, optionally, a {@link DoctorProbe} (tests); the real one has none. */
export interface DoctorDeps extends ReconcileDeps {
  readonly doctorProbe?: Partial<DoctorProbe>;
  /** Reads the overlaps of a pool the node's configuration names (default: its etcd; src/reconcile/pool-doctor.ts). */
  readonly poolOverlaps?: PoolOverlapReader;
}

/** `--grace`'s default in seconds. */
const DEFAULT_GRACE_SECONDS = parseGrace(DEFAULT_GRACE);

/** Default of {@link DoctorProbe.lockRecheckMs}. */
export const DEFAULT_LOCK_RECHECK_MS = 200;

/** A range set is "nearly full" when strictly more than this share of it is reserved. */
export const FULL_THRESHOLD_PERCENT = 90;

/** How many IPs an evidence string lists before `… (N more)`. */
export const EVIDENCE_IPS = 10;

const SEVERITY_ORDER: readonly Severity[] = ['error', 'warning', 'info'];

/** What a doctor run found. */
export interface DoctorResult {
  readonly findings: readonly Finding[];
  readonly report: StatusReport;
}

/** `a, b, c … (N more)` for at most {@link EVIDENCE_IPS} items. */
export function listIPs(ips: readonly string[]): string {
  const shown = ips.slice(0, EVIDENCE_IPS).join(', ');
  return ips.length > EVIDENCE_IPS ? `${shown} … (${ips.length - EVIDENCE_IPS} more)` : shown;
}

/** `1 error`, `2 errors`: `n` and the noun, plural unless `n` is 1. */
export function plural(n: number | bigint, one: string, many = `${one}s`): string {
  return `${n} ${n === 1 || n === 1n ? one : many}`;
}

/**
 * `--grace` of a fix command: seconds as a Go duration that gives them back exactly (`2h`, `10m`,
 * `90s`, `12.5s`).
 */
function graceWord(seconds: number): string {
  if (Number.isInteger(seconds) && seconds > 0 && seconds % 3600 === 0) return `${seconds / 3600}h`;
  if (Number.isInteger(seconds) && seconds > 0 && seconds % 60 === 0) return `${seconds / 60}m`;
  return `${seconds}s`;
}

/**
 * The options doctor was given that a printed `ipwarden gc|leaks|daemon` needs to reach doctor's
 * verdicts, each shell-quoted, with a leading space (or ''): `--cni-conf-dir` (networks, their
 * ranges: where gc re-reserves) when given and not the default, `--runtime-endpoint` when given,
 * `--grace` when not the default.
 */
export function verdictFlags(q: Pick<StatusQuery, 'cniConfDir' | 'runtimeEndpoint' | 'graceSeconds'>): string {
  let out = '';
  if (q.cniConfDir !== undefined && q.cniConfDir !== DEFAULT_CNI_CONF_DIR) out += ` --cni-conf-dir ${shellQuote(q.cniConfDir)}`;
  if (q.runtimeEndpoint !== undefined) out += ` --runtime-endpoint ${shellQuote(q.runtimeEndpoint)}`;
  if (q.graceSeconds !== DEFAULT_GRACE_SECONDS) out += ` --grace ${graceWord(q.graceSeconds)}`;
  return out;
}

/**
 * The `ipwarden gc` (or `leaks`) command for one network, to run as printed: `--data-dir` when
 * not the default or when doctor was given one, then {@link verdictFlags}; values shell-quoted.
 */
export function gcCommand(n: { name: string; dataDir: string }, q: Pick<StatusQuery, 'dataDir' | 'cniConfDir' | 'runtimeEndpoint' | 'graceSeconds'>, verb: 'gc' | 'leaks' = 'gc'): string {
  const dataDir = n.dataDir === DEFAULT_DATA_DIR && q.dataDir === undefined ? '' : ` --data-dir ${shellQuote(n.dataDir)}`;
  return `ipwarden ${verb} --network ${shellQuote(n.name)}${dataDir}${verdictFlags(q)}`;
}

function describeHolders(holders: readonly LockHolder[]): string {
  return holders
    .map((h) =>
      h.process === null
        ? `an open file description (${h.lock.kind} ${h.lock.access}, no owning pid)`
        : `pid ${h.process.pid} (${commandText(h.process)}) [${h.lock.kind} ${h.lock.access}]`,
    )
    .join('; ');
}

/**
 * Networks whose `lock` is held now and still held by the same process after
 * `probe.lockRecheckMs`: network dir → holders. One wait for all networks.
 */
export async function heldLocks(dirs: readonly string[], probe: DoctorProbe): Promise<Map<string, LockHolder[]>> {
  const first = new Map<string, LockHolder[]>();
  for (const d of dirs) {
    const h = lockHolders(join(d, LOCK_FILE_NAME), probe.procDir);
    if (h.length > 0) first.set(d, h);
  }
  const out = new Map<string, LockHolder[]>();
  if (first.size === 0) return out;
  await probe.delay(probe.lockRecheckMs);
  for (const [d, before] of first) {
    const now = lockHolders(join(d, LOCK_FILE_NAME), probe.procDir).filter((h) =>
      before.some((b) => b.lock.pid === h.lock.pid && b.lock.kind === h.lock.kind),
    );
    if (now.length > 0) out.set(d, now);
  }
  return out;
}

function percent(part: number, whole: bigint): number {
  return whole === 0n ? 100 : Number((BigInt(part) * 100n) / whole);
}

/** The per-network checks: leaks, corrupt files, full range sets. */
function networkFindings(n: NetworkStatus, r: StatusReport, q: DoctorQuery): Finding[] {
  const out: Finding[] = [];
  if (n.skipped !== null) return out;
  const all = [...n.rangeSets.flatMap((s) => s.entries), ...n.outside.entries];
  const ipsOf = (v: PlanEntry['verdict']): string[] =>
    all
      .filter((e) => e.verdict === v)
      .map((e) => e)
      .sort((a, b) => compareIP(a.ip, b.ip))
      .map((e) => e.ip);
  if (r.verdicts && n.total.leaked > 0) {
    out.push({
      id: 'leaked-reservations',
      severity: 'warning',
      title: `${n.name}: ${plural(n.total.leaked, 'leaked reservation')}`,
      evidence:
        `${n.total.leaked} of ${n.total.reserved} reservations in ${n.dir} belong to sandboxes the runtime does not list ` +
        `and are older than the grace period (${formatAge(r.graceSeconds)}): ${listIPs(ipsOf('leaked'))}`,
      fix: gcCommand(n, q),
    });
  }
  if (n.total.corrupt > 0) {
    out.push({
      id: 'corrupt-reservations',
      severity: 'warning',
      title: `${n.name}: ${plural(n.total.corrupt, 'corrupt reservation file')}`,
      evidence: `${n.total.corrupt} reservation ${n.total.corrupt === 1 ? 'file' : 'files'} in ${n.dir} ${n.total.corrupt === 1 ? 'is' : 'are'} empty or unparseable: ${listIPs(ipsOf('corrupt'))}`,
      fix: gcCommand(n, q),
    });
  }
  const unusable = unusableEntries(n.dir).sort((a, b) => compareIP(a.name, b.name));
  if (unusable.length > 0) {
    const one = unusable.length === 1;
    const shown = unusable.slice(0, EVIDENCE_IPS).map((u) => `${u.path} (${u.what})`).join(', ');
    const more = unusable.length > EVIDENCE_IPS ? ` … (${unusable.length - EVIDENCE_IPS} more)` : '';
    out.push({
      id: 'unusable-entries',
      severity: 'warning',
      title: `${n.name}: ${one ? '1 entry named like an address is not a reservation file' : `${unusable.length} entries named like addresses are not reservation files`}`,
      evidence:
        `${shown}${more}: neither ipwarden nor host-local reads ${one ? 'it as a reservation or hands its address' : 'them as reservations or hands their addresses'} out ` +
        `(the ${one ? 'name is' : 'names are'} taken), and gc never removes ${one ? 'it' : 'them'}`,
      fix: `check that nothing uses ${one ? 'it' : 'them'}, then remove ${one ? 'it' : 'them'}: rm ${unusable.map((u) => shellQuote(u.path)).join(' ')}`,
    });
  }
  for (const s of n.rangeSets) {
    const c = s.counts;
    if (BigInt(c.reserved) * 100n <= s.capacity * BigInt(FULL_THRESHOLD_PERCENT)) continue;
    const pct = percent(c.reserved, s.capacity);
    const severity: Severity = s.free === 0n ? 'error' : 'warning';
    const head = `${n.name} range set ${s.index} (${s.range})`;
    const used = `${c.reserved} of ${s.capacity} addresses reserved (${pct}%), ${s.free} free`;
    const file = n.config?.file ?? '?';
    if (!r.verdicts) {
      out.push({
        id: 'range-set-nearly-full',
        severity,
        title: `${head} is ${pct}% reserved`,
        evidence: `${used}; ${c.corrupt} corrupt; the runtime could not be asked, so how many are leaked is unknown`,
        fix: `make the runtime reachable, then: ${gcCommand(n, q, 'leaks')}`,
      });
      continue;
    }
    const reclaimable = c.leaked + c.corrupt;
    const afterGc = c.reserved - reclaimable;
    const evidence = `${used}: ${c.live} live, ${c.grace} in grace, ${c.leaked} leaked, ${c.corrupt} corrupt`;
    if (reclaimable > 0 && BigInt(afterGc) * 100n <= s.capacity * BigInt(FULL_THRESHOLD_PERCENT)) {
      out.push({
        id: 'range-set-full-of-leaks',
        severity,
        title: `${head} is ${pct}% reserved; ${reclaimable} of the ${c.reserved} are leaked or corrupt`,
        evidence: `${evidence}; releasing the leaked and corrupt ones leaves ${afterGc} reserved`,
        fix: gcCommand(n, q),
      });
    } else if (c.grace > 0) {
      // Not judged yet: younger than the grace period, or stamped in the future after a clock step.
      const future = s.entries.filter((e) => e.verdict === 'grace' && isStampedInFuture(e.mtimeMs, r.snapshotAtMs)).length;
      out.push({
        id: 'range-set-full',
        severity,
        title: `${head} is ${pct}% reserved; ${c.grace} of the ${c.reserved} are within the grace period${future > 0 ? ` (${future} stamped in the future)` : ''}, not yet judged`,
        evidence: future > 0 ? `${evidence}; ${future} reservation ${future === 1 ? 'file is' : 'files are'} stamped after now: the clock was stepped back (see clock-skew)` : evidence,
        fix: `${gcCommand(n, q)} after the grace period (${formatAge(r.graceSeconds)})${future > 0 ? '; gc restamps files stamped in the future, so they are judged one grace period later' : ''}, or widen the range set`,
      });
    } else {
      out.push({
        id: 'range-set-full',
        severity,
        title: `${head} is ${pct}% reserved by sandboxes that exist: genuinely full`,
        evidence,
        fix:
          `widen the range set (a larger subnet, or another range in ipam.ranges[${s.index}] of ${file}) or run fewer pods on this node` +
          (reclaimable > 0 ? `; ${gcCommand(n, q)} frees only ${reclaimable}` : ''),
      });
    }
  }
  return out;
}

/**
 * What the kernel evidence says (issue 7): an address of a configured range configured in two
 * network namespaces (a duplicate: both holders named), evidence that could not be read
 * completely, and reservations stamped in the future (the clock was stepped back).
 */
function kernelFindings(r: StatusReport, q: DoctorQuery): Finding[] {
  const out: Finding[] = [];
  const ev = r.evidence;
  if (ev.incomplete !== null) {
    // Issue 17: a mount namespace that does not show the host's pins is named as the cause.
    const dirs = ev.unreadPinDirs ?? [];
    out.push({
      id: 'kernel-evidence-incomplete',
      severity: 'warning',
      title: dirs.length === 0 ? 'cannot see every network namespace of the node' : `cannot see the host's pinned network namespaces in ${dirs.join(', ')}`,
      evidence: `${ev.incomplete}; an address configured in a namespace that cannot be seen may be in use, so gc and the plugin release nothing they cannot verify`,
      fix:
        dirs.length === 0
          ? 'run ipwarden as root in the host PID namespace with /run/netns visible (DaemonSet: hostPID: true and a hostPath mount of /run/netns)'
          : "run ipwarden in the host's mount namespace, or let it read the host's view through /proc/1/root (DaemonSet: hostPID: true, SYS_PTRACE) and mount these directories with mountPropagation: HostToContainer",
    });
  }
  const ranged = r.networks.filter((n) => n.config?.ipam != null);
  for (const [ip, holders] of [...ev.addresses].sort((a, b) => compareIP(a[0], b[0]))) {
    if (holders.length < 2) continue;
    const parsed = parseIP(ip);
    if (parsed === null) continue;
    const nets = ranged.filter((n) => n.rangeSets.some((s) => rangeSetContains(s.rangeSet, parsed))).map((n) => n.name);
    if (nets.length === 0) continue;
    out.push({
      id: 'duplicate-address',
      severity: 'error',
      title: `${ip} (${[...new Set(nets)].join(', ')}) is configured in ${holders.length} network namespaces`,
      evidence: holders.map((h) => `${h.netns} via ${h.via}`).join('; '),
      fix: `two pods share ${ip}: find them (nsenter --net=PATH ip -o addr for each path above, or crictl inspectp) and recreate one of them`,
    });
  }
  out.push(...unreservedFindings(r, q));
  const future = r.networks.flatMap((n) => [...n.rangeSets.flatMap((s) => s.entries), ...n.outside.entries]).filter((e) => isStampedInFuture(e.mtimeMs, r.snapshotAtMs));
  if (future.length > 0) {
    const ahead = Math.max(...future.map((e) => -e.ageSeconds));
    out.push({
      id: 'clock-skew',
      severity: 'warning',
      title: `${plural(future.length, 'reservation file')} ${future.length === 1 ? 'is' : 'are'} stamped in the future (up to ${formatAge(ahead)} ahead)`,
      evidence: `${listIPs(future.map((e) => `${e.network}/${e.ip}`))}: written before the clock was stepped back; they stay in grace until restamped`,
      fix: 'check the clock (timedatectl; chronyc tracking); ipwarden gc restamps them, and they are judged one grace period later',
    });
  }
  return out;
}

/**
 * Addresses configured on an interface in some network namespace, inside a range set of a network
 * (not a range's gateway), for which that network has no reservation file: a file deleted under a
 * running pod, another IPAM or another network name using the same range. The standalone plugin
 * and host-local can hand such an address out again; the daemon's ADDs skip it (docs/daemon.md
 * "The kernel address index"). One finding per network, the addresses sorted numerically, each
 * with the namespaces holding it. Networks whose reservations were not read are left out.
 */
function unreservedFindings(r: StatusReport, q: DoctorQuery): Finding[] {
  const out: Finding[] = [];
  const configured = [...r.evidence.addresses].filter(([, h]) => h.length > 0).sort((a, b) => compareIP(a[0], b[0]));
  for (const n of r.networks) {
    if (n.skipped !== null || n.config?.ipam == null || n.rangeSets.length === 0) continue;
    const reserved = new Set([...n.rangeSets.flatMap((s) => s.entries), ...n.outside.entries].map((e) => e.ip));
    const found: string[] = [];
    for (const [ip, holders] of configured) {
      if (reserved.has(ip)) continue;
      const parsed = parseIP(ip);
      if (parsed === null) continue;
      const inRange = n.rangeSets.some((s) =>
        s.rangeSet.some((rg) => rangeContains(rg, parsed) && !(rg.gateway.family === parsed.family && rg.gateway.value === parsed.value)),
      );
      if (inRange) found.push(`${ip} in ${holders.map((h) => `${h.netns} via ${h.via}`).join(' and ')}`);
    }
    if (found.length === 0) continue;
    const one = found.length === 1;
    const ip = (found[0] as string).split(' ')[0] as string;
    out.push({
      id: 'unreserved-configured-address',
      severity: 'warning',
      title: one
        ? `${ip} (${n.name}) is configured in a network namespace and has no reservation file`
        : `${n.name}: ${found.length} addresses are configured in network namespaces and have no reservation file`,
      evidence:
        `${listIPs(found)}; ${n.dir} has no file for ${one ? 'it' : 'them'}: the standalone plugin and host-local can hand ${one ? 'it' : 'them'} out to a new pod ` +
        `(ADDs served by ipwarden daemon skip ${one ? 'it' : 'them'})`,
      fix:
        `find what uses ${one ? 'it' : 'each'} (nsenter --net=PATH ip -o addr for each path above, or crictl inspectp): a pod of ${n.name} whose file was deleted — ` +
        `${gcCommand(n, q)} re-reserves the addresses of ready sandboxes the runtime reports; another network or IPAM using this range — give them disjoint ranges`,
    });
  }
  return out;
}

function compareIP(a: string, b: string): number {
  const x = parseIP(a);
  const y = parseIP(b);
  if (x === null || y === null) return a < b ? -1 : a > b ? 1 : 0;
  if (x.family !== y.family) return x.family - y.family;
  return x.value < y.value ? -1 : x.value > y.value ? 1 : 0;
}

/**
 * Run every check. Never throws for node problems (they are findings); throws what
 * `layoutNetworks`/`collectStatus` throw (usage errors, a network that cannot be read).
 */
export async function diagnose(q: DoctorQuery, deps: DoctorDeps): Promise<DoctorResult> {
  const probe: DoctorProbe = {
    procDir: deps.doctorProbe?.procDir ?? DEFAULT_PROC_DIR,
    lockRecheckMs: deps.doctorProbe?.lockRecheckMs ?? DEFAULT_LOCK_RECHECK_MS,
    delay: deps.doctorProbe?.delay ?? ((ms) => new Promise((resolve) => setTimeout(resolve, ms))),
  };
  const binDirs = q.cniBinDir !== undefined && q.cniBinDir.length > 0 ? q.cniBinDir : DEFAULT_CNI_BIN_DIRS;
  const layout = layoutNetworks(q);

  const held = await heldLocks(layout.networks.map((n) => n.dir), probe);
  const skip = new Map<string, string>();
  for (const [dir, holders] of held) {
    const h = holders[0] as LockHolder;
    skip.set(dir, h.process === null ? 'lock held' : `lock held by pid ${h.process.pid} (${h.process.comm ?? '?'})`);
  }
  const report = await collectStatus(q, deps, { layout, skip });
  const findings: Finding[] = [];
  const rt = report.runtime;

  if (rt.sandboxes === null) {
    findings.push({
      id: 'runtime-unreachable',
      severity: 'error',
      title: `container runtime not reachable${rt.endpoint === null ? '' : ` at ${rt.endpoint}`}`,
      evidence: `${rt.error ?? 'unknown error'}; without the runtime no reservation can be judged live or leaked`,
      fix: 'start containerd or CRI-O, or name its socket: --runtime-endpoint unix:///run/containerd/containerd.sock (or set CONTAINER_RUNTIME_ENDPOINT); run doctor as root',
    });
  }

  if (layout.configs.length === 0) {
    findings.push({
      id: 'no-cni-config',
      severity: 'info',
      title: `no CNI network configuration in ${layout.cniConfDir}`,
      evidence: `${layout.cniConfDir} has no .conf, .conflist or .json file; only the data ${layout.dataDirs.length === 1 ? 'directory' : 'directories'} ${layout.dataDirs.join(', ')} ${layout.dataDirs.length === 1 ? 'was' : 'were'} inspected`,
      fix: 'pass --cni-conf-dir DIR if the runtime reads its CNI configuration from another directory',
    });
  }

  // A pool key misspelt or outside `ipam` is its own error-level finding below, not this warning.
  const misplaced = layout.configs.filter((c) => c.poolKeyMisplaced !== undefined);
  for (const e of layout.configErrors) {
    if (misplaced.some((c) => c.file === e.file && c.error === e.error)) continue; // refusedByPlugin
    findings.push({
      id: 'cni-config-invalid',
      severity: 'warning',
      title: `CNI configuration ${e.file} cannot be used`,
      evidence: e.error,
      fix: `correct or remove ${e.file}`,
    });
  }

  for (const c of misplaced) {
    findings.push({
      id: 'ipam-pool-key-misplaced',
      severity: 'error',
      title: `${c.file}: ${c.name ?? '?'} looks like a cluster pool whose "pool" key is misspelt or outside "ipam"`,
      evidence: c.poolKeyMisplaced?.refusedByPlugin
        ? `${c.poolKeyMisplaced.message}; the plugin refuses its ADD, CHECK and STATUS with code 7`
        : `${c.poolKeyMisplaced?.message ?? ''}; a key at a list's top level never reaches the plugin, which serves the network from node-local files: every node hands out the same addresses`,
      fix: `in ${c.file}, write the pool as "ipam": {"type": "ipwarden", …, "pool": {"name": …, "etcd": {…}}} (docs/cluster.md "Configuration"), or remove the key for a node-local network`,
    });
  }

  for (const c of layout.configs) {
    const unknown = c.unknownIpamKeys ?? [];
    if (unknown.length === 0) continue;
    const keys = unknown.map((k) => JSON.stringify(k)).join(', ');
    findings.push({
      id: 'ipam-key-unknown',
      severity: 'info',
      title: `${c.file}: ipam ${unknown.length === 1 ? 'key' : 'keys'} ${keys} ${unknown.length === 1 ? 'is' : 'are'} not read`,
      evidence: `neither host-local nor ipwarden reads ${unknown.length === 1 ? 'it' : 'them'} (ignored, as host-local ignores unknown keys); the keys read, case ignored: ${IPAM_KEYS.join(', ')}`,
      fix: `correct the spelling in ${c.file} (a misspelt ipwarden key leaves its default in force), or remove ${unknown.length === 1 ? 'it' : 'them'}`,
    });
  }

  for (const c of layout.configs) {
    if (c.ipamType === null) continue;
    if (findPluginBinary(c.ipamType, binDirs) !== null) continue;
    const where = isPluginName(c.ipamType) ? `no executable ${c.ipamType} in ${binDirs.join(', ')}` : 'that is not a plugin file name';
    const dest = binDirs[0] ?? '/opt/cni/bin';
    const fix =
      c.ipamType === 'ipwarden'
        ? `ipwarden install-cni --dest ${shellQuote(dest)}`
        : c.ipamType === 'host-local'
          ? `install the reference CNI plugins into ${dest} (Debian: apt-get install containernetworking-plugins, then link /usr/lib/cni/host-local into ${dest}), or set "type": "ipwarden" and run: ipwarden install-cni --dest ${shellQuote(dest)}`
          : `install the ${JSON.stringify(c.ipamType)} CNI plugin into ${dest}, or change ipam.type in ${c.file}`;
    findings.push({
      id: 'ipam-plugin-missing',
      severity: 'error',
      title: `IPAM plugin ${JSON.stringify(c.ipamType)} of ${c.name ?? c.file} is not installed`,
      evidence: `${c.file} names ipam "type": ${JSON.stringify(c.ipamType)}; ${where}`,
      fix,
    });
  }

  for (const n of layout.networks) {
    const holders = held.get(n.dir);
    if (holders === undefined) continue;
    const lockPath = join(n.dir, LOCK_FILE_NAME);
    const pids = holders.filter((h) => h.process !== null).map((h) => (h.process as NonNullable<LockHolder['process']>).pid);
    const first = holders[0] as LockHolder;
    findings.push({
      id: 'lock-held',
      severity: 'error',
      title:
        first.process === null
          ? `${n.name}: lock held for long`
          : `${n.name}: lock held for long by pid ${first.process.pid} (${first.process.comm ?? '?'})`,
      evidence:
        `${lockPath} is held by ${describeHolders(holders)} and still held ${probe.lockRecheckMs} ms later; ` +
        `every ADD and DEL of ${n.name} waits for it; this network's reservations were not read`,
      fix:
        pids.length === 0
          ? `find the process holding ${lockPath} (lsof ${lockPath}) and stop it if it is hung`
          : `see what pid ${pids.join(', ')} is doing (cat /proc/${pids[0]}/stack; ls -l /proc/${pids[0]}/fd) and stop it if it is hung: kill ${pids.join(' ')}`,
    });
  }

  for (const n of report.networks) findings.push(...networkFindings(n, report, q));

  // A data directory that keeps reservations across reboots, with nothing to clean them.
  const bootTime = readBootTime(probe.procDir);
  let daemons: number | null = null;
  for (const d of layout.dataDirs) {
    if (bootTime === null) break;
    const nets = report.networks.filter((n) => n.dataDir === d && n.dirExists);
    if (nets.length === 0) continue;
    const mount = mountOf(d, probe.procDir);
    if (mount === null || isVolatileFs(mount.fsType)) continue;
    const old = nets
      .flatMap((n) => [...n.rangeSets.flatMap((s) => s.entries), ...n.outside.entries])
      .filter((e) => e.mtimeMs < bootTime * 1000)
      .sort((a, b) => (a.network !== b.network ? (a.network < b.network ? -1 : 1) : compareIP(a.ip, b.ip)));
    if (old.length === 0) continue;
    if (report.networks.some((n) => n.dataDir === d && n.config?.ipamType === 'ipwarden')) continue;
    daemons ??= findIpwardenDaemons(probe.procDir).length;
    if (daemons > 0) continue;
    findings.push({
      id: 'data-dir-survives-reboot',
      severity: 'warning',
      title: `${d} survives reboots and nothing reconciles it`,
      evidence:
        `${d} is on ${mount.fsType} (mounted at ${mount.mountPoint}), not tmpfs; ` +
        `${plural(old.length, 'reservation file')} ${old.length === 1 ? 'is' : 'are'} older than the last boot (${new Date(bootTime * 1000).toISOString()}): ` +
        `${listIPs(old.map((e) => `${e.network}/${e.ip}`))}; no network there uses "type": "ipwarden" IPAM and no "ipwarden daemon" process runs`,
      fix: `run ipwarden gc --data-dir ${shellQuote(d)}${verdictFlags(q)} now and at every boot (or keep ipwarden daemon --data-dir ${shellQuote(d)}${verdictFlags(q)} running), or set ipam "type": "ipwarden" in the network configurations`,
    });
  }

  // Networks with overlapping ranges, and addresses reserved in two of them.
  const configured = report.networks.filter((n) => n.config?.ipam != null);
  const dupes: Finding[] = [];
  for (let i = 0; i < configured.length; i++) {
    for (let j = i + 1; j < configured.length; j++) {
      const a = configured[i] as NetworkStatus;
      const b = configured[j] as NetworkStatus;
      if (a.name === b.name) continue; // one network in two data dirs: same configuration name
      const pairs: string[] = [];
      for (const sa of a.rangeSets) {
        for (const sb of b.rangeSets) {
          if (rangeSetOverlaps(sa.rangeSet, sb.rangeSet)) pairs.push(`${a.name} range set ${sa.index} (${rangeSetString(sa.rangeSet)}) overlaps ${b.name} range set ${sb.index} (${rangeSetString(sb.rangeSet)})`);
        }
      }
      if (pairs.length === 0) continue;
      findings.push({
        id: 'overlapping-ranges',
        severity: 'warning',
        title: `networks ${a.name} and ${b.name} have overlapping ranges`,
        evidence: `${pairs.join('; ')} (${a.config?.file ?? '?'}, ${b.config?.file ?? '?'}); each network allocates on its own, so both can hand out the same address`,
        fix: `give each network its own subnet: change ipam.ranges in ${a.config?.file ?? '?'} or ${b.config?.file ?? '?'}`,
      });
      const inB = new Map<string, PlanEntry>();
      for (const e of [...b.rangeSets.flatMap((s) => s.entries)]) inB.set(e.ip, e);
      for (const e of a.rangeSets.flatMap((s) => s.entries).sort((x, y) => compareIP(x.ip, y.ip))) {
        const other = inB.get(e.ip);
        if (other === undefined) continue;
        const ip = parseIP(e.ip);
        if (ip === null || !b.rangeSets.some((s) => rangeSetContains(s.rangeSet, ip))) continue;
        const owner = (x: PlanEntry): string => (x.containerId === null ? 'corrupt record' : `${x.containerId} ${x.ifname ?? '(legacy record)'}, ${x.verdict}`);
        dupes.push({
          id: 'duplicate-address',
          severity: 'error',
          title: `${e.ip} is reserved in both ${a.name} and ${b.name}`,
          evidence: `${join(a.dir, e.ip)}: ${owner(e)}; ${join(b.dir, e.ip)}: ${owner(other)}`,
          fix: `find which pod really uses ${e.ip} and recreate the other one (its reservation is then released by DEL); then give ${a.name} and ${b.name} disjoint ranges`,
        });
      }
    }
  }
  // Cluster pools: a node-local range inside a pool's, a pool overlapping another pool of its prefix
  // — the pools of the CNI configuration and those the daemon learned from requests (Multus).
  // Loaded only when the node uses a pool (it brings the etcd client).
  const learned = readLearnedPools(learnedPoolsDir(q.dataDir ?? DEFAULT_DATA_DIR)).pools;
  if (layout.poolNetworks.length > 0 || learned.length > 0) findings.push(...(await (await import('./pool-doctor.ts')).poolFindings(layout, report, deps.poolOverlaps, learned, q.network)));
  findings.push(...dupes);
  findings.push(...kernelFindings(report, q));
  // The cluster pools this node serves, and from where (CNI configuration, requests: Multus).
  findings.push(...poolNetworkFindings(layout.configs, learnedPoolsDir(q.dataDir ?? DEFAULT_DATA_DIR)));

  const order = (f: Finding): number => SEVERITY_ORDER.indexOf(f.severity);
  const sorted = findings.map((f, i) => ({ f, i })).sort((x, y) => order(x.f) - order(y.f) || x.i - y.i).map((x) => x.f);
  return { findings: sorted, report };
}

/** Counts of findings by severity. */
export function summary(findings: readonly Finding[]): Record<Severity, number> {
  const s: Record<Severity, number> = { error: 0, warning: 0, info: 0 };
  for (const f of findings) s[f.severity]++;
  return s;
}
