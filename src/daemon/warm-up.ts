/**
 * The daemon's warm-up (issue 19, "bursts without a knee"; docs/daemon.md "Warm-up"): right after
 * the socket listens, the daemon sends itself ADD+DEL pairs through its own socket, on a scratch
 * network in a private directory beside the socket, so that V8 has compiled the request path
 * (protocol, config decoding, allocation, the indexed store, the answer) with its optimizing tier
 * before the node's first burst of pods. Measured on the project's 2-vCPU VM (docs/benchmarks.md
 * "Warm-up"): a fresh daemon spends about twice the CPU per pod of one that has served a few
 * thousand requests, and in a 100-pod burst that CPU is the limit.
 *
 * What a warm-up request is, and what it never does:
 * - it is a request whose header carries the daemon's own pid (`process.pid`) AND whose container ID
 *   starts with a random prefix made at each start (`PluginServerOptions.warmUpIdPrefix`), which no
 *   shim can know. The plugin server serves it without heal hooks (no runtime call, no kernel
 *   evidence, no recovery of the empty scratch directory) and without the kernel address index's
 *   hooks, counts it nowhere and logs its lines (served, dropped, declined, abandoned) at `debug`
 *   (src/daemon/plugin-server.ts);
 * - its network is {@link WARM_UP_NETWORK}, range {@link WARM_UP_SUBNET} (RFC 2544's benchmarking
 *   block), its dataDir a directory made here with `mkdtemp` (0700) in the socket's directory,
 *   which the plugin server checked (a real directory, root's, not writable by group or others; on
 *   a host `/run/ipwarden`, a tmpfs); nothing of the node's data directory, CNI configurations or
 *   pools is touched, and the reconcile loop never sees it (it reads `--cni-conf-dir` and
 *   `--data-dir`);
 * - it gives way: a pair starts only while no runtime request is being served or queued (one
 *   whose header or body is still arriving is not seen), so a runtime's request competes for the
 *   CPU with at most the warm-up requests already started (`concurrency`, 16 of the 64 request
 *   slots); a pair whose ADD was sent still sends its DEL;
 * - it ends at the first failure (logged at `warn`: the daemon then serves cold, as before), when
 *   the daemon stops, or after `pairs` pairs; the scratch network is then forgotten by the index
 *   and its directory removed. A directory a killed daemon left is removed at the next start (only
 *   those of the same socket name: {@link warmUpDirPrefix}).
 */
import { mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { connect } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { join } from 'node:path';
import { ACK_BYTES, ACK_MAGIC, HEADER_BYTES, decodeAnswer, encodeRequest } from './protocol.ts';
import type { Logger } from './log.ts';

/** The scratch network's name (a valid CNI network name, never one a node's configurations use). */
export const WARM_UP_NETWORK = 'ipwarden-warm-up';
/** The scratch network's range: RFC 2544's network-device benchmarking block, never a pod's. */
export const WARM_UP_SUBNET = '198.18.0.0/24';
/**
 * Prefix of the scratch directories in the socket's directory: this, the socket's file name and a
 * dash (`mkdtemp` adds 6 characters), so two daemons whose sockets share a directory never remove
 * each other's (each holds `<socket>.lock` for its whole life: src/daemon/plugin-server.ts).
 */
export const WARM_UP_DIR_PREFIX = '.ipwarden-warm-up-';

/** The scratch directories' prefix for the socket named `socketName` (its file name). */
export function warmUpDirPrefix(socketName: string): string {
  return `${WARM_UP_DIR_PREFIX}${socketName}-`;
}
/** Default `--warm-up`: ADD+DEL pairs (docs/benchmarks.md "Warm-up" for how many are needed). */
export const DEFAULT_WARM_UP_PAIRS = 2000;
/** Pairs in flight at once (the burst paths: queued lock waiters, shared flush rounds). */
export const WARM_UP_CONCURRENCY = 16;

/** What {@link warmUp} needs of the daemon. */
export interface WarmUpOptions {
  /** The daemon's plugin socket (already listening). */
  readonly socketPath: string;
  /** Where the scratch directory is made: the socket's directory (checked by the plugin server). */
  readonly scratchParent: string;
  /** ADD+DEL pairs to send (> 0). */
  readonly pairs: number;
  /** Pairs in flight at once (default {@link WARM_UP_CONCURRENCY}). */
  readonly concurrency?: number;
  /** Requests of the runtime (not the warm-up's) being served or queued now (`PluginServer.runtimeInFlight`). */
  readonly runtimeInFlight: () => number;
  /**
   * The container ID prefix the plugin server knows as the warm-up's (`PluginServerOptions.warmUpIdPrefix`):
   * with this process's pid in the header, its requests are served without heal or kernel hooks,
   * counted nowhere, logged at debug.
   */
  readonly idPrefix: string;
  /** The scratch directories' prefix ({@link warmUpDirPrefix}). */
  readonly dirPrefix: string;
  /**
   * Drop the index's state of a network directory (`NetworkIndexes.forget`): false while a request
   * or a linger still holds it (retried), true once it is gone.
   */
  readonly forget: (dataDir: string, network: string) => boolean;
  readonly log: Logger;
  /** Aborted when the daemon stops: no further request is sent. */
  readonly signal: AbortSignal;
}

/** How a warm-up ended. */
export interface WarmUpReport {
  /** Pairs whose ADD and DEL both succeeded (requests of pairs cut by a stop not included). */
  readonly pairs: number;
  /** Wall time, seconds. */
  readonly seconds: number;
  /** Why it stopped before `pairs`: `stopped` (the daemon stops) or the failure's text; null when complete. */
  readonly cut: string | null;
}

/**
 * Remove the scratch directories named `prefix…` that a killed daemon left in `parent` (never
 * throws; returns how many). Only the caller's own prefix: it holds its socket's lock.
 */
export function removeStaleWarmUpDirs(parent: string, prefix: string): number {
  // Exactly the prefix and mkdtemp's 6 characters: `plugin.sock` must not take `plugin.sock-2`'s.
  const ours = new RegExp(`^${prefix.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}[A-Za-z0-9]{6}$`);
  let n = 0;
  let names: string[];
  try {
    names = readdirSync(parent);
  } catch {
    return 0;
  }
  for (const name of names) {
    if (!ours.test(name)) continue;
    try {
      // rmSync removes a symlink itself, never what it points to.
      rmSync(join(parent, name), { recursive: true, force: true });
      n++;
    } catch {
      // Left for the next start.
    }
  }
  return n;
}

/** The CNI config of the scratch network, as the runtime would send it on stdin. */
function scratchConfig(dataDir: string): string {
  return JSON.stringify({ cniVersion: '1.0.0', name: WARM_UP_NETWORK, ipam: { type: 'ipwarden', dataDir, ranges: [[{ subnet: WARM_UP_SUBNET }]] } });
}

/**
 * One request over `socketPath`, as the shim sends it (protocol version 2: the header, the
 * acknowledgement, the body). Resolves to the answer's exit status and stderr; rejects on a
 * connection error or an answer that does not decode.
 */
function request(socketPath: string, env: Record<string, string>, stdin: string): Promise<{ exitStatus: number; stderr: string }> {
  const bytes = encodeRequest({ pid: process.pid, env, stdin, version: 2 });
  return new Promise((resolve, reject) => {
    const sock = connect(socketPath);
    const got: Buffer[] = [];
    let n = 0;
    let acked = false;
    sock.on('connect', () => sock.write(bytes.subarray(0, HEADER_BYTES)));
    sock.on('data', (b: Buffer) => {
      got.push(b);
      n += b.length;
      if (!acked && n >= ACK_BYTES) {
        const all = Buffer.concat(got);
        if (!all.subarray(0, 4).equals(ACK_MAGIC)) {
          sock.destroy();
          reject(new Error('no acknowledgement'));
          return;
        }
        acked = true;
        got.length = 0;
        got.push(all.subarray(ACK_BYTES));
        n -= ACK_BYTES;
        // Not end(): a half-close reads as a client that went away (the request is then dropped).
        sock.write(bytes.subarray(HEADER_BYTES));
      }
    });
    sock.on('error', reject);
    sock.on('close', () => {
      const st = decodeAnswer(Buffer.concat(got), 2);
      if (st.kind !== 'complete') {
        reject(new Error(`no complete answer (${st.kind === 'malformed' ? st.reason : st.kind})`));
        return;
      }
      resolve({ exitStatus: st.value.exitStatus, stderr: Buffer.from(st.value.stderr).toString('utf8') });
    });
  });
}

/** Resolve after `ms` milliseconds, or at once when `signal` is aborted (never rejects). */
function pause(ms: number, signal: AbortSignal): Promise<void> {
  return sleep(ms, undefined, { signal }).catch(() => undefined);
}

/**
 * Warm the daemon up (see the module comment). Never rejects: a failure ends the warm-up early
 * and is logged; the report says how far it got. The scratch directory is removed before it
 * resolves (or left, logged, for the next start's {@link removeStaleWarmUpDirs} when the index
 * still holds it after a few seconds).
 */
export async function warmUp(opts: WarmUpOptions): Promise<WarmUpReport> {
  const t0 = process.hrtime.bigint();
  const seconds = (): number => Number(process.hrtime.bigint() - t0) / 1e9;
  let dir: string;
  try {
    dir = mkdtempSync(join(opts.scratchParent, opts.dirPrefix));
  } catch (e) {
    const why = `cannot make the scratch directory in ${opts.scratchParent}: ${e instanceof Error ? e.message : String(e)}`;
    opts.log.warn({ error: why }, 'warm-up skipped: the daemon serves its first requests cold');
    return { pairs: 0, seconds: seconds(), cut: why };
  }
  const stdin = scratchConfig(dir);
  opts.log.info({ pairs: opts.pairs, dir }, 'warm-up started: ADD+DEL pairs to this daemon\'s own socket on a scratch network, uncounted');
  const concurrency = Math.max(1, Math.min(opts.concurrency ?? WARM_UP_CONCURRENCY, opts.pairs));
  let next = 0;
  let done = 0;
  let cut: string | null = null;
  const env = (command: string, i: number): Record<string, string> => ({
    PATH: '/usr/bin:/bin',
    CNI_COMMAND: command,
    CNI_CONTAINERID: `${opts.idPrefix}${i}`,
    CNI_IFNAME: 'eth0',
    CNI_NETNS: command === 'ADD' ? '/var/run/netns/ipwarden-warm-up' : '',
    CNI_PATH: '/opt/cni/bin',
  });
  const one = async (command: string, i: number): Promise<void> => {
    const a = await request(opts.socketPath, env(command, i), stdin);
    if (a.exitStatus !== 0) throw new Error(`${command} exited ${a.exitStatus}: ${a.stderr.slice(0, 300)}`);
  };
  // Give way: while a runtime request is being served or queued, no pair starts. One shared
  // wait (a 5 ms poll) for every worker, not one timer each.
  let idle: Promise<void> | null = null;
  const whenIdle = (): Promise<void> => {
    // do…while: the first pause always comes first, so `idle` is cleared only after it was set.
    idle ??= (async () => {
      do await pause(5, opts.signal);
      while (opts.runtimeInFlight() > 0 && !opts.signal.aborted);
    })().finally(() => {
      idle = null;
    });
    return idle;
  };
  const worker = async (): Promise<void> => {
    while (cut === null && next < opts.pairs) {
      if (opts.signal.aborted) {
        cut = 'stopped';
        return;
      }
      if (opts.runtimeInFlight() > 0) {
        await whenIdle();
        continue;
      }
      const i = next++;
      try {
        await one('ADD', i);
        await one('DEL', i);
        done++;
      } catch (e) {
        // A request cut by the daemon's own stop is not a failure.
        cut ??= opts.signal.aborted ? 'stopped' : e instanceof Error ? e.message : String(e);
      }
    }
  };
  await Promise.all(Array.from({ length: concurrency }, worker));
  // The index lingers on the scratch network's lock for a few ms after the last request.
  let forgotten = false;
  for (let tries = 0; tries < 100 && !forgotten; tries++) {
    forgotten = opts.forget(dir, WARM_UP_NETWORK);
    if (!forgotten) await pause(20, opts.signal);
    if (opts.signal.aborted) {
      forgotten ||= opts.forget(dir, WARM_UP_NETWORK);
      break;
    }
  }
  if (forgotten) {
    try {
      rmSync(dir, { recursive: true, force: true });
    } catch (e) {
      opts.log.warn({ dir, error: e instanceof Error ? e.message : String(e) }, 'warm-up: cannot remove the scratch directory (removed at the next start)');
    }
  } else {
    opts.log.warn({ dir }, 'warm-up: the index still holds the scratch network; its directory is removed at the next start');
  }
  const report = { pairs: done, seconds: seconds(), cut };
  if (cut === null || cut === 'stopped') opts.log.info(report, cut === null ? 'warm-up done' : 'warm-up stopped');
  else opts.log.warn(report, 'warm-up cut short by a failure: the daemon serves on, its first requests cold');
  return report;
}
