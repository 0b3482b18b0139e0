import { LRUCache } from 'lru-cache';
import type { Clock } from '../clock.js';
import { sameResponse, type CacheEntry } from './entry.js';
import type { Generation } from './generation.js';
import type { GracePeriods } from './grace-periods.js';
import { SlabPool, type SlabStats } from './slab-pool.js';
import type { CacheStore } from './store.js';

/**
 * Bytes charged per entry beyond its bodies (identity and compressed) and key: the entry object, the Buffer object and its
 * backing-store record, and lru-cache's slots. Measured at about 530 bytes of V8 heap per entry
 * (100k 1.5 KB entries, heap after a full GC), plus the backing store's own header; charging the
 * real cost is what keeps RSS proportional to `max_bytes` for small bodies such as cached 404s.
 * An entry in a slab region (slab-pool.ts) has one view, of its body, where it had a Buffer with a
 * backing store of its own per body (586 bytes of heap per entry with both variants, measured the
 * same way); the charge was not lowered for that, so the tier holds as many entries as before.
 */
const ENTRY_OVERHEAD_BYTES = 640;
/**
 * Each compressed variant. Set when each had an ArrayBuffer and a backing store of its own; in
 * the tier they are now lengths in the entry (entry.ts), but the charge stays: the tier holds no
 * more entries than before and the saving lowers RSS, which is still above its target (issue 22).
 */
const VARIANT_OVERHEAD_BYTES = 160;

/** What one entry costs `max_bytes`: every body it holds, its key (UTF-16) and the overheads. */
export function entryBytes(entry: CacheEntry, key: string): number {
  let bytes = entry.body.length + key.length * 2 + ENTRY_OVERHEAD_BYTES;
  if (entry.brBytes > 0) bytes += entry.brBytes + VARIANT_OVERHEAD_BYTES;
  if (entry.gzipBytes > 0) bytes += entry.gzipBytes + VARIANT_OVERHEAD_BYTES;
  return bytes;
}

export interface MemoryStoreOptions {
  readonly maxBytes: number;
  readonly clock: Clock;
}

/**
 * The in-process tier: an LRU bounded by bytes, answering synchronously. It keeps a copy of each
 * entry with the bytes in its slab pool (slab-pool.ts), so what `get` returns is that copy.
 */
export class MemoryStore implements CacheStore {
  readonly tier = 'memory' as const;
  readonly #lru: LRUCache<string, CacheEntry>;
  readonly #slabs: SlabPool;
  #evictions = 0;
  /**
   * The generation the entries stored last were stamped with. Purges are rare, so nearly every
   * entry has the same one: each keeping an object of its own cost 48 bytes of heap per entry.
   */
  #generation: Generation = { all: 0, scope: 0 };

  constructor(options: MemoryStoreOptions) {
    const slabs = new SlabPool(options.maxBytes);
    this.#slabs = slabs;
    this.#lru = new LRUCache<string, CacheEntry>({
      maxSize: options.maxBytes,
      // Retention runs on the injected clock, so expiry is as testable as freshness.
      perf: { now: () => options.clock.now() },
      ttlAutopurge: false,
      // Every way out (evicted, deleted, replaced, expired, purged) gives the region back.
      dispose: (entry, _key, reason) => {
        slabs.release(entry);
        // 'evict' only: deletes, purges, overwrites and expiry are not pressure on max_bytes.
        if (reason === 'evict') this.#evictions += 1;
      },
    });
  }

  /**
   * The request path joins these while it runs (server/connection-tracker.ts): a region read by
   * an open request is not reused.
   */
  get grace(): GracePeriods {
    return this.#slabs.grace;
  }

  /** Where the bytes live: the slab pool's figures, for the metrics. */
  get slabs(): SlabStats {
    return this.#slabs.stats;
  }

  /** Entries dropped so far to stay within `maxBytes`. */
  get evictions(): number {
    return this.#evictions;
  }

  get(key: string): CacheEntry | undefined {
    return this.#lru.get(key);
  }

  /** When the entry under `key` was stored (`storedAt`), undefined when none; recency untouched. */
  storedAt(key: string): number | undefined {
    return this.#lru.peek(key)?.storedAt;
  }

  /** Whether the entry under `key` is still `entry`'s response; recency untouched. */
  holds(key: string, entry: CacheEntry): boolean {
    const held = this.#lru.peek(key);
    return held !== undefined && sameResponse(held, entry);
  }

  set(key: string, entry: CacheEntry, retainMs: number): void {
    const stored = this.#slabs.place(entry, this.#shared(entry.generation));
    this.#lru.set(key, stored, { ttl: retainMs, size: entryBytes(stored, key) + this.#slabs.waste(stored) });
    // lru-cache keeps nothing larger than maxSize, and then disposes of nothing either.
    if (this.#lru.peek(key, { allowStale: true }) !== stored) this.#slabs.release(stored);
  }

  #shared(generation: Generation): Generation {
    const last = this.#generation;
    if (generation.all === last.all && generation.scope === last.scope) return last;
    this.#generation = { all: generation.all, scope: generation.scope };
    return this.#generation;
  }

  delete(key: string): void {
    this.#lru.delete(key);
  }

  /**
   * Deletes every entry whose key matches. Walks all keys: it serves purges, which are rare and
   * operator-driven, so an index kept up to date on every store would cost more than it saves.
   */
  deleteWhere(match: (key: string) => boolean): void {
    // Collected first: deleting while lru-cache's iterator walks its list would skip entries.
    for (const key of [...this.#lru.keys()].filter(match)) this.#lru.delete(key);
  }

  clear(): void {
    this.#lru.clear();
  }

  size(): { entries: number; bytes: number } {
    return { entries: this.#lru.size, bytes: this.#lru.calculatedSize };
  }
}
