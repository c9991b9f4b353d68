/**
 * The one place the native `fs-ext` binding (npm fs-ext, `build/Release/fs_ext.node`) is loaded.
 * Node has no `flock(2)`; this binding is the maintained way to get it (ARCHITECTURE.md "The
 * on-disk contract"). Kept as a tiny module so the bundler can redirect the `.node` load when the
 * plugin is shipped as one file plus the native module beside it.
 */
import fsExt from 'fs-ext';

/**
 * `flock(2)` on an open file descriptor (fs-ext `flockSync`). `flags`: `'exnb'` = LOCK_EX|LOCK_NB,
 * `'un'` = LOCK_UN, etc. Throws the binding's Error (`code` `'EAGAIN'` when a non-blocking request
 * would block).
 */
export const flockSync: (fd: number, flags: 'sh' | 'ex' | 'shnb' | 'exnb' | 'un') => void = fsExt.flockSync;
