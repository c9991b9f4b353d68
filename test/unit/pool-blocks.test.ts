/** Pure block math of cluster pools (src/pool/blocks.ts), exact values. */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { loadIPAMConfig } from '../../src/ipam/config.ts';
import { allocatableCount, allocatableOrdinals, blockCidrText, blocksOf, countBlocks, nodeHash, type Block } from '../../src/pool/blocks.ts';
import { blockKeyText } from '../../src/pool/model.ts';
import type { RangeSet } from '../../src/ipam/types.ts';

function sets(ranges: unknown): readonly RangeSet[] {
  return loadIPAMConfig(JSON.stringify({ cniVersion: '1.0.0', name: 'n', ipam: { ranges } }), undefined).rangeSets;
}
const SIZES = { blockSize4: 26, blockSize6: 122 };
const texts = (rs: RangeSet, sizes = SIZES): string[] => [...blocksOf(rs, 0, sizes)].map((b) => blockCidrText(b.cidr));

describe('blocksOf', () => {
  it('a /24 is four /26 blocks', () => {
    assert.deepEqual(texts(sets([[{ subnet: '10.80.1.0/24' }]])[0] as RangeSet), ['10.80.1.0/26', '10.80.1.64/26', '10.80.1.128/26', '10.80.1.192/26']);
  });
  it('a range inside a subnet gives only the blocks it touches', () => {
    const rs = sets([[{ subnet: '10.80.1.0/24', rangeStart: '10.80.1.70', rangeEnd: '10.80.1.130' }]])[0] as RangeSet;
    assert.deepEqual(texts(rs), ['10.80.1.64/26', '10.80.1.128/26']);
  });
  it('a subnet smaller than a block is one block of its own size', () => {
    assert.deepEqual(texts(sets([[{ subnet: '10.80.2.0/28' }]])[0] as RangeSet), ['10.80.2.0/28']);
  });
  it('two ranges of one set sharing a subnet yield each block once, in address order', () => {
    const rs = sets([[{ subnet: '10.80.1.0/24', rangeStart: '10.80.1.100', rangeEnd: '10.80.1.110' }, { subnet: '10.80.1.0/24', rangeStart: '10.80.1.10', rangeEnd: '10.80.1.20' }]])[0] as RangeSet;
    assert.deepEqual(texts(rs), ['10.80.1.0/26', '10.80.1.64/26']);
  });
  it('IPv6 blocks are /122 and lazy on a /64', () => {
    const rs = sets([[{ subnet: 'fd80:1::/64' }]])[0] as RangeSet;
    const it = blocksOf(rs, 0, SIZES);
    assert.deepEqual([it.next(), it.next()].map((r) => blockCidrText((r.value as Block).cidr)), ['fd80:1::/122', 'fd80:1::40/122']);
    assert.equal(countBlocks(rs, SIZES, 1000n), 1000n);
  });
  it('counts /20 → 64 blocks of /26; blockSize 28 → 256', () => {
    const rs = sets([[{ subnet: '10.80.16.0/20' }]])[0] as RangeSet;
    assert.equal(countBlocks(rs, SIZES), 64n);
    assert.equal(countBlocks(rs, { blockSize4: 28, blockSize6: 122 }), 256n);
  });
});

describe('allocatableOrdinals', () => {
  it('the first block of a /24 skips the network address and the gateway (.1); the last skips broadcast', () => {
    const rs = sets([[{ subnet: '10.80.1.0/24' }]])[0] as RangeSet;
    const [first, , , last] = [...blocksOf(rs, 0, SIZES)];
    const a = allocatableOrdinals(rs, (first as Block).cidr);
    assert.equal(a.length, 62);
    assert.deepEqual(a.slice(0, 2), [2, 3]);
    const z = allocatableOrdinals(rs, (last as Block).cidr);
    assert.equal(z.length, 63);
    assert.equal(z.at(-1), 62);
  });
});

describe('allocatableCount', () => {
  it('equals allocatableOrdinals(…).length for every block of these range sets (gateways inside and outside a range, several ranges, a gateway of one range inside another, IPv6)', () => {
    const cases: Array<[unknown, number]> = [
      [[[{ subnet: '10.80.1.0/24' }]], 253],
      [[[{ subnet: '10.80.1.0/24', rangeStart: '10.80.1.70', rangeEnd: '10.80.1.130' }]], 61],
      [[[{ subnet: '10.80.1.0/24', rangeStart: '10.80.1.100', rangeEnd: '10.80.1.110' }, { subnet: '10.80.1.0/24', rangeStart: '10.80.1.10', rangeEnd: '10.80.1.20' }]], 22],
      // range 2's default gateway .1 is inside range 1 (which has its own gateway .200): .1 is allocatable there
      [[[{ subnet: '10.80.1.0/24', rangeStart: '10.80.1.1', rangeEnd: '10.80.1.5', gateway: '10.80.1.200' }, { subnet: '10.80.1.0/24', rangeStart: '10.80.1.64', rangeEnd: '10.80.1.70' }]], 12],
      [[[{ subnet: '10.80.2.0/28' }]], 13],
      [[[{ subnet: 'fd80:1::/120' }]], 254],
    ];
    for (const [ranges, total] of cases) {
      const rs = sets(ranges)[0] as RangeSet;
      let sum = 0;
      for (const sizes of [SIZES, { blockSize4: 28, blockSize6: 124 }]) {
        sum = 0;
        for (const b of blocksOf(rs, 0, sizes)) {
          const n = allocatableCount(rs, b.cidr);
          assert.equal(n, allocatableOrdinals(rs, b.cidr).length, `${JSON.stringify(ranges)} ${blockCidrText(b.cidr)}`);
          sum += n;
        }
        assert.equal(sum, total, JSON.stringify(ranges));
      }
    }
    // A block outside every range holds none.
    assert.equal(allocatableCount(sets([[{ subnet: '10.80.1.0/24' }]])[0] as RangeSet, { ip: { family: 4, value: 0x0a500200n }, prefix: 26 }), 0);
  });
});

describe('keys and hash', () => {
  it('block key text', () => {
    assert.equal(blockKeyText({ ip: { family: 4, value: 0x0a500140n }, prefix: 26 }), '10.80.1.64-26');
    assert.equal(blockKeyText({ ip: { family: 6, value: (0xfd80n << 112n) | 0x40n }, prefix: 122 }), 'fd80::40-122');
  });
  it('FNV-1a 32 of the node name', () => {
    assert.equal(nodeHash(''), 0x811c9dc5);
    assert.equal(nodeHash('a'), 0xe40c292c);
  });
});
