import assert from 'node:assert/strict';
import { test, type TestContext } from 'node:test';
import { Redis } from 'ioredis';
import { NodeBreakers } from '../src/redis/node-breakers.js';
import { InsuredProviderState } from '../src/upstream/guard/insured-state.js';
import { MemoryProviderState } from '../src/upstream/guard/memory-state.js';
import { ANY, type Admission, type AdmitQuery, type SpendQuery } from '../src/upstream/guard/provider-state.js';
import { RedisProviderState } from '../src/upstream/guard/redis-state.js';
import { captureLogs } from './helpers/log-capture.js';
import { ManualClock } from './helpers/clock.js';
import { startPerch, testConfig, v1, waitFor } from './helpers/perch.js';
import { startRedis, type TestRedis } from './helpers/redis-server.js';
import { json, sampleProvider, startUpstream, type TestUpstream } from './helpers/upstream-server.js';
import { onCleanup } from './helpers/cleanup.js';
import { startTcpProxy } from './helpers/tcp-proxy.js';

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
  // The clock stands still: every call is in the same window.
  const perch = await instance(t, redis, upstream, 'max_requests_per_second: 4, redis_down_share: 0.5, queue_timeout_ms: 0', new ManualClock());
  assert.equal((await perch.request('/v1/users/0')).status, 200);
  await redis.kill();
  const results = await Promise.all(Array.from({ length: 6 }, (_, i) => perch.request(`/v1/users/${i + 1}`)));
  // A share of 2 calls a second, one of them already spent through Redis.
  assert.deepEqual(
    results.map((r) => r.status).sort(),
    [200, 429, 429, 429, 429, 429],
  );
  assert.equal(upstream.requests.length, 2);
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

/** `count` misses, one after another, spread round robin over `instances`; their statuses. */
async function misses(instances: readonly { request(path: string): Promise<{ status: number }> }[], from: number, count: number): Promise<number[]> {
  const statuses: number[] = [];
  for (let i = 0; i < count; i++) statuses.push((await instances[i % instances.length]!.request(`/v1/users/${from + i}`)).status);
  return statuses;
}

const QUOTA = 'quota: { requests: 10, per_seconds: 120 }, queue_timeout_ms: 0';

test('across a Redis outage the quota holds with one instance: calls Redis admitted count in its fallback', { timeout: 20_000 }, async (t) => {
  const redis = await startRedis(t);
  const upstream = await startUpstream(t, sampleProvider);
  const perch = await instance(t, redis, upstream, QUOTA);
  assert.deepEqual(await misses([perch], 1, 8), Array<number>(8).fill(200));
  await redis.kill();
  const during = await misses([perch], 100, 20);
  assert.deepEqual([during.filter((s) => s === 200).length, upstream.requests.length], [2, 10]);
});

test('across a Redis outage the quota holds with two instances of redis_down_share 0.5', { timeout: 20_000 }, async (t) => {
  const redis = await startRedis(t);
  const upstream = await startUpstream(t, sampleProvider);
  const extra = `${QUOTA}, redis_down_share: 0.5`;
  const a = await instance(t, redis, upstream, extra);
  const b = await instance(t, redis, upstream, extra);
  assert.deepEqual(await misses([a, b], 1, 8), Array<number>(8).fill(200));
  await redis.kill();
  const during = await misses([a, b], 100, 20);
  // Each had spent 4 of its share of 5 through Redis: one more each.
  assert.deepEqual([during.filter((s) => s === 200).length, upstream.requests.length], [2, 10]);
});

test('a Redis that restarted empty gets back the calls each instance counted, before the fleet spends them again', { timeout: 20_000 }, async (t) => {
  const redis = await startRedis(t);
  const upstream = await startUpstream(t, sampleProvider);
  const a = await instance(t, redis, upstream, QUOTA);
  const b = await instance(t, redis, upstream, QUOTA);
  assert.deepEqual(await misses([a], 1, 4), Array<number>(4).fill(200));
  await redis.kill();
  assert.deepEqual(await misses([a], 100, 3), [200, 200, 200]);
  await redis.restart();
  const inspector = new Redis(redis.url);
  onCleanup(t, () => inspector.disconnect());
  // A writes back as soon as its connection is ready: 4 admitted by Redis, 3 by itself.
  await waitFor(async () => (await inspector.zcard('perch:{up:main}:quota')) === 7);
  const after = await misses([b], 200, 5);
  assert.deepEqual(after, [200, 200, 200, 429, 429]);
  assert.equal(upstream.requests.length, 10);
});

test('after an outage a call admitted from memory holds its max_concurrent slot in Redis, until its answer releases it', { timeout: 20_000 }, async (t) => {
  const redis = await startRedis(t);
  const held: (() => void)[] = [];
  const upstream = await startUpstream(t, (req, res) => held.push(() => sampleProvider(req, res)));
  const extra = 'max_concurrent: 1, queue_timeout_ms: 0, timeout_ms: 30000';
  const a = await instance(t, redis, upstream, extra);
  const b = await instance(t, redis, upstream, extra);
  await redis.kill();
  const first = a.request('/v1/users/1');
  await waitFor(() => upstream.requests.length === 1);
  await redis.restart();
  const inspector = new Redis(redis.url);
  onCleanup(t, () => inspector.disconnect());
  await waitFor(async () => (await inspector.zcard('perch:{up:main}:leases')) === 1);
  assert.equal((await b.request('/v1/users/2')).status, 429, 'the one slot is A\'s call, in flight');
  held.shift()!();
  assert.equal((await first).status, 200);
  await waitFor(async () => (await inspector.zcard('perch:{up:main}:leases')) === 0);
  upstream.behaviour = sampleProvider;
  assert.equal((await b.request('/v1/users/3')).status, 200);
});

/**
 * Instance A reaches `redis` through a relay that can hold Redis's replies, with a command
 * timeout short enough to pass while one is held; B reaches it directly, with a generous one.
 */
async function relayedPair(t: TestContext, redis: TestRedis, upstream: TestUpstream, extra: string) {
  const relay = await startTcpProxy(t, redis.port);
  const yaml = (url: string, timeoutMs: number) => testConfig(v1('main', upstream.url, extra), `rate_limits_redis: { url: "${url}", command_timeout_ms: ${timeoutMs} }`);
  const a = await startPerch(t, yaml(relay.url, 100), { clock: new ManualClock() });
  // A's connection has passed its ready check (the INFO): its commands go to Redis, not fail at once.
  const inspector = new Redis(redis.url);
  onCleanup(t, () => inspector.disconnect());
  await waitFor(async () => /name=perch-rate-limits .* cmd=info/.test(String(await inspector.client('LIST'))));
  const b = await startPerch(t, yaml(redis.url, 2000));
  return { relay, a, b, inspector };
}

test('an admission Redis answers late is no outage: the instance does not call on its own share past the fleet\'s cap', { timeout: 20_000 }, async (t) => {
  const redis = await startRedis(t);
  const upstream = await startUpstream(t, sampleProvider);
  const { relay, a, b } = await relayedPair(t, redis, upstream, 'quota: { requests: 2, per_seconds: 900 }, queue_timeout_ms: 0');
  assert.deepEqual(await misses([b], 1, 2), [200, 200]);
  // A's admission reaches Redis, which refuses it (the quota is spent), but the answer comes
  // after A's command timeout: A spent nothing, so its memory alone would admit the call.
  const held = relay.hold();
  const late = await a.request('/v1/users/3');
  await waitFor(() => held() > 0);
  relay.release();
  assert.deepEqual([late.status, upstream.requests.length], [429, 2]);
  assert.equal((await a.request('/v1/users/4')).status, 429);
  assert.equal(upstream.requests.length, 2);
});

test('an admission answered late gives back the place Redis took for it: no max_concurrent slot held for its lease', { timeout: 20_000 }, async (t) => {
  const redis = await startRedis(t);
  const upstream = await startUpstream(t, sampleProvider);
  const { relay, a, b, inspector } = await relayedPair(t, redis, upstream, 'max_concurrent: 1, queue_timeout_ms: 0, timeout_ms: 30000');
  const held = relay.hold();
  assert.equal((await a.request('/v1/users/1')).status, 429);
  await waitFor(() => held() > 0);
  relay.release();
  // Redis admitted A's call (the slot was free) and A's release followed it on the connection.
  await waitFor(async () => (await inspector.zcard('perch:{up:main}:leases')) === 0);
  assert.deepEqual([(await b.request('/v1/users/2')).status, upstream.requests.length], [200, 1]);
});

test('a call that may not wait, answered late, asks again at once: served within the cap, not 429', { timeout: 20_000 }, async (t) => {
  const redis = await startRedis(t);
  const upstream = await startUpstream(t, sampleProvider);
  const { relay, a, inspector } = await relayedPair(t, redis, upstream, 'max_concurrent: 1, queue_timeout_ms: 0, timeout_ms: 30000');
  // Replies are held until A has timed out on its admission and sent its finish (the script on
  // three keys from the rate log, the admission has more): A's ask again follows it on the
  // connection and is answered in time.
  const monitor = await inspector.monitor();
  onCleanup(t, () => monitor.disconnect());
  let finished = false;
  monitor.on('monitor', (_time: string, args: string[]) => {
    if (/^eval/i.test(args[0] ?? '') && args[2] === '3' && args[3]?.endsWith(':recent')) finished = true;
  });
  relay.hold();
  const late = a.request('/v1/users/1');
  await waitFor(() => finished);
  relay.release();
  assert.deepEqual([(await late).status, upstream.requests.length], [200, 1]);
  await waitFor(async () => (await inspector.zcard('perch:{up:main}:leases')) === 0);
});

/** The guard's state as perch builds it (Redis insured by memory), on `clock`, with its parts. */
function insuredState(t: TestContext, redis: TestRedis, clock: ManualClock, url = redis.url) {
  // As perch's own client (redis-client.ts): no offline queue, no retries; a short timeout.
  const client = new Redis(url, { enableOfflineQueue: false, maxRetriesPerRequest: 0, commandTimeout: 200, retryStrategy: () => 50 });
  client.on('error', () => {});
  onCleanup(t, () => client.disconnect());
  const logs = captureLogs();
  const breakers = new NodeBreakers(client, { clock, logger: logs.logger, name: 'provider guard redis' });
  const shared = new RedisProviderState(client, { prefix: 'perch:', now: () => clock.now(), commandTimeoutMs: 200 });
  const memory = new MemoryProviderState(clock);
  const state = new InsuredProviderState(shared, memory, breakers, logs.logger, clock);
  return { client, memory, state, breaker: breakers.for(shared.upstreamKey('main')), ready: () => waitFor(() => client.status === 'ready') };
}

const ONE_AT_A_TIME = { maxConcurrent: 1 };
let leases = 0;
function oneAtATime(leaseId = `lease${++leases}`): AdmitQuery {
  return { upstream: 'main', scope: ANY, candidates: ['a'], cap: ONE_AT_A_TIME, localCap: ONE_AT_A_TIME, leaseId, leaseMs: 60_000, payer: { id: 'k', weight: 1, label: 'k' } };
}

/** Five admissions time out against the frozen Redis: its breaker opens. */
async function openBreaker(redis: TestRedis, state: InsuredProviderState): Promise<void> {
  redis.freeze();
  for (let i = 0; i < 5; i++) assert.equal((await state.admit(oneAtATime())).kind, 'over_cap', 'memory recorded the call Redis admitted');
  redis.thaw();
}

test('a lease answered while Redis\'s breaker is open is released by the write-back, before Redis admits for this instance again', { timeout: 20_000 }, async (t) => {
  const redis = await startRedis(t);
  onCleanup(t, () => redis.thaw());
  const clock = new ManualClock();
  const { client, state, breaker, ready } = insuredState(t, redis, clock);
  await ready();
  const first = oneAtATime('first');
  assert.equal((await state.admit(first)).kind, 'admitted');
  await openBreaker(redis, state);
  assert.equal(breaker.state, 'open');
  state.finish('main', 'first');
  clock.advance(2000);
  const next = oneAtATime('next');
  assert.equal((await state.admit(next)).kind, 'admitted', 'the probe');
  assert.deepEqual(await client.zrange('perch:{up:main}:leases', '0', '-1'), ['next']);
});

test('a lease answered while Redis\'s breaker is half-open is released in Redis at once', { timeout: 20_000 }, async (t) => {
  const redis = await startRedis(t);
  onCleanup(t, () => redis.thaw());
  const clock = new ManualClock();
  const { client, state, breaker, ready } = insuredState(t, redis, clock);
  await ready();
  assert.equal((await state.admit(oneAtATime('first'))).kind, 'admitted');
  await openBreaker(redis, state);
  clock.advance(2000);
  // Another caller's probe (the throttle's exchange) is on its way: the breaker is half-open.
  const probe = state.exchange({ upstream: 'main', slice: 0, slices: 10, sliceMs: 1000, epoch: 0, reset: false, deltas: [] });
  assert.equal(breaker.state, 'half_open');
  state.finish('main', 'first');
  await probe;
  await client.ping();
  assert.deepEqual(await client.zrange('perch:{up:main}:leases', '0', '-1'), []);
});

test('a refund goes back to the side that charged the call: Redis, or this instance\'s memory', { timeout: 20_000 }, async (t) => {
  const redis = await startRedis(t);
  const clock = new ManualClock();
  const { client, memory, state, ready } = insuredState(t, redis, clock);
  await ready();
  const query: SpendQuery = { keyId: 'k', startMs: 0, endMs: 3_600_000, limit: 5 };
  const key = 'perch:budget:{k}:0';
  const inRedis = await state.spend(query);
  await redis.kill();
  const inMemory = await state.spend(query);
  assert.deepEqual([inRedis.charged, inMemory.charged], ['shared', 'local']);
  await redis.restart();
  await ready();
  const refunds = 'perch:refunds:{k}:0';
  await client.set(key, '1');
  state.refund(query, inRedis);
  await client.ping();
  assert.deepEqual([await client.get(key), await client.get(refunds)], ['1', '1'], 'charged 1, given back 1');
  // Memory counted on from what Redis said (1) with its own call (2): Redis's goes, its own stays.
  assert.equal(memory.budgetUsed(query), 1, 'memory keeps the call it charged');
  await client.set(key, '1');
  await client.del(refunds);
  state.refund(query, inMemory);
  await client.ping();
  assert.deepEqual([await client.get(key), await client.get(refunds)], ['1', null], 'Redis never charged it');
  assert.equal(memory.budgetUsed(query), 0, 'memory had it back');
});

test('a half-open probe is admitted by Redis only after the write-back of the calls memory admitted meanwhile', { timeout: 20_000 }, async (t) => {
  const redis = await startRedis(t);
  onCleanup(t, () => redis.thaw());
  const proxy = await startTcpProxy(t, redis.port);
  const clock = new ManualClock();
  const { state, breaker, ready } = insuredState(t, redis, clock, proxy.url);
  const inspector = new Redis(redis.url);
  onCleanup(t, () => inspector.disconnect());
  await ready();
  const cap = { quota: { requests: 3, windowMs: 600_000 } };
  const ask = (leaseId: string): AdmitQuery => ({ upstream: 'main', scope: ANY, candidates: ['a'], cap, localCap: cap, leaseId, leaseMs: 60_000, payer: { id: 'k', weight: 1, label: 'k' } });
  assert.equal((await state.admit(ask('y'))).kind, 'admitted', 'through Redis');
  redis.freeze();
  for (let i = 0; i < 5; i++) await state.exchange({ upstream: 'main', slice: 0, slices: 10, sliceMs: 1000, epoch: 0, reset: false, deltas: [] });
  redis.thaw();
  assert.equal(breaker.state, 'open');
  assert.equal((await state.admit(ask('x1'))).kind, 'admitted', 'by memory, the breaker open');
  clock.advance(2000);
  const held = proxy.hold();
  const probe = state.admit(ask('probe'));
  assert.equal(breaker.state, 'half_open');
  // The probe's write-back (of y and x1) is on its way; memory admits x2 meanwhile.
  await waitFor(() => held() > 0);
  assert.equal((await state.admit(ask('x2'))).kind, 'admitted', 'by memory, the probe in flight');
  proxy.release();
  assert.equal((await probe).kind, 'over_cap', 'y, x1 and x2 fill the quota of 3');
  assert.equal(await inspector.zcard('perch:{up:main}:quota'), 3);
});

test('every kind of stop recorded while Redis\'s breaker is open goes back to Redis with its end, before Redis admits again', { timeout: 20_000 }, async (t) => {
  const redis = await startRedis(t);
  onCleanup(t, () => redis.thaw());
  const clock = new ManualClock();
  const { client, state, breaker, ready } = insuredState(t, redis, clock);
  await ready();
  redis.freeze();
  for (let i = 0; i < 5; i++) await state.exchange({ upstream: 'main', slice: 0, slices: 10, sliceMs: 1000, epoch: 0, reset: false, deltas: [] });
  redis.thaw();
  assert.equal(breaker.state, 'open');
  const now = clock.now();
  const stops = [
    { credential: 'a', scope: ANY, untilMs: now + 60_000, state: 'cooling_down' },
    { credential: 'b', scope: ANY, untilMs: now + 86_400_000, state: 'usage_capped' },
    { credential: 'c', scope: 'user', untilMs: now + 3_600_000, state: 'forbidden' },
  ] as const;
  for (const stop of stops) await state.stop({ upstream: 'main', ...stop });
  await state.stop({ upstream: 'other', credential: ANY, scope: ANY, untilMs: now + 30_000, state: 'breaker_open' });
  assert.deepEqual(await client.keys('perch:{up:*}:stop:*'), [], 'nothing reached Redis while its breaker was open');
  clock.advance(2000);
  const ask = (upstream: string, candidates: string[], scope = 'user'): AdmitQuery => ({ upstream, scope, candidates, cap: {}, localCap: {}, leaseId: `l-${upstream}-${candidates.join()}`, leaseMs: 60_000, payer: { id: 'k', weight: 1, label: 'k' } });
  assert.deepEqual(await state.admit(ask('main', ['d'])), { kind: 'admitted', credential: 'd' }, 'the probe, after the write-back');
  assert.equal(breaker.state, 'closed');
  // 'other' asks Redis nothing while its stop holds here: its stop goes back with main's probe.
  await waitFor(async () => (await client.keys('perch:{up:other}:stop:*')).length === 1);
  // Another instance, asking Redis alone, is held by each of them until its end.
  const other = new RedisProviderState(client, { prefix: 'perch:', now: () => clock.now(), commandTimeoutMs: 200 });
  for (const stop of stops) assert.deepEqual(await other.admit(ask('main', [stop.credential])), { kind: 'stopped', untilMs: stop.untilMs, state: stop.state });
  assert.deepEqual(await other.admit(ask('other', ['d'])), { kind: 'stopped', untilMs: now + 30_000, state: 'breaker_open' });
});

test('a reconnection to a Redis that kept its calls writes none of them back twice', { timeout: 20_000 }, async (t) => {
  const redis = await startRedis(t);
  const upstream = await startUpstream(t, sampleProvider);
  const a = await instance(t, redis, upstream, QUOTA);
  const b = await instance(t, redis, upstream, QUOTA);
  assert.deepEqual(await misses([a], 1, 4), Array<number>(4).fill(200));
  const inspector = new Redis(redis.url);
  onCleanup(t, () => inspector.disconnect());
  await waitFor(async () => (await inspector.zcard('perch:{up:main}:quota')) === 4);
  // The connections drop and come back to the same Redis, its calls kept: each instance writes
  // back what it counted, which Redis already holds.
  const clients = String(await inspector.client('LIST')).split('\n').filter((line) => line.length > 0).length;
  await inspector.call('CLIENT', 'KILL', 'TYPE', 'normal', 'SKIPME', 'yes');
  await waitFor(async () => String(await inspector.client('LIST')).split('\n').filter((line) => line.length > 0).length >= clients);
  // A's next admission waits for its write-back: Redis then holds its 5 calls, not 4 twice.
  assert.deepEqual(await misses([a], 100, 1), [200]);
  assert.deepEqual(await misses([b], 200, 6), [200, 200, 200, 200, 200, 429]);
  assert.equal(upstream.requests.length, 10);
  assert.equal(await inspector.zcard('perch:{up:main}:quota'), 10);
});

test('a Redis restarted empty gets back every call an instance had Redis admit, beyond its redis_down_share', { timeout: 20_000 }, async (t) => {
  const redis = await startRedis(t);
  const upstream = await startUpstream(t, sampleProvider);
  const inspector = new Redis(redis.url);
  onCleanup(t, () => inspector.disconnect());
  // A keyspace older than the window (a generation of this server's run written at time 0), so
  // A may spend past its share before the restart, as an instance of a long-running fleet can.
  const run = /run_id:(\w+)/.exec(await inspector.info('server'))![1]!;
  await inspector.set('perch:{up:main}:generation', `seed ${run} 0`);
  const extra = `${QUOTA}, redis_down_share: 0.5`;
  const a = await instance(t, redis, upstream, extra);
  const b = await instance(t, redis, upstream, extra);
  // A spends 8 of the fleet's 10, more than its share of 5 on its own.
  assert.deepEqual(await misses([a], 1, 8), Array<number>(8).fill(200));
  await redis.kill();
  await redis.restart();
  // A writes back all 8 calls Redis admitted for it, not only its share of 5.
  await waitFor(async () => (await inspector.zcard('perch:{up:main}:quota')) >= 8);
  assert.equal(await inspector.zcard('perch:{up:main}:quota'), 8);
  // So the fleet has 2 left: B, within its own share of 5, gets those 2 and no more.
  assert.deepEqual(await misses([b], 200, 3), [200, 200, 429]);
  assert.equal(upstream.requests.length, 10);
});

test('a fleet\'s first start keeps each part of the cap to its share only for that part\'s window, and as long as others may take to come back: the rate 4 s, the quota its own', { timeout: 20_000 }, async (t) => {
  const redis = await startRedis(t);
  const clock = new ManualClock();
  const { state, ready } = insuredState(t, redis, clock);
  await ready();
  // Redis's own windows run on its clock and are wide: only the share, on the injected clock, binds.
  const cap = { rate: { perSecond: 100, burst: 100, windowLimit: 100, windowMs: 1000 }, quota: { requests: 100, windowMs: 120_000 } };
  const localCap = { rate: { perSecond: 1, burst: 1, windowLimit: 1, windowMs: 1000 }, quota: { requests: 5, windowMs: 120_000 } };
  const ask = async (count: number): Promise<string[]> => {
    const kinds: string[] = [];
    for (let i = 0; i < count; i++) {
      const query = { ...oneAtATime(), cap, localCap };
      const { kind } = await state.admit(query);
      kinds.push(kind);
      // Answered at once: a call in flight would hold its place in the rate window.
      if (kind === 'admitted') state.finish(query.upstream, query.leaseId);
    }
    return kinds;
  };
  assert.deepEqual(await ask(2), ['admitted', 'over_cap'], 'one call a second, the share of the rate');
  clock.advance(1500);
  assert.deepEqual(await ask(2), ['admitted', 'over_cap'], 'the rate window has passed, but others may still be coming back: the share of the rate');
  clock.advance(2500);
  assert.deepEqual(await ask(4), ['admitted', 'admitted', 'admitted', 'over_cap'], 'the others have had time to come back: only the share of the quota, 5, binds');
  clock.advance(116_000);
  assert.deepEqual(await ask(2), ['admitted', 'admitted'], 'the quota window has passed too: the fleet\'s cap alone');
});
