import { parseCommand, USAGE } from './cli.js';
import { ConfigError, loadConfigFile } from './config/load.js';
import { secretsPastEnd } from './config/rules-keys.js';
import { checkStartupFiles } from './app/preflight.js';
import type { Config } from './config/types.js';
import { healthCheck } from './health-check.js';
import { heapPlan } from './app/heap-size.js';
import { relaunch } from './app/relaunch.js';
import { PERCH_VERSION } from './version.js';
import { primaryLink, WORKER_ENV } from './app/primary-link.js';
import { supervise, workersProblem } from './workers.js';

/** Exit status for an unusable configuration or command line, as `--check-config` documents. */
const EXIT_CONFIG = 2;

async function main(): Promise<void> {
  const command = parseCommand(process.argv.slice(2), process.env);
  if (command.kind === 'help') {
    process.stdout.write(`${USAGE}\n`);
    return;
  }
  if (command.kind === 'version') {
    // The runtime too, as the first log line and perch_build_info have it: a report names both.
    process.stdout.write(`${PERCH_VERSION} (node ${process.version})\n`);
    return;
  }
  if (command.kind === 'usage_error') {
    process.stderr.write(`perch: ${command.message}\n${USAGE}\n`);
    process.exitCode = EXIT_CONFIG;
    return;
  }
  const primary = primaryLink();
  if (command.kind === 'serve' && primary !== undefined) {
    // A worker of `perch --workers`: the primary hands it the configuration, so that a worker
    // started again runs what the others run, whatever the file says by then.
    const { config, reloaded } = await primary.started;
    // The primary sized the heap before it forked: its flags and environment are the worker's.
    const heap = heapPlan(config, process.execArgv, process.env);
    if (heap.kind === 'relaunch') relaunch(heap.flags, heap.env);
    const { serve } = await import('./app/serve.js');
    await serve(config, command.configPath, heap.settings, { index: Number(process.env[WORKER_ENV]), primary, ...(reloaded === undefined ? {} : { reloaded }) });
    return;
  }
  let config: Config;
  try {
    config = loadConfigFile(command.configPath, process.env);
    if (command.kind === 'check') {
      const problems = checkStartupFiles(config);
      const ports = workersProblem(config, command.workers);
      if (ports !== undefined) problems.push(ports);
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
    const lists = { 'auth.keys': config.auth.keys, ...(config.admin === undefined ? {} : { 'admin.keys': config.admin.keys }) };
    for (const warning of secretsPastEnd(lists, Date.now())) process.stderr.write(`perch: warning: ${warning}\n`);
    return;
  }
  if (command.kind === 'health_check') {
    const { ok, detail } = await healthCheck(config.server);
    if (!ok) process.stderr.write(`perch: unhealthy: ${detail}\n`);
    process.exitCode = ok ? 0 : 1;
    return;
  }
  const problem = workersProblem(config, command.workers);
  if (problem !== undefined) {
    process.stderr.write(`perch: ${problem}\n`);
    process.exitCode = EXIT_CONFIG;
    return;
  }
  // Sized before the workers start: they inherit the flags and the environment.
  const heap = heapPlan(config, process.execArgv, process.env);
  if (heap.kind === 'relaunch') relaunch(heap.flags, heap.env);
  if (command.workers > 1) {
    await supervise(config, command.configPath, command.workers);
    return;
  }
  // Loaded only here: the process that relaunches never loads the server.
  const { serve } = await import('./app/serve.js');
  await serve(config, command.configPath, heap.settings);
}

main().catch((error: unknown) => {
  // Whatever is open by now (a channel, a client) must not keep a process alive that failed.
  process.stderr.write(`perch: ${error instanceof Error ? error.message : String(error)}\n`);
  process.exit(1);
});
