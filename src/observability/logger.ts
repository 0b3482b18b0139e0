import pino, { type DestinationStream, type Logger } from 'pino';
import type { LogConfig } from '../config/types.js';

export type { Logger } from 'pino';

/**
 * The process logger. Writes JSON lines to stdout through pino's asynchronous destination, so a
 * slow log pipe does not stall the event loop; tests pass their own `destination` to read lines.
 * Nothing perch logs carries a client secret (logs name a client by its key id), and the redact
 * list is a second line of defence should a header object ever be logged by mistake.
 */
export function createLogger(config: LogConfig, destination?: DestinationStream): Logger {
  const options = {
    level: config.level,
    base: { service: 'perch' },
    redact: { paths: ['headers["x-api-key"]', 'req.headers["x-api-key"]', 'headers.authorization'], censor: '[redacted]' },
  };
  return pino(options, destination ?? pino.destination({ dest: 1, sync: false }));
}
