/**
 * The node's own veto of its removal (docs/cluster.md "Reclaiming a dead node's blocks"; the
 * allocator's second job, composed by src/pool/allocator.ts): delete the marker, write the node's
 * `pendingRelease` blocks back to `owned`. The operator's side of a removal is src/pool/removal.ts.
 */
import { runTxn } from './txn.ts';
import { CorruptValueError, encodeBlock } from './model.ts';
import { type AllocatorCore, MAX_ATTEMPTS } from './allocator-core.ts';

/**
 * Veto a removal of this node (docs/cluster.md "Reclaiming a dead node's blocks"): delete its
 * marker `removing/<node>` first — from then on every `--finish` transaction, which compares
 * the marker's revision, fails — then write each of its blocks in `pendingRelease` back to
 * `owned` (one revision-checked write each; a block it cannot read is left as it is and told to
 * `onCorrupt`). Returns the blocks written back. Called by an ADD
 * that finds the marker (its transaction compares it absent), by the daemon at the start of a
 * pool and on every heartbeat ({@link vetoIfMarked}), and by tools and tests.
 */
export async function veto(core: AllocatorCore): Promise<string[]> {
  const kv = core.o.kv;
  await kv.txn([], [{ delete: core.removingKey(core.o.node) }]);
  const prefix = core.keys.affinityPrefix(core.o.node);
  const out: string[] = [];
  for (const a of await kv.list(prefix, { keysOnly: true })) {
    const key = a.key.slice(prefix.length);
    // One revision-checked write per block; after MAX_ATTEMPTS lost races the block is left.
    await runTxn(
      kv,
      async (tx) => {
        const b = await core.tryBlock(key, new Map());
        if (b instanceof CorruptValueError) {
          // Never rewritten: the other blocks are still written back.
          core.report('veto', b, 'block not written back to owned (it cannot be read): left for an operator');
          return;
        }
        if (b === null || b.value.state !== 'pendingRelease' || b.value.node !== core.o.node) return;
        b.value.state = 'owned';
        tx.expect(core.blockKey(key), b.rev);
        tx.put(core.blockKey(key), encodeBlock(b.value));
        tx.onCommit(() => out.push(key));
      },
      { attempts: MAX_ATTEMPTS, exhausted: () => undefined },
    );
  }
  core.cache = null;
  return out.sort();
}

/**
 * {@link veto} only when this node's removal marker exists (one read otherwise): what the
 * daemon runs at the start of a pool and on every heartbeat, so an idle node that returns from
 * a partition vetoes within one heartbeat period (review F2b). Returns the blocks written back,
 * or null when no removal was begun.
 */
export async function vetoIfMarked(core: AllocatorCore): Promise<string[] | null> {
  if ((await core.o.kv.get(core.removingKey(core.o.node))) === null) return null;
  return veto(core);
}
