// Hit latency at a fixed rate, open loop (issue 22): the hit scenario's cached page, requests due
// at half of perch's saturated throughput whatever the answers do (lib/open-loop.mjs), latency
// counted from each request's due time, so a pause in the server counts against every request it
// delays. wrk at saturation says how the tail looks when the server is the bottleneck; this says
// what a client sees at a load the server carries, which is where a tail target means something.
// perch (rate limits in memory, as in the hit scenario) is measured against the plain bound (a
// hit's work done plainly on bare node:http, lib/servers/minimal-path.mjs) at the same rate.
import { BENCH_KEY, get, startPerch } from '../lib/perch.mjs';
import { openLoop } from '../lib/open-loop.mjs';
import { fmt, invalidReasons, side } from '../lib/report.mjs';
import { interleavedRounds } from '../lib/rounds.mjs';
import { startMinimalPath, startUpstream } from '../lib/servers.mjs';
import { median } from '../lib/stats.mjs';
import { wrk } from '../lib/wrk.mjs';
import { HIT_PATH, HIT_USER_ID, primeHit } from './hit.mjs';

/** The fixed rate, as a share of perch's saturated throughput: loaded, with room for its tail. */
const LOAD_SHARE = 0.5;
/** Relative, as decided: the machine sets the milliseconds, the bound beside perch shows how many. */
const P99_TARGET_RATIO = 1.5;

export async function hitRateScenario(ctx) {
  const { options } = ctx;
  const notes = [];
  const stops = [];
  try {
    const upstream = await startUpstream(ctx);
    stops.push(upstream.proc);
    const perch = await startPerch(ctx, 'perch-hit-rate', { upstreamUrl: upstream.url, ttl: { tweets: 3600 } });
    stops.push(perch.proc);
    await primeHit(perch.url, 'perch', (status) => status.startsWith('perch; hit'));
    const minimal = await startMinimalPath(ctx, HIT_USER_ID);
    stops.push(minimal.proc);
    const hit = await get(perch.url, HIT_PATH);
    const plain = await get(minimal.url, HIT_PATH);
    if (!plain.body.equals(hit.body)) throw new Error("the minimal path does not answer perch's bytes");

    const headers = { 'x-api-key': BENCH_KEY };
    const saturate = (durationS) =>
      wrk({ url: perch.url, path: HIT_PATH, headers, connections: options.connections, durationS, cpu: ctx.pin.clientCpu, serverCpu: ctx.pin.serverCpu, serverPids: perch.pids });
    await saturate(Math.min(options.warmupS, options.hitDurationS));
    const saturated = await saturate(options.hitDurationS);
    const rate = Math.max(100, Math.round((saturated.rps * LOAD_SHARE) / 100) * 100);
    const wrkProblems = invalidReasons([side('perch (wrk)', [saturated])], 'throughput');
    ctx.log(`  hit-rate: perch saturated at ${saturated.rps.toFixed(0)} req/s (wrk, ${options.connections} conns, ${options.hitDurationS} s); open loop at ${rate} req/s`);
    notes.push(
      `Hit rate: the fixed rate is ${rate} req/s, ${LOAD_SHARE}x perch's saturated throughput measured by wrk in the same run (${saturated.rps.toFixed(0)} req/s, ${options.connections} conns, ${options.hitDurationS} s, generator CPU ${fmt(saturated.generatorCpu, 2)}, server CPU ${fmt(saturated.serverCpu, 2)}${wrkProblems.length > 0 ? `; that run was not a clean saturation: ${wrkProblems.join('; ')}, so the rate may not be half of what perch can do` : ''}).`,
    );

    const targets = [
      { name: 'minimal', label: "bound: a hit's work, plainly, on node:http", url: minimal.url, pids: [minimal.proc.pid] },
      { name: 'perch', label: 'perch, rate limits in memory', url: perch.url, pids: perch.pids },
    ];
    const results = await interleavedRounds({
      targets,
      rounds: options.runs,
      durationS: options.hitDurationS,
      warmupS: Math.min(options.warmupS, options.hitDurationS),
      log: ctx.log,
      label: 'hit-rate',
      run: async (t, durationS) => {
        const r = await openLoop({ url: t.url, path: HIT_PATH, headers, rate, durationS, connections: options.connections, cpu: ctx.pin.clientCpu, serverCpu: ctx.pin.serverCpu, serverPids: t.pids });
        ctx.log(`    ${t.name}: sent ${r.sentRate.toFixed(0)}/s, answered ${r.rps.toFixed(0)}/s of ${rate}/s; p99.9 ${r.p999.toFixed(3)} ms, max ${r.max.toFixed(3)} ms; generator's own lateness p99 ${r.lagP99.toFixed(3)} ms; longest queue ${r.maxQueue}`);
        return r;
      },
    });

    const series = (name, field) => results[name].map((r) => r[field]);
    const sides = [side('perch', results.perch), side('plain bound', results.minimal)];
    const figure = (field, label, target) => ({
      id: `hit-rate.${field}.perch`,
      label: `hit latency ${label} at ${rate} req/s open loop, perch, rate limits in memory (ms)`,
      runs: series('perch', field),
      baseline: { label: 'plain bound', runs: series('minimal', field) },
      target,
      decimals: 3,
      sides,
      // The server has room at this rate: only the generator, failed requests and the rate apply.
      rule: 'latency',
    });
    const figures = [figure('p99', 'p99', { text: `<= ${P99_TARGET_RATIO}x plain bound`, pass: (v, b, ratio) => ratio <= P99_TARGET_RATIO }), figure('p999', 'p99.9')];
    notes.push(
      `Hit rate: latency counts from each request's due time (open loop, ${options.connections} keep-alive connections, one request in flight on each, the rest queued for the first free one), so a stall counts against every request it delays. The generator (lib/open-loop-child.mjs) sleeps between due times with Atomics.wait, which wakes ~0.05-0.1 ms late; an answer arriving meanwhile is timestamped then, so latencies carry up to about that much of the generator's own, alike for both targets. Its own lateness is in the table ("send lag").`,
    );
    return { figures, tables: [openLoopTable(`Hit latency at ${rate} req/s, open loop, ${options.connections} connections (medians over ${options.runs} rounds)`, targets, results)], notes };
  } finally {
    for (const proc of stops.reverse()) await proc.stop();
  }
}

function openLoopTable(title, targets, results) {
  const med = (name, field) => median(results[name].map((r) => r[field]));
  return {
    title,
    head: ['target', 'requested/s', 'sent/s', 'answered/s', 'p50 ms', 'p99 ms', 'p99.9 ms', 'max ms', 'send lag p99 ms', 'errors', 'generator CPU (core busy)', 'server CPU (core busy)', 'valid'],
    rows: targets.map((t) => {
      const runs = results[t.name];
      const reasons = invalidReasons([side(t.name, runs)], 'latency');
      return [
        t.label,
        fmt(med(t.name, 'requestedRate'), 0),
        fmt(med(t.name, 'sentRate'), 0),
        fmt(med(t.name, 'rps'), 0),
        fmt(med(t.name, 'p50'), 3),
        fmt(med(t.name, 'p99'), 3),
        fmt(med(t.name, 'p999'), 3),
        fmt(med(t.name, 'max'), 3),
        fmt(med(t.name, 'lagP99'), 3),
        String(runs.reduce((n, r) => n + r.errorStatuses + r.socketErrors, 0)),
        `${fmt(med(t.name, 'generatorCpu'), 2)} (${fmt(med(t.name, 'generatorCoreBusy'), 2)})`,
        `${fmt(med(t.name, 'serverCpu'), 2)} (${fmt(med(t.name, 'serverCoreBusy'), 2)})`,
        reasons.length > 0 ? `INVALID (${reasons.join('; ')})` : 'yes',
      ];
    }),
  };
}
