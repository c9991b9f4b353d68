/**
 * Bounded concurrency for runtime calls (PodSandboxStatus per sandbox in `leaks`/`gc` and in the
 * plugin's reclaim and recovery). Leaf helper: no imports.
 */

/**
 * `fn` over `items` with at most `limit` calls in flight; results in input order. Rejects with
 * the first error only after every started call has settled (nothing is left running).
 */
export async function mapLimit<T, R>(items: readonly T[], limit: number, fn: (item: T) => Promise<R>): Promise<R[]> {
  const out = new Array<R>(items.length);
  let next = 0;
  let failure: { error: unknown } | null = null;
  const worker = async (): Promise<void> => {
    while (failure === null && next < items.length) {
      const i = next++;
      try {
        out[i] = await fn(items[i] as T);
      } catch (error) {
        failure ??= { error };
      }
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
  if (failure !== null) throw (failure as { error: unknown }).error;
  return out;
}
