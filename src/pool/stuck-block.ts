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
import type { KV } from '../store/kv.ts';
import type { PoolKeyLayout } from './model.ts';
import type { Txn } from './txn.ts';

/**
 * Give back the emptied `pendingRelease` block `block` (`10.81.0.16-28`) of node `owner` inside
 * the transaction `tx` of the DEL (or reconcile release) that emptied it — which already compares
 * the block's `mod_revision`: compares the owner's removal marker (`removing/<owner>`) and its
 * affinity at the `mod_revision`s read, deletes the block and the affinity. Two reads. Returns
 * false, adding nothing, when the block must stay (the caller puts it as before): no marker (the
 * owner vetoed: its block goes back to `owned`), or no affinity (a block without its affinity is
 * left for an operator, as `--finish` leaves it).
 * @throws the KV's errors (STORE_UNAVAILABLE when etcd cannot be asked)
 */
export async function giveBackEmptied(kv: KV, keys: PoolKeyLayout, tx: Txn, block: string, owner: string): Promise<boolean> {
  const markerKey = keys.removing(owner);
  const affinityKey = keys.affinity(owner, block);
  const [marker, affinity] = await Promise.all([kv.get(markerKey), kv.get(affinityKey)]);
  if (marker === null || affinity === null) return false;
  tx.expect(markerKey, marker.modRevision);
  tx.expect(affinityKey, affinity.modRevision);
  tx.del(keys.block(block));
  tx.del(affinityKey);
  return true;
}
