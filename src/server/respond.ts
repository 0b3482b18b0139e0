import type { ServerResponse } from 'node:http';
import { ERROR_TABLE, errorBody, type ErrorCode } from '../errors/error-table.js';

const JSON_TYPE = 'application/json; charset=utf-8';

/** Extra headers for one response, as a flat [name, value, name, value, ...] list. */
export type HeaderList = (string | number)[];

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

// Bodies for the fixed messages are built once, not per response.
const DEFAULT_BODIES = new Map<ErrorCode, Buffer>(
  (Object.keys(ERROR_TABLE) as ErrorCode[]).map((code) => [code, errorBody(code)]),
);

/** The error shape of the interface; `message` overrides the table's default for E400/E404. */
export function sendError(
  res: ServerResponse,
  head: boolean,
  code: ErrorCode,
  headers: HeaderList,
  message?: string,
): number {
  const { status } = ERROR_TABLE[code];
  send(res, head, status, message === undefined ? DEFAULT_BODIES.get(code)! : errorBody(code, message), headers);
  return status;
}
