import type { Dispatcher } from 'undici';
import { KeyStore } from '../auth/key-store.js';
import { UpstreamVerifier } from '../auth/upstream-verifier.js';
import type { Clock } from '../clock.js';
import type { Config } from '../config/types.js';
import type { Logger } from '../logging/logger.js';
import type { PerchMetrics } from '../metrics/metrics.js';
import type { Timers } from '../timers.js';
import type { BudgetBook } from '../upstream/budget-book.js';
import type { ProviderState } from '../upstream/guard/provider-state.js';
import { UpstreamSet } from '../upstream/upstream-set.js';
import { restartNeeded } from './reload-scope.js';

/** What a reload replaces: everything derived from keys, TTLs, routes and upstreams. */
export interface RuntimeSnapshot {
  readonly config: Config;
  readonly keys: KeyStore;
  /**
   * Pass-through auth (`auth.mode: upstream`): what the provider said about each forwarded key.
   * Rebuilt by a reload, so a reload forgets every verdict and keys are verified afresh.
   */
  readonly verifier?: UpstreamVerifier;
  /** Keys of `POST /admin/purge`; absent without an `admin` section. */
  readonly adminKeys?: KeyStore;
  readonly upstreams: UpstreamSet;
}

/** The outcome of the latest configuration load (start-up or SIGHUP). */
export interface ReloadStatus {
  readonly successful: boolean;
  /** When the running configuration was loaded, ms since the epoch. */
  readonly lastSuccessMs: number;
  /** When the latest reload was refused; present while `successful` is false. */
  readonly lastFailureMs?: number;
}

export interface RuntimeOptions {
  readonly clock: Clock;
  readonly logger: Logger;
  readonly metrics: PerchMetrics;
  readonly timers: Timers;
  /** Provider stops and call caps: kept across reloads, so a reload never forgets a 429. */
  readonly providerState: ProviderState;
  readonly dispatchers?: Readonly<Record<string, Dispatcher>>;
  /** The throttles' shedding draw, [0, 1); default Math.random. */
  readonly random?: () => number;
  /** Each key's provider-call budget as this instance learned it: kept across reloads. */
  readonly budgets: BudgetBook;
}

/**
 * The holder the request path reads its configuration-derived state from. A reload builds a
 * complete new snapshot first and then replaces the reference in one assignment, so a request
 * sees either the old state or the new one, never a mix; connections and the cache are untouched.
 */
export class Runtime {
  #current: RuntimeSnapshot;
  readonly #options: RuntimeOptions;
  #reload: ReloadStatus;

  constructor(config: Config, options: RuntimeOptions) {
    this.#options = options;
    this.#current = this.#build(config);
    // As Prometheus does for its own: the start-up load counts as the first successful one.
    this.#reload = { successful: true, lastSuccessMs: options.clock.now() };
  }

  get current(): RuntimeSnapshot {
    return this.#current;
  }

  /** How the latest configuration load went, for metrics and `/readyz`. */
  get reloadStatus(): ReloadStatus {
    return this.#reload;
  }

  /** Records a reload whose configuration was refused; the running one stays. */
  rejected(): void {
    this.#reload = { successful: false, lastSuccessMs: this.#reload.lastSuccessMs, lastFailureMs: this.#options.clock.now() };
  }

  /**
   * Swaps in `config` (what applies and what waits for a restart: reload-scope.ts). Plans need
   * nothing here: the rate limiter compiles a plan from the live config on first use. The old
   * upstream pools close in the background once the fetches already using them finish, so a
   * reload never cuts a request short.
   */
  replace(config: Config): void {
    const previous = this.#current;
    this.#current = this.#build(config);
    this.#reload = { successful: true, lastSuccessMs: this.#options.clock.now() };
    const { logger } = this.#options;
    logger.level = config.log.level;
    const ignored = restartNeeded(previous.config, config);
    if (ignored.length > 0) logger.warn({ settings: ignored }, 'reload: these settings take effect only after a restart');
    previous.upstreams.close().catch((error: unknown) => logger.error({ err: error }, 'reload: error closing old upstreams'));
  }

  /** Closes the current upstream pools (shutdown). */
  close(): Promise<void> {
    return this.#current.upstreams.close();
  }

  #build(config: Config): RuntimeSnapshot {
    const { clock, timers, logger, dispatchers, metrics, providerState, random, budgets } = this.#options;
    return {
      config,
      keys: new KeyStore(config.auth.keys),
      ...(config.auth.mode === 'upstream' ? { verifier: new UpstreamVerifier(config.auth, clock) } : {}),
      // A store of their own, so neither kind of key opens the other's door. KeyStore carries a
      // plan for client keys; admin keys have none, and nothing reads it.
      ...(config.admin === undefined ? {} : { adminKeys: new KeyStore(config.admin.keys.map((key) => ({ ...key, plan: '' }))) }),
      upstreams: new UpstreamSet(config, { clock, timers, logger, state: providerState, dispatchers, metrics, random, budgets }),
    };
  }
}
