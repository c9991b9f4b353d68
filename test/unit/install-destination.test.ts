/**
 * `trustedDestination` (src/cli/install-cni.ts): where install-cni (root) may write. Every
 * directory from `/` down must be root's and writable by nobody else — a group-writable one only
 * when its group is root's (gid 0: some hosts ship /opt/cni/bin 0775 root:root); a root-owned
 * sticky directory (/tmp) is allowed above the destination, not as it. Exact messages. Root only
 * (chown).
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { chmodSync, chownSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, lchownSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { UsageError } from '../../src/common/errors.ts';
import { trustedDestination } from '../../src/cli/install-cni.ts';

const skip = process.getuid?.() === 0 ? false : 'needs root (chown)';

describe('trustedDestination', { skip }, () => {
  let t = '';
  before(() => {
    t = mkdtempSync(join(tmpdir(), 'ipwarden-dest-'));
    chmodSync(t, 0o755);
  });
  after(() => rmSync(t, { recursive: true, force: true }));
  const dir = (name: string, mode: number, uid = 0, gid = 0): string => {
    const d = join(t, name);
    mkdirSync(d);
    chownSync(d, uid, gid);
    chmodSync(d, mode);
    return d;
  };
  const refused = (d: string, why: string) =>
    assert.throws(() => trustedDestination(d, 0), (e: unknown) => e instanceof UsageError && e.message === `install-cni: ${why}: refusing to install there (--dest ${d})`);

  it('root-owned 0755 and 0775 with group root: accepted, as their real path', () => {
    const a = dir('a', 0o755);
    assert.equal(trustedDestination(a, 0), a);
    const b = dir('b', 0o775, 0, 0);
    assert.equal(trustedDestination(b, 0), b);
  });
  it('group-writable with another group, others-writable, sticky-writable, or another owner: refused', () => {
    const g = dir('g', 0o775, 0, 1);
    refused(g, `${g} is writable by group or others (mode 775)`);
    const o = dir('o', 0o757);
    refused(o, `${o} is writable by group or others (mode 757)`);
    const s = dir('s', 0o1777);
    refused(s, `${s} is writable by group or others (mode 1777)`);
    const u = dir('u', 0o755, 65534, 65534);
    refused(u, `${u} is owned by uid 65534`);
  });
  it('a symlink is followed only when root owns it', () => {
    const target = dir('target', 0o755);
    const mine = join(t, 'mine');
    symlinkSync(target, mine);
    assert.equal(trustedDestination(mine, 0), target);
    const theirs = join(t, 'theirs');
    symlinkSync(target, theirs);
    lchownSync(theirs, 65534, 65534);
    refused(theirs, `${theirs} is a symlink owned by uid 65534 (not followed)`);
  });
});
