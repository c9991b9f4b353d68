/**
 * Reading a node's CNI configuration directory (`/etc/cni/net.d`) the way libcni finds network
 * configurations, to learn which networks use a host-local compatible IPAM (`"type":
 * "host-local"` or `"type": "ipwarden"`), their range sets and their `dataDir`.
 *
 * Files: every regular file of the directory whose name ends in `.conf`, `.conflist` or `.json`
 * (libcni `ConfFiles`), sorted by name (libcni `LoadConf`/`LoadConfList` order). A document with a
 * `plugins` array is a network configuration list (libcni `.conflist`); any other document is a
 * single plugin configuration (`.conf`). Deliberate leniency: the extension does not decide which
 * of the two a file is, so a list saved as `.json` or `.conf` is still understood.
 *
 * The IPAM section is parsed with {@link loadIPAMConfig}, given exactly what libcni would hand
 * the plugin: the plugin's object plus the list's `name` and `cniVersion` (libcni
 * `buildOneConfig`). Nothing here throws for a bad file: each problem becomes that file's `error`.
 */
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { isAppError } from '../common/errors.ts';
import { loadIPAMConfig, unknownIpamKeys } from '../ipam/config.ts';
import { misplacedPoolKey } from '../ipam/pool-config.ts';
import type { IPAMConfig } from '../ipam/types.ts';

/** File name endings libcni reads from a configuration directory. */
export const CNI_CONF_EXTENSIONS: readonly string[] = ['.conf', '.conflist', '.json'];

/** IPAM types whose reservations live in host-local's on-disk format (and so ipwarden reads). */
export const HOST_LOCAL_IPAM_TYPES: readonly string[] = ['host-local', 'ipwarden'];

/** Largest configuration file read, bytes (a real one is a few hundred bytes). */
export const MAX_CONF_BYTES = 1024 * 1024;

/** One network configuration file of the directory. */
export interface CniNetwork {
  /** Path of the file (`<dir>/<name>`). */
  readonly file: string;
  /** The network's `name`, or null when the file could not be read as JSON or has no string name. */
  readonly name: string | null;
  /** Plugin `type`s in chain order (one for a single `.conf`); empty when unreadable. */
  readonly plugins: readonly string[];
  /**
   * `ipam.type` of the plugin whose IPAM is host-local compatible (the first such plugin), else
   * of the first plugin that has an `ipam` section; null when none has one.
   */
  readonly ipamType: string | null;
  /** The parsed IPAM section when `ipamType` is `host-local` or `ipwarden` and it is valid; else null. */
  readonly ipam: IPAMConfig | null;
  /** Why the file, or its host-local compatible IPAM section, cannot be used; null when fine. */
  readonly error: string | null;
  /**
   * Keys of a valid host-local compatible `ipam` section that neither host-local nor ipwarden
   * reads (ignored; `IPAM_KEYS` of src/ipam/config.ts); absent when there is none.
   */
  readonly unknownIpamKeys?: readonly string[];
  /**
   * An `ipam` of type `ipwarden` without `pool` whose config looks like it meant a cluster pool:
   * a near miss of `pool` in `ipam` (`pools`), or `pool` outside `ipam` — at the plugin's top level
   * (refused by the plugin) or at a list's top level (libcni never passes it to the plugin, so
   * the plugin cannot see it). `message`: `misplacedPoolKey`'s (src/ipam/pool-config.ts);
   * `refusedByPlugin`: whether the plugin sees it — then it refuses ADD, CHECK and STATUS with
   * code 7, and `error` repeats the message (`ipam` is null) — or not (a list's top level: the
   * network is served node-local, `ipam` is parsed as usual). Absent otherwise.
   */
  readonly poolKeyMisplaced?: { readonly message: string; readonly refusedByPlugin: boolean };
}

/** True when `ipamType` stores reservations in host-local's format (`host-local`, `ipwarden`). */
export function isHostLocalCompatible(ipamType: string | null): boolean {
  return ipamType !== null && HOST_LOCAL_IPAM_TYPES.includes(ipamType);
}

type Json = Record<string, unknown>;

function isObject(v: unknown): v is Json {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function describe(e: unknown): string {
  if (isAppError(e)) return e.details !== undefined && e.details !== '' ? `${e.message} (${e.details})` : e.message;
  return e instanceof Error ? e.message : String(e);
}

/**
 * Parse one configuration document (the file's text). Pure. `file` is only copied into the
 * result. Never throws: problems are returned in `error`.
 */
export function parseCniConfig(file: string, text: string): CniNetwork {
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch (e) {
    return { file, name: null, plugins: [], ipamType: null, ipam: null, error: `not valid JSON: ${describe(e)}` };
  }
  if (!isObject(doc)) {
    return { file, name: null, plugins: [], ipamType: null, ipam: null, error: 'not a JSON object' };
  }
  const name = typeof doc['name'] === 'string' ? doc['name'] : null;
  const isList = Array.isArray(doc['plugins']);
  const pluginObjs: unknown[] = isList ? (doc['plugins'] as unknown[]) : [doc];
  const plugins = pluginObjs.map((p) => (isObject(p) && typeof p['type'] === 'string' ? p['type'] : ''));
  const base = { file, name, plugins };
  if (name === null) return { ...base, ipamType: null, ipam: null, error: 'no network "name"' };

  const ipamOf = (p: unknown): Json | null => (isObject(p) && isObject(p['ipam']) ? p['ipam'] : null);
  const typeOf = (i: Json): string | null => (typeof i['type'] === 'string' ? i['type'] : null);
  let chosen = pluginObjs.find((p) => {
    const i = ipamOf(p);
    return i !== null && isHostLocalCompatible(typeOf(i));
  });
  chosen ??= pluginObjs.find((p) => ipamOf(p) !== null);
  if (chosen === undefined) return { ...base, ipamType: null, ipam: null, error: null };
  const ipamType = typeOf(ipamOf(chosen) as Json);
  if (!isHostLocalCompatible(ipamType)) return { ...base, ipamType, ipam: null, error: null };

  // What libcni hands the plugin: its own object plus the list's name and cniVersion.
  const stdin = isList ? { ...(chosen as Json), name: doc['name'], cniVersion: doc['cniVersion'] } : doc;
  // The list's own top level too: a `pool` there never reaches the plugin, which would serve the
  // network from node-local files without a word.
  const seen = misplacedPoolKey(stdin, ipamOf(chosen) as Json);
  if (seen !== null) {
    const poolKeyMisplaced = { message: seen, refusedByPlugin: true };
    return { ...base, ipamType, ipam: null, error: `invalid ${ipamType} IPAM configuration: ${seen}`, poolKeyMisplaced };
  }
  const listLevel = isList ? misplacedPoolKey(doc, ipamOf(chosen) as Json) : null;
  try {
    const ipam = loadIPAMConfig(JSON.stringify(stdin), undefined);
    const unknown = unknownIpamKeys(ipamOf(chosen) as Json);
    return {
      ...base,
      ipamType,
      ipam,
      error: null,
      ...(unknown.length > 0 ? { unknownIpamKeys: unknown } : {}),
      ...(listLevel === null ? {} : { poolKeyMisplaced: { message: listLevel, refusedByPlugin: false } }),
    };
  } catch (e) {
    return { ...base, ipamType, ipam: null, error: `invalid ${ipamType} IPAM configuration: ${describe(e)}` };
  }
}

/**
 * Every network configuration file of `dir` (see the module comment), sorted by file name.
 * A missing directory has none (returns []). Files larger than {@link MAX_CONF_BYTES} or that
 * cannot be read get an `error`. Throws only for a `dir` that exists but cannot be listed
 * (the `fs` error, e.g. EACCES, ENOTDIR).
 */
export function readCniConfigs(dir: string): CniNetwork[] {
  let names: string[];
  try {
    names = readdirSync(dir);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return [];
    throw e;
  }
  const out: CniNetwork[] = [];
  for (const n of names.sort()) {
    if (!CNI_CONF_EXTENSIONS.some((ext) => n.endsWith(ext))) continue;
    const file = join(dir, n);
    let text: string;
    try {
      const st = statSync(file);
      if (!st.isFile()) continue;
      if (st.size > MAX_CONF_BYTES) {
        out.push({ file, name: null, plugins: [], ipamType: null, ipam: null, error: `larger than ${MAX_CONF_BYTES} bytes` });
        continue;
      }
      text = readFileSync(file, 'utf8');
    } catch (e) {
      out.push({ file, name: null, plugins: [], ipamType: null, ipam: null, error: `cannot read: ${describe(e)}` });
      continue;
    }
    out.push(parseCniConfig(file, text));
  }
  return out;
}
