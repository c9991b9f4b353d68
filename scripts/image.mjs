#!/usr/bin/env node
// `npm run image` (= `node scripts/image.mjs --install --build`): the ipwarden OCI image index for
// linux/amd64 and linux/arm64, from Debian packages and the npm registry only (docs/deploy.md "The
// image").
//
// Per platform, two layers:
//   layer 1  a minimal Debian root made by `mmdebstrap --variant=extract --architectures=<arch>`
//            from the Debian archive: only the packages the dynamic binaries need (libc6,
//            libstdc++6, libgcc-s1 and what they depend on) and busybox, the operator's tools (a
//            shell and tar for `kubectl exec` and `kubectl cp`); no dpkg, no apt; docs, locales, man
//            pages, gconv modules left out (each package's copyright file kept); apt's and dpkg's
//            state removed. A foreign architecture needs no emulation here: the extract variant runs
//            no maintainer script;
//   layer 2  /usr/lib/ipwarden/{ipwarden-standalone, ipwarden-shim, ipwarden-flock.node,
//            ipwarden-netns} from that platform's build, /usr/bin/ipwarden →
//            ../lib/ipwarden/ipwarden-standalone, /bin/<tool> → busybox for each of DEBUG_TOOLS,
//            /usr/share/ipwarden/debian-packages (name, version, architecture, .deb sha256 of every
//            package of layer 1), /etc/passwd and /etc/group (root only);
//   config   entrypoint /usr/bin/ipwarden, cmd `daemon`, labels and annotations (version, git
//            revision, created = SOURCE_DATE_EPOCH, the Debian suite and package versions).
// The binaries: this machine's architecture from --dist (dist/, `npm run build`), the other from
// <dist>/linux-<arch> (`node scripts/build.mjs --arch <arch>`, a cross build; --build runs both).
//
// The OCI layout is made with umoci (init, then per platform new, raw add-layer, config; gc); then
// an image index (application/vnd.oci.image.index.v1+json) names each platform's manifest, and
// index.json names that index with the `io.containerd.image.name` annotation, so
// `ctr -n k8s.io images import` names the image `localhost/ipwarden:<version>` (a `localhost/`
// name keeps any pull attempt on loopback: ../shared/reference/containerd-lab.md, sharp edge 4)
// and unpacks the node's platform. The layout is written as `<out>/ipwarden-<version>.oci.tar`
// (temporary file + rename). `--push REF` then copies the whole index to a registry with skopeo
// (`copy --all --preserve-digests`) and checks that the registry serves the index digest.
//
// Reproducible: SOURCE_DATE_EPOCH (default: the commit time of HEAD) is every timestamp — the
// mtimes mmdebstrap clamps, the mtimes of our tars, the configs' `created` and their history —
// and every tar is written sorted by name, with owner 0:0 and no atime/ctime. Two builds of one
// commit give the same index digest, unless the Debian archive moved on between them (a new
// point release or security update of one of the packages): then the packages list differs, and
// says how (test/unit/image.test.ts builds twice and compares; docs/deploy.md "Reproducibility").
//
// Usage: node scripts/image.mjs [--install] [--build | --build-cross] [--platforms LIST]
//          [--out DIR] [--dist DIR] [--dist-amd64 DIR] [--dist-arm64 DIR] [--mirror URL]
//          [--security-mirror URL|none] [--suite NAME] [--push REF [--push-plain-http]]
//          [--keep-work] [--json]
//   --install          install the Debian packages the requested steps need when missing (apt-get,
//                      as root; scripts/debian-packages.mjs, shared with `npm run lab`)
//   --build            first build the binaries: this machine's into dist/
//                      (`IPWARDEN_NO_CODE_CACHE=1 node scripts/build.mjs`), the other platform's
//                      into dist/linux-<arch> (`node scripts/build.mjs --arch <arch>`)
//   --build-cross      only the other platform's build (this machine's binaries taken as they are)
//   --platforms LIST   comma-separated, of linux/amd64 and linux/arm64 (default both)
//   --out DIR          where the archive goes (default dist/)
//   --dist DIR         this machine's binaries (default dist/)
//   --dist-amd64 DIR, --dist-arm64 DIR
//                      one platform's binaries (default: --dist for this machine's architecture,
//                      <dist>/linux-<arch> for the other)
//   --mirror URL       Debian archive (default http://deb.debian.org/debian)
//   --security-mirror  Debian security archive (default http://deb.debian.org/debian-security;
//                      `none` leaves it out)
//   --suite NAME       Debian release (default bookworm, the release the binaries are built on)
//   --push REF         after the build, push the index to REF = HOST[:PORT]/PATH[:TAG] (TAG
//                      default: the version) with `skopeo copy --all --preserve-digests`
//   --push-plain-http  the registry speaks plain HTTP (skopeo --dest-tls-verify=false)
//   --keep-work        keep the scratch directory (printed) for inspection
//   --json             print one JSON object instead of the human lines
// Needs Linux, mmdebstrap and umoci, GNU tar, readelf (binutils), dpkg-deb; for --build gcc,
// libc6-dev and musl-tools (the host platform's shim is linked against musl), for the cross build
// the packages scripts/build.mjs names; skopeo for --push. Run as root (mmdebstrap's root mode;
// its unshare mode, chosen for another user, needs /etc/subuid ranges and is not tested).
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
/**
 * The Debian packages of layer 1: what the dynamic binaries need (`readelf -d` proves each is
 * there: checked below) and busybox, which gives the debugging tools below.
 */
const DEBIAN_PACKAGES = ['libc6', 'libstdc++6', 'libgcc-s1', 'busybox'];
/**
 * What an operator runs in the container, each a /bin/<name> link to Debian's busybox (one
 * binary, libc only): `kubectl cp` runs `test -d`, `tar -xmf - -C DIR` (with `--no-preserve`,
 * `tar --no-same-permissions --no-same-owner -xmf -`), `tar cf - FILE` and, with `--retries`,
 * `sh -c "tar cf - FILE | tail -c+N"` (kubectl's pkg/cmd/cp); `kubectl exec -it … -- sh` gets a
 * shell, with the tools to read files, find them and see processes and disk space. Nothing else:
 * every other busybox applet is still reachable as `busybox NAME`, on purpose not on PATH.
 */
const DEBUG_TOOLS = ['cat', 'df', 'du', 'find', 'grep', 'head', 'ls', 'ps', 'sh', 'stat', 'tail', 'tar', 'test', 'wc'];
/** The files of a platform's build the image carries, and their mode. */
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
  'path-exclude=/usr/share/initramfs-tools/*',
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
/**
 * The platforms (Debian architecture names = OCI's): Node's name, the multiarch triplet, the ELF
 * machine (e_machine) of its binaries.
 */
const PLATFORMS = {
  amd64: { node: 'x64', triplet: 'x86_64-linux-gnu', elfMachine: 0x3e },
  arm64: { node: 'arm64', triplet: 'aarch64-linux-gnu', elfMachine: 0xb7 },
};
/** The Debian packages a cross build (scripts/build.mjs --arch A) needs, per target. */
const CROSS_PACKAGES = {
  arm64: ['gcc-aarch64-linux-gnu', 'g++-aarch64-linux-gnu', 'libc6-dev-arm64-cross', 'make', 'python3', 'qemu-user-static'],
  amd64: ['gcc-x86-64-linux-gnu', 'g++-x86-64-linux-gnu', 'libc6-dev-amd64-cross', 'make', 'python3', 'qemu-user-static'],
};
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
    distOf: {},
    platforms: ['amd64', 'arm64'],
    mirror: 'http://deb.debian.org/debian',
    securityMirror: 'http://deb.debian.org/debian-security',
    suite: 'bookworm',
    keepWork: false,
    json: false,
    install: false,
    build: false,
    buildCross: false,
    push: undefined,
    pushPlainHttp: false,
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
      case '--dist-amd64': o.distOf.amd64 = resolve(value(i, a)); i++; break;
      case '--dist-arm64': o.distOf.arm64 = resolve(value(i, a)); i++; break;
      case '--platforms': o.platforms = value(i, a).split(',').map((p) => p.replace(/^linux\//, '')); i++; break;
      case '--mirror': o.mirror = value(i, a); i++; break;
      case '--security-mirror': o.securityMirror = value(i, a); i++; break;
      case '--suite': o.suite = value(i, a); i++; break;
      case '--push': o.push = value(i, a); i++; break;
      case '--push-plain-http': o.pushPlainHttp = true; break;
      case '--keep-work': o.keepWork = true; break;
      case '--json': o.json = true; break;
      case '--install': o.install = true; break;
      case '--build': o.build = true; break;
      case '--build-cross': o.buildCross = true; break;
      default: usage(`unknown argument ${a}`);
    }
  }
  if (!/^[a-z][a-z0-9-]*$/.test(o.suite)) usage(`--suite must be a Debian suite name (got ${o.suite})`);
  for (const [flag, url] of [['--mirror', o.mirror], ['--security-mirror', o.securityMirror]]) {
    if (url !== 'none' && !/^(https?|file):\/\/[^\s]+$/.test(url)) usage(`${flag} must be an http(s):// or file:// URL (got ${url})`);
  }
  if (o.mirror === 'none') usage('--mirror cannot be none');
  if (o.platforms.length === 0 || o.platforms.some((p) => !(p in PLATFORMS)) || new Set(o.platforms).size !== o.platforms.length) {
    usage(`--platforms must list linux/amd64 and/or linux/arm64, each once (got ${o.platforms.join(',')})`);
  }
  o.platforms.sort(); // the index lists amd64 before arm64, whatever the order given
  if (o.build && o.buildCross) usage('--build already includes --build-cross');
  if (o.build && o.dist !== join(ROOT, 'dist')) usage('--build builds into dist/ of this checkout: give no --dist with it');
  if (o.push !== undefined && !/^[a-z0-9.-]+(:\d{1,5})?(\/[a-z0-9._-]+)+(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?$/.test(o.push)) {
    usage(`--push must be HOST[:PORT]/PATH[:TAG], without a scheme or a digest (got ${o.push})`);
  }
  if (o.pushPlainHttp && o.push === undefined) usage('--push-plain-http goes with --push');
  return o;
}

class UsageErr extends Error {}
function usage(msg) {
  throw new UsageErr(msg);
}

/** Debian architecture of this machine. */
function hostArch() {
  const a = Object.keys(PLATFORMS).find((k) => PLATFORMS[k].node === process.arch);
  return a ?? fail(`unsupported architecture ${process.arch} (amd64 and arm64 are)`);
}

/** Where the binaries of platform `arch` are (see --dist-<arch>). */
function distOf(o, arch) {
  return o.distOf[arch] ?? (arch === hostArch() ? o.dist : join(o.dist, `linux-${arch}`));
}

/** The platforms a cross build is made for (--build, --build-cross): those not of this machine. */
function crossPlatforms(o) {
  return o.build || o.buildCross ? o.platforms.filter((a) => a !== hostArch()) : [];
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

/** Directory members of an uncompressed tar, without the leading `./` and the trailing `/`. */
async function tarDirectories(tar) {
  return (await run('tar', ['-tf', tar])).split('\n').filter((l) => l.endsWith('/')).map((l) => l.replace(/^\.\//, '').replace(/\/$/, ''));
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
 * The tools (or files) the requested steps need, each with the Debian package that has it: the
 * image build always; gcc and the static libc with --build; the cross compilers, make, python3
 * (node-gyp) and qemu-user-static for a cross build; skopeo for --push. `--install` installs the
 * packages of the missing ones.
 */
function requirements(o) {
  const needs = [
    { tool: 'mmdebstrap', pkg: 'mmdebstrap' },
    { tool: 'umoci', pkg: 'umoci' },
    { tool: 'readelf', pkg: 'binutils' },
    { tool: 'dpkg-deb', pkg: 'dpkg' },
    { tool: 'tar', pkg: 'tar' },
  ];
  if (o.build && o.platforms.includes(hostArch())) needs.push({ tool: 'gcc', pkg: 'gcc' }, { path: `/usr/lib/${PLATFORMS[hostArch()].triplet}/libc.a`, pkg: 'libc6-dev' }, { tool: 'musl-gcc', pkg: 'musl-tools' });
  for (const a of crossPlatforms(o)) {
    const t = PLATFORMS[a].triplet;
    const [gcc, gxx, libc, make, python, qemu] = CROSS_PACKAGES[a];
    needs.push(
      { tool: `${t}-gcc`, pkg: gcc },
      { tool: `${t}-g++`, pkg: gxx },
      { path: `/usr/${t}/lib/libc.a`, pkg: libc },
      { tool: 'make', pkg: make },
      { tool: 'python3', pkg: python },
      { tool: a === 'arm64' ? 'qemu-aarch64-static' : 'qemu-x86_64-static', pkg: qemu },
    );
  }
  if (o.push !== undefined) needs.push({ tool: 'skopeo', pkg: 'skopeo' });
  return needs;
}

function sha256File(path) {
  return createHash('sha256').update(readFileSync(path)).digest('hex');
}

/** e_machine of the ELF file `path`. */
function elfMachine(path) {
  const fd = openSync(path, 'r');
  try {
    const h = Buffer.alloc(20);
    readSync(fd, h, 0, 20, 0);
    return h.readUInt16LE(18);
  } finally {
    closeSync(fd);
  }
}

/**
 * One platform's image in the layout: layer 1 (mmdebstrap for `arch`), layer 2 (the binaries of
 * `dist`, the tool links, the package list), the config; under the layout ref `arch`.
 * @returns the packages, the linking report and the ref.
 * @throws BuildError when a step fails, a binary is not for `arch`, or the root lacks a library.
 */
async function buildPlatform(ctx, arch) {
  const { o, work, layout, env, epoch, created, version, revision, say } = ctx;
  const { triplet, elfMachine: machine } = PLATFORMS[arch];
  const dist = distOf(o, arch);
  for (const b of BINARIES) {
    if (elfMachine(join(dist, b.name)) !== machine) fail(`${join(dist, b.name)} is not a linux/${arch} binary (ELF machine ${elfMachine(join(dist, b.name))}, want ${machine})`);
  }
  const dir = join(work, arch);
  // Layer 1: the Debian root.
  const debs = join(dir, 'debs');
  mkdirSync(debs, { recursive: true });
  const base = join(dir, 'base.tar');
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
  const extracted = await tarMembers(base);
  const hostFiles = new Set(extracted);
  // The path filters leave the directories of what they dropped (usr/share/man, …): empty ones under usr/share go too.
  const emptyShare = (await tarDirectories(base)).filter((d) => d.startsWith('usr/share/') && !extracted.some((m) => m.startsWith(`${d}/`)));
  await run('tar', ['--delete', '-f', base, ...NOT_IN_IMAGE, ...HOST_FILES.filter((f) => hostFiles.has(f.slice(2))), ...emptyShare.map((d) => `./${d}`)], { env });
  const packages = await packagesOf(debs);
  const baseMembers = await tarMembers(base);
  const linking = await checkLibraries(dist, baseMembers, triplet);
  if (!baseMembers.includes('bin/busybox')) fail(`the ${arch} root lacks bin/busybox (Debian's busybox package)`);
  const packageLines = packages.map((p) => `${p.name} ${p.version} ${p.architecture} sha256:${p.sha256}\n`).join('');

  // Layer 2: ipwarden, and the operator's tools as links to busybox.
  const app = join(dir, 'app');
  for (const d of [LIB_DIR, 'usr/bin', 'usr/share/ipwarden', 'etc', 'bin']) mkdirSync(join(app, d), { recursive: true });
  for (const b of BINARIES) {
    const dst = join(app, LIB_DIR, b.name);
    copyFileSync(join(dist, b.name), dst);
    chmodSync(dst, b.mode);
  }
  symlinkSync('../lib/ipwarden/ipwarden-standalone', join(app, 'usr/bin/ipwarden'));
  for (const t of DEBUG_TOOLS) symlinkSync('busybox', join(app, 'bin', t));
  writeFileSync(join(app, 'usr/share/ipwarden/debian-packages'), packageLines, { mode: 0o644 });
  writeFileSync(join(app, 'etc/passwd'), 'root:x:0:0:root:/root:/bin/sh\n', { mode: 0o644 });
  writeFileSync(join(app, 'etc/group'), 'root:x:0:\n', { mode: 0o644 });
  for (const f of ['usr/share/ipwarden/debian-packages', 'etc/passwd', 'etc/group']) chmodSync(join(app, f), 0o644);
  // Directories 0755 whatever the umask (mkdtemp makes 0700: the image's / must not be).
  for (const d of ['.', 'usr', 'usr/bin', 'usr/lib', LIB_DIR, 'usr/share', 'usr/share/ipwarden', 'etc', 'bin']) chmodSync(join(app, d), 0o755);
  const appTar = join(dir, 'app.tar');
  await run('tar', [...TAR_OPTS(epoch), '-C', app, '-cf', appTar, '.'], { env });

  // The platform's image in the layout.
  const ref = `${layout}:${arch}`;
  say(`umoci (${arch}): 2 layers, config`);
  await run('umoci', ['new', '--image', ref], { env });
  await run('umoci', ['raw', 'add-layer', '--image', ref, '--history.created', created, '--history.created_by', `mmdebstrap --variant=extract --architectures=${arch} ${o.suite}: ${packages.map((p) => `${p.name}=${p.version}`).join(' ')}`, base], { env });
  await run('umoci', ['raw', 'add-layer', '--image', ref, '--history.created', created, '--history.created_by', `ipwarden ${version} (${revision}): ${BINARIES.map((b) => b.name).join(' ')}; /bin/{${DEBUG_TOOLS.join(',')}} -> busybox`, appTar], { env });
  const labels = {
    ...ctx.annotations,
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
      ...Object.entries(ctx.annotations).flatMap(([k, v]) => ['--manifest.annotation', `${k}=${v}`]),
      '--history.created', created,
      '--history.created_by', 'umoci config: entrypoint /usr/bin/ipwarden, cmd daemon, labels',
    ],
    { env },
  );
  return { arch, packages, linking, dist };
}

/** Writes `value` as a blob of the layout; returns its descriptor fields (digest, size). */
function writeBlob(layout, value) {
  const bytes = Buffer.from(JSON.stringify(value));
  const hex = createHash('sha256').update(bytes).digest('hex');
  writeFileSync(join(layout, 'blobs', 'sha256', hex), bytes);
  return { digest: `sha256:${hex}`, size: bytes.length };
}

/**
 * Pushes the archive's index to `ref` with skopeo, then reads the manifest the registry serves
 * for `ref` back and checks it is the index itself (same digest).
 * @returns `{ ref, digest, byDigest }` (byDigest: `<repository>@<digest>`, what to pull).
 * @throws BuildError when skopeo fails or the registry serves another digest.
 */
async function push(o, archive, version, digest, env) {
  const ref = /:[^/]+$/.test(o.push) ? o.push : `${o.push}:${version}`;
  const tls = o.pushPlainHttp ? ['--dest-tls-verify=false'] : [];
  await run('skopeo', ['copy', '--quiet', '--all', '--preserve-digests', ...tls, `oci-archive:${archive}:${version}`, `docker://${ref}`], { env });
  const raw = await run('skopeo', ['inspect', '--raw', ...(o.pushPlainHttp ? ['--tls-verify=false'] : []), `docker://${ref}`], { env });
  const served = `sha256:${createHash('sha256').update(raw).digest('hex')}`;
  if (served !== digest) fail(`the registry serves ${served} for ${ref}, not the index ${digest}`);
  return { ref, digest, byDigest: `${ref.replace(/:[^/]+$/, '')}@${digest}` };
}

async function main() {
  const o = parseArgs(process.argv.slice(2));
  const say = o.json ? () => {} : (l) => process.stderr.write(`image: ${l}\n`);
  if (process.platform !== 'linux') fail('the image is built on Linux');
  const t0 = performance.now();
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
  const buildEnv = { ...process.env, IPWARDEN_NO_CODE_CACHE: '1' };
  if (o.build && o.platforms.includes(hostArch())) {
    say('node scripts/build.mjs (IPWARDEN_NO_CODE_CACHE=1)');
    await run(process.execPath, [join(ROOT, 'scripts/build.mjs')], { cwd: ROOT, env: buildEnv });
  }
  for (const a of crossPlatforms(o)) {
    say(`node scripts/build.mjs --arch ${a} --out ${distOf(o, a)} (IPWARDEN_NO_CODE_CACHE=1)`);
    await run(process.execPath, [join(ROOT, 'scripts/build.mjs'), '--arch', a, '--out', distOf(o, a)], { cwd: ROOT, env: buildEnv });
  }
  for (const a of o.platforms) {
    for (const b of BINARIES) {
      const p = join(distOf(o, a), b.name);
      const how = a === hostArch() ? '"npm run build"' : `"node scripts/build.mjs --arch ${a}"`;
      if (!existsSync(p) || !statSync(p).isFile()) fail(`no ${p}: run ${how} first`);
    }
  }
  const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8'));
  const version = pkg.version;
  if (!/^[0-9A-Za-z][0-9A-Za-z._-]{0,127}$/.test(version)) fail(`package.json version ${JSON.stringify(version)} is not a valid image tag`);
  const imageName = `localhost/ipwarden:${version}`;
  const { epoch, revision } = sourceInfo();
  const created = new Date(epoch * 1000).toISOString().replace(/\.000Z$/, 'Z');
  const tImage = performance.now();

  const work = mkdtempSync(join(tmpdir(), 'ipwarden-image-'));
  let tmpArchive;
  const env = { ...process.env, SOURCE_DATE_EPOCH: String(epoch), LC_ALL: 'C' };
  try {
    const layout = join(work, 'oci');
    await run('umoci', ['init', '--layout', layout], { env });
    const annotations = {
      'org.opencontainers.image.title': 'ipwarden',
      'org.opencontainers.image.description': 'Leak-proof pod IP address management: host-local compatible CNI IPAM plugin, exec shim and node daemon',
      'org.opencontainers.image.version': version,
      'org.opencontainers.image.revision': revision,
      'org.opencontainers.image.created': created,
      'org.opencontainers.image.licenses': String(pkg.license ?? ''),
      'org.opencontainers.image.base.name': `debian:${o.suite} (mmdebstrap --variant=extract)`,
    };
    const ctx = { o, work, layout, env, epoch, created, version, revision, say, annotations };
    const built = [];
    for (const a of o.platforms) built.push(await buildPlatform(ctx, a));
    await run('umoci', ['gc', '--layout', layout], { env });

    // The image index: one manifest per platform; index.json names it for ctr.
    const indexPath = join(layout, 'index.json');
    const umociIndex = JSON.parse(readFileSync(indexPath, 'utf8'));
    const platforms = built.map((b) => {
      const m = (umociIndex.manifests ?? []).find((d) => d.annotations?.['org.opencontainers.image.ref.name'] === b.arch);
      if (m === undefined) fail(`umoci's index.json has no manifest for ${b.arch}`);
      const manifest = JSON.parse(readFileSync(join(layout, 'blobs', 'sha256', m.digest.replace(/^sha256:/, '')), 'utf8'));
      return { ...b, descriptor: { mediaType: m.mediaType, digest: m.digest, size: m.size, platform: { architecture: b.arch, os: 'linux' } }, manifest };
    });
    const index = {
      schemaVersion: 2,
      mediaType: 'application/vnd.oci.image.index.v1+json',
      manifests: platforms.map((p) => p.descriptor),
      annotations,
    };
    const indexDesc = writeBlob(layout, index);
    writeFileSync(
      indexPath,
      `${JSON.stringify({
        schemaVersion: 2,
        mediaType: 'application/vnd.oci.image.index.v1+json',
        manifests: [
          {
            mediaType: 'application/vnd.oci.image.index.v1+json',
            ...indexDesc,
            annotations: { 'io.containerd.image.name': imageName, 'org.opencontainers.image.ref.name': version },
          },
        ],
      })}\n`,
    );

    // The archive: temporary file in the output dir, then rename.
    mkdirSync(o.out, { recursive: true });
    const archive = join(o.out, `ipwarden-${version}.oci.tar`);
    const tmp = `${archive}.tmp-${process.pid}`;
    tmpArchive = tmp;
    rmSync(tmp, { force: true });
    await run('tar', [...TAR_OPTS(epoch), '--mode=u=rwX,go=rX', '-C', layout, '-cf', tmp, 'oci-layout', 'index.json', 'blobs'], { env });
    renameSync(tmp, archive);
    tmpArchive = undefined;
    const imageSeconds = Math.round((performance.now() - tImage) / 100) / 10;
    let pushed;
    if (o.push !== undefined) {
      say(`skopeo copy --all --preserve-digests → docker://${o.push}`);
      pushed = await push(o, archive, version, indexDesc.digest, env);
    }
    const result = {
      archive,
      image: imageName,
      digest: indexDesc.digest,
      mediaType: 'application/vnd.oci.image.index.v1+json',
      archiveSha256: `sha256:${sha256File(archive)}`,
      sizeBytes: statSync(archive).size,
      platforms: platforms.map((p) => ({
        platform: `linux/${p.arch}`,
        digest: p.descriptor.digest,
        configDigest: p.manifest.config.digest,
        layers: p.manifest.layers.map((l) => ({ digest: l.digest, size: l.size })),
        packages: p.packages,
        linking: p.linking,
        dist: p.dist,
      })),
      debugTools: DEBUG_TOOLS,
      version,
      revision,
      sourceDateEpoch: epoch,
      created,
      suite: o.suite,
      ...(pushed === undefined ? {} : { pushed }),
      imageSeconds,
      seconds: Math.round((performance.now() - t0) / 100) / 10,
      ...(o.keepWork ? { work } : {}),
    };
    if (o.json) process.stdout.write(`${JSON.stringify(result)}\n`);
    else {
      process.stdout.write(`wrote ${archive} (${(result.sizeBytes / 2 ** 20).toFixed(1)} MiB) in ${result.seconds} s (image ${imageSeconds} s)\n`);
      process.stdout.write(`image ${imageName}, revision ${revision}, created ${created}\n`);
      for (const p of result.platforms) {
        process.stdout.write(`${p.platform}: manifest ${p.digest}; debian ${o.suite}: ${p.packages.map((x) => `${x.name}=${x.version}`).join(' ')}\n`);
      }
      process.stdout.write(`index digest ${result.digest}\n`);
      if (pushed !== undefined) process.stdout.write(`pushed ${pushed.ref}; pull it as ${pushed.byDigest}\n`);
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
    process.stderr.write(`image: ${e.message}\nusage: node scripts/image.mjs [--install] [--build|--build-cross] [--platforms LIST] [--out DIR] [--dist DIR] [--dist-amd64 DIR] [--dist-arm64 DIR] [--mirror URL] [--security-mirror URL|none] [--suite NAME] [--push REF [--push-plain-http]] [--keep-work] [--json]\n`);
    process.exitCode = 2;
  } else if (e instanceof BuildError) {
    process.stderr.write(`image: ${e.message}\n`);
    process.exitCode = interrupted === 'SIGINT' ? 130 : interrupted === 'SIGTERM' ? 143 : 1;
  } else throw e;
}
