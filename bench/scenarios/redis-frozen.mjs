// Redis frozen (SIGSTOP): the Redis tier and the shared rate limits must never turn a frozen Redis
// into errors or slow requests (issue #3: every request succeeds, p99 under 100 ms). perch runs
// with cache.redis (the rate limits share it); the same hit and miss paths are measured with
// Redis healthy (the baseline) and frozen, interleaved run by run. After each frozen run Redis
// is thawed and perch gets its breakers' cool-down to close them again.
import { setTimeout as sleep } from 'node:timers/promises';
import { BENCH_KEY, get, startPerch } from '../lib/perch.mjs';
import { redisAvailable, startRedis } from '../lib/redis.mjs';
import { side } from '../lib/report.mjs';
import { startUpstream } from '../lib/servers.mjs';
import { wrk } from '../lib/wrk.mjs';
import { HIT_PATH, HIT_USER_ID } from './hit.mjs';

/** Longer than perch's breaker cool-down (2 s), so the next healthy run starts with Redis in use. */
const RECOVERY_MS = 3000;
/** Seconds per run: long enough for a p99 over thousands of requests, short enough for the 10-minute budget. */
const MAX_RUN_S = 4;

export async function redisFrozenScenario(ctx) {
  const { options } = ctx;
  if (!redisAvailable()) {
    return { figures: [], notes: ['Redis frozen: skipped, redis-server is not on PATH.'] };
  }
  const notes = [];
  const stops = [];
  let redis;
  try {
    redis = await startRedis(ctx);
    stops.push(redis.proc);
    const upstream = await startUpstream(ctx);
    stops.push(upstream.proc);
    // tweets cached (the hit path); user not cached, so every user request is a miss that would
    // look in Redis, take a lease and store there.
    const perch = await startPerch(ctx, 'perch-frozen', { upstreamUrl: upstream.url, ttl: { tweets: 3600, user: 0 }, redisUrl: redis.url });
    stops.push(perch.proc);
    const missPath = `/v1/users/${HIT_USER_ID}`;
    await get(perch.url, HIT_PATH);
    const hit = await get(perch.url, HIT_PATH);
    if (!String(hit.headers['cache-status']).startsWith('perch; hit')) throw new Error(`not a hit: ${hit.headers['cache-status']}`);

    const run = (path, durationS) =>
      wrk({ url: perch.url, path, headers: { 'x-api-key': BENCH_KEY }, connections: options.connections, durationS, cpu: ctx.pin.clientCpu, serverCpu: ctx.pin.serverCpu, serverPids: [...perch.pids, upstream.proc.pid, redis.proc.pid] });
    const results = { healthy: { hit: [], miss: [] }, frozen: { hit: [], miss: [] } };
    let failed = 0;
    for (let r = 0; r < options.runs; r++) {
      for (const state of ['healthy', 'frozen']) {
        if (state === 'frozen') redis.proc.child.kill('SIGSTOP');
        for (const [kind, path] of [['hit', HIT_PATH], ['miss', missPath]]) {
          const result = await run(path, Math.min(options.durationS, MAX_RUN_S));
          results[state][kind].push(result);
          if (state === 'frozen') failed += result.errorStatuses + result.socketErrors;
          ctx.log(`  redis ${state} ${kind} run ${r + 1}: ${result.rps.toFixed(0)} req/s, p50 ${result.p50.toFixed(3)} ms, p99 ${result.p99.toFixed(3)} ms, ${result.errorStatuses} status >= 400, ${result.socketErrors} socket errors, generator CPU ${result.generatorCpu.toFixed(2)}, server CPU ${result.serverCpu.toFixed(2)}`);
        }
        if (state === 'frozen') {
          redis.proc.child.kill('SIGCONT');
          await sleep(RECOVERY_MS);
        }
      }
    }
    notes.push(
      `Redis frozen: ${options.connections} connections, hit path (${HIT_PATH}, cached) and miss path (${missPath}, ttl 0); perch has cache.redis and its rate limits share it; ${failed} non-2xx or failed requests in all frozen runs.`,
    );
    const p99 = (state, kind) => results[state][kind].map((r) => r.p99);
    const within100 = { text: '<= 100 ms', pass: (v) => v <= 100 };
    // A latency bound under a fault, not a throughput: the generator rule only. Failed requests
    // while frozen are this scenario's own figure, so the frozen side is not also made INVALID by them.
    const sides = (kind) => [{ ...side('frozen', results.frozen[kind]), failed: 0 }, side('healthy', results.healthy[kind])];
    const p99Figure = (kind) => ({
      id: `frozen.${kind}.p99`,
      label: `${kind} p99, Redis frozen (ms)`,
      runs: p99('frozen', kind),
      baseline: { label: 'Redis healthy', runs: p99('healthy', kind) },
      target: within100,
      decimals: 2,
      sides: sides(kind),
      rule: 'latency',
    });
    return {
      figures: [
        p99Figure('hit'),
        p99Figure('miss'),
        {
          id: 'frozen.failed',
          label: 'failed requests, Redis frozen',
          runs: [failed],
          target: { text: '0', pass: (v) => v === 0 },
          decimals: 0,
        },
      ],
      notes,
    };
  } finally {
    redis?.proc.child.kill('SIGCONT');
    for (const proc of stops.reverse()) await proc.stop();
  }
}
