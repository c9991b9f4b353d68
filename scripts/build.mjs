#!/usr/bin/env node
// Bundles src/main.ts into dist/ipwarden.cjs (one CommonJS file, no node_modules needed at run
// time) and copies the native flock binding beside it as dist/ipwarden-flock.node.
// The bundle finds the binding next to itself (__dirname), which is also how the executable
// written by `ipwarden install-cni` finds it.
import { build } from 'esbuild';
import { copyFileSync, mkdirSync } from 'node:fs';
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

mkdirSync('dist', { recursive: true });
await build({
  entryPoints: ['src/main.ts'],
  outfile: 'dist/ipwarden.cjs',
  bundle: true,
  platform: 'node',
  target: 'node20',
  format: 'cjs',
  minify: true,
  legalComments: 'none',
  logLevel: 'warning',
  define: { 'import.meta.url': '__ipwardenModuleUrl' },
  banner: { js: "var __ipwardenModuleUrl = require('node:url').pathToFileURL(__filename).href;" },
  plugins: [flockBinding],
});
const fsExtDir = dirname(require.resolve('fs-ext/package.json'));
copyFileSync(join(fsExtDir, 'build/Release/fs_ext.node'), join('dist', FLOCK));
