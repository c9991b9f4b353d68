/**
 * `mkdir -p` that always ends: Node's own (`mkdirSync(path, { recursive: true })`, Node 18–22)
 * loops forever at 100 % CPU when a directory exists but `mkdir` of a child in it says ENOENT —
 * which procfs does for any new name (`/proc/x/y`), as does a directory whose mount has gone
 * stale. Its walk takes ENOENT for "the parent is missing", makes the parent (EEXIST: fine) and
 * tries the child again, for ever (reported against Node-based tools: openclaw/openclaw#130807, a
 * CI job hung 5 h on a `/proc/...` fixture in Kewton/CommandMate#1774; Bun fixed the same walk in
 * oven-sh/bun#40600). A `dataDir` under `/proc` in a CNI config hung the plugin (and the daemon's
 * event loop) that way.
 */
import { mkdirSync, statSync } from 'node:fs';
import { resolve, sep } from 'node:path';
import { errnoCode } from './errors.ts';

/**
 * Make directory `path` and every missing ancestor, each with `mode` (before the umask), much as
 * `mkdirSync(path, { recursive: true, mode })` does — existing directories (or symlinks to them)
 * are fine, a relative path is taken from the working directory — but every `mkdir(2)` is tried
 * at most once, so it always returns or throws. One `stat` for a directory that is already there
 * (the common case). Differences from Node's: the path is resolved lexically first (`a/link/..`
 * is `a`, as `path.join` builds every path given here); an ancestor another process removes
 * meanwhile is not made again (ENOENT); a dangling symlink at `path` itself is EEXIST.
 * @throws the `mkdir(2)` error of the first component that cannot be made, as Node throws it
 *   (`code` ENOENT, EACCES, EROFS, ENOTDIR, ENOSPC, …; ENOENT also when the parent exists but
 *   takes no new names, e.g. under `/proc`); EEXIST when `path` itself exists and is not a
 *   directory.
 */
export function makeDirs(path: string, mode: number): void {
  const abs = resolve(path);
  // The common case first, without an exception (the daemon opens a network's store per request):
  // one stat.
  if (isDirectory(abs)) return;
  try {
    mkdirSync(abs, { mode });
    return;
  } catch (e) {
    const code = errnoCode(e);
    if (code === 'EEXIST') {
      if (isDirectory(abs)) return;
      throw e;
    }
    if (code !== 'ENOENT') throw e;
  }
  // Some ancestor is missing: make each component from the top, once each.
  const parts = abs.split(sep).filter((p) => p !== '');
  let cur = '';
  for (let i = 0; i < parts.length; i++) {
    cur += sep + (parts[i] as string);
    try {
      mkdirSync(cur, { mode });
    } catch (e) {
      if (errnoCode(e) !== 'EEXIST') throw e;
      // An ancestor that is a file: the next mkdir says ENOTDIR. The path itself: not a directory.
      if (i === parts.length - 1 && !isDirectory(cur)) throw e;
    }
  }
}

/** Whether `p` is a directory (following symlinks); false when it cannot be stat'ed. */
function isDirectory(p: string): boolean {
  try {
    return statSync(p, { throwIfNoEntry: false })?.isDirectory() ?? false;
  } catch {
    return false;
  }
}
