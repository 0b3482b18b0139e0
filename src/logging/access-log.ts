import pino from 'pino';
import type { Logger } from './logger.js';

/** The access line's fields, in the order they are written. */
export interface AccessFields {
  /** The caller's id when it matched request-id.ts's alphabet, else a UUID: written without escaping. */
  readonly req_id: string;
  /** One of llhttp's method names: written without escaping. */
  readonly method: string | undefined;
  readonly path: string | null;
  /** An endpoint name or null: a closed set, written without escaping. */
  readonly route: string | null;
  readonly status: number;
  /** A cache outcome: a closed set, written without escaping. */
  readonly cache: string;
  readonly upstream: string | null;
  readonly upstream_ms: number | null;
  /** Whether this request's miss made a provider call (its key paid for it). */
  readonly upstream_call: boolean;
  /** The items of the batch call this request's miss rode in; null: a call of its own, or none. */
  readonly batch: number | null;
  readonly ms: number;
  /** A configured key id (`[A-Za-z0-9_.-]`) or `client:` and hex digits: written without escaping. */
  readonly key_id: string | null;
  /** The peer's IP address: written without escaping. */
  readonly remote: string | null;
  readonly user_agent: string | null;
  /** The request's trace and server span, lowercase hex (W3C Trace Context); null when tracing is off. */
  readonly trace_id: string | null;
  readonly span_id: string | null;
}

interface PinoInternals {
  readonly [key: symbol]: unknown;
}

/**
 * The one line per request, written straight to the logger's destination as the very JSON pino
 * would write for `logger.info(fields, 'request')` (same level, time, base and message, in the
 * same order; a test compares the two byte for byte). pino walks a generic object per call; this
 * writes the fixed schema with one template, which is what made it worth having on the hit path.
 * It uses pino's documented `pino.symbols`, so the logger's level, time format and destination
 * stay the configured ones, a reload's new level included.
 */
export function createAccessLog(logger: Logger): (fields: AccessFields) => void {
  const internals = logger as unknown as PinoInternals;
  const stream = internals[pino.symbols.streamSym] as { write(line: string): unknown };
  const levelPrefix = (internals[pino.symbols.lsCacheSym] as Record<number, string>)[30]!;
  const time = internals[pino.symbols.timeSym] as () => string;
  const bindings = internals[pino.symbols.chindingsSym] as string;
  const end = internals[pino.symbols.endSym] as string;
  return (f) => {
    if (!logger.isLevelEnabled('info')) return;
    stream.write(
      `${levelPrefix}${time()}${bindings},"req_id":"${f.req_id}","method":${raw(f.method ?? null)},"path":${str(f.path)},"route":${raw(f.route)},"status":${f.status},"cache":"${f.cache}","upstream":${str(f.upstream)},"upstream_ms":${f.upstream_ms},"upstream_call":${f.upstream_call},"batch":${f.batch},"ms":${f.ms},"key_id":${raw(f.key_id)},"remote":${raw(f.remote)},"user_agent":${str(f.user_agent)},"trace_id":${raw(f.trace_id)},"span_id":${raw(f.span_id)},"msg":"request"${end}`,
    );
  };
}

/** Printable ASCII without `"` or `\`: the usual path and user agent need no escaping. */
const PLAIN = /^[\x20\x21\x23-\x5b\x5d-\x7e]*$/;

function str(value: string | null | undefined): string {
  if (value === null || value === undefined) return 'null';
  return PLAIN.test(value) ? `"${value}"` : JSON.stringify(value);
}

function raw(value: string | null): string {
  return value === null ? 'null' : `"${value}"`;
}
