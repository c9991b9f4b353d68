/**
 * The daemon's watch over the files `install-cni` put in the CNI bin directory (`--cni-bin-dir`,
 * docs/daemon.md "Installed files"; issue 19 item 5). A package upgrade that re-creates
 * `/opt/cni/bin` (flannel#1721: kubernetes-cni's RPM) removes the plugin: every pod start and
 * teardown on the node fails, while the daemon said nothing and `/readyz` stayed 200. Now:
 *
 * - the watch knows each installed file's exact content ({@link InstalledFilesDeps.plan}: the
 *   records, the flock binding, the namespace helper, the standalone, the patched shim) and checks
 *   the files — `lstat` (a regular file, the mode, the size), then, when the file is not the one
 *   last verified (device, inode, size, mtime, ctime), its SHA-256 — at start, after any inotify
 *   event on the directory, its parent or `ipwarden.d` (once they have been quiet for
 *   {@link InstallWatchOptions.settleMs}: a package manager is mid-way), and every
 *   {@link InstallWatchOptions.intervalMs} as a backstop for a missed event;
 * - a file missing or changed makes {@link InstallWatch.problem} non-null (`/readyz` answers 503
 *   with it) and runs the reinstall: `install-cni` itself as a child process
 *   ({@link InstalledFilesDeps.argv}: the same code, the same atomic writes, under its lock), then
 *   a check against a fresh plan; success is logged (`installed files reinstalled`) and counted
 *   (`onReinstall`, `ipwarden_plugin_reinstalls_total{reason}`), a failure is logged with
 *   install-cni's own message and stays the problem until a later check succeeds;
 * - a failed reinstall (install-cni failed, or the files changed again right after it) is retried
 *   with capped exponential backoff ({@link reinstallBackoffMs}: 1 s, doubling, at most 60 s; back to
 *   1 s after a check finds every file in place): until the retry is due, checks still run (the
 *   problem stays current) but start no install-cni, whatever the events — a failing install-cni
 *   that touches the directory cannot spin. Each failure's log line says when the next try is.
 *
 * The child runs outside the event loop: requests keep being answered while ~100 MB is copied.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import { closeSync, constants, createReadStream, fstatSync, lstatSync, openSync, watch, type FSWatcher } from 'node:fs';
import { hostname } from 'node:os';
import { dirname, join } from 'node:path';
import { errnoCode } from '../common/errors.ts';
import type { Logger } from './log.ts';

/** One installed file as install-cni writes it (src/cli/install-cni.ts `PlannedFile`). */
export interface PlannedFile {
  /** Path relative to the bin dir. */
  readonly name: string;
  /** Permission bits. */
  readonly mode: number;
  /** Exact bytes, or the source file whose bytes it holds. */
  readonly content: Uint8Array | { readonly copyOf: string };
}

/** What the watch needs from the install (built by src/cold.ts from src/cli/install-cni.ts). */
export interface InstalledFilesDeps {
  /** The CNI bin directory, absolute. */
  readonly dir: string;
  /** The files install-cni writes there (called at start and before each reinstall); may throw. */
  plan(): readonly PlannedFile[];
  /** The command that runs `install-cni` into {@link dir} with the daemon's values. */
  readonly argv: readonly string[];
}

/** Why a file is not as installed: `missing`, or a clause (`mode 0700, not 0755`, `its content differs`). */
type Verdict = 'ok' | 'missing' | string;

/** First delay before a failed reinstall is retried, milliseconds. */
export const REINSTALL_RETRY_FIRST_MS = 1000;
/** Longest delay between two reinstall tries, milliseconds. */
export const REINSTALL_RETRY_MAX_MS = 60_000;

/**
 * Delay before the next reinstall after `failures` consecutive failed ones (≥ 1), milliseconds:
 * {@link REINSTALL_RETRY_FIRST_MS} doubled per further failure, at most {@link REINSTALL_RETRY_MAX_MS}
 * (1, 2, 4, 8, 16, 32, 60, 60 … s).
 */
export function reinstallBackoffMs(failures: number): number {
  return Math.min(REINSTALL_RETRY_MAX_MS, REINSTALL_RETRY_FIRST_MS * 2 ** Math.min(Math.max(failures, 1) - 1, 30));
}

/** The watch's time and timers (tests inject a fake one). */
export interface WatchClock {
  /** Monotonic time, milliseconds. */
  now(): number;
  /** Wall time, milliseconds since the epoch (only for the log's `nextRetryAt`). */
  wallNow(): number;
  /** Run `fn` after `ms` milliseconds without keeping the process alive; returns a cancel function. */
  setTimeout(fn: () => void, ms: number): () => void;
}

/** `performance.now`, `Date.now` and unref'd `setTimeout`s. */
export const REAL_WATCH_CLOCK: WatchClock = {
  now: () => performance.now(),
  wallNow: () => Date.now(),
  setTimeout: (fn, ms) => {
    const t = setTimeout(fn, ms);
    t.unref();
    return () => clearTimeout(t);
  },
};

/** Options of {@link InstallWatch}. */
export interface InstallWatchOptions {
  readonly log: Logger;
  /** A reinstall that put every file back; `reason` = `missing` when some file was missing, else `changed`. */
  readonly onReinstall?: (reason: 'missing' | 'changed') => void;
  /** Every file in place (true) or not (false), after each check. */
  readonly onState?: (ok: boolean) => void;
  /** Quiet time after the last event before a check, ms (default 200). */
  readonly settleMs?: number;
  /** Backstop check period, ms (default 10 000). */
  readonly intervalMs?: number;
  /** Time and timers (default {@link REAL_WATCH_CLOCK}). */
  readonly clock?: WatchClock;
}

/** SHA-256 (hex) and size of a file's bytes, read as a stream. */
async function hashFile(path: string): Promise<{ sha: string; size: number }> {
  return hashFd(openSync(path, constants.O_RDONLY));
}

/** SHA-256 (hex) and size of the bytes of the open file `fd`, read as a stream; closes `fd`. */
async function hashFd(fd: number): Promise<{ sha: string; size: number }> {
  const h = createHash('sha256');
  let size = 0;
  for await (const chunk of createReadStream('', { fd, autoClose: true }) as AsyncIterable<Buffer>) {
    h.update(chunk);
    size += chunk.length;
  }
  return { sha: h.digest('hex'), size };
}

/**
 * SHA-256 (hex) and size of the installed file at `path`, but only when it is still the regular
 * file `lstat` found (`dev`, `ino`): opened `O_NOFOLLOW|O_NONBLOCK` and checked with `fstat`, so a
 * file swapped for a symlink (to `/dev/zero`, a FIFO elsewhere) or a FIFO between the `lstat` and
 * the open is never followed, never blocks the open, and is never read; the watch stays live.
 * Returns `{ changed: why }` then (`replaced while checked: not a regular file`, `replaced while
 * checked`). Throws the open's errno error (ENOENT when it is gone meanwhile; ELOOP for a symlink
 * is turned into `changed`).
 */
export async function hashInstalledFile(path: string, expect: { readonly dev: bigint; readonly ino: bigint }): Promise<{ sha: string; size: number } | { changed: string }> {
  let fd: number;
  try {
    fd = openSync(path, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
  } catch (e) {
    if (errnoCode(e) === 'ELOOP') return { changed: 'replaced while checked: a symlink' };
    throw e;
  }
  let st;
  try {
    st = fstatSync(fd, { bigint: true });
  } catch (e) {
    closeSync(fd);
    throw e;
  }
  if (!st.isFile()) {
    closeSync(fd);
    return { changed: 'replaced while checked: not a regular file' };
  }
  if (st.dev !== expect.dev || st.ino !== expect.ino) {
    closeSync(fd);
    return { changed: 'replaced while checked' };
  }
  return hashFd(fd);
}

/** The expected SHA-256 and size of a planned file's content. */
async function expected(f: PlannedFile): Promise<{ sha: string; size: number }> {
  if ('copyOf' in f.content) return hashFile(f.content.copyOf);
  return { sha: createHash('sha256').update(f.content).digest('hex'), size: f.content.length };
}

const octal = (m: number): string => `0${(m & 0o7777).toString(8)}`;

/** The watch; see the module comment. */
export class InstallWatch {
  readonly #deps: InstalledFilesDeps;
  readonly #log: Logger;
  readonly #opts: InstallWatchOptions;
  #want: Array<{ file: PlannedFile; sha: string; size: number }> = [];
  /** name → identity (`dev:ino:size:mtimeNs:ctimeNs`) of the file last verified. */
  readonly #verified = new Map<string, string>();
  readonly #watchers = new Map<string, { w: FSWatcher; id: string }>();
  #problem: string | null = null;
  /** The state reported last (null before the first check). */
  #ok: boolean | null = null;
  #pending = false;
  #running: Promise<void> | null = null;
  #lastEvent = Number.NEGATIVE_INFINITY;
  /** A check asked for without an event (start, the backstop, a due retry): it waits for no quiet time. */
  #force = false;
  #timer: (() => void) | null = null;
  #interval: (() => void) | null = null;
  #child: ChildProcess | null = null;
  #closed = false;
  readonly #clock: WatchClock;
  /** Consecutive failed reinstalls (0 after a check found every file in place, or a reinstall succeeded). */
  #failures = 0;
  /**
   * Reinstalls that put every file back, in a row, without a check finding every file in place
   * between them (0 after such a check): each one changed again right after it — another
   * installer keeps writing the directory (a second daemon of another version, another socket).
   */
  #churn = 0;
  /** When the next reinstall may start (monotonic ms), and the last failure's message. */
  #retryAt = 0;
  #lastFailure = '';
  #retryTimer: (() => void) | null = null;

  constructor(deps: InstalledFilesDeps, opts: InstallWatchOptions) {
    this.#deps = deps;
    this.#log = opts.log;
    this.#opts = opts;
    this.#clock = opts.clock ?? REAL_WATCH_CLOCK;
  }

  /**
   * Why the installed plugin is not in place (for `/readyz`), or null: `installed files not in
   * place in <dir>: <name> (<why>), …; reinstalling` or `…; the reinstall failed: <message>`.
   */
  problem(): string | null {
    return this.#problem;
  }

  /** Compute the expected contents (throws what `plan()` throws), watch, and run the first check. */
  async start(): Promise<void> {
    await this.#refreshPlan();
    this.#log.info({ dir: this.#deps.dir, files: this.#want.map((w) => w.file.name) }, 'watching the installed files');
    this.#rearm();
    const every = this.#opts.intervalMs ?? 10_000;
    const tick = (): void => {
      this.#interval = this.#clock.setTimeout(() => {
        tick();
        this.#schedule(false);
      }, every);
    };
    tick();
    this.#schedule(false);
  }

  /** Stop watching; a reinstall in progress is killed (install-cni's next run removes its temporaries). Idempotent. */
  async close(): Promise<void> {
    this.#closed = true;
    this.#timer?.();
    this.#interval?.();
    this.#retryTimer?.();
    for (const { w } of this.#watchers.values()) w.close();
    this.#watchers.clear();
    if (this.#child?.pid !== undefined && this.#child.exitCode === null && this.#child.signalCode === null) this.#child.kill('SIGTERM');
    await this.#running;
  }

  /** The host name when the plan was last computed. */
  #planHost = hostname();

  async #refreshPlan(): Promise<void> {
    this.#planHost = hostname();
    const plan = this.#deps.plan();
    this.#want = await Promise.all(plan.map(async (file) => ({ file, ...(await expected(file)) })));
    this.#verified.clear();
  }

  /** A check soon: after `settleMs` of quiet when `event`, else at once (still after a running one). */
  #schedule(event: boolean): void {
    if (this.#closed) return;
    if (event) this.#lastEvent = this.#clock.now();
    else this.#force = true;
    this.#pending = true;
    if (this.#running !== null || this.#timer !== null) return;
    this.#arm(event ? (this.#opts.settleMs ?? 200) : 0);
  }

  #arm(ms: number): void {
    this.#timer = this.#clock.setTimeout(() => {
      this.#timer = null;
      const quiet = this.#clock.now() - this.#lastEvent;
      const settle = this.#opts.settleMs ?? 200;
      // Events keep a check waiting for quiet, but never the backstop's: a directory (or its
      // parent) written more often than every settleMs kept every check off, the plugin missing.
      if (quiet < settle && !this.#force) {
        this.#arm(settle - quiet);
        return;
      }
      this.#force = false;
      this.#running = this.#loop().finally(() => {
        this.#running = null;
        if (this.#pending && !this.#closed) this.#arm(0);
      });
    }, ms);
  }

  async #loop(): Promise<void> {
    while (this.#pending && !this.#closed) {
      this.#pending = false;
      try {
        await this.#check();
      } catch (e) {
        this.#log.error({ dir: this.#deps.dir, error: e instanceof Error ? e.message : String(e) }, 'installed files: the check failed');
      }
      this.#rearm();
    }
  }

  /** Watch the directory, its parent and `ipwarden.d` (each re-made when its inode changed). */
  #rearm(): void {
    if (this.#closed) return;
    const dir = this.#deps.dir;
    for (const path of [dirname(dir), dir, join(dir, 'ipwarden.d')]) {
      let id: string | null = null;
      try {
        const st = lstatSync(path);
        if (st.isDirectory()) id = `${st.dev}:${st.ino}`;
      } catch {
        id = null;
      }
      const had = this.#watchers.get(path);
      if (had !== undefined && had.id === id) continue;
      had?.w.close();
      this.#watchers.delete(path);
      if (id === null) continue;
      try {
        const w = watch(path, { persistent: false }, () => this.#schedule(true));
        w.on('error', () => {
          // The directory went away: the next check re-arms.
          w.close();
          if (this.#watchers.get(path)?.w === w) this.#watchers.delete(path);
          this.#schedule(true);
        });
        this.#watchers.set(path, { w, id });
      } catch {
        // Gone meanwhile: the next check re-arms.
      }
    }
  }

  async #verify(w: { file: PlannedFile; sha: string; size: number }): Promise<Verdict> {
    const path = join(this.#deps.dir, w.file.name);
    let st;
    try {
      st = lstatSync(path, { bigint: true });
    } catch (e) {
      const code = errnoCode(e);
      return code === 'ENOENT' || code === 'ENOTDIR' ? 'missing' : `cannot stat it: ${code ?? String(e)}`;
    }
    if (!st.isFile()) return 'not a regular file';
    if (Number(st.mode & 0o7777n) !== w.file.mode) return `mode ${octal(Number(st.mode))}, not ${octal(w.file.mode)}`;
    if (Number(st.size) !== w.size) return `${st.size} bytes, not ${w.size}`;
    const id = `${st.dev}:${st.ino}:${st.size}:${st.mtimeNs}:${st.ctimeNs}`;
    if (this.#verified.get(w.file.name) === id) return 'ok';
    let got;
    try {
      got = await hashInstalledFile(path, st);
    } catch (e) {
      const code = errnoCode(e);
      return code === 'ENOENT' || code === 'ENOTDIR' ? 'missing' : `cannot read it: ${code ?? String(e)}`;
    }
    if ('changed' in got) return got.changed;
    if (got.sha !== w.sha || got.size !== w.size) return 'its content differs';
    this.#verified.set(w.file.name, id);
    return 'ok';
  }

  /** Every file's verdict, in plan order, and the ones that are not ok. */
  async #verifyAll(): Promise<Array<{ name: string; why: string }>> {
    const bad: Array<{ name: string; why: string }> = [];
    for (const w of this.#want) {
      const v = await this.#verify(w);
      if (v !== 'ok') bad.push({ name: w.file.name, why: v });
    }
    return bad;
  }

  #setState(ok: boolean, problem: string | null): void {
    this.#problem = problem;
    if (this.#ok !== ok) this.#opts.onState?.(ok);
    this.#ok = ok;
  }

  async #check(): Promise<void> {
    // A renamed host: the node-name record install-cni writes names the host, so the expected
    // contents change with it (a stale record is ignored by the standalone fallback).
    if (hostname() !== this.#planHost) await this.#refreshPlan();
    const bad = await this.#verifyAll();
    const dir = this.#deps.dir;
    if (bad.length === 0) {
      // After reinstalls, only a check when the next one would have been due ends the reinstalls
      // in a row (the files stayed in place that long): the check that the reinstall's own events
      // start at once finds them in place whoever rewrites them a moment later.
      const settled = this.#churn > 0 && this.#clock.now() >= this.#retryAt;
      if (this.#ok !== true || settled) this.#log.info({ dir, ...(settled ? { reinstallsInARow: this.#churn } : {}) }, 'installed files in place');
      this.#setState(true, null);
      this.#failures = 0;
      if (this.#churn === 0 || settled) this.#resetBackoff();
      return;
    }
    const list = bad.map((b) => `${b.name} (${b.why})`).join(', ');
    const reason = bad.some((b) => b.why === 'missing') ? 'missing' : 'changed';
    if ((this.#failures > 0 || this.#churn > 0) && this.#clock.now() < this.#retryAt) {
      // Backing off after a failed reinstall, or after reinstalls whose files were changed again
      // at once: the problem stays current, no install-cni yet.
      const why = this.#failures > 0 ? `the reinstall failed: ${this.#lastFailure}` : this.#churnText();
      this.#setState(false, `installed files not in place in ${dir}: ${list}; ${why}`);
      this.#log.debug({ dir, reason, failures: this.#failures, reinstallsInARow: this.#churn, retryInSeconds: (this.#retryAt - this.#clock.now()) / 1000 }, 'installed files not in place: reinstall deferred (backing off)');
      this.#armRetry();
      return;
    }
    this.#setState(false, `installed files not in place in ${dir}: ${list}; reinstalling`);
    this.#log.warn({ dir, reason, files: Object.fromEntries(bad.map((b) => [b.name, b.why])) }, 'installed files missing or changed: reinstalling');
    if (this.#closed) return; // stopping: no new child (the next daemon checks again)
    const t0 = this.#clock.now();
    const r = await this.#runInstall();
    if (this.#closed) return;
    if (r.code !== 0) {
      const said = (r.stderr.trim() || r.stdout.trim()).split('\n')[0] ?? '';
      const message = said === '' ? `install-cni exited with ${r.signal ?? r.code}` : said.replace(/^ipwarden: /, '');
      this.#setState(false, `installed files not in place in ${dir}: ${list}; the reinstall failed: ${message}`);
      this.#log.error({ dir, reason, exitStatus: r.code, signal: r.signal, error: message, ...this.#failed(message) }, 'reinstall of the installed files failed');
      return;
    }
    // Against a fresh plan: what install-cni just copied is the source as it is now.
    await this.#refreshPlan();
    const still = await this.#verifyAll();
    const durationSeconds = (this.#clock.now() - t0) / 1000;
    if (still.length > 0) {
      const left = still.map((b) => `${b.name} (${b.why})`).join(', ');
      this.#setState(false, `installed files not in place in ${dir}: ${left}; reinstalled, but they changed again`);
      this.#log.error({ dir, reason, files: Object.fromEntries(still.map((b) => [b.name, b.why])), durationSeconds, ...this.#failed('they changed again') }, 'reinstalled, but the installed files are still not in place');
      return;
    }
    this.#setState(true, null);
    // Not back to no backoff: a check that finds every file in place does that. Until then the
    // next reinstall waits 1 s, doubling per reinstall in a row, at most 60 s: two daemons that
    // each put back their own version cannot rewrite ~100 MB in a loop (review s4-install F2).
    this.#failures = 0;
    this.#churn++;
    const delay = reinstallBackoffMs(this.#churn);
    this.#retryAt = this.#clock.now() + delay;
    this.#armRetry();
    this.#opts.onReinstall?.(reason);
    this.#log.info({ dir, reason, files: bad.map((b) => b.name), durationSeconds, output: r.stdout.trim().split('\n'), reinstallsInARow: this.#churn }, 'installed files reinstalled');
    if (this.#churn >= 2) {
      this.#log.warn({ dir, reinstallsInARow: this.#churn, retryInSeconds: delay / 1000, nextRetryAt: new Date(this.#clock.wallNow() + delay).toISOString() }, 'installed files changed again after each reinstall: is another installer writing the directory?');
    }
  }

  /** The clause `/readyz` gives while reinstalls in a row are backed off. */
  #churnText(): string {
    return `reinstalled ${this.#churn} time${this.#churn === 1 ? '' : 's'} in a row and changed again each time (another installer writing the directory: a second ipwarden daemon, another version?); next reinstall in ${Math.ceil((this.#retryAt - this.#clock.now()) / 1000)} s`;
  }

  /** Count a failed reinstall, set when the next may start and arm its check; the log fields saying when. */
  #failed(message: string): { failures: number; retryInSeconds: number; nextRetryAt: string } {
    this.#failures++;
    this.#lastFailure = message;
    const delay = reinstallBackoffMs(this.#failures + this.#churn);
    this.#retryAt = this.#clock.now() + delay;
    this.#armRetry();
    return { failures: this.#failures, retryInSeconds: delay / 1000, nextRetryAt: new Date(this.#clock.wallNow() + delay).toISOString() };
  }

  /** A check when the retry is due (one timer at a time). */
  #armRetry(): void {
    if (this.#closed || this.#retryTimer !== null) return;
    this.#retryTimer = this.#clock.setTimeout(() => {
      this.#retryTimer = null;
      this.#schedule(false);
    }, Math.max(0, this.#retryAt - this.#clock.now()));
  }

  #resetBackoff(): void {
    this.#failures = 0;
    this.#churn = 0;
    this.#retryAt = 0;
    this.#retryTimer?.();
    this.#retryTimer = null;
  }

  #runInstall(): Promise<{ code: number | null; signal: NodeJS.Signals | null; stdout: string; stderr: string }> {
    return new Promise((resolve) => {
      const [cmd, ...args] = this.#deps.argv;
      const c = spawn(cmd as string, args, { env: { PATH: process.env['PATH'] ?? '/usr/sbin:/usr/bin:/sbin:/bin' }, stdio: ['ignore', 'pipe', 'pipe'] });
      this.#child = c;
      let out = '';
      let err = '';
      c.stdout?.on('data', (d: Buffer) => (out += d.toString('utf8')));
      c.stderr?.on('data', (d: Buffer) => (err += d.toString('utf8')));
      c.on('error', (e) => {
        this.#child = null;
        resolve({ code: -1, signal: null, stdout: out, stderr: `cannot run install-cni: ${e.message}` });
      });
      c.on('close', (code, signal) => {
        this.#child = null;
        resolve({ code, signal, stdout: out, stderr: err });
      });
    });
  }
}
