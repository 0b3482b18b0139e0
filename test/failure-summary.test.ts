import assert from 'node:assert/strict';
import { test } from 'node:test';
import { FailureSummary, SUMMARY_INTERVAL_MS } from '../src/redis/failure-summary.js';
import { ManualClock } from './helpers/clock.js';
import { captureLogs } from './helpers/log-capture.js';

test('failed Redis calls: the first is logged, the rest once per interval as counts per reason', () => {
  const clock = new ManualClock();
  const logs = captureLogs();
  const summary = new FailureSummary({ clock, logger: logs.logger, name: 'redis cache' });
  const lines = () => logs.lines().map(({ msg, op, reason, failures, total, interval_ms }) => ({ msg, op, reason, failures, total, interval_ms }));
  const first = { msg: 'redis call failed; carrying on without it (further failures are summarized)', op: 'set', reason: 'Command timed out', failures: undefined, total: undefined, interval_ms: undefined };
  const summaryLine = 'redis calls failed since the last line; carried on without them';

  // 50 failures a second for 25 s.
  for (let i = 0; i < 1250; i++) {
    summary.failure(i % 5 === 0 ? 'set' : 'get', i % 10 === 9 ? 'Connection is closed.' : 'Command timed out');
    clock.advance(20);
  }
  assert.deepEqual(lines(), [
    first,
    { msg: summaryLine, op: undefined, reason: undefined, failures: { 'get: Command timed out': 350, 'set: Command timed out': 99, 'get: Connection is closed.': 50 }, total: 499, interval_ms: SUMMARY_INTERVAL_MS },
    { msg: summaryLine, op: undefined, reason: undefined, failures: { 'get: Command timed out': 350, 'set: Command timed out': 100, 'get: Connection is closed.': 50 }, total: 500, interval_ms: SUMMARY_INTERVAL_MS },
  ]);

  // Quiet again: the next call after the interval writes the tail, the one after ends it silently.
  summary.tick();
  clock.advance(SUMMARY_INTERVAL_MS);
  summary.tick();
  assert.equal(logs.lines().length, 4);
  assert.deepEqual([logs.lines()[3]!.total, logs.lines()[3]!.interval_ms], [250, 15_000]);
  clock.advance(SUMMARY_INTERVAL_MS);
  summary.tick();
  assert.equal(logs.lines().length, 4);
  // A failure after the quiet spell is news again: logged at once.
  summary.failure('lease', 'Command timed out');
  assert.equal(logs.lines().length, 5);
  assert.equal(logs.lines()[4]!.op, 'lease');
});
