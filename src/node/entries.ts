/**
 * Entries of a network directory that are named like an address but are no reservation file: a
 * unix socket, a FIFO, a device, a directory, or a symlink that leads to none of these files (a
 * loop, dangling, or to something else). host-local ignores them when reading (its walk skips what
 * it cannot read) and so does ipwarden's store; their names stay taken (an `O_EXCL` create or
 * `link(2)` fails with EEXIST), so those addresses are never handed out, and `gc` never removes
 * them. `doctor` reports them (finding `unusable-entries`).
 */
import { lstatSync, readdirSync, statSync, type Dirent, type Stats } from 'node:fs';
import { join } from 'node:path';
import { errnoCode } from '../common/errors.ts';
import { isCanonicalIPName } from '../common/ip.ts';

/** One such entry. */
export interface UnusableEntry {
  /** The file name (canonical IP text). */
  readonly name: string;
  /** `<dir>/<name>`. */
  readonly path: string;
  /** What it is, as a phrase: `a unix socket`, `a symlink loop`, `a FIFO`, … */
  readonly what: string;
}

function kindOf(st: Stats | Dirent): string | null {
  if (st.isFile()) return null;
  if (st.isSocket()) return 'a unix socket';
  if (st.isFIFO()) return 'a FIFO';
  if (st.isDirectory()) return 'a directory';
  if (st.isCharacterDevice() || st.isBlockDevice()) return 'a device';
  return 'not a regular file';
}

/** What a symlink at `path` leads to, when that is not a regular file; null when it is one. */
function symlinkProblem(path: string): string | null {
  try {
    const k = kindOf(statSync(path));
    return k === null ? null : `a symlink to ${k}`;
  } catch (e) {
    const code = errnoCode(e);
    if (code === 'ELOOP') return 'a symlink loop';
    if (code === 'ENOENT') return 'a dangling symlink';
    if (code === 'ENOTDIR') return 'a symlink through a non-directory';
    return `a symlink that cannot be followed (${code ?? 'error'})`;
  }
}

/**
 * The unusable entries of `dir`, in directory order (one `readdir` with entry types; a `stat`
 * only for symlinks and file systems that give no type). A directory that cannot be read has none.
 */
export function unusableEntries(dir: string): UnusableEntry[] {
  let entries: Dirent[];
  try {
    entries = readdirSync(dir, { withFileTypes: true });
  } catch {
    return [];
  }
  const out: UnusableEntry[] = [];
  for (const d of entries) {
    const name = String(d.name);
    if (!isCanonicalIPName(name)) continue;
    const path = join(dir, name);
    let what: string | null;
    if (d.isSymbolicLink()) what = symlinkProblem(path);
    else if (d.isFile()) what = null;
    else if (d.isSocket() || d.isFIFO() || d.isDirectory() || d.isCharacterDevice() || d.isBlockDevice()) what = kindOf(d);
    else {
      // DT_UNKNOWN: ask lstat.
      try {
        const st = lstatSync(path);
        what = st.isSymbolicLink() ? symlinkProblem(path) : kindOf(st);
      } catch {
        what = null; // gone meanwhile
      }
    }
    if (what !== null) out.push({ name, path, what });
  }
  return out;
}
