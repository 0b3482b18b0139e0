// Miss path: perch with caching off for the tweets endpoint (ttl_seconds 0), so every request is
// forwarded, vs calling the upstream directly. Added latency = perch - direct, per pair of
// interleaved runs, median over the pairs.
//
// Connections default to 1 (BENCH_MISS_CONNECTIONS): with one request in flight a latency is the
// cost of one exchange, with no queueing. At 64 connections against a single core the latency is
// mostly queueing (64 / throughput), so "added latency" would measure throughput, not the hop.
import { BENCH_KEY, get, startPerch } from '../lib/perch.mjs';
import { cannon } from '../lib/load.mjs';
import { startUpstream } from '../lib/servers.mjs';
import { median } from '../lib/stats.mjs';
import { HIT_PATH } from './hit.mjs';

export async function missScenario(ctx) {
  const { options } = ctx;
  const notes = [];
  const stops = [];
  try {
    const upstream = await startUpstream(ctx);
    stops.push(upstream.proc);
    const perch = await startPerch(ctx, 'perch-miss', { upstreamUrl: upstream.url, ttl: { tweets: 0 } });
    stops.push(perch.proc);
    for (let i = 0; i < 2; i++) {
      const res = await get(perch.url, HIT_PATH);
      if (res.status !== 200) throw new Error(`perch answered ${res.status} on the miss path`);
      if (res.headers['cache-status'] !== 'perch; fwd=miss') throw new Error(`expected an unstored miss, got cache-status ${res.headers['cache-status']}`);
    }
    const targets = [
      { name: 'direct', url: upstream.url, pids: [upstream.proc.pid] },
      { name: 'perch', url: perch.url, pids: [perch.proc.pid, upstream.proc.pid] },
    ];
    const run = (t, durationS) =>
      cannon({ url: t.url, path: HIT_PATH, headers: { 'x-api-key': BENCH_KEY }, connections: options.missConnections, durationS, serverPids: t.pids });
    for (const t of targets) await run(t, options.warmupS);
    const results = { direct: [], perch: [] };
    for (let r = 0; r < options.runs; r++) {
      for (const t of targets) {
        const result = await run(t, options.durationS);
        if (result.non2xx > 0 || result.errors > 0) notes.push(`miss ${t.name} run ${r + 1}: ${result.non2xx} non-2xx, ${result.errors} errors`);
        results[t.name].push(result);
        ctx.log(`  miss ${t.name} run ${r + 1}: ${result.rps.toFixed(0)} req/s, p50 ${result.p50.toFixed(3)} ms, p99 ${result.p99.toFixed(3)} ms`);
      }
    }
    const series = (name, field) => results[name].map((r) => r[field]);
    const added = (field) => results.perch.map((r, i) => r[field] - results.direct[i][field]);
    notes.push(
      `Miss path at ${options.missConnections} connection(s): perch ${median(series('perch', 'rps')).toFixed(0)} req/s, direct ${median(series('direct', 'rps')).toFixed(0)} req/s (server-side processes share CPU ${ctx.pin.serverCpu ?? '-'}).`,
    );
    return {
      figures: [
        { id: 'miss.p50', label: `miss latency p50, ${options.missConnections} conn (ms)`, runs: series('perch', 'p50'), baseline: { label: 'direct', runs: series('direct', 'p50') }, decimals: 3 },
        { id: 'miss.p99', label: `miss latency p99, ${options.missConnections} conn (ms)`, runs: series('perch', 'p99'), baseline: { label: 'direct', runs: series('direct', 'p99') }, decimals: 3 },
        {
          id: 'miss.added.p50',
          label: 'miss path added latency p50 (ms)',
          runs: added('p50'),
          baseline: { label: 'direct p50', runs: series('direct', 'p50') },
          target: { text: '<= 0.3 ms', pass: (v) => v <= 0.3 },
          decimals: 3,
        },
        { id: 'miss.added.p99', label: 'miss path added latency p99 (ms)', runs: added('p99'), baseline: { label: 'direct p99', runs: series('direct', 'p99') }, decimals: 3 },
      ],
      notes,
    };
  } finally {
    for (const proc of stops.reverse()) await proc.stop();
  }
}
