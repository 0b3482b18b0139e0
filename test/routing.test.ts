import assert from 'node:assert/strict';
import { test } from 'node:test';
import { sampleProvider, startUpstream } from './helpers/upstream-server.js';
import { startPerch, testConfig, v1 } from './helpers/perch.js';

const e400 = (message: string) => ({ error: { message, code: 'E400' } });

test('each of the six routes is forwarded to the upstream path it names', async (t) => {
  const upstream = await startUpstream(t, sampleProvider);
  const perch = await startPerch(t, testConfig(v1('main', upstream.url)));
  const cases: [string, string][] = [
    ['/v1/users/123', '/v1/users/123'],
    // Not alice: the user fetched by id above is also cached under her username (cross-population).
    ['/v1/users/by/username/bob', '/v1/users/by/username/bob'],
    ['/v1/users/123/tweets', '/v1/users/123/tweets'],
    ['/v1/users/123/replies', '/v1/users/123/replies'],
    ['/v1/users/123/following', '/v1/users/123/following?count=20'],
    ['/v1/tweets/456', '/v1/tweets/456'],
  ];
  for (const [path, forwarded] of cases) {
    const res = await perch.request(path);
    assert.equal(res.status, 200, path);
    assert.match(res.headers.get('content-type')!, /^application\/json/);
    assert.equal(upstream.requests.at(-1)!.url, forwarded);
  }
  assert.equal(upstream.requests.length, cases.length);
});

test('parameters are normalized: username lowercased, count defaulted, unknown parameters dropped', async (t) => {
  const upstream = await startUpstream(t, sampleProvider);
  const perch = await startPerch(t, testConfig(v1('main', upstream.url)));
  await perch.request('/v1/users/by/username/Alice_1?debug=1');
  await perch.request('/v1/users/1/following?count=5&cursor=a%2Bb%20c&x=y');
  await perch.request('/v1/users/1/tweets?cursor=abc&count=7');
  await perch.request('/v1/tweets/9?cursor=abc');
  assert.deepEqual(
    upstream.requests.map((r) => r.url),
    [
      '/v1/users/by/username/alice_1',
      '/v1/users/1/following?count=5&cursor=a%2Bb%20c',
      '/v1/users/1/tweets?cursor=abc',
      '/v1/tweets/9',
    ],
  );
});

test('malformed parameters are 400 E400 naming the parameter, and never reach the upstream', async (t) => {
  const upstream = await startUpstream(t, sampleProvider);
  const perch = await startPerch(t, testConfig(v1('main', upstream.url)));
  const idMessage = 'Invalid parameter: user_id must be 1-20 decimal digits';
  const countMessage = 'Invalid parameter: count must be an integer from 1 to 100';
  const cursorMessage = 'Invalid parameter: cursor must be at most 1024 bytes with no control characters';
  const cases: [string, string][] = [
    ['/v1/users/abc', idMessage],
    ['/v1/users/123456789012345678901', idMessage],
    ['/v1/users/-1/tweets', idMessage],
    ['/v1/users/1.5/replies', idMessage],
    ['/v1/users/%zz', idMessage],
    ['/v1/tweets/12a', 'Invalid parameter: tweet_id must be 1-20 decimal digits'],
    ['/v1/users/by/username/bad-name', 'Invalid parameter: username must be 1-50 letters, digits or underscores'],
    ['/v1/users/by/username/' + 'a'.repeat(51), 'Invalid parameter: username must be 1-50 letters, digits or underscores'],
    ['/v1/users/1/following?count=0', countMessage],
    ['/v1/users/1/following?count=101', countMessage],
    ['/v1/users/1/following?count=2.5', countMessage],
    ['/v1/users/1/following?count=', countMessage],
    ['/v1/users/1/following?count=ten', countMessage],
    ['/v1/users/1/following?count=1&count=2', 'Invalid parameter: count must be given at most once'],
    ['/v1/users/1/tweets?cursor=' + 'x'.repeat(1025), cursorMessage],
    ['/v1/users/1/tweets?cursor=' + '%C3%A9'.repeat(513), cursorMessage],
    ['/v1/users/1/replies?cursor=a%0Ab', cursorMessage],
    ['/v1/users/1/replies?cursor=', cursorMessage],
    ['/v1/users/1/tweets?cursor=a&cursor=b', 'Invalid parameter: cursor must be given at most once'],
  ];
  for (const [path, message] of cases) {
    const res = await perch.request(path);
    assert.equal(res.status, 400, path);
    assert.deepEqual(res.json(), e400(message), path);
  }
  assert.equal(upstream.requests.length, 0);
});

test('boundary values are accepted', async (t) => {
  const upstream = await startUpstream(t, sampleProvider);
  const perch = await startPerch(t, testConfig(v1('main', upstream.url)));
  for (const path of [
    '/v1/users/12345678901234567890',
    '/v1/users/by/username/' + 'A'.repeat(50),
    '/v1/users/1/following?count=1',
    '/v1/users/1/following?count=100',
    '/v1/users/1/tweets?cursor=' + 'x'.repeat(1024),
  ]) {
    assert.equal((await perch.request(path)).status, 200, path);
  }
});

test('unknown routes are 404 E404', async (t) => {
  const upstream = await startUpstream(t, sampleProvider);
  const perch = await startPerch(t, testConfig(v1('main', upstream.url)));
  for (const path of ['/', '/v1', '/v1/users', '/v1/users/1/likes', '/v2/users/1', '/v1/users/1/', '/v1/tweets', '/v1/users/by/username']) {
    const res = await perch.request(path);
    assert.equal(res.status, 404, path);
    assert.deepEqual(res.json(), { error: { message: 'Not found', code: 'E404' } });
  }
  assert.equal(upstream.requests.length, 0);
});

test('methods other than GET and HEAD are 405 E405 with Allow', async (t) => {
  const upstream = await startUpstream(t, sampleProvider);
  const perch = await startPerch(t, testConfig(v1('main', upstream.url)));
  for (const method of ['POST', 'PUT', 'DELETE', 'PATCH', 'OPTIONS']) {
    const res = await perch.request('/v1/users/1', { method });
    assert.equal(res.status, 405, method);
    assert.equal(res.headers.get('allow'), 'GET, HEAD');
    assert.deepEqual(res.json(), { error: { message: 'Method not allowed', code: 'E405' } });
  }
  assert.equal(upstream.requests.length, 0);
});

test('HEAD answers like GET without a body', async (t) => {
  const upstream = await startUpstream(t, sampleProvider);
  const perch = await startPerch(t, testConfig(v1('main', upstream.url)));
  const get = await perch.request('/v1/users/1');
  const head = await perch.request('/v1/users/1', { method: 'HEAD' });
  assert.equal(head.status, 200);
  assert.equal(head.text, '');
  assert.equal(head.headers.get('content-length'), String(Buffer.byteLength(get.text)));
  assert.equal(head.headers.get('content-type'), get.headers.get('content-type'));
  const badHead = await perch.request('/v1/users/x', { method: 'HEAD' });
  assert.equal(badHead.status, 400);
  assert.equal(badHead.text, '');
});

test('through perch, the fixture upstream answers all six routes in the spec shapes and pages to the end', async (t) => {
  const perch = await startPerch(t, testConfig('demo: { kind: fixture }'));
  const user = (await perch.request('/v1/users/by/username/Perch_Demo')).json();
  assert.equal(user.username, 'perch_demo');
  const byId = (await perch.request(`/v1/users/${user.id}`)).json();
  assert.equal(byId.id, user.id);
  for (const field of ['name', 'description', 'profile_image_url', 'profile_banner_url', 'created_at', 'location', 'url']) {
    assert.equal(typeof byId[field], 'string', field);
  }
  assert.ok(Array.isArray(byId.pinned_tweet_ids));

  let cursor: string | undefined;
  let pages = 0;
  const seen = new Set<string>();
  do {
    const page = (await perch.request(`/v1/users/${user.id}/tweets${cursor ? `?cursor=${encodeURIComponent(cursor)}` : ''}`)).json();
    for (const entry of page.data.entries) seen.add(entry.legacy.id_str);
    cursor = page.data.has_more ? page.data.cursor_bottom : undefined;
    pages++;
  } while (cursor !== undefined && pages < 20);
  assert.ok(seen.size > 0 && cursor === undefined);

  const tweetId = [...seen][0]!;
  const tweet = (await perch.request(`/v1/tweets/${tweetId}`)).json();
  assert.equal(tweet.data.id_str, tweetId);
  assert.equal(tweet.data.user.id_str, user.id);
  const replies = (await perch.request(`/v1/users/${user.id}/replies`)).json();
  assert.equal(replies.meta.result_count, replies.data.length);
  const following = (await perch.request(`/v1/users/${user.id}/following?count=3`)).json();
  assert.ok(following.data.users.length <= 3);
  assert.equal(typeof following.data.users[0].result.legacy.screen_name, 'string');

  const missing = await perch.request('/v1/users/4041/following');
  assert.deepEqual([missing.status, missing.json().error.message], [404, 'User not found']);
  const badCursor = await perch.request(`/v1/users/${user.id}/tweets?cursor=garbage`);
  assert.deepEqual([badCursor.status, badCursor.json().error.code], [400, 'E400']);
});
