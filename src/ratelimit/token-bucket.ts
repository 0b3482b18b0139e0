import type { Clock } from '../clock.js';
import type { RateLimitHeaderDialect, RateLimitPlan } from '../config/types.js';

/**
 * Slack for floating-point sums: refilling 0.1 tokens ten times must make a whole token, not
 * 0.9999999999999999 of one (which would refuse a request and promise it in "1 second").
 */
const EPSILON = 1e-9;

/** A plan as the hot path uses it: the numbers plus its `RateLimit-Policy` value, built once. */
export interface Plan {
  readonly name: string;
  readonly capacity: number;
  readonly refillPerSecond: number;
  readonly costOfHit: 0 | 1;
  readonly policyHeader: string;
  /**
   * The most tokens an instance takes from the shared bucket at once and spends locally, so that
   * most requests need no Redis round trip (leased-limiter.ts sizes each lease within it); 1
   * means no leasing (every request asks Redis).
   */
  readonly lease: number;
  /** Whether answers carry the IETF draft fields (`server.rate_limit_headers`). */
  readonly ietf: boolean;
  /** Present when answers carry Twitter's `x-rate-limit-*` fields: the clock `-reset` counts from. */
  readonly xRateLimit?: { readonly clock: Clock };
}

/**
 * Tokens a lease may hold whatever the refill rate, when the bucket is large enough: each lease
 * costs a round trip and a script in Redis, so a client spending tens of thousands of tokens a
 * second on one instance would otherwise ask Redis hundreds of times a second.
 */
const BASE_LEASE = 100;

/**
 * The most tokens one instance takes from the shared bucket at once: a tenth of the bucket at
 * most, so small plans, whose every token matters, are not leased at all; within that,
 * `BASE_LEASE` or a tenth of a second of refill, whichever is more.
 */
export function leaseSize(capacity: number, refillPerSecond: number): number {
  return Math.max(1, Math.min(Math.floor(capacity / 10), Math.max(BASE_LEASE, Math.floor(refillPerSecond / 10))));
}

/** The outcome of one take: whether it was allowed and the tokens left afterwards (fractional). */
export interface Verdict {
  readonly plan: Plan;
  readonly allowed: boolean;
  readonly tokens: number;
}

/**
 * One store of buckets, keyed by client key id. The memory store answers synchronously so a
 * request served from the memory cache needs no extra turn of the event loop; Redis cannot.
 */
export interface BucketLimiter {
  take(keyId: string, plan: Plan, cost: 0 | 1): Verdict | Promise<Verdict>;
}

/** `headers` are the dialects of `server.rate_limit_headers`; `clock` dates `x-rate-limit-reset`. */
export function compilePlan(
  name: string,
  plan: RateLimitPlan,
  headers: { readonly dialects: readonly RateLimitHeaderDialect[]; readonly clock: Clock },
): Plan {
  const window = Math.ceil(plan.capacity / plan.refill_per_second);
  return {
    name,
    capacity: plan.capacity,
    refillPerSecond: plan.refill_per_second,
    costOfHit: plan.cost_of_hit,
    policyHeader: `"${name}";q=${plan.capacity};w=${window}`,
    lease: leaseSize(plan.capacity, plan.refill_per_second),
    ietf: headers.dialects.includes('ietf'),
    ...(headers.dialects.includes('x_rate_limit') ? { xRateLimit: { clock: headers.clock } } : {}),
  };
}

export interface BucketState {
  tokens: number;
  /** When `tokens` was last computed, in the store's clock (ms). */
  at: number;
}

/**
 * The token-bucket step, shared by the memory store and mirrored line by line in the Redis Lua
 * script: refill for the time elapsed (never backwards, never above capacity), then take `cost`
 * if that many whole tokens are there. An absent bucket is a full one.
 */
export function takeFrom(state: BucketState | undefined, plan: Plan, now: number, cost: 0 | 1): BucketState & { allowed: boolean } {
  const elapsed = state === undefined ? 0 : Math.max(0, now - state.at);
  let tokens = state === undefined ? plan.capacity : Math.min(plan.capacity, state.tokens + (elapsed * plan.refillPerSecond) / 1000);
  const allowed = tokens + EPSILON >= cost;
  if (allowed) tokens = Math.max(0, tokens - cost);
  return { tokens, at: now, allowed };
}

/** Whole tokens left, for `RateLimit: r=`. */
export function wholeTokens(verdict: Verdict): number {
  return Math.floor(verdict.tokens + EPSILON);
}

/** Seconds until the bucket is full again, rounded up, for `RateLimit: t=`. */
export function secondsToFull(verdict: Verdict): number {
  return Math.max(0, Math.ceil((verdict.plan.capacity - verdict.tokens) / verdict.plan.refillPerSecond - EPSILON));
}

/** Whole seconds until the next token, at least 1, for `Retry-After` on a refused request. */
export function secondsToNextToken(verdict: Verdict): number {
  return Math.max(1, Math.ceil((1 - verdict.tokens) / verdict.plan.refillPerSecond - EPSILON));
}
