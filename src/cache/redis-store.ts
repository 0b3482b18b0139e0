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
 *   29 f64  modifiedAt (ms since the epoch: when these bytes first became the answer in the fleet)
 *   37 u8   flags: 1 = undated (no exact date: modifiedAt is the earliest one may be given)
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
 * The date is the fleet's: every write goes through DATE_SCRIPT, which dates the bytes against
 * the value it replaces, atomically, so no instance dates from its own memory of an older body.
 * Versions 4 (the same layout, dated by each instance on its own), 3 (no modifiedAt and flags: a
 * 29-byte header, the tag at 29) and 2 (identity only, 24-byte header, no tag) are still read,
 * undated: a date from them may be wrong, so they go out with their ETag alone, and new bytes are
 * dated past them. Version 1 (no generations) and anything unknown read as a miss. Older
 * instances read version 5 as a miss.
 */
const FORMAT_VERSION = 5;
const HEADER_BYTES = 38;
const V4 = 4;
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
  value.writeUInt8(entry.undated ? 1 : 0, 37);
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
  if (value.length < header || (version !== FORMAT_VERSION && version !== V4 && version !== V3)) return undefined;
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
    ...(version === FORMAT_VERSION ? { modifiedAt: value.readDoubleBE(29), undated: value.readUInt8(37) === 1 } : { modifiedAt: nextSecond(version === V4 ? value.readDoubleBE(29) : value.readDoubleBE(4)), undated: true }),
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
    modifiedAt: nextSecond(value.readDoubleBE(4)),
    undated: true,
    ttlMs: value.readUInt32BE(12),
    generation: { all: value.readUInt32BE(16), scope: value.readUInt32BE(20) },
    body: ownedBytes([value.subarray(V2_HEADER_BYTES)], value.length - V2_HEADER_BYTES),
  });
}

/** The start of the second after `ms`'s: the earliest date new bytes may get after a date of `ms`. */
function nextSecond(ms: number): number {
  return (Math.floor(ms / 1000) + 1) * 1000;
}

/**
 * Writes an entry dated against the one it replaces, in one step. The same bytes as a dated
 * entry keep its date; other bytes (or an undated entry) date from now when now is past the old
 * date's second (or the undated entry's floor), else they stay undated with that floor: so dates
 * only rise, never name two bodies, and never lie in the future. `empty` (a write by a fetch that
 * is not this key's, cross-population): written only where the key holds nothing current, that
 * is nothing, an older generation, or an expired entry; else the holder's tag is returned.
 * Layouts 2 to 5 share the first 24 bytes (status, storedAt, ttlMs, generations); 4 and 5 the
 * tag and modifiedAt. KEYS[1] entry; ARGV value, now, tag, PX, mode, generation all, scope.
 * Returns { 'set', modifiedAt, undated, whether the tag differs from the replaced value's (1 where
 * none was) } or { 'held', tag }.
 */
const DATE_SCRIPT = `
local old = redis.call('GET', KEYS[1])
local value, now, tag = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local at, undated, changed = now, 0, 1
local version = old and string.len(old) >= 24 and string.byte(old, 1) or 0
if version >= 2 and version <= 5 then
  local stored, ttl, all, scope = struct.unpack('>dI4I4I4', old, 5)
  local oldTag, oldAt, oldUndated = '', stored, true
  if version >= 4 and string.len(old) >= 38 then
    oldTag = string.sub(old, 39, 38 + string.byte(old, 29))
    oldAt = struct.unpack('>d', old, 30)
    oldUndated = version == 4 or string.byte(old, 38) % 2 == 1
    if version == 4 then oldAt = (math.floor(oldAt / 1000) + 1) * 1000 end
  elseif version < 4 then
    oldAt = (math.floor(oldAt / 1000) + 1) * 1000
  end
  if ARGV[5] == 'empty' then
    local gall, gscope = tonumber(ARGV[6]), tonumber(ARGV[7])
    local older = all < gall or (all == gall and scope < gscope)
    if not older and stored + ttl > now then return { 'held', oldTag } end
  end
  if oldTag == tag then changed = 0 end
  if oldTag == tag and not oldUndated then
    at = oldAt
  else
    local floor = oldAt
    if not oldUndated then floor = (math.floor(oldAt / 1000) + 1) * 1000 end
    if now < floor then at, undated = floor, 1 end
  end
end
value = string.sub(value, 1, 29) .. struct.pack('>d', at) .. string.char(undated) .. string.sub(value, 39)
redis.call('SET', KEYS[1], value, 'PX', ARGV[4])
return { 'set', tostring(at), undated, changed }`;

/** What a dated write did: stored with the fleet's date, or left the current holder's entry. */
export type Put = { readonly kind: 'set'; readonly modifiedAt: number; readonly undated: boolean; readonly changed: boolean } | { readonly kind: 'held'; readonly etag: string };

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

  /**
   * Stores `entry` dated by the fleet (DATE_SCRIPT); `onlyIfEmpty`: only where the key holds
   * nothing current. Only 38-byte headers are written, so the script's offsets hold.
   */
  async put(key: string, entry: CacheEntry, retainMs: number, onlyIfEmpty: boolean): Promise<Put> {
    const px = Math.max(1, Math.ceil(retainMs));
    const mode = onlyIfEmpty ? 'empty' : 'any';
    const { all, scope } = entry.generation;
    const reply = (await this.#client.eval(DATE_SCRIPT, 1, this.redisKey(key), encodeEntry(entry), entry.storedAt, entry.etag, px, mode, all, scope)) as [string, string, number?, number?];
    if (reply[0] === 'held') return { kind: 'held', etag: reply[1] };
    return { kind: 'set', modifiedAt: Number(reply[1]), undated: reply[2] === 1, changed: reply[3] !== 0 };
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
