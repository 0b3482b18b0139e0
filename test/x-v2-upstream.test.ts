import assert from 'node:assert/strict';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { test, type TestContext } from 'node:test';
import { mapFollowing } from '../src/upstream/x-v2/map-following.js';
import { mapReplies } from '../src/upstream/x-v2/map-replies.js';
import { mapTimeline } from '../src/upstream/x-v2/map-timeline.js';
import { mapTweet } from '../src/upstream/x-v2/map-tweet.js';
import { mapUser } from '../src/upstream/x-v2/map-user.js';
import { ManualClock } from './helpers/clock.js';
import { startPerch, testConfig } from './helpers/perch.js';
import { startUpstream, type UpstreamBehaviour } from './helpers/upstream-server.js';
import { xFixture, xFixtureText } from './helpers/x-v2-fixtures.js';

const TOKEN_A = 'AAAAAAAAAAAAAAAAAAAAAPerchTestTokenOne%2Bxyz';
const TOKEN_B = 'AAAAAAAAAAAAAAAAAAAAAPerchTestTokenTwo%2Bxyz';
const START = Date.UTC(2026, 0, 1);
const NEXT_TWEETS = '7140dibdnow9c7btw3w29grvxfcgvpb9n9coehpk7xz5i';
const NEXT_REPLIES = '7140dibdnow9c7btw3w29grvxfcgvpb9n9coehpk7xz5j';
const NEXT_FOLLOWING = 'DFEDBNRFT3MHCZZZ';

const USER_FIELDS = 'user.fields=created_at,description,location,pinned_tweet_id,profile_image_url,profile_banner_url,protected,public_metrics,url,verified';
const TIMELINE_QUERY = 'tweet.fields=attachments,created_at,entities,note_tweet,public_metrics&expansions=attachments.media_keys&media.fields=preview_image_url,type,url';
const REPLIES_QUERY =
  'exclude=retweets&tweet.fields=author_id,conversation_id,created_at,in_reply_to_user_id,lang,note_tweet,possibly_sensitive,public_metrics&expansions=author_id&user.fields=profile_image_url,verified';

/** Answers like X: application/json with X's rate-limit headers, or problem+json for errors. */
function send(res: ServerResponse, status: number, body: string, headers: Record<string, string> = {}): void {
  const type = status === 200 ? 'application/json; charset=utf-8' : 'application/problem+json';
  res.writeHead(status, { 'content-type': type, 'content-length': Buffer.byteLength(body), ...headers });
  res.end(body);
}

/** A stand-in for X serving the fixtures by path, as X's v2 endpoints would answer. */
const standIn: UpstreamBehaviour = (req: IncomingMessage, res: ServerResponse) => {
  const url = new URL(req.url ?? '/', 'http://x');
  const token = url.searchParams.get('pagination_token');
  const path = url.pathname;
  const serve = (name: string) => send(res, 200, xFixtureText(name), { 'x-rate-limit-limit': '900', 'x-rate-limit-remaining': '899', 'x-rate-limit-reset': String(START / 1000 + 900) });
  if (path === '/2/users/by/username/xdevelopers' || path === '/2/users/2244994945') return serve('user');
  if (path === '/2/tweets/1722701605825642574') return serve('tweet');
  if (path.startsWith('/2/tweets/')) return serve('tweet-not-found');
  if (path === '/2/users/777/tweets' || path === '/2/users/777/following') return serve('empty-listing');
  if (path === '/2/users/2244994945/tweets' && url.searchParams.has('exclude')) return serve(token === NEXT_REPLIES ? 'replies-page2' : 'replies-page1');
  if (path === '/2/users/2244994945/tweets') return serve(token === NEXT_TWEETS ? 'timeline-page2' : 'timeline-page1');
  if (path === '/2/users/2244994945/following') return serve(token === NEXT_FOLLOWING ? 'following-page2' : 'following-page1');
  return serve('user-not-found');
};

async function setup(t: TestContext, behaviour: UpstreamBehaviour, extra = '') {
  const clock = new ManualClock(START);
  const upstream = await startUpstream(t, behaviour);
  const settings = extra === '' ? `bearer_token: "${TOKEN_A}"` : extra;
  const perch = await startPerch(t, testConfig(`x: { kind: x_v2, url: "${upstream.url}", timeout_ms: 2000, ${settings} }`), { clock, timers: clock });
  return { clock, upstream, perch };
}

/** The path and query perch sent for each upstream request, in order. */
function sent(upstream: { requests: { url: string }[] }): string[] {
  return upstream.requests.map((r) => r.url);
}

test('x_v2 serves all six endpoints: mapped field by field, each request exactly X\'s documented parameters', { timeout: 10_000 }, async (t) => {
  const { upstream, perch } = await setup(t, standIn);
  // null: no call, the answer was stored under both user routes by the one before (cross-population).
  const cases: [string, unknown, string | null][] = [
    ['/v1/users/by/username/XDevelopers', mapUser(xFixture('user')), `/2/users/by/username/xdevelopers?${USER_FIELDS}`],
    ['/v1/users/2244994945', mapUser(xFixture('user')), null],
    [
      '/v1/tweets/1722701605825642574',
      mapTweet(xFixture('tweet')),
      '/2/tweets/1722701605825642574?tweet.fields=author_id,attachments,created_at,entities,note_tweet,public_metrics&expansions=author_id,attachments.media_keys&media.fields=preview_image_url,type,url&user.fields=profile_image_url',
    ],
    ['/v1/users/2244994945/tweets', mapTimeline(xFixture('timeline-page1')), `/2/users/2244994945/tweets?max_results=20&${TIMELINE_QUERY}`],
    ['/v1/users/2244994945/replies', mapReplies(xFixture('replies-page1')), `/2/users/2244994945/tweets?max_results=100&${REPLIES_QUERY}`],
    [
      '/v1/users/2244994945/following',
      mapFollowing(xFixture('following-page1')),
      '/2/users/2244994945/following?max_results=20&user.fields=description,profile_image_url,public_metrics,verified',
    ],
  ];
  for (const [path, expected, upstreamPath] of cases) {
    const before = upstream.requests.length;
    const res = await perch.request(path);
    assert.equal(res.status, 200, path);
    assert.deepEqual(res.json(), expected, path);
    if (upstreamPath === null) assert.equal(upstream.requests.length, before, path);
    else assert.deepEqual(sent(upstream).slice(before), [upstreamPath], path);
  }
  assert.equal(upstream.requests.length, 5);
  for (const request of upstream.requests) {
    const keys = [...new URL(request.url, 'http://x').searchParams.keys()];
    assert.equal(new Set(keys).size, keys.length, `no repeated parameter in ${request.url}`);
    assert.equal(request.headers.authorization, `Bearer ${TOKEN_A}`);
  }
  assert.ok(!perch.logs.text().includes(TOKEN_A), 'the bearer token is never logged');
});

test('x_v2 not found is 200 with only errors at X: 404 E404, negatively cached', { timeout: 10_000 }, async (t) => {
  const { upstream, perch } = await setup(t, standIn);
  const cases: [string, string][] = [
    ['/v1/users/4040000000000000001', 'User not found'],
    ['/v1/users/by/username/nobody_here', 'User not found'],
    ['/v1/users/4040000000000000001/tweets', 'User not found'],
    ['/v1/tweets/4040000000000000002', 'Tweet not found'],
  ];
  for (const [path, message] of cases) {
    const res = await perch.request(path);
    assert.deepEqual([res.status, res.json()], [404, { error: { message, code: 'E404' } }], path);
  }
  const calls = upstream.requests.length;
  assert.equal(calls, 4);
  // Beyond X's own rules (signed 64-bit ids, 15 characters): X would answer 400, so no call is made.
  for (const path of [
    '/v1/users/12345678901234567890',
    '/v1/tweets/12345678901234567890',
    '/v1/users/by/username/a_sixteen_chars_',
    '/v1/users/9223372036854775808',
    '/v1/tweets/9999999999999999999',
    '/v1/users/9223372036854775808/replies',
    '/v1/users/18446744073709551615/following',
  ]) {
    const res = await perch.request(path);
    assert.deepEqual([res.status, (res.json() as { error: { code: string } }).error.code], [404, 'E404'], path);
  }
  assert.equal(upstream.requests.length, calls);
  // 2^63 - 1 is an id X may have: asked.
  assert.equal((await perch.request('/v1/users/9223372036854775807')).status, 404);
  assert.equal(upstream.requests.length, calls + 1);
  upstream.requests.pop();
  assert.equal(sent(upstream)[0], `/2/users/4040000000000000001?${USER_FIELDS}`);
  for (const [path] of cases) assert.equal((await perch.request(path)).status, 404);
  assert.equal(upstream.requests.length, calls, 'the second ask of each is a cache hit');
});

test('x_v2 empty listings ({"meta":{"result_count":0}}) are empty last pages, not 404s', { timeout: 10_000 }, async (t) => {
  const { perch } = await setup(t, standIn);
  const tweets = await perch.request('/v1/users/777/tweets');
  assert.deepEqual([tweets.status, tweets.json()], [200, { data: { entries: [], cursor_bottom: '', has_more: false } }]);
  const following = await perch.request('/v1/users/777/following');
  assert.deepEqual([following.status, following.json()], [200, { data: { users: [], cursor_bottom: '', cursor_top: '', has_more: false } }]);
});

test('x_v2 pagination across two pages: the v1 cursor goes back to X as pagination_token', { timeout: 10_000 }, async (t) => {
  const { upstream, perch } = await setup(t, standIn);
  const first = (await perch.request('/v1/users/2244994945/tweets')).json();
  assert.deepEqual([first.data.cursor_bottom, first.data.has_more], [NEXT_TWEETS, true]);
  const second = await perch.request(`/v1/users/2244994945/tweets?cursor=${encodeURIComponent(first.data.cursor_bottom)}`);
  assert.deepEqual(second.json(), mapTimeline(xFixture('timeline-page2')));
  assert.equal(second.json().data.has_more, false);
  assert.equal(sent(upstream).at(-1), `/2/users/2244994945/tweets?max_results=20&pagination_token=${NEXT_TWEETS}&${TIMELINE_QUERY}`);

  const replies = (await perch.request('/v1/users/2244994945/replies')).json();
  const lastReplies = await perch.request(`/v1/users/2244994945/replies?cursor=${replies.meta.next_token}`);
  assert.deepEqual(lastReplies.json(), mapReplies(xFixture('replies-page2')));
  assert.ok(!('next_token' in lastReplies.json().meta));
  assert.equal(sent(upstream).at(-1), `/2/users/2244994945/tweets?max_results=100&pagination_token=${NEXT_REPLIES}&${REPLIES_QUERY}`);

  const following = (await perch.request('/v1/users/2244994945/following?count=5')).json();
  const lastFollowing = await perch.request(`/v1/users/2244994945/following?count=5&cursor=${following.data.cursor_bottom}`);
  assert.deepEqual(lastFollowing.json(), mapFollowing(xFixture('following-page2')));
  assert.deepEqual(sent(upstream).slice(-2), [
    '/2/users/2244994945/following?max_results=5&user.fields=description,profile_image_url,public_metrics,verified',
    `/2/users/2244994945/following?max_results=5&pagination_token=${NEXT_FOLLOWING}&user.fields=description,profile_image_url,public_metrics,verified`,
  ]);
});

test('x_v2 429 without Retry-After: x-rate-limit-reset sets the cool-down, for that endpoint only', { timeout: 10_000 }, async (t) => {
  let limited = true;
  const { clock, upstream, perch } = await setup(t, (req, res) => {
    if (limited && (req.url ?? '').startsWith('/2/users/2244994945/tweets')) {
      limited = false;
      return send(res, 429, xFixtureText('problem-too-many-requests'), { 'x-rate-limit-limit': '900', 'x-rate-limit-remaining': '0', 'x-rate-limit-reset': String(START / 1000 + 600) });
    }
    standIn(req, res);
  });
  const res = await perch.request('/v1/users/2244994945/tweets');
  assert.deepEqual([res.status, res.headers.get('retry-after')], [429, '600']);
  clock.advance(599_000);
  assert.deepEqual((await perch.request('/v1/users/2244994945/tweets?cursor=abc')).headers.get('retry-after'), '1');
  assert.equal((await perch.request('/v1/users/2244994945')).status, 200, 'other endpoints of the credential still answer');
  assert.deepEqual(sent(upstream).map((u) => u.split('?')[0]), ['/2/users/2244994945/tweets', '/2/users/2244994945']);
  clock.advance(1000);
  assert.equal((await perch.request('/v1/users/2244994945/tweets')).status, 200);
  assert.equal(upstream.requests.length, 3, 'called again once the reset came');
});

test('x_v2 tweets and replies share X\'s window of GET /2/users/:id/tweets: a stop on one holds the other', { timeout: 10_000 }, async (t) => {
  const { clock, upstream, perch } = await setup(t, (req, res) => {
    const url = req.url ?? '';
    if (url.startsWith('/2/users/2244994945/tweets') && !url.includes('exclude=')) {
      return send(res, 200, xFixtureText('timeline-page1'), { 'x-rate-limit-limit': '900', 'x-rate-limit-remaining': '0', 'x-rate-limit-reset': String(START / 1000 + 300) });
    }
    standIn(req, res);
  });
  assert.equal((await perch.request('/v1/users/2244994945/tweets')).status, 200);
  const replies = await perch.request('/v1/users/2244994945/replies');
  assert.deepEqual([replies.status, replies.headers.get('retry-after')], [429, '300'], 'the window the tweets call spent is the replies\' too');
  assert.equal((await perch.request('/v1/users/2244994945/following')).status, 200, 'another endpoint, another window');
  assert.deepEqual(sent(upstream).map((u) => u.split('?')[0]), ['/2/users/2244994945/tweets', '/2/users/2244994945/following']);
  clock.advance(300_000);
  assert.equal((await perch.request('/v1/users/2244994945/replies')).status, 200);
  assert.equal(upstream.requests.length, 3);
});

test('x_v2 a 503 with Retry-After stops every endpoint, not only the one that drew it', { timeout: 10_000 }, async (t) => {
  let overloaded = true;
  const { clock, upstream, perch } = await setup(t, (req, res) => {
    if (overloaded) {
      overloaded = false;
      return send(res, 503, '{"title":"Service Unavailable"}', { 'retry-after': '120' });
    }
    standIn(req, res);
  });
  const first = await perch.request('/v1/users/2244994945');
  assert.equal(first.status, 429);
  for (const path of ['/v1/tweets/1722701605825642574', '/v1/users/2244994945/tweets', '/v1/users/by/username/xdevelopers']) {
    const res = await perch.request(path);
    assert.deepEqual([res.status, res.headers.get('retry-after')], [429, '120'], path);
  }
  assert.equal(upstream.requests.length, 1, 'no other endpoint called the overloaded X');
  clock.advance(120_000);
  assert.equal((await perch.request('/v1/tweets/1722701605825642574')).status, 200);
});

test('x_v2 usage-capped: the credential stops on every endpoint, logged at error; the other token serves', { timeout: 10_000 }, async (t) => {
  const { upstream, perch } = await setup(
    t,
    (req, res) => {
      if (req.headers.authorization === `Bearer ${TOKEN_A}`) {
        return send(res, 429, xFixtureText('problem-usage-capped'), { 'x-rate-limit-limit': '900', 'x-rate-limit-remaining': '812', 'x-rate-limit-reset': String(START / 1000 + 900) });
      }
      standIn(req, res);
    },
    `credentials: [{ id: one, bearer_token: "${TOKEN_A}" }, { id: two, bearer_token: "${TOKEN_B}" }]`,
  );
  assert.equal((await perch.request('/v1/users/2244994945')).status, 200, 'the call is made again on the other token');
  for (const path of ['/v1/tweets/1722701605825642574', '/v1/users/2244994945/tweets', '/v1/users/2244994945/replies', '/v1/users/2244994945/following']) {
    assert.equal((await perch.request(path)).status, 200, path);
  }
  assert.deepEqual(
    upstream.requests.map((r) => r.headers.authorization),
    [`Bearer ${TOKEN_A}`, ...Array(5).fill(`Bearer ${TOKEN_B}`)],
  );
  const errors = perch.logs.lines().filter((l) => l.level === 50);
  assert.deepEqual(errors.map((l) => [l.msg, l.upstream, l.credential]), [['provider usage cap spent: credential stopped on every endpoint', 'x', 'one']]);
  assert.ok(!perch.logs.text().includes(TOKEN_A) && !perch.logs.text().includes(TOKEN_B));
});

test('x_v2 usage-capped with one token: every endpoint answers 429 without calling X', { timeout: 10_000 }, async (t) => {
  const { upstream, perch } = await setup(t, (_req, res) => send(res, 429, xFixtureText('problem-usage-capped'), { 'x-rate-limit-remaining': '812', 'x-rate-limit-reset': String(START / 1000 + 900) }));
  assert.equal((await perch.request('/v1/users/2244994945')).status, 429);
  for (const path of ['/v1/tweets/1', '/v1/users/2/tweets', '/v1/users/2/replies', '/v1/users/2/following', '/v1/users/by/username/abc']) {
    const res = await perch.request(path);
    assert.deepEqual([res.status, res.headers.get('retry-after')], [429, '86400'], path);
  }
  assert.equal(upstream.requests.length, 1);
});

for (const status of [402, 403]) {
  test(`x_v2 usage-capped on a ${status}: the token stops on every endpoint as on a 429, not called again`, { timeout: 10_000 }, async (t) => {
    const { upstream, perch } = await setup(t, (_req, res) => send(res, status, xFixtureText('problem-usage-capped')));
    assert.equal((await perch.request('/v1/users/2244994945')).status, 429);
    for (const path of ['/v1/tweets/1', '/v1/users/2/following']) {
      const res = await perch.request(path);
      assert.deepEqual([res.status, res.headers.get('retry-after')], [429, '86400'], path);
    }
    assert.equal(upstream.requests.length, 1);
    assert.deepEqual(
      perch.logs.lines().filter((l) => l.level === 50).map((l) => l.msg),
      ['provider usage cap spent: credential stopped on every endpoint'],
    );
  });
}

test('x_v2 403 (an endpoint outside the plan) fails that call and keeps the token for the others', { timeout: 10_000 }, async (t) => {
  const { upstream, perch } = await setup(t, (req, res) =>
    (req.url ?? '').includes('/following')
      ? send(res, 403, JSON.stringify({ title: 'Client Forbidden', type: 'https://api.twitter.com/2/problems/client-forbidden', reason: 'client-not-enrolled' }))
      : standIn(req, res),
  );
  assert.equal((await perch.request('/v1/users/2244994945/following')).status, 502);
  assert.equal((await perch.request('/v1/users/2244994945')).status, 200);
  assert.equal(upstream.requests.length, 2);
  assert.equal(perch.logs.lines().filter((l) => l.level === 50).length, 0, 'not logged as a rejected credential');
});

const CLIENT_FORBIDDEN = JSON.stringify({ title: 'Client Forbidden', type: 'https://api.twitter.com/2/problems/client-forbidden', reason: 'client-not-enrolled' });

for (const scope of ['endpoint', 'upstream']) {
test(`x_v2 an endpoint X refuses to a token is not asked again with it for forbidden_retry_seconds, logged once; the token serves the others (cooldown_scope ${scope})`, { timeout: 10_000 }, async (t) => {
  const { clock, upstream, perch } = await setup(
    t,
    (req, res) => ((req.url ?? '').includes('/following') ? send(res, 403, CLIENT_FORBIDDEN) : standIn(req, res)),
    // A breaker that opens on 2 failures: the refusals must not count as the provider failing.
    `bearer_token: "${TOKEN_A}", forbidden_retry_seconds: 600, cooldown_scope: ${scope}, breaker: { consecutive_failures: 2 }`,
  );
  const following = () => upstream.requests.filter((r) => (r.url ?? '').includes('/following')).length;
  // Three users at once: all three reach X before its first 403 is back.
  const first = await Promise.all(['2244994945', '14', '15'].map((id) => perch.request(`/v1/users/${id}/following`)));
  assert.deepEqual(
    first.map((r) => [r.status, r.text]),
    Array(3).fill([502, '{"error":{"message":"Upstream error","code":"E502"}}']),
  );
  assert.equal(following(), 3);
  // Another user, so no cache or flight can answer it: only the remembered refusal does.
  assert.equal((await perch.request('/v1/users/783214/following')).status, 502);
  assert.equal(following(), 3);
  assert.equal((await perch.request('/v1/users/2244994945')).status, 200, 'the same token on another endpoint');
  const refusals = perch.logs.lines().filter((l) => l.msg === 'provider refuses this endpoint to the credential: not asked again until then');
  assert.deepEqual(
    refusals.map((l) => [l.level, l.credential, l.route, l.until]),
    [[40, 'default', 'following', new Date(START + 600_000).toISOString()]],
  );
  clock.advance(599_999);
  assert.equal((await perch.request('/v1/users/12/following')).status, 502);
  assert.equal(following(), 3);
  clock.advance(1);
  assert.equal((await perch.request('/v1/users/13/following')).status, 502);
  assert.equal(following(), 4, 'asked again once the time is up');
  assert.equal(perch.logs.lines().filter((l) => l.msg === refusals[0]!.msg).length, 2, 'logged again for the new refusal');
  assert.equal(perch.logs.lines().filter((l) => l.level === 50).length, 0, 'not logged as a rejected credential');
});
}

test('x_v2 a 403 for one token makes the call once more with the next, which X serves', { timeout: 10_000 }, async (t) => {
  const { upstream, perch } = await setup(
    t,
    (req, res) =>
      (req.url ?? '').includes('/following') && req.headers.authorization === `Bearer ${TOKEN_A}` ? send(res, 403, CLIENT_FORBIDDEN) : standIn(req, res),
    `credentials: [{ id: one, bearer_token: "${TOKEN_A}" }, { id: two, bearer_token: "${TOKEN_B}" }]`,
  );
  // The stand-in knows the first user only: the others are X's own "not found", still answers.
  const statuses = [];
  for (const id of ['2244994945', '783214', '12']) statuses.push((await perch.request(`/v1/users/${id}/following`)).status);
  assert.deepEqual(statuses, [200, 404, 404]);
  assert.deepEqual(
    upstream.requests.filter((r) => (r.url ?? '').includes('/following')).map((r) => r.headers.authorization),
    [`Bearer ${TOKEN_A}`, `Bearer ${TOKEN_B}`, `Bearer ${TOKEN_B}`, `Bearer ${TOKEN_B}`],
  );
});

test('x_v2 a 200 that cannot be mapped is 502 E502, logged with the JSON path, not cached', { timeout: 10_000 }, async (t) => {
  const user = xFixture('user');
  delete user.data.public_metrics;
  const { upstream, perch } = await setup(t, (_req, res) => send(res, 200, JSON.stringify(user)));
  for (let i = 0; i < 2; i++) assert.equal((await perch.request('/v1/users/2244994945')).status, 502);
  assert.equal(upstream.requests.length, 2);
  const reasons = perch.logs.lines().filter((l) => l.level === 40 && typeof l.reason === 'string').map((l) => l.reason);
  assert.ok(reasons.includes('status 200 with a body not of the X v2 user shape: /data/public_metrics must be object'), JSON.stringify(reasons));
});

const NOT_AUTHORIZED = JSON.stringify({
  errors: [
    {
      value: '99',
      detail: 'Sorry, you are not authorized to see the user with id: [99].',
      title: 'Authorization Error',
      resource_type: 'user',
      parameter: 'id',
      resource_id: '99',
      type: 'https://api.twitter.com/2/problems/not-authorized-for-resource',
    },
  ],
});

test('x_v2 a protected account (200, not-authorized-for-resource) is 404 E404, cached, never against the breaker: 25 asks, one call, the public timeline still 200', { timeout: 20_000 }, async (t) => {
  // A breaker that would open on 2 failures: the four calls below would open it if they counted.
  const { upstream, perch } = await setup(
    t,
    (req, res) => (/^\/2\/(?:users\/99\/|tweets\/98\?)/.test(req.url ?? '') ? send(res, 200, NOT_AUTHORIZED) : standIn(req, res)),
    `bearer_token: "${TOKEN_A}", breaker: { consecutive_failures: 2 }`,
  );
  const calls = (prefix: string) => upstream.requests.filter((r) => r.url.startsWith(prefix)).length;
  for (let i = 0; i < 25; i++) {
    const res = await perch.request('/v1/users/99/tweets');
    assert.deepEqual([res.status, res.json()], [404, { error: { message: 'User not found', code: 'E404' } }], `ask ${i + 1}`);
  }
  assert.equal(calls('/2/users/99/tweets'), 1, 'the 404 is cached: one call for 25 asks');
  for (const [path, message] of [
    ['/v1/users/99/replies', 'User not found'],
    ['/v1/users/99/following', 'User not found'],
    ['/v1/tweets/98', 'Tweet not found'],
  ] as const) {
    for (let i = 0; i < 2; i++) assert.deepEqual([(await perch.request(path)).status, (await perch.request(path)).json()], [404, { error: { message, code: 'E404' } }], path);
  }
  assert.equal(upstream.requests.length, 4, 'one call per resource');
  const pub = await perch.request('/v1/users/2244994945/tweets');
  assert.deepEqual([pub.status, pub.json()], [200, mapTimeline(xFixture('timeline-page1'))]);
});

test('x_v2 a tweet whose author X left out of includes is 502 E502, not cached, and never against the breaker', { timeout: 20_000 }, async (t) => {
  const tweet = xFixture('tweet');
  delete tweet.includes.users;
  const replies = xFixture('replies-page1');
  replies.includes.users = [];
  const { upstream, perch } = await setup(
    t,
    (req, res) => {
      const url = req.url ?? '';
      if (url.startsWith('/2/tweets/1722701605825642574')) return send(res, 200, JSON.stringify(tweet));
      if (url.startsWith('/2/users/2244994945/tweets') && url.includes('exclude=retweets')) return send(res, 200, JSON.stringify(replies));
      return standIn(req, res);
    },
    `bearer_token: "${TOKEN_A}", breaker: { consecutive_failures: 2 }`,
  );
  for (const path of ['/v1/tweets/1722701605825642574', '/v1/users/2244994945/replies']) {
    for (let i = 0; i < 3; i++) {
      const res = await perch.request(path);
      assert.deepEqual([res.status, res.text], [502, '{"error":{"message":"Upstream error","code":"E502"}}'], path);
    }
  }
  assert.equal(upstream.requests.length, 6, 'not cached: each ask is a call, and the breaker let every one through');
  assert.equal((await perch.request('/v1/users/2244994945')).status, 200);
  const reasons = perch.logs.lines().filter((l) => typeof l.reason === 'string').map((l) => l.reason as string);
  assert.ok(reasons.includes('status 200 with an X v2 tweet body that refers to what it left out: /includes/users has no entry for /data/author_id'), JSON.stringify(reasons));
});

/**
 * A post of exactly 1,000 characters (code points, an emoji among them) as X sends it: `text` cut
 * at 280, the whole text and its entities, counted in it, under `note_tweet`.
 */
function longPost() {
  const mention = '@XDevelopers';
  const hashtag = '#perch';
  const link = 'https://t.co/LongPost01';
  const head = 'Thread 🧵 on caching proxies. ';
  const filler = (n: number) => 'words that fill a long post '.repeat(40).slice(0, n);
  const parts = [head, filler(300), mention, ' ', filler(400), hashtag, ' ', link, ' '];
  const used = parts.reduce((sum, p) => sum + [...p].length, 0);
  const text = parts.join('') + filler(1000 - used);
  const at = (s: string) => [...text.slice(0, text.indexOf(s))].length;
  const span = (s: string) => ({ start: at(s), end: at(s) + [...s].length });
  const noteEntities = {
    mentions: [{ ...span(mention), username: 'XDevelopers', id: '2244994945' }],
    hashtags: [{ ...span(hashtag), tag: 'perch' }],
    urls: [{ ...span(link), url: link, expanded_url: 'https://example.com/long', display_url: 'example.com/long' }],
  };
  const v1Entities = {
    hashtags: [{ text: 'perch', indices: [span(hashtag).start, span(hashtag).end] }],
    urls: [{ url: link, expanded_url: 'https://example.com/long', display_url: 'example.com/long', indices: [span(link).start, span(link).end] }],
    user_mentions: [{ screen_name: 'XDevelopers', id_str: '2244994945', indices: [span(mention).start, span(mention).end] }],
    media: [],
    symbols: [],
  };
  const cut = [...text].slice(0, 279).join('') + '…';
  return { text, cut, noteEntities, v1Entities };
}

test('x_v2 a post of 1,000 characters comes back whole, with its entities, as the tweet, in the tweets listing and in replies', { timeout: 20_000 }, async (t) => {
  const post = longPost();
  assert.equal([...post.text].length, 1000);
  const withNote = (tweet: any) => ({ ...tweet, text: post.cut, entities: { hashtags: [{ start: 0, end: 6, tag: 'cut' }] }, note_tweet: { text: post.text, entities: post.noteEntities } });
  const tweet = xFixture('tweet');
  tweet.data = withNote(tweet.data);
  delete tweet.data.attachments;
  const timeline = xFixture('timeline-page1');
  timeline.data[0] = withNote(timeline.data[0]);
  delete timeline.data[0].attachments;
  const replies = xFixture('replies-page1');
  replies.data[0] = { ...replies.data[0], text: post.cut, note_tweet: { text: post.text, entities: post.noteEntities } };
  const { perch } = await setup(t, (req, res) => {
    const url = req.url ?? '';
    if (url.startsWith('/2/tweets/1722701605825642574')) return send(res, 200, JSON.stringify(tweet));
    if (url.startsWith('/2/users/2244994945/tweets') && url.includes('exclude=retweets')) return send(res, 200, JSON.stringify(replies));
    if (url.startsWith('/2/users/2244994945/tweets')) return send(res, 200, JSON.stringify(timeline));
    return standIn(req, res);
  });
  const single = (await perch.request('/v1/tweets/1722701605825642574')).json().data;
  assert.deepEqual([single.full_text, single.entities], [post.text, post.v1Entities]);
  const entry = (await perch.request('/v1/users/2244994945/tweets')).json().data.entries[0].legacy;
  assert.deepEqual([entry.full_text, entry.entities], [post.text, post.v1Entities]);
  const reply = (await perch.request('/v1/users/2244994945/replies')).json().data[0];
  assert.equal(reply.text, post.text);
});
