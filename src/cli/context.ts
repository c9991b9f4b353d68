/**
 * The dependencies every CLI command receives (house style 13): output streams and the
 * environment, injected so tests run commands in-process with `runMain(argv, ctx)`.
 */
import type { ReconcileDeps } from '../reconcile/options.ts';

/**
 * Injected CLI I/O and environment: the output streams, plus the reconciler's injected I/O
 * ({@link ReconcileDeps}: environment, clock, runtime source, kernel evidence, socket probe,
 * store opener), which the commands pass to the engine as is.
 */
export interface CliContext extends ReconcileDeps {
  /** Write to standard output (tables, JSON). */
  stdout(text: string): void;
  /** Write to standard error (diagnostics, usage errors). */
  stderr(text: string): void;
}

/**
 * The real process context. A closed pipe on stdout or stderr (`ipwarden leaks | head`) ends the
 * output quietly instead of an unhandled EPIPE with a stack trace.
 */
export function processContext(): CliContext {
  for (const stream of [process.stdout, process.stderr]) {
    if (stream.listenerCount('error') === 0) {
      stream.on('error', (e: NodeJS.ErrnoException) => {
        if (e.code !== 'EPIPE') throw e;
      });
    }
  }
  return {
    stdout: (t) => void process.stdout.write(t),
    stderr: (t) => void process.stderr.write(t),
    env: process.env,
    now: () => Date.now(),
  };
}
