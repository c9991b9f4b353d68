#!/usr/bin/env node
// Bundles the program into dist/ipwarden.cjs — one CommonJS file, no node_modules needed at run
// time — and copies the native flock binding beside it as dist/ipwarden-flock.node. The bundle
// finds the binding next to itself (__dirname), which is also how the executable written by
// `ipwarden install-cni` finds it.
//
// Two passes keep the plugin's hot path small: src/cold.ts (CLI, CRI client, gRPC) is bundled on
// its own, gzipped, and embedded in the main bundle as one base64 string literal, inflated and
// compiled with vm only when the program first imports it. V8 only scans a short escape-free
// string, so an exec of the plugin does not pay for parsing half a megabyte of gRPC code
// (measured in docs/benchmarks.md).
import { build } from 'esbuild';
import { copyFileSync, mkdirSync } from 'node:fs';
import { gzipSync } from 'node:zlib';
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
  minify: true,
  legalComments: 'none',
  logLevel: 'warning',
  define: { 'import.meta.url': '__ipwardenModuleUrl' },
};
const banner = "var __ipwardenModuleUrl = require('node:url').pathToFileURL(__filename).href;";

// Pass 1: the cold part, kept in memory.
const cold = await build({ ...common, entryPoints: ['src/cold.ts'], write: false, plugins: [flockBinding], banner: { js: banner } });
const coldB64 = gzipSync(cold.outputFiles[0].contents, { level: 9 }).toString('base64');

/** Replace `import('./cold.ts')` in the hot bundle by a lazily compiled copy of pass 1. */
const coldAsString = {
  name: 'cold-as-string',
  setup(b) {
    b.onResolve({ filter: /(^|\/)cold\.ts$/ }, () => ({ path: 'cold', namespace: 'cold-as-string' }));
    b.onLoad({ filter: /.*/, namespace: 'cold-as-string' }, () => ({
      contents: [
        `const source = require('node:zlib').gunzipSync(Buffer.from(${JSON.stringify(coldB64)}, 'base64')).toString('utf8');`,
        `const m = { exports: {} };`,
        `require('node:vm').runInThisContext('(function (exports, require, module, __filename, __dirname) {' + source + '\\n})', { filename: __filename + '#cold' })(m.exports, require, m, __filename, __dirname);`,
        `module.exports = m.exports;`,
      ].join('\n'),
      loader: 'js',
    }));
  },
};

// Pass 2: the hot bundle.
mkdirSync('dist', { recursive: true });
await build({ ...common, entryPoints: ['src/main.ts'], outfile: 'dist/ipwarden.cjs', plugins: [flockBinding, coldAsString], banner: { js: banner } });
const fsExtDir = dirname(require.resolve('fs-ext/package.json'));
copyFileSync(join(fsExtDir, 'build/Release/fs_ext.node'), join('dist', FLOCK));
