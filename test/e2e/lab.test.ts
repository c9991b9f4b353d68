// The lab's leak injectors and chained test plugin behave as containerd-lab.md describes.
// Needs root and Debian's containerd, runc, containernetworking-plugins (CI=true: fail, else skip).
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { AppError } from '../../src/common/errors.ts';
import { labUnavailableReason, startLab, type Lab } from '../../src/lab/lab.ts';
import { isAlive } from '../../src/lab/proc.ts';

const unavailable = labUnavailableReason();
const ciMustRun = process.env['CI'] === 'true';

/** Polls `check` (no fixed sleep) until it returns a value, for at most 30 s. */
async function eventually<T>(what: string, check: () => T | undefined): Promise<T> {
  const until = Date.now() + 30_000;
  for (;;) {
    const v = check();
    if (v !== undefined) return v;
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setImmediate(r));
  }
}

describe('lab: chained plugin modes and the b2 wipe', { skip: ciMustRun ? false : (unavailable ?? false) }, () => {
  let lab: Lab | undefined;

  before(async () => {
    if (unavailable !== undefined) throw new Error(`CI=true but the e2e prerequisites are missing: ${unavailable}`);
    lab = await startLab({ chained: 'pass' });
  });
  after(async () => {
    await lab?.stop();
  });

  it('stall: during ADD the reservation file exists but ListPodSandbox does not list the sandbox', async () => {
    const l = lab!;
    l.setChainedMode('stall', 2);
    const before = l.chainLog().length;
    const running = l.runSandbox('slow');
    const addLine = await eventually('the stalled ADD', () => l.chainLog().slice(before).find((x) => x.split(' ')[2] === 'ADD'));
    const id = addLine.split(' ')[3]!;
    assert.match(id, /^[0-9a-f]{64}$/);
    assert.equal(l.reservations().filter((r) => r.id === id).length, 1);
    assert.deepEqual((await l.listSandboxes()).map((s) => s.id), []);
    assert.equal(await running, id);
    l.setChainedMode('pass');
    assert.deepEqual((await l.listSandboxes()).map((s) => [s.id, s.state]), [[id, 'ready']]);
  });

  it('fail: ADD and DEL fail, the sandbox stays NOTREADY and keeps its reservation', async () => {
    const l = lab!;
    l.setChainedMode('fail');
    await assert.rejects(l.runSandbox('broken'), (e: unknown) => {
      assert.ok(e instanceof AppError);
      assert.equal(e.code, 'RUNTIME_CALL_FAILED');
      assert.match(e.message, /plugin type="ipwarden-lab-chain" failed \(add\): ipwarden-lab-chain: forced failure in ADD/);
      return true;
    });
    const broken = (await l.listSandboxes()).find((s) => s.name === 'broken');
    assert.equal(broken?.state, 'notready');
    assert.equal(l.reservations().filter((r) => r.id === broken.id).length, 1);
    await assert.rejects(l.cri.stopPodSandbox(broken.id), { code: 'RUNTIME_CALL_FAILED' });
    assert.equal(l.reservations().filter((r) => r.id === broken.id).length, 1);
    l.setChainedMode('pass');
  });

  it('wipeRuntimeState (b2): no sandbox is listed any more, every reservation is orphaned, new sandboxes work', async () => {
    const l = lab!;
    await l.runSandbox();
    const held = l.reservations();
    assert.equal(held.length, 3);
    const oldPid = l.containerdPid;
    await l.wipeRuntimeState();
    assert.equal(isAlive(oldPid), false);
    assert.notEqual(l.containerdPid, oldPid);
    assert.deepEqual(await l.listSandboxes(), []);
    assert.deepEqual(l.reservations(), held);
    const id = await l.runSandbox('after-wipe');
    const mine = l.reservations().filter((r) => r.id === id);
    assert.equal(mine.length, 1);
    assert.ok(!held.some((r) => r.ip === mine[0]!.ip));
  });

  it('stop() leaves nothing behind', async () => {
    const l = lab!;
    await l.stop();
    assert.equal(isAlive(l.containerdPid), false);
    assert.equal(existsSync(l.scratch), false);
    assert.equal(existsSync(`/sys/class/net/${l.bridge}`), false);
  });
});
