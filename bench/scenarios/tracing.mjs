// Tracing's cost on the hit path (issue 24): the same cached page as the hit scenario, perch with
// tracing off against perch exporting to an OTLP/HTTP sink at sample_ratio 0.01 and at 1, and a
// second tracing-off process: the A/A control, whose ratio is what the method and the machine
// alone make of two identical servers. Each is measured side by side with a tracing-off process of
// its own on the same core (lib/shared-core.mjs), `connections` connections each: runs one after the
// other, paired or rotated, read the A/A control anywhere from 0.6x to 1.8x per round on this
// machine, side by side 0.98-1.02x. ROUNDS of DURATION_S per pair (more with BENCH_RUNS).
// The sink (a node:http server in this process, answering 200 to every export) stands for a
// collector; it runs outside the pinned server CPU, so its work is not charged to perch.
import { createServer } from 'node:http';
import { get, perchConfig, startPerchYaml } from '../lib/perch.mjs';
import { cpuPerHitRatio, sharedCoreRounds, sideBySideFigure, sideBySideTable } from '../lib/shared-core.mjs';
import { startUpstream } from '../lib/servers.mjs';
import { HIT_PATH } from './hit.mjs';

const ROUNDS = 10;
const DURATION_S = 5;
/** Long enough for each process's code to settle: V8 recompiles most of the hot path once after some 10 s of load (README, Tracing). */
const WARMUP_S = 20;

export async function tracingScenario(ctx) {
  const { options } = ctx;
  const stops = [];
  let exports = 0;
  const sink = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      exports++;
      res.writeHead(200, { 'content-type': 'application/x-protobuf' }).end();
    });
  });
  await new Promise((resolve) => sink.listen(0, '127.0.0.1', resolve));
  const endpoint = `http://127.0.0.1:${sink.address().port}`;
  try {
    const upstream = await startUpstream(ctx);
    stops.push(upstream.proc);
    const start = async (name, tracing) => {
      const perch = await startPerchYaml(ctx, name, (port) => perchConfig({ port, upstreamUrl: upstream.url, ttl: { tweets: 3600 }, metricsYaml: ctx.metricsYaml }) + tracing, { ownSession: true });
      stops.push(perch.proc);
      await get(perch.url, HIT_PATH);
      const hit = await get(perch.url, HIT_PATH);
      if (hit.status !== 200 || !String(hit.headers['cache-status']).startsWith('perch; hit')) throw new Error(`${name}: the second request is not a hit`);
      return { name, url: perch.url, pids: perch.pids };
    };
    // Each target beside a tracing-off process of its own, so every process carries the same load.
    const pairs = [];
    for (const [name, label, tracing] of [
      ['off-control', 'perch, tracing off (A/A control)', ''],
      ['ratio-0.01', 'perch, tracing on, sample_ratio 0.01', `tracing: { endpoint: "${endpoint}", sample_ratio: 0.01 }\n`],
      ['ratio-1', 'perch, tracing on, sample_ratio 1', `tracing: { endpoint: "${endpoint}", sample_ratio: 1 }\n`],
    ]) {
      const baseline = { ...(await start(`perch-trace-off-beside-${name}`, '')), name: `off-beside-${name}`, label: `perch, tracing off, beside ${name}` };
      pairs.push({ baseline, target: { ...(await start(`perch-trace-${name}`, tracing)), name, label } });
    }
    const results = await sharedCoreRounds(ctx, { pairs, path: HIT_PATH, label: 'tracing', rounds: Math.max(ROUNDS, options.runs), durationS: DURATION_S, warmupS: WARMUP_S });
    const figure = (name, label, target) =>
      sideBySideFigure(results, name, { id: `tracing.rps.${name}`, label: `hit throughput, ${label}, ${options.connections} conns (req/s)`, baselineLabel: 'tracing off, beside it', target });
    return {
      figures: [
        figure('ratio-0.01', 'tracing on, sample_ratio 0.01', { text: '>= 0.95x tracing off (side by side)', pass: (v, b, ratio) => ratio >= 0.95 }),
        figure('ratio-1', 'tracing on, sample_ratio 1', { text: 'reported (no target)', pass: () => true }),
        figure('off-control', 'tracing off, a second process (A/A control)', { text: 'reported: the method\'s own reading of no difference', pass: () => true }),
      ],
      tables: [
        sideBySideTable({
          title: `Tracing on the hit path, ${options.connections} connections per server, each target side by side with a tracing-off process of its own on one core (medians over ${results['ratio-0.01'].length} runs of ${DURATION_S} s; a target's ratios: the median of each run's ratio to the run beside it; CPU shares: this side's, of the one core the two servers share)`,
          pairs,
          results,
        }),
      ],
      notes: [
        `Tracing: spans exported to an OTLP/HTTP sink in the bench process (${exports} export requests received over the scenario); sample_ratio 0.01 records one new trace in a hundred, sample_ratio 1 every one.`,
        `Tracing, server CPU per hit against the tracing-off process beside it (median of the runs' ratios): ${pairs.map(({ target: t }) => `${t.name} ${cpuPerHitRatio(results, t.name).toFixed(3)}x`).join(', ')}.`,
      ],
    };
  } finally {
    for (const proc of stops.reverse()) await proc.stop();
    sink.closeAllConnections();
    await new Promise((resolve) => sink.close(resolve));
  }
}
