#!/usr/bin/env node
// `npm run image` (after `npm run build`): the ipwarden OCI image, from Debian packages only, with
// no registry (issue 10; docs/deploy.md "The image").
//
//   layer 1  a minimal Debian root made by `mmdebstrap --variant=extract` from the Debian archive:
//            only the packages the dynamic binaries need (libc6, libstdc++6, libgcc-s1 and what
//            they depend on), no dpkg, no apt, no shell; docs, locales, man pages, gconv modules
//            left out (each package's copyright file kept); apt's and dpkg's state removed;
//   layer 2  /usr/lib/ipwarden/{ipwarden-standalone, ipwarden-shim, ipwarden-flock.node,
//            ipwarden-netns} from dist/, /usr/bin/ipwarden → ../lib/ipwarden/ipwarden-standalone,
//            /usr/share/ipwarden/debian-packages (name, version, architecture, .deb sha256 of
//            every package of layer 1), /etc/passwd and /etc/group (root only);
//   config   entrypoint /usr/bin/ipwarden, cmd `daemon`, labels and annotations (version, git
//            revision, created = SOURCE_DATE_EPOCH, the Debian suite and package versions).
//
// The OCI layout is made with umoci (init, new, raw add-layer, config, gc); index.json gets the
// `io.containerd.image.name` annotation so `ctr -n k8s.io images import` names the image
// `localhost/ipwarden:<version>` (a `localhost/` name keeps any pull attempt on loopback:
// ../shared/reference/containerd-lab.md, sharp edge 4). The layout is written as
// `<out>/ipwarden-<version>.oci.tar` (temporary file + rename).
//
// Reproducible: SOURCE_DATE_EPOCH (default: the commit time of HEAD) is every timestamp — the
// mtimes mmdebstrap clamps, the mtimes of both our tars, the config's `created` and its history —
// and every tar is written sorted by name, with owner 0:0 and no atime/ctime. Two builds of one
// commit give the same manifest digest, unless the Debian archive moved on between them (a new
// point release or security update of one of the packages): then the packages list differs, and
// says how (test/unit/image.test.ts builds twice and compares; docs/deploy.md "Reproducibility").
//
// Usage: node scripts/image.mjs [--install] [--build] [--out DIR] [--dist DIR] [--mirror URL]
//                               [--security-mirror URL] [--suite NAME] [--keep-work] [--json]
//   --out DIR          where the archive goes (default dist/)
//   --dist DIR         the built binaries (default dist/)
//   --mirror URL       Debian archive (default http://deb.debian.org/debian)
//   --security-mirror  Debian security archive (default http://deb.debian.org/debian-security;
//                      `none` leaves it out)
//   --suite NAME       Debian release (default bookworm, the release the binaries are built on)
//   --keep-work        keep the scratch directory (printed) for inspection
//   --json             print one JSON object instead of the human lines
//   --install          install the Debian packages the build needs when missing (apt-get, as root;
//                      scripts/debian-packages.mjs, shared with `npm run lab`)
//   --build            first build the binaries into dist/ (`IPWARDEN_NO_CODE_CACHE=1 node
//                      scripts/build.mjs`); `npm run image` is `image.mjs --install --build`
// Needs Linux, mmdebstrap and umoci (Debian: apt-get install mmdebstrap umoci), GNU tar, readelf
// (binutils), dpkg-deb. Run as root (mmdebstrap's root mode; its unshare mode, chosen for another
// user, needs /etc/subuid ranges and is not tested).
// Exit status: 0 built; 1 a tool, an input or a step failed (the message says which); 2 usage.
import { spawn, spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import {
  chmodSync,
  copyFileSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  readFileSync,
  readdirSync,
  readSync,
  closeSync,
  renameSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { installDebianPackages } from './debian-packages.mjs';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..');
/** The Debian packages of layer 1. `readelf -d` of the dynamic binaries proves each is needed (checked below). */
const DEBIAN_PACKAGES = ['libc6', 'libstdc++6', 'libgcc-s1'];
/** The files of dist/ the image carries, and their mode. */
const BINARIES = [
  { name: 'ipwarden-standalone', mode: 0o755 },
  { name: 'ipwarden-shim', mode: 0o755 },
  { name: 'ipwarden-flock.node', mode: 0o755 },
  { name: 'ipwarden-netns', mode: 0o755 },
];
const LIB_DIR = 'usr/lib/ipwarden';
/** Paths of mmdebstrap's output that belong to apt/dpkg, not to the image (removed from layer 1). */
const NOT_IN_IMAGE = ['./etc/apt', './etc/dpkg', './var/lib/apt', './var/lib/dpkg', './var/cache', './var/log'];
/** The build host's files mmdebstrap copies in (removed when present: see their deletion). */
const HOST_FILES = ['./etc/resolv.conf', './etc/hostname'];
/** dpkg path filters mmdebstrap applies while extracting (documentation and translations are not needed to run). */
const PATH_FILTERS = [
  'path-exclude=/usr/share/doc/*',
  'path-include=/usr/share/doc/*/copyright',
  'path-exclude=/usr/share/locale/*',
  'path-exclude=/usr/share/man/*',
  'path-exclude=/usr/share/lintian/*',
  'path-exclude=/usr/share/gdb/*',
  'path-exclude=/usr/share/gcc/*',
  'path-exclude=/usr/lib/*/gconv/*',
];
/** Options every tar of the build is written with (GNU tar): sorted, numeric owner 0:0, no atime/ctime. */
const TAR_OPTS = (epoch) => [
  '--sort=name',
  '--format=posix',
  '--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime',
  `--mtime=@${epoch}`,
  '--owner=0',
  '--group=0',
  '--numeric-owner',
];

class BuildError extends Error {}

function fail(msg) {
  throw new BuildError(msg);
}

/** The step running now (its child process), so a signal can end it; set by {@link run}. */
let current;
/** The signal that interrupted the build, if one did. */
let interrupted;

/**
 * Runs `cmd args` (no shell); resolves with its stdout.
 * @throws BuildError naming the command and the tail of its output, or the signal that interrupted the build.
 */
function run(cmd, args, opts = {}) {
  if (interrupted !== undefined) return Promise.reject(new BuildError(`interrupted by ${interrupted}`));
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'], ...opts });
    current = child;
    const out = [];
    const err = [];
    child.stdout.on('data', (c) => out.push(c));
    child.stderr.on('data', (c) => err.push(c));
    child.once('error', (e) => {
      current = undefined;
      reject(new BuildError(`${cmd}: cannot run it (${e.code ?? e.message})`));
    });
    child.once('close', (code, signal) => {
      current = undefined;
      const stdout = Buffer.concat(out).toString('utf8');
      if (interrupted !== undefined) return reject(new BuildError(`interrupted by ${interrupted}`));
      if (code === 0) return resolve(stdout);
      const tail = `${Buffer.concat(err).toString('utf8')}${stdout}`.trim().split('\n').slice(-20).join('\n');
      reject(new BuildError(`${cmd} ${args.join(' ')} failed (exit ${code ?? signal}):\n${tail}`));
    });
  });
}

function onPath(bin) {
  return (process.env.PATH ?? '/usr/sbin:/usr/bin:/sbin:/bin').split(':').some((d) => d !== '' && existsSync(join(d, bin)));
}

function parseArgs(argv) {
  const o = {
    out: join(ROOT, 'dist'),
    dist: join(ROOT, 'dist'),
    mirror: 'http://deb.debian.org/debian',
    securityMirror: 'http://deb.debian.org/debian-security',
    suite: 'bookworm',
    keepWork: false,
    json: false,
    install: false,
    build: false,
  };
  const value = (i, flag) => {
    const v = argv[i + 1];
    if (v === undefined || v.startsWith('--')) usage(`${flag} needs a value`);
    return v;
  };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    switch (a) {
      case '--out': o.out = resolve(value(i, a)); i++; break;
      case '--dist': o.dist = resolve(value(i, a)); i++; break;
      case '--mirror': o.mirror = value(i, a); i++; break;
      case '--security-mirror': o.securityMirror = value(i, a); i++; break;
      case '--suite': o.suite = value(i, a); i++; break;
      case '--keep-work': o.keepWork = true; break;
      case '--json': o.json = true; break;
      case '--install': o.install = true; break;
      case '--build': o.build = true; break;
      default: usage(`unknown argument ${a}`);
    }
  }
  if (!/^[a-z][a-z0-9-]*$/.test(o.suite)) usage(`--suite must be a Debian suite name (got ${o.suite})`);
  for (const [flag, url] of [['--mirror', o.mirror], ['--security-mirror', o.securityMirror]]) {
    if (url !== 'none' && !/^(https?|file):\/\/[^\s]+$/.test(url)) usage(`${flag} must be an http(s):// or file:// URL (got ${url})`);
  }
  if (o.mirror === 'none') usage('--mirror cannot be none');
  if (o.build && o.dist !== join(ROOT, 'dist')) usage('--build builds into dist/ of this checkout: give no --dist with it');
  return o;
}

class UsageErr extends Error {}
function usage(msg) {
  throw new UsageErr(msg);
}

/** Debian architecture and multiarch triplet of this machine (the image is built for it). */
function platform() {
  switch (process.arch) {
    case 'x64':
      return { arch: 'amd64', triplet: 'x86_64-linux-gnu' };
    case 'arm64':
      return { arch: 'arm64', triplet: 'aarch64-linux-gnu' };
    default:
      return fail(`unsupported architecture ${process.arch} (amd64 and arm64 are)`);
  }
}

/** SOURCE_DATE_EPOCH (seconds) and the git revision of the checkout. */
function sourceInfo() {
  const git = (args) => spawnSync('git', ['-C', ROOT, ...args], { encoding: 'utf8' });
  const head = git(['rev-parse', 'HEAD']);
  let revision = 'unknown';
  let commitTime;
  if (head.status === 0) {
    revision = head.stdout.trim();
    const dirty = git(['status', '--porcelain', '--untracked-files=no']);
    if (dirty.status === 0 && dirty.stdout.trim() !== '') revision += '-dirty';
    const t = git(['log', '-1', '--format=%ct', 'HEAD']);
    if (t.status === 0) commitTime = Number(t.stdout.trim());
  }
  const env = process.env.SOURCE_DATE_EPOCH;
  let epoch;
  if (env !== undefined && env !== '') {
    if (!/^\d{1,12}$/.test(env)) fail(`SOURCE_DATE_EPOCH must be a decimal number of seconds (got ${JSON.stringify(env)})`);
    epoch = Number(env);
  } else if (commitTime !== undefined && Number.isSafeInteger(commitTime)) {
    epoch = commitTime;
  } else {
    fail('not a git checkout: set SOURCE_DATE_EPOCH (seconds) to date the image');
  }
  return { epoch, revision };
}

/** The ELF program interpreter of `path` (PT_INTERP), or undefined for a static binary. @throws BuildError when not a 64-bit little-endian ELF. */
function elfInterpreter(path) {
  const fd = openSync(path, 'r');
  try {
    const h = Buffer.alloc(64);
    readSync(fd, h, 0, 64, 0);
    if (h.readUInt32BE(0) !== 0x7f454c46 || h[4] !== 2 || h[5] !== 1) fail(`${path} is not a 64-bit little-endian ELF file`);
    const phoff = Number(h.readBigUInt64LE(32));
    const phentsize = h.readUInt16LE(54);
    const phnum = h.readUInt16LE(56);
    const ph = Buffer.alloc(phentsize * phnum);
    readSync(fd, ph, 0, ph.length, phoff);
    for (let i = 0; i < phnum; i++) {
      const o = i * phentsize;
      if (ph.readUInt32LE(o) !== 3) continue; // PT_INTERP
      const off = Number(ph.readBigUInt64LE(o + 8));
      const size = Number(ph.readBigUInt64LE(o + 32));
      const b = Buffer.alloc(size);
      readSync(fd, b, 0, size, off);
      return b.toString('latin1').replace(/\0+$/, '');
    }
    return undefined;
  } finally {
    closeSync(fd);
  }
}

/** DT_NEEDED sonames of `path` (from `readelf -d`). */
async function neededLibraries(path) {
  const out = await run('readelf', ['-d', '--wide', path], { env: { ...process.env, LC_ALL: 'C' } });
  return [...out.matchAll(/\(NEEDED\)\s+Shared library: \[([^\]]+)\]/g)].map((m) => m[1]);
}

/** Members of an uncompressed tar (`tar -t`), without the leading `./`. */
async function tarMembers(tar) {
  return (await run('tar', ['-tf', tar])).split('\n').filter((l) => l !== '').map((l) => l.replace(/^\.\//, '').replace(/\/$/, ''));
}

/**
 * Checks that layer 1 holds the interpreter and every library the dynamic binaries need (looked
 * up where Debian's ld.so finds them without ld.so.cache: /lib/<triplet>, /usr/lib/<triplet>, and
 * the interpreter path itself). @throws BuildError naming the missing file and the binary.
 */
async function checkLibraries(dist, baseMembers, triplet) {
  const have = new Set(baseMembers);
  const report = [];
  for (const b of BINARIES) {
    const path = join(dist, b.name);
    const interp = elfInterpreter(path);
    const needed = b.name.endsWith('.node') || interp !== undefined ? await neededLibraries(path) : [];
    if (b.name !== 'ipwarden-flock.node' && interp === undefined && needed.length === 0) {
      report.push({ binary: b.name, linked: 'static' });
      continue;
    }
    if (interp !== undefined && !have.has(interp.replace(/^\//, ''))) fail(`the image root lacks ${interp}, the interpreter of ${b.name}`);
    for (const so of needed) {
      const found = [`lib/${triplet}/${so}`, `usr/lib/${triplet}/${so}`].find((p) => have.has(p));
      if (found === undefined) fail(`the image root lacks ${so}, needed by ${b.name}: add its Debian package to DEBIAN_PACKAGES in scripts/image.mjs`);
    }
    report.push({ binary: b.name, linked: 'dynamic', needs: needed });
  }
  return report;
}

/** name version arch sha256 of each .deb in `dir`, sorted by name. */
async function packagesOf(dir) {
  const debs = readdirSync(dir).filter((n) => n.endsWith('.deb')).sort();
  if (debs.length === 0) fail('mmdebstrap downloaded no package');
  const out = [];
  for (const n of debs) {
    const p = join(dir, n);
    const [name, version, architecture] = (await run('dpkg-deb', ['--show', '--showformat=${Package}\\t${Version}\\t${Architecture}', p])).split('\t');
    out.push({ name, version, architecture, sha256: createHash('sha256').update(readFileSync(p)).digest('hex') });
  }
  return out
    .sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
}

/**
 * The tools (or files) the requested steps need, each with the Debian package that has it: the image build
 * always; the compilers with `--build`. `--install` installs the packages of the missing ones.
 */
function requirements(o) {
  const needs = [
    { tool: 'mmdebstrap', pkg: 'mmdebstrap' },
    { tool: 'umoci', pkg: 'umoci' },
    { tool: 'readelf', pkg: 'binutils' },
    { tool: 'dpkg-deb', pkg: 'dpkg' },
    { tool: 'tar', pkg: 'tar' },
  ];
  if (o.build) needs.push({ tool: 'gcc', pkg: 'gcc' }, { path: `/usr/lib/${platform().triplet}/libc.a`, pkg: 'libc6-dev' });
  return needs;
}

function sha256File(path) {
  return createHash('sha256').update(readFileSync(path)).digest('hex');
}

async function main() {
  const o = parseArgs(process.argv.slice(2));
  const say = o.json ? () => {} : (l) => process.stderr.write(`image: ${l}\n`);
  if (process.platform !== 'linux') fail('the image is built on Linux');
  const needs = requirements(o);
  if (o.install) {
    try {
      await installDebianPackages([...new Set(needs.map((n) => n.pkg))], { log: say });
    } catch (e) {
      fail(e.message);
    }
  }
  const missing = [...new Set(needs.filter((n) => (n.tool !== undefined ? !onPath(n.tool) : !existsSync(n.path))).map((n) => n.pkg))];
  if (missing.length > 0) fail(`npm run image needs the Debian packages ${missing.join(' ')} (apt-get install -y ${missing.join(' ')}; --install installs them)`);
  if (!(await run('tar', ['--version'])).startsWith('tar (GNU tar)')) fail('npm run image needs GNU tar (Debian: apt-get install -y tar)');
  if (o.build) {
    say('node scripts/build.mjs (IPWARDEN_NO_CODE_CACHE=1)');
    await run(process.execPath, [join(ROOT, 'scripts/build.mjs')], { cwd: ROOT, env: { ...process.env, IPWARDEN_NO_CODE_CACHE: '1' } });
  }
  for (const b of BINARIES) {
    const p = join(o.dist, b.name);
    if (!existsSync(p) || !statSync(p).isFile()) fail(`no ${p}: run "npm run build" first`);
  }
  const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8'));
  const version = pkg.version;
  if (!/^[0-9A-Za-z][0-9A-Za-z._-]{0,127}$/.test(version)) fail(`package.json version ${JSON.stringify(version)} is not a valid image tag`);
  const imageName = `localhost/ipwarden:${version}`;
  const { arch, triplet } = platform();
  const { epoch, revision } = sourceInfo();
  const created = new Date(epoch * 1000).toISOString().replace(/\.000Z$/, 'Z');
  const t0 = performance.now();

  const work = mkdtempSync(join(tmpdir(), 'ipwarden-image-'));
  let tmpArchive;
  const env = { ...process.env, SOURCE_DATE_EPOCH: String(epoch), LC_ALL: 'C' };
  try {
    // Layer 1: the Debian root.
    const debs = join(work, 'debs');
    mkdirSync(debs);
    const base = join(work, 'base.tar');
    const sources = [`deb ${o.mirror} ${o.suite} main`, `deb ${o.mirror} ${o.suite}-updates main`];
    if (o.securityMirror !== 'none') sources.push(`deb ${o.securityMirror} ${o.suite}-security main`);
    say(`mmdebstrap ${o.suite} (${arch}): ${DEBIAN_PACKAGES.join(', ')}`);
    await run(
      'mmdebstrap',
      [
        '--quiet',
        '--variant=extract',
        `--architectures=${arch}`,
        `--include=${DEBIAN_PACKAGES.join(',')}`,
        '--format=tar',
        '--skip=output/dev',
        ...PATH_FILTERS.map((f) => `--dpkgopt=${f}`),
        // The .deb files as downloaded, for the package list (name, version, sha256).
        `--extract-hook=cp "$1"/var/cache/apt/archives/*.deb ${JSON.stringify(debs)}/`,
        o.suite,
        base,
        ...sources,
      ],
      { env },
    );
    // mmdebstrap also copies the build host's /etc/resolv.conf and /etc/hostname into the root
    // (mmdebstrap(1) "SOURCE_DATE_EPOCH"; its customize hooks do not run in the extract variant):
    // not the image's, and they would make two build hosts' images differ. Removed when present.
    const hostFiles = new Set(await tarMembers(base));
    await run('tar', ['--delete', '-f', base, ...NOT_IN_IMAGE, ...HOST_FILES.filter((f) => hostFiles.has(f.slice(2)))], { env });
    const packages = await packagesOf(debs);
    const baseMembers = await tarMembers(base);
    const linking = await checkLibraries(o.dist, baseMembers, triplet);
    const packageLines = packages.map((p) => `${p.name} ${p.version} ${p.architecture} sha256:${p.sha256}\n`).join('');

    // Layer 2: ipwarden.
    const app = join(work, 'app');
    mkdirSync(join(app, LIB_DIR), { recursive: true });
    mkdirSync(join(app, 'usr/bin'), { recursive: true });
    mkdirSync(join(app, 'usr/share/ipwarden'), { recursive: true });
    mkdirSync(join(app, 'etc'), { recursive: true });
    for (const b of BINARIES) {
      const dst = join(app, LIB_DIR, b.name);
      copyFileSync(join(o.dist, b.name), dst);
      chmodSync(dst, b.mode);
    }
    symlinkSync('../lib/ipwarden/ipwarden-standalone', join(app, 'usr/bin/ipwarden'));
    writeFileSync(join(app, 'usr/share/ipwarden/debian-packages'), packageLines, { mode: 0o644 });
    writeFileSync(join(app, 'etc/passwd'), 'root:x:0:0:root:/root:/usr/sbin/nologin\n', { mode: 0o644 });
    writeFileSync(join(app, 'etc/group'), 'root:x:0:\n', { mode: 0o644 });
    for (const f of ['usr/share/ipwarden/debian-packages', 'etc/passwd', 'etc/group']) chmodSync(join(app, f), 0o644);
    // Directories 0755 whatever the umask (mkdtemp makes 0700: the image's / must not be).
    for (const d of ['.', 'usr', 'usr/bin', 'usr/lib', LIB_DIR, 'usr/share', 'usr/share/ipwarden', 'etc']) chmodSync(join(app, d), 0o755);
    const appTar = join(work, 'app.tar');
    await run('tar', [...TAR_OPTS(epoch), '-C', app, '-cf', appTar, '.'], { env });

    // The OCI layout.
    const layout = join(work, 'oci');
    const ref = `${layout}:${version}`;
    say('umoci: layout, 2 layers, config');
    await run('umoci', ['init', '--layout', layout], { env });
    await run('umoci', ['new', '--image', ref], { env });
    await run('umoci', ['raw', 'add-layer', '--image', ref, '--history.created', created, '--history.created_by', `mmdebstrap --variant=extract ${o.suite}: ${packages.map((p) => `${p.name}=${p.version}`).join(' ')}`, base], { env });
    await run('umoci', ['raw', 'add-layer', '--image', ref, '--history.created', created, '--history.created_by', `ipwarden ${version} (${revision}): ${BINARIES.map((b) => b.name).join(' ')}`, appTar], { env });
    const annotations = {
      'org.opencontainers.image.title': 'ipwarden',
      'org.opencontainers.image.description': 'Leak-proof pod IP address management: host-local compatible CNI IPAM plugin, exec shim and node daemon',
      'org.opencontainers.image.version': version,
      'org.opencontainers.image.revision': revision,
      'org.opencontainers.image.created': created,
      'org.opencontainers.image.licenses': String(pkg.license ?? ''),
      'org.opencontainers.image.base.name': `debian:${o.suite} (mmdebstrap --variant=extract)`,
    };
    const labels = {
      ...annotations,
      'io.ipwarden.debian.suite': o.suite,
      'io.ipwarden.debian.packages': packages.map((p) => `${p.name}=${p.version}`).join(' '),
    };
    await run(
      'umoci',
      [
        'config',
        '--image', ref,
        '--created', created,
        '--author', 'ipwarden',
        '--architecture', arch,
        '--os', 'linux',
        '--config.entrypoint', '/usr/bin/ipwarden',
        '--config.cmd', 'daemon',
        '--config.env', 'PATH=/usr/sbin:/usr/bin:/sbin:/bin',
        '--config.workingdir', '/',
        '--config.stopsignal', 'SIGTERM',
        ...Object.entries(labels).flatMap(([k, v]) => ['--config.label', `${k}=${v}`]),
        ...Object.entries(annotations).flatMap(([k, v]) => ['--manifest.annotation', `${k}=${v}`]),
        '--history.created', created,
        '--history.created_by', 'umoci config: entrypoint /usr/bin/ipwarden, cmd daemon, labels',
      ],
      { env },
    );
    await run('umoci', ['gc', '--layout', layout], { env });

    // index.json: the name ctr gives the image on import, and the platform.
    const indexPath = join(layout, 'index.json');
    const index = JSON.parse(readFileSync(indexPath, 'utf8'));
    if (!Array.isArray(index.manifests) || index.manifests.length !== 1) fail(`umoci wrote ${index.manifests?.length ?? 0} manifests into index.json (want 1)`);
    const m = index.manifests[0];
    const desc = {
      mediaType: m.mediaType,
      digest: m.digest,
      size: m.size,
      platform: { architecture: arch, os: 'linux' },
      annotations: { 'io.containerd.image.name': imageName, 'org.opencontainers.image.ref.name': version },
    };
    writeFileSync(indexPath, `${JSON.stringify({ schemaVersion: 2, manifests: [desc] })}\n`);
    const manifest = JSON.parse(readFileSync(join(layout, 'blobs', 'sha256', m.digest.replace(/^sha256:/, '')), 'utf8'));

    // The archive: temporary file in the output dir, then rename.
    mkdirSync(o.out, { recursive: true });
    const archive = join(o.out, `ipwarden-${version}.oci.tar`);
    const tmp = `${archive}.tmp-${process.pid}`;
    tmpArchive = tmp;
    rmSync(tmp, { force: true });
    await run('tar', [...TAR_OPTS(epoch), '--mode=u=rwX,go=rX', '-C', layout, '-cf', tmp, 'oci-layout', 'index.json', 'blobs'], { env });
    renameSync(tmp, archive);
    tmpArchive = undefined;
    const result = {
      archive,
      image: imageName,
      digest: m.digest,
      configDigest: manifest.config.digest,
      archiveSha256: `sha256:${sha256File(archive)}`,
      sizeBytes: statSync(archive).size,
      layers: manifest.layers.map((l) => ({ digest: l.digest, size: l.size })),
      version,
      revision,
      sourceDateEpoch: epoch,
      created,
      suite: o.suite,
      packages,
      linking,
      seconds: Math.round((performance.now() - t0) / 100) / 10,
      ...(o.keepWork ? { work } : {}),
    };
    if (o.json) process.stdout.write(`${JSON.stringify(result)}\n`);
    else {
      process.stdout.write(`wrote ${archive} (${(result.sizeBytes / 2 ** 20).toFixed(1)} MiB) in ${result.seconds} s\n`);
      process.stdout.write(`image ${imageName}, revision ${revision}, created ${created}\n`);
      process.stdout.write(`debian ${o.suite}: ${packages.map((p) => `${p.name}=${p.version}`).join(' ')}\n`);
      process.stdout.write(`manifest digest ${m.digest}\n`);
      process.stdout.write(`load it: ctr -n k8s.io images import ${archive}\n`);
    }
  } finally {
    if (tmpArchive !== undefined) rmSync(tmpArchive, { force: true });
    if (o.keepWork) say(`kept ${work}`);
    else rmSync(work, { recursive: true, force: true });
  }
}

for (const sig of ['SIGINT', 'SIGTERM']) {
  process.on(sig, () => {
    // End the running step (by its pid); main's finally removes the scratch dir and the temporary archive.
    interrupted = sig;
    if (current?.pid !== undefined) {
      try {
        process.kill(current.pid, sig);
      } catch {
        // already gone
      }
    }
  });
}

try {
  await main();
} catch (e) {
  if (e instanceof UsageErr) {
    process.stderr.write(`image: ${e.message}\nusage: node scripts/image.mjs [--install] [--build] [--out DIR] [--dist DIR] [--mirror URL] [--security-mirror URL|none] [--suite NAME] [--keep-work] [--json]\n`);
    process.exitCode = 2;
  } else if (e instanceof BuildError) {
    process.stderr.write(`image: ${e.message}\n`);
    process.exitCode = interrupted === 'SIGINT' ? 130 : interrupted === 'SIGTERM' ? 143 : 1;
  } else throw e;
}
