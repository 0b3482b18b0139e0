import { createServer, type IncomingHttpHeaders } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { TestContext } from 'node:test';
import protobuf from 'protobufjs';
import { onCleanup } from './cleanup.js';

/**
 * The messages of the official opentelemetry-proto files that the receiver reads, with their
 * field numbers (collector/trace/v1, trace/v1, common/v1, resource/v1). protobufjs decodes with
 * them: the receiver never uses perch's code, nor the SDK's own encoder, to read what was sent.
 */
const OTLP_TRACE_PROTO = `
syntax = "proto3";
package otlp;
message ExportTraceServiceRequest { repeated ResourceSpans resource_spans = 1; }
message ExportTraceServiceResponse { ExportTracePartialSuccess partial_success = 1; }
message ExportTracePartialSuccess { int64 rejected_spans = 1; string error_message = 2; }
message ResourceSpans { Resource resource = 1; repeated ScopeSpans scope_spans = 2; string schema_url = 3; }
message Resource { repeated KeyValue attributes = 1; uint32 dropped_attributes_count = 2; }
message ScopeSpans { InstrumentationScope scope = 1; repeated Span spans = 2; string schema_url = 3; }
message InstrumentationScope { string name = 1; string version = 2; repeated KeyValue attributes = 3; uint32 dropped_attributes_count = 4; }
message Span {
  bytes trace_id = 1; bytes span_id = 2; string trace_state = 3; bytes parent_span_id = 4; fixed32 flags = 16;
  string name = 5; int32 kind = 6; fixed64 start_time_unix_nano = 7; fixed64 end_time_unix_nano = 8;
  repeated KeyValue attributes = 9; uint32 dropped_attributes_count = 10; Status status = 15;
}
message Status { string message = 2; int32 code = 3; }
message KeyValue { string key = 1; AnyValue value = 2; }
message AnyValue {
  oneof value { string string_value = 1; bool bool_value = 2; int64 int_value = 3; double double_value = 4; ArrayValue array_value = 5; KeyValueList kvlist_value = 6; bytes bytes_value = 7; }
}
message ArrayValue { repeated AnyValue values = 1; }
message KeyValueList { repeated KeyValue values = 1; }
`;

/** The shape of the few messages read here, as protobufjs decodes them. */
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
const ROOT = protobuf.parse(OTLP_TRACE_PROTO).root;
const REQUEST = ROOT.lookupType('otlp.ExportTraceServiceRequest');
const RESPONSE = ROOT.lookupType('otlp.ExportTraceServiceResponse');

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
      const answer = RESPONSE.encode(RESPONSE.create({})).finish();
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
  // As plain objects with only the fields sent: a decoded message reads proto3 defaults ('', 0) for
  // a oneof's unset members, which would hide which one the sender set.
  const request = REQUEST.toObject(REQUEST.decode(body), { longs: Number, defaults: false }) as DecodedRequest;
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
