/**
 * `CNI_ARGS` parsing as host-local does it: libcni `types.LoadArgs` (containernetworking/cni
 * pkg/types/args.go) into host-local's `IPAMEnvArgs {CommonArgs; IP ip.IP}`
 * (plugins/ipam/host-local/backend/allocator/config.go). Messages are libcni's, byte for byte as
 * printed by host-local v1.1.1. Pure.
 */

import { AppError } from '../common/errors.ts';
import { goQuote, goQuoteList } from '../common/goquote.ts';
import { parseCIDR, parseIP } from '../common/ip.ts';
import type { IP } from './types.ts';

/** What host-local takes from `CNI_ARGS`. */
export interface IPAMEnvArgs {
  /** `IgnoreUnknown` (libcni `UnmarshallableBool`); false when absent. */
  readonly ignoreUnknown: boolean;
  /** The requested `IP=<ip>[/<prefix>]` (prefix dropped), or null when absent or empty. */
  readonly ip: IP | null;
}

function invalidArgs(msg: string): AppError {
  return new AppError('IPAM_INVALID_ARGS', msg);
}

/**
 * Parse an `<ip>[/<prefix>]` value like plugins `pkg/ip.ParseIP` + `ToIP`: with a `/` the whole
 * text must be a valid CIDR (Go `net.ParseCIDR`, so `10.0.0.5/40` is invalid) and the prefix is
 * then ignored; without, a plain address. Returns null when invalid.
 */
export function parseIPWithOptionalPrefix(s: string): IP | null {
  if (s.includes('/')) {
    const c = parseCIDR(s);
    return c === null ? null : c.ip;
  }
  return parseIP(s);
}

/**
 * Parse `CNI_ARGS` (`K=V;K2=V2`) like libcni `LoadArgs` with host-local's `IPAMEnvArgs`:
 * - empty or undefined → nothing;
 * - split on `;`, each pair split on `=` and must have exactly one `=`, else
 *   `ARGS: invalid pair "<pair>"` (so a trailing `;` is an error, as in libcni);
 * - keys are Go field names, case-sensitive: `IgnoreUnknown`, `IP`; `CommonArgs` (the embedded
 *   struct's own name) fails as libcni does with
 *   `ARGS: cannot unmarshal into field 'CommonArgs' - type '*types.CommonArgs' does not implement encoding.TextUnmarshaler`;
 * - `IgnoreUnknown` accepts `1`/`true`/`0`/`false` in any case, else
 *   `ARGS: error parsing value of pair "<pair>": boolean unmarshal error: invalid input <lowercased>`;
 * - `IP` accepts `<ip>[/<prefix>]` (see {@link parseIPWithOptionalPrefix}); empty means none; else
 *   `ARGS: error parsing value of pair "<pair>": invalid IP address <value>`;
 * - a later pair with the same key wins;
 * - unknown keys, when `IgnoreUnknown` is not true after all pairs were read:
 *   `ARGS: unknown args ["K=V" "K2=V2"]`.
 * Errors are raised in pair order; the unknown-keys error comes last.
 *
 * @throws AppError IPAM_INVALID_ARGS with libcni's message
 */
export function parseCniArgs(args: string | undefined): IPAMEnvArgs {
  let ignoreUnknown = false;
  let ip: IP | null = null;
  if (args === undefined || args === '') return { ignoreUnknown, ip };
  const unknown: string[] = [];
  for (const pair of args.split(';')) {
    const kv = pair.split('=');
    if (kv.length !== 2) throw invalidArgs(`ARGS: invalid pair ${goQuote(pair)}`);
    const key = kv[0] as string;
    const value = kv[1] as string;
    switch (key) {
      case 'IgnoreUnknown': {
        const v = value.toLowerCase();
        if (v === '1' || v === 'true') ignoreUnknown = true;
        else if (v === '0' || v === 'false') ignoreUnknown = false;
        else {
          throw invalidArgs(
            `ARGS: error parsing value of pair ${goQuote(pair)}: boolean unmarshal error: invalid input ${v}`,
          );
        }
        break;
      }
      case 'IP': {
        if (value === '') {
          ip = null;
          break;
        }
        const parsed = parseIPWithOptionalPrefix(value);
        if (parsed === null) {
          throw invalidArgs(`ARGS: error parsing value of pair ${goQuote(pair)}: invalid IP address ${value}`);
        }
        ip = parsed;
        break;
      }
      case 'CommonArgs':
        throw invalidArgs(
          "ARGS: cannot unmarshal into field 'CommonArgs' - type '*types.CommonArgs' does not implement encoding.TextUnmarshaler",
        );
      default:
        unknown.push(pair);
    }
  }
  if (unknown.length > 0 && !ignoreUnknown) throw invalidArgs(`ARGS: unknown args ${goQuoteList(unknown)}`);
  return { ignoreUnknown, ip };
}
