import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { RetryDecision } from '../src/upstream/events.js';
import { NO_EVENTS } from '../src/upstream/events.js';
import { createRetry, type RetryOptions } from '../src/upstream/retry.js';
import { MIN_CALL_MS, type Attempt, type UpstreamResult } from '../src/upstream/upstream.js';
import { ManualClock } from './helpers/clock.js';

const OK: UpstreamResult = { kind: 'ok', body: Buffer.from('{}') };
const S503: UpstreamResult = { kind: 'failed', failure: 'status_5xx', reason: 'status 503', status: 503 };
const REQUEST: Attempt['request'] = { endpoint: 'user', params: { user_id: '1' }, path: '/v1/users/1' };
const CONFIG: RetryOptions['config'] = {
  retries: 2,
  retry_budget_percent: 20,
  retry_budget_min_per_second: 1,
  retry_backoff_ms: 50,
  retry_backoff_max_ms: 1000,
};

/**
 * A retry layer over a scripted layer below, which answers from `script` in order (then OK),
 * on a ManualClock that also serves as the deadline's clock; `random` is fixed for exact waits.
 * The layer is 10 s old when the test starts, so its floor is whole (`young` keeps it new).
 */
function setup(config: Partial<RetryOptions['config']> = {}, random = 0, young = false) {
  const clock = new ManualClock();
  const decisions: RetryDecision[] = [];
  const script: UpstreamResult[] = [];
  const calledAt: number[] = [];
  const call = createRetry({
    upstream: 'main',
    config: { ...CONFIG, ...config },
    clock,
    timers: clock,
    events: {
      ...NO_EVENTS,
      retry: (upstream, route, decision) => {
        assert.deepEqual([upstream, route], ['main', 'user']);
        decisions.push(decision);
      },
    },
    random: () => random,
    monotonic: () => clock.now(),
  })(async () => {
    calledAt.push(clock.now());
    return script.shift() ?? OK;
  });
  const attempt = (deadlineInMs = 60_000): Attempt => ({ request: REQUEST, deadline: clock.now() + deadlineInMs });
  if (!young) clock.advance(10_000);
  return { clock, decisions, script, calledAt, call, attempt };
}

/** Lets pending promise callbacks run, so a retry reaches its backoff timer. */
const settle = () => new Promise((resolve) => setImmediate(resolve));

test('connection errors, timeouts, 502, 503 and 504 are retried, up to `retries` times', { timeout: 5000 }, async () => {
  const retryable: UpstreamResult[] = [
    { kind: 'failed', failure: 'connection', reason: 'ECONNRESET' },
    { kind: 'timeout', reason: 'slow' },
    { ...S503, status: 502 },
    S503,
    { ...S503, status: 504 },
  ];
  for (const failure of retryable) {
    const { script, calledAt, call, attempt, decisions } = setup();
    script.push(failure);
    assert.equal((await call(attempt())).kind, 'ok', JSON.stringify(failure));
    assert.equal(calledAt.length, 2);
    assert.deepEqual(decisions, ['retried']);
  }
  const { script, calledAt, call, attempt, decisions } = setup();
  script.push(S503, S503, S503);
  assert.deepEqual(await call(attempt()), S503);
  assert.equal(calledAt.length, 3);
  assert.deepEqual(decisions, ['retried', 'retried', 'exhausted']);
});

test('nothing else is retried: 500, a 503 with Retry-After, 404, 401, bad bodies, refusals', { timeout: 5000 }, async () => {
  const final: UpstreamResult[] = [
    { ...S503, status: 500 },
    { kind: 'rate_limited', cause: 'status_503', retryAfterSeconds: 5, untilMs: 0 },
    { kind: 'not_found' },
    { kind: 'failed', failure: 'unauthorized', reason: 'status 401', status: 401 },
    { kind: 'failed', failure: 'bad_body', reason: 'not JSON', status: 200 },
    { kind: 'refused', reason: 'cooling_down', retryAfterSeconds: 3 },
  ];
  for (const result of final) {
    const { script, calledAt, call, attempt, decisions } = setup();
    script.push(result);
    assert.deepEqual(await call(attempt()), result);
    assert.equal(calledAt.length, 1);
    assert.deepEqual(decisions, []);
  }
});

test('backoff is exponential with full jitter, capped, on the injected timers', { timeout: 5000 }, async () => {
  const { clock, script, calledAt, call, attempt } = setup({ retries: 4, retry_backoff_ms: 100, retry_backoff_max_ms: 300 }, 0.5);
  script.push(S503, S503, S503, S503);
  const start = clock.now();
  const done = call(attempt());
  // Waits of 0.5 x 100, 200, 300 (capped), 300.
  for (const wait of [50, 100, 150, 150]) {
    await settle();
    clock.advance(wait - 1);
    await settle();
    const before = calledAt.length;
    clock.advance(1);
    await settle();
    assert.equal(calledAt.length, before + 1, `next attempt exactly ${wait} ms later`);
  }
  assert.equal((await done).kind, 'ok');
  assert.deepEqual(calledAt.map((t) => t - start), [0, 50, 150, 300, 450]);
});

test('no retry starts whose backoff would pass the deadline (no_time)', { timeout: 5000 }, async () => {
  const { clock, script, calledAt, call, attempt, decisions } = setup({ retries: 3 }, 0.99);
  script.push(S503, S503, S503);
  const done = call(attempt(100));
  await settle();
  // First wait floor(0.99 x 50) = 49 ms fits in 100; the second, 99 ms, would end at 148.
  clock.advance(49);
  await settle();
  assert.deepEqual(decisions, ['retried', 'no_time']);
  assert.equal(calledAt.length, 2);
  assert.deepEqual(await done, S503);
});

test('no retry starts with less than MIN_CALL_MS of the deadline left after its backoff', { timeout: 5000 }, async () => {
  const { script, calledAt, call, attempt, decisions } = setup({ retries: 3 }, 0.5);
  script.push(S503, S503);
  // The backoff, floor(0.5 x 50) = 25 ms, ends 25 ms before the deadline: too little to be answered.
  const done = call(attempt(25 + MIN_CALL_MS - 1));
  await settle();
  assert.deepEqual(decisions, ['no_time']);
  assert.deepEqual(await done, S503);
  assert.equal(calledAt.length, 1);
  const fits = setup({ retries: 3 }, 0.5);
  fits.script.push(S503);
  const answered = fits.call(fits.attempt(25 + MIN_CALL_MS));
  await settle();
  fits.clock.advance(25);
  assert.equal((await answered).kind, 'ok');
  assert.deepEqual(fits.decisions, ['retried']);
});

test('a retry the miss deadline cut short leaves the full timeout before it as the result', { timeout: 5000 }, async () => {
  const { script, calledAt, call, attempt } = setup({ retries: 2 });
  const full: UpstreamResult = { kind: 'timeout', reason: 'no complete answer within 1000 ms' };
  script.push(full, { kind: 'timeout', reason: 'no complete answer within 940 ms, what was left of the miss deadline', deadline: true });
  // The breaker above must weigh the upstream's own timeout, not the cut that says nothing of it.
  assert.deepEqual(await call(attempt()), full);
  assert.equal(calledAt.length, 2, 'no further retry after the deadline cut');
});

test('budget: retries, this one counted, stay within max(min_per_second x 10, percent of requests) over 10 s', { timeout: 5000 }, async () => {
  const { clock, script, calledAt, call, attempt, decisions } = setup({ retries: 1 });
  // 100 requests whose first attempt fails and whose retry succeeds.
  for (let i = 0; i < 100; i++) {
    script.push(S503);
    await call(attempt());
  }
  const count = (d: RetryDecision) => decisions.filter((x) => x === d).length;
  // The floor of 10 spends first; then one more each time 20% of the requests reaches the count
  // with it: the 55th, 60th, ..., 100th request, so the window never holds more than 20%.
  assert.equal(count('retried'), 20);
  assert.equal(count('budget_exhausted'), 80);
  assert.equal(calledAt.length, 120);
  const retriedAt = decisions.flatMap((d, i) => (d === 'retried' ? [i + 1] : []));
  assert.deepEqual(retriedAt.slice(9), [10, 55, 60, 65, 70, 75, 80, 85, 90, 95, 100]);

  // Ten seconds on, the window has forgotten them all: retries flow again.
  clock.advance(10_000);
  script.push(S503);
  assert.equal((await call(attempt())).kind, 'ok');
  assert.equal(decisions.at(-1), 'retried');
});

test('the floor alone: with 0% the budget is min_per_second x 10 retries per window', { timeout: 5000 }, async () => {
  const { script, call, attempt, decisions } = setup({ retries: 1, retry_budget_percent: 0, retry_budget_min_per_second: 0.5 });
  for (let i = 0; i < 8; i++) {
    script.push(S503);
    await call(attempt());
  }
  assert.deepEqual(decisions, ['retried', 'retried', 'retried', 'retried', 'retried', 'budget_exhausted', 'budget_exhausted', 'budget_exhausted']);
});

test('the floor is a rate: a layer built 2.5 s ago allows min_per_second x 2.5 retries beyond the percentage', { timeout: 5000 }, async () => {
  const { clock, script, call, attempt, decisions } = setup({ retries: 1, retry_budget_percent: 0, retry_budget_min_per_second: 1 }, 0, true);
  script.push(S503);
  await call(attempt());
  assert.deepEqual(decisions, ['budget_exhausted'], 'none at start-up');
  clock.advance(2500);
  for (let i = 0; i < 4; i++) {
    script.push(S503);
    await call(attempt());
  }
  assert.deepEqual(decisions, ['budget_exhausted', 'retried', 'retried', 'budget_exhausted', 'budget_exhausted']);
});

test('a retry the guard refuses leaves the provider failure before it as the answer', { timeout: 5000 }, async () => {
  const { script, calledAt, call, attempt, decisions } = setup();
  script.push(S503, { kind: 'refused', reason: 'over_cap', retryAfterSeconds: 2 });
  assert.deepEqual(await call(attempt()), S503);
  assert.equal(calledAt.length, 2);
  assert.deepEqual(decisions, ['retried']);
});

test('retries 0 is a pass-through with no events', { timeout: 5000 }, async () => {
  const { script, calledAt, call, attempt, decisions } = setup({ retries: 0 });
  script.push(S503);
  assert.deepEqual(await call(attempt()), S503);
  assert.equal(calledAt.length, 1);
  assert.deepEqual(decisions, []);
});
