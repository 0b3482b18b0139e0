import type { IncomingMessage } from 'node:http';
import { ROOT_CONTEXT, SpanKind, defaultTextMapGetter, type Attributes } from '@opentelemetry/api';
import { W3CTraceContextPropagator } from '@opentelemetry/core';
import { OTLPTraceExporter } from '@opentelemetry/exporter-trace-otlp-proto';
import { resourceFromAttributes } from '@opentelemetry/resources';
import { BasicTracerProvider, BatchSpanProcessor, ParentBasedSampler, TraceIdRatioBasedSampler } from '@opentelemetry/sdk-trace-base';
import {
  ATTR_CLIENT_ADDRESS,
  ATTR_HTTP_REQUEST_METHOD,
  ATTR_HTTP_RESPONSE_STATUS_CODE,
  ATTR_HTTP_ROUTE,
  ATTR_NETWORK_PROTOCOL_VERSION,
  ATTR_SERVICE_NAME,
  ATTR_URL_PATH,
  ATTR_URL_SCHEME,
  ATTR_USER_AGENT_ORIGINAL,
} from '@opentelemetry/semantic-conventions';
import type { Clock } from '../clock.js';
import type { EndpointName } from '../endpoints.js';
import type { Logger } from '../logging/logger.js';
import { splitTarget } from '../url-table.js';
import { PERCH_VERSION } from '../version.js';
import { SummarizedExporter } from './export-failures.js';
import type { TracingSettings } from './settings.js';
import { TraceSpan } from './trace-span.js';

/** Tracing for one instance: a server span per API request, exported in batches over OTLP/HTTP. */
export interface Tracing {
  /** The request's server span, continuing the caller's trace when it sent a valid `traceparent`. */
  request(req: IncomingMessage, requestId: string): TraceSpan;
  /** Exports what is buffered and stops; the caller bounds the wait (`shutdown_grace_ms`). */
  close(): Promise<void>;
}

/** What a request came to, for its server span. */
export interface RequestFacts {
  readonly route: EndpointName | undefined;
  readonly status: number;
  readonly cache: string;
  readonly keyId: string | undefined;
  readonly upstream: string | undefined;
}

/** Each endpoint's route template: the span's `http.route` and, after the method, its name. */
const HTTP_ROUTES: Readonly<Record<EndpointName, string>> = {
  user: '/v1/users/{user_id}',
  user_by_username: '/v1/users/by/username/{username}',
  tweets: '/v1/users/{user_id}/tweets',
  replies: '/v1/users/{user_id}/replies',
  following: '/v1/users/{user_id}/following',
  tweet: '/v1/tweets/{tweet_id}',
};

export interface TracingOptions {
  readonly clock: Clock;
  readonly logger: Logger;
  /** How long a span waits in the batch before it is exported; default 5000 ms, the SDK's. */
  readonly exportDelayMs?: number;
  /** Most spans in one export; default 512, the SDK's. 1 exports each span on its own. */
  readonly exportBatchSize?: number;
}

/**
 * The official SDK, used without anything global: no registered provider, no context manager,
 * no instrumentation. Spans go through a batch processor, whose bounded queue drops spans
 * rather than hold a request when the collector is slow or away.
 */
export function createTracing(settings: TracingSettings, options: TracingOptions): Tracing {
  const exporter = new SummarizedExporter(new OTLPTraceExporter({ url: settings.url, headers: { ...settings.headers } }), options);
  const provider = new BasicTracerProvider({
    resource: resourceFromAttributes({ [ATTR_SERVICE_NAME]: settings.serviceName, 'service.version': PERCH_VERSION }),
    sampler: new ParentBasedSampler({ root: new TraceIdRatioBasedSampler(settings.sampleRatio) }),
    spanProcessors: [
      new BatchSpanProcessor(exporter, {
        ...(options.exportDelayMs === undefined ? {} : { scheduledDelayMillis: options.exportDelayMs }),
        ...(options.exportBatchSize === undefined ? {} : { maxExportBatchSize: options.exportBatchSize }),
      }),
    ],
  });
  const tracer = provider.getTracer('perch', PERCH_VERSION);
  const propagator = new W3CTraceContextPropagator();

  return {
    request(req, requestId) {
      const parent = req.headers.traceparent === undefined ? ROOT_CONTEXT : propagator.extract(ROOT_CONTEXT, req.headers, defaultTextMapGetter);
      const attributes: Attributes = {
        [ATTR_HTTP_REQUEST_METHOD]: req.method ?? '_OTHER',
        [ATTR_URL_PATH]: splitTarget(req.url ?? '/')[0],
        [ATTR_URL_SCHEME]: 'encrypted' in req.socket ? 'https' : 'http',
        [ATTR_NETWORK_PROTOCOL_VERSION]: req.httpVersion,
        'perch.request_id': requestId,
      };
      if (req.socket.remoteAddress !== undefined) attributes[ATTR_CLIENT_ADDRESS] = req.socket.remoteAddress;
      const agent = req.headers['user-agent'];
      if (agent !== undefined) attributes[ATTR_USER_AGENT_ORIGINAL] = agent;
      return new TraceSpan(tracer, propagator, tracer.startSpan(req.method ?? 'HTTP', { kind: SpanKind.SERVER, attributes }, parent));
    },
    // A failed last export is the exporter's to log (export-failures.ts): stopping goes on.
    close: () => provider.shutdown().catch(() => undefined),
  };
}

/**
 * Ends a server span with what the access line says. Named `GET <route template>` once the route
 * is known; a 5xx is an error of perch's, a 4xx the client's, so only a 5xx marks the span failed.
 */
export function endRequestSpan(span: TraceSpan, method: string | undefined, facts: RequestFacts): void {
  if (facts.route !== undefined) {
    const route = HTTP_ROUTES[facts.route];
    span.rename(`${method ?? 'HTTP'} ${route}`);
    span.set(ATTR_HTTP_ROUTE, route);
  }
  span.set(ATTR_HTTP_RESPONSE_STATUS_CODE, facts.status);
  span.set('perch.cache', facts.cache);
  if (facts.keyId !== undefined) span.set('perch.key_id', facts.keyId);
  if (facts.upstream !== undefined) span.set('perch.upstream', facts.upstream);
  if (facts.status >= 500) span.fail(String(facts.status));
  span.end();
}
