import assert from 'node:assert/strict';
import { test } from 'node:test';
import { guardedUpstream, limitedOnce } from './helpers/guarded-upstream.js';
import { json, sampleProvider } from './helpers/upstream-server.js';

const SECRET_A = 'upstrm-secret-aaaa-0001';
const SECRET_B = 'upstrm-secret-bbbb-0002';

const POOL = `credentials: [{ id: one, headers: { X-Key: "${SECRET_A}" } }, { id: two, headers: { X-Key: "${SECRET_B}" } }]`;

test('a spent usage cap is its own state: logged at error, the credential stopped on every endpoint for usage_cap_seconds', { timeout: 10_000 }, async (t) => {
  const problem = { title: 'UsageCapExceeded', type: 'https://api.twitter.com/2/problems/usage-capped', detail: 'Usage cap exceeded' };
  const { clock, upstream, perch } = await guardedUpstream(
    t,
    limitedOnce({ 'x-rate-limit-remaining': '250', 'x-rate-limit-reset': String(Date.UTC(2026, 0, 1) / 1000 + 60) }, problem),
    'cooldown_scope: endpoint, usage_cap_seconds: 3600',
  );
  const res = await perch.request('/v1/users/1');
  assert.deepEqual([res.status, res.headers.get('retry-after')], [429, '3600']);
  assert.equal((await perch.request('/v1/tweets/1')).status, 429, 'every endpoint, not just the one that drew it');
  clock.advance(600_000);
  assert.equal((await perch.request('/v1/users/1/following')).status, 429);
  assert.equal(upstream.requests.length, 1);
  const errors = perch.logs.lines().filter((l) => l.level === 50);
  assert.deepEqual(
    errors.map((l) => [l.msg, l.upstream, l.credential]),
    [['provider usage cap spent: credential stopped on every endpoint', 'main', 'default']],
  );
  clock.advance(3_000_000);
  assert.equal((await perch.request('/v1/users/9')).status, 200);
});

test('calls rotate over the credentials', { timeout: 10_000 }, async (t) => {
  const { upstream, perch } = await guardedUpstream(t, sampleProvider, POOL);
  for (let i = 1; i <= 4; i++) assert.equal((await perch.request(`/v1/users/${i}`)).status, 200);
  assert.deepEqual(
    upstream.requests.map((r) => r.headers['x-key']),
    [SECRET_A, SECRET_B, SECRET_A, SECRET_B],
  );
});

test('a credential answered 429 cools down alone, and the request is made again on the next one', { timeout: 10_000 }, async (t) => {
  const { clock, upstream, perch } = await guardedUpstream(
    t,
    (req, res) => (req.headers['x-key'] === SECRET_A ? json(429, {}, { 'retry-after': '60' })(req, res) : sampleProvider(req, res)),
    POOL,
  );
  assert.equal((await perch.request('/v1/users/1')).status, 200, 'the client does not pay for the spent credential');
  for (let i = 2; i <= 5; i++) assert.equal((await perch.request(`/v1/users/${i}`)).status, 200);
  assert.deepEqual(
    upstream.requests.map((r) => r.headers['x-key']),
    [SECRET_A, SECRET_B, SECRET_B, SECRET_B, SECRET_B, SECRET_B],
  );
  clock.advance(60_000);
  // Its stop over, the credential is tried again (and, still spent, stops again).
  await perch.request('/v1/users/6');
  await perch.request('/v1/users/7');
  assert.deepEqual(upstream.requests.slice(6).map((r) => r.headers['x-key']), [SECRET_A, SECRET_B, SECRET_B]);
  const metrics = await (await fetch(`${perch.url}/metrics`)).text();
  assert.match(metrics, /perch_upstream_credential_state\{upstream="main",credential="one",state="cooling_down"\} 1/);
  assert.match(metrics, /perch_upstream_credential_state\{upstream="main",credential="two",state="active"\} 1/);
});

test('a credential answered 401 leaves the rotation after its first 401; logs name its id, never its secret', { timeout: 10_000 }, async (t) => {
  const { clock, upstream, perch } = await guardedUpstream(
    t,
    (req, res) => (req.headers['x-key'] === SECRET_A ? json(401, {})(req, res) : sampleProvider(req, res)),
    POOL,
  );
  for (let i = 1; i <= 6; i++) assert.equal((await perch.request(`/v1/users/${i}`)).status, 200);
  clock.advance(86_400_000);
  assert.equal((await perch.request('/v1/users/7')).status, 200);
  assert.equal(upstream.requests.filter((r) => r.headers['x-key'] === SECRET_A).length, 1);
  const errors = perch.logs.lines().filter((l) => l.level === 50);
  assert.deepEqual(errors.map((l) => [l.msg, l.credential]), [['provider rejected a credential: out of the rotation until a reload', 'one']]);
  assert.ok(!perch.logs.text().includes(SECRET_A) && !perch.logs.text().includes(SECRET_B));
  const metrics = await (await fetch(`${perch.url}/metrics`)).text();
  assert.match(metrics, /perch_upstream_credential_state\{upstream="main",credential="one",state="revoked"\} 1/);
  assert.ok(!metrics.includes(SECRET_A));
});

test('a 503 with Retry-After stops the whole upstream, every credential', { timeout: 10_000 }, async (t) => {
  let calls = 0;
  const { upstream, perch } = await guardedUpstream(t, (req, res) => (calls++ === 0 ? json(503, {}, { 'retry-after': '20' })(req, res) : sampleProvider(req, res)), POOL);
  const res = await perch.request('/v1/users/1');
  assert.deepEqual([res.status, res.headers.get('retry-after')], [429, '20']);
  assert.equal((await perch.request('/v1/users/2')).status, 429);
  assert.equal(upstream.requests.length, 1);
});
