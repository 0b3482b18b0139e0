import type { ServerResponse } from 'node:http';
import { ERROR_TABLE, errorBody, type ErrorCode } from '../errors/error-table.js';

import type { HeaderList } from '../header-list.js';

const JSON_TYPE = 'application/json; charset=utf-8';

/**
 * Writes a complete response in one call with the headers as a flat list, the cheapest form
 * node:http accepts (no header object to build or validate name by name). HEAD gets the same
 * headers, `Content-Length` included, and no body.
 */
export function send(res: ServerResponse, head: boolean, status: number, body: Buffer, headers: HeaderList): void {
  headers.push('content-type', JSON_TYPE, 'content-length', body.length);
  res.writeHead(status, headers as unknown as string[]);
  if (head) res.end();
  else res.end(body);
}

/**
 * `304 Not Modified`: the headers a 200 would carry but those that describe its body (type,
 * length, coding), and no body (RFC 9110 15.4.5).
 */
export function sendNotModified(res: ServerResponse, headers: HeaderList): void {
  res.writeHead(304, headers as unknown as string[]);
  res.end();
}

// Bodies for the fixed messages are built once, not per response.
const DEFAULT_BODIES = new Map<ErrorCode, Buffer>(
  (Object.keys(ERROR_TABLE) as ErrorCode[]).map((code) => [code, errorBody(code)]),
);

/**
 * The error shape of the interface; `message` overrides the table's default for E400/E404.
 * Errors are `no-store`: a shared cache in front of perch must not answer anyone with them.
 */
export function sendError(
  res: ServerResponse,
  head: boolean,
  code: ErrorCode,
  headers: HeaderList,
  message?: string,
): number {
  const { status } = ERROR_TABLE[code];
  headers.push('cache-control', 'no-store');
  send(res, head, status, message === undefined ? DEFAULT_BODIES.get(code)! : errorBody(code, message), headers);
  return status;
}

/**
 * Cache headers of an API answer to a keyed request. A shared cache (a CDN, a stock Varnish)
 * in front of perch must never answer one client with another's response, nor anyone with an
 * error: successes are `private` and vary on the key, errors `no-store`. `maxAgeSeconds` counts,
 * like `Age`, from the upstream's answer (RFC 9111 4.2.3 subtracts `Age` from it), so a client's
 * own cache keeps an entry exactly as long as perch would, never longer. With compression on,
 * every success also varies on `Accept-Encoding`, whether or not this body has variants yet: a
 * cache must not hand the identity answer to a miss to the next client as its gzip answer, nor
 * the reverse. With it off, so does every answer of an entry that has variants all the same
 * (`varyEncoding`: the caller knows).
 */
export function pushCachePolicy(headers: HeaderList, status: number, maxAgeSeconds: number, varyEncoding = false): HeaderList {
  if (status >= 400) headers.push('cache-control', 'no-store');
  else headers.push('cache-control', `private, max-age=${Math.max(0, maxAgeSeconds)}`, 'vary', varyEncoding ? 'X-API-Key, Accept-Encoding' : 'X-API-Key');
  return headers;
}
