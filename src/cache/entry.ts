import { hash } from 'node:crypto';
import type { Generation } from './generation.js';

/**
 * A body's compressed variants as compression makes them (cache/compression.ts): their bytes in
 * one buffer, br first, then gzip; a length of 0 where that coding was not kept.
 */
export interface Variants {
  readonly bytes: Buffer;
  readonly brBytes: number;
  readonly gzipBytes: number;
}

/** The content codings perch can serve, best first when a client accepts several equally. */
export type ContentCoding = 'br' | 'gzip';

/**
 * One cached response: the exact bytes perch sends, with what it needs to tell the client how
 * old they are. Only 200s and upstream 404s are ever stored.
 *
 * The variants are lengths and at most one buffer, not a Buffer each: every Buffer is a 96-byte
 * object in V8's heap, and the memory tier holds tens of thousands of entries that every full
 * collection marks (issue 22). `variant` makes the view a response sends.
 */
export interface CacheEntry {
  readonly status: 200 | 404;
  readonly body: Buffer;
  /** Clock time (ms) the upstream answered. */
  readonly storedAt: number;
  /**
   * Clock time (ms) these bytes became the answer in the fleet, for `Last-Modified`: the date
   * Redis holds for them (redis-store.ts), or, without Redis, the `storedAt` of the fetch that
   * first returned them, kept by every refetch that returns the same bytes. When `undated`, no
   * exact date is known and this is the earliest time one may be given.
   */
  readonly modifiedAt: number;
  /**
   * No `Last-Modified` goes out: a date for these bytes would not be exact. So while Redis has
   * not dated them yet, when Redis could not, and when another body was sent with a date of the
   * same second (new bytes wait for a later second); the `ETag` still validates.
   */
  readonly undated: boolean;
  /** Freshness lifetime (ms) from `storedAt`. */
  readonly ttlMs: number;
  /** The purge generations in force when its fetch started; older than known is absent. */
  readonly generation: Generation;
  /**
   * The strong validator of `body` (RFC 9110 8.8.3), quotes included: a digest of the bytes, so
   * every instance and tier that holds the same response gives the same tag.
   */
  readonly etag: string;
  /**
   * The variants' bytes, br then gzip. Undefined where there are none, and where they follow
   * `body` in its own memory: the memory tier's regions (slab-pool.ts) hold them so.
   */
  readonly variants: Buffer | undefined;
  /** Length of the br variant; 0 where there is none (not made yet, below `cache.compression.min_bytes`, or no smaller). */
  readonly brBytes: number;
  /** Length of the gzip variant; 0 where there is none. */
  readonly gzipBytes: number;
}

/**
 * What a fetch or a tier reads of a response; the validator and the variants' layout are derived
 * here. Without `modifiedAt` the bytes are new at `storedAt`, dated exactly.
 */
export type EntryFields = Pick<CacheEntry, 'status' | 'body' | 'storedAt' | 'ttlMs' | 'generation'> & Partial<Pick<CacheEntry, 'modifiedAt' | 'undated'>>;

/** A response with its validator, as Redis holds it (redis-store.ts): what `withVariants` completes. */
export type TaggedFields = EntryFields & Pick<CacheEntry, 'etag'>;

/** An entry as a fetch produces it: its validator is derived here, once. */
export function newEntry(fields: EntryFields, variants?: Variants): CacheEntry {
  return withVariants({ ...fields, etag: entityTag(fields.body) }, variants);
}

/**
 * `entry` with `variants` (none where undefined). Every entry is made by this object literal, in
 * one object shape: entries built from spreads and computed keys got a hidden class and a
 * descriptor array each in a running perch on Node 20 (V8 11.3; Node 24's V8 did not), two more
 * heap objects per entry for every full GC to keep and mark (issue 22).
 */
export function withVariants(entry: TaggedFields, variants: Variants | undefined): CacheEntry {
  return {
    status: entry.status,
    body: entry.body,
    storedAt: entry.storedAt,
    modifiedAt: entry.modifiedAt ?? entry.storedAt,
    undated: entry.undated ?? false,
    ttlMs: entry.ttlMs,
    generation: entry.generation,
    etag: entry.etag,
    variants: variants?.bytes,
    brBytes: variants?.brBytes ?? 0,
    gzipBytes: variants?.gzipBytes ?? 0,
  };
}

/**
 * `entry` as the memory tier keeps it: `body` a copy of its body with the variants right after
 * it in the same memory, and `generation` an equal one the tier shares between its entries.
 */
export function inRegion(entry: CacheEntry, body: Buffer, generation: Generation): CacheEntry {
  return {
    status: entry.status,
    body,
    storedAt: entry.storedAt,
    modifiedAt: entry.modifiedAt,
    undated: entry.undated,
    ttlMs: entry.ttlMs,
    generation,
    etag: entry.etag,
    variants: undefined,
    brBytes: entry.brBytes,
    gzipBytes: entry.gzipBytes,
  };
}

/** The variants' bytes, br then gzip, wherever they live; undefined where there are none. */
export function variantBytes(entry: CacheEntry): Buffer | undefined {
  const length = entry.brBytes + entry.gzipBytes;
  return length === 0 ? undefined : variantView(entry, 0, length);
}

/**
 * The bytes of `entry` in `coding`, made as a view when a response needs them rather than kept
 * per entry (in the full run of 0a54345 a compressed hit cost 0.970x an identity hit's CPU).
 * The entry must have that coding (`brBytes` or `gzipBytes` above 0).
 */
export function variant(entry: CacheEntry, coding: ContentCoding): Buffer {
  return coding === 'br' ? variantView(entry, 0, entry.brBytes) : variantView(entry, entry.brBytes, entry.gzipBytes);
}

/** `length` bytes of the variants from `start`: in `variants`, or right after the body in its region. */
function variantView(entry: CacheEntry, start: number, length: number): Buffer {
  const { variants, body } = entry;
  return variants === undefined ? Buffer.from(body.buffer, body.byteOffset + body.length + start, length) : variants.subarray(start, start + length);
}

/**
 * Whether `a` and `b` are the same stored response, wherever their bytes live: the memory tier
 * keeps a copy of what it is given, so identity no longer tells.
 */
export function sameResponse(a: CacheEntry, b: CacheEntry): boolean {
  return (
    a.etag === b.etag &&
    a.storedAt === b.storedAt &&
    a.modifiedAt === b.modifiedAt &&
    a.undated === b.undated &&
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

/** What dates a body: its tag, when it became the answer, and whether that date is exact. */
export type Dated = Pick<CacheEntry, 'etag' | 'modifiedAt' | 'undated'>;

/**
 * The date of `body` (tagged `etag`) answered at `now`, given `previous`, the body it replaces
 * where known. Dates only move forward and never name two bodies: the same bytes keep their
 * date; new ones date from `now` if its second is past the previous body's date (or, for an
 * undated one, its floor), else stay undated until then. The script in redis-store.ts does the
 * same against the fleet's entry.
 */
export function modification(etag: string, now: number, previous: Dated | undefined): Dated {
  if (previous === undefined) return { etag, modifiedAt: now, undated: false };
  if (previous.etag === etag && !previous.undated) return { etag, modifiedAt: previous.modifiedAt, undated: false };
  const floor = previous.undated ? previous.modifiedAt : (Math.floor(previous.modifiedAt / 1000) + 1) * 1000;
  return now >= floor ? { etag, modifiedAt: now, undated: false } : { etag, modifiedAt: floor, undated: true };
}

/** `entry` with the date the fleet gave its bytes; the variants' bytes are copied with it. */
export function redated(entry: CacheEntry, date: Pick<CacheEntry, 'modifiedAt' | 'undated'>): CacheEntry {
  const bytes = variantBytes(entry);
  const fields = { ...entry, modifiedAt: date.modifiedAt, undated: date.undated };
  return withVariants(fields, bytes === undefined ? undefined : { bytes, brBytes: entry.brBytes, gzipBytes: entry.gzipBytes });
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
