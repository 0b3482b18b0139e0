import assert from 'node:assert/strict';
import { test, type TestContext } from 'node:test';
import { Ajv2020 } from 'ajv/dist/2020.js';
import { ENDPOINT_NAMES, type EndpointName } from '../src/endpoints.js';
import { OPENAPI_DOCUMENT } from '../src/openapi/document.js';
import { RESPONSE_SCHEMA, SCHEMAS } from '../src/schemas/resources.js';
import { checkResponseBody } from '../src/schemas/response-check.js';
import { ManualClock } from './helpers/clock.js';
import { startPerch, testConfig, v1, waitFor } from './helpers/perch.js';
import { sampleFollowingPage, sampleRepliesPage, sampleTweet, sampleTweetsPage, sampleUser } from './helpers/sample-bodies.js';
import { json, startUpstream } from './helpers/upstream-server.js';

const E502 = { error: { message: 'Upstream error', code: 'E502' } };
/** Put into every invalid body: it must reach neither the client nor the log. */
const LEAK = 'provider-detail-5519';

type Json = any;

/** A valid body of the endpoint, from the samples. */
function validBody(endpoint: EndpointName): Json {
  switch (endpoint) {
    case 'user':
    case 'user_by_username':
      return sampleUser();
    case 'tweets':
      return sampleTweetsPage();
    case 'replies':
      return sampleRepliesPage();
    case 'following':
      return sampleFollowingPage();
    case 'tweet':
      return sampleTweet();
  }
}

test('every sample body passes, extra fields at any depth included', { timeout: 10_000 }, () => {
  for (const endpoint of ENDPOINT_NAMES) {
    assert.equal(checkResponseBody(endpoint, validBody(endpoint)), undefined, endpoint);
  }
  const tweets = sampleTweetsPage() as Json;
  tweets.extra = 1;
  tweets.data.extra = [1];
  tweets.data.entries[0].sortIndex = '9';
  tweets.data.entries[0].legacy.lang = 'en';
  tweets.data.entries[0].legacy.entities.urls[0].extra = null;
  assert.equal(checkResponseBody('tweets', tweets), undefined);
  const following = sampleFollowingPage() as Json;
  following.data.users[0].result.rest_id = '124';
  following.data.users[0].result.legacy.location = 'Porto';
  assert.equal(checkResponseBody('following', following), undefined);
  // The last page of replies carries no next_token; a middle page carries one.
  const replies = sampleRepliesPage() as Json;
  replies.meta.next_token = 'n';
  assert.equal(checkResponseBody('replies', replies), undefined);
});

/** [endpoint, change to a valid body, the exact description expected]. */
const MISMATCHES: [EndpointName, (body: Json) => void, string][] = [
  ['user', (b) => (b.followers_count = '12'), '/followers_count must be number'],
  ['user', (b) => delete b.pinned_tweet_ids, '/pinned_tweet_ids is missing'],
  ['user', (b) => (b.pinned_tweet_ids = [456]), '/pinned_tweet_ids/0 must be string'],
  ['user', (b) => (b.id = `12${LEAK}`), '/id must match pattern "^[0-9]+$"'],
  ['user', (b) => (b.created_at = LEAK), '/created_at must match pattern "^[A-Z][a-z]{2} [A-Z][a-z]{2} \\d{2} \\d{2}:\\d{2}:\\d{2} \\+0000 \\d{4}$"'],
  ['user_by_username', (b) => (b.verified = 'true'), '/verified must be boolean'],
  ['tweets', (b) => delete b.data.has_more, '/data/has_more is missing'],
  ['tweets', (b) => (b.data.entries[1].legacy.favorite_count = '3'), '/data/entries/1/legacy/favorite_count must be number'],
  ['tweets', (b) => delete b.data.entries[0].legacy.entities.media, '/data/entries/0/legacy/entities/media is missing'],
  ['tweets', (b) => (b.data.entries = {}), '/data/entries must be array'],
  ['replies', (b) => delete b.data[1].stats.view_count, '/data/1/stats/view_count is missing'],
  ['replies', (b) => (b.data[0].author = LEAK), '/data/0/author must be object'],
  ['replies', (b) => delete b.data[0].author.verified, '/data/0/author/verified is missing'],
  ['replies', (b) => (b.meta.result_count = null), '/meta/result_count must be number'],
  ['following', (b) => (b.data.users[1].result.legacy.verified = 'yes'), '/data/users/1/result/legacy/verified must be boolean'],
  ['following', (b) => delete b.data.cursor_top, '/data/cursor_top is missing'],
  ['tweet', (b) => (b.data.entities.urls[0].url = 42), '/data/entities/urls/0/url must be string'],
  ['tweet', (b) => delete b.data.user, '/data/user is missing'],
  ['tweet', (b) => (b.data.user.screen_name = false), '/data/user/screen_name must be string'],
];

test('a mismatch is described by its JSON path and the rule, never by the value', { timeout: 10_000 }, () => {
  for (const [endpoint, change, expected] of MISMATCHES) {
    const body = validBody(endpoint);
    change(body);
    assert.equal(checkResponseBody(endpoint, body), expected, expected);
  }
  for (const body of [null, [], LEAK, 7]) assert.equal(checkResponseBody('user', body), 'the body must be object');
  // One endpoint's body is not another's.
  assert.equal(checkResponseBody('tweets', sampleUser()), '/data is missing');
  assert.equal(checkResponseBody('replies', sampleTweetsPage()), '/meta is missing');
  assert.equal(checkResponseBody('replies', { data: {}, meta: { result_count: 0 } }), '/data must be array');
});

test("the served document's component schemas are the validator's source, and they agree on every field", { timeout: 10_000 }, async (t) => {
  // Same object, not a copy: the document cannot describe anything the check does not enforce.
  assert.equal(OPENAPI_DOCUMENT.components.schemas, SCHEMAS);
  const perch = await startPerch(t, testConfig('demo: { kind: fixture }'));
  const served = (await perch.request('/openapi.json', { key: null })).json();
  assert.deepEqual(served.components.schemas, JSON.parse(JSON.stringify(SCHEMAS)));

  const ajv = new Ajv2020({ strict: false });
  ajv.addSchema({ $id: 'served', components: served.components });
  const operations: Record<EndpointName, string> = {
    user: '/v1/users/{user_id}',
    user_by_username: '/v1/users/by/username/{username}',
    tweets: '/v1/users/{user_id}/tweets',
    replies: '/v1/users/{user_id}/replies',
    following: '/v1/users/{user_id}/following',
    tweet: '/v1/tweets/{tweet_id}',
  };
  for (const endpoint of ENDPOINT_NAMES) {
    const { $ref } = served.paths[operations[endpoint]].get.responses['200'].content['application/json'].schema;
    assert.equal($ref, `#/components/schemas/${RESPONSE_SCHEMA[endpoint]}`, endpoint);
    const documented = ajv.compile({ $ref: `served${$ref}` });
    // Every member of a valid body, replaced by a value of another type or removed: the served
    // document and perch's check must reach the same verdict on each.
    let compared = 0;
    for (const variant of variants(validBody(endpoint))) {
      assert.equal(checkResponseBody(endpoint, variant) === undefined, documented(variant), `${endpoint}: ${JSON.stringify(variant)}`);
      compared++;
    }
    assert.ok(compared > 20, `${endpoint}: ${compared} variants`);
  }
});

/** Copies of `body` with one member changed: to each of a few wrongly typed values, or removed. */
function* variants(body: Json): Generator<Json> {
  const paths: (string | number)[][] = [];
  const walk = (value: Json, path: (string | number)[]) => {
    if (path.length > 0) paths.push(path);
    if (typeof value === 'object' && value !== null) {
      for (const [key, child] of Object.entries(value)) walk(child, [...path, Array.isArray(value) ? Number(key) : key]);
    }
  };
  walk(body, []);
  for (const path of paths) {
    for (const replacement of ['12', 12, true, null, [], {}, undefined]) {
      const copy = structuredClone(body);
      const parent = path.slice(0, -1).reduce((node: Json, key) => node[key], copy);
      const last = path[path.length - 1]!;
      if (replacement === undefined) {
        if (Array.isArray(parent)) parent.splice(last as number, 1);
        else delete parent[last];
      } else {
        parent[last] = replacement;
      }
      yield copy;
    }
  }
}

/** The series' value in a Prometheus text exposition, e.g. of `perch_upstream_requests_total{...}`. */
async function metric(url: string, series: string): Promise<number | undefined> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const line = text.split('\n').find((l) => l.startsWith(`${series} `));
  return line === undefined ? undefined : Number(line.slice(series.length + 1));
}

/** [endpoint, request path, the body's change, the JSON path the log must name]. */
const HTTP_CASES: [EndpointName, string, (body: Json) => void, string][] = [
  ['user', '/v1/users/123', (b) => (b.followers_count = '12'), '/followers_count must be number'],
  ['user_by_username', '/v1/users/by/username/alice', (b) => (b.pinned_tweet_ids = ['456', 7]), '/pinned_tweet_ids/1 must be string'],
  ['tweets', '/v1/users/123/tweets', (b) => delete b.data.has_more, '/data/has_more is missing'],
  ['tweets', '/v1/users/123/tweets?cursor=c2', (b) => (b.data.entries[0].legacy.favorite_count = '3'), '/data/entries/0/legacy/favorite_count must be number'],
  ['replies', '/v1/users/123/replies', (b) => delete b.data[1].stats.view_count, '/data/1/stats/view_count is missing'],
  ['following', '/v1/users/123/following?count=2', (b) => (b.data.users[0].result.legacy.verified = 'true'), '/data/users/0/result/legacy/verified must be boolean'],
  ['tweet', '/v1/tweets/456', (b) => (b.data.entities.urls[0].url = 4_242_424), '/data/entities/urls/0/url must be string'],
];

/** A valid body of the endpoint with `change` applied and LEAK in a field that stays valid. */
function invalidBody(endpoint: EndpointName, change: (body: Json) => void): Json {
  const body = validBody(endpoint);
  change(body);
  body.provider_note = LEAK;
  return body;
}

for (const [endpoint, path, change, mismatch] of HTTP_CASES) {
  test(`${endpoint}: a 200 failing the schema (${mismatch}) is 502 E502, never cached, logged with its path`, { timeout: 10_000 }, async (t: TestContext) => {
    const body = invalidBody(endpoint, change);
    const upstream = await startUpstream(t, json(200, body));
    const perch = await startPerch(t, testConfig(v1('main', upstream.url)));
    for (const attempt of [1, 2]) {
      const res = await perch.request(path);
      assert.deepEqual([res.status, res.json()], [502, E502], `attempt ${attempt}`);
      assert.ok(!res.text.includes(LEAK));
      // Nothing was cached: the second request reaches the upstream again.
      assert.equal(upstream.requests.length, attempt);
    }
    assert.equal(perch.cache.memory.size().entries, 0);
    const warnings = perch.logs.lines().filter((l) => l.msg === 'upstream failed');
    assert.equal(warnings.length, 2);
    for (const warning of warnings) {
      assert.equal(warning.level, 40);
      assert.equal(warning.upstream, 'main');
      assert.equal(warning.route, endpoint);
      assert.equal(warning.failure, 'invalid_body');
      assert.equal(warning.reason, `status 200 with a body not of the ${endpoint} schema: ${mismatch}`);
    }
    // Not the body, nor any value of it: the marker and the wrongly typed value appear nowhere.
    const logged = perch.logs.text();
    assert.ok(!logged.includes(LEAK), 'the log holds a value of the body');
    const wrong = endpoint === 'tweet' ? '4242424' : endpoint === 'user' ? '"12"' : undefined;
    if (wrong !== undefined) assert.ok(!logged.includes(wrong), `the log holds ${wrong}`);
    const series = `perch_upstream_requests_total{upstream="main",route="${endpoint}",outcome="invalid_body"}`;
    assert.equal(await metric(perch.url, series), 2);
  });
}

test('a retained stale entry is served, not 502, when its refresh answers a body failing the schema', { timeout: 10_000 }, async (t) => {
  const clock = new ManualClock();
  const upstream = await startUpstream(t, json(200, sampleUser()));
  const perch = await startPerch(t, testConfig(v1('main', upstream.url), 'cache: { stale_seconds: 600, ttl_seconds: { user: 300 } }'), { clock });
  const original = await perch.request('/v1/users/123');
  assert.equal(original.status, 200);
  clock.advance(310_000);
  upstream.behaviour = json(200, invalidBody('user', (b) => (b.followers_count = '12')));

  const stale = await perch.request('/v1/users/123');
  assert.equal(stale.status, 200);
  assert.equal(stale.headers.get('cache-status'), 'perch; fwd=stale; ttl=-10');
  assert.equal(stale.text, original.text);
  await waitFor(() => perch.logs.lines().some((l) => l.msg === 'upstream failed' && l.failure === 'invalid_body'));
  assert.equal(upstream.requests.length, 2);
  // The refresh stored nothing: the entry is still the old one, still stale.
  assert.equal(perch.cache.local('/v1/users/123')?.fresh, false);
  const again = await perch.request('/v1/users/123');
  assert.equal(again.text, original.text);
  assert.match(again.headers.get('cache-status') ?? '', /^perch; fwd=stale/);
  assert.ok(!perch.logs.text().includes(LEAK));
});

test('a body failing the schema makes perch try the next upstream of the route', { timeout: 10_000 }, async (t) => {
  const broken = await startUpstream(t, json(200, invalidBody('tweet', (b) => delete b.data.user)));
  const good = await startUpstream(t, json(200, sampleTweet()));
  const perch = await startPerch(t, testConfig(`${v1('main', broken.url)}\n${v1('backup', good.url)}`, 'routes: { tweet: [main, backup] }'));
  const res = await perch.request('/v1/tweets/456');
  assert.equal(res.status, 200);
  assert.deepEqual(res.json(), sampleTweet());
  assert.deepEqual([broken.requests.length, good.requests.length], [1, 1]);
});
