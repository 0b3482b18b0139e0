import { getHeapStatistics } from 'node:v8';
import type { Config } from '../config/types.js';
import { DEMO_KEY, hasDemoKey } from './demo-key.js';
import { LineBatcher } from '../logging/line-batcher.js';
import { createLogger, type Logger } from '../logging/logger.js';
import { PERCH_VERSION } from '../version.js';
import { HEAP_LIMIT_WARNING, heapShortfall, oldSpaceLimitBytes, UNSHARED_CAP_WARNING, unsharedCapUpstreams } from './advice.js';
import type { HeapSettings } from './heap-size.js';
import { createPerch } from './perch.js';
import type { PrimaryLink } from './primary-link.js';
import { exitOnCrash, handleSignals } from './signals.js';

/** A worker of `perch --workers`: its number, from 1, and its channel to the primary. */
export interface WorkerRole {
  readonly index: number;
  readonly primary: PrimaryLink;
  /** The configuration the other workers reloaded since the start, applied before serving. */
  readonly reloaded?: Config;
}

/**
 * Starts perch on `config` as the command line's serve command: logs, listens, warns, handles
 * signals. `worker`: this is that worker of `perch --workers` (workers.ts), named in every line.
 * A start that fails (a port taken, a file unreadable) ends the process with status 1 after one
 * line saying why: the Redis clients and listeners already open would otherwise keep a process
 * alive that serves nothing.
 */
export async function serve(config: Config, configPath: string, heap: HeapSettings, worker?: WorkerRole): Promise<void> {
  // A worker's lines share stdout with the other workers': each write is whole lines under
  // PIPE_BUF, so the kernel never splices them with another process's.
  const sink = new LineBatcher(1, worker === undefined ? {} : { atomicLines: true });
  const root = createLogger(config.log, sink);
  const logger = worker === undefined ? root : root.child({ worker: worker.index });
  exitOnCrash(logger, sink);
  try {
    await start(config, configPath, heap, logger, worker);
  } catch (error) {
    logger.fatal({ err: error }, `perch could not start: ${error instanceof Error ? error.message : String(error)}`);
    sink.flushSync();
    process.exit(1);
  }
}

async function start(config: Config, configPath: string, heap: HeapSettings, logger: Logger, worker: WorkerRole | undefined): Promise<void> {
  const heapLimitMib = Math.floor(getHeapStatistics().heap_size_limit / 2 ** 20);
  logger.info({ version: PERCH_VERSION, node: process.version, config: configPath, heap: { ...heap, heap_limit_mib: heapLimitMib } }, `perch ${PERCH_VERSION} starting`);
  const perch = createPerch({ config, logger, env: process.env, ...(worker === undefined ? {} : { worker: worker.index }) });
  if (worker?.reloaded !== undefined) {
    perch.reload(worker.reloaded);
    logger.info({ config: configPath }, 'configuration reloaded');
  }
  // Before the wait to listen (up to 2 s for the purge counters): a SIGHUP then is a reload, a
  // SIGTERM a stop, never the signal's default, which ends the process.
  handleSignals({ perch, logger, configPath, env: process.env, ...(worker === undefined ? {} : { primary: worker.primary }) });
  const address = await perch.listen();
  // Only now: the primary counts a worker that never got here as failing to start.
  worker?.primary.ready();
  const host = address.family === 'IPv6' ? `[${address.address}]` : address.address;
  const base = `${config.server.tls === undefined ? 'http' : 'https'}://${host}:${address.port}`;
  const metricsPort = perch.metricsAddress()?.port;
  logger.info({ address: base, ...(metricsPort === undefined ? {} : { metrics_port: metricsPort }) }, 'perch listening');
  // stdout carries JSON log lines only, so line-by-line log shippers never meet plain text;
  // the line for the person at the terminal goes to stderr.
  if (hasDemoKey(config)) logger.warn('the public demo key is enabled: remove it from auth.keys before exposing perch');
  // With --workers, the person at the terminal hears it once, from the first worker.
  if (worker === undefined || worker.index === 1) {
    process.stderr.write(hasDemoKey(config) ? `perch is up. Try: curl -H 'X-API-Key: ${DEMO_KEY}' ${base}/v1/users/by/username/perch_demo\n` : `perch is up on ${base}\n`);
  }

  const unshared = unsharedCapUpstreams(config);
  if (unshared.length > 0) logger.warn({ upstreams: unshared }, UNSHARED_CAP_WARNING);
  const oldSpaceLimit = oldSpaceLimitBytes(process.execArgv, process.env.NODE_OPTIONS, getHeapStatistics().heap_size_limit);
  const needed = heapShortfall(config, oldSpaceLimit);
  if (needed !== undefined) logger.warn({ old_space_limit_mib: Math.floor(oldSpaceLimit / 2 ** 20), needed_mib: Math.ceil(needed / 2 ** 20) }, HEAP_LIMIT_WARNING);

}

