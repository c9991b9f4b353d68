/**
 * Bad input: a table of malformed configs, env vars, CNI_ARGS values and pre-existing garbage
 * files, plus a seeded fuzz loop. Each must give one error document with the right CNI code (or a
 * success that is still correct), and never a write outside the network directory.
 * Runs the real handlers over the real file store in-process (same code as the executable).
 */
import assert from 'node:assert/strict';
import { mkdirSync, readdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { after, describe, it } from 'node:test';
import { fileDepsWith } from '../../src/cni/plugin.ts';

const fileDeps = fileDepsWith(async () => (await import('../../src/cni/heal.ts')).criHeal);
import { makeHandlers } from '../../src/cni/commands.ts';
import { pluginMain } from '../../src/cni/skel.ts';
import { tempDir } from '../helpers/cni.ts';
import { rng } from '../helpers/rng.ts';

const SPEC_CODES = new Set([1, 2, 3, 4, 5, 6, 7, 11, 50, 51, 999]);

async function invoke(env: Record<string, string>, stdin: string) {
  let out = '';
  let err = '';
  const code = await pluginMain(makeHandlers(fileDeps), {
    env,
    readStdin: async () => Buffer.from(stdin, 'utf8'),
    stdout: (t) => (out += t),
    stderr: (t) => (err += t),
  });
  return { code, out, err, json: out === '' ? null : (JSON.parse(out) as Record<string, unknown>) };
}

function baseEnv(cmd = 'ADD'): Record<string, string> {
  return { CNI_COMMAND: cmd, CNI_CONTAINERID: 'c1', CNI_IFNAME: 'eth0', CNI_NETNS: '/x', CNI_PATH: '/usr/lib/cni' };
}

/** Every path under `root`, relative. */
function walk(root: string): string[] {
  const out: string[] = [];
  const rec = (d: string) => {
    for (const n of readdirSync(d)) {
      const p = join(d, n);
      out.push(relative(root, p));
      if (statSync(p).isDirectory()) rec(p);
    }
  };
  rec(root);
  return out.sort();
}

const cleanups: Array<() => void> = [];
after(() => cleanups.forEach((c) => c()));
function root(): string {
  const t = tempDir('ipw-bad-');
  cleanups.push(t.cleanup);
  return t.dir;
}

interface BadCase {
  name: string;
  env?: Record<string, string>;
  /** A function of the data dir giving stdin. */
  stdin: (dd: string) => string;
  code: number;
  msg?: string;
}

const good = (dd: string, ipam: Record<string, unknown> = {}, top: Record<string, unknown> = {}) =>
  JSON.stringify({ cniVersion: '1.0.0', name: 'net', ...top, ipam: { type: 'ipwarden', dataDir: dd, ranges: [[{ subnet: '10.1.0.0/24' }]], ...ipam } });

const table: BadCase[] = [
  { name: 'empty stdin', stdin: () => '', code: 6 },
  { name: 'stdin is a JSON array', stdin: () => '[1,2]', code: 6 },
  { name: 'stdin is not UTF-8 JSON', stdin: () => '\u0000\u0001', code: 6 },
  { name: 'missing name', stdin: (dd) => JSON.stringify({ cniVersion: '1.0.0', ipam: { type: 'ipwarden', dataDir: dd } }), code: 7, msg: 'missing network name' },
  { name: 'name with ..', stdin: (dd) => good(dd, {}, { name: '..' }), code: 7, msg: 'invalid characters found in network name' },
  { name: 'name with a slash', stdin: (dd) => good(dd, {}, { name: 'a/../../etc' }), code: 7, msg: 'invalid characters found in network name' },
  { name: 'name is a number', stdin: (dd) => good(dd, {}, { name: 42 }), code: 6 },
  { name: 'cniVersion garbage', stdin: (dd) => good(dd, {}, { cniVersion: 'one' }), code: 1, msg: 'incompatible CNI versions' },
  { name: 'missing ipam', stdin: () => JSON.stringify({ cniVersion: '1.0.0', name: 'net' }), code: 7, msg: "IPAM config missing 'ipam' key" },
  { name: 'relative dataDir', stdin: () => good('relative/dir'), code: 7 },
  { name: 'dataDir with NUL', stdin: (dd) => good(`${dd}\u0000x`), code: 7 },
  { name: 'ranges is a string', stdin: (dd) => good(dd, { ranges: 'x' }), code: 7 },
  { name: 'subnet garbage', stdin: (dd) => good(dd, { ranges: [[{ subnet: 'nope' }]] }), code: 7 },
  { name: 'subnet IPv4 with leading zeros', stdin: (dd) => good(dd, { ranges: [[{ subnet: '010.1.0.0/24' }]] }), code: 7 },
  { name: 'gateway is not an IP', stdin: (dd) => good(dd, { ranges: [[{ subnet: '10.1.0.0/24', gateway: 'router' }]] }), code: 7 },
  {
    name: 'runtimeEndpoint not a unix socket',
    stdin: (dd) => good(dd, { runtimeEndpoint: 'tcp://1.2.3.4:5' }),
    code: 7,
    msg: 'ipam.runtimeEndpoint: unsupported runtime endpoint "tcp://1.2.3.4:5": want unix:///path/to/socket or /path/to/socket',
  },
  { name: 'lockTimeout garbage', stdin: (dd) => good(dd, { lockTimeout: 'soon' }), code: 7 },
  { name: 'routes not an array', stdin: (dd) => good(dd, { routes: { dst: '0.0.0.0/0' } }), code: 7 },
  { name: 'container ID with a slash', env: { ...baseEnv(), CNI_CONTAINERID: '../../etc/passwd' }, stdin: (dd) => good(dd), code: 4, msg: 'invalid characters in containerID' },
  { name: 'container ID with CRLF (would forge a file)', env: { ...baseEnv(), CNI_CONTAINERID: 'c1\r\neth9' }, stdin: (dd) => good(dd), code: 4, msg: 'invalid characters in containerID' },
  { name: 'ifname too long', env: { ...baseEnv(), CNI_IFNAME: 'x'.repeat(16) }, stdin: (dd) => good(dd), code: 4 },
  { name: 'ifname ..', env: { ...baseEnv(), CNI_IFNAME: '..' }, stdin: (dd) => good(dd), code: 4 },
  { name: 'ifname with whitespace', env: { ...baseEnv(), CNI_IFNAME: 'eth 0' }, stdin: (dd) => good(dd), code: 4 },
  { name: 'missing CNI_CONTAINERID', env: { CNI_COMMAND: 'ADD', CNI_IFNAME: 'eth0', CNI_NETNS: '/x', CNI_PATH: '/p' }, stdin: (dd) => good(dd), code: 4, msg: 'required env variables [CNI_CONTAINERID] missing' },
  { name: 'CNI_ARGS without =', env: { ...baseEnv(), CNI_ARGS: 'IP' }, stdin: (dd) => good(dd), code: 4 },
  { name: 'CNI_ARGS unknown key', env: { ...baseEnv(), CNI_ARGS: 'FOO=bar' }, stdin: (dd) => good(dd), code: 4 },
  { name: 'CNI_ARGS IP garbage', env: { ...baseEnv(), CNI_ARGS: 'IP=10.1.0.999' }, stdin: (dd) => good(dd), code: 4 },
  { name: 'args.cni.ips not an array', stdin: (dd) => good(dd, {}, { args: { cni: { ips: '10.1.0.5' } } }), code: 7 },
  { name: 'runtimeConfig.ips with a bad IP', stdin: (dd) => good(dd, {}, { runtimeConfig: { ips: ['10.1.0.300'] } }), code: 7 },
  { name: 'GC with a non-array attachment list', env: { CNI_COMMAND: 'GC', CNI_PATH: '/p' }, stdin: (dd) => good(dd, {}, { cniVersion: '1.1.0', 'cni.dev/valid-attachments': 'all' }), code: 7 },
];

describe('bad input table', () => {
  for (const c of table) {
    it(`${c.name} → code ${c.code}`, async () => {
      const dd = root();
      const r = await invoke(c.env ?? baseEnv(), c.stdin(dd));
      assert.equal(r.code, 1, r.out);
      assert.equal(r.json?.['code'], c.code, r.out);
      if (c.msg !== undefined) assert.equal(r.json?.['msg'], c.msg);
      assert.equal(typeof r.json?.['msg'], 'string');
      assert.deepEqual(walk(dd), [], 'nothing written');
    });
  }
});

describe("every error carries the config's cniVersion (SPEC.md §Error)", () => {
  // host-local 1.1.1 prints these without any cniVersion; the codes and messages are its own
  // (CNI_ARGS: 4 here, 999 there — docs/compatibility.md).
  const noName = (dd: string, v: string) => JSON.stringify({ cniVersion: v, ipam: { type: 'ipwarden', dataDir: dd, ranges: [[{ subnet: '10.1.0.0/24' }]] } });
  const versioned: Array<{ name: string; env: Record<string, string>; stdin: (dd: string, v: string) => string; want: Record<string, unknown> }> = [
    {
      name: 'missing CNI_CONTAINERID',
      env: { CNI_COMMAND: 'ADD', CNI_IFNAME: 'eth0', CNI_NETNS: '/x', CNI_PATH: '/p' },
      stdin: (dd, v) => good(dd, {}, { cniVersion: v }),
      want: { code: 4, msg: 'required env variables [CNI_CONTAINERID] missing' },
    },
    { name: 'unknown CNI_COMMAND', env: baseEnv('FOO'), stdin: (dd, v) => good(dd, {}, { cniVersion: v }), want: { code: 4, msg: 'unknown CNI_COMMAND: FOO' } },
    { name: 'missing name', env: baseEnv(), stdin: noName, want: { code: 7, msg: 'missing network name' } },
    { name: 'name is a number', env: baseEnv(), stdin: (dd, v) => good(dd, {}, { cniVersion: v, name: 42 }), want: { code: 6, msg: 'error unmarshall network config: "name" must be a string' } },
    {
      name: 'bad CNI_CONTAINERID',
      env: { ...baseEnv(), CNI_CONTAINERID: '../../etc/passwd' },
      stdin: (dd, v) => good(dd, {}, { cniVersion: v }),
      want: { code: 4, msg: 'invalid characters in containerID', details: '../../etc/passwd' },
    },
    { name: 'bad CNI_ARGS', env: { ...baseEnv(), CNI_ARGS: 'FOO=bar' }, stdin: (dd, v) => good(dd, {}, { cniVersion: v }), want: { code: 4, msg: 'ARGS: unknown args ["FOO=bar"]' } },
  ];
  for (const v of ['1.0.0', '0.4.0']) {
    for (const c of versioned) {
      it(`cniVersion ${v}: ${c.name}`, async () => {
        const dd = root();
        const r = await invoke(c.env, c.stdin(dd, v));
        assert.deepEqual([r.code, r.json], [1, { cniVersion: v, ...c.want }], r.out);
        assert.deepEqual(walk(dd), [], 'nothing written');
      });
    }
  }

  const missingId = { CNI_COMMAND: 'ADD', CNI_IFNAME: 'eth0', CNI_NETNS: '/x', CNI_PATH: '/p' };
  const fallbacks: Array<{ name: string; env: Record<string, string>; stdin: (dd: string) => string; want: Record<string, unknown> }> = [
    {
      name: 'no cniVersion: 0.1.0, as the config is read',
      env: missingId,
      stdin: (dd) => JSON.stringify({ name: 'net', ipam: { type: 'ipwarden', dataDir: dd } }),
      want: { cniVersion: '0.1.0', code: 4, msg: 'required env variables [CNI_CONTAINERID] missing' },
    },
    { name: 'stdin not JSON: the default', env: missingId, stdin: () => '{"cniVersion":"1.0.0",', want: { cniVersion: '1.1.0', code: 4, msg: 'required env variables [CNI_CONTAINERID] missing' } },
    {
      name: 'cniVersion not a string: the default',
      env: baseEnv(),
      stdin: (dd) => good(dd, {}, { cniVersion: 1 }),
      want: { cniVersion: '1.1.0', code: 6, msg: 'error unmarshall network config: "cniVersion" must be a string' },
    },
    {
      name: 'unsupported cniVersion: the default, code 1',
      env: baseEnv(),
      stdin: (dd) => good(dd, {}, { cniVersion: '9.9.9' }),
      want: { cniVersion: '1.1.0', code: 1, msg: 'incompatible CNI versions', details: 'config is "9.9.9", plugin supports ["0.1.0" "0.2.0" "0.3.0" "0.3.1" "0.4.0" "1.0.0" "1.1.0"]' },
    },
    {
      name: 'unsupported cniVersion with a missing env var: the default, the env error first',
      env: missingId,
      stdin: (dd) => good(dd, {}, { cniVersion: '9.9.9' }),
      want: { cniVersion: '1.1.0', code: 4, msg: 'required env variables [CNI_CONTAINERID] missing' },
    },
  ];
  for (const c of fallbacks) {
    it(c.name, async () => {
      const dd = root();
      const r = await invoke(c.env, c.stdin(dd));
      assert.deepEqual([r.code, r.json], [1, c.want], r.out);
    });
  }

  it('an unreadable stdin: the env error first, then code 5, both with the default', async () => {
    const run = async (env: Record<string, string>) => {
      let out = '';
      const code = await pluginMain(makeHandlers(fileDeps), {
        env,
        readStdin: async () => {
          throw new Error('EIO: i/o error, read');
        },
        stdout: (t) => (out += t),
        stderr: () => {},
      });
      return [code, JSON.parse(out) as unknown];
    };
    assert.deepEqual(await run(missingId), [1, { cniVersion: '1.1.0', code: 4, msg: 'required env variables [CNI_CONTAINERID] missing' }]);
    assert.deepEqual(await run(baseEnv()), [1, { cniVersion: '1.1.0', code: 5, msg: 'error reading from stdin: EIO: i/o error, read' }]);
  });
});

describe('pre-existing garbage in the network directory', () => {
  it('empty and unparseable IP-named files block their addresses on an ordinary ADD, as in host-local (reconciler.md E12); foreign files are left alone', async () => {
    const dd = root();
    const dir = join(dd, 'net');
    mkdirSync(join(dir, 'subdir'), { recursive: true });
    writeFileSync(join(dir, '10.1.0.2'), '');
    writeFileSync(join(dir, '10.1.0.3'), '\u0000\u0000garbage\r\n\r\n');
    writeFileSync(join(dir, 'README'), 'operator notes');
    writeFileSync(join(dir, 'last_reserved_ip.0'), '\u0000bogus');
    const r = await invoke(baseEnv(), good(dd));
    assert.equal(r.code, 0, r.out);
    assert.deepEqual(r.json?.['ips'], [{ address: '10.1.0.4/24', gateway: '10.1.0.1' }]);
    assert.equal(readFileSync(join(dir, '10.1.0.2'), 'utf8'), '');
    assert.equal(readFileSync(join(dir, '10.1.0.3'), 'utf8'), '\u0000\u0000garbage\r\n\r\n');
    assert.equal(readFileSync(join(dir, '10.1.0.4'), 'utf8'), 'c1\r\neth0');
    assert.equal(readFileSync(join(dir, 'README'), 'utf8'), 'operator notes');
    assert.equal(statSync(join(dir, 'subdir')).isDirectory(), true);
  });
});


describe('seeded fuzz', () => {
  it('300 mutated invocations: always one well-formed reply, never a write outside DIR', async () => {
    const rand = rng(20261129);
    const pick = <T>(xs: readonly T[]): T => xs[Math.floor(rand() * xs.length)] as T;
    const weird: unknown[] = [null, true, 0, -1, 1e309, '', ' ', '..', '10.1.0.0/24', 'fd00::/64', '10.1.0.1', 'x'.repeat(300), [], {}, [[]], [[{}]], '\u0000', '../../x', '1.2.3.4/33', '255.255.255.255/0'];
    const keys = ['subnet', 'rangeStart', 'rangeEnd', 'gateway'];
    for (let i = 0; i < 300; i++) {
      const dd = root();
      const ipam: Record<string, unknown> = { type: 'ipwarden', dataDir: dd, ranges: [[{ subnet: '10.1.0.0/24' }]] };
      const top: Record<string, unknown> = { cniVersion: pick(['0.1.0', '0.3.1', '0.4.0', '1.0.0', '1.1.0']), name: 'net' };
      const m = Math.floor(rand() * 8);
      if (m === 0) ipam['ranges'] = [[{ [pick(keys)]: pick(weird), subnet: pick(['10.1.0.0/24', 'fd00::/120', pick(weird)]) }]];
      if (m === 1) ipam[pick(['routes', 'dataDir', 'resolvConf', 'lockTimeout', 'subnet', 'leakGracePeriod', 'reclaimOnExhaustion'])] = pick(weird);
      if (m === 2) top['name'] = pick(weird);
      if (m === 3) top[pick(['args', 'runtimeConfig', 'prevResult'])] = pick([{ cni: { ips: [pick(weird)] } }, { ips: pick(weird) }, { ipRanges: pick(weird) }, pick(weird)]);
      if (m === 4) top['cniVersion'] = pick(weird);
      const env = baseEnv(pick(['ADD', 'DEL', 'CHECK', 'GC', 'STATUS', 'VERSION', 'NOPE']));
      if (m === 5) env[pick(['CNI_CONTAINERID', 'CNI_IFNAME', 'CNI_ARGS', 'CNI_NETNS'])] = String(pick(weird));
      if (m === 6) env['CNI_ARGS'] = pick(['IP=', 'IP=1.2.3.4;IP=1.2.3.5', 'IgnoreUnknown=maybe;X=1', '=', ';;', 'IgnoreUnknown=1;IP=10.1.0.7/99']);
      let stdin = JSON.stringify({ ...top, ipam });
      if (m === 7) stdin = stdin.slice(0, Math.floor(rand() * stdin.length));
      if (env['CNI_COMMAND'] === 'GC') stdin = stdin.replace(/^\{/, '{"cni.dev/valid-attachments":[],');
      const r = await invoke(env, stdin);
      const label = `case ${i}: ${JSON.stringify(env)} ${stdin.slice(0, 200)}`;
      assert.equal(r.err.includes('internal error'), false, `${label}\n${r.err}`);
      if (r.code === 1) {
        assert.ok(r.json !== null && SPEC_CODES.has(Number(r.json['code'])), `${label}\n${r.out}`);
        assert.equal(typeof r.json['msg'], 'string');
      } else {
        assert.equal(r.code, 0);
      }
      const net = typeof top['name'] === 'string' && top['name'] !== '' ? top['name'] : 'net';
      // The one file outside DIR by design: the audit log in the data dir root (a recovery may
      // recreate the reservation of an address configured on this host, e.g. its own fd00::2).
      for (const p of walk(dd)) assert.ok(p === net || p.startsWith(`${net}/`) || p === '.ipwarden-audit.log', `${label}: wrote ${p}`);
    }
  });
});
