/**
 * The pool's revision-checked retry (src/pool/txn.ts) on the in-memory KV (pure logic: the
 * real-etcd pool suites cover it on etcd): the compares are exactly the recorded reads, writes
 * commit together or not at all, a lost compare re-runs the body on fresh reads after the
 * backoff, the bound gives the caller's answer, `Retry` re-runs, `lost` may stop, a body that
 * writes nothing sends no transaction.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { MemoryKV } from '../../src/store/memory/memory-kv.ts';
import type { KV, KVCompare, KVOp } from '../../src/store/kv.ts';
import { Retry, runTxn, Txn } from '../../src/pool/txn.ts';

/** The memory KV with every transaction it was sent recorded. */
function recording(kv: KV): { kv: KV; txns: Array<{ compares: KVCompare[]; ops: KVOp[]; succeeded: boolean }> } {
  const txns: Array<{ compares: KVCompare[]; ops: KVOp[]; succeeded: boolean }> = [];
  const wrapped: KV = {
    description: kv.description,
    get stats() {
      return kv.stats;
    },
    get: (key) => kv.get(key),
    list: (prefix, opts) => kv.list(prefix, opts),
    close: () => kv.close(),
    txn: async (compares, ops) => {
      const r = await kv.txn(compares, ops);
      txns.push({ compares: [...compares], ops: [...ops], succeeded: r.succeeded });
      return r;
    },
  };
  return { kv: wrapped, txns };
}

describe('pool txn', () => {
  it('commits the buffered writes under compares of exactly the recorded reads', async () => {
    const mem = new MemoryKV();
    await mem.txn([], [{ put: 'a', value: '1' }]);
    const a = (await mem.get('a'))?.modRevision as string;
    const { kv, txns } = recording(mem);
    const r = await runTxn(
      kv,
      async (tx) => {
        const e = await tx.get('a'); // recorded
        await tx.read('b'); // a hint: not compared
        assert.equal(await tx.get('c'), null); // recorded absent
        tx.expect('d', null);
        tx.put('a', `${e?.value}+`);
        tx.del('c');
        return 'done';
      },
      { attempts: 3, exhausted: () => 'exhausted' },
    );
    assert.equal(r.value, 'done');
    assert.equal(txns.length, 1);
    assert.deepEqual(txns[0], {
      compares: [
        { key: 'a', modRevision: a },
        { key: 'c', absent: true },
        { key: 'd', absent: true },
      ],
      ops: [{ put: 'a', value: '1+' }, { delete: 'c' }],
      succeeded: true,
    });
    assert.equal(r.revision, (await mem.get('a'))?.modRevision);
    assert.equal((await mem.get('a'))?.value, '1+');
  });

  it('readMany reads the keys not yet read in one getMany (one read), in order, unrecorded; a later read of them answers from the attempt', async () => {
    const mem = new MemoryKV();
    await mem.txn([], [{ put: 'a', value: '1' }, { put: 'c', value: '3' }]);
    const { kv, txns } = recording(mem);
    const withMany: KV = { ...kv, getMany: (keys) => mem.getMany(keys) };
    const r0 = mem.stats.reads;
    const r = await runTxn(
      withMany,
      async (tx) => {
        assert.equal((await tx.read('a'))?.value, '1');
        const got = await tx.readMany(['c', 'b', 'a', 'c']);
        assert.deepEqual(got.map((e) => e?.value ?? null), ['3', null, '1', '3']);
        assert.equal((await tx.read('b')), null);
        tx.expect('b', null);
        tx.put('b', '2');
        return 'done';
      },
      { attempts: 1, exhausted: () => 'exhausted' },
    );
    assert.equal(r.value, 'done');
    // The get of a, then one getMany of c and b; nothing else read.
    assert.equal(mem.stats.reads - r0, 2);
    assert.deepEqual(txns.map((t) => t.compares), [[{ key: 'b', absent: true }]], 'readMany records nothing');
  });

  it('re-runs the body on fresh reads after a lost compare, with the backoff, and runs onCommit once', async () => {
    const mem = new MemoryKV();
    await mem.txn([], [{ put: 'n', value: '0' }]);
    const { kv, txns } = recording(mem);
    const backoffs: number[] = [];
    const committed: string[] = [];
    let runs = 0;
    const r = await runTxn(
      kv,
      async (tx) => {
        runs++;
        const e = await tx.get('n');
        // A concurrent writer gets in between the first attempt's read and its commit.
        if (tx.attempt === 0) await mem.txn([], [{ put: 'n', value: '10' }]);
        tx.put('n', String(Number(e?.value) + 1));
        tx.onCommit((rev) => committed.push(rev));
        return Number(e?.value) + 1;
      },
      { attempts: 5, backoff: async (n) => void backoffs.push(n), exhausted: () => -1 },
    );
    assert.equal(runs, 2);
    assert.equal(r.value, 11);
    assert.deepEqual(backoffs, [1]);
    assert.deepEqual(
      txns.map((t) => t.succeeded),
      [false, true],
    );
    assert.equal((await mem.get('n'))?.value, '11');
    assert.deepEqual(committed, [r.revision]);
  });

  it('gives the exhausted answer after the bound, and lost may stop early', async () => {
    const mem = new MemoryKV();
    let runs = 0;
    const body = async (tx: Txn): Promise<string> => {
      runs++;
      await tx.get('k');
      await mem.txn([], [{ put: 'k', value: String(runs) }]); // always a writer in between
      tx.put('k', 'mine');
      return 'committed';
    };
    const r = await runTxn(mem, body, { attempts: 4, exhausted: () => 'exhausted' });
    assert.deepEqual([r.value, r.revision, runs], ['exhausted', null, 4]);
    assert.equal((await mem.get('k'))?.value, '4');
    runs = 0;
    let losses = 0;
    const s = await runTxn(mem, body, { attempts: 4, exhausted: () => 'exhausted', lost: () => (++losses === 2 ? { stop: 'stopped' } : undefined) });
    assert.deepEqual([s.value, s.revision, runs, losses], ['stopped', null, 2, 2]);
    await assert.rejects(
      runTxn(mem, body, {
        attempts: 2,
        exhausted: () => {
          throw new Error('STORE_CONFLICT');
        },
      }),
      /STORE_CONFLICT/,
    );
  });

  it('re-runs on Retry, passes other errors through, and sends nothing for a body that writes nothing', async () => {
    const mem = new MemoryKV();
    const { kv, txns } = recording(mem);
    let runs = 0;
    const r = await runTxn(
      kv,
      async (tx) => {
        runs++;
        await tx.get('x');
        if (runs < 3) throw new Retry();
        return 'read only';
      },
      { attempts: 5, exhausted: () => 'exhausted' },
    );
    assert.deepEqual([r.value, r.revision, runs, txns.length], ['read only', null, 3, 0]);
    await assert.rejects(
      runTxn(
        kv,
        async () => {
          throw new TypeError('bug');
        },
        { attempts: 5, exhausted: () => 'exhausted' },
      ),
      TypeError,
    );
    const d = await runTxn(
      kv,
      async (tx) => {
        tx.put('y', '1');
        tx.discard();
        return 'discarded';
      },
      { attempts: 1, exhausted: () => 'exhausted' },
    );
    assert.deepEqual([d.value, txns.length, await mem.get('y')], ['discarded', 0, null]);
  });

  it('answers a second read of a key from the attempt snapshot, and keeps the first recorded revision', async () => {
    const mem = new MemoryKV();
    await mem.txn([], [{ put: 's', value: 'old' }]);
    const first = (await mem.get('s'))?.modRevision as string;
    const tx = new Txn(mem, 0);
    assert.equal((await tx.get('s'))?.value, 'old');
    await mem.txn([], [{ put: 's', value: 'new' }]);
    assert.equal((await tx.get('s'))?.value, 'old');
    tx.expect('s', '999');
    assert.deepEqual(tx.compares, [{ key: 's', modRevision: first }]);
    assert.equal(tx.size, 1);
  });
});
