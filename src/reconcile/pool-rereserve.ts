/**
 * The pool pass's re-reservation of live pods' addresses (docs/cluster.md "Re-reserving live
 * pods' addresses"; the node-local rule is field report BR-13, src/reconcile/unreserved.ts): for
 * each pod IP a READY sandbox of this node reports that lies in the pool's ranges and that none of
 * the node's handles holds for that sandbox, ask the pool ({@link reReserve}): free in its block →
 * the allocation and handle are written back in one revision-checked transaction; another holder
 * → a conflict, reported (kind `conflict`), never taken — and the sandbox's want of the address
 * recorded in its block (src/pool/wanted.ts), so that the holder's release does not make it free;
 * the node's wants whose sandbox is no longer READY with the address are dropped. The decisions
 * are src/pool/rereserve.ts; this is the per-pool loop and the report.
 */
import { checkPodAddress, decodeMeta, dropStaleWants, podAddress, reReserve, type PodAddress, type PoolHandleEntry, type PoolKeys } from '../pool/index.ts';
import type { KV } from '../store/kv.ts';
import type { SandboxPodIPs } from './unreserved.ts';
import { describeError } from './options.ts';

/** The pool and node (src/reconcile/pool-pass.ts `PoolTarget` is one). */
export interface ReReserveTarget extends PoolKeys {
  readonly kv: KV;
  readonly node: string;
  /** The node's CNI networks naming the pool; the first is recorded in the handle (default: the pool's name). */
  readonly networks?: readonly string[];
}

/** A finding or failure, as the pass reports it (`PoolPassError`). */
export interface ReReserveError {
  readonly kind: string;
  readonly pool: string;
  readonly message: string;
}

/** One address written back. */
export interface PoolReReserved {
  readonly pool: string;
  readonly node: string;
  readonly network: string;
  /** The READY sandbox (full ID) whose address it is; its handle is `handles/<sandbox>/eth0`. */
  readonly sandbox: string;
  readonly ip: string;
  /** The block (`10.80.0.64-26`); `claimed`: the block key was gone too and was claimed for this node. */
  readonly block: string;
  readonly claimed: boolean;
  /** The transaction's revision. */
  readonly revision: string;
  /** The sandbox wanted the address (src/pool/wanted.ts): the want was dropped in the same transaction. */
  readonly wanted: boolean;
}

/** A want of this node written (the address is another holder's) or dropped (its sandbox is no longer READY with it). */
export interface PoolWantEvent {
  readonly event: 'written' | 'dropped';
  readonly pool: string;
  readonly node: string;
  readonly sandbox: string;
  readonly ip: string;
  readonly block: string;
}

/**
 * Re-reserve the addresses of READY sandboxes (`podIPs`) that `t`'s pool lacks. `handles`: the
 * node's handles as the pass read them (a sandbox whose handle names the address is skipped without
 * a read). One read of `meta` when some pod IP is not held by those handles, then per such address
 * in the pool's ranges the reads and transaction of {@link reReserve}. Never throws: etcd errors,
 * conflicts and skips are in `errors` (kinds `etcd`, `conflict`, `rereserve`, `corrupt`); the
 * wants written and dropped in `wants`. `complete`: the runtime answered and every READY sandbox's
 * status was read (`podIPs` is whole) and the kernel evidence is complete — only then are the
 * node's stale wants dropped (one keys-only prefix read of `wanted/<node>/` per pass, then a read
 * of the block of each want), never one whose address is `configured` in a network namespace.
 */
export async function reReserveLivePods(
  t: ReReserveTarget,
  podIPs: readonly SandboxPodIPs[],
  handles: readonly PoolHandleEntry[],
  host: string,
  now: () => number,
  complete = false,
  configured: (ip: string) => boolean = () => false,
): Promise<{ reReserved: PoolReReserved[]; errors: ReReserveError[]; wants: PoolWantEvent[] }> {
  const reReserved: PoolReReserved[] = [];
  const errors: ReReserveError[] = [];
  const wants: PoolWantEvent[] = [];
  if (complete) {
    // The node's wants whose sandbox is no longer READY with the address: dropped (only its own).
    try {
      const ready = new Map(podIPs.map((p) => [p.sandbox, p.ips] as const));
      for (const d of await dropStaleWants(t.kv, t, t.node, ready, configured)) {
        if (d.outcome === 'dropped') wants.push({ event: 'dropped', pool: t.pool, node: t.node, sandbox: d.want.sandbox as string, ip: d.want.ip, block: d.want.block });
        else if (d.outcome === 'skipped') errors.push({ kind: d.corrupt !== undefined ? 'corrupt' : 'rereserve', pool: t.pool, message: `pool ${t.pool}: the want of ${d.want.ip} (block ${d.want.block}) of node ${t.node} was not dropped: ${d.why ?? 'unknown'}` });
      }
    } catch (e) {
      errors.push({ kind: 'etcd', pool: t.pool, message: `pool ${t.pool}: the node's wants not checked: ${describeError(e)}` });
    }
  }
  const held = new Set<string>();
  for (const h of handles) for (const x of h.value.ips) held.add(`${h.containerId}\u0000${x.ip}`);
  const todo = podIPs.flatMap((p) => p.ips.map((ip) => ({ sandbox: p.sandbox, ip: ip.trim() })));
  if (todo.every((x) => held.has(`${x.sandbox}\u0000${x.ip}`))) return { reReserved, errors, wants };
  let meta: ReturnType<typeof decodeMeta>;
  try {
    const e = await t.kv.get(`${t.prefix}/pools/${t.pool}/meta`);
    if (e === null) return { reReserved, errors, wants }; // a pool never used holds nothing to re-reserve into
    meta = decodeMeta(e);
  } catch (e) {
    errors.push({ kind: 'etcd', pool: t.pool, message: `pool ${t.pool}: live pods' addresses not checked: ${describeError(e)}` });
    return { reReserved, errors, wants };
  }
  const sizes = { blockSize4: meta.blockSize, blockSize6: meta.blockSize6 };
  const network = t.networks?.[0] ?? t.pool;
  const seen = new Set<string>();
  for (const x of todo) {
    const a: PodAddress | null = podAddress(x.ip, meta.rangeSets, sizes);
    if (a === null) continue; // not this pool's address (another IPAM's, or a gateway)
    const key = `${x.sandbox}\u0000${a.ip}`;
    if (held.has(key) || seen.has(key)) continue;
    seen.add(key);
    try {
      const r = await reReserve({ kv: t.kv, prefix: t.prefix, pool: t.pool, node: t.node, host, network, now }, x.sandbox, a);
      if (r.state === 're-reserved') reReserved.push({ pool: t.pool, node: t.node, network, sandbox: x.sandbox, ip: a.ip, block: a.block, claimed: r.claimed, revision: r.revision, wanted: r.wanted });
      else if (r.state === 'conflict') {
        if (r.wanted === 'written') wants.push({ event: 'written', pool: t.pool, node: t.node, sandbox: x.sandbox, ip: a.ip, block: a.block });
        errors.push({ kind: 'conflict', pool: t.pool, message: `pool ${t.pool}: address ${a.ip} of ready sandbox ${x.sandbox} is held by ${r.holder}: a duplicate address — not re-reserved, nothing taken from the holder${wantText(r.wanted)}` });
      }
      else if (r.state === 'skipped') errors.push({ kind: 'rereserve', pool: t.pool, message: `pool ${t.pool}: address ${a.ip} of ready sandbox ${x.sandbox} is not held by the pool and was not re-reserved: ${r.why}` });
    } catch (e) {
      errors.push({ kind: 'etcd', pool: t.pool, message: `pool ${t.pool}: re-reserving ${a.ip} of ready sandbox ${x.sandbox}: ${describeError(e)}` });
    }
  }
  return { reReserved, errors, wants };
}

/** What a conflict's message adds about the want of the address (src/pool/wanted.ts). */
function wantText(w: 'mine' | 'other' | 'written' | undefined): string {
  if (w === 'mine' || w === 'written') return '; the address is wanted by this sandbox: no other pod gets it, and it is re-reserved when its holder releases it';
  if (w === 'other') return '; another sandbox already wants the address (at most one want per address)';
  return '';
}

/** A live pod's address the pool does not hold for it (`pool leaks`). */
export interface PoolPodAddressFinding {
  readonly sandbox: string;
  readonly ip: string;
  /** `missing`: free in the pool (the daemon's pass re-reserves it); `conflict`: another holder has it; `skipped`: cannot be decided (why in `reason`). */
  readonly state: 'missing' | 'conflict' | 'skipped';
  readonly reason: string;
}

/**
 * What `pool leaks` reports about live pods' addresses: for each pod IP of a READY sandbox in the
 * pool's ranges that `handles` (the node's) do not hold for it, what the pool holds there
 * (src/pool/rereserve.ts `checkPodAddress`; reads only). Sorted as the runtime listed them.
 * @throws the KV's errors (STORE_UNAVAILABLE when etcd cannot be asked), STORE_CORRUPT for a `meta` that cannot be read
 */
export async function checkLivePods(t: ReReserveTarget, podIPs: readonly SandboxPodIPs[], handles: readonly PoolHandleEntry[]): Promise<PoolPodAddressFinding[]> {
  const held = new Set<string>();
  for (const h of handles) for (const x of h.value.ips) held.add(`${h.containerId}\u0000${x.ip}`);
  const todo = podIPs.flatMap((p) => p.ips.map((ip) => ({ sandbox: p.sandbox, ip: ip.trim() }))).filter((x) => !held.has(`${x.sandbox}\u0000${x.ip}`));
  if (todo.length === 0) return [];
  const e = await t.kv.get(`${t.prefix}/pools/${t.pool}/meta`);
  if (e === null) return [];
  const meta = decodeMeta(e);
  const sizes = { blockSize4: meta.blockSize, blockSize6: meta.blockSize6 };
  const out: PoolPodAddressFinding[] = [];
  const seen = new Set<string>();
  for (const x of todo) {
    const a = podAddress(x.ip, meta.rangeSets, sizes);
    if (a === null || held.has(`${x.sandbox}\u0000${a.ip}`) || seen.has(`${x.sandbox}\u0000${a.ip}`)) continue;
    seen.add(`${x.sandbox}\u0000${a.ip}`);
    const r = await checkPodAddress(t.kv, t, x.sandbox, a, t.node);
    if (r.state === 'missing') out.push({ sandbox: x.sandbox, ip: a.ip, state: 'missing', reason: `no allocation or handle in the pool (${r.claim ? 'its block is gone too' : `free in block ${a.block}`}): the node's daemon re-reserves it on its next pass` });
    else if (r.state === 'conflict') out.push({ sandbox: x.sandbox, ip: a.ip, state: 'conflict', reason: `held by ${r.holder}: a duplicate address${wantText(r.wanted)}` });
    else if (r.state === 'skipped') out.push({ sandbox: x.sandbox, ip: a.ip, state: 'skipped', reason: r.why });
  }
  return out;
}
