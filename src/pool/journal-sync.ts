/**
 * The offline journal's sync (docs/cluster.md "Offline allocation"; the allocator's fourth job,
 * composed by src/pool/allocator.ts): an ADD answered from the reserve while etcd was away made
 * the container's allocation in etcd, in one revision-checked transaction per attempt. The
 * journal's files are src/pool/journal.ts; the daemon's side is src/pool/contact.ts.
 */
import { AppError } from '../common/errors.ts';
import type { JournalEntry } from './offline.ts';
import { runTxn } from './txn.ts';
import { encodeBlock, encodeHandle, type HandleIP, type HandleValue } from './model.ts';
import { type AllocatorCore, MAX_ATTEMPTS, type PoolRequest, type Working } from './allocator-core.ts';
import { vetoIfMarked } from './veto.ts';

/**
 * Sync one journal entry of this node (`kind` `add`) to etcd: one transaction per attempt that
 * compares each reserve entry's block at the revision read (the entry still this node's
 * reserve with the journal's sequence number), the handle absent (or its tombstone's
 * revision), and `removing/<me>` absent, and turns each reserve entry into the container's
 * allocation (a new sequence number) and puts the handle. A handle of this node that already
 * names other addresses (an ADD whose answer was lost before it went offline) is replaced in
 * the same transaction, its addresses released (the runtime knows only the journal's answer).
 * Returns `synced` (also when an earlier sync did it: the handle names these addresses with
 * allocations of the container), or `{gone}` with the reason when a reserve entry is no longer
 * there (only `--finish` removes one: the partition outlived the veto window) or the handle
 * belongs to another node, or `{gone}` naming the want when an entry's ordinal is wanted (a
 * live pod of another node uses the address: a conflict, never allocated). Never releases
 * anything else.
 * @throws like {@link add}.
 */
export async function syncJournalEntry(core: AllocatorCore, e: JournalEntry): Promise<'synced' | { gone: string }> {
  const kv = core.o.kv;
  const me = core.o.node;
  const req: PoolRequest = { containerId: e.containerId, ifname: e.ifname };
  const { value } = await runTxn<'synced' | { gone: string }>(
    kv,
    async (tx) => {
    const h = await core.handle(req);
    const blocks = new Map<string, Working | null>();
    const live = h !== null && h.value.deleted !== true ? h : null;
    if (live !== null && live.value.ips.length === e.ips.length && e.ips.every((x) => live.value.ips.some((y) => y.block === x.block && y.ordinal === x.ordinal))) {
      let ours = true;
      for (const y of live.value.ips) {
        const a = (await core.block(y.block, blocks))?.value.allocs[String(y.ordinal)];
        if (a === undefined || a.reserve === true || a.id !== e.containerId || a.ifname !== e.ifname || a.seq !== y.seq) ours = false;
      }
      if (ours) return 'synced';
    }
    if (live !== null && live.value.node !== me) return { gone: `handle ${live.entry.key} belongs to node ${live.value.node}` };
    if (live !== null) {
      for (const x of live.value.ips) {
        const b = await core.block(x.block, blocks);
        const a = b?.value.allocs[String(x.ordinal)];
        if (b === null || a === undefined || a.reserve === true || a.seq !== x.seq || a.id !== e.containerId || a.ifname !== e.ifname) continue;
        delete b.value.allocs[String(x.ordinal)];
        b.dirty = true;
      }
    }
    if (h === null) tx.expect(core.handleKey(e.containerId, e.ifname), null);
    else tx.expect(h.entry.key, h.entry.modRevision);
    const hips: HandleIP[] = [];
    let gone: string | null = null;
    for (const x of e.ips) {
      const b = await core.block(x.block, blocks);
      const a = b?.value.allocs[String(x.ordinal)];
      if (b === null || a === undefined || a.reserve !== true || a.seq !== x.seq || b.value.node !== me) {
        gone = `reserve entry ${x.ip} (block ${x.block}, sequence ${x.seq}) is no longer this node's: ${b === null ? 'the block is gone' : a === undefined ? 'the address is free' : a.reserve === true ? `a reserve entry of sequence ${a.seq}` : `held by ${a.id}/${a.ifname}`}`;
        break;
      }
      const w = b.value.wanted?.[String(x.ordinal)];
      if (w !== undefined) {
        // A conflict, never an allocation: a live pod of node w.node uses the address (src/pool/wanted.ts).
        gone = `reserve entry ${x.ip} (block ${x.block}, sequence ${x.seq}) is wanted by sandbox ${w.sandbox} of node ${w.node} (a live pod uses the address): not allocated`;
        break;
      }
      b.value.seq += 1;
      b.value.allocs[String(x.ordinal)] = { id: e.containerId, ifname: e.ifname, node: me, seq: b.value.seq, at: core.now() };
      b.dirty = true;
      hips.push({ ip: x.ip, block: x.block, ordinal: x.ordinal, seq: b.value.seq, rangeSet: x.rangeSet });
    }
    if (gone !== null) return { gone };
    for (const b of blocks.values()) {
      if (b === null || !b.dirty) continue;
      tx.expect(core.blockKey(b.key), b.rev);
      tx.put(core.blockKey(b.key), encodeBlock(b.value));
    }
    const hv: HandleValue = { v: 1, node: me, network: e.network, at: core.now(), ips: hips, ...(core.o.host === undefined ? {} : { host: core.o.host }) };
    tx.put(core.handleKey(e.containerId, e.ifname), encodeHandle(hv));
    tx.expect(core.removingKey(me), null);
    tx.onCommit(() => (core.cache = null));
    return 'synced';
    },
    {
      attempts: MAX_ATTEMPTS,
      ...(core.o.backoff === undefined ? {} : { backoff: core.o.backoff }),
      lost: async () => {
        core.cache = null;
        await vetoIfMarked(core);
      },
      exhausted: () => {
        throw new AppError('STORE_CONFLICT', `pool ${core.o.pool}: ${MAX_ATTEMPTS} syncs of ${e.containerId}/${e.ifname} lost to concurrent writers; try again`);
      },
    },
  );
  return value;
}
