import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { BreakerConfig } from '../src/config/types.js';
import { createBreaker } from '../src/upstream/breaker.js';
import { NO_EVENTS, type BreakerState } from '../src/upstream/events.js';
import type { Attempt, UpstreamResult } from '../src/upstream/upstream.js';
import { ManualClock } from './helpers/clock.js';
import { captureLogs } from './helpers/log-capture.js';

const CONFIG: BreakerConfig = { consecutive_failures: 5, failure_ratio: 0.5, window_ms: 10_000, min_calls: 20, half_open_after_ms: 30_000, half_open_max_ms: 30_000 };
const OK: UpstreamResult = { kind: 'ok', body: Buffer.from('{}') };
const FAIL: UpstreamResult = { kind: 'failed', failure: 'connection', reason: 'ECONNREFUSED' };
const ATTEMPT: Attempt = { request: { endpoint: 'user', params: { user_id: '1' }, path: '/v1/users/1' }, deadline: Infinity };

/**
 * A breaker over a scripted layer below: `next` answers with `answer` (changeable) and counts
 * its calls; every state change, share call and log line is recorded.
 */
function setup(config: Partial<BreakerConfig> = {}) {
  const clock = new ManualClock();
  const logs = captureLogs();
  const states: BreakerState[] = [];
  const shared: string[] = [];
  const refusals: string[] = [];
  const breaker = createBreaker({
    upstream: 'main',
    config: { ...CONFIG, ...config },
    clock,
    logger: logs.logger,
    events: { ...NO_EVENTS, breakerState: (_u, s) => states.push(s), refused: (_u, _r, reason) => refusals.push(reason) },
    share: { opened: (untilMs) => shared.push(`opened ${untilMs - clock.now()}`), closed: () => shared.push('closed') },
  });
  const below = { calls: 0, answer: OK as UpstreamResult };
  const call = breaker.layer(async () => {
    below.calls++;
    return below.answer;
  });
  const run = async (answer: UpstreamResult, times = 1) => {
    below.answer = answer;
    let last: UpstreamResult | undefined;
    for (let i = 0; i < times; i++) last = await call(ATTEMPT);
    return last!;
  };
  const lines = () => logs.lines().filter((l) => String(l.msg).startsWith('upstream breaker'));
  return { clock, breaker, below, call, run, states, shared, refusals, lines };
}

test('opens after exactly consecutive_failures failures in a row; a success resets the count', { timeout: 5000 }, async () => {
  const { breaker, below, run, states, shared, refusals, lines } = setup();
  await run(FAIL, 4);
  await run(OK);
  await run(FAIL, 4);
  assert.equal(breaker.state(), 'closed');
  await run(FAIL);
  assert.equal(breaker.state(), 'open');
  assert.equal(below.calls, 10);
  const refused = await run(FAIL, 3);
  assert.deepEqual(refused, { kind: 'refused', reason: 'breaker_open', retryAfterSeconds: 30 });
  assert.equal(below.calls, 10, 'no call while open');
  assert.deepEqual(refusals, ['breaker_open', 'breaker_open', 'breaker_open']);
  assert.deepEqual(states, ['open']);
  assert.deepEqual(shared, ['opened 30000']);
  const [line] = lines();
  assert.equal(lines().length, 1);
  assert.equal(line!.level, 40);
  assert.equal(line!.upstream, 'main');
  assert.equal(line!.consecutive_failures, 5);
  assert.equal(line!.window_failures, 9);
  assert.equal(line!.window_calls, 10);
});

test('what counts: timeouts, 5xx, bad bodies and unexpected statuses; not 404, 429, 401 or refusals', { timeout: 5000 }, async () => {
  const failures: UpstreamResult[] = [
    { kind: 'timeout', reason: 'slow' },
    { kind: 'failed', failure: 'status_5xx', reason: 'status 500', status: 500 },
    { kind: 'failed', failure: 'bad_body', reason: 'not JSON', status: 200 },
    { kind: 'failed', failure: 'unexpected_status', reason: 'status 418', status: 418 },
  ];
  const neutral: UpstreamResult[] = [
    { kind: 'failed', failure: 'unauthorized', reason: 'status 401', status: 401 },
    { kind: 'rate_limited', cause: 'status_429', retryAfterSeconds: 5, untilMs: 0 },
    { kind: 'refused', reason: 'over_cap', retryAfterSeconds: 1 },
  ];
  const { breaker, run } = setup({ consecutive_failures: 4 });
  for (const [i, failure] of failures.slice(0, 3).entries()) {
    await run(failure);
    // Neither success nor failure: the run of failures goes on across them.
    await run(neutral[i]!, 10);
  }
  assert.equal(breaker.state(), 'closed');
  await run({ kind: 'not_found' });
  await run(failures[3]!, 3);
  assert.equal(breaker.state(), 'closed', 'a 404 is an answer: it reset the run');
  await run({ kind: 'bad_request', reason: 'cursor' });
  await run(failures[3]!, 4);
  assert.equal(breaker.state(), 'open');
});

test('half-open exactly at half_open_after_ms lets one probe through; its success closes', { timeout: 5000 }, async () => {
  const { clock, breaker, below, call, run, states, shared, lines } = setup();
  await run(FAIL, 5);
  clock.advance(29_999);
  assert.deepEqual(await call(ATTEMPT), { kind: 'refused', reason: 'breaker_open', retryAfterSeconds: 1 });
  assert.equal(below.calls, 5);
  clock.advance(1);
  assert.equal(breaker.state(), 'half_open');

  let release!: (result: UpstreamResult) => void;
  const held = new Promise<UpstreamResult>((resolve) => (release = resolve));
  // The probe is held in flight: every other request meanwhile is refused without a call.
  const gated = createGated(breaker, () => held);
  const probe = gated.call(ATTEMPT);
  const others = [gated.call(ATTEMPT), gated.call(ATTEMPT)];
  assert.equal(gated.calls(), 1, 'one probe only');
  assert.deepEqual((await Promise.all(others)).map((r) => r.kind === 'refused' && r.reason), ['breaker_open', 'breaker_open']);
  release(OK);
  assert.equal((await probe).kind, 'ok');
  assert.equal(breaker.state(), 'closed');
  assert.deepEqual(states, ['open', 'half_open', 'closed']);
  assert.deepEqual(shared, ['opened 30000', 'closed']);
  assert.deepEqual(lines().map((l) => [l.level, l.msg]), [
    [40, 'upstream breaker open: no calls until its half-open probe'],
    [30, 'upstream breaker half-open: one probe goes through'],
    [30, 'upstream breaker closed: upstream is back'],
  ]);
  // Closed afresh: it takes a full run of failures again.
  await run(FAIL, 4);
  assert.equal(breaker.state(), 'closed');
});

test('a failed probe reopens for another half_open_after_ms; a neutral one leaves the probe to the next call', { timeout: 5000 }, async () => {
  const { clock, breaker, below, run, states, shared } = setup();
  await run(FAIL, 5);
  clock.advance(30_000);
  await run({ kind: 'rate_limited', cause: 'status_429', retryAfterSeconds: 5, untilMs: 0 });
  assert.equal(breaker.state(), 'half_open');
  await run(FAIL);
  assert.equal(breaker.state(), 'open');
  assert.equal(below.calls, 7);
  clock.advance(29_999);
  await run(OK);
  assert.equal(below.calls, 7);
  clock.advance(1);
  await run(OK);
  assert.equal(below.calls, 8);
  assert.equal(breaker.state(), 'closed');
  assert.deepEqual(states, ['open', 'half_open', 'open', 'half_open', 'closed']);
  assert.deepEqual(shared, ['opened 30000', 'opened 30000', 'closed']);
});

test('opens on the failure ratio once the window holds min_calls, not before', { timeout: 5000 }, async () => {
  const { breaker, run } = setup({ consecutive_failures: 100 });
  // Alternating: 50% failures, but only 19 calls in the window.
  for (let i = 0; i < 9; i++) {
    await run(OK);
    await run(FAIL);
  }
  await run(OK);
  assert.equal(breaker.state(), 'closed', '9 of 19 calls failed');
  await run(FAIL);
  assert.equal(breaker.state(), 'open', '10 of 20 calls failed: ratio 0.5 reached');
});

test('the ratio only weighs the last window_ms: older calls leave it', { timeout: 5000 }, async () => {
  const { clock, breaker, run } = setup({ consecutive_failures: 100 });
  await run(FAIL, 3);
  await run(OK, 7);
  // 10 s later the first calls are out of the window; 10 new calls at 1 failure in 2 follow.
  clock.advance(10_000);
  for (let i = 0; i < 5; i++) {
    await run(OK);
    await run(FAIL);
  }
  assert.equal(breaker.state(), 'closed', 'only 10 calls in the window');
  await run(OK, 9);
  await run(FAIL);
  assert.equal(breaker.state(), 'closed', '6 of 20: under the ratio');
});

test('a failure_ratio of 1 never trips on the ratio', { timeout: 5000 }, async () => {
  const { breaker, run } = setup({ consecutive_failures: 100, failure_ratio: 1, min_calls: 1 });
  for (let i = 0; i < 50; i++) {
    await run(FAIL);
    await run(OK);
  }
  assert.equal(breaker.state(), 'closed');
});

test('results of calls started before the breaker opened do not move it again', { timeout: 5000 }, async () => {
  const { clock, breaker, states, shared, lines } = setup({ consecutive_failures: 2 });
  const pending: ((r: UpstreamResult) => void)[] = [];
  const gated = createGated(breaker, () => new Promise((resolve) => pending.push(resolve)));
  const calls = [gated.call(ATTEMPT), gated.call(ATTEMPT), gated.call(ATTEMPT)];
  pending[0]!(FAIL);
  pending[1]!(FAIL);
  await Promise.all(calls.slice(0, 2));
  assert.equal(breaker.state(), 'open');
  clock.advance(10_000);
  pending[2]!(FAIL);
  await calls[2];
  assert.deepEqual(states, ['open'], 'a late failure neither reopens nor logs again');
  assert.deepEqual(shared, ['opened 30000']);
  assert.equal(lines().length, 1);
  clock.advance(20_000);
  assert.equal(breaker.state(), 'half_open', 'the open period was not extended');
});

/** The same breaker over a layer whose answers the test hands out one by one. */
function createGated(breaker: ReturnType<typeof createBreaker>, answer: () => Promise<UpstreamResult>) {
  let calls = 0;
  const call = breaker.layer(() => {
    calls++;
    return answer();
  });
  return { call, calls: () => calls };
}
