/**
 * A node with no Node.js (issue 10): a mount namespace whose `/usr` holds nothing but the shared
 * libraries that `ldd` names for the given executables. On a merged-/usr system (Debian 12:
 * `/bin`, `/lib`, `/lib64`, `/sbin` are symlinks into `/usr`) that leaves no `node`, no `perl`,
 * no `sh`, no `nsenter`, no `ip` — only the kernel, libc and what the binaries link. Everything
 * outside `/usr` (the test's temp dirs, `/proc`, `/run/netns`) is the host's.
 *
 * How: the staged `/usr` is a temp dir bind-mounted over `/usr` inside a new mount namespace made
 * by `unshare --mount=FILE --propagation slave` (util-linux), pinned at FILE (a file on a private
 * bind mount, as unshare(1) requires). A program runs in it by `nsenter --mount=FILE -- PROGRAM`:
 * nsenter enters the namespace and then execs PROGRAM, resolved there (no fork: the program's
 * parent is the caller, as a runtime's would be). `/run/netns` is made a shared mount first (as
 * `ip netns add` does), so namespace pins the tests create later propagate into the namespace.
 *
 * Needs root. Linux with a merged /usr only (throws otherwise).
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { copyFileSync, lstatSync, mkdirSync, mkdtempSync, realpathSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, dirname, join } from 'node:path';

/** A live no-Node mount namespace. */
export interface NoNodeNamespace {
  /** The namespace file to pass to `nsenter --mount=`. */
  readonly nsFile: string;
  /** The files staged as `/usr` inside, paths as seen inside (sorted). */
  readonly staged: readonly string[];
  /** The argv that runs `program` inside: `['/usr/bin/nsenter', '--mount=FILE', '--', program]`. */
  argv(program: string): string[];
  /** Unmount and remove everything; idempotent. */
  cleanup(): void;
}

/** The shared objects `ldd` lists for `file` (absolute paths as named: `/lib/x86_64-linux-gnu/libc.so.6`); [] for a static one. */
export function sharedLibraries(file: string): string[] {
  const r = spawnSync('ldd', [file], { encoding: 'utf8' });
  if (r.status !== 0) {
    if (/not a dynamic executable|statically linked/.test(r.stdout + r.stderr)) return [];
    throw new Error(`ldd ${file}: ${r.stderr || r.stdout}`);
  }
  const out: string[] = [];
  for (const line of r.stdout.split('\n')) {
    const m = /=>\s+(\/\S+)\s+\(/.exec(line) ?? /^\s*(\/\S+)\s+\(/.exec(line);
    if (m !== null) out.push(m[1] as string);
    else if (/=>\s+not found/.test(line)) throw new Error(`ldd ${file}: ${line.trim()}`);
  }
  return out;
}

/**
 * Where `name` is found once its directory's symlinks are resolved (`/lib64/ld-linux-x86-64.so.2`
 * → `/usr/lib64/ld-linux-x86-64.so.2`): the path the staged /usr must hold it at.
 */
function pathUnderUsr(name: string): string {
  const p = join(realpathSync(dirname(name)), basename(name));
  if (!p.startsWith('/usr/')) throw new Error(`${name} resolves to ${p}, outside /usr: this helper needs a merged /usr`);
  return p;
}

/**
 * Make the namespace for `executables` (their libraries, and nothing else, are staged). Throws
 * when a step fails; what was made so far is removed first.
 */
export function makeNoNodeNamespace(executables: readonly string[]): NoNodeNamespace {
  for (const link of ['/bin', '/lib', '/lib64', '/sbin']) {
    if (!lstatSync(link).isSymbolicLink()) throw new Error(`${link} is not a symlink into /usr: this helper needs a merged /usr`);
  }
  const stage = mkdtempSync(join(tmpdir(), 'ipwarden-nonode-usr-'));
  const pinDir = mkdtempSync(join(tmpdir(), 'ipwarden-nonode-ns-'));
  const nsFile = join(pinDir, 'mnt');
  let pinMounted = false;
  let nsMounted = false;
  const cleanup = (): void => {
    if (nsMounted) spawnSync('umount', [nsFile]);
    if (pinMounted) spawnSync('umount', [pinDir]);
    nsMounted = false;
    pinMounted = false;
    rmSync(stage, { recursive: true, force: true });
    rmSync(pinDir, { recursive: true, force: true });
  };
  try {
    const staged = new Set<string>();
    for (const exe of executables) {
      for (const lib of sharedLibraries(exe)) {
        const at = pathUnderUsr(lib);
        const dest = join(stage, at.slice('/usr'.length));
        mkdirSync(dirname(dest), { recursive: true });
        copyFileSync(realpathSync(lib), dest);
        staged.add(at);
      }
    }
    // `ip netns add` makes /run/netns a shared bind mount of itself; do the same (idempotent:
    // only when it is not a mount point yet), so later pins propagate into the slave namespace.
    mkdirSync('/run/netns', { recursive: true });
    if (spawnSync('mountpoint', ['-q', '/run/netns']).status !== 0) execFileSync('mount', ['--bind', '/run/netns', '/run/netns']);
    execFileSync('mount', ['--make-shared', '/run/netns']);
    execFileSync('mount', ['--bind', pinDir, pinDir]);
    pinMounted = true;
    execFileSync('mount', ['--make-private', pinDir]);
    writeFileSync(nsFile, '');
    execFileSync('unshare', [`--mount=${nsFile}`, '--propagation', 'slave', 'mount', '--bind', stage, '/usr']);
    nsMounted = true;
    const argv = (program: string): string[] => ['/usr/bin/nsenter', `--mount=${nsFile}`, '--', program];
    return { nsFile, staged: [...staged].sort(), argv, cleanup };
  } catch (e) {
    cleanup();
    throw e;
  }
}
