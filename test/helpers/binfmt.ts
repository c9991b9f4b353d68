/**
 * Running another architecture's binaries as if native (for the image test's arm64 root on an
 * amd64 machine, or the reverse): the kernel's binfmt_misc hands an ELF file of that machine to
 * qemu-user-static (Debian's `qemu-user-static`: `/usr/bin/qemu-aarch64-static`). The entry is
 * registered with the `F` flag (the kernel opens the interpreter at registration), so it also
 * works inside a chroot that has no qemu, and an `execve` made by the emulated program (the shim
 * running the standalone) is emulated too.
 *
 * What it changes, and undoes in {@link ForeignExec.release}: binfmt_misc mounted at
 * /proc/sys/fs/binfmt_misc when it was not (unmounted again), and an entry of its own
 * (`ipwarden-test-<arch>-<pid>`, removed again) unless an enabled entry with the `F` flag already
 * sends that machine's binaries to qemu (then it is used as it is). Needs root and a kernel with
 * binfmt_misc.
 */
import { spawnSync } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

const BINFMT = '/proc/sys/fs/binfmt_misc';

/** ELF header magic and mask of each architecture's executables (e_ident + e_machine), as qemu's binfmt files give them. */
const MACHINES: Record<string, { node: string; qemu: string; magic: string; mask: string }> = {
  arm64: {
    node: 'arm64',
    qemu: '/usr/bin/qemu-aarch64-static',
    magic: '\\x7f\\x45\\x4c\\x46\\x02\\x01\\x01\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x02\\x00\\xb7\\x00',
    mask: '\\xff\\xff\\xff\\xff\\xff\\xff\\xff\\x00\\xff\\xff\\xff\\xff\\xff\\xff\\xff\\xff\\xfe\\xff\\xff\\xff',
  },
  amd64: {
    node: 'x64',
    qemu: '/usr/bin/qemu-x86_64-static',
    magic: '\\x7f\\x45\\x4c\\x46\\x02\\x01\\x01\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x02\\x00\\x3e\\x00',
    mask: '\\xff\\xff\\xff\\xff\\xff\\xfe\\xfe\\x00\\xff\\xff\\xff\\xff\\xff\\xff\\xff\\xff\\xfe\\xff\\xff\\xff',
  },
};

/** Foreign binaries runnable until {@link release}. */
export interface ForeignExec {
  /** `native`, `existing entry NAME` or `registered NAME` (for the test's diagnostics). */
  readonly how: string;
  /** Removes what was set up (entry, mount); idempotent. */
  release(): void;
}

/** Why `arch` binaries cannot be run here, or undefined when {@link enableForeignExec} can set it up. */
export function foreignExecUnavailable(arch: string): string | undefined {
  const m = MACHINES[arch];
  if (m === undefined) return `unknown architecture ${arch}`;
  if (m.node === process.arch) return undefined;
  if (process.getuid?.() !== 0) return 'binfmt_misc needs root';
  if (!existsSync(m.qemu)) return `no ${m.qemu} (apt-get install qemu-user-static)`;
  if (!readFileSync('/proc/filesystems', 'utf8').split('\n').some((l) => l.trim().split(/\s+/).pop() === 'binfmt_misc')) return 'the kernel has no binfmt_misc';
  return undefined;
}

/**
 * Makes `arch` ELF executables run through qemu-user-static (nothing to do for this machine's own).
 * @throws Error when it cannot (see {@link foreignExecUnavailable}) or the mount/registration fails.
 */
export function enableForeignExec(arch: string): ForeignExec {
  const why = foreignExecUnavailable(arch);
  if (why !== undefined) throw new Error(`cannot run ${arch} binaries: ${why}`);
  const m = MACHINES[arch] as (typeof MACHINES)[string];
  if (m.node === process.arch) return { how: 'native', release: () => {} };
  let mounted = false;
  if (!existsSync(join(BINFMT, 'register'))) {
    const r = spawnSync('mount', ['-t', 'binfmt_misc', 'binfmt_misc', BINFMT], { encoding: 'utf8' });
    if (r.status !== 0) throw new Error(`mount -t binfmt_misc: ${r.stderr}`);
    mounted = true;
  }
  const unmount = (): void => {
    if (mounted) spawnSync('umount', [BINFMT]);
    mounted = false;
  };
  // An enabled entry for this machine with F (usable in a chroot) already there: use it.
  const magicHex = m.magic.replace(/\\x/g, '');
  for (const name of readdirSync(BINFMT)) {
    if (name === 'register' || name === 'status') continue;
    let text: string;
    try {
      text = readFileSync(join(BINFMT, name), 'utf8');
    } catch {
      continue;
    }
    if (/^enabled$/m.test(text) && new RegExp(`^magic ${magicHex}$`, 'm').test(text) && /^flags: .*F/m.test(text)) {
      return { how: `existing entry ${name}`, release: unmount };
    }
  }
  const name = `ipwarden-test-${arch}-${process.pid}`;
  try {
    writeFileSync(join(BINFMT, 'register'), `:${name}:M::${m.magic}:${m.mask}:${m.qemu}:F`);
  } catch (e) {
    unmount();
    throw new Error(`registering ${name} in binfmt_misc: ${e instanceof Error ? e.message : String(e)}`);
  }
  let released = false;
  return {
    how: `registered ${name}`,
    release: () => {
      if (released) return;
      released = true;
      try {
        writeFileSync(join(BINFMT, name), '-1');
      } catch {
        // already gone
      }
      unmount();
    },
  };
}
