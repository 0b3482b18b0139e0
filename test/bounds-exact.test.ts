import assert from 'node:assert/strict';
import { test } from 'node:test';
import { ConfigError, parseConfig } from '../src/config/load.js';
import { ADMIN_YAML, purge } from './helpers/admin.js';
import { startPerch, testConfig, v1 } from './helpers/perch.js';
import { sampleProvider, startUpstream } from './helpers/upstream-server.js';

// Each bound on both sides of its edge: a test that only probes far outside a bound lets an
// off-by-one (or a check removed outright) survive.
const T = { timeout: 20_000 };

function problems(extra: string): readonly string[] {
  try {
    parseConfig(testConfig('demo: { kind: fixture }', extra), {});
  } catch (error) {
    assert.ok(error instanceof ConfigError);
    return error.problems;
  }
  return [];
}

test('unknown keys under cache are configuration errors, at every level', T, () => {
  assert.deepEqual(problems('cache: { memroy: { max_bytes: 2097152 } }'), ['cache.memroy: unknown key (did you mean "memory"?)']);
  assert.deepEqual(problems('cache: { stale: 10 }'), ['cache.stale: unknown key (did you mean "stale_seconds"?)']);
  assert.deepEqual(problems('cache: { memory: { max_bytes: 2097152, entries: 10 } }'), ['cache.memory.entries: unknown key']);
  assert.deepEqual(problems('cache: { memory: { max_bytes: 2097152 }, ttl_seconds: { user: 1 }, stale_seconds: 0 }'), []);
});

test('a cursor of exactly 1024 bytes is forwarded; 1025 is 400', T, async (t) => {
  const upstream = await startUpstream(t, sampleProvider);
  const perch = await startPerch(t, testConfig(v1('main', upstream.url)));
  const ascii = 'c'.repeat(1024);
  assert.equal((await perch.request(`/v1/users/1/tweets?cursor=${ascii}`)).status, 200);
  // 512 two-byte characters: the bound is in bytes after decoding, not characters.
  const twoByte = '%C3%A9'.repeat(512);
  assert.equal((await perch.request(`/v1/users/1/replies?cursor=${twoByte}`)).status, 200);
  assert.deepEqual(
    upstream.requests.map((r) => r.url),
    [`/v1/users/1/tweets?cursor=${ascii}`, `/v1/users/1/replies?cursor=${twoByte}`],
  );
  assert.equal((await perch.request(`/v1/users/1/tweets?cursor=${ascii}c`)).status, 400);
  assert.equal((await perch.request(`/v1/users/1/replies?cursor=${twoByte}c`)).status, 400);
  assert.equal(upstream.requests.length, 2);
});

test('count takes exactly 1 to 100', T, async (t) => {
  const upstream = await startUpstream(t, sampleProvider);
  const perch = await startPerch(t, testConfig(v1('main', upstream.url)));
  for (const count of ['1', '100', '001', '099']) {
    assert.equal((await perch.request(`/v1/users/1/following?count=${count}`)).status, 200, count);
  }
  for (const count of ['0', '101', '1000', '-1', '1.0', '', '+5', ' 5']) {
    assert.equal((await perch.request(`/v1/users/1/following?count=${encodeURIComponent(count)}`)).status, 400, JSON.stringify(count));
  }
  assert.deepEqual(
    upstream.requests.map((r) => r.url),
    // 001 is count 1 again: the same upstream request, so a cache hit.
    ['/v1/users/1/following?count=1', '/v1/users/1/following?count=100', '/v1/users/1/following?count=99'],
  );
});

test('a purge body of exactly 4096 bytes is read; 4097 is 400', T, async (t) => {
  const perch = await startPerch(t, testConfig('demo: { kind: fixture }', ADMIN_YAML));
  const body = (bytes: number) => {
    const shell = JSON.stringify({ all: true, pad: '' });
    return shell.replace('"pad":""', `"pad":"${'x'.repeat(bytes - shell.length)}"`);
  };
  // The pad is an unknown key, so a body that is read is refused for that, not for its size.
  const read = await purge(perch, body(4096));
  assert.equal(read.status, 400);
  assert.equal(read.json().error.message, 'Invalid parameter: unknown key "pad" (all takes no other key)');
  const tooLarge = await purge(perch, body(4097));
  assert.equal(tooLarge.json().error.message, 'Invalid request: the body must be at most 4096 bytes');
});

test('an X-Request-Id of 128 characters is echoed; 129 is replaced', T, async (t) => {
  const perch = await startPerch(t, testConfig('demo: { kind: fixture }'));
  const longest = 'r'.repeat(128);
  assert.equal((await perch.request('/v1/users/1', { headers: { 'x-request-id': longest } })).headers.get('x-request-id'), longest);
  assert.notEqual((await perch.request('/v1/users/1', { headers: { 'x-request-id': `${longest}r` } })).headers.get('x-request-id'), `${longest}r`);
});
