import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';
import { Ajv2020 } from 'ajv/dist/2020.js';
import fc from 'fast-check';
import { parse } from 'yaml';
import { configSchema } from '../src/config/json-schema.js';
import { ConfigError, parseConfig } from '../src/config/load.js';
import { readmeTable, TABLE_END, TABLE_START } from '../src/config/readme-table.js';

const read = (path: string) => readFileSync(new URL(`../../${path}`, import.meta.url), 'utf8');
const SCHEMA_FILE = 'config/perch.schema.json';

test(`${SCHEMA_FILE} and the table of docs/configuration.md are what the definition generates (npm run schema rewrites both)`, () => {
  assert.deepEqual(JSON.parse(read(SCHEMA_FILE)), configSchema());
  const page = read('docs/configuration.md');
  assert.ok(page.includes(TABLE_START) && page.includes(TABLE_END), 'the page has the table markers');
  const table = page.slice(page.indexOf(TABLE_START) + TABLE_START.length + 1, page.indexOf(TABLE_END) - 1);
  assert.equal(table, readmeTable());
  assert.match(table, /^\| `server\.port` \| `8080` \| TCP port, 0-65535 \(0 picks a free port\) \|$/m);
});

test('the validator refuses a key the definition does not list, at every level', () => {
  const yaml = `
auth: { keys: [{ id: alpha, key: "alpha-secret-0123456789", plan: p, extra: 1 }] }
rate_limits: { p: { capacity: 1, refill_per_second: 1, extra: 1 } }
upstreams: { u: { kind: v1, url: "http://127.0.0.1:1", extra: 1, breaker: { extra: 1 }, quota: { requests: 1, per_seconds: 1, extra: 1 } } }
server: { extra: 1 }
cache: { extra: 1, memory: { extra: 1 } }
extra: 1
`;
  assert.throws(
    () => parseConfig(yaml, {}),
    (error: { problems?: string[] }) => {
      const unknown = (error.problems ?? []).filter((problem) => problem.includes(': unknown key')).map((problem) => problem.split(':')[0]);
      assert.deepEqual(unknown.sort(), [
        'auth.keys[0].extra',
        'cache.extra',
        'cache.memory.extra',
        'extra',
        'rate_limits.p.extra',
        'server.extra',
        'upstreams.u.breaker.extra',
        'upstreams.u.extra',
        'upstreams.u.quota.extra',
      ]);
      return true;
    },
  );
});

const ajv = new Ajv2020({ strict: true, allErrors: true });
const validate = ajv.compile(configSchema());
/** The first YAML block after `heading` in a Markdown file. */
const example = (path: string, heading: string) => new RegExp(`\n${heading}\n[\\s\\S]*?\`\`\`yaml\n([\\s\\S]*?)\`\`\``).exec(read(path))![1]!;
const DOCS_EXAMPLE = example('docs/configuration.md', '## Example');
const README_EXAMPLE = example('README.md', '## A production configuration');

test('the schema accepts the shipped and documented configurations and refuses unknown keys, wrong types and values out of range', () => {
  for (const [name, text] of [
    ['config/perch.yaml', read('config/perch.yaml')],
    ['deploy/perch.yaml', read('deploy/perch.yaml')],
    ['the example of docs/configuration.md', DOCS_EXAMPLE],
    ["the README's production configuration", README_EXAMPLE],
  ] as const) {
    assert.ok(validate(parse(text)), `${name}: ${ajv.errorsText(validate.errors)}`);
  }
  const valid = parse(DOCS_EXAMPLE) as Record<string, unknown>;
  assert.equal(validate({ ...valid, serverr: {} }), false, 'unknown top-level key');
  assert.equal(validate({ ...valid, server: { host: '0.0.0.0', port: 'eighty' } }), false, 'a string that is no ${ENV} for a number');
  assert.equal(validate({ ...valid, server: { port: 70000 } }), false, 'a port out of range');
  assert.equal(validate({ ...valid, server: { port: '${PORT:-8080}' } }), true, 'a number from the environment');
  assert.equal(validate({ ...valid, upstreams: { x: { kind: 'x_v2', bearer_token: 't', headers: {} } } }), false, 'headers on x_v2');
  assert.equal(validate({ ...valid, upstreams: { f: { kind: 'fixture', url: 'http://a' } } }), false, 'a fixture takes only kind');
  assert.equal(validate({ ...valid, admin: { keys: [{ id: 'ops', key: 'k' }], status_page: true } }), true);
});

/**
 * perch and the editor schema come from one definition, so on a value of one key they agree:
 * a value perch accepts the schema accepts, and a value the schema refuses perch refuses.
 */
test('perch and the editor schema agree on the values of the keys they both check (property)', () => {
  const base = parse(DOCS_EXAMPLE) as Record<string, Record<string, unknown>>;
  const values = fc.oneof(fc.integer({ min: -10, max: 2_000_000 }), fc.double({ noNaN: true, min: -10, max: 1e7 }), fc.boolean(), fc.constantFrom('x', 'iso', 'ietf', '/m', 'keys'));
  const keys = fc.constantFrom(
    ['server', 'port'],
    ['server', 'max_header_bytes'],
    ['server', 'shutdown_grace_ms'],
    ['cache', 'stale_seconds'],
    ['log', 'time'],
    ['log', 'level'],
    ['metrics', 'port'],
  );
  fc.assert(
    fc.property(keys, values, ([section, key], value) => {
      const config = { ...base, [section!]: { ...(base[section!] ?? {}), [key!]: value } };
      let perchAccepts = true;
      try {
        parseConfig(JSON.stringify(config), { ALPHA_KEY: 'alpha-secret-0123456789', UPSTREAM_KEY: 'u', BACKUP_KEY: 'b', PERCH_ADMIN_KEY: 'admin-secret-0123456789' });
      } catch (error) {
        if (!(error instanceof ConfigError)) throw error;
        perchAccepts = false;
      }
      assert.equal(validate(config), perchAccepts, `${section}.${key} = ${JSON.stringify(value)}`);
    }),
    { numRuns: 300 },
  );
});
