/**
 * Live sandboxes whose pod IP has no reservation (field report BR-13): the address was released
 * (a DEL ran, or the file was lost) while the sandbox kept running, so host-local would hand it
 * out again and two pods would share one IP. Pure: the caller asks the runtime for the pod IPs of
 * the READY sandboxes (CRI PodSandboxStatus) as part of the snapshot, reads the reservations, and
 * injects the CNI configurations' ranges; the locked re-reservation is `reReserve()` in
 * `apply.ts`.
 *
 * For every pod IP of a READY sandbox:
 * - a scanned network holds a reservation file of that IP owned by the same sandbox (any
 *   interface, legacy records included), or one recovered from the kernel
 *   (`recovered-net-<inode>`, standing for whichever pod uses it) → fine, nothing reported;
 * - a scanned network holds a file of that IP owned by another container, or an empty or
 *   unparseable one → `conflict` (a duplicate IP). Nothing is ever released for it, and that file
 *   is withheld from release ({@link PodIPCheck.withheld}) while the sandbox uses the address:
 *   releasing it would let the next ADD hand the address out once more;
 * - no scanned network holds it → `unreserved`, placed in the network whose configured ranges
 *   contain it (exactly one; several = `network: null`, only reported). Never by a guess (issue
 *   7): an address in no configured range is another IPAM's (a Calico primary network beside a
 *   Multus host-local one) and is not reported at all when configurations are known; with no
 *   configuration at all it is only reported (`network: null`).
 *
 * Scope: when only some network directories were scanned (`--network`), an unreserved address is
 * reported only when it is placed in a scanned network (it may be reserved in one not read).
 */
import { formatIP, parseIP } from '../common/ip.ts';
import { rangeFor } from '../ipam/range.ts';
import type { RangeSet } from '../ipam/types.ts';
import { RECOVERED_OWNER_PREFIX } from './evidence.ts';
import { compareIPText, type AnyVerdict, type PlanEntry } from './plan.ts';

/** The pod IPs of one READY sandbox as the runtime reports them (any text; non-IPs are ignored). */
export interface SandboxPodIPs {
  /** Full sandbox ID. */
  readonly sandbox: string;
  readonly ips: readonly string[];
}

/** A network's configured range sets (from the CNI configuration directory). */
export interface NetworkRanges {
  readonly network: string;
  readonly rangeSets: readonly RangeSet[];
}

/**
 * What was done about a finding: `reported` (nothing done: `leaks`, `gc --dry-run`, or no network
 * could be chosen), `re-reserved` (gc created the reservation for the sandbox), `conflict` (the
 * address is reserved for another container; nothing is done).
 */
export type PodIPAction = 're-reserved' | 'reported' | 'conflict';

/** One address of a live sandbox that is not reserved for it. */
export interface PodIPFinding {
  /** Full ID of the READY sandbox using the address. */
  readonly sandbox: string;
  /** Canonical IP text. */
  readonly ip: string;
  /**
   * For an unreserved address, the network it belongs to (where gc re-reserves it), or null when
   * that cannot be told; for a conflict, the network holding the other reservation.
   */
  readonly network: string | null;
  readonly action: PodIPAction;
  /** For a conflict: the container the address is reserved for (null: an empty or unparseable file); else null. */
  readonly reservedFor: string | null;
  /** One sentence, see {@link podIPMessage}. */
  readonly message: string;
}

/** Input of {@link checkPodIPs}. */
export interface PodIPCheckInput {
  /** Pod IPs of the READY sandboxes (NOT READY sandboxes have no working address to protect). */
  readonly podIPs: readonly SandboxPodIPs[];
  /** Every reservation read (any verdict) from the scanned networks. */
  readonly entries: readonly PlanEntry<AnyVerdict>[];
  /** Names of the networks whose reservations were read. */
  readonly scanned: readonly string[];
  /** Names of every network directory of the data dir. */
  readonly allNetworks: readonly string[];
  /**
   * Configured ranges per network name; called at most once, and only when some address has no
   * reservation (so the configuration directory is read only when needed).
   */
  readonly configured: () => readonly NetworkRanges[];
}

/** Result of {@link checkPodIPs}. */
export interface PodIPCheck {
  /** Sorted by IP numerically, then sandbox ID. `action` is `reported` or `conflict`. */
  readonly findings: PodIPFinding[];
  /** Reservations at a conflicting address (`<network>\0<ip>` keys): never released in this run. */
  readonly withheld: ReadonlySet<string>;
}

/** The key of {@link PodIPCheck.withheld} for a reservation. */
export function withheldKey(network: string, ip: string): string {
  return `${network}\0${ip}`;
}

/** The sentence of a finding (stable: tests and docs quote it). */
export function podIPMessage(kind: 'unreserved' | 'conflict', sandbox: string, ip: string, reservedFor: string | null): string {
  if (kind === 'unreserved') return `live sandbox ${sandbox} has no reservation for its IP ${ip}`;
  if (reservedFor === null) return `address ${ip} of live sandbox ${sandbox} is held by an empty or unparseable reservation file`;
  return `address ${ip} of live sandbox ${sandbox} is reserved for ${reservedFor}`;
}

/** Compare the pod IPs of live sandboxes with the reservations; see the module comment. */
export function checkPodIPs(input: PodIPCheckInput): PodIPCheck {
  const byIP = new Map<string, PlanEntry<AnyVerdict>[]>();
  for (const e of input.entries) {
    const list = byIP.get(e.ip);
    if (list === undefined) byIP.set(e.ip, [e]);
    else list.push(e);
  }
  const scanned = new Set(input.scanned);
  const filtered = input.allNetworks.some((n) => !scanned.has(n));
  let configured: readonly NetworkRanges[] | null = null;
  const findings: PodIPFinding[] = [];
  const withheld = new Set<string>();
  const seen = new Set<string>();
  for (const s of input.podIPs) {
    for (const text of s.ips) {
      const parsed = parseIP(text.trim());
      if (parsed === null) continue;
      const ip = formatIP(parsed);
      const key = `${s.sandbox}\0${ip}`;
      if (seen.has(key)) continue;
      seen.add(key);
      const holders = byIP.get(ip) ?? [];
      // Its own reservation, or one recovered from the kernel for whichever pod uses the address.
      if (holders.some((h) => h.containerId === s.sandbox || (h.containerId?.startsWith(RECOVERED_OWNER_PREFIX) ?? false))) continue;
      const other = holders[0];
      if (other !== undefined) {
        for (const h of holders) withheld.add(withheldKey(h.network, h.ip));
        findings.push({
          sandbox: s.sandbox,
          ip,
          network: other.network,
          action: 'conflict',
          reservedFor: other.containerId,
          message: podIPMessage('conflict', s.sandbox, ip, other.containerId),
        });
        continue;
      }
      configured ??= input.configured();
      const inRange = configured.filter((n) => n.rangeSets.some((rs) => rangeFor(rs, parsed) >= 0)).map((n) => n.network);
      let network: string | null;
      if (inRange.length > 0) {
        const here = [...new Set(inRange.filter((n) => scanned.has(n)))];
        if (here.length === 0) continue; // a network not read in this run (or without a directory here)
        network = here.length === 1 ? (here[0] as string) : null;
      } else {
        // In no configured range: another IPAM's address, unless nothing is configured at all.
        if (configured.length > 0 || filtered) continue;
        network = null;
      }
      findings.push({
        sandbox: s.sandbox,
        ip,
        network,
        action: 'reported',
        reservedFor: null,
        message: podIPMessage('unreserved', s.sandbox, ip, null),
      });
    }
  }
  findings.sort((a, b) => compareIPText(a.ip, b.ip) || (a.sandbox < b.sandbox ? -1 : a.sandbox > b.sandbox ? 1 : 0));
  return { findings, withheld };
}
