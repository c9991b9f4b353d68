/**
 * Power loss in the middle of an ADD/DEL storm, for real (docs/on-disk-format.md "Crash promises"):
 * no address whose ADD answer was returned is ever handed out again.
 *
 * Each boot: a KVM guest (the Debian kernel installed on this machine, an initramfs built here from
 * busybox and that kernel's modules) sees the host's `/` read-only over 9p and a fresh ext4 image
 * as `/dev/vda` (the data directory, qemu `cache=writeback`). It runs `ipwarden daemon` and an
 * ADD/DEL storm through the installed shim (answered by the daemon) and through the standalone
 * plugin (test/helpers/power-cut-guest.mjs) on one /26, and records every answer it got on a
 * second virtio disk (O_DSYNC, so a record the host reads was written before the next step). When
 * the record count reaches a seeded random number, the test SIGKILLs qemu: the guest's memory, its
 * page cache included, is gone, exactly as in a power cut. Then the image is checked (e2fsck,
 * loop mount) against the records:
 * - the answers themselves never gave one address to two containers at once;
 * - every address whose ADD answer was returned and whose DEL had not begun is in the data
 *   directory as a reservation file: its owner's record, or a record that came back empty or
 *   garbled (counted as taken), never another container's;
 * - `DIR/lock` can be taken at once;
 * - ADDs of new containers on that directory, alternating ipwarden (standalone) and upstream
 *   host-local until the range is full, never return one of those addresses, and succeed exactly
 *   as many times as the range has addresses without a file.
 *
 * Crash model covered: the guest's memory and page cache are lost; what the guest had submitted to
 * its virtio disk survives (qemu wrote it into the image file, whose host page cache survives the
 * kill). A disk whose own volatile write cache loses writes it acknowledged before a flush is not
 * modelled (this kernel has no device-mapper to drop unflushed writes).
 *
 * Needs root, /dev/kvm, qemu-system-x86_64, busybox (static), a kernel under /boot whose modules
 * include 9p (Debian's linux-image-amd64; the cloud kernel has no 9p), mkfs.ext4, e2fsck, losetup,
 * upstream host-local and `npm run build`. Knobs: IPW_POWER_CUT_BOOTS (default 3),
 * IPW_POWER_CUT_SEED, IPW_POWER_CUT_ACCEL, IPW_POWER_CUT_DAEMON_BUNDLE (below). Every qemu is ended by pid, every mount and loop device undone and the temp
 * dir removed, also on failure.
 */
import assert from 'node:assert/strict';
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { chmodSync, copyFileSync, existsSync, lstatSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { basename, join } from 'node:path';
import { after, describe, it } from 'node:test';
import { haveHostLocal, HOST_LOCAL, requireOrSkip, ROOT, runCni, standalonePlugin, tempDir } from '../helpers/cni.ts';
import { rng } from '../helpers/rng.ts';
import { lockExclusive } from '../../src/store/file/flock.ts';

const BOOTS = Number(process.env['IPW_POWER_CUT_BOOTS'] ?? 3);
const SEED = Number(process.env['IPW_POWER_CUT_SEED'] ?? 1919);
const NET = 'pcut';
const SUBNET = '10.239.57.0/26';
/** host-local's default range of a /26: .1 to .62, the gateway .1 excluded. */
const RANGE_SIZE = 61;
const RECORD_BYTES = 128;
const GUEST_DATA = '/run/pcut-data';
const GUEST_SOCKET = '/run/pcut-sock/plugin.sock';
const QEMU = '/usr/bin/qemu-system-x86_64';
/**
 * qemu's accelerator. TCG (emulation) by default: on this project's CI machines (Firecracker VMs)
 * `/dev/kvm` opens but a KVM guest never gets past its firmware's switch to protected mode (SeaBIOS
 * stuck at EIP 0xea664, CR0=0x11, with every CPU model, q35/pc/microvm, PVH entry and a userspace
 * irqchip tried). The guest is the same either way, only slower. `IPW_POWER_CUT_ACCEL=kvm` uses KVM.
 */
const ACCEL = process.env['IPW_POWER_CUT_ACCEL'] === 'kvm' ? ['-enable-kvm', '-cpu', 'host'] : ['-accel', 'tcg,thread=multi', '-cpu', 'max'];
const BUSYBOX = '/bin/busybox';
/** Modules the guest loads (with their dependencies, from modules.dep), by name. */
/**
 * The bundle the guest's daemon runs (default this build's). Another one only for a control run,
 * e.g. a copy patched to answer before its flush, which this test must then fail.
 */
const DAEMON_BUNDLE = process.env['IPW_POWER_CUT_DAEMON_BUNDLE'] ?? join(ROOT, 'dist/ipwarden.cjs');
const GUEST_MODULES = ['virtio_pci', 'virtio_blk', 'crc32c_generic', 'ext4', '9pnet_virtio', '9p'];

interface GuestKernel {
  readonly vmlinuz: string;
  readonly modDir: string;
}

/** The newest /boot/vmlinuz-<v> whose modules include 9p, or null. */
function guestKernel(): GuestKernel | null {
  let names: string[];
  try {
    names = readdirSync('/boot').filter((n) => n.startsWith('vmlinuz-')).sort().reverse();
  } catch {
    return null;
  }
  for (const n of names) {
    const v = n.slice('vmlinuz-'.length);
    const modDir = `/lib/modules/${v}`;
    if (existsSync(join(modDir, 'kernel/fs/9p/9p.ko')) && existsSync(join(modDir, 'modules.dep'))) return { vmlinuz: join('/boot', n), modDir };
  }
  return null;
}

function have(cmd: string): boolean {
  return spawnSync('sh', ['-c', `command -v ${cmd}`], { stdio: 'ignore' }).status === 0;
}

const isRoot = process.getuid?.() === 0;
const kernel = guestKernel();
const skip = requireOrSkip(
  isRoot && existsSync('/dev/kvm') && existsSync(QEMU) && existsSync(BUSYBOX) && kernel !== null && haveHostLocal() && ['mkfs.ext4', 'e2fsck', 'losetup', 'cpio'].every(have) && existsSync(join(ROOT, 'dist/ipwarden.cjs')),
  `root, /dev/kvm, ${QEMU} (qemu-system-x86), ${BUSYBOX} (busybox-static), a kernel with 9p modules (linux-image-amd64), mkfs.ext4, e2fsck, losetup, cpio, ${HOST_LOCAL} and a build (npm run build)`,
);

/** The module files to load for `names`, dependencies first (paths relative to `modDir`). */
function moduleOrder(modDir: string, names: readonly string[]): string[] {
  const deps = new Map<string, string[]>();
  const byName = new Map<string, string>();
  for (const line of readFileSync(join(modDir, 'modules.dep'), 'utf8').split('\n')) {
    const colon = line.indexOf(':');
    if (colon < 0) continue;
    const file = line.slice(0, colon);
    deps.set(file, line.slice(colon + 1).trim().split(/\s+/).filter((s) => s !== ''));
    byName.set(basename(file).replace(/\.ko(\.\w+)?$/, '').replace(/-/g, '_'), file);
  }
  const out: string[] = [];
  const visit = (file: string): void => {
    if (out.includes(file)) return;
    for (const d of deps.get(file) ?? []) visit(d);
    out.push(file);
  };
  for (const n of names) {
    const file = byName.get(n);
    // Built into this kernel (not a module): nothing to load.
    if (file !== undefined) visit(file);
  }
  return out;
}

/** Write the guest's initramfs (busybox, the modules, /init) to `out`. */
function buildInitramfs(work: string, k: GuestKernel, out: string, guestCmd: string): void {
  const tree = join(work, 'initramfs');
  mkdirSync(join(tree, 'bin'), { recursive: true });
  mkdirSync(join(tree, 'mods'));
  copyFileSync(BUSYBOX, join(tree, 'bin/busybox'));
  chmodSync(join(tree, 'bin/busybox'), 0o755);
  const mods = moduleOrder(k.modDir, GUEST_MODULES);
  for (const m of mods) {
    if (/\.(xz|zst|gz)$/.test(m)) throw new Error(`compressed module ${m}: busybox insmod cannot load it`);
    copyFileSync(join(k.modDir, m), join(tree, 'mods', basename(m)));
  }
  const init = [
    '#!/bin/busybox sh',
    '/bin/busybox mkdir -p /proc /sys /dev /host /sbin /usr/bin /usr/sbin',
    '/bin/busybox --install -s',
    'mount -t proc proc /proc',
    'mount -t sysfs sys /sys',
    'mount -t devtmpfs dev /dev',
    ...mods.map((m) => `insmod /mods/${basename(m)} || echo "PCUT: insmod ${basename(m)} failed"`),
    'mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=512000 hostroot /host || { echo "PCUT: no 9p root"; poweroff -f; }',
    // The guest's root: a tmpfs with the host's directories bound in (never mount on a 9p
    // directory: 9p drops a dentry whose host attributes change, and the mount on it with it).
    'mkdir /newroot',
    'mount -t tmpfs root /newroot',
    'cd /newroot',
    'mkdir usr etc proc sys dev run tmp',
    'ln -s usr/bin bin; ln -s usr/lib lib; ln -s usr/lib64 lib64; ln -s usr/sbin sbin',
    `mkdir -p .${ROOT}`,
    'mount --bind /host/usr usr',
    'mount --bind /host/etc etc',
    'mount --bind /host/tmp tmp',
    `mount --bind /host${ROOT} .${ROOT}`,
    'mount -t proc proc proc',
    'mount -t sysfs sys sys',
    'mount -t devtmpfs dev dev',
    'mount -t tmpfs run run',
    `mkdir -p .${GUEST_DATA}`,
    // commit=600: no periodic journal commit during a boot, so nothing but an fsync makes a change
    // durable before the cut (the default 5 s commit would hide a missing one most of the time).
    `mount -t ext4 -o commit=600 /dev/vda .${GUEST_DATA} || { echo "PCUT: cannot mount /dev/vda"; poweroff -f; }`,
    'ip link set lo up',
    'echo PCUT: guest up',
    `exec chroot /newroot ${guestCmd}`,
    '',
  ].join('\n');
  writeFileSync(join(tree, 'init'), init, { mode: 0o755 });
  const r = spawnSync('sh', ['-c', `cd '${tree}' && find . | cpio -o -H newc --quiet > '${out}'`], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`cpio failed: ${r.stderr}`);
}

interface Rec {
  readonly kind: string;
  readonly id: string;
  readonly ip: string;
  /** On `A` records: how many requests the shim had sent to the standalone plugin so far. */
  readonly fallbacks: number;
}

/** The records the guest wrote on its record disk, in order. */
function readRecords(path: string): Rec[] {
  const b = readFileSync(path);
  const out: Rec[] = [];
  for (let off = 0; off + RECORD_BYTES <= b.length; off += RECORD_BYTES) {
    if (b[off] === 0) break;
    const end = b.indexOf(10, off);
    const [kind = '', id = '', ip = '', fb = '0'] = b.toString('latin1', off, end < 0 || end > off + RECORD_BYTES ? off + RECORD_BYTES : end).split(' ');
    out.push({ kind, id, ip, fallbacks: Number(fb) });
  }
  return out;
}

function run(cmd: string, args: string[]): { status: number; out: string } {
  const r = spawnSync(cmd, args, { encoding: 'utf8' });
  if (r.error) throw r.error;
  return { status: r.status ?? -1, out: `${r.stdout}${r.stderr}` };
}

function waitExit(p: ChildProcess): Promise<void> {
  return new Promise((resolve) => {
    if (p.exitCode !== null || p.signalCode !== null) resolve();
    else p.once('exit', () => resolve());
  });
}

interface BootResult {
  readonly adds: number;
  readonly daemonAdds: number;
  readonly fallbacks: number;
  readonly held: number;
  readonly intact: number;
  readonly emptyOrGarbled: number;
  readonly leftover: number;
  readonly postAdds: number;
  readonly e2fsck: number;
  readonly bootSeconds: number;
  readonly stormSeconds: number;
}

describe('power cut during an ADD/DEL storm (qemu guest, SIGKILL of qemu)', { skip }, () => {
  const t = tempDir('ipw-powercut-');
  const work = t.dir;
  let qemu: ChildProcess | null = null;
  let loopDev: string | null = null;
  let mounted: string | null = null;

  const undo = async (): Promise<void> => {
    if (qemu !== null && qemu.pid !== undefined && qemu.exitCode === null && qemu.signalCode === null) {
      process.kill(qemu.pid, 'SIGKILL');
      await waitExit(qemu);
    }
    qemu = null;
    if (mounted !== null) {
      spawnSync('umount', [mounted]);
      mounted = null;
    }
    if (loopDev !== null) {
      spawnSync('losetup', ['-d', loopDev]);
      loopDev = null;
    }
  };
  after(async () => {
    await undo();
    t.cleanup();
  });

  it(`${BOOTS} boots, each cut at a random point of the storm: no answered address is lost or handed out again`, { timeout: BOOTS * 600_000 }, async () => {
    const k = kernel as GuestKernel;
    const rand = rng(SEED);
    // The installed plugin (shim + standalone) the guest execs through the 9p root, same paths.
    const binDir = join(work, 'bin');
    const install = run('/usr/bin/node', [join(ROOT, 'dist/ipwarden.cjs'), 'install-cni', '--dest', binDir, '--socket', GUEST_SOCKET]);
    assert.equal(install.status, 0, install.out);
    const guestConf = join(work, 'guest-conf.json');
    writeFileSync(guestConf, JSON.stringify({ cniVersion: '1.0.0', name: NET, ipam: { type: 'ipwarden', dataDir: GUEST_DATA, ranges: [[{ subnet: SUBNET }]] } }));
    const initrd = join(work, 'initrd.img');
    buildInitramfs(work, k, initrd, `/usr/bin/node ${join(ROOT, 'test/helpers/power-cut-guest.mjs')} ${guestConf} ${binDir} ${DAEMON_BUNDLE} /dev/vdb ${GUEST_SOCKET}`);

    const results: BootResult[] = [];
    for (let boot = 0; boot < BOOTS; boot++) {
      const dataImg = join(work, `data-${boot}.img`);
      const recImg = join(work, `rec-${boot}.img`);
      const consoleLog = join(work, `console-${boot}.log`);
      const mnt = join(work, `mnt-${boot}`);
      mkdirSync(mnt);
      const mk = run('mkfs.ext4', ['-F', '-q', dataImg, '64M']);
      assert.equal(mk.status, 0, mk.out);
      writeFileSync(recImg, Buffer.alloc(4 << 20));
      // The cut: after this many records (the first is the daemon's "ready"), plus a few ms.
      const cutAfter = 12 + Math.floor(rand() * 50);
      const extraMs = Math.floor(rand() * 30);
      try {
        // no_timer_check: an emulated CPU on a loaded host is too slow for the kernel's IO-APIC
        // timer check, which then panics ("IO-APIC + timer doesn't work!", seen beside stress-ng).
        qemu = spawn(QEMU, [
          ...ACCEL, '-smp', '2', '-m', '1024', '-nodefaults', '-no-reboot', '-display', 'none', '-monitor', 'none',
          '-serial', `file:${consoleLog}`,
          '-kernel', k.vmlinuz, '-initrd', initrd, '-append', 'console=ttyS0 panic=-1 quiet loglevel=3 no_timer_check',
          '-drive', `file=${dataImg},if=virtio,format=raw,cache=writeback`,
          '-drive', `file=${recImg},if=virtio,format=raw,cache=writeback`,
          '-virtfs', 'local,path=/,mount_tag=hostroot,security_model=none,readonly=on',
        ], { stdio: ['ignore', 'ignore', 'pipe'] });
        const q = qemu;
        let qemuErr = '';
        q.stderr?.on('data', (c: Buffer) => (qemuErr += c.toString('utf8')));
        // Wait (on the record disk, through the host's page cache) until the storm has written
        // `cutAfter` records; fail if the guest stops before.
        let exited = false;
        q.once('exit', () => (exited = true));
        const t0 = Date.now();
        let readyAt = 0;
        await new Promise<void>((resolve, reject) => {
          const poll = (): void => {
            if (exited) return reject(new Error(`the guest stopped before the cut (boot ${boot}): qemu: ${qemuErr}; console: ${existsSync(consoleLog) ? readFileSync(consoleLog, 'utf8').slice(-3000) : ''}`));
            const n = readRecords(recImg).length;
            if (n > 0 && readyAt === 0) readyAt = Date.now();
            if (n >= cutAfter) return void setTimeout(resolve, extraMs);
            setTimeout(poll, 20);
          };
          poll();
        });
        process.kill(q.pid as number, 'SIGKILL');
        await waitExit(q);
        qemu = null;
        // For the report only (nothing is decided by time): boot to the daemon's start, then the storm.
        const bootSeconds = (readyAt - t0) / 1000;
        const stormSeconds = (Date.now() - readyAt) / 1000;

        // The answers, replayed: no address held by two containers at once (held from its ADD's
        // answer until its DEL is about to start).
        const recs = readRecords(recImg);
        assert.equal(recs[0]?.kind, 'R', `the first record is the daemon's start: ${JSON.stringify(recs[0])}`);
        const held = new Map<string, string>();
        const ipOf = new Map<string, string>();
        let adds = 0;
        let daemonAdds = 0;
        let fallbacks = 0;
        for (const r of recs.slice(1)) {
          if (r.kind === 'A') {
            adds++;
            // A shim ADD answered while the fallback count had not grown: the daemon's.
            if (r.id.startsWith('shim') && r.fallbacks === fallbacks) daemonAdds++;
            fallbacks = r.fallbacks;
            assert.equal(held.get(r.ip), undefined, `boot ${boot}: ${r.ip} answered to ${r.id} while ${held.get(r.ip)} held it`);
            held.set(r.ip, r.id);
            ipOf.set(r.id, r.ip);
          } else if (r.kind === 'D') {
            const ip = ipOf.get(r.id);
            assert.ok(ip !== undefined, `boot ${boot}: DEL of ${r.id}, which got no answer`);
            held.delete(ip);
          } else {
            assert.fail(`boot ${boot}: unexpected record ${JSON.stringify(r)} (a failed ADD in the storm); console: ${readFileSync(consoleLog, 'utf8').slice(-3000)}`);
          }
        }

        // The daemon's path was exercised: its answers (not the shim's fallback) are among them.
        assert.ok(daemonAdds > 0, `boot ${boot}: no ADD answered by the daemon (${fallbacks} fallbacks); console: ${readFileSync(consoleLog, 'utf8').slice(-3000)}`);
        const fsck = run('e2fsck', ['-f', '-y', dataImg]);
        assert.ok(fsck.status === 0 || fsck.status === 1, `boot ${boot}: e2fsck exit ${fsck.status}: ${fsck.out}`);
        const lo = run('losetup', ['--find', '--show', dataImg]);
        assert.equal(lo.status, 0, lo.out);
        loopDev = lo.out.trim();
        const m = run('mount', ['-t', 'ext4', loopDev, mnt]);
        assert.equal(m.status, 0, m.out);
        mounted = mnt;
        const dir = join(mnt, NET);

        // Every held address has its reservation file: its owner's, or empty/garbled (taken).
        let intact = 0;
        let emptyOrGarbled = 0;
        for (const [ip, id] of held) {
          const path = join(dir, ip);
          assert.ok(existsSync(path) && lstatSync(path).isFile(), `boot ${boot}: ${ip}, answered to ${id}, has no reservation file after the cut`);
          const content = readFileSync(path, 'latin1');
          const owner = /^([A-Za-z0-9][A-Za-z0-9_.-]*)\r\neth0$/.exec(content)?.[1];
          if (owner === undefined) emptyOrGarbled++;
          else {
            assert.equal(owner, id, `boot ${boot}: ${ip} is reserved by ${owner}, but its answer went to ${id}`);
            intact++;
          }
        }
        const files = readdirSync(dir).filter((n) => /^\d+\.\d+\.\d+\.\d+$/.test(n));
        // The lock is free.
        const lock = await lockExclusive(join(dir, 'lock'), 0);
        lock.release();

        // New containers on the recovered directory until the range is full: never a held address.
        const postConf = (type: string): string => JSON.stringify({ cniVersion: '1.0.0', name: NET, ipam: { type, dataDir: mnt, ranges: [[{ subnet: SUBNET }]] } });
        const given = new Set<string>();
        let fullBoth = false;
        for (let n = 0; n < RANGE_SIZE + 2 && !fullBoth; n++) {
          let failures = 0;
          for (const [bin, type] of [[standalonePlugin(), 'ipwarden'], [HOST_LOCAL, 'host-local']] as const) {
            const o = runCni(bin, { command: 'ADD', containerId: `post-${boot}-${n}-${type}`, ifname: 'eth0', stdin: postConf(type) });
            if (o.exitCode !== 0) {
              failures++;
              continue;
            }
            const ip = String((o.json as { ips: Array<{ address: string }> }).ips[0]?.address).split('/')[0] as string;
            assert.equal(held.get(ip), undefined, `boot ${boot}: ${type} handed out ${ip} again, answered before the cut to ${held.get(ip)}`);
            assert.ok(!given.has(ip), `boot ${boot}: ${ip} handed out twice after the cut`);
            given.add(ip);
          }
          fullBoth = failures === 2;
        }
        assert.ok(fullBoth, `boot ${boot}: the range never filled`);
        assert.equal(given.size, RANGE_SIZE - files.length, `boot ${boot}: ADDs after the cut succeed once per address without a file (${files.length} files)`);
        results.push({ adds, daemonAdds, fallbacks, held: held.size, intact, emptyOrGarbled, leftover: files.length - held.size, postAdds: given.size, e2fsck: fsck.status, bootSeconds, stormSeconds });
      } finally {
        await undo();
      }
    }
    assert.equal(results.length, BOOTS);
    // For the report: how much each cut exercised.
    console.log(`power-cut boots: ${JSON.stringify(results)}`);
  });
});
