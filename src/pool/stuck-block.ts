/**
 * A dead node's block that its last borrower empties (docs/cluster.md "Reclaiming a dead node's
 * blocks", calico#5218): `pool remove-node --finish` keeps a block of the removed node while
 * other nodes still hold addresses borrowed in it (it stays `pendingRelease`: nobody allocates in
 * it and no node can claim it). Before, the DEL that released the last of those addresses left the
 * block there, empty and `pendingRelease`, until a person ran `--finish` again — meanwhile an ADD
 * found no address while `pool status` counted the block's addresses as free.
 *
 * Now that DEL gives the block back in its own transaction: it deletes the block and its owner's
 * affinity, comparing the affinity's `mod_revision` and the owner's removal marker
 * (`removing/<owner>`) at the `mod_revision` read. The marker's compare is what makes it safe: a
 * block is `pendingRelease` only while a removal of its owner is begun, and a veto deletes the
 * marker before it writes the blocks back to `owned` — so a DEL racing a veto fails its compare,
 * reads again and keeps the block. An empty block holds no address, so giving it back can never
 * hand one out twice; a node that vetoes later merely claims another block.
 */
import type { KV, KVCompare, KVOp } from '../store/kv.ts';

/**
 * The compares and ops that give back the emptied `pendingRelease` block `block` (`10.81.0.16-28`)
 * of node `owner` in the pool whose keys start with `base` (`P/pools/<pool>`), to add to the
 * transaction of the DEL that emptied it (which already compares the block's `mod_revision`).
 * Two reads: the owner's removal marker and the affinity. Null when the block must stay (then the
 * caller puts it as before): no marker (the owner vetoed: its block goes back to `owned`), or no
 * affinity (a block without its affinity is left for an operator, as `--finish` leaves it).
 * @throws the KV's errors (STORE_UNAVAILABLE when etcd cannot be asked)
 */
export async function emptiedPendingRelease(kv: KV, base: string, block: string, owner: string): Promise<{ compares: KVCompare[]; ops: KVOp[] } | null> {
  const markerKey = `${base}/removing/${owner}`;
  const affinityKey = `${base}/nodes/${owner}/blocks/${block}`;
  const [marker, affinity] = await Promise.all([kv.get(markerKey), kv.get(affinityKey)]);
  if (marker === null || affinity === null) return null;
  return {
    compares: [
      { key: markerKey, modRevision: marker.modRevision },
      { key: affinityKey, modRevision: affinity.modRevision },
    ],
    ops: [{ delete: `${base}/blocks/${block}` }, { delete: affinityKey }],
  };
}
