import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Client } from '../auth/key-store.js';
import type { CacheOutcome } from '../cache/outcome.js';
import type { EndpointName } from '../endpoints.js';
import type { HeaderList } from '../header-list.js';
import { clip, loggedPath } from '../logging/access-log-fields.js';
import { createAccessLog } from '../logging/access-log.js';
import type { Logger } from '../logging/logger.js';
import type { PerchMetrics } from '../metrics/metrics.js';
import { endRequestSpan } from '../tracing/tracing.js';
import type { TraceSpan } from '../tracing/trace-span.js';
import { pushRateLimitHeaders } from '../ratelimit/headers.js';
import type { Verdict } from '../ratelimit/token-bucket.js';
import type { BudgetStanding } from '../upstream/budget-book.js';

/** Per-request facts gathered on the way, written once to the access log. */
export interface Exchange {
  readonly req: IncomingMessage;
  readonly res: ServerResponse;
  readonly head: boolean;
  readonly requestId: string;
  readonly started: number;
  client?: Client;
  route?: EndpointName;
  /** The rate limiter's answer; from then on every response carries the rate-limit headers. */
  limit?: Verdict;
  cache: CacheOutcome;
  upstream?: string;
  upstreamMs?: number;
  /** This request's miss made a provider call: its key paid for it. */
  upstreamCall?: boolean;
  /** The items of the batch call this request's miss rode in. */
  batch?: number;
  /**
   * The key's provider-call budget now, when its plan has one: a second rate-limit policy, read
   * when the headers are written, so a miss's answer counts the call it made.
   */
  budget?: () => BudgetStanding;
  /** The request's server span, started once the key is checked; absent when tracing is off. */
  trace: TraceSpan | undefined;
}

/**
 * Writes what one exchange came to: the request metrics, the key's, one access line and the end
 * of its span, all from the same fields, so they always agree.
 */
export function recorder(logger: Logger, metrics: PerchMetrics): (x: Exchange, status: number) => void {
  const accessLog = createAccessLog(logger);
  return (x, status) => {
    const ms = performance.now() - x.started;
    metrics.request(x.route ?? 'none', status, x.cache, ms / 1000);
    if (x.client !== undefined) metrics.keyRequest(x.client.metricsId ?? x.client.id, status, x.cache);
    // Only perch's own refusals: an upstream 429 leaves the limiter's verdict allowed.
    if (x.limit?.allowed === false && x.client !== undefined) metrics.rateLimited(x.client.metricsId ?? x.client.id);
    accessLog({
      req_id: x.requestId,
      method: x.req.method,
      path: loggedPath(x.req.url),
      route: x.route ?? null,
      status,
      cache: x.cache,
      upstream: x.upstream ?? null,
      upstream_ms: x.upstreamMs === undefined ? null : round(x.upstreamMs),
      upstream_call: x.upstreamCall === true,
      batch: x.batch ?? null,
      ms: round(ms),
      key_id: x.client?.id ?? null,
      remote: x.req.socket.remoteAddress ?? null,
      user_agent: clip(x.req.headers['user-agent']),
      trace_id: x.trace?.traceId ?? null,
      span_id: x.trace?.spanId ?? null,
    });
    if (x.trace !== undefined) {
      endRequestSpan(x.trace, x.req.method, { route: x.route, status, cache: x.cache, keyId: x.client?.id, upstream: x.upstream });
    }
  };
}

/** Headers every response carries, before the response's own. */
export function base(x: Exchange, headers: HeaderList): HeaderList {
  headers.push('x-request-id', x.requestId);
  if (x.limit !== undefined) pushRateLimitHeaders(headers, x.limit, x.budget?.());
  return headers;
}

function round(ms: number): number {
  return Math.round(ms * 100) / 100;
}
