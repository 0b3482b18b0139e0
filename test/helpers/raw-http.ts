import assert from 'node:assert/strict';
import { connect, type Socket } from 'node:net';
import type { TestContext } from 'node:test';
import { onCleanup } from './cleanup.js';

/** One HTTP/1.1 response as it came off the wire. */
export interface RawResponse {
  readonly status: number;
  /** Lowercased names; a repeated header keeps its last value. */
  readonly headers: Readonly<Record<string, string>>;
  readonly body: string;
}

export interface RawResult {
  /** Every byte the server sent, as text. */
  readonly text: string;
  /** How the exchange ended: the server closed (FIN or reset), or `timeoutMs` passed first. */
  readonly ending: 'closed' | 'timeout';
  readonly ms: number;
}

export interface RawOptions {
  /** Send FIN after the bytes (a half-close, like `nc -N`). */
  readonly halfClose?: boolean;
  /** Give up and destroy the socket after this long. Default 5000. */
  readonly timeoutMs?: number;
}

/**
 * Writes `bytes` to a fresh connection and collects everything until the server closes it (or
 * the timeout). Errors such as ECONNRESET count as a close: a test asserts on what arrived.
 */
export function rawExchange(port: number, bytes: string | Buffer, options: RawOptions = {}): Promise<RawResult> {
  const started = performance.now();
  return new Promise((resolve) => {
    const socket = connect({ port, host: '127.0.0.1', allowHalfOpen: true });
    const chunks: Buffer[] = [];
    let settled = false;
    const settle = (ending: RawResult['ending']) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      socket.destroy();
      resolve({ text: Buffer.concat(chunks).toString('latin1'), ending, ms: performance.now() - started });
    };
    const timer = setTimeout(() => settle('timeout'), options.timeoutMs ?? 5000);
    socket.on('connect', () => {
      socket.write(bytes);
      if (options.halfClose === true) socket.end();
    });
    socket.on('data', (chunk: Buffer) => chunks.push(chunk));
    socket.on('end', () => settle('closed'));
    socket.on('close', () => settle('closed'));
    socket.on('error', () => settle('closed'));
  });
}

/**
 * Splits a byte stream into the responses it holds (Content-Length framing only, as perch
 * sends). Answers to HEAD carry a Content-Length but no body: pass `head`.
 */
export function parseResponses(text: string, head = false): RawResponse[] {
  const responses: RawResponse[] = [];
  let rest = text;
  while (rest.startsWith('HTTP/1.1 ')) {
    const end = rest.indexOf('\r\n\r\n');
    if (end === -1) break;
    const lines = rest.slice(0, end).split('\r\n');
    const headers: Record<string, string> = {};
    for (const line of lines.slice(1)) {
      const colon = line.indexOf(':');
      headers[line.slice(0, colon).trim().toLowerCase()] = line.slice(colon + 1).trim();
    }
    const length = head ? 0 : Number(headers['content-length'] ?? 0);
    responses.push({ status: Number(lines[0]!.split(' ')[1]), headers, body: rest.slice(end + 4, end + 4 + length) });
    rest = rest.slice(end + 4 + length);
  }
  return responses;
}

/** The one response in `text`; fails when there is none or more than one. */
export function onlyResponse(text: string): RawResponse {
  const responses = parseResponses(text);
  if (responses.length !== 1) throw new Error(`expected one response, got ${responses.length}: ${JSON.stringify(text.slice(0, 300))}`);
  return responses[0]!;
}

/** A connection held open by the test and destroyed when it ends (or earlier by the test). */
export interface HeldSocket {
  readonly socket: Socket;
  /** Resolves once the server has closed the connection. */
  readonly closed: Promise<void>;
  /** Everything received so far. */
  received(): string;
}

/** Opens a connection and keeps it; it is destroyed when the test ends. */
export function holdConnection(t: TestContext, port: number): Promise<HeldSocket> {
  return new Promise((resolve, reject) => {
    const socket = connect({ port, host: '127.0.0.1', allowHalfOpen: true });
    let text = '';
    let closedResolve!: () => void;
    const closed = new Promise<void>((r) => (closedResolve = r));
    onCleanup(t, () => void socket.destroy());
    socket.on('data', (chunk: Buffer) => (text += chunk.toString('latin1')));
    socket.on('end', () => closedResolve());
    socket.on('close', () => closedResolve());
    socket.on('error', () => closedResolve());
    socket.once('connect', () => resolve({ socket, closed, received: () => text }));
    socket.once('error', reject);
  });
}

/** A GET request head with the given key (or none) and extra header lines. */
export function rawGet(path: string, key: string | null, extra: string[] = []): string {
  const lines = [`GET ${path} HTTP/1.1`, 'Host: perch.test', ...(key === null ? [] : [`X-API-Key: ${key}`]), ...extra];
  return `${lines.join('\r\n')}\r\n\r\n`;
}

/**
 * Asserts the interface's error shape as perch sends it for a request it cannot serve at the
 * HTTP level: the status and code, a JSON body of exactly `{"error":{"message","code"}}`, a JSON
 * content type, `Cache-Control: no-store` and `Connection: close`.
 */
export function assertClosingError(response: RawResponse, status: number, code: string): void {
  assert.equal(response.status, status, JSON.stringify(response));
  assert.match(response.headers['content-type'] ?? '', /^application\/json/);
  assert.equal(response.headers.connection, 'close');
  assert.equal(response.headers['cache-control'], 'no-store');
  const body = JSON.parse(response.body) as { error: { message: unknown; code: unknown } };
  assert.deepEqual(Object.keys(body), ['error']);
  assert.deepEqual(Object.keys(body.error).sort(), ['code', 'message']);
  assert.equal(body.error.code, code);
  assert.equal(typeof body.error.message, 'string');
}
