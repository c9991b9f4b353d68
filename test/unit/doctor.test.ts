/**
 * `ipwarden doctor` in-process through `runMain` on prepared directories: a temporary CNI
 * configuration dir, data dir, plugin bin dir and a prepared procfs tree (mounts, stat btime,
 * process command lines), with a fake runtime sandbox list. Exact findings (ids, severities,
 * evidence). The lock-holder test uses the real /proc with a child process holding the flock.
 */
import { afterEach, beforeEach, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { NOTHING_IN_USE, unreadableEvidence, type UseEvidence } from '../../src/reconcile/evidence.ts';
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { chmodSync, existsSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, utimesSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { once } from 'node:events';
import { AppError } from '../../src/common/errors.ts';
import type { DoctorContext, Finding } from '../../src/cli/doctor.ts';
import { runMain } from '../../src/cli/main.ts';
import type { SandboxInfo } from '../../src/reconcile/sandboxes.ts';

const SNAP = Date.UTC(2025, 0, 1);
const ENDPOINT = 'unix:///run/fake-cri.sock';
const HOUR = 3600;
const HOLD_LOCK = resolve(import.meta.dirname, '../fixtures/hold-lock.cjs');

let root: string;
let confDir: string;
let dataDir: string;
let binDir: string;
let procDir: string;
beforeEach(() => {
  root = mkdtempSync(join(tmpdir(), 'ipwarden-doctor-'));
  confDir = join(root, 'net.d');
  dataDir = join(root, 'networks');
  binDir = join(root, 'bin');
  procDir = join(root, 'proc');
  for (const d of [confDir, dataDir, binDir, procDir]) mkdirSync(d);
  for (const p of ['host-local', 'ipwarden', 'bridge']) {
    writeFileSync(join(binDir, p), '#!/bin/sh\n');
    chmodSync(join(binDir, p), 0o755);
  }
  // The data dir is on a persistent filesystem; the node booted 3 hours before the snapshot
  // (files written earlier than that survived a reboot).
  fakeProc({ mounts: `/dev/vda / ext4 rw,relatime 0 0\n`, btimeSecondsBeforeSnap: 3 * HOUR });
});
afterEach(() => {
  rmSync(root, { recursive: true, force: true });
});

function fakeProc(o: { mounts: string; btimeSecondsBeforeSnap: number; processes?: Record<number, string[]> }): void {
  writeFileSync(join(procDir, 'mounts'), o.mounts);
  writeFileSync(join(procDir, 'stat'), `cpu  1 2 3 4\nbtime ${SNAP / 1000 - o.btimeSecondsBeforeSnap}\nprocesses 42\n`);
  writeFileSync(join(procDir, 'locks'), '');
  for (const [pid, argv] of Object.entries(o.processes ?? {})) {
    mkdirSync(join(procDir, pid), { recursive: true });
    writeFileSync(join(procDir, pid, 'cmdline'), argv.join('\0') + '\0');
    writeFileSync(join(procDir, pid, 'comm'), `${argv[0]}\n`);
  }
}

function conf(file: string, doc: unknown): void {
  writeFileSync(join(confDir, file), JSON.stringify(doc));
}

function reserve(network: string, ip: string, content: string, ageSeconds: number): void {
  const d = join(dataDir, network);
  mkdirSync(d, { recursive: true });
  writeFileSync(join(d, ip), content);
  const t = (SNAP - ageSeconds * 1000) / 1000;
  utimesSync(join(d, ip), t, t);
}

interface Run {
  code: number;
  stdout: string;
  stderr: string;
  delays: number[];
}

async function doctor(
  extra: string[],
  live: readonly string[] | 'unreachable',
  o: { now?: number; procDir?: string; delay?: (ms: number) => Promise<void>; evidence?: UseEvidence } = {},
): Promise<Run> {
  let stdout = '';
  let stderr = '';
  const delays: number[] = [];
  const ctx: DoctorContext = {
    stdout: (t) => void (stdout += t),
    stderr: (t) => void (stderr += t),
    env: { CONTAINER_RUNTIME_ENDPOINT: ENDPOINT },
    now: () => o.now ?? SNAP,
    evidence: () => o.evidence ?? NOTHING_IN_USE,
    sandboxSource: (endpoint) => ({
      endpoint,
      list: async (): Promise<SandboxInfo[]> => {
        if (live === 'unreachable') throw new AppError('RUNTIME_UNAVAILABLE', 'cannot connect to the runtime at unix:///run/fake-cri.sock: ENOENT');
        return live.map((id) => ({ id, state: 'ready' as const }));
      },
    }),
    doctorProbe: {
      procDir: o.procDir ?? procDir,
      delay: async (ms) => {
        delays.push(ms);
        await o.delay?.(ms);
      },
    },
  };
  const code = await runMain(['doctor', '--cni-conf-dir', confDir, '--data-dir', dataDir, '--cni-bin-dir', binDir, ...extra], ctx);
  return { code, stdout, stderr, delays };
}

async function findings(live: readonly string[] | 'unreachable', extra: string[] = []): Promise<{ code: number; findings: Finding[] }> {
  const r = await doctor(['--json', ...extra], live);
  assert.equal(r.stderr, '');
  const doc = JSON.parse(r.stdout) as { findings: Finding[]; summary: Record<string, number> };
  const s = { error: 0, warning: 0, info: 0 };
  for (const f of doc.findings) s[f.severity]++;
  assert.deepEqual(doc.summary, s);
  return { code: r.code, findings: doc.findings };
}

function br20(): void {
  conf('10-cbr0.conflist', {
    cniVersion: '1.0.0',
    name: 'cbr0',
    plugins: [{ type: 'bridge', ipam: { type: 'host-local', ranges: [[{ subnet: '10.42.1.0/28' }]] } }],
  });
  for (let i = 2; i <= 14; i++) reserve('cbr0', `10.42.1.${i}`, `${i === 5 || i === 9 || i === 12 ? 'l' : 'd'}${i}\r\neth0`, 2 * HOUR);
}

function br23(): void {
  conf('kubenet.conf', { cniVersion: '1.0.0', name: 'kubenet', type: 'bridge', ipam: { type: 'host-local', ranges: [[{ subnet: '10.244.1.0/29' }]] } });
  for (let i = 1; i <= 5; i++) reserve('kubenet', `10.244.1.${i + 1}`, `c${i}\r\neth0`, HOUR);
}

describe('ipwarden doctor', () => {
  it('BR-20: a range full of leaks: leaked-reservations (warning) and range-set-full-of-leaks (error), fix gc, exit 1', async () => {
    br20();
    const r = await findings(['l5', 'l9', 'l12']);
    assert.equal(r.code, 1);
    const gc = `ipwarden gc --network cbr0 --data-dir ${dataDir} --cni-conf-dir ${confDir}`;
    assert.deepEqual(r.findings, [
      {
        id: 'range-set-full-of-leaks',
        severity: 'error',
        title: 'cbr0 range set 0 (10.42.1.1-10.42.1.14) is 100% reserved; 10 of the 13 are leaked or corrupt',
        evidence: '13 of 13 addresses reserved (100%), 0 free: 3 live, 0 in grace, 10 leaked, 0 corrupt; releasing the leaked and corrupt ones leaves 3 reserved',
        fix: gc,
      },
      {
        id: 'leaked-reservations',
        severity: 'warning',
        title: 'cbr0: 10 leaked reservations',
        evidence: `10 of 13 reservations in ${join(dataDir, 'cbr0')} belong to sandboxes the runtime does not list and are older than the grace period (5m0s): 10.42.1.2, 10.42.1.3, 10.42.1.4, 10.42.1.6, 10.42.1.7, 10.42.1.8, 10.42.1.10, 10.42.1.11, 10.42.1.13, 10.42.1.14`,
        fix: gc,
      },
    ]);
  });

  it('BR-23: genuinely full (all live): range-set-full, fix = widen or move pods, no leak finding', async () => {
    br23();
    const r = await findings(['c1', 'c2', 'c3', 'c4', 'c5']);
    assert.equal(r.code, 1);
    assert.deepEqual(r.findings, [
      {
        id: 'range-set-full',
        severity: 'error',
        title: 'kubenet range set 0 (10.244.1.1-10.244.1.6) is 100% reserved by sandboxes that exist: genuinely full',
        evidence: '5 of 5 addresses reserved (100%), 0 free: 5 live, 0 in grace, 0 leaked, 0 corrupt',
        fix: `widen the range set (a larger subnet, or another range in ipam.ranges[0] of ${join(confDir, 'kubenet.conf')}) or run fewer pods on this node`,
      },
    ]);
  });

  it('BR-23 second step (c1, c2 gone): the leaks are found, and gc brings the set back under 90%', async () => {
    br23();
    const r = await findings(['c3', 'c4', 'c5']);
    assert.deepEqual(
      r.findings.map((f) => [f.id, f.severity]),
      [
        ['range-set-full-of-leaks', 'error'],
        ['leaked-reservations', 'warning'],
      ],
    );
  });

  it('a healthy node: no findings, exit 0, "no problems found"', async () => {
    br23();
    rmSync(join(dataDir, 'kubenet', '10.244.1.6')); // 3 of 5 reserved, all live
    rmSync(join(dataDir, 'kubenet', '10.244.1.5'));
    const r = await doctor([], ['c1', 'c2', 'c3']);
    assert.equal(r.code, 0);
    assert.equal(r.stdout, 'doctor: no problems found\n');
  });

  it('a range set above 90% but not full is a warning; corrupt files are their own finding', async () => {
    conf('n.conf', { cniVersion: '1.0.0', name: 'n', type: 'bridge', ipam: { type: 'host-local', ranges: [[{ subnet: '10.3.0.0/28' }]] } });
    for (let i = 2; i <= 12; i++) reserve('n', `10.3.0.${i}`, `c${i}\r\neth0`, HOUR); // 11 live
    reserve('n', '10.3.0.14', 'garbage with spaces', HOUR); // corrupt → 12 of 13 (92%), 11 after gc (84%)
    const live = Array.from({ length: 11 }, (_, k) => `c${k + 2}`);
    const r = await findings(live);
    assert.equal(r.code, 0);
    assert.deepEqual(r.findings, [
      {
        id: 'corrupt-reservations',
        severity: 'warning',
        title: 'n: 1 corrupt reservation file',
        evidence: `1 reservation file in ${join(dataDir, 'n')} is empty or unparseable: 10.3.0.14`,
        fix: `ipwarden gc --network n --data-dir ${dataDir} --cni-conf-dir ${confDir}`,
      },
      {
        id: 'range-set-full-of-leaks',
        severity: 'warning',
        title: 'n range set 0 (10.3.0.1-10.3.0.14) is 92% reserved; 1 of the 12 are leaked or corrupt',
        evidence: '12 of 13 addresses reserved (92%), 1 free: 11 live, 0 in grace, 0 leaked, 1 corrupt; releasing the leaked and corrupt ones leaves 11 reserved',
        fix: `ipwarden gc --network n --data-dir ${dataDir} --cni-conf-dir ${confDir}`,
      },
    ]);
  });

  it('entries named like addresses that are no reservation file: one finding per network, with what each is', async () => {
    br23();
    rmSync(join(dataDir, 'kubenet', '10.244.1.6'));
    rmSync(join(dataDir, 'kubenet', '10.244.1.5'));
    const dir = join(dataDir, 'kubenet');
    symlinkSync(join(dir, 'i8-nowhere'), join(dir, '10.244.1.5'));
    let r = await findings(['c1', 'c2', 'c3']);
    assert.deepEqual(r.findings, [
      {
        id: 'unusable-entries',
        severity: 'warning',
        title: 'kubenet: 1 entry named like an address is not a reservation file',
        evidence: `${join(dir, '10.244.1.5')} (a dangling symlink): neither ipwarden nor host-local reads it as a reservation or hands its address out (the name is taken), and gc never removes it`,
        fix: `check that nothing uses it, then remove it: rm ${join(dir, '10.244.1.5')}`,
      },
    ]);
    assert.equal(r.code, 0);
    mkdirSync(join(dir, '10.244.1.6'));
    symlinkSync(join(dir, '10.244.1.6'), join(dir, 'fd00::1'));
    r = await findings(['c1', 'c2', 'c3']);
    assert.equal(
      r.findings[0]?.evidence,
      `${join(dir, '10.244.1.5')} (a dangling symlink), ${join(dir, '10.244.1.6')} (a directory), ${join(dir, 'fd00::1')} (a symlink to a directory): neither ipwarden nor host-local reads them as reservations or hands their addresses out (the names are taken), and gc never removes them`,
    );
  });

  // Which range-set finding: gc is the fix only when it brings the set back to 90% or less.
  const fullness: Array<{ name: string; live: number; leaked: number; want: [string, string, string] }> = [
    { name: '12 live of 13 (92%): genuinely full, warning', live: 12, leaked: 0, want: ['range-set-full', 'warning', 'widen the range set (a larger subnet, or another range in ipam.ranges[0] of NCONF) or run fewer pods on this node'] },
    { name: '12 live + 1 leaked of 13: gc leaves 92%: genuinely full, error, gc frees only 1', live: 12, leaked: 1, want: ['range-set-full', 'error', 'widen the range set (a larger subnet, or another range in ipam.ranges[0] of NCONF) or run fewer pods on this node; GC frees only 1'] },
    { name: '11 live + 2 leaked of 13: gc leaves 84%: leaks, error', live: 11, leaked: 2, want: ['range-set-full-of-leaks', 'error', 'GC'] },
    { name: '11 live of 13 (84%): no finding', live: 11, leaked: 0, want: ['', '', ''] },
  ];
  fullness.forEach((c) =>
    it(`fullness: ${c.name}`, async () => {
      conf('n.conf', { cniVersion: '1.0.0', name: 'n', type: 'bridge', ipam: { type: 'host-local', ranges: [[{ subnet: '10.3.0.0/28' }]] } });
      const live: string[] = [];
      for (let k = 0; k < c.live + c.leaked; k++) {
        const id = k < c.live ? `live${k}` : `gone${k}`;
        if (k < c.live) live.push(id);
        reserve('n', `10.3.0.${k + 2}`, `${id}\r\neth0`, HOUR);
      }
      const r = await findings(live);
      const f = r.findings.find((x) => x.id.startsWith('range-set'));
      const sub = (t: string): string => t.replace('NCONF', join(confDir, 'n.conf')).replace('GC', `ipwarden gc --network n --data-dir ${dataDir} --cni-conf-dir ${confDir}`);
      assert.deepEqual(f === undefined ? ['', '', ''] : [f.id, f.severity, f.fix], c.want.map(sub));
    }),
  );

  it('runtime unreachable: an error finding, and a full range set is only "nearly full" (cause unknown)', async () => {
    br20();
    const r = await findings('unreachable');
    assert.equal(r.code, 1);
    assert.deepEqual(r.findings, [
      {
        id: 'runtime-unreachable',
        severity: 'error',
        title: `container runtime not reachable at ${ENDPOINT}`,
        evidence: 'cannot connect to the runtime at unix:///run/fake-cri.sock: ENOENT; without the runtime no reservation can be judged live or leaked',
        fix: 'start containerd or CRI-O, or name its socket: --runtime-endpoint unix:///run/containerd/containerd.sock (or set CONTAINER_RUNTIME_ENDPOINT); run doctor as root',
      },
      {
        id: 'range-set-nearly-full',
        severity: 'error',
        title: 'cbr0 range set 0 (10.42.1.1-10.42.1.14) is 100% reserved',
        evidence: '13 of 13 addresses reserved (100%), 0 free; 0 corrupt; the runtime could not be asked, so how many are leaked is unknown',
        fix: `make the runtime reachable, then: ipwarden leaks --network cbr0 --data-dir ${dataDir} --cni-conf-dir ${confDir}`,
      },
    ]);
  });

  it('IPAM plugin binaries missing from the bin dirs (ipwarden, host-local, other), and an unusable config', async () => {
    conf('a.conflist', { cniVersion: '1.0.0', name: 'a', plugins: [{ type: 'bridge', ipam: { type: 'ipwarden', subnet: '10.1.0.0/24' } }] });
    conf('b.conf', { cniVersion: '1.0.0', name: 'b', type: 'bridge', ipam: { type: 'host-local', subnet: '10.2.0.0/24' } });
    conf('c.conf', { cniVersion: '1.0.0', name: 'c', type: 'macvlan', ipam: { type: 'whereabouts' } });
    writeFileSync(join(confDir, 'd.conf'), '{');
    const empty = join(root, 'empty-bin');
    mkdirSync(empty);
    let r = await doctor(['--json', '--cni-bin-dir', `${empty}:/nonexistent`], []);
    // --cni-bin-dir is repeatable: the dirs are the union, so binDir (given first) has all but whereabouts
    assert.deepEqual(
      (JSON.parse(r.stdout).findings as Finding[]).map((f) => `${f.id} ${f.title}`),
      ['ipam-plugin-missing IPAM plugin "whereabouts" of c is not installed', `cni-config-invalid CNI configuration ${join(confDir, 'd.conf')} cannot be used`],
    );
    r = await (async () => {
      let stdout = '';
      const ctx: DoctorContext = {
        stdout: (t) => void (stdout += t),
        stderr: () => {},
        env: { CONTAINER_RUNTIME_ENDPOINT: ENDPOINT },
        now: () => SNAP,
        evidence: () => NOTHING_IN_USE,
        sandboxSource: (endpoint) => ({ endpoint, list: async () => [] }),
        doctorProbe: { procDir },
      };
      const code = await runMain(['doctor', '--json', '--cni-conf-dir', confDir, '--data-dir', dataDir, '--cni-bin-dir', `${empty}:/nonexistent`], ctx);
      return { code, stdout, stderr: '', delays: [] };
    })();
    assert.equal(r.code, 1);
    const dirs = `${empty}, /nonexistent`;
    assert.deepEqual(JSON.parse(r.stdout).findings, [
      {
        id: 'ipam-plugin-missing',
        severity: 'error',
        title: 'IPAM plugin "ipwarden" of a is not installed',
        evidence: `${join(confDir, 'a.conflist')} names ipam "type": "ipwarden"; no executable ipwarden in ${dirs}`,
        fix: `ipwarden install-cni --dest ${empty}`,
      },
      {
        id: 'ipam-plugin-missing',
        severity: 'error',
        title: 'IPAM plugin "host-local" of b is not installed',
        evidence: `${join(confDir, 'b.conf')} names ipam "type": "host-local"; no executable host-local in ${dirs}`,
        fix: `install the reference CNI plugins into ${empty} (Debian: apt-get install containernetworking-plugins, then link /usr/lib/cni/host-local into ${empty}), or set "type": "ipwarden" and run: ipwarden install-cni --dest ${empty}`,
      },
      {
        id: 'ipam-plugin-missing',
        severity: 'error',
        title: 'IPAM plugin "whereabouts" of c is not installed',
        evidence: `${join(confDir, 'c.conf')} names ipam "type": "whereabouts"; no executable whereabouts in ${dirs}`,
        fix: `install the "whereabouts" CNI plugin into ${empty}, or change ipam.type in ${join(confDir, 'c.conf')}`,
      },
      {
        id: 'cni-config-invalid',
        severity: 'warning',
        title: `CNI configuration ${join(confDir, 'd.conf')} cannot be used`,
        evidence: `not valid JSON: ${jsonError('{')}`,
        fix: `correct or remove ${join(confDir, 'd.conf')}`,
      },
    ]);
  });

  it('ipam keys neither host-local nor ipwarden reads (a misspelt leakGracePeriod): an info finding naming them; case is ignored as Go ignores it', async () => {
    conf('t.conf', { cniVersion: '1.0.0', name: 't', type: 'bridge', ipam: { type: 'ipwarden', subnet: '10.3.0.0/24', leakGracePeriodd: '1m', DataDir: dataDir, extra: 1 } });
    const r = await findings([]);
    assert.deepEqual(
      r.findings.filter((f) => f.id === 'ipam-key-unknown'),
      [
        {
          id: 'ipam-key-unknown',
          severity: 'info',
          title: `${join(confDir, 't.conf')}: ipam keys "leakGracePeriodd", "extra" are not read`,
          evidence:
            'neither host-local nor ipwarden reads them (ignored, as host-local ignores unknown keys); the keys read, case ignored: type, ranges, routes, dataDir, resolvConf, subnet, rangeStart, rangeEnd, gateway, reclaimOnExhaustion, failStatusOnExhaustion, leakGracePeriod, runtimeEndpoint, lockTimeout, pool, nodeName',
          fix: `correct the spelling in ${join(confDir, 't.conf')} (a misspelt ipwarden key leaves its default in force), or remove them`,
        },
      ],
    );
  });

  it('a cluster pool whose "pool" key is misspelt in ipam, or outside ipam (a .conf and a list\'s plugin, seen by the plugin; a list\'s top level, not): one error finding each, exit 1, no cni-config-invalid for them', async () => {
    const POOL = { name: 'net1-pool', etcd: { endpoints: ['http://10.0.0.5:2379'] } };
    const ranges = [[{ subnet: '10.231.74.0/24' }]];
    conf('a.conf', { cniVersion: '1.0.0', name: 'a', type: 'macvlan', ipam: { type: 'ipwarden', ranges, dataDir, pools: POOL } });
    conf('b.conf', { cniVersion: '1.0.0', name: 'b', type: 'macvlan', pool: POOL, ipam: { type: 'ipwarden', ranges, dataDir } });
    conf('c.conflist', { cniVersion: '1.0.0', name: 'c', plugins: [{ type: 'macvlan', Pool: POOL, ipam: { type: 'ipwarden', ranges, dataDir } }] });
    conf('d.conflist', { cniVersion: '1.0.0', name: 'd', pool: POOL, plugins: [{ type: 'macvlan', ipam: { type: 'ipwarden', ranges, dataDir } }] });
    // Not judged: another IPAM type, and a real pool beside a near miss.
    conf('e.conf', { cniVersion: '1.0.0', name: 'e', type: 'macvlan', pool: POOL, ipam: { type: 'host-local', ranges: [[{ subnet: '10.231.75.0/24' }]], dataDir, pools: 1 } });
    const near = 'ipam key "pools" looks like a misspelt "pool": a cluster pool\'s key is "pool" (inside "ipam"); refused so that the pool\'s addresses are not handed out from node-local files';
    const outside = (k: string): string => `network config key "${k}" is outside "ipam": a cluster pool's key is "pool" inside "ipam"; refused so that the pool's addresses are not handed out from node-local files`;
    const finding = (f: string, name: string, evidence: string): Finding => ({
      id: 'ipam-pool-key-misplaced',
      severity: 'error',
      title: `${join(confDir, f)}: ${name} looks like a cluster pool whose "pool" key is misspelt or outside "ipam"`,
      evidence,
      fix: `in ${join(confDir, f)}, write the pool as "ipam": {"type": "ipwarden", …, "pool": {"name": …, "etcd": {…}}} (docs/cluster.md "Configuration"), or remove the key for a node-local network`,
    });
    const r = await findings([]);
    assert.equal(r.code, 1);
    assert.deepEqual(
      r.findings.filter((f) => f.id === 'ipam-pool-key-misplaced' || f.id === 'cni-config-invalid'),
      [
        finding('a.conf', 'a', `${near}; the plugin refuses its ADD, CHECK and STATUS with code 7`),
        finding('b.conf', 'b', `${outside('pool')}; the plugin refuses its ADD, CHECK and STATUS with code 7`),
        finding('c.conflist', 'c', `${outside('Pool')}; the plugin refuses its ADD, CHECK and STATUS with code 7`),
        finding('d.conflist', 'd', `${outside('pool')}; a key at a list's top level never reaches the plugin, which serves the network from node-local files: every node hands out the same addresses`),
      ],
    );
  });

  it('no configuration at all: an info finding; exit 0', async () => {
    const r = await findings([]);
    assert.equal(r.code, 0);
    assert.deepEqual(r.findings, [
      {
        id: 'no-cni-config',
        severity: 'info',
        title: `no CNI network configuration in ${confDir}`,
        evidence: `${confDir} has no .conf, .conflist or .json file; only the data directory ${dataDir} was inspected`,
        fix: 'pass --cni-conf-dir DIR if the runtime reads its CNI configuration from another directory',
      },
    ]);
  });

  describe('data directory that survives reboots', () => {
    const setup = (): void => {
      conf('n.conf', { cniVersion: '1.0.0', name: 'n', type: 'bridge', ipam: { type: 'host-local', ranges: [[{ subnet: '10.8.0.0/24' }]] } });
      reserve('n', '10.8.0.2', 'alive\r\neth0', 5 * HOUR); // before the boot (3 h ago), but owned by a live sandbox
      reserve('n', '10.8.0.3', 'alive2\r\neth0', 1 * HOUR); // after the boot
    };
    const finding = (): Finding => ({
      id: 'data-dir-survives-reboot',
      severity: 'warning',
      title: `${dataDir} survives reboots and nothing reconciles it`,
      evidence:
        `${dataDir} is on ext4 (mounted at /), not tmpfs; 1 reservation file is older than the last boot (2024-12-31T21:00:00.000Z): n/10.8.0.2; ` +
        'no network there uses "type": "ipwarden" IPAM and no "ipwarden daemon" process runs',
      fix: `run ipwarden gc --data-dir ${dataDir} --cni-conf-dir ${confDir} now and at every boot (or keep ipwarden daemon --data-dir ${dataDir} --cni-conf-dir ${confDir} running), or set ipam "type": "ipwarden" in the network configurations`,
    });

    it('persistent filesystem + files older than the boot + host-local + no daemon: warning', async () => {
      setup();
      assert.deepEqual((await findings(['alive', 'alive2'])).findings, [finding()]);
    });

    it('not when the data dir is on tmpfs', async () => {
      setup();
      fakeProc({ mounts: `/dev/vda / ext4 rw 0 0\ntmpfs ${dataDir} tmpfs rw 0 0\n`, btimeSecondsBeforeSnap: 3 * HOUR });
      assert.deepEqual((await findings(['alive', 'alive2'])).findings, []);
    });

    it('not when an ipwarden daemon runs', async () => {
      setup();
      fakeProc({
        mounts: '/dev/vda / ext4 rw 0 0\n',
        btimeSecondsBeforeSnap: 3 * HOUR,
        processes: { 1: ['/sbin/init'], 4242: ['node', '/usr/lib/node_modules/ipwarden/bin/ipwarden', 'daemon', '--interval', '1m'] },
      });
      assert.deepEqual((await findings(['alive', 'alive2'])).findings, []);
    });

    it('not when the network uses ipwarden IPAM', async () => {
      setup();
      conf('n.conf', { cniVersion: '1.0.0', name: 'n', type: 'bridge', ipam: { type: 'ipwarden', ranges: [[{ subnet: '10.8.0.0/24' }]] } });
      assert.deepEqual((await findings(['alive', 'alive2'])).findings, []);
    });

    it('not when every file is newer than the boot', async () => {
      setup();
      fakeProc({ mounts: '/dev/vda / ext4 rw 0 0\n', btimeSecondsBeforeSnap: 6 * HOUR });
      assert.deepEqual((await findings(['alive', 'alive2'])).findings, []);
    });
  });

  it('overlapping ranges across configs, and an address reserved in both networks', async () => {
    conf('a.conf', { cniVersion: '1.0.0', name: 'a', type: 'bridge', ipam: { type: 'host-local', ranges: [[{ subnet: '10.5.0.0/24' }]] } });
    conf('b.conflist', { cniVersion: '1.0.0', name: 'b', plugins: [{ type: 'bridge', ipam: { type: 'host-local', ranges: [[{ subnet: '10.5.0.0/25' }], [{ subnet: 'fd00::/120' }]] } }] });
    conf('c.conf', { cniVersion: '1.0.0', name: 'c', type: 'bridge', ipam: { type: 'host-local', ranges: [[{ subnet: '10.6.0.0/24' }]] } });
    reserve('a', '10.5.0.7', 'pa\r\neth0', HOUR);
    reserve('a', '10.5.0.200', 'pa2\r\neth0', HOUR); // not in b's range
    reserve('b', '10.5.0.7', 'pb\r\nnet1', HOUR);
    const r = await findings(['pa', 'pa2', 'pb']);
    assert.equal(r.code, 1);
    assert.deepEqual(r.findings, [
      {
        id: 'duplicate-address',
        severity: 'error',
        title: '10.5.0.7 is reserved in both a and b',
        evidence: `${join(dataDir, 'a', '10.5.0.7')}: pa eth0, live; ${join(dataDir, 'b', '10.5.0.7')}: pb net1, live`,
        fix: 'find which pod really uses 10.5.0.7 and recreate the other one (its reservation is then released by DEL); then give a and b disjoint ranges',
      },
      {
        id: 'overlapping-ranges',
        severity: 'warning',
        title: 'networks a and b have overlapping ranges',
        evidence: `a range set 0 (10.5.0.1-10.5.0.254) overlaps b range set 0 (10.5.0.1-10.5.0.126) (${join(confDir, 'a.conf')}, ${join(confDir, 'b.conflist')}); each network allocates on its own, so both can hand out the same address`,
        fix: `give each network its own subnet: change ipam.ranges in ${join(confDir, 'a.conf')} or ${join(confDir, 'b.conflist')}`,
      },
    ]);
  });

  describe('kernel evidence (issue 7)', () => {
    const cbr0 = (): void =>
      conf('10-cbr0.conflist', { cniVersion: '1.0.0', name: 'cbr0', plugins: [{ type: 'bridge', ipam: { type: 'host-local', ranges: [[{ subnet: '10.42.1.0/28' }]] } }] });
    const json = (r: Run): Finding[] => (JSON.parse(r.stdout) as { findings: Finding[] }).findings;

    it('an address of a configured range configured in two namespaces is a duplicate (error, both holders); one outside every range is not', async () => {
      cbr0();
      reserve('cbr0', '10.42.1.2', 'd2\r\neth0', HOUR);
      const evidence: UseEvidence = {
        addresses: new Map([
          ['10.42.1.2', [{ netns: 'net:[4026532301]', via: '/proc/812/ns/net' }, { netns: 'net:[4026532455]', via: '/run/netns/cni-9f' }]],
          ['172.17.0.1', [{ netns: 'net:[4026531992]', via: '/proc/1/ns/net' }, { netns: 'net:[4026532500]', via: '/proc/900/ns/net' }]],
        ]),
        inFlight: new Map(),
        incomplete: null,
      };
      const r = await doctor(['--json'], ['d2'], { evidence });
      assert.equal(r.code, 1);
      assert.deepEqual(json(r), [
        {
          id: 'duplicate-address',
          severity: 'error',
          title: '10.42.1.2 (cbr0) is configured in 2 network namespaces',
          evidence: 'net:[4026532301] via /proc/812/ns/net; net:[4026532455] via /run/netns/cni-9f',
          fix: 'two pods share 10.42.1.2: find them (nsenter --net=PATH ip -o addr for each path above, or crictl inspectp) and recreate one of them',
        },
      ]);
    });

    it('addresses configured in a namespace with no reservation file in a range of a network: one warning naming each and its namespaces; the gateway, reserved ones and addresses outside the ranges are not', async () => {
      cbr0();
      reserve('cbr0', '10.42.1.2', 'd2\r\neth0', HOUR);
      const holders = (...h: Array<[string, string]>) => h.map(([netns, via]) => ({ netns, via }));
      const one: UseEvidence = {
        addresses: new Map([
          ['10.42.1.1', holders(['net:[4026531992]', '/proc/1/ns/net'])], // the bridge's gateway on the host
          ['10.42.1.2', holders(['net:[4026532301]', '/proc/812/ns/net'])], // reserved
          ['10.42.1.9', holders(['net:[4026532455]', '/run/netns/cni-9f'])],
          ['10.42.2.7', holders(['net:[4026532500]', '/proc/900/ns/net'])], // in no range
        ]),
        inFlight: new Map(),
        incomplete: null,
      };
      const fix = `find what uses it (nsenter --net=PATH ip -o addr for each path above, or crictl inspectp): a pod of cbr0 whose file was deleted — ipwarden gc --network cbr0 --data-dir ${dataDir} --cni-conf-dir ${confDir} re-reserves the addresses of ready sandboxes the runtime reports; another network or IPAM using this range — give them disjoint ranges`;
      const r1 = await doctor(['--json'], ['d2'], { evidence: one });
      assert.equal(r1.code, 0);
      assert.deepEqual(json(r1), [
        {
          id: 'unreserved-configured-address',
          severity: 'warning',
          title: '10.42.1.9 (cbr0) is configured in a network namespace and has no reservation file',
          evidence: `10.42.1.9 in net:[4026532455] via /run/netns/cni-9f; ${join(dataDir, 'cbr0')} has no file for it: the standalone plugin and host-local can hand it out to a new pod (ADDs served by ipwarden daemon skip it)`,
          fix,
        },
      ]);
      const three: UseEvidence = {
        ...one,
        addresses: new Map([
          ...one.addresses,
          ['10.42.1.12', holders(['net:[4026532600]', '/proc/950/ns/net'], ['net:[4026532601]', '/proc/951/ns/net'])],
          ['10.42.1.10', holders(['net:[4026532455]', '/run/netns/cni-9f'])],
        ]),
      };
      const r3 = await doctor(['--json'], ['d2'], { evidence: three });
      assert.deepEqual(
        json(r3).map((f) => [f.id, f.severity, f.title, f.evidence, f.fix]),
        [
          [
            'duplicate-address',
            'error',
            '10.42.1.12 (cbr0) is configured in 2 network namespaces',
            'net:[4026532600] via /proc/950/ns/net; net:[4026532601] via /proc/951/ns/net',
            'two pods share 10.42.1.12: find them (nsenter --net=PATH ip -o addr for each path above, or crictl inspectp) and recreate one of them',
          ],
          [
            'unreserved-configured-address',
            'warning',
            'cbr0: 3 addresses are configured in network namespaces and have no reservation file',
            '10.42.1.9 in net:[4026532455] via /run/netns/cni-9f, 10.42.1.10 in net:[4026532455] via /run/netns/cni-9f, ' +
              '10.42.1.12 in net:[4026532600] via /proc/950/ns/net and net:[4026532601] via /proc/951/ns/net; ' +
              `${join(dataDir, 'cbr0')} has no file for them: the standalone plugin and host-local can hand them out to a new pod (ADDs served by ipwarden daemon skip them)`,
            fix.replace('find what uses it', 'find what uses each'),
          ],
        ],
      );
    });

    it('incomplete evidence is a warning that says what to change', async () => {
      cbr0();
      const r = await doctor(['--json'], [], { evidence: unreadableEvidence('not running as root (uid 1000)') });
      assert.deepEqual(json(r), [
        {
          id: 'kernel-evidence-incomplete',
          severity: 'warning',
          title: 'cannot see every network namespace of the node',
          evidence: 'not running as root (uid 1000); an address configured in a namespace that cannot be seen may be in use, so gc and the plugin release nothing they cannot verify',
          fix: 'run ipwarden as root in the host PID namespace with /run/netns visible (DaemonSet: hostPID: true and a hostPath mount of /run/netns)',
        },
      ]);
    });

    it('pin directories whose host view cannot be read are named as the cause (issue 17)', async () => {
      cbr0();
      const why = "cannot read the host's mount namespace (/proc/1/ns/mnt: EACCES; /proc/2/ns/mnt: EACCES): whether this process sees the host's pinned network namespaces cannot be told";
      const evidence: UseEvidence = { ...unreadableEvidence(why), unreadPinDirs: ['/run/netns', '/var/run/netns'] };
      const r = await doctor(['--json'], [], { evidence });
      assert.deepEqual(json(r), [
        {
          id: 'kernel-evidence-incomplete',
          severity: 'warning',
          title: "cannot see the host's pinned network namespaces in /run/netns, /var/run/netns",
          evidence: `${why}; an address configured in a namespace that cannot be seen may be in use, so gc and the plugin release nothing they cannot verify`,
          fix: "run ipwarden in the host's mount namespace, or let it read the host's view through /proc/1/root (DaemonSet: hostPID: true, SYS_PTRACE) and mount these directories with mountPropagation: HostToContainer",
        },
      ]);
    });

    it('after a backward clock step: clock-skew, and a full range of future-stamped leaks is not called genuinely full', async () => {
      cbr0();
      for (let i = 2; i <= 14; i++) reserve('cbr0', `10.42.1.${i}`, `d${i}\r\neth0`, -HOUR);
      const f = json(await doctor(['--json'], []));
      assert.deepEqual(
        f.map((x) => [x.id, x.title]),
        [
          ['range-set-full', 'cbr0 range set 0 (10.42.1.1-10.42.1.14) is 100% reserved; 13 of the 13 are within the grace period (13 stamped in the future), not yet judged'],
          ['clock-skew', '13 reservation files are stamped in the future (up to 1h0m ahead)'],
        ],
      );
      assert.equal(f.some((x) => x.title.includes('genuinely full')), false);
    });
  });

  it('human output: one block per finding and a summary line', async () => {
    br23();
    const r = await doctor([], ['c1', 'c2', 'c3', 'c4', 'c5']);
    assert.equal(r.code, 1);
    assert.equal(
      r.stdout,
      [
        'ERROR  range-set-full: kubenet range set 0 (10.244.1.1-10.244.1.6) is 100% reserved by sandboxes that exist: genuinely full',
        '  evidence: 5 of 5 addresses reserved (100%), 0 free: 5 live, 0 in grace, 0 leaked, 0 corrupt',
        `  fix:      widen the range set (a larger subnet, or another range in ipam.ranges[0] of ${join(confDir, 'kubenet.conf')}) or run fewer pods on this node`,
        '',
        'doctor: 1 error, 0 warnings, 0 info',
        '',
      ].join('\n'),
    );
  });

  it('a fix command carries the options doctor was given (--cni-conf-dir, --runtime-endpoint, --grace), shell-quoted; run as printed, gc reaches the same verdict', async () => {
    // A data dir and a runtime socket whose paths hold a space and a quote; no CONTAINER_RUNTIME_ENDPOINT.
    const dd = join(root, "data dir's");
    const ep = `unix://${join(root, 'cri sock', "it's.sock")}`;
    conf('10-trial.conf', { cniVersion: '1.0.0', name: 'trial-leak', type: 'bridge', ipam: { type: 'host-local', subnet: '10.237.43.0/24', dataDir: dd } });
    // Owner gone, 3 minutes old: leaked under --grace 2m, still in grace under the default 5m.
    mkdirSync(join(dd, 'trial-leak'), { recursive: true });
    writeFileSync(join(dd, 'trial-leak', '10.237.43.5'), 'gone\r\neth0');
    utimesSync(join(dd, 'trial-leak', '10.237.43.5'), (SNAP - 180_000) / 1000, (SNAP - 180_000) / 1000);
    const asked: string[] = [];
    const out = { stdout: '', stderr: '' };
    const ctx: DoctorContext = {
      stdout: (t) => void (out.stdout += t),
      stderr: (t) => void (out.stderr += t),
      env: {},
      now: () => SNAP,
      evidence: () => NOTHING_IN_USE,
      socketExists: () => false,
      sandboxSource: (endpoint) => {
        asked.push(endpoint);
        return {
          endpoint,
          list: async (): Promise<SandboxInfo[]> => {
            if (endpoint !== ep) throw new AppError('RUNTIME_UNAVAILABLE', `cannot connect to the runtime at ${endpoint}: ENOENT`);
            return [];
          },
        };
      },
      doctorProbe: { procDir, delay: async () => {} },
    };
    const code = await runMain(['doctor', '--cni-conf-dir', confDir, '--data-dir', dd, '--cni-bin-dir', binDir, '--runtime-endpoint', ep, '--grace', '2m', '--json'], ctx);
    assert.equal(out.stderr, '');
    assert.equal(code, 0);
    const fix = `ipwarden gc --network trial-leak --data-dir '${root}/data dir'\\''s' --cni-conf-dir ${confDir} --runtime-endpoint 'unix://${root}/cri sock/it'\\''s.sock' --grace 2m`;
    assert.deepEqual(
      (JSON.parse(out.stdout) as { findings: Finding[] }).findings.map((f) => [f.id, f.fix]),
      [['leaked-reservations', fix]],
    );

    // The printed command, split by a real shell, run as is.
    const sh = spawnSync('sh', ['-c', `printf '%s\\0' ${fix}`], { encoding: 'utf8' });
    assert.equal(sh.status, 0);
    const argv = sh.stdout.split('\0').slice(0, -1);
    assert.deepEqual(argv, ['ipwarden', 'gc', '--network', 'trial-leak', '--data-dir', dd, '--cni-conf-dir', confDir, '--runtime-endpoint', ep, '--grace', '2m']);
    out.stdout = '';
    const gc = await runMain(argv.slice(1), ctx);
    assert.equal(out.stderr, '');
    assert.equal(gc, 0);
    assert.ok(out.stdout.endsWith('1 reservation: 0 live, 0 grace, 1 leaked, 0 corrupt\nreleased trial-leak 10.237.43.5 (leaked)\nreleased 1\n'), out.stdout);
    assert.equal(existsSync(join(dd, 'trial-leak', '10.237.43.5')), false);
    assert.deepEqual([...new Set(asked)], [ep]);
  });

  describe('a lock held for long (real /proc/locks, a child process holding the flock)', () => {
    let child: ChildProcess | null = null;
    afterEach(async () => {
      if (child !== null && child.exitCode === null) {
        child.stdin?.end();
        await once(child, 'exit');
      }
      child = null;
    });

    async function holdLock(path: string): Promise<ChildProcess> {
      const c = spawn(process.execPath, [HOLD_LOCK, path], { stdio: ['pipe', 'pipe', 'inherit'] });
      child = c;
      let out = '';
      for await (const chunk of c.stdout as AsyncIterable<Buffer>) {
        out += chunk.toString();
        if (out.includes('locked\n')) break;
      }
      assert.equal(out, 'locked\n');
      return c;
    }

    it('names the pid and the command, re-checks after the injected delay, and does not read that network', async () => {
      br23();
      const lock = join(dataDir, 'kubenet', 'lock');
      const c = await holdLock(lock);
      const now = Date.now(); // files written "now - 1h": newer than the real boot, no reboot finding
      const r = await doctor(['--json'], ['c1', 'c2', 'c3', 'c4', 'c5'], { now, procDir: '/proc' });
      assert.deepEqual(r.delays, [200]);
      assert.equal(r.code, 1);
      const cmd = `${process.execPath} ${HOLD_LOCK} ${lock}`;
      assert.deepEqual(JSON.parse(r.stdout).findings, [
        {
          id: 'lock-held',
          severity: 'error',
          title: `kubenet: lock held for long by pid ${c.pid} (node)`,
          evidence: `${lock} is held by pid ${c.pid} (${cmd}) [FLOCK WRITE] and still held 200 ms later; every ADD and DEL of kubenet waits for it; this network's reservations were not read`,
          fix: `see what pid ${c.pid} is doing (cat /proc/${c.pid}/stack; ls -l /proc/${c.pid}/fd) and stop it if it is hung: kill ${c.pid}`,
        },
      ]);
    });

    it('a lock released before the re-check is not a finding', async () => {
      br23();
      const now = Date.now();
      // files written 30 s ago in real time: newer than the real boot (no reboot finding); older than --grace 10s
      for (let i = 2; i <= 6; i++) utimesSync(join(dataDir, 'kubenet', `10.244.1.${i}`), (now - 30_000) / 1000, (now - 30_000) / 1000);
      const c = await holdLock(join(dataDir, 'kubenet', 'lock'));
      const r = await doctor(['--json', '--grace', '10s'], ['c1', 'c2', 'c3', 'c4'], {
        now,
        procDir: '/proc',
        delay: async () => {
          c.stdin?.end();
          await once(c, 'exit');
        },
      });
      assert.deepEqual(r.delays, [200]);
      // the network was read after all: c5 is not listed, so its reservation is a leak
      assert.deepEqual(
        (JSON.parse(r.stdout).findings as Finding[]).map((f) => f.id),
        ['range-set-full-of-leaks', 'leaked-reservations'],
      );
    });
  });
});

function jsonError(text: string): string {
  try {
    JSON.parse(text);
  } catch (e) {
    return (e as Error).message;
  }
  return '';
}
