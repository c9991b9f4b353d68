/**
 * Self-healing inside the plugin (issue 4), both run by ADD while it holds the network's lock:
 *
 * - {@link reclaimLocked}: a range set is exhausted — ask the runtime for its sandboxes, release
 *   the reservations the reconciler would call leaked or corrupt (same `plan()`, same grace
 *   period), record each in the audit log, and report the breakdown.
 * - {@link recoverLocked}: the network holds no reservation at all (a wiped data directory) while
 *   the runtime runs sandboxes whose pod IPs lie in this network's ranges — recreate those
 *   reservations (owner = the sandbox ID, ifname `eth0`) before any address is handed out, so a
 *   new pod never receives a running pod's address.
 *
 * The lock is already held by the caller (ADD), so no other ADD or DEL can be in flight on this
 * network; an ADD whose CRI RunPodSandbox has not returned yet is not listed, and the grace
 * period protects its reservation (containerd-lab.md §3 "Race the reconciler must handle").
 */
import { DEFAULT_DATA_DIR } from '../common/names.ts';
import { shellQuote } from '../common/shell.ts';
import type { RangeSet } from '../ipam/types.ts';
import { inUseReason, RECOVERED_OWNER_PREFIX, type EvidenceReader } from './evidence.ts';
import { RE_RESERVE_IFNAME, releaseRecorded } from './apply.ts';
import { formatIP, parseIP } from '../common/ip.ts';
import { rangeFor } from '../ipam/range.ts';
import type { IPAMConfig } from '../ipam/types.ts';
import type { Reservation, Store } from '../store/store.ts';
import type { AuditSink } from './audit.ts';
import { compareIPText, isStampedInFuture, plan, type AnyVerdict, type PlanCounts } from './plan.ts';
import { indexSandboxes, isSandboxNotFound, type SandboxSource } from './sandboxes.ts';
import type { PodIPSource } from './cri-source.ts';
import { mapLimit } from '../common/concurrency.ts';
import { formatDuration } from '../common/duration.ts';
import { AppError } from '../common/errors.ts';

/** What reclaim did and saw. `runtimeError` is set (and nothing released) when the runtime could not be asked. */
export interface ReclaimOutcome {
  readonly released: string[];
  /** The verdict that allowed each release, in the order of `released`. */
  readonly releasedVerdicts: readonly AnyVerdict[];
  /** IPs the plan calls leaked or corrupt and the rules allow to release now (released when `release` was true). */
  readonly releasable: string[];
  readonly counts: PlanCounts | null;
  readonly runtimeError: string | null;
  readonly endpoint: string | null;
  /** Why releases were withheld as a whole (kernel evidence incomplete and a status call failed), or null. */
  readonly withheld?: string | null;
  /** Releasable reservations left for the next ADD by {@link RECLAIM_CAP}. */
  readonly capped?: number;
}

/** Injected parts of reclaim. */
export interface ReclaimDeps {
  /** The runtime, or an error message when no endpoint could be resolved. */
  readonly source: SandboxSource | string;
  readonly audit: AuditSink;
  /** Now, milliseconds since the Unix epoch. */
  now(): number;
  /** Reads the kernel evidence (`src/node/kernel-evidence.ts`); called once, after the runtime answered. */
  readonly evidence: EvidenceReader;
  /** Monotonic milliseconds (default `performance.now`), for the deadline. */
  monotonic?(): number;
}

/** At most this many reservations are released by one ADD (oldest first); the rest wait for the next ADD or `gc`. */
export const RECLAIM_CAP = 16;

/** Upper bound of all runtime calls of one reclaim or recovery, seconds (also at most half of `lockTimeout`). */
export const HEAL_DEADLINE_SECONDS = 20;

/** PodSandboxStatus calls in flight at once during reclaim and recovery. */
export const HEAL_STATUS_CONCURRENCY = 16;

function message(e: unknown): string {
  if (e instanceof AppError) return e.details === undefined ? e.message : `${e.message} (${e.details})`;
  return e instanceof Error ? e.message : String(e);
}

/** True for an answer that shows the socket is not a (usable) CRI runtime: then there is no runtime to ask. */
function isNotCri(e: unknown): boolean {
  return e instanceof AppError && (e.code === 'RUNTIME_NOT_CRI' || e.code === 'RUNTIME_UNSUPPORTED_API');
}


/** The deadline of one heal: `HEAL_DEADLINE_SECONDS`, or half the lock timeout when that is shorter. */
export function healDeadlineSeconds(conf: IPAMConfig): number {
  return Math.min(HEAL_DEADLINE_SECONDS, conf.lockTimeoutSeconds / 2);
}

/** A point in monotonic time after which runtime calls are abandoned. */
interface Deadline {
  readonly atMs: number;
  readonly clock: () => number;
}

function deadlineIn(seconds: number, clock: () => number = () => performance.now()): Deadline {
  return { atMs: clock() + seconds * 1000, clock };
}

/**
 * `p`, or a `RUNTIME_CALL_FAILED` rejection when `d` passes first. The call is abandoned, not
 * cancelled (grpc-js `close()` leaves calls running): its own per-call deadline ends it, and the
 * plugin process exits right after its reply (`src/main.ts`).
 */
async function within<T>(d: Deadline, what: string, p: Promise<T>): Promise<T> {
  const left = d.atMs - d.clock();
  if (left <= 0) {
    p.catch(() => undefined);
    throw new AppError('RUNTIME_CALL_FAILED', `${what}: the deadline of this ADD passed`);
  }
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new AppError('RUNTIME_CALL_FAILED', `${what}: no answer within the deadline of this ADD`)), left);
  });
  try {
    return await Promise.race([p, late]);
  } finally {
    clearTimeout(timer);
    p.catch(() => undefined);
  }
}

/** Pod IPs per sandbox, {@link HEAL_STATUS_CONCURRENCY} calls at a time, within `d`. */
async function podIPsOf(
  src: SandboxSource,
  ids: readonly string[],
  d: Deadline,
): Promise<{ ips: Map<string, string[]>; failed: Array<{ id: string; why: string }> }> {
  const ips = new Map<string, string[]>();
  const failed: Array<{ id: string; why: string }> = [];
  const ask = src.podIPs;
  if (ask === undefined) return { ips, failed: ids.map((id) => ({ id, why: 'the runtime source cannot tell pod IPs' })) };
  await mapLimit(ids, HEAL_STATUS_CONCURRENCY, async (id) => {
    try {
      ips.set(id, await within(d, `PodSandboxStatus ${id}`, ask.call(src, id)));
    } catch (e) {
      // Removed since the list: it uses no address any more.
      if (!isSandboxNotFound(e)) failed.push({ id, why: message(e) });
    }
  });
  return { ips, failed };
}

/**
 * Release leaked and corrupt reservations of `store`'s network (lock held by the caller); with
 * `release` false only count them (for the breakdown when automatic reclaim is off, and STATUS).
 * With `only`, consider just those IPs (a static request whose address a leak holds).
 *
 * Rules (docs/reconciler.md "Plugin-side rules"): the runtime lists its sandboxes; the READY ones'
 * pod IPs are asked (BR-13: an address a live sandbox uses is never released, whoever's file it
 * is); then the kernel evidence is read — a release needs the runtime's "not listed, older than the
 * grace period" AND the kernel's "configured nowhere, no CNI operation of its container running".
 * A status call that failed withholds every release unless the kernel evidence is complete (it
 * covers that sandbox's address). At most {@link RECLAIM_CAP} are released, oldest first. Files
 * stamped in the future are restamped (their grace period starts now). Every release is audited
 * before the file is removed. All runtime calls share one deadline ({@link healDeadlineSeconds}).
 * Never throws for runtime problems (reported in the outcome); store and audit errors propagate.
 */
export async function reclaimLocked(
  store: Store,
  conf: IPAMConfig,
  deps: ReclaimDeps,
  release = true,
  only: readonly string[] | null = null,
): Promise<ReclaimOutcome> {
  const none = { released: [], releasedVerdicts: [], releasable: [], counts: null };
  if (typeof deps.source === 'string') return { ...none, runtimeError: deps.source, endpoint: null };
  const src = deps.source;
  const d = deadlineIn(healDeadlineSeconds(conf), deps.monotonic);
  // The snapshot time is taken BEFORE the runtime is asked (an ADD in flight is not listed yet).
  const snapshotAtMs = deps.now();
  let list;
  try {
    list = await within(d, 'ListPodSandbox', src.list());
  } catch (e) {
    const why = isNotCri(e) ? `not a CRI runtime: ${message(e)}` : message(e);
    return { ...none, runtimeError: why, endpoint: src.endpoint };
  }
  const ready = list.filter((s) => s.state === 'ready').map((s) => s.id);
  const pods = await podIPsOf(src, ready, d);
  const podIPs = new Set<string>();
  for (const ips of pods.ips.values()) for (const t of ips) {
    const ip = parseIP(t);
    if (ip !== null) podIPs.add(formatIP(ip));
  }
  const evidence = await deps.evidence();
  const reservations = (await store.list()).map((r) => ({ network: conf.name, dir: '', ...r }));
  const p = plan({ reservations, sandboxes: indexSandboxes(list), snapshotAtMs, graceSeconds: conf.leakGracePeriodSeconds, evidence });
  // Time: a file stamped in the future gets its grace period from now (docs/reconciler.md "Time").
  for (const e of p.entries) if (isStampedInFuture(e.mtimeMs, snapshotAtMs)) await store.touch(e.ip, e.owner);
  let withheld: string | null = null;
  if (pods.failed.length > 0 && evidence.incomplete !== null) {
    const f = pods.failed[0] as { id: string; why: string };
    withheld = `the pod IPs of ${pods.failed.length} ready sandbox${pods.failed.length === 1 ? '' : 'es'} could not be read (${f.id}: ${f.why}) and the kernel evidence is incomplete`;
  }
  const wanted = only === null ? null : new Set(only);
  const candidates = withheld !== null ? [] : p.release
    .filter((e) => !podIPs.has(e.ip) && (wanted === null || wanted.has(e.ip)))
    .sort((a, b) => (a.mtimeMs === b.mtimeMs ? compareIPText(a.ip, b.ip) : a.mtimeMs - b.mtimeMs));
  const chosen = candidates.slice(0, RECLAIM_CAP);
  // Every release is recorded: the audit log must be writable before the first one (throws).
  if (release && chosen.length > 0) deps.audit.open?.();
  // Intent lines, synced, before any removal; Store.release re-checks the owner (the list above
  // was read under this same lock). An audit or removal failure fails the ADD.
  const r = await releaseRecorded(store, release ? chosen : [], deps.audit, deps.now, 'reclaimed on exhaustion: ');
  const failure = r.auditError?.error ?? r.failures[0]?.error;
  if (failure !== undefined) throw failure;
  const released = r.released.map((e) => e.ip);
  return {
    released,
    releasedVerdicts: r.released.map((e) => e.verdict),
    releasable: chosen.map((e) => e.ip),
    counts: p.counts,
    runtimeError: null,
    endpoint: src.endpoint,
    withheld,
    capped: candidates.length - chosen.length,
  };
}

/**
 * The CLI command an operator runs for this network (with `--data-dir` when not the default), each
 * value quoted for a POSIX shell ({@link shellQuote}) so the printed command can be pasted as is,
 * e.g. `ipwarden gc --network cbr0 --data-dir '/var/lib/my cni'`.
 */
function cliHint(command: 'leaks' | 'gc', conf: IPAMConfig): string {
  return `ipwarden ${command} --network ${shellQuote(conf.name)}${conf.dataDir === DEFAULT_DATA_DIR ? '' : ` --data-dir ${shellQuote(conf.dataDir)}`}`;
}

/**
 * The `details` breakdown of an exhaustion that reclaim could not cure: how many reservations are
 * live, within the grace period, leaked, corrupt (and in use per the kernel, or kept for lack of
 * evidence, when there are any), and what to run next. `graceText` is the grace period as
 * configured (`5m`).
 */
export function exhaustionDetails(conf: IPAMConfig, o: ReclaimOutcome, graceText: string): string {
  if (o.runtimeError !== null || o.counts === null) {
    return `the runtime could not be asked (${o.runtimeError ?? 'unknown error'}), so leaked reservations cannot be told from live ones (set the ipam key "runtimeEndpoint"); run "${cliHint('leaks', conf)} --runtime-endpoint URL"`;
  }
  const c = o.counts;
  const kernel = `${c.inuse > 0 ? `, ${c.inuse} in use per the kernel` : ''}${c.unknown > 0 ? `, ${c.unknown} kept (kernel evidence incomplete)` : ''}`;
  const head = `${c.allocated} reservations: ${c.live} live, ${c.grace} in grace (younger than ${graceText}), ${c.leaked} leaked, ${c.corrupt} corrupt${kernel}`;
  if (o.withheld !== undefined && o.withheld !== null) return `${head}; nothing reclaimed: ${o.withheld}; run "${cliHint('leaks', conf)}"`;
  if (!conf.reclaimOnExhaustion) {
    return `${head}; automatic reclaim is off (reclaimOnExhaustion: false)${c.orphaned > 0 ? `: run "${cliHint('gc', conf)}"` : ''}`;
  }
  const done = o.released.length > 0 ? `; reclaimed ${o.released.length}` : '';
  if (c.grace > 0) {
    return `${head}${done}; the range is full of recent reservations: run "${cliHint('gc', conf)}" after ${graceText} if their pods never started`;
  }
  if (c.inuse > 0 || c.unknown > 0) {
    return `${head}${done}; addresses the runtime does not own are still configured in network namespaces of this node (or could not be checked): run "${cliHint('leaks', conf)}" and "ipwarden doctor"`;
  }
  return `${head}${done}; every reservation belongs to a sandbox the runtime lists: the range is genuinely full — widen it or run fewer pods on this node`;
}

/** What recovery did. */
export interface RecoveryOutcome {
  readonly recreated: Array<{ ip: string; containerId: string }>;
  /** Why the runtime could not be asked (then only the kernel's addresses were recreated), or null. */
  readonly runtimeError: string | null;
}

/** Injected parts of recovery (as {@link ReclaimDeps}, with a pod-IP source). */
export interface RecoveryDeps {
  readonly source: PodIPSource | string;
  readonly audit: AuditSink;
  now(): number;
  readonly evidence: EvidenceReader;
  monotonic?(): number;
}

/** Owner ID of a reservation recreated from the kernel alone: `recovered-net-<namespace inode>`. */
export function recoveredOwnerId(netns: string): string {
  const m = /^net:\[(\d+)\]$/.exec(netns);
  return `${RECOVERED_OWNER_PREFIX}${m === null ? netns.replace(/[^a-zA-Z0-9_.-]/g, '_') : (m[1] as string)}`;
}

/** The range set of `text` in `conf` (its gateway excluded: never handed out), or -1. */
function rangeSetOf(conf: IPAMConfig, text: string): number {
  const ip = parseIP(text);
  if (ip === null) return -1;
  return conf.rangeSets.findIndex((rs) => {
    const k = rangeFor(rs, ip);
    return k >= 0 && formatIP((rs[k] as RangeSet[number]).gateway) !== formatIP(ip);
  });
}

/**
 * Recreate the reservations of running pods after the network lost its reservations (lock held by
 * the caller; called when the network has no reservation and no round-robin state, or when a
 * recovery was begun and not finished). Sources, both used:
 * - the runtime: every listed sandbox in any state, its pod IPs (PodSandboxStatus, in parallel,
 *   within one deadline); owner = the sandbox ID;
 * - the kernel: every address in this network's ranges configured in a network namespace of the
 *   node, even when the runtime cannot be asked; owner `recovered-net-<inode>` unless the runtime
 *   named it (its DEL then finds nothing; the reconciler frees it once the address is gone).
 * Fail closed: when the kernel evidence is incomplete and the runtime exists but a list or status
 * call fails (or the deadline passes), throws `AppError('RUNTIME_UNAVAILABLE', retryable)`: CNI
 * 11, try again later. With complete kernel evidence such failures are covered (every address in
 * use is configured somewhere). A socket that is not CRI, or no runtime at all, is no runtime: the
 * kernel alone decides, as host-local would allocate. Crash-safe: the store's recovery mark is
 * durable before the first reservation is recreated and removed after the last, so a killed
 * recovery is resumed by the next ADD, and a pending mark is never cleared on incomplete
 * evidence without a runtime that answered (retryable 11 instead). Reservations are recreated
 * with `Store.restore` (round robin unchanged); each is audited when the audit log can be
 * written (recreating only protects addresses, so an unwritable log does not stop it).
 */
export async function recoverLocked(store: Store, conf: IPAMConfig, deps: RecoveryDeps): Promise<RecoveryOutcome> {
  const d = deadlineIn(healDeadlineSeconds(conf), deps.monotonic);
  const found = new Map<string, { containerId: string; why: string }>();
  let runtimeError: string | null = null;
  let unanswered: string | null = null;
  const source = deps.source;
  if (typeof source === 'string') runtimeError = source;
  else {
    let list;
    try {
      list = await within(d, 'ListPodSandbox', source.list());
    } catch (e) {
      runtimeError = isNotCri(e) ? `not a CRI runtime: ${message(e)}` : message(e);
      if (!isNotCri(e)) unanswered = `the runtime at ${source.endpoint} cannot list its sandboxes: ${message(e)}`;
    }
    if (list !== undefined) {
      // Every listed sandbox, in any state (a NOT READY one whose network is not torn down yet still has its address).
      const pods = await podIPsOf(source, list.map((s) => s.id), d);
      for (const [id, ips] of pods.ips) {
        for (const t of ips) {
          const ip = parseIP(t);
          if (ip !== null && rangeSetOf(conf, formatIP(ip)) >= 0 && !found.has(formatIP(ip))) found.set(formatIP(ip), { containerId: id, why: 'this running sandbox uses the address' });
        }
      }
      if (pods.failed.length > 0) {
        const f = pods.failed[0] as { id: string; why: string };
        unanswered = `the runtime at ${source.endpoint} could not tell the pod IPs of ${pods.failed.length} sandbox${pods.failed.length === 1 ? '' : 'es'} (${f.id}: ${f.why})`;
      }
    }
  }
  const evidence = await deps.evidence();
  const pending = await store.recoveryPending();
  if (evidence.incomplete !== null) {
    // A runtime that exists but did not answer for every sandbox: try again later.
    if (unanswered !== null) {
      throw new AppError(
        'RUNTIME_UNAVAILABLE',
        `the network directory ${conf.dataDir}/${conf.name} has no reservations, ${unanswered}, and the kernel evidence is incomplete (${evidence.incomplete}): handing out an address now could give away a running pod's`,
        { retryable: true },
      );
    }
    // A recovery begun earlier (killed midway) is never finished on less than it began with:
    // without a runtime that answered and without complete evidence, nothing says it is done.
    if (pending && (typeof source === 'string' || runtimeError !== null)) {
      throw new AppError(
        'RUNTIME_UNAVAILABLE',
        `a recovery of ${conf.dataDir}/${conf.name} was begun and not finished, and neither the runtime (${runtimeError ?? 'no runtime'}) nor the kernel (${evidence.incomplete}) can say which addresses running pods use`,
        { retryable: true },
      );
    }
  }
  for (const [ip, holders] of evidence.addresses) {
    if (found.has(ip) || holders.length === 0 || rangeSetOf(conf, ip) < 0) continue;
    const h = holders[0] as { netns: string; via: string };
    found.set(ip, { containerId: recoveredOwnerId(h.netns), why: `the address is configured in network namespace ${h.netns} via ${h.via}` });
  }
  if (found.size === 0) {
    if (pending) await store.markRecovery(false);
    return { recreated: [], runtimeError };
  }
  if (!pending) await store.markRecovery(true);
  // Recreating a reservation only ever protects an address: an audit log that cannot be written
  // (a directory, a symlink, a full disk) must not block it, let alone make every ADD fail.
  let audit: AuditSink | null = deps.audit;
  const record = (rec: Parameters<AuditSink['append']>[0]): void => {
    try {
      audit?.append(rec);
    } catch {
      audit = null;
    }
  };
  try {
    deps.audit.open?.();
  } catch {
    audit = null;
  }
  const recreated: Array<{ ip: string; containerId: string }> = [];
  for (const [ip, f] of [...found].sort((a, b) => compareIPText(a[0], b[0]))) {
    const owner = { containerId: f.containerId, ifname: RE_RESERVE_IFNAME };
    record({
      time: new Date(deps.now()).toISOString(),
      network: conf.name,
      ip,
      containerId: owner.containerId,
      ifname: owner.ifname,
      ageSeconds: 0,
      verdict: 'live',
      reason: `recreated: the data directory had no reservations while ${f.why}`,
      phase: 'reserved',
    });
    if (await store.restore(ip, owner)) recreated.push({ ip, containerId: owner.containerId });
  }
  await store.markRecovery(false);
  return { recreated, runtimeError };
}

/** What a reclaim did (or, with `release` false, could do). */
export interface ReclaimSummary {
  /** Reservations released. */
  readonly released: number;
  /**
   * Each reservation released (`released` of them): its IP text and the verdict that allowed it
   * (`leaked` or `corrupt`; docs/reconciler.md). The daemon logs and counts them
   * (`ipwarden_releases_total{reason}`); the standalone plugin has only the audit log.
   */
  readonly releases: ReadonlyArray<{ readonly ip: string; readonly verdict: AnyVerdict }>;
  /** IPs of the reservations the reconciler calls leaked or corrupt (releasable now). */
  readonly reclaimable: readonly string[];
  /** Human breakdown: live / in grace / leaked / corrupt, and what to run next. */
  readonly details: string;
}

/**
 * The plugin's self-healing hooks, called by ADD and GC of `src/cni/commands.ts` with the lock
 * held; {@link makeHeal} implements them (over CRI in `src/cni/heal.ts`).
 */
export interface HealHooks {
  /**
   * A range set is exhausted: release leaked reservations (only count them when `release` is
   * false). With `only`, consider just those IPs (static requests held by a leak). Resolves to the
   * number released and the `details` breakdown to attach if the ADD still fails.
   */
  reclaim(store: Store, conf: IPAMConfig, release: boolean, only?: readonly string[]): Promise<ReclaimSummary>;
  /**
   * The network holds no reservation (or a recovery was begun and not finished): recreate those
   * of running pods whose addresses lie in its ranges. Resolves to the number recreated; throws
   * a retryable `AppError` (CNI 11) when it cannot tell.
   */
  recover(store: Store, conf: IPAMConfig): Promise<number>;
  /**
   * CNI GC: release those of `candidates` (not valid attachments, or corrupt) that the kernel shows
   * in use nowhere, auditing each; keep the rest (issue 7: never on one runtime's word). Optional:
   * without it GC releases every candidate, as the spec's plugin would.
   */
  gc?(store: Store, id: Pick<IPAMConfig, 'name' | 'dataDir'>, candidates: readonly Reservation[]): Promise<{ released: string[]; kept: ReadonlyArray<{ ip: string; why: string }>; errors: readonly unknown[] }>;
}

/** Where {@link makeHeal} gets the runtime, the audit log and the kernel evidence for one network's config. */
export interface HealEnv {
  /** The runtime for `conf`, or why it cannot be asked. May be async (endpoint identification probes sockets). */
  source(conf: IPAMConfig): PodIPSource | string | Promise<PodIPSource | string>;
  /** The audit log for the network `conf` names (opened lazily by the implementation on first append). */
  audit(conf: Pick<IPAMConfig, 'name' | 'dataDir'>): AuditSink;
  /** Now, milliseconds since the Unix epoch. */
  now(): number;
  /** Reads the kernel evidence (`src/node/kernel-evidence.ts` in production; the daemon's reader is asynchronous). */
  readonly evidence: EvidenceReader;
  /** Monotonic milliseconds for deadlines (default `performance.now`). */
  monotonic?(): number;
}

/**
 * The plugin's self-healing hooks over any {@link HealEnv}: production passes CRI and the kernel
 * (`src/cni/heal.ts`), unit tests pass a fake sandbox list and literal evidence. Closes the source
 * and the audit log after each hook.
 */
export function makeHeal(env: HealEnv): HealHooks {
  async function withRuntime<T>(conf: IPAMConfig, fn: (src: PodIPSource | string, audit: AuditSink) => Promise<T>): Promise<T> {
    const src = await env.source(conf);
    const audit = env.audit(conf);
    try {
      return await fn(src, audit);
    } finally {
      audit.close();
      if (typeof src !== 'string') await src.close?.();
    }
  }
  const deps = (src: PodIPSource | string, audit: AuditSink): RecoveryDeps => ({
    source: src,
    audit,
    now: env.now,
    evidence: env.evidence,
    ...(env.monotonic === undefined ? {} : { monotonic: env.monotonic }),
  });
  return {
    reclaim: (store, conf, release, only) =>
      withRuntime(conf, async (src, audit) => {
        const o = await reclaimLocked(store, conf, deps(src, audit), release, only ?? null);
        return {
          released: o.released.length,
          releases: o.released.map((ip, i) => ({ ip, verdict: o.releasedVerdicts[i] as AnyVerdict })),
          reclaimable: o.releasable,
          details: exhaustionDetails(conf, o, formatDuration(conf.leakGracePeriodSeconds)),
        };
      }),
    recover: (store, conf) => withRuntime(conf, async (src, audit) => (await recoverLocked(store, conf, deps(src, audit))).recreated.length),
    gc: async (store, id, candidates) => {
      const audit = env.audit(id);
      try {
        return await gcLocked(store, id.name, candidates, { audit, now: env.now, evidence: env.evidence });
      } finally {
        audit.close();
      }
    },
  };
}

/** What {@link gcLocked} did. */
export interface GcOutcome {
  readonly released: string[];
  /** Kept although not a valid attachment: the kernel says in use, or its evidence is incomplete. */
  readonly kept: Array<{ ip: string; why: string }>;
  /** Failures (audit or removal); the caller reports them. */
  readonly errors: unknown[];
}

/**
 * CNI GC (spec 1.1.0) under the evidence rules (issue 7): of `candidates` — the reservations whose
 * owner is not among the runtime's valid attachments, and corrupt ones — release only those the
 * kernel shows in use nowhere (no namespace has the address, no CNI operation of the owner runs);
 * with incomplete evidence release none. Each release is audited (intent line synced first,
 * `releaseRecorded`). Lock held by the caller. Never throws.
 */
export async function gcLocked(
  store: Store,
  network: string,
  candidates: readonly { ip: string; owner: { containerId: string; ifname: string | null } | null; mtimeMs: number }[],
  deps: { audit: AuditSink; now(): number; evidence: EvidenceReader },
): Promise<GcOutcome> {
  const kept: Array<{ ip: string; why: string }> = [];
  if (candidates.length === 0) return { released: [], kept, errors: [] };
  const ev = await deps.evidence();
  const entries = [];
  for (const r of candidates) {
    const used = ev.incomplete !== null ? `kernel evidence incomplete: ${ev.incomplete}` : inUseReason(ev, r.ip, r.owner?.containerId ?? null);
    if (used !== null) {
      kept.push({ ip: r.ip, why: used });
      continue;
    }
    entries.push({
      network,
      dir: '',
      ip: r.ip,
      owner: r.owner,
      containerId: r.owner?.containerId ?? null,
      ifname: r.owner?.ifname ?? null,
      mtimeMs: r.mtimeMs,
      ageSeconds: Math.round(deps.now() - r.mtimeMs) / 1000,
      verdict: r.owner === null ? ('corrupt' as const) : ('leaked' as const),
      reason: r.owner === null ? 'CNI GC: empty or unparseable reservation file' : 'CNI GC: not a valid attachment of the runtime, and the kernel shows its address in use nowhere',
    });
  }
  try {
    deps.audit.open?.();
  } catch (e) {
    return { released: [], kept, errors: [e] };
  }
  const r = await releaseRecorded(store, entries, deps.audit, deps.now);
  const errors: unknown[] = [...r.failures.map((f) => f.error)];
  if (r.auditError !== null) errors.push(r.auditError.error);
  return { released: r.released.map((e) => e.ip), kept, errors };
}
