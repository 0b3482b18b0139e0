import assert from 'node:assert/strict';
import { test } from 'node:test';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import type { ProviderProtectionConfig } from '../src/config/types.js';
import { IN_FLIGHT_POLL_MS, MemoryProviderState } from '../src/upstream/guard/memory-state.js';
import { ANY, CLOCK_GRANULARITY_MS as G, compileCap, type AdmitQuery, type CallCap } from '../src/upstream/guard/provider-state.js';
import { ManualClock } from './helpers/clock.js';

const PROTECTION: ProviderProtectionConfig = {
  queue_timeout_ms: 1000,
  queue_size: 1000,
  redis_down_share: 1,
  rate_limit_reserve: 0,
  cooldown_scope: 'upstream',
  usage_cap_seconds: 86_400,
  credential_recheck_seconds: 300,
  retries: 0,
  retry_budget_percent: 20,
  retry_budget_min_per_second: 1,
  retry_backoff_ms: 50,
  retry_backoff_max_ms: 1000,
  breaker: { consecutive_failures: 5, failure_ratio: 0.5, window_ms: 10_000, min_calls: 20, half_open_after_ms: 30_000, half_open_max_ms: 30_000 },
  throttle: { enabled: true, k: 2, window_ms: 10_000, min_calls: 20 },
};

let lease = 0;
function query(cap: CallCap, extra: Partial<AdmitQuery> = {}): AdmitQuery {
  return { upstream: 'main', scope: ANY, candidates: ['a'], cap, localCap: cap, leaseId: `l${++lease}`, leaseMs: 6000, payer: { id: 'k', weight: 1, label: 'k' }, ...extra };
}

/** Admits one call and, when admitted, gives it its answer at once. */
function call(state: MemoryProviderState, cap: CallCap): string {
  const q = query(cap);
  const admission = state.admit(q);
  if (admission.kind === 'admitted') state.finish('main', q.leaseId);
  return admission.kind;
}

test('the rate cap admits the burst, then never more than the rate in any one-second window, and no clump while calls wait', { timeout: 5000 }, () => {
  const clock = new ManualClock();
  const state = new MemoryProviderState(clock);
  const cap = compileCap({ ...PROTECTION, max_requests_per_second: 10, burst: 10 });
  for (let i = 0; i < 10; i++) assert.equal(call(state, cap), 'admitted', `call ${i}`);
  // The bucket refills 1 token per 100 ms, but the window holds 10 calls until the first ages out,
  // a millisecond past the window: marks are whole milliseconds.
  assert.deepEqual(state.admit(query(cap)), { kind: 'over_cap', waitMs: 1000 + G });
  clock.advance(500);
  assert.deepEqual(state.admit(query(cap)), { kind: 'over_cap', waitMs: 500 + G });
  clock.advance(500);
  assert.deepEqual(state.admit(query(cap)), { kind: 'over_cap', waitMs: G }, 'a call marked t may have been answered at t + 0.999');
  clock.advance(G);
  // Calls waited for the window all along, so the bucket saved no burst: one call goes, and the
  // rest follow one refill apart instead of repeating the first second's clump.
  assert.equal(call(state, cap), 'admitted');
  const gaps: number[] = [];
  for (let i = 0; i < 12; i++) {
    const admission = state.admit(query(cap));
    assert.equal(admission.kind, 'over_cap', `paced call ${i}`);
    const waitMs = (admission as { waitMs: number }).waitMs;
    gaps.push(waitMs);
    clock.advance(waitMs);
    assert.equal(call(state, cap), 'admitted', `paced call ${i}`);
  }
  // Nine refills, then the first paced call's window ends a millisecond after the tenth refill.
  assert.deepEqual(gaps, [100, 100, 100, 100, 100, 100, 100, 100, 100, 100 + G, 100, 100]);
});

test('a cap that was idle for a window bursts again', { timeout: 5000 }, () => {
  const clock = new ManualClock();
  const state = new MemoryProviderState(clock);
  const cap = compileCap({ ...PROTECTION, max_requests_per_second: 10, burst: 10 });
  for (let i = 0; i < 10; i++) assert.equal(call(state, cap), 'admitted', `call ${i}`);
  // Nobody asked while the window was full: nothing waited, so the bucket refilled whole.
  clock.advance(1000 + G);
  for (let i = 0; i < 10; i++) assert.equal(call(state, cap), 'admitted', `second window, call ${i}`);
  assert.equal(call(state, cap), 'over_cap');
});

test('a call counts in the window from its start until a window after its answer', { timeout: 5000 }, () => {
  const clock = new ManualClock();
  const state = new MemoryProviderState(clock);
  const cap = compileCap({ ...PROTECTION, max_requests_per_second: 1 });
  const slow = query(cap);
  assert.equal(state.admit(slow).kind, 'admitted');
  clock.advance(1500);
  // Still in flight: it may reach the provider any moment, so it holds the window.
  assert.deepEqual(state.admit(query(cap)), { kind: 'over_cap', waitMs: IN_FLIGHT_POLL_MS });
  state.finish('main', slow.leaseId);
  assert.deepEqual(state.admit(query(cap)), { kind: 'over_cap', waitMs: 1000 + G });
  clock.advance(1000 + G);
  assert.equal(call(state, cap), 'admitted');
});

test('a burst smaller than the rate spaces calls by the refill', { timeout: 5000 }, () => {
  const clock = new ManualClock();
  const state = new MemoryProviderState(clock);
  const cap = compileCap({ ...PROTECTION, max_requests_per_second: 10, burst: 2 });
  assert.equal(call(state, cap), 'admitted');
  assert.equal(call(state, cap), 'admitted');
  assert.deepEqual(state.admit(query(cap)), { kind: 'over_cap', waitMs: 100 });
  clock.advance(100);
  assert.equal(call(state, cap), 'admitted');
});

test('a rate under one per second gets a window that holds one call', { timeout: 5000 }, () => {
  const clock = new ManualClock();
  const state = new MemoryProviderState(clock);
  const cap = compileCap({ ...PROTECTION, max_requests_per_second: 0.2 });
  assert.deepEqual(cap.rate, { perSecond: 0.2, burst: 1, windowLimit: 1, windowMs: 5000 });
  assert.equal(call(state, cap), 'admitted');
  assert.deepEqual(state.admit(query(cap)), { kind: 'over_cap', waitMs: 5000 + G });
  clock.advance(5000 + G);
  assert.equal(call(state, cap), 'admitted');
});

test('the quota is a sliding window: never more than its requests in any window', { timeout: 5000 }, () => {
  const clock = new ManualClock();
  const state = new MemoryProviderState(clock);
  const cap = compileCap({ ...PROTECTION, quota: { requests: 3, per_seconds: 900 } });
  assert.equal(call(state, cap), 'admitted');
  clock.advance(100_000);
  assert.equal(call(state, cap), 'admitted');
  assert.equal(call(state, cap), 'admitted');
  assert.deepEqual(state.admit(query(cap)), { kind: 'over_cap', waitMs: 800_000 + G });
  clock.advance(800_000 + G);
  assert.equal(call(state, cap), 'admitted');
  assert.deepEqual(state.admit(query(cap)), { kind: 'over_cap', waitMs: 100_000 });
});

test('max_concurrent holds a slot until the call is released or its lease ends', { timeout: 5000 }, () => {
  const clock = new ManualClock();
  const state = new MemoryProviderState(clock);
  const cap = compileCap({ ...PROTECTION, max_concurrent: 1 });
  const first = query(cap, { leaseMs: 6000 });
  assert.equal(state.admit(first).kind, 'admitted');
  assert.equal(state.admit(query(cap)).kind, 'over_cap');
  state.finish('main', first.leaseId);
  const second = query(cap);
  assert.equal(state.admit(second).kind, 'admitted');
  clock.advance(6000);
  assert.equal(state.admit(query(cap)).kind, 'admitted', 'an expired lease frees its slot');
});

test('stops pick the first free credential and report the earliest end when all are stopped', { timeout: 5000 }, () => {
  const clock = new ManualClock();
  const state = new MemoryProviderState(clock);
  const now = clock.now();
  const cap = compileCap(PROTECTION);
  const candidates = ['a', 'b'];
  state.stop({ upstream: 'main', credential: 'a', scope: ANY, untilMs: now + 30_000, state: 'cooling_down' });
  assert.deepEqual(state.admit(query(cap, { candidates })), { kind: 'admitted', credential: 'b' });
  state.stop({ upstream: 'main', credential: 'b', scope: 'user', untilMs: now + 10_000, state: 'cooling_down' });
  assert.deepEqual(state.admit(query(cap, { candidates, scope: 'user' })), { kind: 'stopped', untilMs: now + 10_000, state: 'cooling_down' });
  assert.deepEqual(state.admit(query(cap, { candidates, scope: 'tweet' })), { kind: 'admitted', credential: 'b' });
  // A stop of the whole upstream covers every credential.
  state.stop({ upstream: 'main', credential: ANY, scope: ANY, untilMs: now + 60_000, state: 'breaker_open' });
  assert.deepEqual(state.admit(query(cap, { candidates, scope: 'tweet' })), { kind: 'stopped', untilMs: now + 60_000, state: 'breaker_open' });
  // Lifting a breaker's stop leaves a provider's stop under the same key alone, and vice versa.
  state.lift('main', ANY, ANY, 'cooling_down');
  assert.equal(state.admit(query(cap, { candidates, scope: 'tweet' })).kind, 'stopped');
  state.lift('main', ANY, ANY, 'breaker_open');
  clock.advance(10_000);
  assert.deepEqual(state.admit(query(cap, { candidates, scope: 'user' })), { kind: 'admitted', credential: 'b' });
  // Other upstreams are untouched by all of it.
  assert.equal(state.admit(query(cap, { upstream: 'other', candidates: ['a'] })).kind, 'admitted');
});

test('a shorter stop never cuts a longer one short (a 429 inside a usage cap)', { timeout: 5000 }, () => {
  const clock = new ManualClock();
  const state = new MemoryProviderState(clock);
  const now = clock.now();
  state.stop({ upstream: 'main', credential: 'a', scope: ANY, untilMs: now + 86_400_000, state: 'usage_capped' });
  state.stop({ upstream: 'main', credential: 'a', scope: ANY, untilMs: now + 5_000, state: 'cooling_down' });
  clock.advance(5_000);
  assert.deepEqual(state.admit(query(compileCap(PROTECTION))), { kind: 'stopped', untilMs: now + 86_400_000, state: 'usage_capped' });
});

test('redis_down_share scales every part of the cap', { timeout: 5000 }, () => {
  const cap = compileCap({ ...PROTECTION, max_requests_per_second: 10, burst: 10, max_concurrent: 8, quota: { requests: 900, per_seconds: 900 } }, 0.5);
  assert.deepEqual(cap, { rate: { perSecond: 5, burst: 5, windowLimit: 5, windowMs: 1000 }, quota: { requests: 450, windowMs: 900_000 }, maxConcurrent: 4 });
});

test('calls the shared state admitted count in memory too, and leave it once their window has passed', { timeout: 5000 }, () => {
  const clock = new ManualClock();
  const state = new MemoryProviderState(clock);
  const cap: CallCap = { quota: { requests: 3, windowMs: 1000 }, maxConcurrent: 5 };
  const t0 = clock.now();
  const recorded = [query(cap), query(cap), query(cap)];
  for (const q of recorded) state.record(q);
  state.finish('main', recorded[0]!.leaseId);
  assert.equal(state.admit(query(cap)).kind, 'over_cap', 'the fallback starts from the three recorded calls');
  assert.deepEqual(
    state.held('main').map((call) => [call.quota! - t0, call.lease === undefined ? undefined : call.lease - t0]),
    [
      [0, undefined],
      [6000, 6000],
      [6000, 6000],
    ],
  );
  for (const q of recorded.slice(1)) state.finish('main', q.leaseId);
  clock.advance(1000 + G);
  state.record(query(cap));
  assert.deepEqual(
    state.held('main').map((call) => call.quota! - t0),
    [1000 + G + 6000],
    'a busy cap served from Redis keeps no more here than its window holds',
  );
});

test("a month's quota holds the same memory after 200,000 calls as after 1,000, and still caps", { timeout: 60_000 }, () => {
  setFlagsFromString('--expose-gc');
  const gc = runInNewContext('gc') as () => void;
  const clock = new ManualClock();
  const state = new MemoryProviderState(clock);
  const cap = compileCap({ ...PROTECTION, quota: { requests: 200_000, per_seconds: 2_678_400 } });
  const heap = () => {
    gc();
    return process.memoryUsage().heapUsed;
  };
  const t0 = clock.now();
  let base = 0;
  for (let i = 0; i < 200_000; i++) {
    const q = query(cap);
    assert.equal(state.admit(q).kind, 'admitted');
    clock.advance(1);
    state.finish('main', q.leaseId);
    if (i === 999) base = heap();
  }
  const grown = heap() - base;
  assert.ok(grown < 4 * 2 ** 20, `the state grew by ${grown} bytes over 199,000 calls`);
  // The first call was answered at t0 + 1 and counts until a window and a millisecond later;
  // a slice of the window (2,616 s / 1,024) is the most it may count longer.
  const refused = state.admit(query(cap));
  assert.equal(refused.kind, 'over_cap');
  const exact = t0 + 1 + 2_678_400_000 + G - clock.now();
  const wait = (refused as { waitMs: number }).waitMs;
  assert.ok(wait >= exact && wait < exact + Math.ceil(2_678_400_000 / 1024), `waits ${wait} ms, exact ${exact}`);
  clock.advance(wait - 1);
  assert.equal(state.admit(query(cap)).kind, 'over_cap', 'a millisecond early is still over the quota');
  clock.advance(1);
  assert.equal(state.admit(query(cap)).kind, 'admitted');
});
