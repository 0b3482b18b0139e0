// Pass-through auth tried as an attacker would (issue 57): with no key, with made-up keys, or with
// the genuine key of a smaller plan, over real HTTP against a stand-in for X that answers 401 to a
// token it does not know and 403 client-forbidden to an endpoint outside a token's plan. Clients
// come from addresses of their own (127.0.0.x), as a flood and its victims would.
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import { connect } from 'node:net';
import { join } from 'node:path';
import { test, type TestContext } from 'node:test';
import { Redis } from 'ioredis';
import { Agent, request } from 'undici';
import { onCleanup } from './helpers/cleanup.js';
import { ManualClock } from './helpers/clock.js';
import { fakeX, type FakeX } from './helpers/fake-x.js';
import { metric, startPerch, waitFor, type RunningPerch } from './helpers/perch.js';
import { runCli, spawnPerch } from './helpers/perch-process.js';
import { startRedis } from './helpers/redis-server.js';
import { tempDir } from './helpers/temp-dir.js';
import { startUpstream, type TestUpstream, type UpstreamBehaviour } from './helpers/upstream-server.js';
import { answerAppOnlyWhoAmI } from './helpers/x-v2-fixtures.js';

/** Tokens of X's full plan, and one of a plan that covers user lookups only. */
const GENUINE = 'AAAAAAAAAAAAAAAAAAAAAGenuineAppToken%2Bfull';
const NEWCOMERS = ['AAAAAAAAAAAAAAAAAAAAANewcomerOne%2Bfull', 'AAAAAAAAAAAAAAAAAAAAANewcomerTwo%2Bfull', 'AAAAAAAAAAAAAAAAAAAAANewcomerThree%2Bfull'];
const USERS_ONLY = 'AAAAAAAAAAAAAAAAAAAAAUserLookupsOnly%2Bsmall';
/** An OAuth 2.0 user-context access token: it reads as its user, protected accounts it follows included. */
const USER_CONTEXT = 'dXNlci1jb250ZXh0LWFjY2Vzcy10b2tlbjoxNzAwMDAwMDAwOjE6MTphdDox';
/** An id X can have no user for: 20 digits. perch answers it 404 itself. */
const IMPOSSIBLE = '/v1/users/12345678901234567890';

type Product = 'users' | 'tweets';

/** What X's plans cover, by the path of the call: user lookups or tweet lookups. */
function productOf(path: string): Product {
  return path.startsWith('/2/tweets') ? 'tweets' : 'users';
}

interface XOptions {
  /** Each token X knows, and the products of its plan; any other token is 401. */
  readonly plans: ReadonlyMap<string, ReadonlySet<Product>>;
  /** Tokens of plans that speak for a user (OAuth 2.0 user context); the others are app-only. */
  readonly users?: ReadonlySet<string>;
  /** A front that answers 400 to a header line longer than this (nginx: 8 KiB), as it would before X sees it. */
  readonly maxHeaderLine?: number;
}

const ALL: ReadonlySet<Product> = new Set(['users', 'tweets']);

/**
 * X's lookups (fake-x.ts) behind X's own checks of the bearer token: 401 Unauthorized to a token
 * it does not know, 403 client-forbidden to a known token outside its plan, and `/2/users/me`
 * (user context only) 403 unsupported-authentication to an app-only token.
 */
function checkedX(x: FakeX, options: XOptions): UpstreamBehaviour {
  return (req, res) => {
    const authorization = req.headers.authorization ?? '';
    const send = (status: number, body: object) => {
      res.writeHead(status, { 'content-type': 'application/problem+json' });
      res.end(JSON.stringify(body));
    };
    if (options.maxHeaderLine !== undefined && `authorization: ${authorization}`.length > options.maxHeaderLine) {
      return send(400, { title: 'Request Header Or Cookie Too Large' });
    }
    const token = authorization.replace(/^Bearer /, '');
    const plan = options.plans.get(token);
    if (plan === undefined) return send(401, { title: 'Unauthorized', type: 'about:blank', status: 401, detail: 'Unauthorized' });
    if (req.url === '/2/users/me' && options.users?.has(token) === true) return send(200, { data: { id: '777', name: 'A user', username: 'a_user' } });
    if (answerAppOnlyWhoAmI(req, res)) return;
    if (!plan.has(productOf(req.url ?? ''))) {
      return send(403, {
        title: 'Client Forbidden',
        type: 'https://api.twitter.com/2/problems/client-forbidden',
        reason: 'client-not-enrolled',
        detail: 'When authenticating requests to the Twitter API v2 endpoints, you must use keys and tokens from a Twitter developer App that is attached to a Project.',
      });
    }
    x.behaviour(req, res);
  };
}

interface Reply {
  readonly status: number;
  readonly cacheStatus: string;
  readonly text: string;
}

/** GETs on perch from one client address (127.0.0.x), as a client there would. */
function from(t: TestContext, perch: RunningPerch, address: string): (path: string, key: string) => Promise<Reply> {
  const agent = new Agent({ localAddress: address });
  onCleanup(t, () => agent.close());
  return async (path, key) => {
    const res = await request(perch.url + path, { dispatcher: agent, headers: { 'x-api-key': key } });
    const text = await res.body.text();
    await perch.cache.settled();
    return { status: res.statusCode, cacheStatus: String(res.headers['cache-status'] ?? ''), text };
  };
}

function yaml(url: string, auth: string, extra = ''): string {
  return `
server: { host: 127.0.0.1, port: 0 }
auth: { mode: upstream, default_plan: resale${auth} }
rate_limits: { resale: { capacity: 1000, refill_per_second: 1000 } }
upstreams: { x: { kind: x_v2, url: "${url}", timeout_ms: 2000 } }
${extra}`;
}

/** Calls X received with `token`. */
function callsWith(upstream: TestUpstream, token: string): number {
  return upstream.requests.filter((r) => r.headers.authorization === `Bearer ${token}`).length;
}

function madeUp(bytes = 16): string {
  return `made-up-${randomBytes(bytes).toString('hex')}`;
}

test('an accepted key is answered 200 throughout an 8 s flood of made-up keys, and new genuine keys get 200 on their first request', { timeout: 60_000 }, async (t) => {
  const x = fakeX();
  const plans = new Map([[GENUINE, ALL], ...NEWCOMERS.map((token): [string, ReadonlySet<Product>] => [token, ALL])]);
  const upstream = await startUpstream(t, checkedX(x, { plans }));
  const clock = new ManualClock();
  const perch = await startPerch(t, yaml(upstream.url, ', verify_ttl_seconds: 3, verify_burst: 3, verify_rate_per_second: 1'), { clock, timers: clock });
  const genuine = from(t, perch, '127.0.0.1');
  const flood = from(t, perch, '127.0.0.2');
  assert.equal((await genuine('/v1/users/12', GENUINE)).status, 200);

  const answered: number[] = [];
  const newcomers: number[] = [];
  const floodStatuses = new Map<number, number>();
  for (let step = 0; step < 16; step++) {
    // Each half second, all at once: a fixed made-up key asking an impossible id, another on a
    // real path, and fresh made-up keys.
    const wave = await Promise.all([
      flood(IMPOSSIBLE, 'made-up-fixed-key-000'),
      flood(IMPOSSIBLE, 'made-up-fixed-key-000'),
      flood('/v1/users/12', 'made-up-fixed-key-001'),
      ...Array.from({ length: 4 }, () => flood('/v1/users/12', madeUp())),
    ]);
    for (const { status } of wave) floodStatuses.set(status, (floodStatuses.get(status) ?? 0) + 1);
    answered.push((await genuine('/v1/users/12', GENUINE)).status);
    if (step % 5 === 2) newcomers.push((await from(t, perch, `127.0.0.${3 + newcomers.length}`)('/v1/users/12', NEWCOMERS[newcomers.length]!)).status);
    clock.advance(500);
  }
  assert.deepEqual(answered, Array.from({ length: 16 }, () => 200));
  assert.deepEqual(newcomers, [200, 200, 200]);
  // The impossible ids never reached X and took no turn.
  assert.equal(
    upstream.requests.filter((r) => r.url.startsWith('/2/users/12345678901234567890')).length,
    0,
  );
  assert.equal(floodStatuses.get(404), 32);
  // The flood's source had its share of the turns: one at once (a quarter of verify_burst, at
  // least one), one more 4 s later (a quarter of verify_rate_per_second).
  const issued = new Set([GENUINE, ...NEWCOMERS].map((token) => `Bearer ${token}`));
  assert.equal(upstream.requests.filter((r) => !issued.has(String(r.headers.authorization))).length, 2);
  assert.deepEqual([...floodStatuses.keys()].sort(), [401, 404, 429]);
  // Each newcomer: who it speaks for (an app), then its request.
  for (const token of NEWCOMERS) assert.equal(callsWith(upstream, token), 2);
});

test('a key accepted for user lookups never gets a tweet body, cached or not: a 403 refuses it there and nowhere else', { timeout: 20_000 }, async (t) => {
  const x = fakeX();
  const upstream = await startUpstream(t, checkedX(x, { plans: new Map([[GENUINE, ALL], [USERS_ONLY, new Set<Product>(['users'])]]) }));
  // Two turns for unknown keys, both taken by the two keys' first calls.
  const perch = await startPerch(t, yaml(upstream.url, ', verify_burst: 2, verify_rate_per_second: 0.001, verify_source_share: 1'));
  const client = from(t, perch, '127.0.0.1');
  // Another key fills the cache with a tweet.
  assert.equal((await client('/v1/tweets/20', GENUINE)).status, 200);
  assert.match((await client('/v1/tweets/20', GENUINE)).cacheStatus, /; hit/);

  assert.equal((await client('/v1/users/12', USERS_ONLY)).status, 200);
  assert.equal((await client('/v1/users/12', madeUp())).status, 429, 'no turn left for unknown keys');
  // A key accepted elsewhere is verified here on the accepted keys' budget: X is asked.
  const cached = await client('/v1/tweets/20', USERS_ONLY);
  assert.deepEqual([cached.status, cached.text], [401, '{"error":{"message":"Invalid API key","code":"E401"}}']);
  assert.equal((await client('/v1/tweets/21', USERS_ONLY)).status, 401, 'its own uncached tweet');
  assert.equal((await client('/v1/tweets/20', USERS_ONLY)).status, 401);
  // X was asked once on tweets: the refusal is remembered for the endpoint.
  assert.deepEqual(
    upstream.requests.filter((r) => r.headers.authorization === `Bearer ${USERS_ONLY}`).map((r) => r.url.split('?')[0]),
    ['/2/users/me', '/2/users/12', '/2/tweets/20'],
  );
  // Still accepted where its plan reaches: a hit, without a call.
  assert.match((await client('/v1/users/12', USERS_ONLY)).cacheStatus, /; hit/);
  assert.equal(callsWith(upstream, USERS_ONLY), 3);
});

test('revalidations draw on a budget of their own; an acceptance no revalidation renewed lasts twice verify_ttl_seconds', { timeout: 20_000 }, async (t) => {
  const x = fakeX();
  const upstream = await startUpstream(t, checkedX(x, { plans: new Map([[GENUINE, ALL]]) }));
  const clock = new ManualClock();
  const auth = ', verify_ttl_seconds: 10, verify_burst: 1, verify_rate_per_second: 0.001, verify_source_share: 1, revalidate_burst: 1, revalidate_rate_per_second: 0.001';
  const perch = await startPerch(t, yaml(upstream.url, auth), { clock, timers: clock });
  const client = from(t, perch, '127.0.0.1');
  assert.equal((await client('/v1/users/12', GENUINE)).status, 200);
  assert.equal((await client('/v1/users/12', madeUp())).status, 429, "the unknown keys' one turn is spent");

  // Stale at 10 s: answered from the cache, and one revalidation on the accepted keys' turn.
  clock.advance(10_000);
  assert.match((await client('/v1/users/12', GENUINE)).cacheStatus, /; hit/);
  // Its answer has landed once it is counted: the acceptance dates from now.
  await waitFor(async () => (await metric(perch, 'perch_upstream_requests_total{upstream="x",route="user",outcome="ok"}')) === 2);
  assert.equal(callsWith(upstream, GENUINE), 3);
  // Stale again at 20 s, with no turn left to revalidate: still answered from the cache...
  clock.advance(10_000);
  assert.match((await client('/v1/users/12', GENUINE)).cacheStatus, /; hit/);
  clock.advance(9_999);
  assert.match((await client('/v1/users/12', GENUINE)).cacheStatus, /; hit/);
  assert.equal(callsWith(upstream, GENUINE), 3);
  // ...until twice verify_ttl_seconds after the last acceptance: then it is a key to verify anew.
  clock.advance(1);
  const lapsed = await client('/v1/users/12', GENUINE);
  assert.deepEqual([lapsed.status, lapsed.cacheStatus], [429, 'perch; fwd=miss']);
  assert.equal(callsWith(upstream, GENUINE), 3);
});

test('a stale key asking ids perch answers itself starts no revalidation: the accepted keys\' turn stays for the others', { timeout: 20_000 }, async (t) => {
  const x = fakeX();
  const upstream = await startUpstream(t, checkedX(x, { plans: new Map([[USERS_ONLY, new Set<Product>(['users'])], [GENUINE, ALL]]) }));
  const clock = new ManualClock();
  const auth = ', verify_ttl_seconds: 10, verify_burst: 2, verify_rate_per_second: 0.001, verify_source_share: 1, revalidate_burst: 1, revalidate_rate_per_second: 0.001';
  const perch = await startPerch(t, yaml(upstream.url, auth), { clock, timers: clock });
  const client = from(t, perch, '127.0.0.1');
  assert.equal((await client('/v1/users/12', USERS_ONLY)).status, 200);
  assert.equal((await client('/v1/users/13', GENUINE)).status, 200);
  assert.equal((await client('/v1/users/12', madeUp())).status, 429, "the unknown keys' turns are spent");

  // Both stale: the cheap key asks an id X cannot have, again and again.
  clock.advance(10_000);
  for (let i = 0; i < 5; i++) assert.equal((await client(IMPOSSIBLE, USERS_ONLY)).status, 404);
  // The accepted keys' one turn is still there for the other key's revalidation...
  assert.match((await client('/v1/users/13', GENUINE)).cacheStatus, /; hit/);
  await waitFor(() => callsWith(upstream, GENUINE) === 3);
  await waitFor(async () => (await metric(perch, 'perch_upstream_requests_total{upstream="x",route="user",outcome="ok"}')) === 3);
  // ...which renewed it: past twice verify_ttl_seconds from its first acceptance, still a hit.
  clock.advance(10_000);
  assert.match((await client('/v1/users/13', GENUINE)).cacheStatus, /; hit/);
  assert.equal(callsWith(upstream, USERS_ONLY), 2, 'who it speaks for, and its first call');
});

test('a stale key whose revalidations renew nothing takes one turn per endpoint each tenth of verify_ttl_seconds, not every turn', { timeout: 20_000 }, async (t) => {
  const x = fakeX();
  const failing = new Set<string>();
  const checked = checkedX(x, { plans: new Map([[USERS_ONLY, ALL], [GENUINE, ALL]]) });
  // X failing for one key only: its calls renew nothing, however often they are made.
  const upstream = await startUpstream(t, (req, res) => {
    if (!failing.has(String(req.headers.authorization).replace(/^Bearer /, ''))) return checked(req, res);
    res.writeHead(503, { 'content-type': 'application/problem+json' });
    res.end('{"title":"Service Unavailable"}');
  });
  const clock = new ManualClock();
  // Three turns for accepted keys: this key's first try, the other key's, this key's next.
  const auth = ', verify_ttl_seconds: 10, verify_burst: 2, verify_rate_per_second: 0.001, verify_source_share: 1, revalidate_burst: 3, revalidate_rate_per_second: 0.001';
  const perch = await startPerch(t, yaml(upstream.url, auth).replace('timeout_ms: 2000', 'timeout_ms: 2000, retries: 0'), { clock, timers: clock });
  const client = from(t, perch, '127.0.0.1');
  assert.equal((await client('/v1/users/12', USERS_ONLY)).status, 200);
  assert.equal((await client('/v1/users/13', GENUINE)).status, 200);

  failing.add(USERS_ONLY);
  clock.advance(10_000);
  const failed = () => metric(perch, 'perch_upstream_requests_total{upstream="x",route="user",outcome="status_5xx"}');
  assert.match((await client('/v1/users/12', USERS_ONLY)).cacheStatus, /; hit/);
  await waitFor(async () => (await failed()) === 1);
  // Its revalidation failed and left it stale: its next requests, served from the cache, start none.
  for (let i = 0; i < 4; i++) assert.match((await client('/v1/users/12', USERS_ONLY)).cacheStatus, /; hit/);
  assert.match((await client('/v1/users/13', GENUINE)).cacheStatus, /; hit/);
  await waitFor(() => callsWith(upstream, GENUINE) === 3);
  assert.equal(callsWith(upstream, USERS_ONLY), 3);
  // A tenth of verify_ttl_seconds later the key may try again.
  clock.advance(1_000);
  assert.match((await client('/v1/users/12', USERS_ONLY)).cacheStatus, /; hit/);
  await waitFor(async () => (await failed()) === 2);
  assert.equal(callsWith(upstream, USERS_ONLY), 4);
});

test('a user-context token, which could read protected accounts into the shared cache, is refused: X is asked who it speaks for, once', { timeout: 20_000 }, async (t) => {
  const x = fakeX();
  const upstream = await startUpstream(t, checkedX(x, { plans: new Map([[GENUINE, ALL], [USER_CONTEXT, ALL]]), users: new Set([USER_CONTEXT]) }));
  const perch = await startPerch(t, yaml(upstream.url, ''));
  const client = from(t, perch, '127.0.0.1');
  assert.equal((await client('/v1/users/12', GENUINE)).status, 200);
  for (const path of ['/v1/users/12', '/v1/users/13', '/v1/tweets/20']) {
    const refused = await client(path, USER_CONTEXT);
    assert.deepEqual([refused.status, refused.text], [401, '{"error":{"message":"Invalid API key","code":"E401"}}'], path);
  }
  assert.deepEqual(
    upstream.requests.filter((r) => r.headers.authorization === `Bearer ${USER_CONTEXT}`).map((r) => r.url),
    ['/2/users/me'],
  );
  assert.equal(perch.logs.lines().filter((l) => String(l.msg).startsWith('pass-through: a user-context token refused')).length, 1);
});

/** X knowing GENUINE and a newcomer's token, both of the full plan. */
async function newcomerX(t: TestContext): Promise<{ x: FakeX; upstream: TestUpstream; newcomer: string }> {
  const x = fakeX();
  const newcomer = NEWCOMERS[0]!;
  const upstream = await startUpstream(t, checkedX(x, { plans: new Map([[GENUINE, ALL], [newcomer, ALL]]) }));
  return { x, upstream, newcomer };
}

/** Answers every call X holds, and holds no more. */
function releaseAll(x: FakeX): void {
  x.hold = false;
  for (const release of x.held.splice(0)) release();
}

/** Fills the cache with users 1..n through GENUINE, one call each. */
async function fill(t: TestContext, perch: RunningPerch, n: number): Promise<void> {
  const client = from(t, perch, '127.0.0.1');
  for (let i = 1; i <= n; i++) assert.equal((await client(`/v1/users/${i}`, GENUINE)).status, 200);
}

test(`a new key's first 30 concurrent requests for cached paths make two calls (who it speaks for, one verifying call), and all 30 are 200`, { timeout: 20_000 }, async (t) => {
  const { x, upstream, newcomer } = await newcomerX(t);
  const perch = await startPerch(t, yaml(upstream.url, ''));
  await fill(t, perch, 30);
  x.hold = true;
  const client = from(t, perch, '127.0.0.3');
  const pending = Array.from({ length: 30 }, (_, i) => client(`/v1/users/${i + 1}`, newcomer));
  await waitFor(() => x.held.length === 1 && perch.received() === 60);
  releaseAll(x);
  const answers = await Promise.all(pending);
  assert.deepEqual(
    answers.map((a) => a.status),
    Array.from({ length: 30 }, () => 200),
  );
  // Who it speaks for (an app), then the one verifying call.
  assert.equal(callsWith(upstream, newcomer), 2);
});

test(`two instances on one Redis: a new key's 30 concurrent requests, split between them, make two calls in all`, { timeout: 30_000 }, async (t) => {
  const redis = await startRedis(t);
  const { x, upstream, newcomer } = await newcomerX(t);
  const config = yaml(upstream.url, '', `cache: { redis: { url: "${redis.url}", prefix: "t:", command_timeout_ms: 10000 } }`);
  const a = await startPerch(t, config);
  const b = await startPerch(t, config);
  await waitFor(() => a.cache.redisConnected === true && b.cache.redisConnected === true);
  await fill(t, a, 30);
  x.hold = true;
  const [onA, onB] = [from(t, a, '127.0.0.3'), from(t, b, '127.0.0.3')];
  const pending = Array.from({ length: 30 }, (_, i) => (i % 2 === 0 ? onA : onB)(`/v1/users/${i + 1}`, newcomer));
  await waitFor(() => x.held.length >= 1 && a.received() === 45 && b.received() === 15);
  releaseAll(x);
  const answers = await Promise.all(pending);
  assert.deepEqual(
    answers.map((r) => r.status),
    Array.from({ length: 30 }, () => 200),
  );
  // Who it speaks for (an app), then the one verifying call.
  assert.equal(callsWith(upstream, newcomer), 2);
});

/** Two instances on one Redis, in front of `upstream`, and a client of each from 127.0.0.1. */
async function fleetOfTwo(t: TestContext, upstream: TestUpstream, auth: string, options: { clock?: ManualClock } = {}) {
  const redis = await startRedis(t);
  const config = yaml(upstream.url, auth, `cache: { redis: { url: "${redis.url}", prefix: "t:", command_timeout_ms: 10000 } }`);
  const a = await startPerch(t, config, { clock: options.clock, timers: options.clock });
  const b = await startPerch(t, config, { clock: options.clock, timers: options.clock });
  await waitFor(() => a.cache.redisConnected === true && b.cache.redisConnected === true);
  return { a, b, onA: from(t, a, '127.0.0.1'), onB: from(t, b, '127.0.0.1') };
}

const E401_BODY = '{"error":{"message":"Invalid API key","code":"E401"}}';

test('two instances on one Redis: once the provider rejected a key through one, or refused it an endpoint, the other serves it nothing from there', { timeout: 30_000 }, async (t) => {
  const x = fakeX();
  const downgraded = NEWCOMERS[0]!;
  const plans = new Map<string, ReadonlySet<Product>>([[GENUINE, ALL], [downgraded, ALL]]);
  const upstream = await startUpstream(t, checkedX(x, { plans }));
  const { onA, onB } = await fleetOfTwo(t, upstream, ', verify_ttl_seconds: 60, reject_ttl_seconds: 60');

  // Accepted through both: B read A's verdict, and its cache answers the key without a call.
  assert.equal((await onA('/v1/users/12', GENUINE)).status, 200);
  assert.match((await onB('/v1/users/12', GENUINE)).cacheStatus, /; hit/);
  // The provider revokes the key; A hears it on a miss.
  plans.delete(GENUINE);
  assert.equal((await onA('/v1/users/13', GENUINE)).status, 401);
  const revoked = await onB('/v1/users/12', GENUINE);
  assert.deepEqual([revoked.status, revoked.text], [401, E401_BODY]);

  // A token accepted on tweets through both, then moved to a plan of user lookups only.
  assert.equal((await onA('/v1/tweets/20', downgraded)).status, 200);
  assert.match((await onB('/v1/tweets/20', downgraded)).cacheStatus, /; hit/);
  plans.set(downgraded, new Set<Product>(['users']));
  assert.equal((await onA('/v1/tweets/21', downgraded)).status, 401);
  const refused = await onB('/v1/tweets/20', downgraded);
  assert.deepEqual([refused.status, refused.text], [401, E401_BODY]);
  // Refused on tweets only: user lookups are still its.
  assert.equal((await onB('/v1/users/12', downgraded)).status, 200);
});

test(`two instances on one Redis: a key's acceptance renewed through one holds on the other, while made-up keys keep the unknown keys' turns spent`, { timeout: 30_000 }, async (t) => {
  const x = fakeX();
  const upstream = await startUpstream(t, checkedX(x, { plans: new Map([[GENUINE, ALL]]) }));
  const clock = new ManualClock();
  const { onA, onB } = await fleetOfTwo(t, upstream, ', verify_ttl_seconds: 4, verify_burst: 1, verify_rate_per_second: 0.001, verify_source_share: 1', { clock });
  assert.equal((await onA('/v1/users/1', GENUINE)).status, 200);
  // Renewed on A by its own miss 1.5 s later: the acceptance holds until 9.5 s.
  clock.advance(1_500);
  assert.match((await onA('/v1/users/2', GENUINE)).cacheStatus, /fwd=miss/);
  assert.equal((await onB('/v1/users/3', madeUp())).status, 429, "the unknown keys' one turn is spent");
  clock.advance(7_100);
  const onTheOther = await onB('/v1/users/1', GENUINE);
  assert.deepEqual([onTheOther.status, onTheOther.cacheStatus.includes('; hit')], [200, true]);
});

test(`two instances on one Redis: one killed while it holds a key's verifying turn holds up the other only until its lease lapses, not for its miss deadline`, { timeout: 60_000 }, async (t) => {
  const redis = await startRedis(t);
  const { x, upstream, newcomer } = await newcomerX(t);
  // A miss deadline far past the test's timeout: a turn held that long would time the test out.
  const config = yaml(upstream.url, '', `cache: { redis: { url: "${redis.url}", prefix: "t:", command_timeout_ms: 10000 } }`).replace(
    'server: { host: 127.0.0.1, port: 0 }',
    'server: { host: 127.0.0.1, port: 0, miss_deadline_ms: 600000 }',
  );
  const path = join(tempDir(t, 'perch-turn-'), 'perch.yaml');
  writeFileSync(path, config);
  const doomed = await spawnPerch(t, path);
  const survivor = await startPerch(t, config);
  await waitFor(async () => survivor.cache.redisConnected === true && (await metric(doomed, 'perch_redis_up')) === 1, 10_000);
  await fill(t, survivor, 1);
  const turns = new Redis(redis.url);
  onCleanup(t, () => turns.disconnect());

  x.hold = true;
  const dying = request(`${doomed.url}/v1/users/1`, { headers: { 'x-api-key': newcomer } }).catch(() => undefined);
  await waitFor(() => x.held.length === 1);
  const held = await turns.keys('t:auth:turn:*');
  assert.equal(held.length, 1, "the doomed instance holds the key's turn");
  // A lease of 3 s, which the living holder renews while its call runs.
  const lease = await turns.pttl(held[0]!);
  assert.ok(lease > 0 && lease <= 3000, `lease ${lease} ms`);
  await waitFor(async () => (await turns.pttl(held[0]!)) > lease);
  const waiting = from(t, survivor, '127.0.0.3')('/v1/users/1', newcomer);
  await waitFor(() => survivor.received() === 2);
  doomed.process.kill('SIGKILL');
  await doomed.exited;
  await dying;
  releaseAll(x);
  assert.equal((await waiting).status, 200);
  // The dead instance's two calls (who it speaks for, its verifying call), then the survivor's.
  assert.equal(callsWith(upstream, newcomer), 4);
});

/**
 * Two instances on one Redis with miss deadlines of their own: `patient`'s verifying call for
 * the newcomer holds the key's turn, its call held at X, while `other` is asked for the key.
 */
async function patientHoldsTheTurn(t: TestContext, otherDeadlineMs: number) {
  const redis = await startRedis(t);
  const { x, upstream, newcomer } = await newcomerX(t);
  const config = (deadline: number) =>
    yaml(upstream.url, '', `cache: { redis: { url: "${redis.url}", prefix: "t:", command_timeout_ms: 10000 } }`).replace(
      'server: { host: 127.0.0.1, port: 0 }',
      `server: { host: 127.0.0.1, port: 0, miss_deadline_ms: ${deadline} }`,
    );
  const patient = await startPerch(t, config(20_000));
  const other = await startPerch(t, config(otherDeadlineMs));
  await waitFor(() => patient.cache.redisConnected === true && other.cache.redisConnected === true);
  await fill(t, patient, 1);
  x.hold = true;
  // Released at 5 s at the latest, so that a wait that never ends fails the asserts, not the timeout.
  const cap = setTimeout(() => releaseAll(x), 5000);
  onCleanup(t, () => clearTimeout(cap));
  const verifying = from(t, patient, '127.0.0.3')('/v1/users/1', newcomer);
  await waitFor(() => x.held.length === 1);
  return { x, upstream, newcomer, patient, other, verifying };
}

test("two instances on one Redis: a request waiting on the other instance's verifying turn is answered 504 at its own miss deadline, and calls nobody", { timeout: 30_000 }, async (t) => {
  const { x, upstream, newcomer, other, verifying } = await patientHoldsTheTurn(t, 1000);
  const started = performance.now();
  const waited = await from(t, other, '127.0.0.3')('/v1/users/1', newcomer);
  const ms = performance.now() - started;
  assert.deepEqual([waited.status, waited.text], [504, '{"error":{"message":"Upstream timeout","code":"E504"}}']);
  assert.ok(ms >= 1000 && ms < 1500, `answered after ${Math.round(ms)} ms, on a deadline of 1000`);
  const line = other.logs.lines().find((l) => l.msg === 'request')!;
  assert.deepEqual([line.status, line.upstream_call], [504, false]);
  releaseAll(x);
  assert.equal((await verifying).status, 200);
  // The patient instance's two calls (who the key speaks for, its verifying call); none of the other's.
  assert.equal(callsWith(upstream, newcomer), 2);
});

test("two instances on one Redis: a client that leaves while its instance waits on the other's verifying turn is logged 499; its instance calls nobody when the turn ends without a verdict", { timeout: 30_000 }, async (t) => {
  const { x, upstream, newcomer, other, verifying } = await patientHoldsTheTurn(t, 20_000);
  const { port } = new URL(other.url);
  const socket = connect(Number(port), '127.0.0.1');
  socket.on('error', () => {});
  await new Promise((resolve) => socket.once('connect', resolve));
  socket.write(`GET /v1/users/1 HTTP/1.1\r\nHost: perch\r\nx-api-key: ${newcomer}\r\n\r\n`);
  await waitFor(() => other.received() === 1);
  // A reset: a FIN alone would be a half-close, which perch still answers.
  socket.resetAndDestroy();
  await waitFor(() => other.logs.lines().some((l) => l.msg === 'request'), 10_000);
  const line = other.logs.lines().find((l) => l.msg === 'request')!;
  assert.deepEqual([line.status, line.upstream_call], [499, false]);
  // The turn ends without a verdict: the patient instance's verifying call fails.
  x.failWith = { status: 503 };
  releaseAll(x);
  assert.equal((await verifying).status, 502);
  // The other instance holds nothing of the request that left: no wait of its runs on to take the freed turn.
  assert.equal(callsWith(upstream, newcomer), 2);
});

test("a new key's requests waiting for its verifying call share that call's failure: one call, however many wait", { timeout: 20_000 }, async (t) => {
  const { x, upstream, newcomer } = await newcomerX(t);
  const perch = await startPerch(t, yaml(upstream.url, '').replace('timeout_ms: 2000', 'timeout_ms: 2000, retries: 0'));
  await fill(t, perch, 10);
  x.failWith = { status: 503 };
  x.hold = true;
  const client = from(t, perch, '127.0.0.3');
  const pending = Array.from({ length: 10 }, (_, i) => client(`/v1/users/${i + 1}`, newcomer));
  // Who it speaks for is answered at once (403: an app); its verifying call waits at X.
  await waitFor(() => x.held.length === 1 && perch.received() === 20);
  releaseAll(x);
  const answers = await Promise.all(pending);
  assert.deepEqual(
    answers.map((a) => a.status),
    Array.from({ length: 10 }, () => 502),
  );
  assert.equal(callsWith(upstream, newcomer), 2);
});

test("a reload while a key's verifying call runs: the key's next requests still wait for that call", { timeout: 20_000 }, async (t) => {
  const { x, upstream, newcomer } = await newcomerX(t);
  const perch = await startPerch(t, yaml(upstream.url, ''));
  await fill(t, perch, 2);
  x.hold = true;
  const client = from(t, perch, '127.0.0.3');
  const first = client('/v1/users/1', newcomer);
  await waitFor(() => x.held.length === 1);
  perch.reload(yaml(upstream.url, '').replace('capacity: 1000', 'capacity: 2000'));
  const second = client('/v1/users/2', newcomer);
  await waitFor(() => perch.received() === 4);
  releaseAll(x);
  assert.deepEqual([(await first).status, (await second).status], [200, 200]);
  assert.equal(callsWith(upstream, newcomer), 2);
});

test(`a reload that changes remembered_keys while a key's verifying call runs: that call's verdict answers the key's requests from before and after it`, { timeout: 20_000 }, async (t) => {
  const { x, upstream, newcomer } = await newcomerX(t);
  // Two turns for unknown keys: the key that fills the cache takes one, the newcomer's verifying
  // call the other, and none is left for a request that would verify the newcomer again.
  const auth = (remembered: number) => `, verify_burst: 2, verify_rate_per_second: 0.001, verify_source_share: 1, remembered_keys: ${remembered}`;
  const perch = await startPerch(t, yaml(upstream.url, auth(1000)));
  await fill(t, perch, 3);
  x.hold = true;
  const client = from(t, perch, '127.0.0.3');
  const first = client('/v1/users/1', newcomer);
  await waitFor(() => x.held.length === 1);
  const waiting = client('/v1/users/2', newcomer);
  await waitFor(() => perch.received() === 5);
  perch.reload(yaml(upstream.url, auth(2000)));
  const after = client('/v1/users/3', newcomer);
  await waitFor(() => perch.received() === 6);
  releaseAll(x);
  assert.deepEqual(
    (await Promise.all([first, waiting, after])).map((r) => r.status),
    [200, 200, 200],
  );
  assert.match((await client('/v1/users/3', newcomer)).cacheStatus, /; hit/);
  assert.equal(callsWith(upstream, newcomer), 2);
});

test('a reload to mode keys while a key waits for its verifying call: the waiting request is 401, not served', { timeout: 20_000 }, async (t) => {
  const { x, upstream, newcomer } = await newcomerX(t);
  const perch = await startPerch(t, yaml(upstream.url, ''));
  await fill(t, perch, 2);
  x.hold = true;
  const client = from(t, perch, '127.0.0.3');
  const first = client('/v1/users/1', newcomer);
  await waitFor(() => x.held.length === 1);
  const second = client('/v1/users/2', newcomer);
  await waitFor(() => perch.received() === 4);
  perch.reload(`
server: { host: 127.0.0.1, port: 0 }
auth: { keys: [{ id: alpha, key: "test-key-alpha-0123456789", plan: resale }] }
rate_limits: { resale: { capacity: 1000, refill_per_second: 1000 } }
upstreams: { x: { kind: x_v2, url: "${upstream.url}", timeout_ms: 2000, bearer_token: "${GENUINE}" } }
`);
  releaseAll(x);
  // The first request's own call answers it; the second one's key has no provider's word now.
  assert.deepEqual([(await first).status, (await second).status], [200, 401]);
  assert.equal(callsWith(upstream, newcomer), 2);
});

test("a key's verifying call whose client went away still answers the key's other requests", { timeout: 20_000 }, async (t) => {
  const { x, upstream, newcomer } = await newcomerX(t);
  const perch = await startPerch(t, yaml(upstream.url, ''));
  await fill(t, perch, 5);
  x.hold = true;
  const agent = new Agent({ localAddress: '127.0.0.3' });
  onCleanup(t, () => agent.close());
  const gone = new AbortController();
  const leader = request(`${perch.url}/v1/users/1`, { dispatcher: agent, headers: { 'x-api-key': newcomer }, signal: gone.signal });
  await waitFor(() => x.held.length === 1);
  const client = from(t, perch, '127.0.0.3');
  const others = Array.from({ length: 4 }, (_, i) => client(`/v1/users/${i + 2}`, newcomer));
  await waitFor(() => perch.received() === 10);
  gone.abort();
  await assert.rejects(leader);
  releaseAll(x);
  assert.deepEqual(
    (await Promise.all(others)).map((a) => a.status),
    [200, 200, 200, 200],
  );
  assert.equal(callsWith(upstream, newcomer), 2);
});

test('with its Redis not answering, an instance verifies keys on its own', { timeout: 30_000 }, async (t) => {
  const redis = await startRedis(t);
  const { upstream, newcomer } = await newcomerX(t);
  const perch = await startPerch(t, yaml(upstream.url, '', `rate_limits_redis: { url: "${redis.url}", command_timeout_ms: 200 }`));
  await fill(t, perch, 1);
  redis.freeze();
  onCleanup(t, () => redis.thaw());
  const client = from(t, perch, '127.0.0.3');
  assert.equal((await client('/v1/users/1', newcomer)).status, 200);
  assert.match((await client('/v1/users/1', newcomer)).cacheStatus, /; hit/);
  assert.equal(callsWith(upstream, newcomer), 2);
});

test(`made-up keys too long for the provider's front neither open the breaker nor count against X: a genuine key's next misses are 200`, { timeout: 30_000 }, async (t) => {
  const x = fakeX();
  const upstream = await startUpstream(t, checkedX(x, { plans: new Map([[GENUINE, ALL]]), maxHeaderLine: 8192 }));
  const perch = await startPerch(t, yaml(upstream.url, ', verify_burst: 40'));
  assert.equal((await from(t, perch, '127.0.0.1')('/v1/users/1', GENUINE)).status, 200);
  // 20 made-up keys of about 9 KB, at once, each from an address of its own.
  const oversized = await Promise.all(Array.from({ length: 20 }, (_, i) => from(t, perch, `127.0.0.${10 + i}`)('/v1/users/1', madeUp(4600))));
  assert.equal(upstream.requests.length, 22, 'each made-up key was asked about once');
  assert.deepEqual(new Set(oversized.map((r) => r.status)), new Set([502]));
  const genuine = from(t, perch, '127.0.0.1');
  const next: number[] = [];
  for (let i = 0; i < 5; i++) next.push((await genuine(`/v1/users/${100 + i}`, GENUINE)).status);
  assert.deepEqual(next, [200, 200, 200, 200, 200]);
});

test('verdicts survive a SIGHUP that leaves the auth settings as they were, and not one that changes the provider', { timeout: 20_000 }, async (t) => {
  const x = fakeX();
  const plans = new Map([[GENUINE, ALL]]);
  const upstream = await startUpstream(t, checkedX(x, { plans }));
  const other = await startUpstream(t, checkedX(fakeX(), { plans }));
  const perch = await startPerch(t, yaml(upstream.url, ''));
  const client = from(t, perch, '127.0.0.1');
  assert.equal((await client('/v1/users/12', GENUINE)).status, 200);
  // A reload that changes the plans and the verification budget, not who judged the key.
  perch.reload(yaml(upstream.url, ', verify_burst: 5').replace('capacity: 1000', 'capacity: 2000'));
  assert.match((await client('/v1/users/12', GENUINE)).cacheStatus, /; hit/);
  assert.equal(upstream.requests.length, 2);
  // Another provider behind the same name: every key is its to judge again.
  perch.reload(yaml(other.url, ', verify_burst: 5'));
  assert.match((await client('/v1/users/12', GENUINE)).cacheStatus, /fwd=miss/);
  assert.equal(other.requests.length, 2);
});

test(`a verify_source_share too small for an integer Retry-After keeps perch from starting; at the smallest one taken, a source's second new key waits 15 digits' worth`, { timeout: 30_000 }, async (t) => {
  const upstream = await startUpstream(t, checkedX(fakeX(), { plans: new Map([[GENUINE, ALL], [NEWCOMERS[0]!, ALL]]) }));
  const path = join(tempDir(t, 'perch-share-'), 'perch.yaml');
  writeFileSync(path, yaml(upstream.url, ', verify_source_share: 5e-324'));
  const refused = await runCli(t, ['--config', path]);
  assert.equal(refused.code, 2);
  assert.match(refused.stderr, /auth\.verify_source_share: must be at least 1 \/ \(999999999999999 \* verify_rate_per_second\)/);
  assert.equal(upstream.requests.length, 0);

  const perch = await startPerch(t, yaml(upstream.url, ', verify_source_share: 2e-15'));
  const client = from(t, perch, '127.0.0.1');
  assert.equal((await client('/v1/users/1', GENUINE)).status, 200);
  const res = await request(`${perch.url}/v1/users/1`, { headers: { 'x-api-key': NEWCOMERS[0]! } });
  await res.body.dump();
  assert.deepEqual([res.statusCode, res.headers['retry-after']], [429, '500000000000000']);
});

test('answers perch makes itself come before verification and take no turn: a made-up key asking impossible ids leaves the turn to a new genuine key', { timeout: 20_000 }, async (t) => {
  const x = fakeX();
  const newcomer = NEWCOMERS[0]!;
  const upstream = await startUpstream(t, checkedX(x, { plans: new Map([[newcomer, ALL]]) }));
  const perch = await startPerch(t, yaml(upstream.url, ', verify_burst: 1, verify_rate_per_second: 0.001'));
  const attacker = from(t, perch, '127.0.0.2');
  for (let i = 0; i < 5; i++) assert.equal((await attacker(IMPOSSIBLE, 'made-up-fixed-key-000')).status, 404);
  assert.equal((await attacker('/v1/users/by/username/sixteen_letters_', 'made-up-fixed-key-000')).status, 404);
  assert.equal((await attacker('/v1/users/abc', 'made-up-fixed-key-000')).status, 400);
  assert.equal(upstream.requests.length, 0);
  assert.equal((await from(t, perch, '127.0.0.3')('/v1/users/12', newcomer)).status, 200);
});
