import { hash } from 'node:crypto';
import type { Dispatcher } from 'undici';
import { KeyStore } from '../auth/key-store.js';
import type { SharedVerdicts } from '../auth/shared-verdicts.js';
import { UpstreamVerifier, VerdictBook } from '../auth/upstream-verifier.js';
import type { Clock } from '../clock.js';
import type { Config } from '../config/types.js';
import type { Logger } from '../logging/logger.js';
import type { PerchMetrics } from '../metrics/metrics.js';
import type { Timers } from '../timers.js';
import type { BudgetBook } from '../upstream/budget-book.js';
import type { ProviderState } from '../upstream/guard/provider-state.js';
import { GuardQueues } from '../upstream/guard.js';
import { UpstreamSet } from '../upstream/upstream-set.js';
import { restartNeeded } from './reload-scope.js';

/** What a reload replaces: everything derived from keys, TTLs, routes and upstreams. */
export interface RuntimeSnapshot {
  readonly config: Config;
  readonly keys: KeyStore;
  /**
   * Pass-through auth (`auth.mode: upstream`): what the provider said about each forwarded key.
   * A reload keeps the verdicts unless it changes a provider (an upstream's kind or url).
   */
  readonly verifier?: UpstreamVerifier;
  /** The verdicts behind `verifier`, for the next reload to keep. */
  readonly verdicts?: VerdictBook;
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
  /** Pass-through verdicts shared with the fleet (`rate_limits_redis`, else `cache.redis`); absent without Redis. */
  readonly sharedVerdicts?: SharedVerdicts;
}

/**
 * The holder the request path reads its configuration-derived state from. A reload builds a
 * complete new snapshot first and then replaces the reference in one assignment, so a request
 * sees either the old state or the new one, never a mix; connections and the cache are untouched.
 */
export class Runtime {
  #current: RuntimeSnapshot;
  /** The configuration the process started with: what the settings a reload cannot change run at. */
  readonly #started: Config;
  readonly #options: RuntimeOptions;
  /** Waiters outlive the upstream set they queued in: a reload's caps apply to them at once. */
  readonly #queues = new GuardQueues();
  #reload: ReloadStatus;

  constructor(config: Config, options: RuntimeOptions) {
    this.#options = options;
    this.#started = config;
    this.#current = this.#build(config, undefined);
    // As Prometheus does for its own: the start-up load counts as the first successful one.
    this.#reload = { successful: true, lastSuccessMs: options.clock.now() };
  }

  get current(): RuntimeSnapshot {
    return this.#current;
  }

  /**
   * The start-up configuration, whose `NEEDS_RESTART` settings (listeners, stores, the memory
   * cache's size) are those in effect whatever reloads came since.
   */
  get started(): Config {
    return this.#started;
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
    this.#current = this.#build(config, previous);
    this.#reload = { successful: true, lastSuccessMs: this.#options.clock.now() };
    const { logger } = this.#options;
    logger.level = config.log.level;
    // Against what runs, not the previous reload: a value put back is no change, and a value
    // changed twice is still waiting.
    const ignored = restartNeeded(this.#started, config);
    if (ignored.length > 0) logger.warn({ settings: ignored }, 'reload: these settings take effect only after a restart');
    previous.upstreams.close().catch((error: unknown) => logger.error({ err: error }, 'reload: error closing old upstreams'));
  }

  /** Closes the current upstream pools (shutdown). */
  close(): Promise<void> {
    return this.#current.upstreams.close();
  }

  #build(config: Config, previous: RuntimeSnapshot | undefined): RuntimeSnapshot {
    const { clock, timers, logger, dispatchers, metrics, providerState, random, budgets } = this.#options;
    const queues = this.#queues;
    return {
      config,
      keys: new KeyStore(config.auth.keys, { clock, logger, list: 'auth.keys', ...(previous === undefined ? {} : { previous: previous.keys }) }),
      ...(config.auth.mode === 'upstream' ? this.#verification(config, previous?.verdicts) : {}),
      // A store of their own, so neither kind of key opens the other's door. KeyStore carries a
      // plan for client keys; admin keys have none, and nothing reads it.
      ...(config.admin === undefined
        ? {}
        : {
            adminKeys: new KeyStore(
              config.admin.keys.map((key) => ({ ...key, plan: '' })),
              { clock, logger, list: 'admin.keys', ...(previous?.adminKeys === undefined ? {} : { previous: previous.adminKeys }) },
            ),
          }),
      upstreams: new UpstreamSet(config, { clock, timers, logger, state: providerState, dispatchers, metrics, random, budgets, queues }),
    };
  }

  /**
   * Pass-through verification. What a provider said of a key stays true through a change of
   * plans, budgets or TTLs (an acceptance is dated, and its TTL read when it is used), so the
   * verdicts are kept unless the providers change: another kind or url behind any upstream.
   */
  #verification(config: Config, previous: VerdictBook | undefined): Pick<RuntimeSnapshot, 'verifier' | 'verdicts'> {
    const { clock, sharedVerdicts } = this.#options;
    const providers = providersOf(config);
    const remembered = config.auth.remembered_keys;
    // Kept, not copied: the calls under way write their verdicts into it, whichever verifier made them.
    const verdicts = previous?.providers === providers ? previous : new VerdictBook(remembered, providers);
    verdicts.remember(remembered);
    // The turn outlasts the call it covers: its whole miss deadline, and a second to tell the verdict.
    const fleet = sharedVerdicts === undefined ? undefined : { store: sharedVerdicts, turnMs: config.server.miss_deadline_ms + 1000 };
    return { verifier: new UpstreamVerifier(config.auth, clock, verdicts, fleet), verdicts };
  }
}

/** Names the providers behind the upstreams (each one's name, kind and url): the judges of pass-through keys. */
function providersOf(config: Config): string {
  const providers = Object.entries(config.upstreams)
    .map(([name, upstream]) => [name, upstream.kind, 'url' in upstream ? upstream.url : ''])
    .sort(([a], [b]) => (a! < b! ? -1 : 1));
  return hash('sha256', JSON.stringify(providers), 'hex').slice(0, 16);
}
