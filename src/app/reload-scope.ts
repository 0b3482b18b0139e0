import type { Config } from '../config/types.js';

/**
 * What a SIGHUP reload does with each setting, by key path (a path covers every key under it, as
 * `auth` covers `auth.keys[].plan`). The two lists are the one source of the reload's restart
 * warning and of the test that walks every key of the configuration's definition and finds it
 * under exactly one of them, so a new key cannot be left out.
 */

/** Read per request (or rebuilt with the upstream set) from the live configuration: a reload applies them to the next request. */
export const APPLIED_ON_RELOAD = [
  // The upstream set reads it when a reload builds it, and the flight lease at each miss.
  'server.miss_deadline_ms',
  'auth',
  'admin',
  'rate_limits',
  'upstreams',
  'routes',
  'cache.ttl_seconds',
  'cache.compression',
  // Entries already stored keep the Redis expiry and memory retention they were stored with.
  'cache.stale_seconds',
  'metrics.path',
  // The metrics routes read it per scrape.
  'metrics.require_admin',
  'log.level',
] as const;

/**
 * Read once when the listeners, connections, stores and exporters are built: honouring a change
 * would mean dropping connections or the cache, so a reload that changes one logs that it waits
 * for a restart, and applies the rest.
 */
export const NEEDS_RESTART = [
  'server.host',
  'server.port',
  'server.reuse_port',
  'server.shutdown_grace_ms',
  'server.headers_timeout_ms',
  'server.request_timeout_ms',
  'server.keep_alive_timeout_ms',
  'server.max_header_bytes',
  'server.max_connections',
  'server.tls',
  'server.rate_limit_headers',
  'rate_limits_redis',
  'cache.memory',
  'cache.redis',
  'metrics.port',
  'log.time',
  'log.level_format',
  'tracing',
] as const;

/** The settings of `NEEDS_RESTART` whose values differ between the running and the new configuration. */
export function restartNeeded(running: Config, next: Config): string[] {
  return NEEDS_RESTART.filter((path) => JSON.stringify(valueAt(running, path)) !== JSON.stringify(valueAt(next, path)));
}

function valueAt(config: Config, path: string): unknown {
  return path.split('.').reduce<unknown>((node, key) => (node as Record<string, unknown> | undefined)?.[key], config);
}
