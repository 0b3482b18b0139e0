import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { test } from 'node:test';
import type { AnyNode } from '../src/config/dsl.js';
import { CONFIG } from '../src/config/schema.js';

const CONFIG_DIR = new URL('../../src/config/', import.meta.url);

/** Every key of the definition with its path, `<...>` and `[]` marking maps and lists. */
function keys(node: AnyNode, path: string): { path: string; node: AnyNode }[] {
  const here = path === '' ? [] : [{ path, node }];
  switch (node.type) {
    case 'object':
      return [...here, ...Object.entries(node.props).flatMap(([key, child]) => keys(child, path === '' ? key : `${path}.${key}`))];
    case 'record':
      return [...here, ...keys(node.value, `${path}.${node.placeholder}`)];
    case 'list':
      return [...here, ...keys(node.of, `${path}[]`)];
    case 'kinds':
      return [...here, ...Object.values(node.branches).flatMap((branch) => keys(branch, path).slice(1))];
    default:
      return here;
  }
}

const KEYS = keys(CONFIG, '');
const leafName = (path: string) => /([A-Za-z0-9_]+)(\[\])?$/.exec(path)?.[1] ?? '';

test('every key of the definition says what it means', () => {
  assert.ok(KEYS.length > 150, `${KEYS.length} keys`);
  const undocumented = KEYS.filter(({ node }) => node.doc.trim().length < 8).map(({ path }) => path);
  assert.deepEqual(undocumented, []);
});

/**
 * A key is written once: its type, default, range and meaning in the definition, the rules
 * between keys in rules*.ts, and nowhere else in src/config/ (the validator, the types and the
 * generators read the definition). Keys named here by their distinctive names (with an
 * underscore), since `id` or `url` are also ordinary words of the code.
 */
test('in src/config/, only the definition and the rules name a key', () => {
  const definitionOrRules = /^(schema|schema-upstreams|rules|rules-[a-z]+)\.ts$/;
  const distinctive = [...new Set(KEYS.map(({ path }) => leafName(path)).filter((name) => name.includes('_')))];
  assert.ok(distinctive.length > 50, `${distinctive.length} distinctive names`);
  const found: string[] = [];
  for (const file of readdirSync(CONFIG_DIR).filter((name) => name.endsWith('.ts') && !definitionOrRules.test(name))) {
    const code = readFileSync(new URL(file, CONFIG_DIR), 'utf8').replace(/\/\*[\s\S]*?\*\/|\/\/.*$/gm, '');
    for (const name of distinctive) if (new RegExp(`\\b${name}\\b`).test(code)) found.push(`${file}: ${name}`);
  }
  assert.deepEqual(found, []);
});
