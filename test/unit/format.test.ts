/**
 * Human output helpers (src/cli/format.ts): terminal escapes from disk, the runtime or
 * configuration never reach the terminal raw (issue 8.6).
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { escapeTerminal, renderTable } from '../../src/cli/format.ts';

describe('escapeTerminal', () => {
  const cases: Array<[string, string, string]> = [
    ['plain text', 'eth0 10.1.0.2 café 🙂', 'eth0 10.1.0.2 café 🙂'],
    ['line feeds are kept', 'a\nb\n', 'a\nb\n'],
    ['ESC (erase line, cursor up)', 'e\x1b[2K\x1b[1A', 'e\\x1b[2K\\x1b[1A'],
    ['CR, BEL, TAB, NUL', '\r\x07\t\x00', '\\x0d\\x07\\x09\\x00'],
    ['DEL and the C1 CSI', '\x7f\u009b2J', '\\u007f\\u009b2J'],
    ['line/paragraph separators and a bidi override', '\u2028\u2029\u202eabc\u2066', '\\u2028\\u2029\\u202eabc\\u2066'],
    ['a byte that was not UTF-8 (escaped on reading)', 'eth\udcff', 'eth\\xff'],
    ['another lone surrogate', 'x\ud800y', 'x\\ud800y'],
  ];
  for (const [name, input, shown] of cases) {
    it(`${name}: ${JSON.stringify(input)} → ${shown}`, () => {
      assert.equal(escapeTerminal(input), shown);
    });
  }

  it('JSON output stays valid JSON with the same values', () => {
    const doc = { ifname: 'e\x1b[2K\r\u009b\u202e\udcff\x7f', n: 1 };
    const text = escapeTerminal(JSON.stringify(doc));
    assert.equal(/[\u0000-\u0009\u000b-\u001f\u007f-\u009f\u202e]/.test(text), false);
    assert.deepEqual(JSON.parse(text), doc);
  });

  it('renderTable aligns on the escaped text and escapes line breaks inside cells', () => {
    assert.equal(
      renderTable(['A', 'B', 'C'], [['x\x1b', 'line\nbreak', 'z'], ['long value', 'b', 'end\r']]),
      'A           B            C\n' + 'x\\x1b       line\\nbreak  z\n' + 'long value  b            end\\x0d\n',
    );
  });
});
