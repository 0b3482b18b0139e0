import assert from 'node:assert/strict';
import { test } from 'node:test';
import { brotliDecompressSync, gunzipSync } from 'node:zlib';
import { decode, encode } from '../src/cache/compression.js';
import { newEntry, variant, withVariants, type CacheEntry, type Variants } from '../src/cache/entry.js';
import { decodeEntry, encodeEntry } from '../src/cache/redis-store.js';

const ON = { brotli: true, gzip: true, min_bytes: 1024 };
const entryOf = (body: Buffer, variants: Variants | undefined) => newEntry({ status: 200, body, storedAt: 1_000, ttlMs: 60_000, generation: { all: 0, scope: 0 } }, variants);
/** The variants of `entry` by coding, as a response would send them. */
const codings = (entry: CacheEntry) => ({ br: entry.brBytes > 0 ? variant(entry, 'br') : undefined, gzip: entry.gzipBytes > 0 ? variant(entry, 'gzip') : undefined });
/** What `encode` made of `body`, by coding. */
const encoded = async (body: Buffer, settings: typeof ON) => codings(entryOf(body, await encode(body, settings)));
const page = (bytes: number) => Buffer.from(JSON.stringify({ data: Array.from({ length: Math.ceil(bytes / 20) }, (_, i) => ({ id: String(i), text: `tweet ${i}` })) }).slice(0, bytes));

test('variants of a small body (made on the loop) and of a large one (on the thread pool) inflate to the body', async () => {
  for (const size of [1024, 10_000, 65_536, 200_000]) {
    const body = page(size);
    const { br, gzip } = await encoded(body, ON);
    assert.ok(br !== undefined && gzip !== undefined, `${size}: both variants`);
    assert.ok(brotliDecompressSync(br).equals(body), `${size}: br`);
    assert.ok(gunzipSync(gzip).equals(body), `${size}: gzip`);
    assert.ok((await decode('gzip', gzip, body.length)).equals(body));
    assert.ok((await decode('br', br, body.length)).equals(body));
  }
});

test('below min_bytes, with a coding off, or when a variant would not be smaller, it is not kept', async () => {
  const kept = (e: { br?: Buffer | undefined; gzip?: Buffer | undefined }) => (['br', 'gzip'] as const).filter((c) => e[c] !== undefined);
  assert.equal(await encode(page(1023), ON), undefined);
  assert.deepEqual(kept(await encoded(page(5000), { ...ON, brotli: false })), ['gzip']);
  assert.deepEqual(kept(await encoded(page(5000), { ...ON, gzip: false })), ['br']);
  const random = Buffer.from(Array.from({ length: 4096 }, (_, i) => (i * 2654435761) % 251));
  const noise = Buffer.from(random.map((b, i) => (b ^ (i * 97)) & 0xff));
  const { gzip } = await encoded(noise, ON);
  assert.ok(gzip === undefined || gzip.length < noise.length);
});

test('decode refuses a payload that inflates to another length than stored', async () => {
  const body = page(10_000);
  const { gzip } = await encoded(body, ON);
  await assert.rejects(decode('gzip', gzip!, body.length - 1));
  await assert.rejects(decode('gzip', gzip!, body.length + 1));
  await assert.rejects(decode('br', gzip!, body.length));
});

test('every entry has one object shape: the same keys in one order, whatever variants it has and wherever it was made', async () => {
  // Objects built from computed keys and spreads got a hidden class each: two heap objects more
  // per cached entry for every full GC to mark (issue 22). Same keys in the same order from one
  // literal is what lets V8 share one.
  const body = page(5000);
  const entry = entryOf(body, await encode(body, ON));
  const read = await decodeEntry(encodeEntry(entry));
  const fields = ['status', 'body', 'storedAt', 'modifiedAt', 'undated', 'ttlMs', 'generation', 'etag', 'variants', 'brBytes', 'gzipBytes'];
  const bare = entryOf(page(100), undefined);
  const gzipOnly = entryOf(body, await encode(body, { ...ON, brotli: false }));
  for (const e of [entry, bare, gzipOnly, read!, (await decodeEntry(encodeEntry(bare)))!, withVariants(bare, await encode(body, ON))]) assert.deepEqual(Object.keys(e), fields);
  // Redis holds one variant, gzip where there is one.
  assert.ok(codings(read!).gzip!.equals(codings(entry).gzip!));
  assert.equal(read!.brBytes, 0);
});

test('the two variants share one allocation of their own, holding nothing else', async () => {
  // Every Buffer allocated on its own costs an ArrayBuffer in the heap and a backing-store record
  // outside it; two variants in one allocation save one of each per entry (issue 22). Holding
  // nothing else, the allocation pins no zlib output chunk.
  const body = page(10_000);
  for (const settings of [ON, { ...ON, gzip: false }, { ...ON, brotli: false }]) {
    const made = (await encode(body, settings))!;
    assert.equal(made.bytes.length, made.brBytes + made.gzipBytes);
    assert.equal(made.bytes.buffer.byteLength, made.bytes.length);
    const { br, gzip } = codings(entryOf(body, made));
    assert.ok((br === undefined || brotliDecompressSync(br).equals(body)) && (gzip === undefined || gunzipSync(gzip).equals(body)));
    assert.equal(br !== undefined, settings.brotli);
    assert.equal(gzip !== undefined, settings.gzip);
  }
});
