import { createServer as createHttpServer, type RequestListener, type Server, type ServerOptions } from 'node:http';
import { createServer as createHttpsServer } from 'node:https';
import type { Socket } from 'node:net';
import type { ServerConfig } from '../config/types.js';
import { ERROR_TABLE, errorBody } from '../errors/error-table.js';
import type { Logger } from '../observability/logger.js';
import { readTlsFiles } from './tls.js';

/**
 * The API listener, HTTP or HTTPS, with the configured timeouts and size limits. Limits live on
 * the server rather than in the handler because they must act before a request exists: a slow or
 * oversized request head never reaches perch's code.
 */
export function createApiServer(config: ServerConfig, listener: RequestListener, logger: Logger): Server {
  const options: ServerOptions = {
    headersTimeout: config.headers_timeout_ms,
    requestTimeout: config.request_timeout_ms,
    keepAliveTimeout: config.keep_alive_timeout_ms,
    maxHeaderSize: config.max_header_bytes,
  };
  const server: Server =
    config.tls === undefined ? createHttpServer(options, listener) : createHttpsServer({ ...options, ...readTlsFiles(config.tls) }, listener);
  server.maxConnections = config.max_connections;
  server.on('clientError', (error: NodeJS.ErrnoException, socket: Socket) => answerClientError(error, socket, logger));
  return server;
}

const HEADER_OVERFLOW_BODY = errorBody('E431');

/**
 * Node answers a malformed request before any handler runs; this replaces its bare 431 with the
 * interface's error shape, and keeps Node's behaviour for the rest. Always closes: after a parse
 * error the connection's byte stream cannot be trusted.
 */
function answerClientError(error: NodeJS.ErrnoException, socket: Socket, logger: Logger): void {
  if (error.code === 'ECONNRESET' || !socket.writable) {
    socket.destroy();
    return;
  }
  logger.debug({ code: error.code }, 'malformed request rejected');
  if (error.code === 'HPE_HEADER_OVERFLOW') {
    socket.end(
      `HTTP/1.1 ${ERROR_TABLE.E431.status} Request Header Fields Too Large\r\n` +
        'content-type: application/json; charset=utf-8\r\n' +
        `content-length: ${HEADER_OVERFLOW_BODY.length}\r\nconnection: close\r\n\r\n${HEADER_OVERFLOW_BODY.toString()}`,
    );
    return;
  }
  const timedOut = error.code === 'ERR_HTTP_REQUEST_TIMEOUT';
  socket.end(timedOut ? 'HTTP/1.1 408 Request Timeout\r\nconnection: close\r\n\r\n' : 'HTTP/1.1 400 Bad Request\r\nconnection: close\r\n\r\n');
}

/** The optional metrics-only listener of `metrics.port`: plain HTTP, short timeouts. */
export function createMetricsServer(listener: RequestListener): Server {
  return createHttpServer({ headersTimeout: 10_000, requestTimeout: 10_000 }, listener);
}

/**
 * Stops accepting, lets in-flight requests finish for up to `graceMs`, then closes whatever
 * connections remain. Idle keep-alive connections are closed at once and again as requests
 * finish, since a client may reuse one between our checks.
 */
export async function drain(server: Server, graceMs: number): Promise<void> {
  if (!server.listening) return;
  const closed = new Promise<void>((resolve) => server.close(() => resolve()));
  server.closeIdleConnections();
  const sweep = setInterval(() => server.closeIdleConnections(), 50);
  let deadline: NodeJS.Timeout | undefined;
  const expired = new Promise<void>((resolve) => {
    deadline = setTimeout(() => {
      server.closeAllConnections();
      resolve();
    }, graceMs);
  });
  try {
    await Promise.race([closed, expired]);
    await closed;
  } finally {
    clearInterval(sweep);
    clearTimeout(deadline);
  }
}
