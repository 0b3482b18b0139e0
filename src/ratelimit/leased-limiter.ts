import { LRUCache } from 'lru-cache';
import type { Clock } from '../clock.js';
import type { NodeBreakers } from '../redis/node-breakers.js';
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
  readonly shared: number;
  /** When the unspent tokens lapse (clock ms). */
  readonly expiresAt: number;
  readonly plan: Plan;
  /** The lease taken ahead, spent once this one is spent or lapsed; it lapses on its own clock. */
  next?: Lease;
}

/**
 * A lease down to this many tokens takes the next one in the background, so that under steady
 * traffic no request waits for Redis: a quarter of the lease, which at 64 requests in flight and
 * a sub-millisecond round trip is rarely spent before the next lease arrives.
 */
function lowWater(plan: Plan): number {
  return Math.floor(plan.lease / 4);
}

/**
 * The shared buckets without a Redis round trip per request: an instance takes up to
 * `plan.lease` tokens (see `leaseSize`) at once from the shared bucket and spends them locally,
 * and takes the next lease in the background when a quarter is left. Tokens leave the shared bucket when leased, so
 * leasing never lets the fleet spend more tokens than the bucket gave; what it moves is when: a
 * token leased before a window may be spent inside it. Each lease's unspent tokens lapse
 * `max(1 s, lease / refill_per_second)` after it was taken (at least the time the bucket takes to
 * refill them), so every token is spent within that time of leaving the bucket, and in any window
 * a client gets at most `max(lease, refill_per_second)` requests more than its plan allows,
 * fleet-wide, whatever the number of instances. An instance holds at most a lease and a quarter
 * unspent (the quarter left and the lease taken ahead), so it can make another refuse early by at
 * most that many tokens. Plans with `lease` 1 ask Redis for every request, exactly as before.
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

  /** Taking a lease ahead asks the node's breaker first, and tells it how the call went. */
  readonly #breakers: NodeBreakers;

  constructor(redis: RedisLimiter, clock: Clock, breakers: NodeBreakers) {
    this.#redis = redis;
    this.#clock = clock;
    this.#breakers = breakers;
  }

  /** The Redis key of a key's bucket (which cluster node decides). */
  redisKey(keyId: string): string {
    return this.#redis.redisKey(keyId);
  }

  /** Spends from this instance's lease when it has what `cost` needs; undefined when Redis must be asked. */
  takeLocal(keyId: string, plan: Plan, cost: 0 | 1): Verdict | undefined {
    if (plan.lease <= 1) return undefined;
    let lease = this.#leases.get(keyId);
    if (lease === undefined || lease.plan !== plan) return undefined;
    const now = this.#clock.now();
    if (lease.expiresAt <= now || lease.tokens < cost) {
      lease = lease.next;
      if (lease === undefined || lease.expiresAt <= now || lease.tokens < cost) return undefined;
      this.#leases.set(keyId, lease);
    }
    lease.tokens -= cost;
    if (lease.tokens <= lowWater(plan) && lease.next === undefined && cost > 0) this.#takeAhead(keyId, plan);
    const next = lease.next !== undefined && lease.next.expiresAt > now ? lease.next : undefined;
    // Tokens held here (both leases) plus the bucket's at the newest lease.
    return { plan, allowed: true, tokens: Math.min(plan.capacity, (next ?? lease).shared + lease.tokens + (next?.tokens ?? 0)) };
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
    this.#leases.set(keyId, this.#newLease(plan, taken, tokens, taken - 1));
    return { plan, allowed: true, tokens: Math.min(plan.capacity, tokens + taken - 1) };
  }

  /** `taken` tokens just leased, `shared` left in the bucket, `tokens` of them still to spend. */
  #newLease(plan: Plan, taken: number, shared: number, tokens = taken): Lease {
    return { tokens, shared, expiresAt: this.#clock.now() + Math.max(MIN_LEASE_MS, (taken * 1000) / plan.refillPerSecond), plan };
  }

  /**
   * Takes the next lease while this one still has a quarter left. Runs behind the request that
   * crossed the mark; requests that run out before it lands wait for it like for any lease
   * (`#pending`). A refused or failed lease leaves things as they were: the next request that
   * finds nothing left asks Redis itself, with the usual fallback.
   */
  #takeAhead(keyId: string, plan: Plan): void {
    if (this.#pending.has(keyId)) return;
    const breaker = this.#breakers.for(this.#redis.redisKey(keyId));
    if (!breaker.allow()) return;
    const leasing = this.#redis.lease(keyId, plan, plan.lease).then(
      ({ taken, tokens }) => {
        breaker.success();
        const current = this.#leases.get(keyId);
        if (taken === 0) return;
        const ahead = this.#newLease(plan, taken, tokens);
        if (current === undefined || current.plan !== plan) this.#leases.set(keyId, ahead);
        else current.next = ahead;
      },
      () => breaker.failure(),
    );
    this.#pending.set(keyId, leasing);
    void leasing.finally(() => this.#pending.delete(keyId));
  }
}
