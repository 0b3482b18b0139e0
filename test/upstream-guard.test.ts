import assert from 'node:assert/strict';
import { test } from 'node:test';
import { CLOCK_GRANULARITY_MS } from '../src/upstream/guard/provider-state.js';
import { ManualClock } from './helpers/clock.js';
import { guardedUpstream, limitedOnce } from './helpers/guarded-upstream.js';
import { startPerch, testConfig, v1, waitFor } from './helpers/perch.js';
import { json, sampleProvider, startUpstream } from './helpers/upstream-server.js';

const E429 = { error: { message: 'Rate limit exceeded. Please try again later.', code: 'E429' } };

test('after a 429 with Retry-After no call reaches the upstream until that time, and clients get the seconds left', { timeout: 10_000 }, async (t) => {
  const { clock, upstream, perch } = await guardedUpstream(t, limitedOnce({ 'retry-after': '30' }));
  const first = await perch.request('/v1/users/1');
  assert.deepEqual([first.status, first.json(), first.headers.get('retry-after')], [429, E429, '30']);
  clock.advance(12_500);
  for (let i = 2; i <= 51; i++) {
    const res = await perch.request(`/v1/users/${i}`);
    assert.deepEqual([res.status, res.headers.get('retry-after')], [429, '18'], `miss ${i}`);
  }
  assert.equal(upstream.requests.length, 1);
  clock.advance(17_499);
  assert.equal((await perch.request('/v1/users/52')).status, 429);
  assert.equal(upstream.requests.length, 1);
  clock.advance(1);
  assert.equal((await perch.request('/v1/users/53')).status, 200);
  assert.equal(upstream.requests.length, 2);
  const stops = perch.logs.lines().filter((l) => l.msg === 'provider said stop: cooling down');
  assert.equal(stops.length, 1, 'one log line per state change, not per request');
  assert.deepEqual([stops[0]!.upstream, stops[0]!.credential, stops[0]!.cause], ['main', 'default', 'status_429']);
});

test('the stop time comes from an HTTP date, else x-rate-limit-reset, else retry_after_default_seconds', { timeout: 10_000 }, async (t) => {
  const cases: [Record<string, string>, string, number][] = [
    [{ 'retry-after': new Date(Date.UTC(2026, 0, 1) + 45_000).toUTCString() }, '', 45],
    [{ 'x-rate-limit-reset': String(Date.UTC(2026, 0, 1) / 1000 + 120) }, '', 120],
    [{}, 'retry_after_default_seconds: 42', 42],
    // Not delay-seconds nor an IMF-fixdate: the valid reset beside it decides (issue 50).
    [{ 'retry-after': '1.5', 'x-rate-limit-reset': String(Date.UTC(2026, 0, 1) / 1000 + 90) }, '', 90],
  ];
  for (const [headers, extra, seconds] of cases) {
    const { clock, upstream, perch } = await guardedUpstream(t, limitedOnce(headers), extra);
    assert.equal((await perch.request('/v1/users/1')).headers.get('retry-after'), String(seconds));
    clock.advance(seconds * 1000 - 1);
    assert.equal((await perch.request('/v1/users/2')).status, 429);
    clock.advance(1);
    assert.equal((await perch.request('/v1/users/3')).status, 200);
    assert.equal(upstream.requests.length, 2, JSON.stringify(headers));
  }
});

test('cooldown_scope endpoint stops only the endpoint that drew the 429', { timeout: 10_000 }, async (t) => {
  const { upstream, perch } = await guardedUpstream(t, limitedOnce({ 'retry-after': '60' }), 'cooldown_scope: endpoint');
  assert.equal((await perch.request('/v1/users/1')).status, 429);
  assert.equal((await perch.request('/v1/users/2')).status, 429);
  assert.equal((await perch.request('/v1/tweets/1')).status, 200);
  assert.deepEqual(
    upstream.requests.map((r) => r.url),
    ['/v1/users/1', '/v1/tweets/1'],
  );
});

test('a provider window reported down to the reserve stops calls until its reset, without spending a 429', { timeout: 10_000 }, async (t) => {
  const reset = String(Date.UTC(2026, 0, 1) / 1000 + 900);
  let remaining = 3;
  const { clock, upstream, perch } = await guardedUpstream(
    t,
    (req, res) => {
      res.setHeader('x-rate-limit-remaining', String(--remaining));
      res.setHeader('x-rate-limit-reset', reset);
      sampleProvider(req, res);
    },
    'rate_limit_reserve: 1',
  );
  assert.equal((await perch.request('/v1/users/1')).status, 200);
  assert.equal((await perch.request('/v1/users/2')).status, 200);
  const refused = await perch.request('/v1/users/3');
  assert.deepEqual([refused.status, refused.headers.get('retry-after')], [429, '900']);
  assert.equal(upstream.requests.length, 2);
  clock.advance(900_000);
  assert.equal((await perch.request('/v1/users/4')).status, 200);
  assert.equal(upstream.requests.length, 3);
});

test('during a cool-down a miss fails over to the next upstream of its route; the cooling one gets nothing', { timeout: 10_000 }, async (t) => {
  const clock = new ManualClock();
  const limited = await startUpstream(t, json(429, {}, { 'retry-after': '30' }));
  const backup = await startUpstream(t, sampleProvider);
  const perch = await startPerch(t, testConfig(`${v1('limited', limited.url)}\n${v1('backup', backup.url)}`, 'routes: { user: [limited, backup] }'), {
    clock,
    timers: clock,
  });
  for (let i = 1; i <= 5; i++) assert.equal((await perch.request(`/v1/users/${i}`)).status, 200);
  assert.deepEqual([limited.requests.length, backup.requests.length], [1, 5]);
  // The 429 is logged at warn; the refusals that follow only at debug (below the test's info).
  const failovers = perch.logs.lines().filter((l) => l.msg === 'upstream failover');
  assert.deepEqual(
    failovers.map((l) => [l.reason, l.level, l.next]),
    [['rate_limited', 40, 'backup']],
  );
  const metrics = await (await fetch(`${perch.url}/metrics`)).text();
  assert.match(metrics, /perch_upstream_failovers_total\{upstream="limited",route="user",reason="cooling_down"\} 4/);
  assert.match(metrics, /perch_upstream_refused_total\{upstream="limited",route="user",reason="cooling_down"\} 4/);
});

test('over max_requests_per_second a miss waits in the queue, then gets 429 with Retry-After when queue_timeout_ms runs out', { timeout: 10_000 }, async (t) => {
  const { clock, upstream, perch } = await guardedUpstream(t, sampleProvider, 'max_requests_per_second: 2, queue_timeout_ms: 1500');
  const pending = Array.from({ length: 7 }, (_, i) => perch.request(`/v1/users/${i + 1}`));
  // Five misses queued: five expiry timers and the queue's one wake-up.
  await waitFor(() => upstream.requests.length === 2 && clock.waiting === 6);
  // A window and the clock's granularity after the first two answered (provider-state.ts).
  clock.advance(1000 + CLOCK_GRANULARITY_MS);
  // Answered before the clock moves on: a call's window runs from its answer. The misses waited
  // for the window, so the bucket saved no burst: one goes now, the next a refill (500 ms) later,
  // a millisecond after the queue timeout of the four still waiting.
  await pending[2];
  clock.advance(500 - CLOCK_GRANULARITY_MS);
  const results = await Promise.all(pending);
  assert.deepEqual(
    results.map((r) => r.status),
    [200, 200, 200, 429, 429, 429, 429],
  );
  assert.equal(results[3]!.headers.get('retry-after'), '1');
  // Served in arrival order: the first three ids reached the upstream.
  assert.deepEqual(upstream.requests.map((r) => r.url), ['/v1/users/1', '/v1/users/2', '/v1/users/3']);
  const metrics = await (await fetch(`${perch.url}/metrics`)).text();
  assert.match(metrics, /perch_upstream_refused_total\{upstream="main",route="user",reason="over_cap"\} 4/);
  assert.match(metrics, /perch_upstream_queue_wait_seconds_count\{upstream="main"\} 5/);
});

test('a miss refused by the call cap gets the wait for the next token as Retry-After, rounded up', { timeout: 10_000 }, async (t) => {
  // 0.4 calls per second: the next token comes 2.5 s after the first call, so Retry-After is 3.
  const { upstream, perch } = await guardedUpstream(t, sampleProvider, 'max_requests_per_second: 0.4, burst: 1, queue_timeout_ms: 0');
  assert.equal((await perch.request('/v1/users/1')).status, 200);
  const refused = await perch.request('/v1/users/2');
  assert.deepEqual([refused.status, refused.headers.get('retry-after')], [429, '3']);
  assert.equal(upstream.requests.length, 1);
});

test('max_concurrent lets the next miss through only when a call ends', { timeout: 10_000 }, async (t) => {
  const held: (() => void)[] = [];
  const { upstream, perch } = await guardedUpstream(t, (req, res) => held.push(() => sampleProvider(req, res)), 'max_concurrent: 1, queue_timeout_ms: 5000');
  const first = perch.request('/v1/users/1');
  const second = perch.request('/v1/users/2');
  await waitFor(() => upstream.requests.length === 1);
  await new Promise((resolve) => setImmediate(resolve));
  assert.equal(upstream.requests.length, 1);
  held.shift()!();
  assert.equal((await first).status, 200);
  await waitFor(() => upstream.requests.length === 2);
  held.shift()!();
  assert.equal((await second).status, 200);
});

test('a switch of credential with less than the floor of the miss deadline left makes no call: the 429 stands', { timeout: 10_000 }, async (t) => {
  // The first credential's 429 comes 970 ms into a 1000 ms deadline; the pool would try the second.
  let calls = 0;
  const upstream = await startUpstream(t, (req, res) => {
    if (++calls === 1) setTimeout(() => json(429, {}, { 'retry-after': '30' })(req, res), 970);
  });
  const pool = 'credentials: [{ id: one, headers: { X-Key: "k-one-0123456789" } }, { id: two, headers: { X-Key: "k-two-0123456789" } }]';
  const yaml = testConfig(v1('main', upstream.url, pool)).replace('port: 0 }', 'port: 0, miss_deadline_ms: 1000 }');
  const perch = await startPerch(t, yaml);
  const res = await perch.request('/v1/users/1');
  assert.deepEqual([res.status, res.headers.get('retry-after')], [429, '30']);
  assert.equal(upstream.requests.length, 1, 'no call on the second credential');
  const metrics = await (await fetch(`${perch.url}/metrics`)).text();
  assert.match(metrics, /perch_upstream_refused_total\{upstream="main",route="user",reason="no_time"\} 1/);
});

test('a miss waits in the provider queue only until the floor before its deadline', { timeout: 10_000 }, async (t) => {
  const held: (() => void)[] = [];
  const clock = new ManualClock();
  const upstream = await startUpstream(t, (req, res) => held.push(() => sampleProvider(req, res)));
  const yaml = testConfig(v1('main', upstream.url, 'max_concurrent: 1, queue_timeout_ms: 5000')).replace('port: 0 }', 'port: 0, miss_deadline_ms: 1000 }');
  const perch = await startPerch(t, yaml, { clock, timers: clock });
  const first = perch.request('/v1/users/1');
  await waitFor(() => upstream.requests.length === 1);
  let answered = false;
  const second = perch.request('/v1/users/2').finally(() => (answered = true));
  await waitFor(() => clock.waiting > 0);
  // Its wait was at most 1000 ms less the 50 ms floor: 950 ms on the queue's timers end it.
  clock.advance(950);
  await waitFor(() => answered);
  assert.equal((await second).status, 429);
  held.shift()!();
  assert.equal((await first).status, 200);
  assert.equal(upstream.requests.length, 1);
});
