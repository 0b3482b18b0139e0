import assert from 'node:assert/strict';
import { test, type TestContext } from 'node:test';
import { modification, newEntry, type CacheEntry } from '../src/cache/entry.js';
import { MemoryStore } from '../src/cache/memory-store.js';
import { RedisStore } from '../src/cache/redis-store.js';
import type { CacheStore } from '../src/cache/store.js';
import { createRedisClient } from '../src/redis/redis-client.js';
import { ManualClock } from './helpers/clock.js';
import { waitFor } from './helpers/perch.js';
import { startRedis } from './helpers/redis-server.js';
import { onCleanup } from './helpers/cleanup.js';

interface OpenStore {
  readonly store: CacheStore;
  /** Lets `key`'s retention of `ms` run out: the memory tier's clock moves; Redis expires on its own. */
  expire(key: string, ms: number): Promise<void>;
}

/** Both tiers must behave the same: the request path does not care which one answered. */
const TIERS: Record<string, (t: TestContext) => Promise<OpenStore>> = {
  memory: async () => {
    const clock = new ManualClock();
    const store = new MemoryStore({ maxBytes: 16 * 1024 * 1024, clock });
    const expire = async (key: string, ms: number) => {
      // Retention ends once more than `ms` has passed.
      clock.advance(ms + 1);
      // lru-cache reuses one clock reading for up to a millisecond (its ttlResolution).
      await waitFor(() => store.get(key) === undefined, 1000);
    };
    return { store, expire };
  },
  redis: async (t) => {
    const redis = await startRedis(t);
    const client = createRedisClient({ url: redis.url, prefix: 'contract:', command_timeout_ms: 1000 }, 'contract-test');
    onCleanup(t, () => client.disconnect());
    await new Promise((resolve) => client.once('ready', resolve));
    const expire = (key: string) => waitFor(async () => (await client.exists(`contract:c:${key}`)) === 0);
    return { store: new RedisStore(client, 'contract:'), expire };
  },
};

function entry(body: Buffer | string, status: 200 | 404 = 200, ttlMs = 60_000): CacheEntry {
  return newEntry({ status, body: typeof body === 'string' ? Buffer.from(body) : body, storedAt: 1_767_225_600_123, ttlMs, generation: { all: 2, scope: 7 } });
}

for (const [tier, open] of Object.entries(TIERS)) {
  test(`${tier}: get of an absent key is undefined; set then get returns the entry`, async (t) => {
    const { store } = await open(t);
    assert.equal(await store.get('/v1/users/1'), undefined);
    await store.set('/v1/users/1', entry('{"id":"1"}'), 60_000);
    assert.deepEqual(await store.get('/v1/users/1'), entry('{"id":"1"}'));
  });

  test(`${tier}: entries keep status, storedAt and ttl`, async (t) => {
    const { store } = await open(t);
    const notFound = newEntry({
      status: 404,
      body: Buffer.from('{}'),
      storedAt: 1_767_225_601_999,
      ttlMs: 604_800_000,
      generation: { all: 4_294_967_295, scope: 0 },
    });
    await store.set('/v1/tweets/7', notFound, 604_800_000);
    const got = await store.get('/v1/tweets/7');
    assert.equal(got?.status, 404);
    assert.equal(got?.storedAt, 1_767_225_601_999);
    assert.equal(got?.ttlMs, 604_800_000);
    assert.deepEqual(got?.generation, { all: 4_294_967_295, scope: 0 });
  });

  test(`${tier}: a set replaces the earlier entry; delete removes it`, async (t) => {
    const { store } = await open(t);
    await store.set('k', entry('first'), 60_000);
    await store.set('k', entry('second', 404, 5_000), 60_000);
    assert.deepEqual(await store.get('k'), entry('second', 404, 5_000));
    await store.delete('k');
    assert.equal(await store.get('k'), undefined);
    await store.delete('never-set');
  });

  test(`${tier}: bodies are binary-safe (non-BMP text, invalid UTF-8, NUL, empty)`, async (t) => {
    const { store } = await open(t);
    const bodies = [
      Buffer.from('{"text":"🦜 𝕡𝕖𝕣𝕔𝕙 \\u0000 é"}'),
      Buffer.from([0xff, 0xfe, 0x00, 0xc3, 0x28, 0xed, 0xa0, 0x80, 0x7b]),
      Buffer.alloc(0),
      Buffer.alloc(200_000, 0xab),
    ];
    for (const [i, body] of bodies.entries()) await store.set(`bin:${i}`, entry(body), 60_000);
    for (const [i, body] of bodies.entries()) assert.ok((await store.get(`bin:${i}`))?.body.equals(body), `body ${i}`);
  });

  test(`${tier}: an entry is gone after its retention`, async (t) => {
    const { store, expire } = await open(t);
    await store.set('short', entry('x'), 40);
    await store.set('long', entry('y'), 60_000);
    assert.ok((await store.get('short')) !== undefined);
    await expire('short', 40);
    assert.equal(await store.get('short'), undefined);
    assert.ok((await store.get('long')) !== undefined);
  });
}

test('redis: values use the documented key, a 38-byte header and the tag before the raw body', async (t) => {
  const redis = await startRedis(t);
  const client = createRedisClient({ url: redis.url, prefix: 'p:', command_timeout_ms: 1000 }, 'contract-test');
  onCleanup(t, () => client.disconnect());
  await new Promise((resolve) => client.once('ready', resolve));
  await new RedisStore(client, 'p:').set('/v1/users/1', entry('{"id":"1"}'), 60_000);
  const raw = await client.getBuffer('p:c:/v1/users/1');
  const tag = entry('{"id":"1"}').etag;
  assert.equal(raw?.length, 38 + tag.length + 10);
  // Format version 5: the tag, a coding, and when the bytes became the answer; identity (0) for an entry without variants.
  assert.equal(raw?.readUInt8(0), 5);
  assert.equal(raw?.readUInt8(1), 0);
  assert.equal(raw?.readUInt32BE(24), 10);
  assert.equal(raw?.readDoubleBE(29), entry('{"id":"1"}').modifiedAt);
  assert.equal(raw?.readUInt8(37), 0);
  assert.equal(raw?.toString('latin1', 38, 38 + raw.readUInt8(28)), tag);
  assert.equal(raw?.subarray(38 + tag.length).toString(), '{"id":"1"}');
  const pttl = await client.pttl('p:c:/v1/users/1');
  assert.ok(pttl > 59_000 && pttl <= 60_000, `PX retention, got ${pttl}`);
});

test('entries date their bytes: the same bytes keep modifiedAt, new ones date from now once past the second of the date they follow, else stay undated', () => {
  const old = newEntry({ status: 200, body: Buffer.from('{"v":1}'), storedAt: 10_200, modifiedAt: 5_100, ttlMs: 1000, generation: { all: 0, scope: 0 } });
  assert.deepEqual(modification(old.etag, 20_300, old), { etag: old.etag, modifiedAt: 5_100, undated: false });
  const other = newEntry({ status: 200, body: Buffer.from('{"v":2}'), storedAt: 20_300, ttlMs: 1000, generation: { all: 0, scope: 0 } });
  assert.deepEqual(modification(other.etag, 20_300, old), { etag: other.etag, modifiedAt: 20_300, undated: false });
  // Within the second of the date sent with {"v":1}: no date would be exact until the next one.
  const waiting = modification(other.etag, 5_900, old);
  assert.deepEqual(waiting, { etag: other.etag, modifiedAt: 6_000, undated: true });
  assert.deepEqual(modification(other.etag, 5_950, waiting), { etag: other.etag, modifiedAt: 6_000, undated: true });
  assert.deepEqual(modification(other.etag, 6_000, waiting), { etag: other.etag, modifiedAt: 6_000, undated: false });
  assert.deepEqual(modification(old.etag, 5_990, waiting), { etag: old.etag, modifiedAt: 6_000, undated: true }, 'the old bytes back: never their old date');
  assert.deepEqual(modification(other.etag, 5_900, undefined), { etag: other.etag, modifiedAt: 5_900, undated: false });
});

test('redis: the fleet dates bytes as it takes them, against the value they replace; a write only where empty leaves a current holder', async (t) => {
  const redis = await startRedis(t);
  const client = createRedisClient({ url: redis.url, prefix: 'p:', command_timeout_ms: 1000 }, 'contract-test');
  onCleanup(t, () => client.disconnect());
  await new Promise((resolve) => client.once('ready', resolve));
  const store = new RedisStore(client, 'p:');
  const T = 1_767_225_600_000;
  const at = (body: string, storedAt: number, all = 0) => newEntry({ status: 200, body: Buffer.from(body), storedAt, modifiedAt: storedAt, undated: true, ttlMs: 10_000, generation: { all, scope: 0 } });
  // `changed`: whether the bytes differ from the value replaced (none replaced: changed).
  assert.deepEqual(await store.put('/k', at('X', T + 100), 60_000, false), { kind: 'set', modifiedAt: T + 100, undated: false, changed: true });
  assert.deepEqual(await store.put('/k', at('X', T + 5_000), 60_000, false), { kind: 'set', modifiedAt: T + 100, undated: false, changed: false }, 'same bytes keep their date');
  assert.deepEqual(await store.put('/k', at('Y', T + 7_300), 60_000, false), { kind: 'set', modifiedAt: T + 7_300, undated: false, changed: true });
  // X again, written by an instance that once dated X at T: dated now, past Y's date.
  assert.deepEqual(await store.put('/k', at('X', T + 9_000), 60_000, false), { kind: 'set', modifiedAt: T + 9_000, undated: false, changed: true });
  assert.deepEqual(await store.put('/k', at('Z', T + 9_500), 60_000, false), { kind: 'set', modifiedAt: T + 10_000, undated: true, changed: true }, 'same second as X: undated');
  const read = await store.get('/k');
  assert.deepEqual([read?.body.toString(), read?.modifiedAt, read?.undated], ['Z', T + 10_000, true]);
  assert.deepEqual(await store.put('/k', at('Z', T + 10_200), 60_000, false), { kind: 'set', modifiedAt: T + 10_200, undated: false, changed: false });
  // Only where empty: a current entry stays, its tag told; an older generation or an expired one is empty.
  assert.deepEqual(await store.put('/k', at('W', T + 10_300), 60_000, true), { kind: 'held', etag: at('Z', 0).etag });
  assert.deepEqual(await store.put('/k', at('W', T + 11_400, 1), 60_000, true), { kind: 'set', modifiedAt: T + 11_400, undated: false, changed: true });
  assert.deepEqual(await store.put('/k', at('V', T + 30_000, 1), 60_000, true), { kind: 'set', modifiedAt: T + 30_000, undated: false, changed: true });
  assert.deepEqual(await store.put('/e', at('V', T + 30_000), 60_000, true), { kind: 'set', modifiedAt: T + 30_000, undated: false, changed: true });
});

test('redis: modifiedAt and undated travel; format-4 and format-3 values are read undated, new bytes dated past them', async (t) => {
  const redis = await startRedis(t);
  const client = createRedisClient({ url: redis.url, prefix: 'p:', command_timeout_ms: 1000 }, 'contract-test');
  onCleanup(t, () => client.disconnect());
  await new Promise((resolve) => client.once('ready', resolve));
  const store = new RedisStore(client, 'p:');
  const dated = newEntry({ status: 200, body: Buffer.from('{"id":"1"}'), storedAt: 1_767_225_600_123, modifiedAt: 1_767_225_500_456, undated: true, ttlMs: 60_000, generation: { all: 2, scope: 7 } });
  await store.set('/v1/users/1', dated, 60_000);
  const back = await store.get('/v1/users/1');
  assert.deepEqual([back?.modifiedAt, back?.undated, back?.storedAt], [1_767_225_500_456, true, 1_767_225_600_123]);
  const v5 = (await client.getBuffer('p:c:/v1/users/1'))!;
  const tagLength = v5.readUInt8(28);
  // The same value as format 3: the first 29 bytes, then the tag and the payload.
  const v3 = Buffer.concat([v5.subarray(0, 29), v5.subarray(38)]);
  v3.writeUInt8(3, 0);
  await client.set('p:c:/v1/users/2', v3, 'PX', 60_000);
  const old = await store.get('/v1/users/2');
  assert.deepEqual([old?.body.toString(), old?.etag, old?.modifiedAt, old?.undated], ['{"id":"1"}', dated.etag, 1_767_225_601_000, true]);
  assert.equal(tagLength, dated.etag.length);
  // Format 4, as an older instance dated it from its own memory: no date from it is trusted.
  const v4 = Buffer.from(v5);
  v4.writeUInt8(4, 0);
  v4.writeUInt8(0, 37);
  await client.set('p:c:/v1/users/3', v4, 'PX', 60_000);
  const older = await store.get('/v1/users/3');
  assert.deepEqual([older?.modifiedAt, older?.undated], [1_767_225_501_000, true]);
  const next = newEntry({ status: 200, body: Buffer.from('{"id":"3"}'), storedAt: 1_767_225_500_900, ttlMs: 60_000, generation: { all: 2, scope: 7 } });
  assert.deepEqual(await store.put('/v1/users/3', next, 60_000, false), { kind: 'set', modifiedAt: 1_767_225_501_000, undated: true, changed: true });
});
