// castGrpcError: every gRPC failure of a CRI call becomes one AppError with a one-line message.
// Also checks that the embedded proto text (generated/cri-proto.ts) matches src/runtime/cri.proto.
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import * as grpc from '@grpc/grpc-js';
import { AppError } from '../../src/common/errors.ts';
import { castGrpcError, grpcStatusOf, type CallContext } from '../../src/runtime/cri-client.ts';

const EP = 'unix:///run/x.sock';
const ctx: CallContext = { endpoint: EP, method: 'ListPodSandbox', timeoutSeconds: 10 };

interface Case {
  name: string;
  code: number;
  details: string;
  pathKind?: CallContext['pathKind'];
  want: { code: string; message: string; retryable: boolean };
}

const cases: Case[] = [
  {
    name: 'connect ENOENT',
    code: grpc.status.UNAVAILABLE,
    details: 'No connection established. Last error: Error: connect ENOENT /run/x.sock. Resolution note: ',
    want: { code: 'RUNTIME_UNAVAILABLE', message: `no CRI runtime at ${EP}: socket does not exist`, retryable: true },
  },
  {
    name: 'connect EACCES',
    code: grpc.status.UNAVAILABLE,
    details: 'No connection established. Last error: Error: connect EACCES /run/x.sock. Resolution note: ',
    want: { code: 'RUNTIME_PERMISSION_DENIED', message: `permission denied connecting to CRI runtime at ${EP}: run as root or as a member of the socket's group`, retryable: false },
  },
  {
    name: 'connect ECONNREFUSED on a socket',
    code: grpc.status.UNAVAILABLE,
    details: 'No connection established. Last error: Error: connect ECONNREFUSED /run/x.sock. Resolution note: ',
    pathKind: 'socket',
    want: { code: 'RUNTIME_UNAVAILABLE', message: `no CRI runtime at ${EP}: connection refused (is the runtime running?)`, retryable: true },
  },
  {
    name: 'connect ECONNREFUSED on a plain file',
    code: grpc.status.UNAVAILABLE,
    details: 'No connection established. Last error: Error: connect ECONNREFUSED /run/x.sock. Resolution note: ',
    pathKind: 'other',
    want: { code: 'RUNTIME_UNAVAILABLE', message: `no CRI runtime at ${EP}: not a unix socket`, retryable: true },
  },
  {
    name: 'connection dropped (multi-line details become one line)',
    code: grpc.status.UNAVAILABLE,
    details: 'Connection dropped\n  while reading',
    want: { code: 'RUNTIME_UNAVAILABLE', message: `CRI runtime at ${EP} is unavailable: Connection dropped while reading`, retryable: true },
  },
  {
    name: 'something listens but does not speak HTTP/2 (grpc-js: Protocol error)',
    code: grpc.status.UNAVAILABLE,
    details: 'No connection established. Last error: Protocol error (2026-12-06T18:00:00.000Z)',
    pathKind: 'socket',
    // Not RUNTIME_NOT_CRI: the recovery of a wiped directory must refuse (code 11), not go on as if no runtime ran here.
    want: {
      code: 'RUNTIME_UNAVAILABLE',
      message: `CRI runtime at ${EP} is unavailable: it answers, but not as a gRPC server (is it the runtime's CRI socket?): No connection established. Last error: Protocol error (2026-12-06T18:00:00.000Z)`,
      retryable: true,
    },
  },
  {
    name: 'deadline exceeded',
    code: grpc.status.DEADLINE_EXCEEDED,
    details: 'Deadline exceeded after 10.001s,LB pick: 0.001s,remote_addr=/run/x.sock',
    want: { code: 'RUNTIME_UNAVAILABLE', message: `CRI runtime at ${EP} did not answer RuntimeService/ListPodSandbox within 10s`, retryable: true },
  },
  {
    name: 'server says PERMISSION_DENIED',
    code: grpc.status.PERMISSION_DENIED,
    details: 'not allowed',
    want: { code: 'RUNTIME_PERMISSION_DENIED', message: `CRI runtime at ${EP} refused RuntimeService/ListPodSandbox: not allowed`, retryable: false },
  },
  {
    name: 'UNIMPLEMENTED',
    code: grpc.status.UNIMPLEMENTED,
    details: 'unknown service runtime.v1.RuntimeService',
    want: { code: 'RUNTIME_NOT_CRI', message: `${EP} is not a CRI runtime.v1 server: it does not implement /runtime.v1.RuntimeService/ListPodSandbox`, retryable: false },
  },
  {
    name: 'NOT_FOUND',
    code: grpc.status.NOT_FOUND,
    details: 'an error occurred when try to find sandbox "x": not found',
    want: { code: 'RUNTIME_CALL_FAILED', message: `CRI RuntimeService/ListPodSandbox at ${EP} failed: NOT_FOUND: an error occurred when try to find sandbox "x": not found`, retryable: false },
  },
  {
    name: 'UNKNOWN (e.g. range exhausted during RunPodSandbox)',
    code: grpc.status.UNKNOWN,
    details: 'failed to setup network for sandbox "abc": plugin type="bridge" failed (add): failed to allocate for range 0: no IP addresses available in range set: 10.244.9.1-10.244.9.14',
    want: {
      code: 'RUNTIME_CALL_FAILED',
      message: `CRI RuntimeService/ListPodSandbox at ${EP} failed: UNKNOWN: failed to setup network for sandbox "abc": plugin type="bridge" failed (add): failed to allocate for range 0: no IP addresses available in range set: 10.244.9.1-10.244.9.14`,
      retryable: false,
    },
  },
];

describe('castGrpcError', () => {
  cases.forEach((c) => {
    it(c.name, () => {
      const err = Object.assign(new Error(`${c.code} ${grpc.status[c.code]}: ${c.details}`), { code: c.code, details: c.details, metadata: new grpc.Metadata() });
      const got = castGrpcError(err, { ...ctx, ...(c.pathKind ? { pathKind: c.pathKind } : {}) });
      assert.ok(got instanceof AppError);
      assert.deepEqual({ code: got.code, message: got.message, retryable: got.isRetryable }, c.want);
      // Printed as "message (details)" by the CLI: never the same text twice.
      if (got.details !== undefined) assert.equal(got.message.includes(got.details), false, got.details);
      assert.equal(got.cause, err);
      assert.equal(grpcStatusOf(got), c.code);
    });
  });

  it('wraps a non-gRPC error as RUNTIME_CALL_FAILED and passes an AppError through', () => {
    const got = castGrpcError(new Error('boom\nsecond line'), ctx);
    assert.equal(got.code, 'RUNTIME_CALL_FAILED');
    assert.equal(got.message, `CRI RuntimeService/ListPodSandbox at ${EP} failed: boom second line`);
    const app = new AppError('INTERNAL', 'x');
    assert.equal(castGrpcError(app, ctx), app);
  });
});

describe('generated/cri-proto.ts', () => {
  it('is up to date with src/runtime/cri.proto', () => {
    const root = join(import.meta.dirname, '..', '..');
    const r = spawnSync(process.execPath, [join(root, 'scripts/gen-cri-proto.mjs'), '--check'], { encoding: 'utf8' });
    assert.equal(r.stderr, '');
    assert.equal(r.status, 0);
  });
});
