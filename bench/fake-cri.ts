/**
 * A minimal CRI runtime.v1 server for benchmarks: answers Version, ListPodSandbox and
 * PodSandboxStatus with a fixed sandbox list over a unix socket, through real gRPC (grpc-js), so
 * `ipwarden leaks` pays the same connection and decoding cost as against containerd (one
 * ListPodSandbox, then one PodSandboxStatus per READY sandbox for the pod-IP check).
 * Used by benchmarks, and by test/blackbox/hardening.test.ts where the installed plugin needs a
 * runtime that answers ListPodSandbox (the reconciler's own tests use a real containerd).
 */
import * as grpc from '@grpc/grpc-js';
import { fromJSON, type ServiceDefinition } from '@grpc/proto-loader';
import protobuf from 'protobufjs';
import { CRI_PROTO } from '../src/runtime/generated/cri-proto.ts';

/** A running fake runtime; `close()` stops it once calls in flight are done, `forceClose()` at once. */
export interface FakeCri {
  readonly endpoint: string;
  close(): Promise<void>;
  forceClose(): void;
}

/**
 * The default pod IP of the sandbox at `index` of the list: `10.9.<(index+1) >> 8>.<(index+1) & 255>`,
 * i.e. the address bench/run.ts reserves for container ID `(index+1)` in hex, so every bench
 * sandbox's address is reserved for it ("fine" in the check).
 */
export function benchPodIP(index: number): string {
  const n = index + 1;
  return `10.9.${(n >> 8) & 255}.${n & 255}`;
}

/**
 * Serve `ids` as READY sandboxes on the unix socket `path`; PodSandboxStatus of `ids[i]` reports
 * pod IP `podIP(i)` (default {@link benchPodIP}); an unknown ID gets gRPC NOT_FOUND, as containerd.
 */
export async function startFakeCri(path: string, ids: readonly string[], podIP: (index: number) => string = benchPodIP): Promise<FakeCri> {
  const root = protobuf.parse(CRI_PROTO, { keepCase: true }).root;
  const pkg = fromJSON(root.toJSON(), { keepCase: true, longs: String, enums: String, defaults: true });
  const service = pkg['runtime.v1.RuntimeService'] as ServiceDefinition;
  const server = new grpc.Server();
  const items = ids.map((id, i) => ({
    id,
    metadata: { name: `pod-${i}`, uid: `uid-${i}`, namespace: 'bench', attempt: 0 },
    state: 'SANDBOX_READY',
    created_at: '1700000000000000000',
    labels: {},
    annotations: {},
    runtime_handler: '',
  }));
  const byId = new Map(items.map((it, i) => [it.id, { it, ip: podIP(i) }]));
  server.addService(service, {
    Version: (_c: unknown, cb: grpc.sendUnaryData<object>) =>
      cb(null, { version: '0.1.0', runtime_name: 'fake-cri', runtime_version: '0.0.1', runtime_api_version: 'v1' }),
    ListPodSandbox: (_c: unknown, cb: grpc.sendUnaryData<object>) => cb(null, { items }),
    PodSandboxStatus: (call: grpc.ServerUnaryCall<{ pod_sandbox_id: string }, object>, cb: grpc.sendUnaryData<object>) => {
      const s = byId.get(call.request.pod_sandbox_id);
      if (s === undefined) {
        cb({ code: grpc.status.NOT_FOUND, details: `an error occurred when try to find sandbox: not found` });
        return;
      }
      const { it, ip } = s;
      cb(null, {
        status: {
          id: it.id,
          metadata: it.metadata,
          state: it.state,
          created_at: it.created_at,
          network: { ip, additional_ips: [] },
          labels: {},
          annotations: {},
          runtime_handler: '',
        },
        info: {},
      });
    },
  });
  await new Promise<void>((resolve, reject) =>
    server.bindAsync(`unix://${path}`, grpc.ServerCredentials.createInsecure(), (e) => (e ? reject(e) : resolve())),
  );
  return {
    endpoint: `unix://${path}`,
    close: () => new Promise<void>((resolve) => server.tryShutdown(() => resolve())),
    forceClose: () => server.forceShutdown(),
  };
}
