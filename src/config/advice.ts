import type { Config } from './types.js';

/**
 * Upstreams whose call caps would multiply across the fleet while Redis is unreachable: a cap
 * is set, the caps are shared through a Redis, and `redis_down_share` is left at 1, so during an
 * outage every instance may use the whole cap. perch cannot know how many instances run, so it
 * says so at start-up rather than guess a smaller default.
 */
export function unsharedCapUpstreams(config: Config): string[] {
  if ((config.rate_limits_redis ?? config.cache.redis) === undefined) return [];
  return Object.entries(config.upstreams).flatMap(([name, upstream]) => {
    if (upstream.kind === 'fixture') return [];
    const capped = upstream.max_requests_per_second !== undefined || upstream.max_concurrent !== undefined || upstream.quota !== undefined;
    return capped && upstream.redis_down_share === 1 ? [name] : [];
  });
}

/** The start-up warning for `unsharedCapUpstreams`. */
export const UNSHARED_CAP_WARNING =
  'upstream caps are fleet-wide through Redis, but redis_down_share is 1: while Redis is unreachable every instance may use the whole cap; set it to 1 / the number of instances';
