/**
 * checkPodIPs (src/reconcile/unreserved.ts, field report BR-13): the pod IPs of READY sandboxes
 * against the reservations, and where an unreserved address belongs. Pure: no disk, no runtime.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { NOTHING_IN_USE } from '../../src/reconcile/evidence.ts';
import { loadIPAMConfig } from '../../src/ipam/config.ts';
import { plan, type SandboxState } from '../../src/reconcile/plan.ts';
import { checkPodIPs, podIPMessage, withheldKey, type NetworkRanges, type PodIPCheckInput, type SandboxPodIPs } from '../../src/reconcile/unreserved.ts';
import type { Owner } from '../../src/store/store.ts';

const SNAP = 1_700_000_000_000;

/** Configured ranges of network `name`: one range set per subnet. */
function ranges(network: string, ...subnets: string[]): NetworkRanges {
  const conf = loadIPAMConfig(JSON.stringify({ name: network, ipam: { ranges: subnets.map((subnet) => [{ subnet }]) } }), undefined);
  return { network, rangeSets: conf.rangeSets };
}

/** Reservations `network/ip → "id|ifname"` (`"id"` legacy, null corrupt) as plan entries. */
function entries(files: Record<string, string | null>): PodIPCheckInput['entries'] {
  const reservations = Object.entries(files).map(([key, o]) => {
    const [network, ip] = key.split('/') as [string, string];
    let owner: Owner | null = null;
    if (o !== null) {
      const bar = o.indexOf('|');
      owner = bar < 0 ? { containerId: o, ifname: null } : { containerId: o.slice(0, bar), ifname: o.slice(bar + 1) };
    }
    return { network, dir: `/d/${network}`, ip, owner, mtimeMs: SNAP - 3600_000 };
  });
  const sandboxes = new Map<string, SandboxState>();
  return plan({ evidence: NOTHING_IN_USE, reservations, sandboxes, snapshotAtMs: SNAP, graceSeconds: 300 }).entries;
}

function check(
  podIPs: SandboxPodIPs[],
  files: Record<string, string | null>,
  opts: { scanned?: string[]; all?: string[]; configured?: NetworkRanges[] } = {},
): { result: ReturnType<typeof checkPodIPs>; configReads: number } {
  let configReads = 0;
  const all = opts.all ?? ['net'];
  const result = checkPodIPs({
    podIPs,
    entries: entries(files),
    scanned: opts.scanned ?? all,
    allNetworks: all,
    configured: () => {
      configReads++;
      return opts.configured ?? [];
    },
  });
  return { result, configReads };
}

describe('checkPodIPs (BR-13)', () => {
  it('the messages are exact', () => {
    assert.equal(podIPMessage('unreserved', 'c1', '10.22.0.2', null), 'live sandbox c1 has no reservation for its IP 10.22.0.2');
    assert.equal(podIPMessage('conflict', 'c1', '10.22.0.2', 'c6'), 'address 10.22.0.2 of live sandbox c1 is reserved for c6');
    assert.equal(
      podIPMessage('conflict', 'c1', '10.22.0.2', null),
      'address 10.22.0.2 of live sandbox c1 is held by an empty or unparseable reservation file',
    );
  });

  it('an address reserved for the sandbox itself is fine (any interface, legacy record); configs are not read', () => {
    const { result, configReads } = check(
      [
        { sandbox: 'c1', ips: ['10.22.0.2'] },
        { sandbox: 'c2', ips: ['10.22.0.3'] },
      ],
      { 'net/10.22.0.2': 'c1|net1', 'net/10.22.0.3': 'c2' },
    );
    assert.deepEqual(result.findings, []);
    assert.equal(result.withheld.size, 0);
    assert.equal(configReads, 0);
  });

  it('unreserved: placed in the network whose configured ranges contain it', () => {
    const { result, configReads } = check([{ sandbox: 'c1', ips: ['10.22.0.2'] }], {}, {
      all: ['a', 'dup13'],
      configured: [ranges('a', '10.1.0.0/24'), ranges('dup13', '10.22.0.0/29')],
    });
    assert.deepEqual(result.findings, [
      { sandbox: 'c1', ip: '10.22.0.2', network: 'dup13', action: 'reported', reservedFor: null, message: 'live sandbox c1 has no reservation for its IP 10.22.0.2' },
    ]);
    assert.equal(configReads, 1);
  });

  const placement: Array<{ name: string; all: string[]; configured: NetworkRanges[]; network: string | null }> = [
    { name: 'no config at all, one network directory: never placed by a guess, only reported (issue 7)', all: ['only'], configured: [], network: null },
    { name: 'no config, two network directories: cannot tell', all: ['a', 'b'], configured: [], network: null },
    {
      name: 'in no configured range (another IPAM\'s address: a Calico primary beside a Multus host-local network): not reported at all',
      all: ['only'],
      configured: [ranges('only', '10.1.0.0/24')],
      network: 'none',
    },
    {
      name: 'two scanned networks have ranges containing it: cannot tell',
      all: ['a', 'b'],
      configured: [ranges('a', '10.22.0.0/24'), ranges('b', '10.22.0.0/29')],
      network: null,
    },
  ];
  placement.forEach((c) =>
    it(`unreserved: ${c.name}`, () => {
      const { result } = check([{ sandbox: 'c1', ips: ['10.22.0.2'] }], {}, { all: c.all, configured: c.configured });
      assert.deepEqual(
        result.findings.map((f) => [f.ip, f.network, f.action]),
        c.network === 'none' ? [] : [['10.22.0.2', c.network, 'reported']],
      );
    }),
  );

  it('conflict: reserved for another container; that reservation is withheld from release', () => {
    const { result } = check([{ sandbox: 'c1', ips: ['10.22.0.2'] }], { 'dup13/10.22.0.2': 'c6|eth0' }, { all: ['dup13'] });
    assert.deepEqual(result.findings, [
      { sandbox: 'c1', ip: '10.22.0.2', network: 'dup13', action: 'conflict', reservedFor: 'c6', message: 'address 10.22.0.2 of live sandbox c1 is reserved for c6' },
    ]);
    assert.deepEqual([...result.withheld], [withheldKey('dup13', '10.22.0.2')]);
  });

  it('conflict: an empty or unparseable file at the address; withheld too', () => {
    const { result } = check([{ sandbox: 'c1', ips: ['10.22.0.2'] }], { 'net/10.22.0.2': null });
    assert.deepEqual(
      result.findings.map((f) => [f.action, f.reservedFor, f.message]),
      [['conflict', null, 'address 10.22.0.2 of live sandbox c1 is held by an empty or unparseable reservation file']],
    );
    assert.deepEqual([...result.withheld], [withheldKey('net', '10.22.0.2')]);
  });

  it('only some networks scanned (--network): an address placed elsewhere, or nowhere, is not reported', () => {
    const configured = [ranges('a', '10.1.0.0/24'), ranges('b', '10.2.0.0/24')];
    const { result } = check(
      [
        { sandbox: 'c1', ips: ['10.1.0.5'] },
        { sandbox: 'c2', ips: ['10.2.0.5'] },
        { sandbox: 'c3', ips: ['192.168.0.5'] },
      ],
      { 'a/10.1.0.9': 'c9|eth0' },
      { scanned: ['a'], all: ['a', 'b'], configured },
    );
    assert.deepEqual(
      result.findings.map((f) => [f.sandbox, f.ip, f.network]),
      [['c1', '10.1.0.5', 'a']],
    );
  });

  it('IP texts: canonical form, duplicates once, non-IPs and empty strings ignored; sorted by IP then sandbox', () => {
    const { result } = check(
      [
        { sandbox: 'c2', ips: ['10.0.0.10', 'FD00::0002', 'fd00::2', '', 'not-an-ip'] },
        { sandbox: 'c1', ips: ['10.0.0.10', '10.0.0.9'] },
      ],
      {},
    );
    assert.deepEqual(
      result.findings.map((f) => [f.ip, f.sandbox, f.network]),
      [
        ['10.0.0.9', 'c1', null],
        ['10.0.0.10', 'c1', null],
        ['10.0.0.10', 'c2', null],
        ['fd00::2', 'c2', null],
      ],
    );
  });
});
