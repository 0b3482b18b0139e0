import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join, normalize, relative } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

// Tests run from dist/test; the sources sit at the repository root.
const SRC = fileURLToPath(new URL('../../src/', import.meta.url));

/**
 * The layers of src/, bottom first: a file may import its own layer and the ones below, never one
 * above. ARCHITECTURE.md draws the same stack; a new folder must be placed here to be allowed.
 */
const LAYERS: readonly (readonly string[])[] = [
  ['clock', 'timers', 'endpoints', 'errors', 'bytes', 'header-list', 'http-date', 'version', 'url-table', 'node-version'],
  ['config'],
  ['schemas', 'openapi'],
  ['logging'],
  ['tracing'],
  ['redis'],
  ['upstream'],
  ['auth'],
  ['cache'],
  ['ratelimit'],
  ['metrics'],
  ['server'],
  ['admin'],
  ['app'],
  ['main', 'command', 'cli', 'health-check', 'workers'],
];

/** A source file's unit: its top folder under src/, or its own name for a file at the top. */
function unitOf(file: string): string {
  const [first = '', ...rest] = relative(SRC, file).split('/');
  return rest.length > 0 ? first : first.replace(/\.ts$/, '');
}

function layerOf(unit: string): number {
  const layer = LAYERS.findIndex((units) => units.includes(unit));
  assert.notEqual(layer, -1, `src/${unit} has no layer: place it in LAYERS (test/layering.test.ts) and ARCHITECTURE.md`);
  return layer;
}

function sources(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) return sources(path);
    return entry.name.endsWith('.ts') && !entry.name.endsWith('.d.ts') ? [path] : [];
  });
}

/** Every relative import of every source file (static, dynamic and type-only), resolved to a .ts path. */
function imports(): Map<string, string[]> {
  const graph = new Map<string, string[]>();
  for (const file of sources(SRC)) {
    const text = readFileSync(file, 'utf8');
    const targets = [...text.matchAll(/(?:from|import\()\s*'(\.{1,2}\/[^']+)\.js'/g)].map((m) => normalize(join(dirname(file), `${m[1]}.ts`)));
    graph.set(file, targets);
  }
  return graph;
}

const GRAPH = imports();
const at = (file: string) => relative(SRC, file);

test('the import reader sees the code: every file is read and every import resolves to a source file', () => {
  assert.ok(GRAPH.size > 120, `only ${GRAPH.size} files read`);
  const edges = [...GRAPH.values()].flat();
  assert.ok(edges.length > 400, `only ${edges.length} imports read`);
  const dangling = edges.filter((target) => !GRAPH.has(target) && !target.endsWith('cluster-key-slot.ts'));
  assert.deepEqual(dangling.map(at), []);
});

test('no import runs from a lower layer to a higher one', () => {
  const upward: string[] = [];
  for (const [file, targets] of GRAPH) {
    for (const target of targets) {
      if (layerOf(unitOf(target)) > layerOf(unitOf(file))) upward.push(`${at(file)} -> ${at(target)}`);
    }
  }
  assert.deepEqual(upward, []);
});

test('server/ is HTTP plumbing: it imports nothing from admin/, app/ or cache/', () => {
  const found = [...GRAPH]
    .filter(([file]) => unitOf(file) === 'server')
    .flatMap(([file, targets]) => targets.filter((t) => ['admin', 'app', 'cache'].includes(unitOf(t))).map((t) => `${at(file)} -> ${at(t)}`));
  assert.deepEqual(found, []);
});

test('the request path sees the cache only through the read-through policy, the outcome vocabulary and the entry it is served', () => {
  // entry.ts: a served entry keeps its variants as lengths, and the handler reads the coding it
  // sends through `variant` (issue 22).
  const requestPath = ['request-handler.ts', 'exchange.ts'].map((file) => join(SRC, 'app', file));
  const cache = new Set(requestPath.flatMap((file) => (GRAPH.get(file) ?? []).filter((t) => unitOf(t) === 'cache').map(at)));
  assert.deepEqual([...cache].sort(), ['cache/entry.ts', 'cache/outcome.ts', 'cache/read-through.ts']);
});

test('no file imports itself through a loop of other files', () => {
  const loops: string[] = [];
  const state = new Map<string, 'open' | 'done'>();
  const visit = (file: string, path: string[]): void => {
    if (state.get(file) === 'done') return;
    if (state.get(file) === 'open') {
      loops.push([...path.slice(path.indexOf(file)), file].map(at).join(' -> '));
      return;
    }
    state.set(file, 'open');
    for (const target of GRAPH.get(file) ?? []) visit(target, [...path, file]);
    state.set(file, 'done');
  };
  for (const file of GRAPH.keys()) visit(file, []);
  assert.deepEqual(loops, []);
});
