import assert from 'node:assert/strict';
import { test } from 'node:test';
import { ManualClock } from './helpers/clock.js';
import { startPerch, testConfig, v1, waitFor } from './helpers/perch.js';
import { sampleUser } from './helpers/sample-bodies.js';
import { json, sampleProvider, startUpstream, type UpstreamBehaviour } from './helpers/upstream-server.js';

// No stale window: these tests are about freshness itself (test/stale.test.ts covers stale serving).
const TTLS = 'cache: { stale_seconds: 0, ttl_seconds: { user: 300, tweets: 60, not_found: 30, replies: 0 } }';

async function setup(t: Parameters<typeof startUpstream>[0], behaviour: UpstreamBehaviour = sampleProvider) {
  const clock = new ManualClock();
  const upstream = await startUpstream(t, behaviour);
  const perch = await startPerch(t, testConfig(v1('main', upstream.url), TTLS), { clock });
  return { clock, upstream, perch };
}

test('a miss is forwarded and stored; the repeat is a hit with the same bytes, Age and Cache-Status', async (t) => {
  const { clock, upstream, perch } = await setup(t);
  const miss = await perch.request('/v1/users/1');
  assert.equal(miss.headers.get('cache-status'), 'perch; fwd=miss; stored');
  assert.equal(miss.headers.get('age'), null);
  clock.advance(42_500);
  const hit = await perch.request('/v1/users/1');
  assert.equal(hit.status, 200);
  assert.equal(hit.text, miss.text);
  assert.equal(hit.headers.get('cache-status'), 'perch; hit; ttl=257');
  assert.equal(hit.headers.get('age'), '42');
  assert.equal(upstream.requests.length, 1);
  const outcomes = perch.logs.lines().filter((l) => l.msg === 'request').map((l) => l.cache);
  assert.deepEqual(outcomes, ['miss', 'hit']);
});

test('an entry expires after its endpoint TTL', async (t) => {
  const { clock, upstream, perch } = await setup(t);
  await perch.request('/v1/users/1/tweets');
  clock.advance(59_999);
  assert.equal((await perch.request('/v1/users/1/tweets')).headers.get('cache-status'), 'perch; hit; ttl=0');
  clock.advance(1);
  assert.equal((await perch.request('/v1/users/1/tweets')).headers.get('cache-status'), 'perch; fwd=miss; stored');
  assert.equal(upstream.requests.length, 2);
});

test('a TTL of 0 disables caching for that endpoint', async (t) => {
  const { upstream, perch } = await setup(t);
  const first = await perch.request('/v1/users/1/replies');
  assert.equal(first.headers.get('cache-status'), 'perch; fwd=miss');
  await perch.request('/v1/users/1/replies');
  assert.equal(upstream.requests.length, 2);
});

test('cache keys: username case and unknown parameters share an entry; cursor and count split it', async (t) => {
  const { upstream, perch } = await setup(t);
  await perch.request('/v1/users/by/username/Alice');
  await perch.request('/v1/users/by/username/ALICE?x=1');
  assert.equal(upstream.requests.length, 1);
  await perch.request('/v1/users/1/following');
  await perch.request('/v1/users/1/following?count=20&utm=1');
  assert.equal(upstream.requests.length, 2);
  await perch.request('/v1/users/1/following?count=21');
  await perch.request('/v1/users/1/following?cursor=abc');
  await perch.request('/v1/users/1/following?count=20&cursor=abc');
  assert.equal(upstream.requests.length, 4);
  await perch.request('/v1/users/1/tweets?cursor=abc');
  await perch.request('/v1/users/1/tweets?cursor=abd');
  await perch.request('/v1/users/1/tweets?cursor=abc');
  assert.equal(upstream.requests.length, 6);
  // Same id, different endpoint: different entry.
  await perch.request('/v1/users/1');
  assert.equal(upstream.requests.length, 7);
});

test('upstream 404s are cached for ttl_seconds.not_found', async (t) => {
  const { clock, upstream, perch } = await setup(t, json(404, {}));
  assert.equal((await perch.request('/v1/tweets/7')).headers.get('cache-status'), 'perch; fwd=miss; stored');
  clock.advance(29_000);
  const hit = await perch.request('/v1/tweets/7');
  assert.equal(hit.status, 404);
  assert.deepEqual(hit.json(), { error: { message: 'Tweet not found', code: 'E404' } });
  assert.equal(hit.headers.get('cache-status'), 'perch; hit; ttl=1');
  clock.advance(1_000);
  await perch.request('/v1/tweets/7');
  assert.equal(upstream.requests.length, 2);
});

test('50 concurrent identical misses make one upstream request', async (t) => {
  let release!: () => void;
  const gate = new Promise<void>((resolve) => (release = resolve));
  const { upstream, perch } = await setup(t, (req, res) => void gate.then(() => sampleProvider(req, res)));
  const responses = Array.from({ length: 50 }, () => perch.request('/v1/users/1/tweets?cursor=c1'));
  // Every request must be inside perch before the upstream answers.
  await waitFor(() => upstream.requests.length === 1 && perch.received() === 50);
  release();
  const results = await Promise.all(responses);
  assert.equal(upstream.requests.length, 1);
  assert.ok(results.every((r) => r.status === 200 && r.text === results[0]!.text));
  const statuses = results.map((r) => r.headers.get('cache-status')).sort();
  assert.equal(statuses.filter((s) => s === 'perch; fwd=miss; stored').length, 1);
  assert.equal(statuses.filter((s) => s === 'perch; fwd=miss; collapsed; stored').length, 49);
  const outcomes = perch.logs.lines().filter((l) => l.msg === 'request').map((l) => l.cache);
  assert.equal(outcomes.filter((o) => o === 'coalesced').length, 49);
});

test('coalesced requests share an error too, and the error is not stored', async (t) => {
  let release!: () => void;
  const gate = new Promise<void>((resolve) => (release = resolve));
  const { upstream, perch } = await setup(t, (req, res) => void gate.then(() => json(503, {})(req, res)));
  const responses = Array.from({ length: 10 }, () => perch.request('/v1/users/2'));
  await waitFor(() => upstream.requests.length === 1 && perch.received() === 10);
  release();
  const results = await Promise.all(responses);
  assert.ok(results.every((r) => r.status === 502));
  assert.equal(upstream.requests.length, 1);
  upstream.behaviour = sampleProvider;
  assert.equal((await perch.request('/v1/users/2')).status, 200);
});

test('the memory tier is bounded by max_bytes: old entries are evicted', async (t) => {
  const clock = new ManualClock();
  const big = { ...sampleUser('1', 'x'), bio: 'z'.repeat(300_000) };
  const upstream = await startUpstream(t, json(200, big));
  const perch = await startPerch(t, testConfig(v1('main', upstream.url), 'cache: { memory: { max_bytes: 1048576 } }'), { clock });
  for (let id = 1; id <= 5; id++) await perch.request(`/v1/users/${id}`);
  assert.equal(upstream.requests.length, 5);
  await perch.request('/v1/users/5');
  assert.equal(upstream.requests.length, 5, 'newest entry still cached');
  await perch.request('/v1/users/1');
  assert.equal(upstream.requests.length, 6, 'oldest entry evicted');
});
