/**
 * `npm run lab` (root): the README's demo on a real containerd (issues 3 and 4).
 *
 * Installs containerd, runc and containernetworking-plugins with apt-get when missing, tears down
 * labs left behind by earlier runs that crashed, then runs the same flow three times, each on its
 * own fresh lab (a /28: 13 addresses, `.2`–`.14`):
 *
 *   (a) upstream host-local IPAM;
 *   (b) ipwarden IPAM with `reclaimOnExhaustion: false` (behaves like host-local, same error text);
 *   (c) ipwarden IPAM with reclaim on (`leakGracePeriod: 2s`): the plugin heals the range itself.
 *
 * Flow, printed as a timeline:
 *   1. leak: 2 READY pods; chained plugin → `fail`: 2 pods stay NOTREADY holding their addresses;
 *      the runtime loses its records (wipe) → those 4 reservations are owned by nobody; one more
 *      NOTREADY pod (live at gc time); chained → `pass`: READY pods until the range is full; then
 *      one more RunPodSandbox — fails with `no IP addresses available in range set` in (a)/(b),
 *      starts in (c) because the plugin reclaims the leaked reservations;
 *   2. `ipwarden leaks` shows leaked and live reservations;
 *   3. `ipwarden gc` releases exactly the leaked ones, live ones (READY and NOTREADY) keep theirs;
 *   4. a new sandbox starts.
 * Every check prints ✓ or ✗. Each lab is stopped (and checked for leftovers) also on failure.
 *
 * Run (d), the DaemonSet (issue 10; src/lab/daemonset-run.ts): `npm run image` builds the OCI
 * image index (linux/amd64 and linux/arm64), pushes it to a registry on loopback (Debian's
 * docker-registry, started and stopped by the run), a fresh lab's containerd pulls it by digest,
 * and runs it as a pod the way a kubelet runs
 * deploy/kubernetes/daemonset.yaml (host network and PID namespace, the manifest's host mounts
 * mapped onto the lab's dirs, the init container install-cni first and to completion, then the
 * daemon); the plugin appears in the lab's CNI bin dir, pods get their addresses through the shim
 * and the daemon, leaks (failing chained plugin, then a reboot that loses the runtime's records and
 * the DaemonSet pod) are healed by the re-created pod's daemon with no pod failing, its metrics are
 * scraped from the pod's port, and with the pod stopped pods start through the standalone.
 *
 * Options: `--runs a,b,c,d` (default all four); `--dist DIR` (the binaries the image is built
 * from, default dist/).
 * Output ends with one `RESULT:` line; exit status 0 only when every check passed.
 */
import { DaemonSetRun } from './daemonset-run.ts';
import { findLabScratchDirs, labLeftovers, reapStaleLab, startLab, type Lab, type LabOptions } from './lab.ts';
import {
  auditLines,
  byVerdict,
  capacityOf,
  fillRange,
  ipsOf,
  ipwarden,
  labArgs,
  rangeSetText,
  reconcileJson,
  reservationContents,
  runBrokenPod,
  tryRunPod,
  waitUntilOlder,
  type Pod,
} from './scenario.ts';

const SUBNET = '10.244.9.0/28';
/** `leakGracePeriod` of runs (b)/(c) and `--grace` of leaks/gc: short, so the demo need not wait 5 minutes. */
const GRACE = '2s';
const GRACE_SECONDS = 2;

interface Run {
  readonly key: 'a' | 'b' | 'c';
  readonly title: string;
  readonly lab: LabOptions;
  /** The plugin reclaims on exhaustion (run c). */
  readonly heals: boolean;
}

const RUNS: readonly Run[] = [
  { key: 'a', title: 'upstream host-local IPAM', lab: { ipam: 'host-local' }, heals: false },
  {
    key: 'b',
    title: 'ipwarden IPAM, reclaimOnExhaustion: false',
    lab: { ipam: 'ipwarden', ipamExtra: { reclaimOnExhaustion: false, leakGracePeriod: GRACE } },
    heals: false,
  },
  {
    key: 'c',
    title: `ipwarden IPAM, reclaim on exhaustion (leakGracePeriod: ${GRACE})`,
    lab: { ipam: 'ipwarden', ipamExtra: { leakGracePeriod: GRACE } },
    heals: true,
  },
];

function say(line: string): void {
  process.stdout.write(`${line}\n`);
}

const short = (id: string): string => id.slice(0, 12);
const lastOctets = (ips: readonly string[]): string => (ips.length === 0 ? '(none)' : ips.map((ip) => `.${ip.split('.').pop() ?? ''}`).join(' '));
const sameSet = (a: readonly string[], b: readonly string[]): boolean => a.length === b.length && [...a].sort().join() === [...b].sort().join();

/** Runs one variant on a fresh lab; returns the failed checks (empty = all passed). */
async function runFlow(run: Run, installPackages: boolean): Promise<string[]> {
  const failed: string[] = [];
  const t0 = performance.now();
  const at = (): string => `[${((performance.now() - t0) / 1000).toFixed(1).padStart(5)}s]`;
  const step = (line: string): void => say(`${at()} ${line}`);
  const check = (ok: boolean, what: string): void => {
    say(`        ${ok ? '✓' : '✗'} ${what}`);
    if (!ok) failed.push(`(${run.key}) ${what}`);
  };
  const p = (pod: Pod): string => `${pod.name} ${short(pod.id)} ${pod.state.toUpperCase()} ${pod.ip || '(no address)'}`;

  say(`\n==== run (${run.key}): ${run.title}`);
  const lab: Lab = await startLab({ ...run.lab, subnet: SUBNET, chained: 'pass', installPackages, log: installPackages ? (l) => say(`        ${l}`) : () => {} });
  try {
    const cap = capacityOf(SUBNET);
    step(`lab up in ${lab.timings['start']} ms: containerd ${lab.cri.runtimeVersion.runtimeVersion} (pid ${lab.containerdPid}), network ${lab.networkName} ${SUBNET} (${cap} addresses), chain bridge → ${run.lab.ipam} | chained test plugin | portmap`);
    if (run.lab.ipamExtra !== undefined) step(`ipam extra keys: ${JSON.stringify(run.lab.ipamExtra)}`);

    say('  -- 1. leak until the range is exhausted');
    const before: Pod[] = [];
    for (const n of [1, 2]) {
      const r = await tryRunPod(lab, `${run.key}-web-${n}`);
      if (!r.ok) throw new Error(r.error);
      before.push(r.pod);
      step(`RunPodSandbox ${p(r.pod)}`);
    }
    lab.setChainedMode('fail');
    step('chained plugin → fail (its ADD and DEL fail: containerd cannot tear the sandbox down, DEL never reaches the IPAM)');
    const broken: Pod[] = [];
    for (const n of [1, 2]) {
      const b = await runBrokenPod(lab, `${run.key}-broken-${n}`);
      broken.push(b);
      step(`RunPodSandbox ${p(b)}: ${b.error.replace(/^failed to setup network for sandbox "[0-9a-f]+": /, '')}`);
    }
    const leaked = ipsOf([...before, ...broken]);
    const oldPid = lab.containerdPid;
    await lab.wipeRuntimeState();
    const listed = await lab.listSandboxes();
    step(`the runtime loses its sandbox records (SIGKILL containerd ${oldPid} + shims + pause, wipe root/state; CNI dataDir kept): ListPodSandbox → ${listed.length} sandboxes`);
    step(`reservations owned by nobody now: ${lastOctets(lab.reservations().map((r) => r.ip))} — the 2 READY + 2 NOTREADY pods of before`);
    check(listed.length === 0 && sameSet(lab.reservations().map((r) => r.ip), leaked), `4 leaked reservations ${lastOctets(leaked)}`);
    const notReady = await runBrokenPod(lab, `${run.key}-broken-3`);
    step(`chained plugin still failing: RunPodSandbox ${p(notReady)} (live: listed NOTREADY)`);
    lab.setChainedMode('pass');
    const filled = await fillRange(lab, `${run.key}-app`);
    step(`chained plugin → pass: ${filled.length} READY pods ${lastOctets(ipsOf(filled))}; range full: ${lab.reservations().length}/${cap} reserved, ${(await lab.listSandboxes()).length} sandboxes listed`);
    const live = [notReady, ...filled];
    const liveBefore = reservationContents(lab);
    for (const ip of leaked) liveBefore.delete(ip);
    if (run.heals || run.lab.ipam === 'ipwarden') {
      await waitUntilOlder(lab, leaked, GRACE_SECONDS);
      step(`waited until the leaked files are older than ${GRACE}`);
    }
    const more = await tryRunPod(lab, `${run.key}-one-more`);
    const exact = `failed to allocate for range 0: no IP addresses available in range set: ${rangeSetText(SUBNET)}`;
    let extraLive: Pod[] = [];
    if (run.heals) {
      if (more.ok) {
        step(`RunPodSandbox ${p(more.pod)} — started: the plugin reclaimed the leaked reservations itself`);
        extraLive = [more.pod];
      } else step(`RunPodSandbox ${run.key}-one-more failed: ${more.error}`);
      check(more.ok && leaked.includes(more.pod.ip), 'the pod that hit exhaustion in (a)/(b) starts, on a reclaimed address');
      const audit = auditLines(lab);
      for (const a of audit) step(`audit: ${a.ip} ${short(a.containerId ?? '-')} ${a.reason}`);
      check(
        sameSet(audit.map((a) => a.ip), leaked) && audit.every((a) => a.reason.startsWith('reclaimed on exhaustion')),
        `audit log: one "reclaimed on exhaustion" line per leaked reservation (${audit.length})`,
      );
    } else {
      step(`RunPodSandbox ${run.key}-one-more: ${more.ok ? `started?! ${p(more.pod)}` : more.error}`);
      const msg = more.ok ? '' : more.error;
      check(msg.includes(`plugin type="bridge" failed (add): ${exact}`), `exact host-local error: ${exact}`);
      if (run.lab.ipam === 'ipwarden') {
        const details = msg.slice(msg.indexOf(exact) + exact.length).replace(/^; /, '');
        step(`visible details: ${details === '' ? '(none: the runtime shows only the message)' : details}`);
        check(details.includes('4 leaked'), 'the breakdown counts the 4 leaked reservations');
      }
    }

    say(`  -- 2. ipwarden leaks --grace ${GRACE}`);
    const leaks = ipwarden(['leaks', ...labArgs(lab, GRACE)]);
    for (const l of leaks.stdout.trimEnd().split('\n')) say(`        ${l}`);
    if (leaks.stderr !== '') say(`        stderr: ${leaks.stderr.trim()}`);
    const v = byVerdict(reconcileJson(lab, 'leaks', GRACE));
    const stillLeaked = run.heals ? [] : leaked;
    check(sameSet(v['leaked'] ?? [], stillLeaked), `leaked: ${lastOctets(stillLeaked)}`);
    check(sameSet(v['live'] ?? [], ipsOf([...live, ...extraLive])), `live: ${lastOctets(ipsOf([...live, ...extraLive]))} (1 NOTREADY + ${live.length - 1 + extraLive.length} READY)`);

    say(`  -- 3. ipwarden gc --grace ${GRACE}`);
    const gc = reconcileJson(lab, 'gc', GRACE);
    for (const r of gc.released) step(`released ${r.ip} ${short(r.containerId ?? '-')} (${r.verdict})`);
    step(`gc released ${gc.released.length}`);
    check(sameSet(gc.released.map((r) => r.ip), stillLeaked), run.heals ? 'gc had nothing left to release' : 'gc released exactly the leaked ones');
    const after = reservationContents(lab);
    const untouched = [...liveBefore].every(([ip, c]) => after.get(ip) === c);
    check(untouched, `live reservations of before untouched: NOTREADY ${notReady.ip} and ${filled.length} READY (content "<64-hex id>\\r\\neth0")`);

    say('  -- 4. new sandboxes start again');
    const next = await tryRunPod(lab, `${run.key}-after-gc`);
    if (next.ok) step(`RunPodSandbox ${p(next.pod)}`);
    else step(`RunPodSandbox ${run.key}-after-gc failed: ${next.error}`);
    check(
      next.ok && leaked.includes(next.pod.ip),
      run.heals ? 'a new sandbox starts on an address the plugin reclaimed' : 'a new sandbox starts on an address gc released',
    );
  } catch (e) {
    failed.push(`(${run.key}) ${e instanceof Error ? e.message : String(e)}`);
    say(`${at()} ✗ ${e instanceof Error ? e.message : String(e)}`);
  } finally {
    try {
      await lab.stop();
    } catch (e) {
      failed.push(`(${run.key}) ${e instanceof Error ? e.message : String(e)}`);
    }
    const left = labLeftovers(lab);
    step(`lab stopped in ${lab.timings['stop']} ms (containerd SIGTERM→exit ${lab.timings['containerd-stop']} ms); left behind: ${left.length === 0 ? 'nothing' : left.join(', ')}`);
    if (left.length > 0) failed.push(`(${run.key}) left behind: ${left.join(', ')}`);
  }
  return failed;
}

/** Subnet of run (d): its own, so the pods of other labs on this machine never look "in use" to its daemon. */
const DS_SUBNET = '10.87.94.0/28';

/** Run (d): the DaemonSet on a fresh lab; returns the failed checks. */
async function runDaemonSet(installPackages: boolean, dist: string | undefined): Promise<string[]> {
  const failed: string[] = [];
  const t0 = performance.now();
  const at = (): string => `[${((performance.now() - t0) / 1000).toFixed(1).padStart(5)}s]`;
  const reporter = {
    say: (line: string): void => say(`${at()} ${line}`),
    check: (ok: boolean, what: string): void => {
      say(`        ${ok ? '✓' : '✗'} ${what}`);
      if (!ok) failed.push(`(d) ${what}`);
    },
  };
  say('\n==== run (d): the DaemonSet — the OCI image as a pod on the lab, the way a kubelet runs deploy/kubernetes/daemonset.yaml');
  const r = await DaemonSetRun.start({ subnet: DS_SUBNET, installPackages, ...(dist === undefined ? {} : { dist }), log: installPackages ? (l) => say(`        ${l}`) : () => {} }, reporter);
  try {
    say('  -- 1. the image, imported; the DaemonSet pod: init container install-cni, then the daemon');
    await r.deploy(1);
    say('  -- 2. pods on the bridge network get their addresses through the shim and the daemon');
    await r.serve();
    say('  -- 3. leaks, a reboot that loses the runtime\'s records, the DaemonSet pod re-created; the daemon heals, no pod fails');
    await r.heal();
    say('  -- 4. metrics from the pod\'s port (host network)');
    await r.metrics();
    say('  -- 5. the DaemonSet pod stopped: pods start through the standalone (fallback)');
    await r.fallback();
  } catch (e) {
    failed.push(`(d) ${e instanceof Error ? e.message : String(e)}`);
    say(`${at()} ✗ ${e instanceof Error ? e.message : String(e)}`);
  } finally {
    try {
      await r.stop();
    } catch (e) {
      failed.push(`(d) ${e instanceof Error ? e.message : String(e)}`);
    }
    const left = labLeftovers(r.lab);
    reporter.say(`lab stopped in ${r.lab.timings['stop']} ms; left behind: ${left.length === 0 ? 'nothing' : left.join(', ')}`);
    if (left.length > 0) failed.push(`(d) left behind: ${left.join(', ')}`);
  }
  return failed;
}

async function main(): Promise<void> {
  if (process.getuid?.() !== 0) {
    process.stderr.write('npm run lab needs root (it runs its own containerd): sudo npm run lab\n');
    process.exitCode = 2;
    return;
  }
  const args = process.argv.slice(2);
  const i = args.indexOf('--runs');
  const wanted = i >= 0 ? (args[i + 1] ?? '').split(',') : ['a', 'b', 'c', 'd'];
  const j = args.indexOf('--dist');
  const dist = j >= 0 ? args[j + 1] : undefined;
  const runs = RUNS.filter((r) => wanted.includes(r.key));
  const daemonSet = wanted.includes('d');
  if ((runs.length === 0 && !daemonSet) || wanted.some((w) => !['a', 'b', 'c', 'd'].includes(w)) || (j >= 0 && dist === undefined)) {
    process.stderr.write('usage: npm run lab [-- --runs a,b,c,d] [--dist DIR]\n');
    process.exitCode = 2;
    return;
  }
  let interrupted = false;
  const onSignal = (): void => {
    interrupted = true; // the current run finishes its cleanup, later runs are skipped
    say('\ninterrupted: stopping after this run’s cleanup');
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);

  const t0 = performance.now();
  for (const dir of findLabScratchDirs()) {
    say(`tearing down a lab left by an earlier run: ${dir}`);
    await reapStaleLab(dir).catch((e: unknown) => say(`  ${e instanceof Error ? e.message : String(e)}`));
  }
  const failed: string[] = [];
  let first = true; // the first start installs missing packages (apt-get)
  for (const run of runs) {
    if (interrupted) {
      failed.push(`(${run.key}) skipped: interrupted`);
      continue;
    }
    try {
      failed.push(...(await runFlow(run, first)));
      first = false;
    } catch (e) {
      failed.push(`(${run.key}) ${e instanceof Error ? e.message : String(e)}`);
    }
  }
  if (daemonSet) {
    if (interrupted) failed.push('(d) skipped: interrupted');
    else {
      try {
        failed.push(...(await runDaemonSet(first, dist)));
      } catch (e) {
        failed.push(`(d) ${e instanceof Error ? e.message : String(e)}`);
      }
    }
  }
  process.off('SIGINT', onSignal);
  process.off('SIGTERM', onSignal);
  const secs = ((performance.now() - t0) / 1000).toFixed(1);
  if (failed.length === 0) {
    const parts = ['leaks reproduced through a failing chained plugin and a wiped runtime'];
    if (runs.some((r) => !r.heals)) parts.push('gc released exactly the leaked reservations, live READY and NOTREADY sandboxes kept theirs');
    if (runs.some((r) => r.heals)) parts.push('with reclaim on, the plugin healed the exhausted range by itself');
    if (daemonSet) parts.push('the image ran as a DaemonSet pod: install-cni, pods through the daemon, leaks healed with no pod failing, metrics, fallback');
    say(`\nRESULT: PASS (${secs} s) — runs ${[...runs.map((r) => r.key), ...(daemonSet ? ['d'] : [])].join(',')}: ${parts.join('; ')}`);
    process.exitCode = 0;
  } else {
    say(`\nRESULT: FAIL (${secs} s) — ${failed.length} check(s) failed: ${failed.join(' | ')}`);
    process.exitCode = 1;
  }
}

await main();