import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Client, KeyStore } from '../auth/key-store.js';
import { Coalescer } from '../cache/coalescer.js';
import { ageSeconds, isFresh, type CacheEntry } from '../cache/entry.js';
import type { MemoryStore } from '../cache/memory-store.js';
import { forwardCacheStatus, hitCacheStatus, type CacheOutcome } from '../cache/outcome.js';
import type { Clock } from '../clock.js';
import type { Config } from '../config/types.js';
import { notFoundSubject, type EndpointName, type EndpointRequest } from '../endpoints.js';
import { ERROR_MESSAGES, ERROR_TABLE, errorBody, type ErrorCode } from '../errors/error-table.js';
import type { Logger } from '../observability/logger.js';
import type { UpstreamSet } from '../upstream/upstream-set.js';
import { requestIdFrom } from './request-id.js';
import { send, sendError, type HeaderList } from './respond.js';
import { INVALID, matchRoute } from './route.js';

export interface HandlerDeps {
  readonly config: Config;
  readonly keys: KeyStore;
  readonly cache: MemoryStore;
  readonly upstreams: UpstreamSet;
  readonly clock: Clock;
  readonly logger: Logger;
}

/**
 * What one upstream exchange produced for everyone waiting on it: the leader and every request
 * coalesced onto it answer from the same object.
 */
interface Fetched {
  readonly status: number;
  readonly body: Buffer;
  readonly retryAfterSeconds?: number;
  readonly stored: boolean;
  readonly upstream: string;
  readonly upstreamMs: number;
}

/** Per-request facts gathered on the way, written once to the access log. */
interface Exchange {
  readonly req: IncomingMessage;
  readonly res: ServerResponse;
  readonly head: boolean;
  readonly requestId: string;
  readonly started: number;
  client?: Client;
  route?: EndpointName;
  cache: CacheOutcome;
  upstream?: string;
  upstreamMs?: number;
}

const NOT_FOUND_BODIES = {
  user: errorBody('E404', ERROR_MESSAGES.userNotFound),
  tweet: errorBody('E404', ERROR_MESSAGES.tweetNotFound),
} as const;

/**
 * The request path, top to bottom: request id -> authenticate -> route and validate -> memory
 * cache -> coalesced upstream fetch -> store -> respond -> access log. Every response leaves
 * through `finish`, so every response is logged once with the same fields.
 */
export function createRequestHandler(deps: HandlerDeps): (req: IncomingMessage, res: ServerResponse) => void {
  const { keys, cache, upstreams, clock, logger } = deps;
  const ttl = deps.config.cache.ttl_seconds;
  const flights = new Coalescer<Fetched>();

  return function handle(req, res) {
    const x: Exchange = {
      req,
      res,
      head: req.method === 'HEAD',
      requestId: requestIdFrom(req.headers['x-request-id']),
      started: performance.now(),
      cache: 'none',
    };
    try {
      const pending = serve(x);
      if (pending !== undefined) pending.catch((error: unknown) => internalError(x, error));
    } catch (error) {
      internalError(x, error);
    }
  };

  function serve(x: Exchange): Promise<void> | undefined {
    // The key is checked before anything else, so an unauthenticated caller learns nothing,
    // not even which routes exist.
    const client = keys.authenticate(x.req.headers['x-api-key']);
    if (client === undefined) return fail(x, 'E401');
    x.client = client;

    const match = matchRoute(x.req.url ?? '/');
    if (match.kind === 'unknown') return fail(x, 'E404');
    if (x.req.method !== 'GET' && !x.head) return fail(x, 'E405', ['allow', 'GET, HEAD']);
    if (match.kind === 'invalid') return fail(x, 'E400', [], match.message);
    const request = match.request;
    x.route = request.endpoint;

    const entry = lookup(request.path);
    if (entry !== undefined) {
      x.cache = 'hit';
      const now = clock.now();
      send(x.res, x.head, entry.status, entry.body, base(x, ['cache-status', hitCacheStatus(entry, now), 'age', ageSeconds(entry, now)]));
      return finish(x, entry.status);
    }
    return forward(x, request);
  }

  async function forward(x: Exchange, request: EndpointRequest): Promise<void> {
    const flight = flights.run(request.path, () => fetchAndStore(request));
    const fetched = await flight.promise;
    x.cache = flight.leader ? 'miss' : 'coalesced';
    x.upstream = fetched.upstream;
    if (flight.leader) x.upstreamMs = fetched.upstreamMs;
    const headers = base(x, ['cache-status', forwardCacheStatus(x.cache, fetched.stored)]);
    if (fetched.retryAfterSeconds !== undefined) headers.push('retry-after', fetched.retryAfterSeconds);
    send(x.res, x.head, fetched.status, fetched.body, headers);
    finish(x, fetched.status);
  }

  /** One upstream exchange and its effect on the cache; runs once per coalesced flight. */
  async function fetchAndStore(request: EndpointRequest): Promise<Fetched> {
    const { result, upstream, ms } = await upstreams.fetch(request);
    const via = { upstream, upstreamMs: ms };
    switch (result.kind) {
      case 'ok':
        return { status: 200, body: result.body, stored: store(request, 200, result.body, ttl[request.endpoint]), ...via };
      case 'not_found': {
        const body = NOT_FOUND_BODIES[notFoundSubject(request.endpoint)];
        return { status: 404, body, stored: store(request, 404, body, ttl.not_found), ...via };
      }
      case 'bad_request':
        return { ...errorFetched('E400', INVALID.cursor), ...via };
      case 'rate_limited':
        logger.warn({ upstream, route: request.endpoint, retry_after: result.retryAfterSeconds }, 'upstream rate limited perch');
        return { ...errorFetched('E429'), retryAfterSeconds: result.retryAfterSeconds, ...via };
      case 'failed':
        // A rejected credential is the operator's to fix; everything else is the provider's.
        if (result.failure === 'unauthorized') logger.error({ upstream, reason: result.reason }, 'upstream rejected perch credentials');
        else logger.warn({ upstream, route: request.endpoint, failure: result.failure, reason: result.reason }, 'upstream failed');
        return { ...errorFetched('E502'), ...via };
      case 'timeout':
        logger.warn({ upstream, route: request.endpoint, reason: result.reason }, 'upstream timed out');
        return { ...errorFetched('E504'), ...via };
    }
  }

  function lookup(key: string): CacheEntry | undefined {
    const entry = cache.get(key);
    return entry !== undefined && isFresh(entry, clock.now()) ? entry : undefined;
  }

  function store(request: EndpointRequest, status: 200 | 404, body: Buffer, ttlSeconds: number): boolean {
    if (ttlSeconds <= 0) return false;
    const ttlMs = ttlSeconds * 1000;
    cache.set(request.path, { status, body, storedAt: clock.now(), ttlMs }, ttlMs);
    return true;
  }

  function fail(x: Exchange, code: ErrorCode, headers: HeaderList = [], message?: string): undefined {
    finish(x, sendError(x.res, x.head, code, base(x, headers), message));
    return undefined;
  }

  function internalError(x: Exchange, error: unknown): void {
    logger.error({ err: error, req_id: x.requestId }, 'unhandled error while serving a request');
    if (x.res.headersSent) {
      x.res.destroy();
      return;
    }
    fail(x, 'E500');
  }

  function finish(x: Exchange, status: number): undefined {
    logger.info(
      {
        req_id: x.requestId,
        method: x.req.method,
        route: x.route ?? null,
        status,
        cache: x.cache,
        upstream: x.upstream ?? null,
        upstream_ms: x.upstreamMs === undefined ? null : round(x.upstreamMs),
        ms: round(performance.now() - x.started),
        key_id: x.client?.id ?? null,
      },
      'request',
    );
    return undefined;
  }
}

function errorFetched(code: ErrorCode, message?: string): Omit<Fetched, 'upstream' | 'upstreamMs'> {
  return { status: ERROR_TABLE[code].status, body: errorBody(code, message), stored: false };
}

/** Headers every response carries, before the response's own. */
function base(x: Exchange, headers: HeaderList): HeaderList {
  headers.push('x-request-id', x.requestId);
  return headers;
}

function round(ms: number): number {
  return Math.round(ms * 100) / 100;
}
