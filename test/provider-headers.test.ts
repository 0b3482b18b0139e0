import assert from 'node:assert/strict';
import { test } from 'node:test';
import { providerLimit } from '../src/upstream/provider-limit.js';
import { rateLimitUntil } from '../src/upstream/retry-after.js';

const NOW = Date.UTC(2026, 0, 1, 12, 0, 0);

test('rateLimitUntil: Retry-After seconds, HTTP date, x-rate-limit-reset, then the default', { timeout: 5000 }, () => {
  assert.equal(rateLimitUntil('30', undefined, NOW, 60), NOW + 30_000);
  assert.equal(rateLimitUntil(new Date(NOW + 45_000).toUTCString(), undefined, NOW, 60), NOW + 45_000);
  assert.equal(rateLimitUntil(undefined, String(NOW / 1000 + 120), NOW, 60), NOW + 120_000);
  assert.equal(rateLimitUntil('soon', 'later', NOW, 60), NOW + 60_000);
  // Retry-After wins over the reset when both are there.
  assert.equal(rateLimitUntil('5', String(NOW / 1000 + 120), NOW, 60), NOW + 5_000);
});

test('rateLimitUntil: at least one second and at most a day ahead', { timeout: 5000 }, () => {
  assert.equal(rateLimitUntil('0', undefined, NOW, 60), NOW + 1000);
  assert.equal(rateLimitUntil(undefined, String(NOW / 1000 - 50), NOW, 60), NOW + 1000);
  assert.equal(rateLimitUntil('86401', undefined, NOW, 60), NOW + 86_400_000);
  assert.equal(rateLimitUntil('9999999999', undefined, NOW, 60), NOW + 86_400_000);
});

test("providerLimit reads X's headers, the IETF structured field and the older IETF pair", { timeout: 5000 }, () => {
  assert.deepEqual(providerLimit({ 'x-rate-limit-remaining': '0', 'x-rate-limit-reset': String(NOW / 1000 + 900) }, NOW), {
    remaining: 0,
    resetAtMs: NOW + 900_000,
  });
  assert.deepEqual(providerLimit({ ratelimit: '"default";r=3;t=42' }, NOW), { remaining: 3, resetAtMs: NOW + 42_000 });
  assert.deepEqual(providerLimit({ 'ratelimit-remaining': '7', 'ratelimit-reset': '10' }, NOW), { remaining: 7, resetAtMs: NOW + 10_000 });
  assert.equal(providerLimit({ 'x-rate-limit-remaining': '3' }, NOW), undefined);
  assert.equal(providerLimit({ 'x-rate-limit-remaining': 'lots', 'x-rate-limit-reset': '1' }, NOW), undefined);
  assert.equal(providerLimit({}, NOW), undefined);
});
