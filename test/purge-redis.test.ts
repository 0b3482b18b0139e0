import assert from 'node:assert/strict';
import { test, type TestContext } from 'node:test';
import { createRedisClient, type RedisClient } from '../src/redis/redis-client.js';
import { ADMIN_YAML, outcome, purge } from './helpers/admin.js';
import { ManualClock } from './helpers/clock.js';
import { startPerch, testConfig, v1, waitFor, type RunningPerch } from './helpers/perch.js';
import { startRedis, type TestRedis } from './helpers/redis-server.js';
import { startTcpProxy } from './helpers/tcp-proxy.js';
import { json, sampleProvider, startUpstream, type TestUpstream } from './helpers/upstream-server.js';
import { onCleanup } from './helpers/cleanup.js';

/** Two entries of the scope `tweets:1` (two cursors), then entries of neighbouring scopes. */
const PURGED = ['/v1/users/1/tweets', '/v1/users/1/tweets?cursor=abc'];
const KEPT = ['/v1/users/1', '/v1/users/1/replies', '/v1/users/12/tweets', '/v1/tweets/1'];

interface Shared {
  readonly clock: ManualClock;
  readonly redis: TestRedis;
  readonly upstream: TestUpstream;
  /** A plain client on the same Redis, for what the test checks there. */
  readonly client: RedisClient;
  start(url?: string): Promise<RunningPerch>;
}

async function setup(t: TestContext): Promise<Shared> {
  const clock = new ManualClock();
  const redis = await startRedis(t);
  const upstream = await startUpstream(t, sampleProvider);
  const client = createRedisClient({ url: redis.url, prefix: 't:', command_timeout_ms: 1000 }, 'test');
  client.on('error', () => {});
  onCleanup(t, () => client.disconnect());
  await new Promise((resolve) => client.once('ready', resolve));
  const start = async (url = redis.url) => {
    const yaml = testConfig(v1('main', upstream.url), `${ADMIN_YAML}\ncache: { stale_seconds: 0, redis: { url: "${url}", prefix: "t:" } }`);
    const perch = await startPerch(t, yaml, { clock });
    await waitFor(() => perch.cache.redisConnected === true);
    return perch;
  };
  return { clock, redis, upstream, client, start };
}

/**
 * Waits until `count` connections are subscribed to the purge channel. The test's own client may
 * still be reconnecting after a Redis restart (it has no offline queue), so it is asked only once
 * it is ready.
 */
async function subscribers(client: RedisClient, count: number): Promise<void> {
  await waitFor(async () => {
    if (client.status !== 'ready') return false;
    const [, n] = (await client.call('PUBSUB', 'NUMSUB', 't:purge')) as [string, number];
    return n === count;
  }, 10_000);
}

function applied(perch: RunningPerch, via: string): () => boolean {
  return () => perch.logs.lines().some((l) => l.msg === 'cache purge applied' && l.via === via);
}

/**
 * Fills `a` from upstream and `b` from Redis, so both tiers of both instances hold every path.
 * `a` answers its client before its Redis write lands, so on a loaded machine `b` may find a's
 * flight instead of the entry and wait for it: either way `b` took the body from Redis.
 */
async function fill(a: RunningPerch, b: RunningPerch): Promise<void> {
  for (const path of [...PURGED, ...KEPT]) {
    assert.equal(await outcome(a, path), 'miss', path);
    const fromRedis = await outcome(b, path);
    assert.ok(fromRedis === 'redis' || fromRedis === 'perch; fwd=miss; collapsed; detail=redis', `${path}: ${fromRedis}`);
  }
}

async function assertKept(perches: RunningPerch[]): Promise<void> {
  for (const perch of perches) for (const path of KEPT) assert.equal(await outcome(perch, path), 'memory', path);
}

test('a purge on one instance is a miss on both, in both tiers; other scopes still hit', async (t) => {
  const { upstream, client, start } = await setup(t);
  const [a, b] = [await start(), await start()];
  await subscribers(client, 2);
  await fill(a, b);
  const res = await purge(a, { endpoint: 'tweets', user_id: '1' });
  assert.deepEqual(res.json(), { purged: { endpoint: 'tweets', user_id: '1' } });
  await waitFor(applied(b, 'message'));
  // Each instance misses its own path: its memory copy is gone and Redis's is of an older generation.
  assert.equal(await outcome(a, PURGED[0]!), 'miss');
  assert.equal(await outcome(b, PURGED[1]!), 'miss');
  // What each stored after the purge is current for the other.
  assert.equal(await outcome(a, PURGED[1]!), 'redis');
  assert.equal(await outcome(b, PURGED[0]!), 'redis');
  await assertKept([a, b]);
  assert.equal(upstream.requests.length, PURGED.length + KEPT.length + 2);
});

test('{"all":true} empties both tiers for every instance', async (t) => {
  const { upstream, client, start } = await setup(t);
  const [a, b] = [await start(), await start()];
  await subscribers(client, 2);
  await fill(a, b);
  assert.equal((await purge(b, { all: true })).status, 200);
  await waitFor(applied(a, 'message'));
  const paths = [...PURGED, ...KEPT];
  for (const [i, path] of paths.entries()) assert.equal(await outcome(i % 2 === 0 ? a : b, path), 'miss', path);
  for (const [i, path] of paths.entries()) assert.equal(await outcome(i % 2 === 0 ? b : a, path), 'redis', path);
  assert.equal(upstream.requests.length, paths.length * 2);
});

test('a purge missed while partitioned from Redis is honoured once the instance reconnects', async (t) => {
  const { redis, client, start } = await setup(t);
  const proxy = await startTcpProxy(t, redis.port);
  const [a, b] = [await start(), await start(proxy.url)];
  await subscribers(client, 2);
  await fill(a, b);
  proxy.cut();
  await waitFor(() => b.cache.redisConnected === false);
  await subscribers(client, 1);
  assert.equal((await purge(a, { endpoint: 'tweets', user_id: '1' })).status, 200);
  // Cut off, b cannot know yet: its memory copy is what it serves (documented).
  assert.equal(await outcome(b, PURGED[0]!), 'memory');

  proxy.restore();
  await waitFor(applied(b, 'resync'), 10_000);
  for (const path of PURGED) assert.equal(await outcome(b, path), 'miss', path);
  await assertKept([b]);
});

test('an instance started after a purge does not serve the purged entries Redis still holds', async (t) => {
  const { client, start } = await setup(t);
  const a = await start();
  for (const path of [...PURGED, ...KEPT]) await a.request(path);
  assert.equal((await purge(a, { endpoint: 'tweets', user_id: '1' })).status, 200);
  const c = await start();
  await waitFor(applied(c, 'resync'));
  for (const path of PURGED) assert.equal(await outcome(c, path), 'miss', path);
  for (const path of KEPT) assert.equal(await outcome(c, path), 'redis', path);
  assert.equal(await client.hget('t:gen', 'tweets:1'), '1');
});

test('counters Redis lost (restart without persistence) are restored by the instances, so later purges still count', async (t) => {
  const { redis, client, start } = await setup(t);
  const [a, b] = [await start(), await start()];
  await subscribers(client, 2);
  await purge(a, { endpoint: 'tweets', user_id: '1' });
  await waitFor(applied(b, 'message'));
  await redis.restart();
  // Each instance writes back what it knows when it resubscribes.
  await waitFor(() => a.cache.redisConnected === true && b.cache.redisConnected === true, 10_000);
  await subscribers(client, 2);
  await waitFor(async () => (await client.hget('t:gen', 'tweets:1')) === '1', 5000);
  assert.equal(await client.hget('t:gen', 'tweets:1'), '1');
  // Both resynced: until then an instance writes nothing to Redis.
  await waitFor(() => a.cache.current && b.cache.current);

  await fill(a, b);
  assert.equal((await purge(a, { endpoint: 'tweets', user_id: '1' })).status, 200);
  await waitFor(() => b.logs.lines().filter((l) => l.msg === 'cache purge applied' && l.via === 'message').length === 2);
  assert.equal(await outcome(b, PURGED[0]!), 'miss');
});

test('with Redis down, a purge is 503 E503: this instance drops its own copies, and says the rest did not', async (t) => {
  const { redis, upstream, start } = await setup(t);
  const a = await start();
  for (const path of [...PURGED, ...KEPT]) await a.request(path);
  await redis.kill();
  const res = await purge(a, { endpoint: 'tweets', user_id: '1' });
  assert.equal(res.status, 503);
  assert.deepEqual(res.json(), {
    error: { code: 'E503', message: "Service unavailable: Redis did not record the purge; only this instance's memory was purged, retry" },
  });
  assert.equal(await outcome(a, PURGED[0]!), 'miss');
  await assertKept([a]);
  assert.equal(upstream.requests.length, PURGED.length + KEPT.length + 1);
  assert.ok(!/perch_purges_total\{/.test(await (await fetch(`${a.url}/metrics`)).text()));
});

/** Each instance's start-up resync done, so none of them writes the hash after a test deletes it. */
async function synced(perches: RunningPerch[]): Promise<void> {
  for (const perch of perches) await waitFor(() => perch.logs.lines().some((l) => l.msg === 'cache purge counters synced'));
}

/** `/v1/tweets/9200001` in both instances' memory, each copy a memory hit. */
async function tweetInBoth(a: RunningPerch, b: RunningPerch): Promise<void> {
  assert.equal(await outcome(a, TWEET), 'miss');
  await outcome(b, TWEET);
  for (const perch of [a, b]) assert.equal(await outcome(perch, TWEET), 'memory');
}

/**
 * Whether the next GET of the tweet is a miss on every instance. The upstream then fails, so no
 * instance's refetch refills Redis for the next one: each answer shows what that instance held.
 */
async function missEverywhere(upstream: TestUpstream, perches: RunningPerch[]): Promise<void> {
  upstream.behaviour = json(503, {});
  for (const perch of perches) {
    const res = await perch.request(TWEET);
    assert.deepEqual([res.status, res.headers.get('cache-status')], [502, 'perch; fwd=miss']);
  }
}
/** Two instances on one Redis, both subscribed and with the purge counters synced. */
async function twoSynced(t: TestContext) {
  const shared = await setup(t);
  const [a, b] = [await shared.start(), await shared.start()];
  await subscribers(shared.client, 2);
  await synced([a, b]);
  return { ...shared, a, b };
}

const TWEET = '/v1/tweets/9200001';
const TWEET_SCOPE = { endpoint: 'tweet', tweet_id: '9200001' };

test('after the counters hash is deleted, a purge answered 200 is a miss on the next GET on every instance', async (t) => {
  const { upstream, client, a, b } = await twoSynced(t);
  assert.equal((await purge(a, { all: true })).status, 200);
  await waitFor(applied(b, 'message'));
  await tweetInBoth(a, b);
  await client.del('t:gen');
  const res = await purge(a, TWEET_SCOPE);
  assert.deepEqual([res.status, res.json()], [200, { purged: TWEET_SCOPE }]);
  await waitFor(() => b.logs.lines().some((l) => l.msg === 'cache purge applied' && (l.purged as string[])[0] === 'tweet:9200001'));
  await missEverywhere(upstream, [a, b]);
  // Restored from the view before counting: the `all` purge still holds, and the scope counts on.
  assert.deepEqual(await client.hgetall('t:gen'), { all: '1', 'tweet:9200001': '1' });
});

test('scope counters lost with the hash are restored before the next purge counts, so it is not a count the instances already hold', async (t) => {
  const { upstream, client, a, b } = await twoSynced(t);
  for (let i = 0; i < 2; i++) assert.equal((await purge(a, TWEET_SCOPE)).status, 200);
  await waitFor(() => b.logs.lines().filter((l) => l.msg === 'cache purge applied' && l.via === 'message').length === 2);
  await tweetInBoth(a, b);
  await client.del('t:gen');
  assert.equal((await purge(b, TWEET_SCOPE)).status, 200);
  await waitFor(applied(a, 'message'));
  await missEverywhere(upstream, [a, b]);
  assert.equal(await client.hget('t:gen', 'tweet:9200001'), '3');
});

test('a purge counted in a hash re-created below the instances\' counters is honoured by every instance, which write theirs back', async (t) => {
  const { upstream, client, a, b } = await twoSynced(t);
  assert.equal((await purge(a, { all: true })).status, 200);
  await waitFor(applied(b, 'message'));
  await tweetInBoth(a, b);
  // As an instance that started on an empty Redis writes it: `all` back at 0.
  await client.del('t:gen');
  await client.hset('t:gen', 'all', '0');
  assert.equal((await purge(a, TWEET_SCOPE)).status, 200);
  await waitFor(() => b.logs.lines().some((l) => String(l.msg).startsWith('cache purge counted below')));
  await missEverywhere(upstream, [a, b]);
  await waitFor(async () => (await client.hget('t:gen', 'all')) === '1');
});

test('a reset message makes every instance write its counters back at once, without a reconnection', async (t) => {
  const { client, a, b } = await twoSynced(t);
  assert.equal((await purge(a, TWEET_SCOPE)).status, 200);
  await waitFor(applied(b, 'message'));
  await client.del('t:gen');
  await client.publish('t:purge', 'reset');
  await waitFor(async () => (await client.hget('t:gen', 'tweet:9200001')) === '1');
  assert.deepEqual(await client.hgetall('t:gen'), { all: '0', 'tweet:9200001': '1' });
});

test('an instance started on a Redis that lost the counters learns the purges from the others at once, and serves none of the purged entries Redis holds', async (t) => {
  const { upstream, client, start, a, b } = await twoSynced(t);
  // In Redis before the purge, so of an older generation than the purge's.
  assert.equal(await outcome(a, TWEET), 'miss');
  assert.equal((await purge(a, TWEET_SCOPE)).status, 200);
  await waitFor(applied(b, 'message'));
  await client.del('t:gen');
  const c = await start();
  // c finds no counters, asks for them (`reset`), and a and b announce what they write back.
  await waitFor(applied(c, 'sync'));
  await missEverywhere(upstream, [c]);
  assert.deepEqual(await client.hgetall('t:gen'), { all: '0', 'tweet:9200001': '1' });
});
