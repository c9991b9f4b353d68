/**
 * The interop suites' file check (test/helpers/reservation-check.ts) judges files only under the
 * writers' flock: upstream host-local's window between creating a reservation and writing it is
 * not a malformed file (issue 8.8: concurrency.test.ts failed on a loaded machine with
 * `malformed file 10.77.0.6: ""`). The window is reproduced exactly by a fixture that stops in it.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { checkReservationFiles } from '../helpers/reservation-check.ts';
import { ROOT, tempDir } from '../helpers/cni.ts';

const t = tempDir('i8-check-');
after(() => t.cleanup());

describe('checkReservationFiles', () => {
  it('a reservation caught between creation and write under the lock is judged once it is written', async () => {
    const dir = join(t.dir, 'i8win');
    mkdirSync(dir);
    writeFileSync(join(dir, '10.77.0.5'), 'w1-3\r\neth0');
    const writer = spawn(process.execPath, [join(ROOT, 'test/fixtures/half-reserve.cjs'), dir, '10.77.0.6', 'w2-7\r\neth0'], {
      stdio: ['pipe', 'pipe', 'inherit'],
    });
    const exited = new Promise((res) => writer.once('exit', res));
    try {
      await new Promise<void>((res) => writer.stdout.once('data', () => res()));
      // The file exists and is empty now: exactly what an unlocked reader saw.
      assert.equal(readFileSync(join(dir, '10.77.0.6'), 'utf8'), '');
      const check = checkReservationFiles(dir, /^w\d+-\d+\r\neth0$/);
      writer.stdin.write('go\n');
      assert.deepEqual(await check, []);
    } finally {
      writer.stdin.end();
      await exited;
    }
  });

  it('still reports a file that is malformed under the lock', async () => {
    const dir = join(t.dir, 'i8bad');
    mkdirSync(dir);
    writeFileSync(join(dir, '10.77.0.7'), '');
    writeFileSync(join(dir, '10.77.0.8'), 'w1-1\r\neth0');
    writeFileSync(join(dir, 'last_reserved_ip.0'), '10.77.0.8');
    assert.deepEqual(await checkReservationFiles(dir, /^w\d+-\d+\r\neth0$/), ['malformed file 10.77.0.7: ""']);
  });
});
