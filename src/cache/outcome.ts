import type { CacheEntry } from './entry.js';
import { remainingTtlSeconds } from './entry.js';

/**
 * How the cache took part in a response: one closed set that feeds the `Cache-Status` header,
 * the access log's `cache` field and the metrics' `cache` label, so the three always agree.
 * - `hit`: served from the cache, fresh.
 * - `miss`: this request went to the upstream.
 * - `coalesced`: this request waited for an identical in-flight upstream request.
 * - `none`: answered before the cache was consulted (bad key, bad route, bad parameter).
 */
export type CacheOutcome = 'hit' | 'miss' | 'coalesced' | 'none';

export const CACHE_OUTCOMES: readonly CacheOutcome[] = ['hit', 'miss', 'coalesced', 'none'];

/** `Cache-Status` (RFC 9211) for a hit: remaining freshness as `ttl`. */
export function hitCacheStatus(entry: CacheEntry, now: number): string {
  return `perch; hit; ttl=${remainingTtlSeconds(entry, now)}`;
}

/**
 * `Cache-Status` for a forwarded request. `stored` says the response went into the cache;
 * `collapsed` (RFC 9211 2.6) marks a request that shared another's upstream exchange.
 */
export function forwardCacheStatus(outcome: 'miss' | 'coalesced', stored: boolean): string {
  let value = 'perch; fwd=miss';
  if (outcome === 'coalesced') value += '; collapsed';
  if (stored) value += '; stored';
  return value;
}
