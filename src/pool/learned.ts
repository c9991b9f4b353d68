/**
 * The pool networks a node's daemon learned from the requests it served (docs/cluster.md
 * "Multus"): with Multus a pool's network config lives in a NetworkAttachmentDefinition and
 * reaches ipwarden only on the stdin of the ADD, DEL and CHECK it serves, never in the node's CNI
 * configuration directory. The daemon keeps every such network here, so its heartbeat, its veto and
 * its pool pass cover the pool from the daemon's start on, also after a restart with no request.
 *
 * Layout: one file per entry, `<dir>/<64 hex>.json`, the hex the SHA-256 of the entry's key
 * `[etcd endpoints, etcd prefix, pool name, network name]` (JSON), so a changed config of the same
 * network and pool replaces its entry; the directory is the daemon's
 * `<--data-dir>/.ipwarden-pool-networks` ({@link LEARNED_DIR_NAME}: a name no CNI network can
 * have, so the node-local reconciler never takes it for a network directory). Written by
 * {@link PoolJournal} (mode 0600 in a 0700 directory, a temporary file `O_EXCL|O_NOFOLLOW`, fsync,
 * rename, fsync of the directory: a reader never sees a half-written entry). Read by
 * {@link readLearnedPools} under the trust rules of src/common/trust.ts: the directory a real
 * directory (lstat: a symlink is not followed), every file opened `O_NOFOLLOW`, a regular file of
 * at most {@link LEARNED_MAX_BYTES} bytes, both owned by root (or the daemon's user) and writable
 * by neither group nor others.
 *
 * An entry's value (strict: any other field, type or version is an unreadable entry):
 * `{"v":1,"learnedAt":<ms since the epoch>,"config":{"cniVersion","name","ipam"}}` — `config` is
 * the request's network config cut to the keys the IPAM plugin reads (the main plugin's keys,
 * `args`, `runtimeConfig` and `prevResult` are not kept) and is decoded again by the plugin's own
 * parser ({@link loadIPAMConfig}) on every read, so an entry is used only if it still makes a
 * valid pool network. An entry that cannot be used is reported with why and ignored; the others
 * stay in use. Nothing here ever deletes an entry (see docs/cluster.md "Multus" for why an entry
 * is kept until an operator removes it).
 */
import { closeSync, constants, fstatSync, lstatSync, openSync, readdirSync, readSync } from 'node:fs';
import { createHash } from 'node:crypto';
import { join } from 'node:path';
import { errnoCode, isAppError } from '../common/errors.ts';
import { untrustedReason } from '../common/trust.ts';
import { loadIPAMConfig } from '../ipam/config.ts';
import type { IPAMConfig } from '../ipam/types.ts';
import type { PoolConfig } from '../ipam/pool-config.ts';
import { PoolJournal } from './journal.ts';

/** The directory's name under the daemon's `--data-dir`. */
export const LEARNED_DIR_NAME = '.ipwarden-pool-networks';
/** An entry's file name. */
export const LEARNED_NAME_RE = /^[0-9a-f]{64}\.json$/;
/** Largest entry read, bytes (a pool network's IPAM section is well under 4 KiB). */
export const LEARNED_MAX_BYTES = 65_536;
/** Keys of a request's network config that an entry keeps (what the IPAM plugin reads). */
const KEPT_KEYS = ['cniVersion', 'name', 'ipam'] as const;

/** The directory of the learned pool networks under the daemon's data dir `dataDir`. */
export function learnedPoolsDir(dataDir: string): string {
  return join(dataDir, LEARNED_DIR_NAME);
}

/** One usable entry. */
export interface LearnedPool {
  /** The entry's file (absolute path). */
  readonly file: string;
  /** The network config as decoded by the plugin's parser (`pool` is set). */
  readonly conf: IPAMConfig & { readonly pool: PoolConfig };
  /** When the entry was written (the config first learned, or last changed), ms since the epoch. */
  readonly learnedAt: number;
  /** The kept network config as JSON text (`cniVersion`, `name`, `ipam`: what a new request is compared with). */
  readonly kept: string;
}

/** An entry that cannot be used: its file and why (one clause). */
export interface UnreadableLearned {
  readonly file: string;
  readonly why: string;
}

/** What {@link readLearnedPools} found: the usable entries, sorted by file name, and the others. */
export interface LearnedRead {
  readonly pools: LearnedPool[];
  readonly unreadable: UnreadableLearned[];
}

/** The file name of the entry of `pool` and network `network`: SHA-256 of the key, `.json`. Pure. */
export function learnedName(pool: PoolConfig, network: string): string {
  const key = JSON.stringify([pool.etcd.endpoints, pool.etcd.prefix, pool.name, network]);
  return `${createHash('sha256').update(key).digest('hex')}.json`;
}

type Obj = Record<string, unknown>;
const isObj = (v: unknown): v is Obj => typeof v === 'object' && v !== null && !Array.isArray(v);

/**
 * The part of a request's network config (its stdin) an entry keeps: `cniVersion`, `name`, `ipam`
 * (absent keys stay absent). Returns null when `stdin` is not a JSON object. Pure.
 */
export function keptConfig(stdin: string | Uint8Array): Obj | null {
  let doc: unknown;
  try {
    doc = JSON.parse(typeof stdin === 'string' ? stdin : Buffer.from(stdin).toString('utf8'));
  } catch {
    return null;
  }
  if (!isObj(doc)) return null;
  const out: Obj = {};
  for (const k of KEPT_KEYS) if (k in doc) out[k] = doc[k];
  return out;
}

/**
 * Decode an entry's text `text` read from file `name`. Returns the entry, or why it cannot be used.
 * Pure (the config is decoded by {@link loadIPAMConfig}, no I/O).
 */
export function decodeLearned(name: string, file: string, text: string): LearnedPool | { why: string } {
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch {
    return { why: 'not valid JSON' };
  }
  if (!isObj(doc)) return { why: 'not a JSON object' };
  const known = ['v', 'learnedAt', 'config'];
  for (const k of Object.keys(doc)) if (!known.includes(k)) return { why: `unknown field ${JSON.stringify(k)} (known: ${known.join(', ')})` };
  if (doc['v'] !== 1) return { why: `"v" must be 1, got ${JSON.stringify(doc['v'] ?? null)}` };
  const at = doc['learnedAt'];
  if (typeof at !== 'number' || !Number.isSafeInteger(at) || at < 0) return { why: `"learnedAt" must be a non-negative integer, got ${JSON.stringify(at ?? null)}` };
  const config = doc['config'];
  if (!isObj(config)) return { why: '"config" must be an object' };
  for (const k of Object.keys(config)) if (!(KEPT_KEYS as readonly string[]).includes(k)) return { why: `unknown field "config.${k}" (known: ${KEPT_KEYS.join(', ')})` };
  let conf: IPAMConfig;
  try {
    conf = loadIPAMConfig(JSON.stringify(config), undefined);
  } catch (e) {
    const m = isAppError(e) ? (e.details !== undefined && e.details !== '' ? `${e.message} (${e.details})` : e.message) : e instanceof Error ? e.message : String(e);
    return { why: `"config" is not a usable network config: ${m}` };
  }
  const pool = conf.pool;
  if (pool === null || pool === undefined) return { why: '"config" has no ipam.pool' };
  if (learnedName(pool, conf.name) !== name) return { why: 'the file name is not the hash of the entry\'s pool and network (renamed or copied by hand?)' };
  return { file, conf: conf as LearnedPool['conf'], learnedAt: at, kept: JSON.stringify(config) };
}

/**
 * Read every entry of `dir` (see the module comment). Creates nothing; an absent directory is no
 * entry. Files of other names (a crash's temporary files) are skipped. Never throws: a directory
 * that cannot be used is one unreadable item naming it, each bad file another.
 * @param euid the owner trusted besides root (default: the process's effective uid)
 */
export function readLearnedPools(dir: string, euid: number = process.geteuid?.() ?? 0): LearnedRead {
  const pools: LearnedPool[] = [];
  const unreadable: UnreadableLearned[] = [];
  let st;
  try {
    st = lstatSync(dir);
  } catch (e) {
    if (errnoCode(e) === 'ENOENT') return { pools, unreadable };
    return { pools, unreadable: [{ file: dir, why: `cannot stat it: ${errnoCode(e) ?? String(e)}` }] };
  }
  if (!st.isDirectory()) return { pools, unreadable: [{ file: dir, why: 'is not a directory (a symlink is not followed)' }] };
  const dirBad = untrustedReason(dir, st, euid);
  if (dirBad !== null) return { pools, unreadable: [{ file: dir, why: dirBad }] };
  let names: string[];
  try {
    names = readdirSync(dir).sort();
  } catch (e) {
    return { pools, unreadable: [{ file: dir, why: `cannot read it: ${errnoCode(e) ?? String(e)}` }] };
  }
  for (const name of names) {
    if (!LEARNED_NAME_RE.test(name)) continue;
    const file = join(dir, name);
    const r = readOne(file, euid);
    if ('why' in r) {
      unreadable.push({ file, why: r.why });
      continue;
    }
    const d = decodeLearned(name, file, r.text);
    if ('why' in d) unreadable.push({ file, why: d.why });
    else pools.push(d);
  }
  return { pools, unreadable };
}

/** One file's text under the trust rules, or why not. */
function readOne(file: string, euid: number): { text: string } | { why: string } {
  let fd: number;
  try {
    fd = openSync(file, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
  } catch (e) {
    const code = errnoCode(e);
    return { why: code === 'ELOOP' ? 'is a symlink (not followed)' : `cannot open it: ${code ?? String(e)}` };
  }
  try {
    const st = fstatSync(fd);
    if (!st.isFile()) return { why: 'is not a regular file' };
    const bad = untrustedReason(file, st, euid);
    if (bad !== null) return { why: bad };
    if (st.size > LEARNED_MAX_BYTES) return { why: `is ${st.size} bytes long, at most ${LEARNED_MAX_BYTES}` };
    const buf = Buffer.alloc(LEARNED_MAX_BYTES + 1);
    let n = 0;
    for (let got = -1; got !== 0 && n < buf.length; n += got) got = readSync(fd, buf, n, buf.length - n, n);
    if (n > LEARNED_MAX_BYTES) return { why: `is longer than ${LEARNED_MAX_BYTES} bytes` };
    return { text: buf.toString('utf8', 0, n) };
  } catch (e) {
    return { why: `cannot read it: ${errnoCode(e) ?? String(e)}` };
  } finally {
    closeSync(fd);
  }
}

/** What {@link LearnedPools.learn} did. */
/**
 * What {@link LearnedPools.learn} did: wrote a `new` entry, rewrote a `changed` one, found it the
 * `same`, or `refused` it (a fixed `ipam.nodeName`, or {@link MAX_LEARNED} entries already: nothing written).
 */
export type LearnOutcome = 'new' | 'changed' | 'same' | { readonly refused: string };

/**
 * The most pool networks a daemon keeps learned from requests. Each costs an etcd client, a
 * heartbeat and a reconcile target for the daemon's life; a namespace's NetworkAttachmentDefinitions
 * must not grow that without bound (review).
 */
export const MAX_LEARNED = 64;

/**
 * The daemon's set of learned pool networks: read once at start ({@link load}), then kept in
 * memory and written through on every new or changed entry ({@link learn}). A request whose kept
 * config equals its entry's writes nothing (the ADD path pays one JSON comparison).
 */
export class LearnedPools {
  readonly dir: string;
  readonly #journal: PoolJournal;
  readonly #now: () => number;
  /** File name → the entry's kept config as JSON text (what {@link learn} compares). */
  readonly #texts = new Map<string, string>();
  readonly #pools = new Map<string, LearnedPool>();

  /** @param now the clock of `learnedAt` (ms since the epoch; information only, no decision reads it) */
  constructor(dir: string, now: () => number = Date.now) {
    this.dir = dir;
    this.#journal = new PoolJournal(dir);
    this.#now = now;
  }

  /** Read the directory ({@link readLearnedPools}); returns what was found. Never throws. */
  load(): LearnedRead {
    const r = readLearnedPools(this.dir);
    for (const p of r.pools) {
      const name = p.file.slice(this.dir.length + 1);
      this.#pools.set(name, p);
      this.#texts.set(name, p.kept);
    }
    return r;
  }

  /** The usable entries (loaded or learned), sorted by file name. */
  entries(): LearnedPool[] {
    return [...this.#pools.entries()].sort((a, b) => (a[0] < b[0] ? -1 : 1)).map(([, p]) => p);
  }

  /**
   * Learn the pool network of a request: `conf` its decoded config (with `pool`), `stdin` its
   * network config. A new entry, or one whose kept config changed, is written (durably) before
   * this returns.
   * @throws AppError STORE_IO when the entry cannot be written (the caller logs it; the request
   *   is not failed for it)
   */
  learn(conf: IPAMConfig & { readonly pool: PoolConfig }, stdin: string | Uint8Array): LearnOutcome {
    const kept = keptConfig(stdin);
    if (kept === null) return 'same'; // not reached: the request's config was decoded from it
    // A request's config that fixes the node name would make this daemon heartbeat (and veto the
    // removal of) whatever node it names, for good: such a network is served, never recorded
    // (a NetworkAttachmentDefinition is written by whoever may create one in a namespace; review).
    if (conf.pool.nodeName !== null) return { refused: `its ipam.nodeName (${conf.pool.nodeName}) fixes the node name: only the node's own name is recorded` };
    const name = learnedName(conf.pool, conf.name);
    const text = JSON.stringify(kept);
    const prev = this.#texts.get(name);
    if (prev === text) return 'same';
    if (prev === undefined && this.#pools.size >= MAX_LEARNED) return { refused: `${MAX_LEARNED} pool networks are recorded already` };
    const learnedAt = this.#now();
    this.#journal.write(name, `${JSON.stringify({ v: 1, learnedAt, config: kept })}\n`);
    this.#texts.set(name, text);
    this.#pools.set(name, { file: join(this.dir, name), conf, learnedAt, kept: text });
    return prev === undefined ? 'new' : 'changed';
  }
}
