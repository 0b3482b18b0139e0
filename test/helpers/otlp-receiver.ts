import { createServer, type IncomingHttpHeaders } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { TestContext } from 'node:test';
// The classes protobufjs generated from the official opentelemetry-proto files, as the
// OpenTelemetry package ships them: the receiver decodes with them, never with perch's code.
import generated from '@opentelemetry/otlp-transformer/build/src/generated/root.js';
import { onCleanup } from './cleanup.js';

/** The generated code's typings say only `Root`: the shape of the few messages read here. */
interface AnyValue {
  readonly stringValue?: string | null;
  readonly intValue?: number | { toNumber(): number } | null;
  readonly doubleValue?: number | null;
  readonly boolValue?: boolean | null;
}
type KeyValues = readonly { readonly key?: string | null; readonly value?: AnyValue | null }[] | null | undefined;
interface DecodedSpan {
  readonly traceId?: Uint8Array | null;
  readonly spanId?: Uint8Array | null;
  readonly parentSpanId?: Uint8Array | null;
  readonly name?: string | null;
  readonly kind?: number | null;
  readonly attributes?: KeyValues;
  readonly status?: { readonly code?: number | null; readonly message?: string | null } | null;
}
interface DecodedRequest {
  readonly resourceSpans?: readonly { readonly resource?: { readonly attributes?: KeyValues } | null; readonly scopeSpans?: readonly { readonly spans?: readonly DecodedSpan[] | null }[] | null }[] | null;
}
interface Codec<T> {
  decode(bytes: Uint8Array): T;
  encode(message: object): { finish(): Uint8Array };
}
const proto = (generated as unknown as { opentelemetry: { proto: { collector: { trace: { v1: { ExportTraceServiceRequest: Codec<DecodedRequest>; ExportTraceServiceResponse: Codec<object> } } } } } }).opentelemetry
  .proto;

/** Attribute values as decoded: strings, numbers, booleans. */
export type AttributeMap = Record<string, string | number | boolean>;

/** One exported span, flattened: ids as lowercase hex, as in `traceparent`. */
export interface ReceivedSpan {
  readonly traceId: string;
  readonly spanId: string;
  /** '' for a root span. */
  readonly parentSpanId: string;
  readonly name: string;
  /** OTLP's SpanKind: 1 internal, 2 server, 3 client. */
  readonly kind: number;
  readonly attributes: AttributeMap;
  /** OTLP's StatusCode: 0 unset, 1 ok, 2 error. */
  readonly status: { readonly code: number; readonly message: string };
  /** The resource the span was exported with. */
  readonly resource: AttributeMap;
}

export interface OtlpReceiver {
  /** The collector's base URL, as `tracing.endpoint` takes it. */
  readonly url: string;
  readonly spans: ReceivedSpan[];
  /** The headers of every export request. */
  readonly exports: IncomingHttpHeaders[];
  /** Paths other than `/v1/traces` that were posted to. */
  readonly strays: string[];
}

/**
 * A stand-in OpenTelemetry collector: OTLP/HTTP with protobuf on 127.0.0.1, port 0. Every
 * `ExportTraceServiceRequest` posted to `/v1/traces` is decoded and its spans kept; closed when
 * the test ends.
 */
export async function startOtlpReceiver(t: TestContext): Promise<OtlpReceiver> {
  const receiver: OtlpReceiver = { url: '', spans: [], exports: [], strays: [] };
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (chunk: Buffer) => chunks.push(chunk));
    req.on('end', () => {
      if (req.url !== '/v1/traces' || req.headers['content-type'] !== 'application/x-protobuf') {
        receiver.strays.push(req.url ?? '');
        res.writeHead(404).end();
        return;
      }
      receiver.exports.push(req.headers);
      receiver.spans.push(...decode(Buffer.concat(chunks)));
      const answer = proto.collector.trace.v1.ExportTraceServiceResponse.encode({}).finish();
      res.writeHead(200, { 'content-type': 'application/x-protobuf' }).end(Buffer.from(answer));
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  onCleanup(t, () => {
    server.closeAllConnections();
    return new Promise<void>((resolve) => server.close(() => resolve()));
  });
  const { port } = server.address() as AddressInfo;
  return Object.assign(receiver, { url: `http://127.0.0.1:${port}` });
}

function decode(body: Buffer): ReceivedSpan[] {
  const request = proto.collector.trace.v1.ExportTraceServiceRequest.decode(body);
  return (request.resourceSpans ?? []).flatMap((resourceSpans) => {
    const resource = attributes(resourceSpans.resource?.attributes);
    return (resourceSpans.scopeSpans ?? []).flatMap((scope) =>
      (scope.spans ?? []).map(
        (span): ReceivedSpan => ({
          traceId: hex(span.traceId),
          spanId: hex(span.spanId),
          parentSpanId: hex(span.parentSpanId),
          name: span.name ?? '',
          kind: span.kind ?? 0,
          attributes: attributes(span.attributes),
          status: { code: span.status?.code ?? 0, message: span.status?.message ?? '' },
          resource,
        }),
      ),
    );
  });
}

function attributes(list: KeyValues): AttributeMap {
  const map: AttributeMap = {};
  for (const { key, value } of list ?? []) {
    if (key === undefined || key === null || value === undefined || value === null) continue;
    if (value.stringValue !== undefined && value.stringValue !== null) map[key] = value.stringValue;
    else if (value.intValue !== undefined && value.intValue !== null) map[key] = typeof value.intValue === 'number' ? value.intValue : value.intValue.toNumber();
    else if (value.doubleValue !== undefined && value.doubleValue !== null) map[key] = value.doubleValue;
    else if (value.boolValue !== undefined && value.boolValue !== null) map[key] = value.boolValue;
  }
  return map;
}

function hex(bytes: Uint8Array | null | undefined): string {
  return bytes === null || bytes === undefined ? '' : Buffer.from(bytes).toString('hex');
}
