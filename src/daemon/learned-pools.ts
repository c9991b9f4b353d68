/**
 * The daemon's care of pool networks it knows only from the requests it serves (docs/cluster.md
 * "Multus"; issue 18 item 2). With Multus the pool's network config is in a
 * NetworkAttachmentDefinition, not in the node's CNI configuration directory: it reaches the daemon
 * only on the stdin of the ADD and CHECK it serves. The daemon records every pool network of a
 * request that succeeded in `<--data-dir>/.ipwarden-pool-networks/` (src/pool/learned.ts), and
 * from then on — also after a restart, without a new request — treats it like a pool of its CNI
 * configuration: the node's heartbeat (and veto) in the pool, and the pool pass of the loop.
 */
import type { PoolSessions } from './pool-sessions.ts';
import type { IPAMConfig } from '../ipam/types.ts';
import type { PoolConfig } from '../ipam/pool-config.ts';
import { join } from 'node:path';
import { learnedName, LearnedPools, learnedPoolsDir, type LearnedPool } from '../pool/index.ts';
import type { Logger } from './log.ts';
import type { PoolLearner } from './plugin-server.ts';

/** What the daemon keeps of its learned pool networks (see the module comment). */
export class DaemonLearnedPools {
  readonly #store: LearnedPools;
  readonly #log: Logger;
  #loaded = false;

  /** @param dataDir the daemon's `--data-dir`; `now` the clock of the entries' `learnedAt` (ms) */
  constructor(dataDir: string, log: Logger, now: () => number = Date.now) {
    this.#store = new LearnedPools(learnedPoolsDir(dataDir), now);
    this.#log = log.child({ part: 'pools' });
  }

  /** The directory of the records. */
  get dir(): string {
    return this.#store.dir;
  }

  /**
   * Daemon start (the pools part, before the socket serves): read the records and announce each
   * pool in `pools` (its heartbeat with `"source":"requests"` unless a CNI configuration announced
   * it first). A record that cannot be used is one warn line (`pool network record cannot be
   * used: ignored`, with `file` and `error`) and is left on disk as it is. Never throws.
   */
  start(pools: Pick<PoolSessions, 'announce'>): void {
    this.#loaded = true;
    const r = this.#store.load();
    for (const u of r.unreadable) this.#log.warn({ file: u.file, error: u.why }, 'pool network record cannot be used: ignored');
    for (const p of r.pools) this.#announce(pools, p.conf, p.file, 'pool announced');
  }

  #announce(pools: Pick<PoolSessions, 'announce'>, conf: IPAMConfig & { readonly pool: PoolConfig }, file: string, msg: string): void {
    try {
      pools.announce(conf, 'requests');
      this.#log.info({ network: conf.name, pool: conf.pool.name, source: 'requests', file }, msg);
    } catch (e) {
      this.#log.warn({ network: conf.name, pool: conf.pool.name, source: 'requests', file, error: e instanceof Error ? e.message : String(e) }, 'pool not announced');
    }
  }

  /**
   * The plugin server's {@link PoolLearner}: a pool ADD or CHECK that succeeded records its
   * network (a new or changed entry is written, then the pool announced: `pool network learned`);
   * the same config again writes nothing. A record that cannot be written is a warn line; the
   * request's answer never depends on it.
   */
  learner(pools: Pick<PoolSessions, 'announce'>): PoolLearner {
    return (conf, stdin) => {
      const pool = conf.pool;
      if (pool === null || pool === undefined) return;
      const c = conf as IPAMConfig & { readonly pool: PoolConfig };
      try {
        const outcome = this.#store.learn(c, stdin);
        if (outcome === 'same') return;
        if (typeof outcome === 'object') {
          this.#log.warn({ network: conf.name, pool: pool.name, why: outcome.refused }, 'pool network not recorded');
          return;
        }
        this.#announce(pools, c, join(this.#store.dir, learnedName(c.pool, c.name)), outcome === 'new' ? 'pool network learned' : 'pool network config changed');
      } catch (e) {
        this.#log.warn({ network: conf.name, pool: pool.name, dir: this.#store.dir, error: e instanceof Error ? e.message : String(e) }, 'pool network not recorded');
      }
    };
  }

  /** The usable records (the loop's pool pass reconciles them); none before {@link start}. */
  entries(): LearnedPool[] {
    return this.#loaded ? this.#store.entries() : [];
  }
}
