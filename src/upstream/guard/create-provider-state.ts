import type { Clock } from '../../clock.js';
import type { Logger } from '../../logging/logger.js';
import type { Timers } from '../../timers.js';
import type { RedisConnection } from '../../redis/guarded-redis.js';
import { InsuredProviderState } from './insured-state.js';
import { MemoryProviderState } from './memory-state.js';
import type { ProviderState } from './provider-state.js';
import { RedisProviderState } from './redis-state.js';

/**
 * Where provider stops, call caps and budgets live: in the Redis of the shared rate limits, on
 * their connection and behind their per-node breakers, with this instance's memory as
 * insurance; in memory alone when there is no Redis.
 */
export function createProviderState(deps: { clock: Clock; timers?: Timers; logger: Logger; redis?: RedisConnection }): ProviderState {
  const memory = new MemoryProviderState(deps.clock);
  if (deps.redis === undefined) return memory;
  const { settings, guard } = deps.redis;
  const shared = new RedisProviderState(guard.client, {
    prefix: settings.prefix,
    now: () => deps.clock.now(),
    commandTimeoutMs: settings.command_timeout_ms,
  });
  const insured = new InsuredProviderState(shared, memory, guard.breakers, deps.logger, deps.clock, deps.timers);
  guard.client.on('ready', () => insured.reconnected());
  return insured;
}
