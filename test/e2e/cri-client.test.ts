// CriClient against a real containerd (the lab): sandbox and container calls, and the lab's PodCri on top of it; plus the error cases against fake endpoints.
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
import { CriClient, grpcStatusOf, type ContainerConfig, type SandboxConfig } from '../../src/runtime/cri-client.ts';
import { PAUSE_IMAGE } from '../../src/lab/image.ts';
import { labUnavailableReason, startLab, type Lab } from '../../src/lab/lab.ts';
import { PodCri, type PodSandboxSpec } from '../../src/lab/pod-cri.ts';
import { isAlive } from '../../src/lab/proc.ts';

const unavailable = labUnavailableReason();
const ciMustRun = process.env['CI'] === 'true';
const repo = join(import.meta.dirname, '..', '..');

/** Asserts that `p` rejects with an AppError of `code`, exact `message` and `retryable`. */
/** A container of the lab's pause image (exits 0 on SIGTERM), with what the kubelet would fill. */
function pauseContainer(name: string, namespaces: ContainerConfig['security']['namespaces']): ContainerConfig {
  return {
    name,
    image: PAUSE_IMAGE,
    command: [],
    args: [],
    env: [{ key: 'IPWARDEN_TEST', value: name }],
    mounts: [],
    logPath: `${name}/0.log`,
    labels: { 'ipwarden-test': name },
    security: { addCapabilities: [], dropCapabilities: [], readonlyRootfs: true, noNewPrivs: true, namespaces },
    resources: { cpuPeriod: 0, cpuQuota: 0, cpuShares: 2, memoryLimitBytes: 0 },
  };
}

/** Asserts that `p` rejects with RUNTIME_CALL_FAILED, gRPC NOT_FOUND, and a message starting `CRI RuntimeService/<method> at <endpoint> failed: NOT_FOUND: `. */
async function rejectsNotFound(p: Promise<unknown>, method: string, endpoint: string): Promise<void> {
  await assert.rejects(p, (e: unknown) => {
    assert.ok(e instanceof AppError, `not an AppError: ${String(e)}`);
    assert.equal(e.code, 'RUNTIME_CALL_FAILED');
    assert.equal(e.isRetryable, false);
    assert.equal(grpcStatusOf(e), grpc.status.NOT_FOUND);
    assert.ok(e.message.startsWith(`CRI RuntimeService/${method} at ${endpoint} failed: NOT_FOUND: `), e.message);
    return true;
  });
}

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

  describe('containers (CreateContainer, StartContainer, ListContainers, ContainerStatus, StopContainer, RemoveContainer)', () => {
    const ns = { network: 'POD', pid: 'NODE', ipc: 'POD' } as const;
    let sandbox: SandboxConfig;
    let sandboxId = '';
    let first = '';

    before(async () => {
      const l = lab!;
      const logDirectory = join(l.scratch, 'cri-client-test-logs');
      mkdirSync(logDirectory);
      sandbox = {
        name: 'ctr',
        uid: `${l.tag}-ctr`,
        namespace: 'ipwarden-lab',
        labels: { 'ipwarden-lab': l.tag },
        cgroupParent: l.cgroupParent,
        logDirectory,
        namespaces: ns,
        portMappings: [{ containerPort: 8080, hostPort: 18080 }],
      };
      sandboxId = await l.cri.runPodSandbox(sandbox);
    });

    it("the sandbox's namespace options and port mappings reach the runtime (pid NODE: no pid namespace in its spec)", async () => {
      const st = await lab!.cri.podSandboxStatus(sandboxId, true);
      const info = JSON.parse(st.info['info'] ?? '{}') as {
        runtimeSpec: { linux: { namespaces: { type: string }[] } };
        config: { hostname?: string; port_mappings: unknown[]; linux: { security_context: { namespace_options: Record<string, number> } } };
      };
      assert.deepEqual(info.runtimeSpec.linux.namespaces.map((n) => n.type).sort(), ['ipc', 'mount', 'network', 'uts']);
      assert.deepEqual(info.config.linux.security_context.namespace_options, { pid: 2 });
      assert.deepEqual(info.config.port_mappings, [{ container_port: 8080, host_port: 18080 }]);
      assert.equal(info.config.hostname, 'ctr', 'hostname defaults to the pod name');
    });

    it('CreateContainer → created; StartContainer → running, its log file in the sandbox log directory; ListContainers by sandbox, state and label', async () => {
      const cri = lab!.cri;
      first = await cri.createContainer(sandboxId, pauseContainer('c1', ns), sandbox);
      assert.match(first, /^[0-9a-f]{64}$/);
      const created = await cri.containerStatus(first);
      assert.equal(created.state, 'created');
      assert.equal(created.startedAtNs, 0n);
      await cri.startContainer(first);
      const st = await cri.containerStatus(first);
      assert.equal(st.id, first);
      assert.equal(st.name, 'c1');
      assert.equal(st.attempt, 0);
      assert.equal(st.state, 'running');
      assert.equal(st.exitCode, 0);
      assert.equal(st.reason, '');
      assert.equal(st.image, PAUSE_IMAGE);
      assert.match(st.imageRef, /^sha256:[0-9a-f]{64}$/);
      assert.equal(st.logPath, join(sandbox.logDirectory!, 'c1/0.log'));
      assert.ok(existsSync(st.logPath), 'log file created');
      assert.deepEqual(st.labels, { 'ipwarden-test': 'c1' });
      assert.ok(st.createdAtNs > 1_600_000_000_000_000_000n && st.startedAtNs >= st.createdAtNs);
      assert.equal(st.finishedAtNs, 0n);

      const bySandbox = await cri.listContainers({ sandboxId });
      assert.deepEqual(
        bySandbox.map((c) => ({ id: c.id, sandboxId: c.sandboxId, name: c.name, image: c.image, imageRef: c.imageRef, state: c.state, labels: c.labels })),
        [{ id: first, sandboxId, name: 'c1', image: PAUSE_IMAGE, imageRef: st.imageRef, state: 'running', labels: { 'ipwarden-test': 'c1' } }],
      );
      assert.equal(bySandbox[0]?.createdAtNs, st.createdAtNs);
      assert.deepEqual((await cri.listContainers()).map((c) => c.id), [first]);
      assert.deepEqual((await cri.listContainers({ state: 'running' })).map((c) => c.id), [first]);
      assert.deepEqual(await cri.listContainers({ state: 'exited' }), []);
      assert.deepEqual((await cri.listContainers({ labelSelector: { 'ipwarden-test': 'c1' } })).map((c) => c.id), [first]);
      assert.deepEqual(await cri.listContainers({ labelSelector: { 'ipwarden-test': 'other' } }), []);
      assert.deepEqual((await cri.listContainers({ id: first })).map((c) => c.id), [first]);
    });

    it('StopContainer with a grace period: SIGTERM, exit 0 (Completed); with 0: SIGKILL, exit 137 (Error); a second stop is no error', async () => {
      const cri = lab!.cri;
      await cri.stopContainer(first, 5);
      const st = await cri.containerStatus(first);
      assert.deepEqual([st.state, st.exitCode, st.reason], ['exited', 0, 'Completed']);
      assert.ok(st.finishedAtNs >= st.startedAtNs && st.startedAtNs > 0n);
      await cri.stopContainer(first, 5);

      const second = await cri.createContainer(sandboxId, pauseContainer('c2', ns), sandbox);
      await cri.startContainer(second);
      await cri.stopContainer(second, 0);
      const killed = await cri.containerStatus(second);
      assert.deepEqual([killed.state, killed.exitCode, killed.reason], ['exited', 137, 'Error']);
      assert.deepEqual((await cri.listContainers({ state: 'exited' })).map((c) => c.id).sort(), [first, second].sort());
      await cri.removeContainer(second);
    });

    it('RemoveContainer: gone from ListContainers, ContainerStatus then NOT_FOUND; a second remove is no error', async () => {
      const cri = lab!.cri;
      await cri.removeContainer(first);
      assert.deepEqual(await cri.listContainers({ sandboxId }), []);
      await rejectsNotFound(cri.containerStatus(first), 'ContainerStatus', lab!.endpoint);
      await cri.removeContainer(first);
    });

    it('unknown ids: CreateContainer in an unknown sandbox, StartContainer of an unknown container → RUNTIME_CALL_FAILED with gRPC NOT_FOUND', async () => {
      const cri = lab!.cri;
      const bogus = 'f'.repeat(64);
      await rejectsNotFound(cri.createContainer(bogus, pauseContainer('c3', ns), sandbox), 'CreateContainer', lab!.endpoint);
      await rejectsNotFound(cri.startContainer(bogus), 'StartContainer', lab!.endpoint);
      await rejectsNotFound(cri.containerStatus(bogus), 'ContainerStatus', lab!.endpoint);
    });

    it("PodCri (the lab's kubelet) runs a host-network pod with a container through the same client, then closes", async () => {
      const l = lab!;
      const pods = PodCri.open(l.endpoint);
      const hostNs = { network: 'NODE', pid: 'NODE', ipc: 'POD' } as const;
      const spec: PodSandboxSpec = {
        name: 'hostpod',
        uid: `${l.tag}-hostpod`,
        namespace: 'ipwarden-lab',
        labels: { 'ipwarden-lab': l.tag },
        logDirectory: sandbox.logDirectory!,
        cgroupParent: l.cgroupParent,
        namespaces: hostNs,
      };
      try {
        const id = await pods.runPodSandbox(spec);
        const info = JSON.parse((await l.cri.podSandboxStatus(id, true)).info['info'] ?? '{}') as { config: { hostname?: string }; runtimeSpec: { linux: { namespaces: { type: string }[] } } };
        assert.equal(info.config.hostname ?? '', '', "PodCri's hostname defaults to '' (the node's)");
        assert.ok(!info.runtimeSpec.linux.namespaces.some((n) => n.type === 'network'), 'host network');
        const cid = await pods.createContainer(id, spec, pauseContainer('h1', hostNs));
        await pods.startContainer(cid);
        assert.equal((await pods.containerStatus(cid)).state, 'running');
        await pods.stopContainer(cid, 5);
        assert.deepEqual([(await pods.containerStatus(cid)).exitCode, (await pods.containerStatus(cid)).reason], [0, 'Completed']);
        await pods.removeContainer(cid);
        await pods.stopPodSandbox(id);
        await pods.removePodSandbox(id);
        assert.ok(!(await l.listSandboxes()).some((s) => s.id === id));
      } finally {
        pods.close();
        pods.close();
      }
      await assert.rejects(pods.containerStatus('x'), (e: unknown) => e instanceof ClosedError && e.message === 'lab pod CRI client is closed');
    });

    after(async () => {
      if (sandboxId !== '') await lab?.stopAndRemove(sandboxId);
    });
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

  it("PodCri connects on its first call: a missing socket fails that call (and the next, which tries again) with the client's error; close() then gives ClosedError", async () => {
    const url = `unix://${dir}/nope-pods.sock`;
    const pods = PodCri.open(url, 5);
    const msg = `no CRI runtime at ${url}: socket does not exist`;
    await rejectsWith(pods.stopPodSandbox('x'), 'RUNTIME_UNAVAILABLE', msg, true);
    await rejectsWith(pods.containerStatus('x'), 'RUNTIME_UNAVAILABLE', msg, true);
    pods.close();
    await assert.rejects(pods.startContainer('x'), (e: unknown) => e instanceof ClosedError && e.message === 'lab pod CRI client is closed');
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
