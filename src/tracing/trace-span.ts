import { ROOT_CONTEXT, SpanKind, SpanStatusCode, defaultTextMapSetter, trace, type Attributes, type AttributeValue, type Span, type TextMapPropagator, type Tracer } from '@opentelemetry/api';
import { ATTR_ERROR_TYPE } from '@opentelemetry/semantic-conventions';

/**
 * One span of a request's trace, made by hand: its children are started with this span as their
 * explicit parent, never through an active context, so no context manager (AsyncLocalStorage)
 * runs on any request. A span the sampler dropped is a non-recording one: it still has ids, for
 * the access line and the `traceparent` sent on, and its children are dropped with it.
 */
export class TraceSpan {
  readonly #tracer: Tracer;
  readonly #propagator: TextMapPropagator;
  readonly #span: Span;

  constructor(tracer: Tracer, propagator: TextMapPropagator, span: Span) {
    this.#tracer = tracer;
    this.#propagator = propagator;
    this.#span = span;
  }

  get traceId(): string {
    return this.#span.spanContext().traceId;
  }

  get spanId(): string {
    return this.#span.spanContext().spanId;
  }

  /** False for a span the sampler dropped: it carries ids only, and nothing set on it is kept. */
  get recording(): boolean {
    return this.#span.isRecording();
  }

  /** A span under this one; `client` for a call out of perch (Redis, the provider). */
  child(name: string, kind: 'internal' | 'client', attributes: Attributes): TraceSpan {
    const context = trace.setSpan(ROOT_CONTEXT, this.#span);
    const span = this.#tracer.startSpan(name, { kind: kind === 'client' ? SpanKind.CLIENT : SpanKind.INTERNAL, attributes }, context);
    return new TraceSpan(this.#tracer, this.#propagator, span);
  }

  set(key: string, value: AttributeValue): void {
    this.#span.setAttribute(key, value);
  }

  rename(name: string): void {
    this.#span.updateName(name);
  }

  /**
   * Marks the span failed with a closed-set reason (a status, a failure kind): never a message
   * or a body, which could carry what a provider or a client sent.
   */
  fail(errorType: string): void {
    this.#span.setAttribute(ATTR_ERROR_TYPE, errorType);
    this.#span.setStatus({ code: SpanStatusCode.ERROR, message: errorType });
  }

  end(): void {
    this.#span.end();
  }

  /** `traceparent` (and `tracestate`) naming this span as the parent of the callee's work. */
  headers(): Record<string, string> {
    const carrier: Record<string, string> = {};
    this.#propagator.inject(trace.setSpan(ROOT_CONTEXT, this.#span), carrier, defaultTextMapSetter);
    return carrier;
  }
}
