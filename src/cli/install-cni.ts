/**
 * `ipwarden install-cni --dest DIR`: write `DIR/ipwarden`, a self-contained CNI plugin executable
 * (the esbuild bundle with a first line naming the absolute path of the Node.js running this
 * install), and `DIR/ipwarden-flock.node`, the native flock binding it loads from beside itself.
 * A runtime can then exec it with its own minimal environment and no `node_modules`.
 *
 * Both files are written atomically (temporary file in DIR, then rename), so a runtime exec'ing
 * the plugin during an upgrade sees the old or the new file, never a partial one.
 *
 * The runtime execs the plugin once per pod, so start-up time matters (docs/benchmarks.md).
 * Node 20 has no compile cache (`module.enableCompileCache` is 22+), so the executable carries
 * its own: a small loader, then — inside one comment, base64 — the hot bundle, a V8 code cache made
 * at install time by the very Node that the first line names after a warm-up ADD, and the cold
 * bundle (CLI, gRPC; gzipped), inflated only when a command needs it. The loader
 * compiles the bundle with that cache (`vm.Script` `cachedData`); if V8 rejects it (Node was
 * upgraded) it compiles normally, so the cache only ever saves time.
 */
import { spawnSync } from 'node:child_process';
import { chmodSync, copyFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { gunzipSync, gzipSync } from 'node:zlib';
import { fileURLToPath } from 'node:url';
import { AppError, UsageError } from '../common/errors.ts';
import type { CliContext } from './context.ts';

/** File name of the native flock binding installed beside the plugin. */
export const FLOCK_BINDING_NAME = 'ipwarden-flock.node';

/**
 * Where the runnable bundle is: this file itself when running bundled, else `<repo>/dist/ipwarden.cjs`.
 * Throws UsageError when the project has not been built.
 */
export function locateBundle(): string {
  const here = fileURLToPath(import.meta.url);
  const bundle = here.endsWith('.ts') ? resolve(dirname(here), '../../dist/ipwarden.cjs') : here;
  if (!existsSync(bundle)) throw new UsageError(`no built bundle at ${bundle}: run "npm run build" first`);
  return bundle;
}

/** Markers of the payload comment of an installed executable. */
const CODE_MARK = '\n/*IPWARDEN-CODE\n';
const CACHE_MARK = '\nIPWARDEN-CACHE\n';
const COLD_MARK = '\nIPWARDEN-COLD\n';
const END_MARK = '\nIPWARDEN-END*/\n';

/** File name of the cold bundle beside the built hot bundle (dist/). */
export const COLD_BUNDLE_NAME = 'ipwarden-cold.cjs';

/** The function wrapper the loader compiles the bundle in (the CommonJS module signature). */
const WRAP_HEAD = '(function (exports, require, module, __filename, __dirname) {';
const WRAP_TAIL = '\n})';

/**
 * The loader at the top of an installed executable: reads its own file, decodes the hot bundle
 * and its code cache from the payload comment, registers a hook that inflates the cold bundle
 * (CLI, gRPC) from the same payload only if the program asks for it, then compiles and runs the
 * hot bundle as this module.
 */
const LOADER = `'use strict';
(() => {
  const fs = require('node:fs');
  const text = fs.readFileSync(__filename, 'latin1');
  const a = text.indexOf(${JSON.stringify(CODE_MARK)});
  const b = text.indexOf(${JSON.stringify(CACHE_MARK)}, a);
  const c = text.indexOf(${JSON.stringify(COLD_MARK)}, b);
  const d = text.indexOf(${JSON.stringify(END_MARK)}, c);
  globalThis[Symbol.for('ipwarden.coldSource')] = () =>
    require('node:zlib').gunzipSync(Buffer.from(text.slice(c + ${COLD_MARK.length}, d), 'base64')).toString('utf8');
  const code = Buffer.from(text.slice(a + ${CODE_MARK.length}, b), 'base64').toString('utf8');
  const cache = Buffer.from(text.slice(b + ${CACHE_MARK.length}, c), 'base64');
  const script = new (require('node:vm').Script)(${JSON.stringify(WRAP_HEAD)} + code + ${JSON.stringify(WRAP_TAIL)}, {
    filename: __filename,
    cachedData: cache.length > 0 ? cache : undefined,
  });
  script.runInThisContext()(exports, require, module, __filename, __dirname);
})();
`;

/** The hot and cold bundle code behind `path`: a built dist/ bundle, or an installed executable. */
export function readBundles(path: string): { hot: string; cold: string } {
  const text = readFileSync(path, 'latin1');
  const a = text.indexOf(CODE_MARK);
  if (a >= 0) {
    const b = text.indexOf(CACHE_MARK, a);
    const c = text.indexOf(COLD_MARK, b);
    const d = text.indexOf(END_MARK, c);
    return {
      hot: Buffer.from(text.slice(a + CODE_MARK.length, b), 'base64').toString('utf8'),
      cold: gunzipSync(Buffer.from(text.slice(c + COLD_MARK.length, d), 'base64')).toString('utf8'),
    };
  }
  let hot = readFileSync(path, 'utf8');
  if (hot.startsWith('#!')) hot = hot.slice(hot.indexOf('\n') + 1);
  const coldPath = join(dirname(path), COLD_BUNDLE_NAME);
  if (!existsSync(coldPath)) throw new UsageError(`no ${COLD_BUNDLE_NAME} beside ${path}: run "npm run build" first`);
  return { hot, cold: readFileSync(coldPath, 'utf8') };
}

/**
 * A V8 code cache for `code` made by `nodePath` after one warm-up ADD (so the functions an ADD
 * runs are compiled into it), or an empty buffer when that fails (the plugin then compiles at
 * start-up as before). Uses a scratch data directory, removed afterwards.
 */
export function makeCodeCache(code: string, cold: string, nodePath: string, bindingDir: string): Buffer {
  const scratch = mkdtempSync(join(tmpdir(), 'ipwarden-install-'));
  try {
    const codeFile = join(scratch, 'bundle.js');
    const cacheFile = join(scratch, 'cache.bin');
    writeFileSync(codeFile, code);
    writeFileSync(join(scratch, COLD_BUNDLE_NAME), cold);
    const warm = `
      const fs = require('node:fs'), vm = require('node:vm');
      globalThis[Symbol.for('ipwarden.coldSource')] = () => fs.readFileSync(${JSON.stringify(join(scratch, COLD_BUNDLE_NAME))}, 'utf8');
      const script = new vm.Script(${JSON.stringify(WRAP_HEAD)} + fs.readFileSync(${JSON.stringify(codeFile)}, 'utf8') + ${JSON.stringify(WRAP_TAIL)}, { filename: ${JSON.stringify(join(bindingDir, 'ipwarden'))} });
      process.on('exit', () => fs.writeFileSync(${JSON.stringify(cacheFile)}, script.createCachedData()));
      const m = { exports: {} };
      script.runInThisContext()(m.exports, require, m, ${JSON.stringify(join(bindingDir, 'ipwarden'))}, ${JSON.stringify(bindingDir)});`;
    const conf = JSON.stringify({ cniVersion: '1.0.0', name: 'warmup', ipam: { type: 'ipwarden', dataDir: join(scratch, 'data'), ranges: [[{ subnet: '10.255.0.0/30' }]] } });
    const r = spawnSync(nodePath, ['-e', warm], {
      input: conf,
      env: { PATH: '/usr/bin:/bin', CNI_COMMAND: 'ADD', CNI_CONTAINERID: 'warmup', CNI_IFNAME: 'eth0', CNI_NETNS: '/warmup', CNI_PATH: '/warmup', CONTAINER_RUNTIME_ENDPOINT: join(scratch, 'no-runtime.sock') },
      encoding: 'utf8',
      timeout: 30_000,
    });
    return r.status === 0 && existsSync(cacheFile) ? readFileSync(cacheFile) : Buffer.alloc(0);
  } finally {
    rmSync(scratch, { recursive: true, force: true });
  }
}

/**
 * Run the installed executable once the way a runtime would (CNI VERSION) and throw
 * `AppError('INTERNAL')` with what it printed unless it answers with its supported versions
 * (e.g. a parent directory's package.json with `"type": "module"` makes Node load it as ESM).
 */
function selfCheck(target: string): void {
  const r = spawnSync(target, [], { input: '{"cniVersion":"1.0.0"}', env: { PATH: '/usr/bin:/bin', CNI_COMMAND: 'VERSION' }, encoding: 'utf8', timeout: 30_000 });
  let ok = false;
  try {
    ok = r.status === 0 && Array.isArray((JSON.parse(r.stdout) as { supportedVersions?: unknown }).supportedVersions);
  } catch {
    ok = false;
  }
  if (!ok) {
    throw new AppError('INTERNAL', `installed ${target} but it does not run as a CNI plugin: ${(r.stdout + r.stderr).trim().split('\n').slice(0, 3).join(' | ') || String(r.error ?? r.status)}`);
  }
}

function atomicWrite(path: string, data: Buffer | string, mode: number): void {
  const tmp = `${path}.tmp-${process.pid}`;
  writeFileSync(tmp, data, { mode });
  chmodSync(tmp, mode);
  renameSync(tmp, path);
}

/** What {@link installCni} wrote. */
export interface Installed {
  /** Path of the plugin executable. */
  readonly target: string;
  /** Size of the embedded V8 code cache, bytes (0: it could not be made; the plugin then compiles at start-up). */
  readonly cacheBytes: number;
}

/** Install into `dest`. */
export function installCni(dest: string, nodePath: string = process.execPath): Installed {
  if (dest === '') throw new UsageError('install-cni: --dest DIR is required');
  const bundle = locateBundle();
  const binding = join(dirname(bundle), FLOCK_BINDING_NAME);
  if (!existsSync(binding)) throw new UsageError(`no flock binding at ${binding}: run "npm run build" first`);
  // DIR itself is created when missing, but not its parents: a typo in --dest must not go unnoticed.
  const parent = dirname(resolve(dest));
  if (!existsSync(parent)) throw new UsageError(`install-cni: ${parent} does not exist (--dest ${dest})`);
  if (!existsSync(dest)) mkdirSync(dest, { mode: 0o755 });
  const { hot: code, cold } = readBundles(bundle);
  const target = join(resolve(dest), 'ipwarden');
  const tmpBinding = join(resolve(dest), `${FLOCK_BINDING_NAME}.tmp-${process.pid}`);
  copyFileSync(binding, tmpBinding);
  chmodSync(tmpBinding, 0o755);
  renameSync(tmpBinding, join(resolve(dest), FLOCK_BINDING_NAME));
  const cache = makeCodeCache(code, cold, nodePath, resolve(dest));
  const payload = [
    CODE_MARK,
    Buffer.from(code, 'utf8').toString('base64'),
    CACHE_MARK,
    cache.toString('base64'),
    COLD_MARK,
    gzipSync(Buffer.from(cold, 'utf8'), { level: 9 }).toString('base64'),
    END_MARK,
  ].join('');
  atomicWrite(target, `#!${nodePath}\n${LOADER}${payload}`, 0o755);
  selfCheck(target);
  return { target, cacheBytes: cache.length };
}

/** CLI action. */
export function run(opts: { dest?: string }, ctx: CliContext): number {
  const { target, cacheBytes } = installCni(opts.dest ?? '');
  ctx.stdout(`installed ${target} (node ${process.execPath})\n`);
  if (cacheBytes === 0) ctx.stderr('ipwarden: warning: no V8 code cache could be made; the plugin will compile its code at every start\n');
  return 0;
}
