import type { Clock } from '../clock.js';
import type { ThrottleConfig } from '../config/types.js';
import type { UpstreamEvents } from './events.js';
import type { OutcomeShare, OutcomeTotals } from './guard/provider-state.js';
import { SlidingCounts } from './sliding-counts.js';
import type { Layer } from './upstream.js';
import { verdictOf } from './verdict.js';

export interface ThrottleOptions {
  readonly upstream: string;
  readonly config: ThrottleConfig;
  readonly clock: Clock;
  readonly events: UpstreamEvents;
  /** The fleet's counts (Redis); absent or answering undefined: this instance's alone. */
  readonly share?: OutcomeShare;
  /** Source of the shedding draw, [0, 1); default Math.random. */
  readonly random?: () => number;
}

export interface Throttle {
  readonly layer: Layer;
  /** The share of calls shed now, 0 to 1: for metrics and the status page. */
  rejectProbability(): number;
  /**
   * Forgets the window, here and in the fleet: the breaker's probe found the provider back, and
   * the failures of its outage must not hold back the calls that now succeed.
   */
  reset(): void;
}

/** Slices of the window: the same as the breaker's and the retry budget's counts. */
const SLICES = 10;

/**
 * Client-side adaptive throttling ("Handling Overload", Google SRE book; Envoy's admission
 * control): over the last `window_ms`, a call is shed locally with probability
 * `max(0, (requests - k * accepts) / (requests + 1))`. A provider answering at least `1/k` of
 * its calls sees every call; one answering fewer sees fewer, so the calls that would likely fail
 * are not made, while the rest still reach it. It sits beside the breaker: the breaker stops
 * calling a provider that is down, this one keeps the calls a half-sick provider can serve.
 *
 * `requests` are the calls the provider answered either way, not the ones shed here: the book
 * counts its own rejections too, which makes a provider that fails a steady share of calls (not
 * an overloaded one) collapse to no calls at all once its success rate dips below `1/k`. Counting
 * as the breaker does (verdict.ts): 401/403, 429 and refused calls count neither way. Nothing is
 * shed until the window holds `min_calls`, so a few failures of a quiet upstream shed nothing.
 *
 * With Redis the window is the fleet's: each instance adds what it saw since its last report and
 * reads the fleet's totals once per slice of the window (one script call a second by default),
 * and uses its own counts in between. Without an answer it goes on with its own.
 */
export function createThrottle(options: ThrottleOptions): Throttle {
  const { upstream, config, clock, events, share } = options;
  const random = options.random ?? Math.random;
  const sliceMs = Math.max(1, config.window_ms / SLICES);
  // First kind: accepted calls; second: failed ones.
  const own = new SlidingCounts(config.window_ms, SLICES);
  /** This instance's counts not reported to the fleet yet, by slice. */
  let pending = new Map<number, [accepts: number, failures: number]>();
  /** The rest of the fleet's counts at the last report, and until when they stand for it. */
  let others: OutcomeTotals = { accepts: 0, failures: 0, epoch: -1 };
  let othersUntil = 0;
  /** The slice of the fleet's latest reset this instance knows; a report under an older one is dropped. */
  let epoch = -1;
  let resetPending = false;
  /** Resets made so far: a report's answer is dropped when one was made after the report left. */
  let resets = 0;
  let nextReport = 0;
  let reporting = false;

  function probability(now: number): number {
    let [accepts, failures] = own.totals(now);
    if (now < othersUntil) {
      accepts += others.accepts;
      failures += others.failures;
    }
    const requests = accepts + failures;
    if (requests < config.min_calls) return 0;
    return Math.max(0, (requests - config.k * accepts) / (requests + 1));
  }

  function count(now: number, accepted: boolean): void {
    own.add(now, accepted ? 0 : 1);
    if (share === undefined) return;
    const slice = Math.floor(now / sliceMs);
    const counts = pending.get(slice) ?? [0, 0];
    counts[accepted ? 0 : 1]++;
    pending.set(slice, counts);
  }

  /** Reports this instance's counts and learns the fleet's, at most once per slice. */
  function report(now: number): void {
    if (share === undefined || reporting || now < nextReport) return;
    nextReport = now + sliceMs;
    const slice = Math.floor(now / sliceMs);
    const [ownAccepts, ownFailures] = own.totals(now);
    const deltas = [...pending].map(([s, [a, f]]): [number, number, number] => [s, a, f]);
    const reset = resetPending;
    const generation = resets;
    pending = new Map();
    resetPending = false;
    // A reset the fleet did not hear of (Redis unreachable, its breaker open) goes with the next
    // report: dropped, the outage's failures would stay in the fleet's window.
    const unheard = () => void (resetPending ||= reset);
    const answer = share.exchange({ upstream, slice, slices: SLICES, sliceMs, epoch, reset, deltas });
    if (answer === undefined) return unheard();
    reporting = true;
    void Promise.resolve(answer).then(
      (fleet) => {
        reporting = false;
        if (fleet === undefined) return unheard();
        // The fleet as it was before this instance's latest reset: its counts are the ones the
        // reset forgot, and would shed the calls the probe just found succeeding.
        if (generation !== resets) return;
        if (fleet.epoch > epoch) {
          // Another instance reset the window: what this one counted before is forgotten too.
          epoch = fleet.epoch;
          own.clear();
          pending.clear();
          others = fleet;
        } else {
          // The fleet's totals hold this instance's counts up to the report: the rest is others'.
          others = { accepts: Math.max(0, fleet.accepts - ownAccepts), failures: Math.max(0, fleet.failures - ownFailures), epoch: fleet.epoch };
        }
        othersUntil = clock.now() + 2 * sliceMs;
      },
      () => {
        reporting = false;
        unheard();
      },
    );
  }

  const layer: Layer = (next) => async (attempt) => {
    const now = clock.now();
    report(now);
    if (attempt.probe !== true) {
      const p = probability(now);
      if (p > 0 && random() < p) {
        events.refused(upstream, attempt.request.endpoint, 'throttled');
        return { kind: 'refused', reason: 'throttled', retryAfterSeconds: 1 };
      }
    }
    const result = await next(attempt);
    const verdict = verdictOf(result, 'throttle', attempt.clientKey?.verifying === true);
    if (verdict !== 'neutral') count(clock.now(), verdict === 'success');
    return result;
  };

  function reset(): void {
    resets++;
    own.clear();
    pending.clear();
    others = { accepts: 0, failures: 0, epoch: others.epoch };
    othersUntil = 0;
    if (share === undefined) return;
    epoch = Math.floor(clock.now() / sliceMs);
    resetPending = true;
    nextReport = 0;
    report(clock.now());
  }

  if (!config.enabled) return { layer: (next) => next, rejectProbability: () => 0, reset: () => {} };
  return { layer, rejectProbability: () => probability(clock.now()), reset };
}
