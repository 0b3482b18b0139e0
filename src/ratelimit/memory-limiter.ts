import type { Clock } from '../clock.js';
import { takeFrom, type BucketLimiter, type BucketState, type Plan, type Verdict } from './token-bucket.js';

/**
 * Buckets in this process, on the injected clock. Used alone when no Redis is configured, and as
 * the per-instance insurance when Redis fails. At most one entry per key id ever configured, so
 * the map needs no eviction.
 */
export class MemoryLimiter implements BucketLimiter {
  readonly #clock: Clock;
  readonly #buckets = new Map<string, BucketState>();

  constructor(clock: Clock) {
    this.#clock = clock;
  }

  take(keyId: string, plan: Plan, cost: 0 | 1): Verdict {
    const next = takeFrom(this.#buckets.get(keyId), plan, this.#clock.now(), cost);
    this.#buckets.set(keyId, { tokens: next.tokens, at: next.at });
    return { plan, allowed: next.allowed, tokens: next.tokens };
  }
}
