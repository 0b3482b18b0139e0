import type { TieredCache } from '../cache/tiered-cache.js';
import type { Config } from '../config/types.js';
import { ENDPOINT_NAMES, type EndpointName } from '../endpoints.js';
import type { PerchMetrics } from '../metrics/metrics.js';
import type { AdminView } from './admin-view.js';
import { PERCH_VERSION } from '../version.js';

/** One endpoint's responses since this instance started, by how the cache took part. */
export interface EndpointRow {
  readonly endpoint: EndpointName;
  readonly requests: number;
  readonly hits: number;
  readonly stale: number;
  readonly coalesced: number;
  readonly misses: number;
  /**
   * (hits + stale) / (hits + stale + coalesced + misses); null before any request reached the
   * cache. Requests refused before the cache was consulted (bad key, bad parameter) do not count.
   */
  readonly hit_ratio: number | null;
}

export interface UpstreamRow {
  readonly name: string;
  /** `ok`, or why perch would not call it now (`cooling_down`, `breaker_open`, ...). */
  readonly state: string;
  /** When that stop ends (ISO-8601), or null. */
  readonly until: string | null;
  readonly breaker: string;
  /** The share of calls the adaptive throttle sheds now, 0 to 1. */
  readonly throttle_reject_probability: number;
  /** Exchanges made, failover attempts and retries included. */
  readonly calls: number;
  /** Exchanges that failed or timed out. */
  readonly errors: number;
  /** Exchanges the provider refused with a rate limit or usage cap: each starts a cool-down. */
  readonly rate_limited: number;
  /** Calls perch did not make to protect the provider (cool-down, cap, open breaker, throttle). */
  readonly refused: number;
  readonly credentials: readonly { readonly id: string; readonly state: string; readonly until: string | null }[];
}

/** One client key's usage since this instance started; `id` is the configured id, never the secret. */
export interface KeyRow {
  readonly id: string;
  readonly requests: number;
  readonly hits: number;
  /** Responses with a status of 400 or more, rate-limit refusals included. */
  readonly errors: number;
  readonly rate_limited: number;
  /** Provider calls its misses made, and calls its requests did not need (hit, stale, coalesced). */
  readonly upstream_calls: number;
  readonly saved_calls: number;
  /** What is left of its plan's provider-call budget in this window, as this instance knows; null without one. */
  readonly budget_left: number | null;
  /** Each secret of the key (index in `secrets`, 0 for `key`/`sha256`; fingerprint: 8 hex digits of its SHA-256), never the secret. */
  readonly secrets: readonly { readonly index: number; readonly fingerprint: string; readonly last_used: string | null; readonly not_after: string | null }[];
}

/** What `/status.json` returns; counts are cumulative since this instance started. */
export interface StatusSnapshot {
  readonly version: string;
  readonly generated_at: string;
  readonly uptime_seconds: number;
  readonly config: { readonly reload_successful: boolean; readonly loaded_at: string };
  readonly endpoints: readonly EndpointRow[];
  readonly upstreams: readonly UpstreamRow[];
  readonly keys: readonly KeyRow[];
  readonly cache: {
    readonly memory: { readonly entries: number; readonly bytes: number; readonly max_bytes: number; readonly evictions: number };
    /** Null without `cache.redis`. */
    readonly redis: { readonly breaker: string; readonly connected: boolean; readonly errors: number; readonly skipped: number } | null;
  };
}

export interface StatusSources {
  readonly runtime: AdminView;
  readonly metrics: PerchMetrics;
  readonly cache: TieredCache;
}

type Sample = { readonly labels: Readonly<Record<string, string | number | undefined>>; readonly value: number };

/**
 * Gathers the status figures. Counters are read from the metrics registry, the one record the
 * request path keeps, so the page and Prometheus never disagree and the hot path does no extra
 * work for the page; states are read from their owners, like `/readyz` does.
 */
export async function collectStatus(sources: StatusSources): Promise<StatusSnapshot> {
  const { runtime, metrics, cache } = sources;
  const [requests, upstreamCalls, refusals, keyRequests, rateLimited, keyCalls, keySaved, budgetLeft] = await Promise.all([
    samples(metrics, 'perch_requests_total'),
    samples(metrics, 'perch_upstream_requests_total'),
    samples(metrics, 'perch_upstream_refused_total'),
    samples(metrics, 'perch_key_requests_total'),
    samples(metrics, 'perch_rate_limited_total'),
    samples(metrics, 'perch_key_upstream_calls_total'),
    samples(metrics, 'perch_key_upstream_calls_saved_total'),
    samples(metrics, 'perch_key_provider_budget_remaining'),
  ]);
  const now = runtime.current;
  const secretUses = now.keys.uses();
  const memorySize = cache.memory.size() ?? { entries: 0, bytes: 0 };
  const redisStats = cache.redisStats;
  return {
    version: PERCH_VERSION,
    generated_at: new Date().toISOString(),
    uptime_seconds: Math.round(process.uptime()),
    config: { reload_successful: runtime.reloadStatus.successful, loaded_at: new Date(runtime.reloadStatus.lastSuccessMs).toISOString() },
    endpoints: ENDPOINT_NAMES.map((endpoint) => endpointRow(endpoint, requests.filter((s) => s.labels.route === endpoint))),
    upstreams: Object.entries(now.upstreams.status()).map(([name, status]): UpstreamRow => {
      const calls = upstreamCalls.filter((s) => s.labels.upstream === name);
      return {
        name,
        state: status.state,
        until: iso(status.untilMs),
        breaker: status.breaker,
        throttle_reject_probability: status.throttle,
        calls: sum(calls),
        errors: sum(calls.filter((s) => !NOT_ERRORS.has(String(s.labels.outcome)))),
        rate_limited: sum(calls.filter((s) => s.labels.outcome === 'rate_limited')),
        refused: sum(refusals.filter((s) => s.labels.upstream === name)),
        credentials: Object.entries(status.credentials).map(([id, credential]) => ({ id, state: credential.state, until: iso(credential.untilMs) })),
      };
    }),
    keys: now.config.auth.keys.map(({ id }): KeyRow => {
      const mine = keyRequests.filter((s) => s.labels.key_id === id);
      return {
        id,
        requests: sum(mine),
        hits: sum(mine.filter((s) => s.labels.cache === 'hit' || s.labels.cache === 'revalidated' || s.labels.cache === 'stale')),
        errors: sum(mine.filter((s) => Number(s.labels.status) >= 400)),
        rate_limited: sum(rateLimited.filter((s) => s.labels.key_id === id)),
        upstream_calls: sum(keyCalls.filter((s) => s.labels.key_id === id)),
        saved_calls: sum(keySaved.filter((s) => s.labels.key_id === id)),
        budget_left: budgetOf(now.config, id, budgetLeft),
        secrets: secretUses
          .filter((use) => use.id === id)
          .map((use) => ({ index: use.index, fingerprint: use.fingerprint, last_used: iso(use.lastUsedMs), not_after: iso(use.notAfterMs) })),
      };
    }),
    cache: {
      memory: { ...memorySize, max_bytes: runtime.started.cache.memory.max_bytes, evictions: cache.memory.evictions },
      redis:
        redisStats === undefined
          ? null
          : { breaker: cache.redisState ?? 'closed', connected: cache.redisConnected === true, errors: redisStats.errors, skipped: redisStats.skipped },
    },
  };
}

/** A key's budget left: as learned, or the whole budget before its first call of the window; null without one. */
function budgetOf(config: Config, id: string, learned: readonly Sample[]): number | null {
  const plan = config.auth.keys.find((k) => k.id === id)?.plan;
  const budget = plan === undefined ? undefined : config.rate_limits[plan]?.provider_calls;
  if (budget === undefined) return null;
  return learned.find((s) => s.labels.key_id === id)?.value ?? budget.limit;
}

/** Upstream outcomes that are answers, not failures: the provider did its job. */
const NOT_ERRORS = new Set(['ok', 'not_found', 'bad_request', 'rate_limited']);

function endpointRow(endpoint: EndpointName, rows: readonly Sample[]): EndpointRow {
  const by = (outcome: string) => sum(rows.filter((s) => s.labels.cache === outcome));
  // A 304 answered from the cache is a hit whose body the client already had.
  const hits = by('hit') + by('revalidated');
  const stale = by('stale');
  const coalesced = by('coalesced');
  const misses = by('miss');
  const consulted = hits + stale + coalesced + misses;
  return { endpoint, requests: sum(rows), hits, stale, coalesced, misses, hit_ratio: consulted === 0 ? null : (hits + stale) / consulted };
}

async function samples(metrics: PerchMetrics, name: string): Promise<readonly Sample[]> {
  const metric = metrics.registry.getSingleMetric(name);
  return metric === undefined ? [] : (await metric.get()).values;
}

function sum(rows: readonly Sample[]): number {
  return rows.reduce((total, s) => total + s.value, 0);
}

function iso(ms: number | undefined): string | null {
  return ms === undefined ? null : new Date(ms).toISOString();
}
