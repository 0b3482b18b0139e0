import type { CacheEntry } from './entry.js';

export type CacheTier = 'memory' | 'redis';

/**
 * A cache tier. Both tiers pass the same contract suite (test/cache-store-contract.test.ts).
 * Methods may answer synchronously (the memory tier does, so a hit costs no microtask) or with a
 * promise (a network tier). A tier that fails must reject or throw; the caller turns that into a
 * miss, a log line and a metric, never a failed request.
 */
export interface CacheStore {
  readonly tier: CacheTier;
  get(key: string): CacheEntry | undefined | Promise<CacheEntry | undefined>;
  /** Keeps `entry` for `retainMs` (at least its TTL); a later set of the same key replaces it. */
  set(key: string, entry: CacheEntry, retainMs: number): void | Promise<void>;
  delete(key: string): void | Promise<void>;
  /** Entries held, for metrics; a tier that cannot tell cheaply reports undefined. */
  size(): { entries: number; bytes: number } | undefined;
}
