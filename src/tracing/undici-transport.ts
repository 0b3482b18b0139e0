import { OTLPExporterError, type ExportResponse, type IExporterTransport } from '@opentelemetry/otlp-exporter-base';
import { Pool } from 'undici';

/**
 * The OTLP exporter's HTTP leg on undici instead of node:http's client. The SDK's own transport
 * posts with node:http, whose request and response objects then pass through the same
 * functions as the server's answers (OutgoingMessage, its header writer, the stream corking):
 * V8 had compiled those for the server's objects alone, and the first export made them
 * polymorphic for every hit after it (seen with `--trace-deopt`; docs/performance.md). perch's
 * provider calls already go through undici, which has its own request objects and parser.
 * The bytes are the SDK's: its protobuf serializer and export delegate run unchanged around
 * this, so no part of the protocol is perch's.
 */
export function undiciTransport(url: string, headers: Readonly<Record<string, string>>): IExporterTransport {
  const target = new URL(url);
  const path = `${target.pathname}${target.search}`;
  // Two connections: the batch processor exports one batch at a time; the second serves a
  // shutdown flush while a slow export is still in flight.
  const pool = new Pool(target.origin, { connections: 2, pipelining: 1 });
  const sent = { ...headers, 'content-type': 'application/x-protobuf' };
  return {
    async send(data: Uint8Array, timeoutMillis: number): Promise<ExportResponse> {
      try {
        const response = await pool.request({ path, method: 'POST', headers: sent, body: data, signal: AbortSignal.timeout(timeoutMillis) });
        const body = Buffer.from(await response.body.arrayBuffer());
        if (response.statusCode >= 200 && response.statusCode < 300) return { status: 'success', data: body };
        // As the SDK's transport reports a refusal: the status as the error's code, no body.
        return { status: 'failure', error: new OTLPExporterError(`collector answered ${response.statusCode}`, response.statusCode) };
      } catch (error) {
        return { status: 'failure', error: error instanceof Error ? error : new Error(String(error)) };
      }
    },
    shutdown(): void {
      void pool.close().catch(() => undefined);
    },
  };
}
