import assert from 'node:assert/strict';
import { test, type TestContext } from 'node:test';
import { Redis } from 'ioredis';
import { onCleanup } from './helpers/cleanup.js';
import { startPerch, testConfig, v1, waitFor, type RunningPerch } from './helpers/perch.js';
import { startRedis, type TestRedis } from './helpers/redis-server.js';
import { startTcpProxy, type TcpProxy } from './helpers/tcp-proxy.js';
import { json, sampleProvider, startUpstream, type TestUpstream } from './helpers/upstream-server.js';

// Stops go back to a Redis that returns (issue 56, item 3): a 429 learned while Redis was away,
// or recorded in a Redis that restarted empty, holds for the other instance once both are back,
// whichever instance's connection comes back first. Each instance reaches Redis through a relay
// of its own, so the test decides who reconnects when.

const E429 = { error: { message: 'Rate limit exceeded. Please try again later.', code: 'E429' } };
const STOP_KEYS = 'perch:{up:main}:stop:*';
const QUOTA_KEY = 'perch:{up:main}:quota';

function instance(t: TestContext, proxy: TcpProxy, upstream: TestUpstream): Promise<RunningPerch> {
  // A cap, so that each instance counts its calls and writes them back when its connection is
  // ready: the test sees each instance's return in Redis.
  const extra = 'quota: { requests: 1000, per_seconds: 600 }, queue_timeout_ms: 0';
  return startPerch(t, testConfig(v1('main', upstream.url, extra), `rate_limits_redis: { url: "${proxy.url}", command_timeout_ms: 500 }`));
}

async function fleet(t: TestContext) {
  const redis = await startRedis(t);
  const upstream = await startUpstream(t, sampleProvider);
  const proxyA = await startTcpProxy(t, redis.port);
  const proxyB = await startTcpProxy(t, redis.port);
  const a = await instance(t, proxyA, upstream);
  const b = await instance(t, proxyB, upstream);
  const inspector = new Redis(redis.url, { maxRetriesPerRequest: 1, retryStrategy: () => 50 });
  inspector.on('error', () => {});
  onCleanup(t, () => inspector.disconnect());
  return { redis, upstream, proxyA, proxyB, a, b, inspector };
}

/** A's miss meets a 429 with `Retry-After: 60`. */
async function stopA(upstream: TestUpstream, a: RunningPerch, id: number): Promise<void> {
  upstream.behaviour = json(429, E429, { 'retry-after': '60' });
  const before = upstream.requests.length;
  assert.equal((await a.request(`/v1/users/${id}`)).status, 429);
  assert.equal(upstream.requests.length, before + 1);
  upstream.behaviour = sampleProvider;
}

/** Five misses to B, none of which may reach the provider while A's stop holds. */
async function assertBStopped(upstream: TestUpstream, b: RunningPerch): Promise<void> {
  const before = upstream.requests.length;
  const statuses: number[] = [];
  for (let i = 0; i < 5; i++) statuses.push((await b.request(`/v1/users/${900 + i}`)).status);
  assert.deepEqual(statuses, [429, 429, 429, 429, 429]);
  assert.equal(upstream.requests.length - before, 0, 'B made no call during A\'s stop');
}

for (const first of ['A', 'B'] as const) {
  test(`a 429 learned while Redis was unreachable holds for the other instance once both are back (${first} reconnects first)`, { timeout: 30_000 }, async (t) => {
    const { upstream, proxyA, proxyB, a, b, inspector } = await fleet(t);
    assert.equal((await a.request('/v1/users/1')).status, 200);
    proxyA.cut();
    proxyB.cut();
    // B's own miss while it cannot reach Redis (before the stop: it cannot know of one).
    assert.equal((await b.request('/v1/users/2')).status, 200);
    await stopA(upstream, a, 3);
    assert.deepEqual(await inspector.keys(STOP_KEYS), [], 'the stop never reached Redis while A was cut off');
    const back = (name: 'A' | 'B') => (name === 'A' ? proxyA : proxyB).restore();
    const bUp = () => b.logs.text().includes('Redis answers again');
    if (first === 'A') {
      back('A');
      await waitFor(async () => (await inspector.keys(STOP_KEYS)).length > 0, 10_000);
      back('B');
      await waitFor(bUp, 10_000);
    } else {
      back('B');
      await waitFor(bUp, 10_000);
      back('A');
      await waitFor(async () => (await inspector.keys(STOP_KEYS)).length > 0, 10_000);
    }
    const ttl = await inspector.pttl((await inspector.keys(STOP_KEYS))[0]!);
    assert.ok(ttl > 50_000 && ttl <= 61_000, `the stop goes back with its remaining time, not a fresh one: ${ttl} ms`);
    await assertBStopped(upstream, b);
  });

  test(`a 429 recorded in a Redis that restarted empty holds for the other instance once both are back (${first} reconnects first)`, { timeout: 30_000 }, async (t) => {
    const { redis, upstream, proxyA, proxyB, a, b, inspector } = await fleet(t);
    // B makes two calls, A one (its 429): each instance's write-back is seen by its count.
    assert.equal((await b.request('/v1/users/1')).status, 200);
    assert.equal((await b.request('/v1/users/2')).status, 200);
    await stopA(upstream, a, 3);
    assert.equal((await inspector.keys(STOP_KEYS)).length, 1);
    proxyA.cut();
    proxyB.cut();
    await restartEmpty(redis, inspector);
    assert.deepEqual(await inspector.keys(STOP_KEYS), []);
    if (first === 'A') {
      proxyA.restore();
      await waitFor(async () => (await inspector.keys(STOP_KEYS)).length > 0 && (await inspector.zcard(QUOTA_KEY)) === 1, 10_000);
      proxyB.restore();
      await waitFor(async () => (await inspector.zcard(QUOTA_KEY)) === 3, 10_000);
    } else {
      proxyB.restore();
      await waitFor(async () => (await inspector.zcard(QUOTA_KEY)) === 2, 10_000);
      assert.deepEqual(await inspector.keys(STOP_KEYS), []);
      proxyA.restore();
      await waitFor(async () => (await inspector.keys(STOP_KEYS)).length > 0 && (await inspector.zcard(QUOTA_KEY)) === 3, 10_000);
    }
    await assertBStopped(upstream, b);
  });
}

async function restartEmpty(redis: TestRedis, inspector: Redis): Promise<void> {
  await redis.kill();
  await redis.restart();
  await waitFor(async () => (await inspector.ping().catch(() => '')) === 'PONG', 10_000);
}

test('a 429 learned while Redis was frozen and this instance\'s breaker open holds for the other instance once Redis thaws', { timeout: 30_000 }, async (t) => {
  const { redis, upstream, a, b, inspector } = await fleet(t);
  onCleanup(t, () => redis.thaw());
  assert.equal((await a.request('/v1/users/1')).status, 200);
  redis.freeze();
  // A's admissions time out: its breaker opens, and what A learns next stays in its memory.
  for (let i = 0; i < 6; i++) await a.request(`/v1/users/${10 + i}`);
  await stopA(upstream, a, 3);
  redis.thaw();
  await waitFor(async () => (await inspector.ping().catch(() => '')) === 'PONG', 10_000);
  // A's next miss is refused by its own stop, without asking Redis: the stop goes back then.
  assert.equal((await a.request('/v1/users/4')).status, 429);
  await waitFor(async () => (await inspector.keys(STOP_KEYS)).length > 0, 10_000);
  await assertBStopped(upstream, b);
});
