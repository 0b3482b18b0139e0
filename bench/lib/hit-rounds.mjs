// The hit-path measurement several scenarios share: wrk on the cached page at the bench's
// connections, pinned, every target in interleaved rounds of the hit duration.
import { BENCH_KEY } from './perch.mjs';
import { interleavedRounds } from './rounds.mjs';
import { wrk } from './wrk.mjs';

/**
 * Runs `targets` ({ name, url, pids, headers? }) on `path` with the bench key plus each target's
 * own headers; `pairWith` names the target each other one is paired with (see rounds.mjs).
 * `rounds` and `durationS` default to the bench's options.
 */
export function hitRounds(ctx, { targets, path, label, pairWith, rounds = ctx.options.runs, durationS = ctx.options.hitDurationS }) {
  const { options } = ctx;
  return interleavedRounds({
    targets,
    rounds,
    durationS,
    warmupS: Math.min(options.warmupS, durationS),
    log: ctx.log,
    label,
    pairWith,
    run: (t, durationS) =>
      wrk({
        url: t.url,
        path,
        headers: { 'x-api-key': BENCH_KEY, ...t.headers },
        connections: options.connections,
        durationS,
        cpu: ctx.pin.clientCpu,
        serverCpu: ctx.pin.serverCpu,
        serverPids: t.pids,
      }),
  });
}
