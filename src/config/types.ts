import type { EndpointName } from '../endpoints.js';

/**
 * The validated configuration. Produced once at start-up by `parseConfig` / `loadConfigFile` (defaults -> strict
 * schema -> validation of every key -> deep freeze); nothing else constructs it. Every option is
 * documented here and, with its default, in the README's configuration reference.
 */
export interface Config {
  readonly server: ServerConfig;
  readonly auth: AuthConfig;
  /** Operator access to `POST /admin/purge`. Absent: that route does not exist (404). */
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
  /** Bound on receiving a request's headers (slowloris defence). Default `10000`. */
  readonly headers_timeout_ms: number;
  /** Bound on receiving a whole request. At least `headers_timeout_ms`. Default `30000`. */
  readonly request_timeout_ms: number;
  /** How long an idle keep-alive connection is kept open. Default `5000`. */
  readonly keep_alive_timeout_ms: number;
  /** Largest request head (request line and headers); larger is answered 431. Default `16384`. */
  readonly max_header_bytes: number;
  /** Connections accepted at once; more are refused at accept. Default `10000`. */
  readonly max_connections: number;
  /** Serve HTTPS with this certificate and key. Absent: plain HTTP. */
  readonly tls?: TlsConfig;
}

export interface TlsConfig {
  /** PEM certificate chain file, read at start-up. */
  readonly cert_file: string;
  /** PEM private key file, read at start-up. */
  readonly key_file: string;
}

export interface AuthConfig {
  /** Client keys. At least one is required. Ids and secrets must be unique. */
  readonly keys: readonly ApiKeyConfig[];
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
}

export type UpstreamConfig = V1UpstreamConfig | FixtureUpstreamConfig;

/** An HTTP provider that speaks this same interface. */
export interface V1UpstreamConfig {
  readonly kind: 'v1';
  /** Origin (`http:` or `https:`, no path, query or credentials), e.g. `https://provider.example`. */
  readonly url: string;
  /** Headers added to every upstream request, typically the provider key. Default `{}`. */
  readonly headers: Readonly<Record<string, string>>;
  /** Bound on one whole exchange (connect, headers, body). Default `5000`. */
  readonly timeout_ms: number;
  /** Keep-alive connections in the pool. Default `64`. */
  readonly connections: number;
  /** Largest response body accepted; larger is answered 502. Default `8388608` (8 MiB). */
  readonly max_body_bytes: number;
  /**
   * Retry-After told to clients when the upstream answers 429 without Retry-After or
   * x-rate-limit-reset. Default `60`.
   */
  readonly retry_after_default_seconds: number;
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
  /** Redis Cluster seed nodes (`redis://host:port`). */
  readonly cluster?: readonly string[];
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
}
