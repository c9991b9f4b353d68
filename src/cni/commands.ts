/**
 * The plugin's command handlers (house style 8: handlers own cleanup), following host-local's
 * `cmdAdd`, `cmdDel`, `cmdCheck` (containernetworking/plugins plugins/ipam/host-local/main.go)
 * plus GC and STATUS of CNI 1.1.0.
 *
 * Every handler takes the network's lock for its whole duration and releases it in `finally`.
 * I/O is injected through {@link PluginDeps} so the same handlers run against the file store in
 * production and the memory store in unit tests.
 */
import { AppError, errnoCode } from '../common/errors.ts';
import { allocate, RangeExhaustedError, type Allocation } from '../ipam/allocator.ts';
import { loadIPAMConfig, loadNetworkIdentity } from '../ipam/config.ts';
import { parseResolvConf } from '../ipam/dns.ts';
import { formatIP, ipEquals, parseIP } from '../common/ip.ts';
import { rangeFor, rangeSetSize, rangeSetString } from '../ipam/range.ts';
import type { DNS, IP, IPAMConfig, NetworkIdentity, Range, RangeSet } from '../ipam/types.ts';
import { ownerMatches, type Owner, type Reservation, type Store } from '../store/store.ts';
import type { HealHooks, ReclaimSummary } from '../reconcile/reclaim.ts';
import type { PoolAllocation } from '../pool/index.ts';
import type { IPAMResult } from './result.ts';
import type { CmdArgs, PluginHandlers } from './skel.ts';
import type { PoolHooks } from './pool.ts';

/** What the handlers need from the outside world. */
export interface PluginDeps {
  /**
   * Open (creating `<dataDir>/<network>` when `create` is true) the store of one network.
   * Resolves to null when `create` is false and the network has no directory.
   */
  openStore(opts: { dataDir: string; network: string; create: boolean }): Promise<Store | null>;
  /** Read a text file (resolvConf). Throws the fs error. */
  readTextFile(path: string): string;
  /**
   * Self-healing (issue 4), both called by ADD with the lock held. Optional: without it ADD
   * behaves as host-local (exhaustion fails at once, an empty directory is trusted).
   */
  heal?: HealHooks;
  /**
   * The config decoders (default {@link DIRECT_DECODERS}: `loadIPAMConfig` and
   * `loadNetworkIdentity` of src/ipam/config.ts, run on every request). The daemon passes memoised
   * ones (src/daemon/config-memo.ts): same values for the same bytes, same errors.
   */
  decoders?: ConfigDecoders;
  /**
   * Cluster pools (issue 11, src/cni/pool.ts): ADD, DEL and CHECK of a network whose `ipam` has
   * `pool` go here instead of the node's files. Without it such a network fails with
   * `AppError('INTERNAL')`.
   */
  pool?: PoolHooks;
  /**
   * The daemon's kernel address index (docs/daemon.md "The kernel address index"): an ADD never
   * hands out an address it shows configured in a network namespace. Absent in the standalone
   * plugin (no per-pod read of the kernel there: ADD behaves as host-local).
   */
  kernel?: KernelAddressHooks;
}

/** What the kernel address index says about one address. */
export interface KernelAddressView {
  /** Where `ip` is configured on an interface (one clause naming the namespaces), or null when nowhere. */
  heldBy(ip: IP): string | null;
}

/** One address an ADD skipped because the kernel address index shows it configured. */
export interface KernelConflict {
  /** Canonical IP text. */
  readonly ip: string;
  /** {@link KernelAddressView.heldBy}'s clause. */
  readonly heldBy: string;
}

/** The kernel address index as an ADD of a node-local network uses it (the daemon builds it). */
export interface KernelAddressHooks {
  /**
   * The index for this ADD, asked once the network's lock is held; null when it cannot be used
   * now (no read yet, incomplete, older than its bound): the hook records why, and the ADD then
   * allocates as host-local would. Must not throw.
   */
  view(req: { readonly network: string; readonly containerId: string }): KernelAddressView | null;
  /**
   * Like {@link view}, from a read of the kernel that starts after this call. Asked when a range
   * set is exhausted after skipping addresses the index showed: an index up to its bound old may
   * still list an address whose pod has just gone. Must not reject.
   */
  fresh(req: { readonly network: string; readonly containerId: string }): Promise<KernelAddressView | null>;
  /**
   * The ADD skipped `conflicts` (each once, in the order met; never empty): told once per ADD,
   * before it answers, with its outcome (`addresses`: what it returned, [] on failure). Must not
   * throw.
   */
  skipped(e: { readonly network: string; readonly containerId: string; readonly conflicts: readonly KernelConflict[]; readonly addresses: readonly string[] }): void;
}

/** Decoders of a request's network config (pure: the same input gives the same value or error). */
export interface ConfigDecoders {
  /** As `loadIPAMConfig(stdin, cniArgs)`: the full config; throws its AppErrors. */
  ipam(stdin: Uint8Array, cniArgs: string): IPAMConfig;
  /** As `loadNetworkIdentity(stdin)`: what DEL, GC and STATUS need; throws its AppErrors. */
  identity(stdin: Uint8Array): NetworkIdentity;
}

/** The decoders of src/ipam/config.ts, called directly (the standalone plugin decodes once per exec). */
export const DIRECT_DECODERS: ConfigDecoders = { ipam: loadIPAMConfig, identity: loadNetworkIdentity };

/**
 * The self-healing hooks' contract is declared by the reconciler that implements it
 * (`src/reconcile/reclaim.ts`: the reconcile layer may not import the CNI edge); re-exported here.
 */
export type { HealHooks, ReclaimSummary };

/** Build the five handlers over `deps`. */
export function makeHandlers(deps: PluginDeps): PluginHandlers {
  const dec = deps.decoders ?? DIRECT_DECODERS;
  return {
    add: (a) => cmdAdd(deps, dec, a),
    del: (a) => cmdDel(deps, dec, a),
    check: (a) => cmdCheck(deps, dec, a),
    gc: (a) => cmdGC(deps, dec, a),
    status: (a) => cmdStatus(deps, dec, a),
  };
}

async function withLockedStore<T>(store: Store, timeoutSeconds: number, fn: (s: Store) => Promise<T>): Promise<T> {
  try {
    await store.lock(timeoutSeconds);
    return await fn(store);
  } finally {
    await store.close();
  }
}

function readDNS(deps: PluginDeps, conf: IPAMConfig): DNS {
  if (conf.resolvConf === null) return {};
  let text: string;
  try {
    text = deps.readTextFile(conf.resolvConf);
  } catch (e) {
    const why = errnoCode(e) === 'ENOENT' ? 'no such file or directory' : e instanceof Error ? e.message : String(e);
    throw new AppError('IPAM_IO', `open ${conf.resolvConf}: ${why}`);
  }
  return parseResolvConf(text);
}

/**
 * ADD: allocate one address per range set (host-local order and round robin). When a range set is
 * exhausted and a reclaim hook is present, reclaim leaked reservations under the same lock and
 * retry once. On any failure nothing of this ADD stays on disk (the allocator rolls back).
 */
async function cmdAdd(deps: PluginDeps, dec: ConfigDecoders, a: CmdArgs): Promise<IPAMResult> {
  const conf = dec.ipam(a.stdinData, a.args);
  const dns = readDNS(deps, conf);
  if (conf.pool) {
    const allocs = await poolHooks(deps).add(conf, { containerId: a.containerId, ifname: a.ifname });
    return poolResult(allocs, conf, dns);
  }
  const store = await deps.openStore({ dataDir: conf.dataDir, network: conf.name, create: true });
  if (store === null) throw new AppError('INTERNAL', 'store could not be opened');
  const kernel = deps.kernel === undefined ? null : new KernelCheck(deps.kernel, { network: conf.name, containerId: a.containerId });
  let allocs: Allocation[];
  try {
    allocs = await withLockedStore(store, conf.lockTimeoutSeconds, async (s) => {
      const req = {
        containerId: a.containerId,
        ifname: a.ifname,
        rangeSets: conf.rangeSets,
        requestedIPs: conf.requestedIPs,
      };
      let listed = await s.list({ mtime: false });
      // A network without any reservation and without round-robin state is a new or wiped data
      // directory (a reboot on tmpfs, `rm -r`), possibly under running pods: recreate their
      // reservations before handing out anything (issue 4). A directory merely emptied by DELs
      // keeps its last_reserved_ip files and is trusted, so ADD/DEL churn never asks the runtime.
      // A recovery that was killed midway left its mark: it is resumed, never taken as done (issue 7).
      if (
        deps.heal !== undefined &&
        ((listed.length === 0 && (await hasNoRoundRobinState(s, conf))) || (await s.recoveryPending())) &&
        (await deps.heal.recover(s, conf)) > 0
      ) {
        listed = await s.list({ mtime: false });
      }
      const alloc = (l?: readonly Reservation[]): Promise<Allocation[]> =>
        kernel === null ? allocate(s, req, l) : kernel.allocate((held) => allocate(s, req, l, held));
      try {
        return await alloc(listed);
      } catch (e) {
        if (deps.heal === undefined) throw e;
        // A static request (IP=, args.cni.ips, runtimeConfig.ips) whose address a leak holds: the
        // same rules as exhaustion decide, for those addresses only (issue 7).
        const held = e instanceof AppError && e.code === 'IPAM_REQUESTED_IP_UNAVAILABLE' ? heldByOthers(conf, listed, a.containerId, a.ifname) : [];
        if (held.length > 0) {
          const r = await deps.heal.reclaim(s, conf, conf.reclaimOnExhaustion, held);
          // Nothing a leak held could be freed: host-local's error as it is, unless a leak holds it.
          if (r.released === 0) throw r.reclaimable.length > 0 ? withDetails(e as AppError, (e as AppError).details, r.details) : e;
          return await alloc();
        }
        if (!(e instanceof RangeExhaustedError)) throw e;
        const r = await deps.heal.reclaim(s, conf, conf.reclaimOnExhaustion);
        if (r.released === 0) throw withDetails(e, e.details, r.details);
        try {
          return await alloc();
        } catch (e2) {
          if (e2 instanceof RangeExhaustedError) throw withDetails(e2, e2.details, r.details);
          throw e2;
        }
      }
    });
  } catch (e) {
    throw kernel === null ? e : kernel.finish([], e);
  }
  kernel?.finish(allocs.map((x) => formatIP(x.ip)), null);
  return {
    ips: allocs.map((x) => ({
      family: x.ip.family,
      address: `${formatIP(x.ip)}/${x.range.subnet.prefix}`,
      gateway: formatIP(x.range.gateway),
    })),
    routes: conf.routes,
    dns,
  };
}

/**
 * One ADD's use of the kernel address index: the view taken once the lock is held, the addresses
 * it made the allocator skip, one fresh read when only skipped addresses were left, and the report
 * to the hooks at the end.
 */
class KernelCheck {
  readonly #hooks: KernelAddressHooks;
  readonly #req: { readonly network: string; readonly containerId: string };
  /** Skipped addresses of the current attempt with the current view: IP text → holders. */
  readonly #conflicts = new Map<string, string>();
  #view: KernelAddressView | null | undefined = undefined;
  #refreshed = false;

  constructor(hooks: KernelAddressHooks, req: { readonly network: string; readonly containerId: string }) {
    this.#hooks = hooks;
    this.#req = req;
  }

  /**
   * Run `attempt` with the predicate of the current view (taken now the first time). When it
   * fails with exhaustion after skipping addresses, read the kernel once more (once per ADD) and,
   * when the fresh view can be used, run it again with that view: what the first attempt created
   * was rolled back by the allocator. When the fresh view cannot be used, the exhaustion is thrown
   * as it is (the skipped addresses stay skipped).
   */
  async allocate(attempt: (held: ((ip: IP) => boolean) | undefined) => Promise<Allocation[]>): Promise<Allocation[]> {
    if (this.#view === undefined) this.#view = this.#hooks.view(this.#req);
    try {
      return await attempt(this.#predicate());
    } catch (e) {
      if (!(e instanceof RangeExhaustedError) || this.#conflicts.size === 0 || this.#refreshed) throw e;
      this.#refreshed = true;
      const fresh = await this.#hooks.fresh(this.#req);
      // A fresh read that cannot be used (incomplete, stale, not done in time) proves nothing: the
      // addresses the usable view showed configured stay skipped and the exhaustion stands — never
      // a retry without the kernel check, which would hand out an address a pod still holds.
      if (fresh === null) throw e;
      this.#view = fresh;
      // What the earlier view showed and the fresh one does not was never a conflict.
      this.#conflicts.clear();
      return await attempt(this.#predicate());
    }
  }

  #predicate(): ((ip: IP) => boolean) | undefined {
    const view = this.#view;
    if (view === null || view === undefined) return undefined;
    return (ip) => {
      const by = view.heldBy(ip);
      if (by === null) return false;
      const text = formatIP(ip);
      if (!this.#conflicts.has(text)) this.#conflicts.set(text, by);
      return true;
    };
  }

  /**
   * Report the skipped addresses (if any) with the ADD's outcome; on failure return the error to
   * throw: the same, its details naming the skipped addresses.
   */
  finish(addresses: readonly string[], err: unknown): unknown {
    if (this.#conflicts.size === 0) return err;
    const conflicts = [...this.#conflicts].map(([ip, heldBy]) => ({ ip, heldBy }));
    this.#hooks.skipped({ ...this.#req, conflicts, addresses });
    if (!(err instanceof AppError)) return err;
    const note = `not handed out, configured in a network namespace with no reservation file: ${conflicts.map((c) => `${c.ip} (${c.heldBy})`).join(', ')}`;
    return withDetails(err, err.details, note);
  }
}

/** The pool hooks, or INTERNAL when the plugin was built without them. */
function poolHooks(deps: PluginDeps): PoolHooks {
  if (deps.pool === undefined) throw new AppError('INTERNAL', 'this plugin was started without cluster pool support (ipam.pool)');
  return deps.pool;
}

/** The result of a pool ADD: one address per range set, as the node-local ADD gives it. */
function poolResult(allocs: readonly PoolAllocation[], conf: IPAMConfig, dns: DNS): IPAMResult {
  return {
    ips: allocs.map((x) => ({ family: x.ip.family, address: `${formatIP(x.ip)}/${x.range.subnet.prefix}`, gateway: formatIP(x.range.gateway) })),
    routes: conf.routes,
    dns,
  };
}

/** The requested IPs of `conf` that a reservation of another owner holds (canonical text). */
function heldByOthers(conf: IPAMConfig, listed: readonly { ip: string; owner: Owner | null }[], containerId: string, ifname: string): string[] {
  const wanted = new Set(conf.requestedIPs.map(formatIP));
  return listed.filter((r) => wanted.has(r.ip) && !ownerMatches(r.owner, containerId, ifname)).map((r) => r.ip);
}

async function hasNoRoundRobinState(s: Store, conf: IPAMConfig): Promise<boolean> {
  for (let i = 0; i < conf.rangeSets.length; i++) if ((await s.lastReservedIP(i)) !== null) return false;
  return true;
}

/** The same error with `extra` appended to its details (message and code unchanged). */
function withDetails(e: AppError, details: string | undefined, extra: string): AppError {
  return new AppError(e.code, e.message, { details: details === undefined || details === '' ? extra : `${details}; ${extra}`, cause: e });
}

/**
 * DEL: release by owner (container ID + ifname, else legacy ID), never by IP. Succeeds when the
 * network directory is missing (nothing to release; nothing is created) and when the config's
 * ranges no longer parse: only the network identity is needed. CNI_ARGS is not interpreted.
 */
async function cmdDel(deps: PluginDeps, dec: ConfigDecoders, a: CmdArgs): Promise<void> {
  const id = dec.identity(a.stdinData);
  if (id.pool) {
    await poolHooks(deps).del(id, { containerId: a.containerId, ifname: a.ifname });
    return;
  }
  const store = await deps.openStore({ dataDir: id.dataDir, network: id.name, create: false });
  if (store === null) return;
  await withLockedStore(store, id.lockTimeoutSeconds, (s) => s.releaseByOwner(a.containerId, a.ifname));
}

/**
 * The IPs (without prefix) of a CHECK request's prevResult that lie in this config's range sets
 * (other plugins of the chain may have added addresses that are not ours to check). Reads the
 * `ips[]` shape (0.3.0+) and the `ip4`/`ip6` shape (0.1.0/0.2.0). Throws `IPAM_DECODE` when
 * prevResult is present but is not an object, `ips` is not an array, or an address is not an IP.
 */
function prevResultIPs(stdin: Uint8Array, rangeSets: readonly RangeSet[]): string[] {
  const o = JSON.parse(Buffer.from(stdin).toString('utf8')) as Record<string, unknown>;
  const prev = o['prevResult'];
  if (prev === undefined || prev === null) return [];
  if (typeof prev !== 'object' || Array.isArray(prev)) throw new AppError('IPAM_DECODE', 'prevResult must be a JSON object');
  const rec = prev as Record<string, unknown>;
  const addresses: unknown[] = [];
  if (rec['ips'] !== undefined) {
    if (!Array.isArray(rec['ips'])) throw new AppError('IPAM_DECODE', 'prevResult: "ips" must be an array');
    for (const x of rec['ips']) addresses.push(typeof x === 'object' && x !== null ? (x as Record<string, unknown>)['address'] : undefined);
  }
  for (const key of ['ip4', 'ip6']) {
    const v = rec[key];
    if (v !== undefined) addresses.push(typeof v === 'object' && v !== null ? (v as Record<string, unknown>)['ip'] : undefined);
  }
  const out: string[] = [];
  for (const addr of addresses) {
    if (typeof addr !== 'string') throw new AppError('IPAM_DECODE', 'prevResult: every address must be a string ("ips[].address", "ip4.ip", "ip6.ip")');
    const ip = parseIP(addr.split('/')[0] ?? '');
    if (ip === null) throw new AppError('IPAM_DECODE', `prevResult: invalid address "${addr}"`);
    if (rangeSets.some((rs) => rangeFor(rs, ip) >= 0)) out.push(formatIP(ip));
  }
  return out;
}

/**
 * CHECK: the container must own at least one reservation (host-local `FindByID`), and every
 * address of prevResult inside this config's ranges must be reserved by it (SPEC.md §CHECK:
 * "error if an IP reservation is missing").
 */
async function cmdCheck(deps: PluginDeps, dec: ConfigDecoders, a: CmdArgs): Promise<void> {
  const conf = dec.ipam(a.stdinData, a.args);
  const wanted = prevResultIPs(a.stdinData, conf.rangeSets);
  const notFound = new AppError('IPAM_NOT_FOUND', `ipwarden: Failed to find address added by container ${a.containerId}`);
  if (conf.pool) {
    const found = await poolHooks(deps).find(conf, { containerId: a.containerId, ifname: a.ifname });
    if (found === null || found.length === 0) throw notFound;
    const mine = found.map((x) => formatIP(x.ip));
    const missing = wanted.filter((ip) => !mine.includes(ip));
    if (missing.length > 0) {
      throw new AppError('IPAM_NOT_FOUND', `ipwarden: address ${missing.join(', ')} of container ${a.containerId} is not reserved for it`);
    }
    return;
  }
  const store = await deps.openStore({ dataDir: conf.dataDir, network: conf.name, create: false });
  if (store === null) throw notFound;
  await withLockedStore(store, conf.lockTimeoutSeconds, async (s) => {
    const mine = (await s.list()).filter((r) => ownerMatches(r.owner, a.containerId, a.ifname)).map((r) => r.ip);
    if (mine.length === 0) throw notFound;
    const missing = wanted.filter((ip) => !mine.includes(ip));
    if (missing.length > 0) {
      throw new AppError('IPAM_NOT_FOUND', `ipwarden: address ${missing.join(', ')} of container ${a.containerId} is not reserved for it`);
    }
  });
}

interface Attachment {
  containerId: string;
  ifname: string;
}

/**
 * The valid attachments of a GC request: `cni.dev/valid-attachments`, falling back to
 * `cni.dev/attachments` (the spec-v1.1.0 text; libcni injects both — anchors §1.4).
 * A missing key is an error (releasing everything must be asked for explicitly, with `[]`).
 */
export function validAttachments(stdin: Uint8Array): Attachment[] {
  const o = JSON.parse(Buffer.from(stdin).toString('utf8')) as Record<string, unknown>;
  const key = o['cni.dev/valid-attachments'] !== undefined ? 'cni.dev/valid-attachments' : 'cni.dev/attachments';
  const list = o[key];
  if (list === undefined) {
    throw new AppError('IPAM_INVALID_CONFIG', 'GC request carries no "cni.dev/valid-attachments" list');
  }
  if (!Array.isArray(list)) throw new AppError('IPAM_INVALID_CONFIG', `"${key}" must be an array`);
  return list.map((x, i) => {
    const rec = typeof x === 'object' && x !== null ? (x as Record<string, unknown>) : {};
    const containerId = rec['containerID'];
    const ifname = rec['ifname'];
    if (typeof containerId !== 'string' || typeof ifname !== 'string') {
      throw new AppError('IPAM_INVALID_CONFIG', `"${key}"[${i}] must be {"containerID": string, "ifname": string}`);
    }
    return { containerId, ifname };
  });
}

/**
 * Is the reservation owner among the valid attachments? Legacy records match on ID alone. An
 * ifname read from non-UTF-8 bytes (escaped, `src/common/bytes.ts`) also matches its JSON form:
 * the runtime's JSON encoder sends each invalid byte as U+FFFD.
 */
function ownerIsValid(owner: Owner, valid: readonly Attachment[]): boolean {
  const asJson = owner.ifname?.replace(/[\udc80-\udcff]/g, '\ufffd') ?? null;
  return valid.some((v) => v.containerId === owner.containerId && (owner.ifname === null || owner.ifname === v.ifname || asJson === v.ifname));
}

/**
 * GC (CNI 1.1.0 §GC): release every reservation of the network whose owner is not a valid
 * attachment, and every corrupt record. Never touches `lock` or `last_reserved_ip.*` (they are not
 * reservations). Continues past errors and reports them all at the end.
 */
async function cmdGC(deps: PluginDeps, dec: ConfigDecoders, a: CmdArgs): Promise<void> {
  const id = dec.identity(a.stdinData);
  const valid = validAttachments(a.stdinData);
  // A pool network: this node's handles of this network in etcd, never another node's
  // (docs/cluster.md "Reconcile per node"); a plugin built without pool GC releases nothing.
  if (id.pool) {
    const hooks = poolHooks(deps);
    if (hooks.gc !== undefined) await hooks.gc(id, valid);
    return;
  }
  const store = await deps.openStore({ dataDir: id.dataDir, network: id.name, create: false });
  if (store === null) return;
  const errors: string[] = [];
  const text = (e: unknown): string => (e instanceof Error ? e.message : String(e));
  await withLockedStore(store, id.lockTimeoutSeconds, async (s) => {
    const candidates = (await s.list()).filter((r) => r.owner === null || !ownerIsValid(r.owner, valid));
    if (candidates.length > 0 && deps.heal?.gc !== undefined) {
      // The runtime's list alone is one witness: the kernel must agree (issue 7).
      const o = await deps.heal.gc(s, id, candidates);
      for (const e of o.errors) errors.push(text(e));
      return;
    }
    for (const r of candidates) {
      try {
        await s.release(r.ip, r.owner);
      } catch (e) {
        errors.push(`${r.ip}: ${text(e)}`);
      }
    }
  });
  if (errors.length > 0) throw new AppError('STORE_IO', `GC failed to release some reservations: ${errors.join('; ')}`);
}

/**
 * STATUS (CNI 1.1.0 §STATUS): succeeds whenever the plugin itself works — the config is valid
 * and the data directory can be written (`DIR` created, a temporary file created and removed in
 * it); else code 50 `data directory <dataDir> is not writable`. It takes no lock: a busy network
 * (a long ADD, a stuck holder) is not a plugin failure. An exhausted range set is not one either:
 * containerd 2.x turns any STATUS error into NetworkReady=false, kubelet then marks the node
 * NotReady and its `not-ready:NoExecute` taint evicts every pod after 300 s, so a full node would
 * evict its own pods. Exhaustion is reported by ADD's error details, `ipwarden status` and
 * `doctor`.
 *
 * With ipam `failStatusOnExhaustion: true` (opt-in), STATUS also takes the lock and fails with
 * code 50 when some range set has no free address and nothing in it is reclaimable (leaked and
 * corrupt records count as free when automatic reclaim is on and the evidence rules would release
 * them: the next ADD does). The message carries the breakdown.
 */
async function cmdStatus(deps: PluginDeps, dec: ConfigDecoders, a: CmdArgs): Promise<void> {
  const conf = dec.ipam(a.stdinData, a.args);
  // A pool network: the config is valid, which is all STATUS checks without asking etcd (a STATUS
  // error takes the whole node NotReady; an unreachable etcd fails the ADDs with code 11 instead).
  if (conf.pool) return;
  const notWritable = (details?: string): AppError =>
    new AppError('IPAM_NOT_AVAILABLE', `data directory ${conf.dataDir} is not writable`, details === undefined ? {} : { details });
  let store: Store | null;
  try {
    store = await deps.openStore({ dataDir: conf.dataDir, network: conf.name, create: true });
  } catch (e) {
    throw notWritable(e instanceof Error ? e.message : String(e));
  }
  if (store === null) throw notWritable();
  if (!conf.failStatusOnExhaustion) {
    try {
      if (!(await store.writable())) throw notWritable();
    } finally {
      await store.close();
    }
    return;
  }
  await withLockedStore(store, conf.lockTimeoutSeconds, async (s) => {
    if (!(await s.writable())) throw notWritable();
    await failWhenExhausted(deps, conf, s);
  });
}

/** `failStatusOnExhaustion`: code 50 when a range set has no free and no reclaimable address. */
async function failWhenExhausted(deps: PluginDeps, conf: IPAMConfig, s: Store): Promise<void> {
  const reservations = await s.list({ mtime: false });
  for (let i = 0; i < conf.rangeSets.length; i++) {
    const rs = conf.rangeSets[i] as RangeSet;
    let used = 0n;
    for (const r of reservations) {
      // A corrupt record blocks its address like any other (only reclaim may free it, below).
      const ip = parseIP(r.ip);
      if (ip === null) continue;
      const k = rangeFor(rs, ip);
      if (k >= 0 && !ipEquals(ip, (rs[k] as Range).gateway)) used++;
    }
    const size = rangeSetSize(rs);
    if (used < size) continue;
    let breakdown = `range set ${i}: ${used} of ${size} addresses reserved`;
    if (deps.heal !== undefined) {
      const r = await deps.heal.reclaim(s, conf, false);
      // The next ADD reclaims leaked reservations of this very range set.
      const inThisSet = r.reclaimable.some((t) => {
        const ip = parseIP(t);
        return ip !== null && rangeFor(rs, ip) >= 0;
      });
      if (conf.reclaimOnExhaustion && inThisSet) continue;
      breakdown = `${breakdown}; ${r.details}`;
    }
    throw new AppError('IPAM_NOT_AVAILABLE', `no IP addresses available in range set: ${rangeSetString(rs)}; ${breakdown}`);
  }
}
