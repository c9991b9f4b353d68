/**
 * Value types shared by the pure IPAM modules (config, IP math, ranges, allocator).
 * No I/O here or in any module of `src/ipam/` except through an injected `Store`.
 */

import type { IP, Subnet } from '../common/ip.ts';
import type { PoolConfig } from './pool-config.ts';

/** {@link IP} and {@link Subnet} are defined with the IP helpers (`src/common/ip.ts`). */
export type { IP, Subnet };

/**
 * One range of a range set, canonicalised like host-local `Range.Canonicalize`
 * (plugins/ipam/host-local/backend/allocator/range.go): `gateway` defaults to subnet+1,
 * `rangeStart` to subnet+1, `rangeEnd` to the last address (minus one for IPv4: broadcast).
 */
export interface Range {
  readonly subnet: Subnet;
  /** First allocatable address, inclusive. */
  readonly rangeStart: IP;
  /** Last allocatable address, inclusive. */
  readonly rangeEnd: IP;
  /** The gateway, skipped by the allocator and returned in results; always set after canonicalisation. */
  readonly gateway: IP;
}

/** A range set: a pool of disjoint ranges of one family that together give one IP per ADD. */
export type RangeSet = readonly Range[];

/**
 * A route from the config for the result: `dst` and `gw` in Go's canonical text (as host-local
 * re-renders them), plus any extra keys as given.
 */
export type Route = Readonly<Record<string, unknown>> & { readonly dst: string; readonly gw?: string };

/** DNS settings from `resolvConf` (result `dns` object). */
export interface DNS {
  nameservers?: string[];
  domain?: string;
  search?: string[];
  options?: string[];
}

/**
 * A fully parsed and validated IPAM configuration (house style 4: parse once, purely).
 * Nothing downstream re-reads the raw JSON.
 */
export interface IPAMConfig {
  /** The request's `cniVersion` (`"0.1.0"` when absent, as libcni's decoder does). */
  readonly cniVersion: string;
  /** Network name (top-level `name`), validated against `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`. */
  readonly name: string;
  /** `ipam.type`. */
  readonly type: string;
  /** `ipam.dataDir`, absolute; default `/var/lib/cni/networks`. */
  readonly dataDir: string;
  /** Range sets in host-local order: runtimeConfig.ipRanges, then legacy top-level range, then `ranges`. */
  readonly rangeSets: readonly RangeSet[];
  /** `ipam.routes`, `dst`/`gw` re-rendered as host-local prints them. */
  readonly routes: readonly Route[];
  /** `ipam.resolvConf` path, or null. Read and parsed at the edge, not here. */
  readonly resolvConf: string | null;
  /** Static requests: CNI_ARGS `IP=`, then `args.cni.ips`, then `runtimeConfig.ips`, deduplicated. */
  readonly requestedIPs: readonly IP[];
  /** ipwarden: release leaked reservations and retry once when a range set is exhausted (default true). */
  readonly reclaimOnExhaustion: boolean;
  /**
   * ipwarden: STATUS fails (code 50) when a range set has no free and no reclaimable address
   * (ipam `failStatusOnExhaustion`, default false). Off by default: containerd 2.x turns a
   * failing STATUS into NetworkReady=false, and kubelet then evicts every pod of the node.
   */
  readonly failStatusOnExhaustion: boolean;
  /** ipwarden: grace period for reclaim, seconds (ipam `leakGracePeriod`, Go duration, default 5m). */
  readonly leakGracePeriodSeconds: number;
  /** ipwarden: CRI endpoint for reclaim (ipam `runtimeEndpoint`), or null for the CLI defaults. */
  readonly runtimeEndpoint: string | null;
  /** ipwarden: how long to wait for `DIR/lock`, seconds (ipam `lockTimeout`, Go duration, default 30s). */
  readonly lockTimeoutSeconds: number;
  /**
   * ipwarden: the cluster pool (`ipam.pool`, src/ipam/pool-config.ts), or null/absent for a
   * node-local network (the host-local files). With a pool the ranges are shared through etcd.
   */
  readonly pool?: PoolConfig | null;
}

/**
 * The part of a config that DEL, GC and STATUS need even when `ranges` no longer parses:
 * where the reservations live and which version to answer in.
 */
export interface NetworkIdentity {
  readonly cniVersion: string;
  readonly name: string;
  readonly dataDir: string;
  readonly lockTimeoutSeconds: number;
  /** `ipam.pool` as in {@link IPAMConfig.pool}: DEL of a pool network releases in etcd. */
  readonly pool?: PoolConfig | null;
}
