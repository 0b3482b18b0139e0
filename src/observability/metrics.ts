import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics, type LabelValues } from 'prom-client';
import type { CacheOutcome } from '../cache/outcome.js';
import type { CacheStore, CacheTier } from '../cache/store.js';
import type { EndpointName } from '../endpoints.js';
import type { UpstreamResult } from '../upstream/upstream.js';

/** `route` label: an endpoint name, or `none` for requests that matched no endpoint. */
export type RouteLabel = EndpointName | 'none';

/** `outcome` label of upstream exchanges: the result kind, or the failure for `failed`. */
export function upstreamOutcome(result: UpstreamResult): string {
  return result.kind === 'failed' ? result.failure : result.kind;
}

/** Seconds, because Prometheus base units are seconds; buckets span a cache hit to a timeout. */
const DURATION_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10];

/**
 * Every perch metric, in a registry owned by one perch instance (never prom-client's global
 * one), so several instances can live in one process, as the tests do.
 *
 * Label values come from closed sets only (endpoint names, status codes perch emits, cache
 * outcomes, configured upstream and key ids), so series counts are bounded by configuration.
 * Labelled children are bound once per label combination and kept in a Map keyed by a short
 * composed string: the request path then does one Map lookup, not prom-client's label hashing.
 */
export class PerchMetrics {
  readonly registry = new Registry();
  readonly #requests: Counter;
  readonly #requestDuration: Histogram;
  readonly #upstreamRequests: Counter;
  readonly #upstreamDuration: Histogram;
  readonly #coalesced: Counter;
  readonly #rateLimited: Counter;
  readonly #purges: Counter;
  readonly #children = new Map<string, { inc(): void } | { observe(value: number): void }>();
  readonly #cacheTiers = new Map<CacheTier, Pick<CacheStore, 'size'>>();

  constructor() {
    const registers = [this.registry];
    // Standard names (process_*, nodejs_*), so stock dashboards and alerts work unchanged.
    collectDefaultMetrics({ register: this.registry });
    this.#requests = new Counter({
      name: 'perch_requests_total',
      help: 'Responses sent on the API listener, by endpoint, status code and cache outcome.',
      labelNames: ['route', 'status', 'cache'],
      registers,
    });
    this.#requestDuration = new Histogram({
      name: 'perch_request_duration_seconds',
      help: 'Time from receiving a request to sending its response.',
      labelNames: ['route', 'cache'],
      buckets: DURATION_BUCKETS,
      registers,
    });
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

  /** Reports a cache tier's size on every scrape. A tier whose `size()` is undefined is skipped. */
  addCacheTier(store: Pick<CacheStore, 'tier' | 'size'>): void {
    this.#cacheTiers.set(store.tier, store);
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
    this.#counter(this.#requests, `r|${route}|${status}|${cache}`, { route, status: String(status), cache }).inc();
    this.#histogram(this.#requestDuration, `d|${route}|${cache}`, { route, cache }).observe(seconds);
    if (cache === 'coalesced') this.#counter(this.#coalesced, `c|${route}`, { route }).inc();
  }

  /** One upstream exchange (one failover attempt). */
  upstream(upstream: string, route: EndpointName, result: UpstreamResult, seconds: number): void {
    const outcome = upstreamOutcome(result);
    this.#counter(this.#upstreamRequests, `u|${upstream}|${route}|${outcome}`, { upstream, route, outcome }).inc();
    this.#histogram(this.#upstreamDuration, `ud|${upstream}|${route}`, { upstream, route }).observe(seconds);
  }

  /** A request perch refused with 429 under the client's plan. `keyId` is the configured id, never the secret. */
  rateLimited(keyId: string): void {
    this.#counter(this.#rateLimited, `l|${keyId}`, { key_id: keyId }).inc();
  }

  /** A purge this instance carried out for an admin request. */
  purge(scope: EndpointName | 'all'): void {
    this.#counter(this.#purges, `p|${scope}`, { scope }).inc();
  }

  /** The Prometheus text exposition and its content type. */
  async expose(): Promise<{ contentType: string; body: string }> {
    return { contentType: this.registry.contentType, body: await this.registry.metrics() };
  }

  #counter(metric: Counter, key: string, labels: LabelValues<string>): { inc(): void } {
    let child = this.#children.get(key) as { inc(): void } | undefined;
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
