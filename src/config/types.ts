import type { EndpointName } from '../endpoints.js';
import type { FileConfig } from './schema.js';
import type { UpstreamConfig } from './schema-upstreams.js';

/**
 * The validated configuration's types, derived from the one definition (schema.ts, where every
 * option's meaning and default is written). Produced once at start-up by `parseConfig` /
 * `loadConfigFile` (defaults -> strict schema -> rules -> deep freeze); nothing else constructs
 * it. The few shapes the rules change (rules.ts) are written out here: a key's literal secret
 * becomes its digest, credentials take one form, and every endpoint gets a route.
 */
export type Config = Omit<FileConfig, 'auth' | 'admin' | 'upstreams' | 'routes'> & {
  readonly auth: AuthConfig;
  readonly admin?: AdminConfig;
  readonly upstreams: Readonly<Record<string, UpstreamConfig>>;
  /** Endpoint -> upstream names to try in order. Every endpoint is present after validation. */
  readonly routes: Readonly<Record<EndpointName, readonly string[]>>;
};

export type {
  CacheConfig,
  LogConfig,
  TracingConfig,
  MemoryCacheConfig,
  CompressionConfig,
  MetricsConfig,
  ProviderCallBudget,
  RateLimitHeaderDialect,
  RateLimitPlan,
  RedisConfig,
  ServerConfig,
  TlsConfig,
} from './schema.js';
export type {
  BatchConfig,
  BreakerConfig,
  CredentialConfig,
  FixtureUpstreamConfig,
  ProviderProtectionConfig,
  QuotaConfig,
  ThrottleConfig,
  UpstreamConfig,
  V1UpstreamConfig,
  XV2UpstreamConfig,
} from './schema-upstreams.js';

/** One secret of a key: kept only as the lowercase hex SHA-256, with the end of its validity. */
export interface KeySecretConfig {
  readonly sha256: string;
  /** `not_after` in ms since the epoch: past it the secret is refused. */
  readonly notAfterMs?: number;
}

/** A client key: one id (bucket, budget, metrics label) opened by one or more secrets. */
export interface ApiKeyConfig {
  readonly id: string;
  readonly plan: string;
  readonly secrets: readonly KeySecretConfig[];
}

/** An admin key: like a client key, without a plan. */
export type AdminKeyConfig = Omit<ApiKeyConfig, 'plan'>;

export type AuthConfig = Omit<FileConfig['auth'], 'keys'> & { readonly keys: readonly ApiKeyConfig[] };
export type AdminConfig = Omit<NonNullable<FileConfig['admin']>, 'keys'> & { readonly keys: readonly AdminKeyConfig[] };
