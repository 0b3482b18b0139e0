import assert from 'node:assert/strict';
import { test } from 'node:test';
import { brotliDecompressSync, gunzipSync } from 'node:zlib';
import { decode, encode } from '../src/cache/compression.js';

const ON = { brotli: true, gzip: true, min_bytes: 1024 };
const page = (bytes: number) => Buffer.from(JSON.stringify({ data: Array.from({ length: Math.ceil(bytes / 20) }, (_, i) => ({ id: String(i), text: `tweet ${i}` })) }).slice(0, bytes));

test('variants of a small body (made on the loop) and of a large one (on the thread pool) inflate to the body', async () => {
  for (const size of [1024, 10_000, 65_536, 200_000]) {
    const body = page(size);
    const { br, gzip } = await encode(body, ON);
    assert.ok(br !== undefined && gzip !== undefined, `${size}: both variants`);
    assert.ok(brotliDecompressSync(br).equals(body), `${size}: br`);
    assert.ok(gunzipSync(gzip).equals(body), `${size}: gzip`);
    assert.ok((await decode('gzip', gzip, body.length)).equals(body));
    assert.ok((await decode('br', br, body.length)).equals(body));
  }
});

test('below min_bytes, with a coding off, or when a variant would not be smaller, it is not kept', async () => {
  assert.deepEqual(await encode(page(1023), ON), {});
  assert.deepEqual(Object.keys(await encode(page(5000), { ...ON, brotli: false })), ['gzip']);
  assert.deepEqual(Object.keys(await encode(page(5000), { ...ON, gzip: false })), ['br']);
  const random = Buffer.from(Array.from({ length: 4096 }, (_, i) => (i * 2654435761) % 251));
  const noise = Buffer.from(random.map((b, i) => (b ^ (i * 97)) & 0xff));
  const { gzip } = await encode(noise, ON);
  assert.ok(gzip === undefined || gzip.length < noise.length);
});

test('decode refuses a payload that inflates to another length than stored', async () => {
  const body = page(10_000);
  const { gzip } = await encode(body, ON);
  await assert.rejects(decode('gzip', gzip!, body.length - 1));
  await assert.rejects(decode('gzip', gzip!, body.length + 1));
  await assert.rejects(decode('br', gzip!, body.length));
});
