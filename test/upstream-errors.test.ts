import assert from 'node:assert/strict';
import { test } from 'node:test';
import { brotliCompressSync, deflateSync, gzipSync } from 'node:zlib';
import { ManualClock } from './helpers/clock.js';
import { startPerch, testConfig, v1 } from './helpers/perch.js';
import { sampleUser } from './helpers/sample-bodies.js';
import { json, refusedPort, sampleProvider, startUpstream, type UpstreamBehaviour } from './helpers/upstream-server.js';

const body = (code: string, message: string) => ({ error: { message, code } });
const E502 = body('E502', 'Upstream error');
const E504 = body('E504', 'Upstream timeout');
const E429 = body('E429', 'Rate limit exceeded. Please try again later.');
const LEAK = 'provider-internal-detail-7731';

async function setup(t: Parameters<typeof startUpstream>[0], behaviour: UpstreamBehaviour, extra = '', clock?: ManualClock) {
  const upstream = await startUpstream(t, behaviour);
  const perch = await startPerch(t, testConfig(v1('main', upstream.url, extra)), clock === undefined ? {} : { clock });
  return { upstream, perch };
}

function assertNoLeak(res: { text: string; headers: Headers }): void {
  assert.ok(!res.text.includes(LEAK));
  for (const [name, value] of res.headers) assert.ok(!value.includes(LEAK), `header ${name} leaks`);
}

test('upstream 404 is E404 "User not found" or "Tweet not found"', async (t) => {
  const { perch } = await setup(t, json(404, { detail: LEAK }, { 'x-provider': LEAK }));
  for (const path of ['/v1/users/1', '/v1/users/by/username/ghost', '/v1/users/1/tweets', '/v1/users/1/replies', '/v1/users/1/following']) {
    const res = await perch.request(path);
    assert.equal(res.status, 404, path);
    assert.deepEqual(res.json(), body('E404', 'User not found'));
    assertNoLeak(res);
  }
  const res = await perch.request('/v1/tweets/1');
  assert.deepEqual([res.status, res.json()], [404, body('E404', 'Tweet not found')]);
});

test('upstream 429 is E429 with Retry-After from the provider Retry-After', async (t) => {
  const { perch } = await setup(t, json(429, { detail: LEAK }, { 'retry-after': '17' }));
  const res = await perch.request('/v1/users/1');
  assert.deepEqual([res.status, res.json(), res.headers.get('retry-after')], [429, E429, '17']);
  assertNoLeak(res);
});

test('upstream 429 takes Retry-After from an HTTP date, then x-rate-limit-reset, then the configured default', async (t) => {
  // An injected clock, so the seconds left are exact: 30 s to the date, 120 s to the reset.
  const now = Date.UTC(2026, 0, 1);
  const inThirty = new Date(now + 30_000).toUTCString();
  const { perch: byDate } = await setup(t, json(429, {}, { 'retry-after': inThirty }), '', new ManualClock(now));
  assert.equal((await byDate.request('/v1/users/1')).headers.get('retry-after'), '30');

  const reset = String(now / 1000 + 120);
  const { perch: byReset } = await setup(t, json(429, {}, { 'x-rate-limit-reset': reset }), '', new ManualClock(now));
  assert.equal((await byReset.request('/v1/users/1')).headers.get('retry-after'), '120');

  const { perch: byDefault } = await setup(t, json(429, {}), 'retry_after_default_seconds: 42');
  assert.equal((await byDefault.request('/v1/users/1')).headers.get('retry-after'), '42');

  const { perch: past } = await setup(t, json(429, {}, { 'retry-after': '0' }));
  assert.equal((await past.request('/v1/users/1')).headers.get('retry-after'), '1');
});

test('upstream 5xx is 502 E502 and the provider body is not echoed', async (t) => {
  for (const status of [500, 502, 503]) {
    const { perch } = await setup(t, json(status, { error: LEAK }));
    const res = await perch.request('/v1/users/1');
    assert.deepEqual([res.status, res.json()], [502, E502]);
    assertNoLeak(res);
  }
});

test('upstream 401 and 403 are 502 E502, logged as an error, never a client 401', async (t) => {
  for (const status of [401, 403]) {
    const { perch } = await setup(t, json(status, { error: { message: 'Invalid API key', code: LEAK } }));
    const res = await perch.request('/v1/users/1');
    assert.deepEqual([res.status, res.json()], [502, E502]);
    assertNoLeak(res);
    const errors = perch.logs.lines().filter((l) => l.level === 50);
    assert.equal(errors.length, 1);
    assert.equal(errors[0]!.msg, 'provider rejected a credential: out of the rotation until its recheck');
    assert.equal(errors[0]!.upstream, 'main');
  }
});

test('a 2xx body that is not JSON, fails the schema, or is too large is 502 E502', async (t) => {
  const behaviours: UpstreamBehaviour[] = [
    json(200, `<html>${LEAK}</html>`),
    json(200, ''),
    json(200, { unexpected: LEAK }),
    json(200, { data: { entries: 'not-an-array' } }),
    json(200, { id: 123, username: 'numeric id' }),
    json(200, { ...sampleUser('1', 'x'), padding: 'y'.repeat(4096) }),
  ];
  for (const behaviour of behaviours) {
    const { perch } = await setup(t, behaviour, 'max_body_bytes: 2048');
    const path = '/v1/users/1';
    const res = await perch.request(path);
    assert.deepEqual([res.status, res.json()], [502, E502]);
    assertNoLeak(res);
  }
  const { perch } = await setup(t, json(200, { data: { entries: 'not-an-array' } }));
  assert.equal((await perch.request('/v1/users/1/tweets')).status, 502);
});

test('an upstream that does not answer within timeout_ms is 504 E504', async (t) => {
  const { perch } = await setup(t, () => {}, 'timeout_ms: 150');
  const started = Date.now();
  const res = await perch.request('/v1/users/1');
  assert.deepEqual([res.status, res.json()], [504, E504]);
  assert.ok(Date.now() - started < 2000);
});

test('timeout_ms bounds the body too, not just the headers', async (t) => {
  const { perch } = await setup(
    t,
    (_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.write('{"id":"1",');
    },
    'timeout_ms: 150',
  );
  const res = await perch.request('/v1/users/1');
  assert.deepEqual([res.status, res.json()], [504, E504]);
});

test('a refused connection is 502 E502', async (t) => {
  const port = await refusedPort();
  const perch = await startPerch(t, testConfig(v1('main', `http://127.0.0.1:${port}`)));
  const res = await perch.request('/v1/users/1');
  assert.deepEqual([res.status, res.json()], [502, E502]);
  const warn = perch.logs.lines().find((l) => l.msg === 'upstream failed');
  assert.equal(warn?.failure, 'connection');
});

test('a connection reset mid-body is 502 E502', async (t) => {
  const { perch } = await setup(t, (_req, res) => {
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': '100' });
    res.write('{"id":');
    setTimeout(() => res.socket?.destroy(), 10);
  });
  const res = await perch.request('/v1/users/1');
  assert.deepEqual([res.status, res.json()], [502, E502]);
});

test('upstream 400 is E400 for a request with a cursor, E502 otherwise', async (t) => {
  const { perch } = await setup(t, json(400, { error: LEAK }));
  const withCursor = await perch.request('/v1/users/1/tweets?cursor=stale');
  assert.equal(withCursor.status, 400);
  assert.equal(withCursor.json().error.code, 'E400');
  assertNoLeak(withCursor);
  const without = await perch.request('/v1/users/1/tweets');
  assert.deepEqual([without.status, without.json()], [502, E502]);
});

test('an unexpected upstream status (e.g. 302, 418) is 502 E502', async (t) => {
  for (const status of [302, 418]) {
    const { perch } = await setup(t, json(status, { error: LEAK }, { location: `http://${LEAK}/` }));
    const res = await perch.request('/v1/users/1');
    assert.deepEqual([res.status, res.json()], [502, E502]);
    assertNoLeak(res);
  }
});

test('a redirect is 502 E502, and the log names its target', async (t) => {
  const { perch } = await setup(t, json(301, {}, { location: 'https://api.example/v1/users/1' }));
  const res = await perch.request('/v1/users/1');
  assert.deepEqual([res.status, res.json()], [502, E502]);
  const line = perch.logs.lines().find((l) => l.msg === 'upstream failed');
  assert.equal(line?.reason, "status 301: redirect to https://api.example/v1/users/1 (perch follows none: fix the upstream's url)");
});

test('a gzip, br or deflate body from the provider is decoded; an unknown coding or one past max_body_bytes decoded is 502', async (t) => {
  const user = Buffer.from(JSON.stringify(sampleUser('1', 'alice')));
  const encoded = (coding: string, bytes: Buffer): UpstreamBehaviour => (_req, res) => {
    res.writeHead(200, { 'content-type': 'application/json', 'content-encoding': coding, 'content-length': bytes.length });
    res.end(bytes);
  };
  for (const [coding, bytes] of [['gzip', gzipSync(user)], ['br', brotliCompressSync(user)], ['deflate', deflateSync(user)], ['GZIP', gzipSync(user)]] as const) {
    const { perch } = await setup(t, encoded(coding, bytes));
    const res = await perch.request('/v1/users/1');
    assert.deepEqual([res.status, res.json().username], [200, 'alice'], coding);
    // Stored decoded: the cache serves the provider's JSON, whatever coding it came in.
    assert.equal((await perch.request('/v1/users/1', { headers: { 'accept-encoding': 'identity' } })).json().username, 'alice');
  }
  // 2 KB of JSON text past 8 KB of padding compresses far below max_body_bytes, and expands past it.
  const bomb = gzipSync(Buffer.from(JSON.stringify({ ...sampleUser('1', 'x'), padding: ' '.repeat(8192) })));
  const cases: [UpstreamBehaviour, string][] = [
    [encoded('compress', user), 'content-encoding compress is not one perch decodes (gzip, br, deflate)'],
    [encoded('gzip', user), 'a gzip body that does not decode'],
    [encoded('gzip', bomb), 'body larger than 4096 bytes once gzip-decoded'],
  ];
  for (const [behaviour, reason] of cases) {
    const { perch } = await setup(t, behaviour, 'max_body_bytes: 4096');
    const res = await perch.request('/v1/users/1');
    assert.deepEqual([res.status, res.json()], [502, E502], reason);
    assert.equal(perch.logs.lines().find((l) => l.msg === 'upstream failed')?.reason, reason);
  }
});

test('errors are never cached: the next request goes upstream again', async (t) => {
  const { upstream, perch } = await setup(t, json(500, {}));
  assert.equal((await perch.request('/v1/users/1')).status, 502);
  upstream.behaviour = sampleProvider;
  const res = await perch.request('/v1/users/1');
  assert.equal(res.status, 200);
  assert.equal(upstream.requests.length, 2);
});

test('routes fail over in order on 5xx, refused connections, timeouts and 429, not on 404', async (t) => {
  const port = await refusedPort();
  const broken = await startUpstream(t, json(503, {}));
  const slow = await startUpstream(t, () => {});
  const good = await startUpstream(t, sampleProvider);
  const missing = await startUpstream(t, json(404, {}));
  const limited = await startUpstream(t, json(429, {}, { 'retry-after': '5' }));
  const upstreams = [
    `dead: { kind: v1, url: "http://127.0.0.1:${port}" }`,
    v1('broken', broken.url),
    v1('slow', slow.url, 'timeout_ms: 100'),
    v1('good', good.url),
    v1('missing', missing.url),
    v1('limited', limited.url),
  ].join('\n');
  const routes = `routes: { user: [dead, broken, slow, good], tweet: [missing, good], tweets: [limited, good], replies: [broken] }`;
  const perch = await startPerch(t, testConfig(upstreams, routes));

  const user = await perch.request('/v1/users/1');
  assert.equal(user.status, 200);
  assert.equal(perch.logs.lines().find((l) => l.msg === 'request')!.upstream, 'good');
  assert.equal((await perch.request('/v1/tweets/1')).status, 404);
  // Another provider has a quota of its own: a 429 moves on like a failure.
  assert.equal((await perch.request('/v1/users/1/tweets')).status, 200);
  assert.equal((await perch.request('/v1/users/1/replies')).status, 502);
  assert.equal(good.requests.length, 2);
  assert.equal(limited.requests.length, 1);
  // Endpoints without a route go to the first upstream.
  assert.equal((await perch.request('/v1/users/1/following')).status, 502);
});
