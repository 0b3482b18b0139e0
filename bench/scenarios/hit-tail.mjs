// The hit tail at saturation read off the wire (issue 22, item 2): perch and the plain bound (a
// hit's work, plainly, on node:http), each loaded by wrk at the bench's connections as in the hit
// scenario, while tcpdump records their packets (lib/packet-timing.mjs). Each request's latency
// is what the kernel's timestamps say it waited, with none of wrk's synthetic samples; wrk's own
// p99 of the same runs is reported beside it. Also reported: when the last of the connections
// got its first answer (the admission ramp: libuv accepts one connection per turn of a busy event
// loop). Rounds alternate the order of the two servers.
import { join } from 'node:path';
import { BENCH_KEY, startPerch } from '../lib/perch.mjs';
import { capturePackets, requestsFromPcap, tcpdumpPath } from '../lib/packet-timing.mjs';
import { side } from '../lib/report.mjs';
import { startMinimalPath, startUpstream } from '../lib/servers.mjs';
import { median, percentile } from '../lib/stats.mjs';
import { wrk } from '../lib/wrk.mjs';
import { HIT_PATH, HIT_USER_ID, primeHit } from './hit.mjs';

const LABEL = 'hit latency at saturation, measured from packets';

export async function hitTailScenario(ctx) {
  const { options } = ctx;
  const ids = ['hit-tail.p99.perch', 'hit-tail.p999.perch', 'hit-tail.admission.perch', 'hit-tail.wrk-p99.perch'];
  if (tcpdumpPath() === null) {
    return { figures: ids.map((id) => ({ id, label: `${LABEL} (${id})`, unavailable: '`tcpdump` is not installed (`npm run setup` installs it)' })), tables: [], notes: [] };
  }
  const stops = [];
  try {
    const upstream = await startUpstream(ctx);
    stops.push(upstream.proc);
    const perch = await startPerch(ctx, 'perch-hit-tail', { upstreamUrl: upstream.url, ttl: { tweets: 3600 } });
    stops.push(perch.proc);
    await primeHit(perch.url, 'perch', (status) => status.startsWith('perch; hit'));
    const bound = await startMinimalPath(ctx, HIT_USER_ID, { logName: 'plain-hit-tail' });
    stops.push(bound.proc);
    await primeHit(bound.url, 'plain bound', () => true);
    const targets = [
      { name: 'perch', url: perch.url, pids: perch.pids },
      { name: 'minimal', url: bound.url, pids: [bound.proc.pid] },
    ];
    let runNo = 0;
    const run = async (t, durationS) => {
      const port = Number(new URL(t.url).port);
      const file = join(ctx.tmpDir, `hit-tail-${runNo++}.pcap`);
      const capture = await capturePackets({ port, file, cpu: ctx.pin.clientCpu });
      let result;
      let captured;
      try {
        result = await wrk({ url: t.url, path: HIT_PATH, headers: { 'x-api-key': BENCH_KEY }, connections: options.connections, durationS, cpu: ctx.pin.clientCpu, serverCpu: ctx.pin.serverCpu, serverPids: t.pids });
      } finally {
        captured = await capture.stop();
      }
      const { latencies, firstAnswers } = requestsFromPcap(file, port);
      const sorted = latencies.sort((a, b) => a - b);
      const windowS = result.durationUs / 1e6;
      return {
        ...result,
        // tcpdump shares the client core with wrk: the generator side is the two together.
        generatorCpu: result.generatorCpu + captured.cpuSeconds / windowS,
        wrkCpu: result.generatorCpu,
        tcpdumpCpu: captured.cpuSeconds / windowS,
        // A dropped packet or a request the capture missed leaves the figures short: such a run
        // counts as failed requests, which makes its figures INVALID.
        socketErrors: result.socketErrors + (captured.dropped === 0 && sorted.length >= 0.99 * result.requests ? 0 : 1),
        captureDropped: captured.dropped,
        captured: sorted.length,
        wrkP99: result.p99,
        p99: percentile(sorted, 99),
        p999: percentile(sorted, 99.9),
        max: sorted.at(-1),
        admissionMs: Math.max(...firstAnswers),
        answeredConnections: firstAnswers.length,
      };
    };
    const describe = (r) =>
      `${Math.round(r.rps)} req/s, ${r.captured} of wrk's ${r.requests} requests on the wire: p99 ${r.p99.toFixed(3)} ms, p99.9 ${r.p999.toFixed(3)}, max ${r.max.toFixed(1)}; wrk's p99 ${r.wrkP99.toFixed(3)}; last of ${r.answeredConnections} connections first answered at ${r.admissionMs.toFixed(1)} ms; wrk ${r.wrkCpu.toFixed(2)} + tcpdump ${r.tcpdumpCpu.toFixed(2)} of the client core (${r.captureDropped} dropped), server ${r.serverCpu.toFixed(2)}`;
    for (const t of targets) ctx.log(`  hit tail ${t.name} warm-up: ${describe(await run(t, Math.min(options.warmupS, options.hitDurationS)))}`);
    const results = { perch: [], minimal: [] };
    for (let r = 0; r < options.runs; r++) {
      for (const t of r % 2 === 0 ? targets : [...targets].reverse()) {
        const result = await run(t, options.hitDurationS);
        results[t.name].push(result);
        ctx.log(`  hit tail ${t.name} round ${r + 1}: ${describe(result)}`);
      }
    }
    const figure = (field, id, label, decimals, target) => ({
      id,
      label,
      runs: results.perch.map((r) => r[field]),
      baseline: { label: 'plain bound', runs: results.minimal.map((r) => r[field]) },
      target,
      decimals,
      sides: [side('perch', results.perch), side('plain bound', results.minimal)],
      rule: 'throughput',
    });
    const conns = `${options.connections} conns`;
    return {
      figures: [
        figure('p99', 'hit-tail.p99.perch', `${LABEL}: p99, perch, rate limits in memory, ${conns} (ms)`, 3, { text: '<= 1.5x plain bound', pass: (v, b, ratio) => ratio <= 1.5 }),
        figure('p999', 'hit-tail.p999.perch', `${LABEL}: p99.9, perch, ${conns} (ms)`, 3),
        figure('admissionMs', 'hit-tail.admission.perch', `hit path at saturation: the last connection's first answer after the first connect, perch, ${conns} (ms)`, 1),
        figure('wrkP99', 'hit-tail.wrk-p99.perch', `hit latency p99 at saturation as wrk reports it (synthetic samples included), the same runs, perch, ${conns} (ms)`, 2),
      ],
      tables: [],
      notes: [
        `Hit tail from packets: tcpdump (${tcpdumpPath()}) on the client core beside wrk, ${median(results.perch.map((r) => r.tcpdumpCpu)).toFixed(2)} of it for perch's runs and ${median(results.minimal.map((r) => r.tcpdumpCpu)).toFixed(2)} for the plain bound's (counted in the generator's share); packets dropped by the kernel: ${[...results.perch, ...results.minimal].reduce((n, r) => n + r.captureDropped, 0)}. Latency is from a request's segment to the last segment of its answer.`,
      ],
    };
  } finally {
    for (const proc of stops.reverse()) await proc.stop();
  }
}
