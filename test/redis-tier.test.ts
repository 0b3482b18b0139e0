import assert from 'node:assert/strict';
import { test, type TestContext } from 'node:test';
import { Redis } from 'ioredis';
import { createRedisClient } from '../src/redis/redis-client.js';
import { ManualClock } from './helpers/clock.js';
import { startPerch, testConfig, v1, waitFor, type RunningPerch } from './helpers/perch.js';
import { startRedis, type TestRedis } from './helpers/redis-server.js';
import { sampleProvider, startUpstream, type TestUpstream, type UpstreamBehaviour } from './helpers/upstream-server.js';
import { onCleanup } from './helpers/cleanup.js';

/** Each request must be answered within the command timeout plus a margin generous for 2 loaded cores. */
const FAST_MS = 500;

function redisYaml(redis: TestRedis, extra = ''): string {
  return `cache: { stale_seconds: 0, ttl_seconds: { user: 300 }, redis: { url: "${redis.url}", prefix: "t:"${extra} } }`;
}

async function startShared(t: TestContext, redis: TestRedis, upstream: TestUpstream, clock: ManualClock, extra = ''): Promise<RunningPerch> {
  const perch = await startPerch(t, testConfig(v1('main', upstream.url), redisYaml(redis, extra)), { clock });
  await waitFor(() => perch.cache.redisConnected === true);
  return perch;
}

async function setup(t: TestContext, behaviour: UpstreamBehaviour = sampleProvider) {
  const clock = new ManualClock();
  const redis = await startRedis(t);
  const upstream = await startUpstream(t, behaviour);
  return { clock, redis, upstream };
}

async function timed(perch: RunningPerch, path: string): Promise<{ status: number; ms: number; cacheStatus: string | null }> {
  const started = performance.now();
  const response = await perch.request(path);
  return { status: response.status, ms: performance.now() - started, cacheStatus: response.headers.get('cache-status') };
}

test('an entry stored by one instance is a Redis hit on another, with true Age, then a memory hit', async (t) => {
  const { clock, redis, upstream } = await setup(t);
  const a = await startShared(t, redis, upstream, clock);
  const b = await startShared(t, redis, upstream, clock);
  const miss = await a.request('/v1/users/1');
  assert.equal(miss.headers.get('cache-status'), 'perch; fwd=miss; stored');
  clock.advance(42_500);
  const fromRedis = await b.request('/v1/users/1');
  assert.equal(fromRedis.text, miss.text);
  assert.equal(fromRedis.headers.get('cache-status'), 'perch; hit; ttl=257; detail=redis');
  assert.equal(fromRedis.headers.get('age'), '42');
  // The Redis hit refilled b's memory: the next hit needs no Redis at all.
  await redis.kill();
  const fromMemory = await b.request('/v1/users/1');
  assert.equal(fromMemory.headers.get('cache-status'), 'perch; hit; ttl=257');
  assert.equal(upstream.requests.length, 1);
});

test('a new instance (empty memory) answers what an earlier one cached, without the upstream', async (t) => {
  const { clock, redis, upstream } = await setup(t);
  const first = await startShared(t, redis, upstream, clock);
  await first.request('/v1/users/1/tweets?cursor=abc');
  await first.request('/v1/users/by/username/alice');
  const second = await startShared(t, redis, upstream, clock);
  for (const path of ['/v1/users/1/tweets?cursor=abc', '/v1/users/by/username/ALICE']) {
    const response = await second.request(path);
    assert.equal(response.status, 200);
    assert.match(response.headers.get('cache-status') ?? '', /^perch; hit; ttl=\d+; detail=redis$/);
  }
  assert.equal(upstream.requests.length, 2);
});

test('Redis killed mid-test: requests are answered fast from memory or upstream; the breaker opens, then closes after restart', async (t) => {
  const { clock, redis, upstream } = await setup(t);
  const perch = await startShared(t, redis, upstream, clock);
  await perch.request('/v1/users/1');
  await redis.kill();
  for (let i = 2; i < 22; i++) {
    for (const path of ['/v1/users/1', `/v1/users/${i}`]) {
      const r = await timed(perch, path);
      assert.equal(r.status, 200, path);
      assert.ok(r.ms < FAST_MS, `${path} took ${r.ms} ms`);
    }
  }
  assert.equal(perch.cache.redisState, 'open');
  // The rate limits share these breakers: the leases a new key takes as its traffic grows fail
  // too, so some of the failures that opened the breaker are theirs, not the cache's.
  assert.ok(perch.cache.redisStats!.errors >= 1);
  assert.ok(perch.cache.redisStats!.skipped > 0);
  assert.equal(upstream.requests.length, 21);
  // The provider guard has breakers of its own on the same Redis; this test is about the cache's.
  const warnings = perch.logs.lines().filter((l) => l.msg === 'circuit breaker open: skipping dependency' && l.dependency === 'redis cache');
  assert.equal(warnings.length, 1);
  // One line for the first failed call; the others wait for the interval's summary.
  assert.equal(perch.logs.lines().filter((l) => String(l.msg).startsWith('redis call') && l.dependency === 'redis cache').length, 1);

  await redis.restart();
  // Resynced too: until then an instance writes nothing to Redis (docs/caching.md).
  await waitFor(() => perch.cache.redisConnected === true && perch.cache.current);
  clock.advance(2000);
  assert.equal((await perch.request('/v1/users/100')).status, 200);
  assert.equal(perch.cache.redisState, 'closed');
  assert.equal(perch.logs.lines().filter((l) => l.msg === 'circuit breaker closed: dependency is back' && l.dependency === 'redis cache').length, 1);
  // Back in use: a fresh instance finds what was stored after the restart.
  const fresh = await startShared(t, redis, upstream, clock);
  assert.equal((await fresh.request('/v1/users/100')).headers.get('cache-status'), 'perch; hit; ttl=300; detail=redis');
});

test('Redis frozen (SIGSTOP): requests still answered within the command timeout, the breaker opens, and closes after thaw', async (t) => {
  const { clock, redis, upstream } = await setup(t);
  const perch = await startShared(t, redis, upstream, clock);
  await perch.request('/v1/users/1');
  redis.freeze();
  const results = await Promise.all(
    Array.from({ length: 10 }, async (_, i) => [await timed(perch, '/v1/users/1'), await timed(perch, `/v1/users/${i + 2}`)]),
  );
  for (const r of results.flat()) {
    assert.equal(r.status, 200);
    assert.ok(r.ms < FAST_MS, `took ${r.ms} ms`);
  }
  assert.equal(perch.cache.redisState, 'open');
  redis.thaw();
  clock.advance(2000);
  // The probe may still meet the replies of timed-out commands; a few tries reach a clean one.
  for (let i = 0; i < 20 && (perch.cache.redisState as string) !== 'closed'; i++) {
    await perch.request(`/v1/users/${200 + i}`);
    clock.advance(2000);
  }
  assert.equal(perch.cache.redisState, 'closed');
});

test('a lease taken while Redis stalls is released after it resumes, so no key is left locked', async (t) => {
  const { clock, redis, upstream } = await setup(t);
  const perch = await startShared(t, redis, upstream, clock);
  redis.freeze();
  // The lease SET times out in perch but stays queued in the stalled Redis, which runs it on
  // resume; the release perch sent after its fetch follows it on the same connection.
  assert.equal((await perch.request('/v1/users/77/tweets')).status, 200);
  redis.thaw();
  const client = createRedisClient({ url: redis.url, prefix: 't:', command_timeout_ms: 1000 }, 'test');
  onCleanup(t, () => client.disconnect());
  await waitFor(() => client.status === 'ready');
  // A command sent now runs after everything queued before it, so the answer is final.
  assert.equal(await client.exists('t:lock:/v1/users/77/tweets'), 0);
});

test('2 instances x 50 concurrent identical misses make exactly 1 upstream request', async (t) => {
  let release!: () => void;
  const gate = new Promise<void>((resolve) => (release = resolve));
  const { clock, redis, upstream } = await setup(t, (req, res) => void gate.then(() => sampleProvider(req, res)));
  const a = await startShared(t, redis, upstream, clock);
  const b = await startShared(t, redis, upstream, clock);
  const responses = [a, b].flatMap((perch) => Array.from({ length: 50 }, () => perch.request('/v1/users/9/tweets?cursor=c1')));
  await waitFor(() => upstream.requests.length === 1 && a.received() === 50 && b.received() === 50);
  // Let the instance without the lease reach its polling loop before the holder answers: the
  // holder's lease was taken (its call is out), and one more lease attempt (a script) ran since,
  // which only the other instance makes.
  const client = new Redis(redis.url);
  onCleanup(t, () => client.disconnect());
  const evals = async () => Number(/cmdstat_eval:calls=(\d+)/.exec(await client.info('commandstats'))?.[1] ?? 0);
  const before = await evals();
  await waitFor(async () => (await evals()) > before);
  release();
  const results = await Promise.all(responses);
  assert.equal(upstream.requests.length, 1);
  assert.ok(results.every((r) => r.status === 200 && r.text === results[0]!.text));
  const statuses = results.map((r) => r.headers.get('cache-status'));
  assert.equal(statuses.filter((s) => s === 'perch; fwd=miss; stored').length, 1);
  assert.equal(statuses.filter((s) => s === 'perch; fwd=miss; collapsed; stored').length, 49);
  assert.equal(statuses.filter((s) => s === 'perch; fwd=miss; collapsed; detail=redis').length, 50);
  // Cached either way: B's requests, answered with A's entry from Redis, may be reused as long.
  assert.deepEqual(new Set(results.map((r) => r.headers.get('cache-control'))), new Set(['private, max-age=60']));
  // Whichever instance took the lease, the other's answers came from Redis, with their Age.
  const fromRedis = results.filter((r) => r.headers.get('cache-status') === 'perch; fwd=miss; collapsed; detail=redis');
  assert.deepEqual(fromRedis.map((r) => r.headers.get('age')), Array(50).fill('0'));
});

test('2 instances, a leader retrying for 5 s: the lease covers its miss_deadline_ms, as a reload set it, so the other makes no call', { timeout: 30_000 }, async (t) => {
  const redis = await startRedis(t);
  // After one call per instance, two calls get no answer (each times out after 2.5 s).
  const upstream = await startUpstream(t, (req, res) => ([3, 4].includes(upstream.requests.length) ? undefined : sampleProvider(req, res)));
  const main = v1('main', upstream.url, 'timeout_ms: 2500, retries: 2, retry_budget_min_per_second: 10000');
  const yaml = (deadlineMs: number) => testConfig(main, redisYaml(redis)).replace('port: 0 }', `port: 0, miss_deadline_ms: ${deadlineMs} }`);
  const a = await startPerch(t, yaml(3000));
  const b = await startPerch(t, yaml(3000));
  await waitFor(() => a.cache.redisConnected === true && b.cache.redisConnected === true);
  // Started with a deadline too short for the retries, under which each takes a lease; the
  // reload gives the leader 8 s.
  assert.deepEqual([(await a.request('/v1/users/1')).status, (await b.request('/v1/users/2')).status], [200, 200]);
  for (const perch of [a, b]) perch.reload(yaml(8000));
  const leader = a.request('/v1/users/3');
  await waitFor(() => upstream.requests.length === 3);
  const follower = await b.request('/v1/users/3');
  assert.deepEqual([(await leader).status, (await leader).headers.get('cache-status')], [200, 'perch; fwd=miss; stored']);
  assert.deepEqual([follower.status, follower.headers.get('cache-status')], [200, 'perch; fwd=miss; collapsed; detail=redis']);
  assert.equal(upstream.requests.length, 5, "the leader's three attempts, and none from the other instance");
});

test('a lease left by a crashed holder delays a miss only until it expires', async (t) => {
  const { clock, redis, upstream } = await setup(t);
  const perch = await startShared(t, redis, upstream, clock);
  const client = createRedisClient({ url: redis.url, prefix: 't:', command_timeout_ms: 1000 }, 'test');
  onCleanup(t, () => client.disconnect());
  await new Promise((resolve) => client.once('ready', resolve));
  // The lease is per purge generation: 0.0 before any purge.
  await client.set('t:lock:0.0:/v1/users/5', 'crashed-holder', 'PX', 300);
  const r = await timed(perch, '/v1/users/5');
  assert.equal(r.status, 200);
  assert.equal(r.cacheStatus, 'perch; fwd=miss; stored');
  assert.ok(r.ms >= 250 && r.ms < 3000, `waited ${r.ms} ms`);
  assert.equal(upstream.requests.length, 1);
});

test('a miss that waited on another instance\'s lease has only the rest of its miss_deadline_ms once the lease is freed', { timeout: 30_000 }, async (t) => {
  const redis = await startRedis(t);
  // The provider never answers: each call ends at its timeout.
  const upstream = await startUpstream(t, () => undefined);
  const main = v1('main', upstream.url, 'timeout_ms: 2000, retries: 0');
  const yaml = testConfig(main, redisYaml(redis)).replace('port: 0 }', 'port: 0, miss_deadline_ms: 3000 }');
  const a = await startPerch(t, yaml);
  const b = await startPerch(t, yaml);
  await waitFor(() => a.cache.redisConnected === true && b.cache.redisConnected === true);
  const leader = a.request('/v1/users/1');
  await waitFor(() => upstream.requests.length === 1);
  // B waits on A's lease until A's call times out (2 s), then has about 1 s of its 3 s left.
  const follower = await timed(b, '/v1/users/1');
  assert.equal((await leader).status, 504);
  assert.equal(follower.status, 504);
  assert.equal(upstream.requests.length, 2);
  assert.ok(follower.ms < 3000 + 400, `answered after ${Math.round(follower.ms)} ms, miss_deadline_ms 3000`);
});
