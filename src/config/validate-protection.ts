import { keysUnder } from './config-keys.js';
import type { BreakerConfig, ProviderProtectionConfig, QuotaConfig, ThrottleConfig } from './types.js';
import { Problems, checkKeys, childPath, field, isMapping, readBoolean, readInteger, readSection } from './schema-helpers.js';

/** The provider-protection keys of one upstream section at `path`, with their defaults. */
export function validateProtection(problems: Problems, raw: Record<string, unknown>, path: string): ProviderProtectionConfig {
  const int = (key: string, min: number, max: number, fallback: number) =>
    readInteger(problems, raw, key, path, { min, max, fallback, expected: `an integer from ${min} to ${max}` });
  const rate = readNumber(problems, raw, 'max_requests_per_second', path, { min: 0.001, max: 1_000_000 });
  const burstDefault = rate === undefined ? 1 : Math.ceil(rate);
  const burst = field(raw, 'burst') === undefined ? undefined : int('burst', 1, 1_000_000, burstDefault);
  if (burst !== undefined && rate === undefined) problems.add(childPath(path, 'burst'), 'needs max_requests_per_second');
  const maxConcurrent = field(raw, 'max_concurrent') === undefined ? undefined : int('max_concurrent', 1, 100_000, 1);
  const quota = validateQuota(problems, field(raw, 'quota'), childPath(path, 'quota'));
  const scope = field(raw, 'cooldown_scope') ?? 'upstream';
  if (scope !== 'upstream' && scope !== 'endpoint') problems.add(childPath(path, 'cooldown_scope'), 'must be "upstream" or "endpoint"');
  const price = readNumber(problems, raw, 'price_per_call', path, { min: 0, max: 1_000_000_000 });
  const backoff = int('retry_backoff_ms', 1, 60_000, 50);
  const backoffMax = int('retry_backoff_max_ms', 1, 600_000, 1000);
  if (backoffMax < backoff) problems.add(childPath(path, 'retry_backoff_max_ms'), 'must be at least retry_backoff_ms');
  return {
    ...(rate === undefined ? {} : { max_requests_per_second: rate, burst: burst ?? burstDefault }),
    ...(maxConcurrent === undefined ? {} : { max_concurrent: maxConcurrent }),
    ...(quota === undefined ? {} : { quota }),
    ...(price === undefined ? {} : { price_per_call: price }),
    queue_timeout_ms: int('queue_timeout_ms', 0, 600_000, 1000),
    queue_size: int('queue_size', 0, 1_000_000, 1000),
    redis_down_share: readNumber(problems, raw, 'redis_down_share', path, { min: 0.001, max: 1 }) ?? 1,
    rate_limit_reserve: int('rate_limit_reserve', 0, 1_000_000, 0),
    cooldown_scope: scope === 'endpoint' ? 'endpoint' : 'upstream',
    usage_cap_seconds: int('usage_cap_seconds', 1, 31 * 86_400, 86_400),
    retries: int('retries', 0, 10, 0),
    retry_budget_percent: readNumber(problems, raw, 'retry_budget_percent', path, { min: 0, max: 100 }) ?? 20,
    retry_budget_min_per_second: readNumber(problems, raw, 'retry_budget_min_per_second', path, { min: 0, max: 10_000 }) ?? 1,
    retry_backoff_ms: backoff,
    retry_backoff_max_ms: backoffMax,
    breaker: validateBreaker(problems, readSection(problems, raw, 'breaker', path), childPath(path, 'breaker')),
    throttle: validateThrottle(problems, readSection(problems, raw, 'throttle', path), childPath(path, 'throttle')),
  };
}

function validateQuota(problems: Problems, raw: unknown, path: string): QuotaConfig | undefined {
  if (raw === undefined) return undefined;
  if (!isMapping(raw)) {
    problems.add(path, 'must be a mapping with requests and per_seconds');
    return undefined;
  }
  checkKeys(problems, raw, path, keysUnder('upstreams.<name>.quota'));
  const spec = (max: number) => ({ min: 1, max, fallback: 1, required: true, expected: `an integer from 1 to ${max}` });
  return {
    requests: readInteger(problems, raw, 'requests', path, spec(100_000_000)),
    per_seconds: readInteger(problems, raw, 'per_seconds', path, spec(31 * 86_400)),
  };
}

function validateBreaker(problems: Problems, raw: Record<string, unknown>, path: string): BreakerConfig {
  checkKeys(problems, raw, path, keysUnder('upstreams.<name>.breaker'));
  const int = (key: string, min: number, max: number, fallback: number) =>
    readInteger(problems, raw, key, path, { min, max, fallback, expected: `an integer from ${min} to ${max}` });
  const halfOpen = int('half_open_after_ms', 1, 3_600_000, 1000);
  const halfOpenMax = int('half_open_max_ms', 1, 3_600_000, Math.max(halfOpen, 4000));
  if (halfOpenMax < halfOpen) problems.add(childPath(path, 'half_open_max_ms'), 'must be at least half_open_after_ms');
  return {
    consecutive_failures: int('consecutive_failures', 1, 10_000, 20),
    failure_ratio: readNumber(problems, raw, 'failure_ratio', path, { min: 0.01, max: 1 }) ?? 0.9,
    window_ms: int('window_ms', 100, 3_600_000, 10_000),
    min_calls: int('min_calls', 1, 1_000_000, 20),
    half_open_after_ms: halfOpen,
    half_open_max_ms: halfOpenMax,
  };
}

function validateThrottle(problems: Problems, raw: Record<string, unknown>, path: string): ThrottleConfig {
  checkKeys(problems, raw, path, keysUnder('upstreams.<name>.throttle'));
  return {
    enabled: field(raw, 'enabled') === undefined ? true : (readBoolean(problems, raw, 'enabled', path) ?? true),
    k: readNumber(problems, raw, 'k', path, { min: 1, max: 100 }) ?? 2,
    window_ms: readInteger(problems, raw, 'window_ms', path, { min: 100, max: 3_600_000, fallback: 10_000, expected: 'an integer from 100 to 3600000' }),
    min_calls: readInteger(problems, raw, 'min_calls', path, { min: 1, max: 1_000_000, fallback: 20, expected: 'an integer from 1 to 1000000' }),
  };
}

/** An optional number (fractions allowed) within `[min, max]`; undefined when absent or wrong. */
function readNumber(problems: Problems, raw: Record<string, unknown>, key: string, path: string, range: { min: number; max: number }): number | undefined {
  const value = field(raw, key);
  if (value === undefined) return undefined;
  const number = typeof value === 'number' ? value : typeof value === 'string' && /^\d+(\.\d+)?$/.test(value) ? Number(value) : NaN;
  if (!Number.isFinite(number) || number < range.min || number > range.max) {
    problems.add(childPath(path, key), `must be a number from ${range.min} to ${range.max}`);
    return undefined;
  }
  return number;
}
