import type { Clock } from '../clock.js';
import type { Config } from '../config/types.js';
import type { Logger } from '../logging/logger.js';
import type { RedisConnection } from '../redis/guarded-redis.js';
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
}

/**
 * Builds the cache the configuration asks for: memory only, or memory in front of Redis on
 * `redis`, the connection the composition root opened for `cache.redis` (and closes).
 */
export function createCache(
  config: Config,
  options: { clock: Clock; logger: Logger; redis?: RedisConnection },
): CacheTiers {
  const { clock, logger } = options;
  const memory = new MemoryStore({ maxBytes: config.cache.memory.max_bytes, clock });
  const generations = new Generations(memory);
  const staleMs = config.cache.stale_seconds * 1000;
  if (options.redis === undefined) return { cache: new TieredCache({ memory, generations, clock, staleMs }) };

  const { settings, guard } = options.redis;
  const purges = new PurgeSync({
    guard,
    subscriber: createRedisClient(settings, 'perch-purge'),
    prefix: settings.prefix,
    generations,
    logger,
  });
  const store = new RedisStore(guard.client, settings.prefix);
  const cache = new TieredCache({ memory, redis: { guard, store, purges }, generations, clock, staleMs });
  return { cache, sharedFlights: new SharedFlights(guard, cache, settings.prefix) };
}
