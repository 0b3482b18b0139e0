import type { Clock } from '../clock.js';
import type { Logger } from '../logging/logger.js';

/** How long a breaker stays open before a probe, unless told otherwise. */
export const BREAKER_COOL_DOWN_MS = 2000;

export type BreakerState = 'closed' | 'open' | 'half_open';

export interface BreakerOptions {
  readonly clock: Clock;
  readonly logger: Logger;
  /** What the breaker guards, for its log lines. */
  readonly name: string;
  /** The Redis Cluster node it guards (`host:port`), for its log lines; absent for a whole Redis. */
  readonly node?: string;
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
  /** The Redis Cluster node it guards; undefined for a whole Redis. */
  readonly node: string | undefined;
  readonly #clock: Clock;
  readonly #logger: Logger;
  readonly #fields: Readonly<Record<string, string>>;
  readonly #threshold: number;
  readonly #coolDownMs: number;
  #state: BreakerState = 'closed';
  #failures = 0;
  #openedAt = 0;
  #probing = false;

  constructor(options: BreakerOptions) {
    this.node = options.node;
    this.#clock = options.clock;
    this.#logger = options.logger;
    this.#fields = options.node === undefined ? { dependency: options.name } : { dependency: options.name, node: options.node };
    this.#threshold = options.threshold ?? 5;
    this.#coolDownMs = options.coolDownMs ?? BREAKER_COOL_DOWN_MS;
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

  /**
   * Ends an open breaker's cool-down now, so the next call is its probe: for a new connection,
   * which may well reach a healthy node (a new master after a failover, a restarted Redis).
   */
  probeSoon(): void {
    if (this.#state === 'open') this.#openedAt = Number.NEGATIVE_INFINITY;
  }

  success(): void {
    this.#failures = 0;
    this.#probing = false;
    if (this.#state !== 'closed') {
      this.#state = 'closed';
      this.#logger.info(this.#fields, 'circuit breaker closed: dependency is back');
    }
  }

  failure(): void {
    this.#failures++;
    const probeFailed = this.#state === 'half_open';
    this.#probing = false;
    if (probeFailed || (this.#state === 'closed' && this.#failures >= this.#threshold)) {
      this.#openedAt = this.#clock.now();
      if (this.#state === 'closed') {
        this.#logger.warn({ ...this.#fields, failures: this.#failures, cool_down_ms: this.#coolDownMs }, 'circuit breaker open: skipping dependency');
      }
      this.#state = 'open';
    }
  }
}
