import assert from 'node:assert/strict';
import { test, type TestContext } from 'node:test';
import { ManualClock } from './helpers/clock.js';
import { OTHER_KEY, startPerch, testConfig, v1, type TestResponse } from './helpers/perch.js';
import { withPlan } from './helpers/plans.js';
import { json, sampleProvider, startUpstream } from './helpers/upstream-server.js';

const LIMITED_BODY = { error: { message: 'Rate limit exceeded. Please try again later.', code: 'E429' } };

async function setup(t: TestContext, plan: string, behaviour = sampleProvider) {
  const clock = new ManualClock();
  const upstream = await startUpstream(t, behaviour);
  const perch = await startPerch(t, withPlan(testConfig(v1('main', upstream.url)), plan), { clock });
  return { clock, upstream, perch };
}

function limits(res: TestResponse): [string | null, string | null, string | null] {
  return [res.headers.get('ratelimit-policy'), res.headers.get('ratelimit'), res.headers.get('retry-after')];
}

test('capacity 5, refill 1/s: a burst of 5 passes, the 6th is 429 with Retry-After 1, one more passes a second later', async (t) => {
  const { clock, upstream, perch } = await setup(t, '{ capacity: 5, refill_per_second: 1 }');
  for (let i = 1; i <= 5; i++) {
    const res = await perch.request('/v1/users/1');
    assert.equal(res.status, 200);
    assert.deepEqual(limits(res), ['"small";q=5;w=5', `"small";r=${5 - i};t=${i}`, null]);
  }
  const limited = await perch.request('/v1/users/1');
  assert.equal(limited.status, 429);
  assert.deepEqual(limited.json(), LIMITED_BODY);
  assert.deepEqual(limits(limited), ['"small";q=5;w=5', '"small";r=0;t=5', '1']);

  clock.advance(999);
  assert.equal((await perch.request('/v1/users/1')).status, 429);
  clock.advance(1);
  const again = await perch.request('/v1/users/1');
  assert.equal(again.status, 200);
  assert.deepEqual(limits(again), ['"small";q=5;w=5', '"small";r=0;t=5', null]);
  assert.equal((await perch.request('/v1/users/1')).status, 429);

  // Refused requests never reach the cache or the upstream.
  assert.equal(upstream.requests.length, 1);
  const lines = perch.logs.lines().filter((l) => l.msg === 'request');
  assert.deepEqual(
    lines.map((l) => [l.status, l.cache, l.key_id]),
    [[200, 'miss', 'alpha'], ...Array(4).fill([200, 'hit', 'alpha']), [429, 'none', 'alpha'], [429, 'none', 'alpha'], [200, 'hit', 'alpha'], [429, 'none', 'alpha']],
  );
});

test('a full refill takes capacity/refill seconds and never exceeds capacity', async (t) => {
  const { clock, perch } = await setup(t, '{ capacity: 3, refill_per_second: 2 }');
  for (let i = 0; i < 3; i++) await perch.request('/v1/users/1');
  assert.equal((await perch.request('/v1/users/1')).headers.get('retry-after'), '1');
  clock.advance(60_000);
  const res = await perch.request('/v1/users/1');
  // w = ceil(3 / 2) = 2; after one take from a full bucket: 2 left, 0.5 s to full, rounded up.
  assert.deepEqual(limits(res), ['"small";q=3;w=2', '"small";r=2;t=1', null]);
  assert.equal((await perch.request('/v1/users/1')).status, 200);
  assert.equal((await perch.request('/v1/users/1')).status, 200);
  assert.equal((await perch.request('/v1/users/1')).status, 429);
});

test('fractional refill: Retry-After counts whole seconds to the next token, rounded up', async (t) => {
  const { clock, perch } = await setup(t, '{ capacity: 1, refill_per_second: 0.4 }');
  assert.equal((await perch.request('/v1/users/1')).status, 200);
  let limited = await perch.request('/v1/users/1');
  assert.deepEqual(limits(limited), ['"small";q=1;w=3', '"small";r=0;t=3', '3']);
  clock.advance(2000);
  limited = await perch.request('/v1/users/1');
  assert.deepEqual(limits(limited), ['"small";q=1;w=3', '"small";r=0;t=1', '1']);
  clock.advance(499);
  assert.equal((await perch.request('/v1/users/1')).status, 429);
  clock.advance(1);
  assert.equal((await perch.request('/v1/users/1')).status, 200);
});

test('rate-limit headers on every v1 answer after authentication; none on 401 or an unknown route', async (t) => {
  const { perch } = await setup(t, '{ capacity: 10, refill_per_second: 1 }', json(404, {}));
  const notFound = await perch.request('/v1/tweets/7');
  assert.equal(notFound.status, 404);
  assert.equal(notFound.headers.get('ratelimit'), '"small";r=9;t=1');
  const badRequest = await perch.request('/v1/users/abc');
  assert.equal(badRequest.status, 400);
  assert.equal(badRequest.headers.get('ratelimit'), '"small";r=8;t=2');
  const wrongMethod = await perch.request('/v1/users/1', { method: 'DELETE' });
  assert.equal(wrongMethod.status, 405);
  assert.equal(wrongMethod.headers.get('allow'), 'GET, HEAD');
  assert.equal(wrongMethod.headers.get('ratelimit'), '"small";r=7;t=3');
  const head = await perch.request('/v1/tweets/7', { method: 'HEAD' });
  assert.equal(head.headers.get('ratelimit'), '"small";r=6;t=4');

  const unknown = await perch.request('/v2/whatever');
  const unauthorized = await perch.request('/v1/users/1', { key: 'not-a-key-0123456789' });
  for (const res of [unknown, unauthorized]) assert.deepEqual(limits(res), [null, null, null]);
  assert.deepEqual([unknown.status, unauthorized.status], [404, 401]);
  // Neither spent a token.
  assert.equal((await perch.request('/v1/tweets/7')).headers.get('ratelimit'), '"small";r=5;t=5');
});

test('a limited 405 or 400 is answered 429: junk is limited like everything else', async (t) => {
  const { perch } = await setup(t, '{ capacity: 1, refill_per_second: 1 }');
  assert.equal((await perch.request('/v1/users/abc')).status, 400);
  assert.equal((await perch.request('/v1/users/abc')).status, 429);
  assert.equal((await perch.request('/v1/users/1', { method: 'POST' })).status, 429);
});

test('cost_of_hit 0: cache hits are free and still carry the headers; misses cost a token', async (t) => {
  const { upstream, perch } = await setup(t, '{ capacity: 2, refill_per_second: 1, cost_of_hit: 0 }');
  assert.equal((await perch.request('/v1/users/1')).headers.get('ratelimit'), '"small";r=1;t=1');
  for (let i = 0; i < 5; i++) {
    const hit = await perch.request('/v1/users/1');
    assert.equal(hit.status, 200);
    assert.equal(hit.headers.get('cache-status'), 'perch; hit; ttl=300');
    assert.equal(hit.headers.get('ratelimit'), '"small";r=1;t=1');
  }
  assert.equal((await perch.request('/v1/users/2')).headers.get('ratelimit'), '"small";r=0;t=2');
  const miss = await perch.request('/v1/users/3');
  assert.equal(miss.status, 429);
  assert.equal(miss.headers.get('retry-after'), '1');
  // An empty bucket still serves hits.
  const hit = await perch.request('/v1/users/2');
  assert.equal(hit.status, 200);
  assert.equal(hit.headers.get('ratelimit'), '"small";r=0;t=2');
  assert.equal(upstream.requests.length, 2);
});

test('cost_of_hit defaults to 1: hits spend tokens', async (t) => {
  const { perch } = await setup(t, '{ capacity: 2, refill_per_second: 1 }');
  assert.equal((await perch.request('/v1/users/1')).status, 200);
  assert.equal((await perch.request('/v1/users/1')).status, 200);
  const limited = await perch.request('/v1/users/1');
  assert.equal(limited.status, 429);
  assert.equal(limited.headers.get('cache-status'), null);
});

test('each key has its own bucket', async (t) => {
  const { perch } = await setup(t, '{ capacity: 2, refill_per_second: 1 }');
  await perch.request('/v1/users/1');
  await perch.request('/v1/users/1');
  assert.equal((await perch.request('/v1/users/1')).status, 429);
  const other = await perch.request('/v1/users/1', { key: OTHER_KEY });
  assert.equal(other.status, 200);
  assert.equal(other.headers.get('ratelimit'), '"small";r=1;t=1');
  const lines = perch.logs.lines().filter((l) => l.msg === 'request');
  assert.deepEqual(
    lines.map((l) => [l.key_id, l.status]),
    [['alpha', 200], ['alpha', 200], ['alpha', 429], ['bravo', 200]],
  );
});

test("server.rate_limit_headers x_rate_limit adds Twitter's x-rate-limit-* fields with the IETF fields' numbers", { timeout: 10_000 }, async (t) => {
  const clock = new ManualClock(Date.UTC(2026, 0, 1, 0, 0, 0, 250));
  const upstream = await startUpstream(t, sampleProvider);
  const config = (dialects: string) =>
    withPlan(testConfig(v1('main', upstream.url)), '{ capacity: 3, refill_per_second: 0.5 }').replace(
      'server: { host: 127.0.0.1, port: 0 }',
      `server: { host: 127.0.0.1, port: 0, rate_limit_headers: ${dialects} }`,
    );
  const both = await startPerch(t, config('[ietf, x_rate_limit]'), { clock });
  const x = (res: TestResponse) => ['limit', 'remaining', 'reset'].map((field) => res.headers.get(`x-rate-limit-${field}`));
  const epoch = Math.ceil(clock.now() / 1000);
  const first = await both.request('/v1/users/1');
  // r=2 and t=2 (one token at 0.5/s): reset is two seconds from now, in epoch seconds.
  assert.deepEqual(limits(first), ['"small";q=3;w=6', '"small";r=2;t=2', null]);
  assert.deepEqual(x(first), ['3', '2', String(epoch + 2)]);
  await both.request('/v1/users/1');
  await both.request('/v1/users/1');
  const refused = await both.request('/v1/users/1');
  assert.equal(refused.status, 429);
  assert.deepEqual(limits(refused), ['"small";q=3;w=6', '"small";r=0;t=6', '2']);
  assert.deepEqual(x(refused), ['3', '0', String(epoch + 6)]);

  const only = await startPerch(t, config('[x_rate_limit]'), { clock });
  const res = await only.request('/v1/users/1');
  assert.deepEqual(limits(res), [null, null, null]);
  assert.deepEqual(x(res), ['3', '2', String(epoch + 2)]);
  // The default is the IETF dialect alone.
  const ietf = await startPerch(t, withPlan(testConfig(v1('main', upstream.url)), '{ capacity: 3, refill_per_second: 0.5 }'), { clock });
  assert.deepEqual(x(await ietf.request('/v1/users/1')), [null, null, null]);
});

test('at the lowest refill a plan may have, Retry-After, RateLimit and x-rate-limit-reset are integers of at most 15 digits', { timeout: 10_000 }, async (t) => {
  const clock = new ManualClock(Date.UTC(2026, 0, 1));
  const upstream = await startUpstream(t, sampleProvider);
  const yaml = withPlan(testConfig(v1('main', upstream.url)), '{ capacity: 2, refill_per_second: 2.0001e-15 }').replace(
    'server: { host: 127.0.0.1, port: 0 }',
    'server: { host: 127.0.0.1, port: 0, rate_limit_headers: [ietf, x_rate_limit] }',
  );
  const perch = await startPerch(t, yaml, { clock });
  await perch.request('/v1/users/1');
  await perch.request('/v1/users/1');
  const refused = await perch.request('/v1/users/1');
  assert.equal(refused.status, 429);
  const integer = /^[0-9]{1,15}$/;
  assert.match(refused.headers.get('retry-after')!, integer);
  assert.match(refused.headers.get('x-rate-limit-reset')!, integer);
  for (const field of ['ratelimit', 'ratelimit-policy']) {
    for (const [, value] of refused.headers.get(field)!.matchAll(/[a-z]=([^;,]*)/g)) assert.match(value!, integer, `${field}: ${refused.headers.get(field)}`);
  }
});
