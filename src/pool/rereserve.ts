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
 * - Wants (src/pool/wanted.ts): a `conflict` with another holder's allocation records, in the same
 *   kind of transaction, that the sandbox wants the address ({@link reReserve}); once the holder
 *   released it, the next pass re-reserves it and drops the want together. {@link dropStaleWants}
 *   drops the node's wants whose sandbox is no longer READY with the address; {@link dropWants}
 *   is also `pool remove-node --finish`'s.
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
import type { KV, KVCompare } from '../store/kv.ts';
import { MAX_ATTEMPTS } from './allocator.ts';
import { affinityValue, blockKeyCidr, blockKeyText, CorruptValueError, decodeBlock, decodeHandle, encodeBlock, encodeHandle, keysOf, type BlockValue, type HandleValue } from './model.ts';
import { runTxn } from './txn.ts';
import { blockAddresses, blockCidrText, blockPrefix, isAllocatable, ordinalIP, type BlockSizes } from './blocks.ts';
import type { PoolKeys } from './model.ts';
import { parseCIDR } from '../common/ip.ts';
import { holdsNothing, wantIndexValue, wantOf, withoutWant, withWant } from './wanted.ts';
import { giveBackEmptied } from './stuck-block.ts';
import { CNI_NAME_RE } from '../common/names.ts';

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
  /**
   * Another holder has it now (a duplicate address): `holder` says who. Never rewritten.
   * `wanted` (absent: no want of the address): `mine` — this sandbox wants it (re-reserved once
   * the holder releases it); `other` — another sandbox's want (the duplicate is reported, no second
   * want is written); `written` — {@link reReserve} recorded this sandbox's want just now.
   */
  | { readonly state: 'conflict'; readonly holder: string; readonly wanted?: 'mine' | 'other' | 'written' }
  /** It cannot be decided or written (a block that cannot be read, a tombstone of the sandbox's key): `why`. */
  | { readonly state: 'skipped'; readonly why: string };

interface Read {
  readonly decided: PodAddressState;
  readonly blockKey: string;
  readonly block: { readonly rev: string; readonly value: BlockValue } | null;
  /** The address is wanted by this sandbox (of `node`). */
  readonly mine: boolean;
}

async function readState(kv: KV, k: PoolKeys, sandbox: string, a: PodAddress, node: string | null): Promise<Read> {
  const base = `${k.prefix}/pools/${k.pool}`;
  const blockKey = `${base}/blocks/${a.block}`;
  const e = await kv.get(blockKey);
  if (e === null) return { decided: { state: 'missing', claim: true }, blockKey, block: null, mine: false };
  let value: BlockValue;
  try {
    value = decodeBlock(e, blockKeyCidr(a.block) as string);
  } catch (err) {
    if (!(err instanceof CorruptValueError)) throw err;
    return { decided: { state: 'skipped', why: `${err.message}: left for an operator` }, blockKey, block: null, mine: false };
  }
  const x = value.allocs[String(a.ordinal)];
  const w = wantOf(value, a.ordinal);
  const mine = w !== null && w.sandbox === sandbox && (node === null || w.node === node);
  const block = { rev: e.modRevision, value };
  if (x === undefined) {
    if (w !== null && !mine) return { decided: { state: 'conflict', holder: `the want of ready sandbox ${w.sandbox} of node ${w.node} (its node re-reserves the address on its next pass)`, wanted: 'other' }, blockKey, block, mine };
    return { decided: { state: 'missing', claim: false }, blockKey, block, mine };
  }
  if (x.reserve !== true && x.id === sandbox) return { decided: { state: 'held' }, blockKey, block: null, mine };
  const holder = x.reserve === true ? `a reserve entry of node ${x.node} (offline allocation)` : `container ${x.id}/${x.ifname} of node ${x.node} (seq ${x.seq})`;
  return { decided: { state: 'conflict', holder, ...(w === null ? {} : { wanted: mine ? ('mine' as const) : ('other' as const) }) }, blockKey, block, mine };
}

/**
 * What the pool holds at address `a` of READY sandbox `sandbox` (two reads at most: the block, and
 * — when the address is missing — the sandbox's handle key, which may hold other addresses or a
 * tombstone). `node`: the sandbox's node (a want is this sandbox's when it names both; null: the
 * sandbox alone). Reads only. Errors: the KV's (STORE_UNAVAILABLE when etcd cannot be asked).
 */
export async function checkPodAddress(kv: KV, k: PoolKeys, sandbox: string, a: PodAddress, node: string | null = null): Promise<PodAddressState> {
  const r = await readState(kv, k, sandbox, a, node);
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

/** `text` (an address as a runtime reports it) in canonical form (`formatIP(parseIP(…))`), or itself trimmed when it is not an address. */
function canonicalIP(text: string): string {
  const ip = parseIP(text.trim());
  return ip === null ? text.trim() : formatIP(ip);
}

/** The answer of {@link reReserve}. */
export type ReReserveOutcome =
  | { readonly state: 're-reserved'; readonly ip: string; readonly block: string; readonly claimed: boolean; readonly seq: number; readonly revision: string; readonly wanted: boolean }
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
 *
 * Wants (src/pool/wanted.ts): when another container's allocation or a reserve entry holds the
 * address, no want of it exists and the sandbox has no handle or tombstone at its key, the
 * transaction records the sandbox's want instead — the block's `wanted` entry (this node, the
 * sandbox, `now`) and the index key `wanted/<node>/<block>/<ordinal>`, comparing the block's
 * `mod_revision`, the sandbox's handle absent and `removing/<node>` absent — and the answer is the `conflict` with `wanted:
 * 'written'`. When the address is free and wanted by this sandbox, the re-reservation drops the
 * want and its index key in its transaction (`wanted: true` in the answer). Another sandbox's want
 * is a `conflict` (`wanted: 'other'`): at most one want per address. A sandbox ID that is not a
 * valid CNI container ID (libcni `cniValidNameChars`) is `skipped`, nothing read or written.
 * @throws AppError STORE_UNAVAILABLE (CNI 11) when etcd cannot be asked; STORE_CONFLICT after
 *   {@link MAX_ATTEMPTS} lost races.
 */
export async function reReserve(s: ReReserveScope, sandbox: string, a: PodAddress): Promise<ReReserveOutcome> {
  // The strict block codec reads a want's or an allocation's sandbox as a container ID: another
  // one written would make the block unreadable for every node.
  if (!CNI_NAME_RE.test(sandbox)) return { state: 'skipped', why: `sandbox ID ${JSON.stringify(sandbox)} is not a valid CNI container ID: nothing written` };
  const keys = keysOf(s);
  const handleKey = keys.handle(sandbox, POD_IFNAME);
  const removing = keys.removing(s.node);
  const { value } = await runTxn<ReReserveOutcome>(
    s.kv,
    async (tx) => {
      const r = await readState(s.kv, s, sandbox, a, s.node);
      if (r.decided.state === 'conflict' && r.decided.wanted === undefined && r.block !== null) {
        // Another holder has it and nobody wants it yet: record that this sandbox does, so that
        // the holder's release leaves it unallocatable until this node's next pass.
        if ((await handleState(s.kv, s, sandbox)) !== null) return r.decided;
        const at = s.now();
        tx.expect(r.blockKey, r.block.rev);
        tx.expect(handleKey, null); // read absent above: a handle written meanwhile (an ADD of the sandbox) makes it decide again
        tx.expect(removing, null);
        tx.put(r.blockKey, encodeBlock(withWant(r.block.value, a.ordinal, { sandbox, node: s.node, at })));
        tx.put(keys.want(s.node, a.block, a.ordinal), wantIndexValue(sandbox, a.ip, at));
        return { ...r.decided, wanted: 'written' };
      }
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
        block = structuredClone(r.mine ? withoutWant(r.block.value, a.ordinal) : r.block.value);
        tx.expect(r.blockKey, r.block.rev);
        // The want is fulfilled: it goes with its index key, in this transaction.
        if (r.mine) tx.del(keys.want(s.node, a.block, a.ordinal));
      }
      block.seq += 1;
      block.allocs[String(a.ordinal)] = { id: sandbox, ifname: POD_IFNAME, node: s.node, seq: block.seq, at };
      // Round robin moves past it, as if an ADD had just handed it out.
      block.next = (a.ordinal + 1) % Number(blockAddresses(a.cidr.ip.family, a.cidr.prefix));
      const handle: HandleValue = { v: 1, node: s.node, network: s.network, at, ips: [{ ip: a.ip, block: a.block, ordinal: a.ordinal, seq: block.seq, rangeSet: a.rangeSet }], host: s.host };
      tx.put(r.blockKey, encodeBlock(block));
      tx.put(handleKey, encodeHandle(handle));
      const done: { state: 're-reserved'; ip: string; block: string; claimed: boolean; seq: number; revision: string; wanted: boolean } = { state: 're-reserved', ip: a.ip, block: a.block, claimed: r.block === null, seq: block.seq, revision: '', wanted: r.mine };
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

/** One of a node's wants, found by its index key. */
export interface NodeWant {
  /** The block's key text (`10.80.0.64-26`). */
  readonly block: string;
  readonly ordinal: number;
  /** The address (canonical text). */
  readonly ip: string;
  /** The wanting sandbox, as the block names it (null: the block holds no want of this node there). */
  readonly sandbox: string | null;
}

/**
 * What a drop did: `dropped` (want and index key deleted), `orphan` (an index key without its
 * want, deleted), `kept` (`keep` said so, or the index key went meanwhile), `skipped` (`why`; with
 * `corrupt` when the block cannot be read, or the caller's `lost` stopped it).
 */
export type DropOutcome = { readonly want: NodeWant; readonly outcome: 'dropped' | 'orphan' | 'kept' | 'skipped'; readonly why?: string; readonly corrupt?: CorruptValueError };

/**
 * Drop node `node`'s wants whose `keep(sandbox, ip)` is false, each in one transaction: the want
 * removed from its block (compared at its `mod_revision`), its index key deleted, and `guard`
 * (e.g. `removing/<node>` absent). An index key whose block holds no want of `node` at that ordinal
 * is deleted alone (compared at its revision). A removed node's `pendingRelease` block that the
 * drop leaves holding nothing is given back in the same transaction ({@link giveBackEmptied}:
 * block and affinity deleted, the owner's marker compared) instead of written back. A block that cannot be read is left (`skipped`,
 * with `why`). One prefix read of `wanted/<node>/`, then per index key a read of its block.
 * @param lost after a lost compare: return a string to stop (the reason) or undefined to read again.
 * @throws the KV's errors (STORE_UNAVAILABLE); what `lost` throws; AppError STORE_CONFLICT after
 *   {@link MAX_ATTEMPTS} lost races on one want.
 */
export async function dropWants(
  kv: KV,
  k: PoolKeys,
  node: string,
  keep: (sandbox: string, ip: string) => boolean,
  guard: readonly KVCompare[],
  lost: () => Promise<string | undefined> = async () => undefined,
): Promise<DropOutcome[]> {
  const keys = keysOf(k);
  const prefix = keys.wantedPrefix(node);
  const out: DropOutcome[] = [];
  for (const ie of await kv.list(prefix, { keysOnly: true })) {
    const m = /^([^/]+)\/(0|[1-9][0-9]*)$/.exec(ie.key.slice(prefix.length));
    const cidrText = m === null ? null : blockKeyCidr(m[1] as string);
    const cidr = cidrText === null ? null : (parseCIDR(cidrText)?.subnet ?? null);
    if (m === null || cidr === null) continue; // not a want index key this version writes: left as it is
    const block = m[1] as string;
    const ordinal = Number(m[2]);
    const ip = formatIP(ordinalIP(cidr as Subnet, ordinal));
    const { value } = await runTxn<DropOutcome>(
      kv,
      async (tx) => {
        const idx = await tx.get(ie.key);
        if (idx === null) return { want: { block, ordinal, ip, sandbox: null }, outcome: 'kept', why: 'gone meanwhile' };
        const be = await kv.get(keys.block(block));
        let b: BlockValue | null = null;
        if (be !== null) {
          try {
            b = decodeBlock(be, cidrText as string);
          } catch (err) {
            if (!(err instanceof CorruptValueError)) throw err;
            tx.discard();
            return { want: { block, ordinal, ip, sandbox: null }, outcome: 'skipped', why: `${err.message}: left for an operator`, corrupt: err };
          }
        }
        const w = b === null ? null : wantOf(b, ordinal);
        for (const g of guard) tx.expectCompare(g);
        if (b === null || be === null || w === null || w.node !== node) {
          // The index outlived its want (it cannot, as both are written together; kept tidy anyway).
          tx.expect(keys.block(block), be === null ? null : be.modRevision);
          tx.del(ie.key);
          return { want: { block, ordinal, ip, sandbox: null }, outcome: 'orphan' };
        }
        const want = { block, ordinal, ip, sandbox: w.sandbox };
        if (keep(w.sandbox, ip)) {
          tx.discard();
          return { want, outcome: 'kept' };
        }
        tx.expect(keys.block(block), be.modRevision);
        const left = withoutWant(b, ordinal);
        // A removed node's block left holding nothing goes back to the pool (src/pool/stuck-block.ts), else it is written back.
        if (!(left.state === 'pendingRelease' && holdsNothing(left) && (await giveBackEmptied(kv, keys, tx, block, left.node)))) tx.put(keys.block(block), encodeBlock(left));
        tx.del(ie.key);
        return { want, outcome: 'dropped' };
      },
      {
        attempts: MAX_ATTEMPTS,
        lost: async () => {
          const why = await lost();
          return why === undefined ? undefined : { stop: { want: { block, ordinal, ip, sandbox: null }, outcome: 'skipped', why } };
        },
        exhausted: () => {
          throw new AppError('STORE_CONFLICT', `pool ${k.pool}: ${MAX_ATTEMPTS} drops of node ${node}'s want of ${ip} lost to concurrent writers; try again`);
        },
      },
    );
    out.push(value);
  }
  return out;
}

/**
 * The pool pass's drop of the node's stale wants: every want of `node` whose sandbox is not among
 * `ready` (READY sandbox → its pod IPs, as the runtime reported them) and whose address is not
 * `configured` (canonical IP → configured in some network namespace of the node: the kernel's
 * word keeps a want even when the runtime lists nothing). The caller calls it only when the
 * runtime answered, every READY sandbox's status was read and the kernel evidence is complete
 * (else a live pod's want could go). Compares `removing/<node>` absent, as every write of the node.
 */
export function dropStaleWants(kv: KV, k: PoolKeys, node: string, ready: ReadonlyMap<string, readonly string[]>, configured: (ip: string) => boolean = () => false): Promise<DropOutcome[]> {
  const removing = keysOf(k).removing(node);
  return dropWants(kv, k, node, (sandbox, ip) => configured(ip) || (ready.get(sandbox) ?? []).some((x) => canonicalIP(x) === ip), [{ key: removing, absent: true }], async () =>
    (await kv.get(removing)) !== null ? `a removal of node ${node} is begun (${removing}): nothing written` : undefined,
  );
}

