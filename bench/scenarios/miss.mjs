// Miss path: perch forwarding requests it has never seen vs calling the upstream directly, both
// driven by wrk. Every request has a path of its own (a wrk Lua request() counting user ids, a
// fresh id range per run), so each is a real miss: perch authenticates, rate-limits, calls the
// upstream, checks and stores the page (tweets TTL 3600, as in production) and logs. Added
// latency = perch - direct for each round, median over the rounds.
//
// Beside them, in the same rounds, the bounds of lib/servers/plain-miss.mjs: a miss's work done
// plainly on node:http and undici, as far as a hop, a parse, and the compressed variants perch
// makes for every stored page. Their added latency is what that much work costs here, whatever
// perch does; perch's is set against the bound that does the work of perch's settings.
//
// Connections default to 1 (BENCH_MISS_CONNECTIONS): with one request in flight a latency is the
// cost of one exchange, with no queueing. At 64 connections against a single core the latency is
// mostly queueing (64 / throughput), so "added latency" would measure throughput, not the hop.
// One connection never saturates the server, so these latency figures are INVALID only when the
// generator was short of CPU (report.mjs).
import { BENCH_KEY, get, startPerch } from '../lib/perch.mjs';
import { side, targetsTable } from '../lib/report.mjs';
import { interleavedRounds } from '../lib/rounds.mjs';
import { startPlainMiss, startUpstream } from '../lib/servers.mjs';
import { distinctPathsLua, wrk } from '../lib/wrk.mjs';

const PREFIX = '/v1/users/';
const SUFFIX = '/tweets';
/** Ids are `1` + the run number (6 digits) + a 12-digit counter: 19 digits, distinct across runs. */
const idPrefix = (runNo) => `1${String(runNo).padStart(6, '0')}`;
const BOUNDS = [
  { work: 'hop', label: 'a hop, plainly (undici forward)' },
  { work: 'parse', label: 'a hop and a JSON parse, plainly' },
  { work: 'compress', label: "a hop, a JSON parse and both compressed variants (perch's encode), plainly" },
];

export async function missScenario(ctx) {
  const { options } = ctx;
  const stops = [];
  try {
    const upstream = await startUpstream(ctx);
    stops.push(upstream.proc);
    const perch = await startPerch(ctx, 'perch-miss', { upstreamUrl: upstream.url, ttl: { tweets: 3600 }, ...(process.env.BENCH_MISS_COMPRESSION ? { compression: process.env.BENCH_MISS_COMPRESSION } : {}) });
    stops.push(perch.proc);
    // With compression set by hand, the bound to compare is the one without it.
    const matching = process.env.BENCH_MISS_COMPRESSION ? 'parse' : 'compress';
    const bounds = [];
    for (const b of BOUNDS) {
      const server = await startPlainMiss(ctx, upstream.url, b.work);
      stops.push(server.proc);
      bounds.push({ ...b, name: `bound-${b.work}`, url: server.url, pids: [server.proc.pid, upstream.proc.pid] });
    }
    // The checks use ids outside every run's range (run numbers start at 0: `1000000...`).
    const probe = `${PREFIX}1999999000000000001${SUFFIX}`;
    const res = await get(perch.url, probe);
    if (res.status !== 200) throw new Error(`perch answered ${res.status} on the miss path`);
    if (!String(res.headers['cache-status']).includes('miss')) throw new Error(`expected a miss, got cache-status ${res.headers['cache-status']}`);
    for (const b of bounds) {
      const answer = await get(b.url, probe);
      if (answer.status !== 200) throw new Error(`the bound ${b.name} answered ${answer.status}`);
    }
    const targets = [
      { name: 'direct', label: 'upstream directly', url: upstream.url, pids: [upstream.proc.pid] },
      // perch's miss costs the upstream's work too, on the same core.
      ...bounds.map((b) => ({ name: b.name, label: `bound: ${b.label}`, url: b.url, pids: b.pids })),
      { name: 'perch', label: 'perch (miss, stored)', url: perch.url, pids: [...perch.pids, upstream.proc.pid] },
    ];
    const results = await interleavedRounds({
      targets,
      rounds: options.runs,
      durationS: options.durationS,
      warmupS: options.warmupS,
      log: ctx.log,
      label: 'miss',
      run: (t, durationS, runNo) =>
        wrk({
          url: t.url,
          headers: { 'x-api-key': BENCH_KEY },
          connections: options.missConnections,
          durationS,
          cpu: ctx.pin.clientCpu,
          serverCpu: ctx.pin.serverCpu,
          serverPids: t.pids,
          lua: distinctPathsLua({ prefix: PREFIX, idPrefix: idPrefix(runNo), suffix: SUFFIX }),
        }),
    });
    const series = (name, field) => results[name].map((r) => r[field]);
    const addedBy = (name, field) => results[name].map((r, i) => r[field] - results.direct[i][field]);
    const added = (field) => addedBy('perch', field);
    const sides = [side('perch', results.perch), side('direct', results.direct)];
    const bound = bounds.find((b) => b.work === matching);
    const latency = (id, label, runs, baseline, target, on = sides) => ({ id, label, runs, baseline, target, decimals: 3, sides: on, rule: 'latency' });
    // Against a bound, its runs are measured on too.
    const withBound = (b) => [...sides, side(b.name, results[b.name])];
    const conns = `${options.missConnections} conn`;
    return {
      figures: [
        latency('miss.p50', `miss latency p50, ${conns} (ms)`, series('perch', 'p50'), { label: 'direct', runs: series('direct', 'p50') }),
        latency('miss.p99', `miss latency p99, ${conns} (ms)`, series('perch', 'p99'), { label: 'direct', runs: series('direct', 'p99') }),
        // No absolute p50 target: the bound below does the same work plainly, and the machine sets its milliseconds.
        latency('miss.added.p50', `miss path added latency p50, ${conns} (ms)`, added('p50'), { label: 'direct p50', runs: series('direct', 'p50') }),
        latency('miss.added.p99', `miss path added latency p99, ${conns} (ms)`, added('p99'), { label: 'direct p99', runs: series('direct', 'p99') }, {
          text: '<= 2 ms',
          pass: (v) => v <= 2,
        }),
        ...['p50', 'p99'].map((field) =>
          latency(
            `miss.added.${field}.bound`,
            `miss path added latency ${field}, perch against ${bound.label} (ms)`,
            added(field),
            { label: `bound, added ${field}`, runs: addedBy(bound.name, field) },
            field === 'p50' ? { text: '<= 1.2x the bound', pass: (v, b, ratio) => ratio <= 1.2 } : undefined,
            withBound(bound),
          ),
        ),
        ...bounds.flatMap((b) =>
          ['p50', 'p99'].map((field) =>
            latency(`miss.added.${field}.bound-${b.work}`, `miss path added latency ${field}, ${conns}, bound: ${b.label} (ms)`, addedBy(b.name, field), { label: `direct ${field}`, runs: series('direct', field) }, undefined, [side(b.name, results[b.name]), side('direct', results.direct)]),
          ),
        ),
      ],
      tables: [targetsTable({ title: `Miss path, ${conns}, a new path per request: every target (medians over ${options.runs} rounds)`, targets, results, baseline: 'direct', rule: 'latency' })],
      notes: [],
    };
  } finally {
    for (const proc of stops.reverse()) await proc.stop();
  }
}
