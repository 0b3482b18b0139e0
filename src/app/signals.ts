import { ConfigError, loadConfigFile } from '../config/load.js';
import type { LineBatcher } from '../logging/line-batcher.js';
import type { Logger } from '../logging/logger.js';
import type { Config } from '../config/types.js';
import type { Perch } from './perch.js';
import type { PrimaryLink } from './primary-link.js';

export interface SignalOptions {
  readonly perch: Perch;
  readonly logger: Logger;
  /** Re-read on SIGHUP. */
  readonly configPath: string;
  readonly env: NodeJS.ProcessEnv;
  /**
   * A worker of `perch --workers`: stops and reloads come from the primary (workers.ts) as
   * messages, and the signals themselves are ignored while the primary is there. A terminal's
   * Ctrl-C reaches the whole process group, so a worker that heeded it and the primary's word
   * would see a second stop. A primary gone (its channel closed) is a stop: the worker drains;
   * from then on it heeds SIGTERM and SIGINT as a single perch does, the first one adding nothing
   * to the drain under way, a second ending it at once.
   */
  readonly primary?: PrimaryLink;
}

/**
 * How long a second stop signal waits for the log's last lines. A stdout nobody reads (a stalled
 * pipe) never takes them, and an exit would wait for the write stuck in it: Node joins the thread
 * that writes before the process ends.
 */
export const LAST_LINES_MS = 500;

/**
 * SIGTERM and SIGINT drain and exit 0 (1 if stopping failed); a second one exits at once (1), for
 * an operator who does not want to wait out the grace period, after the log's last lines, or
 * within LAST_LINES_MS without them when stdout does not take them: then the signal ends the
 * process as it ends one with no handler. SIGHUP reloads the configuration file; a file with
 * problems changes nothing and each problem is logged.
 */
export function handleSignals(options: SignalOptions): void {
  const { perch, logger, primary } = options;
  let stopping = false;
  let asked = 0;
  const drain = (reason: string) => {
    if (stopping) return;
    stopping = true;
    logger.info({ signal: reason }, 'perch stopping: draining in-flight requests');
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
  const now = (signal: NodeJS.Signals) => {
    logger.warn({ signal }, 'second stop signal: exiting without waiting for requests');
    setTimeout(() => {
      process.off('SIGTERM', onSignal);
      process.off('SIGINT', onSignal);
      process.kill(process.pid, signal);
    }, LAST_LINES_MS);
    logger.flush(() => process.exit(1));
  };
  /** A stop asked for (a signal, or the primary's word): the first drains, a second ends at once. */
  const stop = (signal: NodeJS.Signals) => {
    if (++asked > 1) now(signal);
    else drain(signal);
  };
  function onSignal(signal: NodeJS.Signals) {
    if (primary === undefined || !primary.connected) stop(signal);
  }
  process.on('SIGTERM', onSignal);
  process.on('SIGINT', onSignal);
  if (primary === undefined) {
    process.on('SIGHUP', () => {
      if (!stopping) reload(options, () => loadConfigFile(options.configPath, options.env));
    });
    return;
  }
  process.on('SIGHUP', () => undefined);
  primary.attach({
    reload: (config) => {
      if (!stopping) reload(options, () => config);
    },
    reloadFailed: () => {
      if (stopping) return;
      perch.reloadFailed();
      logger.error({ config: options.configPath }, 'reload failed: keeping the running configuration');
    },
    stop: () => stop('SIGTERM'),
    orphaned: () => drain('primary_gone'),
  });
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

function reload({ perch, logger, configPath }: SignalOptions, load: () => Config): void {
  try {
    perch.reload(load());
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
