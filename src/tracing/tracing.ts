import type { IncomingMessage } from 'node:http';
import { ROOT_CONTEXT, SpanKind, TraceFlags, defaultTextMapGetter, trace, type Attributes, type Span } from '@opentelemetry/api';
import { W3CTraceContextPropagator } from '@opentelemetry/core';
import { ExporterMetrics, OTLPExporterBase, createOtlpNetworkExportDelegate, getSharedConfigurationDefaults } from '@opentelemetry/otlp-exporter-base';
import { ProtobufTraceSerializer, TraceExporterMetricsHelper } from '@opentelemetry/otlp-transformer';
import { resourceFromAttributes } from '@opentelemetry/resources';
import { AlwaysOnSampler, BatchSpanProcessor, ParentBasedSampler, TracerProvider } from '@opentelemetry/sdk-trace';
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
import { IdPool } from './id-pool.js';
import { undiciTransport } from './undici-transport.js';
import type { TracingSettings } from './settings.js';
import { TraceSpan } from './trace-span.js';

/** Tracing for one instance: a server span per API request, exported in batches over OTLP/HTTP. */
export interface Tracing {
  /**
   * The request's server span. `trusted`: the caller's key was accepted, so a valid `traceparent`
   * it sent is continued (its sampling decision followed); an unknown caller's is ignored, so it
   * can neither force spans to be recorded nor join perch's spans to a trace of its choosing.
   */
  request(req: IncomingMessage, requestId: string, trusted: boolean): TraceSpan;
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
  /** A number in [0, 1) per new trace, kept when below `sample_ratio`; default Math.random. */
  readonly random?: () => number;
}

/**
 * The official SDK, used without anything global: no registered provider, no context manager,
 * no instrumentation. Spans go through a batch processor, whose bounded queue drops spans
 * rather than hold a request when the collector is slow or away.
 *
 * perch draws the sampling decision for a new trace itself, before the SDK is asked for a span:
 * a dropped trace gets its ids from the pool and a non-recording span made by the API, which is
 * what the SDK would have returned, without its sampler, id generator, attribute checks and
 * metrics on every request. At `sample_ratio: 0.01` that is 99 requests in 100, and it halved
 * tracing's own CPU per hit (docs/performance.md, Tracing). A caller's `traceparent` still
 * goes through the SDK, whose parent-based sampler follows the caller's decision.
 */
export function createTracing(settings: TracingSettings, options: TracingOptions): Tracing {
  const ids = new IdPool();
  const random = options.random ?? Math.random;
  // No meter provider: the SDK's own exporter metrics stay no-ops, as perch exports no OTel metrics.
  const exportMetrics = new ExporterMetrics({
    componentType: 'otlp_http_span_exporter',
    metricsHelper: TraceExporterMetricsHelper,
    url: settings.url,
    meterProvider: undefined,
    responseAttributesFromError: () => ({}),
  });
  const delegate = createOtlpNetworkExportDelegate(getSharedConfigurationDefaults(), ProtobufTraceSerializer, exportMetrics, undiciTransport(settings.url, settings.headers));
  const exporter = new SummarizedExporter(new OTLPExporterBase(delegate), options);
  const provider = new TracerProvider({
    resource: resourceFromAttributes({ [ATTR_SERVICE_NAME]: settings.serviceName, 'service.version': PERCH_VERSION }),
    // Roots reach the SDK only once perch has decided to keep them (see above).
    sampler: new ParentBasedSampler({ root: new AlwaysOnSampler() }),
    idGenerator: ids,
    spanProcessors: [
      new BatchSpanProcessor({
        exporter,
        ...(options.exportDelayMs === undefined ? {} : { scheduledDelayMillis: options.exportDelayMs }),
        ...(options.exportBatchSize === undefined ? {} : { maxExportBatchSize: options.exportBatchSize }),
      }),
    ],
  });
  const tracer = provider.getTracer('perch', PERCH_VERSION);
  const propagator = new W3CTraceContextPropagator();

  return {
    request(req, requestId, trusted) {
      const name = req.method ?? 'HTTP';
      const parent = trusted && req.headers.traceparent !== undefined ? trace.getSpanContext(propagator.extract(ROOT_CONTEXT, req.headers, defaultTextMapGetter)) : undefined;
      let span: Span;
      if (parent !== undefined) {
        // The caller's `tracestate` is its vendors' data: kept only when the operator says so,
        // since every upstream that propagates the trace would receive it.
        const context = settings.clientTracestate || parent.traceState === undefined ? parent : { ...parent, traceState: undefined };
        span = tracer.startSpan(name, { kind: SpanKind.SERVER }, trace.setSpanContext(ROOT_CONTEXT, context));
      } else if (random() < settings.sampleRatio) {
        span = tracer.startSpan(name, { kind: SpanKind.SERVER }, ROOT_CONTEXT);
      } else {
        span = trace.wrapSpanContext({ traceId: ids.generateTraceId(), spanId: ids.generateSpanId(), traceFlags: TraceFlags.NONE });
      }
      // Attributes are built only for a span that is kept.
      if (span.isRecording()) span.setAttributes(requestAttributes(req, requestId));
      return new TraceSpan(tracer, propagator, span);
    },
    // A failed last export is the exporter's to log (export-failures.ts): stopping goes on.
    close: () => provider.shutdown().catch(() => undefined),
  };
}

function requestAttributes(req: IncomingMessage, requestId: string): Attributes {
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
  return attributes;
}

/**
 * Ends a server span with what the access line says. Named `GET <route template>` once the route
 * is known; a 5xx is an error of perch's, a 4xx the client's, so only a 5xx marks the span failed.
 */
export function endRequestSpan(span: TraceSpan, method: string | undefined, facts: RequestFacts): void {
  if (!span.recording) return; // a dropped span's end is a no-op: nothing to name or set
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
