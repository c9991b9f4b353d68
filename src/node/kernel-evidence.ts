/**
 * Which IP addresses are configured on an interface somewhere on this node, and which CNI
 * operations are running right now — read from the kernel, not from any runtime's bookkeeping.
 *
 * Sources (all measured on Linux 6.x, Debian 12):
 * - `/proc/<pid>/net/fib_trie` and `/proc/<pid>/net/if_inet6` show the network namespace of
 *   `<pid>` without entering it (proc(5) "/proc/pid/net"). In `fib_trie` an address configured on
 *   an interface is an IP line followed by a `/32 host LOCAL` line (the local route the kernel adds
 *   for every IPv4 address, `fib_add_ifaddr`); it stays listed while the link is down. Since Linux
 *   4.1 the main and local tables share one trie, so `Main:` and `Local:` print the same leaves.
 *   `if_inet6` lists IPv6 addresses with their interface; the kernel drops an IPv6 address when its
 *   link goes down (unless `keep_addr_on_down`), but keeps one added to a link that was never up.
 * - `/proc/<pid>/ns/net` reads as `net:[INODE]`, the namespace identity; an nsfs file pinned by a
 *   bind mount (`ip netns add`, containerd, CRI-O, Docker) has that same inode under `stat(2)` and
 *   the device of `/proc/self/ns/net`.
 * - `/proc/<pid>/environ` (NUL-separated) carries `CNI_COMMAND`/`CNI_CONTAINERID` for a CNI plugin
 *   the runtime exec'd (CNI SPEC.md §Parameters).
 *
 * Node cannot `setns(2)`, so namespaces that only a pinned file holds are read by ONE helper
 * process for all of them: ipwarden's own static `ipwarden-netns` (native/netns.c) beside the
 * running program, so a node or an image with nothing but the kernel and libc needs no other
 * program (issue 10); else `perl` (Essential on Debian, `perl-base`) calling `setns` per file; or
 * failing that one `sh` loop over `nsenter --net=FILE cat …` (util-linux).
 *
 * Pinned files live in a mount namespace: a process outside the host's (a DaemonSet pod whose
 * manifest lacks the `/run/netns` mount, or mounts it without `mountPropagation`) sees an empty
 * directory, or plain empty files where the host has nsfs bind mounts, and would take them for
 * "nothing pinned" (issue 17: 5 addresses of a pinned namespace were released and one handed out
 * again). So when `<procDir>/self/ns/mnt` differs from the host's (`<procDir>/1/ns/mnt`, else
 * `<procDir>/2/ns/mnt`: kthreadd, in the initial mount namespace), the directories are ALSO read as
 * the host sees them, through `<procDir>/<pid>/root` (proc(5) `/proc/pid/root`; symlinks on the way,
 * `/var/run` → `/run`, are resolved inside that root); what cannot be read there makes the
 * evidence incomplete, and "absent" or "empty" here is never taken for "absent on the host".
 *
 * Blind spots (documented, not reported as `incomplete`): a namespace kept alive only by an open
 * file descriptor, by a thread other than a process's main thread, or by a bind mount outside
 * `netnsDirs`; pins made in a mount namespace that is neither this process's nor the host's (pid 1's,
 * or kthreadd's when pid 1's is closed to us); an IPv4 `local` route added by hand
 * (`ip route add local X dev lo`) looks exactly like an address in `fib_trie`.
 */
import { execFile, execFileSync } from 'node:child_process';
import { closeSync, existsSync, lstatSync, openSync, readdirSync, readFileSync, readlinkSync, readSync, realpathSync, statSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { AppError, errnoCode } from '../common/errors.ts';
import { formatIP, parseIP } from '../common/ip.ts';
import { untrustedReason } from '../common/trust.ts';

/** One network namespace in which an address is configured. */
export interface AddressHolder {
  /**
   * Namespace identity, the text of `readlink /proc/PID/ns/net` (`net:[4026531992]`). When the
   * link of every process inside could not be read (EACCES even as root: the process has
   * capabilities we lack) and no readable process shares the namespace, it is
   * `unidentified:[fib_trie INODE]`, INODE being the per-namespace inode of its `fib_trie` file.
   */
  readonly netns: string;
  /** How it was reached: `/proc/1234/ns/net` (a pid inside it) or `/run/netns/cni-abc` (a pinned file). */
  readonly via: string;
  /** A process inside that namespace; null when only a pinned file holds it. */
  readonly pid: number | null;
  /** Interface name for IPv6 (from `if_inet6`); null for IPv4 (`fib_trie` does not name it). */
  readonly ifname: string | null;
}

/** A CNI plugin process running now: its environment has `CNI_COMMAND` and `CNI_CONTAINERID`. */
export interface InFlightOperation {
  /** The plugin process (host PID namespace). */
  readonly pid: number;
  /** The CNI verb, the value of `CNI_COMMAND` (`ADD`, `DEL`, `CHECK`, `GC`, …). */
  readonly command: string;
  /** The process's short name, `/proc/<pid>/comm` (`bridge`, `ipwarden`); null when it exited meanwhile. */
  readonly comm: string | null;
  /** `CNI_CONTAINERID`. */
  readonly containerId: string;
  /** `CNI_IFNAME`, or null when absent or empty. */
  readonly ifname: string | null;
}

/** What the kernel says is in use (see {@link readKernelEvidence}). */
export interface KernelEvidence {
  /** Canonical IP text ({@link formatIP}) → every namespace where it is configured on an interface. */
  readonly addresses: ReadonlyMap<string, readonly AddressHolder[]>;
  /**
   * `CNI_CONTAINERID` → the processes running a CNI operation for it. A plugin chain shows every
   * link that is still running (the main plugin that exec'd an IPAM plugin has the same
   * environment); the caller decides which of them are itself.
   */
  readonly inFlight: ReadonlyMap<string, readonly InFlightOperation[]>;
  /**
   * null when every namespace and process could be read; else one line saying what could not
   * (not root, `/proc` not listable, not the host PID namespace, a namespace that could not be
   * entered, an environment that could not be read…). Positive evidence is valid either way;
   * absence is only proof when this is null.
   */
  readonly incomplete: string | null;
  /**
   * The entries of `netnsDirs` (as given, `/run/netns`) that could not be read completely: listing
   * failed here or in the host's view, or the host's view could not be reached or compared (then
   * every one). [] when every directory was read (absent ones count as read). Each is also named
   * in `incomplete`.
   */
  readonly unreadPinDirs: readonly string[];
  /** Distinct network namespaces read. */
  readonly namespaces: number;
  /** Live processes examined (vanished ones are not counted). */
  readonly processes: number;
}

/** Options of {@link readKernelEvidence}. */
export interface KernelEvidenceOptions {
  /** procfs root; default `/proc`. Pids listed here must be of the host PID namespace. */
  procDir?: string;
  /**
   * Directories of pinned namespace files (absolute paths); default {@link DEFAULT_NETNS_DIRS}.
   * One missing in this mount namespace is skipped when this is the host's mount namespace, or when
   * it is missing in the host's view too ({@link readKernelEvidence}).
   */
  netnsDirs?: readonly string[];
  /** A pid whose environment is not scanned for CNI variables; default `process.pid`. */
  selfPid?: number;
  /** Effective uid to judge privileges by; default `process.geteuid()`. For tests. */
  euid?: number;
  /**
   * Read every process's environment for the CNI operations in flight (default true). False: no
   * `environ` is read (about a third of the cost on a busy node), `inFlight` is empty and its
   * failures do not make the evidence incomplete — for a reader that wants the addresses only.
   */
  inFlight?: boolean;
}

/**
 * Where runtimes pin network namespaces:
 * - `/run/netns`, `/var/run/netns`: iproute2 `ip netns add`; containerd's CRI plugin
 *   (`netnsMountDir = "/var/run/netns"` in `sandbox_run.go`); CRI-O (`namespaces_dir = "/var/run"`,
 *   crio.conf(5), pinns makes `<dir>/netns/<id>`). `/var/run` is usually a symlink to `/run`;
 *   directories are deduplicated by real path.
 * - `/run/containerd/io.containerd.grpc.v1.cri/netns`: containerd with
 *   `netns_mounts_under_state_dir = true` (`<StateDir>/netns`, default state dir).
 * - `/var/run/docker/netns`: Docker's sandboxes (libnetwork).
 */
export const DEFAULT_NETNS_DIRS: readonly string[] = [
  '/run/netns',
  '/var/run/netns',
  '/run/containerd/io.containerd.grpc.v1.cri/netns',
  '/var/run/docker/netns',
];

const V4_LOOPBACK_MASK = 0xff000000;
const V4_LOOPBACK_NET = 0x7f000000;

function isV4Loopback(s: string): boolean {
  const ip = parseIP(s);
  return ip !== null && ip.family === 4 && (Number(ip.value) & V4_LOOPBACK_MASK) >>> 0 === V4_LOOPBACK_NET;
}

const FIB_LEAF = /^\s*\|--\s+(\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3})\s*$/;
const FIB_ALIAS = /^\s*\/(\d+)\s+(\S+)\s+(\S+)/;

/**
 * The IPv4 addresses configured on interfaces in the text of `/proc/<pid>/net/fib_trie`: every
 * leaf (`|-- 10.1.0.5`) that has a `/32 host LOCAL` alias line below it (a leaf may have several:
 * `10.78.0.0` on a /31 shows `/32 host LOCAL` and `/31 link UNICAST`). Loopback 127.0.0.0/8 is left
 * out; each address appears once (the trie is printed under `Main:` and `Local:`), in the order
 * first seen, as canonical text. Lines of other formats (for example `if_inet6` lines in the same
 * text) are ignored.
 */
export function parseFibTrieLocal(text: string): string[] {
  const seen = new Set<string>();
  let leaf: string | null = null;
  for (const line of text.split('\n')) {
    const l = FIB_LEAF.exec(line);
    if (l !== null) {
      const ip = parseIP(l[1] as string);
      leaf = ip === null ? null : formatIP(ip);
      continue;
    }
    const a = FIB_ALIAS.exec(line);
    if (a !== null) {
      if (leaf !== null && a[1] === '32' && a[2] === 'host' && a[3] === 'LOCAL' && !isV4Loopback(leaf)) seen.add(leaf);
      continue;
    }
    leaf = null;
  }
  return [...seen];
}

/** One address of `/proc/<pid>/net/if_inet6`. */
export interface Inet6Address {
  /** Canonical IPv6 text (`fd77::5`). */
  readonly ip: string;
  /** Interface name (`eth0`). */
  readonly ifname: string;
}

const INET6_LINE = /^([0-9a-fA-F]{32})\s+[0-9a-fA-F]+\s+[0-9a-fA-F]+\s+[0-9a-fA-F]+\s+[0-9a-fA-F]+\s+(\S+)\s*$/;
const V6_LINK_LOCAL_PREFIX = 0xfe80n; // fe80::/10: the top 10 bits are 1111111010
const V6_LOOPBACK = 1n;

/**
 * The IPv6 addresses of the text of `/proc/<pid>/net/if_inet6`, whose lines are
 * `<32 hex address> <ifindex> <prefixlen> <scope> <flags> <ifname>` (all hex, kernel
 * `if6_seq_show`). Loopback `::1` and link-local `fe80::/10` are left out (never pod addresses);
 * tentative and DAD-failed addresses are kept (they are configured). Malformed lines are skipped.
 */
export function parseIfInet6(text: string): Inet6Address[] {
  const out: Inet6Address[] = [];
  for (const line of text.split('\n')) {
    const m = INET6_LINE.exec(line);
    if (m === null) continue;
    const value = BigInt(`0x${m[1] as string}`);
    if (value === V6_LOOPBACK || value >> 118n === V6_LINK_LOCAL_PREFIX >> 6n) continue;
    out.push({ ip: formatIP({ family: 6, value }), ifname: m[2] as string });
  }
  return out;
}

/**
 * The variables of a `/proc/<pid>/environ` buffer (`NAME=value` entries separated by NUL bytes),
 * decoded as UTF-8. The first entry of a name wins (as `getenv(3)` finds it); an entry without `=`
 * is skipped.
 */
export function parseEnviron(buf: Uint8Array): Map<string, string> {
  const out = new Map<string, string>();
  const text = Buffer.from(buf.buffer, buf.byteOffset, buf.byteLength).toString('utf8');
  for (const entry of text.split('\0')) {
    const eq = entry.indexOf('=');
    if (eq <= 0) continue;
    const name = entry.slice(0, eq);
    if (!out.has(name)) out.set(name, entry.slice(eq + 1));
  }
  return out;
}

/** One namespace file as the pinned-namespace helper reported it (see {@link parseNetnsDump}). */
export interface NetnsDumpEntry {
  /** The file, as passed to the helper. */
  readonly file: string;
  /** The concatenated `fib_trie` and `if_inet6` text read inside; null when `error` is set. */
  readonly text: string | null;
  /** Inode of `/proc/thread-self/net/fib_trie` inside (the static and perl helpers), else null. */
  readonly fibIno: number | null;
  /** errno number of the failure (0 when the helper could not tell), null on success. */
  readonly errno: number | null;
  /** One-line failure message, null on success. */
  readonly error: string | null;
}

/**
 * Parse the helper's output: per file, in argument order, a record `\0F <file>\n`, optionally
 * `\0I <fib_trie inode>\n`, then either `\0P\n<text>` or `\0E <errno> <message>\n`. Pure; the
 * helper is {@link readPinnedNamespaces}.
 *
 * Exactly one entry per element of `files`, in order, whatever the helper printed: a file with no
 * record of its own (the helper stopped early, or printed fewer records) is an error entry
 * (errno 0: a gap in the evidence, never "deleted"); so is a record that names another file than
 * the one at its position (the static helper prints a newline in a name as a space). Records
 * beyond the last file make every entry an error: the output cannot be matched to the files.
 */
export function parseNetnsDump(out: string, files: readonly string[]): NetnsDumpEntry[] {
  const entries: NetnsDumpEntry[] = [];
  const records = out.split('\0');
  let idx = -1;
  let named = '';
  let fibIno: number | null = null;
  let text: string | null = null;
  let errno: number | null = null;
  let error: string | null = null;
  const flush = (): void => {
    if (idx < 0 || idx >= files.length) return;
    const expected = files[idx] as string;
    if (named !== expected && named !== expected.replace(/\n/g, ' ')) {
      error = `the helper's record ${idx + 1} names ${JSON.stringify(named)}, not this file`;
      errno = 0;
    } else if (text === null && error === null) {
      error = 'the helper printed nothing for it';
      errno = 0;
    }
    entries.push({ file: expected, text: error === null ? text : null, fibIno, errno, error });
  };
  for (const r of records) {
    if (r.startsWith('F ')) {
      flush();
      idx++;
      named = r.endsWith('\n') ? r.slice(2, -1) : r.slice(2);
      fibIno = null;
      text = null;
      errno = null;
      error = null;
    } else if (r.startsWith('I ')) {
      const n = Number(r.slice(2).trim());
      fibIno = Number.isSafeInteger(n) && n > 0 ? n : null;
    } else if (r.startsWith('P\n')) {
      text = (text ?? '') + r.slice(2);
    } else if (r.startsWith('E ')) {
      const m = /^E (\d+) ?(.*)$/s.exec(r);
      if (error === null) {
        errno = m === null ? 0 : Number(m[1]);
        error = (m === null ? r.slice(2) : (m[2] as string)).replace(/\s+/g, ' ').trim();
      }
    }
  }
  flush();
  if (idx >= files.length) {
    const why = `the helper printed ${idx + 1} records for ${files.length} files`;
    return files.map((file) => ({ file, text: null, fibIno: null, errno: 0, error: why }));
  }
  for (let i = entries.length; i < files.length; i++) {
    entries.push({ file: files[i] as string, text: null, fibIno: null, errno: 0, error: 'the helper printed no record for it' });
  }
  return entries;
}

/** `setns(2)` syscall numbers by `process.arch` (arch/x86/entry/syscalls/syscall_64.tbl; asm-generic/unistd.h). */
const SETNS_NR: Readonly<Record<string, number>> = { x64: 308, arm64: 268, riscv64: 268, loong64: 268 };
const CLONE_NEWNET = 0x40000000;

// Only ENOENT from opening the pin file means "deleted meanwhile" (errno 2); it is opened without
// following a symlink and without blocking (a FIFO swapped in fails setns instead of hanging);
// a failure inside the namespace is reported as errno 0 (a gap); a missing if_inet6 is no IPv6.
const PERL_HELPER = `
use Fcntl;
my $nr = shift @ARGV;
for my $f (@ARGV) {
  print "\\0F $f\\n";
  my $ns;
  unless (sysopen($ns, $f, O_RDONLY | O_NOFOLLOW | O_NONBLOCK)) { print "\\0E ", $!+0, " open $f: $!\\n"; next; }
  if (syscall($nr, fileno($ns), ${CLONE_NEWNET}) != 0) { my $e = $!+0; $e = 0 if $e == 2; print "\\0E $e setns $f: $!\\n"; close($ns); next; }
  close($ns);
  my @st = stat('/proc/thread-self/net/fib_trie');
  my $h;
  unless (@st && open($h, '<', '/proc/thread-self/net/fib_trie')) { print "\\0E 0 fib_trie in $f: $!\\n"; next; }
  my $t = do { local $/; <$h> }; close($h);
  print "\\0I $st[1]\\n";
  print "\\0P\\n";
  print $t if defined $t;
  if (open($h, '<', '/proc/thread-self/net/if_inet6')) { local $/; my $u = <$h>; print $u if defined $u; close($h); }
  elsif ($!+0 != 2) { print "\\0E 0 if_inet6 in $f: $!\\n"; }
}
`;

const SH_HELPER = `for f; do
  printf '\\0F %s\\n' "$f"
  if [ ! -e "$f" ] && [ ! -L "$f" ]; then printf '\\0E 2 %s: deleted\\n' "$f"; continue; fi
  if [ -L "$f" ]; then printf '\\0E 0 %s: a symlink\\n' "$f"; continue; fi
  if out=$(nsenter --net="$f" sh -c 'cat /proc/thread-self/net/fib_trie && { cat /proc/thread-self/net/if_inet6 2>/dev/null || [ ! -e /proc/thread-self/net/if_inet6 ]; }' 2>&1); then
    printf '\\0P\\n%s\\n' "$out"
  else
    printf '\\0E 0 %s\\n' "$out"
  fi
done`;

/**
 * Upper bound of the pinned-namespace helper, milliseconds: the reader runs under a network's
 * lock (lockTimeout 30 s by default, heal deadline 15 s); a helper that takes longer gives
 * incomplete evidence.
 */
export const PINNED_HELPER_TIMEOUT_MS = 5000;

/** Result of {@link readPinnedNamespaces}. */
export interface PinnedRead {
  /** One entry per file, in order; [] when `failure` is set. */
  readonly entries: readonly NetnsDumpEntry[];
  /** Why no helper could run (both missing, timed out…), else null. */
  readonly failure: string | null;
}

function spawnFailure(e: unknown): string {
  const code = errnoCode(e);
  const status = (e as { status?: unknown } | undefined)?.status;
  const stderr = String((e as { stderr?: unknown } | undefined)?.stderr ?? '').trim().split('\n')[0] ?? '';
  if (code !== undefined) return code;
  return `exit status ${String(status)}${stderr === '' ? '' : `: ${stderr}`}`;
}

/** File name of the static pinned-namespace helper (native/netns.c), installed beside the program. */
export const NETNS_HELPER_NAME = 'ipwarden-netns';

/**
 * The static pinned-namespace helper beside the running program — `dist/` for the built bundle,
 * the directory of the single executable (`/opt/cni/bin`, the image's `/usr/lib/ipwarden`) — as
 * `{ path }`, or `{ path: null, why }` when there is none there (running from source: the perl and
 * sh helpers are used) or it is not to be trusted: only a regular file (a symlink planted there is
 * not followed), owned by root or the effective user, in a directory of the same owners, neither
 * writable by group or others (else anyone who can write there would run code as root, and could
 * print records that make the evidence look complete). `opts.dir` (default: this program's
 * directory) and `opts.euid` (default `process.geteuid()`) are for tests.
 */
export function locateNetnsHelper(opts: { dir?: string; euid?: number } = {}): { path: string; why: null } | { path: null; why: string } {
  const euid = opts.euid ?? process.geteuid?.() ?? 0;
  let dir: string;
  try {
    dir = opts.dir ?? dirname(fileURLToPath(import.meta.url));
  } catch {
    return { path: null, why: 'the program has no file location' };
  }
  const p = join(dir, NETNS_HELPER_NAME);
  try {
    const st = lstatSync(p);
    if (!st.isFile()) return { path: null, why: `${p} is not a regular file` };
    const bad = untrustedReason(p, st, euid) ?? untrustedReason(dir, statSync(dir), euid);
    return bad === null ? { path: p, why: null } : { path: null, why: `${bad}: not run` };
  } catch (e) {
    return { path: null, why: `no ${NETNS_HELPER_NAME} beside the program in ${dir} (${errnoCode(e) ?? 'error'})` };
  }
}

/** Path of the trusted helper ({@link locateNetnsHelper}), or null. */
export function netnsHelperPath(): string | null {
  return locateNetnsHelper().path;
}

/**
 * One step of a reader written once for both drivers ({@link runSync}, {@link runAsync}): `pause`
 * is a point where the asynchronous driver lets the event loop run (the synchronous one goes on);
 * `exec` runs a helper program and resumes the reader with its output or its error.
 */
type Step = { readonly kind: 'pause' } | { readonly kind: 'exec'; readonly file: string; readonly args: readonly string[] };

/** What an `exec` step resumes the reader with: stdout, or an error shaped as `execFileSync` throws it. */
type ExecOutcome = { readonly ok: true; readonly out: string } | { readonly ok: false; readonly error: unknown };

/** A reader: yields {@link Step}s, returns its result. */
type Steps<T> = Generator<Step, T, ExecOutcome | undefined>;

const EXEC_OPTS = { encoding: 'utf8' as const, maxBuffer: 256 * 1024 * 1024, timeout: PINNED_HELPER_TIMEOUT_MS, stdio: ['ignore', 'pipe', 'pipe'] as ['ignore', 'pipe', 'pipe'] };

/** Drive `g` to its end synchronously: helpers run with `execFileSync`, pauses are skipped. */
function runSync<T>(g: Steps<T>): T {
  let r = g.next();
  while (r.done !== true) {
    const step = r.value;
    if (step.kind === 'pause') {
      r = g.next();
      continue;
    }
    let outcome: ExecOutcome;
    try {
      outcome = { ok: true, out: execFileSync(step.file, [...step.args], EXEC_OPTS) };
    } catch (e) {
      outcome = { ok: false, error: e };
    }
    r = g.next(outcome);
  }
  return r.value;
}

/**
 * `execFile` as a promise that never rejects, its failure shaped as `execFileSync` throws it (what
 * {@link spawnFailure} reads): an errno `code` (`ENOENT`, `ETIMEDOUT` when the timeout killed the
 * helper), else the exit `status` and the `stderr` text.
 */
function execOutcome(file: string, args: readonly string[]): Promise<ExecOutcome> {
  return new Promise((resolve) => {
    execFile(file, [...args], EXEC_OPTS, (error, stdout, stderr) => {
      if (error === null) {
        resolve({ ok: true, out: stdout });
        return;
      }
      const e = error as NodeJS.ErrnoException & { killed?: boolean; signal?: string | null; code?: unknown };
      const timedOut = e.killed === true && e.signal === 'SIGTERM';
      const code = timedOut ? 'ETIMEDOUT' : typeof e.code === 'string' ? e.code : undefined;
      const status = typeof e.code === 'number' ? e.code : null;
      resolve({ ok: false, error: Object.assign(new Error(e.message), code === undefined ? { status, stderr } : { code, status, stderr }) });
    });
  });
}

/** Drive `g` to its end without blocking the event loop for long: helpers run with `execFile`, each pause yields to the loop. */
async function runAsync<T>(g: Steps<T>): Promise<T> {
  let r = g.next();
  while (r.done !== true) {
    const step = r.value;
    if (step.kind === 'pause') {
      await new Promise<void>((resolve) => setImmediate(resolve));
      r = g.next();
      continue;
    }
    r = g.next(await execOutcome(step.file, step.args));
  }
  return r.value;
}

/**
 * Read `fib_trie` and `if_inet6` inside each of the namespace `files` with ONE helper process:
 * `ipwarden-netns` ({@link netnsHelperPath}) when it is installed beside the program; else `perl -e` calling `setns(2)` per file when perl exists and `process.arch` is one of x64, arm64,
 * riscv64, loong64 (about 7 ms for 50 files here); else `sh -c` looping over `nsenter --net=FILE cat
 * …` (about 2.5 ms per file). Synchronous; {@link PINNED_HELPER_TIMEOUT_MS} timeout (no fallback
 * after a timeout). Needs CAP_SYS_ADMIN (root).
 */
export function readPinnedNamespaces(files: readonly string[]): PinnedRead {
  return runSync(pinnedSteps(files));
}

/** The steps of {@link readPinnedNamespaces}. */
function* pinnedSteps(files: readonly string[]): Steps<PinnedRead> {
  if (files.length === 0) return { entries: [], failure: null };
  const own = locateNetnsHelper();
  let ownFailure: string | null = own.why;
  if (own.path !== null) {
    const r = yield { kind: 'exec', file: own.path, args: files };
    if (r?.ok === true) return { entries: parseNetnsDump(r.out, files), failure: null };
    const e = r?.ok === false ? r.error : undefined;
    ownFailure = `${NETNS_HELPER_NAME}: ${spawnFailure(e)}`;
    if (errnoCode(e) === 'ETIMEDOUT') return { entries: [], failure: ownFailure };
  }
  const nr = SETNS_NR[process.arch];
  let failures: string | null = ownFailure;
  if (nr !== undefined) {
    const r = yield { kind: 'exec', file: 'perl', args: ['-e', PERL_HELPER, String(nr), ...files] };
    if (r?.ok === true) return { entries: parseNetnsDump(r.out, files), failure: null };
    const e = r?.ok === false ? r.error : undefined;
    failures = `${ownFailure === null ? '' : `${ownFailure}; `}perl: ${spawnFailure(e)}`;
    // Timed out: the files hang whatever reads them; no second helper (the caller holds a lock).
    if (errnoCode(e) === 'ETIMEDOUT') return { entries: [], failure: failures };
  }
  const r = yield { kind: 'exec', file: 'sh', args: ['-c', SH_HELPER, 'ipwarden-netns', ...files] };
  if (r?.ok === true) return { entries: parseNetnsDump(r.out, files), failure: null };
  const sh = `sh/nsenter: ${spawnFailure(r?.ok === false ? r.error : undefined)}`;
  return { entries: [], failure: failures === null ? sh : `${failures}; ${sh}` };
}

/** errno codes that mean "the process (or namespace) is gone", not "we may not look". */
function isVanished(e: unknown): boolean {
  const c = errnoCode(e);
  return c === 'ENOENT' || c === 'ESRCH';
}

/** A list of failures of one kind, summarised to one clause. */
class Failures {
  readonly items: string[] = [];
  private readonly noun: string;
  constructor(noun: string) {
    this.noun = noun;
  }
  add(item: string): void {
    this.items.push(item);
  }
  text(): string | null {
    if (this.items.length === 0) return null;
    if (this.items.length === 1) return `cannot read ${this.items[0] as string}`;
    return `cannot read ${this.items.length} ${this.noun} (first: ${this.items[0] as string})`;
  }
}

/**
 * Environment reader with one reused buffer (environ is usually a few KiB; the buffer doubles for
 * longer ones). Returns the bytes read (a view valid until the next call).
 */
class EnvironReader {
  private buf = Buffer.allocUnsafe(64 * 1024);
  read(path: string): Buffer {
    const fd = openSync(path, 'r');
    try {
      let n = 0;
      for (;;) {
        if (n === this.buf.length) {
          const bigger = Buffer.allocUnsafe(this.buf.length * 2);
          this.buf.copy(bigger, 0, 0, n);
          this.buf = bigger;
        }
        const room = this.buf.length - n;
        const got = readSync(fd, this.buf, n, room, null);
        n += got;
        // procfs environ_read fills the request unless the environment ends: a short read is EOF
        // (saves the extra read(2) per process, ~10 ms over 2,000 processes).
        if (got < room) break;
      }
      return this.buf.subarray(0, n);
    } finally {
      closeSync(fd);
    }
  }
}

const CNI_COMMAND_EQ = Buffer.from('CNI_COMMAND=');

/** True when `buf` has an entry starting with `CNI_COMMAND=` (cheap pre-filter before parsing). */
function hasCniCommand(buf: Buffer): boolean {
  let at = buf.indexOf(CNI_COMMAND_EQ);
  while (at >= 0) {
    if (at === 0 || buf[at - 1] === 0) return true;
    at = buf.indexOf(CNI_COMMAND_EQ, at + 1);
  }
  return false;
}

/** comm and ppid of a `/proc/<pid>/stat` line (fields after the LAST `)`: comm may hold `)`). */
export function statCommPpid(text: string): { comm: string; ppid: number } | null {
  const open = text.indexOf('(');
  const close = text.lastIndexOf(')');
  if (open < 0 || close < open) return null;
  const rest = text.slice(close + 2).split(' ');
  const ppid = Number(rest[1]);
  return Number.isInteger(ppid) ? { comm: text.slice(open + 1, close), ppid } : null;
}

function readComm(procDir: string, pid: number): string | null {
  try {
    return readFileSync(join(procDir, String(pid), 'comm'), 'utf8').replace(/\n$/, '');
  } catch {
    return null;
  }
}

function errText(e: unknown): string {
  return errnoCode(e) ?? (e instanceof Error ? e.message : String(e));
}

/** The host's view of the pin directories, through the root of a process in its mount namespace. */
interface HostPinView {
  /** `<procDir>/<pid>/root`. */
  readonly root: string;
  /** The process (1, or 2 when pid 1's `ns/mnt` is closed to us). */
  readonly pid: number;
  /** Its mount namespace, `mnt:[INODE]`. */
  readonly mnt: string;
}

/**
 * Where the host's pin directories are seen from, when not from here: `views` holds one entry per
 * mount namespace of pid 1 and pid 2 (kthreadd: the initial mount namespace) that is not this
 * process's (`<procDir>/self/ns/mnt`); [] when this process is in the host's. A `failure` (one
 * clause) when that cannot be told: our own link, or both references, cannot be read.
 */
function hostPinViews(procDir: string): { views: HostPinView[]; self: string; failure: null } | { failure: string } {
  const selfLink = join(procDir, 'self', 'ns', 'mnt');
  let self: string;
  try {
    self = readlinkSync(selfLink);
  } catch (e) {
    return { failure: `cannot read ${selfLink}: ${errText(e)}: whether this process sees the host's pinned network namespaces cannot be told` };
  }
  const closed: string[] = [];
  const seen = new Set<string>();
  const views: HostPinView[] = [];
  for (const pid of [1, 2]) {
    const link = join(procDir, String(pid), 'ns', 'mnt');
    let mnt: string;
    try {
      mnt = readlinkSync(link);
    } catch (e) {
      closed.push(`${link}: ${errText(e)}`);
      continue;
    }
    if (seen.has(mnt)) continue;
    seen.add(mnt);
    if (mnt !== self) views.push({ root: join(procDir, String(pid), 'root'), pid, mnt });
  }
  if (seen.size === 0) {
    return { failure: `cannot read the host's mount namespace (${closed.join('; ')}): whether this process sees the host's pinned network namespaces cannot be told` };
  }
  return { views, self, failure: null };
}

/** An `ELOOP` error for {@link resolveInside}. */
function loopError(path: string): Error {
  return Object.assign(new Error(`${path}: too many levels of symbolic links`), { code: 'ELOOP' });
}

/**
 * `path` (absolute) as seen under `root` (a `/proc/<pid>/root`): each symlink on the way is read
 * and resolved inside `root` (the kernel would resolve an absolute target such as `/var/run` →
 * `/run` from OUR root, not from the host's). Returns `root` joined with the resolved path; the
 * final component is not required to be a directory. Throws the `lstat`/`readlink` error (ENOENT,
 * ENOTDIR: absent), or ELOOP after 40 links (as `path_resolution(7)`).
 */
function resolveInside(root: string, path: string): string {
  const parts = (p: string): string[] => p.split('/').filter((c) => c !== '' && c !== '.');
  const rest = parts(path);
  const done: string[] = [];
  let links = 0;
  while (rest.length > 0) {
    const c = rest.shift() as string;
    if (c === '..') {
      done.pop(); // `..` of the root is the root
      continue;
    }
    const here = join(root, ...done, c);
    if (!lstatSync(here).isSymbolicLink()) {
      done.push(c);
      continue;
    }
    if (++links > 40) throw loopError(here);
    const target = readlinkSync(here);
    if (target.startsWith('/')) done.length = 0;
    rest.unshift(...parts(target));
  }
  return join(root, ...done);
}

/**
 * Read, from the kernel, every address configured on an interface in every network namespace of
 * the node, and every CNI operation in flight. Synchronous; never throws (what could not be read
 * is described by `incomplete`).
 *
 * Steps: list `<procDir>`; for each process read `ns/net` and, for the first process of each
 * namespace, `net/fib_trie` and `net/if_inet6` (a process that vanishes mid-way is skipped and the
 * next process of that namespace is used); read every `environ` except `selfPid`'s and pid 1's
 * (pid 1 is started by the kernel, never exec'd by a runtime as a CNI plugin; on some hosts its
 * environ is closed even to root). A process whose `ns/net` link is closed to us (EACCES) is matched
 * to a namespace by the inode of its `fib_trie` file. Then each nsfs file in `netnsDirs` whose
 * namespace no process is inside is read through {@link readPinnedNamespaces} (one helper process).
 * When this process is not in the host's mount namespace, each directory is listed a second time as
 * the host sees it ({@link hostPinViews}: `<procDir>/1/root<dir>`, or `<procDir>/2/root<dir>`), its
 * pins passed to the helper by that path (`/proc/1/root/run/netns/cni-…`); a namespace listed in both
 * views is read once, by this view's path.
 *
 * `incomplete` is set when: euid is not 0; `<procDir>` cannot be listed or holds no process;
 * `<procDir>/2` is not `kthreadd` (not the host PID namespace: other containers' processes are
 * invisible); a namespace or environ could not be read for another reason than the process exiting;
 * a netns directory could not be listed; the helper could not run or could not enter a file; (when
 * `netnsDirs` is not empty) this process's or the host's mount namespace cannot be read, or the
 * host's view of a directory cannot be read (`<procDir>/<pid>/root` closed: no SYS_PTRACE). A
 * directory absent in the host's view is absent; absent or empty here proves nothing when this is
 * not the host's mount namespace.
 */
export function readKernelEvidence(opts: KernelEvidenceOptions = {}): KernelEvidence {
  return runSync(evidenceSteps(opts));
}

/**
 * {@link readKernelEvidence}, the same reads in the same order with the same result, without
 * holding the event loop for the whole read: it lets the loop run every
 * {@link EVIDENCE_PAUSE_EVERY} processes and pinned files, and runs the pinned-namespace helper
 * with `execFile` instead of `execFileSync`. For a resident process that reads the kernel
 * periodically (the daemon's kernel address index, src/node/kernel-index.ts). Never rejects.
 */
export function readKernelEvidenceAsync(opts: KernelEvidenceOptions = {}): Promise<KernelEvidence> {
  return runAsync(evidenceSteps(opts));
}

/** Processes (or pinned files) read between two pauses of {@link readKernelEvidenceAsync}: about 0.3 ms of work each time here. */
export const EVIDENCE_PAUSE_EVERY = 64;

/** The steps of {@link readKernelEvidence}. */
function* evidenceSteps(opts: KernelEvidenceOptions): Steps<KernelEvidence> {
  const procDir = opts.procDir ?? '/proc';
  const netnsDirs = opts.netnsDirs ?? DEFAULT_NETNS_DIRS;
  const selfPid = opts.selfPid ?? process.pid;
  const euid = opts.euid ?? process.geteuid?.() ?? -1;
  const withInFlight = opts.inFlight ?? true;

  const general: string[] = [];
  const nsFailures = new Failures('network namespaces');
  const envFailures = new Failures('process environments');
  const pinFailures = new Failures('pinned network namespaces');
  const notRoot = euid !== 0;
  if (notRoot) general.push(`not running as root (euid ${euid}): other users' namespaces and environments cannot be read`);

  const addresses = new Map<string, AddressHolder[]>();
  const inFlight = new Map<string, InFlightOperation[]>();
  /** netns identity → the process or file it was read through. */
  const readNs = new Map<string, { pid: number | null; via: string }>();
  /** netns identities that could not be read (already reported). */
  const failedNs = new Set<string>();
  let processes = 0;

  const addHolder = (ip: string, h: AddressHolder): void => {
    const list = addresses.get(ip);
    if (list === undefined) addresses.set(ip, [h]);
    else if (!list.some((x) => x.netns === h.netns && x.ifname === h.ifname)) list.push(h);
  };
  const addText = (netns: string, via: string, pid: number | null, text: string): void => {
    for (const ip of parseFibTrieLocal(text)) addHolder(ip, { netns, via, pid, ifname: null });
    for (const a of parseIfInet6(text)) addHolder(a.ip, { netns, via, pid, ifname: a.ifname });
  };
  /** Read a namespace through `<procDir>/<pid>/net`; false when the process vanished. */
  const readViaPid = (netns: string, pid: number): boolean => {
    const base = join(procDir, String(pid), 'net');
    let text: string;
    try {
      text = readFileSync(join(base, 'fib_trie'), 'utf8');
    } catch (e) {
      // Gone only when the process's net/ is gone (exited, or a zombie: no namespaces any more);
      // a missing file in the net/ of a live process is a gap.
      if (isVanished(e) && !existsSync(base)) return false;
      nsFailures.add(`${join(base, 'fib_trie')}: ${errText(e)}`);
      failedNs.add(netns); // reported once, not retried through every process inside
      return true;
    }
    try {
      text += readFileSync(join(base, 'if_inet6'), 'utf8');
    } catch (e) {
      // No if_inet6 in a live process's namespace: the kernel has no IPv6 (ipv6.disable=1).
      if (!(isVanished(e) && existsSync(join(base, 'fib_trie')))) {
        nsFailures.add(`${join(base, 'if_inet6')}: ${errText(e)}`);
        failedNs.add(netns);
        return true;
      }
    }
    readNs.set(netns, { pid, via: join(procDir, String(pid), 'ns', 'net') });
    addText(netns, join(procDir, String(pid), 'ns', 'net'), pid, text);
    return true;
  };

  let names: string[] = [];
  try {
    names = readdirSync(procDir);
  } catch (e) {
    general.push(`cannot list ${procDir}: ${errText(e)}`);
  }
  const pids = names.filter((n) => /^\d+$/.test(n)).map(Number).sort((a, b) => a - b);
  if (names.length > 0 && pids.length === 0) general.push(`no processes under ${procDir}: procfs is not mounted there`);
  if (pids.length > 0 && !notRoot) {
    let kthreadd = false;
    try {
      const s = statCommPpid(readFileSync(join(procDir, '2', 'stat'), 'utf8'));
      kthreadd = s !== null && s.comm === 'kthreadd' && s.ppid === 0;
    } catch {
      kthreadd = false;
    }
    if (!kthreadd) general.push(`${procDir} is not of the host PID namespace (pid 2 is not kthreadd): other containers' processes are not visible`);
  }

  const env = new EnvironReader();
  /** Processes whose ns/net link we may not read: pid → the error. */
  const unidentified = new Map<number, string>();
  let sincePause = 0;
  for (const pid of pids) {
    if (++sincePause % EVIDENCE_PAUSE_EVERY === 0) yield { kind: 'pause' };
    const dir = join(procDir, String(pid));
    let netns: string | null = null;
    try {
      netns = readlinkSync(join(dir, 'ns', 'net'));
    } catch (e) {
      if (isVanished(e)) continue; // exited, or a zombie (no namespaces any more)
      unidentified.set(pid, errText(e));
    }
    processes++;
    if (netns !== null && !readNs.has(netns) && !failedNs.has(netns)) {
      if (!readViaPid(netns, pid)) {
        processes--;
        continue;
      }
    }
    if (!withInFlight || pid === selfPid || pid === 1) continue;
    let buf: Buffer;
    try {
      buf = env.read(join(dir, 'environ'));
    } catch (e) {
      if (isVanished(e)) continue;
      envFailures.add(`${join(dir, 'environ')}: ${errText(e)}`);
      continue;
    }
    if (!hasCniCommand(buf)) continue;
    const vars = parseEnviron(buf);
    const command = vars.get('CNI_COMMAND');
    const containerId = vars.get('CNI_CONTAINERID');
    if (command === undefined || containerId === undefined || containerId === '') continue;
    const ifname = vars.get('CNI_IFNAME');
    const op: InFlightOperation = { pid, command, comm: readComm(procDir, pid), containerId, ifname: ifname === undefined || ifname === '' ? null : ifname };
    const list = inFlight.get(containerId);
    if (list === undefined) inFlight.set(containerId, [op]);
    else list.push(op);
  }

  // Processes whose ns/net link is closed to us: match by the fib_trie inode (unique per live namespace).
  if (unidentified.size > 0) {
    const fibInoOf = (pid: number): number | null => {
      try {
        return statSync(join(procDir, String(pid), 'net', 'fib_trie')).ino;
      } catch {
        return null;
      }
    };
    const byFib = new Map<number, string>();
    for (const [netns, r] of readNs) {
      if (r.pid === null) continue;
      const ino = fibInoOf(r.pid);
      if (ino !== null) byFib.set(ino, netns);
    }
    for (const [pid, error] of unidentified) {
      const ino = fibInoOf(pid);
      if (ino === null) {
        nsFailures.add(`${join(procDir, String(pid), 'ns', 'net')}: ${error}`);
        continue;
      }
      if (byFib.has(ino)) continue;
      const netns = `unidentified:[fib_trie ${ino}]`;
      byFib.set(ino, netns);
      readViaPid(netns, pid);
    }
  }

  // Pinned namespace files that no process is inside.
  let nsfsDev: number | null = null;
  for (const p of [join(procDir, 'self', 'ns', 'net'), '/proc/self/ns/net']) {
    try {
      nsfsDev = statSync(p).dev;
      break;
    } catch {
      // try the next
    }
  }
  // Views of the directories: this process's own (root null), then the host's when this is not its
  // mount namespace (issue 17: an empty or unmounted /run/netns here is not the host's).
  const views: Array<{ root: string | null }> = [{ root: null }];
  const viewFailures: string[] = [];
  const unreadDirs = new Set<string>();
  if (netnsDirs.length > 0 && !notRoot) {
    const h = hostPinViews(procDir);
    if (h.failure !== null) {
      viewFailures.push(h.failure);
      for (const d of netnsDirs) unreadDirs.add(d);
    } else {
      for (const v of h.views) {
        try {
          if (!statSync(v.root).isDirectory()) throw Object.assign(new Error('not a directory'), { code: 'ENOTDIR' });
          views.push({ root: v.root });
        } catch (e) {
          viewFailures.push(
            `this process is not in the host's mount namespace (${h.self}; pid ${v.pid} is in ${v.mnt}) and cannot read the host's view through ${v.root}: ${errText(e)}: the host's pinned network namespaces are not seen`,
          );
          for (const d of netnsDirs) unreadDirs.add(d);
        }
      }
    }
  }
  const pinned: Array<{ file: string; netns: string }> = [];
  const pinnedNs = new Set<string>();
  for (const view of views) {
    const seenDirs = new Set<string>();
    for (const d of netnsDirs) {
      const shown = view.root === null ? d : join(view.root, d);
      let at: string;
      let raw: Buffer[];
      try {
        // Here: by the given path (deduplicated by real path). The host's: resolved inside its root.
        const real = view.root === null ? realpathSync(d) : resolveInside(view.root, d);
        at = view.root === null ? d : real;
        if (seenDirs.has(real)) continue;
        seenDirs.add(real);
        raw = readdirSync(at, { encoding: 'buffer' });
      } catch (e) {
        if (errnoCode(e) === 'ENOENT' || errnoCode(e) === 'ENOTDIR') continue;
        pinFailures.add(`${shown}: ${errText(e)}`);
        unreadDirs.add(d);
        continue;
      }
      const entries: string[] = [];
      for (const b of raw) {
        const name = b.toString('utf8');
        // A name that is not UTF-8 cannot be passed on by its text: a pin we cannot read is a gap.
        if (!Buffer.from(name, 'utf8').equals(b)) {
          pinFailures.add(`${at}/${b.toString('latin1')}: a name that is not UTF-8 (hex ${b.toString('hex')})`);
          unreadDirs.add(d);
        } else entries.push(name);
      }
      for (const name of entries.sort()) {
        if (++sincePause % EVIDENCE_PAUSE_EVERY === 0) yield { kind: 'pause' };
        const file = join(at, name);
        let st;
        try {
          // lstat: a symlink here is never followed (root follows no link it did not make).
          st = lstatSync(file);
        } catch (e) {
          if (errnoCode(e) !== 'ENOENT') {
            pinFailures.add(`${file}: ${errText(e)}`);
            unreadDirs.add(d);
          }
          continue; // ENOENT: removed meanwhile
        }
        // An nsfs bind mount has the nsfs device; a plain or stale file (unmounted, or a bind
        // mount that did not propagate into this mount namespace) does not.
        if (nsfsDev === null || st.dev !== nsfsDev || !st.isFile()) continue;
        const netns = `net:[${st.ino}]`;
        if (readNs.has(netns) || pinnedNs.has(netns)) continue;
        pinnedNs.add(netns);
        pinned.push({ file, netns });
      }
    }
  }
  // setns(2) needs CAP_SYS_ADMIN: without root the helper could only fail.
  if (pinned.length > 0 && !notRoot) {
    const r = yield* pinnedSteps(pinned.map((p) => p.file));
    if (r.failure !== null) {
      pinFailures.add(`${pinned.length === 1 ? (pinned[0] as { file: string }).file : `${pinned.length} files`}: ${r.failure}`);
    } else {
      const unidentifiedByFib = new Map<number, string>();
      for (const netns of readNs.keys()) {
        const m = /^unidentified:\[fib_trie (\d+)\]$/.exec(netns);
        if (m !== null) unidentifiedByFib.set(Number(m[1]), netns);
      }
      r.entries.forEach((entry, i) => {
        const p = pinned[i];
        if (p === undefined) return;
        if (entry.error !== null) {
          if (entry.errno === 2) return; // the namespace was deleted meanwhile
          pinFailures.add(`${p.file}: ${entry.error}`);
          return;
        }
        const same = entry.fibIno === null ? undefined : unidentifiedByFib.get(entry.fibIno);
        if (same !== undefined) {
          // Already read through a process whose ns/net link was closed to us: now we know its name.
          readNs.delete(same);
          for (const [ip, list] of addresses) addresses.set(ip, list.map((h) => (h.netns === same ? { ...h, netns: p.netns } : h)));
        } else {
          addText(p.netns, p.file, null, entry.text ?? '');
        }
        readNs.set(p.netns, { pid: null, via: p.file });
      });
    }
  }

  // Nothing read at all is no evidence that nothing is in use.
  if (!notRoot && general.length === 0 && (processes === 0 || readNs.size === 0)) {
    general.push(`no network namespace could be read through ${procDir} (${processes} processes seen)`);
  }
  // Without root, every other failure is a consequence of that one: name only the cause.
  const clauses = notRoot ? general : [...general, ...viewFailures, nsFailures.text(), envFailures.text(), pinFailures.text()].filter((c): c is string => c !== null);
  return {
    addresses,
    inFlight,
    incomplete: clauses.length === 0 ? null : clauses.join('; '),
    unreadPinDirs: [...new Set(netnsDirs.filter((d) => unreadDirs.has(d)))],
    namespaces: readNs.size,
    processes,
  };
}

function canonical(ip: string): string {
  const v = parseIP(ip);
  if (v === null) throw new AppError('INTERNAL', `not an IP address: ${JSON.stringify(ip)}`);
  return formatIP(v);
}

/**
 * True when `ip` (any text form `parseIP` accepts) is configured on an interface in some namespace.
 * @throws AppError INTERNAL when `ip` is not an address (a caller bug).
 */
export function isInUse(ev: KernelEvidence, ip: string): boolean {
  return ev.addresses.has(canonical(ip));
}

/**
 * The namespaces where `ip` is configured ([] when none).
 * @throws AppError INTERNAL when `ip` is not an address.
 */
export function holdersOf(ev: KernelEvidence, ip: string): readonly AddressHolder[] {
  return ev.addresses.get(canonical(ip)) ?? [];
}

/** The CNI operations running for `containerId` ([] when none). */
export function inFlightFor(ev: KernelEvidence, containerId: string): readonly InFlightOperation[] {
  return ev.inFlight.get(containerId) ?? [];
}
