import type { Client } from '../auth/key-store.js';
import type { Clock } from '../clock.js';
import type { Config, RateLimitPlan } from '../config/types.js';
import type { Logger } from '../observability/logger.js';
import { Breaker } from '../redis/breaker.js';
import { createRedisClient, type RedisClient } from '../redis/redis-client.js';
import { InsuredLimiter } from './insured-limiter.js';
import { MemoryLimiter } from './memory-limiter.js';
import { RedisLimiter } from './redis-limiter.js';
import { compilePlan, type BucketLimiter, type Plan, type Verdict } from './token-bucket.js';

/**
 * The per-key token buckets of one perch instance. Buckets live in memory when no Redis is
 * configured, else in `rate_limits_redis` (or `cache.redis`) with memory as insurance.
 */
export class RateLimits {
  /**
   * Keyed by the frozen plan object, so a SIGHUP reload (a new config object) gets its plans
   * compiled on first use, and each plan is compiled once, not per request.
   */
  readonly #plans = new WeakMap<RateLimitPlan, Plan>();
  readonly #limiter: BucketLimiter;
  readonly #client: RedisClient | undefined;

  constructor(config: Config, deps: { clock: Clock; logger: Logger }) {
    const memory = new MemoryLimiter(deps.clock);
    const redis = config.rate_limits_redis ?? config.cache.redis;
    if (redis === undefined) {
      this.#limiter = memory;
      return;
    }
    this.#client = createRedisClient(redis, 'perch-rate-limits');
    // Connection errors repeat on every reconnect attempt; the limiter logs the state change
    // once, and without a listener ioredis would print each one as unhandled.
    this.#client.on('error', (error: Error) => deps.logger.debug({ reason: error.message }, 'rate limits: Redis connection error'));
    const shared = new RedisLimiter(this.#client, { prefix: redis.prefix, commandTimeoutMs: redis.command_timeout_ms });
    const breaker = new Breaker({ clock: deps.clock, logger: deps.logger, name: 'rate-limit redis' });
    this.#limiter = new InsuredLimiter(shared, memory, breaker, deps.logger);
  }

  /**
   * The client's plan in `config`, which must be the configuration the client was authenticated
   * against (validation guarantees every key names one of its plans).
   */
  plan(config: Config, client: Client): Plan {
    const raw = config.rate_limits[client.plan]!;
    let plan = this.#plans.get(raw);
    if (plan === undefined) {
      plan = compilePlan(client.plan, raw);
      this.#plans.set(raw, plan);
    }
    return plan;
  }

  /**
   * Takes `cost` tokens (0 looks without spending) from the client's bucket. Synchronous with
   * the memory store, a promise with Redis; never rejects because of Redis.
   */
  take(client: Client, plan: Plan, cost: 0 | 1): Verdict | Promise<Verdict> {
    return this.#limiter.take(client.id, plan, cost);
  }

  async close(): Promise<void> {
    // disconnect, not quit: quit waits for an answer a dead or frozen Redis never gives.
    this.#client?.disconnect();
  }
}
