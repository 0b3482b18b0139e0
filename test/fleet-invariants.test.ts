import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { planAt, planDuring, type CallEvent, type ConfigEvent, type FaultEvent, type History, type MetricsEvent, type ProcEvent, type PurgeEvent, type RequestEvent, type RunEvent, type StdoutEvent } from '../fleet/history.js';
import {
  acceptedKeyReadsCache,
  accessLinesMatch,
  authFollowsReload,
  authOnlyAccepted,
  leaseAllowance,
  liveness,
  metricsMatchHistory,
  notModifiedMatches,
  perKeyBudget,
  providerConcurrency,
  providerQuota,
  providerRate,
  providerStops,
  purgeWins,
  rateLimitUpper,
  refusalOnlyOverCap,
  staleWithinBound,
  stdoutWholeJson,
  termWithinGrace,
  underPlanNeverRefused,
  versionsMonotonic,
  type Invariant,
} from '../fleet/invariants.js';

// Hand-made histories: one that keeps each promise and one that breaks it by the least.

const RUN: RunEvent = {
  t: 'run',
  seed: 1,
  instances: 2,
  workers: 0,
  perch: '.',
  passThrough: false,
  batch: false,
  caps: { rate: 2, maxConcurrent: 2, quota: { requests: 5, perSeconds: 10 }, downShare: 0.5 },
  plans: { small: { capacity: 3, refill: 1 }, budgeted: { capacity: 50, refill: 10, budget: 2 } },
  keys: { alpha: 'small', budget: 'budgeted' },
  ttl: 2,
  staleSeconds: 3,
  missDeadlineMs: 2000,
  graceMs: 1000,
  budgetPrefix: '/v1/users/77',
};

function history(parts: Partial<Omit<History, 'run'>> & { run?: Partial<RunEvent> } = {}): History {
  return {
    configs: [],
    requests: [],
    calls: [],
    purges: [],
    faults: [],
    procs: [],
    stdouts: [],
    ...parts,
    run: { ...RUN, ...parts.run },
  };
}

let ids = 0;
function call(start: number, extra: Partial<CallEvent> = {}): CallEvent {
  return { t: 'call', id: ++ids, upstream: 'v1', path: '/v1/users/1', resources: ['/v1/users/1'], cred: 'c1', start, end: start + 10, status: 200, versions: [1], ...extra };
}
function req(sent: number, extra: Partial<RequestEvent> = {}): RequestEvent {
  return { t: 'req', id: `r${++ids}`, inst: 0, gen: 1, key: 'alpha', path: '/v1/users/1', sent, done: sent + 5, status: 200, version: 1, cache: 'perch; hit', ...extra };
}
const limited = (sent: number): RequestEvent => {
  const { cache: _cache, version: _version, ...rest } = req(sent, { status: 429 });
  return rest;
};
const purge = (sent: number, scope = '/v1/users/1'): PurgeEvent => ({ t: 'purge', inst: 0, scope, sent, done: sent + 5, status: 200 });
const redisKill = (at: number): FaultEvent => ({ t: 'fault', kind: 'redis-kill', at, until: at + 500 });
/** The fleet up at t=0, so its start is long past at the times below. */
const STARTED: ProcEvent = { t: 'proc', inst: 0, gen: 1, kind: 'start', at: -60_000 };

function names(inv: Invariant, h: History): { count: number; open: (number | undefined)[] } {
  const found = inv.check(h);
  return { count: found.length, open: found.map((v) => v.openIssue) };
}

describe('fleet invariants', () => {
  it('providerRate: 2 calls in a second pass a cap of 2, a third is caught, Redis fault or not', () => {
    assert.equal(names(providerRate, history({ procs: [STARTED], calls: [call(0), call(500), call(1000)] })).count, 0);
    assert.deepEqual(names(providerRate, history({ procs: [STARTED], calls: [call(0), call(500), call(800)] })), { count: 1, open: [undefined] });
    // Redis killed at 600 after instance 0 made 2: each keeps max(1, floor(2 x 0.5)) = 1, so max(2, 2 + 1) = 3.
    const before = [call(0, { inst: 0 }), call(500, { inst: 0 })];
    assert.equal(names(providerRate, history({ procs: [STARTED], faults: [redisKill(600)], calls: [...before, call(800, { inst: 1 })] })).count, 0);
    assert.deepEqual(names(providerRate, history({ procs: [STARTED], faults: [redisKill(600)], calls: [...before, call(780, { inst: 0 }), call(800, { inst: 1 })] })), { count: 1, open: [undefined] });
    // Restarted with its data: its writes paused, saved and killed first, away from all the same.
    const restart: FaultEvent = { t: 'fault', kind: 'redis-restart', at: 600, until: 1500 };
    assert.equal(names(providerRate, history({ procs: [STARTED], faults: [restart], calls: [...before, call(800, { inst: 1 })] })).count, 0);
    assert.equal(names(providerRate, history({ procs: [STARTED], faults: [restart], calls: [...before, call(780, { inst: 0 }), call(800, { inst: 1 })] })).count, 1);
  });

  it('providerQuota: 5 calls in 10 s pass a quota of 5, a sixth is caught', () => {
    const five = [0, 1000, 2000, 3000, 4000].map((t) => call(t));
    assert.equal(providerQuota.check(history({ procs: [STARTED], calls: [...five, call(10_000)] })).length, 0);
    assert.equal(providerQuota.check(history({ procs: [STARTED], calls: [...five, call(9_000)] })).length, 1);
  });

  it('providerQuota: across a Redis restart, max(quota, sum of max(r_i, share x quota)), no more', () => {
    // Instance 0 spent all 5 before the kill; instance 1 keeps its share, floor(5 x 0.5) = 2: 7 in all.
    const before = [0, 1000, 2000, 3000, 4000].map((t) => call(t, { inst: 0 }));
    const after = (n: number) => Array.from({ length: n }, (_, k) => call(6000 + k * 100, { inst: 1 }));
    assert.equal(providerQuota.check(history({ procs: [STARTED], faults: [redisKill(5000)], calls: [...before, ...after(2)] })).length, 0);
    const found = providerQuota.check(history({ procs: [STARTED], faults: [redisKill(5000)], calls: [...before, ...after(3)] }));
    assert.equal(found.length, 1);
    assert.equal(found[0]!.openIssue, undefined);
    assert.match(found[0]!.message, /8 calls in 10000 ms from t=0, quota 7 \(5 \+ 2 for the Redis faults around it\)$/);
  });

  it('providerQuota: one instance cut off adds its share beyond what it spent; a worker process its own share', () => {
    const cut: FaultEvent = { t: 'fault', kind: 'relay-cut', at: 3000, until: 4000, inst: 1 };
    // The others spend the quota through Redis; instance 1 had made 1, its share is 2: one more.
    const calls = [call(0, { inst: 1 }), ...[1000, 2000, 3500, 4500].map((t) => call(t, { inst: 0 }))];
    assert.equal(providerQuota.check(history({ procs: [STARTED], faults: [cut], calls: [...calls, call(5000, { inst: 1 })] })).length, 0);
    assert.equal(providerQuota.check(history({ procs: [STARTED], faults: [cut], calls: [...calls, call(5000, { inst: 1 }), call(5100, { inst: 1 })] })).length, 1);
    // Its call stamped 100 ms into the cut may be from its share: counted as spent before, it would allow none.
    assert.equal(providerQuota.check(history({ procs: [STARTED], faults: [cut], calls: [...calls, call(3100, { inst: 1 })] })).length, 0);
    // Instance 1 as two worker processes: 2 more shares... its 1 spent counted once: max(1, 2) + 2 - 1 = 3 more.
    const workers = { procs: [STARTED], faults: [{ ...cut, inst: 0 }], run: { workers: 2 } };
    const spent = [call(0, { inst: 0 }), ...[1000, 2000, 3500, 4500].map((t) => call(t, { inst: 1 }))];
    const more = (n: number) => Array.from({ length: n }, (_, k) => call(5000 + k * 100, { inst: 0 }));
    assert.equal(providerQuota.check(history({ ...workers, calls: [...spent, ...more(3)] })).length, 0);
    assert.equal(providerQuota.check(history({ ...workers, calls: [...spent, ...more(4)] })).length, 1);
  });

  it('providerConcurrency: 2 calls overlapping pass max_concurrent 2, 3 are caught', () => {
    const long = (start: number) => call(start, { end: start + 1000 });
    assert.equal(providerConcurrency.check(history({ procs: [STARTED], calls: [long(0), long(100), long(1000)] })).length, 0);
    assert.equal(providerConcurrency.check(history({ procs: [STARTED], calls: [long(0), long(100), long(200)] })).length, 1);
  });

  it('providerRate: a guard still away after the fault it explains (its breaker cooling down) is one instance away', () => {
    const freeze: FaultEvent = { t: 'fault', kind: 'redis-freeze', at: 1000, until: 2000 };
    const down: FaultEvent = { t: 'fault', kind: 'guard-down', at: 1500, until: 4000, inst: 1, detail: "from perch's log" };
    // Cap 2 a second, share 0.5: the others through Redis take the cap, instance 1 its share of 1 on its own.
    const calls = [call(3000, { inst: 0 }), call(3100, { inst: 0 }), call(3200, { inst: 1 })];
    assert.equal(providerRate.check(history({ procs: [STARTED], faults: [freeze, down], calls })).length, 0);
    assert.equal(providerRate.check(history({ procs: [STARTED], faults: [freeze], calls })).length, 1);
    assert.equal(providerRate.check(history({ procs: [STARTED], faults: [freeze, down], calls: [...calls, call(3300, { inst: 1 })] })).length, 1, 'its share is 1');
  });

  it('providerConcurrency: across a Redis outage, the outage bound: an instance with 2 in flight, the other adds its share of 1', () => {
    const long = (start: number, inst: number) => call(start, { end: start + 1000, inst });
    const calls = [long(0, 0), long(100, 0), long(300, 1)];
    assert.equal(providerConcurrency.check(history({ procs: [STARTED], faults: [redisKill(200)], calls })).length, 0);
    assert.equal(providerConcurrency.check(history({ procs: [STARTED], calls })).length, 1);
    assert.equal(providerConcurrency.check(history({ procs: [STARTED], faults: [redisKill(200)], calls: [...calls, long(400, 1)] })).length, 1, 'its share is 1');
  });

  it('providerStops: a call within the stop around a Redis fault is advisory: the stop reaches the others once Redis can carry it', () => {
    const stop = call(0, { status: 429, retryAfter: 2, end: 10 });
    const [violation] = providerStops.check(history({ faults: [redisKill(200)], calls: [stop, call(1500)] }));
    assert.equal(violation?.advisory, true);
    assert.equal(providerStops.check(history({ calls: [stop, call(1500)] }))[0]?.advisory, undefined);
  });

  it('providerStops: no call on a credential within Retry-After of its 429; the other credential may go on', () => {
    const stop = call(0, { status: 429, retryAfter: 2, end: 10 });
    assert.equal(providerStops.check(history({ calls: [stop, call(500, { cred: 'c2' }), call(2100)] })).length, 0);
    assert.equal(providerStops.check(history({ calls: [stop, call(1500)] })).length, 1);
    // An instance cut off from Redis keeps to its own stops: another instance's 429 is not one.
    const heard = call(0, { status: 429, retryAfter: 2, end: 10, inst: 0 });
    const cut: FaultEvent = { t: 'fault', kind: 'relay-cut', at: 1000, until: 3000, inst: 2 };
    assert.equal(providerStops.check(history({ faults: [cut], calls: [heard, call(1500, { inst: 2 })] })).length, 0);
    assert.equal(providerStops.check(history({ faults: [cut], calls: [heard, call(1500, { inst: 0 })] })).length, 1);
    assert.equal(providerStops.check(history({ faults: [cut], calls: [heard, call(900, { inst: 2 })] })).length, 1);
  });

  it('providerStops: after a 401, one more 401 per process that learns it for itself, until a reload', () => {
    const reject = call(0, { status: 401 });
    const again = (t: number) => call(t, { status: 401 });
    const two = [STARTED, { ...STARTED, inst: 1 }];
    assert.equal(providerStops.check(history({ procs: two, calls: [reject, again(1000), again(2000)] })).length, 0);
    assert.equal(providerStops.check(history({ procs: two, calls: [reject, again(1000), again(2000), again(3000)] })).length, 1);
    assert.equal(providerStops.check(history({ procs: two, calls: [reject, again(1000), again(2000), again(5000)], configs: [{ t: 'config', at: 4000, caps: RUN.caps, ttl: 2 }] })).length, 0);
  });

  it('providerStops: a 401 after a reload put the credential back takes it out again, and the 401s after it are held to it', () => {
    const again = (t: number) => call(t, { status: 401 });
    const two = [STARTED, { ...STARTED, inst: 1 }];
    const configs: ConfigEvent[] = [{ t: 'config', at: 4000, caps: RUN.caps, ttl: 2 }];
    assert.equal(providerStops.check(history({ procs: two, configs, calls: [again(0), again(5000), again(6000), again(7000)] })).length, 0);
    assert.equal(providerStops.check(history({ procs: two, configs, calls: [again(0), again(5000), again(6000), again(7000), again(8000)] })).length, 1);
    // credential_recheck_seconds (300 s) tries it again: one recheck starts its own count.
    assert.equal(providerStops.check(history({ procs: two, calls: [again(0), again(301_000), again(302_000), again(303_000), again(304_000)] })).length, 1);
  });

  it('providerQuota: a guard that found Redis away with no fault made (its log) gets its share; one a fault explains, nothing more', () => {
    const down: FaultEvent = { t: 'fault', kind: 'guard-down', at: 3000, until: 4000, inst: 1, detail: "from perch's log" };
    const calls = [call(0, { inst: 1 }), ...[1000, 2000, 3500, 4500].map((t) => call(t, { inst: 0 })), call(5000, { inst: 1 })];
    assert.equal(providerQuota.check(history({ procs: [STARTED], calls })).length, 1);
    assert.equal(providerQuota.check(history({ procs: [STARTED], faults: [down], calls })).length, 0);
    // The relay cut that made it already allows instance 1 its share: the log line adds nothing.
    const cut: FaultEvent = { t: 'fault', kind: 'relay-cut', at: 2900, until: 4100, inst: 1 };
    const more = [...calls, call(5100, { inst: 1 })];
    assert.equal(providerQuota.check(history({ procs: [STARTED], faults: [cut], calls: more })).length, 1);
    assert.equal(providerQuota.check(history({ procs: [STARTED], faults: [cut, down], calls: more })).length, 1);
  });

  it('perKeyBudget: the budget key\'s paths get at most its limit of calls', () => {
    const budgetCall = (t: number) => call(t, { path: `/v1/users/77${t}`, resources: [`/v1/users/77${t}`] });
    assert.equal(perKeyBudget.check(history({ calls: [budgetCall(1), budgetCall(2), call(3)] })).length, 0);
    assert.equal(perKeyBudget.check(history({ calls: [budgetCall(1), budgetCall(2), budgetCall(3)] })).length, 1);
  });

  it('perKeyBudget: across a Redis outage, each instance charges within its share of the limit', () => {
    const budgetCall = (t: number, inst: number) => call(t, { inst, path: `/v1/users/77${t}`, resources: [`/v1/users/77${t}`] });
    const freeze: FaultEvent = { t: 'fault', kind: 'redis-freeze', at: 1000, until: 2000 };
    const run = { plans: { ...RUN.plans, budgeted: { capacity: 50, refill: 10, budget: 4 } } };
    // Limit 4, share 0.5: 2 each. Instance 0 charged 3 before the freeze, instance 1 none: 3 + 2.
    const before = [budgetCall(100, 0), budgetCall(200, 0), budgetCall(300, 0)];
    assert.equal(perKeyBudget.check(history({ run, faults: [freeze], calls: [...before, budgetCall(1500, 1), budgetCall(1600, 1)] })).length, 0);
    const over = perKeyBudget.check(history({ run, faults: [freeze], calls: [...before, budgetCall(1500, 1), budgetCall(1600, 1), budgetCall(1700, 0)] }));
    assert.equal(over.length, 1);
    assert.equal(over[0]!.openIssue, undefined);
  });

  it('rateLimitUpper: capacity 3 + 1/s: 4 admitted at once are within the edge allowance, 5 are not', () => {
    assert.equal(rateLimitUpper.check(history({ procs: [STARTED], requests: [req(0), req(1), req(2), req(3)] })).length, 0);
    const five = history({ procs: [STARTED], requests: [req(0), req(1), req(2), req(3), req(4)] });
    assert.deepEqual(names(rateLimitUpper, five), { count: 1, open: [undefined] });
    // Refused requests spend nothing.
    assert.equal(rateLimitUpper.check(history({ procs: [STARTED], requests: [req(0), req(1), req(2), req(3), limited(4)] })).length, 0);
  });

  it('rateLimitUpper: with leases, what was on lease as the window began; a run held to the plan from its first sending to its last answer', () => {
    const leased = { run: { plans: { small: { capacity: 100, refill: 10 } } }, procs: [STARTED] };
    // A key quiet before: a lease or two of a few tokens per process, 4 each: 100 + 10 x (0.016 + 0.15) + 1 + 8: 110.7.
    const burst = (n: number, from = 0) => Array.from({ length: n }, (_, i) => req(from + i / 10));
    assert.equal(rateLimitUpper.check(history({ ...leased, requests: burst(110) })).length, 0);
    assert.equal(rateLimitUpper.check(history({ ...leased, requests: burst(111) })).length, 1);
    // Busy before (20 answered in the 2 s before the burst), at a refill of 100: three times that, up
    // to the lease allowance, 2 x 2 x 10: 100 + 100 x (0.0207 + 0.15) + 1 + 40: 158.1.
    const fast = { run: { plans: { small: { capacity: 100, refill: 100 } } }, procs: [STARTED] };
    const busy = Array.from({ length: 20 }, (_, i) => req(-1900 + i * 90));
    assert.equal(rateLimitUpper.check(history({ ...fast, requests: [...busy, ...burst(158)] })).length, 0);
    assert.equal(rateLimitUpper.check(history({ ...fast, requests: [...busy, ...burst(159)] })).length, 1);
    assert.equal(rateLimitUpper.check(history({ ...fast, requests: burst(127) })).length, 1, 'quiet before: 126.1');
    // Answers that took a second: the plan's refill over that second counts.
    const slow = (sent: number) => req(sent, { done: sent + 1000 });
    assert.equal(rateLimitUpper.check(history({ procs: [STARTED], requests: [slow(0), slow(1), slow(2), slow(3), slow(4)] })).length, 0);
  });

  it('rateLimitUpper: across a Redis fault, each process spends what it last saw left, or a full bucket if it saw nothing', () => {
    const freeze: FaultEvent = { t: 'fault', kind: 'redis-freeze', at: 1000, until: 2000 };
    const seen = (sent: number, r: number) => req(sent, { ratelimit: `"small";r=${r};t=3` });
    const before = [seen(0, 2), seen(1, 1), seen(2, 0), seen(3, 0)];
    const during = (n: number, inst: number) => Array.from({ length: n }, (_, i) => req(1000 + i, { inst }));
    // Capacity 3 + 1/s over 1.005 s, + 1 + its 0.15 s: 5.2; instance 0 saw 0 left: + 1 + 1.0 of refill.
    assert.equal(rateLimitUpper.check(history({ procs: [STARTED], faults: [freeze], requests: [...before, ...during(2, 0)] })).length, 0);
    assert.equal(rateLimitUpper.check(history({ procs: [STARTED], faults: [freeze], requests: [...before, ...during(4, 0)] })).length, 1, 'a memory bucket that started full');
    // Instance 1 never answered the key: its memory bucket starts full, 3 + 1.0.
    assert.equal(rateLimitUpper.check(history({ procs: [STARTED], faults: [freeze], requests: [...before, ...during(4, 1)] })).length, 0);
    assert.equal(rateLimitUpper.check(history({ procs: [STARTED], faults: [freeze], requests: [...before, ...during(8, 1)] })).length, 1);
    // Without the fault, the plan alone.
    assert.equal(rateLimitUpper.check(history({ procs: [STARTED], requests: [...before, ...during(2, 0)] })).length, 1);
  });

  it('rateLimitUpper: the outage an instance logged for a fault made is that fault\'s, allowed once', () => {
    const freeze: FaultEvent = { t: 'fault', kind: 'redis-freeze', at: 1000, until: 2000 };
    // Instance 1's log: Redis away from a little before the freeze (its clock) to after it.
    const logged = (at: number, until: number): FaultEvent => ({ t: 'fault', kind: 'redis-seen', at, until, inst: 1 });
    const before = [0, 1, 2, 3].map((t) => req(t, { ratelimit: `"small";r=${Math.max(0, 2 - t)};t=3` }));
    const during = (n: number) => Array.from({ length: n }, (_, i) => req(1000 + i, { inst: 1 }));
    // 5.2 for the plan, + 2.0 for instance 0 (it saw 0 left), + 4.0 for instance 1 (full): 11.2.
    assert.equal(rateLimitUpper.check(history({ procs: [STARTED], faults: [freeze, logged(900, 2500)], requests: [...before, ...during(4)] })).length, 0);
    assert.equal(rateLimitUpper.check(history({ procs: [STARTED], faults: [freeze, logged(900, 2500)], requests: [...before, ...during(8)] })).length, 1);
    // The log alone, no fault made: its own outage, allowed.
    assert.equal(rateLimitUpper.check(history({ procs: [STARTED], faults: [logged(900, 2500)], requests: [...before, ...during(4)] })).length, 0);
  });

  it('underPlanNeverRefused: a refusal with the bucket empty passes, one with tokens left is caught', () => {
    assert.equal(underPlanNeverRefused.check(history({ procs: [STARTED], requests: [req(0), req(1), req(2), limited(3)] })).length, 0);
    assert.equal(underPlanNeverRefused.check(history({ procs: [STARTED], requests: [req(0), limited(3)] })).length, 1);
    // Three seconds later the bucket has refilled three tokens.
    assert.equal(underPlanNeverRefused.check(history({ procs: [STARTED], requests: [req(0), req(1), req(2), limited(3000)] })).length, 1);
  });

  it('underPlanNeverRefused: requests sent while a refused one was on its way may have spent the tokens', () => {
    const slow = { ...limited(0), done: 50 };
    assert.equal(underPlanNeverRefused.check(history({ procs: [STARTED], requests: [slow, req(10), req(20), req(30)] })).length, 0);
    assert.equal(underPlanNeverRefused.check(history({ procs: [STARTED], requests: [slow, req(60), req(70), req(80)] })).length, 1);
  });

  it('underPlanNeverRefused: with leases, early refusals pass within the allowance for a second, not longer', () => {
    const big = { run: { plans: { small: { capacity: 100, refill: 1 } } }, procs: [STARTED] };
    // 100 tokens, 2 instances: an allowance of 2 x 2 x min(10, 25) = 40.
    const spent = Array.from({ length: 70 }, (_, i) => req(i));
    assert.equal(underPlanNeverRefused.check(history({ ...big, requests: [...spent, limited(100), limited(900)] })).length, 0);
    assert.equal(underPlanNeverRefused.check(history({ ...big, requests: [...spent, limited(100), limited(1200)] })).length, 1);
    assert.equal(underPlanNeverRefused.check(history({ ...big, requests: [...spent.slice(0, 50), limited(100)] })).length, 1);
    // An admission between: each refusal while a different lease was out, not one stretch.
    assert.equal(underPlanNeverRefused.check(history({ ...big, requests: [...spent, limited(100), req(600), limited(1200), req(1700), limited(2200)] })).length, 0);
    // The processes that lease: an instance with workers counts one per worker (2 + 1: 2 x 3 x 10 = 60).
    assert.equal(underPlanNeverRefused.check(history({ ...big, run: { ...big.run, workers: 2 }, requests: [...spent.slice(0, 50), limited(100)] })).length, 0);
  });

  it('leaseAllowance: nothing under 20 tokens, two leases per instance above', () => {
    assert.equal(leaseAllowance({ capacity: 15, refill: 5 }, 3), 0);
    assert.equal(leaseAllowance({ capacity: 1000, refill: 100 }, 2), 400);
  });

  it('purgeWins: after a purge the body must come from a call begun after it', () => {
    const before = call(0, { versions: [1] });
    const after = call(120, { versions: [2] });
    assert.equal(purgeWins.check(history({ calls: [before, after], purges: [purge(100)], requests: [req(200, { version: 2 })] })).length, 0);
    // A purge that did nothing; a request that joined a flight begun before the purge.
    assert.deepEqual(names(purgeWins, history({ calls: [before], purges: [purge(100)], requests: [req(200, { version: 1 })] })), { count: 1, open: [undefined] });
    assert.deepEqual(names(purgeWins, history({ calls: [call(0, { end: 150 })], purges: [purge(100)], requests: [req(120, { version: 1 })] })), { count: 1, open: [undefined] });
    // Another resource's purge is no concern of this one.
    assert.equal(purgeWins.check(history({ calls: [before], purges: [purge(100, '/v1/users/2')], requests: [req(200, { version: 1 })] })).length, 0);
    // An instance cut off from Redis misses the purge until a second after it is back.
    const cut: FaultEvent = { t: 'fault', kind: 'relay-cut', at: 50, until: 1000, inst: 0 };
    assert.equal(purgeWins.check(history({ faults: [cut], calls: [before], purges: [purge(100)], requests: [req(1900, { version: 1 })] })).length, 0);
    assert.equal(purgeWins.check(history({ faults: [cut], calls: [before], purges: [purge(100)], requests: [req(2100, { version: 1 })] })).length, 1);
    assert.equal(purgeWins.check(history({ faults: [{ ...cut, inst: 1 }], calls: [before], purges: [purge(100)], requests: [req(200, { version: 1 })] })).length, 1);
    // Not what it reads in Redis once it is back: that is judged by the counters read with it.
    assert.equal(purgeWins.check(history({ faults: [cut], calls: [before], purges: [purge(100)], requests: [req(1100, { version: 1, cache: 'perch; hit; ttl=20; detail=redis' })] })).length, 1);
  });

  it('versionsMonotonic: one instance never goes back to an older body', () => {
    assert.equal(versionsMonotonic.check(history({ requests: [req(0, { version: 1 }), req(100, { version: 2 }), req(200, { version: 2 })] })).length, 0);
    assert.equal(versionsMonotonic.check(history({ requests: [req(0, { version: 2 }), req(100, { version: 1 })] })).length, 1);
    // Another instance may be behind.
    assert.equal(versionsMonotonic.check(history({ requests: [req(0, { version: 2 }), req(100, { version: 1, inst: 1 })] })).length, 0);
  });

  it('versionsMonotonic: the newest body answered before a request counts, though an older one was answered after it', () => {
    // v3 answered at t=50, v1 (sent earlier) at t=100: v3 is what the instance had served when t=200 was sent.
    const overlapping = [req(0, { version: 1, done: 100 }), req(10, { version: 3, done: 50 })];
    assert.equal(versionsMonotonic.check(history({ requests: [...overlapping, req(200, { version: 3 })] })).length, 0);
    assert.equal(versionsMonotonic.check(history({ requests: [...overlapping, req(200, { version: 2 })] })).length, 1);
  });

  it('staleWithinBound: nothing older than ttl + stale_seconds past the call that answered it', () => {
    assert.equal(staleWithinBound.check(history({ calls: [call(0)], requests: [req(6000)] })).length, 0);
    assert.equal(staleWithinBound.check(history({ calls: [call(0)], requests: [req(7000)] })).length, 1);
    assert.equal(staleWithinBound.check(history({ calls: [call(0, { versions: [2] })], requests: [req(100)] })).length, 1);
  });

  it('notModifiedMatches: a 304 between two answers of v2 is for a validator of v2 only', () => {
    const around = (validatorVersion: number) => [req(0, { version: 2 }), req(100, { status: 304, validator: 'inm', validatorVersion }), req(200, { version: 2 })];
    assert.equal(notModifiedMatches.check(history({ requests: around(2) })).length, 0);
    assert.equal(notModifiedMatches.check(history({ requests: around(1) })).length, 1);
  });

  it('authOnlyAccepted: a made-up key gets no 200', () => {
    assert.equal(authOnlyAccepted.check(history({ requests: [req(0, { key: 'madeup', status: 401 })] })).length, 0);
    assert.equal(authOnlyAccepted.check(history({ requests: [req(0, { key: 'madeup' })] })).length, 1);
  });

  it('refusalOnlyOverCap: a provider-side 429 with the cap full passes, one with nothing around is caught', () => {
    const refused = req(1000, { status: 429, cache: 'perch; fwd=miss' });
    assert.equal(refusalOnlyOverCap.check(history({ procs: [STARTED], calls: [call(500), call(900)], requests: [refused] })).length, 0);
    assert.equal(refusalOnlyOverCap.check(history({ procs: [STARTED], requests: [refused] })).length, 1);
    // A call admitted as the refusal was decided reaches the provider a little after it.
    assert.equal(refusalOnlyOverCap.check(history({ procs: [STARTED], calls: [call(1200, { inst: 1 })], requests: [refused] })).length, 0);
    assert.equal(refusalOnlyOverCap.check(history({ procs: [STARTED], calls: [call(1400, { inst: 1 })], requests: [refused] })).length, 1);
  });

  it('refusalOnlyOverCap: for a quota window after the first ask, or a Redis restart, an instance keeps to its share of the quota', () => {
    // Quota 5 per 10 s, share 0.5: an instance may spend 2 of it; one call and a place taken count as spent.
    const refused = req(7000, { status: 429, cache: 'perch; fwd=miss' });
    assert.equal(refusalOnlyOverCap.check(history({ procs: [STARTED], calls: [call(3000, { inst: 0 })], requests: [refused] })).length, 0);
    assert.equal(refusalOnlyOverCap.check(history({ procs: [STARTED], calls: [call(3000, { inst: 1 })], requests: [refused] })).length, 1, 'the other instance spent it');
    // A quota window after the first ask, its own share no longer binds.
    const late = req(15_500, { status: 429, cache: 'perch; fwd=miss' });
    assert.equal(refusalOnlyOverCap.check(history({ procs: [STARTED], calls: [call(3000, { inst: 0 })], requests: [late] })).length, 1);
    const restarted: FaultEvent = { t: 'fault', kind: 'redis-restart', at: 8000, until: 9000 };
    assert.equal(refusalOnlyOverCap.check(history({ procs: [STARTED], faults: [restarted], calls: [call(3000, { inst: 0 }), call(10_000, { inst: 0 })], requests: [late] })).length, 0);
    // Every ask since the restart refused: the window is open, and its own calls from before count.
    assert.equal(refusalOnlyOverCap.check(history({ procs: [STARTED], faults: [restarted], calls: [call(1000, { inst: 1 }), call(6000, { inst: 0 })], requests: [late] })).length, 0);
    assert.equal(refusalOnlyOverCap.check(history({ procs: [STARTED], faults: [restarted], calls: [call(1000, { inst: 1 }), call(6000, { inst: 1 })], requests: [late] })).length, 1, 'the other instance spent it');
  });

  it('acceptedKeyReadsCache: in pass-through an accepted key is not refused what the cache holds fresh', () => {
    const pt = { run: { passThrough: true, ttl: 5, verifyTtl: 2 }, procs: [STARTED] };
    // Key alpha's own call on the endpoint is the provider's verdict on it there.
    const alpha = 'fleet-genuine-alpha-1234567';
    const verdict = call(0, { cred: alpha });
    const refused = req(3000, { status: 429, cache: 'perch; fwd=miss' });
    // The request the call at 0 answered: the stand-in records no query, this one tells the page.
    const served = req(0, { done: 20 });
    assert.equal(acceptedKeyReadsCache.check(history({ ...pt, calls: [verdict], requests: [served, refused] })).length, 1);
    // Not yet accepted, past the TTL, or purged: no promise.
    assert.equal(acceptedKeyReadsCache.check(history({ ...pt, calls: [call(0)], requests: [refused] })).length, 0);
    assert.equal(acceptedKeyReadsCache.check(history({ ...pt, calls: [verdict], requests: [served, req(6000, { status: 429, cache: 'perch; fwd=miss' })] })).length, 0);
    assert.equal(acceptedKeyReadsCache.check(history({ ...pt, calls: [verdict], purges: [purge(2000)], requests: [served, refused] })).length, 0);
    // Another page of the path: the stand-in's calls do not say which page they answered.
    const page = req(3000, { status: 429, cache: 'perch; fwd=miss', path: '/v1/users/1?cursor=b' });
    assert.equal(acceptedKeyReadsCache.check(history({ ...pt, calls: [verdict], requests: [served, page] })).length, 0);
    // The acceptance is a verdict per endpoint, for twice verify_ttl_seconds, until a 401 ends it.
    const tweet = call(0, { cred: alpha, path: '/v1/tweets/5', resources: ['/v1/tweets/5'] });
    assert.equal(acceptedKeyReadsCache.check(history({ ...pt, calls: [tweet, call(0)], requests: [served, refused] })).length, 0, 'accepted on another endpoint only');
    assert.equal(acceptedKeyReadsCache.check(history({ ...pt, run: { ...pt.run, verifyTtl: 1 }, calls: [verdict], requests: [served, refused] })).length, 0, 'the acceptance lapsed');
    assert.equal(acceptedKeyReadsCache.check(history({ ...pt, calls: [verdict, call(1000, { cred: alpha, path: '/v1/tweets/5', status: 401 })], requests: [served, refused] })).length, 0, 'rejected since');
    assert.equal(acceptedKeyReadsCache.check(history({ ...pt, calls: [verdict], requests: [{ ...served, path: '/v1/users/1?count=5' }, refused] })).length, 0, 'the call fetched another page');
  });

  it('refusalOnlyOverCap: in pass-through a key accepted on the endpoint fails the run when refused with nothing over', () => {
    const pt = { run: { passThrough: true, verifyTtl: 2 }, procs: [STARTED] };
    const refused = req(3000, { status: 429, cache: 'perch; fwd=miss' });
    const verdict = (path: string) => call(500, { cred: 'fleet-genuine-alpha-1234567', path, resources: [path], inst: 1 });
    assert.deepEqual(refusalOnlyOverCap.check(history({ ...pt, calls: [verdict('/v1/users/2')], requests: [refused] })).map((v) => v.advisory), [undefined]);
    // Accepted on another endpoint only: its request here is a verifying call, which may find no turn.
    assert.equal(refusalOnlyOverCap.check(history({ ...pt, calls: [verdict('/v1/tweets/5')], requests: [refused] })).length, 0);
  });

  it('acceptedKeyReadsCache: the TTL is the one in force when the provider answered, not the least of the run so far', () => {
    const pt = { run: { passThrough: true, ttl: 5, verifyTtl: 5 }, procs: [STARTED] };
    const alpha = { cred: 'fleet-genuine-alpha-1234567' };
    // A reload to ttl 0 at 1 s, then back to 30 s at 2 s: the answer of t=5 s is cached for 30 s.
    const configs: ConfigEvent[] = [{ t: 'config', at: 1000, caps: RUN.caps, ttl: 0 }, { t: 'config', at: 2000, caps: RUN.caps, ttl: 30 }];
    const refused = (sent: number) => req(sent, { status: 429, cache: 'perch; fwd=miss' });
    assert.equal(acceptedKeyReadsCache.check(history({ ...pt, configs, calls: [call(1500, alpha)], requests: [req(1500, { done: 1520 }), refused(10_000)] })).length, 0);
    assert.equal(acceptedKeyReadsCache.check(history({ ...pt, configs, calls: [call(5000, alpha)], requests: [req(5000, { done: 5020 }), refused(10_000)] })).length, 1);
  });

  it('liveness: answers within miss_deadline_ms + 2 s; connection failures only on an instance being stopped', () => {
    assert.equal(liveness.check(history({ requests: [req(0, { done: 3900 })] })).length, 0);
    assert.equal(liveness.check(history({ requests: [req(0, { done: 4100 })] })).length, 1);
    const refused = req(0, { status: 0, error: 'ECONNREFUSED' });
    assert.equal(liveness.check(history({ requests: [refused] })).length, 1);
    assert.equal(liveness.check(history({ requests: [refused], procs: [{ t: 'proc', inst: 0, gen: 1, kind: 'exit', at: 10, sentSignal: 'SIGKILL', signalAt: 0 }] })).length, 0);
  });

  it('liveness: a process that exits with no signal sent crashed: reported, and no excuse for the connections it failed', () => {
    const refused = req(0, { status: 0, error: 'ECONNRESET' });
    const killed: ProcEvent = { t: 'proc', inst: 0, gen: 1, kind: 'exit', at: 10, code: null, signal: 'SIGKILL', sentSignal: 'SIGKILL', signalAt: 0 };
    const { sentSignal: _sent, signalAt: _at, ...crashed } = { ...killed, code: 1, signal: null };
    assert.equal(liveness.check(history({ requests: [refused], procs: [killed] })).length, 0);
    const found = liveness.check(history({ requests: [refused], procs: [crashed] })).map((v) => v.message);
    assert.deepEqual(found.map((m) => /exited unbidden|connection failed/.exec(m)?.[0]), ['exited unbidden', 'connection failed']);
  });

  it('liveness: a request left hanging past its deadline is not excused by the kill that ended it', () => {
    // miss_deadline_ms 2000 + 2 s: due at t=4 s.
    const hung = req(0, { status: 0, done: 9010, error: 'ECONNRESET' });
    const killedAt = (signalAt: number): ProcEvent => ({ t: 'proc', inst: 0, gen: 1, kind: 'exit', at: signalAt + 10, code: null, signal: 'SIGKILL', sentSignal: 'SIGKILL', signalAt });
    assert.equal(liveness.check(history({ requests: [hung], procs: [killedAt(4000)] })).length, 0);
    assert.equal(liveness.check(history({ requests: [hung], procs: [killedAt(4100)] })).length, 1);
  });

  it('termWithinGrace: SIGTERM ends a process within shutdown_grace_ms + 1 s', () => {
    const exit = (at: number): ProcEvent => ({ t: 'proc', inst: 1, gen: 1, kind: 'exit', at, sentSignal: 'SIGTERM', signalAt: 0 });
    assert.equal(termWithinGrace.check(history({ procs: [exit(2000)] })).length, 0);
    assert.equal(termWithinGrace.check(history({ procs: [exit(2100)] })).length, 1);
  });

  it('stdoutWholeJson and accessLinesMatch: whole lines, one access line per answer', () => {
    const out = (accessIds: string[], badLines: string[] = []): StdoutEvent => ({ t: 'stdout', inst: 0, gen: 1, clean: true, badLines, accessIds });
    const answered = req(0);
    assert.equal(stdoutWholeJson.check(history({ stdouts: [out([])] })).length, 0);
    assert.equal(stdoutWholeJson.check(history({ stdouts: [out([], ['{"level":30,"ms'])] })).length, 1);
    assert.equal(accessLinesMatch.check(history({ requests: [answered], stdouts: [out([answered.id])] })).length, 0);
    assert.equal(accessLinesMatch.check(history({ requests: [answered], stdouts: [out([])] })).length, 1);
    assert.equal(accessLinesMatch.check(history({ requests: [answered], stdouts: [out([answered.id, 'nobody'])] })).length, 1);
    // A SIGKILLed process may lose its last lines.
    assert.equal(accessLinesMatch.check(history({ requests: [answered], stdouts: [{ ...out([]), clean: false }] })).length, 0);
    // With workers, those of a killed process drain what they hold: their lines may reach the next one's log.
    const next = { ...out([answered.id]), gen: 2 };
    assert.equal(accessLinesMatch.check(history({ run: { workers: 2 }, requests: [answered], stdouts: [next] })).length, 0);
    assert.equal(accessLinesMatch.check(history({ requests: [answered], stdouts: [next] })).length, 1);
  });
});

describe('fleet invariants over reloads and counters', () => {
  const reload = (at: number, extra: Partial<ConfigEvent> = {}): ConfigEvent => ({ t: 'config', at, caps: RUN.caps, ttl: 2, ...extra });

  it('planAt and planDuring: the plan a reload set, the smallest or largest of those in force in an interval', () => {
    const h = history({ configs: [reload(1000, { plans: { ...RUN.plans, small: { capacity: 6, refill: 2 } } }), reload(5000, { keys: { budget: 'budgeted' } })] });
    assert.deepEqual(planAt(h, 'alpha', 999), { capacity: 3, refill: 1 });
    assert.deepEqual(planAt(h, 'alpha', 1000), { capacity: 6, refill: 2 });
    assert.equal(planAt(h, 'alpha', 5000), undefined);
    // A reload takes up to a second to apply: just after it, either plan may be in force.
    assert.deepEqual(planDuring(h, 'alpha', 1500, 1500), { capacity: 6, refill: 2 });
    assert.deepEqual(planDuring(h, 'alpha', 1500, 1500, true), { capacity: 3, refill: 1 });
    assert.deepEqual(planDuring(h, 'alpha', 2500, 3000, true), { capacity: 6, refill: 2 });
    assert.equal(planDuring(h, 'alpha', 6100, 7000), undefined);
  });

  it('rateLimitUpper: after a reload raised the capacity to 6, 7 at once pass, 8 are caught', () => {
    const raised = { procs: [STARTED], configs: [reload(-5000, { plans: { small: { capacity: 6, refill: 1 } } })] };
    const at = (n: number) => Array.from({ length: n }, (_, i) => req(i));
    assert.equal(rateLimitUpper.check(history({ ...raised, requests: at(7) })).length, 0);
    assert.equal(rateLimitUpper.check(history({ ...raised, requests: at(8) })).length, 1);
    // A key's 401s (a reload removed it) are auth's, not the limiter's admissions.
    assert.equal(rateLimitUpper.check(history({ procs: [STARTED], requests: [...at(4), ...[5, 6, 7].map((t) => req(t, { status: 401 }))] })).length, 0);
  });

  it('underPlanNeverRefused: after a reload halved the plan, a refusal with the old bucket passes', () => {
    const halved = { procs: [STARTED], configs: [reload(-5000, { plans: { small: { capacity: 1, refill: 1 } } })] };
    assert.equal(underPlanNeverRefused.check(history({ ...halved, requests: [req(0), limited(3)] })).length, 0);
    assert.equal(underPlanNeverRefused.check(history({ procs: [STARTED], requests: [req(0), limited(3)] })).length, 1);
  });

  it('providerRate: a reload that lowered the cap holds the provider to it from a second after, not before', () => {
    const lowered = [reload(0, { caps: { ...RUN.caps, rate: 1 } })];
    // An instance that has not applied the reload yet (within a second) admits under the old cap of 2.
    assert.equal(providerRate.check(history({ procs: [STARTED], configs: lowered, calls: [call(700), call(800)] })).length, 0);
    assert.equal(providerRate.check(history({ procs: [STARTED], configs: lowered, calls: [call(1100), call(1200)] })).length, 1);
  });

  it('staleWithinBound: an entry keeps the TTL in force when it was stored, not the largest of the run', () => {
    // ttl 2 + stale 3 (+1.5 s) for the body of t=0; a reload to ttl 30 at t=10 s changes only what is stored after it.
    const configs = [reload(10_000, { ttl: 30 })];
    assert.equal(staleWithinBound.check(history({ configs, calls: [call(0), call(10_500, { versions: [2] })], requests: [req(6000), req(40_000, { version: 2 })] })).length, 0);
    assert.equal(staleWithinBound.check(history({ configs, calls: [call(0)], requests: [req(7000)] })).length, 1);
    // A call the reload was still reaching may have stored under the old TTL, the larger here.
    const lowered = [{ ...reload(10_000, { ttl: 0 }) }, reload(-1, { ttl: 30 })];
    assert.equal(staleWithinBound.check(history({ configs: lowered, calls: [call(10_500)], requests: [req(40_000)] })).length, 0);
    assert.equal(staleWithinBound.check(history({ configs: lowered, calls: [call(11_500)], requests: [req(16_100)] })).length, 1);
  });

  it('authFollowsReload: a removed key gets 401, an added key is served, within a second of the reload', () => {
    const removed = { configs: [reload(1000, { keys: { budget: 'budgeted' } })] };
    assert.equal(authFollowsReload.check(history({ ...removed, requests: [req(500), req(1500), req(2500, { status: 401 })] })).length, 0);
    assert.equal(authFollowsReload.check(history({ ...removed, requests: [req(2500)] })).length, 1);
    assert.equal(authFollowsReload.check(history({ ...removed, requests: [req(500, { status: 401 })] })).length, 1);
    // Pass-through: the provider accepts keys; no config names them.
    assert.equal(authFollowsReload.check(history({ ...removed, run: { passThrough: true }, requests: [req(2500)] })).length, 0);
  });

  const scraped = (extra: Partial<MetricsEvent> = {}): MetricsEvent => ({ t: 'metrics', inst: 0, gen: 1, at: 10_000, requests: { '200': 2, '429': 1 }, calls: { main: 2 }, keyCalls: { budget: { main: 1 } }, whole: true, ...extra });
  const budgetCall = (t: number) => call(t, { path: '/v1/users/77123', resources: ['/v1/users/77123'], inst: 0 });
  const seen = [req(0), req(100), limited(200)];
  const made = [call(0, { inst: 0 }), budgetCall(50), call(60, { inst: 1 })];

  it('metricsMatchHistory: counters equal to what clients and the provider saw pass; one short or one over is caught', () => {
    assert.equal(metricsMatchHistory.check(history({ requests: seen, calls: made, metrics: [scraped()] })).length, 0);
    // A request not counted, one counted twice, an exchange or a budget call not counted.
    assert.equal(metricsMatchHistory.check(history({ requests: seen, calls: made, metrics: [scraped({ requests: { '200': 1, '429': 1 } })] })).length, 1);
    assert.equal(metricsMatchHistory.check(history({ requests: seen, calls: made, metrics: [scraped({ requests: { '200': 3, '429': 1 } })] })).length, 1);
    assert.equal(metricsMatchHistory.check(history({ requests: seen, calls: made, metrics: [scraped({ calls: { main: 1 } })] })).length, 1);
    assert.equal(metricsMatchHistory.check(history({ requests: seen, calls: made, metrics: [scraped({ keyCalls: {} })] })).length, 1);
  });

  it('metricsMatchHistory: what the client could not see is allowed, what a dead process counted is not compared', () => {
    // A client that gave up: perch may have counted its request under any status, or not at all.
    const gaveUp = req(300, { status: -1 });
    assert.equal(metricsMatchHistory.check(history({ requests: [...seen, gaveUp], calls: made, metrics: [scraped({ requests: { '200': 2, '429': 1, '499': 1 } })] })).length, 0);
    assert.equal(metricsMatchHistory.check(history({ requests: [...seen, gaveUp], calls: made, metrics: [scraped({ requests: { '200': 2, '429': 1, '499': 2 } })] })).length, 1);
    // Process 2 of instance 0 counts from its start: calls of process 1 (before its exit) are not its.
    const exit: ProcEvent = { t: 'proc', inst: 0, gen: 1, kind: 'exit', at: 5000, sentSignal: 'SIGKILL', signalAt: 4990 };
    const second = [req(6000, { gen: 2 })];
    assert.equal(metricsMatchHistory.check(history({ procs: [exit], requests: [...seen, ...second], calls: [...made, call(6000, { inst: 0 })], metrics: [scraped({ gen: 2, requests: { '200': 1 }, calls: { main: 1 }, keyCalls: {} })] })).length, 0);
    assert.equal(metricsMatchHistory.check(history({ procs: [exit], requests: [...seen, ...second], calls: [...made, call(6000, { inst: 0 })], metrics: [scraped({ gen: 2, requests: { '200': 1 }, calls: { main: 3 }, keyCalls: {} })] })).length, 1);
    // With workers, a call within the drain after process 1 was killed may be its workers'.
    const drain = [...made, call(5500, { inst: 0 }), call(6000, { inst: 0 })];
    const counted = scraped({ gen: 2, requests: { '200': 1 }, calls: { main: 1 }, keyCalls: {} });
    assert.equal(metricsMatchHistory.check(history({ run: { workers: 2, graceMs: 1000 }, procs: [exit], requests: [...seen, ...second], calls: drain, metrics: [counted] })).length, 0);
    assert.equal(metricsMatchHistory.check(history({ run: { graceMs: 1000 }, procs: [exit], requests: [...seen, ...second], calls: drain, metrics: [counted] })).length, 1);
    // A 401 on c2 sends the exchange on with c1: one call more than the exchanges counted, at most.
    const switched = [call(0, { inst: 0, status: 401, cred: 'c2' }), call(10, { inst: 0 }), budgetCall(50)];
    assert.equal(metricsMatchHistory.check(history({ requests: seen, calls: switched, metrics: [scraped()] })).length, 0);
    assert.equal(metricsMatchHistory.check(history({ requests: seen, calls: [...switched, call(70, { inst: 0 })], metrics: [scraped()] })).length, 1);
    // A call still open when the counters were read is not counted yet.
    const late = call(9990, { inst: 0, end: 10_050 });
    assert.equal(metricsMatchHistory.check(history({ requests: seen, calls: [...made, late], metrics: [scraped()] })).length, 0);
    assert.equal(metricsMatchHistory.check(history({ requests: seen, calls: [...made, { ...late, end: 9995 }], metrics: [scraped()] })).length, 1);
    // Calls not traced to a process may be anyone's: no comparison fails for them.
    const untraced = made.map(({ inst: _inst, ...rest }) => rest);
    assert.equal(metricsMatchHistory.check(history({ requests: seen, calls: untraced, metrics: [scraped()] })).length, 0);
    // A worker started again counts from zero: not compared.
    assert.equal(metricsMatchHistory.check(history({ requests: seen, calls: made, metrics: [scraped({ requests: {}, whole: false })] })).length, 0);
  });
});
