/**
 * The install watch's retry of a failing reinstall (src/daemon/install-watch.ts, docs/daemon.md
 * "Installed files"): capped exponential backoff — 1 s, doubling, at most 60 s — with one log line
 * per failure naming the next try, and back to 1 s once a reinstall succeeded.
 *
 * Real parts: a temp bin dir, the real file checks and inotify, and install-cni stood in for by a
 * real `sh` child that fails (exit 1, an install-cni-like message) until the test creates its MARK
 * file, then writes the planned file. Time is a fake {@link WatchClock}: it moves only when the test
 * advances it, so the retry times are exact.
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, lstatSync, mkdirSync, readFileSync, renameSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { createLogger } from '../../src/daemon/log.ts';
import { hashInstalledFile, InstallWatch, reinstallBackoffMs, REINSTALL_RETRY_MAX_MS, type WatchClock } from '../../src/daemon/install-watch.ts';
import { tempDir } from '../helpers/cni.ts';

/** A clock whose time moves only in {@link advanceTo}; a timer already due runs on the next turn. */
class FakeWatchClock implements WatchClock {
  t = 0;
  readonly wall0 = Date.UTC(2026, 11, 6, 3, 0, 0);
  private timers: Array<{ at: number; fn: () => void }> = [];
  /** Whether a timer is due at exactly `at`. */
  has(at: number): boolean {
    return this.timers.some((x) => x.at === at);
  }
  now(): number {
    return this.t;
  }
  wallNow(): number {
    return this.wall0 + this.t;
  }
  setTimeout(fn: () => void, ms: number): () => void {
    const x = { at: this.t + Math.max(0, ms), fn };
    this.timers.push(x);
    if (x.at <= this.t) setImmediate(() => this.fire(x));
    return () => {
      this.timers = this.timers.filter((y) => y !== x);
    };
  }
  private fire(x: { at: number; fn: () => void }): void {
    if (!this.timers.includes(x)) return;
    this.timers = this.timers.filter((y) => y !== x);
    x.fn();
  }
  /** Run every timer due by `t` in time order (the time set to each one's), then stand at `t`. */
  advanceTo(t: number): void {
    for (;;) {
      const due = this.timers.filter((x) => x.at <= t).sort((a, b) => a.at - b.at)[0];
      if (due === undefined) break;
      this.t = Math.max(this.t, due.at);
      this.fire(due);
    }
    this.t = t;
  }
}

type Line = Record<string, unknown> & { msg: string };

/** A debug logger whose lines are kept (`lines`), and `nth(msg, n)`: the `n`-th (1-based) line with message `msg`, now or when it comes. */
function capturedLog(): { log: ReturnType<typeof createLogger>; lines: Line[]; nth: (msg: string, n: number) => Promise<Line> } {
  const lines: Line[] = [];
  const waiters: Array<{ pred: (l: Line) => boolean; resolve: (l: Line) => void }> = [];
  const log = createLogger('debug', {
    stream: {
      write: (s: string) => {
        const l = JSON.parse(s) as Line;
        lines.push(l);
        for (const w of [...waiters]) if (w.pred(l)) waiters.splice(waiters.indexOf(w), 1), w.resolve(l);
      },
    },
  });
  const nth = (msg: string, n: number): Promise<Line> => {
    const pred = (l: Line) => l.msg === msg && lines.filter((x) => x.msg === msg).indexOf(l) === n - 1;
    const seen = lines.find(pred);
    return seen !== undefined ? Promise.resolve(seen) : new Promise((resolve) => waiters.push({ pred, resolve }));
  };
  return { log, lines, nth };
}

describe('install watch: a failing reinstall is retried with capped exponential backoff', () => {
  const t = tempDir('ipwarden-install-watch-');
  const bin = join(t.dir, 'opt', 'cni', 'bin');
  const side = join(t.dir, 'side');
  const mark = join(side, 'MARK');
  const runs = join(side, 'runs');
  mkdirSync(bin, { recursive: true, mode: 0o755 });
  mkdirSync(side);
  const { log, lines, nth } = capturedLog();
  const runCount = (): number => (existsSync(runs) ? readFileSync(runs, 'utf8').split('\n').filter((x) => x !== '').length : 0);
  const FAILED = 'reinstall of the installed files failed';
  const DEFERRED = 'installed files not in place: reinstall deferred (backing off)';
  const MESSAGE = 'install-cni: cannot write the plugin (test)';
  const script = [
    `echo run >> '${runs}'`,
    `if [ -e '${mark}' ]; then printf plugin-v1 > '${bin}/ipwarden.tmp' && chmod 755 '${bin}/ipwarden.tmp' && mv '${bin}/ipwarden.tmp' '${bin}/ipwarden'; exit 0; fi`,
    `echo 'ipwarden: ${MESSAGE}' >&2`,
    'exit 1',
  ].join('\n');
  const clock = new FakeWatchClock();
  const watch = new InstallWatch(
    { dir: bin, plan: () => [{ name: 'ipwarden', mode: 0o755, content: Buffer.from('plugin-v1') }], argv: ['/bin/sh', '-c', script] },
    { log, clock, intervalMs: 10_000, settleMs: 200 },
  );
  after(async () => {
    await watch.close();
    t.cleanup();
  });

  it('the delays: 1, 2, 4, 8, 16, 32 s, then 60 s', () => {
    assert.deepEqual([1, 2, 3, 4, 5, 6, 7, 8, 20].map(reinstallBackoffMs), [1000, 2000, 4000, 8000, 16_000, 32_000, 60_000, 60_000, 60_000]);
    assert.equal(REINSTALL_RETRY_MAX_MS, 60_000);
  });

  it('each failure is logged with the next try; no install-cni runs before it is due, whatever the checks in between; a success resets the delay', async () => {
    await watch.start();
    clock.advanceTo(0);
    const expectDelays = [1, 2, 4, 8, 16, 32, 60, 60];
    let at = 0;
    for (const [i, delay] of expectDelays.entries()) {
      const l = await nth(FAILED, i + 1);
      assert.deepEqual(
        { failures: l['failures'], retryInSeconds: l['retryInSeconds'], nextRetryAt: l['nextRetryAt'], error: l['error'], exitStatus: l['exitStatus'] },
        { failures: i + 1, retryInSeconds: delay, nextRetryAt: new Date(clock.wall0 + at + delay * 1000).toISOString(), error: MESSAGE, exitStatus: 1 },
      );
      assert.equal(runCount(), i + 1);
      assert.equal(watch.problem(), `installed files not in place in ${bin}: ipwarden (missing); the reinstall failed: ${MESSAGE}`);
      // Just before the retry is due (the 10 s backstop checks run meanwhile: no install-cni),
      // then at it.
      at += delay * 1000;
      if (i + 1 < expectDelays.length) {
        const deferred = lines.filter((x) => x.msg === DEFERRED).length;
        clock.advanceTo(at - 1);
        if (Math.floor((at - 1) / 10_000) > Math.floor((at - delay * 1000) / 10_000)) {
          // A backstop check fell in the wait: it ran, and started no install-cni.
          const d = await nth(DEFERRED, deferred + 1);
          assert.deepEqual([d['failures'], d['retryInSeconds']], [i + 1, 0.001]);
          assert.equal(runCount(), i + 1);
        }
        clock.advanceTo(at);
      }
    }
    assert.equal(lines.filter((l) => l.msg === FAILED).length, 8);

    // install-cni works again: the retry due at `at` reinstalls.
    writeFileSync(mark, '');
    clock.advanceTo(at - 1);
    clock.advanceTo(at);
    const ok = await nth('installed files reinstalled', 1);
    assert.deepEqual([ok['reason'], ok['files']], ['missing', ['ipwarden']]);
    assert.equal(watch.problem(), null);
    assert.equal(runCount(), 9);
    assert.equal(readFileSync(join(bin, 'ipwarden'), 'utf8'), 'plugin-v1');

    // The check 1 s after the reinstall finds the file in place: the count starts again.
    clock.advanceTo(at + 1000);
    const settled = await nth('installed files in place', 1);
    assert.equal(settled['reinstallsInARow'], 1);
    // Failing again later: the first retry is 1 s again.
    rmSync(mark);
    rmSync(join(bin, 'ipwarden'));
    clock.advanceTo(at + 10_000);
    const again = await nth(FAILED, 9);
    assert.deepEqual([again['failures'], again['retryInSeconds']], [1, 1]);
    assert.equal(runCount(), 10);
  });
});

describe('install watch: a file swapped between its lstat and its read is never followed nor blocks', () => {
  const t = tempDir('ipwarden-install-hash-');
  after(() => t.cleanup());

  it('a FIFO, a symlink, another file: each answered at once, without reading', async () => {
    const f = join(t.dir, 'ipwarden');
    writeFileSync(f, 'plugin-v1');
    const st = lstatSync(f, { bigint: true });
    assert.deepEqual(await hashInstalledFile(f, st), { sha: createHash('sha256').update('plugin-v1').digest('hex'), size: 9 });
    // What the lstat saw was the regular file; by the open it is a FIFO with no writer (an open
    // that followed it would wait for one forever). The first file is kept (its inode not reused).
    renameSync(f, join(t.dir, 'kept'));
    execFileSync('mkfifo', [f]);
    assert.deepEqual(await hashInstalledFile(f, st), { changed: 'replaced while checked: not a regular file' });
    rmSync(f);
    symlinkSync('/dev/zero', f);
    assert.deepEqual(await hashInstalledFile(f, st), { changed: 'replaced while checked: a symlink' });
    rmSync(f);
    writeFileSync(join(t.dir, 'other'), 'plugin-v1');
    renameSync(join(t.dir, 'other'), f);
    assert.deepEqual(await hashInstalledFile(f, st), { changed: 'replaced while checked' });
  });
});

describe('install watch: another installer that rewrites the files after each reinstall is not fought in a loop', () => {
  const t = tempDir('ipwarden-install-churn-');
  const bin = join(t.dir, 'bin');
  const runs = join(t.dir, 'runs');
  mkdirSync(bin, { mode: 0o755 });
  const { log, lines, nth } = capturedLog();
  const runCount = (): number => (existsSync(runs) ? readFileSync(runs, 'utf8').split('\n').filter((x) => x !== '').length : 0);
  // Our install-cni writes v1; the other installer (the test) writes v2, of the same size and mode.
  const script = `echo run >> '${runs}'; printf plugin-v1 > '${bin}/ipwarden.tmp' && chmod 755 '${bin}/ipwarden.tmp' && mv '${bin}/ipwarden.tmp' '${bin}/ipwarden'`;
  const foreign = (): void => {
    writeFileSync(join(bin, 'other.tmp'), 'plugin-v2', { mode: 0o755 });
    renameSync(join(bin, 'other.tmp'), join(bin, 'ipwarden'));
  };
  const clock = new FakeWatchClock();
  const watch = new InstallWatch({ dir: bin, plan: () => [{ name: 'ipwarden', mode: 0o755, content: Buffer.from('plugin-v1') }], argv: ['/bin/sh', '-c', script] }, { log, clock, intervalMs: 600_000, settleMs: 200 });
  after(async () => {
    await watch.close();
    t.cleanup();
  });
  /**
   * The first line with message `msg` after the first `from` lines, moving the clock on by the
   * settle time whenever the watch waits for it (the event of a write has come: its quiet-time
   * timer is armed), but never to `limit` or past it.
   */
  const nextLine = async (msg: string, from: number, limit: number): Promise<Line> => {
    for (;;) {
      const l = lines.slice(from).find((x) => x.msg === msg);
      if (l !== undefined) return l;
      if (clock.has(clock.t + 200) && clock.t + 200 < limit) clock.advanceTo(clock.t + 200);
      await new Promise((r) => setImmediate(r));
    }
  };
  const REINSTALLED = 'installed files reinstalled';
  const DEFERRED = 'installed files not in place: reinstall deferred (backing off)';
  const ANOTHER = 'installed files changed again after each reinstall: is another installer writing the directory?';

  it('reinstalls 1, 2, 4 s apart while rewritten, says so on /readyz and in the log, and starts again at 1 s once they stay', async () => {
    await watch.start();
    clock.advanceTo(0);
    // The file is missing at start: reinstall 1 at t = 0.
    assert.deepEqual((await nth(REINSTALLED, 1))['reinstallsInARow'], 1);
    assert.equal(runCount(), 1);
    let at = 0;
    for (const [i, delay] of [1000, 2000, 4000].entries()) {
      const from = lines.length;
      foreign();
      // Checked (at once, or after the quiet time), and not reinstalled before the retry is due.
      const d = await nextLine(DEFERRED, from, at + delay);
      assert.equal(d['reinstallsInARow'], i + 1);
      assert.equal(watch.problem(), `installed files not in place in ${bin}: ipwarden (its content differs); reinstalled ${i + 1} time${i === 0 ? '' : 's'} in a row and changed again each time (another installer writing the directory: a second ipwarden daemon, another version?); next reinstall in ${delay / 1000} s`);
      clock.advanceTo(at + delay - 1);
      assert.equal(runCount(), i + 1);
      at += delay;
      clock.advanceTo(at);
      const r = await nth(REINSTALLED, i + 2);
      assert.deepEqual([r['reason'], r['reinstallsInARow']], ['changed', i + 2]);
      assert.equal(runCount(), i + 2);
      const w = await nth(ANOTHER, i + 1);
      assert.deepEqual([w['reinstallsInARow'], w['retryInSeconds'], w['nextRetryAt']], [i + 2, reinstallBackoffMs(i + 2) / 1000, new Date(clock.wall0 + at + reinstallBackoffMs(i + 2)).toISOString()]);
    }
    assert.equal(at, 7000);
    // The other installer stopped: the check when the next retry was due finds v1 in place.
    clock.advanceTo(at + 8000);
    const settled = await nth('installed files in place', 1);
    assert.equal(settled['reinstallsInARow'], 4);
    assert.equal(watch.problem(), null);
    // Rewritten once more: reinstalled at once again (after the quiet time), not 16 s later.
    const from = lines.length;
    foreign();
    const again = await nextLine(REINSTALLED, from, at + 8201);
    assert.deepEqual([again['reason'], again['reinstallsInARow']], ['changed', 1]);
    assert.equal(runCount(), 5);
    assert.equal(readFileSync(join(bin, 'ipwarden'), 'utf8'), 'plugin-v1');
  });
});
