import cluster, { type Worker } from 'node:cluster';
import { WORKER_READY, WORKER_RELOAD, WORKER_STOP } from './app/signals.js';
import type { Config } from './config/types.js';
import { createLogger } from './logging/logger.js';

/** Set in a worker's environment: which worker it is, from 1. */
export const WORKER_ENV = 'PERCH_WORKER';

/** A worker that dies is started again after this, doubled for each quick death in a row. */
const FIRST_RESTART_MS = 100;
const MAX_RESTART_MS = 10_000;
/** A worker that served this long before dying died of something new: its backoff starts over. */
const HEALTHY_MS = 10_000;

/**
 * Why `perch --workers N` cannot serve `config`, or undefined. Each worker is a whole perch with
 * its own memory: limits kept in memory would be N times the plan, and a port of 0 would give
 * each worker a port of its own.
 */
export function workersProblem(config: Config, workers: number): string | undefined {
  if (workers === 1) return undefined;
  if (config.rate_limits_redis === undefined && config.cache.redis === undefined) {
    return `--workers ${workers} needs Redis for the rate limits (rate_limits_redis or cache.redis): without it each worker would enforce every plan in full by itself`;
  }
  if (config.server.port === 0) return `--workers ${workers} needs a fixed server.port: with port 0 each worker would pick a port of its own`;
  const metricsPort = config.metrics.port;
  if (metricsPort !== undefined && metricsPort !== 0 && metricsPort + workers - 1 > 65_535) {
    return `--workers ${workers} serves metrics on metrics.port to metrics.port + ${workers - 1}, past 65535`;
  }
  return undefined;
}

/**
 * The primary of `perch --workers N`, with node:cluster: it forks N workers, each a whole perch
 * that binds the port itself (SO_REUSEPORT, so the kernel spreads connections and no primary
 * sits in the request path), and only watches them. A worker that dies is started again with
 * backoff. SIGTERM and SIGINT stop every worker (a second one makes them exit at once), SIGHUP
 * reloads every worker; the workers hear both from here alone (signals.ts), and the primary exits
 * once the last worker has, 0 when every one stopped cleanly.
 */
export function supervise(config: Config, workers: number): void {
  const logger = createLogger(config.log).child({ worker: 0 });
  const live = new Map<number, Worker>();
  /** Workers that have set up their message handling: a message sent earlier would be lost. */
  const ready = new Set<Worker>();
  const quickDeaths = new Map<number, number>();
  const restarts = new Set<NodeJS.Timeout>();
  let stopping = false;
  let failed = false;

  const finish = () => {
    logger.info('perch stopped');
    logger.flush(() => process.exit(failed ? 1 : 0));
  };
  const start = (index: number) => {
    const worker = cluster.fork({ [WORKER_ENV]: String(index) });
    const startedAt = performance.now();
    live.set(index, worker);
    logger.info({ worker: index, pid: worker.process.pid }, 'worker started');
    worker.on('message', (message: unknown) => {
      if (message !== WORKER_READY) return;
      ready.add(worker);
      // A stop it missed while it started. A reload it need not hear: it read the file at its start.
      if (stopping) worker.send(WORKER_STOP);
    });
    worker.on('exit', (code, signal) => {
      live.delete(index);
      ready.delete(worker);
      if (stopping) {
        if (code !== 0) failed = true;
        if (live.size === 0) finish();
        return;
      }
      const deaths = performance.now() - startedAt < HEALTHY_MS ? (quickDeaths.get(index) ?? 0) + 1 : 1;
      quickDeaths.set(index, deaths);
      const delay = Math.min(MAX_RESTART_MS, FIRST_RESTART_MS * 2 ** (deaths - 1));
      logger.error({ worker: index, pid: worker.process.pid, code, signal, restart_in_ms: delay }, 'worker exited: starting it again');
      const timer = setTimeout(() => {
        restarts.delete(timer);
        start(index);
      }, delay);
      restarts.add(timer);
    });
  };

  const stop = (signal: NodeJS.Signals) => {
    if (stopping) logger.warn({ signal }, 'second stop signal: workers exit without waiting for requests');
    else logger.info({ signal, workers: live.size }, 'perch stopping: draining in-flight requests');
    stopping = true;
    for (const timer of restarts) clearTimeout(timer);
    restarts.clear();
    if (live.size === 0) return finish();
    for (const worker of ready) worker.send(WORKER_STOP);
  };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
  process.on('SIGHUP', () => {
    if (stopping) return;
    logger.info({ workers: live.size }, 'reloading every worker');
    for (const worker of ready) worker.send(WORKER_RELOAD);
  });
  for (let index = 1; index <= workers; index++) start(index);
}
