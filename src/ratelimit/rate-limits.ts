import type { Client } from '../auth/key-store.js';
import type { Clock } from '../clock.js';
import type { Config, RateLimitPlan } from '../config/types.js';
import type { Logger } from '../observability/logger.js';
import { NodeBreakers } from '../redis/node-breakers.js';
import type { GuardedRedis } from '../redis/guarded-redis.js';
import { createRedisClient, type RedisClient } from '../redis/redis-client.js';
import { InsuredLimiter } from './insured-limiter.js';
import { LeasedLimiter } from './leased-limiter.js';
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
  /** Whether this instance opened `#client` (and so closes it), or shares the cache's. */
  readonly #ownsClient: boolean;
  /** `server.*` takes a restart, so the dialects of the first config hold for every plan. */
  readonly #headers: Parameters<typeof compilePlan>[2];

  /**
   * `cacheRedis`: the cache tier's connection. Without `rate_limits_redis` the buckets live in
   * that same Redis, so they use the same connection and the same per-node health: a node the
   * cache found dead is skipped by the limits too, and a request pays at most one timeout for it.
   */
  constructor(config: Config, deps: { clock: Clock; logger: Logger; cacheRedis?: GuardedRedis }) {
    this.#headers = { dialects: config.server.rate_limit_headers, clock: deps.clock };
    const memory = new MemoryLimiter(deps.clock);
    const redis = config.rate_limits_redis ?? config.cache.redis;
    if (redis === undefined) {
      this.#limiter = memory;
      this.#ownsClient = false;
      return;
    }
    const reuse = config.rate_limits_redis === undefined ? deps.cacheRedis : undefined;
    let breakers: NodeBreakers;
    if (reuse !== undefined) {
      this.#client = reuse.client;
      this.#ownsClient = false;
      breakers = reuse.breakers;
    } else {
      this.#client = createRedisClient(redis, 'perch-rate-limits', config.rate_limits_redis === undefined ? 'cache.redis' : 'rate_limits_redis');
      this.#ownsClient = true;
      // Connection errors repeat on every reconnect attempt; the limiter logs the state change
      // once, and without a listener ioredis would print each one as unhandled.
      this.#client.on('error', (error: Error) => deps.logger.debug({ reason: error.message }, 'rate limits: Redis connection error'));
      breakers = new NodeBreakers(this.#client, { clock: deps.clock, logger: deps.logger, name: 'rate-limit redis' });
    }
    const shared = new RedisLimiter(this.#client, { prefix: redis.prefix, commandTimeoutMs: redis.command_timeout_ms });
    this.#limiter = new InsuredLimiter(new LeasedLimiter(shared, deps.clock, breakers), memory, breakers, deps.logger);
  }

  /** The Redis connection of the shared buckets, which the provider guard shares; absent without Redis. */
  get redis(): RedisClient | undefined {
    return this.#client;
  }

  /**
   * The client's plan in `config`, which must be the configuration the client was authenticated
   * against (validation guarantees every key names one of its plans).
   */
  plan(config: Config, client: Client): Plan {
    const raw = config.rate_limits[client.plan]!;
    let plan = this.#plans.get(raw);
    if (plan === undefined) {
      plan = compilePlan(client.plan, raw, this.#headers);
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
    // disconnect, not quit: quit waits for an answer a dead or frozen Redis never gives. A shared
    // connection is the cache's to close.
    if (this.#ownsClient) this.#client?.disconnect();
  }
}
