import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { test, type TestContext } from 'node:test';
import { ADMIN_KEY, ADMIN_YAML, purge } from './helpers/admin.js';
import { ManualClock } from './helpers/clock.js';
import { freePort } from './helpers/perch-process.js';
import { KEY, metric, startPerch, testConfig, v1 } from './helpers/perch.js';
import { startRedis } from './helpers/redis-server.js';
import { json, sampleProvider, startUpstream, type TestUpstream } from './helpers/upstream-server.js';
import { answerAppOnlyWhoAmI, xFixtureText } from './helpers/x-v2-fixtures.js';

/** The one bearer token the fake X accepts. */
const X_TOKEN = 'AAAAAAAAAAAAAAAAAAAAAGoodXToken%2Bperch';
const GOOD = 'ck-good-alpha-0123456789';

/** A fake X that serves one user to its one token, an app-only one, and answers 401 to any other. */
async function fakeX(t: TestContext): Promise<TestUpstream> {
  return startUpstream(t, (req: IncomingMessage, res: ServerResponse) => {
    if (req.headers.authorization !== `Bearer ${X_TOKEN}`) return json(401, { title: 'Unauthorized', type: 'about:blank', status: 401 })(req, res);
    if (answerAppOnlyWhoAmI(req, res)) return;
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(xFixtureText('user'));
  });
}

/** A v1 provider that serves its one good key and answers 401 to any other. */
function checking(req: IncomingMessage, res: ServerResponse): void {
  if (req.headers['x-api-key'] === GOOD) return sampleProvider(req, res);
  return json(401, { title: 'Unauthorized' })(req, res);
}

function passThroughYaml(kind: 'v1' | 'x_v2', url: string, auth = '', extra = ''): string {
  return `
server: { host: 127.0.0.1, port: 0 }
auth: { mode: upstream, default_plan: resale${auth} }
rate_limits: { resale: { capacity: 1000, refill_per_second: 1000 } }
upstreams: { main: { kind: ${kind}, url: "${url}", timeout_ms: 2000 } }
${extra}`;
}

/** A key nobody issued: 32 random hex digits. */
function madeUpKey(): string {
  return `made-up-${randomBytes(16).toString('hex')}`;
}

test('a made-up key that asks for an impossible id is 404 without a call, and stays unverified: it never reads the cache', { timeout: 20_000 }, async (t) => {
  const x = await fakeX(t);
  const clock = new ManualClock();
  const perch = await startPerch(t, passThroughYaml('x_v2', x.url), { clock, timers: clock });
  // A paying client fills the cache.
  assert.equal((await perch.request('/v1/users/2244994945', { key: X_TOKEN })).status, 200);
  assert.equal((await perch.request('/v1/users/2244994945', { key: X_TOKEN })).headers.get('cache-status')?.startsWith('perch; hit'), true);

  const made = 'made-up-key-0001';
  // No X id has 20 digits: answered by perch itself.
  const impossible = await perch.request('/v1/users/12345678901234567890', { key: made });
  assert.equal(impossible.status, 404);
  // Nor a username of 16 characters.
  assert.equal((await perch.request('/v1/users/by/username/sixteen_letters_', { key: made })).status, 404);
  // The paying client's key: who it speaks for (an app), then its lookup.
  assert.equal(x.requests.length, 2, 'no call for an id or a username X cannot have');
  // That answer accepted nothing: the made-up key's next request is the provider's to judge.
  const next = await perch.request('/v1/users/2244994945', { key: made });
  assert.deepEqual([next.status, next.headers.get('cache-status')], [401, 'perch; fwd=miss']);
  assert.deepEqual(
    x.requests.map((r) => [r.url.split('?')[0], r.headers.authorization]),
    [
      ['/2/users/me', `Bearer ${X_TOKEN}`],
      ['/2/users/2244994945', `Bearer ${X_TOKEN}`],
      ['/2/users/me', `Bearer ${made}`],
    ],
  );
  // And the provider's 401 is remembered: the key is refused at once, cache or not.
  assert.equal((await perch.request('/v1/users/2244994945', { key: made })).status, 401);
  assert.equal(x.requests.length, 3);
});

test(`a provider's own 404 for a key accepts it`, { timeout: 20_000 }, async (t) => {
  const missing = '999';
  const upstream = await startUpstream(t, (req, res) => {
    if (req.headers['x-api-key'] !== GOOD) return json(401, { title: 'Unauthorized' })(req, res);
    if (req.url === `/v1/users/${missing}`) return json(404, { title: 'Not Found' })(req, res);
    return sampleProvider(req, res);
  });
  const perch = await startPerch(t, passThroughYaml('v1', upstream.url));
  assert.equal((await perch.request('/v1/users/1', { key: KEY })).status, 401, 'the test key is not the provider\'s');
  // The good key's first request is a provider 404: that is the provider accepting the key.
  assert.equal((await perch.request(`/v1/users/${missing}`, { key: GOOD })).status, 404);
  assert.equal((await perch.request('/v1/users/2', { key: GOOD })).status, 200);
  assert.equal((await perch.request('/v1/users/2', { key: GOOD })).headers.get('cache-status')?.startsWith('perch; hit'), true);
  assert.equal(upstream.requests.length, 3);
});

test('made-up keys share one verification bound: 300 of them make verify_burst calls, the rest are 429, and an accepted key survives them', { timeout: 30_000 }, async (t) => {
  const upstream = await startUpstream(t, checking);
  const clock = new ManualClock();
  // One client address: no share of it apart (pass-through-attack.test.ts tests that).
  const perch = await startPerch(t, passThroughYaml('v1', upstream.url, ', verify_burst: 20, verify_rate_per_second: 2, verify_source_share: 1, remembered_keys: 10'), { clock, timers: clock });
  assert.equal((await perch.request('/v1/users/1', { key: GOOD })).status, 200);

  const answers = await Promise.all(Array.from({ length: 300 }, () => perch.request('/v1/users/1', { key: madeUpKey() })));
  const statuses = answers.map((a) => a.status);
  // The good key took one of the 20 turns.
  assert.equal(statuses.filter((s) => s === 401).length, 19);
  assert.equal(statuses.filter((s) => s === 429).length, 281);
  assert.equal(upstream.requests.length, 20);
  const refused = answers.find((a) => a.status === 429)!;
  assert.deepEqual([refused.headers.get('retry-after'), refused.json().error.code], ['1', 'E429']);

  // The flood's rejections are kept apart from acceptances: the good key is still a hit, no call.
  const again = await perch.request('/v1/users/1', { key: GOOD });
  assert.equal(again.headers.get('cache-status')?.startsWith('perch; hit'), true);
  assert.equal(upstream.requests.length, 20);
  assert.equal(await metric(perch, 'perch_pass_through_keys{verdict="accepted"}'), 1);
  assert.equal(await metric(perch, 'perch_pass_through_keys{verdict="rejected"}'), 10);

  // Half a second at 2 a second: one more key may be verified, and only one.
  clock.advance(500);
  const later = await Promise.all([perch.request('/v1/users/1', { key: madeUpKey() }), perch.request('/v1/users/1', { key: madeUpKey() })]);
  assert.deepEqual(later.map((a) => a.status).sort(), [401, 429]);
  assert.equal(upstream.requests.length, 21);
});

test('a flood of keys the provider rejects never pushes out an accepted key (remembered_keys each side)', { timeout: 30_000 }, async (t) => {
  const upstream = await startUpstream(t, checking);
  const perch = await startPerch(t, passThroughYaml('v1', upstream.url, ', verify_burst: 1000, remembered_keys: 5'));
  assert.equal((await perch.request('/v1/users/1', { key: GOOD })).status, 200);
  for (let i = 0; i < 50; i++) assert.equal((await perch.request('/v1/users/1', { key: madeUpKey() })).status, 401);
  assert.equal(upstream.requests.length, 51);
  const again = await perch.request('/v1/users/1', { key: GOOD });
  assert.equal(again.headers.get('cache-status')?.startsWith('perch; hit'), true);
  assert.equal(upstream.requests.length, 51);
});

test('two instances on one Redis share the verification bound: 300 made-up keys make at most verify_burst calls', { timeout: 30_000 }, async (t) => {
  const redis = await startRedis(t);
  const upstream = await startUpstream(t, checking);
  // A command timeout no loaded test machine reaches: this is the fleet with Redis answering.
  const yaml = passThroughYaml('v1', upstream.url, ', verify_burst: 20, verify_rate_per_second: 0.001', `rate_limits_redis: { url: "${redis.url}", command_timeout_ms: 10000 }`);
  const a = await startPerch(t, yaml);
  const b = await startPerch(t, yaml);
  const answers = await Promise.all(Array.from({ length: 300 }, (_, i) => (i % 2 === 0 ? a : b).request('/v1/users/1', { key: madeUpKey() })));
  const called = upstream.requests.length;
  assert.ok(called <= 20 && called > 0, `${called} calls`);
  assert.equal(answers.filter((r) => r.status === 401).length, called);
  assert.equal(answers.filter((r) => r.status === 429).length, 300 - called);
});

test('ids are canonical: /v1/users/0N and /v1/users/N are one entry and one provider call, and one purge target', { timeout: 20_000 }, async (t) => {
  const upstream = await startUpstream(t, sampleProvider);
  const perch = await startPerch(t, testConfig(v1('main', upstream.url), ADMIN_YAML));
  assert.equal((await perch.request('/v1/users/02244994946')).status, 200);
  assert.equal((await perch.request('/v1/users/002244994946')).headers.get('cache-status')?.startsWith('perch; hit'), true);
  assert.equal((await perch.request('/v1/users/2244994946')).headers.get('cache-status')?.startsWith('perch; hit'), true);
  assert.equal((await perch.request('/v1/users/0002244994946/tweets')).status, 200);
  assert.equal((await perch.request('/v1/users/2244994946/tweets')).headers.get('cache-status')?.startsWith('perch; hit'), true);
  assert.equal((await perch.request('/v1/tweets/0020')).status, 200);
  assert.equal((await perch.request('/v1/tweets/0')).status, 200);
  assert.equal((await perch.request('/v1/tweets/000')).headers.get('cache-status')?.startsWith('perch; hit'), true);
  assert.deepEqual(
    upstream.requests.map((r) => r.url),
    ['/v1/users/2244994946', '/v1/users/2244994946/tweets', '/v1/tweets/20', '/v1/tweets/0'],
  );
  const purged = await purge(perch, { endpoint: 'user', user_id: '0002244994946' }, { key: ADMIN_KEY });
  assert.equal(purged.status, 200);
  assert.deepEqual(purged.json().purged, { endpoint: 'user', user_id: '2244994946' });
  assert.equal((await perch.request('/v1/users/2244994946')).headers.get('cache-status')?.startsWith('perch; fwd=miss'), true);
});

test('metrics.require_admin: the exposition answers an admin key (bearer or X-API-Key) only, on the API port and on metrics.port', { timeout: 20_000 }, async (t) => {
  const upstream = await startUpstream(t, sampleProvider);
  const perch = await startPerch(t, testConfig(v1('main', upstream.url), `${ADMIN_YAML}\nmetrics: { require_admin: true }`));
  const scrape = (headers: Record<string, string>) => fetch(`${perch.url}/metrics`, { headers });
  const none = await scrape({});
  assert.deepEqual([none.status, await none.text()], [401, '{"error":{"message":"Invalid API key","code":"E401"}}']);
  assert.equal((await scrape({ 'x-api-key': KEY })).status, 401, 'a client key is not an admin key');
  assert.equal((await scrape({ authorization: `Bearer ${KEY}` })).status, 401);
  const bearer = await scrape({ authorization: `Bearer ${ADMIN_KEY}` });
  assert.equal(bearer.status, 200);
  assert.match(await bearer.text(), /perch_requests_total/);
  assert.equal((await scrape({ 'x-api-key': ADMIN_KEY })).status, 200);

  // On a listener of its own, the same.
  const port = await freePort();
  const own = await startPerch(t, testConfig(v1('main', upstream.url), `${ADMIN_YAML}\nmetrics: { port: ${port}, require_admin: true }`));
  assert.equal((await fetch(`http://127.0.0.1:${port}/metrics`)).status, 401);
  assert.equal((await fetch(`http://127.0.0.1:${port}/metrics`, { headers: { authorization: `bearer ${ADMIN_KEY}` } })).status, 200);
  assert.equal((await own.request('/metrics')).status, 404, 'not on the API listener');
});

test('metrics.require_admin needs an admin section', { timeout: 5000 }, async (t) => {
  await assert.rejects(startPerch(t, testConfig('main: { kind: fixture }', 'metrics: { require_admin: true }')), /metrics.require_admin: needs an admin section/);
});
