// The ADD/DEL storm that test/interop/power-cut.test.ts runs inside its KVM guest (plain ESM: the
// guest runs the host's /usr/bin/node from the read-only 9p root, no tsx). Never run on the host.
//
// Usage (in the guest, after the init script mounted everything):
//   node power-cut-guest.mjs <config.json> <bin dir of install-cni> <bundle dist/ipwarden.cjs> <record device> <daemon socket>
//
// It starts `ipwarden daemon` on the data directory named in the config (the daemon's socket is the
// one install-cni wrote into the shim, passed here), then runs, until the power is cut:
// - SHIM_WORKERS loops through the shim (answered by the daemon), and
// - one loop through the standalone plugin (`ipwarden-standalone`, no daemon),
// each: ADD a new container; keep at most KEEP of its own containers; DEL the oldest beyond that.
//
// Every answer is recorded on the record device (a second virtio disk the host reads after the
// cut), one fixed-size line per record, written with O_DSYNC so that a record the host can read
// was written before the next step began:
//   `A <containerId> <ip> <fallbacks>`  after a successful ADD's answer was returned to this
//                           process; <fallbacks> = requests the shim had sent to the standalone
//                           plugin so far (lines of standalone-requests.log beside the socket:
//                           0 means every shim request so far was answered by the daemon);
//   `D <containerId>`       before its DEL starts (from then on its address may be free);
//   `E <containerId> <exit status>` after a failed ADD (nothing promised).
// The first record is `R <pid of the daemon>` once the daemon answers on its socket.
import { spawn } from 'node:child_process';
import { closeSync, constants as fsConstants, existsSync, openSync, readFileSync, writeSync } from 'node:fs';
import { connect } from 'node:net';
import { dirname, join } from 'node:path';

const [confPath, binDir, bundle, recordDev, socket] = process.argv.slice(2);
const SHIM_WORKERS = 4;
const KEEP = 3;
const RECORD_BYTES = 128;

const conf = JSON.parse(readFileSync(confPath, 'utf8'));
const dataDir = conf.ipam.dataDir;
const shim = join(binDir, 'ipwarden');
const standalone = join(binDir, 'ipwarden-standalone');

const rec = openSync(recordDev, fsConstants.O_WRONLY | fsConstants.O_DSYNC);
let recOffset = 0;
/** Write one record at the next slot; returns when the device has it (O_DSYNC). */
function record(text) {
  const b = Buffer.alloc(RECORD_BYTES, 0);
  b.write(`${text}\n`, 0, 'latin1');
  writeSync(rec, b, 0, RECORD_BYTES, recOffset);
  recOffset += RECORD_BYTES;
}

/** Lines the shim's fallback has written to standalone-requests.log beside the socket (docs/daemon.md). */
function fallbacks() {
  try {
    return readFileSync(join(dirname(socket), 'standalone-requests.log'), 'latin1').split('\n').length - 1;
  } catch {
    return 0;
  }
}

function waitForSocket(path) {
  return new Promise((resolve) => {
    const attempt = () => {
      if (!existsSync(path)) return void setTimeout(attempt, 20);
      const s = connect(path);
      s.on('connect', () => {
        s.destroy();
        resolve();
      });
      s.on('error', () => {
        s.destroy();
        setTimeout(attempt, 20);
      });
    };
    attempt();
  });
}

function run(bin, command, containerId) {
  return new Promise((resolve) => {
    const env = { PATH: '/usr/sbin:/usr/bin:/sbin:/bin', CNI_COMMAND: command, CNI_CONTAINERID: containerId, CNI_NETNS: command === 'ADD' ? '/var/run/netns/pcut' : '', CNI_IFNAME: 'eth0', CNI_PATH: binDir };
    const child = spawn(bin, [], { env, stdio: ['pipe', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    child.stdout.on('data', (c) => (out += c.toString('utf8')));
    child.stderr.on('data', (c) => (err += c.toString('utf8')));
    child.on('close', (code) => resolve({ code: code ?? 1, out, err }));
    child.stdin.end(readFileSync(confPath));
  });
}

async function worker(name, bin) {
  const mine = [];
  for (let n = 0; ; n++) {
    const id = `${name}-${n}`;
    const r = await run(bin, 'ADD', id);
    if (r.code === 0) {
      const ip = JSON.parse(r.out).ips[0].address.split('/')[0];
      record(`A ${id} ${ip} ${fallbacks()}`);
      mine.push(id);
    } else {
      // On the console (the test shows its end when it fails).
      process.stderr.write(`PCUT: ADD ${id} failed (exit ${r.code}): ${r.out} ${r.err}\n`);
      record(`E ${id} ${r.code}`);
    }
    while (mine.length > KEEP) {
      const old = mine.shift();
      record(`D ${old}`);
      await run(bin, 'DEL', old);
    }
  }
}

const daemon = spawn(process.execPath, [bundle, 'daemon', '--socket', socket, '--data-dir', dataDir, '--cni-conf-dir', '/run/pcut-netd', '--pool-journal-dir', '/run/pcut-journal', '--interval', '1h', '--metrics-address', '127.0.0.1:0', '--log-level', 'warn', '--warm-up', '0'], { env: { PATH: '/usr/sbin:/usr/bin:/sbin:/bin' }, stdio: ['ignore', 'inherit', 'inherit'] });
await waitForSocket(socket);
record(`R ${daemon.pid}`);
const loops = [];
for (let w = 0; w < SHIM_WORKERS; w++) loops.push(worker(`shim${w}`, shim));
loops.push(worker('alone', standalone));
await Promise.all(loops);
closeSync(rec);
