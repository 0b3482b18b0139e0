import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics, type LabelValues } from 'prom-client';
import { FastCounter, FastHistogram } from './fast-metrics.js';
import type { CacheOutcome } from '../cache/outcome.js';
import type { CacheStore, CacheTier } from '../cache/store.js';
import type { SlabStats } from '../cache/slab-pool.js';
import type { EndpointName } from '../endpoints.js';
import type { BreakerState, CredentialState, RecheckResult, RetryDecision, UpstreamEvents } from '../upstream/events.js';
import type { RefusalReason, UpstreamResult } from '../upstream/upstream.js';
import { PERCH_VERSION } from '../version.js';

/** `route` label: an endpoint name, or `none` for requests that matched no endpoint. */
export type RouteLabel = EndpointName | 'none';

/** `outcome` label of upstream exchanges: the result kind, or the failure for `failed`. */
export function upstreamOutcome(result: UpstreamResult): string {
  return result.kind === 'failed' ? result.failure : result.kind;
}

const CREDENTIAL_STATES: readonly CredentialState[] = ['active', 'cooling_down', 'usage_capped', 'revoked'];
const BREAKER_STATES: readonly BreakerState[] = ['closed', 'open', 'half_open'];

/** Seconds, because Prometheus base units are seconds; buckets span a cache hit to a timeout. */
const DURATION_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10];
/** Items per batch call: X takes at most 100. */
const BATCH_BUCKETS = [2, 5, 10, 20, 50, 100];

/**
 * Every perch metric, in a registry owned by one perch instance (never prom-client's global
 * one), so several instances can live in one process, as the tests do.
 *
 * Label values come from closed sets only (endpoint names, status codes perch emits, cache
 * outcomes, configured upstream and key ids), so series counts are bounded by configuration.
 * Labelled children are bound once per label combination and kept in a Map keyed by a short
 * composed string: the request path then does one Map lookup, not prom-client's label hashing.
 */
export class PerchMetrics implements UpstreamEvents {
  readonly registry = new Registry();
  readonly #requests: FastCounter;
  readonly #keyRequests: FastCounter;
  readonly #keySaved: FastCounter;
  readonly #keyCalls: Counter;
  readonly #batchSize: Histogram;
  readonly #keySpend: Counter;
  readonly #requestDuration: FastHistogram;
  readonly #upstreamRequests: Counter;
  readonly #upstreamDuration: Histogram;
  readonly #coalesced: Counter;
  readonly #rateLimited: Counter;
  readonly #purges: Counter;
  readonly #refused: Counter;
  readonly #queueWait: Histogram;
  readonly #credentialState: Gauge;
  readonly #rechecks: Counter;
  readonly #breakerState: Gauge;
  readonly #retries: Counter;
  readonly #failovers: Counter;
  readonly #children = new Map<string, { inc(): void } | { observe(value: number): void }>();
  readonly #cacheTiers = new Map<CacheTier, Pick<CacheStore, 'size'>>();

  constructor() {
    const registers = [this.registry];
    // Standard names (process_*, nodejs_*), so stock dashboards and alerts work unchanged.
    collectDefaultMetrics({ register: this.registry });
    // Gauges named like counters, which `promtool check metrics` rejects; each has a twin
    // without the suffix (nodejs_active_handles, ...) holding the same number.
    for (const name of ['nodejs_active_handles_total', 'nodejs_active_requests_total', 'nodejs_active_resources_total']) {
      this.registry.removeSingleMetric(name);
    }
    new Gauge({
      name: 'perch_build_info',
      help: 'Always 1; the labels say which perch and which Node.js are running.',
      labelNames: ['version', 'node'],
      registers,
    }).set({ version: PERCH_VERSION, node: process.version }, 1);
    // The three metrics every response updates: FastCounter and FastHistogram, which cost a Map
    // lookup per label and an addition per update instead of prom-client's label hashing.
    this.#requests = new FastCounter(
      'perch_requests_total',
      'Responses sent on the API listener, by endpoint, status code and cache outcome.',
      ['route', 'status', 'cache'],
      this.registry,
    );
    this.#keyRequests = new FastCounter(
      'perch_key_requests_total',
      'Responses sent to authenticated clients, by client key id, status code and cache outcome.',
      ['key_id', 'status', 'cache'],
      this.registry,
    );
    this.#keySaved = new FastCounter(
      'perch_key_upstream_calls_saved_total',
      "Provider calls a client key's requests did not need, by key id and reason: answered from the cache (hit), by a 304 to the client's own copy (revalidated), from a retained stale entry (stale), by another request's call (coalesced), or in a seat of another key's batch call (batched).",
      ['key_id', 'reason'],
      this.registry,
    );
    this.#requestDuration = new FastHistogram(
      'perch_request_duration_seconds',
      'Time from receiving a request to sending its response.',
      ['route', 'cache'],
      DURATION_BUCKETS,
      this.registry,
    );
    this.#upstreamRequests = new Counter({
      name: 'perch_upstream_requests_total',
      help: 'Upstream exchanges (each failover attempt counts), by upstream, endpoint and outcome.',
      labelNames: ['upstream', 'route', 'outcome'],
      registers,
    });
    this.#upstreamDuration = new Histogram({
      name: 'perch_upstream_duration_seconds',
      help: 'Duration of one upstream exchange.',
      labelNames: ['upstream', 'route'],
      buckets: DURATION_BUCKETS,
      registers,
    });
    this.#coalesced = new Counter({
      name: 'perch_coalesced_requests_total',
      help: 'Requests that waited for an identical in-flight upstream request instead of sending their own.',
      labelNames: ['route'],
      registers,
    });
    this.#rateLimited = new Counter({
      name: 'perch_rate_limited_total',
      help: "Requests refused with 429 by perch's own rate limits, by client key id.",
      labelNames: ['key_id'],
      registers,
    });
    this.#purges = new Counter({
      name: 'perch_purges_total',
      help: 'Cache purges requested on this instance (POST /admin/purge), by endpoint name or "all".',
      labelNames: ['scope'],
      registers,
    });
    this.#refused = new Counter({
      name: 'perch_upstream_refused_total',
      help: 'Upstream calls perch did not make to protect the provider, by upstream, endpoint and reason.',
      labelNames: ['upstream', 'route', 'reason'],
      registers,
    });
    this.#queueWait = new Histogram({
      name: 'perch_upstream_queue_wait_seconds',
      help: "Time misses waited in an upstream's call-cap queue (admitted or not).",
      labelNames: ['upstream'],
      buckets: DURATION_BUCKETS,
      registers,
    });
    this.#credentialState = new Gauge({
      name: 'perch_upstream_credential_state',
      help: 'Standing of each upstream credential as this instance last saw it: 1 for the current state.',
      labelNames: ['upstream', 'credential', 'state'],
      registers,
    });
    this.#rechecks = new Counter({
      name: 'perch_upstream_credential_rechecks_total',
      help: 'Recheck calls of revoked upstream credentials, by upstream, credential id and result (restored, rejected, no_answer).',
      labelNames: ['upstream', 'credential', 'result'],
      registers,
    });
    this.#breakerState = new Gauge({
      name: 'perch_upstream_breaker_state',
      help: "Each upstream breaker's state: 1 for the current state.",
      labelNames: ['upstream', 'state'],
      registers,
    });
    this.#keyCalls = new Counter({
      name: 'perch_key_upstream_calls_total',
      help: "Provider calls a client key's misses made (retries and failover attempts included); an x_v2 lookup that may be batched counts one per miss and upstream, as X bills items, whatever call it rode in, by key id and upstream.",
      labelNames: ['key_id', 'upstream'],
      registers,
    });
    this.#batchSize = new Histogram({
      name: 'perch_upstream_batch_size',
      help: 'Items per batch call (x_v2 batch lookups of two items or more), by upstream and endpoint.',
      labelNames: ['upstream', 'route'],
      buckets: BATCH_BUCKETS,
      registers,
    });
    this.#keySpend = new Counter({
      name: 'perch_key_upstream_spend_total',
      help: "The upstream's price_per_call summed over the provider calls a client key's misses made, by key id and upstream.",
      labelNames: ['key_id', 'upstream'],
      registers,
    });
    this.#retries = new Counter({
      name: 'perch_upstream_retries_total',
      help: 'Decisions of the retry layer on retryable failures: retried, budget_exhausted, no_time, exhausted.',
      labelNames: ['upstream', 'route', 'decision'],
      registers,
    });
    this.#failovers = new Counter({
      name: 'perch_upstream_failovers_total',
      help: 'Requests that left an upstream for the next of their route, by the upstream left and why.',
      labelNames: ['upstream', 'route', 'reason'],
      registers,
    });
    const tiers = this.#cacheTiers;
    // Sizes are read when Prometheus scrapes, not maintained on every cache write.
    new Gauge({
      name: 'perch_cache_entries',
      help: 'Entries held per cache tier.',
      labelNames: ['tier'],
      registers,
      collect() {
        this.reset();
        for (const [tier, store] of tiers) {
          const size = store.size();
          if (size !== undefined) this.set({ tier }, size.entries);
        }
      },
    });
    new Gauge({
      name: 'perch_cache_bytes',
      help: 'Bytes held per cache tier (bodies, keys and per-entry overhead).',
      labelNames: ['tier'],
      registers,
      collect() {
        this.reset();
        for (const [tier, store] of tiers) {
          const size = store.size();
          if (size !== undefined) this.set({ tier }, size.bytes);
        }
      },
    });
  }

  /**
   * Exports the memory tier's eviction count (entries dropped to stay within `max_bytes`), read
   * at scrape time so the cache's hot path only bumps a number.
   */
  addEvictionCount(read: () => number): void {
    new Counter({
      name: 'perch_cache_evictions_total',
      help: 'Entries the memory cache tier dropped to stay within cache.memory.max_bytes (not expiries or purges).',
      registers: [this.registry],
      collect() {
        this.reset();
        this.inc(read());
      },
    });
  }

  /**
   * Exports the memory tier's slab pool (cache/slab-pool.ts), read at scrape time: how much of
   * the reservation is cut into regions, how many regions wait for open requests, and how many
   * stores got memory of their own. A rising `full` count means reuse is held back (requests open
   * for long) or the pool is cut into classes the entries no longer need.
   */
  addSlabMetrics(read: () => SlabStats): void {
    new Gauge({
      name: 'perch_cache_slab_bytes',
      help:
        'The memory tier\'s bodies: bytes reserved at start (state="reserved", cache.memory.max_bytes), cut into regions so far (state="cut", the most of the reservation that can be resident), of which holding an entry (state="in_use") or idle (state="idle"), and held outside the pool (state="own"). The bodies hold cut + own: at most 2x max_bytes.',
      labelNames: ['state'],
      registers: [this.registry],
      collect() {
        const stats = read();
        this.set({ state: 'reserved' }, stats.reservedBytes);
        this.set({ state: 'cut' }, stats.cutBytes);
        this.set({ state: 'in_use' }, stats.inUseBytes);
        this.set({ state: 'idle' }, stats.cutBytes - stats.inUseBytes);
        this.set({ state: 'own' }, stats.ownBytes);
      },
    });
    new Gauge({
      name: 'perch_cache_slab_regions_waiting',
      help: 'Slab regions given back by the memory tier and not yet reusable: requests that were open at their release may still be sending them.',
      registers: [this.registry],
      collect() {
        this.set(read().waitingRegions);
      },
    });
    new Counter({
      name: 'perch_cache_slab_own_memory_stores_total',
      help: 'Memory tier stores that got memory of their own instead of a slab region: reason="full" (no region free), reason="too_large" (over 64 KiB).',
      labelNames: ['reason'],
      registers: [this.registry],
      collect() {
        const { ownMemoryStores } = read();
        this.reset();
        this.inc({ reason: 'full' }, ownMemoryStores.full);
        this.inc({ reason: 'too_large' }, ownMemoryStores.too_large);
      },
    });
  }

  /** Reports a cache tier's size on every scrape. A tier whose `size()` is undefined is skipped. */
  addCacheTier(store: Pick<CacheStore, 'tier' | 'size'>): void {
    this.#cacheTiers.set(store.tier, store);
  }

  /** When each secret of each client key was last accepted (a rotation's check that the old one is idle); never the secret. */
  addSecretUseGauge(read: () => readonly { id: string; index: number; lastUsedMs: number | undefined }[]): void {
    new Gauge({
      name: 'perch_key_secret_last_used_timestamp_seconds',
      help: "When this instance last accepted a client key's secret, in seconds since the epoch; secret is its index in the key's secrets (0 for key or sha256). No series before its first use since start.",
      labelNames: ['key_id', 'secret'],
      registers: [this.registry],
      collect() {
        this.reset();
        for (const { id, index, lastUsedMs } of read()) if (lastUsedMs !== undefined) this.set({ key_id: id, secret: String(index) }, lastUsedMs / 1000);
      },
    });
  }

  /**
   * Exports each key's provider-call budget as this instance last learned it (budget-book.ts),
   * read at scrape time: what is left of it in the current window, and its limit.
   */
  addBudgetGauges(read: () => readonly { label: string; standing: { limit: number; remaining: number } }[]): void {
    for (const [name, help, field] of [
      ['perch_key_provider_budget_remaining', "Provider calls left in a client key's budget for the current calendar window, as this instance last learned it.", 'remaining'],
      ['perch_key_provider_budget_limit', "A client key's budget of provider calls per calendar window (its plan's provider_calls.limit).", 'limit'],
    ] as const) {
      new Gauge({
        name,
        help,
        labelNames: ['key_id'],
        registers: [this.registry],
        collect() {
          this.reset();
          for (const { label, standing } of read()) this.set({ key_id: label }, standing[field]);
        },
      });
    }
  }

  /**
   * Exports each upstream's adaptive-throttle reject probability, read at scrape time from
   * `read` (upstream name -> probability) so it is the throttle's own figure, never a copy.
   */
  addThrottleGauge(read: () => Readonly<Record<string, number>>): void {
    new Gauge({
      name: 'perch_upstream_throttle_reject_probability',
      help: "Share of calls each upstream's adaptive throttle sheds now, 0 to 1 (0 while the provider answers at least 1/k of its calls).",
      labelNames: ['upstream'],
      registers: [this.registry],
      collect() {
        this.reset();
        for (const [upstream, probability] of Object.entries(read())) this.set({ upstream }, probability);
      },
    });
  }

  /**
   * Exports how many verdicts pass-through auth holds, accepted and rejected, read at scrape
   * time; no series while `read` answers undefined (mode `keys`).
   */
  addPassThroughGauge(read: () => { readonly accepted: number; readonly rejected: number } | undefined): void {
    new Gauge({
      name: 'perch_pass_through_keys',
      help: 'Forwarded keys (auth.mode: upstream) whose verdict this instance holds, by verdict; each side at most auth.remembered_keys.',
      labelNames: ['verdict'],
      registers: [this.registry],
      collect() {
        this.reset();
        const held = read();
        if (held === undefined) return;
        this.set({ verdict: 'accepted' }, held.accepted);
        this.set({ verdict: 'rejected' }, held.rejected);
      },
    });
  }

  /**
   * Registers a gauge read at scrape time, for state that lives elsewhere (e.g. whether Redis is
   * connected), so the metric is always the state itself and never a copy that can go stale.
   */
  addStateGauge(name: string, help: string, read: () => number): void {
    new Gauge({
      name,
      help,
      registers: [this.registry],
      collect() {
        this.set(read());
      },
    });
  }

  /** One response: called once per request, from the handler's single exit. */
  request(route: RouteLabel, status: number, cache: CacheOutcome, seconds: number): void {
    this.#requests.inc(route, status, cache);
    this.#requestDuration.observe(seconds, route, cache);
    if (cache === 'coalesced') this.#counter(this.#coalesced, `c|${route}`, { route }).inc();
  }

  /** One upstream exchange (one failover attempt). */
  upstream(upstream: string, route: EndpointName, result: UpstreamResult, seconds: number): void {
    const outcome = upstreamOutcome(result);
    this.#counter(this.#upstreamRequests, `u|${upstream}|${route}|${outcome}`, { upstream, route, outcome }).inc();
    this.#histogram(this.#upstreamDuration, `ud|${upstream}|${route}`, { upstream, route }).observe(seconds);
  }

  /**
   * One response to an authenticated client, whatever its outcome: per-key usage. `keyId` is
   * the configured id, never the secret.
   */
  keyRequest(keyId: string, status: number, cache: CacheOutcome): void {
    this.#keyRequests.inc(keyId, status, cache);
    if (cache === 'hit' || cache === 'revalidated' || cache === 'stale' || cache === 'coalesced') this.#keySaved.inc(keyId, cache);
  }

  /** A request perch refused with 429 under the client's plan. `keyId` is the configured id, never the secret. */
  rateLimited(keyId: string): void {
    this.#counter(this.#rateLimited, `l|${keyId}`, { key_id: keyId }).inc();
  }

  /** A purge this instance carried out for an admin request. */
  purge(scope: EndpointName | 'all'): void {
    this.#counter(this.#purges, `p|${scope}`, { scope }).inc();
  }

  refused(upstream: string, route: EndpointName, reason: RefusalReason): void {
    this.#counter(this.#refused, `rf|${upstream}|${route}|${reason}`, { upstream, route, reason }).inc();
  }

  called(upstream: string, keyId: string, price: number | undefined): void {
    if (keyId === '') return;
    this.#counter(this.#keyCalls, `kc|${keyId}|${upstream}`, { key_id: keyId, upstream }).inc();
    if (price !== undefined) this.#counter(this.#keySpend, `ks|${keyId}|${upstream}`, { key_id: keyId, upstream }).inc(price);
  }

  batched(upstream: string, route: EndpointName, keyIds: readonly string[]): void {
    this.#histogram(this.#batchSize, `bs|${upstream}|${route}`, { upstream, route }).observe(keyIds.length);
    for (const keyId of keyIds.slice(1)) if (keyId !== '') this.#keySaved.inc(keyId, 'batched');
  }

  queued(upstream: string, seconds: number): void {
    this.#histogram(this.#queueWait, `q|${upstream}`, { upstream }).observe(seconds);
  }

  credentialState(upstream: string, credential: string, state: CredentialState): void {
    for (const each of CREDENTIAL_STATES) this.#credentialState.set({ upstream, credential, state: each }, each === state ? 1 : 0);
  }

  credentialRecheck(upstream: string, credential: string, result: RecheckResult): void {
    this.#counter(this.#rechecks, `rc|${upstream}|${credential}|${result}`, { upstream, credential, result }).inc();
  }

  breakerState(upstream: string, state: BreakerState): void {
    for (const each of BREAKER_STATES) this.#breakerState.set({ upstream, state: each }, each === state ? 1 : 0);
  }

  retry(upstream: string, route: EndpointName, decision: RetryDecision): void {
    this.#counter(this.#retries, `rt|${upstream}|${route}|${decision}`, { upstream, route, decision }).inc();
  }

  failover(upstream: string, route: EndpointName, reason: string): void {
    this.#counter(this.#failovers, `fo|${upstream}|${route}|${reason}`, { upstream, route, reason }).inc();
  }

  /** The Prometheus text exposition and its content type. */
  async expose(): Promise<{ contentType: string; body: string }> {
    return { contentType: this.registry.contentType, body: await this.registry.metrics() };
  }

  #counter(metric: Counter, key: string, labels: LabelValues<string>): { inc(value?: number): void } {
    let child = this.#children.get(key) as { inc(value?: number): void } | undefined;
    if (child === undefined) {
      child = metric.labels(labels);
      this.#children.set(key, child);
    }
    return child;
  }

  #histogram(metric: Histogram, key: string, labels: LabelValues<string>): { observe(value: number): void } {
    let child = this.#children.get(key) as { observe(value: number): void } | undefined;
    if (child === undefined) {
      child = metric.labels(labels);
      this.#children.set(key, child);
    }
    return child;
  }
}
