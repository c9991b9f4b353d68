#!/usr/bin/env node
// Runs the whole test suite with node:test (through tsx, so the TypeScript sources run as they are).
// Usage: node scripts/run-tests.mjs [substring-filter ...]
// Test files: test/**/*.test.ts. Suites that need root, the upstream host-local binary or a real
// containerd check for them and fail loudly (not skip) when CI=true and they are missing.
import { readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { spawnSync } from 'node:child_process';

function walk(dir) {
  const out = [];
  for (const name of readdirSync(dir).sort()) {
    const p = join(dir, name);
    if (statSync(p).isDirectory()) out.push(...walk(p));
    else if (name.endsWith('.test.ts')) out.push(p);
  }
  return out;
}

const filters = process.argv.slice(2);
const files = walk('test').filter((f) => filters.length === 0 || filters.some((s) => f.includes(s)));
if (files.length === 0) {
  console.error('no test files matched');
  process.exitCode = 1;
} else {
  const r = spawnSync(process.execPath, ['--import', 'tsx', '--test', '--test-concurrency=1', ...files], {
    stdio: 'inherit',
  });
  process.exitCode = r.status ?? 1;
}
