/**
 * The daemon's indexed file store on real files (as root), against the real upstream host-local
 * (/usr/lib/cni/host-local, exec'd) and against the plain FileStore.
 *
 * 1. VERIFY stress, on ext4 (a temp dir under /var/tmp) and on tmpfs (/dev/shm): random
 *    interleaved ADD/DEL on one /24 through the daemon's handlers over a {@link NetworkIndexes}
 *    (in process, as the daemon runs them) and through host-local (real execs, several in flight,
 *    so they contend for `DIR/lock` with our holds and lingers). VERIFY mode compares the index with
 *    a full FileStore scan under the lock at every validation and at the end of every request of
 *    ours; the test requires 0 differences (stale trusted validations included), 0 addresses given
 *    to two live containers, and 0 containers holding two addresses. Run with the default refresh
 *    (small directories re-read completely) and with the readdir diff forced (`fullRebuildBelow: 0`).
 * 2. Differential: the same random sequence of ADD / re-ADD / DEL / static requests / CHECK on a
 *    small dual-stack config with planted legacy, corrupt and unusable entries, through the
 *    indexed store and through the plain FileStore on two fresh directories, gives identical
 *    exit statuses, stdout documents and directory contents (names, bytes, modes) after every step.
 *
 * Outcomes are decided by conditions (the lock, the files), never by time.
 */
import assert from 'node:assert/strict';
import { existsSync, lstatSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { makeHandlers, type PluginDeps } from '../../src/cni/commands.ts';
import { pluginMain } from '../../src/cni/skel.ts';
import { isCanonicalIPName, openFileStore } from '../../src/store/file/file-store.ts';
import { NetworkIndexes, type NetworkIndexesOptions } from '../../src/store/file/indexed-store.ts';
import { haveHostLocal, HOST_LOCAL, requireOrSkip, runCniAsync, type Outcome } from '../helpers/cni.ts';
import { rng } from '../helpers/rng.ts';

const isRoot = process.getuid?.() === 0;
const skip = requireOrSkip(haveHostLocal() && isRoot, `root and ${HOST_LOCAL}`);

const roots: string[] = [];
after(() => {
  for (const d of roots) rmSync(d, { recursive: true, force: true });
});
function tempRoot(base: string): string {
  const d = mkdtempSync(join(base, 'ipwarden-index-interop-'));
  roots.push(d);
  return d;
}

/** Run one CNI command through the plugin's handlers in this process (what the daemon does per request). */
async function runInProcess(deps: PluginDeps, env: Record<string, string>, stdin: string): Promise<Outcome> {
  let stdout = '';
  let stderr = '';
  const exitCode = await pluginMain(makeHandlers(deps), {
    env,
    readStdin: async () => Buffer.from(stdin, 'utf8'),
    stdout: (t) => (stdout += t),
    stderr: (t) => (stderr += t),
  });
  let json: Record<string, unknown> | null = null;
  if (stdout.trim() !== '') json = JSON.parse(stdout) as Record<string, unknown>;
  return { exitCode, stdout, stderr, json };
}

function cniEnv(command: string, containerId: string, ifname = 'eth0', args?: string): Record<string, string> {
  const env: Record<string, string> = {
    PATH: '/usr/bin:/bin',
    CNI_COMMAND: command,
    CNI_CONTAINERID: containerId,
    CNI_IFNAME: ifname,
    CNI_NETNS: command === 'DEL' ? '' : '/var/run/netns/ipwarden-index-test',
    CNI_PATH: '/usr/lib/cni',
  };
  if (args !== undefined) env['CNI_ARGS'] = args;
  return env;
}

/** Deps as the daemon will have them: the indexed store opener, no heal hooks (no runtime here). */
function indexedDeps(ix: NetworkIndexes): PluginDeps {
  return { openStore: (o) => ix.openStore(o), readTextFile: (p) => readFileSync(p, 'utf8') };
}

/** Deps of the plain plugin without heal hooks: `fileDeps`' opener. */
const plainDeps: PluginDeps = {
  openStore: async ({ dataDir, network, create }) => (!create && !existsSync(join(dataDir, network)) ? null : openFileStore({ dataDir, network })),
  readTextFile: (p) => readFileSync(p, 'utf8'),
};

/** The first address of an ADD result (`ips[0].address` without the prefix). */
function addressOf(o: Outcome): string {
  const ips = (o.json?.['ips'] as Array<{ address: string }> | undefined) ?? [];
  assert.equal(ips.length, 1, `one address expected: ${o.stdout}`);
  return (ips[0] as { address: string }).address.split('/')[0] as string;
}

/** Every reservation file of DIR: ip → content. */
function reservations(dir: string): Map<string, string> {
  const out = new Map<string, string>();
  for (const n of readdirSync(dir)) if (isCanonicalIPName(n)) out.set(n, readFileSync(join(dir, n), 'latin1'));
  return out;
}

interface StressOutcome {
  ours: number;
  theirs: number;
}

/**
 * One VERIFY stress run on `base`: `steps` random operations, ours in process, host-local exec'd
 * with up to 3 in flight. Returns how many of each ran; asserts the invariants as it goes.
 */
async function stress(base: string, seed: number, steps: number, opts: NetworkIndexesOptions): Promise<{ run: StressOutcome; ix: NetworkIndexes }> {
  const dataDir = tempRoot(base);
  const net = 'ixstress';
  const dir = join(dataDir, net);
  const conf = (type: string) => JSON.stringify({ cniVersion: '1.0.0', name: net, ipam: { type, dataDir, ranges: [[{ subnet: '10.77.0.0/24' }]] } });
  const ours = conf('ipwarden');
  const theirs = conf('host-local');
  const ix = new NetworkIndexes({ verify: true, ...opts });
  const deps = indexedDeps(ix);
  const r = rng(seed);
  /** Live containers → their address (once the ADD answered). */
  const live = new Map<string, string>();
  const busy = new Set<string>();
  const inflight = new Set<Promise<void>>();
  const run: StressOutcome = { ours: 0, theirs: 0 };
  let next = 0;

  const record = (id: string, o: Outcome, what: string): void => {
    if (o.exitCode !== 0) {
      // The only acceptable failure: the /24 is full.
      assert.match(o.stdout, /no IP addresses available in range set/, `${what} failed: ${o.stdout}${o.stderr}`);
      return;
    }
    const ip = addressOf(o);
    for (const [other, held] of live) assert.notEqual(held, ip, `${what} gave ${ip}, which ${other} holds (duplicate IP)`);
    live.set(id, ip);
  };

  const lingerOver = async (): Promise<void> => {
    // A condition, not a time: our last hold has ended.
    while (ix.holdsAnyLock) await new Promise((res) => setTimeout(res, 1));
  };
  try {
    for (let step = 0; step < steps; step++) {
      // The same number of draws every step, so the sequence of sides and commands is the seed's.
      const [r1, r2, r3] = [r(), r(), r()] as [number, number, number];
      if (step % 25 === 24) {
        // Quiet point: no host-local in flight, our linger over, one request of ours (it validates
        // afresh), linger over again; the next request's validation must then trust the stamp.
        await Promise.all(inflight);
        await lingerOver();
        const id = `quiet${seed}-${next++}`;
        const cut = ix.stats.cut;
        record(id, await runInProcess(deps, cniEnv('ADD', id), ours), `our ADD ${id}`);
        run.ours++;
        await lingerOver();
        // A hold that reached the bound before its linger ended (a slow, loaded machine) marks
        // the stamp suspect: then the next validation must refresh, not trust.
        const cutEarly = ix.stats.cut !== cut;
        const [trusted, refreshed] = [ix.stats.trusted, ix.stats.refreshed + ix.stats.rebuilt];
        const o = await runInProcess(deps, cniEnv('DEL', id), ours);
        run.ours++;
        assert.equal(o.exitCode, 0, o.stdout);
        live.delete(id);
        if (cutEarly) assert.equal(ix.stats.refreshed + ix.stats.rebuilt, refreshed + 1, `step ${step}: a suspect stamp must be refreshed`);
        else assert.equal(ix.stats.trusted, trusted + 1, `step ${step}: an unchanged directory must be trusted`);
        assert.equal(ix.stats.stale, 0, ix.stats.staleDetails.join(' | '));
      }
      const mine = r1 < 0.5;
      const free = [...live.keys()].filter((id) => !busy.has(id));
      const doAdd = free.length === 0 || (live.size < 180 && r2 < 0.6);
      const id = doAdd ? `stress${seed}-${next++}` : (free[Math.floor(r3 * free.length)] as string);
      busy.add(id);
      const cmd = doAdd ? 'ADD' : 'DEL';
      if (mine) {
        const staleBefore = ix.stats.stale;
        const o = await runInProcess(deps, cniEnv(cmd, id), ours);
        run.ours++;
        assert.equal(ix.stats.stale, staleBefore, `step ${step} (${cmd} ${id}): the index differed from a full scan: ${ix.stats.staleDetails.join(' | ')}`);
        if (doAdd) record(id, o, `our ADD ${id}`);
        else {
          assert.equal(o.exitCode, 0, o.stdout);
          live.delete(id);
        }
        busy.delete(id);
      } else {
        const p = runCniAsync(HOST_LOCAL, { command: cmd, containerId: id, ifname: 'eth0', stdin: theirs, netns: cmd === 'DEL' ? '' : '/var/run/netns/ipwarden-index-test' }).then((o) => {
          run.theirs++;
          if (doAdd) record(id, o, `host-local ADD ${id}`);
          else {
            assert.equal(o.exitCode, 0, o.stdout + o.stderr);
            live.delete(id);
          }
          busy.delete(id);
        });
        const tracked: Promise<void> = p.finally(() => inflight.delete(tracked));
        inflight.add(tracked);
        if (inflight.size >= 3) await Promise.race(inflight);
      }
    }
    await Promise.all(inflight);
    // Our last linger over: then read the files unlocked.
    await lingerOver();
    const files = reservations(dir);
    // Every live container holds exactly its address, nobody holds two, nothing else is reserved.
    const byOwner = new Map<string, string[]>();
    for (const [ip, content] of files) {
      const id = content.split('\r\n')[0] as string;
      byOwner.set(id, [...(byOwner.get(id) ?? []), ip]);
    }
    for (const [id, ips] of byOwner) assert.equal(ips.length, 1, `${id} holds ${ips.join(', ')}`);
    assert.deepEqual(new Map([...byOwner].map(([id, ips]) => [id, ips[0] as string])), live);
    assert.equal(ix.stats.stale, 0, ix.stats.staleDetails.join(' | '));
    return { run, ix };
  } finally {
    await Promise.allSettled(inflight);
    await ix.close();
  }
}

const FILE_SYSTEMS: Array<{ name: string; base: string }> = [
  { name: 'ext4 (/var/tmp)', base: '/var/tmp' },
  { name: 'tmpfs (/dev/shm)', base: '/dev/shm' },
];

describe('indexed store VERIFY stress against upstream host-local', { skip }, () => {
  for (const fs of FILE_SYSTEMS) {
    for (const variant of [
      { name: 'default refresh', opts: {} },
      { name: 'readdir diff forced', opts: { fullRebuildBelow: 0 } },
    ]) {
      it(`${fs.name}, ${variant.name}: index = full scan after every request, no duplicate, no container with two addresses`, async (t) => {
        const seed = fs.base === '/dev/shm' ? 91 : 17;
        const { run, ix } = await stress(fs.base, seed + (variant.opts.fullRebuildBelow === 0 ? 1 : 0), 300, variant.opts);
        t.diagnostic(`ops ours ${run.ours} host-local ${run.theirs}; validations trusted ${ix.stats.trusted} refreshed ${ix.stats.refreshed} rebuilt ${ix.stats.rebuilt}; takeovers ${ix.stats.takeovers} handoffs ${ix.stats.handoffs} lingers ${ix.stats.lingers} cut ${ix.stats.cut}`);
        assert.ok(run.ours > 100 && run.theirs > 100, 'both writers ran');
        // The trust path was exercised (else the test would prove nothing about the stamp rule).
        assert.ok(ix.stats.trusted >= 12, 'the quiet points were trusted');
        assert.ok(ix.stats.refreshed + ix.stats.rebuilt > 1, "host-local's changes were seen");
      });
    }
  }
});

describe('indexed store vs plain FileStore: same results, same files', { skip: isRoot ? false : 'needs root (temp dirs under /var/tmp)' }, () => {
  /** DIR as bytes and modes, without the lock file's mode (created by whoever locked first). */
  function dirState(dir: string): Record<string, string> {
    const out: Record<string, string> = {};
    if (!existsSync(dir)) return out;
    for (const n of readdirSync(dir).sort()) {
      const p = join(dir, n);
      const st = lstatSync(p);
      out[n] = st.isDirectory() ? '<dir>' : `${(st.mode & 0o777).toString(8)} ${readFileSync(p).toString('hex')}`;
    }
    return out;
  }

  for (const seed of [3, 5, 8]) {
    it(`seed ${seed}: 400 random ADD / re-ADD / DEL / static / CHECK steps`, async () => {
      const root = tempRoot('/var/tmp');
      const net = 'ixdiff';
      const sides = ['indexed', 'plain'].map((name) => ({ name, dataDir: join(root, name) }));
      const cfg = (dataDir: string, extra: Record<string, unknown> = {}) =>
        JSON.stringify({
          cniVersion: '1.0.0',
          name: net,
          ipam: { type: 'ipwarden', dataDir, ranges: [[{ subnet: '10.78.0.0/28', gateway: '10.78.0.5' }, { subnet: '10.78.1.0/29' }], [{ subnet: 'fd77::/125' }]] },
          ...extra,
        });
      for (const s of sides) {
        const d = join(s.dataDir, net);
        mkdirSync(d, { recursive: true });
        writeFileSync(join(d, '10.78.0.3'), 'legacy1', { mode: 0o600 }); // legacy ID-only record
        writeFileSync(join(d, '10.78.0.9'), '', { mode: 0o600 }); // corrupt
        mkdirSync(join(d, '10.78.1.3')); // unusable entry: name taken
        writeFileSync(join(d, 'fd77::3'), 'other\r\neth0', { mode: 0o600 });
      }
      const ix = new NetworkIndexes();
      try {
        const deps = { indexed: indexedDeps(ix), plain: plainDeps };
        const r = rng(seed);
        const ids = ['legacy1', 'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h', 'i', 'j', 'k', 'other'];
        for (let step = 0; step < 400; step++) {
          const roll = r();
          const id = ids[Math.floor(r() * ids.length)] as string;
          const ifname = r() < 0.8 ? 'eth0' : 'eth1';
          let command = roll < 0.5 ? 'ADD' : roll < 0.9 ? 'DEL' : 'CHECK';
          let args: string | undefined;
          let extra: Record<string, unknown> = {};
          if (command === 'ADD' && r() < 0.15) args = `IP=10.78.${r() < 0.5 ? 0 : 1}.${1 + Math.floor(r() * 14)}`;
          if (command === 'ADD' && r() < 0.05) extra = { runtimeConfig: { ips: [`fd77::${1 + Math.floor(r() * 6)}/125`] } };
          if (command === 'CHECK') extra = { prevResult: { cniVersion: '1.0.0', ips: [] } };
          if (r() < 0.01) command = 'DEL'; // DEL of a container that never existed is fine too
          const outs: Outcome[] = [];
          for (const s of sides) {
            outs.push(await runInProcess(deps[s.name as 'indexed' | 'plain'], cniEnv(command, id, ifname, args), cfg(s.dataDir, extra)));
          }
          const [a, b] = outs as [Outcome, Outcome];
          const what = `step ${step}: ${command} ${id} ${ifname} ${args ?? ''} ${JSON.stringify(extra)}`;
          assert.equal(a.exitCode, b.exitCode, `${what}: exit ${a.stdout} vs ${b.stdout}`);
          assert.equal(a.stdout.replaceAll(sides[0]!.dataDir, 'D'), b.stdout.replaceAll(sides[1]!.dataDir, 'D'), what);
          // Wait for the linger to end before reading the files (a condition, not a time).
          while (ix.holdsAnyLock) await new Promise((res) => setTimeout(res, 1));
          const sa = dirState(join(sides[0]!.dataDir, net));
          const sb = dirState(join(sides[1]!.dataDir, net));
          delete sa['lock'];
          delete sb['lock'];
          assert.deepEqual(sa, sb, what);
        }
        // The run saw exhaustion, static requests and the index's trust path.
        assert.ok(ix.stats.trusted > 100, `trusted ${ix.stats.trusted}`);
        assert.equal(ix.stats.staleHits, 0);
      } finally {
        await ix.close();
      }
      for (const s of sides) assert.ok(statSync(join(s.dataDir, net)).isDirectory());
    });
  }
});
