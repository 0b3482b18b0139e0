import assert from 'node:assert/strict';
import { test, type TestContext } from 'node:test';
import { Redis } from 'ioredis';
import type { ThrottleConfig } from '../src/config/types.js';
import { NO_EVENTS } from '../src/upstream/events.js';
import type { OutcomeShare } from '../src/upstream/guard/provider-state.js';
import { RedisProviderState } from '../src/upstream/guard/redis-state.js';
import { createThrottle } from '../src/upstream/throttle.js';
import type { Attempt, UpstreamResult } from '../src/upstream/upstream.js';
import { ManualClock } from './helpers/clock.js';
import { waitFor } from './helpers/perch.js';
import { startRedis } from './helpers/redis-server.js';
import { onCleanup } from './helpers/cleanup.js';

const CONFIG: ThrottleConfig = { enabled: true, k: 2, window_ms: 10_000, min_calls: 20 };
const OK: UpstreamResult = { kind: 'ok', body: Buffer.from('{}') };
const FAIL: UpstreamResult = { kind: 'failed', failure: 'status_5xx', reason: 'status 503', status: 503 };
const ATTEMPT: Attempt = { request: { endpoint: 'user', params: { user_id: '1' }, path: '/v1/users/1' }, deadline: Infinity };

/**
 * A throttle over a scripted layer below, with the shedding draw fixed by the test (`draw`), so
 * which call is shed is exact: a call is shed when the draw is below the reject probability. The
 * draw starts at 1, which sheds nothing, so a test builds its counts first.
 */
function setup(config: Partial<ThrottleConfig> = {}, share?: OutcomeShare, clock = new ManualClock()) {
  const refusals: string[] = [];
  const draw = { value: 1 };
  const throttle = createThrottle({
    upstream: 'main',
    config: { ...CONFIG, ...config },
    clock,
    events: { ...NO_EVENTS, refused: (_u, _r, reason) => refusals.push(reason) },
    share,
    random: () => draw.value,
  });
  const below = { calls: 0 };
  const call = throttle.layer(async (attempt) => {
    below.calls++;
    return (attempt as Attempt & { answer: UpstreamResult }).answer;
  });
  const run = async (answer: UpstreamResult, times = 1, extra: Partial<Attempt> = {}) => {
    let last: UpstreamResult | undefined;
    for (let i = 0; i < times; i++) last = await call({ ...ATTEMPT, ...extra, answer } as Attempt);
    return last!;
  };
  return { clock, throttle, below, run, refusals, draw };
}

test('sheds with probability exactly max(0, (requests - k * accepts) / (requests + 1))', { timeout: 5000 }, async () => {
  const { throttle, below, run, refusals, draw } = setup();
  await run(OK, 10);
  await run(FAIL, 30);
  // 40 answered, 10 accepted: (40 - 2 * 10) / 41.
  assert.equal(throttle.rejectProbability(), 20 / 41);
  draw.value = 20 / 41 - 1e-9;
  assert.deepEqual(await run(OK), { kind: 'refused', reason: 'throttled', retryAfterSeconds: 1 });
  assert.equal(below.calls, 40, 'a shed call is not made');
  assert.deepEqual(refusals, ['throttled']);
  assert.equal(throttle.rejectProbability(), 20 / 41, 'a shed call counts neither way');
  draw.value = 20 / 41;
  assert.deepEqual(await run(OK), OK);
  assert.equal(below.calls, 41);
  // 41 answered, 11 accepted.
  assert.equal(throttle.rejectProbability(), 19 / 42);
  assert.equal(setup({ k: 3 }).throttle.rejectProbability(), 0);
  const k3 = setup({ k: 3 });
  await k3.run(OK, 5);
  await k3.run(FAIL, 25);
  assert.equal(k3.throttle.rejectProbability(), (30 - 3 * 5) / 31);
});

test('a provider answering at least 1/k of its calls is never throttled, not even at 1 in 2', { timeout: 5000 }, async () => {
  const { throttle, below, run, refusals, draw } = setup();
  // Draw 0 sheds whenever the probability is above 0 at all.
  draw.value = 0;
  for (let i = 0; i < 500; i++) await run(i % 2 === 0 ? OK : FAIL);
  assert.equal(below.calls, 500);
  assert.deepEqual(refusals, []);
  assert.equal(throttle.rejectProbability(), 0);
  const healthy = setup();
  healthy.draw.value = 0;
  await healthy.run(OK, 1000);
  assert.equal(healthy.below.calls, 1000);
  assert.equal(healthy.throttle.rejectProbability(), 0);
});

test('what counts: 5xx and timeouts fail, 404 and a rejected cursor are answers; 401/403, 429, refusals and deadline cuts count neither way', { timeout: 5000 }, async () => {
  const { throttle, run } = setup({ min_calls: 1 });
  const neutral: UpstreamResult[] = [
    { kind: 'failed', failure: 'unauthorized', reason: 'status 401', status: 401 },
    { kind: 'rate_limited', cause: 'status_429', retryAfterSeconds: 5, untilMs: 0 },
    { kind: 'refused', reason: 'over_cap', retryAfterSeconds: 1 },
    { kind: 'refused', reason: 'cooling_down', retryAfterSeconds: 1 },
    // The miss deadline, not the upstream, ended it (issue 50).
    { kind: 'timeout', reason: 'no complete answer within 12 ms, what was left of the miss deadline', deadline: true },
  ];
  for (const answer of neutral) await run(answer, 10);
  assert.equal(throttle.rejectProbability(), 0, '50 neutral results weigh nothing');
  await run({ kind: 'timeout', reason: 'slow' }, 3);
  assert.equal(throttle.rejectProbability(), 3 / 4);
  await run({ kind: 'not_found' });
  await run({ kind: 'bad_request', reason: 'cursor' });
  // 5 answered, 2 accepted.
  assert.equal(throttle.rejectProbability(), 1 / 6);
  for (const answer of neutral) await run(answer, 10);
  assert.equal(throttle.rejectProbability(), 1 / 6);
});

test('nothing is shed until the window holds min_calls answered calls', { timeout: 5000 }, async () => {
  const { throttle, below, run } = setup({ min_calls: 20 });
  await run(FAIL, 19);
  assert.equal(throttle.rejectProbability(), 0);
  assert.equal(below.calls, 19);
  await run(FAIL);
  assert.equal(throttle.rejectProbability(), 20 / 21);
});

test('calls leave the window window_ms after they were answered (in tenths of it)', { timeout: 5000 }, async () => {
  const { clock, throttle, run } = setup({ window_ms: 10_000 });
  await run(FAIL, 20);
  clock.advance(8_999);
  assert.equal(throttle.rejectProbability(), 20 / 21);
  // The clock starts on a slice boundary: the failures' slice leaves the window 10 s later.
  clock.advance(1_001);
  assert.equal(throttle.rejectProbability(), 0);
});

test("the breaker's probe is never shed, and it is counted", { timeout: 5000 }, async () => {
  const { throttle, below, run, refusals, draw } = setup();
  await run(FAIL, 100);
  draw.value = 0;
  assert.equal(throttle.rejectProbability(), 100 / 101);
  assert.equal((await run(OK)).kind, 'refused');
  assert.deepEqual(await run(OK, 1, { probe: true }), OK);
  assert.equal(below.calls, 101);
  assert.deepEqual(refusals, ['throttled']);
  assert.equal(throttle.rejectProbability(), (101 - 2) / 102);
});

test('reset forgets the window; enabled: false sheds nothing', { timeout: 5000 }, async () => {
  const { throttle, run, draw } = setup();
  await run(FAIL, 50);
  draw.value = 0;
  throttle.reset();
  assert.equal(throttle.rejectProbability(), 0);
  assert.deepEqual(await run(OK), OK);
  const off = setup({ enabled: false });
  off.draw.value = 0;
  await off.run(FAIL, 50);
  assert.equal(off.throttle.rejectProbability(), 0);
  assert.deepEqual(await off.run(OK), OK);
  assert.equal(off.below.calls, 51);
});

test('with Redis the window is the fleet’s: each instance sheds on every instance’s counts, and a reset reaches them all', { timeout: 15_000 }, async (t) => {
  const redis = await startRedis(t);
  const clients = [new Redis(redis.url), new Redis(redis.url)];
  onCleanup(t, () => clients.forEach((c) => c.disconnect()));
  const clock = new ManualClock();
  // The real shared state, with a count of the reports it answered, so the test can wait for one.
  const answered = { a: 0, b: 0 };
  const [shareA, shareB] = (['a', 'b'] as const).map((name, i): OutcomeShare => {
    const state = new RedisProviderState(clients[i]!, { prefix: 'perch:', now: () => clock.now(), commandTimeoutMs: 1000 });
    return { exchange: (report) => state.exchange(report).finally(() => answered[name]++) };
  });
  const a = setup({}, shareA, clock);
  const b = setup({}, shareB, clock);

  // A alone sees the provider fail; B has seen nothing, and sheds nothing yet.
  await a.run(FAIL, 30);
  await b.run(OK, 10);
  assert.equal(b.throttle.rejectProbability(), 0);
  // Each reports at most once per slice (1 s), on its first call in it.
  await waitFor(() => answered.a === 1 && answered.b === 1);
  clock.advance(1000);
  await a.run(FAIL);
  await waitFor(() => answered.a === 2);
  assert.equal(await clients[0]!.hget('perch:{up:main}:throttle', `${Math.floor(clock.now() / 1000) - 1}:f`), '30');
  await b.run(OK);
  // B: its own 11 accepted and A's 30 reported failures: (41 - 2 * 11) / 42.
  await waitFor(() => b.throttle.rejectProbability() === 19 / 42);
  // A reported before B did: its own 31 failures alone.
  assert.equal(a.throttle.rejectProbability(), 31 / 32);

  // B's breaker probe found the provider back: B resets the fleet's window...
  b.throttle.reset();
  assert.equal(b.throttle.rejectProbability(), 0);
  await waitFor(() => answered.b === 3);
  assert.equal(await clients[0]!.hget('perch:{up:main}:throttle', 'epoch'), String(Math.floor(clock.now() / 1000)));
  // ...and A, whose next call still sheds on its old counts, forgets them at that report.
  a.draw.value = 0;
  clock.advance(1000);
  assert.equal((await a.run(OK)).kind, 'refused');
  await waitFor(() => answered.a === 3);
  assert.equal(a.throttle.rejectProbability(), 0);
  await a.run(OK, 20);
  assert.equal(a.below.calls, 51, 'nothing shed after the reset');
  assert.equal(a.throttle.rejectProbability(), 0);
});

/**
 * Two instances' throttles over the real shared state. A's exchange can be held after Redis
 * answered (`holdA`, an answer on its way back) or answer undefined as while Redis's breaker is
 * open (`downA`); `answered` counts the reports each instance has had answered.
 */
async function twoInstances(t: TestContext) {
  const redis = await startRedis(t);
  const clients = [new Redis(redis.url), new Redis(redis.url)];
  onCleanup(t, () => clients.forEach((c) => c.disconnect()));
  const clock = new ManualClock();
  const answered = { a: 0, b: 0 };
  const control = { holdA: undefined as Promise<void> | undefined, downA: false };
  const [stateA, stateB] = clients.map((c) => new RedisProviderState(c, { prefix: 'perch:', now: () => clock.now(), commandTimeoutMs: 1000 }));
  const shareA: OutcomeShare = {
    exchange: (report) => {
      if (control.downA) return undefined;
      return stateA!.exchange(report).then(async (totals) => {
        await control.holdA;
        answered.a++;
        return totals;
      });
    },
  };
  const shareB: OutcomeShare = { exchange: (report) => stateB!.exchange(report).finally(() => answered.b++) };
  const a = setup({}, shareA, clock);
  const b = setup({}, shareB, clock);
  // B has seen the provider fail 30 times and told the fleet; A has seen nothing.
  await a.run(OK);
  await b.run(FAIL, 30);
  await waitFor(() => answered.a === 1 && answered.b === 1);
  clock.advance(1000);
  await b.run(FAIL);
  await waitFor(() => answered.b === 2);
  return { clock, a, b, answered, control, window: clients[0]! };
}

test('a fleet report in flight when reset() runs cannot bring the pre-reset counts back', { timeout: 15_000 }, async (t) => {
  const { a, answered, control } = await twoInstances(t);
  let release = () => {};
  control.holdA = new Promise<void>((resolve) => (release = resolve));
  // A's report reaches Redis and its answer (B's 30 failures) is on its way back when A's
  // breaker probe succeeds and resets the window.
  await a.run(OK);
  a.throttle.reset();
  release();
  await waitFor(() => answered.a === 2);
  assert.equal(a.throttle.rejectProbability(), 0, 'the answer of a report made before the reset is not the fleet after it');
  a.draw.value = 0;
  assert.deepEqual(await a.run(OK, 20), OK);
  assert.equal(a.below.calls, 22, 'nothing shed after the probe');
});

test('a reset made while the fleet cannot be reached reaches it at the next report', { timeout: 15_000 }, async (t) => {
  const { clock, a, b, answered, control, window } = await twoInstances(t);
  control.downA = true;
  a.throttle.reset();
  control.downA = false;
  clock.advance(1000);
  await a.run(OK);
  await waitFor(() => answered.a === 2);
  assert.equal(await window.hget('perch:{up:main}:throttle', `${Math.floor(clock.now() / 1000) - 2}:f`), null, 'B\'s failures are gone from the fleet');
  assert.equal(a.throttle.rejectProbability(), 0);
  clock.advance(1000);
  await b.run(OK);
  await waitFor(() => answered.b === 3);
  assert.equal(b.throttle.rejectProbability(), 0, 'B forgets its own at its next report');
});
