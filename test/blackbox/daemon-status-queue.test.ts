/**
 * A STATUS that waited behind ADDs (containerd#11186, issue 19 item 5): with one network's lock
 * stuck and 70 ADDs queued, a CNI STATUS through the daemon took about 25 s — it queued behind the
 * 64 request slots — and the daemon logged 0.003 s for it. On containerd 2.x a slow STATUS reads
 * as "the network is not ready" and the node goes NotReady.
 *
 * Real parts: the built daemon (test/helpers/daemon.ts), the static C shim (a copy of the installed
 * one patched to this daemon's socket) exec'd once per request as a runtime does, `DIR/lock` held
 * by another process (test/fixtures/hold-lock.cjs, the lock host-local takes). Asserted:
 *
 * - with 64 ADDs holding the slots (waiting for the lock) and 6 more queued for a slot (each seen
 *   in the daemon's `request queued` line), a STATUS and a VERSION through the shim are answered,
 *   exactly, by the daemon (its `request served` lines; nothing counted by the fallback) before
 *   any ADD completes — an order, not a time;
 * - released, the 70 ADDs succeed with exactly the addresses .2–.71, each once;
 * - every queued ADD's logged `queuedSeconds` and `durationSeconds` are at least the time between
 *   the test seeing its `request queued` line (after its arrival) and the test releasing the lock
 *   (before it could get a slot): the logged duration includes the wait.
 *
 * Addresses: 10.219.51.0/24 (configured nowhere). Needs root and `npm run build`.
 */
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { after, describe, it } from 'node:test';
import { atomicWrite, patchShim } from '../../src/cli/install-cni.ts';
import { installedPlugin, requireOrSkip, ROOT, tempDir } from '../helpers/cni.ts';
import { startTestDaemon, type LogLine, type TestDaemon } from '../helpers/daemon.ts';

const BUNDLE = join(ROOT, 'dist/ipwarden.cjs');
const skip = requireOrSkip(process.getuid?.() === 0 && existsSync(BUNDLE), 'root and a build (npm run build)');

const NET = 'fieldq';
const ADDS = 70;
const SLOTS = 64;
const VERSION_ANSWER = '{"cniVersion":"1.1.0","supportedVersions":["0.1.0","0.2.0","0.3.0","0.3.1","0.4.0","1.0.0","1.1.0"]}\n';

const cleanups: Array<() => void | Promise<void>> = [];
const children: ChildProcess[] = [];
after(async () => {
  for (const c of children) if (c.exitCode === null && c.signalCode === null && c.pid !== undefined) process.kill(c.pid, 'SIGKILL');
  for (const c of cleanups.reverse()) await c();
});

function temp(prefix: string): string {
  const t = tempDir(prefix);
  cleanups.push(t.cleanup);
  return t.dir;
}

interface Ran {
  code: number | null;
  stdout: string;
  stderr: string;
}
/** Exec `path` as a runtime execs a plugin: `env`, the config on stdin. */
function exec(path: string, env: Record<string, string>, stdin: string): Promise<Ran> {
  return new Promise((resolve, reject) => {
    const p = spawn(path, [], { env, stdio: ['pipe', 'pipe', 'pipe'] });
    children.push(p);
    let out = '';
    let err = '';
    p.stdout.on('data', (c: Buffer) => (out += c.toString('utf8')));
    p.stderr.on('data', (c: Buffer) => (err += c.toString('utf8')));
    p.on('error', reject);
    p.on('close', (code) => resolve({ code, stdout: out, stderr: err }));
    p.stdin.on('error', () => undefined);
    p.stdin.end(stdin);
  });
}

const cniEnv = (command: string, containerId = '', netns = ''): Record<string, string> => ({
  PATH: '/usr/bin:/bin',
  CNI_COMMAND: command,
  CNI_CONTAINERID: containerId,
  CNI_IFNAME: 'eth0',
  CNI_NETNS: netns,
  CNI_PATH: '/usr/lib/cni',
});

/** Hold `lockPath` from another process until `release()` resolves (the holder has exited). */
async function holdLock(lockPath: string): Promise<{ release(): Promise<void> }> {
  const c = spawn(process.execPath, [join(ROOT, 'test/fixtures/hold-lock.cjs'), lockPath], { cwd: ROOT, stdio: ['pipe', 'pipe', 'inherit'] });
  children.push(c);
  await new Promise<void>((resolve, reject) => {
    let out = '';
    c.stdout.on('data', (d: Buffer) => {
      out += d.toString();
      if (out.includes('locked\n')) resolve();
    });
    c.once('error', reject);
    c.once('exit', (code) => reject(new Error(`hold-lock exited ${code}`)));
  });
  return {
    release: async () => {
      c.removeAllListeners('exit');
      const gone = new Promise<void>((r) => c.once('close', () => r()));
      c.stdin.end();
      await gone;
    },
  };
}

describe('STATUS and VERSION are answered at once, never behind queued ADDs (containerd#11186)', { skip }, () => {
  it(`one network's lock held, ${ADDS} ADDs queued: STATUS and VERSION answer before any ADD; the queued ADDs' logged durations include their wait`, { timeout: 240_000 }, async () => {
    // A shim copy beside the installed standalone, connecting to this test's daemon.
    const installed = installedPlugin();
    const sockDir = temp('ipw-fq-sock-');
    const socket = join(sockDir, 'plugin.sock');
    const shim = join(dirname(installed), `ipwarden-shim-fq-${process.pid}`);
    atomicWrite(shim, patchShim(readFileSync(installed), { socket }), 0o755);
    cleanups.push(() => rmSync(shim, { force: true }));
    const d: TestDaemon = await startTestDaemon({ socket });
    cleanups.push(async () => {
      await d.stop();
    });

    const dd = temp('ipw-fq-data-');
    mkdirSync(join(dd, NET));
    const lock = await holdLock(join(dd, NET, 'lock'));
    const conf = JSON.stringify({ cniVersion: '1.1.0', name: NET, ipam: { type: 'ipwarden', dataDir: dd, lockTimeout: '10m', ranges: [[{ subnet: '10.219.51.0/24' }]] } });

    /** What completed, in order. */
    const done: string[] = [];
    const adds = Array.from({ length: ADDS }, (_, i) =>
      exec(shim, cniEnv('ADD', `fq-${i}`, '/var/run/netns/ipw-fq'), conf).then((r) => {
        done.push(`ADD fq-${i}`);
        return r;
      }),
    );

    // The 6 ADDs beyond the 64 slots are queued: each `request queued` line, and when the test saw it.
    const seenQueued = new Map<string, number>();
    const isQueued = (l: LogLine): boolean => l.msg === 'request queued: every request slot is busy' && l['command'] === 'ADD';
    while (seenQueued.size < ADDS - SLOTS) {
      await d.waitForLog((l) => isQueued(l) && !seenQueued.has(l['containerId'] as string));
      const t = performance.now();
      for (const l of d.logs) if (isQueued(l) && !seenQueued.has(l['containerId'] as string)) seenQueued.set(l['containerId'] as string, t);
    }
    assert.equal(seenQueued.size, ADDS - SLOTS);
    assert.equal(done.length, 0, 'no ADD completed while the lock is held');

    // STATUS and VERSION through the shim: answered while every ADD still waits.
    // A STATUS or VERSION put in the slots' queue fails the test at once (else it would wait for the lock).
    const notQueued = (command: string): Promise<never> => {
      const q = d.waitForLog((l) => l.msg.startsWith('request queued') && l['command'] === command).then((l) => assert.fail(`${command} was queued: ${JSON.stringify(l)}`));
      q.catch(() => undefined); // settled after the race when the daemon stops: not an unhandled rejection
      return q;
    };
    const status = await Promise.race([exec(shim, cniEnv('STATUS'), conf), notQueued('STATUS')]);
    done.push('STATUS');
    const version = await Promise.race([exec(shim, cniEnv('VERSION'), conf), notQueued('VERSION')]);
    done.push('VERSION');
    assert.deepEqual(status, { code: 0, stdout: '', stderr: '' });
    assert.deepEqual(version, { code: 0, stdout: VERSION_ANSWER, stderr: '' });
    assert.deepEqual(done, ['STATUS', 'VERSION'], 'STATUS and VERSION answered before any ADD');
    // By the daemon, not by the fallback.
    // (Its log is written after the answer: wait for the second VERSION line, after the helper's readiness check.)
    let versions = 0;
    await d.waitForLog((l) => l.msg === 'request served' && l['command'] === 'VERSION' && ++versions === 2);
    assert.deepEqual(
      d.logs.filter((l) => l.msg === 'request served').map((l) => [l['command'], l['result']]),
      [
        ['VERSION', 'ok'], // the helper's readiness check
        ['STATUS', 'ok'],
        ['VERSION', 'ok'],
      ],
    );
    assert.equal(d.logs.some((l) => l.msg.startsWith('request queued') && l['command'] !== 'ADD'), false, 'only ADDs were queued');
    assert.equal(existsSync(join(sockDir, 'standalone-requests.log')), false, 'nothing fell back to the standalone plugin');

    const released = performance.now();
    await lock.release();
    const results = await Promise.all(adds);
    assert.deepEqual(done.slice(0, 2), ['STATUS', 'VERSION']);
    assert.equal(done.length, ADDS + 2);
    const addresses = results.map((r, i) => {
      assert.deepEqual([r.code, r.stderr], [0, ''], `ADD fq-${i}: ${r.stdout}`);
      const j = JSON.parse(r.stdout) as { ips: Array<{ address: string; gateway: string }> };
      assert.equal(j.ips.length, 1);
      assert.equal(j.ips[0]?.gateway, '10.219.51.1');
      return j.ips[0]?.address as string;
    });
    const expected = Array.from({ length: ADDS }, (_, i) => `10.219.51.${i + 2}/24`);
    const byNumber = (a: string, b: string): number => Number(a.split('.')[3]?.split('/')[0]) - Number(b.split('.')[3]?.split('/')[0]);
    assert.deepEqual([...addresses].sort(byNumber), expected, 'each of .2–.71 exactly once');
    assert.equal(readdirSync(join(dd, NET)).filter((n) => n.startsWith('10.')).length, ADDS);

    // The logged durations of the queued ADDs include their wait for a slot.
    for (const [id, seen] of seenQueued) {
      const line = await d.waitForLog((l) => l.msg === 'request served' && l['containerId'] === id);
      const waited = (released - seen) / 1000;
      assert.equal(line['result'], 'ok');
      assert.ok((line['queuedSeconds'] as number) >= waited, `${id}: queuedSeconds ${String(line['queuedSeconds'])} < ${waited} s between its queued line and the lock's release`);
      assert.ok((line['durationSeconds'] as number) >= waited, `${id}: durationSeconds ${String(line['durationSeconds'])} < ${waited} s between its queued line and the lock's release`);
      assert.ok((line['durationSeconds'] as number) >= (line['queuedSeconds'] as number), `${id}: durationSeconds ${String(line['durationSeconds'])} < queuedSeconds ${String(line['queuedSeconds'])}`);
    }
  });
});
