import assert from 'node:assert/strict';
import { test, type TestContext } from 'node:test';
import { ConfigError, parseConfig } from '../src/config/load.js';
import { ManualClock } from './helpers/clock.js';
import { startPerch, testConfig, v1, waitFor } from './helpers/perch.js';
import { startRedis } from './helpers/redis-server.js';
import { json, sampleProvider, startUpstream, type UpstreamBehaviour } from './helpers/upstream-server.js';

const CACHE = 'cache: { stale_seconds: 600, ttl_seconds: { user: 300 } }';

async function setup(t: TestContext, behaviour: UpstreamBehaviour = sampleProvider, cache = CACHE) {
  const clock = new ManualClock();
  const upstream = await startUpstream(t, behaviour);
  const perch = await startPerch(t, testConfig(v1('main', upstream.url), cache), { clock });
  return { clock, upstream, perch };
}

test('past its TTL an entry is served stale at once while one refresh runs; then fresh again', async (t) => {
  const { clock, upstream, perch } = await setup(t);
  await perch.request('/v1/users/1');
  clock.advance(301_000);
  const stale = await perch.request('/v1/users/1');
  assert.equal(stale.status, 200);
  assert.equal(stale.headers.get('cache-status'), 'perch; fwd=stale; ttl=-1');
  assert.equal(stale.headers.get('age'), '301');
  await waitFor(() => upstream.requests.length === 2);
  await waitFor(() => perch.logs.lines().filter((l) => l.msg === 'request').length === 2);
  const fresh = await perch.request('/v1/users/1');
  assert.equal(fresh.headers.get('cache-status'), 'perch; hit; ttl=300');
  const outcomes = perch.logs.lines().filter((l) => l.msg === 'request').map((l) => l.cache);
  assert.deepEqual(outcomes, ['miss', 'stale', 'hit']);
});

test('concurrent requests for a stale entry share one refresh', async (t) => {
  let release!: () => void;
  const gate = new Promise<void>((resolve) => (release = resolve));
  let calls = 0;
  const { clock, upstream, perch } = await setup(t, (req, res) => (calls++ === 0 ? sampleProvider(req, res) : void gate.then(() => sampleProvider(req, res))));
  await perch.request('/v1/users/1');
  clock.advance(400_000);
  const results = await Promise.all(Array.from({ length: 20 }, () => perch.request('/v1/users/1')));
  assert.ok(results.every((r) => r.status === 200 && r.headers.get('cache-status') === 'perch; fwd=stale; ttl=-100'));
  release();
  await waitFor(() => perch.cache.local('/v1/users/1')?.fresh === true);
  assert.equal(upstream.requests.length, 2);
});

test('an upstream error, 429 or timeout on refresh leaves the stale entry in service (stale-if-error)', async (t) => {
  const { clock, upstream, perch } = await setup(t);
  await perch.request('/v1/users/1');
  clock.advance(310_000);
  // Each refresh is over (its log line written) before the clock moves: a 429 read after the
  // advance would stop calls 5 s past it, and the next refresh would never be made.
  const failures: [UpstreamBehaviour, string][] = [
    [json(503, {}), 'upstream failed'],
    [json(429, {}, { 'retry-after': '5' }), 'provider said stop: cooling down'],
    // The hanging upstream times out (timeout_ms 2000 in tests) without disturbing the entry.
    [() => {}, 'upstream timed out'],
  ];
  for (const [i, [behaviour, logged]] of failures.entries()) {
    upstream.behaviour = behaviour;
    const response = await perch.request('/v1/users/1');
    assert.equal(response.status, 200, `failure ${i}`);
    assert.equal(response.headers.get('cache-status'), `perch; fwd=stale; ttl=-${10 + i * 5}`);
    await waitFor(() => perch.logs.lines().some((l) => l.msg === logged), 10_000);
    assert.equal(upstream.requests.length, 2 + i);
    // The 429 stops calls for its 5 s: the next refresh can only happen after them.
    clock.advance(5_000);
  }
  assert.equal(perch.cache.local('/v1/users/1')?.fresh, false);
});

test('past TTL plus stale_seconds the entry is gone: a plain miss', async (t) => {
  const { clock, upstream, perch } = await setup(t);
  await perch.request('/v1/users/1');
  clock.advance(900_000);
  assert.equal((await perch.request('/v1/users/1')).headers.get('cache-status'), 'perch; fwd=miss; stored');
  assert.equal(upstream.requests.length, 2);
});

test('a stale entry in Redis is served stale by an instance with empty memory', async (t) => {
  const clock = new ManualClock();
  const redis = await startRedis(t);
  const upstream = await startUpstream(t, sampleProvider);
  const yaml = testConfig(v1('main', upstream.url), `cache: { ttl_seconds: { user: 300 }, redis: { url: "${redis.url}" } }`);
  const first = await startPerch(t, yaml, { clock });
  await waitFor(() => first.cache.redisConnected === true);
  await first.request('/v1/users/1');
  clock.advance(305_000);
  const second = await startPerch(t, yaml, { clock });
  await waitFor(() => second.cache.redisConnected === true);
  const response = await second.request('/v1/users/1');
  assert.equal(response.headers.get('cache-status'), 'perch; fwd=stale; ttl=-5');
  assert.equal(response.headers.get('age'), '305');
  await waitFor(() => upstream.requests.length === 2);
});

test('cache.stale_seconds: default 600, an integer from 0 to 86400', () => {
  const base = testConfig('main: { kind: fixture }');
  assert.equal(parseConfig(base, {}).cache.stale_seconds, 600);
  assert.equal(parseConfig(base + 'cache: { stale_seconds: 0 }', {}).cache.stale_seconds, 0);
  for (const bad of ['-1', '86401', '1.5', 'soon']) {
    assert.throws(
      () => parseConfig(base + `cache: { stale_seconds: ${bad} }`, {}),
      (error: unknown) => error instanceof ConfigError && error.problems.some((p) => p.startsWith('cache.stale_seconds: must be an integer from 0 to 86400')),
      bad,
    );
  }
});

test('stale_seconds: 0 by reload stops stale serving at once, from memory and from Redis on two instances; back to 600 it resumes', async (t) => {
  const clock = new ManualClock();
  const redis = await startRedis(t);
  const upstream = await startUpstream(t, sampleProvider);
  const yaml = (stale: number) => testConfig(v1('main', upstream.url), `cache: { stale_seconds: ${stale}, ttl_seconds: { user: 300 }, redis: { url: "${redis.url}" } }`);
  const a = await startPerch(t, yaml(600), { clock });
  const b = await startPerch(t, yaml(600), { clock });
  await waitFor(() => a.cache.redisConnected === true && b.cache.redisConnected === true);
  await a.request('/v1/users/1');
  await a.request('/v1/users/2');
  clock.advance(305_000);
  for (const perch of [a, b]) perch.reload(yaml(0));
  // a has the entry in memory, b only in Redis: neither serves it past its TTL any more.
  assert.equal((await a.request('/v1/users/1')).headers.get('cache-status'), 'perch; fwd=miss; stored');
  assert.equal((await b.request('/v1/users/2')).headers.get('cache-status'), 'perch; fwd=miss; stored');
  assert.equal(upstream.requests.length, 4);
  for (const perch of [a, b]) perch.reload(yaml(600));
  clock.advance(305_000);
  assert.equal((await b.request('/v1/users/1')).headers.get('cache-status'), 'perch; fwd=stale; ttl=-5');
  assert.equal(a.logs.lines().filter((l) => l.msg === 'reload: these settings take effect only after a restart').length, 0);
});
