/**
 * Which files root may run or copy into a CNI bin directory: the rule for files found beside the
 * running program (the namespace helper, the files `install-cni` installs). Anyone who can write
 * such a file, or its directory, could otherwise run code as root on every node (a review finding
 * of issue 10). Pure: the caller stats.
 */

/** The fields of `fs.Stats` the rule reads. */
export interface OwnerMode {
  /** Owner uid. */
  readonly uid: number;
  /** `st_mode` (type and permission bits). */
  readonly mode: number;
}

/**
 * null when `st` (of a file or a directory named `what`) is owned by root or by `euid` and
 * writable by neither group nor others; else the reason, one clause naming `what`
 * (`/x is owned by uid 65534`, `/x is writable by group or others (mode 1777)`).
 */
export function untrustedReason(what: string, st: OwnerMode, euid: number): string | null {
  if (st.uid !== 0 && st.uid !== euid) return `${what} is owned by uid ${st.uid}`;
  if ((st.mode & 0o022) !== 0) return `${what} is writable by group or others (mode ${(st.mode & 0o7777).toString(8)})`;
  return null;
}
