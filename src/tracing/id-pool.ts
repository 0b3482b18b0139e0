import { randomFillSync } from 'node:crypto';
import type { IdGenerator } from '@opentelemetry/sdk-trace';

/** Random bytes drawn at once: 256 trace ids, or 512 span ids, per draw. */
const POOL_BYTES = 4096;
const INVALID_TRACE_ID = '0'.repeat(32);
const INVALID_SPAN_ID = '0'.repeat(16);

/**
 * Trace and span ids cut from one hex string per 4 KiB of random bytes. The SDK's generator
 * writes four `Math.random()` words and hex-encodes them for every id, twice per request: with
 * tracing on every request gets ids (the access line and `traceparent` carry them, sampled or
 * not), and that per-id work was a measurable share of a hit. A cut of a long string is a V8
 * sliced string, made without copying; the pool is a few KiB, so what it keeps alive is bounded.
 */
export class IdPool implements IdGenerator {
  readonly #bytes = Buffer.allocUnsafe(POOL_BYTES);
  #hex = '';
  #at = 0;

  generateTraceId(): string {
    const id = this.#take(32);
    return id === INVALID_TRACE_ID ? this.generateTraceId() : id;
  }

  generateSpanId(): string {
    const id = this.#take(16);
    return id === INVALID_SPAN_ID ? this.generateSpanId() : id;
  }

  #take(chars: number): string {
    if (this.#at + chars > this.#hex.length) {
      randomFillSync(this.#bytes);
      this.#hex = this.#bytes.toString('hex');
      this.#at = 0;
    }
    const id = this.#hex.slice(this.#at, this.#at + chars);
    this.#at += chars;
    return id;
  }
}
