import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { test, type TestContext } from 'node:test';
import { gunzipSync, gzipSync } from 'node:zlib';
import { request } from 'undici';
import { createRedisClient } from '../src/redis/redis-client.js';
import { KEY, startPerch, testConfig, v1, waitFor, type RunningPerch } from './helpers/perch.js';
import { startRedis, type TestRedis } from './helpers/redis-server.js';
import { sampleTweetsPage } from './helpers/sample-bodies.js';
import { json, startUpstream, type TestUpstream } from './helpers/upstream-server.js';
import { onCleanup } from './helpers/cleanup.js';

const T = { timeout: 30_000 };
const PAGE = '/v1/users/1/tweets';
const REDIS_KEY = `t:c:${PAGE}`;

/** A tweets page of about 10 KB, as the bytes issue measures. */
function bigPage() {
  const page = sampleTweetsPage();
  const first = page.data.entries[0]!;
  page.data.entries = Array.from({ length: 24 }, (_, i) => ({ legacy: { ...first.legacy, id_str: String(1790000000000000000n + BigInt(i) * 7919n) } }));
  return page;
}

async function setup(t: TestContext): Promise<{ redis: TestRedis; upstream: TestUpstream; start: () => Promise<RunningPerch> }> {
  const redis = await startRedis(t);
  const upstream = await startUpstream(t, json(200, bigPage()));
  const start = async () => {
    const perch = await startPerch(t, testConfig(v1('main', upstream.url), `cache: { redis: { url: "${redis.url}", prefix: "t:" } }`));
    await waitFor(() => perch.cache.redisConnected === true);
    return perch;
  };
  return { redis, upstream, start };
}

async function client(t: TestContext, redis: TestRedis) {
  const c = createRedisClient({ url: redis.url, prefix: 't:', command_timeout_ms: 1000 }, 'test');
  onCleanup(t, () => c.disconnect());
  await new Promise((resolve) => c.once('ready', resolve));
  return c;
}

async function get(perch: RunningPerch, headers: Record<string, string> = {}) {
  const res = await request(perch.url + PAGE, { headers: { 'x-api-key': KEY, ...headers } });
  const body = Buffer.from(await res.body.arrayBuffer());
  await perch.cache.settled();
  return { status: res.statusCode, headers: res.headers as Record<string, string | undefined>, body };
}

test('Redis holds the gzip variant with the tag; another instance serves it without compressing and inflates it once for identity', T, async (t) => {
  const { redis, upstream, start } = await setup(t);
  const a = await start();
  const identity = (await get(a)).body;
  const gzipFromA = await get(a, { 'accept-encoding': 'gzip' });
  const c = await client(t, redis);
  const value = (await c.getBuffer(REDIS_KEY))!;
  assert.equal(value.readUInt8(0), 5, 'format 5');
  assert.equal(value.readUInt8(1), 1, 'the payload is gzip');
  assert.equal(value.readUInt32BE(24), identity.length);
  const tag = value.toString('latin1', 38, 38 + value.readUInt8(28));
  assert.equal(tag, `"${createHash('sha256').update(identity).digest('base64url').slice(0, 22)}"`);
  const payload = value.subarray(38 + tag.length);
  assert.ok(payload.equals(gzipFromA.body), 'the very bytes instance A sends gzip clients');
  assert.ok(gunzipSync(payload).equals(identity));
  // Before compression the value was a 24-byte header and the identity body.
  const ratio = value.length / (24 + identity.length);
  assert.ok(ratio <= 0.4, `Redis holds ${value.length} bytes for a ${identity.length}-byte page: ${ratio.toFixed(3)}x the identity format`);

  const b = await start();
  const br = await get(b, { 'accept-encoding': 'br, gzip' });
  assert.match(br.headers['cache-status'] ?? '', /^perch; hit; ttl=\d+; detail=redis$/);
  assert.equal(br.headers['content-encoding'], 'gzip', 'B has the gzip variant from Redis, and made no brotli');
  assert.ok(br.body.equals(gzipFromA.body));
  assert.equal(br.headers['etag'], gzipFromA.headers['etag']);
  const plain = await get(b);
  assert.ok(plain.body.equals(identity));
  assert.equal(plain.headers['etag'], tag, 'the same tag on every instance and tier');
  assert.equal((await get(b, { 'if-none-match': tag })).status, 304);
  assert.equal(upstream.requests.length, 1);
});

test('rolling upgrade: an entry an older instance wrote (format 2) is served; unknown formats and corrupt payloads are misses, never garbage', T, async (t) => {
  const { redis, upstream, start } = await setup(t);
  const c = await client(t, redis);
  const old = Buffer.from(JSON.stringify(bigPage()).replace('"b"', '"from-an-older-instance"'));
  const header = Buffer.alloc(24);
  header.writeUInt8(2, 0);
  header.writeUInt16BE(200, 2);
  header.writeDoubleBE(Date.now(), 4);
  header.writeUInt32BE(300_000, 12);
  await c.set(REDIS_KEY, Buffer.concat([header, old]), 'PX', 300_000);
  const perch = await start();
  const served = await get(perch, { 'accept-encoding': 'gzip' });
  assert.match(served.headers['cache-status'] ?? '', /^perch; hit; ttl=\d+; detail=redis$/);
  assert.ok(served.body.equals(old), 'identity: format 2 carries no variant, and a hit makes none');
  assert.equal(served.headers['etag'], `"${createHash('sha256').update(old).digest('base64url').slice(0, 22)}"`);
  assert.equal(upstream.requests.length, 0);

  // A format-3 value whose gzip payload is corrupt, one that inflates to another length, a
  // format-1 value and a format from the future: each is a miss that the upstream answers.
  const good = (await c.getBuffer(REDIS_KEY))!;
  const fresh = Buffer.from(JSON.stringify(bigPage()));
  const v3 = (coding: number, length: number, payload: Buffer) => {
    const head = Buffer.alloc(29);
    head.writeUInt8(3, 0);
    head.writeUInt8(coding, 1);
    head.writeUInt16BE(200, 2);
    head.writeDoubleBE(Date.now(), 4);
    head.writeUInt32BE(300_000, 12);
    head.writeUInt32BE(length, 24);
    head.writeUInt8(4, 28);
    return Buffer.concat([head, Buffer.from('"ab"'), payload]);
  };
  const gz = gzipSync(fresh);
  const bad = [
    v3(1, fresh.length, Buffer.concat([gz.subarray(0, 40), Buffer.alloc(40, 7)])),
    v3(1, fresh.length - 1, gz),
    v3(1, fresh.length + 1, gz),
    v3(2, fresh.length, gz),
    v3(9, fresh.length, fresh),
    Buffer.concat([Buffer.from([1, 0, 0, 200]), fresh]),
    Buffer.concat([Buffer.from([4]), good.subarray(1)]),
  ];
  for (const [i, value] of bad.entries()) {
    const path = `/v1/users/${10 + i}/tweets`;
    await c.set(`t:c:${path}`, value, 'PX', 300_000);
    const res = await request(perch.url + path, { headers: { 'x-api-key': KEY } });
    const body = Buffer.from(await res.body.arrayBuffer());
    assert.equal(res.headers['cache-status'], 'perch; fwd=miss; stored', `case ${i}`);
    assert.ok(body.equals(fresh), `case ${i}: the upstream's page`);
  }
  assert.equal(upstream.requests.length, bad.length);
});

test('an instance with compression off that serves another instance\'s gzip entry varies on Accept-Encoding; its identity answers too', T, async (t) => {
  const { redis, upstream, start } = await setup(t);
  const a = await start();
  await get(a);
  const off = await startPerch(
    t,
    testConfig(v1('main', upstream.url), `cache: { redis: { url: "${redis.url}", prefix: "t:" }, compression: { brotli: false, gzip: false } }`),
  );
  await waitFor(() => off.cache.redisConnected === true);
  const gz = await get(off, { 'accept-encoding': 'gzip' });
  assert.deepEqual([gz.headers['content-encoding'], gz.headers['vary']], ['gzip', 'X-API-Key, Accept-Encoding']);
  const plain = await get(off);
  assert.deepEqual([plain.headers['content-encoding'], plain.headers['vary']], [undefined, 'X-API-Key, Accept-Encoding']);
  assert.equal(upstream.requests.length, 1, 'both served from the entry the first instance stored');
});
