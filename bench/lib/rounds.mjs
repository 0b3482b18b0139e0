// Measured runs in interleaved rounds: a warm-up run per target first (JIT, caches, connection
// pools), then round r runs every target once, in order, so drift on the machine and noisy
// neighbours hit every target alike instead of whichever happened to run last.

/**
 * `run(target, durationS, runNo)` performs one run (runNo counts every run, warm-ups included, so
 * a run can make paths of its own). Resolves with each target's measured runs, by name.
 */
export async function interleavedRounds({ targets, rounds, durationS, warmupS, run, log, label }) {
  let runNo = 0;
  for (const t of targets) {
    const w = await run(t, warmupS, runNo++);
    log(`  ${label} ${t.name} warm-up: ${summary(w)}`);
  }
  const results = Object.fromEntries(targets.map((t) => [t.name, []]));
  for (let r = 0; r < rounds; r++) {
    for (const t of targets) {
      const result = await run(t, durationS, runNo++);
      results[t.name].push(result);
      log(`  ${label} ${t.name} round ${r + 1}: ${summary(result)}`);
    }
  }
  return results;
}

const pct = (x) => `${(x * 100).toFixed(0)}%`;

function summary(r) {
  const failed = r.errorStatuses + r.socketErrors;
  return `${r.rps.toFixed(0)} req/s, p50 ${r.p50.toFixed(3)} ms, p99 ${r.p99.toFixed(3)} ms, generator CPU ${pct(r.generatorCpu)} (core ${pct(r.generatorCoreBusy)} busy), server CPU ${pct(r.serverCpu)} (core ${pct(r.serverCoreBusy)} busy)${failed > 0 ? `, ${failed} failed` : ''}`;
}
