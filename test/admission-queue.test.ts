import assert from 'node:assert/strict';
import { test } from 'node:test';
import { AdmissionQueue } from '../src/upstream/guard/admission-queue.js';
import type { Admission } from '../src/upstream/guard/provider-state.js';
import { ManualClock } from './helpers/clock.js';

/** A cap with `free` places now and more as the test adds them. */
function cap() {
  let free = 0;
  return {
    add: (n: number) => void (free += n),
    tryAdmit: (): Admission => (free > 0 ? (free--, { kind: 'admitted', credential: 'a' }) : { kind: 'over_cap', waitMs: 100 }),
  };
}

const settle = () => new Promise((resolve) => setImmediate(resolve));

test('waiting calls are admitted in arrival order as the cap frees places', { timeout: 5000 }, async () => {
  const clock = new ManualClock();
  const queue = new AdmissionQueue({ size: 10, clock, timers: clock });
  const c = cap();
  const order: number[] = [];
  const pending = [1, 2, 3].map((n) => queue.admit(c.tryAdmit, 1000).then((r) => (order.push(n), r)));
  await settle();
  assert.equal(queue.length, 3);
  c.add(2);
  clock.advance(100);
  await settle();
  assert.deepEqual(order, [1, 2]);
  c.add(1);
  queue.wake();
  const results = await Promise.all(pending);
  assert.deepEqual(order, [1, 2, 3]);
  assert.deepEqual(
    results.map((r) => [r.admission.kind, r.waitedMs]),
    [
      ['admitted', 100],
      ['admitted', 100],
      ['admitted', 100],
    ],
  );
});

test('a call waits at most maxWaitMs, then is refused over_cap with the cap wait', { timeout: 5000 }, async () => {
  const clock = new ManualClock();
  const queue = new AdmissionQueue({ size: 10, clock, timers: clock });
  const pending = queue.admit(cap().tryAdmit, 250);
  await settle();
  clock.advance(250);
  assert.deepEqual(await pending, { admission: { kind: 'over_cap', waitMs: 100 }, waitedMs: 250 });
  assert.equal(queue.length, 0);
});

test('a full queue refuses at once; a zero wait never queues', { timeout: 5000 }, async () => {
  const clock = new ManualClock();
  const queue = new AdmissionQueue({ size: 1, clock, timers: clock });
  const c = cap();
  const first = queue.admit(c.tryAdmit, 1000);
  await settle();
  assert.deepEqual(await queue.admit(c.tryAdmit, 1000), { admission: { kind: 'over_cap', waitMs: 100 }, waitedMs: 0 });
  const other = new AdmissionQueue({ size: 10, clock, timers: clock });
  assert.deepEqual(await other.admit(c.tryAdmit, 0), { admission: { kind: 'over_cap', waitMs: 100 }, waitedMs: 0 });
  c.add(1);
  queue.wake();
  assert.equal((await first).admission.kind, 'admitted');
});

test('a stop found while waiting ends the wait with the stop', { timeout: 5000 }, async () => {
  const clock = new ManualClock();
  const queue = new AdmissionQueue({ size: 10, clock, timers: clock });
  let stopped = false;
  const tryAdmit = (): Admission => (stopped ? { kind: 'stopped', untilMs: 5, state: 'cooling_down' } : { kind: 'over_cap', waitMs: 100 });
  const pending = queue.admit(tryAdmit, 1000);
  await settle();
  stopped = true;
  clock.advance(100);
  assert.deepEqual((await pending).admission, { kind: 'stopped', untilMs: 5, state: 'cooling_down' });
});
