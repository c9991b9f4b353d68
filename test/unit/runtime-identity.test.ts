/**
 * Unit tests of src/node/runtime-identity.ts: the /proc parsers on text captured on Debian 12 /
 * Linux 6.18 (containerd 1.6.20 started with a temp config, node and python listeners, a process
 * whose comm has spaces and parentheses, a zombie), and identifyRuntime over a fake procfs tree.
 */
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { identifyRuntime, parseProcNetUnix, parseProcStat, rankCandidates, SO_ACCEPTCON } from '../../src/node/runtime-identity.ts';
import type { ProcStat, RuntimeIdentity, UnixSocketRow } from '../../src/node/runtime-identity.ts';

/** `/proc/<containerd>/stat`. */
const STAT_CONTAINERD =
  '23435 (containerd) S 23425 23425 20694 0 -1 4194304 3027 0 0 0 5 1 0 0 20 0 8 0 52442 1309196288 9458 18446744073709551615 12972032 32207857 140734014602080 0 0 0 1002055680 0 2143420159 0 0 0 17 0 0 0 0 0 0 51809320 52363832 625496064 140734014606017 140734014606055 140734014606055 140734014607332 0\n';
/** A copy of sleep named `ke x) (y)`: comm holds a space and both parentheses. */
const STAT_PARENS =
  '15652 (ke x) (y)) S 15651 15648 20694 0 -1 4194304 132 0 0 0 0 0 0 0 20 0 1 0 93538 2990080 390 18446744073709551615 94005003112448 94005003130377 140730513712000 0 0 0 0 6 0 1 0 0 17 1 0 0 0 0 0 94005003144464 94005003145728 94005987528704 140730513717984 140730513718001 140730513718001 140730513719273 0\n';
const STAT_KTHREADD =
  '2 (kthreadd) S 0 0 0 0 -1 2129984 0 0 0 0 0 0 0 0 20 0 1 0 32 0 0 18446744073709551615 0 0 0 0 0 0 0 2147483647 0 1 0 0 0 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n';
const STAT_ZOMBIE =
  '15662 (sleep) Z 15660 15648 20694 0 -1 4227084 97 0 0 0 0 0 0 0 20 0 1 0 93559 0 0 18446744073709551615 0 0 0 0 0 0 0 6 0 1 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n';

/** `/proc/<containerd>/net/unix` rows of its listening sockets (grpc, ttrpc, debug), with the header. */
const UNIX_CONTAINERD = `Num       RefCount Protocol Flags    Type St Inode Path
0000000085203420: 00000002 00000000 00010000 0001 01 57144 /tmp/ke-ctd/containerd.sock.ttrpc
00000000e65b1b81: 00000002 00000000 00010000 0001 01 57145 /tmp/ke-ctd/containerd.sock
00000000f78522a9: 00000002 00000000 00010000 0001 01 57143 /tmp/ke-ctd/debug.sock
`;
/** A node server on a path with spaces and an abstract one (node pads the name with '@'), an accepted connection, unnamed sockets, a datagram and a seqpacket listener. */
const UNIX_MIXED = `Num       RefCount Protocol Flags    Type St Inode Path
00000000bbb9e69f: 00000003 00000000 00000000 0001 03  1072
00000000e8ecff1d: 00000003 00000000 00000000 0001 03 105135 /tmp/ke two words.sock
000000000282ceb6: 00000002 00000000 00010000 0001 01 105108 /tmp/ke two words.sock
000000007f3d7a0b: 00000002 00000000 00010000 0001 01 105107 @ke-abstract@@@@@@@@
00000000d2c87120: 00000002 00000000 00000000 0002 01 105155 /tmp/ke-dgram.sock
00000000701e7203: 00000002 00000000 00010000 0005 01 105156 /tmp/ke-seq.sock
`;

describe('parseProcStat (/proc/<pid>/stat)', () => {
  const cases: Array<[string, string, ProcStat | null]> = [
    ['containerd', STAT_CONTAINERD, { pid: 23435, comm: 'containerd', state: 'S', ppid: 23425 }],
    ['comm with a space and parentheses: split at the LAST )', STAT_PARENS, { pid: 15652, comm: 'ke x) (y)', state: 'S', ppid: 15651 }],
    ['kthreadd, parent 0', STAT_KTHREADD, { pid: 2, comm: 'kthreadd', state: 'S', ppid: 0 }],
    ['a zombie', STAT_ZOMBIE, { pid: 15662, comm: 'sleep', state: 'Z', ppid: 15660 }],
    ['an empty comm', '7 () S 1 7 7\n', { pid: 7, comm: '', state: 'S', ppid: 1 }],
    ['empty text', '', null],
    ['no parentheses', '7 sleep S 1\n', null],
    ['no ppid', '7 (sleep) S\n', null],
    ['a pid that is not a number', 'x (sleep) S 1\n', null],
  ];
  for (const [name, text, want] of cases) it(name, () => assert.deepEqual(parseProcStat(text), want));
});

describe('parseProcNetUnix (/proc/<pid>/net/unix)', () => {
  const row = (inode: number, flags: number, type: number, state: number, path: string | null): UnixSocketRow => ({ inode, flags, type, state, path });
  const cases: Array<[string, string, UnixSocketRow[]]> = [
    [
      'containerd: three listening stream sockets',
      UNIX_CONTAINERD,
      [
        row(57144, SO_ACCEPTCON, 1, 1, '/tmp/ke-ctd/containerd.sock.ttrpc'),
        row(57145, SO_ACCEPTCON, 1, 1, '/tmp/ke-ctd/containerd.sock'),
        row(57143, SO_ACCEPTCON, 1, 1, '/tmp/ke-ctd/debug.sock'),
      ],
    ],
    [
      'padded inode, unnamed, spaces in the path, abstract, dgram, seqpacket',
      UNIX_MIXED,
      [
        row(1072, 0, 1, 3, null),
        row(105135, 0, 1, 3, '/tmp/ke two words.sock'),
        row(105108, SO_ACCEPTCON, 1, 1, '/tmp/ke two words.sock'),
        row(105107, SO_ACCEPTCON, 1, 1, '@ke-abstract@@@@@@@@'),
        row(105155, 0, 2, 1, '/tmp/ke-dgram.sock'),
        row(105156, SO_ACCEPTCON, 5, 1, '/tmp/ke-seq.sock'),
      ],
    ],
    ['only the header', 'Num       RefCount Protocol Flags    Type St Inode Path\n', []],
    ['a truncated line', '0000000085203420: 00000002 00000000 00010000 0001\n', []],
  ];
  for (const [name, text, want] of cases) it(name, () => assert.deepEqual(parseProcNetUnix(text), want));
});

describe('rankCandidates', () => {
  const cases: Array<[string[], string[]]> = [
    [['/tmp/ke-ctd/containerd.sock.ttrpc', '/tmp/ke-ctd/containerd.sock', '/tmp/ke-ctd/debug.sock'], ['/tmp/ke-ctd/containerd.sock']],
    [['/run/x/metrics.sock', '/var/run/crio/crio.sock'], ['/var/run/crio/crio.sock', '/run/x/metrics.sock']],
    [['/run/b.sock', '/run/a.sock'], ['/run/b.sock', '/run/a.sock']],
    [['/run/cri-dockerd.sock', '/run/containerd/containerd.sock'], ['/run/cri-dockerd.sock', '/run/containerd/containerd.sock']],
    [[], []],
  ];
  for (const [input, want] of cases) it(`${JSON.stringify(input)} → ${JSON.stringify(want)}`, () => assert.deepEqual(rankCandidates(input), want));
});

// ---------------------------------------------------------------------------------------------
// A fake procfs: <root>/<pid>/{stat, fd/N → link text, net/unix}.

interface FakeProc {
  pid: number;
  comm: string;
  ppid: number;
  /** fd number → readlink text (`socket:[N]`, `/dev/null`, `anon_inode:[eventpoll]`); 'file' makes fd/ a plain file. */
  fds?: Record<number, string> | 'file';
  unix?: string;
  /** `/proc/<pid>/cmdline` (NUL-separated argv); absent: no file. */
  cmdline?: string;
}

const tmp = mkdtempSync(join(tmpdir(), 'ke-rt-unit-'));
after(() => rmSync(tmp, { recursive: true, force: true }));
let n = 0;
function tree(procs: readonly FakeProc[]): string {
  const root = join(tmp, `proc${n++}`);
  for (const p of procs) {
    const dir = join(root, String(p.pid));
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, 'stat'), `${p.pid} (${p.comm}) S ${p.ppid} ${p.pid} ${p.pid} 0 -1 4194304 0 0 0 0\n`);
    if (p.fds === 'file') writeFileSync(join(dir, 'fd'), '');
    else if (p.fds !== undefined) {
      mkdirSync(join(dir, 'fd'));
      for (const [fd, target] of Object.entries(p.fds)) symlinkSync(target, join(dir, 'fd', fd));
    }
    if (p.cmdline !== undefined) writeFileSync(join(dir, 'cmdline'), p.cmdline);
    if (p.unix !== undefined) {
      mkdirSync(join(dir, 'net'));
      writeFileSync(join(dir, 'net', 'unix'), p.unix);
    }
  }
  return root;
}

describe('identifyRuntime over a fake procfs', () => {
  const containerd: FakeProc = {
    pid: 100,
    comm: 'containerd',
    ppid: 1,
    fds: { 0: '/dev/null', 3: 'socket:[57144]', 4: 'socket:[57145]', 5: 'socket:[57143]', 6: 'anon_inode:[eventpoll]', 7: 'socket:[99999]' },
    unix: UNIX_CONTAINERD,
  };
  const cases: Array<[string, FakeProc[], number, (root: string) => RuntimeIdentity]> = [
    [
      'ipwarden ← bridge ← containerd: the gRPC socket; ttrpc and debug left out',
      [containerd, { pid: 200, comm: 'bridge', ppid: 100, fds: { 0: 'pipe:[1]' } }, { pid: 300, comm: 'ipwarden', ppid: 200, fds: {} }],
      300,
      () => ({ candidates: ['/tmp/ke-ctd/containerd.sock'], ancestor: { pid: 100, comm: 'containerd' }, reason: 'ancestor 100 (containerd) listens on /tmp/ke-ctd/containerd.sock' }),
    ],
    [
      'a parent with only a connected socket and another process\'s listeners in its namespace is passed by',
      [
        { pid: 100, comm: 'node', ppid: 1, fds: { 9: 'socket:[105108]' }, unix: UNIX_MIXED },
        { pid: 200, comm: 'sh', ppid: 100, fds: { 3: 'socket:[105135]', 4: 'socket:[105107]', 5: 'socket:[105156]', 6: 'socket:[105155]' }, unix: UNIX_MIXED },
        { pid: 300, comm: 'ipwarden', ppid: 200, fds: {} },
      ],
      300,
      () => ({ candidates: ['/tmp/ke two words.sock'], ancestor: { pid: 100, comm: 'node' }, reason: 'ancestor 100 (node) listens on /tmp/ke two words.sock' }),
    ],
    [
      'several candidates: the known CRI name first, the count in the reason',
      [
        {
          pid: 100,
          comm: 'crio',
          ppid: 1,
          fds: { 3: 'socket:[1]', 4: 'socket:[2]' },
          unix: 'Num       RefCount Protocol Flags    Type St Inode Path\n0000000000000001: 00000002 00000000 00010000 0001 01 1 /var/run/crio/metrics.sock\n0000000000000002: 00000002 00000000 00010000 0001 01 2 /var/run/crio/crio.sock\n',
        },
        { pid: 300, comm: 'ipwarden', ppid: 100 },
      ],
      300,
      () => ({ candidates: ['/var/run/crio/crio.sock', '/var/run/crio/metrics.sock'], ancestor: { pid: 100, comm: 'crio' }, reason: 'ancestor 100 (crio) listens on /var/run/crio/crio.sock and 1 more' }),
    ],
    [
      'no listening ancestor below pid 1: the walk in the reason',
      [
        { pid: 100, comm: 'ke x) (y)', ppid: 1, fds: { 0: '/dev/null' } },
        { pid: 200, comm: 'sh', ppid: 100, fds: {} },
        { pid: 300, comm: 'ipwarden', ppid: 200 },
      ],
      300,
      () => ({ candidates: [], ancestor: null, reason: 'no ancestor below pid 1 listens on a unix socket (walked: 200 sh, 100 ke x) (y))' }),
    ],
    [
      'an ancestor run from a memfd is named by its argv[0], never by the memfd (comm memfd:…); ? when argv[0] tells nothing',
      [
        { pid: 100, comm: 'memfd:sealed-91', ppid: 1, fds: {}, cmdline: 'line_io_tools/binary_backend\0--uid\x000\0' },
        { pid: 150, comm: 'memfd:runc_cloned:/proc/self/exe', ppid: 100, fds: {}, cmdline: '' },
        { pid: 160, comm: 'memfd:x', ppid: 150, fds: {}, cmdline: '/memfd:x (deleted)\0' },
        { pid: 170, comm: 'memfd:y', ppid: 160, fds: {} },
        { pid: 200, comm: 'bash', ppid: 170, fds: {}, cmdline: 'memfd-looking\0' },
        { pid: 300, comm: 'ipwarden', ppid: 200 },
      ],
      300,
      () => ({ candidates: [], ancestor: null, reason: 'no ancestor below pid 1 listens on a unix socket (walked: 200 bash, 170 ?, 160 ?, 150 ?, 100 binary_backend)' }),
    ],
    [
      'a listening ancestor run from a memfd: its argv[0] in the reason and in ancestor.comm',
      [{ ...containerd, comm: 'memfd:containerd', cmdline: '/usr/bin/containerd\0--config\0/etc/containerd/config.toml\0' }, { pid: 300, comm: 'ipwarden', ppid: 100 }],
      300,
      () => ({ candidates: ['/tmp/ke-ctd/containerd.sock'], ancestor: { pid: 100, comm: 'containerd' }, reason: 'ancestor 100 (containerd) listens on /tmp/ke-ctd/containerd.sock' }),
    ],
    [
      'an ancestor run from a memfd whose fds cannot be listed: its argv[0] in the reason',
      [{ pid: 100, comm: 'memfd:agent', ppid: 1, fds: 'file', cmdline: 'agent\0' }, { pid: 300, comm: 'ipwarden', ppid: 100 }],
      300,
      (root) => ({ candidates: [], ancestor: null, reason: `cannot read ${root}/100/fd of ancestor 100 (agent): ENOTDIR` }),
    ],
    [
      'parent is pid 1 (systemd is never the runtime)',
      [{ pid: 1, comm: 'systemd', ppid: 0, fds: { 3: 'socket:[57145]' }, unix: UNIX_CONTAINERD }, { pid: 300, comm: 'ipwarden', ppid: 1 }],
      300,
      () => ({ candidates: [], ancestor: null, reason: 'no ancestor below pid 1 listens on a unix socket (walked: none)' }),
    ],
    [
      'a kernel thread\'s child stops at kthreadd',
      [{ pid: 2, comm: 'kthreadd', ppid: 0, fds: { 3: 'socket:[57145]' }, unix: UNIX_CONTAINERD }, { pid: 300, comm: 'ipwarden', ppid: 2 }],
      300,
      () => ({ candidates: [], ancestor: null, reason: 'no ancestor below pid 1 listens on a unix socket (walked: none)' }),
    ],
    ['our own stat is missing', [], 300, (root) => ({ candidates: [], ancestor: null, reason: `cannot read ${root}/300/stat: ENOENT` })],
    [
      'an ancestor vanished mid-walk',
      [{ pid: 300, comm: 'ipwarden', ppid: 250 }],
      300,
      (root) => ({ candidates: [], ancestor: null, reason: `cannot read ${root}/250/stat: ENOENT` }),
    ],
    [
      'an ancestor whose fds cannot be listed stops the walk',
      [containerd, { pid: 200, comm: 'bridge', ppid: 100, fds: 'file' }, { pid: 300, comm: 'ipwarden', ppid: 200 }],
      300,
      (root) => ({ candidates: [], ancestor: null, reason: `cannot read ${root}/200/fd of ancestor 200 (bridge): ENOTDIR` }),
    ],
    [
      'an ancestor with sockets but no net/unix',
      [{ pid: 100, comm: 'dockerd', ppid: 1, fds: { 3: 'socket:[1]' } }, { pid: 300, comm: 'ipwarden', ppid: 100 }],
      300,
      (root) => ({ candidates: [], ancestor: null, reason: `cannot read ${root}/100/net/unix of ancestor 100 (dockerd): ENOENT` }),
    ],
  ];
  for (const [name, procs, pid, want] of cases) {
    it(name, () => {
      const root = tree(procs);
      assert.deepEqual(identifyRuntime({ procDir: root, pid }), want(root));
    });
  }
});
