import { ConfigError, loadConfigFile } from '../config/load.js';
import type { LineBatcher } from '../logging/line-batcher.js';
import type { Logger } from '../logging/logger.js';
import type { Perch } from './perch.js';

export interface SignalOptions {
  readonly perch: Perch;
  readonly logger: Logger;
  /** Re-read on SIGHUP. */
  readonly configPath: string;
  readonly env: NodeJS.ProcessEnv;
  /**
   * A worker of `perch --workers`: stops and reloads come from the primary (workers.ts) as
   * messages, and the signals themselves are ignored. A terminal's Ctrl-C reaches the whole
   * process group, so a worker that heeded it and the primary's word would see a second stop.
   * A primary gone (its channel closed) is a stop.
   */
  readonly fromPrimary?: boolean;
}

/** What the primary of `perch --workers` sends its workers, and a worker's word that it listens for them. */
export const WORKER_STOP = 'perch:stop';
export const WORKER_RELOAD = 'perch:reload';
export const WORKER_READY = 'perch:ready';

/**
 * How long a second stop signal waits for the log's last lines. A stdout nobody reads (a stalled
 * pipe) never takes them, and an exit would wait for the write stuck in it: Node joins the thread
 * that writes before the process ends.
 */
const LAST_LINES_MS = 500;

/**
 * SIGTERM and SIGINT drain and exit 0 (1 if stopping failed); a second one exits at once (1), for
 * an operator who does not want to wait out the grace period, after the log's last lines, or
 * within LAST_LINES_MS without them when stdout does not take them: then the signal ends the
 * process as it ends one with no handler. SIGHUP reloads the configuration file; a file with
 * problems changes nothing and each problem is logged.
 */
export function handleSignals(options: SignalOptions): void {
  const { perch, logger } = options;
  let stopping = false;
  const stop = (signal: NodeJS.Signals) => {
    if (stopping) {
      logger.warn({ signal }, 'second stop signal: exiting without waiting for requests');
      setTimeout(() => {
        process.off('SIGTERM', stop);
        process.off('SIGINT', stop);
        process.kill(process.pid, signal);
      }, LAST_LINES_MS);
      logger.flush(() => process.exit(1));
      return;
    }
    stopping = true;
    logger.info({ signal }, 'perch stopping: draining in-flight requests');
    perch.close().then(
      () => {
        logger.info('perch stopped');
        logger.flush(() => process.exit(0));
      },
      (error: unknown) => {
        logger.error({ err: error }, 'error while stopping');
        logger.flush(() => process.exit(1));
      },
    );
  };
  const reloadUnlessStopping = () => {
    if (!stopping) reload(options);
  };
  if (options.fromPrimary === true) {
    for (const signal of ['SIGTERM', 'SIGINT', 'SIGHUP'] as const) process.on(signal, () => undefined);
    process.on('message', (message: unknown) => {
      if (message === WORKER_STOP) stop('SIGTERM');
      else if (message === WORKER_RELOAD) reloadUnlessStopping();
    });
    process.on('disconnect', () => {
      if (!stopping) stop('SIGTERM');
    });
    process.send!(WORKER_READY);
    return;
  }
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
  process.on('SIGHUP', reloadUnlessStopping);
}

/**
 * An uncaught exception (or an unhandled rejection) ends perch with status 1, as Node's default
 * does, but first the fatal line and every line still in the log's batch (up to 100 ms of access
 * lines) are written synchronously: the asynchronous flush would never run. A stdout that refuses
 * the write loses those lines rather than hold the exit; one that blocks (a full pipe in blocking
 * mode) holds it until it takes them.
 */
export function exitOnCrash(logger: Logger, sink: LineBatcher): void {
  process.on('uncaughtException', (error, origin) => {
    logger.fatal({ err: error, origin }, 'uncaught exception: exiting');
    sink.flushSync();
    process.exit(1);
  });
}

function reload({ perch, logger, configPath, env }: SignalOptions): void {
  try {
    perch.reload(loadConfigFile(configPath, env));
    logger.info({ config: configPath }, 'configuration reloaded');
  } catch (error) {
    perch.reloadFailed();
    if (!(error instanceof ConfigError)) {
      logger.error({ err: error, config: configPath }, 'reload failed: keeping the running configuration');
      return;
    }
    for (const problem of error.problems) logger.error({ config: configPath, problem }, 'reload: configuration problem');
    logger.error({ config: configPath, problems: error.problems.length }, 'reload failed: keeping the running configuration');
  }
}
