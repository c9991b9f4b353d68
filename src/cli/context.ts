/**
 * The dependencies every CLI command receives (house style 13): output streams and the
 * environment, injected so tests run commands in-process with `runMain(argv, ctx)`.
 */
import type { UseEvidence } from '../reconcile/evidence.ts';
import type { SandboxSourceFactory } from '../reconcile/sandboxes.ts';

/** Injected CLI I/O and environment. */
export interface CliContext {
  /** Write to standard output (tables, JSON). */
  stdout(text: string): void;
  /** Write to standard error (diagnostics, usage errors). */
  stderr(text: string): void;
  /** Environment variables (e.g. CONTAINER_RUNTIME_ENDPOINT). */
  readonly env: Readonly<Record<string, string | undefined>>;
  /** Current time, milliseconds since the Unix epoch (injected so tests control ages). */
  now(): number;
  /**
   * Builds the runtime's sandbox list source for `leaks` and `gc` from the resolved endpoint URL
   * (`unix:///path`). Tests inject a fake; when absent the commands use the CRI client.
   */
  readonly sandboxSource?: SandboxSourceFactory;
  /**
   * Reads the kernel evidence (addresses configured in the node's network namespaces, CNI
   * operations in flight; `src/node/kernel-evidence.ts` when absent). Tests inject literal values.
   */
  readonly evidence?: () => UseEvidence;
  /** Socket probe for the other default runtime endpoints (`existsSync` when absent). */
  readonly socketExists?: (path: string) => boolean;
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
