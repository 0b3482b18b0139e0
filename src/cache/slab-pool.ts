import { ownedBytes } from '../bytes.js';
import { inRegion, variantBytes, withVariants, type CacheEntry } from './entry.js';
import type { Generation } from './generation.js';
import { GracePeriods } from './grace-periods.js';

/**
 * Entries larger than this (identity body and variants together) get memory of their own: the
 * pages and users the interface serves are 1-20 KB, and a few large bodies are not what starts
 * the collections the slabs are for.
 */
export const MAX_REGION_BYTES = 65_536;

/** One reservation. Node 20 ends a Buffer at 4 GiB; a larger `max_bytes` takes several. */
const CHUNK_BYTES = 1024 ** 3;

/**
 * Region sizes, smallest first: steps of 64 bytes to 1 KiB, then eight steps per doubling, so
 * rounding up wastes at most 1/8 of a region (charged to `max_bytes`, see `waste`).
 */
const CLASS_BYTES: readonly number[] = (() => {
  const sizes: number[] = [];
  for (let size = 64; size <= 1024; size += 64) sizes.push(size);
  for (let base = 1024; base < MAX_REGION_BYTES; base *= 2) {
    for (let k = 1; k <= 8; k++) sizes.push(base + (k * base) / 8);
  }
  return sizes;
})();

/** A released region travels through the grace periods as one number: position and class. */
const CLASS_SPAN = 128;

/** The smallest class that holds `bytes` (1 to MAX_REGION_BYTES). */
export function classOf(bytes: number): number {
  if (bytes <= 1024) return Math.ceil(bytes / 64) - 1;
  const power = 31 - Math.clz32(bytes - 1);
  const step = 2 ** (power - 3);
  return 16 + (power - 10) * 8 + Math.ceil((bytes - 2 ** power) / step) - 1;
}

export function classBytes(index: number): number {
  return CLASS_BYTES[index]!;
}

function storedBytes(entry: CacheEntry): number {
  return entry.body.length + entry.brBytes + entry.gzipBytes;
}

/** The pool as the metrics see it (`perch_cache_slab_*`). */
export interface SlabStats {
  /** Bytes reserved at start. */
  readonly reservedBytes: number;
  /** Bytes cut into regions so far: the most of the reservation that can have become resident. */
  readonly cutBytes: number;
  /** Bytes of the regions that hold an entry now; the rest of `cutBytes` is idle (free or waiting). */
  readonly inUseBytes: number;
  /** Bytes of the entries held outside the pool: over 64 KiB, or stored when no region was free. */
  readonly ownBytes: number;
  /** Regions given back and waiting for the requests open at their release to close. */
  readonly waitingRegions: number;
  /** Stores that got memory of their own: no region free, or the entry larger than a region. */
  readonly ownMemoryStores: { readonly full: number; readonly too_large: number };
}

/**
 * The memory tier's bodies, held in a few large reservations instead of one allocation each.
 *
 * V8 counts every Buffer allocated since its last full collection against the old generation's
 * limit (`AllocatedExternalMemorySinceMarkCompact` in heap.h), so each stored body brought the
 * next full collection closer, and an evicted body's memory came back only after one: the miss
 * tail and the hits' GC share (docs/performance.md). Regions of a reservation made once are
 * counted once, at start, and an evicted entry's region is reused as soon as no open request
 * can still be reading it (grace-periods.ts).
 *
 * An entry's identity body and variants share one region, in that order. Regions come in
 * classes (`CLASS_BYTES`), each with its own free list; a class's regions are cut from the
 * reservation where its free list is empty. When the reservation is used up, or an entry is
 * larger than `MAX_REGION_BYTES`, the entry gets memory of its own, as before the slabs.
 *
 * What `max_bytes` bounds, exactly: what the entries are charged (memory-store.ts), each its
 * region's whole class or its own bytes, plus its key and overheads. Not the memory held: a
 * region keeps its class once cut, so after the traffic's sizes change the regions of classes no
 * longer used stay cut and idle while new entries take memory of their own. The bodies' memory
 * is the regions cut (at most the reservation, `max_bytes`) plus the entries outside the pool
 * (at most `max_bytes`, charged): never more than 2x `max_bytes`, 1.0x while the mix holds
 * (issue 50). `stats` tells the parts apart, and the metrics export them.
 */
export class SlabPool {
  readonly #chunks: Buffer[] = [];
  readonly #chunkOf = new Map<ArrayBufferLike, number>();
  readonly #capacity: number;
  /** Where the next new region starts, counted over all chunks. */
  #top = 0;
  readonly #free: number[][] = CLASS_BYTES.map(() => []);
  readonly #ownMemory = { full: 0, too_large: 0 };
  #inUse = 0;
  #own = 0;
  /** When released regions may be reused; the request path enters and leaves it. */
  readonly grace = new GracePeriods((region) => this.#free[region % CLASS_SPAN]!.push(Math.floor(region / CLASS_SPAN)));

  /**
   * Reserves `maxBytes` at once. Only the pages regions are cut from become resident; reserving
   * it all now makes V8 count it once, at start, when a collection is cheap. A reservation the
   * system refuses leaves the pool smaller, down to none: entries then get memory of their own.
   */
  constructor(maxBytes: number) {
    let reserved = 0;
    while (reserved < maxBytes) {
      const bytes = Math.min(CHUNK_BYTES, maxBytes - reserved);
      let chunk: Buffer;
      try {
        chunk = Buffer.allocUnsafeSlow(bytes);
      } catch {
        break;
      }
      this.#chunkOf.set(chunk.buffer, this.#chunks.length);
      this.#chunks.push(chunk);
      reserved += bytes;
    }
    this.#capacity = reserved;
  }

  /**
   * `entry` as the memory tier keeps it, under `generation` (an equal one, shared): a copy in a
   * region of the pool, or, where there is no region for it, `entry` itself. An entry already in
   * the pool is copied either way, so no two stored entries ever share a region.
   */
  place(entry: CacheEntry, generation: Generation): CacheEntry {
    const bytes = storedBytes(entry);
    const position = bytes === 0 || bytes > MAX_REGION_BYTES ? undefined : this.#take(classOf(bytes));
    if (position === undefined) {
      if (bytes > MAX_REGION_BYTES) this.#ownMemory.too_large += 1;
      else if (bytes > 0) this.#ownMemory.full += 1;
      this.#own += bytes;
      return this.#chunkOf.has(entry.body.buffer) ? ownCopy(entry) : entry;
    }
    this.#inUse += classBytes(classOf(bytes));
    const chunk = this.#chunks[Math.floor(position / CHUNK_BYTES)]!;
    const at = position % CHUNK_BYTES;
    entry.body.copy(chunk, at);
    variantBytes(entry)?.copy(chunk, at + entry.body.length);
    return inRegion(entry, chunk.subarray(at, at + entry.body.length), generation);
  }

  /** `entry` left the tier: its region is reused once the requests open now have closed. */
  release(entry: CacheEntry): void {
    const bytes = storedBytes(entry);
    const chunk = this.#chunkOf.get(entry.body.buffer);
    if (chunk === undefined) {
      this.#own -= bytes;
      return;
    }
    const position = chunk * CHUNK_BYTES + entry.body.byteOffset;
    this.#inUse -= classBytes(classOf(bytes));
    this.grace.release(position * CLASS_SPAN + classOf(bytes));
  }

  /** What rounding `entry`'s region up to its class adds: charged to `max_bytes` with the rest. */
  waste(entry: CacheEntry): number {
    if (!this.#chunkOf.has(entry.body.buffer)) return 0;
    const bytes = storedBytes(entry);
    return classBytes(classOf(bytes)) - bytes;
  }

  get stats(): SlabStats {
    return {
      reservedBytes: this.#capacity,
      cutBytes: this.#top,
      inUseBytes: this.#inUse,
      ownBytes: this.#own,
      waitingRegions: this.grace.held,
      ownMemoryStores: { ...this.#ownMemory },
    };
  }

  #take(index: number): number | undefined {
    const free = this.#free[index]!;
    if (free.length > 0) return free.pop();
    const size = CLASS_BYTES[index]!;
    let top = this.#top;
    // A region never spans two chunks: the end of a chunk too short for it is left unused.
    const chunkEnd = (Math.floor(top / CHUNK_BYTES) + 1) * CHUNK_BYTES;
    if (top + size > chunkEnd) top = chunkEnd;
    if (top + size > this.#capacity) return undefined;
    this.#top = top + size;
    return top;
  }
}

/** `entry` with bytes of its own: the body, and the variants in one more allocation. */
function ownCopy(entry: CacheEntry): CacheEntry {
  const variants = variantBytes(entry);
  const copy = variants && { bytes: ownedBytes([variants], variants.length), brBytes: entry.brBytes, gzipBytes: entry.gzipBytes };
  return withVariants({ ...entry, body: ownedBytes([entry.body], entry.body.length) }, copy);
}
