/**
 * Live pods' addresses that the pool lost (docs/cluster.md "Re-reserving live pods' addresses",
 * calico#4374): after etcd is restored from an older snapshot, the allocations and handles made
 * after the snapshot are gone while their pods still run, so another node's next ADD can hand out
 * a running pod's address. The node-local reconciler's rule for host-local files (field report
 * BR-13, src/reconcile/unreserved.ts) applied to a pool: for each pod IP a READY sandbox of this
 * node reports (CRI PodSandboxStatus) that lies in the pool's ranges and has no allocation, the
 * allocation and its handle are created again — one revision-checked transaction per address.
 *
 * - {@link podAddress} (pure) places an address in the pool: its range set, block and ordinal.
 * - {@link checkPodAddress} (reads only; `pool leaks`) says whether the pool holds it for the sandbox.
 * - {@link reReserve} (the daemon's pool pass) writes it back when the address is free in its
 *   block. Never steals: an address that another holder has now (another container's allocation,
 *   another node's reserve entry, another handle of the sandbox's key) is a `conflict` to report
 *   loudly, never rewritten.
 *
 * The handle is `handles/<sandbox>/<ifname>` with `ifname` the pod's primary interface (`eth0`:
 * PodSandboxStatus reports only the addresses of the pod's default network, which kubelet
 * attaches as `eth0`) and `network` the caller's (the CNI network of the pool on this node).
 * The transaction compares: the handle key absent, the block's `mod_revision` as read (or, for a
 * block the restore lost, the block and this node's affinity absent: a claim of that one block),
 * and `removing/<node>` absent (as every write of the node). A failed compare re-reads and
 * decides again ({@link runTxn}), up to {@link MAX_ATTEMPTS} times.
 */
import { AppError } from '../common/errors.ts';
import { formatIP, maskIP, parseIP, type Subnet } from '../common/ip.ts';
import { rangeFor } from '../ipam/range.ts';
import type { Range, RangeSet } from '../ipam/types.ts';
import type { KV } from '../store/kv.ts';
import { MAX_ATTEMPTS } from './allocator.ts';
import { affinityValue, blockKeyCidr, blockKeyText, CorruptValueError, decodeBlock, decodeHandle, encodeBlock, encodeHandle, keysOf, type BlockValue, type HandleValue } from './model.ts';
import { runTxn } from './txn.ts';
import { blockAddresses, blockCidrText, blockPrefix, isAllocatable, type BlockSizes } from './blocks.ts';
import type { PoolKeys } from './model.ts';

/** The interface name of a pod's default network (kubelet's `eth0`): the key of a re-created handle. */
export const POD_IFNAME = 'eth0';

/** Where an address lies in a pool. */
export interface PodAddress {
  /** Canonical IP text. */
  readonly ip: string;
  readonly rangeSet: number;
  /** The block's key name (`10.80.0.64-26`). */
  readonly block: string;
  readonly cidr: Subnet;
  readonly ordinal: number;
}

/**
 * Place `ipText` in the pool of `rangeSets` cut into blocks of `sizes`, or null when it is not an
 * allocatable address of the pool (outside every range set, or a gateway): then it is another
 * IPAM's, never this pool's to re-reserve. Pure.
 */
export function podAddress(ipText: string, rangeSets: readonly RangeSet[], sizes: BlockSizes): PodAddress | null {
  const ip = parseIP(ipText.trim());
  if (ip === null) return null;
  for (let s = 0; s < rangeSets.length; s++) {
    const rs = rangeSets[s] as RangeSet;
    const k = rangeFor(rs, ip);
    if (k < 0) continue;
    const prefix = blockPrefix(rs[k] as Range, sizes);
    const cidr: Subnet = { ip: maskIP(ip, prefix), prefix };
    const ordinal = Number(ip.value - cidr.ip.value);
    if (!isAllocatable(rs, cidr, ordinal)) return null;
    return { ip: formatIP(ip), rangeSet: s, block: blockKeyText(cidr), cidr, ordinal };
  }
  return null;
}

/** What the pool holds at a live pod's address. */
export type PodAddressState =
  /** The sandbox's own allocation (any interface): nothing to do. */
  | { readonly state: 'held' }
  /** No allocation: the address is free in its block (or its block is gone). `claim`: the block key is absent. */
  | { readonly state: 'missing'; readonly claim: boolean }
  /** Another holder has it now (a duplicate address): `holder` says who. Never rewritten. */
  | { readonly state: 'conflict'; readonly holder: string }
  /** It cannot be decided or written (a block that cannot be read, a tombstone of the sandbox's key): `why`. */
  | { readonly state: 'skipped'; readonly why: string };

interface Read {
  readonly decided: PodAddressState;
  readonly blockKey: string;
  readonly block: { readonly rev: string; readonly value: BlockValue } | null;
}

async function readState(kv: KV, k: PoolKeys, sandbox: string, a: PodAddress): Promise<Read> {
  const base = `${k.prefix}/pools/${k.pool}`;
  const blockKey = `${base}/blocks/${a.block}`;
  const e = await kv.get(blockKey);
  if (e === null) return { decided: { state: 'missing', claim: true }, blockKey, block: null };
  let value: BlockValue;
  try {
    value = decodeBlock(e, blockKeyCidr(a.block) as string);
  } catch (err) {
    if (!(err instanceof CorruptValueError)) throw err;
    return { decided: { state: 'skipped', why: `${err.message}: left for an operator` }, blockKey, block: null };
  }
  const x = value.allocs[String(a.ordinal)];
  if (x === undefined) return { decided: { state: 'missing', claim: false }, blockKey, block: { rev: e.modRevision, value } };
  if (x.reserve !== true && x.id === sandbox) return { decided: { state: 'held' }, blockKey, block: null };
  const holder = x.reserve === true ? `a reserve entry of node ${x.node} (offline allocation)` : `container ${x.id}/${x.ifname} of node ${x.node} (seq ${x.seq})`;
  return { decided: { state: 'conflict', holder }, blockKey, block: null };
}

/**
 * What the pool holds at address `a` of READY sandbox `sandbox` (two reads at most: the block, and
 * — when the address is missing — the sandbox's handle key, which may hold other addresses or a
 * tombstone). Reads only. Errors: the KV's (STORE_UNAVAILABLE when etcd cannot be asked).
 */
export async function checkPodAddress(kv: KV, k: PoolKeys, sandbox: string, a: PodAddress): Promise<PodAddressState> {
  const r = await readState(kv, k, sandbox, a);
  if (r.decided.state !== 'missing') return r.decided;
  const h = await handleState(kv, k, sandbox);
  return h === null ? r.decided : h.decided;
}

/** The sandbox's handle at {@link POD_IFNAME}: null when absent; else what it means for a re-reservation. */
async function handleState(kv: KV, k: PoolKeys, sandbox: string): Promise<{ decided: PodAddressState } | null> {
  const e = await kv.get(`${k.prefix}/pools/${k.pool}/handles/${sandbox}/${POD_IFNAME}`);
  if (e === null) return null;
  let v: HandleValue;
  try {
    v = decodeHandle(e);
  } catch (err) {
    if (!(err instanceof CorruptValueError)) throw err;
    return { decided: { state: 'skipped', why: `${err.message}: left for an operator` } };
  }
  if (v.deleted === true) return { decided: { state: 'skipped', why: `a DEL of ${sandbox}/${POD_IFNAME} left a tombstone (${e.key}): not re-reserved while it lives` } };
  return { decided: { state: 'conflict', holder: `the handle ${e.key} of node ${v.node}, which names ${v.ips.map((x) => x.ip).join(', ') || 'no address'}` } };
}

/** The answer of {@link reReserve}. */
export type ReReserveOutcome =
  | { readonly state: 're-reserved'; readonly ip: string; readonly block: string; readonly claimed: boolean; readonly seq: number; readonly revision: string }
  | Exclude<PodAddressState, { state: 'missing' }>;

/** Who re-reserves: the node and its host, the network recorded in the handle, the clock. */
export interface ReReserveScope extends PoolKeys {
  readonly kv: KV;
  /** This node's name in the pool. */
  readonly node: string;
  /** This machine's host name (recorded in the handle, as an ADD records it). */
  readonly host: string;
  /** The CNI network name the handle records (`"network"`). */
  readonly network: string;
  /** Milliseconds since the epoch (the allocation's and handle's informational `at`). */
  readonly now: () => number;
}

/**
 * Re-create the allocation of address `a` for READY sandbox `sandbox` and its handle
 * (`handles/<sandbox>/eth0`), in one transaction (see the module comment for its compares), when
 * the address is free in its block. A block the snapshot lacks is claimed for this node (that
 * block only). Answers what was found instead when the address is held (`held`, `conflict`) or
 * cannot be written (`skipped`: a block that cannot be read, a tombstone, a removal of the node
 * begun — its heartbeat vetoes it; the next pass decides again). Nothing is written but the one
 * transaction.
 * @throws AppError STORE_UNAVAILABLE (CNI 11) when etcd cannot be asked; STORE_CONFLICT after
 *   {@link MAX_ATTEMPTS} lost races.
 */
export async function reReserve(s: ReReserveScope, sandbox: string, a: PodAddress): Promise<ReReserveOutcome> {
  const keys = keysOf(s);
  const handleKey = keys.handle(sandbox, POD_IFNAME);
  const removing = keys.removing(s.node);
  const { value } = await runTxn<ReReserveOutcome>(
    s.kv,
    async (tx) => {
      const r = await readState(s.kv, s, sandbox, a);
      if (r.decided.state !== 'missing') return r.decided;
      const h = await handleState(s.kv, s, sandbox);
      if (h !== null) return h.decided as ReReserveOutcome;
      const at = s.now();
      tx.expect(handleKey, null);
      tx.expect(removing, null);
      let block: BlockValue;
      if (r.block === null) {
        const affinity = keys.affinity(s.node, a.block);
        block = { v: 1, cidr: blockCidrText(a.cidr), rangeSet: a.rangeSet, node: s.node, state: 'owned', seq: 0, next: 0, allocs: {} };
        tx.expect(r.blockKey, null);
        tx.expect(affinity, null);
        tx.put(affinity, affinityValue(a.rangeSet));
      } else {
        block = structuredClone(r.block.value);
        tx.expect(r.blockKey, r.block.rev);
      }
      block.seq += 1;
      block.allocs[String(a.ordinal)] = { id: sandbox, ifname: POD_IFNAME, node: s.node, seq: block.seq, at };
      // Round robin moves past it, as if an ADD had just handed it out.
      block.next = (a.ordinal + 1) % Number(blockAddresses(a.cidr.ip.family, a.cidr.prefix));
      const handle: HandleValue = { v: 1, node: s.node, network: s.network, at, ips: [{ ip: a.ip, block: a.block, ordinal: a.ordinal, seq: block.seq, rangeSet: a.rangeSet }], host: s.host };
      tx.put(r.blockKey, encodeBlock(block));
      tx.put(handleKey, encodeHandle(handle));
      const done: { state: 're-reserved'; ip: string; block: string; claimed: boolean; seq: number; revision: string } = { state: 're-reserved', ip: a.ip, block: a.block, claimed: r.block === null, seq: block.seq, revision: '' };
      tx.onCommit((rev) => (done.revision = rev));
      return done;
    },
    {
      attempts: MAX_ATTEMPTS,
      lost: async () =>
        (await s.kv.get(removing)) !== null ? { stop: { state: 'skipped', why: `a removal of node ${s.node} is begun (${removing}): nothing written (its heartbeat vetoes it; the next pass decides again)` } } : undefined,
      exhausted: () => {
        throw new AppError('STORE_CONFLICT', `pool ${s.pool}: ${MAX_ATTEMPTS} re-reservations of ${a.ip} for ${sandbox} lost to concurrent writers; try again`);
      },
    },
  );
  return value;
}
