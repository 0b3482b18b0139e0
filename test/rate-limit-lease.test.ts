import assert from 'node:assert/strict';
import { test, type TestContext } from 'node:test';
import { Redis } from 'ioredis';
import { leaseSize } from '../src/ratelimit/token-bucket.js';
import { ManualClock } from './helpers/clock.js';
import { startPerch, testConfig, v1, waitFor } from './helpers/perch.js';
import { withPlan } from './helpers/plans.js';
import { startRedis, type TestRedis } from './helpers/redis-server.js';
import { sampleProvider, startUpstream } from './helpers/upstream-server.js';
import { onCleanup } from './helpers/cleanup.js';

async function instance(t: TestContext, redis: TestRedis, upstreamUrl: string, plan: string, clock?: ManualClock) {
  const yaml = withPlan(testConfig(v1('main', upstreamUrl), `rate_limits_redis: { url: "${redis.url}", command_timeout_ms: 2000 }`), plan);
  return startPerch(t, yaml, clock === undefined ? {} : { clock, timers: clock });
}

/** Lease script runs so far, from Redis's own command statistics. */
async function leaseCalls(client: Redis): Promise<number> {
  const info = await client.info('commandstats');
  return [...info.matchAll(/^cmdstat_(?:evalsha|eval):calls=(\d+)/gm)].reduce((sum, m) => sum + Number(m[1]), 0);
}

test('leased tokens never add up to more than the bucket gave: two instances, 100 requests, a bucket of 50', { timeout: 20_000 }, async (t) => {
  const redis = await startRedis(t);
  const upstream = await startUpstream(t, sampleProvider);
  // A bucket of 50 that refills one token in 1000 s: the test sees the bucket alone. Lease 5.
  const plan = '{ capacity: 50, refill_per_second: 0.001 }';
  const a = await instance(t, redis, upstream.url, plan);
  const b = await instance(t, redis, upstream.url, plan);
  const statuses: number[] = [];
  for (let i = 0; i < 100; i++) statuses.push((await (i % 2 === 0 ? a : b).request('/v1/users/1')).status);
  assert.equal(statuses.filter((s) => s === 200).length, 50);
  assert.equal(statuses.filter((s) => s === 429).length, 50);
});

test('requests spend a lease locally and take the next one ahead, at a quarter left: the request after the lease needs no Redis round trip', { timeout: 20_000 }, async (t) => {
  const redis = await startRedis(t);
  const client = new Redis(redis.url);
  onCleanup(t, () => client.disconnect());
  const upstream = await startUpstream(t, sampleProvider);
  // Lease min(100, capacity / 10) = 100 tokens, the next taken at 25 left; next to no refill.
  const perch = await instance(t, redis, upstream.url, '{ capacity: 1000, refill_per_second: 0.001 }');
  assert.equal((await perch.request('/v1/users/1')).status, 200);
  const before = await leaseCalls(client);
  for (let i = 0; i < 73; i++) assert.equal((await perch.request('/v1/users/1')).status, 200);
  assert.equal(await leaseCalls(client), before, '74 requests, 26 tokens left: no Redis round trip');
  assert.equal((await perch.request('/v1/users/1')).status, 200);
  await waitFor(async () => (await leaseCalls(client)) === before + 1);
  for (let i = 0; i < 25; i++) assert.equal((await perch.request('/v1/users/1')).status, 200);
  const last = await perch.request('/v1/users/1');
  assert.equal(last.status, 200);
  assert.equal(await leaseCalls(client), before + 1, 'the 101st request spends the lease taken ahead');
  // The shared bucket lent 200 of its 1000 tokens; this instance holds 99 of them: 899 left.
  assert.match(last.headers.get('ratelimit') ?? '', /^"small";r=899;t=\d+$/);
});

test('each lease lapses on its own clock once the bucket would have refilled it, and never before a second', { timeout: 20_000 }, async (t) => {
  const redis = await startRedis(t);
  const client = new Redis(redis.url);
  onCleanup(t, () => client.disconnect());
  const upstream = await startUpstream(t, sampleProvider);
  const clock = new ManualClock();
  // Lease 2 tokens at 0.5 per second: unspent ones lapse 4 s after their lease.
  const perch = await instance(t, redis, upstream.url, '{ capacity: 20, refill_per_second: 0.5 }', clock);
  assert.equal((await perch.request('/v1/users/1')).status, 200);
  const before = await leaseCalls(client);
  clock.advance(3999);
  // The first lease's last token, at 3999 ms: it still holds, and the next lease is taken ahead.
  assert.equal((await perch.request('/v1/users/1')).status, 200);
  await waitFor(async () => (await leaseCalls(client)) === before + 1);
  clock.advance(1);
  assert.equal((await perch.request('/v1/users/1')).status, 200);
  assert.equal(await leaseCalls(client), before + 1, 'served from the lease taken at 3999 ms');
  clock.advance(3998);
  assert.equal((await perch.request('/v1/users/1')).status, 200);
  await waitFor(async () => (await leaseCalls(client)) === before + 2);
  assert.equal(await leaseCalls(client), before + 2, 'its last token at 7998 ms; the next lease taken ahead');
  clock.advance(4002);
  assert.equal((await perch.request('/v1/users/1')).status, 200);
  assert.equal(await leaseCalls(client), before + 3, 'the lease taken ahead at 7998 ms lapsed at 11998 ms: a new lease');
  // At 20 tokens a second a lease of 4 would lapse after 200 ms: it lives a second all the same.
  const fast = await instance(t, redis, upstream.url, '{ capacity: 40, refill_per_second: 20 }', clock);
  await fast.request('/v1/users/1');
  const fastBefore = await leaseCalls(client);
  clock.advance(999);
  await fast.request('/v1/users/1');
  assert.equal(await leaseCalls(client), fastBefore, 'the lease still holds at 999 ms');
  clock.advance(1);
  await fast.request('/v1/users/1');
  assert.equal(await leaseCalls(client), fastBefore + 1, 'lapsed at 1000 ms: a new lease');
});

test('a lease is a tenth of the bucket at most; within that, 100 tokens or a tenth of a second of refill, whichever is more', { timeout: 5000 }, () => {
  assert.deepEqual(
    [leaseSize(19, 1000), leaseSize(50, 0.001), leaseSize(1000, 0.001), leaseSize(1000, 50_000), leaseSize(100_000, 500), leaseSize(100_000, 10_000), leaseSize(1e9, 1e9)],
    [1, 5, 100, 100, 100, 1000, 1e8],
  );
});

test('a fast-refilling plan leases a tenth of a second of refill: 700 requests on one lease of 1000', { timeout: 30_000 }, async (t) => {
  const redis = await startRedis(t);
  const client = new Redis(redis.url);
  onCleanup(t, () => client.disconnect());
  const upstream = await startUpstream(t, sampleProvider);
  // The injected clock stands still, so no lease lapses while the requests run.
  const perch = await instance(t, redis, upstream.url, '{ capacity: 100000, refill_per_second: 10000 }', new ManualClock());
  assert.equal((await perch.request('/v1/users/1')).status, 200);
  const before = await leaseCalls(client);
  for (let i = 0; i < 700; i++) assert.equal((await perch.request('/v1/users/1')).status, 200);
  assert.equal(await leaseCalls(client), before, '701 of 1000 leased tokens spent, 299 left: above the quarter, no Redis round trip');
});
