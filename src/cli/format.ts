/**
 * Helpers for the CLI's human output: aligned tables, short IDs, ages. Pure.
 */
import { formatAge } from '../common/duration.ts';
import { NO_RUNTIME_FOUND } from '../runtime/endpoint.ts';

/**
 * Code points that must not reach a terminal raw: C0 controls but the line feed (ESC starts the
 * sequences that move the cursor and erase rows, CR overwrites one), DEL, C1 controls, the line
 * and paragraph separators, the bidi embedding/override/isolate controls, and lone surrogates
 * (bytes that were not UTF-8, `src/common/bytes.ts`).
 */
const TERMINAL_UNSAFE = /[\u0000-\u0009\u000b-\u001f\u007f-\u009f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]/u;
const TERMINAL_UNSAFE_G = new RegExp(TERMINAL_UNSAFE.source, 'gu');

/**
 * `text` safe for a terminal: each unsafe code point (see above) as an escape — a C0 control as
 * `\xNN`, an escaped non-UTF-8 byte as `\xNN` of that byte, anything else as `\uNNNN`. Line feeds
 * and everything printable are kept. The escapes are valid inside JSON strings too (raw C0
 * controls and lone surrogates never occur in `JSON.stringify` output), so JSON passes through
 * unchanged but for the C1 and format characters, which become their JSON escapes.
 */
export function escapeTerminal(text: string): string {
  if (!TERMINAL_UNSAFE.test(text)) return text;
  return text.replace(TERMINAL_UNSAFE_G, (c) => {
    const n = c.charCodeAt(0);
    if (n < 0x20) return `\\x${n.toString(16).padStart(2, '0')}`;
    if (n >= 0xdc80 && n <= 0xdcff) return `\\x${(n - 0xdc00).toString(16)}`;
    return `\\u${n.toString(16).padStart(4, '0')}`;
  });
}

/** Length container IDs are shortened to in tables (12 hex digits, as docker/crictl, plus one). */
export const SHORT_ID_LENGTH = 13;

/** `id` cut to {@link SHORT_ID_LENGTH} characters; null/empty shown as `-`. Tables only. */
export function shortId(id: string | null): string {
  if (id === null || id === '') return '-';
  return id.length > SHORT_ID_LENGTH ? id.slice(0, SHORT_ID_LENGTH) : id;
}

/** A table cell: null/empty shown as `-`. */
export function cell(v: string | null | undefined): string {
  return v === null || v === undefined || v === '' ? '-' : v;
}

/**
 * Render rows under headers as left-aligned columns separated by two spaces; the last column is
 * not padded. Every line ends with `\n`. Each cell is passed through {@link escapeTerminal} before
 * the columns are measured (a line break in a cell is escaped too), so values from disk, the
 * runtime or configuration files can neither move the cursor nor break the alignment.
 */
export function renderTable(headers: readonly string[], rawRows: readonly (readonly string[])[]): string {
  const rows = rawRows.map((r) => r.map((c) => escapeTerminal(c).replace(/\n/g, '\\n')));
  const widths = headers.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? '').length)));
  const line = (cells: readonly string[]): string =>
    cells
      .map((c, i) => (i === cells.length - 1 ? c : c.padEnd(widths[i] ?? 0)))
      .join('  ')
      .trimEnd() + '\n';
  return line(headers) + rows.map(line).join('');
}

/** `formatAge` lives in `src/common/duration.ts` (the doctor model below the CLI uses it); re-exported. */
export { formatAge };

/**
 * How human output names the runtime of a report (`status`, its HTML page): `runtime <endpoint>`,
 * or, when none was found (`endpoint` null: no `--runtime-endpoint`, no
 * `CONTAINER_RUNTIME_ENDPOINT`, no default socket), `runtime: none found (<how to give one>)`,
 * where `<how to give one>` is `error` without its leading `no CRI runtime found: ` (e.g. `none
 * of /run/containerd/containerd.sock, /var/run/crio/crio.sock exists; set --runtime-endpoint or
 * CONTAINER_RUNTIME_ENDPOINT`). Pure.
 */
export function runtimeHead(endpoint: string | null, error: string | undefined): string {
  if (endpoint !== null) return `runtime ${endpoint}`;
  const why = (error ?? '').startsWith(`${NO_RUNTIME_FOUND}: `) ? (error as string).slice(NO_RUNTIME_FOUND.length + 2) : error;
  return why === undefined || why === '' ? 'runtime: none found' : `runtime: none found (${why})`;
}
