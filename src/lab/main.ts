/**
 * `npm run lab` (root): the README's demo on a real containerd.
 *
 *  1. install containerd, runc and containernetworking-plugins with apt-get when missing, and
 *     tear down labs left behind by earlier runs that crashed;
 *  2. start a lab (/28, 13 usable addresses), run 3 pods, show ListPodSandbox next to the
 *     host-local files;
 *  3. lose the runtime's sandbox records (leak scenario b2) → 3 orphaned reservations;
 *  4. run pods until the range is exhausted and print the runtime's exact error;
 *  5. heal with `ipwarden gc` (bin/ipwarden, the built bundle) and run one more pod.
 *
 * Options: `--ipam ipwarden` uses bin/ipwarden as the IPAM plugin instead of host-local;
 * `--keep` leaves the lab running until Ctrl-C.
 * Exit status 0 when every step behaved as expected.
 */
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { findLabScratchDirs, reapStaleLab, startLab, type Lab } from './lab.ts';

const repo = join(fileURLToPath(new URL('.', import.meta.url)), '..', '..');
const ipwardenBin = join(repo, 'bin', 'ipwarden');

function say(line: string): void {
  process.stdout.write(`${line}\n`);
}

async function ms<T>(fn: () => Promise<T>): Promise<[T, number]> {
  const t = performance.now();
  const v = await fn();
  return [v, Math.round(performance.now() - t)];
}

async function demo(lab: Lab): Promise<boolean> {
  let ok = true;
  say(`\n== 2. three pods on ${lab.networkName} (${lab.subnet}, IPAM dataDir ${lab.dataDir})`);
  for (let i = 0; i < 3; i++) {
    const [id, t] = await ms(() => lab.runSandbox());
    say(`RunPodSandbox ${id.slice(0, 12)}… ${t} ms`);
  }
  const listed = await lab.listSandboxes();
  say(`ListPodSandbox: ${listed.map((s) => `${s.id.slice(0, 12)} ${s.state}`).join(', ')}`);
  say(`reservations:   ${lab.reservations().map((r) => `${r.ip}→${r.id.slice(0, 12)}`).join(', ')}`);

  say('\n== 3. the runtime loses its sandbox records (SIGKILL containerd + shims + pause, wipe root/state, keep /var/lib/cni)');
  const [, tw] = await ms(() => lab.wipeRuntimeState());
  const after = await lab.listSandboxes();
  const live = new Set(after.map((s) => s.id));
  const orphans = lab.reservations().filter((r) => !live.has(r.id));
  say(`wipe + restart ${tw} ms; ListPodSandbox: ${after.length} sandboxes; orphaned reservations: ${orphans.length}`);
  ok &&= orphans.length === 3;

  say('\n== 4. run pods until the /28 is exhausted');
  let exhausted = '';
  for (let i = 0; i < 20 && exhausted === ''; i++) {
    try {
      await lab.runSandbox();
    } catch (e) {
      exhausted = e instanceof Error ? e.message : String(e);
    }
  }
  const running = (await lab.listSandboxes()).filter((s) => s.state === 'ready').length;
  say(`${running} pods running, then: ${exhausted}`);
  ok &&= /no IP addresses available in range set/.test(exhausted);

  say(`\n== 5. heal: ipwarden gc --network ${lab.networkName} --grace 0s`);
  const gc = spawnSync(
    process.execPath,
    [ipwardenBin, 'gc', '--data-dir', lab.dataDir, '--network', lab.networkName, '--runtime-endpoint', lab.endpoint, '--grace', '0s'],
    { encoding: 'utf8', timeout: 60_000 },
  );
  process.stdout.write(gc.stdout);
  process.stderr.write(gc.stderr);
  if (gc.status !== 0) {
    say(`ipwarden gc exited with status ${String(gc.status)}`);
    return false;
  }
  const left = lab.reservations().filter((r) => !live.has(r.id) && orphans.some((o) => o.ip === r.ip && o.id === r.id));
  say(`orphans left: ${left.length}`);
  try {
    const [id, t] = await ms(() => lab.runSandbox('after-heal'));
    const ip = lab.reservations().find((r) => r.id === id)?.ip ?? '?';
    say(`RunPodSandbox after heal: ${id.slice(0, 12)}… got ${ip} (${t} ms)`);
  } catch (e) {
    say(`RunPodSandbox after heal failed: ${e instanceof Error ? e.message : String(e)}`);
    ok = false;
  }
  return ok && left.length === 0;
}

async function main(): Promise<void> {
  if (process.getuid?.() !== 0) {
    process.stderr.write('npm run lab needs root (it runs its own containerd): sudo npm run lab\n');
    process.exitCode = 2;
    return;
  }
  const args = process.argv.slice(2);
  const ipam = args.includes('--ipam') && args[args.indexOf('--ipam') + 1] === 'ipwarden' ? 'ipwarden' : 'host-local';

  say('== 1. prerequisites');
  for (const dir of findLabScratchDirs()) {
    say(`tearing down a lab left by an earlier run: ${dir}`);
    await reapStaleLab(dir).catch((e: unknown) => say(`  ${e instanceof Error ? e.message : String(e)}`));
  }
  const lab = await startLab({
    ipam,
    ...(ipam === 'ipwarden' ? { ipwardenPath: ipwardenBin } : {}),
    installPackages: true,
    log: say,
  });
  let stopping = false;
  const onSignal = (): void => {
    if (stopping) return;
    stopping = true;
    say('\ninterrupted: stopping the lab');
    void lab.stop().finally(() => {
      process.exitCode = 130;
    });
  };
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  say(`lab started in ${lab.timings['start']} ms (${JSON.stringify(lab.timings)})`);
  let ok = false;
  try {
    ok = await demo(lab);
    if (args.includes('--keep')) {
      say(`\nlab kept running: CONTAINER_RUNTIME_ENDPOINT=${lab.endpoint}; Ctrl-C stops it`);
      process.off('SIGINT', onSignal);
      await new Promise<void>((r) => process.once('SIGINT', () => r()));
    }
  } finally {
    if (!stopping) {
      stopping = true;
      await lab.stop();
      say(`\nlab stopped in ${lab.timings['stop']} ms; nothing left behind`);
    }
  }
  say(ok ? '\nRESULT: leak reproduced and healed' : '\nRESULT: FAILED (see above)');
  process.exitCode = ok ? 0 : 1;
}

await main();
