import assert from 'node:assert/strict';
import { test } from 'node:test';
import { ManualClock } from './helpers/clock.js';
import { startPerch, testConfig, v1, waitFor } from './helpers/perch.js';
import { startRedis } from './helpers/redis-server.js';
import { sampleUser } from './helpers/sample-bodies.js';
import { json, sampleProvider, startUpstream } from './helpers/upstream-server.js';

// sampleProvider answers every user route with the user { id: '123', username: 'Alice', ... }.
const TTLS = 'cache: { stale_seconds: 0, ttl_seconds: { user: 100, user_by_username: 50 } }';

test('a user fetched by username is a hit by id, with the user TTL and no upstream request', async (t) => {
  const upstream = await startUpstream(t, sampleProvider);
  const perch = await startPerch(t, testConfig(v1('main', upstream.url), TTLS), { clock: new ManualClock() });
  const miss = await perch.request('/v1/users/by/username/alice');
  assert.equal(miss.headers.get('cache-status'), 'perch; fwd=miss; stored');
  const hit = await perch.request('/v1/users/123');
  assert.equal(hit.status, 200);
  assert.equal(hit.text, miss.text);
  assert.equal(hit.headers.get('cache-status'), 'perch; hit; ttl=100');
  assert.equal(upstream.requests.length, 1);
});

test('a user fetched by id is a hit by username in any case, with the user_by_username TTL', async (t) => {
  const upstream = await startUpstream(t, sampleProvider);
  const perch = await startPerch(t, testConfig(v1('main', upstream.url), TTLS), { clock: new ManualClock() });
  const miss = await perch.request('/v1/users/123');
  for (const spelling of ['alice', 'ALICE', 'aLiCe']) {
    const hit = await perch.request(`/v1/users/by/username/${spelling}`);
    assert.equal(hit.text, miss.text, spelling);
    assert.equal(hit.headers.get('cache-status'), 'perch; hit; ttl=50', spelling);
  }
  assert.deepEqual(upstream.requests.map((r) => r.url), ['/v1/users/123']);
});

test('a body whose id or username breaks the parameter rules creates no second key', async (t) => {
  let body: unknown = sampleUser('7', 'bad-name!');
  const upstream = await startUpstream(t, (req, res) => json(200, body)(req, res));
  const perch = await startPerch(t, testConfig(v1('main', upstream.url)));
  assert.equal((await perch.request('/v1/users/7')).status, 200);
  assert.equal(perch.cache.memory.size().entries, 1);
  // An id of other characters fails the response schema: a 502, nothing stored under any key.
  for (const [i, id] of ['12ab', '', '-1'].entries()) {
    body = sampleUser(id, `bob${i}`);
    assert.equal((await perch.request(`/v1/users/by/username/bob${i}`)).status, 502);
  }
  // Digits, but more than a user_id may have.
  body = sampleUser('1'.repeat(21), 'bob');
  assert.equal((await perch.request('/v1/users/by/username/bob')).status, 200);
  body = sampleUser('8', 'x'.repeat(51));
  await perch.request('/v1/users/8');
  // One entry per answered request, none under a key taken from the body.
  assert.equal(perch.cache.memory.size().entries, 3);
  assert.equal(upstream.requests.length, 6);
});

test('no cross-population for a 404, another endpoint, or a counterpart whose TTL is 0', async (t) => {
  const upstream = await startUpstream(t, (req, res) =>
    req.url === '/v1/users/404' ? json(404, { error: 'nope' })(req, res) : sampleProvider(req, res),
  );
  const perch = await startPerch(t, testConfig(v1('main', upstream.url), 'cache: { ttl_seconds: { user_by_username: 0 } }'));
  assert.equal((await perch.request('/v1/users/404')).status, 404);
  assert.equal((await perch.request('/v1/tweets/1')).status, 200);
  assert.equal(perch.cache.memory.size().entries, 2);
  await perch.request('/v1/users/123');
  assert.equal(perch.cache.memory.size().entries, 3);
  assert.equal((await perch.request('/v1/users/by/username/alice')).headers.get('cache-status'), 'perch; fwd=miss');
});

test('with Redis, the counterpart is in the shared tier too: another instance hits it there', async (t) => {
  const redis = await startRedis(t);
  const upstream = await startUpstream(t, sampleProvider);
  const yaml = testConfig(v1('main', upstream.url), `cache: { redis: { url: "${redis.url}", prefix: "x:" } }`);
  const a = await startPerch(t, yaml);
  const b = await startPerch(t, yaml);
  await waitFor(() => a.cache.redisConnected === true && b.cache.redisConnected === true);
  await a.request('/v1/users/by/username/Alice');
  const hit = await b.request('/v1/users/123');
  assert.match(hit.headers.get('cache-status') ?? '', /^perch; hit; ttl=\d+; detail=redis$/);
  assert.equal(upstream.requests.length, 1);
});
