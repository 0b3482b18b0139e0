import assert from 'node:assert/strict';
import { test } from 'node:test';
import { REFRESH_BACKOFF_FIRST_MS, REFRESH_BACKOFF_MAX_MS, RefreshBackoff } from '../src/cache/refresh-backoff.js';
import { ManualClock } from './helpers/clock.js';

test('the wait doubles per failure in a row from 5 s, is capped at 300 s, and an answer forgets it', { timeout: 5000 }, () => {
  assert.deepEqual([REFRESH_BACKOFF_FIRST_MS, REFRESH_BACKOFF_MAX_MS], [5000, 300_000]);
  const clock = new ManualClock();
  const backoff = new RefreshBackoff(clock);
  const waits: number[] = [];
  for (let i = 0; i < 9; i++) waits.push(backoff.failed('/k').untilMs - clock.now());
  assert.deepEqual(waits, [5000, 10_000, 20_000, 40_000, 80_000, 160_000, 300_000, 300_000, 300_000]);
  assert.equal(backoff.waiting('/k')?.failures, 9);
  clock.advance(299_999);
  assert.notEqual(backoff.waiting('/k'), undefined);
  clock.advance(1);
  assert.equal(backoff.waiting('/k'), undefined, 'the wait is over');
  assert.equal(backoff.tracks('/k'), true, 'its failures still count');
  assert.equal(backoff.failed('/k').failures, 10);
  backoff.succeeded('/k');
  assert.equal(backoff.tracks('/k'), false);
  assert.equal(backoff.failed('/k').untilMs - clock.now(), 5000);
});

test('a key is forgotten once 300 s have passed after its wait ends; a permanent answer is kept with the record', { timeout: 5000 }, () => {
  const clock = new ManualClock();
  const backoff = new RefreshBackoff(clock);
  const answer = { status: 400, body: Buffer.from('{}') };
  backoff.failed('/k', answer);
  assert.equal(backoff.waiting('/k')?.answer, answer);
  clock.advance(5000 + 300_000);
  assert.equal(backoff.tracks('/k'), true);
  clock.advance(1);
  assert.equal(backoff.tracks('/k'), false);
  assert.equal(backoff.failed('/k').failures, 1, 'starts over');
});
