import type { IncomingMessage, ServerResponse } from 'node:http';
import { ENDPOINT_NAMES } from '../endpoints.js';
import { errorBody } from '../errors/error-table.js';
import type { Logger } from '../logging/logger.js';
import type { PerchMetrics } from '../metrics/metrics.js';
import { OPENAPI_DOCUMENT } from '../openapi/document.js';
import { send } from '../server/respond.js';
import { splitTarget, type OperationalRoute } from '../url-table.js';
import type { Runtime } from './runtime.js';

/** RFC 6750's `Authorization: Bearer <token>`, the scheme case-insensitive. */
const BEARER = /^Bearer +(\S+) *$/i;

/** A readiness condition owned elsewhere (e.g. "Redis reachable"); true when satisfied. */
export type ReadinessCheck = () => boolean | Promise<boolean>;

export interface PublicRoutesOptions {
  readonly runtime: Runtime;
  readonly metrics: PerchMetrics;
  readonly logger: Logger;
}

/** The operational routes answered here; admin's are admin/'s. */
export type PublicRoute = Exclude<OperationalRoute, 'purge' | 'status_page' | 'status_json'>;

/**
 * Operational endpoints answered without an API key and without spending a rate-limit token:
 * probes and scrapers carry no key, and must keep working when clients exhaust their limits.
 * They are dispatched before the API handler, so they never appear in the API's access log or
 * request metrics.
 */
export class PublicRoutes {
  readonly #options: PublicRoutesOptions;
  readonly #checks = new Map<string, { check: ReadinessCheck; hard: boolean }>();
  readonly #openapi = Buffer.from(JSON.stringify(OPENAPI_DOCUMENT));

  constructor(options: PublicRoutesOptions) {
    this.#options = options;
  }

  /**
   * Adds a condition reported under `name` in `/readyz` `checks`. A `hard` one fails readiness
   * (503); a soft one only marks it `degraded`.
   */
  addReadinessCheck(name: string, check: ReadinessCheck, options: { hard?: boolean } = {}): void {
    this.#checks.set(name, { check, hard: options.hard === true });
  }

  /** Answers one of these routes (the URL table picked it). */
  handle(route: PublicRoute, req: IncomingMessage, res: ServerResponse): void {
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      send(res, req.method === 'HEAD', 405, errorBody('E405'), ['allow', 'GET, HEAD']);
      return;
    }
    if (route === 'metrics' && !this.#scraperAllowed(req)) {
      send(res, req.method === 'HEAD', 401, errorBody('E401'), []);
      return;
    }
    this.#serve(route, req.method === 'HEAD', res).catch((error: unknown) => {
      this.#options.logger.error({ err: error, route }, 'error serving an operational endpoint');
      if (!res.headersSent) send(res, false, 500, errorBody('E500'), []);
      else res.destroy();
    });
  }

  /** The metrics endpoint alone, for the separate `metrics.port` listener. */
  handleMetricsOnly(req: IncomingMessage, res: ServerResponse): void {
    const [path] = splitTarget(req.url ?? '/');
    if (path !== this.#options.runtime.current.config.metrics.path) {
      send(res, req.method === 'HEAD', 404, errorBody('E404'), []);
      return;
    }
    if (!this.#scraperAllowed(req)) {
      send(res, req.method === 'HEAD', 401, errorBody('E401'), []);
      return;
    }
    this.#metrics(req.method === 'HEAD', res).catch(() => res.destroy());
  }

  async #serve(route: PublicRoute, head: boolean, res: ServerResponse): Promise<void> {
    switch (route) {
      case 'healthz':
        return sendJson(res, head, 200, { status: 'ok' });
      case 'readyz':
        return this.#ready(head, res);
      case 'openapi':
        return send(res, head, 200, this.#openapi, []);
      case 'metrics':
        return this.#metrics(head, res);
    }
  }

  /**
   * `metrics.require_admin`: the exposition names every key id with its usage, so it may be kept
   * to scrapers holding an admin key, sent the way Prometheus sends `authorization` credentials
   * (`Authorization: Bearer`) or as the admin route takes it (`X-API-Key`).
   */
  #scraperAllowed(req: IncomingMessage): boolean {
    const { config, adminKeys } = this.#options.runtime.current;
    if (!config.metrics.require_admin) return true;
    const bearer = BEARER.exec(req.headers.authorization ?? '')?.[1];
    return adminKeys?.authenticate(req.headers['x-api-key'] ?? bearer) !== undefined;
  }

  async #metrics(head: boolean, res: ServerResponse): Promise<void> {
    const { contentType, body } = await this.#options.metrics.expose();
    const bytes = Buffer.from(body);
    res.writeHead(200, { 'content-type': contentType, 'content-length': bytes.length });
    res.end(head ? undefined : bytes);
  }

  /**
   * Ready unless this instance itself cannot serve: a registered hard check fails (a draining
   * instance has closed its listener, so a probe meets a refused connection instead). Everything
   * the provider says (credentials rejected, cool-downs, usage caps, an open breaker) and soft
   * dependencies like the Redis tier are shared by every instance of a fleet: failing readiness
   * for them would pull every instance out of the load balancer at once, cache hits included, so
   * they show in `checks` (status `degraded`, with the reason) and in metrics instead.
   */
  async #ready(head: boolean, res: ServerResponse): Promise<void> {
    const { runtime } = this.#options;
    const { upstreams } = runtime.current;
    const reload = runtime.reloadStatus;
    // A refused reload leaves the previous configuration serving: degraded, never unready.
    const checks: Record<string, string> = {
      config: reload.successful
        ? 'ok'
        : `last reload failed at ${new Date(reload.lastFailureMs ?? 0).toISOString()}: serving the configuration loaded at ${new Date(reload.lastSuccessMs).toISOString()}`,
    };
    const statuses = Object.entries(upstreams.status());
    for (const [name, status] of statuses) {
      checks[`upstream:${name}`] =
        status.state === 'ok' ? 'ok' : status.untilMs === undefined ? status.state : `${status.state} until ${new Date(status.untilMs).toISOString()}`;
      // One credential of several rejected: the upstream still answers, but only the operator can
      // fix that credential, and the others carry its share. A credential's own cool-downs and
      // caps are the rotation's ordinary weather and stay in metrics.
      if (status.state === 'no_credential') continue;
      for (const [id, credential] of Object.entries(status.credentials)) {
        if (credential.state !== 'revoked') continue;
        checks[`credential:${name}/${id}`] = credential.untilMs === undefined ? 'revoked' : `revoked until ${new Date(credential.untilMs).toISOString()}`;
      }
    }
    for (const endpoint of ENDPOINT_NAMES) {
      checks[`route:${endpoint}`] = upstreams.usable(endpoint).length > 0 ? 'ok' : 'no usable upstream';
    }
    let hardFailure = false;
    for (const [name, { check, hard }] of this.#checks) {
      const ok = await Promise.resolve()
        .then(check)
        .catch(() => false);
      checks[name] = ok ? 'ok' : 'unavailable';
      if (!ok && hard) hardFailure = true;
    }
    const degraded = Object.values(checks).some((value) => value !== 'ok');
    const status = hardFailure ? 'unavailable' : degraded ? 'degraded' : 'ok';
    sendJson(res, head, hardFailure ? 503 : 200, { status, checks });
  }
}

function sendJson(res: ServerResponse, head: boolean, status: number, body: unknown): void {
  // Probes poll often and intermediaries must not answer them from a cache.
  send(res, head, status, Buffer.from(JSON.stringify(body)), ['cache-control', 'no-store']);
}
