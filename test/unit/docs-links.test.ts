/**
 * The user docs stay readable and true:
 * - every relative link in README.md, docs/*.md and deploy/helm/ipwarden/README.md names an existing file,
 *   and every `#anchor` (in-page or on another page) matches a heading's GitHub-style slug there;
 *   external http(s) links are checked for syntax only (no network here);
 * - no internal ID (an issue number, a field-report or review label, a rule label the page does not
 *   define) appears in them, except the allowlisted ones below, each with its reason;
 * - the series table of docs/metrics.md and the metrics the daemon registers are the same set of
 *   names, types and label names (a `DaemonMetrics` made without starting a daemon).
 */
import { strict as assert } from 'node:assert';
import { describe, it } from 'node:test';
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { DaemonMetrics } from '../../src/daemon/metrics.ts';
import { DaemonStatusPages } from '../../src/daemon/status-pages.ts';

const ROOT = resolve(import.meta.dirname, '../..');

/** The user docs, paths relative to the repository root. */
function userDocs(): string[] {
  const out = ['README.md'];
  for (const f of readdirSync(join(ROOT, 'docs')).sort()) if (f.endsWith('.md')) out.push(`docs/${f}`);
  if (existsSync(join(ROOT, 'deploy/helm/ipwarden/README.md'))) out.push('deploy/helm/ipwarden/README.md');
  return out;
}

/** The text with fenced code blocks blanked (line numbers kept) and, if `spans`, inline code spans too. */
function prose(text: string, spans: boolean): string {
  const lines = text.split('\n');
  let fence: string | null = null;
  const out = lines.map((line) => {
    const m = /^\s*(```|~~~)/.exec(line);
    if (fence !== null) {
      if (m !== null && m[1] === fence) fence = null;
      return '';
    }
    if (m !== null) {
      fence = m[1] as string;
      return '';
    }
    return spans ? line.replace(/(`+)[^`]*?\1/g, (s) => ' '.repeat(s.length)) : line;
  });
  return out.join('\n');
}

/** GitHub's heading anchors: lower case, punctuation dropped, spaces to `-`, repeats suffixed `-1`, `-2`, … */
function anchors(text: string): Set<string> {
  const seen = new Map<string, number>();
  const out = new Set<string>();
  for (const line of prose(text, false).split('\n')) {
    const h = /^#{1,6}\s+(.*?)\s*#*\s*$/.exec(line);
    if (h === null) continue;
    const plain = (h[1] as string)
      .replace(/!?\[([^\]]*)\]\([^)]*\)/g, '$1')
      .replace(/<[^>]+>/g, '')
      .replace(/`/g, '');
    const base = plain.toLowerCase().replace(/[^\p{L}\p{M}\p{N}\p{Pc}\- ]/gu, '').replace(/ /g, '-');
    const n = seen.get(base) ?? 0;
    seen.set(base, n + 1);
    out.add(n === 0 ? base : `${base}-${n}`);
  }
  return out;
}

interface Link { readonly file: string; readonly line: number; readonly target: string }

/** Inline markdown links `[text](target)` and reference definitions `[x]: target` outside code. */
function links(file: string): Link[] {
  const text = prose(readFileSync(join(ROOT, file), 'utf8'), true);
  const out: Link[] = [];
  text.split('\n').forEach((line, i) => {
    for (const m of line.matchAll(/\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)/g)) out.push({ file, line: i + 1, target: m[1] as string });
    const def = /^\s{0,3}\[[^\]]+\]:\s+<?(\S+?)>?(?:\s+"[^"]*")?\s*$/.exec(line);
    if (def !== null) out.push({ file, line: i + 1, target: def[1] as string });
  });
  return out;
}

describe('docs links', () => {
  const docs = userDocs();
  const all = docs.flatMap(links);

  it('finds the docs and their links', () => {
    assert.ok(docs.includes('docs/troubleshooting.md'), docs.join(', '));
    assert.ok(all.length >= 20, `${all.length} links`);
  });

  it('every relative link names an existing file and every anchor a heading there', () => {
    const bad: string[] = [];
    const cache = new Map<string, Set<string>>();
    const anchorsOf = (abs: string) => {
      let a = cache.get(abs);
      if (a === undefined) cache.set(abs, (a = anchors(readFileSync(abs, 'utf8'))));
      return a;
    };
    for (const l of all) {
      const where = `${l.file}:${l.line} ${l.target}`;
      if (/^[a-z][a-z0-9+.-]*:/i.test(l.target)) {
        if (/^https?:/i.test(l.target)) {
          try {
            const u = new URL(l.target);
            if (!/^https?:$/.test(u.protocol) || !u.hostname.includes('.')) bad.push(`${where}: not a web address`);
          } catch {
            bad.push(`${where}: not a URL`);
          }
        } else if (!/^mailto:/i.test(l.target)) bad.push(`${where}: unexpected scheme`);
        continue;
      }
      const hash = l.target.indexOf('#');
      const path = hash < 0 ? l.target : l.target.slice(0, hash);
      const anchor = hash < 0 ? null : decodeURIComponent(l.target.slice(hash + 1));
      const abs = path === '' ? join(ROOT, l.file) : resolve(dirname(join(ROOT, l.file)), decodeURIComponent(path));
      if (!abs.startsWith(ROOT)) { bad.push(`${where}: outside the repository`); continue; }
      if (!existsSync(abs)) { bad.push(`${where}: no such file ${relative(ROOT, abs)}`); continue; }
      if (anchor === null) continue;
      if (statSync(abs).isDirectory() || !abs.endsWith('.md')) { bad.push(`${where}: anchor on a non-markdown target`); continue; }
      if (!anchorsOf(abs).has(anchor)) bad.push(`${where}: no heading with anchor #${anchor} in ${relative(ROOT, abs)}`);
    }
    assert.deepEqual(bad, []);
  });

  it('computes GitHub slugs as GitHub does', () => {
    assert.deepEqual(
      [...anchors('# Metrics, health and alerts\n## `ipwarden pool status`\n## D1′ — two rules\n## A\n## A\n```\n# not a heading\n```\n')],
      ['metrics-health-and-alerts', 'ipwarden-pool-status', 'd1--two-rules', 'a', 'a-1'],
    );
  });
});

/**
 * Internal IDs a reader cannot look up. A page may keep a label it defines where the reader sees it;
 * those are allowed per file below.
 */
const ID_PATTERNS: readonly RegExp[] = [
  /\b[Ii]ssues?\s+#?\d+/g,
  /\bBR-\d+/g,
  /\b[Rr]eview\s+[A-Z]?\d+/g,
  /\b[Tt]rial\s+findings?\b/g,
  /\bfindings?\s+\d+/g,
  /\bfield\s+report\b/g,
  /\b[A-Z]\d{1,2}\b['′]?/g,
  /\.\.\/shared\/\S*/g, // the team's own notes, outside the repository
];

/** Tokens matched by the last pattern that are not internal IDs, or labels their page defines. */
const ALLOWED: Readonly<Record<string, { readonly tokens: readonly string[]; readonly reason: string }>> = {
  '*': {
    tokens: ['V8', 'C0', 'C1', 'O2', 'Z0'],
    reason: 'V8 is the JavaScript engine; C0/C1 are the control-character sets of ISO 6429; O2 is gcc\'s -O2; Z0 is in the regex [a-zA-Z0-9]',
  },
  'docs/reconciler.md': {
    tokens: ['E1', 'E2', 'E3', 'E4', 'E5', 'E6', 'E7', 'E8', 'E9', 'E10', 'E11', 'E12', 'E13', 'E14', 'D1', 'D1′', 'D2', 'D3', 'D4'],
    reason: 'the evidence rules E1–E14 are defined in the table of "Evidence rules", the daemon rules D1–D4 in "Daemon rules", on this page',
  },
  'docs/cluster.md': {
    tokens: ['D1', 'D2', 'D3'],
    reason: 'the pool pass rules D1–D3 are defined in the numbered list of its release rules, on this page',
  },
};

describe('docs carry no internal IDs', () => {
  it('no issue numbers, review or field-report labels, or undefined rule labels', () => {
    const found: string[] = [];
    for (const file of userDocs()) {
      const text = readFileSync(join(ROOT, file), 'utf8').replace(/https?:\/\/\S+/g, '');
      const allowed = new Set([...(ALLOWED['*']?.tokens ?? []), ...(ALLOWED[file]?.tokens ?? [])]);
      // Whole text, so a label broken across lines is found too.
      for (const re of ID_PATTERNS) {
        for (const m of text.matchAll(re)) {
          const tok = m[0].replace(/'$/, '').replace(/\s+/g, ' ');
          if (allowed.has(tok)) continue;
          const line = text.slice(0, m.index).split('\n').length;
          found.push(`${file}:${line}: ${tok}`);
        }
      }
    }
    assert.deepEqual(found, []);
  });
});

/** The rows of docs/metrics.md's "## Series" table: name, type, label names. */
function seriesTable(): Map<string, { type: string; labels: string[] }> {
  const doc = readFileSync(join(ROOT, 'docs/metrics.md'), 'utf8');
  const start = doc.indexOf('\n## Series');
  assert.ok(start >= 0, 'docs/metrics.md has a "Series" section');
  const end = doc.indexOf('\n## ', start + 1);
  const out = new Map<string, { type: string; labels: string[] }>();
  for (const line of doc.slice(start, end < 0 ? undefined : end).split('\n')) {
    const m = /^\| `(ipwarden_[a-z0-9_]+)` \| ([a-z]+) \|([^|]*)\|/.exec(line);
    if (m === null) continue;
    assert.ok(!out.has(m[1] as string), `${m[1]} listed twice`);
    const labels = [...(m[3] as string).matchAll(/`([a-z_]+)`/g)].map((x) => x[1] as string).sort();
    out.set(m[1] as string, { type: m[2] as string, labels });
  }
  return out;
}

describe('docs/metrics.md matches the registry', () => {
  it('the series table lists exactly the registered metrics, with their types and labels', async () => {
    const m = new DaemonMetrics();
    // With --cni-bin-dir the daemon also registers the installed files' series.
    m.watchInstalledFiles();
    // The status pages register their counter in the same registry, as the daemon's agent makes them.
    new DaemonStatusPages({ collect: () => Promise.reject(new Error('not asked')), renderHtml: null, registry: m.registry });
    const registered = new Map<string, { type: string; labels: string[] }>();
    for (const metric of m.registry.getMetricsAsArray() as unknown as Array<{ name: string; type: string; labelNames?: readonly string[] }>) {
      const { name, type, labelNames } = metric;
      registered.set(name, { type: String(type), labels: [...(labelNames ?? [])].sort() });
    }
    const table = seriesTable();
    assert.ok(registered.size >= 30, `${registered.size} registered`);
    const diff: string[] = [];
    for (const [name, r] of registered) {
      const d = table.get(name);
      if (d === undefined) diff.push(`${name}: registered, not in docs/metrics.md`);
      else if (d.type !== r.type || d.labels.join(',') !== r.labels.join(',')) {
        diff.push(`${name}: docs ${d.type} [${d.labels.join(',')}], registry ${r.type} [${r.labels.join(',')}]`);
      }
    }
    for (const name of table.keys()) if (!registered.has(name)) diff.push(`${name}: in docs/metrics.md, not registered`);
    assert.deepEqual(diff, []);
    assert.equal(table.size, registered.size);
  });
});
