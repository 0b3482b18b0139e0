// Tracing's cost on the hit path (issue 24): the same cached page as the hit scenario at
// `connections` connections, perch with tracing off against perch exporting to an OTLP/HTTP sink
// at sample_ratio 0.01 and at 1, and a second tracing-off process: the A/A control, whose ratio
// is what the method and the machine alone make of two identical servers. Not paired with a
// baseline (a baseline that runs twice as often was measured to read faster, rounds.mjs): every
// target runs once a round in a rotated order, and a ratio is the median over the rounds of each
// round's run against that round's tracing-off run. One run against the next differs by up to a
// third here, so the scenario makes many short rounds: ROUNDS of DURATION_S (more with BENCH_RUNS).
// The sink (a node:http server in this process, answering 200 to every export) stands for a
// collector; it runs outside the pinned server CPU, so its work is not charged to perch.
import { createServer } from 'node:http';
import { get, perchConfig, startPerchYaml } from '../lib/perch.mjs';
import { side, targetsTable } from '../lib/report.mjs';
import { hitRounds } from '../lib/hit-rounds.mjs';
import { startUpstream } from '../lib/servers.mjs';
import { HIT_PATH } from './hit.mjs';

const ROUNDS = 25;
const DURATION_S = 2;

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
      const perch = await startPerchYaml(ctx, name, (port) => perchConfig({ port, upstreamUrl: upstream.url, ttl: { tweets: 3600 }, metricsYaml: ctx.metricsYaml }) + tracing);
      stops.push(perch.proc);
      await get(perch.url, HIT_PATH);
      const hit = await get(perch.url, HIT_PATH);
      if (hit.status !== 200 || !String(hit.headers['cache-status']).startsWith('perch; hit')) throw new Error(`${name}: the second request is not a hit`);
      return { name, url: perch.url, pids: perch.pids };
    };
    const off = await start('perch-trace-off', '');
    const control = await start('perch-trace-off-2', '');
    const sampled = await start('perch-trace-0.01', `tracing: { endpoint: "${endpoint}", sample_ratio: 0.01 }\n`);
    const all = await start('perch-trace-1', `tracing: { endpoint: "${endpoint}", sample_ratio: 1 }\n`);
    const targets = [
      { ...off, name: 'off', label: 'perch, tracing off' },
      { ...control, name: 'off-control', label: 'perch, tracing off, a second process (A/A control)' },
      { ...sampled, name: 'ratio-0.01', label: 'perch, tracing on, sample_ratio 0.01' },
      { ...all, name: 'ratio-1', label: 'perch, tracing on, sample_ratio 1' },
    ];
    const results = await hitRounds(ctx, { targets, path: HIT_PATH, label: 'tracing', rotate: true, rounds: Math.max(ROUNDS, options.runs), durationS: DURATION_S });
    const figure = (name, label, target) => ({
      id: `tracing.rps.${name}`,
      label: `hit throughput, ${label}, ${options.connections} conns (req/s)`,
      runs: results[name].map((r) => r.rps),
      baseline: { label: 'tracing off', runs: results.off.map((r) => r.rps) },
      pairRatios: results[name].map((r, i) => r.rps / results.off[i].rps),
      target,
      decimals: 0,
      sides: [side(name, results[name]), side('off', results.off)],
      rule: 'throughput',
    });
    return {
      figures: [
        figure('ratio-0.01', 'tracing on, sample_ratio 0.01', { text: '>= 0.95x tracing off (per round)', pass: (v, b, ratio) => ratio >= 0.95 }),
        figure('ratio-1', 'tracing on, sample_ratio 1', { text: 'reported (no target)', pass: () => true }),
        figure('off-control', 'tracing off, a second process (A/A control)', { text: 'reported: the method\'s own reading of no difference', pass: () => true }),
      ],
      tables: [targetsTable({ title: `Tracing on the hit path, ${options.connections} connections (medians over ${results.off.length} rounds of ${DURATION_S} s, targets rotated)`, targets, results, baseline: 'off', rule: 'throughput' })],
      notes: [`Tracing: spans exported to an OTLP/HTTP sink in the bench process (${exports} export requests received over the scenario); sample_ratio 0.01 records one new trace in a hundred, sample_ratio 1 every one.`],
    };
  } finally {
    for (const proc of stops.reverse()) await proc.stop();
    sink.closeAllConnections();
    await new Promise((resolve) => sink.close(resolve));
  }
}
