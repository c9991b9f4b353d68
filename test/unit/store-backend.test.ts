/**
 * The StoreBackend seam (src/store/store.ts): the file backend (a data dir) passes the one Store
 * contract suite through `open`, and lists and opens networks by the same rules as the etcd
 * backend (test/unit/etcd-store.test.ts): only valid network names, nothing created without
 * `create`, ClosedError after close.
 */
import { after, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { isAppError } from '../../src/common/errors.ts';
import { FileBackend } from '../../src/store/file/file-backend.ts';
import type { Store } from '../../src/store/store.ts';
import { runStoreContract } from './store-contract.ts';

const roots: string[] = [];
after(() => {
  for (const d of roots) rmSync(d, { recursive: true, force: true });
});
function dataDir(): string {
  const d = mkdtempSync(join(tmpdir(), 'ipwarden-pool-backend-'));
  roots.push(d);
  return d;
}

runStoreContract('FileStore via FileBackend', async () => {
  const dd = dataDir();
  const store = (await new FileBackend(dd).open('net1', { create: true })) as Store;
  return {
    store,
    plant: async (ip, owner) => writeFileSync(join(dd, 'net1', ip), owner === null ? '' : owner.ifname === null ? owner.containerId : `${owner.containerId}\r\n${owner.ifname}`, { mode: 0o600 }),
  };
});

describe('FileBackend', () => {
  it('lists the network directories with valid names, sorted; opens only those without create', async () => {
    const dd = dataDir();
    const b = new FileBackend(dd);
    assert.deepEqual(await b.listNetworks(), []);
    assert.equal(await b.open('net2', { create: false }), null);
    assert.equal(existsSync(join(dd, 'net2')), false, 'nothing created');
    await (await b.open('net2', { create: true }))?.close();
    mkdirSync(join(dd, 'net1'));
    mkdirSync(join(dd, '.hidden'));
    writeFileSync(join(dd, 'ipwarden-audit.log'), '');
    assert.deepEqual(await b.listNetworks(), ['net1', 'net2']);
    await assert.rejects(b.open('../x', { create: true }), (e: unknown) => isAppError(e, 'IPAM_INVALID_CONFIG'));
    await b.close();
    await assert.rejects(b.listNetworks(), (e: unknown) => isAppError(e, 'CLOSED'));
  });

  it('a missing data dir has no networks', async () => {
    assert.deepEqual(await new FileBackend(join(dataDir(), 'absent')).listNetworks(), []);
  });
});
