/**
 * Bytes as text, losslessly. Go strings are byte strings: host-local writes and compares the
 * bytes it was given (a non-UTF-8 `CNI_IFNAME` included), where JavaScript text is UTF-16 and
 * Node's UTF-8 decoding replaces each invalid byte by U+FFFD — two different byte strings would
 * then read as the same text, and the original bytes could not be written back.
 *
 * {@link bytesToText} decodes valid UTF-8 as usual and each byte of an invalid sequence as the lone
 * surrogate U+DC00 + byte (U+DC80..U+DCFF; Python's "surrogateescape"); lone surrogates never come
 * out of valid UTF-8, so the mapping is one-to-one and {@link textToBytes} inverts it exactly.
 * Invalid sequences are split byte by byte as Go's `utf8.DecodeRune` does (`RuneError`, width 1),
 * so Go's `strings.TrimSpace` and this text agree on what is a space. JSON output shows an
 * escaped byte as `\udcff`; human output escapes it as `\xff` (`src/cli/format.ts`).
 */

const ESCAPE_BASE = 0xdc00;

/** Is `b` a UTF-8 continuation byte (10xxxxxx)? */
function cont(b: number | undefined): boolean {
  return b !== undefined && (b & 0xc0) === 0x80;
}

/**
 * Decode `bytes[start, end)` as UTF-8, each byte of an invalid sequence becoming U+DC00 + byte.
 * Strict UTF-8 (RFC 3629): no overlong forms, no surrogates (U+D800..U+DFFF), nothing above
 * U+10FFFF.
 */
export function bytesToText(bytes: Uint8Array, start = 0, end = bytes.length): string {
  let out = '';
  let i = start;
  while (i < end) {
    const b0 = bytes[i] as number;
    if (b0 < 0x80) {
      out += String.fromCharCode(b0);
      i++;
      continue;
    }
    const b1 = i + 1 < end ? bytes[i + 1] : undefined;
    const b2 = i + 2 < end ? bytes[i + 2] : undefined;
    const b3 = i + 3 < end ? bytes[i + 3] : undefined;
    let cp = -1;
    let width = 1;
    if (b0 >= 0xc2 && b0 <= 0xdf && cont(b1)) {
      cp = ((b0 & 0x1f) << 6) | ((b1 as number) & 0x3f);
      width = 2;
    } else if (b0 >= 0xe0 && b0 <= 0xef && cont(b1) && cont(b2)) {
      const v = ((b0 & 0x0f) << 12) | (((b1 as number) & 0x3f) << 6) | ((b2 as number) & 0x3f);
      if (v >= 0x800 && (v < 0xd800 || v > 0xdfff)) {
        cp = v;
        width = 3;
      }
    } else if (b0 >= 0xf0 && b0 <= 0xf4 && cont(b1) && cont(b2) && cont(b3)) {
      const v = ((b0 & 0x07) << 18) | (((b1 as number) & 0x3f) << 12) | (((b2 as number) & 0x3f) << 6) | ((b3 as number) & 0x3f);
      if (v >= 0x10000 && v <= 0x10ffff) {
        cp = v;
        width = 4;
      }
    }
    if (cp < 0) {
      out += String.fromCharCode(ESCAPE_BASE + b0);
      i++;
    } else {
      out += String.fromCodePoint(cp);
      i += width;
    }
  }
  return out;
}

/** True when `text` holds a lone surrogate, i.e. possibly an escaped byte (the slow path). */
function hasSurrogate(text: string): boolean {
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c >= 0xd800 && c <= 0xdfff) return true;
  }
  return false;
}

/**
 * The bytes of `text`: UTF-8, except that a lone U+DC80..U+DCFF (an escaped byte of
 * {@link bytesToText}) is that byte again. Other lone surrogates (which no decoding produces)
 * become U+FFFD's bytes, as `Buffer.from(text, 'utf8')` writes them.
 */
export function textToBytes(text: string): Buffer {
  if (!hasSurrogate(text)) return Buffer.from(text, 'utf8');
  const out: number[] = [];
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c >= 0xd800 && c <= 0xdbff) {
      const d = text.charCodeAt(i + 1);
      if (d >= 0xdc00 && d <= 0xdfff) {
        const cp = 0x10000 + ((c - 0xd800) << 10) + (d - 0xdc00);
        out.push(0xf0 | (cp >> 18), 0x80 | ((cp >> 12) & 0x3f), 0x80 | ((cp >> 6) & 0x3f), 0x80 | (cp & 0x3f));
        i++;
        continue;
      }
      out.push(0xef, 0xbf, 0xbd);
    } else if (c >= 0xdc80 && c <= 0xdcff) {
      out.push(c - ESCAPE_BASE);
    } else {
      for (const b of Buffer.from(text[i] as string, 'utf8')) out.push(b);
    }
  }
  return Buffer.from(out);
}

/** Length in bytes of {@link textToBytes}(`text`) (Go's `len` of the string). */
export function textByteLength(text: string): number {
  return hasSurrogate(text) ? textToBytes(text).length : Buffer.byteLength(text, 'utf8');
}
