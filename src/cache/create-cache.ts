import type { Clock } from '../clock.js';
import type { Config } from '../config/types.js';
import type { Logger } from '../observability/logger.js';
import { GuardedRedis } from '../redis/guarded-redis.js';
import { createRedisClient } from '../redis/redis-client.js';
import { Generations } from './generations.js';
import { MemoryStore } from './memory-store.js';
import { PurgeSync } from './purge-sync.js';
import { RedisStore } from './redis-store.js';
import { SharedFlights } from './shared-flight.js';
import { TieredCache } from './tiered-cache.js';

export interface CacheTiers {
  readonly cache: TieredCache;
  /** Present with `cache.redis`. */
  readonly sharedFlights?: SharedFlights;
  /** The cache's Redis connection and its per-node health, present with `cache.redis`. */
  readonly redis?: GuardedRedis;
}

/** Builds the cache the configuration asks for: memory only, or memory in front of Redis. */
export function createCache(config: Config, options: { clock: Clock; logger: Logger }): CacheTiers {
  const { clock, logger } = options;
  const memory = new MemoryStore({ maxBytes: config.cache.memory.max_bytes, clock });
  const generations = new Generations(memory);
  const staleMs = config.cache.stale_seconds * 1000;
  const redisConfig = config.cache.redis;
  if (redisConfig === undefined) return { cache: new TieredCache({ memory, generations, clock, staleMs }) };

  const client = createRedisClient(redisConfig, 'perch-cache');
  // Connection errors also reach the breaker through failed commands; this only keeps ioredis
  // from reporting them as unhandled 'error' events.
  client.on('error', () => {});
  const guard = new GuardedRedis(client, { clock, logger, name: 'redis cache' });
  const purges = new PurgeSync({
    guard,
    subscriber: createRedisClient(redisConfig, 'perch-purge'),
    prefix: redisConfig.prefix,
    generations,
    logger,
  });
  const store = new RedisStore(client, redisConfig.prefix);
  const cache = new TieredCache({ memory, redis: { guard, store, purges }, generations, clock, staleMs });
  return { cache, sharedFlights: new SharedFlights(guard, cache, config, redisConfig.prefix), redis: guard };
}
