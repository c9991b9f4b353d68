/**
 * Preloaded into every test file's process by scripts/run-tests.mjs (`--import`): a SIGINT,
 * SIGTERM or SIGHUP — Ctrl-C on the run, `timeout` or a CI job killing the runner (which passes
 * SIGTERM on to its test files) — ends the file's process with `process.exit(128 + signal
 * number)` instead of the signal's default action, so that its synchronous `process.on('exit')`
 * cleanups still run: daemons and children killed by pid, temp dirs removed, namespaces deleted
 * (test/helpers/daemon.ts, test/helpers/cni.ts, the suites' own). Without it a signal ends the
 * process at once and none of them runs. Asynchronous `after` hooks do not run either way.
 *
 * The runner exits at once on such a signal, closing the pipes of its test files: a test file's
 * next write to stdout/stderr (its test report) fails with EPIPE, often before its own signal is
 * handled. Uncaught, that error's report to the same closed pipe fails too, and Node ends the
 * process with status 7 — no 'exit' listener runs (seen with strace on an interrupted run of
 * test/blackbox/daemon.test.ts). So an EPIPE on stdout/stderr ends the process with
 * `process.exit(141)` (128 + SIGPIPE) too: nobody reads the report any more.
 *
 * Only in a test file's process (`NODE_TEST_CONTEXT` set by node:test for its children), not in
 * the runner itself, whose own handlers report the cancelled run. Each signal is caught once: a
 * second one (a cleanup that hangs) has its default action.
 */
if ((process.env['NODE_TEST_CONTEXT'] ?? '').startsWith('child')) {
  for (const [signal, number] of [['SIGINT', 2], ['SIGTERM', 15], ['SIGHUP', 1]]) {
    process.once(signal, () => process.exit(128 + number));
  }
  for (const stream of [process.stdout, process.stderr]) {
    stream.on('error', (e) => {
      if (e.code !== 'EPIPE') throw e;
      process.exit(141);
    });
  }
}
