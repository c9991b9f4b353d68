/**
 * IP address helpers over the {@link IP} value type (family + unsigned integer), the TypeScript
 * counterpart of Go's `net.IP` handling used by host-local (containernetworking/plugins `pkg/ip`,
 * Go `net.ParseIP`, `net.ParseCIDR`, `net.IP.String`).
 *
 * Parsing is written here rather than delegated to `ipaddr.js`: host-local compatibility needs Go's
 * exact grammar, and `ipaddr.js` (2.x) accepts forms Go rejects (octal/hex/short IPv4 such as
 * `0x0a.1`, leading zeros `10.0.0.010`, zones `fe80::1%eth0`) and reads `::1.2.3.4` as the mapped
 * `::ffff:1.2.3.4` where Go reads the IPv4-compatible `::102:304`. `ipaddr.js` is used by the unit
 * tests as an independent oracle for the canonical text form.
 *
 * Everything here is pure and allocation-light: the allocator calls `formatIP`/`ipAdd` once per
 * candidate address (up to ~65k per ADD).
 *
 * A leaf module (layer common): the IPAM math, the stores (reservation file names), the node
 * readers and the reconciler all import it, as every plugin imports `pkg/ip`.
 */

/** An IP address as a family plus an unsigned integer value (IPv4: 32 bits, IPv6: 128 bits). */
export interface IP {
  readonly family: 4 | 6;
  readonly value: bigint;
}

/** A CIDR: the network address (host bits zero) and prefix length in bits. */
export interface Subnet {
  readonly ip: IP;
  readonly prefix: number;
}

const V4_MAX = (1n << 32n) - 1n;
const V6_MAX = (1n << 128n) - 1n;

/** Number of bits of an address of family `f`: 32 for IPv4, 128 for IPv6. */
export function familyBits(f: 4 | 6): 32 | 128 {
  return f === 4 ? 32 : 128;
}

function maxValue(f: 4 | 6): bigint {
  return f === 4 ? V4_MAX : V6_MAX;
}

function isDigit(c: number): boolean {
  return c >= 48 && c <= 57;
}

function hexValue(c: number): number {
  if (c >= 48 && c <= 57) return c - 48;
  if (c >= 97 && c <= 102) return c - 87;
  if (c >= 65 && c <= 70) return c - 55;
  return -1;
}

/**
 * Strict dotted-quad parse of `s[from..]` (Go `netip.parseIPv4`): exactly four decimal fields,
 * each 1–3 digits, no leading zero, at most 255. Returns the 32-bit value, or -1.
 */
function parseV4(s: string, from: number): number {
  let value = 0;
  let fields = 0;
  let acc = 0;
  let digits = 0;
  for (let i = from; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (isDigit(c)) {
      if (digits === 1 && acc === 0) return -1; // leading zero
      acc = acc * 10 + (c - 48);
      digits++;
      if (acc > 255) return -1;
    } else if (c === 46 /* . */) {
      if (digits === 0 || fields === 3) return -1;
      value = value * 256 + acc;
      fields++;
      acc = 0;
      digits = 0;
    } else {
      return -1;
    }
  }
  if (digits === 0 || fields !== 3) return -1;
  return value * 256 + acc;
}

/**
 * IPv6 parse following Go `netip.parseIPv6` (which `net.ParseIP` uses): 1–4 hex digits per field,
 * at most one `::` that stands for at least one zero field, an optional embedded IPv4 address in
 * the last 32 bits, no zone. Returns the 128-bit value or null.
 */
function parseV6(s: string): bigint | null {
  const groups = [0, 0, 0, 0, 0, 0, 0, 0];
  let n = 0; // groups filled
  let ellipsis = -1; // group index where `::` sits
  let pos = 0;
  const len = s.length;
  if (len >= 2 && s.charCodeAt(0) === 58 && s.charCodeAt(1) === 58) {
    ellipsis = 0;
    pos = 2;
    if (pos === len) return 0n; // "::"
  }
  while (n < 8) {
    // One field: hex digits, or an embedded IPv4 address.
    let acc = 0;
    let off = 0;
    while (pos + off < len) {
      const h = hexValue(s.charCodeAt(pos + off));
      if (h < 0) break;
      acc = acc * 16 + h;
      off++;
      if (off > 4) return null;
    }
    if (pos + off < len && s.charCodeAt(pos + off) === 46 /* . */) {
      // Embedded IPv4: must be the last 32 bits (or fit before them with `::`).
      if (ellipsis < 0 && n !== 6) return null;
      if (n + 2 > 8) return null;
      const v4 = parseV4(s, pos);
      if (v4 < 0) return null;
      groups[n] = v4 >>> 16;
      groups[n + 1] = v4 & 0xffff;
      n += 2;
      pos = len;
      break;
    }
    if (off === 0) return null; // a field needs at least one digit
    groups[n] = acc;
    n++;
    pos += off;
    if (pos === len) break;
    if (s.charCodeAt(pos) !== 58 /* : */) return null;
    if (pos + 1 === len) return null; // trailing single colon
    pos++;
    if (s.charCodeAt(pos) === 58) {
      if (ellipsis >= 0) return null; // second `::`
      ellipsis = n;
      pos++;
      if (pos === len) break;
    }
  }
  if (pos !== len) return null; // trailing garbage after 8 groups
  if (n < 8) {
    if (ellipsis < 0) return null; // too short
    const shift = 8 - n;
    for (let j = n - 1; j >= ellipsis; j--) groups[j + shift] = groups[j] as number;
    for (let j = ellipsis + shift - 1; j >= ellipsis; j--) groups[j] = 0;
  } else if (ellipsis >= 0) {
    return null; // `::` must stand for at least one group
  }
  let v = 0n;
  for (let j = 0; j < 8; j++) v = (v << 16n) | BigInt(groups[j] as number);
  return v;
}

/**
 * Parse an IP address like Go's `net.ParseIP`, then normalise like `net.IP.To4`:
 * - IPv4 dotted quad, four decimal fields without leading zeros (`10.0.0.010` is rejected, as
 *   since Go 1.17);
 * - IPv6 in any RFC 4291 text form, including an embedded IPv4 tail (`::1.2.3.4`, `64:ff9b::1.2.3.4`);
 * - an IPv4-mapped IPv6 address `::ffff:a.b.c.d` (or `::ffff:a0b:c0d`) becomes family 4, as Go's
 *   `To4` makes it;
 * - no zone (`%eth0`), no surrounding whitespace (nothing is trimmed), no prefix.
 *
 * @returns the address, or null when `s` is not an address.
 */
export function parseIP(s: string): IP | null {
  if (s.length === 0 || s.length > 64) return null;
  // Go's netip.ParseAddr decides by the first '.', ':' or '%'.
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c === 46) {
      const v = parseV4(s, 0);
      return v < 0 ? null : { family: 4, value: BigInt(v) };
    }
    if (c === 58) {
      const v = parseV6(s);
      if (v === null) return null;
      if (v >> 32n === 0xffffn) return { family: 4, value: v & V4_MAX };
      return { family: 6, value: v };
    }
    if (c === 37) return null;
  }
  return null;
}

/**
 * Canonical text of an address, exactly Go's `net.IP.String()` for the equivalent `net.IP`:
 * IPv4 dotted decimal; IPv6 per RFC 5952 (lowercase hex, no leading zeros, the first longest
 * run of two or more zero groups written `::`). This is also the reservation's file name.
 */
export function formatIP(ip: IP): string {
  if (ip.family === 4) {
    const v = Number(ip.value);
    return `${v >>> 24}.${(v >>> 16) & 255}.${(v >>> 8) & 255}.${v & 255}`;
  }
  const g: number[] = new Array<number>(8);
  let v = ip.value;
  for (let j = 7; j >= 0; j--) {
    g[j] = Number(v & 0xffffn);
    v >>= 16n;
  }
  // Longest run of zero groups (first one on ties), compressed only when at least 2 long.
  let bestStart = -1;
  let bestLen = 0;
  for (let j = 0; j < 8; ) {
    if (g[j] !== 0) {
      j++;
      continue;
    }
    let k = j;
    while (k < 8 && g[k] === 0) k++;
    if (k - j > bestLen) {
      bestStart = j;
      bestLen = k - j;
    }
    j = k;
  }
  if (bestLen < 2) bestStart = -1;
  let out = '';
  for (let j = 0; j < 8; j++) {
    if (j === bestStart) {
      out += '::';
      j += bestLen - 1;
      continue;
    }
    if (out.length > 0 && !out.endsWith(':')) out += ':';
    out += (g[j] as number).toString(16);
  }
  return out;
}

/** Result of {@link parseCIDR}. */
export interface ParsedCIDR {
  /** The address as written (normalised like `To4`: `::ffff:10.0.0.1/120` gives family 4). */
  readonly ip: IP;
  /**
   * The network: the address with its host bits cleared, and the prefix. Meaningful only when
   * `maskBits === familyBits(ip.family)`; otherwise (an IPv4-mapped address written in IPv6 form
   * with an IPv6 prefix) it is `{ip, prefix}` unmasked and the caller must reject it — host-local
   * answers `IPNet IP and Mask version mismatch`.
   */
  readonly subnet: Subnet;
  /** Length of the mask in bits, decided by the text like Go: 32 for dotted IPv4, else 128. */
  readonly maskBits: 32 | 128;
}

/**
 * Parse `<ip>/<prefix>` like Go's `net.ParseCIDR`: the address per {@link parseIP} (the IPv4 form
 * decides a 32-bit mask, any text containing `:` a 128-bit one), the prefix decimal digits only
 * (leading zeros allowed, as Go's `dtoi`), 0..maskBits.
 *
 * @returns the parsed CIDR, or null when `s` is not one.
 */
export function parseCIDR(s: string): ParsedCIDR | null {
  const slash = s.indexOf('/');
  if (slash < 0) return null;
  const addr = s.slice(0, slash);
  const ip = parseIP(addr);
  if (ip === null) return null;
  const maskText = s.slice(slash + 1);
  if (maskText.length === 0 || maskText.length > 8) return null;
  let prefix = 0;
  for (let i = 0; i < maskText.length; i++) {
    const c = maskText.charCodeAt(i);
    if (!isDigit(c)) return null;
    prefix = prefix * 10 + (c - 48);
  }
  const maskBits: 32 | 128 = addr.includes(':') ? 128 : 32;
  if (prefix > maskBits) return null;
  if (maskBits !== familyBits(ip.family)) return { ip, subnet: { ip, prefix }, maskBits };
  return { ip, subnet: { ip: maskIP(ip, prefix), prefix }, maskBits };
}

/** `ip` with every bit after the first `prefix` bits cleared (Go `IP.Mask(CIDRMask(prefix, bits))`). */
export function maskIP(ip: IP, prefix: number): IP {
  const host = BigInt(familyBits(ip.family) - prefix);
  return { family: ip.family, value: (ip.value >> host) << host };
}

/**
 * `ip + n`, wrapping around the family's address space like Go's `ip.NextIP`/`ip.PrevIP`
 * (255.255.255.255 + 1 = 0.0.0.0). `n` may be negative.
 */
export function ipAdd(ip: IP, n: bigint): IP {
  const max = maxValue(ip.family);
  let v = ip.value + n;
  if (v < 0n || v > max) v = ((v % (max + 1n)) + (max + 1n)) % (max + 1n);
  return { family: ip.family, value: v };
}

/** Total order: IPv4 before IPv6, then by numeric value. Returns -1, 0 or 1. */
export function compareIP(a: IP, b: IP): -1 | 0 | 1 {
  if (a.family !== b.family) return a.family < b.family ? -1 : 1;
  if (a.value === b.value) return 0;
  return a.value < b.value ? -1 : 1;
}

/** Same family and value (Go `net.IP.Equal` after `To4` normalisation). */
export function ipEquals(a: IP, b: IP): boolean {
  return a.family === b.family && a.value === b.value;
}

/** Does `subnet` contain `ip`? False across families (Go `IPNet.Contains`). */
export function subnetContains(subnet: Subnet, ip: IP): boolean {
  if (subnet.ip.family !== ip.family) return false;
  const host = BigInt(familyBits(ip.family) - subnet.prefix);
  return ip.value >> host === subnet.ip.value >> host;
}

/** The all-ones (last) address of `subnet`; for IPv4 this is the broadcast address. */
export function lastAddress(subnet: Subnet): IP {
  const host = BigInt(familyBits(subnet.ip.family) - subnet.prefix);
  return { family: subnet.ip.family, value: subnet.ip.value | ((1n << host) - 1n) };
}

/** `<canonical ip>/<prefix>`, Go `net.IPNet.String()` for a canonical mask. */
export function formatSubnet(subnet: Subnet): string {
  return `${formatIP(subnet.ip)}/${subnet.prefix}`;
}

/**
 * True when `name` is the canonical text of an IP address, i.e. a name a reservation file can
 * have (Go `net.IP.String()`: IPv4 dotted decimal; IPv6 RFC 5952, lower case, no zone).
 * Uses these helpers, not `node:net`, whose stream machinery costs the plugin milliseconds.
 */
export function isCanonicalIPName(name: string): boolean {
  const c = name.charCodeAt(0);
  // Canonical IP text starts with a digit, a lower-case hex letter or ':'.
  if (!((c >= 0x30 && c <= 0x39) || (c >= 0x61 && c <= 0x66) || c === 0x3a)) return false;
  const ip = parseIP(name);
  return ip !== null && formatIP(ip) === name;
}

/**
 * The canonical text (Go `net.IP.String()`) of an IP given as text, or null when `text` is not
 * an IP address ({@link parseIP}'s grammar; nothing is trimmed).
 */
export function canonicalIP(text: string): string | null {
  const ip = parseIP(text);
  return ip === null ? null : formatIP(ip);
}
