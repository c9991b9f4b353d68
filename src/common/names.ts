/**
 * The name rules and defaults of the CNI ecosystem that several layers share, one copy each
 * (the counterpart of containernetworking/cni `pkg/utils`): libcni's valid-name characters, Go's
 * whitespace set and `strings.TrimSpace`, and the default directories. Pure; a leaf module.
 *
 * Sources: libcni `pkg/utils/utils.go` (`cniValidNameChars`, `ValidateContainerID`,
 * `ValidateNetworkName`); Go `unicode.IsSpace` and `strings.TrimSpace`; host-local
 * `backend/disk/backend.go` (`defaultDataDir`); libcni / containerd / CRI-O (`/etc/cni/net.d`).
 */

/**
 * libcni `cniValidNameChars`: `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`. Container IDs (`CNI_CONTAINERID`)
 * and network names must match it; a directory whose name does not match cannot be a network.
 */
export const CNI_NAME_RE = /^[a-zA-Z0-9][a-zA-Z0-9_.-]*$/;

/** True when `name` is a valid CNI network name or container ID ({@link CNI_NAME_RE}). */
export function isCniName(name: string): boolean {
  return CNI_NAME_RE.test(name);
}

/**
 * Go's `unicode.IsSpace` set as the body of a RegExp character class (no brackets): differs from
 * JS `\s` by including U+0085 and excluding U+FEFF.
 */
export const GO_SPACE_CLASS = '\\t\\n\\v\\f\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000';

/** Matches one character of Go's whitespace set ({@link GO_SPACE_CLASS}). */
export const GO_SPACE_RE = new RegExp(`[${GO_SPACE_CLASS}]`);

const GO_TRIM_RE = new RegExp(`^[${GO_SPACE_CLASS}]+|[${GO_SPACE_CLASS}]+$`, 'g');

/** Go's `strings.TrimSpace` (host-local trims container IDs and file contents with it). */
export function goTrimSpace(s: string): string {
  if (s.length === 0) return s;
  const first = s.charCodeAt(0);
  const last = s.charCodeAt(s.length - 1);
  // Fast path: both ends printable ASCII other than space → nothing to trim.
  if (first > 0x20 && first < 0x7f && last > 0x20 && last < 0x7f) return s;
  return s.replace(GO_TRIM_RE, '');
}

/** host-local's default `dataDir` (backend/disk/backend.go `defaultDataDir`); `--data-dir` default. */
export const DEFAULT_DATA_DIR = '/var/lib/cni/networks';

/** Default CNI configuration directory (libcni, containerd and CRI-O); `--cni-conf-dir` default. */
export const DEFAULT_CNI_CONF_DIR = '/etc/cni/net.d';
