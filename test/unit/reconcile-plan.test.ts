import { describe, it } from 'node:test';
import { NOTHING_IN_USE } from '../../src/reconcile/evidence.ts';
import assert from 'node:assert/strict';
import {
  classify,
  compareIPText,
  isReleasable,
  plan,
  REASONS,
  VERDICTS,
  type AnyVerdict,
  type Policy,
  type ReservationInput,
  type SandboxIndex,
  type SandboxState,
  type Verdict,
} from '../../src/reconcile/plan.ts';
import type { Owner } from '../../src/store/store.ts';

/** classify() with complete, empty kernel evidence (positional, as the cases are written). */
const cls = (r: ReservationInput, sandboxes: SandboxIndex | null, snapshotAtMs: number, graceSeconds: number, policy: Policy = 'conservative') =>
  classify(r, { sandboxes, snapshotAtMs, graceSeconds, policy, evidence: NOTHING_IN_USE });

const sb = (entries: Array<[string, SandboxState]>): Map<string, SandboxState> => new Map(entries);

const SNAP = 1_700_000_000_000; // ms
const GRACE = 300; // s
const ID_A = 'a'.repeat(64);
const ID_B = 'b'.repeat(64);

function res(ip: string, owner: Owner | null, ageSeconds: number, network = 'net'): ReservationInput {
  return { network, dir: `/data/${network}`, ip, owner, mtimeMs: SNAP - ageSeconds * 1000 };
}
const own = (containerId: string, ifname: string | null = 'eth0'): Owner => ({ containerId, ifname });

describe('reconcile plan: verdicts', () => {
  const cases: Array<{ name: string; r: ReservationInput; sandboxes: SandboxIndex | null; verdict: Verdict; reason: string }> = [
    {
      name: 'ready sandbox is live',
      r: res('10.0.0.2', own(ID_A), 3600),
      sandboxes: sb([[ID_A, 'ready']]),
      verdict: 'live',
      reason: REASONS.liveReady,
    },
    {
      name: 'NOT READY sandbox is live (BR-22: stopped but not removed keeps its IP)',
      r: res('10.0.0.2', own(ID_A), 3600),
      sandboxes: sb([[ID_A, 'notready']]),
      verdict: 'live',
      reason: REASONS.liveNotReady,
    },
    {
      name: 'a Set of IDs (no states) is enough for live',
      r: res('10.0.0.2', own(ID_A), 3600),
      sandboxes: new Set([ID_A]),
      verdict: 'live',
      reason: REASONS.live,
    },
    {
      name: 'legacy ID-only record matches by ID',
      r: res('10.0.0.2', own(ID_A, null), 3600),
      sandboxes: sb([[ID_A, 'ready']]),
      verdict: 'live',
      reason: REASONS.liveReady + REASONS.legacySuffix,
    },
    {
      name: 'legacy ID-only record of an unlisted sandbox is leaked',
      r: res('10.0.0.2', own(ID_A, null), 3600),
      sandboxes: sb([[ID_B, 'ready']]),
      verdict: 'leaked',
      reason: REASONS.leaked + REASONS.legacySuffix,
    },
    {
      name: 'match is on the full ID: a listed ID that is a prefix of the owner does not count',
      r: res('10.0.0.2', own(ID_A), 3600),
      sandboxes: sb([[ID_A.slice(0, 13), 'ready']]),
      verdict: 'leaked',
      reason: REASONS.leaked,
    },
    {
      name: 'match is on the full ID: an owner that is a prefix of a listed ID does not count',
      r: res('10.0.0.2', own(ID_A.slice(0, 12)), 3600),
      sandboxes: sb([[ID_A, 'ready']]),
      verdict: 'leaked',
      reason: REASONS.leaked,
    },
    {
      name: 'corrupt record (owner null) is corrupt whatever its age',
      r: res('10.0.0.2', null, 1),
      sandboxes: sb([[ID_A, 'ready']]),
      verdict: 'corrupt',
      reason: REASONS.corrupt,
    },
    {
      name: 'runtime unreachable: an owned record is unknown (kept)',
      r: res('10.0.0.2', own(ID_A), 36000),
      sandboxes: null,
      verdict: 'unknown',
      reason: REASONS.unknown,
    },
    {
      name: 'runtime unreachable: a corrupt record is still corrupt',
      r: res('10.0.0.2', null, 36000),
      sandboxes: null,
      verdict: 'corrupt',
      reason: REASONS.corrupt,
    },
    {
      name: 'empty sandbox list (runtime asked, nothing running): old files are leaked',
      r: res('10.0.0.2', own(ID_A), 3600),
      sandboxes: sb([]),
      verdict: 'leaked',
      reason: REASONS.leaked,
    },
    {
      name: 'mtime after the snapshot (clock skew / ADD right after): grace',
      r: res('10.0.0.2', own(ID_A), -5),
      sandboxes: sb([]),
      verdict: 'grace',
      reason: REASONS.grace,
    },
    {
      name: 'unreadable mtime (NaN) is never leaked',
      r: { network: 'net', dir: '/data/net', ip: '10.0.0.2', owner: own(ID_A), mtimeMs: Number.NaN },
      sandboxes: sb([]),
      verdict: 'grace',
      reason: REASONS.grace,
    },
  ];
  cases.forEach((c) =>
    it(c.name, () => {
      const e = cls(c.r, c.sandboxes, SNAP, GRACE);
      assert.equal(e.verdict, c.verdict);
      assert.equal(e.reason, c.reason);
    }),
  );
});

describe('reconcile plan: the grace boundary (leaked only when strictly older than snapshot - grace)', () => {
  const cases: Array<{ name: string; mtimeMs: number; verdict: Verdict; ageSeconds: number }> = [
    { name: 'age = grace - 1 ms: grace', mtimeMs: SNAP - GRACE * 1000 + 1, verdict: 'grace', ageSeconds: 299.999 },
    { name: 'age = grace exactly: grace (kept)', mtimeMs: SNAP - GRACE * 1000, verdict: 'grace', ageSeconds: 300 },
    { name: 'age = grace + 1 ms: leaked', mtimeMs: SNAP - GRACE * 1000 - 1, verdict: 'leaked', ageSeconds: 300.001 },
    { name: 'age = 0: grace', mtimeMs: SNAP, verdict: 'grace', ageSeconds: 0 },
  ];
  cases.forEach((c) =>
    it(c.name, () => {
      const r: ReservationInput = { network: 'n', dir: '/d/n', ip: '10.0.0.9', owner: own(ID_A), mtimeMs: c.mtimeMs };
      const e = cls(r, new Set(), SNAP, GRACE);
      assert.equal(e.verdict, c.verdict);
      assert.equal(e.ageSeconds, c.ageSeconds);
    }),
  );
  it('grace 0: a file of age 0 is kept, 1 ms older is leaked', () => {
    const at = (mtimeMs: number) =>
      cls({ network: 'n', dir: '/d/n', ip: '10.0.0.9', owner: own(ID_A), mtimeMs }, new Set(), SNAP, 0).verdict;
    assert.equal(at(SNAP), 'grace');
    assert.equal(at(SNAP - 1), 'leaked');
  });
  it('fractional grace in seconds (1.5 s)', () => {
    const at = (mtimeMs: number) =>
      cls({ network: 'n', dir: '/d/n', ip: '10.0.0.9', owner: own(ID_A), mtimeMs }, new Set(), SNAP, 1.5).verdict;
    assert.equal(at(SNAP - 1500), 'grace');
    assert.equal(at(SNAP - 1501), 'leaked');
  });
  it('ageSeconds is rounded to the millisecond', () => {
    const e = cls({ network: 'n', dir: '/d/n', ip: '10.0.0.9', owner: own(ID_A), mtimeMs: SNAP - 12_500.4 }, new Set(), SNAP, 0);
    assert.equal(e.ageSeconds, 12.5);
  });
});

describe('reconcile plan: whole plans', () => {
  it('splits release/keep, counts, orphans, fields, and sorts by network then IP numerically', () => {
    const p = plan({ evidence: NOTHING_IN_USE,
      reservations: [
        res('10.0.0.10', own(ID_A), 3600, 'b-net'),
        res('10.0.0.9', own('gone'), 3600, 'b-net'),
        res('10.0.0.2', null, 3600, 'b-net'),
        res('fd00::2', own('gone6'), 3600, 'a-net'),
        res('10.0.0.100', own('fresh'), 10, 'a-net'),
        res('10.0.0.3', own(ID_B, null), 3600, 'a-net'),
      ],
      sandboxes: sb([
        [ID_A, 'ready'],
        [ID_B, 'notready'],
        ['hostnet-pod', 'ready'],
      ]),
      snapshotAtMs: SNAP,
      graceSeconds: GRACE,
    });
    assert.deepEqual(
      p.entries.map((e) => [e.network, e.ip, e.verdict]),
      [
        ['a-net', '10.0.0.3', 'live'],
        ['a-net', '10.0.0.100', 'grace'],
        ['a-net', 'fd00::2', 'leaked'],
        ['b-net', '10.0.0.2', 'corrupt'],
        ['b-net', '10.0.0.9', 'leaked'],
        ['b-net', '10.0.0.10', 'live'],
      ],
    );
    assert.deepEqual(
      p.release.map((e) => `${e.network}/${e.ip}`),
      ['a-net/fd00::2', 'b-net/10.0.0.2', 'b-net/10.0.0.9'],
    );
    assert.deepEqual(
      p.keep.map((e) => `${e.network}/${e.ip}`),
      ['a-net/10.0.0.3', 'a-net/10.0.0.100', 'b-net/10.0.0.10'],
    );
    assert.deepEqual(p.counts, { allocated: 6, live: 2, inuse: 0, grace: 1, leaked: 2, corrupt: 1, notready: 0, unknown: 0, orphaned: 3 });
    assert.deepEqual(p.orphans, ['hostnet-pod']);
    const corrupt = p.entries[3];
    assert.equal(corrupt?.containerId, null);
    assert.equal(corrupt?.ifname, null);
    const legacy = p.entries[0];
    assert.equal(legacy?.containerId, ID_B);
    assert.equal(legacy?.ifname, null);
    assert.equal(legacy?.ageSeconds, 3600);
  });

  it('runtime unreachable: releases only corrupt files, keeps everything else as unknown, no orphans', () => {
    const p = plan({ evidence: NOTHING_IN_USE,
      reservations: [res('10.0.0.2', own(ID_A), 99999), res('10.0.0.3', null, 99999), res('10.0.0.4', own(ID_B, null), 99999)],
      sandboxes: null,
      snapshotAtMs: SNAP,
      graceSeconds: GRACE,
    });
    assert.deepEqual(p.release.map((e) => e.ip), ['10.0.0.3']);
    assert.deepEqual(
      p.keep.map((e) => [e.ip, e.verdict, e.reason]),
      [
        ['10.0.0.2', 'unknown', 'runtime not reachable; kept'],
        ['10.0.0.4', 'unknown', 'runtime not reachable; kept'],
      ],
    );
    assert.deepEqual(p.counts, { allocated: 3, live: 0, inuse: 0, grace: 0, leaked: 0, corrupt: 1, notready: 0, unknown: 2, orphaned: 1 });
    assert.deepEqual(p.orphans, []);
  });

  it('rejects a negative or non-finite grace and a non-finite snapshot time', () => {
    assert.throws(() => plan({ evidence: NOTHING_IN_USE, reservations: [], sandboxes: new Set(), snapshotAtMs: SNAP, graceSeconds: -1 }), {
      name: 'RangeError',
      message: 'grace must be a finite number of seconds >= 0, got -1',
    });
    assert.throws(() => plan({ evidence: NOTHING_IN_USE, reservations: [], sandboxes: new Set(), snapshotAtMs: SNAP, graceSeconds: Infinity }), {
      message: 'grace must be a finite number of seconds >= 0, got Infinity',
    });
    assert.throws(() => plan({ evidence: NOTHING_IN_USE, reservations: [], sandboxes: new Set(), snapshotAtMs: Number.NaN, graceSeconds: 0 }), {
      message: 'snapshotAtMs must be finite, got NaN',
    });
  });
});

describe('reconcile plan: policy reclaim-notready (BR-22)', () => {
  const T = GRACE * 1000;
  const cases: Array<{ name: string; r: ReservationInput; sandboxes: SandboxIndex; policy: Policy; verdict: AnyVerdict; reason: string }> = [
    {
      name: 'conservative: an old file of a NOT READY sandbox is live',
      r: res('10.0.0.2', own(ID_A), 3600),
      sandboxes: sb([[ID_A, 'notready']]),
      policy: 'conservative',
      verdict: 'live',
      reason: REASONS.liveNotReady,
    },
    {
      name: 'reclaim-notready: NOT READY, file 1 ms older than the grace: notready',
      r: { network: 'net', dir: '/data/net', ip: '10.0.0.2', owner: own(ID_A), mtimeMs: SNAP - T - 1 },
      sandboxes: sb([[ID_A, 'notready']]),
      policy: 'reclaim-notready',
      verdict: 'notready',
      reason: REASONS.notready,
    },
    {
      name: 'reclaim-notready: NOT READY, file age exactly the grace: live (kept)',
      r: { network: 'net', dir: '/data/net', ip: '10.0.0.2', owner: own(ID_A), mtimeMs: SNAP - T },
      sandboxes: sb([[ID_A, 'notready']]),
      policy: 'reclaim-notready',
      verdict: 'live',
      reason: REASONS.liveNotReady,
    },
    {
      name: 'reclaim-notready: a READY sandbox is live however old the file',
      r: res('10.0.0.2', own(ID_A), 86400 * 365),
      sandboxes: sb([[ID_A, 'ready']]),
      policy: 'reclaim-notready',
      verdict: 'live',
      reason: REASONS.liveReady,
    },
    {
      name: 'reclaim-notready: a state-less index (Set) never gives notready',
      r: res('10.0.0.2', own(ID_A), 3600),
      sandboxes: new Set([ID_A]),
      policy: 'reclaim-notready',
      verdict: 'live',
      reason: REASONS.live,
    },
    {
      name: 'reclaim-notready: legacy ID-only record of a NOT READY sandbox gets the legacy suffix',
      r: res('10.0.0.2', own(ID_A, null), 3600),
      sandboxes: sb([[ID_A, 'notready']]),
      policy: 'reclaim-notready',
      verdict: 'notready',
      reason: REASONS.notready + REASONS.legacySuffix,
    },
    {
      name: 'reclaim-notready: unlisted owners are still leaked, not notready',
      r: res('10.0.0.2', own('gone'), 3600),
      sandboxes: sb([[ID_A, 'notready']]),
      policy: 'reclaim-notready',
      verdict: 'leaked',
      reason: REASONS.leaked,
    },
  ];
  cases.forEach((c) =>
    it(c.name, () => {
      const e = cls(c.r, c.sandboxes, SNAP, GRACE, c.policy);
      assert.equal(e.verdict, c.verdict);
      assert.equal(e.reason, c.reason);
    }),
  );

  it('the reason text is exact', () => {
    assert.equal(REASONS.notready, 'sandbox is listed by the runtime but not ready, and the file is older than the grace period (policy reclaim-notready)');
  });

  it('a whole plan: notready is released and counted (not as orphaned); the plan keeps its policy', () => {
    const input = {
      reservations: [res('10.0.0.2', own(ID_A), 3600), res('10.0.0.3', own(ID_B), 3600), res('10.0.0.4', own('gone'), 3600)],
      sandboxes: sb([
        [ID_A, 'notready'],
        [ID_B, 'ready'],
      ]),
      snapshotAtMs: SNAP,
      graceSeconds: GRACE,
      evidence: NOTHING_IN_USE,
    };
    const p = plan({ ...input, policy: 'reclaim-notready' });
    assert.equal(p.policy, 'reclaim-notready');
    assert.deepEqual(p.release.map((e) => [e.ip, e.verdict]), [
      ['10.0.0.2', 'notready'],
      ['10.0.0.4', 'leaked'],
    ]);
    assert.deepEqual(p.keep.map((e) => [e.ip, e.verdict]), [['10.0.0.3', 'live']]);
    assert.deepEqual(p.counts, { allocated: 3, live: 1, inuse: 0, grace: 0, leaked: 1, corrupt: 0, notready: 1, unknown: 0, orphaned: 1 });
    const c = plan(input);
    assert.equal(c.policy, 'conservative');
    assert.deepEqual(c.release.map((e) => e.ip), ['10.0.0.4']);
    assert.equal(c.counts.notready, 0);
  });

  it('rejects an unknown policy', () => {
    assert.throws(() => plan({ evidence: NOTHING_IN_USE, reservations: [], sandboxes: new Set(), snapshotAtMs: SNAP, graceSeconds: 0, policy: 'yolo' as Policy }), {
      name: 'RangeError',
      message: 'unknown policy "yolo"',
    });
  });

  it('isReleasable: leaked, corrupt, notready', () => {
    assert.deepEqual(
      VERDICTS.filter((v) => isReleasable(v)),
      ['leaked', 'corrupt', 'notready'],
    );
  });
});

describe('compareIPText', () => {
  const sorted = ['10.0.0.2', '10.0.0.10', '10.0.1.1', '192.168.0.1', '::1', 'fd00::2', 'fd00::10', 'fd00::1:0', 'not-an-ip'];
  it('orders IPv4 numerically, then IPv6 numerically, then non-IPs', () => {
    const shuffled = [...sorted].reverse();
    assert.deepEqual(shuffled.sort(compareIPText), sorted);
  });
  it('reads embedded IPv4 tails in IPv6', () => {
    assert.equal(compareIPText('::ffff:10.0.0.1', '::ffff:a00:1'), 0);
    assert.equal(compareIPText('::ffff:10.0.0.2', '::ffff:a00:1'), 1);
  });
});
