import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import { test, type TestContext } from 'node:test';
import { Redis } from 'ioredis';
import { onCleanup } from './helpers/cleanup.js';
import { startPerch, testConfig, v1, waitFor, type RunningPerch } from './helpers/perch.js';
import { startRedis } from './helpers/redis-server.js';
import { startTcpProxy, type TcpProxy } from './helpers/tcp-proxy.js';
import { tempDir } from './helpers/temp-dir.js';
import { sampleProvider, startUpstream } from './helpers/upstream-server.js';

// A Redis that restarted empty, and instances that come back to it at different times: the one
// back first may not take the whole rate while another still counts its calls on its own.
// Two instances, each through a TCP relay of its own, so the test decides when each is back.

const GENERATION_KEY = 'perch:{up:main}:generation';
const RATE = 4;

function instance(t: TestContext, proxy: TcpProxy, url: string): Promise<RunningPerch> {
  const extra = `max_requests_per_second: ${RATE}, redis_down_share: 0.5, queue_timeout_ms: 1500`;
  return startPerch(t, testConfig(v1('main', url, extra), `rate_limits_redis: { url: "${proxy.url}", command_timeout_ms: 500 }`));
}

/** The most arrivals in any window of `windowMs` that starts at or after `from` and ends by `to`. */
function busiest(arrivals: readonly number[], windowMs: number, from: number, to: number): number {
  let most = 0;
  for (const start of arrivals) {
    if (start < from || start + windowMs > to) continue;
    most = Math.max(most, arrivals.filter((at) => at >= start && at < start + windowMs).length);
  }
  return most;
}

test(`rate ${RATE}/s, share 0.5, Redis restarted empty, B back 3 s after A: no second has more than ${RATE} calls`, { timeout: 60_000 }, async (t) => {
  const redis = await startRedis(t);
  const arrivals: number[] = [];
  const upstream = await startUpstream(t, (req, res) => {
    arrivals.push(performance.now());
    sampleProvider(req, res);
  });
  const proxies = { A: await startTcpProxy(t, redis.port), B: await startTcpProxy(t, redis.port) };
  const perches = { A: await instance(t, proxies.A, upstream.url), B: await instance(t, proxies.B, upstream.url) };
  const inspector = new Redis(redis.url, { maxRetriesPerRequest: 1, retryStrategy: () => 50 });
  inspector.on('error', () => {});
  onCleanup(t, () => inspector.disconnect());

  // Misses at the cap on both instances, all along.
  let running = true;
  let next = 0;
  const load = (perch: RunningPerch) => (async () => {
    while (running) await perch.request(`/v1/users/${++next}`);
  })();
  const loops = [...Array<number>(3)].flatMap(() => [load(perches.A), load(perches.B)]);
  onCleanup(t, async () => {
    running = false;
    await Promise.allSettled(loops);
  });
  await waitFor(() => arrivals.length >= 2 * RATE, 10_000);

  proxies.A.cut();
  proxies.B.cut();
  await redis.kill();
  await redis.restart();
  await waitFor(async () => (await inspector.ping().catch(() => '')) === 'PONG', 10_000);
  proxies.A.restore();
  // A is back and has asked Redis for the upstream: the generation is its own.
  await waitFor(async () => (await inspector.exists(GENERATION_KEY)) === 1, 10_000);
  const back = performance.now();
  await sleep(3000);
  const bBack = performance.now();
  proxies.B.restore();
  await sleep(1500);
  running = false;
  await Promise.allSettled(loops);

  // From a second after A is back, none of A's calls from before the restart is in the window.
  const most = busiest(arrivals, 1000, back + 1000, bBack);
  const perSecond = (from: number) => arrivals.filter((at) => at >= from && at < from + 1000).length;
  t.diagnostic(`calls per second from A's return: ${[0, 1, 2].map((s) => perSecond(back + s * 1000)).join(', ')}; busiest 1 s window while B was away: ${most}`);
  assert.ok(most <= RATE, `at most ${RATE} calls in any second while B was still cut off, got ${most}`);
});

test(`rate ${RATE}/s, share 0.5, Redis restarted from a snapshot, B back 3 s after A: no second has more than ${RATE} calls`, { timeout: 60_000 }, async (t) => {
  // A Redis that persists (RDB here; AOF or a promoted replica alike) comes back with the
  // generation and with counts as old as its snapshot: the calls since are missing all the same.
  const redis = await startRedis(t, ['--save', '3600 1', '--dir', tempDir(t, 'perch-rdb-'), '--dbfilename', 'dump.rdb']);
  const arrivals: number[] = [];
  const upstream = await startUpstream(t, (req, res) => {
    arrivals.push(performance.now());
    sampleProvider(req, res);
  });
  const proxies = { A: await startTcpProxy(t, redis.port), B: await startTcpProxy(t, redis.port) };
  const perches = { A: await instance(t, proxies.A, upstream.url), B: await instance(t, proxies.B, upstream.url) };
  const inspector = new Redis(redis.url, { maxRetriesPerRequest: 1, retryStrategy: () => 50 });
  inspector.on('error', () => {});
  onCleanup(t, () => inspector.disconnect());
  let running = true;
  let next = 0;
  const load = (perch: RunningPerch) => (async () => {
    while (running) await perch.request(`/v1/users/${++next}`);
  })();
  const loops = [...Array<number>(3)].flatMap(() => [load(perches.A), load(perches.B)]);
  onCleanup(t, async () => {
    running = false;
    await Promise.allSettled(loops);
  });
  await waitFor(() => arrivals.length >= 2 * RATE, 10_000);
  await inspector.save();
  await sleep(1500);
  proxies.A.cut();
  proxies.B.cut();
  await redis.kill();
  await redis.restart();
  await waitFor(async () => (await inspector.exists(GENERATION_KEY).catch(() => 0)) === 1, 10_000);
  proxies.A.restore();
  const back = performance.now();
  await sleep(3000);
  const bBack = performance.now();
  proxies.B.restore();
  await sleep(1500);
  running = false;
  await Promise.allSettled(loops);
  const perSecond = (from: number) => arrivals.filter((at) => at >= from && at < from + 1000).length;
  const most = busiest(arrivals, 1000, back, bBack);
  t.diagnostic(`calls per second from A's return: ${[0, 1, 2].map((s) => perSecond(back + s * 1000)).join(', ')}; busiest 1 s window while B was away: ${most}`);
  assert.ok(most <= RATE, `at most ${RATE} calls in any second while B was still cut off, got ${most}`);
});
