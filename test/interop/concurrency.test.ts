/**
 * Interop under concurrency: 8 workers, half running ipwarden and half upstream host-local, do
 * hundreds of ADDs and DELs on one small range in one data directory. Both binaries take the same
 * flock on DIR/lock, so:
 *  - no address ever has two owners (every successful ADD's address is free in our ledger);
 *  - no reservation file is ever empty or malformed — judged under the same flock the writers
 *    hold (test/helpers/reservation-check.ts): upstream host-local creates a file and then writes
 *    it, both under the lock, so an unlocked reader can see it empty in between (its known window);
 *  - every successful ADD's reservation exists until its DEL (checked at each DEL, before it runs:
 *    that file was complete when its ADD returned, and only its DEL may remove it).
 */
import assert from 'node:assert/strict';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { haveHostLocal, HOST_LOCAL, installedPlugin, requireOrSkip, runCniAsync, tempDir } from '../helpers/cni.ts';
import { checkReservationFiles } from '../helpers/reservation-check.ts';
import { rng } from '../helpers/rng.ts';

const WORKERS = 8;
const OPS_PER_WORKER = 40; // 8 × 40 = 320 operations, about half ADD and half DEL
const NET = 'conc';


describe('interop: ipwarden and upstream host-local on one directory, concurrently', () => {
  const skip = requireOrSkip(haveHostLocal(), `upstream host-local at ${HOST_LOCAL}`);
  let ours = '';
  const t = tempDir('ipw-conc-');
  before(() => {
    if (!skip) ours = installedPlugin();
  });
  after(() => t.cleanup());

  it(`${WORKERS} workers × ${OPS_PER_WORKER} ADD/DEL on a /28 keep one owner per address`, { skip }, async () => {
    const dir = join(t.dir, NET);
    const conf = (type: string) => ({ cniVersion: '1.0.0', name: NET, ipam: { type, dataDir: t.dir, ranges: [[{ subnet: '10.77.0.0/28' }]] } });
    const ledger = new Map<string, string>(); // ip → container that holds it per successful ADDs
    const violations: string[] = [];
    let adds = 0;
    let dels = 0;
    let exhausted = 0;

    const checkFiles = async () => violations.push(...(await checkReservationFiles(dir, /^w\d+-\d+\r\neth0$/)));

    const worker = async (w: number) => {
      const bin = w % 2 === 0 ? ours : HOST_LOCAL;
      const type = w % 2 === 0 ? 'ipwarden' : 'host-local';
      const rand = rng(1000 + w);
      const held: Array<{ id: string; ip: string }> = [];
      for (let i = 0; i < OPS_PER_WORKER; i++) {
        if (held.length > 0 && (rand() < 0.45 || held.length >= 3)) {
          const k = Math.floor(rand() * held.length);
          const h = held.splice(k, 1)[0]!;
          if (!existsSync(join(dir, h.ip)) || readFileSync(join(dir, h.ip), 'utf8') !== `${h.id}\r\neth0`) {
            violations.push(`${h.ip} of ${h.id} vanished or changed owner before its DEL`);
          }
          ledger.delete(h.ip);
          const r = await runCniAsync(bin, { command: 'DEL', containerId: h.id, ifname: 'eth0', stdin: conf(type) });
          if (r.exitCode !== 0) violations.push(`DEL ${h.id} failed: ${r.stdout}`);
          dels++;
        } else {
          const id = `w${w}-${i}`;
          const r = await runCniAsync(bin, { command: 'ADD', containerId: id, ifname: 'eth0', stdin: conf(type) });
          if (r.exitCode === 0) {
            const ip = ((r.json?.['ips'] as Array<{ address: string }>)[0]?.address ?? '').split('/')[0] ?? '';
            const prev = ledger.get(ip);
            if (prev !== undefined) violations.push(`${ip} handed to ${id} while ${prev} holds it`);
            ledger.set(ip, id);
            held.push({ id, ip });
            adds++;
          } else if (String(r.json?.['msg']).includes('no IP addresses available')) {
            exhausted++;
          } else {
            violations.push(`ADD ${id} via ${type} failed: ${r.stdout}`);
          }
        }
        if (i % 10 === 0) await checkFiles();
      }
      for (const h of held) {
        ledger.delete(h.ip);
        await runCniAsync(bin, { command: 'DEL', containerId: h.id, ifname: 'eth0', stdin: conf(type) });
        dels++;
      }
    };

    await Promise.all(Array.from({ length: WORKERS }, (_, w) => worker(w)));
    await checkFiles(); // quiescent
    assert.deepEqual(violations, []);
    // Every step of every worker ran (an ADD that met a full range is a step too: how many do
    // depends on the interleaving, which the daemon's speed changes), and real work was done.
    assert.ok(adds + exhausted + dels >= WORKERS * OPS_PER_WORKER, `ran ${adds} ADDs, ${exhausted} exhausted ADDs and ${dels} DELs`);
    assert.ok(adds >= WORKERS * 8, `${adds} successful ADDs (${exhausted} hit exhaustion)`);
    const left = readdirSync(dir).filter((n) => /^\d/.test(n));
    assert.deepEqual(left, [], 'every reservation was released by its DEL');
  });
});
