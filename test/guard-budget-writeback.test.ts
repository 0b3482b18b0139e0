import assert from 'node:assert/strict';
import { test, type TestContext } from 'node:test';
import { Redis } from 'ioredis';
import { onCleanup } from './helpers/cleanup.js';
import { KEY, metric, OTHER_KEY, startPerch, testConfig, v1, waitFor, type RunningPerch } from './helpers/perch.js';
import { startRedis } from './helpers/redis-server.js';
import { startTcpProxy } from './helpers/tcp-proxy.js';
import { sampleProvider, startUpstream, type TestUpstream } from './helpers/upstream-server.js';

// A key's provider_calls budget across a Redis outage (issue 56, item 4): the memory side goes on
// from what Redis last said the key had spent, and what it charged goes back to Redis, so the key
// is charged at most its limit in all.

const LIMIT = 5;

/**
 * A config whose key alpha has a provider_calls budget of `limit` a day (and key bravo one of
 * `otherLimit`, if given); `upstreamExtra` goes into the upstream's settings.
 */
function meteredYaml(upstream: TestUpstream, redisUrl: string, options: { limit?: number; otherLimit?: number; upstreamExtra?: string } = {}): string {
  const { limit = LIMIT, otherLimit, upstreamExtra = '' } = options;
  const budget = (n: number) => `{ capacity: 100000, refill_per_second: 100000, provider_calls: { limit: ${n}, window: day } }`;
  let plans = `  metered: ${budget(limit)}\n`;
  let yaml = testConfig(v1('main', upstream.url, upstreamExtra), `rate_limits_redis: { url: "${redisUrl}", command_timeout_ms: 300 }`).replace(
    `{ id: alpha, key: "${KEY}", plan: big }`,
    `{ id: alpha, key: "${KEY}", plan: metered }`,
  );
  if (otherLimit !== undefined) {
    yaml = yaml.replace(`{ id: bravo, key: "${OTHER_KEY}", plan: big }`, `{ id: bravo, key: "${OTHER_KEY}", plan: roomy }`);
    plans += `  roomy: ${budget(otherLimit)}\n`;
  }
  return yaml.replace('rate_limits:\n', `rate_limits:\n${plans}`);
}

function instance(t: TestContext, redisUrl: string, upstream: TestUpstream): Promise<RunningPerch> {
  return startPerch(t, meteredYaml(upstream, redisUrl));
}

/** A client of Redis's own, closed at the test's end; `resilient` for one that outlives a restart. */
function inspector(t: TestContext, redisUrl: string, resilient = false): Redis {
  const client = resilient ? new Redis(redisUrl, { maxRetriesPerRequest: 1, retryStrategy: () => 50 }) : new Redis(redisUrl);
  if (resilient) client.on('error', () => {});
  onCleanup(t, () => client.disconnect());
  return client;
}

async function misses(perch: RunningPerch, from: number, count: number): Promise<number[]> {
  const statuses: number[] = [];
  for (let i = 0; i < count; i++) statuses.push((await perch.request(`/v1/users/${from + i}`)).status);
  return statuses;
}

const ok = (statuses: readonly number[]) => statuses.filter((s) => s === 200).length;

/** Instances A and B started by `start`, each on one Redis through a relay of its own. */
async function relayedPair(t: TestContext, start: typeof instance) {
  const redis = await startRedis(t);
  const upstream = await startUpstream(t, sampleProvider);
  const proxyA = await startTcpProxy(t, redis.port);
  const proxyB = await startTcpProxy(t, redis.port);
  const a = await start(t, proxyA.url, upstream);
  const b = await start(t, proxyB.url, upstream);
  return { redis, upstream, proxyA, proxyB, a, b };
}

test('Redis frozen after 3 of 5 spent: the instance allows 2 more, not a fresh 5', { timeout: 30_000 }, async (t) => {
  const redis = await startRedis(t);
  const upstream = await startUpstream(t, sampleProvider);
  const perch = await instance(t, redis.url, upstream);
  assert.deepEqual(await misses(perch, 1, 3), [200, 200, 200]);
  redis.freeze();
  onCleanup(t, () => redis.thaw());
  const during = await misses(perch, 100, 6);
  t.diagnostic(`calls charged while frozen: ${ok(during)}; provider calls in all: ${upstream.requests.length}`);
  assert.equal(ok(during), 2);
  assert.equal(upstream.requests.length, LIMIT);
});

test('one instance cut off from Redis after 3 of 5 spent: its spends go back, the other is refused', { timeout: 30_000 }, async (t) => {
  const { redis, upstream, proxyA, a, b } = await relayedPair(t, instance);
  const client = inspector(t, redis.url);
  // A's last charge through Redis read the key's count at 3 (what B charged after it, A could not know).
  assert.deepEqual(await misses(a, 1, 3), [200, 200, 200]);
  const [budgetKey] = await client.keys('*budget*');
  assert.equal(await client.get(budgetKey!), '3');
  proxyA.cut();
  const cutOff = await misses(a, 100, 6);
  assert.equal(ok(cutOff), 2, 'A goes on from the 3 Redis counted');
  proxyA.restore();
  await waitFor(async () => (await client.get(budgetKey!)) === String(LIMIT), 10_000);
  const after = await misses(b, 200, 4);
  t.diagnostic(`A while cut off: ${ok(cutOff)}; B after: ${ok(after)}; provider calls in all: ${upstream.requests.length}`);
  assert.equal(ok(after), 0);
  assert.equal(upstream.requests.length, LIMIT);
});

test('Redis frozen long enough for its breaker to open: the spends charged meanwhile go back once any call reaches Redis again', { timeout: 30_000 }, async (t) => {
  const redis = await startRedis(t);
  const upstream = await startUpstream(t, sampleProvider);
  // Both keys metered: B's misses open A's breaker while Redis is frozen, and close it after.
  const yaml = meteredYaml(upstream, redis.url, { otherLimit: 1000 });
  const a = await startPerch(t, yaml);
  const b = await startPerch(t, yaml);
  const client = inspector(t, redis.url);
  onCleanup(t, () => redis.thaw());
  assert.deepEqual(await misses(a, 1, 3), [200, 200, 200]);
  const alphaKey = (await client.keys('*budget*'))[0]!;
  redis.freeze();
  // Bravo's charges time out: A's breaker opens, and alpha's are charged in memory without a word to Redis.
  for (let i = 0; i < 6; i++) await a.request(`/v1/users/${50 + i}`, { key: OTHER_KEY });
  assert.equal(ok(await misses(a, 100, 4)), 2);
  redis.thaw();
  // Bravo's next miss on A reaches Redis again; alpha's charges must follow it there.
  let next = 1000;
  await waitFor(async () => {
    await a.request(`/v1/users/${next++}`, { key: OTHER_KEY });
    return a.logs.text().includes('Redis answers again');
  }, 10_000);
  await waitFor(async () => (await client.get(alphaKey)) === String(LIMIT), 5000);
  const after = await misses(b, 200, 4);
  t.diagnostic(`alpha's count in Redis: ${await client.get(alphaKey)}; B after: ${ok(after)}; alpha's provider calls: ${3 + 2 + ok(after)}`);
  assert.equal(ok(after), 0);
});

// The same budget across a fleet: while Redis is away each instance charges a key only within its
// `redis_down_share` of the limit, its own charges through Redis counted, so an attacker sending
// the key's misses to every instance gets no fresh limit from each.

function sharedInstance(t: TestContext, redisUrl: string, upstream: TestUpstream): Promise<RunningPerch> {
  return startPerch(t, meteredYaml(upstream, redisUrl, { upstreamExtra: 'redis_down_share: 0.5' }));
}

test('two instances, share 0.5, Redis frozen after A charged 3 of 5: A charges no more, B its 2, 5 in all', { timeout: 60_000 }, async (t) => {
  const redis = await startRedis(t);
  const upstream = await startUpstream(t, sampleProvider);
  const a = await sharedInstance(t, redis.url, upstream);
  const b = await sharedInstance(t, redis.url, upstream);
  const client = inspector(t, redis.url);
  onCleanup(t, () => redis.thaw());
  assert.deepEqual(await misses(a, 1, 3), [200, 200, 200]);
  const [budgetKey] = await client.keys('*budget*');
  redis.freeze();
  const duringA = await misses(a, 100, 4);
  const duringB = await misses(b, 200, 4);
  t.diagnostic(`while frozen: A ${ok(duringA)}, B ${ok(duringB)}; provider calls in all: ${upstream.requests.length}`);
  // A's own 3 are over its share (floor(0.5 x 5) = 2); B had charged none.
  assert.equal(ok(duringA), 0);
  assert.equal(ok(duringB), 2);
  redis.thaw();
  // B's 2 go back; asks that timed out while frozen may run on the thaw too, counting more.
  await waitFor(async () => Number(await client.get(budgetKey!)) >= LIMIT, 10_000);
  assert.equal(ok([...(await misses(a, 300, 2)), ...(await misses(b, 400, 2))]), 0);
  assert.equal(upstream.requests.length, LIMIT);
});

test('Redis restarted empty after A charged 4 of 5: A back first restores the count, B is charged 1 more', { timeout: 60_000 }, async (t) => {
  const { redis, upstream, proxyA, proxyB, a, b } = await relayedPair(t, sharedInstance);
  const client = inspector(t, redis.url, true);
  assert.deepEqual(await misses(a, 1, 4), [200, 200, 200, 200]);
  const [budgetKey] = await client.keys('*budget*');
  proxyA.cut();
  proxyB.cut();
  await redis.kill();
  await redis.restart();
  await waitFor(async () => (await client.ping().catch(() => '')) === 'PONG', 10_000);
  proxyA.restore();
  // A's connection is ready again: it writes back what it knew the window had spent.
  await waitFor(async () => (await client.get(budgetKey!)) === '4', 10_000);
  // B's connection ready too (else B charges within its share alone, as in any outage).
  const connections = async () => ((await client.client('LIST')) as string).split('\n').filter((line) => line.includes('name=perch-rate-limits')).length;
  const aOnly = await connections();
  proxyB.restore();
  await waitFor(async () => (await connections()) === 2 * aOnly, 10_000);
  const after = await misses(b, 200, 4);
  t.diagnostic(`B after the restart: ${ok(after)}; provider calls in all: ${upstream.requests.length}`);
  assert.equal(ok(after), 1);
  assert.equal(upstream.requests.length, LIMIT);
});

test('share 0.5 of 4, Redis frozen: the 2 refused over the share are no spent budget, the key gets its last 2 once Redis is back', { timeout: 60_000 }, async (t) => {
  const redis = await startRedis(t);
  const upstream = await startUpstream(t, sampleProvider);
  const a = await startPerch(t, meteredYaml(upstream, redis.url, { limit: 4, upstreamExtra: 'redis_down_share: 0.5' }));
  const client = inspector(t, redis.url);
  onCleanup(t, () => redis.thaw());
  redis.freeze();
  const during = await misses(a, 100, 3);
  assert.equal(ok(during), 2, 'its share of 4');
  const over = await a.request('/v1/users/103');
  // The window is not spent: worth asking again once Redis may answer, not at the day's end.
  assert.deepEqual([over.status, over.headers.get('retry-after')], [429, '2']);
  redis.thaw();
  await waitFor(async () => (await client.get((await client.keys('*budget*'))[0] ?? 'none')) === '2', 10_000);
  const remaining = () => metric(a, 'perch_key_provider_budget_remaining{key_id="alpha"}');
  const third = (await a.request('/v1/users/200')).status;
  // What the instance shows as left goes on from Redis's count, not from the refusal over the share.
  const shown = await remaining();
  const after = [third, ...(await misses(a, 201, 2))];
  t.diagnostic(`while frozen: ${ok(during)}; after: ${after.join(',')}; shown left after the third: ${shown}; provider calls: ${upstream.requests.length}`);
  assert.deepEqual(after, [200, 200, 429]);
  assert.equal(shown, 1);
  assert.equal(upstream.requests.length, 4);
});
