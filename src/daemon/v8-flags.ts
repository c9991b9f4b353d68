/**
 * V8 settings of the long-lived daemon process (issue 19, bursts; docs/benchmarks.md "Warm-up"):
 * set once, at the start of `ipwarden daemon`, before its request path is compiled.
 *
 * - `--no-memory-reducer`: V8's memory reducer (meant for idle browser tabs) runs memory-reducing
 *   mark-compacts a few seconds after allocation slows down; measured here, they shrank a daemon's
 *   heap from 59 to 12 MB after a burst, and the next burst, 100 s later, cost 1.5–1.9 ms of daemon
 *   CPU per pod instead of 1.0–1.1 (young generation grown again from its minimum, compiled code
 *   dropped).
 * - `--no-flush-bytecode`: V8 drops the bytecode (and with it the optimized code) of functions
 *   unused for a number of GCs; a node daemon's ADD path is unused for minutes between pods.
 *
 * Together (measured, same VM, 100 s idle after the warm-up, then bursts of 100 pods): 1.0–1.3 ms
 * of daemon CPU per pod against 1.5–1.9 ms with V8's defaults. The cost is memory: the heap stays
 * at what the largest burst needed (tens of MB) instead of shrinking back.
 *
 * `v8.setFlagsFromString` after start is allowed for these (both are read when V8 decides on a
 * GC, not at heap setup); the single executable (`ipwarden-standalone`) cannot take V8 flags on its
 * command line, so this is the one place for them.
 */
import { setFlagsFromString } from 'node:v8';

/** The V8 flags {@link tuneDaemonV8} sets. */
export const DAEMON_V8_FLAGS = ['--no-memory-reducer', '--no-flush-bytecode'] as const;

/** Set {@link DAEMON_V8_FLAGS} in this process (idempotent; never throws). */
export function tuneDaemonV8(): void {
  for (const f of DAEMON_V8_FLAGS) {
    try {
      setFlagsFromString(f);
    } catch {
      // An unknown flag in another V8: the defaults then.
    }
  }
}
