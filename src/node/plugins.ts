/**
 * Where CNI plugin executables are installed, and whether one is (libcni `FindInPath`: the first
 * `<dir>/<type>` that exists in the plugin search path).
 */
import { accessSync, constants, statSync } from 'node:fs';
import { join } from 'node:path';

/**
 * Default CNI plugin directories searched: `/opt/cni/bin` (containerd's and CRI-O's default
 * `bin_dir`) and `/usr/lib/cni` (where Debian's `containernetworking-plugins` installs them).
 */
export const DEFAULT_CNI_BIN_DIRS: readonly string[] = ['/opt/cni/bin', '/usr/lib/cni'];

/** Plugin types that can name a file (no path separators, not `.`/`..`, not empty). */
export function isPluginName(type: string): boolean {
  return type !== '' && type !== '.' && type !== '..' && !type.includes('/') && !type.includes('\0');
}

/**
 * Path of the executable for plugin `type`: the first `<dir>/<type>` of `binDirs` that is a
 * regular file the current user may execute; null when none is (or `type` cannot be a file name).
 */
export function findPluginBinary(type: string, binDirs: readonly string[]): string | null {
  if (!isPluginName(type)) return null;
  for (const dir of binDirs) {
    const p = join(dir, type);
    try {
      if (!statSync(p).isFile()) continue;
      accessSync(p, constants.X_OK);
      return p;
    } catch {
      // not here
    }
  }
  return null;
}
