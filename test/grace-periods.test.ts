import assert from 'node:assert/strict';
import { test } from 'node:test';
import { GracePeriods } from '../src/cache/grace-periods.js';

const T = { timeout: 5_000 };

function periods() {
  const reclaimed: number[] = [];
  return { grace: new GracePeriods((region) => reclaimed.push(region)), reclaimed };
}

test('with no request open, a released region is reclaimed at once', T, () => {
  const { grace, reclaimed } = periods();
  grace.release(1);
  grace.release(2);
  assert.deepEqual(reclaimed, [1, 2]);
  assert.equal(grace.held, 0);
});

test('a region waits for the requests open when it was released, not for those begun after', T, () => {
  const { grace, reclaimed } = periods();
  const before = grace.enter();
  grace.release(7);
  const after = grace.enter();
  assert.deepEqual(reclaimed, []);
  grace.leave(before);
  assert.deepEqual(reclaimed, [7], 'the later request is still open');
  grace.leave(after);
  assert.equal(grace.open, 0);
  assert.equal(grace.held, 0);
});

test('a request open since before the release holds it back while others come and go', T, () => {
  const { grace, reclaimed } = periods();
  const slow = grace.enter();
  const quick = grace.enter();
  grace.release(3);
  for (let i = 0; i < 5; i++) grace.leave(grace.enter());
  grace.leave(quick);
  assert.deepEqual(reclaimed, [], 'the slow request may still be sending region 3');
  grace.leave(slow);
  assert.deepEqual(reclaimed, [3]);
});

test('regions released while an older request stays open all come back when it closes, in order', T, () => {
  const { grace, reclaimed } = periods();
  const slow = grace.enter();
  grace.release(1);
  const later = grace.enter();
  grace.release(2);
  grace.leave(later);
  grace.release(3);
  assert.deepEqual(reclaimed, []);
  assert.equal(grace.held, 3);
  grace.leave(slow);
  assert.deepEqual(reclaimed, [1, 2, 3]);
  assert.equal(grace.held, 0);
});

test('under a stream of overlapping requests, no region comes back while a request open at its release is', T, () => {
  const open = new Set<number>();
  const openAtRelease = new Map<number, number[]>();
  const reclaimed: number[] = [];
  const grace = new GracePeriods((region) => {
    const still = openAtRelease.get(region)!.filter((request) => open.has(request));
    assert.deepEqual(still, [], `region ${region} reclaimed while requests ${still.join(', ')} are open`);
    reclaimed.push(region);
  });
  // Request i stays open across three releases; tokens are kept per request.
  const tokens = new Map<number, number>();
  for (let i = 0; i < 60; i++) {
    tokens.set(i, grace.enter());
    open.add(i);
    openAtRelease.set(i, [...open]);
    grace.release(i);
    if (i >= 2) {
      open.delete(i - 2);
      grace.leave(tokens.get(i - 2)!);
    }
  }
  for (const request of [...open]) {
    open.delete(request);
    grace.leave(tokens.get(request)!);
  }
  assert.deepEqual(reclaimed, Array.from({ length: 60 }, (_, i) => i));
});
