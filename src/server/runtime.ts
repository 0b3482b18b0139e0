import type { Dispatcher } from 'undici';
import { KeyStore } from '../auth/key-store.js';
import type { Clock } from '../clock.js';
import type { Config } from '../config/types.js';
import type { Logger } from '../observability/logger.js';
import type { PerchMetrics } from '../observability/metrics.js';
import { UpstreamSet } from '../upstream/upstream-set.js';

/** What a reload replaces: everything derived from keys, TTLs, routes and upstreams. */
export interface RuntimeSnapshot {
  readonly config: Config;
  readonly keys: KeyStore;
  /** Keys of `POST /admin/purge`; absent without an `admin` section. */
  readonly adminKeys?: KeyStore;
  readonly upstreams: UpstreamSet;
}

export interface RuntimeOptions {
  readonly clock: Clock;
  readonly logger: Logger;
  readonly metrics: PerchMetrics;
  readonly dispatchers?: Readonly<Record<string, Dispatcher>>;
}

/**
 * Sections read once when listeners and stores are built; a reload that changes them is applied
 * for the rest and logged, since honouring them would mean dropping connections or the cache.
 */
const RESTART_ONLY: readonly ((c: Config) => unknown)[] = [
  (c) => c.server,
  (c) => c.metrics,
  (c) => c.cache.memory,
  (c) => c.cache.redis,
  (c) => c.rate_limits_redis,
];
const RESTART_ONLY_NAMES = ['server', 'metrics', 'cache.memory', 'cache.redis', 'rate_limits_redis'];

/**
 * The holder the request path reads its configuration-derived state from. A reload builds a
 * complete new snapshot first and then replaces the reference in one assignment, so a request
 * sees either the old state or the new one, never a mix; connections and the cache are untouched.
 */
export class Runtime {
  #current: RuntimeSnapshot;
  readonly #options: RuntimeOptions;

  constructor(config: Config, options: RuntimeOptions) {
    this.#options = options;
    this.#current = this.#build(config);
  }

  get current(): RuntimeSnapshot {
    return this.#current;
  }

  /**
   * Swaps in `config`. Plans need nothing here: the rate limiter compiles a plan from the live
   * config on first use. The old upstream pools close in the background once the fetches already
   * using them finish, so a reload never cuts a request short.
   */
  replace(config: Config): void {
    const previous = this.#current;
    this.#current = this.#build(config);
    const { logger } = this.#options;
    logger.level = config.log.level;
    const ignored = RESTART_ONLY_NAMES.filter(
      (_, i) => JSON.stringify(RESTART_ONLY[i]!(previous.config)) !== JSON.stringify(RESTART_ONLY[i]!(config)),
    );
    if (ignored.length > 0) logger.warn({ sections: ignored }, 'reload: these sections take effect only after a restart');
    previous.upstreams.close().catch((error: unknown) => logger.error({ err: error }, 'reload: error closing old upstreams'));
  }

  /** Closes the current upstream pools (shutdown). */
  close(): Promise<void> {
    return this.#current.upstreams.close();
  }

  #build(config: Config): RuntimeSnapshot {
    const { clock, dispatchers, metrics } = this.#options;
    return {
      config,
      keys: new KeyStore(config.auth.keys),
      // A store of their own, so neither kind of key opens the other's door. KeyStore carries a
      // plan for client keys; admin keys have none, and nothing reads it.
      ...(config.admin === undefined ? {} : { adminKeys: new KeyStore(config.admin.keys.map((key) => ({ ...key, plan: '' }))) }),
      upstreams: new UpstreamSet(config, { clock, dispatchers, metrics }),
    };
  }
}
