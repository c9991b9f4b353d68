#!/usr/bin/env node
// Bundles the program into dist/ipwarden.cjs — one CommonJS file, no node_modules needed at run
// time — and copies the native flock binding beside it as dist/ipwarden-flock.node. The bundle
// finds the binding next to itself (__dirname), which is also how the executable written by
// `ipwarden install-cni` finds it.
//
// It also compiles the exec shim (native/shim.c, docs/daemon.md) with the system's gcc into
// dist/ipwarden-shim, statically linked (a dynamic shim loses most of the fast path's gain:
// ../shared/reference/fast-path-measurements.md). Without gcc, or without a static libc, the build
// fails with a message saying what to install.
//
// Two bundles keep the plugin's hot path small: src/cold.ts (CLI, CRI client, gRPC) is bundled on
// its own into dist/ipwarden-cold.cjs and compiled only when the program first imports it, so an
// exec of the plugin does not pay for parsing half a megabyte of gRPC code (docs/benchmarks.md).
// The hot bundle finds the cold source through a hook the installed executable's loader sets
// (`install-cni` carries it inside the one executable file), else in the file beside itself.
import { build } from 'esbuild';
import { copyFileSync, mkdirSync } from 'node:fs';
import { spawnSync } from 'node:child_process';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';

const require = createRequire(import.meta.url);
const FLOCK = 'ipwarden-flock.node';

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

// Pass 1: the cold part.
mkdirSync('dist', { recursive: true });
await build({ ...common, entryPoints: ['src/cold.ts'], outfile: 'dist/ipwarden-cold.cjs', plugins: [flockBinding], banner: { js: banner } });

/** Replace `import('./cold.ts')` in the hot bundle by a loader of pass 1's output. */
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

// Pass 2: the hot bundle.
await build({ ...common, entryPoints: ['src/main.ts'], outfile: 'dist/ipwarden.cjs', plugins: [flockBinding, coldLoader], banner: { js: banner } });
const fsExtDir = dirname(require.resolve('fs-ext/package.json'));
copyFileSync(join(fsExtDir, 'build/Release/fs_ext.node'), join('dist', FLOCK));

// The exec shim: installed by `install-cni` as DIR/ipwarden, in front of DIR/ipwarden-standalone.
const SHIM_ARGS = ['-static', '-O2', '-Wall', '-Wextra', '-Werror', '-o', 'dist/ipwarden-shim', 'native/shim.c'];
const cc = spawnSync('gcc', SHIM_ARGS, { encoding: 'utf8' });
if (cc.error !== undefined || cc.status !== 0) {
  const why = cc.error !== undefined
    ? `cannot run gcc (${cc.error.code ?? cc.error.message})`
    : `gcc failed (exit status ${cc.status ?? cc.signal}):\n${cc.stderr}`;
  console.error(`build: the exec shim (native/shim.c) needs gcc and a static C library (Debian/Ubuntu: apt-get install gcc libc6-dev): ${why}`);
  process.exit(1);
}
