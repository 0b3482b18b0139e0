import assert from 'node:assert/strict';
import { test } from 'node:test';
import { newEntry, variant, type CacheEntry } from '../src/cache/entry.js';
import { classBytes, classOf, MAX_REGION_BYTES, SlabPool } from '../src/cache/slab-pool.js';

const T = { timeout: 10_000 };

const GEN = { all: 0, scope: 0 };

function entry(bodyBytes: number, fill: number, variants?: { br: number; gzip: number }): CacheEntry {
  const fields = { status: 200 as const, body: Buffer.alloc(bodyBytes, fill), storedAt: 1_767_225_600_000, ttlMs: 60_000, generation: { all: 0, scope: 0 } };
  if (variants === undefined) return newEntry(fields);
  const bytes = Buffer.concat([Buffer.alloc(variants.br, fill + 1), Buffer.alloc(variants.gzip, fill + 2)]);
  return newEntry(fields, { bytes, brBytes: variants.br, gzipBytes: variants.gzip });
}

/** What a response would send of `e`, coding by coding: equal for the same response wherever it lives. */
const sent = (e: CacheEntry) => ({ body: e.body, br: e.brBytes > 0 ? variant(e, 'br') : undefined, gzip: e.gzipBytes > 0 ? variant(e, 'gzip') : undefined });
/** `e` without where its variants live. */
const response = (e: CacheEntry) => {
  const { variants: _held, ...fields } = e;
  return fields;
};

test('every size up to the largest region gets the smallest class that holds it, wasting at most an eighth above 1 KiB', T, () => {
  for (let bytes = 1; bytes <= MAX_REGION_BYTES; bytes++) {
    const index = classOf(bytes);
    const size = classBytes(index);
    assert.ok(size >= bytes, `${bytes} bytes in a region of ${size}`);
    if (index > 0) assert.ok(classBytes(index - 1) < bytes, `${bytes} bytes fit the class below ${size}`);
    if (bytes > 1024) assert.ok(size - bytes <= bytes / 8, `${bytes} bytes waste ${size - bytes}`);
    else assert.ok(size - bytes < 64);
  }
  assert.equal(classBytes(classOf(MAX_REGION_BYTES)), MAX_REGION_BYTES);
});

test('an entry is copied into one region: identity body, then its variants; the original is untouched', T, () => {
  const pool = new SlabPool(1024 * 1024);
  const original = entry(1000, 0x41, { br: 300, gzip: 400 });
  const placed = pool.place(original, GEN);
  assert.notEqual(placed, original);
  assert.deepEqual(response(placed), response(original), 'same response');
  assert.deepEqual(sent(placed), sent(original), 'same bytes');
  assert.equal(placed.variants, undefined, 'no view of the variants kept: they follow the body');
  assert.equal(placed.generation, GEN, 'the generation the tier shares');
  const { br, gzip } = sent(placed);
  assert.equal(br!.buffer, placed.body.buffer);
  assert.equal(gzip!.buffer, placed.body.buffer);
  assert.equal(br!.byteOffset, placed.body.byteOffset + 1000);
  assert.equal(gzip!.byteOffset, placed.body.byteOffset + 1300);
  assert.notEqual(placed.body.buffer, original.body.buffer);
  assert.equal(pool.waste(placed), classBytes(classOf(1700)) - 1700);
  assert.equal(pool.waste(original), 0, 'memory of its own is charged as it is');
});

test('a released region is reused by its class only once the requests open at its release have closed', T, () => {
  const pool = new SlabPool(1024 * 1024);
  const first = pool.place(entry(5000, 1), GEN);
  const reading = pool.grace.enter();
  pool.release(first);
  const second = pool.place(entry(5000, 2), GEN);
  assert.notEqual(second.body.byteOffset, first.body.byteOffset, 'a request may still be sending the first');
  assert.ok(first.body.every((b) => b === 1));
  pool.grace.leave(reading);
  const third = pool.place(entry(4900, 3), GEN);
  assert.equal(third.body.byteOffset, first.body.byteOffset, 'the same class takes the freed region');
  const other = pool.place(entry(100, 4), GEN);
  assert.notEqual(other.body.byteOffset, first.body.byteOffset);
  assert.equal(pool.stats.cutBytes, 2 * classBytes(classOf(5000)) + classBytes(classOf(100)));
});

test('once the reservation is cut, entries keep memory of their own; so do large and empty ones', T, () => {
  const pool = new SlabPool(1024);
  const inPool = pool.place(entry(600, 1), GEN);
  assert.notEqual(inPool, entry(600, 1));
  const full = entry(600, 2);
  assert.equal(pool.place(full, GEN), full, 'no region left: the entry as given');
  const large = new SlabPool(1024 * 1024);
  const big = entry(MAX_REGION_BYTES + 1, 3);
  assert.equal(large.place(big, GEN), big);
  const empty = entry(0, 0);
  assert.equal(large.place(empty, GEN), empty);
  // Releasing what is not in the pool is a no-op, not a corrupted free list.
  large.release(big);
  large.release(empty);
  assert.equal(large.stats.cutBytes, 0);
});

test('an entry already in the pool is copied out when no region is left, so no two entries share one', T, () => {
  const pool = new SlabPool(1024);
  const placed = pool.place(entry(400, 1, { br: 100, gzip: 150 }), GEN);
  const again = pool.place(placed, GEN);
  assert.notEqual(again.body.buffer, placed.body.buffer);
  assert.notEqual(again.variants!.buffer, placed.body.buffer, 'the variants too');
  assert.deepEqual(response(again), response(placed));
  assert.deepEqual(sent(again), sent(placed));
  pool.release(placed);
  again.body[0] = 9;
  again.variants![0] = 9;
  assert.equal(placed.body[0], 1);
  assert.equal(sent(placed).br![0], 2);
});
