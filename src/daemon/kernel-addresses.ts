/**
 * The daemon's kernel address index wired in (docs/daemon.md "The kernel address index"): the
 * {@link KernelIndex} of src/node/kernel-index.ts as a daemon part (its first read lands before the
 * plugin socket serves, its reads stop after the socket closed), and the hooks through which the
 * ADDs the daemon serves use it (src/cni/commands.ts {@link KernelAddressHooks}), with their log
 * lines and metrics:
 *
 * - `kernel address index complete` (info) / `kernel address index incomplete: ADDs do not use it`
 *   (warn) on the first read and whenever completeness changes; `kernel address index read`
 *   (debug) on every read, with its generation;
 * - `ADD skipped addresses configured in a network namespace with no reservation file` (warn) per
 *   ADD that skipped any, naming each address and its namespaces, and the addresses it returned;
 *   `ipwarden_allocation_kernel_conflicts_total{network}` counts the skipped addresses;
 * - `ADD did not use the kernel address index` (warn) per ADD that could not, with the reason;
 *   `ipwarden_allocation_kernel_index_unused_total{network,reason}` counts them.
 */
import { formatIP } from '../common/ip.ts';
import type { KernelAddressHooks, KernelAddressView } from '../cni/commands.ts';
import { describeHolders, KernelIndex, type KernelIndexOptions, type KernelIndexRead, type KernelIndexState } from '../node/kernel-index.ts';
import type { DaemonPartFactory } from './daemon.ts';
import type { Logger } from './log.ts';
import type { KernelIndexMetrics } from './metrics.ts';

/** The index, its daemon part and the ADD hooks over it. */
export interface KernelAddresses {
  readonly index: KernelIndex;
  /** Starts the index (resolves after its first read) and closes it. */
  readonly part: DaemonPartFactory;
  readonly hooks: KernelAddressHooks;
}

/**
 * How long an ADD that found only kernel-held addresses waits for the fresh read it asked for,
 * milliseconds, while it holds its network's lock; then the last read is judged as usual.
 */
export const FRESH_READ_WAIT_MS = 2000;

/**
 * Build the index (options as {@link KernelIndexOptions}, `onRead` taken here) with its log lines
 * (`log`, as `part: "kernel-index"`) and `metrics`.
 */
export function kernelAddresses(log: Logger, metrics: KernelIndexMetrics, opts: Omit<KernelIndexOptions, 'onRead'> = {}): KernelAddresses {
  const plog = log.child({ part: 'kernel-index' });
  const onRead = (r: KernelIndexRead, previous: KernelIndexRead | null): void => {
    metrics.recordRead({ result: r.incomplete === null ? 'complete' : 'incomplete', durationSeconds: r.durationMs / 1000, addresses: r.addresses.size });
    const fields = { generation: r.generation, addresses: r.addresses.size, namespaces: r.namespaces, durationMs: Math.round(r.durationMs * 10) / 10 };
    plog.debug({ ...fields, incomplete: r.incomplete }, 'kernel address index read');
    if (previous !== null && (previous.incomplete === null) === (r.incomplete === null)) return;
    if (r.incomplete === null) plog.info(fields, 'kernel address index complete');
    else plog.warn({ ...fields, reason: r.incomplete }, 'kernel address index incomplete: ADDs do not use it');
  };
  const index = new KernelIndex({ ...opts, onRead });
  metrics.watchAge(() => index.ageSeconds());

  const viewOf = (st: KernelIndexState, req: { readonly network: string; readonly containerId: string }): KernelAddressView | null => {
    if (!st.usable) {
      metrics.recordUnused(req.network, st.reason);
      plog.warn({ network: req.network, containerId: req.containerId, reason: st.why, generation: st.read?.generation ?? 0 }, 'ADD did not use the kernel address index');
      return null;
    }
    const addresses = st.read.addresses;
    return {
      heldBy: (ip) => {
        const holders = addresses.get(formatIP(ip));
        return holders === undefined || holders.length === 0 ? null : describeHolders(holders);
      },
    };
  };
  const hooks: KernelAddressHooks = {
    view: (req) => viewOf(index.state(), req),
    fresh: async (req) => {
      // The ADD holds its network's lock meanwhile: wait for the fresh read at most
      // FRESH_READ_WAIT_MS; past that the last read is judged as usual (closed: likewise).
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([
        index.refresh().then(
          () => undefined,
          () => undefined,
        ),
        new Promise<void>((resolve) => {
          timer = setTimeout(resolve, FRESH_READ_WAIT_MS);
          timer.unref();
        }),
      ]);
      clearTimeout(timer);
      return viewOf(index.state(), req);
    },
    skipped: (e) => {
      metrics.recordConflicts(e.network, e.conflicts.length);
      plog.warn(
        { network: e.network, containerId: e.containerId, conflicts: e.conflicts, addresses: e.addresses, generation: index.last?.generation ?? 0 },
        'ADD skipped addresses configured in a network namespace with no reservation file',
      );
    },
  };
  const part: DaemonPartFactory = async () => {
    await index.start();
    return { name: 'kernel-index', close: () => index.close() };
  };
  return { index, part, hooks };
}
