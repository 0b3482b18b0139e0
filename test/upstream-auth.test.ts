import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { test, type TestContext } from 'node:test';
import { ManualClock } from './helpers/clock.js';
import { metric, startPerch, waitFor } from './helpers/perch.js';
import { rawExchange } from './helpers/raw-http.js';
import { startRedis } from './helpers/redis-server.js';
import { json, sampleProvider, startUpstream, type TestUpstream, type UpstreamBehaviour } from './helpers/upstream-server.js';
import { answerAppOnlyWhoAmI, xFixtureText } from './helpers/x-v2-fixtures.js';

const GOOD = 'ck-good-alpha-0123456789';
const OTHER_GOOD = 'ck-good-bravo-0123456789';
const BAD = 'ck-bad-chx-0123456789';
const PROVIDER_SECRET = 'perch-own-upstrm-secret';
const E401 = '{"error":{"message":"Invalid API key","code":"E401"}}';

/** A provider that checks its own keys: the good ones get sample bodies, any other key a 401. */
function checking(accepted: readonly string[]): UpstreamBehaviour {
  return (req, res) => {
    if (accepted.includes(String(req.headers['x-api-key']))) return sampleProvider(req, res);
    return json(401, { title: 'Unauthorized' })(req, res);
  };
}

interface Options {
  readonly plan?: string;
  readonly auth?: string;
  readonly upstream?: string;
  readonly cache?: string;
  /** YAML after the first upstream's line: more upstreams, then further top-level sections. */
  readonly extra?: string;
}

function perchYaml(upstreamUrl: string, options: Options): string {
  return `
server: { host: 127.0.0.1, port: 0 }
auth: { mode: upstream, default_plan: resale${options.auth ?? ''} }
rate_limits:
  resale: ${options.plan ?? '{ capacity: 100000, refill_per_second: 100000 }'}
upstreams:
  main: { kind: v1, url: "${upstreamUrl}", timeout_ms: 2000, headers: { X-API-Key: "${PROVIDER_SECRET}" }${options.upstream ?? ''} }
${options.extra ?? ''}
cache: { ttl_seconds: { user: 3600 }${options.cache ?? ''} }
`;
}

/** How many calls `upstream` received with `key`. */
function callsOf(upstream: TestUpstream, key: string): number {
  return upstream.requests.filter((r) => r.headers['x-api-key'] === key).length;
}

async function setup(t: TestContext, behaviour: UpstreamBehaviour, options: Options = {}) {
  const clock = new ManualClock();
  const upstream = await startUpstream(t, behaviour);
  const perch = await startPerch(t, perchYaml(upstream.url, options), { clock, timers: clock });
  return { clock, upstream, perch, callsWith: (key: string) => callsOf(upstream, key) };
}

function digest(key: string): string {
  return createHash('sha256').update(key).digest('hex');
}

test('a repeated X-API-Key is 401 without a call, however alike its values; one key holding a comma is forwarded whole', { timeout: 10_000 }, async (t) => {
  const COMMA = 'ck-good,comma, 0123456789';
  const { perch, upstream } = await setup(t, checking([GOOD, COMMA]));
  const { port } = new URL(perch.url);
  for (const keys of [[GOOD, GOOD], [GOOD, OTHER_GOOD], [GOOD, '']]) {
    const lines = keys.map((key) => `X-API-Key: ${key}\r\n`).join('');
    const { text } = await rawExchange(Number(port), `GET /v1/users/1 HTTP/1.1\r\nHost: x\r\n${lines}Connection: close\r\n\r\n`);
    assert.match(text, /^HTTP\/1\.1 401 /, keys.join(' / '));
    assert.ok(text.endsWith(`\r\n\r\n${E401}`), text);
  }
  assert.equal(upstream.requests.length, 0);
  assert.equal((await perch.request('/v1/users/1', { key: COMMA })).status, 200);
  assert.deepEqual(
    upstream.requests.map((r) => r.headers['x-api-key']),
    [COMMA],
  );
});

test("the client's key is the call's credential, in place of the configured one", { timeout: 10_000 }, async (t) => {
  const { perch, upstream } = await setup(t, checking([GOOD]));
  const res = await perch.request('/v1/users/1', { key: GOOD });
  assert.equal(res.status, 200);
  assert.equal(upstream.requests.length, 1);
  assert.equal(upstream.requests[0]!.headers['x-api-key'], GOOD);
  assert.ok(!JSON.stringify(upstream.requests[0]!.headers).includes(PROVIDER_SECRET));
});

/** perch in pass-through mode in front of one x_v2 upstream at `url`. */
function xV2PassThrough(t: TestContext, url: string) {
  return startPerch(
    t,
    `
server: { host: 127.0.0.1, port: 0 }
auth: { mode: upstream, default_plan: resale }
rate_limits: { resale: { capacity: 100, refill_per_second: 100 } }
upstreams: { x: { kind: x_v2, url: "${url}", timeout_ms: 2000 } }
`,
  );
}

/** A user, to any app-only token: X's `/2/users/me` refuses those. */
function serveXUser(req: IncomingMessage, res: ServerResponse): void {
  if (answerAppOnlyWhoAmI(req, res)) return;
  res.writeHead(200, { 'content-type': 'application/json' });
  res.end(xFixtureText('user'));
}

test('an x_v2 upstream receives the key as a bearer token', { timeout: 10_000 }, async (t) => {
  const token = 'AAAAAAAAAAAAAAAAAAAAAClientOwnToken%2Bxyz';
  const upstream = await startUpstream(t, (req: IncomingMessage, res: ServerResponse) => {
    if (req.headers.authorization !== `Bearer ${token}`) return json(401, { title: 'Unauthorized' })(req, res);
    serveXUser(req, res);
  });
  const perch = await xV2PassThrough(t, upstream.url);
  assert.equal((await perch.request('/v1/users/2244994945', { key: token })).status, 200);
  assert.equal((await perch.request('/v1/users/2244994945', { key: 'not-the-token-0123456789' })).text, E401);
  // A new key is first asked who it speaks for (an app-only token: X's 403), then its request.
  assert.deepEqual(
    upstream.requests.map((r) => [r.url.split('?')[0], r.headers.authorization]),
    [
      ['/2/users/me', `Bearer ${token}`],
      ['/2/users/2244994945', `Bearer ${token}`],
      ['/2/users/me', 'Bearer not-the-token-0123456789'],
    ],
  );
});

test("pass-through: X's 403 for the client's own token is 401 E401, and perch's state for other keys is untouched", { timeout: 10_000 }, async (t) => {
  const allowed = 'AAAAAAAAAAAAAAAAAAAAAOwnTokenYes%2Bxyz';
  const forbidden = 'AAAAAAAAAAAAAAAAAAAAAOwnTokenNo%2Bxyz';
  const upstream = await startUpstream(t, (req: IncomingMessage, res: ServerResponse) => {
    if (req.headers.authorization === `Bearer ${forbidden}`) {
      return json(403, { title: 'Client Forbidden', type: 'https://api.twitter.com/2/problems/client-forbidden' })(req, res);
    }
    serveXUser(req, res);
  });
  const perch = await xV2PassThrough(t, upstream.url);
  const refused = await perch.request('/v1/users/2244994945', { key: forbidden });
  assert.deepEqual([refused.status, refused.text], [401, E401]);
  // The same endpoint, the same user: another key is still asked, and served.
  assert.equal((await perch.request('/v1/users/2244994945', { key: allowed })).status, 200);
  assert.equal((await perch.request('/v1/users/2244994945', { key: allowed })).status, 200, 'from the cache');
  // Each key: who it speaks for (X's 403 either way: a token that speaks for no user), then the lookup.
  assert.deepEqual(
    upstream.requests.map((r) => [r.url.split('?')[0], r.headers.authorization]),
    [
      ['/2/users/me', `Bearer ${forbidden}`],
      ['/2/users/2244994945', `Bearer ${forbidden}`],
      ['/2/users/me', `Bearer ${allowed}`],
      ['/2/users/2244994945', `Bearer ${allowed}`],
    ],
  );
  assert.equal(perch.logs.lines().filter((l) => l.msg === 'provider refuses this endpoint to the credential: not asked again until then').length, 0);
});

for (const costOfHit of [1, 0]) {
  test(`a key the upstream rejects never receives a cached body (cost_of_hit ${costOfHit})`, { timeout: 10_000 }, async (t) => {
    const plan = `{ capacity: 1000, refill_per_second: 1000, cost_of_hit: ${costOfHit} }`;
    const { perch, callsWith } = await setup(t, checking([GOOD, OTHER_GOOD]), { plan });
    assert.equal((await perch.request('/v1/users/1', { key: GOOD })).status, 200);
    const hit = await perch.request('/v1/users/1', { key: GOOD });
    assert.match(hit.headers.get('cache-status') ?? '', /; hit;/);

    const denied = await perch.request('/v1/users/1', { key: BAD });
    assert.equal(denied.status, 401);
    assert.equal(denied.text, E401);
    assert.equal(callsWith(BAD), 1, 'the bad key was checked by a real call');

    // A good key perch has not seen is checked the same way before the cache serves it.
    const fresh = await perch.request('/v1/users/1', { key: OTHER_GOOD });
    assert.equal(fresh.status, 200);
    assert.match(fresh.headers.get('cache-status') ?? '', /fwd=miss/);
    assert.equal(callsWith(OTHER_GOOD), 1);
    assert.match((await perch.request('/v1/users/1', { key: OTHER_GOOD })).headers.get('cache-status') ?? '', /; hit;/);
    assert.equal(callsWith(OTHER_GOOD), 1);
  });
}

test("a bad key asking at the same moment as a good one never shares the good key's call", { timeout: 10_000 }, async (t) => {
  const held: (() => void)[] = [];
  const behaviour = checking([GOOD]);
  const { perch, upstream, callsWith } = await setup(t, (req, res) => held.push(() => behaviour(req, res)));
  const good = perch.request('/v1/users/1', { key: GOOD });
  await waitFor(() => upstream.requests.length === 1);
  const bad = perch.request('/v1/users/1', { key: BAD });
  await waitFor(() => upstream.requests.length === 2);
  for (const release of held.splice(0)) release();
  assert.equal((await good).status, 200);
  const denied = await bad;
  assert.equal(denied.status, 401);
  assert.equal(denied.text, E401);
  assert.deepEqual([callsWith(GOOD), callsWith(BAD)], [1, 1]);
});

test('a rejected key is final: the next upstream of the route is not asked', { timeout: 10_000 }, async (t) => {
  const backup = await startUpstream(t, checking([GOOD]));
  const { perch, callsWith } = await setup(t, checking([GOOD]), {
    extra: `  backup: { kind: v1, url: "${backup.url}", timeout_ms: 2000 }\nroutes: { user: [main, backup] }`,
  });
  assert.equal((await perch.request('/v1/users/1', { key: BAD })).status, 401);
  assert.equal(callsWith(BAD), 1);
  assert.equal(backup.requests.length, 0);
});

test("the Redis tier's bodies and flights are not served to a key the provider has not accepted; its acceptance is the fleet's", { timeout: 20_000 }, async (t) => {
  const redis = await startRedis(t);
  const upstream = await startUpstream(t, checking([GOOD]));
  const options = { cache: `, redis: { url: "${redis.url}", prefix: "t:" }` };
  const [a, b] = [await startPerch(t, perchYaml(upstream.url, options)), await startPerch(t, perchYaml(upstream.url, options))];
  await waitFor(() => a.cache.redisConnected === true && b.cache.redisConnected === true);
  assert.equal((await a.request('/v1/users/1', { key: GOOD })).status, 200);
  assert.match((await a.request('/v1/users/1', { key: GOOD })).headers.get('cache-status') ?? '', /; hit;/);

  const denied = await b.request('/v1/users/1', { key: BAD });
  assert.equal(denied.status, 401);
  assert.equal(denied.text, E401);
  assert.equal(callsOf(upstream, BAD), 1);
  // Verdicts are shared through Redis: b serves the good key, which a accepted, without a call.
  assert.match((await b.request('/v1/users/1', { key: GOOD })).headers.get('cache-status') ?? '', /; hit;/);
  assert.equal(callsOf(upstream, GOOD), 1);
  // And the bad key's rejection: a answers it 401 without asking again.
  assert.equal((await a.request('/v1/users/1', { key: BAD })).status, 401);
  assert.equal(callsOf(upstream, BAD), 1);
});

test('a stale entry is not served to a key the upstream has not accepted', { timeout: 10_000 }, async (t) => {
  const { clock, perch, callsWith } = await setup(t, checking([GOOD]), { cache: ', stale_seconds: 600' });
  assert.equal((await perch.request('/v1/users/1', { key: GOOD })).status, 200);
  clock.advance(3_601_000);
  const denied = await perch.request('/v1/users/1', { key: BAD });
  assert.equal(denied.status, 401);
  assert.equal(denied.text, E401);
  assert.equal(callsWith(BAD), 1);
});

test('a flood of one bad key costs one upstream call, until the rejection is forgotten', { timeout: 10_000 }, async (t) => {
  const held: (() => void)[] = [];
  const behaviour = checking([GOOD]);
  const { clock, perch, upstream, callsWith } = await setup(t, (req, res) => held.push(() => behaviour(req, res)), {
    auth: ', reject_ttl_seconds: 60',
  });
  // Half on one path, half on paths of their own: the call is shared per key, not per path.
  const flood = Array.from({ length: 50 }, (_, i) => perch.request(`/v1/users/${i % 2 === 0 ? 1 : i}`, { key: BAD }));
  await waitFor(() => perch.received() === 50 && upstream.requests.length > 0);
  for (const release of held.splice(0)) release();
  const statuses = (await Promise.all(flood)).map((r) => r.status);
  assert.deepEqual(new Set(statuses), new Set([401]));
  assert.equal(callsWith(BAD), 1);

  upstream.behaviour = behaviour;
  for (let i = 0; i < 10; i++) assert.equal((await perch.request(`/v1/tweets/${i + 1}`, { key: BAD })).status, 401);
  assert.equal(callsWith(BAD), 1, 'a remembered rejection costs no call');

  clock.advance(60_000);
  assert.equal((await perch.request('/v1/users/1', { key: BAD })).status, 401);
  assert.equal(callsWith(BAD), 2, 'past reject_ttl_seconds the key is checked again');
});

test('past verify_ttl_seconds the cache still answers while one revalidation runs, and a key revoked meanwhile gets 401 once it has', { timeout: 10_000 }, async (t) => {
  const { clock, perch, upstream, callsWith } = await setup(t, checking([GOOD]), { auth: ', verify_ttl_seconds: 300' });
  assert.equal((await perch.request('/v1/users/1', { key: GOOD })).status, 200);
  clock.advance(299_000);
  assert.match((await perch.request('/v1/users/1', { key: GOOD })).headers.get('cache-status') ?? '', /; hit;/);
  assert.equal(callsWith(GOOD), 1);

  // Stale: served from the cache, and revalidated by one call behind the answer.
  clock.advance(1_000);
  const again = await perch.request('/v1/users/1', { key: GOOD });
  assert.equal(again.status, 200);
  assert.match(again.headers.get('cache-status') ?? '', /; hit;/);
  // Its answer has landed once it is counted: the acceptance dates from now.
  await waitFor(async () => (await metric(perch, 'perch_upstream_requests_total{upstream="main",route="user",outcome="ok"}')) === 2);
  assert.equal(callsWith(GOOD), 2);
  assert.match((await perch.request('/v1/users/1', { key: GOOD })).headers.get('cache-status') ?? '', /; hit;/);
  assert.equal(callsWith(GOOD), 2);

  upstream.behaviour = checking([]);
  clock.advance(300_000);
  // The revalidation's answer is the provider's 401: from then on the key is refused.
  assert.equal((await perch.request('/v1/users/1', { key: GOOD })).status, 200);
  await waitFor(() => callsWith(GOOD) === 3);
  await waitFor(async () => (await perch.request('/v1/users/1', { key: GOOD })).status === 401);
  const revoked = await perch.request('/v1/users/1', { key: GOOD });
  assert.deepEqual([revoked.status, revoked.text], [401, E401]);
  assert.equal(callsWith(GOOD), 3);
});

test('each key has its own bucket of the default plan', { timeout: 10_000 }, async (t) => {
  const { perch } = await setup(t, checking([GOOD, OTHER_GOOD]), { plan: '{ capacity: 2, refill_per_second: 0.001 }' });
  const statuses = async (key: string) => [
    (await perch.request('/v1/users/1', { key })).status,
    (await perch.request('/v1/users/2', { key })).status,
    (await perch.request('/v1/users/3', { key })).status,
  ];
  assert.deepEqual(await statuses(GOOD), [200, 200, 429]);
  assert.deepEqual(await statuses(OTHER_GOOD), [200, 200, 429]);
});

test("rejected keys neither revoke anything nor trip the breaker: they are the client's", { timeout: 10_000 }, async (t) => {
  const { perch, callsWith } = await setup(t, checking([GOOD]), { upstream: ', breaker: { consecutive_failures: 2, min_calls: 2 }', auth: ', verify_source_share: 1' });
  for (let i = 0; i < 5; i++) assert.equal((await perch.request('/v1/users/1', { key: `${BAD}-${i}` })).status, 401);
  assert.equal((await perch.request('/v1/users/1', { key: GOOD })).status, 200);
  assert.equal(callsWith(GOOD), 1);
  const ready = await perch.request('/readyz', { key: null });
  assert.equal(ready.status, 200, ready.text);
  assert.deepEqual(perch.logs.lines().filter((l) => (l.level as number) >= 40), [], 'nothing warned about or logged as an error');
});

test('keys never appear in logs or metrics: logs name a digest prefix, metrics one fixed id', { timeout: 10_000 }, async (t) => {
  const { perch } = await setup(t, checking([GOOD]));
  await perch.request('/v1/users/1', { key: GOOD });
  await perch.request('/v1/users/1', { key: BAD });
  await perch.request('/v1/users/1', { key: BAD });
  const metrics = await perch.request('/metrics', { key: null });
  for (const secret of [GOOD, BAD, digest(GOOD), digest(BAD)]) {
    assert.ok(!perch.logs.text().includes(secret), 'log contains a key or its full digest');
    assert.ok(!metrics.text.includes(secret), 'metrics contain a key or its full digest');
  }
  const ids = perch.logs.lines().filter((l) => l.msg === 'request').map((l) => [l.status, l.key_id]);
  assert.deepEqual(ids, [
    [200, `client:${digest(GOOD).slice(0, 16)}`],
    [401, `client:${digest(BAD).slice(0, 16)}`],
    [401, null],
  ]);
  assert.match(metrics.text, /perch_key_requests_total\{key_id="upstream-auth",status="200",cache="miss"\} 1/);
  assert.ok(!metrics.text.includes('client:'), 'no per-key metrics label');
});
