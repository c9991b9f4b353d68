/**
 * Memoised config decoders for the daemon (`PluginDeps.decoders`, src/cni/commands.ts). A node's
 * runtime sends the same network config on every ADD and DEL, and `loadIPAMConfig` /
 * `loadNetworkIdentity` (src/ipam/config.ts) are pure: the same stdin bytes and `CNI_ARGS` always
 * give the same value or the same error. So the daemon decodes each distinct input once and hands
 * out the same value afterwards, deeply frozen (a handler cannot change what the next request
 * sees). Errors are not memoised: a bad config is decoded (and fails) again on every request.
 *
 * Bounds: inputs of at most {@link MEMO_MAX_INPUT_BYTES} bytes are memoised, at most
 * {@link MEMO_MAX_ENTRIES} per decoder, least recently used dropped first. Measured on the daemon's
 * ADD path: the decode was ≈ 80 µs of a ≈ 2.5 ms ADD, 35 µs of a DEL (docs/benchmarks.md, "The fast
 * path").
 */
import { DIRECT_DECODERS, type ConfigDecoders } from '../cni/commands.ts';
import type { IPAMConfig, NetworkIdentity } from '../ipam/types.ts';

/** Largest stdin memoised, bytes (a CNI config is a few hundred bytes; a huge one is decoded each time). */
export const MEMO_MAX_INPUT_BYTES = 16 * 1024;
/** Entries kept per decoder (distinct configs × distinct CNI_ARGS seen recently). */
export const MEMO_MAX_ENTRIES = 64;

/** Freeze `v` and everything reachable from it (plain objects and arrays; bigints are values). */
function deepFreeze<T>(v: T): T {
  if (typeof v === 'object' && v !== null && !Object.isFrozen(v)) {
    Object.freeze(v);
    for (const k of Object.keys(v)) deepFreeze((v as Record<string, unknown>)[k]);
  }
  return v;
}

/** A bounded LRU map from input key to decoded value. */
class Lru<V> {
  readonly #m = new Map<string, V>();
  get(k: string): V | undefined {
    const v = this.#m.get(k);
    if (v !== undefined) {
      this.#m.delete(k);
      this.#m.set(k, v);
    }
    return v;
  }
  set(k: string, v: V): void {
    this.#m.set(k, v);
    if (this.#m.size > MEMO_MAX_ENTRIES) this.#m.delete(this.#m.keys().next().value as string);
  }
  get size(): number {
    return this.#m.size;
  }
}

/** The exact bytes as a string key (latin1 maps each byte to one code unit: distinct bytes, distinct keys). */
function bytesKey(stdin: Uint8Array): string {
  return Buffer.from(stdin.buffer, stdin.byteOffset, stdin.byteLength).toString('latin1');
}

/**
 * New memoised decoders over `inner` (default: the direct ones). Same contract as `inner`: the
 * same value (frozen, possibly the very object of an earlier call) or the same error.
 */
export function memoConfigDecoders(inner: ConfigDecoders = DIRECT_DECODERS): ConfigDecoders & { readonly entries: () => number } {
  const ipam = new Lru<IPAMConfig>();
  const identity = new Lru<NetworkIdentity>();
  return {
    ipam(stdin, cniArgs) {
      if (stdin.byteLength > MEMO_MAX_INPUT_BYTES) return inner.ipam(stdin, cniArgs);
      // CNI_ARGS comes from the environment: it holds no NUL, so the key is unambiguous.
      const key = `${cniArgs}\0${bytesKey(stdin)}`;
      const hit = ipam.get(key);
      if (hit !== undefined) return hit;
      const v = deepFreeze(inner.ipam(stdin, cniArgs));
      ipam.set(key, v);
      return v;
    },
    identity(stdin) {
      if (stdin.byteLength > MEMO_MAX_INPUT_BYTES) return inner.identity(stdin);
      const key = bytesKey(stdin);
      const hit = identity.get(key);
      if (hit !== undefined) return hit;
      const v = deepFreeze(inner.identity(stdin));
      identity.set(key, v);
      return v;
    },
    entries: () => ipam.size + identity.size,
  };
}
