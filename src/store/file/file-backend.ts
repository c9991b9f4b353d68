/**
 * `FileBackend`: the {@link StoreBackend} of a host-local data dir — the networks are its
 * sub-directories with a valid network name (`<dataDir>/<network>/`, host-local's layout), each
 * opened as a {@link FileStore} (same files, same lock: nothing changes for host-local).
 */
import { existsSync, readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { AppError, ClosedError, errnoCode } from '../../common/errors.ts';
import { CNI_NAME_RE } from '../../common/names.ts';
import type { Store, StoreBackend } from '../store.ts';
import { openFileStore } from './file-store.ts';

/** {@link StoreBackend} over `dataDir`. See the module comment. */
export class FileBackend implements StoreBackend {
  readonly description: string;
  readonly #dataDir: string;
  #closed = false;

  constructor(dataDir: string) {
    this.#dataDir = dataDir;
    this.description = `file:${dataDir}`;
  }

  #open(): void {
    if (this.#closed) throw new ClosedError(`file backend ${this.#dataDir}`);
  }

  /** Sub-directories (a symlink to a directory counts) with a valid network name; none for a missing data dir. */
  async listNetworks(): Promise<string[]> {
    this.#open();
    let names: string[];
    try {
      names = readdirSync(this.#dataDir);
    } catch (e) {
      if (errnoCode(e) === 'ENOENT') return [];
      throw new AppError('STORE_IO', `cannot list the data dir ${this.#dataDir}: ${e instanceof Error ? e.message : String(e)}`, { cause: e });
    }
    return names
      .filter((n) => {
        if (!CNI_NAME_RE.test(n)) return false;
        try {
          return statSync(join(this.#dataDir, n)).isDirectory();
        } catch {
          return false;
        }
      })
      .sort();
  }

  async open(network: string, opts: { create: boolean }): Promise<Store | null> {
    this.#open();
    if (!CNI_NAME_RE.test(network)) throw new AppError('IPAM_INVALID_CONFIG', `invalid network name ${JSON.stringify(network)}`);
    if (!opts.create && !existsSync(join(this.#dataDir, network))) return null;
    return openFileStore({ dataDir: this.#dataDir, network });
  }

  async close(): Promise<void> {
    this.#closed = true;
  }
}
