import type { Clock } from '../clock.js';
import type { Config } from '../config/types.js';
import type { Logger } from '../logging/logger.js';
import { GuardedRedis, type RedisConnection } from '../redis/guarded-redis.js';
import { createRedisClient } from '../redis/redis-client.js';

/** Which Redis each subsystem uses; absent: that subsystem keeps its state in memory. */
export interface RedisConnections {
  /** `cache.redis`: the shared cache tier, purges and shared flights. */
  readonly cache?: RedisConnection;
  /** `rate_limits_redis`, else `cache.redis`: the token buckets. */
  readonly limits?: RedisConnection;
  /** The limits' connection with breakers of its own: provider stops, call caps, budgets. */
  readonly providerGuard?: RedisConnection;
  /** Disconnects each connection once. */
  close(): Promise<void>;
}

/**
 * The one place that decides which Redis each subsystem uses, opens each connection once and
 * builds the per-node breakers. Without `rate_limits_redis` the token buckets live in the cache's
 * Redis on the cache's connection and share its breakers: a node the cache found dead is skipped
 * by the buckets too, and a request pays at most one timeout for it.
 */
export function openRedis(config: Config, deps: { clock: Clock; logger: Logger }): RedisConnections {
  const { clock, logger } = deps;
  const cacheSettings = config.cache.redis;
  let cache: RedisConnection | undefined;
  if (cacheSettings !== undefined) {
    const client = createRedisClient(cacheSettings, 'perch-cache');
    // Connection errors also reach the breakers through failed commands; this only keeps ioredis
    // from reporting them as unhandled 'error' events.
    client.on('error', () => {});
    cache = { settings: cacheSettings, guard: new GuardedRedis(client, { clock, logger, name: 'redis cache' }) };
  }
  let limits = cache;
  const limitSettings = config.rate_limits_redis;
  if (limitSettings !== undefined) {
    const client = createRedisClient(limitSettings, 'perch-rate-limits', 'rate_limits_redis');
    // Connection errors repeat on every reconnect attempt; the insured subsystems log the state
    // change once, and without a listener ioredis would print each one as unhandled.
    client.on('error', (error: Error) => logger.debug({ reason: error.message }, 'rate limits: Redis connection error'));
    limits = { settings: limitSettings, guard: new GuardedRedis(client, { clock, logger, name: 'rate-limit redis' }) };
  }
  // Same connection, own breakers: the guard's scripts are the heaviest calls perch makes, and
  // one of them timing out must not make the token buckets (or the cache beside them) skip Redis.
  const providerGuard = limits === undefined ? undefined : { settings: limits.settings, guard: new GuardedRedis(limits.guard.client, { clock, logger, name: 'provider guard redis' }) };
  return {
    ...(cache === undefined ? {} : { cache }),
    ...(limits === undefined ? {} : { limits }),
    ...(providerGuard === undefined ? {} : { providerGuard }),
    close: async () => {
      const distinct = new Set([cache?.guard, limits?.guard, providerGuard?.guard].filter((guard) => guard !== undefined));
      await Promise.all([...distinct].map((guard) => guard.close()));
    },
  };
}
