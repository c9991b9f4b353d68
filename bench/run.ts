/**
 * `npm run bench`: whole-process benchmarks, each side by side with its baseline measured in the
 * same run (medians of repeated runs; ratios printed, never asserted). Not part of `npm test`.
 *
 * 1. ipwarden ADD and DEL (one process each) vs the Node floor (`node -e 0`) vs upstream
 *    host-local. Target: ipwarden ≤ 1.3 × the Node floor.
 * 2. ADD on a fully reserved /16 (65,534 reservations). Target: ≤ 0.5 × host-local.
 * 3. DEL of one container among 65,534 reservations. Target: ≤ 1.0 × host-local.
 * 4. `ipwarden leaks` over the /16 against 110 sandboxes vs the raw read floor
 *    (`find DIR -type f -exec cat {} +`), when the reconciler is built. Target: ≤ 1.5 × floor.
 */
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import { HOST_LOCAL, installedPlugin, ROOT } from '../test/helpers/cni.ts';
import { startFakeCri } from './fake-cri.ts';

const RUNS = Number(process.env['BENCH_RUNS'] ?? 25);
const BIG_RUNS = Number(process.env['BENCH_BIG_RUNS'] ?? 5);

function timeMs(cmd: string, args: string[], env: Record<string, string>, input: string): number {
  const t0 = process.hrtime.bigint();
  const r = spawnSync(cmd, args, { env, input, encoding: 'utf8' });
  const t1 = process.hrtime.bigint();
  if (r.error) throw r.error;
  return Number(t1 - t0) / 1e6;
}

/** Time a command without blocking the event loop (the fake CRI server runs in this process). */
function timeMsAsync(cmd: string, args: string[]): Promise<number> {
  return new Promise((resolve, reject) => {
    const t0 = process.hrtime.bigint();
    const p = spawn(cmd, args, { stdio: ['ignore', 'ignore', 'inherit'] });
    p.on('error', reject);
    p.on('close', (code) => {
      if (code !== 0) reject(new Error(`${cmd} ${args.join(' ')} exited ${code}`));
      else resolve(Number(process.hrtime.bigint() - t0) / 1e6);
    });
  });
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 === 1 ? (s[m] ?? 0) : ((s[m - 1] ?? 0) + (s[m] ?? 0)) / 2;
}

function cniEnv(command: string, id: string): Record<string, string> {
  return { PATH: '/usr/bin:/bin', CNI_COMMAND: command, CNI_CONTAINERID: id, CNI_IFNAME: 'eth0', CNI_NETNS: '/var/run/netns/bench', CNI_PATH: '/usr/lib/cni' };
}

function conf(type: string, dataDir: string, subnet: string): string {
  return JSON.stringify({ cniVersion: '1.0.0', name: 'bench', ipam: { type, dataDir, ranges: [[{ subnet }]] } });
}

function row(label: string, ms: number, base: number, baseLabel: string): string {
  return `${label.padEnd(44)} ${ms.toFixed(1).padStart(9)} ms   ${(ms / base).toFixed(2)} × ${baseLabel}`;
}

const plugin = installedPlugin();
const root = join(tmpdir(), `ipwarden-bench-${process.pid}`);
mkdirSync(root, { recursive: true });
const lines: string[] = [];
const say = (s: string) => {
  lines.push(s);
  console.log(s);
};
say(`machine: ${cpus().length} × ${cpus()[0]?.model ?? '?'}, node ${process.version}`);

try {
  // 1. ADD and DEL vs the Node floor vs host-local (interleaved so drift hits all alike).
  const floor: number[] = [];
  const oursAdd: number[] = [];
  const oursDel: number[] = [];
  const upAdd: number[] = [];
  const upDel: number[] = [];
  const haveUp = existsSync(HOST_LOCAL);
  for (let i = 0; i < RUNS; i++) {
    floor.push(timeMs(process.execPath, ['-e', '0'], {}, ''));
    const dOurs = join(root, 'small-ours');
    oursAdd.push(timeMs(plugin, [], cniEnv('ADD', `c${i}`), conf('ipwarden', dOurs, '10.1.0.0/16')));
    oursDel.push(timeMs(plugin, [], cniEnv('DEL', `c${i}`), conf('ipwarden', dOurs, '10.1.0.0/16')));
    if (haveUp) {
      const dUp = join(root, 'small-up');
      upAdd.push(timeMs(HOST_LOCAL, [], cniEnv('ADD', `c${i}`), conf('host-local', dUp, '10.1.0.0/16')));
      upDel.push(timeMs(HOST_LOCAL, [], cniEnv('DEL', `c${i}`), conf('host-local', dUp, '10.1.0.0/16')));
    }
  }
  const mFloor = median(floor);
  say(`\n1. one ADD and one DEL per process, median of ${RUNS} (target: ipwarden ≤ 1.3 × node floor)`);
  say(row('node -e 0 (Node floor)', mFloor, mFloor, 'floor'));
  say(row('ipwarden ADD', median(oursAdd), mFloor, 'floor'));
  say(row('ipwarden DEL', median(oursDel), mFloor, 'floor'));
  if (haveUp) {
    say(row('host-local ADD', median(upAdd), mFloor, 'floor'));
    say(row('host-local DEL', median(upDel), mFloor, 'floor'));
  }

  // 2 + 3. A fully reserved /16.
  const N = 65534;
  const mkFull = (dir: string) => {
    mkdirSync(dir, { recursive: true });
    for (let i = 1; i <= N; i++) {
      // Every host address of the /16, 10.9.0.1 … 10.9.255.254 (the gateway's file is inert).
      writeFileSync(join(dir, `10.9.${(i >> 8) & 255}.${i & 255}`), `${i.toString(16).padStart(64, '0')}\r\neth0`);
    }
  };
  const bigOurs = join(root, 'big-ours', 'bench');
  const bigUp = join(root, 'big-up', 'bench');
  mkFull(bigOurs);
  if (haveUp) mkFull(bigUp);
  const addOurs: number[] = [];
  const addUp: number[] = [];
  for (let i = 0; i < BIG_RUNS; i++) {
    addOurs.push(timeMs(plugin, [], cniEnv('ADD', 'newcomer'), conf('ipwarden', join(root, 'big-ours'), '10.9.0.0/16')));
    if (haveUp) addUp.push(timeMs(HOST_LOCAL, [], cniEnv('ADD', 'newcomer'), conf('host-local', join(root, 'big-up'), '10.9.0.0/16')));
  }
  say(`\n2. ADD on a fully reserved /16 (${N} reservations), median of ${BIG_RUNS} (target ≤ 0.5 × host-local)`);
  if (haveUp) {
    say(row('host-local ADD (exhausted)', median(addUp), median(addUp), 'host-local'));
    say(row('ipwarden ADD (exhausted)', median(addOurs), median(addUp), 'host-local'));
  } else say(row('ipwarden ADD (exhausted)', median(addOurs), mFloor, 'floor'));

  const victim = (2).toString(16).padStart(64, '0');
  const delOurs: number[] = [];
  const delUp: number[] = [];
  for (let i = 0; i < BIG_RUNS; i++) {
    writeFileSync(join(bigOurs, '10.9.0.2'), `${victim}\r\neth0`);
    delOurs.push(timeMs(plugin, [], cniEnv('DEL', victim), conf('ipwarden', join(root, 'big-ours'), '10.9.0.0/16')));
    if (existsSync(join(bigOurs, '10.9.0.2'))) throw new Error('ipwarden DEL did not release 10.9.0.2');
    if (haveUp) {
      writeFileSync(join(bigUp, '10.9.0.2'), `${victim}\r\neth0`);
      delUp.push(timeMs(HOST_LOCAL, [], cniEnv('DEL', victim), conf('host-local', join(root, 'big-up'), '10.9.0.0/16')));
      if (existsSync(join(bigUp, '10.9.0.2'))) throw new Error('host-local DEL did not release 10.9.0.2');
    }
  }
  say(`\n3. DEL of one container among ${N} reservations, median of ${BIG_RUNS} (target ≤ 1.0 × host-local)`);
  if (haveUp) {
    say(row('host-local DEL', median(delUp), median(delUp), 'host-local'));
    say(row('ipwarden DEL', median(delOurs), median(delUp), 'host-local'));
  } else say(row('ipwarden DEL', median(delOurs), mFloor, 'floor'));

  // 4. `ipwarden leaks` over the /16 against a runtime listing 110 sandboxes, vs the raw floor of
  // reading every file once.
  const ids = Array.from({ length: 110 }, (_, i) => (i + 1).toString(16).padStart(64, '0'));
  const cri = await startFakeCri(join(root, 'cri.sock'), ids);
  try {
    const cli = join(ROOT, 'dist/ipwarden.cjs');
    const leaksJson: number[] = [];
    const leaksTable: number[] = [];
    const floorCat: number[] = [];
    for (let i = 0; i < BIG_RUNS; i++) {
      floorCat.push(await timeMsAsync('sh', ['-c', `find ${bigOurs} -type f -exec cat {} + > /dev/null`]));
      leaksJson.push(await timeMsAsync('sh', ['-c', `${process.execPath} ${cli} leaks --data-dir ${join(root, 'big-ours')} --runtime-endpoint ${cri.endpoint} --json > /dev/null`]));
      leaksTable.push(await timeMsAsync('sh', ['-c', `${process.execPath} ${cli} leaks --data-dir ${join(root, 'big-ours')} --runtime-endpoint ${cri.endpoint} > /dev/null`]));
    }
    const mCat = median(floorCat);
    say(`\n4. leaks over ${N} reservations, runtime listing ${ids.length} sandboxes, median of ${BIG_RUNS} (target ≤ 1.5 × floor)`);
    say(row('find DIR -type f -exec cat {} + (floor)', mCat, mCat, 'floor'));
    say(row('ipwarden leaks --json', median(leaksJson), mCat, 'floor'));
    say(row('ipwarden leaks (table)', median(leaksTable), mCat, 'floor'));
  } finally {
    await cri.close();
  }
} finally {
  rmSync(root, { recursive: true, force: true });
}
