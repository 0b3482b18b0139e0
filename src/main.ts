#!/usr/bin/env node
import { getHeapStatistics } from 'node:v8';
import { parseCommand, USAGE } from './cli.js';
import { HEAP_LIMIT_WARNING, heapShortfall, oldSpaceLimitBytes, UNSHARED_CAP_WARNING, unsharedCapUpstreams } from './app/advice.js';
import { ConfigError, loadConfigFile } from './config/load.js';
import { checkStartupFiles } from './app/preflight.js';
import type { Config } from './config/types.js';
import { DEMO_KEY, hasDemoKey } from './demo-key.js';
import { healthCheck } from './health-check.js';
import { createLogger } from './logging/logger.js';
import { createPerch } from './app/perch.js';
import { handleSignals } from './app/signals.js';
import { PERCH_VERSION } from './version.js';

/** Exit status for an unusable configuration or command line, as `--check-config` documents. */
const EXIT_CONFIG = 2;

async function main(): Promise<void> {
  const command = parseCommand(process.argv.slice(2), process.env);
  if (command.kind === 'help') {
    process.stdout.write(`${USAGE}\n`);
    return;
  }
  if (command.kind === 'version') {
    process.stdout.write(`${PERCH_VERSION}\n`);
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
    if (command.kind === 'check') {
      const problems = checkStartupFiles(config);
      if (problems.length > 0) throw new ConfigError(problems, command.configPath);
    }
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
  if (command.kind === 'health_check') {
    const { ok, detail } = await healthCheck(config.server);
    if (!ok) process.stderr.write(`perch: unhealthy: ${detail}\n`);
    process.exitCode = ok ? 0 : 1;
    return;
  }
  await serve(config, command.configPath);
}

async function serve(config: Config, configPath: string): Promise<void> {
  const logger = createLogger(config.log);
  logger.info({ version: PERCH_VERSION, node: process.version, config: configPath }, `perch ${PERCH_VERSION} starting`);
  const perch = createPerch({ config, logger, env: process.env });
  const address = await perch.listen();
  const host = address.family === 'IPv6' ? `[${address.address}]` : address.address;
  const base = `${config.server.tls === undefined ? 'http' : 'https'}://${host}:${address.port}`;
  const metricsPort = perch.metricsAddress()?.port;
  logger.info({ address: base, ...(metricsPort === undefined ? {} : { metrics_port: metricsPort }) }, 'perch listening');
  // stdout carries JSON log lines only, so line-by-line log shippers never meet plain text;
  // the line for the person at the terminal goes to stderr.
  if (hasDemoKey(config)) {
    logger.warn('the public demo key is enabled: remove it from auth.keys before exposing perch');
    process.stderr.write(`perch is up. Try: curl -H 'X-API-Key: ${DEMO_KEY}' ${base}/v1/users/by/username/perch_demo\n`);
  } else {
    process.stderr.write(`perch is up on ${base}\n`);
  }

  const unshared = unsharedCapUpstreams(config);
  if (unshared.length > 0) logger.warn({ upstreams: unshared }, UNSHARED_CAP_WARNING);
  const oldSpaceLimit = oldSpaceLimitBytes(process.execArgv, process.env.NODE_OPTIONS, getHeapStatistics().heap_size_limit);
  const needed = heapShortfall(config, oldSpaceLimit);
  if (needed !== undefined) logger.warn({ old_space_limit_mib: Math.floor(oldSpaceLimit / 2 ** 20), needed_mib: Math.ceil(needed / 2 ** 20) }, HEAP_LIMIT_WARNING);

  handleSignals({ perch, logger, configPath, env: process.env });
}

main().catch((error: unknown) => {
  process.stderr.write(`perch: ${error instanceof Error ? error.message : String(error)}\n`);
  process.exitCode = 1;
});
