/**
 * Daemon fault run (issue 9, docs/daemon.md "When the shim falls back"): an ADD/DEL storm on one
 * /24 (10.87.200.0/24) in one data directory, mixing the installed shim (daemon up on
 * `pluginSocket()`) with upstream host-local, while the test SIGKILLs the daemon several times and
 * restarts it on the same socket. The kill and restart points are chosen by operation count:
 *
 * - an **in-flight** kill: the test takes `DIR/lock` itself, sends one shim ADD, waits until the
 *   daemon has `DIR/lock` open (it only opens it inside a request, waiting for the lock we hold),
 *   SIGKILLs it, then releases the lock: that request died inside the daemon, and its shim must
 *   fall back (the killed daemon never logged it as served, and the ADD still succeeds);
 * - a **blind** kill: as soon as the count is reached and a shim request is outstanding, SIGKILL at
 *   once, wherever the daemon is (between requests, mid-write, before its answer).
 *
 * Between a kill and its restart, shim requests meet a missing or stale socket and fall back at
 * connect. Judged from the plugins' own answers and the files (no timing decides anything):
 *
 * - every ADD and every DEL succeeds, whichever path served it;
 * - no address is held by two containers at once: an address is held from its ADD's answer until
 *   its DEL is sent (not until the DEL's answer: the DEL's process may release the file, and a
 *   concurrent ADD may take and report that address, before the DEL's exit reaches this process);
 * - under `DIR/lock` (test/helpers/reservation-check.ts's rule), every reservation file is
 *   well formed, no owner has two files, and every held container's file is there with its owner;
 * - no DEL is lost: after the storm, the directory has no reservation file; temporary files left
 *   by a killed daemon (`.ipwarden-<pid>-….tmp`, pid = a killed daemon) are allowed until the next
 *   locked ipwarden scan removes them, after which only `lock` and `last_reserved_ip.0` remain;
 * - at least one kill landed while a request was in flight (the in-flight kills, above), and the
 *   shim really fell back (lines in `standalone-requests.log` beside the socket).
 *
 * Needs root, upstream host-local and `npm run build`. Every daemon is ended by pid (SIGKILL or
 * SIGTERM), every temp dir removed, also on failure.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { after, describe, it } from 'node:test';
import { haveHostLocal, HOST_LOCAL, installedPlugin, pluginSocket, requireOrSkip, ROOT, tempDir, type Outcome } from '../helpers/cni.ts';
import { startTestDaemon, type TestDaemon, hasOpen } from '../helpers/daemon.ts';
import { rng } from '../helpers/rng.ts';
import { lockExclusive } from '../../src/store/file/flock.ts';

const NET = 'storm';
const SUBNET = '10.87.200.0/24';
const WORKERS = 4;
const OPS_PER_WORKER = 75; // 4 × 75 = 300 storm operations, plus each worker's final DELs
const SEED = Number(process.env['IPW_STORM_SEED'] ?? 9091);
/** Kill points by completed operation count; `restartAt` likewise. */
const KILLS: ReadonlyArray<{ at: number; mode: 'in-flight' | 'blind'; restartAt: number }> = [
  { at: 30, mode: 'blind', restartAt: 42 },
  { at: 70, mode: 'in-flight', restartAt: 84 },
  { at: 120, mode: 'blind', restartAt: 130 },
  { at: 165, mode: 'in-flight', restartAt: 180 },
  { at: 215, mode: 'blind', restartAt: 225 },
  { at: 250, mode: 'in-flight', restartAt: 262 },
];

const isRoot = process.getuid?.() === 0;
const skip = requireOrSkip(isRoot && haveHostLocal() && existsSync(join(ROOT, 'dist/ipwarden.cjs')), `root, ${HOST_LOCAL} and a build (npm run build)`);

type Via = 'shim' | 'host-local';
interface Ran extends Outcome {
  pid: number;
}

/** Run `bin` with a clean CNI env (PATH + CNI_* only) and the config on stdin; `onSpawn` sees the pid. */
function exec(bin: string, env: Record<string, string>, stdin: string, onSpawn: (pid: number) => void = () => undefined): Promise<Ran> {
  return new Promise((res, rej) => {
    const p = spawn(bin, [], { env });
    let out = '';
    let err = '';
    p.stdout.on('data', (c: Buffer) => (out += c.toString('utf8')));
    p.stderr.on('data', (c: Buffer) => (err += c.toString('utf8')));
    p.on('error', rej);
    p.on('spawn', () => onSpawn(p.pid as number));
    p.on('close', (code) => {
      let json: Record<string, unknown> | null = null;
      try {
        json = out.trim() === '' ? null : (JSON.parse(out) as Record<string, unknown>);
      } catch {
        json = null;
      }
      res({ pid: p.pid as number, exitCode: code ?? -1, stdout: out, stderr: err, json });
    });
    p.stdin.on('error', () => undefined);
    p.stdin.end(stdin);
  });
}


/** Yield until `cond()` holds (the test's timeout bounds it); the pause only spares the CPU. */
async function until(cond: () => boolean): Promise<void> {
  while (!cond()) await new Promise((r) => setTimeout(r, 1));
}

describe('interop: SIGKILL the daemon during an ADD/DEL storm mixed with upstream host-local', { skip }, () => {
  const t = tempDir('ipw-storm-');
  const daemons: TestDaemon[] = [];
  after(async () => {
    for (const d of daemons) await d.stop(); // SIGTERM by pid (no-op for a killed one), removes its temp dir
    t.cleanup();
  });

  it(`${WORKERS} workers × ${OPS_PER_WORKER} ops, ${KILLS.length} SIGKILLs: every ADD/DEL succeeds, one owner per address, no lost DEL`, { timeout: 600_000 }, async (tc) => {
    const shim = installedPlugin();
    const socket = pluginSocket();
    const countLog = join(dirname(socket), 'standalone-requests.log');
    const countStart = existsSync(countLog) ? statSync(countLog).size : 0;
    const dataDir = join(t.dir, 'data');
    const dir = join(dataDir, NET);
    const lockPath = join(dir, 'lock');
    const conf = (type: string) => JSON.stringify({ cniVersion: '1.0.0', name: NET, ipam: { type, dataDir, ranges: [[{ subnet: SUBNET }]] } });
    const envOf = (command: string, id: string): Record<string, string> => ({
      PATH: '/usr/bin:/bin',
      CNI_COMMAND: command,
      CNI_CONTAINERID: id,
      CNI_IFNAME: 'eth0',
      CNI_NETNS: command === 'ADD' ? '/var/run/netns/ipw-storm-none' : '',
      CNI_PATH: '/usr/lib/cni',
    });

    const startDaemon = async (): Promise<TestDaemon> => {
      const d = await startTestDaemon({ socket, logLevel: 'info', args: ['--interval', '1h', '--metrics-address', '127.0.0.1:0'] });
      daemons.push(d);
      return d;
    };
    let daemon = await startDaemon();
    const killedPids: number[] = [];

    const violations: string[] = [];
    /** ip → container holding it (ADD answered, DEL not sent). */
    const ledger = new Map<string, string>();
    /** container → its ip while held. */
    const held = new Map<string, string>();
    let done = 0;
    let shimSent = 0;
    let shimOutstanding = 0;
    let adds = 0;
    let dels = 0;
    const waiters: Array<{ n: number; resolve: () => void }> = [];
    const tick = () => {
      done++;
      for (const w of [...waiters]) {
        if (done >= w.n) {
          waiters.splice(waiters.indexOf(w), 1);
          w.resolve();
        }
      }
    };
    let stormOver = false;
    const opsDone = (n: number): Promise<void> =>
      done >= n || stormOver ? Promise.resolve() : new Promise((resolve) => waiters.push({ n, resolve }));

    const run = async (command: 'ADD' | 'DEL', via: Via, id: string, onSpawn?: (pid: number) => void): Promise<Ran> => {
      const bin = via === 'shim' ? shim : HOST_LOCAL;
      if (via === 'shim') {
        shimSent++;
        shimOutstanding++;
      }
      try {
        return await exec(bin, envOf(command, id), conf(via === 'shim' ? 'ipwarden' : 'host-local'), onSpawn);
      } finally {
        if (via === 'shim') shimOutstanding--;
      }
    };

    const add = async (via: Via, id: string, onSpawn?: (pid: number) => void): Promise<boolean> => {
      const r = await run('ADD', via, id, onSpawn);
      adds++;
      if (r.exitCode !== 0) {
        violations.push(`ADD ${id} via ${via} failed (${r.exitCode}): ${r.stdout} ${r.stderr}`);
        return false;
      }
      const ip = ((r.json?.['ips'] as Array<{ address: string }> | undefined)?.[0]?.address ?? '').split('/')[0] ?? '';
      if (!/^10\.87\.200\.\d+$/.test(ip)) {
        violations.push(`ADD ${id} via ${via} answered no address in ${SUBNET}: ${r.stdout}`);
        return false;
      }
      const prev = ledger.get(ip);
      if (prev !== undefined) violations.push(`${ip} handed to ${id} (via ${via}) while ${prev} holds it`);
      ledger.set(ip, id);
      held.set(id, ip);
      return true;
    };

    const del = async (via: Via, id: string): Promise<void> => {
      const ip = held.get(id);
      if (ip !== undefined) {
        // Complete when its ADD answered; only this DEL may remove it.
        let content: string | null = null;
        try {
          content = readFileSync(join(dir, ip), 'utf8');
        } catch {
          content = null;
        }
        if (content !== `${id}\r\neth0`) violations.push(`${ip} of ${id} vanished or changed owner before its DEL: ${JSON.stringify(content)}`);
        ledger.delete(ip);
        held.delete(id);
      }
      const r = await run('DEL', via, id);
      dels++;
      if (r.exitCode !== 0) violations.push(`DEL ${id} via ${via} failed (${r.exitCode}): ${r.stdout} ${r.stderr}`);
    };

    /** Under DIR/lock: well-formed files, one file per owner, every held container's file present. */
    let fileChecks = 0;
    const checkFiles = async (): Promise<void> => {
      if (!existsSync(dir)) return;
      const lock = await lockExclusive(lockPath, 120);
      try {
        fileChecks++;
        const byOwner = new Map<string, string>();
        const files = new Map<string, string>();
        for (const name of readdirSync(dir)) {
          if (!/^\d+\.\d+\.\d+\.\d+$/.test(name)) continue;
          const content = readFileSync(join(dir, name), 'utf8');
          files.set(name, content);
          if (!/^[a-z0-9-]+\r\neth0$/.test(content)) violations.push(`malformed file ${name}: ${JSON.stringify(content)}`);
          const other = byOwner.get(content);
          if (other !== undefined) violations.push(`owner ${JSON.stringify(content)} has two files: ${other} and ${name}`);
          byOwner.set(content, name);
        }
        for (const [id, ip] of held) {
          if (files.get(ip) !== `${id}\r\neth0`) violations.push(`held ${id} → ${ip}, but the file says ${JSON.stringify(files.get(ip) ?? null)}`);
        }
      } finally {
        lock.release();
      }
    };

    const worker = async (w: number): Promise<void> => {
      const rand = rng(SEED * 31 + w);
      const mine: string[] = [];
      const via = (): Via => (rand() < 0.6 ? 'shim' : 'host-local');
      for (let i = 0; i < OPS_PER_WORKER; i++) {
        if (mine.length > 0 && (rand() < 0.45 || mine.length >= 3)) {
          const id = mine.splice(Math.floor(rand() * mine.length), 1)[0] as string;
          await del(via(), id);
        } else {
          const id = `s-w${w}-${i}`;
          if (await add(via(), id)) mine.push(id);
        }
        tick();
        if (w === 0 && i % 8 === 7) await checkFiles();
      }
      for (const id of mine) {
        await del(via(), id);
        tick();
      }
    };

    /** Containers the in-flight kills added (DEL'd after the storm). */
    const killContainers: string[] = [];
    /** The in-flight kill; true when the kill provably landed inside a request. */
    const killInFlight = async (k: number): Promise<boolean> => {
      const d = daemon;
      for (let attempt = 0; attempt < 5; attempt++) {
        const id = `k${k}-${attempt}`;
        const lock = await lockExclusive(lockPath, 120);
        let shimPid = 0;
        let addP: Promise<boolean>;
        let landed = false;
        try {
          addP = add('shim', id, (pid) => (shimPid = pid));
          // The daemon opens DIR/lock only inside a request (waiting for the lock we hold); the
          // shim's own process has it open only if it fell back before the daemon got the request.
          await until(() => hasOpen(d.pid, lockPath) || (shimPid !== 0 && hasOpen(shimPid, lockPath)));
          if (hasOpen(d.pid, lockPath)) {
            d.kill('SIGKILL');
            await d.exited;
            landed = true;
          }
        } finally {
          lock.release();
        }
        const ok = await addP;
        if (ok) {
          // Handed back to the storm: DEL'd after the storm, through the shim.
          killContainers.push(id);
        }
        if (landed) {
          const served = d.logs.filter((l) => l.msg.startsWith('request served') && l['containerId'] === id);
          assert.deepEqual(served, [], `the killed daemon must not have served ${id}`);
          return true;
        }
        tc.diagnostic(`in-flight kill ${k}, attempt ${attempt}: the shim fell back before the daemon took the request; trying again`);
      }
      return false;
    };

    let inFlightKills = 0;
    const controller = async (): Promise<void> => {
      for (const [k, kill] of KILLS.entries()) {
        await opsDone(kill.at);
        if (stormOver) break;
        const d = daemon;
        if (kill.mode === 'in-flight') {
          if (await killInFlight(k)) inFlightKills++;
          else {
            d.kill('SIGKILL');
            await d.exited;
          }
        } else {
          await until(() => shimOutstanding > 0 || stormOver);
          d.kill('SIGKILL');
          await d.exited;
        }
        const gone = await d.exited;
        assert.equal(gone.signal, 'SIGKILL', `daemon ${d.pid} ended by our SIGKILL`);
        killedPids.push(d.pid);
        await d.stop(); // already dead: removes its temp dir
        await opsDone(kill.restartAt);
        daemon = await startDaemon();
      }
    };

    const storm = Promise.all(Array.from({ length: WORKERS }, (_, w) => worker(w))).finally(() => {
      stormOver = true;
      for (const w of waiters.splice(0)) w.resolve();
    });
    await Promise.all([storm, controller()]);
    for (const id of killContainers) await del('shim', id);
    await checkFiles();

    const lines = existsSync(countLog) ? readFileSync(countLog, 'utf8').slice(countStart).split('\n').filter((l) => l !== '') : [];
    const fallbacks = lines.filter((l) => / (ADD|DEL) /.test(l));
    // 'request served' lines of ADD/DEL (each daemon's readiness VERSION is not a storm request);
    // a daemon killed by SIGKILL loses the log lines still buffered, so this is a lower bound.
    const served = daemons.reduce((n, d) => n + d.logs.filter((l) => l.msg === 'request served' && (l['command'] === 'ADD' || l['command'] === 'DEL')).length, 0);
    tc.diagnostic(
      `seed ${SEED}: ${adds} ADDs, ${dels} DELs, ${shimSent} through the shim (${served} logged served by a daemon, ${fallbacks.length} fallbacks), ` +
        `${killedPids.length} kills (${inFlightKills} proven in flight), ${fileChecks} locked file checks`,
    );

    assert.deepEqual(violations, []);
    assert.equal(killedPids.length, KILLS.length, 'every kill happened before the storm ended');
    assert.ok(inFlightKills >= 1, 'at least one kill landed while a request was in flight');
    assert.ok(fallbacks.length >= inFlightKills, `the shim fell back (${fallbacks.length} fallback lines)`);
    assert.ok(fallbacks.every((l) => / ok$/.test(l)), `every fallback succeeded: ${fallbacks.filter((l) => !/ ok$/.test(l)).join('; ')}`);
    assert.ok(fallbacks.length <= shimSent, 'no more fallbacks than shim requests');
    assert.equal(held.size, 0);
    assert.ok(adds >= 150 && adds + dels >= 300, `${adds} ADDs and ${dels} DELs`);

    // No lost DEL: no reservation file left. A killed daemon's temporary file may remain until the
    // next locked ipwarden scan (any pid other than a killed daemon's is a defect).
    const leftovers = readdirSync(dir).filter((n) => n !== 'lock' && !/^last_reserved_ip\.\d+$/.test(n));
    const temps = leftovers.filter((n) => {
      const m = /^\.ipwarden-(\d+)-[0-9a-z]+\.tmp$/.exec(n);
      return m !== null && killedPids.includes(Number(m[1]));
    });
    assert.deepEqual(leftovers.filter((n) => !temps.includes(n)), [], 'every reservation was released by its DEL');
    if (temps.length > 0) tc.diagnostic(`temporary files of killed daemons: ${temps.join(', ')}`);
    const sweep = await exec(shim, envOf('DEL', 'sweep-none'), conf('ipwarden'));
    assert.equal(sweep.exitCode, 0, sweep.stdout);
    assert.deepEqual(readdirSync(dir).sort(), ['last_reserved_ip.0', 'lock']);
  });
});
