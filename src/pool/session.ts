/**
 * The pool's way to etcd (docs/cluster.md): the etcd client of a pool config ({@link etcdFor}:
 * TLS files watched for rotation, the credentials file read under the trust rules), where the
 * callers get a client and give it back ({@link KVSource}), the retry policy of a lost race
 * ({@link jitteredBackoff}), the stderr line of a corrupt key ({@link corruptLine}) and the
 * allocator of one node and network ({@link allocatorFor}). Moved here from the CNI edge
 * (src/cni/pool.ts), which keeps only turning a request into a pool call.
 */
import { readFileSync, statSync } from 'node:fs';
import { hostname } from 'node:os';
import { AppError, errnoCode } from '../common/errors.ts';
import type { PoolConfig } from '../ipam/pool-config.ts';
import type { IPAMConfig } from '../ipam/types.ts';
import { EtcdKV, type EtcdTlsSource } from '../store/etcd/etcd-kv.ts';
import type { KV, Leases } from '../store/kv.ts';
import { PoolAllocator, TOMBSTONE_TTL_SECONDS, type BlockCache, type CorruptSkip } from './allocator.ts';
import { credentialsFile } from './credentials.ts';

/** Read one TLS file; `IPAM_IO` (CNI 5) naming the key and the path when it cannot be read. */
function readPem(key: string, path: string): Buffer {
  try {
    return readFileSync(path);
  } catch (e) {
    const why = errnoCode(e) === 'ENOENT' ? 'no such file or directory' : e instanceof Error ? e.message : String(e);
    throw new AppError('IPAM_IO', `ipam.pool.etcd.tls.${key}: open ${path}: ${why}`);
  }
}

/**
 * The TLS files of `ipam.pool.etcd.tls` as the etcd client's {@link EtcdTlsSource}: `stamp()` is
 * each file's device, inode, size and mtime (nanoseconds) — a rotation that replaces a file
 * (rename) or rewrites it changes it — and `read()` reads them (code 5 naming the key and path
 * when one cannot be read). The client checks the stamp before a call at most every 10 s and at
 * once after a TLS handshake failure, and reads the files again when it changed.
 */
export function tlsFiles(t: NonNullable<PoolConfig['etcd']['tls']>): EtcdTlsSource {
  const files: Array<[string, string]> = [['ca', t.ca], ...(t.cert === null ? [] : [['cert', t.cert] as [string, string]]), ...(t.key === null ? [] : [['key', t.key] as [string, string]])];
  return {
    stamp: () =>
      files
        .map(([key, path]) => {
          try {
            const st = statSync(path, { bigint: true });
            return `${st.dev}:${st.ino}:${st.size}:${st.mtimeNs}`;
          } catch (e) {
            throw new AppError('IPAM_IO', `ipam.pool.etcd.tls.${key}: stat ${path}: ${errnoCode(e) ?? String(e)}`);
          }
        })
        .join(','),
    read: () => ({
      ca: readPem('ca', t.ca),
      ...(t.cert === null ? {} : { cert: readPem('cert', t.cert) }),
      ...(t.key === null ? {} : { key: readPem('key', t.key) }),
    }),
  };
}

/**
 * A new etcd client for `pool`: the TLS files read now (and again when they change on disk:
 * {@link tlsFiles}), the credentials file (`ipam.pool.etcd.credentials`) read at each
 * authentication under the trust rules (src/pool/credentials.ts). The caller closes it.
 * @throws AppError IPAM_IO (CNI 5) when a TLS file cannot be read, IPAM_INVALID_CONFIG (CNI 7)
 *   when the files do not make a TLS configuration (a key that does not match its certificate)
 */
export function etcdFor(pool: PoolConfig): EtcdKV {
  const t = pool.etcd.tls;
  const c = pool.etcd.credentials;
  return new EtcdKV({
    endpoints: pool.etcd.endpoints,
    tls: t === null ? undefined : tlsFiles(t),
    credentials: c === undefined || c === null ? undefined : credentialsFile(c),
  });
}

/** Where the hooks get a KV for a pool and give it back. */
export interface KVSource {
  acquire(pool: PoolConfig): Promise<KV>;
  release(pool: PoolConfig, kv: KV): Promise<void>;
}

/** One client per request, closed after it (the standalone plugin). */
export const PER_REQUEST: KVSource = {
  acquire: async (pool) => etcdFor(pool),
  release: async (_pool, kv) => kv.close(),
};

/**
 * The retry policy of a lost race (house style 7: one policy, not loops in business code): a
 * random delay in [0, min(200, 5·2^attempt)) ms ("full jitter"), so the processes of one node that
 * race for one block spread out instead of colliding again.
 */
export function jitteredBackoff(attempt: number, random: () => number = Math.random): Promise<void> {
  return new Promise((r) => setTimeout(r, backoffMs(attempt, random)));
}

/** The delay of {@link jitteredBackoff}, milliseconds: `floor(random() · min(200, 5·2^attempt))`. */
export function backoffMs(attempt: number, random: () => number = Math.random): number {
  return Math.floor(random() * Math.min(200, 5 * 2 ** attempt));
}

/** `text` with C0/C1 control characters as `\xNN` (a key from etcd may hold any bytes; stderr may be a terminal). */
function printable(text: string): string {
  return text.replace(/[\u0000-\u001f\u007f-\u009f]/g, (c) => `\\x${c.charCodeAt(0).toString(16).padStart(2, '0')}`);
}

/**
 * The stderr line of a corrupt key a pool operation went on without (the standalone plugin;
 * docs/cluster.md "Corrupt keys"): `ipwarden: pool <pool>: <op>: <action> (etcd key <key>: <why>)`.
 */
export function corruptLine(pool: string, c: CorruptSkip): string {
  return `ipwarden: pool ${printable(pool)}: ${c.op}: ${printable(c.action)} (etcd key ${printable(c.key)}: ${printable(c.why)})\n`;
}

/**
 * A {@link PoolAllocator} for `node` on `network` over `kv`: the pool's prefix and block sizes, the
 * shared retry policy ({@link jitteredBackoff}), this host's name on every handle, tombstone leases
 * when `kv` grants leases, and the optional block cache and corrupt-key callback.
 */
export function allocatorFor(kv: KV, pool: PoolConfig, node: string, network: string, rangeSets: IPAMConfig['rangeSets'], cache?: BlockCache, onCorrupt?: (c: CorruptSkip) => void): PoolAllocator {
  const leases = 'grantLease' in kv ? (kv as KV & Leases) : null;
  return new PoolAllocator({
    kv,
    pool: pool.name,
    prefix: pool.etcd.prefix,
    node,
    network,
    rangeSets,
    sizes: { blockSize4: pool.blockSize4, blockSize6: pool.blockSize6 },
    backoff: jitteredBackoff,
    // Every handle names the host that wrote it: the node's reconcile releases only its own host's (review B1).
    host: hostname(),
    ...(cache === undefined ? {} : { cache }),
    ...(leases === null ? {} : { tombstoneLease: () => leases.grantLease(TOMBSTONE_TTL_SECONDS) }),
    ...(onCorrupt === undefined ? {} : { onCorrupt }),
  });
}
