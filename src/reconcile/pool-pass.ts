/**
 * The node's reconcile of its cluster-pool attachments (issue 11, docs/cluster.md "Reconcile per
 * node"): the daemon's pool pass ({@link runPoolPass}) and CNI GC on a pool network
 * ({@link poolGC}). The decisions are src/pool/leaks.ts and src/pool/reclaim.ts
 * (pure); this is the order of the reads, the daemon's rules and the audit.
 *
 * A pass, per pool the node's CNI configurations name (each with its node name):
 *
 * 1. read etcd's revision `R` of every pool — BEFORE the runtime is asked, so a handle with
 *    `create_revision ≤ R` existed when the runtime listed its sandboxes (else its ADD may be in
 *    flight and its sandbox not listed yet);
 * 2. the runtime snapshot (ListPodSandbox, any state; PodSandboxStatus of the READY ones for their
 *    pod IPs, BR-13: an address one reports is in use, and a failed status call releases nothing
 *    this pass), then the kernel evidence (`takeSnapshot`);
 * 3. the node's handles of each pool (one prefix read), classified by the node-local reconciler's
 *    evidence rules (`classifyPoolHandles`: live, in use, grace by revision, leaked, unknown);
 * 4. the daemon's rules over the `leaked` ones ({@link Confirmations}, shared with the node-local
 *    pass's logic): D1 — released only when consecutive passes at least `--grace` apart on the
 *    monotonic clock judged it leaked with the same `mod_revision` (and `create_revision`); D2 —
 *    at most 32 per pass, oldest `create_revision` first, the rest roll over; D3 — a runtime list
 *    that owns none of the node's handles of a pool is not trusted alone when ≥ 8 would go;
 * 5. the kernel evidence read again; each release's intent is audited (fsync) before its
 *    transaction (`releaseObserved`: handle `mod_revision` as observed, each block's allocation
 *    still carrying the handle's seq and owner, `removing/<node>` absent), then its outcome.
 *
 * A runtime that cannot be asked, incomplete kernel evidence, a failed status call: verdicts
 * `unknown`, nothing released (D4). An unreachable etcd skips that pool for the pass. A handle
 * that cannot be read, or a leak whose handle names a block that cannot be read, is an error of
 * kind `corrupt` (the latter audited `kept`), never released (docs/cluster.md "Corrupt keys").
 */
import { AppError } from '../common/errors.ts';
import { currentRevision, gcDecision, handlesPrefix, heartbeatWriter, nodeHandles, releaseObserved, type PoolHandleEntry, type PoolKeys, type PoolLeakVerdict, type ValidAttachment } from '../pool/index.ts';
import { reReserveLivePods, type PoolReReserved, type PoolWantEvent } from './pool-rereserve.ts';
import { hostname } from 'node:os';
import { parseRuntimeEndpoint } from '../common/endpoint.ts';
import { readKernelEvidence } from '../node/kernel-evidence.ts';
import type { KV } from '../store/kv.ts';
import type { AuditRecord, AuditSink } from './audit.ts';
import { Confirmations, type Candidate } from './confirm.ts';
import { inUseReason, type EvidenceReader, type UseEvidence } from './evidence.ts';
import { describeError, type ReconcileDeps } from './options.ts';
import { planPoolHandles, poolInUse } from './pool-plan.ts';
import { takeSnapshot, type RuntimeJson, type Snapshot } from './snapshot.ts';

/** One pool and node the pass reconciles. */
export interface PoolTarget extends PoolKeys {
  /** This node's name in the pool (the daemon's: `ipam.nodeName`, else `NODE_NAME`, else the host name). */
  readonly node: string;
  /** The pool's etcd (kept by the caller; not closed here). */
  readonly kv: KV;
  /** A unique identity of (etcd, prefix, pool, node), for the confirmations across passes. */
  readonly id: string;
  /**
   * The `ipam.runtimeEndpoint`s its networks' configs name (unix socket paths), if any: a pool
   * whose config names another runtime than the one the daemon asks is not judged (review B4: a
   * sandbox CRI-O listed was released on an idle containerd's empty list and the kernel's word).
   */
  readonly runtimeEndpoints?: readonly string[];
  /**
   * The CNI networks of the node that name this pool (config `name`s, in the configuration
   * directory's order); the first is recorded in a re-reserved live pod's handle. Default: none
   * (the pool's name is recorded).
   */
  readonly networks?: readonly string[];
  /**
   * A network of the pool fixes the node name (`ipam.nodeName`): then handles written under this
   * machine's earlier host names are never adopted — one fixed name in a shared config is how two
   * machines come to serve one node name, and one's earlier host name may be the other's present
   * one (review). Default false.
   */
  readonly fixedNodeName?: boolean;
}

/** Options of {@link runPoolPass}. */
export interface PoolPassOptions {
  /** `--runtime-endpoint`, or null for `CONTAINER_RUNTIME_ENDPOINT` / the defaults. */
  readonly runtimeEndpoint: string | null;
  /** Opens the audit log (called only when something is to be released). Throws AppError STORE_IO when it cannot. */
  readonly audit: () => AuditSink;
  /**
   * This machine's host name (default `os.hostname()`): only handles it wrote are judged and
   * released (HandleValue.host, review B1: two hosts under one node name).
   */
  readonly host?: string;
  /**
   * Earlier host names of this machine (src/node/host-history.ts; default none): a handle of the
   * node written under one of them is judged as the node's own — when the node's heartbeat names
   * this host (docs/cluster.md "A renamed host").
   */
  readonly earlierHosts?: readonly string[];
}

/** Counts of one pool's verdicts in a pass. */
export interface PoolCounts {
  readonly pool: string;
  readonly node: string;
  readonly live: number;
  readonly inUse: number;
  readonly grace: number;
  readonly leaked: number;
  readonly unknown: number;
}

/** One release the pass did. */
export interface PoolPassRelease {
  readonly pool: string;
  readonly node: string;
  readonly network: string;
  readonly containerId: string;
  readonly ifname: string;
  /** The addresses freed. */
  readonly ips: readonly string[];
  /** The handle's `mod_revision` the transaction compared, and its `create_revision`. */
  readonly modRevision: string;
  readonly createRevision: string;
}

/** A failure during a pool pass. `kind`: etcd, runtime, kernel, corrupt, release, audit. */
export interface PoolPassError {
  readonly kind: string;
  readonly message: string;
  readonly pool?: string;
}

/** What one pool pass found and did. */
export interface PoolPassReport {
  readonly runtime: RuntimeJson;
  readonly evidenceIncomplete: string | null;
  readonly pools: readonly PoolCounts[];
  readonly released: readonly PoolPassRelease[];
  /** Leak candidates not released this pass, per pool name (waiting for the second observation, over the cap, or held). */
  readonly candidates: ReadonlyMap<string, number>;
  /** Why nothing was released although candidates were confirmed (D3), else null. */
  readonly held: string | null;
  readonly waiting: number;
  readonly deferred: number;
  /** Live pods' addresses the pool had lost, written back this pass (docs/cluster.md "Re-reserving live pods' addresses"). */
  readonly reReserved: readonly PoolReReserved[];
  /** Wants of this node written or dropped this pass (src/pool/wanted.ts; docs/cluster.md "Re-reserving live pods' addresses"). */
  readonly wants: readonly PoolWantEvent[];
  readonly errors: readonly PoolPassError[];
}

type PoolCandidate = Candidate & { readonly target: PoolTarget; readonly handle: PoolHandleEntry; readonly verdict: PoolLeakVerdict };

/** The audit record of one address of a pool release: the node-local fields plus `pool` and `revision` (the handle's observed mod_revision). */
function auditRecord(t: PoolKeys, h: PoolHandleEntry, ip: string, nowMs: number, reason: string, phase: AuditRecord['phase']): AuditRecord {
  return {
    time: new Date(nowMs).toISOString(),
    network: h.value.network,
    ip,
    containerId: h.containerId,
    ifname: h.ifname,
    ageSeconds: Math.round(nowMs - h.value.at) / 1000,
    verdict: 'leaked',
    reason,
    phase,
    pool: t.pool,
    revision: h.modRevision,
  };
}

/**
 * Release `items` with the audit rule of the node-local reconciler (docs/reconciler.md safety
 * rule 5): every intent line appended and synced BEFORE the first transaction, then one outcome
 * line (`released`, or `kept` with why) after each. A line that cannot be written stops the
 * releases. An unreachable etcd stops them too (its error is thrown after the audit is closed:
 * the intent of a transaction whose answer was lost stays on record without an outcome, as for a
 * process killed in between). Returns what was released and the errors.
 */
async function releaseAudited(
  items: ReadonlyArray<{ readonly target: PoolTarget; readonly handle: PoolHandleEntry; readonly reason: string }>,
  audit: AuditSink,
  now: () => number,
): Promise<{ released: Array<{ target: PoolTarget; handle: PoolHandleEntry; ips: string[] }>; kept: Array<{ target: PoolTarget; handle: PoolHandleEntry; why: string; corruptKey?: string }>; errors: PoolPassError[]; unavailable: AppError | null }> {
  const released: Array<{ target: PoolTarget; handle: PoolHandleEntry; ips: string[] }> = [];
  const kept: Array<{ target: PoolTarget; handle: PoolHandleEntry; why: string; corruptKey?: string }> = [];
  const errors: PoolPassError[] = [];
  if (items.length === 0) return { released, kept, errors, unavailable: null };
  try {
    audit.open?.();
    const t = now();
    for (const it of items) for (const ip of it.handle.value.ips) audit.append(auditRecord(it.target, it.handle, ip.ip, t, it.reason, 'intent'));
    audit.sync();
  } catch (e) {
    errors.push({ kind: 'audit', message: `the audit log cannot be written: nothing released: ${describeError(e)}` });
    return { released, kept, errors, unavailable: null };
  }
  for (const it of items) {
    let outcome;
    try {
      outcome = await releaseObserved(it.target.kv, it.target, it.target.node, it.handle);
    } catch (e) {
      if (e instanceof AppError && e.code === 'STORE_UNAVAILABLE') return { released, kept, errors, unavailable: e };
      errors.push({ kind: 'release', pool: it.target.pool, message: `${it.handle.containerId}/${it.handle.ifname}: ${describeError(e)}` });
      continue;
    }
    try {
      const t = now();
      if (outcome.released) {
        released.push({ target: it.target, handle: it.handle, ips: outcome.ips });
        for (const ip of it.handle.value.ips) audit.append(auditRecord(it.target, it.handle, ip.ip, t, it.reason, 'released'));
      } else {
        kept.push({ target: it.target, handle: it.handle, why: outcome.why, ...(outcome.corruptKey === undefined ? {} : { corruptKey: outcome.corruptKey }) });
        for (const ip of it.handle.value.ips) audit.append(auditRecord(it.target, it.handle, ip.ip, t, outcome.why, 'kept'));
      }
    } catch (e) {
      errors.push({ kind: 'audit', message: `the audit log cannot be written: nothing further released: ${describeError(e)}` });
      break;
    }
  }
  return { released, kept, errors, unavailable: null };
}

/**
 * Etcd's revision `R` of every target, in order (null for one whose etcd could not be read; its
 * error is pushed on `errors`, kind `etcd`). Read before the runtime is asked (step 1).
 */
export async function poolRevisions(targets: readonly PoolTarget[], errors: PoolPassError[]): Promise<Array<string | null>> {
  return Promise.all(
    targets.map(async (t) => {
      try {
        return await currentRevision(t.kv);
      } catch (e) {
        errors.push({ kind: 'etcd', pool: t.pool, message: `pool ${t.pool}: ${describeError(e)}` });
        return null;
      }
    }),
  );
}

/**
 * The daemon's one runtime snapshot of a pass, shared by the node-local and pool plans: `R` of
 * every target and their errors ({@link poolRevisions}), read before `snap` was taken.
 */
export interface PoolPassShared {
  readonly revisions: ReadonlyArray<string | null>;
  readonly errors: readonly PoolPassError[];
  readonly snap: Snapshot;
}

/**
 * One pool pass of the daemon (see the module comment). Never throws for the runtime, the kernel,
 * etcd or the audit log: each failure is in `errors` and the pass goes on with what is safe.
 * @param confirmations the daemon's memory across pool passes (its own instance: not the node-local pass's).
 * @param deps the engine's I/O (runtime source, kernel evidence, wall clock for the audit's times).
 * @param monotonic milliseconds of a monotonic clock, for D1 (tests inject).
 * @param shared the daemon's snapshot of the pass with `R` read before it (else both are read here).
 */
export async function runPoolPass(
  targets: readonly PoolTarget[],
  o: PoolPassOptions,
  confirmations: Confirmations,
  deps: ReconcileDeps,
  monotonic: () => number = () => performance.now(),
  shared?: PoolPassShared,
): Promise<PoolPassReport> {
  const errors: PoolPassError[] = [];
  // 1. R of every pool, before the runtime is asked.
  const revisions = shared?.revisions ?? (await poolRevisions(targets, errors));
  if (shared !== undefined) errors.push(...shared.errors);
  // 2. The runtime, then the kernel (or the daemon's one snapshot of the pass, taken after R).
  const snap = shared?.snap ?? (await takeSnapshot({ ...(o.runtimeEndpoint === null ? {} : { runtimeEndpoint: o.runtimeEndpoint }), podIPs: true, warnOtherRuntimes: false }, deps));
  if (snap.runtime.error !== undefined) errors.push({ kind: 'runtime', message: snap.runtime.error });
  if (snap.evidence.incomplete !== null) errors.push({ kind: 'kernel', message: `kernel evidence incomplete: ${snap.evidence.incomplete}` });
  // A failed status call leaves a READY sandbox's addresses unknown: nothing is released this pass (E6).
  for (const f of snap.podIPFailures) errors.push({ kind: 'runtime', message: `${f}: nothing released this pass` });
  const inUse = poolInUse(snap);

  // 3. The node's handles of each pool, classified.
  const pools: PoolCounts[] = [];
  const reReserved: PoolReReserved[] = [];
  const wants: PoolWantEvent[] = [];
  const candidates: PoolCandidate[] = [];
  const owned = new Set<string>();
  for (let i = 0; i < targets.length; i++) {
    const t = targets[i] as PoolTarget;
    const r = revisions[i] ?? null;
    if (r === null) continue;
    const asked = snap.runtime.endpoint === null ? null : endpointPath(snap.runtime.endpoint);
    const other = (t.runtimeEndpoints ?? []).find((e) => endpointPath(e) !== asked);
    if (other !== undefined) {
      errors.push({ kind: 'runtime', pool: t.pool, message: `pool ${t.pool}: a network of it names runtimeEndpoint ${other}, but the daemon asks ${snap.runtime.endpoint ?? '(none)'}: not judged, nothing released (run the daemon with --runtime-endpoint ${other})` });
      continue;
    }
    let handles: PoolHandleEntry[];
    let foreign: PoolHandleEntry[];
    try {
      const listed = nodeHandles(await t.kv.list(handlesPrefix(t)), t, t.node, o.host ?? hostname());
      for (const c of listed.corrupt) errors.push({ kind: 'corrupt', pool: t.pool, message: c.message });
      const own = await adoptEarlierHosts(t, o.host ?? hostname(), o.earlierHosts ?? [], listed.foreign, errors);
      const left = listed.foreign.filter((h) => !own.includes(h));
      if (left.length > 0) errors.push({ kind: 'foreign', pool: t.pool, message: foreignMessage(t.pool, t.node, o.host ?? hostname(), left) });
      handles = [...listed.handles, ...own];
      foreign = left;
    } catch (e) {
      errors.push({ kind: 'etcd', pool: t.pool, message: `pool ${t.pool}: ${describeError(e)}` });
      continue;
    }
    const plan = planPoolHandles(snap, handles, r, null);
    const verdicts = plan.verdicts;
    const n = { live: 0, inUse: 0, grace: 0, leaked: 0, unknown: 0 };
    verdicts.forEach((v, k) => {
      const h = handles[k] as PoolHandleEntry;
      if (v.verdict === 'live') {
        n.live++;
        owned.add(t.id);
      } else if (v.verdict === 'in use') n.inUse++;
      else if (v.verdict === 'grace') n.grace++;
      else if (v.verdict === 'unknown') n.unknown++;
      else {
        n.leaked++;
        if (!plan.candidates) return; // not a candidate while a READY sandbox's addresses are unknown
        // The confirmation key: the handle; what must not change between the observations: its
        // mod_revision (owner text) and create_revision (the "file time", also the oldest-first order).
        candidates.push({ network: t.id, ip: `${h.containerId}/${h.ifname}`, owner: h.modRevision, mtimeMs: Number(h.createRevision), target: t, handle: h, verdict: v });
      }
    });
    pools.push({ pool: t.pool, node: t.node, ...n });
    // BR-13 for the pool: a READY sandbox's address that the pool does not hold is written back
    // (an etcd restored from an older snapshot lost it), never taken from another holder.
    if (snap.podIPs !== null && snap.runtime.error === undefined) {
      const rr = await reReserveLivePods(t, snap.podIPs, [...handles, ...foreign], o.host ?? hostname(), () => deps.now(), snap.podIPFailures.length === 0 && snap.evidence.incomplete === null, (ip) => (snap.evidence.addresses.get(ip)?.length ?? 0) > 0);
      reReserved.push(...rr.reReserved);
      wants.push(...rr.wants);
      errors.push(...rr.errors);
    }
  }

  // 4. D1, D2, D3.
  const decision = confirmations.observe(candidates, monotonic(), (id) => owned.has(id));

  // 5. The kernel again, just before the releases; then audited, revision-guarded releases.
  const released: PoolPassRelease[] = [];
  const releasedKeys = new Set<string>();
  if (decision.release.length > 0) {
    let ev: UseEvidence;
    try {
      ev = await (deps.evidence ?? (() => readKernelEvidence()))();
    } catch (e) {
      ev = { addresses: new Map(), inFlight: new Map(), incomplete: describeError(e) };
    }
    const go: Array<{ target: PoolTarget; handle: PoolHandleEntry; reason: string }> = [];
    if (ev.incomplete !== null) errors.push({ kind: 'kernel', message: `kernel evidence incomplete before the releases: ${ev.incomplete}; nothing released` });
    else {
      for (const c of decision.release) {
        const used = c.handle.value.ips.map((x) => inUse(ev, x.ip, c.handle.containerId)).find((x) => x !== null) ?? null;
        if (used !== null) continue; // in use now: kept (and a candidate no more next pass)
        go.push({ target: c.target, handle: c.handle, reason: `pool ${c.target.pool}: ${c.verdict.reason}, in two observations at least the grace period apart with the same mod_revision ${c.handle.modRevision}` });
      }
    }
    let audit: AuditSink | null = null;
    try {
      if (go.length > 0) audit = o.audit();
    } catch (e) {
      errors.push({ kind: 'audit', message: `the audit log cannot be opened: nothing released: ${describeError(e)}` });
    }
    if (audit !== null) {
      try {
        const r = await releaseAudited(go, audit, deps.now);
        errors.push(...r.errors);
        if (r.unavailable !== null) errors.push({ kind: 'etcd', message: describeError(r.unavailable) });
        for (const x of r.released) {
          confirmations.forget(x.target.id, `${x.handle.containerId}/${x.handle.ifname}`);
          releasedKeys.add(`${x.target.id}\u0000${x.handle.key}`);
          released.push({ pool: x.target.pool, node: x.target.node, network: x.handle.value.network, containerId: x.handle.containerId, ifname: x.handle.ifname, ips: x.ips, modRevision: x.handle.modRevision, createRevision: x.handle.createRevision });
        }
        for (const k of r.kept) for (const c of decision.release) if (c.handle === k.handle) confirmations.forget(c.target.id, c.ip);
        // A handle kept because a block it names cannot be read: reported (kind corrupt) every time, left for an operator.
        for (const k of r.kept) if (k.corruptKey !== undefined) errors.push({ kind: 'corrupt', pool: k.target.pool, message: `${k.handle.containerId}/${k.handle.ifname}: ${k.why}` });
      } finally {
        audit.close();
      }
    }
  }
  const pending = new Map<string, number>();
  for (const c of [...decision.deferred, ...decision.waiting, ...decision.release]) {
    if (releasedKeys.has(`${c.target.id}\u0000${c.handle.key}`)) continue;
    pending.set(c.target.pool, (pending.get(c.target.pool) ?? 0) + 1);
  }
  return {
    runtime: snap.runtime,
    evidenceIncomplete: snap.evidence.incomplete,
    pools,
    released,
    candidates: pending,
    held: decision.held,
    waiting: decision.waiting.length,
    deferred: decision.deferred.length,
    reReserved,
    wants,
    errors,
  };
}

/** What {@link poolGC} did. */
export interface PoolGcOutcome {
  /** The attachments released (`containerId/ifname`) with their freed addresses. */
  readonly released: ReadonlyArray<{ readonly containerId: string; readonly ifname: string; readonly ips: readonly string[] }>;
  /** Not valid attachments, kept: why. */
  readonly kept: ReadonlyArray<{ readonly containerId: string; readonly ifname: string; readonly why: string }>;
}

/** What {@link poolGC} is given. */
export interface PoolGcDeps {
  /** Reads the kernel evidence (after the handles are read). */
  readonly evidence: EvidenceReader;
  /** Opens the audit log (only when something is to be released). */
  audit(): AuditSink;
  /** Now, ms since the epoch (the audit's times). */
  now(): number;
  /** This machine's host name (default `os.hostname()`): see {@link PoolPassOptions.host}. */
  readonly host?: string;
}

/** The socket path of a runtime endpoint text (`unix:///x` and `/x` are one), or the text when it does not parse. */
function endpointPath(e: string): string {
  try {
    return parseRuntimeEndpoint(e).path;
  } catch {
    return e;
  }
}

/**
 * Of `foreign` (handles of `t.node` another host name wrote), those written under an earlier host
 * name of this machine (`earlier`), judged as the node's own — only while the node's heartbeat
 * key names this host (`me`): a heartbeat written by another host means another live daemon serves
 * this node name (two hosts under one node name), and then none is (an error of kind `foreign`
 * says so); and never when the node name is fixed by `ipam.nodeName` ({@link PoolTarget.fixedNodeName}). One read of the heartbeat key, only when some handle is of an earlier host.
 */
async function adoptEarlierHosts(t: PoolTarget, me: string, earlier: readonly string[], foreign: readonly PoolHandleEntry[], errors: PoolPassError[]): Promise<PoolHandleEntry[]> {
  const mine = foreign.filter((h) => h.value.host !== undefined && h.value.host !== me && earlier.includes(h.value.host));
  if (mine.length === 0) return [];
  if (t.fixedNodeName === true) {
    const hosts = [...new Set(mine.map((h) => h.value.host as string))].sort().join(', ');
    errors.push({ kind: 'foreign', pool: t.pool, message: `pool ${t.pool}: ${mine.length} handle(s) of node ${t.node} were written under earlier host names of this machine (${hosts}), but the node name is fixed by ipam.nodeName (several machines may share it): never judged here` });
    return [];
  }
  const hb = await t.kv.get(`${t.prefix}/pools/${t.pool}/alive/${t.node}`);
  const w = heartbeatWriter(hb?.value ?? null);
  if (w !== null && w.host === me) return mine;
  const hosts = [...new Set(mine.map((h) => h.value.host as string))].sort().join(', ');
  errors.push({ kind: 'foreign', pool: t.pool, message: `pool ${t.pool}: ${mine.length} handle(s) of node ${t.node} were written under earlier host names of this machine (${hosts}), but the node's heartbeat ${hb === null ? 'is absent' : w === null ? 'names no host' : `was written on host ${w.host}`}: not judged until it names ${me}` });
  return [];
}

/** The error of a pass (and the reason of GC) for handles of the node another host wrote. */
function foreignMessage(pool: string, node: string, host: string, foreign: readonly PoolHandleEntry[]): string {
  const hosts = [...new Set(foreign.map((h) => h.value.host ?? '(none recorded)'))].sort().join(', ');
  return `pool ${pool}: ${foreign.length} handle(s) of node ${node} were written on other hosts than ${host} (${hosts}): never judged or released here — two hosts under one node name? (a fixed ipam.nodeName, equal host names)`;
}

/**
 * CNI GC on a pool network (CNI 1.1.0 §GC, `cni.dev/valid-attachments`): release the handles of
 * `t.node` of network `network` whose (containerID, ifname) is not in `valid`, under the
 * node-local GC's guards (src/pool/reclaim.ts `gcDecision`): the revision `R` is read first
 * (a handle created since is kept: the runtime's list is a snapshot), then the handles, then the
 * kernel evidence (an address configured in some namespace, or a CNI operation of the container
 * running on the node → kept; incomplete evidence → nothing released). Handles of other nodes,
 * and tombstones, are never touched. Each release is audited like the daemon's (intent synced
 * first) and is one revision-guarded transaction.
 * @throws AppError STORE_UNAVAILABLE (CNI 11) when etcd cannot be asked (every release done so far
 *   is whole: one transaction each); STORE_IO (CNI 5) when the audit log cannot be written (nothing
 *   released after that) or a release failed otherwise.
 */
export async function poolGC(t: PoolKeys & { readonly kv: KV; readonly node: string }, network: string, valid: readonly ValidAttachment[], deps: PoolGcDeps): Promise<PoolGcOutcome> {
  const r = await currentRevision(t.kv);
  const host = deps.host ?? hostname();
  const listed = nodeHandles(await t.kv.list(handlesPrefix(t)), t, t.node, host);
  const handles = listed.handles.filter((h) => h.value.network === network);
  const ev = await deps.evidence();
  const verdicts = gcDecision(handles, valid, r, (ip, id) => inUseReason(ev, ip, id), ev.incomplete);
  const kept: Array<{ containerId: string; ifname: string; why: string }> = [];
  for (const v of verdicts) if (!v.release) kept.push({ containerId: v.handle.containerId, ifname: v.handle.ifname, why: v.why });
  const foreign = listed.foreign.filter((h) => h.value.network === network);
  for (const h of foreign) kept.push({ containerId: h.containerId, ifname: h.ifname, why: foreignMessage(t.pool, t.node, host, [h]) });
  const go = verdicts.filter((v) => v.release).map((v) => ({
    target: { ...t, id: '' } as PoolTarget,
    handle: v.handle,
    reason: `CNI GC, pool ${t.pool}: not a valid attachment of the runtime, created before the GC began (create_revision ${v.handle.createRevision} ≤ ${r}), and the kernel shows its addresses in use nowhere`,
  }));
  if (go.length === 0) return { released: [], kept };
  const audit = deps.audit();
  let res;
  try {
    res = await releaseAudited(go, audit, deps.now);
  } finally {
    audit.close();
  }
  if (res.unavailable !== null) throw res.unavailable;
  for (const k of res.kept) kept.push({ containerId: k.handle.containerId, ifname: k.handle.ifname, why: k.why });
  if (res.errors.length > 0) throw new AppError('STORE_IO', `GC failed to release some attachments: ${res.errors.map((e) => e.message).join('; ')}`);
  return { released: res.released.map((x) => ({ containerId: x.handle.containerId, ifname: x.handle.ifname, ips: x.ips })), kept };
}
