import type { Logger } from '../observability/logger.js';
import type { Breaker } from '../redis/breaker.js';
import type { MemoryLimiter } from './memory-limiter.js';
import type { RedisLimiter } from './redis-limiter.js';
import type { Plan, Verdict } from './token-bucket.js';

/**
 * Redis decides while it answers; when a command fails or times out, this instance's memory
 * buckets decide instead, so Redis trouble never fails a request. Each instance then enforces
 * the full plan on its own (a client may get up to N times the plan across N instances) until
 * Redis is back: a looser limit for a while beats refusing or erroring every request.
 * The switch is logged once per change of state, not once per request. A breaker stops asking a
 * Redis that keeps failing: a frozen one would otherwise cost every request a full command
 * timeout, and while the breaker is open the memory buckets answer synchronously.
 */
export class InsuredLimiter {
  readonly #redis: RedisLimiter;
  readonly #insurance: MemoryLimiter;
  readonly #logger: Logger;
  readonly #breaker: Breaker;
  #redisFailing = false;

  constructor(redis: RedisLimiter, insurance: MemoryLimiter, breaker: Breaker, logger: Logger) {
    this.#redis = redis;
    this.#insurance = insurance;
    this.#breaker = breaker;
    this.#logger = logger;
  }

  take(keyId: string, plan: Plan, cost: 0 | 1): Verdict | Promise<Verdict> {
    if (!this.#breaker.allow()) return this.#insurance.take(keyId, plan, cost);
    return this.#takeShared(keyId, plan, cost);
  }

  async #takeShared(keyId: string, plan: Plan, cost: 0 | 1): Promise<Verdict> {
    let verdict: Verdict;
    try {
      verdict = await this.#redis.take(keyId, plan, cost);
      this.#breaker.success();
    } catch (error) {
      this.#breaker.failure();
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
