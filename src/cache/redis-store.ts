import type { RedisClient } from '../redis/redis-client.js';
import { ownedBytes } from '../bytes.js';
import { decode } from './compression.js';
import { newEntry, variant, withVariants, type CacheEntry, type ContentCoding, type TaggedFields } from './entry.js';
import type { CacheStore } from './store.js';

/**
 * Layout of a stored value: a binary header, then the response bytes untouched. A binary header
 * rather than JSON keeps bodies byte-exact (no UTF-8 round trip) and costs no parsing.
 *   0  u8   format version (a changed layout must not be misread by an older instance)
 *   1  u8   coding of the payload: 0 identity, 1 gzip, 2 br
 *   2  u16  status
 *   4  f64  storedAt (ms since the epoch)
 *   12 u32  ttlMs (the largest TTL, 7 days, fits)
 *   16 u32  generation.all   (purge counters; 4 billion purges of one scope are out of reach)
 *   20 u32  generation.scope
 *   24 u32  length of the identity body
 *   28 u8   length n of the entity tag
 *   29 f64  modifiedAt (ms since the epoch: when these bytes became the answer)
 *   37 u8   flags: 1 = sharedSecond (another body was the answer within modifiedAt's second)
 *   38 n    the entity tag, ASCII, quotes included
 *   38+n    the payload
 * One variant travels, gzip when there is one: every client that takes a compressed body takes
 * gzip, so an instance filled from Redis serves all of them compressed without compressing, and
 * inflates it once for identity clients. Brotli alone would leave gzip-only clients with the
 * identity body; all three would more than double what Redis holds and ships.
 * The generations travel in the value rather than in the key (`<gen>|<path>`): one key per path
 * means the first write after a purge replaces the purged value instead of leaving it as
 * unreachable garbage until its PX ends (after `all`, the whole cache twice over), the
 * cross-instance lease stays per path, and an instance that has not yet heard of a purge still
 * finds the entries written after it.
 * Versions 3 (no modifiedAt and flags: a 29-byte header, the tag at 29) and 2 (identity only,
 * 24-byte header, no tag) are still read, their bytes dated from `storedAt`, so a rolling
 * upgrade serves the entries the older instances write; version 1 (no generations) and anything
 * unknown read as a miss. Older instances read version 4 as a miss.
 */
const FORMAT_VERSION = 4;
const HEADER_BYTES = 38;
const V3 = 3;
const V3_HEADER_BYTES = 29;
const V2 = 2;
const V2_HEADER_BYTES = 24;
const CODINGS: readonly (ContentCoding | undefined)[] = [undefined, 'gzip', 'br'];

export function encodeEntry(entry: CacheEntry): Buffer {
  const coding: ContentCoding | undefined = entry.gzipBytes > 0 ? 'gzip' : entry.brBytes > 0 ? 'br' : undefined;
  const payload = coding === undefined ? entry.body : variant(entry, coding);
  const tagBytes = Buffer.byteLength(entry.etag, 'latin1');
  const start = HEADER_BYTES + tagBytes;
  const value = Buffer.allocUnsafe(start + payload.length);
  value.writeUInt8(FORMAT_VERSION, 0);
  value.writeUInt8(CODINGS.indexOf(coding), 1);
  value.writeUInt16BE(entry.status, 2);
  value.writeDoubleBE(entry.storedAt, 4);
  value.writeUInt32BE(entry.ttlMs, 12);
  value.writeUInt32BE(entry.generation.all, 16);
  value.writeUInt32BE(entry.generation.scope, 20);
  value.writeUInt32BE(entry.body.length, 24);
  value.writeUInt8(tagBytes, 28);
  value.writeDoubleBE(entry.modifiedAt, 29);
  value.writeUInt8(entry.sharedSecond ? 1 : 0, 37);
  value.write(entry.etag, HEADER_BYTES, 'latin1');
  payload.copy(value, start);
  return value;
}

/**
 * undefined for a value this version cannot read, or whose payload does not inflate to what its
 * header says: it is then a miss, not an error, and never served.
 */
export async function decodeEntry(value: Buffer): Promise<CacheEntry | undefined> {
  if (value.length >= V2_HEADER_BYTES && value.readUInt8(0) === V2) return decodeV2(value);
  const version = value.length === 0 ? 0 : value.readUInt8(0);
  const header = version === V3 ? V3_HEADER_BYTES : HEADER_BYTES;
  if (value.length < header || (version !== FORMAT_VERSION && version !== V3)) return undefined;
  const status = value.readUInt16BE(2);
  const codingIndex = value.readUInt8(1);
  const start = header + value.readUInt8(28);
  if ((status !== 200 && status !== 404) || codingIndex >= CODINGS.length || start > value.length) return undefined;
  const coding = CODINGS[codingIndex];
  const length = value.readUInt32BE(24);
  // A copy, so the entry does not pin whatever larger buffer the reply was parsed from.
  const payload = ownedBytes([value.subarray(start)], value.length - start);
  let body = payload;
  if (coding !== undefined) {
    try {
      body = await decode(coding, payload, length);
    } catch {
      return undefined;
    }
  } else if (payload.length !== length) {
    return undefined;
  }
  const fields: TaggedFields = {
    status,
    body,
    storedAt: value.readDoubleBE(4),
    ...(version === V3 ? {} : { modifiedAt: value.readDoubleBE(29), sharedSecond: value.readUInt8(37) === 1 }),
    ttlMs: value.readUInt32BE(12),
    generation: { all: value.readUInt32BE(16), scope: value.readUInt32BE(20) },
    etag: value.toString('latin1', header, start),
  };
  if (coding === undefined) return withVariants(fields, undefined);
  return withVariants(fields, { bytes: payload, brBytes: coding === 'br' ? payload.length : 0, gzipBytes: coding === 'gzip' ? payload.length : 0 });
}

/** The layout before compression: the same first 24 bytes, then the identity body. */
function decodeV2(value: Buffer): CacheEntry | undefined {
  const status = value.readUInt16BE(2);
  if (status !== 200 && status !== 404) return undefined;
  return newEntry({
    status,
    storedAt: value.readDoubleBE(4),
    ttlMs: value.readUInt32BE(12),
    generation: { all: value.readUInt32BE(16), scope: value.readUInt32BE(20) },
    body: ownedBytes([value.subarray(V2_HEADER_BYTES)], value.length - V2_HEADER_BYTES),
  });
}

/**
 * The shared tier: every perch instance reads and writes the same entries. Retention is Redis's
 * own expiry (SET ... PX), so nothing needs sweeping. Failures reject; the tiered cache turns
 * them into misses.
 */
export class RedisStore implements CacheStore {
  readonly tier = 'redis' as const;
  readonly #client: RedisClient;
  readonly #prefix: string;

  constructor(client: RedisClient, prefix: string) {
    this.#client = client;
    this.#prefix = prefix;
  }

  async get(key: string): Promise<CacheEntry | undefined> {
    const value = await this.#client.getBuffer(this.redisKey(key));
    return value === null ? undefined : await decodeEntry(value);
  }

  async set(key: string, entry: CacheEntry, retainMs: number): Promise<void> {
    await this.#client.set(this.redisKey(key), encodeEntry(entry), 'PX', Math.max(1, Math.ceil(retainMs)));
  }

  async delete(key: string): Promise<void> {
    await this.#client.del(this.redisKey(key));
  }

  size(): undefined {
    return undefined;
  }

  /** The Redis key of a cache key: what decides which cluster node holds it. */
  redisKey(key: string): string {
    return `${this.#prefix}c:${key}`;
  }
}
