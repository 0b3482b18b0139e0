import type { CacheEntry } from './entry.js';
import { remainingTtlSeconds } from './entry.js';

/**
 * How the cache took part in a response: one closed set that feeds the `Cache-Status` header,
 * the access log's `cache` field and the metrics' `cache` label, so the three always agree.
 * - `hit`: served from the cache, fresh.
 * - `revalidated`: a fresh hit whose validators matched the client's (`If-None-Match`,
 *   `If-Modified-Since`), answered `304 Not Modified` without a body.
 * - `miss`: this request went to the upstream.
 * - `coalesced`: this request waited for an identical in-flight upstream request (of this
 *   instance, or of another instance sharing Redis).
 * - `stale`: served past its TTL, within `cache.stale_seconds`, while a refresh runs.
 * - `none`: answered before the cache was consulted (bad key, bad route, bad parameter).
 */
export type CacheOutcome = 'hit' | 'revalidated' | 'miss' | 'coalesced' | 'stale' | 'none';

export const CACHE_OUTCOMES: readonly CacheOutcome[] = ['hit', 'revalidated', 'miss', 'coalesced', 'stale', 'none'];

/**
 * `Cache-Status` (RFC 9211) for a hit: remaining freshness as `ttl`; `detail=redis` when the
 * shared tier answered rather than this instance's memory.
 */
export function hitCacheStatus(entry: CacheEntry, now: number, tier: 'memory' | 'redis' = 'memory'): string {
  const value = `perch; hit; ttl=${remainingTtlSeconds(entry, now)}`;
  return tier === 'redis' ? `${value}; detail=redis` : value;
}

/**
 * `Cache-Status` for a stale entry served while it is refreshed: `ttl` is negative, how long ago it
 * expired. An entry is stale from the millisecond its TTL ends, when whole seconds left still say 0,
 * so a stale answer says at least -1: RFC 9211 reads a ttl of 0 as not yet stale.
 */
export function staleCacheStatus(entry: CacheEntry, now: number): string {
  return `perch; fwd=stale; ttl=${Math.min(-1, remainingTtlSeconds(entry, now))}`;
}

/**
 * `Cache-Status` for a forwarded request. `stored` says the response went into the cache;
 * `collapsed` (RFC 9211 2.6) marks a request that shared another's upstream exchange, with
 * `detail=redis` when that exchange was another instance's.
 */
export function forwardCacheStatus(outcome: 'miss' | 'coalesced', stored: boolean, viaRedis = false): string {
  let value = 'perch; fwd=miss';
  if (outcome === 'coalesced') value += '; collapsed';
  if (stored) value += '; stored';
  if (viaRedis) value += '; detail=redis';
  return value;
}

/**
 * `Cache-Status` for the answer a failed refresh got about the request itself (a rejected
 * cursor), repeated without a call while the key's refresh backoff lasts: collapsed onto that
 * earlier exchange.
 */
export function backoffCacheStatus(): string {
  return 'perch; fwd=miss; collapsed; detail=refresh-backoff';
}
