import type { Clock } from '../clock.js';
import type { BreakerConfig } from '../config/types.js';
import type { EndpointName } from '../endpoints.js';
import type { Logger } from '../logging/logger.js';
import type { BreakerState, UpstreamEvents } from './events.js';
import { SlidingCounts } from './sliding-counts.js';
import { verdictOf } from './verdict.js';
import { secondsUntil, type Layer, type UpstreamResult } from './upstream.js';

export interface BreakerOptions {
  readonly upstream: string;
  readonly config: BreakerConfig;
  readonly clock: Clock;
  readonly logger: Logger;
  readonly events: UpstreamEvents;
  /** Tells the other instances (a shared cool-down through Redis); absent: this instance only. */
  readonly share?: { opened(untilMs: number): void; closed(): void };
}

export interface Breaker {
  readonly layer: Layer;
  state(): BreakerState;
}

/**
 * The outermost layer of an upstream, for a provider that is down or hanging: it opens after
 * `consecutive_failures` failed requests in a row, or when failures reach `failure_ratio` of at
 * least `min_calls` requests over the last `window_ms`. While open no call is made at all (the
 * request fails over, or is answered from stale, or 502 at once); after `half_open_after_ms`
 * exactly one probe goes through, whose answer closes or reopens it, each failed probe doubling
 * the wait up to `half_open_max_ms`: a blip costs a second, a long outage a probe every few
 * seconds. A provider that fails only some calls is the throttle's (throttle.ts): the defaults
 * open only on failure near every call. It sits outside the retry layer, so it weighs what the
 * client got, not each attempt.
 *
 * Own code rather than cockatiel's breakers: those read `Date.now()` inside (no clock to inject,
 * so no exact tests on a ManualClock), signal an open circuit by throwing rather than with a
 * result, and have no hook to share an open state with the fleet.
 */
export function createBreaker(options: BreakerOptions): Breaker {
  const { upstream, config, clock, logger, events, share } = options;
  const window = new SlidingCounts(config.window_ms);
  let state: BreakerState = 'closed';
  let consecutive = 0;
  let openedAt = 0;
  // How long the current opening lasts: doubled by each failed probe, back to the first on close.
  let openMs = config.half_open_after_ms;
  let probing = false;
  // Bumped on every change of state: a result from a call started before it is history.
  let generation = 0;

  function become(next: BreakerState, fields: Record<string, unknown> = {}): void {
    state = next;
    generation++;
    events.breakerState(upstream, next);
    const context = { upstream, ...fields };
    if (next === 'open') {
      const untilMs = openedAt + openMs;
      logger.warn({ ...context, open_ms: openMs, half_open_at: new Date(untilMs).toISOString() }, 'upstream breaker open: no calls until its half-open probe');
      share?.opened(untilMs);
    } else if (next === 'half_open') {
      logger.info(context, 'upstream breaker half-open: one probe goes through');
    } else {
      logger.info(context, 'upstream breaker closed: upstream is back');
      share?.closed();
    }
  }

  function open(fields: Record<string, unknown>, afterProbe = false): void {
    openMs = afterProbe ? Math.min(config.half_open_max_ms, openMs * 2) : config.half_open_after_ms;
    openedAt = clock.now();
    become('open', fields);
  }

  function observe(result: UpstreamResult, started: number, probe: boolean, verifying: boolean): void {
    if (probe) probing = false;
    if (started !== generation) return;
    const verdict = verdictOf(result, 'breaker', verifying);
    if (verdict === 'neutral') return;
    if (probe) {
      if (verdict === 'success') {
        consecutive = 0;
        window.clear();
        become('closed', { probe: 'succeeded' });
      } else {
        open({ probe: 'failed', reason: reasonOf(result) }, true);
      }
      return;
    }
    const now = clock.now();
    if (verdict === 'success') {
      consecutive = 0;
      window.add(now, 0);
      return;
    }
    consecutive++;
    window.add(now, 1);
    const [successes, failures] = window.totals(now);
    const calls = successes + failures;
    const ratioTripped = config.failure_ratio < 1 && calls >= config.min_calls && failures >= config.failure_ratio * calls;
    if (consecutive >= config.consecutive_failures || ratioTripped) {
      open({ consecutive_failures: consecutive, window_failures: failures, window_calls: calls, reason: reasonOf(result) });
    }
  }

  /** The state now: an open breaker whose time is up is half-open, even before the next call. */
  function current(): BreakerState {
    if (state === 'open' && clock.now() >= openedAt + openMs) become('half_open');
    return state;
  }

  const layer: Layer = (next) => async (attempt) => {
    if (current() === 'open') return refuse(attempt.request.endpoint, secondsUntil(openedAt + openMs, clock.now()));
    const probe = state === 'half_open';
    if (probe) {
      if (probing) return refuse(attempt.request.endpoint, 1);
      probing = true;
    }
    const started = generation;
    // A probe is the breaker's own question to the provider: the throttle below lets it through.
    const result = await next(probe ? { ...attempt, probe: true } : attempt);
    observe(result, started, probe, attempt.clientKey?.verifying === true);
    return result;
  };

  function refuse(route: EndpointName, retryAfterSeconds: number): UpstreamResult {
    events.refused(upstream, route, 'breaker_open');
    return { kind: 'refused', reason: 'breaker_open', retryAfterSeconds };
  }

  // Asking for the state moves it on too: /readyz must not report an open breaker past its time,
  // or a balancer that trusts it would never send the probe.
  return { layer, state: current };
}

function reasonOf(result: UpstreamResult): string {
  return result.kind === 'failed' ? result.failure : result.kind;
}
