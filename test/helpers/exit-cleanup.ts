/**
 * A last-resort cleanup at the exit of the test process, for what a test's `after`/`afterEach`
 * normally removes but an interrupted run never reaches (asynchronous hooks do not run when a
 * signal ends the process: test/helpers/exit-on-signal.mjs turns the signal into an exit, whose
 * listeners do run). Actions must be synchronous, idempotent (they also run when the hook already
 * removed the thing) and touch only what this process made (names with its pid, its own temp
 * dirs). They run in the order registered, each on its own: one that throws does not stop the
 * rest.
 *
 * The one 'exit' listener is added at the first {@link atExit} call — after the listeners
 * helpers add when they load (test/helpers/daemon.ts kills its daemons there), so the daemons are
 * dead before directories they may write to are removed.
 */
import { spawnSync } from 'node:child_process';
import { rmSync } from 'node:fs';

const actions: Array<() => void> = [];

/** Run `action` (synchronous, idempotent) when this process exits; see the module comment. */
export function atExit(action: () => void): void {
  if (actions.length === 0) {
    process.on('exit', () => {
      for (const a of actions) {
        try {
          a();
        } catch {
          // keep going: the other actions
        }
      }
    });
  }
  actions.push(action);
}

/** At exit, `ip netns del name` (nothing when it is gone already). `name` must be this process's (hold its pid). */
export function deleteNetnsAtExit(name: string): void {
  atExit(() => void spawnSync('ip', ['netns', 'del', name], { stdio: 'ignore' }));
}

/** At exit, `rm -rf path` (nothing when it is gone already). */
export function removeAtExit(path: string): void {
  atExit(() => rmSync(path, { recursive: true, force: true, maxRetries: 3 }));
}
