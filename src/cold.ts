/**
 * The cold part of the program: everything the plugin's hot path (ADD/DEL/CHECK/GC/STATUS on a
 * healthy network) never needs — the operator CLI and the CRI-backed self-healing hooks with the
 * gRPC client. `scripts/build.mjs` bundles this module separately and embeds it in the main bundle
 * as a string that is compiled only when first imported, so exec'ing the plugin does not pay for
 * parsing gRPC (docs/benchmarks.md). Under tsx (tests) it is an ordinary module.
 */
export { runMain } from './cli/main.ts';
export { criHeal } from './cni/heal.ts';
