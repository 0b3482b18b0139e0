import type { Clock } from '../clock.js';
import type { Logger } from '../logging/logger.js';

/** Length of one summary interval. */
export const SUMMARY_INTERVAL_MS = 10_000;

/**
 * Logs failed Redis calls without one line per call (at 50 misses/s against a dead Redis that was
 * hundreds of lines a minute, drowning everything else). The first failure after a quiet
 * interval is logged at once with its reason; the ones after it are counted per reason and
 * logged as one summary line per interval, for as long as they keep coming. Driven by the calls themselves, not a timer, so the
 * injected clock decides; an interval's summary is written by the first call after it ends.
 */
export class FailureSummary {
  readonly #clock: Clock;
  readonly #logger: Logger;
  readonly #name: string;
  /** Start of the current interval, or undefined when no failure is being summarized. */
  #since: number | undefined;
  readonly #counts = new Map<string, number>();

  constructor(options: { clock: Clock; logger: Logger; name: string }) {
    this.#clock = options.clock;
    this.#logger = options.logger;
    this.#name = options.name;
  }

  /** A failed call. */
  failure(op: string, reason: string): void {
    this.tick();
    if (this.#since === undefined) {
      this.#since = this.#clock.now();
      this.#logger.warn({ dependency: this.#name, op, reason, summary_interval_ms: SUMMARY_INTERVAL_MS }, 'redis call failed; carrying on without it (further failures are summarized)');
      return;
    }
    const key = `${op}: ${reason}`;
    this.#counts.set(key, (this.#counts.get(key) ?? 0) + 1);
  }

  /** Writes the summary of an interval that has ended; cheap enough to call on every call. */
  tick(): void {
    if (this.#since === undefined || this.#clock.now() - this.#since < SUMMARY_INTERVAL_MS) return;
    this.flush();
  }

  /** Writes what is counted so far (also on close) and starts the next interval. */
  flush(): void {
    const since = this.#since;
    if (since === undefined) return;
    const now = this.#clock.now();
    if (this.#counts.size === 0) {
      this.#since = undefined;
      return;
    }
    const failures = Object.fromEntries(this.#counts);
    const total = [...this.#counts.values()].reduce((sum, n) => sum + n, 0);
    this.#counts.clear();
    this.#logger.warn({ dependency: this.#name, failures, total, interval_ms: now - since }, 'redis calls failed since the last line; carried on without them');
    // Failures are still coming: keep summarizing them rather than logging the next one alone.
    this.#since = now;
  }
}
