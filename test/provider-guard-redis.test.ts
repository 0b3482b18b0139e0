import assert from 'node:assert/strict';
import { test, type TestContext } from 'node:test';
import { Redis } from 'ioredis';
import { ANY, type Admission } from '../src/upstream/guard/provider-state.js';
import { RedisProviderState } from '../src/upstream/guard/redis-state.js';
import { ManualClock } from './helpers/clock.js';
import { startPerch, testConfig, v1, waitFor } from './helpers/perch.js';
import { startRedis, type TestRedis } from './helpers/redis-server.js';
import { json, sampleProvider, startUpstream, type TestUpstream } from './helpers/upstream-server.js';
import { onCleanup } from './helpers/cleanup.js';

/** A perch instance on `upstream` whose provider guard keeps its state in `redis`. */
function instance(t: TestContext, redis: TestRedis, upstream: TestUpstream, extra = '', clock?: ManualClock) {
  // A generous command timeout: a loaded test machine must not push a healthy Redis aside.
  const yaml = testConfig(v1('main', upstream.url, extra), `rate_limits_redis: { url: "${redis.url}", command_timeout_ms: 2000 }`);
  return startPerch(t, yaml, clock === undefined ? {} : { clock, timers: clock });
}

test('a 429 seen by one instance stops every instance, and one started afterwards, until its time', { timeout: 20_000 }, async (t) => {
  const redis = await startRedis(t);
  let calls = 0;
  const upstream = await startUpstream(t, (req, res) => (calls++ === 0 ? json(429, {}, { 'retry-after': '30' })(req, res) : sampleProvider(req, res)));
  const clock = new ManualClock();
  const a = await instance(t, redis, upstream, '', clock);
  const b = await instance(t, redis, upstream, '', clock);
  assert.equal((await a.request('/v1/users/1')).status, 429);
  clock.advance(10_000);
  for (let i = 2; i <= 21; i++) {
    const res = await b.request(`/v1/users/${i}`);
    assert.deepEqual([res.status, res.headers.get('retry-after')], [429, '20'], `miss ${i} on the other instance`);
  }
  const late = await instance(t, redis, upstream, '', clock);
  assert.equal((await late.request('/v1/users/22')).status, 429, 'an instance started later knows the stop too');
  assert.equal(upstream.requests.length, 1);
  clock.advance(20_000);
  assert.equal((await b.request('/v1/users/23')).status, 200);
  assert.equal(upstream.requests.length, 2);
});

test('max_requests_per_second holds across two instances: never more calls in any one-second window', { timeout: 30_000 }, async (t) => {
  const redis = await startRedis(t);
  const arrivals: number[] = [];
  const upstream = await startUpstream(t, (req, res) => {
    arrivals.push(performance.now());
    sampleProvider(req, res);
  });
  const extra = 'max_requests_per_second: 5, queue_timeout_ms: 8000';
  const a = await instance(t, redis, upstream, extra);
  const b = await instance(t, redis, upstream, extra);
  const results = await Promise.all(Array.from({ length: 20 }, (_, i) => (i % 2 === 0 ? a : b).request(`/v1/users/${i + 1}`)));
  assert.deepEqual(
    results.map((r) => r.status),
    Array<number>(20).fill(200),
  );
  assert.equal(arrivals.length, 20);
  // Admission is timed by Redis; arrival adds a little loopback and event-loop jitter, hence the
  // 50 ms margin. Without the cap all 20 arrive within a few milliseconds.
  const busiest = Math.max(...arrivals.map((start) => arrivals.filter((at) => at >= start && at < start + 950).length));
  assert.equal(busiest, 5, `arrivals (ms) ${arrivals.map((at) => Math.round(at - arrivals[0]!)).join(' ')}`);
});

test('in Redis too, calls that waited for the window saved no burst: once it moves they go one refill apart', { timeout: 15_000 }, async (t) => {
  const redis = await startRedis(t);
  const client = new Redis(redis.url);
  onCleanup(t, () => client.disconnect());
  // The cap's times are Redis TIME, which no test clock moves: the window is made to pass by
  // moving its marks and the bucket's clock back by the wait instead.
  const state = new RedisProviderState(client, { prefix: 'perch:', now: () => Date.now(), commandTimeoutMs: 2000 });
  const cap = { rate: { perSecond: 10, burst: 10, windowLimit: 10, windowMs: 1000 } };
  let lease = 0;
  const admit = async (): Promise<Admission> => {
    const leaseId = `l${++lease}`;
    const admission = await state.admit({ upstream: 'main', scope: ANY, candidates: ['a'], cap, localCap: cap, leaseId, leaseMs: 60_000, payer: { id: 'crawler', weight: 1, label: 'crawler' } });
    if (admission.kind === 'admitted') {
      state.finish('main', leaseId);
      await client.ping();
    }
    return admission;
  };
  const waitOf = (admission: Admission) => (admission.kind === 'over_cap' ? admission.waitMs : -1);
  for (let i = 0; i < 10; i++) assert.equal((await admit()).kind, 'admitted', `call ${i}`);
  const heldMs = waitOf(await admit());
  // The window's wait (a second after the first answer), not the token's (100 ms).
  assert.ok(heldMs > 900 && heldMs <= 1001, `waited ${heldMs} ms`);
  const base = state.upstreamKey('main');
  const marks = await client.zrange(`${base}:recent`, '0', '-1', 'WITHSCORES');
  for (let i = 0; i < marks.length; i += 2) await client.zadd(`${base}:recent`, String(Number(marks[i + 1]) - heldMs), marks[i]!);
  await client.hincrby(`${base}:bucket`, 'at', -heldMs);
  assert.equal((await admit()).kind, 'admitted', 'the token kept for the end of the wait');
  const next = waitOf(await admit());
  // A token's refill, less the milliseconds since: the ten saved while the call waited are not there.
  assert.ok(next > 50 && next <= 100, `the next call waits ${next} ms`);
});

test('while Redis is unreachable each instance keeps only its redis_down_share of the cap', { timeout: 20_000 }, async (t) => {
  const redis = await startRedis(t);
  const upstream = await startUpstream(t, sampleProvider);
  const perch = await instance(t, redis, upstream, 'max_requests_per_second: 4, redis_down_share: 0.5, queue_timeout_ms: 0');
  assert.equal((await perch.request('/v1/users/0')).status, 200);
  await redis.kill();
  const results = await Promise.all(Array.from({ length: 6 }, (_, i) => perch.request(`/v1/users/${i + 1}`)));
  assert.deepEqual(
    results.map((r) => r.status).sort(),
    [200, 200, 429, 429, 429, 429],
  );
  assert.equal(upstream.requests.length, 3);
  assert.equal(perch.logs.lines().filter((l) => String(l.msg).startsWith('provider guard: Redis failed')).length, 1);
});

test('a quota window and max_concurrent hold across two instances', { timeout: 20_000 }, async (t) => {
  const redis = await startRedis(t);
  const held: (() => void)[] = [];
  const upstream = await startUpstream(t, (req, res) => held.push(() => sampleProvider(req, res)));
  const extra = 'quota: { requests: 3, per_seconds: 900 }, max_concurrent: 1, queue_timeout_ms: 5000';
  const a = await instance(t, redis, upstream, extra);
  const b = await instance(t, redis, upstream, extra);
  const first = a.request('/v1/users/1');
  await waitFor(() => upstream.requests.length === 1);
  const inspector = new Redis(redis.url);
  onCleanup(t, () => inspector.disconnect());
  const admissions = async () => Number(/cmdstat_evalsha:calls=(\d+)/.exec(await inspector.info('commandstats'))?.[1] ?? 0);
  const before = await admissions();
  const second = b.request('/v1/users/2');
  // B waits for A's call to end: the one place in flight is fleet-wide. Seen asking twice, it is queued.
  await waitFor(async () => (await admissions()) >= before + 2);
  assert.equal(upstream.requests.length, 1);
  held.shift()!();
  assert.equal((await first).status, 200);
  await waitFor(() => upstream.requests.length === 2);
  held.shift()!();
  assert.equal((await second).status, 200);
  upstream.behaviour = sampleProvider;
  assert.equal((await a.request('/v1/users/3')).status, 200);
  const over = await b.request('/v1/users/4', {});
  assert.deepEqual([over.status, upstream.requests.length], [429, 3], 'the fourth call in 900 s waits past queue_timeout_ms');
});

test('a stop this instance learned holds at once, without asking Redis (here frozen)', { timeout: 20_000 }, async (t) => {
  const redis = await startRedis(t);
  let calls = 0;
  const upstream = await startUpstream(t, (req, res) => (calls++ === 0 ? json(429, {}, { 'retry-after': '30' })(req, res) : sampleProvider(req, res)));
  const perch = await instance(t, redis, upstream);
  assert.equal((await perch.request('/v1/users/1')).status, 429);
  redis.freeze();
  onCleanup(t, () => redis.thaw());
  const started = performance.now();
  const refused = await perch.request('/v1/users/2');
  const ms = performance.now() - started;
  assert.deepEqual([refused.status, upstream.requests.length], [429, 1]);
  // Asking the frozen Redis would have cost the whole command timeout (2000 ms) first.
  assert.ok(ms < 1000, `answered after ${ms.toFixed(0)} ms`);
});
