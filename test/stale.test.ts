import assert from 'node:assert/strict';
import { test, type TestContext } from 'node:test';
import { ConfigError, parseConfig } from '../src/config/load.js';
import { ManualClock } from './helpers/clock.js';
import { KEY, startPerch, testConfig, v1, waitFor } from './helpers/perch.js';
import { sampleUser } from './helpers/sample-bodies.js';
import { startTcpProxy } from './helpers/tcp-proxy.js';
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

test('an entry asked for in the very millisecond its TTL ends is stale with ttl=-1, never ttl=0', async (t) => {
  const { clock, perch } = await setup(t);
  await perch.request('/v1/users/1');
  clock.advance(300_000);
  const stale = await perch.request('/v1/users/1');
  assert.equal(stale.headers.get('cache-status'), 'perch; fwd=stale; ttl=-1');
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
  let late = 10;
  for (const [i, [behaviour, logged]] of failures.entries()) {
    upstream.behaviour = behaviour;
    const response = await perch.request('/v1/users/1');
    assert.equal(response.status, 200, `failure ${i}`);
    assert.equal(response.headers.get('cache-status'), `perch; fwd=stale; ttl=-${late}`);
    await waitFor(() => perch.logs.lines().some((l) => l.msg === logged), 10_000);
    assert.equal(upstream.requests.length, 2 + i);
    // The next refresh waits out the key's backoff, 5 s after the first failure, then 10 s
    // (which also outlasts the 429's 5 s stop).
    clock.advance(5_000 * 2 ** i);
    late += 5 * 2 ** i;
  }
  assert.equal(perch.cache.local('/v1/users/1')?.fresh, false);
});

test('a failing refresh is not started again until its backoff ends: 5 s, doubling per failure, reset by an answer', async (t) => {
  const { clock, upstream, perch } = await setup(t);
  await perch.request('/v1/users/1');
  clock.advance(301_000);
  upstream.behaviour = json(503, {});
  const failed = () => perch.logs.lines().filter((l) => l.msg === 'upstream failed').length;
  /**
   * A stale request that starts a refresh, which fails (the clock held until it has); then
   * requests every second until `waitMs` later, which start none.
   */
  const failingRefresh = async (waitMs: number) => {
    const calls = upstream.requests.length;
    const failures = failed();
    assert.equal((await perch.request('/v1/users/1')).status, 200);
    await waitFor(() => failed() === failures + 1);
    assert.equal(upstream.requests.length, calls + 1, 'a refresh');
    for (let at = 1000; at < waitMs; at += 1000) {
      clock.advance(1000);
      assert.equal((await perch.request('/v1/users/1')).status, 200);
    }
    assert.equal(upstream.requests.length, calls + 1, `no other call for ${waitMs} ms`);
    clock.advance(1000);
  };
  await failingRefresh(5000);
  await failingRefresh(10_000);
  await failingRefresh(20_000);
  upstream.behaviour = sampleProvider;
  assert.equal((await perch.request('/v1/users/1')).status, 200);
  await waitFor(() => perch.cache.local('/v1/users/1')?.fresh === true);
  assert.equal(upstream.requests.length, 5, 'the wait over, a refresh that succeeds');
  // Stale again: the backoff starts over from 5 s.
  clock.advance(300_000);
  upstream.behaviour = json(503, {});
  await failingRefresh(5000);
  await failingRefresh(10_000);
  assert.equal(upstream.requests.length, 7);
});

test('a refresh the provider answers 400 on the cursor ends stale serving: 600 s of steady requests make 7 calls', { timeout: 60_000 }, async (t) => {
  const { clock, upstream, perch } = await setup(t, sampleProvider, 'cache: { stale_seconds: 600, ttl_seconds: { tweets: 60 } }');
  const path = '/v1/users/1/tweets?cursor=abc';
  assert.equal((await perch.request(path)).status, 200);
  clock.advance(61_000);
  // The provider no longer knows the cursor.
  upstream.behaviour = json(400, { errors: [{ message: 'bad cursor' }] });
  const stale = await perch.request(path);
  assert.deepEqual([stale.status, stale.headers.get('cache-status')], [200, 'perch; fwd=stale; ttl=-1']);
  await waitFor(() => perch.logs.lines().some((l) => l.msg === 'refresh rejected by the provider: stale entry dropped'));
  assert.equal(perch.cache.local(path), undefined, 'the stale entry is gone');
  const calledAt: number[] = [];
  const start = clock.now();
  for (let second = 0; second < 600; second++) {
    const before = upstream.requests.length;
    const res = await perch.request(path);
    assert.deepEqual([res.status, res.json().error.code], [400, 'E400'], `at ${second} s`);
    if (upstream.requests.length > before) calledAt.push((clock.now() - start) / 1000);
    else assert.equal(res.headers.get('cache-status'), 'perch; fwd=miss; collapsed; detail=refresh-backoff');
    clock.advance(1000);
  }
  // The refresh at 0 s, then one call each time the doubling wait ends, capped at 300 s.
  assert.deepEqual(calledAt, [5, 15, 35, 75, 155, 315]);
  assert.equal(upstream.requests.length, 1 + 1 + 6);
  // The cursor valid again: its first call after the wait stores it and ends the backoff.
  upstream.behaviour = sampleProvider;
  clock.advance(300_000);
  assert.equal((await perch.request(path)).headers.get('cache-status'), 'perch; fwd=miss; stored');
  assert.equal((await perch.request(path)).headers.get('cache-status'), 'perch; hit; ttl=60');
});

test('a refresh rejected on its cursor drops the entry from Redis too: another instance does not serve it stale', async (t) => {
  const clock = new ManualClock();
  const redis = await startRedis(t);
  const upstream = await startUpstream(t, sampleProvider);
  const yaml = testConfig(v1('main', upstream.url), `cache: { ttl_seconds: { tweets: 60 }, redis: { url: "${redis.url}" } }`);
  const a = await startPerch(t, yaml, { clock });
  await waitFor(() => a.cache.redisConnected === true);
  const path = '/v1/users/1/tweets?cursor=abc';
  assert.equal((await a.request(path)).status, 200);
  clock.advance(61_000);
  upstream.behaviour = json(400, {});
  assert.equal((await a.request(path)).headers.get('cache-status'), 'perch; fwd=stale; ttl=-1');
  await waitFor(() => a.logs.lines().some((l) => l.msg === 'refresh rejected by the provider: stale entry dropped'));
  const b = await startPerch(t, yaml, { clock });
  await waitFor(() => b.cache.redisConnected === true);
  await waitFor(async () => (await b.cache.remote(path)) === undefined);
  const res = await b.request(path);
  assert.deepEqual([res.status, res.headers.get('cache-status')], [400, 'perch; fwd=miss']);
  assert.equal(upstream.requests.length, 3);
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

test('a Redis read that returns after a refresh landed never brings the older entry back (issue 50)', { timeout: 30_000 }, async (t) => {
  const clock = new ManualClock();
  const redis = await startRedis(t);
  // The cache's Redis through a relay that can hold its replies; the token buckets on Redis directly.
  const proxy = await startTcpProxy(t, redis.port);
  let version = 0;
  const answers: (() => void)[] = [];
  const upstream = await startUpstream(t, (req, res) => {
    const body = { ...sampleUser('1', 'alice'), followers_count: ++version };
    answers.push(() => json(200, body)(req, res));
  });
  const yaml = testConfig(
    v1('main', upstream.url),
    `cache: { ttl_seconds: { user: 300 }, redis: { url: "${proxy.url}", command_timeout_ms: 10000 } }\nrate_limits_redis: { url: "${redis.url}" }`,
  );
  const perch = await startPerch(t, yaml, { clock });
  await waitFor(() => perch.cache.redisConnected === true);
  const followers = async (res: Response) => (JSON.parse(await res.text()) as { followers_count: number }).followers_count;
  const get = () => fetch(`${perch.url}/v1/users/1`, { headers: { 'x-api-key': KEY } });

  const first = get();
  await waitFor(() => answers.length === 1);
  answers.shift()!();
  assert.equal(await followers(await first), 1);
  await perch.cache.settled();
  clock.advance(301_000);
  // R1 is served the stale entry and starts the refresh, whose answer the provider holds.
  const r1 = await get();
  assert.equal(r1.headers.get('cache-status'), 'perch; fwd=stale; ttl=-1');
  assert.equal(await followers(r1), 1);
  await waitFor(() => answers.length === 1);
  // R2's Redis GET goes out and Redis answers it with the old entry, held in the relay.
  const heldBytes = proxy.hold();
  const r2 = get();
  await waitFor(() => heldBytes() > 0);
  // The refresh lands in memory; R3 is a fresh memory hit on it.
  answers.shift()!();
  await waitFor(() => perch.cache.local('/v1/users/1')?.fresh === true);
  const r3 = await get();
  assert.equal(r3.headers.get('cache-status'), 'perch; hit; ttl=300');
  assert.equal(await followers(r3), 2);
  // Then R2's reply comes back: the older entry, which must serve no one now.
  proxy.release();
  assert.equal(await followers(await r2), 2);
  const r4 = await get();
  assert.equal(r4.headers.get('cache-status'), 'perch; hit; ttl=300');
  assert.equal(await followers(r4), 2);
  await perch.cache.settled();
  assert.equal(upstream.requests.length, 2, 'no second refresh');
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
