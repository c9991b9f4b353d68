/**
 * A real etcd cluster for tests and benchmarks (issue 11): 1 or 3 members of the installed
 * `/usr/bin/etcd` (Debian `etcd-server`, 3.4.23 here) on loopback, with ports chosen at run time
 * and a private temp data dir (`ipwarden-etcdlab-*`). Faults: kill -9 a member and restart it on
 * the same data dir and ports; SIGSTOP / SIGCONT a member (the leader, found through the
 * maintenance Status API of the members' grpc-gateway, `POST /v3/maintenance/status`).
 *
 * Every member runs under `setpriv --pdeathsig KILL` so it dies with the process that started it
 * (a test runner's timeout that kills the test process, when no `after` hook runs); `close()`
 * kills every member by pid and removes the data dir, and is safe to call twice. A process `exit`
 * hook does the same synchronously as a last resort.
 *
 * Facts used: etcd's flags (`etcd --help`, 3.4); `/health` answers `{"health":"true"}` only when
 * the member has a leader and can serve (etcd-io/etcd:etcdserver/api/etcdhttp/metrics.go, 3.4);
 * the gateway's Status reply carries `header.member_id` and `leader` as decimal uint64 strings
 * (etcdserverpb.StatusResponse, JSON-encoded by grpc-gateway).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { closeSync, existsSync, mkdtempSync, openSync, readFileSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { alive } from './cni.ts';
import { sigkillAndWaitSync } from './kill-sync.ts';

/** The installed etcd server binary. */
export const ETCD_BIN = '/usr/bin/etcd';
/** The installed etcdctl (v3 API). */
export const ETCDCTL_BIN = '/usr/bin/etcdctl';

/** True when the etcd server binary is installed. */
export function haveEtcd(): boolean {
  return existsSync(ETCD_BIN);
}

/** Options of {@link startEtcdCluster}. */
export interface EtcdClusterOptions {
  /** Number of members: 1 or 3 (default 3). */
  members?: 1 | 3;
  /** Raft heartbeat interval in milliseconds (etcd `--heartbeat-interval`; default 50). */
  heartbeatMs?: number;
  /** Raft election timeout in milliseconds (etcd `--election-timeout`; default 500). */
  electionMs?: number;
  /** Bound for the cluster (and each restarted member) to become healthy, in ms (default 30 000). */
  readyTimeoutMs?: number;
  /** Prefix of the temp data dir's name (default `ipwarden-etcdlab-`). */
  prefix?: string;
  /** Extra etcd flags for every member (e.g. `['--quota-backend-bytes', '...']`). */
  extraArgs?: string[];
  /**
   * Serve clients over TLS (`https://` client URLs): etcd's `--cert-file`, `--key-file`,
   * `--trusted-ca-file`, and `--client-cert-auth` when `clientCertAuth`. The files are read by
   * etcd at each start, so a test rotates them on disk and restarts a member. Health is then read
   * on a plain `--listen-metrics-urls` listener (its `/health`); `status()` and `leader()` are not
   * available (they use the client URL's gateway).
   */
  tls?: { cert: string; key: string; ca: string; clientCertAuth?: boolean };
}

/** One member's fixed identity (it keeps its ports and data dir across restarts). */
export interface EtcdMember {
  /** `m0`, `m1`, `m2`. */
  readonly name: string;
  /** `http://127.0.0.1:PORT` (`https://` with `tls`): the client URL (gRPC and the HTTP gateway). */
  readonly clientUrl: string;
  /** `http://127.0.0.1:PORT`: the peer URL. */
  readonly peerUrl: string;
  /** The member's data dir (inside the cluster's temp dir). */
  readonly dataDir: string;
  /** Its log file (etcd's stderr, appended across restarts). */
  readonly logPath: string;
  /** The current process id, or null while the member is killed. */
  readonly pid: number | null;
  /** True while the member is SIGSTOPped. */
  readonly stopped: boolean;
}

/** The Status of one member, from its maintenance API. */
export interface EtcdMemberStatus {
  /** The member's raft ID (decimal text of a uint64). */
  memberId: string;
  /** The leader's raft ID as this member sees it ("0" when it knows none). */
  leaderId: string;
  /** Raft term (decimal text). */
  raftTerm: string;
  /** The store revision the member has applied (decimal text). */
  revision: string;
}

/** A running cluster. Indices are member indices (0-based) into {@link EtcdCluster.members}. */
export interface EtcdCluster {
  /** The client URLs of all members, in member order (what an etcd client is given). */
  readonly endpoints: string[];
  readonly members: readonly EtcdMember[];
  /** The cluster's temp dir (data dirs and logs). */
  readonly dir: string;
  /**
   * Its `--initial-cluster-token`: a restore (`etcdctl snapshot restore`) with this token and the
   * same `--initial-cluster` gives the members, and so the cluster, the IDs they had.
   */
  readonly token: string;
  /**
   * Wait until every running, not-stopped member answers `/health` true. Throws (with the
   * members' log tails) after `timeoutMs` (default: the cluster's ready timeout).
   */
  waitHealthy(timeoutMs?: number): Promise<void>;
  /** kill -9 member `i` and wait until it has exited. No-op when it is already killed. */
  kill(i: number): Promise<void>;
  /**
   * Start killed member `i` again on its data dir and ports and wait until it is healthy.
   * Throws when it is still running, or when it does not become healthy in time.
   */
  restart(i: number): Promise<void>;
  /** SIGSTOP member `i` (it keeps its sockets; peers and clients see it hang). */
  pause(i: number): void;
  /** SIGCONT member `i`. */
  resume(i: number): void;
  /** Status of member `i` (throws when it does not answer within `timeoutMs`, default 2000). */
  status(i: number, timeoutMs?: number): Promise<EtcdMemberStatus>;
  /**
   * The index of the leader that the running, not-stopped members agree on (a majority of all
   * members must name the same one, and it must be one of them), polled until `timeoutMs`
   * (default: the ready timeout). `notIndex`: wait for a leader other than that member (after
   * killing or stopping it). Throws on timeout.
   */
  leader(opts?: { notIndex?: number; timeoutMs?: number }): Promise<number>;
  /** Kill every member by pid (SIGCONT first for stopped ones), remove the temp dir. Idempotent. */
  close(): Promise<void>;
}

interface MemberState {
  name: string;
  clientPort: number;
  peerPort: number;
  /** The plain listener `/health` is read on (with `tls`), else null. */
  healthUrl: string | null;
  clientUrl: string;
  peerUrl: string;
  dataDir: string;
  logPath: string;
  child: ChildProcess | null;
  pid: number | null;
  exited: Promise<void> | null;
  stopped: boolean;
}

const live = new Set<() => void>();
let exitHook = false;

/** A free loopback TCP port (bound then released; the caller retries when it loses a race). */
export function freePort(): Promise<number> {
  return new Promise((res, rej) => {
    const s = createServer();
    s.on('error', rej);
    s.listen(0, '127.0.0.1', () => {
      const a = s.address();
      const port = typeof a === 'object' && a !== null ? a.port : 0;
      s.close(() => (port > 0 ? res(port) : rej(new Error('no port'))));
    });
  });
}

function tail(path: string, lines = 25): string {
  try {
    return readFileSync(path, 'utf8').split('\n').slice(-lines).join('\n');
  } catch {
    return '(no log)';
  }
}


/**
 * Start an etcd cluster of `opts.members` (default 3) members on loopback and wait until every
 * member is healthy. Ports are probed free and the whole start is retried (up to 3 times, fresh
 * ports) when a member exits early, e.g. because another process took a probed port.
 * Throws when the binary is missing or the cluster is not healthy within the ready timeout (the
 * error carries the members' log tails); nothing is left running or on disk then.
 */
export async function startEtcdCluster(opts: EtcdClusterOptions = {}): Promise<EtcdCluster> {
  if (!haveEtcd()) throw new Error(`${ETCD_BIN} is not installed (Debian etcd-server)`);
  let lastErr: unknown;
  for (let attempt = 0; attempt < 3; attempt++) {
    const c = await tryStart(opts);
    try {
      await c.waitHealthy();
      return c;
    } catch (e) {
      lastErr = e;
      await c.close();
    }
  }
  throw lastErr;
}

async function tryStart(opts: EtcdClusterOptions): Promise<EtcdCluster> {
  const n = opts.members ?? 3;
  const heartbeat = opts.heartbeatMs ?? 50;
  const election = opts.electionMs ?? 500;
  const readyMs = opts.readyTimeoutMs ?? 30_000;
  const dir = mkdtempSync(join(tmpdir(), opts.prefix ?? 'ipwarden-etcdlab-'));
  const token = `ipwarden-${process.pid}-${dir.slice(-6)}`;
  const tls = opts.tls;
  const per = tls === undefined ? 2 : 3;
  const ports = new Set<number>();
  while (ports.size < per * n) ports.add(await freePort());
  const p = [...ports];
  const members: MemberState[] = [];
  for (let i = 0; i < n; i++) {
    const clientPort = p[per * i] ?? 0;
    const peerPort = p[per * i + 1] ?? 0;
    members.push({
      name: `m${i}`,
      clientPort,
      peerPort,
      healthUrl: tls === undefined ? null : `http://127.0.0.1:${p[per * i + 2] ?? 0}`,
      clientUrl: `${tls === undefined ? 'http' : 'https'}://127.0.0.1:${clientPort}`,
      peerUrl: `http://127.0.0.1:${peerPort}`,
      dataDir: join(dir, `m${i}.etcd`),
      logPath: join(dir, `m${i}.log`),
      child: null,
      pid: null,
      exited: null,
      stopped: false,
    });
  }
  const initialCluster = members.map((m) => `${m.name}=${m.peerUrl}`).join(',');

  const launch = (m: MemberState, state: 'new' | 'existing'): void => {
    const args = [
      '--name', m.name,
      '--data-dir', m.dataDir,
      '--listen-client-urls', m.clientUrl,
      '--advertise-client-urls', m.clientUrl,
      '--listen-peer-urls', m.peerUrl,
      '--initial-advertise-peer-urls', m.peerUrl,
      '--initial-cluster', initialCluster,
      '--initial-cluster-state', state,
      '--initial-cluster-token', token,
      '--heartbeat-interval', String(heartbeat),
      '--election-timeout', String(election),
      '--logger', 'zap',
      '--log-outputs', 'stderr',
      ...(tls === undefined ? [] : ['--cert-file', tls.cert, '--key-file', tls.key, '--trusted-ca-file', tls.ca, ...(tls.clientCertAuth === true ? ['--client-cert-auth'] : []), '--listen-metrics-urls', m.healthUrl as string]),
      ...(opts.extraArgs ?? []),
    ];
    const fd = openSync(m.logPath, 'a', 0o600);
    // setpriv --pdeathsig KILL: setpriv execs etcd in place (same pid), which dies with us.
    const child = spawn('/usr/bin/setpriv', ['--pdeathsig', 'KILL', '--', ETCD_BIN, ...args], {
      env: { PATH: '/usr/bin:/bin' },
      stdio: ['ignore', 'ignore', fd],
    });
    closeSync(fd);
    m.child = child;
    m.pid = child.pid ?? null;
    m.stopped = false;
    m.exited = new Promise((res) => child.once('exit', () => res()));
    child.once('exit', () => {
      if (m.child === child) {
        m.child = null;
        m.pid = null;
        m.stopped = false;
      }
    });
  };

  let closed = false;
  // At exit: the members dead (not just signalled) before their data dirs go — an rm -r racing
  // a dying etcd fails with ENOTEMPTY, and a listener that throws skips the others.
  const emergency = (): void => {
    for (const m of members) if (m.pid !== null) sigkillAndWaitSync(m.pid);
    try {
      rmSync(dir, { recursive: true, force: true, maxRetries: 3 });
    } catch {
      // keep going: the other clusters
    }
  };
  live.add(emergency);
  if (!exitHook) {
    exitHook = true;
    process.on('exit', () => {
      for (const f of live) f();
    });
  }

  const member = (i: number): MemberState => {
    const m = members[i];
    if (m === undefined) throw new RangeError(`no etcd member ${i} (cluster of ${members.length})`);
    return m;
  };

  const killedOnPurpose = new Set<MemberState>();
  const healthy = async (m: MemberState): Promise<boolean> => {
    try {
      const r = await fetch(`${m.healthUrl ?? m.clientUrl}/health`, { signal: AbortSignal.timeout(1000) });
      const body = (await r.json()) as { health?: unknown };
      return body.health === 'true' || body.health === true;
    } catch {
      return false;
    }
  };

  const logs = (): string => members.map((m) => `--- ${m.name} (${m.logPath}):\n${tail(m.logPath)}`).join('\n');

  const waitHealthy = async (timeoutMs = readyMs, only?: MemberState[]): Promise<void> => {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      if (closed) throw new Error('etcd cluster closed');
      const want = (only ?? members).filter((m) => m.pid !== null && !m.stopped);
      const dead = (only ?? members).filter((m) => m.pid === null && m.child === null && m.exited !== null && !killedOnPurpose.has(m));
      if (dead.length > 0) throw new Error(`etcd member ${dead.map((m) => m.name).join(',')} exited:\n${logs()}`);
      const ok = await Promise.all(want.map(healthy));
      if (ok.every(Boolean)) return;
      if (Date.now() > deadline) throw new Error(`etcd not healthy within ${timeoutMs} ms:\n${logs()}`);
      await sleep(50);
    }
  };

  const status = async (i: number, timeoutMs = 2000): Promise<EtcdMemberStatus> => {
    const m = member(i);
    if (tls !== undefined) throw new Error('status() and leader() are not available on a TLS cluster (they use the client URL\'s gateway)');
    const r = await fetch(`${m.clientUrl}/v3/maintenance/status`, {
      method: 'POST',
      body: '{}',
      headers: { 'content-type': 'application/json' },
      signal: AbortSignal.timeout(timeoutMs),
    });
    if (!r.ok) throw new Error(`etcd ${m.name} status: HTTP ${r.status}`);
    const b = (await r.json()) as { header?: { member_id?: string; raft_term?: string; revision?: string }; leader?: string; raftTerm?: string };
    const memberId = b.header?.member_id;
    if (typeof memberId !== 'string') throw new Error(`etcd ${m.name} status without header.member_id: ${JSON.stringify(b)}`);
    return { memberId, leaderId: b.leader ?? '0', raftTerm: b.raftTerm ?? b.header?.raft_term ?? '0', revision: b.header?.revision ?? '0' };
  };

  const ids = new Map<string, number>();
  const leader = async (o: { notIndex?: number; timeoutMs?: number } = {}): Promise<number> => {
    const deadline = Date.now() + (o.timeoutMs ?? readyMs);
    for (;;) {
      const votes = new Map<string, number>();
      await Promise.all(
        members.map(async (m, i) => {
          if (m.pid === null || m.stopped) return;
          try {
            const s = await status(i, 1000);
            ids.set(s.memberId, i);
            if (s.leaderId !== '0') votes.set(s.leaderId, (votes.get(s.leaderId) ?? 0) + 1);
          } catch {
            // not answering yet
          }
        }),
      );
      for (const [id, count] of votes) {
        const i = ids.get(id);
        const m = i === undefined ? undefined : members[i];
        if (i !== undefined && m !== undefined && count > members.length / 2 && m.pid !== null && !m.stopped && i !== o.notIndex) return i;
      }
      if (Date.now() > deadline) throw new Error(`no etcd leader agreed within ${o.timeoutMs ?? readyMs} ms (votes ${JSON.stringify([...votes])}):\n${logs()}`);
      await sleep(50);
    }
  };

  for (const m of members) launch(m, 'new');

  const cluster: EtcdCluster = {
    endpoints: members.map((m) => m.clientUrl),
    get members() {
      return members.map((m) => ({ name: m.name, clientUrl: m.clientUrl, peerUrl: m.peerUrl, dataDir: m.dataDir, logPath: m.logPath, pid: m.pid, stopped: m.stopped }));
    },
    dir,
    token,
    waitHealthy: (t) => waitHealthy(t),
    async kill(i) {
      const m = member(i);
      if (m.pid === null) return;
      killedOnPurpose.add(m);
      const exited = m.exited;
      try {
        process.kill(m.pid, 'SIGKILL');
      } catch {
        // exited on its own
      }
      await exited;
    },
    async restart(i) {
      const m = member(i);
      if (m.pid !== null) throw new Error(`etcd ${m.name} is still running (pid ${m.pid})`);
      killedOnPurpose.delete(m);
      launch(m, 'existing');
      await waitHealthy(readyMs, [m]);
    },
    pause(i) {
      const m = member(i);
      if (m.pid === null) throw new Error(`etcd ${m.name} is not running`);
      process.kill(m.pid, 'SIGSTOP');
      m.stopped = true;
    },
    resume(i) {
      const m = member(i);
      if (m.pid === null) throw new Error(`etcd ${m.name} is not running`);
      process.kill(m.pid, 'SIGCONT');
      m.stopped = false;
    },
    status,
    leader,
    async close() {
      if (closed) return;
      closed = true;
      const waits: Promise<void>[] = [];
      for (const m of members) {
        killedOnPurpose.add(m);
        if (m.pid !== null && m.exited !== null) {
          waits.push(m.exited);
          try {
            process.kill(m.pid, 'SIGKILL'); // SIGKILL also ends a stopped process
          } catch {
            // gone already
          }
        }
      }
      // Bounded: SIGKILL cannot be ignored; a pid that still lives after 10 s is reported.
      const ac = new AbortController();
      await Promise.race([Promise.all(waits), sleep(10_000, undefined, { signal: ac.signal }).catch(() => undefined)]);
      ac.abort();
      const stuck = members.filter((m) => m.pid !== null && alive(m.pid));
      live.delete(emergency);
      rmSync(dir, { recursive: true, force: true });
      if (stuck.length > 0) throw new Error(`etcd members did not exit: ${stuck.map((m) => `${m.name} pid ${m.pid}`).join(', ')}`);
    },
  };
  return cluster;
}
