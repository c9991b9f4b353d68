/**
 * applyPlan's re-checks under the lock (ARCHITECTURE.md "Reconciler safety rules"), the audit
 * log, and network discovery — on a real FileStore in a temporary data dir.
 */
import { afterEach, beforeEach, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { NOTHING_IN_USE } from '../../src/reconcile/evidence.ts';
import { execFileSync } from 'node:child_process';
import { existsSync, linkSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, symlinkSync, utimesSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { AppError, isAppError } from '../../src/common/errors.ts';
import { applyPlan, reReserve, SKIP_REASONS } from '../../src/reconcile/apply.ts';
import type { PodIPFinding } from '../../src/reconcile/unreserved.ts';
import { AUDIT_LOG_NAME, defaultAuditLogPath, LEGACY_AUDIT_LOG_NAME, memoryAuditSink, migrateLegacyAuditLog, openAuditLog, openDefaultAuditLog, type AuditSink } from '../../src/reconcile/audit.ts';
import { isCniName } from '../../src/common/names.ts';
import { discoverNetworks, namedNetwork, readReservations } from '../../src/reconcile/networks.ts';
import { plan, type AnyVerdict, type Plan, type SandboxState } from '../../src/reconcile/plan.ts';
import { openFileStore } from '../../src/store/file/file-store.ts';
import type { Owner, Store } from '../../src/store/store.ts';
import { loadIPAMConfig } from '../../src/ipam/config.ts';
import { reclaimLocked } from '../../src/reconcile/reclaim.ts';

const SNAP = Date.UTC(2025, 0, 1);
const OLD_MS = SNAP - 3600_000;

let dataDir: string;
beforeEach(() => {
  dataDir = mkdtempSync(join(tmpdir(), 'ipwarden-apply-'));
});
afterEach(() => {
  rmSync(dataDir, { recursive: true, force: true });
});

function write(network: string, name: string, content: string, mtimeMs = OLD_MS): void {
  const dir = join(dataDir, network);
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, name), content);
  utimesSync(join(dir, name), mtimeMs / 1000, mtimeMs / 1000);
}
const openStore = (network: string) => openFileStore({ dataDir, network });

async function planNow(): Promise<Plan> {
  const reservations = await readReservations(discoverNetworks(dataDir), openStore);
  return plan({ evidence: NOTHING_IN_USE, reservations, sandboxes: new Map<string, SandboxState>([['alive', 'ready']]), snapshotAtMs: SNAP, graceSeconds: 300 });
}

describe('applyPlan re-checks each entry under the lock', () => {
  it('skips a file whose owner changed, one rewritten since the snapshot, and one already gone', async () => {
    write('n', '10.0.0.2', 'gone1\r\neth0');
    write('n', '10.0.0.3', 'gone2\r\neth0');
    write('n', '10.0.0.4', 'gone3\r\neth0');
    write('n', '10.0.0.5', 'gone4\r\neth0');
    const p = await planNow();
    assert.deepEqual(p.release.map((e) => e.ip), ['10.0.0.2', '10.0.0.3', '10.0.0.4', '10.0.0.5']);
    // Between plan and apply: .2 released and re-taken by a new sandbox, .3 re-written by its owner
    // (an ADD after the snapshot), .4 released by a DEL.
    write('n', '10.0.0.2', 'alive\r\neth0');
    write('n', '10.0.0.3', 'gone2\r\neth0', SNAP + 5000);
    rmSync(join(dataDir, 'n', '10.0.0.4'));
    const audit = memoryAuditSink();
    const r = await applyPlan(p, { openStore, audit, now: () => SNAP, evidence: () => NOTHING_IN_USE });
    assert.deepEqual(r.released.map((e) => e.ip), ['10.0.0.5']);
    assert.deepEqual(
      r.skipped.map((s) => [s.entry.ip, s.why]),
      [
        ['10.0.0.2', SKIP_REASONS.ownerChanged],
        [
          '10.0.0.3',
          'now grace: sandbox not listed by the runtime, but the file is within the grace period (ADD may be in flight)',
        ],
        ['10.0.0.4', SKIP_REASONS.gone],
      ],
    );
    assert.deepEqual(r.errors, []);
    assert.deepEqual(readdirSync(join(dataDir, 'n')).sort(), ['10.0.0.2', '10.0.0.3', 'lock']);
    assert.deepEqual(audit.records.map((a) => [a.ip, a.phase]), [['10.0.0.5', 'intent'], ['10.0.0.5', 'released']]);
  });

  it('a corrupt file that got a valid owner before the lock is kept', async () => {
    write('n', '10.0.0.2', '');
    const p = await planNow();
    write('n', '10.0.0.2', 'new\r\neth0', SNAP - 3_600_000);
    const r = await applyPlan(p, { openStore, audit: memoryAuditSink(), now: () => SNAP, evidence: () => NOTHING_IN_USE });
    assert.deepEqual(r.released, []);
    assert.deepEqual(
      r.skipped.map((s) => s.why),
      [SKIP_REASONS.ownerChanged],
    );
  });

  it('a network whose lock cannot be had is reported and the others are still processed', async () => {
    write('a', '10.0.0.2', 'x\r\neth0');
    write('b', '10.0.0.2', 'y\r\neth0');
    const p = await planNow();
    const holder = await openStore('a');
    await holder.lock(1);
    try {
      const r = await applyPlan(p, { openStore, audit: memoryAuditSink(), now: () => SNAP, evidence: () => NOTHING_IN_USE, lockTimeoutSeconds: 0 });
      assert.deepEqual(r.released.map((e) => `${e.network}/${e.ip}`), ['b/10.0.0.2']);
      assert.equal(r.errors.length, 1);
      assert.equal(r.errors[0]?.network, 'a');
      assert.ok(isAppError(r.errors[0]?.error, 'STORE_LOCK_TIMEOUT'));
    } finally {
      await holder.close();
    }
  });

  it('stops releasing once an audit record cannot be written', async () => {
    write('a', '10.0.0.2', 'x\r\neth0');
    write('a', '10.0.0.3', 'x\r\neth0');
    write('b', '10.0.0.2', 'y\r\neth0');
    const p = await planNow();
    const broken: AuditSink = {
      append: () => {
        throw new AppError('STORE_IO', 'cannot write the audit log /x: disk full');
      },
      sync: () => undefined,
      close: () => undefined,
    };
    const r = await applyPlan(p, { openStore, audit: broken, now: () => SNAP, evidence: () => NOTHING_IN_USE });
    assert.deepEqual(r.released, []);
    assert.deepEqual(r.errors.map((e) => e.message), ['nothing released: cannot write the audit log /x: disk full']);
    assert.deepEqual(
      r.skipped.map((s) => [`${s.entry.network}/${s.entry.ip}`, s.why]),
      [
        ['a/10.0.0.2', SKIP_REASONS.auditBroken],
        ['a/10.0.0.3', SKIP_REASONS.auditBroken],
        ['b/10.0.0.2', SKIP_REASONS.auditBroken],
      ],
    );
    assert.deepEqual(readdirSync(join(dataDir, 'a')).filter((n) => n.startsWith('10.')).sort(), ['10.0.0.2', '10.0.0.3']);
  });

  it('stops releasing once an outcome line cannot be written; what was removed has its intent on record', async () => {
    write('a', '10.0.0.2', 'x\r\neth0');
    write('a', '10.0.0.3', 'x\r\neth0');
    write('b', '10.0.0.2', 'y\r\neth0');
    const p = await planNow();
    const mem = memoryAuditSink();
    const breaksAfterIntents: AuditSink = {
      append: (rec) => {
        if (rec.phase !== 'intent') throw new AppError('STORE_IO', 'cannot write the audit log /x: disk full');
        mem.append(rec);
      },
      sync: () => mem.sync(),
      close: () => undefined,
    };
    const r = await applyPlan(p, { openStore, audit: breaksAfterIntents, now: () => SNAP, evidence: () => NOTHING_IN_USE });
    assert.deepEqual(r.released.map((e) => `${e.network}/${e.ip}`), ['a/10.0.0.2']);
    assert.deepEqual(r.errors.map((e) => e.message), ['released 10.0.0.2 (its intent is on record) but cannot write the audit log /x: disk full; nothing further released']);
    assert.deepEqual(
      r.skipped.map((s) => [`${s.entry.network}/${s.entry.ip}`, s.why]),
      [
        ['a/10.0.0.3', SKIP_REASONS.auditBroken],
        ['b/10.0.0.2', SKIP_REASONS.auditBroken],
      ],
    );
    assert.deepEqual(mem.records.map((x) => [x.ip, x.phase]), [['10.0.0.2', 'intent'], ['10.0.0.3', 'intent']]);
    assert.equal(mem.durable, 2);
  });
});

describe('applyPlan re-classifies with the plan\'s policy (BR-22)', () => {
  const planPolicy = async (policy: 'conservative' | 'reclaim-notready'): Promise<Plan<AnyVerdict>> => {
    const reservations = await readReservations(discoverNetworks(dataDir), openStore);
    const sandboxes = new Map<string, SandboxState>([
      ['stopped', 'notready'],
      ['running', 'ready'],
    ]);
    return plan({ evidence: NOTHING_IN_USE, reservations, sandboxes, snapshotAtMs: SNAP, graceSeconds: 300, policy });
  };

  it('reclaim-notready: releases the NOT READY sandbox\'s old file (re-checked as notready under the lock), never the READY one', async () => {
    write('n', '10.0.0.2', 'stopped\r\neth0');
    write('n', '10.0.0.3', 'running\r\neth0');
    const p = await planPolicy('reclaim-notready');
    assert.deepEqual(p.release.map((e) => [e.ip, e.verdict]), [['10.0.0.2', 'notready']]);
    const audit = memoryAuditSink();
    const r = await applyPlan(p, { openStore, audit, now: () => SNAP, evidence: () => NOTHING_IN_USE });
    assert.deepEqual(r.released.map((e) => [e.ip, e.verdict]), [['10.0.0.2', 'notready']]);
    assert.deepEqual(readdirSync(join(dataDir, 'n')).sort(), ['10.0.0.3', 'lock']);
    assert.deepEqual(audit.records.map((a) => [a.ip, a.verdict, a.phase]), [['10.0.0.2', 'notready', 'intent'], ['10.0.0.2', 'notready', 'released']]);
  });

  it('reclaim-notready: a NOT READY sandbox\'s file re-written since the snapshot is now live and kept', async () => {
    write('n', '10.0.0.2', 'stopped\r\neth0');
    const p = await planPolicy('reclaim-notready');
    write('n', '10.0.0.2', 'stopped\r\neth0', SNAP + 5000);
    const r = await applyPlan(p, { openStore, audit: memoryAuditSink(), now: () => SNAP, evidence: () => NOTHING_IN_USE });
    assert.deepEqual(r.released, []);
    assert.deepEqual(r.skipped.map((s) => s.why), ['now live: sandbox is listed by the runtime (not ready)']);
  });

  it('conservative: the same NOT READY file is not even planned for release', async () => {
    write('n', '10.0.0.2', 'stopped\r\neth0');
    const p = await planPolicy('conservative');
    assert.deepEqual(p.release, []);
  });
});

describe('reReserve (BR-13)', () => {
  const finding = (ip: string, network: string | null, action: PodIPFinding['action'] = 'reported'): PodIPFinding => ({
    sandbox: 'c1',
    ip,
    network,
    action,
    reservedFor: null,
    message: `live sandbox c1 has no reservation for its IP ${ip}`,
  });

  it('re-reserves free addresses for the sandbox (eth0) without touching last_reserved_ip; audits each', async () => {
    write('n', 'last_reserved_ip.0', '10.0.0.6');
    const audit = memoryAuditSink();
    const r = await reReserve([finding('10.0.0.2', 'n'), finding('10.0.0.9', null), finding('10.0.0.4', 'n', 'conflict')], {
      openStore,
      audit,
      now: () => SNAP, evidence: () => NOTHING_IN_USE,
    });
    assert.deepEqual(r.findings.map((f) => [f.ip, f.action]), [
      ['10.0.0.2', 're-reserved'],
      ['10.0.0.9', 'reported'],
      ['10.0.0.4', 'conflict'],
    ]);
    assert.deepEqual(r.errors, []);
    assert.equal(readFileSync(join(dataDir, 'n', '10.0.0.2'), 'latin1'), 'c1\r\neth0');
    assert.equal(readFileSync(join(dataDir, 'n', 'last_reserved_ip.0'), 'latin1'), '10.0.0.6');
    assert.deepEqual(readdirSync(join(dataDir, 'n')).sort(), ['10.0.0.2', 'last_reserved_ip.0', 'lock']);
    assert.deepEqual(audit.records, [
      {
        time: '2025-01-01T00:00:00.000Z',
        network: 'n',
        ip: '10.0.0.2',
        containerId: 'c1',
        ifname: 'eth0',
        ageSeconds: 0,
        verdict: 'live',
        reason: 're-reserved: live sandbox c1 has no reservation for its IP 10.0.0.2',
        phase: 'reserved',
      },
    ]);
  });

  it('fails safely when the address was taken since the snapshot: conflict naming the new owner, file untouched, no audit', async () => {
    write('n', '10.0.0.2', 'c6\r\neth0');
    write('n', '10.0.0.3', '');
    const audit = memoryAuditSink();
    const r = await reReserve([finding('10.0.0.2', 'n'), finding('10.0.0.3', 'n')], { openStore, audit, now: () => SNAP, evidence: () => NOTHING_IN_USE });
    assert.deepEqual(
      r.findings.map((f) => [f.ip, f.action, f.reservedFor, f.message]),
      [
        ['10.0.0.2', 'conflict', 'c6', 'address 10.0.0.2 of live sandbox c1 is reserved for c6'],
        ['10.0.0.3', 'conflict', null, 'address 10.0.0.3 of live sandbox c1 is held by an empty or unparseable reservation file'],
      ],
    );
    assert.equal(readFileSync(join(dataDir, 'n', '10.0.0.2'), 'latin1'), 'c6\r\neth0');
    assert.deepEqual(audit.records, []);
  });

  it('holds the network lock: a held lock is an error and nothing is written', async () => {
    mkdirSync(join(dataDir, 'n'));
    const holder = await openStore('n');
    await holder.lock(1);
    try {
      const r = await reReserve([finding('10.0.0.2', 'n')], { openStore, audit: memoryAuditSink(), now: () => SNAP, evidence: () => NOTHING_IN_USE, lockTimeoutSeconds: 0 });
      assert.deepEqual(r.findings.map((f) => f.action), ['reported']);
      assert.equal(r.errors.length, 1);
      assert.ok(isAppError(r.errors[0]?.error, 'STORE_LOCK_TIMEOUT'));
      assert.deepEqual(readdirSync(join(dataDir, 'n')).sort(), ['lock']);
    } finally {
      await holder.close();
    }
  });
});

describe('audit log file', () => {
  it('appends an intent and an outcome line per release to the log in the data dir root', async () => {
    write('n', '10.0.0.2', 'gone\r\neth0');
    write('n', '10.0.0.3', 'gone\r\neth0');
    const path = defaultAuditLogPath(dataDir);
    assert.equal(path, join(dataDir, '.ipwarden-audit.log'));
    writeFileSync(path, '{"earlier":true}\n', { mode: 0o600 });
    const audit = openAuditLog(path);
    try {
      await applyPlan(await planNow(), { openStore, audit, now: () => SNAP + 1500, evidence: () => NOTHING_IN_USE });
    } finally {
      audit.close();
      audit.close(); // idempotent
    }
    const reason = 'sandbox not listed by the runtime and the file is older than the grace period';
    const line = (ip: string, phase: string) =>
      `{"time":"2025-01-01T00:00:01.500Z","network":"n","ip":"${ip}","containerId":"gone","ifname":"eth0","ageSeconds":3600,"verdict":"leaked","reason":"${reason}","phase":"${phase}"}\n`;
    assert.equal(
      readFileSync(path, 'utf8'),
      '{"earlier":true}\n' + line('10.0.0.2', 'intent') + line('10.0.0.3', 'intent') + line('10.0.0.2', 'released') + line('10.0.0.3', 'released'),
    );
    // The audit log is a file in the data dir root: never taken for a network.
    assert.deepEqual(discoverNetworks(dataDir).map((n) => n.name), ['n']);
  });

  it('is created with mode 0600; append after close throws ClosedError; an unopenable path throws STORE_IO at open', () => {
    const a = openAuditLog(join(dataDir, 'x.log'));
    assert.equal(statSync(join(dataDir, 'x.log')).mode & 0o777, 0o600);
    a.close();
    assert.throws(() => a.append({ time: '', network: 'n', ip: '1.2.3.4', containerId: null, ifname: null, ageSeconds: 0, verdict: 'corrupt', reason: '', phase: 'intent' }), {
      name: 'ClosedError',
      message: `audit log ${join(dataDir, 'x.log')} is closed`,
    });
    assert.throws(() => openAuditLog(join(dataDir, 'missing-dir', 'x.log')), (e: unknown) => {
      assert.ok(isAppError(e, 'STORE_IO'));
      assert.match(e.message, /^cannot open the audit log .*missing-dir\/x\.log: ENOENT/);
      return true;
    });
  });
});

describe('every release is on record before it happens (issue 8.2)', () => {
  /**
   * `openStore`, but each store notes, at the instant a file has just been removed, whether a
   * durable (synced) intent record for it is already in `audit`: a crash right then (SIGKILL,
   * power loss) keeps exactly the durable records.
   */
  function watchingRemovals(audit: ReturnType<typeof memoryAuditSink>, seen: Array<[string, boolean]>) {
    return async (network: string): Promise<Store> => {
      const s = await openStore(network);
      return new Proxy(s, {
        get(target, key) {
          if (key === 'release') {
            return async (ip: string, owner: Owner | null) => {
              const removed = await target.release(ip, owner);
              if (removed) seen.push([ip, audit.records.slice(0, audit.durable).some((r) => r.ip === ip && r.phase === 'intent')]);
              return removed;
            };
          }
          const v: unknown = Reflect.get(target, key);
          return typeof v === 'function' ? (v as (...a: unknown[]) => unknown).bind(target) : v;
        },
      });
    };
  }

  it('gc (applyPlan): at each removal the durable log already holds its intent', async () => {
    for (let i = 2; i < 8; i++) write('n', `10.0.0.${i}`, i % 2 === 0 ? `gone${i}\r\neth0` : '');
    const audit = memoryAuditSink();
    const seen: Array<[string, boolean]> = [];
    const r = await applyPlan(await planNow(), { openStore: watchingRemovals(audit, seen), audit, now: () => SNAP, evidence: () => NOTHING_IN_USE });
    assert.equal(r.released.length, 6);
    assert.deepEqual(seen, [2, 3, 4, 5, 6, 7].map((i) => [`10.0.0.${i}`, true]));
  });

  it('the plugin\'s reclaim on exhaustion: the same, with the "reclaimed on exhaustion: " reason', async () => {
    write('n', '10.0.0.2', 'gone\r\neth0');
    write('n', '10.0.0.3', '');
    const conf = loadIPAMConfig(JSON.stringify({ cniVersion: '1.0.0', name: 'n', ipam: { type: 'ipwarden', dataDir, ranges: [[{ subnet: '10.0.0.0/29' }]] } }), undefined);
    const audit = memoryAuditSink();
    const seen: Array<[string, boolean]> = [];
    const store = await watchingRemovals(audit, seen)('n');
    try {
      await store.lock(5);
      const source = { endpoint: 'unix:///fake', list: async () => [{ id: 'alive', state: 'ready' as const }] };
      const o = await reclaimLocked(store, conf, { source, audit, now: () => SNAP, evidence: () => NOTHING_IN_USE });
      assert.deepEqual(o.released, ['10.0.0.2', '10.0.0.3']);
    } finally {
      await store.close();
    }
    assert.deepEqual(seen, [['10.0.0.2', true], ['10.0.0.3', true]]);
    assert.deepEqual(audit.records.map((x) => [x.ip, x.phase, x.reason.startsWith('reclaimed on exhaustion: ')]), [
      ['10.0.0.2', 'intent', true],
      ['10.0.0.3', 'intent', true],
      ['10.0.0.2', 'released', true],
      ['10.0.0.3', 'released', true],
    ]);
  });

  it('a release refused under the lock (the file changed at the last moment) gets a "kept" line', async () => {
    write('n', '10.0.0.2', 'gone\r\neth0');
    const p = await planNow();
    const audit = memoryAuditSink();
    const changing = async (network: string): Promise<Store> => {
      const s = await openStore(network);
      return new Proxy(s, {
        get(target, key) {
          if (key === 'release') {
            return async (ip: string, owner: Owner | null) => {
              writeFileSync(join(dataDir, 'n', ip), 'newcomer\r\neth0'); // a writer ignoring the lock
              return target.release(ip, owner);
            };
          }
          const v: unknown = Reflect.get(target, key);
          return typeof v === 'function' ? (v as (...a: unknown[]) => unknown).bind(target) : v;
        },
      });
    };
    const r = await applyPlan(p, { openStore: changing, audit, now: () => SNAP, evidence: () => NOTHING_IN_USE });
    assert.deepEqual(r.released, []);
    assert.deepEqual(r.skipped.map((x) => x.why), [SKIP_REASONS.releaseRefused]);
    assert.deepEqual(audit.records.map((x) => [x.ip, x.phase, x.reason]), [
      ['10.0.0.2', 'intent', 'sandbox not listed by the runtime and the file is older than the grace period'],
      ['10.0.0.2', 'kept', SKIP_REASONS.releaseRefused],
    ]);
  });
});

describe('audit log opening refuses what is not its own regular file (issue 8.2)', () => {
  const path = () => join(dataDir, '.ipwarden-audit.log');
  const refused = (why: string) => (e: unknown) => {
    assert.ok(isAppError(e, 'STORE_IO'), String(e));
    assert.equal(e.message, `cannot open the audit log ${path()}: ${why}`);
    return true;
  };

  it('a symlink to another file is not followed: the target is neither appended to nor created', () => {
    const target = join(dataDir, 'i8-victim');
    writeFileSync(target, 'precious\n');
    symlinkSync(target, path());
    assert.throws(() => openAuditLog(path()), refused('it is a symbolic link (not followed)'));
    assert.equal(readFileSync(target, 'utf8'), 'precious\n');
    rmSync(path());
    const absent = join(dataDir, 'i8-created-through-link');
    symlinkSync(absent, path());
    assert.throws(() => openAuditLog(path()), refused('it is a symbolic link (not followed)'));
    assert.equal(existsSync(absent), false);
  });

  it('a FIFO is refused at once (no reader: the open does not block)', () => {
    execFileSync('mkfifo', [path()]);
    assert.throws(() => openAuditLog(path()), refused('it is a FIFO, not a regular file'));
  });

  it('a directory and a unix socket are refused', async () => {
    mkdirSync(path());
    assert.throws(() => openAuditLog(path()), refused('it is a directory, not a regular file'));
    rmSync(path(), { recursive: true });
    const server = createServer();
    await new Promise<void>((res) => server.listen(path(), res));
    try {
      assert.throws(() => openAuditLog(path()), refused('it is a socket, not a regular file'));
    } finally {
      await new Promise((res) => server.close(res));
    }
  });

  it('a file with another hard link is refused (it could be any file of the filesystem)', () => {
    const other = join(dataDir, 'i8-other-name');
    writeFileSync(other, '');
    linkSync(other, path());
    assert.throws(() => openAuditLog(path()), refused('it has 2 hard links (refusing to write through one)'));
    assert.equal(readFileSync(other, 'utf8'), '');
  });

  it('a torn last line (a writer killed mid-line) is ended first, so the next record stands on its own line', () => {
    writeFileSync(path(), '{"complete":1}\n{"torn":', { mode: 0o600 });
    const a = openAuditLog(path());
    a.append({ time: 't', network: 'n', ip: '10.0.0.2', containerId: null, ifname: null, ageSeconds: 0, verdict: 'corrupt', reason: 'r', phase: 'intent' });
    a.close();
    assert.deepEqual(readFileSync(path(), 'utf8').split('\n'), [
      '{"complete":1}',
      '{"torn":',
      '{"time":"t","network":"n","ip":"10.0.0.2","containerId":null,"ifname":null,"ageSeconds":0,"verdict":"corrupt","reason":"r","phase":"intent"}',
      '',
    ]);
  });
});

describe('the default audit log is out of the network names (issue 17 item 10)', () => {
  const legacy = () => join(dataDir, 'ipwarden-audit.log');
  const current = () => join(dataDir, '.ipwarden-audit.log');
  const REC = { time: 't', network: 'n', ip: '10.0.0.2', containerId: 'c', ifname: 'eth0', ageSeconds: 1, verdict: 'leaked', reason: 'r', phase: 'intent' } as const;
  const LINE = '{"time":"t","network":"n","ip":"10.0.0.2","containerId":"c","ifname":"eth0","ageSeconds":1,"verdict":"leaked","reason":"r","phase":"intent"}\n';
  const appendOne = (): void => {
    const a = openDefaultAuditLog(dataDir);
    a.append(REC);
    a.close();
  };

  it('its name is no network name; the old one was', () => {
    assert.deepEqual([AUDIT_LOG_NAME, isCniName(AUDIT_LOG_NAME), LEGACY_AUDIT_LOG_NAME, isCniName(LEGACY_AUDIT_LOG_NAME)], ['.ipwarden-audit.log', false, 'ipwarden-audit.log', true]);
  });
  it('a regular file at the old name is moved (its lines first), once', () => {
    writeFileSync(legacy(), '{"earlier":1}\n', { mode: 0o600 });
    appendOne();
    assert.deepEqual([existsSync(legacy()), readFileSync(current(), 'utf8')], [false, `{"earlier":1}\n${LINE}`]);
    assert.equal(migrateLegacyAuditLog(dataDir), false);
  });
  it('a directory at the old name is a network: left alone, the log made beside it', () => {
    mkdirSync(join(legacy(), ''), { recursive: true });
    writeFileSync(join(legacy(), '10.0.0.2'), 'c\r\neth0');
    appendOne();
    assert.deepEqual([readdirSync(legacy()), readFileSync(current(), 'utf8')], [['10.0.0.2'], LINE]);
  });
  it('both present (an older ipwarden still writing the old name): neither is overwritten', () => {
    writeFileSync(legacy(), 'old\n');
    writeFileSync(current(), 'new\n', { mode: 0o600 });
    appendOne();
    assert.deepEqual([readFileSync(legacy(), 'utf8'), readFileSync(current(), 'utf8')], ['old\n', `new\n${LINE}`]);
  });
  it('a symlink or a file with another hard link at the old name is not moved', () => {
    const target = join(dataDir, 'i17-victim');
    writeFileSync(target, 'precious\n');
    symlinkSync(target, legacy());
    assert.equal(migrateLegacyAuditLog(dataDir), false);
    rmSync(legacy());
    linkSync(target, legacy());
    assert.equal(migrateLegacyAuditLog(dataDir), false);
    assert.deepEqual([readFileSync(legacy(), 'utf8'), existsSync(current())], ['precious\n', false]);
  });
  it('nothing at the old name: nothing to move', () => {
    assert.equal(migrateLegacyAuditLog(dataDir), false);
    appendOne();
    assert.equal(readFileSync(current(), 'utf8'), LINE);
  });
});

describe('network discovery', () => {
  it('lists sub-directories with valid network names, sorted; skips files and odd names; follows symlinks', () => {
    mkdirSync(join(dataDir, 'zeta'));
    mkdirSync(join(dataDir, 'alpha'));
    mkdirSync(join(dataDir, '.hidden'));
    mkdirSync(join(dataDir, 'real'));
    symlinkSync(join(dataDir, 'real'), join(dataDir, 'linked'));
    symlinkSync(join(dataDir, 'nowhere'), join(dataDir, 'dangling'));
    writeFileSync(join(dataDir, 'ipwarden-audit.log'), '');
    assert.deepEqual(
      discoverNetworks(dataDir).map((n) => [n.name, n.dir]),
      ['alpha', 'linked', 'real', 'zeta'].map((n) => [n, join(dataDir, n)]),
    );
  });
  it('a missing data dir has no networks', () => {
    assert.deepEqual(discoverNetworks(join(dataDir, 'nope')), []);
  });
  it('namedNetwork checks the name and the directory', () => {
    mkdirSync(join(dataDir, 'cbr0'));
    assert.deepEqual(namedNetwork(dataDir, 'cbr0'), { name: 'cbr0', dir: join(dataDir, 'cbr0') });
    assert.throws(() => namedNetwork(dataDir, '../etc'), { name: 'UsageError', message: 'invalid network name "../etc"' });
    assert.throws(() => namedNetwork(dataDir, 'nope'), { message: `no network directory ${join(dataDir, 'nope')}` });
  });
});
