import type { IncomingMessage, ServerResponse } from 'node:http';
import type { TieredCache } from '../cache/tiered-cache.js';
import type { ErrorCode } from '../errors/error-table.js';
import type { HeaderList } from '../header-list.js';
import type { Logger } from '../logging/logger.js';
import type { PerchMetrics } from '../metrics/metrics.js';
import { requestIdFrom } from '../server/request-id.js';
import { send, sendError } from '../server/respond.js';
import type { AdminView } from './admin-view.js';
import { readPurgeScope } from './purge-scope.js';

/** A purge body is a few dozen bytes; the bound keeps a caller from making perch buffer more. */
export const MAX_PURGE_BODY_BYTES = 4096;

const NOT_CONFIRMED = 'Service unavailable: the purge was counted, but not every instance confirmed it in time; retry';
const NOT_PROPAGATED = "Service unavailable: Redis did not record the purge; only this instance's memory was purged, retry";

export interface PurgeRouteOptions {
  readonly runtime: AdminView;
  readonly cache: TieredCache;
  readonly metrics: PerchMetrics;
  readonly logger: Logger;
}

/** What one admin request came to, for its log line. */
interface AdminExchange {
  readonly req: IncomingMessage;
  readonly res: ServerResponse;
  readonly requestId: string;
  keyId?: string;
}

/**
 * `POST /admin/purge`, for operators: dispatched before the API handler and outside it, so admin
 * requests spend no rate-limit token and never appear in the API's access log or request
 * metrics. Without an `admin` section the route does not exist: the API handler answers the
 * path like any unknown one, so nothing reveals that the feature is there.
 */
export class PurgeRoute {
  readonly #options: PurgeRouteOptions;

  constructor(options: PurgeRouteOptions) {
    this.#options = options;
  }

  /**
   * Answers a request the URL table sent here and returns true; false (no `admin` section)
   * leaves it to the API, which answers it like any unknown path.
   */
  handle(req: IncomingMessage, res: ServerResponse): boolean {
    const adminKeys = this.#options.runtime.current.adminKeys;
    if (adminKeys === undefined) return false;

    const x: AdminExchange = { req, res, requestId: requestIdFrom(req.headers['x-request-id']) };
    // As on the API: the key first, so a caller without one learns nothing else.
    const admin = adminKeys.authenticate(req.headers['x-api-key']);
    if (admin === undefined) return this.#fail(x, 'E401');
    x.keyId = admin.id;
    if (req.method !== 'POST') return this.#fail(x, 'E405', ['allow', 'POST']);
    const type = (req.headers['content-type'] ?? '').split(';')[0]!.trim().toLowerCase();
    if (type !== 'application/json') return this.#fail(x, 'E400', [], 'Invalid request: Content-Type must be application/json');
    if (Number(req.headers['content-length'] ?? 0) > MAX_PURGE_BODY_BYTES) return this.#fail(x, 'E400', [], tooLarge());
    this.#purge(x).catch((error: unknown) => {
      this.#options.logger.error({ err: error, req_id: x.requestId }, 'error serving a purge');
      if (!res.headersSent) this.#fail(x, 'E500');
      else res.destroy();
    });
    return true;
  }

  async #purge(x: AdminExchange): Promise<void> {
    const body = await readBody(x.req, MAX_PURGE_BODY_BYTES);
    if (body === undefined) return void this.#fail(x, 'E400', [], tooLarge());
    const scope = readPurgeScope(body);
    if (scope.kind === 'invalid') return void this.#fail(x, 'E400', [], scope.message);

    const result = await this.#options.cache.purge(scope.target);
    if (result === 'failed') return void this.#fail(x, 'E503', [], NOT_PROPAGATED, scope.echo);
    // Counted already: a retry a second later is harmless and usually finds every instance caught up.
    if (result === 'unconfirmed') return void this.#fail(x, 'E503', ['retry-after', '1'], NOT_CONFIRMED, scope.echo);
    this.#options.metrics.purge(scope.label);
    const headers: HeaderList = ['x-request-id', x.requestId, 'cache-control', 'no-store'];
    send(x.res, false, 200, Buffer.from(JSON.stringify({ purged: scope.echo })), headers);
    this.#log(x, 200, scope.echo);
  }

  /** The error shape; HEAD gets the headers only, as everywhere else. */
  #fail(x: AdminExchange, code: ErrorCode, headers: HeaderList = [], message?: string, scope?: unknown): true {
    headers.push('x-request-id', x.requestId);
    this.#log(x, sendError(x.res, x.req.method === 'HEAD', code, headers, message), scope);
    return true;
  }

  /** One line per admin request: who purged what is an audit trail. */
  #log(x: AdminExchange, status: number, scope: unknown): void {
    const line = { req_id: x.requestId, method: x.req.method, status, key_id: x.keyId ?? null, scope: scope ?? null };
    if (status === 200) this.#options.logger.info(line, 'admin purge');
    else this.#options.logger.warn(line, 'admin purge refused');
  }
}

function tooLarge(): string {
  return `Invalid request: the body must be at most ${MAX_PURGE_BODY_BYTES} bytes`;
}

/**
 * The whole body, or undefined once it passes `limit` bytes. Bytes past the limit are read and
 * dropped, which keeps the connection usable; `server.request_timeout_ms` bounds how long.
 */
function readBody(req: IncomingMessage, limit: number): Promise<Buffer | undefined> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let length = 0;
    req.on('data', (chunk: Buffer) => {
      length += chunk.length;
      if (length <= limit) chunks.push(chunk);
      else resolve(undefined);
    });
    req.on('end', () => resolve(Buffer.concat(chunks)));
    req.on('error', reject);
  });
}
