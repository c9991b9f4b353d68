/**
 * Minimal declaration of the parts of the `fs-ext` native binding (npm fs-ext 2.x,
 * baudehlo/node-fs-ext `fs-ext.js`) that ipwarden uses. The package ships no types.
 */
declare module 'fs-ext' {
  /** Flags accepted by `flock`: `'sh'`, `'ex'`, `'shnb'`, `'exnb'`, `'un'`, or the numeric LOCK_* bits. */
  export type FlockFlags = 'sh' | 'ex' | 'shnb' | 'exnb' | 'un' | number;
  /**
   * `flock(2)` on `fd`, synchronously. Throws an Error with `code` (`'EAGAIN'` when a non-blocking
   * request would block, `'EBADF'`, ...), `errno` and `syscall: 'Flock'`.
   */
  export function flockSync(fd: number, flags: FlockFlags): void;
  const fsExt: { flockSync: typeof flockSync };
  export default fsExt;
}
