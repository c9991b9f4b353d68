/**
 * Applying a reconcile plan (ARCHITECTURE.md "Reconciler safety rules"). The runtime snapshot
 * was taken before the plan (and so before any lock); here, for each network with something to
 * release:
 * 1. take the network's store lock;
 * 2. re-read its reservations under the lock;
 * 3. for each planned release, require the same owner as planned and re-classify the fresh record
 *    with the SAME snapshot and the SAME policy ({@link classify}): a file rewritten since
 *    (younger mtime) becomes `grace` (or `live`, for a NOT READY sandbox's) and is kept;
 * 4. append one `intent` audit record per file still to release and make them durable (fsync),
 *    BEFORE anything is removed ({@link releaseRecorded});
 * 5. release with `Store.release(ip, expectedOwner)`, which re-reads the file once more and
 *    removes it only if the owner is unchanged, and append its outcome (`released` or `kept`).
 *
 * {@link reReserve} re-creates, under each network's lock, the reservations of live sandboxes'
 * addresses that had none (field report BR-13), with `Store.restore` (fails when the address was
 * taken meanwhile; never moves `last_reserved_ip`), and records each in the audit log.
 */
import { AppError } from '../common/errors.ts';
import { sameOwner, type Reservation, type Store } from '../store/store.ts';
import { memoryAuditSink, type AuditPhase, type AuditRecord, type AuditSink } from './audit.ts';
import type { EvidenceReader } from './evidence.ts';
import { DEFAULT_LOCK_TIMEOUT_SECONDS, type StoreOpener } from './networks.ts';
import { classify, isReleasable, isStampedInFuture, type AnyVerdict, type Plan, type PlanEntry } from './plan.ts';
import { podIPMessage, type PodIPFinding } from './unreserved.ts';

/** Options of {@link applyPlan}. */
export interface ApplyOptions {
  /** Opens the store of a network (closed by applyPlan). */
  readonly openStore: StoreOpener;
  /** Receives an `intent` record before each removal (synced), and its outcome after it. */
  readonly audit: AuditSink;
  /** Clock for audit times, milliseconds since the Unix epoch. */
  readonly now: () => number;
  /** Seconds to wait for each network's lock (default {@link DEFAULT_LOCK_TIMEOUT_SECONDS}). */
  readonly lockTimeoutSeconds?: number;
  /**
   * Reads the kernel evidence again, under each network's lock, before its releases are
   * re-classified (`src/node/kernel-evidence.ts` in production; tests pass a constant).
   */
  readonly evidence: EvidenceReader;
}

/** A planned release that was not done, and why (a short sentence). */
export interface SkippedRelease {
  readonly entry: PlanEntry<AnyVerdict>;
  readonly why: string;
}

/** A failure while applying: one network (lock, list) or one IP (release, audit). */
export interface ApplyError {
  readonly network: string;
  readonly ip: string | null;
  readonly error: unknown;
  readonly message: string;
}

/** What {@link applyPlan} did. */
export interface ApplyResult {
  /** Removed entries, as re-classified under the lock, in plan order. */
  readonly released: PlanEntry<AnyVerdict>[];
  readonly skipped: SkippedRelease[];
  readonly errors: ApplyError[];
  /** True when an audit record could not be written (then nothing further was released). */
  readonly auditBroken?: boolean;
}

/** Why-texts of {@link SkippedRelease} (stable). */
export const SKIP_REASONS = {
  gone: 'file no longer exists under the lock',
  ownerChanged: 'owner changed since the plan',
  releaseRefused: 'file changed while releasing',
  auditBroken: 'not attempted: the audit log cannot be written',
} as const;

/**
 * Open `network`'s store, take its lock, run `fn`, then close (unlock) it. Opening, locking and
 * `fn` failures, and a failing close, are recorded in `errors` (never thrown), so one network's
 * trouble does not stop the others.
 */
async function withNetworkLock(network: string, opts: ApplyOptions, errors: ApplyError[], fn: (store: Store) => Promise<void>): Promise<void> {
  let store: Store;
  try {
    store = await opts.openStore(network);
  } catch (error) {
    errors.push({ network, ip: null, error, message: describe(error) });
    return;
  }
  try {
    await store.lock(opts.lockTimeoutSeconds ?? DEFAULT_LOCK_TIMEOUT_SECONDS);
    await fn(store);
  } catch (error) {
    errors.push({ network, ip: null, error, message: describe(error) });
  } finally {
    try {
      await store.close();
    } catch (error) {
      errors.push({ network, ip: null, error, message: describe(error) });
    }
  }
}

/**
 * Release `plan.release` following the steps in the module comment. Never throws for store or
 * audit failures: a network whose lock or list fails is reported in `errors` and the others are
 * still processed; if an audit line cannot be written (see {@link releaseRecorded}), that is
 * reported in `errors` and nothing further is released (every release must be recorded before it
 * happens). Each store is closed (unlocking it) before the next network is processed.
 */
export async function applyPlan(p: Plan<AnyVerdict>, opts: ApplyOptions): Promise<ApplyResult> {
  const released: PlanEntry<AnyVerdict>[] = [];
  const skipped: SkippedRelease[] = [];
  const errors: ApplyError[] = [];
  const byNetwork = new Map<string, PlanEntry<AnyVerdict>[]>();
  for (const e of p.release) {
    const list = byNetwork.get(e.network);
    if (list === undefined) byNetwork.set(e.network, [e]);
    else list.push(e);
  }
  let auditBroken = false;
  for (const [network, planned] of byNetwork) {
    if (auditBroken) {
      for (const entry of planned) skipped.push({ entry, why: SKIP_REASONS.auditBroken });
      continue;
    }
    await withNetworkLock(network, opts, errors, async (store) => {
      const current = new Map<string, Reservation>();
      for (const r of await store.list()) current.set(r.ip, r);
      // The kernel is asked again under this lock: an address configured since the plan protects its file.
      const evidence = await opts.evidence();
      const toRelease: Array<{ entry: PlanEntry<AnyVerdict>; fresh: PlanEntry<AnyVerdict> }> = [];
      for (const entry of planned) {
        const cur = current.get(entry.ip);
        if (cur === undefined) {
          skipped.push({ entry, why: SKIP_REASONS.gone });
          continue;
        }
        if (!sameOwner(cur.owner, entry.owner)) {
          skipped.push({ entry, why: SKIP_REASONS.ownerChanged });
          continue;
        }
        const fresh = classify({ network, dir: entry.dir, ip: cur.ip, owner: cur.owner, mtimeMs: cur.mtimeMs }, { ...p, evidence });
        if (!isReleasable(fresh.verdict)) {
          skipped.push({ entry, why: `now ${fresh.verdict}: ${fresh.reason}` });
          continue;
        }
        toRelease.push({ entry, fresh });
      }
      const r = await releaseRecorded(store, toRelease.map((x) => x.fresh), opts.audit, opts.now);
      released.push(...r.released);
      toRelease.forEach((x, i) => {
        const outcome = r.outcomes[i];
        if (outcome === 'refused') skipped.push({ entry: x.entry, why: SKIP_REASONS.releaseRefused });
        else if (outcome === 'not attempted') skipped.push({ entry: x.entry, why: SKIP_REASONS.auditBroken });
      });
      for (const f of r.failures) errors.push({ network, ip: f.entry.ip, error: f.error, message: describe(f.error) });
      if (r.auditError !== null) {
        auditBroken = true;
        errors.push({ network, ip: r.auditError.ip, error: r.auditError.error, message: r.auditError.message });
      }
    });
  }
  return { released, skipped, errors, auditBroken };
}

/**
 * Restamp (`Store.touch`, under each network's lock) every entry of `p` whose file is stamped in
 * the future after a backward clock step, if its owner is unchanged: its grace period then runs
 * from now instead of for as long as the step (docs/reconciler.md "Time"). Returns the failures
 * (never throws).
 */
export async function restampFuture(p: Plan<AnyVerdict>, opts: Pick<ApplyOptions, 'openStore' | 'lockTimeoutSeconds'>): Promise<ApplyError[]> {
  const errors: ApplyError[] = [];
  const byNetwork = new Map<string, PlanEntry<AnyVerdict>[]>();
  for (const e of p.entries) {
    if (!isStampedInFuture(e.mtimeMs, p.snapshotAtMs)) continue;
    const list = byNetwork.get(e.network);
    if (list === undefined) byNetwork.set(e.network, [e]);
    else list.push(e);
  }
  const full: ApplyOptions = { ...opts, audit: memoryAuditSink(), now: Date.now, evidence: () => p.evidence };
  for (const [network, entries] of byNetwork) {
    await withNetworkLock(network, full, errors, async (store) => {
      for (const e of entries) await store.touch(e.ip, e.owner);
    });
  }
  return errors;
}

/** What became of one entry given to {@link releaseRecorded}. */
export type ReleaseOutcome = 'released' | 'refused' | 'failed' | 'not attempted';

/** What {@link releaseRecorded} did. */
export interface RecordedRelease {
  /** The entries removed, in order. */
  readonly released: PlanEntry<AnyVerdict>[];
  /** Per entry given, in order: what became of it. */
  readonly outcomes: ReleaseOutcome[];
  /** Entries whose removal threw (their `kept` line says why). */
  readonly failures: Array<{ entry: PlanEntry<AnyVerdict>; error: unknown }>;
  /**
   * The first audit write that failed (then nothing further was attempted), with a message
   * naming what was and was not done; null when every line was written.
   */
  readonly auditError: { ip: string | null; error: unknown; message: string } | null;
}

/**
 * Release `entries` of `store` (lock held by the caller) so that every release is on record
 * before it happens, also if the process is killed at any instant:
 * 1. one `intent` record per entry is appended, then `audit.sync()` makes them durable;
 * 2. each file is removed with `Store.release(ip, owner)` (re-read, same owner, unlink), then a
 *    `released` record, or a `kept` one when it was not removed (changed meanwhile, or the
 *    removal failed: its reason says why).
 * When an intent cannot be written or synced nothing is removed; when an outcome line cannot be
 * written nothing further is removed. `reasonPrefix` is put before each record's reason (the
 * plugin's `reclaimed on exhaustion: `). Never throws for store or audit failures.
 */
export async function releaseRecorded(
  store: Store,
  entries: readonly PlanEntry<AnyVerdict>[],
  audit: AuditSink,
  now: () => number,
  reasonPrefix = '',
): Promise<RecordedRelease> {
  const outcomes: ReleaseOutcome[] = entries.map(() => 'not attempted');
  const released: PlanEntry<AnyVerdict>[] = [];
  const failures: Array<{ entry: PlanEntry<AnyVerdict>; error: unknown }> = [];
  const rec = (e: PlanEntry<AnyVerdict>, phase: AuditPhase, reason = `${reasonPrefix}${e.reason}`): AuditRecord => ({ ...auditRecord(e, now(), phase), reason });
  if (entries.length === 0) return { released, outcomes, failures, auditError: null };
  try {
    for (const e of entries) audit.append(rec(e, 'intent'));
    audit.sync();
  } catch (error) {
    return { released, outcomes, failures, auditError: { ip: null, error, message: `nothing released: ${describe(error)}` } };
  }
  for (let i = 0; i < entries.length; i++) {
    const e = entries[i] as PlanEntry<AnyVerdict>;
    let line: AuditRecord;
    try {
      if (await store.release(e.ip, e.owner)) {
        outcomes[i] = 'released';
        released.push(e);
        line = rec(e, 'released');
      } else {
        outcomes[i] = 'refused';
        line = rec(e, 'kept', SKIP_REASONS.releaseRefused);
      }
    } catch (error) {
      outcomes[i] = 'failed';
      failures.push({ entry: e, error });
      line = rec(e, 'kept', `release failed: ${describe(error)}`);
    }
    try {
      audit.append(line);
    } catch (error) {
      const what = outcomes[i] === 'released' ? `released ${e.ip} (its intent is on record) but` : `did not release ${e.ip}, and`;
      return { released, outcomes, failures, auditError: { ip: e.ip, error, message: `${what} ${describe(error)}; nothing further released` } };
    }
  }
  return { released, outcomes, failures, auditError: null };
}

/** What {@link reReserve} did. */
export interface ReReserveResult {
  /**
   * The findings given, in order, each with its outcome: `re-reserved`; `conflict` (taken by
   * another container under the lock, `reservedFor` set); `reported` (not attempted: no network,
   * the audit log broke, or an error; or the address was found reserved for the sandbox itself).
   */
  readonly findings: PodIPFinding[];
  readonly errors: ApplyError[];
}

/** Interface name of re-created reservations (the pod network's interface, as the plugin's recovery uses). */
export const RE_RESERVE_IFNAME = 'eth0';

/**
 * Re-reserve each `reported` finding with a network for its sandbox (owner = sandbox ID, ifname
 * `eth0`) under that network's lock with `Store.restore`, and append one audit record per
 * re-reservation (verdict `live`, reason `re-reserved: <message>`). Other findings are returned
 * unchanged. Never throws for store or audit failures (reported in `errors`); after an audit
 * record cannot be written nothing further is re-reserved.
 */
export async function reReserve(findings: readonly PodIPFinding[], opts: ApplyOptions): Promise<ReReserveResult> {
  const out = [...findings];
  const errors: ApplyError[] = [];
  const byNetwork = new Map<string, number[]>();
  out.forEach((f, i) => {
    if (f.action !== 'reported' || f.network === null) return;
    const list = byNetwork.get(f.network);
    if (list === undefined) byNetwork.set(f.network, [i]);
    else list.push(i);
  });
  let auditBroken = false;
  for (const [network, indexes] of byNetwork) {
    if (auditBroken) break;
    await withNetworkLock(network, opts, errors, async (store) => {
      for (const i of indexes) {
        if (auditBroken) break;
        const f = out[i] as PodIPFinding;
        let ok: boolean;
        try {
          ok = await store.restore(f.ip, { containerId: f.sandbox, ifname: RE_RESERVE_IFNAME });
        } catch (error) {
          errors.push({ network, ip: f.ip, error, message: describe(error) });
          continue;
        }
        if (!ok) {
          // Taken since the snapshot: by whom, as read under this same lock.
          const holder = (await store.list({ mtime: false })).find((r) => r.ip === f.ip);
          const reservedFor = holder?.owner?.containerId ?? null;
          if (reservedFor !== f.sandbox) {
            out[i] = { ...f, action: 'conflict', reservedFor, message: podIPMessage('conflict', f.sandbox, f.ip, reservedFor) };
          }
          continue;
        }
        out[i] = { ...f, action: 're-reserved' };
        try {
          opts.audit.append({
            time: new Date(opts.now()).toISOString(),
            network,
            ip: f.ip,
            containerId: f.sandbox,
            ifname: RE_RESERVE_IFNAME,
            ageSeconds: 0,
            verdict: 'live',
            reason: `re-reserved: ${f.message}`,
            phase: 'reserved',
          });
        } catch (error) {
          auditBroken = true;
          errors.push({ network, ip: f.ip, error, message: `re-reserved ${f.ip} but ${describe(error)}` });
        }
      }
    });
  }
  return { findings: out, errors };
}

/** The audit record of an entry being released at time `nowMs` (`phase` default `intent`). */
export function auditRecord(e: PlanEntry<AnyVerdict>, nowMs: number, phase: AuditPhase = 'intent'): AuditRecord {
  return {
    time: new Date(nowMs).toISOString(),
    network: e.network,
    ip: e.ip,
    containerId: e.containerId,
    ifname: e.ifname,
    ageSeconds: e.ageSeconds,
    verdict: e.verdict,
    reason: e.reason,
    phase,
  };
}

function describe(e: unknown): string {
  if (e instanceof AppError) return e.details === undefined ? e.message : `${e.message} (${e.details})`;
  return e instanceof Error ? e.message : String(e);
}
