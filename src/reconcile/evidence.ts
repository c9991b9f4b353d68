/**
 * The reconciler's view of the strongest witness: the kernel (issue 7, ARCHITECTURE.md
 * "Reconciler safety rules"). An address configured on an interface in any network namespace of
 * the node is in use, and a container whose CNI operation is running right now (a process with
 * `CNI_CONTAINERID` in its environment) owns its reservations, whatever any runtime says and
 * whatever the clocks say. Evidence that could not be read completely protects everything.
 *
 * This is only the shape the pure rules need; `src/node/kernel-evidence.ts` reads it from
 * `/proc` and `/run/netns` and its `KernelEvidence` satisfies it structurally. The plugin and the
 * CLI inject it, tests pass literal values.
 */

/** Where an address was seen configured: one network namespace. */
export interface EvidenceHolder {
  /** Namespace identity, `net:[4026532301]` (as `readlink /proc/PID/ns/net` prints it). */
  readonly netns: string;
  /** How it was reached: `/proc/1234/ns/net` or a pinned file such as `/run/netns/cni-…`. */
  readonly via: string;
}

/** A CNI operation in flight: a running process whose environment names the container. */
export interface EvidenceOperation {
  readonly pid: number;
  /** `CNI_COMMAND` of that process (`ADD`, `DEL`, …). */
  readonly command: string;
}

/** What the kernel says is in use. */
export interface UseEvidence {
  /** Canonical IP text → every namespace where it is configured (absent = configured nowhere). */
  readonly addresses: ReadonlyMap<string, readonly EvidenceHolder[]>;
  /** `CNI_CONTAINERID` → the running processes of its CNI operation (absent = none running). */
  readonly inFlight: ReadonlyMap<string, readonly EvidenceOperation[]>;
  /**
   * null when every namespace and process could be read; otherwise why not (one line). Then the
   * rules release nothing (`unknown`): an address in a namespace we could not see may be in use.
   */
  readonly incomplete: string | null;
  /**
   * The pinned-namespace directories (`/run/netns`…) that could not be read completely, also as
   * the host sees them (`KernelEvidence.unreadPinDirs`, src/node/kernel-evidence.ts); absent or []
   * when none. Named by doctor; the rules go by `incomplete` alone.
   */
  readonly unreadPinDirs?: readonly string[];
}

/**
 * Reads the kernel evidence: synchronously (`readKernelEvidence`, the CLI and the standalone
 * plugin) or as a promise (`readKernelEvidenceAsync`, the daemon, whose event loop must keep
 * answering the plugin socket while a read of every network namespace runs). Callers await it.
 */
export type EvidenceReader = () => UseEvidence | Promise<UseEvidence>;

/** Complete evidence of a node where nothing is configured and nothing is in flight (tests, fixtures). */
export const NOTHING_IN_USE: UseEvidence = Object.freeze({
  addresses: new Map<string, readonly EvidenceHolder[]>(),
  inFlight: new Map<string, readonly EvidenceOperation[]>(),
  incomplete: null,
});

/** Evidence that could not be read at all, with `why` (one line). Protects every reservation. */
export function unreadableEvidence(why: string): UseEvidence {
  return { addresses: new Map(), inFlight: new Map(), incomplete: why };
}

/**
 * Why the kernel says `ip` (owned by `containerId`, null for a corrupt record) is in use, or null
 * when it does not. The text names the holders (`configured in net:[4026532301] via
 * /proc/812/ns/net`) or the running operation (`a CNI ADD for its container is running (pid 77)`).
 */
export function inUseReason(ev: UseEvidence, ip: string, containerId: string | null): string | null {
  const holders = ev.addresses.get(ip);
  if (holders !== undefined && holders.length > 0) {
    const shown = holders.slice(0, 3).map((h) => `${h.netns} via ${h.via}`).join(', ');
    const more = holders.length > 3 ? ` and ${holders.length - 3} more` : '';
    return `the address is configured in ${holders.length === 1 ? 'network namespace' : `${holders.length} network namespaces:`} ${shown}${more}`;
  }
  if (containerId !== null) {
    const ops = ev.inFlight.get(containerId);
    if (ops !== undefined && ops.length > 0) {
      const op = ops[0] as EvidenceOperation;
      return `a CNI ${op.command} for its container is running (pid ${op.pid})`;
    }
  }
  return null;
}

/**
 * Prefix of the owner ID of a reservation recovered from the kernel alone (`recovered-net-<inode>`,
 * reclaim.ts): it stands for whichever pod uses the address in that namespace.
 */
export const RECOVERED_OWNER_PREFIX = 'recovered-net-';
