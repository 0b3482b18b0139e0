import { ConfigError, loadConfigFile } from '../config/load.js';
import type { Logger } from '../logging/logger.js';
import type { Perch } from './perch.js';
import { followLauncher } from './relaunch.js';

export interface SignalOptions {
  readonly perch: Perch;
  readonly logger: Logger;
  /** Re-read on SIGHUP. */
  readonly configPath: string;
  readonly env: NodeJS.ProcessEnv;
}

/**
 * SIGTERM and SIGINT drain and exit 0 (1 if stopping failed); a second one exits at once, for an
 * operator who does not want to wait out the grace period. SIGHUP reloads the configuration file;
 * a file with problems changes nothing and each problem is logged.
 */
export function handleSignals(options: SignalOptions): void {
  const { perch, logger } = options;
  let stopping = false;
  const stop = (signal: NodeJS.Signals) => {
    if (stopping) {
      logger.warn({ signal }, 'second stop signal: exiting without waiting for requests');
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
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
  followLauncher(() => stop('SIGTERM'));
  process.on('SIGHUP', () => {
    if (!stopping) reload(options);
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
