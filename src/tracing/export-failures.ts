import type { ExportResult } from '@opentelemetry/core';
import { ExportResultCode } from '@opentelemetry/core';
import type { ReadableSpan, SpanExporter } from '@opentelemetry/sdk-trace';
import type { Clock } from '../clock.js';
import type { Logger } from '../logging/logger.js';

/** Length of one summary interval. */
export const EXPORT_SUMMARY_INTERVAL_MS = 60_000;

/**
 * The exporter, with its failures logged the way Redis failures are (redis/failure-summary.ts):
 * the first failure after a quiet interval at once, with its reason; the ones after it counted
 * and written as one line per interval while they keep coming. An unreachable collector then
 * costs one log line a minute, whatever the traffic. Driven by the exports themselves.
 */
export class SummarizedExporter implements SpanExporter {
  readonly #inner: SpanExporter;
  readonly #clock: Clock;
  readonly #logger: Logger;
  #since: number | undefined;
  #failed = 0;
  #dropped = 0;

  constructor(inner: SpanExporter, options: { clock: Clock; logger: Logger }) {
    this.#inner = inner;
    this.#clock = options.clock;
    this.#logger = options.logger;
  }

  export(spans: ReadableSpan[], done: (result: ExportResult) => void): void {
    this.#inner.export(spans, (result) => {
      if (result.code === ExportResultCode.SUCCESS) this.#tick();
      else this.#failure(spans.length, result.error);
      done(result);
    });
  }

  async shutdown(): Promise<void> {
    this.#summarize();
    await this.#inner.shutdown();
  }

  forceFlush(): Promise<void> {
    return this.#inner.forceFlush?.() ?? Promise.resolve();
  }

  #failure(spans: number, error: Error | undefined): void {
    this.#tick();
    if (this.#since === undefined) {
      this.#since = this.#clock.now();
      // The error's message only: the exporter's errors can carry the response, headers included.
      const reason = error === undefined ? 'unknown' : ((error as { code?: unknown }).code ?? error.name);
      this.#logger.warn(
        { dependency: 'otlp', reason: String(reason), spans, summary_interval_ms: EXPORT_SUMMARY_INTERVAL_MS },
        'trace export failed; spans dropped (further failures are summarized)',
      );
      return;
    }
    this.#failed++;
    this.#dropped += spans;
  }

  #tick(): void {
    if (this.#since !== undefined && this.#clock.now() - this.#since >= EXPORT_SUMMARY_INTERVAL_MS) this.#summarize();
  }

  #summarize(): void {
    const since = this.#since;
    if (since === undefined) return;
    if (this.#failed === 0) {
      this.#since = undefined;
      return;
    }
    const now = this.#clock.now();
    this.#logger.warn({ dependency: 'otlp', failed_exports: this.#failed, spans: this.#dropped, interval_ms: now - since }, 'trace exports failed since the last line; spans dropped');
    this.#failed = 0;
    this.#dropped = 0;
    this.#since = now;
  }
}
