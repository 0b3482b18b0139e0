import { fork, type ChildProcess } from 'node:child_process';
import { createServer } from 'node:net';
import { WORKER_ENV, WORKER_READY, type PrimaryMessage } from './app/primary-link.js';
import { LAST_LINES_MS } from './app/signals.js';
import { ConfigError, loadConfigFile } from './config/load.js';
import type { Config } from './config/types.js';
import { LineBatcher } from './logging/line-batcher.js';
import { createLogger } from './logging/logger.js';

/** A worker that dies is started again after this, doubled for each quick death in a row. */
const FIRST_RESTART_MS = 100;
const MAX_RESTART_MS = 10_000;
/** A worker that served this long before dying died of something new: its backoff starts over. */
const HEALTHY_MS = 10_000;
/** A worker that dies this many times in a row before it listens will not start: perch stops. */
export const MAX_START_FAILURES = 5;
/** After the drain's grace, how long the primary waits for workers before it kills them. */
const KILL_AFTER_GRACE_MS = 3000;

/**
 * Why `perch --workers N` cannot serve `config`, or undefined. Each worker is a whole perch with
 * its own memory: limits kept in memory would be N times the plan, and a port of 0 would give
 * each worker a port of its own.
 */
export function workersProblem(config: Config, workers: number): string | undefined {
  if (workers > 1) {
    // Rate limits alone in Redis are not enough: a purge and a shared flight reach the other
    // workers through the cache's Redis, so without it each worker calls the provider for a key
    // by itself and keeps serving what another worker purged.
    if (config.cache.redis === undefined) {
      return `--workers ${workers} needs cache.redis: each worker has a memory cache of its own, and only through the shared cache do purges, shared flights and the rate limits reach every worker`;
    }
    if (config.server.port === 0) return `--workers ${workers} needs a fixed server.port: with port 0 each worker would pick a port of its own`;
  }
  return portProblem(config, workers);
}

/** A port the listeners of `workers` processes would each want twice, or past 65535. */
function portProblem(config: Config, workers: number): string | undefined {
  const metricsPort = config.metrics.port;
  if (metricsPort === undefined || metricsPort === 0) return undefined;
  if (metricsPort + workers - 1 > 65_535) return `--workers ${workers} serves metrics on metrics.port to metrics.port + ${workers - 1}, past 65535`;
  const apiPort = config.server.port;
  if (apiPort >= metricsPort && apiPort <= metricsPort + workers - 1) {
    const worker = apiPort - metricsPort + 1;
    return workers === 1
      ? `metrics.port ${metricsPort} is server.port: the metrics listener needs a port of its own`
      : `port ${apiPort} is both server.port and worker ${worker}'s metrics port (metrics.port ${metricsPort} + ${worker - 1}): with --workers ${workers} the metrics take ports ${metricsPort}-${metricsPort + workers - 1}`;
  }
  return undefined;
}

interface Slot {
  child: ChildProcess;
  /** It said it listens: its death from now on is not a failure to start. */
  ready: boolean;
}

/**
 * The primary of `perch --workers N`: it forks N workers (node:child_process), each a whole perch
 * that binds the port itself with SO_REUSEPORT, so the kernel spreads connections and no primary
 * sits in the request path, and only watches them. Not node:cluster: a cluster worker exits the
 * moment its primary's channel closes, cutting every request in flight; a perch worker drains.
 *
 * The primary alone reads the configuration file and hands it to each worker, so a worker
 * started again runs what the others run: the start's configuration, and the last one a SIGHUP
 * reloaded. A worker that dies is started again with backoff; one that dies
 * MAX_START_FAILURES times in a row before it listens will not start, and perch stops, status 1.
 * SIGTERM and SIGINT stop every worker, starting or serving (a second one makes them exit at
 * once; past the grace period they are killed), SIGHUP reloads every worker; the workers hear
 * both from here alone (app/signals.ts), and the primary exits once the last worker has, 0 when
 * every one stopped cleanly.
 */
export async function supervise(config: Config, configPath: string, workers: number): Promise<void> {
  // The primary's own lines say worker 0; its lines about a worker name that worker instead, so
  // no line carries the key twice.
  const log = createLogger(config.log, new LineBatcher(1, { atomicLines: true }));
  const self = log.child({ worker: 0 });
  const taken = config.server.reuse_port ? undefined : await portTaken(config.server.port, config.server.host);
  if (taken !== undefined) {
    self.fatal(`perch could not start: ${taken}`);
    self.flush(() => process.exit(1));
    return;
  }
  const slots = new Map<number, Slot>();
  const quickDeaths = new Map<number, number>();
  const startFailures = new Map<number, number>();
  const restarts = new Set<NodeJS.Timeout>();
  let reloaded: Config | undefined;
  let stopping: NodeJS.Signals | undefined;
  let failed = false;

  const send = (child: ChildProcess, message: PrimaryMessage) => {
    // A worker that has just died: its exit is handled on its own.
    if (child.connected) child.send(message, (error) => void error);
  };
  const finish = () => {
    self.info('perch stopped');
    // A stdout nobody reads (a stalled pipe) never takes the last lines, and an exit would wait
    // for the write stuck in it: past LAST_LINES_MS the primary ends by a signal instead, the
    // stop's own when it stopped cleanly (as a process with no handler would), else SIGKILL.
    setTimeout(() => {
      process.off('SIGTERM', stop);
      process.off('SIGINT', stop);
      process.kill(process.pid, failed ? 'SIGKILL' : (stopping ?? 'SIGTERM'));
    }, LAST_LINES_MS);
    self.flush(() => process.exit(failed ? 1 : 0));
  };
  const start = (index: number) => {
    const child = fork(process.argv[1]!, process.argv.slice(2), {
      env: { ...process.env, [WORKER_ENV]: String(index) },
      serialization: 'advanced',
    });
    const slot: Slot = { child, ready: false };
    const startedAt = performance.now();
    slots.set(index, slot);
    log.info({ worker: index, pid: child.pid }, 'worker started');
    child.on('error', (error) => log.error({ worker: index, err: error }, 'worker channel error'));
    send(child, reloaded === undefined ? { kind: 'start', config } : { kind: 'start', config, reloaded });
    // A stop it would miss while it starts: the worker keeps it until it serves, then drains.
    if (stopping !== undefined) send(child, { kind: 'stop' });
    child.on('message', (message: unknown) => {
      if ((message as typeof WORKER_READY | undefined)?.kind !== WORKER_READY.kind) return;
      slot.ready = true;
      startFailures.delete(index);
    });
    child.on('exit', (code, signal) => {
      slots.delete(index);
      if (stopping !== undefined) {
        if (code !== 0) failed = true;
        if (slots.size === 0) finish();
        return;
      }
      if (!slot.ready) {
        const failures = (startFailures.get(index) ?? 0) + 1;
        startFailures.set(index, failures);
        if (failures >= MAX_START_FAILURES) {
          log.fatal({ worker: index, pid: child.pid, code, signal, failures }, `worker ${index} failed to start ${failures} times in a row: perch stops (its own lines say why)`);
          failed = true;
          stop('SIGTERM');
          return;
        }
      }
      const deaths = performance.now() - startedAt < HEALTHY_MS ? (quickDeaths.get(index) ?? 0) + 1 : 1;
      quickDeaths.set(index, deaths);
      const delay = Math.min(MAX_RESTART_MS, FIRST_RESTART_MS * 2 ** (deaths - 1));
      log.error({ worker: index, pid: child.pid, code, signal, restart_in_ms: delay }, 'worker exited: starting it again');
      const timer = setTimeout(() => {
        restarts.delete(timer);
        start(index);
      }, delay);
      restarts.add(timer);
    });
  };

  const stop = (signal: NodeJS.Signals) => {
    if (stopping !== undefined) self.warn({ signal }, 'second stop signal: workers exit without waiting for requests');
    else {
      self.info({ signal, workers: slots.size }, 'perch stopping: draining in-flight requests');
      // A worker that cannot stop (stuck in its start, or ignoring its channel) does not hold
      // the primary past the grace period (the start's: shutdown_grace_ms needs a restart).
      setTimeout(() => {
        for (const [index, { child }] of slots) {
          log.error({ worker: index, pid: child.pid }, 'worker still running after the grace period: killed');
          child.kill('SIGKILL');
        }
      }, config.server.shutdown_grace_ms + KILL_AFTER_GRACE_MS);
    }
    stopping ??= signal;
    for (const timer of restarts) clearTimeout(timer);
    restarts.clear();
    if (slots.size === 0) return finish();
    for (const { child } of slots.values()) send(child, { kind: 'stop' });
  };
  const reload = () => {
    if (stopping !== undefined) return;
    let next: Config;
    try {
      next = loadConfigFile(configPath, process.env);
    } catch (error) {
      const problems = error instanceof ConfigError ? error.problems : [error instanceof Error ? error.message : String(error)];
      for (const problem of problems) self.error({ config: configPath, problem }, 'reload: configuration problem');
      for (const { child } of slots.values()) send(child, { kind: 'reload_failed' });
      return;
    }
    reloaded = next;
    self.info({ workers: slots.size }, 'reloading every worker');
    for (const { child } of slots.values()) send(child, { kind: 'reload', config: next });
  };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
  process.on('SIGHUP', reload);
  for (let index = 1; index <= workers; index++) start(index);
}

/**
 * Why the port is not free, or undefined. The workers bind it with SO_REUSEPORT, which a port
 * held by another process that set it too (another `perch --workers` started by mistake, or
 * leftover) accepts without a word: the kernel would then spread connections over both fleets.
 * So the primary first binds it without, which any holder refuses, and lets it go.
 */
function portTaken(port: number, host: string): Promise<string | undefined> {
  return new Promise((resolve) => {
    const probe = createServer();
    // Any other refusal (a port below 1024, an address not on this host) every worker would meet.
    probe.once('error', (error: NodeJS.ErrnoException) =>
      resolve(error.code === 'EADDRINUSE' ? `${error.message}: another process serves it (another perch --workers?); server.reuse_port: true shares it on purpose` : error.message),
    );
    probe.listen({ port, host, exclusive: true }, () => probe.close(() => resolve(undefined)));
  });
}
