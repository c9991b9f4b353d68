/**
 * The pool's data model (src/pool/model.ts): every key of a pool at its exact path, and the values
 * written byte for byte as ipwarden has always written them (the on-disk/etcd format is part of
 * the contract: an older and a newer ipwarden share one pool), each decoded back exactly.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import {
  affinityValue,
  decodeAffinity,
  decodeBlock,
  decodeHandle,
  decodeSettings,
  encodeBlock,
  encodeHandle,
  heartbeatValue,
  heartbeatWriter,
  keysOf,
  removalMarkerValue,
  settingsValue,
  tombstoneValue,
  type BlockValue,
  type HandleValue,
} from '../../src/pool/model.ts';

describe('pool model: keys', () => {
  const k = keysOf({ prefix: '/ipwarden', pool: 'p1' });
  it('puts every key under P/pools/<pool>/', () => {
    assert.deepEqual(
      [
        k.meta,
        k.clusterPin,
        k.blocksPrefix,
        k.block('10.80.0.64-26'),
        k.nodesPrefix,
        k.affinityPrefix('n1'),
        k.affinity('n1', '10.80.0.64-26'),
        k.settings('n1'),
        k.alivePrefix,
        k.alive('n1'),
        k.removingPrefix,
        k.removing('n1'),
        k.window('n1'),
        k.handlesPrefix,
        k.handle('c1', 'eth0'),
      ],
      [
        '/ipwarden/pools/p1/meta',
        '/ipwarden/pools/p1/meta-cluster',
        '/ipwarden/pools/p1/blocks/',
        '/ipwarden/pools/p1/blocks/10.80.0.64-26',
        '/ipwarden/pools/p1/nodes/',
        '/ipwarden/pools/p1/nodes/n1/blocks/',
        '/ipwarden/pools/p1/nodes/n1/blocks/10.80.0.64-26',
        '/ipwarden/pools/p1/nodes/n1/settings',
        '/ipwarden/pools/p1/alive/',
        '/ipwarden/pools/p1/alive/n1',
        '/ipwarden/pools/p1/removing/',
        '/ipwarden/pools/p1/removing/n1',
        '/ipwarden/pools/p1/removal-window/n1',
        '/ipwarden/pools/p1/handles/',
        '/ipwarden/pools/p1/handles/c1/eth0',
      ],
    );
  });
  it('reads the node of a settings key, and nothing else', () => {
    assert.equal(k.settingsNode('/ipwarden/pools/p1/nodes/n1/settings'), 'n1');
    assert.equal(k.settingsNode('/ipwarden/pools/p1/nodes/n1/blocks/10.80.0.64-26'), null);
    assert.equal(k.settingsNode('/ipwarden/pools/p2/nodes/n1/settings'), null);
  });
});

describe('pool model: values', () => {
  it('writes a block as before and reads it back', () => {
    const b: BlockValue = { v: 1, cidr: '10.80.0.64/26', rangeSet: 0, node: 'n1', state: 'owned', seq: 2, next: 3, allocs: { '1': { id: 'c1', ifname: 'eth0', node: 'n1', seq: 1, at: 5 }, '2': { id: '', ifname: '', node: 'n1', seq: 2, at: 6, reserve: true } } };
    const text = encodeBlock(b);
    assert.equal(
      text,
      '{"v":1,"cidr":"10.80.0.64/26","rangeSet":0,"node":"n1","state":"owned","seq":2,"next":3,"allocs":{"1":{"id":"c1","ifname":"eth0","node":"n1","seq":1,"at":5},"2":{"id":"","ifname":"","node":"n1","seq":2,"at":6,"reserve":true}}}',
    );
    assert.deepEqual(decodeBlock({ key: 'k', value: text, modRevision: '1', createRevision: '1' }, '10.80.0.64/26'), b);
  });
  it('writes a handle and a tombstone as before and reads them back', () => {
    const h: HandleValue = { v: 1, node: 'n1', network: 'net', at: 7, ips: [{ ip: '10.80.0.65', block: '10.80.0.64-26', ordinal: 1, seq: 1, rangeSet: 0 }], host: 'h1' };
    const text = encodeHandle(h);
    assert.equal(text, '{"v":1,"node":"n1","network":"net","at":7,"ips":[{"ip":"10.80.0.65","block":"10.80.0.64-26","ordinal":1,"seq":1,"rangeSet":0}],"host":"h1"}');
    assert.deepEqual(decodeHandle({ key: 'k', value: text, modRevision: '1', createRevision: '1' }), h);
    const t = tombstoneValue('n1', 'net', 8);
    assert.equal(t, '{"v":1,"node":"n1","network":"net","at":8,"ips":[],"deleted":true}');
    assert.deepEqual(decodeHandle({ key: 'k', value: t, modRevision: '1', createRevision: '1' }), { v: 1, node: 'n1', network: 'net', at: 8, ips: [], deleted: true });
  });
  it('writes the small values as before', () => {
    assert.equal(affinityValue(1), '{"v":1,"rangeSet":1}');
    assert.equal(decodeAffinity({ key: 'k', value: affinityValue(1), modRevision: '1', createRevision: '1' }), 1);
    assert.equal(settingsValue(30), '{"v":1,"offlineSeconds":30}');
    assert.equal(decodeSettings({ key: 'k', value: settingsValue(30), modRevision: '1', createRevision: '1' }), 30);
    assert.equal(removalMarkerValue('n1', 9), '{"v":1,"node":"n1","at":9}');
    assert.equal(heartbeatValue('n1', 10), '{"v":1,"node":"n1","since":10}');
    assert.equal(heartbeatValue('n1', 10, { host: 'h1', pid: 42 }), '{"v":1,"node":"n1","since":10,"host":"h1","pid":42}');
    assert.deepEqual(heartbeatWriter(heartbeatValue('n1', 10, { host: 'h1', pid: 42 })), { host: 'h1', pid: 42 });
  });
});
