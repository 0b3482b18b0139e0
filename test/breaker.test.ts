import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Breaker } from '../src/redis/breaker.js';
import { ManualClock } from './helpers/clock.js';
import { captureLogs } from './helpers/log-capture.js';

function setup() {
  const clock = new ManualClock();
  const logs = captureLogs();
  const breaker = new Breaker({ clock, logger: logs.logger, name: 'redis cache', threshold: 3, coolDownMs: 2000 });
  const stateLines = () => logs.lines().filter((l) => String(l.msg).startsWith('circuit breaker'));
  return { clock, breaker, stateLines };
}

test('opens after N consecutive failures; a success in between resets the count', () => {
  const { breaker, stateLines } = setup();
  breaker.failure();
  breaker.failure();
  breaker.success();
  breaker.failure();
  breaker.failure();
  assert.equal(breaker.state, 'closed');
  breaker.failure();
  assert.equal(breaker.state, 'open');
  assert.equal(breaker.allow(), false);
  assert.deepEqual(stateLines().map((l) => [l.level, l.msg]), [[40, 'circuit breaker open: skipping dependency']]);
});

test('after the cool-down exactly one probe goes through; its success closes the breaker', () => {
  const { clock, breaker, stateLines } = setup();
  for (let i = 0; i < 3; i++) breaker.failure();
  clock.advance(1999);
  assert.equal(breaker.allow(), false);
  clock.advance(1);
  assert.equal(breaker.allow(), true);
  assert.equal(breaker.state, 'half_open');
  assert.equal(breaker.allow(), false, 'only one probe at a time');
  breaker.success();
  assert.equal(breaker.state, 'closed');
  assert.equal(breaker.allow(), true);
  assert.deepEqual(stateLines().map((l) => l.level), [40, 30]);
});

test('a failed probe reopens for another cool-down without logging again', () => {
  const { clock, breaker, stateLines } = setup();
  for (let i = 0; i < 3; i++) breaker.failure();
  clock.advance(2000);
  assert.equal(breaker.allow(), true);
  breaker.failure();
  assert.equal(breaker.state, 'open');
  clock.advance(1999);
  assert.equal(breaker.allow(), false);
  clock.advance(1);
  assert.equal(breaker.allow(), true);
  assert.equal(stateLines().length, 1);
});
