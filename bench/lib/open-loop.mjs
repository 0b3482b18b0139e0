// Open-loop, fixed-rate load for tail latency without coordinated omission. wrk (wrk.mjs) is
// closed-loop: each connection sends its next request only after the previous answer, so a
// server that stalls 50 ms holds back 64 requests, not the 50 ms worth of traffic that real
// clients would have sent meanwhile. wrk 4 makes up for it after the run (stats_correct, before
// done() sees the histogram) with synthetic samples spaced at each connection's mean interval,
// which only means something at a steady saturated rate; it cannot say what a client sees at a
// chosen rate the server carries. Here request i is due at a fixed time and its latency counts
// from then, measured, not inferred (open-loop-child.mjs does the work).
//
// The generator runs in its own process pinned to the client CPU, and measures its CPU share
// and the server's over its own window (from /proc, as wrk.mjs does for servers), so its figures
// go through report.mjs's INVALID rule like wrk's, which for these runs also checks that the
// rate asked for was the rate achieved (RATE_TOLERANCE).
import { fileURLToPath } from 'node:url';
import { start, waitForLine } from './procs.mjs';

const CHILD = fileURLToPath(new URL('./open-loop-child.mjs', import.meta.url));

/**
 * GETs `url + path` with `headers` at `rate` per second over `connections` keep-alive
 * connections: `warmupS` seconds at the rate unmeasured (the generator's own JIT, the server's
 * steady state), then `durationS` measured; answers to measured requests are awaited for up to
 * `drainS` more seconds. The generator is pinned to `cpu`; `serverPids` (on `serverCpu`) are the
 * server whose CPU share is measured. Resolves with latencies in ms from each request's due time
 * (p50, p99, p999, max over the measured requests), the lateness of the generator's own sends
 * (lagP50, lagP99, lagMax), rps (answers below 400 completed in the window, per second),
 * sentRate, requestedRate, errorStatuses, socketErrors (unanswered requests included), the
 * longest queue of requests waiting for a connection, and CPU shares as wrk() gives them.
 */
export async function openLoop({ url, path, headers = {}, rate, durationS, warmupS = 0.5, drainS = 5, connections = 64, cpu = null, serverCpu = null, serverPids = [] }) {
  const { hostname, port } = new URL(url);
  const head = [`GET ${path} HTTP/1.1`, `Host: ${hostname}:${port}`, ...Object.entries(headers).map(([k, v]) => `${k}: ${v}`), '', ''].join('\r\n');
  const config = { host: hostname, port: Number(port), head, rate, warmupS, durationS, drainS, connections, serverPids, cpu, serverCpu };
  const proc = start('open-loop', process.execPath, [CHILD, JSON.stringify(config)], { cpu });
  try {
    const [, json] = await waitForLine(proc, /^RESULT (.*)$/, (warmupS + durationS + drainS + 15) * 1000);
    const { code } = await proc.exited;
    if (code !== 0) throw new Error(`the open-loop generator exited with ${code}: ${proc.stderr().trim()}`);
    return JSON.parse(json);
  } finally {
    await proc.stop();
  }
}

