/**
 * Go's `%q` / `strconv.Quote` for strings, so that messages built by Go code (libcni's
 * `ARGS: invalid pair %q`, `ARGS: unknown args %q`, `time.ParseDuration`) can be reproduced byte
 * for byte. Pure.
 */

const PRINTABLE = /^[\p{L}\p{M}\p{N}\p{P}\p{S} ]$/u;

/**
 * Quote `s` like Go's `strconv.Quote`: double quotes, `\"` and `\\` escaped, `\a \b \f \n \r \t \v`,
 * other ASCII controls and DEL as `\xNN`, non-printable code points as `\uNNNN` / `\UNNNNNNNN`,
 * printable Unicode (Go `unicode.IsPrint`: letters, marks, numbers, punctuation, symbols, ASCII
 * space) kept as is. A lone UTF-16 surrogate (invalid UTF-8 in Go terms) is written `\ufffd`.
 */
export function goQuote(s: string): string {
  let out = '"';
  for (const ch of s) {
    const cp = ch.codePointAt(0) as number;
    switch (ch) {
      case '"':
        out += '\\"';
        continue;
      case '\\':
        out += '\\\\';
        continue;
      case '\x07':
        out += '\\a';
        continue;
      case '\b':
        out += '\\b';
        continue;
      case '\f':
        out += '\\f';
        continue;
      case '\n':
        out += '\\n';
        continue;
      case '\r':
        out += '\\r';
        continue;
      case '\t':
        out += '\\t';
        continue;
      case '\v':
        out += '\\v';
        continue;
    }
    if (cp >= 0xd800 && cp <= 0xdfff) {
      out += '\\ufffd';
    } else if (cp < 0x20 || cp === 0x7f) {
      out += '\\x' + cp.toString(16).padStart(2, '0');
    } else if (PRINTABLE.test(ch)) {
      out += ch;
    } else if (cp < 0x10000) {
      out += '\\u' + cp.toString(16).padStart(4, '0');
    } else {
      out += '\\U' + cp.toString(16).padStart(8, '0');
    }
  }
  return out + '"';
}

/** Go's `%q` of a `[]string`: `["a" "b"]`. */
export function goQuoteList(items: readonly string[]): string {
  return '[' + items.map(goQuote).join(' ') + ']';
}
