import type { Clock } from '../clock.js';
import type { BreakerState } from '../redis/breaker.js';
import type { GuardedRedis, RedisCallStats } from '../redis/guarded-redis.js';
import type { CompressionConfig } from '../config/types.js';
import { compressible, encode } from './compression.js';
import { isFresh, redated, withVariants, type CacheEntry } from './entry.js';
import { scopeOfKey, type Generations, type PurgeTarget } from './generations.js';
import type { MemoryStore } from './memory-store.js';
import type { PurgeResult, PurgeSync } from './purge-sync.js';
import type { RedisStore } from './redis-store.js';

export interface TieredCacheOptions {
  readonly memory: MemoryStore;
  /** The shared tier; absent: memory only. */
  readonly redis?: { readonly guard: GuardedRedis; readonly store: RedisStore; readonly purges: PurgeSync };
  readonly generations: Generations;
  readonly clock: Clock;
  /** How long past its TTL an entry is kept to serve stale (while revalidating, or on error). */
  readonly staleMs: number;
}

/** One key to store a response under. */
export interface CacheWrite {
  readonly key: string;
  readonly entry: CacheEntry;
  /**
   * A write by a fetch that is not this key's own (cross-population): made only where the key
   * holds nothing current; where it holds other bytes, that entry is purged on every instance
   * instead, so no two versions of it are served side by side.
   */
  readonly onlyIfEmpty?: boolean;
  /**
   * For a write only where empty: whether the fetch's own route answered new bytes (other than
   * the ones it held before, or none known). Only then do other bytes under this key mean the
   * user changed and are purged; when the fetch's own bytes did not change, two routes that
   * legitimately answer different bytes must not purge each other on every miss. Undefined with
   * Redis, which tells from the own route's write.
   */
  readonly sourceChanged?: boolean;
}

export interface StoreResult {
  /** Per write, whether memory took it (false: a purge of its scope since its fetch began). */
  readonly accepted: readonly boolean[];
  /** Resolves when the variants are made and Redis has the entries or gave up; never rejects. */
  readonly settled: Promise<void>;
}

/** A retained entry and whether it is still fresh. */
export interface Found {
  readonly entry: CacheEntry;
  readonly fresh: boolean;
}

/**
 * The two cache tiers as the request path sees them: memory (synchronous, per instance) in front
 * of Redis (shared by every instance). Entries carry `storedAt`, so Age and remaining TTL are the
 * same whichever tier or instance answers. Redis failures never surface here: they are misses.
 */
export class TieredCache {
  readonly memory: MemoryStore;
  /** Stamps fetches and filters purged entries (see generations.ts). */
  readonly generations: Generations;
  readonly #redis: TieredCacheOptions['redis'];
  readonly #clock: Clock;
  #staleMs: number;
  readonly #pending = new Set<Promise<void>>();

  constructor(options: TieredCacheOptions) {
    this.memory = options.memory;
    this.generations = options.generations;
    this.#redis = options.redis;
    this.#clock = options.clock;
    this.#staleMs = options.staleMs;
  }

  /**
   * `cache.stale_seconds` changed by a reload: entries read from now on are retained (and served
   * stale) that long past their TTL. Entries already stored keep the Redis expiry and memory
   * lifetime they were stored with, so a longer window reaches only entries stored after it.
   */
  set staleMs(ms: number) {
    this.#staleMs = ms;
  }

  get shared(): boolean {
    return this.#redis !== undefined;
  }

  /** Redis breaker state, or undefined without Redis. */
  get redisState(): BreakerState | undefined {
    return this.#redis?.guard.state;
  }

  /**
   * Whether this instance has heard every purge: always without Redis; with it, once the purge
   * counters are synced after the last (re)connection (purge-sync.ts). Until then each entry read
   * in Redis is judged by the counters read after it, and nothing is written there.
   */
  get current(): boolean {
    return this.#redis === undefined || this.#redis.purges.current;
  }

  /** Whether Redis is connected now, or undefined without Redis. */
  get redisConnected(): boolean | undefined {
    return this.#redis?.guard.connected;
  }

  /** Redis calls that failed or were skipped, or undefined without Redis. */
  get redisStats(): Readonly<RedisCallStats> | undefined {
    return this.#redis?.guard.stats;
  }

  /** The memory tier's entry, fresh or within its stale window. Synchronous: a hit costs no await. */
  local(key: string): Found | undefined {
    return this.#classify(this.memory.get(key));
  }

  /**
   * The shared tier's entry; a hit refills memory for the rest of the entry's retention, unless
   * memory already holds that response or a newer one: a refresh may have stored its answer
   * while this read was in flight, and the older entry from Redis must not replace it (issue 50).
   */
  async remote(key: string): Promise<Found | undefined> {
    const redis = this.#redis;
    if (redis === undefined) return undefined;
    const entry = await redis.guard.run('get', redis.store.redisKey(key), () => redis.store.get(key));
    // Purges this instance may not have heard of (purge-sync.ts): Redis may hold what one dropped,
    // so the counters are read after the entry, and without them nothing read is served.
    if (entry !== undefined && !redis.purges.current && !(await redis.purges.catchUp())) return undefined;
    // Checked after the await, against the generations known now: a purge observed while the
    // read was in flight still applies to its result.
    const found = entry !== undefined && this.generations.accepts(key, entry.generation) ? this.#classify(entry) : undefined;
    if (found !== undefined) {
      const left = this.#retainUntil(found.entry) - this.#clock.now();
      const held = this.memory.storedAt(key);
      if (left > 0 && (held === undefined || held < found.entry.storedAt)) this.memory.set(key, found.entry, left);
    }
    return found;
  }

  /**
   * Stores one response under each key of `writes` (a user under both of its routes): memory
   * now, then its compressed variants and Redis behind the answer. A write whose key saw a purge
   * since its fetch started is dropped (`accepted` false): the response may predate the purge.
   * `settled` resolves once the variants are made and Redis has the entries or gave up; it never
   * rejects. The client is answered without waiting for either: compression and a Redis round
   * trip would otherwise be on every miss's critical path.
   */
  store(writes: readonly CacheWrite[], compression: CompressionConfig): StoreResult {
    const accepted = writes.map((w) => this.generations.accepts(w.key, w.entry.generation));
    // An instance that may have missed a purge keeps its fetches to itself, as one without Redis:
    // its stamp may be below the fleet's counters (every instance would reject the entry) or
    // above counters Redis lost (a purge counted below it would not end the entry). Once
    // resynced, its view is in the counters (the resync writes it back), and so is every stamp.
    const shared = this.#redis !== undefined && this.#redis.purges.current;
    const kept = writes.filter((w, i) => accepted[i] && (w.onlyIfEmpty !== true || shared || this.#vacant(w)));
    // Shared, a write only where the key is empty waits for Redis to say it was.
    for (const { key, entry, onlyIfEmpty } of kept) if (onlyIfEmpty !== true || !shared) this.memory.set(key, entry, this.#retainUntil(entry) - this.#clock.now());
    if (kept.length === 0) return { accepted, settled: Promise.resolve() };
    const settled = this.#publish(kept, compression, shared);
    this.#pending.add(settled);
    void settled.finally(() => this.#pending.delete(settled));
    return { accepted, settled };
  }

  /**
   * Drops one key from both tiers: an answer about the request itself (a rejected cursor) ended
   * its entry. Resolves once Redis deleted it or gave up; never rejects.
   */
  async drop(key: string): Promise<void> {
    this.memory.delete(key);
    const redis = this.#redis;
    if (redis !== undefined) await redis.guard.run('del', redis.store.redisKey(key), () => redis.store.delete(key));
  }

  /** Resolves once every store begun so far has settled (its variants made, Redis written). */
  async settled(): Promise<void> {
    await Promise.all(this.#pending);
  }

  /**
   * The variants, made once for all keys (they share one body), replace the memory entries
   * unless something newer did meanwhile; then Redis gets the compressed form.
   */
  async #publish(writes: readonly CacheWrite[], compression: CompressionConfig, shared: boolean): Promise<void> {
    const body = writes[0]!.entry.body;
    const variants = compressible(body, compression) ? await encode(body, compression) : undefined;
    const redis = this.#redis;
    // The fetch's own key first: whether its bytes changed decides what a twin holding other
    // bytes means (`sourceChanged`). Not written (TTL 0, Redis failing): taken as changed.
    let sourceChanged = true;
    const write = async ({ key, entry, onlyIfEmpty = false }: CacheWrite): Promise<void> => {
      const full = variants === undefined ? entry : withVariants(entry, variants);
      const retainMs = this.#retainUntil(entry) - this.#clock.now();
      if (retainMs <= 0) return;
      if (full !== entry && this.memory.holds(key, entry)) this.memory.set(key, full, retainMs);
      // Not shared (see `store`), or no longer: a subscription lost since is a purge maybe missed.
      if (redis === undefined || !shared || !redis.purges.current) return;
      // The fleet's date comes back with the write; until then memory serves the entry undated.
      const put = await redis.guard.run('set', redis.store.redisKey(key), () => redis.store.put(key, full, retainMs, onlyIfEmpty));
      if (put === undefined) return;
      if (put.kind === 'held') {
        if (put.etag !== entry.etag && sourceChanged) void this.purge(scopeOfKey(key));
        return;
      }
      if (!onlyIfEmpty) sourceChanged = put.changed;
      const left = this.#retainUntil(entry) - this.#clock.now();
      // Written where Redis held nothing current: memory follows Redis, unless something newer landed.
      const current = onlyIfEmpty ? this.generations.accepts(key, entry.generation) && (this.memory.storedAt(key) ?? -Infinity) <= entry.storedAt : this.memory.holds(key, full);
      if (left > 0 && current) this.memory.set(key, redated(full, put), left);
    };
    await Promise.all(writes.filter((w) => w.onlyIfEmpty !== true).map(write));
    await Promise.all(writes.filter((w) => w.onlyIfEmpty === true).map(write));
  }

  /**
   * Whether memory holds nothing current under `key` for a write only where it is empty (no
   * Redis: the instance is the whole fleet). Other bytes held are purged instead of replaced.
   */
  #vacant({ key, entry, sourceChanged = true }: CacheWrite): boolean {
    const held = this.local(key);
    if (held === undefined || !held.fresh) return true;
    if (held.entry.etag !== entry.etag && sourceChanged) this.generations.bump(scopeOfKey(key));
    return false;
  }

  /**
   * Purges `target` on every instance. With Redis, `confirmed` once every instance the purge
   * reached applied it; `unconfirmed` when counted but some did not say so in time; `failed`
   * when Redis could not count it: then only this instance's memory entries are dropped, and the
   * other instances keep theirs.
   */
  async purge(target: PurgeTarget): Promise<PurgeResult> {
    const redis = this.#redis;
    if (redis === undefined) {
      this.generations.bump(target);
      return 'confirmed';
    }
    const result = await redis.purges.purge(target);
    if (result === 'failed') this.generations.drop([target]);
    return result;
  }

  /**
   * Waits at most `ms` for the purge counters' first resync, so that an instance serves Redis
   * entries from its first request; false when it did not come (Redis down or slow): they are
   * misses until it does. True at once without Redis.
   */
  started(ms: number): Promise<boolean> {
    return this.#redis === undefined ? Promise.resolve(true) : this.#redis.purges.started(ms);
  }

  /** Stops following purges; the Redis connection is the composition root's to close. */
  close(): void {
    this.#redis?.purges.close();
  }

  #classify(entry: CacheEntry | undefined): Found | undefined {
    if (entry === undefined) return undefined;
    const now = this.#clock.now();
    if (isFresh(entry, now)) return { entry, fresh: true };
    return now < this.#retainUntil(entry) ? { entry, fresh: false } : undefined;
  }

  #retainUntil(entry: CacheEntry): number {
    return entry.storedAt + entry.ttlMs + this.#staleMs;
  }
}
