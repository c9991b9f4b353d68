/**
 * Helpers for the CLI's human output: aligned tables, short IDs, ages. Pure.
 */

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
 * not padded. Every line ends with `\n`. Cells must not contain line breaks.
 */
export function renderTable(headers: readonly string[], rows: readonly (readonly string[])[]): string {
  const widths = headers.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? '').length)));
  const line = (cells: readonly string[]): string =>
    cells
      .map((c, i) => (i === cells.length - 1 ? c : c.padEnd(widths[i] ?? 0)))
      .join('  ')
      .trimEnd() + '\n';
  return line(headers) + rows.map(line).join('');
}

/**
 * A compact age like kubectl's: `45s`, `5m3s`, `2h5m`, `3d4h` (whole units, truncated).
 * A negative age of a second or more (file mtime after the snapshot: the clock was stepped back)
 * shows with a minus sign (`-1h0m`), never as `0s` (issue 7); non-finite as `-`.
 */
export function formatAge(seconds: number): string {
  if (!Number.isFinite(seconds)) return '-';
  if (seconds <= -1) return `-${formatAge(-seconds)}`;
  const s = Math.max(0, Math.floor(seconds));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m${s % 60}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h${Math.floor((s % 3600) / 60)}m`;
  return `${Math.floor(s / 86400)}d${Math.floor((s % 86400) / 3600)}h`;
}
