import assert from 'node:assert/strict';
import { test } from 'node:test';
import { ManualClock } from './helpers/clock.js';
import { metric, startPerch, testConfig, v1, type RunningPerch } from './helpers/perch.js';
import { startRedis } from './helpers/redis-server.js';
import { failingEvery, json, sampleProvider, startUpstream } from './helpers/upstream-server.js';

// Half-sick and dead providers under the default breaker and throttle, against a real upstream.
// The clock is manual and the throttle's draw is 0, the strictest it can be: a call is shed
// whenever the reject probability is above 0 at all, so every count below is exact.

const NEVER_RANDOM = () => 0;

/** Sends `count` misses on distinct users one after another, from `first`; the statuses in order. */
async function misses(perch: RunningPerch, first: number, count: number): Promise<number[]> {
  const statuses: number[] = [];
  for (let i = 0; i < count; i++) statuses.push((await perch.request(`/v1/users/${first + i}`)).status);
  return statuses;
}

const tally = (statuses: number[]) => statuses.reduce<Record<number, number>>((t, s) => ({ ...t, [s]: (t[s] ?? 0) + 1 }), {});

test('every other call 503, default config: half the new keys are served, at one upstream call per miss', { timeout: 30_000 }, async (t) => {
  const upstream = await startUpstream(t, failingEvery(2, json(503, {})));
  const perch = await startPerch(t, testConfig(v1('main', upstream.url)), { clock: new ManualClock(), random: NEVER_RANDOM });
  assert.deepEqual(tally(await misses(perch, 1, 400)), { 200: 200, 502: 200 });
  assert.equal(upstream.requests.length, 400, 'one call per miss, none shed');
  assert.equal(await metric(perch, 'perch_upstream_breaker_state{upstream="main",state="closed"}'), 1);
  assert.equal(await metric(perch, 'perch_upstream_throttle_reject_probability{upstream="main"}'), 0);
  assert.equal(await metric(perch, 'perch_upstream_refused_total{upstream="main",route="user",reason="throttled"}'), undefined);
});

test('every other call 503 with retries: 2: more keys are served, and the retry budget holds calls to 1.2 per miss', { timeout: 30_000 }, async (t) => {
  const upstream = await startUpstream(t, failingEvery(2, json(503, {})));
  const perch = await startPerch(t, testConfig(v1('main', upstream.url, 'retries: 2')), { clock: new ManualClock(), random: NEVER_RANDOM });
  const statuses = await misses(perch, 1, 400);
  const retried = await metric(perch, 'perch_upstream_retries_total{upstream="main",route="user",decision="retried"}');
  // The budget: at most 20% of the requests of the window (the clock stands still: all of them),
  // each retry counted before it is made.
  assert.equal(retried, 79);
  assert.equal(upstream.requests.length, 479);
  // The upstream answered every other of its 479 calls; every retry met an answer, and shifted the
  // alternation so that the next miss's first call met a 503.
  assert.deepEqual(tally(statuses), { 200: 240, 502: 160 });
  assert.ok(upstream.requests.length / 400 <= 1.2);
});

test('a dead provider: the breaker opens after 20 failures, then probes at 1 s, doubling to 4 s; the throttle alone sheds too', { timeout: 30_000 }, async (t) => {
  const clock = new ManualClock();
  const upstream = await startUpstream(t, json(503, {}));
  const perch = await startPerch(t, testConfig(v1('main', upstream.url)), { clock, random: NEVER_RANDOM });
  assert.deepEqual(tally(await misses(perch, 1, 100)), { 502: 100 });
  assert.equal(upstream.requests.length, 20, 'the breaker opened on the 20th failure in a row');
  for (const [waitMs, calls] of [[1000, 21], [2000, 22], [4000, 23], [4000, 24]] as const) {
    clock.advance(waitMs - 1);
    await misses(perch, 1000 + calls * 10, 5);
    assert.equal(upstream.requests.length, calls - 1, `no call before ${waitMs} ms`);
    clock.advance(1);
    await misses(perch, 2000 + calls * 10, 5);
    assert.equal(upstream.requests.length, calls, `one probe at ${waitMs} ms`);
  }

  // Without the breaker the throttle sheds every call once the window holds min_calls failures.
  const alone = await startUpstream(t, json(503, {}));
  const noBreaker = 'breaker: { consecutive_failures: 10000, failure_ratio: 1 }';
  const throttled = await startPerch(t, testConfig(v1('main', alone.url, noBreaker)), { clock, random: NEVER_RANDOM });
  assert.deepEqual(tally(await misses(throttled, 1, 100)), { 502: 100 });
  assert.equal(alone.requests.length, 20);
  assert.equal(await metric(throttled, 'perch_upstream_refused_total{upstream="main",route="user",reason="throttled"}'), 80);
  assert.equal(await metric(throttled, 'perch_upstream_throttle_reject_probability{upstream="main"}'), 20 / 21);
  const refused = await throttled.request('/v1/users/5000');
  assert.deepEqual([refused.status, refused.json().error.code, refused.headers.get('retry-after')], [502, 'E502', null]);
});

test('a blip: the first probe after the heal closes the breaker, and the throttle forgets the blip at once', { timeout: 30_000 }, async (t) => {
  const clock = new ManualClock();
  const upstream = await startUpstream(t, json(503, {}));
  const perch = await startPerch(t, testConfig(v1('main', upstream.url)), { clock, random: NEVER_RANDOM });
  assert.deepEqual(tally(await misses(perch, 1, 30)), { 502: 30 });
  assert.equal(upstream.requests.length, 20);
  upstream.behaviour = sampleProvider;
  clock.advance(1000);
  // The probe passes the throttle (whose window holds 20 failures) and closes the breaker; the
  // throttle is reset with it, so the keys after it are all served.
  assert.deepEqual(tally(await misses(perch, 100, 50)), { 200: 50 });
  assert.equal(upstream.requests.length, 70);
  assert.equal(await metric(perch, 'perch_upstream_breaker_state{upstream="main",state="closed"}'), 1);
  assert.equal(await metric(perch, 'perch_upstream_throttle_reject_probability{upstream="main"}'), 0);
});

test('a hanging provider: 504 at timeout_ms, and once 20 have timed out the breaker sheds the rest at once', { timeout: 30_000 }, async (t) => {
  const upstream = await startUpstream(t, () => {});
  const perch = await startPerch(t, testConfig(v1('main', upstream.url, 'timeout_ms: 100')), { clock: new ManualClock(), random: NEVER_RANDOM });
  const hung = await Promise.all(Array.from({ length: 20 }, (_, i) => perch.request(`/v1/users/${i + 1}`)));
  assert.deepEqual(tally(hung.map((r) => r.status)), { 504: 20 });
  const started = performance.now();
  assert.deepEqual(tally(await misses(perch, 100, 10)), { 502: 10 });
  assert.ok(performance.now() - started < 100 * 10, 'refused without waiting for the provider');
  assert.equal(upstream.requests.length, 20);
  assert.equal(await metric(perch, 'perch_upstream_refused_total{upstream="main",route="user",reason="breaker_open"}'), 10);
});

test('with Redis unreachable the throttle goes on with its own counts: a dead provider is still shed', { timeout: 30_000 }, async (t) => {
  const redis = await startRedis(t);
  const upstream = await startUpstream(t, json(503, {}));
  const noBreaker = 'breaker: { consecutive_failures: 10000, failure_ratio: 1 }';
  const yaml = testConfig(v1('main', upstream.url, noBreaker), `rate_limits_redis: { url: "${redis.url}", command_timeout_ms: 200 }`);
  const clock = new ManualClock();
  const perch = await startPerch(t, yaml, { clock, random: NEVER_RANDOM });
  assert.equal((await perch.request('/v1/users/1')).status, 502);
  await redis.kill();
  // A slice (1 s) apart, so that each batch's first call reports to the dead Redis.
  const statuses: number[] = [];
  for (let batch = 0; batch < 4; batch++) {
    clock.advance(1000);
    statuses.push(...(await misses(perch, 100 * (batch + 1), 10)));
  }
  assert.deepEqual(tally(statuses), { 502: 40 });
  assert.equal(upstream.requests.length, 20, 'shed from the 21st on, on this instance\'s counts');
  assert.equal(await metric(perch, 'perch_upstream_refused_total{upstream="main",route="user",reason="throttled"}'), 21);
});
