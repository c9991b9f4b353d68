/**
 * The socket thread's program (src/daemon/socket-worker.ts) as one script, for
 * `new Worker(code, { eval: true })`: the build (scripts/build.mjs) replaces this module in the
 * bundle with the bundled worker, so the single executable, which has no file to point a Worker
 * at, carries it. Run from the sources (tsx), it is null and the worker is started from its file.
 */
export const SOCKET_WORKER_CODE: string | null = null;
