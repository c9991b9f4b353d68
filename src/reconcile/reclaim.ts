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
import { DEFAULT_DATA_DIR } from '../ipam/config.ts';
import { formatIP, parseIP } from '../ipam/ip.ts';
import { rangeFor } from '../ipam/range.ts';
import type { IPAMConfig } from '../ipam/types.ts';
import type { Store } from '../store/store.ts';
import { releaseRecorded } from './apply.ts';
import type { AuditSink } from './audit.ts';
import { plan, type PlanCounts } from './plan.ts';
import { indexSandboxes, type SandboxSource } from './sandboxes.ts';
import type { PodIPSource } from './cri-source.ts';
import type { HealHooks } from '../cni/commands.ts';
import { formatDuration } from '../common/duration.ts';
import { AppError } from '../common/errors.ts';

/** What reclaim did and saw. `runtimeError` is set (and nothing released) when the runtime could not be asked. */
export interface ReclaimOutcome {
  readonly released: string[];
  /** IPs the plan calls leaked or corrupt (released when `release` was true). */
  readonly releasable: string[];
  readonly counts: PlanCounts | null;
  readonly runtimeError: string | null;
  readonly endpoint: string | null;
}

/** Injected parts of reclaim. */
export interface ReclaimDeps {
  /** The runtime, or an error message when no endpoint could be resolved. */
  readonly source: SandboxSource | string;
  readonly audit: AuditSink;
  /** Now, milliseconds since the Unix epoch. */
  now(): number;
}

function message(e: unknown): string {
  return e instanceof Error ? e.message : String(e);
}

/**
 * Release leaked and corrupt reservations of `store`'s network (lock held by the caller); with
 * `release` false only count them (for the breakdown when automatic reclaim is off).
 * Never throws for runtime problems (they are reported in the outcome); store errors propagate.
 */
export async function reclaimLocked(store: Store, conf: IPAMConfig, deps: ReclaimDeps, release = true): Promise<ReclaimOutcome> {
  if (typeof deps.source === 'string') return { released: [], releasable: [], counts: null, runtimeError: deps.source, endpoint: null };
  const snapshotAtMs = deps.now();
  let index;
  try {
    index = indexSandboxes(await deps.source.list());
  } catch (e) {
    return { released: [], releasable: [], counts: null, runtimeError: message(e), endpoint: deps.source.endpoint };
  }
  const reservations = (await store.list()).map((r) => ({ network: conf.name, dir: '', ...r }));
  const p = plan({ reservations, sandboxes: index, snapshotAtMs, graceSeconds: conf.leakGracePeriodSeconds });
  // Every release is recorded: the audit log must be writable before the first one (throws).
  if (release && p.release.length > 0) deps.audit.open?.();
  // Intent lines, synced, before any removal; Store.release re-checks the owner (the list above
  // was read under this same lock). An audit or removal failure fails the ADD.
  const r = await releaseRecorded(store, release ? p.release : [], deps.audit, deps.now, 'reclaimed on exhaustion: ');
  const failure = r.auditError?.error ?? r.failures[0]?.error;
  if (failure !== undefined) throw failure;
  const released = r.released.map((e) => e.ip);
  return { released, releasable: p.release.map((e) => e.ip), counts: p.counts, runtimeError: null, endpoint: deps.source.endpoint };
}

/** The CLI command an operator runs for this network (with `--data-dir` when not the default). */
function cliHint(command: 'leaks' | 'gc', conf: IPAMConfig): string {
  return `ipwarden ${command} --network ${conf.name}${conf.dataDir === DEFAULT_DATA_DIR ? '' : ` --data-dir ${conf.dataDir}`}`;
}

/**
 * The `details` breakdown of an exhaustion that reclaim could not cure: how many reservations are
 * live, within the grace period, leaked, corrupt, and what to run next. `graceText` is the grace
 * period as configured (`5m`).
 */
export function exhaustionDetails(conf: IPAMConfig, o: ReclaimOutcome, graceText: string): string {
  if (o.runtimeError !== null || o.counts === null) {
    return `the runtime could not be asked (${o.runtimeError ?? 'unknown error'}), so leaked reservations cannot be told from live ones (set the ipam key "runtimeEndpoint"); run "${cliHint('leaks', conf)} --runtime-endpoint URL"`;
  }
  const c = o.counts;
  const head = `${c.allocated} reservations: ${c.live} live, ${c.grace} in grace (younger than ${graceText}), ${c.leaked} leaked, ${c.corrupt} corrupt`;
  if (!conf.reclaimOnExhaustion) {
    return `${head}; automatic reclaim is off (reclaimOnExhaustion: false)${c.orphaned > 0 ? `: run "${cliHint('gc', conf)}"` : ''}`;
  }
  const done = o.released.length > 0 ? `; reclaimed ${o.released.length}` : '';
  if (c.grace > 0) {
    return `${head}${done}; the range is full of recent reservations: run "${cliHint('gc', conf)}" after ${graceText} if their pods never started`;
  }
  return `${head}${done}; every reservation belongs to a sandbox the runtime lists: the range is genuinely full — widen it or run fewer pods on this node`;
}

/** What recovery did. */
export interface RecoveryOutcome {
  readonly recreated: Array<{ ip: string; containerId: string }>;
  readonly runtimeError: string | null;
}

/**
 * Recreate the reservations of running sandboxes after the network lost all of its reservations
 * (lock held by the caller). Only called when `store.list()` is empty. Never throws for runtime
 * problems; then nothing is recreated and ADD proceeds as host-local would.
 */
export async function recoverLocked(store: Store, conf: IPAMConfig, source: PodIPSource | string, audit: AuditSink, now: () => number): Promise<RecoveryOutcome> {
  if (typeof source === 'string') return { recreated: [], runtimeError: source };
  const found: Array<{ ip: string; containerId: string; rangeSetIndex: number }> = [];
  let sandboxes;
  try {
    sandboxes = await source.list();
  } catch (e) {
    return { recreated: [], runtimeError: message(e) };
  }
  // Every listed sandbox, in any state (a NOT READY one whose network is not torn down yet still
  // has its address). One that cannot be looked up (being removed) is skipped, not fatal.
  for (const sb of sandboxes) {
    let ips: string[];
    try {
      ips = await source.podIPs(sb.id);
    } catch {
      continue;
    }
    for (const text of ips) {
      const ip = parseIP(text);
      if (ip === null) continue;
      const i = conf.rangeSets.findIndex((rs) => rangeFor(rs, ip) >= 0);
      if (i >= 0) found.push({ ip: formatIP(ip), containerId: sb.id, rangeSetIndex: i });
    }
  }
  const recreated: Array<{ ip: string; containerId: string }> = [];
  for (const f of found) {
    if (await store.reserve(f.ip, { containerId: f.containerId, ifname: 'eth0' }, f.rangeSetIndex)) {
      recreated.push({ ip: f.ip, containerId: f.containerId });
      audit.append({
        time: new Date(now()).toISOString(),
        network: conf.name,
        ip: f.ip,
        containerId: f.containerId,
        ifname: 'eth0',
        ageSeconds: 0,
        verdict: 'live',
        reason: 'recreated: the data directory had no reservations while this running sandbox uses the address',
        phase: 'reserved',
      });
    }
  }
  return { recreated, runtimeError: null };
}

/** Where {@link makeHeal} gets the runtime and the audit log for one network's config. */
export interface HealEnv {
  /** The runtime for `conf`, or why it cannot be asked. */
  source(conf: IPAMConfig): PodIPSource | string;
  /** The audit log for `conf` (opened lazily by the implementation on first append). */
  audit(conf: IPAMConfig): AuditSink;
  /** Now, milliseconds since the Unix epoch. */
  now(): number;
}

/**
 * The plugin's self-healing hooks over any {@link HealEnv}: production passes CRI
 * (`src/cni/heal.ts`), unit tests pass a fake sandbox list. Closes the source and the audit log
 * after each hook.
 */
export function makeHeal(env: HealEnv): HealHooks {
  async function withRuntime<T>(conf: IPAMConfig, fn: (src: PodIPSource | string, audit: AuditSink) => Promise<T>): Promise<T> {
    const src = env.source(conf);
    const audit = env.audit(conf);
    try {
      return await fn(src, audit);
    } finally {
      audit.close();
      if (typeof src !== 'string') await src.close?.();
    }
  }
  return {
    reclaim: (store, conf, release) =>
      withRuntime(conf, async (src, audit) => {
        const o = await reclaimLocked(store, conf, { source: src, audit, now: env.now }, release);
        return {
          released: o.released.length,
          reclaimable: o.releasable,
          details: exhaustionDetails(conf, o, formatDuration(conf.leakGracePeriodSeconds)),
        };
      }),
    recover: (store, conf) =>
      withRuntime(conf, async (src, audit) => {
        const o = await recoverLocked(store, conf, src, audit, env.now);
        // A runtime that exists but does not answer: handing out an address now could give away a
        // running pod's. Try again later (CNI 11) rather than allocate blind.
        if (o.runtimeError !== null && typeof src !== 'string') {
          throw new AppError(
            'RUNTIME_UNAVAILABLE',
            `the network directory ${conf.dataDir}/${conf.name} has no reservations and the runtime at ${src.endpoint} cannot be asked which pods already use its addresses: ${o.runtimeError}`,
            { retryable: true },
          );
        }
        return o.recreated.length;
      }),
  };
}
