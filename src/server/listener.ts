import {
  createServer as createHttpServer,
  type IncomingMessage,
  type RequestListener,
  type Server,
  type ServerOptions,
  type ServerResponse,
} from 'node:http';
import { createServer as createHttpsServer } from 'node:https';
import type { Socket } from 'node:net';
import type { ServerConfig } from '../config/types.js';
import { ERROR_MESSAGES, type ErrorCode } from '../errors/error-table.js';
import type { Logger } from '../logging/logger.js';
import { handleClientError, refuseConnect } from './client-error.js';
import { ConnectionTracker, type RequestSpans } from './connection-tracker.js';
import { sendError } from './respond.js';
import { readTlsFiles } from './tls.js';

/** The slowest Node may be to notice an expired head timeout, at most; see `checkInterval`. */
const MAX_CHECK_INTERVAL_MS = 1000;

// drain() needs the tracker of the server it drains; server.ts holds only the Server.
const trackers = new WeakMap<Server, ConnectionTracker>();

/**
 * The API listener, HTTP or HTTPS, with the configured timeouts and size limits. Limits live on
 * the server rather than in the handler because they must act before a request exists: a slow or
 * oversized request head never reaches perch's code, and every refusal at this level still has
 * the interface's error shape (see client-error.ts).
 */
export function createApiServer(config: ServerConfig, listener: RequestListener, logger: Logger, spans?: RequestSpans): Server {
  const options: ServerOptions = {
    headersTimeout: config.headers_timeout_ms,
    requestTimeout: config.request_timeout_ms,
    keepAliveTimeout: config.keep_alive_timeout_ms,
    maxHeaderSize: config.max_header_bytes,
    connectionsCheckingInterval: checkInterval(config),
    // Node answers a missing Host with a bare 400; admit() answers it in the error shape.
    requireHostHeader: false,
  };
  const tls = config.tls !== undefined;
  const tracker = new ConnectionTracker(config.max_connections, tls, spans);
  const guarded: RequestListener = (req, res) => {
    tracker.request(req, res);
    if (admit(req, res, config.max_header_bytes)) listener(req, res);
  };
  const server: Server =
    config.tls === undefined
      ? createHttpServer(options, guarded)
      : createHttpsServer({ ...options, ...readTlsFiles(config.tls), handshakeTimeout: config.headers_timeout_ms }, guarded);
  // Node's own count refuses the newest connection at the cap; the tracker sheds the oldest idle
  // one instead, so server.maxConnections stays unset.
  server.on('connection', (socket: Socket) => tracker.accept(socket));
  if (tls) server.on('secureConnection', (socket: Socket) => tracker.secured(socket));
  server.on('clientError', (error: NodeJS.ErrnoException, socket: Socket) => handleClientError(error, socket, tracker, logger));
  server.on('connect', refuseConnect);
  server.on('checkExpectation', (req: IncomingMessage, res: ServerResponse) => {
    tracker.request(req, res);
    res.shouldKeepAlive = false;
    sendError(res, req.method === 'HEAD', 'E417', []);
  });
  // By default Node answers a request whose client half-closed (sent FIN, as `nc -N` does) by
  // closing the socket before the answer is written. With this, it answers, then closes.
  (server as Server & { httpAllowHalfOpen: boolean }).httpAllowHalfOpen = true;
  // max_header_bytes is enforced on what arrives (admit), so Node must not drop headers silently.
  server.maxHeadersCount = 0;
  trackers.set(server, tracker);
  return server;
}

/**
 * Node checks head and request timeouts only every `connectionsCheckingInterval` (30 s by
 * default), so a 10 s headers timeout really meant 10-40 s. Checking at most every second, and
 * more often for short timeouts, keeps the configured bound within a second.
 */
function checkInterval(config: ServerConfig): number {
  return Math.max(50, Math.min(MAX_CHECK_INTERVAL_MS, Math.floor(config.headers_timeout_ms / 4)));
}

/**
 * Checks Node cannot make, or makes with a bare answer: the request head's size as it arrived
 * (Node counts only the bytes of names and values, so thousands of tiny headers passed a 16 KB
 * bound), a missing Host, and the absolute-form
 * target (`GET http://host/path`, which RFC 9112 3.2.2 says a server MUST accept), rewritten to
 * its origin form for the routes. False when the request was answered here.
 */
function admit(req: IncomingMessage, res: ServerResponse, maxHeaderBytes: number): boolean {
  const target = req.url ?? '/';
  if (headBytes(req.method ?? '', target, req.rawHeaders) > maxHeaderBytes) return refuse(req, res, 'E431');
  // RFC 9112 3.2: an HTTP/1.1 request without Host MUST be answered 400.
  if (req.headers.host === undefined && req.httpVersion === '1.1') return refuse(req, res, 'E400', ERROR_MESSAGES.malformedRequest);
  if (target.charCodeAt(0) !== SLASH) req.url = originForm(target);
  return true;
}

/** An answer that closes the connection: after these, what else the client sends is suspect. */
function refuse(req: IncomingMessage, res: ServerResponse, code: ErrorCode, message?: string): false {
  res.shouldKeepAlive = false;
  sendError(res, req.method === 'HEAD', code, [], message);
  return false;
}

const SLASH = 0x2f;
const ABSOLUTE_FORM = /^[A-Za-z][A-Za-z0-9+.-]*:\/\/[^/?#]*/;

function originForm(target: string): string {
  const authority = ABSOLUTE_FORM.exec(target);
  if (authority === null) return target;
  const rest = target.slice(authority[0].length);
  return rest.startsWith('/') ? rest : `/${rest}`;
}

/**
 * The head's size on the wire, at least: request line, each header as `name:value` and its
 * CRLF (Node has stripped the optional spaces around the value), and the blank line. Header text
 * is Latin-1 in Node, one character per byte, so string lengths are byte counts.
 */
function headBytes(method: string, target: string, raw: readonly string[]): number {
  let bytes = method.length + target.length + 12;
  for (let i = 0; i < raw.length; i++) bytes += raw[i]!.length;
  return bytes + (raw.length / 2) * 3 + 2;
}

/** The optional metrics-only listener of `metrics.port`: plain HTTP, short timeouts. */
export function createMetricsServer(listener: RequestListener): Server {
  return createHttpServer({ headersTimeout: 10_000, requestTimeout: 10_000 }, listener);
}

/**
 * Stops accepting, lets in-flight requests finish for up to `graceMs`, then closes whatever
 * connections remain. Every answer from now on says `Connection: close`, so no client sends
 * another request on a connection about to go; idle keep-alive connections are closed at once
 * and again as requests finish, since a client may reuse one between our checks.
 */
export async function drain(server: Server, graceMs: number): Promise<void> {
  if (!server.listening) return;
  const tracker = trackers.get(server);
  tracker?.drain();
  const closed = new Promise<void>((resolve) => server.close(() => resolve()));
  server.closeIdleConnections();
  const sweep = setInterval(() => {
    server.closeIdleConnections();
    tracker?.closeIdle();
  }, 50);
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
