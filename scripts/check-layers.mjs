#!/usr/bin/env node
/**
 * The layer check (ARCHITECTURE.md "Layout"; house rules "Layers"): every import in `src/**` may
 * only go down the layers
 *
 *   0 common  <  1 ipam, store, runtime  <  2 pool  <  3 reconcile, node  <  4 cni
 *   <  5 cli, daemon  <  6 main (src/main.ts, src/cold.ts) and lab (src/lab/, test tooling)
 *
 * Modules of one layer are peers and do not import each other, except along the edges listed in
 * PEER_EDGES (each with its reason); a lazy `import('…')` listed in SEAMS is let through. The
 * cluster pool (src/pool/) is entered only through its facade: a file outside src/pool/ may import
 * src/pool/index.ts and no other file of it (FACADES). It also fails on
 *   - an import cycle between files (static, dynamic and type-only imports alike),
 *   - a Node built-in imported without the `node:` prefix,
 *   - `process.exit` outside an entry file (src/main.ts, src/cold.ts, src/lab/),
 *   - a file under src/ in no layer (a new top-level directory must be placed here first).
 * Imports counted: `import … from`, `import type`, `export … from`, `import '…'`, `import('…')`,
 * `require('…')`, `import x = require('…')`; string literals only.
 *
 * Usage: node scripts/check-layers.mjs [--root DIR]   (DIR holds src/; default: this repository)
 * Output: one line per violation on stderr, `file:line imports target (layer a → layer b …)`, and
 * a summary line. Exit status: 0 no violation; 1 violations; 2 usage error.
 * Uses the TypeScript parser (devDependency `typescript`) so comments and strings never count.
 */
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { builtinModules } from 'node:module';
import { dirname, join, relative, resolve, sep } from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';

/** Layer of each top-level module (directory under src/). */
export const LAYERS = {
  common: 0,
  types: 0, // ambient declarations for untyped packages
  ipam: 1,
  store: 1,
  runtime: 1,
  pool: 2, // the cluster-pool engine over KV, entered through src/pool/index.ts (FACADES)
  reconcile: 3,
  node: 3,
  cni: 4,
  cli: 5,
  daemon: 5,
  lab: 6,
  main: 6, // src/main.ts, src/cold.ts
};

/**
 * Modules entered only through one file: from outside the module, an import of any other file of
 * it is a violation (its internals may change without their callers noticing).
 */
export const FACADES = {
  pool: 'src/pool/index.ts',
};

/**
 * Allowed imports between peers (same layer), `from → to`. Anything else between two modules of
 * one layer is a violation (cli ↔ daemon above all).
 */
export const PEER_EDGES = {
  'ipam→store': 'the allocator is logic that takes a Store (STYLE.md 2): it needs the interface',
  'reconcile→node': 'the reconciler and its status/doctor models read node facts (kernel evidence, CNI confs, /proc)',
};

/**
 * Known seams: `file → target` imports allowed against the layers, only as a dynamic
 * `import('…')` (a lazy load), each with its reason. Keep this list short; fix rather than add.
 */
export const SEAMS = {
  'src/cni/plugin.ts → src/cold.ts':
    'the plugin loads the cold bundle (CRI self-healing hooks) lazily; scripts/build.mjs replaces this import by the loader of dist/ipwarden-cold.cjs. To remove: have src/main.ts inject the hooks into runPlugin',
};

/** Files allowed to call process.exit (entries). */
const ENTRY_RE = /^src\/(main\.ts|cold\.ts|lab\/)/;

const BUILTINS = new Set(builtinModules.filter((m) => !m.startsWith('_')));

function usage(msg) {
  process.stderr.write(`check-layers: ${msg}\nusage: node scripts/check-layers.mjs [--root DIR]\n`);
  process.exitCode = 2;
}

/** Every .ts file under dir (sorted, relative to root, `/` separators). */
function listTs(root, dir, out) {
  let names;
  try {
    names = readdirSync(dir).sort();
  } catch (e) {
    throw new Error(`cannot list ${dir}: ${e.message}`);
  }
  for (const name of names) {
    const p = join(dir, name);
    const st = statSync(p);
    if (st.isDirectory()) listTs(root, p, out);
    else if (name.endsWith('.ts') || name.endsWith('.mts') || name.endsWith('.cts')) out.push(relative(root, p).split(sep).join('/'));
  }
  return out;
}

/** The module (top-level directory, or `main` for src/*.ts) of a src-relative path; null outside src. */
function moduleOf(rel) {
  const parts = rel.split('/');
  if (parts[0] !== 'src' || parts.length < 2) return null;
  if (parts.length === 2) return parts[1] === 'main.ts' || parts[1] === 'cold.ts' ? 'main' : `?${parts[1]}`;
  return parts[1];
}

/** Imports and process.exit calls of one file: [{ spec, line, kind }], [line]. */
function scan(text, file) {
  const sf = ts.createSourceFile(file, text, ts.ScriptTarget.Latest, true, ts.ScriptKind.TS);
  const imports = [];
  const exits = [];
  const lineOf = (node) => sf.getLineAndCharacterOfPosition(node.getStart(sf)).line + 1;
  const visit = (node) => {
    if ((ts.isImportDeclaration(node) || ts.isExportDeclaration(node)) && node.moduleSpecifier && ts.isStringLiteral(node.moduleSpecifier)) {
      imports.push({ spec: node.moduleSpecifier.text, line: lineOf(node) });
    } else if (ts.isImportEqualsDeclaration(node) && ts.isExternalModuleReference(node.moduleReference) && ts.isStringLiteral(node.moduleReference.expression)) {
      imports.push({ spec: node.moduleReference.expression.text, line: lineOf(node) });
    } else if (ts.isCallExpression(node)) {
      const callee = node.expression;
      const arg = node.arguments[0];
      const literal = arg !== undefined && (ts.isStringLiteral(arg) || ts.isNoSubstitutionTemplateLiteral(arg));
      if (callee.kind === ts.SyntaxKind.ImportKeyword && literal) imports.push({ spec: arg.text, line: lineOf(node), dynamic: true });
      else if (ts.isIdentifier(callee) && callee.text === 'require' && literal) imports.push({ spec: arg.text, line: lineOf(node) });
      else if (ts.isPropertyAccessExpression(callee) && callee.name.text === 'exit' && ts.isIdentifier(callee.expression) && callee.expression.text === 'process') {
        exits.push(lineOf(node));
      }
    } else if (ts.isImportTypeNode(node) && ts.isLiteralTypeNode(node.argument) && ts.isStringLiteral(node.argument.literal)) {
      imports.push({ spec: node.argument.literal.text, line: lineOf(node) });
    }
    ts.forEachChild(node, visit);
  };
  visit(sf);
  return { imports, exits };
}

/** Resolve a relative specifier to a repo-relative path (the file as written; `.js` → `.ts`). */
function resolveSpec(root, fromRel, spec, known) {
  const abs = resolve(root, dirname(fromRel), spec);
  let rel = relative(root, abs).split(sep).join('/');
  if (known.has(rel)) return rel;
  for (const alt of [rel.replace(/\.js$/, '.ts'), `${rel}.ts`, `${rel}/index.ts`]) if (known.has(alt)) return alt;
  return rel;
}

/** Strongly connected components with more than one file, or a file importing itself (Tarjan). */
function cycles(graph) {
  let index = 0;
  const idx = new Map();
  const low = new Map();
  const stack = [];
  const on = new Set();
  const out = [];
  const strong = (v) => {
    idx.set(v, index);
    low.set(v, index);
    index++;
    stack.push(v);
    on.add(v);
    for (const w of graph.get(v) ?? []) {
      if (!idx.has(w)) {
        strong(w);
        low.set(v, Math.min(low.get(v), low.get(w)));
      } else if (on.has(w)) low.set(v, Math.min(low.get(v), idx.get(w)));
    }
    if (low.get(v) === idx.get(v)) {
      const comp = [];
      let w;
      do {
        w = stack.pop();
        on.delete(w);
        comp.push(w);
      } while (w !== v);
      if (comp.length > 1 || (graph.get(v) ?? new Set()).has(v)) out.push(comp.sort());
    }
  };
  for (const v of [...graph.keys()].sort()) if (!idx.has(v)) strong(v);
  return out;
}

/** Check the tree under root; returns { files, imports, violations: string[] }. */
export function checkLayers(root) {
  const files = listTs(root, join(root, 'src'), []);
  const known = new Set(files);
  const violations = [];
  const graph = new Map();
  let count = 0;
  for (const file of files) {
    const from = moduleOf(file);
    const fromLayer = from === null ? undefined : LAYERS[from];
    if (fromLayer === undefined) {
      violations.push(`${file}:1 is in no layer (module ${JSON.stringify(from)}; add it to LAYERS in scripts/check-layers.mjs)`);
      continue;
    }
    const { imports, exits } = scan(readFileSync(join(root, file), 'utf8'), file);
    if (!ENTRY_RE.test(file)) for (const line of exits) violations.push(`${file}:${line} calls process.exit outside an entry file (set process.exitCode)`);
    const edges = new Set();
    for (const { spec, line, dynamic } of imports) {
      count++;
      if (!spec.startsWith('.')) {
        const bare = spec.split('/')[0];
        if (!spec.startsWith('node:') && (BUILTINS.has(spec) || BUILTINS.has(bare))) violations.push(`${file}:${line} imports ${spec} (a Node built-in: write node:${spec})`);
        continue;
      }
      const target = resolveSpec(root, file, spec, known);
      if (!known.has(target)) {
        if (target.startsWith('src/')) violations.push(`${file}:${line} imports ${spec} (no such file ${target})`);
        continue; // outside src (package.json, generated assets): not a layer matter
      }
      edges.add(target);
      const to = moduleOf(target);
      const toLayer = LAYERS[to];
      if (toLayer === undefined || from === to) continue;
      const facade = FACADES[to];
      if (facade !== undefined && target !== facade) violations.push(`${file}:${line} imports ${spec} (module ${to} is entered only through ${facade})`);
      if (dynamic === true && SEAMS[`${file} → ${target}`] !== undefined) continue;
      const where = `(layer ${fromLayer} ${from} → layer ${toLayer} ${to}`;
      if (toLayer > fromLayer) violations.push(`${file}:${line} imports ${spec} ${where}: runs up the layers)`);
      else if (toLayer === fromLayer && PEER_EDGES[`${from}→${to}`] === undefined) violations.push(`${file}:${line} imports ${spec} ${where}: peers)`);
    }
    graph.set(file, edges);
  }
  for (const comp of cycles(graph)) violations.push(`${comp[0]}:1 is in an import cycle: ${comp.join(' → ')}`);
  return { files: files.length, imports: count, violations };
}

function main(argv) {
  let root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === '--root' && argv[i + 1] !== undefined) root = resolve(argv[++i]);
    else return usage(`unknown argument ${JSON.stringify(argv[i])}`);
  }
  let r;
  try {
    r = checkLayers(root);
  } catch (e) {
    return usage(e.message);
  }
  for (const v of r.violations) process.stderr.write(`${v}\n`);
  const summary = `check-layers: ${r.files} files, ${r.imports} imports, ${r.violations.length} violation${r.violations.length === 1 ? '' : 's'}\n`;
  if (r.violations.length > 0) {
    process.stderr.write(summary);
    process.exitCode = 1;
  } else process.stdout.write(summary);
}

if (process.argv[1] !== undefined && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) main(process.argv.slice(2));
