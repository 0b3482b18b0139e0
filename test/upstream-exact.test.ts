import assert from 'node:assert/strict';
import { test, type TestContext } from 'node:test';
import { ManualClock } from './helpers/clock.js';
import { KEY, startPerch, testConfig, v1 } from './helpers/perch.js';
import { sampleUser } from './helpers/sample-bodies.js';
import { json, sampleProvider, startUpstream, type UpstreamBehaviour } from './helpers/upstream-server.js';

// Exact values through an injected clock, where upstream-errors.test.ts accepts ranges against
// the wall clock: a Retry-After rounded down or a bound off by one must fail here.
const T = { timeout: 20_000 };
const EPOCH = Date.UTC(2026, 0, 1);

async function setup(t: TestContext, behaviour: UpstreamBehaviour, extra = '', clock = new ManualClock(EPOCH + 500)) {
  const upstream = await startUpstream(t, behaviour);
  const perch = await startPerch(t, testConfig(v1('main', upstream.url, extra)), { clock });
  return { upstream, perch };
}

const retryAfter = async (t: TestContext, headers: Record<string, string>) => {
  const { perch } = await setup(t, json(429, {}, headers));
  const res = await perch.request('/v1/users/1');
  assert.equal(res.status, 429);
  return res.headers.get('retry-after');
};

test('a provider Retry-After date 29.5 s away is 30, rounded up, never down', T, async (t) => {
  // The clock stands half a second past EPOCH; HTTP dates have whole seconds.
  assert.equal(await retryAfter(t, { 'retry-after': new Date(EPOCH + 30_000).toUTCString() }), '30');
});

test('an x-rate-limit-reset 119.5 s away is 120, rounded up', T, async (t) => {
  assert.equal(await retryAfter(t, { 'x-rate-limit-reset': String(EPOCH / 1000 + 120) }), '120');
});

test('Retry-After is capped at one day, however far the provider asks', T, async (t) => {
  assert.equal(await retryAfter(t, { 'retry-after': '86401' }), '86400');
  assert.equal(await retryAfter(t, { 'retry-after': '999999999' }), '86400');
  assert.equal(await retryAfter(t, { 'retry-after': new Date(EPOCH + 3 * 86_400_000).toUTCString() }), '86400');
  assert.equal(await retryAfter(t, { 'retry-after': '86400' }), '86400');
});

test('a date in the past or a zero delay is 1, the least a client can be told', T, async (t) => {
  assert.equal(await retryAfter(t, { 'retry-after': new Date(EPOCH - 60_000).toUTCString() }), '1');
  assert.equal(await retryAfter(t, { 'retry-after': '0' }), '1');
});

test('without configured headers, nothing of the client request reaches the provider, its key least of all', T, async (t) => {
  const { upstream, perch } = await setup(t, sampleProvider);
  const res = await perch.request('/v1/users/1?extra=1', {
    headers: { cookie: 'session=1', authorization: 'Bearer client', 'x-request-id': 'req-1', 'x-forwarded-for': '10.0.0.1' },
  });
  assert.equal(res.status, 200);
  assert.equal(upstream.requests.length, 1);
  const sent = upstream.requests[0]!;
  assert.equal(sent.url, '/v1/users/1');
  for (const name of ['x-api-key', 'cookie', 'authorization', 'x-request-id', 'x-forwarded-for']) {
    assert.equal(sent.headers[name], undefined, `${name} was forwarded`);
  }
  assert.equal(sent.headers.accept, 'application/json');
  assert.equal(sent.headers['user-agent'], 'perch');
  assert.ok(!JSON.stringify(sent.headers).includes(KEY));
});

test('configured headers are sent as configured, and the client key still is not', T, async (t) => {
  const { upstream, perch } = await setup(t, sampleProvider, 'headers: { X-API-Key: provider-secret-0123456789 }');
  assert.equal((await perch.request('/v1/users/1')).status, 200);
  const sent = upstream.requests[0]!;
  assert.equal(sent.headers['x-api-key'], 'provider-secret-0123456789');
  assert.ok(!JSON.stringify(sent.headers).includes(KEY));
});

/** A user body of exactly `bytes` bytes. */
/** A valid user body of exactly `bytes` bytes (its name padded). */
function userBody(bytes: number): string {
  const shell = JSON.stringify({ ...sampleUser('123', 'alice'), name: '' });
  return shell.replace('"name":""', `"name":"${'n'.repeat(bytes - shell.length)}"`);
}

test('max_body_bytes is inclusive: a body of exactly the bound is served, one byte more is 502', T, async (t) => {
  const bound = 2048;
  const exact = userBody(bound);
  assert.equal(Buffer.byteLength(exact), bound);
  let body = exact;
  const { perch } = await setup(t, (req, res) => json(200, body)(req, res), `max_body_bytes: ${bound}`);
  const fits = await perch.request('/v1/users/1');
  assert.equal(fits.status, 200);
  assert.equal(fits.text, exact);
  body = userBody(bound + 1);
  const over = await perch.request('/v1/users/2');
  assert.equal(over.status, 502);
  assert.deepEqual(over.json(), { error: { message: 'Upstream error', code: 'E502' } });
});
