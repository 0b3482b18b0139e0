import assert from 'node:assert/strict';
import { test } from 'node:test';
import { ManualClock } from './helpers/clock.js';
import { startPerch, testConfig, v1 } from './helpers/perch.js';
import { withPlan } from './helpers/plans.js';
import { json, startUpstream } from './helpers/upstream-server.js';

const T = { timeout: 20_000 };

test('a keyed 200 is private to the key, fresh for the entry TTL left, and varies on X-API-Key', T, async (t) => {
  const clock = new ManualClock();
  const perch = await startPerch(t, testConfig('demo: { kind: fixture }', 'cache: { stale_seconds: 60 }'), { clock });
  const miss = await perch.request('/v1/users/1');
  assert.equal(miss.status, 200);
  assert.equal(miss.headers.get('cache-control'), 'private, max-age=300');
  assert.equal(miss.headers.get('vary'), 'X-API-Key, Accept-Encoding');

  clock.advance(100_400);
  const hit = await perch.request('/v1/users/1');
  assert.match(hit.headers.get('cache-status') ?? '', /hit/);
  // 199.6 s left: with Age 100, max-age 299 lets a client reuse it for 199 whole seconds, never
  // longer than perch would.
  assert.equal(hit.headers.get('age'), '100');
  assert.equal(hit.headers.get('cache-control'), 'private, max-age=299');
  assert.equal(hit.headers.get('vary'), 'X-API-Key, Accept-Encoding');

  clock.advance(210_000);
  const stale = await perch.request('/v1/users/1');
  assert.match(stale.headers.get('cache-status') ?? '', /fwd=stale/);
  assert.equal(stale.headers.get('cache-control'), 'private, max-age=0');
  assert.equal(stale.headers.get('vary'), 'X-API-Key, Accept-Encoding');
});

test('an uncached 200 (TTL 0) is private with max-age=0', T, async (t) => {
  const perch = await startPerch(t, testConfig('demo: { kind: fixture }', 'cache: { ttl_seconds: { user: 0 } }'));
  const res = await perch.request('/v1/users/1');
  assert.equal(res.headers.get('cache-control'), 'private, max-age=0');
  assert.equal(res.headers.get('vary'), 'X-API-Key, Accept-Encoding');
});

test('every error perch answers is no-store, whatever produced it', T, async (t) => {
  const upstream = await startUpstream(t, json(500, { oops: true }));
  const perch = await startPerch(t, withPlan(testConfig(v1('broken', upstream.url)), '{ capacity: 3, refill_per_second: 0.001 }'));
  const cases: [string, Parameters<typeof perch.request>[1], number][] = [
    ['/v1/users/1', { key: null }, 401],
    ['/v1/users/1', { key: 'wrong-key-0123456789' }, 401],
    ['/v1/nothing', {}, 404],
    ['/v1/users/abc', {}, 400],
    ['/v1/users/1', { method: 'DELETE' }, 405],
    ['/v1/users/1', {}, 502],
  ];
  for (const [path, options, status] of cases) {
    const res = await perch.request(path, options);
    assert.equal(res.status, status, path);
    assert.equal(res.headers.get('cache-control'), 'no-store', `${status} ${path}`);
  }
  // The 400, 405 and 502 spent the plan's three tokens: the next request is refused by perch itself.
  const limited = await perch.request('/v1/users/2');
  assert.equal(limited.status, 429);
  assert.equal(limited.headers.get('cache-control'), 'no-store');
});

test('an upstream 404, cached by perch, is still no-store for shared caches', T, async (t) => {
  const perch = await startPerch(t, testConfig('demo: { kind: fixture }'));
  for (let i = 0; i < 2; i++) {
    const res = await perch.request('/v1/users/4040000000000000000');
    assert.equal(res.status, 404);
    assert.equal(res.headers.get('cache-control'), 'no-store');
  }
});
