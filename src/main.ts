#!/usr/bin/env node
import { parseCommand, USAGE } from './cli.js';
import { ConfigError, loadConfigFile } from './config/load.js';
import { checkStartupFiles } from './app/preflight.js';
import type { Config } from './config/types.js';
import { healthCheck } from './health-check.js';
import { heapPlan } from './app/heap-size.js';
import { relaunch } from './app/relaunch.js';
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
  const heap = heapPlan(config, process.execArgv, process.env);
  if (heap.kind === 'relaunch') {
    relaunch(heap.flags, heap.env);
    return;
  }
  // Loaded only here: a Node 20 launcher (relaunch.ts) stays resident, and need not hold perch.
  const { serve } = await import('./app/serve.js');
  await serve(config, command.configPath, heap.settings);
}

main().catch((error: unknown) => {
  process.stderr.write(`perch: ${error instanceof Error ? error.message : String(error)}\n`);
  process.exitCode = 1;
});
