/**
 * Bytes as text, losslessly (src/common/bytes.ts), and the plugin reading a non-UTF-8 CNI_IFNAME
 * exactly (issue 8.3): host-local writes and compares the bytes it was given.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { bytesToText, textByteLength, textToBytes } from '../../src/common/bytes.ts';
import { exactEnv } from '../../src/cni/plugin.ts';
import { validateIfname } from '../../src/ipam/config.ts';
import { rng } from '../helpers/rng.ts';

const hex = (b: Uint8Array) => Buffer.from(b).toString('hex');

describe('bytesToText / textToBytes', () => {
  const cases: Array<{ name: string; bytes: number[]; text: string }> = [
    { name: 'ASCII', bytes: [0x65, 0x74, 0x68, 0x30], text: 'eth0' },
    { name: 'valid 2-byte UTF-8', bytes: [0x65, 0xc3, 0xa9], text: 'eé' },
    { name: 'valid 4-byte UTF-8 (a surrogate pair in JS)', bytes: [0xf0, 0x9f, 0x82, 0x80], text: '\u{1f080}' },
    { name: 'a lone invalid byte', bytes: [0x65, 0xff], text: 'e\udcff' },
    { name: 'a truncated sequence: each byte escaped', bytes: [0xe2, 0x82], text: '\udce2\udc82' },
    { name: 'overlong "/" (C0 AF)', bytes: [0xc0, 0xaf], text: '\udcc0\udcaf' },
    { name: 'an encoded surrogate (ED A0 80)', bytes: [0xed, 0xa0, 0x80], text: '\udced\udca0\udc80' },
    { name: 'above U+10FFFF (F4 90 80 80)', bytes: [0xf4, 0x90, 0x80, 0x80], text: '\udcf4\udc90\udc80\udc80' },
    { name: 'an escape right after a pair whose low half is U+DC80', bytes: [0xf0, 0x9f, 0x82, 0x80, 0xff], text: '\u{1f080}\udcff' },
    { name: 'the bytes of U+FFFD stay U+FFFD', bytes: [0xef, 0xbf, 0xbd], text: '\ufffd' },
  ];
  for (const c of cases) {
    it(`${c.name}: ${hex(Buffer.from(c.bytes))} ↔ ${JSON.stringify(c.text)}`, () => {
      assert.equal(bytesToText(Buffer.from(c.bytes)), c.text);
      assert.equal(hex(textToBytes(c.text)), hex(Buffer.from(c.bytes)));
      assert.equal(textByteLength(c.text), c.bytes.length);
    });
  }

  it('round-trips 2000 random byte strings exactly (one text per byte string)', () => {
    const rand = rng(88);
    const seen = new Map<string, string>();
    for (let n = 0; n < 2000; n++) {
      const b = Buffer.from(Array.from({ length: 1 + Math.floor(rand() * 12) }, () => Math.floor(rand() * 256)));
      const t = bytesToText(b);
      assert.equal(hex(textToBytes(t)), hex(b));
      const prev = seen.get(t);
      if (prev !== undefined) assert.equal(prev, hex(b));
      seen.set(t, hex(b));
    }
  });

  it('valid UTF-8 decodes as Node decodes it', () => {
    const s = 'a\u00e9\u20ac\u{1f600}z';
    assert.equal(bytesToText(Buffer.from(s, 'utf8')), s);
  });
});

describe('exactEnv: CNI_IFNAME as the runtime passed it', () => {
  const environ = Buffer.concat([Buffer.from('PATH=/bin\0CNI_IFNAME=eth', 'latin1'), Buffer.from([0xff]), Buffer.from('\0CNI_COMMAND=DEL\0', 'latin1')]);

  it('a value Node decoded with U+FFFD is re-read from the raw environment', () => {
    const env = { PATH: '/bin', CNI_IFNAME: 'eth\ufffd', CNI_COMMAND: 'DEL' };
    assert.deepEqual(exactEnv(env, () => environ), { ...env, CNI_IFNAME: 'eth\udcff' });
  });

  it('a UTF-8 value is used as it is, without reading the environment', () => {
    const env = { CNI_IFNAME: 'eth0' };
    assert.equal(exactEnv(env, () => assert.fail('not read')), env);
  });

  it('an unreadable environment leaves the value as Node decoded it', () => {
    const env = { CNI_IFNAME: 'eth\ufffd' };
    assert.equal(
      exactEnv(env, () => {
        throw new Error('EACCES');
      }),
      env,
    );
  });

  it('validateIfname counts an escaped byte as one byte (15 bytes pass, 16 do not)', () => {
    validateIfname(`${'e'.repeat(14)}\udcff`);
    assert.throws(() => validateIfname(`${'e'.repeat(15)}\udcff`), { message: 'interface name is too long' });
  });
});
