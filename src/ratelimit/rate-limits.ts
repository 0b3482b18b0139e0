import type { Client } from '../auth/key-store.js';
import type { Clock } from '../clock.js';
import type { AuthConfig, Config, RateLimitPlan } from '../config/types.js';
import type { Logger } from '../logging/logger.js';
import type { RedisConnection } from '../redis/guarded-redis.js';
import type { Timers } from '../timers.js';
import { InsuredLimiter } from './insured-limiter.js';
import { LeasedLimiter } from './leased-limiter.js';
import { MemoryLimiter } from './memory-limiter.js';
import { RedisLimiter } from './redis-limiter.js';
import { compilePlan, type BucketLimiter, type Plan, type Verdict } from './token-bucket.js';

/**
 * The bucket every pass-through key the provider has not accepted yet shares. No key's id can be
 * it: configured ids have no colon, and a forwarded key's id is `client:` and hex digits.
 */
const UNVERIFIED_ID = 'perch:unverified';

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
  /** The verification bucket's plan, per (frozen) `auth` section. */
  readonly #verification = new WeakMap<AuthConfig, Plan>();
  readonly #limiter: BucketLimiter;
  readonly #shared: InsuredLimiter | undefined;
  /** `server.*` takes a restart, so the dialects of the first config hold for every plan. */
  readonly #headers: Parameters<typeof compilePlan>[2];

  /**
   * `redis`: the connection of `rate_limits_redis`, else of `cache.redis` (the composition root
   * decides, opens and closes it); absent: the buckets live in this instance's memory.
   */
  constructor(config: Config, deps: { clock: Clock; timers: Timers; logger: Logger; redis?: RedisConnection }) {
    this.#headers = { dialects: config.server.rate_limit_headers, clock: deps.clock };
    const memory = new MemoryLimiter(deps.clock);
    if (deps.redis === undefined) {
      this.#limiter = memory;
      this.#shared = undefined;
      return;
    }
    const { settings, guard } = deps.redis;
    const redis = new RedisLimiter(guard.client, { prefix: settings.prefix, commandTimeoutMs: settings.command_timeout_ms });
    const leased = new LeasedLimiter(redis, { clock: deps.clock, timers: deps.timers, breakers: guard.breakers });
    this.#shared = new InsuredLimiter(leased, memory, guard.breakers, deps.logger);
    this.#limiter = this.#shared;
  }

  /** Before the Redis connection closes: leased tokens not spent go back to the shared buckets. */
  close(): Promise<void> {
    return this.#shared?.close() ?? Promise.resolve();
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

  /**
   * Takes a token for one verifying call of pass-through auth: every key the provider has not
   * accepted yet shares one bucket (`auth.verify_rate_per_second`, `auth.verify_burst`), in Redis
   * across the fleet like any key's, so a flood of made-up keys costs the provider a fixed rate of
   * calls whatever the number of keys.
   */
  takeVerification(config: Config): Verdict | Promise<Verdict> {
    const { auth } = config;
    let plan = this.#verification.get(auth);
    if (plan === undefined) {
      plan = compilePlan('verify', { capacity: auth.verify_burst, refill_per_second: auth.verify_rate_per_second, cost_of_hit: 1, provider_weight: 1 }, this.#headers);
      this.#verification.set(auth, plan);
    }
    return this.#limiter.take(UNVERIFIED_ID, plan, 1);
  }
}
