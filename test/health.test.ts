import assert from 'node:assert/strict';
import { test } from 'node:test';
import { ManualClock } from './helpers/clock.js';
import { startPerch, testConfig, v1 } from './helpers/perch.js';
import { json, refusedPort, sampleProvider, startUpstream } from './helpers/upstream-server.js';

test('/healthz and /readyz answer without a key and without spending a rate-limit token', async (t) => {
  const perch = await startPerch(
    t,
    testConfig('demo: { kind: fixture }').replace('big: { capacity: 100000, refill_per_second: 100000 }', 'big: { capacity: 1, refill_per_second: 0.001 }'),
  );
  for (let i = 0; i < 3; i++) {
    const health = await perch.request('/healthz', { key: null });
    assert.equal(health.status, 200);
    assert.deepEqual(health.json(), { status: 'ok' });
    const ready = await perch.request('/readyz?probe=1', { key: null });
    assert.equal(ready.status, 200);
    assert.equal(ready.json().status, 'ok');
    assert.equal(ready.json().checks.config, 'ok');
    assert.equal(ready.headers.get('cache-control'), 'no-store');
  }
  // The one token is still there for the API.
  assert.equal((await perch.request('/v1/users/1')).status, 200);
  assert.equal((await perch.request('/healthz', { method: 'POST', key: null })).status, 405);
  assert.equal((await perch.request('/healthz', { method: 'HEAD', key: null })).text, '');
});

test('/readyz stays 200 when the provider says stop, naming the upstream and the route it leaves without one', { timeout: 10_000 }, async (t) => {
  const limited = await startUpstream(t, json(429, {}, { 'retry-after': '30' }));
  const clock = new ManualClock();
  const perch = await startPerch(t, testConfig(`demo: { kind: fixture }\n${v1('limited', limited.url)}`, 'routes: { tweet: [limited] }'), {
    clock,
    timers: clock,
  });
  assert.deepEqual((await perch.request('/readyz', { key: null })).json().status, 'ok');
  assert.equal((await perch.request('/v1/tweets/1')).status, 429);
  const ready = await perch.request('/readyz', { key: null });
  assert.equal(ready.status, 200);
  const body = ready.json();
  assert.equal(body.status, 'degraded');
  assert.equal(body.checks['upstream:limited'], `cooling_down until ${new Date(clock.now() + 30_000).toISOString()}`);
  assert.equal(body.checks['route:tweet'], 'no usable upstream');
  assert.equal(body.checks['route:user'], 'ok');
  assert.equal(body.checks['upstream:demo'], 'ok');
  clock.advance(30_000);
  assert.deepEqual((await perch.request('/readyz', { key: null })).json().status, 'ok');
});

test('/readyz stays 200 degraded while the provider rejects the one credential, and cached GETs stay 200', { timeout: 10_000 }, async (t) => {
  let rejecting = false;
  const upstream = await startUpstream(t, (req, res) => (rejecting ? json(401, {})(req, res) : sampleProvider(req, res)));
  const clock = new ManualClock();
  const perch = await startPerch(t, testConfig(v1('main', upstream.url)), { clock, timers: clock });
  assert.equal((await perch.request('/v1/users/1')).status, 200);
  rejecting = true;
  assert.equal((await perch.request('/v1/users/2')).status, 502);
  const ready = await perch.request('/readyz', { key: null });
  assert.equal(ready.status, 200, 'a credential the provider rejects is rejected for every instance alike: not this instance\'s own');
  assert.equal(ready.json().status, 'degraded');
  assert.equal(ready.json().checks['upstream:main'], `no_credential until ${new Date(clock.now() + 300_000).toISOString()}`);
  const cached = await perch.request('/v1/users/1');
  assert.deepEqual([cached.status, cached.headers.get('cache-status')?.includes('hit')], [200, true], 'the cache still answers');
});

test('a Redis never reached since start shows perch_redis_up 0 and a degraded /readyz, not a failed one', { timeout: 10_000 }, async (t) => {
  const port = await refusedPort();
  const perch = await startPerch(t, testConfig('demo: { kind: fixture }', `cache: { redis: { url: "redis://127.0.0.1:${port}" } }`));
  const metrics = await (await fetch(`${perch.url}/metrics`)).text();
  assert.match(metrics, /^perch_redis_up 0$/m);
  const ready = await perch.request('/readyz', { key: null });
  assert.deepEqual([ready.status, ready.json().status, ready.json().checks.redis], [200, 'degraded', 'unavailable']);
  assert.equal((await perch.request('/v1/users/1')).status, 200, 'it serves all the same');
});

test('/readyz names a credential the provider rejects while another still serves: degraded, 200', { timeout: 10_000 }, async (t) => {
  const upstream = await startUpstream(t, (req, res) => (req.headers.authorization === 'Bearer bad-token-0123456789' ? json(401, {})(req, res) : sampleProvider(req, res)));
  const clock = new ManualClock();
  const credentials = 'credentials: [{ id: good, headers: { authorization: "Bearer good-token-0123456789" } }, { id: bad, headers: { authorization: "Bearer bad-token-0123456789" } }]';
  const perch = await startPerch(t, testConfig(v1('main', upstream.url, credentials)), { clock, timers: clock });
  assert.equal((await perch.request('/readyz', { key: null })).json().status, 'ok');
  for (let i = 1; i <= 4; i++) assert.equal((await perch.request(`/v1/users/${i}`)).status, 200, 'the good credential answers, retried past the bad one');
  const ready = await perch.request('/readyz', { key: null });
  assert.equal(ready.status, 200);
  const body = ready.json();
  assert.deepEqual(
    [body.status, body.checks['upstream:main'], body.checks['credential:main/bad'], body.checks['credential:main/good'], body.checks['route:user']],
    ['degraded', 'ok', `revoked until ${new Date(clock.now() + 300_000).toISOString()}`, undefined, 'ok'],
  );
  assert.ok(!ready.text.includes('token-0123456789'), 'no credential secret in the probe');
});
