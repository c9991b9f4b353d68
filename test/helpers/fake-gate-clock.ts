/**
 * A {@link GateClock} for unit tests of the daemon's render gates (src/daemon/metrics.ts
 * `RenderGate`): time moves only when told; `sleep` resolves when {@link FakeGateClock.advanceTo}
 * passes its end. Used by the metrics and status-pages tests.
 */
import type { GateClock } from '../../src/daemon/metrics.ts';

/** A clock whose time (milliseconds) moves only when told. */
export class FakeGateClock implements GateClock {
  t = 0;
  private timers: Array<{ at: number; resolve: () => void }> = [];
  now(): number {
    return this.t;
  }
  sleep(ms: number): Promise<void> {
    return new Promise((resolve) => this.timers.push({ at: this.t + ms, resolve }));
  }
  /** Move to `t`, wake every sleeper due by then, and let the woken code run. */
  async advanceTo(t: number): Promise<void> {
    this.t = t;
    const due = this.timers.filter((x) => x.at <= t);
    this.timers = this.timers.filter((x) => x.at > t);
    for (const x of due) x.resolve();
    await settle();
  }
}

/** Let every pending promise callback run (the gate's steps are promise continuations). */
export async function settle(): Promise<void> {
  for (let i = 0; i < 5; i++) await new Promise<void>((r) => setImmediate(r));
}
