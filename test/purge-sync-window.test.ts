// The windows in which an instance may not have heard of a purge: from its start, and from each
// loss of its subscription, until it has read the counters again. Redis may still hold what such
// a purge dropped, so nothing is read there meanwhile. The instance under test is built from
// perch's own cache modules on a real Redis, its subscription through a relay the test holds or
// cuts, its commands straight to Redis; a whole perch on the same Redis fills it and purges.
import assert from 'node:assert/strict';
import { test, type TestContext } from 'node:test';
import { newEntry } from '../src/cache/entry.js';
import { Generations } from '../src/cache/generations.js';
import { MemoryStore } from '../src/cache/memory-store.js';
import { PurgeSync } from '../src/cache/purge-sync.js';
import { RedisStore } from '../src/cache/redis-store.js';
import { TieredCache } from '../src/cache/tiered-cache.js';
import { GuardedRedis } from '../src/redis/guarded-redis.js';
import { createRedisClient } from '../src/redis/redis-client.js';
import { ADMIN_YAML, outcome, purge } from './helpers/admin.js';
import { onCleanup } from './helpers/cleanup.js';
import { ManualClock } from './helpers/clock.js';
import { captureLogs } from './helpers/log-capture.js';
import { startPerch, testConfig, v1, waitFor, type RunningPerch } from './helpers/perch.js';
import { startRedis, type TestRedis } from './helpers/redis-server.js';
import { startTcpProxy, type TcpProxy } from './helpers/tcp-proxy.js';
import { sampleProvider, startUpstream } from './helpers/upstream-server.js';

const PATH = '/v1/users/1';
const LATER = '/v1/users/2';
const TWIN = '/v1/users/by/username/seven';

interface Bench {
  readonly redis: TestRedis;
  readonly relay: TcpProxy;
  /** A whole perch on the same Redis. */
  readonly filler: RunningPerch;
  readonly clock: ManualClock;
}

async function bench(t: TestContext): Promise<Bench> {
  const clock = new ManualClock();
  const redis = await startRedis(t);
  const relay = await startTcpProxy(t, redis.port);
  const upstream = await startUpstream(t, sampleProvider);
  const filler = await startPerch(t, testConfig(v1('main', upstream.url), `${ADMIN_YAML}\ncache: { stale_seconds: 0, redis: { url: "${redis.url}", prefix: "t:" } }`), { clock });
  await waitFor(() => filler.cache.redisConnected === true);
  return { redis, relay, filler, clock };
}

/** The instance under test: commands straight to Redis, its purge subscription through the relay. */
async function instance(t: TestContext, { redis, relay, clock }: Bench): Promise<TieredCache> {
  const settings = { url: redis.url, prefix: 't:', command_timeout_ms: 1000 };
  const { logger } = captureLogs();
  const client = createRedisClient(settings, 'test-cache');
  const subscriber = createRedisClient({ ...settings, url: relay.url }, 'test-purge');
  const guard = new GuardedRedis(client, { clock, logger, name: 'redis cache' });
  const memory = new MemoryStore({ maxBytes: 1 << 20, clock });
  const generations = new Generations(memory);
  const purges = new PurgeSync({ guard, subscriber, prefix: 't:', generations, logger });
  const cache = new TieredCache({ memory, redis: { guard, store: new RedisStore(client, 't:'), purges }, generations, clock, staleMs: 0 });
  onCleanup(t, () => {
    cache.close();
    client.disconnect();
  });
  await waitFor(() => guard.connected);
  return cache;
}

test('an instance that has not read the purge counters yet judges what it reads in Redis by the counters read after it: a purged entry is a miss, a later one a hit', { timeout: 20_000 }, async (t) => {
  const b = await bench(t);
  assert.equal(await outcome(b.filler, PATH), 'miss');
  assert.equal((await purge(b.filler, { all: true })).status, 200);
  assert.equal(await outcome(b.filler, LATER), 'miss');
  // The entry stored before the purge is still in Redis, stamped with the epoch the purge ended;
  // to a view that heard of no purge, it looks current.
  b.relay.hold();
  const starting = await instance(t, b);
  assert.equal(await starting.remote(PATH), undefined, 'purged');
  assert.equal((await starting.remote(LATER))?.entry.generation.all, 1);
  assert.equal(await starting.started(50), false, 'no resync while the subscription hears nothing');
  b.relay.release();
  assert.equal(await starting.started(5000), true);
  assert.equal(await starting.remote(PATH), undefined);
});

test('an instance whose subscription is lost honours a purge made meanwhile on its next Redis read, and serves Redis entries all along', { timeout: 20_000 }, async (t) => {
  const b = await bench(t);
  const cache = await instance(t, b);
  assert.equal(await cache.started(5000), true);
  assert.equal(await outcome(b.filler, PATH), 'miss');
  b.relay.cut();
  await waitFor(() => !cache.current);
  assert.notEqual(await cache.remote(PATH), undefined, 'a blip with no purge in it costs no miss');
  assert.equal((await purge(b.filler, { all: true })).status, 200);
  // No message reached it, and no resync ran: the counters read with the entry say it is purged.
  assert.equal(await cache.remote(PATH), undefined);
  assert.equal(cache.generations.all, 1);
  b.relay.restore();
  await waitFor(() => cache.current, 10_000);
  assert.equal(await cache.remote(PATH), undefined);
});

test('perch listens at once on a Redis that refuses connections or does not answer, and after the start wait on one whose counters it cannot read', { timeout: 20_000 }, async (t) => {
  const redis = await startRedis(t);
  const relay = await startTcpProxy(t, redis.port);
  const upstream = await startUpstream(t, sampleProvider);
  const yaml = (url: string) => testConfig(v1('main', upstream.url), `cache: { redis: { url: "${url}", prefix: "t:" } }`);
  const listening = async (url: string) => {
    const started = performance.now();
    const perch = await startPerch(t, yaml(url));
    return { perch, ms: performance.now() - started };
  };
  relay.cut();
  const refused = await listening(relay.url);
  assert.ok(refused.ms < 1000, `refused: listening after ${Math.round(refused.ms)} ms`);
  assert.equal((await refused.perch.request(PATH)).status, 200);
  relay.restore();
  // Its ready check is not answered within command_timeout_ms: the first connection failed.
  relay.hold();
  const silent = await listening(relay.url);
  assert.ok(silent.ms < 1000, `silent: listening after ${Math.round(silent.ms)} ms`);
  relay.release();
  // Something else under the counters' key: every resync fails, and the start waits its bound.
  const other = createRedisClient({ url: redis.url, prefix: 't:', command_timeout_ms: 1000 }, 'test');
  onCleanup(t, () => other.disconnect());
  await new Promise((resolve) => other.once('ready', resolve));
  await other.set('t:gen', 'not a hash');
  const unreadable = await listening(redis.url);
  assert.ok(unreadable.ms >= 2000 && unreadable.ms < 3000, `unreadable: listening after ${Math.round(unreadable.ms)} ms`);
  assert.equal(unreadable.perch.logs.lines().filter((l) => l.msg === 'listening before the cache purge counters synced: until they are, each Redis read reads them too and nothing is written to Redis').length, 1);
  assert.equal((await unreadable.perch.request(PATH)).status, 200);
});

test("while unsynced, a user's twin route lands in memory as it does without Redis, where nothing is written meanwhile", { timeout: 20_000 }, async (t) => {
  const b = await bench(t);
  b.relay.hold();
  const cache = await instance(t, b);
  const body = Buffer.from(JSON.stringify({ id: '7', username: 'seven' }));
  const entry = (key: string) => newEntry({ status: 200, body, storedAt: b.clock.now(), ttlMs: 60_000, generation: cache.generations.restamp(cache.generations.stamp(key), key)! });
  const { accepted, settled } = cache.store([{ key: PATH, entry: entry(PATH) }, { key: TWIN, entry: entry(TWIN), onlyIfEmpty: true }], b.filler.config.cache.compression);
  assert.deepEqual(accepted, [true, true]);
  await settled;
  assert.notEqual(cache.local(PATH), undefined);
  assert.notEqual(cache.local(TWIN), undefined, 'the twin: in neither tier, its next request would be a provider call');
  assert.equal(await b.filler.cache.remote(PATH), undefined, 'nothing written to Redis');
});
