/**
 * makeDirs (src/common/make-dirs.ts): `mkdir -p` that always ends, with the errors Node's
 * recursive mkdir gives — except under /proc, where Node's never returns.
 */
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { after, describe, it } from 'node:test';
import { makeDirs } from '../../src/common/make-dirs.ts';
import { ROOT, tempDir } from '../helpers/cni.ts';

const t = tempDir('ipw-mkdirs-');
after(t.cleanup);
const umask = process.umask();
process.umask(umask);

/** The error `fn` throws, as [code, message]. */
function thrown(fn: () => void): [unknown, unknown] {
  try {
    fn();
  } catch (e) {
    return [(e as NodeJS.ErrnoException).code, (e as Error).message];
  }
  return [null, null];
}

describe('makeDirs', () => {
  it('makes every missing component with the mode (less the umask), and accepts what exists', () => {
    const p = join(t.dir, 'a', 'b', 'c');
    makeDirs(p, 0o750);
    for (const d of [join(t.dir, 'a'), join(t.dir, 'a', 'b'), p]) assert.equal(statSync(d).mode & 0o777, 0o750 & ~umask, d);
    makeDirs(p, 0o700); // exists: nothing changes
    assert.equal(statSync(p).mode & 0o777, 0o750 & ~umask);
    makeDirs(join(p, 'd'), 0o755); // one level, the parent there
    assert.equal(statSync(join(p, 'd')).isDirectory(), true);
  });

  it('follows an existing symlink to a directory, as mkdir -p does', () => {
    mkdirSync(join(t.dir, 'real'));
    symlinkSync(join(t.dir, 'real'), join(t.dir, 'link'));
    makeDirs(join(t.dir, 'link', 'x', 'y'), 0o755);
    assert.equal(statSync(join(t.dir, 'real', 'x', 'y')).isDirectory(), true);
    makeDirs(join(t.dir, 'link'), 0o755);
  });

  it('a relative path is taken from the working directory', () => {
    const rel = relative(process.cwd(), join(t.dir, 'rel', 'z'));
    makeDirs(rel, 0o755);
    assert.equal(statSync(join(t.dir, 'rel', 'z')).isDirectory(), true);
  });

  it('a file in the way: EEXIST for the path itself, ENOTDIR for an ancestor', () => {
    const f = join(t.dir, 'file');
    writeFileSync(f, '');
    assert.deepEqual(thrown(() => makeDirs(f, 0o755)), ['EEXIST', `EEXIST: file already exists, mkdir '${f}'`]);
    assert.deepEqual(thrown(() => makeDirs(join(f, 'sub', 'x'), 0o755)), ['ENOTDIR', `ENOTDIR: not a directory, mkdir '${join(f, 'sub', 'x')}'`]);
  });

  it('under /proc (mkdir of a new name says ENOENT though /proc exists): ENOENT, at once', { skip: existsSync('/proc/self') ? false : 'no /proc' }, () => {
    // In a child process: Node's own recursive mkdir never returns here (a synchronous loop that
    // no test timeout can interrupt), so a regression must fail this test, not hang the suite.
    const code = `import { makeDirs } from ${JSON.stringify(join(ROOT, 'src/common/make-dirs.ts'))};
      for (const p of ['/proc/ipwarden-no-such/x', '/proc/ipwarden-no-such']) {
        try { makeDirs(p, 0o755); console.log('made ' + p); } catch (e) { console.log(e.code + ' ' + e.message); }
      }`;
    const r = spawnSync(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', code], { encoding: 'utf8', timeout: 60_000, cwd: ROOT });
    assert.deepEqual([r.signal, r.status, r.stdout.trim().split('\n')], [null, 0, ["ENOENT ENOENT: no such file or directory, mkdir '/proc/ipwarden-no-such'", "ENOENT ENOENT: no such file or directory, mkdir '/proc/ipwarden-no-such'"]]);
  });

  it('a read-only file system: EROFS, as mkdir(2) says (Node\'s recursive mkdir said ENOENT)', { skip: process.getuid?.() === 0 ? false : 'needs root to mount' }, () => {
    const ro = join(t.dir, 'ro');
    mkdirSync(ro);
    execFileSync('mount', ['-t', 'tmpfs', '-o', 'ro,size=1m', 'ipw-mkdirs-ro', ro]);
    try {
      assert.deepEqual(thrown(() => makeDirs(join(ro, 'net', 'x'), 0o755)), ['EROFS', `EROFS: read-only file system, mkdir '${join(ro, 'net')}'`]);
    } finally {
      execFileSync('umount', [ro]);
    }
  });

  it('a dangling symlink as an ancestor: ENOENT, nothing made at its target', () => {
    const target = join(t.dir, 'gone');
    symlinkSync(target, join(t.dir, 'dangling'));
    const [code] = thrown(() => makeDirs(join(t.dir, 'dangling', 'x'), 0o755));
    assert.equal(code, 'ENOENT');
    assert.equal(existsSync(target), false);
  });
});
