/**
 * The offline reserve's refill (docs/cluster.md "Offline allocation"; the allocator's third job,
 * composed by src/pool/allocator.ts): reserve entries kept in the node's own blocks and its
 * settings key, in one revision-checked transaction per attempt. The pure rules are
 * src/pool/offline.ts; the daemon's side is src/pool/contact.ts.
 */
import { isWanted } from './wanted.ts';
import { AppError } from '../common/errors.ts';
import { formatIP } from '../common/ip.ts';
import { MAX_TXN_OPS } from '../store/kv.ts';
import { blockAddresses, ordinalIP } from './blocks.ts';
import type { ReserveSlot } from './offline.ts';
import { Retry, runTxn } from './txn.ts';
import { affinityValue, CorruptValueError, decodeSettings, encodeBlock, settingsValue } from './model.ts';
import { type AllocatorCore, MAX_ATTEMPTS, type Working } from './allocator-core.ts';
import { veto, vetoIfMarked } from './veto.ts';

/**
 * Keep `k` reserve entries per range set in this node's own blocks (docs/cluster.md "Offline
 * allocation"), and its settings key at `offlineSeconds` or more (never lowered), in one
 * transaction per attempt that compares every block written and `removing/<me>` absent (like
 * every ADD; a removal begun makes it veto and decide again). New entries go into the node's
 * owned blocks (round robin from `next`), then into a free block it claims; never into another
 * node's block. Entries beyond `k` are kept (they are released with the node's blocks); an entry
 * at a wanted ordinal (a live pod of another node uses the address, src/pool/wanted.ts) is
 * deleted in the same transaction and never counted or returned as a slot. When
 * nothing needs writing it reads `removing/<me>` instead (so a call is always a confirmed
 * contact when it returns). A block of the node that cannot be read is skipped (no entry in it,
 * never rewritten; told to `onCorrupt`). Returns every reserve entry of the node (in owned blocks), the
 * shortfall per range set (a full pool), and the offline seconds its settings now hold.
 * @throws like {@link add} (STORE_UNAVAILABLE, STORE_CONFLICT after {@link MAX_ATTEMPTS}, STORE_CORRUPT).
 */
export async function refillReserve(core: AllocatorCore, k: number, offlineSeconds: number): Promise<{ slots: ReserveSlot[]; short: number[]; settingsSeconds: number }> {
  await core.checkMeta();
  const kv = core.o.kv;
  const me = core.o.node;
  const prefix = core.keys.affinityPrefix(me);
  const sk = core.settingsKey(me);
  const { value } = await runTxn(
    kv,
    async (tx) => {
    const blocks = new Map<string, Working | null>();
    const [listed, se] = await Promise.all([kv.list(prefix, { keysOnly: true }), kv.get(sk)]);
    const announced = se === null ? null : decodeSettings(se);
    const mine: Working[] = [];
    let lostRace = false;
    const skipped: CorruptValueError[] = [];
    for (const a of listed) {
      const b = await core.tryBlock(a.key.slice(prefix.length), blocks);
      if (b instanceof CorruptValueError) {
        skipped.push(b); // as an ADD does: no reserve entry in it, never rewritten
        continue;
      }
      if (b === null || b.value.node !== me) {
        lostRace = true; // given back and claimed by another meanwhile (see add): read again
        break;
      }
      if (b.value.state === 'pendingRelease') {
        b.value.state = 'owned'; // the node is back: veto in this transaction (as an ADD does)
        b.dirty = true;
      }
      mine.push(b);
    }
    if (lostRace) {
      core.cache = null;
      throw new Retry();
    }
    // A reserve entry at a wanted ordinal (a live pod of another node uses the address,
    // src/pool/wanted.ts) is never handed out offline: deleted here, in this transaction.
    for (const b of mine) {
      for (const [o, a] of Object.entries(b.value.allocs)) {
        if (a.reserve !== true || a.node !== me || !isWanted(b.value, Number(o))) continue;
        delete b.value.allocs[o];
        b.dirty = true;
      }
    }
    let claimed: Set<string> | null = null;
    const short: number[] = [];
    for (let s = 0; s < core.o.rangeSets.length; s++) {
      let need = k - mine.filter((b) => b.value.rangeSet === s).reduce((n, b) => n + Object.values(b.value.allocs).filter((a) => a.reserve === true).length, 0);
      while (need > 0) {
        let pick = core.firstFree(mine, s);
        if (pick === null) {
          claimed ??= new Set((await kv.list(core.keys.blocksPrefix, { keysOnly: true })).map((e) => e.key.slice(core.keys.blocksPrefix.length)));
          const nb = core.claimable(s, claimed);
          if (nb === null || core.freeOrdinal(nb) < 0) break;
          claimed.add(nb.key);
          blocks.set(nb.key, nb);
          mine.push(nb);
          continue;
        }
        const b = pick.b;
        b.value.seq += 1;
        b.value.allocs[String(pick.o)] = { id: '', ifname: '', node: me, seq: b.value.seq, at: core.now(), reserve: true };
        b.value.next = (pick.o + 1) % Number(blockAddresses(b.cidr.ip.family, b.cidr.prefix));
        b.dirty = true;
        need--;
      }
      short.push(Math.max(0, need));
    }
    for (const b of blocks.values()) {
      if (b === null || !b.dirty) continue;
      const bk = core.blockKey(b.key);
      if (b.rev === null) {
        const ak = core.affinityKey(me, b.key);
        tx.expect(bk, null);
        tx.expect(ak, null);
        tx.put(ak, affinityValue(b.value.rangeSet));
      } else tx.expect(bk, b.rev);
      tx.put(bk, encodeBlock(b.value));
    }
    const settingsSeconds = Math.max(announced ?? 0, offlineSeconds);
    if (announced === null || announced < offlineSeconds) {
      tx.expect(sk, se === null ? null : se.modRevision);
      tx.put(sk, settingsValue(settingsSeconds));
    }
    const slots = (): ReserveSlot[] =>
      mine
        .filter((b) => b.value.state === 'owned')
        .flatMap((b) =>
          Object.entries(b.value.allocs)
            .filter(([o, a]) => a.reserve === true && a.node === me && !isWanted(b.value, Number(o)))
            .map(([o, a]) => ({ block: b.key, ordinal: Number(o), seq: a.seq, rangeSet: b.value.rangeSet, ip: formatIP(ordinalIP(b.cidr, Number(o))) })),
        );
    if (tx.ops.length === 0) {
      // Nothing to write: read the marker, so that a return is a confirmed contact all the same.
      if ((await kv.get(core.removingKey(me))) !== null) {
        await veto(core);
        throw new Retry('a removal of this node was begun: vetoed, decide again');
      }
      core.remember(blocks, null);
      for (const e of skipped) core.report('refill', e, 'block skipped: no reserve entry set aside in it, left for an operator');
      return { slots: slots(), short, settingsSeconds };
    }
    if (tx.size + 1 > MAX_TXN_OPS) throw new AppError('INTERNAL', `pool ${core.o.pool}: a reserve refill of ${k} per range set needs more than ${MAX_TXN_OPS} transaction ops (blocks too small)`);
    tx.expect(core.removingKey(me), null);
    tx.onCommit((revision) => {
      core.remember(blocks, revision);
      for (const e of skipped) core.report('refill', e, 'block skipped: no reserve entry set aside in it, left for an operator');
    });
    return { slots: slots(), short, settingsSeconds };
    },
    {
      attempts: MAX_ATTEMPTS,
      ...(core.o.backoff === undefined ? {} : { backoff: core.o.backoff }),
      lost: async () => {
        core.cache = null;
        await vetoIfMarked(core);
      },
      exhausted: () => {
        throw new AppError('STORE_CONFLICT', `pool ${core.o.pool}: ${MAX_ATTEMPTS} reserve refills lost to concurrent writers; try again`);
      },
    },
  );
  return value;
}
