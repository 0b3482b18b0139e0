import { LRUCache } from 'lru-cache';
import type { Clock } from '../clock.js';
import type { CacheEntry } from './entry.js';
import type { CacheStore } from './store.js';

/**
 * Bytes charged per entry beyond its bodies (identity and compressed) and key: the entry object, the Buffer object and its
 * backing-store record, and lru-cache's slots. Measured at about 530 bytes of V8 heap per entry
 * (100k 1.5 KB entries, heap after a full GC), plus the backing store's own header; charging the
 * real cost is what keeps RSS proportional to `max_bytes` for small bodies such as cached 404s.
 */
const ENTRY_OVERHEAD_BYTES = 640;
/**
 * Each compressed variant. Set when each had an ArrayBuffer and a backing store of its own; an
 * entry's two variants now share one (compression.ts), so a pair costs less than twice this, but
 * the charge stays: the tier holds no more entries than before and the saving lowers RSS, which
 * is still above its target (issue 22).
 */
const VARIANT_OVERHEAD_BYTES = 160;

/** What one entry costs `max_bytes`: every body it holds, its key (UTF-16) and the overheads. */
export function entryBytes(entry: CacheEntry, key: string): number {
  let bytes = entry.body.length + key.length * 2 + ENTRY_OVERHEAD_BYTES;
  const { encoded } = entry;
  if (encoded?.br !== undefined) bytes += encoded.br.length + VARIANT_OVERHEAD_BYTES;
  if (encoded?.gzip !== undefined) bytes += encoded.gzip.length + VARIANT_OVERHEAD_BYTES;
  return bytes;
}

export interface MemoryStoreOptions {
  readonly maxBytes: number;
  readonly clock: Clock;
}

/** The in-process tier: an LRU bounded by bytes, answering synchronously. */
export class MemoryStore implements CacheStore {
  readonly tier = 'memory' as const;
  readonly #lru: LRUCache<string, CacheEntry>;
  #evictions = 0;

  constructor(options: MemoryStoreOptions) {
    this.#lru = new LRUCache<string, CacheEntry>({
      maxSize: options.maxBytes,
      sizeCalculation: entryBytes,
      // Retention runs on the injected clock, so expiry is as testable as freshness.
      perf: { now: () => options.clock.now() },
      ttlAutopurge: false,
      // 'evict' only: deletes, purges, overwrites and expiry are not pressure on max_bytes.
      dispose: (_entry, _key, reason) => {
        if (reason === 'evict') this.#evictions += 1;
      },
    });
  }

  /** Entries dropped so far to stay within `maxBytes`. */
  get evictions(): number {
    return this.#evictions;
  }

  get(key: string): CacheEntry | undefined {
    return this.#lru.get(key);
  }

  /** The entry without touching its recency: for bookkeeping, not for serving. */
  peek(key: string): CacheEntry | undefined {
    return this.#lru.peek(key);
  }

  set(key: string, entry: CacheEntry, retainMs: number): void {
    this.#lru.set(key, entry, { ttl: retainMs });
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
