import pino, { type DestinationStream, type Logger } from 'pino';
import type { LogConfig } from '../config/types.js';

export type { Logger } from 'pino';

/**
 * Lines are written in batches of at least this many bytes. One write per access line cost a
 * fifth of the hit path's CPU in the bench profile (bench/README.md); batching about fifteen lines
 * per write removes most of it.
 */
const BATCH_BYTES = 4096;

/** Longest a line waits in the batch when traffic is too light to fill it. */
const FLUSH_INTERVAL_MS = 1000;

/**
 * The process logger. Writes JSON lines to stdout through pino's asynchronous destination, so a
 * slow log pipe does not stall the event loop; tests pass their own `destination` to read lines.
 * A crash can lose the last second of lines (at most one batch); an orderly stop flushes them.
 * Nothing perch logs carries a client secret (logs name a client by its key id), and the redact
 * list is a second line of defence should a header object ever be logged by mistake.
 */
export function createLogger(config: LogConfig, destination?: DestinationStream): Logger {
  const options = {
    level: config.level,
    base: { service: 'perch' },
    redact: { paths: ['headers["x-api-key"]', 'req.headers["x-api-key"]', 'headers.authorization'], censor: '[redacted]' },
  };
  if (destination !== undefined) return pino(options, destination);
  const stdout = pino.destination({ dest: 1, sync: false, minLength: BATCH_BYTES });
  setInterval(() => stdout.flush(), FLUSH_INTERVAL_MS).unref();
  return pino(options, stdout);
}
