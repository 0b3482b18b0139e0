import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test, type TestContext } from 'node:test';
import { Redis } from 'ioredis';
import type { Client } from '../src/auth/key-store.js';
import { parseConfig } from '../src/config/load.js';
import { RateLimits } from '../src/ratelimit/rate-limits.js';
import { leaseSize, type Plan } from '../src/ratelimit/token-bucket.js';
import { GuardedRedis } from '../src/redis/guarded-redis.js';
import { createRedisClient } from '../src/redis/redis-client.js';
import { ManualClock } from './helpers/clock.js';
import { captureLogs } from './helpers/log-capture.js';
import { KEY, startPerch, testConfig, v1, waitFor } from './helpers/perch.js';
import { spawnPerch } from './helpers/perch-process.js';
import { withPlan } from './helpers/plans.js';
import { startRedis, type TestRedis } from './helpers/redis-server.js';
import { sampleProvider, startUpstream } from './helpers/upstream-server.js';
import { tempDir } from './helpers/temp-dir.js';
import { onCleanup } from './helpers/cleanup.js';

async function instance(t: TestContext, redis: TestRedis, upstreamUrl: string, plan: string, clock?: ManualClock) {
  const yaml = withPlan(testConfig(v1('main', upstreamUrl), `rate_limits_redis: { url: "${redis.url}", command_timeout_ms: 2000 }`), plan);
  return startPerch(t, yaml, clock === undefined ? {} : { clock, timers: clock });
}

const ALPHA: Client = { id: 'alpha', plan: 'small' };

/** Lease and take scripts run so far, from Redis's own command statistics. */
async function leaseCalls(client: Redis): Promise<number> {
  const info = await client.info('commandstats');
  return [...info.matchAll(/^cmdstat_(?:evalsha|eval):calls=(\d+)/gm)].reduce((sum, m) => sum + Number(m[1]), 0);
}

interface Fleet {
  readonly instances: readonly RateLimits[];
  readonly guards: readonly GuardedRedis[];
  readonly plan: Plan;
  /** One take of one token by instance `i`: whether it was allowed. */
  take(i: number): Promise<boolean>;
  /** The shared bucket as Redis holds it: its tokens (absent: full) and the instances counted. */
  bucket(): Promise<{ tokens: number | undefined; instances: number }>;
}

/**
 * `n` instances' rate limits (the objects perch builds, each with its own instance id and
 * breakers) over one real redis-server, on one injected clock.
 */
async function fleet(t: TestContext, redis: TestRedis, n: number, planYaml: string, clock: ManualClock, timeoutMs = 2000): Promise<Fleet> {
  const config = parseConfig(
    withPlan(testConfig(v1('main', 'http://127.0.0.1:1'), `rate_limits_redis: { url: "${redis.url}", command_timeout_ms: ${timeoutMs} }`), planYaml),
    {},
  );
  const settings = config.rate_limits_redis!;
  const client = createRedisClient(settings, 'lease-test', 'rate_limits_redis');
  // Each instance listens for the one client's connection events.
  client.setMaxListeners(0);
  onCleanup(t, () => client.disconnect());
  const inspector = new Redis(redis.url);
  onCleanup(t, () => inspector.disconnect());
  const { logger } = captureLogs();
  const guards = Array.from({ length: n }, () => new GuardedRedis(client, { clock, logger, name: 'rate-limit redis' }));
  const instances = guards.map((guard) => new RateLimits(config, { clock, timers: clock, logger, redis: { settings, guard } }));
  const plan = instances[0]!.plan(config, ALPHA);
  return {
    instances,
    guards,
    plan,
    take: async (i) => (await instances[i]!.take(ALPHA, instances[i]!.plan(config, ALPHA), 1)).allowed,
    async bucket() {
      const hash = await inspector.hgetall('perch:rl:alpha');
      return { tokens: hash.tokens === undefined ? undefined : Number(hash.tokens), instances: Object.keys(hash).filter((k) => k.startsWith('i:')).length };
    },
  };
}

/** Round-robin takes over the fleet, one at a time: how many were allowed. */
async function roundRobin(f: Fleet, requests: number): Promise<number> {
  let allowed = 0;
  for (let i = 0; i < requests; i++) if (await f.take(i % f.instances.length)) allowed++;
  return allowed;
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

for (const [n, capacity] of [
  [12, 600],
  [50, 1000],
] as const) {
  test(`${n} instances share a bucket of ${capacity} exactly: ${capacity} requests round-robin are all allowed, the next ${n} refused`, { timeout: 60_000 }, async (t) => {
    const redis = await startRedis(t);
    // Next to no refill, and the injected clock stands still: no lease lapses, the bucket alone decides.
    const f = await fleet(t, redis, n, `{ capacity: ${capacity}, refill_per_second: 0.001 }`, new ManualClock());
    assert.equal(f.plan.lease, capacity / 10);
    const allowed = await roundRobin(f, capacity);
    t.diagnostic(`${n} instances, capacity ${capacity}: ${allowed} of ${capacity} allowed`);
    assert.equal(allowed, capacity);
    assert.equal(await roundRobin(f, n), 0);
    assert.equal((await f.bucket()).instances, n, 'every instance counted among those that lease');
  });
}

test('a lease asks for twice what the last one got, from 1 up to the plan\'s lease, each taken ahead: 300 requests, 9 leases', { timeout: 20_000 }, async (t) => {
  const redis = await startRedis(t);
  const f = await fleet(t, redis, 2, '{ capacity: 1000, refill_per_second: 0.001 }', new ManualClock());
  const inspector = new Redis(redis.url);
  onCleanup(t, () => inspector.disconnect());
  assert.equal(await f.take(1), true);
  // Instance 1's lease of 1 and the 2 it took ahead; then instance 0 alone.
  await waitFor(async () => Math.round((await f.bucket()).tokens!) === 997);
  const before = await leaseCalls(inspector);
  for (let i = 0; i < 300; i++) assert.equal(await f.take(0), true);
  // 1, 2, 4, 8, 16, 32, 64, 100 and 100 (327): the ninth taken ahead once 25 of the eighth were left.
  await waitFor(async () => Math.round((await f.bucket()).tokens!) === 997 - 327);
  assert.equal(await leaseCalls(inspector), before + 9);
  assert.equal((await f.bucket()).instances, 2);
});

test('unspent tokens go back to the bucket when their lease lapses, a second after it was asked for, all of them', { timeout: 20_000 }, async (t) => {
  const redis = await startRedis(t);
  const clock = new ManualClock();
  const f = await fleet(t, redis, 2, '{ capacity: 100, refill_per_second: 0.001 }', clock);
  for (let i = 0; i < 10; i++) assert.equal(await f.take(0), true);
  // Leases of 1, 2, 4 and 8 (the last taken ahead at 1 left) for 10 requests: 15 out, 5 unspent.
  await waitFor(async () => Math.round((await f.bucket()).tokens!) === 85);
  clock.advance(999);
  assert.equal(Math.round((await f.bucket()).tokens!), 85, 'still leased at 999 ms');
  clock.advance(1);
  // All 5 unspent come back: the bucket, below capacity, refilled on its own meanwhile.
  await waitFor(async () => (await f.bucket()).tokens! >= 90);
  assert.equal(Math.floor((await f.bucket()).tokens!), 90, '100 - 10 spent');
  assert.equal(await roundRobin({ ...f, instances: [f.instances[1]!], take: () => f.take(1) }, 100), 90);
});

test('an instance that stops gives its unspent tokens back and leaves the count of instances', { timeout: 20_000 }, async (t) => {
  const redis = await startRedis(t);
  const f = await fleet(t, redis, 2, '{ capacity: 100, refill_per_second: 0.001 }', new ManualClock());
  for (let i = 0; i < 10; i++) assert.equal(await f.take(0), true);
  assert.equal(await f.take(1), true);
  // 15 leased by the first (5 unspent); 1 by the second, and 2 it took ahead.
  await waitFor(async () => Math.round((await f.bucket()).tokens!) === 82);
  assert.equal((await f.bucket()).instances, 2);
  await f.instances[0]!.close();
  // The injected clock stood still: everything unspent comes back, nothing deducted.
  const after = await f.bucket();
  assert.deepEqual([Math.round(after.tokens!), after.instances], [87, 1]);
});

test('a lease that fails counts once against the breaker, however many requests waited for it; they are answered from memory', { timeout: 20_000 }, async (t) => {
  const redis = await startRedis(t);
  const f = await fleet(t, redis, 1, '{ capacity: 1000, refill_per_second: 0.001 }', new ManualClock(), 300);
  const limits = f.instances[0]!;
  // Connected, and a lease held for another key, so only alpha's lease is at stake.
  assert.equal((await limits.take({ id: 'bravo', plan: 'small' }, f.plan, 1)).allowed, true);
  redis.freeze();
  onCleanup(t, () => redis.thaw());
  // Five at once: the breaker opens on 5 failures; one lease is asked, four wait for it.
  const verdicts = await Promise.all(Array.from({ length: 5 }, () => limits.take(ALPHA, f.plan, 1)));
  assert.deepEqual(verdicts.map((v) => v.allowed), [true, true, true, true, true]);
  assert.equal(f.guards[0]!.state, 'closed', 'one failure, not five');
  redis.thaw();
});

test('12 perch processes share a bucket of 600: 600 requests round-robin are all allowed, the next refused', { timeout: 120_000 }, async (t) => {
  const redis = await startRedis(t);
  const upstream = await startUpstream(t, sampleProvider);
  const dir = tempDir(t, 'perch-lease-');
  const path = join(dir, 'perch.yaml');
  writeFileSync(path, withPlan(testConfig(v1('main', upstream.url), `rate_limits_redis: { url: "${redis.url}", command_timeout_ms: 2000 }`), '{ capacity: 600, refill_per_second: 0.001 }'));
  const perches = [];
  // One at a time: twelve starting at once on a small machine may each take longer than the start-up wait.
  for (let i = 0; i < 12; i++) perches.push(await spawnPerch(t, path));
  const statuses: number[] = [];
  for (let i = 0; i < 612; i++) {
    const res = await fetch(`${perches[i % 12]!.url}/v1/users/1`, { headers: { 'x-api-key': KEY } });
    await res.arrayBuffer();
    statuses.push(res.status);
  }
  const allowed = statuses.slice(0, 600).filter((s) => s === 200).length;
  t.diagnostic(`12 processes, capacity 600: ${allowed} of 600 allowed`);
  // On the real clock leases lapse and go back, all their unspent tokens: exact, as
  // docs/rate-limits.md says.
  assert.equal(allowed, 600);
  assert.ok(statuses.filter((s) => s === 200).length <= 600, 'never more than the bucket held');
});

test('a perch process stopped with SIGTERM gives its unspent leased tokens back: the other instance then gets the rest of the bucket', { timeout: 60_000 }, async (t) => {
  const redis = await startRedis(t);
  const upstream = await startUpstream(t, sampleProvider);
  const dir = tempDir(t, 'perch-lease-');
  // Next to no refill: what the bucket holds is what was given back.
  const plan = '{ capacity: 100, refill_per_second: 0.000000001 }';
  const path = join(dir, 'perch.yaml');
  writeFileSync(path, withPlan(testConfig(v1('main', upstream.url), `rate_limits_redis: { url: "${redis.url}", command_timeout_ms: 2000 }`), plan));
  const a = await spawnPerch(t, path);
  for (let i = 0; i < 10; i++) {
    const res = await fetch(`${a.url}/v1/users/1`, { headers: { 'x-api-key': KEY } });
    await res.arrayBuffer();
    assert.equal(res.status, 200);
  }
  a.process.kill('SIGTERM');
  assert.deepEqual(await a.exited, { code: 0, signal: null });
  const inspector = new Redis(redis.url);
  onCleanup(t, () => inspector.disconnect());
  assert.deepEqual(Object.keys(await inspector.hgetall('perch:rl:alpha')).filter((k) => k.startsWith('i:')), [], 'the stopped instance is no longer counted');
  const b = await instance(t, redis, upstream.url, plan);
  const statuses: number[] = [];
  for (let i = 0; i < 100; i++) statuses.push((await b.request('/v1/users/1')).status);
  assert.equal(statuses.filter((s) => s === 200).length, 90);
});

test('a lease is a tenth of the bucket at most; within that, 100 tokens or a tenth of a second of refill, whichever is more', { timeout: 5000 }, () => {
  assert.deepEqual(
    [leaseSize(19, 1000), leaseSize(50, 0.001), leaseSize(1000, 0.001), leaseSize(1000, 50_000), leaseSize(100_000, 500), leaseSize(100_000, 10_000), leaseSize(1e9, 1e9)],
    [1, 5, 100, 100, 100, 1000, 1e8],
  );
});
