#!/usr/bin/env node
import { parseCommand, USAGE } from './cli.js';
import { ConfigError, loadConfigFile } from './config/load.js';
import type { Config } from './config/types.js';
import { DEMO_KEY, hasDemoKey } from './demo-key.js';
import { createLogger } from './observability/logger.js';
import { createPerch } from './server/server.js';

/** Exit status for an unusable configuration or command line, as `--check-config` documents. */
const EXIT_CONFIG = 2;

async function main(): Promise<void> {
  const command = parseCommand(process.argv.slice(2), process.env);
  if (command.kind === 'help') {
    process.stdout.write(`${USAGE}\n`);
    return;
  }
  if (command.kind === 'usage_error') {
    process.stderr.write(`perch: ${command.message}\n${USAGE}\n`);
    process.exitCode = EXIT_CONFIG;
    return;
  }
  let config: Config;
  try {
    config = loadConfigFile(command.configPath, process.env);
  } catch (error) {
    if (!(error instanceof ConfigError)) throw error;
    process.stderr.write(`perch: ${command.configPath} is not a valid configuration:\n`);
    for (const problem of error.problems) process.stderr.write(`  ${problem}\n`);
    process.exitCode = EXIT_CONFIG;
    return;
  }
  if (command.kind === 'check') {
    process.stdout.write(`perch: ${command.configPath} is valid\n`);
    return;
  }
  await serve(config);
}

async function serve(config: Config): Promise<void> {
  const logger = createLogger(config.log);
  const perch = createPerch({ config, logger });
  const address = await perch.listen();
  const host = address.family === 'IPv6' ? `[${address.address}]` : address.address;
  const base = `http://${host}:${address.port}`;
  logger.info({ address: base }, 'perch listening');
  if (hasDemoKey(config)) {
    logger.warn('the public demo key is enabled: remove it from auth.keys before exposing perch');
    process.stdout.write(`perch is up. Try: curl -H 'X-API-Key: ${DEMO_KEY}' ${base}/v1/users/by/username/perch_demo\n`);
  } else {
    process.stdout.write(`perch is up on ${base}\n`);
  }

  let stopping = false;
  const stop = (signal: NodeJS.Signals) => {
    if (stopping) return;
    stopping = true;
    logger.info({ signal }, 'perch stopping');
    perch.close().then(
      () => logger.flush(() => process.exit(0)),
      (error: unknown) => {
        logger.error({ err: error }, 'error while stopping');
        logger.flush(() => process.exit(1));
      },
    );
  };
  process.once('SIGTERM', stop);
  process.once('SIGINT', stop);
}

main().catch((error: unknown) => {
  process.stderr.write(`perch: ${error instanceof Error ? error.message : String(error)}\n`);
  process.exitCode = 1;
});
