import { randomUUID } from 'node:crypto';

// Echoed into a response header and every log line, so only a safe, bounded alphabet passes.
const VALID_REQUEST_ID = /^[A-Za-z0-9._:-]{1,128}$/;

/** The caller's `X-Request-Id` when it is well-formed, else a fresh UUID. */
export function requestIdFrom(header: string | string[] | undefined): string {
  return typeof header === 'string' && VALID_REQUEST_ID.test(header) ? header : randomUUID();
}
