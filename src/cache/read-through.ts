import { LRUCache } from 'lru-cache';
import type { Client } from '../auth/key-store.js';
import { passThrough, type PassThroughClient, type UpstreamVerifier } from '../auth/upstream-verifier.js';
import type { Clock } from '../clock.js';
import type { Config } from '../config/types.js';
import type { EndpointRequest } from '../endpoints.js';
import type { Logger } from '../logging/logger.js';
import type { TraceSpan } from '../tracing/trace-span.js';
import { answerFor, errorAnswer, type UpstreamAnswer } from '../upstream/answer.js';
import type { Payer } from '../upstream/upstream.js';
import type { UpstreamSet } from '../upstream/upstream-set.js';
import { Coalescer } from './coalescer.js';
import { counterpart } from './cross-population.js';
import { ageSeconds, entityTag, modification, remainingTtlSeconds, withVariants, type CacheEntry, type Dated } from './entry.js';
import type { Generation } from './generation.js';
import { backoffCacheStatus, forwardCacheStatus, hitCacheStatus, staleCacheStatus, type CacheOutcome } from './outcome.js';
import { RefreshBackoff, type PermanentAnswer } from './refresh-backoff.js';
import type { SharedFlights } from './shared-flight.js';
import type { Found, TieredCache } from './tiered-cache.js';

/** A key to store an answer under, with its TTL and the purge generation its fetch began in. */
interface StoreTarget {
  readonly path: string;
  readonly ttlSeconds: number;
  readonly generation: Generation;
}

/** What a SIGHUP reload replaces, read per request through `current` and never kept. */
export interface LiveState {
  readonly current: {
    readonly config: Config;
    readonly upstreams: UpstreamSet;
    /** Pass-through auth (`auth.mode: upstream`); absent in mode `keys`. */
    readonly verifier?: UpstreamVerifier;
  };
}

export interface ReadThroughDeps {
  readonly live: LiveState;
  readonly cache: TieredCache;
  /** Coalescing across instances; absent without Redis. */
  readonly sharedFlights?: SharedFlights;
  readonly clock: Clock;
  readonly logger: Logger;
  /**
   * Pass-through auth: whether one more verifying call may go out now (undefined), or the
   * seconds to wait. Every key the provider has not accepted yet shares it (`auth.verify_*`).
   */
  readonly verifyTurn?: () => Promise<number | undefined>;
}

/**
 * What the cache answered a request with, ready to send: the handler adds the rate-limit
 * headers and writes it. `outcome` feeds the `Cache-Status` header, the access log and the
 * metrics from one place.
 */
export interface Served {
  readonly outcome: Exclude<CacheOutcome, 'none' | 'revalidated'>;
  readonly status: number;
  readonly body: Buffer;
  /**
   * The cache entry behind a 200: the one served (hit, stale) or the one the answer was stored
   * as (miss, coalesced). Its tag, date and compressed variants serve the response.
   */
  readonly entry?: CacheEntry;
  /** The `Cache-Status` header (RFC 9211). */
  readonly cacheStatus: string;
  /** The `Age` header, whole seconds; absent for an answer fetched now. */
  readonly ageSeconds?: number;
  /** How long clients and shared caches may reuse it (`Cache-Control: max-age`). */
  readonly maxAgeSeconds: number;
  readonly retryAfterSeconds?: number;
  /** The upstream that answered; absent when no upstream was asked for this request. */
  readonly upstream?: string;
  /** Only for the request whose miss made the exchange (the flight's leader). */
  readonly upstreamMs?: number;
  /** This request's miss made a provider call: its key paid for it. */
  readonly upstreamCall?: boolean;
  /** The items of the batch call the miss rode in (the flight's leader only). */
  readonly batch?: number;
}

/**
 * What one upstream exchange produced for everyone waiting on it: the leader and every request
 * coalesced onto it answer from the same object.
 */
interface Fetched extends UpstreamAnswer {
  readonly stored: boolean;
  /** Absent when no upstream was asked: another instance fetched it, or pass-through turned the key away. */
  readonly upstream?: string;
  /** Another instance fetched it, and this flight read the result from Redis. */
  readonly viaRedis?: true;
  readonly upstreamMs?: number;
  /** Whether the provider was really called for it (an exchange, not only refusals). */
  readonly called?: boolean;
  /** The items of the batch call it rode in. */
  readonly batch?: number;
  /** What the answer was stored as; absent when it was not stored. */
  readonly entry?: CacheEntry;
  /** Resolves when the variants are made and Redis has the entry (or gave up). */
  readonly settled?: Promise<void>;
  /** The payer whose own refusal (its budget spent) decided this answer: it is no other key's. */
  readonly refusedPayer?: string;
}

/**
 * The caching policy, read-through: memory, then Redis, then stale-while-revalidate, then one
 * coalesced upstream fetch per key (per instance, and across instances through shared flights),
 * whose answer is stored in both tiers and, for a user, under its twin route too. Purge
 * generations keep a response that may predate a purge out of the cache.
 */
/** Paths whose last body this instance remembers, for `Last-Modified` across a purge or an eviction. */
const DATED_PATHS = 10_000;

export class ReadThrough {
  readonly #deps: ReadThroughDeps;
  readonly #flights = new Coalescer<Fetched>();
  readonly #backoff: RefreshBackoff;
  /**
   * The last body this instance stored per path, dated: a miss after a purge or an eviction has
   * no entry to compare with, and new bytes fetched within the same second as the body they
   * replace must not share its `Last-Modified` unflagged (see `modification`). Bounded; a path
   * it dropped, or one another instance refetched, dates its bytes as a first fetch.
   */
  readonly #dated = new LRUCache<string, Dated>({ max: DATED_PATHS });

  constructor(deps: ReadThroughDeps) {
    this.#deps = deps;
    this.#backoff = new RefreshBackoff(deps.clock);
  }

  /** A fresh entry of this instance's memory, answered synchronously: no await on the hottest path. */
  hit(path: string, client: Client): Served | undefined {
    if (!this.#trusted(client)) return undefined;
    const found = this.#deps.cache.local(path);
    return found?.fresh === true ? this.#hit(found.entry, 'memory') : undefined;
  }

  /**
   * Everything after a memory miss: Redis, a stale entry while one refresh runs, or a fetch.
   * `trace`: the request's span; a flight's spans hang under its leader's.
   */
  async fetch(request: EndpointRequest, client: Client, trace?: TraceSpan): Promise<Served> {
    const { cache } = this.#deps;
    const { config } = this.#deps.live.current;
    const verified = this.#trusted(client);
    const local = verified ? cache.local(request.path) : undefined;
    if (local?.fresh === true) return this.#hit(local.entry, 'memory');
    const permanent = verified ? this.#backoff.waiting(request.path)?.answer : undefined;
    if (permanent !== undefined) return this.#remembered(permanent);
    let stale = local?.entry;
    const remote = verified ? await this.#remote(request.path, trace) : undefined;
    // Memory is read again after the await: a refresh may have landed while Redis answered, and
    // a client served the newer answer must never see the older one after it (issue 50).
    const landed = verified ? cache.local(request.path) : undefined;
    const newest = landed !== undefined && (remote === undefined || landed.entry.storedAt > remote.entry.storedAt) ? landed : remote;
    if (newest?.fresh === true) return this.#hit(newest.entry, newest === remote ? 'redis' : 'memory');
    if (newest !== undefined && (stale === undefined || newest.entry.storedAt > stale.storedAt)) stale = newest.entry;
    if (stale !== undefined) return this.#revalidate(request, client, stale, trace);

    const { flight, fetched } = await this.#join(request, client, trace);
    // A key whose refreshes failed lately: this miss's answer ends or extends its backoff.
    if (flight.leader && this.#backoff.tracks(request.path)) this.#learn(request.path, fetched);
    const viaRedis = fetched.viaRedis === true;
    const outcome = flight.leader && !viaRedis ? 'miss' : 'coalesced';
    // Another instance's entry, read from Redis: cached as much as a hit on it, so it is reused
    // for what is left of its TTL, with its true Age (issue 50: every such follower got max-age=0).
    const shared = viaRedis && fetched.entry !== undefined ? this.#hit(fetched.entry, 'redis') : undefined;
    return {
      outcome,
      status: fetched.status,
      body: fetched.body,
      ...(fetched.entry?.status === 200 ? { entry: fetched.entry } : {}),
      cacheStatus: forwardCacheStatus(outcome, fetched.stored, viaRedis),
      ...(shared === undefined ? {} : { ageSeconds: shared.ageSeconds }),
      maxAgeSeconds: fetched.stored ? config.cache.ttl_seconds[request.endpoint] : (shared?.maxAgeSeconds ?? 0),
      ...(fetched.retryAfterSeconds === undefined ? {} : { retryAfterSeconds: fetched.retryAfterSeconds }),
      ...(fetched.upstream === undefined ? {} : { upstream: fetched.upstream }),
      ...(flight.leader ? { upstreamMs: fetched.upstreamMs, upstreamCall: fetched.called === true, ...(fetched.batch === undefined ? {} : { batch: fetched.batch }) } : {}),
    };
  }

  /**
   * The flight that answers a miss: one per path (per key with pass-through auth, so a key never
   * receives the answer to another key's call). A refusal of the leader's own key (its budget
   * spent) is not an answer for a follower of another key: that follower asks again, leading or
   * joining the path's next flight, and, should that one also end in another key's refusal, a
   * flight of its own key's, which can only answer for that key. So a follower waits at most
   * three flights, and a call is charged to the key that leads it, as for every flight.
   */
  async #join(request: EndpointRequest, client: Client, trace: TraceSpan | undefined): Promise<{ flight: { leader: boolean }; fetched: Fetched }> {
    const pass = passThrough(client);
    const payer = this.#payerOf(client);
    const shared = pass === undefined ? request.path : `${pass.digest}\n${request.path}`;
    for (let round = 0; ; round++) {
      const key = round < 2 ? shared : `${payer.id}\n${shared}`;
      const flight = this.#flights.run(key, () => this.#fetchFor(request, pass, payer, trace));
      const fetched = await flight.promise;
      if (flight.leader || fetched.refusedPayer === undefined || fetched.refusedPayer === payer.id) return { flight, fetched };
    }
  }

  #hit(entry: CacheEntry, tier: 'memory' | 'redis'): Served {
    const now = this.#deps.clock.now();
    const age = ageSeconds(entry, now);
    return {
      outcome: 'hit',
      status: entry.status,
      body: entry.body,
      entry,
      cacheStatus: hitCacheStatus(entry, now, tier),
      ageSeconds: age,
      maxAgeSeconds: age + remainingTtlSeconds(entry, now),
    };
  }

  /**
   * Stale-while-revalidate, and stale-if-error by the same token: the client gets the stale
   * entry at once, one refresh runs behind it, and a refresh that fails (error, timeout, 429)
   * stores nothing, so the stale entry keeps being served until its retention ends. A failed
   * refresh is not started again until its key's backoff ends (refresh-backoff.ts), and one
   * answered with a rejected cursor ends the entry (`#learn`).
   */
  #revalidate(request: EndpointRequest, client: Client, entry: CacheEntry, trace: TraceSpan | undefined): Served {
    const key = request.path;
    if (this.#backoff.waiting(key) === undefined) {
      const flight = this.#flights.run(key, () => this.#fetchAndStore(request, passThrough(client), this.#payerOf(client), trace, entry));
      flight.promise.then(
        (fetched) => {
          if (flight.leader) this.#learn(key, fetched);
        },
        (error: unknown) => this.#deps.logger.error({ err: error, route: request.endpoint }, 'background refresh failed'),
      );
    }
    const now = this.#deps.clock.now();
    return { outcome: 'stale', status: entry.status, body: entry.body, entry, cacheStatus: staleCacheStatus(entry, now), ageSeconds: ageSeconds(entry, now), maxAgeSeconds: 0 };
  }

  /**
   * What a refresh's answer (or the next miss of a key whose refreshes failed) says of the key:
   * an answer (200, 404) forgets its failures; a rejected cursor (400) is an answer about the
   * request that every refresh would get again, so the stale entry is dropped from both tiers and
   * the 400 answers the key while its backoff lasts, as the interface answers that cursor; any
   * other failure (5xx, timeout, 429, refusal) only backs off.
   */
  #learn(key: string, fetched: Fetched): void {
    if (fetched.status === 200 || fetched.status === 404) {
      this.#backoff.succeeded(key);
      return;
    }
    if (fetched.status !== 400) {
      this.#backoff.failed(key);
      return;
    }
    const failing = this.#backoff.failed(key, { status: fetched.status, body: fetched.body });
    this.#deps.logger.info({ path: key, failures: failing.failures, until: new Date(failing.untilMs).toISOString() }, 'refresh rejected by the provider: stale entry dropped');
    void this.#deps.cache.drop(key);
  }

  /** The permanent answer a failed refresh got, while its key's backoff lasts: no call is made. */
  #remembered(answer: PermanentAnswer): Served {
    return { outcome: 'coalesced', status: answer.status, body: answer.body, cacheStatus: backoffCacheStatus(), maxAgeSeconds: 0 };
  }

  /**
   * Pass-through auth: the call of a key the provider has not accepted lately is its own
   * verifying call (upstream-verifier.ts), never another instance's result read from Redis, and
   * waits for a turn that every such key shares: without one it is 429, and no call is made.
   */
  async #fetchFor(request: EndpointRequest, client: PassThroughClient | undefined, payer: Payer, trace: TraceSpan | undefined): Promise<Fetched> {
    if (client === undefined || this.#trusted(client)) return this.#fetchAndStore(request, client, payer, trace);
    const verifying = this.#deps.live.current.verifier?.verifying(client, async (): Promise<Fetched> => {
      const wait = await this.#deps.verifyTurn?.();
      if (wait !== undefined) return { ...errorAnswer('E429'), retryAfterSeconds: wait, stored: false };
      return this.#fetchUpstream(request, payer, trace, client);
    });
    return (await verifying) ?? { ...errorAnswer('E401'), stored: false };
  }

  /**
   * One upstream exchange and its effect on the cache; runs once per coalesced flight. With
   * Redis, another instance may already be fetching the same key: then its result is used.
   * `client`: pass-through auth, whose key is the call's credential. `previous`: the entry the
   * answer replaces, where one is known (a refresh), which dates it (see `modification`).
   */
  async #fetchAndStore(request: EndpointRequest, client: PassThroughClient | undefined, payer: Payer, trace: TraceSpan | undefined, previous?: CacheEntry): Promise<Fetched> {
    const { sharedFlights } = this.#deps;
    const deadlineMs = this.#deps.live.current.config.server.miss_deadline_ms;
    const claim = sharedFlights === undefined ? undefined : await sharedFlights.claim(request.path, deadlineMs);
    if (claim?.kind === 'entry') return { status: claim.entry.status, body: claim.entry.body, entry: claim.entry, stored: false, viaRedis: true };
    let settled: Promise<void> | undefined;
    try {
      const fetched = await this.#fetchUpstream(request, payer, trace, client, previous);
      settled = fetched.settled;
      return fetched;
    } finally {
      // Once Redis has the entry, so a waiting instance finds it, not a free lease.
      if (claim !== undefined) void (settled ?? Promise.resolve()).then(claim.release);
    }
  }

  async #fetchUpstream(request: EndpointRequest, payer: Payer, trace: TraceSpan | undefined, client?: PassThroughClient, previous?: CacheEntry): Promise<Fetched> {
    const { cache, clock, logger } = this.#deps;
    const { config, upstreams, verifier } = this.#deps.live.current;
    const ttl = config.cache.ttl_seconds;
    // Before the fetch: a purge observed while it runs must keep its response out of the cache.
    const stamp = cache.generations.stamp(request.path);
    const { result, upstream, ms, called, payerRefused } = await upstreams.fetch(request, client && { id: client.id, key: client.key }, payer, trace);
    const via = { upstream, upstreamMs: ms, called, ...(result.batched === undefined ? {} : { batch: result.batched.size }) };
    if (client !== undefined) verifier?.judge(client, result);
    // The pool logs a rejected credential and a stop once; every request they turn away need not be.
    if (result.kind === 'failed' && result.failure !== 'unauthorized') {
      logger.warn({ upstream, route: request.endpoint, failure: result.failure, reason: result.reason }, 'upstream failed');
    } else if (result.kind === 'timeout') {
      logger.warn({ upstream, route: request.endpoint, reason: result.reason }, 'upstream timed out');
    }
    const answer = answerFor(request.endpoint, result, clock.now(), client !== undefined);
    if (answer.ttl === undefined) return { ...answer, stored: false, ...via, ...(payerRefused ? { refusedPayer: payer.id } : {}) };
    if (answer.ttl === 'not_found') return { ...answer, ...this.#store(404, answer.body, [{ path: request.path, ttlSeconds: ttl.not_found, generation: stamp }], previous), ...via };
    // Cross-population: a user's 200 also answers the other user route.
    const twin = counterpart(request.endpoint, answer.body);
    const twinGeneration = twin && cache.generations.restamp(stamp, twin.path);
    const targets: StoreTarget[] = [{ path: request.path, ttlSeconds: ttl[request.endpoint], generation: stamp }];
    if (twin !== undefined && twinGeneration !== undefined) targets.push({ path: twin.path, ttlSeconds: ttl[twin.endpoint], generation: twinGeneration });
    return { ...answer, ...this.#store(200, answer.body, targets, previous), ...via };
  }

  /** The Redis lookup of a memory miss, in a span of its own when the request is traced and there is a Redis. */
  async #remote(path: string, trace: TraceSpan | undefined): Promise<Found | undefined> {
    const { cache } = this.#deps;
    if (trace === undefined || !cache.shared) return cache.remote(path);
    const span = trace.child('cache redis lookup', 'client', { 'db.system.name': 'redis', 'db.operation.name': 'GET' });
    try {
      const found = await cache.remote(path);
      span.set('perch.cache.found', found === undefined ? 'none' : found.fresh ? 'fresh' : 'stale');
      return found;
    } finally {
      span.end();
    }
  }

  /**
   * Stores one answer under each target with a TTL: memory at once, compression and Redis behind
   * the answer (tiered-cache.ts). `stored` and `entry` are the first target's, the request's own.
   * `previous`: the first target's entry this answer replaces, where known, else the body this
   * instance last stored there; the twin route's body is the same, so it takes the same date.
   */
  #store(status: 200 | 404, body: Buffer, targets: readonly StoreTarget[], previous: CacheEntry | undefined): Pick<Fetched, 'stored' | 'entry' | 'settled'> {
    const { cache, clock, live, logger } = this.#deps;
    const storedAt = clock.now();
    const etag = entityTag(body);
    const dated = modification(etag, storedAt, previous ?? this.#dated.get(targets[0]!.path));
    const { modifiedAt, sharedSecond } = dated;
    for (const target of targets) this.#dated.set(target.path, dated);
    const writes = targets
      .filter((target) => target.ttlSeconds > 0)
      .map((target) => ({
        key: target.path,
        entry: withVariants({ status, body, storedAt, modifiedAt, sharedSecond, ttlMs: target.ttlSeconds * 1000, generation: target.generation, etag }, undefined),
      }));
    if (writes.length === 0) return { stored: false };
    const { accepted, settled } = cache.store(writes, live.current.config.cache.compression);
    const tracked = settled.catch((error: unknown) => logger.error({ err: error, path: writes[0]!.key }, 'storing a cache entry failed'));
    const own = writes[0]!.key === targets[0]!.path && accepted[0] === true;
    return own ? { stored: true, entry: writes[0]!.entry, settled: tracked } : { stored: false, settled: tracked };
  }

  /**
   * Who a miss's call is for, to share the provider's call cap fairly: the key whose miss makes
   * it (coalesced followers ride on the leader's), weighted by its plan's `provider_weight`.
   */
  #payerOf(client: Client): Payer {
    const plan = this.#deps.live.current.config.rate_limits[client.plan];
    const payer = { id: client.id, weight: plan?.provider_weight ?? 1, label: client.metricsId ?? client.id };
    return plan?.provider_calls === undefined ? payer : { ...payer, budget: plan.provider_calls };
  }

  /** Pass-through auth: the cache answers only keys the provider accepted lately (upstream-verifier.ts). */
  #trusted(client: Client): boolean {
    const pass = passThrough(client);
    return pass === undefined || this.#deps.live.current.verifier?.accepted(pass) === true;
  }
}
