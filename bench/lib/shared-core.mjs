// Two servers measured at the same time on the same core. Both are pinned to the server CPU and
// loaded at once, each by its own wrk (both on the client CPU), so the scheduler splits the core
// between them and a slow phase of the machine slows both alike: the ratio of their rates is the
// ratio of what a request costs each. On this kind of shared virtual machine a core's speed
// drifts by a third within seconds; runs one after the other (rounds.mjs, paired or rotated)
// carry that drift into every ratio. Measured on 2026-11-26 with two identical tracing-off
// processes (an A/A control): eight runs of 5 s side by side read 0.980-1.022x (median 1.019x),
// and 1.001x in a second set; rotated runs one after the other the same hour read 0.76-1.80x
// per round (median 1.077x over 15 rounds).
//
// It needs the scheduler to give each side half the core: with Linux's autogroup scheduling
// (/proc/sys/kernel/sched_autogroup_enabled), a process in a session of its own gets a share of
// its own. perch on Node 20 relaunches itself in a new session to size its heap, so two perch
// processes split the core evenly (0.49 each in every run of the tracing scenario), while perch
// beside a bench script in the bench's session got 0.21-0.30 of it; with autogroup off the same
// pair split 0.50/0.50. So the servers of a side-by-side scenario are started in sessions of their
// own (`ownSession`, procs.mjs), and the INVALID rule checks the split (report.mjs, SPLIT_MIN).
//
// What it cannot see: work a server does off its own core (nothing here: every thread of a
// server runs on the pinned CPU), and a difference in how the two share caches, which the A/A
// control would show.
import { BENCH_KEY } from './perch.mjs';
import { side, targetsTable } from './report.mjs';
import { median } from './stats.mjs';
import { wrk } from './wrk.mjs';

/**
 * Runs each of `pairs` ({ baseline, target }, each a { name, url, pids }) side by side: a warm-up
 * of `warmupS` per pair, then `rounds` rounds in which each pair runs once for `durationS`, the
 * order of the pairs rotated by one each round. Every pair has a baseline process of its own: a
 * baseline shared by all pairs would run more than any target, and was measured to read faster
 * (an A/A control beside it read 0.96x). Resolves with each process's runs by name; a target's
 * run carries `baselineRun`, the baseline's run beside it, and every run carries
 * `pairGeneratorCpu` and `pairServerCpu`, the two sides' shares of the one client core and of
 * the one server core, for the INVALID rule (report.mjs, rule 'shared-core').
 */
export async function sharedCoreRounds(ctx, { pairs, path, label, rounds, durationS, warmupS }) {
  const { options } = ctx;
  const load = (t, seconds) =>
    wrk({
      url: t.url,
      path,
      headers: { 'x-api-key': BENCH_KEY },
      connections: options.connections,
      durationS: seconds,
      cpu: ctx.pin.clientCpu,
      serverCpu: ctx.pin.serverCpu,
      serverPids: t.pids,
    });
  const side = async ({ baseline, target }, seconds) => {
    const [b, o] = await Promise.all([load(baseline, seconds), load(target, seconds)]);
    const shares = { pairGeneratorCpu: b.generatorCpu + o.generatorCpu, pairServerCpu: b.serverCpu + o.serverCpu };
    return [{ ...b, ...shares }, { ...o, ...shares, baselineRun: b }];
  };
  for (const p of pairs) {
    const [b, o] = await side(p, warmupS);
    ctx.log(`  ${label} warm-up, ${p.target.name} beside ${p.baseline.name}: ${summary(o, b)}`);
  }
  const results = Object.fromEntries(pairs.flatMap((p) => [p.baseline, p.target]).map((t) => [t.name, []]));
  for (let r = 0; r < rounds; r++) {
    for (const p of pairs.map((_, i) => pairs[(i + r) % pairs.length])) {
      const [b, o] = await side(p, durationS);
      results[p.baseline.name].push(b);
      results[p.target.name].push(o);
      ctx.log(`  ${label} round ${r + 1}, ${p.target.name} beside ${p.baseline.name}: ${summary(o, b)}`);
    }
  }
  return results;
}

/** A target's req/s figure: its runs, the baseline runs beside them, the median of their ratios. */
export function sideBySideFigure(results, name, { id, label, baselineLabel, target }) {
  return {
    id,
    label,
    runs: results[name].map((r) => r.rps),
    baseline: { label: baselineLabel, runs: results[name].map((r) => r.baselineRun.rps) },
    pairRatios: results[name].map((r) => r.rps / r.baselineRun.rps),
    target,
    decimals: 0,
    sides: [side(name, results[name])],
    rule: 'shared-core',
  };
}

/** Every process of `pairs`, baseline then target; ratios only for targets, against their own baseline. */
export function sideBySideTable({ title, pairs, results }) {
  return targetsTable({ title, targets: pairs.flatMap((p) => [p.baseline, p.target]), results, baseline: pairs[0].baseline.name, rule: 'shared-core', pairedOnly: true });
}

/** The median over a target's runs of its server CPU per answered request against the baseline's beside it. */
export function cpuPerHitRatio(results, name) {
  return median(results[name].map((r) => r.serverCpu / r.rps / (r.baselineRun.serverCpu / r.baselineRun.rps)));
}

const pct = (x) => `${(x * 100).toFixed(0)}%`;

function summary(o, b) {
  const failed = o.errorStatuses + o.socketErrors + b.errorStatuses + b.socketErrors;
  return `${o.rps.toFixed(0)} against ${b.rps.toFixed(0)} req/s (${(o.rps / b.rps).toFixed(3)}x), p99 ${o.p99.toFixed(3)} against ${b.p99.toFixed(3)} ms, server CPU ${pct(o.serverCpu)} + ${pct(b.serverCpu)} (core ${pct(o.serverCoreBusy)} busy), generators ${pct(o.generatorCpu)} + ${pct(b.generatorCpu)} (core ${pct(o.generatorCoreBusy)} busy)${failed > 0 ? `, ${failed} failed` : ''}`;
}
