/**
 * `ipwarden install-cni --dest DIR`: write `DIR/ipwarden`, a self-contained CNI plugin executable
 * (the esbuild bundle with a first line naming the absolute path of the Node.js running this
 * install), and `DIR/ipwarden-flock.node`, the native flock binding it loads from beside itself.
 * A runtime can then exec it with its own minimal environment and no `node_modules`.
 *
 * Both files are written atomically (temporary file in DIR, then rename), so a runtime exec'ing
 * the plugin during an upgrade sees the old or the new file, never a partial one.
 */
import { chmodSync, copyFileSync, existsSync, mkdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { UsageError } from '../common/errors.ts';
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

function atomicWrite(path: string, data: Buffer | string, mode: number): void {
  const tmp = `${path}.tmp-${process.pid}`;
  writeFileSync(tmp, data, { mode });
  chmodSync(tmp, mode);
  renameSync(tmp, path);
}

/** Install into `dest`; returns the plugin's path. */
export function installCni(dest: string, nodePath: string = process.execPath): string {
  if (dest === '') throw new UsageError('install-cni: --dest DIR is required');
  const bundle = locateBundle();
  const binding = join(dirname(bundle), FLOCK_BINDING_NAME);
  if (!existsSync(binding)) throw new UsageError(`no flock binding at ${binding}: run "npm run build" first`);
  mkdirSync(dest, { recursive: true, mode: 0o755 });
  let code = readFileSync(bundle, 'utf8');
  if (code.startsWith('#!')) code = code.slice(code.indexOf('\n') + 1);
  const target = join(resolve(dest), 'ipwarden');
  const tmpBinding = join(resolve(dest), `${FLOCK_BINDING_NAME}.tmp-${process.pid}`);
  copyFileSync(binding, tmpBinding);
  chmodSync(tmpBinding, 0o755);
  renameSync(tmpBinding, join(resolve(dest), FLOCK_BINDING_NAME));
  atomicWrite(target, `#!${nodePath}\n${code}`, 0o755);
  return target;
}

/** CLI action. */
export function run(opts: { dest?: string }, ctx: CliContext): number {
  const target = installCni(opts.dest ?? '');
  ctx.stdout(`installed ${target} (node ${process.execPath})\n`);
  return 0;
}
