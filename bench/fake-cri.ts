/**
 * A minimal CRI runtime.v1 server for benchmarks: answers Version and ListPodSandbox with a fixed
 * sandbox list over a unix socket, through real gRPC (grpc-js), so `ipwarden leaks` pays the same
 * connection and decoding cost as against containerd. Benchmarks only; tests use a real containerd.
 */
import * as grpc from '@grpc/grpc-js';
import { fromJSON, type ServiceDefinition } from '@grpc/proto-loader';
import protobuf from 'protobufjs';
import { CRI_PROTO } from '../src/runtime/generated/cri-proto.ts';

/** A running fake runtime; `close()` stops it. */
export interface FakeCri {
  readonly endpoint: string;
  close(): Promise<void>;
}

/** Serve `ids` as READY sandboxes on the unix socket `path`. */
export async function startFakeCri(path: string, ids: readonly string[]): Promise<FakeCri> {
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
  server.addService(service, {
    Version: (_c: unknown, cb: grpc.sendUnaryData<object>) =>
      cb(null, { version: '0.1.0', runtime_name: 'fake-cri', runtime_version: '0.0.1', runtime_api_version: 'v1' }),
    ListPodSandbox: (_c: unknown, cb: grpc.sendUnaryData<object>) => cb(null, { items }),
  });
  await new Promise<void>((resolve, reject) =>
    server.bindAsync(`unix://${path}`, grpc.ServerCredentials.createInsecure(), (e) => (e ? reject(e) : resolve())),
  );
  return {
    endpoint: `unix://${path}`,
    close: () => new Promise<void>((resolve) => server.tryShutdown(() => resolve())),
  };
}
