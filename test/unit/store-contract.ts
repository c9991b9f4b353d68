/**
 * The contract every `Store` backend passes (src/store/store.ts). Backends run it from their own
 * test file: `runStoreContract('FileStore', makeFixture)`.
 *
 * The suite only uses the `Store` interface, plus `plant` to put records there the way another
 * writer (older host-local, a crashed writer) would have left them.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { isAppError } from '../../src/common/errors.ts';
import type { Owner, Reservation, Store } from '../../src/store/store.ts';

/** A fresh, empty store of one network plus a way to plant foreign records in it. */
export interface StoreFixture {
  readonly store: Store;
  /**
   * Put a record for `ip` directly into the backend, bypassing `reserve`: `{containerId, ifname}`
   * as host-local writes it, `{containerId, ifname: null}` as a legacy ID-only record, `null` as a
   * corrupt (empty) record. Does not touch `last_reserved_ip`.
   */
  plant(ip: string, owner: Owner | null): Promise<void>;
}

/** Make a fresh fixture; the factory owns cleanup of whatever it creates (register it with `after`). */
export type MakeStoreFixture = () => Promise<StoreFixture>;

const C1E0 = { containerId: 'c1', ifname: 'eth0' } as const;
const C1E1 = { containerId: 'c1', ifname: 'eth1' } as const;
const C2E0 = { containerId: 'c2', ifname: 'eth0' } as const;

/** Reservations sorted by IP text, as plain objects without mtime. */
function owners(list: readonly Reservation[]): Array<{ ip: string; owner: Owner | null }> {
  return [...list]
    .sort((a, b) => (a.ip < b.ip ? -1 : a.ip > b.ip ? 1 : 0))
    .map((r) => ({ ip: r.ip, owner: r.owner === null ? null : { containerId: r.owner.containerId, ifname: r.owner.ifname } }));
}

/** Run `body` with a fresh, locked store; always closes it. */
async function withStore(make: MakeStoreFixture, body: (f: StoreFixture) => Promise<void>): Promise<void> {
  const f = await make();
  try {
    await f.store.lock(5);
    await body(f);
  } finally {
    await f.store.close();
  }
}

/** Register the contract suite for one backend. */
export function runStoreContract(name: string, make: MakeStoreFixture): void {
  describe(`Store contract: ${name}`, () => {
    describe('reserve and list', () => {
      it('lists nothing in a new store', () =>
        withStore(make, async ({ store }) => {
          assert.deepEqual(await store.list(), []);
        }));

      it('lists a reservation with its owner and a finite mtime', () =>
        withStore(make, async ({ store }) => {
          assert.equal(await store.reserve('10.0.0.2', C1E0, 0), true);
          const list = await store.list();
          assert.deepEqual(owners(list), [{ ip: '10.0.0.2', owner: C1E0 }]);
          assert.equal(Number.isFinite(list[0]?.mtimeMs), true);
        }));

      it('refuses an IP that is already reserved, by anyone, and keeps the first owner', () =>
        withStore(make, async ({ store }) => {
          assert.equal(await store.reserve('10.0.0.2', C1E0, 0), true);
          assert.equal(await store.reserve('10.0.0.2', C2E0, 0), false);
          assert.equal(await store.reserve('10.0.0.2', C1E0, 0), false);
          assert.deepEqual(owners(await store.list()), [{ ip: '10.0.0.2', owner: C1E0 }]);
        }));

      it('refuses an IP held by a legacy or a corrupt record', () =>
        withStore(make, async ({ store, plant }) => {
          await plant('10.0.0.2', { containerId: 'c3', ifname: null });
          await plant('10.0.0.3', null);
          assert.equal(await store.reserve('10.0.0.2', C1E0, 0), false);
          assert.equal(await store.reserve('10.0.0.3', C1E0, 0), false);
        }));

      it('stores IPv6 reservations under their canonical text', () =>
        withStore(make, async ({ store }) => {
          assert.equal(await store.reserve('fd00::2', C1E0, 1), true);
          assert.deepEqual(owners(await store.list()), [{ ip: 'fd00::2', owner: C1E0 }]);
          assert.equal(await store.lastReservedIP(1), 'fd00::2');
        }));

      it('trims surrounding whitespace of the container ID, as host-local does', () =>
        withStore(make, async ({ store }) => {
          assert.equal(await store.reserve('10.0.0.2', { containerId: ' c1\n', ifname: 'eth0' }, 0), true);
          assert.deepEqual(owners(await store.list()), [{ ip: '10.0.0.2', owner: C1E0 }]);
        }));

      it('lists legacy records with ifname null and corrupt records with owner null', () =>
        withStore(make, async ({ store, plant }) => {
          await plant('10.0.0.3', { containerId: 'c3', ifname: null });
          await plant('10.0.0.4', null);
          await store.reserve('10.0.0.2', C1E0, 0);
          assert.deepEqual(owners(await store.list()), [
            { ip: '10.0.0.2', owner: C1E0 },
            { ip: '10.0.0.3', owner: { containerId: 'c3', ifname: null } },
            { ip: '10.0.0.4', owner: null },
          ]);
        }));
    });

    describe('lastReservedIP', () => {
      it('is null before any reserve', () =>
        withStore(make, async ({ store }) => {
          assert.equal(await store.lastReservedIP(0), null);
        }));

      it('is rewritten on every successful reserve, per range set index', () =>
        withStore(make, async ({ store }) => {
          await store.reserve('10.0.0.5', C1E0, 0);
          assert.equal(await store.lastReservedIP(0), '10.0.0.5');
          await store.reserve('10.0.0.3', C2E0, 0);
          assert.equal(await store.lastReservedIP(0), '10.0.0.3');
          await store.reserve('10.1.0.9', C2E0, 1);
          assert.equal(await store.lastReservedIP(0), '10.0.0.3');
          assert.equal(await store.lastReservedIP(1), '10.1.0.9');
        }));

      it('is not changed by a refused reserve or by releases', () =>
        withStore(make, async ({ store }) => {
          await store.reserve('10.0.0.5', C1E0, 0);
          await store.reserve('10.0.0.6', C2E0, 0);
          assert.equal(await store.reserve('10.0.0.5', C2E0, 0), false);
          await store.releaseByOwner('c2', 'eth0');
          await store.release('10.0.0.5', C1E0);
          assert.equal(await store.lastReservedIP(0), '10.0.0.6');
        }));
    });

    describe('restore (reserve without touching last_reserved_ip)', () => {
      it('reserves a free IP, listed with its owner; lastReservedIP stays null', () =>
        withStore(make, async ({ store }) => {
          assert.equal(await store.restore('10.0.0.2', C1E0), true);
          assert.deepEqual(owners(await store.list()), [{ ip: '10.0.0.2', owner: C1E0 }]);
          assert.equal(await store.lastReservedIP(0), null);
        }));

      it('leaves the last reserved IP of every range set as it was', () =>
        withStore(make, async ({ store }) => {
          await store.reserve('10.0.0.5', C1E0, 0);
          await store.reserve('10.1.0.5', C1E0, 1);
          assert.equal(await store.restore('10.0.0.2', C2E0), true);
          assert.equal(await store.restore('10.1.0.2', C2E0), true);
          assert.equal(await store.lastReservedIP(0), '10.0.0.5');
          assert.equal(await store.lastReservedIP(1), '10.1.0.5');
        }));

      it('refuses an IP reserved by anyone (another owner, the same owner, legacy, corrupt) and keeps it', () =>
        withStore(make, async ({ store, plant }) => {
          await store.reserve('10.0.0.2', C2E0, 0);
          await plant('10.0.0.3', { containerId: 'c3', ifname: null });
          await plant('10.0.0.4', null);
          assert.equal(await store.restore('10.0.0.2', C1E0), false);
          assert.equal(await store.restore('10.0.0.2', C2E0), false);
          assert.equal(await store.restore('10.0.0.3', C1E0), false);
          assert.equal(await store.restore('10.0.0.4', C1E0), false);
          assert.deepEqual(owners(await store.list()), [
            { ip: '10.0.0.2', owner: C2E0 },
            { ip: '10.0.0.3', owner: { containerId: 'c3', ifname: null } },
            { ip: '10.0.0.4', owner: null },
          ]);
          assert.equal(await store.lastReservedIP(0), '10.0.0.2');
        }));

      it('a restored reservation is released by owner like any other', () =>
        withStore(make, async ({ store }) => {
          await store.restore('10.0.0.2', C1E0);
          assert.deepEqual(await store.releaseByOwner('c1', 'eth0'), ['10.0.0.2']);
          assert.deepEqual(await store.list(), []);
        }));
    });

    describe('rewrite (claim a record for an owner, fresh mtime)', () => {
      it('claims a legacy ID-only record for one ifname; other owners and absent IPs are refused', () =>
        withStore(make, async ({ store, plant }) => {
          await plant('10.0.0.3', { containerId: 'c3', ifname: null });
          await store.reserve('10.0.0.2', C2E0, 0);
          assert.equal(await store.rewrite('10.0.0.3', { containerId: 'c3', ifname: null }, { containerId: 'c3', ifname: 'eth0' }), true);
          assert.equal(await store.rewrite('10.0.0.2', C1E0, C1E0), false, 'owned by c2, not c1');
          assert.equal(await store.rewrite('10.0.0.9', C1E0, C1E0), false, 'absent');
          assert.deepEqual(owners(await store.list()), [
            { ip: '10.0.0.2', owner: C2E0 },
            { ip: '10.0.0.3', owner: { containerId: 'c3', ifname: 'eth0' } },
          ]);
          assert.deepEqual(await store.releaseByOwner('c3', 'eth1'), [], 'no longer a legacy record any ifname could release');
          assert.equal(await store.lastReservedIP(0), '10.0.0.2');
        }));
    });

    describe('release', () => {
      it('removes the reservation when the owner is unchanged', () =>
        withStore(make, async ({ store }) => {
          await store.reserve('10.0.0.2', C1E0, 0);
          assert.equal(await store.release('10.0.0.2', C1E0), true);
          assert.deepEqual(await store.list(), []);
          assert.equal(await store.reserve('10.0.0.2', C2E0, 0), true);
        }));

      const kept: Array<{ name: string; expected: Owner | null }> = [
        { name: 'another container', expected: C2E0 },
        { name: 'another interface', expected: C1E1 },
        { name: 'the legacy form of the owner', expected: { containerId: 'c1', ifname: null } },
        { name: 'null (only corrupt records)', expected: null },
      ];
      for (const c of kept) {
        it(`keeps the reservation when expected is ${c.name}`, () =>
          withStore(make, async ({ store }) => {
            await store.reserve('10.0.0.2', C1E0, 0);
            assert.equal(await store.release('10.0.0.2', c.expected), false);
            assert.deepEqual(owners(await store.list()), [{ ip: '10.0.0.2', owner: C1E0 }]);
          }));
      }

      it('returns false for an absent IP', () =>
        withStore(make, async ({ store }) => {
          assert.equal(await store.release('10.0.0.9', C1E0), false);
        }));

      it('removes a corrupt record only when expected is null', () =>
        withStore(make, async ({ store, plant }) => {
          await plant('10.0.0.4', null);
          assert.equal(await store.release('10.0.0.4', C1E0), false);
          assert.equal(await store.release('10.0.0.4', null), true);
          assert.deepEqual(await store.list(), []);
        }));

      it('removes a legacy record when expected is the same legacy owner', () =>
        withStore(make, async ({ store, plant }) => {
          await plant('10.0.0.3', { containerId: 'c3', ifname: null });
          assert.equal(await store.release('10.0.0.3', { containerId: 'c3', ifname: 'eth0' }), false);
          assert.equal(await store.release('10.0.0.3', { containerId: 'c3', ifname: null }), true);
          assert.deepEqual(await store.list(), []);
        }));
    });

    describe('releaseByOwner', () => {
      it('removes every reservation of exactly (id, ifname) and nothing else', () =>
        withStore(make, async ({ store, plant }) => {
          await store.reserve('10.0.0.2', C1E0, 0);
          await store.reserve('10.1.0.2', C1E0, 1);
          await store.reserve('10.0.0.3', C1E1, 0);
          await store.reserve('10.0.0.4', C2E0, 0);
          await plant('10.0.0.5', { containerId: 'c1', ifname: null });
          await plant('10.0.0.6', null);
          const released = await store.releaseByOwner('c1', 'eth0');
          assert.deepEqual([...released].sort(), ['10.0.0.2', '10.1.0.2']);
          assert.deepEqual(owners(await store.list()), [
            { ip: '10.0.0.3', owner: C1E1 },
            { ip: '10.0.0.4', owner: C2E0 },
            { ip: '10.0.0.5', owner: { containerId: 'c1', ifname: null } },
            { ip: '10.0.0.6', owner: null },
          ]);
        }));

      it('falls back to legacy ID-only records when no exact match exists', () =>
        withStore(make, async ({ store, plant }) => {
          await plant('10.0.0.3', { containerId: 'c3', ifname: null });
          await plant('10.1.0.3', { containerId: 'c3', ifname: null });
          await store.reserve('10.0.0.4', { containerId: 'c3', ifname: 'eth1' }, 0);
          const released = await store.releaseByOwner('c3', 'eth0');
          assert.deepEqual([...released].sort(), ['10.0.0.3', '10.1.0.3']);
          assert.deepEqual(owners(await store.list()), [{ ip: '10.0.0.4', owner: { containerId: 'c3', ifname: 'eth1' } }]);
        }));

      it('trims the requested container ID', () =>
        withStore(make, async ({ store }) => {
          await store.reserve('10.0.0.2', C1E0, 0);
          assert.deepEqual(await store.releaseByOwner(' c1 ', 'eth0'), ['10.0.0.2']);
        }));

      it('returns [] when nothing matches, and again on a repeat (DEL is idempotent)', () =>
        withStore(make, async ({ store }) => {
          await store.reserve('10.0.0.2', C2E0, 0);
          assert.deepEqual(await store.releaseByOwner('c1', 'eth0'), []);
          assert.deepEqual(await store.releaseByOwner('c2', 'eth0'), ['10.0.0.2']);
          assert.deepEqual(await store.releaseByOwner('c2', 'eth0'), []);
        }));
    });

    describe('writable, lock and close', () => {
      it('is writable when new', () =>
        withStore(make, async ({ store }) => {
          assert.equal(await store.writable(), true);
        }));

      it('allows unlock when not locked, and locking again after unlock', async () => {
        const { store } = await make();
        try {
          await store.unlock();
          await store.lock(5);
          await store.unlock();
          await store.unlock();
          await store.lock(5);
          assert.equal(await store.reserve('10.0.0.2', C1E0, 0), true);
        } finally {
          await store.close();
        }
      });

      it('close is idempotent and every method then throws ClosedError', async () => {
        const { store } = await make();
        await store.lock(5);
        await store.close();
        await store.close();
        const calls: Array<[string, () => Promise<unknown>]> = [
          ['lock', () => store.lock(1)],
          ['unlock', () => store.unlock()],
          ['list', () => store.list()],
          ['reserve', () => store.reserve('10.0.0.2', C1E0, 0)],
          ['restore', () => store.restore('10.0.0.2', C1E0)],
          ['lastReservedIP', () => store.lastReservedIP(0)],
          ['release', () => store.release('10.0.0.2', C1E0)],
          ['releaseByOwner', () => store.releaseByOwner('c1', 'eth0')],
          ['writable', () => store.writable()],
        ];
        for (const [method, call] of calls) {
          await assert.rejects(call, (e: unknown) => isAppError(e, 'CLOSED'), method);
        }
      });
    });
  });
}
