import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';
import { Ajv2020 } from 'ajv/dist/2020.js';
import { parse } from 'yaml';
import { CONFIG_KEYS, type ConfigKey } from '../src/config/config-keys.js';
import { configSchema } from '../src/config/json-schema.js';
import { parseConfig } from '../src/config/load.js';
import { describeFrom, readmeRows } from '../src/config/readme-table.js';

const read = (path: string) => readFileSync(new URL(`../../${path}`, import.meta.url), 'utf8');
const SCHEMA_FILE = 'config/perch.schema.json';
const ROWS = readmeRows(read('README.md'));

/** The README's default cell for a table key: its prose, or its default as code. */
function readmeDefault(key: ConfigKey): string {
  if (key.readme !== undefined) return key.readme;
  if (key.default === undefined) return key.required === true ? 'required' : '-';
  const value = key.default;
  const text = Array.isArray(value) ? `[${value.join(', ')}]` : typeof value === 'object' ? '{}' : String(value);
  return `\`${text}\``;
}

test(`${SCHEMA_FILE} is the schema generated from the key table (npm run schema rewrites it)`, () => {
  const schema = configSchema(describeFrom(ROWS));
  assert.deepEqual(JSON.parse(read(SCHEMA_FILE)), schema);
  assert.equal(schema.additionalProperties, false);
  const port = (schema.properties as Record<string, { properties: Record<string, { description?: string }> }>).server!.properties.port!;
  assert.equal(port.description, 'TCP port, 0-65535 (0 picks a free port)', "descriptions are the README's meanings");
});

test("the README's configuration table and the key table list the same keys with the same defaults", () => {
  const rows = new Map<string, string[]>();
  for (const row of ROWS) for (const path of row.paths) rows.set(path, [...(rows.get(path) ?? []), row.defaults]);
  const documented = CONFIG_KEYS.filter((key) => key.row !== false);
  assert.deepEqual([...rows.keys()].sort(), [...new Set(documented.map((key) => key.path))].sort());
  for (const key of documented) {
    const cells = rows.get(key.path)!;
    const expected = readmeDefault(key);
    assert.ok(
      cells.some((cell) => cell === expected || cell.startsWith(`${expected} (`)),
      `${key.path}${key.kinds === undefined ? '' : ` (${key.kinds.join(', ')})`}: README says ${cells.join(' / ')}, the table ${expected}`,
    );
  }
});

/** The value at a table path in a validated config, with `<...>` segments read as `name`. */
function valueAt(config: unknown, path: string, name: string): unknown {
  return path.split('.').reduce<unknown>((node, segment) => (node as Record<string, unknown> | undefined)?.[segment.startsWith('<') ? name : segment], config);
}

test('the key table states the defaults the validator applies', () => {
  const base = `
auth: { keys: [{ id: alpha, key: "alpha-secret-0123456789", plan: p }] }
admin: { keys: [{ id: ops, key: "admin-secret-0123456789" }] }
rate_limits: { p: { capacity: 1, refill_per_second: 1 } }
cache: { redis: { url: "redis://127.0.0.1:6379" } }
rate_limits_redis: { url: "redis://127.0.0.1:6379" }
`;
  const configs = {
    v1: parseConfig(`${base}upstreams: { u: { kind: v1, url: "http://127.0.0.1:1" } }`, {}),
    x_v2: parseConfig(`${base}upstreams: { u: { kind: x_v2, bearer_token: t0ken } }`, {}),
  };
  // Kept in another form: `headers` becomes the credential `default`; the Redis TLS flags are
  // left out of the validated config when absent, which the connection code reads as false.
  const reshaped = new Set(['upstreams.<name>.headers', ...['cache.redis', 'rate_limits_redis'].flatMap((s) => [`${s}.tls`, `${s}.sentinel_tls`])]);
  for (const key of CONFIG_KEYS) {
    if (key.default === undefined || reshaped.has(key.path)) continue;
    for (const kind of key.kinds ?? ['v1', 'x_v2']) {
      if (kind === 'fixture') continue;
      const config = configs[kind as 'v1' | 'x_v2'];
      assert.deepEqual(valueAt(config, key.path, key.path.startsWith('rate_limits.') ? 'p' : 'u'), key.default, `${key.path} (${kind})`);
    }
  }
});

test('the validator refuses a key the table does not list, at every level', () => {
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

test('the schema accepts the shipped and documented configurations and refuses unknown keys and wrong types', () => {
  const ajv = new Ajv2020({ strict: true, allErrors: true });
  const validate = ajv.compile(configSchema(describeFrom(ROWS)));
  const readme = read('README.md');
  const example = /## Configuration reference[\s\S]*?```yaml\n([\s\S]*?)```/.exec(readme)![1]!;
  for (const [name, text] of [
    ['config/perch.yaml', read('config/perch.yaml')],
    ['deploy/perch.yaml', read('deploy/perch.yaml')],
    ['the README example', example],
  ] as const) {
    assert.ok(validate(parse(text)), `${name}: ${ajv.errorsText(validate.errors)}`);
  }
  const valid = parse(example) as Record<string, unknown>;
  assert.equal(validate({ ...valid, serverr: {} }), false, 'unknown top-level key');
  assert.equal(validate({ ...valid, server: { host: '0.0.0.0', port: 'eighty' } }), false, 'a string that is no ${ENV} for a number');
  assert.equal(validate({ ...valid, server: { port: '${PORT:-8080}' } }), true, 'a number from the environment');
  assert.equal(validate({ ...valid, upstreams: { x: { kind: 'x_v2', bearer_token: 't', headers: {} } } }), false, 'headers on x_v2');
  assert.equal(validate({ ...valid, upstreams: { f: { kind: 'fixture', url: 'http://a' } } }), false, 'a fixture takes only kind');
  assert.equal(validate({ ...valid, admin: { keys: [{ id: 'ops', key: 'k' }], status_page: true } }), true);
});
