/**
 * Crash safety of the installed plugin: SIGKILL it at random moments of ADD and DEL (seeded)
 * until 200 kills have landed while it was running (the moments are drawn from the run time
 * measured first on this machine). After every attempt:
 *  - no IP-named file is empty or partial (content is exactly `<id>\r\neth0`);
 *  - the lock is not stuck (the next invocation, with a short lockTimeout, succeeds);
 *  - a killed ADD left either no reservation for its container or one complete one, and a later
 *    DEL of that container leaves none.
 */
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { mkdirSync, readdirSync, readFileSync, watch, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { installedPlugin, runCni, standalonePlugin, tempDir } from '../helpers/cni.ts';
import { rng } from '../helpers/rng.ts';

/** Kills that must land while the plugin runs; attempts that finish first do not count. */
const KILLS = 200;
/** Upper bound of attempts (each at a random moment of the calibrated run time). */
const MAX_ATTEMPTS = 1000;
const NET = 'crash';


/**
 * Start the plugin and SIGKILL it after `delayMs`; resolves when it is gone, to `killed` or, when
 * it finished first, its stdout and how long it ran (ms).
 */
function runAndKill(bin: string, env: Record<string, string>, input: string, delayMs: number): Promise<'killed' | { out: string; ranMs: number }> {
  return new Promise((resolve) => {
    const t0 = Date.now();
    const p = spawn(bin, [], { env });
    let out = '';
    p.stdout.on('data', (c: Buffer) => (out += c.toString()));
    const timer = setTimeout(() => p.kill('SIGKILL'), delayMs);
    p.on('close', (_code, signal) => {
      clearTimeout(timer);
      resolve(signal === 'SIGKILL' ? 'killed' : { out, ranMs: Date.now() - t0 });
    });
    p.stdin.on('error', () => undefined);
    p.stdin.end(input);
  });
}

describe('crash safety: SIGKILL during ADD and DEL', () => {
  let bin = '';
  const t = tempDir('ipw-crash-');
  before(() => {
    // The process that writes is the one killed: the standalone plugin (what the shim execs when
    // the daemon is down, in the same process). With the daemon up, killing the shim does not
    // stop the write — the daemon finishes or drops the request; killing the daemon mid-request
    // is test/interop/daemon-storm.test.ts.
    bin = standalonePlugin();
  });
  after(() => t.cleanup());

  it(`${KILLS} kills at random moments never leave a partial file or a stuck lock`, async () => {
    const dir = join(t.dir, NET);
    mkdirSync(dir, { recursive: true });
    // Some reservations so every ADD/DEL has real work (list + walk) to be killed in.
    for (let i = 10; i < 250; i++) writeFileSync(join(dir, `10.66.0.${i}`), `bg${i}\r\neth0`);
    const conf = JSON.stringify({ cniVersion: '1.0.0', name: NET, ipam: { type: 'ipwarden', dataDir: t.dir, lockTimeout: '5s', ranges: [[{ subnet: '10.66.0.0/24' }]] } });
    const env = (cmd: string, id: string) => ({ PATH: '/usr/bin:/bin', CNI_COMMAND: cmd, CNI_CONTAINERID: id, CNI_IFNAME: 'eth0', CNI_NETNS: '/x', CNI_PATH: '/usr/lib/cni' });
    const rand = rng(42);
    const problems: string[] = [];
    let killed = 0;
    let kills = 0;
    // Calibrate: how long does one ADD take here? Kill moments are drawn from [0, 1.2 × that].
    // Every run that finishes before its kill is timed too and the estimate follows the median of
    // the recent ones, so a machine whose load changes during the test still gets its kills in.
    const took: number[] = [];
    for (let i = 0; i < 5; i++) {
      const t0 = Date.now();
      runCni(bin, { command: 'ADD', containerId: `cal${i}`, ifname: 'eth0', stdin: conf });
      took.push(Date.now() - t0);
      runCni(bin, { command: 'DEL', containerId: `cal${i}`, ifname: 'eth0', stdin: conf });
    }
    const runMs = (): number => {
      const recent = took.slice(-9).sort((a, b) => a - b);
      return recent[Math.floor(recent.length / 2)] ?? 50;
    };
    for (let i = 0; i < MAX_ATTEMPTS && killed < KILLS; i++) {
      const id = `k${i}`;
      const isAdd = i % 3 !== 2;
      if (!isAdd) {
        // Give the DEL something to release.
        const pre = runCni(bin, { command: 'ADD', containerId: id, ifname: 'eth0', stdin: conf });
        if (pre.exitCode !== 0) problems.push(`setup ADD ${id}: ${pre.stdout}`);
      }
      // Spread kills over the whole lifetime of the process (Node start-up included).
      const delay = Math.floor(rand() * runMs() * 1.2);
      const res = await runAndKill(bin, env(isAdd ? 'ADD' : 'DEL', id), conf, delay);
      kills++;
      if (res === 'killed') killed++;
      else took.push(res.ranMs);
      for (const name of readdirSync(dir)) {
        if (!/^\d+\.\d+\.\d+\.\d+$/.test(name)) continue;
        const c = readFileSync(join(dir, name), 'utf8');
        if (!/^[a-z]+\d+\r\neth0$/.test(c)) problems.push(`after kill ${i}: ${name} holds ${JSON.stringify(c)}`);
      }
      const mine = readdirSync(dir).filter((n) => /^\d/.test(n) && readFileSync(join(dir, n), 'utf8') === `${id}\r\neth0`);
      if (mine.length > 1) problems.push(`after kill ${i}: ${id} holds ${mine.length} files`);
      // Not stuck: DEL (cleanup) must get the lock within lockTimeout and release everything of id.
      const d = runCni(bin, { command: 'DEL', containerId: id, ifname: 'eth0', stdin: conf });
      if (d.exitCode !== 0) problems.push(`DEL after kill ${i}: ${d.stdout}`);
      const left = readdirSync(dir).filter((n) => /^\d/.test(n) && readFileSync(join(dir, n), 'utf8') === `${id}\r\neth0`);
      if (left.length > 0) problems.push(`after kill ${i}: DEL left ${left.join(',')}`);
    }
    assert.deepEqual(problems, []);
    // The kills must actually land while the plugin runs, not only after it exited.
    assert.ok(killed >= KILLS, `only ${killed} of ${kills} attempts were killed before finishing`);
    const r = runCni(bin, { command: 'ADD', containerId: 'final', ifname: 'eth0', stdin: conf });
    assert.equal(r.exitCode, 0, r.stdout);
    assert.deepEqual(readdirSync(dir).filter((n) => n.startsWith('.')), [], 'leftover temporary files are removed under the lock');
  });
});

/**
 * Start the installed executable as the CLI with `args` and SIGKILL it as soon as `n` IP-named
 * files of `dir` have been removed (inotify through `fs.watch`: the kill lands in the middle of
 * the removals, wherever the process is between two of them). Resolves to whether it was killed.
 */
function cliKilledAfterRemovals(bin: string, args: string[], dir: string, n: number): Promise<boolean> {
  return new Promise((resolve) => {
    let removed = 0;
    const p = spawn(bin, args, { env: { PATH: '/usr/bin:/bin' }, stdio: 'ignore' });
    const watcher = watch(dir, (_event, name) => {
      if (typeof name === 'string' && name.startsWith('10.') && ++removed === n) p.kill('SIGKILL');
    });
    p.on('close', (_code, signal) => {
      watcher.close();
      resolve(signal === 'SIGKILL');
    });
  });
}

describe('crash safety: SIGKILL during ipwarden gc (issue 8.2)', () => {
  let bin = '';
  const t = tempDir('i8-gckill-');
  before(() => {
    bin = installedPlugin();
  });
  after(() => t.cleanup());

  const ROUNDS = 30;
  const PER_ROUND = 60;
  const ipOf = (round: number, i: number) => `10.89.${round}.${i + 1}`;

  it(`every reservation gc removed has its intent in the audit log, wherever gc is killed (${ROUNDS} rounds of ${PER_ROUND} files)`, async () => {
    const dataDir = join(t.dir, 'data');
    const dir = join(dataDir, 'i8gc');
    mkdirSync(dir, { recursive: true });
    const log = join(dataDir, '.ipwarden-audit.log');
    const args = ['gc', '--data-dir', dataDir, '--runtime-endpoint', '/nonexistent/i8-cri.sock'];
    const intents = (): Set<string> => {
      const out = new Set<string>();
      let text = '';
      try {
        text = readFileSync(log, 'utf8');
      } catch {
        return out;
      }
      for (const line of text.split('\n')) {
        let rec: { ip?: unknown; phase?: unknown };
        try {
          rec = JSON.parse(line) as typeof rec;
        } catch {
          continue; // a line torn by a kill mid-write: its removal never followed
        }
        if (rec.phase === 'intent' && typeof rec.ip === 'string') out.add(rec.ip);
      }
      return out;
    };
    const planted: string[] = [];
    const unrecorded = (): string[] => {
      const present = new Set(readdirSync(dir));
      const recorded = intents();
      return planted.filter((ip) => !present.has(ip) && !recorded.has(ip));
    };

    const rand = rng(8);
    let killed = 0;
    const problems: string[] = [];
    for (let round = 0; round < ROUNDS; round++) {
      // Corrupt (empty) files: gc releases them even without a runtime.
      for (let i = 0; i < PER_ROUND; i++) {
        writeFileSync(join(dir, ipOf(round, i)), '');
        planted.push(ipOf(round, i));
      }
      if (await cliKilledAfterRemovals(bin, args, dir, 1 + Math.floor(rand() * (PER_ROUND - 1)))) killed++;
      const missing = unrecorded();
      if (missing.length > 0) problems.push(`round ${round}: removed without an intent on record: ${missing.slice(0, 5).join(', ')} (${missing.length})`);
    }
    const last = spawnSync(bin, args, { env: { PATH: '/usr/bin:/bin' }, encoding: 'utf8' });
    assert.equal(last.status, 1, last.stderr); // the runtime is unreachable: exit 1, corrupt files released
    assert.deepEqual(problems, []);
    assert.deepEqual(readdirSync(dir).filter((n) => n.startsWith('10.')), []);
    assert.deepEqual(unrecorded(), []);
    assert.ok(killed > 0, 'kills landed while gc was removing files');
  });
});
