import { hash } from 'node:crypto';
import type { Generation } from './generation.js';

/** A body's content codings, made once when the entry is stored (cache/compression.ts). */
export interface Encodings {
  readonly br?: Buffer;
  readonly gzip?: Buffer;
}

/**
 * Every entry's variants in one object shape, both fields present (undefined where a coding is
 * absent). Built from computed keys and spreads instead, each object got a hidden class and a
 * descriptor array of its own in a running perch on Node 20 (V8 11.3; Node 24's V8 did not):
 * two more heap objects per entry, kept and marked by every full GC (issue 22).
 */
export function encodings(br: Buffer | undefined, gzip: Buffer | undefined): Encodings {
  return { br, gzip };
}

/** The content codings perch can serve, best first when a client accepts several equally. */
export type ContentCoding = 'br' | 'gzip';

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
  /**
   * The strong validator of `body` (RFC 9110 8.8.3), quotes included: a digest of the bytes, so
   * every instance and tier that holds the same response gives the same tag.
   */
  readonly etag: string;
  /** `body` compressed; absent until made, and for bodies below `cache.compression.min_bytes`. */
  readonly encoded?: Encodings;
}

/** An entry as a fetch produces it: its validator is derived here, once. */
export function newEntry(fields: Omit<CacheEntry, 'etag' | 'encoded'>, encoded?: Encodings): CacheEntry {
  return withEncodings({ ...fields, etag: entityTag(fields.body) }, encoded);
}

/**
 * `entry` with its variants, in the one shape every stored entry has. Written field by field:
 * spread copies of entries got a hidden class each in a running perch on Node 20, as the variants
 * did (see `encodings`), where an object literal takes its site's.
 */
export function withEncodings(entry: CacheEntry, encoded: Encodings | undefined): CacheEntry {
  return withBodies(entry, entry.body, encoded);
}

/** `entry` with other bytes of the same response: where the memory tier keeps them (slab-pool.ts). */
export function withBodies(entry: CacheEntry, body: Buffer, encoded: Encodings | undefined): CacheEntry {
  return { status: entry.status, body, storedAt: entry.storedAt, ttlMs: entry.ttlMs, generation: entry.generation, etag: entry.etag, encoded };
}

/**
 * Whether `a` and `b` are the same stored response, wherever their bytes live: the memory tier
 * keeps a copy of what it is given, so identity no longer tells.
 */
export function sameResponse(a: CacheEntry, b: CacheEntry): boolean {
  return (
    a.etag === b.etag &&
    a.storedAt === b.storedAt &&
    a.ttlMs === b.ttlMs &&
    a.status === b.status &&
    a.generation.all === b.generation.all &&
    a.generation.scope === b.generation.scope
  );
}

/**
 * A strong entity tag of `body`: 132 bits of its SHA-256, base64url. A digest rather than a
 * counter or a time, so it needs no coordination between instances and survives restarts.
 */
export function entityTag(body: Buffer): string {
  return `"${hash('sha256', body, 'base64url').slice(0, 22)}"`;
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
