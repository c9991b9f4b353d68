/**
 * CNI spec versions ipwarden speaks, and version comparison.
 *
 * Supported: every version upstream host-local accepts (libcni `version.All` up to 1.0.0:
 * 0.1.0, 0.2.0, 0.3.0, 0.3.1, 0.4.0, 1.0.0) plus 1.1.0 (SPEC.md @spec-v1.1.0: GC, STATUS).
 */

/** ipwarden's release version (package.json `version`); the CLI's `ipwarden --version` and the plugin's "about" text print it. */
export const IPWARDEN_VERSION = '0.1.0';

/** Spec versions accepted in a config's `cniVersion`, oldest first. */
export const SUPPORTED_VERSIONS: readonly string[] = ['0.1.0', '0.2.0', '0.3.0', '0.3.1', '0.4.0', '1.0.0', '1.1.0'];

/** The newest version we implement (used for VERSION answers and result conversion). */
export const CURRENT_VERSION = '1.1.0';

const SEMVER = /^(\d+)\.(\d+)\.(\d+)$/;

/**
 * Compare two `major.minor.patch` versions: negative when a < b, 0 when equal, positive when a > b.
 * Throws `Error` with libcni's text (`unable to parse version "x"`) when either is malformed.
 */
export function compareVersions(a: string, b: string): number {
  const pa = parse(a);
  const pb = parse(b);
  for (let i = 0; i < 3; i++) {
    const d = (pa[i] ?? 0) - (pb[i] ?? 0);
    if (d !== 0) return d;
  }
  return 0;
}

function parse(v: string): number[] {
  const m = SEMVER.exec(v);
  if (m === null) throw new Error(`unable to parse version "${v}"`);
  return [Number(m[1]), Number(m[2]), Number(m[3])];
}

/** True when `v` is one of {@link SUPPORTED_VERSIONS}. */
export function isSupported(v: string): boolean {
  return SUPPORTED_VERSIONS.includes(v);
}
