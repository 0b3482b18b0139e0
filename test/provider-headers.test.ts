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

test('rateLimitUntil: only delay-seconds and IMF-fixdate are a Retry-After; anything else yields to x-rate-limit-reset', { timeout: 5000 }, () => {
  const reset = String(NOW / 1000 + 120);
  // Each of these Date.parse reads as a date, and each was a 1 s stop hiding the reset beside it.
  for (const lenient of ['1.5', '-1', '+60', '2026-01-01', 'Thursday, 01-Jan-26 12:00:45 GMT', 'Thu Jan  1 12:00:45 2026', '1 Jan 2026 12:00:45 GMT']) {
    assert.equal(rateLimitUntil(lenient, reset, NOW, 60), NOW + 120_000, lenient);
  }
  // Well-formed but not a real instant: a 31st of February, a 24th hour, the wrong weekday.
  for (const impossible of ['Sat, 31 Feb 2026 12:00:00 GMT', 'Thu, 01 Jan 2026 24:00:00 GMT', 'Fri, 01 Jan 2026 12:00:45 GMT']) {
    assert.equal(rateLimitUntil(impossible, reset, NOW, 60), NOW + 120_000, impossible);
  }
  assert.equal(rateLimitUntil('Thu, 01 Jan 2026 12:00:45 GMT', reset, NOW, 60), NOW + 45_000);
  assert.equal(rateLimitUntil(' 7 ', reset, NOW, 60), NOW + 7_000);
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
