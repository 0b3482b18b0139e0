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

export class MemoryLimiter implements BucketLimiter {
  readonly #clock: Clock;
  readonly #buckets = new LRUCache<string, BucketState>({ max: MAX_BUCKETS });

  constructor(clock: Clock) {
    this.#clock = clock;
  }

  take(keyId: string, plan: Plan, cost: 0 | 1): Verdict {
    const state = this.#buckets.get(keyId);
    const next = takeFrom(state, plan, this.#clock.now(), cost);
    // Updated in place: `get` has already made the bucket the most recently used, and a `set`
    // per request would cost the LRU a second lookup and an allocation on the hit path.
    if (state === undefined) this.#buckets.set(keyId, { tokens: next.tokens, at: next.at });
    else {
      state.tokens = next.tokens;
      state.at = next.at;
    }
    return { plan, allowed: next.allowed, tokens: next.tokens };
  }
}
