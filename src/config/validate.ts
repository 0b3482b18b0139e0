import { keysUnder } from './config-keys.js';
import { ENDPOINT_NAMES, type EndpointName } from '../endpoints.js';
import { OPERATIONAL_PATHS } from '../url-table.js';
import type { CacheConfig, Config, LogConfig, MetricsConfig, ProviderCallBudget, RateLimitPlan, UpstreamConfig } from './types.js';
import {
  NAME_PATTERN,
  Problems,
  checkKeys,
  childPath,
  field,
  indexPath,
  isMapping,
  readInteger,
  readPositiveNumber,
  readSection,
  readChoice,
  readString,
} from './schema-helpers.js';
import { validateAuth } from './validate-auth.js';
import { validateAdmin, type SecretsSeen } from './validate-keys.js';
import { validateRedis } from './validate-redis.js';
import { validateServer } from './validate-server.js';
import { validateUpstreams } from './validate-upstreams.js';

/** Paths perch answers itself besides metrics: metrics must not shadow one. */
const RESERVED_PATHS = Object.keys(OPERATIONAL_PATHS);

const LOG_LEVELS: readonly LogConfig['level'][] = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'];

const DEFAULT_TTL_SECONDS: Readonly<Record<EndpointName | 'not_found', number>> = {
  user: 300,
  user_by_username: 300,
  tweets: 60,
  replies: 60,
  following: 300,
  tweet: 600,
  not_found: 30,
};

/**
 * Applies defaults and checks every key of an already parsed and substituted configuration tree.
 * All problems are collected rather than stopping at the first, so one edit can fix them all.
 * The returned config is not frozen; `parseConfig` does that.
 */
export function validateConfig(raw: unknown): { config: Config } | { problems: string[] } {
  const problems = new Problems();
  if (!isMapping(raw)) {
    problems.add('(top level)', raw == null ? 'the configuration is empty' : 'must be a mapping');
    return { problems: problems.list };
  }
  checkKeys(problems, raw, '', keysUnder(''));

  const rate_limits = validateRateLimits(problems, field(raw, 'rate_limits'));
  const authRaw = field(raw, 'auth');
  const passThrough = isMapping(authRaw) && field(authRaw, 'mode') === 'upstream';
  const upstreams = validateUpstreams(problems, field(raw, 'upstreams'), passThrough);
  const secrets: SecretsSeen = new Map();
  const config: Config = {
    server: validateServer(problems, readSection(problems, raw, 'server', '')),
    // References are checked only against a usable section: a missing, broken or empty
    // `rate_limits` is already reported, and repeating that for every key would bury the report.
    auth: validateAuth(problems, authRaw, usable(rate_limits), secrets),
    ...optional('admin', validateAdmin(problems, field(raw, 'admin'), secrets)),
    rate_limits,
    ...optional('rate_limits_redis', validateRedis(problems, field(raw, 'rate_limits_redis'), 'rate_limits_redis')),
    upstreams,
    routes: validateRoutes(problems, readSection(problems, raw, 'routes', ''), usable(upstreams)),
    cache: validateCache(problems, readSection(problems, raw, 'cache', '')),
    metrics: validateMetrics(problems, readSection(problems, raw, 'metrics', '')),
    log: validateLog(problems, readSection(problems, raw, 'log', '')),
  };
  return problems.list.length > 0 ? { problems: problems.list } : { config };
}

function usable<T>(section: Record<string, T>): Record<string, T> | undefined {
  return Object.keys(section).length > 0 ? section : undefined;
}

function validateRateLimits(problems: Problems, raw: unknown): Record<string, RateLimitPlan> {
  const path = 'rate_limits';
  if (raw === undefined) {
    problems.add(path, 'is required (at least one plan)');
    return {};
  }
  if (!isMapping(raw)) {
    problems.add(path, 'must be a mapping of plan name to limits');
    return {};
  }
  if (Object.keys(raw).length === 0) problems.add(path, 'must define at least one plan');
  return Object.fromEntries(
    Object.entries(raw).map(([name, plan]) => {
      const at = childPath(path, name);
      if (!NAME_PATTERN.test(name)) problems.add(at, 'plan name must match [A-Za-z0-9_.-]{1,64}');
      if (!isMapping(plan)) {
        problems.add(at, 'must be a mapping with capacity and refill_per_second');
        return [name, { capacity: 1, refill_per_second: 1, cost_of_hit: 1, provider_weight: 1 }];
      }
      checkKeys(problems, plan, at, keysUnder('rate_limits.<plan>'));
      return [
        name,
        {
          capacity: readInteger(problems, plan, 'capacity', at, { min: 1, fallback: 1, required: true, expected: 'a positive integer' }),
          refill_per_second: readPositiveNumber(problems, plan, 'refill_per_second', at),
          cost_of_hit: readInteger(problems, plan, 'cost_of_hit', at, { min: 0, max: 1, fallback: 1, expected: '0 or 1' }) as 0 | 1,
          provider_weight: field(plan, 'provider_weight') === undefined ? 1 : readWeight(problems, plan, at),
          ...readBudget(problems, plan, at),
        },
      ];
    }),
  );
}

function readBudget(problems: Problems, plan: Record<string, unknown>, path: string): { provider_calls?: ProviderCallBudget } {
  const raw = field(plan, 'provider_calls');
  if (raw === undefined) return {};
  const at = childPath(path, 'provider_calls');
  if (!isMapping(raw)) {
    problems.add(at, 'must be a mapping with limit and window');
    return {};
  }
  checkKeys(problems, raw, at, keysUnder('rate_limits.<plan>.provider_calls'));
  const limit = readInteger(problems, raw, 'limit', at, { min: 1, fallback: 1, required: true, expected: 'a positive integer' });
  if (field(raw, 'window') === undefined) problems.add(childPath(at, 'window'), 'is required (hour, day or month)');
  const window = readChoice(problems, raw, 'window', at, ['hour', 'day', 'month'] as const, 'day');
  return { provider_calls: { limit, window } };
}

function readWeight(problems: Problems, plan: Record<string, unknown>, path: string): number {
  const weight = readPositiveNumber(problems, plan, 'provider_weight', path);
  if (weight < 0.001 || weight > 1000) problems.add(childPath(path, 'provider_weight'), 'must be a number from 0.001 to 1000');
  return Math.min(1000, Math.max(0.001, weight));
}

/** Every endpoint not listed falls back to the first upstream, so a one-upstream file needs no routes. */
function validateRoutes(
  problems: Problems,
  raw: Record<string, unknown>,
  upstreams: Record<string, UpstreamConfig> | undefined,
): Record<EndpointName, readonly string[]> {
  checkKeys(problems, raw, 'routes', ENDPOINT_NAMES, `endpoints are ${ENDPOINT_NAMES.join(', ')}`);
  const first = upstreams === undefined ? [] : Object.keys(upstreams).slice(0, 1);
  const entries = ENDPOINT_NAMES.map((endpoint): [EndpointName, readonly string[]] => {
    const list = field(raw, endpoint);
    const path = childPath('routes', endpoint);
    if (list === undefined) return [endpoint, first];
    if (!Array.isArray(list) || list.length === 0) {
      problems.add(path, 'must be a non-empty list of upstream names');
      return [endpoint, first];
    }
    const seen = new Set<string>();
    list.forEach((name: unknown, i) => {
      const at = indexPath(path, i);
      if (typeof name !== 'string') problems.add(at, 'must be a string (an upstream name)');
      else if (seen.has(name)) problems.add(at, `repeats ${JSON.stringify(name)}`);
      else if (upstreams !== undefined && !Object.hasOwn(upstreams, name)) {
        problems.add(at, `names no configured upstream (${JSON.stringify(name)})`);
      }
      if (typeof name === 'string') seen.add(name);
    });
    return [endpoint, list.filter((name): name is string => typeof name === 'string')];
  });
  return Object.fromEntries(entries) as Record<EndpointName, readonly string[]>;
}

function validateCache(problems: Problems, raw: Record<string, unknown>): CacheConfig {
  checkKeys(problems, raw, 'cache', keysUnder('cache'));
  const memory = readSection(problems, raw, 'memory', 'cache');
  checkKeys(problems, memory, 'cache.memory', keysUnder('cache.memory'));
  const ttlRaw = readSection(problems, raw, 'ttl_seconds', 'cache');
  const ttlKeys = Object.keys(DEFAULT_TTL_SECONDS);
  checkKeys(problems, ttlRaw, 'cache.ttl_seconds', ttlKeys, `keys are ${ttlKeys.join(', ')}`);
  const ttl = Object.fromEntries(
    Object.entries(DEFAULT_TTL_SECONDS).map(([key, fallback]) => [
      key,
      readInteger(problems, ttlRaw, key, 'cache.ttl_seconds', { min: 0, max: 604_800, fallback, expected: 'an integer from 0 to 604800' }),
    ]),
  ) as Record<EndpointName | 'not_found', number>;
  return {
    memory: {
      max_bytes: readInteger(problems, memory, 'max_bytes', 'cache.memory', {
        min: 1_048_576,
        fallback: 268_435_456,
        expected: 'an integer of at least 1048576 (1 MiB)',
      }),
    },
    ...optional('redis', validateRedis(problems, field(raw, 'redis'), 'cache.redis')),
    ttl_seconds: ttl,
    stale_seconds: readInteger(problems, raw, 'stale_seconds', 'cache', { min: 0, max: 86_400, fallback: 600, expected: 'an integer from 0 to 86400' }),
  };
}

/** Spreads `{ [key]: value }` only when there is a value, so absent sections stay absent. */
function optional<K extends string, V>(key: K, value: V | undefined): { [P in K]?: V } {
  return (value === undefined ? {} : { [key]: value }) as { [P in K]?: V };
}

function validateMetrics(problems: Problems, raw: Record<string, unknown>): MetricsConfig {
  checkKeys(problems, raw, 'metrics', keysUnder('metrics'));
  const path = readString(problems, raw, 'path', 'metrics', '/metrics') ?? '/metrics';
  if (!path.startsWith('/')) problems.add('metrics.path', 'must start with "/"');
  // The API lives under /v1/; a metrics path there would shadow an endpoint.
  else if (path.startsWith('/v1/')) problems.add('metrics.path', 'must not start with "/v1/" (the API uses that prefix)');
  else if (RESERVED_PATHS.includes(path)) problems.add('metrics.path', `must not be ${path} (perch serves that itself)`);
  if (field(raw, 'port') === undefined) return { path };
  // Port 0 is allowed for tests: it picks a free port like server.port 0.
  const port = readInteger(problems, raw, 'port', 'metrics', { min: 0, max: 65535, fallback: 0, expected: 'an integer from 0 to 65535' });
  return { path, port };
}

function validateLog(problems: Problems, raw: Record<string, unknown>): LogConfig {
  checkKeys(problems, raw, 'log', keysUnder('log'));
  return {
    level: readChoice(problems, raw, 'level', 'log', LOG_LEVELS, 'info'),
    time: readChoice(problems, raw, 'time', 'log', ['epoch_ms', 'iso'] as const, 'epoch_ms'),
    level_format: readChoice(problems, raw, 'level_format', 'log', ['number', 'label'] as const, 'number'),
  };
}
