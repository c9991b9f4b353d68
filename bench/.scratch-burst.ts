import { execFileSync, spawnSync } from 'node:child_process';
import { chmodSync, mkdirSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { ROOT } from '../test/helpers/cni.ts';
import { startTestDaemon } from '../test/helpers/daemon.ts';
const root = mkdtempSync('/tmp/ipw-pburst-');
const bundle = process.env.BUNDLE ?? join(ROOT, 'dist/ipwarden.cjs');
const binDir = join(root, 'bin'); const sockDir = join(root, 'run');
mkdirSync(binDir); mkdirSync(sockDir, { mode: 0o700 }); chmodSync(sockDir, 0o700);
const socket = join(sockDir, 'plugin.sock');
execFileSync('/usr/bin/node', [bundle, 'install-cni', '--dest', binDir, '--socket', socket], { env: { PATH: '/usr/bin:/bin' }, stdio: 'pipe' });
const env: Record<string,string> = process.env.KW ? { IPWARDEN_KEEP_WARM_MS: process.env.KW, IPWARDEN_KEEP_WARM_PAIRS: process.env.KWP ?? '100' } : {};
const flags = process.env.V8F ? process.env.V8F.split(' ') : [];
const daemon = await startTestDaemon({ bundle, socket, logLevel: 'info', args: ['--interval', process.env.INTERVAL ?? '1h', '--warm-up', process.env.DWARM ?? '0'], env, wrap: flags.length ? ['/bin/sh', '-c', 'n=$1; shift; exec "$n" ' + flags.join(' ') + ' "$@"', 'sh'] : undefined });
const nets = Number(process.env.NETS ?? 1);
const confs: string[] = [];
for (let k = 0; k < nets; k++) { const c = join(root, `conf${k}.json`); writeFileSync(c, JSON.stringify({ cniVersion: '1.0.0', name: `pb${k}`, ipam: { type: 'ipwarden', dataDir: join(root, 'data'), ranges: [[{ subnet: `10.88.${k}.0/24` }]] } })); confs.push(c); }
const xb = join(root, 'xburst');
execFileSync('gcc', ['-O2', '-o', xb, join(ROOT, 'test/helpers/xburst.c')]);
const burst = (cmd: string, r: number) => {
  const args: string[] = ['-'];
  for (let i = 0; i < 100; i++) args.push(join(binDir, 'ipwarden'), confs[i % nets]!, '6', 'PATH=/usr/bin:/bin', `CNI_COMMAND=${cmd}`, `CNI_CONTAINERID=r${r}c${i}`, 'CNI_IFNAME=eth0', `CNI_NETNS=${cmd === 'ADD' ? '/var/run/netns/x' : ''}`, 'CNI_PATH=/usr/lib/cni');
  const t = process.hrtime.bigint();
  const out = spawnSync(xb, args, { encoding: 'utf8' });
  const ms = Number(process.hrtime.bigint() - t) / 1e6;
  if (out.stdout.split('\n').some((l) => /^\d+ \d+ \d+ [1-9]/.test(l))) throw new Error('failed ' + cmd);
  return ms;
};
const cpu = () => { const s = readFileSync(`/proc/${daemon.pid}/stat`, 'utf8').split(') ')[1].split(' '); return (Number(s[11]) + Number(s[12])) * 10; };
const rounds = Number(process.env.ROUNDS ?? 20);
import { connect } from 'node:net';
import { encodeRequest } from '../src/daemon/protocol.ts';
const wconf = join(root, 'wconf.json');
const wstdin = JSON.stringify({ cniVersion: '1.0.0', name: 'warm', ipam: { type: 'ipwarden', dataDir: process.env.WDIR ?? join(root, 'wdata'), ranges: [[{ subnet: '198.18.0.0/24' }]] } });
const one = (cmd: string, id: string) => new Promise<void>((res, rej) => {
  const s = connect(socket); const bufs: Buffer[] = [];
  s.on('connect', () => s.end(encodeRequest({ pid: process.pid, env: { PATH: '/usr/bin:/bin', CNI_COMMAND: cmd, CNI_CONTAINERID: id, CNI_IFNAME: 'eth0', CNI_NETNS: cmd === 'ADD' ? '/var/run/netns/x' : '', CNI_PATH: '/usr/lib/cni' }, stdin: wstdin })));
  s.on('data', (b) => bufs.push(b)); s.on('error', rej); s.on('close', () => res());
});
if (process.env.DWARM) { const t = Date.now(); const l = await daemon.waitForLog((l: any) => /warm-up/.test(l.msg)); console.log('daemon warm-up', JSON.stringify(l), Date.now() - t, 'ms'); console.log(execFileSync('ls', ['-la', sockDir], { encoding: 'utf8' })); }
const W = Number(process.env.WARM ?? 0), C = Number(process.env.WC ?? 4);
const tw = Date.now(); const c0w = cpu();
await Promise.all(Array.from({ length: C }, async (_, w) => { for (let i = w; i < W; i += C) { await one('ADD', 'warm' + i); await one('DEL', 'warm' + i); } }));
console.log(`warm-up ${W} pairs in ${Date.now() - tw} ms, daemon cpu ${cpu() - c0w} ms`);
if (process.env.IDLE) await new Promise((r) => setTimeout(r, Number(process.env.IDLE)));
writeFileSync('/tmp/prof/tmark', String(Date.now()));
for (let r = 0; r < rounds; r++) {
  const c0 = cpu(); const a = burst('ADD', r); const d = burst('DEL', r); const c1 = cpu();
  console.log(`round ${r} pods/s ${(100 / (a + d) * 1000).toFixed(0)} ADD ${a.toFixed(0)}ms DEL ${d.toFixed(0)}ms daemon cpu/pod ${((c1 - c0) / 100).toFixed(2)}ms t=${Date.now()}`);
}
await daemon.stop();
