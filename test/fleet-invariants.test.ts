import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { CallEvent, FaultEvent, History, ProcEvent, PurgeEvent, RequestEvent, RunEvent, StdoutEvent } from '../fleet/history.js';
import {
  acceptedKeyReadsCache,
  accessLinesMatch,
  authOnlyAccepted,
  leaseAllowance,
  liveness,
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
  it('providerRate: 2 calls in a second pass a cap of 2, a third is caught; with Redis killed it is tagged 56', () => {
    assert.equal(names(providerRate, history({ procs: [STARTED], calls: [call(0), call(500), call(1000)] })).count, 0);
    assert.deepEqual(names(providerRate, history({ procs: [STARTED], calls: [call(0), call(500), call(800)] })), { count: 1, open: [undefined] });
    assert.deepEqual(names(providerRate, history({ procs: [STARTED], faults: [redisKill(100)], calls: [call(0), call(500), call(800)] })), { count: 1, open: [56] });
  });

  it('providerQuota: 5 calls in 10 s pass a quota of 5, a sixth is caught', () => {
    const five = [0, 1000, 2000, 3000, 4000].map((t) => call(t));
    assert.equal(providerQuota.check(history({ procs: [STARTED], calls: [...five, call(10_000)] })).length, 0);
    assert.equal(providerQuota.check(history({ procs: [STARTED], calls: [...five, call(9_000)] })).length, 1);
  });

  it('providerQuota: a quota broken across a Redis restart says how many calls came after it', () => {
    const before = [0, 1000, 2000, 3000, 4000].map((t) => call(t));
    const found = providerQuota.check(history({ procs: [STARTED], faults: [redisKill(5000)], calls: [...before, call(6000)] }));
    assert.equal(found.length, 1);
    assert.equal(found[0]!.openIssue, 56);
    assert.match(found[0]!.message, /6 calls in 10000 ms from t=0, quota 5; 1 of them after Redis restarted empty at t=5500$/);
  });

  it('providerConcurrency: 2 calls overlapping pass max_concurrent 2, 3 are caught', () => {
    const long = (start: number) => call(start, { end: start + 1000 });
    assert.equal(providerConcurrency.check(history({ procs: [STARTED], calls: [long(0), long(100), long(1000)] })).length, 0);
    assert.equal(providerConcurrency.check(history({ procs: [STARTED], calls: [long(0), long(100), long(200)] })).length, 1);
  });

  it('providerStops: no call on a credential within Retry-After of its 429; the other credential may go on', () => {
    const stop = call(0, { status: 429, retryAfter: 2, end: 10 });
    assert.equal(providerStops.check(history({ calls: [stop, call(500, { cred: 'c2' }), call(2100)] })).length, 0);
    assert.equal(providerStops.check(history({ calls: [stop, call(1500)] })).length, 1);
  });

  it('providerStops: after a 401, one more 401 per process that learns it for itself, until a reload', () => {
    const reject = call(0, { status: 401 });
    const again = (t: number) => call(t, { status: 401 });
    const two = [STARTED, { ...STARTED, inst: 1 }];
    assert.equal(providerStops.check(history({ procs: two, calls: [reject, again(1000), again(2000)] })).length, 0);
    assert.equal(providerStops.check(history({ procs: two, calls: [reject, again(1000), again(2000), again(3000)] })).length, 1);
    assert.equal(providerStops.check(history({ procs: two, calls: [reject, again(1000), again(2000), again(5000)], configs: [{ t: 'config', at: 4000, caps: RUN.caps, ttl: 2 }] })).length, 0);
  });

  it('perKeyBudget: the budget key\'s paths get at most its limit of calls', () => {
    const budgetCall = (t: number) => call(t, { path: `/v1/users/77${t}`, resources: [`/v1/users/77${t}`] });
    assert.equal(perKeyBudget.check(history({ calls: [budgetCall(1), budgetCall(2), call(3)] })).length, 0);
    assert.equal(perKeyBudget.check(history({ calls: [budgetCall(1), budgetCall(2), budgetCall(3)] })).length, 1);
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
  });

  it('versionsMonotonic: one instance never goes back to an older body', () => {
    assert.equal(versionsMonotonic.check(history({ requests: [req(0, { version: 1 }), req(100, { version: 2 }), req(200, { version: 2 })] })).length, 0);
    assert.equal(versionsMonotonic.check(history({ requests: [req(0, { version: 2 }), req(100, { version: 1 })] })).length, 1);
    // Another instance may be behind.
    assert.equal(versionsMonotonic.check(history({ requests: [req(0, { version: 2 }), req(100, { version: 1, inst: 1 })] })).length, 0);
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
  });

  it('acceptedKeyReadsCache: in pass-through an accepted key is not refused what the cache holds fresh', () => {
    const pt = { run: { passThrough: true, ttl: 5 }, procs: [STARTED] };
    const refused = req(3000, { status: 429, cache: 'perch; fwd=miss' });
    assert.equal(acceptedKeyReadsCache.check(history({ ...pt, calls: [call(0)], requests: [req(100), refused] })).length, 1);
    // Not yet accepted, past the TTL, or purged: no promise.
    assert.equal(acceptedKeyReadsCache.check(history({ ...pt, calls: [call(0)], requests: [refused] })).length, 0);
    assert.equal(acceptedKeyReadsCache.check(history({ ...pt, calls: [call(0)], requests: [req(100), req(6000, { status: 429, cache: 'perch; fwd=miss' })] })).length, 0);
    assert.equal(acceptedKeyReadsCache.check(history({ ...pt, calls: [call(0)], purges: [purge(2000)], requests: [req(100), refused] })).length, 0);
  });

  it('liveness: answers within miss_deadline_ms + 2 s; connection failures only on an instance being stopped', () => {
    assert.equal(liveness.check(history({ requests: [req(0, { done: 3900 })] })).length, 0);
    assert.equal(liveness.check(history({ requests: [req(0, { done: 4100 })] })).length, 1);
    const refused = req(0, { status: 0, error: 'ECONNREFUSED' });
    assert.equal(liveness.check(history({ requests: [refused] })).length, 1);
    assert.equal(liveness.check(history({ requests: [refused], procs: [{ t: 'proc', inst: 0, gen: 1, kind: 'exit', at: 10, sentSignal: 'SIGKILL', signalAt: 0 }] })).length, 0);
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
  });
});
