import type { Clock } from '../clock.js';
import type { RedisConfig } from '../config/types.js';
import type { Logger } from '../logging/logger.js';
import type { BreakerState } from './breaker.js';
import { FailureSummary } from './failure-summary.js';
import { insured } from './insurance.js';
import { NodeBreakers } from './node-breakers.js';
import type { RedisClient } from './redis-client.js';

/** Counts of Redis calls that did not happen or did not work, for metrics and tests. */
export interface RedisCallStats {
  /** Calls a request waited on that failed (error, timeout, disconnected). */
  errors: number;
  /** Calls not attempted because the breaker was open. */
  skipped: number;
  /** Cleanups sent without waiting (lease releases) that failed; no request waited on them. */
  cleanupErrors: number;
}

/**
 * One Redis as the subsystems on it see it: its settings and its guarded connection, opened
 * once by the composition root (app/redis-connections.ts) and shared by every subsystem on it.
 */
export interface RedisConnection {
  readonly settings: RedisConfig;
  readonly guard: GuardedRedis;
}

export interface GuardedRedisOptions {
  readonly clock: Clock;
  readonly logger: Logger;
  /** What it guards, for log lines (`dependency`). */
  readonly name: string;
}

/**
 * The one way perch's cache talks to Redis: every call passes the breaker of the node holding its
 * key, and a failure is counted, summarized in the log and turned into `undefined`. Callers treat
 * `undefined` as "Redis had nothing to say" (a miss, no lease), so Redis can only ever make a
 * request faster, never fail it.
 */
export class GuardedRedis {
  readonly client: RedisClient;
  readonly stats: RedisCallStats = { errors: 0, skipped: 0, cleanupErrors: 0 };
  /** Per-node health, shared with the rate limits when they use this same Redis. */
  readonly breakers: NodeBreakers;
  readonly #failures: FailureSummary;
  readonly #logger: Logger;
  #everReady = false;

  constructor(client: RedisClient, options: GuardedRedisOptions) {
    this.client = client;
    this.breakers = new NodeBreakers(client, options);
    this.#failures = new FailureSummary(options);
    this.#logger = options.logger;
    client.once('ready', () => (this.#everReady = true));
  }

  /** Whether the connection is up now. */
  get connected(): boolean {
    return this.client.status === 'ready';
  }

  /** The breaker state; with a cluster, the worst node's. */
  get state(): BreakerState {
    return this.breakers.state;
  }

  /** Runs `call`, whose one key is `key` (prefix included): that key's node decides whether it may. */
  async run<T>(op: string, key: string, call: (client: RedisClient) => Promise<T>): Promise<T | undefined> {
    this.#failures.tick();
    // Before the first connection completes, calls would fail for a reason that says nothing
    // about Redis's health; they must not open the breaker on every start-up.
    if (!this.#everReady) return this.#skipped();
    return insured<T | undefined>(this.breakers.for(key), () => call(this.client), () => undefined, {
      skipped: () => this.#skipped(),
      failed: (error) => {
        this.stats.errors++;
        this.#failures.failure(op, error instanceof Error ? error.message : String(error));
      },
    });
  }

  #skipped(): undefined {
    this.stats.skipped++;
    return undefined;
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
      this.stats.cleanupErrors++;
      this.#logger.debug({ op, reason: error instanceof Error ? error.message : String(error) }, 'redis cleanup failed');
    });
  }

  async close(): Promise<void> {
    this.#failures.flush();
    // quit() waits for a reply a dead Redis never sends; disconnect() does not.
    this.client.disconnect();
  }
}
