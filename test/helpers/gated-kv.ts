/**
 * Test helpers over the memory KV: {@link GatedKV}, whose transactions wait at a gate while
 * `hold` is set (the test decides when "etcd" answers), and {@link until}, a bounded poll for a
 * condition (no sleep decides an outcome).
 */
import assert from 'node:assert/strict';
import type { KVCompare, KVOp, KVTxnResult } from '../../src/store/kv.ts';
import { MemoryKV } from '../../src/store/memory/memory-kv.ts';

/** A memory KV whose transactions wait at a gate while `hold` is set; `waiting` counts them. */
export class GatedKV extends MemoryKV {
  hold = false;
  waiting = 0;
  #open: Array<() => void> = [];
  override async txn(c: readonly KVCompare[], o: readonly KVOp[]): Promise<KVTxnResult> {
    await this.gate();
    return super.txn(c, o);
  }
  /** Wait while `hold` is set (a subclass calls it first, then decides the transaction). */
  protected async gate(): Promise<void> {
    if (!this.hold) return;
    this.waiting++;
    await new Promise<void>((r) => this.#open.push(r));
    this.waiting--;
  }
  /** The memory KV's own transaction, past the gate (for subclasses that gate first themselves). */
  protected plainTxn(c: readonly KVCompare[], o: readonly KVOp[]): Promise<KVTxnResult> {
    return super.txn(c, o);
  }
  /** Open the gate: every waiting transaction goes on, and later ones do not wait. */
  release(): void {
    this.hold = false;
    for (const r of this.#open.splice(0)) r();
  }
}

/** Poll `cond` for at most 1000 turns of the event loop; then assert it, naming `what`. */
export async function until(cond: () => boolean, what: string): Promise<void> {
  for (let i = 0; i < 1000 && !cond(); i++) await new Promise((r) => setImmediate(r));
  assert.ok(cond(), what);
}
