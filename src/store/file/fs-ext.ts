/**
 * The one place the native `fs-ext` binding (npm fs-ext, `build/Release/fs_ext.node`) is loaded.
 * Node has no `flock(2)`; this binding is the maintained way to get it (ARCHITECTURE.md "The
 * on-disk contract"). The bundler redirects the `.node` load to `ipwarden-flock.node` beside the
 * executable (scripts/build.mjs). This module is imported lazily by `flock.ts` (`loadFlock`), so
 * the binding is loaded only when a lock is first taken.
 */
import fsExt from 'fs-ext';

/**
 * `flock(2)` on an open file descriptor (fs-ext `flockSync`). `flags`: `'exnb'` = LOCK_EX|LOCK_NB,
 * `'un'` = LOCK_UN, etc. Throws the binding's Error (`code` `'EAGAIN'` when a non-blocking request
 * would block).
 */
export const flockSync: (fd: number, flags: 'sh' | 'ex' | 'shnb' | 'exnb' | 'un') => void = fsExt.flockSync;
