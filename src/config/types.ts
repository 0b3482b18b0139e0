import type { EndpointName } from '../endpoints.js';

/**
 * The validated configuration. Produced once at start-up by `parseConfig` / `loadConfigFile` (defaults -> strict
 * schema -> validation of every key -> deep freeze); nothing else constructs it. Every option is
 * documented here and, with its default, in the README's configuration reference.
 */
export interface Config {
  readonly server: ServerConfig;
  readonly auth: AuthConfig;
  /** Operator access to `POST /admin/purge` and the status page. Absent: neither exists (404). */
  readonly admin?: AdminConfig;
  readonly rate_limits: Readonly<Record<string, RateLimitPlan>>;
  /**
   * Redis for the shared token buckets when it should differ from `cache.redis`. Absent: the
   * buckets use `cache.redis`, or stay in memory (per instance) when that is absent too.
   */
  readonly rate_limits_redis?: RedisConfig;
  readonly upstreams: Readonly<Record<string, UpstreamConfig>>;
  /** Endpoint -> upstream names to try in order. Every endpoint is present after validation. */
  readonly routes: Readonly<Record<EndpointName, readonly string[]>>;
  readonly cache: CacheConfig;
  readonly metrics: MetricsConfig;
  readonly log: LogConfig;
}

export interface ServerConfig {
  /** Address to bind. Default `127.0.0.1`: exposing perch is a deliberate choice. */
  readonly host: string;
  /** TCP port, 0-65535; 0 picks a free port. Default `8080`. */
  readonly port: number;
  /**
   * On SIGTERM/SIGINT, how long in-flight requests may take to finish before their connections
   * are closed anyway. Default `10000`.
   */
  readonly shutdown_grace_ms: number;
  /**
   * Bound on receiving a request's headers (slowloris defence), held to within a second; past it
   * 408, or a silent close when nothing was received. Default `10000`.
   */
  readonly headers_timeout_ms: number;
  /**
   * Bound on everything a miss waits for upstream: the call cap's queue, every retry and its
   * backoff, and failover along the route. Default `10000`.
   */
  readonly miss_deadline_ms: number;
  /** Bound on receiving a whole request. At least `headers_timeout_ms`. Default `30000`. */
  readonly request_timeout_ms: number;
  /** How long an idle keep-alive connection is kept open. Default `5000`. */
  readonly keep_alive_timeout_ms: number;
  /**
   * Largest request head as it arrives (request line, header lines with their separators);
   * larger is answered 431. Default `16384`.
   */
  readonly max_header_bytes: number;
  /**
   * Connections open at once. At the cap a new connection sheds the oldest one that has not sent
   * a request, else the longest-idle keep-alive one; it is refused only when all are busy.
   * Default `10000`.
   */
  readonly max_connections: number;
  /** Serve HTTPS with this certificate and key. Absent: plain HTTP. */
  readonly tls?: TlsConfig;
  /**
   * Which rate-limit header dialects answers carry, at least one: `ietf` (`RateLimit` and
   * `RateLimit-Policy`, the httpapi-ratelimit-headers draft) and `x_rate_limit`
   * (`x-rate-limit-limit`, `-remaining`, `-reset` in epoch seconds, which Twitter/X client
   * libraries read). Both carry the same numbers. Default `[ietf]`.
   */
  readonly rate_limit_headers: readonly RateLimitHeaderDialect[];
}

/** A rate-limit header dialect of `server.rate_limit_headers`. */
export type RateLimitHeaderDialect = 'ietf' | 'x_rate_limit';

export interface TlsConfig {
  /** PEM certificate chain file, read at start-up. */
  readonly cert_file: string;
  /** PEM private key file, read at start-up. */
  readonly key_file: string;
}

export interface AuthConfig {
  /**
   * Who checks a client's `X-API-Key`: `keys` (perch, against `keys`) or `upstream` (the
   * provider: perch forwards the key in place of a configured credential and remembers the
   * verdict; see the README's "Pass-through auth"). Default `keys`.
   */
  readonly mode: 'keys' | 'upstream';
  /**
   * Client keys. With mode `keys` at least one is required; ids and secrets must be unique. With
   * mode `upstream` the list is empty: keys perch checks itself would mix two kinds of client.
   */
  readonly keys: readonly ApiKeyConfig[];
  /** Mode `upstream`: the `rate_limits` plan of every forwarded key. Required there, refused otherwise. */
  readonly default_plan?: string;
  /**
   * Mode `upstream`: how long the provider's acceptance of a key lets that key be served from
   * the cache. Past it the key's next request is a real call again. Whole seconds, 1-86400.
   * Default `300`.
   */
  readonly verify_ttl_seconds: number;
  /**
   * Mode `upstream`: how long a key the provider rejected is answered 401 without a call.
   * Whole seconds, 1-86400. Default `60`.
   */
  readonly reject_ttl_seconds: number;
  /**
   * Mode `upstream`: how many keys' verdicts are remembered, least recently used dropped first,
   * so a flood of random keys cannot grow memory without bound. Default `100000`.
   */
  readonly remembered_keys: number;
}

export interface ApiKeyConfig {
  /** Name used in logs and metrics in place of the secret. `[A-Za-z0-9_.-]{1,64}`. */
  readonly id: string;
  /** Name of an entry of `rate_limits`. */
  readonly plan: string;
  /**
   * Lowercase hex SHA-256 of the secret (64 hex digits). Given either `key` (a literal, normally
   * `${ENV}`) or `sha256` in the file; validation turns a literal into its digest so the secret
   * itself is not kept.
   */
  readonly sha256: string;
}

export interface AdminConfig {
  /**
   * Keys allowed to purge the cache, at least one. Separate from `auth.keys`: a client key is
   * refused on the admin route and an admin key on the API. No secret may be both.
   */
  readonly keys: readonly AdminKeyConfig[];
  /**
   * Serves the operator status page: `GET /status` (an HTML page holding no data) and
   * `GET /status.json` (the figures it shows, for an admin key only). Default false: both paths
   * answer like any unknown route.
   */
  readonly status_page: boolean;
}

/** An admin key: like a client key, with the same rules for `id`, `key` and `sha256`, and no plan. */
export type AdminKeyConfig = Omit<ApiKeyConfig, 'plan'>;

export interface RateLimitPlan {
  /** Bucket size: requests allowed at once from a full bucket. Positive integer. */
  readonly capacity: number;
  /** Tokens added per second (sustained rate). Positive number; fractions allowed. */
  readonly refill_per_second: number;
  /**
   * Tokens a cache hit costs: `1` (default) or `0`. With `0` only requests that reach the upstream
   * (and 400/405 answers) spend tokens; hits still carry the rate-limit headers.
   */
  readonly cost_of_hit: 0 | 1;
  /**
   * This plan's keys' share of an upstream's call cap while misses wait for it, relative to other
   * plans' keys: a key of weight 3 gets three calls for one of a key of weight 1 while both wait.
   * Positive number, 0.001-1000. Default `1`.
   */
  readonly provider_weight: number;
  /**
   * How many provider calls one key of this plan may make in the current UTC calendar window;
   * past it the key's misses get 429 until the window ends. Absent: no budget.
   */
  readonly provider_calls?: ProviderCallBudget;
}

/** A plan's budget of provider calls per key: `limit` calls per calendar `window` (UTC). */
export interface ProviderCallBudget {
  /** Calls per window, a positive integer. */
  readonly limit: number;
  /** `hour`, `day` or `month`, in UTC: a window ends at the next hour, midnight or first of the month. */
  readonly window: 'hour' | 'day' | 'month';
}

export type UpstreamConfig = V1UpstreamConfig | XV2UpstreamConfig | FixtureUpstreamConfig;

/** An HTTP provider that speaks this same interface. */
export interface V1UpstreamConfig extends ProviderProtectionConfig {
  readonly kind: 'v1';
  /** Origin (`http:` or `https:`, no path, query or credentials), e.g. `https://provider.example`. */
  readonly url: string;
  /**
   * The credentials calls rotate over. In the file either `credentials: [{ id, headers }]` or the
   * shorthand `headers` (one credential with id `default`); neither means one credential with no
   * headers. Never empty after validation.
   */
  readonly credentials: readonly CredentialConfig[];
  /** Bound on one whole exchange (connect, headers, body). Default `5000`. */
  readonly timeout_ms: number;
  /** Keep-alive connections in the pool. Default `64`. */
  readonly connections: number;
  /** Largest response body accepted; larger is answered 502. Default `8388608` (8 MiB). */
  readonly max_body_bytes: number;
  /**
   * How long to stay away after a 429 (or 503) that gives neither Retry-After nor
   * x-rate-limit-reset. Default `60`.
   */
  readonly retry_after_default_seconds: number;
}

/**
 * The X API v2 behind the interface: perch calls X's endpoints and maps each answer to the
 * interface's v1 shapes (see the README's "In front of the X API v2"). Every key of a `v1`
 * upstream applies with the same default, except `headers` (`bearer_token` takes its place) and
 * the ones below.
 */
export interface XV2UpstreamConfig extends Omit<V1UpstreamConfig, 'kind'> {
  readonly kind: 'x_v2';
  /** X's origin. Default `https://api.twitter.com`; tests point it at a local stand-in. */
  readonly url: string;
  /**
   * The app bearer tokens calls rotate over. In the file `credentials: [{ id, bearer_token }]` or
   * the shorthand `bearer_token` (one credential with id `default`); one of them is required,
   * except with `auth.mode: upstream`, where calls carry the client's token instead.
   * Validation turns each token into an `Authorization: Bearer` header, never logged.
   */
  readonly credentials: readonly CredentialConfig[];
  /**
   * X's rate limits are per endpoint and per credential, so a 429 stops only that credential's
   * calls to that endpoint. Default `endpoint` (not `upstream` as for `v1`).
   */
  readonly cooldown_scope: 'upstream' | 'endpoint';
}

/** One provider credential: headers sent with every call made on it. */
export interface CredentialConfig {
  /** Name in logs and metrics in place of the secret. `[A-Za-z0-9_.-]{1,64}`, unique per upstream. */
  readonly id: string;
  /** Headers added to each call on this credential, typically the provider key. */
  readonly headers: Readonly<Record<string, string>>;
}

/**
 * How perch protects a provider account from perch itself: its own cap on calls, the
 * provider's "stop" signals, and what it does about a provider that fails.
 */
export interface ProviderProtectionConfig {
  /**
   * Calls per second perch may make to this upstream, fleet-wide (through `rate_limits_redis`
   * when there is one): never more in any one-second window. Absent: no rate cap.
   */
  readonly max_requests_per_second?: number;
  /** Calls that may start at once from an idle cap. Default `ceil(max_requests_per_second)`. */
  readonly burst?: number;
  /** Calls in flight at once, fleet-wide. Absent: no bound beyond `connections` per instance. */
  readonly max_concurrent?: number;
  /** A longer window the provider sells, e.g. 900 calls per 900 s. Never more in any such window. */
  readonly quota?: QuotaConfig;
  /** How long a miss over the cap waits in this instance's FIFO before it is refused. Default `1000`. */
  readonly queue_timeout_ms: number;
  /** Misses that may wait in that FIFO at once; more are refused at once. Default `1000`. */
  readonly queue_size: number;
  /**
   * While the shared Redis is unreachable, the fraction of every cap this instance uses on its
   * own (set it to 1 / the number of instances). Default `1`.
   */
  readonly redis_down_share: number;
  /**
   * Stop calling a credential when the provider reports this many calls left in its window,
   * until the window resets. Default `0`: stop when it reports none left.
   */
  readonly rate_limit_reserve: number;
  /**
   * What a 429 stops: the credential's calls to every endpoint (`upstream`) or to the endpoint
   * that drew it (`endpoint`, for providers whose limits are per endpoint, as X's are).
   * Default `upstream`.
   */
  readonly cooldown_scope: 'upstream' | 'endpoint';
  /**
   * How long a credential stays out after the provider says its usage cap is spent and gives
   * no reset time. Default `86400`.
   */
  readonly usage_cap_seconds: number;
  /**
   * What one call to this upstream costs, in the operator's currency: with it, each client key's
   * provider calls are also summed as `perch_key_upstream_spend_total`, for charge-back. A number
   * from 0. Absent: no spend is counted.
   */
  readonly price_per_call?: number;
  /** Extra attempts after a connection error, timeout, 502, 503 or 504. Default `0`. */
  readonly retries: number;
  /** Retries allowed as a percentage of calls over the last 10 seconds. Default `20`. */
  readonly retry_budget_percent: number;
  /** Retries always allowed per second, whatever the percentage says. Default `1`. */
  readonly retry_budget_min_per_second: number;
  /** First backoff before a retry; later ones grow exponentially, with full jitter. Default `50`. */
  readonly retry_backoff_ms: number;
  /** Longest backoff before a retry. Default `1000`. */
  readonly retry_backoff_max_ms: number;
  readonly breaker: BreakerConfig;
  readonly throttle: ThrottleConfig;
}

export interface QuotaConfig {
  /** Calls allowed per window. Positive integer. */
  readonly requests: number;
  /** The window, in whole seconds (900 for 15 minutes, 86400 for a day). */
  readonly per_seconds: number;
}

/**
 * The breaker: for a provider that is down or hanging. Its defaults open it only when (nearly)
 * every call fails; a provider failing part of its calls is the throttle's.
 */
export interface BreakerConfig {
  /** Consecutive failures that open the breaker. Default `20`. */
  readonly consecutive_failures: number;
  /** Failure ratio over the last `window_ms` that opens it, 0.01-1 (1 never). Default `0.9`. */
  readonly failure_ratio: number;
  /** The window of `failure_ratio`. Default `10000`. */
  readonly window_ms: number;
  /** Calls the window needs before the ratio counts. Default `20`. */
  readonly min_calls: number;
  /** How long it stays open before the first probe goes through. Default `1000`. */
  readonly half_open_after_ms: number;
  /**
   * Each failed probe doubles the wait for the next, up to this. At least `half_open_after_ms`.
   * Default `4000` (or `half_open_after_ms` when that is larger).
   */
  readonly half_open_max_ms: number;
}

/**
 * Adaptive throttling (Google SRE book, "Handling Overload"): over the last `window_ms`, a call
 * is shed with probability `max(0, (requests - k * accepts) / (requests + 1))`. For a provider
 * that fails part of its calls: it keeps the calls the provider can serve and sheds the rest.
 */
export interface ThrottleConfig {
  /** Off switch. Default `true`. */
  readonly enabled: boolean;
  /**
   * How many calls per accepted one the provider may see before shedding starts, 1-100: with `2`
   * a provider answering at least half its calls is never throttled. Default `2`.
   */
  readonly k: number;
  /** The window the counts cover. Default `10000`. */
  readonly window_ms: number;
  /** Answered calls the window needs before anything is shed. Default `20`. */
  readonly min_calls: number;
}

/** The built-in synthetic data source; needs no network. */
export interface FixtureUpstreamConfig {
  readonly kind: 'fixture';
}

export interface CacheConfig {
  readonly memory: MemoryCacheConfig;
  /** The shared second tier. Absent: memory only. */
  readonly redis?: RedisConfig;
  /** TTL per endpoint, plus `not_found` for cached upstream 404s. Whole seconds; 0 disables. */
  readonly ttl_seconds: Readonly<Record<EndpointName | 'not_found', number>>;
  /**
   * How long past its TTL an entry is kept to be served stale: at once while one background
   * refresh runs (stale-while-revalidate), and instead of an upstream error, timeout or 429
   * (stale-if-error). Whole seconds, 0-86400; 0 disables stale serving. Default `600`.
   */
  readonly stale_seconds: number;
}

export interface MemoryCacheConfig {
  /** Bound on the bytes held by the in-process cache (bodies plus keys). Default 256 MiB. */
  readonly max_bytes: number;
}

/**
 * Where a Redis is and how perch talks to it. Exactly one of `url`, `sentinels` or `cluster`.
 * Commands never queue while disconnected and time out fast: Redis is an optimization, and a slow
 * Redis must cost a request milliseconds, not seconds.
 */
export interface RedisConfig {
  /** A single node: `redis://[user:password@]host:port[/db]` or `rediss://` for TLS. */
  readonly url?: string;
  /** Sentinel addresses (`host:port`); needs `name`. */
  readonly sentinels?: readonly string[];
  /** The master name the sentinels know. */
  readonly name?: string;
  /**
   * Redis Cluster seed nodes, `redis://[user:password@]host:port` or `rediss://` for TLS. Every
   * seed carries the same user, password and scheme: one set applies to every node.
   */
  readonly cluster?: readonly string[];
  /** With `sentinels`: ACL user for the master (and replicas). With `url`/`cluster` it goes in the URL. */
  readonly username?: string;
  /** With `sentinels`: password for the master (`requirepass` or the ACL user's). */
  readonly password?: string;
  /** With `sentinels`: ACL user for the sentinels themselves. */
  readonly sentinel_username?: string;
  /** With `sentinels`: password for the sentinels (their own `requirepass`). */
  readonly sentinel_password?: string;
  /** With `sentinels`: TLS to the master. With `url`/`cluster`, `rediss://` says it. Default `false`. */
  readonly tls?: boolean;
  /** With `sentinels`: TLS to the sentinels. Default `false`. */
  readonly sentinel_tls?: boolean;
  /**
   * PEM file of the certificate authorities trusted for this section's TLS connections, read at
   * start-up; absent: Node's default list. Only where TLS is used.
   */
  readonly tls_ca_file?: string;
  /** Prefix of every key perch writes, so several deployments can share one Redis. Default `perch:`. */
  readonly prefix: string;
  /** Bound on one command; past it the command counts as failed. Default `50`. */
  readonly command_timeout_ms: number;
}

export interface MetricsConfig {
  /** Path of the Prometheus endpoint. Default `/metrics`. */
  readonly path: string;
  /**
   * Serve metrics on their own listener on this port (on `server.host`), and not on the API
   * listener, so they can be kept off the network clients reach. Absent: on the API listener.
   */
  readonly port?: number;
}

export interface LogConfig {
  /** pino level: fatal, error, warn, info, debug, trace or silent. Default `info`. */
  readonly level: 'fatal' | 'error' | 'warn' | 'info' | 'debug' | 'trace' | 'silent';
  /**
   * The `time` field: `epoch_ms` (pino's default, milliseconds since the epoch as a number) or
   * `iso` (an ISO-8601 UTC string, readable and understood by every log store). Default
   * `epoch_ms`: it costs nothing per line, and log pipelines built on pino expect it. Takes effect
   * after a restart.
   */
  readonly time: 'epoch_ms' | 'iso';
  /**
   * The `level` field: `number` (pino's default, 30 for info) or `label` (`"info"`). Default
   * `number`, for the same reasons as `time`. Takes effect after a restart.
   */
  readonly level_format: 'number' | 'label';
}
