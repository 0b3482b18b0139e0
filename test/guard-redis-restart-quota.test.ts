import assert from 'node:assert/strict';
import { test, type TestContext } from 'node:test';
import { Redis } from 'ioredis';
import { onCleanup } from './helpers/cleanup.js';
import { startPerch, testConfig, v1, waitFor, type RunningPerch } from './helpers/perch.js';
import { startRedis } from './helpers/redis-server.js';
import { startTcpProxy, type TcpProxy } from './helpers/tcp-proxy.js';
import { sampleProvider, startUpstream, type TestUpstream } from './helpers/upstream-server.js';

// A Redis that restarts empty does not let the first instance back spend the others' quota again
// (issue 56, item 1). Two instances, each through a TCP relay of its own, so the test decides
// which one reconnects first.

const QUOTA_KEY = 'perch:{up:main}:quota';

function instance(t: TestContext, proxy: TcpProxy, upstream: TestUpstream): Promise<RunningPerch> {
  const extra = 'quota: { requests: 10, per_seconds: 120 }, redis_down_share: 0.5, queue_timeout_ms: 0';
  return startPerch(t, testConfig(v1('main', upstream.url, extra), `rate_limits_redis: { url: "${proxy.url}", command_timeout_ms: 500 }`));
}

async function misses(perch: RunningPerch, from: number, count: number): Promise<number[]> {
  const statuses: number[] = [];
  for (let i = 0; i < count; i++) statuses.push((await perch.request(`/v1/users/${from + i}`)).status);
  return statuses;
}

/**
 * Two instances, each through its own relay to one Redis: A spends `spentA` of the quota and B
 * `spentB`, then both are cut off while Redis restarts empty; resolves once it answers again.
 */
async function spentThenRestarted(t: TestContext, spentA: number, spentB: number) {
  const redis = await startRedis(t);
  const upstream = await startUpstream(t, sampleProvider);
  const proxies = { A: await startTcpProxy(t, redis.port), B: await startTcpProxy(t, redis.port) };
  const perches = { A: await instance(t, proxies.A, upstream), B: await instance(t, proxies.B, upstream) };
  const inspector = new Redis(redis.url, { maxRetriesPerRequest: 1, retryStrategy: () => 50 });
  inspector.on('error', () => {});
  onCleanup(t, () => inspector.disconnect());
  assert.deepEqual([...(await misses(perches.A, 1, spentA)), ...(await misses(perches.B, 11, spentB))], Array<number>(spentA + spentB).fill(200));
  proxies.A.cut();
  proxies.B.cut();
  await redis.kill();
  await redis.restart();
  await waitFor(async () => (await inspector.ping().catch(() => '')) === 'PONG', 10_000);
  return { redis, upstream, proxies, perches, inspector };
}

for (const first of ['A', 'B'] as const) {
  test(`quota 10 per 120 s, 5 spent by each, Redis restarted empty, ${first} reconnects first: the provider sees at most 10 in the window`, { timeout: 30_000 }, async (t) => {
    const { upstream, proxies, perches, inspector } = await spentThenRestarted(t, 5, 5);
    const second = first === 'A' ? 'B' : 'A';
    proxies[first].restore();
    await waitFor(async () => (await inspector.zcard(QUOTA_KEY)) === 5, 10_000);
    // The first back asks while the other's calls are still missing from Redis.
    const early = await misses(perches[first], 100, 5);
    proxies[second].restore();
    await waitFor(async () => (await inspector.zcard(QUOTA_KEY)) >= 10, 10_000);
    const late = [...(await misses(perches.A, 200, 3)), ...(await misses(perches.B, 300, 3))];
    t.diagnostic(`${first} first: ${early.filter((s) => s === 200).length} admitted before ${second} was back, ${late.filter((s) => s === 200).length} after; provider calls in the window: ${upstream.requests.length}`);
    assert.ok(upstream.requests.length <= 10, `at most 10 calls in the window, got ${upstream.requests.length}`);
  });
}

test('a process started after Redis restarted empty, the others still cut off, keeps to its share for the window', { timeout: 30_000 }, async (t) => {
  const { redis, upstream, proxies, perches, inspector } = await spentThenRestarted(t, 5, 5);
  // A new process (a replacement, or one more) finds Redis empty and is the first to ask: it
  // cannot tell this from a fleet's first start, and keeps to its share of the quota.
  const started = await instance(t, await startTcpProxy(t, redis.port), upstream);
  const fresh = await misses(started, 100, 8);
  proxies.A.restore();
  proxies.B.restore();
  await waitFor(async () => (await inspector.zcard(QUOTA_KEY)) >= 15, 10_000);
  const late = [...(await misses(perches.A, 200, 2)), ...(await misses(perches.B, 300, 2)), ...(await misses(started, 400, 2))];
  t.diagnostic(`the new process admitted ${fresh.filter((s) => s === 200).length}, ${late.filter((s) => s === 200).length} after the others were back; provider calls in the window: ${upstream.requests.length}`);
  assert.deepEqual(fresh, [...Array<number>(5).fill(200), ...Array<number>(3).fill(429)]);
  assert.equal(upstream.requests.length, 15, 'each of three instances its share: 5 + 5 + 5');
});

test('misses asking together the first instance back after an empty restart are admitted within its share, not beyond', { timeout: 30_000 }, async (t) => {
  // 1 + 5: A may spend 4 more of its share of 5 before B is back.
  const { upstream, proxies, perches, inspector } = await spentThenRestarted(t, 1, 5);
  proxies.A.restore();
  await waitFor(async () => (await inspector.zcard(QUOTA_KEY)) === 1, 10_000);
  const burst = await Promise.all(Array.from({ length: 10 }, (_, i) => perches.A.request(`/v1/users/${100 + i}`).then((r) => r.status)));
  proxies.B.restore();
  await waitFor(async () => (await inspector.zcard(QUOTA_KEY)) >= 10, 10_000);
  t.diagnostic(`A admitted ${burst.filter((s) => s === 200).length} of 10 asking together; provider calls in the window: ${upstream.requests.length}`);
  assert.equal(burst.filter((s) => s === 200).length, 4);
  assert.equal(upstream.requests.length, 10);
});
