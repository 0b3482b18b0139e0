import { LRUCache } from 'lru-cache';
import type { Clock } from '../clock.js';
import type { RedisLimiter } from './redis-limiter.js';
import type { Plan, Verdict } from './token-bucket.js';

const MAX_LEASES = 100_000;

/**
 * Shortest life of a lease. Without it a fast-refilling plan (thousands of tokens a second) would
 * see its leases lapse within microseconds and ask Redis for every request, one lease at a time.
 */
const MIN_LEASE_MS = 1000;

interface Lease {
  /** Leased tokens not spent yet. */
  tokens: number;
  /** The shared bucket's tokens right after the lease, for the `RateLimit` header. */
  shared: number;
  /** When the unspent tokens lapse (clock ms). */
  expiresAt: number;
  readonly plan: Plan;
}

/**
 * The shared buckets without a Redis round trip per request: an instance takes up to
 * `plan.lease` tokens at once from the shared bucket and spends them locally. Tokens leave the
 * shared bucket when leased, so leasing never lets the fleet spend more tokens than the bucket
 * gave; what it moves is when: a token leased before a window may be spent inside it. Unspent
 * tokens lapse after `max(1 s, lease / refill_per_second)` (at least the time the bucket takes to
 * refill them), so in any window a client gets at most `max(lease, refill_per_second)` requests
 * more than its plan allows, fleet-wide, whatever the number of instances; and an instance
 * sitting on unspent tokens can make another refuse a little early, by at most one lease. Plans with `lease` 1 ask Redis
 * for every request, exactly as before.
 */
export class LeasedLimiter {
  readonly #redis: RedisLimiter;
  readonly #clock: Clock;
  /**
   * Bounded like the memory buckets, for pass-through keys (`auth.mode: upstream`) that are
   * whatever callers send: a lease dropped early only returns its unspent tokens to nobody.
   */
  readonly #leases = new LRUCache<string, Lease>({ max: MAX_LEASES });
  /** One lease request per key at a time: the requests that need one wait for it together. */
  readonly #pending = new Map<string, Promise<void>>();

  constructor(redis: RedisLimiter, clock: Clock) {
    this.#redis = redis;
    this.#clock = clock;
  }

  /** The Redis key of a key's bucket (which cluster node decides). */
  redisKey(keyId: string): string {
    return this.#redis.redisKey(keyId);
  }

  /** Spends from this instance's lease when it has what `cost` needs; undefined when Redis must be asked. */
  takeLocal(keyId: string, plan: Plan, cost: 0 | 1): Verdict | undefined {
    if (plan.lease <= 1) return undefined;
    const lease = this.#leases.get(keyId);
    if (lease === undefined || lease.plan !== plan || lease.expiresAt <= this.#clock.now() || lease.tokens < cost) return undefined;
    lease.tokens -= cost;
    return { plan, allowed: true, tokens: Math.min(plan.capacity, lease.shared + lease.tokens) };
  }

  /** Asks Redis: a new lease for leased plans, one token otherwise. Rejects when Redis fails. */
  async takeShared(keyId: string, plan: Plan, cost: 0 | 1): Promise<Verdict> {
    if (plan.lease <= 1 || cost === 0) return this.#redis.take(keyId, plan, cost);
    for (;;) {
      const pending = this.#pending.get(keyId);
      if (pending === undefined) break;
      await pending;
      const local = this.takeLocal(keyId, plan, cost);
      if (local !== undefined) return local;
    }
    let verdict!: Verdict;
    const leasing = this.#lease(keyId, plan).then((v) => void (verdict = v));
    this.#pending.set(keyId, leasing);
    try {
      await leasing;
    } finally {
      this.#pending.delete(keyId);
    }
    return verdict;
  }

  async #lease(keyId: string, plan: Plan): Promise<Verdict> {
    const { taken, tokens } = await this.#redis.lease(keyId, plan, plan.lease);
    if (taken === 0) {
      this.#leases.delete(keyId);
      return { plan, allowed: false, tokens };
    }
    const expiresAt = this.#clock.now() + Math.max(MIN_LEASE_MS, (taken * 1000) / plan.refillPerSecond);
    this.#leases.set(keyId, { tokens: taken - 1, shared: tokens, expiresAt, plan });
    return { plan, allowed: true, tokens: Math.min(plan.capacity, tokens + taken - 1) };
  }
}
