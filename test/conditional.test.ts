import assert from 'node:assert/strict';
import { test } from 'node:test';
import fc from 'fast-check';
import { FORMATTED_MAX, formattedDatesHeld, httpDate, notModified } from '../src/server/conditional.js';

const TAG = '"abc"';
const MODIFIED = Date.UTC(2026, 0, 1, 12, 0, 0, 750);

test('If-None-Match: the tag, by weak comparison, in a list, or *; anything else is modified', () => {
  for (const header of ['"abc"', 'W/"abc"', '"x", "abc"', '"a,b", W/"abc"', ' "x" ,"abc" ', '*', ' * ']) {
    assert.equal(notModified(header, undefined, TAG, MODIFIED), true, header);
  }
  for (const header of ['"abcd"', 'abc', '"ABC"', '""', '', 'W/', '"abc', '"x" junk "abc"', '"abc-gzip"']) {
    assert.equal(notModified(header, undefined, TAG, MODIFIED), false, header);
  }
});

test('If-Modified-Since: whole seconds, no earlier than Last-Modified; ignored when malformed or when If-None-Match is sent', () => {
  const at = (ms: number) => new Date(ms).toUTCString();
  assert.equal(notModified(undefined, at(MODIFIED), TAG, MODIFIED), true, 'the Last-Modified value itself (750 ms are dropped)');
  assert.equal(notModified(undefined, at(MODIFIED + 1000), TAG, MODIFIED), true);
  assert.equal(notModified(undefined, at(MODIFIED - 1000), TAG, MODIFIED), false);
  assert.equal(notModified(undefined, 'Thursday, 01-Jan-26 12:00:00 GMT', TAG, MODIFIED), true, 'the obsolete RFC 850 form');
  // asctime carries no zone and means GMT: read in New York's, it would be five hours later.
  const zone = process.env.TZ;
  process.env.TZ = 'America/New_York';
  try {
    assert.equal(notModified(undefined, 'Thu Jan  1 12:00:00 2026', TAG, MODIFIED), true, 'asctime');
    assert.equal(notModified(undefined, 'Thu Jan  1 11:59:59 2026', TAG, MODIFIED), false, 'asctime');
  } finally {
    if (zone === undefined) delete process.env.TZ;
    else process.env.TZ = zone;
  }
  assert.equal(notModified(undefined, 'not a date', TAG, MODIFIED), false);
  for (const header of ['3000', '2027', 'x 2030', '1.5', 'Fri, 01 Jan 2026 12:00:00 GMT', 'Thu, 01 Jan 2026 24:00:00 GMT', 'Thursday, 01-Jan-2026 12:00:00 GMT', 'Thu Jan 01 12:00:00 26']) {
    assert.equal(notModified(undefined, header, TAG, MODIFIED), false, header);
  }
  // An rfc850 two-digit year more than 50 years ahead is the latest past year with those digits.
  const now = Date.UTC(2026, 5, 1);
  assert.equal(notModified(undefined, 'Wednesday, 01-Jan-76 12:00:00 GMT', TAG, Date.UTC(2076, 0, 1, 12), false, now), true, '76 is 2076, 50 years ahead');
  assert.equal(notModified(undefined, 'Saturday, 01-Jan-77 12:00:00 GMT', TAG, Date.UTC(1977, 0, 1, 12), false, now), true, '77 is 1977');
  assert.equal(notModified(undefined, undefined, TAG, MODIFIED), false);
  assert.equal(notModified('"other"', at(MODIFIED + 1000), TAG, MODIFIED), false, 'If-None-Match decides');
  assert.equal(notModified(TAG, at(MODIFIED - 1000), TAG, MODIFIED), true, 'If-None-Match decides');
});

test('an undated representation (no Last-Modified sent) matches no If-Modified-Since, only its tag', () => {
  const at = (ms: number) => new Date(ms).toUTCString();
  assert.equal(notModified(undefined, at(MODIFIED), TAG, MODIFIED, true), false);
  assert.equal(notModified(undefined, at(MODIFIED + 60_000), TAG, MODIFIED, true), false, 'no date, however late, names it');
  assert.equal(notModified(TAG, at(MODIFIED), TAG, MODIFIED, true), true, 'the tag does');
});

test('Last-Modified is an IMF-fixdate', () => {
  assert.equal(httpDate(MODIFIED), 'Thu, 01 Jan 2026 12:00:00 GMT');
  assert.equal(httpDate(MODIFIED + 249), 'Thu, 01 Jan 2026 12:00:00 GMT', 'whole seconds');
  assert.equal(httpDate(MODIFIED + 250), 'Thu, 01 Jan 2026 12:00:01 GMT', 'whole seconds');
});

test('Last-Modified from the formatted-date cache is what Date would write, for any time, before and after the cache fills', { timeout: 30_000 }, () => {
  // Times within a few hours, so seconds repeat (served from the cache) and the 4096-second
  // bound is crossed (the cache cleared and refilled) within one run.
  fc.assert(
    fc.property(fc.array(fc.integer({ min: MODIFIED - 10_000_000, max: MODIFIED + 10_000_000 }), { minLength: 1, maxLength: 200 }), (times) => {
      for (const ms of times) assert.equal(httpDate(ms), new Date(ms).toUTCString());
    }),
    { numRuns: 300 },
  );
});

test('the formatted-date cache holds at most its bound, whatever the traffic', () => {
  for (let second = 0; second < 3 * FORMATTED_MAX; second++) {
    httpDate(MODIFIED + second * 1000);
    assert.ok(formattedDatesHeld() <= FORMATTED_MAX, `${formattedDatesHeld()} held after ${second + 1} seconds`);
  }
});
