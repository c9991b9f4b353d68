// `npm run image` (scripts/image.mjs, issue 10; docs/deploy.md "The image"):
//
// - reproducible: two builds of this commit, each in a fresh clone of it (`git clone --shared`,
//   HEAD checked out) and each from scratch — `npm run image`'s own steps: the build with
//   IPWARDEN_NO_CODE_CACHE=1, then scripts/image.mjs (mmdebstrap, both tars, umoci) — give
//   byte-identical binaries and archives, and so the same manifest digest; every tar entry is owned
//   0:0 and dated no later than SOURCE_DATE_EPOCH (the commit time);
// - the config and index: entrypoint, cmd, labels (version, revision, created, the Debian package
//   versions, equal to the packages file inside the image), the name `ctr images import` gives it;
// - the root is minimal and enough: no node, no shell, no perl, no nsenter, no apt/dpkg state, no
//   device node; chroot'ed into it with an empty environment, the standalone answers `version`, the
//   shim falls back to the standalone for CNI VERSION, and an ADD and a DEL through the shim write
//   and remove a host-local reservation file; the netns helper runs;
// - clear failures: mmdebstrap or umoci missing (the Debian packages named), a binary missing from
//   dist/, a library the root lacks, a bad argument.
//
// Needs root (chroot), GNU tar, mmdebstrap, umoci, the Debian archive and a built dist/ with the
// standalone executable (CI=true: fail, else skip).
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ROOT } from '../helpers/cni.ts';

const SCRIPT = join(ROOT, 'scripts/image.mjs');
const DIST = join(ROOT, 'dist');
const BINARIES = ['ipwarden-standalone', 'ipwarden-shim', 'ipwarden-flock.node', 'ipwarden-netns'];
const onPath = (bin: string): boolean => (process.env['PATH'] ?? '/usr/bin:/bin').split(':').some((d) => d !== '' && existsSync(join(d, bin)));
const missingDist = BINARIES.filter((n) => !existsSync(join(DIST, n)));
const unavailable =
  process.getuid?.() !== 0
    ? 'the image test needs root (chroot)'
    : ['mmdebstrap', 'umoci'].some((t) => !onPath(t))
      ? 'the image build needs mmdebstrap and umoci (apt-get install -y mmdebstrap umoci)'
      : missingDist.length > 0
        ? `no ${missingDist.join(', ')} in ${DIST} (npm run build)`
        : undefined;
const skip = process.env['CI'] === 'true' ? false : (unavailable ?? false);

interface Build {
  archive: string;
  image: string;
  digest: string;
  configDigest: string;
  archiveSha256: string;
  sizeBytes: number;
  layers: { digest: string; size: number }[];
  version: string;
  revision: string;
  sourceDateEpoch: number;
  created: string;
  packages: { name: string; version: string; architecture: string; sha256: string }[];
  linking: { binary: string; linked: string; needs?: string[] }[];
  seconds: number;
}

function image(args: string[], env: Record<string, string> = {}): { status: number | null; stdout: string; stderr: string } {
  const r = spawnSync(process.execPath, [SCRIPT, ...args], { encoding: 'utf8', env: { ...process.env, ...env }, timeout: 600_000, maxBuffer: 64 * 1024 * 1024 });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

/**
 * `npm run image` in a fresh clone of this commit under `dir`: clone (objects shared, HEAD checked
 * out, node_modules linked), `IPWARDEN_NO_CODE_CACHE=1 node scripts/build.mjs` (what the `image`
 * script of package.json runs), then the clone's scripts/image.mjs into `<dir>/out`.
 */
function buildInClone(dir: string): Build {
  const head = git(['rev-parse', 'HEAD']);
  assert.match(head, /^[0-9a-f]{40}$/, 'the checkout is a git repository');
  const sh = (cmd: string, args: string[], opts: { cwd?: string; env?: Record<string, string> } = {}): void => {
    const r = spawnSync(cmd, args, { encoding: 'utf8', timeout: 600_000, maxBuffer: 64 * 1024 * 1024, ...(opts.cwd === undefined ? {} : { cwd: opts.cwd }), env: { ...process.env, ...(opts.env ?? {}) } });
    assert.equal(r.status, 0, `${cmd} ${args.join(' ')}: ${r.stderr}`);
  };
  sh('git', ['clone', '--quiet', '--shared', '--no-checkout', ROOT, dir]);
  sh('git', ['-C', dir, 'checkout', '--quiet', '--detach', head]);
  symlinkSync(join(ROOT, 'node_modules'), join(dir, 'node_modules'));
  sh(process.execPath, ['scripts/build.mjs'], { cwd: dir, env: { IPWARDEN_NO_CODE_CACHE: '1' } });
  const r = spawnSync(process.execPath, [join(dir, 'scripts/image.mjs'), '--json', '--out', join(dir, 'out')], { encoding: 'utf8', timeout: 600_000, maxBuffer: 64 * 1024 * 1024 });
  assert.equal(r.status, 0, r.stderr);
  return JSON.parse(r.stdout) as Build;
}

function git(args: string[]): string {
  return spawnSync('git', ['-C', ROOT, ...args], { encoding: 'utf8' }).stdout.trim();
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

describe('npm run image: the OCI archive, reproducible, minimal, and enough to run ipwarden', { skip, timeout: 900_000 }, () => {
  const work = mkdtempSync(join(tmpdir(), 'ipwarden-ship-image-test-'));
  let first: Build;
  let second: Build;
  const layout = join(work, 'layout');
  const rootfs = join(work, 'rootfs');
  let manifest: { config: { digest: string }; layers: { mediaType: string; digest: string }[]; annotations?: Record<string, string> };
  let config: { created: string; architecture: string; os: string; config: { Entrypoint: string[]; Cmd: string[]; Env: string[]; Labels: Record<string, string> }; history: { created: string }[] };

  /** The binaries the first build's image holds. */
  const distA = join(work, 'a', 'dist');

  before(() => {
    if (unavailable !== undefined) throw new Error(`CI=true but the prerequisites are missing: ${unavailable}`);
    first = buildInClone(join(work, 'a'));
    second = buildInClone(join(work, 'b'));
    mkdirSync(layout);
    assert.equal(spawnSync('tar', ['-C', layout, '-xf', first.archive]).status, 0);
    const blob = (d: string): string => join(layout, 'blobs', 'sha256', d.replace(/^sha256:/, ''));
    manifest = JSON.parse(readFileSync(blob(first.digest), 'utf8')) as typeof manifest;
    config = JSON.parse(readFileSync(blob(manifest.config.digest), 'utf8')) as typeof config;
    mkdirSync(rootfs);
    for (const l of manifest.layers) assert.equal(spawnSync('tar', ['-C', rootfs, '-xzf', blob(l.digest)]).status, 0, l.digest);
  });
  after(() => rmSync(work, { recursive: true, force: true }));

  it('two builds of this commit, each in its own clone and from scratch, are byte-identical: same binaries, same archive, same manifest digest', (t) => {
    for (const n of BINARIES) assert.ok(readFileSync(join(work, 'b', 'dist', n)).equals(readFileSync(join(distA, n))), `dist/${n}`);
    assert.equal(second.archiveSha256, first.archiveSha256);
    assert.equal(second.digest, first.digest);
    assert.ok(readFileSync(second.archive).equals(readFileSync(first.archive)));
    assert.deepEqual(second.packages, first.packages, 'the Debian archive did not move between the two builds');
    t.diagnostic(`builds took ${first.seconds} s and ${second.seconds} s; ${(first.sizeBytes / 2 ** 20).toFixed(1)} MiB; digest ${first.digest}`);
  });

  it('is named ipwarden-<version>.oci.tar and dated by the commit: SOURCE_DATE_EPOCH = the commit time of HEAD, revision = HEAD', () => {
    const version = (JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { version: string }).version;
    assert.equal(first.archive, join(work, 'a', 'out', `ipwarden-${version}.oci.tar`));
    assert.equal(first.sourceDateEpoch, Number(git(['log', '-1', '--format=%ct', 'HEAD'])));
    assert.equal(first.revision, git(['rev-parse', 'HEAD']), 'a clean clone: no -dirty');
    assert.equal(first.created, new Date(first.sourceDateEpoch * 1000).toISOString().replace(/\.000Z$/, 'Z'));
  });

  it('every tar (the archive and both layers) is sorted, owned 0:0 and dated no later than SOURCE_DATE_EPOCH', () => {
    const epoch = first.sourceDateEpoch;
    const tars = [{ path: first.archive, gzip: false }, ...manifest.layers.map((l) => ({ path: join(layout, 'blobs', 'sha256', l.digest.slice(7)), gzip: true }))];
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

  it('index.json names the image for ctr (localhost/ipwarden:<version>) and its platform; two gzip layers', () => {
    const index = JSON.parse(readFileSync(join(layout, 'index.json'), 'utf8')) as { manifests: { digest: string; platform: object; annotations: Record<string, string> }[] };
    assert.equal(index.manifests.length, 1);
    const m = index.manifests[0]!;
    assert.equal(m.digest, first.digest);
    assert.deepEqual(m.annotations, { 'io.containerd.image.name': `localhost/ipwarden:${first.version}`, 'org.opencontainers.image.ref.name': first.version });
    assert.deepEqual(m.platform, { architecture: 'amd64', os: 'linux' });
    assert.equal(first.image, `localhost/ipwarden:${first.version}`);
    assert.deepEqual(manifest.layers.map((l) => l.mediaType), ['application/vnd.oci.image.layer.v1.tar+gzip', 'application/vnd.oci.image.layer.v1.tar+gzip']);
    assert.equal(first.configDigest, manifest.config.digest);
    assert.equal(manifest.annotations?.['org.opencontainers.image.revision'], first.revision);
  });

  it('the config: entrypoint /usr/bin/ipwarden, cmd daemon, created and every history entry = SOURCE_DATE_EPOCH, labels with version, revision and the Debian packages', () => {
    assert.deepEqual(config.config.Entrypoint, ['/usr/bin/ipwarden']);
    assert.deepEqual(config.config.Cmd, ['daemon']);
    assert.equal(config.created, first.created);
    assert.ok(config.history.length >= 2 && config.history.every((h) => h.created === first.created));
    const labels = config.config.Labels;
    assert.equal(labels['org.opencontainers.image.version'], first.version);
    assert.equal(labels['org.opencontainers.image.revision'], first.revision);
    assert.equal(labels['org.opencontainers.image.created'], first.created);
    assert.equal(labels['io.ipwarden.debian.suite'], 'bookworm');
    assert.equal(labels['io.ipwarden.debian.packages'], first.packages.map((p) => `${p.name}=${p.version}`).join(' '));
    assert.deepEqual(first.packages.map((p) => p.name), ['gcc-12-base', 'libc6', 'libgcc-s1', 'libstdc++6']);
    // The same list, with the .deb digests, inside the image.
    assert.equal(
      readFileSync(join(rootfs, 'usr/share/ipwarden/debian-packages'), 'utf8'),
      first.packages.map((p) => `${p.name} ${p.version} ${p.architecture} sha256:${p.sha256}\n`).join(''),
    );
  });

  it('the ipwarden layer: the 4 binaries of dist/ byte for byte, 0755; /usr/bin/ipwarden → the standalone; root only in passwd/group', () => {
    for (const n of BINARIES) {
      const p = join(rootfs, 'usr/lib/ipwarden', n);
      assert.ok(readFileSync(p).equals(readFileSync(join(distA, n))), n);
      assert.equal(statSync(p).mode & 0o7777, 0o755, n);
    }
    assert.deepEqual(readdirSync(join(rootfs, 'usr/bin')), ['ipwarden']);
    assert.equal(spawnSync('readlink', [join(rootfs, 'usr/bin/ipwarden')], { encoding: 'utf8' }).stdout.trim(), '../lib/ipwarden/ipwarden-standalone');
    assert.equal(readFileSync(join(rootfs, 'etc/passwd'), 'utf8'), 'root:x:0:0:root:/root:/usr/sbin/nologin\n');
    assert.equal(statSync(rootfs).mode & 0o777, 0o755, 'the image root is 0755');
    const byName = new Map(first.linking.map((l) => [l.binary, l]));
    assert.equal(byName.get('ipwarden-shim')?.linked, 'static');
    assert.equal(byName.get('ipwarden-netns')?.linked, 'static');
    // What the dynamic binaries need (the build checked each is in the root: the chroot test runs them).
    for (const so of ['libc.so.6', 'libstdc++.so.6', 'libgcc_s.so.1', 'libm.so.6']) assert.ok(byName.get('ipwarden-standalone')?.needs?.includes(so), so);
    assert.equal(byName.get('ipwarden-flock.node')?.linked, 'dynamic');
  });

  it('the root is minimal: no node, no shell, no perl, no nsenter, no apt or dpkg state', () => {
    for (const p of ['usr/bin/node', 'bin/sh', 'usr/bin/sh', 'bin/bash', 'usr/bin/perl', 'usr/bin/nsenter', 'sbin', 'usr/sbin', 'etc/apt', 'etc/dpkg', 'var/lib/dpkg', 'var/lib/apt', 'var/cache']) {
      assert.equal(existsSync(join(rootfs, p)), false, p);
    }
    assert.deepEqual(readdirSync(rootfs).sort(), ['etc', 'lib', 'lib64', 'tmp', 'usr', 'var']);
  });

  it('chroot into the root, empty environment: the standalone runs; the shim falls back to it for CNI VERSION; an ADD and a DEL through the shim write and remove a host-local reservation; the netns helper runs', () => {
    const chroot = (args: string[], env: Record<string, string> = {}, input = ''): { status: number | null; stdout: string; stderr: string } => {
      const r = spawnSync('/usr/sbin/chroot', [rootfs, ...args], { encoding: 'utf8', env, input, timeout: 60_000 });
      return { status: r.status, stdout: r.stdout, stderr: r.stderr };
    };
    const v = chroot(['/usr/bin/ipwarden', 'version']);
    assert.equal(v.status, 0, v.stderr);
    assert.match(v.stdout, new RegExp(`^ipwarden ${first.version.replace(/\./g, '\\.')}\\n`));
    const ver = chroot(['/usr/lib/ipwarden/ipwarden-shim'], { CNI_COMMAND: 'VERSION' }, '{"cniVersion":"1.0.0"}');
    assert.equal(ver.status, 0, ver.stderr);
    assert.ok(((JSON.parse(ver.stdout) as { supportedVersions: string[] }).supportedVersions).includes('1.1.0'));
    const conf = JSON.stringify({ cniVersion: '1.0.0', name: 'imgtest', type: 'bridge', ipam: { type: 'ipwarden', ranges: [[{ subnet: '10.87.92.0/28' }]], dataDir: '/tmp/data' } });
    const env = { CNI_CONTAINERID: 'c1', CNI_IFNAME: 'eth0', CNI_NETNS: '/var/run/netns/none', CNI_PATH: '/usr/lib/ipwarden' };
    const add = chroot(['/usr/lib/ipwarden/ipwarden-shim'], { ...env, CNI_COMMAND: 'ADD' }, conf);
    assert.equal(add.status, 0, add.stdout + add.stderr);
    assert.equal((JSON.parse(add.stdout) as { ips: { address: string }[] }).ips[0]?.address, '10.87.92.2/28');
    assert.equal(readFileSync(join(rootfs, 'tmp/data/imgtest/10.87.92.2'), 'utf8'), 'c1\r\neth0');
    const del = chroot(['/usr/lib/ipwarden/ipwarden-shim'], { ...env, CNI_COMMAND: 'DEL' }, conf);
    assert.equal(del.status, 0, del.stdout + del.stderr);
    assert.equal(existsSync(join(rootfs, 'tmp/data/imgtest/10.87.92.2')), false);
    const netns = chroot(['/usr/lib/ipwarden/ipwarden-netns']);
    assert.match(netns.stdout + netns.stderr, /usage: ipwarden-netns/);
  });
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

  it('a binary missing from the dist dir: exit 1 naming it and npm run build', () => {
    const dist = join(work, 'dist-missing');
    mkdirSync(dist);
    for (const n of BINARIES.filter((b) => b !== 'ipwarden-netns')) copyFileSync(join(DIST, n), join(dist, n));
    const r = image(['--dist', dist, '--out', join(work, 'out')]);
    assert.equal(r.status, 1);
    assert.equal(r.stderr, `image: no ${join(dist, 'ipwarden-netns')}: run "npm run build" first\n`);
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
    const r = image(['--dist', dist, '--out', join(work, 'out')]);
    assert.equal(r.status, 1);
    assert.match(r.stderr.split('\n').slice(-2).join('\n'), /^image: the image root lacks lib[^ ]+\.so[.0-9]*, needed by ipwarden-standalone: add its Debian package to DEBIAN_PACKAGES in scripts\/image\.mjs\n$/);
    assert.equal(existsSync(join(work, 'out')), false);
  });

  it('a bad argument: exit 2 with the usage', () => {
    for (const args of [['--bogus'], ['--out'], ['--suite', 'Bad Suite'], ['--mirror', 'ftp://x'], ['--mirror', 'none']]) {
      const r = image(args);
      assert.equal(r.status, 2, args.join(' '));
      assert.match(r.stderr, /\nusage: node scripts\/image\.mjs /, args.join(' '));
    }
  });
});
