// perch against the plain bound (a hit's work, plainly, on node:http: lib/servers/minimal-path.mjs)
// measured side by side on one core (lib/shared-core.mjs), with an A/A control: the plain bound
// beside a second plain bound. The hit scenario compares the two through runs one after the other,
// which carry this machine's drift; side by side the ratio of rates is the ratio of per-request
// cost (issue 22: perch at >= 0.95x the bound's req/s, CPU per hit <= 1.1x). Every server is
// started in a session of its own, so the scheduler gives each the same share (shared-core.mjs).
import { get, startPerch } from '../lib/perch.mjs';
import { startMinimalPath, startUpstream } from '../lib/servers.mjs';
import { cpuPerHitRatio, sharedCoreRounds, sideBySideFigure, sideBySideTable } from '../lib/shared-core.mjs';
import { HIT_PATH, HIT_USER_ID, primeHit } from './hit.mjs';

const ROUNDS = 10;
const DURATION_S = 5;
/** As the tracing scenario's: past the one-time recompile V8 does after some 10 s of load. */
const WARMUP_S = 20;

export async function hitSideScenario(ctx) {
  const { options } = ctx;
  const stops = [];
  try {
    const upstream = await startUpstream(ctx);
    stops.push(upstream.proc);
    const plain = async (name) => {
      const m = await startMinimalPath(ctx, HIT_USER_ID, { ownSession: true, logName: name });
      stops.push(m.proc);
      await get(m.url, HIT_PATH);
      return { name, label: `plain bound (${name})`, url: m.url, pids: [m.proc.pid] };
    };
    const perch = await startPerch(ctx, 'perch-hit-side', { upstreamUrl: upstream.url, ttl: { tweets: 3600 } }, { ownSession: true });
    stops.push(perch.proc);
    await primeHit(perch.url, 'perch', (status) => status.startsWith('perch; hit'));
    const pairs = [
      { baseline: await plain('plain-beside-perch'), target: { name: 'perch', label: 'perch, rate limits in memory', url: perch.url, pids: perch.pids } },
      { baseline: await plain('plain-beside-control'), target: { ...(await plain('plain-control')), label: 'plain bound, a second process (A/A control)' } },
    ];
    const results = await sharedCoreRounds(ctx, { pairs, path: HIT_PATH, label: 'hit side by side', rounds: Math.max(ROUNDS, options.runs), durationS: DURATION_S, warmupS: WARMUP_S });
    const figure = (name, label, target) =>
      sideBySideFigure(results, name, {
        id: `hit-side.rps.${name}`,
        label: `hit throughput side by side with the plain bound on one core, ${label}, ${options.connections} conns each (req/s)`,
        baselineLabel: 'plain bound, beside it',
        target,
      });
    return {
      figures: [
        figure('perch', 'perch', { text: '>= 0.95x plain bound (side by side)', pass: (v, b, ratio) => ratio >= 0.95 }),
        figure('plain-control', 'a second plain bound (A/A control)', { text: "reported: the method's own reading of no difference", pass: () => true }),
      ],
      tables: [
        sideBySideTable({
          title: `Hit path side by side on one core, ${options.connections} connections per server (medians over ${results.perch.length} runs of ${DURATION_S} s; a target's ratios: the median of each run's ratio to the run beside it)`,
          pairs,
          results,
        }),
      ],
      notes: [`Hit side by side, server CPU per hit against the plain bound beside it (median of the runs' ratios; target for perch <= 1.1x): perch ${cpuPerHitRatio(results, 'perch').toFixed(3)}x, A/A control ${cpuPerHitRatio(results, 'plain-control').toFixed(3)}x.`],
    };
  } finally {
    for (const proc of stops.reverse()) await proc.stop();
  }
}
