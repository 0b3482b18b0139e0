import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import type { Client, KeyStore } from '../auth/key-store.js';
import { passThrough, type UpstreamVerifier } from '../auth/upstream-verifier.js';
import type { ReadThrough, Served } from '../cache/read-through.js';
import { variant } from '../cache/entry.js';
import type { Config } from '../config/types.js';
import type { ErrorCode } from '../errors/error-table.js';
import type { HeaderList } from '../header-list.js';
import type { Logger } from '../logging/logger.js';
import type { PerchMetrics } from '../metrics/metrics.js';
import type { RateLimits } from '../ratelimit/rate-limits.js';
import type { Verdict } from '../ratelimit/token-bucket.js';
import type { Tracing } from '../tracing/tracing.js';
import type { BudgetBook } from '../upstream/budget-book.js';
import { codingTag, negotiate } from '../server/accept-encoding.js';
import { httpDate, notModified } from '../server/conditional.js';
import { pushCachePolicy, send, sendError, sendNotModified } from '../server/respond.js';
import { presentedKey } from '../server/api-key.js';
import { requestIdFrom } from '../server/request-id.js';
import { matchRoute, type RouteMatch } from '../url-table.js';
import { base, recorder, type Exchange } from './exchange.js';

export interface HandlerDeps {
  /** What a SIGHUP reload replaces (the `Runtime`): read per request, never kept. */
  readonly live: {
    readonly current: {
      readonly config: Config;
      readonly keys: KeyStore;
      /** Pass-through auth (`auth.mode: upstream`) in place of `keys`; absent in mode `keys`. */
      readonly verifier?: UpstreamVerifier;
    };
  };
  /** The caching policy: memory, Redis, stale, coalesced fetch (cache/read-through.ts). */
  readonly cache: ReadThrough;
  readonly rateLimits: RateLimits;
  /** Each key's provider-call budget as this instance learned it, for the `provider` policy. */
  readonly budgets: BudgetBook;
  readonly logger: Logger;
  readonly metrics: PerchMetrics;
  /** Absent: tracing is off, and a request costs nothing for it. */
  readonly tracing?: Tracing;
}

/**
 * The request path, top to bottom: request id -> authenticate -> route -> rate limit -> method
 * and parameters -> read through the cache -> respond -> access log. Every response leaves
 * through `finish`, so every response is logged once with the same fields.
 */
export function createRequestHandler(deps: HandlerDeps): (req: IncomingMessage, res: ServerResponse) => void {
  const { cache, rateLimits, logger, metrics, tracing } = deps;
  const record = recorder(logger, metrics);
  /** Per connection, whether it is gone (`gone`). */
  const connections = new WeakMap<Socket, AbortSignal>();

  return function handle(req, res) {
    const requestId = requestIdFrom(req.headers['x-request-id']);
    // Every field is set here, the unknown ones undefined, so every exchange has one shape and
    // the later assignments on the hit path are plain stores, not shape transitions.
    const x: Exchange = {
      req,
      res,
      head: req.method === 'HEAD',
      requestId,
      started: performance.now(),
      client: undefined,
      route: undefined,
      limit: undefined,
      cache: 'none',
      upstream: undefined,
      upstreamMs: undefined,
      upstreamCall: undefined,
      batch: undefined,
      budget: undefined,
      trace: undefined,
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
    const presented = presentedKey(x.req);
    const { keys, verifier } = deps.live.current;
    if (verifier === undefined) return identified(x, keys.authenticate(presented, x.req.socket), undefined);
    const forwarded = verifier.authenticate(presented, x.req.socket.remoteAddress);
    // Pass-through with Redis: another instance may have heard the provider reject a key accepted here.
    const reconciled = forwarded === undefined ? undefined : verifier.reconcile(forwarded);
    if (reconciled !== undefined) return reconciled.then((client) => identified(x, client, verifier));
    return identified(x, forwarded, verifier);
  }

  /** Everything after the key is checked; `verifier`: pass-through auth, which read the key. */
  function identified(x: Exchange, client: Client | undefined, verifier: UpstreamVerifier | undefined): Promise<void> | undefined {
    // Started after the key is checked: a caller's trace context counts for an accepted key only.
    if (tracing !== undefined) {
      const forwarded = passThrough(client);
      x.trace = tracing.request(x.req, x.requestId, forwarded === undefined ? client !== undefined : verifier!.accepted(forwarded));
    }
    if (client === undefined) return fail(x, 'E401');
    x.client = client;

    const match = matchRoute(x.req.url ?? '/');
    if (match.kind === 'unknown') return fail(x, 'E404');
    x.route = match.kind === 'endpoint' ? match.request.endpoint : match.endpoint;
    const methodAllowed = x.req.method === 'GET' || x.head;
    // A plan with free hits needs to know whether the cache can answer before it can price the
    // request, so the cache is looked at first; the entry found then is the one served.
    const plan = rateLimits.plan(deps.live.current.config, client);
    const hit = methodAllowed && match.kind === 'endpoint' && plan.costOfHit === 0 ? cache.hit(match.request, client) : undefined;
    const verdict = rateLimits.take(client, plan, hit === undefined ? 1 : 0);
    if (verdict instanceof Promise) return verdict.then((v) => admit(x, match, methodAllowed, v, hit));
    return admit(x, match, methodAllowed, verdict, hit);
  }

  /**
   * Everything after the rate limiter. 405s and 400s have spent a token too: otherwise malformed
   * requests would be a free way to keep perch busy.
   */
  function admit(
    x: Exchange,
    match: Exclude<RouteMatch, { kind: 'unknown' }>,
    methodAllowed: boolean,
    verdict: Verdict,
    hit: Served | undefined,
  ): Promise<void> | undefined {
    x.limit = verdict;
    const budget = deps.live.current.config.rate_limits[x.client!.plan]?.provider_calls;
    if (budget !== undefined) x.budget = () => deps.budgets.standing(x.client!.id, budget);
    if (!verdict.allowed) return fail(x, 'E429');
    if (!methodAllowed) return fail(x, 'E405', ['allow', 'GET, HEAD']);
    if (match.kind === 'invalid') return fail(x, 'E400', [], match.message);
    // A memory hit is answered synchronously: no await on the hottest path.
    const served = hit ?? cache.hit(match.request, x.client!);
    if (served !== undefined) return respond(x, served);
    // A flight that waits on another instance's lease for clients that all left stops waiting.
    return cache.fetch(match.request, x.client!, x.trace, gone(x.req.socket)).then((fetched) => respond(x, fetched));
  }

  /**
   * Aborted once the connection is gone, which only its close tells: a client's FIN may be a
   * half-close (listener.ts). The connection's, not the response's: a response queued behind a
   * pipelined one never hears of it. One per connection, whatever it pipelines; it may be gone
   * already (while a rate-limit turn was read from Redis, say), its close heard by nobody.
   */
  function gone(socket: Socket): AbortSignal {
    let signal = connections.get(socket);
    if (signal !== undefined) return signal;
    const controller = new AbortController();
    signal = controller.signal;
    if (socket.destroyed) controller.abort();
    else socket.once('close', () => controller.abort());
    connections.set(socket, signal);
    return signal;
  }

  function respond(x: Exchange, served: Served): undefined {
    x.cache = served.outcome;
    x.upstream = served.upstream;
    x.upstreamMs = served.upstreamMs;
    x.upstreamCall = served.upstreamCall;
    x.batch = served.batch;
    const own: HeaderList = served.ageSeconds === undefined ? ['cache-status', served.cacheStatus] : ['cache-status', served.cacheStatus, 'age', served.ageSeconds];
    const headers = base(x, own);
    const { compression } = deps.live.current.config.cache;
    const { entry } = served;
    // An entry may have variants whatever this instance's compression says now: made before a
    // reload turned it off, or by another instance through Redis. Its answer is negotiated all
    // the same, so it varies on Accept-Encoding too.
    const negotiated = compression.brotli || compression.gzip || (entry !== undefined && entry.brBytes + entry.gzipBytes > 0);
    pushCachePolicy(headers, served.status, served.maxAgeSeconds, negotiated);
    if (served.retryAfterSeconds !== undefined) headers.push('retry-after', served.retryAfterSeconds);
    if (entry === undefined || served.status !== 200) {
      send(x.res, x.head, served.status, served.body, headers);
      return finish(x, served.status);
    }
    // A 200 the cache holds: the coding the client takes best, its own tag, and a 304 when the
    // client's copy is that representation already.
    const coding = negotiate(x.req.headers['accept-encoding'], entry);
    const tag = codingTag(entry.etag, coding);
    // No date where none is exact (entry.ts): a wrong one could earn a 304 for other bytes.
    if (entry.undated) headers.push('etag', tag);
    else headers.push('etag', tag, 'last-modified', httpDate(entry.modifiedAt));
    if (notModified(x.req.headers['if-none-match'], x.req.headers['if-modified-since'], tag, entry.modifiedAt, entry.undated)) {
      if (x.cache === 'hit') x.cache = 'revalidated';
      sendNotModified(x.res, headers);
      return finish(x, 304);
    }
    if (coding !== undefined) headers.push('content-encoding', coding);
    send(x.res, x.head, 200, coding === undefined ? entry.body : variant(entry, coding), headers);
    return finish(x, 200);
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
    record(x, status);
    return undefined;
  }
}
