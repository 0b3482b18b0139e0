import pino, { type DestinationStream, type Logger, type LoggerOptions } from 'pino';
import type { LogConfig } from '../config/types.js';
import { LineBatcher } from './line-batcher.js';

export type { Logger } from 'pino';

/**
 * The process logger. Writes JSON lines to stdout in batches (LineBatcher), asynchronously, so a
 * slow log pipe does not stall the event loop; tests pass their own `destination` to read lines.
 * An orderly stop flushes the last lines; an uncaught exception writes them synchronously
 * (app/signals.ts, exitOnCrash).
 * Nothing perch logs carries a client secret (logs name a client by its key id), and the redact
 * list is a second line of defence should a header object ever be logged by mistake.
 */
export function createLogger(config: LogConfig, destination?: DestinationStream): Logger {
  const options: LoggerOptions = {
    level: config.level,
    base: { service: 'perch' },
    redact: { paths: ['headers["x-api-key"]', 'req.headers["x-api-key"]', 'headers.authorization'], censor: '[redacted]' },
    // Both are pino's own options, so pino's fast path writes them; see LogConfig for the defaults.
    ...(config.time === 'iso' ? { timestamp: pino.stdTimeFunctions.isoTime } : {}),
    ...(config.level_format === 'label' ? { formatters: { level: (label: string) => ({ level: label }) } } : {}),
  };
  return pino(options, destination ?? new LineBatcher(1));
}
