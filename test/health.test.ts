import assert from 'node:assert/strict';
import { test } from 'node:test';
import { startPerch, testConfig, v1 } from './helpers/perch.js';
import { refusedPort } from './helpers/upstream-server.js';

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

test('/readyz is 503 naming the route whose every upstream just failed, and recovers with it', async (t) => {
  const port = await refusedPort();
  const perch = await startPerch(t, testConfig(`demo: { kind: fixture }\n${v1('dead', `http://127.0.0.1:${port}`)}`, 'routes: { tweet: [dead] }'));
  assert.equal((await perch.request('/readyz', { key: null })).status, 200);
  assert.equal((await perch.request('/v1/tweets/1')).status, 502);
  const ready = await perch.request('/readyz', { key: null });
  assert.equal(ready.status, 503);
  const body = ready.json();
  assert.equal(body.status, 'unavailable');
  assert.equal(body.checks['route:tweet'], 'no usable upstream');
  assert.equal(body.checks['route:user'], 'ok');
});
