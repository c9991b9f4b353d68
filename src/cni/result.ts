/**
 * IPAM results and their encoding in each spec version.
 *
 * Shapes (containernetworking/cni pkg/types/020, 040, 100; SPEC.md §ADD Success, §Delegated
 * plugins (IPAM)): an IPAM plugin returns an abbreviated result without `interfaces`.
 * - 0.1.0 / 0.2.0: `{cniVersion, ip4?: {ip, gateway?, routes?}, ip6?: {...}, dns}`; routes are split
 *   by the family of their `dst`.
 * - 0.3.0 / 0.3.1 / 0.4.0: `{cniVersion, ips: [{version: "4"|"6", address, gateway?}], routes?, dns}`.
 * - 1.0.0 / 1.1.0: as 0.4.0 without `ips[].version`, and without `dns` when it is empty; 1.1.0
 *   routes may carry mtu, advmss, priority, table, scope.
 * Key order and the 4-space indentation follow current upstream host-local's output, so a diff of
 * the two plugins' stdout is empty. For 1.0.0 / 1.1.0 that is libcni's `types100.Result.MarshalJSON`
 * (containernetworking/cni#1039, merged November 2023; host-local prints it so since v1.6.0, as
 * issue 17's run of the upstream suites found): it drops an
 * empty `dns` (`DNS.IsEmpty()`) by a round trip through a Go map, so every object's keys come out
 * sorted. Older releases (Debian's 1.1.1) print `"dns": {}` and struct order; the 0.x encoders
 * never changed and still print `"dns": {}` (docs/compatibility.md).
 */
import type { DNS } from '../ipam/types.ts';
import { compareVersions } from './version.ts';

/** One address of a result. `address` is CIDR text (`10.1.0.2/24`). */
export interface ResultIP {
  readonly family: 4 | 6;
  readonly address: string;
  readonly gateway?: string;
}

/** A route as the config gave it (only the spec's keys are emitted). */
export interface ResultRoute {
  readonly dst: string;
  readonly gw?: string;
  readonly [k: string]: unknown;
}

/** The version-independent result of an ADD. */
export interface IPAMResult {
  readonly ips: readonly ResultIP[];
  readonly routes: readonly ResultRoute[];
  readonly dns: DNS;
}

const ROUTE_KEYS_100 = ['dst', 'gw'] as const;
const ROUTE_KEYS_110 = ['dst', 'gw', 'mtu', 'advmss', 'priority', 'table', 'scope'] as const;

function pickRoute(r: ResultRoute, keys: readonly string[]): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const k of keys) if (r[k] !== undefined) out[k] = r[k];
  return out;
}

function dnsObject(d: DNS): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  if (d.nameservers !== undefined && d.nameservers.length > 0) out['nameservers'] = d.nameservers;
  if (d.domain !== undefined && d.domain !== '') out['domain'] = d.domain;
  if (d.search !== undefined && d.search.length > 0) out['search'] = d.search;
  if (d.options !== undefined && d.options.length > 0) out['options'] = d.options;
  return out;
}

/** Family of a route destination (`0.0.0.0/0` → 4, `::/0` → 6). */
function routeFamily(dst: string): 4 | 6 {
  return dst.includes(':') ? 6 : 4;
}

/**
 * Encode `r` as the JSON object of spec version `cniVersion` (one of SUPPORTED_VERSIONS).
 * For 0.1.0/0.2.0 at most one address per family exists (the config loader refuses more).
 */
export function encodeResult(r: IPAMResult, cniVersion: string): Record<string, unknown> {
  if (compareVersions(cniVersion, '0.3.0') < 0) {
    const out: Record<string, unknown> = { cniVersion };
    for (const fam of [4, 6] as const) {
      const ip = r.ips.find((x) => x.family === fam);
      if (ip === undefined) continue;
      const o: Record<string, unknown> = { ip: ip.address };
      if (ip.gateway !== undefined) o['gateway'] = ip.gateway;
      const routes = r.routes.filter((rt) => routeFamily(rt.dst) === fam).map((rt) => pickRoute(rt, ROUTE_KEYS_100));
      if (routes.length > 0) o['routes'] = routes;
      out[fam === 4 ? 'ip4' : 'ip6'] = o;
    }
    out['dns'] = dnsObject(r.dns);
    return out;
  }
  const withVersion = compareVersions(cniVersion, '1.0.0') < 0;
  const routeKeys = compareVersions(cniVersion, '1.1.0') >= 0 ? ROUTE_KEYS_110 : ROUTE_KEYS_100;
  const out: Record<string, unknown> = { cniVersion };
  out['ips'] = r.ips.map((ip) => {
    const o: Record<string, unknown> = {};
    if (withVersion) o['version'] = String(ip.family);
    o['address'] = ip.address;
    if (ip.gateway !== undefined) o['gateway'] = ip.gateway;
    return o;
  });
  if (r.routes.length > 0) out['routes'] = r.routes.map((rt) => pickRoute(rt, routeKeys));
  const dns = dnsObject(r.dns);
  if (withVersion) {
    out['dns'] = dns;
    return out;
  }
  if (Object.keys(dns).length > 0) out['dns'] = dns;
  return sortedKeys(out) as Record<string, unknown>;
}

/**
 * `v` with the keys of every object in it sorted by UTF-16 code units (Go's `encoding/json` sorts
 * map keys by bytes; the keys here are ASCII, so the orders agree). Arrays keep their order.
 */
function sortedKeys(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(sortedKeys);
  if (v === null || typeof v !== 'object') return v;
  const out: Record<string, unknown> = {};
  for (const k of Object.keys(v).sort()) out[k] = sortedKeys((v as Record<string, unknown>)[k]);
  return out;
}

/** Serialise a result or error object the way upstream plugins print it (4-space indent). */
export function formatJSON(o: unknown): string {
  return JSON.stringify(o, null, 4);
}
