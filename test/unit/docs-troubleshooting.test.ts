/**
 * docs/troubleshooting.md goes from each error message a user sees (the CNI `msg`) to its cause and
 * fix: every example message of docs/errors.md's table is found on the troubleshooting page.
 *
 * A message is found when the start of its text — up to its first placeholder (`...` or `…`),
 * at most 40 characters — appears on the page (placeholders written either way). The first 40
 * characters are what a user pastes into a search box; the rest of an example names paths and
 * addresses that differ on every node.
 */
import { strict as assert } from 'node:assert';
import { describe, it } from 'node:test';
import { readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';

const ROOT = resolve(import.meta.dirname, '../..');

/** `…` written as `...`, so either spelling matches. */
function norm(s: string): string {
  return s.replace(/\u2026/g, '...');
}

/** The searchable start of an example message: up to its first placeholder, at most 40 characters. */
export function messageHead(example: string): string {
  return norm(example).split('...')[0]!.trimEnd().slice(0, 40);
}

/** Rows of the errors table: internal code → example messages (the backticked texts of the last cell). */
export function exampleMessages(errorsMd: string): Map<string, string[]> {
  const out = new Map<string, string[]>();
  for (const line of errorsMd.split('\n')) {
    const m = /^\| `([A-Z_]+)` \|/.exec(line);
    if (m === null) continue;
    const cells = line.split(' | ');
    const last = cells[cells.length - 1]!.replace(/\|\s*$/, '');
    out.set(m[1]!, [...last.matchAll(/`([^`]+)`/g)].map((x) => x[1]!));
  }
  return out;
}

describe('docs/troubleshooting.md covers docs/errors.md', () => {
  const errors = readFileSync(join(ROOT, 'docs/errors.md'), 'utf8');
  const page = norm(readFileSync(join(ROOT, 'docs/troubleshooting.md'), 'utf8'));
  const rows = exampleMessages(errors);

  it('reads the errors table (every internal code of src/common/errors.ts has a row)', () => {
    const src = readFileSync(join(ROOT, 'src/common/errors.ts'), 'utf8');
    const union = /export type ErrorCode =([^;]+);/.exec(src);
    assert.ok(union, 'src/common/errors.ts: the ErrorCode union was not found');
    const codes = [...union[1]!.matchAll(/'([A-Z_]+)'/g)].map((x) => x[1]!).sort();
    assert.deepEqual([...rows.keys()].sort(), codes);
  });

  it('finds every example message on the troubleshooting page', () => {
    const missing: string[] = [];
    for (const [code, examples] of rows) {
      for (const e of examples) {
        const head = messageHead(e);
        if (head.length < 8) continue; // a bare placeholder names no message
        if (!page.includes(head)) missing.push(`${code}: ${JSON.stringify(head)}`);
      }
    }
    assert.deepEqual(missing, []);
  });

  it('the matching rule: up to the first placeholder, 40 characters at most', () => {
    assert.equal(messageHead('etcd at http://127.0.0.1:2379 is unavailable: ...'), 'etcd at http://127.0.0.1:2379 is unavail');
    assert.equal(messageHead('CRI RuntimeService/PodSandboxStatus at … failed'), 'CRI RuntimeService/PodSandboxStatus at');
    assert.equal(messageHead('no IP ranges specified'), 'no IP ranges specified');
  });
});
