import { Writable } from 'node:stream';
import type { LogConfig } from '../../src/config/types.js';
import { createLogger, type Logger } from '../../src/logging/logger.js';

export interface LogCapture {
  readonly logger: Logger;
  /** Every line logged so far, parsed. */
  lines(): Record<string, unknown>[];
  /** Every line logged so far, raw, for "this string never appears" checks. */
  text(): string;
}

/** A real pino logger writing into memory instead of stdout. */
export function captureLogs(level: 'info' | 'debug' = 'info', format: Partial<Pick<LogConfig, 'time' | 'level_format'>> = {}): LogCapture {
  const chunks: string[] = [];
  const sink = new Writable({
    write(chunk: Buffer, _encoding, done) {
      chunks.push(chunk.toString('utf8'));
      done();
    },
  });
  const logger = createLogger({ level, time: 'epoch_ms', level_format: 'number', ...format }, sink);
  const text = () => chunks.join('');
  return {
    logger,
    text,
    lines: () =>
      text()
        .split('\n')
        .filter((line) => line !== '')
        .map((line) => JSON.parse(line) as Record<string, unknown>),
  };
}
