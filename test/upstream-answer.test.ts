import assert from 'node:assert/strict';
import { test } from 'node:test';
import { INVALID } from '../src/endpoints.js';
import { answerFor } from '../src/upstream/answer.js';
import type { RefusalReason, UpstreamResult } from '../src/upstream/upstream.js';

const NOW = 1_700_000_000_000;

/** The answer as the client would see it: status, parsed body, Retry-After and what the cache keeps. */
function seen(endpoint: Parameters<typeof answerFor>[0], result: UpstreamResult, passThrough = false) {
  const answer = answerFor(endpoint, result, NOW, passThrough);
  return { status: answer.status, body: JSON.parse(answer.body.toString()), retryAfter: answer.retryAfterSeconds, ttl: answer.ttl };
}

const error = (code: string, message: string) => ({ error: { code, message } });

test('a 200 is the provider bytes, kept for the endpoint TTL; a 404 names the missing user or tweet', () => {
  const body = Buffer.from('{"id":"1"}');
  const ok = answerFor('user', { kind: 'ok', body }, NOW, false);
  assert.equal(ok.body, body, 'the same bytes, not a copy');
  assert.deepEqual([ok.status, ok.ttl, ok.retryAfterSeconds], [200, 'endpoint', undefined]);
  assert.deepEqual(seen('tweets', { kind: 'not_found' }), { status: 404, body: error('E404', 'User not found'), retryAfter: undefined, ttl: 'not_found' });
  assert.deepEqual(seen('tweet', { kind: 'not_found' }), { status: 404, body: error('E404', 'Tweet not found'), retryAfter: undefined, ttl: 'not_found' });
});

test('an upstream 429 is 429 E429 with Retry-After in whole seconds to the stop, rounded up', () => {
  const result: UpstreamResult = { kind: 'rate_limited', cause: 'status_429', retryAfterSeconds: 9, untilMs: NOW + 4_001 };
  assert.deepEqual(seen('user', result), { status: 429, body: error('E429', 'Rate limit exceeded. Please try again later.'), retryAfter: 5, ttl: undefined });
});

test('refusals that are a wait are 429 with their Retry-After; a miss out of time 504; the others are 502', () => {
  const wait: RefusalReason[] = ['cooling_down', 'usage_capped', 'over_cap', 'budget_spent'];
  const broken: RefusalReason[] = ['breaker_open', 'throttled', 'no_credential'];
  for (const reason of wait) assert.deepEqual([reason, seen('user', { kind: 'refused', reason, retryAfterSeconds: 7 }).status, seen('user', { kind: 'refused', reason, retryAfterSeconds: 7 }).retryAfter], [reason, 429, 7]);
  for (const reason of broken) assert.deepEqual(seen('user', { kind: 'refused', reason, retryAfterSeconds: 7 }), { status: 502, body: error('E502', 'Upstream error'), retryAfter: undefined, ttl: undefined });
  assert.deepEqual(seen('user', { kind: 'refused', reason: 'no_time', retryAfterSeconds: 1 }), { status: 504, body: error('E504', 'Upstream timeout'), retryAfter: undefined, ttl: undefined });
});

test('a rejected credential is 502 for perch\'s own and 401 for a pass-through key; a timeout is 504; a bad cursor 400', () => {
  const unauthorized: UpstreamResult = { kind: 'failed', failure: 'unauthorized', reason: 'status 401', status: 401 };
  assert.deepEqual(seen('user', unauthorized).body, error('E502', 'Upstream error'));
  assert.deepEqual(seen('user', unauthorized, true), { status: 401, body: error('E401', 'Invalid API key'), retryAfter: undefined, ttl: undefined });
  assert.equal(seen('user', { kind: 'failed', failure: 'status_5xx', reason: 'status 500', status: 500 }, true).status, 502);
  assert.deepEqual(seen('user', { kind: 'timeout', reason: 'headers' }), { status: 504, body: error('E504', 'Upstream timeout'), retryAfter: undefined, ttl: undefined });
  assert.deepEqual(seen('replies', { kind: 'bad_request', reason: 'status 400' }), { status: 400, body: error('E400', INVALID.cursor), retryAfter: undefined, ttl: undefined });
});
