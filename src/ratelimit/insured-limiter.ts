import type { Logger } from '../observability/logger.js';
import type { Breaker } from '../redis/breaker.js';
import type { NodeBreakers } from '../redis/node-breakers.js';
import type { MemoryLimiter } from './memory-limiter.js';
import type { LeasedLimiter } from './leased-limiter.js';
import type { Plan, Verdict } from './token-bucket.js';

/**
 * Redis decides while it answers; when a command fails or times out, this instance's memory
 * buckets decide instead, so Redis trouble never fails a request. Each instance then enforces
 * the full plan on its own (a client may get up to N times the plan across N instances) until
 * Redis is back: a looser limit for a while beats refusing or erroring every request.
 * The switch is logged once per change of state, not once per request. A breaker stops asking a
 * Redis that keeps failing: a frozen one would otherwise cost every request a full command
 * timeout, and while the breaker is open the memory buckets answer synchronously. With a cluster
 * each node has its own breaker: keys on healthy nodes stay shared while one node is down.
 * Tokens leased from Redis before it failed are still spent first (see LeasedLimiter).
 */
export class InsuredLimiter {
  readonly #redis: LeasedLimiter;
  readonly #insurance: MemoryLimiter;
  readonly #logger: Logger;
  readonly #breakers: NodeBreakers;
  #redisFailing = false;

  constructor(redis: LeasedLimiter, insurance: MemoryLimiter, breakers: NodeBreakers, logger: Logger) {
    this.#redis = redis;
    this.#insurance = insurance;
    this.#breakers = breakers;
    this.#logger = logger;
  }

  take(keyId: string, plan: Plan, cost: 0 | 1): Verdict | Promise<Verdict> {
    // Tokens already leased are this instance's to spend: no Redis, no breaker, no await.
    const local = this.#redis.takeLocal(keyId, plan, cost);
    if (local !== undefined) return local;
    const breaker = this.#breakers.for(this.#redis.redisKey(keyId));
    if (!breaker.allow()) return this.#insurance.take(keyId, plan, cost);
    return this.#takeShared(keyId, plan, cost, breaker);
  }

  async #takeShared(keyId: string, plan: Plan, cost: 0 | 1, breaker: Breaker): Promise<Verdict> {
    let verdict: Verdict;
    try {
      verdict = await this.#redis.takeShared(keyId, plan, cost);
      breaker.success();
    } catch (error) {
      breaker.failure();
      if (!this.#redisFailing) {
        this.#redisFailing = true;
        this.#logger.warn({ reason: error instanceof Error ? error.message : String(error) }, 'rate limits: Redis failed, falling back to per-instance memory buckets');
      }
      return this.#insurance.take(keyId, plan, cost);
    }
    if (this.#redisFailing) {
      this.#redisFailing = false;
      this.#logger.info('rate limits: Redis answers again, buckets are shared again');
    }
    return verdict;
  }
}
