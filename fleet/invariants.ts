import { planDuring, plansDuring, RELOAD_SETTLE_MS, type CallEvent, type Caps, type Event, type FaultEvent, type History, type Plan, type RequestEvent } from './history.js';

/**
 * What perch promises, checked over one recorded history. Each invariant is a named function
 * whose bound is the one docs/*.md states; where the docs give an allowance (a Redis outage, a
 * lease held by another instance) the invariant holds perch to exactly that allowance.
 *
 * A violation whose conditions are those of a still-open issue carries that issue's number
 * (`openIssue`): it is reported, and fails a run only with `--known-open fail`.
 */
export interface Violation {
  readonly invariant: string;
  readonly message: string;
  /** When it shows, ms since the run started. */
  readonly at: number;
  /** The events that show it: requests, calls, purges, faults involved. */
  readonly slice: readonly Event[];
  readonly openIssue?: number;
  /** A heuristic bound, not one the docs state exactly: reported like an open issue's. */
  readonly advisory?: true;
}

export interface Invariant {
  readonly name: string;
  /** The promise and its bound, as the docs state them. */
  readonly bound: string;
  /** The open issue whose defects this invariant is known to catch, if any. */
  readonly openIssue?: number;
  readonly check: (h: History) => Violation[];
}

/**
 * Leeway for times taken in the fleet's own process: the provider stand-ins share its event loop
 * with the workload, so an arrival is stamped when the loop gets to it, up to about a tenth of a
 * second late on a loaded machine (a v1 cap of 2 showed 3 calls in 909 ms, nothing else wrong).
 */
const SLACK_MS = 150;
/** How long after a Redis fault its effects may still show (reconnection, write-back). */
const SETTLE_MS = 5000;

/**
 * Faults after which an instance admits on its own share until Redis has its counts back: Redis
 * away for all or one, and an instance (re)starting, whose connection is not ready at once.
 */
const REDIS_FAULTS = new Set(['redis-kill', 'redis-restart', 'redis-freeze', 'relay-cut', 'relay-delay', 'inst-kill', 'inst-term']);

/** Such faults that touch [from, to] (one ending within SETTLE_MS before `from` included), the fleet's start too. */
export function redisTrouble(h: History, from: number, to: number): FaultEvent[] {
  const faults = h.faults.filter((f) => REDIS_FAULTS.has(f.kind) && f.at <= to && f.until + SETTLE_MS >= from);
  const started = Math.max(-Infinity, ...h.procs.filter((p) => p.kind === 'start' && p.gen === 1).map((p) => p.at));
  if (from <= started + SETTLE_MS) faults.unshift({ t: 'fault', kind: 'fleet-start', at: 0, until: started });
  return faults;
}

/**
 * Redis faults touching [from, to] as `redisTrouble` has them, and the outages an instance's own
 * log reported (`redis-seen`: a loaded machine makes Redis time out with no fault injected),
 * within half a second for the log's clock.
 */
export function limiterTrouble(h: History, from: number, to: number): FaultEvent[] {
  return [...redisTrouble(h, from, to), ...h.faults.filter((f) => f.kind === 'redis-seen' && f.at <= to + 500 && f.until + 500 >= from)];
}

/** Every fault touching [from, to], and the fleet's start: a limiter's state may be anyone's then. */
function anyTrouble(h: History, from: number, to: number): FaultEvent[] {
  return [...redisTrouble(h, from, to), ...h.faults.filter((f) => !REDIS_FAULTS.has(f.kind) && f.at <= to && f.until + SETTLE_MS >= from)];
}

/**
 * The caps of upstream `u` in effect at any time in [from, to]: the largest of each, or with
 * `least` the smallest, whichever is lenient for the check. A SIGHUP takes up to
 * RELOAD_SETTLE_MS to apply everywhere, and docs/provider.md holds the provider to the new cap
 * only from then: an instance that has not applied it yet admits under the old one.
 */
export function capsDuring(h: History, u: 'v1' | 'x', from: number, to: number, least = false): Caps | undefined {
  const initial = u === 'v1' ? h.run.caps : h.run.xCaps;
  if (initial === undefined) return undefined;
  let inEffect: Caps = initial;
  const seen: Caps[] = [];
  for (const c of [...h.configs].sort((a, b) => a.at - b.at)) {
    if (c.at + RELOAD_SETTLE_MS < from) inEffect = u === 'v1' ? c.caps : inEffect;
    else if (c.at <= to && u === 'v1') seen.push(c.caps);
  }
  const all = [inEffect, ...seen];
  const pick = (f: (c: Caps) => number) => (least ? Math.min(...all.map(f)) : Math.max(...all.map(f)));
  return {
    rate: pick((c) => c.rate),
    maxConcurrent: pick((c) => c.maxConcurrent),
    quota: { requests: pick((c) => c.quota.requests), perSeconds: pick((c) => c.quota.perSeconds) },
    downShare: pick((c) => c.downShare),
  };
}

/** Faults that take Redis from every instance at once. */
const FLEET_OUTAGES = new Set(['redis-kill', 'redis-restart', 'redis-freeze']);
/**
 * Faults that take it from one instance: its relay cut or held, its process (re)started, not
 * connected at once, or its guard's own switch to memory that its log shows (`guard-down`).
 */
const ONE_OUTAGES = new Set(['relay-cut', 'relay-delay', 'inst-kill', 'inst-term', 'guard-down']);

/**
 * The Redis faults around [from, to], and the times an instance's guard found Redis away with no
 * fault made (answers late on a busy machine, a connection not ready at start), but for those
 * a fault made explains.
 */
function outagesAround(h: History, from: number, to: number): FaultEvent[] {
  const out = redisTrouble(h, from, to);
  for (const g of h.faults) {
    if (g.kind !== 'guard-down') continue;
    // A fault made explains the guard's switch while it lasts; past its end (the breaker's
    // cool-down, a reconnection) this instance alone is still away: a one-instance outage.
    const ends = h.faults.filter((f) => REDIS_FAULTS.has(f.kind) && (f.inst === undefined || f.inst === g.inst) && f.at - SLACK_MS <= g.until && f.until + SETTLE_MS >= g.at).map((f) => f.until);
    const at = Math.max(g.at, ...ends);
    if (at < g.until && at <= to && g.until + SETTLE_MS >= from) out.push(at === g.at ? g : { ...g, at });
  }
  return out;
}

/** The perch processes behind instance `i`, each with its own Redis connections and share. */
function processesOf(h: History, i: number): number {
  return i === 0 && h.run.workers > 0 ? h.run.workers : 1;
}

/**
 * docs/provider.md's bound across Redis outages on `limit` calls (a rate window's, a quota's, a
 * key's budget), for `calls` in one window, `trouble` the faults around it. Each process keeps
 * `a = max(1, floor(limit x share))` on its own, counting what it had spent (rᵢ, its calls in
 * the window before the fault) and goes on from it:
 * - Redis away from all (killed, restarted, frozen): `max(limit, Σ max(rᵢ, a))`, an instance of w
 *   processes adding at most `max(rᵢ, a) + (w - 1) a` (its rᵢ split among them as worst);
 * - away from one instance (its connection cut or held, its process restarted: not connected
 *   at once, its memory empty): the others go on through Redis, and it adds `max(rᵢ, a) - rᵢ`
 *   (`w a` for a restarted one);
 * the allowances of several faults around one window add up. The fleet's first start and a
 * SIGHUP add nothing.
 */
export function outageBound(h: History, limit: number, share: number, calls: readonly CallEvent[], trouble: readonly FaultEvent[]): number {
  const a = Math.max(1, Math.floor(limit * share));
  // Calls stamped within SLACK_MS of the fault may have been admitted on either side of it: each
  // bound reads them the way that allows more (a fleet-wide outage sums max(rᵢ, a), one
  // instance away adds max(rᵢ, a) - rᵢ).
  const spentBefore = (i: number, at: number) => calls.filter((c) => c.inst === i && c.start < at).length;
  const most = (i: number, r: number) => Math.max(r, a) + (processesOf(h, i) - 1) * a;
  let extra = 0;
  for (const f of trouble) {
    if (FLEET_OUTAGES.has(f.kind)) {
      let sum = 0;
      for (let i = 0; i < h.run.instances; i++) sum += most(i, spentBefore(i, f.at + SLACK_MS));
      extra += Math.max(0, sum - limit);
    } else if (ONE_OUTAGES.has(f.kind) && f.inst !== undefined) {
      const restarted = f.kind === 'inst-kill' || f.kind === 'inst-term';
      const r = restarted ? 0 : spentBefore(f.inst, f.at - SLACK_MS);
      extra += most(f.inst, r) - r;
    }
  }
  return limit + extra;
}

function callsOf(h: History, u: 'v1' | 'x'): CallEvent[] {
  return h.calls.filter((c) => c.upstream === u);
}

/** Whether perch's limiter refused this request (its own 429: no Cache-Status, the cache was never asked). */
export function rateLimited(r: RequestEvent): boolean {
  return r.status === 429 && r.cache === undefined;
}

function windowCheck(h: History, name: string, windowMs: (caps: Caps) => number, bound: (caps: Caps) => number, what: string): Violation[] {
  const out: Violation[] = [];
  for (const u of ['v1', 'x'] as const) {
    const calls = callsOf(h, u);
    let reportedUntil = -Infinity;
    for (let i = 0; i < calls.length; i++) {
      const from = calls[i]!.start;
      const caps = capsDuring(h, u, from, from)!;
      const end = from + windowMs(caps) - SLACK_MS;
      let j = i;
      while (j < calls.length && calls[j]!.start < end) j++;
      const count = j - i;
      const during = capsDuring(h, u, from, end)!;
      const trouble = outagesAround(h, from, end);
      const limit = outageBound(h, bound(during), during.downShare, calls.slice(i, j), trouble);
      if (count <= limit || from < reportedUntil) continue;
      // One report per burst.
      reportedUntil = end;
      const allowance = limit > bound(during) ? ` (${bound(during)} + ${limit - bound(during)} for the Redis faults around it)` : '';
      out.push({ invariant: name, message: `${u}: ${count} calls in ${windowMs(caps)} ms from t=${Math.round(from)}, ${what} ${limit}${allowance}`, at: from, slice: [...trouble, ...calls.slice(i, j)] });
    }
  }
  return out;
}

/** docs/configuration.md `max_requests_per_second`: "never more in any one-second window". */
export const providerRate: Invariant = {
  name: 'providerRate',
  bound: 'calls to an upstream in any 1 s window <= ceil(max_requests_per_second); around Redis faults, the outage bound of docs/provider.md (outageBound)',
  check: (h) => windowCheck(h, 'providerRate', () => 1000, (c) => Math.ceil(c.rate), 'cap'),
};

/** docs/provider.md: the quota holds fleet-wide, and across an outage at most max(quota, sum of max(r_i, share x quota)). */
export const providerQuota: Invariant = {
  name: 'providerQuota',
  bound: 'calls in any quota window <= quota.requests; around Redis faults, the outage bound of docs/provider.md (outageBound)',
  check: (h) => windowCheck(h, 'providerQuota', (c) => c.quota.perSeconds * 1000, (c) => c.quota.requests, 'quota'),
};

/** docs/configuration.md `max_concurrent`: calls in flight at once, fleet-wide; across Redis outages, the outage bound on it. */
export const providerConcurrency: Invariant = {
  name: 'providerConcurrency',
  bound: 'calls in flight at the provider at once <= max_concurrent; around Redis faults, the outage bound on it (docs/provider.md), rᵢ the calls each instance had in flight',
  check: (h) => {
    const out: Violation[] = [];
    for (const u of ['v1', 'x'] as const) {
      const calls = callsOf(h, u);
      // A call perch gave up on ends for perch before the provider notices: its end is shaved.
      const active: CallEvent[] = [];
      for (const c of calls) {
        for (let k = active.length - 1; k >= 0; k--) if (active[k]!.end - SLACK_MS <= c.start) active.splice(k, 1);
        active.push(c);
        const caps = capsDuring(h, u, c.start, c.start)!;
        // Every call in flight now began within a lease of now: the faults since the first of them.
        const trouble = outagesAround(h, Math.min(...active.map((a) => a.start)), c.start);
        const limit = outageBound(h, caps.maxConcurrent, caps.downShare, active, trouble);
        if (active.length > limit) {
          out.push({ invariant: 'providerConcurrency', message: `${u}: ${active.length} calls in flight at t=${Math.round(c.start)}, max_concurrent ${limit}`, at: c.start, slice: [...trouble, ...active] });
          active.length = 0;
        }
      }
    }
    return out;
  },
};

/** When a credential's 401 at `stop` stops counting: a reload restores it, and `credential_recheck_seconds` (300 s) tries it again. */
function rejectionEnd(h: History, stop: CallEvent): number {
  return Math.min(stop.end + 300_000, ...h.configs.filter((c) => c.at > stop.end).map((c) => c.at));
}

/**
 * The 401s that take a credential out of the rotation afresh: a credential's first, and its first
 * after a reload or a recheck ended the rejection before it (a reload puts it back, so a later
 * 401 takes it out again, and the 401s after that one are held to it).
 */
function rejectionStarts(h: History, calls: readonly CallEvent[]): Set<CallEvent> {
  const starts = new Set<CallEvent>();
  const until = new Map<string, number>();
  for (const c of calls) {
    if (c.status !== 401 || c.start < (until.get(c.cred) ?? -Infinity)) continue;
    starts.add(c);
    until.set(c.cred, rejectionEnd(h, c));
  }
  return starts;
}

/**
 * docs/provider.md: "every instance honours what the provider told any one of them": after a 429
 * with Retry-After on a credential, no call on it until then. A 401 takes the credential out of
 * the rotation of the process that drew it (each learns for itself; one rechecks at a time after
 * `credential_recheck_seconds`, a reload restores it): until then, at most one more 401 on it per
 * perch process the run started.
 */
export const providerStops: Invariant = {
  name: 'providerStops',
  bound: 'no call on a credential within Retry-After of its 429 (cooldown_scope upstream), but by an instance cut off from Redis when another instance heard the 429; after its 401, until a reload or credential_recheck_seconds, at most one 401 on it per perch process started, a 401 after that taking it out again; around a Redis fault or a reload only advisory: a stop reaches the other instances once Redis can carry it, which the history does not tell',
  check: (h) => {
    if (h.run.passThrough) return [];
    const out: Violation[] = [];
    const calls = callsOf(h, 'v1');
    const processes = h.procs.filter((p) => p.kind === 'start').length + (h.run.workers > 0 ? h.run.workers : 0);
    const rejections = rejectionStarts(h, calls);
    for (const stop of calls) {
      let bad: CallEvent | undefined;
      let until: number;
      if (stop.status === 429 && stop.retryAfter !== undefined) {
        until = stop.end + stop.retryAfter * 1000;
        // docs/provider.md: an instance cut off from Redis cannot hear of another's stop, and keeps to its own.
        bad = calls.find((c) => c.cred === stop.cred && c.start > stop.end + SLACK_MS && c.start < until - SLACK_MS && !cutOffFrom(h, c, stop));
      } else if (stop.status === 401 && rejections.has(stop)) {
        until = rejectionEnd(h, stop);
        bad = calls.filter((c) => c.cred === stop.cred && c.status === 401 && c.start > stop.end + SLACK_MS && c.start < until)[processes];
      } else continue;
      if (bad === undefined) continue;
      const trouble = [...redisTrouble(h, stop.end, bad.start), ...h.faults.filter((f) => f.kind === 'sighup' && f.at >= stop.end && f.at <= bad.start)];
      out.push({ invariant: 'providerStops', message: `call on ${bad.cred} at t=${Math.round(bad.start)} within the stop of its ${stop.status} at t=${Math.round(stop.end)} (until t=${Math.round(until)})`, at: bad.start, slice: [...trouble, stop, bad], ...(trouble.length > 0 ? { advisory: true as const } : {}) });
    }
    return out;
  },
};

/** Whether `call`'s instance was cut off from Redis when it made the call, and `stop` was another instance's. */
function cutOffFrom(h: History, call: CallEvent, stop: CallEvent): boolean {
  if (call.inst === undefined || call.inst === stop.inst) return false;
  return h.faults.some((f) => f.kind === 'relay-cut' && f.inst === call.inst && f.at <= call.start && call.start <= f.until);
}

/** docs/provider.md "Budgets": one key's provider calls per calendar window within `provider_calls.limit`. */
export const perKeyBudget: Invariant = {
  name: 'perKeyBudget',
  bound: "calls charged to a key in its window <= provider_calls.limit, and around Redis faults the outage bound of docs/provider.md on it (outageBound; the key `budget` alone asks for its paths, so every call for them is its)",
  check: (h) => {
    const plan = h.run.plans[h.run.keys['budget'] ?? ''];
    if (plan?.budget === undefined) return [];
    const calls = h.calls.filter((c) => c.resources.some((r) => r.startsWith(h.run.budgetPrefix)));
    if (calls.length <= plan.budget) return [];
    // The run is one window (a day); its faults, but for the fleet's start, each allow their part.
    const trouble = outagesAround(h, 0, calls.at(-1)!.start).filter((f) => f.kind !== 'fleet-start');
    const limit = outageBound(h, plan.budget, h.run.caps.downShare, calls, trouble);
    if (calls.length <= limit) return [];
    const over = calls[limit]!;
    return [{ invariant: 'perKeyBudget', message: `${calls.length} calls charged to key budget, limit ${plan.budget} a day${limit > plan.budget ? ` + ${limit - plan.budget} for the Redis faults` : ''}`, at: over.start, slice: [...trouble, ...calls.slice(Math.max(0, limit - 1))] }];
  },
};

function requestsByKey(h: History): Map<string, RequestEvent[]> {
  const byKey = new Map<string, RequestEvent[]>();
  // A 401 is auth's answer, before the limiter: a key a reload removed spends nothing.
  for (const r of h.requests) if (r.key !== 'madeup' && r.status !== 401) byKey.set(r.key, [...(byKey.get(r.key) ?? []), r]);
  return byKey;
}

/** Perch processes that lease from one bucket: an instance run with `--workers` has a process per worker. */
export function leasers(h: History): number {
  return h.run.instances + Math.max(0, h.run.workers - 1);
}

/** The whole tokens left an answer's `RateLimit` header reported (`r=`). */
function reported(r: RequestEvent): number | undefined {
  const m = /;r=(\d+)/.exec(r.ratelimit ?? '');
  return m === null ? undefined : Number(m[1]);
}

/**
 * What the memory buckets may hand out in [from, to] beyond the shared bucket, by the bound of
 * docs/rate-limits.md ("When Redis fails"): across an outage each instance spends at most what
 * it last saw left (its last answer's `r`, plus a token for the rounding and, with leases, what
 * other instances' give-backs may have added since: the lease allowance), with its refill since;
 * a process that never answered the key starts full. Summed over each Redis fault the nemesis
 * injected or an instance logged (but a log's outage a fault made explains: the same switch to
 * memory), and each process that answered the key in the window (for a
 * fault of one instance, that instance's processes);
 * an instance with workers has a memory bucket per worker, whose answers the history does not
 * tell apart: each may have seen the bucket full. A Redis restarted empty starts a full bucket.
 */
function outageAllowance(h: History, plan: Plan, all: readonly RequestEvent[], trouble: readonly FaultEvent[], from: number, to: number): number {
  const dt = (to - from) / 1000;
  const procs = new Map<string, { inst: number; gen: number }>();
  for (const r of all) if (r.done >= from && r.sent <= to && r.status > 0) procs.set(`${r.inst}/${r.gen}`, { inst: r.inst, gen: r.gen });
  const slack = leaseAllowance(plan, leasers(h));
  // An instance's log shows the switch to memory a fault made too: its first `redis-seen` that
  // overlaps a fault of Redis (or of its relay) made around the window is that fault's outage,
  // allowed once. A later one is a switch of its own (Redis answered in between, so it carries on
  // from a new report).
  const made = trouble.filter((f) => REDIS_FAULTS.has(f.kind) && f.kind !== 'inst-kill' && f.kind !== 'inst-term');
  const twins = new Set<FaultEvent>();
  for (const f of made) {
    for (let i = 0; i < h.run.instances; i++) {
      if (f.inst !== undefined && f.inst !== i) continue;
      const twin = h.faults.find((g) => g.kind === 'redis-seen' && g.inst === i && g.at <= f.until && g.until >= f.at);
      if (twin !== undefined) twins.add(twin);
    }
  }
  let extra = 0;
  for (const f of trouble) {
    if (twins.has(f)) continue;
    // A process (re)starting answers from memory only if its first connection is late, and then
    // says so itself (`redis-seen`); its start alone hands out nothing more.
    if (f.kind === 'fleet-start' || f.kind === 'inst-kill' || f.kind === 'inst-term') continue;
    if (f.kind === 'redis-kill') extra += plan.capacity;
    for (const p of procs.values()) {
      if (f.inst !== undefined && f.inst !== p.inst) continue;
      const workers = p.inst === 0 && h.run.workers > 0 ? h.run.workers : 1;
      const before = all.filter((r) => r.inst === p.inst && r.gen === p.gen && r.done <= f.at && reported(r) !== undefined);
      const last = before.length > 0 && workers === 1 ? before[before.length - 1]! : undefined;
      const seen = last === undefined ? plan.capacity : Math.min(plan.capacity, reported(last)! + 1 + slack);
      extra += workers * (seen + plan.refill * dt);
    }
  }
  return extra;
}

/**
 * What the fleet may hold on lease at `at`, all of which a client may spend beyond the bucket
 * (docs/rate-limits.md, leases): the bucket never holds more than its capacity, so what a window
 * can spend is the capacity, the refill, and what was on lease when it began. Leases follow
 * demand: a process takes its next lease (at most twice the last) only once three quarters of
 * the last are spent, and every lease lives a second, so what it holds is at most about three
 * times what it was answered in the two seconds before (and a lease of a token or two at first);
 * and never more than two leases per process (the lease allowance).
 */
function onLease(h: History, plan: Plan, admitted: readonly RequestEvent[], at: number): number {
  if (plan.capacity < 20) return 0;
  const recent = admitted.filter((r) => r.done > at - 2000 && r.sent < at).length;
  return Math.min(leaseAllowance(plan, leasers(h)), 3 * recent + 4 * leasers(h));
}

/**
 * docs/rate-limits.md: the fleet never spends more tokens than the bucket gave. Each request was
 * admitted somewhere between its sending and its answer, so a run of admissions i..j is held to
 * the plan over the widest interval they may have taken, [sent_i, max done]: the client's send
 * times alone make an interval too short by the requests' own trip. On top of the plan, the
 * allowances the docs state: with leases, what was on lease as the window began (`onLease`);
 * across a Redis fault, injected or logged, what the memory buckets may hand out
 * (`outageAllowance`).
 */
export const rateLimitUpper: Invariant = {
  name: 'rateLimitUpper',
  bound: 'per key, requests admitted in any interval dt <= capacity + refill_per_second x dt (+1 for the edges), + what was on lease as it began (plans of 20 or more: at most the lease allowance, and three times what the key was answered in the 2 s before + 4 a process for its first leases of a token or two); across a Redis fault or one an instance logged (a process (re)started adds nothing by itself: its log says when its first connection was late), + what each process may spend from memory: what it last saw left (or a full bucket), with its refill since (an instance\'s logged outage that a fault made explains counts once, with that fault)',
  check: (h) => {
    const out: Violation[] = [];
    for (const [key, all] of requestsByKey(h)) {
      // The smallest plan a reload set bounds where windows start; each window is held to the largest in force during it.
      const plan = planDuring(h, key, -Infinity, Infinity, true);
      if (plan === undefined) continue;
      const admitted = all.filter((r) => r.status > 0 && !rateLimited(r));
      for (let i = 0; i < admitted.length; i++) {
        // Each was admitted somewhere between its sending and its answer: the widest interval counts.
        let last = 0;
        for (let j = i; j < i + Math.floor(plan.capacity) && j < admitted.length; j++) last = Math.max(last, admitted[j]!.done);
        // What the plan and its allowances allow only grows with j, and the count by one a step:
        // from a j with room r left, none before j + floor(r) can be over, so those are skipped
        // (a long run is checked in about n x n / capacity steps, not n x n).
        for (let j = i + Math.floor(plan.capacity), skipped = j; j < admitted.length; ) {
          for (; skipped <= j; skipped++) last = Math.max(last, admitted[skipped]!.done);
          const dt = (last - admitted[i]!.sent) / 1000;
          const inForce = planDuring(h, key, admitted[i]!.sent, last) ?? plan;
          const planned = inForce.capacity + inForce.refill * (dt + SLACK_MS / 1000) + 1;
          if (j - i + 1 <= planned) {
            // The rest cannot close the gap.
            if (planned - (j - i + 1) > admitted.length - 1 - j) break;
            j += Math.max(1, Math.floor(planned - (j - i + 1)));
            continue;
          }
          const trouble = limiterTrouble(h, admitted[i]!.sent, last);
          const allowed = planned + onLease(h, inForce, admitted, admitted[i]!.sent) + outageAllowance(h, inForce, all, trouble, admitted[i]!.sent, last);
          if (j - i + 1 <= allowed) {
            j += Math.max(1, Math.floor(allowed - (j - i + 1)));
            continue;
          }
          out.push({ invariant: 'rateLimitUpper', message: `key ${key}: ${j - i + 1} admitted in ${dt.toFixed(3)} s, plan allows ${allowed.toFixed(1)}`, at: admitted[j]!.sent, slice: [...new Set([...trouble, ...anyTrouble(h, admitted[i]!.sent, last)]), admitted[i]!, admitted[j]!] });
          i = admitted.length;
          break;
        }
      }
    }
    return out;
  },
};

/** The lease bound of docs/rate-limits.md: a request is refused early only while other instances hold tokens, each at most two leases of min(lease, capacity / (2 n)). */
export function leaseAllowance(plan: Plan, instances: number): number {
  if (plan.capacity < 20) return 0;
  const lease = Math.min(Math.floor(plan.capacity / 10), Math.max(100, Math.floor(plan.refill / 10)));
  return 2 * instances * Math.min(lease, plan.capacity / (2 * instances));
}

/**
 * The other side of the bucket: a key that stays under its plan is never refused. The client's
 * own model of the bucket (full at its first request, refilled at the plan's rate, one token per
 * request that may have been admitted) must be empty when perch refuses, but for the lease bound
 * of docs/rate-limits.md: refused early only while other instances hold tokens (the allowance),
 * never for more than a second. A second that holds each token: a key spending at its refill
 * keeps its bucket low, so one instance's lease after another holds its last few tokens, and
 * the refusals run on, each while a different lease is out (seed 15, a plan of {20, 5} at its
 * refill over 3 instances: refused now and then for 4 s with about 4 tokens on lease, admitted
 * in between). So the second counts from the first early refusal with no admission since: a
 * lease that held its tokens longer would keep the client out altogether, or, lost, leave the
 * model more tokens than the allowance.
 */
export const underPlanNeverRefused: Invariant = {
  name: 'underPlanNeverRefused',
  bound: "a refusal by the limiter only when the plan's bucket, replayed from what the key sent, holds < 1.5 tokens + 0.1 s of refill; or, for at most a second with nothing admitted, < that + the lease allowance (2 x n x min(lease, capacity / (2 x n)), n the processes that lease, plans of 20 or more)",
  check: (h) => {
    const out: Violation[] = [];
    for (const [key, all] of requestsByKey(h)) {
      // The largest plan a reload set, for the allowances; the bucket is replayed with the smallest in force.
      const plan = planDuring(h, key, -Infinity, Infinity);
      if (plan === undefined) continue;
      // One token, and half a token and a tenth of a second's refill for the clocks (ours, Redis TIME).
      const base = 1.5 + plan.refill * 0.1;
      const allowance = leaseAllowance(plan, leasers(h));
      let tokens = plan.capacity;
      let last = all[0]?.sent ?? 0;
      let earlySince: number | undefined;
      let lastRefusal = -Infinity;
      // Pass-through: a key is the provider's to accept; only refusals after its first answer count.
      let accepted = !h.run.passThrough;
      for (const r of all) {
        const inForce = planDuring(h, key, last, r.sent, true) ?? plan;
        tokens = Math.min(inForce.capacity, tokens + (inForce.refill * (r.sent - last)) / 1000);
        last = r.sent;
        if (!rateLimited(r)) {
          if (r.status === 200 || r.status === 304) accepted = true;
          // Answered, so admitted: the early refusals before it were not one stretch.
          if (r.status > 0) earlySince = undefined;
          tokens -= 1;
          continue;
        }
        // Requests of the key sent while this one was on its way may have reached perch first.
        const overtaking = all.filter((o) => o.sent > r.sent && o.sent <= r.done && !rateLimited(o)).length;
        const left = tokens - overtaking;
        if (r.sent - lastRefusal > 2000 || left < base) earlySince = undefined;
        lastRefusal = r.sent;
        if (!accepted || left < base) continue;
        earlySince ??= r.sent;
        const why = left >= base + allowance ? `allowance ${allowance.toFixed(1)}` : r.sent - earlySince > 1000 ? `refused early since t=${Math.round(earlySince)}, more than a second` : undefined;
        if (why === undefined) continue;
        const trouble = anyTrouble(h, r.sent - 10_000, r.sent);
        out.push({ invariant: 'underPlanNeverRefused', message: `key ${key} refused at t=${Math.round(r.sent)} with ${left.toFixed(1)} tokens left in its plan (${why})`, at: r.sent, slice: [...trouble, ...all.filter((o) => o.sent <= r.sent).slice(-5)] });
        break;
      }
    }
    return out;
  },
};

/** A purge's scope, as the resource it names (`*`: all), covers a resource. */
function covers(scope: string, resource: string): boolean {
  return scope === '*' || resource === scope;
}

/** A request's resource: its path without the query (cursors and counts are the same resource). */
export function resourceOf(path: string): string {
  return path.split('?')[0]!;
}

/** docs/caching.md "Purging": a purge answered 200 is a miss on the next GET on every instance. */
export const purgeWins: Invariant = {
  name: 'purgeWins',
  bound: "a 200 sent after a purge was answered 200 carries a body the provider answered to a call that began after the purge was sent; but on an instance cut off from Redis when the purge was made, until a second after it is back, from its memory (not one its Cache-Status says came from Redis)",
  check: (h) => {
    const out: Violation[] = [];
    const purges = h.purges.filter((p) => p.status === 200);
    for (const r of h.requests) {
      if (r.status !== 200 || r.version === undefined) continue;
      const res = resourceOf(r.path);
      const purge = purges.filter((p) => p.done < r.sent && covers(p.scope, res)).sort((a, b) => b.done - a.done)[0];
      if (purge === undefined) continue;
      const fetched = h.calls.some((c) => c.start >= purge.sent && c.resources.some((x, i) => x === res && c.versions?.[i] === r.version));
      if (fetched) continue;
      // docs/caching.md: an instance cut off from Redis misses purges and serves its memory until
      // it reconnects and resyncs (a second for both); what it reads in Redis meanwhile it judges
      // by the counters read with it.
      const fromRedis = r.cache?.includes('detail=redis') === true;
      if (!fromRedis && h.faults.some((f) => f.kind === 'relay-cut' && f.inst === r.inst && f.at <= purge.done && r.sent <= f.until + 1000)) continue;
      const earlier = h.calls.filter((c) => c.resources.includes(res) && c.start < purge.sent).slice(-2);
      // Issue 58: a request after the purge joins a flight that began before it. With no such
      // flight (or Redis, which holds the purge counters, restarted) the purge did not hold at all.
      const joined = earlier.some((c) => c.end >= purge.sent);
      const trouble = redisTrouble(h, purge.sent, r.done);
      out.push({ invariant: 'purgeWins', message: `${res} v${r.version} answered at t=${Math.round(r.done)} (sent t=${Math.round(r.sent)}) after a purge acknowledged at t=${Math.round(purge.done)}, and no call since the purge answered it${joined ? ' (a flight begun before the purge)' : ''}`, at: r.sent, slice: [...trouble, purge, ...earlier, r] });
    }
    return out.slice(0, 5);
  },
};

function answersOn(h: History): Map<string, RequestEvent[]> {
  const by = new Map<string, RequestEvent[]>();
  for (const r of h.requests) {
    if (r.status !== 200 && r.status !== 304) continue;
    const k = `${r.inst}/${r.gen}/${r.path}`;
    by.set(k, [...(by.get(k) ?? []), r]);
  }
  return by;
}

/** docs/caching.md: no time travel: one instance never answers an older body after a newer one. */
export const versionsMonotonic: Invariant = {
  name: 'versionsMonotonic',
  bound: 'per instance process and path, a 200 sent after another was answered carries a version >= that one',
  check: (h) => {
    const out: Violation[] = [];
    for (const list of answersOn(h).values()) {
      const bodies = list.filter((r) => r.status === 200 && r.version !== undefined);
      // The newest version answered before each request was sent, whichever request of those it was:
      // answers overlap, so the one answered last need not be the newest.
      const byDone = [...bodies].sort((a, b) => a.done - b.done);
      let newest: RequestEvent | undefined;
      let k = 0;
      for (const r of bodies) {
        for (; k < byDone.length && byDone[k]!.done < r.sent; k++) if (newest === undefined || byDone[k]!.version! > newest.version!) newest = byDone[k];
        if (newest !== undefined && r.version! < newest.version!) {
          out.push({ invariant: 'versionsMonotonic', message: `instance ${r.inst} answered ${resourceOf(r.path)} v${r.version} after v${newest.version}`, at: r.sent, slice: [newest, r] });
          break;
        }
      }
    }
    return out;
  },
};

/**
 * The TTLs (s) that may have been in force while call `c` was made, a reload taking up to
 * RELOAD_SETTLE_MS to apply: the entry it stored keeps one of them (its `ttlMs`, from the time
 * the provider answered), whatever a later reload sets.
 */
function ttlsStoring(h: History, c: CallEvent): number[] {
  const configs = [...h.configs].sort((a, b) => a.at - b.at);
  return [{ at: -Infinity, ttl: h.run.ttl }, ...configs].filter((s, i) => s.at <= c.end && (configs[i]?.at ?? Infinity) + RELOAD_SETTLE_MS >= c.start).map((s) => s.ttl);
}

/** docs/caching.md "Stale serving": nothing is served older than its TTL plus `stale_seconds`. */
export const staleWithinBound: Invariant = {
  name: 'staleWithinBound',
  bound: 'a 200 body was answered by the provider at most ttl + stale_seconds (+1.5 s for whole seconds) before it was sent, ttl the one in force when that answer was stored (the largest a reload may have left in force during the call)',
  check: (h) => {
    const out: Violation[] = [];
    const ttlOf = (c: CallEvent) => Math.max(...ttlsStoring(h, c));
    const expiry = (c: CallEvent) => c.end + (ttlOf(c) + h.run.staleSeconds) * 1000 + 1500;
    for (const r of h.requests) {
      if (r.status !== 200 || r.version === undefined) continue;
      const res = resourceOf(r.path);
      const sources = h.calls.filter((c) => c.start < r.done && c.resources.some((x, i) => x === res && c.versions?.[i] === r.version));
      if (sources.length === 0) {
        out.push({ invariant: 'staleWithinBound', message: `${res} v${r.version} answered, but the provider never answered that version`, at: r.sent, slice: [r] });
        continue;
      }
      const source = sources.reduce((a, b) => (expiry(b) >= expiry(a) ? b : a));
      if (r.sent > expiry(source)) out.push({ invariant: 'staleWithinBound', message: `${res} v${r.version} answered ${Math.round(r.sent - source.end)} ms after the provider last answered it (ttl ${ttlOf(source)} s + stale ${h.run.staleSeconds} s)`, at: r.sent, slice: [source, r] });
    }
    return out.slice(0, 5);
  },
};

/** docs/caching.md "Compression and revalidation": 304 only when the client's copy is the current body. */
export const notModifiedMatches: Invariant = {
  name: 'notModifiedMatches',
  bound: 'a 304 between two 200s of the same instance and path carrying the same body v is only for a validator taken from v',
  check: (h) => {
    const out: Violation[] = [];
    for (const list of answersOn(h).values()) {
      for (let i = 0; i < list.length; i++) {
        const r = list[i]!;
        if (r.status !== 304 || r.validatorVersion === undefined) continue;
        const before = list.slice(0, i).filter((o) => o.status === 200 && o.done < r.sent).at(-1);
        const after = list.slice(i + 1).find((o) => o.status === 200 && o.sent > r.done);
        if (before?.version === undefined || after?.version !== before.version) continue;
        if (r.validatorVersion !== before.version) out.push({ invariant: 'notModifiedMatches', message: `304 for ${r.validator} of v${r.validatorVersion} while the instance served v${before.version} before and after`, at: r.sent, slice: [before, r, after] });
      }
    }
    return out.slice(0, 5);
  },
};

/** docs/configuration.md `auth`, docs/upstreams.md "Pass-through auth": nothing to a key nobody accepted. */
export const authOnlyAccepted: Invariant = {
  name: 'authOnlyAccepted',
  bound: 'no 200 or 304 to a made-up key (not in auth.keys; in pass-through, refused by the provider)',
  check: (h) =>
    h.requests
      .filter((r) => r.key === 'madeup' && (r.status === 200 || r.status === 304))
      .slice(0, 5)
      .map((r) => ({ invariant: 'authOnlyAccepted', message: `${r.status} to a made-up key for ${r.path}`, at: r.sent, slice: [r] })),
};

/** The upstream a path goes to: with batching, user, username and tweet lookups go to X. */
export function upstreamOf(h: History, path: string): 'v1' | 'x' {
  return h.run.batch && /^\/v1\/(users\/\d+|users\/by\/username\/[^/?]+|tweets\/\d+)(\?|$)/.test(path) ? 'x' : 'v1';
}

/** The spec's endpoint of a path (without its query): a pass-through verdict holds for one. */
export function endpointOf(resource: string): string {
  if (resource.startsWith('/v1/users/by/username/')) return 'username';
  const sub = /^\/v1\/users\/\d+\/(\w+)$/.exec(resource);
  if (sub !== null) return sub[1]!;
  return /^\/v1\/tweets\//.test(resource) ? 'tweet' : 'user';
}

/** The client key whose secret a pass-through call carried (the fleet's `fleet-genuine-<key>-<n>`). */
function keyOfCred(cred: string): string | undefined {
  return /^fleet-genuine-(.+)-\d+$/.exec(cred)?.[1];
}

/**
 * docs/upstreams.md "What the cache serves to a key": the provider's latest verdict on `key` for
 * `endpoint` at `at` is an acceptance (a 200 or its own 404 to a call with the key there; no 401
 * for the key, or 403 there, since) given less than twice `verify_ttl_seconds` before, with half
 * a second for the verdict to reach every instance through Redis.
 */
function acceptedOn(h: History, key: string, endpoint: string, at: number): boolean {
  const ttlMs = (h.run.verifyTtl ?? 2) * 1000;
  const verdicts = h.calls.filter((c) => c.end < at && keyOfCred(c.cred) === key && (c.status === 401 || endpointOf(resourceOf(c.path)) === endpoint) && [200, 404, 401, 403].includes(c.status));
  const latest = verdicts.at(-1);
  return latest !== undefined && (latest.status === 200 || latest.status === 404) && at - latest.end < 2 * ttlMs - 500;
}

/**
 * A 429 perch gives on the provider's behalf (the cache was asked: Cache-Status is set) only when
 * something was over: the call cap, the quota, max_concurrent, a stop, the key's budget, a breaker.
 * The docs state no exact bound for "nothing over" (fair shares, an instance's share while its
 * Redis connection comes up), so this one is advisory: reported, failing only with
 * `--known-open fail`; but for a key the provider accepted in pass-through, which docs/upstreams.md
 * keeps apart from unknown keys' verifying calls.
 */
/**
 * docs/provider.md: for a quota window after the fleet's first start, or after Redis restarted
 * (empty or from its file), each instance keeps to `redis_down_share` of the quota, however
 * little the others spend, counting its own calls from before the restart. Whether `r`'s instance
 * had spent that much of it when `r` was refused (calls no process is known for may be any
 * process's).
 */
function quotaShareSpent(h: History, r: RequestEvent, caps: Caps, calls: readonly CallEvent[]): boolean {
  const windowMs = caps.quota.perSeconds * 1000;
  const started = Math.min(Infinity, ...h.procs.filter((p) => p.kind === 'start' && p.gen === 1).map((p) => p.at));
  // The window starts at the first ask after the start or restart: by the first call after it at
  // the latest, and, when every ask since was refused, not yet ended.
  const inWindow = [started, ...h.faults.filter((f) => f.kind === 'redis-kill' || f.kind === 'redis-restart').map((f) => f.until)].some((at) => {
    const latestStart = Math.min(r.done, ...calls.filter((c) => c.start >= at).map((c) => c.start));
    return at <= r.done && r.sent <= latestStart + windowMs + 1000;
  });
  if (!inWindow) return false;
  const own = calls.filter((c) => (c.inst === undefined || c.inst === r.inst) && c.start >= r.sent - windowMs - 1000 && c.start <= r.done).length;
  return own >= Math.floor(caps.downShare * caps.quota.requests) - 1;
}

/** How long after a refusal a call admitted before it may still be on its way to the stand-in. */
const ADMITTED_AHEAD_MS = 300;

export const refusalOnlyOverCap: Invariant = {
  name: 'refusalOnlyOverCap',
  bound: 'a provider-side 429 only when, around it, calls filled seven tenths of the cap (in the second before and while it waited), the quota (each with the calls stamped up to 0.3 s after it) or max_concurrent, its instance\'s share of the quota in a quota window after the fleet\'s start or a Redis restart, or a stop, a budget, a provider failure or a Redis fault was there; in pass-through, to a key whose latest verdict on the endpoint is an acceptance less than twice verify_ttl_seconds old',
  check: (h) => {
    const out: Violation[] = [];
    for (const r of h.requests) {
      if (r.status !== 429 || rateLimited(r) || r.key === 'budget') continue;
      // Pass-through: a key the provider has not accepted there lately may be refused a verifying call.
      if (h.run.passThrough && !acceptedOn(h, r.key, endpointOf(resourceOf(r.path)), r.sent)) continue;
      const from = r.sent - 1000;
      // A failing provider may be shed for a throttle window (10 s by default) after; a 429's stop lasts its Retry-After.
      const providerFaults = h.faults.filter((f) => f.kind.startsWith('provider') && f.at <= r.done && f.until + (f.kind === 'provider-limit' ? 6000 : f.kind === 'provider-slow' || f.kind === 'provider-reject' ? 2000 : 15_000) >= from);
      // Redis away: admissions fall back to each instance's share, refused once that is spent; after it
      // returns (or the fleet starts) each keeps to its share 4 s more (docs/provider.md), a second to reconnect.
      if (providerFaults.length > 0 || redisTrouble(h, from, r.done).some((f) => f.until + 5000 >= from)) continue;
      let over = false;
      for (const u of [upstreamOf(h, r.path)]) {
        const caps = capsDuring(h, u, from, r.done, true);
        if (caps === undefined) continue;
        const calls = callsOf(h, u);
        // A call admitted as the refusal was decided reaches the stand-in a little after it.
        const admittedBy = r.done + ADMITTED_AHEAD_MS;
        const near = calls.filter((c) => c.start >= from && c.start <= admittedBy).length;
        const quotaFrom = r.sent - caps.quota.perSeconds * 1000;
        const inQuota = calls.filter((c) => c.start >= quotaFrom && c.start <= admittedBy).length;
        const inFlight = Math.max(0, ...calls.filter((c) => c.start <= r.done && c.end >= r.sent).map((c) => calls.filter((o) => o.start <= c.start && o.end >= c.start).length));
        // In pass-through a 401 is the provider refusing a made-up key, no stop.
        const stopped = calls.some((c) => (c.status === 429 || (c.status === 401 && !h.run.passThrough) || c.status >= 500) && c.end >= r.sent - 300_000 && c.end <= r.done);
        // A call holds its place in the windows until a window after its answer (docs/provider.md):
        // a busy cap sends a little under its rate; seven tenths of it counts as full.
        if (near >= Math.floor(0.7 * caps.rate * ((r.done - from) / 1000)) || inQuota >= caps.quota.requests - 1 || inFlight >= caps.maxConcurrent || stopped || quotaShareSpent(h, r, caps, calls)) over = true;
      }
      if (!over) out.push({ invariant: 'refusalOnlyOverCap', message: `429 for ${r.path} (${r.cache}) to key ${r.key}${h.run.passThrough ? ', which the provider accepted,' : ''} with nothing over the cap around it`, at: r.sent, slice: [r, ...h.calls.filter((c) => c.start >= from && c.start <= r.done)], ...(h.run.passThrough ? {} : { advisory: true as const }) });
    }
    return out.slice(0, 5);
  },
};

/**
 * docs/upstreams.md "Pass-through auth": a key the provider accepted keeps reading the cache while
 * its acceptance is revalidated; made-up keys flooding the verifying calls cannot starve it.
 */
export const acceptedKeyReadsCache: Invariant = {
  name: 'acceptedKeyReadsCache',
  bound: 'in pass-through, no 429 to a key whose latest verdict on the endpoint is an acceptance less than twice verify_ttl_seconds (less 0.5 s) old, for a path without a query the provider answered 200 less than the TTL (the one in force when it answered, the smallest a reload may have left then, less 0.5 s) before, with no purge of it, no Redis fault and no provider 429 since',
  check: (h) => {
    if (!h.run.passThrough) return [];
    const out: Violation[] = [];
    for (const r of h.requests) {
      if (r.status !== 429 || rateLimited(r) || r.key === 'madeup') continue;
      // The stand-in knows calls by path alone: which page (`cursor`) or size (`count`) it
      // answered is not in the history, so only a request without a query is known to be cached.
      if (r.path.includes('?')) continue;
      const res = resourceOf(r.path);
      if (!acceptedOn(h, r.key, endpointOf(res), r.sent)) continue;
      // The entry keeps the TTL in force when it was stored: the smallest a reload may have left then.
      const ttlOf = (c: CallEvent) => Math.min(...ttlsStoring(h, c));
      // The v1 stand-in records no query: a call counts for the first page only while a request
      // for it alone, on the instance that made it, was waiting.
      const firstPage = (c: CallEvent) => h.run.batch || h.requests.some((q) => (c.inst === undefined || q.inst === c.inst) && q.path === res && q.sent <= c.start && q.done >= c.end);
      const fresh = h.calls.find((c) => c.status === 200 && c.resources.includes(res) && c.end < r.sent && r.sent < c.end + ttlOf(c) * 1000 - 500 && firstPage(c));
      if (fresh === undefined) continue;
      const ttl = ttlOf(fresh);
      if (h.purges.some((p) => (p.scope === '*' || p.scope === res) && p.sent <= r.sent && p.done >= fresh.end)) continue;
      if (redisTrouble(h, fresh.end, r.sent).length > 0 || h.calls.some((c) => c.status === 429 && c.end >= fresh.end - 5000 && c.end <= r.sent)) continue;
      out.push({ invariant: 'acceptedKeyReadsCache', message: `accepted key ${r.key} refused 429 for ${res}, cached fresh from t=${Math.round(fresh.end)} (ttl ${ttl} s)`, at: r.sent, slice: [fresh, r] });
    }
    return out.slice(0, 5);
  },
};

/** docs/configuration.md `server.miss_deadline_ms`: a bound on everything a miss waits for. */
export const liveness: Invariant = {
  name: 'liveness',
  bound: 'every request answered within miss_deadline_ms + 2 s; no connection failure on an instance that was not being stopped (sent a signal before the answer was due); no process exiting that was sent no signal',
  check: (h) => {
    const out: Violation[] = [];
    // Every exit the fleet makes it sends a signal for: one without is perch crashing (or exiting on its own).
    for (const p of h.procs) if (p.kind === 'exit' && p.sentSignal === undefined) out.push({ invariant: 'liveness', message: `instance ${p.inst} (process ${p.gen}) exited unbidden (code ${p.code}, signal ${p.signal})`, at: p.at, slice: [...h.faults.filter((f) => f.at <= p.at && f.until + SETTLE_MS >= p.at), p] });
    for (const r of h.requests) {
      if (r.status > 0 && r.done - r.sent > h.run.missDeadlineMs + 2000) out.push({ invariant: 'liveness', message: `${r.path} answered after ${Math.round(r.done - r.sent)} ms (miss_deadline_ms ${h.run.missDeadlineMs})`, at: r.sent, slice: [...h.faults.filter((f) => f.at <= r.done && f.until >= r.sent), r] });
      if (r.status === 0) {
        // Being stopped: sent a signal, before its answer was due (a request left hanging until a
        // kill ended it failed its deadline first). A process that died unbidden is no excuse (it is reported above).
        const due = r.sent + h.run.missDeadlineMs + 2000;
        const stopping = h.procs.some((p) => p.inst === r.inst && p.gen === r.gen && p.kind === 'exit' && p.signalAt !== undefined && p.signalAt <= Math.min(r.done + 200, due));
        if (!stopping) out.push({ invariant: 'liveness', message: `connection failed (${r.error}) on instance ${r.inst} that was not being stopped`, at: r.sent, slice: [r] });
      }
    }
    return out.slice(0, 5);
  },
};

/** docs/configuration.md `server.shutdown_grace_ms`: SIGTERM ends the process within the drain. */
export const termWithinGrace: Invariant = {
  name: 'termWithinGrace',
  bound: 'a SIGTERMed process exits within shutdown_grace_ms + 1 s',
  check: (h) =>
    h.procs
      .filter((p) => p.kind === 'exit' && p.sentSignal === 'SIGTERM' && p.at - p.signalAt! > h.run.graceMs + 1000)
      .map((p) => ({ invariant: 'termWithinGrace', message: `instance ${p.inst} took ${Math.round(p.at - p.signalAt!)} ms to exit after SIGTERM (grace ${h.run.graceMs} ms)`, at: p.signalAt!, slice: [p] })),
};

/** docs/observability.md "Logs": JSON lines on stdout and nothing else. */
export const stdoutWholeJson: Invariant = {
  name: 'stdoutWholeJson',
  bound: 'every stdout line of every instance is one whole JSON object',
  check: (h) =>
    h.stdouts
      .filter((s) => s.badLines.length > 0)
      .map((s) => ({ invariant: 'stdoutWholeJson', message: `instance ${s.inst} (process ${s.gen}): ${s.badLines.length} lines not JSON, first: ${s.badLines[0]!.slice(0, 200)}`, at: 0, slice: [s] })),
};

/** docs/observability.md: one access line per request. */
export const accessLinesMatch: Invariant = {
  name: 'accessLinesMatch',
  bound: 'for a process that ended on SIGTERM or ran to the end: every answer has its access line (by X-Request-Id), and every access line is a request sent to it (with workers, or to the process before it, whose workers drain after it was killed)',
  check: (h) => {
    const out: Violation[] = [];
    for (const s of h.stdouts) {
      if (!s.clean) continue;
      const logged = new Set(s.accessIds);
      const sent = h.requests.filter((r) => r.inst === s.inst && r.gen === s.gen);
      const missing = sent.filter((r) => r.status > 0 && !logged.has(r.id));
      // With workers, the workers of a process SIGKILLed before drain what they hold: their lines
      // may reach the next process's log. A request sent to an earlier process of the instance.
      const earlier = new Set(h.requests.filter((r) => r.inst === s.inst && r.gen < s.gen && processesOf(h, s.inst) > 1).map((r) => r.id));
      const ids = new Set(sent.map((r) => r.id));
      const extra = s.accessIds.filter((id) => !ids.has(id) && !earlier.has(id));
      if (missing.length > 0 || extra.length > 0) out.push({ invariant: 'accessLinesMatch', message: `instance ${s.inst} (process ${s.gen}): ${missing.length} answers without an access line, ${extra.length} access lines of no request sent`, at: missing[0]?.sent ?? 0, slice: missing.slice(0, 5) });
    }
    return out;
  },
};

/** docs/configuration.md "Reloading": a SIGHUP adds and removes client keys. */
export const authFollowsReload: Invariant = {
  name: 'authFollowsReload',
  bound: `with auth.keys, no 200 or 304 to a key no config in force while it was on its way named, and no 401 to a key every config in force then named (a reload applies within ${RELOAD_SETTLE_MS} ms)`,
  check: (h) => {
    if (h.run.passThrough) return [];
    const out: Violation[] = [];
    for (const r of h.requests) {
      if (r.key === 'madeup') continue;
      const states = plansDuring(h, r.key, r.sent, r.done);
      const answered = r.status === 200 || r.status === 304;
      if (answered && states.every((p) => p === undefined)) out.push({ invariant: 'authFollowsReload', message: `${r.status} to key ${r.key}, which the config in force did not name`, at: r.sent, slice: [...h.configs.filter((c) => c.at <= r.done).slice(-2), r] });
      if (r.status === 401 && states.every((p) => p !== undefined)) out.push({ invariant: 'authFollowsReload', message: `401 to key ${r.key}, which the config in force named`, at: r.sent, slice: [...h.configs.filter((c) => c.at <= r.done).slice(-2), r] });
    }
    return out.slice(0, 5);
  },
};

/** The upstream names the stand-ins' calls go to in the config the fleet writes. */
const UPSTREAM_NAME = { v1: 'main', x: 'x' } as const;

/** Per status, how many answers the history holds; `-1` and `0` (no answer seen) are counted apart. */
function byStatus(requests: readonly RequestEvent[]): { seen: Record<string, number>; unseen: number } {
  const seen: Record<string, number> = {};
  let unseen = 0;
  for (const r of requests) {
    if (r.status <= 0) unseen++;
    else seen[String(r.status)] = (seen[String(r.status)] ?? 0) + 1;
  }
  return { seen, unseen };
}

/**
 * docs/observability.md "Metrics": the counters say what clients and the provider saw. Only the
 * processes alive at the end are compared: a process SIGKILLed or SIGTERMed mid-run took its
 * counters with it, and a worker started again counts from zero.
 */
export const metricsMatchHistory: Invariant = {
  name: 'metricsMatchHistory',
  bound:
    'for each process alive at the end, scraped before SIGTERM once no provider call was open, none of its workers restarted: perch_requests_total by status >= the answers the history has of that process by status, and in all exceeds them by at most its requests the client gave up on or lost the connection of; provider exchanges (perch_upstream_requests_total + perch_upstream_retries_total{decision="retried"}) per upstream <= the calls the stand-ins got from that instance since its previous process exited <= those exchanges + the calls among them answered 401, 403 or 429 (the exchange goes on with the next credential) or still open when read, calls the stand-ins could not trace to a process (off Linux) counted as those of any process; without batching, perch_key_upstream_calls_total of key budget = the calls for its paths',
  check: (h) => {
    const out: Violation[] = [];
    for (const m of h.metrics ?? []) {
      if (!m.whole) continue;
      const mine = h.requests.filter((r) => r.inst === m.inst && r.gen === m.gen);
      const { seen, unseen } = byStatus(mine);
      const statuses = [...new Set([...Object.keys(seen), ...Object.keys(m.requests)])].sort();
      const short = statuses.filter((s) => (m.requests[s] ?? 0) < (seen[s] ?? 0));
      const over = statuses.reduce((n, s) => n + Math.max(0, (m.requests[s] ?? 0) - (seen[s] ?? 0)), 0);
      const where = `instance ${m.inst} (process ${m.gen})`;
      const counts = statuses.map((s) => `${s}: ${m.requests[s] ?? 0} counted, ${seen[s] ?? 0} seen`).join('; ');
      if (short.length > 0 || over > unseen) out.push({ invariant: 'metricsMatchHistory', message: `${where}: perch_requests_total ${counts}; ${unseen} answers not seen by their client`, at: m.at, slice: [m] });
      const previousExit = Math.max(-Infinity, ...h.procs.filter((p) => p.inst === m.inst && p.kind === 'exit' && p.gen < m.gen).map((p) => p.at));
      const during = h.calls.filter((c) => c.start > previousExit && c.start <= m.at);
      // A call whose connection the stand-in could not trace to a process (not on Linux) may be
      // anyone's; with workers, one within the drain after the previous process was killed may be
      // its workers' (they drain what they hold once their primary is gone).
      const drained = processesOf(h, m.inst) > 1 ? previousExit + h.run.graceMs : -Infinity;
      const calls = during.filter((c) => c.inst === m.inst && c.start > drained);
      const unknown = during.filter((c) => c.inst === undefined || (c.inst === m.inst && c.start <= drained));
      for (const u of ['v1', 'x'] as const) {
        if (u === 'x' && !h.run.batch) continue;
        const made = calls.filter((c) => c.upstream === u);
        const counted = m.calls[UPSTREAM_NAME[u]] ?? 0;
        const maybe = unknown.filter((c) => c.upstream === u).length;
        // A 401, 403 or 429 on one credential sends the same exchange on with the next credential: one call more.
        const switched = made.filter((c) => c.status === 401 || c.status === 403 || c.status === 429).length;
        // A call still open when the counters were read (a background refresh let out late) is not counted yet.
        const open = made.filter((c) => c.end > m.at).length;
        if (counted > made.length + maybe || made.length > counted + switched + open) out.push({ invariant: 'metricsMatchHistory', message: `${where}: ${counted} exchanges with upstream ${UPSTREAM_NAME[u]} counted, ${made.length} calls reached it (${switched} answered 401, 403 or 429${maybe > 0 ? `; ${maybe} of no known instance` : ''})`, at: m.at, slice: [m, ...made.slice(-5)] });
      }
      const budgetKey = h.run.passThrough || h.run.batch ? undefined : h.run.keys['budget'];
      if (budgetKey !== undefined) {
        const ofBudget = (c: CallEvent) => c.upstream === 'v1' && c.resources.some((r) => r.startsWith(h.run.budgetPrefix));
        const made = calls.filter(ofBudget);
        const maybe = unknown.filter(ofBudget).length;
        const counted = m.keyCalls['budget']?.[UPSTREAM_NAME.v1] ?? 0;
        if (counted < made.filter((c) => c.end <= m.at).length || counted > made.length + maybe) out.push({ invariant: 'metricsMatchHistory', message: `${where}: ${counted} provider calls counted for key budget, ${made.length} calls for its paths reached the provider${maybe > 0 ? ` (${maybe} of no known instance)` : ''}`, at: m.at, slice: [m, ...made.slice(-5)] });
      }
    }
    return out;
  },
};

export const INVARIANTS: readonly Invariant[] = [
  providerRate,
  providerQuota,
  providerConcurrency,
  providerStops,
  perKeyBudget,
  rateLimitUpper,
  underPlanNeverRefused,
  purgeWins,
  versionsMonotonic,
  staleWithinBound,
  notModifiedMatches,
  authOnlyAccepted,
  refusalOnlyOverCap,
  acceptedKeyReadsCache,
  liveness,
  termWithinGrace,
  stdoutWholeJson,
  accessLinesMatch,
  authFollowsReload,
  metricsMatchHistory,
];

export function checkAll(h: History, only?: readonly string[]): Violation[] {
  return INVARIANTS.filter((i) => only === undefined || only.includes(i.name)).flatMap((i) => i.check(h));
}
