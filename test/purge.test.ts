import assert from 'node:assert/strict';
import { test, type TestContext } from 'node:test';
import { ADMIN_KEY, ADMIN_YAML, outcome, purge } from './helpers/admin.js';
import { ManualClock } from './helpers/clock.js';
import { KEY, startPerch, testConfig, v1, waitFor, type RunningPerch } from './helpers/perch.js';
import { sampleProvider, startUpstream, type UpstreamBehaviour } from './helpers/upstream-server.js';

const e = (code: string, message: string) => ({ error: { message, code } });

async function setup(t: TestContext, behaviour: UpstreamBehaviour = sampleProvider, extra = ADMIN_YAML) {
  const upstream = await startUpstream(t, behaviour);
  const perch = await startPerch(t, testConfig(v1('main', upstream.url), extra), { clock: new ManualClock() });
  return { upstream, perch };
}

async function outcomes(perch: RunningPerch, paths: readonly string[]): Promise<Record<string, string>> {
  const result: Record<string, string> = {};
  for (const path of paths) result[path] = await outcome(perch, path);
  return result;
}

test('without an admin section, /admin/purge is an unknown route: 401 without a key, 404 with one', async (t) => {
  const { perch } = await setup(t, sampleProvider, '');
  assert.equal((await purge(perch, { all: true }, { key: null })).status, 401);
  assert.equal((await purge(perch, { all: true }, { key: ADMIN_KEY })).status, 401);
  const res = await purge(perch, { all: true }, { key: KEY });
  assert.equal(res.status, 404);
  assert.deepEqual(res.json(), e('E404', 'Not found'));
});

test('only an admin key opens /admin/purge, and an admin key opens nothing on /v1', async (t) => {
  const { perch, upstream } = await setup(t);
  for (const key of [null, '', KEY, 'admin-key-charlie-012345678', `${ADMIN_KEY}, ${ADMIN_KEY}`]) {
    const res = await purge(perch, { all: true }, { key });
    assert.equal(res.status, 401, String(key));
    assert.deepEqual(res.json(), e('E401', 'Invalid API key'));
  }
  assert.equal((await perch.request('/v1/users/1', { key: ADMIN_KEY })).status, 401);
  assert.equal(upstream.requests.length, 0);
  // Refusals are logged without the secret.
  assert.ok(!perch.logs.text().includes(ADMIN_KEY));
});

test('methods other than POST are 405 E405 with Allow: POST, after the key check', async (t) => {
  const { perch } = await setup(t);
  for (const method of ['GET', 'PUT', 'DELETE', 'PATCH']) {
    const res = await purge(perch, { all: true }, { method });
    assert.equal(res.status, 405, method);
    assert.equal(res.headers.get('allow'), 'POST');
    assert.deepEqual(res.json(), e('E405', 'Method not allowed'));
  }
  assert.equal((await purge(perch, {}, { method: 'HEAD' })).status, 405);
  assert.equal((await purge(perch, {}, { method: 'GET', key: null })).status, 401);
});

test('every malformed purge is 400 E400 naming the problem', async (t) => {
  const { perch } = await setup(t);
  const endpoints = 'user, user_by_username, tweets, replies, following, tweet';
  const cases: [unknown, string, string | null | undefined][] = [
    ['{"all":', 'Invalid request: the body must be JSON', undefined],
    ['', 'Invalid request: the body must be JSON', undefined],
    [[1], 'Invalid request: the body must be a JSON object', undefined],
    ['"all"', 'Invalid request: the body must be a JSON object', undefined],
    [{}, 'Invalid request: the body needs endpoint and its parameter, or all', undefined],
    [{ all: false }, 'Invalid parameter: all must be true', undefined],
    [{ all: 'true' }, 'Invalid parameter: all must be true', undefined],
    [{ all: true, endpoint: 'user' }, 'Invalid parameter: unknown key "endpoint" (all takes no other key)', undefined],
    [{ endpoint: 'users', user_id: '1' }, `Invalid parameter: endpoint must be one of ${endpoints}`, undefined],
    [{ endpoint: 7 }, `Invalid parameter: endpoint must be one of ${endpoints}`, undefined],
    [{ endpoint: 'tweets' }, 'Invalid parameter: user_id is required for endpoint tweets', undefined],
    [{ endpoint: 'tweet', user_id: '1' }, 'Invalid parameter: unknown key "user_id" (tweet takes tweet_id)', undefined],
    [{ endpoint: 'user', user_id: '1', cursor: 'a' }, 'Invalid parameter: unknown key "cursor" (user takes user_id)', undefined],
    [{ endpoint: 'user', user_id: '1x' }, 'Invalid parameter: user_id must be 1-20 decimal digits', undefined],
    [{ endpoint: 'tweets', user_id: 1 }, 'Invalid parameter: user_id must be 1-20 decimal digits', undefined],
    [{ endpoint: 'tweet', tweet_id: '1'.repeat(21) }, 'Invalid parameter: tweet_id must be 1-20 decimal digits', undefined],
    [{ endpoint: 'user_by_username', username: 'a-b' }, 'Invalid parameter: username must be 1-50 letters, digits or underscores', undefined],
    [{ all: true }, 'Invalid request: Content-Type must be application/json', 'text/plain'],
    [{ all: true }, 'Invalid request: Content-Type must be application/json', null],
    [{ all: true, pad: 'x'.repeat(4096) }, 'Invalid request: the body must be at most 4096 bytes', undefined],
  ];
  for (const [body, message, contentType] of cases) {
    const res = await purge(perch, body, { contentType });
    assert.equal(res.status, 400, JSON.stringify(body));
    assert.deepEqual(res.json(), e('E400', message), JSON.stringify(body));
  }
});

test('an oversized body without Content-Length (chunked) is 400 too, and the connection stays usable', async (t) => {
  const { perch } = await setup(t);
  const chunk = new TextEncoder().encode(`{"all":true,"pad":"${'x'.repeat(3000)}`);
  const body = new ReadableStream({
    start(controller) {
      controller.enqueue(chunk);
      controller.enqueue(chunk);
      controller.enqueue(new TextEncoder().encode('"}'));
      controller.close();
    },
  });
  const headers = { 'x-api-key': ADMIN_KEY, 'content-type': 'application/json' };
  const res = await fetch(`${perch.url}/admin/purge`, { method: 'POST', headers, body, duplex: 'half' } as RequestInit);
  assert.equal(res.status, 400);
  assert.deepEqual(await res.json(), e('E400', 'Invalid request: the body must be at most 4096 bytes'));
  assert.equal((await purge(perch, { all: true })).status, 200);
});

test('memory-only purges drop exactly their scope: every cursor and count of it, nothing else', async (t) => {
  const { perch, upstream } = await setup(t);
  const paths = [
    '/v1/users/1',
    '/v1/users/12',
    '/v1/users/1/tweets',
    '/v1/users/1/tweets?cursor=abc',
    '/v1/users/12/tweets',
    '/v1/users/1/replies',
    '/v1/users/1/following?count=5',
    '/v1/users/1/following?count=20&cursor=c',
    '/v1/users/by/username/bob',
    '/v1/tweets/1',
  ];
  for (const path of paths) assert.equal(await outcome(perch, path), 'miss', path);

  const res = await purge(perch, { endpoint: 'user', user_id: '1' });
  assert.equal(res.status, 200);
  assert.deepEqual(res.json(), { purged: { endpoint: 'user', user_id: '1' } });
  assert.equal(res.headers.get('cache-control'), 'no-store');
  const misses = (expected: string[]) => Object.fromEntries(paths.map((path) => [path, expected.includes(path) ? 'miss' : 'memory']));
  assert.deepEqual(await outcomes(perch, paths), misses(['/v1/users/1']));

  await purge(perch, { endpoint: 'tweets', user_id: '1' });
  await purge(perch, { endpoint: 'following', user_id: '1' });
  assert.deepEqual(
    await outcomes(perch, paths),
    misses(['/v1/users/1/tweets', '/v1/users/1/tweets?cursor=abc', '/v1/users/1/following?count=5', '/v1/users/1/following?count=20&cursor=c']),
  );

  const byName = await purge(perch, { endpoint: 'user_by_username', username: 'BoB' });
  assert.deepEqual(byName.json(), { purged: { endpoint: 'user_by_username', username: 'bob' } });
  await purge(perch, { endpoint: 'tweet', tweet_id: '1' });
  assert.deepEqual(await outcomes(perch, paths), misses(['/v1/users/by/username/bob', '/v1/tweets/1']));

  assert.deepEqual((await purge(perch, { all: true })).json(), { purged: { all: true } });
  assert.deepEqual(await outcomes(perch, paths), misses(paths));
  assert.equal(upstream.requests.length, paths.length * 2 + 7);

  const metrics = await (await fetch(`${perch.url}/metrics`)).text();
  for (const [scope, count] of [['user', 1], ['tweets', 1], ['following', 1], ['user_by_username', 1], ['tweet', 1], ['all', 1]]) {
    assert.match(metrics, new RegExp(`^perch_purges_total\\{scope="${scope}"\\} ${count}$`, 'm'), String(scope));
  }
  const lines = perch.logs.lines().filter((l) => l.msg === 'admin purge');
  assert.equal(lines.length, 6);
  assert.deepEqual(lines[0]!.scope, { endpoint: 'user', user_id: '1' });
  assert.equal(lines[0]!.key_id, 'ops');
});

test('a response fetched while its scope was purged is answered but not stored', async (t) => {
  let release!: () => void;
  const gate = new Promise<void>((resolve) => (release = resolve));
  const { perch, upstream } = await setup(t, (req, res) => void gate.then(() => sampleProvider(req, res)));
  const pending = perch.request('/v1/users/5/tweets');
  await waitFor(() => upstream.requests.length === 1);
  assert.equal((await purge(perch, { endpoint: 'tweets', user_id: '5' })).status, 200);
  release();
  const response = await pending;
  assert.equal(response.status, 200);
  assert.equal(response.headers.get('cache-status'), 'perch; fwd=miss');
  assert.equal(await outcome(perch, '/v1/users/5/tweets'), 'miss');
  assert.equal(await outcome(perch, '/v1/users/5/tweets'), 'memory');
});
