/**
 * A hostile fake CRI runtime for black-box tests: a real grpc-js server on a unix socket (the
 * plugin and the CLI reach it through their own CRI client), whose answers are chosen by the test:
 *
 * - `ListPodSandbox`: a given list (empty, short 12-character IDs, or anything), or a failure;
 * - `PodSandboxStatus` per sandbox: the pod IPs, a gRPC failure (UNAVAILABLE, NOT_FOUND, …), or a
 *   hang of N seconds (then the answer, unless the client gave up first: the call is "abandoned");
 * - `kind: 'not-cri'`: a gRPC server that serves something else and no `runtime.v1` at all, so
 *   every CRI method (Version included) answers UNIMPLEMENTED.
 *
 * The server counts what it saw (`stats`): calls per method, PodSandboxStatus calls in flight and
 * the most at once, answered, failed and abandoned ones, and the IDs asked, so tests assert on
 * deterministic signals instead of wall time. It runs in the test process: run the plugin with
 * an asynchronous spawn (a synchronous one blocks the event loop that serves the socket).
 * `close()` cancels pending hangs and stops the server (idempotent).
 */
import * as grpc from '@grpc/grpc-js';
import { fromJSON, type ServiceDefinition } from '@grpc/proto-loader';
import protobuf from 'protobufjs';
import { CRI_PROTO } from '../../src/runtime/generated/cri-proto.ts';

/** What PodSandboxStatus does for one sandbox. */
export type StatusBehaviour =
  | { readonly kind: 'answer' }
  | { readonly kind: 'fail'; readonly code: 'UNAVAILABLE' | 'NOT_FOUND' | 'UNKNOWN' | 'INTERNAL'; readonly details: string }
  /** Answer after `seconds` (the IPs), unless the client cancels first (counted as abandoned). */
  | { readonly kind: 'hang'; readonly seconds: number };

/** One sandbox the fake lists. */
export interface FakeSandbox {
  readonly id: string;
  /** Default `ready`. */
  readonly state?: 'ready' | 'notready';
  /** Pod IPs PodSandboxStatus reports (first = `network.ip`, rest = `additional_ips`); default none. */
  readonly ips?: readonly string[];
  /** Default `{ kind: 'answer' }`. */
  readonly status?: StatusBehaviour;
}

/** Options of {@link startHostileCri}. */
export interface HostileCriOptions {
  /** Unix socket path (keep it short: 107 bytes at most). */
  readonly path: string;
  /** `cri` (default) or `not-cri` (no runtime.v1 service: UNIMPLEMENTED for every CRI call). */
  readonly kind?: 'cri' | 'not-cri';
  /** The list ListPodSandbox answers (default empty). Replace later with `setSandboxes`. */
  readonly sandboxes?: readonly FakeSandbox[];
  /** When set, ListPodSandbox fails with this gRPC status and details. */
  readonly listFails?: { readonly code: 'UNAVAILABLE' | 'UNKNOWN' | 'INTERNAL'; readonly details: string };
  /**
   * PodSandboxStatus of an ID that is not listed: `not-found` (default, as containerd) or the
   * behaviour given (e.g. short IDs a runtime cannot resolve).
   */
  readonly unknownStatus?: StatusBehaviour;
}

/** What the server saw. Plain numbers, read at any time. */
export interface HostileStats {
  version: number;
  list: number;
  /** PodSandboxStatus calls received. */
  status: number;
  statusAnswered: number;
  statusFailed: number;
  /** Calls the client cancelled (deadline, closed channel, exited process) before they were answered. */
  statusAbandoned: number;
  /** PodSandboxStatus calls received and not yet answered nor cancelled. */
  statusInFlight: number;
  /** The most PodSandboxStatus calls in flight at once. */
  statusMaxInFlight: number;
  /** The IDs PodSandboxStatus was asked for, in arrival order. */
  statusIds: string[];
}

/** A running fake. */
export interface HostileCri {
  /** `unix://<path>`. */
  readonly endpoint: string;
  readonly path: string;
  readonly stats: HostileStats;
  /** Change what ListPodSandbox (and PodSandboxStatus) answer from now on. */
  setSandboxes(list: readonly FakeSandbox[]): void;
  /** Resolves once no PodSandboxStatus call is in flight (polls every 10 ms; rejects after `maxMs`). */
  idle(maxMs?: number): Promise<void>;
  close(): Promise<void>;
}

let cachedService: ServiceDefinition | null = null;

function criService(): ServiceDefinition {
  if (cachedService === null) {
    const root = protobuf.parse(CRI_PROTO, { keepCase: true }).root;
    const pkg = fromJSON(root.toJSON(), { keepCase: true, longs: String, enums: String, defaults: true });
    cachedService = pkg['runtime.v1.RuntimeService'] as ServiceDefinition;
  }
  return cachedService;
}

/** A service that is not CRI (a made-up health check), so the server is a real gRPC server of something else. */
const OTHER_SERVICE: grpc.ServiceDefinition = {
  Check: {
    path: '/i7.NotCri/Check',
    requestStream: false,
    responseStream: false,
    requestSerialize: (b: Buffer) => b,
    requestDeserialize: (b: Buffer) => b,
    responseSerialize: (b: Buffer) => b,
    responseDeserialize: (b: Buffer) => b,
  },
};

type Callback = grpc.sendUnaryData<object>;

/** Start a hostile fake CRI on `opts.path`. */
export async function startHostileCri(opts: HostileCriOptions): Promise<HostileCri> {
  const stats: HostileStats = {
    version: 0,
    list: 0,
    status: 0,
    statusAnswered: 0,
    statusFailed: 0,
    statusAbandoned: 0,
    statusInFlight: 0,
    statusMaxInFlight: 0,
    statusIds: [],
  };
  let sandboxes: readonly FakeSandbox[] = opts.sandboxes ?? [];
  const timers = new Set<ReturnType<typeof setTimeout>>();
  const server = new grpc.Server();

  const meta = (id: string) => ({ name: `pod-${id.slice(0, 8)}`, uid: `uid-${id.slice(0, 8)}`, namespace: 'i7', attempt: 0 });
  const stateName = (s: FakeSandbox) => ((s.state ?? 'ready') === 'ready' ? 'SANDBOX_READY' : 'SANDBOX_NOTREADY');

  if ((opts.kind ?? 'cri') === 'not-cri') {
    server.addService(OTHER_SERVICE, { Check: (_c: unknown, cb: grpc.sendUnaryData<Buffer>) => cb(null, Buffer.alloc(0)) });
  } else {
    server.addService(criService(), {
      Version: (_c: unknown, cb: Callback) => {
        stats.version++;
        cb(null, { version: '0.1.0', runtime_name: 'i7-hostile', runtime_version: '0.0.1', runtime_api_version: 'v1' });
      },
      ListPodSandbox: (_c: unknown, cb: Callback) => {
        stats.list++;
        if (opts.listFails !== undefined) {
          cb({ code: grpc.status[opts.listFails.code], details: opts.listFails.details });
          return;
        }
        cb(null, {
          items: sandboxes.map((s) => ({
            id: s.id,
            metadata: meta(s.id),
            state: stateName(s),
            created_at: '1700000000000000000',
            labels: {},
            annotations: {},
            runtime_handler: '',
          })),
        });
      },
      PodSandboxStatus: (call: grpc.ServerUnaryCall<{ pod_sandbox_id: string }, object>, cb: Callback) => {
        const id = call.request.pod_sandbox_id;
        stats.status++;
        stats.statusIds.push(id);
        stats.statusInFlight++;
        stats.statusMaxInFlight = Math.max(stats.statusMaxInFlight, stats.statusInFlight);
        let done = false;
        const finish = (): boolean => {
          if (done) return false;
          done = true;
          stats.statusInFlight--;
          return true;
        };
        const s = sandboxes.find((x) => x.id === id);
        const behaviour: StatusBehaviour =
          s === undefined ? (opts.unknownStatus ?? { kind: 'fail', code: 'NOT_FOUND', details: `an error occurred when try to find sandbox ${id}: not found` }) : (s.status ?? { kind: 'answer' });
        const answer = (): void => {
          if (!finish()) return;
          if (s === undefined) {
            stats.statusFailed++;
            cb({ code: grpc.status.NOT_FOUND, details: `an error occurred when try to find sandbox ${id}: not found` });
            return;
          }
          stats.statusAnswered++;
          const ips = s.ips ?? [];
          cb(null, {
            status: {
              id: s.id,
              metadata: meta(s.id),
              state: stateName(s),
              created_at: '1700000000000000000',
              network: { ip: ips[0] ?? '', additional_ips: ips.slice(1).map((ip) => ({ ip })) },
              labels: {},
              annotations: {},
              runtime_handler: '',
            },
            info: {},
          });
        };
        if (behaviour.kind === 'answer') {
          answer();
          return;
        }
        if (behaviour.kind === 'fail') {
          finish();
          stats.statusFailed++;
          cb({ code: grpc.status[behaviour.code], details: behaviour.details });
          return;
        }
        const t = setTimeout(() => {
          timers.delete(t);
          answer();
        }, behaviour.seconds * 1000);
        timers.add(t);
        call.on('cancelled', () => {
          clearTimeout(t);
          timers.delete(t);
          if (finish()) stats.statusAbandoned++;
        });
      },
    });
  }
  const endpoint = `unix://${opts.path}`;
  await new Promise<void>((resolve, reject) => server.bindAsync(endpoint, grpc.ServerCredentials.createInsecure(), (e) => (e ? reject(e) : resolve())));
  let closed = false;
  return {
    endpoint,
    path: opts.path,
    stats,
    setSandboxes: (list) => {
      sandboxes = list;
    },
    idle: async (maxMs = 60_000) => {
      for (let waited = 0; stats.statusInFlight > 0; waited += 10) {
        if (waited > maxMs) throw new Error(`${stats.statusInFlight} PodSandboxStatus calls still in flight after ${maxMs} ms`);
        await new Promise((r) => setTimeout(r, 10));
      }
    },
    close: async () => {
      if (closed) return;
      closed = true;
      for (const t of timers) clearTimeout(t);
      timers.clear();
      server.forceShutdown();
    },
  };
}
