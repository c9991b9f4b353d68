// Types of scripts/debian-packages.mjs (plain JavaScript so scripts/image.mjs runs without tsx).

/** The packages of `names` that dpkg does not list as installed, in the order given. */
export function missingDebianPackages(names: readonly string[]): string[];

/**
 * Installs the packages of `names` that are not installed (`apt-get update`, then one
 * `apt-get install -y --no-install-recommends`); resolves with those installed.
 * @throws Error when not root, when apt-get fails, or when a package is still missing afterwards.
 */
export function installDebianPackages(names: readonly string[], opts?: { log?: (line: string) => void; timeoutSeconds?: number }): Promise<string[]>;
