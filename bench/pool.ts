/**
 * Cluster pool benchmark (issue 11): simulated nodes churning pods on ONE real 3-member etcd
 * (test/helpers/etcd-cluster.ts, etcd's default raft timings), the ipwarden pool against the
 * Whereabouts-model baseline (test/helpers/whereabouts-model.ts: the whole pool in one key,
 * updated by CAS), measured in the same run on the same etcd, interleaved (each round runs every
 * node count for both, alternating which goes first), at 5, 10, 20 and 50 nodes.
 *
 * A simulated node is one etcd client (its own gRPC connection) and one allocator front:
 * - pool: `PoolSessions` (src/daemon/pool-sessions.ts), the daemon's front — one client per pool and the
 *   node's concurrent ADDs batched into one transaction — with `NODE_NAME` = the node;
 * - baseline: one `WhereaboutsModel` (lowest free address, CAS retried at once, ≤ 100 attempts).
 * Each node runs PODS pods at once, each a loop of ADD then DEL for SECONDS. The nodes are spread
 * over WORKERS processes (forks of this file) so one JavaScript thread is not the bottleneck.
 * Before the clock starts every node does one ADD+DEL (the pool node claims its first block).
 *
 * Printed per node count: allocations (successful ADDs) per second, p50/p99 ADD latency (ms) of
 * successful ADDs, failed ADDs, and etcd writes per allocation — transactions sent and keys
 * written (puts + deletes) by the clients (KV stats), both over whole pod lifecycles (ADD + DEL),
 * and the server's own count (`etcd_mvcc_put_total` + `etcd_mvcc_delete_total` on one member's
 * /metrics). Ratios pool ÷ baseline. Target (issue 11): ≥ 10× the baseline's throughput and
 * p99 ≤ 100 ms at 50 nodes. Ratios are printed, never asserted (not part of `npm test`).
 *
 * Knobs: BENCH_POOL_NODES (default "5,10,20,50"), BENCH_POOL_SECONDS (default 5),
 * BENCH_POOL_PODS (default 4), BENCH_POOL_ROUNDS (default 2), BENCH_POOL_WORKERS (default 2),
 * BENCH_POOL_SVG (write this run's plot there; docs/benchmarks-pool.svg is drawn from the tables
 * recorded in docs/benchmarks.md by scripts/bench-pool-figure.ts), BENCH_POOL_JSON (write the raw numbers there).
 *
 * Run: `node --import tsx bench/pool.ts` (no build needed).
 */
import { fork, type ChildProcess } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { cpus } from 'node:os';
import { startEtcdCluster, type EtcdCluster } from '../test/helpers/etcd-cluster.ts';
import { WhereaboutsModel } from '../test/helpers/whereabouts-model.ts';
import { EtcdKV } from '../src/store/etcd/etcd-kv.ts';
import { PoolSessions } from '../src/daemon/pool-sessions.ts';
import { loadIPAMConfig, loadNetworkIdentity } from '../src/ipam/config.ts';
import type { KVStats } from '../src/store/kv.ts';
import { renderPoolFigure, type RunPoint } from '../scripts/bench-pool-figure.ts';

type SubjectName = 'pool' | 'baseline';

interface Job {
  subject: SubjectName;
  /** closed: PODS lanes per node, each ADD→DEL back to back; open: a new pod every 1/rate s per node. */
  mode: 'closed' | 'open';
  /** open: pods started per second per node. */
  ratePerNode: number;
  nodes: string[];
  endpoints: string[];
  prefix: string;
  pods: number;
  durationMs: number;
  /** open: each node's phase in [0, 1) of a period. */
  phases: number[];
}

interface WorkerResult {
  adds: number;
  addFailures: number;
  dels: number;
  delFailures: number;
  latencies: number[];
  stats: KVStats;
  /** Bytes of the values put by successful transactions (keys not counted). */
  bytes: number;
  /** This worker's CPU (user + system) over the measured period, microseconds. */
  cpuMicros: number;
  firstError: string | null;
}

const POOL_SUBNET = '10.88.0.0/16';
const BASELINE_SUBNET = '10.89.0.0/16';

// ---------------------------------------------------------------- worker side

interface NodeFront {
  add(cid: string): Promise<void>;
  del(cid: string): Promise<void>;
  stats(): KVStats;
  /** Bytes of the values put by successful transactions so far. */
  bytes(): number;
  close(): Promise<void>;
}

/** `kv` whose successful transactions add the byte length of the values they put to `count.bytes`. */
function countBytes<T extends EtcdKV>(kv: T, count: { bytes: number }): T {
  return new Proxy(kv, {
    get(target, prop) {
      if (prop === 'txn') {
        return async (compare: Parameters<EtcdKV['txn']>[0], ops: Parameters<EtcdKV['txn']>[1]) => {
          const r = await target.txn(compare, ops);
          if (r.succeeded) for (const op of ops) if ('put' in op) count.bytes += Buffer.byteLength(op.value);
          return r;
        };
      }
      const v = Reflect.get(target, prop, target) as unknown;
      return typeof v === 'function' ? (v as (...a: unknown[]) => unknown).bind(target) : v;
    },
  });
}

function sumStats(xs: KVStats[]): KVStats {
  const s: KVStats = { reads: 0, txns: 0, txnsSucceeded: 0, puts: 0, deletes: 0 };
  for (const x of xs) {
    s.reads += x.reads;
    s.txns += x.txns;
    s.txnsSucceeded += x.txnsSucceeded;
    s.puts += x.puts;
    s.deletes += x.deletes;
  }
  return s;
}

function makeFront(job: Job, node: string): NodeFront {
  if (job.subject === 'pool') {
    const netconf = JSON.stringify({
      cniVersion: '1.0.0',
      name: 'benchnet',
      ipam: { type: 'ipwarden', ranges: [[{ subnet: POOL_SUBNET }]], pool: { name: 'bench', etcd: { endpoints: job.endpoints, prefix: job.prefix }, blockSize: 26 } },
    });
    const conf = loadIPAMConfig(netconf, undefined);
    const id = loadNetworkIdentity(netconf);
    const kvs: EtcdKV[] = [];
    const count = { bytes: 0 };
    const sessions = new PoolSessions({ NODE_NAME: node }, (pool) => {
      const kv = new EtcdKV({ endpoints: pool.etcd.endpoints });
      kvs.push(kv);
      return countBytes(kv, count);
    });
    return {
      add: async (cid) => {
        await sessions.add(conf, { containerId: cid, ifname: 'net1' });
      },
      del: async (cid) => {
        await sessions.del(id, { containerId: cid, ifname: 'net1' });
      },
      stats: () => sumStats(kvs.map((k) => k.stats)),
      bytes: () => count.bytes,
      close: () => sessions.close(),
    };
  }
  const count = { bytes: 0 };
  const kv = countBytes(new EtcdKV({ endpoints: job.endpoints }), count);
  const model = new WhereaboutsModel(kv, { key: `${job.prefix}/whereabouts-pool`, subnet: BASELINE_SUBNET });
  return {
    add: async (cid) => {
      await model.add(cid, 'net1');
    },
    del: async (cid) => {
      await model.del(cid, 'net1');
    },
    stats: () => kv.stats,
    bytes: () => count.bytes,
    close: () => kv.close(),
  };
}

async function worker(): Promise<void> {
  const job = await new Promise<Job>((res) => process.once('message', (m) => res(m as Job)));
  const fronts = job.nodes.map((n) => ({ node: n, front: makeFront(job, n) }));
  // Warm-up (not measured): one ADD + DEL per node, retried a few times.
  await Promise.all(
    fronts.map(async ({ node, front }) => {
      for (let i = 0; ; i++) {
        try {
          await front.add(`warm-${node}`);
          await front.del(`warm-${node}`);
          return;
        } catch (e) {
          if (i >= 5) throw e;
        }
      }
    }),
  );
  const base = sumStats(fronts.map((f) => f.front.stats()));
  const since = (b: KVStats): KVStats => {
    const a = sumStats(fronts.map((f) => f.front.stats()));
    return { reads: a.reads - b.reads, txns: a.txns - b.txns, txnsSucceeded: a.txnsSucceeded - b.txnsSucceeded, puts: a.puts - b.puts, deletes: a.deletes - b.deletes };
  };
  const bytes0 = fronts.reduce((t, f) => t + f.front.bytes(), 0);
  const bytesSince = (): number => fronts.reduce((t, f) => t + f.front.bytes(), 0) - bytes0;
  process.send?.({ ready: true });
  await new Promise<void>((res) => process.once('message', () => res()));
  const cpu0 = process.cpuUsage();
  const cpuSince = (): number => {
    const c = process.cpuUsage(cpu0);
    return c.user + c.system;
  };
  const r: WorkerResult = { adds: 0, addFailures: 0, dels: 0, delFailures: 0, latencies: [], stats: base, bytes: 0, cpuMicros: 0, firstError: null };
  const end = performance.now() + job.durationMs;
  const lane = async (node: string, front: NodeFront, l: number): Promise<void> => {
    for (let k = 0; performance.now() < end; k++) {
      const cid = `b-${node}-${l}-${k}`;
      const t0 = performance.now();
      try {
        await front.add(cid);
        r.latencies.push(performance.now() - t0);
        r.adds++;
      } catch (e) {
        r.addFailures++;
        r.firstError ??= e instanceof Error ? e.message : String(e);
      }
      try {
        await front.del(cid);
        r.dels++;
      } catch (e) {
        r.delFailures++;
        r.firstError ??= e instanceof Error ? e.message : String(e);
      }
    }
  };
  let addsPending = 0;
  const lifecycle = async (front: NodeFront, cid: string): Promise<void> => {
    const t0 = performance.now();
    addsPending++;
    try {
      await front.add(cid);
      r.latencies.push(performance.now() - t0);
      r.adds++;
    } catch (e) {
      r.addFailures++;
      r.firstError ??= e instanceof Error ? e.message : String(e);
    } finally {
      addsPending--;
    }
    try {
      await front.del(cid);
      r.dels++;
    } catch (e) {
      r.delFailures++;
      r.firstError ??= e instanceof Error ? e.message : String(e);
    }
  };
  if (job.mode === 'closed') {
    await Promise.all(fronts.flatMap(({ node, front }) => Array.from({ length: job.pods }, (_, l) => lane(node, front, l))));
  } else {
    // Open loop: node i starts pod k at start + (k + phase_i) / rate, phase spreading the nodes
    // over one period; in-flight pods are awaited after the last start.
    const start = performance.now();
    const inflight: Promise<void>[] = [];
    await Promise.all(
      fronts.map(async ({ node, front }, i) => {
        const phase = (job.phases[i] ?? 0);
        for (let k = 0; ; k++) {
          const at = start + ((k + phase) / job.ratePerNode) * 1000;
          if (at >= end) break;
          const wait = at - performance.now();
          if (wait > 0) await new Promise((res) => setTimeout(res, wait));
          inflight.push(lifecycle(front, `o-${node}-${k}`));
        }
      }),
    );
    // Drain, bounded: pods still unanswered 30 s after the last start count as failed ADDs.
    let settled = 0;
    for (const p of inflight) void p.finally(() => settled++);
    await Promise.race([Promise.all(inflight), new Promise((res) => setTimeout(res, 30_000))]);
    if (settled < inflight.length) {
      // ADDs still unanswered count as failed (their pods would have hit the runtime's timeout).
      r.addFailures += addsPending;
      r.firstError ??= `${addsPending} ADDs and ${inflight.length - settled - addsPending} DELs still unanswered 30 s after the last start`;
      // Abandon what is still in flight: the main process kills this worker once it has the result.
      process.send?.({ result: { ...r, stats: since(base), bytes: bytesSince(), cpuMicros: cpuSince() } });
      return;
    }
  }
  r.stats = since(base);
  r.bytes = bytesSince();
  r.cpuMicros = cpuSince();
  for (const f of fronts) await f.front.close();
  process.send?.({ result: r });
}

// ---------------------------------------------------------------- main side

interface Measurement {
  subject: SubjectName;
  mode: 'closed' | 'open';
  /** Successful ADD latencies, ms (kept for pooled quantiles). */
  latencies: number[];
  nodes: number;
  round: number;
  seconds: number;
  allocsPerSec: number;
  p50: number;
  p99: number;
  addFailures: number;
  adds: number;
  txnsPerAlloc: number;
  /** Transactions that failed their compares (lost a race), per allocation. */
  conflictsPerAlloc: number;
  /** open: the offered rate, pods/s per node (0 for closed). */
  rate: number;
  keysPerAlloc: number;
  serverWritesPerAlloc: number;
  /** Bytes of values put per allocation (whole pod lifecycles). */
  bytesPerAlloc: number;
  /** Client CPU (all workers: the fronts, their etcd clients, the load loop) per pod lifecycle (ADD + DEL), ms. */
  cpuMsPerPod: number;
  firstError: string | null;
}

function quantile(sorted: number[], q: number): number {
  if (sorted.length === 0) return NaN;
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1));
  return sorted[i] ?? NaN;
}

async function serverWrites(cluster: EtcdCluster): Promise<number> {
  const r = await fetch(`${cluster.endpoints[0]}/metrics`, { signal: AbortSignal.timeout(5000) });
  const text = await r.text();
  let n = 0;
  for (const name of ['etcd_mvcc_put_total', 'etcd_mvcc_delete_total']) {
    const m = new RegExp(`^${name} (\\S+)$`, 'm').exec(text);
    if (m?.[1] !== undefined) n += Number(m[1]);
  }
  return n;
}

async function measure(cluster: EtcdCluster, subject: SubjectName, mode: 'closed' | 'open', nodes: number, round: number, o: { pods: number; seconds: number; openSeconds: number; rate: number; workers: number }): Promise<Measurement> {
  const prefix = `/bench-${process.pid}-${subject}-${mode}-${nodes}-${round}`;
  const names = Array.from({ length: nodes }, (_, i) => `bench-node-${String(i).padStart(2, '0')}`);
  const w = Math.min(o.workers, nodes);
  const children: ChildProcess[] = [];
  try {
    const ready: Promise<void>[] = [];
    const results: Promise<WorkerResult>[] = [];
    for (let i = 0; i < w; i++) {
      const child = fork(new URL(import.meta.url).pathname, ['--worker'], { execArgv: ['--import', 'tsx'], stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
      children.push(child);
      ready.push(new Promise((res, rej) => {
        child.once('exit', (c) => rej(new Error(`bench worker exited ${c} before it was ready`)));
        child.on('message', (m) => {
          if ((m as { ready?: boolean }).ready) res();
        });
      }));
      results.push(new Promise((res, rej) => {
        child.on('message', (m) => {
          const r = (m as { result?: WorkerResult }).result;
          if (r) res(r);
        });
        child.once('exit', (c) => rej(new Error(`bench worker exited ${c} without a result`)));
      }));
      const mine = names.map((_, j) => j).filter((j) => j % w === i);
      const job: Job = {
        subject,
        mode,
        ratePerNode: o.rate,
        nodes: mine.map((j) => names[j] as string),
        endpoints: cluster.endpoints,
        prefix,
        pods: o.pods,
        durationMs: (mode === 'closed' ? o.seconds : o.openSeconds) * 1000,
        phases: mine.map((j) => j / nodes),
      };
      child.send(job);
    }
    await Promise.all(ready);
    const w0 = await serverWrites(cluster);
    const t0 = performance.now();
    for (const c of children) c.send('go');
    const rs = await Promise.all(results);
    const elapsed = (performance.now() - t0) / 1000;
    const w1 = await serverWrites(cluster);
    const lat = rs.flatMap((r) => r.latencies).sort((a, b) => a - b);
    const adds = rs.reduce((s, r) => s + r.adds, 0);
    const st = sumStats(rs.map((r) => r.stats));
    return {
      subject,
      mode,
      latencies: lat,
      nodes,
      round,
      seconds: elapsed,
      allocsPerSec: adds / elapsed,
      p50: quantile(lat, 0.5),
      p99: quantile(lat, 0.99),
      addFailures: rs.reduce((s, r) => s + r.addFailures, 0),
      adds,
      txnsPerAlloc: st.txns / Math.max(1, adds),
      conflictsPerAlloc: (st.txns - st.txnsSucceeded) / Math.max(1, adds),
      rate: mode === 'open' ? o.rate : 0,
      keysPerAlloc: (st.puts + st.deletes) / Math.max(1, adds),
      serverWritesPerAlloc: (w1 - w0) / Math.max(1, adds),
      bytesPerAlloc: rs.reduce((s, r) => s + r.bytes, 0) / Math.max(1, adds),
      cpuMsPerPod: rs.reduce((s, r) => s + r.cpuMicros, 0) / 1000 / Math.max(1, adds),
      firstError: rs.map((r) => r.firstError).find((e) => e !== null) ?? null,
    };
  } finally {
    for (const c of children) if (c.exitCode === null && c.signalCode === null && c.pid !== undefined) process.kill(c.pid, 'SIGKILL');
  }
}

/**
 * etcd's own transaction rate on this cluster: `callers` concurrent callers over 2 clients, each
 * sending one-key transactions (a put of a `valueBytes`-byte value to its own key, back to back)
 * for `seconds`. Transactions per second committed.
 */
async function etcdTxnRate(cluster: EtcdCluster, o: { callers: number; seconds: number; valueBytes: number }): Promise<number> {
  const kvs = [new EtcdKV({ endpoints: cluster.endpoints }), new EtcdKV({ endpoints: cluster.endpoints })];
  const value = 'x'.repeat(o.valueBytes);
  try {
    // Warm the connections.
    await Promise.all(kvs.map((kv, i) => kv.txn([], [{ put: `/bench-txn-rate/warm-${i}`, value }])));
    let n = 0;
    const t0 = performance.now();
    const end = t0 + o.seconds * 1000;
    await Promise.all(
      Array.from({ length: o.callers }, async (_, c) => {
        const kv = kvs[c % kvs.length] as EtcdKV;
        while (performance.now() < end) {
          if ((await kv.txn([], [{ put: `/bench-txn-rate/${c}`, value }])).succeeded) n++;
        }
      }),
    );
    return n / ((performance.now() - t0) / 1000);
  } finally {
    for (const kv of kvs) await kv.close();
  }
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 === 1 ? (s[m] ?? NaN) : ((s[m - 1] ?? NaN) + (s[m] ?? NaN)) / 2;
}

interface Row {
  nodes: number;
  /** closed loop (saturating): medians over rounds. */
  pool: Measurement;
  base: Measurement;
  /** open loop, one per rate: latencies pooled over rounds. */
  poolOpen: Measurement[];
  baseOpen: Measurement[];
}

/**
 * This run's figure, drawn by the renderer of docs/benchmarks-pool.svg (scripts/bench-pool-figure.ts)
 * with this run as the sweep and no re-measurement. The docs' figure is drawn from the tables
 * recorded in docs/benchmarks.md, never from one run's file.
 */
function svg(rows: Row[], rates: number[]): string {
  const d = new Date();
  const when = `${d.toISOString().slice(0, 10)}, ${d.toISOString().slice(11, 16)} UTC`;
  const p99 = (ms: Measurement[]) => new Map(rates.map((r, i) => [r, (ms[i] as Measurement).p99]));
  const points: RunPoint[] = rows.map((r) => ({
    nodes: r.nodes,
    pool: { allocsPerSec: r.pool.allocsPerSec, p99Ms: p99(r.poolOpen) },
    base: { allocsPerSec: r.base.allocsPerSec, p99Ms: p99(r.baseOpen) },
    ratio: r.pool.allocsPerSec / r.base.allocsPerSec,
  }));
  return renderPoolFigure({ sweep: { when, points }, rates, reruns: [] });
}

async function main(): Promise<void> {
  const nodeCounts = (process.env['BENCH_POOL_NODES'] ?? '5,10,20,50').split(',').map(Number);
  const o = {
    seconds: Number(process.env['BENCH_POOL_SECONDS'] ?? 5),
    openSeconds: Number(process.env['BENCH_POOL_OPEN_SECONDS'] ?? 10),
    rate: 0,
    pods: Number(process.env['BENCH_POOL_PODS'] ?? 4),
    workers: Number(process.env['BENCH_POOL_WORKERS'] ?? 2),
  };
  const rounds = Number(process.env['BENCH_POOL_ROUNDS'] ?? 2);
  const rates = (process.env['BENCH_POOL_RATES'] ?? '0.5,1').split(',').map(Number);
  console.log(`machine: ${cpus().length} × ${cpus()[0]?.model ?? '?'}, node ${process.version}`);
  console.log(
    `pool benchmark: one 3-member etcd (/usr/bin/etcd, default raft timings); closed loop: ${o.pods} pods per node churning ADD→DEL back to back for ${o.seconds} s; ` +
      `open loop: ${rates.join(' and ')} new pod/s per node for ${o.openSeconds} s; ${o.workers} worker processes; ${rounds} interleaved rounds`,
  );
  const cluster = await startEtcdCluster({ members: 3, heartbeatMs: 100, electionMs: 1000, prefix: 'ipwarden-bench-etcd-' });
  const all: Measurement[] = [];
  let txnRate = NaN;
  try {
    txnRate = await etcdTxnRate(cluster, { callers: 64, seconds: 3, valueBytes: 2048 });
    console.log(`  etcd alone: ${txnRate.toFixed(0)} one-key transactions/s (64 concurrent callers over 2 clients, 2 KiB values, 3 s)`);
    for (let round = 0; round < rounds; round++) {
      for (const n of nodeCounts) {
        const order: SubjectName[] = round % 2 === 0 ? ['pool', 'baseline'] : ['baseline', 'pool'];
        for (const [mode, rate] of [['closed', 0] as const, ...rates.map((r) => ['open', r] as const)]) {
          for (const s of order) {
            const m = await measure(cluster, s, mode, n, round, { ...o, rate });
            all.push(m);
            console.log(
              `  round ${round} ${mode === 'open' ? `open ${rate}` : 'closed'} ${s.padEnd(8)} ${String(n).padStart(2)} nodes: ${m.allocsPerSec.toFixed(1)} allocs/s, p50 ${m.p50.toFixed(1)} ms, p99 ${m.p99.toFixed(1)} ms, ${m.addFailures} failed ADDs${m.firstError ? ` (first: ${m.firstError.slice(0, 120)})` : ''}`,
            );
          }
        }
      }
    }
  } finally {
    await cluster.close();
  }
  const sel = (s: SubjectName, mode: 'closed' | 'open', n: number, rate: number) => all.filter((m) => m.subject === s && m.mode === mode && m.nodes === n && m.rate === rate);
  const pick = (s: SubjectName, mode: 'closed' | 'open', n: number, rate = 0): Measurement => {
    const ms = sel(s, mode, n, rate);
    const med = (f: (m: Measurement) => number) => median(ms.map(f));
    const lat = ms.flatMap((m) => m.latencies).sort((a, b) => a - b);
    const first = ms[0] as Measurement;
    return {
      ...first,
      latencies: lat,
      allocsPerSec: med((m) => m.allocsPerSec),
      p50: mode === 'open' ? quantile(lat, 0.5) : med((m) => m.p50),
      p99: mode === 'open' ? quantile(lat, 0.99) : med((m) => m.p99),
      addFailures: ms.reduce((t, m) => t + m.addFailures, 0),
      adds: ms.reduce((t, m) => t + m.adds, 0),
      txnsPerAlloc: med((m) => m.txnsPerAlloc),
      conflictsPerAlloc: med((m) => m.conflictsPerAlloc),
      keysPerAlloc: med((m) => m.keysPerAlloc),
      serverWritesPerAlloc: med((m) => m.serverWritesPerAlloc),
      bytesPerAlloc: med((m) => m.bytesPerAlloc),
      cpuMsPerPod: med((m) => m.cpuMsPerPod),
    };
  };
  const rows: Row[] = nodeCounts.map((n) => ({
    nodes: n,
    pool: pick('pool', 'closed', n),
    base: pick('baseline', 'closed', n),
    poolOpen: rates.map((r) => pick('pool', 'open', n, r)),
    baseOpen: rates.map((r) => pick('baseline', 'open', n, r)),
  }));
  const f2 = (x: number) => x.toFixed(2);
  console.log(`\nclosed loop (${o.pods} pods per node back to back; medians of ${rounds} rounds):`);
  console.log('| nodes | pool allocs/s | baseline allocs/s | pool ÷ baseline | pool p50 / p99 ms | baseline p50 / p99 ms | pool: txns (of which lost races) / keys written / server writes per alloc | baseline: same | failed ADDs pool / baseline |');
  console.log('|---:|---:|---:|---:|---:|---:|---:|---:|---:|');
  for (const r of rows) {
    const w = (m: Measurement) => `${f2(m.txnsPerAlloc)} (${f2(m.conflictsPerAlloc)}) / ${f2(m.keysPerAlloc)} / ${f2(m.serverWritesPerAlloc)}`;
    console.log(`| ${r.nodes} | ${r.pool.allocsPerSec.toFixed(1)} | ${r.base.allocsPerSec.toFixed(1)} | ${(r.pool.allocsPerSec / r.base.allocsPerSec).toFixed(1)} × | ${r.pool.p50.toFixed(0)} / ${r.pool.p99.toFixed(0)} | ${r.base.p50.toFixed(0)} / ${r.base.p99.toFixed(0)} | ${w(r.pool)} | ${w(r.base)} | ${r.pool.addFailures} / ${r.base.addFailures} |`);
  }
  rates.forEach((rate, ri) => {
    console.log(`\nopen loop (${rate} new pod/s per node, ADD then DEL; latencies pooled over ${rounds} rounds):`);
    console.log('| nodes | offered pods/s | pool p50 / p99 ms | baseline p50 / p99 ms | baseline p99 ÷ pool p99 | ADDs answered pool / baseline | failed or unanswered ADDs pool / baseline |');
    console.log('|---:|---:|---:|---:|---:|---:|---:|');
    for (const r of rows) {
      const p = r.poolOpen[ri] as Measurement;
      const b = r.baseOpen[ri] as Measurement;
      console.log(`| ${r.nodes} | ${(r.nodes * rate).toFixed(1)} | ${p.p50.toFixed(1)} / ${p.p99.toFixed(1)} | ${b.p50.toFixed(1)} / ${b.p99.toFixed(1)} | ${(b.p99 / p.p99).toFixed(1)} × | ${p.adds} / ${b.adds} | ${p.addFailures} / ${b.addFailures} |`);
    }
  });
  const top = rows[rows.length - 1];
  if (top !== undefined) {
    const x = top.pool.allocsPerSec / top.base.allocsPerSec;
    const lat = rates.map((rate, ri) => {
      const p99 = (top.poolOpen[ri] as Measurement).p99;
      return `${p99.toFixed(1)} ms at ${(top.nodes * rate).toFixed(0)} pods/s offered (${p99 <= 100 ? 'met' : 'NOT met'})`;
    });
    console.log(`\nat ${top.nodes} nodes: pool ${x.toFixed(1)} × the baseline's throughput (target ≥ 10 ×: ${x >= 10 ? 'met' : 'NOT met'}); pool p99 ADD (target ≤ 100 ms): ${lat.join(', ')}; ${top.pool.p99.toFixed(0)} ms saturated (closed loop)`);
    const p = top.pool;
    console.log(
      `at ${top.nodes} nodes (closed loop): pool ${f2(p.txnsPerAlloc)} transactions per allocation (${f2(p.conflictsPerAlloc)} lost compares), ` +
        `${p.bytesPerAlloc.toFixed(0)} value bytes written per allocation (baseline ${top.base.bytesPerAlloc.toFixed(0)}), ` +
        `${p.cpuMsPerPod.toFixed(2)} ms client CPU per pod lifecycle (ADD + DEL; baseline ${top.base.cpuMsPerPod.toFixed(2)} ms)`,
    );
    // Per pod lifecycle (ADD + DEL): the closed loop's transactions per allocation.
    console.log(
      `projected cluster capacity: ${txnRate.toFixed(0)} etcd transactions/s ÷ ${f2(p.txnsPerAlloc)} transactions per pod = ${(txnRate / p.txnsPerAlloc).toFixed(0)} pods/s ` +
        `(baseline: ÷ ${f2(top.base.txnsPerAlloc)} = ${(txnRate / top.base.txnsPerAlloc).toFixed(0)} pods/s; etcd-bound estimate: a batched transaction carries more keys than the measured one-key ones)`,
    );
  }
  const svgPath = process.env['BENCH_POOL_SVG'];
  if (svgPath) writeFileSync(svgPath, svg(rows, rates));
  const jsonPath = process.env['BENCH_POOL_JSON'];
  if (jsonPath) writeFileSync(jsonPath, JSON.stringify({ options: { ...o, rounds, nodeCounts }, measurements: all.map((m) => ({ ...m, latencies: undefined })) }, null, 1));
}

if (process.argv.includes('--worker')) {
  worker().catch((e: unknown) => {
    process.stderr.write(`bench worker: ${e instanceof Error ? e.stack : String(e)}\n`);
    process.exitCode = 1;
  });
} else {
  main().catch((e: unknown) => {
    process.stderr.write(`${e instanceof Error ? e.stack : String(e)}\n`);
    process.exitCode = 1;
  });
}
