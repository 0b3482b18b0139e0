import type { Generation } from './generation.js';

/**
 * One cached response: the exact bytes perch sends, with what it needs to tell the client how
 * old they are. Only 200s and upstream 404s are ever stored.
 */
export interface CacheEntry {
  readonly status: 200 | 404;
  readonly body: Buffer;
  /** Clock time (ms) the upstream answered. */
  readonly storedAt: number;
  /** Freshness lifetime (ms) from `storedAt`. */
  readonly ttlMs: number;
  /** The purge generations in force when its fetch started; older than known is absent. */
  readonly generation: Generation;
}

export function isFresh(entry: CacheEntry, now: number): boolean {
  return now - entry.storedAt < entry.ttlMs;
}

/** Whole seconds since the upstream answered, for the `Age` header (RFC 9111 5.1). */
export function ageSeconds(entry: CacheEntry, now: number): number {
  return Math.max(0, Math.floor((now - entry.storedAt) / 1000));
}

/** Whole seconds of freshness left, for `Cache-Status: ...; ttl=N` (RFC 9211 2.4). */
export function remainingTtlSeconds(entry: CacheEntry, now: number): number {
  return Math.floor((entry.storedAt + entry.ttlMs - now) / 1000);
}
