/**
 * Run the built daemon (`node dist/ipwarden.cjs daemon …`) as a child process for black-box
 * tests, with its own empty `--data-dir` and `--cni-conf-dir` (so it never reconciles the host)
 * unless the test gives its own. Resolves once the daemon logged `daemon started` and answered a
 * VERSION request on its socket (a condition, not a sleep). The child gets a clean environment
 * (PATH only, plus `env`), and is killed (SIGKILL, by pid) if the test process exits first.
 * The helper's own temp dir (`<tmpdir>/ipwd-daemon-*`) is removed by `stop()`, or — when no
 * `stop()` ran (a test that threw, a daemon killed and never stopped) — at the test process's exit.
 * Requires `npm run build`.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readlinkSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ROOT } from './cni.ts';
import { runViaDaemon } from './daemon-client.ts';
import { sigkillAndWaitSync } from './kill-sync.ts';

/** One JSON log line of the daemon (pino's shape). */
export type LogLine = Record<string, unknown> & { level: number; msg: string };

/** Options of {@link startTestDaemon}. */
export interface TestDaemonOptions {
  /** Socket path (default: `<own temp dir>/run/plugin.sock`). */
  socket?: string;
  /** `--data-dir` (default: an empty directory of its own). */
  dataDir?: string;
  /** `--cni-conf-dir` (default: an empty directory of its own). */
  cniConfDir?: string;
  /** `--log-level` (default `debug`: tests wait on debug lines). */
  logLevel?: string;
  /** More arguments after the defaults. */
  args?: string[];
  /** Extra environment of the daemon process. */
  env?: Record<string, string>;
  /** Do not wait for readiness (for tests of a daemon that must refuse to start). */
  noWait?: boolean;
  /** The bundle run as the daemon (default `<repo>/dist/ipwarden.cjs`; a benchmark's A/B gives another build's). */
  bundle?: string;
  /**
   * A command that execs its arguments (no fork: the pid stays the daemon's), run between setpriv
   * and node — e.g. `unshare --mount … sh -c '…; exec "$@"' sh` to give the daemon a mount
   * namespace of its own, as a container has.
   */
  wrap?: string[];
}

/** A daemon child process. */
export interface TestDaemon {
  readonly pid: number;
  readonly socket: string;
  readonly dataDir: string;
  readonly cniConfDir: string;
  /** Parsed log lines so far (stderr). */
  readonly logs: readonly LogLine[];
  /** Raw stderr so far. */
  readonly stderr: () => string;
  /** Resolves with the first log line (already seen or future) matching `pred`; rejects if the daemon exits first. */
  waitForLog(pred: (l: LogLine) => boolean): Promise<LogLine>;
  /** Resolves when the process has exited. */
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  /** SIGTERM, then wait for the exit; removes the helper's temp dir. Idempotent. */
  stop(): Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  /** Send `signal` to the daemon (by pid). */
  kill(signal: NodeJS.Signals): void;
}

/** Pids of the daemons of this process still running. */
const running = new Set<number>();
/** The helper's own temp dirs (`<tmpdir>/ipwd-daemon-*`) not yet removed by a stop(). */
const ownDirs = new Set<string>();

/*
 * At the exit of the test process: SIGKILL (by pid) every daemon still running and wait until it
 * is dead, then remove the own temp dir of every daemon whose stop() never ran — a test that threw
 * before it, a daemon SIGKILLed by its test and replaced by another, one that refused to start.
 * One listener for all daemons, registered when this module loads: before the 'exit' listeners of
 * the test file that imports it, so the daemons are dead before the file's own cleanup removes
 * directories they write to (a run interrupted by a signal: test/helpers/exit-on-signal.mjs). Each
 * step is tried on its own: one failure does not skip the rest.
 */
process.on('exit', () => {
  for (const pid of running) sigkillAndWaitSync(pid);
  for (const dir of ownDirs) {
    try {
      rmSync(dir, { recursive: true, force: true, maxRetries: 3 });
    } catch {
      // keep going: the other directories
    }
  }
});

/** Start a daemon; see the module comment. */
export async function startTestDaemon(opts: TestDaemonOptions = {}): Promise<TestDaemon> {
  const bundle = opts.bundle ?? join(ROOT, 'dist/ipwarden.cjs');
  if (!existsSync(bundle)) throw new Error(`no ${bundle}: run "npm run build" first`);
  const own = mkdtempSync(join(tmpdir(), 'ipwd-daemon-'));
  const socket = opts.socket ?? join(own, 'run', 'plugin.sock');
  const dataDir = opts.dataDir ?? join(own, 'data');
  const cniConfDir = opts.cniConfDir ?? join(own, 'net.d');
  // Any free port for the metrics unless the test names one: daemons of parallel tests must not collide on 9617.
  const metrics = (opts.args ?? []).includes('--metrics-address') ? [] : ['--metrics-address', '127.0.0.1:0'];
  // The offline journal of pools in the daemon's own directory unless the test names one: never
  // the host's default (/var/lib/cni/networks/.ipwarden-pool-offline).
  const journal = (opts.args ?? []).includes('--pool-journal-dir') ? [] : ['--pool-journal-dir', join(own, 'pool-journal')];
  // No warm-up unless the test asks (its 2,000 self-requests would load every test's machine):
  // tests of the warm-up and the benchmarks pass --warm-up. Another build (a benchmark's
  // baseline) may not know the flag: its own default then.
  const warm = (opts.args ?? []).includes('--warm-up') || opts.bundle !== undefined ? [] : ['--warm-up', '0'];
  const args = [bundle, 'daemon', '--socket', socket, '--data-dir', dataDir, '--cni-conf-dir', cniConfDir, '--log-level', opts.logLevel ?? 'debug', ...metrics, ...journal, ...warm, ...(opts.args ?? [])];
  // exec'd through setpriv --pdeathsig: the daemon dies with this test process even when a signal
  // ends it (no 'exit' handler runs then). setpriv execs node, so the pid is the daemon's.
  const child: ChildProcess = spawn('/usr/bin/setpriv', ['--pdeathsig', 'KILL', '--', ...(opts.wrap ?? []), process.execPath, ...args], { env: { PATH: '/usr/bin:/bin', ...(opts.env ?? {}) }, stdio: ['ignore', 'ignore', 'pipe'] });
  const pid = child.pid;
  if (pid === undefined) {
    rmSync(own, { recursive: true, force: true });
    throw new Error('the daemon did not start');
  }
  running.add(pid);
  ownDirs.add(own);

  const logs: LogLine[] = [];
  let raw = '';
  let partial = '';
  const waiters: Array<{ pred: (l: LogLine) => boolean; resolve: (l: LogLine) => void; reject: (e: Error) => void }> = [];
  child.stderr?.on('data', (c: Buffer) => {
    raw += c.toString('utf8');
    partial += c.toString('utf8');
    let nl: number;
    while ((nl = partial.indexOf('\n')) >= 0) {
      const line = partial.slice(0, nl);
      partial = partial.slice(nl + 1);
      let l: LogLine;
      try {
        l = JSON.parse(line) as LogLine;
      } catch {
        continue;
      }
      logs.push(l);
      for (const w of [...waiters]) {
        if (w.pred(l)) {
          waiters.splice(waiters.indexOf(w), 1);
          w.resolve(l);
        }
      }
    }
  });
  let hasExited = false;
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => {
    child.on('exit', (code, signal) => {
      hasExited = true;
      // The pid may be reused from now on: never signal it at exit. Its directory stays listed
      // until stop() removes it (or the exit of this process does).
      running.delete(pid);
      // Lines still buffered in the pipe arrive before 'close'.
      child.on('close', () => {
        for (const w of waiters.splice(0)) w.reject(new Error(`the daemon exited (code ${code}, signal ${signal}) before the log line came; stderr:\n${raw}`));
        resolve({ code, signal });
      });
    });
  });

  const waitForLog = (pred: (l: LogLine) => boolean): Promise<LogLine> => {
    const seen = logs.find(pred);
    if (seen !== undefined) return Promise.resolve(seen);
    if (hasExited) return Promise.reject(new Error(`the daemon has exited; stderr:\n${raw}`));
    return new Promise((resolve, reject) => waiters.push({ pred, resolve, reject }));
  };

  let stopping: Promise<{ code: number | null; signal: NodeJS.Signals | null }> | null = null;
  const d: TestDaemon = {
    pid,
    socket,
    dataDir,
    cniConfDir,
    logs,
    stderr: () => raw,
    waitForLog,
    exited,
    kill: (signal) => {
      if (!hasExited) process.kill(pid, signal);
    },
    stop: () =>
      (stopping ??= (async () => {
        if (!hasExited) process.kill(pid, 'SIGTERM');
        const r = await exited;
        rmSync(own, { recursive: true, force: true });
        ownDirs.delete(own);
        return r;
      })()),
  };
  if (opts.noWait === true) return d;
  try {
    await waitForLog((l) => l.msg === 'daemon started');
    const v = await runViaDaemon(socket, { command: 'VERSION', stdin: '{"cniVersion":"1.0.0"}' });
    if (v.exitCode !== 0) throw new Error(`VERSION through the daemon failed: ${v.stdout}`);
  } catch (e) {
    await d.stop();
    throw e;
  }
  return d;
}

/** True when process `pid` has `path` open (its /proc/PID/fd links; false when unreadable). */
export function hasOpen(pid: number, path: string): boolean {
  let fds: string[];
  try {
    fds = readdirSync(`/proc/${pid}/fd`);
  } catch {
    return false;
  }
  return fds.some((fd) => {
    try {
      return readlinkSync(`/proc/${pid}/fd/${fd}`) === path;
    } catch {
      return false;
    }
  });
}
