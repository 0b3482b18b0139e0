import { ATTR_HTTP_REQUEST_METHOD, ATTR_HTTP_REQUEST_RESEND_COUNT, ATTR_HTTP_RESPONSE_STATUS_CODE, ATTR_SERVER_ADDRESS, ATTR_SERVER_PORT } from '@opentelemetry/semantic-conventions';
import type { TraceSpan } from '../tracing/trace-span.js';
import type { Layer, UpstreamResult } from './upstream.js';

export interface TraceAttemptOptions {
  readonly upstream: string;
  /** The provider's origin. */
  readonly url: string;
  /**
   * Whether the provider receives `traceparent`: an internal trace id handed to a third party
   * says which of its calls belong to one of perch's clients, so only where the operator asks.
   */
  readonly propagate: boolean;
}

/**
 * One client span per provider attempt, innermost (under the guard), so it covers the exchange
 * alone, a retry or a switch of credential being another attempt, and sees the credential the
 * guard chose: its id is recorded, never its headers. The result is recorded by kind and status,
 * never with its reason text, which may quote what the provider sent.
 */
export function traceAttempts(options: TraceAttemptOptions): Layer {
  const { upstream, propagate } = options;
  const origin = new URL(options.url);
  const port = origin.port === '' ? (origin.protocol === 'https:' ? 443 : 80) : Number(origin.port);
  return (next) => async (attempt) => {
    const parent = attempt.trace;
    if (parent === undefined) return next(attempt);
    const retry = attempt.retry ?? 0;
    const span = parent.child('GET', 'client', {
      [ATTR_HTTP_REQUEST_METHOD]: 'GET',
      [ATTR_SERVER_ADDRESS]: origin.hostname,
      [ATTR_SERVER_PORT]: port,
      'perch.upstream': upstream,
      'perch.retry': retry,
      ...(retry > 0 ? { [ATTR_HTTP_REQUEST_RESEND_COUNT]: retry } : {}),
      ...(attempt.credential === undefined ? {} : { 'perch.credential_id': attempt.credential.id }),
    });
    const result = await next(propagate ? { ...attempt, trace: span, traceHeaders: span.headers() } : { ...attempt, trace: span });
    record(span, result);
    span.end();
    return result;
  };
}

function record(span: TraceSpan, result: UpstreamResult): void {
  const status = statusOf(result);
  if (status !== undefined) span.set(ATTR_HTTP_RESPONSE_STATUS_CODE, status);
  const outcome = result.kind === 'failed' ? result.failure : result.kind;
  span.set('perch.outcome', outcome);
  // A 404 is an answer perch serves and caches, not a failed exchange.
  if (result.kind !== 'ok' && result.kind !== 'not_found') span.fail(outcome);
}

/** The provider's HTTP status where the result keeps it; an `ok` body came with some 2xx. */
function statusOf(result: UpstreamResult): number | undefined {
  switch (result.kind) {
    case 'not_found':
      return 404;
    case 'bad_request':
      return 400;
    case 'rate_limited':
      return result.cause === 'status_503' ? 503 : result.cause === 'status_429' ? 429 : undefined;
    case 'failed':
      return result.status;
    default:
      return undefined;
  }
}
