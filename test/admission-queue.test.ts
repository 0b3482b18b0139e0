import assert from 'node:assert/strict';
import { test } from 'node:test';
import { AdmissionQueue, IDLE_FLOWS, type FairAsk } from '../src/upstream/guard/admission-queue.js';
import type { Admission } from '../src/upstream/guard/provider-state.js';
import type { Payer } from '../src/upstream/upstream.js';
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

const P: Payer = { id: 'a', weight: 1, label: 'a' };

test('one key\'s waiting calls are admitted in arrival order as the cap frees places', { timeout: 5000 }, async () => {
  const clock = new ManualClock();
  const queue = new AdmissionQueue({ size: 10, clock, timers: clock });
  const c = cap();
  const order: number[] = [];
  const pending = [1, 2, 3].map((n) => queue.admit(P, c.tryAdmit, 1000).then((r) => (order.push(n), r)));
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
  const pending = queue.admit(P, cap().tryAdmit, 250);
  await settle();
  clock.advance(250);
  assert.deepEqual(await pending, { admission: { kind: 'over_cap', waitMs: 100 }, waitedMs: 250 });
  assert.equal(queue.length, 0);
});

test('a full queue refuses at once; a zero wait never queues', { timeout: 5000 }, async () => {
  const clock = new ManualClock();
  const queue = new AdmissionQueue({ size: 1, clock, timers: clock });
  const c = cap();
  const first = queue.admit(P, c.tryAdmit, 1000);
  await settle();
  assert.deepEqual(await queue.admit(P, c.tryAdmit, 1000), { admission: { kind: 'over_cap', waitMs: 100 }, waitedMs: 0 });
  const other = new AdmissionQueue({ size: 10, clock, timers: clock });
  assert.deepEqual(await other.admit(P, c.tryAdmit, 0), { admission: { kind: 'over_cap', waitMs: 100 }, waitedMs: 0 });
  c.add(1);
  queue.wake();
  assert.equal((await first).admission.kind, 'admitted');
});

test('a stop found while waiting ends the wait with the stop', { timeout: 5000 }, async () => {
  const clock = new ManualClock();
  const queue = new AdmissionQueue({ size: 10, clock, timers: clock });
  let stopped = false;
  const tryAdmit = (): Admission => (stopped ? { kind: 'stopped', untilMs: 5, state: 'cooling_down' } : { kind: 'over_cap', waitMs: 100 });
  const pending = queue.admit(P, tryAdmit, 1000);
  await settle();
  stopped = true;
  clock.advance(100);
  assert.deepEqual((await pending).admission, { kind: 'stopped', untilMs: 5, state: 'cooling_down' });
});

/** Queues `count` calls of `payer` on `queue`, recording the payer's id in `order` as each is admitted. */
function enqueue(queue: AdmissionQueue, c: ReturnType<typeof cap>, payer: Payer, count: number, order: string[]) {
  return Array.from({ length: count }, () => queue.admit(payer, c.tryAdmit, 60_000).then((r) => (r.admission.kind === 'admitted' && order.push(payer.id), r)));
}

/** Frees one place at a time and lets the queue take it, `times` times. */
async function release(queue: AdmissionQueue, c: ReturnType<typeof cap>, times: number): Promise<void> {
  for (let i = 0; i < times; i++) {
    c.add(1);
    queue.wake();
    await settle();
  }
}

test('a key that asks for less than its share goes ahead of a flooding key\'s backlog: next after one call', { timeout: 5000 }, async () => {
  const clock = new ManualClock();
  const queue = new AdmissionQueue({ size: 100, clock, timers: clock });
  const c = cap();
  const order: string[] = [];
  enqueue(queue, c, { id: 'crawler', weight: 1, label: 'crawler' }, 20, order);
  await settle();
  await release(queue, c, 3);
  assert.deepEqual(order, ['crawler', 'crawler', 'crawler']);
  // The app's start tag is the virtual time (the last admitted call's, 2): below the crawler's 3..19.
  enqueue(queue, c, { id: 'app', weight: 1, label: 'app' }, 2, order);
  await settle();
  await release(queue, c, 5);
  assert.deepEqual(order, ['crawler', 'crawler', 'crawler', 'app', 'crawler', 'app', 'crawler', 'crawler']);
});

test('weights: while both wait, a key of weight 3 gets exactly three calls for one of a key of weight 1', { timeout: 5000 }, async () => {
  const clock = new ManualClock();
  const queue = new AdmissionQueue({ size: 100, clock, timers: clock });
  const c = cap();
  const order: string[] = [];
  for (let i = 0; i < 40; i++) {
    enqueue(queue, c, { id: 'heavy', weight: 3, label: 'heavy' }, 1, order);
    enqueue(queue, c, { id: 'light', weight: 1, label: 'light' }, 1, order);
  }
  await settle();
  await release(queue, c, 16);
  assert.equal(order.filter((id) => id === 'heavy').length, 12);
  assert.equal(order.filter((id) => id === 'light').length, 4);
  await release(queue, c, 16);
  assert.equal(order.filter((id) => id === 'heavy').length, 24);
});

test('a full queue refuses the call with the highest tag: a flood cannot shut another key out', { timeout: 5000 }, async () => {
  const clock = new ManualClock();
  const queue = new AdmissionQueue({ size: 3, clock, timers: clock });
  const c = cap();
  const order: string[] = [];
  const crawler = enqueue(queue, c, { id: 'crawler', weight: 1, label: 'crawler' }, 3, order);
  await settle();
  // The crawler's own next call has the highest tag: refused at once, as before.
  assert.deepEqual(await queue.admit({ id: 'crawler', weight: 1, label: 'crawler' }, c.tryAdmit, 1000), { admission: { kind: 'over_cap', waitMs: 100 }, waitedMs: 0 });
  // The app's call (tag 0) takes the place of the crawler's last (tag 2), which is refused.
  const app = enqueue(queue, c, { id: 'app', weight: 1, label: 'app' }, 1, order);
  assert.deepEqual((await crawler[2])!.admission, { kind: 'over_cap', waitMs: 100 });
  assert.equal(queue.length, 3);
  await release(queue, c, 3);
  assert.deepEqual(order, ['crawler', 'app', 'crawler']);
  assert.equal((await app[0])!.admission.kind, 'admitted');
});

test('the last waiting call leaving takes its wake with it: the next call waits on its own estimate, not a stale one', { timeout: 5000 }, async () => {
  const clock = new ManualClock();
  const queue = new AdmissionQueue({ size: 10, clock, timers: clock });
  // The cap's estimate shortens (a reload, or the fallback to this instance's own cap).
  let estimate = 5000;
  let free = 0;
  const tryAdmit = (): Admission => (free > 0 ? (free--, { kind: 'admitted', credential: 'a' }) : { kind: 'over_cap', waitMs: estimate });
  const first = queue.admit(P, tryAdmit, 1000);
  await settle();
  clock.advance(1000);
  assert.equal((await first).admission.kind, 'over_cap');
  assert.equal(clock.waiting, 0, 'nobody waits: no wake is left behind');
  clock.advance(500);
  estimate = 100;
  const second = queue.admit(P, tryAdmit, 1000);
  await settle();
  free = 1;
  clock.advance(100);
  assert.deepEqual(await second, { admission: { kind: 'admitted', credential: 'a' }, waitedMs: 100 });
});

test('per-payer state stays bounded under key churn: at most 2 x waiting calls + IDLE_FLOWS flows, at most IDLE_FLOWS once none waits', { timeout: 5000 }, async () => {
  const clock = new ManualClock();
  const queue = new AdmissionQueue({ size: 1000, clock, timers: clock });
  const admitted = (): Admission => ({ kind: 'admitted', credential: 'a' });
  const full = (): Admission => ({ kind: 'over_cap', waitMs: 100 });
  const crawler: Payer = { id: 'crawler', weight: 1, label: 'crawler' };
  // The crawler has had a call, so its waiting one stands past the virtual time: each new payer
  // starts ahead of it, is served once and leaves a finish ahead of the virtual time.
  await queue.admit(crawler, admitted, 0);
  const waiting = queue.admit(crawler, full, 10_000);
  await settle();
  let most = 0;
  for (let i = 0; i < 300; i++) {
    assert.equal((await queue.admit({ id: `p${i}`, weight: 1, label: `p${i}` }, admitted, 10_000)).admission.kind, 'admitted');
    most = Math.max(most, queue.payers);
  }
  assert.equal(most, 2 * 1 + IDLE_FLOWS, 'one call waits: at most 2 + IDLE_FLOWS flows');
  clock.advance(10_000);
  assert.equal((await waiting).admission.kind, 'over_cap');
  assert.ok(queue.payers <= IDLE_FLOWS, `${queue.payers} flows kept with no call waiting`);
});

test('a payer whose last waiting call leaves unadmitted is withdrawn: expired, pushed out, stopped; not one refused at once or admitted', { timeout: 5000 }, async () => {
  const clock = new ManualClock();
  const withdrawn: string[] = [];
  const queue = new AdmissionQueue({ size: 2, clock, timers: clock, withdraw: (payer) => withdrawn.push(payer.id) });
  const full = (): Admission => ({ kind: 'over_cap', waitMs: 100 });
  const admitted = (): Admission => ({ kind: 'admitted', credential: 'a' });
  const payer = (id: string): Payer => ({ id, weight: 1, label: id });
  const asks: FairAsk[] = [];
  const recording = (answer: () => Admission) => (fair: FairAsk) => (asks.push(fair), answer());
  assert.equal((await queue.admit(payer('at-once'), recording(full), 0)).admission.kind, 'over_cap');
  assert.deepEqual(asks, [{ waits: false, waiting: [] }], 'refused at once: the cap is told it will not wait');
  // pushed has had a call, so its waiting one stands a call past the virtual time.
  assert.equal((await queue.admit(payer('pushed'), admitted, 1000)).admission.kind, 'admitted');
  const expiring = queue.admit(payer('expires'), recording(full), 100);
  await settle();
  assert.deepEqual(asks.at(-1), { waits: true, waiting: [] });
  const pushed = queue.admit(payer('pushed'), full, 1000);
  clock.advance(50);
  // The queue is full: the newcomer (tag 0) takes the place of pushed's call (tag 1).
  let stop = false;
  const stoppable = (): Admission => (stop ? { kind: 'stopped', untilMs: 0, state: 'cooling_down' } : full());
  const newcomer = queue.admit(payer('newcomer'), stoppable, 1000);
  assert.equal((await pushed).admission.kind, 'over_cap');
  assert.deepEqual(withdrawn, ['pushed']);
  clock.advance(50);
  assert.equal((await expiring).admission.kind, 'over_cap');
  assert.deepEqual(withdrawn, ['pushed', 'expires']);
  const last = queue.admit(payer('newcomer'), stoppable, 1000);
  await settle();
  stop = true;
  clock.advance(100);
  assert.deepEqual([(await newcomer).admission.kind, (await last).admission.kind], ['stopped', 'stopped']);
  assert.deepEqual(withdrawn, ['pushed', 'expires', 'newcomer'], 'withdrawn once, as its last call left');
});
