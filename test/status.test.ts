import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { test } from 'node:test';
import { ADMIN_KEY, ADMIN_YAML } from './helpers/admin.js';
import { KEY, startPerch, testConfig, v1, type RunningPerch } from './helpers/perch.js';
import { refusedPort } from './helpers/upstream-server.js';

const T = { timeout: 20_000 };
const STATUS_YAML = `${ADMIN_YAML}\n  status_page: true`;

async function get(perch: RunningPerch, path: string, key: string | null, method = 'GET') {
  const res = await fetch(perch.url + path, { method, headers: key === null ? {} : { 'x-api-key': key } });
  return { status: res.status, headers: res.headers, text: await res.text() };
}

test('without admin.status_page, /status and /status.json answer like any unknown route', T, async (t) => {
  for (const extra of ['', ADMIN_YAML]) {
    const perch = await startPerch(t, testConfig('demo: { kind: fixture }', extra));
    for (const path of ['/status', '/status.json']) {
      // A client key: the API checks the key before the path.
      const res = await get(perch, path, KEY);
      assert.equal(res.status, 404, `${path} with ${JSON.stringify(extra)}`);
      assert.equal(JSON.parse(res.text).error.code, 'E404');
    }
  }
});

test('the page is static, self-contained, served without a key and locked down by its CSP', T, async (t) => {
  const perch = await startPerch(t, testConfig('demo: { kind: fixture }', STATUS_YAML));
  const res = await get(perch, '/status', null);
  assert.equal(res.status, 200);
  assert.equal(res.headers.get('content-type'), 'text/html; charset=utf-8');
  assert.equal(res.headers.get('cache-control'), 'no-store');
  assert.equal(res.headers.get('x-frame-options'), 'DENY');
  assert.equal(res.headers.get('x-content-type-options'), 'nosniff');
  const csp = res.headers.get('content-security-policy') ?? '';
  assert.match(csp, /^default-src 'none'; /);
  assert.doesNotMatch(csp, /unsafe|\*|https?:/);
  // The CSP's hashes are those of the one inline script and style the page carries.
  for (const [tag, directive] of [
    ['script', 'script-src'],
    ['style', 'style-src'],
  ] as const) {
    const inline = [...res.text.matchAll(new RegExp(`<${tag}>([\\s\\S]*?)</${tag}>`, 'g'))].map((m) => m[1]!);
    assert.equal(inline.length, 1, tag);
    const digest = createHash('sha256').update(inline[0]!).digest('base64');
    assert.ok(csp.includes(`${directive} 'sha256-${digest}'`), `${directive} carries the hash of the inline ${tag}`);
  }
  // Nothing loaded from anywhere: no src or href attributes at all.
  assert.doesNotMatch(res.text, /\s(src|href)=/);
  assert.doesNotMatch(res.text, new RegExp(ADMIN_KEY));
  const head = await get(perch, '/status', null, 'HEAD');
  assert.equal(head.status, 200);
  assert.equal(head.text, '');
  assert.equal(head.headers.get('content-length'), String(Buffer.byteLength(res.text)));
  const post = await get(perch, '/status', null, 'POST');
  assert.equal(post.status, 405);
  assert.equal(post.headers.get('allow'), 'GET, HEAD');
});

test('/status.json takes an admin key only, spends no rate-limit token and logs refusals', T, async (t) => {
  const perch = await startPerch(t, testConfig('demo: { kind: fixture }', STATUS_YAML));
  for (const key of [null, KEY, 'wrong-key-0123456789']) {
    const res = await get(perch, '/status.json?cache-buster=1', key);
    assert.equal(res.status, 401, String(key));
    assert.equal(res.headers.get('cache-control'), 'no-store');
    assert.equal(JSON.parse(res.text).error.code, 'E401');
  }
  const post = await get(perch, '/status.json', ADMIN_KEY, 'POST');
  assert.equal(post.status, 405);
  assert.equal(post.headers.get('allow'), 'GET, HEAD');
  const ok = await get(perch, '/status.json', ADMIN_KEY);
  assert.equal(ok.status, 200);
  assert.equal(ok.headers.get('cache-control'), 'no-store');
  assert.equal(ok.headers.get('content-type'), 'application/json; charset=utf-8');
  const refused = perch.logs.lines().filter((line) => line.msg === 'admin status refused');
  assert.deepEqual(
    refused.map((line) => [line.status, line.key_id, line.path]),
    [
      [401, null, '/status.json'],
      [401, null, '/status.json'],
      [401, null, '/status.json'],
      [405, 'ops', '/status.json'],
    ],
  );
  assert.ok(!JSON.stringify(perch.logs.lines()).includes(ADMIN_KEY), 'the admin key is never logged');
});

test('/status.json reports hit ratios, upstream state and errors, per-key usage and the cache tiers', T, async (t) => {
  const upstreams = `demo: { kind: fixture }\n${v1('down', `http://127.0.0.1:${await refusedPort()}`)}`;
  const perch = await startPerch(t, testConfig(upstreams, `${STATUS_YAML}\nroutes: { tweet: [down, demo] }`));
  assert.equal((await perch.request('/v1/users/1')).status, 200);
  assert.equal((await perch.request('/v1/users/1')).status, 200);
  assert.equal((await perch.request('/v1/users/1')).status, 200);
  assert.equal((await perch.request('/v1/users/abc')).status, 400);
  assert.equal((await perch.request('/v1/tweets/5', { key: null })).status, 401);
  assert.equal((await perch.request('/v1/tweets/5')).status, 200);

  const status = JSON.parse((await get(perch, '/status.json', ADMIN_KEY)).text);
  assert.match(status.generated_at, /^\d{4}-\d\d-\d\dT/);
  assert.equal(status.config.reload_successful, true);
  const user = status.endpoints.find((e: { endpoint: string }) => e.endpoint === 'user');
  assert.deepEqual(user, { endpoint: 'user', requests: 4, hits: 2, stale: 0, coalesced: 0, misses: 1, hit_ratio: 2 / 3 });
  const tweets = status.endpoints.find((e: { endpoint: string }) => e.endpoint === 'tweets');
  assert.equal(tweets.hit_ratio, null, 'no ratio before a request reached the cache');
  assert.deepEqual(
    status.endpoints.map((e: { endpoint: string }) => e.endpoint),
    ['user', 'user_by_username', 'tweets', 'replies', 'following', 'tweet'],
  );

  const byName = Object.fromEntries(status.upstreams.map((u: { name: string }) => [u.name, u]));
  assert.deepEqual(byName.demo, { name: 'demo', state: 'ok', until: null, breaker: 'closed', throttle_reject_probability: 0, calls: 2, errors: 0, rate_limited: 0, refused: 0, credentials: [] });
  assert.equal(byName.down.calls, 1);
  assert.equal(byName.down.errors, 1);
  assert.deepEqual(byName.down.credentials, [{ id: 'default', state: 'active', until: null }]);

  assert.deepEqual(
    status.keys.map(({ secrets: _secrets, ...row }: { secrets: unknown }) => row),
    [
      // The fixture is no provider: only the call to `down` (refused, but made) counts.
      { id: 'alpha', requests: 5, hits: 2, errors: 1, rate_limited: 0, upstream_calls: 1, saved_calls: 2, budget_left: null },
      { id: 'bravo', requests: 0, hits: 0, errors: 0, rate_limited: 0, upstream_calls: 0, saved_calls: 0, budget_left: null },
    ],
  );
  // Each secret's last use: key-rotation.test.ts holds its value to an injected clock.
  assert.deepEqual(
    status.keys.map((row: { secrets: { index: number; last_used: string | null }[] }) => row.secrets.map((s) => [s.index, s.last_used !== null])),
    [[[0, true]], [[0, false]]],
  );
  assert.equal(status.cache.redis, null);
  assert.equal(status.cache.memory.max_bytes, perch.config.cache.memory.max_bytes);
  assert.ok(status.cache.memory.entries >= 2 && status.cache.memory.bytes > 0, JSON.stringify(status.cache.memory));
  // The admin requests themselves are not API traffic.
  const metrics = await (await fetch(`${perch.url}/metrics`)).text();
  assert.doesNotMatch(metrics, /route="none",status="200"/);
});

test('/status.json shows the max_bytes the memory cache runs with, not one a reload asked for', T, async (t) => {
  const yaml = testConfig('demo: { kind: fixture }', `${STATUS_YAML}\ncache: { memory: { max_bytes: 33554432 } }`);
  const perch = await startPerch(t, yaml);
  perch.reload(yaml.replace('max_bytes: 33554432', 'max_bytes: 67108864'));
  const status = JSON.parse((await get(perch, '/status.json', ADMIN_KEY)).text);
  assert.equal(status.cache.memory.max_bytes, 33_554_432);
});
