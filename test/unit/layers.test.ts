/**
 * The layer check (scripts/check-layers.mjs): the repository's src/ passes it, and fixture trees
 * show that it fails — naming file, line, target and layers — on an import running up the layers
 * (static, type-only, dynamic), a peer import cli → daemon, an import cycle, a built-in without
 * `node:`, `process.exit` outside an entry, a file in no layer and an import of a pool file other
 * than its facade src/pool/index.ts; and passes a clean tree.
 */
import { after, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';

const ROOT = resolve(import.meta.dirname, '../..');
const SCRIPT = join(ROOT, 'scripts/check-layers.mjs');

const temps: string[] = [];
after(() => {
  for (const d of temps) rmSync(d, { recursive: true, force: true });
});

/** A temporary tree with `files` (path → content) under it. */
function tree(files: Record<string, string>): string {
  const root = mkdtempSync(join(tmpdir(), 'h1-layers-'));
  temps.push(root);
  for (const [path, text] of Object.entries(files)) {
    mkdirSync(dirname(join(root, path)), { recursive: true });
    writeFileSync(join(root, path), text);
  }
  return root;
}

function check(args: string[]): { status: number | null; stdout: string; stderr: string } {
  const r = spawnSync(process.execPath, [SCRIPT, ...args], { cwd: ROOT, encoding: 'utf8' });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

describe('check-layers', () => {
  it('passes on this repository', () => {
    const r = check([]);
    assert.equal(r.stderr, '');
    assert.match(r.stdout, /^check-layers: \d+ files, \d+ imports, 0 violations\n$/);
    assert.equal(r.status, 0);
  });

  it('passes a clean tree: downward imports, the allowed peer edges, packages and node: built-ins', () => {
    const root = tree({
      'src/common/ip.ts': "export const x = 1;\n",
      'src/store/store.ts': "import { x } from '../common/ip.ts';\nexport const s = x;\n",
      'src/ipam/allocator.ts': "import type { s } from '../store/store.ts';\nimport { readFileSync } from 'node:fs';\nexport type A = typeof s;\nexport const r = readFileSync;\n",
      'src/node/kernel.ts': "export const k = 1;\n",
      'src/reconcile/status.ts': "import { k } from '../node/kernel.ts';\nexport const v = k;\n",
      'src/cli/main.ts': "import { Command } from 'commander';\nexport const c = async () => (await import('../reconcile/status.ts')).v + String(Command);\n",
      'src/main.ts': "import('./cli/main.ts');\nprocess.exit(0);\n",
    });
    const r = check(['--root', root]);
    assert.equal(r.stderr, '');
    assert.equal(r.stdout, 'check-layers: 7 files, 7 imports, 0 violations\n');
    assert.equal(r.status, 0);
  });

  it('fails naming every violation: upward (static, type, dynamic), peers, cycle, built-in, process.exit, no layer', () => {
    const root = tree({
      'src/common/a.ts': "// import '../cni/fake.ts' in a comment does not count\nimport { b } from '../ipam/b.ts';\nexport const a = b;\n",
      'src/ipam/b.ts': "export const b = 1;\nexport type T = import('../cni/c.ts').C;\n",
      'src/store/s.ts': "export const s = async () => import('../reconcile/r.ts');\n",
      'src/reconcile/r.ts': "import type { C } from '../cni/c.ts';\nexport type R = C;\n",
      'src/cni/c.ts': "import { readFileSync } from 'fs';\nexport interface C { f: typeof readFileSync }\n",
      'src/daemon/y.ts': "export const y = 1;\n",
      'src/cli/x.ts': "import { y } from '../daemon/y.ts';\nimport { z } from './z.ts';\nexport const x = y + z;\n",
      'src/cli/z.ts': "import { x } from './x.ts';\nexport const z = 2;\nexport const w = () => x;\n",
      'src/node/n.ts': "process.exit(1);\n",
      'src/extra/e.ts': "export const e = 1;\n",
    });
    const r = check(['--root', root]);
    assert.equal(r.status, 1);
    assert.equal(r.stdout, '');
    assert.deepEqual(r.stderr.split('\n'), [
      "src/cli/x.ts:1 imports ../daemon/y.ts (layer 5 cli → layer 5 daemon: peers)",
      "src/cni/c.ts:1 imports fs (a Node built-in: write node:fs)",
      "src/common/a.ts:2 imports ../ipam/b.ts (layer 0 common → layer 1 ipam: runs up the layers)",
      'src/extra/e.ts:1 is in no layer (module "extra"; add it to LAYERS in scripts/check-layers.mjs)',
      "src/ipam/b.ts:2 imports ../cni/c.ts (layer 1 ipam → layer 4 cni: runs up the layers)",
      "src/node/n.ts:1 calls process.exit outside an entry file (set process.exitCode)",
      "src/reconcile/r.ts:1 imports ../cni/c.ts (layer 3 reconcile → layer 4 cni: runs up the layers)",
      "src/store/s.ts:1 imports ../reconcile/r.ts (layer 1 store → layer 3 reconcile: runs up the layers)",
      "src/cli/x.ts:1 is in an import cycle: src/cli/x.ts → src/cli/z.ts",
      'check-layers: 10 files, 8 imports, 9 violations',
      '',
    ]);
  });

  it('lets only src/pool/index.ts be imported from outside src/pool, and the pool sit between ipam and reconcile', () => {
    const root = tree({
      'src/ipam/range.ts': "export const r = 1;\n",
      'src/ipam/up.ts': "import { i } from '../pool/index.ts';\nexport const u = i;\n",
      'src/pool/blocks.ts': "import { r } from '../ipam/range.ts';\nexport const b = r;\n",
      'src/pool/index.ts': "import { b } from './blocks.ts';\nexport const i = b;\n",
      'src/pool/bad.ts': "import { n } from '../node/n.ts';\nexport const p = n;\n",
      'src/node/n.ts': "export const n = 1;\n",
      'src/reconcile/ok.ts': "import { i } from '../pool/index.ts';\nexport const o = i;\n",
      'src/cni/inside.ts': "import type { b } from '../pool/blocks.ts';\nexport type I = typeof b;\n",
    });
    const r = check(['--root', root]);
    assert.equal(r.status, 1);
    assert.equal(r.stdout, '');
    assert.deepEqual(r.stderr.split('\n'), [
      'src/cni/inside.ts:1 imports ../pool/blocks.ts (module pool is entered only through src/pool/index.ts)',
      'src/ipam/up.ts:1 imports ../pool/index.ts (layer 1 ipam → layer 2 pool: runs up the layers)',
      'src/pool/bad.ts:1 imports ../node/n.ts (layer 2 pool → layer 3 node: runs up the layers)',
      'check-layers: 8 files, 6 imports, 3 violations',
      '',
    ]);
  });

  it('is a usage error with an unknown argument (exit 2)', () => {
    const r = check(['--nope']);
    assert.equal(r.status, 2);
    assert.match(r.stderr, /^check-layers: unknown argument "--nope"\n/);
  });
});
