import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Redis } from 'ioredis';
import { Pool, type Dispatcher } from 'undici';
import { ManualClock } from './helpers/clock.js';
import { metric, startPerch, testConfig, v1, waitFor, type RunningPerch } from './helpers/perch.js';
import { startRedis } from './helpers/redis-server.js';
import { failingEvery, json, refusedPort, sampleProvider, startUpstream, type UpstreamBehaviour } from './helpers/upstream-server.js';
import { onCleanup } from './helpers/cleanup.js';

/** A real undici pool that counts the requests dispatched through it: calls to a refused port. */
class CountingPool extends Pool {
  calls = 0;

  override dispatch(options: Dispatcher.DispatchOptions, handler: Dispatcher.DispatchHandler): boolean {
    this.calls++;
    return super.dispatch(options, handler);
  }
}

const reset: UpstreamBehaviour = (req) => req.socket.destroy();

/** Sends `paths` with `concurrency` requests in flight, returning the statuses in order. */
async function load(perch: RunningPerch, paths: string[], concurrency: number): Promise<number[]> {
  const statuses: number[] = new Array(paths.length);
  let next = 0;
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      for (let i = next++; i < paths.length; i = next++) statuses[i] = (await perch.request(paths[i]!)).status;
    }),
  );
  return statuses;
}

const breakerLines = (perch: RunningPerch) => perch.logs.lines().filter((l) => String(l.msg).startsWith('upstream breaker'));

test('a dead first upstream: the second serves; once its breaker opens the dead one gets no call until the probe', { timeout: 20_000 }, async (t) => {
  const clock = new ManualClock();
  const deadUrl = `http://127.0.0.1:${await refusedPort()}`;
  // perch closes it with its upstreams.
  const dead = new CountingPool(deadUrl);
  const good = await startUpstream(t, sampleProvider);
  const yaml = testConfig([v1('dead', deadUrl), v1('good', good.url)].join('\n'), 'routes: { user: [dead, good] }');
  const perch = await startPerch(t, yaml, { clock, dispatchers: { dead } });

  // The default breaker: 20 failures in a row open it, for 1 s before the first probe.
  for (let i = 1; i <= 20; i++) assert.equal((await perch.request(`/v1/users/${i}`)).status, 200);
  assert.equal(dead.calls, 20);
  assert.deepEqual(
    breakerLines(perch).map((l) => [l.level, l.upstream, l.consecutive_failures, l.reason, l.open_ms]),
    [[40, 'dead', 20, 'connection', 1000]],
  );
  assert.equal(await metric(perch, 'perch_upstream_breaker_state{upstream="dead",state="open"}'), 1);

  const statuses = await load(perch, Array.from({ length: 40 }, (_, i) => `/v1/users/${100 + i}`), 4);
  assert.ok(statuses.every((s) => s === 200));
  assert.equal(dead.calls, 20, 'no call while open');
  assert.equal(good.requests.length, 60);
  assert.equal(await metric(perch, 'perch_upstream_refused_total{upstream="dead",route="user",reason="breaker_open"}'), 40);

  clock.advance(999);
  assert.equal((await perch.request('/v1/users/200')).status, 200);
  assert.equal(dead.calls, 20);
  clock.advance(1);
  assert.equal((await perch.request('/v1/users/201')).status, 200);
  assert.equal(dead.calls, 21, 'exactly one half-open probe, 1 s after the breaker opened');
  await load(perch, Array.from({ length: 10 }, (_, i) => `/v1/users/${300 + i}`), 4);
  assert.equal(dead.calls, 21, 'the failed probe reopened it');
  assert.deepEqual(breakerLines(perch).map((l) => l.msg), [
    'upstream breaker open: no calls until its half-open probe',
    'upstream breaker half-open: one probe goes through',
    'upstream breaker open: no calls until its half-open probe',
  ]);
  // Each failed probe doubles the wait for the next, up to half_open_max_ms (4 s by default).
  for (const [waitMs, calls] of [[2000, 22], [4000, 23], [4000, 24]] as const) {
    clock.advance(waitMs - 1);
    assert.equal((await perch.request(`/v1/users/${400 + calls}`)).status, 200);
    assert.equal(dead.calls, calls - 1, `no probe before ${waitMs} ms`);
    clock.advance(1);
    assert.equal((await perch.request(`/v1/users/${500 + calls}`)).status, 200);
    assert.equal(dead.calls, calls, `a probe at ${waitMs} ms`);
  }
  assert.deepEqual(breakerLines(perch).filter((l) => l.level === 40).map((l) => l.open_ms), [1000, 2000, 4000, 4000, 4000]);
});

test('an open breaker answers 502 at once, shows in /readyz and closes after a good probe', { timeout: 20_000 }, async (t) => {
  const clock = new ManualClock();
  const upstream = await startUpstream(t, json(500, {}));
  const breaker = 'breaker: { consecutive_failures: 3, half_open_after_ms: 5000 }';
  const perch = await startPerch(t, testConfig(v1('main', upstream.url, breaker)), { clock });
  for (let i = 1; i <= 3; i++) assert.equal((await perch.request(`/v1/users/${i}`)).status, 502);
  const refused = await perch.request('/v1/users/4');
  assert.deepEqual([refused.status, refused.json().error.code], [502, 'E502']);
  assert.equal(upstream.requests.length, 3);
  // The provider is down for every instance alike: readiness says so but stays 200, or a balancer
  // would pull the whole fleet, cache hits and all.
  const ready = await perch.request('/readyz', { key: null });
  assert.deepEqual([ready.status, ready.json().status], [200, 'degraded']);
  assert.equal(ready.json().checks['route:user'], 'no usable upstream');
  assert.equal(ready.json().checks['upstream:main'], 'breaker_open');

  // Past half_open_after_ms the upstream is worth a probe again, so /readyz must not keep traffic away.
  clock.advance(5000);
  assert.equal(await metric(perch, 'perch_upstream_breaker_state{upstream="main",state="open"}'), 1);
  assert.equal((await perch.request('/readyz', { key: null })).json().checks['route:user'], 'ok');
  upstream.behaviour = sampleProvider;
  assert.equal((await perch.request('/v1/users/5')).status, 200);
  assert.equal(upstream.requests.length, 4);
  assert.equal(await metric(perch, 'perch_upstream_breaker_state{upstream="main",state="closed"}'), 1);
  assert.deepEqual(breakerLines(perch).map((l) => [l.level, l.msg]), [
    [40, 'upstream breaker open: no calls until its half-open probe'],
    [30, 'upstream breaker half-open: one probe goes through'],
    [30, 'upstream breaker closed: upstream is back'],
  ]);
  assert.equal((await perch.request('/v1/users/6')).status, 200);
  assert.equal(upstream.requests.length, 5);
});

test('an upstream resetting 1 connection in 20, retries 2: misses succeed at little extra cost', { timeout: 30_000 }, async (t) => {
  const upstream = await startUpstream(t, failingEvery(20, reset));
  const perch = await startPerch(t, testConfig(v1('main', upstream.url, 'retries: 2')));
  const misses = 400;
  const statuses = await load(perch, Array.from({ length: misses }, (_, i) => `/v1/users/${i + 1}`), 8);
  const ok = statuses.filter((s) => s === 200).length;
  const calls = upstream.requests.length;
  t.diagnostic(`resets 1/20, retries 2: ${ok}/${misses} misses succeeded, ${calls} upstream calls (${(calls / misses).toFixed(4)} per miss)`);
  assert.ok(ok >= misses * 0.995, `${ok} of ${misses} succeeded`);
  assert.ok(calls <= misses * 1.1, `${calls} calls for ${misses} misses`);
  const retried = await metric(perch, 'perch_upstream_retries_total{upstream="main",route="user",decision="retried"}');
  assert.equal(retried, calls - misses, 'every extra call is a counted retry');
});

test('a 50%-failing upstream: the retry budget bounds the calls, and stale keys are served without error', { timeout: 30_000 }, async (t) => {
  const clock = new ManualClock();
  const upstream = await startUpstream(t, sampleProvider);
  // The breaker is kept out of the way so the budget alone bounds the calls.
  const protection = 'retries: 2, breaker: { consecutive_failures: 10000, failure_ratio: 1 }';
  const cache = 'cache: { stale_seconds: 600, ttl_seconds: { user: 300 } }';
  const perch = await startPerch(t, testConfig(v1('main', upstream.url, protection), cache), { clock });
  const cached = Array.from({ length: 10 }, (_, i) => `/v1/users/${i + 1}`);
  assert.ok((await load(perch, cached, 1)).every((s) => s === 200));
  assert.equal(upstream.requests.length, 10);

  upstream.behaviour = failingEvery(2, json(503, {}));
  clock.advance(301_000);
  const misses = 200;
  const statuses = await load(perch, Array.from({ length: misses }, (_, i) => `/v1/users/${1000 + i}`), 1);
  const calls = upstream.requests.length - 10;
  const ok = statuses.filter((s) => s === 200).length;
  const count = (decision: string) => metric(perch, `perch_upstream_retries_total{upstream="main",route="user",decision="${decision}"}`);
  const [retried, refused] = [await count('retried'), await count('budget_exhausted')];
  t.diagnostic(`every other call 503, retries 2, budget 20%: ${calls} calls for ${misses} misses (${(calls / misses).toFixed(3)} per miss), ${ok} succeeded, ${retried} retried, ${refused} budget_exhausted`);
  assert.ok(calls <= misses * 1.2, `${calls} calls for ${misses} misses`);
  assert.equal(calls, misses + retried!);

  for (const path of cached) {
    const response = await perch.request(path);
    assert.equal(response.status, 200, path);
    assert.equal(response.headers.get('cache-status'), 'perch; fwd=stale; ttl=-1');
  }
});

test('with Redis, a breaker opened on instance A makes instance B refuse without calling', { timeout: 30_000 }, async (t) => {
  const clock = new ManualClock();
  const redis = await startRedis(t);
  const client = new Redis(redis.url);
  onCleanup(t, () => client.disconnect());
  const upstream = await startUpstream(t, json(500, {}));
  const yaml = testConfig(v1('main', upstream.url), `rate_limits_redis: { url: "${redis.url}", command_timeout_ms: 1000 }`);
  const a = await startPerch(t, yaml, { clock });
  const b = await startPerch(t, yaml, { clock });

  for (let i = 1; i <= 20; i++) assert.equal((await a.request(`/v1/users/${i}`)).status, 502);
  assert.equal(upstream.requests.length, 20);
  await waitFor(async () => (await client.exists('perch:{up:main}:stop:*:*')) === 1);

  for (let i = 1; i <= 5; i++) {
    const response = await b.request(`/v1/users/${100 + i}`);
    assert.deepEqual([response.status, response.json().error.code], [502, 'E502']);
  }
  assert.equal(upstream.requests.length, 20, 'B made no call');
  assert.equal(await metric(b, 'perch_upstream_refused_total{upstream="main",route="user",reason="breaker_open"}'), 5);
  const ready = (await b.request('/readyz', { key: null })).json();
  assert.deepEqual([ready.status, ready.checks['upstream:main']], ['degraded', `breaker_open until ${new Date(clock.now() + 1000).toISOString()}`]);
});

/** `testConfig` with `server.miss_deadline_ms` set. */
function withDeadline(yaml: string, deadlineMs: number): string {
  return yaml.replace('port: 0 }', `port: 0, miss_deadline_ms: ${deadlineMs} }`);
}

test('a miss out of time calls no further upstream: the backup bills nothing, its breaker stays closed, its own route serves', { timeout: 30_000 }, async (t) => {
  // Issue 50: main never answers, one retry; the deadline ends with main's retry, and the
  // backup used to get a call for each miss with about 1 ms left, time out, and open its breaker.
  const main = await startUpstream(t, () => {});
  const backup = await startUpstream(t, (req, res) => void setTimeout(() => sampleProvider(req, res), 30));
  const upstreams = [
    v1('main', main.url, 'timeout_ms: 500, retries: 1, retry_budget_min_per_second: 1000'),
    v1('backup', backup.url, 'breaker: { consecutive_failures: 3 }'),
  ];
  const perch = await startPerch(t, withDeadline(testConfig(upstreams.join('\n'), 'routes: { user: [main, backup], tweet: [backup] }'), 1000));
  // A warm keep-alive connection to the backup, as in production: a call with 1 ms left reaches it.
  assert.equal((await perch.request('/v1/tweets/1')).status, 200);
  for (let i = 1; i <= 4; i++) {
    const miss = await perch.request(`/v1/users/${i}`);
    assert.deepEqual([miss.status, miss.json().error.code], [504, 'E504']);
  }
  assert.equal(main.requests.length, 8, 'each miss: main and its retry');
  assert.equal(backup.requests.length, 1, 'no call with no time left to answer it');
  assert.equal(await metric(perch, 'perch_upstream_breaker_state{upstream="backup",state="closed"}'), 1);
  assert.equal((await perch.request('/v1/tweets/2')).status, 200);
  assert.equal(backup.requests.length, 2);
  assert.equal(await metric(perch, 'perch_upstream_refused_total{upstream="backup",route="user",reason="no_time"}'), 4);
});

test('a call the miss deadline cut short counts against no breaker: the upstream had less than its timeout_ms', { timeout: 30_000 }, async (t) => {
  // main fails after 700 ms of a 1000 ms deadline; the backup would answer in 400 ms, but gets
  // the 300 ms left: its timeouts are the deadline's, not the backup's.
  const main = await startUpstream(t, (req, res) => void setTimeout(() => json(500, {})(req, res), 700));
  const backup = await startUpstream(t, (req, res) => void setTimeout(() => sampleProvider(req, res), 400));
  const upstreams = [v1('main', main.url, 'timeout_ms: 2000'), v1('backup', backup.url, 'timeout_ms: 2000, breaker: { consecutive_failures: 3 }')];
  const perch = await startPerch(t, withDeadline(testConfig(upstreams.join('\n'), 'routes: { user: [main, backup], tweet: [backup] }'), 1000));
  const misses = await Promise.all([1, 2, 3, 4].map((i) => perch.request(`/v1/users/${i}`)));
  assert.deepEqual(misses.map((r) => r.status), [504, 504, 504, 504]);
  assert.equal(backup.requests.length, 4, 'the backup was called with time left');
  assert.equal(await metric(perch, 'perch_upstream_breaker_state{upstream="backup",state="closed"}'), 1);
  assert.equal((await perch.request('/v1/tweets/1')).status, 200);
});

test('a miss_deadline_ms under 500 ms keeps a tenth of it as the floor: its first call still goes out', { timeout: 10_000 }, async (t) => {
  const upstream = await startUpstream(t, sampleProvider);
  const perch = await startPerch(t, withDeadline(testConfig(v1('main', upstream.url)), 40));
  assert.equal((await perch.request('/v1/users/1')).status, 200);
  assert.equal(upstream.requests.length, 1);
});
