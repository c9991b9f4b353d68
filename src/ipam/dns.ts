/**
 * resolv.conf parsing with host-local's semantics (plugins/ipam/host-local/dns.go
 * `parseResolvConf`), minus the file read: the caller reads `ipam.resolvConf` at the edge and
 * passes the text. Pure.
 */

import { GO_SPACE_CLASS } from '../common/names.ts';
import type { DNS } from './types.ts';

/** Go `unicode.IsSpace` (differs from JS `\s`: includes U+0085, excludes U+FEFF). */
const GO_SPACE = GO_SPACE_CLASS;
const TRIM = new RegExp(`^[${GO_SPACE}]+|[${GO_SPACE}]+$`, 'g');
const FIELDS = new RegExp(`[${GO_SPACE}]+`);

/**
 * Parse resolv.conf text into the result's `dns` object, like host-local:
 * - lines split on `\n` (a trailing `\r` is dropped), trimmed of whitespace;
 * - empty lines and lines whose first character is `#` or `;` are skipped;
 * - lines with fewer than two whitespace-separated fields are skipped;
 * - `nameserver X` appends X (only the first argument); `domain X` sets the domain (the last one
 *   wins); `search A B ...` and `options A B ...` append all their arguments;
 * - anything else is ignored. Keys never seen are absent from the result (host-local's
 *   `omitempty`), so an empty file gives `{}`.
 */
export function parseResolvConf(text: string): DNS {
  const dns: DNS = {};
  for (const raw of text.split('\n')) {
    const line = raw.replace(TRIM, '');
    if (line.length === 0 || line[0] === '#' || line[0] === ';') continue;
    const fields = line.split(FIELDS);
    if (fields.length < 2) continue;
    const [key, first] = fields as [string, string];
    switch (key) {
      case 'nameserver':
        (dns.nameservers ??= []).push(first);
        break;
      case 'domain':
        dns.domain = first;
        break;
      case 'search':
        (dns.search ??= []).push(...fields.slice(1));
        break;
      case 'options':
        (dns.options ??= []).push(...fields.slice(1));
        break;
    }
  }
  return dns;
}
