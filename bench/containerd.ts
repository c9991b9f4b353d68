/**
 * The pod lifecycle on the real containerd lab (issue 9): RunPodSandbox + StopPodSandbox +
 * RemovePodSandbox with ipwarden as the IPAM — through the installed shim and `ipwarden daemon`
 * (the fast path) — against the same with upstream host-local. Target: ≤ 1.02 × host-local.
 * Also shown, not targeted: ipwarden with no daemon up (every request through the shim's
 * standalone fallback), the cost the fast path removes.
 *
 *     npm run build && node --import tsx bench/containerd.ts
 *
 * Fairness: one lab (its own containerd, bridge, /24, no chained plugin) per variant, all up for
 * the whole run, so each variant pays the same idle background; rounds are interleaved and the
 * order of the variants rotates every round; one warm-up round is dropped. A round times
 * `BENCH_PODS` lifecycles per variant back to back; the figure is the median over rounds of the
 * per-round ratio (variant ÷ host-local) with its interquartile range. The daemon runs as
 * deployed (default 1 m interval: its passes fall in whichever round they fall in). Milliseconds
 * are printed only to check the ratios. At the end the daemon's own metrics must show every ADD
 * of the daemon variant on path="daemon" and none on path="standalone", or the run is refused.
 *
 * Needs root, Debian's containerd, runc, containernetworking-plugins (as the e2e lab tests).
 * Environment: BENCH_ROUNDS (default 15), BENCH_PODS (default 4).
 */
import { cpus } from 'node:os';
import { IPWARDEN_BUNDLE, labUnavailableReason, startLab, type Lab } from '../src/lab/lab.ts';
import { startTestDaemon, type TestDaemon } from '../test/helpers/daemon.ts';
import { existsSync } from 'node:fs';

const ROUNDS = Number(process.env['BENCH_ROUNDS'] ?? 15);
const PODS = Number(process.env['BENCH_PODS'] ?? 4);

interface Variant {
  readonly name: string;
  lab?: Lab;
  /** Per round (after warm-up): total ms of the round's lifecycles, of their RunPodSandbox calls. */
  readonly total: number[];
  readonly run: number[];
}

/** Quantile `q` of `xs` (linear interpolation between order statistics). */
function quantile(xs: readonly number[], q: number): number {
  const s = [...xs].sort((a, b) => a - b);
  const pos = (s.length - 1) * q;
  const lo = Math.floor(pos);
  const hi = Math.ceil(pos);
  return (s[lo] as number) + ((s[hi] as number) - (s[lo] as number)) * (pos - lo);
}

const ms = (t0: bigint): number => Number(process.hrtime.bigint() - t0) / 1e6;

/** `PODS` lifecycles on `lab`; returns [total ms, RunPodSandbox ms]. */
async function round(lab: Lab, tag: string): Promise<[number, number]> {
  let total = 0;
  let run = 0;
  for (let i = 0; i < PODS; i++) {
    const t0 = process.hrtime.bigint();
    const id = await lab.runSandbox(`${tag}-${i}`);
    run += ms(t0);
    await lab.cri.stopPodSandbox(id);
    await lab.cri.removePodSandbox(id);
    total += ms(t0);
  }
  return [total, run];
}

/** `ipwarden_cni_requests_total` samples of the daemon: `command path result` → value. */
async function cniRequests(d: TestDaemon): Promise<Map<string, number>> {
  const line = await d.waitForLog((l) => l.msg === 'metrics listening');
  const text = await (await fetch(`http://${String(line['metricsAddress'])}/metrics`)).text();
  const out = new Map<string, number>();
  for (const l of text.split('\n')) {
    if (!l.startsWith('ipwarden_cni_requests_total{')) continue;
    const label = (k: string): string => new RegExp(`${k}="([^"]*)"`).exec(l)?.[1] ?? '';
    out.set(`${label('command')} ${label('path')} ${label('result')}`, Number(l.split(' ').pop()));
  }
  return out;
}

async function main(): Promise<void> {
  const why = labUnavailableReason() ?? (existsSync(IPWARDEN_BUNDLE) ? undefined : `no built bundle at ${IPWARDEN_BUNDLE} (npm run build)`);
  if (why !== undefined) throw new Error(`bench/containerd.ts: ${why}`);
  const hostLocal: Variant = { name: 'host-local', total: [], run: [] };
  const viaDaemon: Variant = { name: 'ipwarden, shim → daemon', total: [], run: [] };
  const standalone: Variant = { name: 'ipwarden, shim → standalone (no daemon)', total: [], run: [] };
  const variants = [hostLocal, viaDaemon, standalone];
  let daemon: TestDaemon | undefined;
  try {
    hostLocal.lab = await startLab({ ipam: 'host-local', subnet: '10.247.63.0/24' });
    viaDaemon.lab = await startLab({ ipam: 'ipwarden', subnet: '10.247.64.0/24' });
    standalone.lab = await startLab({ ipam: 'ipwarden', subnet: '10.247.65.0/24' });
    const l = viaDaemon.lab;
    daemon = await startTestDaemon({
      socket: l.pluginSocket,
      dataDir: l.dataDir,
      cniConfDir: l.confDir,
      logLevel: 'info',
      args: ['--runtime-endpoint', l.endpoint, '--metrics-address', '127.0.0.1:0'],
    });
    const before = await cniRequests(daemon);

    for (let r = 0; r <= ROUNDS; r++) {
      const order = variants.map((_, i) => variants[(i + r) % variants.length] as Variant);
      for (const v of order) {
        const [total, run] = await round(v.lab as Lab, `r${r}`);
        if (r === 0) continue; // warm-up
        v.total.push(total);
        v.run.push(run);
      }
    }

    const after = await cniRequests(daemon);
    const delta = (k: string): number => (after.get(k) ?? 0) - (before.get(k) ?? 0);
    const adds = (ROUNDS + 1) * PODS;
    if (delta('ADD daemon ok') !== adds || delta('ADD standalone ok') !== 0) {
      throw new Error(`the daemon variant did not run on the fast path: ADD daemon ok +${delta('ADD daemon ok')} (want ${adds}), ADD standalone ok +${delta('ADD standalone ok')} (want 0)`);
    }

    const ratios = (v: Variant, key: 'total' | 'run'): number[] => v[key].map((x, i) => x / (hostLocal[key][i] as number));
    const fmt = (xs: number[]): string => `${quantile(xs, 0.5).toFixed(3)}× (IQR ${quantile(xs, 0.25).toFixed(3)}–${quantile(xs, 0.75).toFixed(3)})`;
    console.log(`containerd lab, ${ROUNDS} rounds (+1 warm-up) × ${PODS} pod lifecycles per variant, interleaved; ${cpus().length} CPUs, Node ${process.version}, containerd ${l.cri.runtimeVersion.runtimeVersion}`);
    console.log(`check: the daemon answered ${delta('ADD daemon ok')} ADD and ${delta('DEL daemon ok')} DEL (path="daemon"), 0 ADD fell back`);
    for (const v of [viaDaemon, standalone]) {
      console.log(`${v.name} ÷ host-local: Run+Stop+Remove ${fmt(ratios(v, 'total'))}; RunPodSandbox alone ${fmt(ratios(v, 'run'))}`);
    }
    console.log('median ms per lifecycle, for checking only:');
    for (const v of variants) {
      console.log(`  ${v.name}: Run+Stop+Remove ${(quantile(v.total, 0.5) / PODS).toFixed(1)} ms, RunPodSandbox ${(quantile(v.run, 0.5) / PODS).toFixed(1)} ms`);
    }
  } finally {
    await daemon?.stop();
    const problems: string[] = [];
    for (const v of variants) await v.lab?.stop().catch((e: unknown) => problems.push(String(e)));
    if (problems.length > 0) console.error(problems.join('\n'));
  }
}

main().catch((e: unknown) => {
  console.error(e instanceof Error ? e.stack : String(e));
  process.exitCode = 1;
});
