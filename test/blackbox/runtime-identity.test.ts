/**
 * identifyRuntime from real process ancestries. Needs root (to read other processes' fd/ and to
 * unshare a PID namespace) and util-linux `unshare`; without them: fails when CI=true, else skips.
 *
 * A small `node -e` "runtime" listens on a unix socket in a temp dir and spawns the reader
 * (`node --import tsx -e …identifyRuntime()…`), directly or through a `sh -c` that does not exec;
 * the "no listener" case runs the reader as pid 1 of a fresh PID namespace (`unshare --pid --fork
 * --mount-proc`), so no ancestor of the test runner can answer; there too, an ancestor exec'd from a
 * memfd (python3's fexecve of a copy of /bin/sh) is named by its argv[0]. Every process is a synchronous
 * child with a timeout; the temp dir is removed in `after`.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { requireOrSkip, ROOT } from '../helpers/cni.ts';
import type { RuntimeIdentity } from '../../src/node/runtime-identity.ts';

const isRoot = process.getuid?.() === 0;
const haveUnshare = spawnSync('unshare', ['--version'], { stdio: 'ignore' }).status === 0;

const READER = [
  process.execPath,
  '--import',
  'tsx',
  '--input-type=module',
  '-e',
  `import { identifyRuntime } from ${JSON.stringify(join(ROOT, 'src/node/runtime-identity.ts'))};
   process.stdout.write(JSON.stringify(identifyRuntime()));`,
];

/** Listen on `sock`, run `cmd` as a child, print `{listener, result}` (result = the child's JSON stdout). */
const LISTENER = `
const net = require('node:net'), cp = require('node:child_process');
const [sock, ...cmd] = process.argv.slice(1);
const srv = net.createServer().listen(sock, () => {
  const c = cp.spawn(cmd[0], cmd.slice(1), { stdio: ['ignore', 'pipe', 'inherit'] });
  let out = '';
  c.stdout.on('data', (d) => { out += d; });
  c.on('close', (code) => {
    srv.close();
    process.stdout.write(JSON.stringify({ listener: process.pid, result: out === '' ? null : JSON.parse(out) }));
    process.exitCode = code ?? 1;
  });
});`;

function run(argv: readonly string[]): string {
  const r = spawnSync(argv[0] as string, argv.slice(1), { cwd: ROOT, encoding: 'utf8', timeout: 60_000 });
  assert.equal(r.status, 0, `${argv.join(' ')}: ${r.stderr}`);
  return r.stdout;
}

describe('identifyRuntime from a real ancestry', () => {
  const skip = requireOrSkip(isRoot && haveUnshare, 'root and util-linux unshare');
  const tmp = mkdtempSync(join(tmpdir(), 'ke-rt-bb-'));
  after(() => rmSync(tmp, { recursive: true, force: true }));

  it('the parent listens: its socket is the candidate, the parent the ancestor', { skip }, () => {
    const sock = join(tmp, 'direct.sock');
    const { listener, result } = JSON.parse(run([process.execPath, '-e', LISTENER, sock, ...READER])) as { listener: number; result: RuntimeIdentity };
    assert.deepEqual(result, { candidates: [sock], ancestor: { pid: listener, comm: 'node' }, reason: `ancestor ${listener} (node) listens on ${sock}` });
  });

  it('through a non-listening sh -c in between, the listener is still found', { skip }, () => {
    const sock = join(tmp, 'via-sh.sock');
    // `; exit $?` keeps sh from exec'ing the reader, so sh really is an ancestor in between.
    const { listener, result } = JSON.parse(run([process.execPath, '-e', LISTENER, sock, 'sh', '-c', '"$0" "$@"; exit $?', ...READER])) as {
      listener: number;
      result: RuntimeIdentity;
    };
    assert.deepEqual(result, { candidates: [sock], ancestor: { pid: listener, comm: 'node' }, reason: `ancestor ${listener} (node) listens on ${sock}` });
  });

  it('no listening ancestor below pid 1: no candidates and the exact reason', { skip }, () => {
    const result = JSON.parse(run(['unshare', '--pid', '--fork', '--mount-proc', ...READER])) as RuntimeIdentity;
    assert.deepEqual(result, { candidates: [], ancestor: null, reason: 'no ancestor below pid 1 listens on a unix socket (walked: none)' });
  });

  it('an ancestor run from a memfd is named by its argv[0], never by the memfd', { skip }, (t) => {
    // In a fresh PID namespace: sh is pid 1, /bin/true pid 2, python3 pid 3, which fexecve()s a
    // memfd holding /bin/sh with argv[0] ipw-memfd-sh (Linux 6.11+ names it memfd:ipw-rt-test in
    // comm); that sh prints its comm on stderr and runs the reader (pid 4) without exec'ing it.
    const py = [
      'import os, sys',
      "fd = os.memfd_create('ipw-rt-test', 0)",
      "os.write(fd, open('/bin/sh', 'rb').read())",
      "os.execve(fd, ['ipw-memfd-sh', '-c', 'cat /proc/$$/comm >&2; \"$@\"; exit $?', 'x'] + sys.argv[1:], dict(os.environ))",
    ].join('\n');
    const inner = `/bin/true; python3 -c '${py.replace(/'/g, `'\\''`)}' "$@"; exit $?`;
    const r = spawnSync('unshare', ['--pid', '--fork', '--mount-proc', 'sh', '-c', inner, 'sh', ...READER], { cwd: ROOT, encoding: 'utf8', timeout: 60_000 });
    assert.equal(r.status, 0, r.stderr);
    const comm = r.stderr.trim().split('\n')[0] ?? '';
    const result = JSON.parse(r.stdout) as RuntimeIdentity;
    const shown = comm.startsWith('memfd:') ? 'ipw-memfd-sh' : comm;
    if (!comm.startsWith('memfd:')) t.diagnostic(`this kernel names an fexecve'd memfd ${JSON.stringify(comm)}, not memfd:…`);
    assert.deepEqual(result, { candidates: [], ancestor: null, reason: `no ancestor below pid 1 listens on a unix socket (walked: 3 ${shown})` });
  });
});
