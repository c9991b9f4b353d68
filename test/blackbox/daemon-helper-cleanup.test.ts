/**
 * test/helpers/daemon.ts leaves nothing behind, also when its caller is careless: a child process
 * (test/fixtures/daemon-helper-leaver.ts) starts three daemons through the helper — one
 * SIGKILLed and never stopped, one refused at start-up and never stopped, one left running — and
 * then dies of an uncaught error. After it exited, none of the helper's own temp dirs
 * (`/tmp/ipwd-daemon-*`) exists and none of the daemons' pids is a daemon any more. Needs root and
 * `npm run build`.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { requireOrSkip, ROOT } from '../helpers/cni.ts';

const BUNDLE = join(ROOT, 'dist', 'ipwarden.cjs');
const skip = requireOrSkip(process.getuid?.() === 0 && existsSync(BUNDLE), 'root and a build (npm run build)');

/** The command line of `pid` (NUL-separated words joined by spaces), or null when it is gone. */
function cmdline(pid: number): string | null {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').join(' ');
  } catch {
    return null;
  }
}

describe('the test daemon helper cleans up after a careless caller', { skip }, () => {
  const scratch = mkdtempSync(join(tmpdir(), 'ipwd-helper-clean-'));
  after(() => rmSync(scratch, { recursive: true, force: true }));

  it('a daemon SIGKILLed and never stopped, one refused at start-up, one left running, then an uncaught error: no own temp dir and no daemon left', () => {
    const r = spawnSync(process.execPath, ['--import', 'tsx', join(ROOT, 'test/fixtures/daemon-helper-leaver.ts'), scratch], { cwd: ROOT, encoding: 'utf8', timeout: 120_000 });
    assert.equal(r.error, undefined);
    // Died of its uncaught error (status 1), after printing what it made.
    assert.equal(r.status, 1, r.stderr);
    assert.match(r.stderr, /a test that throws, its daemons not stopped/);
    const made = JSON.parse(r.stdout.trim()) as { dirs: string[]; pids: number[] };
    assert.equal(made.dirs.length, 3);
    assert.equal(new Set(made.dirs).size, 3);
    for (const d of made.dirs) assert.match(d, new RegExp(`^${tmpdir()}/ipwd-daemon-[A-Za-z0-9]{6}$`));
    assert.deepEqual(made.dirs.filter((d) => existsSync(d)), [], 'own temp dirs left');
    // A pid may have been reused by now, never by one of our daemons (nothing else runs the bundle with this dir).
    assert.deepEqual(made.pids.filter((p, i) => (cmdline(p) ?? '').includes(made.dirs[i] as string)), [], 'daemons left running');
  });
});
