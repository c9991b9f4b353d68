/**
 * Does this process see the files of the process that asked it? The daemon may run in a container
 * (the DaemonSet, deploy/kubernetes/daemonset.yaml) whose filesystem holds only some host paths
 * (its `hostPath` mounts, at the same paths). A request that names another path — a `dataDir` or a
 * `resolvConf` the manifest does not mount, or one inside the container's own `/tmp` — must not be
 * served from the container's copy: its reservations would not be the host's, and the standalone
 * plugin on the host (upstream host-local too) would hand out the same address again (found by a
 * new-user trial of issue 10: a `dataDir` under `/tmp` gave one address to two containers).
 *
 * The reference is the requester itself: the shim's pid (protocol v1 carries it), whose files are
 * exactly what the standalone plugin would see if the shim fell back to it (the runtime's mount
 * namespace). A path is the requester's when `stat(path)` here and `stat(/proc/PID/root/path)`
 * (proc(5) `/proc/pid/root`) are one file (device and inode). A path that does not exist yet is
 * judged by its nearest existing ancestor (what we create below it lands in the requester's
 * directory). Equal inodes mean one file whatever the lookup did (an absolute symlink on the way
 * is resolved from our own root, so a requester's path reached only through one never compares
 * equal: a refusal, the safe direction). When the requester shares our mount namespace (the daemon
 * run on the host, the tests, the lab's daemon) every path is its and nothing is looked up. Outside
 * the host PID namespace the pid names no process we can see: every path is refused.
 *
 * Needs `/proc` of the host PID namespace and ptrace-read access to the requester (root: the
 * DaemonSet grants SYS_PTRACE for the kernel evidence already).
 */
import { readFileSync, readlinkSync, statSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { errnoCode } from '../common/errors.ts';
import { statCommPpid } from './kernel-evidence.ts';

/** Answers "does the requester see this path as we do?" (see the module comment). */
export interface HostView {
  /**
   * null when `path` (absolute) is the same file here as for process `pid` (the requester, host
   * PID namespace), else why not (one clause naming the path).
   */
  notHostPath(path: string, pid: number): string | null;
}

/** Options of {@link hostView}. */
export interface HostViewOptions {
  /** procfs of the host PID namespace; default `/proc`. */
  readonly procDir?: string;
}

/**
 * The view of this process: reads `/proc/self/ns/mnt` and `/proc/2/stat` once; per call, the
 * requester's `ns/mnt` (and, in another mount namespace, a stat through its `root`). Never throws.
 */
export function hostView(opts: HostViewOptions = {}): HostView {
  const proc = opts.procDir ?? '/proc';
  let refuse: string | null = null;
  let ownNs = '';
  try {
    const s = statCommPpid(readFileSync(join(proc, '2', 'stat'), 'utf8'));
    if (s === null || s.comm !== 'kthreadd' || s.ppid !== 0) refuse = `${proc} is not of the host PID namespace (pid 2 is not kthreadd): the requester's files cannot be told from this container's`;
  } catch (e) {
    refuse = `cannot read ${proc}/2/stat (${errnoCode(e) ?? 'error'}): the requester's files cannot be told from this container's`;
  }
  if (refuse === null) {
    try {
      ownNs = readlinkSync(join(proc, 'self', 'ns', 'mnt'));
    } catch (e) {
      refuse = `cannot read ${proc}/self/ns/mnt (${errnoCode(e) ?? 'error'})`;
    }
  }
  return {
    notHostPath(path: string, pid: number): string | null {
      if (refuse !== null) return refuse;
      if (!Number.isSafeInteger(pid) || pid <= 0) return `${path}: no requester pid to compare with`;
      let theirNs: string;
      try {
        theirNs = readlinkSync(join(proc, String(pid), 'ns', 'mnt'));
      } catch (e) {
        return `${path}: cannot read the mount namespace of the requester (pid ${pid}: ${errnoCode(e) ?? 'error'})`;
      }
      if (theirNs === ownNs) return null;
      const theirRoot = join(proc, String(pid), 'root');
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
        let theirs;
        try {
          theirs = statSync(join(theirRoot, p));
        } catch (e) {
          return `${path}: ${p} is not the requester's as it is here (${errnoCode(e) ?? 'error'} through ${theirRoot}): not a host path mounted at the same path`;
        }
        if (here.dev !== theirs.dev || here.ino !== theirs.ino) {
          return `${path}: ${p} here is not the requester's ${p}: not a host path mounted at the same path`;
        }
        return null;
      }
    },
  };
}
