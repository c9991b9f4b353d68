/**
 * src/daemon/node-name-check.ts: the daemon's agreement check of the node-name file with its
 * NODE_NAME, every answer exact (a temp dir standing for the CNI bin dir; files as install-cni
 * writes them, owned by the test's user).
 */
import { after, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { nodeNameMismatch } from '../../src/daemon/node-name-check.ts';

const dir = mkdtempSync(join(tmpdir(), 'ipw-nnc-'));
after(() => rmSync(dir, { recursive: true, force: true }));
const file = join(dir, 'ipwarden.d', 'node-name');
function write(text: string): void {
  mkdirSync(join(dir, 'ipwarden.d'), { recursive: true, mode: 0o755 });
  writeFileSync(file, text, { mode: 0o644 });
}
const host = () => 'host-new';

describe('nodeNameMismatch', () => {
  it('no file, or a daemon without NODE_NAME: nothing to disagree with', () => {
    assert.equal(nodeNameMismatch({ NODE_NAME: 'n1' }, dir, host), null);
    write('n2\nhost host-new\n');
    assert.equal(nodeNameMismatch({}, dir, host), null);
    assert.equal(nodeNameMismatch({ NODE_NAME: '' }, dir, host), null);
  });
  it('agrees: the same name, written on this host (or without a host line)', () => {
    write('n1\nhost host-new\n');
    assert.equal(nodeNameMismatch({ NODE_NAME: 'n1' }, dir, host), null);
    write('n1\n');
    assert.equal(nodeNameMismatch({ NODE_NAME: 'n1' }, dir, host), null);
  });
  it('another node name', () => {
    write('n2\nhost host-new\n');
    assert.equal(nodeNameMismatch({ NODE_NAME: 'n1' }, dir, host), `the node name file ${file} names node n2, but the daemon's NODE_NAME is n1: while the daemon is down, the standalone fallback would serve this node's pods as node n2`);
  });
  it('the same name written under an earlier host name (a renamed host)', () => {
    write('n1\nhost host-old\n');
    assert.equal(nodeNameMismatch({ NODE_NAME: 'n1' }, dir, host), `the node name file ${file} was written on host host-old, but this host is host-new (renamed?): the standalone fallback ignores it and would serve this node's pods as node host-new; run install-cni again (or give the daemon --cni-bin-dir)`);
  });
  it('a file the fallback cannot use', () => {
    write('not a name!\n');
    assert.equal(nodeNameMismatch({ NODE_NAME: 'n1' }, dir, host), `the node name file ${file} must be a node name of at most 253 letters, digits, '_', '.' or '-' starting with a letter or digit, got "not a name!": the standalone fallback cannot name this node (the daemon's NODE_NAME is n1)`);
  });
});
