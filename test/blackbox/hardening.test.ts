/**
 * Issue 8 (hardening) through the installed plugin executable: what a runtime, an attacker with
 * write access to the data directory, or a new user sees from the real binary. Names created
 * here start with `i8`.
 */
import assert from 'node:assert/strict';
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import { createServer, type Server } from 'node:net';
import { existsSync, mkdirSync, readdirSync, readFileSync, symlinkSync, utimesSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { startFakeCri, type FakeCri } from '../../bench/fake-cri.ts';
import { haveHostLocal, HOST_LOCAL, installedPlugin, requireOrSkip, ROOT, runCni, runCniAsync, snapshotDir, standalonePlugin, tempDir, type Invocation } from '../helpers/cni.ts';

const NET = 'i8net';
let bin = '';
/** Synchronous clean-ups (servers force-closed, directories removed), run in reverse order, each even if another fails. */
const cleanups: Array<() => void> = [];
before(() => {
  bin = installedPlugin();
});
after(() => {
  const failed: unknown[] = [];
  for (const c of cleanups.reverse()) {
    try {
      c();
    } catch (e) {
      failed.push(e);
    }
  }
  if (failed.length > 0) throw failed[0];
});

function dataDir(): string {
  const t = tempDir('i8-bb-');
  cleanups.push(t.cleanup);
  return t.dir;
}

function config(dd: string, ipam: Record<string, unknown>, cniVersion = '1.0.0') {
  return { cniVersion, name: NET, ipam: { type: 'ipwarden', dataDir: dd, ...ipam } };
}

// Asynchronous runs: the fake CRI server lives in this process and must keep answering.
const run = (inv: Invocation) => runCniAsync(bin, inv);
const HOUR_AGO = Date.now() / 1000 - 3600;
/** Ten days ago (seconds): the table shows `10d0h` for the rest of the hour, whatever the load. */
const TEN_DAYS_AGO = Math.floor(Date.now() / 1000) - 10 * 86400;

/** A network directory holding `files` (`a|b` = `a\r\nb`), every file an hour old. */
function prepared(dd: string, files: Record<string, string>): string {
  const dir = join(dd, NET);
  mkdirSync(dir, { recursive: true });
  for (const [name, content] of Object.entries(files)) {
    writeFileSync(join(dir, name), content.replace('|', '\r\n'));
    utimesSync(join(dir, name), HOUR_AGO, HOUR_AGO);
  }
  return dir;
}

/** A fake CRI runtime listing `ids` (READY), on a socket in a fresh temp dir. */
async function fakeRuntime(ids: string[]): Promise<FakeCri> {
  const cri = await startFakeCri(join(dataDir(), 'i8-cri.sock'), ids);
  cleanups.push(() => cri.forceClose());
  return cri;
}

describe('errors raised in the cold part keep their CNI code (issue 8.5)', () => {
  it('a runtime that exists but cannot list its sandboxes while the directory is empty, and the kernel cannot be seen whole: code 11', () => {
    const dd = dataDir();
    // A path that exists but is no socket: connect(2) is refused, the runtime cannot be asked.
    const sock = join(dd, 'i8-not-a-socket');
    writeFileSync(sock, '');
    // In a PID namespace of its own (fresh /proc) the plugin cannot see the node's other
    // processes: the kernel evidence is incomplete, so nothing covers the runtime's silence
    // (with complete evidence the recovery would proceed from the kernel: reconciler.md E8).
    const stdin = JSON.stringify(config(dd, { ranges: [[{ subnet: '10.8.5.0/29' }]], runtimeEndpoint: sock }));
    const env = { PATH: '/usr/bin:/bin', CNI_COMMAND: 'ADD', CNI_CONTAINERID: 'c1', CNI_IFNAME: 'eth0', CNI_NETNS: '/var/run/netns/i8', CNI_PATH: '/usr/lib/cni' };
    // The standalone plugin itself (not the shim): with the daemon up, the shim would hand the
    // request to the daemon, which runs in the host PID namespace and sees the node whole.
    const r = spawnSync('unshare', ['--pid', '--fork', '--mount-proc', standalonePlugin()], { input: stdin, env, encoding: 'utf8', timeout: 60_000 });
    const json = JSON.parse(r.stdout) as Record<string, unknown>;
    assert.deepEqual([json['cniVersion'], json['code']], ['1.0.0', 11], r.stdout);
    const msg = String(json['msg']);
    assert.equal(msg.startsWith(`the network directory ${dd}/${NET} has no reservations, the runtime at unix://${sock} cannot list its sandboxes: no CRI runtime at unix://${sock}: not a unix socket`), true, msg);
    assert.equal(msg.includes(', and the kernel evidence is incomplete (/proc is not of the host PID namespace (pid 2 is not kthreadd)'), true, msg);
    assert.equal(msg.endsWith("): handing out an address now could give away a running pod's"), true, msg);
    assert.deepEqual([r.status, r.stderr], [1, '']);
    assert.deepEqual(snapshotDir(join(dd, NET)), { lock: '' });
  });

  it('an audit log that cannot be opened before a reclaim: code 5, nothing released', async () => {
    const dd = dataDir();
    // A /30 has one allocatable address, .2, held by a sandbox the runtime does not list.
    const dir = prepared(dd, { '10.8.5.2': 'gone|eth0', 'last_reserved_ip.0': '10.8.5.2' });
    mkdirSync(join(dd, '.ipwarden-audit.log')); // a directory where the log should be
    const cri = await fakeRuntime(['c1']);
    const before = snapshotDir(dir);
    const r = await run({ command: 'ADD', containerId: 'c2', ifname: 'eth0', stdin: config(dd, { ranges: [[{ subnet: '10.8.5.0/30' }]], runtimeEndpoint: cri.endpoint }) });
    assert.equal(r.json?.['code'], 5, r.stdout + r.stderr);
    assert.equal(String(r.json?.['msg']).startsWith(`cannot open the audit log ${join(dd, '.ipwarden-audit.log')}: `), true, r.stdout);
    assert.deepEqual([r.exitCode, r.stderr], [1, '']);
    delete before['lock'];
    const afterRun = snapshotDir(dir);
    delete afterRun['lock'];
    assert.deepEqual(afterRun, before);
  });
});

/** Hold DIR/lock from another process (test/fixtures/hold-lock.cjs) while `fn` runs. */
async function withLockHeld<T>(dir: string, fn: () => Promise<T>): Promise<T> {
  const holder = spawn(process.execPath, [join(ROOT, 'test/fixtures/hold-lock.cjs'), join(dir, 'lock')], { stdio: ['pipe', 'pipe', 'inherit'] });
  try {
    await new Promise<void>((res) => holder.stdout.once('data', () => res()));
    return await fn();
  } finally {
    holder.stdin.end();
    await new Promise((res) => holder.once('close', res));
  }
}

describe('STATUS does not take the node out of service (issue 8.1)', () => {
  const fill = async (conf: object) => {
    for (let i = 0; i < 5; i++) assert.equal((await run({ command: 'ADD', containerId: `i8c${i}`, ifname: 'eth0', stdin: conf })).exitCode, 0);
  };
  const noRuntime = { CONTAINER_RUNTIME_ENDPOINT: '/nonexistent/i8-cri.sock' };

  it('succeeds on a full range set (exhaustion is not a plugin failure)', async () => {
    const dd = dataDir();
    const conf = config(dd, { ranges: [[{ subnet: '10.8.1.0/29' }]] }, '1.1.0');
    await fill(conf);
    const r = await run({ command: 'STATUS', stdin: conf, env: noRuntime });
    assert.deepEqual([r.exitCode, r.stdout, r.stderr], [0, '', '']);
  });

  it('succeeds while another process holds the lock (no wait for DIR/lock)', async () => {
    const dd = dataDir();
    const conf = config(dd, { ranges: [[{ subnet: '10.8.1.0/29' }]], lockTimeout: '200ms' }, '1.1.0');
    const dir = join(dd, NET);
    mkdirSync(dir, { recursive: true });
    const r = await withLockHeld(dir, () => run({ command: 'STATUS', stdin: conf }));
    assert.deepEqual([r.exitCode, r.stdout, r.stderr], [0, '', '']);
  });

  it('still fails with code 50 when the data directory cannot be written', async () => {
    const dd = dataDir();
    writeFileSync(join(dd, 'i8-file'), '');
    const sub = join(dd, 'i8-file', 'sub');
    const r = await run({ command: 'STATUS', stdin: config(sub, { ranges: [[{ subnet: '10.8.1.0/29' }]] }, '1.1.0') });
    assert.equal(r.exitCode, 1);
    assert.deepEqual([r.json?.['code'], r.json?.['msg']], [50, `data directory ${sub} is not writable`]);
  });

  it('with "failStatusOnExhaustion": true a full range set is code 50 with the breakdown', async () => {
    const dd = dataDir();
    const conf = config(dd, { ranges: [[{ subnet: '10.8.1.0/29' }]], failStatusOnExhaustion: true }, '1.1.0');
    await fill(conf);
    const r = await run({ command: 'STATUS', stdin: conf, env: noRuntime });
    assert.deepEqual(r.json, {
      cniVersion: '1.1.0',
      code: 50,
      msg: `no IP addresses available in range set: 10.8.1.1-10.8.1.6; range set 0: 5 of 5 addresses reserved; the runtime could not be asked (no CRI runtime at unix:///nonexistent/i8-cri.sock: socket does not exist), so leaked reservations cannot be told from live ones (set the ipam key "runtimeEndpoint"); run "ipwarden leaks --network ${NET} --data-dir ${dd} --runtime-endpoint URL"`,
    });
    assert.equal(r.exitCode, 1);
  });

  it('"failStatusOnExhaustion" must be a boolean (code 7)', async () => {
    const r = await run({ command: 'STATUS', stdin: config(dataDir(), { ranges: [[{ subnet: '10.8.1.0/29' }]], failStatusOnExhaustion: 'yes' }, '1.1.0') });
    assert.deepEqual(r.json, { cniVersion: '1.1.0', code: 7, msg: 'ipam.failStatusOnExhaustion must be a boolean, got string' });
  });
});

/** Run the installed executable as the operator CLI (no CNI_COMMAND). */
function cli(args: string[]): { code: number; stdout: string; stderr: string } {
  const r = spawnSync(bin, args, { env: { PATH: '/usr/bin:/bin' }, encoding: 'utf8', timeout: 60_000 });
  if (r.error) throw r.error;
  return { code: r.status ?? -1, stdout: r.stdout, stderr: r.stderr };
}

describe('a data directory that cannot hold directories although its parent exists', () => {
  // procfs answers mkdir of any new name with ENOENT while /proc exists: Node's recursive mkdir
  // then retried the parent and the child for ever, at 100 % CPU (the plugin never exited; in the
  // daemon, its event loop stopped for good). Each command now answers at once.
  const dd = '/proc/ipwarden-i8-nodir';
  const conf = config(dd, { ranges: [[{ subnet: '10.8.1.0/29' }]] }, '1.1.0');
  const enoent = `cannot create network directory ${dd}/${NET}: ENOENT: no such file or directory, mkdir '${dd}'`;

  it('ADD: code 5 naming the directory; STATUS: code 50; then a good ADD is served', { timeout: 60_000, skip: requireOrSkip(existsSync('/proc/self'), '/proc') }, async () => {
    const add = await run({ command: 'ADD', containerId: 'i8proc', ifname: 'eth0', stdin: conf });
    assert.deepEqual([add.exitCode, add.json], [1, { cniVersion: '1.1.0', code: 5, msg: enoent }]);
    const status = await run({ command: 'STATUS', stdin: conf });
    assert.deepEqual([status.exitCode, status.json], [1, { cniVersion: '1.1.0', code: 50, msg: `data directory ${dd} is not writable`, details: enoent }]);
    assert.equal(existsSync(dd), false);
    // The same plugin (or daemon) still serves a network whose directory can be made.
    const good = await run({ command: 'ADD', containerId: 'i8proc', ifname: 'eth0', stdin: config(dataDir(), { ranges: [[{ subnet: '10.8.1.0/29' }]] }, '1.1.0') });
    assert.deepEqual([good.exitCode, (good.json?.['ips'] as Array<{ address: string }> | undefined)?.[0]?.address], [0, '10.8.1.2/29']);
  });
});

describe('the audit log is opened safely (issue 8.2)', () => {
  it('a FIFO at <dataDir>/.ipwarden-audit.log: the reclaiming ADD answers code 5 at once instead of hanging', { timeout: 60_000 }, async () => {
    const dd = dataDir();
    const dir = prepared(dd, { '10.8.2.2': 'gone|eth0', 'last_reserved_ip.0': '10.8.2.2' });
    const log = join(dd, '.ipwarden-audit.log');
    execFileSync('mkfifo', [log]);
    const cri = await fakeRuntime(['c1']);
    const r = await run({ command: 'ADD', containerId: 'c2', ifname: 'eth0', stdin: config(dd, { ranges: [[{ subnet: '10.8.2.0/30' }]], runtimeEndpoint: cri.endpoint }) });
    assert.deepEqual(r.json, { cniVersion: '1.0.0', code: 5, msg: `cannot open the audit log ${log}: it is a FIFO, not a regular file` });
    assert.equal(readFileSync(join(dir, '10.8.2.2'), 'utf8'), 'gone\r\neth0', 'nothing released');
  });

  it('a symlink at the audit log path: gc refuses it, releases nothing, and the target is untouched', () => {
    const dd = dataDir();
    const dir = join(dd, NET);
    mkdirSync(dir);
    writeFileSync(join(dir, '10.8.2.3'), ''); // corrupt: released by gc even without a runtime
    const victim = join(dd, 'i8-victim');
    writeFileSync(victim, 'precious\n');
    symlinkSync(victim, join(dd, '.ipwarden-audit.log'));
    const r = cli(['gc', '--data-dir', dd, '--runtime-endpoint', '/nonexistent/i8-cri.sock']);
    assert.deepEqual(r, { code: 1, stdout: '', stderr: `ipwarden: cannot open the audit log ${join(dd, '.ipwarden-audit.log')}: it is a symbolic link (not followed)\n` });
    assert.equal(readFileSync(victim, 'utf8'), 'precious\n');
    assert.deepEqual(readdirSync(dir).sort(), ['10.8.2.3', 'lock']);
  });

  it('a dangling symlink at the audit log path: gc does not create its target', () => {
    const dd = dataDir();
    mkdirSync(join(dd, NET));
    writeFileSync(join(dd, NET, '10.8.2.3'), '');
    const target = join(dd, 'i8-would-be-created');
    symlinkSync(target, join(dd, '.ipwarden-audit.log'));
    const r = cli(['gc', '--data-dir', dd, '--runtime-endpoint', '/nonexistent/i8-cri.sock']);
    assert.equal(r.code, 1);
    assert.equal(existsSync(target), false);
    assert.equal(existsSync(join(dd, NET, '10.8.2.3')), true);
  });
});

/**
 * Run `bin` with CNI_IFNAME set to raw bytes (`printf` octal escapes, e.g. `eth\377`): Node can
 * only pass environment strings as UTF-8, a shell can pass any bytes, as a runtime can.
 */
function runWithRawIfname(bin: string, command: string, containerId: string, ifnamePrintf: string, stdin: object) {
  const env = { PATH: '/usr/bin:/bin', CNI_COMMAND: command, CNI_CONTAINERID: containerId, CNI_NETNS: '/var/run/netns/i8', CNI_PATH: '/usr/lib/cni', I8_BIN: bin, I8_IF: ifnamePrintf };
  const r = spawnSync('/bin/sh', ['-c', 'CNI_IFNAME="$(printf "$I8_IF")" exec "$I8_BIN"'], { env, input: JSON.stringify(stdin), encoding: 'utf8' });
  if (r.error) throw r.error;
  return { exitCode: r.status ?? -1, stdout: r.stdout, json: r.stdout.trim() === '' ? null : (JSON.parse(r.stdout) as Record<string, unknown>) };
}

describe('records are read as host-local reads them (issue 8.3)', () => {
  const skip = requireOrSkip(haveHostLocal(), `upstream host-local at ${HOST_LOCAL}`);
  const EXHAUSTED = 'failed to allocate for range 0: no IP addresses available in range set: 10.8.3.1-10.8.3.2';
  const noRuntime = { CONTAINER_RUNTIME_ENDPOINT: '/nonexistent/i8-cri.sock' };
  // A /30: one allocatable address, 10.8.3.2.
  const conf = (dd: string, type: string) => ({ cniVersion: '1.0.0', name: NET, ipam: { type, dataDir: dd, ranges: [[{ subnet: '10.8.3.0/30' }]] } });

  it('a host-local record with a non-UTF-8 ifname is owned: ipwarden never hands its address out, and DEL with those bytes releases it', { skip }, () => {
    const dd = dataDir();
    const file = join(dd, NET, '10.8.3.2');
    assert.equal(runWithRawIfname(HOST_LOCAL, 'ADD', 'i8c1', 'eth\\377', conf(dd, 'host-local')).exitCode, 0);
    assert.deepEqual(readFileSync(file), Buffer.from('i8c1\r\neth\xff', 'latin1'));
    const r = runCni(bin, { command: 'ADD', containerId: 'i8c2', ifname: 'eth0', stdin: conf(dd, 'ipwarden'), env: noRuntime });
    assert.equal(r.json?.['msg'], EXHAUSTED, r.stdout);
    assert.deepEqual(readFileSync(file), Buffer.from('i8c1\r\neth\xff', 'latin1'), 'the record is untouched');
    // Another interface of the same container does not own it; the one with the same bytes does.
    assert.deepEqual(runWithRawIfname(bin, 'DEL', 'i8c1', 'eth\\376', conf(dd, 'ipwarden')).exitCode, 0);
    assert.equal(existsSync(file), true);
    assert.deepEqual(runWithRawIfname(bin, 'DEL', 'i8c1', 'eth\\377', conf(dd, 'ipwarden')).exitCode, 0);
    assert.equal(existsSync(file), false);
  });

  it('ipwarden writes the ifname bytes it was given, which host-local then releases', { skip }, () => {
    const dd = dataDir();
    const file = join(dd, NET, '10.8.3.2');
    const a = runWithRawIfname(bin, 'ADD', 'i8c1', 'eth\\377', conf(dd, 'ipwarden'));
    assert.deepEqual(a.json, { cniVersion: '1.0.0', ips: [{ address: '10.8.3.2/30', gateway: '10.8.3.1' }] });
    assert.deepEqual(readFileSync(file), Buffer.from('i8c1\r\neth\xff', 'latin1'));
    // A repeated ADD returns the same address (the record is its own).
    assert.deepEqual(runWithRawIfname(bin, 'ADD', 'i8c1', 'eth\\377', conf(dd, 'ipwarden')).json, a.json);
    assert.equal(runWithRawIfname(HOST_LOCAL, 'DEL', 'i8c1', 'eth\\377', conf(dd, 'host-local')).exitCode, 0);
    assert.equal(existsSync(file), false);
  });

  it('CNI GC keeps such a record when the runtime lists the attachment (its JSON has U+FFFD for the byte)', () => {
    const dd = dataDir();
    const dir = join(dd, NET);
    mkdirSync(dir);
    writeFileSync(join(dir, '10.8.3.2'), Buffer.from('i8c1\r\neth\xff', 'latin1'));
    const gc = (valid: unknown) =>
      runCni(bin, { command: 'GC', stdin: { ...conf(dd, 'ipwarden'), cniVersion: '1.1.0', 'cni.dev/valid-attachments': valid } });
    assert.equal(gc([{ containerID: 'i8c1', ifname: 'eth\ufffd' }]).exitCode, 0);
    assert.equal(existsSync(join(dir, '10.8.3.2')), true);
    assert.equal(gc([{ containerID: 'i8c1', ifname: 'eth0' }]).exitCode, 0);
    assert.equal(existsSync(join(dir, '10.8.3.2')), false);
  });

  it('a record over 4 KiB (a long container ID, as ipwarden writes it) is owned, not corrupt', () => {
    const dd = dataDir();
    const id = `i8${'a'.repeat(5000)}`;
    const file = join(dd, NET, '10.8.3.2');
    assert.equal(runCni(bin, { command: 'ADD', containerId: id, ifname: 'eth0', stdin: conf(dd, 'ipwarden') }).exitCode, 0);
    assert.equal(readFileSync(file, 'utf8'), `${id}\r\neth0`);
    const r = runCni(bin, { command: 'ADD', containerId: 'i8c2', ifname: 'eth0', stdin: conf(dd, 'ipwarden'), env: noRuntime });
    assert.equal(r.json?.['msg'], EXHAUSTED, r.stdout);
    assert.equal(readFileSync(file, 'utf8'), `${id}\r\neth0`);
    assert.equal(runCni(bin, { command: 'DEL', containerId: id, ifname: 'eth0', stdin: conf(dd, 'ipwarden') }).exitCode, 0);
    assert.equal(existsSync(file), false);
  });
});

describe('entries that cannot be opened are skipped, as host-local skips them (issue 8.4)', () => {
  /** A unix socket bound at `path` (closed at the end of the file). */
  async function socketAt(path: string): Promise<Server> {
    const server = createServer();
    await new Promise<void>((res) => server.listen(path, res));
    cleanups.push(() => void server.close());
    return server;
  }

  it('a unix socket and a symlink loop named like addresses: ADD, DEL and CHECK still work, and never hand those addresses out', async () => {
    const dd = dataDir();
    const dir = join(dd, NET);
    mkdirSync(dir);
    await socketAt(join(dir, '10.8.4.2'));
    symlinkSync(join(dir, '10.8.4.3'), join(dir, '10.8.4.3')); // points at itself: ELOOP
    const conf = config(dd, { ranges: [[{ subnet: '10.8.4.0/29' }]] });
    const a = await run({ command: 'ADD', containerId: 'i8c1', ifname: 'eth0', stdin: conf });
    assert.deepEqual(a.json, { cniVersion: '1.0.0', ips: [{ address: '10.8.4.4/29', gateway: '10.8.4.1' }] });
    const c = await run({ command: 'CHECK', containerId: 'i8c1', ifname: 'eth0', stdin: conf });
    assert.deepEqual([c.exitCode, c.stdout], [0, '']);
    const d = await run({ command: 'DEL', containerId: 'i8c1', ifname: 'eth0', stdin: conf });
    assert.deepEqual([d.exitCode, d.stdout], [0, '']);
    assert.deepEqual(readdirSync(dir).sort(), ['10.8.4.2', '10.8.4.3', 'last_reserved_ip.0', 'lock']);
  });

  it('doctor names them (with what they are), and gc leaves them alone', async () => {
    const dd = dataDir();
    const dir = join(dd, NET);
    mkdirSync(dir);
    await socketAt(join(dir, '10.8.4.2'));
    symlinkSync(join(dir, '10.8.4.3'), join(dir, '10.8.4.3'));
    execFileSync('mkfifo', [join(dir, '10.8.4.5')]);
    writeFileSync(join(dir, '10.8.4.6'), 'i8c6\r\neth0');
    const confDir = join(dd, 'i8-net.d');
    mkdirSync(confDir);
    const r = cli(['doctor', '--json', '--data-dir', dd, '--cni-conf-dir', confDir, '--runtime-endpoint', '/nonexistent/i8-cri.sock']);
    const doc = JSON.parse(r.stdout) as { findings: Array<Record<string, string>> };
    assert.deepEqual(
      doc.findings.find((f) => f['id'] === 'unusable-entries'),
      {
        id: 'unusable-entries',
        severity: 'warning',
        title: `${NET}: 3 entries named like addresses are not reservation files`,
        evidence: `${join(dir, '10.8.4.2')} (a unix socket), ${join(dir, '10.8.4.3')} (a symlink loop), ${join(dir, '10.8.4.5')} (a FIFO): neither ipwarden nor host-local reads them as reservations or hands their addresses out (the names are taken), and gc never removes them`,
        fix: `check that nothing uses them, then remove them: rm ${join(dir, '10.8.4.2')} ${join(dir, '10.8.4.3')} ${join(dir, '10.8.4.5')}`,
      },
    );
    const g = cli(['gc', '--data-dir', dd, '--runtime-endpoint', '/nonexistent/i8-cri.sock']);
    assert.equal(g.code, 1, g.stderr); // the runtime is unreachable; nothing else fails
    assert.equal(
      g.stderr,
      'ipwarden: runtime not reachable: no CRI runtime at unix:///nonexistent/i8-cri.sock: socket does not exist (No connection established. Last error: Error: connect ENOENT /nonexistent/i8-cri.sock); only corrupt files are released\n',
    );
    assert.deepEqual(readdirSync(dir).sort(), ['10.8.4.2', '10.8.4.3', '10.8.4.5', '10.8.4.6', 'lock']);
  });
});

describe('terminal escapes from disk and configuration are escaped in every human output (issue 8.6)', () => {
  // An ifname may hold any byte but whitespace, '/' and ':' (libcni): host-local writes this one.
  const IFNAME = 'e\x1b[2K\x1b[1A\x07';
  const SHOWN = 'e\\x1b[2K\\x1b[1A\\x07';
  const RAW = /[\x00-\x09\x0b-\x1f\x7f-\x9f]/;

  function node(): { dd: string; confDir: string; dir: string } {
    const dd = dataDir();
    const dir = join(dd, NET);
    mkdirSync(dir);
    writeFileSync(join(dir, '10.8.6.2'), `i8c1\r\n${IFNAME}`);
    writeFileSync(join(dir, '10.8.6.3'), `i8c2\r\n${IFNAME}`);
    // Ten days old: the AGE column shows 10d0h however long the machine takes to get there.
    for (const ip of ['10.8.6.2', '10.8.6.3']) utimesSync(join(dir, ip), TEN_DAYS_AGO, TEN_DAYS_AGO);
    const confDir = join(dd, 'i8-net.d');
    mkdirSync(confDir);
    writeFileSync(join(confDir, 'i8\x1b[2J.conf'), '{not json');
    writeFileSync(
      join(confDir, '10-i8.conf'),
      JSON.stringify({ cniVersion: '1.0.0', name: NET, type: 'bridge', ipam: { type: 'host-local', dataDir: dd, ranges: [[{ subnet: '10.8.6.0/30' }]] } }),
    );
    return { dd, confDir, dir };
  }
  const noRuntime = ['--runtime-endpoint', '/nonexistent/i8-cri.sock'];

  it('leaks and gc: the table shows the ifname escaped, nothing raw reaches the terminal', () => {
    const { dd } = node();
    for (const cmd of ['leaks', 'gc']) {
      const r = cli([cmd, '--data-dir', dd, ...noRuntime]);
      assert.equal(RAW.test(r.stdout) || RAW.test(r.stderr), false, `${cmd}: ${JSON.stringify(r)}`);
      const w = SHOWN.length; // the escaped text is what the columns are aligned on
      assert.deepEqual(r.stdout.split('\n').slice(1, 4), [
        `NETWORK  IP        CONTAINER  ${'IFNAME'.padEnd(w)}  AGE    VERDICT  REASON`,
        `${NET}    10.8.6.2  i8c1       ${SHOWN}  10d0h  unknown  runtime not reachable; kept`,
        `${NET}    10.8.6.3  i8c2       ${SHOWN}  10d0h  unknown  runtime not reachable; kept`,
      ]);
    }
    // JSON keeps the exact text (JSON escapes it itself).
    const j = JSON.parse(cli(['leaks', '--json', '--data-dir', dd, ...noRuntime]).stdout) as { networks: Array<{ name: string; reservations: Array<{ ifname: string }> }> };
    assert.equal(j.networks.find((n) => n.name === NET)?.reservations[0]?.ifname, IFNAME);
  });

  it('status and doctor: configuration file names and on-disk values are escaped', () => {
    const { dd, confDir } = node();
    const s = cli(['status', '--cni-conf-dir', confDir, ...noRuntime]);
    assert.equal(RAW.test(s.stdout) || RAW.test(s.stderr), false, JSON.stringify(s));
    assert.equal(s.stdout.split('\n').at(-2)?.startsWith(`config ${confDir}/i8\\x1b[2J.conf: `), true, s.stdout);
    const d = cli(['doctor', '--cni-conf-dir', confDir, '--data-dir', dd, '--cni-bin-dir', '/usr/lib/cni', ...noRuntime]);
    assert.equal(RAW.test(d.stdout) || RAW.test(d.stderr), false, JSON.stringify(d));
    assert.match(d.stdout, new RegExp(`WARNING  cni-config-invalid: CNI configuration ${confDir.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}/i8\\\\x1b\\[2J\\.conf cannot be used\n`));
  });
});
