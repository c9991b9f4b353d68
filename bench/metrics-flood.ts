/**
 * Scrape-flood benchmark: the per-pod cost of ADD+DEL through the installed shim and the daemon,
 * quiet and while many clients scrape `/metrics` as fast as they can, interleaved in one run. Run
 * as root after `npm run build`:
 *
 *     node --import tsx bench/metrics-flood.ts   # BENCH_FLOOD_ROUNDS (30), BENCH_FLOOD_WARMUP (3), BENCH_FLOOD_CONNECTIONS (32)
 *
 * Method: the timing harness of bench/fast-path.ts (bench/xbench.c: from just before
 * `posix_spawn` to just after `waitpid`, clean environment, every exit status checked) runs one
 * ADD then one DEL of container `<phase><round>` on a /24 that holds 110 reservations of other
 * containers. The flood is a separate Node process (so its own work is not on the daemon's event
 * loop): `BENCH_FLOOD_CONNECTIONS` keep-alive connections (32 = the endpoint's connection cap),
 * each sending `GET /metrics` again as soon as the previous answer is read completely
 * (`BENCH_FLOOD_PATH=/healthz` floods another path; `BENCH_FLOOD_KEEPALIVE=0` opens a new
 * connection per request). Each round runs a quiet phase and a flood phase, the order alternating;
 * a flood phase starts timing once as many answers came as there are connections, and ends with
 * the flood stopped (every connection answered and closed) before the next phase. Requests refused
 * (the previous phase's connections not yet closed on the server's side) are retried after 10 ms
 * and counted as failed. Medians with IQR; the flood's answer rate and the daemon's renders of the
 * exposition (`ipwarden_metrics_renders_total`, absent before it existed) are printed. Asserts
 * nothing (benchmarks are never part of `npm test`).
 */
import { execFileSync, spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { chmodSync, existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { cpus, release } from 'node:os';
import { join } from 'node:path';
import { ROOT } from '../test/helpers/cni.ts';
import { startTestDaemon, type TestDaemon } from '../test/helpers/daemon.ts';
import { rng } from '../test/helpers/rng.ts';

const ROUNDS = Number(process.env['BENCH_FLOOD_ROUNDS'] ?? 30);
const WARMUP = Number(process.env['BENCH_FLOOD_WARMUP'] ?? 3);
const CONNECTIONS = Number(process.env['BENCH_FLOOD_CONNECTIONS'] ?? 32);
const FLOOD_PATH = process.env['BENCH_FLOOD_PATH'] ?? '/metrics';
const FLOOD_KEEPALIVE = process.env['BENCH_FLOOD_KEEPALIVE'] !== '0';
const SUBNET_PREFIX = '10.87.203';
const NET = 'floodbench';
const NODE = '/usr/bin/node';

/**
 * The flood client (plain JS, run with `node -e`): argv = port, connections. Reads `on`/`off`
 * lines on stdin; prints `flooding` once 100 scrapes were answered after an `on`, `idle <ok> <bad>
 * <bytes>` once every connection is idle and closed after an `off` (counts since its `on`).
 */
const FLOOD_CLIENT = String.raw`
const http = require('node:http');
const [port, n] = process.argv.slice(1, 3).map(Number);
const path = process.argv[3], keepAlive = process.argv[4] === 'keep-alive';
let agent = null;
let on = false, running = 0, ok = 0, bad = 0, bytes = 0, told = false;
function one() {
  if (!on) { running--; if (running === 0) { agent.destroy(); process.stdout.write('idle ' + ok + ' ' + bad + ' ' + bytes + '\n'); } return; }
  const req = http.get({ host: '127.0.0.1', port, path, agent }, (res) => {
    let len = 0;
    res.on('data', (c) => { len += c.length; });
    res.on('end', () => {
      if (res.statusCode < 500) ok++; else bad++;
      bytes += len;
      if (!told && ok >= n) { told = true; process.stdout.write('flooding\n'); }
      setImmediate(one);
    });
  });
  req.on('error', () => { bad++; setTimeout(one, 10); });
}
let buf = '';
process.stdin.on('data', (c) => {
  buf += c;
  let i;
  while ((i = buf.indexOf('\n')) >= 0) {
    const cmd = buf.slice(0, i); buf = buf.slice(i + 1);
    if (cmd === 'on') { agent = new http.Agent({ keepAlive, maxSockets: n }); on = true; ok = 0; bad = 0; bytes = 0; told = false; running = n; for (let k = 0; k < n; k++) one(); }
    if (cmd === 'off') on = false;
    if (cmd === 'exit') process.exit(0);
  }
});
`;

/** Median of `xs` (0 for none). */
function median(xs: readonly number[]): number {
  return quantile(xs, 0.5);
}
/** Linear-interpolated quantile `q` ∈ [0, 1] of `xs`. */
function quantile(xs: readonly number[], q: number): number {
  if (xs.length === 0) return 0;
  const s = [...xs].sort((a, b) => a - b);
  const pos = (s.length - 1) * q;
  const lo = Math.floor(pos);
  const hi = Math.ceil(pos);
  return (s[lo] as number) + ((s[hi] as number) - (s[lo] as number)) * (pos - lo);
}

/** ADD then DEL of `id` through `bin` with the xbench harness; resolves with [addMs, delMs]. */
function addDel(harness: string, bin: string, stdin: string, id: string): Promise<number[]> {
  const env = (command: string): string[] => [
    'PATH=/usr/bin:/bin',
    `CNI_COMMAND=${command}`,
    `CNI_CONTAINERID=${id}`,
    'CNI_IFNAME=eth0',
    `CNI_NETNS=${command === 'ADD' ? '/var/run/netns/ipw-floodbench' : ''}`,
    'CNI_PATH=/usr/lib/cni',
  ];
  const argv = ['ADD', 'DEL'].flatMap((c) => [bin, stdin, '0', String(env(c).length), ...env(c)]);
  return new Promise((resolve, reject) => {
    const p = spawn(harness, argv, { env: { PATH: '/usr/bin:/bin' }, stdio: ['ignore', 'pipe', 'inherit'] });
    let out = '';
    p.stdout.on('data', (c: Buffer) => (out += c.toString('utf8')));
    p.on('error', reject);
    p.on('close', (code) => {
      const rows = out.trim().split('\n').map((l) => l.split(' ').map(Number));
      if (code !== 0 || rows.length !== 2 || rows.some((r) => r[1] !== 0)) return reject(new Error(`ADD/DEL of ${id} failed: xbench ${code}, ${out}`));
      resolve(rows.map((r) => (r[0] as number) / 1e6));
    });
  });
}

/** The flood process and a way to wait for its next stdout line. */
function startFlood(port: number): { child: ChildProcessWithoutNullStreams; next(): Promise<string> } {
  const child = spawn(NODE, ['-e', FLOOD_CLIENT, String(port), String(CONNECTIONS), FLOOD_PATH, FLOOD_KEEPALIVE ? 'keep-alive' : 'close'], { env: { PATH: '/usr/bin:/bin' }, stdio: 'pipe' });
  child.stderr.pipe(process.stderr);
  const lines: string[] = [];
  const waiting: Array<(l: string) => void> = [];
  let buf = '';
  child.stdout.on('data', (c: Buffer) => {
    buf += c.toString('utf8');
    let i: number;
    while ((i = buf.indexOf('\n')) >= 0) {
      const l = buf.slice(0, i);
      buf = buf.slice(i + 1);
      const w = waiting.shift();
      if (w !== undefined) w(l);
      else lines.push(l);
    }
  });
  return {
    child,
    next: () => {
      const l = lines.shift();
      return l !== undefined ? Promise.resolve(l) : new Promise((r) => waiting.push(r));
    },
  };
}

/** The value of the unlabelled series `name` in the exposition at `port` (NaN when absent). */
async function scrapeValue(port: number, name: string): Promise<number> {
  let text = '';
  // Retried: right after a flood phase the server may still count the flood's closed connections.
  for (let i = 0; ; i++) {
    try {
      text = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
      break;
    } catch (e) {
      if (i >= 50) throw e;
      await new Promise((r) => setTimeout(r, 100));
    }
  }
  const m = new RegExp(`^${name} (\\S+)$`, 'm').exec(text);
  return m === null ? Number.NaN : Number(m[1]);
}

const root = mkdtempSync('/tmp/ipw-floodbench-');
let daemon: TestDaemon | null = null;
let flood: ReturnType<typeof startFlood> | null = null;
const cleanup = (): void => {
  if (flood !== null && flood.child.exitCode === null && flood.child.signalCode === null && flood.child.pid !== undefined) {
    try {
      process.kill(flood.child.pid, 'SIGKILL');
    } catch {
      // already gone
    }
  }
  rmSync(root, { recursive: true, force: true });
};
process.on('exit', cleanup);

try {
  if (process.getuid?.() !== 0) throw new Error('run as root (the daemon socket directory must be owned by root)');
  const bundle = join(ROOT, 'dist/ipwarden.cjs');
  if (!existsSync(bundle)) throw new Error('run "npm run build" first');
  const harness = join(root, 'xbench');
  execFileSync('gcc', ['-O2', '-Wall', '-Wextra', '-Werror', '-o', harness, join(ROOT, 'bench/xbench.c')], { stdio: 'inherit' });

  const binDir = join(root, 'bin');
  const sockDir = join(root, 'run');
  mkdirSync(binDir);
  mkdirSync(sockDir, { mode: 0o700 });
  chmodSync(sockDir, 0o700);
  const socket = join(sockDir, 'plugin.sock');
  execFileSync(NODE, [bundle, 'install-cni', '--dest', binDir, '--socket', socket], { env: { PATH: '/usr/bin:/bin' }, stdio: 'pipe' });
  const shim = join(binDir, 'ipwarden');

  // One network with 110 reservations of other containers (as bench/fast-path.ts "110 live"), in
  // the daemon's --data-dir, so its first pass fills the address gauges.
  const dataDir = join(root, 'data');
  const dir = join(dataDir, NET);
  mkdirSync(dir, { recursive: true });
  const rand = rng(203);
  const free = Array.from({ length: 253 }, (_, i) => i + 2);
  for (let n = 0; n < 110; n++) {
    const host = free.splice(Math.floor(rand() * free.length), 1)[0] as number;
    writeFileSync(join(dir, `${SUBNET_PREFIX}.${host}`), `live-${n}\r\neth0`, { mode: 0o600 });
  }
  const conf = join(root, 'conf.json');
  writeFileSync(conf, JSON.stringify({ cniVersion: '1.0.0', name: NET, ipam: { type: 'ipwarden', dataDir, ranges: [[{ subnet: `${SUBNET_PREFIX}.0/24` }]] } }));

  daemon = await startTestDaemon({ socket, dataDir, logLevel: 'info', args: ['--interval', '1h', '--metrics-address', '127.0.0.1:0', '--runtime-endpoint', 'unix:///nonexistent/cri.sock'] });
  const line = await daemon.waitForLog((l) => l.msg === 'metrics listening');
  const port = Number(String(line['metricsAddress']).split(':').pop());
  await daemon.waitForLog((l) => l.msg === 'reconcile pass');
  flood = startFlood(port);

  const times = { quiet: [[], []] as number[][], flood: [[], []] as number[][] };
  const rates: number[] = [];
  let scrapes = 0;
  let failed = 0;
  let bodyBytes = 0;
  const renders0 = await scrapeValue(port, 'ipwarden_metrics_renders_total');
  let floodMs = 0;
  for (let round = 0; round < WARMUP + ROUNDS; round++) {
    const order = round % 2 === 0 ? (['quiet', 'flood'] as const) : (['flood', 'quiet'] as const);
    for (const phase of order) {
      if (phase === 'flood') {
        const t0 = performance.now();
        flood.child.stdin.write('on\n');
        const l = await flood.next();
        if (l !== 'flooding') throw new Error(`flood client: ${l}`);
        const ms = await addDel(harness, shim, conf, `${phase}${round}`);
        flood.child.stdin.write('off\n');
        const idle = (await flood.next()).split(' ');
        const elapsed = performance.now() - t0;
        if (round >= WARMUP) {
          ms.forEach((v, s) => times.flood[s]?.push(v));
          scrapes += Number(idle[1]);
          failed += Number(idle[2]);
          bodyBytes += Number(idle[3]);
          floodMs += elapsed;
          rates.push((Number(idle[1]) / elapsed) * 1000);
        }
      } else {
        const ms = await addDel(harness, shim, conf, `${phase}${round}`);
        if (round >= WARMUP) ms.forEach((v, s) => times.quiet[s]?.push(v));
      }
    }
  }
  const renders = (await scrapeValue(port, 'ipwarden_metrics_renders_total')) - renders0;
  flood.child.stdin.write('exit\n');
  const served = (prefix: string): number[] =>
    (daemon?.logs ?? [])
      .filter((l) => l.msg === 'request served' && new RegExp(`^${prefix}(\\d+)$`).test(String(l['containerId'])) && Number(/(\d+)$/.exec(String(l['containerId']))?.[1]) >= WARMUP)
      .map((l) => Number(l['durationSeconds']) * 1000);
  const inDaemon = { quiet: served('quiet'), flood: served('flood') };
  await daemon.stop();
  daemon = null;

  const ms = (xs: number[]): string => `${median(xs).toFixed(2)} ms [${quantile(xs, 0.25).toFixed(2)}–${quantile(xs, 0.75).toFixed(2)}]`;
  const pod = (t: number[][]): number[] => (t[0] ?? []).map((v, r) => v + (t[1]?.[r] ?? 0));
  console.log(`machine: ${cpus().length} × ${cpus()[0]?.model ?? '?'}, kernel ${release()}, node ${process.version}; ${new Date().toISOString()}`);
  console.log(`${ROUNDS} rounds (+${WARMUP} warm-up), quiet and flood phases interleaved (order alternating); medians [IQR]`);
  console.log(`flood: GET ${FLOOD_PATH} on ${CONNECTIONS} ${FLOOD_KEEPALIVE ? 'keep-alive connections' : 'concurrent clients, a new connection per request'}, ${scrapes} scrapes answered (${failed} failed) in ${(floodMs / 1000).toFixed(1)} s of flood phases, median ${median(rates).toFixed(0)} scrapes/s, ${(bodyBytes / Math.max(1, scrapes)).toFixed(0)} bytes each`);
  console.log(`renders of the exposition over the whole run (ipwarden_metrics_renders_total): ${Number.isNaN(renders) ? 'not exported' : renders}`);
  console.log('');
  console.log('ADD+DEL through the shim and the daemon, 110 live reservations');
  console.log(`   quiet   ADD ${ms(times.quiet[0] ?? [])}  DEL ${ms(times.quiet[1] ?? [])}  per pod ${ms(pod(times.quiet))}`);
  console.log(`   flood   ADD ${ms(times.flood[0] ?? [])}  DEL ${ms(times.flood[1] ?? [])}  per pod ${ms(pod(times.flood))}`);
  console.log(`   per pod, flood / quiet: ${(median(pod(times.flood)) / median(pod(times.quiet))).toFixed(2)} ×`);
  console.log(`   inside the daemon ('request served' durationSeconds, ADD and DEL): quiet ${ms(inDaemon.quiet)}, flood ${ms(inDaemon.flood)}`);
} finally {
  if (daemon !== null) await daemon.stop();
  cleanup();
}
