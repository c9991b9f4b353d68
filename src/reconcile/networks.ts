/**
 * Finding the networks under a data dir and reading their reservations (each under its store
 * lock, as the Store contract requires), for the reconciler's plan.
 */
import { readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { AppError, UsageError, errnoCode } from '../common/errors.ts';
import { CNI_NAME_RE } from '../common/names.ts';
import type { Store } from '../store/store.ts';
import type { ReservationInput } from './plan.ts';

/** Opens the store of one network of the data dir (the CLI uses `openFileStore`). */
export type StoreOpener = (network: string) => Promise<Store>;

/** Default time to wait for a network's lock, seconds. */
export const DEFAULT_LOCK_TIMEOUT_SECONDS = 30;

/**
 * Network names as CNI allows them (libcni `ValidateNetworkName`; `CNI_NAME_RE` of
 * `src/common/names.ts`). Sub-directories whose name does not match cannot be a network
 * directory and are skipped.
 */
export const NETWORK_NAME_RE: RegExp = CNI_NAME_RE;

/** One network directory of the data dir. */
export interface NetworkDir {
  readonly name: string;
  /** `<dataDir>/<name>`. */
  readonly dir: string;
}

/**
 * Every network directory of `dataDir`: each sub-directory (a symlink to a directory counts)
 * whose name is a valid network name, sorted by name. Files (the audit log, anything else) are
 * skipped. A missing data dir has no networks. Throws `AppError('STORE_IO')` when `dataDir`
 * cannot be read for another reason.
 */
export function discoverNetworks(dataDir: string): NetworkDir[] {
  let names: string[];
  try {
    names = readdirSync(dataDir);
  } catch (e) {
    if (errnoCode(e) === 'ENOENT') return [];
    throw new AppError('STORE_IO', `cannot list the data dir ${dataDir}: ${describe(e)}`, { cause: e });
  }
  const out: NetworkDir[] = [];
  for (const name of names.sort()) {
    if (!NETWORK_NAME_RE.test(name)) continue;
    const dir = join(dataDir, name);
    try {
      if (!statSync(dir).isDirectory()) continue;
    } catch {
      continue; // vanished or a dangling symlink
    }
    out.push({ name, dir });
  }
  return out;
}

/**
 * The network directory `name` of `dataDir`, checked: throws `UsageError` for an invalid
 * name and `AppError('IPAM_NOT_FOUND')` when the directory does not exist.
 */
export function namedNetwork(dataDir: string, name: string): NetworkDir {
  if (!NETWORK_NAME_RE.test(name)) throw new UsageError(`invalid network name ${JSON.stringify(name)}`);
  const dir = join(dataDir, name);
  let isDir = false;
  try {
    isDir = statSync(dir).isDirectory();
  } catch {
    isDir = false;
  }
  if (!isDir) throw new AppError('IPAM_NOT_FOUND', `no network directory ${dir}`);
  return { name, dir };
}

/**
 * Read the reservations of each network, taking and releasing its lock around the read.
 * Throws the store's errors (`STORE_LOCK_TIMEOUT`, `STORE_IO`); the store is closed either way.
 */
export async function readReservations(
  networks: readonly NetworkDir[],
  openStore: StoreOpener,
  lockTimeoutSeconds: number = DEFAULT_LOCK_TIMEOUT_SECONDS,
): Promise<ReservationInput[]> {
  const out: ReservationInput[] = [];
  for (const n of networks) {
    const store = await openStore(n.name);
    try {
      await store.lock(lockTimeoutSeconds);
      for (const r of await store.list()) {
        out.push({ network: n.name, dir: n.dir, ip: r.ip, owner: r.owner, mtimeMs: r.mtimeMs });
      }
    } finally {
      await store.close();
    }
  }
  return out;
}

function describe(e: unknown): string {
  return e instanceof Error ? e.message : String(e);
}
