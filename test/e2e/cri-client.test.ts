// CriClient against a real containerd (the lab) plus the error cases against fake endpoints.
// The lab part needs root and Debian's containerd, runc and containernetworking-plugins: with
// CI=true their absence fails the suite, otherwise it is skipped with the reason.
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type Server as NetServer, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as grpc from '@grpc/grpc-js';
import { build } from 'esbuild';
import { AppError, ClosedError } from '../../src/common/errors.ts';
import { CriClient, grpcStatusOf } from '../../src/runtime/cri-client.ts';
import { labUnavailableReason, startLab, type Lab } from '../../src/lab/lab.ts';
import { isAlive } from '../../src/lab/proc.ts';

const unavailable = labUnavailableReason();
const ciMustRun = process.env['CI'] === 'true';
const repo = join(import.meta.dirname, '..', '..');

/** Asserts that `p` rejects with an AppError of `code`, exact `message` and `retryable`. */
async function rejectsWith(p: Promise<unknown>, code: string, message: string, retryable: boolean): Promise<void> {
  await assert.rejects(p, (e: unknown) => {
    assert.ok(e instanceof AppError, `not an AppError: ${String(e)}`);
    assert.equal(e.message, message);
    assert.equal(e.code, code);
    assert.equal(e.isRetryable, retryable);
    assert.ok(!e.message.includes('\n'));
    return true;
  });
}

describe('CriClient against a real containerd (lab, host-local IPAM)', { skip: ciMustRun ? false : (unavailable ?? false) }, () => {
  let lab: Lab | undefined;
  const ids: string[] = [];

  before(async () => {
    if (unavailable !== undefined) throw new Error(`CI=true but the e2e prerequisites are missing: ${unavailable}`);
    lab = await startLab({ ipam: 'host-local' });
  });
  after(async () => {
    await lab?.stop();
  });

  it('answers Version with runtime.v1', async () => {
    const v = await lab!.cri.version();
    assert.equal(v.runtimeName, 'containerd');
    assert.equal(v.runtimeApiVersion, 'v1');
    assert.deepEqual(lab!.cri.runtimeVersion, v);
  });

  it('lists 3 new sandboxes READY, with full ids equal to the CNI_CONTAINERID host-local wrote', async () => {
    for (let i = 0; i < 3; i++) ids.push(await lab!.runSandbox(`web${i}`));
    const list = await lab!.listSandboxes();
    assert.deepEqual(list.map((s) => s.id).sort(), [...ids].sort());
    for (const s of list) {
      assert.match(s.id, /^[0-9a-f]{64}$/);
      assert.equal(s.state, 'ready');
      assert.equal(s.namespace, 'ipwarden-lab');
      assert.equal(typeof s.createdAtNs, 'bigint');
      assert.ok(s.createdAtNs > 1_600_000_000_000_000_000n);
    }
    assert.deepEqual(list.map((s) => s.name).sort(), ['web0', 'web1', 'web2']);
    // The raw host-local files: <ip> holds "<id>\r\n<ifname>".
    const files = readdirSync(lab!.networkDir).filter((n) => /^\d+\.\d+\.\d+\.\d+$/.test(n));
    assert.equal(files.length, 3);
    const owners = files.map((f) => readFileSync(join(lab!.networkDir, f), 'utf8'));
    assert.deepEqual(owners.sort(), ids.map((id) => `${id}\r\neth0`).sort());
  });

  it('podSandboxStatus gives the pod IP host-local reserved', async () => {
    const id = ids[0]!;
    const st = await lab!.cri.podSandboxStatus(id);
    const mine = lab!.reservations().find((r) => r.id === id);
    assert.ok(mine);
    assert.equal(st.network.ip, mine.ip);
    assert.deepEqual(st.network.additionalIps, []);
    assert.equal(st.state, 'ready');
    assert.deepEqual(st.info, {});
    const verbose = await lab!.cri.podSandboxStatus(id, true);
    const info = JSON.parse(verbose.info['info'] ?? '{}') as { pid?: number };
    assert.ok(typeof info.pid === 'number' && info.pid > 0);
  });

  it('after StopPodSandbox the sandbox is NOTREADY, has no IP, and its reservation file is gone', async () => {
    const id = ids[1]!;
    const ip = lab!.reservations().find((r) => r.id === id)?.ip;
    assert.ok(ip);
    await lab!.cri.stopPodSandbox(id);
    const s = (await lab!.listSandboxes()).find((x) => x.id === id);
    assert.equal(s?.state, 'notready');
    assert.equal(existsSync(join(lab!.networkDir, ip)), false);
    assert.equal((await lab!.cri.podSandboxStatus(id)).network.ip, '');
    assert.deepEqual((await lab!.cri.listPodSandboxes({ state: 'notready' })).map((x) => x.id), [id]);
  });

  it('podSandboxStatus of an unknown id is RUNTIME_CALL_FAILED with gRPC NOT_FOUND', async () => {
    const bogus = 'f'.repeat(64);
    await assert.rejects(lab!.cri.podSandboxStatus(bogus), (e: unknown) => {
      assert.ok(e instanceof AppError);
      assert.equal(e.code, 'RUNTIME_CALL_FAILED');
      assert.equal(grpcStatusOf(e), grpc.status.NOT_FOUND);
      assert.ok(e.message.startsWith(`CRI RuntimeService/PodSandboxStatus at ${lab!.endpoint} failed: NOT_FOUND: `), e.message);
      return true;
    });
  });

  it('works from a single esbuild CommonJS bundle with no files beside it', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'ipwarden-bundle-'));
    try {
      const entry = join(dir, 'entry.ts');
      writeFileSync(
        entry,
        `import { CriClient } from ${JSON.stringify(join(repo, 'src/runtime/cri-client.ts'))};
async function main(): Promise<void> {
  const c = await CriClient.connect(process.argv[2]!);
  const l = await c.listPodSandboxes();
  c.close();
  process.stdout.write(JSON.stringify(l.map((s) => [s.id, s.state])));
}
void main();
`,
      );
      const outDir = join(dir, 'out');
      await build({ entryPoints: [entry], bundle: true, platform: 'node', format: 'cjs', target: 'node20', outfile: join(outDir, 'cri.cjs'), logLevel: 'silent' });
      assert.deepEqual(readdirSync(outDir), ['cri.cjs']);
      const r = spawnSync(process.execPath, [join(outDir, 'cri.cjs'), lab!.endpoint], { cwd: outDir, encoding: 'utf8', timeout: 30_000 });
      assert.equal(r.stderr, '');
      assert.equal(r.status, 0);
      const got = (JSON.parse(r.stdout) as [string, string][]).sort();
      const want = (await lab!.listSandboxes()).map((s) => [s.id, s.state]).sort();
      assert.deepEqual(got, want);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('close() is idempotent and later calls throw ClosedError', async () => {
    const c = await CriClient.connect(lab!.endpoint, { timeoutSeconds: 5 });
    c.close();
    c.close();
    assert.equal(c.closed, true);
    await assert.rejects(c.listPodSandboxes(), (e: unknown) => e instanceof ClosedError && e.message === 'CRI client is closed');
  });

  it('stop() removes sandboxes, containerd, mounts, bridge, result cache entries, cgroups and scratch', async () => {
    const l = lab!;
    const pid = l.containerdPid;
    assert.ok(isAlive(pid));
    await l.stop();
    await l.stop(); // idempotent
    assert.equal(isAlive(pid), false, 'containerd still running');
    const mounts = readFileSync('/proc/self/mountinfo', 'utf8').split('\n').filter((m) => m.includes(l.scratch));
    assert.deepEqual(mounts, []);
    assert.equal(existsSync(`/sys/class/net/${l.bridge}`), false, 'bridge left');
    const results = existsSync('/var/lib/cni/results') ? readdirSync('/var/lib/cni/results') : [];
    assert.deepEqual(results.filter((n) => n.startsWith(`${l.networkName}-`) || ids.some((id) => n.includes(id))), []);
    const cgroups = readdirSync('/sys/fs/cgroup').filter((h) => existsSync(join('/sys/fs/cgroup', h, l.cgroupParent)));
    assert.deepEqual(cgroups, []);
    const shimsOrPause = readdirSync('/proc')
      .filter((p) => /^\d+$/.test(p))
      .filter((p) => {
        try {
          return readFileSync(`/proc/${p}/cmdline`, 'utf8').includes(l.socketPath) || readFileSync(`/proc/${p}/cgroup`, 'utf8').includes(l.cgroupParent);
        } catch {
          return false;
        }
      });
    assert.deepEqual(shimsOrPause, []);
    assert.equal(existsSync(l.scratch), false, 'scratch dir left');
  });
});

describe('CriClient error conversion at real endpoints', () => {
  let dir = '';
  const servers: grpc.Server[] = [];
  let mute: NetServer | undefined;
  const muteSockets: Socket[] = [];

  before(() => {
    dir = mkdtempSync(join(tmpdir(), 'ipwarden-cri-err-'));
  });
  after(async () => {
    for (const s of servers) s.forceShutdown();
    for (const s of muteSockets) s.destroy();
    await new Promise<void>((r) => (mute ? mute.close(() => r()) : r()));
    rmSync(dir, { recursive: true, force: true });
  });

  async function serve(name: string, setup: (s: grpc.Server) => void): Promise<string> {
    const s = new grpc.Server();
    setup(s);
    servers.push(s);
    const url = `unix://${join(dir, name)}`;
    await new Promise<void>((res, rej) => s.bindAsync(url, grpc.ServerCredentials.createInsecure(), (e) => (e ? rej(e) : res())));
    return url;
  }

  it('socket does not exist → RUNTIME_UNAVAILABLE (retryable)', async () => {
    const url = `unix://${dir}/nope.sock`;
    await rejectsWith(CriClient.connect(url, { timeoutSeconds: 5 }), 'RUNTIME_UNAVAILABLE', `no CRI runtime at ${url}: socket does not exist`, true);
  });

  it('a bare path is accepted and reported as unix://', async () => {
    await rejectsWith(CriClient.connect(`${dir}/nope.sock`, { timeoutSeconds: 5 }), 'RUNTIME_UNAVAILABLE', `no CRI runtime at unix://${dir}/nope.sock: socket does not exist`, true);
  });

  it('path is a plain file → RUNTIME_UNAVAILABLE: not a unix socket', async () => {
    const p = join(dir, 'plain');
    writeFileSync(p, 'not a socket');
    await rejectsWith(CriClient.connect(p, { timeoutSeconds: 5 }), 'RUNTIME_UNAVAILABLE', `no CRI runtime at unix://${p}: not a unix socket`, true);
  });

  it('a gRPC server without RuntimeService → RUNTIME_NOT_CRI', async () => {
    const url = await serve('empty.sock', () => {});
    await rejectsWith(
      CriClient.connect(url, { timeoutSeconds: 5 }),
      'RUNTIME_NOT_CRI',
      `${url} is not a CRI runtime.v1 server: it does not implement /runtime.v1.RuntimeService/Version`,
      false,
    );
  });

  it('a runtime that speaks only runtime.v1alpha2 → RUNTIME_UNSUPPORTED_API', async () => {
    // VersionResponse fields: version=1, runtime_name=2, runtime_version=3, runtime_api_version=4 (all strings).
    const str = (n: number, s: string): Buffer => Buffer.concat([Buffer.from([(n << 3) | 2, Buffer.byteLength(s)]), Buffer.from(s)]);
    const answer = Buffer.concat([str(1, '0.1.0'), str(2, 'containerd'), str(3, '1.4.13'), str(4, 'v1alpha2')]);
    const url = await serve('old.sock', (s) =>
      s.addService(
        {
          Version: {
            path: '/runtime.v1alpha2.RuntimeService/Version',
            requestStream: false,
            responseStream: false,
            requestSerialize: (b: Buffer) => b,
            requestDeserialize: (b: Buffer) => b,
            responseSerialize: (b: Buffer) => b,
            responseDeserialize: (b: Buffer) => b,
          },
        },
        { Version: (_call: unknown, cb: grpc.sendUnaryData<Buffer>) => cb(null, answer) },
      ),
    );
    await rejectsWith(
      CriClient.connect(url, { timeoutSeconds: 5 }),
      'RUNTIME_UNSUPPORTED_API',
      `CRI runtime at ${url} (containerd 1.4.13) speaks only CRI v1alpha2; ipwarden needs runtime.v1`,
      false,
    );
  });

  it('a socket that accepts but never answers → deadline → RUNTIME_UNAVAILABLE (retryable)', async () => {
    const p = join(dir, 'mute.sock');
    mute = createServer((s) => muteSockets.push(s));
    await new Promise<void>((r) => mute!.listen(p, r));
    await rejectsWith(
      CriClient.connect(p, { timeoutSeconds: 0.3 }),
      'RUNTIME_UNAVAILABLE',
      `CRI runtime at unix://${p} did not answer RuntimeService/Version within 0.3s`,
      true,
    );
  });

  // Root bypasses file permissions (CAP_DAC_OVERRIDE), so a socket in a mode-000 dir does not
  // fail for root. The client therefore runs in a child that drops to uid/gid 65534 (nobody)
  // after loading the module; without root this case is covered by the unit test of
  // castGrpcError with a constructed EACCES error.
  it('a socket the caller may not open → RUNTIME_PERMISSION_DENIED', { skip: process.getuid?.() === 0 ? false : 'needs root to drop privileges' }, async () => {
    const locked = join(dir, 'locked');
    mkdirSync(locked);
    const url = await serve('locked/cri.sock', () => {});
    chmodSync(locked, 0o000);
    const script = `
      import { CriClient } from ${JSON.stringify(join(repo, 'src/runtime/cri-client.ts'))};
      process.setgid(65534); process.setuid(65534);
      CriClient.connect(${JSON.stringify(url)}, { timeoutSeconds: 5 }).then(
        () => console.log(JSON.stringify({ ok: true })),
        (e) => console.log(JSON.stringify({ code: e.code, message: e.message, retryable: e.isRetryable })),
      );`;
    const r = spawnSync(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], { cwd: repo, encoding: 'utf8', timeout: 30_000 });
    assert.equal(r.status, 0, r.stderr);
    assert.deepEqual(JSON.parse(r.stdout), {
      code: 'RUNTIME_PERMISSION_DENIED',
      message: `permission denied connecting to CRI runtime at ${url}: run as root or as a member of the socket's group`,
      retryable: false,
    });
  });
});
