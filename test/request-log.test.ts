import assert from 'node:assert/strict';
import { test } from 'node:test';
import { captureLogs } from './helpers/log-capture.js';
import { startPerch, testConfig, v1 } from './helpers/perch.js';
import { sampleProvider, startUpstream } from './helpers/upstream-server.js';

test('one access line per request with the documented fields', async (t) => {
  const upstream = await startUpstream(t, sampleProvider);
  const perch = await startPerch(t, testConfig(v1('main', upstream.url)));
  await perch.request('/v1/users/1/tweets', { headers: { 'x-request-id': 'abc-123' } });
  await perch.request('/v1/users/1/tweets');
  const [miss, hit, ...rest] = perch.logs.lines().filter((l) => l.msg === 'request');
  assert.equal(rest.length, 0);
  assert.equal(miss!.req_id, 'abc-123');
  assert.equal(miss!.method, 'GET');
  assert.equal(miss!.route, 'tweets');
  assert.equal(miss!.status, 200);
  assert.equal(miss!.cache, 'miss');
  assert.equal(miss!.upstream, 'main');
  assert.equal(typeof miss!.upstream_ms, 'number');
  assert.equal(typeof miss!.ms, 'number');
  assert.equal(miss!.key_id, 'alpha');
  assert.equal(miss!.upstream_call, true);
  assert.equal(hit!.cache, 'hit');
  assert.equal(hit!.upstream, null);
  assert.equal(hit!.upstream_ms, null);
  assert.equal(hit!.upstream_call, false);
  // Exactly these fields, in this order: a field added by mistake (a key fragment, say) fails here.
  const fields = ['level', 'time', 'service', 'req_id', 'method', 'path', 'route', 'status', 'cache', 'upstream', 'upstream_ms', 'upstream_call', 'batch', 'ms', 'key_id', 'remote', 'user_agent', 'trace_id', 'span_id', 'msg'];
  assert.deepEqual(Object.keys(miss!), fields);
  assert.deepEqual(Object.keys(hit!), fields);
});

test('a valid X-Request-Id is echoed; an invalid or missing one is replaced by a UUID', async (t) => {
  const upstream = await startUpstream(t, sampleProvider);
  const perch = await startPerch(t, testConfig(v1('main', upstream.url)));
  const echoed = await perch.request('/v1/users/1', { headers: { 'x-request-id': 'req.42:a_b-c' } });
  assert.equal(echoed.headers.get('x-request-id'), 'req.42:a_b-c');
  const uuid = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;
  const variants: Record<string, string>[] = [{}, { 'x-request-id': 'has space' }, { 'x-request-id': 'x'.repeat(129) }];
  for (const headers of variants) {
    const res = await perch.request('/v1/users/1', { headers });
    assert.match(res.headers.get('x-request-id')!, uuid);
  }
  const unauthorized = await perch.request('/v1/users/1', { key: null, headers: { 'x-request-id': 'r-401' } });
  assert.equal(unauthorized.headers.get('x-request-id'), 'r-401');
});

test('rejected requests on a known route log that route; unknown routes log none', async (t) => {
  const upstream = await startUpstream(t, sampleProvider);
  const perch = await startPerch(t, testConfig(v1('main', upstream.url)));
  await perch.request('/v1/users/1/following?count=0');
  await perch.request('/v1/tweets/1', { method: 'DELETE' });
  await perch.request('/v1/nowhere');
  const lines = perch.logs.lines().filter((l) => l.msg === 'request');
  assert.deepEqual(lines.map((l) => [l.status, l.route]), [[400, 'following'], [405, 'tweet'], [404, null]]);
});

test('the access line carries the path without a cursor value, remote address and user agent, bounded in length', { timeout: 10_000 }, async (t) => {
  const upstream = await startUpstream(t, sampleProvider);
  const perch = await startPerch(t, testConfig(v1('main', upstream.url)));
  const cursor = 'c'.repeat(900);
  await perch.request(`/v1/users/1/following?count=5&cursor=${cursor}`, { headers: { 'user-agent': 'tweepy/4.14' } });
  await perch.request(`/v1/users/1?junk=${'j'.repeat(2000)}`, { headers: { 'user-agent': 'u'.repeat(1000) } });
  await perch.request('/v1/users/1', { key: null });
  const [listing, long, unauthorized] = perch.logs.lines().filter((l) => l.msg === 'request');
  assert.equal(listing!.path, '/v1/users/1/following?count=5&cursor=-');
  assert.equal(listing!.user_agent, 'tweepy/4.14');
  assert.equal(listing!.remote, '127.0.0.1');
  assert.equal(listing!.method, 'GET');
  assert.equal(String(long!.path).length, 259);
  assert.match(String(long!.path), /^\/v1\/users\/1\?junk=j+\.\.\.$/);
  assert.equal(String(long!.user_agent).length, 259);
  assert.deepEqual([unauthorized!.path, unauthorized!.status, unauthorized!.key_id], ['/v1/users/1', 401, null]);
  assert.ok(!perch.logs.text().includes(cursor));
});

test('log.time iso and log.level_format label write pino ISO-8601 times and level names; the defaults are numbers', { timeout: 10_000 }, () => {
  const readable = captureLogs('info', { time: 'iso', level_format: 'label' });
  readable.logger.warn('hello');
  const [line] = readable.lines();
  assert.equal(line!.level, 'warn');
  assert.match(String(line!.time), /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/);
  const plain = captureLogs();
  plain.logger.warn('hello');
  const [number] = plain.lines();
  assert.equal(number!.level, 40);
  assert.equal(typeof number!.time, 'number');
});
