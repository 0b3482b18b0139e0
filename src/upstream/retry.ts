import type { Clock } from '../clock.js';
import type { ProviderProtectionConfig } from '../config/types.js';
import { wait, type Timers } from '../timers.js';
import type { RetryDecision, UpstreamEvents } from './events.js';
import { SlidingCounts } from './sliding-counts.js';
import { deadlineOf, floorOf, type Attempt, type Layer, type UpstreamResult } from './upstream.js';

export interface RetryOptions {
  readonly upstream: string;
  readonly config: Pick<
    ProviderProtectionConfig,
    'retries' | 'retry_budget_percent' | 'retry_budget_min_per_second' | 'retry_backoff_ms' | 'retry_backoff_max_ms'
  >;
  readonly clock: Clock;
  readonly timers: Timers;
  readonly events: UpstreamEvents;
  /** Jitter source, [0, 1); default Math.random. */
  readonly random?: () => number;
  /** The clock of `Attempt.deadline`; default `performance.now`. */
  readonly monotonic?: () => number;
}

/** The budget's window: retries are weighed against the requests of the last 10 seconds. */
const BUDGET_WINDOW_MS = 10_000;

/**
 * Whether another attempt may get a different answer: the connection broke, the exchange took
 * too long, or a gateway said it could not reach its backend. A 503 with Retry-After is the
 * provider saying "stop" (a `rate_limited` result) and is never retried; neither is any answer
 * about the request itself.
 */
function isRetryable(result: UpstreamResult): boolean {
  if (result.kind === 'timeout') return true;
  if (result.kind !== 'failed') return false;
  if (result.failure === 'connection') return true;
  return result.failure === 'status_5xx' && (result.status === 502 || result.status === 503 || result.status === 504);
}

/**
 * Retries a retryable failure on the same upstream, at most `retries` times per request, with
 * full-jitter exponential backoff (a random wait up to `retry_backoff_ms * 2^n`, capped at
 * `retry_backoff_max_ms`), never past the request's deadline (`MIN_CALL_MS` of it, `Attempt.minCallMs`, must be left
 * when the retry starts), and only while the retries of the
 * last 10 seconds, this one counted, stay within `max(floor, retry_budget_percent% of the
 * requests)`: a provider failing every call sees at most that share more calls, never a storm.
 * The floor is `retry_budget_min_per_second` for each second since the upstream was built (start
 * or reload), up to the window's 10: a rate, not a burst, so an instance that just started does
 * not retry past the percentage before it has a window's history. Retries go down through the pool and the guard, so they spend the call cap and honour
 * every stop like any call. Own code rather than undici's retry interceptor, which sits under
 * the dispatcher (below the guard, so its retries would bypass the cap), knows no budget and
 * sees HTTP statuses, not perch's results.
 */
export function createRetry(options: RetryOptions): Layer {
  const { upstream, config, clock, timers, events } = options;
  if (config.retries === 0) return (next) => next;
  const random = options.random ?? Math.random;
  const monotonic = options.monotonic ?? (() => performance.now());
  // First kind: requests (first attempts); second kind: retries.
  const window = new SlidingCounts(BUDGET_WINDOW_MS);
  const builtAt = clock.now();

  function floor(now: number): number {
    return (config.retry_budget_min_per_second * Math.min(BUDGET_WINDOW_MS, now - builtAt)) / 1000;
  }

  function decide(retried: number, backoffMs: number, attempt: Attempt): RetryDecision {
    if (retried >= config.retries) return 'exhausted';
    // The retry must start with time to be answered, or it is a call the provider bills and
    // perch abandons; a batch call's time is its latest rider's.
    if (monotonic() + backoffMs + floorOf(attempt) > deadlineOf(attempt)) return 'no_time';
    const now = clock.now();
    const [requests, retries] = window.totals(now);
    // Counting this retry, so the window never holds more than the budget: a share of 20% is at
    // most 1.2 calls per request over any run, not 20% and one.
    if (retries + 1 > Math.max(floor(now), (config.retry_budget_percent / 100) * requests)) return 'budget_exhausted';
    return 'retried';
  }

  return (next) => async (attempt) => {
    window.add(clock.now(), 0);
    let result = await next(attempt);
    for (let retried = 0; isRetryable(result); retried++) {
      const ceiling = Math.min(config.retry_backoff_max_ms, config.retry_backoff_ms * 2 ** retried);
      const backoffMs = Math.floor(random() * ceiling);
      const decision = decide(retried, backoffMs, attempt);
      events.retry(upstream, attempt.request.endpoint, decision);
      if (decision !== 'retried') break;
      window.add(clock.now(), 1);
      await wait(timers, backoffMs);
      const again = await next({ ...attempt, retry: retried + 1 });
      // A retry the guard refused, or one the miss deadline cut short, says less than the
      // provider's own failure before it: that failure is what the breaker above must weigh.
      if (again.kind === 'refused' || (again.kind === 'timeout' && again.deadline === true)) break;
      result = again;
    }
    return result;
  };
}
