import type { IncomingMessage, ServerResponse } from 'node:http';
import { ENDPOINT_NAMES } from '../endpoints.js';
import { errorBody } from '../errors/error-table.js';
import type { Logger } from '../observability/logger.js';
import type { PerchMetrics } from '../observability/metrics.js';
import { OPENAPI_DOCUMENT } from '../openapi/document.js';
import { send } from './respond.js';
import type { Runtime } from './runtime.js';

/** A readiness condition owned elsewhere (e.g. "Redis reachable"); true when satisfied. */
export type ReadinessCheck = () => boolean | Promise<boolean>;

export interface PublicRoutesOptions {
  readonly runtime: Runtime;
  readonly metrics: PerchMetrics;
  /** Whether metrics are served here; false when `metrics.port` gives them their own listener. */
  readonly serveMetrics: boolean;
  readonly logger: Logger;
}

/**
 * Operational endpoints answered without an API key and without spending a rate-limit token:
 * probes and scrapers carry no key, and must keep working when clients exhaust their limits.
 * They are dispatched before the API handler, so they never appear in the API's access log or
 * request metrics.
 */
export class PublicRoutes {
  readonly #options: PublicRoutesOptions;
  readonly #checks = new Map<string, ReadinessCheck>();
  readonly #openapi = Buffer.from(JSON.stringify(OPENAPI_DOCUMENT));

  constructor(options: PublicRoutesOptions) {
    this.#options = options;
  }

  /** Adds a condition `/readyz` requires, reported under `name` in its `checks`. */
  addReadinessCheck(name: string, check: ReadinessCheck): void {
    this.#checks.set(name, check);
  }

  /** Answers `req` when it is one of these routes and returns true; false leaves it to the API. */
  handle(req: IncomingMessage, res: ServerResponse): boolean {
    // Exact path match: a query string is allowed (probes add cache busters), nothing else.
    const target = req.url ?? '/';
    const q = target.indexOf('?');
    const path = q === -1 ? target : target.slice(0, q);
    if (!path.startsWith('/') || path.startsWith('/v1/')) return false;
    const route = this.#route(path);
    if (route === undefined) return false;
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      send(res, req.method === 'HEAD', 405, errorBody('E405'), ['allow', 'GET, HEAD']);
      return true;
    }
    route(req.method === 'HEAD', res).catch((error: unknown) => {
      this.#options.logger.error({ err: error, path }, 'error serving an operational endpoint');
      if (!res.headersSent) send(res, false, 500, errorBody('E500'), []);
      else res.destroy();
    });
    return true;
  }

  /** The metrics endpoint alone, for the separate `metrics.port` listener. */
  handleMetricsOnly(req: IncomingMessage, res: ServerResponse): void {
    const path = (req.url ?? '/').split('?')[0];
    if (path !== this.#options.runtime.current.config.metrics.path) {
      send(res, req.method === 'HEAD', 404, errorBody('E404'), []);
      return;
    }
    this.#metrics(req.method === 'HEAD', res).catch(() => res.destroy());
  }

  #route(path: string): ((head: boolean, res: ServerResponse) => Promise<void>) | undefined {
    switch (path) {
      case '/healthz':
        return async (head, res) => sendJson(res, head, 200, { status: 'ok' });
      case '/readyz':
        return (head, res) => this.#ready(head, res);
      case '/openapi.json':
        return async (head, res) => send(res, head, 200, this.#openapi, []);
      default:
        return this.#options.serveMetrics && path === this.#options.runtime.current.config.metrics.path
          ? (head, res) => this.#metrics(head, res)
          : undefined;
    }
  }

  async #metrics(head: boolean, res: ServerResponse): Promise<void> {
    const { contentType, body } = await this.#options.metrics.expose();
    const bytes = Buffer.from(body);
    res.writeHead(200, { 'content-type': contentType, 'content-length': bytes.length });
    res.end(head ? undefined : bytes);
  }

  /**
   * Ready when the configuration is loaded (it is, or perch would not be running), every endpoint
   * has an upstream whose latest exchange answered, and every registered check passes.
   */
  async #ready(head: boolean, res: ServerResponse): Promise<void> {
    const { upstreams } = this.#options.runtime.current;
    const checks: Record<string, string> = { config: 'ok' };
    for (const endpoint of ENDPOINT_NAMES) {
      checks[`route:${endpoint}`] = upstreams.usable(endpoint).length > 0 ? 'ok' : 'no usable upstream';
    }
    for (const [name, check] of this.#checks) {
      checks[name] = await Promise.resolve()
        .then(check)
        .then(
          (ok) => (ok ? 'ok' : 'unavailable'),
          () => 'unavailable',
        );
    }
    const ok = Object.values(checks).every((value) => value === 'ok');
    sendJson(res, head, ok ? 200 : 503, ok ? { status: 'ok', checks } : { status: 'unavailable', checks });
  }
}

function sendJson(res: ServerResponse, head: boolean, status: number, body: unknown): void {
  // Probes poll often and intermediaries must not answer them from a cache.
  send(res, head, status, Buffer.from(JSON.stringify(body)), ['cache-control', 'no-store']);
}
