import type { Logger } from '../observability/logger.js';
import type { Breaker, BreakerState } from './breaker.js';
import type { RedisClient } from './redis-client.js';

/** Counts of Redis calls that did not happen or did not work, for metrics and tests. */
export interface RedisCallStats {
  /** Calls that failed (error, timeout, disconnected). */
  errors: number;
  /** Calls not attempted because the breaker was open. */
  skipped: number;
}

/**
 * The one way perch's cache talks to Redis: every call passes the breaker, and a failure is
 * logged, counted and turned into `undefined`. Callers treat `undefined` as "Redis had nothing
 * to say" (a miss, no lease), so Redis can only ever make a request faster, never fail it.
 */
export class GuardedRedis {
  readonly client: RedisClient;
  readonly stats: RedisCallStats = { errors: 0, skipped: 0 };
  readonly #breaker: Breaker;
  readonly #logger: Logger;
  #everReady = false;

  constructor(client: RedisClient, breaker: Breaker, logger: Logger) {
    this.client = client;
    this.#breaker = breaker;
    this.#logger = logger;
    client.once('ready', () => (this.#everReady = true));
  }

  /** Whether the connection is up now. */
  get connected(): boolean {
    return this.client.status === 'ready';
  }

  get state(): BreakerState {
    return this.#breaker.state;
  }

  async run<T>(op: string, call: (client: RedisClient) => Promise<T>): Promise<T | undefined> {
    // Before the first connection completes, calls would fail for a reason that says nothing
    // about Redis's health; they must not open the breaker on every start-up.
    if (!this.#everReady || !this.#breaker.allow()) {
      this.stats.skipped++;
      return undefined;
    }
    try {
      const result = await call(this.client);
      this.#breaker.success();
      return result;
    } catch (error) {
      this.stats.errors++;
      this.#breaker.failure();
      this.#logger.warn({ op, reason: error instanceof Error ? error.message : String(error) }, 'redis call failed; carrying on without it');
      return undefined;
    }
  }

  /**
   * Sends a command without waiting for it and without asking the breaker: for cleanups of
   * commands already sent (a lease release must follow its SET even while the breaker is open,
   * or a SET that Redis runs late would outlive everyone). Never blocks a request; a failure is
   * counted and logged but does not move the breaker.
   */
  fire(op: string, call: (client: RedisClient) => Promise<unknown>): void {
    if (!this.#everReady) return;
    call(this.client).catch((error: unknown) => {
      this.stats.errors++;
      this.#logger.debug({ op, reason: error instanceof Error ? error.message : String(error) }, 'redis cleanup failed');
    });
  }

  async close(): Promise<void> {
    // quit() waits for a reply a dead Redis never sends; disconnect() does not.
    this.client.disconnect();
  }
}
