import { mkdtempSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { startTestDaemon } from '../test/helpers/daemon.ts';
const st = (pid: number) => { const t = readFileSync(`/proc/${pid}/status`, 'utf8'); const g = (k: string) => Number(new RegExp(`${k}:\\s+(\\d+)`).exec(t)![1]) / 1024; return `RSS ${g('VmRSS').toFixed(1)} MB peak ${g('VmHWM').toFixed(1)} MB`; };
for (const w of ['2000', '0']) {
  const root = mkdtempSync('/tmp/ipw-mem-');
  const d = await startTestDaemon({ socket: join(root, 'run', 'plugin.sock'), logLevel: 'info', args: ['--interval', '1m', '--warm-up', w] });
  if (w !== '0') await d.waitForLog((l) => l.msg === 'warm-up done'); else await d.waitForLog((l) => l.msg === 'reconcile pass').catch(() => null);
  console.log(`warm-up ${w}: at start/done ${st(d.pid)}`);
  await new Promise((r) => setTimeout(r, 60000));
  console.log(`warm-up ${w}: after 60 s idle ${st(d.pid)}`);
  await d.stop();
}
