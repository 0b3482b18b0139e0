import type { IncomingMessage, Server, ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Dispatcher } from 'undici';
import { PurgeRoute } from '../admin/purge.js';
import { SharedVerdicts } from '../auth/shared-verdicts.js';
import { StatusRoute } from '../admin/status.js';
import { createCache } from '../cache/create-cache.js';
import { ReadThrough } from '../cache/read-through.js';
import type { TieredCache } from '../cache/tiered-cache.js';
import { systemClock, type Clock } from '../clock.js';
import type { Config } from '../config/types.js';
import type { Logger } from '../logging/logger.js';
import { PerchMetrics } from '../metrics/metrics.js';
import { RateLimits } from '../ratelimit/rate-limits.js';
import { systemTimers, type Timers } from '../timers.js';
import { tracingSettings } from '../tracing/settings.js';
import { createTracing } from '../tracing/tracing.js';
import { BudgetBook } from '../upstream/budget-book.js';
import { createProviderState } from '../upstream/guard/create-provider-state.js';
import { createApiServer, createMetricsServer, drain } from '../server/listener.js';
import { operationalRoute, type OperationalRoute } from '../url-table.js';
import { openRedis } from './redis-connections.js';
import { PublicRoutes } from './public-routes.js';
import { createRequestHandler } from './request-handler.js';
import { Runtime } from './runtime.js';

export interface PerchOptions {
  readonly config: Config;
  readonly logger: Logger;
  /** Default: the system clock. */
  readonly clock?: Clock;
  /** Default: the system timers. Tests pass a ManualClock for both. */
  readonly timers?: Timers;
  /** Per-upstream undici dispatcher overrides, by upstream name. */
  readonly dispatchers?: Readonly<Record<string, Dispatcher>>;
  /** The upstream throttles' shedding draw, [0, 1); default Math.random. Tests fix it. */
  readonly random?: () => number;
  /**
   * Where the standard `OTEL_*` variables are read when the config has no `tracing` section;
   * default none (the command passes the process's environment).
   */
  readonly env?: NodeJS.ProcessEnv;
  /** How long a span waits in the export batch; default the SDK's 5000 ms. Tests shorten it. */
  readonly traceExportDelayMs?: number;
  /** Most spans in one export; default the SDK's 512. Tests set 1 to export span by span. */
  readonly traceExportBatchSize?: number;
  /**
   * Which worker of `perch --workers` this is, from 1: it shares the API port with the others
   * (SO_REUSEPORT), and serves `metrics.port` plus its number less one, so each can be scraped.
   */
  readonly worker?: number;
}

export interface Perch {
  readonly server: Server;
  /** Both cache tiers; `redisState` and `redisStats` are for metrics. */
  readonly cache: TieredCache;
  /** This instance's metrics (its own registry). */
  readonly metrics: PerchMetrics;
  /** Binds `server.host:server.port` (port 0 picks one) and resolves with the address. */
  listen(): Promise<AddressInfo>;
  /** The `metrics.port` listener's address once listening; undefined without `metrics.port`. */
  metricsAddress(): AddressInfo | undefined;
  /**
   * Applies a new validated config (SIGHUP): keys, plans' TTLs, routes and upstreams change for
   * the next request; connections and the cache stay. See `Runtime` for what needs a restart.
   */
  reload(config: Config): void;
  /**
   * Records a reload whose configuration was refused: the running configuration keeps serving,
   * and metrics and `/readyz` say the file on disk is not what runs.
   */
  reloadFailed(): void;
  /**
   * Stops accepting, lets in-flight requests finish within `server.shutdown_grace_ms`, closes
   * the connections left, then releases upstream connections and Redis, and exports the spans
   * still buffered, within what is left of the grace.
   */
  close(): Promise<void>;
}

/**
 * How long an instance with a Redis tier waits, before it listens, for the purge counters'
 * first resync: long enough for a Redis that answers, short enough not to hold up a start
 * against a slow one (a Redis that refuses the connection ends the wait at once).
 */
const START_SYNC_MS = 2000;

/** Wires one perch instance from a validated config. Nothing here is global, so tests run many. */
export function createPerch(options: PerchOptions): Perch {
  const { config, logger } = options;
  const clock = options.clock ?? systemClock;
  const timers = options.timers ?? systemTimers;
  const metrics = new PerchMetrics();
  const redis = openRedis(config, { clock, logger });
  const tiers = createCache(config, { clock, logger, ...(redis.cache === undefined ? {} : { redis: redis.cache }) });
  const rateLimits = new RateLimits(config, { clock, timers, logger, ...(redis.limits === undefined ? {} : { redis: redis.limits }) });
  const providerState = createProviderState({ clock, timers, logger, ...(redis.providerGuard === undefined ? {} : { redis: redis.providerGuard }) });
  const budgets = new BudgetBook(clock);
  const settings = tracingSettings(config.tracing, options.env ?? {});
  const tracing = settings === undefined ? undefined : createTracing(settings, { clock, logger, exportDelayMs: options.traceExportDelayMs, exportBatchSize: options.traceExportBatchSize });
  // Pass-through verdicts live beside the token buckets: the fleet's turns are a rate limit too.
  // Made whatever the mode, which a reload may change.
  const sharedVerdicts = redis.limits === undefined ? undefined : new SharedVerdicts(redis.limits.guard, redis.limits.settings.prefix);
  const runtime = new Runtime(config, { clock, timers, logger, metrics, providerState, dispatchers: options.dispatchers, random: options.random, budgets, sharedVerdicts });
  const readThrough = new ReadThrough({
    live: runtime,
    cache: tiers.cache,
    ...(tiers.sharedFlights === undefined ? {} : { sharedFlights: tiers.sharedFlights }),
    clock,
    logger,
    verifyTurn: (line, source, subject) => rateLimits.verificationTurn(runtime.current.config, line, source, subject),
  });
  const handler = createRequestHandler({ live: runtime, cache: readThrough, rateLimits, budgets, logger, metrics, tracing });
  metrics.addCacheTier(tiers.cache.memory);
  metrics.addEvictionCount(() => tiers.cache.memory.evictions);
  metrics.addSlabMetrics(() => tiers.cache.memory.slabs);
  metrics.addBudgetGauges(() => budgets.all());
  metrics.addSecretUseGauge(() => runtime.current.keys.uses());
  metrics.addPassThroughGauge(() => runtime.current.verifier?.held());
  metrics.addThrottleGauge(() => Object.fromEntries(Object.entries(runtime.current.upstreams.status()).map(([name, status]) => [name, status.throttle])));
  // Prometheus's own names for the same facts (prometheus_config_last_reload_*), so alerts carry over.
  metrics.addStateGauge('perch_config_last_reload_successful', 'Whether the latest configuration load (start-up or SIGHUP) succeeded (1) or was refused (0).', () =>
    runtime.reloadStatus.successful ? 1 : 0,
  );
  metrics.addStateGauge(
    'perch_config_last_reload_success_timestamp_seconds',
    'When the running configuration was loaded, in seconds since the epoch.',
    () => runtime.reloadStatus.lastSuccessMs / 1000,
  );
  const routes = new PublicRoutes({ runtime, metrics, logger });
  if (tiers.cache.shared) {
    // Up means connected now and not bypassed: a Redis never reached since boot has a closed
    // breaker (nothing failed yet) but serves nothing.
    const redisUp = () => tiers.cache.redisConnected === true && tiers.cache.redisState === 'closed';
    metrics.addStateGauge('perch_redis_up', 'Whether the Redis cache tier is connected and answers (1) or not (0).', () => (redisUp() ? 1 : 0));
    routes.addReadinessCheck('redis', redisUp);
  }
  const purge = new PurgeRoute({ runtime, cache: tiers.cache, metrics, logger });
  const status = new StatusRoute({ runtime, cache: tiers.cache, metrics, logger });
  // Metrics on the API listener unless `metrics.port` gives them their own.
  const metricsHere = config.metrics.port === undefined;
  const operational = (route: OperationalRoute, req: IncomingMessage, res: ServerResponse): boolean => {
    switch (route) {
      case 'purge':
        return purge.handle(req, res);
      case 'status_page':
      case 'status_json':
        return status.handle(route === 'status_page', req, res);
      default:
        routes.handle(route, req, res);
        return true;
    }
  };
  const server = createApiServer(
    config.server,
    (req, res) => {
      const route = operationalRoute(req.url ?? '/', metricsHere ? runtime.current.config.metrics.path : undefined);
      if (route === undefined || !operational(route, req, res)) handler(req, res);
    },
    logger,
    tiers.cache.memory.grace,
  );
  const metricsServer = config.metrics.port === undefined ? undefined : createMetricsServer((req, res) => routes.handleMetricsOnly(req, res));

  return {
    server,
    cache: tiers.cache,
    metrics,
    listen: async () => {
      const { worker } = options;
      const waiting = performance.now();
      if (!(await tiers.cache.started(START_SYNC_MS))) {
        logger.warn({ waited_ms: Math.round(performance.now() - waiting) }, 'listening before the cache purge counters synced: until they are, each Redis read reads them too and nothing is written to Redis');
      }
      const metricsPort = config.metrics.port === undefined || config.metrics.port === 0 ? 0 : config.metrics.port + (worker ?? 1) - 1;
      if (metricsServer !== undefined) await bind(metricsServer, metricsPort, config.server.host, false);
      return bind(server, config.server.port, config.server.host, config.server.reuse_port || worker !== undefined);
    },
    metricsAddress: () => (metricsServer?.listening === true ? (metricsServer.address() as AddressInfo) : undefined),
    reload: (next) => {
      runtime.replace(next);
      rateLimits.reload(next);
      tiers.cache.staleMs = next.cache.stale_seconds * 1000;
    },
    reloadFailed: () => runtime.rejected(),
    close: async () => {
      const grace = config.server.shutdown_grace_ms;
      const deadline = performance.now() + grace;
      await Promise.all([drain(server, grace), metricsServer === undefined ? undefined : drain(metricsServer, grace)]);
      // Upstream exchanges still running past the grace period serve nobody now: not waited for.
      // The spans buffered for export go out meanwhile, within the same grace.
      await Promise.all([
        within(runtime.close(), deadline - performance.now()),
        tracing === undefined ? undefined : within(tracing.close(), deadline - performance.now()),
      ]);
      // Entries answered but not yet in Redis: the next instance to miss them would call again.
      await within(tiers.cache.settled(), deadline - performance.now());
      // Leased tokens this instance will not spend: the other instances may.
      await within(rateLimits.close(), deadline - performance.now());
      tiers.cache.close();
      await providerState.close();
      await redis.close();
    },
  };
}

/**
 * `reusePort`: SO_REUSEPORT, so that other processes may bind the same port and the kernel
 * spreads connections over them (each worker of `perch --workers` binds the port itself this way).
 * `exclusive`: never share a socket through a node:cluster primary.
 */
function bind(server: Server, port: number, host: string, reusePort: boolean): Promise<AddressInfo> {
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen({ port, host, reusePort, exclusive: true }, () => {
      server.off('error', reject);
      resolve(server.address() as AddressInfo);
    });
  });
}

/** Waits for `work` at most `ms`; the work goes on unobserved after that. */
async function within(work: Promise<void>, ms: number): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  const expired = new Promise<void>((resolve) => (timer = setTimeout(resolve, Math.max(0, ms))));
  // A failure after the deadline has nobody left to report to.
  work.catch(() => undefined);
  try {
    await Promise.race([work, expired]);
  } finally {
    clearTimeout(timer);
  }
}
