import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import { test, type TestContext } from 'node:test';
import { Redis } from 'ioredis';
import { onCleanup } from './helpers/cleanup.js';
import { startPerch, testConfig, v1, waitFor, type RunningPerch } from './helpers/perch.js';
import { startRedis, type TestRedis } from './helpers/redis-server.js';
import { startTcpProxy, type TcpProxy } from './helpers/tcp-proxy.js';
import { tempDir } from './helpers/temp-dir.js';
import { sampleProvider, startUpstream } from './helpers/upstream-server.js';

// A Redis that restarted, and instances that come back to it at different times: the one
// back first may not take the whole rate while another still counts its calls on its own.
// Two instances, each through a TCP relay of its own, so the test decides when each is back.

const GENERATION_KEY = 'perch:{up:main}:generation';
const RATE = 4;

function instance(t: TestContext, proxy: TcpProxy, url: string): Promise<RunningPerch> {
  const extra = `max_requests_per_second: ${RATE}, redis_down_share: 0.5, queue_timeout_ms: 1500`;
  return startPerch(t, testConfig(v1('main', url, extra), `rate_limits_redis: { url: "${proxy.url}", command_timeout_ms: 500 }`));
}

interface LoadedFleet {
  redis: TestRedis;
  /** When each call reached the provider (performance.now()). */
  arrivals: number[];
  proxies: { A: TcpProxy; B: TcpProxy };
  /** A client of Redis's own, past the relays. */
  inspector: Redis;
  /** Ends the load and waits for the calls under way. */
  stop(): Promise<void>;
}

/**
 * Instances A and B on one Redis, each through its own relay, with misses at the cap on both all
 * along (three loops each); resolves once the provider has seen two seconds' worth of calls.
 */
async function loadedFleet(t: TestContext, redisArgs: string[] = []): Promise<LoadedFleet> {
  const redis = await startRedis(t, redisArgs);
  const arrivals: number[] = [];
  const upstream = await startUpstream(t, (req, res) => {
    arrivals.push(performance.now());
    sampleProvider(req, res);
  });
  const proxies = { A: await startTcpProxy(t, redis.port), B: await startTcpProxy(t, redis.port) };
  const perches = [await instance(t, proxies.A, upstream.url), await instance(t, proxies.B, upstream.url)];
  const inspector = new Redis(redis.url, { maxRetriesPerRequest: 1, retryStrategy: () => 50 });
  inspector.on('error', () => {});
  onCleanup(t, () => inspector.disconnect());

  let running = true;
  let next = 0;
  const load = async (perch: RunningPerch) => {
    while (running) await perch.request(`/v1/users/${++next}`);
  };
  const loops = [0, 1, 2].flatMap(() => perches.map(load));
  const stop = async () => {
    running = false;
    await Promise.allSettled(loops);
  };
  onCleanup(t, stop);
  await waitFor(() => arrivals.length >= 2 * RATE, 10_000);
  return { redis, arrivals, proxies, inspector, stop };
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

/** Asserts that no second from `from` to B's return had more than the rate's calls. */
function assertRateHeld(t: TestContext, arrivals: readonly number[], back: number, from: number, bBack: number): void {
  const most = busiest(arrivals, 1000, from, bBack);
  const perSecond = (start: number) => arrivals.filter((at) => at >= start && at < start + 1000).length;
  t.diagnostic(`calls per second from A's return: ${[0, 1, 2].map((s) => perSecond(back + s * 1000)).join(', ')}; busiest 1 s window while B was away: ${most}`);
  assert.ok(most <= RATE, `at most ${RATE} calls in any second while B was still cut off, got ${most}`);
}

test(`rate ${RATE}/s, share 0.5, Redis restarted empty, B back 3 s after A: no second before B is back has more than ${RATE} calls`, { timeout: 60_000 }, async (t) => {
  const { redis, arrivals, proxies, inspector, stop } = await loadedFleet(t);

  proxies.A.cut();
  proxies.B.cut();
  await redis.kill();
  await redis.restart();
  await waitFor(async () => (await inspector.ping().catch(() => '')) === 'PONG', 10_000);
  proxies.A.restore();
  // A is back and has asked Redis for the upstream: the generation is its own.
  await waitFor(async () => (await inspector.exists(GENERATION_KEY)) === 1, 10_000);
  const back = performance.now();
  // Real time, not a state: B stays away for 3 s of the breakers' and Redis's own TIME.
  await sleep(3000);
  const bBack = performance.now();
  proxies.B.restore();
  await stop();

  // From a second after A is back, none of A's calls from before the restart is in the window.
  assertRateHeld(t, arrivals, back, back + 1000, bBack);
});

test(`rate ${RATE}/s, share 0.5, Redis restarted from a snapshot, B back 3 s after A: no second before B is back has more than ${RATE} calls`, { timeout: 60_000 }, async (t) => {
  // A Redis that persists (RDB here; AOF or a promoted replica alike) comes back with the
  // generation and with counts as old as its snapshot: the calls since are missing all the same.
  const dir = tempDir(t, 'perch-rdb-');
  const { redis, arrivals, proxies, inspector, stop } = await loadedFleet(t, ['--save', '3600 1', '--dir', dir, '--dbfilename', 'dump.rdb']);
  await inspector.save();
  // Until the snapshot lacks a whole rate window: at the cap, RATE + 1 calls span over a second.
  const saved = arrivals.length;
  await waitFor(() => arrivals.length >= saved + RATE + 1, 10_000);
  proxies.A.cut();
  proxies.B.cut();
  await redis.kill();
  await redis.restart();
  await waitFor(async () => (await inspector.exists(GENERATION_KEY).catch(() => 0)) === 1, 10_000);
  proxies.A.restore();
  const back = performance.now();
  // Real time, not a state: B stays away for 3 s of the breakers' and Redis's own TIME.
  await sleep(3000);
  const bBack = performance.now();
  proxies.B.restore();
  await stop();

  assertRateHeld(t, arrivals, back, back, bBack);
});
