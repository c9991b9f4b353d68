/**
 * Issue 8 (hardening) through the installed plugin executable: what a runtime, an attacker with
 * write access to the data directory, or a new user sees from the real binary. Names created
 * here start with `i8`.
 */
import assert from 'node:assert/strict';
import { mkdirSync, utimesSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { startFakeCri, type FakeCri } from '../../bench/fake-cri.ts';
import { installedPlugin, runCniAsync, snapshotDir, tempDir, type Invocation } from '../helpers/cni.ts';

const NET = 'i8net';
let bin = '';
const cleanups: Array<() => void | Promise<void>> = [];
before(() => {
  bin = installedPlugin();
});
after(async () => {
  for (const c of cleanups.reverse()) await c();
});

function dataDir(): string {
  const t = tempDir('i8-bb-');
  cleanups.push(t.cleanup);
  return t.dir;
}

function config(dd: string, ipam: Record<string, unknown>, cniVersion = '1.0.0') {
  return { cniVersion, name: NET, ipam: { type: 'ipwarden', dataDir: dd, ...ipam } };
}

// Asynchronous runs: the fake CRI server lives in this process and must keep answering.
const run = (inv: Invocation) => runCniAsync(bin, inv);
const HOUR_AGO = Date.now() / 1000 - 3600;

/** A network directory holding `files` (`a|b` = `a\r\nb`), every file an hour old. */
function prepared(dd: string, files: Record<string, string>): string {
  const dir = join(dd, NET);
  mkdirSync(dir, { recursive: true });
  for (const [name, content] of Object.entries(files)) {
    writeFileSync(join(dir, name), content.replace('|', '\r\n'));
    utimesSync(join(dir, name), HOUR_AGO, HOUR_AGO);
  }
  return dir;
}

/** A fake CRI runtime listing `ids` (READY), on a socket in a fresh temp dir. */
async function fakeRuntime(ids: string[]): Promise<FakeCri> {
  const cri = await startFakeCri(join(dataDir(), 'i8-cri.sock'), ids);
  cleanups.push(() => cri.close());
  return cri;
}

describe('errors raised in the cold part keep their CNI code (issue 8.5)', () => {
  it('a runtime that exists but cannot list its sandboxes while the directory is empty: code 11', async () => {
    const dd = dataDir();
    // A path that exists but is no socket: connect(2) is refused, the runtime cannot be asked.
    const sock = join(dd, 'i8-not-a-socket');
    writeFileSync(sock, '');
    const r = await run({ command: 'ADD', containerId: 'c1', ifname: 'eth0', stdin: config(dd, { ranges: [[{ subnet: '10.8.5.0/29' }]], runtimeEndpoint: sock }) });
    assert.deepEqual(r.json, {
      cniVersion: '1.0.0',
      code: 11,
      msg: `the network directory ${dd}/${NET} has no reservations and the runtime at unix://${sock} cannot be asked which pods already use its addresses: no CRI runtime at unix://${sock}: not a unix socket`,
    });
    assert.deepEqual([r.exitCode, r.stderr], [1, '']);
    assert.deepEqual(snapshotDir(join(dd, NET)), { lock: '' });
  });

  it('an audit log that cannot be opened before a reclaim: code 5, nothing released', async () => {
    const dd = dataDir();
    // A /30 has one allocatable address, .2, held by a sandbox the runtime does not list.
    const dir = prepared(dd, { '10.8.5.2': 'gone|eth0', 'last_reserved_ip.0': '10.8.5.2' });
    mkdirSync(join(dd, 'ipwarden-audit.log')); // a directory where the log should be
    const cri = await fakeRuntime(['c1']);
    const before = snapshotDir(dir);
    const r = await run({ command: 'ADD', containerId: 'c2', ifname: 'eth0', stdin: config(dd, { ranges: [[{ subnet: '10.8.5.0/30' }]], runtimeEndpoint: cri.endpoint }) });
    assert.equal(r.json?.['code'], 5, r.stdout + r.stderr);
    assert.equal(String(r.json?.['msg']).startsWith(`cannot open the audit log ${join(dd, 'ipwarden-audit.log')}: `), true, r.stdout);
    assert.deepEqual([r.exitCode, r.stderr], [1, '']);
    delete before['lock'];
    const afterRun = snapshotDir(dir);
    delete afterRun['lock'];
    assert.deepEqual(afterRun, before);
  });
});
