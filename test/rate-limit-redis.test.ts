import assert from 'node:assert/strict';
import { test, type TestContext } from 'node:test';
import { Redis } from 'ioredis';
import { InsuredLimiter } from '../src/ratelimit/insured-limiter.js';
import { LeasedLimiter } from '../src/ratelimit/leased-limiter.js';
import { MemoryLimiter } from '../src/ratelimit/memory-limiter.js';
import { RedisLimiter } from '../src/ratelimit/redis-limiter.js';
import { compilePlan } from '../src/ratelimit/token-bucket.js';
import { NodeBreakers } from '../src/redis/node-breakers.js';
import { ManualClock } from './helpers/clock.js';
import { captureLogs } from './helpers/log-capture.js';
import { startPerch, testConfig, v1, waitFor, type RunningPerch } from './helpers/perch.js';
import { withPlan } from './helpers/plans.js';
import { startRedis, type TestRedis } from './helpers/redis-server.js';
import { sampleProvider, startUpstream } from './helpers/upstream-server.js';
import { onCleanup } from './helpers/cleanup.js';

const PLAN = '{ capacity: 5, refill_per_second: 1 }';

/**
 * perch with its buckets in `redis`. A generous command timeout keeps a loaded test machine from
 * sending a healthy Redis's requests to the insurance limiter; the fault tests pass their own.
 */
async function perchOn(t: TestContext, redis: TestRedis, options: { timeoutMs?: number; clock?: ManualClock; section?: string; plan?: string } = {}) {
  const upstream = await startUpstream(t, sampleProvider);
  const section = options.section ?? 'rate_limits_redis';
  const redisYaml = `{ url: "${redis.url}", command_timeout_ms: ${options.timeoutMs ?? 2000} }`;
  const extra = section === 'cache.redis' ? `cache: { redis: ${redisYaml} }` : `rate_limits_redis: ${redisYaml}`;
  return startPerch(t, withPlan(testConfig(v1('main', upstream.url), extra), options.plan ?? PLAN), { clock: options.clock });
}

function inspector(t: TestContext, redis: TestRedis): Redis {
  const client = new Redis(redis.url);
  onCleanup(t, () => client.disconnect());
  return client;
}

async function statuses(perch: RunningPerch, n: number): Promise<number[]> {
  const seen: number[] = [];
  for (let i = 0; i < n; i++) seen.push((await perch.request('/v1/users/1')).status);
  return seen;
}

test('with Redis: a burst of 5 passes, the 6th is 429 with Retry-After 1, one passes once it has elapsed', async (t) => {
  const redis = await startRedis(t);
  const perch = await perchOn(t, redis);
  assert.deepEqual(await statuses(perch, 5), [200, 200, 200, 200, 200]);
  const limited = await perch.request('/v1/users/1');
  assert.equal(limited.status, 429);
  assert.deepEqual(limited.json(), { error: { message: 'Rate limit exceeded. Please try again later.', code: 'E429' } });
  assert.equal(limited.headers.get('retry-after'), '1');
  assert.equal(limited.headers.get('ratelimit-policy'), '"small";q=5;w=5');
  assert.match(limited.headers.get('ratelimit')!, /^"small";r=0;t=[45]$/);

  // The bucket is a hash that expires when it would be full again.
  const client = inspector(t, redis);
  const ttl = await client.pttl('perch:rl:alpha');
  assert.ok(ttl > 0 && ttl <= 5000, `pttl ${ttl}`);
  assert.deepEqual(Object.keys(await client.hgetall('perch:rl:alpha')).sort(), ['at', 'tokens']);

  // The 429 rewrote the hash with the ms until full (~5000): once 1000 of them have passed, a
  // token is back. Waiting on Redis's own countdown, not a sleep, keeps this exact under load.
  const untilFull = await client.pttl('perch:rl:alpha');
  await waitFor(async () => (await client.pttl('perch:rl:alpha')) <= untilFull - 1000);
  assert.equal((await perch.request('/v1/users/1')).status, 200);
  assert.equal(perch.logs.lines().filter((l) => l.level === 40).length, 0);
});

test('a Redis bucket refills to its capacity and never past it', async (t) => {
  const redis = await startRedis(t);
  const perch = await perchOn(t, redis);
  const client = inspector(t, redis);
  // A full bucket last touched in 1970: decades of refill must still stop at the capacity.
  await client.hset('perch:rl:alpha', 'tokens', '5', 'at', '0');
  const first = await perch.request('/v1/users/1');
  assert.equal(first.headers.get('ratelimit'), '"small";r=4;t=1');
  assert.equal(Math.floor(Number(await client.hget('perch:rl:alpha', 'tokens'))), 4);
  assert.deepEqual(await statuses(perch, 5), [200, 200, 200, 200, 429]);
});

test('two instances share one bucket through Redis, even with clocks a year apart', async (t) => {
  const redis = await startRedis(t);
  const a = await perchOn(t, redis);
  const b = await perchOn(t, redis, { clock: new ManualClock(Date.now() - 365 * 86_400_000) });
  const seen: number[] = [];
  for (let i = 0; i < 6; i++) seen.push((await (i % 2 === 0 ? a : b).request('/v1/users/1')).status);
  assert.deepEqual(seen, [200, 200, 200, 200, 200, 429]);
  assert.equal((await a.request('/v1/users/1')).status, 429);
});

test('the buckets use cache.redis when rate_limits_redis is absent', async (t) => {
  const redis = await startRedis(t);
  const perch = await perchOn(t, redis, { section: 'cache.redis' });
  await perch.request('/v1/users/1');
  assert.equal(await inspector(t, redis).hget('perch:rl:alpha', 'tokens').then(Number), 4);
});

test('Redis killed: the insurance limiter decides, no request fails, and the switch is logged once each way', async (t) => {
  const redis = await startRedis(t);
  // The injected clock stands still: the memory bucket refills nothing while the test runs.
  const perch = await perchOn(t, redis, { timeoutMs: 200, clock: new ManualClock() });
  assert.deepEqual(await statuses(perch, 3), [200, 200, 200]);
  await redis.kill();

  // The insurance buckets carry on from the bucket as Redis last reported it: 2 tokens left.
  assert.deepEqual(await statuses(perch, 4), [200, 200, 429, 429]);
  const warnings = perch.logs.lines().filter((l) => l.msg === 'rate limits: Redis failed, falling back to per-instance memory buckets');
  assert.equal(warnings.length, 1);
  assert.equal(warnings[0]!.level, 40);

  assert.ok(!perch.logs.text().includes('Redis answers again'));
  await redis.restart();
  // Requests keep coming while Redis restarts; one of them finds it back.
  await waitFor(async () => {
    const res = await perch.request('/v1/users/1');
    assert.ok(res.status === 200 || res.status === 429, `status ${res.status}`);
    return perch.logs.text().includes('rate limits: Redis answers again');
  }, 10_000);
  assert.equal(perch.logs.lines().filter((l) => l.msg === 'rate limits: Redis answers again, buckets are shared again' && l.level === 30).length, 1);
});

test('Redis frozen: every request still answers quickly, decided by the insurance limiter', async (t) => {
  const redis = await startRedis(t);
  // A token in 10 s: what the memory bucket refills while the test runs rounds to none.
  const perch = await perchOn(t, redis, { timeoutMs: 100, plan: '{ capacity: 6, refill_per_second: 0.1 }' });
  assert.equal((await perch.request('/v1/users/1')).status, 200);
  redis.freeze();
  onCleanup(t, () => redis.thaw());
  // The memory bucket carries on from Redis's last answer: 5 left.
  for (let i = 0; i < 5; i++) {
    const started = Date.now();
    const res = await perch.request('/v1/users/1');
    assert.equal(res.status, 200);
    assert.equal(res.headers.get('ratelimit-policy'), '"small";q=6;w=60');
    // Bounded by the command timeout, not by Redis: generous for a loaded machine.
    assert.ok(Date.now() - started < 1500, `took ${Date.now() - started} ms`);
  }
  assert.equal((await perch.request('/v1/users/1')).status, 429);
  assert.ok(perch.logs.text().includes('falling back to per-instance memory buckets'));
  // Five timeouts in a row open the limiter's breaker: later requests do not ask Redis at all.
  const breakerLog = (msg: string) => perch.logs.lines().some((l) => l.msg === msg && l.dependency === 'rate-limit redis');
  assert.ok(breakerLog('circuit breaker open: skipping dependency'));
  redis.thaw();
  // After the cool-down one probe reaches Redis again, and its success closes the breaker.
  await waitFor(async () => {
    const status = (await perch.request('/v1/users/2')).status;
    assert.ok(status === 200 || status === 429, `status ${status}`);
    return breakerLog('circuit breaker closed: dependency is back');
  }, 10_000);
});

test('a breaker opened by others on the node (the cache tier) logs the buckets falling back to memory, and back', async (t) => {
  const redis = await startRedis(t);
  const client = new Redis(redis.url);
  onCleanup(t, () => client.disconnect());
  const clock = new ManualClock();
  const logs = captureLogs();
  const breakers = new NodeBreakers(client, { clock, logger: logs.logger, name: 'redis cache' });
  const memory = new MemoryLimiter(clock, { insurance: true });
  const leased = new LeasedLimiter(new RedisLimiter(client, { prefix: 'perch:', commandTimeoutMs: 2000, insurance: memory }), { clock, timers: clock, breakers });
  const limiter = new InsuredLimiter(leased, memory, breakers, logs.logger);
  const plan = compilePlan('small', { capacity: 5, refill_per_second: 1, cost_of_hit: 1, provider_weight: 1 }, { dialects: ['ietf'], clock });
  assert.equal((await limiter.take('alpha', plan, 1)).allowed, true);
  // Five failures of the cache tier on the same node open the breaker the buckets ask too.
  const breaker = breakers.for(leased.redisKey('alpha'));
  for (let i = 0; i < 5; i++) breaker.failure();
  const switches = () => logs.lines().filter((l) => String(l.msg).startsWith('rate limits:')).map((l) => [l.level, l.msg, l.reason]);
  const fromMemory = limiter.take('alpha', plan, 1);
  assert.ok(!(fromMemory instanceof Promise), 'answered by memory at once');
  assert.equal(fromMemory.tokens, 3);
  assert.deepEqual(switches(), [[40, 'rate limits: Redis failed, falling back to per-instance memory buckets', 'circuit breaker open']]);
  limiter.take('alpha', plan, 1);
  assert.equal(switches().length, 1, 'once per change');
  clock.advance(2000);
  await limiter.take('alpha', plan, 1);
  assert.deepEqual(switches()[1], [30, 'rate limits: Redis answers again, buckets are shared again', undefined]);
});
