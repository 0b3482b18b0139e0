import { randomBytes } from 'node:crypto';
import type { Clock } from '../../clock.js';
import { QuotaLog } from './quota-log.js';
import { CLOCK_GRANULARITY_MS, stopKeysFor, type Admission, type AdmitQuery, type CallCap, type HeldCall, type ProviderState, type Spend, type SpendQuery, type Stop, type StopState } from './provider-state.js';

/** Slack for floating-point refills, as in the client token buckets. */
const EPSILON = 1e-9;
/**
 * How soon a call that waits for a call in flight (a concurrency slot, or a window held by a call
 * not answered yet) looks again, when no answer of this instance wakes it first.
 */
export const IN_FLIGHT_POLL_MS = 25;

interface Ledger {
  tokens: number;
  at: number;
  /**
   * The rate's sliding log: call -> when its window membership starts to age (its answer; in
   * flight, the end of its lease). It holds about a second's calls, so one entry each is cheap.
   */
  readonly recent: Map<string, number>;
  /** The quota's, whose window may be a month: counted per slice (quota-log.ts). */
  quota: QuotaLog | undefined;
  /** Concurrency leases: id -> expiry. */
  readonly leases: Map<string, number>;
}

/**
 * Stops and caps in this process, on the injected clock: alone without Redis, and as the
 * insurance while Redis is unreachable. Maps grow with configured upstreams, credentials and
 * endpoints only; stops are dropped once past.
 */
export class MemoryProviderState implements ProviderState {
  readonly #clock: Clock;
  /**
   * Names this state's answered quota calls (`held`, and in Redis once answered): 72 random bits,
   * unique across a fleet and its restarts, and a name no longer than the lease id it replaces.
   */
  readonly #id = randomBytes(9).toString('base64url');
  readonly #stops = new Map<string, { untilMs: number; state: StopState }>();
  /** Turns taken with `claim`, until when. */
  readonly #claims = new Map<string, number>();
  readonly #ledgers = new Map<string, Ledger>();
  /**
   * Calls counted per key and budget window (`own`: charged by this instance), with the query
   * that first charged it, dropped once their window has ended.
   */
  readonly #budgets = new Map<string, { used: number; own: number; endMs: number; query: SpendQuery }>();

  constructor(clock: Clock) {
    this.#clock = clock;
  }

  admit(query: AdmitQuery): Admission {
    const now = this.#clock.now();
    const { candidates, earliest } = this.unstopped(query);
    const chosen = candidates[0];
    if (chosen === undefined) return { kind: 'stopped', untilMs: earliest?.untilMs ?? now, state: earliest?.state ?? 'cooling_down' };
    const ledger = this.#ledger(query.upstream, query.cap, now);
    const waitMs = waitFor(ledger, query.cap, now);
    if (waitMs > 0) return { kind: 'over_cap', waitMs };
    take(ledger, query, now);
    return { kind: 'admitted', credential: chosen };
  }

  /** How long until `query.cap` admits a call here, 0 if now; takes no place. */
  waitMs(query: AdmitQuery): number {
    const now = this.#clock.now();
    return waitFor(this.#ledger(query.upstream, query.cap, now), query.cap, now);
  }

  /**
   * Counts a call the shared state admitted in this instance's windows and leases too, so that
   * if the shared state becomes unreachable the fallback starts from what this instance spent,
   * not from zero. Marks that have aged out are dropped from the logs' heads as calls arrive,
   * so a busy cap served from Redis keeps no more here than its windows hold.
   */
  record(query: AdmitQuery): void {
    const now = this.#clock.now();
    const ledger = this.#ledger(query.upstream, query.cap, now);
    if (query.cap.rate !== undefined) dropAged(ledger.recent, query.cap.rate.windowMs, now);
    take(ledger, query, now);
  }

  /**
   * Every call of `upstream` this instance still counts, admitted here or recorded, with its
   * marks on this instance's clock: what it writes back to a shared state that returns.
   */
  held(upstream: string): HeldCall[] {
    const ledger = this.#ledgers.get(upstream);
    if (ledger === undefined) return [];
    const calls: HeldCall[] = [];
    // Answered quota calls are counts per mark; each goes back as that many calls, named by this
    // state, the mark and their rank: the name its finish gave it in Redis too (`finish`), so
    // that writing back to a Redis that kept them, or twice, adds nothing, and two instances'
    // counts never merge.
    for (const [mark, count] of ledger.quota?.answered(this.#clock.now()) ?? []) {
      for (let i = 0; i < count; i++) calls.push({ id: this.#answeredName(`${mark}:${i}`), recent: undefined, quota: mark, lease: undefined });
    }
    const inFlight = ledger.quota?.inFlight;
    const ids = new Set([...ledger.recent.keys(), ...(inFlight?.keys() ?? []), ...ledger.leases.keys()]);
    for (const id of ids) calls.push({ id, recent: ledger.recent.get(id), quota: inFlight?.get(id), lease: ledger.leases.get(id) });
    return calls;
  }

  /** The upstreams with calls counted or stops known here. */
  upstreams(): string[] {
    const upstreams = new Set(this.#ledgers.keys());
    for (const key of this.#stops.keys()) upstreams.add(key.slice(0, key.indexOf('\n')));
    return [...upstreams];
  }

  /**
   * The stops of `upstream` still holding, each with its end: what goes back to a shared state
   * that returns (it may have restarted without them, or never heard of them).
   */
  stopsOf(upstream: string): Stop[] {
    const now = this.#clock.now();
    const stops: Stop[] = [];
    for (const [key, stop] of this.#stops) {
      const [up, credential, scope] = key.split('\n') as [string, string, string];
      if (up !== upstream) continue;
      if (stop.untilMs <= now) this.#stops.delete(key);
      else stops.push({ upstream, credential, scope, untilMs: stop.untilMs, state: stop.state });
    }
    return stops;
  }

  /**
   * The candidates no stop known here holds back, and, when there are none, the earliest end of
   * their stops. What this process learned itself is known at once, before any shared store.
   */
  unstopped(query: Pick<AdmitQuery, 'upstream' | 'scope' | 'candidates'>): { candidates: string[]; earliest?: { untilMs: number; state: StopState } } {
    const now = this.#clock.now();
    const candidates: string[] = [];
    let earliest: { untilMs: number; state: StopState } | undefined;
    for (const credential of query.candidates) {
      const stop = this.#stopFor(query.upstream, credential, query.scope, now);
      if (stop === undefined) candidates.push(credential);
      else if (earliest === undefined || stop.untilMs < earliest.untilMs) earliest = stop;
    }
    return earliest === undefined ? { candidates } : { candidates, earliest };
  }

  /**
   * Counts a call against the key's window if it has room: fewer than `limit` counted, and,
   * with `ownLimit`, fewer than that charged by this instance itself (as insurance: its share).
   */
  spend(query: SpendQuery, ownLimit = Infinity): Spend {
    const budget = this.#budget(query);
    if (budget.used >= query.limit || budget.own >= ownLimit) return { allowed: false, used: budget.used };
    budget.used++;
    budget.own++;
    return { allowed: true, used: budget.used };
  }

  /**
   * What the shared state said the key's window had spent, and whether it charged this call
   * there: the count here goes on from it when the shared state is away, not from what this
   * instance alone charged, and this instance's own charges bound what it may charge alone.
   */
  noteShared(query: SpendQuery, used: number, charged = false): void {
    const budget = this.#budget(query);
    budget.used = Math.max(budget.used, used);
    if (charged) budget.own++;
  }

  /** What this instance knows the key's window spent: the shared state's last word and its own charges since. */
  budgetUsed(query: SpendQuery): number {
    return this.#budgets.get(`${query.keyId}\n${query.startMs}`)?.used ?? 0;
  }

  /** Every budget window known here that has not ended, as the query that charged it. */
  budgetWindows(): SpendQuery[] {
    this.#forgetEndedBudgets();
    return [...this.#budgets.values()].map((budget) => budget.query);
  }

  /** A call charged here, or by the shared state for this instance and given back there: out of both counts. */
  refund(query: SpendQuery): void {
    const budget = this.#budgets.get(`${query.keyId}\n${query.startMs}`);
    if (budget === undefined) return;
    if (budget.used > 0) budget.used--;
    if (budget.own > 0) budget.own--;
  }

  #budget(query: SpendQuery): { used: number; own: number; endMs: number; query: SpendQuery } {
    const key = `${query.keyId}\n${query.startMs}`;
    let budget = this.#budgets.get(key);
    if (budget === undefined) {
      this.#forgetEndedBudgets();
      budget = { used: 0, own: 0, endMs: query.endMs, query };
      this.#budgets.set(key, budget);
    }
    return budget;
  }

  #forgetEndedBudgets(): void {
    const now = this.#clock.now();
    for (const [key, budget] of this.#budgets) if (budget.endMs <= now) this.#budgets.delete(key);
  }

  /** One process is no fleet: its fair queue is the admission queue's alone. */
  withdraw(): void {}

  /** One process is no fleet: the throttle's own counts are the whole window. */
  exchange(): undefined {
    return undefined;
  }

  /**
   * Also answers the end of the call's lease, if it held one, and the name the call has from now
   * on in the quota's answered calls (as `held` writes it back), if the quota counted it.
   */
  finish(upstream: string, leaseId: string): { lease: number | undefined; quotaName: string | undefined } {
    const ledger = this.#ledgers.get(upstream);
    if (ledger === undefined) return { lease: undefined, quotaName: undefined };
    const now = this.#clock.now();
    if (ledger.recent.has(leaseId)) ledger.recent.set(leaseId, now);
    const answered = ledger.quota?.settle(leaseId, now);
    const lease = ledger.leases.get(leaseId);
    ledger.leases.delete(leaseId);
    return { lease, quotaName: answered === undefined ? undefined : this.#answeredName(answered) };
  }

  #answeredName(nameInLog: string): string {
    return `${this.#id}:${nameInLog}`;
  }

  stop(stop: Stop): void {
    const key = stopKey(stop.upstream, stop.credential, stop.scope);
    const existing = this.#stops.get(key);
    // A longer stop is never shortened by a later, shorter one (a usage cap outlasts a 429).
    if (existing === undefined || existing.untilMs < stop.untilMs) this.#stops.set(key, { untilMs: stop.untilMs, state: stop.state });
  }

  lift(upstream: string, credential: string, scope: string, state: StopState): void {
    const key = stopKey(upstream, credential, scope);
    if (this.#stops.get(key)?.state === state) this.#stops.delete(key);
  }

  claim(upstream: string, what: string, ttlMs: number): boolean {
    const key = `${upstream}\n${what}`;
    const now = this.#clock.now();
    if ((this.#claims.get(key) ?? 0) > now) return false;
    this.#claims.set(key, now + ttlMs);
    return true;
  }

  async close(): Promise<void> {}

  #stopFor(upstream: string, credential: string, scope: string, now: number): { untilMs: number; state: StopState } | undefined {
    let latest: { untilMs: number; state: StopState } | undefined;
    for (const [c, s] of stopKeysFor(credential, scope)) {
      const key = stopKey(upstream, c, s);
      const stop = this.#stops.get(key);
      if (stop === undefined) continue;
      if (stop.untilMs <= now) {
        this.#stops.delete(key);
        continue;
      }
      if (latest === undefined || stop.untilMs > latest.untilMs) latest = stop;
    }
    return latest;
  }

  #ledger(upstream: string, cap: CallCap, now: number): Ledger {
    let ledger = this.#ledgers.get(upstream);
    if (ledger === undefined) {
      ledger = { tokens: cap.rate?.burst ?? 0, at: now, recent: new Map(), quota: undefined, leases: new Map() };
      this.#ledgers.set(upstream, ledger);
    }
    const quota = cap.quota;
    if (quota !== undefined && (ledger.quota?.windowMs !== quota.windowMs || ledger.quota.limit !== quota.requests)) {
      ledger.quota = ledger.quota?.rebuilt(quota.windowMs, quota.requests, now) ?? new QuotaLog(quota.windowMs, quota.requests);
    }
    return ledger;
  }
}

function stopKey(upstream: string, credential: string, scope: string): string {
  return `${upstream}\n${credential}\n${scope}`;
}

/** Milliseconds until every part of the cap admits one more call; 0 when it does now. */
function waitFor(ledger: Ledger, cap: CallCap, now: number): number {
  let wait = 0;
  if (cap.rate !== undefined) {
    const { perSecond, burst, windowLimit, windowMs } = cap.rate;
    ledger.tokens = Math.min(burst, ledger.tokens + (Math.max(0, now - ledger.at) * perSecond) / 1000);
    ledger.at = Math.max(ledger.at, now);
    const tokenWait = ledger.tokens + EPSILON < 1 ? Math.ceil(((1 - ledger.tokens) * 1000) / perSecond) : 0;
    const held = windowWait(ledger.recent, windowLimit, windowMs, now);
    if (held > 0 && held >= tokenWait) holdBurst(ledger, now + held);
    wait = Math.max(wait, tokenWait, held);
  }
  if (cap.quota !== undefined) wait = Math.max(wait, ledger.quota!.wait(now, IN_FLIGHT_POLL_MS));
  if (cap.maxConcurrent !== undefined) {
    for (const [id, expiry] of ledger.leases) if (expiry <= now) ledger.leases.delete(id);
    if (ledger.leases.size >= cap.maxConcurrent) wait = Math.max(wait, IN_FLIGHT_POLL_MS);
  }
  return wait;
}

/**
 * A call waits for the window, not for a token: the bucket keeps one token for the moment the
 * window lets it go and saves nothing more until then. A burst is for a cap that was idle; one
 * saved while calls waited would go out the moment the window moves, and since the window frees
 * places as it took them, every later second would start with the same clump, so a key owed the
 * next call could wait up to a whole window instead of one refill.
 */
function holdBurst(ledger: Ledger, until: number): void {
  ledger.tokens = 1;
  ledger.at = until;
}

/** A call whose mark is `t` counts in the window until `t + windowMs + CLOCK_GRANULARITY_MS` (exclusive). */
function windowWait(log: Map<string, number>, limit: number, windowMs: number, now: number): number {
  for (const [id, mark] of log) if (mark + windowMs + CLOCK_GRANULARITY_MS <= now) log.delete(id);
  if (log.size < limit) return 0;
  const edge = [...log.values()].sort((a, b) => a - b)[log.size - limit]!;
  // A mark in the future is a call in flight: its window ends a window after its answer.
  return edge > now ? IN_FLIGHT_POLL_MS : edge + windowMs + CLOCK_GRANULARITY_MS - now;
}

/**
 * Drops the aged marks at the head of a log. Marks go in roughly in order (an answer moves its
 * mark earlier, never later), so stopping at the first live one keeps at most a lease's worth
 * of aged marks, and each call costs O(1) however long the window.
 */
function dropAged(log: Map<string, number>, windowMs: number, now: number): void {
  for (const [id, mark] of log) {
    if (mark + windowMs + CLOCK_GRANULARITY_MS > now) return;
    log.delete(id);
  }
}

function take(ledger: Ledger, query: AdmitQuery, now: number): void {
  const { cap } = query;
  // Until its answer, a call counts as if it reached the provider at the end of its lease.
  const inFlight = now + query.leaseMs;
  if (cap.rate !== undefined) {
    ledger.tokens = Math.max(0, ledger.tokens - 1);
    ledger.recent.set(query.leaseId, inFlight);
  }
  if (cap.quota !== undefined) ledger.quota!.hold(query.leaseId, inFlight);
  if (cap.maxConcurrent !== undefined) ledger.leases.set(query.leaseId, inFlight);
}

