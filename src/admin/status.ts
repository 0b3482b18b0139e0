import type { IncomingMessage, ServerResponse } from 'node:http';
import type { TieredCache } from '../cache/tiered-cache.js';
import type { Logger } from '../logging/logger.js';
import type { PerchMetrics } from '../metrics/metrics.js';
import { requestIdFrom } from '../server/request-id.js';
import { send, sendError } from '../server/respond.js';
import type { AdminView } from './admin-view.js';
import { collectStatus } from './status-data.js';
import { STATUS_PAGE, STATUS_PAGE_CSP } from './status-page.js';


export interface StatusRouteOptions {
  readonly runtime: AdminView;
  readonly cache: TieredCache;
  readonly metrics: PerchMetrics;
  readonly logger: Logger;
}

/**
 * `GET /status` and `GET /status.json`, with `admin.status_page: true`. The page is static and
 * public (a browser cannot add `X-API-Key` to a navigation, and a key in the URL would land in
 * access logs and browser history); the figures are in the JSON, which takes an admin key like
 * `POST /admin/purge`. Like the purge route, these are dispatched before the API handler: no
 * rate-limit token, no API access log or request metrics. Without the option both paths answer
 * like any unknown route.
 */
export class StatusRoute {
  readonly #options: StatusRouteOptions;

  constructor(options: StatusRouteOptions) {
    this.#options = options;
  }

  /**
   * Answers a request the URL table sent here (`page`: `/status`, else `/status.json`) and
   * returns true; false (no `admin` section, or the page off) leaves it to the API, which answers
   * it like any unknown path.
   */
  handle(page: boolean, req: IncomingMessage, res: ServerResponse): boolean {
    const { runtime } = this.#options;
    const adminKeys = runtime.current.adminKeys;
    if (adminKeys === undefined || runtime.current.config.admin?.status_page !== true) return false;

    const head = req.method === 'HEAD';
    const requestId = requestIdFrom(req.headers['x-request-id']);
    if (page) {
      if (req.method !== 'GET' && !head) return this.#refuse(req, res, requestId, 'E405', undefined);
      this.#page(res, head, requestId);
      return true;
    }
    // As on the API: the key first, so a caller without one learns nothing else.
    const admin = adminKeys.authenticate(req.headers['x-api-key']);
    if (admin === undefined) return this.#refuse(req, res, requestId, 'E401', undefined);
    if (req.method !== 'GET' && !head) return this.#refuse(req, res, requestId, 'E405', admin.id);
    collectStatus(this.#options).then(
      (snapshot) => send(res, head, 200, Buffer.from(JSON.stringify(snapshot)), ['x-request-id', requestId, 'cache-control', 'no-store']),
      (error: unknown) => {
        this.#options.logger.error({ err: error, req_id: requestId }, 'error serving the status figures');
        if (!res.headersSent) sendError(res, head, 'E500', ['x-request-id', requestId]);
        else res.destroy();
      },
    );
    return true;
  }

  #page(res: ServerResponse, head: boolean, requestId: string): void {
    res.writeHead(200, [
      'content-type',
      'text/html; charset=utf-8',
      'content-length',
      String(STATUS_PAGE.length),
      'content-security-policy',
      STATUS_PAGE_CSP,
      'x-content-type-options',
      'nosniff',
      'x-frame-options',
      'DENY',
      'referrer-policy',
      'no-referrer',
      'cache-control',
      'no-store',
      'x-request-id',
      requestId,
    ]);
    res.end(head ? undefined : STATUS_PAGE);
  }

  /**
   * Refusals are logged (a wrong key may be someone guessing); successful reads are not, since
   * an open page polls every few seconds.
   */
  #refuse(req: IncomingMessage, res: ServerResponse, requestId: string, code: 'E401' | 'E405', keyId: string | undefined): true {
    const status = sendError(res, req.method === 'HEAD', code, code === 'E405' ? ['allow', 'GET, HEAD', 'x-request-id', requestId] : ['x-request-id', requestId]);
    this.#options.logger.warn({ req_id: requestId, method: req.method, path: req.url?.split('?')[0], status, key_id: keyId ?? null }, 'admin status refused');
    return true;
  }
}
