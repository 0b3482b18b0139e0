import { LRUCache } from 'lru-cache';
import type { Clock } from '../clock.js';
import { takeFrom, type BucketLimiter, type BucketState, type Plan, type Verdict } from './token-bucket.js';

/**
 * Buckets in this process, on the injected clock. Used alone when no Redis is configured, and as
 * the per-instance insurance when Redis fails. One entry per key id: configured keys are few,
 * but pass-through keys (`auth.mode: upstream`) are whatever callers send, so past `MAX_BUCKETS`
 * the least recently used buckets go. A bucket dropped is full again when next seen, which only
 * a key idle while that many others arrived can notice.
 */
const MAX_BUCKETS = 100_000;

/** A bucket as insurance for Redis's also counts what it allowed, for Redis to take off. */
interface InsuranceState extends BucketState {
  owed?: number;
}

/**
 * What a bucket still owes once it has refilled to `refilled` tokens: no more than the room left
 * in it. Tokens spent here while the bucket refilled to its capacity were made up by that refill:
 * the shared bucket, had it been asked, would be full again too, so charging them later would
 * take tokens the client never had (a client under its refill across an outage lost its whole
 * spend from its next burst). What the room clips is exact for this instance's own spending; a
 * shared bucket that others kept lower gets less back than it would have, at most the refill
 * over the outage, within the documented bound of what each instance may spend across one.
 * A credit (negative: leased tokens not given back) is clipped at capacity by the script instead.
 */
function owedAfterRefill(owed: number, plan: Plan, refilled: number): number {
  return owed > 0 ? Math.min(owed, Math.max(0, plan.capacity - refilled)) : owed;
}

export class MemoryLimiter implements BucketLimiter {
  readonly #clock: Clock;
  readonly #buckets = new LRUCache<string, InsuranceState>({ max: MAX_BUCKETS });
  /** Insurance for the shared buckets: tokens spent here are owed to them (`claim`). */
  readonly #owing: boolean;
  /** Keys owing the shared buckets (or owed by them), with the plan to settle them on. */
  readonly #debtors = new Map<string, Plan>();

  constructor(clock: Clock, options: { insurance?: boolean } = {}) {
    this.#clock = clock;
    this.#owing = options.insurance ?? false;
  }

  take(keyId: string, plan: Plan, cost: 0 | 1): Verdict {
    const state = this.#buckets.get(keyId);
    const next = takeFrom(state, plan, this.#clock.now(), cost);
    // Updated in place: `get` has already made the bucket the most recently used, and a `set`
    // per request would cost the LRU a second lookup and an allocation on the hit path.
    const owed = this.#owing && next.allowed ? cost : 0;
    if (owed !== 0) this.#debtors.set(keyId, plan);
    if (state === undefined) this.#buckets.set(keyId, owed === 0 ? { tokens: next.tokens, at: next.at } : { tokens: next.tokens, at: next.at, owed });
    else {
      if (state.owed !== undefined) state.owed = owedAfterRefill(state.owed, plan, next.tokens + (next.allowed ? cost : 0));
      state.tokens = next.tokens;
      state.at = next.at;
      if (owed !== 0) state.owed = (state.owed ?? 0) + owed;
    }
    return { plan, allowed: next.allowed, tokens: next.tokens };
  }

  /**
   * Sets a key's bucket to what the shared bucket in Redis just reported (clipped at the plan's
   * capacity, which a reload may have lowered): as insurance, these buckets then carry on from
   * the fleet's bucket as this instance last saw it, not from a full one.
   */
  /**
   * The tokens this instance allowed from its own bucket for `keyId` while Redis did not answer,
   * not yet taken off the shared bucket; the caller sends them with its next call, and gives
   * them back here (`unclaim`) if that call fails. An evicted bucket forgets what it was owed.
   */
  claim(keyId: string, plan: Plan): number {
    const state = this.#buckets.peek(keyId);
    if (state?.owed !== undefined) {
      const elapsed = Math.max(0, this.#clock.now() - state.at);
      state.owed = owedAfterRefill(state.owed, plan, Math.min(plan.capacity, state.tokens + (elapsed * plan.refillPerSecond) / 1000));
    }
    const owed = state?.owed ?? 0;
    if (owed !== 0) state!.owed = 0;
    this.#debtors.delete(keyId);
    return owed;
  }

  /** Also takes a credit (negative): leased tokens whose give-back could not be sent. */
  unclaim(keyId: string, plan: Plan, tokens: number): void {
    const state = this.#buckets.peek(keyId);
    if (state === undefined) return;
    state.owed = (state.owed ?? 0) + tokens;
    this.#debtors.set(keyId, plan);
  }

  /**
   * The keys with something to settle with the shared buckets, and their plans: settled as soon
   * as Redis answers again, not only by each key's next request, which may never come here.
   */
  debtors(): [string, Plan][] {
    return [...this.#debtors];
  }

  seed(keyId: string, plan: Plan, tokens: number): void {
    const state = this.#buckets.get(keyId);
    const now = this.#clock.now();
    const seeded = Math.max(0, Math.min(plan.capacity, tokens));
    if (state === undefined) this.#buckets.set(keyId, { tokens: seeded, at: now });
    else {
      state.tokens = seeded;
      state.at = now;
    }
  }
}
