/**
 * Does this process see the host's files? The daemon may run in a container (the DaemonSet,
 * deploy/kubernetes/daemonset.yaml) whose filesystem holds only some host paths (its `hostPath`
 * mounts, at the same paths). A request or a network that names another path — a `dataDir` or a
 * `resolvConf` the manifest does not mount, or one inside the container's own `/tmp` — must not be
 * served from the container's copy: its reservations would not be the host's, and the standalone
 * plugin on the host (upstream host-local too) would hand out the same address again (found by a
 * new-user trial of issue 10: a `dataDir` under `/tmp` gave one address to two containers).
 *
 * The test: a path is the host's when `stat(path)` here and `stat(/proc/1/root/path)` — the same
 * path looked up from the host's init's root (proc(5) `/proc/pid/root`) — are one file (device and
 * inode). A path that does not exist yet is judged by its nearest existing ancestor (what we
 * create below it lands in the host's directory). Equal inodes mean one file whatever the lookup
 * did (an absolute symlink on the way is resolved from our own root, so a host path reached only
 * through one never compares equal: a refusal, the safe direction). In the host's own mount
 * namespace (the daemon run on the host, the tests, the lab's daemon) every path is the host's and
 * nothing is looked up. Outside the host PID namespace `/proc/1` is not the host's init, so
 * nothing can be proven: every path is refused.
 *
 * Needs `/proc` of the host PID namespace and CAP_SYS_PTRACE-level access to pid 1 (root; the
 * DaemonSet grants SYS_PTRACE for the kernel evidence already).
 */
import { readFileSync, readlinkSync, statSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { errnoCode } from '../common/errors.ts';
import { statCommPpid } from './kernel-evidence.ts';

/** Answers "is this path the host's?" for one process lifetime (see the module comment). */
export interface HostView {
  /** null when `path` (absolute) is the host's file, else why not (one clause naming the path). */
  notHostPath(path: string): string | null;
  /** True when this process shares the host's mount namespace (every path is the host's). */
  readonly hostMountNamespace: boolean;
}

/** Options of {@link hostView}. */
export interface HostViewOptions {
  /** procfs of the host PID namespace; default `/proc`. */
  readonly procDir?: string;
}

/**
 * The view of this process: reads `/proc/self/ns/mnt`, `/proc/1/ns/mnt` and `/proc/2/stat` once.
 * Never throws; an unreadable `/proc` makes every {@link HostView.notHostPath} answer a reason.
 */
export function hostView(opts: HostViewOptions = {}): HostView {
  const proc = opts.procDir ?? '/proc';
  let refuse: string | null = null;
  let sameNs = false;
  try {
    const s = statCommPpid(readFileSync(join(proc, '2', 'stat'), 'utf8'));
    if (s === null || s.comm !== 'kthreadd' || s.ppid !== 0) refuse = `${proc} is not of the host PID namespace (pid 2 is not kthreadd): the host's files cannot be told from this container's`;
  } catch (e) {
    refuse = `cannot read ${proc}/2/stat (${errnoCode(e) ?? 'error'}): the host's files cannot be told from this container's`;
  }
  if (refuse === null) {
    try {
      sameNs = readlinkSync(join(proc, 'self', 'ns', 'mnt')) === readlinkSync(join(proc, '1', 'ns', 'mnt'));
    } catch (e) {
      refuse = `cannot read the mount namespace of pid 1 (${errnoCode(e) ?? 'error'}): the host's files cannot be told from this container's`;
    }
  }
  const hostRoot = join(proc, '1', 'root');
  return {
    hostMountNamespace: refuse === null && sameNs,
    notHostPath(path: string): string | null {
      if (refuse !== null) return refuse;
      if (sameNs) return null;
      let p = resolve(path);
      for (;;) {
        let here;
        try {
          here = statSync(p);
        } catch (e) {
          if (errnoCode(e) === 'ENOENT' && p !== '/') {
            p = dirname(p);
            continue;
          }
          return `${path}: cannot stat ${p} here (${errnoCode(e) ?? 'error'})`;
        }
        let host;
        try {
          host = statSync(join(hostRoot, p));
        } catch (e) {
          return `${path}: ${p} is not on the host as it is here (${errnoCode(e) ?? 'error'} through ${hostRoot}): not a host path mounted at the same path`;
        }
        if (here.dev !== host.dev || here.ino !== host.ino) {
          return `${path}: ${p} here is not the host's ${p}: not a host path mounted at the same path`;
        }
        return null;
      }
    },
  };
}
