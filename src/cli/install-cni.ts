/**
 * `ipwarden install-cni --dest DIR [--socket PATH]` (docs/daemon.md "Installed files",
 * docs/cli.md): writes into the CNI bin directory DIR
 *
 * - `DIR/ipwarden-flock.node`: the native flock binding the standalone plugin loads from beside itself;
 * - `DIR/ipwarden-standalone`: the self-contained Node plugin (the esbuild bundle with a first
 *   line naming the absolute path of the Node.js running this install);
 * - `DIR/ipwarden`: the static C exec shim (`dist/ipwarden-shim`, native/shim.c), which forwards
 *   each request to the daemon's socket and falls back to `DIR/ipwarden-standalone`; with
 *   `--socket PATH` the copy written has PATH in its patchable socket field.
 *
 * in that order (the shim last, so a runtime exec'ing `DIR/ipwarden` during an upgrade always finds
 * what it runs), each atomically: a temporary file in DIR created with O_EXCL|O_NOFOLLOW (never
 * through a symlink planted at its name), fsync, rename(2), fsync of DIR. A runtime sees the old or
 * the new file, never a partial one.
 *
 * The runtime execs the plugin once per pod, so start-up time matters (docs/benchmarks.md).
 * Node 20 has no compile cache (`module.enableCompileCache` is 22+), so the standalone carries
 * its own: a small loader, then — inside one comment, base64 — the hot bundle, a V8 code cache made
 * at install time by the very Node that the first line names after a warm-up ADD, and the cold
 * bundle (CLI, gRPC; gzipped), inflated only when a command needs it. The loader
 * compiles the bundle with that cache (`vm.Script` `cachedData`); if V8 rejects it (Node was
 * upgraded) it compiles normally, so the cache only ever saves time.
 */
import { spawnSync } from 'node:child_process';
import { closeSync, constants, existsSync, fchmodSync, fsyncSync, mkdirSync, mkdtempSync, openSync, readFileSync, renameSync, rmSync, unlinkSync, writeFileSync, writeSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, dirname, join, resolve } from 'node:path';
import { gunzipSync, gzipSync } from 'node:zlib';
import { fileURLToPath } from 'node:url';
import { AppError, UsageError, errnoCode } from '../common/errors.ts';
import type { CliContext } from './context.ts';

/** File name of the native flock binding installed beside the plugin. */
export const FLOCK_BINDING_NAME = 'ipwarden-flock.node';
/** File name of the installed standalone Node plugin (the shim's fallback). */
export const STANDALONE_NAME = 'ipwarden-standalone';
/** File name of the installed shim: the name CNI configurations use (`"type": "ipwarden"`). */
export const PLUGIN_NAME = 'ipwarden';
/** File name of the built shim in dist/ (scripts/build.mjs). */
export const BUILT_SHIM_NAME = 'ipwarden-shim';

/** The shim's patchable socket-path field (native/shim.c): marker, path, NUL padding; 256 bytes. */
export const SOCKET_FIELD = { marker: 'IPWARDEN-SOCKET-PATH=', bytes: 256 } as const;
/** The shim's patchable timeout field: marker, decimal seconds (e.g. `150`, `0.5`), NUL padding; 32 bytes. */
export const TIMEOUT_FIELD = { marker: 'IPWARDEN-SHIM-TIMEOUT=', bytes: 32 } as const;
/** The socket path compiled into the shim (docs/daemon.md). */
export const DEFAULT_SOCKET = '/run/ipwarden/plugin.sock';
/** Longest socket path: `sun_path` is 108 bytes including the NUL (unix(7)). */
export const MAX_SOCKET_PATH_BYTES = 107;

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

/**
 * The shim binary to install: `ipwarden-shim` beside the bundle (dist/), or, when the bundle is an
 * installed standalone, the installed `ipwarden` beside it if that is a shim (it holds the socket
 * field's marker). Throws UsageError when there is none (the project was not built).
 */
export function locateShim(bundle: string): string {
  const built = join(dirname(bundle), BUILT_SHIM_NAME);
  if (existsSync(built)) return built;
  const installed = join(dirname(bundle), PLUGIN_NAME);
  if (basename(bundle) === STANDALONE_NAME && existsSync(installed) && readFileSync(installed).includes(SOCKET_FIELD.marker, 0, 'latin1')) return installed;
  throw new UsageError(`no exec shim at ${built}: run "npm run build" first (it needs gcc)`);
}

/**
 * Check a `--socket` value: absolute, at most 107 bytes (UTF-8), no NUL. Returns it unchanged;
 * throws UsageError naming the rule it breaks.
 */
export function validateSocketPath(path: string): string {
  if (path.includes('\0')) throw new UsageError('install-cni: --socket must not contain a NUL byte');
  if (!path.startsWith('/')) throw new UsageError(`install-cni: --socket must be an absolute path (got ${JSON.stringify(path)})`);
  const n = Buffer.byteLength(path, 'utf8');
  if (n > MAX_SOCKET_PATH_BYTES) throw new UsageError(`install-cni: --socket is ${n} bytes long, at most ${MAX_SOCKET_PATH_BYTES} fit in a unix socket address`);
  return path;
}

/**
 * A copy of `binary` with the field that starts with `field.marker` holding `value` (UTF-8),
 * NUL-padded to `field.bytes`. Throws AppError('INTERNAL') unless the marker occurs exactly once
 * and the value leaves room for its NUL.
 */
export function patchField(binary: Uint8Array, field: { readonly marker: string; readonly bytes: number }, value: string): Buffer {
  const out: Buffer = Buffer.from(binary);
  const at = out.indexOf(field.marker, 0, 'latin1');
  if (at < 0 || out.indexOf(field.marker, at + 1, 'latin1') >= 0) {
    throw new AppError('INTERNAL', `the shim binary must hold the marker ${field.marker} exactly once (found ${at < 0 ? 'none' : 'several'})`);
  }
  const v = Buffer.from(value, 'utf8');
  const room = field.bytes - field.marker.length - 1;
  if (v.length === 0 || v.length > room || v.includes(0)) throw new AppError('INTERNAL', `a ${field.marker} value must be 1..${room} bytes without NUL`);
  if (at + field.bytes > out.length) throw new AppError('INTERNAL', `the ${field.marker} field runs past the end of the shim binary`);
  out.fill(0, at + field.marker.length, at + field.bytes);
  v.copy(out, at + field.marker.length);
  return out;
}

/** What a shim's patchable fields hold: `{ socket, timeout }` (the timeout as its decimal text). */
export function readShimFields(binary: Uint8Array): { socket: string; timeout: string } {
  const b = Buffer.from(binary.buffer, binary.byteOffset, binary.byteLength);
  const read = (field: { readonly marker: string; readonly bytes: number }): string => {
    const at = b.indexOf(field.marker, 0, 'latin1');
    if (at < 0) throw new AppError('INTERNAL', `no ${field.marker} field in the shim binary`);
    const start = at + field.marker.length;
    const end = b.indexOf(0, start);
    return b.toString('utf8', start, end < 0 || end > at + field.bytes ? at + field.bytes : end);
  };
  return { socket: read(SOCKET_FIELD), timeout: read(TIMEOUT_FIELD) };
}

/**
 * The shim with its fields patched: `socket` (validated as for `--socket`) and `timeoutSeconds`
 * (the answer timeout, seconds, > 0, at most 3 decimals; tests use a short one). Absent ones keep
 * the compiled defaults (`/run/ipwarden/plugin.sock`, 150 s). Throws UsageError or AppError('INTERNAL').
 */
export function patchShim(binary: Uint8Array, opts: { socket?: string; timeoutSeconds?: number } = {}): Buffer {
  let out: Buffer = Buffer.from(binary);
  if (opts.socket !== undefined) out = patchField(out, SOCKET_FIELD, validateSocketPath(opts.socket));
  if (opts.timeoutSeconds !== undefined) {
    const t = opts.timeoutSeconds;
    if (!Number.isFinite(t) || t <= 0 || t > 86_400 || Math.round(t * 1000) !== t * 1000) throw new UsageError(`shim timeout must be 0.001..86400 seconds with at most 3 decimals (got ${t})`);
    out = patchField(out, TIMEOUT_FIELD, String(t));
  }
  return out;
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
      const script = new vm.Script(${JSON.stringify(WRAP_HEAD)} + fs.readFileSync(${JSON.stringify(codeFile)}, 'utf8') + ${JSON.stringify(WRAP_TAIL)}, { filename: ${JSON.stringify(join(bindingDir, STANDALONE_NAME))} });
      process.on('exit', () => fs.writeFileSync(${JSON.stringify(cacheFile)}, script.createCachedData()));
      const m = { exports: {} };
      script.runInThisContext()(m.exports, require, m, ${JSON.stringify(join(bindingDir, STANDALONE_NAME))}, ${JSON.stringify(bindingDir)});`;
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

/**
 * Write `data` to `path` atomically: a temporary file `<path>.tmp-<pid>` in the same directory,
 * created with O_CREAT|O_EXCL|O_NOFOLLOW (a file or symlink already at that name — a crashed
 * install's leftover, or a planted link — is unlinked, never followed, and the create retried
 * once), written, given `mode` (fchmod: no umask), fsynced, renamed over `path`; then the
 * directory is fsynced. On failure the temporary file is removed and the error rethrown (Node's
 * errno errors; AppError('INTERNAL') when the name stays taken).
 */
export function atomicWrite(path: string, data: Uint8Array | string, mode: number): void {
  const tmp = `${path}.tmp-${process.pid}`;
  const flags = constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW;
  let fd: number;
  try {
    fd = openSync(tmp, flags, 0o600);
  } catch (e) {
    if (errnoCode(e) !== 'EEXIST') throw e;
    unlinkSync(tmp); // removes the name itself, a symlink included
    try {
      fd = openSync(tmp, flags, 0o600);
    } catch (e2) {
      throw new AppError('INTERNAL', `install-cni: cannot create ${tmp}: ${e2 instanceof Error ? e2.message : String(e2)}`);
    }
  }
  try {
    const b = typeof data === 'string' ? Buffer.from(data, 'utf8') : data;
    for (let off = 0; off < b.length; ) off += writeSync(fd, b, off, b.length - off);
    fchmodSync(fd, mode);
    fsyncSync(fd);
    closeSync(fd);
    fd = -1;
    renameSync(tmp, path);
  } catch (e) {
    if (fd >= 0) closeSync(fd);
    rmSync(tmp, { force: true });
    throw e;
  }
  const dfd = openSync(dirname(path), constants.O_RDONLY | constants.O_DIRECTORY);
  try {
    fsyncSync(dfd);
  } finally {
    closeSync(dfd);
  }
}

/** What {@link installCni} wrote. */
export interface Installed {
  /** Path of the shim, `DIR/ipwarden` (what CNI configurations name). */
  readonly target: string;
  /** Path of the standalone Node plugin, `DIR/ipwarden-standalone`. */
  readonly standalone: string;
  /** Path of the flock binding, `DIR/ipwarden-flock.node`. */
  readonly binding: string;
  /** The socket path in the installed shim's field. */
  readonly socket: string;
  /** Size of the embedded V8 code cache, bytes (0: it could not be made; the plugin then compiles at start-up). */
  readonly cacheBytes: number;
}

/** Options of {@link installCni}. */
export interface InstallOptions {
  /** Node.js the standalone plugin's first line names; default the one running this install. */
  readonly nodePath?: string;
  /** Socket path patched into the shim (validated: absolute, ≤ 107 bytes, no NUL); default the compiled one. */
  readonly socket?: string;
}

/**
 * Install into `dest` (see the module comment). Throws UsageError for a bad `dest` or `socket`,
 * or when the project has not been built; AppError('INTERNAL') when an installed program does not
 * answer CNI VERSION; errno errors of the writes.
 */
export function installCni(dest: string, opts: InstallOptions = {}): Installed {
  const nodePath = opts.nodePath ?? process.execPath;
  if (dest === '') throw new UsageError('install-cni: --dest DIR is required');
  if (opts.socket !== undefined) validateSocketPath(opts.socket);
  const bundle = locateBundle();
  const binding = join(dirname(bundle), FLOCK_BINDING_NAME);
  if (!existsSync(binding)) throw new UsageError(`no flock binding at ${binding}: run "npm run build" first`);
  const shim = patchShim(readFileSync(locateShim(bundle)), opts.socket === undefined ? {} : { socket: opts.socket });
  // DIR itself is created when missing, but not its parents: a typo in --dest must not go unnoticed.
  const parent = dirname(resolve(dest));
  if (!existsSync(parent)) throw new UsageError(`install-cni: ${parent} does not exist (--dest ${dest})`);
  if (!existsSync(dest)) mkdirSync(dest, { mode: 0o755 });
  const dir = resolve(dest);
  const { hot: code, cold } = readBundles(bundle);
  const bindingOut = join(dir, FLOCK_BINDING_NAME);
  atomicWrite(bindingOut, readFileSync(binding), 0o755);
  // The warm-up ADD behind the code cache runs the standalone code itself, never the shim.
  const cache = makeCodeCache(code, cold, nodePath, dir);
  const payload = [
    CODE_MARK,
    Buffer.from(code, 'utf8').toString('base64'),
    CACHE_MARK,
    cache.toString('base64'),
    COLD_MARK,
    gzipSync(Buffer.from(cold, 'utf8'), { level: 9 }).toString('base64'),
    END_MARK,
  ].join('');
  const standalone = join(dir, STANDALONE_NAME);
  atomicWrite(standalone, `#!${nodePath}\n${LOADER}${payload}`, 0o755);
  selfCheck(standalone);
  const target = join(dir, PLUGIN_NAME);
  atomicWrite(target, shim, 0o755);
  selfCheck(target);
  return { target, standalone, binding: bindingOut, socket: readShimFields(shim).socket, cacheBytes: cache.length };
}

/** CLI action: install, then print one line per file written. */
export function run(opts: { dest?: string; socket?: string }, ctx: CliContext): number {
  const r = installCni(opts.dest ?? '', opts.socket === undefined ? {} : { socket: opts.socket });
  ctx.stdout(`installed ${r.target} (shim, socket ${r.socket})\n`);
  ctx.stdout(`installed ${r.standalone} (node ${process.execPath})\n`);
  ctx.stdout(`installed ${r.binding}\n`);
  if (r.cacheBytes === 0) ctx.stderr('ipwarden: warning: no V8 code cache could be made; the plugin will compile its code at every start\n');
  return 0;
}
