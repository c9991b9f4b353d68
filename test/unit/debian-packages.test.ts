// scripts/debian-packages.mjs, the install step `npm run image --install` and `npm run lab` share:
// what dpkg lists as installed is left alone (no apt-get runs: the PATH below has none), a missing
// package goes to apt-get, and a failure names the command. Reads this machine's dpkg database
// (Debian); skipped without dpkg-query (CI=true: fail).
import { after, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { installDebianPackages, missingDebianPackages } from '../../scripts/debian-packages.mjs';

const DPKG_QUERY = ['/usr/bin/dpkg-query', '/bin/dpkg-query'].find((p) => existsSync(p));
const unavailable = DPKG_QUERY === undefined ? 'no dpkg-query (not Debian)' : process.getuid?.() !== 0 ? 'needs root (the install path)' : undefined;
const skip = process.env['CI'] === 'true' ? false : (unavailable ?? false);
const NOT_A_PACKAGE = 'ipwarden-test-no-such-package';

describe('Debian prerequisites: only what dpkg lacks goes to apt-get', { skip }, () => {
  // A PATH with dpkg-query and nothing else: an apt-get run would fail with ENOENT.
  const bin = mkdtempSync(join(tmpdir(), 'ipwarden-debpkg-test-'));
  if (DPKG_QUERY !== undefined) symlinkSync(DPKG_QUERY, join(bin, 'dpkg-query'));
  const path = process.env['PATH'];
  after(() => {
    process.env['PATH'] = path;
    rmSync(bin, { recursive: true, force: true });
  });

  it('missingDebianPackages: installed ones left out, unknown ones kept, in the order given', () => {
    assert.ok(DPKG_QUERY !== undefined, 'dpkg-query');
    assert.equal(spawnSync(DPKG_QUERY, ['-W', 'libc6', 'tar']).status, 0, 'libc6 and tar are installed here');
    assert.deepEqual(missingDebianPackages([NOT_A_PACKAGE, 'libc6', 'tar', `${NOT_A_PACKAGE}-2`]), [NOT_A_PACKAGE, `${NOT_A_PACKAGE}-2`]);
    assert.deepEqual(missingDebianPackages([]), []);
  });

  it('installDebianPackages: nothing missing → resolves [] without running apt-get', async () => {
    process.env['PATH'] = bin;
    const lines: string[] = [];
    assert.deepEqual(await installDebianPackages(['libc6', 'tar'], { log: (l) => lines.push(l) }), []);
    assert.deepEqual(lines, []);
  });

  it('installDebianPackages: a missing package → "installing … with apt-get", then apt-get (here absent: the error names it)', async () => {
    process.env['PATH'] = bin;
    const lines: string[] = [];
    await assert.rejects(installDebianPackages(['libc6', NOT_A_PACKAGE], { log: (l) => lines.push(l) }), { message: 'apt-get: cannot run it (ENOENT)' });
    assert.deepEqual(lines, [`installing ${NOT_A_PACKAGE} with apt-get`]);
  });

  it('without dpkg-query every package counts as missing', () => {
    process.env['PATH'] = '/nonexistent';
    assert.deepEqual(missingDebianPackages(['libc6']), ['libc6']);
  });
});
