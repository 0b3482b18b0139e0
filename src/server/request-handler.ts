import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Client, KeyStore } from '../auth/key-store.js';
import { passThrough, type PassThroughClient, type UpstreamVerifier } from '../auth/upstream-verifier.js';
import { Coalescer } from '../cache/coalescer.js';
import { counterpart } from '../cache/cross-population.js';
import { ageSeconds, remainingTtlSeconds, type CacheEntry } from '../cache/entry.js';
import type { Generation } from '../cache/generation.js';
import { forwardCacheStatus, hitCacheStatus, staleCacheStatus, type CacheOutcome } from '../cache/outcome.js';
import type { SharedFlights } from '../cache/shared-flight.js';
import type { TieredCache } from '../cache/tiered-cache.js';
import type { Clock } from '../clock.js';
import type { Config } from '../config/types.js';
import { notFoundSubject, type EndpointName, type EndpointRequest } from '../endpoints.js';
import { ERROR_MESSAGES, ERROR_TABLE, errorBody, type ErrorCode } from '../errors/error-table.js';
import type { HeaderList } from '../header-list.js';
import { clip, loggedPath } from '../observability/access-log-fields.js';
import { createAccessLog } from '../observability/access-log.js';
import type { Logger } from '../observability/logger.js';
import type { PerchMetrics } from '../observability/metrics.js';
import { pushRateLimitHeaders } from '../ratelimit/headers.js';
import type { RateLimits } from '../ratelimit/rate-limits.js';
import type { Verdict } from '../ratelimit/token-bucket.js';
import { isWaitRefusal, secondsUntil, type Payer } from '../upstream/upstream.js';
import type { BudgetBook, BudgetStanding } from '../upstream/budget-book.js';
import type { UpstreamSet } from '../upstream/upstream-set.js';
import { requestIdFrom } from './request-id.js';
import { pushCachePolicy, send, sendError } from './respond.js';
import { INVALID, matchRoute, type RouteMatch } from './route.js';

/**
 * `config`, `keys` and `upstreams` are replaced by a SIGHUP reload (server.ts passes getters over
 * the `Runtime`), so the handler reads them per request and never keeps them.
 */
export interface HandlerDeps {
  readonly config: Config;
  readonly keys: KeyStore;
  /** Pass-through auth (`auth.mode: upstream`) in place of `keys`; absent in mode `keys`. */
  readonly verifier?: UpstreamVerifier;
  readonly cache: TieredCache;
  /** Coalescing across instances; absent without Redis. */
  readonly sharedFlights?: SharedFlights;
  readonly upstreams: UpstreamSet;
  readonly rateLimits: RateLimits;
  /** Each key's provider-call budget as this instance learned it, for the `provider` policy. */
  readonly budgets: BudgetBook;
  readonly clock: Clock;
  readonly logger: Logger;
  readonly metrics: PerchMetrics;
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
  /** Absent when another instance fetched it and this one read the result from Redis. */
  readonly upstream?: string;
  readonly upstreamMs?: number;
  /** Whether the provider was really called for it (an exchange, not only refusals). */
  readonly called?: boolean;
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
  /** The rate limiter's answer; from then on every response carries the rate-limit headers. */
  limit?: Verdict;
  cache: CacheOutcome;
  upstream?: string;
  upstreamMs?: number;
  /** This request's miss made a provider call: its key paid for it. */
  upstreamCall?: boolean;
  /**
   * The key's provider-call budget now, when its plan has one: a second rate-limit policy, read
   * when the headers are written, so a miss's answer counts the call it made.
   */
  budget?: () => BudgetStanding;
}

const NOT_FOUND_BODIES = {
  user: errorBody('E404', ERROR_MESSAGES.userNotFound),
  tweet: errorBody('E404', ERROR_MESSAGES.tweetNotFound),
} as const;

/**
 * The request path, top to bottom: request id -> authenticate -> route -> rate limit -> method
 * and parameters -> memory cache -> coalesced upstream fetch -> store -> respond -> access log.
 * Every response leaves through `finish`, so every response is logged once with the same fields.
 */
export function createRequestHandler(deps: HandlerDeps): (req: IncomingMessage, res: ServerResponse) => void {
  const { cache, sharedFlights, rateLimits, clock, logger, metrics } = deps;
  const flights = new Coalescer<Fetched>();
  const accessLog = createAccessLog(logger);

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
    const presented = x.req.headers['x-api-key'];
    const client = deps.verifier === undefined ? deps.keys.authenticate(presented, x.req.socket) : deps.verifier.authenticate(presented);
    if (client === undefined) return fail(x, 'E401');
    x.client = client;

    const match = matchRoute(x.req.url ?? '/');
    if (match.kind === 'unknown') return fail(x, 'E404');
    x.route = match.kind === 'endpoint' ? match.request.endpoint : match.endpoint;
    const methodAllowed = x.req.method === 'GET' || x.head;
    // A plan with free hits needs to know whether the cache can answer before it can price the
    // request, so the cache is looked at first; the entry found then is the one served.
    const plan = rateLimits.plan(deps.config, client);
    const hit = methodAllowed && match.kind === 'endpoint' && plan.costOfHit === 0 && trusted(client) ? lookup(match.request.path) : undefined;
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
    hit: CacheEntry | undefined,
  ): Promise<void> | undefined {
    x.limit = verdict;
    const budget = deps.config.rate_limits[x.client!.plan]?.provider_calls;
    if (budget !== undefined) x.budget = () => deps.budgets.standing(x.client!.id, budget);
    if (!verdict.allowed) return fail(x, 'E429');
    if (!methodAllowed) return fail(x, 'E405', ['allow', 'GET, HEAD']);
    if (match.kind === 'invalid') return fail(x, 'E400', [], match.message);
    const request = match.request;

    // A memory hit is answered synchronously: no await on the hottest path.
    const local = hit === undefined ? (trusted(x.client!) ? cache.local(request.path) : undefined) : { entry: hit, fresh: true };
    if (local?.fresh === true) return answerHit(x, local.entry, 'memory');
    return forward(x, request, local?.entry);
  }

  function answerHit(x: Exchange, entry: CacheEntry, tier: 'memory' | 'redis'): undefined {
    x.cache = 'hit';
    const now = clock.now();
    const age = ageSeconds(entry, now);
    const headers = base(x, ['cache-status', hitCacheStatus(entry, now, tier), 'age', age]);
    send(x.res, x.head, entry.status, entry.body, pushCachePolicy(headers, entry.status, age + remainingTtlSeconds(entry, now)));
    return finish(x, entry.status);
  }

  /** `stale` is this instance's expired-but-retained entry, if any. */
  async function forward(x: Exchange, request: EndpointRequest, stale: CacheEntry | undefined): Promise<void> {
    const verified = trusted(x.client!);
    const remote = verified ? await cache.remote(request.path) : undefined;
    if (remote?.fresh === true) return void answerHit(x, remote.entry, 'redis');
    if (remote !== undefined && (stale === undefined || remote.entry.storedAt > stale.storedAt)) stale = remote.entry;
    if (stale !== undefined) return revalidate(x, request, stale);

    // Pass-through: one flight per key, so a key never receives the answer to another key's call.
    const pass = passThrough(x.client);
    const payer = payerOf(x.client!);
    const flight = flights.run(pass === undefined ? request.path : `${pass.digest}\n${request.path}`, () => fetchFor(request, pass, payer));
    const fetched = await flight.promise;
    // No upstream: another instance fetched it, and this flight read the result from Redis.
    const viaRedis = fetched.upstream === undefined;
    x.cache = flight.leader && !viaRedis ? 'miss' : 'coalesced';
    x.upstream = fetched.upstream;
    if (flight.leader) {
      x.upstreamMs = fetched.upstreamMs;
      x.upstreamCall = fetched.called === true;
    }
    const maxAge = fetched.stored ? deps.config.cache.ttl_seconds[request.endpoint] : 0;
    const headers = pushCachePolicy(base(x, ['cache-status', forwardCacheStatus(x.cache, fetched.stored, viaRedis)]), fetched.status, maxAge);
    if (fetched.retryAfterSeconds !== undefined) headers.push('retry-after', fetched.retryAfterSeconds);
    send(x.res, x.head, fetched.status, fetched.body, headers);
    finish(x, fetched.status);
  }

  /**
   * Stale-while-revalidate, and stale-if-error by the same token: the client gets the stale
   * entry at once, one refresh runs behind it, and a refresh that fails (error, timeout, 429)
   * stores nothing, so the stale entry keeps being served until its retention ends.
   */
  function revalidate(x: Exchange, request: EndpointRequest, entry: CacheEntry): void {
    flights.run(request.path, () => fetchAndStore(request, passThrough(x.client), payerOf(x.client!))).promise.catch((error: unknown) => {
      logger.error({ err: error, route: request.endpoint }, 'background refresh failed');
    });
    x.cache = 'stale';
    const now = clock.now();
    const headers = base(x, ['cache-status', staleCacheStatus(entry, now), 'age', ageSeconds(entry, now)]);
    send(x.res, x.head, entry.status, entry.body, pushCachePolicy(headers, entry.status, 0));
    finish(x, entry.status);
  }

  /**
   * Pass-through auth: the call of a key the provider has not accepted lately is its own
   * verifying call (upstream-verifier.ts), never another instance's result read from Redis.
   */
  async function fetchFor(request: EndpointRequest, client: PassThroughClient | undefined, payer: Payer): Promise<Fetched> {
    if (client === undefined || trusted(client)) return fetchAndStore(request, client, payer);
    const verifying = deps.verifier?.verifying(client, () => fetchUpstream(request, payer, client));
    return (await verifying) ?? errorFetched('E401');
  }

  /**
   * One upstream exchange and its effect on the cache; runs once per coalesced flight. With
   * Redis, another instance may already be fetching the same key: then its result is used.
   * `client`: pass-through auth, whose key is the call's credential.
   */
  async function fetchAndStore(request: EndpointRequest, client: PassThroughClient | undefined, payer: Payer): Promise<Fetched> {
    const claim = sharedFlights === undefined ? undefined : await sharedFlights.claim(request.endpoint, request.path);
    if (claim?.kind === 'entry') return { status: claim.entry.status, body: claim.entry.body, stored: false };
    try {
      return await fetchUpstream(request, payer, client);
    } finally {
      // After the store above completed, so a waiting instance finds the entry, not a free lease.
      claim?.release();
    }
  }

  async function fetchUpstream(request: EndpointRequest, payer: Payer, client?: PassThroughClient): Promise<Fetched> {
    const ttl = deps.config.cache.ttl_seconds;
    // Before the fetch: a purge observed while it runs must keep its response out of the cache.
    const stamp = cache.generations.stamp(request.path);
    const { result, upstream, ms, called } = await deps.upstreams.fetch(request, client && { id: client.id, key: client.key }, payer);
    const via = { upstream, upstreamMs: ms, called };
    if (client !== undefined) deps.verifier?.judge(client, result);
    switch (result.kind) {
      case 'ok': {
        // Cross-population: a user's 200 also answers the other user route.
        const twin = counterpart(request.endpoint, result.body);
        const twinGeneration = twin && cache.generations.restamp(stamp, twin.path);
        const [stored] = await Promise.all([
          store(request, 200, result.body, ttl[request.endpoint], stamp),
          twin && twinGeneration && store(twin, 200, result.body, ttl[twin.endpoint], twinGeneration),
        ]);
        return { status: 200, body: result.body, stored, ...via };
      }
      case 'not_found': {
        const body = NOT_FOUND_BODIES[notFoundSubject(request.endpoint)];
        return { status: 404, body, stored: await store(request, 404, body, ttl.not_found, stamp), ...via };
      }
      case 'bad_request':
        return { ...errorFetched('E400', INVALID.cursor), ...via };
      case 'rate_limited':
        // The pool has logged the stop once; every request it turns away need not be.
        return { ...errorFetched('E429'), retryAfterSeconds: secondsUntil(result.untilMs, clock.now()), ...via };
      case 'refused':
        // perch made no call: a "wait" the client can act on is a 429, anything else an upstream error.
        return isWaitRefusal(result.reason)
          ? { ...errorFetched('E429'), retryAfterSeconds: result.retryAfterSeconds, ...via }
          : { ...errorFetched('E502'), ...via };
      case 'failed':
        // Pass-through: the provider rejected the client's own key.
        if (client !== undefined && result.failure === 'unauthorized') return { ...errorFetched('E401'), ...via };
        // The pool logs a rejected credential; everything else is the provider's.
        if (result.failure !== 'unauthorized') logger.warn({ upstream, route: request.endpoint, failure: result.failure, reason: result.reason }, 'upstream failed');
        return { ...errorFetched('E502'), ...via };
      case 'timeout':
        logger.warn({ upstream, route: request.endpoint, reason: result.reason }, 'upstream timed out');
        return { ...errorFetched('E504'), ...via };
    }
  }

  /**
   * Who a miss's call is for, to share the provider's call cap fairly: the key whose miss makes
   * it (coalesced followers ride on the leader's), weighted by its plan's `provider_weight`.
   */
  function payerOf(client: Client): Payer {
    const plan = deps.config.rate_limits[client.plan];
    const payer = { id: client.id, weight: plan?.provider_weight ?? 1, label: client.metricsId ?? client.id };
    return plan?.provider_calls === undefined ? payer : { ...payer, budget: plan.provider_calls };
  }

  /** Pass-through auth: the cache answers only keys the provider accepted lately (upstream-verifier.ts). */
  function trusted(client: Client): boolean {
    const pass = passThrough(client);
    return pass === undefined || deps.verifier?.accepted(pass) === true;
  }

  /** A fresh entry of the memory tier, answered synchronously. */
  function lookup(key: string): CacheEntry | undefined {
    const found = cache.local(key);
    return found?.fresh === true ? found.entry : undefined;
  }

  async function store(request: EndpointRequest, status: 200 | 404, body: Buffer, ttlSeconds: number, generation: Generation): Promise<boolean> {
    if (ttlSeconds <= 0) return false;
    return cache.store(request.path, { status, body, storedAt: clock.now(), ttlMs: ttlSeconds * 1000, generation });
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
    const ms = performance.now() - x.started;
    metrics.request(x.route ?? 'none', status, x.cache, ms / 1000);
    if (x.client !== undefined) metrics.keyRequest(x.client.metricsId ?? x.client.id, status, x.cache);
    // Only perch's own refusals: an upstream 429 leaves the limiter's verdict allowed.
    if (x.limit?.allowed === false && x.client !== undefined) metrics.rateLimited(x.client.metricsId ?? x.client.id);
    accessLog({
      req_id: x.requestId,
      method: x.req.method,
      path: loggedPath(x.req.url),
      route: x.route ?? null,
      status,
      cache: x.cache,
      upstream: x.upstream ?? null,
      upstream_ms: x.upstreamMs === undefined ? null : round(x.upstreamMs),
      upstream_call: x.upstreamCall === true,
      ms: round(ms),
      key_id: x.client?.id ?? null,
      remote: x.req.socket.remoteAddress ?? null,
      user_agent: clip(x.req.headers['user-agent']),
    });
    return undefined;
  }
}

function errorFetched(code: ErrorCode, message?: string): Fetched {
  return { status: ERROR_TABLE[code].status, body: errorBody(code, message), stored: false };
}

/** Headers every response carries, before the response's own. */
function base(x: Exchange, headers: HeaderList): HeaderList {
  headers.push('x-request-id', x.requestId);
  if (x.limit !== undefined) pushRateLimitHeaders(headers, x.limit, x.budget?.());
  return headers;
}

function round(ms: number): number {
  return Math.round(ms * 100) / 100;
}
