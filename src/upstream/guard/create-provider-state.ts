import type { Clock } from '../../clock.js';
import type { Config } from '../../config/types.js';
import type { Logger } from '../../observability/logger.js';
import { Breaker } from '../../redis/breaker.js';
import type { RedisClient } from '../../redis/redis-client.js';
import { InsuredProviderState } from './insured-state.js';
import { MemoryProviderState } from './memory-state.js';
import type { ProviderState } from './provider-state.js';
import { RedisProviderState } from './redis-state.js';

/**
 * Where provider stops and call caps live: in the Redis of the shared rate limits
 * (`rate_limits_redis`, else `cache.redis`), on the same connection, with this instance's memory
 * as insurance; in memory alone when there is no Redis.
 */
export function createProviderState(config: Config, deps: { clock: Clock; logger: Logger; redis?: RedisClient }): ProviderState {
  const memory = new MemoryProviderState(deps.clock);
  const redisConfig = config.rate_limits_redis ?? config.cache.redis;
  if (deps.redis === undefined || redisConfig === undefined) return memory;
  const shared = new RedisProviderState(deps.redis, {
    prefix: redisConfig.prefix,
    now: () => deps.clock.now(),
    commandTimeoutMs: redisConfig.command_timeout_ms,
  });
  const breaker = new Breaker({ clock: deps.clock, logger: deps.logger, name: 'provider guard redis' });
  return new InsuredProviderState(shared, memory, breaker, deps.logger);
}
