/**
 * IPAM configuration loading: stdin bytes + `CNI_ARGS` → a validated {@link IPAMConfig}, parsed
 * once (house style 4). The counterpart of host-local `allocator.LoadIPAMConfig`
 * (plugins/ipam/host-local/backend/allocator/config.go), with host-local's defaults, order and
 * messages (checked against the v1.1.1 binary), plus ipwarden's own `ipam` keys. Also the libcni
 * input validators (containernetworking/cni pkg/utils/utils.go). Pure.
 *
 * Error codes:
 * - stdin is not JSON (or not a JSON object): `IPAM_DECODE` (CNI 6);
 * - a key of the wrong JSON type, a bad value, or any host-local validation failure:
 *   `IPAM_INVALID_CONFIG` (CNI 7) — host-local's text where it has one (then `details` names the
 *   key), else a message naming the key (`ipam.dataDir must be ...`), prefixed with
 *   `invalid range set <i>: ` for anything inside a range set;
 * - `CNI_ARGS` problems: `IPAM_INVALID_ARGS` (CNI 4), libcni's text (see `cniargs.ts`).
 *
 * JSON decoding follows Go's `encoding/json` where it matters for compatibility: object keys match
 * field names case-insensitively (an exact match is preferred), unknown keys are ignored, `null`
 * means "absent" (except for `subnet`, where host-local fails with `invalid CIDR address: `), and
 * an empty string for an IP field means "absent".
 *
 * Deliberate differences from host-local, each guarded by a test:
 * - `dataDir` must be an absolute path without NUL bytes (host-local accepts anything and builds
 *   paths from it);
 * - a route needs a valid `dst` (host-local would print `"dst": "<nil>"`);
 * - a `null` entry in `args.cni.ips` / `runtimeConfig.ips` is `cannot understand ip: IP <nil> not
 *   v4 nor v6` (host-local 1.1.1 crashes with a nil-pointer panic);
 * - requested IPs are kept in request order (host-local stores them in a Go map, so which one is
 *   tried first for a range set, and the order in `failed to allocate all requested IPs`, vary);
 * - type errors name the JSON key instead of Go struct types.
 */

import { textByteLength } from '../common/bytes.ts';
import { parseDuration } from '../common/duration.ts';
import { DEFAULT_DATA_DIR, CNI_NAME_RE, GO_SPACE_RE } from '../common/names.ts';
import { parseRuntimeEndpoint } from '../common/endpoint.ts';
import { AppError, isAppError } from '../common/errors.ts';
import { parseCniArgs, parseIPWithOptionalPrefix } from './cniargs.ts';
import type { ParsedCIDR } from '../common/ip.ts';
import { familyBits, formatIP, parseCIDR, parseIP } from '../common/ip.ts';
import type { RawRange } from './range.ts';
import { canonicalizeRangeSet, rangeSetOverlaps } from './range.ts';
import type { IP, IPAMConfig, NetworkIdentity, RangeSet, Route } from './types.ts';
import { decodePoolConfig, misplacedPoolKey } from './pool-config.ts';

/** host-local's default `dataDir` (defined in `src/common/names.ts`). */
export { DEFAULT_DATA_DIR };
/** The version libcni assumes, and answers in, when a config has no `cniVersion`. */
export const DEFAULT_CNI_VERSION = '0.1.0';
/** Default of `ipam.leakGracePeriod` (Go duration string). */
export const DEFAULT_LEAK_GRACE_PERIOD = '5m';
/** Default of `ipam.lockTimeout` (Go duration string). */
export const DEFAULT_LOCK_TIMEOUT = '30s';

type JsonObject = Record<string, unknown>;

// ---------------------------------------------------------------------------------------------
// libcni validators
// ---------------------------------------------------------------------------------------------

/** libcni `cniValidNameChars`: container IDs and network names. */
const CNI_NAME = CNI_NAME_RE;
/** Go `unicode.IsSpace`. */
const GO_SPACE = GO_SPACE_RE;

/**
 * Validate `CNI_CONTAINERID` like libcni `utils.ValidateContainerID`.
 * @throws AppError IPAM_UNKNOWN_CONTAINER `missing containerID` (CNI 3) when empty;
 *   IPAM_INVALID_ENV `invalid characters in containerID` (CNI 4, details = the ID) when it does
 *   not match `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`.
 */
export function validateContainerId(id: string): void {
  if (id === '') throw new AppError('IPAM_UNKNOWN_CONTAINER', 'missing containerID', { details: '' });
  if (!CNI_NAME.test(id)) throw new AppError('IPAM_INVALID_ENV', 'invalid characters in containerID', { details: id });
}

/**
 * Validate `CNI_IFNAME` like libcni `utils.ValidateInterfaceName`: 1–15 bytes (counted as
 * `textToBytes` writes them: an escaped non-UTF-8 byte is one byte), not `.` or `..`, no `/`, `:`
 * or whitespace.
 * @throws AppError IPAM_INVALID_ENV (CNI 4): `interface name is empty`; `interface name is too
 *   long` (details `interface name should be less than 16 characters`); `interface name is . or
 *   ..`; `interface name contains / or : or whitespace characters`.
 */
export function validateIfname(name: string): void {
  if (name.length === 0) throw new AppError('IPAM_INVALID_ENV', 'interface name is empty', { details: '' });
  if (textByteLength(name) > 15) {
    throw new AppError('IPAM_INVALID_ENV', 'interface name is too long', {
      details: 'interface name should be less than 16 characters',
    });
  }
  if (name === '.' || name === '..') {
    throw new AppError('IPAM_INVALID_ENV', 'interface name is . or ..', { details: '' });
  }
  if (name.includes('/') || name.includes(':') || GO_SPACE.test(name)) {
    throw new AppError('IPAM_INVALID_ENV', 'interface name contains / or : or whitespace characters', {
      details: '',
    });
  }
}

/**
 * Validate the network `name` like libcni `utils.ValidateNetworkName`.
 * @throws AppError IPAM_INVALID_CONFIG (CNI 7): `missing network name:` (libcni's text, colon
 *   included) when empty; `invalid characters found in network name` (details = the name).
 */
export function validateNetworkName(name: string): void {
  if (name === '') throw new AppError('IPAM_INVALID_CONFIG', 'missing network name:', { details: '' });
  if (!CNI_NAME.test(name)) {
    throw new AppError('IPAM_INVALID_CONFIG', 'invalid characters found in network name', { details: name });
  }
}

// ---------------------------------------------------------------------------------------------
// JSON helpers (Go encoding/json flavoured)
// ---------------------------------------------------------------------------------------------

function jsonType(v: unknown): string {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'array';
  return typeof v;
}

function isObject(v: unknown): v is JsonObject {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function invalidConfig(msg: string, details?: string): AppError {
  return new AppError('IPAM_INVALID_CONFIG', msg, details === undefined ? {} : { details });
}

/** Wrong JSON type for `path`, optionally inside range set `setIndex`. */
function typeError(path: string, want: string, got: unknown, setIndex?: number): AppError {
  const msg = `${path} must be ${want}, got ${jsonType(got)}`;
  return invalidConfig(setIndex === undefined ? msg : `invalid range set ${setIndex}: ${msg}`);
}

/**
 * Every key of the `ipam` section {@link loadIPAMConfig} reads: host-local's own (`type`, `ranges`,
 * `routes`, `dataDir`, `resolvConf` and the legacy single range `subnet`, `rangeStart`, `rangeEnd`,
 * `gateway`: plugins/ipam/host-local/backend/allocator/config.go `IPAMConfig`) and ipwarden's.
 * Matched ignoring ASCII case, as Go's JSON decoding matches them; any other key is ignored, as
 * host-local ignores it (`doctor` names them: a typo in one of ipwarden's keys is silent otherwise).
 */
export const IPAM_KEYS: readonly string[] = [
  'type',
  'ranges',
  'routes',
  'dataDir',
  'resolvConf',
  'subnet',
  'rangeStart',
  'rangeEnd',
  'gateway',
  'reclaimOnExhaustion',
  'failStatusOnExhaustion',
  'leakGracePeriod',
  'runtimeEndpoint',
  'lockTimeout',
  'pool',
  'nodeName',
];

/** The keys of an `ipam` object that {@link IPAM_KEYS} does not name (ASCII case ignored), in their order. */
export function unknownIpamKeys(ipam: Readonly<Record<string, unknown>>): string[] {
  const known = new Set(IPAM_KEYS.map((k) => k.toLowerCase()));
  return Object.keys(ipam).filter((k) => !known.has(k.toLowerCase()));
}

/**
 * Go-style field lookup: the exact key if present, else a key equal to `name` ignoring ASCII
 * case (the last such key, as later keys overwrite earlier ones in Go).
 */
function field(obj: JsonObject, name: string): unknown {
  if (Object.prototype.hasOwnProperty.call(obj, name)) return obj[name];
  const lower = name.toLowerCase();
  let found: unknown = undefined;
  for (const k of Object.keys(obj)) if (k.toLowerCase() === lower) found = obj[k];
  return found;
}

/** A string field; undefined when absent or null. */
function optString(obj: JsonObject, name: string, path: string): string | undefined {
  const v = field(obj, name);
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'string') throw typeError(path, 'a string', v);
  return v;
}

/** An object field; undefined when absent or null. */
function optObject(obj: JsonObject, name: string, path: string): JsonObject | undefined {
  const v = field(obj, name);
  if (v === undefined || v === null) return undefined;
  if (!isObject(v)) throw typeError(path, 'an object', v);
  return v;
}

/** An array field; undefined when absent or null. */
function optArray(obj: JsonObject, name: string, path: string, setIndex?: number): unknown[] | undefined {
  const v = field(obj, name);
  if (v === undefined || v === null) return undefined;
  if (!Array.isArray(v)) throw typeError(path, 'an array', v, setIndex);
  return v;
}

function decode(stdin: string | Uint8Array): JsonObject {
  const text = typeof stdin === 'string' ? stdin : new TextDecoder('utf-8').decode(stdin);
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch (e) {
    // The engine's text varies between Node versions: keep the message stable, the text in details.
    throw new AppError('IPAM_DECODE', 'error unmarshall network config: not valid JSON', {
      details: (e as Error).message,
      cause: e,
    });
  }
  if (!isObject(doc)) {
    throw new AppError(
      'IPAM_DECODE',
      `error unmarshall network config: the network config must be a JSON object, got ${jsonType(doc)}`,
    );
  }
  return doc;
}

// ---------------------------------------------------------------------------------------------
// Field decoders
// ---------------------------------------------------------------------------------------------

/** An IP field of a range (Go `net.IP` text): absent, null or "" → null. */
function decodeRangeIP(obj: JsonObject, name: string, path: string, setIndex?: number): IP | null {
  const v = field(obj, name);
  if (v === undefined || v === null || v === '') return null;
  if (typeof v !== 'string') throw typeError(path, 'a string', v, setIndex);
  const ip = parseIP(v);
  if (ip === null) throw invalidConfig(`invalid IP address: ${v}`, `at ${path}`);
  return ip;
}

/** `subnet` (cni `types.IPNet`): absent → null; null or bad text → `invalid CIDR address: <text>`. */
function decodeSubnet(obj: JsonObject, path: string, setIndex: number | undefined): ParsedCIDR | null {
  const v = field(obj, 'subnet');
  if (v === undefined) return null;
  if (v === null) throw invalidConfig('invalid CIDR address: ', `at ${path}`);
  if (typeof v !== 'string') throw typeError(path, 'a string', v, setIndex);
  const c = parseCIDR(v);
  if (c === null) throw invalidConfig(`invalid CIDR address: ${v}`, `at ${path}`);
  return c;
}

function decodeRange(v: unknown, path: string, setIndex: number): RawRange {
  if (!isObject(v)) throw typeError(path, 'an object', v, setIndex);
  return {
    subnet: decodeSubnet(v, `${path}.subnet`, setIndex),
    rangeStart: decodeRangeIP(v, 'rangeStart', `${path}.rangeStart`, setIndex),
    rangeEnd: decodeRangeIP(v, 'rangeEnd', `${path}.rangeEnd`, setIndex),
    gateway: decodeRangeIP(v, 'gateway', `${path}.gateway`, setIndex),
  };
}

/** A list of range sets (`ipam.ranges`, `runtimeConfig.ipRanges`); `firstIndex` = combined index of element 0. */
function decodeRangeSets(list: unknown[], path: string, firstIndex: number): RawRange[][] {
  return list.map((set, k) => {
    const idx = firstIndex + k;
    const setPath = `${path}[${k}]`;
    if (set === null) return []; // Go: a null RangeSet is an empty one
    if (!Array.isArray(set)) {
      throw invalidConfig(
        `invalid range set ${idx}: ${setPath} must be an array of ranges (ranges is a list of range sets), got ${jsonType(set)}`,
      );
    }
    return set.map((r, j) => decodeRange(r, `${setPath}[${j}]`, idx));
  });
}

/**
 * `ipam.runtimeEndpoint` checked when the config is read (not only when a range runs out and
 * self-healing needs it): `unix:///path` or `/path`, normalised to `unix:///path`.
 */
function decodeRuntimeEndpoint(v: string | null): string | null {
  if (v === null) return null;
  try {
    return parseRuntimeEndpoint(v).url;
  } catch (e) {
    throw new AppError('IPAM_INVALID_CONFIG', `ipam.runtimeEndpoint: ${e instanceof Error ? e.message : String(e)}`);
  }
}

/**
 * A requested IP (`args.cni.ips[]`, `runtimeConfig.ips[]`, plugins `pkg/ip.IP`):
 * `<ip>[/<prefix>]`, prefix ignored. "" and null decode to null, which the caller rejects later
 * (host-local: `cannot understand ip: IP <nil> not v4 nor v6`, after CNI_ARGS are parsed).
 */
function decodeRequestedIP(v: unknown, path: string): { ip: IP | null; path: string } {
  if (v === null || v === '') return { ip: null, path };
  if (typeof v !== 'string') throw typeError(path, 'a string', v);
  const ip = parseIPWithOptionalPrefix(v);
  if (ip === null) throw invalidConfig(`invalid IP address ${v}`, `at ${path}`);
  return { ip, path };
}

/**
 * A route destination as host-local prints it: libcni decodes `dst` with `net.ParseCIDR` but keeps
 * the address as written (host bits included), and prints it with `net.IPNet.String()`: the
 * address in Go's canonical text (lower case, compressed IPv6, an IPv4-mapped address as IPv4)
 * and the prefix length; an IPv4-mapped address under an IPv6 prefix keeps the prefix's last 32
 * bits (`::ffff:10.1.0.0/104` → `10.1.0.0/8`, below /96 → `/0`). Checked against the real binary
 * in test/interop/differential.test.ts.
 */
function routeDstText(c: ParsedCIDR): string {
  const prefix = c.maskBits === familyBits(c.ip.family) ? c.subnet.prefix : Math.max(0, c.subnet.prefix - 96);
  return `${formatIP(c.ip)}/${prefix}`;
}

/**
 * `ipam.routes`: each `dst` and `gw` re-rendered through Go's IP types, as host-local prints them
 * (`FD00:0::/8` → `fd00::/8`, gw `FD00::0001` → `fd00::1`); other keys as given. A `gw` of `""` or
 * null is absent (Go: a nil `net.IP`, omitted). Keys match case-insensitively (Go's decoder).
 */
function decodeRoutes(ipam: JsonObject): Route[] {
  const list = optArray(ipam, 'routes', 'ipam.routes') ?? [];
  return list.map((r, i) => {
    const path = `ipam.routes[${i}]`;
    if (!isObject(r)) throw typeError(path, 'an object', r);
    const dst = field(r, 'dst');
    if (typeof dst !== 'string') throw typeError(`${path}.dst`, 'a string', dst === undefined ? null : dst);
    const cidr = parseCIDR(dst);
    if (cidr === null) throw invalidConfig(`invalid CIDR address: ${dst}`, `at ${path}.dst`);
    const out: Record<string, unknown> = { ...r, dst: routeDstText(cidr) };
    delete out['gw'];
    const gw = field(r, 'gw');
    if (gw !== undefined && gw !== null && gw !== '') {
      if (typeof gw !== 'string') throw typeError(`${path}.gw`, 'a string', gw);
      const ip = parseIP(gw);
      if (ip === null) throw invalidConfig(`invalid IP address: ${gw}`, `at ${path}.gw`);
      out['gw'] = formatIP(ip);
    }
    return out as Route;
  });
}

function decodeDataDir(ipam: JsonObject): string {
  const v = optString(ipam, 'dataDir', 'ipam.dataDir');
  if (v === undefined || v === '') return DEFAULT_DATA_DIR;
  if (!v.startsWith('/') || v.includes('\0')) {
    throw invalidConfig(`ipam.dataDir must be an absolute path without NUL bytes, got ${JSON.stringify(v)}`);
  }
  return v;
}

function decodeDuration(ipam: JsonObject, name: string, dflt: string): number {
  const path = `ipam.${name}`;
  const v = optString(ipam, name, path) ?? dflt;
  let seconds: number;
  try {
    seconds = parseDuration(v);
  } catch (e) {
    if (isAppError(e)) throw invalidConfig(`${path}: ${e.message}`, e.details);
    throw e;
  }
  if (seconds < 0) throw invalidConfig(`${path} must not be negative, got ${JSON.stringify(v)}`);
  return seconds;
}

function decodeBool(ipam: JsonObject, name: string, dflt: boolean): boolean {
  const v = field(ipam, name);
  if (v === undefined || v === null) return dflt;
  if (typeof v !== 'boolean') throw typeError(`ipam.${name}`, 'a boolean', v);
  return v;
}

/** libcni `version.ParseVersion` ("" is 0.1.0); null when unparseable. */
function parseVersion(v: string): [number, number, number] | null {
  if (v === '') return [0, 1, 0];
  const parts = v.split('.');
  if (parts.length > 3) return null;
  const nums: number[] = [];
  for (const p of parts) {
    if (!/^[+-]?[0-9]+$/.test(p)) return null;
    nums.push(Number(p));
  }
  return [nums[0] ?? 0, nums[1] ?? 0, nums[2] ?? 0];
}

/** libcni `version.GreaterThanOrEqualTo`, with "cannot parse" meaning false (as host-local uses it). */
function versionAtLeast(v: string, min: string): boolean {
  const a = parseVersion(v);
  const b = parseVersion(min);
  if (a === null || b === null) return false;
  for (let i = 0; i < 3; i++) {
    if ((a[i] as number) !== (b[i] as number)) return (a[i] as number) > (b[i] as number);
  }
  return true;
}

function decodeName(doc: JsonObject): string {
  const name = optString(doc, 'name', 'name') ?? '';
  validateNetworkName(name);
  return name;
}

// ---------------------------------------------------------------------------------------------
// Entry points
// ---------------------------------------------------------------------------------------------

/**
 * Parse and validate a request's network config for ADD and CHECK (host-local
 * `LoadIPAMConfig` plus ipwarden's keys).
 *
 * - `name` (top level) validated by {@link validateNetworkName};
 * - `cniVersion` as given, `"0.1.0"` when absent (what host-local answers in);
 * - range sets in host-local's order: `runtimeConfig.ipRanges`, then the legacy top-level
 *   `ipam.subnet`/`rangeStart`/`rangeEnd`/`gateway` range (only when `subnet` is given) as its
 *   own set, then `ipam.ranges` (an array of range sets, each an array of ranges; a flat list of
 *   range objects is an error). Errors: `no IP ranges specified`, `invalid range set <i>: <msg>`,
 *   `CNI version <v> does not support more than 1 address per family` (cniVersion < 0.3.0; `<v>`
 *   is the raw value, empty when absent), `range set <i> overlaps with <j>`;
 * - `ipam.routes` with `dst`/`gw` rendered as host-local prints them (Go's IP text); `ipam.dataDir` (default `/var/lib/cni/networks`; must be absolute);
 *   `ipam.resolvConf` (path, or null);
 * - requested IPs: `CNI_ARGS` `IP=`, then `args.cni.ips`, then `runtimeConfig.ips`, each
 *   `<ip>[/<prefix>]` with the prefix ignored, deduplicated keeping the first occurrence;
 * - ipwarden keys: `ipam.reclaimOnExhaustion` (boolean, default true),
 *   `ipam.failStatusOnExhaustion` (boolean, default false), `ipam.leakGracePeriod`
 *   (Go duration, default `5m`), `ipam.runtimeEndpoint` (string, default null),
 *   `ipam.lockTimeout` (Go duration, default `30s`); durations must not be negative;
 * - `ipam.pool` and `ipam.nodeName` (src/ipam/pool-config.ts; a pool refuses static requests:
 *   `ipam.pool does not support static IP requests (CNI_ARGS IP=, args.cni.ips, runtimeConfig.ips)`);
 *   an `ipam` of type `ipwarden` without `pool` but with a near miss of it (`pools`) or with `pool`
 *   at the config's top level is refused (`misplacedPoolKey`; {@link loadNetworkIdentity} does not
 *   refuse it, so the DEL of such a config releases node-local reservations as before).
 *
 * @param stdin the request's stdin (UTF-8 JSON)
 * @param cniArgs `CNI_ARGS`, or undefined when unset
 * @throws AppError IPAM_DECODE, IPAM_INVALID_CONFIG, IPAM_INVALID_ARGS (see module comment)
 */
export function loadIPAMConfig(stdin: string | Uint8Array, cniArgs: string | undefined): IPAMConfig {
  const doc = decode(stdin);
  const name = decodeName(doc);
  const rawVersion = optString(doc, 'cniVersion', 'cniVersion') ?? '';

  // --- decode (type and text errors), like Go's json.Unmarshal pass ---
  const ipam = optObject(doc, 'ipam', 'ipam');
  const runtimeConfig = optObject(doc, 'runtimeConfig', 'runtimeConfig');
  const rcRanges = runtimeConfig ? (optArray(runtimeConfig, 'ipRanges', 'runtimeConfig.ipRanges') ?? []) : [];
  const rcIPs = runtimeConfig ? (optArray(runtimeConfig, 'ips', 'runtimeConfig.ips') ?? []) : [];
  const args = optObject(doc, 'args', 'args');
  const argsCni = args ? optObject(args, 'cni', 'args.cni') : undefined;
  const argsIPs = argsCni ? (optArray(argsCni, 'ips', 'args.cni.ips') ?? []) : [];
  const argsRequested = argsIPs.map((v, i) => decodeRequestedIP(v, `args.cni.ips[${i}]`));
  const rcRequested = rcIPs.map((v, i) => decodeRequestedIP(v, `runtimeConfig.ips[${i}]`));

  if (ipam === undefined) throw invalidConfig("IPAM config missing 'ipam' key");

  const type = optString(ipam, 'type', 'ipam.type') ?? '';
  const legacySubnet = decodeSubnet(ipam, 'ipam.subnet', undefined);
  const legacyIndex = rcRanges.length;
  const legacy: RawRange | null =
    legacySubnet === null
      ? null
      : {
          subnet: legacySubnet,
          rangeStart: decodeRangeIP(ipam, 'rangeStart', 'ipam.rangeStart', legacyIndex),
          rangeEnd: decodeRangeIP(ipam, 'rangeEnd', 'ipam.rangeEnd', legacyIndex),
          gateway: decodeRangeIP(ipam, 'gateway', 'ipam.gateway', legacyIndex),
        };
  if (legacy === null) {
    // host-local still decodes (and so rejects bad text in) the ignored legacy fields.
    for (const k of ['rangeStart', 'rangeEnd', 'gateway']) decodeRangeIP(ipam, k, `ipam.${k}`);
  }
  const rangesFirst = rcRanges.length + (legacy === null ? 0 : 1);
  const ranges = decodeRangeSets(optArray(ipam, 'ranges', 'ipam.ranges') ?? [], 'ipam.ranges', rangesFirst);
  const rcRawSets = decodeRangeSets(rcRanges, 'runtimeConfig.ipRanges', 0);
  const routes = decodeRoutes(ipam);
  const dataDir = decodeDataDir(ipam);
  const resolvConf = optString(ipam, 'resolvConf', 'ipam.resolvConf') || null;
  const reclaimOnExhaustion = decodeBool(ipam, 'reclaimOnExhaustion', true);
  const failStatusOnExhaustion = decodeBool(ipam, 'failStatusOnExhaustion', false);
  const leakGracePeriodSeconds = decodeDuration(ipam, 'leakGracePeriod', DEFAULT_LEAK_GRACE_PERIOD);
  const runtimeEndpoint = decodeRuntimeEndpoint(optString(ipam, 'runtimeEndpoint', 'ipam.runtimeEndpoint') || null);
  const lockTimeoutSeconds = decodeDuration(ipam, 'lockTimeout', DEFAULT_LOCK_TIMEOUT);
  const pool = decodePoolConfig(ipam);
  // A pool key misspelt (`pools`) or outside `ipam`: refused, or the pool's addresses would be
  // handed out from node-local files, one address on every node (trial; docs/cluster.md).
  const misplaced = pool === null ? misplacedPoolKey(doc, ipam) : null;
  if (misplaced !== null) throw invalidConfig(misplaced);

  // --- requested IPs: CNI_ARGS, args.cni.ips, runtimeConfig.ips; deduplicated ---
  const envArgs = parseCniArgs(cniArgs);
  const requested: IP[] = [];
  const seen = new Set<string>();
  for (const r of [...argsRequested, ...rcRequested]) {
    if (r.ip === null) throw invalidConfig('cannot understand ip: IP <nil> not v4 nor v6', `at ${r.path}`);
  }
  const all = [...(envArgs.ip ? [envArgs.ip] : []), ...argsRequested.map((r) => r.ip as IP), ...rcRequested.map((r) => r.ip as IP)];
  for (const ip of all) {
    const key = formatIP(ip);
    if (seen.has(key)) continue;
    seen.add(key);
    requested.push(ip);
  }

  if (pool !== null && requested.length > 0) {
    throw invalidConfig('ipam.pool does not support static IP requests (CNI_ARGS IP=, args.cni.ips, runtimeConfig.ips)');
  }

  // --- range sets: runtimeConfig.ipRanges, legacy range, ranges ---
  const rawSets: RawRange[][] = [...rcRawSets, ...(legacy === null ? [] : [[legacy]]), ...ranges];
  if (rawSets.length === 0) throw invalidConfig('no IP ranges specified');
  const rangeSets: RangeSet[] = rawSets.map((raw, i) => {
    try {
      return canonicalizeRangeSet(raw);
    } catch (e) {
      if (isAppError(e)) throw invalidConfig(`invalid range set ${i}: ${e.message}`, e.details);
      throw e;
    }
  });

  let v4 = 0;
  let v6 = 0;
  for (const rs of rangeSets) {
    if ((rs[0] as RangeSet[number]).rangeStart.family === 4) v4++;
    else v6++;
  }
  if ((v4 > 1 || v6 > 1) && !versionAtLeast(rawVersion, '0.3.0')) {
    throw invalidConfig(`CNI version ${rawVersion} does not support more than 1 address per family`);
  }

  for (let i = 0; i < rangeSets.length - 1; i++) {
    for (let j = i + 1; j < rangeSets.length; j++) {
      if (rangeSetOverlaps(rangeSets[i] as RangeSet, rangeSets[j] as RangeSet)) {
        throw invalidConfig(`range set ${i} overlaps with ${j}`);
      }
    }
  }

  return {
    cniVersion: rawVersion === '' ? DEFAULT_CNI_VERSION : rawVersion,
    name,
    type,
    dataDir,
    rangeSets,
    routes,
    resolvConf,
    requestedIPs: requested,
    reclaimOnExhaustion,
    failStatusOnExhaustion,
    leakGracePeriodSeconds,
    runtimeEndpoint,
    lockTimeoutSeconds,
    // Absent for a node-local network: its config value is exactly what it was before pools.
    ...(pool === null ? {} : { pool }),
  };
}

/**
 * The part of a config that DEL, GC and STATUS need: `name` (validated), `cniVersion` (default
 * `"0.1.0"`), `ipam.dataDir` (default and rules as in {@link loadIPAMConfig}) and
 * `ipam.lockTimeout`. Nothing else is looked at, so a DEL whose `ranges` (or routes, or
 * requested IPs) no longer parse still releases the container's addresses.
 *
 * Deliberate difference: host-local's DEL parses the whole config and fails on any of it.
 * A pool key misspelt or outside `ipam` (refused by {@link loadIPAMConfig}) is not refused here:
 * such a config's ADD never allocated from a pool, and one served by an older version allocated
 * from node-local files, which its DEL (and GC) must still release.
 *
 * @throws AppError IPAM_DECODE when stdin is not a JSON object; IPAM_INVALID_CONFIG for a bad
 *   name, a missing `ipam` (`IPAM config missing 'ipam' key`), a bad `dataDir` or `lockTimeout`.
 */
export function loadNetworkIdentity(stdin: string | Uint8Array): NetworkIdentity {
  const doc = decode(stdin);
  const name = decodeName(doc);
  const rawVersion = optString(doc, 'cniVersion', 'cniVersion') ?? '';
  const ipam = optObject(doc, 'ipam', 'ipam');
  if (ipam === undefined) throw invalidConfig("IPAM config missing 'ipam' key");
  const pool = decodePoolConfig(ipam);
  return {
    cniVersion: rawVersion === '' ? DEFAULT_CNI_VERSION : rawVersion,
    name,
    dataDir: decodeDataDir(ipam),
    lockTimeoutSeconds: decodeDuration(ipam, 'lockTimeout', DEFAULT_LOCK_TIMEOUT),
    ...(pool === null ? {} : { pool }),
  };
}
