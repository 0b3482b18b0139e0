import assert from 'node:assert/strict';
import { test } from 'node:test';
import { ManualClock } from './helpers/clock.js';
import { startPerch, testConfig, v1 } from './helpers/perch.js';
import { json, refusedPort, startUpstream } from './helpers/upstream-server.js';

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

test('/readyz is 503 once every credential of every upstream is rejected (only the operator can fix that)', { timeout: 10_000 }, async (t) => {
  const rejecting = await startUpstream(t, json(401, {}));
  const perch = await startPerch(t, testConfig(v1('main', rejecting.url)));
  assert.equal((await perch.request('/readyz', { key: null })).status, 200);
  assert.equal((await perch.request('/v1/users/1')).status, 502);
  const ready = await perch.request('/readyz', { key: null });
  assert.equal(ready.status, 503);
  assert.equal(ready.json().status, 'unavailable');
  assert.match(ready.json().checks['upstream:main'], /^no_credential until \d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/, 'until its recheck');
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
