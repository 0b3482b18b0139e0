import assert from 'node:assert/strict';
import { test } from 'node:test';
import { httpDate, notModified } from '../src/server/conditional.js';

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
  assert.equal(notModified(undefined, undefined, TAG, MODIFIED), false);
  assert.equal(notModified('"other"', at(MODIFIED + 1000), TAG, MODIFIED), false, 'If-None-Match decides');
  assert.equal(notModified(TAG, at(MODIFIED - 1000), TAG, MODIFIED), true, 'If-None-Match decides');
});

test('Last-Modified is an IMF-fixdate', () => {
  assert.equal(httpDate(MODIFIED), 'Thu, 01 Jan 2026 12:00:00 GMT');
});
