/**
 * `ipwarden pool leaks` (src/cli/pool.ts over src/pool/leaks.ts): the pure classifier's rules
 * with exact values, and the verb in-process (`runMain` with an injected runtime and kernel
 * evidence) against a real etcd (test/helpers/etcd-cluster.ts). With CI=true a missing
 * /usr/bin/etcd fails instead of skipping.
 */
import { hostname } from 'node:os';
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { AppError } from '../../src/common/errors.ts';
import { runMain } from '../../src/cli/main.ts';
import type { CliContext } from '../../src/cli/context.ts';
import { loadIPAMConfig } from '../../src/ipam/config.ts';
import { PoolAllocator } from '../../src/pool/allocator.ts';
import type { HandleValue } from '../../src/pool/model.ts';
import { classifyPoolHandles } from '../../src/pool/leaks.ts';
import { NOTHING_IN_USE, type UseEvidence } from '../../src/reconcile/evidence.ts';
import { memoryAuditSink } from '../../src/reconcile/audit.ts';
import { Confirmations } from '../../src/reconcile/confirm.ts';
import type { ReconcileDeps } from '../../src/reconcile/options.ts';
import { runPoolPass, type PoolTarget } from '../../src/reconcile/pool-pass.ts';
import type { SandboxInfo } from '../../src/reconcile/sandboxes.ts';
import { EtcdKV } from '../../src/store/etcd/etcd-kv.ts';
import { haveEtcd, startEtcdCluster, type EtcdCluster } from '../helpers/etcd-cluster.ts';

const CI = process.env['CI'] === 'true';
const skip = haveEtcd() || CI ? false : '/usr/bin/etcd not installed';
const SNAP = 1_700_000_600_000;
const h = (id: string, ip: string, at: number): { containerId: string; ifname: string; value: HandleValue } => ({
  containerId: id,
  ifname: 'eth0',
  value: { v: 1, node: 'n1', network: 'net1', at, ips: [{ ip, block: '10.84.0.0-26', ordinal: 2, seq: 1, rangeSet: 0 }] },
});

describe('classifyPoolHandles', () => {
  const handles = [h('live1', '10.84.0.2', SNAP - 3_600_000), h('used1', '10.84.0.3', SNAP - 3_600_000), h('young', '10.84.0.4', SNAP - 10_000), h('gone', '10.84.0.5', SNAP - 3_600_000)];
  const inUse = (ip: string): string | null => (ip === '10.84.0.3' ? 'the address is configured in network namespace net:[1] via /proc/9/ns/net' : null);
  it('live, in use, grace, leaked — exactly', () => {
    const v = classifyPoolHandles({ handles, sandboxes: new Map([['live1', 'ready']]), runtimeError: null, inUse, evidenceIncomplete: null, snapshotAtMs: SNAP, graceSeconds: 300 });
    assert.deepEqual(v.map((x) => [x.containerId, x.verdict, x.reason, x.ageSeconds]), [
      ['live1', 'live', 'sandbox is listed by the runtime (ready)', 3600],
      ['used1', 'in use', '10.84.0.3: the address is configured in network namespace net:[1] via /proc/9/ns/net', 3600],
      ['young', 'grace', 'younger than the grace period (300s)', 10],
      ['gone', 'leaked', 'the runtime does not list its sandbox and the kernel shows its addresses nowhere', 3600],
    ]);
  });
  it('no runtime or incomplete evidence: every verdict unknown', () => {
    const a = classifyPoolHandles({ handles, sandboxes: null, runtimeError: 'socket missing', inUse, evidenceIncomplete: null, snapshotAtMs: SNAP, graceSeconds: 300 });
    assert.deepEqual([...new Set(a.map((x) => `${x.verdict}: ${x.reason}`))], ['unknown: the runtime could not be asked: socket missing']);
    const b = classifyPoolHandles({ handles, sandboxes: new Map(), runtimeError: null, inUse, evidenceIncomplete: '/proc/7 unreadable', snapshotAtMs: SNAP, graceSeconds: 300 });
    assert.deepEqual([...new Set(b.map((x) => `${x.verdict}: ${x.reason}`))], ['unknown: kernel evidence incomplete: /proc/7 unreadable']);
  });
});

describe('ipwarden pool leaks on a real etcd', { skip }, () => {
  let cluster: EtcdCluster | undefined;
  let kv: EtcdKV | undefined;
  const prefix = `/lk${process.pid}`;
  before(async () => {
    cluster = await startEtcdCluster({ members: 1, prefix: 'ipwarden-pool-leaks-' });
    kv = new EtcdKV({ endpoints: cluster.endpoints });
    const conf = loadIPAMConfig(JSON.stringify({ cniVersion: '1.0.0', name: 'net1', ipam: { ranges: [[{ subnet: '10.84.0.0/24' }]] } }), undefined);
    const mk = (node: string, at: number) => new PoolAllocator({ kv: kv as EtcdKV, pool: 'lp', prefix, node, network: 'net1', rangeSets: conf.rangeSets, sizes: { blockSize4: 26, blockSize6: 122 }, now: () => at, host: hostname() });
    const old = mk('n1', SNAP - 3_600_000);
    await old.add([{ containerId: 'live1', ifname: 'eth0' }, { containerId: 'gone1', ifname: 'eth0' }]);
    await mk('n1', SNAP - 5_000).add([{ containerId: 'young1', ifname: 'eth0' }]);
    await mk('n2', SNAP - 3_600_000).add([{ containerId: 'other', ifname: 'eth0' }]);
  });
  after(async () => {
    await kv?.close();
    await cluster?.close();
  });

  async function leaks(extra: string[], list: () => Promise<SandboxInfo[]>, evidence: UseEvidence = NOTHING_IN_USE, podIPs?: (id: string) => Promise<string[]>) {
    let stdout = '';
    let stderr = '';
    const ctx: CliContext = {
      stdout: (t) => void (stdout += t),
      stderr: (t) => void (stderr += t),
      env: { CONTAINER_RUNTIME_ENDPOINT: 'unix:///run/ipwarden-pool-fake.sock', NODE_NAME: 'n1' },
      now: () => SNAP,
      evidence: () => evidence,
      sandboxSource: (endpoint) => ({ endpoint, list, ...(podIPs === undefined ? {} : { podIPs }), close: () => undefined }),
    };
    const code = await runMain(['pool', 'leaks', '--pool', 'lp', '--etcd-endpoints', (cluster as EtcdCluster).endpoints.join(','), '--etcd-prefix', prefix, ...extra], ctx);
    return { code, stdout, stderr };
  }

  it("lists this node's attachments with their verdicts (JSON), nothing of other nodes, and releases nothing", async () => {
    const r = await leaks(['--json'], async () => [{ id: 'live1', state: 'notready' }]);
    assert.equal(r.code, 0, r.stderr);
    const j = JSON.parse(r.stdout) as { node: string; handles: Array<{ containerId: string; ips: string[]; verdict: string }> };
    assert.equal(j.node, 'n1');
    assert.deepEqual(j.handles.map((x) => [x.containerId, x.ips.join(','), x.verdict]), [
      ['gone1', '10.84.0.3', 'leaked'],
      ['live1', '10.84.0.2', 'live'],
      ['young1', '10.84.0.4', 'grace'],
    ]);
    assert.notEqual(await (kv as EtcdKV).get(`${prefix}/pools/lp/handles/gone1/eth0`), null, 'listing released nothing');
  });

  it('the table, and --node for another node', async () => {
    const r = await leaks(['--node', 'n2'], async () => []);
    assert.equal(r.code, 0, r.stderr);
    // n2 claimed 10.84.0.128/26 (its name's hash among the free blocks).
    assert.equal(
      r.stdout,
      'CONTAINER  IFNAME  ADDRESSES    AGE    VERDICT  REASON\n' +
        'other      eth0    10.84.0.128  3600s  leaked   the runtime does not list its sandbox and the kernel shows its addresses nowhere\n' +
        'node n2: 1 attachment, 1 leak candidate (nothing released)\n',
    );
  });

  it('an unreachable runtime: exit 1, every verdict unknown', async () => {
    const r = await leaks(['--json'], async () => {
      throw new AppError('RUNTIME_UNAVAILABLE', 'no CRI runtime at unix:///run/ipwarden-pool-fake.sock: socket does not exist');
    });
    assert.equal(r.code, 1);
    const j = JSON.parse(r.stdout) as { handles: Array<{ verdict: string }> };
    assert.deepEqual([...new Set(j.handles.map((x) => x.verdict))], ['unknown']);
    assert.match(r.stderr, /^ipwarden: runtime not reachable: /);
  });
  it("a NOTREADY sandbox's handle and a READY sandbox reporting another handle's address: pool leaks and the daemon's pass judge them the same", async () => {
    // live1's sandbox is listed NOTREADY; a READY sandbox (podx, no handle of
    // its own) reports gone1's address in PodSandboxStatus: gone1 is in use, not leaked.
    const list = async (): Promise<SandboxInfo[]> => [
      { id: 'live1', state: 'notready' },
      { id: 'podx', state: 'ready' },
    ];
    const status: string[] = [];
    const podIPs = async (id: string): Promise<string[]> => (status.push(id), id === 'podx' ? ['10.84.0.3'] : []);
    const r = await leaks(['--json'], list, NOTHING_IN_USE, podIPs);
    // podx's address is gone1's in the pool: also a duplicate address (a conflict), hence exit 1.
    assert.equal(r.code, 1);
    assert.equal(r.stderr, "ipwarden: a live pod's address is held by another holder in pool lp (a duplicate address): see above\n");
    const j = JSON.parse(r.stdout) as { handles: Array<{ containerId: string; verdict: string; reason: string }> };
    const judged = j.handles.filter((x) => x.containerId !== 'young1').map((x) => [x.containerId, x.verdict, x.reason]);
    assert.deepEqual(judged, [
      ['gone1', 'in use', '10.84.0.3: the address is reported by ready sandbox podx (PodSandboxStatus)'],
      ['live1', 'live', 'sandbox is listed by the runtime (not ready)'],
    ]);
    assert.deepEqual(status, ['podx'], 'PodSandboxStatus of the READY sandbox only');
    // The daemon's pass over the same etcd, runtime and kernel, through the same planner: live1
    // live, gone1 in use (no candidate); young1 is judged by revisions there (created before R), so leaked.
    let listed = 0;
    const audit = memoryAuditSink();
    const deps: ReconcileDeps = {
      env: { CONTAINER_RUNTIME_ENDPOINT: 'unix:///run/ipwarden-pool-fake.sock' },
      now: () => SNAP,
      evidence: () => NOTHING_IN_USE,
      sandboxSource: (endpoint) => ({ endpoint, list: async () => (listed++, list()), podIPs, close: () => undefined }),
    };
    const target: PoolTarget = { kv: kv as EtcdKV, prefix, pool: 'lp', node: 'n1', id: 'lp@n1' };
    const p = await runPoolPass([target], { runtimeEndpoint: null, audit: () => audit, host: hostname() }, new Confirmations(60, 32), deps, () => 0);
    assert.deepEqual(p.errors, [{ kind: 'conflict', pool: 'lp', message: 'pool lp: address 10.84.0.3 of ready sandbox podx is held by container gone1/eth0 of node n1 (seq 2): a duplicate address — not re-reserved, nothing taken from the holder; the address is wanted by this sandbox: no other pod gets it, and it is re-reserved when its holder releases it' }]);
    assert.deepEqual(p.pools, [{ pool: 'lp', node: 'n1', live: 1, inUse: 1, grace: 0, leaked: 1, unknown: 0 }]);
    assert.deepEqual([...p.candidates.values()], [1], 'young1 only');
    assert.equal(listed, 1, 'one ListPodSandbox per pool pass');
  });

  it('a failed PodSandboxStatus of a READY sandbox: pool leaks says no candidate and exits 1, as the daemon releases nothing', async () => {
    const r = await leaks(
      ['--json'],
      async () => [{ id: 'podx', state: 'ready' }],
      NOTHING_IN_USE,
      async () => {
        throw new Error('status deadline exceeded');
      },
    );
    assert.equal(r.code, 1);
    const j = JSON.parse(r.stdout) as { handles: Array<{ containerId: string; verdict: string }> };
    assert.deepEqual(j.handles.find((x) => x.containerId === 'gone1')?.verdict, 'leaked');
    assert.match(r.stderr, /^ipwarden: .*podx.*: its addresses were not checked; no leaked verdict is a release candidate \(the daemon releases nothing while this lasts\)\n$/);
  });
});
