/**
 * Benchmark of the daemon's per-network index (issue 9: "ADD on a fully reserved /16 ≤ 0.05×
 * host-local; DEL among 65,534 ≤ 0.05×"). Ratios are printed, never asserted; not part of
 * `npm test` (nor, yet, of `npm run bench`). Run: `node --import tsx bench/index.ts` (as root, with
 * /usr/lib/cni/host-local). Env: BENCH_INDEX_ROUNDS (default 15), BENCH_INDEX_WARMUP (default 2).
 *
 * Two identical fully reserved /16 directories (65,534 files `id\r\neth0`, 10.90.0.1–10.90.255.254)
 * under /var/tmp (ext4), created once and reused by every round: one for host-local (exec'd, as
 * the runtime runs it), one for ipwarden's daemon path (the plugin's own handlers run in this
 * process over a {@link NetworkIndexes}, exactly the work the daemon does per request; the shim's
 * exec and the socket round trip come on top: a `/bin/true` spawn is measured in the same round as
 * a stand-in for that floor, and the static shim's IPC floor measured in
 * ../shared/reference/fast-path-measurements.md §2.2 was 0.82 ms). Heal hooks are off on both
 * sides (host-local has none; with them, exhaustion would run the reclaim, which reads everything
 * by design).
 *
 * Each round, in an order rotated per round: host-local ADD on the full /16 (fails after scanning)
 * and ipwarden ADD on its full /16 (fails from the index); then a DEL of one container among
 * 65,534 on each side (host-local's victim file is rewritten directly before its DEL; ipwarden's
 * is ADDed through the daemon path into the single free address, which is timed too: "ADD on a /16
 * with one free address"); then, ipwarden only, an ADD right after a foreign change of its
 * directory (a file created and removed by "another writer": the index is refreshed by a readdir
 * diff). Ratios are medians of the per-round ratios, with their interquartile range.
 */
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, unlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { makeHandlers, type PluginDeps } from '../src/cni/commands.ts';
import { pluginMain } from '../src/cni/skel.ts';
import { NetworkIndexes } from '../src/store/file/indexed-store.ts';
import { HOST_LOCAL } from '../test/helpers/cni.ts';

const ROUNDS = Number(process.env['BENCH_INDEX_ROUNDS'] ?? 15);
const WARMUP = Number(process.env['BENCH_INDEX_WARMUP'] ?? 2);
const N = 65534;
const NET = 'ixbench';
const SUBNET = '10.90.0.0/16';

function cniEnv(command: string, id: string): Record<string, string> {
  return { PATH: '/usr/bin:/bin', CNI_COMMAND: command, CNI_CONTAINERID: id, CNI_IFNAME: 'eth0', CNI_NETNS: command === 'DEL' ? '' : '/var/run/netns/ipwarden-index-bench', CNI_PATH: '/usr/lib/cni' };
}

function conf(type: string, dataDir: string): string {
  return JSON.stringify({ cniVersion: '1.0.0', name: NET, ipam: { type, dataDir, ranges: [[{ subnet: SUBNET }]] } });
}

const ipOf = (i: number): string => `10.90.${(i >> 8) & 255}.${i & 255}`;
const idOf = (i: number): string => i.toString(16).padStart(64, '0');

/** Every host address of the /16 reserved (the gateway's file is inert, as in bench/run.ts). */
function mkFull(dir: string): void {
  mkdirSync(dir, { recursive: true });
  for (let i = 1; i <= N; i++) writeFileSync(join(dir, ipOf(i)), `${idOf(i)}\r\neth0`, { mode: 0o600 });
}

/** Wall time of one exec of `cmd`, ms; returns its exit status too. */
function execMs(cmd: string, env: Record<string, string>, input: string): { ms: number; status: number | null; stdout: string } {
  const t0 = process.hrtime.bigint();
  const r = spawnSync(cmd, [], { env, input, encoding: 'utf8' });
  const t1 = process.hrtime.bigint();
  if (r.error) throw r.error;
  return { ms: Number(t1 - t0) / 1e6, status: r.status, stdout: r.stdout };
}

/** One request through the daemon's handlers in this process, ms. */
async function daemonMs(deps: PluginDeps, env: Record<string, string>, input: string): Promise<{ ms: number; status: number; stdout: string }> {
  let stdout = '';
  const stdin = Buffer.from(input, 'utf8');
  const t0 = process.hrtime.bigint();
  const status = await pluginMain(makeHandlers(deps), { env, readStdin: async () => stdin, stdout: (t) => (stdout += t), stderr: () => undefined });
  const t1 = process.hrtime.bigint();
  return { ms: Number(t1 - t0) / 1e6, status, stdout };
}

function quantile(xs: readonly number[], q: number): number {
  const s = [...xs].sort((a, b) => a - b);
  if (s.length === 0) return Number.NaN;
  const pos = (s.length - 1) * q;
  const lo = Math.floor(pos);
  const hi = Math.ceil(pos);
  return (s[lo] as number) + ((s[hi] as number) - (s[lo] as number)) * (pos - lo);
}

function must(ok: boolean, what: string): void {
  if (!ok) throw new Error(what);
}

async function main(): Promise<void> {
  if (!existsSync(HOST_LOCAL)) throw new Error(`${HOST_LOCAL} is needed`);
  const root = mkdtempSync('/var/tmp/ipwarden-index-bench-');
  const ix = new NetworkIndexes();
  try {
    const upData = join(root, 'up');
    const ourData = join(root, 'ours');
    const t0 = Date.now();
    mkFull(join(upData, NET));
    mkFull(join(ourData, NET));
    console.log(`created 2 × ${N} reservation files in ${((Date.now() - t0) / 1000).toFixed(1)} s under ${root}`);
    const deps: PluginDeps = { openStore: (o) => ix.openStore(o), readTextFile: (p) => readFileSync(p, 'utf8') };
    const upConf = conf('host-local', upData);
    const ourConf = conf('ipwarden', ourData);
    const victim = 2;
    const victimId = 'victim';
    // The victim address starts free in our directory (it is ADDed back through the daemon each round).
    unlinkSync(join(ourData, NET, ipOf(victim)));

    const heapBefore = process.memoryUsage().heapUsed;
    const first = await daemonMs(deps, cniEnv('ADD', victimId), ourConf); // builds the index (full read)
    must(first.status === 0, `first ADD failed: ${first.stdout}`);
    const heapAfter = process.memoryUsage().heapUsed;
    console.log(`index build (first request: full read of ${N} files) ${first.ms.toFixed(1)} ms; heap +${((heapAfter - heapBefore) / 1048576).toFixed(1)} MiB`);
    const del0 = await daemonMs(deps, cniEnv('DEL', victimId), ourConf);
    must(del0.status === 0 && !existsSync(join(ourData, NET, ipOf(victim))), 'first DEL failed');
    writeFileSync(join(upData, NET, ipOf(victim)), `${victimId}\r\neth0`, { mode: 0o600 });
    // Fill our free address again with a permanent owner, so both directories are full.
    const filler = await daemonMs(deps, cniEnv('ADD', idOf(victim)), ourConf);
    must(filler.status === 0, `filler ADD failed: ${filler.stdout}`);

    const rows = { upAdd: [] as number[], ourAdd: [] as number[], upDel: [] as number[], ourDel: [] as number[], ourAdd1: [] as number[], ourAddRefresh: [] as number[], floor: [] as number[] };
    const ratios = { add: [] as number[], del: [] as number[], addFloor: [] as number[], delFloor: [] as number[], add1: [] as number[], refresh: [] as number[] };
    for (let round = 0; round < WARMUP + ROUNDS; round++) {
      const r = { upAdd: 0, ourAdd: 0, upDel: 0, ourDel: 0, ourAdd1: 0, refresh: 0, floor: 0 };
      const steps: Array<() => Promise<void>> = [
        async () => {
          const x = execMs(HOST_LOCAL, cniEnv('ADD', `newcomer${round}`), upConf);
          must(x.status !== 0 && x.stdout.includes('no IP addresses available'), `host-local ADD on the full /16 did not fail as expected: ${x.stdout}`);
          r.upAdd = x.ms;
        },
        async () => {
          const x = await daemonMs(deps, cniEnv('ADD', `newcomer${round}`), ourConf);
          must(x.status !== 0 && x.stdout.includes('no IP addresses available'), `ipwarden ADD on the full /16 did not fail as expected: ${x.stdout}`);
          r.ourAdd = x.ms;
        },
        async () => {
          r.floor = execMs('/bin/true', { PATH: '/usr/bin:/bin' }, '').ms;
        },
      ];
      if (round % 2 === 1) steps.reverse();
      for (const s of steps) await s();

      // DEL among 65,534 (host-local's victim rewritten directly; ours ADDed through the daemon).
      const upDel = execMs(HOST_LOCAL, cniEnv('DEL', victimId), upConf);
      must(upDel.status === 0 && !existsSync(join(upData, NET, ipOf(victim))), `host-local DEL failed: ${upDel.stdout}`);
      r.upDel = upDel.ms;
      writeFileSync(join(upData, NET, ipOf(victim)), `${victimId}\r\neth0`, { mode: 0o600 });
      // Make our one free address: release the filler, then ADD the victim into it (timed: ADD on
      // a /16 with one free address, index trusted), then DEL it (timed).
      must((await daemonMs(deps, cniEnv('DEL', idOf(victim)), ourConf)).status === 0, 'filler DEL failed');
      const add1 = await daemonMs(deps, cniEnv('ADD', victimId), ourConf);
      must(add1.status === 0 && add1.stdout.includes(`"${ipOf(victim)}/16"`), `ADD into the one free address failed: ${add1.stdout}`);
      r.ourAdd1 = add1.ms;
      const ourDel = await daemonMs(deps, cniEnv('DEL', victimId), ourConf);
      must(ourDel.status === 0 && !existsSync(join(ourData, NET, ipOf(victim))), 'ipwarden DEL failed');
      r.ourDel = ourDel.ms;
      must((await daemonMs(deps, cniEnv('ADD', idOf(victim)), ourConf)).status === 0, 'filler ADD failed');

      // A foreign change of our directory (another writer's temporary file), then our ADD.
      while (ix.holdsAnyLock) await new Promise((res) => setTimeout(res, 1));
      const foreign = join(ourData, NET, 'foreign-writer.tmp');
      writeFileSync(foreign, 'x');
      unlinkSync(foreign);
      const refreshed = await daemonMs(deps, cniEnv('ADD', `late${round}`), ourConf);
      must(refreshed.status !== 0, 'ADD after a foreign change should fail (full)');
      r.refresh = refreshed.ms;

      if (round < WARMUP) continue;
      rows.upAdd.push(r.upAdd);
      rows.ourAdd.push(r.ourAdd);
      rows.upDel.push(r.upDel);
      rows.ourDel.push(r.ourDel);
      rows.ourAdd1.push(r.ourAdd1);
      rows.ourAddRefresh.push(r.refresh);
      rows.floor.push(r.floor);
      ratios.add.push(r.ourAdd / r.upAdd);
      ratios.del.push(r.ourDel / r.upDel);
      ratios.addFloor.push((r.ourAdd + r.floor) / r.upAdd);
      ratios.delFloor.push((r.ourDel + r.floor) / r.upDel);
      ratios.add1.push(r.ourAdd1 / r.upAdd);
      ratios.refresh.push(r.refresh / r.upAdd);
    }

    const ms = (xs: number[]): string => `${quantile(xs, 0.5).toFixed(2).padStart(8)} ms`;
    const ratio = (xs: number[]): string => `${quantile(xs, 0.5).toFixed(4)} [${quantile(xs, 0.25).toFixed(4)}–${quantile(xs, 0.75).toFixed(4)}]`;
    console.log(`\n${ROUNDS} rounds (+${WARMUP} warm-up), medians; ratio = median of per-round ratios [IQR]`);
    console.log(`host-local ADD, full /16 (fails after scanning)      ${ms(rows.upAdd)}`);
    console.log(`host-local DEL among ${N}                         ${ms(rows.upDel)}`);
    console.log(`/bin/true spawn (stand-in for the shim's exec floor)  ${ms(rows.floor)}`);
    console.log(`daemon ADD, full /16, index trusted                   ${ms(rows.ourAdd)}   ${ratio(ratios.add)} × host-local ADD   (+spawn floor: ${ratio(ratios.addFloor)})   target ≤ 0.05`);
    console.log(`daemon DEL among ${N}, index trusted              ${ms(rows.ourDel)}   ${ratio(ratios.del)} × host-local DEL   (+spawn floor: ${ratio(ratios.delFloor)})   target ≤ 0.05`);
    console.log(`daemon ADD, /16 with one free address                 ${ms(rows.ourAdd1)}   ${ratio(ratios.add1)} × host-local ADD (full)`);
    console.log(`daemon ADD, full /16, right after a foreign change    ${ms(rows.ourAddRefresh)}   ${ratio(ratios.refresh)} × host-local ADD (readdir-diff refresh)`);
    console.log(`index: trusted ${ix.stats.trusted}, refreshed ${ix.stats.refreshed}, rebuilt ${ix.stats.rebuilt}, takeovers ${ix.stats.takeovers}, lingers ${ix.stats.lingers}, cut ${ix.stats.cut}`);
  } finally {
    await ix.close();
    rmSync(root, { recursive: true, force: true });
  }
}

await main();
