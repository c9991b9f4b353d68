/**
 * Unit tests of src/node/kernel-evidence.ts: the /proc parsers on text captured on Debian 12 /
 * Linux 6.18 (`ip netns add kecap1`, bridges kebr0/kebr1 and a veth pair kev0/kev1 inside, IPv4 and
 * IPv6 `nodad` addresses, a /31, a /32, a down link, a default route, a policy rule), and
 * readKernelEvidence over a fake procfs tree in a temp dir (`procDir`), so no root is needed.
 */
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { AppError } from '../../src/common/errors.ts';
import {
  holdersOf,
  inFlightFor,
  isInUse,
  parseEnviron,
  parseFibTrieLocal,
  parseIfInet6,
  parseNetnsDump,
  readKernelEvidence,
  readPinnedNamespaces,
} from '../../src/node/kernel-evidence.ts';
import type { AddressHolder, KernelEvidence } from '../../src/node/kernel-evidence.ts';

/** kecap1 with kebr0 up: 10.77.0.5/24, 10.77.0.9/24, 10.78.0.0/31 on kebr0, 10.79.1.1/16 on kebr1 (never up), 10.80.0.1/32 on veth kev0, default via 10.77.0.1. */
const FIB_UP = `Main:
  +-- 0.0.0.0/1 2 0 2
     +-- 0.0.0.0/4 2 0 2
        |-- 0.0.0.0
           /0 universe UNICAST
        +-- 10.64.0.0/11 2 0 2
           +-- 10.76.0.0/14 2 0 1
              +-- 10.77.0.0/24 2 0 2
                 +-- 10.77.0.0/28 2 0 1
                    |-- 10.77.0.0
                       /24 link UNICAST
                    |-- 10.77.0.5
                       /32 host LOCAL
                    |-- 10.77.0.9
                       /32 host LOCAL
                 |-- 10.77.0.255
                    /32 link BROADCAST
              |-- 10.78.0.0
                 /32 host LOCAL
                 /31 link UNICAST
              |-- 10.79.1.1
                 /32 host LOCAL
           |-- 10.80.0.1
              /32 host LOCAL
     +-- 127.0.0.0/8 2 0 2
        +-- 127.0.0.0/31 1 0 0
           |-- 127.0.0.0
              /8 host LOCAL
           |-- 127.0.0.1
              /32 host LOCAL
        |-- 127.255.255.255
           /32 link BROADCAST
Local:
  +-- 0.0.0.0/1 2 0 2
     +-- 0.0.0.0/4 2 0 2
        |-- 0.0.0.0
           /0 universe UNICAST
        +-- 10.64.0.0/11 2 0 2
           +-- 10.76.0.0/14 2 0 1
              +-- 10.77.0.0/24 2 0 2
                 +-- 10.77.0.0/28 2 0 1
                    |-- 10.77.0.0
                       /24 link UNICAST
                    |-- 10.77.0.5
                       /32 host LOCAL
                    |-- 10.77.0.9
                       /32 host LOCAL
                 |-- 10.77.0.255
                    /32 link BROADCAST
              |-- 10.78.0.0
                 /32 host LOCAL
                 /31 link UNICAST
              |-- 10.79.1.1
                 /32 host LOCAL
           |-- 10.80.0.1
              /32 host LOCAL
     +-- 127.0.0.0/8 2 0 2
        +-- 127.0.0.0/31 1 0 0
           |-- 127.0.0.0
              /8 host LOCAL
           |-- 127.0.0.1
              /32 host LOCAL
        |-- 127.255.255.255
           /32 link BROADCAST
`;

/** The same after `ip link set kebr0 down`: the IPv4 addresses stay, the prefix, broadcast and default routes go. */
const FIB_DOWN = `Main:
  +-- 0.0.0.0/1 2 0 2
     +-- 10.64.0.0/11 2 0 2
        +-- 10.76.0.0/14 2 0 1
           +-- 10.77.0.0/28 2 0 2
              |-- 10.77.0.5
                 /32 host LOCAL
              |-- 10.77.0.9
                 /32 host LOCAL
           |-- 10.78.0.0
              /32 host LOCAL
           |-- 10.79.1.1
              /32 host LOCAL
        |-- 10.80.0.1
           /32 host LOCAL
     +-- 127.0.0.0/8 2 0 2
        +-- 127.0.0.0/31 1 0 0
           |-- 127.0.0.0
              /8 host LOCAL
           |-- 127.0.0.1
              /32 host LOCAL
        |-- 127.255.255.255
           /32 link BROADCAST
Local:
  +-- 0.0.0.0/1 2 0 2
     +-- 10.64.0.0/11 2 0 2
        +-- 10.76.0.0/14 2 0 1
           +-- 10.77.0.0/28 2 0 2
              |-- 10.77.0.5
                 /32 host LOCAL
              |-- 10.77.0.9
                 /32 host LOCAL
           |-- 10.78.0.0
              /32 host LOCAL
           |-- 10.79.1.1
              /32 host LOCAL
        |-- 10.80.0.1
           /32 host LOCAL
     +-- 127.0.0.0/8 2 0 2
        +-- 127.0.0.0/31 1 0 0
           |-- 127.0.0.0
              /8 host LOCAL
           |-- 127.0.0.1
              /32 host LOCAL
        |-- 127.255.255.255
           /32 link BROADCAST
`;

/** The same with `ip rule add from 10.80.0.1 table 100` and a route in table 100: the tables are printed unmerged. */
const FIB_RULES = `Id 100:
  |-- 10.90.0.0
     /24 link UNICAST
Local:
  +-- 0.0.0.0/1 2 0 2
     +-- 10.64.0.0/11 2 0 2
        +-- 10.76.0.0/14 3 0 5
           +-- 10.77.0.0/28 2 0 2
              |-- 10.77.0.5
                 /32 host LOCAL
              |-- 10.77.0.9
                 /32 host LOCAL
           |-- 10.78.0.0
              /32 host LOCAL
           |-- 10.79.1.1
              /32 host LOCAL
        |-- 10.80.0.1
           /32 host LOCAL
     +-- 127.0.0.0/8 2 0 2
        +-- 127.0.0.0/31 1 0 0
           |-- 127.0.0.0
              /8 host LOCAL
           |-- 127.0.0.1
              /32 host LOCAL
        |-- 127.255.255.255
           /32 link BROADCAST
`;

/** The root namespace of this machine: 192.0.2.2/24 on eth0 and a 0.0.0.0/0 default route. */
const FIB_HOST = `Main:
  +-- 0.0.0.0/0 3 0 5
     |-- 0.0.0.0
        /0 universe UNICAST
     +-- 127.0.0.0/8 2 0 2
        +-- 127.0.0.0/31 1 0 0
           |-- 127.0.0.0
              /8 host LOCAL
           |-- 127.0.0.1
              /32 host LOCAL
        |-- 127.255.255.255
           /32 link BROADCAST
     +-- 192.0.2.0/24 2 0 2
        +-- 192.0.2.0/30 2 0 2
           |-- 192.0.2.0
              /24 link UNICAST
           |-- 192.0.2.2
              /32 host LOCAL
        |-- 192.0.2.255
           /32 link BROADCAST
Local:
  +-- 0.0.0.0/0 3 0 5
     |-- 0.0.0.0
        /0 universe UNICAST
     +-- 127.0.0.0/8 2 0 2
        +-- 127.0.0.0/31 1 0 0
           |-- 127.0.0.0
              /8 host LOCAL
           |-- 127.0.0.1
              /32 host LOCAL
        |-- 127.255.255.255
           /32 link BROADCAST
     +-- 192.0.2.0/24 2 0 2
        +-- 192.0.2.0/30 2 0 2
           |-- 192.0.2.0
              /24 link UNICAST
           |-- 192.0.2.2
              /32 host LOCAL
        |-- 192.0.2.255
           /32 link BROADCAST
`;

/** if_inet6 of kecap1 with kebr0 up (fd77::5, fd77::6 nodad on kebr0; fd79::1 on kebr1, never up; fd80::1/128 on kev0). */
const INET6_UP = `fd800000000000000000000000000001 05 80 00 82     kev0
00000000000000000000000000000001 01 80 10 80       lo
fd770000000000000000000000000006 02 40 00 82    kebr0
fe800000000000004cd9e6fffecf6055 02 40 20 80    kebr0
fd790000000000000000000000000001 03 40 00 82    kebr1
fd770000000000000000000000000005 02 40 00 82    kebr0
fe8000000000000090235dfffe10dd60 05 40 20 80     kev0
fe80000000000000f46a88fffeb72e43 04 40 20 80     kev1
`;

/** The same after kebr0 went down: the kernel deleted fd77::5 and fd77::6 (keep_addr_on_down=0). */
const INET6_DOWN = `fd800000000000000000000000000001 05 80 00 82     kev0
00000000000000000000000000000001 01 80 10 80       lo
fd790000000000000000000000000001 03 40 00 82    kebr1
fe8000000000000090235dfffe10dd60 05 40 20 80     kev0
fe80000000000000f46a88fffeb72e43 04 40 20 80     kev1
`;

const HOST_INET6 = `00000000000000000000000000000001 01 80 10 80       lo
fd000000000000000000000000000002 04 40 00 82     eth0
fe8000000000000000fc00fffe000001 04 40 20 80     eth0
`;

const KECAP1_V4 = ['10.77.0.5', '10.77.0.9', '10.78.0.0', '10.79.1.1', '10.80.0.1'];

describe('parseFibTrieLocal (/proc/<pid>/net/fib_trie)', () => {
  const cases: Array<[string, string, string[]]> = [
    ['links up: prefix, broadcast and default routes are not addresses; a /31 leaf with two aliases counts once', FIB_UP, KECAP1_V4],
    ['kebr0 down: its IPv4 addresses stay', FIB_DOWN, KECAP1_V4],
    ['a policy rule: unmerged tables, table 100 has no LOCAL routes', FIB_RULES, KECAP1_V4],
    ['the root namespace with a 0.0.0.0/0 default route', FIB_HOST, ['192.0.2.2']],
    ['empty text', '', []],
    ['only loopback', 'Local:\n  +-- 127.0.0.0/8 2 0 2\n     |-- 127.0.0.1\n        /32 host LOCAL\n', []],
    ['a broadcast /32 is not an address', 'Local:\n  |-- 10.1.255.255\n     /32 link BROADCAST\n', []],
    ['an alias line after an internal node belongs to no leaf', 'Main:\n  +-- 10.1.0.0/16 2 0 2\n     /32 host LOCAL\n', []],
    ['if_inet6 lines in the same text are ignored', `${FIB_HOST}${HOST_INET6}`, ['192.0.2.2']],
  ];
  for (const [name, text, want] of cases) it(name, () => assert.deepEqual(parseFibTrieLocal(text), want));
});

describe('parseIfInet6 (/proc/<pid>/net/if_inet6)', () => {
  const cases: Array<[string, string, Array<{ ip: string; ifname: string }>]> = [
    [
      'links up: loopback and link-local left out, /128 on a veth, a never-up bridge keeps its address',
      INET6_UP,
      [
        { ip: 'fd80::1', ifname: 'kev0' },
        { ip: 'fd77::6', ifname: 'kebr0' },
        { ip: 'fd79::1', ifname: 'kebr1' },
        { ip: 'fd77::5', ifname: 'kebr0' },
      ],
    ],
    [
      'kebr0 went down: the kernel deleted its addresses',
      INET6_DOWN,
      [
        { ip: 'fd80::1', ifname: 'kev0' },
        { ip: 'fd79::1', ifname: 'kebr1' },
      ],
    ],
    ['the root namespace', HOST_INET6, [{ ip: 'fd00::2', ifname: 'eth0' }]],
    ['febf:: is link-local too, fec0:: is not', 'febf0000000000000000000000000001 02 40 20 80 eth0\nfec00000000000000000000000000001 02 40 00 80 eth0\n', [{ ip: 'fec0::1', ifname: 'eth0' }]],
    ['malformed lines are skipped', 'fd00::1 02 40 00 80 eth0\nfd000000000000000000000000000002 04 40 00\n\n', []],
    ['fib_trie lines in the same text are ignored', FIB_HOST, []],
  ];
  for (const [name, text, want] of cases) it(name, () => assert.deepEqual(parseIfInet6(text), want));
});

describe('parseEnviron (/proc/<pid>/environ)', () => {
  const cases: Array<[string, string, Array<[string, string]>]> = [
    ['NUL-separated with a trailing NUL', 'CNI_COMMAND=ADD\0CNI_CONTAINERID=abc\0CNI_IFNAME=eth0\0', [['CNI_COMMAND', 'ADD'], ['CNI_CONTAINERID', 'abc'], ['CNI_IFNAME', 'eth0']]],
    ['no trailing NUL', 'A=1\0B=2', [['A', '1'], ['B', '2']]],
    ['the first of a repeated name wins (getenv)', 'A=1\0A=2\0', [['A', '1']]],
    ['"=" inside a value', 'CNI_ARGS=K8S_POD_NAME=a;IgnoreUnknown=1\0', [['CNI_ARGS', 'K8S_POD_NAME=a;IgnoreUnknown=1']]],
    ['an empty value', 'CNI_IFNAME=\0', [['CNI_IFNAME', '']]],
    ['entries without a name or "=" are skipped', 'junk\0=x\0A=1\0\0', [['A', '1']]],
    ['an empty environment (a kernel thread)', '', []],
    ['UTF-8', 'NAME=été\0', [['NAME', 'été']]],
  ];
  for (const [name, text, want] of cases) it(name, () => assert.deepEqual([...parseEnviron(Buffer.from(text, 'utf8'))], want));
  it('reads a view into a bigger buffer without the bytes around it', () => {
    const big = Buffer.from('X=0\0A=1\0Y=2\0');
    assert.deepEqual([...parseEnviron(big.subarray(4, 8))], [['A', '1']]);
  });
});

describe('parseNetnsDump (the pinned-namespace helper output)', () => {
  const files = ['/run/netns/a', '/run/netns/b', '/run/netns/c'];
  it('perl form: inode, text, and an error record per file', () => {
    const out = `\0F /run/netns/a\n\0I 4026532189\n\0P\n${FIB_HOST}${HOST_INET6}\0F /run/netns/b\n\0E 1 setns /run/netns/b: Operation not permitted\n\0F /run/netns/c\n\0E 2 open /run/netns/c: No such file or directory\n`;
    assert.deepEqual(parseNetnsDump(out, files), [
      { file: '/run/netns/a', text: `${FIB_HOST}${HOST_INET6}`, fibIno: 4026532189, errno: null, error: null },
      { file: '/run/netns/b', text: null, fibIno: null, errno: 1, error: 'setns /run/netns/b: Operation not permitted' },
      { file: '/run/netns/c', text: null, fibIno: null, errno: 2, error: 'open /run/netns/c: No such file or directory' },
    ]);
  });
  it('sh/nsenter form: no inode; a multi-line message becomes one line', () => {
    const out = `\0F /run/netns/a\n\0P\n${FIB_HOST}\n\0F /run/netns/b\n\0E 0 nsenter: reassociate to namespace 'ns/net' failed:\nInvalid argument\n`;
    assert.deepEqual(parseNetnsDump(out, files.slice(0, 2)), [
      { file: '/run/netns/a', text: `${FIB_HOST}\n`, fibIno: null, errno: null, error: null },
      { file: '/run/netns/b', text: null, fibIno: null, errno: 0, error: "nsenter: reassociate to namespace 'ns/net' failed: Invalid argument" },
    ]);
  });
  it('a file the helper printed nothing for is an error', () => {
    assert.deepEqual(parseNetnsDump('\0F /run/netns/a\n', ['/run/netns/a']), [
      { file: '/run/netns/a', text: null, fibIno: null, errno: 0, error: 'the helper printed nothing for it' },
    ]);
  });
  it('fewer records than files: every file without its own record is a gap (errno 0), never absence', () => {
    const out = `\0F /run/netns/a\n\0I 7\n\0P\n${FIB_HOST}`;
    assert.deepEqual(parseNetnsDump(out, files), [
      { file: '/run/netns/a', text: FIB_HOST, fibIno: 7, errno: null, error: null },
      { file: '/run/netns/b', text: null, fibIno: null, errno: 0, error: 'the helper printed no record for it' },
      { file: '/run/netns/c', text: null, fibIno: null, errno: 0, error: 'the helper printed no record for it' },
    ]);
    assert.deepEqual(parseNetnsDump('', files.slice(0, 1)), [{ file: '/run/netns/a', text: null, fibIno: null, errno: 0, error: 'the helper printed no record for it' }]);
  });
  it('a record that names another file than the one at its position is a gap', () => {
    const out = `\0F /run/netns/b\n\0P\n${FIB_HOST}\0F /run/netns/b\n\0P\n${FIB_HOST}`;
    assert.deepEqual(parseNetnsDump(out, files.slice(0, 2)), [
      { file: '/run/netns/a', text: null, fibIno: null, errno: 0, error: 'the helper\'s record 1 names "/run/netns/b", not this file' },
      { file: '/run/netns/b', text: FIB_HOST, fibIno: null, errno: null, error: null },
    ]);
  });
  it('a newline in a file name: the raw name (perl, sh) and the static helper\'s space both match', () => {
    const f = '/run/netns/x\ny';
    assert.equal(parseNetnsDump(`\0F /run/netns/x\ny\n\0P\n${FIB_HOST}`, [f])[0]?.error, null);
    assert.equal(parseNetnsDump(`\0F /run/netns/x y\n\0P\n${FIB_HOST}`, [f])[0]?.error, null);
  });
  it('more records than files: nothing can be matched, every entry is a gap', () => {
    const out = `\0F /run/netns/a\n\0P\n${FIB_HOST}\0F /run/netns/b\n\0P\n${FIB_HOST}`;
    assert.deepEqual(parseNetnsDump(out, files.slice(0, 1)), [
      { file: '/run/netns/a', text: null, fibIno: null, errno: 0, error: 'the helper printed 2 records for 1 files' },
    ]);
  });
  it('readPinnedNamespaces([]) spawns nothing', () => assert.deepEqual(readPinnedNamespaces([]), { entries: [], failure: null }));
});

// ---------------------------------------------------------------------------------------------
// A fake procfs: <root>/<pid>/{ns/net → 'net:[N]' (a dangling symlink reads like the real one),
// net/fib_trie, net/if_inet6, environ, comm, stat}.

interface FakeProcess {
  pid: number | string;
  /** 'net:[N]' text of ns/net; 'file' makes ns/net a plain file (readlink fails with EINVAL, like EACCES); absent: no ns dir (a vanished process). */
  netns?: string;
  /** Contents of net/fib_trie and net/if_inet6; 'none' leaves net/ out (vanished between reads); 'dir' makes fib_trie a directory; a number links net/ to that pid's net/. */
  net?: { fib: string; inet6: string } | 'none' | 'dir' | number;
  /** environ text; 'dir' makes it a directory (unreadable: EISDIR). */
  environ?: string;
  comm?: string;
  stat?: string;
}

function fakeProc(root: string, procs: readonly FakeProcess[]): void {
  mkdirSync(root, { recursive: true });
  for (const p of procs) {
    const dir = join(root, String(p.pid));
    mkdirSync(dir, { recursive: true });
    if (p.netns !== undefined) {
      mkdirSync(join(dir, 'ns'));
      if (p.netns === 'file') writeFileSync(join(dir, 'ns', 'net'), '');
      else symlinkSync(p.netns, join(dir, 'ns', 'net'));
    }
    if (typeof p.net === 'number') symlinkSync(join(root, String(p.net), 'net'), join(dir, 'net'));
    else if (p.net === 'dir') mkdirSync(join(dir, 'net', 'fib_trie'), { recursive: true });
    else if (p.net !== undefined && p.net !== 'none') {
      mkdirSync(join(dir, 'net'));
      writeFileSync(join(dir, 'net', 'fib_trie'), p.net.fib);
      writeFileSync(join(dir, 'net', 'if_inet6'), p.net.inet6);
    }
    if (p.environ === 'dir') mkdirSync(join(dir, 'environ'));
    else if (p.environ !== undefined) writeFileSync(join(dir, 'environ'), p.environ);
    if (p.comm !== undefined) writeFileSync(join(dir, 'comm'), `${p.comm}\n`);
    if (p.stat !== undefined) writeFileSync(join(dir, 'stat'), p.stat);
  }
}

const KTHREADD: FakeProcess = {
  pid: 2,
  netns: 'net:[4026531840]',
  net: { fib: FIB_HOST, inet6: HOST_INET6 },
  environ: '',
  comm: 'kthreadd',
  stat: '2 (kthreadd) S 0 0 0 0 -1 2129984 0 0 0 0 0 0 0 0 20 0 1 0 1 0 0 18446744073709551615 0 0 0 0 0 0 0 2147483647 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n',
};

const tmp = mkdtempSync(join(tmpdir(), 'ke-unit-'));
after(() => rmSync(tmp, { recursive: true, force: true }));
let n = 0;
function tree(procs: readonly FakeProcess[]): string {
  const root = join(tmp, `proc${n++}`);
  fakeProc(root, procs);
  return root;
}

/** addresses as sorted plain data, for deepEqual. */
function plain(ev: KernelEvidence): Array<[string, AddressHolder[]]> {
  return [...ev.addresses].map(([ip, h]): [string, AddressHolder[]] => [ip, [...h]]).sort((a, b) => (a[0] < b[0] ? -1 : 1));
}

describe('readKernelEvidence over a fake procfs', () => {
  const CNI_ADD = 'PATH=/usr/bin\0CNI_COMMAND=ADD\0CNI_CONTAINERID=abc\0CNI_NETNS=/var/run/netns/cni-1\0CNI_IFNAME=eth0\0CNI_PATH=/opt/cni/bin\0';
  const root = tree([
    // pid 1: its ns/net link is closed to us (here: not a link); its net/ is the host's, so it is matched by fib_trie inode.
    { pid: 1, netns: 'file', net: 2, environ: CNI_ADD.replace('abc', 'pid1'), comm: 'systemd' },
    KTHREADD,
    // pod A (4026532177): 100 vanished between readlink and reading net/, 101 is read, 102 must not be.
    { pid: 100, netns: 'net:[4026532177]', net: 'none' },
    { pid: 101, netns: 'net:[4026532177]', net: { fib: FIB_UP, inet6: INET6_UP }, environ: 'PATH=/bin\0', comm: 'pause' },
    { pid: 102, netns: 'net:[4026532177]', net: { fib: 'Local:\n  |-- 10.66.6.6\n     /32 host LOCAL\n', inet6: '' }, environ: '', comm: 'sleep' },
    // gone entirely
    { pid: 103 },
    // ourselves: a CNI environment, not counted in flight
    { pid: 104, netns: 'net:[4026531840]', environ: CNI_ADD.replace('abc', 'self'), comm: 'ipwarden' },
    // pod B (4026532300): 10.77.0.5 configured here too
    { pid: 105, netns: 'net:[4026532300]', net: { fib: FIB_RULES, inet6: INET6_DOWN }, environ: CNI_ADD, comm: 'bridge' },
    // a namespace we cannot name
    { pid: 106, netns: 'file', net: { fib: 'Local:\n  |-- 10.99.0.1\n     /32 host LOCAL\n', inet6: '' }, environ: '', comm: 'pause' },
    { pid: 107, netns: 'net:[4026531840]', environ: 'CNI_CONTAINERID=abc\0CNI_COMMAND=DEL\0CNI_IFNAME=\0', comm: 'ipwarden' },
    { pid: 108, netns: 'net:[4026531840]', environ: 'CNI_COMMAND=VERSION\0', comm: 'bridge' },
    { pid: 109, netns: 'net:[4026531840]', environ: 'XCNI_COMMAND=ADD\0FOO=CNI_COMMAND=ADD\0CNI_CONTAINERID=zzz\0', comm: 'sh' },
    { pid: 'self' },
    { pid: 'sys' },
  ]);
  const unnamedIno = statSync(join(root, '106', 'net', 'fib_trie')).ino;
  const ev = readKernelEvidence({ procDir: root, netnsDirs: [], selfPid: 104, euid: 0 });
  const host = (pid: number): AddressHolder => ({ netns: 'net:[4026531840]', via: join(root, String(pid), 'ns', 'net'), pid, ifname: null });
  const podA = (ifname: string | null): AddressHolder => ({ netns: 'net:[4026532177]', via: join(root, '101', 'ns', 'net'), pid: 101, ifname });
  const podB = (ifname: string | null): AddressHolder => ({ netns: 'net:[4026532300]', via: join(root, '105', 'ns', 'net'), pid: 105, ifname });

  it('finds every address once per namespace, with its holder', () => {
    assert.deepEqual(plain(ev), [
      ['10.77.0.5', [podA(null), podB(null)]],
      ['10.77.0.9', [podA(null), podB(null)]],
      ['10.78.0.0', [podA(null), podB(null)]],
      ['10.79.1.1', [podA(null), podB(null)]],
      ['10.80.0.1', [podA(null), podB(null)]],
      ['10.99.0.1', [{ netns: `unidentified:[fib_trie ${unnamedIno}]`, via: join(root, '106', 'ns', 'net'), pid: 106, ifname: null }]],
      ['192.0.2.2', [host(2)]],
      ['fd00::2', [{ ...host(2), ifname: 'eth0' }]],
      ['fd77::5', [podA('kebr0')]],
      ['fd77::6', [podA('kebr0')]],
      ['fd79::1', [podA('kebr1'), podB('kebr1')]],
      ['fd80::1', [podA('kev0'), podB('kev0')]],
    ]);
  });
  it('lists CNI operations in flight by container id, without selfPid, pid 1, or environments lacking CNI_CONTAINERID', () => {
    assert.deepEqual([...ev.inFlight].map(([id, ops]) => [id, [...ops]]), [
      [
        'abc',
        [
          { pid: 105, command: 'ADD', comm: 'bridge', containerId: 'abc', ifname: 'eth0' },
          { pid: 107, command: 'DEL', comm: 'ipwarden', containerId: 'abc', ifname: null },
        ],
      ],
    ]);
  });
  it('counts namespaces read and live processes (12 pids, 100 and 103 vanished), and is complete', () => {
    assert.deepEqual({ namespaces: ev.namespaces, processes: ev.processes, incomplete: ev.incomplete }, { namespaces: 4, processes: 10, incomplete: null });
  });
  it('helpers take any text form of an address', () => {
    assert.equal(isInUse(ev, 'fd77:0:0::5'), true);
    assert.equal(isInUse(ev, '::ffff:10.80.0.1'), true);
    assert.equal(isInUse(ev, '10.77.0.6'), false);
    assert.deepEqual(holdersOf(ev, '192.0.2.2'), [host(2)]);
    assert.deepEqual(holdersOf(ev, '192.0.2.3'), []);
    assert.deepEqual(inFlightFor(ev, 'nope'), []);
    assert.equal(inFlightFor(ev, 'abc').length, 2);
  });
  it('a text that is no address is a caller bug', () => {
    assert.throws(() => isInUse(ev, '10.0.0.256'), (e: unknown) => e instanceof AppError && e.code === 'INTERNAL' && e.message === 'not an IP address: "10.0.0.256"');
  });
});

describe('readKernelEvidence: environments', () => {
  it('an environment longer than the 64 KiB read buffer is read whole (CNI variables at its end)', () => {
    const big = `${'X'.repeat(200_000)}=1\0CNI_COMMAND=CHECK\0CNI_CONTAINERID=big\0`;
    const root = tree([KTHREADD, { pid: 40, netns: 'net:[4026531840]', environ: big, comm: 'ipwarden' }]);
    const ev = readKernelEvidence({ procDir: root, netnsDirs: [], euid: 0 });
    assert.deepEqual(inFlightFor(ev, 'big'), [{ pid: 40, command: 'CHECK', comm: 'ipwarden', containerId: 'big', ifname: null }]);
  });
});

describe('readKernelEvidence: what makes it incomplete (exact reasons)', () => {
  it('not root: one reason, the consequences are not listed again', () => {
    const root = tree([KTHREADD, { pid: 50, netns: 'net:[4026531840]', environ: 'dir' }]);
    const ev = readKernelEvidence({ procDir: root, netnsDirs: [], euid: 1000 });
    assert.equal(ev.incomplete, "not running as root (euid 1000): other users' namespaces and environments cannot be read");
    assert.deepEqual(plain(ev).map(([ip]) => ip), ['192.0.2.2', 'fd00::2']);
  });
  it('an environment that cannot be read', () => {
    const root = tree([KTHREADD, { pid: 50, netns: 'net:[4026531840]', environ: 'dir' }]);
    assert.equal(readKernelEvidence({ procDir: root, netnsDirs: [], euid: 0 }).incomplete, `cannot read ${root}/50/environ: EISDIR`);
  });
  it('several: counted, the first named', () => {
    const root = tree([KTHREADD, { pid: 50, netns: 'net:[4026531840]', environ: 'dir' }, { pid: 51, netns: 'net:[4026531840]', environ: 'dir' }]);
    assert.equal(readKernelEvidence({ procDir: root, netnsDirs: [], euid: 0 }).incomplete, `cannot read 2 process environments (first: ${root}/50/environ: EISDIR)`);
  });
  it('a namespace that cannot be read (not because the process exited), reported once', () => {
    const root = tree([KTHREADD, { pid: 60, netns: 'net:[4026532999]', net: 'dir', environ: '' }, { pid: 61, netns: 'net:[4026532999]', net: 'dir', environ: '' }]);
    const ev = readKernelEvidence({ procDir: root, netnsDirs: [], euid: 0 });
    assert.deepEqual({ incomplete: ev.incomplete, namespaces: ev.namespaces }, { incomplete: `cannot read ${root}/60/net/fib_trie: EISDIR`, namespaces: 1 });
  });
  it('a kernel without IPv6 (no if_inet6, ipv6.disable=1): the IPv4 addresses and the CNI operations still count, and it is complete (review finding)', () => {
    const root = tree([KTHREADD, { pid: 80, netns: 'net:[4026532800]', net: { fib: FIB_HOST, inet6: '' }, environ: 'CNI_COMMAND=ADD\0CNI_CONTAINERID=flying\0' }]);
    rmSync(join(root, '80', 'net', 'if_inet6'));
    const ev = readKernelEvidence({ procDir: root, netnsDirs: [], euid: 0 });
    assert.equal(ev.incomplete, null);
    assert.deepEqual(holdersOf(ev, '192.0.2.2').map((h) => h.netns), ['net:[4026531840]', 'net:[4026532800]']);
    assert.equal(inFlightFor(ev, 'flying').length, 1);
  });
  it('nothing readable at all is not "nothing in use"', () => {
    const root = tree([{ ...KTHREADD, net: 'none' }]);
    assert.equal(readKernelEvidence({ procDir: root, netnsDirs: [], euid: 0 }).incomplete, `no network namespace could be read through ${root} (0 processes seen)`);
  });
  it('a process whose ns/net cannot be read and whose net/ is gone', () => {
    const root = tree([KTHREADD, { pid: 70, netns: 'file', environ: '' }]);
    assert.equal(readKernelEvidence({ procDir: root, netnsDirs: [], euid: 0 }).incomplete, `cannot read ${root}/70/ns/net: EINVAL`);
  });
  it('/proc missing', () => {
    const ev = readKernelEvidence({ procDir: join(tmp, 'no-such-proc'), netnsDirs: [], euid: 0 });
    assert.deepEqual({ incomplete: ev.incomplete, namespaces: ev.namespaces, processes: ev.processes }, { incomplete: `cannot list ${join(tmp, 'no-such-proc')}: ENOENT`, namespaces: 0, processes: 0 });
  });
  it('a directory without processes (procfs not mounted)', () => {
    const root = tree([{ pid: 'sys' }]);
    assert.equal(readKernelEvidence({ procDir: root, netnsDirs: [], euid: 0 }).incomplete, `no processes under ${root}: procfs is not mounted there`);
  });
  it('not the host PID namespace: no kthreadd at pid 2', () => {
    const root = tree([{ pid: 1, netns: 'net:[4026531840]', net: { fib: FIB_HOST, inet6: '' }, environ: '' }, { pid: 2, netns: 'net:[4026531840]', environ: '', stat: '2 (sh) S 1 1 1 0 -1 0\n' }]);
    assert.equal(
      readKernelEvidence({ procDir: root, netnsDirs: [], euid: 0 }).incomplete,
      `${root} is not of the host PID namespace (pid 2 is not kthreadd): other containers' processes are not visible`,
    );
  });
  it('files in a netns directory that are not nsfs mounts are skipped; missing directories too', () => {
    const root = tree([KTHREADD]);
    mountNs(root, { self: 'mnt:[4026531841]', 2: 'mnt:[4026531841]' });
    const dir = join(tmp, 'netns-plain');
    mkdirSync(dir);
    writeFileSync(join(dir, 'cni-stale'), '');
    mkdirSync(join(dir, 'a-dir'));
    const ev = readKernelEvidence({ procDir: root, netnsDirs: [dir, join(tmp, 'no-such-dir'), dir], euid: 0 });
    assert.deepEqual({ incomplete: ev.incomplete, namespaces: ev.namespaces, processes: ev.processes }, { incomplete: null, namespaces: 1, processes: 1 });
  });
});

/** Give processes of a fake procfs an `ns/mnt` link (`mnt:[N]` text). */
function mountNs(root: string, links: Record<string, string>): void {
  for (const [pid, text] of Object.entries(links)) {
    mkdirSync(join(root, pid, 'ns'), { recursive: true });
    symlinkSync(text, join(root, pid, 'ns', 'mnt'));
  }
}

describe('readKernelEvidence: pin directories as the host sees them (issue 17)', () => {
  // A pin directory that exists in no mount namespace of this machine (ours is read by its path).
  const FAR = '/ipwarden-ke-unit-no-such';
  const HOST = 'mnt:[4026531841]';
  const OURS = 'mnt:[4026532999]';
  /** A fake host root (`<procDir>/1/root` → it) holding `files` (path → content; a value `{ link }` is a symlink). */
  function hostRoot(root: string, pid: number, files: Record<string, string | { link: string } | { dir: true }>): string {
    const host = join(tmp, `hostroot${n++}`);
    for (const [path, v] of Object.entries(files)) {
      const at = join(host, path);
      if (typeof v === 'string') {
        mkdirSync(join(at, '..'), { recursive: true });
        writeFileSync(at, v);
      } else if ('link' in v) {
        mkdirSync(join(at, '..'), { recursive: true });
        symlinkSync(v.link, at);
      } else mkdirSync(at, { recursive: true });
    }
    mkdirSync(host, { recursive: true });
    symlinkSync(host, join(root, String(pid), 'root'));
    return host;
  }
  const NOT_SEEN = (root: string, pid: number, code: string) =>
    `this process is not in the host's mount namespace (${OURS}; pid ${pid} is in ${HOST}) and cannot read the host's view through ${root}/${pid}/root: ${code}: the host's pinned network namespaces are not seen`;

  it("in the host's mount namespace only our own view is read: the host root is not even looked at", () => {
    const root = tree([{ pid: 1, netns: 'net:[4026531840]', net: 2, environ: '' }, KTHREADD]);
    mountNs(root, { self: HOST, 1: HOST, 2: HOST });
    symlinkSync(join(tmp, 'no-such-host-root'), join(root, '1', 'root')); // would fail if read
    const ev = readKernelEvidence({ procDir: root, netnsDirs: [`${FAR}/run/netns`], euid: 0 });
    assert.deepEqual([ev.incomplete, ev.unreadPinDirs], [null, []]);
  });
  it("pid 1's ns/mnt closed to us (this development VM): kthreadd's, equal to ours, decides; complete", () => {
    const root = tree([{ pid: 1, netns: 'file', net: 2, environ: '' }, KTHREADD]);
    mountNs(root, { self: HOST, 2: HOST });
    writeFileSync(join(root, '1', 'ns', 'mnt'), ''); // readlink: EINVAL, like EACCES
    const ev = readKernelEvidence({ procDir: root, netnsDirs: [`${FAR}/run/netns`], euid: 0 });
    assert.deepEqual([ev.incomplete, ev.unreadPinDirs], [null, []]);
  });
  it("another mount namespace: the host's directory is read through <procDir>/1/root, an absolute symlink on the way resolved inside that root", () => {
    const root = tree([{ pid: 1, netns: 'net:[4026531840]', net: 2, environ: '' }, KTHREADD]);
    mountNs(root, { self: OURS, 1: HOST, 2: HOST });
    // The host's /var/run → /run; its /run/netns holds a name that cannot be passed on (a visible gap).
    // Resolved from OUR root, FAR/run would not exist and the directory would look absent.
    const host = hostRoot(root, 1, { [`${FAR}/var/run`]: { link: `${FAR}/run` }, [`${FAR}/run/netns`]: { dir: true } });
    writeFileSync(Buffer.from(`${host}${FAR}/run/netns/cni-\xff`, 'latin1'), '');
    const ev = readKernelEvidence({ procDir: root, netnsDirs: [`${FAR}/var/run/netns`], euid: 0 });
    assert.deepEqual(
      [ev.incomplete, ev.unreadPinDirs],
      [`cannot read ${root}/1/root${FAR}/run/netns/cni-\xff: a name that is not UTF-8 (hex 636e692dff)`, [`${FAR}/var/run/netns`]],
    );
  });
  it("another mount namespace, the host's directory absent there too: absent, complete", () => {
    const root = tree([{ pid: 1, netns: 'net:[4026531840]', net: 2, environ: '' }, KTHREADD]);
    mountNs(root, { self: OURS, 1: HOST, 2: HOST });
    hostRoot(root, 1, { [`${FAR}/run`]: { dir: true }, [`${FAR}/var`]: 'a file, not a directory' });
    const ev = readKernelEvidence({ procDir: root, netnsDirs: [`${FAR}/run/netns`, `${FAR}/var/run/netns`], euid: 0 });
    assert.deepEqual([ev.incomplete, ev.unreadPinDirs], [null, []]);
  });
  it("another mount namespace and the host's root cannot be read: incomplete, every directory unread", () => {
    const root = tree([{ pid: 1, netns: 'net:[4026531840]', net: 2, environ: '' }, KTHREADD]);
    mountNs(root, { self: OURS, 1: HOST, 2: HOST });
    symlinkSync(join(tmp, 'no-such-host-root'), join(root, '1', 'root'));
    const dirs = [`${FAR}/run/netns`, `${FAR}/var/run/netns`];
    const ev = readKernelEvidence({ procDir: root, netnsDirs: dirs, euid: 0 });
    assert.deepEqual([ev.incomplete, ev.unreadPinDirs], [NOT_SEEN(root, 1, 'ENOENT'), dirs]);
  });
  it("the host's root is a file: incomplete (ENOTDIR), not \"absent\"", () => {
    const root = tree([{ pid: 1, netns: 'net:[4026531840]', net: 2, environ: '' }, KTHREADD]);
    mountNs(root, { self: OURS, 1: HOST, 2: HOST });
    writeFileSync(join(root, '1', 'root'), '');
    const ev = readKernelEvidence({ procDir: root, netnsDirs: [`${FAR}/run/netns`], euid: 0 });
    assert.deepEqual([ev.incomplete, ev.unreadPinDirs], [NOT_SEEN(root, 1, 'ENOTDIR'), [`${FAR}/run/netns`]]);
  });
  it('pid 1 closed, kthreadd in another mount namespace than ours: read through <procDir>/2/root', () => {
    const root = tree([KTHREADD]);
    mountNs(root, { self: OURS, 2: HOST });
    symlinkSync(join(tmp, 'no-such-host-root'), join(root, '2', 'root'));
    const ev = readKernelEvidence({ procDir: root, netnsDirs: [`${FAR}/run/netns`], euid: 0 });
    assert.equal(ev.incomplete, NOT_SEEN(root, 2, 'ENOENT'));
  });
  it("a symlink loop in the host's view: ELOOP after 40 links, a gap", () => {
    const root = tree([{ pid: 1, netns: 'net:[4026531840]', net: 2, environ: '' }, KTHREADD]);
    mountNs(root, { self: OURS, 1: HOST, 2: HOST });
    hostRoot(root, 1, { [`${FAR}/run`]: { link: `${FAR}/run` } });
    const ev = readKernelEvidence({ procDir: root, netnsDirs: [`${FAR}/run/netns`], euid: 0 });
    assert.deepEqual([ev.incomplete, ev.unreadPinDirs], [`cannot read ${root}/1/root${FAR}/run/netns: ELOOP`, [`${FAR}/run/netns`]]);
  });
  it("neither pid 1's nor kthreadd's mount namespace can be read: incomplete, whatever our directories hold", () => {
    const root = tree([KTHREADD]);
    mountNs(root, { self: OURS });
    const dirs = [`${FAR}/run/netns`];
    const ev = readKernelEvidence({ procDir: root, netnsDirs: dirs, euid: 0 });
    assert.deepEqual(
      [ev.incomplete, ev.unreadPinDirs],
      [`cannot read the host's mount namespace (${root}/1/ns/mnt: ENOENT; ${root}/2/ns/mnt: ENOENT): whether this process sees the host's pinned network namespaces cannot be told`, dirs],
    );
  });
  it('our own ns/mnt cannot be read: incomplete', () => {
    const root = tree([KTHREADD]);
    mountNs(root, { 2: HOST });
    const ev = readKernelEvidence({ procDir: root, netnsDirs: [`${FAR}/run/netns`], euid: 0 });
    assert.equal(ev.incomplete, `cannot read ${root}/self/ns/mnt: ENOENT: whether this process sees the host's pinned network namespaces cannot be told`);
  });
  it('no pin directories to read: mount namespaces are not looked at', () => {
    const root = tree([KTHREADD]);
    assert.deepEqual([readKernelEvidence({ procDir: root, netnsDirs: [], euid: 0 }).incomplete], [null]);
  });
  it('not root: still the one reason (the host view is not judged)', () => {
    const root = tree([KTHREADD]);
    const ev = readKernelEvidence({ procDir: root, netnsDirs: [`${FAR}/run/netns`], euid: 1000 });
    assert.deepEqual([ev.incomplete, ev.unreadPinDirs], ["not running as root (euid 1000): other users' namespaces and environments cannot be read", []]);
  });
});
