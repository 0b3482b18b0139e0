import type { RedisClient } from '../redis/redis-client.js';
import { ownedBytes } from '../bytes.js';
import type { CacheEntry } from './entry.js';
import type { CacheStore } from './store.js';

/**
 * Layout of a stored value: a fixed 24-byte header, then the response bytes untouched. A binary
 * header rather than JSON keeps bodies byte-exact (no UTF-8 round trip) and costs no parsing.
 *   0  u8   format version (a changed layout must not be misread by an older instance)
 *   1  u8   reserved
 *   2  u16  status
 *   4  f64  storedAt (ms since the epoch)
 *   12 u32  ttlMs (the largest TTL, 7 days, fits)
 *   16 u32  generation.all   (purge counters; 4 billion purges of one scope are out of reach)
 *   20 u32  generation.scope
 * The generations travel in the value rather than in the key (`<gen>|<path>`): one key per path
 * means the first write after a purge replaces the purged value instead of leaving it as
 * unreachable garbage until its PX ends (after `all`, the whole cache twice over), the
 * cross-instance lease stays per path, and an instance that has not yet heard of a purge still
 * finds the entries written after it. Version 1 (no generations) reads as a miss.
 */
const FORMAT_VERSION = 2;
const HEADER_BYTES = 24;

export function encodeEntry(entry: CacheEntry): Buffer {
  const value = Buffer.allocUnsafe(HEADER_BYTES + entry.body.length);
  value.writeUInt8(FORMAT_VERSION, 0);
  value.writeUInt8(0, 1);
  value.writeUInt16BE(entry.status, 2);
  value.writeDoubleBE(entry.storedAt, 4);
  value.writeUInt32BE(entry.ttlMs, 12);
  value.writeUInt32BE(entry.generation.all, 16);
  value.writeUInt32BE(entry.generation.scope, 20);
  entry.body.copy(value, HEADER_BYTES);
  return value;
}

/** undefined for a value this version cannot read: it is then a miss, not an error. */
export function decodeEntry(value: Buffer): CacheEntry | undefined {
  if (value.length < HEADER_BYTES || value.readUInt8(0) !== FORMAT_VERSION) return undefined;
  const status = value.readUInt16BE(2);
  if (status !== 200 && status !== 404) return undefined;
  return {
    status,
    storedAt: value.readDoubleBE(4),
    ttlMs: value.readUInt32BE(12),
    generation: { all: value.readUInt32BE(16), scope: value.readUInt32BE(20) },
    // A copy, so the entry does not pin whatever larger buffer the reply was parsed from.
    body: ownedBytes([value.subarray(HEADER_BYTES)], value.length - HEADER_BYTES),
  };
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
    return value === null ? undefined : decodeEntry(value);
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
