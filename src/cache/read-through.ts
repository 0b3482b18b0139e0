import { LRUCache } from 'lru-cache';
import type { Client } from '../auth/key-store.js';
import { passThrough, type Gate, type PassThroughClient, type UpstreamVerifier, type VerifyLine } from '../auth/upstream-verifier.js';
import type { Clock } from '../clock.js';
import type { Config } from '../config/types.js';
import type { EndpointRequest } from '../endpoints.js';
import type { Logger } from '../logging/logger.js';
import type { TraceSpan } from '../tracing/trace-span.js';
import { answerFor, errorAnswer, type UpstreamAnswer } from '../upstream/answer.js';
import type { Payer, UpstreamResult } from '../upstream/upstream.js';
import { verdictOf } from '../upstream/verdict.js';
import type { UpstreamSet } from '../upstream/upstream-set.js';
import { Coalescer } from './coalescer.js';
import { counterpart } from './cross-population.js';
import { ageSeconds, entityTag, modification, remainingTtlSeconds, withVariants, type CacheEntry, type Dated } from './entry.js';
import type { Generation } from './generation.js';
import type { Stamp } from './generations.js';
import { backoffCacheStatus, forwardCacheStatus, hitCacheStatus, staleCacheStatus, type CacheOutcome } from './outcome.js';
import { RefreshBackoff, type PermanentAnswer } from './refresh-backoff.js';
import type { SharedFlights } from './shared-flight.js';
import type { Found, TieredCache } from './tiered-cache.js';

/** A key to store an answer under, with its TTL and the purge generation its fetch began in. */
interface StoreTarget {
  readonly path: string;
  readonly ttlSeconds: number;
  readonly generation: Generation;
  /** Not this key's own fetch (the twin route): written only where the key is empty. */
  readonly onlyIfEmpty?: true;
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
   * seconds to wait, on the line's budget (`auth.verify_*` for keys the provider has not
   * accepted, per client source and together; `auth.revalidate_*` for keys it accepted, per key
   * and endpoint, the `subject`, and together).
   */
  readonly verifyTurn?: (line: VerifyLine, source: string, subject: string) => Promise<number | undefined>;
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
  /** Every client of the flight left while it waited on another instance's lease: no answer. */
  readonly abandoned?: true;
}

/**
 * What a request whose client left before its flight had an answer is logged and counted as:
 * nginx's "client closed request". Nobody receives it.
 */
const LEFT = { status: 499, body: Buffer.alloc(0) };

/** A request whose miss deadline passed before anything was asked for it: a 504, as a miss out of time is. */
const OUT_OF_TIME: UpstreamResult = { kind: 'refused', reason: 'no_time', retryAfterSeconds: 1 };

/** Pass-through auth: how a key goes on when no verifier can vouch for it. */
const REFUSED: Gate = { kind: 'refused' };

/**
 * The caching policy, read-through: memory, then Redis, then stale-while-revalidate, then one
 * coalesced upstream fetch per key (per instance, and across instances through shared flights),
 * whose answer is stored in both tiers and, for a user, under its twin route too. Purge
 * generations keep a response that may predate a purge out of the cache.
 */
/** Paths whose last body an instance without Redis remembers, for `Last-Modified` across a purge or an eviction. */
const DATED_PATHS = 10_000;

export class ReadThrough {
  readonly #deps: ReadThroughDeps;
  readonly #flights = new Coalescer<Fetched>();
  readonly #backoff: RefreshBackoff;
  /**
   * Without Redis, the last body this instance stored per path, dated: a miss after a purge or an
   * eviction has no entry to compare with, and new bytes must be dated past the date sent with
   * the body they replace (see `modification`). Bounded; a path it dropped dates its bytes as a
   * first fetch. With Redis the fleet's entry dates them instead (redis-store.ts).
   */
  readonly #dated = new LRUCache<string, Dated & { readonly ownTag?: string }>({ max: DATED_PATHS });

  constructor(deps: ReadThroughDeps) {
    this.#deps = deps;
    this.#backoff = new RefreshBackoff(deps.clock);
  }

  /** A fresh entry of this instance's memory, answered synchronously: no await on the hottest path. */
  hit(request: EndpointRequest, client: Client): Served | undefined {
    if (!this.#admits(request, client)) return undefined;
    const found = this.#deps.cache.local(request.path);
    return found?.fresh === true ? this.#hit(found.entry, 'memory') : undefined;
  }

  /**
   * Everything after a memory miss: Redis, a stale entry while one refresh runs, or a fetch.
   * `trace`: the request's span; a flight's spans hang under its leader's. `left`: aborted when
   * the client goes away (see `#join`). `deadline` (on `performance.now()`): the request's miss
   * deadline, where it began before this (a pass-through key's verification); from now when absent.
   */
  async fetch(request: EndpointRequest, client: Client, trace?: TraceSpan, left?: AbortSignal, deadline?: number): Promise<Served> {
    const pass = passThrough(client);
    if (pass !== undefined && !this.#admits(request, pass)) return this.#unverified(request, pass, trace, left);
    const { cache } = this.#deps;
    const local = cache.local(request.path);
    if (local?.fresh === true) return this.#hit(local.entry, 'memory');
    const permanent = this.#backoff.waiting(request.path)?.answer;
    if (permanent !== undefined) return this.#remembered(permanent);
    let stale = local?.entry;
    const remote = await this.#remote(request.path, trace);
    // Memory is read again after the await: a refresh may have landed while Redis answered, and
    // a client served the newer answer must never see the older one after it (issue 50).
    const landed = cache.local(request.path);
    const newest = landed !== undefined && (remote === undefined || landed.entry.storedAt > remote.entry.storedAt) ? landed : remote;
    if (newest?.fresh === true) return this.#hit(newest.entry, newest === remote ? 'redis' : 'memory');
    if (newest !== undefined && (stale === undefined || newest.entry.storedAt > stale.storedAt)) stale = newest.entry;
    if (stale !== undefined) return this.#revalidate(request, client, stale, trace);

    const { flight, fetched } = await this.#join(request, client, trace, left, deadline);
    // A key whose refreshes failed lately: this miss's answer ends or extends its backoff. A
    // flight its clients left before it asked anyone says nothing of the key.
    if (flight.leader && fetched.abandoned !== true && this.#backoff.tracks(request.path)) this.#learn(request.path, fetched);
    return this.#forwarded(request, fetched, flight.leader);
  }

  /** What a request that took part in an upstream exchange is answered: `leader`, its own exchange. */
  #forwarded(request: EndpointRequest, fetched: Fetched, leader: boolean): Served {
    const { config } = this.#deps.live.current;
    const viaRedis = fetched.viaRedis === true;
    const outcome = leader && !viaRedis ? 'miss' : 'coalesced';
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
      ...(leader ? { upstreamMs: fetched.upstreamMs, upstreamCall: fetched.called === true, ...(fetched.batch === undefined ? {} : { batch: fetched.batch }) } : {}),
    };
  }

  /**
   * Pass-through auth, a key the provider has not accepted on this endpoint lately: nothing of
   * the cache is served to it until it is. An answer perch makes itself (an id the provider
   * cannot have) comes first and takes no turn; then the key's verifying call under way, if any,
   * decides (upstream-verifier.ts); else this request is the key's verifying call, on the turn of
   * its line, never another instance's result read from Redis. Without a turn it is 429, and no
   * call is made.
   */
  async #unverified(request: EndpointRequest, client: PassThroughClient, trace: TraceSpan | undefined, left: AbortSignal | undefined): Promise<Served> {
    const { config, upstreams, verifier } = this.#deps.live.current;
    const known = upstreams.known(request);
    if (known !== undefined) return this.#forwarded(request, { ...answerFor(request.endpoint, known, this.#deps.clock.now(), true), stored: false }, true);
    // One deadline for the whole request: the wait for the key's verdict (another instance's
    // turn may last longer than a miss), the verifying call, and the fetch of an admitted key.
    const deadline = performance.now() + config.server.miss_deadline_ms;
    // No verifier: a reload to mode `keys` since the key was read, and no provider's word on it.
    const gate = verifier === undefined ? REFUSED : await verifier.gate(client, request.endpoint, deadline, left);
    if (gate.kind === 'admitted') return this.fetch(request, client, trace, left, deadline);
    if (gate.kind === 'refused') return this.#forwarded(request, { ...errorAnswer('E401'), stored: false }, true);
    if (gate.kind === 'failed') return this.#forwarded(request, { ...gate.answer, stored: false }, false);
    if (gate.kind === 'late') return this.#forwarded(request, { ...answerFor(request.endpoint, OUT_OF_TIME, this.#deps.clock.now(), true), stored: false }, true);
    if (gate.kind === 'left') return this.#forwarded(request, { ...LEFT, stored: false, abandoned: true }, true);
    let fetched: Fetched | undefined;
    try {
      const wait = await this.#deps.verifyTurn?.(gate.line, client.source, `${client.id}:${request.endpoint}`);
      // Its client left while the turn was read: the key's next request calls, not this one.
      if (left?.aborted === true) fetched = { ...LEFT, stored: false, abandoned: true };
      else if (wait !== undefined) fetched = { ...errorAnswer('E429'), retryAfterSeconds: wait, stored: false };
      else
        fetched =
          (gate.line === 'unknown' ? await this.#userContext(request, client, trace, deadline) : undefined) ??
          (await this.#fetchUpstream(request, this.#payerOf(client), trace, client, undefined, true, undefined, deadline));
      return this.#forwarded(request, fetched, true);
    } finally {
      // A failure of the provider, or a wait, answers the key's other requests too; an answer
      // about this request (a rejected cursor, its client gone) is this request's alone.
      gate.done(fetched !== undefined && fetched.abandoned !== true && fetched.status >= 429 ? fetched : undefined);
    }
  }

  /**
   * The flight that answers a miss: one per path (per key with pass-through auth, so a key never
   * receives the answer to another key's call). A refusal of the leader's own key (its budget
   * spent) is not an answer for a follower of another key: that follower asks again, leading or
   * joining the path's next flight, and, should that one also end in another key's refusal, a
   * flight of its own key's, which can only answer for that key. So a follower waits at most
   * three flights, and a call is charged to the key that leads it, as for every flight.
   */
  async #join(request: EndpointRequest, client: Client, trace: TraceSpan | undefined, left: AbortSignal | undefined, begun: number | undefined): Promise<{ flight: { leader: boolean }; fetched: Fetched }> {
    const pass = passThrough(client);
    const payer = this.#payerOf(client);
    // Keyed by the key's purge generation: a request arriving after a purge of it never joins a
    // flight that began before (its answer may predate the purge), it starts or joins a newer one.
    const epoch = this.#epoch(request.path);
    const shared = pass === undefined ? `${epoch}\n${request.path}` : `${epoch}\n${pass.digest}\n${request.path}`;
    // The request's own deadline: a flight it leads after riding on another key's refusal has
    // only what is left of it, as the client has waited all along.
    const deadline = begun ?? performance.now() + this.#deps.live.current.config.server.miss_deadline_ms;
    for (let round = 0; ; round++) {
      const key = round < 2 ? shared : `${payer.id}\n${shared}`;
      const flight = this.#flights.run(key, (stop) => this.#fetchAndStore(request, pass, payer, trace, undefined, stop, deadline), left);
      const fetched = await flight.promise;
      // Joined as the flight's last clients left: it was ended for nobody, and this one still waits.
      if (fetched.abandoned === true && left?.aborted !== true) {
        round--;
        continue;
      }
      if (flight.leader || fetched.refusedPayer === undefined || fetched.refusedPayer === payer.id) return { flight, fetched };
    }
  }

  /** The purge generation of `path` as a flight key's prefix: purges of other scopes leave it. */
  #epoch(path: string): string {
    const { all, scope } = this.#deps.cache.generations.stamp(path);
    return `${all}.${scope}`;
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
      // Per purge generation, as a miss's flight (`#join`): a purge closes the refreshes before it.
      const flight = this.#flights.run(`${this.#epoch(key)}\n${key}`, () => this.#fetchAndStore(request, passThrough(client), this.#payerOf(client), trace, entry));
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
   * A key the provider accepted nowhere lately is first asked who it speaks for, where the
   * provider can tell (X): a user-context token sees protected accounts, whose answers must never
   * reach another key through the cache, so such a key is refused (401) as a made-up one is, on
   * the same turn. Undefined: the key speaks for an app (X's 403 unsupported-authentication; a
   * 404 from a provider without the path), and its verifying call goes on. Any other answer
   * answers the request: a failure of the provider, a wait, a 400 from a front that refuses the key.
   */
  async #userContext(request: EndpointRequest, client: PassThroughClient, trace: TraceSpan | undefined, deadline: number): Promise<Fetched | undefined> {
    const { upstreams, verifier } = this.#deps.live.current;
    if (!upstreams.tellsUserContext(request.endpoint)) return undefined;
    const asked = { id: client.id, key: client.key, verifying: true, whoAmI: true };
    const { result, upstream, ms, called } = await upstreams.fetch(request, asked, this.#payerOf(client), trace, deadline);
    const told = verifier?.judgeWhoAmI(client, result);
    if (told !== undefined) await told;
    const via = { stored: false, upstream, upstreamMs: ms, called };
    if (result.kind === 'ok') {
      this.#deps.logger.info({ key_id: client.id, upstream }, 'pass-through: a user-context token refused (it could read protected accounts into the shared cache)');
      return { ...errorAnswer('E401'), ...via };
    }
    if (result.kind === 'failed' && result.failure === 'unauthorized') return { ...errorAnswer('E401'), ...via };
    if (result.kind === 'not_found' || (result.kind === 'failed' && result.failure === 'forbidden')) return undefined;
    // The request's cursor is not what a 400 here refused.
    return { ...(result.kind === 'bad_request' ? errorAnswer('E502') : answerFor(request.endpoint, result, this.#deps.clock.now(), true)), ...via };
  }

  /**
   * One upstream exchange and its effect on the cache; runs once per coalesced flight. With
   * Redis, another instance may already be fetching the same key: then its result is used.
   * `client`: pass-through auth, whose key is the call's credential. `previous`: the entry the
   * answer replaces, where one is known (a refresh), which dates it (see `modification`).
   * `stop`: aborted once every client of the flight left; a flight still waiting on another
   * instance's lease then ends without a call. `deadline` (on `performance.now()`): the leading
   * request's, `server.miss_deadline_ms` from when it began; time spent waiting on another
   * instance's lease is time the client waited too, so a lease freed without an answer leaves
   * this flight only the rest.
   */
  async #fetchAndStore(
    request: EndpointRequest,
    client: PassThroughClient | undefined,
    payer: Payer,
    trace: TraceSpan | undefined,
    previous?: CacheEntry,
    stop?: AbortSignal,
    deadline = performance.now() + this.#deps.live.current.config.server.miss_deadline_ms,
  ): Promise<Fetched> {
    const { sharedFlights, cache } = this.#deps;
    const { config } = this.#deps.live.current;
    // Before anything is awaited: a purge observed from here on keeps this flight's answer out of
    // the cache, and the fleet's lease is per generation, so a flight begun after a purge never
    // waits on one begun before it.
    const stamp = cache.generations.stamp(request.path);
    // Nothing of this endpoint is stored (TTL 0): no other instance can be spared a call, so none
    // waits on this one's lease. An instance that may not have heard of every purge takes none: an
    // entry it finds needs the purge counters too (purge-sync.ts), which may be what it cannot read.
    const leased = sharedFlights !== undefined && config.cache.ttl_seconds[request.endpoint] > 0 && cache.current;
    const claim = leased ? await sharedFlights.claim(request.path, stamp, config.server.miss_deadline_ms, deadline, stop) : undefined;
    if (claim?.kind === 'left') return { ...LEFT, stored: false, abandoned: true };
    if (claim?.kind === 'entry') return { status: claim.entry.status, body: claim.entry.body, entry: claim.entry, stored: false, viaRedis: true };
    if (claim?.kind === 'answer') return { status: claim.status, body: claim.body, stored: false, viaRedis: true };
    let settled: Promise<void> | undefined;
    let unstored404: Buffer | undefined;
    try {
      const fetched = await this.#fetchUpstream(request, payer, trace, client, previous, false, stamp, deadline);
      settled = fetched.settled;
      // A provider's 404 nothing stores (`not_found: 0`), for this path: the waiting instances
      // take it rather than asking again one after another. Never a pass-through key's verdict.
      if (fetched.status === 404 && !fetched.stored && fetched.called === true && client === undefined) unstored404 = fetched.body;
      return fetched;
    } finally {
      // Once Redis has the entry, so a waiting instance finds it, not a free lease.
      if (claim !== undefined) {
        const { release } = claim;
        void (settled ?? Promise.resolve()).then(() => release(unstored404));
      }
    }
  }

  /**
   * `verifying`: pass-through auth, the call verifies `client`'s key (upstream-verifier.ts); what
   * the provider answers it about the key is no sign of the provider's health (verdict.ts).
   */
  async #fetchUpstream(request: EndpointRequest, payer: Payer, trace: TraceSpan | undefined, client?: PassThroughClient, previous?: CacheEntry, verifying = false, since?: Stamp, deadline?: number): Promise<Fetched> {
    const { cache, clock, logger } = this.#deps;
    const { config, upstreams, verifier } = this.#deps.live.current;
    const ttl = config.cache.ttl_seconds;
    // Before the fetch: a purge observed while it runs must keep its response out of the cache.
    const stamp = since ?? cache.generations.stamp(request.path);
    const clientKey = client && { id: client.id, key: client.key, ...(verifying ? { verifying } : {}) };
    const { result, upstream, ms, called, payerRefused } = await upstreams.fetch(request, clientKey, payer, trace, deadline);
    const via = { upstream, upstreamMs: ms, called, ...(result.batched === undefined ? {} : { batch: result.batched.size }) };
    // A rejection reaches the fleet before its 401 reaches the client (upstream-verifier.ts).
    const told = client === undefined ? undefined : verifier?.judge(client, request.endpoint, result);
    if (told !== undefined) await told;
    // The pool logs a rejected credential and a stop once; every request they turn away need not
    // be. A made-up key's odd answer (any 4xx) is the key's, and a flood of them must not flood the log.
    if (result.kind === 'failed' && result.failure !== 'unauthorized') {
      const level = verifying && verdictOf(result, 'breaker', true) === 'neutral' ? 'debug' : 'warn';
      logger[level]({ upstream, route: request.endpoint, failure: result.failure, reason: result.reason }, 'upstream failed');
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
    // The twin is not this flight's key: another instance may hold it, or be fetching it under its
    // own lease. So it is written only where empty, and where it holds other bytes it is purged
    // on every instance instead (tiered-cache.ts): never two versions of one user side by side.
    if (twin !== undefined && twinGeneration !== undefined) targets.push({ path: twin.path, ttlSeconds: ttl[twin.endpoint], generation: twinGeneration, onlyIfEmpty: true });
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
    // With Redis the fleet dates the bytes as Redis takes them (redis-store.ts), never this
    // instance's memory of an older body; until then they go out undated. Alone, this instance
    // dates them against what it last stored there.
    let dated: Dated = { etag, modifiedAt: storedAt, undated: true };
    // Alone, whether this route's own bytes changed is known here (with Redis, from its write).
    let sourceChanged: boolean | undefined;
    if (!cache.shared) {
      const own = targets[0]!.path;
      const known = this.#dated.get(own);
      // Against what this route itself last answered, not bytes its twin wrote under it.
      sourceChanged = known?.ownTag !== etag;
      dated = modification(etag, storedAt, previous ?? known);
      for (const { path } of targets) this.#dated.set(path, { ...dated, ownTag: path === own ? etag : this.#dated.get(path)?.ownTag });
    }
    const { modifiedAt, undated } = dated;
    const writes = targets
      .filter((target) => target.ttlSeconds > 0)
      .map((target) => ({
        key: target.path,
        entry: withVariants({ status, body, storedAt, modifiedAt, undated, ttlMs: target.ttlSeconds * 1000, generation: target.generation, etag }, undefined),
        ...(target.onlyIfEmpty === undefined ? {} : { onlyIfEmpty: true, ...(sourceChanged === undefined ? {} : { sourceChanged }) }),
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

  /**
   * Pass-through auth: the cache answers a key on an endpoint only while the provider's acceptance
   * of it there holds (upstream-verifier.ts). An acceptance gone stale still does, while one
   * revalidation of the key runs behind the answer, on the accepted keys' turn; not behind an
   * answer perch makes itself (an id the provider cannot have), which would ask the provider
   * nothing and renew nothing.
   */
  #admits(request: EndpointRequest, client: Client): boolean {
    const pass = passThrough(client);
    if (pass === undefined) return true;
    const { verifier, upstreams } = this.#deps.live.current;
    if (verifier === undefined) return false;
    const standing = verifier.standing(pass, request.endpoint);
    if (standing === 'stale' && upstreams.known(request) === undefined) {
      const revalidation = verifier.revalidate(pass, request.endpoint, async () => {
        if ((await this.#deps.verifyTurn?.('known', pass.source, `${pass.id}:${request.endpoint}`)) !== undefined) return;
        await this.#fetchUpstream(request, this.#payerOf(pass), undefined, pass, undefined, true);
      });
      revalidation.catch((error: unknown) => this.#deps.logger.error({ err: error, route: request.endpoint }, 'pass-through revalidation failed'));
    }
    return standing === 'accepted' || standing === 'stale';
  }
}
