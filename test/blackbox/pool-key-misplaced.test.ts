/**
 * A cluster pool whose `pool` key is misspelt (`"pools"` in `ipam`) or misplaced (`"pool"` at the
 * network config's top level, beside a Multus main plugin's keys): before, both were served as a
 * node-local network, so every node handed out the same first address (a fresh-user trial saw two
 * nodes answer 10.80.0.2/24). Now refused with CNI code 7 on every path, with real parts:
 *
 * - the installed standalone plugin exec'd directly;
 * - the installed shim with no daemon listening (its fallback to the standalone, counted in
 *   `standalone-requests.log`);
 * - the installed shim with the built daemon on its socket (test/helpers/daemon.ts; the daemon
 *   answers: nothing is counted), which records no learned pool network.
 *
 * On each: ADD, CHECK and STATUS refused (exact CNI error JSON), nothing written in the data
 * directory; DEL succeeds and releases a node-local reservation an older version handed out for
 * the container. Needs `npm run build` (and root for the daemon's default paths).
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { installedPlugin, pluginSocket, runCni, standalonePlugin } from '../helpers/cni.ts';
import { startTestDaemon, type TestDaemon } from '../helpers/daemon.ts';

const NET = 'net1';
const SUBNET = '10.231.73.0/24';
const POOL = { name: 'net1-pool', etcd: { endpoints: ['http://127.0.0.1:1'] } };
const NEAR = `ipam key "pools" looks like a misspelt "pool": a cluster pool's key is "pool" (inside "ipam"); refused so that the pool's addresses are not handed out from node-local files`;
const OUTSIDE = `network config key "pool" is outside "ipam": a cluster pool's key is "pool" inside "ipam"; refused so that the pool's addresses are not handed out from node-local files`;

/** The two configs of the trial, as Multus hands them to the main plugin (and it to its IPAM plugin). */
const CASES: ReadonlyArray<{ name: string; conf: (dataDir: string, v: string) => Record<string, unknown>; msg: string }> = [
  {
    name: '"pools" instead of "pool" in ipam',
    conf: (dataDir, v) => ({ cniVersion: v, name: NET, type: 'macvlan', master: 'eth0', ipam: { type: 'ipwarden', dataDir, ranges: [[{ subnet: SUBNET }]], pools: POOL } }),
    msg: NEAR,
  },
  {
    name: '"pool" at the network config\'s top level',
    conf: (dataDir, v) => ({ cniVersion: v, name: NET, type: 'macvlan', master: 'eth0', pool: POOL, ipam: { type: 'ipwarden', dataDir, ranges: [[{ subnet: SUBNET }]] } }),
    msg: OUTSIDE,
  },
];

let tmp = '';
let n = 0;
/** A fresh data directory for one case. */
function dataDir(): string {
  const d = join(tmp, `data-${n++}`);
  mkdirSync(d);
  return d;
}

/** Every path, in the data dir: files below it, relative, sorted (directories end in /). */
function tree(dir: string, rel = ''): string[] {
  const out: string[] = [];
  for (const e of readdirSync(join(dir, rel), { withFileTypes: true })) {
    const p = rel === '' ? e.name : `${rel}/${e.name}`;
    if (e.isDirectory()) out.push(`${p}/`, ...tree(dir, p));
    else out.push(p);
  }
  return out.sort();
}

/** ADD, CHECK, STATUS refused, DEL releasing an older version's node-local reservation: through `bin`. */
function refusedOnEveryCommand(bin: () => string): void {
  for (const c of CASES) {
    it(`${c.name}: ADD, CHECK and STATUS → code 7 naming the key, nothing written; DEL → 0, the node-local reservation released`, () => {
      const dd = dataDir();
      const err = (v: string): Record<string, unknown> => ({ cniVersion: v, code: 7, msg: c.msg });
      for (const command of ['ADD', 'CHECK']) {
        const r = runCni(bin(), { command, containerId: 'ctr-a', ifname: 'net1', stdin: c.conf(dd, '1.0.0') });
        assert.deepEqual([r.exitCode, r.json, r.stderr], [1, err('1.0.0'), ''], `${command}: ${r.stdout}`);
      }
      const s = runCni(bin(), { command: 'STATUS', stdin: c.conf(dd, '1.1.0') });
      assert.deepEqual([s.exitCode, s.json], [1, err('1.1.0')], s.stdout);
      assert.deepEqual(tree(dd), []);

      // What an older version's ADD of this config left: a node-local reservation. DEL releases it.
      mkdirSync(join(dd, NET));
      writeFileSync(join(dd, NET, '10.231.73.2'), 'ctr-a\r\nnet1');
      writeFileSync(join(dd, NET, 'last_reserved_ip.0'), '10.231.73.2');
      const d = runCni(bin(), { command: 'DEL', containerId: 'ctr-a', ifname: 'net1', stdin: c.conf(dd, '1.0.0') });
      assert.deepEqual([d.exitCode, d.stdout], [0, ''], d.stderr);
      assert.deepEqual(tree(dd).filter((f) => f !== `${NET}/lock`), [`${NET}/`, `${NET}/last_reserved_ip.0`]);
      // A DEL again (the runtime retries until it succeeds): still 0.
      const again = runCni(bin(), { command: 'DEL', containerId: 'ctr-a', ifname: 'net1', stdin: c.conf(dd, '1.0.0') });
      assert.deepEqual([again.exitCode, again.stdout], [0, ''], again.stderr);
    });
  }
}

before(() => {
  tmp = mkdtempSync(join(tmpdir(), 'ipw-poolkey-'));
});
after(() => {
  rmSync(tmp, { recursive: true, force: true });
});

describe('a misspelt or misplaced pool key: the standalone plugin', () => {
  refusedOnEveryCommand(standalonePlugin);
});

describe('a misspelt or misplaced pool key: the shim, no daemon (its fallback to the standalone)', () => {
  const counted = (): string => join(dirname(pluginSocket()), 'standalone-requests.log');
  before(() => {
    installedPlugin();
    rmSync(counted(), { force: true });
  });
  refusedOnEveryCommand(installedPlugin);
  it('every one of those requests was served by the fallback: counted, in order, ADD CHECK STATUS refused and two DELs per config', () => {
    const lines = readCounted(counted());
    assert.deepEqual(lines, ['ADD error', 'CHECK error', 'STATUS error', 'DEL ok', 'DEL ok', 'ADD error', 'CHECK error', 'STATUS error', 'DEL ok', 'DEL ok']);
  });
});

describe('a misspelt or misplaced pool key: the shim with the daemon up', () => {
  let d: TestDaemon | undefined;
  const counted = (): string => join(dirname(pluginSocket()), 'standalone-requests.log');
  before(async () => {
    installedPlugin();
    rmSync(counted(), { force: true });
    d = await startTestDaemon({ socket: pluginSocket() });
  });
  after(async () => {
    await d?.stop();
  });
  refusedOnEveryCommand(installedPlugin);
  it('the daemon answered every request (nothing counted by the fallback) and learned no pool network', () => {
    assert.equal(existsSync(counted()), false, 'the standalone fallback ran');
    const dm = d as TestDaemon;
    assert.equal(existsSync(join(dm.dataDir, '.ipwarden-pool-networks')), false);
    assert.deepEqual(dm.logs.filter((l) => l.msg === 'pool network learned' || l.msg === 'pool announced' || l.msg === 'pool network not recorded'), []);
  });
});

/** The counting lines without their time stamps. */
function readCounted(p: string): string[] {
  return (existsSync(p) ? readFileSync(p, 'utf8') : '')
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => l.replace(/^\d+ /, ''));
}
