// Measured runs in interleaved rounds: a warm-up run per target first (JIT, caches, connection
// pools), then round r runs every target once, so drift on the machine and noisy neighbours hit
// every target alike instead of whichever happened to run last.
//
// `pairWith` names a baseline target run right before every other target's run, each round in a
// rotated order. On this kind of shared virtual machine the speed of a core drifts by a third
// within a minute (the same bare server measured 23k and 46k req/s one round apart), so a target
// compared with a baseline measured 80 s away carries that drift, and in a fixed order the
// first targets of a round were measured faster than the last whatever they were. A pair run
// seconds apart shares the drift, and the rotation spreads what is left over every position.
//
// The baseline of a pair runs twice as often as anything else, and pairing was measured to favour
// it: in the tracing scenario a second tracing-off process paired with the first (an A/A control)
// read 0.78-0.97x in six runs of 3-6 rounds, with the order in each pair fixed or alternating and
// with fresh processes each round. Rotated unpaired rounds read it 1.013x and 0.971x over 25
// rounds, but 0.76-1.80x round by round. The tracing scenario now measures side by side on one
// core instead (shared-core.mjs), where the control reads 0.98-1.02x per run. The hit scenario
// keeps its pairing for now: its ratios against the ceiling may carry the same bias, which a full
// run with an A/A control there would show.

/**
 * `run(target, durationS, runNo)` performs one run (runNo counts every run, warm-ups included, so
 * a run can make paths of its own). Resolves with each target's measured runs, by name; with
 * `pairWith`, each other target's run carries `baselineRun`, the baseline run just before it.
 */
export async function interleavedRounds({ targets, rounds, durationS, warmupS, run, log, label, pairWith }) {
  let runNo = 0;
  for (const t of targets) {
    const w = await run(t, warmupS, runNo++);
    log(`  ${label} ${t.name} warm-up: ${summary(w)}`);
  }
  const results = Object.fromEntries(targets.map((t) => [t.name, []]));
  const baseline = targets.find((t) => t.name === pairWith);
  const others = targets.filter((t) => t !== baseline);
  for (let r = 0; r < rounds; r++) {
    const order = baseline !== undefined ? others.map((_, i) => others[(i + r) % others.length]) : targets;
    for (const t of order) {
      let baselineRun;
      if (baseline !== undefined) {
        baselineRun = await run(baseline, durationS, runNo++);
        results[baseline.name].push(baselineRun);
        log(`  ${label} ${baseline.name} round ${r + 1}, before ${t.name}: ${summary(baselineRun)}`);
      }
      const result = await run(t, durationS, runNo++);
      results[t.name].push(baselineRun === undefined ? result : { ...result, baselineRun });
      log(`  ${label} ${t.name} round ${r + 1}: ${summary(result)}${baselineRun === undefined ? '' : `; ${(result.rps / baselineRun.rps).toFixed(3)}x its ${baseline.name} run`}`);
    }
  }
  return results;
}

const pct = (x) => `${(x * 100).toFixed(0)}%`;

function summary(r) {
  const failed = r.errorStatuses + r.socketErrors;
  return `${r.rps.toFixed(0)} req/s, p50 ${r.p50.toFixed(3)} ms, p99 ${r.p99.toFixed(3)} ms${r.p999 === undefined ? '' : `, p99.9 ${r.p999.toFixed(3)} ms`}, generator CPU ${pct(r.generatorCpu)} (core ${pct(r.generatorCoreBusy)} busy), server CPU ${pct(r.serverCpu)} (core ${pct(r.serverCoreBusy)} busy)${failed > 0 ? `, ${failed} failed` : ''}`;
}
