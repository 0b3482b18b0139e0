import assert from 'node:assert/strict';
import { test } from 'node:test';
import { parseConfig } from '../src/config/load.js';
import { createPerch } from '../src/app/perch.js';
import { captureLogs } from './helpers/log-capture.js';
import { APPLIED_ON_RELOAD, NEEDS_RESTART } from '../src/app/reload-scope.js';
import type { AnyNode } from '../src/config/dsl.js';
import { CONFIG } from '../src/config/schema.js';
import { KEY, OTHER_KEY, startPerch, testConfig, v1 } from './helpers/perch.js';
import { sampleUser } from './helpers/sample-bodies.js';
import { json, startUpstream } from './helpers/upstream-server.js';
import { onCleanup } from './helpers/cleanup.js';

test('reload swaps keys and upstreams in place: the cache and open connections stay', async (t) => {
  const first = await startUpstream(t, json(200, sampleUser('1', 'first')));
  const second = await startUpstream(t, json(200, sampleUser('2', 'second')));
  const yaml = testConfig(v1('main', first.url));
  const perch = createPerch({ config: parseConfig(yaml, {}), logger: captureLogs().logger });
  const { port } = await perch.listen();
  onCleanup(t, () => perch.close());
  const get = (path: string, key: string) => fetch(`http://127.0.0.1:${port}${path}`, { headers: { 'x-api-key': key } });

  assert.equal((await get('/v1/users/1', KEY)).status, 200);
  perch.reload(parseConfig(testConfig(v1('main', second.url)).replace(OTHER_KEY, 'test-key-delta-0123456789'), {}));
  // Cached before the reload: still a hit, from the same cache.
  const cached = await get('/v1/users/1', KEY);
  assert.match(cached.headers.get('cache-status') ?? '', /hit/);
  assert.equal(((await cached.json()) as { username: string }).username, 'first');
  // A miss goes to the new upstream; the removed key is refused, the added one works.
  assert.equal(((await (await get('/v1/users/2', KEY)).json()) as { username: string }).username, 'second');
  assert.equal((await get('/v1/users/2', OTHER_KEY)).status, 401);
  assert.equal((await get('/v1/users/2', 'test-key-delta-0123456789')).status, 200);
  assert.equal(second.requests.length, 1);
});

test('a reload that changes a plan and moves a key to a new plan takes effect on the next request', async (t) => {
  const yaml = testConfig('demo: { kind: fixture }');
  const perch = createPerch({ config: parseConfig(yaml, {}), logger: captureLogs().logger });
  const { port } = await perch.listen();
  onCleanup(t, () => perch.close());
  const get = () => fetch(`http://127.0.0.1:${port}/v1/users/1`, { headers: { 'x-api-key': KEY } });
  assert.match((await get()).headers.get('ratelimit-policy') ?? '', /^"big";q=100000;/);
  const next = yaml
    .replace('big: { capacity: 100000, refill_per_second: 100000 }', 'big: { capacity: 100000, refill_per_second: 100000 }\n  tiny: { capacity: 2, refill_per_second: 0.001 }')
    .replace(`key: "${KEY}", plan: big`, `key: "${KEY}", plan: tiny`);
  perch.reload(parseConfig(next, {}));
  const statuses = [];
  for (let i = 0; i < 3; i++) {
    const res = await get();
    assert.match(res.headers.get('ratelimit-policy') ?? '', /^"tiny";q=2;/);
    statuses.push(res.status);
  }
  assert.deepEqual(statuses, [200, 200, 429]);
});

test('a reload restores a credential the provider revoked at once, without waiting for its recheck', { timeout: 10_000 }, async (t) => {
  let revoked = true;
  const upstream = await startUpstream(t, (req, res) => (revoked ? json(401, {}) : json(200, sampleUser('1', 'back')))(req, res));
  const yaml = testConfig(v1('main', upstream.url, 'credentials: [{ id: only, headers: { X-Key: "upstrm-secret-only-0001" } }]'));
  const perch = createPerch({ config: parseConfig(yaml, {}), logger: captureLogs().logger });
  const { port } = await perch.listen();
  onCleanup(t, () => perch.close());
  const get = (path: string) => fetch(`http://127.0.0.1:${port}${path}`, { headers: { 'x-api-key': KEY } });

  assert.equal((await get('/v1/users/1')).status, 502);
  revoked = false;
  // Out of the rotation: no call until the recheck, 300 s away.
  assert.equal((await get('/v1/users/2')).status, 502);
  assert.equal(upstream.requests.length, 1);
  perch.reload(parseConfig(yaml, {}));
  assert.equal((await get('/v1/users/3')).status, 200);
  assert.equal(upstream.requests.length, 2);
});

/** Every key path of the definition, as the README's table names them (`auth.keys[].plan`, `upstreams.<name>.url`). */
function keyPaths(node: AnyNode, path: string): string[] {
  switch (node.type) {
    case 'object':
      return Object.entries(node.props).flatMap(([key, child]) => keyPaths(child, path === '' ? key : `${path}.${key}`));
    case 'list':
      return keyPaths(node.of, `${path}[]`);
    case 'record':
      return keyPaths(node.value, `${path}.${node.placeholder}`);
    case 'kinds':
      return [...new Set(Object.values(node.branches).flatMap((branch) => keyPaths(branch, path)))];
    default:
      return [path];
  }
}

const covers = (entry: string, path: string) => path === entry || path.startsWith(`${entry}.`) || path.startsWith(`${entry}[]`);

test('every key of the configuration either applies on reload or is named by the restart warning, never both', () => {
  const paths = keyPaths(CONFIG, '');
  assert.ok(paths.length > 100, `walked ${paths.length} keys`);
  assert.ok(paths.includes('upstreams.<name>.credentials[].bearer_token') && paths.includes('cache.stale_seconds'));
  const lists = [...APPLIED_ON_RELOAD, ...NEEDS_RESTART];
  const unplaced = paths.filter((path) => lists.filter((entry) => covers(entry, path)).length !== 1);
  assert.deepEqual(unplaced, [], 'each key under exactly one entry of the two lists');
  assert.deepEqual(
    lists.filter((entry) => !paths.some((path) => covers(entry, path))),
    [],
    'no entry that names no key',
  );
});

test('a reload warns of exactly the changed settings that need a restart, and applies the others', async (t) => {
  const upstream = await startUpstream(t, json(200, sampleUser('1', 'first')));
  const before = testConfig(v1('main', upstream.url), 'log: { time: iso }\ncache: { stale_seconds: 600 }');
  const perch = await startPerch(t, before);
  const after = before
    .replace('port: 0 }', 'port: 0, miss_deadline_ms: 4000, max_connections: 77, shutdown_grace_ms: 900 }')
    .replace('log: { time: iso }', 'log: { time: epoch_ms, level: debug }')
    .replace('stale_seconds: 600', 'stale_seconds: 0, ttl_seconds: { user: 5 }');
  perch.reload(after);
  const warnings = perch.logs.lines().filter((l) => l.msg === 'reload: these settings take effect only after a restart');
  assert.deepEqual(
    warnings.map((l) => l.settings),
    [['server.shutdown_grace_ms', 'server.max_connections', 'log.time']],
  );
  const restartWarnings = () => perch.logs.lines().filter((l) => l.msg === 'reload: these settings take effect only after a restart');
  perch.reload(after.replace('max_connections: 77', 'max_connections: 78'));
  assert.deepEqual(restartWarnings()[1]?.settings, ['server.shutdown_grace_ms', 'server.max_connections', 'log.time'], 'still waiting: compared with what runs');
  perch.reload(before.replace('stale_seconds: 600', 'stale_seconds: 0, ttl_seconds: { user: 5 }'));
  assert.equal(restartWarnings().length, 2, 'back to the running values: nothing waits for a restart');
  perch.reload(after);
  assert.equal(restartWarnings().length, 3);
  assert.equal((await perch.request('/v1/users/1')).headers.get('cache-control'), 'private, max-age=5', 'a TTL applies to the next request');
});
