// Debian packages a build or a lab needs, installed with apt-get when missing. Shared by
// `npm run image` (scripts/image.mjs --install) and `npm run lab` (src/lab/lab.ts and
// src/lab/daemonset-run.ts with `installPackages`), so both install the same way: one dpkg-query
// for what is there, then `apt-get update` and one `apt-get install -y --no-install-recommends` of
// only the missing packages, waiting up to 5 min for the dpkg lock another apt-get may hold.
// Plain JavaScript (scripts/image.mjs runs on Node without tsx); types in debian-packages.d.mts.
import { spawn, spawnSync } from 'node:child_process';

/** How long apt-get waits for the dpkg lock another apt-get holds, seconds (apt's DPkg::Lock::Timeout). */
const LOCK_TIMEOUT_SECONDS = 300;

/**
 * The packages of `names` that dpkg does not list as installed (`install ok installed`), in the
 * order given. Without dpkg-query (not Debian) every package counts as missing.
 * @param {readonly string[]} names Debian package names.
 * @returns {string[]}
 */
export function missingDebianPackages(names) {
  if (names.length === 0) return [];
  const r = spawnSync('dpkg-query', ['-W', '-f=${Package} ${Status}\\n', ...names], { encoding: 'utf8', env: { ...process.env, LC_ALL: 'C' } });
  if (r.error !== undefined) return [...names];
  // dpkg-query exits 1 when a name is unknown to dpkg, and prints the others: read what it printed.
  const installed = new Set(
    r.stdout
      .split('\n')
      .map((l) => l.trim().split(/\s+/))
      .filter((f) => f.length >= 4 && f.slice(1, 4).join(' ') === 'install ok installed')
      .map((f) => f[0].replace(/:.*$/, '')),
  );
  return names.filter((n) => !installed.has(n));
}

/** Runs `cmd args` with inherited stdin closed; resolves with the combined output, rejects with its tail. */
function run(cmd, args, timeoutSeconds) {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, DEBIAN_FRONTEND: 'noninteractive', LC_ALL: 'C' } });
    const out = [];
    child.stdout.on('data', (c) => out.push(c));
    child.stderr.on('data', (c) => out.push(c));
    const timer = setTimeout(() => child.kill('SIGTERM'), timeoutSeconds * 1000);
    child.once('error', (e) => {
      clearTimeout(timer);
      reject(new Error(`${cmd}: cannot run it (${e.code ?? e.message})`));
    });
    child.once('close', (code, signal) => {
      clearTimeout(timer);
      const text = Buffer.concat(out).toString('utf8');
      if (code === 0) resolve(text);
      else reject(new Error(`${cmd} ${args.join(' ')} failed (exit ${code ?? signal}):\n${text.trim().split('\n').slice(-15).join('\n')}`));
    });
  });
}

/**
 * Installs the packages of `names` that are not installed: `apt-get update`, then
 * `apt-get install -y --no-install-recommends <missing>` (non-interactive, waiting up to 5 min for
 * the dpkg lock). Does nothing when none is missing.
 * @param {readonly string[]} names Debian package names.
 * @param {{ log?: (line: string) => void, timeoutSeconds?: number }} [opts] `log` gets one line
 *   before the install; `timeoutSeconds` bounds each apt-get run (default 900).
 * @returns {Promise<string[]>} the packages installed (empty when none was missing).
 * @throws Error when not root, when apt-get cannot run or fails (with the tail of its output), or
 *   when a package is still not installed afterwards.
 */
export async function installDebianPackages(names, opts = {}) {
  const missing = missingDebianPackages(names);
  if (missing.length === 0) return [];
  if (process.getuid?.() !== 0) throw new Error(`missing Debian packages ${missing.join(' ')}; installing them needs root (apt-get install -y ${missing.join(' ')})`);
  opts.log?.(`installing ${missing.join(' ')} with apt-get`);
  const timeout = opts.timeoutSeconds ?? 900;
  const lock = `-oDPkg::Lock::Timeout=${LOCK_TIMEOUT_SECONDS}`;
  await run('apt-get', [lock, '-q', 'update'], timeout);
  await run('apt-get', [lock, '-q', '-y', '--no-install-recommends', 'install', ...missing], timeout);
  const still = missingDebianPackages(missing);
  if (still.length > 0) throw new Error(`apt-get install finished but ${still.join(' ')} is not installed`);
  return missing;
}
