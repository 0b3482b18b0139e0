// Load generation from this (pinned) process. Two tools, each where it fits:
// - autocannon for fixed-duration throughput/latency runs (hit and miss paths). autocannon's own
//   latency histogram has 1 ms resolution, too coarse for a 0.3 ms target, so latencies are taken
//   from its per-response event (hrtime, fractional ms) and percentiles computed exactly here.
// - a small loop of N concurrent workers over an undici Pool for fixed request lists (upstream
//   economy, cache fill). Those figures depend on every listed request being issued exactly once,
//   in a known order, and answered 200; a loop makes that explicit and checkable, whereas
//   autocannon's `amount` is split per connection and a shared `setupRequest` counter would hide
//   lost or repeated requests. Throughput is not what these scenarios measure.
import autocannon from 'autocannon';
import { Pool } from 'undici';
import { cpuSecondsOf } from './procs.mjs';
import { percentile, Samples } from './stats.mjs';

/**
 * One autocannon run of `durationS` seconds. Returns req/s (2xx only), exact p50/p99 latency in
 * ms, non-2xx and error counts, and the CPU share used by this process (the load generator) and
 * by `serverPids` over the run, to tell a server-bound run from a load-generator-bound one.
 */
export async function cannon({ url, path, headers = {}, connections, durationS, serverPids = [] }) {
  const samples = new Samples();
  const cpu0 = process.cpuUsage();
  const server0 = serverPids.map(cpuSecondsOf);
  const t0 = performance.now();
  const instance = autocannon({ url: url + path, headers, connections, pipelining: 1, duration: durationS, timeout: 10 });
  instance.on('response', (_client, statusCode, _bytes, responseTime) => {
    if (statusCode >= 200 && statusCode < 300) samples.push(responseTime);
  });
  const result = await instance;
  const elapsedS = (performance.now() - t0) / 1000;
  const cpu = process.cpuUsage(cpu0);
  const serverCpu = serverPids.map((pid, i) => cpuSecondsOf(pid) - server0[i]).reduce((a, b) => a + b, 0);
  const sorted = samples.sorted();
  return {
    rps: result['2xx'] / result.duration,
    p50: percentile(sorted, 50),
    p99: percentile(sorted, 99),
    ok: result['2xx'],
    non2xx: result.non2xx,
    errors: result.errors + result.timeouts,
    loadgenCpu: (cpu.user + cpu.system) / 1e6 / elapsedS,
    serverCpu: serverCpu / elapsedS,
  };
}

/**
 * Issues `count` GETs, request i to `targets[i % targets.length]` + `pathOf(i)`, with
 * `concurrency` workers each taking the next index when its previous request is done. Bounded
 * by `deadlineMs`. Returns counts by status and the first error.
 */
export async function issueAll({ targets, count, pathOf, headers = {}, concurrency, deadlineMs }) {
  const pools = targets.map((url) => new Pool(url, { connections: concurrency, pipelining: 1, headersTimeout: 10_000, bodyTimeout: 10_000 }));
  const statuses = new Map();
  let next = 0;
  let errors = 0;
  let firstError;
  const deadline = Date.now() + deadlineMs;
  const t0 = performance.now();
  async function worker() {
    for (;;) {
      const i = next++;
      if (i >= count || Date.now() > deadline) return;
      const pool = pools[i % pools.length];
      try {
        const res = await pool.request({ path: pathOf(i), method: 'GET', headers });
        await res.body.dump({ limit: 1 << 20 });
        statuses.set(res.statusCode, (statuses.get(res.statusCode) ?? 0) + 1);
      } catch (error) {
        errors++;
        firstError ??= error;
      }
    }
  }
  try {
    await Promise.all(Array.from({ length: concurrency }, worker));
  } finally {
    await Promise.all(pools.map((pool) => pool.close()));
  }
  const issued = Math.min(next, count);
  return {
    issued,
    completed: issued === count,
    ok: statuses.get(200) ?? 0,
    statuses: Object.fromEntries(statuses),
    errors,
    firstError: firstError === undefined ? undefined : String(firstError?.message ?? firstError),
    seconds: (performance.now() - t0) / 1000,
  };
}
