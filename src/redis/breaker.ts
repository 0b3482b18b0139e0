import type { Clock } from '../clock.js';
import type { Logger } from '../observability/logger.js';

export type BreakerState = 'closed' | 'open' | 'half_open';

export interface BreakerOptions {
  readonly clock: Clock;
  readonly logger: Logger;
  /** What the breaker guards, for its log lines. */
  readonly name: string;
  /** Consecutive failures that open it. */
  readonly threshold?: number;
  /** How long it stays open before one probe goes through. */
  readonly coolDownMs?: number;
}

/**
 * Stops calling a dependency that keeps failing. A dead or frozen Redis would otherwise cost
 * every request a full command timeout; once open, requests skip Redis at no cost until the
 * cool-down ends, then a single probe decides whether to close again or stay open.
 */
export class Breaker {
  readonly #clock: Clock;
  readonly #logger: Logger;
  readonly #name: string;
  readonly #threshold: number;
  readonly #coolDownMs: number;
  #state: BreakerState = 'closed';
  #failures = 0;
  #openedAt = 0;
  #probing = false;

  constructor(options: BreakerOptions) {
    this.#clock = options.clock;
    this.#logger = options.logger;
    this.#name = options.name;
    this.#threshold = options.threshold ?? 5;
    this.#coolDownMs = options.coolDownMs ?? 2000;
  }

  get state(): BreakerState {
    return this.#state;
  }

  /** Whether a call may go through now. A true in half-open state reserves the one probe. */
  allow(): boolean {
    if (this.#state === 'closed') return true;
    if (this.#state === 'open') {
      if (this.#clock.now() - this.#openedAt < this.#coolDownMs) return false;
      this.#state = 'half_open';
    }
    if (this.#probing) return false;
    this.#probing = true;
    return true;
  }

  success(): void {
    this.#failures = 0;
    this.#probing = false;
    if (this.#state !== 'closed') {
      this.#state = 'closed';
      this.#logger.info({ dependency: this.#name }, 'circuit breaker closed: dependency is back');
    }
  }

  failure(): void {
    this.#failures++;
    const probeFailed = this.#state === 'half_open';
    this.#probing = false;
    if (probeFailed || (this.#state === 'closed' && this.#failures >= this.#threshold)) {
      this.#openedAt = this.#clock.now();
      if (this.#state === 'closed') {
        this.#logger.warn({ dependency: this.#name, failures: this.#failures, cool_down_ms: this.#coolDownMs }, 'circuit breaker open: skipping dependency');
      }
      this.#state = 'open';
    }
  }
}
