import type { ProviderProtectionConfig } from '../../config/types.js';
import type { Payer } from '../upstream.js';

/** Why calls on a credential (or a whole upstream) are stopped until a time. */
export type StopState = 'cooling_down' | 'usage_capped' | 'breaker_open' | 'forbidden';

/** Any credential, or any endpoint, in a stop record's key. */
export const ANY = '*';

/**
 * A stop the provider (or the breaker) asked for: calls by `credential` (or `ANY`) to endpoint
 * `scope` (or `ANY`) wait until `untilMs` on the clock.
 */
export interface Stop {
  readonly upstream: string;
  readonly credential: string;
  readonly scope: string;
  readonly untilMs: number;
  readonly state: StopState;
}

/**
 * How much longer than its window a call counts in a sliding log. Marks are whole milliseconds
 * (the system clock, and Redis `TIME` truncated), so a call marked `t` may have been answered up
 * to a millisecond after `t`; a log that let the next call start at `t + windowMs` let the
 * provider see an eleventh call in 999.8 ms under a cap of ten a second (the bench's fairness
 * scenario, timed at the provider to the microsecond, one instance, in both of two runs).
 */
export const CLOCK_GRANULARITY_MS = 1;

/**
 * perch's own cap on calls to one upstream, compiled from its config: a token bucket for the
 * burst, a sliding log so that no window of `windowMs` ever holds more than `windowLimit` calls
 * (the bucket alone lets `burst + rate` through in a second), an optional longer quota window
 * of the same kind, and a bound on calls in flight. A call in flight counts in both logs until
 * its answer and a window more (see `ProviderState.finish`). While a call waits for the sliding
 * log rather than for a token, the bucket keeps one token and saves no more, so a saturated cap
 * sends its calls one refill apart, not in a clump each window.
 */
export interface CallCap {
  readonly rate?: { readonly perSecond: number; readonly burst: number; readonly windowLimit: number; readonly windowMs: number };
  readonly quota?: { readonly requests: number; readonly windowMs: number };
  readonly maxConcurrent?: number;
}

export interface AdmitQuery {
  readonly upstream: string;
  /** The endpoint, or `ANY` when the upstream's cool-downs cover every endpoint. */
  readonly scope: string;
  /** Credential ids in the order to try them; the first not stopped is taken. */
  readonly candidates: readonly string[];
  readonly cap: CallCap;
  /** The cap this instance keeps alone while the shared state is unreachable (`redis_down_share`). */
  readonly localCap: CallCap;
  /** Names this call in the windows and the lease set until `finish`. */
  readonly leaseId: string;
  /** Bound on the lease, so a crashed instance does not hold a slot for ever. */
  readonly leaseMs: number;
  /** Who the call is for: the fleet's shared cap goes to the least-served waiting payer first. */
  readonly payer: Payer;
  /**
   * Whether this call waits when the cap refuses it, so that its payer's turn is registered in
   * the fleet's fair queue; false for a call answered `over_cap` at once. Default true.
   */
  readonly waits?: boolean;
  /**
   * Payers with other calls waiting on this instance whatever this call's answer (this call's
   * payer too when it has more): their fleet-wide turns are registered or renewed with this ask,
   * and when the fleet owes the cap to one of them the answer names it (`owed`).
   */
  readonly waiting?: readonly string[];
}

/** The answer to one admission: call on `credential`, everyone is stopped, or wait for the cap. */
export type Admission =
  | { readonly kind: 'admitted'; readonly credential: string }
  | { readonly kind: 'stopped'; readonly untilMs: number; readonly state: StopState }
  | {
      readonly kind: 'over_cap';
      readonly waitMs: number;
      /** The fleet's registration of the payer's turn lapses unless an ask renews it within this. */
      readonly renewMs?: number;
      /** The cap has room, but the fleet owes it to this payer, which waits on this instance. */
      readonly owed?: string;
    };

/**
 * A call one instance counts, with its marks on that instance's clock: in the rate log, the
 * quota log (each absent when not counted there), and the end of its lease while in flight
 * (absent once answered).
 */
export interface HeldCall {
  readonly id: string;
  readonly recent: number | undefined;
  readonly quota: number | undefined;
  readonly lease: number | undefined;
}

/** The fleet's counts of answered calls over an adaptive throttle's window (throttle.ts). */
export interface OutcomeTotals {
  readonly accepts: number;
  readonly failures: number;
  /** The slice of the fleet's latest reset of the window (-1: none known). */
  readonly epoch: number;
}

/** One instance's report to the fleet's throttle window of an upstream. */
export interface OutcomeReport {
  readonly upstream: string;
  /** The current slice, `floor(now / sliceMs)` on the caller's clock, and how many make the window. */
  readonly slice: number;
  readonly slices: number;
  readonly sliceMs: number;
  /** The latest reset the caller knows; with `reset`, the caller resets the window at this slice. */
  readonly epoch: number;
  readonly reset: boolean;
  /** What the caller counted since its last report: [slice, accepts, failures]. */
  readonly deltas: readonly (readonly [number, number, number])[];
}

/** One provider call charged to a client key's budget for the calendar window `[startMs, endMs)`. */
export interface SpendQuery {
  readonly keyId: string;
  readonly startMs: number;
  readonly endMs: number;
  readonly limit: number;
  /**
   * The part of `limit` this instance may charge on its own while the shared state is
   * unreachable (the upstream's `redis_down_share`); absent, the whole limit.
   */
  readonly share?: number;
}

/**
 * The calls of a budget's window one instance may charge on its own while the shared state is
 * unreachable, its charges through it included: `share` of the limit, rounded down, at least 1,
 * as the caps' shares are.
 */
export function localBudget(query: SpendQuery): number {
  return query.share === undefined ? query.limit : Math.max(1, Math.floor(query.limit * query.share));
}

/**
 * Whether the call fits the budget (then it is counted), and the calls counted in the window;
 * with Redis insured by memory, also which of the two counted it, so a refund goes back there.
 */
export interface Spend {
  readonly allowed: boolean;
  readonly used: number;
  readonly charged?: 'shared' | 'local';
}

/** Where a throttle's window is shared with the fleet. */
export interface OutcomeShare {
  /**
   * Adds a report to the fleet's counts and answers the fleet's totals (this caller's included);
   * undefined where there is no fleet to share with, or it cannot be reached now.
   */
  exchange(report: OutcomeReport): OutcomeTotals | undefined | Promise<OutcomeTotals | undefined>;
}

/**
 * Where stops and caps live: in this process, or in Redis so that every instance of a fleet
 * honours what the provider told any one of them. `admit` checks stops and takes a place under
 * the cap in one atomic step, so two instances never both spend the last call. The adaptive
 * throttle's window is shared the same way (`exchange`).
 */
export interface ProviderState extends OutcomeShare {
  /**
   * Counts one call against a key's budget if it has room, in one atomic step: fleet-wide and
   * kept across restarts in Redis, per instance in memory.
   */
  spend(query: SpendQuery): Spend | Promise<Spend>;
  /** Gives back a call counted by `spend` (its answer `spent`) that was not made after all. */
  refund(query: SpendQuery, spent: Spend): void;
  admit(query: AdmitQuery): Admission | Promise<Admission>;
  /**
   * The last call of `payer` waiting on this instance left without a place (its wait ran out,
   * it was pushed out, or stopped): its turn in the fleet's fair queue goes with it, so the cap
   * is not held for a payer nobody asks for.
   */
  withdraw(upstream: string, payer: string): void;
  /**
   * An admitted call has its answer. A call counts in the rate and quota windows from its
   * admission until a window after its answer (not after its start): the provider counts
   * arrivals, and a request may arrive any time before its answer, so only that keeps the
   * provider's own windows under the cap whatever the network's delays. Also ends its lease.
   */
  finish(upstream: string, leaseId: string): void;
  /** Records a stop (kept until its time, also across restarts when shared). */
  stop(stop: Stop): void | Promise<void>;
  /**
   * Lifts a stop early (a breaker whose probe succeeded), only if it is still of `state`: a
   * provider's own stop recorded meanwhile under the same key must stand.
   */
  lift(upstream: string, credential: string, scope: string, state: StopState): void | Promise<void>;
  /**
   * Takes the one turn at `what` (a revoked credential's recheck) for `ttlMs`: true for the
   * instance that got it, false while another holds it, so one instance of a fleet acts.
   */
  claim(upstream: string, what: string, ttlMs: number): boolean | Promise<boolean>;
  close(): Promise<void>;
}

/**
 * The cap an upstream's config asks for, scaled by `share` (the fraction an instance uses on its
 * own while the shared state is unreachable).
 */
export function compileCap(config: ProviderProtectionConfig, share = 1): CallCap {
  const cap: { -readonly [K in keyof CallCap]: CallCap[K] } = {};
  if (config.max_requests_per_second !== undefined) {
    const perSecond = config.max_requests_per_second * share;
    // Rates under 1/s get a window long enough to hold one call: 0.2/s is 1 call per 5 s.
    const windowMs = perSecond >= 1 ? 1000 : Math.ceil(1000 / perSecond);
    cap.rate = {
      perSecond,
      burst: Math.max(1, Math.floor((config.burst ?? Math.ceil(config.max_requests_per_second)) * share)),
      windowLimit: Math.max(1, Math.floor(perSecond)),
      windowMs,
    };
  }
  if (config.quota !== undefined) {
    cap.quota = { requests: Math.max(1, Math.floor(config.quota.requests * share)), windowMs: config.quota.per_seconds * 1000 };
  }
  if (config.max_concurrent !== undefined) cap.maxConcurrent = Math.max(1, Math.floor(config.max_concurrent * share));
  return cap;
}

/**
 * The stop records that can block `credential` at `scope`, most specific first. A credential
 * named `id@fingerprint` (credential-keyed-state.ts) is also blocked by a stop recorded under its
 * bare id, the form perch wrote before stops were keyed by the secret: a fleet upgraded while
 * the provider had a credential stopped keeps honouring that stop until it ends. No stop is
 * written in that form any more.
 */
export function stopKeysFor(credential: string, scope: string): [string, string][] {
  const keys: [string, string][] = [[credential, scope]];
  const at = credential.indexOf('@');
  const legacy = at > 0 ? credential.slice(0, at) : undefined;
  if (legacy !== undefined) keys.push([legacy, scope]);
  if (scope !== ANY) {
    keys.push([credential, ANY]);
    if (legacy !== undefined) keys.push([legacy, ANY]);
    keys.push([ANY, scope]);
  }
  keys.push([ANY, ANY]);
  return keys;
}
