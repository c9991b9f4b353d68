/**
 * `ipwarden pool` — cluster pools on etcd (issue 11, docs/cluster.md).
 *
 * Usage:
 *   ipwarden pool status      --pool NAME --etcd-endpoints URL[,URL…] [--etcd-prefix P]
 *                             [--etcd-ca FILE [--etcd-cert FILE --etcd-key FILE]]
 *                             [--etcd-credentials FILE] [--json]
 *                             [--html [--out FILE]]
 *   ipwarden pool remove-node NODE --pool NAME --etcd-endpoints … [--finish] [--force] [--json]
 *   ipwarden pool leaks       --pool NAME --etcd-endpoints … [--node NODE] [--runtime-endpoint URL]
 *                             [--grace DUR] [--json]
 * Examples:
 *   ipwarden pool status --pool net1-pool --etcd-endpoints http://10.0.0.5:2379
 *   ipwarden pool status --pool net1-pool --etcd-endpoints http://10.0.0.5:2379 --html --out /tmp/pool.html
 *   ipwarden pool remove-node worker-7 --pool net1-pool --etcd-endpoints http://10.0.0.5:2379
 *   ipwarden pool remove-node worker-7 --pool net1-pool --etcd-endpoints http://10.0.0.5:2379 --finish
 *
 * A thin verb: flags → the same validation as `ipam.pool` (so the flags take exactly what a
 * network config takes) → the engines of src/pool/status.ts and src/pool/allocator.ts →
 * table or JSON. `remove-node` without `--finish` marks the node's blocks `pendingRelease` (the
 * node vetoes when it returns); with `--finish`, after the veto window, it releases what the node
 * held. Step 1 refuses (exit 1) while the node's heartbeat key exists, unless `--force`; `--finish`
 * refuses (exit 1) without step 1's marker, after a veto, or while a heartbeat exists (never forced).
 * Step 1 also refuses (exit 1, nothing written) a node that has nothing in the pool (a typo), and —
 * unless `--force` — one no ipwarden daemon has served (no settings key: it cannot veto while
 * idle; trial finding 1). Blocks are named by CIDR (`10.80.0.64/26`) and sorted by address in
 * every output. With `--json` an error is JSON on stdout: `{"version":1,"error":{"code","msg"}}`
 * (`code`: ipwarden's error code, e.g. `STORE_CONFLICT` for a refusal, `USAGE`).
 * Exit status: 0; 1 on an etcd or data error or a refusal; 2 usage error.
 */
import { hostname } from 'node:os';
import { randomBytes } from 'node:crypto';
import { closeSync, constants, fsyncSync, openSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { AppError, UsageError } from '../common/errors.ts';
import { compareIP, parseCIDR } from '../common/ip.ts';
import { decodePoolConfig, validNodeName, type PoolConfig } from '../ipam/pool-config.ts';
import { checkLivePods, type PoolPodAddressFinding } from '../reconcile/pool-rereserve.ts';
import { blockKeyCidr, lastSeen, corruptLine, currentRevision, etcdFor, handlesPrefix, nodeHandles, nodeHeartbeat, PoolRemoval, poolStatus, REMOVAL_WINDOW_SECONDS, RemovalRefusedError, type PoolLeakVerdict, type PoolStatus } from '../pool/index.ts';
import { resolveNodeName } from '../node/node-name.ts';
import { DEFAULT_GRACE, parseGrace } from '../reconcile/options.ts';
import { planPoolHandles } from '../reconcile/pool-plan.ts';
import { takeSnapshot } from '../reconcile/snapshot.ts';
import type { CliContext } from './context.ts';
import { renderTable, shortId } from './format.ts';

/** Options of `pool status` / `pool remove-node` as commander parses them. */
export interface PoolOptions {
  pool?: string;
  etcdEndpoints?: string;
  etcdPrefix?: string;
  etcdCa?: string;
  etcdCert?: string;
  etcdKey?: string;
  /** `ipam.pool.etcd.credentials`. */
  etcdCredentials?: string;
  json?: boolean;
  /** `pool status`: the HTML page (on stdout, or to `out`). */
  html?: boolean;
  /** `pool status --html`: the file the page is written to (atomically; never through a symlink). */
  out?: string;
  finish?: boolean;
  force?: boolean;
  /** `pool leaks`: the node (default: NODE_NAME, else the host name). */
  node?: string;
  runtimeEndpoint?: string;
  grace?: string;
}

/** Flags → a validated {@link PoolConfig} (the `ipam.pool` rules; their messages, as a UsageError naming the flag's key). */
export function poolFromFlags(o: PoolOptions): PoolConfig {
  if (o.pool === undefined) throw new UsageError('--pool NAME is required');
  if (o.etcdEndpoints === undefined) throw new UsageError('--etcd-endpoints URL[,URL...] is required');
  const tls = o.etcdCa === undefined && o.etcdCert === undefined && o.etcdKey === undefined ? undefined : { ca: o.etcdCa, cert: o.etcdCert, key: o.etcdKey };
  try {
    return decodePoolConfig({
      pool: {
        name: o.pool,
        etcd: {
          endpoints: o.etcdEndpoints.split(',').filter((e) => e !== ''),
          ...(tls === undefined ? {} : { tls }),
          ...(o.etcdPrefix === undefined ? {} : { prefix: o.etcdPrefix }),
          ...(o.etcdCredentials === undefined ? {} : { credentials: o.etcdCredentials }),
        },
      },
    }) as PoolConfig;
  } catch (e) {
    if (e instanceof AppError && e.code === 'IPAM_INVALID_CONFIG') throw new UsageError(`${e.message} (from the flags)`);
    throw e;
  }
}

/**
 * The human report of `pool status`: range sets, nodes, blocks, and — only when there are any —
 * the keys that cannot be read (`CORRUPT KEY`, `WHY`) with a last line saying they are left for an
 * operator; and — only when there are any — the pools of the prefix that overlap this one (`LATER POOL`,
 * `EARLIER POOL`, `OVERLAPPING RANGES`: the later pool's range / the earlier's) with a line naming
 * the pools whose ADDs are refused. HEARTBEAT is `yes` (its heartbeat key exists), `expired` (none, but a daemon has served
 * the node: its settings key exists) or `never` (only the standalone plugin has served it: alive
 * or dead, it looks the same). LAST SEEN: `now` with a live heartbeat, else the node's last-seen
 * record (UTC, the node's own clock; written at most every 5 minutes while its daemon ran), `-`
 * without one. SOURCE: where the node's live daemon knows the pool from, as its
 * heartbeat says — `cni-config`, `requests` (a Multus NetworkAttachmentDefinition), `-` unknown
 * (no live heartbeat, or an older daemon). UNREADABLE: allocatable addresses of blocks whose value cannot be read.
 * PENDING: unheld addresses of `pendingRelease` blocks (a removed node's: not free until given back).
 * A range set with wanted addresses (not free either) gets a line under the table.
 */
export function poolStatusTable(s: PoolStatus): string {
  let out = `pool ${s.pool}: blocks /${s.blockSize} (IPv4), /${s.blockSize6} (IPv6)\n`;
  out += renderTable(
    ['SET', 'RANGES', 'SIZE', 'USED', 'RESERVED', 'UNREADABLE', 'PENDING', 'FREE', 'BLOCKS'],
    s.rangeSets.map((r) => [String(r.index), r.ranges, r.size, String(r.used), String(r.reserved), String(r.unreadable), String(r.pendingRelease), r.free, String(r.blocksClaimed)]),
  );
  for (const r of s.rangeSets) {
    if ((r.wanted ?? 0) > 0) out += `range set ${r.index}: ${r.wanted} wanted address${r.wanted === 1 ? '' : 'es'} (a live pod's address whose holder released it: not free; its node's daemon re-reserves it on its next pass)\n`;
  }
  out += renderTable(
    ['NODE', 'BLOCKS', 'CAPACITY', 'USED', 'BORROWED', 'RESERVED', 'HEARTBEAT', 'LAST SEEN', 'SOURCE'],
    s.nodes.map((n) => [n.node, String(n.blocks), String(n.capacity), String(n.used), String(n.borrowed), String(n.reserved), n.heartbeat, n.heartbeat === 'yes' ? 'now' : n.lastSeen === undefined ? '-' : seenText(n.lastSeen), n.source ?? '-']),
  );
  out += renderTable(
    ['BLOCK', 'SET', 'NODE', 'STATE', 'CAPACITY', 'USED', 'BORROWED', 'RESERVED'],
    s.blocks.map((b) => [b.cidr, String(b.rangeSet), b.node, b.state, String(b.capacity), String(b.used), String(b.borrowed), String(b.reserved)]),
  );
  if (s.corrupt.length > 0) {
    out += renderTable(['CORRUPT KEY', 'WHY'], s.corrupt.map((c) => [c.key, c.why]));
    out += `${s.corrupt.length} key${s.corrupt.length === 1 ? '' : 's'} cannot be read: not counted above, never allocated from or rewritten by ipwarden; left for an operator (docs/cluster.md "Corrupt keys")\n`;
  }
  if (s.overlaps.length > 0) {
    out += renderTable(['LATER POOL', 'EARLIER POOL', 'OVERLAPPING RANGES'], s.overlaps.map((o) => [o.later, o.earlier, o.ranges.map((r) => `${r.later} / ${r.earlier}`).join('; ')]));
    const refused = [...new Set(s.overlaps.map((o) => o.later))];
    out += `pool ${refused.join(', pool ')} overlap${refused.length === 1 ? 's' : ''} a pool created before it: its ADDs are refused until the overlap is gone (docs/cluster.md "Overlapping pools")\n`;
  }
  return out;
}

/** A last-seen time (ms since the epoch) as UTC ISO 8601 to the second, as `pool status` and `remove-node` print it. */
export function seenText(ms: number): string {
  return new Date(ms).toISOString().replace(/\.\d{3}Z$/, 'Z');
}

/**
 * Block keys (`10.80.0.64-26`) as CIDRs (`10.80.0.64/26`, the form `pool status` prints), sorted by
 * address (IPv4 before IPv6, numerically). A key that is not a block key is kept as it is.
 */
export function blockNames(keys: readonly string[]): string[] {
  const named = keys.map((k) => {
    const cidr = blockKeyCidr(k) ?? k;
    return { cidr, parsed: parseCIDR(cidr) };
  });
  return named
    .sort((a, b) => (a.parsed === null || b.parsed === null ? (a.cidr < b.cidr ? -1 : a.cidr > b.cidr ? 1 : 0) : compareIP(a.parsed.subnet.ip, b.parsed.subnet.ip) || a.parsed.subnet.prefix - b.parsed.subnet.prefix))
    .map((x) => x.cidr);
}

/**
 * Run a `pool` verb; with `--json`, an {@link AppError} it throws (a usage error, an etcd error, a
 * refusal) is printed as `{"version":1,"error":{"code","msg"}}` on stdout instead of text on
 * stderr; exit status 2 for a usage error, else 1. Other errors pass through.
 */
async function withJsonErrors(opts: PoolOptions, ctx: CliContext, f: () => Promise<number>): Promise<number> {
  try {
    return await f();
  } catch (e) {
    if (opts.json !== true || !(e instanceof AppError)) throw e;
    ctx.stdout(`${JSON.stringify({ version: 1, error: { code: e.code, msg: e.message } })}\n`);
    return e instanceof UsageError ? 2 : 1;
  }
}

/**
 * Write `text` to `file` atomically: a new temporary file beside it (O_CREAT|O_EXCL|O_NOFOLLOW,
 * mode 0644: a symlink planted at its name is never followed), fsync, rename(2) over `file` (which
 * replaces a symlink at `file` rather than following it). Throws `STORE_IO` naming the file; the
 * temporary file is removed on failure.
 */
export function writePage(file: string, text: string): void {
  const tmp = `${file}.tmp-${process.pid}-${randomBytes(8).toString('hex')}`;
  let fd = -1;
  try {
    fd = openSync(tmp, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW, 0o644);
    writeFileSync(fd, text);
    fsyncSync(fd);
    closeSync(fd);
    fd = -1;
    renameSync(tmp, file);
  } catch (e) {
    if (fd >= 0) closeSync(fd);
    rmSync(tmp, { force: true });
    throw new AppError('STORE_IO', `cannot write ${file}: ${e instanceof Error ? e.message : String(e)}`, { cause: e });
  }
}

/**
 * CLI action of `ipwarden pool status`; resolves to the exit status. `--html` prints the page of
 * `renderPoolStatusHtml` (src/cli/html.ts) instead of the table; with `--out FILE` the page goes
 * to FILE and stdout gets the table (or `--json`) as without `--html`.
 * @throws UsageError for `--out` without `--html`, an empty `--out`, or `--html --json` without `--out`
 */
export function runStatus(opts: PoolOptions, ctx: CliContext): Promise<number> {
  return withJsonErrors(opts, ctx, () => status(opts, ctx));
}

async function status(opts: PoolOptions, ctx: CliContext): Promise<number> {
  if (opts.out !== undefined && opts.html !== true) throw new UsageError('--out FILE goes with --html');
  if (opts.out === '') throw new UsageError('--out must not be empty');
  if (opts.html === true && opts.json === true && opts.out === undefined) throw new UsageError('--html and --json both print to stdout: give --out FILE for the page');
  const pool = poolFromFlags(opts);
  const kv = etcdFor(pool);
  let s: PoolStatus;
  try {
    s = await poolStatus(kv, pool.etcd.prefix, pool.name);
  } finally {
    await kv.close();
  }
  if (opts.html === true) {
    const { renderPoolStatusHtml } = await import('./html.ts');
    const page = renderPoolStatusHtml(s, { generatedAtMs: ctx.now(), source: `etcd ${pool.etcd.endpoints.join(',')} ${pool.etcd.prefix}` });
    if (opts.out === undefined) {
      ctx.stdout(page);
      return 0;
    }
    writePage(opts.out, page);
  }
  ctx.stdout(opts.json === true ? `${JSON.stringify(s)}\n` : poolStatusTable(s));
  return 0;
}

/**
 * CLI action of `ipwarden pool remove-node NODE`; resolves to the exit status. Step 1 prints what
 * it marked and, from the node's heartbeat state read before ({@link nodeHeartbeat}), what comes
 * next: `expired` — a warning that the node is treated as gone unless it returns within the
 * window; a forced `yes` — its daemon vetoes on its next beat; a forced `never` — it cannot veto
 * while idle. `--json` step 1: `{"version":1,"node","pendingRelease","heartbeat","windowSeconds"}`.
 */
export function runRemoveNode(node: string, opts: PoolOptions, ctx: CliContext): Promise<number> {
  return withJsonErrors(opts, ctx, () => removeNode(node, opts, ctx));
}

async function removeNode(node: string, opts: PoolOptions, ctx: CliContext): Promise<number> {
  if (!validNodeName(node)) throw new UsageError(`invalid node name ${JSON.stringify(node)}`);
  if (opts.finish === true && opts.force === true) throw new UsageError('--force applies to step 1 only: --finish never overrides a live heartbeat');
  const pool = poolFromFlags(opts);
  const kv = etcdFor(pool);
  try {
    // The operator acts as no node (a removal object, no allocator). A key that cannot be read is
    // skipped (never marked, released or deleted) and named on stderr.
    const op = new PoolRemoval({ kv, pool: pool.name, prefix: pool.etcd.prefix, onCorrupt: (c) => ctx.stderr(corruptLine(pool.name, c)) });
    if (opts.finish !== true) {
      const heartbeat = await nodeHeartbeat(kv, pool.etcd.prefix, pool.name, node);
      const seen = (await lastSeen(kv, pool.etcd.prefix, pool.name)).get(node);
      // The window is sized by the node's announced offline seconds (docs/cluster.md "Offline allocation").
      let window = REMOVAL_WINDOW_SECONDS;
      const marked = blockNames(await op.mark(node, { force: opts.force === true, checkNode: true, windowLease: (ttl) => kv.grantLease((window = ttl)) }));
      if (opts.json === true) ctx.stdout(`${JSON.stringify({ version: 1, node, pendingRelease: marked, heartbeat, windowSeconds: window, ...(seen === undefined ? {} : { lastSeen: seen }) })}\n`);
      else {
        ctx.stdout(`removal of ${node} begun (${op.removingKey(node)}); ${marked.length} block${marked.length === 1 ? '' : 's'} marked pendingRelease${marked.length > 0 ? `: ${marked.join(' ')}` : ''}\n`);
        if (seen !== undefined && heartbeat !== 'yes') ctx.stdout(`${node} was last seen at ${seenText(seen)} (its daemon's record, on its clock, written at most every 5 minutes)\n`);
        if (heartbeat === 'yes') {
          ctx.stdout(`${node} has a live heartbeat: its daemon vetoes this on its next beat (within about 10 s) unless it stops first\n`);
        } else {
          if (heartbeat === 'expired') {
            ctx.stdout(`warning: ${node}'s heartbeat has expired (no ${op.aliveKey(node)}; an ipwarden daemon served it before): if it does not come back within the veto window (${window} s), it is treated as gone and --finish releases its addresses; check first (kubectl get node ${node}; ipwarden pool leaks on ${node})\n`);
          } else {
            ctx.stdout(`warning: ${node} has never been served by an ipwarden daemon: it cannot veto while idle, so --finish after the veto window (${window} s) releases every address it holds, in use or not\n`);
          }
          ctx.stdout(`if ${node} comes back it vetoes this; once it is surely gone (and at least ${window} s from now), run again with --finish\n`);
        }
      }
      return 0;
    }
    const f = await op.finish(node);
    const r = { released: f.released, deletedBlocks: blockNames(f.deletedBlocks), keptBlocks: blockNames(f.keptBlocks) };
    if (opts.json === true) ctx.stdout(`${JSON.stringify({ version: 1, node, ...r })}\n`);
    else {
      ctx.stdout(`released ${r.released.length} address${r.released.length === 1 ? '' : 'es'} of ${node}; deleted ${r.deletedBlocks.length} block(s)${r.deletedBlocks.length > 0 ? `: ${r.deletedBlocks.join(' ')}` : ''}\n`);
      if (r.keptBlocks.length > 0) ctx.stdout(`kept ${r.keptBlocks.length} block(s) (vetoed, not marked, or holding other nodes' addresses): ${r.keptBlocks.join(' ')}\n`);
    }
    return 0;
  } catch (e) {
    // A live heartbeat, a veto, no step 1: the node may be alive — refuse (nothing more released).
    if (e instanceof RemovalRefusedError && opts.json !== true) {
      ctx.stderr(`ipwarden: ${e.message}\n`);
      return 1;
    }
    throw e;
  } finally {
    await kv.close();
  }
}

/**
 * The lines of `pool leaks` about READY sandboxes' addresses the pool does not hold for them
 * (none: empty). `missing`: the node's daemon re-reserves it; `conflict`: another holder has it.
 */
export function podAddressLines(f: readonly PoolPodAddressFinding[]): string {
  if (f.length === 0) return '';
  return (
    renderTable(['SANDBOX', 'ADDRESS', 'POOL SAYS', 'REASON'], f.map((x) => [shortId(x.sandbox), x.ip, x.state, x.reason])) +
    `${f.length} address${f.length === 1 ? '' : 'es'} of ready sandboxes not held for them by the pool (${f.filter((x) => x.state === 'missing').length} missing, ${f.filter((x) => x.state === 'conflict').length} conflict)\n`
  );
}

/** The human report of `pool leaks`. */
export function poolLeaksTable(node: string, verdicts: readonly PoolLeakVerdict[]): string {
  const rows = verdicts.map((v) => [shortId(v.containerId), v.ifname, v.ips.join(','), `${Math.round(v.ageSeconds)}s`, v.verdict, v.reason]);
  const leaked = verdicts.filter((v) => v.verdict === 'leaked').length;
  return `${renderTable(['CONTAINER', 'IFNAME', 'ADDRESSES', 'AGE', 'VERDICT', 'REASON'], rows)}node ${node}: ${verdicts.length} attachment${verdicts.length === 1 ? '' : 's'}, ${leaked} leak candidate${leaked === 1 ? '' : 's'} (nothing released)\n`;
}

/**
 * CLI action of `ipwarden pool leaks` (run on the node itself: the kernel evidence is this
 * host's): the node's handles in the pool classified by the evidence rules (src/pool/leaks.ts)
 * — the runtime's sandbox list first, then the kernel, as the node-local reconciler does. Lists
 * only. Exit status: 0; 1 when the runtime could not be asked or the kernel evidence is incomplete
 * (the report is still printed, every verdict `unknown`).
 */
export function runLeaks(opts: PoolOptions, ctx: CliContext): Promise<number> {
  return withJsonErrors(opts, ctx, () => leaks(opts, ctx));
}

async function leaks(opts: PoolOptions, ctx: CliContext): Promise<number> {
  const pool = poolFromFlags(opts);
  const graceSeconds = parseGrace(opts.grace ?? DEFAULT_GRACE);
  const node = opts.node ?? resolveNodeName(pool, ctx.env);
  if (!validNodeName(node)) throw new UsageError(`invalid node name ${JSON.stringify(node)}`);
  const kv = etcdFor(pool);
  try {
    const keys = { prefix: pool.etcd.prefix, pool: pool.name };
    // etcd's revision R first, then the runtime, then the kernel (takeSnapshot), then the handles:
    // a handle created after R did not exist when the runtime was asked (its ADD may be in
    // flight): in grace, never a candidate — decided by revisions, not by a clock.
    const revision = await currentRevision(kv);
    // With the READY sandboxes' pod IPs, as the daemon's pass asks (one planner: src/reconcile/pool-plan.ts).
    const snap = await takeSnapshot({ ...(opts.runtimeEndpoint === undefined ? {} : { runtimeEndpoint: opts.runtimeEndpoint }), podIPs: true, warnOtherRuntimes: false }, ctx);
    const host = hostname();
    const listed = nodeHandles(await kv.list(handlesPrefix(keys)), keys, node, host);
    for (const c of listed.corrupt) ctx.stderr(`ipwarden: ${c.message} (never released)\n`);
    // Handles another host wrote under this node name cannot be judged by this host's runtime
    // and kernel (review B1): listed as unknown, never as leaked.
    if (listed.foreign.length > 0) ctx.stderr(`ipwarden: ${listed.foreign.length} handle(s) of node ${node} were written on other hosts than ${host}: listed as unknown — two hosts under one node name?\n`);
    const handles = listed.handles;
    const plan = planPoolHandles(snap, handles, revision, graceSeconds);
    const verdicts = plan.verdicts;
    for (const h of listed.foreign) {
      verdicts.push({ containerId: h.containerId, ifname: h.ifname, ips: h.value.ips.map((i) => i.ip), ageSeconds: (snap.snapshotAtMs - h.value.at) / 1000, verdict: 'unknown', reason: `written on host ${h.value.host ?? '(none recorded)'}, not ${host}: this host's runtime and kernel cannot judge it` });
    }
    // Live pods' addresses the pool does not hold (an etcd restored from an older snapshot).
    const podAddresses = snap.podIPs === null ? [] : await checkLivePods({ kv, ...keys, node }, snap.podIPs, [...handles, ...listed.foreign]);
    ctx.stdout(
      opts.json === true
        ? `${JSON.stringify({ version: 1, pool: pool.name, node, runtime: snap.runtime, evidence: { incomplete: snap.evidence.incomplete }, graceSeconds, revision, handles: verdicts, podAddresses })}\n`
        : poolLeaksTable(node, verdicts) + podAddressLines(podAddresses),
    );
    // A READY sandbox's addresses are unknown: as in the daemon's pass, nothing is a candidate (exit 1 below).
    for (const f of snap.podIPFailures) ctx.stderr(`ipwarden: ${f}: its addresses were not checked; no leaked verdict is a release candidate (the daemon releases nothing while this lasts)\n`);
    if (podAddresses.some((f) => f.state === 'conflict')) {
      ctx.stderr(`ipwarden: a live pod's address is held by another holder in pool ${pool.name} (a duplicate address): see above\n`);
      return 1;
    }
    if (snap.runtime.error !== undefined) {
      ctx.stderr(`ipwarden: runtime not reachable: ${snap.runtime.error}; no verdict is possible\n`);
      return 1;
    }
    if (snap.evidence.incomplete !== null) {
      ctx.stderr(`ipwarden: kernel evidence incomplete (${snap.evidence.incomplete}); no verdict is possible\n`);
      return 1;
    }
    if (!plan.candidates) return 1;
    return 0;
  } finally {
    await kv.close();
  }
}
