/**
 * FileStore: the Store contract, the raw on-disk format (anchors §2.5–2.6, field-reports.md
 * Conventions), interop with the real upstream host-local binary, the lock, and crash safety.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import {
  cpSync,
  existsSync,
  linkSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { createServer, isIP } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import { buildSync } from 'esbuild';
import { AppError, isAppError } from '../../src/common/errors.ts';
import { ownerMatches, type Owner } from '../../src/store/store.ts';
import {
  canonicalIP,
  goTrimSpace,
  isCanonicalIPName,
  openFileStore,
  parseRecord,
  TEMP_PREFIX,
  type FileStore,
} from '../../src/store/file/file-store.ts';
import { lockExclusive, type LockClock } from '../../src/store/file/flock.ts';
import { MemoryStore } from '../../src/store/memory/memory-store.ts';
import { runStoreContract } from './store-contract.ts';
import { rng } from '../helpers/rng.ts';

const HERE = dirname(fileURLToPath(import.meta.url));
const REPO = join(HERE, '..', '..');
const UPSTREAM = '/usr/lib/cni/host-local';
const HAVE_UPSTREAM = existsSync(UPSTREAM);
const CI = process.env['CI'] === 'true';
/** Upstream tests are skipped locally without the binary, and fail loudly in CI (scripts/run-tests.mjs). */
const upstreamSkip = HAVE_UPSTREAM || CI ? false : `${UPSTREAM} not installed`;

// Modes are asserted exactly: fix the umask for this process (host-local runs under 022 too).
const savedUmask = process.umask(0o022);
after(() => {
  process.umask(savedUmask);
});

const tempRoots: string[] = [];
after(() => {
  for (const d of tempRoots) rmSync(d, { recursive: true, force: true });
});
/** A fresh temporary dataDir, removed after the whole file even when tests fail. */
function tempDataDir(): string {
  const d = mkdtempSync(join(tmpdir(), 'ipwarden-file-store-'));
  tempRoots.push(d);
  return d;
}

/** Raw record text as host-local (or an older host-local) would have written it. */
function recordText(owner: Owner | null): string {
  if (owner === null) return '';
  return owner.ifname === null ? owner.containerId : `${owner.containerId}\r\n${owner.ifname}`;
}

async function freshStore(network = 'net1'): Promise<{ store: FileStore; dataDir: string }> {
  const dataDir = tempDataDir();
  return { store: await openFileStore({ dataDir, network }), dataDir };
}

/** Run `body` with a fresh locked FileStore; always closes it. */
async function withFileStore(body: (store: FileStore, dataDir: string) => Promise<void>): Promise<void> {
  const { store, dataDir } = await freshStore();
  try {
    await store.lock(5);
    await body(store, dataDir);
  } finally {
    await store.close();
  }
}

function names(dir: string): string[] {
  return readdirSync(dir).sort();
}

runStoreContract('FileStore', async () => {
  const { store } = await freshStore();
  return {
    store,
    plant: async (ip, owner) => writeFileSync(join(store.dir, ip), recordText(owner), { mode: 0o600 }),
  };
});

// The in-memory fake must behave the same (run here until memory-store.test.ts takes it over).
runStoreContract('MemoryStore', async () => {
  const store = new MemoryStore('net1');
  return {
    store,
    plant: async (ip, owner) => {
      store.seed(ip, owner);
    },
  };
});

describe('record parsing', () => {
  const cases: Array<{ name: string; bytes: Buffer; owner: Owner | null }> = [
    { name: 'CRLF (host-local)', bytes: Buffer.from('c1\r\neth0'), owner: { containerId: 'c1', ifname: 'eth0' } },
    { name: 'LF only', bytes: Buffer.from('c1\neth0'), owner: { containerId: 'c1', ifname: 'eth0' } },
    { name: 'legacy ID only', bytes: Buffer.from('c3'), owner: { containerId: 'c3', ifname: null } },
    {
      name: '64 hex + CRLF + eth0 (70 bytes)',
      bytes: Buffer.from(`${'ab'.repeat(32)}\r\neth0`),
      owner: { containerId: 'ab'.repeat(32), ifname: 'eth0' },
    },
    { name: 'surrounding whitespace', bytes: Buffer.from(' \tc1\r\neth0\r\n'), owner: { containerId: 'c1', ifname: 'eth0' } },
    { name: 'ID + CRLF only (trimmed to legacy)', bytes: Buffer.from('c3\r\n'), owner: { containerId: 'c3', ifname: null } },
    { name: 'U+0085 is trimmed, as Go does', bytes: Buffer.from('\u0085c1\r\neth0'), owner: { containerId: 'c1', ifname: 'eth0' } },
    { name: 'U+FEFF is not trimmed (Go keeps it): corrupt', bytes: Buffer.from('\ufeffc1\r\neth0'), owner: null },
    { name: 'empty', bytes: Buffer.alloc(0), owner: null },
    { name: 'whitespace only', bytes: Buffer.from(' \r\n'), owner: null },
    { name: 'lone CR', bytes: Buffer.from('c1\reth0'), owner: null },
    { name: 'ID starting with a dash', bytes: Buffer.from('-c1\r\neth0'), owner: null },
    { name: 'ID with a space', bytes: Buffer.from('c 1\r\neth0'), owner: null },
    { name: 'a third line', bytes: Buffer.from('c1\r\neth0\r\nextra'), owner: null },
    { name: 'a container ID that is not UTF-8 (no writer can make one)', bytes: Buffer.from([0x63, 0xff, 0x0d, 0x0a, 0x65]), owner: null },
    // host-local writes the ifname bytes it was given: kept exactly (one escape per invalid byte).
    { name: 'an ifname that is not UTF-8', bytes: Buffer.from('c1\r\neth\xff', 'latin1'), owner: { containerId: 'c1', ifname: 'eth\udcff' } },
    { name: 'an ifname that is UTF-8', bytes: Buffer.from('c1\r\nethé'), owner: { containerId: 'c1', ifname: 'ethé' } },
    { name: 'a lone 0x85 byte is not trimmed (Go: not a rune, not a space)', bytes: Buffer.from('c1\r\neth\x85', 'latin1'), owner: { containerId: 'c1', ifname: 'eth\udc85' } },
    { name: '4096 bytes', bytes: Buffer.from('a'.repeat(4096)), owner: { containerId: 'a'.repeat(4096), ifname: null } },
    { name: '4097 bytes (a long container ID)', bytes: Buffer.from('a'.repeat(4097)), owner: { containerId: 'a'.repeat(4097), ifname: null } },
    { name: '128 KiB container ID + ifname', bytes: Buffer.from(`${'b'.repeat(131055)}\r\neth0`), owner: { containerId: 'b'.repeat(131055), ifname: 'eth0' } },
    { name: '1 MiB', bytes: Buffer.from('a'.repeat(1 << 20)), owner: { containerId: 'a'.repeat(1 << 20), ifname: null } },
    { name: '1 MiB + 1 byte', bytes: Buffer.from('a'.repeat((1 << 20) + 1)), owner: null },
  ];
  for (const c of cases) {
    it(`parses ${c.name}`, () => {
      assert.deepEqual(parseRecord(c.bytes), c.owner);
    });
  }

  const trims: Array<[string, string]> = [
    ['c1', 'c1'],
    ['  c1\r\n', 'c1'],
    ['\u00a0c1\u3000', 'c1'],
    ['\ufeffc1', '\ufeffc1'],
    ['', ''],
  ];
  for (const [input, want] of trims) {
    it(`goTrimSpace(${JSON.stringify(input)}) = ${JSON.stringify(want)}`, () => {
      assert.equal(goTrimSpace(input), want);
    });
  }
});

describe('IP file names', () => {
  const cases: Array<[string, boolean]> = [
    ['10.0.0.2', true],
    ['255.255.255.255', true],
    ['fd00::2', true],
    ['::1', true],
    ['fd00:0:0:1::1', true],
    ['2001:db8::1:0:0:1', true],
    ['010.0.0.2', false],
    ['FD00::2', false],
    ['fd00:0:0:0:0:0:0:2', false],
    ['fd00::0:2', false],
    ['fe80::1%eth0', false],
    ['lock', false],
    ['last_reserved_ip.0', false],
    ['.ipwarden-1-abc.tmp', false],
    ['10.0.0.2 ', false],
    ['', false],
  ];
  for (const [name, want] of cases) {
    it(`${JSON.stringify(name)} is ${want ? '' : 'not '}a reservation name`, () => {
      assert.equal(isCanonicalIPName(name), want);
    });
  }

  it('canonicalises last_reserved_ip contents', () => {
    assert.equal(canonicalIP('FD00:0::7'), 'fd00::7');
    assert.equal(canonicalIP('10.0.0.7'), '10.0.0.7');
    assert.equal(canonicalIP('junk'), null);
  });
});

describe('FileStore on disk', () => {
  it('creates DIR with mode 0755, recursively', async () => {
    const dataDir = join(tempDataDir(), 'a', 'b');
    const store = await openFileStore({ dataDir, network: 'net1' });
    await store.close();
    assert.equal(statSync(join(dataDir, 'net1')).mode & 0o777, 0o755);
    assert.equal(statSync(dataDir).isDirectory(), true);
  });

  it('throws STORE_IO when DIR cannot be created', async () => {
    const dataDir = tempDataDir();
    writeFileSync(join(dataDir, 'net1'), 'not a dir');
    await assert.rejects(openFileStore({ dataDir, network: 'net1' }), (e: unknown) => {
      assert.ok(isAppError(e, 'STORE_IO'));
      assert.equal(e.message, `cannot create network directory ${join(dataDir, 'net1')}: EEXIST: file already exists, mkdir '${join(dataDir, 'net1')}'`);
      return true;
    });
  });

  it('writes exactly "c1\\r\\neth0" with mode 0600, and last_reserved_ip.0 as bare IP text', () =>
    withFileStore(async (store) => {
      assert.equal(await store.reserve('10.0.0.2', { containerId: 'c1', ifname: 'eth0' }, 0), true);
      const file = join(store.dir, '10.0.0.2');
      assert.deepEqual(readFileSync(file), Buffer.from([0x63, 0x31, 0x0d, 0x0a, 0x65, 0x74, 0x68, 0x30]));
      assert.equal(statSync(file).mode & 0o777, 0o600);
      assert.equal(readFileSync(join(store.dir, 'last_reserved_ip.0'), 'latin1'), '10.0.0.2');
      assert.equal(await store.reserve('fd00::3', { containerId: 'c2', ifname: 'net1' }, 0), true);
      assert.equal(readFileSync(join(store.dir, 'last_reserved_ip.0'), 'latin1'), 'fd00::3');
      assert.equal(readFileSync(join(store.dir, 'fd00::3'), 'latin1'), 'c2\r\nnet1');
      assert.deepEqual(names(store.dir), ['10.0.0.2', 'fd00::3', 'last_reserved_ip.0', 'lock']);
    }));

  it('overwrites its own last_reserved_ip in place (same inode, shorter text truncated) and replaces any other (0644, a symlink, two links)', () =>
    withFileStore(async (store) => {
      const last = join(store.dir, 'last_reserved_ip.0');
      const owner = (n: number): { containerId: string; ifname: string } => ({ containerId: `c${n}`, ifname: 'eth0' });
      assert.equal(await store.reserve('10.0.0.100', owner(1), 0), true);
      const first = statSync(last);
      assert.equal(first.mode & 0o7777, 0o600);
      assert.equal(await store.reserve('10.0.0.3', owner(2), 0), true);
      assert.equal(readFileSync(last, 'latin1'), '10.0.0.3');
      assert.equal(statSync(last).ino, first.ino);
      assert.equal(await store.reserve('10.0.0.250', owner(3), 0), true);
      assert.equal(readFileSync(last, 'latin1'), '10.0.0.250');
      assert.equal(statSync(last).ino, first.ino);
      // An older writer's 0644 file: replaced, 0600 afterwards.
      rmSync(last);
      writeFileSync(last, '10.0.0.9', { mode: 0o644 });
      const old = statSync(last);
      assert.equal(old.mode & 0o7777, 0o644);
      assert.equal(await store.reserve('10.0.0.4', owner(4), 0), true);
      assert.equal(readFileSync(last, 'latin1'), '10.0.0.4');
      assert.equal(statSync(last).mode & 0o7777, 0o600);
      assert.notEqual(statSync(last).ino, old.ino);
      // A symlink at the name is replaced, never written through.
      const target = join(store.dir, '..', 'symlink-target');
      writeFileSync(target, 'untouched', { mode: 0o600 });
      rmSync(last);
      symlinkSync(target, last);
      assert.equal(await store.reserve('10.0.0.5', owner(5), 0), true);
      assert.equal(readFileSync(target, 'latin1'), 'untouched');
      assert.equal(lstatSync(last).isFile(), true);
      assert.equal(readFileSync(last, 'latin1'), '10.0.0.5');
      // A second link to it: replaced, the other name keeps its text.
      const other = join(store.dir, '..', 'hardlink');
      linkSync(last, other);
      assert.equal(await store.reserve('10.0.0.6', owner(6), 0), true);
      assert.equal(readFileSync(other, 'latin1'), '10.0.0.5');
      assert.equal(readFileSync(last, 'latin1'), '10.0.0.6');
      assert.equal(statSync(last).nlink, 1);
      rmSync(target);
      rmSync(other);
      assert.deepEqual(names(store.dir), ['10.0.0.100', '10.0.0.250', '10.0.0.3', '10.0.0.4', '10.0.0.5', '10.0.0.6', 'last_reserved_ip.0', 'lock']);
    }));

  it('creates the lock file like go-filemutex (empty, mode 0750 under umask 022)', () =>
    withFileStore(async (store) => {
      const st = statSync(store.lockPath);
      assert.equal(st.size, 0);
      assert.equal(st.mode & 0o777, 0o750);
    }));

  it('leaves no temporary file behind after a refused reserve', () =>
    withFileStore(async (store) => {
      await store.reserve('10.0.0.2', { containerId: 'c1', ifname: 'eth0' }, 0);
      assert.equal(await store.reserve('10.0.0.2', { containerId: 'c2', ifname: 'eth0' }, 0), false);
      assert.deepEqual(names(store.dir), ['10.0.0.2', 'last_reserved_ip.0', 'lock']);
      assert.equal(readFileSync(join(store.dir, 'last_reserved_ip.0'), 'latin1'), '10.0.0.2');
    }));

  const badReserves: Array<{ name: string; ip: string; owner: { containerId: string; ifname: string }; message: string }> = [
    { name: 'the lock file name', ip: 'lock', owner: { containerId: 'c1', ifname: 'eth0' }, message: 'not the canonical text of an IP address: "lock"' },
    { name: 'a non-canonical IPv6', ip: 'FD00::2', owner: { containerId: 'c1', ifname: 'eth0' }, message: 'not the canonical text of an IP address: "FD00::2"' },
    {
      name: 'an invalid container ID',
      ip: '10.0.0.2',
      owner: { containerId: 'c 1', ifname: 'eth0' },
      message: 'refusing to write a record that would not read back: container ID "c 1", ifname "eth0"',
    },
    {
      name: 'an ifname with a line break',
      ip: '10.0.0.2',
      owner: { containerId: 'c1', ifname: 'eth0\nx' },
      message: 'refusing to write a record that would not read back: container ID "c1", ifname "eth0\\nx"',
    },
  ];
  for (const c of badReserves) {
    it(`refuses to reserve with ${c.name}`, () =>
      withFileStore(async (store) => {
        await assert.rejects(store.reserve(c.ip, c.owner, 0), (e: unknown) => {
          assert.ok(isAppError(e, 'INTERNAL'));
          assert.equal(e.message, c.message);
          return true;
        });
        assert.deepEqual(names(store.dir), ['lock']);
      }));
  }

  it('ignores names that are not IPs, sub-directories and non-canonical names', () =>
    withFileStore(async (store) => {
      const dir = store.dir;
      writeFileSync(join(dir, '10.0.0.2'), 'c1\r\neth0');
      writeFileSync(join(dir, 'last_reserved_ip.0'), '10.0.0.2');
      writeFileSync(join(dir, 'notes.txt'), 'c1\r\neth0');
      writeFileSync(join(dir, '010.0.0.3'), 'c1\r\neth0');
      writeFileSync(join(dir, 'FD00::3'), 'c1\r\neth0');
      writeFileSync(join(dir, '.keep'), '');
      mkdirSync(join(dir, '10.0.0.9'));
      mkdirSync(join(dir, 'sub'));
      writeFileSync(join(dir, 'sub', '10.0.0.4'), 'c1\r\neth0');
      const list = await store.list();
      assert.deepEqual(
        list.map((r) => ({ ip: r.ip, owner: r.owner })),
        [{ ip: '10.0.0.2', owner: { containerId: 'c1', ifname: 'eth0' } }],
      );
      assert.deepEqual(await store.releaseByOwner('c1', 'eth0'), ['10.0.0.2']);
      assert.deepEqual(names(dir), ['.keep', '010.0.0.3', '10.0.0.9', 'FD00::3', 'last_reserved_ip.0', 'lock', 'notes.txt', 'sub']);
    }));

  it('reports empty, corrupt and over-long files with owner null', () =>
    withFileStore(async (store) => {
      const files: Array<[string, string | Buffer]> = [
        ['10.0.0.2', ''],
        ['10.0.0.3', 'not a container id\r\neth0'],
        ['10.0.0.4', Buffer.from([0xff, 0xfe])],
        ['10.0.0.5', 'a'.repeat((1 << 20) + 1)],
        ['10.0.0.6', 'c6\r\neth0'],
      ];
      for (const [ip, content] of files) writeFileSync(join(store.dir, ip), content);
      const list = (await store.list()).sort((a, b) => a.ip.localeCompare(b.ip));
      assert.deepEqual(
        list.map((r) => [r.ip, r.owner]),
        [
          ['10.0.0.2', null],
          ['10.0.0.3', null],
          ['10.0.0.4', null],
          ['10.0.0.5', null],
          ['10.0.0.6', { containerId: 'c6', ifname: 'eth0' }],
        ],
      );
      assert.equal(await store.release('10.0.0.2', null), true);
      assert.equal(await store.release('10.0.0.6', null), false);
    }));

  it('skips entries that cannot be opened as files (socket, symlink loop, dangling symlink, FIFO, directory), in list and DEL; their names stay taken', () =>
    withFileStore(async (store) => {
      const server = createServer();
      await new Promise<void>((res) => server.listen(join(store.dir, '10.0.0.2'), res));
      try {
        symlinkSync(join(store.dir, '10.0.0.3'), join(store.dir, '10.0.0.3'));
        symlinkSync(join(store.dir, 'nowhere'), join(store.dir, '10.0.0.4'));
        spawnSync('mkfifo', [join(store.dir, '10.0.0.5')]);
        mkdirSync(join(store.dir, '10.0.0.6'));
        writeFileSync(join(store.dir, '10.0.0.7'), 'c7\r\neth0');
        for (const mtime of [true, false]) {
          assert.deepEqual((await store.list({ mtime })).map((r) => r.ip), ['10.0.0.7']);
        }
        assert.deepEqual(await store.releaseByOwner('c7', 'eth0'), ['10.0.0.7']);
        for (const ip of ['10.0.0.2', '10.0.0.3', '10.0.0.4', '10.0.0.5', '10.0.0.6']) {
          assert.equal(await store.reserve(ip, { containerId: 'c9', ifname: 'eth0' }, 0), false, `${ip} is taken`);
          assert.equal(await store.release(ip, null), false);
        }
      } finally {
        await new Promise((res) => server.close(res));
      }
    }));

  it('reads records longer than the read buffer whole (a long container ID): owned, released by that owner', () =>
    withFileStore(async (store) => {
      const id = `c${'d'.repeat(6000)}`;
      assert.equal(await store.reserve('10.0.0.2', { containerId: id, ifname: 'eth0' }, 0), true);
      assert.equal(readFileSync(join(store.dir, '10.0.0.2'), 'latin1'), `${id}\r\neth0`);
      for (const mtime of [true, false]) {
        assert.deepEqual((await store.list({ mtime })).map((r) => [r.ip, r.owner]), [['10.0.0.2', { containerId: id, ifname: 'eth0' }]]);
      }
      assert.deepEqual(await store.releaseByOwner(id, 'eth0'), ['10.0.0.2']);
    }));

  it('refuses to write a record longer than it would read back', () =>
    withFileStore(async (store) => {
      await assert.rejects(store.reserve('10.0.0.2', { containerId: 'e'.repeat(1 << 20), ifname: 'eth0' }, 0), { code: 'INTERNAL' });
      assert.deepEqual(await store.list(), []);
    }));

  it('an ifname that is not UTF-8 is written, matched and released as the very bytes (host-local compares bytes)', () =>
    withFileStore(async (store) => {
      writeFileSync(join(store.dir, '10.0.0.2'), Buffer.from('c1\r\neth\xff', 'latin1'));
      writeFileSync(join(store.dir, '10.0.0.3'), Buffer.from('c1\r\neth\xfe', 'latin1'));
      assert.equal(await store.reserve('10.0.0.4', { containerId: 'c2', ifname: 'e\udcf0\udc9f' }, 0), true);
      assert.deepEqual(readFileSync(join(store.dir, '10.0.0.4')), Buffer.from('c2\r\ne\xf0\x9f', 'latin1'));
      assert.deepEqual(await store.releaseByOwner('c1', 'eth\udcff'), ['10.0.0.2']);
      assert.deepEqual(await store.releaseByOwner('c1', 'eth\ufffd'), [], 'U+FFFD (what Node makes of the byte) is another name');
      assert.deepEqual((await store.list()).map((r) => [r.ip, r.owner]).sort(), [
        ['10.0.0.3', { containerId: 'c1', ifname: 'eth\udcfe' }],
        ['10.0.0.4', { containerId: 'c2', ifname: 'e\udcf0\udc9f' }],
      ]);
    }));

  it('reports each file mtime in ms (fstat of the open file)', () =>
    withFileStore(async (store) => {
      await store.reserve('10.0.0.2', { containerId: 'c1', ifname: 'eth0' }, 0);
      const [r] = await store.list();
      assert.equal(r?.mtimeMs, statSync(join(store.dir, '10.0.0.2')).mtimeMs);
    }));

  it('BR-04: owner = first line, so "c3\\r\\neth0" is owned by c3 and a legacy match never frees it', () =>
    withFileStore(async (store) => {
      const dir = store.dir;
      writeFileSync(join(dir, '10.244.1.2'), 'c1\r\neth0');
      writeFileSync(join(dir, '10.244.1.3'), 'c2\r\neth0');
      writeFileSync(join(dir, '10.244.1.4'), 'c3\r\neth0');
      writeFileSync(join(dir, 'last_reserved_ip.0'), '10.244.1.4');
      const byIp = new Map((await store.list()).map((r) => [r.ip, r.owner]));
      assert.deepEqual(byIp.get('10.244.1.4'), { containerId: 'c3', ifname: 'eth0' });
      assert.equal(ownerMatches(byIp.get('10.244.1.4') ?? null, 'c3', 'eth0'), true);
      // (c3, eth1): no exact match, and the legacy fallback compares the whole content with "c3".
      assert.deepEqual(await store.releaseByOwner('c3', 'eth1'), []);
      assert.deepEqual(names(dir), ['10.244.1.2', '10.244.1.3', '10.244.1.4', 'last_reserved_ip.0', 'lock']);
    }));

  it('honours legacy "c3" files in releaseByOwner only when no exact record exists', () =>
    withFileStore(async (store) => {
      writeFileSync(join(store.dir, '10.0.0.3'), 'c3');
      writeFileSync(join(store.dir, '10.0.0.4'), 'c3\n');
      writeFileSync(join(store.dir, '10.0.0.5'), 'c3\r\neth0');
      assert.deepEqual(await store.releaseByOwner('c3', 'eth0'), ['10.0.0.5']);
      assert.deepEqual((await store.releaseByOwner('c3', 'eth0')).sort(), ['10.0.0.3', '10.0.0.4']);
      assert.deepEqual(names(store.dir), ['lock']);
    }));

  it('lists an LF-only record with its owner and (unlike upstream DEL) releases it by owner', () =>
    withFileStore(async (store) => {
      writeFileSync(join(store.dir, '10.0.0.2'), 'c5\neth0');
      writeFileSync(join(store.dir, '10.0.0.3'), 'c6\neth0');
      assert.deepEqual((await store.list()).find((r) => r.ip === '10.0.0.2')?.owner, { containerId: 'c5', ifname: 'eth0' });
      assert.deepEqual(await store.releaseByOwner('c5', 'eth0'), ['10.0.0.2']);
      assert.equal(await store.release('10.0.0.3', { containerId: 'c6', ifname: 'eth0' }), true);
    }));

  it('removes leftover temporary files in list() only while holding the lock', async () => {
    const { store } = await freshStore();
    try {
      const dir = store.dir;
      writeFileSync(join(dir, `${TEMP_PREFIX}4242-0123456789ab.tmp`), 'c1\r\neth0');
      writeFileSync(join(dir, `${TEMP_PREFIX}4243-ba9876543210.tmp`), '');
      writeFileSync(join(dir, '.other.tmp'), '');
      assert.deepEqual(await store.list(), []);
      assert.deepEqual(names(dir), ['.ipwarden-4242-0123456789ab.tmp', '.ipwarden-4243-ba9876543210.tmp', '.other.tmp']);
      await store.lock(5);
      assert.deepEqual(await store.list(), []);
      assert.deepEqual(names(dir), ['.other.tmp', 'lock']);
    } finally {
      await store.close();
    }
  });

  it('lastReservedIP tolerates whitespace and non-canonical text, and ignores junk', () =>
    withFileStore(async (store) => {
      writeFileSync(join(store.dir, 'last_reserved_ip.0'), '10.0.0.7\n');
      writeFileSync(join(store.dir, 'last_reserved_ip.1'), 'FD00:0::7');
      writeFileSync(join(store.dir, 'last_reserved_ip.2'), 'junk');
      writeFileSync(join(store.dir, 'last_reserved_ip.3'), '');
      assert.equal(await store.lastReservedIP(0), '10.0.0.7');
      assert.equal(await store.lastReservedIP(1), 'fd00::7');
      assert.equal(await store.lastReservedIP(2), null);
      assert.equal(await store.lastReservedIP(3), null);
    }));

  it('gives [] and false, not errors, when DIR has been removed', () =>
    withFileStore(async (store) => {
      rmSync(store.dir, { recursive: true });
      assert.deepEqual(await store.list(), []);
      assert.deepEqual(await store.releaseByOwner('c1', 'eth0'), []);
      assert.equal(await store.release('10.0.0.2', null), false);
      assert.equal(await store.writable(), false);
      assert.equal(await store.lastReservedIP(0), null);
    }));

  it('throws STORE_IO and leaves nothing behind when DIR is gone at reserve time', () =>
    withFileStore(async (store) => {
      rmSync(store.dir, { recursive: true });
      await assert.rejects(store.reserve('10.0.0.2', { containerId: 'c1', ifname: 'eth0' }, 0), (e: unknown) => {
        assert.ok(isAppError(e, 'STORE_IO'));
        assert.match(e.message, /^cannot create a temporary file in .*: ENOENT: no such file or directory, open '.*\.ipwarden-\d+-[0-9a-z]+\.tmp'$/);
        return true;
      });
    }));
});

describe('lock', () => {
  /** A clock whose sleep advances time instantly and records each pause. */
  function fakeClock(): LockClock & { pauses: number[] } {
    let now = 0;
    const pauses: number[] = [];
    return {
      pauses,
      now: () => now,
      sleep: async (ms) => {
        pauses.push(ms);
        now += ms;
      },
    };
  }

  it('polls with a doubling backoff capped at 20 ms, then times out with CNI code 11', async () => {
    const dir = tempDataDir();
    const path = join(dir, 'lock');
    const holder = await lockExclusive(path, 0);
    try {
      const clock = fakeClock();
      await assert.rejects(lockExclusive(path, 0.1, clock), (e: unknown) => {
        assert.ok(isAppError(e, 'STORE_LOCK_TIMEOUT'));
        assert.equal(e.message, `timed out after 0.1s waiting for the lock on ${path}`);
        assert.equal(e.isRetryable, true);
        assert.equal(e.cniCode, 11);
        return true;
      });
      assert.deepEqual(clock.pauses, [1, 2, 4, 8, 16, 20, 20, 20, 9]);
    } finally {
      holder.release();
    }
    const again = await lockExclusive(path, 0);
    assert.equal(again.held, true);
    again.release();
    again.release();
    assert.equal(again.held, false);
  });

  it('throws STORE_IO when the lock file cannot be opened', async () => {
    const path = join(tempDataDir(), 'missing', 'lock');
    await assert.rejects(lockExclusive(path, 1), (e: unknown) => {
      assert.ok(isAppError(e, 'STORE_IO'));
      assert.equal(e.message, `cannot open lock file ${path}: ENOENT: no such file or directory, open '${path}'`);
      return true;
    });
  });

  it('two stores of one network exclude each other; close() releases the lock', async () => {
    const { store: a, dataDir } = await freshStore();
    const b = await openFileStore({ dataDir, network: 'net1' });
    try {
      await a.lock(0);
      await assert.rejects(b.lock(0), (e: unknown) => {
        assert.ok(e instanceof AppError);
        assert.equal(e.code, 'STORE_LOCK_TIMEOUT');
        assert.equal(e.message, `timed out after 0s waiting for the lock on ${b.lockPath}`);
        return true;
      });
      await assert.rejects(a.lock(0), (e: unknown) => isAppError(e, 'INTERNAL'));
      await a.close();
      await b.lock(0);
      assert.equal(b.locked, true);
    } finally {
      await a.close();
      await b.close();
    }
  });

  it('lock(0.2) times out with STORE_LOCK_TIMEOUT while another process holds the flock', async (t) => {
    const { store } = await freshStore();
    const child = spawn(process.execPath, [join(HERE, '..', 'fixtures', 'hold-lock.cjs'), store.lockPath], {
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    t.after(() => {
      child.kill('SIGKILL');
    });
    try {
      await waitForLine(child, 'locked');
      await assert.rejects(store.lock(0.2), (e: unknown) => {
        assert.ok(isAppError(e, 'STORE_LOCK_TIMEOUT'));
        assert.equal(e.message, `timed out after 0.2s waiting for the lock on ${store.lockPath}`);
        return true;
      });
      const exited = exitOf(child);
      child.stdin?.end();
      assert.deepEqual(await exited, { code: 0, signal: null });
      await store.lock(5);
      assert.equal(store.locked, true);
    } finally {
      await store.close();
    }
  });
});

// ---------------------------------------------------------------------------------------------
// Interop with the real upstream binary (containernetworking-plugins v1.1.1 on the test host).

function upstreamConf(dataDir: string, network: string, subnet = '10.0.0.0/29'): string {
  return JSON.stringify({ cniVersion: '0.4.0', name: network, ipam: { type: 'host-local', dataDir, ranges: [[{ subnet }]] } });
}

function upstreamEnv(command: 'ADD' | 'DEL', containerId: string, ifname: string): NodeJS.ProcessEnv {
  return {
    CNI_COMMAND: command,
    CNI_CONTAINERID: containerId,
    CNI_IFNAME: ifname,
    CNI_PATH: '/usr/lib/cni',
    // DEL runs with an empty netns (as after a reboot); ADD requires one to be named.
    CNI_NETNS: command === 'ADD' ? '/var/run/netns/ipwarden-test' : '',
  };
}

function runUpstream(command: 'ADD' | 'DEL', dataDir: string, network: string, containerId: string, ifname: string): { status: number | null; stdout: string; stderr: string } {
  const r = spawnSync(UPSTREAM, { input: upstreamConf(dataDir, network), env: upstreamEnv(command, containerId, ifname), encoding: 'utf8' });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

describe('interop with upstream host-local', { skip: upstreamSkip }, () => {
  it('upstream DEL removes a reservation written by FileStore', () =>
    withFileStore(async (store, dataDir) => {
      await store.reserve('10.0.0.2', { containerId: 'c1', ifname: 'eth0' }, 0);
      await store.reserve('10.0.0.3', { containerId: 'c2', ifname: 'eth0' }, 0);
      await store.unlock();
      assert.deepEqual(runUpstream('DEL', dataDir, 'net1', 'c1', 'eth0'), { status: 0, stdout: '', stderr: '' });
      assert.deepEqual(names(store.dir), ['10.0.0.3', 'last_reserved_ip.0', 'lock']);
    }));

  it('FileStore lists a reservation written by upstream ADD, and upstream follows our last_reserved_ip', () =>
    withFileStore(async (store, dataDir) => {
      await store.reserve('10.0.0.4', { containerId: 'c1', ifname: 'eth0' }, 0);
      await store.unlock();
      const add = runUpstream('ADD', dataDir, 'net1', 'c7', 'eth0');
      assert.equal(add.status, 0, add.stderr + add.stdout);
      assert.deepEqual((JSON.parse(add.stdout) as { ips: Array<{ address: string }> }).ips.map((i) => i.address), ['10.0.0.5/29']);
      await store.lock(5);
      const byIp = new Map((await store.list()).map((r) => [r.ip, r.owner]));
      assert.deepEqual(byIp.get('10.0.0.5'), { containerId: 'c7', ifname: 'eth0' });
      assert.equal(await store.lastReservedIP(0), '10.0.0.5');
      assert.equal(await store.reserve('10.0.0.5', { containerId: 'c8', ifname: 'eth0' }, 0), false);
      assert.deepEqual(await store.releaseByOwner('c7', 'eth0'), ['10.0.0.5']);
    }));

  // releaseByOwner must remove exactly what upstream DEL removes, file for file, plus the LF-only
  // records of the same owner (documented difference, docs/compatibility.md).
  const mixed: Record<string, string> = {
    '10.0.0.2': 'c1\r\neth0',
    '10.0.0.3': ' c1\r\neth0\n',
    '10.0.0.4': 'c1\r\neth1',
    '10.0.0.5': 'c1',
    '10.0.0.6': 'c1\neth0',
    '10.0.0.7': 'c3',
    '10.0.0.8': 'c3\r\n',
    '10.0.0.9': 'c3\r\neth1',
    '10.0.0.10': 'c3\neth0',
    '10.0.0.11': '',
    '10.0.0.12': 'c10\r\neth0',
    'last_reserved_ip.0': '10.0.0.12',
  };
  const requests: Array<[string, string]> = [
    ['c1', 'eth0'],
    ['c1', 'eth1'],
    ['c1', 'eth9'],
    ['c3', 'eth0'],
    ['c3', 'eth1'],
    ['c10', 'eth0'],
    ['c4', 'eth0'],
  ];
  for (const [id, ifname] of requests) {
    it(`releaseByOwner(${id}, ${ifname}) removes the same files as upstream DEL`, async () => {
      const dataDir = tempDataDir();
      mkdirSync(join(dataDir, 'ours'));
      for (const [name, content] of Object.entries(mixed)) writeFileSync(join(dataDir, 'ours', name), content);
      cpSync(join(dataDir, 'ours'), join(dataDir, 'theirs'), { recursive: true });
      const del = runUpstream('DEL', dataDir, 'theirs', id, ifname);
      assert.equal(del.status, 0, del.stdout + del.stderr);
      const store = await openFileStore({ dataDir, network: 'ours' });
      try {
        await store.lock(5);
        const released = await store.releaseByOwner(id, ifname);
        const lfOnly = Object.keys(mixed).filter((n) => mixed[n] === `${id}\n${ifname}`);
        const theirs = names(join(dataDir, 'theirs')).filter((n) => !lfOnly.includes(n));
        assert.deepEqual(names(join(dataDir, 'ours')), theirs);
        assert.deepEqual(
          [...released].sort(),
          Object.keys(mixed)
            .filter((n) => !theirs.includes(n))
            .sort(),
        );
      } finally {
        await store.close();
      }
    });
  }

  it('an upstream ADD waits for our lock and completes only after we unlock', async (t) => {
    const { store, dataDir } = await freshStore();
    const events: string[] = [];
    await store.lock(5);
    const child = spawn(UPSTREAM, { env: upstreamEnv('ADD', 'c9', 'eth0'), stdio: ['pipe', 'pipe', 'pipe'] });
    t.after(() => {
      child.kill('SIGKILL');
    });
    let stdout = '';
    child.stdout?.on('data', (d: Buffer) => (stdout += d.toString()));
    const exited = exitOf(child).then((r) => {
      events.push('upstream exited');
      return r;
    });
    child.stdin?.end(upstreamConf(dataDir, 'net1'));
    try {
      // Wait until the kernel shows the child blocked on our lock file (/proc/locks "->" line).
      const ino = statSync(store.lockPath).ino;
      while (!blockedOnLock(ino)) {
        assert.equal(events.length, 0, 'upstream ADD finished while we held the lock');
        await sleep(5);
      }
      assert.deepEqual(names(store.dir), ['lock']);
      events.push('unlock');
      await store.unlock();
      assert.deepEqual(await exited, { code: 0, signal: null });
      assert.deepEqual(events, ['unlock', 'upstream exited']);
      assert.match(stdout, /"address": "10\.0\.0\.2\/29"/);
      await store.lock(5);
      assert.deepEqual(
        (await store.list()).map((r) => [r.ip, r.owner]),
        [['10.0.0.2', { containerId: 'c9', ifname: 'eth0' }]],
      );
    } finally {
      await store.close();
    }
  });
});

/** True when /proc/locks shows a process waiting (`->`) for a lock on inode `ino`. */
function blockedOnLock(ino: number): boolean {
  return readFileSync('/proc/locks', 'latin1')
    .split('\n')
    .some((l) => l.includes('->') && l.includes(`:${ino} `));
}

function exitOf(child: ChildProcess): Promise<{ code: number | null; signal: NodeJS.Signals | null }> {
  return new Promise((resolve) => child.once('exit', (code, signal) => resolve({ code, signal })));
}

/** Resolve when `child` prints `line` on stdout; reject when it exits first (with its stderr). */
function waitForLine(child: ChildProcess, line: string): Promise<void> {
  return new Promise((resolve, reject) => {
    let out = '';
    let err = '';
    child.stderr?.on('data', (d: Buffer) => (err += d.toString()));
    const onData = (d: Buffer): void => {
      out += d.toString();
      if (out.split('\n').includes(line)) {
        child.stdout?.off('data', onData);
        child.off('exit', onExit);
        resolve();
      }
    };
    const onExit = (code: number | null, signal: string | null): void => {
      reject(new Error(`child exited (${String(code)}, ${String(signal)}) before printing "${line}": ${err}`));
    };
    child.stdout?.on('data', onData);
    child.once('exit', onExit);
  });
}

// ---------------------------------------------------------------------------------------------
// Crash safety: SIGKILL a writer at random moments; no IP-named file may ever be empty or partial.


describe('crash safety', () => {
  const LANES = 2;
  const KILLS_PER_LANE = 100;
  const SEED = 0x5eed1234;
  let bundle = '';

  before(() => {
    // Bundle the churn fixture once: a plain `node` child starts in ~50 ms, `--import tsx` in ~400.
    const outDir = tempDataDir();
    bundle = join(outDir, 'store-churn.cjs');
    buildSync({
      entryPoints: [join(HERE, '..', 'fixtures', 'store-churn.ts')],
      bundle: true,
      platform: 'node',
      format: 'cjs',
      target: 'node20',
      outfile: bundle,
      external: ['fs-ext'],
      logLevel: 'error',
    });
  });

  it(`leaves only whole records and a free lock after ${LANES * KILLS_PER_LANE} SIGKILLs at random moments`, async (t) => {
    const rand = rng(SEED);
    const children = new Set<ChildProcess>();
    t.after(() => {
      for (const c of children) c.kill('SIGKILL');
    });
    let tempLeftovers = 0;
    let reservationsSeen = 0;
    let stop = false;

    async function lane(laneNo: number): Promise<void> {
      const dataDir = tempDataDir();
      const dir = join(dataDir, 'churn');
      for (let k = 0; k < KILLS_PER_LANE && !stop; k++) {
        const delayMs = Math.floor(rand() * rand() * 40);
        const child = spawn(process.execPath, [bundle, dataDir, 'churn', String(SEED + laneNo * 1000 + k)], {
          stdio: ['ignore', 'pipe', 'pipe'],
          env: { ...process.env, NODE_PATH: join(REPO, 'node_modules') },
        });
        children.add(child);
        const exited = exitOf(child);
        await waitForLine(child, 'ready');
        if (delayMs > 0) await sleep(delayMs);
        child.kill('SIGKILL');
        assert.deepEqual(await exited, { code: null, signal: 'SIGKILL' }, `lane ${laneNo} kill ${k}: the writer died on its own`);
        children.delete(child);

        for (const name of readdirSync(dir)) {
          if (name.startsWith(TEMP_PREFIX)) tempLeftovers++;
          if (name.startsWith('last_reserved_ip.')) {
            assert.notEqual(isIP(readFileSync(join(dir, name), 'latin1')), 0, `lane ${laneNo} kill ${k}: ${name}`);
          }
          if (!isCanonicalIPName(name)) continue;
          reservationsSeen++;
          const content = readFileSync(join(dir, name), 'latin1');
          assert.match(content, /^c\d+\r\neth[01]$/, `lane ${laneNo} kill ${k}: ${name} = ${JSON.stringify(content)}`);
          assert.equal(statSync(join(dir, name)).mode & 0o777, 0o600);
        }
        const held = await lockExclusive(join(dir, 'lock'), 0);
        held.release();
      }
      // A locked list() clears every leftover and sees only whole records.
      const store = await openFileStore({ dataDir, network: 'churn' });
      try {
        await store.lock(0);
        const list = await store.list();
        assert.equal(list.every((r) => r.owner !== null), true);
        assert.deepEqual(
          readdirSync(dir).filter((n) => n.startsWith(TEMP_PREFIX)),
          [],
        );
      } finally {
        await store.close();
      }
    }

    // Let every lane finish (a failing lane stops the others) so that nothing runs after cleanup.
    const results = await Promise.allSettled(
      Array.from({ length: LANES }, (_, i) =>
        lane(i).catch((e: unknown) => {
          stop = true;
          throw e;
        }),
      ),
    );
    for (const r of results) if (r.status === 'rejected') throw r.reason;
    t.diagnostic(`kills: ${LANES * KILLS_PER_LANE}, temp leftovers seen after kills: ${tempLeftovers}, reservation files checked: ${reservationsSeen}`);
    assert.ok(reservationsSeen > 0);
  });
});
