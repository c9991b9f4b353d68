/**
 * Issue 17 item 10 through the installed plugin executable: the audit log lives at
 * `<dataDir>/.ipwarden-audit.log`, a name no network can have (it starts with `.`), so a network
 * named `ipwarden-audit.log` — the log's name before, and a name upstream host-local accepts —
 * works like any other: its reservations are made by host-local and by ipwarden, and a reclaim in
 * that data dir records to the log. A log at the old name (a regular file) is moved to the new one
 * by the first release recorded.
 *
 * Real parts: the upstream host-local binary, the installed plugin (shim, daemon when the pass
 * has it up), a fake CRI runtime on a unix socket in this process that lists none of the owners.
 * Addresses are in 10.217.18.0/24 (configured nowhere on this host). Needs root (the kernel
 * evidence) and host-local; without them: fails when CI=true, else skips.
 */
import assert from 'node:assert/strict';
import { existsSync, lstatSync, readFileSync, utimesSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { startFakeCri, type FakeCri } from '../../bench/fake-cri.ts';
import { haveHostLocal, HOST_LOCAL, installedPlugin, requireOrSkip, runCni, runCniAsync, snapshotDir, tempDir } from '../helpers/cni.ts';

const isRoot = process.getuid?.() === 0;
const skip = requireOrSkip(isRoot && haveHostLocal(), `root and ${HOST_LOCAL}`);
const RECLAIMED = 'reclaimed on exhaustion: sandbox not listed by the runtime and the file is older than the grace period';
const HOUR_AGO = Date.now() / 1000 - 3600;

let bin = '';
const cleanups: Array<() => void> = [];
before(() => {
  if (skip) return;
  bin = installedPlugin();
});
after(() => {
  for (const c of cleanups.reverse()) c();
});

function dataDir(): string {
  const t = tempDir('i17-audit-');
  cleanups.push(t.cleanup);
  return t.dir;
}

async function runtimeListing(ids: string[]): Promise<FakeCri> {
  const cri = await startFakeCri(join(dataDir(), 'cri.sock'), ids);
  cleanups.push(() => cri.forceClose());
  return cri;
}

/** A /30 (one allocatable address, .2) of network `name` in `dd`. */
const conf = (type: 'ipwarden' | 'host-local', name: string, dd: string, subnet: string, more: Record<string, unknown> = {}) => ({
  cniVersion: '1.0.0',
  name,
  ipam: { type, dataDir: dd, ranges: [[{ subnet }]], ...more },
});

/** The audit log's lines without their `time` and `ageSeconds` (which vary). */
function auditLines(path: string): Array<Record<string, unknown>> {
  return readFileSync(path, 'utf8')
    .trimEnd()
    .split('\n')
    .map((l) => {
      const o = JSON.parse(l) as Record<string, unknown>;
      delete o['time'];
      delete o['ageSeconds'];
      return o;
    });
}

const record = (network: string, ip: string, containerId: string, phase: string) => ({ network, ip, containerId, ifname: 'eth0', verdict: 'leaked', reason: RECLAIMED, phase });

describe('the audit log is out of the network names (issue 17 item 10)', { skip }, () => {
  it('a network named ipwarden-audit.log: host-local and ipwarden reserve in it, a reclaim works, and the record lands in <dataDir>/.ipwarden-audit.log', async () => {
    const dd = dataDir();
    const name = 'ipwarden-audit.log';
    const subnet = '10.217.18.0/30';
    // Upstream host-local accepts the name: the old pod's reservation, made by it, an hour old.
    const hl = runCni(HOST_LOCAL, { command: 'ADD', containerId: 'i17-old', ifname: 'eth0', stdin: conf('host-local', name, dd, subnet) });
    assert.equal(hl.exitCode, 0, hl.stdout + hl.stderr);
    utimesSync(join(dd, name, '10.217.18.2'), HOUR_AGO, HOUR_AGO);
    const cri = await runtimeListing([]);

    const r = await runCniAsync(bin, { command: 'ADD', containerId: 'i17-new', ifname: 'eth0', stdin: conf('ipwarden', name, dd, subnet, { runtimeEndpoint: cri.endpoint }) });
    assert.deepEqual([r.exitCode, r.json, r.stderr], [0, { cniVersion: '1.0.0', ips: [{ address: '10.217.18.2/30', gateway: '10.217.18.1' }] }, ''], r.stdout);
    assert.equal(lstatSync(join(dd, name)).isDirectory(), true);
    assert.deepEqual(snapshotDir(join(dd, name)), { '10.217.18.2': 'i17-new\r\neth0', 'last_reserved_ip.0': '10.217.18.2', lock: '' });
    assert.deepEqual(auditLines(join(dd, '.ipwarden-audit.log')), [record(name, '10.217.18.2', 'i17-old', 'intent'), record(name, '10.217.18.2', 'i17-old', 'released')]);
    assert.equal((lstatSync(join(dd, '.ipwarden-audit.log')).mode & 0o777).toString(8), '600');
  });

  it('a log at the old name <dataDir>/ipwarden-audit.log is moved to .ipwarden-audit.log by the first release, its lines kept before the new ones', async () => {
    const dd = dataDir();
    const name = 'i17net';
    const subnet = '10.217.18.4/30';
    const earlier = '{"time":"2025-01-01T00:00:00.000Z","network":"i17net","ip":"10.217.18.6","containerId":"i17-before","ifname":"eth0","ageSeconds":7200,"verdict":"leaked","reason":"an earlier release","phase":"released"}\n';
    writeFileSync(join(dd, 'ipwarden-audit.log'), earlier, { mode: 0o600 });
    const hl = runCni(HOST_LOCAL, { command: 'ADD', containerId: 'i17-old', ifname: 'eth0', stdin: conf('host-local', name, dd, subnet) });
    assert.equal(hl.exitCode, 0, hl.stdout + hl.stderr);
    utimesSync(join(dd, name, '10.217.18.6'), HOUR_AGO, HOUR_AGO);
    const cri = await runtimeListing([]);

    const r = await runCniAsync(bin, { command: 'ADD', containerId: 'i17-new', ifname: 'eth0', stdin: conf('ipwarden', name, dd, subnet, { runtimeEndpoint: cri.endpoint }) });
    assert.deepEqual([r.exitCode, r.json, r.stderr], [0, { cniVersion: '1.0.0', ips: [{ address: '10.217.18.6/30', gateway: '10.217.18.5' }] }, ''], r.stdout);
    assert.equal(existsSync(join(dd, 'ipwarden-audit.log')), false);
    const text = readFileSync(join(dd, '.ipwarden-audit.log'), 'utf8');
    assert.equal(text.startsWith(earlier), true, text);
    assert.deepEqual(auditLines(join(dd, '.ipwarden-audit.log')).slice(1), [record(name, '10.217.18.6', 'i17-old', 'intent'), record(name, '10.217.18.6', 'i17-old', 'released')]);
  });
});
